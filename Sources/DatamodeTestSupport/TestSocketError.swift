import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// Why a test socket operation failed. Tests see these as thrown errors, so a hung or broken peer fails the
/// test with a message instead of hanging it.
public enum TestSocketError: Error, CustomStringConvertible, Sendable {
    /// A system call failed; `errno` text included.
    case system(String, Int32)
    /// Nothing arrived (or could be sent) before the deadline.
    case timeout(String)
    /// The peer closed the connection before the expected bytes arrived.
    case closed(String)
    /// The peer sent bytes that are not the HTTP message that was expected.
    case protocolError(String)

    public var description: String {
        switch self {
        case .system(let call, let code): "\(call) failed: \(String(cString: strerror(code))) (errno \(code))"
        case .timeout(let what): "timed out: \(what)"
        case .closed(let what): "connection closed by peer: \(what)"
        case .protocolError(let what): "protocol error: \(what)"
        }
    }
}
