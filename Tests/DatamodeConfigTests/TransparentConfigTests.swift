import DatamodeConfig
import Testing

/// SPEC §16 `transparent`: off by default, an IP address and port when on, errors naming the key.
@Suite("Transparent configuration")
struct TransparentConfigTests {
    @Test("off by default, in the defaults, an empty or null section and the shipped file")
    func defaults() throws {
        #expect(ProxyConfiguration.defaults.transparent.listen == nil)
        #expect(try parse("").transparent.listen == nil)
        #expect(try parse("transparent:\n").transparent.listen == nil)
        #expect(try parse("transparent: {listen: null}\n").transparent.listen == nil)
        #expect(try ProxyConfiguration.load(path: shippedConfigPath).transparent.listen == nil)
    }

    @Test("an IPv4 or IPv6 listen address", arguments: [
        ("127.0.0.1:15001", "127.0.0.1", UInt16(15001)), ("\"[::]:15001\"", "::", UInt16(15001)),
        ("0.0.0.0:0", "0.0.0.0", UInt16(0)),
    ])
    func listen(_ text: String, _ host: String, _ port: UInt16) throws {
        let listen = try #require(try parse("transparent:\n  listen: \(text)\n").transparent.listen)
        #expect(listen.host == host)
        #expect(listen.port == port)
    }

    @Test("a bad address or an unknown key is an error naming the key", arguments: [
        ("transparent:\n  listen: localhost:15001\n", "transparent.listen"),
        ("transparent:\n  listen: 15001\n", "transparent.listen"),
        ("transparent:\n  port: 15001\n", "transparent.port"),
        ("transparent: [a]\n", "transparent"),
    ])
    func errors(_ yaml: String, _ key: String) throws {
        #expect {
            _ = try parse(yaml)
        } throws: { error in
            "\(error)".contains(key)
        }
    }
}
