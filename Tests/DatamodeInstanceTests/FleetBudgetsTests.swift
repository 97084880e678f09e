import DatamodeConfig
import DatamodeEngine
@testable import DatamodeInstance
import DatamodeState
import DatamodeTestSupport
import Foundation
import Logging
import Synchronization
import Testing

/// The fleet's budget counter (SPEC §19) with two proxies' `FleetBudgets` on one real redis-server, every step in an
/// order the test chooses: what each proxy counted, when it flushes, when it re-seeds a Redis that came back empty.
/// Nothing waits on timing luck: each step waits for Redis's answer before the next.
@Suite("FleetBudgets: the shared counter across an empty Redis", .serialized)
struct FleetBudgetsTests {
    /// One proxy's side: its ledger (one worker slot), its link, its flusher. Nothing is sent on its own: the link's
    /// `onUp` is not wired, so the test sends the re-seeding commands when it chooses.
    final class Proxy: @unchecked Sendable {
        let ledger: BudgetLedger
        let link: RedisLink
        let shared: FleetBudgets
        let now: Int64

        /// `saved`: what an earlier run of this proxy left in its state directory (`FleetBudgets.knownShares`).
        init(_ redis: RedisServer, saved: [(name: String, start: Int64, fields: [String: UInt64])] = []) throws {
            now = Int64(Date().timeIntervalSince1970)
            ledger = BudgetLedger(budgets: [Budget(name: "big", bytes: 10_000_000_000, period: .month, then: .reject)],
                                  slots: 1, now: now)
            link = try RedisLink(endpoint: RedisEndpoint(host: "127.0.0.1", port: Int(redis.port)), channel: "test:changes",
                                 logger: Logger(label: "fleet-budgets-test") { _ in SwiftLogNoOpLogHandler() }) { _ in }
            shared = FleetBudgets(ledger: ledger, link: link, prefix: "test:")
            shared.restore(Dictionary(uniqueKeysWithValues: saved.map { ($0.name, (start: $0.start, fields: $0.fields)) }))
            link.start()
            try waitUp()
        }

        deinit { link.stop() }

        func waitUp() throws {
            try #require(AdminPolling.until(timeout: .seconds(10), interval: .milliseconds(5)) { link.isUp }, "the link came up")
        }

        /// Counts `bytes` as a worker would.
        func count(_ bytes: Int) { ledger.add(bytes, budget: 0, worker: 0) }

        /// One flush, waited for; a flush whose answer got lost is sent again (as the next 100 ms tick would).
        func flush() throws {
            let done = DispatchSemaphore(value: 0)
            shared.flush(now: now) { done.signal() }
            try #require(done.wait(timeout: .now() + 5) == .success, "the flush completed")
        }

        /// What this proxy sends when its link comes up (again), waited for.
        func reseed() throws {
            let done = DispatchSemaphore(value: 0)
            let commands = shared.raiseCommands(now: now)
            link.pipeline(commands) { _ in done.signal() }
            try #require(done.wait(timeout: .now() + 5) == .success, "the re-seeding was answered")
        }

        /// The fleet's total as this proxy adopts it from a flush with nothing new to send.
        func fleetTotal() throws -> UInt64 {
            try flush()
            return ledger.used(0)
        }
    }

    /// The fleet's total as `proxy` adopts it is `expected`.
    static func expectTotal(_ proxy: Proxy, _ expected: UInt64, _ comment: String = "",
                            sourceLocation: SourceLocation = #_sourceLocation) throws {
        let total = try proxy.fleetTotal()
        #expect(total == expected, "\(comment) the fleet's total: \(total), expected \(expected)", sourceLocation: sourceLocation)
    }

    /// Redis's hash agrees with itself: `added` is the sum of the shares (and `legacy`), as the script keeps it.
    static func expectConsistent(_ redis: RedisServer, sourceLocation: SourceLocation = #_sourceLocation) throws {
        let keys = try redis.command(["KEYS", "test:budget-shares:*"]).split(separator: "\n").map(String.init)
        for key in keys {
            let lines = try redis.command(["HGETALL", key]).split(separator: "\n").map(String.init)
            var fields: [String: UInt64] = [:]
            for position in stride(from: 0, to: lines.count - 1, by: 2) { fields[lines[position]] = UInt64(lines[position + 1]) }
            let shares = fields.filter { $0.key != "added" && $0.key != "reset" }.values.reduce(0, +)
            #expect(fields["added"] == shares, "\(key): \(fields)", sourceLocation: sourceLocation)
        }
    }

    /// Redis dies and comes back empty; every proxy's link reconnects, none has re-seeded yet.
    static func restartEmpty(_ redis: RedisServer, _ proxies: Proxy...) throws {
        redis.kill()
        try redis.start()
        for proxy in proxies { try proxy.waitUp() }
    }

    @Test("Redis back empty: a proxy that re-seeds late does not wipe out what another sent after re-seeding first")
    func lateReseedKeepsOthersIncrements() throws {
        let redis = try RedisServer()
        let a = try Proxy(redis)
        let b = try Proxy(redis)
        a.count(1000)
        try a.flush()
        b.count(2000)
        try b.flush()
        try Self.expectTotal(b, 3000)

        // Redis dies and comes back empty; both links reconnect, neither has re-seeded yet.
        try Self.restartEmpty(redis, a, b)

        // A re-seeds with what it knew (1000), counts 100 more and sends them; only then does B re-seed (it knew 3000).
        try a.reseed()
        a.count(100)
        try a.flush()
        try b.reseed()
        // The true total: 1000 + 2000 before, 100 after. A plain SET to 3000 would have dropped A's 100.
        try Self.expectTotal(b, 3100, "B:")
        try Self.expectTotal(a, 3100, "A:")

        // And counting goes on from there, on both.
        b.count(10)
        try b.flush()
        try Self.expectTotal(a, 3110)
        try Self.expectConsistent(redis)
    }

    @Test("Redis back empty: a proxy whose first flush lands before its own re-seeding loses none of it")
    func flushBeforeReseedIsKept() throws {
        let redis = try RedisServer()
        let a = try Proxy(redis)
        let b = try Proxy(redis)
        a.count(1000)
        try a.flush()
        b.count(500)
        try b.flush()
        try Self.expectTotal(a, 1500)

        try Self.restartEmpty(redis, a, b)
        // The link's thread may run a flush posted by the control loop before the commands `onUp` sends.
        a.count(40)
        try a.flush()
        try a.reseed()
        try b.reseed()
        try Self.expectTotal(a, 1540)
        try Self.expectTotal(b, 1540)
    }

    @Test("Re-seeding is idempotent: a proxy that re-seeds twice, or re-seeds a Redis that lost nothing, adds nothing")
    func reseedingTwiceAddsNothing() throws {
        let redis = try RedisServer()
        let a = try Proxy(redis)
        let b = try Proxy(redis)
        a.count(700)
        try a.flush()
        b.count(300)
        try b.flush()
        try a.reseed()
        try b.reseed()
        try a.reseed()
        try Self.expectTotal(a, 1000)
        try Self.restartEmpty(redis, a, b)
        try b.reseed()
        try a.reseed()
        try b.reseed()
        try Self.expectTotal(a, 1000)
        try Self.expectTotal(b, 1000)
    }

    @Test("A reset through one proxy stays a reset when another re-seeds with what it knew before it")
    func resetSurvivesAnotherReseed() throws {
        let redis = try RedisServer()
        let a = try Proxy(redis)
        let b = try Proxy(redis)
        a.count(1000)
        try a.flush()
        b.count(2000)
        try b.flush()
        try Self.expectTotal(b, 3000)
        try a.shared.reset(0, now: a.now)
        #expect(a.ledger.used(0) == 0)
        // B reconnects (a dropped connection) before its next flush told it of the reset.
        try b.reseed()
        b.count(5)
        try Self.expectTotal(b, 5)
        try Self.expectTotal(a, 5)
        try Self.expectConsistent(redis)
    }

    @Test("Every proxy restarted and Redis empty: a proxy seeds it from its state directory, counts it could not send included")
    func restartedProxySeedsFromItsStateDirectory() throws {
        let redis = try RedisServer()
        var a = try Proxy(redis)
        let b = try Proxy(redis)
        a.count(1000)
        try a.flush()
        b.count(500)
        try b.flush()
        // A second of flushes: one of them reads the whole hash (B's share with it), the others its sum.
        for _ in 0..<10 { try a.flush() }
        try Self.expectTotal(a, 1500)
        redis.kill()
        // Redis down: A goes on counting, then stops without being able to send it; what it keeps for a restart:
        a.count(200)
        let saved = a.shared.knownShares()
        #expect(saved.count == 1 && saved.first?.fields[a.shared.instance] == 1200, "\(saved)")
        try redis.start()
        a = try Proxy(redis, saved: saved)
        try a.reseed()
        try Self.expectTotal(a, 1700, "A restarted, B not yet seeding (A seeds B's share too):")
        try b.waitUp()
        try b.reseed()
        a.count(1)
        try Self.expectTotal(a, 1701, "and after B's seeding, nothing twice:")
        try Self.expectTotal(b, 1701)
        try Self.expectConsistent(redis)
    }

    @Test("The string counter of earlier versions (INCRBY) is read into the hash: a rolling upgrade starts no budget over")
    func legacyCounterCounts() throws {
        let redis = try RedisServer()
        let a = try Proxy(redis)
        let start = a.ledger.period(0).start
        #expect(try redis.command(["INCRBY", "test:budget:big:\(start)", "700"]) == "700")
        a.count(100)
        try Self.expectTotal(a, 800)
        // An older proxy goes on adding to its counter.
        #expect(try redis.command(["INCRBY", "test:budget:big:\(start)", "50"]) == "750")
        try Self.expectTotal(a, 850)
        try Self.expectConsistent(redis)
    }
}
