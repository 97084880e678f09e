/// Value types of the HTTP/2 codec (RFC 9113, SPEC §17): what the engine hands in and what it gets back.
///
/// No C type appears here: `CNghttp2` stays inside this module (STYLE: one module owns each C boundary), so the
/// engine drives an HTTP/2 connection with Swift values only and can be tested without nghttp2 in its API.
import DatamodeHTTP

/// A stream identifier (RFC 9113 §5.1.1). Streams a client opens are odd.
public typealias HTTP2StreamID = Int32

/// An HTTP/2 error code (RFC 9113 §7), as carried by RST_STREAM and GOAWAY.
public struct HTTP2ErrorCode: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public var rawValue: UInt32
    public init(rawValue: UInt32) { self.rawValue = rawValue }

    public static let noError = HTTP2ErrorCode(rawValue: 0x0)
    public static let protocolError = HTTP2ErrorCode(rawValue: 0x1)
    public static let internalError = HTTP2ErrorCode(rawValue: 0x2)
    public static let flowControlError = HTTP2ErrorCode(rawValue: 0x3)
    public static let settingsTimeout = HTTP2ErrorCode(rawValue: 0x4)
    public static let streamClosed = HTTP2ErrorCode(rawValue: 0x5)
    public static let frameSizeError = HTTP2ErrorCode(rawValue: 0x6)
    public static let refusedStream = HTTP2ErrorCode(rawValue: 0x7)
    public static let cancel = HTTP2ErrorCode(rawValue: 0x8)
    public static let compressionError = HTTP2ErrorCode(rawValue: 0x9)
    public static let connectError = HTTP2ErrorCode(rawValue: 0xa)
    public static let enhanceYourCalm = HTTP2ErrorCode(rawValue: 0xb)
    public static let inadequateSecurity = HTTP2ErrorCode(rawValue: 0xc)
    public static let http11Required = HTTP2ErrorCode(rawValue: 0xd)

    public var description: String {
        switch rawValue {
        case 0x0: "NO_ERROR"
        case 0x1: "PROTOCOL_ERROR"
        case 0x2: "INTERNAL_ERROR"
        case 0x3: "FLOW_CONTROL_ERROR"
        case 0x4: "SETTINGS_TIMEOUT"
        case 0x5: "STREAM_CLOSED"
        case 0x6: "FRAME_SIZE_ERROR"
        case 0x7: "REFUSED_STREAM"
        case 0x8: "CANCEL"
        case 0x9: "COMPRESSION_ERROR"
        case 0xa: "CONNECT_ERROR"
        case 0xb: "ENHANCE_YOUR_CALM"
        case 0xc: "INADEQUATE_SECURITY"
        case 0xd: "HTTP_1_1_REQUIRED"
        default: "0x\(String(rawValue, radix: 16))"
        }
    }
}

/// A request that passed strict translation (SPEC §17): what the engine may forward.
///
/// Field names are lowercase (RFC 9113 §8.2.1 requires it on the wire), connection-specific fields are absent
/// (their presence made the request malformed), and cookie crumbs are joined (RFC 9113 §8.2.3).
public struct HTTP2Request: Hashable, Sendable {
    /// `:method`, a token.
    public var method: String
    /// `:scheme`: always the configured scheme (`https` on intercepted TLS); "" for CONNECT (RFC 9113 §8.5).
    public var scheme: String
    /// `:authority` as sent: host and optional port, no userinfo. It plays the part of `Host`.
    public var authority: String
    /// `:path` as sent: origin-form (`/…`), or `*` for a server-wide OPTIONS; "" for CONNECT.
    public var path: String
    /// The regular fields in order, names lowercase. Every `cookie` crumb is joined into one `cookie` field, in the
    /// place of the first crumb, with "; " (RFC 9113 §8.2.3). A `host` field equal to `:authority` is left out
    /// (`requestHead` writes Host from `:authority`); any other `host` made the request malformed.
    public var fields: [HTTPField]
    /// The `content-length` the client declared. The codec resets a stream whose DATA disagrees with it.
    public var contentLength: UInt64?

    public init(method: String, scheme: String, authority: String, path: String, fields: [HTTPField],
                contentLength: UInt64?) {
        self.method = method
        self.scheme = scheme
        self.authority = authority
        self.path = path
        self.fields = fields
        self.contentLength = contentLength
    }

    /// The request in the shape the HTTP/1 admission reads inside an intercepted tunnel: origin-form target
    /// (`:path`; authority-form for CONNECT), HTTP/1.1, and `Host` from `:authority` as the first field.
    ///
    /// The version is 1.1 because every later step (hop-by-hop rules, framing to an HTTP/1.1 origin) must treat
    /// the request as a 1.1 request; the body is delimited by the stream, so the engine frames it to the origin
    /// with `content-length` when declared and chunked otherwise, never from any field of the client's.
    public var requestHead: RequestHead { requestHead(chunked: false) }

    /// `requestHead`, with `transfer-encoding: chunked` last when `chunked` (a body the client did not give a
    /// length: the engine frames it chunked). Every part of it is known good by how it was made (the builder
    /// checked each field, the target and the method; `host` is the checked `:authority`), so it is handed over
    /// as `HeadHandoff.Source.checkedParts`.
    public func requestHead(chunked: Bool) -> RequestHead {
        var headFields: [HTTPField] = []
        headFields.reserveCapacity(fields.count + 2)
        headFields.append(HTTPField(name: "host", value: authority))
        headFields.append(contentsOf: fields)
        if chunked { headFields.append(HTTPField(name: "transfer-encoding", value: "chunked")) }
        return RequestHead(method: method, target: method == "CONNECT" ? authority : path, version: .http11,
                           fields: headFields)
    }
}

/// Why a request was never surfaced: its stream is refused before the engine sees a request on it.
public enum HTTP2RequestRefusal: Error, Hashable, Sendable {
    /// Malformed (RFC 9113 §8.1.1, SPEC §17 "Translation is strict"): the codec has reset the stream with
    /// PROTOCOL_ERROR. The engine only counts it.
    case malformed(HTTP2Malformation)
    /// The header section is larger than `HTTPLimits.headerSection` or has more than `headerCount` fields, once
    /// decoded: the codec ignores the rest and the stream waits for the engine's `431` (`headers-too-large`), as an
    /// HTTP/1 request would get (RFC 9113 §10.5.1). Its request body, if any, is discarded by the codec.
    case headerSectionTooLarge
    /// `:path` is longer than `HTTPLimits.requestLine`: the stream waits for the engine's `414` (`uri-too-long`).
    case pathTooLong
    /// A stream beyond `SETTINGS_MAX_CONCURRENT_STREAMS` before the client acknowledged it: the stream was reset
    /// with REFUSED_STREAM (RFC 9113 §5.1.2, §8.7: safe to retry). The engine only counts it.
    case tooManyStreams

    /// Whether the engine owes the stream a response (`431` or `414`); the others are already reset.
    public var awaitsResponse: Bool {
        switch self {
        case .headerSectionTooLarge, .pathTooLong: true
        case .malformed, .tooManyStreams: false
        }
    }
}

/// What made a request or its trailers malformed. Each case is a check of SPEC §17 "Translation is strict";
/// `nghttp2` is what the protocol library refused itself (`lib/nghttp2_http.c`), in its own words.
public enum HTTP2Malformation: Hashable, Sendable {
    /// A connection-specific field (RFC 9113 §8.2.2): `connection`, `keep-alive`, `proxy-connection`,
    /// `transfer-encoding`, `upgrade`, or `te` other than `trailers`. Forwarding any of them to HTTP/1.1 is the
    /// downgrade-smuggling class (a `transfer-encoding: chunked` that the HTTP/1.1 origin would frame by).
    case connectionSpecificField(String)
    /// A field name with an uppercase letter or a character outside tchar, or empty (RFC 9113 §8.2.1).
    case invalidFieldName
    /// A field value with NUL, CR or LF (header injection on the HTTP/1.1 side), another control character,
    /// leading or trailing whitespace (RFC 9113 §8.2.1), or bytes that are not UTF-8.
    case invalidFieldValue(name: String)
    /// A pseudo-header that is not one of a request's four (`:protocol` included: extended CONNECT is off).
    case unknownPseudoHeader(String)
    /// A pseudo-header sent twice (RFC 9113 §8.3).
    case duplicatePseudoHeader(String)
    /// A pseudo-header after a regular field, or in trailers (RFC 9113 §8.3).
    case misplacedPseudoHeader(String)
    /// A required pseudo-header is absent or empty: `:method`, `:scheme`, `:path`, `:authority`; or CONNECT with
    /// `:scheme` or `:path` (RFC 9113 §8.5).
    case missingPseudoHeader(String)
    /// `:scheme` is not the one this connection serves (`https` inside TLS, SPEC §17).
    case schemeNotAllowed(String)
    /// `:method` is not a token.
    case invalidMethod
    /// `:authority` or `:path` is not a valid origin-form target for `https` (userinfo, fragment, bad host or
    /// port, not starting with `/`), read by the same rules as an HTTP/1.1 absolute-form target.
    case invalidTarget(String)
    /// A `host` field that disagrees with `:authority`, or more than one (RFC 9113 §8.3.1): the proxy would check
    /// one authority and an origin could route by the other.
    case hostDisagreesWithAuthority
    /// `content-length` that is not one decimal number, or sent twice.
    case invalidContentLength
    /// DATA that disagrees with `content-length` (RFC 9113 §8.1.1).
    case contentLengthMismatch
    /// A trailer field that must not be a trailer (RFC 9110 §6.5.1): framing, routing or connection fields.
    case forbiddenTrailer(String)
    /// Trailers larger than the header-section limit (the HTTP/1 path refuses such a trailer section too).
    case trailerSectionTooLarge
    /// Refused by nghttp2's own HTTP messaging checks, before the field reached the codec.
    case nghttp2(String)
}

/// What a limit of SPEC §17 tripped. The raw value is the `reason` label of `datamode_http2_errors_total`.
public enum HTTP2LimitReason: String, Hashable, Sendable, CaseIterable {
    /// Streams opened and reset (by the client, or by the proxy for malformed requests) faster than they complete:
    /// CVE-2023-44487 "rapid reset", and its server-reset variant CVE-2025-8671 ("MadeYouReset").
    case rapidReset = "rapid-reset"
    /// A header block continued by more CONTINUATION frames than any real request needs (CVE-2024-27316).
    case continuationFlood = "continuation-flood"
    /// A header section larger than the limit once decoded (stream answered 431), or a URI beyond the request-line
    /// limit (414); counted, the connection carries on.
    case headerTooLarge = "header-too-large"
    /// A header block that decodes to far more than it weighs: dynamic-table references multiplying one large
    /// entry (HPACK bomb, RFC 7541 §7.3).
    case hpackBomb = "hpack-bomb"
    /// SETTINGS frames faster than the budget (CVE-2019-9515).
    case settingsFlood = "settings-flood"
    /// PING frames faster than the budget (CVE-2019-9512).
    case pingFlood = "ping-flood"
    /// DATA frames without payload or END_STREAM, faster than the budget (CVE-2019-9518).
    case emptyFrames = "empty-frames"
    /// More open streams than `SETTINGS_MAX_CONCURRENT_STREAMS`: REFUSED_STREAM before the client acknowledged the
    /// setting, a connection error (PROTOCOL_ERROR, RFC 9113 §5.1.2) after.
    case tooManyStreams = "too-many-streams"
    /// The client makes the proxy queue control-frame answers (SETTINGS and PING acknowledgements, RST_STREAM)
    /// faster than it reads them (nghttp2's `max_outbound_ack`, CVE-2019-9512 and -9515 on the write side).
    case outboundFlood = "outbound-flood"
}

/// Why a connection failed. GOAWAY with `code` is on its way out; the engine flushes the output and closes.
public struct HTTP2ConnectionError: Hashable, Sendable {
    public enum Cause: Hashable, Sendable {
        /// A limit of SPEC §17.
        case limit(HTTP2LimitReason)
        /// The client broke the protocol (bad preface, frame size, flow control, HPACK state, …): nghttp2 said so.
        case protocolViolation
        /// nghttp2 failed on its own (out of memory, or a bug in the codec's use of it).
        case internalFailure
    }
    public var cause: Cause
    /// The GOAWAY's error code.
    public var code: HTTP2ErrorCode
    /// What happened, for the log (nghttp2's words for its own errors).
    public var detail: String

    public init(cause: Cause, code: HTTP2ErrorCode, detail: String) {
        self.cause = cause
        self.code = code
        self.detail = detail
    }

    /// The `reason` label for `datamode_http2_errors_total{side,reason}`.
    public var reasonLabel: String {
        switch cause {
        case .limit(let reason): reason.rawValue
        case .protocolViolation: "protocol-error"
        case .internalFailure: "internal-error"
        }
    }
}

/// How a stream the engine knew about ended.
public enum HTTP2StreamEnd: Hashable, Sendable {
    /// Both sides ended their messages: the exchange is complete.
    case completed
    /// The client reset the stream (RST_STREAM with this code): abandon the exchange.
    case resetByClient(HTTP2ErrorCode)
    /// The proxy reset the stream: on the engine's request (`resetStream`) or because the client's DATA or trailers
    /// turned out malformed (`content-length` disagreement, a connection-specific trailer).
    case resetByProxy(HTTP2ErrorCode)
}

/// What the server session reports, in the order it happened on the wire.
public enum HTTP2ServerEvent: Hashable, Sendable {
    /// A request head that passed strict translation. `endStream`: HEADERS carried END_STREAM, no body follows (and
    /// no `requestEnd` will).
    case request(HTTP2StreamID, HTTP2Request, endStream: Bool)
    /// Request body bytes, in order. They hold the stream's and the connection's receive windows until the engine
    /// gives them back with `consumeRequestBody` (flow control is backpressure, SPEC §17).
    case requestBody(HTTP2StreamID, [UInt8])
    /// The request body ended (END_STREAM), with its trailers, or none. `content-length` was met exactly.
    case requestEnd(HTTP2StreamID, trailers: [HTTPField])
    /// A stream whose request is refused before any `request` event (see `HTTP2RequestRefusal.awaitsResponse`).
    case requestRefused(HTTP2StreamID, HTTP2RequestRefusal)
    /// The stream's queued response body fell below `responseBodyLowWatermark` after `sendResponseBody` had said
    /// to stop: read from the origin again.
    case responseBodyDrained(HTTP2StreamID)
    /// A stream the engine knew (a `request`, or a refusal awaiting a response) closed. No call about it has any
    /// effect any more.
    case streamClosed(HTTP2StreamID, HTTP2StreamEnd)
    /// The client sent GOAWAY: streams above `lastStreamID` are not processed by the client; open no more.
    case goaway(lastStreamID: HTTP2StreamID, HTTP2ErrorCode)
    /// The connection failed (a limit or a protocol violation): GOAWAY is queued. The engine counts it
    /// (`datamode_http2_errors_total{side="client",reason}`), flushes the output and closes.
    case connectionError(HTTP2ConnectionError)
    /// A limit tripped on one stream while the connection carries on (`headerTooLarge`, `tooManyStreams` before
    /// the SETTINGS acknowledgement): counted only. Comes with the stream's `requestRefused`.
    case limitExceeded(HTTP2LimitReason)
}

/// Why a call of the engine on the session was refused. Each is a bug in the caller or a stream that is gone.
public enum HTTP2SessionError: Error, Hashable, Sendable {
    /// The stream is not open (never was, closed, or reset): drop whatever the call was about.
    case unknownStream(HTTP2StreamID)
    /// The call does not fit the stream's state (a second final response, a body after the end, 1xx after the
    /// final response).
    case invalidState(String)
    /// A field the proxy must not send in HTTP/2: connection-specific, uppercase or invalid name, pseudo-header,
    /// invalid value (RFC 9113 §8.2). Translation is strict in both directions.
    case invalidField(String)
    /// A status outside 100...999, or 101 (RFC 9113 §8.6: no Upgrade in HTTP/2), or 1xx as a final status.
    case invalidStatus(Int)
    /// A head or trailers larger than the client takes, or than the proxy sends in one header block
    /// (`HTTP2ServerSession.headerListProblem`: why); nothing was submitted.
    case headerListTooLarge(String)
    /// The connection is terminated.
    case connectionClosed
    /// nghttp2 refused the call; the text is its error string.
    case nghttp2(String)
}
