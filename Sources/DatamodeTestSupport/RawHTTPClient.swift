import DatamodeHTTP
import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A blocking HTTP/1.1 client over one TCP connection, for sending exact bytes (pipelining, smuggling attempts)
/// and reading responses strictly. Every wait has a deadline, so a proxy that hangs fails the test instead of
/// hanging it. Not thread-safe: one test uses one client from one task.
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
}
