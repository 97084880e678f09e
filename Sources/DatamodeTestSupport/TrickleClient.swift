import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A client that trickles bytes: sends `bytes` a few at a time with a pause between, and reports whether the
/// peer closed the connection before everything was sent (a slowloris attack, and the proxy's defence).
public enum TrickleClient {
    public struct Outcome: Sendable {
        /// Bytes sent before the peer closed (or all of them).
        public var sent: Int
        /// The peer closed the connection (EOF or reset) before every byte was sent.
        public var cutOff: Bool
        /// What the peer sent back before closing, if anything.
        public var received: [UInt8]
    }

    /// Sends `bytes` to 127.0.0.1:`port`, `step` bytes every `pause`, watching for the peer closing.
    public static func trickle(_ bytes: [UInt8], to port: UInt16, step: Int = 1, pause: Duration = .milliseconds(200))
        throws -> Outcome {
        let fd = try Socket.connect(port: port, timeout: .seconds(10))
        defer { Glibc.close(fd) }
        var sent = 0
        var received: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        while sent < bytes.count {
            // Anything from the peer? EOF or reset means we were cut off.
            if Socket.waitReadable(fd, until: .now + pause) {
                let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress!, $0.count, Int32(MSG_DONTWAIT)) }
                if n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                    return Outcome(sent: sent, cutOff: true, received: received)
                }
                if n > 0 { received.append(contentsOf: buffer[0..<n]) }
            }
            let piece = Array(bytes[sent..<min(sent + step, bytes.count)])
            let n = piece.withUnsafeBytes { send(fd, $0.baseAddress!, $0.count, Int32(MSG_NOSIGNAL) | Int32(MSG_DONTWAIT)) }
            if n < 0 {
                if errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR { continue }
                return Outcome(sent: sent, cutOff: true, received: received)
            }
            sent += n
        }
        return Outcome(sent: sent, cutOff: false, received: received)
    }
}
