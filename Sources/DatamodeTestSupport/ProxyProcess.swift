import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// The real `datamode-proxy` binary, started as a child process for end-to-end tests.
///
/// It listens on port 0 for both the proxy and the admin API and the ports are read back from its
/// start-up log line (no fixed ports, no probing races). Output goes to files in a private temporary
/// directory, which also holds the config file and the state directory.
public final class ProxyProcess: @unchecked Sendable {
    public let directory: String
    /// `<directory>/datamode.yaml`: the file the `config:` start writes and passes with `--config`.
    public let configPath: String
    /// `<directory>/state`: the state directory the `config:` start passes unless its arguments name one.
    public let stateDirectory: String
    public private(set) var port: UInt16 = 0
    public private(set) var adminPort: UInt16 = 0
    /// The transparent listener's port (SPEC §16), when the proxy has one.
    public private(set) var transparentPort: UInt16?
    public let process: Process
    private let stdoutPath: String
    private let stderrPath: String

    public struct LaunchError: Error, CustomStringConvertible {
        public var description: String
        public init(description: String) { self.description = description }
    }

    /// The binary under test: `DATAMODE_PROXY_BIN`, else `datamode-proxy` next to the running test bundle,
    /// else the package's `.build/debug`.
    public static var binaryPath: String {
        if let path = ProcessInfo.processInfo.environment["DATAMODE_PROXY_BIN"], !path.isEmpty { return path }
        let testBinary = URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath()
        var directory = testBinary.deletingLastPathComponent()
        for _ in 0..<4 {
            let candidate = directory.appendingPathComponent("datamode-proxy").path
            if FileManager.default.isExecutableFile(atPath: candidate) { return candidate }
            directory = directory.deletingLastPathComponent()
        }
        return packageRoot + "/.build/debug/datamode-proxy"
    }

    /// The repository root (this file is Sources/DatamodeTestSupport/ProxyProcess.swift).
    public static var packageRoot: String {
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent().path
    }

    /// Starts the proxy with `config` (YAML). `listen`, `admin.listen` and `state-dir` are set by flags unless
    /// `arguments` sets them; `environment` is added to a clean environment (PATH, HOME only). `standardOutput`
    /// replaces the stdout file (then `stdout` and `accessLog` stay empty): e.g. a pipe nobody reads.
    public convenience init(config: String = "", arguments: [String] = [], environment: [String: String] = [:],
                            waitForReady: Bool = true, directory: String? = nil, standardOutput: FileHandle? = nil) throws {
        let dir = directory ?? FileManager.default.temporaryDirectory
            .appendingPathComponent("datamode-e2e-\(UUID().uuidString.prefix(8))").path
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        let configPath = dir + "/datamode.yaml"
        try config.write(toFile: configPath, atomically: true, encoding: .utf8)
        var command = [Self.binaryPath, "run", "--config", configPath]
        if !arguments.contains("--listen") { command += ["--listen", "127.0.0.1:0"] }
        if !arguments.contains("--admin-listen") { command += ["--admin-listen", "127.0.0.1:0"] }
        if !arguments.contains("--state-dir") { command += ["--state-dir", dir + "/state"] }
        command += arguments
        try self.init(command: command, environment: environment, directory: dir, ownsDirectory: directory == nil,
                      waitForReady: waitForReady, standardOutput: standardOutput)
    }

    /// Starts exactly `command` (its first element is the program) in `directory`, adding nothing: for what the
    /// `config:` start cannot express. That one always passes `--listen`, `--admin-listen` and `--state-dir`,
    /// which would hide `DATAMODE_LISTEN` and friends, and it starts the binary directly, where a test may need a
    /// launcher in front of it (a shell that lowers `ulimit -n`, a program that blocks signals before it execs,
    /// the container's entrypoint). `ProxyProcess.binaryPath` is the binary to put in `command`.
    ///
    /// The ports are read from the start-up "ready" line all the same, so the command must start a proxy
    /// (listening on port 0 is the test's choice). `directory` is kept.
    public convenience init(command: [String], environment: [String: String] = [:], directory: String,
                            waitForReady: Bool = true) throws {
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        try self.init(command: command, environment: environment, directory: directory, ownsDirectory: false,
                      waitForReady: waitForReady, standardOutput: nil)
    }

    private init(command: [String], environment: [String: String], directory: String, ownsDirectory: Bool,
                 waitForReady: Bool, standardOutput: FileHandle?) throws {
        self.directory = directory
        configPath = directory + "/datamode.yaml"
        stateDirectory = directory + "/state"
        stdoutPath = directory + "/stdout.log"
        stderrPath = directory + "/stderr.log"
        FileManager.default.createFile(atPath: stdoutPath, contents: nil)
        FileManager.default.createFile(atPath: stderrPath, contents: nil)

        process = Process()
        process.executableURL = URL(fileURLWithPath: command[0])
        process.arguments = Array(command.dropFirst())
        var env = ["PATH": ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin"]
        env["HOME"] = ProcessInfo.processInfo.environment["HOME"] ?? "/tmp"
        for (key, value) in environment { env[key] = value }
        process.environment = env
        process.currentDirectoryURL = URL(fileURLWithPath: directory)
        process.standardOutput = standardOutput ?? FileHandle(forWritingAtPath: stdoutPath)
        process.standardError = FileHandle(forWritingAtPath: stderrPath)
        process.standardInput = FileHandle.nullDevice
        self.ownsDirectory = ownsDirectory
        try process.run()
        if waitForReady { try self.waitForReady() }
    }

    /// Waits for the "ready" log line and reads the two ports from it.
    public func waitForReady(timeout: Double = 20) throws {
        let deadline = Date().addingTimeInterval(timeout)
        while Date() < deadline {
            let log = stderr
            if let line = log.split(separator: "\n").first(where: { $0.contains(" ready") }),
               let listen = Self.port(after: "listen=", in: line), let admin = Self.port(after: "admin=", in: line) {
                port = listen
                adminPort = admin
                transparentPort = Self.port(after: "transparent=", in: line)
                return
            }
            if !process.isRunning {
                throw LaunchError(description: "datamode-proxy exited with \(process.terminationStatus) before it was ready:\n\(log)")
            }
            usleep(20_000)
        }
        throw LaunchError(description: "datamode-proxy was not ready within \(timeout)s:\n\(stderr)")
    }

    private static func port(after key: String, in line: Substring) -> UInt16? {
        guard let range = line.range(of: key) else { return nil }
        let value = line[range.upperBound...].prefix { $0 != " " }
        guard let colon = value.lastIndex(of: ":") else { return nil }
        return UInt16(value[value.index(after: colon)...])
    }

    public var stdout: String { (try? String(contentsOfFile: stdoutPath, encoding: .utf8)) ?? "" }
    public var stderr: String { (try? String(contentsOfFile: stderrPath, encoding: .utf8)) ?? "" }

    /// The access log lines written so far (one JSON object per line).
    public var accessLog: [[String: Any]] {
        stdout.split(separator: "\n").compactMap {
            try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any]
        }
    }

    /// The access-log lines `matching`, once there are at least `count` of them (or all there are after `timeout`).
    /// The log has its own writer thread: a line can reach the file after the client already has its response, so a
    /// test that counts lines right after a client finished waits for them here instead of racing the writer.
    public func accessLog(atLeast count: Int, matching: ([String: Any]) -> Bool = { _ in true },
                          timeout: Double = 10) -> [[String: Any]] {
        let deadline = Date().addingTimeInterval(timeout)
        while true {
            let lines = accessLog.filter(matching)
            if lines.count >= count || Date() >= deadline { return lines }
            usleep(20_000)
        }
    }

    public func signal(_ signal: Int32) {
        kill(process.processIdentifier, signal)
    }

    /// Waits for the process to exit; returns its status, or nil on timeout.
    @discardableResult
    public func waitForExit(timeout: Double = 15) -> Int32? {
        let deadline = Date().addingTimeInterval(timeout)
        while Date() < deadline {
            if hasExited {
                process.waitUntilExit()
                return process.terminationStatus
            }
            usleep(10_000)
        }
        return nil
    }

    /// Whether the child has exited (`ProcessProbe.hasExited`: a zombie counts).
    public var hasExited: Bool { ProcessProbe.hasExited(process) }

    /// SIGTERM, wait, then SIGKILL if needed. Call at the end of every test.
    public func stop() {
        guard !hasExited else { return }
        signal(SIGTERM)
        if waitForExit(timeout: 15) == nil {
            signal(SIGKILL)
            waitForExit(timeout: 5)
        }
    }

    /// Whether `directory` was made here (and so is removed with this value).
    private let ownsDirectory: Bool

    deinit {
        if !hasExited {
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
        if ownsDirectory { try? FileManager.default.removeItem(atPath: directory) }
    }

    /// Runs the binary with `arguments` to completion (CLI tests), with PATH and `environment` only.
    public static func runCLI(_ arguments: [String], environment: [String: String] = [:], timeout: Double = 30) throws
        -> ExternalCommand.Result {
        var env = ["PATH": ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin"]
        for (key, value) in environment { env[key] = value }
        return try ExternalCommand.run(binaryPath, arguments, environment: env, timeout: timeout)
    }

    /// Runs the binary as `runCLI` does, but with a terminal for its stdout (a pseudo-terminal from util-linux
    /// `script`), as a person at a shell runs it: what it prints there, CRLF line ends turned back into LF.
    public static func runCLIOnTerminal(_ arguments: [String], environment: [String: String] = [:], timeout: Double = 30) throws
        -> ExternalCommand.Result {
        var env = ["PATH": ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin", "TERM": "xterm"]
        for (key, value) in environment { env[key] = value }
        let quoted = ([binaryPath] + arguments).map { "'" + $0.replacingOccurrences(of: "'", with: "'\\''") + "'" }
        var result = try ExternalCommand.run("/usr/bin/script", ["-qec", quoted.joined(separator: " "), "/dev/null"],
                                             environment: env, timeout: timeout)
        result.stdoutBytes = Array(result.stdout.replacingOccurrences(of: "\r\n", with: "\n").utf8)
        return result
    }
}
