import DatamodeEngine
import DatamodeHTTP
import DatamodePolicy
import DatamodeTestSupport
import Foundation
import Testing

/// SPEC §11 through real sockets: origin bytes are counted both ways (heads included, tunnels too, the proxy's
/// own answers not), a spent budget joins its conditions to the mode of the traffic it matches or refuses it,
/// `hard` closes what is in flight, period boundaries follow the (injected) UTC clock forward only, and usage
/// survives a restart.
@Suite(.serialized) struct BudgetTests {
    /// 2026-01-01T23:59:00Z.
    static let lateEvening: Int64 = 1_767_311_940

    static func waitForPublication() { usleep(150_000) }

    static func get(_ client: RawHTTPClient, _ url: String, headers: [(String, String)] = []) throws -> ParsedResponse {
        try client.send(RequestText.make("GET", url, headers: headers))
        return try client.readResponse()
    }

    static func budget(_ proxy: ProxyHarness, _ name: String) throws -> [String: Any] {
        let reply = try proxy.admin().get("/budgets")
        return reply.array?.first { $0["name"] as? String == name } ?? [:]
    }

    @Test("Spent: its conditions join the mode for the traffic it matches, problems name it, GET /mode shows it")
    func spentBudgetJoinsTheMode() throws {
        let body = String(repeating: "x", count: 20_000)
        let origin = try RecordingOrigin { _ in .ok(body) }
        defer { origin.stop() }
        let proxy = try ProxyHarness(yaml: """
            budgets:
              - {name: daily, bytes: 10KB, period: day, then: constrained}
            """)
        defer { proxy.stop() }
        let client = try proxy.connect()
        // Not yet spent: an app that refuses constrained networks is served.
        #expect(try Self.get(client, origin.url("/a"), headers: [("Allow-Constrained", "?0")]).status == 200)
        Self.waitForPublication()
        let refused = try Self.get(client, origin.url("/b"), headers: [("Allow-Constrained", "?0")])
        #expect(refused.status == 403)
        let problem = try #require(try JSONSerialization.jsonObject(with: Data(refused.body)) as? [String: Any])
        #expect(problem["error"] as? String == "constrained")
        #expect(problem["budget"] as? String == "daily")
        #expect(problem["mode"] as? String == "constrained")
        // Other requests go on, judged constrained (Save-Data upstream).
        #expect(try Self.get(client, origin.url("/c")).status == 200)
        #expect(origin.requests.last?.value(of: "Save-Data") == "on")

        let mode = try proxy.admin().get("/mode").object
        #expect(mode["mode"] as? String == "constrained")
        #expect(mode["source"] as? String == "budget")
        #expect(mode["budget"] as? String == "daily")
        let document = try Self.budget(proxy, "daily")
        #expect(document["spent"] as? Bool == true)
        #expect(document["remaining"] as? Int == 0)
        #expect(document["resetsAt"] as? String != nil)
        let metrics = try proxy.admin().get("/metrics").bodyText
        #expect(metrics.contains("datamode_budget_spent{budget=\"daily\"} 1\n"))
        #expect(metrics.contains("datamode_budget_used_bytes{budget=\"daily\"} "))

        // POST /budgets/daily/reset: whole again.
        let reset = try proxy.admin().request("POST", "/budgets/daily/reset")
        #expect(reset.status == 200)
        #expect(reset.object["used"] as? Int == 0)
        #expect(try Self.get(client, origin.url("/d"), headers: [("Allow-Constrained", "?0")]).status == 200)
    }

    @Test("A spent budget's mode brings that mode's link profile to the traffic it matches")
    func spentBudgetBringsTheProfile() throws {
        let origin = try RecordingOrigin { _ in .ok(String(repeating: "q", count: 5_000)) }
        defer { origin.stop() }
        let proxy = try ProxyHarness(yaml: """
            profiles:
              slow-start: {down: 1Gbit, up: 1Gbit, latency: 500ms}
            conditions:
              constrained: {profile: slow-start}
            budgets:
              - {name: daily, bytes: 1KB, period: day, then: constrained}
            """)
        defer { proxy.stop() }
        let client = try proxy.connect()
        var started = ContinuousClock.now
        #expect(try Self.get(client, origin.url("/1")).status == 200)
        #expect(ContinuousClock.now - started < .milliseconds(450), "not shaped before the budget is spent")
        Self.waitForPublication()
        started = ContinuousClock.now
        #expect(try Self.get(client, origin.url("/2")).status == 200)
        #expect(ContinuousClock.now - started >= .milliseconds(490), "the constrained profile's latency once spent")
    }

    @Test("reject: matching traffic gets 403 budget-exhausted naming the budget; other clients go on")
    func rejectIsPerMatch() throws {
        let origin = try RecordingOrigin { _ in .ok(String(repeating: "y", count: 5_000)) }
        defer { origin.stop() }
        let proxy = try ProxyHarness(yaml: """
            budgets:
              - {name: lab, bytes: 2KB, period: hour, match: {client: 127.0.0.2/32}, then: reject}
            """)
        defer { proxy.stop() }
        let other = try proxy.connect(source: "127.0.0.2")
        #expect(try Self.get(other, origin.url("/1")).status == 200)
        Self.waitForPublication()
        let refused = try Self.get(other, origin.url("/2"))
        #expect(refused.status == 403)
        #expect(refused.value(of: "Content-Type") == "application/problem+json")
        let problem = try #require(try JSONSerialization.jsonObject(with: Data(refused.body)) as? [String: Any])
        #expect(problem["error"] as? String == "budget-exhausted")
        #expect(problem["budget"] as? String == "lab")
        #expect(problem["resetsAt"] is String)
        #expect(origin.requests.count == 1, "nothing is sent upstream for a refused request")
        // The budget matches only 127.0.0.2: the global mode is untouched.
        let mine = try proxy.connect()
        #expect(try Self.get(mine, origin.url("/3")).status == 200)
        #expect(try proxy.admin().get("/mode").object["source"] as? String != "budget")
    }

    @Test("What counts: origin bytes both ways, heads included; the proxy's own answers cost nothing")
    func whatCounts() throws {
        let origin = try RecordingOrigin(maxRecordedBodyBytes: 1 << 20) { _ in .ok(String(repeating: "z", count: 30_000)) }
        defer { origin.stop() }
        let proxy = try ProxyHarness(yaml: """
            mode: constrained
            budgets:
              - {name: all, bytes: 1GB, period: month, then: reject}
            """)
        defer { proxy.stop() }
        let client = try proxy.connect()
        // Refused by the mode: nothing reaches the origin, nothing counts.
        #expect(try Self.get(client, origin.url("/no"), headers: [("Allow-Constrained", "?0")]).status == 403)
        #expect(proxy.instance.budgets.used(0) == 0)

        let upload = String(repeating: "u", count: 10_000)
        try client.send(RequestText.make("POST", origin.url("/up"), body: upload))
        #expect(try client.readResponse().status == 200)
        let sentToOrigin = Int(origin.bytesReceived)
        let used = proxy.instance.budgets.used(0)
        // The request as the origin got it (head and body) plus the 30 kB response and its head.
        #expect(sentToOrigin > 10_000)
        #expect(used >= UInt64(sentToOrigin + 30_000 + 17), "used \(used), origin got \(sentToOrigin)")
        #expect(used <= UInt64(sentToOrigin + 30_000 + 200), "used \(used), origin got \(sentToOrigin)")
    }

    @Test("Tunnel bytes count both ways; hard: true closes a tunnel in flight once spent")
    func tunnelsAndHard() throws {
        let echo = try EchoServer()
        defer { echo.stop() }
        let proxy = try ProxyHarness(yaml: """
            connect: {ports: [\(echo.port)]}
            budgets:
              - {name: cap, bytes: 100KB, period: day, then: reject, hard: true}
            """)
        defer { proxy.stop() }
        let client = try proxy.connect(timeout: .seconds(10))
        #expect(try client.openTunnel(to: "127.0.0.1:\(echo.port)").status == 200)
        let small = [UInt8](repeating: 7, count: 20_000)
        #expect(try client.echoRoundTrip(small) == small)
        // 20 kB each way (the relay counts right after the client may have read the last byte).
        Self.waitForPublication()
        #expect(proxy.instance.budgets.used(0) == 40_000)
        // 1 MB each way would spend it many times over: the tunnel is closed before the echo completes.
        let big = [UInt8](repeating: 9, count: 1_000_000)
        #expect(throws: (any Error).self) { _ = try client.echoRoundTrip(big) }
        Self.waitForPublication()
        let next = try proxy.connect()
        let refused = try next.openTunnel(to: "127.0.0.1:\(echo.port)")
        #expect(refused.status == 403)
        #expect(refused.bodyText.contains("budget-exhausted"))
    }

    @Test("Period boundary (UTC, injected clock): a spent budget lifts at the next period, never by a clock going back")
    func periodBoundary() throws {
        let clock = SettableWallClock(seconds: Self.lateEvening)
        let origin = try RecordingOrigin { _ in .ok(String(repeating: "p", count: 4_000)) }
        defer { origin.stop() }
        let proxy = try ProxyHarness(yaml: """
            budgets:
              - {name: daily, bytes: 1KB, period: day, then: reject}
            """, clock: clock)
        defer { proxy.stop() }
        let client = try proxy.connect()
        #expect(try Self.get(client, origin.url("/1")).status == 200)
        Self.waitForPublication()
        #expect(try Self.get(client, origin.url("/2")).status == 403)
        #expect(try Self.budget(proxy, "daily")["resetsAt"] as? String == "2026-01-02T00:00:00Z")

        // The clock jumps back a day: still the same period, still spent.
        clock.set(seconds: Self.lateEvening - 86_400)
        Self.waitForPublication()
        #expect(try Self.get(client, origin.url("/3")).status == 403)
        #expect(try Self.budget(proxy, "daily")["spent"] as? Bool == true)

        // Past midnight UTC: a new period, the allowance whole again.
        clock.set(seconds: Self.lateEvening + 61)
        Self.waitForPublication()
        let document = try Self.budget(proxy, "daily")
        #expect(document["spent"] as? Bool == false)
        #expect(document["used"] as? Int == 0)
        #expect(document["resetsAt"] as? String == "2026-01-03T00:00:00Z")
        #expect(try Self.get(client, origin.url("/4")).status == 200)
    }

    @Test("Usage survives a restart: a clean stop persists it, and the next start carries on in the same period")
    func persistsAcrossRestart() throws {
        let origin = try RecordingOrigin { _ in .ok(String(repeating: "r", count: 50_000)) }
        defer { origin.stop() }
        let state = FileManager.default.temporaryDirectory.appendingPathComponent("datamode-budget-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: state) }
        let yaml = "budgets:\n  - {name: monthly, bytes: 1MB, period: month, then: constrained}\n"
        var used: UInt64 = 0
        do {
            let proxy = try ProxyHarness(yaml: yaml, stateDirectory: state)
            let client = try proxy.connect()
            #expect(try Self.get(client, origin.url("/1")).status == 200)
            used = proxy.instance.budgets.used(0)
            #expect(used > 50_000)
            proxy.stop()
        }
        let saved = try #require(try JSONSerialization.jsonObject(
            with: Data(contentsOf: URL(fileURLWithPath: state + "/budgets.json"))) as? [String: Any])
        #expect(((saved["budgets"] as? [String: Any])?["monthly"] as? [String: Any])?["used"] as? Int == Int(used))
        let proxy = try ProxyHarness(yaml: yaml, stateDirectory: state)
        defer { proxy.stop() }
        #expect(proxy.instance.budgets.used(0) == used)
        #expect(try Self.budget(proxy, "monthly")["used"] as? Int == Int(used))
    }
}
