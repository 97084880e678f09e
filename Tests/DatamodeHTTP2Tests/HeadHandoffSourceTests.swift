import DatamodeHTTP
@testable import DatamodeHTTP2
import DatamodeTestSupport
import Testing

/// `HeadHandoff.Source.checkedParts` lets the engine hand a head over checking only its lengths and limits, for the
/// heads the HTTP/2 codecs built: a client's request (`HTTP2Request.requestHead(chunked:)`, into the stream's
/// exchange) and an h2 origin's response (its fields, into the exchange behind `HTTP2OriginStream`). The claim:
/// for every head either codec lets through, the byte checks (`.unchecked`) give the same answer. Random and mutated
/// sections (bytes that end, break or get trimmed from a field, pseudo-headers included) go through the request
/// builder and through the client session's response handling; every one they accept is handed both ways, within
/// generous and within tight limits, and both must accept many, or the claim is tested on nothing.
///
/// Seeded: `DATAMODE_PARSER_SEED=<n>` replays a run; without it each run picks a seed and prints it.
@Suite struct HeadHandoffSourceTests {
    static let seed = SeededGenerator.seed(from: "DATAMODE_PARSER_SEED")

    static let names = ["content-type", "x-a", "cookie", "host", "accept", "a", "!#$%&'*+-.^_`|~", "te",
                        "data-mode-variant", "content-length", "etag"]
    static let values = ["text/html", "5", "", "a b", "\"etag\"", "é", "max-age=60, public", "x\ty", "trailers",
                         "a=1", "example.com"]
    static let junk = ["\r", "\n", "\0", " ", "\t", ":", "\u{7f}", "\u{1}", "(", "é", "\u{85}", "A", "", "/", "#",
                       "@", "?"]

    static func mutated(_ s: String, using rng: inout SeededGenerator, odds: Int = 6) -> String {
        rng.mutated(s, junk: junk, odds: odds)
    }

    /// Generous and tight limits, each with a 200-byte largest head.
    static let limits = [(HTTPLimits(), 200), (HTTPLimits(requestLine: 48, headerSection: 160, headerCount: 4), 200)]

    @Test func everyRequestTheBuilderAcceptsIsHandedAlikeWithoutTheByteChecks() {
        print("HeadHandoffSourceTests seed \(Self.seed) (DATAMODE_PARSER_SEED=\(Self.seed) replays it)")
        var rng = SeededGenerator(seed: Self.seed)
        var failures: [String] = []
        var accepted = 0
        let cases = 20_000
        for _ in 0..<cases where failures.count < 5 {
            // The pseudo-headers mutated less often than the fields: a request needs all of them right.
            let method = Self.mutated(["GET", "POST", "OPTIONS", "CONNECT"].randomElement(using: &rng)!, using: &rng,
                                      odds: 20)
            let authority = Bool.random(using: &rng) ? rng.authority() : "example.com:8443"
            var pseudo = [(":method", method), (":authority", Self.mutated(authority, using: &rng, odds: 20))]
            if method != "CONNECT" || Int.random(in: 0..<10, using: &rng) == 0 {
                pseudo.append((":scheme", "https"))
                pseudo.append((":path", Self.mutated(["/", "/a/b?c=d", "*", "/img.jpg"].randomElement(using: &rng)!,
                                                     using: &rng, odds: 20)))
            }
            let fields = (0..<Int.random(in: 0...6, using: &rng)).map { _ in
                (Self.mutated(Self.names.randomElement(using: &rng)!, using: &rng),
                 Self.mutated(Self.values.randomElement(using: &rng)!, using: &rng))
            }
            var builder = HTTP2RequestBuilder(part: .head, limits: HTTPLimits(), scheme: "https")
            for (name, value) in pseudo + fields {
                Array(name.utf8).withUnsafeBytes { n in Array(value.utf8).withUnsafeBytes { builder.add(name: n, value: $0) } }
            }
            guard case .success(let request) = builder.finish(endStream: Bool.random(using: &rng)) else { continue }
            accepted += 1
            for chunked in [false, true] {
                if let failure = HandoffAgreement.disagreement(request.requestHead(chunked: chunked), under: Self.limits) {
                    failures.append(failure)
                }
            }
        }
        #expect(failures.isEmpty, "seed \(Self.seed):\n\(failures.joined(separator: "\n"))")
        #expect(accepted > cases / 10 && accepted < cases * 9 / 10, "accepted \(accepted) of \(cases)")
    }

    @Test func everyResponseAnOriginCanPassIsHandedAlikeWithoutTheByteChecks() throws {
        var rng = SeededGenerator(seed: Self.seed &+ 1)
        var failures: [String] = []
        var accepted = 0
        let cases = 3_000
        for _ in 0..<cases where failures.count < 5 {
            let client = try HTTP2ClientSession()
            let id = try client.startRequest(method: "GET", scheme: "https", authority: "a", path: "/", fields: [],
                                             endStream: true)
            _ = client.writeOutput { _ in }
            var block = HPACK.indexed(8)  // :status 200
            for _ in 0..<Int.random(in: 0...6, using: &rng) {
                let name = Self.mutated(Self.names.randomElement(using: &rng)!, using: &rng)
                let value = Self.mutated(Self.values.randomElement(using: &rng)!, using: &rng)
                block += HPACK.literal(Array(name.utf8), Array(value.utf8))
            }
            let bytes = Wire.settingsFrame() + Wire.headersFrame(id, block, endStream: false)
            for event in bytes.withUnsafeBytes({ client.receive($0) }) {
                guard case .response(_, let status, let fields, _) = event else { continue }
                accepted += 1
                // As `HTTP2OriginStream.passHead` builds it: the reason from its table, a framing field last.
                for framing in [nil, HTTPField(name: "transfer-encoding", value: "chunked")] {
                    let head = ResponseHead(version: .http11, status: status, reason: "OK",
                                            fields: fields + (framing.map { [$0] } ?? []))
                    if let failure = HandoffAgreement.disagreement(head, under: Self.limits) { failures.append(failure) }
                }
            }
        }
        #expect(failures.isEmpty, "seed \(Self.seed):\n\(failures.joined(separator: "\n"))")
        #expect(accepted > cases / 10 && accepted < cases * 9 / 10, "accepted \(accepted) of \(cases)")
    }
}
