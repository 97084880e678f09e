// SPEC §18.2 through the real binary: a request that would be refused and asks to wait (`Prefer: wait=N`, or a
// rule's `hold`) is held, head only, nothing forwarded; a mode change lets it through with `Data-Mode-Held`, time
// running out refuses it as before, a client that leaves is dropped at once, `max-held` bounds them, and 10,000
// held at once are released together (memory per held request printed).
import DatamodeTestSupport
import Foundation
import Testing

@Suite("Held requests: end to end", .serialized)
struct HoldEndToEndTests {
    static let discretionary = [("Allow-Constrained", "?0")]

    static func held(_ admin: AdminAPIClient) throws -> Double {
        try MetricsScrape(admin.get("/metrics").bodyText).value("datamode_held_requests") ?? -1
    }

    @Test("held until PUT /mode lifts it: forwarded then, with Data-Mode-Held; nothing reaches the origin before")
    func releasedByModeChange() throws {
        let origin = try RecordingOrigin { _ in .ok("late but whole") }
        defer { origin.stop() }
        try withAdminProxy(config: "mode: constrained\n") { proxy, admin in
            let client = try RawHTTPClient(port: proxy.port)
            let start = Date()
            try client.send(RequestText.make("GET", origin.url("/sync"), headers: Self.discretionary + [("Prefer", "wait=20")]))
            #expect(AdminPolling.until { (try? Self.held(admin)) == 1 }, "the request is held")
            Thread.sleep(forTimeInterval: 0.4)
            #expect(origin.requests.isEmpty, "nothing is forwarded while held")
            #expect(try admin.put("/mode", #"{"mode": "normal"}"#).status == 200)
            let response = try client.readResponse()
            let elapsed = Date().timeIntervalSince(start)
            #expect(response.status == 200)
            #expect(response.bodyText == "late but whole")
            let heldFor = try #require(response.value(of: "Data-Mode-Held").flatMap { Int($0) }, "\(response.headText)")
            #expect(heldFor >= 400 && Double(heldFor) <= elapsed * 1000 + 50, "held \(heldFor) ms of \(elapsed) s")
            #expect(response.value(of: "Preference-Applied") == nil, "SPEC §18.2: the wait is the proxy's")
            #expect(origin.requests.count == 1)
            #expect(try Self.held(admin) == 0)
            // The connection goes on as any other.
            #expect(try proxied(client, origin.url("/next")).status == 200)
        }
    }

    @Test("time runs out: the refusal it would have had, after the wait (Prefer: wait and a rule's hold, the shorter)")
    func timesOut() throws {
        let config = """
            mode: constrained
            deferral: {max-hold: 5s}
            rules:
              - {name: sync, match: {path: "/sync/*"}, tags: {allow-constrained: false}, hold: 700ms}
            """
        try withAdminProxy(config: config) { proxy, admin in
            let client = try RawHTTPClient(port: proxy.port)
            let url = "http://127.0.0.1:9/report"
            var start = Date()
            let waited = try proxied(client, url, headers: Self.discretionary + [("Prefer", "wait=1")])
            var elapsed = Date().timeIntervalSince(start)
            #expect(waited.status == 403 && waited.problem?.error == "constrained", "\(waited.bodyText)")
            #expect(waited.value(of: "Data-Mode-Held") == nil)
            #expect(elapsed >= 0.95 && elapsed < 2.5, "wait=1 held \(elapsed) s")

            start = Date()
            let ruled = try proxied(client, "http://127.0.0.1:9/sync/a", headers: [("Prefer", "wait=3")])
            elapsed = Date().timeIntervalSince(start)
            #expect(ruled.status == 403, "\(ruled.bodyText)")
            #expect(elapsed >= 0.65 && elapsed < 2, "the rule's 700 ms beats wait=3: held \(elapsed) s")

            start = Date()
            let capped = try proxied(client, url, headers: Self.discretionary + [("Prefer", "wait=600")])
            elapsed = Date().timeIntervalSince(start)
            #expect(capped.status == 403)
            #expect(elapsed >= 4.9 && elapsed < 7, "max-hold 5s caps wait=600: held \(elapsed) s")

            start = Date()
            let unheld = try proxied(client, url, headers: Self.discretionary)
            #expect(unheld.status == 403 && Date().timeIntervalSince(start) < 0.5, "no wait asked: refused at once")
            #expect(try Self.held(admin) == 0)
        }
    }

    @Test("a client that leaves is dropped at once; max-held refuses one more at once")
    func clientLeavesAndLimit() throws {
        let origin = try RecordingOrigin { _ in .ok() }
        defer { origin.stop() }
        try withAdminProxy(config: "mode: constrained\ndeferral: {max-held: 2}\n") { proxy, admin in
            let leaving = try RawHTTPClient(port: proxy.port)
            try leaving.send(RequestText.make("GET", origin.url("/gone"), headers: Self.discretionary + [("Prefer", "wait=20")]))
            let staying = try RawHTTPClient(port: proxy.port)
            try staying.send(RequestText.make("GET", origin.url("/stays"), headers: Self.discretionary + [("Prefer", "wait=20")]))
            #expect(AdminPolling.until { (try? Self.held(admin)) == 2 })

            let start = Date()
            let third = try proxied(try RawHTTPClient(port: proxy.port), origin.url("/third"),
                                    headers: Self.discretionary + [("Prefer", "wait=20")])
            #expect(third.status == 403 && Date().timeIntervalSince(start) < 1, "max-held 2: the third is refused at once")

            leaving.close()
            #expect(AdminPolling.until(timeout: .seconds(2)) { (try? Self.held(admin)) == 1 }, "the one that left is dropped")
            #expect(try admin.put("/mode", #"{"mode": "normal"}"#).status == 200)
            #expect(try staying.readResponse().status == 200)
            Thread.sleep(forTimeInterval: 0.3)
            #expect(origin.requests.map(\.target) == ["/stays"], "the one that left is never forwarded")
            let log = try admin.get("/metrics").bodyText
            #expect(log.contains("client-aborted"), "the dropped request is counted as the client's abort")
        }
    }

    @Test("10,000 held at once are released together by one mode change")
    func tenThousand() throws {
        let count = 10_000
        let limit = DescriptorLimit.raise(to: 2 * count + 1_000)
        try #require(limit >= count + 500, "RLIMIT_NOFILE is \(limit)")
        // Released into a redirect variant that applies once the mode is expensive: answered by the proxy itself,
        // so the test measures holding and releasing, not an origin's 10,000 connections.
        let config = """
            mode: constrained
            deferral: {max-held: \(count), max-hold: 120s}
            variants:
              - {id: later, match: "http://bulk.example/*", target: "http://bulk.example/small/$1", action: redirect, when: expensive}
            """
        try withAdminProxy(config: config) { proxy, admin in
            let pid = proxy.process.processIdentifier
            let clients = try (0..<count).map { _ in try RawHTTPClient(port: proxy.port, timeout: .seconds(60)) }
            defer { for client in clients { client.close() } }
            try #require(AdminPolling.until(timeout: .seconds(30)) { (ProcessProbe.openDescriptorCount(pid) ?? 0) >= count })
            Thread.sleep(forTimeInterval: 1.5)  // idle connections park
            let idleRSS = ProcessProbe.residentKiB(pid) ?? 0
            for (index, client) in clients.enumerated() {
                try client.send(RequestText.make("GET", "http://bulk.example/\(index)",
                                                 headers: Self.discretionary + [("Prefer", "wait=120")]))
            }
            let allHeld = AdminPolling.until(timeout: .seconds(60)) { (try? Self.held(admin)) == Double(count) }
            try #require(allHeld, "held: \((try? Self.held(admin)) ?? -1)")
            let heldRSS = ProcessProbe.residentKiB(pid) ?? 0
            let start = Date()
            #expect(try admin.put("/mode", #"{"mode": "expensive"}"#).status == 200)
            var released = 0
            var slowest = 0.0
            for (index, client) in clients.enumerated() {
                let response = try client.readResponse()
                if response.status == 307, response.value(of: "Location") == "http://bulk.example/small/\(index)",
                   response.value(of: "Data-Mode-Held") != nil {
                    released += 1
                }
                slowest = max(slowest, Date().timeIntervalSince(start))
            }
            #expect(released == count)
            #expect(try Self.held(admin) == 0)
            print("[measure] \(count) held requests: RSS \(idleRSS) KiB idle-connected -> \(heldRSS) KiB held "
                  + "(\((heldRSS - idleRSS) * 1024 / count) B per held request over a parked connection); "
                  + "all released within \(Int(slowest * 1000)) ms of PUT /mode")
        }
    }
}
