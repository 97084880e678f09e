import DatamodeConfig
import DatamodePolicy
#if canImport(Glibc)
import Glibc
#endif

/// One JSON line per request (SPEC §8): time, client, method, url, status, bytes, outcome, reason, variant,
/// duration. Each line is written with a single write(2), so lines from different workers never interleave.
public final class AccessLog: Sendable {
    private let fd: Int32
    private let ownsDescriptor: Bool

    /// Opens the destination; a file that cannot be opened is an error naming it.
    public init(destination: AccessLogDestination) throws(EngineError) {
        switch destination {
        case .off:
            fd = -1
            ownsDescriptor = false
        case .stdout:
            fd = 1
            ownsDescriptor = false
        case .file(let path):
            let opened = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o644)
            guard opened >= 0 else {
                throw EngineError("cannot open access log \(path): \(String(cString: strerror(errno)))")
            }
            fd = opened
            ownsDescriptor = true
        }
    }

    deinit {
        if ownsDescriptor { Glibc.close(fd) }
    }

    public var isEnabled: Bool { fd >= 0 }

    func write(time: Int64, client: String, method: String, url: String, status: Int, bytes: UInt64,
               outcome: String, reason: String?, variant: String?, durationSeconds: Double) {
        guard fd >= 0 else { return }
        var line = "{\"time\":\"\(Timestamp.rfc3339(wallNanoseconds: time))\",\"client\":\(JSONText.quote(client))"
        line += ",\"method\":\(JSONText.quote(method)),\"url\":\(JSONText.quote(url)),\"status\":\(status)"
        line += ",\"bytes\":\(bytes),\"outcome\":\"\(outcome)\""
        line += ",\"reason\":" + (reason.map(JSONText.quote) ?? "null")
        line += ",\"variant\":" + (variant.map(JSONText.quote) ?? "null")
        let micros = Int((durationSeconds * 1_000_000).rounded())
        line += ",\"duration\":\(micros / 1_000_000).\(Self.sixDigits(micros % 1_000_000))}\n"
        var bytesLeft = line.utf8.count
        line.withUTF8 { buffer in
            var offset = 0
            while bytesLeft > 0 {
                let n = Glibc.write(fd, buffer.baseAddress! + offset, bytesLeft)
                if n <= 0 { if errno == EINTR { continue } else { return } }
                offset += n
                bytesLeft -= n
            }
        }
    }

    private static func sixDigits(_ value: Int) -> String {
        let text = String(value)
        return String(repeating: "0", count: 6 - text.count) + text
    }
}

/// An engine failure to start or run, with a message for the operator.
public struct EngineError: Error, CustomStringConvertible, Sendable {
    public var description: String
    public init(_ description: String) { self.description = description }
}
