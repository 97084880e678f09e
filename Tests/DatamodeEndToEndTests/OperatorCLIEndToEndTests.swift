import DatamodeTestSupport
import Foundation
import Testing

/// SPEC §20's CLI for people, through the real binary: tables on a terminal (a pseudo-terminal from `script`),
/// JSON in a pipe or with `--json`, `NO_COLOR`, `status`, `schedule`, and `watch` failing loudly.
@Suite struct OperatorCLIEndToEndTests {
    static let escape = "\u{1B}["

    static func proxy() throws -> ProxyProcess {
        try ProxyProcess(config: """
            mode: constrained
            sessions: {enabled: true}
            rules:
              - name: no-refused
                match: {host: refused.example}
                tags: {allow-constrained: false}
            budgets:
              - {name: daily, bytes: 10MB, period: day, then: constrained}
            """)
    }

    @Test func aTerminalGetsTablesAPipeGetsJSON() throws {
        let proxy = try Self.proxy()
        defer { proxy.stop() }
        let admin = ["--admin", "127.0.0.1:\(proxy.adminPort)"]

        let piped = try ProxyProcess.runCLI(["budgets"] + admin)
        #expect(piped.status == 0)
        let list = try JSONSerialization.jsonObject(with: Data(piped.stdoutBytes)) as? [[String: Any]]
        #expect(list?.first?["name"] as? String == "daily")

        let table = try ProxyProcess.runCLIOnTerminal(["budgets"] + admin, environment: ["NO_COLOR": "1"])
        #expect(table.status == 0)
        let lines = table.stdout.split(separator: "\n").map(String.init)
        #expect(lines.first?.hasPrefix("BUDGET  USED  OF       REMAINING") == true, "\(table.stdout)")
        #expect(lines.count == 2 && lines[1].hasPrefix("daily   0 B   10.0 MB  10.0 MB"), "\(table.stdout)")
        #expect(!table.stdout.contains(Self.escape), "NO_COLOR: no escape sequences")

        let colored = try ProxyProcess.runCLIOnTerminal(["mode"] + admin)
        #expect(colored.stdout.contains(Self.escape + "1m"), "bold names on a terminal: \(colored.stdout)")
        #expect(colored.stdout.contains("constrained"))

        let forced = try ProxyProcess.runCLIOnTerminal(["mode", "--json"] + admin)
        let mode = try JSONSerialization.jsonObject(with: Data(forced.stdoutBytes)) as? [String: Any]
        #expect(mode?["mode"] as? String == "constrained", "--json on a terminal: \(forced.stdout)")
    }

    @Test func statusIsOneScreenOfEverything() throws {
        let proxy = try Self.proxy()
        defer { proxy.stop() }
        let admin = ["--admin", "127.0.0.1:\(proxy.adminPort)"]
        _ = try ExternalCommand.run("/usr/bin/curl", ["-s", "-o", "/dev/null", "-x", "http://127.0.0.1:\(proxy.port)",
                                                      "http://refused.example/blocked"])
        #expect(try ProxyProcess.runCLI(["sessions", "rig-1", "--mode", "expensive"] + admin).status == 0)
        AdminPolling.until { (try? AdminAPIClient(port: proxy.adminPort).get("/refusals").bodyText.contains("blocked")) == true }

        let screen = try ProxyProcess.runCLIOnTerminal(["status"] + admin, environment: ["NO_COLOR": "1"])
        #expect(screen.status == 0)
        let text = screen.stdout
        for expected in ["mode         constrained (set by config", "profile      no shaping", "last minute", "Budgets",
                         "daily", "Sessions", "rig-1    expensive", "Schedules", "Deferred uploads", "Latest refusals",
                         "GET http://refused.example/blocked", "no-refused"] {
            #expect(text.contains(expected), "\(expected) in:\n\(text)")
        }

        let json = try ProxyProcess.runCLI(["status"] + admin)
        let object = try #require(try JSONSerialization.jsonObject(with: Data(json.stdoutBytes)) as? [String: Any])
        #expect(Set(object.keys) == ["mode", "conditions", "traffic", "budgets", "sessions", "schedule", "deferred", "refusals"])
        #expect((object["mode"] as? [String: Any])?["mode"] as? String == "constrained")
    }

    @Test func scheduleSetsShowsAndClears() throws {
        let proxy = try Self.proxy()
        defer { proxy.stop() }
        let admin = ["--admin", "127.0.0.1:\(proxy.adminPort)"]
        let set = try ProxyProcess.runCLI(["schedule", "0s=expensive", "1h=normal", "--repeat"] + admin)
        #expect(set.status == 0, "\(set.stderr)")
        let shown = try ProxyProcess.runCLIOnTerminal(["schedule"] + admin, environment: ["NO_COLOR": "1"])
        #expect(shown.stdout.contains("global  0ms expensive → 3600000ms normal  yes"), "\(shown.stdout)")
        AdminPolling.until { (try? AdminAPIClient(port: proxy.adminPort).get("/mode").object["mode"] as? String) == "expensive" }
        #expect(try AdminAPIClient(port: proxy.adminPort).get("/mode").object["source"] as? String == "schedule")

        let cleared = try ProxyProcess.runCLI(["schedule", "--clear"] + admin)
        #expect(cleared.status == 0)
        let after = try ProxyProcess.runCLI(["schedule"] + admin)
        let remaining = (try JSONSerialization.jsonObject(with: Data(after.stdoutBytes)) as? [String: Any])?["schedules"] as? [Any]
        #expect(remaining?.isEmpty == true, "\(after.stdout)")
        let bad = try ProxyProcess.runCLI(["schedule", "30s"] + admin)
        #expect(bad.status != 0 && bad.stderr.contains("AFTER=MODE"))
    }

    @Test func watchFailsLoudlyWhenTheStreamEnds() throws {
        let proxy = try Self.proxy()
        let watcher = Process()
        watcher.executableURL = URL(fileURLWithPath: ProxyProcess.binaryPath)
        watcher.arguments = ["watch", "--admin", "127.0.0.1:\(proxy.adminPort)"]
        let output = Pipe(), errors = Pipe()
        watcher.standardOutput = output
        watcher.standardError = errors
        try watcher.run()
        Thread.sleep(forTimeInterval: 1.5)  // time to open its stream and print the first event (checked below)
        proxy.stop()
        AdminPolling.until(timeout: .seconds(20)) { !watcher.isRunning }
        if watcher.isRunning { watcher.terminate() }
        watcher.waitUntilExit()
        let printed = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        let complaint = String(decoding: errors.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        #expect(printed.hasPrefix("mode {"), "\(printed)")
        #expect(watcher.terminationStatus == 1)
        #expect(complaint.contains("the event stream from 127.0.0.1:\(proxy.adminPort) ended"), "\(complaint)")
    }
}

/// Completions come from the CLI definition (swift-argument-parser), so every subcommand is in them.
@Suite struct CompletionScriptTests {
    @Test(arguments: ["bash", "zsh", "fish"])
    func everySubcommandIsCompleted(_ shell: String) throws {
        let dump = try ExternalCommand.run(ProxyProcess.binaryPath, ["--experimental-dump-help"])
        let tool = try #require(try JSONSerialization.jsonObject(with: Data(dump.stdoutBytes)) as? [String: Any])
        let subcommands = ((tool["command"] as? [String: Any])?["subcommands"] as? [[String: Any]] ?? [])
            .compactMap { $0["commandName"] as? String }
        let script = try ExternalCommand.run(ProxyProcess.binaryPath, ["--generate-completion-script", shell])
        #expect(script.status == 0)
        for subcommand in subcommands {
            #expect(script.stdout.contains(subcommand), "\(shell): \(subcommand)")
        }
        #expect(script.stdout.contains("json"), "the --json flag")
    }
}
