// End-to-end tests of sessions and schedules under `store.kind: redis` (SPEC §19 with §12): three real proxies on
// a real redis-server started by the test (`Fleet`, FleetStoreEndToEndTests.swift). A session set or deleted through
// one proxy is in force on the others within a second; a session used on one proxy does not expire on the others; a
// schedule set through one runs on all three from the same start and is cancelled everywhere by another; a Redis
// emptied or restarted empty is seeded again with them; a bad session or schedule value is refused with a log line
// naming the key.
import DatamodeTestSupport
import Foundation
import Synchronization
import Testing

@Suite("FleetStore: sessions and schedules shared by proxies", .serialized)
struct FleetSessionsEndToEndTests {
    static let sessions = "sessions: {enabled: true}"

    /// A request in session `session` that does not allow constrained access: 403 while the session is
    /// constrained, 200 while it is normal, 400 when the proxy knows no such session.
    static func status(_ fleet: Fleet, _ index: Int, _ origin: RecordingOrigin, session: String) -> Int {
        let request = RequestText.make("GET", origin.url("/s"), headers: [("Data-Mode-Session", session), ("Allow-Constrained", "?0")])
        return (try? RawHTTPClient.exchange(request, to: fleet.proxies[index].port))?.status ?? 0
    }

    /// Waits until `index`'s answer in session `session` is `status`; how long it took, nil when not within `timeout`.
    static func waitForStatus(_ fleet: Fleet, _ index: Int, _ origin: RecordingOrigin, session: String, _ status: Int,
                              timeout: Duration = .seconds(1), from started: ContinuousClock.Instant = .now) -> Duration? {
        let done = AdminPolling.until(timeout: timeout - (ContinuousClock.now - started), interval: .milliseconds(5)) {
            Self.status(fleet, index, origin, session: session) == status
        }
        return done ? ContinuousClock.now - started : nil
    }

    static func sessionIDs(_ admin: AdminAPIClient) -> [String] {
        ((try? admin.get("/sessions"))?.object["sessions"] as? [[String: Any]] ?? []).compactMap { $0["id"] as? String }
    }

    static func schedules(_ admin: AdminAPIClient) -> [[String: Any]] {
        (try? admin.get("/schedule"))?.object["schedules"] as? [[String: Any]] ?? []
    }

    static func refusals(_ proxy: ProxyProcess, naming key: String) -> Int {
        proxy.stderr.split(separator: "\n").filter { $0.contains("shared state refused") && $0.contains(key) }.count
    }

    @Test("A session set through proxy 1 judges requests through 2 and 3 within 1 s, with a mode event there; changed through 3, deleted through 2: unknown-session on 1")
    func sessionSharedByAll() throws {
        let origin = try RecordingOrigin { _ in .ok("hello") }
        defer { origin.stop() }
        let fleet = try Fleet(extraConfig: Self.sessions)
        #expect(Self.status(fleet, 1, origin, session: "rig") == 400, "no session yet")
        let events = try EventStreamClient(port: fleet.proxies[1].adminPort, timeout: .seconds(3))
        defer { events.close() }
        #expect(try events.next("mode").object["scope"] as? String == "global", "the stream's first event")

        let started = ContinuousClock.now
        #expect(try fleet.admins[0].put("/sessions/rig", #"{"mode": "constrained", "profile": "my-sat"}"#).status == 201)
        for index in [1, 2] {
            let took = Self.waitForStatus(fleet, index, origin, session: "rig", 403, from: started)
            #expect(took != nil, "proxy \(index + 1) does not judge by the session within 1 s: \(Self.status(fleet, index, origin, session: "rig"))")
            print("fleet: a session set through proxy 1 judges requests through proxy \(index + 1) after \(took.map { "\($0)" } ?? "never")")
        }
        let event = try events.next("mode").object
        #expect(event["scope"] as? String == "rig" && event["mode"] as? String == "constrained" && event["source"] as? String == "api",
                "proxy 2's event: \(event)")
        let document = try fleet.admins[2].get("/sessions/rig").object
        #expect(document["mode"] as? String == "constrained" && document["profile"] as? String == "my-sat", "\(document)")

        // Changed through proxy 3: normal on all, the event on proxy 2 again.
        #expect(try fleet.admins[2].put("/sessions/rig", #"{"mode": "normal"}"#).status == 200)
        for index in [0, 1] {
            #expect(Self.waitForStatus(fleet, index, origin, session: "rig", 200) != nil, "proxy \(index + 1) still constrained")
        }
        #expect(try events.next("mode").object["mode"] as? String == "normal")
        #expect(try fleet.admins[0].get("/sessions/rig").object["profile"] is NSNull)

        // Counters are the answering proxy's own: requests through proxy 3 only, counted by proxy 3 only.
        let before = (try fleet.admins[0].get("/sessions/rig")).object["requestsTotal"] as? Int ?? -1
        for _ in 0..<5 { #expect(Self.status(fleet, 2, origin, session: "rig") == 200) }
        let third = try fleet.admins[2].get("/sessions/rig").object["requestsTotal"] as? Int ?? 0
        #expect(third >= 5)
        #expect(try fleet.admins[0].get("/sessions/rig").object["requestsTotal"] as? Int == before)

        // Deleted through proxy 2: unknown on 1 and 3 within a second.
        let deleted = ContinuousClock.now
        #expect(try fleet.admins[1].delete("/sessions/rig").status == 200)
        for index in [0, 2] {
            #expect(Self.waitForStatus(fleet, index, origin, session: "rig", 400, from: deleted) != nil, "proxy \(index + 1) still knows rig")
        }
        let unknown = try RawHTTPClient.exchange(RequestText.make("GET", origin.url("/s"), headers: [("Data-Mode-Session", "rig")]),
                                                 to: fleet.proxies[0].port)
        #expect(unknown.problem?.error == "unknown-session")
        for admin in fleet.admins { #expect(Self.sessionIDs(admin).isEmpty) }
        #expect(try fleet.redis.get(fleet.prefix + "session:rig") == nil)
    }

    @Test("A session used through proxy 2 alone does not expire on proxies 1 and 3; idle everywhere, it expires everywhere")
    func idleExpiryFleetWide() throws {
        let origin = try RecordingOrigin { _ in .ok("hello") }
        defer { origin.stop() }
        let fleet = try Fleet(extraConfig: "sessions: {enabled: true, idle-expiry: 2s}")
        #expect(try fleet.admins[0].put("/sessions/busy", #"{"mode": "normal"}"#).status == 201)
        #expect(Self.waitForStatus(fleet, 1, origin, session: "busy", 200) != nil)
        // Twice the idle expiry of traffic through proxy 2 only (GET /sessions lists without touching a session).
        let started = ContinuousClock.now
        while ContinuousClock.now - started < .seconds(4) {
            #expect(Self.status(fleet, 1, origin, session: "busy") == 200)
            Thread.sleep(forTimeInterval: 0.2)
        }
        for (index, admin) in fleet.admins.enumerated() {
            #expect(Self.sessionIDs(admin) == ["busy"], "proxy \(index + 1) expired a session in use on proxy 2")
        }
        #expect(Self.status(fleet, 2, origin, session: "busy") == 200)
        // Idle on every proxy now: gone from all within the expiry, a refresh tick and a sync.
        let idle = ContinuousClock.now
        #expect(AdminPolling.until(timeout: .seconds(5)) { fleet.admins.allSatisfy { Self.sessionIDs($0).isEmpty } },
                "\(fleet.admins.map(Self.sessionIDs))")
        let took = ContinuousClock.now - idle
        #expect(took >= .milliseconds(1500), "expired early: \(took)")
        #expect(Self.status(fleet, 0, origin, session: "busy") == 400)
        print("fleet: an idle session (idle-expiry 2s) gone from all three proxies \(took) after its last use")
    }

    @Test("A schedule set through proxy 1 steps on all three at its nominal times; cancelled through proxy 3; a mode set through proxy 2 cancels another")
    func scheduleSharedByAll() throws {
        let fleet = try Fleet()
        let steps = #"{"steps": [{"after": "300ms", "mode": "constrained"}, {"after": "300ms", "mode": "expensive"}, {"after": "300ms", "mode": "normal"}]}"#
        let started = ContinuousClock.now
        #expect(try fleet.admins[0].put("/schedule", steps).status == 200)
        let sent = ContinuousClock.now - started
        // When each proxy is first seen in each step's mode.
        let seen = Mutex<[String: [Duration]]>([:])
        let group = DispatchGroup()
        for admin in fleet.admins {
            group.enter()
            Thread.detachNewThread {
                defer { group.leave() }
                var first: [String: Duration] = [:]
                while ContinuousClock.now - started < .seconds(2) && first.count < 3 {
                    if let facts = try? modeFacts(admin), facts.source == "schedule", first[facts.mode] == nil {
                        first[facts.mode] = ContinuousClock.now - started
                    }
                    Thread.sleep(forTimeInterval: 0.002)
                }
                seen.withLock { all in for (mode, at) in first { all[mode, default: []].append(at) } }
            }
        }
        group.wait()
        let times = seen.withLock { $0 }
        for (step, mode) in ["constrained", "expensive", "normal"].enumerated() {
            let nominal = Duration.milliseconds(300 * (step + 1))
            let at = times[mode] ?? []
            #expect(at.count == 3, "\(mode) seen on \(at.count) proxies of 3")
            // Never before the nominal time (counted from the PUT's start); within SPEC §12's 50 ms of it, plus the
            // PUT's own round trip and one polling round.
            #expect(at.allSatisfy { $0 >= nominal && $0 <= nominal + sent + .milliseconds(100) }, "\(mode): \(at) for \(nominal)")
        }
        print("fleet schedule: first seen per step on each proxy \(times), the PUT took \(sent)")

        // A repeated schedule through 1, shown on all, cancelled through 3 on all.
        let long = #"{"steps": [{"after": "30s", "mode": "constrained"}, {"after": "30s", "mode": "normal"}], "repeat": true}"#
        #expect(try fleet.admins[0].put("/schedule", long).status == 200)
        #expect(AdminPolling.until(timeout: .seconds(1)) { fleet.admins.allSatisfy { Self.schedules($0).count == 1 } })
        let nextAt = fleet.admins.compactMap { rfc3339(Self.schedules($0).first?["nextAt"]) }
        #expect(nextAt.count == 3 && nextAt.max()!.timeIntervalSince(nextAt.min()!) <= 0.005,
                "one timeline, one next step (to the millisecond the shared start is written in): \(nextAt)")
        #expect(try fleet.admins[2].delete("/schedule").status == 204)
        #expect(AdminPolling.until(timeout: .seconds(1)) { fleet.admins.allSatisfy { Self.schedules($0).isEmpty } },
                "\(fleet.admins.map(Self.schedules))")
        #expect(try fleet.redis.command(["HLEN", fleet.prefix + "state:schedules"]) == "0")

        // Another, cancelled by PUT /mode through 2: the API mode on all, no schedule anywhere.
        #expect(try fleet.admins[0].put("/schedule", long).status == 200)
        #expect(AdminPolling.until(timeout: .seconds(1)) { fleet.admins.allSatisfy { Self.schedules($0).count == 1 } })
        #expect(try fleet.admins[1].put("/mode", #"{"mode": "expensive"}"#).status == 200)
        #expect(fleet.waitForMode("expensive") != nil)
        #expect(AdminPolling.until(timeout: .seconds(1)) { fleet.admins.allSatisfy { Self.schedules($0).isEmpty } })
        for admin in fleet.admins { #expect(try modeFacts(admin)?.source == "api") }
    }

    @Test("PUT /mode repeating the API mode (same mode, same second) while a schedule runs: the API mode again on every proxy, not only the one written to")
    func repeatedModeEndsSchedule() throws {
        let fleet = try Fleet()
        // Everything below within one wall-clock second, so that the second PUT /mode writes the same bytes as the first.
        let fraction = Date().timeIntervalSince1970.truncatingRemainder(dividingBy: 1)
        if fraction > 0.2 { Thread.sleep(forTimeInterval: 1.02 - fraction) }
        let second = Int(Date().timeIntervalSince1970)
        #expect(try fleet.admins[0].put("/mode", #"{"mode": "constrained"}"#).status == 200)
        #expect(try fleet.admins[0].put("/schedule", #"{"steps": [{"after": "0ms", "mode": "expensive"}, {"after": "60s", "mode": "normal"}]}"#).status == 200)
        #expect(fleet.waitForMode("expensive", timeout: .milliseconds(500)) != nil, "\(fleet.modes())")
        #expect(try fleet.admins[1].put("/mode", #"{"mode": "constrained"}"#).status == 200)
        try #require(Int(Date().timeIntervalSince1970) == second, "the machine was too slow to stay within one second; nothing shown")
        #expect(fleet.waitForMode("constrained") != nil, "\(fleet.modes())")
        for admin in fleet.admins { #expect(try modeFacts(admin)?.source == "api") }
    }

    @Test("A proxy that joins while a schedule runs takes the fleet's place in the timeline; a session's schedule runs on all")
    func lateJoinerAndSessionSchedule() throws {
        let origin = try RecordingOrigin { _ in .ok("hello") }
        defer { origin.stop() }
        let fleet = try Fleet(count: 2, extraConfig: Self.sessions)
        let steps = #"{"steps": [{"after": "0ms", "mode": "expensive"}, {"after": "400ms", "mode": "constrained"}, {"after": "60s", "mode": "normal"}]}"#
        #expect(try fleet.admins[0].put("/schedule", steps).status == 200)
        #expect(fleet.waitForMode("constrained", timeout: .seconds(2)) != nil, "\(fleet.modes())")
        let config = try String(contentsOfFile: fleet.proxies[0].configPath, encoding: .utf8)
        let late = try ProxyProcess(config: config)
        defer { halt(late) }
        let admin = AdminAPIClient(port: late.adminPort)
        #expect(AdminPolling.until(timeout: .seconds(2)) { (try? modeFacts(admin)) == ModeFacts("constrained", true, false, "schedule") },
                "\(String(describing: try? modeFacts(admin)))")
        #expect(Self.schedules(admin).first?["next"] as? Int == 2, "the late proxy waits for the third step: \(Self.schedules(admin))")

        // A session's schedule: its requests through proxy 2 constrained at the step, the global mode untouched.
        #expect(try fleet.admins[0].put("/sessions/rig", #"{"mode": "normal"}"#).status == 201)
        #expect(Self.waitForStatus(fleet, 1, origin, session: "rig", 200) != nil)
        #expect(try fleet.admins[0].put("/schedule", #"{"session": "rig", "steps": [{"after": "300ms", "mode": "constrained"}]}"#).status == 200)
        #expect(Self.waitForStatus(fleet, 1, origin, session: "rig", 403, timeout: .seconds(2)) != nil)
        #expect(try fleet.admins[1].get("/sessions/rig").object["source"] as? String == "schedule")
        // Setting the session through proxy 2 ends the timeline everywhere and keeps the API mode.
        #expect(try fleet.admins[1].put("/sessions/rig", #"{"mode": "normal"}"#).status == 200)
        #expect(Self.waitForStatus(fleet, 0, origin, session: "rig", 200) != nil)
        #expect(AdminPolling.until(timeout: .seconds(1)) {
            fleet.admins.allSatisfy { Self.schedules($0).allSatisfy { $0["session"] as? String != "rig" } }
        })
    }

    @Test("Redis emptied (FLUSHALL), then killed and started empty: seeded again with the sessions and the schedule; writes 503 while down")
    func seededAgain() throws {
        let origin = try RecordingOrigin { _ in .ok("hello") }
        defer { origin.stop() }
        let fleet = try Fleet(extraConfig: Self.sessions)
        #expect(try fleet.admins[0].put("/sessions/rig", #"{"mode": "constrained"}"#).status == 201)
        let long = #"{"steps": [{"after": "60s", "mode": "constrained"}]}"#
        #expect(try fleet.admins[1].put("/schedule", long).status == 200)
        #expect(AdminPolling.until(timeout: .seconds(1)) { fleet.admins.allSatisfy { Self.schedules($0).count == 1 } })
        let sessionKey = fleet.prefix + "session:rig"
        let value = try fleet.redis.get(sessionKey)
        let schedule = try fleet.redis.command(["HGET", fleet.prefix + "state:schedules", "global"])
        #expect(value?.contains("constrained") == true && schedule.contains("60000ms"), "\(value ?? "none") \(schedule)")

        _ = try fleet.redis.command(["FLUSHALL"])
        #expect(AdminPolling.until(timeout: .seconds(3)) {
            (try? fleet.redis.get(sessionKey)) == value
                && (try? fleet.redis.command(["HGET", fleet.prefix + "state:schedules", "global"])) == schedule
        }, "not seeded again after FLUSHALL: \((try? fleet.redis.command(["KEYS", "*"])) ?? "")")
        #expect(try fleet.redis.command(["SISMEMBER", fleet.prefix + "sessions", "rig"]) == "1")
        let ttl = Int(try fleet.redis.command(["PTTL", sessionKey])) ?? -1
        #expect(ttl > 0 && ttl <= 3_600_000, "the seeded session expires unless used: \(ttl)")
        Thread.sleep(forTimeInterval: 1.2)
        for index in 0..<3 { #expect(Self.status(fleet, index, origin, session: "rig") == 403, "proxy \(index + 1) lost the session") }
        for admin in fleet.admins { #expect(Self.schedules(admin).count == 1) }

        fleet.redis.kill()
        #expect(AdminPolling.until(timeout: .seconds(3)) {
            fleet.admins.allSatisfy { (try? $0.get("/healthz"))?.object["store"] as? String == "down" }
        })
        for (path, body) in [("/sessions/other", #"{"mode": "normal"}"#), ("/schedule", long)] {
            let refused = try fleet.admins[2].put(path, body)
            #expect(refused.status == 503 && refused.errorCode == "store-unavailable", "PUT \(path): \(refused.status) \(refused.bodyText)")
        }
        #expect(try fleet.admins[0].delete("/sessions/rig").errorCode == "store-unavailable")
        #expect(try fleet.admins[0].delete("/schedule").errorCode == "store-unavailable")
        for index in 0..<3 { #expect(Self.status(fleet, index, origin, session: "rig") == 403, "last state known kept") }
        #expect(Self.status(fleet, 2, origin, session: "other") == 400, "nothing changed alone")

        try fleet.redis.start()
        #expect(AdminPolling.until(timeout: .seconds(5)) {
            (try? fleet.redis.get(sessionKey)) == value
                && (try? fleet.redis.command(["HGET", fleet.prefix + "state:schedules", "global"])) == schedule
        }, "not seeded again after a restart")
        Thread.sleep(forTimeInterval: 1.2)
        for index in 0..<3 { #expect(Self.status(fleet, index, origin, session: "rig") == 403) }
        for admin in fleet.admins { #expect(Self.schedules(admin).count == 1) }
        #expect(try fleet.admins[2].delete("/sessions/rig").status == 200)
        #expect(Self.waitForStatus(fleet, 0, origin, session: "rig", 400) != nil)
    }

    @Test("A malformed session or schedule written into Redis is refused once by every proxy, naming the key; the running state is kept")
    func badValuesRefused() throws {
        let origin = try RecordingOrigin { _ in .ok("hello") }
        defer { origin.stop() }
        let fleet = try Fleet(extraConfig: Self.sessions)
        #expect(try fleet.admins[0].put("/sessions/rig", #"{"mode": "constrained"}"#).status == 201)
        #expect(try fleet.admins[0].put("/schedule", #"{"steps": [{"after": "60s", "mode": "expensive"}]}"#).status == 200)
        for index in 0..<3 { #expect(Self.waitForStatus(fleet, index, origin, session: "rig", 403) != nil) }
        #expect(AdminPolling.until(timeout: .seconds(1)) { fleet.admins.allSatisfy { Self.schedules($0).count == 1 } })

        let sessionKey = fleet.prefix + "session:rig"
        _ = try fleet.redis.command(["SET", sessionKey, #"{"mode": "warp-speed", "since": 1, "incarnation": "x"}"#])
        _ = try fleet.redis.command(["PUBLISH", fleet.prefix + "changes", "session:rig"])
        let schedulesKey = fleet.prefix + "state:schedules"
        _ = try fleet.redis.command(["HSET", schedulesKey, "global", #"{"steps": "soon", "start": 1}"#])
        _ = try fleet.redis.command(["PUBLISH", fleet.prefix + "changes", "schedule"])
        for (index, proxy) in fleet.proxies.enumerated() {
            #expect(AdminPolling.until(timeout: .seconds(3)) {
                proxy.stderr.split(separator: "\n").contains { $0.contains("shared state refused") && $0.contains(sessionKey) && $0.contains("not a mode name") }
            }, "proxy \(index + 1): no refusal naming \(sessionKey):\n\(proxy.stderr.suffix(2000))")
            #expect(AdminPolling.until(timeout: .seconds(3)) {
                proxy.stderr.split(separator: "\n").contains { $0.contains("shared state refused") && $0.contains(schedulesKey) && $0.contains("global") }
            }, "proxy \(index + 1): no refusal naming \(schedulesKey)")
        }
        // Refused once, not at every sync; the session and the schedule run on.
        Thread.sleep(forTimeInterval: 1.5)
        for proxy in fleet.proxies {
            #expect(Self.refusals(proxy, naming: sessionKey) == 1)
            #expect(Self.refusals(proxy, naming: schedulesKey) == 1)
        }
        for index in 0..<3 { #expect(Self.status(fleet, index, origin, session: "rig") == 403) }
        for admin in fleet.admins { #expect(Self.schedules(admin).count == 1) }
        // A good value after the bad one is applied.
        #expect(try fleet.admins[1].put("/sessions/rig", #"{"mode": "normal"}"#).status == 200)
        for index in 0..<3 { #expect(Self.waitForStatus(fleet, index, origin, session: "rig", 200) != nil) }
    }
}
