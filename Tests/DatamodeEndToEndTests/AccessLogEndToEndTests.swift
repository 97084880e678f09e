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
