#if canImport(Glibc)
import Glibc
#endif

/// SPEC §6: a listen address already in use, by any process, stops start-up with an error naming it.
///
/// The workers' listeners share one port through SO_REUSEPORT. That option is also what lets the kernel put
/// them in one accept group with *any other* socket of the same user that sets it — a second datamode-proxy,
/// an nginx with `reuseport` — and then each connection goes to one of them at random. So before the workers
/// bind, a probe socket is bound to the address *without* SO_REUSEPORT: the kernel refuses it (`EADDRINUSE`)
/// when anything listens there, with or without SO_REUSEPORT. The probe has SO_REUSEADDR and never listens:
/// so connections a previous instance left in TIME_WAIT do not block a restart, and the workers' own sockets
/// (SO_REUSEADDR too) can bind beside it (Linux refuses a bind only beside a *listening* socket of that kind).
///
/// Two proxies started at the same moment could both pass the probe before either listens. Between
/// datamode-proxies that window is closed by a start-up lock: an abstract Unix socket named after the port,
/// held from before the probe until every worker listens. Abstract sockets belong to the network namespace,
/// exactly the scope of TCP ports, and vanish with the process that holds them, so a crash leaves no stale
/// lock. A *foreign* program that sets SO_REUSEPORT and binds in the microseconds between the probe and the
/// workers' `listen` is not caught; nothing short of not using SO_REUSEPORT could catch it.
struct ListenGuard: ~Copyable {
    /// How long a start waits for another datamode-proxy that is starting on the same port.
    static let lockWait: Duration = .seconds(10)

    private let lock: Int32
    private let probe: Int32
    /// The port the probe holds (the kernel's choice when 0 was asked for).
    let port: UInt16

    /// Takes the start-up lock for the port and binds the probe; throws an error naming `address` when it is in use.
    init(_ address: SocketAddress) throws(EngineError) {
        // Locals until the end: nothing is stored (and so nothing closed twice by `deinit`) before success.
        let lock = address.port == 0 ? -1 : try Self.takeLock(port: address.port, address: address)
        let fd = socket(address.family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else {
            let reason = String(cString: strerror(errno))
            if lock >= 0 { Glibc.close(lock) }
            throw EngineError("cannot listen on \(address.description): socket: \(reason)")
        }
        var one: Int32 = 1
        _ = setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        let bound = address.withSockaddr { bind(fd, $0, $1) }
        guard bound == 0 else {
            let code = errno
            Glibc.close(fd)
            if lock >= 0 { Glibc.close(lock) }
            throw Self.bindError(address, code)
        }
        self.lock = lock
        self.probe = fd
        self.port = SocketAddress.local(of: fd)?.port ?? address.port
    }

    /// The error for a failed bind of the proxy's listen address.
    static func bindError(_ address: SocketAddress, _ code: Int32) -> EngineError {
        if code == EADDRINUSE {
            return EngineError("listen address \(address.description) is already in use (another process listens on it; "
                + "stop it or choose another --listen)")
        }
        return EngineError("cannot listen on \(address.description): \(String(cString: strerror(code)))")
    }

    /// Released (by going out of scope) once every worker listens: from then on the workers' sockets themselves
    /// make any later probe fail.
    deinit {
        if probe >= 0 { Glibc.close(probe) }
        if lock >= 0 { Glibc.close(lock) }
    }

    /// Binds the abstract Unix socket `@datamode-proxy/listen/<port>`, waiting while another start holds it.
    private static func takeLock(port: UInt16, address: SocketAddress) throws(EngineError) -> Int32 {
        let name = Array("datamode-proxy/listen/\(port)".utf8)
        var un = sockaddr_un()
        un.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &un.sun_path) { path in
            path[0] = 0  // abstract namespace: no file, gone with the process
            for (i, byte) in name.enumerated() { path[i + 1] = byte }
        }
        let length = socklen_t(MemoryLayout<sockaddr_un>.offset(of: \.sun_path)! + 1 + name.count)
        let clock = ContinuousClock()
        let deadline = clock.now + lockWait
        while true {
            let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
            guard fd >= 0 else {
                throw EngineError("cannot listen on \(address.description): socket(AF_UNIX): \(String(cString: strerror(errno)))")
            }
            let bound = withUnsafePointer(to: &un) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) }
            }
            if bound == 0 { return fd }
            let code = errno
            Glibc.close(fd)
            guard code == EADDRINUSE else {
                throw EngineError("cannot listen on \(address.description): start-up lock: \(String(cString: strerror(code)))")
            }
            guard clock.now < deadline else {
                throw EngineError("listen address \(address.description): another datamode-proxy has been starting on "
                    + "port \(port) for \(lockWait) without finishing")
            }
            usleep(10_000)
        }
    }
}
