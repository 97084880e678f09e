/// The origin-facing side of an HTTP/2 connection (the proxy is the client, RFC 9113), on nghttp2, without sockets:
/// the engine's `HTTP2OriginSession` drives it (SPEC §17 "Origin side", see ARCHITECTURE.md).
///
/// As `HTTP2ServerSession`, the engine owns the bytes: `receive` what it read from the origin, `writeOutput` what
/// to write. The engine starts requests (`startRequest`), feeds their bodies (`sendRequestBody`, false = stop
/// reading the client until `requestBodyDrained`), ends them (`finishRequest`), and gives response bytes back to the
/// origin's windows only as it moves them on (`consumeResponseBody`: flow control is backpressure).
///
/// What it guarantees the engine:
/// - a `response` only for a response head that passed nghttp2's HTTP messaging checks (`:status` alone among the
///   pseudo-headers, no connection-specific field, `content-length` a number) and this codec's own field checks
///   (lowercase token names, no CR/LF/NUL or other control character in values: what an HTTP/1.1 client would be
///   handed): anything else resets the stream (PROTOCOL_ERROR) and is reported as `malformedResponse`;
/// - response DATA held to `content-length` (nghttp2 resets a stream whose DATA disagrees);
/// - `canStartStream` within the origin's SETTINGS_MAX_CONCURRENT_STREAMS and never after its GOAWAY.
import CNghttp2
import DatamodeHTTP

public struct HTTP2ClientConfiguration: Hashable, Sendable {
    /// The per-stream receive window the proxy advertises to origins, and the connection's.
    public var initialWindowSize: UInt32
    /// Response header sections larger than this (decoded) reset the stream.
    public var headerLimits: HTTPLimits
    /// A request body queue at or above this says "stop reading the client" (`sendRequestBody` false).
    public var requestBodyHighWatermark: Int
    /// ... and below this, after a stop, `requestBodyDrained`.
    public var requestBodyLowWatermark: Int

    public init(initialWindowSize: UInt32 = 1 << 20, headerLimits: HTTPLimits = HTTPLimits(requestLine: 8 * 1024, headerSection: 128 * 1024, headerCount: 300),
                requestBodyHighWatermark: Int = 256 * 1024, requestBodyLowWatermark: Int = 64 * 1024) {
        self.initialWindowSize = initialWindowSize
        self.headerLimits = headerLimits
        self.requestBodyHighWatermark = requestBodyHighWatermark
        self.requestBodyLowWatermark = requestBodyLowWatermark
    }
}

/// What the client session reports, in wire order.
public enum HTTP2ClientEvent: Hashable, Sendable {
    /// A 1xx response (RFC 9113 §8.1), before the final one.
    case informational(HTTP2StreamID, status: Int, fields: [HTTPField])
    /// The final response head. `endStream`: no body follows (nor a `responseEnd`).
    case response(HTTP2StreamID, status: Int, fields: [HTTPField], endStream: Bool)
    /// Response body bytes; they hold the origin's windows until `consumeResponseBody`.
    case responseBody(HTTP2StreamID, [UInt8])
    /// Response body bytes left where they are: at `range` of the buffer given to `receive(_:bodyInPlace: true)`, so
    /// valid only while that buffer is (what `responseBody` would have carried, copied). Otherwise as `responseBody`.
    case responseBodyAt(HTTP2StreamID, Range<Int>)
    /// The response body ended, with its trailers (or none).
    case responseEnd(HTTP2StreamID, trailers: [HTTPField])
    /// The request body queue fell below the low watermark after `sendRequestBody` said stop.
    case requestBodyDrained(HTTP2StreamID)
    /// Request body bytes of the stream went out in a DATA frame: its queue shrank (whether or not it said stop).
    case requestBodySent(HTTP2StreamID)
    /// The origin may have opened a window the request bodies wait on: a WINDOW_UPDATE for the stream, or, with
    /// id 0, for the connection or a SETTINGS frame (a new initial window): every stream's.
    case sendWindowOpened(HTTP2StreamID)
    /// The origin's response broke the rules: the stream is reset (PROTOCOL_ERROR); `streamClosed` follows.
    case malformedResponse(HTTP2StreamID, String)
    /// A stream the engine started closed: `completed`, `resetByClient` (here: the origin reset it) or
    /// `resetByProxy`.
    case streamClosed(HTTP2StreamID, HTTP2StreamEnd)
    /// The origin's SETTINGS_MAX_CONCURRENT_STREAMS (nil: unlimited, as RFC 9113 §6.5.2 says when absent): on its
    /// first SETTINGS, and whenever it changes.
    case concurrencyChanged(Int?)
    /// The origin sent GOAWAY: streams above `lastStreamID` were not processed (they may be retried elsewhere).
    case goaway(lastStreamID: HTTP2StreamID, HTTP2ErrorCode)
    /// The connection failed; the engine closes it.
    case connectionError(HTTP2ConnectionError)
}

public final class HTTP2ClientSession {
    public let configuration: HTTP2ClientConfiguration
    var session: OpaquePointer!
    var events: [HTTP2ClientEvent] = []
    var streams = StreamTable<ClientStream>()
    var isDead = false
    var goawayReceived = false
    /// The origin's SETTINGS_MAX_CONCURRENT_STREAMS, nil until it says (unlimited).
    public internal(set) var peerMaxConcurrentStreams: Int?
    /// The origin's first SETTINGS arrived (until then its concurrency is not known).
    public internal(set) var remoteSettingsReceived = false
    var lastLibraryMessage = ""
    var squeeze: StreamWindowSqueeze
    /// The buffer `receive` is reading, when its caller takes response bodies in place (`responseBodyAt`).
    var inPlaceBuffer: UnsafeRawBufferPointer?

    /// A class, not a struct: the callbacks look a stream up once and change it in place, rather than copying it
    /// out of and back into the dictionary for every field of every response.
    final class ClientStream {
        var fields: [HTTPField] = []
        var status: Int?
        /// The first reason the current header section cannot be handed on.
        var malformation: String?
        var decodedSize = 0
        var finalResponseSeen = false
        var responseEnded = false
        var unconsumed = 0
        var outbound: OutboundBody?
    }

    public init(configuration: HTTP2ClientConfiguration = HTTP2ClientConfiguration()) throws(HTTP2SessionError) {
        self.configuration = configuration
        squeeze = StreamWindowSqueeze(configuredWindow: configuration.initialWindowSize)
        var option: OpaquePointer?
        guard nghttp2_option_new(&option) == 0, let option else { throw .nghttp2("nghttp2_option_new failed") }
        defer { nghttp2_option_del(option) }
        nghttp2_option_set_no_auto_window_update(option, 1)
        nghttp2_option_set_max_deflate_dynamic_table_size(option, 4096)
        nghttp2_option_set_max_settings(option, 32)
        nghttp2_option_set_max_outbound_ack(option, 1000)
        var callbacks: OpaquePointer?
        guard nghttp2_session_callbacks_new(&callbacks) == 0, let callbacks else {
            throw .nghttp2("nghttp2_session_callbacks_new failed")
        }
        defer { nghttp2_session_callbacks_del(callbacks) }
        ClientCallbacks.install(callbacks)
        var created: OpaquePointer?
        let rv = nghttp2_session_client_new2(&created, callbacks, Unmanaged.passUnretained(self).toOpaque(), option)
        guard rv == 0, let created else { throw .nghttp2(HTTP2ServerSession.libraryError(rv)) }
        session = created
        var settings = [
            nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_ENABLE_PUSH.rawValue), value: 0),
            nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE.rawValue),
                                   value: configuration.initialWindowSize),
            nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE.rawValue),
                                   value: UInt32(clamping: configuration.headerLimits.headerSection)),
        ]
        let submitted = nghttp2_submit_settings(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), &settings, settings.count)
        guard submitted == 0 else { throw .nghttp2(HTTP2ServerSession.libraryError(submitted)) }
        let window = nghttp2_session_set_local_window_size(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), 0,
                                                           Int32(clamping: configuration.initialWindowSize))
        guard window == 0 else { throw .nghttp2(HTTP2ServerSession.libraryError(window)) }
    }

    deinit {
        nghttp2_session_del(session)
    }

    // MARK: - Bytes

    /// Reads what the origin sent. `bodyInPlace`: response body bytes are reported where they lie in `bytes`
    /// (`responseBodyAt`, ranges of `bytes`), not copied (`responseBody`); the caller keeps `bytes` as they are until
    /// it has handled the events. nghttp2 hands a DATA frame's payload as a pointer into its input; one that does not
    /// point into `bytes` is copied all the same.
    public func receive(_ bytes: UnsafeRawBufferPointer, bodyInPlace: Bool = false) -> [HTTP2ClientEvent] {
        guard !isDead, let base = bytes.baseAddress, bytes.count > 0 else { return takeEvents() }
        if bodyInPlace { inPlaceBuffer = bytes }
        defer { inPlaceBuffer = nil }
        let rv = nghttp2_session_mem_recv(session, base.assumingMemoryBound(to: UInt8.self), bytes.count)
        if rv < 0 { fail(Int32(truncatingIfNeeded: rv)) }
        return takeEvents()
    }

    public func writeOutput(limit: Int = Int.max, _ sink: (UnsafeRawBufferPointer) -> Void) -> [HTTP2ClientEvent] {
        var written = 0
        while !isDead && written < limit {
            var chunk: UnsafePointer<UInt8>?
            let n = nghttp2_session_mem_send(session, &chunk)
            if n < 0 {
                fail(Int32(truncatingIfNeeded: n))
                break
            }
            guard n > 0, let chunk else { break }
            sink(UnsafeRawBufferPointer(start: chunk, count: n))
            written += n
        }
        return takeEvents()
    }

    public var wantsRead: Bool { !isDead && nghttp2_session_want_read(session) != 0 }
    public var wantsWrite: Bool { !isDead && nghttp2_session_want_write(session) != 0 }

    /// Streams started and not closed.
    public var openStreams: Int { streams.count }

    /// Whether another request may start now: within the origin's concurrency, before any GOAWAY.
    public var canStartStream: Bool {
        !isDead && !goawayReceived && openStreams < (peerMaxConcurrentStreams ?? Int.max)
    }

    // MARK: - Requests

    /// Starts a request; the fields must already be HTTP/2's (lowercase, no connection-specific field, no `host`:
    /// `authority` is it), and are checked unless `checked` says the caller did (`HTTP2OriginRequestTranslation`).
    /// `endStream`: no body. Returns the stream id.
    public func startRequest(method: String, scheme: String, authority: String, path: String, fields: [HTTPField],
                             endStream: Bool, checked: Bool = false) throws(HTTP2SessionError) -> HTTP2StreamID {
        guard canStartStream else { throw .connectionClosed }
        for field in fields where !checked {
            if let problem = HTTP2ResponseTranslation.problem(with: field) { throw .invalidField(problem) }
            if field.name == "host" { throw .invalidField("host is :authority in HTTP/2") }
        }
        // Made whole at once: appending `:path` to an array of three grew its storage (an allocation per request).
        let pseudo: [(String, String)] = method == "CONNECT"
            ? [(":method", method), (":scheme", scheme), (":authority", authority)]
            : [(":method", method), (":scheme", scheme), (":authority", authority), (":path", path)]
        let state = ClientStream()
        let id: Int32
        if endStream {
            id = HTTP2ServerSession.withNameValues(pseudo: pseudo, fields: fields) { list, count in
                nghttp2_submit_request(session, nil, list, count, nil, nil)
            }
        } else {
            var provider = ClientCallbacks.requestBodyProvider()
            id = HTTP2ServerSession.withNameValues(pseudo: pseudo, fields: fields) { list, count in
                nghttp2_submit_request(session, nil, list, count, &provider, nil)
            }
            state.outbound = OutboundBody()
        }
        guard id > 0 else { throw .nghttp2(HTTP2ServerSession.libraryError(id)) }
        streams[id] = state
        return id
    }

    /// Queues request body bytes (copied); false once the queue reaches the high watermark.
    @discardableResult
    public func sendRequestBody(_ id: HTTP2StreamID, _ bytes: UnsafeRawBufferPointer) throws(HTTP2SessionError) -> Bool {
        guard !isDead else { throw .connectionClosed }
        guard streams[id]?.outbound != nil, !streams[id]!.outbound!.finished else { throw .unknownStream(id) }
        streams[id]!.outbound!.bytes.append(contentsOf: bytes)
        resumeIfDeferred(id)
        guard streams[id]!.outbound!.count < configuration.requestBodyHighWatermark else {
            streams[id]!.outbound!.paused = true
            return false
        }
        return true
    }

    /// Request body bytes queued on a stream and not yet sent.
    public func bufferedRequestBytes(_ id: HTTP2StreamID) -> Int {
        streams[id]?.outbound?.count ?? 0
    }

    /// Whether the origin's windows, the stream's and the connection's, let more of the stream's request body go now.
    public func requestWindowOpen(_ id: HTTP2StreamID) -> Bool {
        guard !isDead, streams[id]?.outbound != nil else { return false }
        return nghttp2_session_get_stream_remote_window_size(session, id) > 0
            && nghttp2_session_get_remote_window_size(session) > 0
    }

    /// Ends the request body, with trailers or none.
    public func finishRequest(_ id: HTTP2StreamID, trailers: [HTTPField] = []) throws(HTTP2SessionError) {
        guard !isDead else { throw .connectionClosed }
        guard streams[id]?.outbound != nil, !streams[id]!.outbound!.finished else { throw .unknownStream(id) }
        for field in trailers {
            if let problem = HTTP2ResponseTranslation.problem(with: field) { throw .invalidField(problem) }
        }
        streams[id]!.outbound!.finished = true
        streams[id]!.outbound!.trailers = trailers
        resumeIfDeferred(id)
    }

    /// Gives response bytes back to the stream's window once the engine moved them on. The connection's window went
    /// back when they arrived (`dataChunk`): the connection is shared by exchanges of different clients, and one
    /// client that reads slowly must hold back its own stream only, not every other client's answers from that
    /// origin (session 18: one stalled 20 MB download held a 1 KB answer on the same connection for its whole 15 s).
    public func consumeResponseBody(_ id: HTTP2StreamID, count: Int) {
        guard !isDead, count > 0, let held = streams[id]?.unconsumed, held > 0 else { return }
        let n = min(count, held)
        streams[id]!.unconsumed = held - n
        _ = nghttp2_session_consume_stream(session, id, n)
    }

    /// The streams' windows are squeezed (`squeezeStreamWindows`) and not restored yet.
    public var streamWindowsSqueezed: Bool { squeeze.active }

    /// Lowers every stream's window to 64 KiB (`StreamWindowSqueeze`): the origin's unused grants are taken back. The
    /// engine does it when the connection's streams received more than their exchanges take
    /// (`HTTP2OriginSession.settleStreamWindows`). False when it changes nothing or nghttp2 refused.
    public func squeezeStreamWindows() -> Bool {
        !isDead && squeeze.squeeze(session)
    }

    /// Gives the streams their configured window back. False when nothing changed.
    public func restoreStreamWindows() -> Bool {
        !isDead && squeeze.restore(session)
    }

    public func resetStream(_ id: HTTP2StreamID, code: HTTP2ErrorCode) {
        guard !isDead, streams[id] != nil else { return }
        _ = nghttp2_submit_rst_stream(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), id, code.rawValue)
    }

    /// GOAWAY (NO_ERROR): the proxy is closing this origin connection once its streams are done.
    public func shutdown() {
        guard !isDead else { return }
        _ = nghttp2_session_terminate_session(session, HTTP2ErrorCode.noError.rawValue)
    }

    // MARK: - Inside

    func takeEvents() -> [HTTP2ClientEvent] {
        defer { events.removeAll(keepingCapacity: true) }
        return events
    }

    func resumeIfDeferred(_ id: HTTP2StreamID) {
        guard streams[id]?.outbound?.deferred == true else { return }
        streams[id]!.outbound!.deferred = false
        _ = nghttp2_session_resume_data(session, id)
    }

    func fail(_ code: Int32) {
        isDead = true
        let error = HTTP2ConnectionError(cause: code == NGHTTP2_ERR_FLOODED.rawValue ? .limit(.outboundFlood) : .protocolViolation,
                                         code: .protocolError, detail: HTTP2ServerSession.libraryError(code))
        events.append(.connectionError(error))
    }
}
