@testable import DatamodeHTTP
import DatamodeTestSupport
import Testing

/// `FieldBytes` is what the HTTP/2 codec and the head handoff check fields with: the value check is the parser's
/// word-at-a-time scan, the reference its byte-by-byte rule (`checkValueByteByByte`, the codec's own loop before it
/// shared the parser's). Random values with the bytes that must stop a value (controls, DEL, HTAB and SP at the
/// ends, obs-text) at every place and length; every byte value for the token classes against RFC 9110's list.
///
/// Seeded: `DATAMODE_PARSER_SEED=<n>` replays a run; without it each run picks a seed and prints it.
@Suite struct FieldBytesDifferentialTests {
    static let seed = SeededGenerator.seed(from: "DATAMODE_PARSER_SEED")

    static let stoppers: [UInt8] = [0x00, 0x01, 0x09, 0x0A, 0x0D, 0x1F, 0x20, 0x7E, 0x7F, 0x80, 0xC3, 0xA9, 0xFF]

    @Test func theValueCheckAgreesWithTheByteRule() {
        print("FieldBytesDifferentialTests seed \(Self.seed) (DATAMODE_PARSER_SEED=\(Self.seed) replays it)")
        var rng = SeededGenerator(seed: Self.seed)
        var failures: [String] = []
        var refused = 0
        for _ in 0..<50_000 {
            let count = Int.random(in: 0...70, using: &rng)
            var bytes = (0..<count).map { _ in UInt8.random(in: 0x20...0x7E, using: &rng) }
            for _ in 0..<Int.random(in: 0...2, using: &rng) where !bytes.isEmpty {
                bytes[Int.random(in: 0..<bytes.count, using: &rng)] = Bool.random(using: &rng)
                    ? UInt8.random(in: 0...255, using: &rng) : Self.stoppers.randomElement(using: &rng)!
            }
            let (fast, reference) = bytes.withUnsafeBytes {
                (FieldBytes.checkValue($0), FieldBytes.checkValueByteByByte($0))
            }
            if reference == nil { refused += 1 }
            if fast != reference {
                failures.append("\(bytes): checkValue \(String(describing: fast)), byte rule \(String(describing: reference))")
                if failures.count >= 5 { break }
            }
        }
        #expect(failures.isEmpty, "seed \(Self.seed): \(failures.joined(separator: "\n"))")
        // Both answers occur often: the run is not all one kind.
        #expect(refused > 5_000 && refused < 45_000, "refused \(refused) of 50,000")
    }

    @Test func theTokenClassesAreRFC9110s() {
        let tchar = Set("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ".utf8)
        for b in UInt8.min...UInt8.max {
            let isUpper = b >= UInt8(ascii: "A") && b <= UInt8(ascii: "Z")
            #expect(FieldBytes.isTchar(b) == tchar.contains(b), "byte \(b)")
            #expect(FieldBytes.isLowercaseTchar(b) == (tchar.contains(b) && !isUpper), "byte \(b)")
            [b].withUnsafeBytes {
                #expect(FieldBytes.hasUppercase($0) == isUpper, "byte \(b)")
                #expect(FieldBytes.isToken($0) == tchar.contains(b), "byte \(b)")
                #expect(FieldBytes.isLowercaseToken($0) == (tchar.contains(b) && !isUpper), "byte \(b)")
            }
        }
        [UInt8]().withUnsafeBytes {
            #expect(!FieldBytes.isToken($0) && !FieldBytes.isLowercaseToken($0) && !FieldBytes.hasUppercase($0))
        }
    }
}
