/// An admin API request, as plain Swift values (no C type leaves the engine).
public struct AdminRequest: Sendable {
    public var method: String
    /// The path, percent-decoding left to the router; without the query.
    public var path: String
    public var query: String?
    /// Header names lowercased.
    public var headers: [String: String]
    public var body: [UInt8]
    public init(method: String, path: String, query: String? = nil, headers: [String: String] = [:], body: [UInt8] = []) {
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers
        self.body = body
    }
}

public struct AdminResponse: Sendable {
    public var status: Int
    public var headers: [(String, String)]
    public var body: [UInt8]
    /// Set for an event stream (SPEC §12 `GET /events`): the reply stays open after `body`, and every event
    /// published for `stream.scope` (all of them when nil) is appended to it.
    public var stream: AdminStream?
    public init(status: Int, headers: [(String, String)] = [], body: [UInt8] = [], stream: AdminStream? = nil) {
        self.status = status
        self.headers = headers
        self.body = body
        self.stream = stream
    }
}

/// An open event stream's filter.
public struct AdminStream: Sendable {
    /// Only events of this scope (a session id, or `global`); nil = every event.
    public var scope: String?
    public init(scope: String?) { self.scope = scope }
}
