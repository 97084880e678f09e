/// When to give the heap's free memory back to the kernel: once the proxy has gone quiet after a burst.
///
/// glibc gives memory back only from the top of an arena, and only past the trim threshold (`MemoryTuning`). A
/// burst frees its relay buffers all over the workers' arenas, below blocks that stay live (a pooled upstream, a
/// table that grew), so none of it goes back: after 2,000 mixed connections for 30 s, 530 MB free in 11,000 chunks
/// and 470 MB of RSS with no connection open (malloc_info; bench/memory.py), with glibc's default thresholds as with
/// ours. `malloc_trim(0)` gives back the free pages wherever they are (470 → 62 MB). It walks every arena under that
/// arena's lock and the next burst faults the pages in again, so it is kept off the hot path: once per burst, when
/// the load has stayed at a tenth of its busiest second or less for 2 s, and only when malloc holds enough free
/// memory to be worth it. A steady load, however high, is never trimmed (its memory is in use, and reused).
///
/// After a trim malloc still counts the chunks it gave back as free (only their pages went), so its free bytes
/// cannot say whether there is anything new to give back; RSS can. The next trim waits for RSS to have grown by as
/// much since (another burst), or for `revisitAfter` (what was freed since without RSS growing, such as pooled
/// connections closed by their idle timeout): the tail of a burst still closing its connections after the trim is
/// not trimmed again for nothing, and a trickle of requests with pauses costs a trim a minute at most.
///
/// A value: the control loop feeds it the clock and an activity count every second, and carries out its answer.
public struct IdleTrim: Sendable {
    public struct Settings: Sendable {
        /// How long the load must stay low before the trim, in nanoseconds.
        public var quietFor: UInt64
        /// The load is low at or below this share of the busiest tick since the last trim.
        public var quietShare: Double
        /// Less free memory than this in malloc's arenas is not worth a trim (glibc keeps up to 8 MiB free at the
        /// top of each arena anyway, `MemoryTuning.trimThreshold`).
        public var worthTrimming: Int
        /// After a trim, the next one waits for RSS to have grown by `worthTrimming`, or for this long (nanoseconds).
        public var revisitAfter: UInt64

        public init(quietFor: UInt64 = 2_000_000_000, quietShare: Double = 0.1, worthTrimming: Int = 16 << 20,
                    revisitAfter: UInt64 = 60_000_000_000) {
            self.quietFor = quietFor
            self.quietShare = quietShare
            self.worthTrimming = worthTrimming
            self.revisitAfter = revisitAfter
        }
    }

    public let settings: Settings
    private var lastNow: UInt64
    private var lastActivity: UInt64
    /// The busiest tick since the last trim, in activity per second; 0: nothing happened since.
    private var peakRate: Double = 0
    /// When the load fell to `quietShare` of `peakRate` (nil: it is not that low).
    private var quietSince: UInt64?
    /// When the last trim was, and the RSS it left.
    private var lastTrim: (at: UInt64, resident: Int?)?

    public init(settings: Settings = Settings(), now: UInt64, activity: UInt64) {
        self.settings = settings
        lastNow = now
        lastActivity = activity
    }

    /// One tick: `now` on the injected clock (monotonic nanoseconds) and `activity`, a count that only grows with the
    /// proxy's work (exchanges, connections opened and closed, admin requests). Returns whether to trim now.
    /// `residentBytes` (RSS) and then `freeBytes` (what malloc holds free, which takes its arenas' locks) are read only
    /// once the load is low enough; nil when unknown.
    public mutating func tick(now: UInt64, activity: UInt64, residentBytes: () -> Int?, freeBytes: () -> Int?) -> Bool {
        defer {
            lastNow = now
            lastActivity = activity
        }
        guard now > lastNow else { return false }
        let rate = Double(activity &- lastActivity) * 1_000_000_000 / Double(now - lastNow)
        peakRate = max(peakRate, rate)
        guard peakRate > 0, rate <= peakRate * settings.quietShare else {
            quietSince = nil
            return false
        }
        let since = quietSince ?? lastNow
        quietSince = since
        guard now - since >= settings.quietFor else { return false }
        if let last = lastTrim, now - last.at < settings.revisitAfter, let before = last.resident,
           let resident = residentBytes(), resident < before + settings.worthTrimming {
            return false
        }
        if let free = freeBytes(), free < settings.worthTrimming { return false }
        return true
    }

    /// The trim was done at `now`, leaving `resident` bytes of RSS: the next one waits for new load, for it to go
    /// quiet again, and for RSS to grow (or `revisitAfter`).
    public mutating func trimmed(now: UInt64, resident: Int?) {
        peakRate = 0
        quietSince = nil
        lastTrim = (now, resident)
    }
}
