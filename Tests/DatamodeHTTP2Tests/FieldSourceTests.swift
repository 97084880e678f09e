import DatamodeHTTP
import DatamodeHTTP2
import DatamodeTestSupport
import Testing

/// `HTTP2FieldSource.translatedFromHTTP1Head` lets the codec skip its field checks for a head the HTTP/1.1
/// parser read or `HeadHandoff` accepted. The claim: nothing such a head holds fails `problem(with:)` once
/// translated. Random and mutated heads (bytes that end, break or get trimmed from a field) go through the parser
/// and the handoff; every head either accepts must translate to fields with no problem, and both must accept
/// many, or the claim is tested on nothing.
///
/// Seeded: `DATAMODE_PARSER_SEED=<n>` replays a run; without it each run picks a seed and prints it.
@Suite struct FieldSourceTests {
    static let seed = SeededGenerator.seed(from: "DATAMODE_PARSER_SEED")

    static let names = ["content-type", "Content-Length", "x-a", "Set-Cookie", "Via", "ETag", "a", "!#$%&'*+-.^_`|~",
                        "Data-Mode-Variant", "Connection", "Transfer-Encoding", "TE", "Keep-Alive", "Upgrade", "X-UPPER"]
    static let values = ["text/html", "5", "", "a b", "\"etag\"", "é", "max-age=60, public", "x\ty", "close",
                         "chunked", "x-a", "trailers"]
    static let junk = ["\r", "\n", "\0", " ", "\t", ":", "\u{7f}", "\u{1}", "(", "é", "\u{85}", "A", ""]

    static func mutated(_ s: String, using rng: inout SeededGenerator) -> String {
        rng.mutated(s, junk: junk, odds: 6)
    }

    @Test func aParsedOrHandedHeadTranslatesToFieldsTheCodecWouldAccept() {
        print("FieldSourceTests seed \(Self.seed) (DATAMODE_PARSER_SEED=\(Self.seed) replays it)")
        var rng = SeededGenerator(seed: Self.seed)
        let limits = HTTPLimits(requestLine: 8 * 1024, headerSection: 128 * 1024, headerCount: 300)
        var failures: [String] = []
        var parsed = 0, handed = 0
        let cases = 20_000
        for _ in 0..<cases where failures.count < 5 {
            let fields = (0..<Int.random(in: 0...8, using: &rng)).map { _ in
                HTTPField(name: Self.mutated(Self.names.randomElement(using: &rng)!, using: &rng),
                          value: Self.mutated(Self.values.randomElement(using: &rng)!, using: &rng))
            }
            let head = ResponseHead(version: .http11, status: 200, reason: "OK", fields: fields)
            if HeadHandoff.response(head, limits: limits, maxHeadBytes: 140_000) != nil {
                handed += 1
                if let problem = Self.problem(head) { failures.append("handed \(head): \(problem)") }
            }
            // The text written as it is (invalid bytes included), read back by the parser.
            var text = Array("HTTP/1.1 200 OK\r\n".utf8)
            for field in fields { text += Array((field.name + ": " + field.value + "\r\n").utf8) }
            text += [13, 10]
            let result = text.withUnsafeBytes { HTTP1Parser.parseResponseHead($0, limits: limits) }
            if case .complete(let back, _) = result {
                parsed += 1
                if let problem = Self.problem(back) { failures.append("parsed \(back): \(problem)") }
            }
        }
        #expect(failures.isEmpty, "seed \(Self.seed):\n\(failures.joined(separator: "\n"))")
        #expect(parsed > cases / 10 && parsed < cases * 9 / 10, "parsed \(parsed) of \(cases)")
        #expect(handed > cases / 10, "handed \(handed) of \(cases)")
    }

    @Test func aParsedOrHandedRequestHeadTranslatesWithoutAFieldProblem() {
        print("FieldSourceTests seed \(Self.seed) (DATAMODE_PARSER_SEED=\(Self.seed) replays it)")
        var rng = SeededGenerator(seed: Self.seed &+ 1)
        let limits = HTTPLimits(requestLine: 8 * 1024, headerSection: 128 * 1024, headerCount: 300)
        var failures: [String] = []
        var parsed = 0, handed = 0
        let cases = 20_000
        for _ in 0..<cases where failures.count < 5 {
            var fields = [HTTPField(name: "Host", value: "origin.test")]
            fields += (0..<Int.random(in: 0...8, using: &rng)).map { _ in
                HTTPField(name: Self.mutated(Self.names.randomElement(using: &rng)!, using: &rng),
                          value: Self.mutated(Self.values.randomElement(using: &rng)!, using: &rng))
            }
            let head = RequestHead(method: "POST", target: "/upload?x=1", version: .http11, fields: fields)
            if HeadHandoff.request(head, limits: limits, maxHeadBytes: 140_000) != nil {
                handed += 1
                if let problem = Self.fieldProblem(head) { failures.append("handed \(head): \(problem)") }
            }
            var text = Array("POST /upload?x=1 HTTP/1.1\r\n".utf8)
            for field in fields { text += Array((field.name + ": " + field.value + "\r\n").utf8) }
            text += [13, 10]
            let result = text.withUnsafeBytes { HTTP1Parser.parseRequestHead($0, limits: limits) }
            if case .complete(let back, _) = result {
                parsed += 1
                if let problem = Self.fieldProblem(back) { failures.append("parsed \(back): \(problem)") }
            }
        }
        #expect(failures.isEmpty, "seed \(Self.seed):\n\(failures.joined(separator: "\n"))")
        #expect(parsed > cases / 10 && parsed < cases * 9 / 10, "parsed \(parsed) of \(cases)")
        #expect(handed > cases / 10, "handed \(handed) of \(cases)")
    }

    /// The field check's refusal when the origin request translation, checking every field, refuses one.
    static func fieldProblem(_ head: RequestHead) -> String? {
        guard case .failure(.invalidField(let problem)) = HTTP2OriginRequestTranslation.request(
            of: head, defaultAuthority: "origin.test", from: .unchecked) else { return nil }
        // The translation's other refusals (two Host fields, no authority) are not about a field's bytes.
        return problem.hasPrefix("field name") || problem.hasPrefix("invalid value") ? problem : nil
    }

    static func problem(_ head: ResponseHead) -> String? {
        for field in HTTP2ResponseTranslation.fields(of: head) {
            if let problem = HTTP2ResponseTranslation.problem(with: field) { return problem }
        }
        return nil
    }
}

/// RFC 9110 §8.6: no `content-length` on a 1xx or a 204. An origin that sends one anyway is served to an HTTP/1.1
/// client as before; to an HTTP/2 client the field is dropped, since nghttp2 (curl's) takes a `content-length` that
/// disagrees with the DATA as a malformed response and fails the request (session 17's review,
/// `repro/h1_origin_content_length_1xx_204.sh`). A 200's and a 304's stay (the engine relays exactly that many
/// bytes; a 304's describes the selected representation).
@Suite struct ResponseLengthTranslationTests {
    @Test(arguments: [(103, "5", false), (103, "0", false), (100, "0", false), (204, "5", false), (204, "0", false),
                      (200, "5", true), (304, "100", true), (206, "5", true)])
    func contentLengthGoesToHTTP2ClientsOnlyWhereAServerMaySendIt(status: Int, length: String, kept: Bool) {
        let head = ResponseHead(version: .http11, status: status, reason: "R", fields: [
            HTTPField(name: "Link", value: "</a.css>; rel=preload"), HTTPField(name: "Content-Length", value: length)])
        let fields = HTTP2ResponseTranslation.fields(of: head)
        #expect(fields.contains(HTTPField(name: "content-length", value: length)) == kept, "\(status): \(fields)")
        #expect(fields.contains(HTTPField(name: "link", value: "</a.css>; rel=preload")))
    }
}

/// A 1xx to an HTTP/2 client (RFC 9113 §8.2.2): its hints stay; `host` (a request's field echoed back) and the
/// connection-specific fields go, as from a final head. A final head's `host` is left as it was.
@Suite struct InterimTranslationTests {
    @Test(arguments: [100, 103])
    func anInterimHeadKeepsItsHintsOnly(status: Int) {
        let head = ResponseHead(version: .http11, status: status, reason: "R", fields: [
            HTTPField(name: "Link", value: "</a.css>; rel=preload"), HTTPField(name: "Host", value: "hints.example"),
            HTTPField(name: "Connection", value: "keep-alive"), HTTPField(name: "Keep-Alive", value: "timeout=5"),
            HTTPField(name: "Proxy-Connection", value: "keep-alive"), HTTPField(name: "Transfer-Encoding", value: "chunked"),
            HTTPField(name: "Upgrade", value: "h2c"), HTTPField(name: "TE", value: "trailers")])
        #expect(HTTP2ResponseTranslation.fields(of: head) == [HTTPField(name: "link", value: "</a.css>; rel=preload")])
    }

    @Test func aFinalHeadKeepsItsHost() {
        let head = ResponseHead(version: .http11, status: 200, reason: "OK", fields: [HTTPField(name: "Host", value: "a")])
        #expect(HTTP2ResponseTranslation.fields(of: head) == [HTTPField(name: "host", value: "a")])
    }
}

/// A trailer section as HTTP/2 trailers (RFC 9113 §8.1): names lowercased; framing, routing and the
/// connection-specific fields left out (`TrailerSection`), since the codec refuses a connection-specific one and the
/// stream, whose body has gone out, was reset (curl failed a transfer it had whole).
@Suite struct TrailerTranslationTests {
    @Test func onlyTheFieldsATrailerMayCarryGoToHTTP2() {
        let trailers = ["Content-Length", "Host", "TE", "Transfer-Encoding", "Connection", "Keep-Alive", "Upgrade",
                        "Proxy-Connection", "Trailer", "X-Checksum", "Server-Timing"].map { HTTPField(name: $0, value: "v") }
        let fields = HTTP2ResponseTranslation.trailerFields(trailers)
        #expect(fields == [HTTPField(name: "x-checksum", value: "v"), HTTPField(name: "server-timing", value: "v")])
        #expect(fields.allSatisfy { HTTP2ResponseTranslation.problem(with: $0) == nil })
    }
}
