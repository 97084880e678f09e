import DatamodeConfig
import DatamodePolicy
import Synchronization

/// One direction of a link profile (SPEC §10): a token bucket kept as GCRA's "theoretical arrival time".
///
/// The whole state is one atomic number, the monotonic time at which everything charged so far would have
/// passed at the profile's rate. Bytes may pass now while that time is at most `burst` ahead of now; passing
/// `n` bytes pushes it `n / rate` further. A single atomic value is what lets one bucket be shared by every
/// worker (link scope, or one client's connections spread over workers by SO_REUSEPORT) without a lock: a charge
/// is a compare-and-swap, and only shaped traffic ever touches it.
///
/// Why not libevent's own rate limiting (`bufferevent_set_rate_limit`, `ev_token_bucket_cfg`,
/// `bufferevent_rate_limit_group_*`): (1) it limits a bufferevent's own socket reads and writes, and the proxy's
/// bytes also move by speculative `evbuffer_write` and by splice(2) relays, which it never sees; (2) its buckets
/// refill once per whole `tick_len`: a 1 s tick gives a one-second burst (far beyond SPEC §10's max(64 KiB,
/// 50 ms at the rate)), a short tick makes a rate group's persistent refill timer fire every tick on every worker
/// even when no shaped byte moves (idle CPU), and rates are whole bytes per tick; (3) a group lives on one
/// event_base, so a link-wide cap across worker threads would need libevent's locking on every shaped bufferevent
/// of every worker. GCRA keeps nanosecond accounting (rounding is below 1 ns per charge, far inside ±5% from
/// 64 kbit/s to 1 Gbit/s), a burst of exactly 50 ms at the rate, and a timer only while a connection waits.
final class TokenBucket: Sendable {
    /// Bits per second.
    let rate: UInt64
    /// The burst, as time at the rate: 50 ms (SPEC §10: at most max(64 KiB, 50 ms at the rate)).
    let burstNanoseconds: UInt64
    /// The burst in bytes (at least one quantum).
    let burstBytes: Int
    /// A waiting connection is woken once this much may pass (not for every few bytes), so a connection waiting
    /// on a slow link costs a few wake-ups per second: a quarter of the burst, at least 1460 bytes (one segment)
    /// or half the burst if smaller, at most 1 MiB (from ~170 Mbit/s up: at 1 Gbit/s a wake-up every 8 ms, where
    /// 256 KiB woke a spliced body every 2 ms, each wake-up a timer, an epoll_wait and a context switch). Never
    /// more than half the burst: a wake-up that comes late finds the bucket holding more than the quantum, not
    /// full and overflowing (with the whole 400-byte burst as the quantum, 64 kbit/s ran 3.7-5.2% slow).
    let quantum: Int
    private let theoreticalArrival = Atomic<UInt64>(0)

    init(rate: UInt64) {
        self.rate = max(1, rate)
        let burst = max(256, Int(min(UInt64(Int32.max), self.rate / 8 / 20)))
        burstBytes = burst
        burstNanoseconds = UInt64(burst) * 8_000_000_000 / self.rate
        quantum = min(max(burst / 4, min(1460, burst / 2)), 1 << 20)
    }

    /// Time `bytes` take at the rate, in nanoseconds.
    @inline(__always)
    func cost(_ bytes: Int) -> UInt64 {
        UInt64(min(bytes, 1 << 30)) * 8_000_000_000 / rate
    }

    /// How many bytes may pass now (0 when the bucket is empty).
    func available(now: UInt64) -> Int {
        let arrival = max(theoreticalArrival.load(ordering: .relaxed), now)
        let debt = arrival - now
        guard debt < burstNanoseconds else { return 0 }
        return Int((burstNanoseconds - debt) * rate / 8_000_000_000)
    }

    /// Records that `bytes` passed (heads and bodies alike; it may run into debt, which later bytes wait out).
    func charge(_ bytes: Int, now: UInt64) {
        guard bytes > 0 else { return }
        let cost = cost(bytes)
        var old = theoreticalArrival.load(ordering: .relaxed)
        while true {
            let (exchanged, original) = theoreticalArrival.compareExchange(
                expected: old, desired: max(old, now) + cost, ordering: .relaxed)
            if exchanged { return }
            old = original
        }
    }

    /// Nanoseconds until `bytes` (at most the burst) may pass.
    func delay(until bytes: Int, now: UInt64) -> UInt64 {
        let arrival = max(theoreticalArrival.load(ordering: .relaxed), now)
        let allowedDebt = burstNanoseconds - min(burstNanoseconds, cost(min(bytes, burstBytes)))
        let debt = arrival - now
        return debt > allowedDebt ? debt - allowedDebt : 0
    }

    /// Nothing has been charged for longer than the burst: forgetting the bucket loses nothing.
    func isIdle(now: UInt64) -> Bool {
        theoreticalArrival.load(ordering: .relaxed) + burstNanoseconds < now
    }
}

/// The pair of buckets of one profile in one scope (a client address, or the whole link).
final class LinkBuckets: Sendable {
    let profile: LinkProfile
    /// Origin to client.
    let down: TokenBucket
    /// Client to origin.
    let up: TokenBucket

    init(profile: LinkProfile) {
        self.profile = profile
        down = TokenBucket(rate: profile.down)
        up = TokenBucket(rate: profile.up)
    }
}

/// Which buckets a shaped exchange uses: one pair per client address (`shaping-scope: client`) or one for all
/// traffic (`link`), for each profile. Shared by every worker, because SO_REUSEPORT spreads one client's
/// connections (and a link's traffic) over all of them; the mutex is taken only when a worker's own cache
/// (`Worker.linkBuckets`) misses, never per byte.
public final class LinkShaper: Sendable {
    struct Key: Hashable {
        /// Empty for link scope.
        var client: [UInt8]
        var profile: LinkProfile
    }

    private let table = Mutex<[Key: LinkBuckets]>([:])
    /// Above this many pairs, idle ones are forgotten (a proxy facing many clients must not grow without bound).
    static let pruneThreshold = 4096

    public init() {}

    func buckets(_ key: Key, now: UInt64) -> LinkBuckets {
        table.withLock { table in
            if let found = table[key] { return found }
            if table.count >= Self.pruneThreshold {
                table = table.filter { !($0.value.down.isIdle(now: now) && $0.value.up.isIdle(now: now)) }
            }
            let created = LinkBuckets(profile: key.profile)
            table[key] = created
            return created
        }
    }

    /// Pairs currently known (for tests).
    var count: Int { table.withLock { $0.count } }
}
