// Socket-free tests of SPEC §12's admin endpoints: sessions (documents, validation, idle expiry on the injected
// clock), the event stream's framing and filter, schedules on the injected clock, and admin.read-token.
import DatamodeAdmin
import DatamodeConfig
import DatamodePolicy
import DatamodeState
import Foundation
import Testing

@Suite("Sessions endpoint")
struct SessionsEndpointTests {
    @Test("PUT creates (201) then replaces (200); GET shows mode, profile and the workers' counters")
    func createReadReplace() throws {
        let fixture = try AdminFixture("sessions: {enabled: true}\n")
        let created = fixture.handle("PUT", "/sessions/rig-1", #"{"mode": "constrained", "profile": "nlc-3g"}"#)
        #expect(created.status == 201)
        #expect(created.object["mode"] as? String == "constrained")
        #expect(created.object["source"] as? String == "api")
        #expect(fixture.snapshot.sessions["rig-1"]?.mode == DataMode(name: "constrained"))
        #expect(fixture.snapshot.sessions["rig-1"]?.profile == "nlc-3g")
        let serial = try #require(fixture.snapshot.sessions["rig-1"]?.serial)

        var tally = SessionTally(serial: serial)
        tally.requests = ["rejected": ["constrained": 3], "forwarded": ["": 2]]
        tally.bytesIn = 10
        tally.bytesOut = 2000
        tally.variants = ["hero-small": 1]
        tally.rejected = [SessionTally.Rejected(url: "http://a/x", error: "constrained", time: 1_767_225_600_000_000_000)]
        fixture.tallies.value = ["rig-1": tally]
        let document = fixture.handle("GET", "/sessions/rig-1").object
        #expect(document["requestsTotal"] as? Int == 5)
        #expect((document["requests"] as? [String: [String: Int]])?["rejected"]?["constrained"] == 3)
        #expect((document["bytes"] as? [String: Int]) == ["in": 10, "out": 2000])
        #expect((document["variants"] as? [String: Int]) == ["hero-small": 1])
        let rejected = document["rejected"] as? [[String: Any]] ?? []
        #expect(rejected.first?["url"] as? String == "http://a/x")
        #expect(rejected.first?["time"] as? String == "2026-01-01T00:00:00.000Z")

        let replaced = fixture.handle("PUT", "/sessions/rig-1", #"{"mode": "normal"}"#)
        #expect(replaced.status == 200)
        #expect(replaced.object["profile"] is NSNull, "a PUT states the whole session")
        #expect(fixture.snapshot.sessions["rig-1"]?.serial == serial, "the same session: counters kept")
        // Counters of an older incarnation are never shown for a new one.
        #expect(fixture.handle("DELETE", "/sessions/rig-1").status == 200)
        #expect(fixture.handle("PUT", "/sessions/rig-1", #"{"mode": "normal"}"#).status == 201)
        #expect(fixture.handle("GET", "/sessions/rig-1").object["requestsTotal"] as? Int == 0)
    }

    @Test("bad input: id, mode, profile, keys, method")
    func badInput() throws {
        let fixture = try AdminFixture("sessions: {enabled: true}\n")
        #expect(fixture.handle("PUT", "/sessions/a%20b", #"{"mode": "normal"}"#).status == 400)
        #expect(fixture.handle("PUT", "/sessions/global", #"{"mode": "normal"}"#).status == 400)
        #expect(fixture.handle("PUT", "/sessions/" + String(repeating: "x", count: 129), #"{"mode": "normal"}"#).status == 400)
        #expect(fixture.handle("PUT", "/sessions/s", #"{"mode": "warp"}"#).errorCode == "bad-request")
        #expect(fixture.handle("PUT", "/sessions/s", #"{"profile": "moon-link"}"#).errorCode == "unknown-profile")
        #expect(fixture.handle("PUT", "/sessions/s", #"{"profile": 3}"#).errorCode == "bad-request")
        #expect(fixture.handle("PUT", "/sessions/s", #"{"mode": "normal", "colour": "red"}"#).errorCode == "bad-request")
        #expect(fixture.handle("PUT", "/sessions/s", "[1]").errorCode == "bad-request")
        #expect(fixture.handle("POST", "/sessions/s", "{}").status == 405)
        #expect(fixture.handle("GET", "/sessions/none").status == 404)
        #expect(fixture.handle("DELETE", "/sessions/none").status == 404)
        #expect(fixture.snapshot.sessions.isEmpty)
    }

    @Test("idle expiry counts from the last API call or request, on the injected clock")
    func idleExpiry() throws {
        let fixture = try AdminFixture("sessions: {enabled: true}\n")
        #expect(fixture.handle("PUT", "/sessions/a", #"{"mode": "constrained"}"#).status == 201)
        #expect(fixture.handle("PUT", "/sessions/b", #"{"mode": "expensive"}"#).status == 201)
        fixture.elapse(milliseconds: 900)
        #expect(fixture.api.expireIdleSessions(after: .seconds(1)).isEmpty)
        // b served a request 100 ms ago (the workers' last-seen time); a did nothing.
        var tally = SessionTally(serial: fixture.snapshot.sessions["b"]!.serial)
        tally.lastSeen = fixture.monotonic.value
        fixture.tallies.value = ["b": tally]
        fixture.elapse(milliseconds: 100)
        #expect(fixture.api.expireIdleSessions(after: .seconds(1)) == ["a"])
        #expect(fixture.snapshot.sessions.keys.sorted() == ["b"])
        fixture.elapse(milliseconds: 950)
        #expect(fixture.handle("GET", "/sessions/b").status == 200, "a read is an API call: it keeps the session")
        fixture.elapse(milliseconds: 950)
        #expect(fixture.api.expireIdleSessions(after: .seconds(1)).isEmpty)
        fixture.elapse(milliseconds: 100)
        #expect(fixture.api.expireIdleSessions(after: .seconds(1)) == ["b"])
    }

    @Test("sessions off (the default): PUT answers 409 sessions-disabled and creates nothing; GET and DELETE find nothing")
    func disabled() throws {
        let fixture = try AdminFixture()
        let refused = fixture.handle("PUT", "/sessions/rig-1", #"{"mode": "constrained"}"#)
        expectProblem(refused, 409, "sessions-disabled")
        #expect((refused.object["detail"] as? String)?.contains("sessions.enabled") == true, "\(refused.text)")
        #expect(ProxyErrorCode(rawValue: "sessions-disabled")?.status == 409, "the one place codes map to statuses")
        #expect(fixture.snapshot.sessions.isEmpty, "a rig must not believe it has a session that nothing honours")
        #expect(fixture.emitted.value.isEmpty, "no mode event for it either")
        // Refused whatever the body says, before looking at it.
        expectProblem(fixture.handle("PUT", "/sessions/rig-1", "not json"), 409, "sessions-disabled")
        #expect(fixture.handle("GET", "/sessions").object["enabled"] as? Bool == false)
        expectProblem(fixture.handle("GET", "/sessions/rig-1"), 404, "unknown-session")
        expectProblem(fixture.handle("DELETE", "/sessions/rig-1"), 404, "unknown-session")
    }

    @Test("SessionTally keeps the last 100 rejected URLs, and merging keeps the newest")
    func rejectedBound() {
        var a = SessionTally(serial: 1)
        var b = SessionTally(serial: 1)
        for i in 0..<80 {
            a.rejected.append(.init(url: "a\(i)", error: "constrained", time: Int64(i * 2)))
            b.rejected.append(.init(url: "b\(i)", error: "constrained", time: Int64(i * 2 + 1)))
        }
        a.merge(b)
        #expect(a.rejected.count == 100)
        #expect(a.rejected.last?.url == "b79")
        #expect(a.rejected.first?.time == 60)
    }
}

@Suite("Events endpoint")
struct EventsEndpointTests {
    @Test("GET /events opens a text/event-stream whose first event is the current mode")
    func firstEvent() throws {
        let fixture = try AdminFixture("mode: expensive\n")
        let response = fixture.handle("GET", "/events")
        #expect(response.status == 200)
        #expect(response.header("content-type") == "text/event-stream")
        #expect(response.stream != nil && response.stream?.scope == nil)
        let lines = response.text.split(separator: "\n", omittingEmptySubsequences: false)
        #expect(lines.count == 5 && lines[0] == "event: mode" && lines[1].hasPrefix("id: ") && lines[3] == "" && lines[4] == "")
        let data = try #require(try JSONSerialization.jsonObject(with: Data(lines[2].dropFirst(6).utf8)) as? [String: Any])
        #expect(data["scope"] as? String == "global")
        #expect(data["mode"] as? String == "expensive")
        #expect(data["expensive"] as? Bool == true && data["ultraConstrained"] as? Bool == false)
        #expect(data["source"] as? String == "config")
    }

    @Test("mode and variants changes are emitted; ids increase; ?session filters and names a live session")
    func emitted() throws {
        let fixture = try AdminFixture("sessions: {enabled: true}\n")
        #expect(fixture.handle("GET", "/events?session=nope").errorCode == "unknown-session")
        #expect(fixture.handle("GET", "/events?colour=red").status == 400)
        #expect(fixture.handle("PUT", "/mode", #"{"mode": "constrained"}"#).status == 200)
        #expect(fixture.handle("PUT", "/sessions/s1", #"{"mode": "expensive"}"#).status == 201)
        #expect(fixture.handle("PUT", "/variants/v1", #"{"match": "http://a/x", "target": "http://a/y"}"#).status == 201)
        let events = fixture.emitted.value
        #expect(events.map(\.scope) == ["global", "s1", "global"])
        #expect(events[0].text.hasPrefix("event: mode\n") && events[0].text.contains(#""mode":"constrained""#))
        #expect(events[1].text.contains(#""scope":"s1""#))
        #expect(events[2].text.hasPrefix("event: variants\n") && events[2].text.contains(#""changed":"v1""#))
        let ids = events.compactMap { event in event.text.split(separator: "\n").first { $0.hasPrefix("id: ") }.flatMap { Int($0.dropFirst(4)) } }
        #expect(ids == ids.sorted() && Set(ids).count == 3)
        let filtered = fixture.handle("GET", "/events?session=s1")
        #expect(filtered.stream?.scope == "s1")
        #expect(filtered.text.contains(#""scope":"s1""#) && filtered.text.contains(#""mode":"expensive""#))
    }

    @Test("admin.read-token reads the mode and the events, and nothing else")
    func readToken() throws {
        let fixture = try AdminFixture(token: "all", readToken: "look")
        let look = ["authorization": "Bearer look"]
        #expect(fixture.handle("GET", "/mode", headers: look).status == 200)
        #expect(fixture.handle("GET", "/events", headers: look).status == 200)
        #expect(fixture.handle("PUT", "/mode", #"{"mode": "normal"}"#, headers: look).status == 401)
        #expect(fixture.handle("GET", "/sessions", headers: look).status == 401)
        #expect(fixture.handle("GET", "/metrics", headers: look).status == 401)
        #expect(fixture.handle("GET", "/events").status == 401)
        #expect(fixture.handle("PUT", "/mode", #"{"mode": "normal"}"#, headers: ["authorization": "Bearer all"]).status == 200)
    }
}

@Suite("Schedule endpoint")
struct ScheduleEndpointTests {
    @Test("steps apply at their nominal times on the injected clock, source schedule, each an event; repeat wraps")
    func timeline() throws {
        let fixture = try AdminFixture()
        let put = fixture.handle("PUT", "/schedule",
                                 #"{"steps": [{"after": "30s", "mode": "constrained"}, {"after": "500ms", "mode": "normal"}], "repeat": true}"#)
        #expect(put.status == 200)
        #expect(fixture.api.schedules.nextDue == fixture.monotonic.value + 30_000_000_000)
        fixture.elapse(milliseconds: 29_999)
        #expect(fixture.api.runDueScheduleSteps() == 0)
        #expect(fixture.snapshot.mode == .normal)
        fixture.elapse(milliseconds: 1)
        #expect(fixture.api.runDueScheduleSteps() == 1)
        #expect(fixture.snapshot.mode == DataMode(name: "constrained"))
        #expect(fixture.snapshot.modeSource == .schedule)
        #expect(fixture.handle("GET", "/mode").object["source"] as? String == "schedule")
        // Late by 700 ms: the second step (due at 30.5 s) runs; the next (the first again, repeat) is due 30 s
        // after 30.5 s, its nominal time, not after the late run.
        fixture.elapse(milliseconds: 1200)
        #expect(fixture.api.runDueScheduleSteps() == 1)
        #expect(fixture.snapshot.mode == .normal)
        #expect(fixture.api.schedules.nextDue == 1_000_000_000 + 60_500_000_000)
        #expect(fixture.emitted.value.filter { $0.text.hasPrefix("event: mode") }.count == 2)
        let listed = fixture.handle("GET", "/schedule").object["schedules"] as? [[String: Any]] ?? []
        #expect(listed.count == 1 && listed.first?["repeat"] as? Bool == true)
        // PUT /mode on the same scope cancels it.
        #expect(fixture.handle("PUT", "/mode", #"{"mode": "expensive"}"#).status == 200)
        #expect(fixture.api.schedules.nextDue == nil)
        #expect(fixture.handle("DELETE", "/schedule").status == 404)
    }

    @Test("nextAt is the next step's wall-clock time to the millisecond, not counted from the start of the second")
    func nextAtMilliseconds() throws {
        let fixture = try AdminFixture()
        fixture.api.wallMilliseconds = { fixture.now * 1000 + 250 }
        #expect(fixture.handle("PUT", "/schedule", #"{"steps": [{"after": "30s", "mode": "constrained"}]}"#).status == 200)
        let listed = fixture.handle("GET", "/schedule").object["schedules"] as? [[String: Any]] ?? []
        #expect(listed.first?["nextAt"] as? String == "2026-01-01T00:00:30.250Z", "\(listed)")
    }

    @Test("a session's timeline changes that session only; deleting the session ends it")
    func sessionTimeline() throws {
        let fixture = try AdminFixture("sessions: {enabled: true}\n")
        #expect(fixture.handle("PUT", "/schedule", #"{"steps": [{"after": "1s", "mode": "constrained"}], "session": "ghost"}"#).errorCode == "unknown-session")
        #expect(fixture.handle("PUT", "/sessions/s", #"{"mode": "normal"}"#).status == 201)
        #expect(fixture.handle("PUT", "/schedule", #"{"steps": [{"after": "0s", "mode": "constrained"}, {"after": "1s", "mode": "expensive"}], "session": "s"}"#).status == 200)
        #expect(fixture.api.runDueScheduleSteps() == 1)
        #expect(fixture.snapshot.sessions["s"]?.mode == DataMode(name: "constrained"))
        #expect(fixture.snapshot.sessions["s"]?.modeSource == .schedule)
        #expect(fixture.snapshot.mode == .normal, "the global mode is untouched")
        #expect(fixture.handle("DELETE", "/schedule?session=s").status == 204)
        fixture.elapse(milliseconds: 2000)
        #expect(fixture.api.runDueScheduleSteps() == 0)
        #expect(fixture.snapshot.sessions["s"]?.mode == DataMode(name: "constrained"))
    }

    @Test("bad schedules are refused whole")
    func badInput() throws {
        let fixture = try AdminFixture()
        for body in [#"{}"#, #"{"steps": []}"#, #"{"steps": [{"mode": "normal"}]}"#, #"{"steps": [{"after": "soon", "mode": "normal"}]}"#,
                     #"{"steps": [{"after": "1s", "mode": "warp"}]}"#, #"{"steps": [{"after": "1s"}]}"#,
                     #"{"steps": [{"after": "0s", "mode": "normal"}], "repeat": true}"#, #"{"steps": [{"after": "1s", "mode": "normal"}], "repeat": 1}"#,
                     #"{"steps": [{"after": "1s", "mode": "normal"}], "when": "now"}"#] {
            #expect(fixture.handle("PUT", "/schedule", body).status == 400, "\(body)")
        }
        #expect(fixture.api.schedules.nextDue == nil)
    }
}
