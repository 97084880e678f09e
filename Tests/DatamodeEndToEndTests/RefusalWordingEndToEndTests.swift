import DatamodeTestSupport
import Foundation
import Testing

/// SPEC §20 "A refusal says why in the places people look": apt, pip and wget print only a refusal's status line,
/// and the refusal of a CONNECT has no body anyone reads. Each tool is run against the real binary in constrained
/// mode with a rule that refuses one host, and what it prints must name the data mode and the code.
@Suite(.serialized) struct RefusalWordingEndToEndTests {
    /// A proxy in constrained mode where `refused.example` (http and CONNECT alike) is not allowed.
    static func refusingProxy() throws -> ProxyProcess {
        try ProxyProcess(config: """
            mode: constrained
            rules:
              - name: no-refused
                match: {host: refused.example}
                tags: {allow-constrained: false}
            """)
    }

    static func tool(_ name: String) -> String? {
        for directory in (ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin").split(separator: ":") {
            let path = "\(directory)/\(name)"
            if FileManager.default.isExecutableFile(atPath: path) { return path }
        }
        return nil
    }

    @Test func curlSeesTheReasonPhraseAndProxyStatus() throws {
        let proxy = try Self.refusingProxy()
        defer { proxy.stop() }
        let result = try ExternalCommand.run("/usr/bin/curl", ["-s", "-i", "--max-time", "10", "-x",
                                                               "http://127.0.0.1:\(proxy.port)", "http://refused.example/x"])
        #expect(result.stdout.hasPrefix("HTTP/1.1 403 Refused by data mode (constrained)\r\n"), "\(result.stdout)")
        #expect(result.stdout.contains("\r\nProxy-Status: datamode-proxy; error=http_request_denied; details=\"constrained\"\r\n"))
        // A CONNECT refusal: curl reports the status line it got instead of a tunnel.
        let tunnel = try ExternalCommand.run("/usr/bin/curl", ["-s", "-v", "--max-time", "10", "-x",
                                                               "http://127.0.0.1:\(proxy.port)", "https://refused.example/"])
        #expect(tunnel.stderr.contains("< HTTP/1.1 403 Refused by data mode (constrained)"), "\(tunnel.stderr)")
        #expect(tunnel.stderr.contains("< Proxy-Status: datamode-proxy; error=http_request_denied; details=\"constrained\""))
    }

    @Test func wgetPrintsTheCause() throws {
        let wget = try #require(Self.tool("wget"), "wget is installed by scripts/bootstrap.sh --test")
        let proxy = try Self.refusingProxy()
        defer { proxy.stop() }
        let result = try ExternalCommand.run(wget, ["-e", "use_proxy=yes", "-e", "http_proxy=http://127.0.0.1:\(proxy.port)",
                                                    "--tries=1", "-O", "/dev/null", "http://refused.example/file"],
                                             timeout: 30)
        #expect(result.status != 0)
        #expect(result.stderr.contains("ERROR 403: Refused by data mode (constrained)."), "\(result.stderr)")
    }

    /// pip prints why a connection broke only when it retries (`--retries 0` fails in silence), as a warning.
    @Test func pipPrintsTheCauseOfARefusedTunnel() throws {
        let proxy = try Self.refusingProxy()
        defer { proxy.stop() }
        let scratch = try ScratchDirectory.make("refusal-wording")
        defer { ScratchDirectory.remove(scratch) }
        let result = try ExternalCommand.run(try #require(Self.tool("python3")), [
            "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "--retries", "1", "--timeout", "10",
            "--proxy", "http://127.0.0.1:\(proxy.port)", "--index-url", "https://refused.example/simple/",
            "-d", scratch, "nothing-to-find",
        ], environment: ["PATH": ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin", "HOME": scratch,
                         "PIP_NO_CACHE_DIR": "1", "PIP_CONFIG_FILE": "/dev/null"], timeout: 60)
        #expect(result.status != 0)
        #expect(result.output.contains("Tunnel connection failed: 403 Refused by data mode (constrained)"), "\(result.output)")
    }

    @Test func aptPrintsTheCause() throws {
        let apt = try #require(Self.tool("apt-get"), "the tests run on Debian")
        let proxy = try Self.refusingProxy()
        defer { proxy.stop() }
        let scratch = try ScratchDirectory.make("refusal-wording")
        defer { ScratchDirectory.remove(scratch) }
        // apt's own state, cache and sources, all in the scratch directory: the host's apt is not touched.
        for directory in ["parts", "state/lists/partial", "cache/archives/partial", "log"] {
            try FileManager.default.createDirectory(atPath: "\(scratch)/\(directory)", withIntermediateDirectories: true)
        }
        try "deb [trusted=yes] http://refused.example/debian stable main\n"
            .write(toFile: scratch + "/sources.list", atomically: true, encoding: .utf8)
        let result = try ExternalCommand.run(apt, [
            "-o", "Dir::Etc::SourceList=\(scratch)/sources.list", "-o", "Dir::Etc::SourceParts=\(scratch)/parts",
            "-o", "Dir::State=\(scratch)/state", "-o", "Dir::Cache=\(scratch)/cache",
            "-o", "Dir::Log=\(scratch)/log", "-o", "Debug::NoLocking=1", "-o", "APT::Sandbox::User=root",
            "-o", "Acquire::http::Proxy=http://127.0.0.1:\(proxy.port)/", "-o", "Acquire::Retries=0",
            "update",
        ], timeout: 60)
        #expect(result.output.contains("403  Refused by data mode (constrained)"), "\(result.output)")
    }
}
