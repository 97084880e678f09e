import DatamodeTestSupport
import Foundation
import Testing

/// The rest of a large `Content-Length` response body moves with splice(2) (the default), or stays on the evbuffer
/// path with `DATAMODE_BODY_SPLICE=0` (README "Choices"); either way every byte arrives, the connection and its
/// pooled upstream carry the next exchange, and the metric says which path ran.
@Suite struct BodySpliceEndToEndTests {
    @Test(arguments: [true, false])
    func largeBodiesAreSplicedUnlessTurnedOff(splice: Bool) throws {
        let body = PatternBody(length: 5 << 20, seed: 21).bytes
        let origin = try RecordingOrigin { request in
            request.target == "/big" ? .respond(status: 200, body: body) : .ok("after")
        }
        defer { origin.stop() }
        let proxy = try ProxyProcess(config: "", environment: splice ? [:] : ["DATAMODE_BODY_SPLICE": "0"])
        defer { proxy.stop() }
        let client = try RawHTTPClient(port: proxy.port)

        try client.send(RequestText.make("GET", origin.url("/big")))
        let response = try client.readResponse()
        #expect(response.status == 200)
        #expect(response.body.count == body.count)
        #expect(StreamChecksum.of(response.body) == StreamChecksum.of(body))

        // The same client connection and the same origin connection carry the next exchange.
        try client.send(RequestText.make("GET", origin.url("/next")))
        #expect(try client.readResponse().bodyText == "after")
        #expect(origin.connectionCount == 1)

        let metrics = try AdminAPIClient(port: proxy.adminPort).get("/metrics").bodyText
        let line = metrics.split(separator: "\n").first { $0.hasPrefix("datamode_body_splices_total ") }
        #expect(line == (splice ? "datamode_body_splices_total 1" : "datamode_body_splices_total 0"))
    }

    /// A client that resets its connection in the middle of a spliced body: the relay stops, the origin connection
    /// (mid-body, unusable) is closed rather than pooled, the exchange is counted as `client-aborted`, and the
    /// proxy goes on serving.
    @Test func aClientResetMidSpliceClosesTheOriginSideAndTheProxyGoesOn() throws {
        let body = PatternBody(length: 64 << 20, seed: 22).bytes
        let origin = try RecordingOrigin { request in
            request.target == "/huge" ? .respond(status: 200, body: body) : .ok("still here")
        }
        defer { origin.stop() }
        let proxy = try ProxyProcess(config: "")
        defer { proxy.stop() }

        let client = try RawHTTPClient(port: proxy.port)
        try client.send(RequestText.make("GET", origin.url("/huge")))
        _ = try client.read(exactly: 2 << 20)
        client.reset()

        let admin = AdminAPIClient(port: proxy.adminPort)
        var aborted = false
        for _ in 0..<100 where !aborted {
            let metrics = try admin.get("/metrics").bodyText
            aborted = metrics.contains("datamode_requests_total{outcome=\"error\",reason=\"client-aborted\"} 1")
            if !aborted { Thread.sleep(forTimeInterval: 0.05) }
        }
        #expect(aborted, "the cut exchange is counted as client-aborted")

        let next = try RawHTTPClient(port: proxy.port)
        try next.send(RequestText.make("GET", origin.url("/after")))
        #expect(try next.readResponse().bodyText == "still here")
        #expect(origin.connectionCount == 2, "the origin connection cut mid-body was not reused")
        let metrics = try admin.get("/metrics").bodyText
        #expect(metrics.contains("datamode_body_splices_total 1"))
    }
}
