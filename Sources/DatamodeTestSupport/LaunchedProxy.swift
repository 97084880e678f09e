import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// The real binary started with exactly the given arguments, optionally through a launcher (a shell that
/// lowers `ulimit -n` first, `prlimit`, …), for the few tests `ProxyProcess` cannot express: it always adds
/// `--listen`, `--admin-listen` and `--state-dir`, which would hide `DATAMODE_LISTEN` and friends, and it
/// starts the binary directly.
///
/// The ports are read from the start-up "ready" line, as `ProxyProcess` does.
public final class LaunchedProxy: @unchecked Sendable {
    public let process: Process
    public let directory: String
    public private(set) var port: UInt16 = 0
    public private(set) var adminPort: UInt16 = 0
    private let stdoutPath: String
    private let stderrPath: String

    /// Runs `launcher + [binary] + arguments` in `directory` with `environment` added to PATH and HOME.
    /// A launcher such as `["/bin/bash", "-c", "ulimit -n 64 && exec \"$0\" \"$@\""]` runs the binary in place.
    public init(launcher: [String] = [], arguments: [String], environment: [String: String] = [:],
                directory: String, waitForReady: Bool = true) throws {
        self.directory = directory
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        stdoutPath = directory + "/launched-stdout.log"
        stderrPath = directory + "/launched-stderr.log"
        _ = FileManager.default.createFile(atPath: stdoutPath, contents: nil)
        _ = FileManager.default.createFile(atPath: stderrPath, contents: nil)
        process = Process()
        let command = launcher + [ProxyProcess.binaryPath] + arguments
        process.executableURL = URL(fileURLWithPath: command[0])
        process.arguments = Array(command.dropFirst())
        var env = ["PATH": ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin"]
        env["HOME"] = ProcessInfo.processInfo.environment["HOME"] ?? "/tmp"
        for (key, value) in environment { env[key] = value }
        process.environment = env
        process.currentDirectoryURL = URL(fileURLWithPath: directory)
        process.standardOutput = FileHandle(forWritingAtPath: stdoutPath)
        process.standardError = FileHandle(forWritingAtPath: stderrPath)
        process.standardInput = FileHandle.nullDevice
        try process.run()
        if waitForReady { try self.waitForReady() }
    }

    public var stdout: String { (try? String(contentsOfFile: stdoutPath, encoding: .utf8)) ?? "" }
    public var stderr: String { (try? String(contentsOfFile: stderrPath, encoding: .utf8)) ?? "" }
    public var pid: Int32 { process.processIdentifier }

    public func waitForReady(timeout: Double = 20) throws {
        let deadline = Date().addingTimeInterval(timeout)
        while Date() < deadline {
            let log = stderr
            if let line = log.split(separator: "\n").first(where: { $0.contains(" ready") }),
               let listen = Self.port(after: "listen=", in: line), let admin = Self.port(after: "admin=", in: line) {
                port = listen
                adminPort = admin
                return
            }
            if !process.isRunning {
                throw ProxyProcess.LaunchError(description: "datamode-proxy exited with \(process.terminationStatus) before it was ready:\n\(log)")
            }
            usleep(20_000)
        }
        throw ProxyProcess.LaunchError(description: "datamode-proxy was not ready within \(timeout)s:\n\(stderr)")
    }

    private static func port(after key: String, in line: Substring) -> UInt16? {
        guard let range = line.range(of: key) else { return nil }
        let value = line[range.upperBound...].prefix { $0 != " " }
        guard let colon = value.lastIndex(of: ":") else { return nil }
        return UInt16(value[value.index(after: colon)...])
    }

    @discardableResult
    public func waitForExit(timeout: Double = 15) -> Int32? {
        let deadline = Date().addingTimeInterval(timeout)
        while process.isRunning && Date() < deadline { usleep(20_000) }
        return process.isRunning ? nil : process.terminationStatus
    }

    public func stop() {
        guard process.isRunning else { return }
        kill(process.processIdentifier, SIGTERM)
        if waitForExit(timeout: 15) == nil {
            kill(process.processIdentifier, SIGKILL)
            waitForExit(timeout: 5)
        }
    }

    deinit {
        if process.isRunning { kill(process.processIdentifier, SIGKILL) }
    }
}
