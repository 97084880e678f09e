// End-to-end tests of `store.kind: redis` (SPEC §19): three real proxies share a real redis-server that the test
// starts on a free loopback port. A change through one proxy's admin API is in force on all three within a second;
// a bad value written into Redis is refused with a log line naming the key; Redis killed mid-traffic stops no
// request, admin writes answer 503 store-unavailable, and Redis started again (empty) is seeded again.
import DatamodeTestSupport
import Foundation
import Synchronization
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Three proxies on one Redis, each with its own state directory (the last state it knew).
final class Fleet: @unchecked Sendable {
    let redis: RedisServer
    let proxies: [ProxyProcess]
    let admins: [AdminAPIClient]
    let prefix = "fleet-test:"

    init(count: Int = 3, extraConfig: String = "") throws {
        redis = try RedisServer(password: "fleet secret")
        let directory = try ScratchDirectory.make("datamode-fleet")
        let passwordFile = directory + "/redis-password"
        try "fleet secret\n".write(toFile: passwordFile, atomically: true, encoding: .utf8)
        let config = """
            store:
              kind: redis
              redis: {url: "\(redis.url)", key-prefix: "\(prefix)", password-file: "\(passwordFile)"}
            profiles:
              my-sat: {down: 2Mbit, up: 256kbit, latency: 600ms, jitter: 20ms}
            \(extraConfig)
            """
        var proxies: [ProxyProcess] = []
        for _ in 0..<count { proxies.append(try ProxyProcess(config: config)) }
        self.proxies = proxies
        admins = proxies.map { AdminAPIClient(port: $0.adminPort) }
    }

    deinit {
        for proxy in proxies { halt(proxy) }
        redis.kill()
    }

    /// Waits until every proxy's `GET /mode` names `mode`; how long the slowest took, nil when one did not within
    /// `timeout`.
    func waitForMode(_ mode: String, timeout: Duration = .seconds(1)) -> Duration? {
        let started = ContinuousClock.now
        let all = AdminPolling.until(timeout: timeout, interval: .milliseconds(5)) {
            admins.allSatisfy { (try? modeFacts($0))?.mode == mode }
        }
        return all ? ContinuousClock.now - started : nil
    }

    func modes() -> [String] { admins.map { (try? modeFacts($0))?.mode ?? "(no answer)" } }
}

/// Requests served and failed by the traffic threads.
final class TrafficCounts: Sendable {
    let served = Atomic<Int>(0)
    let failures = Atomic<Int>(0)
    let stop = Atomic<Bool>(false)
}

@Suite("FleetStore: proxies sharing Redis", .serialized)
struct FleetStoreEndToEndTests {
    @Test("A mode, a link profile and a variant set through one proxy are in force on all three within 1 s")
    func changeSeenByAll() throws {
        let fleet = try Fleet()
        #expect(fleet.modes() == ["normal", "normal", "normal"])
        #expect(try fleet.admins[0].put("/mode", #"{"mode": "constrained"}"#).status == 200)
        let took = fleet.waitForMode("constrained")
        #expect(took != nil, "not on all within 1 s: \(fleet.modes())")
        for admin in fleet.admins { #expect(try modeFacts(admin)?.source == "api") }
        #expect(try fleet.redis.get(fleet.prefix + "state:mode")?.contains("constrained") == true)

        // Through another proxy: the last write wins everywhere.
        #expect(try fleet.admins[2].put("/mode", #"{"mode": "expensive"}"#).status == 200)
        #expect(fleet.waitForMode("expensive") != nil, "\(fleet.modes())")
        #expect(try fleet.admins[1].put("/conditions", #"{"profile": "my-sat"}"#).status == 200)
        #expect(AdminPolling.until(timeout: .seconds(1)) {
            fleet.admins.allSatisfy { (try? $0.get("/conditions"))?.object["profile"] as? String == "my-sat" }
        })
        #expect(try fleet.admins[0].putVariant("small", ["match": "http://img.example/*.jpg",
                                                         "target": "http://img.example/$1-s.jpg"]).status == 201)
        #expect(AdminPolling.until(timeout: .seconds(1)) {
            fleet.admins.allSatisfy { (try? $0.get("/variants"))?.array?.compactMap { $0["id"] as? String } == ["small"] }
        })
        #expect(try fleet.admins[1].delete("/mode").status == 200)
        #expect(fleet.waitForMode("normal") != nil)
        for admin in fleet.admins { #expect(try modeFacts(admin)?.source == "default") }
        // The password never reaches a log.
        for proxy in fleet.proxies { #expect(!proxy.stderr.contains("fleet secret")) }
        print("fleet: a mode change through one proxy in force on all three after \(took.map { "\($0)" } ?? "never")")
    }

    @Test("A bad value written into Redis is refused by every proxy with a log line naming the key; the running state is kept")
    func badValueRefused() throws {
        let fleet = try Fleet()
        #expect(try fleet.admins[0].put("/mode", #"{"mode": "constrained"}"#).status == 200)
        #expect(fleet.waitForMode("constrained") != nil)
        let key = fleet.prefix + "state:mode"
        _ = try fleet.redis.command(["SET", key, #"{"mode": "warp-speed"}"#])
        _ = try fleet.redis.command(["PUBLISH", fleet.prefix + "changes", "mode.json"])
        for proxy in fleet.proxies {
            #expect(AdminPolling.until(timeout: .seconds(3)) {
                proxy.stderr.split(separator: "\n").contains { $0.contains("shared state refused") && $0.contains(key) && $0.contains("not a mode name") }
            }, "no refusal naming \(key):\n\(proxy.stderr.suffix(2000))")
        }
        #expect(fleet.modes() == ["constrained", "constrained", "constrained"])
        // Refused once, not at every sync.
        Thread.sleep(forTimeInterval: 1.5)
        for proxy in fleet.proxies {
            #expect(proxy.stderr.split(separator: "\n").filter { $0.contains("shared state refused") }.count == 1)
        }
        // A good value after the bad one is applied.
        _ = try fleet.redis.command(["SET", key, #"{"mode": "normal"}"#])
        #expect(fleet.waitForMode("normal", timeout: .seconds(2)) != nil, "\(fleet.modes())")
    }

    @Test("Redis killed mid-traffic: requests go on, store down in /healthz and /metrics, admin writes 503; Redis back empty: seeded again, writes work")
    func redisKilledAndRestarted() throws {
        let origin = try RecordingOrigin { _ in .ok("hello") }
        defer { origin.stop() }
        let fleet = try Fleet()
        #expect(try fleet.admins[0].put("/mode", #"{"mode": "constrained"}"#).status == 200)
        #expect(fleet.waitForMode("constrained") != nil)
        #expect(try fleet.admins[0].get("/healthz").object["store"] as? String == "up")

        // Traffic through every proxy on threads of its own, while Redis dies and comes back.
        let counts = TrafficCounts()
        var threads: [Thread] = []
        for proxy in fleet.proxies {
            let port = proxy.port
            let thread = Thread {
                        while !counts.stop.load(ordering: .relaxed) {
                    let status = (try? RawHTTPClient.exchange(RequestText.make("GET", origin.url("/x"), headers: []), to: port))?.status
                    if status == 200 { counts.served.add(1, ordering: .relaxed) } else { counts.failures.add(1, ordering: .relaxed) }
                }
            }
            thread.start()
            threads.append(thread)
        }
        defer { counts.stop.store(true, ordering: .relaxed) }
        Thread.sleep(forTimeInterval: 0.3)
        fleet.redis.kill()
        #expect(AdminPolling.until(timeout: .seconds(3)) {
            fleet.admins.allSatisfy { (try? $0.get("/healthz"))?.object["store"] as? String == "down" }
        })
        let metrics = try fleet.admins[1].get("/metrics").bodyText
        #expect(metrics.contains("datamode_store_up{kind=\"redis\"} 0"), "\(metrics.split(separator: "\n").filter { $0.contains("store") })")
        let refused = try fleet.admins[2].put("/mode", #"{"mode": "normal"}"#)
        #expect(refused.status == 503 && refused.object["error"] as? String == "store-unavailable", "\(refused.status) \(refused.bodyText)")
        #expect(fleet.modes() == ["constrained", "constrained", "constrained"], "last state known kept, nothing changed alone")
        let servedWhileDown = counts.served.load(ordering: .relaxed)
        Thread.sleep(forTimeInterval: 0.3)
        #expect(counts.served.load(ordering: .relaxed) > servedWhileDown, "traffic stopped while Redis was down")

        try fleet.redis.start()
        #expect(AdminPolling.until(timeout: .seconds(5)) {
            fleet.admins.allSatisfy { (try? $0.get("/healthz"))?.object["store"] as? String == "up" }
        }, "not up again")
        // Redis came back empty: the proxies seeded it with the mode they knew, rather than forgetting it.
        #expect(AdminPolling.until(timeout: .seconds(2)) {
            (try? fleet.redis.get(fleet.prefix + "state:mode"))??.contains("constrained") == true
        }, "not seeded: \((try? fleet.redis.get(fleet.prefix + "state:mode")) ?? nil ?? "(none)")")
        #expect(fleet.modes() == ["constrained", "constrained", "constrained"])
        #expect(try fleet.admins[2].put("/mode", #"{"mode": "normal"}"#).status == 200)
        #expect(fleet.waitForMode("normal") != nil, "\(fleet.modes())")
        counts.stop.store(true, ordering: .relaxed)
        Thread.sleep(forTimeInterval: 0.2)
        #expect(counts.failures.load(ordering: .relaxed) == 0, "requests failed while Redis was down or coming back")
        #expect(counts.served.load(ordering: .relaxed) > 0)
        print("fleet: \(counts.served.load(ordering: .relaxed)) requests served across Redis's death and return, \(counts.failures.load(ordering: .relaxed)) failed")
    }

    @Test("A proxy started while Redis is down serves with the state it last knew, and joins when Redis is up")
    func startWithRedisDown() throws {
        let fleet = try Fleet(count: 1)
        #expect(try fleet.admins[0].put("/mode", #"{"mode": "constrained"}"#).status == 200)
        let stateDir = fleet.proxies[0].stateDirectory
        let config = try String(contentsOfFile: fleet.proxies[0].configPath, encoding: .utf8)
        halt(fleet.proxies[0])
        fleet.redis.kill()
        let restarted = try ProxyProcess(config: config, arguments: ["--state-dir", stateDir])
        defer { halt(restarted) }
        let admin = AdminAPIClient(port: restarted.adminPort)
        #expect(try modeFacts(admin)?.mode == "constrained")
        #expect(try admin.get("/healthz").object["store"] as? String == "down")
        try fleet.redis.start()
        #expect(AdminPolling.until(timeout: .seconds(5)) { (try? admin.get("/healthz"))?.object["store"] as? String == "up" })
        #expect(try admin.put("/mode", #"{"mode": "expensive"}"#).status == 200)
        #expect(try fleet.redis.get(fleet.prefix + "state:mode")?.contains("expensive") == true)
    }

    /// The shared budget's usage in Redis now (0: none yet): the proxies' shares in its hash, minus `reset` (summed
    /// here, not read from the script's own sum `added`, which must agree).
    static func counter(_ fleet: Fleet, _ name: String) throws -> UInt64 {
        let keys = try fleet.redis.command(["KEYS", fleet.prefix + "budget-shares:\(name):*"]).split(separator: "\n")
        guard let key = keys.first else { return 0 }
        let lines = try fleet.redis.command(["HGETALL", String(key)]).split(separator: "\n").map(String.init)
        var added: UInt64 = 0
        var taken: UInt64 = 0
        for position in stride(from: 0, to: lines.count - 1, by: 2) {
            let value = UInt64(lines[position + 1]) ?? 0
            switch lines[position] {
            case "reset": taken = value
            case "added": continue
            default: added += value
            }
        }
        return added > taken ? added - taken : 0
    }

    /// Runs requests through every proxy at full speed, one thread per proxy, until `done` says so; returns the
    /// times (since the start) and statuses of every answer.
    static func traffic(_ fleet: Fleet, _ url: String, until done: @escaping @Sendable ([Int]) -> Bool) -> [[(Duration, Int)]] {
        let results = Mutex<[[(Duration, Int)]]>(Array(repeating: [], count: fleet.proxies.count))
        let started = ContinuousClock.now
        let last = Mutex<[Int]>(Array(repeating: 0, count: fleet.proxies.count))
        let group = DispatchGroup()
        for (index, proxy) in fleet.proxies.enumerated() {
            let port = proxy.port
            group.enter()
            Thread.detachNewThread {
                defer { group.leave() }
                while !done(last.withLock { $0 }) && ContinuousClock.now - started < .seconds(30) {
                    let status = (try? RawHTTPClient.exchange(RequestText.make("GET", url, headers: []), to: port))?.status ?? 0
                    let at = ContinuousClock.now - started
                    results.withLock { $0[index].append((at, status)) }
                    last.withLock { $0[index] = status }
                }
            }
        }
        group.wait()
        return results.withLock { $0 }
    }

    @Test("A shared budget spent by traffic spread over three proxies at full speed refuses on all three; the overshoot stays within what the fleet moves in 300 ms")
    func sharedBudget() throws {
        let body = String(repeating: "x", count: 10_000)
        let origin = try RecordingOrigin { _ in .ok(body) }
        defer { origin.stop() }
        let budget: UInt64 = 20_000_000
        let fleet = try Fleet(extraConfig: "budgets:\n  - {name: fleet, bytes: 20MB, period: day, then: reject}")
        let results = Self.traffic(fleet, origin.url("/chunk")) { last in last.allSatisfy { $0 == 403 } }
        #expect(results.allSatisfy { $0.last?.1 == 403 }, "every proxy ends refusing: \(results.map { $0.last?.1 ?? 0 })")
        for (index, proxy) in fleet.proxies.enumerated() {
            let answer = try RawHTTPClient.exchange(RequestText.make("GET", origin.url("/after"), headers: []), to: proxy.port)
            #expect(answer.status == 403 && answer.bodyText.contains("budget-exhausted"), "proxy \(index): \(answer.status)")
            #expect(results[index].contains { $0.1 == 200 }, "proxy \(index) served part of the budget")
        }
        Thread.sleep(forTimeInterval: 0.3)
        let total = try Self.counter(fleet, "fleet")
        let successes = results.flatMap { $0 }.filter { $0.1 == 200 }.map(\.0).sorted()
        let perRequest = total / UInt64(max(1, successes.count))
        // The most requests the fleet answered in any 300 ms: one flush interval (100 ms), a round trip, and
        // SPEC §11's 100 ms for heads read after the spending byte, with room for a scheduler's hiccup.
        var window = 0
        var low = 0
        for high in successes.indices {
            while successes[high] - successes[low] > .milliseconds(300) { low += 1 }
            window = max(window, high - low + 1)
        }
        let overshoot = total > budget ? total - budget : 0
        #expect(total >= budget, "spent: \(total) of \(budget)")
        #expect(overshoot <= UInt64(window) * perRequest, "overshoot \(overshoot) bytes > \(window) requests of \(perRequest) bytes")
        for admin in fleet.admins {
            let used = (try admin.get("/budgets")).array?.first?["used"] as? Int ?? 0
            #expect(UInt64(used) >= budget, "each proxy sees the fleet's usage: \(used)")
        }
        print("fleet budget: \(successes.count) requests served of ~\(perRequest) bytes, shared counter \(total), overshoot \(overshoot) bytes (\(String(format: "%.1f", Double(overshoot) / Double(budget) * 100))%), bound \(UInt64(window) * perRequest)")
    }

    @Test("Redis killed and started again (empty) while three proxies count a budget: the counts add up afterwards, nothing reset, nothing lost")
    func budgetAcrossRedisDeath() throws {
        let origin = try RecordingOrigin { _ in .ok("0123456789") }
        defer { origin.stop() }
        let fleet = try Fleet(extraConfig: "budgets:\n  - {name: big, bytes: 10GB, period: month, then: constrained}")
        // What one request counts (the same request and answer each time), measured with Redis up.
        for _ in 0..<10 {
            #expect(try RawHTTPClient.exchange(RequestText.make("GET", origin.url("/n"), headers: []), to: fleet.proxies[0].port).status == 200)
        }
        #expect(AdminPolling.until(timeout: .seconds(2)) { (try? Self.counter(fleet, "big")) ?? 0 > 0 })
        Thread.sleep(forTimeInterval: 0.3)
        let perRequest = try Self.counter(fleet, "big") / 10
        #expect(perRequest > 0)

        let phase = Mutex(0)
        let killer = Thread {
            Thread.sleep(forTimeInterval: 0.3)
            fleet.redis.kill()
            Thread.sleep(forTimeInterval: 0.6)
            try? fleet.redis.start()
            Thread.sleep(forTimeInterval: 0.6)
            phase.withLock { $0 = 1 }
        }
        killer.start()
        let results = Self.traffic(fleet, origin.url("/n")) { _ in phase.withLock { $0 } == 1 }
        let served = results.flatMap { $0 }.filter { $0.1 == 200 }.count + 10
        let failed = results.flatMap { $0 }.filter { $0.1 != 200 }.count
        #expect(failed == 0, "requests failed while Redis died and came back")
        #expect(AdminPolling.until(timeout: .seconds(3)) { fleet.admins.allSatisfy { (try? $0.get("/healthz"))?.object["store"] as? String == "up" } })
        let expected = UInt64(served) * perRequest
        #expect(AdminPolling.until(timeout: .seconds(3)) { (try? Self.counter(fleet, "big")) ?? 0 >= expected },
                "counted \((try? Self.counter(fleet, "big")) ?? 0) of \(expected): bytes lost")
        Thread.sleep(forTimeInterval: 0.3)
        let total = try Self.counter(fleet, "big")
        // Exact: each proxy's share is sent as an absolute, so a flush sent again after its answer was lost adds nothing.
        #expect(total == expected, "shared counter \(total), served \(served) × \(perRequest) = \(expected)")
        for admin in fleet.admins {
            let used = UInt64((try admin.get("/budgets")).array?.first?["used"] as? Int ?? 0)
            #expect(used == total, "every proxy adopted the fleet's total: \(used) vs \(total)")
        }
        print("fleet budget across Redis's death: \(served) requests, counter \(total), expected \(expected)")
    }

    @Test("A Redis that stops answering (SIGSTOP): no request waits on it, admin writes answer 503 within the deadline, and all is well after SIGCONT")
    func redisStalled() throws {
        let origin = try RecordingOrigin { _ in .ok("hello") }
        defer { origin.stop() }
        let fleet = try Fleet(count: 2, extraConfig: "budgets:\n  - {name: big, bytes: 10GB, period: month, then: constrained}")
        #expect(try fleet.admins[0].put("/mode", #"{"mode": "expensive"}"#).status == 200)
        #expect(fleet.waitForMode("expensive") != nil)
        fleet.redis.pause()
        defer { fleet.redis.resume() }
        // Requests while Redis is frozen: answered at the usual pace (each under a second, whatever Redis does).
        for proxy in fleet.proxies {
            for _ in 0..<20 {
                let started = ContinuousClock.now
                let answer = try RawHTTPClient.exchange(RequestText.make("GET", origin.url("/s"), headers: []), to: proxy.port)
                #expect(answer.status == 200)
                #expect(ContinuousClock.now - started < .seconds(1), "a request waited on Redis")
            }
        }
        let started = ContinuousClock.now
        let refused = try fleet.admins[1].put("/mode", #"{"mode": "normal"}"#)
        #expect(refused.status == 503 && refused.object["error"] as? String == "store-unavailable", "\(refused.status) \(refused.bodyText)")
        #expect(ContinuousClock.now - started < .seconds(3))
        #expect(fleet.modes() == ["expensive", "expensive"])
        fleet.redis.resume()
        #expect(AdminPolling.until(timeout: .seconds(10)) {
            fleet.admins.allSatisfy { (try? $0.get("/healthz"))?.object["store"] as? String == "up" }
        })
        #expect(try fleet.admins[1].put("/mode", #"{"mode": "normal"}"#).status == 200)
        #expect(fleet.waitForMode("normal") != nil)
    }

    @Test("A clean stop sends what the proxy counted in its last moments: the shared counter is exact")
    func cleanStopFlushes() throws {
        let origin = try RecordingOrigin { _ in .ok("0123456789") }
        defer { origin.stop() }
        let fleet = try Fleet(count: 3, extraConfig: "budgets:\n  - {name: big, bytes: 10GB, period: month, then: constrained}")
        // One kept-alive client per proxy, so that the last requests and the SIGTERM are a few milliseconds apart.
        let clients = try fleet.proxies.map { try RawHTTPClient(port: $0.port) }
        defer { clients.forEach { $0.close() } }
        func request(_ index: Int) throws { #expect(try proxied(clients[index], origin.url("/n")).status == 200) }
        for _ in 0..<10 { try request(0) }
        #expect(AdminPolling.until(timeout: .seconds(2)) { (try? Self.counter(fleet, "big")) ?? 0 > 0 })
        Thread.sleep(forTimeInterval: 0.3)
        let perRequest = try Self.counter(fleet, "big") / 10
        var served = 10
        // Each proxy in turn: a burst, then SIGTERM at once (three chances for the burst to fall between two flushes).
        for index in fleet.proxies.indices {
            for _ in 0..<5 { try request(index) }
            served += 5
            fleet.proxies[index].signal(SIGTERM)
            #expect(fleet.proxies[index].waitForExit(timeout: 12) == 0)
        }
        #expect(try Self.counter(fleet, "big") == UInt64(served) * perRequest, "the last requests' bytes reached Redis before the exit")
    }

    @Test("Every proxy stopped, Redis started again empty: the proxies seed it from their state directories, exactly, and count on")
    func budgetAcrossFleetRestart() throws {
        let origin = try RecordingOrigin { _ in .ok("0123456789") }
        defer { origin.stop() }
        let fleet = try Fleet(count: 2, extraConfig: "budgets:\n  - {name: big, bytes: 10GB, period: month, then: constrained}")
        for _ in 0..<10 {
            #expect(try RawHTTPClient.exchange(RequestText.make("GET", origin.url("/n"), headers: []), to: fleet.proxies[0].port).status == 200)
        }
        #expect(AdminPolling.until(timeout: .seconds(2)) { (try? Self.counter(fleet, "big")) ?? 0 > 0 })
        Thread.sleep(forTimeInterval: 0.3)
        let perRequest = try Self.counter(fleet, "big") / 10
        for _ in 0..<5 {
            #expect(try RawHTTPClient.exchange(RequestText.make("GET", origin.url("/n"), headers: []), to: fleet.proxies[1].port).status == 200)
        }
        #expect(AdminPolling.until(timeout: .seconds(2)) { (try? Self.counter(fleet, "big")) ?? 0 == 15 * perRequest })
        // At the clean stop each reads the whole hash (the other's share with it) and keeps it; Redis loses everything.
        let configs = try fleet.proxies.map { try String(contentsOfFile: $0.configPath, encoding: .utf8) }
        for proxy in fleet.proxies {
            proxy.signal(SIGTERM)
            #expect(proxy.waitForExit(timeout: 12) == 0)
        }
        fleet.redis.kill()
        try fleet.redis.start()
        #expect(try Self.counter(fleet, "big") == 0)

        // The second proxy alone brings back both shares; the first, back too, adds nothing twice.
        let second = try ProxyProcess(config: configs[1], arguments: ["--state-dir", fleet.proxies[1].stateDirectory])
        defer { halt(second) }
        #expect(AdminPolling.until(timeout: .seconds(5)) { (try? Self.counter(fleet, "big")) ?? 0 == 15 * perRequest },
                "counter \((try? Self.counter(fleet, "big")) ?? 0), expected \(15 * perRequest)")
        let first = try ProxyProcess(config: configs[0], arguments: ["--state-dir", fleet.proxies[0].stateDirectory])
        defer { halt(first) }
        #expect(try RawHTTPClient.exchange(RequestText.make("GET", origin.url("/n"), headers: []), to: first.port).status == 200)
        #expect(AdminPolling.until(timeout: .seconds(5)) {
            ((try? AdminAPIClient(port: second.adminPort).get("/budgets"))?.array?.first?["used"] as? Int).map(UInt64.init) == 16 * perRequest
        })
        Thread.sleep(forTimeInterval: 0.3)
        #expect(try Self.counter(fleet, "big") == 16 * perRequest)
    }
}
