import DatamodeHTTP
import Foundation
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// A real TCP origin server on 127.0.0.1 (port 0, read back) for loopback tests.
///
/// Each accepted connection gets its own thread, which reads requests one after another with the strict
/// `DatamodeHTTP` parser (to know where a head ends and how the body is framed), records every request's exact
/// bytes with its connection number, and answers from the handler. Because the origin parses strictly, a proxy
/// that forwards something ambiguous shows up in `violations` instead of being silently accepted.
///
/// Connections are accepted by a `LoopbackAcceptor`, the listener every test peer shares.
public final class RecordingOrigin: @unchecked Sendable {
    public typealias Handler = @Sendable (RecordedRequest) -> OriginResponse

    /// The port the origin listens on (127.0.0.1).
    public let port: UInt16
    /// Bodies longer than this are not kept (only their lengths and checksums).
    public let maxRecordedBodyBytes: Int
    /// Whether a request with `Expect: 100-continue` gets `100 Continue` as soon as its head is read.
    public let sendsContinue: Bool
    /// The version in every status line (`HTTP/1.0` makes an origin like `python3 -m http.server`: it closes
    /// after each response).
    public let responseVersion: HTTPVersion
    /// A slow reader: the pause before each read of at most 16 KiB (with a small receive buffer), so that what
    /// the proxy sends piles up in its own buffers.
    public let readPause: Duration?

    private struct State {
        var handler: Handler
        var requests: [RecordedRequest] = []
        var bytesReceived: UInt64 = 0
        /// The first `maxCapturedBytes` bytes received on each connection, parsed or not.
        var captured: [Int: [UInt8]] = [:]
        var violations: [String] = []
    }

    private let state: Mutex<State>
    private let acceptor: LoopbackAcceptor

    /// Starts listening at once. `handler` answers every request (default: `200 ok`).
    public init(maxRecordedBodyBytes: Int = 16 << 20, sendsContinue: Bool = true,
                responseVersion: HTTPVersion = .http11, readPause: Duration? = nil,
                handler: @escaping Handler = { _ in .ok() }) throws {
        acceptor = try LoopbackAcceptor(receiveBuffer: readPause == nil ? nil : 16 * 1024)
        self.port = acceptor.port
        self.responseVersion = responseVersion
        self.readPause = readPause
        self.maxRecordedBodyBytes = maxRecordedBodyBytes
        self.sendsContinue = sendsContinue
        self.state = Mutex(State(handler: handler))
        acceptor.start { [self] fd, number in serve(fd, number: number) }
    }

    /// `http://127.0.0.1:<port>` + `path`.
    public func url(_ path: String = "/") -> String { "http://127.0.0.1:\(port)\(path)" }
    /// `127.0.0.1:<port>`, the Host the proxy should send.
    public var authority: String { "127.0.0.1:\(port)" }

    /// Replaces the handler for requests that arrive from now on.
    public func setHandler(_ handler: @escaping Handler) {
        state.withLock { $0.handler = handler }
    }

    /// Every request received so far, in arrival order.
    public var requests: [RecordedRequest] { state.withLock { $0.requests } }
    /// Connections accepted so far.
    public var connectionCount: Int { acceptor.accepted }
    /// Connections accepted and not yet closed.
    public var openConnectionCount: Int { acceptor.openCount }
    /// Every byte received on every connection, parsed or not.
    public var bytesReceived: UInt64 { state.withLock { $0.bytesReceived } }
    /// The bytes received on connection `number` (1-based) exactly as they arrived, whether or not they formed
    /// a request: the first `maxCapturedBytes` of them.
    public func receivedBytes(onConnection number: Int) -> [UInt8] {
        state.withLock { $0.captured[number] ?? [] }
    }
    /// Waits until the bytes received on connection `number` satisfy `condition` (or `timeout` passes);
    /// returns them either way.
    @discardableResult
    public func waitForReceivedBytes(onConnection number: Int, timeout: Duration = .seconds(10),
                                     until condition: ([UInt8]) -> Bool) -> [UInt8] {
        let deadline = ContinuousClock.now + timeout
        while true {
            let bytes = receivedBytes(onConnection: number)
            if condition(bytes) || ContinuousClock.now >= deadline { return bytes }
            Thread.sleep(forTimeInterval: 0.005)
        }
    }
    /// How many bytes of each connection `receivedBytes(onConnection:)` keeps.
    public static let maxCapturedBytes = 1 << 20

    /// What the origin could not parse (a head or body framing the strict parser refused), one line each.
    public var violations: [String] { state.withLock { $0.violations } }

    /// Waits until at least `count` requests were recorded; returns them (fewer on timeout).
    @discardableResult
    public func waitForRequests(_ count: Int, timeout: Duration = .seconds(10)) -> [RecordedRequest] {
        let deadline = ContinuousClock.now + timeout
        while true {
            let current = requests
            if current.count >= count || ContinuousClock.now >= deadline { return current }
            Thread.sleep(forTimeInterval: 0.005)
        }
    }

    /// Waits until every accepted connection has been closed (by the peer or by the origin), so that every
    /// byte the proxy sent has been read. Returns `false` on timeout.
    @discardableResult
    public func waitUntilConnectionsClosed(timeout: Duration = .seconds(10)) -> Bool {
        let deadline = ContinuousClock.now + timeout
        while true {
            if openConnectionCount == 0 { return true }
            if ContinuousClock.now >= deadline { return false }
            Thread.sleep(forTimeInterval: 0.005)
        }
    }

    /// Stops accepting and shuts every connection down. Idempotent.
    public func stop() { acceptor.stop() }

    deinit { stop() }

    private var isStopped: Bool { acceptor.isStopped }

    // MARK: one connection

    private static let parseLimits = HTTPLimits(requestLine: 1 << 20, headerSection: 4 << 20, headerCount: 10_000)
    private static let idleTimeout: Duration = .seconds(60)

    private func serve(_ fd: Int32, number: Int) {
        var queue = ByteQueue()
        var index = 0
        do {
            while true {
                guard let request = try readRequest(fd, queue: &queue, connection: number, index: index) else { return }
                index += 1
                let handler = state.withLock { $0.handler }
                let keepOpen = try respond(handler(request), to: request, fd: fd)
                if !keepOpen || request.head.connectionTokens.contains("close") || request.head.version == .http10
                    || responseVersion == .http10 {
                    return
                }
            }
        } catch {
            return
        }
    }

    /// Reads more bytes into `queue`; `false` at EOF.
    private func fill(_ fd: Int32, _ queue: inout ByteQueue, connection: Int) throws -> Bool {
        if let readPause {
            let (seconds, attoseconds) = readPause.components
            Thread.sleep(forTimeInterval: Double(seconds) + Double(attoseconds) / 1e18)
        }
        var chunk = [UInt8](repeating: 0, count: readPause == nil ? 256 * 1024 : 16 * 1024)
        let n = try chunk.withUnsafeMutableBytes { buffer in
            try Socket.receive(fd, into: buffer, until: .now + Self.idleTimeout)
        }
        if n == 0 { return false }
        state.withLock { state in
            state.bytesReceived += UInt64(n)
            let kept = state.captured[connection, default: []].count
            if kept < Self.maxCapturedBytes {
                state.captured[connection, default: []].append(contentsOf: chunk[0..<min(n, Self.maxCapturedBytes - kept)])
            }
        }
        chunk.withUnsafeBytes { queue.append(UnsafeRawBufferPointer(rebasing: $0[0..<n])) }
        return true
    }

    private func violation(_ text: String, connection: Int) {
        state.withLock { $0.violations.append("connection \(connection): \(text)") }
    }

    /// Reads one whole request; `nil` when the connection ended (cleanly between requests, or on a violation).
    private func readRequest(_ fd: Int32, queue: inout ByteQueue, connection: Int, index: Int) throws -> RecordedRequest? {
        // The head.
        var parsed: (RequestHead, Int)?
        while parsed == nil {
            if !queue.isEmpty {
                switch queue.withUnsafeBytes({ HTTP1Parser.parseRequestHead($0, limits: Self.parseLimits) }) {
                case .complete(let head, let length): parsed = (head, length); continue
                case .invalid(let error):
                    let bytes = queue.prefix(min(queue.count, 512))
                    violation("invalid request head (\(error)): \(String(decoding: bytes, as: UTF8.self).debugDescription)",
                              connection: connection)
                    return nil
                case .incomplete: break
                }
            }
            guard try fill(fd, &queue, connection: connection) else {
                if !queue.isEmpty {
                    violation("connection closed inside a request head (\(queue.count) bytes)", connection: connection)
                }
                return nil
            }
        }
        let (head, headLength) = parsed!
        let headBytes = queue.prefix(headLength)
        queue.consume(headLength)

        let framing: BodyFraming
        switch head.bodyFraming() {
        case .success(let f): framing = f
        case .failure(let error):
            violation("invalid request framing (\(error)) in \(String(decoding: headBytes, as: UTF8.self).debugDescription)",
                      connection: connection)
            return nil
        }
        if sendsContinue && head.values(of: "expect").contains(where: { $0.lowercased() == "100-continue" })
            && framing != .none && framing != .contentLength(0) {
            try send(fd, Array("HTTP/1.1 100 Continue\r\n\r\n".utf8))
        }

        // The body.
        var body = BodyRecorder(limit: maxRecordedBodyBytes)
        switch framing {
        case .none, .untilClose:
            break
        case .contentLength(let length):
            var remaining = length
            while remaining > 0 {
                if queue.isEmpty {
                    guard try fill(fd, &queue, connection: connection) else {
                        violation("connection closed with \(remaining) body bytes missing", connection: connection)
                        return nil
                    }
                }
                let n = Int(min(UInt64(queue.count), remaining))
                queue.withUnsafeBytes { all in
                    let piece = UnsafeRawBufferPointer(rebasing: all[0..<n])
                    body.wire(piece)
                    body.payload(piece)
                }
                queue.consume(n)
                remaining -= UInt64(n)
            }
        case .chunked:
            var decoder = ChunkedDecoder()
            while !decoder.isComplete {
                if decoder.dataRemaining > 0 {
                    if queue.isEmpty {
                        guard try fill(fd, &queue, connection: connection) else {
                            violation("connection closed inside chunk data", connection: connection)
                            return nil
                        }
                    }
                    let n = Int(min(UInt64(queue.count), decoder.dataRemaining))
                    queue.withUnsafeBytes { all in
                        let piece = UnsafeRawBufferPointer(rebasing: all[0..<n])
                        body.wire(piece)
                        body.payload(piece)
                    }
                    queue.consume(n)
                    decoder.consumeData(n)
                    continue
                }
                let result = queue.isEmpty ? .needMore : queue.withUnsafeBytes { decoder.parseFraming($0) }
                switch result {
                case .needMore:
                    guard try fill(fd, &queue, connection: connection) else {
                        violation("connection closed inside chunk framing", connection: connection)
                        return nil
                    }
                case .framing(let length), .end(let length):
                    queue.withUnsafeBytes { body.wire(UnsafeRawBufferPointer(rebasing: $0[0..<length])) }
                    queue.consume(length)
                case .invalid(let error):
                    violation("invalid chunked body (\(error))", connection: connection)
                    return nil
                }
            }
        }

        return state.withLock { state in
            let request = RecordedRequest(
                sequence: state.requests.count, connection: connection, indexOnConnection: index,
                head: head, headBytes: headBytes, body: body.wireBytes, payload: body.payloadBytes,
                bodyTruncated: body.truncated, bodyLength: body.wireLength, payloadLength: body.payloadSum.length,
                payloadChecksum: body.payloadSum.value)
            state.requests.append(request)
            return request
        }
    }

    // MARK: answering

    private func send(_ fd: Int32, _ bytes: [UInt8]) throws {
        try bytes.withUnsafeBytes { try Socket.sendAll(fd, $0, until: .now + Self.idleTimeout) }
    }

    private func head(status: Int, reason: String?, headers: [HTTPField], framingField: HTTPField?) -> [UInt8] {
        var text = "\(responseVersion == .http10 ? "HTTP/1.0" : "HTTP/1.1") \(status) \(reason ?? HTTPStatus.phrase(status))\r\n"
        for field in headers { text += "\(field.name): \(field.value)\r\n" }
        if let framingField { text += "\(framingField.name): \(framingField.value)\r\n" }
        text += "\r\n"
        return Array(text.utf8)
    }

    private static func framingField(_ framing: OriginBodyFraming, length: UInt64, headers: [HTTPField]) -> HTTPField? {
        switch framing {
        case .contentLength:
            if headers.contains(where: { $0.name.lowercased() == "content-length" }) { return nil }
            return HTTPField(name: "Content-Length", value: String(length))
        case .chunked:
            return HTTPField(name: "Transfer-Encoding", value: "chunked")
        case .closeDelimited, .bodiless:
            return nil
        }
    }

    /// Sends the response; returns whether the connection stays open for another request.
    private func respond(_ response: OriginResponse, to request: RecordedRequest, fd: Int32) throws -> Bool {
        switch response {
        case .closeWithoutResponse:
            return false
        case .raw(let bytes, let thenClose):
            try send(fd, bytes)
            return !thenClose
        case .pieces(let pieces, let pause, let thenClose):
            for (index, piece) in pieces.enumerated() {
                try send(fd, piece)
                if index < pieces.count - 1 {
                    Thread.sleep(forTimeInterval: Double(pause.components.attoseconds) / 1e18 + Double(pause.components.seconds))
                }
                if isStopped { return false }
            }
            return !thenClose
        case .delay(let duration, let next):
            let deadline = ContinuousClock.now + duration
            while ContinuousClock.now < deadline {
                if isStopped { return false }
                Thread.sleep(forTimeInterval: 0.01)
            }
            return try respond(next, to: request, fd: fd)
        case .interim(let status, let headers, let next):
            try send(fd, head(status: status, reason: nil, headers: headers, framingField: nil))
            return try respond(next, to: request, fd: fd)
        case .respond(let status, let reason, let headers, let body, let framing):
            let field = Self.framingField(framing, length: UInt64(body.count), headers: headers)
            var out = head(status: status, reason: reason, headers: headers, framingField: field)
            switch framing {
            case .bodiless:
                break
            case .contentLength, .closeDelimited:
                out += body
            case .chunked(let size):
                var offset = 0
                while offset < body.count {
                    let n = min(max(size, 1), body.count - offset)
                    out += Array(String(n, radix: 16).utf8) + [13, 10] + body[offset..<(offset + n)] + [13, 10]
                    offset += n
                }
                out += Array("0\r\n\r\n".utf8)
            }
            try send(fd, out)
            return framing != .closeDelimited && !Self.saysClose(headers)
        case .stream(let status, let headers, let generator, let framing):
            let field = Self.framingField(framing, length: generator.length, headers: headers)
            try send(fd, head(status: status, reason: nil, headers: headers, framingField: field))
            if framing == .bodiless { return !Self.saysClose(headers) }
            let chunkSize: Int
            if case .chunked(let size) = framing { chunkSize = max(size, 1) } else { chunkSize = 256 * 1024 }
            let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: chunkSize, alignment: 8)
            defer { buffer.deallocate() }
            var offset: UInt64 = 0
            while offset < generator.length {
                if isStopped { return false }
                let n = Int(min(UInt64(chunkSize), generator.length - offset))
                let slice = UnsafeMutableRawBufferPointer(rebasing: buffer[0..<n])
                generator.write(offset: offset, into: slice)
                if case .chunked = framing { try send(fd, Array((String(n, radix: 16) + "\r\n").utf8)) }
                try Socket.sendAll(fd, UnsafeRawBufferPointer(slice), until: .now + Self.idleTimeout)
                if case .chunked = framing { try send(fd, [13, 10]) }
                offset += UInt64(n)
            }
            if case .chunked = framing { try send(fd, Array("0\r\n\r\n".utf8)) }
            return framing != .closeDelimited && !Self.saysClose(headers)
        }
    }

    private static func saysClose(_ headers: [HTTPField]) -> Bool {
        headers.contains { $0.name.lowercased() == "connection" && $0.value.lowercased().contains("close") }
    }
}

/// Collects a request body: the wire bytes and the decoded payload up to a limit, checksums always.
private struct BodyRecorder {
    let limit: Int
    var wireBytes: [UInt8] = []
    var payloadBytes: [UInt8] = []
    var wireLength: UInt64 = 0
    var payloadSum = StreamChecksum()
    var truncated = false

    init(limit: Int) { self.limit = limit }

    mutating func wire(_ bytes: UnsafeRawBufferPointer) {
        wireLength += UInt64(bytes.count)
        guard !truncated else { return }
        if wireBytes.count + bytes.count > limit {
            truncated = true
            wireBytes = []
            payloadBytes = []
            return
        }
        wireBytes.append(contentsOf: bytes)
    }

    mutating func payload(_ bytes: UnsafeRawBufferPointer) {
        payloadSum.update(bytes)
        if !truncated { payloadBytes.append(contentsOf: bytes) }
    }
}
