import ArgumentParser
import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// Options shared by the commands that talk to a running proxy's admin API.
struct AdminOptions: ParsableArguments {
    @Option(name: .long, help: "Admin API address (default: DATAMODE_ADMIN_LISTEN or 127.0.0.1:8878).")
    var admin: String?

    @Option(name: .long, help: "Bearer token (default: DATAMODE_ADMIN_TOKEN).")
    var token: String?

    @Flag(name: .long, help: "Print the admin API's JSON (the default when stdout is not a terminal; NO_COLOR turns off colour).")
    var json = false

    /// Tables for a person at a terminal, JSON otherwise (SPEC §20).
    var style: OutputStyle { OutputStyle.current(json: json) }

    var client: AdminClient {
        let env = ProcessInfo.processInfo.environment
        let address = admin ?? env["DATAMODE_ADMIN_LISTEN"].flatMap { $0.isEmpty ? nil : $0 } ?? "127.0.0.1:8878"
        return AdminClient(address: address, token: token ?? env["DATAMODE_ADMIN_TOKEN"].flatMap { $0.isEmpty ? nil : $0 })
    }
}

/// A minimal blocking HTTP/1.1 client for the admin API (one request per connection, `Connection: close`).
struct AdminClient {
    var address: String
    var token: String?

    struct Response {
        var status: Int
        var body: String
    }

    struct Failure: Error, CustomStringConvertible {
        var description: String
    }

    func request(_ method: String, _ path: String, json: Any? = nil) throws -> Response {
        let (host, port) = try split(address)
        var body = Data()
        if let json { body = try JSONSerialization.data(withJSONObject: json, options: [.sortedKeys]) }
        var head = "\(method) \(path) HTTP/1.1\r\nHost: \(address)\r\nConnection: close\r\nAccept: application/json\r\n"
        if let token { head += "Authorization: Bearer \(token)\r\n" }
        if json != nil { head += "Content-Type: application/json\r\n" }
        head += "Content-Length: \(body.count)\r\n\r\n"
        let fd = try connect(host: host, port: port)
        defer { close(fd) }
        let bytes = Array(head.utf8) + Array(body)
        var sent = 0
        while sent < bytes.count {
            let n = bytes.withUnsafeBytes { send(fd, $0.baseAddress! + sent, bytes.count - sent, Int32(MSG_NOSIGNAL)) }
            guard n > 0 else { throw Failure(description: "cannot send to the admin API at \(address)") }
            sent += n
        }
        var received: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = recv(fd, &buffer, buffer.count, 0)
            if n <= 0 { break }
            received.append(contentsOf: buffer[0..<n])
        }
        let text = String(decoding: received, as: UTF8.self)
        guard let headEnd = text.range(of: "\r\n\r\n"), text.hasPrefix("HTTP/1."),
              let status = Int(text.dropFirst(9).prefix(3)) else {
            throw Failure(description: "the admin API at \(address) sent no valid HTTP response")
        }
        var bodyText = String(text[headEnd.upperBound...])
        if text[..<headEnd.lowerBound].lowercased().contains("transfer-encoding: chunked") {
            bodyText = Self.dechunk(bodyText)
        }
        return Response(status: status, body: bodyText)
    }

    /// Follows an event stream (`text/event-stream`, chunked): calls `event` with each event's type and data
    /// line until the proxy closes the stream. Comments (heartbeats) are skipped. No receive timeout: a stream is
    /// idle by design.
    func follow(_ path: String, event: (String, String) -> Void) throws {
        let (host, port) = try split(address)
        var head = "GET \(path) HTTP/1.1\r\nHost: \(address)\r\nAccept: text/event-stream\r\n"
        if let token { head += "Authorization: Bearer \(token)\r\n" }
        head += "\r\n"
        let fd = try connect(host: host, port: port)
        defer { close(fd) }
        var noTimeout = timeval(tv_sec: 0, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &noTimeout, socklen_t(MemoryLayout<timeval>.size))
        let bytes = Array(head.utf8)
        guard bytes.withUnsafeBytes({ send(fd, $0.baseAddress!, bytes.count, Int32(MSG_NOSIGNAL)) }) == bytes.count else {
            throw Failure(description: "cannot send to the admin API at \(address)")
        }
        var raw: [UInt8] = []
        var headDone = false
        var chunked = false
        var text: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 16384)
        while true {
            let n = recv(fd, &buffer, buffer.count, 0)
            if n <= 0 { return }
            raw.append(contentsOf: buffer[0..<n])
            if !headDone {
                guard let end = raw.firstRange(of: Array("\r\n\r\n".utf8)) else { continue }
                let headText = String(decoding: raw[..<end.lowerBound], as: UTF8.self)
                guard headText.hasPrefix("HTTP/1."), let status = Int(headText.dropFirst(9).prefix(3)) else {
                    throw Failure(description: "the admin API at \(address) sent no valid HTTP response")
                }
                raw.removeSubrange(..<end.upperBound)
                if status != 200 {
                    throw Failure(description: "admin API answered \(status): \(String(decoding: raw, as: UTF8.self))")
                }
                chunked = headText.lowercased().contains("transfer-encoding: chunked")
                headDone = true
            }
            if chunked {
                // Whole chunks only: size line, data, CRLF.
                while let lineEnd = raw.firstRange(of: Array("\r\n".utf8)) {
                    let sizeText = String(decoding: raw[..<lineEnd.lowerBound], as: UTF8.self).split(separator: ";").first ?? ""
                    guard let size = Int(sizeText, radix: 16) else { throw Failure(description: "bad chunk from the admin API") }
                    if size == 0 { return }
                    guard raw.count >= lineEnd.upperBound + size + 2 else { break }
                    text.append(contentsOf: raw[lineEnd.upperBound..<(lineEnd.upperBound + size)])
                    raw.removeSubrange(..<(lineEnd.upperBound + size + 2))
                }
            } else {
                text.append(contentsOf: raw)
                raw.removeAll()
            }
            while let end = text.firstRange(of: Array("\n\n".utf8)) {
                let block = String(decoding: text[..<end.lowerBound], as: UTF8.self)
                text.removeSubrange(..<end.upperBound)
                var type = "message"
                var data: [String] = []
                for line in block.split(separator: "\n", omittingEmptySubsequences: false) {
                    if line.hasPrefix("event:") { type = line.dropFirst(6).trimmingCharacters(in: .whitespaces) }
                    if line.hasPrefix("data:") { data.append(String(line.dropFirst(5)).trimmingCharacters(in: .whitespaces)) }
                }
                if !data.isEmpty { event(type, data.joined(separator: "\n")) }
            }
        }
    }

    private static func dechunk(_ text: String) -> String {
        var out = ""
        var rest = Substring(text)
        while let lineEnd = rest.range(of: "\r\n"), let size = Int(rest[..<lineEnd.lowerBound].split(separator: ";").first ?? "", radix: 16), size > 0 {
            let start = lineEnd.upperBound
            let utf8 = rest.utf8
            guard let end = utf8.index(start, offsetBy: size, limitedBy: utf8.endIndex) else { break }
            out += String(rest[start..<end])
            rest = rest[end...].dropFirst(2)
        }
        return out
    }

    private func split(_ address: String) throws -> (String, UInt16) {
        guard let colon = address.lastIndex(of: ":"), let port = UInt16(address[address.index(after: colon)...]) else {
            throw Failure(description: "admin address \"\(address)\" is not host:port")
        }
        var host = String(address[..<colon])
        if host.hasPrefix("[") && host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        return (host, port)
    }

    private func connect(host: String, port: UInt16) throws -> Int32 {
        var hints = addrinfo()
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        var result: UnsafeMutablePointer<addrinfo>?
        guard getaddrinfo(host, String(port), &hints, &result) == 0, let info = result else {
            throw Failure(description: "cannot resolve admin host \(host)")
        }
        defer { freeaddrinfo(result) }
        let fd = socket(info.pointee.ai_family, info.pointee.ai_socktype, info.pointee.ai_protocol)
        guard fd >= 0 else { throw Failure(description: "socket() failed") }
        var timeout = timeval(tv_sec: 10, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        guard Glibc.connect(fd, info.pointee.ai_addr, info.pointee.ai_addrlen) == 0 else {
            let reason = String(cString: strerror(errno))
            close(fd)
            throw Failure(description: "cannot reach the admin API at \(address) (\(reason)): is datamode-proxy running? (--admin / DATAMODE_ADMIN_LISTEN)")
        }
        return fd
    }

    /// Prints the body; non-2xx responses become an error carrying the server's problem detail.
    func check(_ response: Response) throws -> String {
        guard (200..<300).contains(response.status) else {
            let detail = (try? JSONSerialization.jsonObject(with: Data(response.body.utf8)) as? [String: Any])?["detail"] as? String
            throw Failure(description: "admin API answered \(response.status): \(detail ?? response.body)")
        }
        return response.body
    }
}

/// A failure at run time (the proxy is unreachable, the API refused): printed as `Error: …` with exit code 1,
/// not as a usage error (exit 64 with the usage text), which would suggest the command line was wrong.
struct CommandFailure: Error, CustomStringConvertible {
    var description: String
    init(_ error: any Error) { description = "\(error)" }
    init(_ message: String) { description = message }
}
