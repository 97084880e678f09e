import CLibevent
@testable import DatamodeEngine
import DatamodeHTTP
import DatamodeTestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// The engine parses heads and chunk lines in place, in an evbuffer's chains as bytes arrive (`FrontParse`,
/// `BodyRelay`), never on the whole message at once. STYLE: "a fast path keeps the reference path's bounds, proven
/// by a differential test": here the in-place paths and the reference parsers (`HTTP1Parser`, `ChunkedDecoder` on
/// the whole contiguous message) run on the same random and mutated input, the in-place one fed in random
/// pieces (each its own chain, or appended into the last one), with random backpressure budgets. They must reach
/// the same verdict, at the same byte, with the same head or the same chunk data. A disagreement is a message
/// the proxy frames depending on how it arrived: the smuggling class.
///
/// Seeded: `DATAMODE_PARSER_SEED=<n>` replays a run; without it each run picks a seed and prints it.
@Suite struct InPlaceParsingDifferentialTests {
    static let seed = SeededGenerator.seed(from: "DATAMODE_PARSER_SEED")

    // MARK: chunked bodies

    @Test func chunkedBodiesRelayedInPlaceMatchTheReferenceDecoder() {
        print("InPlaceParsingDifferentialTests chunked seed \(Self.seed) (DATAMODE_PARSER_SEED=\(Self.seed) replays it)")
        var rng = SeededGenerator(seed: Self.seed)
        var failures: [String] = []
        var outcomes: [String: Int] = [:]
        let cases = 5_000
        for n in 0..<cases {
            let wire = ChunkedWireGenerator.body(using: &rng)
            let reference = ReferenceChunked(wire)
            outcomes[reference.outcome.description, default: 0] += 1
            for strip in [false, true] {
                let pieces = ChunkedWireGenerator.pieces(wire.count, maxPieces: wire.count > 8192 ? 16 : 128, using: &rng)
                let inPlace = InPlaceChunked(wire, pieces: pieces, strip: strip, using: &rng)
                if let mismatch = inPlace.mismatch(with: reference, wire: wire, strip: strip) {
                    failures.append("case \(n) strip \(strip) pieces \(pieces.map(\.count)): \(mismatch)\n"
                                    + "  wire \(String(decoding: wire.prefix(300), as: UTF8.self).debugDescription)")
                }
            }
            if failures.count >= 5 { break }
        }
        #expect(failures.isEmpty, "seed \(Self.seed):\n\(failures.joined(separator: "\n"))")
        // Both verdicts must be common, or agreeing proves little.
        #expect(outcomes["complete", default: 0] > cases / 10 && outcomes["invalid", default: 0] > cases / 10, "\(outcomes)")
    }

    // MARK: heads

    static let smallLimits = HTTPLimits(requestLine: 64, headerSection: 256, headerCount: 8)

    @Test(arguments: [smallLimits, HTTPLimits()])
    func requestHeadsParsedInPlaceMatchTheReferenceParser(limits: HTTPLimits) {
        print("InPlaceParsingDifferentialTests request heads seed \(Self.seed)")
        var rng = SeededGenerator(seed: Self.seed ^ 0x6865_6164)
        let limit = limits.maxRequestHeadBytes
        var failures: [String] = []
        // Heads near the default 64 KiB limit cost more to parse at every arrival: fewer of them.
        for n in 0..<(limits == Self.smallLimits ? 3_000 : 600) {
            let wire = HeadGenerator.request(using: &rng, limits: limits)
            let reference = wire.withUnsafeBytes { HTTP1Parser.parseRequestHead($0, limits: limits) }
            let inPlace = Self.inPlace(wire, limit: limit, using: &rng) { HTTP1Parser.parseRequestHead($0, limits: limits) }
            if let mismatch = Self.mismatch(inPlace, reference) {
                failures.append("case \(n): \(mismatch)\n  wire \(String(decoding: wire.prefix(400), as: UTF8.self).debugDescription)")
                if failures.count >= 5 { break }
            }
        }
        #expect(failures.isEmpty, "seed \(Self.seed):\n\(failures.joined(separator: "\n"))")
    }

    @Test func responseHeadsParsedInPlaceMatchTheReferenceParser() {
        print("InPlaceParsingDifferentialTests response heads seed \(Self.seed)")
        var rng = SeededGenerator(seed: Self.seed ^ 0x7265_7370)
        var failures: [String] = []
        for n in 0..<3_000 {
            let wire = HeadGenerator.response(using: &rng)
            let reference = wire.withUnsafeBytes { HTTP1Parser.parseResponseHead($0, limits: Flow.responseLimits) }
            let inPlace = Self.inPlace(wire, limit: Flow.maxResponseHeadBytes, using: &rng) {
                HTTP1Parser.parseResponseHead($0, limits: Flow.responseLimits)
            }
            if let mismatch = Self.mismatch(inPlace, reference) {
                failures.append("case \(n): \(mismatch)\n  wire \(String(decoding: wire.prefix(400), as: UTF8.self).debugDescription)")
                if failures.count >= 5 { break }
            }
        }
        #expect(failures.isEmpty, "seed \(Self.seed):\n\(failures.joined(separator: "\n"))")
    }

    /// What the engine decides: after each arrival, one `FrontParse` attempt; the first result that is not
    /// `.incomplete` is final. An `.incomplete` with `limit` bytes or more buffered would wait for a head that can
    /// never complete (`FrontParse` never looks past `limit`).
    static func inPlace<H>(_ wire: [UInt8], limit: Int, using rng: inout SeededGenerator,
                           _ parse: (UnsafeRawBufferPointer) -> HeadParseResult<H>) -> (HeadParseResult<H>, stuck: Bool) {
        let buffer = ArrivingBuffer()
        // Heads of many KiB in fewer pieces (the engine reads 4 KiB at a time): each arrival parses from the start.
        for piece in ChunkedWireGenerator.pieces(wire.count, maxPieces: wire.count > 8192 ? 16 : 128, using: &rng) {
            buffer.arrive(wire[piece], ownChain: Bool.random(using: &rng))
            let result = FrontParse.parse(buffer.buffer, limit: limit, incomplete: .incomplete,
                                          isIncomplete: { if case .incomplete = $0 { true } else { false } }, parse)
            if case .incomplete = result {
                if evbuffer_get_length(buffer.buffer) >= limit { return (result, true) }
                continue
            }
            return (result, false)
        }
        return (.incomplete, false)
    }

    static func mismatch<H: Equatable>(_ inPlace: (HeadParseResult<H>, stuck: Bool), _ reference: HeadParseResult<H>) -> String? {
        if inPlace.stuck { return "in place: incomplete with the limit buffered; reference \(reference)" }
        switch (inPlace.0, reference) {
        case (.incomplete, .incomplete): return nil
        case (.complete(let a, let la), .complete(let b, let lb)) where a == b && la == lb: return nil
        case (.invalid(let a), .invalid(let b)) where a == b: return nil
        default: return "in place \(inPlace.0), reference \(reference)"
        }
    }
}

// MARK: - the two chunked paths

enum ChunkedOutcome: Equatable, CustomStringConvertible {
    case complete, needMore, invalid
    var description: String {
        switch self {
        case .complete: "complete"
        case .needMore: "needMore"
        case .invalid: "invalid"
        }
    }
}

/// `ChunkedDecoder` over the whole message, contiguous: where it ends or fails, the data, the declared sizes.
struct ReferenceChunked {
    var outcome = ChunkedOutcome.needMore
    /// Bytes taken (framing and data) before the end, the failure, or the lack of more bytes.
    var consumed = 0
    var payload: [UInt8] = []
    var sizes: [UInt64] = []
    /// What a relay that keeps the framing forwards: every byte taken, but a trailer section without the fields no
    /// trailer may carry on (`TrailerSection`); nil unless complete.
    var forwarded: [UInt8]?

    static func lastChunk(_ element: UnsafeRawBufferPointer, drops: Bool) -> [UInt8] {
        drops ? TrailerSection.withoutDroppedFields(element)!.element : Array(element)
    }

    init(_ wire: [UInt8]) {
        var decoder = ChunkedDecoder()
        wire.withUnsafeBytes { all in
            while consumed < wire.count {
                if decoder.dataRemaining > 0 {
                    let n = min(Int(clamping: decoder.dataRemaining), wire.count - consumed)
                    payload += wire[consumed..<(consumed + n)]
                    decoder.consumeData(n)
                    consumed += n
                    continue
                }
                switch decoder.parseFraming(UnsafeRawBufferPointer(rebasing: all[consumed...])) {
                case .needMore:
                    return
                case .framing(let length):
                    consumed += length
                    if decoder.dataRemaining > 0 { sizes.append(decoder.dataRemaining) }
                case .end(let length):
                    forwarded = Array(wire[..<consumed]) + Self.lastChunk(UnsafeRawBufferPointer(rebasing: all[consumed..<(consumed + length)]),
                                                                          drops: decoder.dropsTrailerFields)
                    consumed += length
                    outcome = .complete
                    return
                case .invalid:
                    outcome = .invalid
                    return
                }
            }
        }
    }
}

/// `BodyRelay` as the engine drives it: the message arrives piece by piece in an evbuffer, each arrival is pumped
/// with random budgets (backpressure) until nothing moves, into a destination evbuffer.
struct InPlaceChunked {
    var outcome = ChunkedOutcome.needMore
    var transferred: UInt64 = 0
    var delivered: [UInt8] = []
    /// Bytes that had arrived when the relay finished (all of them, unless it ended or failed before).
    var arrived = 0
    var left = 0

    init(_ wire: [UInt8], pieces: [Range<Int>], strip: Bool, using rng: inout SeededGenerator) {
        var relay = BodyRelay(framing: .chunked, stripChunkFraming: strip)
        let source = ArrivingBuffer()
        let destination = evbuffer_new()!
        defer { evbuffer_free(destination) }
        arrivals: for piece in pieces {
            source.arrive(wire[piece], ownChain: Bool.random(using: &rng))
            arrived = piece.upperBound
            while true {
                let before = relay.transferred
                let budget = [1, 2, 7, 64, 1 << 20].randomElement(using: &rng)!
                switch relay.pump(from: source.buffer, to: destination, budget: budget) {
                case .complete:
                    outcome = .complete
                    break arrivals
                case .invalid:
                    outcome = .invalid
                    break arrivals
                case .inProgress:
                    if relay.transferred == before { continue arrivals }
                }
            }
        }
        transferred = relay.transferred
        left = evbuffer_get_length(source.buffer)
        delivered = [UInt8](repeating: 0, count: evbuffer_get_length(destination))
        if !delivered.isEmpty {
            _ = delivered.withUnsafeMutableBytes { evbuffer_copyout(destination, $0.baseAddress, $0.count) }
        }
    }

    func mismatch(with reference: ReferenceChunked, wire: [UInt8], strip: Bool) -> String? {
        if outcome != reference.outcome { return "in place \(outcome), reference \(reference.outcome)" }
        if transferred != UInt64(reference.consumed) {
            return "\(outcome): in place took \(transferred) bytes, reference \(reference.consumed)"
        }
        if left != arrived - reference.consumed { return "\(outcome): in place left \(left) of \(arrived) bytes in the source" }
        // Framing passes verbatim but for dropped trailer fields, or (stripped, for an HTTP/1.0 client) only the
        // chunk data does.
        let expected = strip ? reference.payload : reference.forwarded ?? Array(wire[..<reference.consumed])
        if delivered != expected {
            return "\(outcome): in place delivered \(delivered.count) bytes, reference \(expected.count) (sizes \(reference.sizes))"
        }
        return nil
    }
}

/// An evbuffer filled the way a socket fills one: each arrival either appended into the last chain's free space
/// or added as a chain of its own (the worst case for in-place parsing: every element may span chains).
final class ArrivingBuffer {
    let buffer = evbuffer_new()!

    deinit { evbuffer_free(buffer) }

    func arrive(_ piece: ArraySlice<UInt8>, ownChain: Bool) {
        guard !piece.isEmpty else { return }
        piece.withUnsafeBytes { bytes in
            if ownChain {
                let copy = malloc(bytes.count)!
                copy.copyMemory(from: bytes.baseAddress!, byteCount: bytes.count)
                evbuffer_add_reference(buffer, copy, bytes.count, { data, _, _ in free(UnsafeMutableRawPointer(mutating: data)) }, nil)
            } else {
                evbuffer_add(buffer, bytes.baseAddress, bytes.count)
            }
        }
    }
}

// MARK: - heads

/// Request and response heads, well-formed before mutation, with the fields that decide framing and routing,
/// leading empty lines, long lines around the limits, and the next message's bytes behind them.
enum HeadGenerator {
    static let names = ["Host", "Content-Length", "Transfer-Encoding", "Connection", "X-A", "Accept", "Cookie", "TE", "Via"]
    static let values = ["example.test", "5", "chunked", "keep-alive", "close", "", "a b", "\"q\"", "0", "gzip, chunked", "+5"]

    static func fields(using rng: inout SeededGenerator, section: Int) -> [UInt8] {
        var text = ""
        for _ in 0..<[0, 1, 2, 3, 5, 9, 12].randomElement(using: &rng)! {
            let name = names.randomElement(using: &rng)!
            var value = values.randomElement(using: &rng)!
            if Int.random(in: 0..<10, using: &rng) == 0 {
                // Around the header section limit when a few of them add up.
                value = String(repeating: "v", count: Int.random(in: 1...(section / 3), using: &rng))
            }
            text += "\(name):\([" ", "", "\t", "  "].randomElement(using: &rng)!)\(value)\r\n"
        }
        return Array(text.utf8)
    }

    /// A head within a few bytes of every limit at once: the most leading empty lines, a request line of about
    /// `requestLine` bytes, a header section of about `headerSection` bytes. The in-place parse looks at no more
    /// than `HTTPLimits.maxRequestHeadBytes`, so this is where a wrong window would show.
    static func requestAtTheLimits(using rng: inout SeededGenerator, limits: HTTPLimits) -> [UInt8] {
        let empty = String(repeating: "\r\n", count: HTTP1Parser.maxLeadingEmptyLines + Int.random(in: -1...1, using: &rng))
        let fixed = "GET http://example.test/ HTTP/1.1".utf8.count
        let path = String(repeating: "p", count: max(0, limits.requestLine - fixed + Int.random(in: -2...1, using: &rng)))
        let line = "GET http://example.test/\(path) HTTP/1.1\r\n"
        let host = "Host: example.test\r\n"
        let fillFixed = host.utf8.count + "X-Fill: \r\n\r\n".utf8.count
        let fill = String(repeating: "v", count: max(0, limits.headerSection - fillFixed + Int.random(in: -2...1, using: &rng)))
        var wire = Array((empty + line + host + "X-Fill: \(fill)\r\n\r\n").utf8)
        ChunkedWireGenerator.mutate(&wire, count: [0, 0, 1].randomElement(using: &rng)!, using: &rng)
        return wire + Array("GET http://next.example/ HTTP/1.1\r\n".utf8)
    }

    static func request(using rng: inout SeededGenerator, limits: HTTPLimits) -> [UInt8] {
        if Int.random(in: 0..<8, using: &rng) == 0 { return requestAtTheLimits(using: &rng, limits: limits) }
        let method = ["GET", "POST", "PUT", "CONNECT", "OPTIONS", "HEAD", "G@T"].randomElement(using: &rng)!
        var target = ["http://example.test/", "http://example.test/a?b=c", "example.test:443", "*", "/origin-form",
                      "http://[::1]:8080/x"].randomElement(using: &rng)!
        if Int.random(in: 0..<8, using: &rng) == 0 {
            let long = limits.requestLine
            target += String(repeating: "p", count: Int.random(in: max(0, long - 40)...(long + 10), using: &rng))
        }
        let version = ["HTTP/1.1", "HTTP/1.1", "HTTP/1.0", "HTTP/2.0", "HTTP/1.10", "http/1.1"].randomElement(using: &rng)!
        var wire = Array(String(repeating: "\r\n", count: [0, 0, 0, 1, 8, 9].randomElement(using: &rng)!).utf8)
        wire += Array("\(method) \(target) \(version)\r\n".utf8) + fields(using: &rng, section: limits.headerSection) + Array("\r\n".utf8)
        ChunkedWireGenerator.mutate(&wire, count: [0, 0, 1, 1, 2, 3].randomElement(using: &rng)!, using: &rng)
        if Bool.random(using: &rng) { wire += Array("5\r\nhello\r\n0\r\n\r\nGET http://next.example/ HTTP/1.1\r\n".utf8) }
        return wire
    }

    /// A response head within a few bytes of the engine's response limits (`Flow.responseLimits`).
    static func responseAtTheLimits(using rng: inout SeededGenerator) -> [UInt8] {
        let limits = Flow.responseLimits
        let reason = String(repeating: "r", count: limits.requestLine - "HTTP/1.1 200 ".utf8.count + Int.random(in: -2...1, using: &rng))
        let fill = String(repeating: "v", count: limits.headerSection - "X-Fill: \r\n\r\n".utf8.count + Int.random(in: -2...1, using: &rng))
        var wire = Array("HTTP/1.1 200 \(reason)\r\nX-Fill: \(fill)\r\n\r\n".utf8)
        ChunkedWireGenerator.mutate(&wire, count: [0, 0, 1].randomElement(using: &rng)!, using: &rng)
        return wire + Array("body".utf8)
    }

    static func response(using rng: inout SeededGenerator) -> [UInt8] {
        if Int.random(in: 0..<100, using: &rng) == 0 { return responseAtTheLimits(using: &rng) }
        let status = ["200 OK", "204 No Content", "100 Continue", "101 Switching Protocols", "404 ", "20 OK", "999 x",
                      "200 \u{80}bc"].randomElement(using: &rng)!
        let version = ["HTTP/1.1", "HTTP/1.0", "HTTP/1.2", "HTTP/2"].randomElement(using: &rng)!
        var wire = Array("\(version) \(status)\r\n".utf8) + fields(using: &rng, section: 768) + Array("\r\n".utf8)
        ChunkedWireGenerator.mutate(&wire, count: [0, 0, 1, 1, 2, 3].randomElement(using: &rng)!, using: &rng)
        if Bool.random(using: &rng) { wire += Array("hello, body".utf8) }
        return wire
    }
}
