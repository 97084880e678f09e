import DatamodeHTTP
@testable import DatamodeEngine
import DatamodeTestSupport
import Testing

/// An HTTP/1 origin's response head is relayed from its bytes (`OriginResponse.startFromBytes`): read as offsets, its
/// framing and `Connection` options taken from the bytes, each kept line copied. The reference is the head's Strings
/// (`HTTP1Parser.parseResponseHead`, `ResponseHead.bodyFraming`, `MessageHeads.relayedResponse`). On random and
/// mutated heads — framing fields, hop-by-hop fields, names a `Connection` lists, bad bytes, cut anywhere, under
/// wide and tiny limits — both must refuse alike, read the same head, framing and options, and relay the same bytes
/// (`SpannedHeadCheck`; the fuzz target runs the same check on every input).
///
/// Seeded: `DATAMODE_PARSER_SEED=<n>` replays a run; without it each run picks a seed and prints it.
@Suite struct SpannedRelayDifferentialTests {
    static let seed = SeededGenerator.seed(from: "DATAMODE_PARSER_SEED")

    static let statusLines = ["HTTP/1.1 200 OK", "HTTP/1.0 200 OK", "HTTP/1.1 204 No Content", "HTTP/1.1 304 Not Modified",
                              "HTTP/1.1 100 Continue", "HTTP/1.1 103 Early Hints", "HTTP/1.1 101 Switching Protocols",
                              "HTTP/1.1 404 ", "HTTP/1.1 500 Internal Server Error", "HTTP/1.1 206 Partial Content",
                              "HTTP/1.1 200 é ok", "HTTP/1.1 299 x"]
    static let fields: [(String, [String])] = [
        ("Content-Length", ["12", "0", "5, 5", "5,6", "+5", " 7 ", "", "0x5", "1234567890123456789", "00012"]),
        ("Transfer-Encoding", ["chunked", "Chunked", "gzip, chunked", "chunked, chunked", "", "chunked,", "identity"]),
        ("Connection", ["keep-alive", "close", "x-hop, keep-alive", "Keep-Alive, X-Hop", "upgrade", "content-length",
                        "Transfer-Encoding", "host", ",, close ,", "te, trailer", "x-hop,x-other"]),
        ("X-Hop", ["1"]), ("x-other", ["2"]), ("Keep-Alive", ["timeout=5"]), ("Proxy-Connection", ["keep-alive"]),
        ("TE", ["trailers"]), ("Trailer", ["X-Sum"]), ("Upgrade", ["websocket"]), ("Proxy-Authenticate", ["Basic"]),
        ("Data-Mode-Variant", ["forged"]), ("Cache-Control", ["max-age=60"]), ("ETag", ["\"a\""]),
        ("Content-Type", ["text/html", "image/jpeg"]), ("Date", ["Mon, 30 Nov 2026 17:53:38 GMT"]),
        ("Server", ["nginx/1.22.1"]), ("Set-Cookie", ["a=b; Path=/", "é=ü"]), ("Via", ["1.1 other"]),
        ("x-long", [String(repeating: "v", count: 300)]), ("x-tab", ["a\tb", "\tlead", "trail \t"]),
    ]
    static let junk = ["\r", "\n", "\r\n", "\0", " ", "\t", ":", "\u{7f}", "\u{1}", "(", "é", "\u{85}", "", ","]

    static func text(using rng: inout SeededGenerator) -> [UInt8] {
        var head = rng.mutated(statusLines.randomElement(using: &rng)!, junk: junk, odds: 12) + "\r\n"
        let count = Int.random(in: 0..<8, using: &rng) == 0 ? Int.random(in: 0...40, using: &rng) : Int.random(in: 0...9, using: &rng)
        for _ in 0..<count {
            let (name, values) = fields.randomElement(using: &rng)!
            let spelled = Bool.random(using: &rng) ? name : (Bool.random(using: &rng) ? name.lowercased() : name.uppercased())
            let value = values.randomElement(using: &rng)!
            // Now and then OWS around the value, which is not part of it (RFC 9110 §5.5).
            let ows = Int.random(in: 0..<6, using: &rng) == 0 ? " \t" : ""
            head += rng.mutated(spelled, junk: junk, odds: 16) + ":" + (Bool.random(using: &rng) ? " " : "") + ows
                + rng.mutated(value, junk: junk, odds: 16) + ows + "\r\n"
        }
        var bytes = Array((head + "\r\n").utf8)
        // Now and then a cut, or a body behind the head.
        switch Int.random(in: 0..<6, using: &rng) {
        case 0: bytes = Array(bytes.prefix(Int.random(in: 0...bytes.count, using: &rng)))
        case 1: bytes += Array("hello".utf8)
        default: break
        }
        return bytes
    }

    static func limits(using rng: inout SeededGenerator) -> HTTPLimits {
        if Int.random(in: 0..<3, using: &rng) > 0 { return Flow.responseLimits }
        return HTTPLimits(requestLine: Int.random(in: 5...60, using: &rng), headerSection: Int.random(in: 2...400, using: &rng),
                          headerCount: Int.random(in: 0...12, using: &rng))
    }

    @Test func theRelayFromBytesIsTheRelayFromStrings() {
        var rng = SeededGenerator(seed: Self.seed)
        print("SpannedRelayDifferentialTests seed \(Self.seed) (DATAMODE_PARSER_SEED)")
        var failures: [String] = []
        var relayed = 0
        // One writer for every head, as a worker keeps one (`Worker.relayedHeadWriter`).
        var writer = HeadWriter(capacity: 64)
        for _ in 0..<20_000 {
            let text = Self.text(using: &rng)
            let limits = Self.limits(using: &rng)
            if let disagreement = text.withUnsafeBytes({ SpannedHeadCheck.disagreement($0, limits: limits, reusing: &writer) }) {
                failures.append("\(String(decoding: text, as: UTF8.self).debugDescription): \(disagreement)")
            }
            if case .complete(let head, _) = text.withUnsafeBytes({ HTTP1Parser.parseResponseHead($0, limits: limits) }),
               head.status >= 200, case .success = head.bodyFraming(requestMethod: "GET") {
                relayed += 1
            }
        }
        #expect(failures.isEmpty, "seed \(Self.seed): \(failures.count) disagreements, first: \(failures.prefix(3))")
        // The generator must reach the relay often, or the comparison proves little.
        #expect(relayed > 3_000, "only \(relayed) heads were relayed")
    }

    /// The spellings the engine meets every day, each relayed byte for byte as from the Strings.
    @Test(arguments: [
        "HTTP/1.1 200 OK\r\nServer: nginx/1.22.1\r\nDate: Mon, 30 Nov 2026 17:53:38 GMT\r\nContent-Type: application/octet-stream\r\nContent-Length: 1024\r\nLast-Modified: Mon, 30 Nov 2026 10:00:00 GMT\r\nConnection: keep-alive\r\nETag: \"6579a1b2-400\"\r\nAccept-Ranges: bytes\r\n\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: x-hop, keep-alive\r\nX-Hop: 1\r\nKeep-Alive: timeout=5\r\n\r\n",
        "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n",
        "HTTP/1.1 304 Not Modified\r\nContent-Length: 99\r\nETag: \"a\"\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\nx-tab:  \ta\tb \t\r\n\r\n",
    ])
    func commonHeadsRelayAlike(_ text: String) {
        let bytes = Array(text.utf8)
        #expect(bytes.withUnsafeBytes { SpannedHeadCheck.disagreement($0, limits: Flow.responseLimits) } == nil)
        guard case .complete = bytes.withUnsafeBytes({ HTTP1Parser.parseResponseHeadSpans($0, limits: Flow.responseLimits) })
        else {
            Issue.record("does not parse")
            return
        }
    }

    /// The check itself must see a difference: a relay that kept a hop-by-hop line would differ from the reference.
    @Test func theCheckSeesADroppedRule() {
        let bytes = Array("HTTP/1.1 200 OK\r\nKeep-Alive: timeout=5\r\nContent-Length: 3\r\n\r\n".utf8)
        bytes.withUnsafeBytes { p in
            guard case .complete(let spans, _) = HTTP1Parser.parseResponseHeadSpans(p, limits: Flow.responseLimits),
                  case .complete(let head, _) = HTTP1Parser.parseResponseHead(p, limits: Flow.responseLimits) else {
                Issue.record("does not parse")
                return
            }
            let reference = MessageHeads.relayedResponse(head, keepAlive: true, clientVersion: .http11, stripTransferEncoding: false,
                                                         variant: nil, framing: .contentLength(3))
            let fromBytes = MessageHeads.relayedResponse(spans, in: p, keepAlive: true, clientVersion: .http11,
                                                         stripTransferEncoding: false, framing: .contentLength(3),
                                                         connectionTokens: head.connectionTokens)
            #expect(fromBytes == reference)
            #expect(!String(decoding: fromBytes, as: UTF8.self).contains("Keep-Alive"))
            #expect(String(decoding: fromBytes, as: UTF8.self).contains("Content-Length: 3\r\n"))
        }
    }
}
