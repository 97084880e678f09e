import Foundation
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// An HTTP origin that answers an `Upgrade` request with a real `101 Switching Protocols` and from then on
/// echoes raw bytes (like a WebSocket echo server that does not look inside frames), closing its side when the
/// client shuts down its own. A request without `Upgrade` gets `400` and the connection is closed.
///
/// The request head is kept exactly as the proxy forwarded it, so a test can check the hop-by-hop rules of an
/// upgrade (RFC 9110 §7.8: `Upgrade` and `Connection: upgrade` are forwarded for it).
public final class UpgradeEchoOrigin: @unchecked Sendable {
    public let port: UInt16
    /// The `Upgrade` value sent back in the 101 (the protocol switched to).
    public let protocolName: String

    private let acceptor: LoopbackAcceptor
    private let heads = Mutex<[String]>([])

    public init(protocolName: String = "websocket") throws {
        acceptor = try LoopbackAcceptor()
        port = acceptor.port
        self.protocolName = protocolName
        acceptor.start { [self] fd, _ in serve(fd) }
    }

    /// `http://127.0.0.1:<port>` + `path`.
    public func url(_ path: String = "/") -> String { "http://127.0.0.1:\(port)\(path)" }

    /// Every request head received, exactly (through the empty line), in arrival order.
    public var requestHeads: [String] { heads.withLock { $0 } }
    public var connectionCount: Int { acceptor.accepted }

    public func stop() { acceptor.stop() }

    deinit { stop() }

    private func serve(_ fd: Int32) {
        let deadline = ContinuousClock.now + .seconds(30)
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 64 * 1024, alignment: 8)
        defer { buffer.deallocate() }
        // The head, bounded (this peer trusts the proxy under test only so far).
        var received: [UInt8] = []
        var headEnd: Int?
        while headEnd == nil {
            guard received.count < 64 * 1024,
                  let n = try? Socket.receive(fd, into: buffer, until: deadline), n > 0 else { return }
            received.append(contentsOf: buffer[0..<n])
            headEnd = endOfHTTPHead(received)
        }
        let head = String(decoding: received[0..<headEnd!], as: UTF8.self)
        let rest = Array(received[headEnd!...])
        heads.withLock { $0.append(head) }
        let wantsUpgrade = head.lowercased().split(separator: "\r\n").contains { $0.hasPrefix("upgrade:") }
        guard wantsUpgrade else {
            let refusal = "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            try? Array(refusal.utf8).withUnsafeBytes { try Socket.sendAll(fd, $0, until: deadline) }
            return
        }
        let switching = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: \(protocolName)\r\nConnection: Upgrade\r\n\r\n"
        do {
            try Array(switching.utf8).withUnsafeBytes { try Socket.sendAll(fd, $0, until: deadline) }
            // Bytes that came with the head already belong to the new protocol.
            if !rest.isEmpty { try rest.withUnsafeBytes { try Socket.sendAll(fd, $0, until: deadline) } }
            while true {
                let n = try Socket.receive(fd, into: buffer, until: .now + .seconds(30))
                if n == 0 { break }
                try Socket.sendAll(fd, UnsafeRawBufferPointer(rebasing: buffer[0..<n]), until: .now + .seconds(30))
            }
        } catch {
            return
        }
        _ = shutdown(fd, Int32(SHUT_WR))
    }
}

/// The length of the head at the start of `bytes` (through CRLF CRLF), if it is complete.
private func endOfHTTPHead(_ bytes: [UInt8]) -> Int? {
    guard bytes.count >= 4 else { return nil }
    for i in 0...(bytes.count - 4) where bytes[i] == 13 && bytes[i + 1] == 10 && bytes[i + 2] == 13 && bytes[i + 3] == 10 {
        return i + 4
    }
    return nil
}
