import DatamodeConfig
import DatamodePolicy

/// One step of a mode timeline (SPEC §12): `after` the previous step's nominal time, `mode` applies. Shared by the
/// admin plane's running schedules (`ModeSchedule`) and what a refusal's `liftsAt` reads of them.
public struct ScheduleStep: Sendable, Equatable {
    public var after: Duration
    public var mode: DataMode
    public init(after: Duration, mode: DataMode) {
        self.after = after
        self.mode = mode
    }
}

/// The steps still to come of the schedule on one scope (SPEC §12), in wall-clock time: what `liftsAt` needs of a
/// running `ModeSchedule`. `steps[next]` applies at `nextAt`; each later step `after` the one before it.
public struct ScheduleOutlook: Sendable, Equatable {
    public typealias Step = ScheduleStep

    public var steps: [Step]
    /// After the last step, start again at the first.
    public var repeats: Bool
    /// The index of the next step to apply.
    public var next: Int
    /// Wall-clock nanoseconds since the Unix epoch of the next step's nominal time (for a running `ModeSchedule`:
    /// the wall clock now plus `nextDue` minus the monotonic clock now).
    public var nextAt: Int64

    public init(steps: [Step], repeats: Bool, next: Int, nextAt: Int64) {
        self.steps = steps
        self.repeats = repeats
        self.next = next
        self.nextAt = nextAt
    }
}

/// A budget that is spent and matches the request (SPEC §11): it adds its `then` to the request's conditions (or
/// refuses it) until its period ends.
public struct SpentBudget: Sendable, Equatable {
    public var name: String
    public var then: BudgetAction
    /// The end of its current period, wall-clock seconds since the Unix epoch (`BudgetLedger.period(_:).end`).
    public var periodEnd: Int64

    public init(name: String, then: BudgetAction, periodEnd: Int64) {
        self.name = name
        self.then = then
        self.periodEnd = periodEnd
    }
}

/// When a refusal's conditions lift (SPEC §18.1): `Retry-After`, and `retryAfter` and `liftsAt` in the body.
public struct RefusalLift: Sendable, Equatable {
    /// What lifts them last.
    public enum Cause: Sendable, Equatable {
        /// A schedule step on the request's scope.
        case schedule
        /// The end of this budget's period.
        case budgetPeriod(String)
    }

    /// Wall-clock nanoseconds since the Unix epoch.
    public var at: Int64
    /// Whole seconds from now to `at`, rounded up, at least 1: a step is applied up to 50 ms after its nominal
    /// time (SPEC §12), so a client told 0 could come back before it and be refused again.
    public var retryAfterSeconds: Int64
    public var cause: Cause

    /// `at` in RFC 3339 (`liftsAt` in the problem body).
    public var liftsAt: String { Timestamp.rfc3339(wallNanoseconds: at) }
}

/// When refusals lift (SPEC §18.1). Pure: no clock, no state; table-tested.
public enum RefusalTiming {
    /// The first moment at which a request refused now would be let through, if a known event brings it: the
    /// next step of `schedule` (the request's scope's) after which no condition the request refuses is in the mode,
    /// or the end of the period of spent budgets, whichever comes first with every violated condition gone, `reject`
    /// budgets included. Nil when no known event lifts it (no schedule, no spent budget, a schedule whose steps
    /// never allow it), and when nothing holds it now.
    ///
    /// - `now`: wall-clock nanoseconds since the Unix epoch.
    /// - `tags`: the request's resolved tags (what it allows).
    /// - `scopeMode`: the mode of its scope now, its session's or the global one, without budgets.
    /// - `schedule`: the schedule on that scope, if one runs.
    /// - `spentBudgets`: every budget spent now that matches the request (not only the one named in the refusal:
    ///   the others hold it too).
    public static func liftsAt(now: Int64, tags: RequestTags, scopeMode: DataMode, schedule: ScheduleOutlook?,
                               spentBudgets: [SpentBudget]) -> RefusalLift? {
        let refused = DataMode(constrained: !tags.allowConstrained, expensive: !tags.allowExpensive,
                               ultraConstrained: !tags.allowUltraConstrained)
        var mode = scopeMode
        var budgets = spentBudgets.filter { $0.periodEnd * 1_000_000_000 > now }
        func allowed() -> Bool {
            var joined = mode
            for budget in budgets {
                switch budget.then {
                case .reject: return false
                case .join(let conditions): joined.formUnion(conditions)
                }
            }
            return joined.isDisjoint(with: refused)
        }
        guard !allowed() else { return nil }

        var cursor = ScheduleCursor(schedule)
        // Steps applied since the budgets last changed: after a whole cycle of a repeating schedule with none
        // allowing the request, no step can until a budget's period ends.
        var stepsSinceBudgetChange = 0
        for _ in 0..<100_000 {
            let budgetEnd = budgets.map { $0.periodEnd * 1_000_000_000 }.min()
            guard let at = [cursor.at, budgetEnd].compactMap({ $0 }).min() else { return nil }
            var cause = RefusalLift.Cause.schedule
            while let stepAt = cursor.at, stepAt == at, let stepMode = cursor.take() {
                mode = stepMode
                stepsSinceBudgetChange += 1
                if stepsSinceBudgetChange > 100_000 { return nil }  // zero-length steps only: no time passes
            }
            if budgetEnd == at {
                let ending = budgets.filter { $0.periodEnd * 1_000_000_000 == at }
                budgets.removeAll { $0.periodEnd * 1_000_000_000 == at }
                cause = .budgetPeriod(ending.last!.name)
                stepsSinceBudgetChange = 0
            }
            if allowed() {
                let wait = at - now
                let seconds = wait <= 0 ? 1 : max(1, (wait + 999_999_999) / 1_000_000_000)
                return RefusalLift(at: at, retryAfterSeconds: seconds, cause: cause)
            }
            if cursor.repeats && stepsSinceBudgetChange >= cursor.cycleLength {
                // A whole cycle under these budgets, none allowed: skip to the next budget's end (or give up).
                guard let nextEnd = budgets.map({ $0.periodEnd * 1_000_000_000 }).min() else { return nil }
                cursor.skipWholeCycles(before: nextEnd)
                while let stepAt = cursor.at, stepAt < nextEnd, let stepMode = cursor.take() { mode = stepMode }
                stepsSinceBudgetChange = 0
            }
        }
        return nil
    }
}

/// Walks a schedule's steps forward in time.
struct ScheduleCursor {
    let steps: [ScheduleOutlook.Step]
    let repeats: Bool
    var index: Int
    /// When `steps[index]` applies; nil once a schedule without `repeats` has run out.
    var at: Int64?
    /// Nanoseconds of one whole cycle (all steps' `after`).
    let cycle: Int64

    init(_ outlook: ScheduleOutlook?) {
        steps = outlook?.steps ?? []
        index = outlook?.next ?? 0
        at = (outlook != nil && index < steps.count) ? outlook!.nextAt : nil
        cycle = steps.reduce(0) { $0 + Self.nanoseconds($1.after) }
        // A repeated schedule of zero-length steps would never move time: treat it as running once.
        repeats = (outlook?.repeats ?? false) && cycle > 0
    }

    var cycleLength: Int { steps.count }

    /// Applies the step due at `at`: returns its mode and moves to the next.
    mutating func take() -> DataMode? {
        guard let current = at, index < steps.count else { return nil }
        let mode = steps[index].mode
        index += 1
        if index == steps.count {
            guard repeats else {
                at = nil
                return mode
            }
            index = 0
        }
        at = current + Self.nanoseconds(steps[index].after)
        return mode
    }

    /// Moves forward by whole cycles while the step after them is still before `limit` (the mode does not change:
    /// a whole cycle ends where it started).
    mutating func skipWholeCycles(before limit: Int64) {
        guard repeats, let current = at, current < limit else { return }
        at = current + (limit - current) / cycle * cycle
    }

    static func nanoseconds(_ duration: Duration) -> Int64 {
        let (seconds, attoseconds) = duration.components
        return max(0, seconds) * 1_000_000_000 + max(0, attoseconds) / 1_000_000_000
    }
}

extension BudgetLedger {
    /// The budgets spent at `now` (wall-clock seconds) among those `matches` accepts, for `RefusalTiming.liftsAt`.
    public func spentBudgets(now: Int64, matching matches: (Budget) -> Bool) -> [SpentBudget] {
        budgets.indices.compactMap { index in
            let budget = budgets[index]
            guard matches(budget), isSpent(index, now: now) else { return nil }
            return SpentBudget(name: budget.name, then: budget.then, periodEnd: period(index).end)
        }
    }
}
