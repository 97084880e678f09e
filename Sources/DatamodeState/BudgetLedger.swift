import DatamodeConfig
import DatamodePolicy
import Synchronization

/// What each data budget (SPEC §11) has used in its current period, counted by the workers without a lock.
///
/// Every budget has one counter per worker slot, which only adds: a worker adds the origin bytes of the traffic
/// a budget matches to its own slot (a relaxed atomic add, no contention), and "used" is a budget's `base` plus the
/// sum of its slots, a handful of loads, read when a request head arrives, by the admin API and by the persister.
/// A new period, a reset or a restored persisted value only moves `base`, so the slots never go back.
///
/// The period in force is kept as its start and end (UTC seconds). It moves only forward, and only when the wall
/// clock reaches the end: a clock that goes backwards keeps the period (and a spent budget spent) as they were.
public final class BudgetLedger: Sendable {
    public let budgets: [Budget]
    /// Bit i: budget i is `hard`.
    package let hardMask: UInt64
    @usableFromInline let slotCount: Int
    @usableFromInline let slots: [Counter]
    private let periods: [PeriodState]

    @usableFromInline final class Counter: Sendable {
        @usableFromInline let value = Atomic<UInt64>(0)
    }

    final class PeriodState: Sendable {
        /// used = base + Σ slots (may be negative: a reset or a new period subtracts what the slots hold).
        let base = Atomic<Int64>(0)
        let start = Atomic<Int64>(0)
        let end = Atomic<Int64>(0)
    }

    /// `slots`: one per worker (more workers than slots share them, still correctly: the adds are atomic).
    /// `now`: wall-clock seconds, to place each budget in its current period.
    public init(budgets: [Budget], slots: Int, now: Int64) {
        self.budgets = budgets
        hardMask = budgets.enumerated().reduce(0) { $1.element.hard ? $0 | (1 << UInt64($1.offset)) : $0 }
        slotCount = max(1, slots)
        self.slots = (0..<(budgets.count * max(1, slots))).map { _ in Counter() }
        periods = budgets.map { budget in
            let state = PeriodState()
            let start = budget.period.start(containing: now)
            state.start.store(start, ordering: .relaxed)
            state.end.store(budget.period.end(ofPeriodStarting: start), ordering: .relaxed)
            return state
        }
    }

    public var isEmpty: Bool { budgets.isEmpty }

    // MARK: the request path

    /// Counts `bytes` exchanged with an origin against budget `index`, from `worker`.
    @inlinable @inline(__always)
    public func add(_ bytes: Int, budget index: Int, worker: Int) {
        slots[index * slotCount + worker % slotCount].value.add(UInt64(bytes), ordering: .relaxed)
    }

    /// Bytes budget `index` has used in its current period.
    public func used(_ index: Int) -> UInt64 {
        var total = periods[index].base.load(ordering: .acquiring)
        for slot in 0..<slotCount {
            total &+= Int64(bitPattern: slots[index * slotCount + slot].value.load(ordering: .relaxed))
        }
        return UInt64(max(0, total))
    }

    /// Whether budget `index` is spent at wall-clock `now` (seconds): its allowance is used up and its period has
    /// not ended.
    public func isSpent(_ index: Int, now: Int64) -> Bool {
        now < periods[index].end.load(ordering: .acquiring) && used(index) >= budgets[index].bytes
    }

    /// The start and end (UTC seconds) of budget `index`'s current period.
    public func period(_ index: Int) -> (start: Int64, end: Int64) {
        (periods[index].start.load(ordering: .acquiring), periods[index].end.load(ordering: .acquiring))
    }

    public func index(named name: String) -> Int? { budgets.firstIndex { $0.name == name } }

    // MARK: the control plane

    /// Starts a new period for every budget whose period ended by `now`; returns whether any did. Only forward:
    /// the new period is the one that contains `now`, which is after the old one.
    @discardableResult
    public func rollOver(now: Int64) -> Bool {
        var changed = false
        for (index, budget) in budgets.enumerated() where now >= periods[index].end.load(ordering: .acquiring) {
            let start = budget.period.start(containing: now)
            periods[index].start.store(start, ordering: .relaxed)
            periods[index].end.store(budget.period.end(ofPeriodStarting: start), ordering: .relaxed)
            setUsed(index, 0)
            changed = true
        }
        return changed
    }

    /// `POST /budgets/{name}/reset`: the allowance is whole again, for the rest of the period.
    public func reset(_ index: Int) {
        setUsed(index, 0)
    }

    /// Adopts persisted usage: `used` bytes in the period that started at `start`. A saved period that is the
    /// current one (or later, when the clock went backwards since) is kept with its usage; an older one has ended.
    public func restore(_ index: Int, start: Int64, used: UInt64, now: Int64) {
        let budget = budgets[index]
        let current = periods[index].start.load(ordering: .acquiring)
        guard start >= current else { return }
        periods[index].start.store(start, ordering: .relaxed)
        periods[index].end.store(budget.period.end(ofPeriodStarting: start), ordering: .relaxed)
        setUsed(index, used)
    }

    private func setUsed(_ index: Int, _ value: UInt64) {
        var sum: Int64 = 0
        for slot in 0..<slotCount { sum &+= Int64(bitPattern: slots[index * slotCount + slot].value.load(ordering: .relaxed)) }
        periods[index].base.store(Int64(value) &- sum, ordering: .releasing)
    }

    // MARK: a fleet's shared counter (SPEC §19)

    /// Everything the workers of this process have counted against budget `index` since start-up (never goes
    /// back): what a shared store is sent the growth of.
    public func localTotal(_ index: Int) -> UInt64 {
        var total: UInt64 = 0
        for slot in 0..<slotCount { total &+= slots[index * slotCount + slot].value.load(ordering: .relaxed) }
        return total
    }

    /// Adopts the fleet's shared counter: `total` bytes used in the period, of which this process sent everything
    /// up to its `localTotal` of `flushed`. Used is then `total` plus what this process counted since (`base` is
    /// `total - flushed`), so counting goes on between flushes and while the store is down.
    public func adoptShared(_ index: Int, total: UInt64, flushed: UInt64) {
        periods[index].base.store(Int64(bitPattern: total) &- Int64(bitPattern: flushed), ordering: .releasing)
    }

    /// What is persisted: per budget, its period start and its usage.
    public func usage() -> [(name: String, start: Int64, used: UInt64)] {
        budgets.indices.map { (budgets[$0].name, periods[$0].start.load(ordering: .acquiring), used($0)) }
    }

    /// The conditions spent budgets without a `match` add to the global mode, and the first such budget's name
    /// (SPEC §11: `GET /mode` shows them with `source: budget`).
    public func globalEffect(now: Int64) -> (mode: DataMode, budget: String?) {
        var mode = DataMode.normal
        var name: String?
        for (index, budget) in budgets.enumerated() where budget.match.matchesEverything && isSpent(index, now: now) {
            if case .join(let joined) = budget.then {
                mode = mode.union(joined)
                if name == nil { name = budget.name }
            }
        }
        return (mode, name)
    }
}
