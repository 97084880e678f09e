@testable import DatamodeHTTP
import DatamodeTestSupport
import Testing

/// The parser's fast paths for a head's strings and names, against their references: `CommonSpellings.string` and
/// `.value` (a literal for a known spelling) against `ASCII.string` (the String built from the bytes), and
/// `FieldSection.nameEnd` (out of line) against `ByteClass.isTchar` byte by byte. On every known spelling and on
/// random mutations of them (a byte changed, cut short, made longer, a letter's case flipped, random bytes), at
/// random places inside larger buffers: a disagreement would hand the proxy a name or value other than the one sent.
///
/// Seeded: `DATAMODE_PARSER_SEED=<n>` replays a run; without it each run picks a seed and prints it.
@Suite struct CommonSpellingsDifferentialTests {
    static let seed = SeededGenerator.seed(from: "DATAMODE_PARSER_SEED")

    @Test func everyKnownSpellingIsItsOwnLiteral() {
        for word in CommonSpellings.words {
            let bytes = Array(word.utf8)
            bytes.withUnsafeBytes { p in
                #expect(CommonSpellings.string(p, 0, p.count) == word)
                if p.count <= CommonSpellings.maxValueLookup { #expect(CommonSpellings.value(p, 0, p.count) == word) }
            }
        }
    }

    @Test func lookUpsAgreeWithBuildingTheString() {
        print("CommonSpellingsDifferentialTests seed \(Self.seed) (DATAMODE_PARSER_SEED=\(Self.seed) replays it)")
        var rng = SeededGenerator(seed: Self.seed)
        var failures: [String] = []
        var hits = 0
        for _ in 0..<100_000 {
            var bytes = Array(CommonSpellings.words.randomElement(using: &rng)!.utf8)
            switch Int.random(in: 0..<6, using: &rng) {
            case 0: break
            case 1: bytes[Int.random(in: 0..<bytes.count, using: &rng)] = UInt8.random(in: 0...255, using: &rng)
            case 2: bytes.removeLast(Int.random(in: 0...bytes.count, using: &rng))
            case 3: bytes += (0..<Int.random(in: 1...3, using: &rng)).map { _ in UInt8.random(in: 0x21...0x7E, using: &rng) }
            case 4:
                let k = Int.random(in: 0..<bytes.count, using: &rng)
                if (0x41...0x5A).contains(bytes[k]) || (0x61...0x7A).contains(bytes[k]) { bytes[k] ^= 0x20 }
            default: bytes = (0..<Int.random(in: 0...40, using: &rng)).map { _ in UInt8.random(in: 0...255, using: &rng) }
            }
            // Somewhere inside a larger buffer, as the parser sees a name or a value.
            let before = (0..<Int.random(in: 0...9, using: &rng)).map { _ in UInt8.random(in: 0...255, using: &rng) }
            let after = (0..<Int.random(in: 0...9, using: &rng)).map { _ in UInt8.random(in: 0...255, using: &rng) }
            let buffer = before + bytes + after
            let (from, to) = (before.count, before.count + bytes.count)
            buffer.withUnsafeBytes { p in
                let reference = ASCII.string(p, from, to)
                let name = CommonSpellings.string(p, from, to)
                let value = CommonSpellings.value(p, from, to)
                if name != reference || value != reference {
                    failures.append("\(bytes): string \(name), value \(value), reference \(reference)")
                }
                if CommonSpellings.words.contains(reference) { hits += 1 }
            }
            if failures.count >= 5 { break }
        }
        #expect(failures.isEmpty, "seed \(Self.seed):\n\(failures.joined(separator: "\n"))")
        #expect(hits > 20_000 && hits < 90_000, "known spellings among the inputs: \(hits)")
    }

    @Test func theNameScanAgreesWithTheByteTest() {
        var rng = SeededGenerator(seed: Self.seed)
        var failures: [String] = []
        for _ in 0..<50_000 {
            var bytes = Array(CommonSpellings.words.randomElement(using: &rng)!.utf8)
            for _ in 0..<Int.random(in: 0...2, using: &rng) {
                bytes[Int.random(in: 0..<bytes.count, using: &rng)] = UInt8.random(in: 0...255, using: &rng)
            }
            bytes += [0x3A, 0x20, 0x31]
            let start = Int.random(in: 0...bytes.count, using: &rng)
            let to = Int.random(in: start...bytes.count, using: &rng)
            var reference = start
            while reference < to && ByteClass.isTchar(bytes[reference]) { reference += 1 }
            let fast = bytes.withUnsafeBytes { FieldSection.nameEnd($0, from: start, to: to) }
            if fast != reference { failures.append("\(bytes) from \(start) to \(to): \(fast), reference \(reference)") }
            if failures.count >= 5 { break }
        }
        #expect(failures.isEmpty, "seed \(Self.seed):\n\(failures.joined(separator: "\n"))")
    }
}
