import DatamodeHTTP
@testable import DatamodeHTTP2
import DatamodePolicy
@testable import DatamodeEngine
import DatamodeTestSupport
import Testing

/// The engine hands two heads of its own making over on their lengths alone (`HeadHandoff.Source.checkedParts`):
/// the forwarded request to an h2 origin's stream (`HTTP2OriginStream.handedLength`) and the relayed response to an
/// h2 client's stream (`OriginResponse.handToStream`). The claim: every part of them is known good by how it was
/// made — from a head `HTTP1Parser` read or an h2 codec built, a parsed target, the proxy's constants, numbers and
/// variant ids. Random and mutated client and origin heads (bytes that end, break or get trimmed from a field) go
/// through the parser or the codecs, then through `MessageHeads` with random options; every head made is handed
/// both ways under the stream's limits and under tight ones, and both ways must agree. Many heads must get through,
/// or the claim is tested on nothing. (Debug builds also stop on a disagreement inside `HeadHandoff`.)
///
/// Seeded: `DATAMODE_PARSER_SEED=<n>` replays a run; without it each run picks a seed and prints it.
@Suite struct HandoffSourceTests {
    static let seed = SeededGenerator.seed(from: "DATAMODE_PARSER_SEED")

    static let names = ["Content-Type", "Content-Length", "Transfer-Encoding", "Connection", "Keep-Alive", "Upgrade",
                        "x-a", "Via", "Data-Mode-Variant", "ETag", "Cache-Control", "Save-Data", "Range", "If-Range",
                        "If-None-Match", "Allow-Constrained", "Cookie", "TE", "a", "!#$%&'*+-.^_`|~"]
    static let values = ["text/html", "5", "", "a b", "\"etag\"", "é", "max-age=60, public", "x\ty", "close",
                         "chunked", "keep-alive, x-a", "upgrade", "bytes=0-9", "?1", "on"]
    static let junk = ["\r", "\n", "\0", " ", "\t", ":", "\u{7f}", "\u{1}", "(", "é", "\u{85}", "A", ""]
    static let tight = HTTPLimits(requestLine: 64, headerSection: 320, headerCount: 8)

    static func mutated(_ s: String, _ rng: inout SeededGenerator, odds: Int = 6) -> String {
        rng.mutated(s, junk: junk, odds: odds)
    }

    static func fields(_ rng: inout SeededGenerator, lowercase: Bool = false) -> [(String, String)] {
        (0..<Int.random(in: 0...7, using: &rng)).map { _ in
            let name = mutated(names.randomElement(using: &rng)!, &rng)
            return (lowercase ? name.lowercased() : name, mutated(values.randomElement(using: &rng)!, &rng))
        }
    }

    static func framing(_ rng: inout SeededGenerator) -> BodyFraming {
        [BodyFraming.none, .contentLength(UInt64.random(in: 0...1 << 40, using: &rng)), .chunked, .untilClose]
            .randomElement(using: &rng)!
    }

    /// A client's request head and its target as admission resolves it: read by the parser from an HTTP/1.1
    /// client's text, or built by the h2 codec from a client's stream (as `HTTP2Stream.start` hands it over).
    static func clientHead(_ rng: inout SeededGenerator) -> (RequestHead, RequestTarget)? {
        if Bool.random(using: &rng) {
            let target = mutated(["http://example.com/up?x=1", "http://[::1]:8080/a", "http://a/b%20c"]
                .randomElement(using: &rng)!, &rng, odds: 12)
            var text = mutated(["GET", "POST", "PUT"].randomElement(using: &rng)!, &rng, odds: 12) + " " + target
                + " HTTP/1.1\r\n"
            for (name, value) in fields(&rng) { text += name + ": " + value + "\r\n" }
            text += "\r\n"
            guard case .complete(let head, _) = Array(text.utf8).withUnsafeBytes({
                HTTP1Parser.parseRequestHead($0, limits: HTTPLimits())
            }), case .success(let parsed) = RequestTarget.parse(head.target, method: head.method) else { return nil }
            return (head, parsed)
        }
        let authority = mutated(["example.com", "example.com:8443", "[::1]"].randomElement(using: &rng)!, &rng, odds: 12)
        let path = mutated(["/", "/a/b?c=d", "/img.jpg"].randomElement(using: &rng)!, &rng, odds: 12)
        var builder = HTTP2RequestBuilder(part: .head, limits: HTTPLimits(), scheme: "https")
        let pseudo = [(":method", "POST"), (":scheme", "https"), (":authority", authority), (":path", path)]
        for (name, value) in pseudo + fields(&rng, lowercase: true) {
            Array(name.utf8).withUnsafeBytes { n in Array(value.utf8).withUnsafeBytes { builder.add(name: n, value: $0) } }
        }
        guard case .success(let request) = builder.finish(endStream: false),
              case .success(let target) = RequestTarget.parse("https://" + request.authority + request.path,
                                                              method: request.method) else { return nil }
        return (request.requestHead(chunked: Bool.random(using: &rng)), target)
    }

    @Test func aForwardedHeadIsHandedAlikeWithoutTheByteChecks() {
        print("HandoffSourceTests seed \(Self.seed) (DATAMODE_PARSER_SEED=\(Self.seed) replays it)")
        var rng = SeededGenerator(seed: Self.seed)
        var failures: [String] = []
        var made = 0
        let cases = 10_000
        for _ in 0..<cases where failures.count < 5 {
            guard let (head, target) = Self.clientHead(&rng) else { continue }
            let tags = RequestTags(allowConstrained: .random(using: &rng), allowExpensive: .random(using: &rng))
            let settings = TagSettings(forward: .random(using: &rng), saveData: .random(using: &rng))
            let mode: DataMode = [[], .constrained, [.constrained, .expensive]].randomElement(using: &rng)!
            guard case .head(let forwarded) = MessageHeads.forwardedRequest(
                head, target: target, tags: tags, settings: settings, mode: mode, upgrade: .random(using: &rng),
                framing: Self.framing(&rng), connectionTokens: head.connectionTokens,
                variantTarget: .random(using: &rng), asHead: true) else {
                failures.append("asHead gave text")
                continue
            }
            made += 1
            let stream = HTTP2OriginStream.requestLimits
            if let failure = HandoffAgreement.disagreement(forwarded, under: [(stream, stream.maxRequestHeadBytes),
                                                                             (Self.tight, 400)]) {
                failures.append(failure)
            }
        }
        #expect(failures.isEmpty, "seed \(Self.seed):\n\(failures.joined(separator: "\n"))")
        #expect(made > cases / 10 && made < cases * 9 / 10, "made \(made) of \(cases)")
    }

    /// An origin's response head: read by the parser from an HTTP/1.1 origin's text, or made of fields an h2 origin's
    /// codec lets through (as `HTTP2OriginStream.passHead` hands it over: its reason table, a framing field last;
    /// `HeadHandoffSourceTests` runs the codec itself).
    static func originHead(_ rng: inout SeededGenerator) -> ResponseHead? {
        if Bool.random(using: &rng) {
            let reason = mutated(["OK", "Not Found", "", "Partial Content"].randomElement(using: &rng)!, &rng, odds: 12)
            var text = "HTTP/1.1 " + ["200", "206", "404", "103"].randomElement(using: &rng)! + " " + reason + "\r\n"
            for (name, value) in fields(&rng) { text += name + ": " + value + "\r\n" }
            text += "\r\n"
            guard case .complete(let head, _) = Array(text.utf8).withUnsafeBytes({
                HTTP1Parser.parseResponseHead($0, limits: Flow.responseLimits)
            }) else { return nil }
            return head
        }
        // The fields an h2 origin's codec lets through (`HTTP2ClientSession.header`'s checks, called as it calls them).
        var fields: [HTTPField] = []
        for (name, value) in Self.fields(&rng, lowercase: true) {
            guard let checked = Array(value.utf8).withUnsafeBytes({ HTTP2RequestBuilder.validValue($0) }),
                  Array(name.utf8).withUnsafeBytes({ FieldBytes.isLowercaseToken($0) }),
                  !HTTP2ResponseTranslation.isConnectionSpecific(name) else { return nil }
            fields.append(HTTPField(name: name, value: checked))
        }
        let status = [200, 404, 206].randomElement(using: &rng)!
        let framing = [nil, HTTPField(name: "transfer-encoding", value: "chunked")].randomElement(using: &rng)!
        return ResponseHead(version: .http11, status: status, reason: HTTP2OriginStream.reason(status),
                            fields: fields + (framing.map { [$0] } ?? []))
    }

    @Test func aRelayedHeadIsHandedAlikeWithoutTheByteChecks() {
        var rng = SeededGenerator(seed: Self.seed &+ 1)
        var failures: [String] = []
        var made = 0
        let cases = 6_000
        for _ in 0..<cases where failures.count < 5 {
            guard let origin = Self.originHead(&rng) else { continue }
            made += 1
            let framing: BodyFraming? = Bool.random(using: &rng) ? nil : Self.framing(&rng)
            let relayed = MessageHeads.relayedResponseHead(
                origin, keepAlive: .random(using: &rng), clientVersion: .http11, stripTransferEncoding: .random(using: &rng),
                variant: [nil, "low", "hls-cap", "a.b_C-9"].randomElement(using: &rng)!, framing: framing,
                heldMilliseconds: Bool.random(using: &rng) ? nil : Int64.random(in: 0...1 << 40, using: &rng))
            if let failure = HandoffAgreement.disagreement(relayed, under: [(Flow.relayedResponseLimits,
                                                                              Flow.maxRelayedResponseHeadBytes),
                                                                             (Self.tight, 400)]) {
                failures.append(failure)
            }
        }
        #expect(failures.isEmpty, "seed \(Self.seed):\n\(failures.joined(separator: "\n"))")
        #expect(made > cases / 10 && made < cases * 9 / 10, "made \(made) of \(cases)")
    }
}
