import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// Runs a command to completion with its output captured, bounded in time: the one way the tests run a
/// program that ends (curl, openssl, a script, the proxy's CLI); `ProxyProcess` starts the proxy, which does not.
///
/// Output goes through files, not pipes, so a chatty command cannot fill a pipe nobody reads and block.
public enum ExternalCommand {
    public struct Result: Sendable {
        public var status: Int32
        /// stdout, as bytes.
        public var stdoutBytes: [UInt8]
        /// stdout, as text.
        public var stdout: String { String(decoding: stdoutBytes, as: UTF8.self) }
        /// stderr, as text.
        public var stderr: String
        /// stdout, then stderr.
        public var output: String { stdout + stderr }
    }

    /// Runs `executable` with `arguments`; `environment`, when given, is the whole environment (nothing is
    /// inherited), else the test process's is. `timeout` kills the command (SIGKILL) when it runs longer; the
    /// status is then that of a killed process.
    public static func run(_ executable: String, _ arguments: [String], environment: [String: String]? = nil,
                           timeout: Double = 60) throws -> Result {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments
        if let environment { process.environment = environment }
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("cmd-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let outPath = directory + "/out"
        let errPath = directory + "/err"
        _ = FileManager.default.createFile(atPath: outPath, contents: nil)
        _ = FileManager.default.createFile(atPath: errPath, contents: nil)
        let out = FileHandle(forWritingAtPath: outPath)!
        let err = FileHandle(forWritingAtPath: errPath)!
        process.standardOutput = out
        process.standardError = err
        process.standardInput = FileHandle.nullDevice
        try process.run()
        let deadline = Date().addingTimeInterval(timeout)
        while !ProcessProbe.hasExited(process) && Date() < deadline { usleep(10_000) }
        if !ProcessProbe.hasExited(process) { kill(process.processIdentifier, SIGKILL) }
        process.waitUntilExit()
        try? out.close()
        try? err.close()
        let stdout = (try? Data(contentsOf: URL(fileURLWithPath: outPath))) ?? Data()
        let stderr = (try? String(contentsOfFile: errPath, encoding: .utf8)) ?? ""
        return Result(status: process.terminationStatus, stdoutBytes: Array(stdout), stderr: stderr)
    }
}
