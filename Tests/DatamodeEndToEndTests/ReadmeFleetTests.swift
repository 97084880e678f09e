import DatamodeTestSupport
import Foundation
import Testing

/// The README's "A fleet of sidecars" block, run as it is written with bash, the built binary and Debian's
/// redis-server: three proxies on one Redis, a mode change through one in force on all three, traffic through one
/// counted by another, a session set through one honoured by another, Redis killed. Only the ports change (free ones) and `$ORIGIN` (a recording origin). The
/// block's numbers are the compose file's (`docker/compose.fleet.yaml`, `docker/fleet/datamode.yaml`).
@Suite struct ReadmeFleetTests {
    @Test func fleetWalkthrough() throws {
        let readme = try String(contentsOfFile: ProxyProcess.packageRoot + "/README.md", encoding: .utf8)
        let section = try #require(readme.range(of: "## A fleet of sidecars"))
        let rest = readme[section.upperBound...]
        let open = try #require(rest.range(of: "```sh\n"))
        let close = try #require(rest.range(of: "\n```\n", range: open.upperBound..<rest.endIndex))
        var script = String(rest[open.upperBound..<close.lowerBound])

        // The compose file's numbers are the block's.
        let fleetConfig = try String(contentsOfFile: ProxyProcess.packageRoot + "/docker/fleet/datamode.yaml", encoding: .utf8)
        let compose = try String(contentsOfFile: ProxyProcess.packageRoot + "/docker/compose.fleet.yaml", encoding: .utf8)
        #expect(fleetConfig.contains("name: fleet-daily") && fleetConfig.contains("bytes: 5GB") && fleetConfig.contains("then: constrained"))
        #expect(fleetConfig.contains("key-prefix: \"fleet:\"") && script.contains("key-prefix: \"fleet:\""))
        #expect(script.contains("{name: fleet-daily, bytes: 5GB, period: day, then: constrained}"))
        #expect(compose.contains("datamode-proxy-1:") && compose.contains("datamode-proxy-2:") && compose.contains("datamode-proxy-3:")
                && compose.contains("--appendonly yes") && compose.contains("./fleet/datamode.yaml"))
        let check = try ExternalCommand.run(ProxyProcess.binaryPath, ["check", "--config", ProxyProcess.packageRoot + "/docker/fleet/datamode.yaml"],
                                            environment: [:], timeout: 30)
        #expect(check.status == 0, "\(check.stdout)\(check.stderr)")

        for port in ["6379", "18877", "18878", "28877", "28878", "38877", "38878"] {
            script = script.replacingOccurrences(of: port, with: String(try LoopbackPort.refusingConnections()))
        }
        let origin = try RecordingOrigin { _ in .ok("hello fleet") }
        defer { origin.stop() }
        let directory = try ScratchDirectory.make("readme-fleet")
        defer { ScratchDirectory.remove(directory) }
        let binaries = (ProxyProcess.binaryPath as NSString).deletingLastPathComponent
        var environment = [
            "PATH": binaries + ":" + (ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin"),
            "ORIGIN": origin.url(""), "HOME": directory,
        ]
        // As in ReadmeBackgroundUploadTests: the script's processes must not inherit the test's blocked SIGTERM.
        let unblocked = "import os, signal; signal.pthread_sigmask(signal.SIG_SETMASK, []); "
            + "os.execv('/bin/bash', ['bash', '-c', os.environ['SCRIPT']])"
        environment["SCRIPT"] = "cd '\(directory)' || exit 1\n" + script
        let result = try ExternalCommand.run("/usr/bin/python3", ["-c", unblocked], environment: environment, timeout: 60)
        #expect(result.status == 0, "stdout: \(result.stdout)\nstderr: \(result.stderr)")
        let lines = result.stdout.split(separator: "\n")
        let modes = lines.filter { $0.contains("\"mode\":\"constrained\"") && $0.contains("\"source\":\"api\"") }
        #expect(modes.count == 3, "the mode on all three: \(result.stdout)")
        let budgets = try #require(lines.first { $0.contains("fleet-daily") }, "\(result.stdout)")
        let used = (try JSONSerialization.jsonObject(with: Data(budgets.utf8)) as? [[String: Any]])?.first?["used"] as? Int ?? 0
        #expect(used > 0, "traffic through the second proxy counted by the third: \(budgets)")
        #expect(lines.contains("403"), "the session set through the first proxy judges requests through the third: \(result.stdout)")
        #expect(lines.contains { $0.contains("\"store\":\"down\"") }, "\(result.stdout)")
        #expect(lines.contains("503"), "\(result.stdout)")
        #expect(origin.requests.count == 1)
        let log = (try? String(contentsOfFile: directory + "/proxy.log", encoding: .utf8)) ?? ""
        #expect(!log.contains("fleet-secret"), "the password never reaches a log")
    }
}
