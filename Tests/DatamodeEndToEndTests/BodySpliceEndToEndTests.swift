import DatamodeTestSupport
import Foundation
import Testing

/// The rest of a large `Content-Length` response body moves with splice(2) (the default), or stays on the evbuffer
/// path with `DATAMODE_BODY_SPLICE=0` (README "Choices"); either way every byte arrives, the connection and its
/// pooled upstream carry the next exchange, and the metric says which path ran.
@Suite struct BodySpliceEndToEndTests {
    /// `pattern`, with a 200 ms pause in the origin after its first 256 KiB.
    static func pausing(_ pattern: PatternBody) -> BodyGenerator {
        BodyGenerator(length: pattern.length) { offset, buffer in
            let pauseAt: UInt64 = 256 << 10
            if offset <= pauseAt && pauseAt < offset + UInt64(buffer.count) { Thread.sleep(forTimeInterval: 0.2) }
            pattern.fill(offset: offset, into: buffer)
        }
    }

    @Test(arguments: [true, false])
    func largeBodiesAreSplicedUnlessTurnedOff(splice: Bool) throws {
        let pattern = PatternBody(length: 5 << 20, seed: 21)
        let body = pattern.bytes
        let origin = try RecordingOrigin { request in
            request.target == "/big" ? .stream(status: 200, body: Self.pausing(pattern)) : .ok("after")
        }
        defer { origin.stop() }
        let proxy = try ProxyProcess(config: "", environment: splice ? [:] : ["DATAMODE_BODY_SPLICE": "0"])
        defer { proxy.stop() }
        let client = try RawHTTPClient(port: proxy.port)
        let admin = AdminAPIClient(port: proxy.adminPort)
        func spliced() throws -> Int {
            let metrics = try admin.get("/metrics").bodyText
            let line = metrics.split(separator: "\n").first { $0.hasPrefix("datamode_body_splices_total ") }
            return line.flatMap { Int($0.split(separator: " ").last ?? "") } ?? -1
        }

        // The switch to splice(2) waits for a moment when every buffer of the exchange is empty: the origin pauses
        // after 256 KiB to leave one (a fast origin on a loaded machine may leave none in a whole body). Up to five
        // bodies on one connection: with splicing on, one of them is spliced; off, none ever is. Every byte of
        // every body arrives either way.
        var downloads = 0
        while downloads < 5 {
            try client.send(RequestText.make("GET", origin.url("/big")))
            let response = try client.readResponse()
            #expect(response.status == 200)
            #expect(response.body.count == body.count)
            #expect(StreamChecksum.of(response.body) == StreamChecksum.of(body))
            downloads += 1
            if splice, try spliced() > 0 { break }
        }

        // The same client connection and the same origin connection carry the next exchange.
        try client.send(RequestText.make("GET", origin.url("/next")))
        #expect(try client.readResponse().bodyText == "after")
        #expect(origin.connectionCount == 1)
        if splice {
            #expect(try spliced() >= 1, "no body of \(downloads) was spliced")
        } else {
            #expect(try spliced() == 0)
        }
    }

    /// An origin that never pauses keeps the proxy's buffers busy for the whole body: the switch must not wait for
    /// a moment when they happen to be empty (the first 100 MiB download of bench/run on a fresh connection was
    /// never spliced: 1.05 CPU s/GB against 0.22). The proxy stops reading the origin, writes what it already
    /// read, and hands the rest to splice(2). A fast and a slow reader; every byte in order either way.
    @Test(arguments: [false, true])
    func theFirstLargeBodyFromAFastOriginIsSpliced(slowReader: Bool) throws {
        let pattern = PatternBody(length: 8 << 20, seed: 23)
        let body = pattern.bytes
        let origin = try RecordingOrigin { request in
            // One write of the whole message: the origin's socket never runs dry while the proxy reads.
            request.target == "/big" ? .respond(status: 200, body: body) : .ok("after")
        }
        defer { origin.stop() }
        let proxy = try ProxyProcess(config: "")
        defer { proxy.stop() }
        let client = try RawHTTPClient(port: proxy.port)
        let admin = AdminAPIClient(port: proxy.adminPort)

        try client.send(RequestText.make("GET", origin.url("/big")))
        if slowReader {
            // Let the proxy fill its buffers toward the client before anything is read.
            Thread.sleep(forTimeInterval: 0.3)
        }
        let response = try client.readResponse()
        #expect(response.status == 200)
        #expect(UInt64(response.body.count) == pattern.length)
        #expect(StreamChecksum.of(response.body) == StreamChecksum.of(body))
        let metrics = try admin.get("/metrics").bodyText
        #expect(metrics.contains("datamode_body_splices_total 1"), "the first body was not spliced")

        try client.send(RequestText.make("GET", origin.url("/next")))
        #expect(try client.readResponse().bodyText == "after")
        #expect(origin.connectionCount == 1)
    }

    /// While what was read of a large body drains before the splice, the origin is not read. A request pipelined
    /// behind it while that happens is answered after the whole body, on the same connections, in order.
    @Test func aRequestPipelinedDuringTheDrainIsAnsweredAfterTheBody() throws {
        let pattern = PatternBody(length: 8 << 20, seed: 24)
        let body = pattern.bytes
        let origin = try RecordingOrigin { request in
            request.target == "/big" ? .respond(status: 200, body: body) : .ok("after")
        }
        defer { origin.stop() }
        let proxy = try ProxyProcess(config: "")
        defer { proxy.stop() }
        let client = try RawHTTPClient(port: proxy.port)

        try client.send(RequestText.make("GET", origin.url("/big")))
        // Nothing read yet: the proxy's output toward the client is full, a write event is armed, the drain begins.
        Thread.sleep(forTimeInterval: 0.3)
        try client.send(RequestText.make("GET", origin.url("/next")))
        let first = try client.readResponse()
        #expect(first.status == 200)
        #expect(StreamChecksum.of(first.body) == StreamChecksum.of(body))
        #expect(try client.readResponse().bodyText == "after")
    }

    /// A client that resets its connection in the middle of a spliced body: the relay stops, the origin connection
    /// (mid-body, unusable) is closed rather than pooled, the exchange is counted as `client-aborted`, and the
    /// proxy goes on serving.
    @Test func aClientResetMidSpliceClosesTheOriginSideAndTheProxyGoesOn() throws {
        let pattern = PatternBody(length: 64 << 20, seed: 22)
        let origin = try RecordingOrigin { request in
            request.target == "/huge" ? .stream(status: 200, body: Self.pausing(pattern)) : .ok("still here")
        }
        defer { origin.stop() }
        let proxy = try ProxyProcess(config: "")
        defer { proxy.stop() }

        let admin = AdminAPIClient(port: proxy.adminPort)
        let client = try RawHTTPClient(port: proxy.port)
        try client.send(RequestText.make("GET", origin.url("/huge")))
        // Read a MiB at a time until the body is being spliced (the switch waits for a moment when every buffer
        // of the exchange is empty), then a MiB more through the relay, then reset.
        var splicing = false
        for _ in 0..<48 where !splicing {
            _ = try client.read(exactly: 1 << 20)
            splicing = try admin.get("/metrics").bodyText.contains("datamode_body_splices_total 1")
        }
        #expect(splicing, "the body was never handed to splice(2)")
        _ = try client.read(exactly: 1 << 20)
        client.reset()

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
    }
}
