/// HTTP/2 (SPEC §17): whether the proxy offers `h2` on intercepted TLS, and what it advertises to clients.
public struct HTTP2Section: Sendable, Equatable {
    /// `client`: offer ALPN `h2, http/1.1` on intercepted (and transparent) TLS. Default on.
    public var client: Bool
    /// `upstream`: offer `h2, http/1.1` to TLS origins and speak HTTP/2 to the ones that choose it. Default on.
    public var upstream: Bool
    /// `max-concurrent-streams`: SETTINGS_MAX_CONCURRENT_STREAMS per client connection. Default 100.
    public var maxConcurrentStreams: Int
    /// `initial-window`: the per-stream receive window the proxy advertises (and the connection's). Default 1 MiB.
    public var initialWindow: Int

    public init(client: Bool = true, upstream: Bool = true, maxConcurrentStreams: Int = 100, initialWindow: Int = 1 << 20) {
        self.client = client
        self.upstream = upstream
        self.maxConcurrentStreams = maxConcurrentStreams
        self.initialWindow = initialWindow
    }

    /// The largest window RFC 9113 §6.9.1 allows: 2^31 - 1.
    public static let maximumWindow = Int(Int32.max)
    /// The most streams one client connection may open at once; more is a flood, not a page.
    public static let maximumConcurrentStreams = 10_000
}

extension ConfigParser {
    static let http2Keys = ["client", "upstream", "max-concurrent-streams", "initial-window"]

    /// `http2: {client, upstream, max-concurrent-streams, initial-window}` (SPEC §17).
    func http2(_ node: ConfigNode) throws(ConfigError) -> HTTP2Section {
        let section = try node.section(known: Self.http2Keys)
        var http2 = HTTP2Section()
        if let value = section["client"] { http2.client = try value.bool() }
        if let value = section["upstream"] { http2.upstream = try value.bool() }
        if let value = section["max-concurrent-streams"] {
            http2.maxConcurrentStreams = try value.integer(in: 1...HTTP2Section.maximumConcurrentStreams,
                                                           what: "a number of streams from 1 to 10000")
        }
        if let value = section["initial-window"] {
            // Below 65,535 (the protocol's default) a client could not even send one default-sized frame's worth
            // without waiting; above 2^31 - 1 the protocol has no way to say it.
            guard case .scalar(let scalar) = value.node, !value.isNull, let bytes = ConfigValue.byteCount(scalar.string),
                  bytes >= 65_535, bytes <= UInt64(HTTP2Section.maximumWindow) else {
                throw value.expected("a size from 65535 bytes to 2GiB-1, such as 1MiB")
            }
            http2.initialWindow = Int(bytes)
        }
        return http2
    }
}
