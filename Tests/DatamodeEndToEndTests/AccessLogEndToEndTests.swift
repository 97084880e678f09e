import DatamodeTestSupport
import Foundation
import Testing

/// `log.access` (SPEC §8): one JSON line per request on stdout, in a file, or nowhere; a file that cannot be
/// opened stops start-up with an error naming it.
@Suite struct AccessLogEndToEndTests {
    static func oneRequest(_ proxy: ProxyProcess, _ origin: RecordingOrigin) throws {
        let client = try RawHTTPClient(port: proxy.port)
        try client.send("GET \(origin.url("/logged")) HTTP/1.1\r\nHost: \(origin.authority)\r\n\r\n")
        #expect(try client.readResponse().status == 200)
    }

    @Test func aFileDestinationGetsOneJSONLinePerRequestAndStdoutNone() throws {
        let origin = try RecordingOrigin()
        defer { origin.stop() }
        let logPath = FileManager.default.temporaryDirectory.appendingPathComponent("datamode-access-\(UUID().uuidString).log").path
        defer { try? FileManager.default.removeItem(atPath: logPath) }
        let proxy = try ProxyProcess(config: "log: {access: \(logPath)}\n")
        defer { proxy.stop() }
        try Self.oneRequest(proxy, origin)
        try Self.oneRequest(proxy, origin)
        proxy.stop()
        let lines = try String(contentsOfFile: logPath, encoding: .utf8).split(separator: "\n")
        #expect(lines.count == 2)
        let entry = try #require(try JSONSerialization.jsonObject(with: Data(lines[0].utf8)) as? [String: Any])
        #expect(entry["url"] as? String == origin.url("/logged"))
        #expect(entry["status"] as? Int == 200)
        #expect(entry["outcome"] as? String == "forwarded")
        for key in ["time", "client", "method", "bytes", "reason", "variant", "duration"] {
            #expect(entry.keys.contains(key), "missing \(key)")
        }
        #expect(proxy.stdout.isEmpty)
    }

    /// SPEC §8: writing the log never blocks a worker. A log shipper that stops reading fills the stdout pipe
    /// (64 KiB); requests must still be answered at once, and the lines that found no room are counted.
    @Test func aStdoutPipeNobodyReadsCostsLinesNotRequests() throws {
        let origin = try RecordingOrigin { _ in .ok("fine") }
        defer { origin.stop() }
        let pipe = Pipe()  // the read end stays open, unread, until the end of the test
        let proxy = try ProxyProcess(config: "", standardOutput: pipe.fileHandleForWriting)
        defer { proxy.stop() }
        // ~6 KiB per log line: a few hundred requests fill the pipe and any bounded backlog many times over.
        let url = origin.url("/" + String(repeating: "a", count: 6000))
        let started = ContinuousClock.now
        for _ in 0..<8 {
            let client = try RawHTTPClient(port: proxy.port, timeout: .seconds(5))
            defer { client.close() }
            for _ in 0..<50 {
                try client.send(RequestText.make("GET", url))
                #expect(try client.readResponse().status == 200)
            }
        }
        let elapsed = ContinuousClock.now - started
        #expect(elapsed < .seconds(20), "400 requests took \(elapsed)")
        let dropped = try AdminAPIClient(port: proxy.adminPort).scrape().counter("datamode_log_dropped_total")
        #expect(dropped > 0)
        #expect(dropped < 400, "a 64 KiB pipe and the backlog hold some lines")
        withExtendedLifetime(pipe) {}
    }

    /// A reader that keeps up loses nothing: every request has its line, even those answered just before a stop.
    @Test func aReaderThatKeepsUpGetsEveryLine() throws {
        let origin = try RecordingOrigin { _ in .ok("fine") }
        defer { origin.stop() }
        let proxy = try ProxyProcess(config: "")
        defer { proxy.stop() }
        for connection in 0..<4 {
            let client = try RawHTTPClient(port: proxy.port)
            defer { client.close() }
            for request in 0..<250 {
                try client.send(RequestText.make("GET", origin.url("/\(connection)/\(request)")))
                #expect(try client.readResponse().status == 200)
            }
        }
        #expect(try AdminAPIClient(port: proxy.adminPort).scrape().value("datamode_log_dropped_total") == 0)
        proxy.stop()
        let urls = Set(proxy.accessLog.compactMap { $0["url"] as? String })
        #expect(urls.count == 1000)
        #expect(proxy.stdout.split(separator: "\n").count == 1000)
    }

    /// The access log's lines with this method, polled until `count` are there (the writer is asynchronous).
    static func lines(_ proxy: ProxyProcess, method: String, count: Int = 1) -> [[String: Any]] {
        var found: [[String: Any]] = []
        _ = AdminPolling.until(timeout: .seconds(5)) {
            found = proxy.accessLog.filter { $0["method"] as? String == method }
            return found.count >= count
        }
        return found
    }

    /// SPEC §8: a tunnel is logged when it ends, with the bytes of each direction and its duration; not when it
    /// opens with `bytes: 0`. The splice(2) relay and the evbuffer path count alike.
    @Test(arguments: [true, false])
    func aConnectTunnelIsLoggedWhenItEndsWithBothDirections(splice: Bool) throws {
        let origin = try RecordingOrigin { _ in .ok(String(repeating: "x", count: 5000)) }
        defer { origin.stop() }
        let proxy = try ProxyProcess(config: "connect: {ports: [\(origin.port)]}\n",
                                     environment: splice ? [:] : ["DATAMODE_TUNNEL_SPLICE": "0"])
        defer { proxy.stop() }
        let client = try RawHTTPClient(port: proxy.port)
        try client.send(RequestText.make("CONNECT", origin.authority, host: origin.authority))
        #expect(try client.readResponse(method: "CONNECT").status == 200)
        let inner = RequestText.make("GET", "/inside", host: origin.authority)
        try client.send(inner)
        let response = try client.readResponse()
        #expect(response.status == 200)
        Thread.sleep(forTimeInterval: 0.3)
        #expect(proxy.accessLog.filter { $0["method"] as? String == "CONNECT" }.isEmpty, "logged while still open")

        client.close()
        let line = try #require(Self.lines(proxy, method: "CONNECT").first, "no line once the tunnel ended")
        #expect(line["status"] as? Int == 200)
        #expect(line["outcome"] as? String == "forwarded")
        #expect(line["reason"] is NSNull)
        #expect(line["bytesIn"] as? Int == inner.utf8.count)
        #expect(line["bytesOut"] as? Int == response.headBytes.count + response.body.count)
        #expect(line["bytes"] as? Int == line["bytesOut"] as? Int)
        #expect((line["duration"] as? Double ?? 0) >= 0.3)
    }

    @Test func anUpgradeIsLoggedWhenItsTunnelEnds() throws {
        let origin = try UpgradeEchoOrigin()
        defer { origin.stop() }
        let proxy = try ProxyProcess(config: "")
        defer { proxy.stop() }
        let client = try RawHTTPClient(port: proxy.port)
        try client.send(RequestText.make("GET", origin.url("/chat"), headers: [("Connection", "Upgrade"), ("Upgrade", "websocket")]))
        #expect(try client.readResponse().status == 101)
        let payload = PatternBody(length: 300_000, seed: 3).bytes
        #expect(try client.echoRoundTrip(payload) == payload)
        Thread.sleep(forTimeInterval: 0.2)
        #expect(proxy.accessLog.isEmpty, "logged while still open")

        client.shutdownWrite()
        _ = try client.readAll()
        client.close()
        let line = try #require(Self.lines(proxy, method: "GET").first, "no line once the tunnel ended")
        #expect(line["status"] as? Int == 101)
        #expect(line["outcome"] as? String == "forwarded")
        #expect(line["bytesIn"] as? Int == payload.count)
        #expect(line["bytesOut"] as? Int == payload.count)
        #expect((line["duration"] as? Double ?? 0) >= 0.2)
    }

    /// SPEC §6 has no code for an exchange cut short after its response started; the log and the metrics name
    /// which side cut it (README: the table of `reason` values), never a bare `aborted`.
    @Test func aClientThatLeavesMidRequestIsClientAborted() throws {
        let origin = try RecordingOrigin { _ in .ok() }
        defer { origin.stop() }
        let proxy = try ProxyProcess(config: "")
        defer { proxy.stop() }
        let client = try RawHTTPClient(port: proxy.port)
        try client.send(RequestText.make("POST", origin.url("/upload"), headers: [("Content-Length", "100000")]) + "only ten b")
        Thread.sleep(forTimeInterval: 0.2)
        client.close()
        let line = try #require(Self.lines(proxy, method: "POST").first)
        #expect(line["outcome"] as? String == "error")
        #expect(line["reason"] as? String == "client-aborted")
        #expect(try AdminAPIClient(port: proxy.adminPort).scrape()
            .counter("datamode_requests_total", ["outcome": "error", "reason": "client-aborted"]) == 1)
    }

    @Test(arguments: [
        ("HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\nonly a few bytes", "upstream-aborted"),
        ("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\nworld\r\n", "upstream-protocol-error"),
    ])
    func anOriginThatBreaksOffMidBodyIsNamed(response: String, reason: String) throws {
        let origin = try RecordingOrigin { _ in .raw(response, thenClose: true) }
        defer { origin.stop() }
        let proxy = try ProxyProcess(config: "")
        defer { proxy.stop() }
        let client = try RawHTTPClient(port: proxy.port)
        try client.send(RequestText.make("GET", origin.url("/cut")))
        let response = try? client.readResponse()
        if reason == "upstream-aborted" {
            #expect(client.isClosedByPeer())
        } else {
            // The broken chunk came with the head, before any byte went out: a clean 502 (SPEC §6).
            #expect(response?.status == 502)
        }
        let line = try #require(Self.lines(proxy, method: "GET").first)
        #expect(line["outcome"] as? String == "error")
        #expect(line["reason"] as? String == reason)
        #expect(try AdminAPIClient(port: proxy.adminPort).scrape()
            .counter("datamode_requests_total", ["outcome": "error", "reason": reason]) == 1)
    }

    /// A tunnel the client resets was still forwarded; the reason says how it ended.
    @Test(arguments: [true, false])
    func aTunnelResetByTheClientIsForwardedAndClientAborted(splice: Bool) throws {
        let tunnel = try EchoTunnel(splice: splice)
        #expect(try tunnel.client.echoRoundTrip(Array("ping".utf8)) == Array("ping".utf8))
        tunnel.client.reset()
        let line = try #require(Self.lines(tunnel.proxy, method: "CONNECT").first)
        #expect(line["outcome"] as? String == "forwarded")
        #expect(line["reason"] as? String == "client-aborted")
        #expect(line["bytesIn"] as? Int == 4)
        #expect(line["bytesOut"] as? Int == 4)
    }

    /// `datamode_bytes_total` counts a tunnel's bytes once: they were added while flowing and again when its line
    /// was written (found by reading; a tunnel of 10,000 bytes each way counted 20,000). Both relays, the splice(2)
    /// one and the evbuffer one.
    @Test(arguments: [true, false])
    func aTunnelsBytesReachTheByteCounterOnce(splice: Bool) throws {
        let tunnel = try EchoTunnel(splice: splice)
        let payload = [UInt8]((0..<10_000).map { UInt8(truncatingIfNeeded: $0 &* 7) })
        #expect(try tunnel.client.echoRoundTrip(payload) == payload)
        tunnel.client.close()
        let line = try #require(Self.lines(tunnel.proxy, method: "CONNECT").first)
        #expect(line["bytesIn"] as? Int == 10_000)
        let metrics = try AdminAPIClient(port: tunnel.proxy.adminPort).scrape()
        #expect(metrics.value("datamode_bytes_total", ["direction": "in"]) == 10_000, "\(metrics.text)")
        #expect(metrics.value("datamode_bytes_total", ["direction": "out"]) == 10_000, "\(metrics.text)")
    }

    /// SPEC §8: a line carries the resolved `tags` with the `rule` that set them, so a refusal says why.
    @Test func aRejectionsLineSaysWhichRuleSetItsTags() throws {
        let origin = try RecordingOrigin { _ in .ok() }
        defer { origin.stop() }
        let proxy = try ProxyProcess(config: """
            mode: constrained-expensive
            rules:
              - name: pages
                match: {path: "*.html"}
                tags: {allow-expensive: true}
              - name: videos
                match: {path: "*.mp4"}
                tags: {allow-constrained: false}
            """)
        defer { proxy.stop() }
        let requests: [(String, [(String, String)], Int)] = [
            ("/movie.mp4", [("Allow-Expensive", "?1")], 403),   // the rule refuses it
            ("/photo.jpg", [("Allow-Constrained", "?0")], 403),  // the client's own header refuses it
            ("/page.html", [], 200),                             // defaults and a rule allow it
        ]
        for (path, headers, status) in requests {
            #expect(try RawHTTPClient.exchange(RequestText.make("GET", origin.url(path), headers: headers), to: proxy.port).status == status)
        }
        let lines = Self.lines(proxy, method: "GET", count: 3)
        try #require(lines.count == 3)
        func line(_ path: String) -> [String: Any] { lines.first { $0["url"] as? String == origin.url(path) } ?? [:] }

        let video = line("/movie.mp4")
        #expect(video["outcome"] as? String == "rejected")
        #expect(video["tags"] as? [String: Bool] == ["allow-constrained": false, "allow-expensive": true,
                                                    "allow-ultra-constrained": false])
        #expect(video["rule"] as? String == "videos")
        #expect(video["tagSources"] as? [String: String] == ["allow-constrained": "rule", "allow-expensive": "header",
                                                             "allow-ultra-constrained": "default"])

        let photo = line("/photo.jpg")
        #expect(photo["outcome"] as? String == "rejected")
        #expect(photo["tags"] as? [String: Bool] == ["allow-constrained": false, "allow-expensive": true,
                                                    "allow-ultra-constrained": false])
        #expect(photo["rule"] is NSNull)
        #expect(photo["tagSources"] as? [String: String] == ["allow-constrained": "header", "allow-expensive": "default",
                                                             "allow-ultra-constrained": "default"])

        let page = line("/page.html")
        #expect(page["outcome"] as? String == "forwarded")
        #expect(page["tags"] as? [String: Bool] == ["allow-constrained": true, "allow-expensive": true,
                                                   "allow-ultra-constrained": false])
        #expect(page["rule"] as? String == "pages")
        #expect(page["tagSources"] as? [String: String] == ["allow-constrained": "default", "allow-expensive": "rule",
                                                            "allow-ultra-constrained": "default"])
    }

    @Test func offWritesNothing() throws {
        let origin = try RecordingOrigin()
        defer { origin.stop() }
        let proxy = try ProxyProcess(config: "log: {access: off}\n")
        defer { proxy.stop() }
        try Self.oneRequest(proxy, origin)
        proxy.stop()
        #expect(proxy.stdout.isEmpty)
    }

    @Test func aFileThatCannotBeOpenedStopsStartUpNamingIt() throws {
        let path = "/nonexistent-dir-\(UUID().uuidString)/access.log"
        let proxy = try ProxyProcess(config: "log: {access: \(path)}\n", waitForReady: false)
        defer { proxy.stop() }
        let status = proxy.waitForExit(timeout: 15)
        #expect(status != nil && status != 0)
        #expect(proxy.stderr.contains(path))
    }
}
