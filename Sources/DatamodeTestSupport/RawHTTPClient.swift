import DatamodeHTTP
import Foundation
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// A blocking HTTP/1.1 client over one TCP connection, for sending exact bytes (pipelining, smuggling attempts)
/// and reading responses strictly. Every wait has a deadline, so a proxy that hangs fails the test instead of
/// hanging it. Not thread-safe: one test uses one client from one task.
///
/// The one raw client of the tests: besides HTTP it has a tunnel mode (`openTunnel`, then byte-exact reads for
/// what follows a CONNECT `200` or an Upgrade `101`), a trickling sender (`trickle`, a slowloris client), and
/// plain connections held idle (many clients that never send a byte).
public final class RawHTTPClient {
    public let port: UInt16
    /// How long any single operation may wait.
    public var timeout: Duration
    private var fd: Int32
    private var queue = ByteQueue()
    private var sawEOF = false

    private static let responseLimits = HTTPLimits(requestLine: 64 * 1024, headerSection: 1 << 20, headerCount: 10_000)

    /// Connects to 127.0.0.1:`port`. `receiveBuffer` shrinks the socket's receive buffer (a slow reader).
    public init(port: UInt16, timeout: Duration = .seconds(10), receiveBuffer: Int32? = nil) throws {
        self.port = port
        self.timeout = timeout
        self.fd = try Socket.connect(port: port, timeout: timeout, receiveBuffer: receiveBuffer)
    }

    deinit { close() }

    /// Closes the connection (idempotent).
    public func close() {
        if fd >= 0 {
            Glibc.close(fd)
            fd = -1
        }
    }

    /// Shuts down the sending side (the peer reads EOF), keeps reading possible.
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

    /// One request on a fresh connection: sends `text` (exact bytes) to 127.0.0.1:`port`, reads the final
    /// response (1xx skipped unless 101) and closes the connection.
    public static func exchange(_ text: String, to port: UInt16, method: String = "GET",
                                timeout: Duration = .seconds(10)) throws -> ParsedResponse {
        let client = try RawHTTPClient(port: port, timeout: timeout)
        defer { client.close() }
        try client.send(text)
        return try client.readFinalResponse(method: method)
    }

    private var deadline: ContinuousClock.Instant { .now + timeout }

    // MARK: sending

    /// Sends these bytes exactly, in one `send` where the kernel allows.
    public func send(_ bytes: [UInt8]) throws {
        try bytes.withUnsafeBytes { try Socket.sendAll(fd, $0, until: deadline) }
    }

    /// Sends the UTF-8 bytes of `text` exactly (write `\r\n` yourself).
    public func send(_ text: String) throws {
        try send(Array(text.utf8))
    }

    /// Streams a generated body without holding it; returns the `StreamChecksum` of what was sent.
    @discardableResult
    public func send(_ pattern: PatternBody) throws -> UInt64 {
        var sum = StreamChecksum()
        try pattern.forEachChunk { chunk in
            sum.update(chunk)
            try Socket.sendAll(fd, chunk, until: deadline)
        }
        return sum.value
    }

    // MARK: receiving

    /// Reads more bytes; `false` at EOF.
    private func fill() throws -> Bool {
        if sawEOF { return false }
        var chunk = [UInt8](repeating: 0, count: 256 * 1024)
        let n = try chunk.withUnsafeMutableBytes { try Socket.receive(fd, into: $0, until: deadline) }
        if n == 0 {
            sawEOF = true
            return false
        }
        chunk.withUnsafeBytes { queue.append(UnsafeRawBufferPointer(rebasing: $0[0..<n])) }
        return true
    }

    /// Reads the next response (a 1xx included) strictly. `method` is the request's method: a response to
    /// `HEAD` has no body whatever its fields say. Chunked bodies are decoded; a body without length runs to EOF.
    /// `bodySink`, when given, receives the decoded body piecewise instead of it being kept (large bodies).
    public func readResponse(method: String = "GET",
                             bodySink: ((UnsafeRawBufferPointer) -> Void)? = nil) throws -> ParsedResponse {
        var parsed: (ResponseHead, Int)?
        while parsed == nil {
            if !queue.isEmpty {
                switch queue.withUnsafeBytes({ HTTP1Parser.parseResponseHead($0, limits: Self.responseLimits) }) {
                case .complete(let head, let length): parsed = (head, length); continue
                case .invalid(let error):
                    let text = String(decoding: queue.prefix(min(queue.count, 300)), as: UTF8.self)
                    throw TestSocketError.protocolError("invalid response head (\(error)): \(text.debugDescription)")
                case .incomplete: break
                }
            }
            guard try fill() else {
                throw TestSocketError.closed(queue.isEmpty ? "no response" : "inside a response head (\(queue.count) bytes)")
            }
        }
        let (head, headLength) = parsed!
        let headBytes = queue.prefix(headLength)
        queue.consume(headLength)

        let framing: BodyFraming
        switch head.bodyFraming(requestMethod: method) {
        case .success(let f): framing = f
        case .failure(let error): throw TestSocketError.protocolError("invalid response framing: \(error)")
        }
        var body: [UInt8] = []
        var length: UInt64 = 0
        var trailers: [HTTPField] = []
        func deliver(_ piece: UnsafeRawBufferPointer) {
            length += UInt64(piece.count)
            if let bodySink { bodySink(piece) } else { body.append(contentsOf: piece) }
        }
        switch framing {
        case .none:
            break
        case .contentLength(let total):
            var remaining = total
            while remaining > 0 {
                if queue.isEmpty {
                    guard try fill() else { throw TestSocketError.closed("with \(remaining) of \(total) body bytes missing") }
                }
                let n = Int(min(UInt64(queue.count), remaining))
                queue.withUnsafeBytes { deliver(UnsafeRawBufferPointer(rebasing: $0[0..<n])) }
                queue.consume(n)
                remaining -= UInt64(n)
            }
        case .untilClose:
            while true {
                if !queue.isEmpty {
                    queue.withUnsafeBytes { deliver($0) }
                    queue.consume(queue.count)
                }
                guard try fill() else { break }
            }
        case .chunked:
            var decoder = ChunkedDecoder()
            while !decoder.isComplete {
                if decoder.dataRemaining > 0 {
                    if queue.isEmpty {
                        guard try fill() else { throw TestSocketError.closed("inside chunk data") }
                    }
                    let n = Int(min(UInt64(queue.count), decoder.dataRemaining))
                    queue.withUnsafeBytes { deliver(UnsafeRawBufferPointer(rebasing: $0[0..<n])) }
                    queue.consume(n)
                    decoder.consumeData(n)
                    continue
                }
                let result = queue.isEmpty ? .needMore : queue.withUnsafeBytes { decoder.parseFraming($0) }
                switch result {
                case .needMore:
                    guard try fill() else { throw TestSocketError.closed("inside chunk framing") }
                case .framing(let n):
                    queue.consume(n)
                case .end(let n):
                    trailers = Self.trailerFields(queue.prefix(n))
                    queue.consume(n)
                case .invalid(let error):
                    throw TestSocketError.protocolError("invalid chunked response body: \(error)")
                }
            }
        }
        return ParsedResponse(head: head, headBytes: headBytes, body: body, framing: framing, bodyLength: length,
                              trailers: trailers)
    }

    /// Reads the next final response, skipping any 1xx before it.
    public func readFinalResponse(method: String = "GET") throws -> ParsedResponse {
        while true {
            let response = try readResponse(method: method)
            if response.status >= 200 || response.status == 101 { return response }
        }
    }

    /// The fields of `last-chunk trailer-section CRLF`, parsed leniently (they were validated already).
    private static func trailerFields(_ bytes: [UInt8]) -> [HTTPField] {
        let text = String(decoding: bytes, as: UTF8.self)
        return text.components(separatedBy: "\r\n").dropFirst().compactMap { line in
            guard let colon = line.firstIndex(of: ":") else { return nil }
            return HTTPField(name: String(line[..<colon]),
                             value: line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces))
        }
    }

    /// Every byte until the peer closes (what is already buffered included).
    public func readAll() throws -> [UInt8] {
        while try fill() {}
        return queue.takeAll()
    }

    /// Whether the peer has closed the connection (EOF or reset), waiting up to `within` for it.
    /// Bytes that arrive meanwhile are kept for the next read, and mean "not closed".
    public func isClosedByPeer(within: Duration = .seconds(5)) -> Bool {
        if sawEOF { return true }
        if !queue.isEmpty { return false }
        guard Socket.waitReadable(fd, until: .now + within) else { return false }
        var chunk = [UInt8](repeating: 0, count: 64 * 1024)
        let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress!, $0.count, Int32(MSG_DONTWAIT)) }
        if n == 0 {
            sawEOF = true
            return true
        }
        if n < 0 {
            return errno == ECONNRESET || errno == EPIPE
        }
        chunk.withUnsafeBytes { queue.append(UnsafeRawBufferPointer(rebasing: $0[0..<n])) }
        return false
    }

    /// Bytes received but not yet consumed by a read.
    public var bufferedByteCount: Int { queue.count }

    // MARK: tunnel mode

    /// Sends `CONNECT authority` as curl does (`Host` is the authority; `headers` follow) and reads the proxy's
    /// answer strictly. After a `2xx` the connection is a tunnel: what follows is whatever the far end sends,
    /// read with `read(exactly:)`, `echoRoundTrip` and `readAll` (or as HTTP, when the tunnel carries HTTP).
    /// An Upgrade is the same after `readResponse()` returned its `101`.
    public func openTunnel(to authority: String, headers: [(String, String)] = []) throws -> ParsedResponse {
        try send(RequestText.make("CONNECT", authority, headers: headers, host: authority))
        return try readResponse(method: "CONNECT")
    }

    /// Exactly `count` bytes, whatever they are (throws if the peer closes first).
    public func read(exactly count: Int) throws -> [UInt8] {
        while queue.count < count {
            guard try fill() else { throw TestSocketError.closed("after \(queue.count) of \(count) bytes") }
        }
        let out = queue.prefix(count)
        queue.consume(count)
        return out
    }

    /// Sends `payload` from another thread while reading the same number of bytes back here (an echo through a
    /// tunnel bigger than every buffer on the way would deadlock a client that sends everything first).
    public func echoRoundTrip(_ payload: [UInt8]) throws -> [UInt8] {
        let fd = self.fd
        let deadline = self.deadline
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

    /// Sends `bytes` from another thread, so the caller can read the answers meanwhile (a pipelined burst bigger
    /// than the socket buffers). The returned function waits for the send to end and rethrows its error.
    public func sendInBackground(_ bytes: [UInt8]) -> () throws -> Void {
        let fd = self.fd
        let deadline = self.deadline
        let outcome = SendOutcome()
        Thread.detachNewThread {
            do {
                try bytes.withUnsafeBytes { try Socket.sendAll(fd, $0, until: deadline) }
            } catch {
                outcome.error.withLock { $0 = error as? TestSocketError ?? .protocolError("\(error)") }
            }
            outcome.done.store(true, ordering: .releasing)
        }
        return {
            while !outcome.done.load(ordering: .acquiring) { usleep(1_000) }
            if let error = outcome.error.withLock({ $0 }) { throw error }
        }
    }

    // MARK: trickling

    /// How a `trickle` ended.
    public struct TrickleOutcome: Sendable {
        /// Bytes sent before the peer closed (or all of them).
        public var sent: Int
        /// The peer closed the connection (EOF or reset) before every byte was sent.
        public var cutOff: Bool
        /// What the peer sent back before closing, if anything.
        public var received: [UInt8]
    }

    /// Sends `bytes` a few at a time, `step` bytes every `pause`, and reports whether the peer closed the
    /// connection before everything was sent (a slowloris attack, and the proxy's defence).
    public func trickle(_ bytes: [UInt8], step: Int = 1, pause: Duration = .milliseconds(200)) -> TrickleOutcome {
        var sent = 0
        var received: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        while sent < bytes.count {
            // Anything from the peer? EOF or reset means we were cut off.
            if Socket.waitReadable(fd, until: .now + pause) {
                let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress!, $0.count, Int32(MSG_DONTWAIT)) }
                if n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                    return TrickleOutcome(sent: sent, cutOff: true, received: received)
                }
                if n > 0 { received.append(contentsOf: buffer[0..<n]) }
            }
            let piece = Array(bytes[sent..<min(sent + step, bytes.count)])
            let n = piece.withUnsafeBytes { Glibc.send(fd, $0.baseAddress!, $0.count, Int32(MSG_NOSIGNAL) | Int32(MSG_DONTWAIT)) }
            if n < 0 {
                if errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR { continue }
                return TrickleOutcome(sent: sent, cutOff: true, received: received)
            }
            sent += n
        }
        return TrickleOutcome(sent: sent, cutOff: false, received: received)
    }
}

/// How the sending half of `RawHTTPClient.echoRoundTrip` ended.
private final class SendOutcome: Sendable {
    let error = Mutex<TestSocketError?>(nil)
    let done = Atomic<Bool>(false)
}
