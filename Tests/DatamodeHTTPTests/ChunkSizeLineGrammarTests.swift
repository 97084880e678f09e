import DatamodeHTTP
import DatamodeTestSupport
import Testing

/// `ChunkedDecoder` against the grammar it implements, written out a second time as plainly as possible:
/// `chunk-size [ chunk-ext ] CRLF` (RFC 9112 §7.1, §7.1.1) with SPEC §6's bound on the size. Every size line
/// the decoder reads differently from this grammar is a line that some other parser may frame differently
/// (the chunk-size smuggling family), so the two must agree on every random and mutated line.
///
/// Seeded: `DATAMODE_PARSER_SEED=<n>` replays a run; without it each run picks a seed and prints it.
@Suite struct ChunkSizeLineGrammarTests {
    static let seed = SeededGenerator.seed(from: "DATAMODE_PARSER_SEED")
    static let lines = 20_000

    @Test func theDecoderReadsEverySizeLineAsTheGrammarDoes() {
        print("ChunkSizeLineGrammarTests seed \(Self.seed) (DATAMODE_PARSER_SEED=\(Self.seed) replays it)")
        var rng = SeededGenerator(seed: Self.seed)
        var failures: [String] = []
        var accepted = 0
        for n in 0..<Self.lines {
            let maxLineLength = [4096, 4096, 40, 24].randomElement(using: &rng)!
            let line = ChunkedWireGenerator.sizeLine(using: &rng)
            let input = line + Array("\r\n".utf8)
            let expected = SizeLineGrammar.verdict(input, maxLineLength: maxLineLength)
            let actual = SizeLineGrammar.decoderVerdict(input, maxLineLength: maxLineLength)
            if case .accept = expected { accepted += 1 }
            if expected != actual {
                failures.append("line \(n) \(String(decoding: line, as: UTF8.self).debugDescription) "
                                + "(max \(maxLineLength)): grammar \(expected), decoder \(actual)")
                if failures.count >= 8 { break }
            }
        }
        #expect(failures.isEmpty, "seed \(Self.seed):\n\(failures.joined(separator: "\n"))")
        // The generator must reach both sides of the grammar, or agreeing proves little.
        #expect(accepted > Self.lines / 5 && accepted < Self.lines * 4 / 5, "accepted \(accepted) of \(Self.lines)")
    }

    /// The oracle itself, on lines whose verdict is known.
    @Test func theGrammarOracleKnowsTheBound() {
        func verdict(_ s: String) -> SizeLineGrammar.Verdict { SizeLineGrammar.verdict(Array((s + "\r\n").utf8), maxLineLength: 4096) }
        #expect(verdict("0fffffffffffffff") == .accept(size: 0x0fff_ffff_ffff_ffff, length: 18))
        #expect(verdict("1000000000000000") == .refuse)
        #expect(verdict("ffffffffffffffff") == .refuse)
        #expect(verdict("00000000000000001") == .refuse)
        #expect(verdict("5 ; a = \"b\\\"\"") == .accept(size: 5, length: 15))
        #expect(verdict("5 ") == .refuse)
    }
}

/// RFC 9112 §7.1 with SPEC §6's bound, on a whole size line, independent of `ChunkedDecoder`:
///     chunk-size = 1*16HEXDIG, at most 0x0fffffffffffffff
///     chunk-ext  = *( BWS ";" BWS chunk-ext-name [ BWS "=" BWS chunk-ext-val ] )
///     chunk-ext-val = token / quoted-string
/// and at most `maxLineLength` bytes before the CRLF.
enum SizeLineGrammar {
    enum Verdict: Equatable, CustomStringConvertible {
        /// The line is `length` bytes with its CRLF and declares `size`.
        case accept(size: UInt64, length: Int)
        case refuse
        /// Only the decoder can say this (it must not, the line is complete).
        case needMore

        var description: String {
            switch self {
            case .accept(let size, let length): "accept(size 0x\(String(size, radix: 16)), \(length) bytes)"
            case .refuse: "refuse"
            case .needMore: "needMore"
            }
        }
    }

    static func isTchar(_ b: UInt8) -> Bool {
        (b >= 0x30 && b <= 0x39) || (b >= 0x41 && b <= 0x5A) || (b >= 0x61 && b <= 0x7A)
            || Array("!#$%&'*+-.^_`|~".utf8).contains(b)
    }

    static func hexDigit(_ b: UInt8) -> UInt64? {
        UInt64(String(decoding: [b], as: UTF8.self), radix: 16)
    }

    /// `input` ends with CRLF; the line is everything before the first CR or LF.
    static func verdict(_ input: [UInt8], maxLineLength: Int) -> Verdict {
        guard let end = input.firstIndex(where: { $0 == 0x0D || $0 == 0x0A }),
              input[end] == 0x0D, end + 1 < input.count, input[end + 1] == 0x0A else { return .refuse }
        let line = Array(input[..<end])
        guard line.count <= maxLineLength else { return .refuse }

        var i = 0
        var digits: [UInt64] = []
        while i < line.count, let d = hexDigit(line[i]) { digits.append(d); i += 1 }
        guard (1...16).contains(digits.count) else { return .refuse }
        let size = digits.reduce(0) { $0 * 16 + $1 }  // 16 digits at most: no overflow
        guard size <= 0x0fff_ffff_ffff_ffff else { return .refuse }

        func skipBWS() { while i < line.count && (line[i] == 0x20 || line[i] == 0x09) { i += 1 } }
        func token() -> Bool {
            let start = i
            while i < line.count && isTchar(line[i]) { i += 1 }
            return i > start
        }
        func quotedString() -> Bool {
            guard i < line.count, line[i] == 0x22 else { return false }
            i += 1
            while i < line.count {
                let c = line[i]
                if c == 0x22 { i += 1; return true }
                if c == 0x5C {
                    guard i + 1 < line.count else { return false }
                    let q = line[i + 1]
                    guard q == 0x09 || q == 0x20 || (q >= 0x21 && q <= 0x7E) || q >= 0x80 else { return false }
                    i += 2
                    continue
                }
                guard c == 0x09 || c == 0x20 || c == 0x21 || (c >= 0x23 && c <= 0x5B) || (c >= 0x5D && c <= 0x7E)
                        || c >= 0x80 else { return false }
                i += 1
            }
            return false
        }

        while i < line.count {
            skipBWS()
            guard i < line.count, line[i] == 0x3B else { return .refuse }
            i += 1
            skipBWS()
            guard token() else { return .refuse }
            let afterName = i
            skipBWS()
            if i < line.count && line[i] == 0x3D {
                i += 1
                skipBWS()
                guard quotedString() || token() else { return .refuse }
            } else {
                i = afterName
            }
        }
        return .accept(size: size, length: end + 2)
    }

    /// What `ChunkedDecoder` makes of the same line, given the bytes up to the end of the line and then an empty
    /// trailer section (so that a last-chunk is not judged together with trailers that are not the question).
    static func decoderVerdict(_ input: [UInt8], maxLineLength: Int) -> Verdict {
        let end = input.firstIndex(where: { $0 == 0x0D || $0 == 0x0A }) ?? input.count
        let visible = Array(input[..<min(end + 2, input.count)]) + [0x0D, 0x0A]
        var decoder = ChunkedDecoder(maxLineLength: maxLineLength)
        switch visible.withUnsafeBytes({ decoder.parseFraming($0) }) {
        case .framing(let length): return .accept(size: decoder.dataRemaining, length: length)
        // A last-chunk comes with its trailer section: here the empty one, 2 bytes.
        case .end(let length): return .accept(size: 0, length: length - 2)
        case .invalid: return .refuse
        case .needMore: return .needMore
        }
    }
}
