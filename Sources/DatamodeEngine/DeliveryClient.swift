import COpenSSL
import DatamodeDeferral
import DatamodeHTTP
import DatamodeHTTP2
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
/// As the engine does with TLS origins (SPEC §17, `http2.upstream`), it offers ALPN `h2, http/1.1`, and an origin
/// that picks `h2` gets the upload over HTTP/2 (`deliverOverH2`): an origin that speaks only h2 could otherwise
/// never take a stored upload, which the proxy answered `202` for.
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
    /// `http2.upstream` (SPEC §17): whether ALPN `h2, http/1.1` is offered to an `https://` origin.
    let offerH2: Bool
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

        let fields = requestFields(entry)
        if let ssl = wire.ssl, TLSClientContext.negotiatedH2(ssl) {
            let head = RequestHead(method: entry.method, target: entry.url, version: .http11,
                                   fields: fields + [HTTPField(name: "content-length", value: "\(entry.bytes)")])
            switch HTTP2OriginRequestTranslation.request(of: head, defaultAuthority: target.hostHeaderValue) {
            case .success(let request): return deliverOverH2(entry, request, wire)
            case .failure(let error): return .unusable("cannot be sent over HTTP/2: \(error)")
            }
        }
        var head = "\(entry.method) \(target.path) HTTP/1.1\r\nHost: \(target.hostHeaderValue)\r\n"
        for field in fields { head += "\(field.name): \(field.value)\r\n" }
        head += "Content-Length: \(entry.bytes)\r\nConnection: close\r\n\r\n"
        if let error = sendAll(wire, Array(head.utf8)) { return earlyAnswer(wire, after: error) }
        var offset = 0
        while offset < entry.bytes {
            switch readPiece(entry, offset: offset) {
            case .success(let bytes):
                if let error = sendAll(wire, bytes) { return earlyAnswer(wire, after: error) }
                offset += bytes.count
            case .failure(let outcome):
                return outcome.value
            }
        }
        return readStatus(wire)
    }

    /// The fields the upload is sent with, either version: the stored ones but the client's tags, the tags
    /// resolved now (when tags are forwarded), `Idempotency-Key` (unless the client sent one) and `Via`.
    /// Not `Host` nor the framing: each version writes its own.
    private func requestFields(_ entry: DeferredEntry) -> [HTTPField] {
        var fields: [HTTPField] = []
        for field in entry.headers {
            switch KnownField.of(field.name) {
            case .allowConstrained, .allowExpensive, .allowUltraConstrained: continue
            default: fields.append(field)
            }
        }
        if let tags {
            fields.append(HTTPField(name: "Allow-Constrained", value: tags.allowConstrained ? "?1" : "?0"))
            fields.append(HTTPField(name: "Allow-Expensive", value: tags.allowExpensive ? "?1" : "?0"))
            fields.append(HTTPField(name: "Allow-Ultra-Constrained", value: tags.allowUltraConstrained ? "?1" : "?0"))
        }
        if !entry.clientSentIdempotencyKey { fields.append(HTTPField(name: "Idempotency-Key", value: entry.id)) }
        fields.append(HTTPField(name: "Via", value: MessageHeads.viaValue))
        return fields
    }

    /// An outcome as an error, to return from a `Result`.
    struct Stop: Error { let value: Outcome }

    /// The next piece of the stored body from `offset` (never empty: a body shorter than its entry is unusable).
    private func readPiece(_ entry: DeferredEntry, offset: Int) -> Result<[UInt8], Stop> {
        let box = DeliveryResultBox<[UInt8]>()
        store.readBody(entry.id, offset: offset, count: Self.piece) { box.put($0) }
        switch box.take() {
        case .success(let bytes) where !bytes.isEmpty: return .success(bytes)
        case .success: return .failure(Stop(value: .unusable("the stored body ended at \(offset) of \(entry.bytes) bytes")))
        case .failure(let error): return .failure(Stop(value: .failed("reading the stored body: \(error)")))
        }
    }

    /// The upload as one HTTP/2 stream (RFC 9113) on the TLS connection the origin chose `h2` on: `request` is the
    /// stored request translated strictly (`HTTP2OriginRequestTranslation`: lowercase names, no connection-specific
    /// field, `:authority` from the URL), its body fed from the store as the session's queue drains — nghttp2 sends
    /// DATA only within the origin's windows, and the queue stops at its high watermark until WINDOW_UPDATEs open
    /// them (`requestBodyDrained`), so a large body is never in memory whole. The final status (1xx skipped) ends
    /// it; a reset stream, a GOAWAY that leaves it unprocessed, a broken response or a cut connection before it is
    /// a failure, retried.
    private func deliverOverH2(_ entry: DeferredEntry, _ request: HTTP2OriginRequest, _ wire: Wire) -> Outcome {
        let session: HTTP2ClientSession
        let stream: HTTP2StreamID
        do {
            session = try HTTP2ClientSession()
            stream = try session.startRequest(method: request.method, scheme: "https", authority: request.authority,
                                              path: request.path, fields: request.fields, endStream: entry.bytes == 0,
                                              checked: true)
        } catch {
            return .unusable("cannot be sent over HTTP/2: \(error)")
        }
        var offset = 0
        var feeding = entry.bytes > 0
        var finished = entry.bytes == 0

        /// What the session reported, as an outcome when it ends the delivery.
        func outcome(of events: [HTTP2ClientEvent]) -> Outcome? {
            for event in events {
                switch event {
                case .response(stream, let status, _, _):
                    return .answered(status)
                case .requestBodyDrained(stream):
                    feeding = true
                case .malformedResponse(stream, let why):
                    return .failed("upstream-protocol-error: \(why)")
                case .streamClosed(stream, let end):
                    return .failed("upstream-protocol-error: the stream closed before a response (\(end))")
                case .goaway(let last, let code) where last < stream:
                    return .failed("upstream-unreachable: the origin went away (GOAWAY \(code)) before the upload")
                case .connectionError(let error):
                    return .failed("upstream-protocol-error: \(error.detail)")
                default:
                    continue
                }
            }
            return nil
        }

        var buffer = [UInt8](repeating: 0, count: 16 << 10)
        while true {
            while feeding && offset < entry.bytes {
                switch readPiece(entry, offset: offset) {
                case .success(let bytes):
                    offset += bytes.count
                    do {
                        feeding = try bytes.withUnsafeBytes { try session.sendRequestBody(stream, $0) }
                    } catch {
                        return .failed("upstream-protocol-error: the stream closed while sending (\(error))")
                    }
                case .failure(let stop):
                    return stop.value
                }
            }
            if offset == entry.bytes && !finished {
                finished = true
                do { try session.finishRequest(stream) } catch {
                    return .failed("upstream-protocol-error: the stream closed while sending (\(error))")
                }
            }
            var sendFailure: String?
            let written = session.writeOutput { bytes in
                if sendFailure == nil { sendFailure = sendAll(wire, Array(bytes))?.detail }
            }
            if let sendFailure { return .failed(sendFailure) }
            if let done = outcome(of: written) {
                if case .answered = done { close(session, wire) }
                return done
            }
            // More of the body may go into the queue now: no need to wait for the origin first.
            if feeding && offset < entry.bytes { continue }
            let n: Int
            switch receive(wire, into: &buffer) {
            case .success(let count): n = count
            case .failure(let stop): return stop.value
            }
            let received = buffer.withUnsafeBytes { session.receive(UnsafeRawBufferPointer(rebasing: $0[..<n])) }
            if let done = outcome(of: received) {
                if case .answered = done { close(session, wire) }
                return done
            }
        }
    }

    /// GOAWAY (NO_ERROR) before the connection closes, the origin's answer in: a courtesy, errors ignored.
    private func close(_ session: HTTP2ClientSession, _ wire: Wire) {
        session.shutdown()
        var failed = false
        _ = session.writeOutput { bytes in
            if !failed { failed = sendAll(wire, Array(bytes)) != nil }
        }
    }

    /// Reads what the origin sent into `buffer`: the count, or why nothing can come (a timeout, a close, an error).
    private func receive(_ wire: Wire, into buffer: inout [UInt8]) -> Result<Int, Stop> {
        while true {
            let n = buffer.withUnsafeMutableBytes { wire.receive($0) }
            if n > 0 { return .success(n) }
            if n < 0 && errno == EINTR { continue }
            if n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) { return .failure(Stop(value: .failed("upstream-timeout: no response"))) }
            return .failure(Stop(value: .failed("upstream-unreachable: the origin closed before answering")))
        }
    }

    /// TLS on the connected socket, verified as the engine verifies origins (SNI and the name, or the address).
    private func startTLS(_ fd: Int32, host: String) -> Result<Wire, ConnectError> {
        let context: TLSClientContext
        do {
            context = try TLSClientContext(verify: verifyTLS)
        } catch {
            return .failure(ConnectError(message: "upstream-tls-error: \(error)"))
        }
        guard let ssl = context.makeSSL(host: host, offerH2: offerH2) else {
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

    /// Why `sendAll` could not send everything.
    private struct SendFailure {
        let detail: String
        /// The origin took nothing for the response timeout (stalled), as opposed to a reset or a close.
        let timedOut: Bool
    }

    private func sendAll(_ wire: Wire, _ bytes: [UInt8]) -> SendFailure? {
        var sent = 0
        while sent < bytes.count {
            let n = bytes.withUnsafeBytes { wire.send(UnsafeRawBufferPointer(rebasing: $0[sent...])) }
            if n < 0 {
                let code = errno
                if code == EINTR { continue }
                let timedOut = code == EAGAIN || code == EWOULDBLOCK
                return SendFailure(detail: (timedOut ? "upstream-timeout: " : "") + "sending to the origin: "
                                       + String(cString: strerror(code)),
                                   timedOut: timedOut)
            }
            sent += n
        }
        return nil
    }

    /// The upload could not be sent whole (`failure`). An origin may answer before it read all of it and close (a 413,
    /// a 401): the send then fails on the reset, and its answer may still be there to read. A final status read now
    /// ends the upload as any answer does (SPEC §18.3: a 4xx is final, it is not sent again); otherwise the send's
    /// failure stands and the upload is retried. Not after a send that timed out: the origin is stalled, not
    /// answering, and reading would wait as long again.
    private func earlyAnswer(_ wire: Wire, after failure: SendFailure) -> Outcome {
        guard !failure.timedOut, case .answered(let status) = readStatus(wire) else { return .failed(failure.detail) }
        return .answered(status)
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
            switch receive(wire, into: &chunk) {
            case .success(let n): buffer.append(contentsOf: chunk[0..<n])
            case .failure(let stop): return stop.value
            }
        }
    }
}
