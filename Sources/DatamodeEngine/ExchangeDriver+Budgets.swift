import DatamodeConfig
import DatamodePolicy
import DatamodeState

/// Data budgets on a client connection (SPEC §11): which budgets an exchange counts against, what spent ones do
/// to it (conditions joining its mode, or a refusal), and the origin bytes it counts.
extension ExchangeDriver {
    /// `403 budget-exhausted`, naming the budget and when it resets.
    func refuseForBudget(_ index: Int, url: String) {
        let ledger = worker.budgets
        let budget = ledger.budgets[index]
        let resetsAt = Timestamp.rfc3339(wallNanoseconds: ledger.period(index).end * 1_000_000_000, fractionDigits: 0)
        exchange.outcome = .rejected
        exchange.reason = ProxyErrorCode.budgetExhausted.rawValue
        let problem = ProblemDetail(code: .budgetExhausted,
                                    detail: "The data budget \"\(budget.name)\" is spent until \(resetsAt).",
                                    extra: [("budget", JSONText.quote(budget.name)), ("resetsAt", JSONText.quote(resetsAt)),
                                            ("url", JSONText.quote(url))])
        respondProblem(problem, close: false)
    }

    /// Whether a `hard` budget applies to `exchange`: then its bytes are never spliced (the kernel would move them
    /// past the allowance) and each move is capped by what is left of it.
    func hasHardBudget() -> Bool {
        budgetMask & worker.budgets.hardMask != 0
    }

    /// `room` capped by what is left of the exchange's `hard` budgets; 0 when one is spent, and then the exchange
    /// is to be closed (from the shaping timer).
    func budgetRoom(_ room: Int) -> Int {
        guard hasHardBudget() else { return room }
        let ledger = worker.budgets
        var left = room
        var mask = budgetMask & ledger.hardMask
        while mask != 0 {
            let index = mask.trailingZeroBitCount
            mask &= mask - 1
            let used = ledger.used(index)
            let bytes = ledger.budgets[index].bytes
            left = min(left, used >= bytes ? 0 : Int(min(bytes - used, UInt64(Int.max))))
        }
        if left == 0 && !budgetCut {
            budgetCut = true
            client.armShapingTimer(at: 0)
        }
        return left
    }

    /// Counts `bytes` exchanged with the origin against every budget of `exchange`. A `hard` budget that this
    /// spends ends the exchange, from the shaping timer (never from inside the pump that counted).
    @inline(__always)
    func countOriginBytes(_ bytes: Int) {
        guard budgetMask != 0, bytes > 0 else { return }
        let ledger = worker.budgets
        var mask = budgetMask
        while mask != 0 {
            let index = mask.trailingZeroBitCount
            mask &= mask - 1
            ledger.add(bytes, budget: index, worker: worker.index)
            if ledger.budgets[index].hard && !budgetCut
                && ledger.isSpent(index, now: worker.clock.wallNanoseconds() / 1_000_000_000) {
                budgetCut = true
                client.armShapingTimer(at: 0)
            }
        }
    }
}
