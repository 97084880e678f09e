@testable import DatamodeEngine
import Testing

/// The per-worker memory of relayed lengths behind `datamode_bytes_saved_total{kind="variant"|"rejected"}`:
/// bounded, and a saving is counted only when the original was larger.
@Suite struct KnownLengthsTests {
    @Test func itIsBoundedAndForgetsAtOnceWhenFull() {
        var lengths = KnownLengths(capacity: 2)
        lengths.record("http://o/a", length: 10)
        lengths.record("http://o/b", length: 20)
        lengths.record("http://o/a", length: 11)  // an update, not a new entry
        #expect(lengths["http://o/a"] == 11 && lengths["http://o/b"] == 20)
        lengths.record("http://o/c", length: 30)  // full: everything else is forgotten
        #expect(lengths["http://o/a"] == nil && lengths["http://o/b"] == nil && lengths["http://o/c"] == 30)
    }

    @Test func aSavingIsCountedOnlyWhenTheOriginalIsKnownAndLarger() {
        var lengths = KnownLengths()
        lengths.record("http://o/hero.jpg", length: 1_000)
        #expect(lengths.saving("http://o/hero.jpg", replacement: 100) == 900)
        #expect(lengths.saving("http://o/hero.jpg", replacement: 1_000) == nil)
        #expect(lengths.saving("http://o/hero.jpg", replacement: 5_000) == nil)
        #expect(lengths.saving("http://o/other.jpg", replacement: 1) == nil)
    }
}
