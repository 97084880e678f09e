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
