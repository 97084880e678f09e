import Foundation
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// A TCP echo server on 127.0.0.1 (port 0, read back): every byte received on a connection is sent back on it;
/// when the peer shuts down its sending side, the server finishes echoing and closes its own.
///
/// The far end of a CONNECT tunnel whose bytes must come back unchanged (any dropped, duplicated, reordered or
/// injected byte shows up in the echo). One thread per connection; `stop()` shuts every socket down.
public final class EchoServer: @unchecked Sendable {
    public let port: UInt16
    /// Answers only once the client has shut down its sending side: everything it sent, then EOF (a
    /// request/response protocol that uses the half-close as its end-of-request marker).
    public let repliesAfterEOF: Bool

    private let acceptor: LoopbackAcceptor
    private let echoed = Mutex<UInt64>(0)

    public init(repliesAfterEOF: Bool = false) throws {
        acceptor = try LoopbackAcceptor()
        port = acceptor.port
        self.repliesAfterEOF = repliesAfterEOF
        acceptor.start { [self] fd, _ in echo(fd) }
    }

    /// Connections accepted so far.
    public var connectionCount: Int { acceptor.accepted }
    /// Bytes echoed so far, over every connection.
    public var bytesEchoed: UInt64 { echoed.withLock { $0 } }

    public func stop() { acceptor.stop() }

    deinit { stop() }

    private func echo(_ fd: Int32) {
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 256 * 1024, alignment: 8)
        defer { buffer.deallocate() }
        if repliesAfterEOF {
            var everything: [UInt8] = []
            while true {
                guard let n = try? Socket.receive(fd, into: buffer, until: .now + .seconds(60)), n > 0 else { break }
                everything.append(contentsOf: buffer[0..<n])
            }
            do {
                try everything.withUnsafeBytes { try Socket.sendAll(fd, $0, until: .now + .seconds(60)) }
            } catch {
                return
            }
            echoed.withLock { $0 += UInt64(everything.count) }
            _ = shutdown(fd, Int32(SHUT_WR))
            return
        }
        while true {
            guard let n = try? Socket.receive(fd, into: buffer, until: .now + .seconds(60)), n > 0 else { break }
            do {
                try Socket.sendAll(fd, UnsafeRawBufferPointer(rebasing: buffer[0..<n]), until: .now + .seconds(60))
            } catch {
                return
            }
            echoed.withLock { $0 += UInt64(n) }
        }
        _ = shutdown(fd, Int32(SHUT_WR))
    }
}
