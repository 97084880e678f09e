@testable import DatamodeHTTP2
import DatamodeTestSupport
import Testing

/// `StreamTable` against the model it replaces, `Dictionary`: random runs of inserts, lookups, in-place changes and
/// removals, with ids as peers open them (increasing, odd or even) and as a fuzzer would (any positive id, many
/// colliding in a small table), after every step the same answer for every id touched and the same contents.
/// Backward-shift deletion is where an open-addressing table goes wrong (a key left unreachable behind a freed
/// slot, or found twice): the removals here run at every fill level and across the table's wrap-around.
///
/// Seeded: `DATAMODE_MODEL_SEED=<n>` replays a run; without it each run picks a seed and prints it.
@Suite struct StreamTableModelTests {
    static let seed = SeededGenerator.seed(from: "DATAMODE_MODEL_SEED")

    /// A value with a copy-on-write buffer, changed in place as the codecs change theirs (`table[id]!.x = y`).
    struct Entry: Equatable {
        var bytes: [UInt8]
        var flag: Bool
    }

    @Test func theTableAnswersAsADictionaryWould() {
        print("StreamTableModelTests seed \(Self.seed) (DATAMODE_MODEL_SEED=\(Self.seed) replays it)")
        var rng = SeededGenerator(seed: Self.seed)
        var failures: [String] = []
        for run in 0..<400 where failures.isEmpty {
            var table = StreamTable<Entry>()
            var model: [HTTP2StreamID: Entry] = [:]
            var nextID: HTTP2StreamID = Bool.random(using: &rng) ? 1 : 2
            // Small id spaces collide constantly; peers' ids increase by two.
            let space = [HTTP2StreamID(40), 300, Int32.max][Int.random(in: 0..<3, using: &rng)]
            for step in 0..<Int.random(in: 1...600, using: &rng) {
                let id: HTTP2StreamID
                if space != Int32.max && Int.random(in: 0..<3, using: &rng) > 0 {
                    id = HTTP2StreamID.random(in: 1...space, using: &rng)
                } else if !model.isEmpty && Bool.random(using: &rng) {
                    id = model.keys.randomElement(using: &rng)!
                } else {
                    id = nextID
                    nextID = nextID < Int32.max - 2 ? nextID + 2 : nextID
                }
                switch Int.random(in: 0..<10, using: &rng) {
                case 0..<4:
                    let entry = Entry(bytes: [UInt8.random(in: 0...255, using: &rng)], flag: false)
                    table[id] = entry
                    model[id] = entry
                case 4..<6:
                    let removed = table.removeValue(forKey: id)
                    let expected = model.removeValue(forKey: id)
                    if removed != expected { failures.append("run \(run) step \(step): removing \(id) gave \(String(describing: removed)), expected \(String(describing: expected))") }
                case 6:
                    table[id] = nil
                    model[id] = nil
                case 7..<9:
                    if table[id] != nil { table[id]!.bytes.append(7); table[id]!.flag.toggle() }
                    if model[id] != nil { model[id]!.bytes.append(7); model[id]!.flag.toggle() }
                default:
                    if table[id] != model[id] { failures.append("run \(run) step \(step): \(id) is \(String(describing: table[id])), expected \(String(describing: model[id]))") }
                }
                if table.count != model.count {
                    failures.append("run \(run) step \(step): count \(table.count), expected \(model.count)")
                }
                if failures.count >= 5 { break }
            }
            // Every key the model holds is found, and the table holds nothing else.
            for (id, entry) in model where table[id] != entry {
                failures.append("run \(run): \(id) is \(String(describing: table[id])) at the end, expected \(entry)")
            }
            if Set(table.ids) != Set(model.keys) || table.ids.count != model.count {
                failures.append("run \(run): ids \(table.ids.sorted()), expected \(model.keys.sorted())")
            }
            if table.allValues.count != model.count || table.isEmpty != model.isEmpty {
                failures.append("run \(run): \(table.allValues.count) values, expected \(model.count)")
            }
        }
        #expect(failures.isEmpty, "seed \(Self.seed): \(failures.prefix(5).joined(separator: "\n"))")
    }

    /// A value changed in place is not copied: its buffer stays unique (no quadratic copies of a queued body).
    @Test func aValueChangedInPlaceIsNotCopied() {
        var table = StreamTable<Entry>()
        table[1] = Entry(bytes: [], flag: false)
        table[1]!.bytes.reserveCapacity(1024)
        let before = table[1]!.bytes.withUnsafeBufferPointer { $0.baseAddress }
        for _ in 0..<1000 { table[1]!.bytes.append(1) }
        let after = table[1]!.bytes.withUnsafeBufferPointer { $0.baseAddress }
        #expect(before == after)
        #expect(table[1]!.bytes.count == 1000)
    }
}
