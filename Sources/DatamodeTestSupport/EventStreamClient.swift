import Foundation

/// A client of the admin API's event stream (`GET /events`, SPEC §12) for tests: sends the request, checks the
/// head, then reads the chunked `text/event-stream` one event (or heartbeat comment) at a time, each wait bounded
/// by the connection's timeout.
public final class EventStreamClient: @unchecked Sendable {
    /// One event: `event:`, `id:` and its `data:` line; or a comment (`type` "comment", the text in `data`).
    public struct Event: Sendable, Equatable {
        public var type: String
        public var id: Int?
        public var data: String
        /// `data` parsed as a JSON object.
        public var object: [String: Any] {
            (try? JSONSerialization.jsonObject(with: Data(data.utf8))) as? [String: Any] ?? [:]
        }
    }

    public let connection: RawHTTPClient
    /// The stream's response head as text.
    public private(set) var headText = ""
    private var text: [UInt8] = []

    /// Opens `GET path` (e.g. `/events?session=S`) on the admin port; throws unless the answer is `200`.
    public init(port: UInt16, path: String = "/events", token: String? = nil, timeout: Duration = .seconds(10),
                receiveBuffer: Int32? = nil) throws {
        connection = try RawHTTPClient(port: port, timeout: timeout, receiveBuffer: receiveBuffer)
        var request = "GET \(path) HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\nAccept: text/event-stream\r\n"
        if let token { request += "Authorization: Bearer \(token)\r\n" }
        try connection.send(request + "\r\n")
        while !headText.hasSuffix("\r\n\r\n") { headText += String(decoding: try connection.read(exactly: 1), as: UTF8.self) }
        guard headText.hasPrefix("HTTP/1.1 200") else {
            throw TestSocketError.protocolError("GET \(path) answered: \(headText)")
        }
    }

    public func close() { connection.close() }

    /// The next event or comment.
    public func next() throws -> Event {
        while true {
            if let end = text.firstRange(of: Array("\n\n".utf8)) {
                let block = String(decoding: text[..<end.lowerBound], as: UTF8.self)
                text.removeSubrange(..<end.upperBound)
                var event = Event(type: "comment", id: nil, data: "")
                for line in block.split(separator: "\n") {
                    if line.hasPrefix(":") { event.data = String(line.dropFirst()).trimmingCharacters(in: .whitespaces) }
                    if line.hasPrefix("event: ") { event.type = String(line.dropFirst(7)) }
                    if line.hasPrefix("id: ") { event.id = Int(line.dropFirst(4)) }
                    if line.hasPrefix("data: ") { event.data = String(line.dropFirst(6)) }
                }
                return event
            }
            try readChunk()
        }
    }

    /// The next event of `type`, skipping others (heartbeats included).
    public func next(_ type: String) throws -> Event {
        while true {
            let event = try next()
            if event.type == type { return event }
        }
    }

    private func readChunk() throws {
        // Bytes, not String: "\r\n" is one Character to Swift.
        var bytes: [UInt8] = []
        while bytes.count < 2 || Array(bytes.suffix(2)) != [13, 10] { bytes += try connection.read(exactly: 1) }
        let line = String(decoding: bytes.dropLast(2), as: UTF8.self)
        guard let size = Int(line.split(separator: ";").first ?? "", radix: 16) else {
            throw TestSocketError.protocolError("bad chunk size line \(line.debugDescription)")
        }
        guard size > 0 else { throw TestSocketError.closed("the event stream ended") }
        text += try connection.read(exactly: size)
        _ = try connection.read(exactly: 2)
    }
}
