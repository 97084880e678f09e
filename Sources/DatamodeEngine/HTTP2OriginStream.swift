import CDatamodeShims
import CLibevent
import DatamodeHTTP
import DatamodeHTTP2

/// One request of an exchange to an origin that chose h2 (SPEC §17 "Origin side"): the mirror of `HTTP2Stream`.
///
/// The exchange does not know: its `UpstreamConnection` is one end of a bufferevent pair instead of a socket, and
/// this type holds the other end. The HTTP/1.1 request the exchange wrote is read back strictly (`HTTP1Parser`,
/// `BodyFraming`, `ChunkedElements`), translated (`HTTP2OriginRequestTranslation`) and sent as a stream of the
/// shared `HTTP2OriginSession`; the origin's answer comes back as an HTTP/1.1 response framed by what the origin said
/// (`content-length` when it gave one, chunked otherwise, its trailers in the last chunk), so the exchange's own
/// strict response path reads it and a cut response is never presented as whole: a reset, or the connection lost,
/// ends the pair before the framing does (`UpstreamConnection.originStreamFailed`). Its heads skip the text when the
/// exchange's parser would read them back unchanged (`HeadHandoff`, `passHead`): handed over in memory, in order.
///
/// Backpressure both ways: request bytes are taken from the pair only while the codec's queue for the stream is
/// below its watermark (`requestBodyDrained` resumes); response bytes are given back to the origin's windows only
/// once the pair moved them into the exchange's input, whose watermark stops it.
final class HTTP2OriginStream {
    /// Held strongly: a closing session outlives the pool's hold for as long as a stream's exchange has not let go.
    let session: HTTP2OriginSession
    /// This stream's end of the pair (nil once freed).
    private var end: OpaquePointer?
    /// The exchange's side (nil once it let go). Not reference-counted: a weak reference gave every
    /// `UpstreamConnection` of an h2 origin a side table, and each of its retains and releases went the slow way (issue
    /// 31, perf of the HTTPS 100 KiB row: `incrementSlow`/`doDecrementSlow` ~1% of the proxy's CPU). The connection
    /// outlives this reference: the worker holds every `UpstreamConnection` until its `close`, and `close` clears it
    /// first (`upstreamReleased`); the worker closes its connections before its origin sessions.
    private unowned(unsafe) var upstream: UpstreamConnection?
    /// The stream's id once started.
    private(set) var id: HTTP2StreamID?

    private enum RequestPhase {
        case head
        /// Translated, waiting for the origin's concurrency to let it start.
        case waiting(HTTP2OriginRequest, BodyFraming)
        case body(BodyFraming, remaining: UInt64, decoder: ChunkedDecoder)
        /// Sent whole (or given up).
        case over
    }
    private var request = RequestPhase.head
    /// The request head the exchange handed over in memory (`take`) in place of its text: read from the loop, as
    /// the text would have been, before the pair's input (which has the body behind it).
    private var handedHead: RequestHead?
    /// The method: a response to HEAD has no body whatever its fields say.
    private var method = ""
    /// The codec's queue for this stream is full: read no more request bytes until `requestBodyDrained`.
    private var requestPaused = false
    /// A request without a body, kept while it may go again: an origin that refuses a stream (REFUSED_STREAM, RFC
    /// 9113 §8.7: it did nothing with it) gets it again on this connection, at most `Self.maxRetries` times.
    private var bodyless: (HTTP2OriginRequest, BodyFraming)?
    private var retries = 0
    static let maxRetries = 3

    private enum ResponsePhase {
        case head
        case body(chunked: Bool)
        case over
    }
    private var response = ResponsePhase.head
    /// An interim head (`100`, `103`) came: the origin acted on the request, whatever it says next (a REFUSED_STREAM,
    /// a GOAWAY below this stream), so it is not sent again (RFC 9113 §8.7 allows that only for a request the origin
    /// did nothing with), and the client never gets a second attempt's interim heads behind the first's.
    private var interimReceived = false
    /// A response head went to the exchange as text: the ones after it go the same way (`passHead`).
    private var headsWritten = false
    /// A response body with `content-length`: its last byte waits for END_STREAM (`LengthDelimitedBody`): DATA past
    /// `content-length` in a later frame makes the response malformed (RFC 9113 §8.1.1), and by then the client
    /// must not have it whole.
    private var lengthDelimited: LengthDelimitedBody?
    /// Response body bytes written to the pair and not yet given back to the origin's windows.
    private var unconsumed = 0
    /// What this stream writes for its exchange during one of the session's rounds of events
    /// (`HTTP2OriginSession.inRound`), moved to the pair at the end of it (`flushStaged`): the origin's DATA come in
    /// pieces (a frame split across TLS records, 8 KiB frames from nginx), and each piece written to the pair was a
    /// chain of its own, moved on at once (a transfer and a deferred callback each) and encrypted for the client as a
    /// TLS record of its own (15.9 `SSL_write` per 100 KiB answer against 3.0 from an HTTP/1.1 origin). Staged, the
    /// pieces fill chains of `Self.stagingChain` bytes: the same one copy, a move per read, records of full size.
    private var staged: OpaquePointer?
    /// Bytes the last staged chain still takes (at least): a piece that does not fit fills it and starts a new one.
    private var stagedRoom = 0
    /// Listed in the session's staged streams for this round of events.
    private var stagedListed = false
    /// A TLS record's plaintext, less libevent's chain header, so that the chain is a 16 KiB allocation. 32 KiB chains
    /// made as few records but held 500-700 KiB more at the peak of an 8 MB answer to a slow reader (rounding and the
    /// part-filled chain each read leaves).
    static let stagingChain = 16 * 1024 - 64

    /// The largest request head read back (the exchange wrote it; its own limits already applied).
    static let requestLimits = HTTPLimits(requestLine: 64 * 1024, headerSection: 256 * 1024, headerCount: 1000)

    /// The length of `head`'s text when this stream's parser would read exactly `head` back from it (`HeadHandoff`,
    /// with `requestLimits`): the head may be handed over in memory (`take`). nil: it goes as the text, and the
    /// parser answers it (refuses it, as before).
    ///
    /// Only the limits are checked (`HeadHandoff.Source.checkedParts`): `head` is the exchange's forwarded head
    /// (`MessageHeads.forwardedRequest`), every part of it known good by how it was made: the client's method and
    /// fields were read by `HTTP1Parser` or handed over from an h2 client's stream as `checkedParts`, the target and
    /// `Host` come from a parsed `RequestTarget`, and the rest is the proxy's constants and numbers.
    /// `HandoffSourceTests` holds it on random and mutated client heads; debug builds check the bytes too.
    static func handedLength(of head: RequestHead) -> Int? {
        HeadHandoff.request(head, limits: requestLimits, maxHeadBytes: requestLimits.maxRequestHeadBytes,
                            from: .checkedParts)
    }

    init(session: HTTP2OriginSession, end: OpaquePointer, upstream: UpstreamConnection) {
        self.session = session
        self.end = end
        self.upstream = upstream
        bufferevent_setcb(end, http2OriginStreamReadCallback, http2OriginStreamWriteCallback, nil, context(self))
        bufferevent_setwatermark(end, Int16(EV_READ), 0, Flow.highWater)
        bufferevent_setwatermark(end, Int16(EV_WRITE), 0, 0)
        bufferevent_enable(end, Int16(EV_READ | EV_WRITE))
    }

    // MARK: the request

    /// The exchange wrote more of its request.
    func requestReadable() {
        guard let end, !requestPaused else { return }
        let input = bufferevent_get_input(end)!
        while !requestPaused {
            switch request {
            case .head:
                guard readHead(input) else { return }
            case .waiting:
                return
            case .body(let framing, let remaining, var decoder):
                guard readBody(input, framing, remaining, &decoder) else { return }
            case .over:
                evbuffer_drain(input, evbuffer_get_length(input))
                return
            }
        }
    }

    /// The exchange hands its request head over in memory (`UpstreamConnection.handRequestHead`): the head its text
    /// would parse to (`HeadHandoff`, with `requestLimits`). Taken only while no head has come yet and nothing of
    /// the request waits in the pair (`pairEmpty`: the exchange's side; then this side's input), so that it comes
    /// first, as its text would; false otherwise, and the exchange writes the text.
    func take(_ head: RequestHead, pairEmpty: Bool) -> Bool {
        guard pairEmpty, let end, case .head = request, handedHead == nil,
              evbuffer_get_length(bufferevent_get_input(end)) == 0 else { return false }
        handedHead = head
        // Read from the loop, as the text would have been (the pair defers its callbacks).
        bufferevent_trigger(end, Int16(EV_READ), Int32(BEV_TRIG_IGNORE_WATERMARKS.rawValue | BEV_TRIG_DEFER_CALLBACKS.rawValue))
        return true
    }

    private func readHead(_ input: OpaquePointer) -> Bool {
        if let head = handedHead {
            handedHead = nil
            return begin(head)
        }
        let limits = Self.requestLimits
        let parsed = FrontParse.parse(input, limit: limits.maxRequestHeadBytes, incomplete: .incomplete,
                                      isIncomplete: { if case .incomplete = $0 { true } else { false } }) {
            HTTP1Parser.parseRequestHead($0, limits: limits)
        }
        switch parsed {
        case .incomplete:
            return false
        case .invalid(let error):
            refuse("the exchange's request head is not valid HTTP/1.1: \(error)")
            return false
        case .complete(let head, let length):
            evbuffer_drain(input, length)
            return begin(head)
        }
    }

    /// The request's head, read back (`HTTP1Parser`) or handed over (`HeadHandoff.request`): framed, translated
    /// (its fields need no second check), and ready to start.
    private func begin(_ head: RequestHead) -> Bool {
        method = head.method
        guard case .success(let framing) = head.bodyFraming() else {
            refuse("the exchange's request is not framed")
            return false
        }
        let authority = session.key.port == 443 ? session.key.host : "\(session.key.host):\(session.key.port)"
        switch HTTP2OriginRequestTranslation.request(of: head, defaultAuthority: authority, from: .translatedFromHTTP1Head) {
        case .failure(let error):
            refuse("the request cannot go out in HTTP/2: \(error)")
            return false
        case .success(let translated):
            request = .waiting(translated, framing)
            session.streamReady(self)
            return true
        }
    }

    /// The session has room for this stream: HEADERS go out, then the body.
    func start() -> Bool {
        guard case .waiting(let translated, let framing) = request else { return false }
        let endStream: Bool
        switch framing {
        case .none, .contentLength(0): endStream = true
        default: endStream = false
        }
        do throws(HTTP2SessionError) {
            id = try session.codec.startRequest(method: translated.method, scheme: "https",
                                                authority: translated.authority, path: translated.path,
                                                fields: translated.fields, endStream: endStream, checked: true)
        } catch {
            refuse("the request cannot go out in HTTP/2: \(error)")
            return false
        }
        if endStream {
            request = .over
            bodyless = (translated, framing)
        } else {
            let remaining: UInt64
            if case .contentLength(let length) = framing { remaining = length } else { remaining = 0 }
            request = .body(framing, remaining: remaining,
                            decoder: ChunkedDecoder(maxLineLength: 4096, maxTrailerSection: Self.requestLimits.headerSection))
        }
        requestReadable()
        // Its body may go now (it waited for the origin's concurrency, perhaps): the client connection's bound may
        // have been holding back nothing but this stream's next bytes (`HTTP2Stream.starvesForRequestBody`).
        requestBodyMoved()
        return true
    }

    /// Relays request body bytes; false when more are needed, the codec said stop, or the body is over.
    private func readBody(_ input: OpaquePointer, _ framing: BodyFraming, _ remaining: UInt64,
                          _ decoder: inout ChunkedDecoder) -> Bool {
        switch framing {
        case .contentLength:
            let available = evbuffer_get_length(input)
            guard available > 0 else { return false }
            let n = Int(min(UInt64(available), remaining))
            guard send(input, count: n) else { return false }
            let left = remaining - UInt64(n)
            request = .body(framing, remaining: left, decoder: decoder)
            if left == 0 { finishRequest(trailers: []) }
            return left != 0
        case .chunked:
            switch ChunkedElements.next(input, &decoder) {
            case .data(let n):
                guard send(input, count: n) else { return false }
                decoder.consumeData(n)
                request = .body(framing, remaining: 0, decoder: decoder)
                return true
            case .framing:
                request = .body(framing, remaining: 0, decoder: decoder)
                return true
            case .end(let trailers):
                finishRequest(trailers: HTTP2ResponseTranslation.trailerFields(trailers))
                return false
            case .needMore:
                return false
            case .invalid(let error):
                refuse("the exchange's chunked request body is invalid: \(error)")
                return false
            }
        case .none, .untilClose:
            finishRequest(trailers: [])
            return false
        }
    }

    private func send(_ input: OpaquePointer, count: Int) -> Bool {
        guard count > 0, let id, let start = evbuffer_pullup(input, count) else { return count == 0 }
        let more: Bool
        do throws(HTTP2SessionError) {
            more = try session.codec.sendRequestBody(id, UnsafeRawBufferPointer(start: start, count: count))
        } catch {
            refuse("the request body cannot go out: \(error)")
            return false
        }
        evbuffer_drain(input, count)
        if !more { requestPaused = true }
        return true
    }

    private func finishRequest(trailers: [HTTPField]) {
        request = .over
        guard let id else { return }
        do throws(HTTP2SessionError) {
            try session.codec.finishRequest(id, trailers: trailers)
        } catch {
            refuse("the request end cannot go out: \(error)")
        }
    }

    /// The codec's queue for the request body drained: read on.
    func requestBodyDrained() {
        guard requestPaused else { return }
        requestPaused = false
        requestReadable()
    }

    /// Request bytes this stream holds for the origin: in its end of the pair, and queued in the codec. Part of what an
    /// HTTP/2 client's connection counts against its bound (`HTTP2Session.settleConnectionWindow`).
    var heldRequestBytes: Int {
        var held = end.map { evbuffer_get_length(bufferevent_get_input($0)) } ?? 0
        if let id { held += session.codec.bufferedRequestBytes(id) }
        return held
    }

    /// Whether the origin would take more of the request body now: it is under way, the codec's queue did not say
    /// stop, and the origin's windows (the stream's and the connection's) are open.
    var takesRequestBytesNow: Bool {
        guard let id, case .body = request, !requestPaused else { return false }
        return session.codec.requestWindowOpen(id)
    }

    /// Request bytes left the codec's queue for the origin, or the origin opened a window (`requestBodySent`,
    /// `sendWindowOpened`): the exchange's client connection, if HTTP/2, looks at its bound again.
    func requestBodyMoved() {
        upstream?.requestBodyMoved()
    }

    /// The request cannot go to the origin as it is: the stream (if started) is reset and the exchange fails.
    private func refuse(_ detail: String) {
        request = .over
        response = .over
        if let id { session.codec.resetStream(id, code: .internalError) }
        session.worker.logger.debug("http2 origin stream refused", metadata: ["origin": "\(session.key.host)", "detail": "\(detail)"])
        upstream?.originStreamFailed(detail, unprocessed: false)
    }

    // MARK: the response

    func informational(status: Int, fields: [HTTPField]) {
        guard case .head = response else { return }
        interimReceived = true
        passHead(status: status, fields: fields, framing: nil)
    }

    func responseHead(status: Int, fields: [HTTPField], endStream: Bool) {
        guard case .head = response else { return }
        let lengthField = fields.first { $0.name == "content-length" }
        if method == "HEAD" || status == 204 || status == 304 {
            passHead(status: status, fields: fields, framing: nil)
            response = .over
        } else if endStream {
            passHead(status: status, fields: fields, framing: lengthField != nil ? nil : HTTPField(name: "content-length", value: "0"))
            response = .over
        } else if let lengthField {
            passHead(status: status, fields: fields, framing: nil)
            lengthDelimited = UInt64(lengthField.value).map { LengthDelimitedBody(length: $0) }
            response = .body(chunked: false)
        } else {
            passHead(status: status, fields: fields, framing: HTTPField(name: "transfer-encoding", value: "chunked"))
            response = .body(chunked: true)
        }
    }

    func responseBody(_ bytes: UnsafeRawBufferPointer) {
        guard case .body(let chunked) = response, end != nil else {
            if let id { session.codec.consumeResponseBody(id, count: bytes.count) }
            return
        }
        guard !bytes.isEmpty else { return }
        if chunked { write(String(bytes.count, radix: 16) + "\r\n") }
        // With `content-length`, the body's last byte is held until END_STREAM says nothing more follows
        // (`responseEnded`).
        let count = lengthDelimited?.writable(bytes) ?? bytes.count
        write(UnsafeRawBufferPointer(rebasing: bytes.prefix(count)))
        if chunked { write("\r\n") }
        unconsumed += bytes.count
    }

    /// END_STREAM: a chunked body gets its last chunk and the trailers (with `content-length` they are dropped:
    /// HTTP/1.1 carries trailers only in a chunked body, RFC 9110 §6.5 lets a recipient discard them).
    func responseEnded(trailers: [HTTPField]) {
        guard case .body(let chunked) = response else { return }
        response = .over
        if let byte = lengthDelimited?.release() { withUnsafeBytes(of: byte) { write($0) } }
        guard chunked else { return }
        var tail = "0\r\n"
        for field in trailers where HTTP2ResponseTranslation.problem(with: field) == nil {
            tail += field.name + ": " + field.value + "\r\n"
        }
        tail += "\r\n"
        write(tail)
    }

    /// The pair moved what was written into the exchange's input: the origin may send as much again.
    func responseMovedOn() {
        guard unconsumed > 0, let id else { return }
        let count = unconsumed
        unconsumed = 0
        session.codec.consumeResponseBody(id, count: count)
        session.responseBytesMayHaveMoved()
    }

    /// Response bytes the origin sent on this stream that its exchange has not taken yet (they wait in the pair).
    var unconsumedResponseBytes: Int { unconsumed }

    /// A response head for the exchange, `framing` (the field that delimits the body, when the origin's fields do
    /// not) last. Handed over in memory when the exchange's parser would read back exactly that head from its text
    /// (`HeadHandoff`), else written as the text, for the parser to answer (a field it refuses is a `502`, as from
    /// any origin). Once one head went as text, the later ones (a final head after a `103`) go the same way: heads
    /// are read handed first, then from the pair.
    ///
    /// Every part is known good (`HeadHandoff.Source.checkedParts`), so only the limits are checked: the codec
    /// refused any response field that is not a lowercase token with a value `FieldBytes.checkValue` accepts
    /// (`HTTP2ClientSession.header`), the status is 100–999, the reason comes from `reason(_:)`'s table and the
    /// framing field is one of two constants.
    private func passHead(status: Int, fields: [HTTPField], framing: HTTPField?) {
        var fields = fields
        if let framing { fields.append(framing) }
        let head = ResponseHead(version: .http11, status: status, reason: Self.reason(status), fields: fields)
        if !headsWritten, let upstream,
           let length = HeadHandoff.response(head, limits: Flow.responseLimits, maxHeadBytes: Flow.maxResponseHeadBytes,
                                             from: .checkedParts) {
            upstream.handResponseHead(head, length: length)
            return
        }
        headsWritten = true
        writeHead(head)
    }

    /// The head as HTTP/1.1 text, written as it is (nothing checked: the exchange's parser reads it).
    private func writeHead(_ head: ResponseHead) {
        var text: [UInt8] = []
        text.reserveCapacity(64 + head.fields.reduce(0) { $0 + $1.name.utf8.count + $1.value.utf8.count + 4 })
        text.append(contentsOf: "HTTP/1.1 ".utf8)
        text.append(contentsOf: String(head.status).utf8)
        text.append(0x20)
        text.append(contentsOf: head.reason.utf8)
        text.append(contentsOf: [0x0D, 0x0A])
        for field in head.fields {
            text.append(contentsOf: field.name.utf8)
            text.append(contentsOf: [0x3A, 0x20])
            text.append(contentsOf: field.value.utf8)
            text.append(contentsOf: [0x0D, 0x0A])
        }
        text.append(contentsOf: [0x0D, 0x0A])
        text.withUnsafeBytes { write($0) }
    }

    private func write(_ text: String) {
        var text = text
        text.withUTF8 { write(UnsafeRawBufferPointer($0)) }
    }

    private func write(_ bytes: UnsafeRawBufferPointer) {
        guard let end, let base = bytes.baseAddress, bytes.count > 0 else { return }
        guard session.handlingEvents else {
            // Outside a round of events nothing would move staged bytes on: they go first, then these, at once.
            flushStaged()
            _ = evbuffer_add(bufferevent_get_output(end), base, bytes.count)
            return
        }
        let buffer: OpaquePointer
        if let staged { buffer = staged } else { buffer = evbuffer_new()!; staged = buffer }
        if !stagedListed {
            stagedListed = true
            session.stage(self)
        }
        var offset = 0
        while offset < bytes.count {
            if stagedRoom == 0 {
                // A fresh chain: the last one is full (or none is there yet), so libevent adds one, copying nothing.
                let size = max(Self.stagingChain, bytes.count - offset)
                guard evbuffer_expand(buffer, size) == 0 else { break }
                stagedRoom = size
            }
            let n = min(stagedRoom, bytes.count - offset)
            _ = evbuffer_add(buffer, base + offset, n)
            stagedRoom -= n
            offset += n
        }
        if offset < bytes.count {
            _ = evbuffer_add(buffer, base + offset, bytes.count - offset)
            stagedRoom = 0
        }
    }

    /// The round of events is over (or the stream breaks off): what it staged goes to the pair, in one move.
    func flushStaged() {
        stagedListed = false
        stagedRoom = 0
        guard let staged, evbuffer_get_length(staged) > 0 else { return }
        guard let end else {
            evbuffer_drain(staged, evbuffer_get_length(staged))
            return
        }
        evbuffer_add_buffer(bufferevent_get_output(end), staged)
    }

    /// A reason phrase for the status line the exchange reads (HTTP/2 has none; RFC 9112 §4 lets it be anything).
    static func reason(_ status: Int) -> String {
        switch status {
        case 100: "Continue"
        case 103: "Early Hints"
        case 200: "OK"
        case 201: "Created"
        case 202: "Accepted"
        case 204: "No Content"
        case 206: "Partial Content"
        case 301: "Moved Permanently"
        case 302: "Found"
        case 304: "Not Modified"
        case 307: "Temporary Redirect"
        case 308: "Permanent Redirect"
        case 400: "Bad Request"
        case 403: "Forbidden"
        case 404: "Not Found"
        case 429: "Too Many Requests"
        case 500: "Internal Server Error"
        case 502: "Bad Gateway"
        case 503: "Service Unavailable"
        default: "Status"
        }
    }

    // MARK: ends

    /// The codec closed the stream. A response not complete by then was cut (a reset, or the origin's GOAWAY left
    /// it unprocessed): what was written reaches the exchange, then the exchange hears the break.
    func closed(_ end: HTTP2StreamEnd) {
        let streamID = id
        id = nil
        request = .over
        let headWritten: Bool
        switch response {
        case .over: return
        case .head: headWritten = false
        case .body: headWritten = true
        }
        response = .over
        let detail: String
        var unprocessed = false
        switch end {
        case .completed:
            detail = "the origin ended the HTTP/2 stream before its response was complete"
        case .resetByClient(let code):
            // REFUSED_STREAM (RFC 9113 §8.7): the origin did nothing with it; it may go again. nghttp2 also closes
            // the streams above a GOAWAY's last stream with that code (§6.8): those go again on another connection.
            unprocessed = code == .refusedStream && !headWritten && !interimReceived
            if code == .refusedStream, let streamID, let last = session.goawayLastStreamID, streamID > last {
                detail = "the origin's GOAWAY said the HTTP/2 stream was not processed (stream \(streamID), its last \(last))"
                break
            }
            detail = "the origin reset the HTTP/2 stream (\(code))"
            if unprocessed, case let (translated, framing)? = bodyless, retries < Self.maxRetries, upstream != nil {
                retries += 1
                response = .head
                request = .waiting(translated, framing)
                session.streamReady(self)
                return
            }
        case .resetByProxy(let code):
            detail = "the origin's response broke HTTP/2's rules; the stream was reset (\(code))"
        }
        breakOff(detail, unprocessed: unprocessed)
    }

    /// The connection is gone: a stream none of whose answer came may go again on a new connection (as a request
    /// on a stale keep-alive connection does).
    func connectionClosed(_ detail: String) {
        id = nil
        request = .over
        let answered: Bool
        switch response {
        case .over: return
        case .head: answered = interimReceived
        case .body: answered = true
        }
        response = .over
        breakOff(detail, unprocessed: !answered)
    }

    private func breakOff(_ detail: String, unprocessed: Bool) {
        flushStaged()
        if let end { bufferevent_flush(end, Int16(EV_WRITE), BEV_FLUSH) }
        upstream?.originStreamFailed(detail, unprocessed: unprocessed)
    }

    /// The exchange let go of its end (its exchange is over, or it gave up): a stream still open is cancelled.
    func upstreamReleased() {
        upstream = nil
        if let id {
            self.id = nil
            session.codec.resetStream(id, code: .cancel)
        }
        let wasWaiting: Bool
        if case .waiting = request { wasWaiting = true } else { wasWaiting = false }
        request = .over
        response = .over
        session.streamReleased(self, wasWaiting: wasWaiting)
        if let staged {
            self.staged = nil
            evbuffer_free(staged)
        }
        guard let end else { return }
        self.end = nil
        bufferevent_free(end)
    }
}
