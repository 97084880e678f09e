/// A deterministic generator (SplitMix64), so that generated and randomized tests reproduce from their seed.
public struct SeededGenerator: RandomNumberGenerator, Sendable {
    public private(set) var state: UInt64

    public init(seed: UInt64) { state = seed }

    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

#if canImport(Glibc)
import Glibc
#endif

extension SeededGenerator {
    /// The seed of a randomized test: the environment's `variable` when set (a failed run replays with it), otherwise a
    /// new one each run (printed by the test, so that it can be replayed).
    public static func seed(from variable: String) -> UInt64 {
        getenv(variable).flatMap { UInt64(String(cString: $0)) } ?? UInt64.random(in: 0...UInt64.max)
    }
}
