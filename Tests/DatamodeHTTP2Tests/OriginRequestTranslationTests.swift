import DatamodeHTTP
import DatamodeHTTP2
import Testing

/// The HTTP/1.1 request an exchange wrote, as the HTTP/2 request `HTTP2OriginStream` sends an origin that chose h2
/// (SPEC §17 "Origin side", translation strict both ways).
@Suite("HTTP/2 origin request translation")
struct OriginRequestTranslationTests {
    static func head(_ target: String, _ fields: [(String, String)], method: String = "GET") -> RequestHead {
        RequestHead(method: method, target: target, version: .http11, fields: fields.map { HTTPField(name: $0.0, value: $0.1) })
    }

    @Test func hostBecomesTheAuthorityAndConnectionSpecificFieldsGo() throws {
        let request = try HTTP2OriginRequestTranslation.request(of: Self.head("/a?b=1", [
            ("Host", "example.com:8443"), ("User-Agent", "curl"), ("Connection", "keep-alive, X-Hop"), ("X-Hop", "1"),
            ("Keep-Alive", "timeout=5"), ("Proxy-Connection", "keep-alive"), ("Transfer-Encoding", "chunked"),
            ("Upgrade", "h2c"), ("TE", "gzip, trailers"), ("Allow-Constrained", "?0"),
        ]), defaultAuthority: "fallback").get()
        #expect(request.method == "GET" && request.path == "/a?b=1" && request.authority == "example.com:8443")
        #expect(request.fields == [HTTPField(name: "user-agent", value: "curl"), HTTPField(name: "te", value: "trailers"),
                                   HTTPField(name: "allow-constrained", value: "?0")])
    }

    @Test func teWithoutTrailersIsDropped() throws {
        let request = try HTTP2OriginRequestTranslation.request(of: Self.head("/", [("Host", "a"), ("TE", "gzip")]),
                                                                defaultAuthority: "a").get()
        #expect(request.fields.isEmpty)
    }

    @Test func absoluteFormGivesItsAuthorityAndPath() throws {
        let full = try HTTP2OriginRequestTranslation.request(of: Self.head("https://origin.test:444/x/y?z", [("Host", "origin.test:444")]),
                                                             defaultAuthority: "a").get()
        #expect(full.authority == "origin.test:444" && full.path == "/x/y?z")
        let bare = try HTTP2OriginRequestTranslation.request(of: Self.head("https://origin.test", []), defaultAuthority: "a").get()
        #expect(bare.authority == "origin.test" && bare.path == "/")
        let query = try HTTP2OriginRequestTranslation.request(of: Self.head("https://origin.test?q", []), defaultAuthority: "a").get()
        #expect(query.path == "/?q")
    }

    @Test func noHostTakesTheConnectionsAuthority() throws {
        let request = try HTTP2OriginRequestTranslation.request(of: Self.head("*", [], method: "OPTIONS"),
                                                                defaultAuthority: "origin.test:8443").get()
        #expect(request.authority == "origin.test:8443" && request.path == "*")
    }

    @Test(arguments: [
        ("two hosts", head("/", [("Host", "a"), ("Host", "b")])),
        ("CONNECT", head("a:443", [("Host", "a:443")], method: "CONNECT")),
        ("authority-form target", head("a:443", [("Host", "a")])),
        ("a value HTTP/2 cannot carry", head("/", [("Host", "a"), ("X-Bad", "a\u{7f}b")])),
    ])
    func whatCannotGoOutInHTTP2IsRefused(name: String, head: RequestHead) {
        if case .success(let request) = HTTP2OriginRequestTranslation.request(of: head, defaultAuthority: "a") {
            Issue.record("\(name) was translated: \(request)")
        }
    }
}
