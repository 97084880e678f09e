// Linux only: on Apple platforms URLSession honours `connectionProxyDictionary` and this file compiles to nothing.
#if !canImport(Darwin)
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
#if canImport(Glibc)
import Glibc
private let systemSocket = Glibc.socket
private let systemConnect = Glibc.connect
private let systemSend = Glibc.send
private let streamType = Int32(SOCK_STREAM.rawValue)
#elseif canImport(Musl)
import Musl
private let systemSocket = Musl.socket
private let systemConnect = Musl.connect
private let systemSend = Musl.send
private let streamType = Int32(SOCK_STREAM)
#endif

/// One `http://` request sent to the proxy in absolute form over a socket of its own, and its response streamed
/// back, for the platform whose URLSession cannot be told to use a proxy (swift-corelibs-foundation ignores
/// `connectionProxyDictionary`; only libcurl's `http_proxy` environment variable would reach it, process-wide).
/// HTTP/1.1 with `Connection: close`; the response body is delimited by `Content-Length`, chunks or the close.
final class ProxyExchange: @unchecked Sendable {
    enum Failure: Error { case connect(String), protocolError(String) }

    struct Head {
        var status: Int
        var fields: [(String, String)]
        func value(_ name: String) -> String? { fields.first { $0.0.caseInsensitiveCompare(name) == .orderedSame }?.1 }
    }

    private let request: URLRequest
    private let host: String
    private let port: Int
    private let lock = NSLock()
    private var fd: Int32 = -1
    private var cancelled = false

    init(request: URLRequest, proxyHost: String, proxyPort: Int) {
        self.request = request
        self.host = proxyHost
        self.port = proxyPort
    }

    /// Stops the exchange from any thread: the socket is shut down, so a blocked read returns.
    func cancel() {
        lock.lock()
        cancelled = true
        if fd >= 0 { _ = shutdown(fd, Int32(SHUT_RDWR)) }
        lock.unlock()
    }

    /// Runs the exchange on the calling thread: `head` once, then `body` for each piece. Throws on failure.
    func run(head: (Head) -> Void, body: (Data) -> Void) throws {
        let socket = try connect()
        defer {
            lock.lock(); fd = -1; lock.unlock()
            close(socket)
        }
        try send(socket, requestBytes())
        var buffer = Data()
        var parsed: Head?
        var headEnd = 0
        while parsed == nil {
            guard let chunk = try receive(socket) else { throw Failure.protocolError("the proxy closed before a response head") }
            buffer.append(chunk)
            if let range = buffer.range(of: Data("\r\n\r\n".utf8)) {
                headEnd = range.upperBound - buffer.startIndex
                parsed = try Self.parseHead(buffer[buffer.startIndex..<range.lowerBound])
            } else if buffer.count > 64 << 10 {
                throw Failure.protocolError("a response head over 64 KiB")
            }
        }
        let responseHead = parsed!
        head(responseHead)
        var rest = Data(buffer.dropFirst(headEnd))
        let method = (request.httpMethod ?? "GET").uppercased()
        if method == "HEAD" || responseHead.status == 204 || responseHead.status == 304 { return }
        if responseHead.value("Transfer-Encoding")?.lowercased().contains("chunked") == true {
            var decoder = ChunkDecoder()
            while true {
                if !rest.isEmpty {
                    let (out, done) = try decoder.feed(rest)
                    rest = Data()
                    if !out.isEmpty { body(out) }
                    if done { return }
                }
                guard let chunk = try receive(socket) else { throw Failure.protocolError("the body ended inside a chunk") }
                rest = chunk
            }
        }
        var remaining = responseHead.value("Content-Length").flatMap { Int($0.trimmingCharacters(in: .whitespaces)) }
        while true {
            if !rest.isEmpty {
                let piece = remaining.map { rest.prefix($0) } ?? rest
                body(Data(piece))
                if let left = remaining { remaining = left - piece.count }
                rest = Data()
            }
            if remaining == 0 { return }
            guard let chunk = try receive(socket) else {
                if remaining != nil { throw Failure.protocolError("the body ended before its Content-Length") }
                return
            }
            rest = chunk
        }
    }

    private func requestBytes() -> [UInt8] {
        let url = request.url!
        var authority = url.host ?? ""
        if authority.contains(":") { authority = "[\(authority)]" }
        if let port = url.port { authority += ":\(port)" }
        var text = "\(request.httpMethod ?? "GET") \(url.absoluteString) HTTP/1.1\r\nHost: \(authority)\r\n"
        for (name, value) in request.allHTTPHeaderFields ?? [:] {
            let lower = name.lowercased()
            if ["host", "connection", "content-length", "transfer-encoding", "proxy-connection"].contains(lower) { continue }
            text += "\(name): \(value)\r\n"
        }
        let payload = request.httpBody ?? Data()
        if !payload.isEmpty || ["POST", "PUT", "PATCH"].contains((request.httpMethod ?? "GET").uppercased()) {
            text += "Content-Length: \(payload.count)\r\n"
        }
        text += "Connection: close\r\n\r\n"
        return Array(text.utf8) + Array(payload)
    }

    static func parseHead(_ bytes: Data) throws -> Head {
        let text = String(decoding: bytes, as: UTF8.self)
        var lines = text.components(separatedBy: "\r\n")
        let statusLine = lines.removeFirst()
        let parts = statusLine.split(separator: " ", maxSplits: 2)
        guard parts.count >= 2, parts[0].hasPrefix("HTTP/1."), let status = Int(parts[1]) else {
            throw Failure.protocolError("not an HTTP/1.x status line: \(statusLine)")
        }
        var fields: [(String, String)] = []
        for line in lines {
            guard let colon = line.firstIndex(of: ":") else { throw Failure.protocolError("a header line without ':'") }
            fields.append((String(line[..<colon]), line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)))
        }
        return Head(status: status, fields: fields)
    }

    private func connect() throws -> Int32 {
        var hints = addrinfo()
        hints.ai_socktype = streamType
        var result: UnsafeMutablePointer<addrinfo>?
        guard getaddrinfo(host, String(port), &hints, &result) == 0, let info = result else {
            throw Failure.connect("cannot resolve the proxy host \(host)")
        }
        defer { freeaddrinfo(result) }
        let socket = systemSocket(info.pointee.ai_family, info.pointee.ai_socktype, info.pointee.ai_protocol)
        guard socket >= 0 else { throw Failure.connect("socket() failed") }
        var timeout = timeval(tv_sec: Int(max(1, request.timeoutInterval)), tv_usec: 0)
        setsockopt(socket, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        guard systemConnect(socket, info.pointee.ai_addr, info.pointee.ai_addrlen) == 0 else {
            let reason = String(cString: strerror(errno))
            close(socket)
            throw Failure.connect("cannot reach the proxy at \(host):\(port): \(reason)")
        }
        lock.lock()
        defer { lock.unlock() }
        if cancelled {
            close(socket)
            throw CancellationError()
        }
        fd = socket
        return socket
    }

    private func send(_ socket: Int32, _ bytes: [UInt8]) throws {
        var sent = 0
        while sent < bytes.count {
            let n = bytes.withUnsafeBytes { systemSend(socket, $0.baseAddress! + sent, bytes.count - sent, Int32(MSG_NOSIGNAL)) }
            guard n > 0 else { throw Failure.connect("the proxy closed the connection while the request was sent") }
            sent += n
        }
    }

    /// The next bytes, or nil at the end of the stream.
    private func receive(_ socket: Int32) throws -> Data? {
        var buffer = [UInt8](repeating: 0, count: 65536)
        let n = recv(socket, &buffer, buffer.count, 0)
        if n == 0 { return nil }
        if n < 0 {
            lock.lock(); let stopped = cancelled; lock.unlock()
            if stopped { throw CancellationError() }
            throw Failure.protocolError("reading from the proxy failed: \(String(cString: strerror(errno)))")
        }
        return Data(buffer[0..<n])
    }
}

/// Incremental `Transfer-Encoding: chunked` decoding (RFC 9112 §7.1), bounded: a size line over 1 KiB is refused.
struct ChunkDecoder {
    private var pending = Data()
    private var remaining = 0
    private var state = State.size
    enum State { case size, data, dataEnd, trailers }

    /// Decodes what `input` completes; returns the payload and whether the body ended.
    mutating func feed(_ input: Data) throws -> (Data, Bool) {
        pending.append(input)
        var out = Data()
        while true {
            switch state {
            case .size:
                guard let end = pending.range(of: Data("\r\n".utf8)) else {
                    if pending.count > 1024 { throw ProxyExchange.Failure.protocolError("a chunk size line over 1 KiB") }
                    return (out, false)
                }
                let line = String(decoding: pending[pending.startIndex..<end.lowerBound], as: UTF8.self)
                pending = Data(pending[end.upperBound...])
                guard let size = Int(line.split(separator: ";").first.map(String.init)?.trimmingCharacters(in: .whitespaces) ?? "", radix: 16),
                      size >= 0 else { throw ProxyExchange.Failure.protocolError("a bad chunk size: \(line)") }
                if size == 0 { state = .trailers } else { remaining = size; state = .data }
            case .data:
                guard !pending.isEmpty else { return (out, false) }
                let piece = pending.prefix(remaining)
                out.append(piece)
                remaining -= piece.count
                pending = Data(pending.dropFirst(piece.count))
                if remaining == 0 { state = .dataEnd }
            case .dataEnd:
                guard pending.count >= 2 else { return (out, false) }
                pending = Data(pending.dropFirst(2))
                state = .size
            case .trailers:
                guard let end = pending.range(of: Data("\r\n".utf8)) else { return (out, false) }
                let empty = end.lowerBound == pending.startIndex
                pending = Data(pending[end.upperBound...])
                if empty { return (out, true) }
            }
        }
    }
}
#endif
