import DatamodeConfig
import DatamodePolicy
import Foundation
import Testing

/// SPEC §11 configuration: `budgets`, byte units, and the UTC periods.
@Suite("Data budgets: config")
struct BudgetConfigTests {
    @Test("A budget with every key")
    func full() throws {
        let budgets = try parse("""
            budgets:
              - name: daily
                bytes: 5GB
                period: day
                match: {client: 10.0.0.0/8, host: "*.video.example"}
                then: constrained-expensive
                hard: true
              - {name: fleet, bytes: 2GiB, period: month, then: reject}
              - {name: sat, bytes: 1.5MB, period: hour, then: satellite}
            """).budgets
        #expect(budgets.count == 3)
        #expect(budgets[0].name == "daily" && budgets[0].bytes == 5_000_000_000 && budgets[0].period == .day && budgets[0].hard)
        #expect(budgets[0].then == .join(DataMode(constrained: true, expensive: true)))
        #expect(budgets[0].match.matches(client: IPAddress("10.1.2.3"), host: "cdn.VIDEO.example"))
        #expect(!budgets[0].match.matches(client: IPAddress("192.168.1.1"), host: "cdn.video.example"))
        #expect(!budgets[0].match.matches(client: IPAddress("10.1.2.3"), host: "video.example.org"))
        #expect(budgets[1].bytes == 2 << 30 && budgets[1].then == .reject && !budgets[1].hard)
        #expect(budgets[1].match.matchesEverything)
        #expect(budgets[2].bytes == 1_500_000)
        #expect(budgets[2].then == .join(DataMode(constrained: true, expensive: true, ultraConstrained: true)))
    }

    static let errors: [ErrorCase] = [
        ErrorCase("budgets:\n  - {bytes: 1GB, period: day, then: reject}", key: "budgets[0].name", line: 2, "missing; expected the budget's name"),
        ErrorCase("budgets:\n  - {name: a, bytes: 5 gigs, period: day, then: reject}", key: "budgets[0].bytes", line: 2,
                  "expected a positive size such as 5GB"),
        ErrorCase("budgets:\n  - {name: a, bytes: 0, period: day, then: reject}", key: "budgets[0].bytes", line: 2, "positive size"),
        ErrorCase("budgets:\n  - {name: a, bytes: 1GB, period: week, then: reject}", key: "budgets[0].period", line: 2,
                  "expected hour, day or month"),
        ErrorCase("budgets:\n  - {name: a, bytes: 1GB, period: day, then: normal}", key: "budgets[0].then", line: 2,
                  "or reject"),
        ErrorCase("budgets:\n  - {name: a, bytes: 1GB, period: day, then: slow}", key: "budgets[0].then", line: 2, "or reject"),
        ErrorCase("budgets:\n  - {name: a, bytes: 1GB, period: day, then: reject, match: {port: 80}}", key: "budgets[0].match.port",
                  line: 2, "unknown key"),
        ErrorCase("budgets:\n  - {name: a, bytes: 1GB, period: day, then: reject}\n  - {name: a, bytes: 1GB, period: day, then: reject}",
                  key: "budgets[1].name", line: 3, "duplicate budget name"),
    ]

    @Test("Bad values name the key and line", arguments: errors)
    func badValues(_ errorCase: ErrorCase) {
        expectError(errorCase)
    }

    @Test("Periods start and end on UTC boundaries", arguments: [
        // 2026-03-15T13:45:10Z
        (BudgetPeriod.hour, Int64(1_773_582_310), "2026-03-15T13:00:00Z", "2026-03-15T14:00:00Z"),
        (.day, 1_773_582_310, "2026-03-15T00:00:00Z", "2026-03-16T00:00:00Z"),
        (.month, 1_773_582_310, "2026-03-01T00:00:00Z", "2026-04-01T00:00:00Z"),
        // 2026-12-31T23:59:59Z: the month rolls into the next year.
        (.month, 1_798_761_599, "2026-12-01T00:00:00Z", "2027-01-01T00:00:00Z"),
        // 2028-02-29T12:00:00Z, a leap day.
        (.month, 1_835_438_400, "2028-02-01T00:00:00Z", "2028-03-01T00:00:00Z"),
    ])
    func periods(_ period: BudgetPeriod, _ now: Int64, _ start: String, _ end: String) {
        let first = period.start(containing: now)
        #expect(Self.utc(first) == start)
        #expect(Self.utc(period.end(ofPeriodStarting: first)) == end)
    }

    static func utc(_ seconds: Int64) -> String {
        let formatter = ISO8601DateFormatter()
        formatter.timeZone = TimeZone(identifier: "UTC")
        return formatter.string(from: Date(timeIntervalSince1970: TimeInterval(seconds)))
    }
}
