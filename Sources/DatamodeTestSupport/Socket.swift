import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// Thin blocking POSIX socket helpers for the loopback tests (IPv4 only, 127.0.0.1).
///
/// Every send uses `MSG_NOSIGNAL`, so a peer that has gone away produces `EPIPE` instead of killing the test
/// process with SIGPIPE.
enum Socket {
    /// A listening TCP socket on 127.0.0.1 and the port the kernel picked (port 0 = any free port).
    /// `receiveBuffer` (SO_RCVBUF, inherited by accepted sockets) makes a slow reader's backlog show at the peer.
    /// `reusePort` sets SO_REUSEPORT, as servers that spread accepts over processes do (nginx `reuseport`).
    static func listen(port: UInt16 = 0, backlog: Int32 = 128, receiveBuffer: Int32? = nil,
                       reusePort: Bool = false) throws(TestSocketError) -> (fd: Int32, port: UInt16) {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw .system("socket", errno) }
        var one: Int32 = 1
        _ = setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        if var size = receiveBuffer {
            _ = setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, socklen_t(MemoryLayout<Int32>.size))
        }
        if reusePort { _ = setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, socklen_t(MemoryLayout<Int32>.size)) }
        var address = loopback(port: port)
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard bound == 0 else {
            let code = errno
            Glibc.close(fd)
            throw .system("bind", code)
        }
        guard Glibc.listen(fd, backlog) == 0 else {
            let code = errno
            Glibc.close(fd)
            throw .system("listen", code)
        }
        return (fd, try localPort(fd))
    }

    /// A connected TCP socket to 127.0.0.1:`port`, with TCP_NODELAY.
    /// `receiveBuffer` (SO_RCVBUF, set before connecting so the window starts small) makes a slow reader whose
    /// kernel buffers cannot hide how slowly it reads.
    /// `source` (a 127.x.y.z address) binds the client end first: another client address on the same machine.
    static func connect(port: UInt16, timeout: Duration, receiveBuffer: Int32? = nil,
                        source: String? = nil) throws(TestSocketError) -> Int32 {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw .system("socket", errno) }
        if var size = receiveBuffer {
            _ = setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, socklen_t(MemoryLayout<Int32>.size))
        }
        if let source {
            var local = loopback(port: 0)
            guard inet_pton(AF_INET, source, &local.sin_addr) == 1 else {
                Glibc.close(fd)
                throw .protocolError("not an IPv4 address: \(source)")
            }
            let bound = withUnsafePointer(to: &local) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
            }
            guard bound == 0 else {
                let code = errno
                Glibc.close(fd)
                throw .system("bind to \(source)", code)
            }
        }
        var address = loopback(port: port)
        let result = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard result == 0 else {
            let code = errno
            Glibc.close(fd)
            throw .system("connect to 127.0.0.1:\(port)", code)
        }
        var one: Int32 = 1
        _ = setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
        return fd
    }

    /// A port on 127.0.0.1 that nothing listens on: bound, then closed (connections to it are refused).
    static func closedPort() throws(TestSocketError) -> UInt16 {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw .system("socket", errno) }
        defer { Glibc.close(fd) }
        var address = loopback(port: 0)
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard bound == 0 else { throw .system("bind", errno) }
        return try localPort(fd)
    }

    static func localPort(_ fd: Int32) throws(TestSocketError) -> UInt16 {
        var address = sockaddr_in()
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let result = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        guard result == 0 else { throw .system("getsockname", errno) }
        return UInt16(bigEndian: address.sin_port)
    }

    static func loopback(port: UInt16) -> sockaddr_in {
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = port.bigEndian
        address.sin_addr = in_addr(s_addr: UInt32(0x7F00_0001).bigEndian)
        return address
    }

    /// Waits until `fd` is readable (or has an error or EOF pending). `false` on timeout.
    static func waitReadable(_ fd: Int32, until deadline: ContinuousClock.Instant) -> Bool {
        waitFor(fd, events: Int16(POLLIN), until: deadline)
    }

    static func waitWritable(_ fd: Int32, until deadline: ContinuousClock.Instant) -> Bool {
        waitFor(fd, events: Int16(POLLOUT), until: deadline)
    }

    private static func waitFor(_ fd: Int32, events: Int16, until deadline: ContinuousClock.Instant) -> Bool {
        while true {
            let left = ContinuousClock.now.duration(to: deadline)
            let ms = left <= .zero ? 0 : Int32(min(left.components.seconds * 1000 + left.components.attoseconds / 1_000_000_000_000_000 + 1, 60_000))
            var entry = pollfd(fd: fd, events: events, revents: 0)
            let n = poll(&entry, 1, ms)
            if n > 0 { return true }
            if n < 0 && errno == EINTR { continue }
            if ms == 0 || n < 0 { return false }
        }
    }

    /// Writes every byte, waiting for room until `deadline`.
    static func sendAll(_ fd: Int32, _ bytes: UnsafeRawBufferPointer, until deadline: ContinuousClock.Instant) throws(TestSocketError) {
        var offset = 0
        while offset < bytes.count {
            let n = send(fd, bytes.baseAddress! + offset, bytes.count - offset, Int32(MSG_NOSIGNAL) | Int32(MSG_DONTWAIT))
            if n > 0 {
                offset += n
                continue
            }
            let code = errno
            if n < 0 && code == EINTR { continue }
            if n < 0 && (code == EAGAIN || code == EWOULDBLOCK) {
                guard waitWritable(fd, until: deadline) else {
                    throw .timeout("sending \(bytes.count - offset) more bytes")
                }
                continue
            }
            throw .system("send", code)
        }
    }

    /// One `recv` of at most `buffer.count` bytes, waiting until `deadline`. 0 = the peer closed.
    static func receive(_ fd: Int32, into buffer: UnsafeMutableRawBufferPointer,
                        until deadline: ContinuousClock.Instant) throws(TestSocketError) -> Int {
        while true {
            guard waitReadable(fd, until: deadline) else { throw .timeout("waiting for bytes from the peer") }
            let n = recv(fd, buffer.baseAddress!, buffer.count, Int32(MSG_DONTWAIT))
            if n >= 0 { return n }
            let code = errno
            if code == EINTR || code == EAGAIN || code == EWOULDBLOCK { continue }
            throw .system("recv", code)
        }
    }
}
