/// Settings and limits of one HTTP/2 connection (SPEC §17 `http2:` and `limits:`).
import DatamodeHTTP

/// What the proxy advertises and enforces on a client-facing HTTP/2 connection.
public struct HTTP2ServerConfiguration: Hashable, Sendable {
    /// `SETTINGS_MAX_CONCURRENT_STREAMS` (`http2.max-concurrent-streams`, default 100).
    public var maxConcurrentStreams: UInt32
    /// `SETTINGS_INITIAL_WINDOW_SIZE`: each stream's receive window (`http2.initial-window`, default 1 MiB). A
    /// stream's window reopens only as the engine moves its bytes on (`consumeRequestBody`).
    public var initialWindowSize: UInt32
    /// The connection's receive window, shared by all streams (default: the same as one stream's). It bounds what
    /// a client can make the proxy hold across all its streams, as long as the engine gives it back only as the bytes
    /// leave the proxy (`consumeStreamWindow` and `consumeConnectionWindow` apart).
    public var connectionWindowSize: UInt32
    /// `limits.header-section` and the field count (SPEC §6) apply to the decoded header section as HTTP/1.1 would
    /// carry it (`name: value` CRLF per field); `requestLine` bounds `:path`. Advertised as
    /// `SETTINGS_MAX_HEADER_LIST_SIZE`.
    public var headerLimits: HTTPLimits
    /// The only `:scheme` a request may carry: `https` on intercepted and transparent TLS (SPEC §17).
    public var scheme: String
    /// Budgets against floods (SPEC §17 "Limits").
    public var floods: HTTP2FloodLimits
    /// `sendResponseBody` answers "stop reading the origin" once a stream holds this many queued response bytes
    /// (SPEC §17: no stream makes the proxy buffer beyond its watermarks).
    public var responseBodyHighWatermark: Int
    /// … and `responseBodyDrained` says "read again" when it falls below this.
    public var responseBodyLowWatermark: Int

    public init(
        maxConcurrentStreams: UInt32 = 100,
        initialWindowSize: UInt32 = 1 << 20,
        connectionWindowSize: UInt32? = nil,
        headerLimits: HTTPLimits = HTTPLimits(),
        scheme: String = "https",
        floods: HTTP2FloodLimits = HTTP2FloodLimits(),
        responseBodyHighWatermark: Int = 256 * 1024,
        responseBodyLowWatermark: Int = 64 * 1024
    ) {
        self.maxConcurrentStreams = maxConcurrentStreams
        self.initialWindowSize = initialWindowSize
        self.connectionWindowSize = connectionWindowSize ?? initialWindowSize
        self.headerLimits = headerLimits
        self.scheme = scheme
        self.floods = floods
        self.responseBodyHighWatermark = responseBodyHighWatermark
        self.responseBodyLowWatermark = responseBodyLowWatermark
    }
}

/// A budget of events that do no useful work: `burst` at once, refilled at `perSecond`.
public struct HTTP2RateLimit: Hashable, Sendable {
    public var burst: Int
    public var perSecond: Int
    public init(burst: Int, perSecond: Int) {
        self.burst = burst
        self.perSecond = perSecond
    }
}

/// The flood budgets of SPEC §17. Each one exhausted ends the connection with GOAWAY `ENHANCE_YOUR_CALM`
/// (RFC 9113 §10.5: "An endpoint MAY treat activity that is suspicious as a connection error of type
/// ENHANCE_YOUR_CALM").
public struct HTTP2FloodLimits: Hashable, Sendable {
    /// Streams reset before their response completed, by the client (CVE-2023-44487) or by the proxy for a
    /// malformed or refused request (CVE-2025-8671). Every stream that completes earns one back, up to `burst`:
    /// a client that completes streams as fast as it cancels them is never cut.
    public var resets: HTTP2RateLimit
    /// PING frames (not acknowledgements).
    public var pings: HTTP2RateLimit
    /// SETTINGS frames (not acknowledgements).
    public var settings: HTTP2RateLimit
    /// DATA frames that carry no data and do not end the stream.
    public var emptyFrames: HTTP2RateLimit
    /// CONTINUATION frames after one HEADERS (CVE-2024-27316). At least enough for a header section of
    /// `headerLimits.headerSection` in 16 KiB frames is always allowed.
    public var continuations: Int
    /// A header block whose decoded size passes the header-section limit while exceeding this many times its
    /// compressed size (plus 8 KiB) is an HPACK bomb: legitimate Huffman coding and indexed names stay far below.
    public var hpackBombRatio: Int

    public init(
        resets: HTTP2RateLimit = HTTP2RateLimit(burst: 100, perSecond: 10),
        pings: HTTP2RateLimit = HTTP2RateLimit(burst: 50, perSecond: 5),
        settings: HTTP2RateLimit = HTTP2RateLimit(burst: 20, perSecond: 2),
        emptyFrames: HTTP2RateLimit = HTTP2RateLimit(burst: 100, perSecond: 10),
        continuations: Int = 8,
        hpackBombRatio: Int = 4
    ) {
        self.resets = resets
        self.pings = pings
        self.settings = settings
        self.emptyFrames = emptyFrames
        self.continuations = continuations
        self.hpackBombRatio = hpackBombRatio
    }
}

/// A token bucket in integer arithmetic: tokens in millitokens, time in nanoseconds from an injected clock, so
/// tests decide what time it is.
struct FloodBudget: Hashable, Sendable {
    let limit: HTTP2RateLimit
    private var milliTokens: Int
    private var lastRefill: UInt64

    init(_ limit: HTTP2RateLimit, now: UInt64) {
        self.limit = limit
        milliTokens = limit.burst * 1000
        lastRefill = now
    }

    /// Spends one token; false when none is left (the flood is on).
    mutating func spend(now: UInt64) -> Bool {
        refill(now: now)
        guard milliTokens >= 1000 else { return false }
        milliTokens -= 1000
        return true
    }

    /// Gives one token back for useful work, up to the burst.
    mutating func earn() {
        milliTokens = min(limit.burst * 1000, milliTokens + 1000)
    }

    private mutating func refill(now: UInt64) {
        guard now > lastRefill else { return }
        // perSecond tokens per 1e9 ns = perSecond millitokens per whole 1e6 ns; the remainder waits for the next call.
        let milliseconds = (now - lastRefill) / 1_000_000
        guard milliseconds > 0 else { return }
        lastRefill += milliseconds * 1_000_000
        let earned = milliseconds.multipliedReportingOverflow(by: UInt64(max(limit.perSecond, 0)))
        let cap = limit.burst * 1000
        milliTokens = earned.overflow || earned.partialValue >= UInt64(cap) ? cap : min(cap, milliTokens + Int(earned.partialValue))
    }
}
