import DatamodeTestSupport
import Foundation
import Testing

/// The harness is the process `run` builds (`ProxyInstance`), admin API and reload included: a change made through
/// either reaches the workers at the next request head, on a connection already open.
@Suite struct InProcessControlPlaneTests {
    @Test func aModeSetThroughTheAdminAPIAppliesToTheNextRequest() throws {
        let origin = try RecordingOrigin { request in .ok(request.target) }
        defer { origin.stop() }
        let proxy = try ProxyHarness()
        defer { proxy.stop() }
        let client = try proxy.connect()
        let video = RequestText.make("GET", origin.url("/hd.mp4"), headers: [("Allow-Constrained", "?0")])

        try client.send(video)
        #expect(try client.readResponse().status == 200)

        let put = try proxy.admin().put("/mode", #"{"mode": "constrained"}"#)
        #expect(put.status == 200)
        #expect(put.object["source"] as? String == "api")
        try client.send(video)
        expectProblem(try client.readResponse(), status: 403, error: "constrained")

        // Persisted in the harness's own state directory, like the binary's.
        #expect(FileManager.default.fileExists(atPath: proxy.stateDirectory + "/mode.json"))
        #expect(try proxy.admin().delete("/mode").status == 200)
        try client.send(video)
        #expect(try client.readResponse().status == 200)
        #expect(origin.requests.count == 2)
    }

    @Test func aReloadAppliesToTheNextRequestAndARefusedOneChangesNothing() throws {
        let origin = try RecordingOrigin { request in .ok(request.target) }
        defer { origin.stop() }
        let proxy = try ProxyHarness(yaml: "mode: constrained\n")
        defer { proxy.stop() }
        let client = try proxy.connect()
        let video = RequestText.make("GET", origin.url("/hd.mp4"))

        try client.send(video)
        #expect(try client.readResponse().status == 200)

        let rule = """
            mode: constrained
            rules:
              - {name: videos, match: {path: "*.mp4"}, tags: {allow-constrained: false}}
            """
        guard case .applied = proxy.reload(yaml: rule) else { Issue.record("the reload was refused"); return }
        try client.send(video)
        expectProblem(try client.readResponse(), status: 403, error: "constrained")

        guard case .refused = proxy.reload(yaml: "mode: normal\nbogus-key: 1\n") else {
            Issue.record("a file with an unknown key was applied")
            return
        }
        try client.send(video)
        expectProblem(try client.readResponse(), status: 403, error: "constrained")
        let metrics = try proxy.admin().get("/metrics").bodyText
        #expect(metrics.contains("datamode_reloads_total{result=\"ok\"} 1\n"), "\(metrics)")
        #expect(metrics.contains("datamode_reloads_total{result=\"failed\"} 1\n"), "\(metrics)")
    }
}
