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
        let text = try ExternalCommand.run("/usr/bin/curl", ["-s", "-i", "--max-time", "10", "-x", "http://127.0.0.1:\(proxyPort)", url]).stdout
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
        #expect(video.headers.hasPrefix("HTTP/1.1 403 Refused by data mode (constrained)\r\n"), "\(video.headers)")
        #expect(video.headers.contains("Proxy-Status: datamode-proxy; error=http_request_denied; details=\"constrained\""))
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

/// The README's "Satellite: only what opts in", run with exactly the commands the README shows: the demo proxy,
/// `datamode-proxy mode satellite`, and curl with and without `Allow-Ultra-Constrained: ?1`.
@Suite struct ReadmeSatelliteWalkthroughTests {
    /// The section's shell lines, in order: comments cut, `.build/release/` dropped.
    static func readmeCommands(section heading: String = "## Satellite: only what opts in") throws -> [String] {
        let readme = try String(contentsOfFile: ProxyProcess.packageRoot + "/README.md", encoding: .utf8)
        let start = try #require(readme.range(of: heading))
        let rest = readme[start.upperBound...]
        let section = rest[..<(rest.range(of: "\n## ")?.lowerBound ?? rest.endIndex)]
        let open = try #require(section.range(of: "```sh\n"))
        let close = try #require(section[open.upperBound...].range(of: "\n```"))
        return section[open.upperBound..<close.lowerBound].split(separator: "\n").compactMap { line in
            var command = line.hasPrefix("#") ? "" : String(line)
            if let comment = command.range(of: " #") { command = String(command[..<comment.lowerBound]) }
            command = command.trimmingCharacters(in: .whitespaces)
            if command.hasPrefix(".build/release/") { command.removeFirst(".build/release/".count) }
            return command.isEmpty ? nil : command
        }
    }

    /// Shell words, with single quotes as in the README.
    static func words(_ line: String) -> [String] {
        var words: [String] = []
        var current = ""
        var quoted = false
        var inWord = false
        for character in line {
            if character == "'" { quoted.toggle(); inWord = true; continue }
            if character == " " && !quoted {
                if inWord { words.append(current); current = ""; inWord = false }
                continue
            }
            current.append(character)
            inWord = true
        }
        if inWord { words.append(current) }
        return words
    }

    /// curl with `arguments` (after `curl`): (status, headers text, body).
    static func curl(_ arguments: [String]) throws -> (status: Int, headers: String, body: String) {
        let text = try ExternalCommand.run("/usr/bin/curl", ["-s", "--max-time", "10"] + arguments).stdout
        let parts = text.components(separatedBy: "\r\n\r\n")
        let status = Int(parts[0].split(separator: " ").dropFirst().first ?? "") ?? 0
        return (status, parts[0], parts.dropFirst().joined(separator: "\r\n\r\n"))
    }

    static func problem(_ body: String) throws -> [String: Any] {
        try #require(try JSONSerialization.jsonObject(with: Data(body.utf8)) as? [String: Any])
    }

    @Test func satelliteWalkthrough() throws {
        let all = try Self.readmeCommands()
        // The first two lines start the origin and the demo proxy, the last one stops them: the test does that
        // with its own origin (same files) and the demo config; everything between runs exactly as written.
        #expect(Array(all.prefix(2)) == [
            "python3 -m http.server 8080 --bind 127.0.0.1 --directory config/examples/www &",
            "datamode-proxy run --config config/examples/demo.yaml &",
        ])
        #expect(all.last == "kill %2 %1")
        let commands = Array(all.dropFirst(2).dropLast())
        #expect(commands == [
            "datamode-proxy mode satellite",
            "curl -i -x 127.0.0.1:8877 http://127.0.0.1:8080/index.html",
            "curl -i -x 127.0.0.1:8877 -H 'Allow-Ultra-Constrained: ?1' http://127.0.0.1:8080/index.html",
            "curl -i -x 127.0.0.1:8877 -H 'Allow-Ultra-Constrained: ?1' http://127.0.0.1:8080/video.mp4",
            "datamode-proxy mode --reset",
        ])
        try #require(commands.count == 5)

        // The origin and the demo proxy of the first walk-through.
        let origin = try ReadmeWalkthroughTests.staticOrigin()
        defer { origin.stop() }
        let config = try String(contentsOfFile: ProxyProcess.packageRoot + "/config/examples/demo.yaml", encoding: .utf8)
            .replacingOccurrences(of: "127.0.0.1:8080", with: origin.authority)
            .replacingOccurrences(of: "file: variants/poster.jpg", with: "file: \(ReadmeWalkthroughTests.variants)/poster.jpg")
            + "\nvariants-dir: \(ReadmeWalkthroughTests.variants)\n"
        let proxy = try ProxyProcess(config: config)
        defer { proxy.stop() }
        let admin = "127.0.0.1:\(proxy.adminPort)"

        /// Runs one README line against this proxy and origin.
        func run(_ line: String) throws -> (status: Int, headers: String, body: String) {
            let words = Self.words(line)
            if words[0] == "datamode-proxy" {
                let result = try ProxyProcess.runCLI(Array(words.dropFirst()) + ["--admin", admin])
                #expect(result.status == 0, "\(line): \(result.stderr)")
                return (Int(result.status), "", result.stdout)
            }
            #expect(words[0] == "curl")
            return try Self.curl(words.dropFirst().map {
                $0.replacingOccurrences(of: "127.0.0.1:8877", with: "127.0.0.1:\(proxy.port)")
                    .replacingOccurrences(of: "127.0.0.1:8080", with: origin.authority)
            })
        }

        // Satellite: all three conditions, by one admin call.
        let flip = try run(commands[0])
        #expect(flip.body.contains("\"mode\":\"constrained-expensive-ultra-constrained\""), "\(flip.body)")
        #expect(flip.body.contains("\"ultraConstrained\":true"), "\(flip.body)")

        // A request that says nothing is refused for the one condition it does not allow, and never reaches the origin.
        let silent = try run(commands[1])
        #expect(silent.status == 403)
        #expect(silent.headers.contains("Network-Unavailable-Reason: ultra-constrained"))
        #expect(silent.headers.contains("Content-Type: application/problem+json"))
        let refusal = try Self.problem(silent.body)
        #expect(refusal["type"] as? String == "urn:datamode:ultra-constrained")
        #expect(refusal["title"] as? String == "Not allowed on an ultra-constrained network")
        #expect(refusal["status"] as? Int == 403)
        #expect(refusal["error"] as? String == "ultra-constrained")
        #expect(refusal["reasons"] as? [String] == ["ultra-constrained"])
        #expect(refusal["mode"] as? String == "constrained-expensive-ultra-constrained")
        #expect(refusal["url"] as? String == origin.url("/index.html"))
        #expect(origin.requests.isEmpty)

        // Opted in: forwarded, with the tag and Save-Data upstream.
        let optedIn = try run(commands[2])
        #expect(optedIn.status == 200)
        #expect(optedIn.body == "hello from the origin\n")
        #expect(origin.requests.map(\.target) == ["/index.html"])
        #expect(origin.requests.last?.value(of: "Allow-Ultra-Constrained") == "?1")
        #expect(origin.requests.last?.value(of: "Save-Data") == "on")

        // Opting in to satellite does not lift Low Data Mode: the videos rule still refuses the video.
        let video = try run(commands[3])
        #expect(video.status == 403)
        #expect(video.headers.contains("Network-Unavailable-Reason: constrained"))
        #expect(try Self.problem(video.body)["reasons"] as? [String] == ["constrained"])

        // The paragraph after the block: without the header, both reasons, constrained first.
        let both = try Self.curl(["-i", "-x", "127.0.0.1:\(proxy.port)", origin.url("/video.mp4")])
        #expect(both.headers.contains("Network-Unavailable-Reason: constrained"))
        let bothProblem = try Self.problem(both.body)
        #expect(bothProblem["error"] as? String == "constrained")
        #expect(bothProblem["reasons"] as? [String] == ["constrained", "ultra-constrained"])
        #expect(origin.requests.count == 1)

        // Back to the file's mode: normal, and not persisted as an API mode.
        _ = try run(commands[4])
        let mode = try ProxyProcess.runCLI(["mode", "--admin", admin])
        #expect(mode.stdout.contains("\"mode\":\"normal\""), "\(mode.stdout)")
        #expect(mode.stdout.contains("\"ultraConstrained\":false"), "\(mode.stdout)")
        #expect(!mode.stdout.contains("\"source\":\"api\""), "\(mode.stdout)")
        // Normal again: the same silent request is forwarded.
        #expect(try Self.curl(["-i", "-x", "127.0.0.1:\(proxy.port)", origin.url("/index.html")]).status == 200)
        #expect(origin.requests.count == 2)

        let lines = proxy.accessLog
        #expect(lines.compactMap { $0["outcome"] as? String } == ["rejected", "forwarded", "rejected", "rejected", "forwarded"])
        #expect(lines.compactMap { $0["reason"] as? String } == ["ultra-constrained", "constrained", "constrained"])
    }
}

/// The README's "HTTPS in two minutes": `ca init`, the proxy with config/examples/https-demo.yaml, curl trusting the
/// CA, the mode flipped with `datamode-proxy mode`: the hero image replaced and the video refused inside TLS.
@Suite struct ReadmeHTTPSWalkthroughTests {
    @Test func newcomerHTTPSWalkthrough() throws {
        let directory = try ScratchDirectory.make("datamode-readme-https")
        defer { ScratchDirectory.remove(directory) }
        let origin = try HTTPSOrigin(directory: directory + "/origin")
        defer { origin.stop() }
        for name in ["img/hero.jpg", "img/hero@small.jpg", "video.mp4", "index.html"] {
            try origin.publish(name, [UInt8](try Data(contentsOf: URL(fileURLWithPath: ReadmeWalkthroughTests.www + "/" + name))))
        }
        let state = directory + "/state"
        let initialized = try ProxyProcess.runCLI(["ca", "init", "--state-dir", state])
        #expect(initialized.status == 0 && initialized.stdout.contains("SHA-256:"), "\(initialized.output)")
        var config = try String(contentsOfFile: ProxyProcess.packageRoot + "/config/examples/https-demo.yaml", encoding: .utf8)
        config = config.replacingOccurrences(of: "8443", with: String(origin.port))
        let proxy = try ProxyProcess(config: config, arguments: ["--state-dir", state],
                                     environment: ["SSL_CERT_FILE": origin.certificatePath])
        defer { proxy.stop() }
        func curl(_ path: String, trust: Bool = true) throws -> ExternalCommand.Result {
            var arguments = ["-s", "-i", "--max-time", "20", "--suppress-connect-headers", "-x", "127.0.0.1:\(proxy.port)"]
            if trust { arguments += ["--cacert", state + "/ca.pem"] }
            return try ExternalCommand.run("/usr/bin/curl", arguments + ["https://localhost:\(origin.port)\(path)"])
        }
        let admin = ["--admin", "127.0.0.1:\(proxy.adminPort)"]

        let full = try curl("/img/hero.jpg")
        // curl offers h2 and the proxy picks it inside the tunnel (SPEC §17), as the README shows.
        #expect(full.stdout.hasPrefix("HTTP/2 200") && full.stdout.contains("full-size hero"), "\(full.output)")
        #expect(try ProxyProcess.runCLI(["mode", "constrained"] + admin).status == 0)
        let video = try curl("/video.mp4")
        #expect(video.stdout.hasPrefix("HTTP/2 403"), "\(video.output)")
        #expect(video.stdout.contains("network-unavailable-reason: constrained"))
        // HTTP/2 has no reason phrase (RFC 9113 §8.3.2); Proxy-Status says why all the same (SPEC §20).
        #expect(video.stdout.contains("proxy-status: datamode-proxy; error=http_request_denied; details=\"constrained\""),
                "\(video.output)")
        #expect(video.stdout.contains("\"url\":\"https://localhost:\(origin.port)/video.mp4\""))
        let small = try curl("/img/hero.jpg")
        #expect(small.stdout.hasPrefix("HTTP/2 200") && small.stdout.contains("data-mode-variant: hero-small"), "\(small.output)")
        let h2Lines = proxy.accessLog.filter { $0["method"] as? String == "GET" }
        #expect(!h2Lines.isEmpty && h2Lines.allSatisfy { $0["proto"] as? String == "h2" }, "the access log's proto: \(h2Lines)")
        #expect(small.stdout.hasSuffix("small hero image\n"), "\(small.output)")
        let untrusted = try curl("/img/hero.jpg", trust: false)
        #expect(untrusted.status == 60, "curl must refuse the leaf without the CA: \(untrusted.output)")
        #expect(try ProxyProcess.runCLI(["mode", "--reset"] + admin).status == 0)
    }
}

/// The link-profile and budget walk-throughs of the README (SPEC §10, §11), run as written.
@Suite struct ReadmeLinkAndBudgetWalkthroughTests {
    /// "Make it feel like 3G": the README's commands as written, against a proxy whose `nlc-3g` is ten times
    /// faster (7.8 Mbit/s, the same 200 ms), so the 1 MB download takes about 1.2 s instead of 10.5.
    @Test func threeGWalkthrough() throws {
        let all = try ReadmeSatelliteWalkthroughTests.readmeCommands(section: "## Make it feel like 3G in two minutes")
        #expect(Array(all.prefix(3)) == [
            "mkdir -p /tmp/www && head -c 1000000 /dev/urandom > /tmp/www/1mb.bin",
            "python3 -m http.server 8080 --bind 127.0.0.1 --directory /tmp/www &",
            "swift build -c release && .build/release/datamode-proxy run &",
        ])
        #expect(all.last == "kill %2 %1")
        let commands = Array(all.dropFirst(3).dropLast())
        let download = "curl -x 127.0.0.1:8877 -o /dev/null -w '%{time_total}s\\n' http://127.0.0.1:8080/1mb.bin"
        #expect(commands == [download, "datamode-proxy conditions nlc-3g", download, "datamode-proxy conditions",
                             "datamode-proxy conditions --reset"])
        try #require(commands.count == 5)

        let body = [UInt8](repeating: 0x5A, count: 1_000_000)
        let origin = try RecordingOrigin { _ in .respond(status: 200, body: body) }
        defer { origin.stop() }
        let proxy = try ProxyProcess(config: "profiles:\n  nlc-3g: {down: 7.8Mbit, up: 3.3Mbit}\n")
        defer { proxy.stop() }
        func run(_ line: String) throws -> String {
            let words = ReadmeSatelliteWalkthroughTests.words(line)
            if words[0] == "datamode-proxy" {
                let result = try ProxyProcess.runCLI(Array(words.dropFirst()) + ["--admin", "127.0.0.1:\(proxy.adminPort)"])
                #expect(result.status == 0, "\(line): \(result.stderr)")
                return result.stdout
            }
            let arguments = words.dropFirst().map {
                $0.replacingOccurrences(of: "127.0.0.1:8877", with: "127.0.0.1:\(proxy.port)")
                    .replacingOccurrences(of: "127.0.0.1:8080", with: origin.authority)
                    .replacingOccurrences(of: "\\n", with: "\n")
            }
            return try ExternalCommand.run("/usr/bin/curl", ["-s", "--max-time", "30"] + arguments).stdout
        }
        func seconds(_ text: String) -> Double { Double(text.trimmingCharacters(in: .whitespacesAndNewlines).dropLast()) ?? -1 }

        let plain = seconds(try run(commands[0]))
        #expect(plain >= 0 && plain < 1.0, "unshaped: \(plain) s")
        #expect(try run(commands[1]).contains("\"profile\":\"nlc-3g\""))
        // 200 ms, then 1,000,000 bytes (plus a head) at 7.8 Mbit/s: 1.03 s, less the 50 ms burst.
        let shaped = seconds(try run(commands[2]))
        #expect(shaped >= 1.15 && shaped < 6, "shaped: \(shaped) s")
        let shown = try run(commands[3])
        #expect(shown.contains("\"source\":\"api\"") && shown.contains("\"down\":7800000"), "\(shown)")
        #expect(try run(commands[4]).contains("\"source\":\"none\""))
    }

    /// "A 5 GB daily budget": the README's YAML as the config file and its commands as written.
    @Test func dailyBudgetWalkthrough() throws {
        let readme = try String(contentsOfFile: ProxyProcess.packageRoot + "/README.md", encoding: .utf8)
        let start = try #require(readme.range(of: "## A 5 GB daily budget in two minutes"))
        let yamlOpen = try #require(readme[start.upperBound...].range(of: "```yaml\n"))
        let yamlClose = try #require(readme[yamlOpen.upperBound...].range(of: "\n```"))
        let yaml = String(readme[yamlOpen.upperBound..<yamlClose.lowerBound])
        #expect(yaml.contains("bytes: 5GB"))
        let commands = try ReadmeSatelliteWalkthroughTests.readmeCommands(section: "## A 5 GB daily budget in two minutes")
        #expect(commands == [
            "datamode-proxy run --config my.yaml &",
            "datamode-proxy budgets",
            "curl -x 127.0.0.1:8877 -o /dev/null http://127.0.0.1:8080/1mb.bin",
            "datamode-proxy budgets",
        ])
        try #require(commands.count == 4)

        let origin = try RecordingOrigin { _ in .respond(status: 200, body: [UInt8](repeating: 0x42, count: 1_000_000)) }
        defer { origin.stop() }
        let proxy = try ProxyProcess(config: yaml)
        defer { proxy.stop() }
        func budgets() throws -> [String: Any] {
            let result = try ProxyProcess.runCLI(["budgets", "--admin", "127.0.0.1:\(proxy.adminPort)"])
            #expect(result.status == 0, "\(result.stderr)")
            let list = try #require(try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [[String: Any]])
            return try #require(list.first)
        }
        let before = try budgets()
        #expect(before["name"] as? String == "daily" && before["bytes"] as? Int == 5_000_000_000)
        #expect(before["used"] as? Int == 0 && before["spent"] as? Bool == false && before["then"] as? String == "constrained")
        let words = ReadmeSatelliteWalkthroughTests.words(commands[2]).dropFirst().map {
            $0.replacingOccurrences(of: "127.0.0.1:8877", with: "127.0.0.1:\(proxy.port)")
                .replacingOccurrences(of: "127.0.0.1:8080", with: origin.authority)
        }
        _ = try ExternalCommand.run("/usr/bin/curl", ["-s", "--max-time", "30"] + words)
        // The body, the response head and the request as the origin got it.
        let used = try #require(try budgets()["used"] as? Int)
        #expect(used > 1_000_000 && used < 1_001_000, "used \(used)")
    }
}

/// The README's "Test rigs: sessions, events, schedules" walk-through as written: a config that turns sessions on
/// (a newcomer who skipped it would get `409 sessions-disabled`), two sessions, a refusal judged by rig-a's mode.
@Suite struct ReadmeSessionsWalkthroughTests {
    @Test func sessionsWalkthrough() throws {
        let all = try ReadmeSatelliteWalkthroughTests.readmeCommands(section: "## Test rigs: sessions, events, schedules")
        #expect(Array(all.prefix(2)) == [
            "printf 'sessions: {enabled: true}\\n' > /tmp/rigs.yaml",
            "datamode-proxy run --config /tmp/rigs.yaml &",
        ])
        #expect(all.last == "kill %1")
        let commands = Array(all.dropFirst(2).dropLast())
        try #require(commands.count == 5, "\(commands)")
        // The config the printf writes, as the proxy's file.
        let proxy = try ProxyProcess(config: "sessions: {enabled: true}\n")
        defer { proxy.stop() }
        var outputs: [String] = []
        for line in commands {
            let words = ReadmeSatelliteWalkthroughTests.words(line)
            if words[0] == "datamode-proxy" {
                let result = try ProxyProcess.runCLI(Array(words.dropFirst()) + ["--admin", "127.0.0.1:\(proxy.adminPort)"])
                #expect(result.status == 0, "\(line): \(result.stderr)")
                outputs.append(result.stdout)
            } else {
                #expect(words[0] == "curl")
                let result = try ReadmeSatelliteWalkthroughTests.curl(["-i"] + words.dropFirst().map {
                    $0.replacingOccurrences(of: "127.0.0.1:8877", with: "127.0.0.1:\(proxy.port)")
                })
                #expect(result.status == 403, "\(line): \(result.headers)")
                #expect(result.headers.contains("HTTP/1.1 403 Refused by data mode (constrained)"))
                outputs.append(result.body)
            }
        }
        let created = try ReadmeSatelliteWalkthroughTests.problem(outputs[0])
        #expect(created["mode"] as? String == "constrained" && created["id"] as? String == "rig-a")
        #expect(try ReadmeSatelliteWalkthroughTests.problem(outputs[2])["error"] as? String == "constrained")
        let tally = try ReadmeSatelliteWalkthroughTests.problem(outputs[3])
        #expect(tally["requestsTotal"] as? Int == 1, "\(tally)")
        #expect((tally["rejected"] as? [[String: Any]])?.first?["url"] as? String == "http://cdn.example/hero.jpg")
        #expect((tally["requests"] as? [String: [String: Int]])?["rejected"]?["constrained"] == 1)
        #expect(try ReadmeSatelliteWalkthroughTests.problem(outputs[4])["requestsTotal"] as? Int == 1)
    }
}
