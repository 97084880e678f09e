import CDatamodeShims
import CLibevent
import DatamodeConfig
import DatamodePolicy
import DatamodeState

/// The latency a link profile adds to one exchange (SPEC §10): once, before the response head is relayed (or a
/// tunnel's first byte from the origin), counted from the moment those bytes arrive, as a link's delay would.
enum AddedLatency {
    /// Nothing (left) to add.
    case none
    /// To add once the origin's first bytes arrive: this many microseconds.
    case pending(microseconds: Int64)
    /// The origin's first bytes are held until this monotonic time (nanoseconds).
    case holding(until: UInt64)
}

/// Which way bytes cross the link: towards the origin (the request, a tunnel's client side) or back.
enum LinkDirection {
    case up
    case down
}

/// What may cross the link for one exchange, and when (SPEC §10 link profiles, SPEC §11 data budgets): the
/// profile's buckets and added latency, and the budgets the exchange counts against. Every byte the exchange
/// exchanges with the origin is charged here once (`charge`), whichever relay moved it.
///
/// Shaping never buffers: a relay that may not move bytes leaves them where they are (the source's input buffer),
/// whose read watermark then stops reading from that socket, exactly as a slow peer would. While a bucket or a
/// latency is what holds bytes back, the session's one shaping timer is armed for when something may pass
/// (`HTTP1Session.armShapingTimer`); an idle shaped connection has no timer at all. A shaped tunnel, or an exchange
/// with a hard budget, is never handed to splice(2), which would move bytes past the buckets; a shaped large body
/// is, with each of its relay's reads capped by the bucket (`BodySplice`).
struct Allowance {
    /// The link profile's buckets (SPEC §10); nil: unshaped.
    var link: LinkBuckets?
    /// The latency still to add before the response head (or a tunnel's first byte) is relayed.
    var latency = AddedLatency.none
    /// Bit i: the exchange counts against budget i of the ledger (SPEC §11).
    var budgetMask: UInt64 = 0
    /// A `hard` budget was spent while this exchange ran: it is to be closed (from the shaping timer).
    var budgetCut = false

    /// The link profile in force for a request judged by `mode` (SPEC §10): its session's, else the one set through
    /// the admin API, else `mode`'s mapping (resolved once per snapshot for the global mode).
    static func profile(session: SessionMembership?, mode: DataMode, settings: WorkerSettings) -> LinkProfile? {
        if let name = session?.profile, let profile = settings.link.profiles[name] { return profile }
        return mode == settings.mode ? settings.profile : settings.profile(for: mode)
    }

    /// Puts `profile` in force: its buckets (per client or for the whole link, as configured) and its added latency.
    mutating func apply(_ profile: LinkProfile?, worker: Worker, client: IPAddress?) {
        guard let profile else { return }
        link = worker.linkBuckets(profile, client: client)
        var microseconds = profile.latencyMicroseconds
        let jitter = profile.jitterMicroseconds
        if jitter > 0 { microseconds = max(0, microseconds + Int64.random(in: -jitter...jitter)) }
        if microseconds > 0 { latency = .pending(microseconds: microseconds) }
    }

    /// Whether a tunnel's bytes may be handed to splice(2): nothing to shape, no hard budget to cap.
    func allowsSplice(_ ledger: BudgetLedger) -> Bool {
        link == nil && !hasHardBudget(ledger)
    }

    /// Whether a large body may be handed to splice(2): no hard budget to cap. A link bucket may apply: the body's
    /// relay asks it before each read (`BodySplice`).
    func allowsBodySplice(_ ledger: BudgetLedger) -> Bool {
        !hasHardBudget(ledger)
    }

    /// Whether a `hard` budget applies: then each move is capped by what is left of it.
    func hasHardBudget(_ ledger: BudgetLedger) -> Bool {
        budgetMask & ledger.hardMask != 0
    }

    /// Whether the origin's first bytes may be relayed now. `arrived`: some are buffered. The first time bytes
    /// are there, the hold starts; the shaping timer ends it.
    mutating func latencyElapsed(arrived: Bool, session: HTTP1Session) -> Bool {
        switch latency {
        case .none:
            return true
        case .pending(let microseconds):
            guard arrived else { return false }
            let until = session.worker.clock.nowNanoseconds() + UInt64(microseconds) * 1000
            latency = .holding(until: until)
            session.armShapingTimer(at: until)
            return false
        case .holding(let until):
            if session.worker.clock.nowNanoseconds() >= until {
                latency = .none
                return true
            }
            session.armShapingTimer(at: until)
            return false
        }
    }

    /// How many of the `available` buffered bytes may move `direction` now, out of `room` (the destination's
    /// watermark room): a hard data budget's remainder (SPEC §11) and the direction's link bucket (SPEC §10) cap it.
    /// 0: nothing may move, and the shaping timer is armed for when something can. With nothing buffered, `room` is
    /// returned as is (the relay still has an end of body to notice).
    @inline(__always)
    mutating func room(_ direction: LinkDirection, room: Int, available: Int, session: HTTP1Session) -> Int {
        guard room > 0, available > 0, budgetMask != 0 || link != nil else { return room }
        var room = room
        if budgetMask != 0 {
            room = budgetRoom(room, session: session)
            guard room > 0 else { return 0 }
        }
        if let link { room = Self.shaped(direction == .up ? link.up : link.down, wanted: min(room, available), session: session) }
        return room
    }

    /// How many of `wanted` bytes may pass `bucket` now. When the bucket is what holds bytes back, the shaping
    /// timer is armed for when a quantum may pass (not when the destination is full: its write event resumes the
    /// relay then). A few bytes are not moved on their own: they wait for a quantum, so a slow link costs a few
    /// wake-ups a second, not one per segment.
    private static func shaped(_ bucket: TokenBucket, wanted: Int, session: HTTP1Session) -> Int {
        let now = session.worker.clock.nowNanoseconds()
        let available = bucket.available(now: now)
        if available >= wanted { return wanted }
        let allowed = available >= bucket.quantum ? available : 0
        let waitFor = allowed == 0 ? min(bucket.quantum, wanted) : bucket.quantum
        session.armShapingTimer(at: now + bucket.delay(until: waitFor, now: now) + bucket.cost(allowed))
        return allowed
    }

    /// `room` capped by what is left of the exchange's `hard` budgets; 0 when one is spent, and then the exchange
    /// is to be closed (from the shaping timer).
    private mutating func budgetRoom(_ room: Int, session: HTTP1Session) -> Int {
        let ledger = session.worker.budgets
        guard hasHardBudget(ledger) else { return room }
        var left = room
        var mask = budgetMask & ledger.hardMask
        while mask != 0 {
            let index = mask.trailingZeroBitCount
            mask &= mask - 1
            let used = ledger.used(index)
            let bytes = ledger.budgets[index].bytes
            left = min(left, used >= bytes ? 0 : Int(min(bytes - used, UInt64(Int.max))))
        }
        if left == 0 && !budgetCut {
            budgetCut = true
            session.armShapingTimer(at: 0)
        }
        return left
    }

    /// `bytes` crossed the link `direction`: they are taken from its bucket and counted against every budget of
    /// the exchange. A `hard` budget that this spends ends the exchange, from the shaping timer (never from inside
    /// the relay that counted).
    @inline(__always)
    mutating func charge(_ direction: LinkDirection, _ bytes: Int, session: HTTP1Session) {
        guard bytes > 0, budgetMask != 0 || link != nil else { return }
        let worker = session.worker
        if let link { (direction == .up ? link.up : link.down).charge(bytes, now: worker.clock.nowNanoseconds()) }
        guard budgetMask != 0 else { return }
        let ledger = worker.budgets
        var mask = budgetMask
        while mask != 0 {
            let index = mask.trailingZeroBitCount
            mask &= mask - 1
            ledger.add(bytes, budget: index, worker: worker.index)
            if ledger.budgets[index].hard && !budgetCut
                && ledger.isSpent(index, now: worker.clock.wallNanoseconds() / 1_000_000_000) {
                budgetCut = true
                session.armShapingTimer(at: 0)
            }
        }
    }
}
