import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A blocking client of the admin API on 127.0.0.1:`port`: one TCP connection per call, so a call never
/// depends on the state a previous one left behind. Every wait has a deadline (a hung admin listener fails the
/// test instead of hanging it).
public struct AdminAPIClient: Sendable {
    public var port: UInt16
    /// Sent as `Authorization: Bearer <token>` when set.
    public var token: String?
    public var timeout: Duration

    public init(port: UInt16, token: String? = nil, timeout: Duration = .seconds(10)) {
        self.port = port
        self.token = token
        self.timeout = timeout
    }

    /// Sends `method path` with `body` (sent as `application/json` unless `contentType` says otherwise) and
    /// `headers`; `authorization` replaces the bearer header (`""` = send none even when `token` is set).
    public func request(_ method: String, _ path: String, body: String? = nil, headers: [(String, String)] = [],
                        authorization: String? = nil) throws -> AdminReply {
        let client = try RawHTTPClient(port: port, timeout: timeout)
        defer { client.close() }
        var fields: [(String, String)] = [("Connection", "close")]
        if let authorization {
            if !authorization.isEmpty { fields.append(("Authorization", authorization)) }
        } else if let token {
            fields.append(("Authorization", "Bearer \(token)"))
        }
        if body != nil, !headers.contains(where: { $0.0.lowercased() == "content-type" }) {
            fields.append(("Content-Type", "application/json"))
        }
        fields += headers
        var text = "\(method) \(path) HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\n"
        for (name, value) in fields { text += "\(name): \(value)\r\n" }
        text += "Content-Length: \(body?.utf8.count ?? 0)\r\n\r\n"
        if let body { text += body }
        try client.send(text)
        return AdminReply(response: try client.readFinalResponse(method: method))
    }

    public func get(_ path: String) throws -> AdminReply { try request("GET", path) }
    public func put(_ path: String, _ body: String) throws -> AdminReply { try request("PUT", path, body: body) }
    public func delete(_ path: String) throws -> AdminReply { try request("DELETE", path) }

    /// `PUT /variants/{id}` with a JSON object built from `fields`.
    public func putVariant(_ id: String, _ fields: [String: Any]) throws -> AdminReply {
        let data = try JSONSerialization.data(withJSONObject: fields, options: [.sortedKeys, .withoutEscapingSlashes])
        return try put("/variants/\(id)", String(decoding: data, as: UTF8.self))
    }

    /// `GET /metrics`, parsed.
    public func scrape() throws -> MetricsScrape {
        let reply = try get("/metrics")
        guard reply.status == 200 else {
            throw TestSocketError.protocolError("GET /metrics answered \(reply.status): \(reply.bodyText)")
        }
        return try MetricsScrape(reply.bodyText)
    }
}
