/// What the policy needs to know about one request head, extracted by the engine (SPEC §3–5).
///
/// Plain values, so the policy stays a pure function testable without sockets.
public struct RequestFacts: Sendable {
    /// The method as sent (`GET`, `CONNECT`); rules compare it exactly (RFC 9110 §9.1: methods are case-sensitive).
    public var method: String
    /// The absolute URL, normalized by the engine: lowercase scheme and host, default port omitted, path and
    /// query as sent (`http://cdn.example/img/a.jpg?x=1`). For `CONNECT`, `host:port`.
    public var url: String
    /// The target host, lowercased, without port; an IPv6 literal without brackets.
    public var host: String
    public var port: Int
    /// Path and query as sent (`/img/a.jpg?x=1`); `""` for `CONNECT`.
    public var path: String
    public var isConnect: Bool
    /// The client's address, when known (rule `client` criteria never match without one).
    public var client: IPAddress?
    /// The request's header fields as received, in order, duplicates kept.
    public var fields: [(name: String, value: String)]

    public init(method: String, url: String, host: String, port: Int, path: String, isConnect: Bool = false,
                client: IPAddress? = nil, fields: [(name: String, value: String)] = []) {
        self.method = method
        self.url = url
        self.host = host
        self.port = port
        self.path = path
        self.isConnect = isConnect
        self.client = client
        self.fields = fields
    }
}
