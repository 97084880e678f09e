@testable import DatamodeEngine
import Testing

/// The per-worker memory of relayed lengths behind `datamode_bytes_saved_total{kind="variant"|"rejected"}`:
/// bounded, and a saving is counted only when the original was larger.
@Suite struct KnownLengthsTests {
    @Test func aRecordIsFoundAndAnUpdateReplacesIt() {
        var lengths = KnownLengths(capacity: 4096, seed: 42)  // a and b in different slots under this seed
        #expect(lengths["http://o/a"] == nil)
        lengths.record("http://o/a", length: 10)
        lengths.record("http://o/b", length: 20)
        lengths.record("http://o/a", length: 11)  // an update, not a new entry
        #expect(lengths["http://o/a"] == 11)
        #expect(lengths["http://o/b"] == 20)
        #expect(lengths["http://o/c"] == nil)
    }

    /// Model: a dictionary of the last length of each URL. The table never answers a length the model does not hold
    /// for that URL, holds at most `capacity` URLs, and always holds the URL recorded last.
    @Test func itIsBoundedAndNeverAnswersAWrongLength() {
        var lengths = KnownLengths(capacity: 64, seed: 0x1234_5678_9ABC_DEF1)
        var model: [String: UInt64] = [:]
        var generator = SystemRandomNumberGenerator()
        for step in 0..<5_000 {
            let url = "http://origin.example/\(UInt64.random(in: 0..<400, using: &generator))/" + String(repeating: "x", count: step % 37)
            let length = UInt64.random(in: 0..<1_000_000, using: &generator)
            lengths.record(url, length: length)
            model[url] = length
            #expect(lengths[url] == length)
        }
        var held = 0
        for (url, length) in model {
            guard let found = lengths[url] else { continue }
            #expect(found == length)
            held += 1
        }
        #expect(lengths.capacity == 64 && held <= 64 && held > 0)
    }

    @Test func fingerprintsDependOnEveryByteAndTheSeed() {
        let a = KnownLengths(capacity: 8, seed: 1), b = KnownLengths(capacity: 8, seed: 2)
        let url = "http://o/abcdefghijklmnop"
        #expect(a.fingerprint(url) != b.fingerprint(url))
        var seen = Set<UInt64>()
        for cut in 0...url.utf8.count { seen.insert(a.fingerprint(String(url.prefix(cut)))) }
        for i in url.indices {
            var changed = url
            changed.replaceSubrange(i...i, with: "~")
            seen.insert(a.fingerprint(changed))
        }
        #expect(seen.count == 2 * url.count + 1)
        #expect(!seen.contains(0))
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
