import DatamodeEngine
import DatamodeState
import Synchronization

/// An engine clock whose wall time a test sets (UTC period boundaries of SPEC §11 without waiting for them);
/// monotonic time stays real, so timeouts and shaping behave as usual.
public final class SettableWallClock: EngineClock, Sendable {
    private let wall: Mutex<Int64>
    private let system = SystemClock()

    /// Starts at `seconds` since the epoch.
    public init(seconds: Int64) {
        wall = Mutex(seconds * 1_000_000_000)
    }

    public func nowNanoseconds() -> UInt64 { system.nowNanoseconds() }
    public func wallNanoseconds() -> Int64 { wall.withLock { $0 } }

    /// Moves the wall clock to `seconds` (backwards too).
    public func set(seconds: Int64) { wall.withLock { $0 = seconds * 1_000_000_000 } }
}
