import DatamodeAdmin
import DatamodeConfig
import DatamodePolicy
import DatamodeState
import Foundation
import Logging
import Testing

/// `GET /budgets`, `POST /budgets/{name}/reset` and the budget side of `GET /mode` and `/metrics` (SPEC §11),
/// over a ledger the test fills as the workers would: no socket.
@Suite("Admin: /budgets")
struct BudgetsEndpointTests {
    static let yaml = """
        budgets:
          - {name: daily, bytes: 1000, period: day, then: constrained}
          - {name: lab, bytes: 1MB, period: month, match: {client: 10.0.0.0/8}, then: reject, hard: true}
        """

    /// An admin API over a fresh ledger of `yaml`'s budgets at the fixture's clock.
    static func fixture() throws -> (AdminFixture, BudgetLedger, AdminAPI) {
        let admin = try AdminFixture(yaml)
        let ledger = BudgetLedger(budgets: admin.snapshot.configuration.budgets, slots: 2, now: admin.now)
        let api = AdminAPI(runtime: admin.runtime, store: admin.store, token: nil,
                           logger: Logger(label: "t") { _ in SwiftLogNoOpLogHandler() }, budgets: ledger,
                           metrics: { MetricsSnapshot() }, now: { [admin] in admin.now })
        return (admin, ledger, api)
    }

    static func handle(_ api: AdminAPI, _ method: String, _ path: String) -> AdminResponse {
        api.handle(AdminRequest(method: method, path: path, headers: [:], body: []))
    }

    @Test("GET lists every budget with used, remaining, spent, resetsAt")
    func list() throws {
        let (_, ledger, api) = try Self.fixture()
        ledger.restore(0, start: AdminFixture.start, used: 400, now: AdminFixture.start)
        let response = Self.handle(api, "GET", "/budgets")
        #expect(response.status == 200)
        let list = try #require(response.json as? [[String: Any]])
        #expect(list.count == 2)
        #expect(list[0]["name"] as? String == "daily")
        #expect(list[0]["used"] as? Int == 400)
        #expect(list[0]["remaining"] as? Int == 600)
        #expect(list[0]["spent"] as? Bool == false)
        #expect(list[0]["resetsAt"] as? String == "2026-01-02T00:00:00Z")
        #expect(list[0]["then"] as? String == "constrained")
        #expect(list[1]["resetsAt"] as? String == "2026-02-01T00:00:00Z")
        #expect((list[1]["match"] as? [String: Any])?["client"] as? String == "10.0.0.0/8")
        #expect(list[1]["hard"] as? Bool == true)
    }

    @Test("A spent budget without a match shows in GET /mode as source budget; metrics say so")
    func spentShowsInMode() throws {
        let (_, ledger, api) = try Self.fixture()
        ledger.restore(0, start: AdminFixture.start, used: 1000, now: AdminFixture.start)
        let mode = Self.handle(api, "GET", "/mode").object
        #expect(mode["mode"] as? String == "constrained")
        #expect(mode["source"] as? String == "budget")
        #expect(mode["budget"] as? String == "daily")
        let metrics = Self.handle(api, "GET", "/metrics").text
        #expect(metrics.contains("datamode_budget_used_bytes{budget=\"daily\"} 1000\n"))
        #expect(metrics.contains("datamode_budget_spent{budget=\"daily\"} 1\n"))
        #expect(metrics.contains("datamode_budget_spent{budget=\"lab\"} 0\n"))
    }

    @Test("A spent budget with a match does not change the global mode")
    func matchedBudgetLeavesGlobalMode() throws {
        let (_, ledger, api) = try Self.fixture()
        ledger.restore(1, start: AdminFixture.start, used: 2_000_000, now: AdminFixture.start)
        let mode = Self.handle(api, "GET", "/mode").object
        #expect(mode["mode"] as? String == "normal")
        #expect(mode["source"] as? String == "default")
    }

    @Test("POST reset makes the allowance whole, persisted; unknown names and other methods are refused")
    func reset() throws {
        let (admin, ledger, api) = try Self.fixture()
        ledger.restore(0, start: AdminFixture.start, used: 1000, now: AdminFixture.start)
        let response = Self.handle(api, "POST", "/budgets/daily/reset")
        #expect(response.status == 200)
        #expect(response.object["used"] as? Int == 0)
        #expect(response.object["spent"] as? Bool == false)
        #expect(try admin.store.loadBudgetUsage()["daily"]?.used == 0)
        #expect(Self.handle(api, "POST", "/budgets/weekly/reset").status == 404)
        #expect(Self.handle(api, "GET", "/budgets/daily/reset").status == 405)
        #expect(Self.handle(api, "POST", "/budgets/daily").status == 404)
        #expect(Self.handle(api, "PUT", "/budgets").status == 405)
    }

    @Test("A budget event (SPEC §12) when a budget becomes spent and when it is reset, once each")
    func events() throws {
        let (_, ledger, api) = try Self.fixture()
        let frames = Shared<[String]>([])
        api.events.connect { _, bytes in frames.value.append(String(decoding: bytes, as: UTF8.self)) }
        api.emitBudgetChanges()
        #expect(frames.value.isEmpty, "nothing spent yet")
        ledger.add(1000, budget: 0, worker: 0)
        api.emitBudgetChanges()
        api.emitBudgetChanges()
        #expect(frames.value.count == 1)
        #expect(frames.value.first?.hasPrefix("event: budget\n") == true)
        #expect(frames.value.first?.contains("\"spent\":true") == true)
        _ = Self.handle(api, "POST", "/budgets/daily/reset")
        api.emitBudgetChanges()
        #expect(frames.value.count == 2)
        #expect(frames.value.last?.contains("\"spent\":false") == true)
    }

    @Test("The ledger: persisted usage of the current period is kept, of an older one dropped, periods only move forward")
    func ledgerRestoreAndRollOver() throws {
        let (_, ledger, _) = try Self.fixture()
        let day = AdminFixture.start
        ledger.restore(0, start: day - 86_400, used: 999, now: day)
        #expect(ledger.used(0) == 0, "yesterday's usage does not count today")
        ledger.add(700, budget: 0, worker: 0)
        ledger.add(300, budget: 0, worker: 5)
        #expect(ledger.used(0) == 1000)
        #expect(ledger.isSpent(0, now: day + 10))
        #expect(!ledger.rollOver(now: day - 3600), "a clock gone back starts no new period")
        #expect(ledger.isSpent(0, now: day - 3600))
        #expect(ledger.rollOver(now: day + 86_400))
        #expect(ledger.used(0) == 0)
        #expect(ledger.period(0).start == day + 86_400)
    }
}
