import COpenSSL
import DatamodeDeferral
import DatamodeHTTP
import DatamodePolicy
#if canImport(Glibc)
import Glibc
#endif

/// A small HTTP/1.1 client that sends one stored upload to its origin (SPEC §18.3), with blocking sockets on a
/// delivery thread of its own (never a worker's loop): resolve, connect (each address in turn, bounded by the
/// connect timeout), send the stored request with `Content-Length`, `Via` and `Idempotency-Key` (unless the client
/// sent its own), its body read from the store in pieces, then read the answer's head (1xx skipped) within the
/// response timeout. `Connection: close`: one upload per connection, nothing pooled.
///
/// `https://` uploads go over TLS (blocking OpenSSL on the same socket), verified as the engine verifies origins
/// (`TLSClientContext`: the system trust store or `SSL_CERT_FILE`, SNI, the host name; `tls.upstream-verify`).
struct DeliveryClient {
    enum Outcome: CustomStringConvertible {
        /// The origin answered with this final status.
        case answered(Int)
        /// No answer (DNS, connect, a cut, a timeout, a broken response): worth retrying.
        case failed(String)
        /// Cannot be delivered by retrying (an unusable URL, a scheme not supported).
        case unusable(String)

        var description: String {
            switch self {
            case .answered(let status): "answered \(status)"
            case .failed(let error): "failed: \(error)"
            case .unusable(let error): "unusable: \(error)"
            }
        }
    }

    let store: DeferredStore
    let connectTimeout: Int64
    let responseTimeout: Int64
    /// The tags written on the delivery (SPEC §3), in place of the client's `Allow-*`; nil: none written.
    let tags: RequestTags?
    /// `tls.upstream-verify` (SPEC §9): whether an `https://` origin's certificate is verified.
    let verifyTLS: Bool
    /// Body bytes read from the store at a time.
    static let piece = 256 << 10

    /// The connection to the origin: the socket, or a TLS session over it.
    private struct Wire {
        let fd: Int32
        let ssl: OpaquePointer?

        func send(_ bytes: UnsafeRawBufferPointer) -> Int {
            guard let ssl else { return Glibc.send(fd, bytes.baseAddress!, bytes.count, Int32(MSG_NOSIGNAL)) }
            let n = SSL_write(ssl, bytes.baseAddress!, Int32(clamping: bytes.count))
            return n > 0 ? Int(n) : -1
        }

        func receive(_ buffer: UnsafeMutableRawBufferPointer) -> Int {
            guard let ssl else { return recv(fd, buffer.baseAddress!, buffer.count, 0) }
            let n = SSL_read(ssl, buffer.baseAddress!, Int32(clamping: buffer.count))
            return n > 0 ? Int(n) : (SSL_get_error(ssl, n) == SSL_ERROR_ZERO_RETURN ? 0 : -1)
        }

        func close() {
            if let ssl { SSL_free(ssl) }
            Glibc.close(fd)
        }
    }

    func deliver(_ entry: DeferredEntry) -> Outcome {
        guard case .success(let target) = RequestTarget.parse(entry.url, method: entry.method), target.form == .absolute else {
            return .unusable("unusable URL \(entry.url)")
        }
        guard target.scheme == "http" || target.scheme == "https" else {
            return .unusable("\(target.scheme):// uploads cannot be delivered")
        }
        let fd: Int32
        switch connect(host: target.host, port: target.port) {
        case .success(let connected): fd = connected
        case .failure(let error): return .failed(error.message)
        }
        setTimeout(fd, SO_SNDTIMEO, milliseconds: responseTimeout)
        setTimeout(fd, SO_RCVTIMEO, milliseconds: responseTimeout)
        let wire: Wire
        switch target.scheme == "https" ? startTLS(fd, host: target.host) : .success(Wire(fd: fd, ssl: nil)) {
        case .success(let started): wire = started
        case .failure(let error):
            Glibc.close(fd)
            return .failed(error.message)
        }
        defer { wire.close() }

        var head = "\(entry.method) \(target.path) HTTP/1.1\r\nHost: \(target.hostHeaderValue)\r\n"
        for field in entry.headers {
            switch KnownField.of(field.name) {
            case .allowConstrained, .allowExpensive, .allowUltraConstrained: continue
            default: head += "\(field.name): \(field.value)\r\n"
            }
        }
        if let tags {
            head += "Allow-Constrained: \(tags.allowConstrained ? "?1" : "?0")\r\n"
            head += "Allow-Expensive: \(tags.allowExpensive ? "?1" : "?0")\r\n"
            head += "Allow-Ultra-Constrained: \(tags.allowUltraConstrained ? "?1" : "?0")\r\n"
        }
        if !entry.clientSentIdempotencyKey { head += "Idempotency-Key: \(entry.id)\r\n" }
        head += "Content-Length: \(entry.bytes)\r\nVia: \(MessageHeads.viaValue)\r\nConnection: close\r\n\r\n"
        if let error = sendAll(wire, Array(head.utf8)) { return .failed(error) }
        var offset = 0
        while offset < entry.bytes {
            let box = DeliveryResultBox<[UInt8]>()
            store.readBody(entry.id, offset: offset, count: Self.piece) { box.put($0) }
            switch box.take() {
            case .success(let bytes) where !bytes.isEmpty:
                if let error = sendAll(wire, bytes) { return .failed(error) }
                offset += bytes.count
            case .success:
                return .unusable("the stored body ended at \(offset) of \(entry.bytes) bytes")
            case .failure(let error):
                return .failed("reading the stored body: \(error)")
            }
        }
        return readStatus(wire)
    }

    /// TLS on the connected socket, verified as the engine verifies origins (SNI and the name, or the address).
    private func startTLS(_ fd: Int32, host: String) -> Result<Wire, ConnectError> {
        let context: TLSClientContext
        do {
            context = try TLSClientContext(verify: verifyTLS)
        } catch {
            return .failure(ConnectError(message: "upstream-tls-error: \(error)"))
        }
        guard let ssl = context.makeSSL(host: host) else {
            return .failure(ConnectError(message: "upstream-tls-error: no TLS state for \(host)"))
        }
        SSL_set_fd(ssl, fd)
        guard SSL_connect(ssl) == 1 else {
            let verified = SSL_get_verify_result(ssl)
            let why = verified == X509_V_OK ? TLSClientContext.lastError()
                : "certificate verification failed: " + String(cString: X509_verify_cert_error_string(verified))
            SSL_free(ssl)
            return .failure(ConnectError(message: "upstream-tls-error: \(host): \(why)"))
        }
        return .success(Wire(fd: fd, ssl: ssl))
    }

    struct ConnectError: Error { let message: String }

    private func connect(host: String, port: UInt16) -> Result<Int32, ConnectError> {
        var hints = addrinfo()
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        hints.ai_flags = AI_ADDRCONFIG
        var list: UnsafeMutablePointer<addrinfo>?
        let rc = getaddrinfo(host, String(port), &hints, &list)
        guard rc == 0, let first = list else {
            return .failure(ConnectError(message: "dns-failure: \(host): \(String(cString: gai_strerror(rc)))"))
        }
        defer { freeaddrinfo(first) }
        var lastError = "no address"
        var cursor: UnsafeMutablePointer<addrinfo>? = first
        while let info = cursor {
            cursor = info.pointee.ai_next
            let fd = socket(info.pointee.ai_family, info.pointee.ai_socktype | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue),
                            info.pointee.ai_protocol)
            guard fd >= 0 else { continue }
            if Glibc.connect(fd, info.pointee.ai_addr, info.pointee.ai_addrlen) == 0 || errno == EINPROGRESS {
                var poller = pollfd(fd: fd, events: Int16(POLLOUT), revents: 0)
                if poll(&poller, 1, Int32(clamping: connectTimeout)) == 1 {
                    var error: Int32 = 0
                    var length = socklen_t(MemoryLayout<Int32>.size)
                    getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length)
                    if error == 0 {
                        _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK)
                        return .success(fd)
                    }
                    lastError = String(cString: strerror(error))
                } else {
                    lastError = "connect timed out"
                }
            } else {
                lastError = String(cString: strerror(errno))
            }
            Glibc.close(fd)
        }
        return .failure(ConnectError(message: "upstream-unreachable: \(host):\(port): \(lastError)"))
    }

    private func setTimeout(_ fd: Int32, _ option: Int32, milliseconds: Int64) {
        var value = timeval(tv_sec: Int(milliseconds / 1000), tv_usec: Int(milliseconds % 1000) * 1000)
        setsockopt(fd, SOL_SOCKET, option, &value, socklen_t(MemoryLayout<timeval>.size))
    }

    private func sendAll(_ wire: Wire, _ bytes: [UInt8]) -> String? {
        var sent = 0
        while sent < bytes.count {
            let n = bytes.withUnsafeBytes { wire.send(UnsafeRawBufferPointer(rebasing: $0[sent...])) }
            if n < 0 {
                if errno == EINTR { continue }
                return "sending to the origin: \(String(cString: strerror(errno)))"
            }
            sent += n
        }
        return nil
    }

    /// Reads response heads until a final one (a `1xx` is skipped), and its status.
    private func readStatus(_ wire: Wire) -> Outcome {
        var buffer: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 16 << 10)
        while true {
            switch buffer.withUnsafeBytes({ HTTP1Parser.parseResponseHead($0, limits: Flow.responseLimits) }) {
            case .complete(let head, let length):
                if head.status >= 100 && head.status < 200 {
                    buffer.removeFirst(length)
                    continue
                }
                return .answered(head.status)
            case .invalid(let error):
                return .failed("upstream-protocol-error: \(error.detail)")
            case .incomplete:
                break
            }
            if buffer.count > Flow.maxResponseHeadBytes { return .failed("upstream-protocol-error: response head too large") }
            let n = chunk.withUnsafeMutableBytes { wire.receive($0) }
            if n < 0 && errno == EINTR { continue }
            if n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) { return .failed("upstream-timeout: no response") }
            if n <= 0 { return .failed("upstream-unreachable: the origin closed before answering") }
            buffer.append(contentsOf: chunk[0..<n])
        }
    }
}
