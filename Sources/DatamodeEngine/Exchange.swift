import DatamodeConfig
import DatamodeHTTP
import DatamodePolicy
import DatamodeState

/// One request/response exchange on a client connection, from its head to the end of its response.
/// A class: it is updated in place on every pump, and copying it (two body relays, the head bytes) per
/// callback showed up in profiles.
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
    var bytesIn: UInt64 = 0
    var bytesOut: UInt64 = 0

    /// The forwarded head, kept until a response arrives so a stale pooled connection can be retried.
    var headBytes: [UInt8] = []
    var requestFraming: BodyFraming = .none
    /// The request's `Connection` tokens, computed once per request (keep-alive, upgrade, hop-by-hop removal).
    var connectionTokens = ConnectionOptions()
    var requestBody = BodyRelay(framing: .none)
    var upstream: UpstreamConnection?
    var upstreamReused = false
    var upgradeRequested = false
    /// The request has a body and `Expect: 100-continue`: its client waits before sending the body.
    var expectsContinue = false
    var response: ResponseHead?
    var responseBody = BodyRelay(framing: .none)
    /// The length of the relayed response head: with `responseBody.delivered`, what this response has queued
    /// towards the client (to tell whether any of it has been written yet).
    var responseHeadLength = 0
    /// The bitrate cap for manifests when this is a GET under a capped mode (SPEC §13), else nil.
    var manifestCap: UInt64?
    /// Image transcoding settings when this is a GET under a mode that transcodes (SPEC §13), else nil.
    var imageSettings: ImagesSection?
    /// The request's `Accept` has `image/webp` (read only when `imageSettings` is set).
    var acceptsWebP = false
    /// The response body being held back while it may be rewritten (SPEC §13); nil on the streaming path.
    var capture: ResponseCapture?
    /// The framing error behind a refusal found while relaying a body (for the problem's detail).
    var wireError: HTTPWireError?
    /// The exchange's lifecycle: phases, EOFs, keep-alive, upstream reuse (see `ExchangeStateMachine`).
    var machine = ExchangeStateMachine(requestComplete: true, keepAlive: true)
    /// For a CONNECT or Upgrade: the tunnel's half-close state, and its splice relays once spliced.
    var tunnel: TunnelStateMachine?
    var splices: [SpliceRelay] = []
    /// The origin is not read while what was already read of a large body drains to the client, so the rest can
    /// be spliced (`switchBodyToSpliceIfIdle`).
    var drainingForSplice = false
    /// An intercepted CONNECT was answered `200` by the proxy before any origin connection (SPEC §9): a blind relay
    /// that follows must not answer again, and a failure to reach the origin can only close the tunnel.
    var connectAnswered = false
    /// Bytes each splice relay (0: client to origin, 1: origin to client) had moved at its last report; a
    /// fixed pair, so that no array is allocated per exchange.
    var splicedBytes = SIMD2<UInt64>(0, 0)
    var logged = false
    /// The link profile's buckets this exchange passes (SPEC §10); nil: unshaped (and splice is allowed).
    var link: LinkBuckets?
    /// The latency still to add before the response head (or a tunnel's first byte) is relayed.
    var latency = AddedLatency.none
    /// The origin closed while its response head was held back for the added latency: handled on release.
    var originClosedWhileHeld = false
    /// Bit i: the exchange counts against budget i of the ledger (SPEC §11).
    var budgetMask: UInt64 = 0
    /// A `hard` budget was spent while this exchange ran: it is to be closed.
    var budgetCut = false

    init(clientVersion: HTTPVersion, method: String, url: String, startedAt: UInt64) {
        self.clientVersion = clientVersion
        self.method = method
        self.url = url
        self.startedAt = startedAt
    }
}

/// Flow-control constants: how much one connection may buffer before reading from the other side stops.
enum Flow {
    /// Above this many bytes buffered towards a peer, we stop moving more (and the read watermark on the
    /// source then stops reading from the socket). 512 KiB kept RSS at ~20 MB for a 10 MB/s client in the spike.
    static let highWater = 512 * 1024
    /// The write callback (which resumes moving) fires once the output drains to this.
    static let lowWater = 128 * 1024
    /// libevent reads at most 16 KiB per callback by default; larger reads cut callback overhead on bulk bodies.
    static let maxSingleIO = 256 * 1024
    /// Response heads from origins: more generous than request limits (Set-Cookie-heavy sites).
    static let responseLimits = HTTPLimits(requestLine: 8 * 1024, headerSection: 128 * 1024, headerCount: 300)
    static let maxResponseHeadBytes = 8 * 1024 + 128 * 1024 + 64
}
