import DatamodeHTTP
import Testing

@Suite("Request targets")
struct RequestTargetTests {
    struct Valid: Sendable, CustomStringConvertible {
        var target: String
        var method = "GET"
        var expected: RequestTarget
        var description: String { "\(method) \(target)" }
    }

    static func t(_ form: RequestTarget.Form, _ scheme: String, _ host: String, _ port: UInt16, _ path: String,
                  _ hostHeader: String, _ url: String) -> RequestTarget {
        RequestTarget(form: form, scheme: scheme, host: host, port: port, path: path, hostHeaderValue: hostHeader, absoluteURL: url)
    }

    static let valid: [Valid] = [
        Valid(target: "http://example.com/a/b?c=d&e",
              expected: t(.absolute, "http", "example.com", 80, "/a/b?c=d&e", "example.com", "http://example.com/a/b?c=d&e")),
        Valid(target: "http://example.com",
              expected: t(.absolute, "http", "example.com", 80, "/", "example.com", "http://example.com/")),
        Valid(target: "http://example.com?q",
              expected: t(.absolute, "http", "example.com", 80, "/?q", "example.com", "http://example.com/?q")),
        Valid(target: "HTTP://Example.COM:80/Path",
              expected: t(.absolute, "http", "example.com", 80, "/Path", "example.com", "http://example.com/Path")),
        Valid(target: "http://example.com:/x",
              expected: t(.absolute, "http", "example.com", 80, "/x", "example.com", "http://example.com/x")),
        Valid(target: "http://example.com:8080/x",
              expected: t(.absolute, "http", "example.com", 8080, "/x", "example.com:8080", "http://example.com:8080/x")),
        Valid(target: "https://example.com/",
              expected: t(.absolute, "https", "example.com", 443, "/", "example.com", "https://example.com/")),
        Valid(target: "https://example.com:80/",
              expected: t(.absolute, "https", "example.com", 80, "/", "example.com:80", "https://example.com:80/")),
        Valid(target: "http://example.com:443/",
              expected: t(.absolute, "http", "example.com", 443, "/", "example.com:443", "http://example.com:443/")),
        Valid(target: "http://192.0.2.1:81/%7Euser/a%20b",
              expected: t(.absolute, "http", "192.0.2.1", 81, "/%7Euser/a%20b", "192.0.2.1:81", "http://192.0.2.1:81/%7Euser/a%20b")),
        Valid(target: "http://[::1]/",
              expected: t(.absolute, "http", "::1", 80, "/", "[::1]", "http://[::1]/")),
        Valid(target: "http://[2001:DB8::A]:8080/x",
              expected: t(.absolute, "http", "2001:db8::a", 8080, "/x", "[2001:db8::a]:8080", "http://[2001:db8::a]:8080/x")),
        Valid(target: "http://[::ffff:192.0.2.1]/",
              expected: t(.absolute, "http", "::ffff:192.0.2.1", 80, "/", "[::ffff:192.0.2.1]", "http://[::ffff:192.0.2.1]/")),
        Valid(target: "http://[1:2:3:4:5:6:7:8]/",
              expected: t(.absolute, "http", "1:2:3:4:5:6:7:8", 80, "/", "[1:2:3:4:5:6:7:8]", "http://[1:2:3:4:5:6:7:8]/")),
        Valid(target: "http://a-b_c~d.e!$&'()*+,;=%41/",
              expected: t(.absolute, "http", "a-b_c~d.e!$&'()*+,;=%41", 80, "/", "a-b_c~d.e!$&'()*+,;=%41", "http://a-b_c~d.e!$&'()*+,;=%41/")),
        Valid(target: "/just/a/path?x=1",
              expected: t(.origin, "", "", 0, "/just/a/path?x=1", "", "/just/a/path?x=1")),
        Valid(target: "*", method: "OPTIONS",
              expected: t(.asterisk, "", "", 0, "*", "", "*")),
        Valid(target: "Example.com:443", method: "CONNECT",
              expected: t(.authority, "", "example.com", 443, "", "example.com:443", "example.com:443")),
        Valid(target: "example.com:8443", method: "CONNECT",
              expected: t(.authority, "", "example.com", 8443, "", "example.com:8443", "example.com:8443")),
        Valid(target: "[2001:db8::1]:443", method: "CONNECT",
              expected: t(.authority, "", "2001:db8::1", 443, "", "[2001:db8::1]:443", "[2001:db8::1]:443")),
        Valid(target: "10.0.0.1:65535", method: "CONNECT",
              expected: t(.authority, "", "10.0.0.1", 65535, "", "10.0.0.1:65535", "10.0.0.1:65535")),
    ]

    @Test(arguments: valid)
    func parsesValid(_ c: Valid) {
        let result = RequestTarget.parse(c.target, method: c.method)
        #expect(result == .success(c.expected))
    }

    static let invalid: [Row<(String, String), Void>] = [
        Row("userinfo", ("GET", "http://user:pass@example.com/"), ()),
        Row("userinfo hiding the real host", ("GET", "http://allowed.example@evil.example/"), ()),
        Row("empty userinfo", ("GET", "http://@example.com/"), ()),
        Row("userinfo in CONNECT", ("CONNECT", "user@example.com:443"), ()),
        Row("fragment", ("GET", "http://example.com/a#frag"), ()),
        Row("fragment in origin-form", ("GET", "/a#b"), ()),
        Row("ftp scheme", ("GET", "ftp://example.com/"), ()),
        Row("ws scheme", ("GET", "ws://example.com/"), ()),
        Row("no scheme, not CONNECT", ("GET", "example.com:80"), ()),
        Row("scheme without //", ("GET", "http:example.com/"), ()),
        Row("empty host", ("GET", "http:///path"), ()),
        Row("empty host with port", ("GET", "http://:80/"), ()),
        Row("port 0", ("GET", "http://example.com:0/"), ()),
        Row("port 65536", ("GET", "http://example.com:65536/"), ()),
        Row("port not numeric", ("GET", "http://example.com:8o/"), ()),
        Row("port with sign", ("GET", "http://example.com:+80/"), ()),
        Row("two ports", ("GET", "http://example.com:80:80/"), ()),
        Row("bad character in host", ("GET", "http://exa\"mple.com/"), ()),
        Row("bad percent-encoding in host", ("GET", "http://ex%zzample.com/"), ()),
        Row("IPv6 without brackets", ("GET", "http://::1/"), ()),
        Row("IPv6 unclosed bracket", ("GET", "http://[::1/"), ()),
        Row("IPv6 bad group", ("GET", "http://[12345::1]/"), ()),
        Row("IPv6 two ::", ("GET", "http://[1::2::3]/"), ()),
        Row("IPv6 too many groups", ("GET", "http://[1:2:3:4:5:6:7:8:9]/"), ()),
        Row("IPv6 too few groups", ("GET", "http://[1:2:3]/"), ()),
        Row("IPv6 zone id", ("GET", "http://[fe80::1%25eth0]/"), ()),
        Row("IPv6 embedded IPv4 out of range", ("GET", "http://[::ffff:1.2.3.256]/"), ()),
        Row("IPvFuture", ("GET", "http://[v1.x]/"), ()),
        Row("junk after IPv6 bracket", ("GET", "http://[::1]x/"), ()),
        Row("CONNECT without port", ("CONNECT", "example.com"), ()),
        Row("CONNECT with empty port", ("CONNECT", "example.com:"), ()),
        Row("CONNECT IPv6 without port", ("CONNECT", "[::1]"), ()),
        Row("CONNECT absolute-form", ("CONNECT", "http://example.com:443/"), ()),
        Row("CONNECT with path", ("CONNECT", "example.com:443/x"), ()),
        Row("CONNECT port 0", ("CONNECT", "example.com:0"), ()),
        Row("asterisk without OPTIONS", ("GET", "*"), ()),
        Row("space in target", ("GET", "/a b"), ()),
        Row("non-ASCII in target", ("GET", "/é"), ()),
        Row("empty target", ("GET", ""), ()),
    ]

    @Test(arguments: invalid)
    func refusesInvalid(_ row: Row<(String, String), Void>) {
        let (method, target) = row.input
        guard case .failure(.malformed) = RequestTarget.parse(target, method: method) else {
            Issue.record("\(row.name): \(method) \(target) was not refused as malformed")
            return
        }
    }

    @Test func requestTargetOfAParsedHead() throws {
        let h = try #require(head(parseRequest("GET http://Example.com:8080/x HTTP/1.1\r\nHost: ignored\r\n\r\n")))
        let target = try RequestTarget.parse(h.target, method: h.method).get()
        #expect(target.hostHeaderValue == "example.com:8080")
        #expect(target.absoluteURL == "http://example.com:8080/x")
    }
}
