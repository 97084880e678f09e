import DatamodeConfig
import DatamodePolicy
import DatamodeState
import Foundation

/// `GET /budgets` and `POST /budgets/{name}/reset` (SPEC §11).
struct BudgetsEndpoint {
    let api: AdminAPI

    func handleCollection(_ request: AdminRequest) -> AdminResponse {
        let now = api.now()
        return AdminJSON.ok(api.budgets.budgets.indices.map { Self.document(api.budgets, $0, now: now) })
    }

    /// `/budgets/{name}/reset`, `name` still percent-encoded.
    func handleItem(_ request: AdminRequest, name encodedName: String) -> AdminResponse {
        guard let name = encodedName.removingPercentEncoding else { return AdminAPI.notFound(request.path) }
        guard let index = api.budgets.index(named: name) else {
            return AdminProblem.response(404, "not-found", "no budget named \"\(name)\"; see GET /budgets")
        }
        if let sharedReset = api.sharedBudgetReset {
            // SPEC §19: the fleet's counter first; a store that cannot take it changes nothing, anywhere.
            do {
                try sharedReset(index)
            } catch {
                return api.stateWriteFailure(error)
            }
        } else {
            api.budgets.reset(index)
        }
        do {
            try api.store.saveBudgetUsage(api.budgets.usage())
        } catch {
            return AdminProblem.response(500, "state-write-failed", "\(error)")
        }
        api.logger.info("budget reset through the admin API", metadata: ["budget": "\(name)"])
        let document = Self.document(api.budgets, index, now: api.now())
        api.events.emit(.budget, scope: "global", data: document)
        api.budgetSpent[name] = false
        return AdminJSON.ok(document)
    }

    /// One budget: its settings, `used`, `remaining`, `spent` and `resetsAt` (the end of its period, UTC).
    static func document(_ ledger: BudgetLedger, _ index: Int, now: Int64) -> [String: Any] {
        let budget = ledger.budgets[index]
        let used = ledger.used(index)
        let period = ledger.period(index)
        var match: [String: Any] = [:]
        if let client = budget.match.client { match["client"] = client.description }
        if let host = budget.match.host { match["host"] = host.pattern }
        return [
            "name": budget.name, "bytes": budget.bytes, "period": budget.period.rawValue, "then": budget.then.name,
            "hard": budget.hard, "match": match,
            "used": used, "remaining": budget.bytes > used ? budget.bytes - used : 0,
            "spent": ledger.isSpent(index, now: now),
            "periodStart": Timestamp.rfc3339(wallNanoseconds: period.start * 1_000_000_000, fractionDigits: 0),
            "resetsAt": Timestamp.rfc3339(wallNanoseconds: period.end * 1_000_000_000, fractionDigits: 0),
        ]
    }
}
