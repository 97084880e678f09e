import DatamodeHTTP
import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// One answer of the admin API, with its body decoded as JSON where it is JSON.
public struct AdminReply: Sendable {
    public let response: ParsedResponse

    public var status: Int { response.status }
    public var bodyText: String { response.bodyText }
    public func value(of name: String) -> String? { response.value(of: name) }
    public func values(of name: String) -> [String] { response.values(of: name) }
    /// The media type of `Content-Type` (parameters dropped, lowercased).
    public var mediaType: String? {
        response.value(of: "Content-Type").map {
            String($0.split(separator: ";").first ?? "").trimmingCharacters(in: .whitespaces).lowercased()
        }
    }

    /// The body parsed as JSON, or nil when it is not JSON.
    public var json: Any? { try? JSONSerialization.jsonObject(with: Data(response.body), options: [.fragmentsAllowed]) }
    /// The body as a JSON object (empty when it is not one).
    public var object: [String: Any] { json as? [String: Any] ?? [:] }
    /// The body as a JSON array of objects (nil when it is not one).
    public var array: [[String: Any]]? { json as? [[String: Any]] }
    /// The `error` member of a problem document.
    public var errorCode: String? { object["error"] as? String }
}

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

/// A Prometheus text exposition (format 0.0.4) read strictly enough for tests: every sample line must be
/// `name{labels} value`, every `# TYPE` line is kept, and a series appearing twice is an error.
public struct MetricsScrape: Sendable {
    /// Value of each series, keyed by its canonical text: `name` or `name{a="x",b="y"}` with labels sorted.
    public private(set) var samples: [String: Double] = [:]
    /// `# TYPE` of each metric family.
    public private(set) var types: [String: String] = [:]
    public let text: String

    public init(_ text: String) throws {
        self.text = text
        for rawLine in text.split(separator: "\n", omittingEmptySubsequences: true) {
            let line = rawLine.trimmingCharacters(in: .whitespaces)
            if line.isEmpty { continue }
            if line.hasPrefix("#") {
                let parts = line.split(separator: " ", maxSplits: 3).map(String.init)
                if parts.count >= 4 && parts[1] == "TYPE" { types[parts[2]] = parts[3] }
                continue
            }
            guard let space = line.lastIndex(of: " "), let value = Double(line[line.index(after: space)...]) else {
                throw TestSocketError.protocolError("metrics line without a value: \(line)")
            }
            let series = try Self.canonical(String(line[..<space]).trimmingCharacters(in: .whitespaces))
            guard samples[series] == nil else { throw TestSocketError.protocolError("series twice: \(series)") }
            samples[series] = value
        }
    }

    /// `name{b="2",a="1"}` -> `name{a="1",b="2"}`.
    static func canonical(_ series: String) throws -> String {
        guard let open = series.firstIndex(of: "{") else { return series }
        guard series.hasSuffix("}") else { throw TestSocketError.protocolError("bad series: \(series)") }
        let name = series[..<open]
        let inner = series[series.index(after: open)..<series.index(before: series.endIndex)]
        var labels: [(String, String)] = []
        var rest = Substring(inner)
        while !rest.isEmpty {
            guard let equals = rest.firstIndex(of: "="), rest[rest.index(after: equals)...].hasPrefix("\"") else {
                throw TestSocketError.protocolError("bad labels: \(series)")
            }
            let key = String(rest[..<equals])
            var index = rest.index(equals, offsetBy: 2)
            var value = ""
            while index < rest.endIndex && rest[index] != "\"" {
                if rest[index] == "\\" { index = rest.index(after: index) }
                guard index < rest.endIndex else { break }
                value.append(rest[index])
                index = rest.index(after: index)
            }
            guard index < rest.endIndex else { throw TestSocketError.protocolError("unterminated label: \(series)") }
            labels.append((key, value))
            rest = rest[rest.index(after: index)...]
            if rest.hasPrefix(",") { rest = rest.dropFirst() }
        }
        labels.sort { $0.0 < $1.0 }
        return name + "{" + labels.map { "\($0.0)=\"\($0.1)\"" }.joined(separator: ",") + "}"
    }

    /// The value of `name` with exactly these labels, or nil when the series is absent.
    public func value(_ name: String, _ labels: [String: String] = [:]) -> Double? {
        if labels.isEmpty { return samples[name] }
        let key = name + "{" + labels.sorted { $0.key < $1.key }.map { "\($0.key)=\"\($0.value)\"" }.joined(separator: ",") + "}"
        return samples[key]
    }

    /// `value`, with an absent series read as 0 (a counter that has not moved yet may be omitted).
    public func counter(_ name: String, _ labels: [String: String] = [:]) -> Double {
        value(name, labels) ?? 0
    }

    /// The `le` bounds and cumulative counts of histogram `name`, in the order of increasing bound.
    public func buckets(_ name: String) -> [(le: Double, count: Double)] {
        let prefix = name + "_bucket{le=\""
        return samples.compactMap { key, value -> (Double, Double)? in
            guard key.hasPrefix(prefix), key.hasSuffix("\"}") else { return nil }
            let bound = key.dropFirst(prefix.count).dropLast(2)
            let le = bound == "+Inf" ? Double.infinity : Double(bound)
            return le.map { ($0, value) }
        }.sorted { $0.0 < $1.0 }
    }
}
