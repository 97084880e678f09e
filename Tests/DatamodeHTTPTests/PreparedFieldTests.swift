import DatamodeHTTP
import Testing

/// A `PreparedField` is copied into a head as bytes made once; they must be the line the String writer writes.
@Suite struct PreparedFieldTests {
    @Test func aPreparedLineIsTheWrittenLine() {
        let cases: [(StaticString, StaticString)] = [("Via", "1.1 datamode-proxy"), ("Allow-Constrained", "?0"),
                                                     ("Allow-Ultra-Constrained", "?1"), ("Save-Data", "on"), ("x", "")]
        for (name, value) in cases {
            var prepared = HeadWriter(capacity: 8)
            prepared.field(PreparedField(name, value))
            var written = HeadWriter(capacity: 8)
            written.field(name.description, value.description)
            #expect(prepared.take() == written.take(), "\(name)")
        }
    }
}
