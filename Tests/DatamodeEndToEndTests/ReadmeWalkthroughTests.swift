import DatamodeHTTP
import DatamodeTestSupport
import Foundation
import Testing

/// The README's "Low Data Mode in two minutes", run exactly as a newcomer would: the real binary with
/// config/examples/demo.yaml, the mode flipped with `datamode-proxy mode`, and curl as the client.
@Suite struct ReadmeWalkthroughTests {
    static let www = ProxyProcess.packageRoot + "/config/examples/www"
    /// The demo's variants directory (the config is copied elsewhere, so it is named explicitly).
    static let variants = ProxyProcess.packageRoot + "/config/examples/variants"

    /// Serves config/examples/www like `python3 -m http.server` would.
    static func staticOrigin() throws -> RecordingOrigin {
        try RecordingOrigin { request in
            let path = www + request.target.split(separator: "?").first.map(String.init)!
            guard let data = FileManager.default.contents(atPath: path) else { return .status(404, "not found") }
            return .respond(status: 200, headers: [HTTPField(name: "Content-Type", value: "application/octet-stream")], body: Array(data))
        }
    }

    /// curl through the proxy: (status, headers text, body).
    static func curl(_ proxyPort: UInt16, _ url: String) throws -> (status: Int, headers: String, body: String) {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/curl")
        process.arguments = ["-s", "-i", "--max-time", "10", "-x", "http://127.0.0.1:\(proxyPort)", url]
        let pipe = Pipe()
        process.standardOutput = pipe
        try process.run()
        let data = pipe.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        let text = String(decoding: data, as: UTF8.self)
        let parts = text.components(separatedBy: "\r\n\r\n")
        let status = Int(parts[0].split(separator: " ").dropFirst().first ?? "") ?? 0
        return (status, parts[0], parts.dropFirst().joined(separator: "\r\n\r\n"))
    }

    /// The arguments of every `datamode-proxy mode …` line of the README's walk-through, in order (comments cut):
    /// the test runs exactly these, so the README and this test cannot drift apart.
    static func readmeModeCommands() throws -> [[String]] {
        let readme = try String(contentsOfFile: ProxyProcess.packageRoot + "/README.md", encoding: .utf8)
        let start = try #require(readme.range(of: "## Low Data Mode in two minutes"))
        let rest = readme[start.upperBound...]
        let section = rest[..<(rest.range(of: "\n## ")?.lowerBound ?? rest.endIndex)]
        return section.split(separator: "\n").compactMap { line -> [String]? in
            guard let command = line.range(of: "datamode-proxy mode ") else { return nil }
            let arguments = line[command.upperBound...].prefix { $0 != "#" }
            return ["mode"] + arguments.split(separator: " ").map(String.init)
        }
    }

    @Test func newcomerWalkthrough() throws {
        let modeCommands = try Self.readmeModeCommands()
        // Flip to constrained, and end by handing the mode back to the flag/config (`mode normal` would persist an
        // API mode that beats the `--mode` of every later start with the same state directory).
        try #require(modeCommands == [["mode", "constrained"], ["mode", "--reset"]], "\(modeCommands)")
        let origin = try Self.staticOrigin()
        defer { origin.stop() }
        var config = try String(contentsOfFile: ProxyProcess.packageRoot + "/config/examples/demo.yaml", encoding: .utf8)
        config = config.replacingOccurrences(of: "127.0.0.1:8080", with: origin.authority)
            .replacingOccurrences(of: "file: variants/poster.jpg", with: "file: \(Self.variants)/poster.jpg")
            + "\nvariants-dir: \(Self.variants)\n"
        let proxy = try ProxyProcess(config: config)
        defer { proxy.stop() }
        let hero = origin.url("/img/hero.jpg")

        // Normal mode: the full-size image.
        let full = try Self.curl(proxy.port, hero)
        #expect(full.status == 200)
        #expect(full.body == "full-size hero image (pretend this is 2 MB)\n")

        // One admin call flips the mode.
        let flip = try ProxyProcess.runCLI(modeCommands[0] + ["--admin", "127.0.0.1:\(proxy.adminPort)"])
        #expect(flip.status == 0, "\(flip.stderr)")
        #expect(flip.stdout.contains("\"mode\":\"constrained\""))

        // A video request is refused with `constrained`, and nothing reaches the origin for it.
        let before = origin.requests.count
        let video = try Self.curl(proxy.port, origin.url("/video.mp4"))
        #expect(video.status == 403)
        #expect(video.headers.contains("Network-Unavailable-Reason: constrained"))
        #expect(video.headers.contains("Content-Type: application/problem+json"))
        let problem = try JSONSerialization.jsonObject(with: Data(video.body.utf8)) as? [String: Any]
        #expect(problem?["error"] as? String == "constrained")
        #expect(problem?["reasons"] as? [String] == ["constrained"])
        #expect(problem?["mode"] as? String == "constrained")
        #expect(problem?["url"] as? String == origin.url("/video.mp4"))
        #expect(origin.requests.count == before)

        // The image is served as its small variant, fetched from the variant's URL.
        let small = try Self.curl(proxy.port, hero)
        #expect(small.status == 200)
        #expect(small.headers.contains("Data-Mode-Variant: hero-small"))
        #expect(small.body == "small hero image\n")
        #expect(origin.requests.last?.target == "/img/hero@small.jpg")
        #expect(origin.requests.last?.value(of: "Save-Data") == "on")

        // The promo video is answered with the local poster frame.
        let poster = try Self.curl(proxy.port, origin.url("/promo.mp4"))
        #expect(poster.status == 200)
        #expect(poster.headers.contains("Data-Mode-Variant: promo-poster"))
        #expect(poster.headers.contains("Content-Type: image/jpeg"))
        #expect(poster.body == "poster frame\n")

        // Everything else is forwarded as usual.
        let page = try Self.curl(proxy.port, origin.url("/index.html"))
        #expect(page.status == 200)
        #expect(page.body == "hello from the origin\n")

        // Back to the file's mode (normal): the full image again, and no API mode left behind.
        let reset = try ProxyProcess.runCLI(modeCommands[1] + ["--admin", "127.0.0.1:\(proxy.adminPort)"])
        #expect(reset.status == 0, "\(reset.stderr)")
        #expect(try Self.curl(proxy.port, hero).body == "full-size hero image (pretend this is 2 MB)\n")
        let mode = try AdminAPIClient(port: proxy.adminPort).get("/mode").object
        #expect(mode["mode"] as? String == "normal")
        #expect(mode["source"] as? String != "api")

        // One access-log line per request, with the outcome.
        proxy.stop()
        let outcomes = proxy.accessLog.compactMap { $0["outcome"] as? String }
        #expect(outcomes == ["forwarded", "rejected", "rewritten", "rewritten", "forwarded", "forwarded"])

        // What the README says next: `start.sh --mode constrained`, with the same state directory, starts constrained.
        let next = try ProxyProcess(config: config, arguments: ["--mode", "constrained"], directory: proxy.directory)
        defer { next.stop() }
        let nextMode = try AdminAPIClient(port: next.adminPort).get("/mode").object
        #expect(nextMode["mode"] as? String == "constrained")
        #expect(nextMode["source"] as? String == "flag")
    }
}
