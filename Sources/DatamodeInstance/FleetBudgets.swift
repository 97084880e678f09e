import DatamodeAdmin
import DatamodeConfig
import DatamodeEngine
import DatamodeState
import Dispatch
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// Budget usage shared by a fleet (SPEC §19 `store.kind: redis`): one hash per budget and period in Redis,
/// `<prefix>budget-shares:<name>:<period start>`, expiring an hour after its period ends (`EXPIRE`). Each proxy
/// process owns one field, `proxy:<its instance id>`: everything it counted against the budget in that period. The
/// field `reset` holds what `POST /budgets/{name}/reset` took back, and `legacy` the counter of proxies that still
/// `INCRBY` the string key `<prefix>budget:<name>:<period start>` of earlier versions (a rolling upgrade). `added` is
/// the sum of the shares and `legacy`, kept by the same script that raises them, so that a flush reads two fields
/// however many proxy processes (restarts included) counted in the period. The fleet's usage is `added - reset`.
///
/// Every value in the hash only grows, and every write raises one field to at least a value (`raise` in
/// `shareScript`, atomic): a proxy raises its own field to what it counted (an absolute, not an increment), and
/// when its link comes up it raises every field to what it last saw in Redis (`raiseCommands`). This is a grow-only
/// counter (a G-counter): raises commute and repeat harmlessly, so
/// - nothing is lost: a field is only ever written by its owner with its own total, or by anyone with a value the
///   field held before; no write goes below what another proxy already added, whatever order the re-seeding and
///   the flushes of several proxies reach a Redis that came back empty (a plain `SET` of the fleet's total, raised
///   late by one proxy, used to wipe out what others had added after raising it first);
/// - nothing counts twice: a flush whose reply was lost is sent again as the same absolute, and re-seeding the
///   same values again changes nothing;
/// - a Redis that came back empty gets back every proxy's share as the proxies last saw it (each its own exactly),
///   and a reset as well: a proxy that re-seeds with what it knew before a reset raises `reset` with it.
///
/// The workers count exactly as without a store (their own slots of the `BudgetLedger`, lock-free); every 100 ms
/// the control loop sends each budget's share and adopts the fleet's total from `added` and `reset` as Redis
/// answers them, merged with what this process saw before (`BudgetLedger.adoptShared`), so a budget is spent on
/// every proxy once the fleet's total reaches it. Every tenth flush reads the whole hash: what this process raises
/// again when its link comes up. Overshoot is bounded by what the fleet moves in one flush interval and a round trip, plus §11's
/// allowance (heads read less than 100 ms after the spending byte, transfers already running).
///
/// Redis down: nothing is sent, the workers go on counting, and used is the last total known plus this process's
/// count since; when Redis is back the whole share is sent at once (nothing lost).
final class FleetBudgets: @unchecked Sendable {
    let ledger: BudgetLedger
    let link: RedisLink
    let prefix: String
    /// This process's field in every budget's hash, random per start: a restarted proxy adds a field and never
    /// lowers the one an earlier run of it left.
    let instance: String

    /// What this process knows of one budget's hash in one period.
    struct Shares {
        /// The period (its start) the values below belong to.
        var start: Int64
        /// `localTotal` when this process began counting into that period: its share is what it counted since.
        var offset: UInt64
        /// Every field of the hash, each the highest value this process saw it hold (its own share included).
        var fields: [String: UInt64] = [:]

        /// The fleet's usage in the period: the shares, minus what resets took back.
        var total: UInt64 {
            let added = fields[FleetBudgets.addedField] ?? 0
            let taken = fields[FleetBudgets.resetField] ?? 0
            return added > taken ? added - taken : 0
        }

        /// Merges a hash Redis answered: each field the higher of the two (values only grow).
        mutating func merge(_ answered: [String: UInt64]) {
            fields.merge(answered) { max($0, $1) }
        }
    }

    private struct State {
        /// Per budget: the `localTotal` already in this process's field.
        var flushed: [UInt64]
        /// Per budget: the hash as this process knows it.
        var shares: [Shares]
        /// A flush is on its way (one at a time).
        var inFlight = false
        /// Flushes sent: every tenth reads the whole hash.
        var flushes = 0
    }
    private let state: Mutex<State>

    static let resetField = "reset"
    static let addedField = "added"

    init(ledger: BudgetLedger, link: RedisLink, prefix: String) {
        self.ledger = ledger
        self.link = link
        self.prefix = prefix
        let id = String(UInt64.random(in: .min ... .max), radix: 16)
        instance = "proxy:" + String(repeating: "0", count: 16 - id.count) + id
        state = Mutex(State(flushed: Array(repeating: 0, count: ledger.budgets.count),
                            shares: ledger.budgets.indices.map { Shares(start: ledger.period($0).start, offset: 0) }))
    }

    func key(_ index: Int, start: Int64) -> String {
        "\(prefix)budget-shares:\(ledger.budgets[index].name):\(start)"
    }

    /// The counter earlier versions `INCRBY`, read into the field `legacy`.
    func legacyKey(_ index: Int, start: Int64) -> String {
        "\(prefix)budget:\(ledger.budgets[index].name):\(start)"
    }

    /// Seconds a hash lives: to the end of its period and an hour more (a proxy whose clock is a little behind
    /// still finds it).
    private func lifetime(_ index: Int, now: Int64) -> Int64 {
        max(1, ledger.period(index).end - now + 3600)
    }

    /// At a clean stop: a last flush, waited for up to `timeout`, so what the workers counted in the last 100 ms
    /// reaches the fleet's counter (SPEC §11: a clean stop loses nothing). It reads the whole hash: what the state
    /// directory keeps for a restart is every share as it is now, not as it was at the last whole read.
    func flushBeforeStopping(now: Int64, timeout: DispatchTimeInterval = .milliseconds(500)) {
        let done = DispatchSemaphore(value: 0)
        let deadline = DispatchTime.now() + timeout
        // One flush may be on its way already: wait for it, then send what is left.
        while state.withLock({ $0.inFlight }) && DispatchTime.now() < deadline { usleep(5_000) }
        flush(now: now, whole: true) { done.signal() }
        _ = done.wait(timeout: deadline)
    }

    /// One budget's share as it stands: the period it counts into, this process's field and its value. A period
    /// that rolled over starts a new hash; what was counted and not sent yet goes into the new period's share.
    private func share(_ index: Int, _ state: inout State) -> (start: Int64, sending: UInt64, value: UInt64) {
        let start = ledger.period(index).start
        if state.shares[index].start != start {
            state.shares[index] = Shares(start: start, offset: state.flushed[index])
        }
        let sending = ledger.localTotal(index)
        return (start, sending, sending &- state.shares[index].offset)
    }

    /// Every 100 ms on the control loop: sends each budget's share and adopts the fleet's totals; reads the `whole`
    /// hash when asked, and every tenth time.
    func flush(now: Int64, whole: Bool = false, completion: (@Sendable () -> Void)? = nil) {
        guard !ledger.isEmpty, link.isUp else { completion?(); return }
        typealias Item = (index: Int, start: Int64, sending: UInt64, value: UInt64)
        let sent: (items: [Item], whole: Bool)? = state.withLock { state in
            guard !state.inFlight else { return nil }
            state.inFlight = true
            state.flushes += 1
            let items = ledger.budgets.indices.map { index in
                let current = share(index, &state)
                return (index, current.start, current.sending, current.value)
            }
            return (items, whole || state.flushes % 10 == 1)
        }
        guard let (items, whole) = sent else { completion?(); return }
        let batch = items.map {
            shareCommand($0.index, start: $0.start, now: now, whole: whole, fields: [(instance, $0.value)])
        }
        link.pipeline(batch) { [self] replies in
            state.withLock { state in
                state.inFlight = false
                for (position, item) in items.enumerated() {
                    // Not answered: the same share (or a larger one) goes with the next flush.
                    guard let answered = Self.fields(replies[position]) else { continue }
                    adopt(item.index, start: item.start, sending: item.sending, answered: answered, &state)
                }
            }
            completion?()
        }
    }

    /// Takes what Redis answered for budget `index`'s hash of the period `start`, where this process's share
    /// counted its `localTotal` up to `sending`.
    private func adopt(_ index: Int, start: Int64, sending: UInt64, answered: [String: UInt64], _ state: inout State) {
        state.flushed[index] = max(state.flushed[index], sending)
        // A period that rolled over meanwhile is not given the old one's total.
        guard state.shares[index].start == start, ledger.period(index).start == start else { return }
        state.shares[index].merge(answered)
        ledger.adoptShared(index, total: state.shares[index].total, flushed: state.flushed[index])
    }

    /// Raises each of `fields` in budget `index`'s hash of the period `start` to at least its value, gives the hash
    /// its lifetime, and answers `added` and `reset`, or the `whole` hash (`shareScript`).
    private func shareCommand(_ index: Int, start: Int64, now: Int64, reset: Bool = false, whole: Bool = false,
                              fields: [(String, UInt64)]) -> [[UInt8]] {
        var command = [Array("EVAL".utf8), Array(Self.shareScript.utf8), Array("2".utf8),
                       Array(key(index, start: start).utf8), Array(legacyKey(index, start: start).utf8),
                       Array(String(lifetime(index, now: now)).utf8), Array(((reset ? "r" : "") + (whole ? "w" : "") + "-").utf8)]
        for (field, value) in fields {
            command.append(Array(field.utf8))
            command.append(Array(String(value).utf8))
        }
        return command
    }

    /// KEYS[1]: a budget's hash for one period; KEYS[2]: the string counter of earlier versions for the same
    /// period. ARGV[1]: the hash's lifetime (seconds); ARGV[2]: flags, `r` to reset, `w` to answer the whole hash;
    /// then pairs of a field and a value. Raises each field given to at least its value and `legacy` to the old
    /// counter, adding what each rose by to `added` (never raised directly: it is derived), and with a reset raises
    /// `reset` to `added` (the usage so far, taken back). Answers `added` and `reset`, or the whole hash. Never
    /// lowers a field. Values are written as given (decimal strings), differences with `%d` (Lua numbers are
    /// doubles: exact to 2^53 bytes).
    static let shareScript = """
        local function raise(field, value)
          if field == 'added' then return end
          local current = tonumber(redis.call('HGET', KEYS[1], field) or '0') or 0
          local wanted = tonumber(value) or 0
          if wanted <= current then return end
          redis.call('HSET', KEYS[1], field, value)
          if field ~= 'reset' then redis.call('HINCRBY', KEYS[1], 'added', string.format('%d', wanted - current)) end
        end
        for i = 3, #ARGV - 1, 2 do raise(ARGV[i], ARGV[i + 1]) end
        if redis.call('TYPE', KEYS[2]).ok == 'string' then raise('legacy', redis.call('GET', KEYS[2])) end
        if string.find(ARGV[2], 'r', 1, true) then raise('reset', redis.call('HGET', KEYS[1], 'added') or '0') end
        redis.call('EXPIRE', KEYS[1], ARGV[1])
        if string.find(ARGV[2], 'w', 1, true) then return redis.call('HGETALL', KEYS[1]) end
        return {'added', redis.call('HGET', KEYS[1], 'added') or '0', 'reset', redis.call('HGET', KEYS[1], 'reset') or '0'}
        """

    /// A hash as `HGETALL` answers it (nil: not answered, or not a hash).
    static func fields(_ reply: RedisReply?) -> [String: UInt64]? {
        guard case .array(let items)? = reply else { return nil }
        var fields: [String: UInt64] = [:]
        var position = 0
        while position + 1 < items.count {
            if let field = items[position].bytes, let text = items[position + 1].bytes,
               let value = UInt64(String(decoding: text, as: UTF8.self)) {
                fields[String(decoding: field, as: UTF8.self)] = value
            }
            position += 2
        }
        return fields
    }

    /// Sent each time the link comes up (and when Redis was emptied under a live link): every field of every
    /// budget's hash this process saw, its own share included, raised again to the value it saw, so the fleet's
    /// count survives Redis's memory. Harmless on a Redis that lost nothing: no field goes down, none is added to.
    func raiseCommands(now: Int64) -> [[[UInt8]]] {
        state.withLock { state in
            ledger.budgets.indices.compactMap { index in
                let current = share(index, &state)
                var fields = state.shares[index].fields
                fields[instance] = max(fields[instance] ?? 0, state.flushed[index] &- state.shares[index].offset)
                let known = fields.filter { $0.key != Self.addedField && $0.value > 0 }.sorted { $0.key < $1.key }
                guard !known.isEmpty else { return nil }
                return shareCommand(index, start: current.start, now: now, fields: known)
            }
        }
    }

    /// What this process knows of each budget's hash in its current period, its own share as everything it counted
    /// (sent or not): what the state directory keeps (`budget-shares.json`) for a restart.
    func knownShares() -> [(name: String, start: Int64, fields: [String: UInt64])] {
        state.withLock { state in
            ledger.budgets.indices.compactMap { index in
                let current = share(index, &state)
                var fields = state.shares[index].fields
                fields[instance] = max(fields[instance] ?? 0, current.value)
                fields = fields.filter { $0.value > 0 }
                return fields.isEmpty ? nil : (ledger.budgets[index].name, current.start, fields)
            }
        }
    }

    /// Takes what an earlier run of this proxy knew (`knownShares`, read back from the state directory) for the
    /// budgets still in the same period: raised again with the rest whenever the link comes up. The earlier run's
    /// own share is a field this run never writes otherwise, so what it counted and could not send is not lost.
    func restore(_ saved: [String: (start: Int64, fields: [String: UInt64])]) {
        state.withLock { state in
            for index in ledger.budgets.indices {
                guard let entry = saved[ledger.budgets[index].name], entry.start == ledger.period(index).start else { continue }
                _ = share(index, &state)
                state.shares[index].merge(entry.fields)
            }
        }
    }

    /// `POST /budgets/{name}/reset` for the fleet: Redis takes back the usage so far (`reset` raised to the sum of
    /// the shares, this process's share sent first with everything it counted) or nothing changes and the caller
    /// answers 503; the others adopt the new total at their next flush.
    func reset(_ index: Int, now: Int64) throws(StateStore.StateError) {
        guard link.isUp else {
            throw StateStore.StateError(description: "the shared store (Redis) is unreachable; nothing was changed", unavailable: true)
        }
        let current = state.withLock { share(index, &$0) }
        let done = DispatchSemaphore(value: 0)
        let box = ResetReply()
        link.command(shareCommand(index, start: current.start, now: now, reset: true, fields: [(instance, current.value)])) { reply in
            box.reply = reply
            done.signal()
        }
        guard done.wait(timeout: .now() + FleetStore.writeDeadline) == .success, let answered = Self.fields(box.reply) else {
            throw StateStore.StateError(description: "the shared store (Redis) did not take the reset; nothing was changed", unavailable: true)
        }
        state.withLock { adopt(index, start: current.start, sending: current.sending, answered: answered, &$0) }
    }
}

private final class ResetReply: @unchecked Sendable {
    var reply: RedisReply?
}
