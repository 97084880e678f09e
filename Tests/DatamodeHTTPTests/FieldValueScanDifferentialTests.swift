@testable import DatamodeHTTP
import DatamodeTestSupport
import Testing

/// `FieldSection.valueEnd` scans a field value eight bytes at a time while they are printable ASCII; the reference
/// is the byte-by-byte scan it falls back to (`valueEndByteByByte`). Both run on random values with the bytes that
/// stop a scan (controls, HTAB, DEL, obs-text, CR, LF, NUL) at random places, at every alignment and bound: a
/// disagreement would let a refused byte into a value, or end a value early.
///
/// Seeded: `DATAMODE_PARSER_SEED=<n>` replays a run; without it each run picks a seed and prints it.
@Suite struct FieldValueScanDifferentialTests {
    static let seed = SeededGenerator.seed(from: "DATAMODE_PARSER_SEED")

    static let stoppers: [UInt8] = [0x00, 0x01, 0x09, 0x0A, 0x0D, 0x1F, 0x20, 0x7E, 0x7F, 0x80, 0xC3, 0xA9, 0xFF]

    @Test func theWordScanAgreesWithTheByteScan() {
        print("FieldValueScanDifferentialTests seed \(Self.seed) (DATAMODE_PARSER_SEED=\(Self.seed) replays it)")
        var rng = SeededGenerator(seed: Self.seed)
        var failures: [String] = []
        var fastWords = 0
        for _ in 0..<50_000 {
            let count = Int.random(in: 0...80, using: &rng)
            var bytes = (0..<count).map { _ in UInt8.random(in: 0x20...0x7E, using: &rng) }
            for _ in 0..<Int.random(in: 0...3, using: &rng) where !bytes.isEmpty {
                bytes[Int.random(in: 0..<bytes.count, using: &rng)] = Int.random(in: 0..<3, using: &rng) == 0
                    ? UInt8.random(in: 0...255, using: &rng) : Self.stoppers.randomElement(using: &rng)!
            }
            let start = bytes.isEmpty ? 0 : Int.random(in: 0...bytes.count, using: &rng)
            let to = Int.random(in: start...bytes.count, using: &rng)
            let (fast, reference) = bytes.withUnsafeBytes {
                (FieldSection.valueEnd($0, from: start, to: to), FieldSection.valueEndByteByByte($0, from: start, to: to))
            }
            if fast != reference {
                failures.append("\(bytes) from \(start) to \(to): word scan \(fast), byte scan \(reference)")
                if failures.count >= 5 { break }
            }
            if reference.end - start >= 8 { fastWords += 1 }
        }
        #expect(failures.isEmpty, "seed \(Self.seed):\n\(failures.joined(separator: "\n"))")
        #expect(fastWords > 10_000, "values long enough for the word scan: \(fastWords)")
    }

    /// Each byte value in each position of a word, alone among printable bytes.
    @Test func everyByteInEveryPositionOfAWord() {
        for byte in UInt8.min...UInt8.max {
            for position in 0..<16 {
                var bytes = [UInt8](repeating: 0x61, count: 16)
                bytes[position] = byte
                let (fast, reference) = bytes.withUnsafeBytes {
                    (FieldSection.valueEnd($0, from: 0, to: 16), FieldSection.valueEndByteByByte($0, from: 0, to: 16))
                }
                #expect(fast == reference, "byte \(byte) at \(position)")
            }
        }
    }
}
