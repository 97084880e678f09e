import CLibevent
import DatamodePolicy
#if canImport(Glibc)
import Glibc
#endif

/// A resolved socket address (IPv4 or IPv6), stored as `sockaddr_storage` so it can be handed to libevent.
struct SocketAddress {
    var storage = sockaddr_storage()
    var length: socklen_t = 0

    /// An IP literal and a port; `nil` when `host` is not an IP literal (then DNS is needed).
    init?(ipLiteral host: String, port: UInt16) {
        var v4 = in_addr()
        var v6 = in6_addr()
        if inet_pton(AF_INET, host, &v4) == 1 {
            var sin = sockaddr_in()
            sin.sin_family = sa_family_t(AF_INET)
            sin.sin_port = port.bigEndian
            sin.sin_addr = v4
            withUnsafeBytes(of: &sin) { src in
                withUnsafeMutableBytes(of: &storage) { $0.copyMemory(from: src) }
            }
            length = socklen_t(MemoryLayout<sockaddr_in>.size)
        } else if inet_pton(AF_INET6, host, &v6) == 1 {
            var sin6 = sockaddr_in6()
            sin6.sin6_family = sa_family_t(AF_INET6)
            sin6.sin6_port = port.bigEndian
            sin6.sin6_addr = v6
            withUnsafeBytes(of: &sin6) { src in
                withUnsafeMutableBytes(of: &storage) { $0.copyMemory(from: src) }
            }
            length = socklen_t(MemoryLayout<sockaddr_in6>.size)
        } else {
            return nil
        }
    }

    /// Copies a `sockaddr` handed over by the kernel or libevent.
    init?(_ address: UnsafePointer<sockaddr>, length: socklen_t) {
        guard Int(length) <= MemoryLayout<sockaddr_storage>.size else { return nil }
        withUnsafeMutableBytes(of: &storage) { dst in
            dst.copyMemory(from: UnsafeRawBufferPointer(start: address, count: Int(length)))
        }
        self.length = length
    }

    var family: Int32 { Int32(storage.ss_family) }

    var port: UInt16 {
        get {
            withUnsafeBytes(of: storage) { raw in
                family == AF_INET6
                    ? UInt16(bigEndian: raw.load(fromByteOffset: MemoryLayout<sockaddr_in6>.offset(of: \.sin6_port)!, as: UInt16.self))
                    : UInt16(bigEndian: raw.load(fromByteOffset: MemoryLayout<sockaddr_in>.offset(of: \.sin_port)!, as: UInt16.self))
            }
        }
        set {
            let isIPv6 = family == AF_INET6
            withUnsafeMutableBytes(of: &storage) { raw in
                let offset = isIPv6
                    ? MemoryLayout<sockaddr_in6>.offset(of: \.sin6_port)!
                    : MemoryLayout<sockaddr_in>.offset(of: \.sin_port)!
                raw.storeBytes(of: newValue.bigEndian, toByteOffset: offset, as: UInt16.self)
            }
        }
    }

    /// The address as a policy `IPAddress` (IPv4-mapped IPv6 addresses become IPv4).
    var ipAddress: IPAddress? {
        withUnsafeBytes(of: storage) { raw -> IPAddress? in
            if family == AF_INET {
                let offset = MemoryLayout<sockaddr_in>.offset(of: \.sin_addr)!
                return IPAddress(bytes: Array(raw[offset..<offset + 4]))
            }
            if family == AF_INET6 {
                let offset = MemoryLayout<sockaddr_in6>.offset(of: \.sin6_addr)!
                let bytes = Array(raw[offset..<offset + 16])
                if bytes[0..<10].allSatisfy({ $0 == 0 }) && bytes[10] == 0xff && bytes[11] == 0xff {
                    return IPAddress(bytes: Array(bytes[12..<16]))
                }
                return IPAddress(bytes: bytes)
            }
            return nil
        }
    }

    /// `1.2.3.4` or `::1` (no port).
    var hostText: String {
        var buffer = [CChar](repeating: 0, count: Int(INET6_ADDRSTRLEN) + 1)
        withUnsafeBytes(of: storage) { raw in
            if family == AF_INET {
                let offset = MemoryLayout<sockaddr_in>.offset(of: \.sin_addr)!
                _ = inet_ntop(AF_INET, raw.baseAddress! + offset, &buffer, socklen_t(buffer.count))
            } else if family == AF_INET6 {
                let offset = MemoryLayout<sockaddr_in6>.offset(of: \.sin6_addr)!
                _ = inet_ntop(AF_INET6, raw.baseAddress! + offset, &buffer, socklen_t(buffer.count))
            }
        }
        return String(cString: buffer)
    }

    /// `1.2.3.4:80` or `[::1]:80`.
    var description: String {
        family == AF_INET6 ? "[\(hostText)]:\(port)" : "\(hostText):\(port)"
    }

    func withSockaddr<R>(_ body: (UnsafePointer<sockaddr>, socklen_t) -> R) -> R {
        withUnsafeBytes(of: storage) { raw in
            body(raw.baseAddress!.assumingMemoryBound(to: sockaddr.self), length)
        }
    }

    /// The local address of a bound socket.
    static func local(of fd: Int32) -> SocketAddress? {
        var storage = sockaddr_storage()
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        let result = withUnsafeMutablePointer(to: &storage) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        guard result == 0 else { return nil }
        return withUnsafePointer(to: &storage) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { SocketAddress($0, length: length) }
        }
    }
}
