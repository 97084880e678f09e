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
final class Fleet {
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
}
