// Socket-free tests of sessions and schedules read from the shared store (SPEC §19 with §12, `store.kind: redis`):
// what the admin API does with the values another proxy wrote, on the injected clocks.
import DatamodeAdmin
import DatamodePolicy
import DatamodeState
import Foundation
import Testing

@Suite("Shared sessions and schedules, applied")
struct SharedScopesTests {
    static let key = "p:state:schedules"

    /// The running schedules' scopes as `GET /schedule` lists them (`global` for the global mode).
    static func scopes(_ fixture: AdminFixture) -> [String] {
        (fixture.handle("GET", "/schedule").object["schedules"] as? [[String: Any]] ?? []).map { $0["session"] as? String ?? "global" }
    }

    static func modeEvents(_ fixture: AdminFixture) -> Int {
        fixture.emitted.value.filter { $0.text.hasPrefix("event: mode") }.count
    }

    @Test("a schedule read late runs from its shared start: the last step due applied once, the next awaited at its nominal time")
    func lateSchedule() throws {
        let fixture = try AdminFixture()
        let start = fixture.now * 1000 - 700
        let value = Array(#"{"steps": [{"after": "0ms", "mode": "expensive"}, {"after": "400ms", "mode": "constrained"}, {"after": "60s", "mode": "normal"}], "repeat": false, "session": null, "start": \#(start)}"#.utf8)
        fixture.api.applySharedSchedules(["global": value], key: Self.key)
        #expect(fixture.snapshot.mode == DataMode(name: "constrained"))
        #expect(fixture.snapshot.modeSource == .schedule)
        #expect(fixture.api.schedules.nextDue == fixture.monotonic.value + 59_700_000_000, "60.4 s after a start 0.7 s ago")
        #expect(Self.modeEvents(fixture) == 1, "one event, not one per step passed")
        // The same value again is no change; gone from the store, the timeline stops here and its mode stays.
        fixture.api.applySharedSchedules(["global": value], key: Self.key)
        #expect(Self.modeEvents(fixture) == 1)
        fixture.api.applySharedSchedules([:], key: Self.key)
        #expect(fixture.api.schedules.nextDue == nil)
        #expect(fixture.snapshot.mode == DataMode(name: "constrained"))
    }

    @Test("a repeated schedule started hours ago: whole cycles skipped, the step in force applied")
    func longRepeated() throws {
        let fixture = try AdminFixture()
        // A 1 s cycle (300 ms constrained, then 700 ms normal) started 3 h 0.5 s ago: constrained since 0.2 s.
        let start = fixture.now * 1000 - (3 * 3_600_000 + 500)
        let value = Array(#"{"steps": [{"after": "300ms", "mode": "constrained"}, {"after": "700ms", "mode": "normal"}], "repeat": true, "session": null, "start": \#(start)}"#.utf8)
        fixture.api.applySharedSchedules(["global": value], key: Self.key)
        #expect(fixture.snapshot.mode == DataMode(name: "constrained"))
        #expect(fixture.api.schedules.nextDue == fixture.monotonic.value + 500_000_000)
    }

    @Test("a bad schedule is refused and the running one kept; a session's schedule waits for its session")
    func badAndWaiting() throws {
        let fixture = try AdminFixture("sessions: {enabled: true}\n")
        #expect(fixture.handle("PUT", "/schedule", #"{"steps": [{"after": "30s", "mode": "constrained"}]}"#).status == 200)
        let running = fixture.api.schedules.nextDue
        for bad in [#"{"steps": "soon", "start": 1}"#, #"{"steps": [{"after": "1s", "mode": "normal"}]}"#,
                    #"{"steps": [{"after": "1s", "mode": "normal"}], "session": "other", "start": 1}"#, "not json"] {
            fixture.api.applySharedSchedules(["global": Array(bad.utf8)], key: Self.key)
            #expect(fixture.api.schedules.nextDue == running, "\(bad)")
        }
        let global = Array("not json".utf8)
        let sessionSchedule = Array(#"{"steps": [{"after": "0ms", "mode": "constrained"}], "session": "rig", "start": \#(fixture.now * 1000)}"#.utf8)
        fixture.api.applySharedSchedules(["global": global, "rig": sessionSchedule], key: Self.key)
        #expect(Self.scopes(fixture) == ["global"], "no session rig yet")
        #expect(fixture.handle("PUT", "/sessions/rig", #"{"mode": "normal"}"#).status == 201)
        fixture.api.applySharedSchedules(["global": global, "rig": sessionSchedule], key: Self.key)
        #expect(fixture.snapshot.sessions["rig"]?.mode == DataMode(name: "constrained"))
        #expect(fixture.snapshot.sessions["rig"]?.modeSource == .schedule)
    }

    @Test("sessions read from the store: created, changed with an event and its schedule cancelled, a new incarnation counts anew, gone when a complete read lacks it")
    func sessions() throws {
        let fixture = try AdminFixture("sessions: {enabled: true}\n")
        func read(_ id: String, _ json: String?) -> SharedSessionRead {
            SharedSessionRead(id: id, value: json.map { Array($0.utf8) }, lifetimeMilliseconds: 60_000)
        }
        fixture.api.applySharedSessions([read("rig", #"{"mode": "constrained", "profile": null, "since": 5, "incarnation": "a"}"#)],
                                        complete: false, keyPrefix: "p:")
        let created = try #require(fixture.snapshot.sessions["rig"])
        #expect(created.mode == DataMode(name: "constrained") && created.modeSource == .api && created.since == 5)
        #expect(fixture.emitted.value.last?.scope == "rig")
        #expect(fixture.handle("PUT", "/schedule", #"{"steps": [{"after": "30s", "mode": "normal"}], "session": "rig"}"#).status == 200)

        fixture.api.applySharedSessions([read("rig", #"{"mode": "normal", "profile": "nlc-3g", "since": 9, "incarnation": "a", "write": "2"}"#)],
                                        complete: false, keyPrefix: "p:")
        let changed = try #require(fixture.snapshot.sessions["rig"])
        #expect(changed.mode == .normal && changed.profile == "nlc-3g" && changed.serial == created.serial)
        #expect(Self.scopes(fixture).isEmpty, "setting a session cancels its schedule")
        fixture.api.applySharedSessions([read("rig", #"{"mode": "normal", "profile": null, "since": 9, "incarnation": "b"}"#)],
                                        complete: false, keyPrefix: "p:")
        #expect(fixture.snapshot.sessions["rig"]!.serial > created.serial, "another incarnation: counters from zero")

        // A bad value: refused, the session kept.
        fixture.api.applySharedSessions([read("rig", #"{"mode": "warp"}"#), read("x", #"{"mode": "normal", "profile": "no-such", "since": 1, "incarnation": "c"}"#)],
                                        complete: false, keyPrefix: "p:")
        #expect(fixture.snapshot.sessions["rig"]?.mode == .normal)
        #expect(fixture.snapshot.sessions["x"] == nil)
        // A complete read without it: gone.
        fixture.api.applySharedSessions([], complete: true, keyPrefix: "p:")
        #expect(fixture.snapshot.sessions.isEmpty)
    }
}
