import DatamodeConfig
import DatamodeHTTP
import DatamodePolicy
import DatamodeState

/// What is recorded of one request/response exchange: what its access log line, its metrics and its session's
/// tally say (SPEC §8). Its `ExchangeDriver` fills it in as the exchange goes; the worker records it once, when
/// it ends.
final class Exchange {
    let clientVersion: HTTPVersion
    let method: String
    var url: String
    let startedAt: UInt64
    var outcome: Outcome?
    /// The SPEC error code behind a rejection or an error.
    var reason: String?
    var variant: String?
    /// The mode the request is judged by: its session's, else the global one, with the conditions of the spent
    /// budgets that match it (SPEC §11).
    var mode: DataMode = .normal
    /// The session the request belongs to (SPEC §12), counted in its tally.
    var session: SessionMembership?
    /// The resolved tags (nil when the request never got that far), where each came from, and the rule behind
    /// them (SPEC §8: a log line says why).
    var tags: RequestTags?
    var tagSources = TagProvenance()
    var rule: String?
    var status: Int = 0
    /// How the request came (SPEC §16's log field `source`).
    var source: ExchangeSource = .proxy
    /// How long the request was held before it was let through (SPEC §18.2: `Data-Mode-Held`); nil if it was not.
    var heldMilliseconds: Int64?
    var bytesIn: UInt64 = 0
    var bytesOut: UInt64 = 0

    /// The tunnel's bytes were counted while they flowed (a tunnel may live for hours; the counter must move with
    /// it): the record at its end must not count them again.
    var bytesCountedWhileFlowing = false
    var logged = false
    /// The request came on an HTTP/2 stream (SPEC §17); the head the engine read is its HTTP/1.1 translation.
    var overHTTP2 = false

    /// The access log's `proto`: how the client spoke, as ALPN names it (`h2`, `http/1.1`, `http/1.0`).
    var protocolName: String {
        if overHTTP2 { return "h2" }
        return clientVersion == .http10 ? "http/1.0" : "http/1.1"
    }

    /// A refused request's `reasons` (SPEC §20 `GET /refusals`, as in the problem of SPEC §15): every condition
    /// of its mode its tags do not allow, when a condition refused it; else its error code alone.
    var refusalReasons: [String] {
        let code = reason ?? Outcome.rejected.rawValue
        guard let tags, DataCondition(rawValue: code) != nil else { return [code] }
        var reasons: [String] = []
        if mode.contains(.constrained) && !tags.allowConstrained { reasons.append(DataCondition.constrained.rawValue) }
        if mode.contains(.expensive) && !tags.allowExpensive { reasons.append(DataCondition.expensive.rawValue) }
        if mode.contains(.ultraConstrained) && !tags.allowUltraConstrained {
            reasons.append(DataCondition.ultraConstrained.rawValue)
        }
        return reasons.isEmpty ? [code] : reasons
    }

    init(clientVersion: HTTPVersion, method: String, url: String, startedAt: UInt64) {
        self.clientVersion = clientVersion
        self.method = method
        self.url = url
        self.startedAt = startedAt
    }
}

/// How a request came to the proxy: the access log's `source` (SPEC §16).
enum ExchangeSource: String {
    /// The proxy port: absolute-form requests and CONNECT.
    case proxy
    /// Inside a CONNECT tunnel the proxy terminated (SPEC §9).
    case intercepted
    /// Through the transparent listener, intercepted or not.
    case transparent
}

/// Flow-control constants: how much one connection may buffer before reading from the other side stops.
enum Flow {
    /// Above this many bytes buffered towards a peer, we stop moving more (and the read watermark on the
    /// source then stops reading from the socket). 512 KiB kept RSS at ~20 MB for a 10 MB/s client in the spike.
    static let highWater = 512 * 1024
    /// The write callback (which resumes moving) fires once the output drains to this.
    static let lowWater = 128 * 1024
    /// What an HTTP/2 stream's exchange buffers at each step of its answer (its output, its upstream's input): one
    /// client connection carries up to `max-concurrent-streams` of them, and each answer may wait for as long as the
    /// client leaves its stream unread, so a stream keeps little at each step; its answer waits for the client in
    /// the codec's queue (`HTTP2ServerConfiguration.responseBodyHighWatermark`). Session 18's outside test: at
    /// `highWater` a step, 100 unread streams on two connections held 629 MB.
    static let streamHighWater = 64 * 1024
    /// A stream's exchange may write more once its output drains to this.
    static let streamLowWater = 16 * 1024
    /// libevent reads at most 16 KiB per callback by default; larger reads cut callback overhead on bulk bodies.
    static let maxSingleIO = 256 * 1024
    /// Response heads from origins: more generous than request limits (Set-Cookie-heavy sites).
    static let responseLimits = HTTPLimits(requestLine: 8 * 1024, headerSection: 128 * 1024, headerCount: 300)
    static let maxResponseHeadBytes = 8 * 1024 + 128 * 1024 + 64
    /// What an HTTP/2 stream reads back from its own exchange: an origin's head within `responseLimits` and the fields
    /// the proxy adds relaying it (`Via`, `Data-Mode-Variant`, `Data-Mode-Held`, `Cache-Control`, `Connection`, the
    /// framing), so that a head relayed whole to an HTTP/1.1 client reaches an h2 client whole too.
    static let relayedResponseLimits = HTTPLimits(requestLine: 8 * 1024, headerSection: 132 * 1024, headerCount: 308)
    static let maxRelayedResponseHeadBytes = 8 * 1024 + 132 * 1024 + 64
}
