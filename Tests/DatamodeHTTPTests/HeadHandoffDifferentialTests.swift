import DatamodeHTTP
import DatamodeTestSupport
import Testing

/// `HeadHandoff` lets a head skip its HTTP/1.1 text between two parts of the engine. The reference is the text: the
/// head written as bytes (by hand here, so that invalid bytes are written as they are) and read back by
/// `HTTP1Parser` with the reader's limits. Whenever the handoff accepts a head, the parser must give back that same
/// head from the text, with the length the handoff said; a head the handoff refuses goes as text, so refusing is
/// always safe, but it must stay rare for valid heads or the fast path proves nothing.
///
/// Seeded: `DATAMODE_PARSER_SEED=<n>` replays a run; without it each run picks a seed and prints it.
@Suite struct HeadHandoffDifferentialTests {
    static let seed = SeededGenerator.seed(from: "DATAMODE_PARSER_SEED")

    static let names = ["content-type", "Content-Length", "x-a", "Set-Cookie", "via", "ETag", "a", "!#$%&'*+-.^_`|~",
                        "data-mode-variant", "Cache-Control"]
    static let values = ["text/html", "5", "", "a b", "\"etag\"", "é", "max-age=60, public", "x\ty", "1.1 datamode-proxy",
                         String(repeating: "v", count: 300)]
    /// Bytes that end, break or get trimmed from a field or a line.
    static let junk = ["\r", "\n", "\r\n", "\0", " ", "\t", ":", "\u{7f}", "\u{1}", "(", "é", "\u{85}", ""]

    static func mutated(_ s: String, using rng: inout SeededGenerator) -> String {
        rng.mutated(s, junk: junk, odds: 8)
    }

    static func fields(using rng: inout SeededGenerator) -> [HTTPField] {
        // Now and then more fields than the limits below allow.
        let count = Int.random(in: 0..<10, using: &rng) == 0 ? Int.random(in: 0...40, using: &rng)
                                                              : Int.random(in: 0...8, using: &rng)
        return (0..<count).map { _ in
            HTTPField(name: mutated(names.randomElement(using: &rng)!, using: &rng),
                      value: mutated(values.randomElement(using: &rng)!, using: &rng))
        }
    }

    static func limits(using rng: inout SeededGenerator) -> (HTTPLimits, Int) {
        if Bool.random(using: &rng) { return (HTTPLimits(requestLine: 8 * 1024, headerSection: 128 * 1024, headerCount: 300), 140_000) }
        return (HTTPLimits(requestLine: Int.random(in: 10...120, using: &rng), headerSection: Int.random(in: 2...600, using: &rng),
                           headerCount: Int.random(in: 0...20, using: &rng)),
                Int.random(in: 20...800, using: &rng))
    }

    /// The text, written without checking anything (`HeadWriter` asserts valid input).
    static func text(_ start: String, _ fields: [HTTPField]) -> [UInt8] {
        var bytes = Array((start + "\r\n").utf8)
        for field in fields { bytes += Array((field.name + ": " + field.value + "\r\n").utf8) }
        return bytes + [13, 10]
    }

    /// The reader's view: a parse of at most `maxHeadBytes` (the engine's `FrontParse` window).
    static func read<H>(_ bytes: [UInt8], _ maxHeadBytes: Int, _ parse: (UnsafeRawBufferPointer) -> HeadParseResult<H>)
        -> HeadParseResult<H> {
        bytes.withUnsafeBytes { parse(UnsafeRawBufferPointer(rebasing: $0.prefix(maxHeadBytes))) }
    }

    /// Runs `cases` heads from `make` through the handoff and the parser; returns the failures and how many heads were
    /// handed and how many the parser read back unchanged but the handoff sent as text (with the wide limits).
    static func compare<H: Equatable>(cases: Int, using rng: inout SeededGenerator,
                                      _ make: (inout SeededGenerator) -> (head: H, text: [UInt8], limits: HTTPLimits, max: Int),
                                      handoff: (H, HTTPLimits, Int) -> Int?,
                                      parse: (UnsafeRawBufferPointer, HTTPLimits) -> HeadParseResult<H>)
        -> (failures: [String], handed: Int, validAsText: Int) {
        var failures: [String] = []
        var handed = 0, validAsText = 0
        for _ in 0..<cases {
            let (head, text, limits, maxHeadBytes) = make(&rng)
            let parsed = read(text, maxHeadBytes) { parse($0, limits) }
            if let length = handoff(head, limits, maxHeadBytes) {
                handed += 1
                guard case .complete(let back, let parsedLength) = parsed, back == head, parsedLength == length else {
                    failures.append("\(head) limits \(limits) max \(maxHeadBytes): handed with \(length), parsed \(Verdict(parsed))")
                    if failures.count >= 5 { break }
                    continue
                }
            } else if case .complete(let back, _) = parsed, back == head, limits.headerCount >= 300 {
                validAsText += 1
            }
        }
        return (failures, handed, validAsText)
    }

    @Test func aHandedResponseHeadIsWhatTheParserReadsFromItsText() {
        print("HeadHandoffDifferentialTests seed \(Self.seed) (DATAMODE_PARSER_SEED=\(Self.seed) replays it)")
        var rng = SeededGenerator(seed: Self.seed)
        let cases = 20_000
        let (failures, handed, validAsText) = Self.compare(cases: cases, using: &rng, { rng in
            let status = [100, 103, 200, 204, 304, 404, 502, 999, 99, 1000].randomElement(using: &rng)!
            let reason = Self.mutated(["OK", "", "Not Found", " spaced ", "Bad Gateway"].randomElement(using: &rng)!, using: &rng)
            let minor = UInt8([1, 1, 1, 0, 9].randomElement(using: &rng)!)
            let head = ResponseHead(version: HTTPVersion(major: 1, minor: minor), status: status, reason: reason,
                                    fields: Self.fields(using: &rng))
            let (limits, maxHeadBytes) = Self.limits(using: &rng)
            return (head, Self.text("HTTP/1.\(minor) \(status) \(reason)", head.fields), limits, maxHeadBytes)
        }, handoff: { HeadHandoff.response($0, limits: $1, maxHeadBytes: $2) },
           parse: { HTTP1Parser.parseResponseHead($0, limits: $1) })
        #expect(failures.isEmpty, "seed \(Self.seed):\n\(failures.joined(separator: "\n"))")
        #expect(handed > cases / 10, "handed \(handed) of \(cases)")
        #expect(validAsText == 0, "\(validAsText) heads the parser reads back unchanged went as text")
    }

    @Test func aHandedRequestHeadIsWhatTheParserReadsFromItsText() {
        var rng = SeededGenerator(seed: Self.seed &+ 1)
        let cases = 20_000
        let (failures, handed, validAsText) = Self.compare(cases: cases, using: &rng, { rng in
            let method = Self.mutated(["GET", "POST", "HEAD", "M-SEARCH", "get", ""].randomElement(using: &rng)!, using: &rng)
            let target = Self.mutated(["/", "/a?b=c", "http://example.com/x", "example.com:443", "*", "/%20"].randomElement(using: &rng)!,
                                      using: &rng)
            let version = [HTTPVersion.http11, .http11, .http10, HTTPVersion(major: 2, minor: 0)].randomElement(using: &rng)!
            let head = RequestHead(method: method, target: target, version: version, fields: Self.fields(using: &rng))
            let (limits, maxHeadBytes) = Self.limits(using: &rng)
            return (head, Self.text("\(method) \(target) HTTP/\(version.major).\(version.minor)", head.fields), limits, maxHeadBytes)
        }, handoff: { HeadHandoff.request($0, limits: $1, maxHeadBytes: $2) },
           parse: { HTTP1Parser.parseRequestHead($0, limits: $1) })
        #expect(failures.isEmpty, "seed \(Self.seed &+ 1):\n\(failures.joined(separator: "\n"))")
        #expect(handed > cases / 10, "handed \(handed) of \(cases)")
        #expect(validAsText == 0, "\(validAsText) heads the parser reads back unchanged went as text")
    }
}
