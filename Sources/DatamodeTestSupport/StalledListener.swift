import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A listener whose accept queue is full and never served: the kernel drops further SYNs, so a connect to it
/// stays in progress (until the connector gives up). For tests that need an upstream slow to connect.
///
/// Not a `LoopbackAcceptor`: the point is a socket that never accepts, with a backlog of 0 that its own
/// connections fill; an acceptor would drain the queue and the connect would complete.
public final class StalledListener: @unchecked Sendable {
    public let port: UInt16
    private let listenFD: Int32
    private var fillers: [Int32] = []

    public init() throws {
        (listenFD, port) = try Socket.listen(backlog: 0)
        // A backlog of 0 still admits one connection (and SYN cookies may admit a little more): fill it.
        for _ in 0..<4 {
            let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
            guard fd >= 0 else { continue }
            var address = Socket.loopback(port: port)
            _ = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
            }
            fillers.append(fd)
        }
        Thread.sleep(forTimeInterval: 0.05)
    }

    public func stop() {
        for fd in fillers { Glibc.close(fd) }
        fillers = []
        Glibc.close(listenFD)
    }
}
