import DatamodeAdmin
import DatamodeConfig
import DatamodeEngine
import DatamodeState
import Dispatch
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// Budget usage shared by a fleet (SPEC §19 `store.kind: redis`): one counter per budget and period in Redis,
/// `<prefix>budget:<name>:<period start>`, that every proxy adds what it counted to (`INCRBY`), expiring an hour
/// after its period ends (`EXPIRE`).
///
/// The workers count exactly as without a store (their own slots of the `BudgetLedger`, lock-free); every 100 ms
/// the control loop sends each budget's growth since the last flush and adopts the total Redis answers
/// (`BudgetLedger.adoptShared`), so a budget is spent on every proxy once the fleet's counter reaches it. Overshoot
/// is bounded by what the fleet moves in one flush interval and a round trip, plus §11's allowance (heads read less
/// than 100 ms after the spending byte, transfers already running).
///
/// Redis down: nothing is sent, the workers go on counting, and used is the last total known plus this process's
/// count since; when Redis is back the whole growth is sent at once (nothing lost). A flush whose reply never
/// came is sent again, so a Redis that died between applying an `INCRBY` and answering it can count those bytes
/// twice: the error is on the side of spending early, never of forgetting.
final class FleetBudgets: @unchecked Sendable {
    let ledger: BudgetLedger
    let link: RedisLink
    let prefix: String

    private struct State {
        /// Per budget: the `localTotal` already added to Redis.
        var flushed: [UInt64]
        /// A flush is on its way (one at a time, so growth is never sent twice).
        var inFlight = false
    }
    private let state: Mutex<State>

    init(ledger: BudgetLedger, link: RedisLink, prefix: String) {
        self.ledger = ledger
        self.link = link
        self.prefix = prefix
        state = Mutex(State(flushed: Array(repeating: 0, count: ledger.budgets.count)))
    }

    func key(_ index: Int, start: Int64) -> String {
        "\(prefix)budget:\(ledger.budgets[index].name):\(start)"
    }

    /// Seconds a counter lives: to the end of its period and an hour more (a proxy whose clock is a little behind
    /// still finds it).
    private func lifetime(_ index: Int, now: Int64) -> Int64 {
        max(1, ledger.period(index).end - now + 3600)
    }

    /// At a clean stop: a last flush, waited for up to `timeout`, so what the workers counted in the last 100 ms
    /// reaches the fleet's counter (SPEC §11: a clean stop loses nothing).
    func flushBeforeStopping(now: Int64, timeout: DispatchTimeInterval = .milliseconds(500)) {
        let done = DispatchSemaphore(value: 0)
        let deadline = DispatchTime.now() + timeout
        // One flush may be on its way already: wait for it, then send what is left.
        while state.withLock({ $0.inFlight }) && DispatchTime.now() < deadline { usleep(5_000) }
        flush(now: now) { done.signal() }
        _ = done.wait(timeout: deadline)
    }

    /// Every 100 ms on the control loop: sends each budget's growth and adopts the fleet's totals.
    func flush(now: Int64, completion: (@Sendable () -> Void)? = nil) {
        guard !ledger.isEmpty, link.isUp else { completion?(); return }
        typealias Item = (index: Int, sending: UInt64, start: Int64)
        let items: [Item]? = state.withLock { state in
            guard !state.inFlight else { return nil }
            state.inFlight = true
            return ledger.budgets.indices.map { ($0, ledger.localTotal($0), ledger.period($0).start) }
        }
        guard let items else { completion?(); return }
        let flushed = state.withLock { $0.flushed }
        var batch: [[[UInt8]]] = []
        for item in items {
            let key = Array(key(item.index, start: item.start).utf8)
            batch.append([Array("INCRBY".utf8), key, Array(String(item.sending &- flushed[item.index]).utf8)])
            batch.append([Array("EXPIRE".utf8), key, Array(String(lifetime(item.index, now: now)).utf8)])
        }
        link.pipeline(batch) { [self] replies in
            state.withLock { state in
                state.inFlight = false
                for (position, item) in items.enumerated() {
                    // Not answered: not counted as sent; the growth goes with the next flush.
                    guard case .integer(let total)? = replies[position * 2] else { continue }
                    state.flushed[item.index] = item.sending
                    // A period that rolled over meanwhile is not given the old one's total.
                    guard ledger.period(item.index).start == item.start else { continue }
                    ledger.adoptShared(item.index, total: UInt64(max(0, total)), flushed: item.sending)
                }
            }
            completion?()
        }
    }

    /// Raises a counter to at least ARGV[1] (and gives it its lifetime), atomically: a Redis that came back
    /// empty, or lost the last writes before it died, gets back every total a proxy had been told.
    static let raiseScript = """
        local current = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
        if tonumber(ARGV[1]) > current then redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2]) end
        return 0
        """

    /// Sent each time the link comes up: every budget's counter raised to the total this process last knew
    /// (`lastSharedTotal`), so the fleet's count survives Redis's memory: the highest total any proxy was
    /// answered is a floor no proxy's restart or Redis's goes below. What this process counted and did not send
    /// yet goes with the next flush.
    func raiseCommands(now: Int64) -> [[[UInt8]]] {
        let flushed = state.withLock { $0.flushed }
        return ledger.budgets.indices.compactMap { index in
            let total = ledger.lastSharedTotal(index, flushed: flushed[index])
            guard total > 0 else { return nil }
            return [Array("EVAL".utf8), Array(Self.raiseScript.utf8), Array("1".utf8),
                    Array(key(index, start: ledger.period(index).start).utf8), Array(String(total).utf8),
                    Array(String(lifetime(index, now: now)).utf8)]
        }
    }

    /// `POST /budgets/{name}/reset` for the fleet: the shared counter goes to 0 first (or nothing changes and the
    /// caller answers 503), then this process's share; the others adopt 0 at their next flush.
    func reset(_ index: Int, now: Int64) throws(StateStore.StateError) {
        guard link.isUp else {
            throw StateStore.StateError(description: "the shared store (Redis) is unreachable; nothing was changed", unavailable: true)
        }
        let start = ledger.period(index).start
        let done = DispatchSemaphore(value: 0)
        let box = ResetReply()
        link.command([Array("SET".utf8), Array(key(index, start: start).utf8), Array("0".utf8),
                      Array("EX".utf8), Array(String(lifetime(index, now: now)).utf8)]) { reply in
            box.reply = reply
            done.signal()
        }
        guard done.wait(timeout: .now() + FleetStore.writeDeadline) == .success, case .status? = box.reply else {
            throw StateStore.StateError(description: "the shared store (Redis) did not take the reset; nothing was changed", unavailable: true)
        }
        state.withLock { state in
            state.flushed[index] = ledger.localTotal(index)
            ledger.adoptShared(index, total: 0, flushed: state.flushed[index])
        }
    }
}

private final class ResetReply: @unchecked Sendable {
    var reply: RedisReply?
}
