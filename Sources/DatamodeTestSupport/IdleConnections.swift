import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// Many plain TCP connections to one port, opened and held without a byte sent (idle clients, descriptor
/// pressure). Each is checked for having been closed by the peer with `closedByPeer`.
public final class IdleConnections {
    public private(set) var descriptors: [Int32] = []

    public init() {}

    /// Opens `count` connections to 127.0.0.1:`port`; stops at the first failure and throws it.
    public func open(_ count: Int, to port: UInt16) throws {
        descriptors.reserveCapacity(descriptors.count + count)
        for _ in 0..<count {
            descriptors.append(try Socket.connect(port: port, timeout: .seconds(10)))
        }
    }

    public var count: Int { descriptors.count }

    /// How many of the connections the peer has closed (EOF or reset) by now, without waiting.
    public func closedByPeerCount() -> Int {
        var closed = 0
        var byte: UInt8 = 0
        for fd in descriptors {
            let n = recv(fd, &byte, 1, Int32(MSG_DONTWAIT) | Int32(MSG_PEEK))
            if n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) { closed += 1 }
        }
        return closed
    }

    /// Sends `bytes` on connection `index`.
    public func send(_ bytes: [UInt8], on index: Int) throws {
        try bytes.withUnsafeBytes { try Socket.sendAll(descriptors[index], $0, until: .now + .seconds(10)) }
    }

    /// Reads from connection `index` until `terminator` has arrived or the peer closes; what arrived.
    public func receive(on index: Int, until terminator: String, timeout: Duration = .seconds(10)) throws -> String {
        var received: [UInt8] = []
        let deadline = ContinuousClock.now + timeout
        var buffer = [UInt8](repeating: 0, count: 16 * 1024)
        while !String(decoding: received, as: UTF8.self).contains(terminator) {
            let n = try buffer.withUnsafeMutableBytes { try Socket.receive(descriptors[index], into: $0, until: deadline) }
            if n == 0 { break }
            received.append(contentsOf: buffer[0..<n])
        }
        return String(decoding: received, as: UTF8.self)
    }

    public func closeAll() {
        for fd in descriptors { Glibc.close(fd) }
        descriptors = []
    }

    deinit { closeAll() }
}
