import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// Runs a command to completion with its output captured (stdout and stderr together), bounded in time.
public enum ExternalCommand {
    public struct Result: Sendable {
        public var status: Int32
        /// stdout and stderr, interleaved as written.
        public var output: String
        /// stdout alone, as bytes.
        public var stdout: [UInt8]
    }

    /// `timeout` kills the command (SIGKILL) when it runs longer; the status is then that of a killed process.
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
        let allPath = directory + "/all"
        _ = FileManager.default.createFile(atPath: outPath, contents: nil)
        _ = FileManager.default.createFile(atPath: allPath, contents: nil)
        let out = FileHandle(forWritingAtPath: outPath)!
        let all = FileHandle(forWritingAtPath: allPath)!
        process.standardOutput = out
        process.standardError = all
        process.standardInput = FileHandle.nullDevice
        try process.run()
        let deadline = Date().addingTimeInterval(timeout)
        while process.isRunning && Date() < deadline { usleep(10_000) }
        if process.isRunning {
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
        try? out.close()
        try? all.close()
        let stdout = (try? Data(contentsOf: URL(fileURLWithPath: outPath))) ?? Data()
        let stderr = (try? String(contentsOfFile: allPath, encoding: .utf8)) ?? ""
        return Result(status: process.terminationStatus,
                      output: String(decoding: stdout, as: UTF8.self) + stderr, stdout: Array(stdout))
    }
}
