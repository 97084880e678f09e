import CLibevent
@testable import DatamodeEngine
import DatamodeTestSupport
import Testing

/// `RecordSizedChains`: a TLS client's response body leaves its source with a front chain of at least a full
/// record (when that much is there), every byte where it was.
@Suite struct RecordSizedChainsTests {
    static let seed = SeededGenerator.seed(from: "DATAMODE_PARSER_SEED")

    /// An evbuffer whose chains are exactly `pieces` (each added to a buffer of its own and moved over whole).
    static func buffer(of pieces: [[UInt8]]) -> OpaquePointer {
        let buffer = evbuffer_new()!
        for piece in pieces {
            let chain = evbuffer_new()!
            piece.withUnsafeBytes { _ = evbuffer_add(chain, $0.baseAddress, $0.count) }
            evbuffer_add_buffer(buffer, chain)
            evbuffer_free(chain)
        }
        return buffer
    }

    static func contents(_ buffer: OpaquePointer) -> [UInt8] {
        let length = evbuffer_get_length(buffer)
        var bytes = [UInt8](repeating: 0, count: length)
        bytes.withUnsafeMutableBytes { _ = evbuffer_copyout(buffer, $0.baseAddress, length) }
        return bytes
    }

    @Test func smallChainsAreJoinedUpToFourRecordsAndNoByteMoves() {
        print("RecordSizedChainsTests seed \(Self.seed) (DATAMODE_PARSER_SEED=\(Self.seed) replays it)")
        var rng = SeededGenerator(seed: Self.seed)
        var failures: [String] = []
        for round in 0..<500 where failures.count < 5 {
            // Chains as an h2 origin's DATA chunks leave them (a few bytes to past a record), and the odd large one.
            let count = Int.random(in: 1...24, using: &rng)
            // Each piece filled with a byte of its own and ended with its index: a piece lost, doubled or out of order
            // shows in the contents.
            let pieces: [[UInt8]] = (0..<count).map { index in
                let size = Bool.random(using: &rng) ? Int.random(in: 1...20_000, using: &rng)
                                                    : [1, 9, 8_192, 16_375, 16_384, 70_000].randomElement(using: &rng)!
                var piece = [UInt8](repeating: UInt8.random(in: 0...255, using: &rng), count: size)
                piece[size - 1] = UInt8(index)
                return piece
            }
            let buffer = Self.buffer(of: pieces)
            defer { evbuffer_free(buffer) }
            let front = evbuffer_get_contiguous_space(buffer)
            let before = Self.contents(buffer)
            RecordSizedChains.coalesce(buffer)
            let after = Self.contents(buffer)
            let joined = evbuffer_get_contiguous_space(buffer)
            let expected = front >= RecordSizedChains.recordPayload ? front : max(front, min(before.count, RecordSizedChains.most))
            if after != before { failures.append("round \(round): bytes changed (\(pieces.map(\.count)))") }
            if joined != expected {
                failures.append("round \(round): front chain \(joined), expected \(expected) (\(pieces.map(\.count)))")
            }
        }
        #expect(failures.isEmpty, "\(failures)")
    }

    @Test func aFullRecordAtTheFrontOrNothingBehindItIsLeftAsItIs() {
        let full = Self.buffer(of: [[UInt8](repeating: 1, count: 16_384), [2, 3], [4]])
        defer { evbuffer_free(full) }
        RecordSizedChains.coalesce(full)
        #expect(evbuffer_get_contiguous_space(full) == 16_384, "a full record needs no copy")

        let alone = Self.buffer(of: [[UInt8](repeating: 5, count: 100)])
        defer { evbuffer_free(alone) }
        RecordSizedChains.coalesce(alone)
        #expect(evbuffer_get_contiguous_space(alone) == 100)

        let empty = evbuffer_new()!
        defer { evbuffer_free(empty) }
        RecordSizedChains.coalesce(empty)
        #expect(evbuffer_get_length(empty) == 0)
    }
}
