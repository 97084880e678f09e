import DatamodeConfig
import DatamodePolicy
import DatamodeState
import Testing

/// SPEC §18.1: when a refusal's conditions lift — the next schedule step that removes every violated condition,
/// the end of a spent budget's period — and the `Retry-After` seconds, rounded up.
@Suite("When a refusal lifts")
struct RefusalLiftTests {
    static let nowSeconds: Int64 = 1_800_000_000  // 2027-01-15T08:00:00Z
    static let now = nowSeconds * 1_000_000_000
    static let second: Int64 = 1_000_000_000

    static let constrained = DataMode(name: "constrained")!
    static let expensive = DataMode(name: "expensive")!
    static let both = DataMode(name: "constrained-expensive")!
    static let satellite = DataMode(name: "satellite")!

    /// Refuses constrained, allows expensive (a `Allow-Constrained: ?0` request).
    static let noConstrained = RequestTags(allowConstrained: false, allowExpensive: true)
    /// Refuses both.
    static let neither = RequestTags(allowConstrained: false, allowExpensive: false)

    struct Case: Sendable, CustomTestStringConvertible {
        var name: String
        var tags: RequestTags = RefusalLiftTests.noConstrained
        var mode: DataMode
        var schedule: ScheduleOutlook? = nil
        var budgets: [SpentBudget] = []
        /// Nanoseconds after `now`, nil: no known lift.
        var lifts: Int64?
        var retryAfter: Int64? = nil
        var cause: RefusalLift.Cause = .schedule
        var testDescription: String { name }
    }

    static func steps(_ list: [(Int64, DataMode)], repeats: Bool = false, firstAt: Int64) -> ScheduleOutlook {
        ScheduleOutlook(steps: list.map { ScheduleOutlook.Step(after: .milliseconds($0.0), mode: $0.1) }, repeats: repeats,
                        next: 0, nextAt: now + firstAt)
    }

    static func budget(_ name: String, _ then: String, endsIn seconds: Int64) -> SpentBudget {
        SpentBudget(name: name, then: BudgetAction(then)!, periodEnd: nowSeconds + seconds)
    }

    static let cases: [Case] = [
        Case(name: "no schedule, no budget: nothing known lifts it", mode: constrained, lifts: nil),
        Case(name: "nothing holds it now", mode: .normal, schedule: steps([(10_000, constrained)], firstAt: 10 * second), lifts: nil),
        Case(name: "the next step goes normal", mode: constrained,
             schedule: steps([(30_000, .normal)], firstAt: 30 * second), lifts: 30 * second, retryAfter: 30),
        Case(name: "a step to a mode the request allows (expensive) lifts it", mode: constrained,
             schedule: steps([(10_000, expensive)], firstAt: 10 * second), lifts: 10 * second, retryAfter: 10),
        Case(name: "a step that keeps the violated condition does not; the one after does", mode: constrained,
             schedule: steps([(10_000, both), (20_000, expensive)], firstAt: 10 * second), lifts: 30 * second, retryAfter: 30),
        Case(name: "every violated condition must go: expensive alone is not enough", tags: neither, mode: both,
             schedule: steps([(10_000, expensive), (20_000, .normal)], firstAt: 10 * second), lifts: 30 * second, retryAfter: 30),
        Case(name: "a schedule that ends without allowing it: nothing known", mode: constrained,
             schedule: steps([(10_000, both), (5000, satellite)], firstAt: 10 * second), lifts: nil),
        Case(name: "the seconds are rounded up", mode: constrained,
             schedule: steps([(1200, .normal)], firstAt: 1_200_000_000), lifts: 1_200_000_000, retryAfter: 2),
        Case(name: "a millisecond away is still one second", mode: constrained,
             schedule: steps([(1, .normal)], firstAt: 1_000_000), lifts: 1_000_000, retryAfter: 1),
        Case(name: "a step due but not applied yet (within its 50 ms): one second, never zero", mode: constrained,
             schedule: steps([(0, .normal)], firstAt: -20_000_000), lifts: -20_000_000, retryAfter: 1),
        Case(name: "steps due at the same moment: the last one is the mode", mode: constrained,
             schedule: steps([(0, .normal), (0, constrained), (0, expensive)], firstAt: 5 * second), lifts: 5 * second,
             retryAfter: 5),
        Case(name: "a repeating schedule lifts it in its second half", mode: constrained,
             schedule: steps([(30_000, constrained), (30_000, .normal)], repeats: true, firstAt: 30 * second),
             lifts: 60 * second, retryAfter: 60),
        Case(name: "a repeating schedule that never allows it: nothing known (and the search ends)", tags: neither,
             mode: both, schedule: steps([(10_000, constrained), (10_000, expensive)], repeats: true, firstAt: 10 * second),
             lifts: nil),
        Case(name: "a spent budget lifts at the end of its period", mode: .normal,
             budgets: [budget("daily", "constrained", endsIn: 3600)], lifts: 3600 * second, retryAfter: 3600,
             cause: .budgetPeriod("daily")),
        Case(name: "a reject budget lifts at the end of its period", tags: .allowAll, mode: .normal,
             budgets: [budget("cap", "reject", endsIn: 100)], lifts: 100 * second, retryAfter: 100, cause: .budgetPeriod("cap")),
        Case(name: "a reject budget holds even a request that allows everything, whatever the schedule", tags: .allowAll,
             mode: .normal, schedule: steps([(5000, .normal)], firstAt: 5 * second),
             budgets: [budget("cap", "reject", endsIn: 100)], lifts: 100 * second, retryAfter: 100, cause: .budgetPeriod("cap")),
        Case(name: "the schedule goes normal first, the budget still holds it until its period ends", mode: constrained,
             schedule: steps([(10_000, .normal)], firstAt: 10 * second), budgets: [budget("daily", "constrained", endsIn: 100)],
             lifts: 100 * second, retryAfter: 100, cause: .budgetPeriod("daily")),
        Case(name: "the budget ends first, the scope's mode still holds it until the schedule's step", mode: constrained,
             schedule: steps([(50_000, .normal)], firstAt: 50 * second), budgets: [budget("daily", "constrained", endsIn: 10)],
             lifts: 50 * second, retryAfter: 50),
        Case(name: "two spent budgets: the later end", mode: .normal,
             budgets: [budget("b", "constrained", endsIn: 20), budget("a", "low-data", endsIn: 10)],
             lifts: 20 * second, retryAfter: 20, cause: .budgetPeriod("b")),
        Case(name: "a budget adding a condition the request allows does not hold it; the mode does, with no schedule",
             mode: constrained, budgets: [budget("metered", "expensive", endsIn: 10)], lifts: nil),
        Case(name: "a budget whose period already ended holds nothing: the schedule decides", mode: constrained,
             schedule: steps([(7000, .normal)], firstAt: 7 * second), budgets: [budget("old", "constrained", endsIn: 0)],
             lifts: 7 * second, retryAfter: 7),
        Case(name: "ultra-constrained (opt-in): a step to constrained-expensive lifts it for a request allowing both",
             tags: .allowAll, mode: satellite, schedule: steps([(10_000, both)], firstAt: 10 * second), lifts: 10 * second,
             retryAfter: 10),
        // A 10 s cycle: constrained at 10k+7 s, normal at 10k+10 s. The budget ends 30 days and 8 s from now, in a
        // constrained part: the next normal step, 2 s later, lifts it (found without walking 259,200 cycles).
        Case(name: "a repeating schedule under a budget a month long: the first normal step after the period", mode: .normal,
             schedule: steps([(7000, constrained), (3000, .normal)], repeats: true, firstAt: 7 * second),
             budgets: [budget("monthly", "constrained", endsIn: 2_592_008)], lifts: 2_592_010 * second, retryAfter: 2_592_010),
        Case(name: "… and in a normal part, the period's end itself", mode: .normal,
             schedule: steps([(7000, constrained), (3000, .normal)], repeats: true, firstAt: 7 * second),
             budgets: [budget("monthly", "constrained", endsIn: 2_592_005)], lifts: 2_592_005 * second, retryAfter: 2_592_005,
             cause: .budgetPeriod("monthly")),
        Case(name: "a schedule part-way through: `next` is where it resumes", mode: constrained,
             schedule: ScheduleOutlook(steps: [ScheduleOutlook.Step(after: .seconds(5), mode: .normal),
                                               ScheduleOutlook.Step(after: .seconds(5), mode: constrained),
                                               ScheduleOutlook.Step(after: .seconds(5), mode: .normal)],
                                       repeats: false, next: 1, nextAt: now + 5 * second),
             lifts: 10 * second, retryAfter: 10),
    ]

    @Test("liftsAt", arguments: cases)
    func liftsAt(_ testCase: Case) {
        let lift = RefusalTiming.liftsAt(now: Self.now, tags: testCase.tags, scopeMode: testCase.mode,
                                         schedule: testCase.schedule, spentBudgets: testCase.budgets)
        guard let expected = testCase.lifts else {
            #expect(lift == nil)
            return
        }
        guard let lift else {
            Issue.record("no lift; expected \(expected) ns from now")
            return
        }
        #expect(lift.at == Self.now + expected)
        if let retryAfter = testCase.retryAfter { #expect(lift.retryAfterSeconds == retryAfter) }
        #expect(lift.cause == testCase.cause)
    }

    @Test("liftsAt is RFC 3339 UTC")
    func rfc3339() {
        let lift = RefusalTiming.liftsAt(now: Self.now, tags: Self.noConstrained, scopeMode: Self.constrained,
                                         schedule: Self.steps([(30_000, .normal)], firstAt: 30 * Self.second), spentBudgets: [])
        #expect(lift?.liftsAt == "2027-01-15T08:00:30.000Z")
    }

    @Test("the ledger names its spent budgets with their period ends, only those the request matches")
    func spentBudgetsFromLedger() {
        let budgets = [
            Budget(name: "daily", bytes: 100, period: .day, then: .join(Self.constrained)),
            Budget(name: "hourly", bytes: 100, period: .hour, then: .reject),
            Budget(name: "video", bytes: 10, period: .month, match: BudgetMatch(host: Glob("*.video.example", caseInsensitive: true)),
                   then: .join(Self.expensive)),
        ]
        let ledger = BudgetLedger(budgets: budgets, slots: 1, now: Self.nowSeconds)
        ledger.add(100, budget: 0, worker: 0)
        ledger.add(99, budget: 1, worker: 0)
        ledger.add(10, budget: 2, worker: 0)
        let all = ledger.spentBudgets(now: Self.nowSeconds) { _ in true }
        #expect(all.map(\.name) == ["daily", "video"])
        #expect(all[0] == SpentBudget(name: "daily", then: .join(Self.constrained), periodEnd: 1_800_057_600))  // 2027-01-16T00:00Z
        let plain = ledger.spentBudgets(now: Self.nowSeconds) { $0.match.matches(client: nil, host: "news.example") }
        #expect(plain.map(\.name) == ["daily"])
        // Fed to liftsAt: constrained until midnight.
        let lift = RefusalTiming.liftsAt(now: Self.now, tags: Self.noConstrained, scopeMode: .normal, schedule: nil, spentBudgets: plain)
        #expect(lift?.liftsAt == "2027-01-16T00:00:00.000Z")
        #expect(lift?.retryAfterSeconds == 57_600)
    }
}
