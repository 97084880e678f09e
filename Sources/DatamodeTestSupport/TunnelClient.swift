import Foundation
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// A raw client for what happens after a CONNECT `200` or an Upgrade `101`: the bytes are no longer HTTP, so
/// it reads exact byte counts rather than messages. The head before the switch is split off at its empty line
/// and its status parsed; anything behind it stays buffered for the tunnel reads.
public final class TunnelClient {
    private var fd: Int32
    private var buffered: [UInt8] = []
    public var timeout: Duration

    public init(port: UInt16, timeout: Duration = .seconds(10)) throws {
        self.timeout = timeout
        fd = try Socket.connect(port: port, timeout: timeout)
    }

    deinit { close() }

    public func close() {
        if fd >= 0 {
            Glibc.close(fd)
            fd = -1
        }
    }

    /// Shuts down the sending side; the peer reads EOF, reading stays possible.
    public func shutdownWrite() {
        if fd >= 0 { _ = shutdown(fd, Int32(SHUT_WR)) }
    }

    /// Closes with a reset (RST, SO_LINGER 0) instead of an orderly FIN: the peer reads ECONNRESET.
    public func reset() {
        guard fd >= 0 else { return }
        var option = linger(l_onoff: 1, l_linger: 0)
        _ = setsockopt(fd, SOL_SOCKET, SO_LINGER, &option, socklen_t(MemoryLayout<linger>.size))
        close()
    }

    public func send(_ bytes: [UInt8]) throws {
        try bytes.withUnsafeBytes { try Socket.sendAll(fd, $0, until: .now + timeout) }
    }

    public func send(_ text: String) throws { try send(Array(text.utf8)) }

    private func fill() throws -> Bool {
        var chunk = [UInt8](repeating: 0, count: 256 * 1024)
        let n = try chunk.withUnsafeMutableBytes { try Socket.receive(fd, into: $0, until: .now + timeout) }
        if n == 0 { return false }
        buffered.append(contentsOf: chunk[0..<n])
        return true
    }

    /// Reads a response head (through its empty line, at most 64 KiB): the status code and the head's text.
    public func readHead() throws -> (status: Int, text: String) {
        while true {
            if let end = endOfHTTPHead(buffered) {
                let text = String(decoding: buffered[0..<end], as: UTF8.self)
                buffered.removeFirst(end)
                let status = Int(text.split(separator: " ", maxSplits: 2).dropFirst().first ?? "") ?? 0
                return (status, text)
            }
            guard buffered.count < 64 * 1024 else { throw TestSocketError.protocolError("no end of head in 64 KiB") }
            guard try fill() else { throw TestSocketError.closed("inside a response head (\(buffered.count) bytes)") }
        }
    }

    /// Exactly `count` bytes (throws if the peer closes first).
    public func read(exactly count: Int) throws -> [UInt8] {
        while buffered.count < count {
            guard try fill() else { throw TestSocketError.closed("after \(buffered.count) of \(count) bytes") }
        }
        let out = Array(buffered[0..<count])
        buffered.removeFirst(count)
        return out
    }

    /// Everything until the peer closes.
    public func readToEnd() throws -> [UInt8] {
        while try fill() {}
        defer { buffered = [] }
        return buffered
    }

    /// Sends `payload` from another thread while reading the same number of bytes back here (an echo through a
    /// tunnel bigger than every buffer on the way would deadlock a client that sends everything first).
    public func echoRoundTrip(_ payload: [UInt8]) throws -> [UInt8] {
        let fd = self.fd
        let deadline = ContinuousClock.now + timeout
        let outcome = SendOutcome()
        Thread.detachNewThread {
            do {
                try payload.withUnsafeBytes { try Socket.sendAll(fd, $0, until: deadline) }
            } catch {
                outcome.error.withLock { $0 = error as? TestSocketError ?? .protocolError("\(error)") }
            }
            outcome.done.store(true, ordering: .releasing)
        }
        defer { while !outcome.done.load(ordering: .acquiring) { usleep(1_000) } }
        let back = try read(exactly: payload.count)
        if let error = outcome.error.withLock({ $0 }) { throw error }
        return back
    }
}

/// How the sending half of `TunnelClient.echoRoundTrip` ended.
private final class SendOutcome: Sendable {
    let error = Mutex<TestSocketError?>(nil)
    let done = Atomic<Bool>(false)
}
