/// The client-facing side of an HTTP/2 connection (the proxy is the server, RFC 9113), on nghttp2, without sockets.
///
/// The engine owns the bytes: it hands in what it read (`receive`) and pulls what to write (`writeOutput`); the
/// session turns them into `HTTP2ServerEvent`s and frames. Nothing here blocks, allocates per byte, or keeps a
/// reference to the engine. One instance per connection, used from one thread (a worker's event loop).
///
/// What it guarantees the engine (SPEC §17):
/// - a `request` event only for a request that passed strict translation (`HTTP2RequestBuilder` on top of
///   nghttp2's own checks); a malformed one is reset with PROTOCOL_ERROR and reported as `requestRefused`;
/// - request DATA held to `content-length`, each stream's and the connection's receive window reopened only by
///   `consumeRequestBody` (flow control is backpressure), or each on its own (`consumeStreamWindow`, then
///   `consumeConnectionWindow`), so that the engine can bound what the connection as a whole makes it hold;
/// - response bodies pulled from a per-stream queue only as the client's windows allow, with a high watermark
///   that tells the engine to stop reading the origin, and `responseBodyDrained` when to resume;
/// - every limit of SPEC §17 answered with GOAWAY (ENHANCE_YOUR_CALM for floods) and reported with its reason.
import CNghttp2
import DatamodeHTTP
#if canImport(Glibc)
import Glibc
#endif

public final class HTTP2ServerSession {
    public let configuration: HTTP2ServerConfiguration

    /// nghttp2's session; nil only during `init`.
    var session: OpaquePointer!
    var streams = StreamTable<StreamState>()
    var events: [HTTP2ServerEvent] = []
    let now: () -> UInt64

    var resetBudget: FloodBudget
    var pingBudget: FloodBudget
    var settingsBudget: FloodBudget
    var emptyFrameBudget: FloodBudget
    let continuationLimit: Int
    /// The header block being received: its compressed size so far and its CONTINUATION frames.
    var headerBlock = HeaderBlock()
    /// Request streams opened and not yet closed: nghttp2's `num_incoming_streams`, counted the same way.
    var openStreams = 0
    /// The highest stream id a client HEADERS frame began on.
    var lastClientStreamID: HTTP2StreamID = 0
    /// Connection window to give back once outside nghttp2's callbacks (bytes of streams that closed unconsumed).
    var connectionBytesToRelease = 0
    /// Request body bytes received on streams the engine reads whose connection window has not gone back yet
    /// (`consumeConnectionWindow`): what the engine holds of the connection's window. Counted from receipt, not from
    /// when a stream's own window goes back: bytes a stream cannot move on yet (its input full, its origin's
    /// concurrency taken) must not pin the connection window, or one such stream holding half of it keeps nghttp2
    /// from ever sending the connection's WINDOW_UPDATE and the streams that could finish starve (session 18: two
    /// 3 MB uploads to an origin taking one stream at a time stalled for good).
    public internal(set) var connectionWindowWithheld = 0
    /// Set once the connection is ending (our limit, nghttp2's protocol error, or a fatal error).
    var connectionError: HTTP2ConnectionError?
    var squeeze: StreamWindowSqueeze
    /// nghttp2 returned a fatal error: the session must not be used again; only `goawayTail` goes out.
    var isDead = false
    var goawayTail: [UInt8] = []
    /// nghttp2's last error text (its error callback), for details.
    var lastLibraryMessage = ""

    struct HeaderBlock {
        var stream: HTTP2StreamID = 0
        var compressedBytes = 0
        var continuations = 0
    }

    /// One stream the client opened.
    /// A class, not a struct: the callbacks look a stream up once and change it in place, rather than copying it
    /// (its request builder included) out of and back into the dictionary for every field of every request.
    final class StreamState {
        enum Phase {
            /// Reading the request head: `head` collects it.
            case head
            /// Never surfaced as a request (`requestRefused` was sent). `awaitsResponse`: the engine answers it.
            case refused(awaitsResponse: Bool)
            /// Surfaced as a request: the engine drives it.
            case open
        }
        var phase = Phase.head
        var head: HTTP2RequestBuilder?
        var trailers: HTTP2RequestBuilder?
        /// The malformation nghttp2's invalid-header callback reported, before nghttp2 resets the stream.
        var malformation: HTTP2Malformation?
        var contentLength: UInt64?
        var bodyReceived: UInt64 = 0
        /// Request body bytes surfaced and not yet given back by `consumeRequestBody`.
        var unconsumed = 0
        var requestEnded = false
        var informationalAllowed = true
        var finalResponseSubmitted = false
        var responseEnded = false
        var outbound: OutboundBody?
        var end: HTTP2StreamEnd?

        var engineKnows: Bool {
            switch phase {
            case .open, .refused(awaitsResponse: true): true
            case .head, .refused(awaitsResponse: false): false
            }
        }
    }


    /// Creates the session and queues the server's SETTINGS (SPEC §17): max concurrent streams, initial window,
    /// server push off, header list size; then the connection window. `now` is a monotonic clock in nanoseconds
    /// (the flood budgets refill by it); tests pass their own.
    public init(configuration: HTTP2ServerConfiguration = HTTP2ServerConfiguration(),
                now: @escaping () -> UInt64 = HTTP2ServerSession.monotonicNanoseconds) throws(HTTP2SessionError) {
        self.configuration = configuration
        self.now = now
        squeeze = StreamWindowSqueeze(configuredWindow: configuration.initialWindowSize)
        let start = now()
        let floods = configuration.floods
        resetBudget = FloodBudget(floods.resets, now: start)
        pingBudget = FloodBudget(floods.pings, now: start)
        settingsBudget = FloodBudget(floods.settings, now: start)
        emptyFrameBudget = FloodBudget(floods.emptyFrames, now: start)
        // Enough CONTINUATIONs for a whole header section in default-size (16 KiB) frames is always allowed.
        continuationLimit = max(floods.continuations, configuration.headerLimits.headerSection / 16_384 + 1)

        var option: OpaquePointer?
        guard nghttp2_option_new(&option) == 0, let option else { throw .nghttp2("nghttp2_option_new failed") }
        defer { nghttp2_option_del(option) }
        // Flow control is backpressure: windows reopen only as the engine moves bytes on.
        nghttp2_option_set_no_auto_window_update(option, 1)
        // What the proxy sends: a 4 KiB HPACK table and header blocks up to the section limit plus margin.
        nghttp2_option_set_max_deflate_dynamic_table_size(option, 4096)
        nghttp2_option_set_max_send_header_block_length(option, maxSendHeaderBlock)
        // nghttp2's own flood protections, set explicitly (their defaults): SETTINGS entries per frame
        // (CVE-2020-11080), queued control-frame answers (CVE-2019-9512/9515), and, as backstops behind the
        // codec's own budgets, which trip first and say why: stream resets (CVE-2023-44487) and CONTINUATIONs
        // (CVE-2024-27316; Debian's 1.52.0-1+deb12u2 patches add both options).
        nghttp2_option_set_max_settings(option, 32)
        nghttp2_option_set_max_outbound_ack(option, 1000)
        nghttp2_option_set_stream_reset_rate_limit(option, 1000, 33)
        nghttp2_option_set_max_continuations(option, continuationLimit + 1)

        var callbacks: OpaquePointer?
        guard nghttp2_session_callbacks_new(&callbacks) == 0, let callbacks else {
            throw .nghttp2("nghttp2_session_callbacks_new failed")
        }
        defer { nghttp2_session_callbacks_del(callbacks) }
        ServerCallbacks.install(callbacks)

        var created: OpaquePointer?
        let rv = nghttp2_session_server_new2(&created, callbacks, Unmanaged.passUnretained(self).toOpaque(), option)
        guard rv == 0, let created else { throw .nghttp2(Self.libraryError(rv)) }
        session = created

        var settings = [
            nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_ENABLE_PUSH.rawValue), value: 0),
            nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS.rawValue),
                                   value: configuration.maxConcurrentStreams),
            nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE.rawValue),
                                   value: configuration.initialWindowSize),
            nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE.rawValue),
                                   value: UInt32(clamping: configuration.headerLimits.headerSection)),
        ]
        let submitted = nghttp2_submit_settings(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), &settings, settings.count)
        guard submitted == 0 else { throw .nghttp2(Self.libraryError(submitted)) }
        let window = nghttp2_session_set_local_window_size(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), 0,
                                                           Int32(clamping: configuration.connectionWindowSize))
        guard window == 0 else { throw .nghttp2(Self.libraryError(window)) }
    }

    deinit {
        nghttp2_session_del(session)
    }

    // MARK: - Input (the engine's read callback)

    /// Feeds bytes read from the client (the preface first); returns what they meant, in wire order.
    /// Request bodies come out as `requestBody` copies; the bytes passed in are not kept.
    public func receive(_ bytes: UnsafeRawBufferPointer) -> [HTTP2ServerEvent] {
        guard !isDead, let base = bytes.baseAddress, bytes.count > 0 else { return takeEvents() }
        let rv = nghttp2_session_mem_recv(session, base.assumingMemoryBound(to: UInt8.self), bytes.count)
        if rv < 0 { failFatally(Int32(truncatingIfNeeded: rv)) }
        releaseConnectionWindow()
        return takeEvents()
    }

    // MARK: - Output (the engine's write callback)

    /// Hands frames to write to `sink`, until nothing is pending or at least `limit` bytes went out (the last
    /// chunk may pass it: nghttp2 hands out whole frames). `sink` must copy the bytes (into an evbuffer) and must
    /// not call the session. Returns events that sending caused (streams that completed, bodies that drained).
    public func writeOutput(limit: Int = Int.max, _ sink: (UnsafeRawBufferPointer) -> Void) -> [HTTP2ServerEvent] {
        releaseConnectionWindow()
        var written = 0
        while !isDead && written < limit {
            var chunk: UnsafePointer<UInt8>?
            let n = nghttp2_session_mem_send(session, &chunk)
            if n < 0 {
                failFatally(Int32(truncatingIfNeeded: n))
                break
            }
            guard n > 0, let chunk else { break }
            sink(UnsafeRawBufferPointer(start: chunk, count: n))
            written += n
            releaseConnectionWindow()
        }
        if isDead && !goawayTail.isEmpty {
            goawayTail.withUnsafeBytes { sink($0) }
            goawayTail = []
        }
        return takeEvents()
    }

    /// Whether the session still reads: false once GOAWAY ended it (or the client's GOAWAY and every stream did).
    public var wantsRead: Bool { !isDead && nghttp2_session_want_read(session) != 0 }

    /// Whether `writeOutput` has something to hand out now. When neither this nor `wantsRead` holds, the engine
    /// closes the connection once its own buffer is written.
    public var wantsWrite: Bool { isDead ? !goawayTail.isEmpty : nghttp2_session_want_write(session) != 0 }

    /// The highest stream id the session processed: what a drain's GOAWAY carries.
    public var lastProcessedStreamID: HTTP2StreamID {
        isDead ? lastClientStreamID : nghttp2_session_get_last_proc_stream_id(session)
    }

    // MARK: - Request bodies

    /// Gives `count` bytes of a stream's request body back to the client's windows, once the engine moved them on
    /// (written to the origin, or discarded). More than the stream holds, or a closed stream, gives back what is
    /// left. WINDOW_UPDATE goes out when half a window is consumed (nghttp2's rule).
    public func consumeRequestBody(_ id: HTTP2StreamID, count: Int) {
        guard !isDead, count > 0, let held = streams[id]?.unconsumed, held > 0 else { return }
        let n = min(count, held)
        streams[id]!.unconsumed = held - n
        _ = nghttp2_session_consume_stream(session, id, n)
        consumeConnectionWindow(count: n)
    }

    /// Gives `count` bytes of a stream's request body back to the stream's window only: the client may send as much
    /// again on this stream once the connection's window lets it. The connection's window is the engine's to give
    /// back (`connectionWindowWithheld`, `consumeConnectionWindow`), as its bound on held bytes allows (SPEC §17:
    /// "the connection window likewise"). A closed stream's bytes not given back to its window go back to the
    /// connection's at its close, as with `consumeRequestBody`.
    public func consumeStreamWindow(_ id: HTTP2StreamID, count: Int) {
        guard !isDead, count > 0, let held = streams[id]?.unconsumed, held > 0 else { return }
        let n = min(count, held)
        streams[id]!.unconsumed = held - n
        _ = nghttp2_session_consume_stream(session, id, n)
    }

    /// Gives up to `count` withheld bytes (`connectionWindowWithheld`) back to the connection's window. WINDOW_UPDATE goes
    /// out when half the window is consumed (nghttp2's rule).
    public func consumeConnectionWindow(count: Int) {
        let n = min(count, connectionWindowWithheld)
        guard !isDead, n > 0 else { return }
        connectionWindowWithheld -= n
        _ = nghttp2_session_consume_connection(session, n)
    }

    // MARK: - Stream windows under pressure

    /// What `squeezeStreamWindows` lowers every stream's window to.
    public static let squeezedStreamWindow = StreamWindowSqueeze.squeezedWindow

    /// The streams' windows are squeezed: the SETTINGS that lowers them is queued or sent, and none restored them.
    public var streamWindowsSqueezed: Bool { squeeze.active }

    /// Lowers `SETTINGS_INITIAL_WINDOW_SIZE` to `squeezedStreamWindow` (`StreamWindowSqueeze`): the client's unused
    /// grants are taken back. The engine does it when the connection's streams hold too much
    /// (`HTTP2Session.settleStreamWindows`). False when it changes nothing or nghttp2 refused.
    public func squeezeStreamWindows() -> Bool {
        !isDead && squeeze.squeeze(session)
    }

    /// Gives the streams their configured window (`http2.initial-window`) back. False when nothing changed.
    public func restoreStreamWindows() -> Bool {
        !isDead && squeeze.restore(session)
    }

    // MARK: - Responses

    /// A 1xx response (`103 Early Hints`, `100 Continue`) before the final one (RFC 9113 §8.1). 101 is refused:
    /// HTTP/2 has no Upgrade (RFC 9113 §8.6).
    public func sendInformational(_ id: HTTP2StreamID, status: Int, fields: [HTTPField] = [],
                                  from source: HTTP2FieldSource = .unchecked) throws(HTTP2SessionError) {
        guard (100...199).contains(status), status != 101 else { throw .invalidStatus(status) }
        try checkRespondable(id)
        guard streams[id]!.informationalAllowed else { throw .invalidState("1xx after the final response") }
        let statusText = String(status)
        try checkHeaderList(pseudo: [(":status", statusText)], fields: fields)
        let rv = try withHeaderList(status: statusText, fields: fields, from: source) { list, count in
            nghttp2_submit_headers(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), id, nil, list, count, nil)
        }
        guard rv >= 0 else { throw .nghttp2(Self.libraryError(rv)) }
    }

    /// The final response head. `endStream`: no body (HEAD, 204, 304, an empty refusal). Otherwise the body follows
    /// through `sendResponseBody` and `finishResponse`.
    public func sendResponseHead(_ id: HTTP2StreamID, status: Int, fields: [HTTPField], endStream: Bool,
                                 from source: HTTP2FieldSource = .unchecked) throws(HTTP2SessionError) {
        guard (200...999).contains(status) else { throw .invalidStatus(status) }
        try checkRespondable(id)
        guard !streams[id]!.finalResponseSubmitted else { throw .invalidState("a second final response") }
        let statusText = String(status)
        try checkHeaderList(pseudo: [(":status", statusText)], fields: fields)
        let rv: Int32
        if endStream {
            rv = try withHeaderList(status: statusText, fields: fields, from: source) { list, count in
                nghttp2_submit_response(session, id, list, count, nil)
            }
        } else {
            var provider = ServerCallbacks.responseBodyProvider()
            rv = try withHeaderList(status: statusText, fields: fields, from: source) { list, count in
                nghttp2_submit_response(session, id, list, count, &provider)
            }
            if rv == 0 { streams[id]!.outbound = OutboundBody() }
        }
        guard rv == 0 else { throw .nghttp2(Self.libraryError(rv)) }
        streams[id]!.finalResponseSubmitted = true
        streams[id]!.informationalAllowed = false
    }

    /// Queues response body bytes (copied). Returns false once the stream holds `responseBodyHighWatermark` or
    /// more: stop reading the origin until `responseBodyDrained` (the client's window decides the pace).
    @discardableResult
    public func sendResponseBody(_ id: HTTP2StreamID, _ bytes: UnsafeRawBufferPointer) throws(HTTP2SessionError) -> Bool {
        guard !isDead, connectionError == nil else { throw .connectionClosed }
        guard streams[id] != nil else { throw .unknownStream(id) }
        guard let body = streams[id]!.outbound, !body.finished else {
            throw .invalidState("no response body is open on stream \(id)")
        }
        streams[id]!.outbound!.bytes.append(contentsOf: bytes)
        resumeIfDeferred(id)
        guard streams[id]!.outbound!.count < configuration.responseBodyHighWatermark else {
            streams[id]!.outbound!.paused = true
            return false
        }
        return true
    }

    /// Ends the response body, with trailers (RFC 9113 §8.1) or none. Trailers are checked like any field.
    public func finishResponse(_ id: HTTP2StreamID, trailers: [HTTPField] = []) throws(HTTP2SessionError) {
        guard !isDead, connectionError == nil else { throw .connectionClosed }
        guard streams[id] != nil else { throw .unknownStream(id) }
        guard let body = streams[id]!.outbound, !body.finished else {
            throw .invalidState("no response body is open on stream \(id)")
        }
        for field in trailers {
            if let problem = HTTP2ResponseTranslation.problem(with: field) { throw .invalidField(problem) }
        }
        try checkHeaderList(pseudo: [], fields: trailers)
        streams[id]!.outbound!.finished = true
        streams[id]!.outbound!.trailers = trailers
        resumeIfDeferred(id)
    }

    /// Resets a stream (RST_STREAM): an origin that failed mid-body, an exchange the engine abandons, or
    /// `noError` after a complete response to stop a request body it does not want (RFC 9113 §8.1).
    /// Body bytes already queued go out before the reset (SPEC §6: what the origin sent before it failed reaches the
    /// client), as the peer's windows let them: `readResponseBody` submits the reset once they are taken.
    public func resetStream(_ id: HTTP2StreamID, code: HTTP2ErrorCode) throws(HTTP2SessionError) {
        guard !isDead, connectionError == nil else { throw .connectionClosed }
        guard streams[id]?.engineKnows == true else { throw .unknownStream(id) }
        if code != .noError, let body = streams[id]!.outbound, body.count > 0, !body.finished {
            streams[id]!.outbound!.resetAfter = code.rawValue
            resumeIfDeferred(id)
            return
        }
        let rv = nghttp2_submit_rst_stream(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), id, code.rawValue)
        guard rv == 0 else { throw .nghttp2(Self.libraryError(rv)) }
    }

    /// Response body bytes queued on a stream and not yet sent.
    public func bufferedResponseBytes(_ id: HTTP2StreamID) -> Int {
        streams[id]?.outbound?.count ?? 0
    }

    // MARK: - Drain (SIGTERM, SPEC §17)

    /// First step of a graceful shutdown (RFC 9113 §6.8): GOAWAY with the largest stream id, so the client stops
    /// opening streams while those in flight may still arrive. Follow with `drain()` after a round trip.
    public func announceShutdown() {
        guard !isDead else { return }
        _ = nghttp2_submit_shutdown_notice(session)
    }

    /// GOAWAY (NO_ERROR) with the last stream id processed: later streams are refused, open ones finish. The
    /// session stops wanting to read and write once they have.
    public func drain() {
        guard !isDead else { return }
        _ = nghttp2_submit_goaway(session, UInt8(NGHTTP2_FLAG_NONE.rawValue),
                                  nghttp2_session_get_last_proc_stream_id(session), HTTP2ErrorCode.noError.rawValue,
                                  nil, 0)
    }

    // MARK: - Inside

    func takeEvents() -> [HTTP2ServerEvent] {
        defer { events.removeAll(keepingCapacity: true) }
        return events
    }

    func checkRespondable(_ id: HTTP2StreamID) throws(HTTP2SessionError) {
        guard !isDead, connectionError == nil else { throw .connectionClosed }
        guard let stream = streams[id], stream.engineKnows, stream.end == nil else { throw .unknownStream(id) }
    }

    func resumeIfDeferred(_ id: HTTP2StreamID) {
        guard streams[id]?.outbound?.deferred == true else { return }
        streams[id]!.outbound!.deferred = false
        _ = nghttp2_session_resume_data(session, id)
    }

    /// Gives the connection window of closed streams' unconsumed bytes back (outside nghttp2's callbacks).
    func releaseConnectionWindow() {
        guard !isDead, connectionBytesToRelease > 0 else { return }
        _ = nghttp2_session_consume_connection(session, connectionBytesToRelease)
        connectionBytesToRelease = 0
    }

    /// Ends the connection for a limit of the codec's own: GOAWAY with `code` after what is already queued;
    /// nghttp2 ignores all further input (`nghttp2_session_terminate_session`).
    func terminate(_ reason: HTTP2LimitReason, code: HTTP2ErrorCode, detail: String) {
        guard connectionError == nil, !isDead else { return }
        let error = HTTP2ConnectionError(cause: .limit(reason), code: code, detail: detail)
        connectionError = error
        events.append(.connectionError(error))
        _ = nghttp2_session_terminate_session(session, code.rawValue)
    }

    /// nghttp2 returned a fatal error: the session is unusable (its documentation: close the connection). The
    /// GOAWAY is written by hand after the whole frames already handed out, so the client learns why.
    func failFatally(_ code: Int32) {
        isDead = true
        let cause: HTTP2ConnectionError.Cause
        let goaway: HTTP2ErrorCode?
        switch code {
        case NGHTTP2_ERR_FLOODED.rawValue:
            (cause, goaway) = (.limit(.outboundFlood), .enhanceYourCalm)
        case NGHTTP2_ERR_TOO_MANY_CONTINUATIONS.rawValue:
            (cause, goaway) = (.limit(.continuationFlood), .enhanceYourCalm)
        case NGHTTP2_ERR_BAD_CLIENT_MAGIC.rawValue:
            // RFC 9113 §3.4: a GOAWAY MAY be omitted for an invalid preface; the peer may not speak HTTP/2 at all.
            (cause, goaway) = (.protocolViolation, nil)
        default:
            (cause, goaway) = (.internalFailure, .internalError)
        }
        if connectionError == nil {
            let error = HTTP2ConnectionError(cause: cause, code: goaway ?? .protocolError, detail: Self.libraryError(code))
            connectionError = error
            events.append(.connectionError(error))
        }
        if let goaway {
            goawayTail = Self.goawayFrame(lastStreamID: nghttp2_session_get_last_proc_stream_id(session), code: goaway)
        }
    }

    /// A GOAWAY frame (RFC 9113 §6.8): 8 bytes of payload, stream 0, no debug data.
    static func goawayFrame(lastStreamID: HTTP2StreamID, code: HTTP2ErrorCode) -> [UInt8] {
        let last = UInt32(bitPattern: lastStreamID) & 0x7fff_ffff
        return [0, 0, 8, 0x07, 0, 0, 0, 0, 0,
                UInt8(last >> 24), UInt8(last >> 16 & 0xff), UInt8(last >> 8 & 0xff), UInt8(last & 0xff),
                UInt8(code.rawValue >> 24), UInt8(code.rawValue >> 16 & 0xff), UInt8(code.rawValue >> 8 & 0xff),
                UInt8(code.rawValue & 0xff)]
    }

    /// `:status` and the fields as nghttp2 name/value pairs over one buffer; each field checked first, unless
    /// `source` says the checks hold already (debug builds check those too, and stop on a field that fails).
    func withHeaderList(status: String, fields: [HTTPField], from source: HTTP2FieldSource,
                        _ body: (UnsafePointer<nghttp2_nv>, Int) -> Int32) throws(HTTP2SessionError) -> Int32 {
        // By index, here and below: `for field in fields` copied each field (a retain and a release per string) around
        // the calls in its body.
        switch source {
        case .unchecked:
            for i in fields.indices {
                if let problem = HTTP2ResponseTranslation.problem(with: fields[i]) { throw .invalidField(problem) }
            }
        case .translatedFromHTTP1Head:
            assert(fields.indices.allSatisfy { HTTP2ResponseTranslation.problem(with: fields[$0]) == nil },
                   "a field translated from a checked HTTP/1.1 head fails the HTTP/2 field checks")
        }
        return Self.withNameValues(pseudo: [(":status", status)], fields: fields, body)
    }

    /// `pseudo` (in order), then `fields`, as the name/value list nghttp2 takes (it copies them before returning).
    /// Every byte goes into one temporary buffer and the list into another, on the stack when they are small: no
    /// intermediate array of pairs, no copy per field.
    static func withNameValues(pseudo: [(String, String)], fields: [HTTPField],
                               _ body: (UnsafePointer<nghttp2_nv>, Int) -> Int32) -> Int32 {
        let count = pseudo.count + fields.count
        var size = 0
        for (name, value) in pseudo { size += name.utf8.count + value.utf8.count }
        for i in fields.indices { size += fields[i].name.utf8.count + fields[i].value.utf8.count }
        return withUnsafeTemporaryAllocation(of: UInt8.self, capacity: max(size, 1)) { storage in
            withUnsafeTemporaryAllocation(of: nghttp2_nv.self, capacity: max(count, 1)) { list in
                var offset = 0
                var index = 0
                func add(_ name: String, _ value: String) {
                    let n = put(name, storage, &offset)
                    let v = put(value, storage, &offset)
                    list.initializeElement(at: index, to: nghttp2_nv(
                        name: n.start, value: v.start, namelen: n.count, valuelen: v.count,
                        flags: UInt8(NGHTTP2_NV_FLAG_NONE.rawValue)))
                    index += 1
                }
                for (name, value) in pseudo { add(name, value) }
                for i in fields.indices { add(fields[i].name, fields[i].value) }
                defer { list.baseAddress!.deinitialize(count: index) }
                return body(UnsafePointer(list.baseAddress!), count)
            }
        }
    }

    /// Copies `text`'s UTF-8 into `storage` at `offset` (advanced past it).
    private static func put(_ text: String, _ storage: UnsafeMutableBufferPointer<UInt8>,
                            _ offset: inout Int) -> (start: UnsafeMutablePointer<UInt8>, count: Int) {
        let start = storage.baseAddress! + offset
        let count = text.withUTF8Bytes { bytes in
            if let base = bytes.baseAddress { start.update(from: base, count: bytes.count) }
            return bytes.count
        }
        offset += count
        return (start, count)
    }

    static func libraryError(_ code: Int32) -> String {
        String(cString: nghttp2_strerror(code))
    }

    static func libraryError(_ code: Int) -> String {
        libraryError(Int32(truncatingIfNeeded: code))
    }

    /// CLOCK_MONOTONIC in nanoseconds: the default clock of the flood budgets.
    public static func monotonicNanoseconds() -> UInt64 {
        var ts = timespec()
        clock_gettime(CLOCK_MONOTONIC, &ts)
        return UInt64(ts.tv_sec) &* 1_000_000_000 &+ UInt64(ts.tv_nsec)
    }
}
