import CDatamodeShims
import CLibevent
import DatamodeHTTP
import DatamodeState
import Synchronization

/// How many requests every worker holds together, against `deferral.max-held` (SPEC §18.2), and what
/// `datamode_held_requests` reports. Shared by the workers: one atomic add per hold and per release, never on the
/// path of a request that is not held.
final class HeldCount: Sendable {
    private let count = Atomic<Int>(0)

    var value: Int { count.load(ordering: .relaxed) }

    /// Takes a place if fewer than `limit` are taken.
    func take(limit: Int) -> Bool {
        var current = count.load(ordering: .relaxed)
        while current < limit {
            let (exchanged, original) = count.compareExchange(expected: current, desired: current + 1,
                                                              ordering: .relaxed)
            if exchanged { return true }
            current = original
        }
        return false
    }

    func give() { count.subtract(1, ordering: .relaxed) }
}

/// The requests one worker holds (SPEC §18.2): refused now, asked to wait (`Prefer: wait=N`, or a rule's `hold`),
/// head read and nothing forwarded. Each is decided again whenever what decides it may have changed — a new
/// runtime snapshot (a mode flip, a schedule step, a session's mode) or a budget spent or reset — and all those
/// its conditions no longer refuse are carried out together, oldest first, in one pass of the loop (a batch, not
/// a trickle); one whose time ran out gets the refusal it has then. A client that leaves is dropped by its session
/// (`ExchangeDriver.released`).
///
/// One timer per worker, armed only while something is held: every `pollMilliseconds` it compares the runtime
/// generation and the set of spent budgets with what the held requests were last decided under (two loads), and
/// at the earliest deadline. Nothing here runs for a request that is not held.
final class HeldRequests {
    struct Entry {
        let driver: ExchangeDriver
        let head: RequestHead
        let source: RequestSource
        /// Monotonic nanoseconds: when the hold began, and when it ends.
        let since: UInt64
        let deadline: UInt64
        /// Hold order: oldest first when several are released together.
        let order: UInt64
    }

    /// How often a worker with held requests looks for a change that could lift them.
    static let pollMilliseconds: Int64 = 20

    private unowned let worker: Worker
    let count: HeldCount
    private var entries: [ObjectIdentifier: Entry] = [:]
    private var nextOrder: UInt64 = 0
    private var timer: OpaquePointer?
    /// The timer is pending (re-adding it would push it back).
    private var timerArmed = false
    /// What the held requests were last decided under.
    private var decidedGeneration: UInt64 = 0
    private var decidedSpent: UInt64 = 0

    init(worker: Worker, count: HeldCount) {
        self.worker = worker
        self.count = count
    }

    deinit {
        if let timer { event_free(timer) }
        for _ in entries { count.give() }
    }

    /// Requests this worker holds now.
    var heldHere: Int { entries.count }

    /// How long `head`, refused now, may be held in milliseconds: the shortest of its `Prefer: wait`, its rule's
    /// `hold` and `deferral.max-hold`; nil when it asks for no hold (or holding is off).
    static func holdMilliseconds(_ head: RequestHead, ruleHold: Duration?, settings: WorkerSettings) -> Int64? {
        let deferral = settings.deferral
        guard deferral.maxHeld > 0 else { return nil }
        var limit = deferral.maxHold.milliseconds
        var asked = false
        if head.contains("prefer"), let wait = Preferences.parse(head.values(of: "prefer")).wait {
            limit = min(limit, wait * 1000)
            asked = true
        }
        if let ruleHold {
            limit = min(limit, ruleHold.milliseconds)
            asked = true
        }
        guard asked, limit > 0 else { return nil }
        return limit
    }

    /// Holds `driver`'s request for `milliseconds`, if there is room under `max-held`; false when there is not
    /// (it is refused at once).
    func hold(_ driver: ExchangeDriver, _ head: RequestHead, source: RequestSource, milliseconds: Int64) -> Bool {
        guard count.take(limit: worker.settings.deferral.maxHeld) else { return false }
        let now = worker.clock.nowNanoseconds()
        if entries.isEmpty {
            decidedGeneration = worker.runtime.generation
            decidedSpent = spentBudgets()
        }
        nextOrder += 1
        entries[ObjectIdentifier(driver)] = Entry(driver: driver, head: head, source: source, since: now,
                                                  deadline: now + UInt64(milliseconds) * 1_000_000, order: nextOrder)
        armTimer()
        return true
    }

    /// The driver's client left (or its connection closed): its place is given back.
    func drop(_ driver: ExchangeDriver) {
        guard !entries.isEmpty, entries.removeValue(forKey: ObjectIdentifier(driver)) != nil else { return }
        count.give()
        if entries.isEmpty, let timer {
            event_del(timer)
            timerArmed = false
        }
    }

    /// The timer fired: release what lifted and what ran out of time.
    func timerFired() {
        timerArmed = false
        let now = worker.clock.nowNanoseconds()
        let generation = worker.runtime.generation
        let spent = spentBudgets()
        let changed = generation != decidedGeneration || spent != decidedSpent
        var due: [(Entry, Admission)] = []
        if changed {
            worker.refreshSnapshot()
            decidedGeneration = generation
            decidedSpent = spent
        }
        for entry in entries.values where changed || entry.deadline <= now {
            let admission = worker.admit(entry.head, source: entry.source, client: entry.driver.session.peerAddress,
                                         clientText: entry.driver.session.peerText)
            if !admission.isRefusedByPolicy || entry.deadline <= now { due.append((entry, admission)) }
        }
        due.sort { $0.0.order < $1.0.order }
        for (entry, _) in due { drop(entry.driver) }
        for (entry, admission) in due {
            let heldMs = Int64((now - entry.since) / 1_000_000)
            entry.driver.releaseHeld(admission, entry.head, heldMilliseconds: admission.isRefusedByPolicy ? nil : heldMs)
            entry.driver.session.flushPendingWrites()
        }
        armTimer()
    }

    /// Drain: every held request gets the answer it has now (forwarded if it lifted, else refused).
    func releaseAll() {
        for entry in entries.values.sorted(by: { $0.order < $1.order }) {
            drop(entry.driver)
            let admission = worker.admit(entry.head, source: entry.source, client: entry.driver.session.peerAddress,
                                         clientText: entry.driver.session.peerText)
            let heldMs = Int64((worker.clock.nowNanoseconds() - entry.since) / 1_000_000)
            entry.driver.releaseHeld(admission, entry.head, heldMilliseconds: admission.isRefusedByPolicy ? nil : heldMs)
            entry.driver.session.flushPendingWrites()
        }
    }

    /// Bit i: budget i is spent now.
    private func spentBudgets() -> UInt64 {
        let budgets = worker.budgets
        guard !budgets.isEmpty else { return 0 }
        let now = worker.clock.wallNanoseconds() / 1_000_000_000
        var mask: UInt64 = 0
        for index in budgets.budgets.indices where index < 64 && budgets.isSpent(index, now: now) {
            mask |= 1 << UInt64(index)
        }
        return mask
    }

    /// Every `pollMilliseconds` while anything is held: deadlines are met within that, and a change is noticed
    /// within it (no scan of the held requests when they are held or dropped).
    private func armTimer() {
        guard !entries.isEmpty, !timerArmed else { return }
        if timer == nil { timer = dm_timer_new(worker.base, heldRequestsTimerCallback, context(self)) }
        guard let timer else { return }
        timerArmed = true
        dm_event_add_ms(timer, Self.pollMilliseconds)
    }
}
