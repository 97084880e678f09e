import DatamodeHTTP
import Testing

/// RFC 9112 §6 framing, strict: every row that is refused is a request-smuggling class (SPEC §6).
@Suite("Body framing")
struct BodyFramingTests {
    enum Expect: Hashable, Sendable {
        case framing(BodyFraming)
        case malformed
        /// A limit error from a framing rule would be a bug.
        case otherError
    }

    static func outcome(_ r: Result<BodyFraming, HTTPWireError>) -> Expect {
        switch r {
        case .success(let f): .framing(f)
        case .failure(.malformed): .malformed
        case .failure: .otherError
        }
    }

    static let requests: [Row<[String], Expect>] = [
        Row("no body", ["Host: a"], .framing(.none)),
        Row("content-length", ["Content-Length: 5"], .framing(.contentLength(5))),
        Row("content-length 0", ["Content-Length: 0"], .framing(.contentLength(0))),
        Row("content-length leading zeros", ["Content-Length: 007"], .framing(.contentLength(7))),
        Row("content-length 18 digits", ["Content-Length: 999999999999999999"], .framing(.contentLength(999_999_999_999_999_999))),
        Row("content-length any case", ["cOnTeNt-LeNgTh: 5"], .framing(.contentLength(5))),
        Row("CL list of identical values", ["Content-Length: 5, 5"], .framing(.contentLength(5))),
        Row("CL identical duplicate fields", ["Content-Length: 5", "Content-Length: 5"], .framing(.contentLength(5))),
        Row("CL list differing values (CL.CL)", ["Content-Length: 5, 6"], .malformed),
        Row("CL duplicate differing fields (CL.CL)", ["Content-Length: 5", "Content-Length: 6"], .malformed),
        Row("CL +5", ["Content-Length: +5"], .malformed),
        Row("CL -5", ["Content-Length: -5"], .malformed),
        Row("CL 0x5", ["Content-Length: 0x5"], .malformed),
        Row("CL space inside", ["Content-Length: 1 0"], .malformed),
        Row("CL empty", ["Content-Length:"], .malformed),
        Row("CL empty list element", ["Content-Length: 5,"], .malformed),
        Row("CL 19 digits", ["Content-Length: 1000000000000000000"], .malformed),
        Row("CL overflow", ["Content-Length: 99999999999999999999999"], .malformed),
        Row("Connection names Transfer-Encoding", ["Connection: Transfer-Encoding", "Transfer-Encoding: chunked"], .malformed),
        Row("Connection names transfer-encoding in a list", ["Connection: keep-alive ,transfer-encoding", "Transfer-Encoding: chunked"], .malformed),
        Row("Connection names Content-Length", ["Connection: content-length", "Content-Length: 5"], .malformed),
        Row("Connection names Host", ["Connection: HOST"], .malformed),
        Row("Connection names a longer token", ["Connection: transfer-encodings, hosts", "Content-Length: 5"], .framing(.contentLength(5))),
        Row("Connection: close, keep-alive, upgrade", ["Connection: close, keep-alive, upgrade"], .framing(.none)),
        Row("CL decimal point", ["Content-Length: 5.0"], .malformed),
        Row("TE chunked", ["Transfer-Encoding: chunked"], .framing(.chunked)),
        Row("TE Chunked (case-insensitive)", ["Transfer-Encoding: Chunked"], .framing(.chunked)),
        Row("TE CHUNKED with OWS", ["transfer-encoding: \t CHUNKED \t"], .framing(.chunked)),
        Row("CL then TE (CL.TE)", ["Content-Length: 5", "Transfer-Encoding: chunked"], .malformed),
        Row("TE then CL (TE.CL)", ["Transfer-Encoding: chunked", "Content-Length: 5"], .malformed),
        Row("TE chunked, chunked (TE.TE)", ["Transfer-Encoding: chunked, chunked"], .malformed),
        Row("TE chunked twice as fields (TE.TE)", ["Transfer-Encoding: chunked", "Transfer-Encoding: chunked"], .malformed),
        Row("TE gzip, chunked", ["Transfer-Encoding: gzip, chunked"], .malformed),
        Row("TE gzip field then chunked field", ["Transfer-Encoding: gzip", "Transfer-Encoding: chunked"], .malformed),
        Row("TE chunked, gzip", ["Transfer-Encoding: chunked, gzip"], .malformed),
        Row("TE identity", ["Transfer-Encoding: identity"], .malformed),
        Row("TE xchunked", ["Transfer-Encoding: xchunked"], .malformed),
        Row("TE chunkedx", ["Transfer-Encoding: chunkedx"], .malformed),
        Row("TE empty", ["Transfer-Encoding:"], .malformed),
        Row("TE chunked plus empty copy", ["Transfer-Encoding: chunked", "Transfer-Encoding: "], .malformed),
        Row("TE chunked with trailing comma", ["Transfer-Encoding: chunked,"], .malformed),
        Row("TE quoted", ["Transfer-Encoding: \"chunked\""], .malformed),
        Row("TE chunked with parameter", ["Transfer-Encoding: chunked;q=1"], .malformed),
    ]

    @Test(arguments: requests)
    func requestFraming(_ row: Row<[String], Expect>) throws {
        let h = try #require(requestHead(row.input), "head must parse: \(row.name)")
        #expect(Self.outcome(h.bodyFraming()) == row.expected, "\(row.name)")
    }

    @Test func errorsAreMalformedNotLimits() throws {
        let h = try #require(requestHead(["Content-Length: 5", "Transfer-Encoding: chunked"]))
        guard case .failure(.malformed(let reason)) = h.bodyFraming() else {
            Issue.record("expected .malformed")
            return
        }
        #expect(!reason.isEmpty)
    }

    /// RFC 9112 §6.1: an HTTP/1.0 message with Transfer-Encoding has faulty framing.
    @Test(arguments: [("HTTP/1.0", Expect.malformed), ("HTTP/1.1", Expect.framing(.chunked))])
    func transferEncodingOnHTTP10(_ version: String, _ expected: Expect) throws {
        let h = try #require(requestHead(["Transfer-Encoding: chunked"], version: version))
        #expect(Self.outcome(h.bodyFraming()) == expected)
    }

    struct ResponseCase: Sendable, CustomStringConvertible {
        var method: String
        var status: Int
        var fields: [String]
        var version = "HTTP/1.1"
        var expected: Expect
        var description: String { "\(method) -> \(status) \(fields)" }
    }

    static let responses: [ResponseCase] = [
        ResponseCase(method: "GET", status: 200, fields: ["Content-Length: 5"], expected: .framing(.contentLength(5))),
        ResponseCase(method: "GET", status: 200, fields: ["Transfer-Encoding: chunked"], expected: .framing(.chunked)),
        ResponseCase(method: "GET", status: 200, fields: [], expected: .framing(.untilClose)),
        ResponseCase(method: "GET", status: 200, fields: [], version: "HTTP/1.0", expected: .framing(.untilClose)),
        ResponseCase(method: "HEAD", status: 200, fields: ["Content-Length: 5"], expected: .framing(.none)),
        ResponseCase(method: "HEAD", status: 200, fields: ["Transfer-Encoding: chunked"], expected: .framing(.none)),
        ResponseCase(method: "GET", status: 100, fields: [], expected: .framing(.none)),
        ResponseCase(method: "GET", status: 101, fields: ["Upgrade: websocket"], expected: .framing(.none)),
        ResponseCase(method: "GET", status: 199, fields: ["Content-Length: 5"], expected: .framing(.none)),
        ResponseCase(method: "GET", status: 204, fields: ["Content-Length: 5"], expected: .framing(.none)),
        ResponseCase(method: "GET", status: 304, fields: ["Content-Length: 5"], expected: .framing(.none)),
        ResponseCase(method: "GET", status: 205, fields: [], expected: .framing(.untilClose)),
        ResponseCase(method: "CONNECT", status: 200, fields: ["Content-Length: 5"], expected: .framing(.none)),
        ResponseCase(method: "CONNECT", status: 299, fields: [], expected: .framing(.none)),
        ResponseCase(method: "CONNECT", status: 407, fields: ["Content-Length: 5"], expected: .framing(.contentLength(5))),
        ResponseCase(method: "GET", status: 404, fields: ["Content-Length: 0"], expected: .framing(.contentLength(0))),
        ResponseCase(method: "GET", status: 200, fields: ["Content-Length: 5", "Transfer-Encoding: chunked"], expected: .malformed),
        ResponseCase(method: "GET", status: 200, fields: ["Transfer-Encoding: gzip"], expected: .malformed),
        ResponseCase(method: "GET", status: 200, fields: ["Transfer-Encoding: gzip, chunked"], expected: .malformed),
        ResponseCase(method: "GET", status: 200, fields: ["Transfer-Encoding: chunked"], version: "HTTP/1.0", expected: .malformed),
        ResponseCase(method: "GET", status: 200, fields: ["Content-Length: 5", "Content-Length: 6"], expected: .malformed),
        ResponseCase(method: "GET", status: 200, fields: ["Content-Length: 5, 5"], expected: .framing(.contentLength(5))),
        ResponseCase(method: "GET", status: 200, fields: ["Content-Length: -1"], expected: .malformed),
        ResponseCase(method: "POST", status: 500, fields: ["Transfer-Encoding: CHUNKED"], expected: .framing(.chunked)),
    ]

    @Test(arguments: responses)
    func responseFraming(_ c: ResponseCase) throws {
        let text = "\(c.version) \(c.status) X\r\n" + c.fields.map { $0 + "\r\n" }.joined() + "\r\n"
        let h = try #require(head(parseResponse(text)))
        #expect(Self.outcome(h.bodyFraming(requestMethod: c.method)) == c.expected)
    }
}
