import DatamodeAdmin
import DatamodeState
import Foundation
import Testing

/// `GET /refusals` and `GET /stats/timeline` (SPEC §20), without sockets: the workers' rings and totals are values.
@Suite("Admin: /refusals, /stats/timeline")
struct RefusalsTimelineEndpointTests {
    @Test func refusalsAreListedNewestFirstWithEveryMember() throws {
        let fixture = try AdminFixture()
        let start = AdminFixture.start * 1_000_000_000
        fixture.refusals.value = [
            Refusal(time: start + 2_500_000_000, client: "127.0.0.1", method: "GET", url: "http://v.example/a.mp4",
                    error: "constrained", reasons: ["constrained", "ultra-constrained"], rule: "videos", session: "run-1"),
            Refusal(time: start, client: "::1", method: "CONNECT", url: "blocked.example:443", error: "budget-exhausted",
                    reasons: ["budget-exhausted"], rule: nil, session: nil),
        ]
        let response = fixture.handle("GET", "/refusals")
        #expect(response.status == 200)
        let refusals = try #require(response.object["refusals"] as? [[String: Any]])
        #expect(refusals.count == 2)
        #expect(refusals[0]["time"] as? String == "2026-01-01T00:00:02.500Z")
        #expect(refusals[0]["client"] as? String == "127.0.0.1")
        #expect(refusals[0]["method"] as? String == "GET")
        #expect(refusals[0]["url"] as? String == "http://v.example/a.mp4")
        #expect(refusals[0]["error"] as? String == "constrained")
        #expect(refusals[0]["reasons"] as? [String] == ["constrained", "ultra-constrained"])
        #expect(refusals[0]["rule"] as? String == "videos")
        #expect(refusals[0]["session"] as? String == "run-1")
        #expect(refusals[1]["rule"] is NSNull)
        #expect(refusals[1]["session"] is NSNull)
        #expect(refusals[1]["error"] as? String == "budget-exhausted")
    }

    @Test func theTimelineHoldsWhatGrewEachSecond() throws {
        let fixture = try AdminFixture()
        var totals = MetricsSnapshot()
        fixture.metrics.value = totals
        fixture.api.sampleTimeline()
        totals.bytesIn = 100
        totals.bytesOut = 5000
        totals.bytesSaved = ["variant": 2000, "rejected": 0]
        fixture.metrics.value = totals
        fixture.clock.value += 1
        fixture.api.sampleTimeline()
        fixture.clock.value += 2  // a second without a sample: a zero point
        totals.bytesOut = 5600
        fixture.metrics.value = totals
        fixture.api.sampleTimeline()

        let response = fixture.handle("GET", "/stats/timeline")
        #expect(response.status == 200)
        #expect(response.object["interval"] as? Int == 1)
        let points = try #require(response.object["points"] as? [[String: Any]])
        #expect(points.map { $0["t"] as? Int } == [1, 2, 3].map { Int(AdminFixture.start) + $0 })
        #expect(points.map { $0["bytesIn"] as? Int } == [100, 0, 0])
        #expect(points.map { $0["bytesOut"] as? Int } == [5000, 0, 600])
        #expect(points[0]["saved"] as? [String: Int] == ["variant": 2000])
        #expect(points[2]["saved"] as? [String: Int] == [:])
    }

    /// SPEC §7 lists what admin.read-token reaches; these two are not on it (they name clients and URLs).
    @Test("admin.token only", arguments: ["/refusals", "/stats/timeline"])
    func tokenOnly(_ path: String) throws {
        let fixture = try AdminFixture(token: "t0ken", readToken: "r3ad")
        #expect(fixture.handle("GET", path).status == 401)
        #expect(fixture.handle("GET", path, headers: ["authorization": "Bearer r3ad"]).status == 401)
        #expect(fixture.handle("GET", path, headers: ["authorization": "Bearer t0ken"]).status == 200)
        #expect(fixture.handle("PUT", path, headers: ["authorization": "Bearer t0ken"]).status == 405)
    }
}
