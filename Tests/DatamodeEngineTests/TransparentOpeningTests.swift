@testable import DatamodeEngine
import Testing

/// SPEC §16: what the first bytes on the transparent listener are. The ClientHello parser is bounds-checked: every
/// truncation and every mutation of a real ClientHello ends in a value, never a crash, and a name is only ever a
/// valid DNS name.
@Suite("Transparent opening")
struct TransparentOpeningTests {
    /// curl 7.88 (OpenSSL 3) connecting to https://www.Example.com:45123/.
    static let curlHello = hexBytes("1603010200010001fc03037572b13197bc5547bbbf28aff678bc7e0e299b2fcd3eb5982b4032afa203d17c20398450bfcdf6f7cef8e53560a9bd16a58b6984f96feaec1596117b9728980a54003e130213031301c02cc030009fcca9cca8ccaac02bc02f009ec024c028006bc023c0270067c00ac0140039c009c0130033009d009c003d003c0035002f00ff0100017500000014001200000f7777772e6578616d706c652e636f6d000b000403000102000a00160014001d0017001e00190018010001010102010301040010000e000c02683208687474702f312e31001600000017000000310000000d002a0028040305030603080708080809080a080b080408050806040105010601030303010302040205020602002b0009080304030303020301002d00020101003300260024001d00208ec20b29a9b2d3093468de1cf183aef385db0ae09200a95f6320983b60bc7970001500ae000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000")

    static func hexBytes(_ hex: String) -> [UInt8] {
        var bytes: [UInt8] = []
        var index = hex.startIndex
        while index < hex.endIndex {
            let next = hex.index(index, offsetBy: 2)
            bytes.append(UInt8(hex[index..<next], radix: 16)!)
            index = next
        }
        return bytes
    }

    static func classify(_ bytes: [UInt8], atEnd: Bool = false) -> TransparentOpening {
        bytes.withUnsafeBytes { TransparentOpening.classify($0, requestLineLimit: 8192, atEnd: atEnd) }
    }

    /// A ClientHello with the given server_name extension data (nil: no extensions at all), in one record or
    /// split into records of `fragment` bytes.
    static func hello(serverNameExtension: [UInt8]?, extraExtensions: [UInt8] = [], fragment: Int = 1 << 14) -> [UInt8] {
        var body: [UInt8] = [3, 3] + [UInt8](repeating: 7, count: 32) + [0] + [0, 2, 0x13, 0x01] + [1, 0]
        if let serverNameExtension {
            let extensions = [0, 0] + u16(serverNameExtension.count) + serverNameExtension + extraExtensions
            body += u16(extensions.count) + extensions
        }
        let message: [UInt8] = [1, 0] + u16(body.count) + body
        var records: [UInt8] = []
        var offset = 0
        while offset < message.count {
            let chunk = Array(message[offset..<min(message.count, offset + fragment)])
            records += [22, 3, 1] + u16(chunk.count) + chunk
            offset += chunk.count
        }
        return records
    }

    static func u16(_ value: Int) -> [UInt8] { [UInt8(value >> 8), UInt8(value & 0xff)] }

    static func names(_ list: [(UInt8, String)]) -> [UInt8] {
        var entries: [UInt8] = []
        for (type, name) in list { entries += [type] + u16(name.utf8.count) + Array(name.utf8) }
        return u16(entries.count) + entries
    }

    @Test("a real ClientHello gives its SNI, lowercased")
    func realHello() {
        #expect(Self.classify(Self.curlHello) == .tls(serverName: "www.example.com"))
    }

    @Test("every truncation of a real ClientHello asks for more, and is other at EOF")
    func truncations() {
        for length in 1..<Self.curlHello.count {
            let prefix = Array(Self.curlHello[..<length])
            #expect(Self.classify(prefix) == .needMore, "length \(length)")
            #expect(Self.classify(prefix, atEnd: true) == .other, "length \(length)")
        }
    }

    @Test("every single-byte mutation of a real ClientHello ends in a value; a name is always a valid one")
    func mutations() {
        var generator = SystemRandomNumberGenerator()
        for index in 0..<Self.curlHello.count {
            for _ in 0..<4 {
                var mutated = Self.curlHello
                mutated[index] = UInt8.random(in: 0...255, using: &generator)
                switch Self.classify(mutated) {
                case .tls(let name?):
                    #expect(ClientHello.validHostName(ArraySlice(name.utf8)) == name, "index \(index)")
                case .tls(nil), .needMore, .other, .http:
                    break
                }
            }
        }
    }

    @Test("a ClientHello fragmented over several records is joined")
    func fragmented() {
        let hello = Self.hello(serverNameExtension: Self.names([(0, "cdn.example")]), fragment: 7)
        #expect(Self.classify(hello) == .tls(serverName: "cdn.example"))
        #expect(Self.classify(Array(hello.dropLast())) == .needMore)
    }

    @Test("names that are not DNS host names are no names", arguments: [
        "a b.example", "a:443", "192.168.1.1", "example.", ".example", "a..b", "x\u{0}y", "é.example",
        String(repeating: "a", count: 64) + ".example",
    ])
    func invalidNames(_ name: String) {
        #expect(Self.classify(Self.hello(serverNameExtension: Self.names([(0, name)]))) == .tls(serverName: nil))
    }

    @Test("without extensions, or without server_name, it is TLS without a name")
    func noName() {
        #expect(Self.classify(Self.hello(serverNameExtension: nil)) == .tls(serverName: nil))
        #expect(Self.classify(Self.hello(serverNameExtension: Self.names([(1, "opaque")]))) == .tls(serverName: nil))
    }

    @Test("lengths that do not add up are malformed: relayed blind", arguments: [
        [UInt8](Self.u16(9)) + [0, 0, 4, 65, 65, 65, 65],   // list longer than the extension
        [UInt8](Self.u16(3)) + [0, 0, 9],                   // name longer than the list
        [UInt8](Self.u16(0)),                               // empty list
    ])
    func badLengths(_ serverName: [UInt8]) {
        #expect(Self.classify(Self.hello(serverNameExtension: serverName)) == .other)
    }

    @Test("two server_name extensions are malformed (RFC 8446 §4.2)")
    func duplicateExtension() {
        let list = Self.names([(0, "a.example")])
        let twice = Self.hello(serverNameExtension: list, extraExtensions: [0, 0] + Self.u16(list.count) + list)
        #expect(Self.classify(twice) == .other)
    }

    @Test("a record that is not a handshake, or a handshake that is not a ClientHello, is other", arguments: [
        [UInt8]([22, 3, 1, 0, 4, 2, 0, 0, 0]), [22, 9, 1, 0, 1, 1], [22, 3, 1, 0x40, 0x01] + [UInt8](repeating: 1, count: 16),
        [22, 3, 1, 0, 0],
    ])
    func notClientHello(_ bytes: [UInt8]) {
        #expect(Self.classify(bytes) == .other)
    }

    @Test("a ClientHello longer than the peek limit is TLS without a name")
    func tooLarge() {
        let big = Self.hello(serverNameExtension: Self.names([(0, "big.example")]),
                             extraExtensions: [0xff, 0x01] + Self.u16(30_000) + [UInt8](repeating: 0, count: 30_000))
        let seen = Array(big.prefix(TransparentOpening.peekLimit))
        #expect(Self.classify(seen) == .tls(serverName: nil))
    }

    @Test("request lines", arguments: [
        ("GET / HTTP/1.1\r\n", TransparentOpening.http), ("POST /a?b=c HTTP/1.0\r\nHost: x\r\n", .http),
        ("GET / HTTP/1.1\n", .http), ("M-SEARCH * HTTP/1.1\r\n", .http),
        ("GET", .needMore), ("GET /", .needMore), ("GET / HTTP/1.1\r", .needMore),
        ("GET / HTTP/2.0\r\n", .other), ("GET  HTTP/1.1\r\n", .other), ("GET /\r\n", .other),
        ("SSH-2.0-OpenSSH_9.2\r\n", .other), ("\u{0}\u{1}", .other), ("GET /\u{1}x HTTP/1.1\r\n", .other),
        ("GET / HTTP/1.1\rX\n", .other), (" GET / HTTP/1.1\r\n", .other),
        (String(repeating: "A", count: 40) + " / HTTP/1.1\r\n", .other),
    ])
    func requestLines(_ text: String, _ expected: TransparentOpening) {
        #expect(Self.classify(Array(text.utf8)) == expected)
    }

    @Test("a request line longer than the limit is other")
    func longLine() {
        let line = Array(("GET /" + String(repeating: "a", count: 9000)).utf8)
        #expect(Self.classify(line) == .other)
        #expect(Self.classify(Array(line.prefix(100))) == .needMore)
    }

    @Test("nothing at EOF is other; nothing yet is needMore")
    func empty() {
        #expect(Self.classify([]) == .needMore)
        #expect(Self.classify([], atEnd: true) == .other)
    }
}
