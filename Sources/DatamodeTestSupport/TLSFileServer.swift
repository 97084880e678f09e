import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// `openssl s_server -WWW` on 127.0.0.1 (port 0, read back from its `ACCEPT` line) with a fresh self-signed
/// certificate for `localhost` (and IP 127.0.0.1): a real TLS origin whose bytes only the two TLS endpoints can
/// read, so a CONNECT tunnel that alters a single byte breaks the handshake or the record MACs.
///
/// `-WWW` serves files from `directory`: `GET /name HTTP/1.0` answers the file's exact bytes.
public final class TLSFileServer: @unchecked Sendable {
    public let directory: String
    /// The self-signed certificate (PEM), to trust with `curl --cacert`.
    public let certificatePath: String
    public let port: UInt16
    private let process: Process
    private let outputPath: String

    public struct Failure: Error, CustomStringConvertible {
        public var description: String
    }

    /// `statusPage`: `-www` in place of `-WWW`: every `GET` is answered with s_server's page about the connection
    /// it came on (its protocol and cipher among it), not a file.
    public init(directory: String, subjectAltName: String = "DNS:localhost,IP:127.0.0.1", statusPage: Bool = false) throws {
        self.directory = directory
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        certificatePath = directory + "/cert.pem"
        let keyPath = directory + "/key.pem"
        let generated = try ExternalCommand.run("/usr/bin/openssl", [
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost", "-days", "1",
            "-addext", "subjectAltName=\(subjectAltName)",
            "-keyout", keyPath, "-out", certificatePath,
        ])
        guard generated.status == 0 else { throw Failure(description: "openssl req failed: \(generated.output)") }

        outputPath = directory + "/s_server.log"
        _ = FileManager.default.createFile(atPath: outputPath, contents: nil)
        process = Process()
        // stdbuf: s_server's stdout is a file here, block-buffered; the ACCEPT line must reach it at once.
        process.executableURL = URL(fileURLWithPath: "/usr/bin/stdbuf")
        process.arguments = ["-oL", "/usr/bin/openssl", "s_server", "-accept", "127.0.0.1:0", "-cert", certificatePath, "-key", keyPath, statusPage ? "-www" : "-WWW"]
        process.currentDirectoryURL = URL(fileURLWithPath: directory)
        process.standardInput = FileHandle.nullDevice
        process.standardOutput = FileHandle(forWritingAtPath: outputPath)
        process.standardError = FileHandle(forWritingAtPath: outputPath)
        try process.run()

        let deadline = Date().addingTimeInterval(20)
        var found: UInt16?
        while found == nil && Date() < deadline {
            let log = (try? String(contentsOfFile: outputPath, encoding: .utf8)) ?? ""
            if let line = log.split(separator: "\n").first(where: { $0.hasPrefix("ACCEPT") }),
               let colon = line.lastIndex(of: ":") {
                found = UInt16(line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces))
            }
            if found == nil {
                guard process.isRunning else { break }
                usleep(20_000)
            }
        }
        guard let found else {
            if process.isRunning { kill(process.processIdentifier, SIGKILL) }
            let log = (try? String(contentsOfFile: outputPath, encoding: .utf8)) ?? ""
            throw Failure(description: "openssl s_server did not report its port: \(log)")
        }
        port = found
    }

    /// Writes a file that `GET /name` will serve.
    public func publish(_ name: String, _ bytes: [UInt8]) throws {
        let url = URL(fileURLWithPath: directory + "/" + name)
        try FileManager.default.createDirectory(at: url.deletingLastPathComponent(), withIntermediateDirectories: true)
        try Data(bytes).write(to: url)
    }

    /// SIGKILL, not SIGTERM: a child of the test runner inherits its blocked signal mask, and s_server does not
    /// unblock SIGTERM (a terminate() would wait forever).
    public func stop() {
        if process.isRunning {
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
    }

    deinit { stop() }
}
