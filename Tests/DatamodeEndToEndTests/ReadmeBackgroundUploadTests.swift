import DatamodeTestSupport
import Foundation
import Testing

/// The README's "Background uploads" block, run as it is written with bash and the built binary: an upload in
/// constrained mode answered 202, the proxy killed with SIGKILL, started again, the mode lifted, and the origin
/// receives the upload once, byte for byte. Only the addresses change: the proxy's ports (free ones, through
/// `DATAMODE_LISTEN` and `DATAMODE_ADMIN_LISTEN`, and in the curl line) and `$ORIGIN` (a recording origin).
@Suite struct ReadmeBackgroundUploadTests {
    @Test func backgroundUploadWalkthrough() throws {
        let readme = try String(contentsOfFile: ProxyProcess.packageRoot + "/README.md", encoding: .utf8)
        let section = try #require(readme.range(of: "## Background uploads"))
        let rest = readme[section.upperBound...]
        let open = try #require(rest.range(of: "```sh\n"))
        let close = try #require(rest.range(of: "\n```\n", range: open.upperBound..<rest.endIndex))
        var script = String(rest[open.upperBound..<close.lowerBound])
        #expect(script.contains("kill -9 $PROXY") && script.contains("datamode-proxy mode normal"))

        let origin = try RecordingOrigin { _ in .status(201, "stored") }
        defer { origin.stop() }
        let listen = "127.0.0.1:\(try LoopbackPort.refusingConnections())"
        let admin = "127.0.0.1:\(try LoopbackPort.refusingConnections())"
        script = script.replacingOccurrences(of: "127.0.0.1:8877", with: listen)
        let directory = try ScratchDirectory.make("readme-uploads")
        defer { ScratchDirectory.remove(directory) }
        let binaries = (ProxyProcess.binaryPath as NSString).deletingLastPathComponent
        let environment = [
            "PATH": binaries + ":" + (ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin"),
            "DATAMODE_LISTEN": listen, "DATAMODE_ADMIN_LISTEN": admin, "ORIGIN": origin.url(""),
            "HOME": directory,
        ]
        // The test process blocks SIGTERM and its children inherit that mask (see `halt`): the script's proxies
        // must not, or its last `kill` would not stop them. python3 unblocks every signal, then becomes bash.
        let unblocked = "import os, signal; signal.pthread_sigmask(signal.SIG_SETMASK, []); "
            + "os.execv('/bin/bash', ['bash', '-c', os.environ['SCRIPT']])"
        var withScript = environment
        withScript["SCRIPT"] = "cd '\(directory)' || exit 1\n" + script
        let result = try ExternalCommand.run("/usr/bin/python3", ["-c", unblocked], environment: withScript, timeout: 90)
        #expect(result.status == 0, "stdout: \(result.stdout)\nstderr: \(result.stderr)")
        #expect(result.stdout.contains("\"status\":\"queued\""), "the 202's body and the list after the restart")
        let received = origin.requests
        #expect(received.count == 1, "delivered exactly once")
        #expect(received.first?.target == "/backup/photo-0001.jpg")
        #expect(received.first?.bodyText == "photo-0001 bytes")
        #expect(received.first?.values(of: "Idempotency-Key").count == 1)
        #expect(received.first?.values(of: "Prefer").isEmpty == true)
    }
}
