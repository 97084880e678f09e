import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// Another program's listening socket on 127.0.0.1 that never accepts: for tests of a listen address that is
/// already taken. Closed by `close()` or when released.
///
/// Not a `LoopbackAcceptor`: it stands for another program's socket, so it binds a port the test chooses (the
/// proxy's own, or one the test then hands to the proxy), may set SO_REUSEPORT as servers that spread accepts
/// do, and never accepts; what it tests is the bind, not a connection.
public final class ForeignListener: @unchecked Sendable {
    public let port: UInt16
    private var fd: Int32

    /// `port` 0 lets the kernel choose; `reusePort` sets SO_REUSEPORT on it.
    public init(port: UInt16 = 0, reusePort: Bool = false) throws {
        (fd, self.port) = try Socket.listen(port: port, reusePort: reusePort)
    }

    public func close() {
        if fd >= 0 { Glibc.close(fd) }
        fd = -1
    }

    deinit { close() }
}
