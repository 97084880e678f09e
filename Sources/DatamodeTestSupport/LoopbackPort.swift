import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// Ports for tests that need a refused connection.
public enum LoopbackPort {
    /// A port on 127.0.0.1 that nothing listens on (bound by us, then released): a connect gets `ECONNREFUSED`.
    public static func refusingConnections() throws(TestSocketError) -> UInt16 {
        try Socket.closedPort()
    }
}
