import DatamodeAdmin
import DatamodeConfig
import DatamodeEngine
import DatamodeInstance
import Foundation
import Testing

/// Start-up state of SPEC §10–§11: the API profile and budget usage persisted by an earlier run.
@Suite("ProxyInstance: link profile and budgets at start-up")
struct LinkAndBudgetStartupTests {
    @Test("a persisted API profile is in force again; one the file no longer defines stops start-up, naming the file")
    func persistedProfile() throws {
        let fixture = try Fixture()
        defer { fixture.remove() }
        try StateStore(directory: fixture.stateDirectory).saveProfile("my-sat")
        let instance = try fixture.instance("profiles:\n  my-sat: {down: 2Mbit, up: 256kbit}\n")
        #expect(instance.runtime.load().snapshot.profileInForce.profile?.name == "my-sat")
        do {
            _ = try fixture.instance("")
            Issue.record("started with a conditions.json naming an undefined profile")
        } catch {
            guard case ProxyInstance.StartupError.state = error else { Issue.record("not a state error: \(error)"); return }
            #expect("\(error)".contains("conditions.json"))
            #expect("\(error)".contains("my-sat"))
        }
    }

    @Test("budget usage of the current period carries on; of an earlier one it does not; a corrupt file stops start-up")
    func persistedUsage() throws {
        let fixture = try Fixture()
        defer { fixture.remove() }
        let yaml = "budgets:\n  - {name: daily, bytes: 1MB, period: day, then: constrained}\n  - {name: old, bytes: 1MB, period: hour, then: reject}\n"
        let now = fixture.clock.wallNanoseconds() / 1_000_000_000
        let today = BudgetPeriod.day.start(containing: now)
        let lastHour = BudgetPeriod.hour.start(containing: now) - 3600
        let store = try StateStore(directory: fixture.stateDirectory)
        try store.saveBudgetUsage([("daily", today, 700_000), ("old", lastHour, 900_000)])
        let instance = try fixture.instance(yaml)
        #expect(instance.budgets.used(0) == 700_000)
        #expect(instance.budgets.used(1) == 0)

        try "{\"budgets\": {\"daily\": {\"used\": 5}}}".write(toFile: store.budgetsPath, atomically: true, encoding: .utf8)
        do {
            _ = try fixture.instance(yaml)
            Issue.record("started with a budgets.json without periodStart")
        } catch {
            guard case ProxyInstance.StartupError.state = error else { Issue.record("not a state error: \(error)"); return }
            #expect("\(error)".contains("budgets.json"))
        }
    }

    @Test("a fleet's budget shares (store: redis) are kept in the state directory and read at start-up; a corrupt file stops it")
    func persistedShares() throws {
        let fixture = try Fixture()
        defer { fixture.remove() }
        let store = try StateStore(directory: fixture.stateDirectory)
        try store.saveBudgetShares([("daily", 86_400, ["proxy:00000000000000a1": 700, "reset": 5])], keyPrefix: "datamode:")
        let loaded = try store.loadBudgetShares(keyPrefix: "datamode:")
        #expect(loaded["daily"]?.start == 86_400)
        #expect(loaded["daily"]?.fields == ["proxy:00000000000000a1": 700, "reset": 5])
        #expect(try store.loadBudgetShares(keyPrefix: "other-fleet:").isEmpty, "another fleet's shares are not seeded")

        let yaml = """
            store: {kind: redis, redis: {url: "redis://127.0.0.1:1/0"}}
            budgets:
              - {name: daily, bytes: 1MB, period: day, then: constrained}
            """
        _ = try fixture.instance(yaml)
        try "{\"keyPrefix\": \"datamode:\", \"budgets\": {\"daily\": {\"shares\": {}}}}".write(toFile: store.budgetSharesPath, atomically: true, encoding: .utf8)
        do {
            _ = try fixture.instance(yaml)
            Issue.record("started with a budget-shares.json without periodStart")
        } catch {
            guard case ProxyInstance.StartupError.state = error else { Issue.record("not a state error: \(error)"); return }
            #expect("\(error)".contains("budget-shares.json"))
        }
        // Not read at all with the state directory as the store.
        _ = try fixture.instance("budgets:\n  - {name: daily, bytes: 1MB, period: day, then: constrained}\n")
    }
}
