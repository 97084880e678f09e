import DatamodeHTTP
import Testing

/// Drives a decoder the way the engine does: bytes arrive in reads of the given sizes; framing is forwarded
/// verbatim; chunk data is moved by the caller (reported with consumeData).
struct ChunkedHarness {
    enum Outcome: Hashable, CustomStringConvertible {
        case complete
        case needMore
        case invalid
        var description: String {
            switch self {
            case .complete: "complete"
            case .needMore: "needMore"
            case .invalid: "invalid"
            }
        }
    }

    var body: [UInt8] = []
    var forwarded: [UInt8] = []
    var leftover: [UInt8] = []
    var outcome: Outcome = .needMore

    init(_ wire: [UInt8], reads: [Int], decoder: ChunkedDecoder = ChunkedDecoder()) {
        var decoder = decoder
        var buffer: [UInt8] = []
        var offset = 0
        var readIndex = 0
        func nextRead() -> Bool {
            guard offset < wire.count else { return false }
            let size = reads.isEmpty ? wire.count : max(1, reads[readIndex % reads.count])
            readIndex += 1
            let end = min(wire.count, offset + size)
            buffer += wire[offset..<end]
            offset = end
            return true
        }
        _ = nextRead()
        loop: while true {
            if decoder.dataRemaining > 0 {
                let n = min(Int(clamping: decoder.dataRemaining), buffer.count)
                if n > 0 {
                    body += buffer[0..<n]
                    forwarded += buffer[0..<n]
                    buffer.removeFirst(n)
                    decoder.consumeData(n)
                    continue
                }
            } else {
                let result = buffer.withUnsafeBytes { decoder.parseFraming($0) }
                switch result {
                case .framing(let length):
                    forwarded += buffer[0..<length]
                    buffer.removeFirst(length)
                    continue
                case .end(let length):
                    #expect(decoder.isComplete)
                    forwarded += buffer[0..<length]
                    buffer.removeFirst(length)
                    outcome = .complete
                    break loop
                case .invalid:
                    outcome = .invalid
                    break loop
                case .needMore:
                    break
                }
            }
            if !nextRead() {
                outcome = .needMore
                break
            }
        }
        leftover = buffer + wire[offset...]
    }
}

@Suite("Chunked transfer coding")
struct ChunkedDecoderTests {
    static let wire = Array((
        "5\r\nhello\r\n" +
        "1A;name=value ; quoted=\"a \\\"q\\\" b\";flag\r\nabcdefghijklmnopqrstuvwxyz\r\n" +
        "00000000000000010\r\n".dropFirst() + "0123456789abcdef\r\n" +
        "0;last=1\r\nTrailer-One: 1\r\nTrailer-Two: two \r\n\r\n" +
        "NEXT"
    ).utf8)
    static let body = Array("helloabcdefghijklmnopqrstuvwxyz0123456789abcdef".utf8)

    /// The same stream in reads of 1, 2, 3, 7, 64 bytes and all at once: the body comes out exactly,
    /// the forwarded bytes are exactly the wire bytes, and the next message is left untouched.
    @Test(arguments: [[1], [2], [3], [7], [64], [], [5, 1, 13, 2]])
    func decodesInPieces(_ reads: [Int]) {
        let h = ChunkedHarness(Self.wire, reads: reads)
        #expect(h.outcome == .complete)
        #expect(h.body == Self.body)
        #expect(h.forwarded == Array(Self.wire.dropLast(4)))
        #expect(h.leftover == Array("NEXT".utf8))
    }

    @Test func lastChunkAndEmptyTrailerInOneGo() {
        var d = ChunkedDecoder()
        let r = Array("0\r\n\r\nX".utf8).withUnsafeBytes { d.parseFraming($0) }
        #expect(r == .end(length: 5))
        #expect(d.isComplete)
    }

    /// The last-chunk line is handed out only with its whole trailer section, once that is known to be valid: were
    /// it passed on alone, a recipient would see the body end, or not, depending on how the bytes arrived.
    @Test func theLastChunkWaitsForItsTrailerSection() {
        var d = ChunkedDecoder()
        for partial in ["0\r\n", "0\r\n\r", "0;a=b\r\nX: 1\r\n", "0\r\nContent-Length: 5\r\n"] {
            #expect(Array(partial.utf8).withUnsafeBytes { d.parseFraming($0) } == .needMore, "\(partial.debugDescription)")
            #expect(!d.isComplete)
        }
        #expect(Array("0;a=b\r\nX: 1\r\n\r\nNEXT".utf8).withUnsafeBytes { d.parseFraming($0) } == .end(length: 15))
        #expect(d.isComplete)
    }

    /// A framing, routing or connection-specific field in the trailer section ends the body like any other; the
    /// decoder notes it for the caller, who forwards the element without it (`TrailerSection`). Refusing it cut a body
    /// that had already gone out (RFC 9110 §6.5.2 lets a recipient discard such fields).
    @Test func aTrailerFieldToDropEndsTheBodyAndIsNoted() {
        for (section, drops) in [("Content-Length: 5\r\n", true), ("Transfer-Encoding: chunked\r\n", true),
                                 ("X-Checksum: 1\r\nhost: a\r\n", true), ("TE: trailers\r\n", true),
                                 ("X-Checksum: 1\r\n", false), ("", false)] {
            var d = ChunkedDecoder()
            let element = "0\r\n" + section + "\r\n"
            #expect(Array(element.utf8).withUnsafeBytes { d.parseFraming($0) } == .end(length: element.utf8.count))
            #expect(d.isComplete && d.dropsTrailerFields == drops, "\(section.debugDescription)")
        }
    }

    @Test func sizeLineSetsDataRemaining() {
        var d = ChunkedDecoder()
        #expect(Array("fFfF\r\n".utf8).withUnsafeBytes { d.parseFraming($0) } == .framing(length: 6))
        #expect(d.dataRemaining == 0xFFFF)
        d.consumeData(0xFFFE)
        #expect(d.dataRemaining == 1)
        d.consumeData(1)
        #expect(Array("\r\n".utf8).withUnsafeBytes { d.parseFraming($0) } == .framing(length: 2))
    }

    /// SPEC §6: the bound is inclusive. 0x0fffffffffffffff cannot be sent for real, so only the size line is checked.
    @Test(arguments: ["0fffffffffffffff", "0FFFFFFFFFFFFFFF", "fffffffffffffff", "0000000000000001"])
    func theLargestAllowedChunkSizeIsAccepted(_ size: String) {
        var d = ChunkedDecoder()
        #expect(Array((size + "\r\n").utf8).withUnsafeBytes { d.parseFraming($0) } == .framing(length: size.utf8.count + 2))
        #expect(d.dataRemaining == UInt64(size, radix: 16))
        #expect(d.dataRemaining <= 0x0fff_ffff_ffff_ffff)
    }

    /// SPEC §6: a chunk size above 0x0fffffffffffffff is refused, as nginx and HAProxy refuse it. A recipient that
    /// keeps sizes in a signed 64-bit integer reads `8000000000000005` as negative and `ffffffffffffffff` as -1,
    /// one that wraps reads `10000000000000005` as 5: each frames the stream differently from us (smuggling).
    @Test(arguments: ["ffffffffffffffff", "FFFFFFFFFFFFFFFF", "8000000000000005", "8000000000000000",
                      "7fffffffffffffff", "1000000000000000", "1000000000000000;ext=1", "10000000000000000",
                      "10000000000000005", "00000000000000001", "fffffffffffffffff"])
    func aChunkSizeAboveTheBoundIsRefused(_ size: String) {
        for reads in [[], [1], [3]] {
            let h = ChunkedHarness(Array((size + "\r\nhello\r\n0\r\n\r\n").utf8), reads: reads)
            #expect(h.outcome == .invalid, "\(size), reads \(reads)")
            #expect(h.forwarded.isEmpty, "\(size), reads \(reads)")
        }
    }

    static let badStreams: [Row<String, ChunkedHarness.Outcome>] = [
        Row("size 0x5", "0x5\r\nhello\r\n0\r\n\r\n", .invalid),
        Row("size +5", "+5\r\nhello\r\n0\r\n\r\n", .invalid),
        Row("size -5", "-5\r\nhello\r\n0\r\n\r\n", .invalid),
        Row("size with leading space", " 5\r\nhello\r\n0\r\n\r\n", .invalid),
        Row("size with trailing space", "5 \r\nhello\r\n0\r\n\r\n", .invalid),
        Row("size with trailing tab", "5\t\r\nhello\r\n0\r\n\r\n", .invalid),
        Row("size g", "g\r\nhello\r\n0\r\n\r\n", .invalid),
        Row("size 5g", "5g\r\nhello\r\n0\r\n\r\n", .invalid),
        Row("empty size line", "\r\nhello\r\n0\r\n\r\n", .invalid),
        Row("17 hex digits", "00000000000000005\r\nhello\r\n0\r\n\r\n", .invalid),
        Row("17 hex digits overflow", "10000000000000000\r\n", .invalid),
        Row("bare LF after size", "5\nhello\r\n0\r\n\r\n", .invalid),
        Row("bare CR after size", "5\rhello\r\n0\r\n\r\n", .invalid),
        Row("missing CRLF after data", "5\r\nhelloX\r\n0\r\n\r\n", .invalid),
        Row("bare LF after data", "5\r\nhello\n0\r\n\r\n", .invalid),
        Row("bare CR after data", "5\r\nhello\r0\r\n\r\n", .invalid),
        Row("data longer than size", "3\r\nhello\r\n0\r\n\r\n", .invalid),
        Row("bare LF after last chunk", "0\n\r\n", .invalid),
        Row("bare LF ending trailers", "0\r\n\n", .invalid),
        Row("empty extension name", "5;\r\nhello\r\n0\r\n\r\n", .invalid),
        Row("extension with empty value", "5;a=\r\nhello\r\n0\r\n\r\n", .invalid),
        Row("extension trailing space", "5;a \r\nhello\r\n0\r\n\r\n", .invalid),
        Row("extension value trailing space", "5;a=b \r\nhello\r\n0\r\n\r\n", .invalid),
        Row("extension without ;", "5 a\r\nhello\r\n0\r\n\r\n", .invalid),
        Row("unterminated quoted extension", "5;a=\"b\r\nhello\r\n0\r\n\r\n", .invalid),
        Row("NUL in extension", "5;a\0\r\nhello\r\n0\r\n\r\n", .invalid),
        Row("trailer obs-fold", "0\r\nA: b\r\n c\r\n\r\n", .invalid),
        Row("trailer space before colon", "0\r\nA : b\r\n\r\n", .invalid),
        Row("trailer NUL", "0\r\nA: b\0\r\n\r\n", .invalid),
        Row("trailer empty name", "0\r\n: b\r\n\r\n", .invalid),
        Row("truncated stream", "5\r\nhel", .needMore),
        Row("truncated trailer", "0\r\nA: b\r\n", .needMore),
    ]

    @Test(arguments: badStreams)
    func refusesBadFraming(_ row: Row<String, ChunkedHarness.Outcome>) {
        for reads in [[], [1]] {
            let h = ChunkedHarness(Array(row.input.utf8), reads: reads)
            #expect(h.outcome == row.expected, "\(row.name), reads \(reads)")
        }
    }

    static let goodExtensions: [String] = [
        "5;a\r\n", "5;a=b\r\n", "5 ;a\r\n", "5\t;\ta\r\n", "5; a = b\r\n", "5;a=\"\"\r\n",
        "5;a=\"x\\\\y\"\r\n", "5;a;b;c=d\r\n", "5;a=\"; not an ext\"\r\n",
    ]

    @Test(arguments: goodExtensions)
    func acceptsChunkExtensions(_ line: String) {
        let h = ChunkedHarness(Array((line + "hello\r\n0\r\n\r\n").utf8), reads: [1])
        #expect(h.outcome == .complete)
        #expect(h.body == Array("hello".utf8))
    }

    @Test func sizeLineLengthLimit() {
        let limit = 32
        let exactly = "5;" + String(repeating: "e", count: limit - 2) + "\r\n"
        let over = "5;" + String(repeating: "e", count: limit - 1) + "\r\n"
        var d = ChunkedDecoder(maxLineLength: limit)
        #expect(Array(exactly.utf8).withUnsafeBytes { d.parseFraming($0) } == .framing(length: limit + 2))
        d = ChunkedDecoder(maxLineLength: limit)
        guard case .invalid = Array(over.utf8).withUnsafeBytes({ d.parseFraming($0) }) else {
            Issue.record("over-long size line accepted"); return
        }
        // Detected while the line is still incomplete.
        d = ChunkedDecoder(maxLineLength: limit)
        guard case .invalid = Array(over.utf8.prefix(limit + 1)).withUnsafeBytes({ d.parseFraming($0) }) else {
            Issue.record("over-long partial size line not refused"); return
        }
        d = ChunkedDecoder(maxLineLength: limit)
        #expect(Array(over.utf8.prefix(limit)).withUnsafeBytes { d.parseFraming($0) } == .needMore)
    }

    @Test func trailerSectionLimit() {
        let trailers = "A: " + String(repeating: "v", count: 20) + "\r\n\r\n"   // 27 bytes
        let atLimit = ChunkedHarness(Array(("0\r\n" + trailers).utf8), reads: [], decoder: ChunkedDecoder(maxTrailerSection: 27))
        #expect(atLimit.outcome == .complete)
        let over = ChunkedHarness(Array(("0\r\n" + trailers).utf8), reads: [], decoder: ChunkedDecoder(maxTrailerSection: 26))
        #expect(over.outcome == .invalid)
        // 25 of the 27 bytes, with a limit of 24: refused before the section is complete.
        let partial = Array(("0\r\n" + trailers).utf8).dropLast(2)
        let overPartial = ChunkedHarness(Array(partial), reads: [], decoder: ChunkedDecoder(maxTrailerSection: 24))
        #expect(overPartial.outcome == .invalid)
    }
}
