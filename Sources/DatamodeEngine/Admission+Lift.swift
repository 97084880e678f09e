import DatamodeHTTP
import DatamodePolicy
import DatamodeState

extension Admission {
    /// When a refusal of `head` lifts (SPEC §18.1): the next step of the schedule on its scope (its session's, else
    /// the global one) that leaves none of its refused conditions, or the end of the period of every spent budget
    /// that holds it. `tags`: the request's resolved tags; nil for a `budget-exhausted` refusal, which is decided
    /// before the tags (they are resolved here, or taken as allowing everything when they are invalid).
    static func lift(_ head: RequestHead, _ target: RequestTarget, client: IPAddress?, settings: WorkerSettings,
                     budgets: some BudgetView, tags: RequestTags?, scopeMode: DataMode, session: String?,
                     now: Int64, wallNow: Int64) -> RefusalLift? {
        let resolved: RequestTags
        if let tags {
            resolved = tags
        } else {
            let facts = RequestFacts(method: head.method, url: target.absoluteURL, host: target.host,
                                     port: Int(target.port), path: target.path, isConnect: target.form == .authority,
                                     client: client, fields: head.fields.map { (name: $0.name, value: $0.value) })
            switch resolveTags(facts, policy: settings.policy) {
            case .success(let found): resolved = found
            case .failure: resolved = RequestTags(allowConstrained: true, allowExpensive: true, allowUltraConstrained: true)
            }
        }
        var spent: [SpentBudget] = []
        for (index, budget) in budgets.budgets.enumerated()
        where budget.match.matches(client: client, host: target.host) && budgets.isSpent(index, now: now) {
            spent.append(SpentBudget(name: budget.name, then: budget.then, periodEnd: budgets.periodEnd(index)))
        }
        return RefusalTiming.liftsAt(now: wallNow, tags: resolved, scopeMode: scopeMode,
                                     schedule: settings.scheduleOutlooks[session ?? ""], spentBudgets: spent)
    }
}

extension RefusalLift {
    /// `Retry-After` (RFC 9110 §10.2.3, delay-seconds).
    var retryAfterField: (String, String) { ("Retry-After", String(retryAfterSeconds)) }

    /// `retryAfter` and `liftsAt`, JSON-encoded, for a problem's extra members.
    var problemMembers: [(String, String)] {
        [("retryAfter", String(retryAfterSeconds)), ("liftsAt", JSONText.quote(liftsAt))]
    }
}
