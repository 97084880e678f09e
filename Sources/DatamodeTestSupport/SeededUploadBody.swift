/// Bodies whose size and bytes follow from a seed alone: the deferral store's crash child
/// (`DatamodeDeferralProbe`) stores them, and the test that kills it (`CrashTests`) rebuilds each from its seed to
/// tell whether what it finds is exactly what was enqueued. One definition for both: if the child's bytes and the
/// test's expectation could differ, every crash round would fail on the test's own bug.
public enum SeededUploadBody {
    /// Mostly small bodies, some of hundreds of KiB, one in ten of 1 to 6 MiB (long commits, to be killed in).
    public static func size(seed: UInt64) -> Int {
        let h = mix(seed)
        switch h % 100 {
        case 0..<60: return Int((h >> 8) % 16_384)
        case 60..<90: return 16_384 + Int((h >> 8) % (496 * 1024))
        default: return (1 << 20) + Int((h >> 8) % (5 << 20))
        }
    }

    /// xorshift64 from the seed, eight bytes per step, little-endian.
    public static func bytes(seed: UInt64, count: Int) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: count)
        out.withUnsafeMutableBytes { raw in
            var state = mix(seed) | 1
            var index = 0
            while index < count {
                state ^= state << 13
                state ^= state >> 7
                state ^= state << 17
                var word = state
                for k in 0..<min(8, count - index) {
                    raw[index + k] = UInt8(truncatingIfNeeded: word)
                    word >>= 8
                }
                index += 8
            }
        }
        return out
    }

    /// splitmix64's finaliser.
    public static func mix(_ value: UInt64) -> UInt64 {
        var z = value &+ 0x9E37_79B9_7F4A_7C15
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
