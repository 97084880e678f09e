import Foundation
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

// Peers for the tunnel, access and lifecycle end-to-end tests: what sits at the far end of a CONNECT or an
// Upgrade (a TCP echo server, an origin that really switches protocols, a TLS server), plus process probes
// (RSS, CPU time, open descriptors) and descriptor-limit helpers for the robustness tests.

/// The listener shared by the peers here: 127.0.0.1, port 0 read back, one thread per accepted connection
/// running the peer's `serve`, and `stop()` that shuts every socket down. Descriptors are closed only by the
/// thread that owns them, so a stopped peer can never close a descriptor number another test now uses.
final class LoopbackAcceptor: @unchecked Sendable {
    let port: UInt16

    private struct State {
        var stopped = false
        var listenFD: Int32
        var open: [Int: Int32] = [:]
        var accepted = 0
    }

    private let state: Mutex<State>

    init() throws {
        let (fd, port) = try Socket.listen()
        self.port = port
        state = Mutex(State(listenFD: fd))
    }

    /// Starts accepting; `serve` runs on its own thread per connection and the socket is closed after it.
    func start(_ serve: @escaping @Sendable (Int32) -> Void) {
        let fd = state.withLock { $0.listenFD }
        Thread.detachNewThread { [self] in acceptLoop(fd, serve) }
    }

    /// Connections accepted so far.
    var accepted: Int { state.withLock { $0.accepted } }

    func stop() {
        state.withLock { state in
            guard !state.stopped else { return }
            state.stopped = true
            _ = shutdown(state.listenFD, Int32(SHUT_RDWR))
            for fd in state.open.values { _ = shutdown(fd, Int32(SHUT_RDWR)) }
        }
    }

    private func acceptLoop(_ listenFD: Int32, _ serve: @escaping @Sendable (Int32) -> Void) {
        while true {
            let fd = accept(listenFD, nil, nil)
            if fd < 0 {
                let stopped = state.withLock { state -> Bool in
                    if state.stopped { Glibc.close(listenFD) }
                    return state.stopped
                }
                if stopped { return }
                continue
            }
            _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
            let number: Int? = state.withLock { state in
                if state.stopped { return nil }
                state.accepted += 1
                state.open[state.accepted] = fd
                return state.accepted
            }
            guard let number else {
                Glibc.close(fd)
                continue
            }
            Thread.detachNewThread { [self] in
                serve(fd)
                state.withLock { _ = $0.open.removeValue(forKey: number) }
                Glibc.close(fd)
            }
        }
    }
}

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
        acceptor.start { [self] fd in echo(fd) }
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
        acceptor.start { [self] fd in serve(fd) }
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

/// `openssl s_server -WWW` on 127.0.0.1 (port 0, read back from its `ACCEPT` line) with a fresh self-signed
/// certificate for `localhost` (and IP 127.0.0.1): a real TLS origin whose bytes only the two TLS endpoints can
/// read, so a CONNECT tunnel that alters a single byte breaks the handshake or the record MACs.
///
/// `-WWW` serves files from `directory`: `GET /name HTTP/1.0` answers the file's exact bytes.
public final class TLSFileServer: @unchecked Sendable {
    public let directory: String
    /// The self-signed certificate (PEM), to trust with `curl --cacert`.
    public let certificatePath: String
    public let port: UInt16
    private let process: Process
    private let outputPath: String

    public struct Failure: Error, CustomStringConvertible {
        public var description: String
    }

    public init(directory: String) throws {
        self.directory = directory
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        certificatePath = directory + "/cert.pem"
        let keyPath = directory + "/key.pem"
        let generated = try ExternalCommand.run("/usr/bin/openssl", [
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost", "-days", "1",
            "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
            "-keyout", keyPath, "-out", certificatePath,
        ])
        guard generated.status == 0 else { throw Failure(description: "openssl req failed: \(generated.output)") }

        outputPath = directory + "/s_server.log"
        _ = FileManager.default.createFile(atPath: outputPath, contents: nil)
        process = Process()
        // stdbuf: s_server's stdout is a file here, block-buffered; the ACCEPT line must reach it at once.
        process.executableURL = URL(fileURLWithPath: "/usr/bin/stdbuf")
        process.arguments = ["-oL", "/usr/bin/openssl", "s_server", "-accept", "127.0.0.1:0", "-cert", certificatePath, "-key", keyPath, "-WWW"]
        process.currentDirectoryURL = URL(fileURLWithPath: directory)
        process.standardInput = FileHandle.nullDevice
        process.standardOutput = FileHandle(forWritingAtPath: outputPath)
        process.standardError = FileHandle(forWritingAtPath: outputPath)
        try process.run()

        let deadline = Date().addingTimeInterval(20)
        var found: UInt16?
        while found == nil && Date() < deadline {
            let log = (try? String(contentsOfFile: outputPath, encoding: .utf8)) ?? ""
            if let line = log.split(separator: "\n").first(where: { $0.hasPrefix("ACCEPT") }),
               let colon = line.lastIndex(of: ":") {
                found = UInt16(line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces))
            }
            if found == nil {
                guard process.isRunning else { break }
                usleep(20_000)
            }
        }
        guard let found else {
            if process.isRunning { kill(process.processIdentifier, SIGKILL) }
            let log = (try? String(contentsOfFile: outputPath, encoding: .utf8)) ?? ""
            throw Failure(description: "openssl s_server did not report its port: \(log)")
        }
        port = found
    }

    /// Writes a file that `GET /name` will serve.
    public func publish(_ name: String, _ bytes: [UInt8]) throws {
        try Data(bytes).write(to: URL(fileURLWithPath: directory + "/" + name))
    }

    /// SIGKILL, not SIGTERM: a child of the test runner inherits its blocked signal mask, and s_server does not
    /// unblock SIGTERM (a terminate() would wait forever).
    public func stop() {
        if process.isRunning {
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
    }

    deinit { stop() }
}

/// Runs a command to completion with its output captured (stdout and stderr together), bounded in time.
public enum ExternalCommand {
    public struct Result: Sendable {
        public var status: Int32
        /// stdout and stderr, interleaved as written.
        public var output: String
        /// stdout alone, as bytes.
        public var stdout: [UInt8]
    }

    /// `timeout` kills the command (SIGKILL) when it runs longer; the status is then that of a killed process.
    public static func run(_ executable: String, _ arguments: [String], environment: [String: String]? = nil,
                           timeout: Double = 60) throws -> Result {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments
        if let environment { process.environment = environment }
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("cmd-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let outPath = directory + "/out"
        let allPath = directory + "/all"
        _ = FileManager.default.createFile(atPath: outPath, contents: nil)
        _ = FileManager.default.createFile(atPath: allPath, contents: nil)
        let out = FileHandle(forWritingAtPath: outPath)!
        let all = FileHandle(forWritingAtPath: allPath)!
        process.standardOutput = out
        process.standardError = all
        process.standardInput = FileHandle.nullDevice
        try process.run()
        let deadline = Date().addingTimeInterval(timeout)
        while process.isRunning && Date() < deadline { usleep(10_000) }
        if process.isRunning {
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
        try? out.close()
        try? all.close()
        let stdout = (try? Data(contentsOf: URL(fileURLWithPath: outPath))) ?? Data()
        let stderr = (try? String(contentsOfFile: allPath, encoding: .utf8)) ?? ""
        return Result(status: process.terminationStatus,
                      output: String(decoding: stdout, as: UTF8.self) + stderr, stdout: Array(stdout))
    }
}

/// The real binary started with exactly the given arguments, optionally through a launcher (a shell that
/// lowers `ulimit -n` first, `prlimit`, …), for the few tests `ProxyProcess` cannot express: it always adds
/// `--listen`, `--admin-listen` and `--state-dir`, which would hide `DATAMODE_LISTEN` and friends, and it
/// starts the binary directly.
///
/// The ports are read from the start-up "ready" line, as `ProxyProcess` does.
public final class LaunchedProxy: @unchecked Sendable {
    public let process: Process
    public let directory: String
    public private(set) var port: UInt16 = 0
    public private(set) var adminPort: UInt16 = 0
    private let stdoutPath: String
    private let stderrPath: String

    /// Runs `launcher + [binary] + arguments` in `directory` with `environment` added to PATH and HOME.
    /// A launcher such as `["/bin/bash", "-c", "ulimit -n 64 && exec \"$0\" \"$@\""]` runs the binary in place.
    public init(launcher: [String] = [], arguments: [String], environment: [String: String] = [:],
                directory: String, waitForReady: Bool = true) throws {
        self.directory = directory
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        stdoutPath = directory + "/launched-stdout.log"
        stderrPath = directory + "/launched-stderr.log"
        _ = FileManager.default.createFile(atPath: stdoutPath, contents: nil)
        _ = FileManager.default.createFile(atPath: stderrPath, contents: nil)
        process = Process()
        let command = launcher + [ProxyProcess.binaryPath] + arguments
        process.executableURL = URL(fileURLWithPath: command[0])
        process.arguments = Array(command.dropFirst())
        var env = ["PATH": ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin"]
        env["HOME"] = ProcessInfo.processInfo.environment["HOME"] ?? "/tmp"
        for (key, value) in environment { env[key] = value }
        process.environment = env
        process.currentDirectoryURL = URL(fileURLWithPath: directory)
        process.standardOutput = FileHandle(forWritingAtPath: stdoutPath)
        process.standardError = FileHandle(forWritingAtPath: stderrPath)
        process.standardInput = FileHandle.nullDevice
        try process.run()
        if waitForReady { try self.waitForReady() }
    }

    public var stdout: String { (try? String(contentsOfFile: stdoutPath, encoding: .utf8)) ?? "" }
    public var stderr: String { (try? String(contentsOfFile: stderrPath, encoding: .utf8)) ?? "" }
    public var pid: Int32 { process.processIdentifier }

    public func waitForReady(timeout: Double = 20) throws {
        let deadline = Date().addingTimeInterval(timeout)
        while Date() < deadline {
            let log = stderr
            if let line = log.split(separator: "\n").first(where: { $0.contains(" ready") }),
               let listen = Self.port(after: "listen=", in: line), let admin = Self.port(after: "admin=", in: line) {
                port = listen
                adminPort = admin
                return
            }
            if !process.isRunning {
                throw ProxyProcess.LaunchError(description: "datamode-proxy exited with \(process.terminationStatus) before it was ready:\n\(log)")
            }
            usleep(20_000)
        }
        throw ProxyProcess.LaunchError(description: "datamode-proxy was not ready within \(timeout)s:\n\(stderr)")
    }

    private static func port(after key: String, in line: Substring) -> UInt16? {
        guard let range = line.range(of: key) else { return nil }
        let value = line[range.upperBound...].prefix { $0 != " " }
        guard let colon = value.lastIndex(of: ":") else { return nil }
        return UInt16(value[value.index(after: colon)...])
    }

    @discardableResult
    public func waitForExit(timeout: Double = 15) -> Int32? {
        let deadline = Date().addingTimeInterval(timeout)
        while process.isRunning && Date() < deadline { usleep(20_000) }
        return process.isRunning ? nil : process.terminationStatus
    }

    public func stop() {
        guard process.isRunning else { return }
        kill(process.processIdentifier, SIGTERM)
        if waitForExit(timeout: 15) == nil {
            kill(process.processIdentifier, SIGKILL)
            waitForExit(timeout: 5)
        }
    }

    deinit {
        if process.isRunning { kill(process.processIdentifier, SIGKILL) }
    }
}

/// What `/proc` says about a process: resident memory, CPU time, open descriptors (Linux only).
public enum ProcessProbe {
    /// `VmRSS` from `/proc/PID/status`, in KiB.
    public static func residentKiB(_ pid: Int32) -> Int? {
        guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8),
              let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmRSS:") }) else { return nil }
        return Int(line.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first ?? "")
    }

    /// utime + stime from `/proc/PID/stat`, in seconds.
    public static func cpuSeconds(_ pid: Int32) -> Double? {
        guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
              let close = stat.lastIndex(of: ")") else { return nil }
        // Fields after "(comm)": state is field 3, utime field 14, stime field 15.
        let fields = stat[stat.index(after: close)...].split(separator: " ")
        guard fields.count > 13, let utime = Double(fields[11]), let stime = Double(fields[12]) else { return nil }
        return (utime + stime) / Double(sysconf(Int32(_SC_CLK_TCK)))
    }

    /// Entries in `/proc/PID/fd`.
    public static func openDescriptorCount(_ pid: Int32) -> Int? {
        (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd"))?.count
    }
}

/// This process's descriptor limit (RLIMIT_NOFILE).
public enum DescriptorLimit {
    /// Raises the soft limit to at least `wanted` (capped at the hard limit); returns the soft limit now in force.
    /// Raising is process-wide and harmless to other tests; it is never lowered here.
    @discardableResult
    public static func raise(to wanted: Int) -> Int {
        var limit = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return 0 }
        let target = min(rlim_t(wanted), limit.rlim_max)
        if limit.rlim_cur < target {
            limit.rlim_cur = target
            _ = setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
            _ = getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
        }
        return Int(limit.rlim_cur)
    }
}

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

/// A client that trickles bytes: sends `bytes` a few at a time with a pause between, and reports whether the
/// peer closed the connection before everything was sent (a slowloris attack, and the proxy's defence).
public enum TrickleClient {
    public struct Outcome: Sendable {
        /// Bytes sent before the peer closed (or all of them).
        public var sent: Int
        /// The peer closed the connection (EOF or reset) before every byte was sent.
        public var cutOff: Bool
        /// What the peer sent back before closing, if anything.
        public var received: [UInt8]
    }

    /// Sends `bytes` to 127.0.0.1:`port`, `step` bytes every `pause`, watching for the peer closing.
    public static func trickle(_ bytes: [UInt8], to port: UInt16, step: Int = 1, pause: Duration = .milliseconds(200))
        throws -> Outcome {
        let fd = try Socket.connect(port: port, timeout: .seconds(10))
        defer { Glibc.close(fd) }
        var sent = 0
        var received: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        while sent < bytes.count {
            // Anything from the peer? EOF or reset means we were cut off.
            if Socket.waitReadable(fd, until: .now + pause) {
                let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress!, $0.count, Int32(MSG_DONTWAIT)) }
                if n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                    return Outcome(sent: sent, cutOff: true, received: received)
                }
                if n > 0 { received.append(contentsOf: buffer[0..<n]) }
            }
            let piece = Array(bytes[sent..<min(sent + step, bytes.count)])
            let n = piece.withUnsafeBytes { send(fd, $0.baseAddress!, $0.count, Int32(MSG_NOSIGNAL) | Int32(MSG_DONTWAIT)) }
            if n < 0 {
                if errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR { continue }
                return Outcome(sent: sent, cutOff: true, received: received)
            }
            sent += n
        }
        return Outcome(sent: sent, cutOff: false, received: received)
    }
}

/// One request on a fresh connection, its response read strictly, the connection closed.
public enum SingleExchange {
    /// Sends `text` (exact bytes) to 127.0.0.1:`port` and reads the final response (1xx skipped unless 101).
    public static func send(_ text: String, to port: UInt16, method: String = "GET",
                            timeout: Duration = .seconds(10)) throws -> ParsedResponse {
        let client = try RawHTTPClient(port: port, timeout: timeout)
        defer { client.close() }
        try client.send(text)
        return try client.readFinalResponse(method: method)
    }

}


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

/// The length of the head at the start of `bytes` (through CRLF CRLF), if it is complete.
private func endOfHTTPHead(_ bytes: [UInt8]) -> Int? {
    guard bytes.count >= 4 else { return nil }
    for i in 0...(bytes.count - 4) where bytes[i] == 13 && bytes[i + 1] == 10 && bytes[i + 2] == 13 && bytes[i + 3] == 10 {
        return i + 4
    }
    return nil
}

/// A fresh private directory under the system temporary directory, for one test's files.
public enum ScratchDirectory {
    /// Creates `<tmp>/<prefix>-<random>` and returns its path.
    public static func make(_ prefix: String) throws -> String {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("\(prefix)-\(UUID().uuidString.prefix(8))").path
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        return path
    }

    /// Removes it and everything in it (errors ignored: a leftover temporary directory is harmless).
    public static func remove(_ path: String) {
        try? FileManager.default.removeItem(atPath: path)
    }
}
