import DatamodeHTTP
@testable import DatamodeHTTP2
import Testing

/// SPEC §17 "Translation is strict": every malformed request is a stream error (PROTOCOL_ERROR), never surfaced,
/// never forwarded; the connection carries on. One row per case, sent as hand-built frames (a real client library
/// refuses to produce them), through nghttp2 and the codec together.
@Suite("HTTP/2 strict translation")
struct StrictTranslationTests {
    enum Outcome: Sendable {
        /// Never surfaced: `requestRefused(.malformed)`, RST_STREAM PROTOCOL_ERROR.
        case refused
        /// The head was valid and surfaced; its DATA or trailers were not: RST_STREAM PROTOCOL_ERROR, no
        /// `requestEnd`, `streamClosed(.resetByProxy(PROTOCOL_ERROR))`.
        case resetAfterHead
        /// Valid: surfaced, ended.
        case accepted
    }

    struct Case: Sendable, CustomTestStringConvertible {
        var name: String
        var bytes: [UInt8]
        var outcome: Outcome
        var testDescription: String { name }
    }

    static func head(_ fields: [(String, String)], method: String = "GET", scheme: String? = "https",
                     authority: String? = "example.com", path: String? = "/", endStream: Bool = true) -> [UInt8] {
        Wire.headersFrame(1, Wire.requestBlock(method: method, scheme: scheme, authority: authority, path: path, fields),
                          endStream: endStream)
    }

    static func raw(_ pairs: [([UInt8], [UInt8])]) -> [UInt8] {
        Wire.headersFrame(1, pairs.flatMap { HPACK.literal($0.0, $0.1) })
    }

    static let pseudo: [([UInt8], [UInt8])] = [(":method", "GET"), (":scheme", "https"), (":authority", "example.com"),
                                              (":path", "/")].map { (Array($0.0.utf8), Array($0.1.utf8)) }

    static func withField(_ name: [UInt8], _ value: [UInt8]) -> [UInt8] { raw(pseudo + [(name, value)]) }

    static func trailers(_ fields: [(String, String)], endStream: Bool = true) -> [UInt8] {
        head([], method: "POST", endStream: false) + Wire.dataFrame(1, Array("abc".utf8))
            + Wire.headersFrame(1, HPACK.block(fields), endStream: endStream)
    }

    static let cases: [Case] = [
        // Connection-specific fields (RFC 9113 §8.2.2): the HTTP/1.1 side would act on them.
        Case(name: "connection", bytes: head([("connection", "keep-alive")]), outcome: .refused),
        Case(name: "keep-alive", bytes: head([("keep-alive", "timeout=5")]), outcome: .refused),
        Case(name: "proxy-connection", bytes: head([("proxy-connection", "keep-alive")]), outcome: .refused),
        Case(name: "transfer-encoding (the downgrade-smuggling field)",
             bytes: head([("transfer-encoding", "chunked")], method: "POST"), outcome: .refused),
        Case(name: "upgrade", bytes: head([("upgrade", "websocket")]), outcome: .refused),
        Case(name: "te other than trailers", bytes: head([("te", "gzip")]), outcome: .refused),
        Case(name: "te: trailers is allowed", bytes: head([("te", "trailers")]), outcome: .accepted),
        // Field names (RFC 9113 §8.2.1).
        Case(name: "uppercase field name", bytes: head([("Content-Type", "text/plain")]), outcome: .refused),
        Case(name: "space in a field name", bytes: head([("x y", "1")]), outcome: .refused),
        Case(name: "non-token character in a field name", bytes: head([("x@y", "1")]), outcome: .refused),
        Case(name: "NUL in a field name", bytes: withField([0x78, 0x00, 0x79], Array("1".utf8)), outcome: .refused),
        Case(name: "colon inside a field name", bytes: head([("x:y", "1")]), outcome: .refused),
        Case(name: "empty field name", bytes: withField([], Array("1".utf8)), outcome: .refused),
        // Field values: CR/LF/NUL are header injection on the HTTP/1.1 side.
        Case(name: "CR in a value", bytes: head([("x", "a\rb")]), outcome: .refused),
        Case(name: "LF in a value", bytes: head([("x", "a\nInjected: 1")]), outcome: .refused),
        Case(name: "CRLF in a value", bytes: head([("x", "a\r\nInjected: 1")]), outcome: .refused),
        Case(name: "NUL in a value", bytes: withField(Array("x".utf8), [0x61, 0x00, 0x62]), outcome: .refused),
        Case(name: "other control character in a value", bytes: head([("x", "a\u{01}b")]), outcome: .refused),
        Case(name: "leading space in a value", bytes: head([("x", " a")]), outcome: .refused),
        Case(name: "trailing tab in a value", bytes: head([("x", "a\t")]), outcome: .refused),
        Case(name: "value that is not UTF-8", bytes: withField(Array("x".utf8), [0x61, 0xff]), outcome: .refused),
        // Pseudo-headers (RFC 9113 §8.3).
        Case(name: "duplicated :path", bytes: raw(pseudo + [(Array(":path".utf8), Array("/other".utf8))]), outcome: .refused),
        Case(name: "duplicated :method", bytes: raw([(Array(":method".utf8), Array("GET".utf8))] + pseudo), outcome: .refused),
        Case(name: "unknown pseudo-header", bytes: raw(pseudo + [(Array(":foo".utf8), Array("1".utf8))]), outcome: .refused),
        Case(name: ":status in a request", bytes: raw(pseudo + [(Array(":status".utf8), Array("200".utf8))]), outcome: .refused),
        Case(name: ":protocol without extended CONNECT", bytes: raw(pseudo + [(Array(":protocol".utf8), Array("websocket".utf8))]),
             outcome: .refused),
        Case(name: "pseudo-header after a regular field",
             bytes: raw(Array(pseudo[0..<3]) + [(Array("x".utf8), Array("1".utf8)), pseudo[3]]), outcome: .refused),
        Case(name: "missing :method", bytes: raw(Array(pseudo[1...])), outcome: .refused),
        Case(name: "missing :scheme", bytes: head([], scheme: nil), outcome: .refused),
        Case(name: "missing :path", bytes: head([], path: nil), outcome: .refused),
        Case(name: "missing :authority (Host alone is not enough)", bytes: head([("host", "example.com")], authority: nil),
             outcome: .refused),
        Case(name: "empty :path", bytes: head([], path: ""), outcome: .refused),
        Case(name: ":scheme http inside TLS", bytes: head([], scheme: "http"), outcome: .refused),
        Case(name: ":scheme HTTPS spelled otherwise", bytes: head([], scheme: "HTTPS"), outcome: .refused),
        Case(name: "method that is not a token", bytes: head([], method: "GE T"), outcome: .refused),
        // Targets, read as HTTP/1.1 reads them.
        Case(name: ":authority with userinfo", bytes: head([], authority: "user@example.com"), outcome: .refused),
        Case(name: ":authority with a path in it", bytes: head([], authority: "example.com/x"), outcome: .refused),
        Case(name: ":authority with an invalid port", bytes: head([], authority: "example.com:99999"), outcome: .refused),
        Case(name: ":path not starting with /", bytes: head([], path: "a/b"), outcome: .refused),
        Case(name: ":path with a fragment", bytes: head([], path: "/a#b"), outcome: .refused),
        Case(name: ":path with a space", bytes: head([], path: "/a b"), outcome: .refused),
        Case(name: ":path * for GET", bytes: head([], path: "*"), outcome: .refused),
        Case(name: ":path * for OPTIONS is allowed", bytes: head([], method: "OPTIONS", path: "*"), outcome: .accepted),
        Case(name: "CONNECT with :scheme and :path", bytes: head([], method: "CONNECT", authority: "example.com:443"),
             outcome: .refused),
        Case(name: "CONNECT with :authority alone is a request",
             bytes: head([], method: "CONNECT", scheme: nil, authority: "example.com:443", path: nil), outcome: .accepted),
        // Host and :authority (RFC 9113 §8.3.1).
        Case(name: "host disagreeing with :authority", bytes: head([("host", "other.example")]), outcome: .refused),
        Case(name: "two host fields", bytes: head([("host", "example.com"), ("host", "example.com")]), outcome: .refused),
        Case(name: "host agreeing with :authority is allowed", bytes: head([("host", "EXAMPLE.com")]), outcome: .accepted),
        // content-length against DATA (RFC 9113 §8.1.1).
        Case(name: "content-length smaller than the DATA",
             bytes: head([("content-length", "3")], method: "POST", endStream: false)
                + Wire.dataFrame(1, Array("abcde".utf8), endStream: true), outcome: .resetAfterHead),
        Case(name: "content-length larger than the DATA",
             bytes: head([("content-length", "5")], method: "POST", endStream: false)
                + Wire.dataFrame(1, Array("abc".utf8), endStream: true), outcome: .resetAfterHead),
        Case(name: "content-length with END_STREAM on HEADERS",
             bytes: head([("content-length", "10")], method: "POST"), outcome: .refused),
        Case(name: "two content-length fields", bytes: head([("content-length", "5"), ("content-length", "5")], method: "POST"),
             outcome: .refused),
        Case(name: "content-length that is not a number", bytes: head([("content-length", "5a")], method: "POST"),
             outcome: .refused),
        Case(name: "content-length met exactly is allowed",
             bytes: head([("content-length", "3")], method: "POST", endStream: false)
                + Wire.dataFrame(1, Array("abc".utf8), endStream: true), outcome: .accepted),
        // Trailers (RFC 9113 §8.1, RFC 9110 §6.5.1).
        Case(name: "pseudo-header in trailers", bytes: trailers([(":path", "/x")]), outcome: .resetAfterHead),
        Case(name: "content-length in trailers", bytes: trailers([("content-length", "3")]), outcome: .resetAfterHead),
        Case(name: "transfer-encoding in trailers", bytes: trailers([("transfer-encoding", "chunked")]), outcome: .resetAfterHead),
        Case(name: "host in trailers", bytes: trailers([("host", "example.com")]), outcome: .resetAfterHead),
        Case(name: "CR in a trailer value", bytes: trailers([("x-sum", "a\rb")]), outcome: .resetAfterHead),
        Case(name: "trailers without END_STREAM", bytes: trailers([("x-sum", "1")], endStream: false),
             outcome: .resetAfterHead),
        Case(name: "valid trailers are allowed", bytes: trailers([("x-sum", "1")]), outcome: .accepted),
    ]

    @Test("Malformed requests are stream errors; the connection carries on", arguments: cases)
    func strictTranslation(_ row: Case) throws {
        let peer = try RawPeer()
        peer.send(row.bytes)
        switch row.outcome {
        case .refused:
            #expect(peer.requests.isEmpty, "surfaced: \(peer.requests)")
            let refusal = try #require(peer.refusals.first)
            #expect(refusal.0 == 1)
            if case .malformed = refusal.1 {} else { Issue.record("refused as \(refusal.1)") }
            #expect(peer.rstCode(1) == .protocolError)
        case .resetAfterHead:
            #expect(peer.requests.map(\.0) == [1])
            #expect(peer.rstCode(1) == .protocolError)
            #expect(peer.events.contains(.streamClosed(1, .resetByProxy(.protocolError))))
            #expect(!peer.events.contains { if case .requestEnd = $0 { true } else { false } })
        case .accepted:
            #expect(peer.requests.map(\.0) == [1])
            #expect(peer.refusals.isEmpty && peer.rstCode(1) == nil)
        }
        // Other streams are unaffected.
        peer.send(Wire.headersFrame(3, Wire.requestBlock(path: "/next")))
        #expect(peer.requests.last?.0 == 3 && peer.requests.last?.1.path == "/next")
        #expect(peer.connectionErrors.isEmpty && peer.goaway == nil)
    }

    @Test("A surfaced request carries none of what made others malformed")
    func surfacedRequestIsClean() throws {
        let peer = try RawPeer()
        peer.send(Self.head([("accept", "*/*"), ("cookie", "a=1"), ("te", "trailers"), ("cookie", "b=2"),
                             ("host", "example.com")]))
        let request = try #require(peer.requests.first?.1)
        #expect(request.fields == [HTTPField(name: "accept", value: "*/*"), HTTPField(name: "cookie", value: "a=1; b=2"),
                                   HTTPField(name: "te", value: "trailers")])
        #expect(request.requestHead.values(of: "host") == ["example.com"])
    }
}

/// The codec's own layer, without nghttp2: each check named, so that removing one fails its row.
@Suite("HTTP/2 request builder")
struct RequestBuilderTests {
    static func build(_ fields: [(String, String)], part: HTTP2RequestBuilder.Part = .head, endStream: Bool = true,
                      limits: HTTPLimits = HTTPLimits()) -> Result<HTTP2Request, HTTP2RequestRefusal> {
        var builder = HTTP2RequestBuilder(part: part, limits: limits, scheme: "https")
        for (name, value) in fields {
            var n = name, v = value
            n.withUTF8 { nb in v.withUTF8 { vb in builder.add(name: UnsafeRawBufferPointer(nb), value: UnsafeRawBufferPointer(vb)) } }
        }
        return builder.finish(endStream: endStream)
    }

    static let base = [(":method", "GET"), (":scheme", "https"), (":authority", "example.com"), (":path", "/")]

    static let rows: [(String, [(String, String)], HTTP2RequestRefusal?)] = [
        ("valid", base, nil),
        ("connection", base + [("connection", "close")], .malformed(.connectionSpecificField("connection"))),
        ("keep-alive", base + [("keep-alive", "1")], .malformed(.connectionSpecificField("keep-alive"))),
        ("proxy-connection", base + [("proxy-connection", "1")], .malformed(.connectionSpecificField("proxy-connection"))),
        ("transfer-encoding", base + [("transfer-encoding", "chunked")], .malformed(.connectionSpecificField("transfer-encoding"))),
        ("upgrade", base + [("upgrade", "h2c")], .malformed(.connectionSpecificField("upgrade"))),
        ("te gzip", base + [("te", "gzip")], .malformed(.connectionSpecificField("te"))),
        ("te Trailers", base + [("te", "Trailers")], nil),
        ("uppercase name", base + [("Accept", "*/*")], .malformed(.invalidFieldName)),
        ("space in name", base + [("a b", "1")], .malformed(.invalidFieldName)),
        ("CR in value", base + [("x", "a\rb")], .malformed(.invalidFieldValue(name: "x"))),
        ("LF in value", base + [("x", "a\nb")], .malformed(.invalidFieldValue(name: "x"))),
        ("NUL in value", base + [("x", "a\u{0}b")], .malformed(.invalidFieldValue(name: "x"))),
        ("DEL in value", base + [("x", "a\u{7f}b")], .malformed(.invalidFieldValue(name: "x"))),
        ("leading space", base + [("x", " a")], .malformed(.invalidFieldValue(name: "x"))),
        ("duplicate :path", base + [(":path", "/b")], .malformed(.duplicatePseudoHeader(":path"))),
        ("duplicate :scheme", [(":scheme", "https")] + base, .malformed(.duplicatePseudoHeader(":scheme"))),
        ("unknown pseudo", [(":foo", "1")] + base, .malformed(.unknownPseudoHeader(":foo"))),
        ("pseudo after regular", [("x", "1")] + base, .malformed(.misplacedPseudoHeader(":method"))),
        ("empty :authority", [(":method", "GET"), (":scheme", "https"), (":authority", ""), (":path", "/")],
         .malformed(.missingPseudoHeader(":authority"))),
        ("missing :authority", [(":method", "GET"), (":scheme", "https"), (":path", "/"), ("host", "example.com")],
         .malformed(.missingPseudoHeader(":authority"))),
        ("scheme http", [(":method", "GET"), (":scheme", "http"), (":authority", "example.com"), (":path", "/")],
         .malformed(.schemeNotAllowed("http"))),
        ("userinfo", [(":method", "GET"), (":scheme", "https"), (":authority", "a@example.com"), (":path", "/")],
         .malformed(.invalidTarget("a@example.com/"))),
        ("host differs", base + [("host", "evil.example")], .malformed(.hostDisagreesWithAuthority)),
        ("content-length twice", base + [("content-length", "0"), ("content-length", "0")], .malformed(.invalidContentLength)),
        ("content-length sign", base + [("content-length", "+1")], .malformed(.invalidContentLength)),
        ("content-length 19 digits", base + [("content-length", "1000000000000000000")], .malformed(.invalidContentLength)),
        ("content-length with END_STREAM", base + [("content-length", "1")], .malformed(.contentLengthMismatch)),
        ("path too long", [(":method", "GET"), (":scheme", "https"), (":authority", "example.com"),
                           (":path", "/" + String(repeating: "a", count: 8192))], .pathTooLong),
    ]

    @Test("Each check of the builder, on its own", arguments: rows.indices)
    func row(_ index: Int) {
        let (name, fields, expected) = Self.rows[index]
        switch (Self.build(fields), expected) {
        case (.success, nil): break
        case (.failure(let refusal), let expected?) where refusal == expected: break
        case (let got, _): Issue.record("\(name): got \(got), expected \(String(describing: expected))")
        }
    }

    @Test("Cookie crumbs: joined with \"; \", empty ones left out (no whitespace at either end)")
    func cookieCrumbs() throws {
        let cases: [([String], String)] = [(["a=1", "b=2"], "a=1; b=2"), (["a=1", ""], "a=1"), (["", "b=2"], "b=2"),
                                           (["", ""], ""), (["a=1", "", "c=3"], "a=1; c=3")]
        for (crumbs, joined) in cases {
            let request = try Self.build(Self.base + [("x", "1")] + crumbs.map { ("cookie", $0) }).get()
            #expect(request.fields == [HTTPField(name: "x", value: "1"), HTTPField(name: "cookie", value: joined)], "\(crumbs)")
        }
    }

    @Test("Header section limits: size and count as HTTP/1.1 would carry them")
    func limits() {
        let limits = HTTPLimits(requestLine: 8192, headerSection: 1024, headerCount: 10)
        let many = Self.base + (0..<11).map { ("x\($0)", "1") }
        #expect(throws: HTTP2RequestRefusal.headerSectionTooLarge) { try Self.build(many, limits: limits).get() }
        let big = Self.base + [("x", String(repeating: "a", count: 1024))]
        #expect(throws: HTTP2RequestRefusal.headerSectionTooLarge) { try Self.build(big, limits: limits).get() }
        let fits = Self.base + (0..<10).map { ("x\($0)", "1") }
        #expect(throws: Never.self) { try Self.build(fits, limits: limits).get() }
    }

    @Test("Trailers: no pseudo-headers, no framing or routing fields")
    func trailers() {
        #expect(throws: HTTP2RequestRefusal.malformed(.misplacedPseudoHeader(":path"))) {
            try Self.build([(":path", "/")], part: .trailers).get()
        }
        for name in ["content-length", "host"] {
            #expect(throws: HTTP2RequestRefusal.malformed(.forbiddenTrailer(name))) {
                try Self.build([(name, "1")], part: .trailers).get()
            }
        }
        #expect(throws: HTTP2RequestRefusal.malformed(.connectionSpecificField("transfer-encoding"))) {
            try Self.build([("transfer-encoding", "chunked")], part: .trailers).get()
        }
        #expect(throws: Never.self) { try Self.build([("x-sum", "1")], part: .trailers).get() }
    }
}
