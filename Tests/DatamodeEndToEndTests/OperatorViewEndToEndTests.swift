import DatamodeTestSupport
import Foundation
import Testing

/// SPEC §20 through the real binary: what a refused request and the traffic of the last seconds look like on the
/// admin listener (`GET /refusals`, `GET /stats/timeline`), the sources of the admin page.
@Suite struct OperatorViewEndToEndTests {
    @Test func aRefusalShowsUpWithItsRuleAndClient() throws {
        let origin = try RecordingOrigin { _ in .ok("fine") }
        defer { origin.stop() }
        let proxy = try ProxyProcess(config: """
            mode: constrained
            rules:
              - name: videos
                match: {path: "*.mp4"}
                tags: {allow-constrained: false}
            """)
        defer { proxy.stop() }
        let admin = AdminAPIClient(port: proxy.adminPort)
        #expect((try admin.get("/refusals").object["refusals"] as? [[String: Any]])?.isEmpty == true)

        let refused = try ExternalCommand.run("/usr/bin/curl", ["-s", "-o", "/dev/null", "-w", "%{http_code}", "-x",
                                                                "http://127.0.0.1:\(proxy.port)", origin.url("/clip.mp4")])
        #expect(refused.stdout == "403")
        let allowed = try ExternalCommand.run("/usr/bin/curl", ["-s", "-x", "http://127.0.0.1:\(proxy.port)", origin.url("/page")])
        #expect(allowed.stdout == "fine")

        var refusals: [[String: Any]] = []
        AdminPolling.until {
            refusals = (try? admin.get("/refusals").object["refusals"] as? [[String: Any]]) ?? []
            return !refusals.isEmpty
        }
        #expect(refusals.count == 1, "only the refused request: \(refusals)")
        let refusal = try #require(refusals.first)
        #expect(refusal["url"] as? String == origin.url("/clip.mp4"))
        #expect(refusal["method"] as? String == "GET")
        #expect(refusal["error"] as? String == "constrained")
        #expect(refusal["reasons"] as? [String] == ["constrained"])
        #expect(refusal["rule"] as? String == "videos")
        #expect(refusal["session"] is NSNull)
        #expect((refusal["client"] as? String)?.hasPrefix("127.0.0.1") == true, "\(refusal)")
        #expect((refusal["time"] as? String)?.hasSuffix("Z") == true)
    }

    @Test func theTimelineCountsTheBytesRelayed() throws {
        let body = String(repeating: "x", count: 200_000)
        let origin = try RecordingOrigin { _ in .ok(body) }
        defer { origin.stop() }
        let proxy = try ProxyProcess()
        defer { proxy.stop() }
        let admin = AdminAPIClient(port: proxy.adminPort)
        let fetched = try ExternalCommand.run("/usr/bin/curl", ["-s", "-x", "http://127.0.0.1:\(proxy.port)", origin.url("/big")])
        #expect(fetched.stdout.count == body.count)

        // The sample of the second the bytes were counted in comes within the next second.
        var relayed = 0
        var document: [String: Any] = [:]
        AdminPolling.until {
            document = (try? admin.get("/stats/timeline").object) ?? [:]
            let points = document["points"] as? [[String: Any]] ?? []
            relayed = points.reduce(0) { $0 + ($1["bytesOut"] as? Int ?? 0) }
            return relayed >= body.count
        }
        #expect(document["interval"] as? Int == 1)
        #expect(relayed >= body.count && relayed < body.count + 1000, "\(relayed)")
        let points = document["points"] as? [[String: Any]] ?? []
        let now = Int(Date().timeIntervalSince1970)
        #expect(points.allSatisfy { (($0["t"] as? Int) ?? 0) > now - 3600 && (($0["t"] as? Int) ?? 0) <= now + 1 })
    }
}
