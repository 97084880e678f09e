import DatamodeHTTP
import Testing

/// `HeadWriter.field(_:decimal:)` writes a number's digits without making its String: the line must be the one the
/// String would make, at every length of number.
@Suite struct HeadWriterDecimalTests {
    @Test func digitsAreTheStringsDigits() {
        var values: [UInt64] = [0, 1, 9, 10, 99, 100, 1024, 102_400, 999_999_999_999_999_999, UInt64.max, UInt64.max - 1]
        var power: UInt64 = 1
        while power <= UInt64.max / 10 {
            values += [power - 1, power, power + 1]
            power *= 10
        }
        var rng = SystemRandomNumberGenerator()
        for _ in 0..<1_000 { values.append(UInt64.random(in: 0...UInt64.max, using: &rng) >> UInt64.random(in: 0...63, using: &rng)) }
        for value in values {
            var byDigits = HeadWriter(capacity: 16)
            byDigits.field("Content-Length", decimal: value)
            var byString = HeadWriter(capacity: 16)
            byString.field("Content-Length", String(value))
            #expect(byDigits.take() == byString.take(), "\(value)")
        }
    }
}
