import DatamodeConfig
import DatamodePolicy
import DatamodeState
import Testing

/// `BudgetLedger`'s side of a fleet's shared counter (SPEC §19): what the workers counted goes on counting between
/// flushes and while the store is down, on top of the fleet's total.
@Suite("BudgetLedger: a shared counter")
struct BudgetLedgerSharedTests {
    static let now: Int64 = 1_767_225_600

    static func ledger(bytes: UInt64 = 1000) -> BudgetLedger {
        BudgetLedger(budgets: [Budget(name: "b", bytes: bytes, period: .day, then: .reject)], slots: 2, now: now)
    }

    @Test("Used is the fleet's total plus what this process counted since its last flush")
    func adopt() {
        let ledger = Self.ledger()
        ledger.add(100, budget: 0, worker: 0)
        ledger.add(50, budget: 0, worker: 1)
        #expect(ledger.localTotal(0) == 150 && ledger.used(0) == 150)
        // Flushed 150; the fleet's counter answered 600 (others counted 450).
        ledger.adoptShared(0, total: 600, flushed: 150)
        #expect(ledger.used(0) == 600)
        // Counting goes on between flushes, and while the store is down.
        ledger.add(30, budget: 0, worker: 1)
        #expect(ledger.used(0) == 630 && ledger.localTotal(0) == 180)
        // The next flush sends 30 and hears 1000: spent.
        ledger.adoptShared(0, total: 1000, flushed: 180)
        #expect(ledger.used(0) == 1000 && ledger.isSpent(0, now: Self.now))
    }

    @Test("A new period starts from zero whatever the slots hold; the next total adopted is the new period's")
    func rollOver() {
        let ledger = Self.ledger()
        ledger.add(700, budget: 0, worker: 0)
        ledger.adoptShared(0, total: 900, flushed: 700)
        #expect(ledger.rollOver(now: Self.now + 86_400))
        #expect(ledger.used(0) == 0)
        ledger.add(10, budget: 0, worker: 0)
        ledger.adoptShared(0, total: 25, flushed: 710)
        #expect(ledger.used(0) == 25)
    }
}
