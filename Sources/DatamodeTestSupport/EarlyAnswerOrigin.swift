#if canImport(Glibc)
import Glibc
#endif

/// An origin that answers every request as soon as its head is in and closes with the body unread, which makes the
/// kernel reset the connection: whoever sends a large upload sees the send fail with the answer waiting to be read
/// (a server refusing an upload with a 413 or a 401 does this).
public final class EarlyAnswerOrigin: @unchecked Sendable {
    public let port: UInt16
    private let acceptor: LoopbackAcceptor

    public init(answer: String) throws {
        acceptor = try LoopbackAcceptor()
        port = acceptor.port
        let bytes = Array(answer.utf8)
        acceptor.start { fd, _ in
            var head: [UInt8] = []
            var byte: UInt8 = 0
            while !head.suffix(4).elementsEqual([13, 10, 13, 10]), recv(fd, &byte, 1, 0) == 1 { head.append(byte) }
            _ = send(fd, bytes, bytes.count, Int32(MSG_NOSIGNAL))
        }
    }

    /// Connections accepted so far.
    public var connections: Int { acceptor.accepted }

    public func url(_ path: String) -> String { "http://127.0.0.1:\(port)\(path)" }

    public func stop() { acceptor.stop() }
}
