import CDatamodeShims
import CLibevent
import DatamodeHTTP
import DatamodeHTTP2

/// One HTTP/2 stream of a client connection (SPEC §17), carried to its exchange as an HTTP/1.1 message.
///
/// Every stream is an exchange of the engine: an `HTTP1Session` of its own, whose transport reads and writes two
/// buffers this type owns (`ClientTransport(stream:)`): the session's input, which this type fills, and its output,
/// which this type empties. Their changes are reported from the loop (evbuffer callbacks deferred to it), as a
/// bufferevent's would be; no socket, no bufferevent. The request the codec
/// translated strictly (`HTTP2Request`) goes in as an HTTP/1.1 request for the tunnel's authority, framed by the
/// stream (`content-length` when the client declared it, chunked otherwise), so tags, rules, the decision,
/// variants, Save-Data, sessions, budgets, shaping, manifests and images, the access log and metrics are the
/// HTTP/1 path's, unchanged. The answer comes back as the HTTP/1.1 response the session wrote, is read strictly
/// (`HTTP1Parser`, `BodyFraming`, `ChunkedDecoder`) and handed to the codec as HEADERS and DATA; a head relayed from
/// the origin skips the text when the parser would read it back unchanged (`take`, `HeadHandoff`). This is the shape
/// of HAProxy 1.8's HTTP/2 (a mux that turned streams into HTTP/1 messages for the analysers behind it); the cost is
/// a session per stream, the bodies' HTTP/1.1 framing, and the heads that cannot skip their text.
///
/// Backpressure both ways (SPEC §17 "flow control is backpressure"):
/// - request body: DATA is written to the session's input; its bytes are given back to the stream's window
///   (`consumeStreamWindow`) only while that input is below its read watermark (`Flow.highWater`), so a client faster
///   than the origin fills its window and waits. Their share of the connection window is the connection's to give
///   back (`HTTP2Session.settleConnectionWindow`): only while all its streams hold less than its bound inside the
///   proxy (`heldRequestBytes`: this input, and everything queued towards the origin behind it), since every buffer
///   on the way keeps to its own watermark but a hundred streams' buffers do not keep the connection to anything;
/// - response body: the codec's queue says when to stop taking the session's output (`sendResponseBody` false) and
///   when to go on (`resumeResponse`); meanwhile the output fills, and its watermark stops the session reading the
///   origin.
///
/// A response is complete only when its framing says so: a length met, a last chunk, or the session ending cleanly
/// after a close-delimited body. Anything else resets the stream: a cut response is never presented as whole.
final class HTTP2Stream {
    /// The connection; it holds this stream (`HTTP2Session.streams`) for as long as either side is open.
    unowned let connection: HTTP2Session
    let id: HTTP2StreamID
    /// The request's method: a response to HEAD has no body whatever its fields say.
    let method: String
    /// The session's input: the request as HTTP/1.1 (nil before `start` and once freed).
    private var exchangeInput: OpaquePointer?
    /// The session's output: its HTTP/1.1 response, relayed from here (nil before `start` and once freed).
    private var exchangeOutput: OpaquePointer?
    /// The exchange's session (nil once it ended).
    private(set) var session: HTTP1Session?
    /// The request body goes in chunked (no `content-length` from the client).
    private var requestChunked = false
    /// A body with `content-length`: its last byte waits for END_STREAM (`LengthDelimitedBody`): DATA past
    /// `content-length` in a later frame is a stream error (RFC 9113 §8.1.1), and by then the exchange must not have
    /// forwarded a whole request.
    private var lengthDelimited: LengthDelimitedBody?
    /// Request body bytes written to the session's input and not yet given back to the client's windows.
    private var unconsumed = 0
    /// The client ended the request (END_STREAM): nothing more of its body comes.
    private var requestEndedByClient = false

    private enum ResponsePhase {
        /// Waiting for the response head (1xx heads are relayed as they come).
        case head
        case body(BodyFraming, remaining: UInt64, decoder: ChunkedDecoder)
        /// Complete, or given up (the stream was reset).
        case over
    }
    private var phase = ResponsePhase.head
    /// The codec's queue for this stream is full: read nothing more until `resumeResponse`.
    private var paused = false
    /// The session let go of the buffers: nil while it runs, then whether it ended cleanly (a close-delimited body is
    /// complete only then).
    private var sessionEnd: Bool?
    /// Inside `take`: the exchange handing its head in is on the stack.
    private var handing = false

    init(connection: HTTP2Session, id: HTTP2StreamID, method: String) {
        self.connection = connection
        self.id = id
        self.method = method
    }

    // MARK: the request

    /// Makes the buffers and the exchange's session, and gives it the request head. False when no buffer could be
    /// made.
    func start(_ request: HTTP2Request, endStream: Bool) -> Bool {
        let worker = connection.worker
        guard let input = evbuffer_new() else { return false }
        guard let output = evbuffer_new() else {
            evbuffer_free(input)
            return false
        }
        exchangeInput = input
        exchangeOutput = output
        // Their callbacks run from the loop, never inside the call that changed them (see `CallbackNesting`).
        evbuffer_defer_callbacks(input, worker.base)
        evbuffer_defer_callbacks(output, worker.base)
        evbuffer_add_cb(input, http2StreamInputCallback, context(self))
        evbuffer_add_cb(output, http2StreamOutputCallback, context(self))

        requestEndedByClient = endStream
        // The head as HTTP/1.1 (CONNECT, RFC 9113 §8.5, in authority-form, for admission to refuse as inside any
        // interception); a body without a length goes chunked.
        if !endStream, let length = request.contentLength, length > 0 { lengthDelimited = LengthDelimitedBody(length: length) }
        requestChunked = !endStream && request.contentLength == nil
        let head = request.requestHead(chunked: requestChunked)

        let session = HTTP1Session(worker: worker, stream: self, input: input, output: output,
                                   peerAddress: connection.peerAddress, peerText: connection.peerText,
                                   tunnel: connection.tunnel, transparent: connection.transparent)
        self.session = session
        // The head goes in memory when the session's parser would read exactly it back from its text, within the
        // session's limits (`HeadHandoff`); otherwise as the text, and the parser answers it (a 431, a 400).
        let settings = worker.settings
        if HeadHandoff.request(head, limits: settings.limits, maxHeadBytes: settings.maxHeadBytes,
                               from: .checkedParts) != nil {
            session.handedHead = head
            session.start()
            // Read now, as the session's read callback would: the connection calls this from its own read callback,
            // once the codec returned (never inside nghttp2).
            session.clientReadable()
            session.flushPendingWrites()
        } else {
            write(head)
            session.start()
        }
        return true
    }

    /// The request head as HTTP/1.1 text, written as it is (the session's parser reads it).
    private func write(_ head: RequestHead) {
        var text = head.method + " " + head.target + " HTTP/1.1\r\n"
        for field in head.fields {
            text += field.name
            text += ": "
            text += field.value
            text += "\r\n"
        }
        text += "\r\n"
        write(text)
    }

    func requestBody(_ bytes: [UInt8]) {
        var responded = false
        if case .over = phase { responded = true }
        guard exchangeInput != nil, session != nil, !responded else {
            // Nobody reads it any more: give the windows back at once.
            connection.codec.consumeRequestBody(id, count: bytes.count)
            return
        }
        if requestChunked {
            guard !bytes.isEmpty else { return }
            write(String(bytes.count, radix: 16) + "\r\n")
            write(bytes)
            write("\r\n")
        } else {
            // With `content-length`, the body's last byte is held until END_STREAM says nothing more follows
            // (`requestEnded`).
            write(bytes, count: lengthDelimited?.writable(bytes) ?? bytes.count)
        }
        unconsumed += bytes.count
    }

    /// END_STREAM: a chunked body gets its last chunk, and the trailers if any (HTTP/1.1 carries trailers only in
    /// a chunked body; with `content-length` they are dropped, RFC 9110 §6.5 lets a recipient discard them).
    func requestEnded(trailers: [HTTPField]) {
        requestEndedByClient = true
        if let byte = lengthDelimited?.release() { write([byte]) }
        guard requestChunked, exchangeInput != nil else { return }
        var tail = "0\r\n"
        for field in trailers { tail += field.name + ": " + field.value + "\r\n" }
        tail += "\r\n"
        write(tail)
    }

    /// The session's input changed: while it is below its read watermark, the client may send as much again as
    /// was written to it on this stream (its window); the connection's window follows as the connection's bound
    /// allows (`HTTP2Session.settleConnectionWindow`).
    func requestBodyMovedOn() {
        giveBackStreamWindow()
        connection.requestBytesMayHaveLeft()
    }

    /// Gives the bytes written to the session's input back to the stream's window, while that input is below its read
    /// watermark; while the connection's stream windows are squeezed (`HTTP2Session.settleStreamWindows`), only
    /// while the stream holds less than a squeezed window inside the proxy, so a stream whose origin stalled stops
    /// taking bytes at about that, and one whose origin takes them goes on.
    func giveBackStreamWindow() {
        guard unconsumed > 0, let exchangeInput, evbuffer_get_length(exchangeInput) < Flow.highWater else { return }
        if connection.streamWindowsSqueezed && heldRequestBytes >= Int(HTTP2ServerSession.squeezedStreamWindow) { return }
        let count = unconsumed
        unconsumed = 0
        connection.codec.consumeStreamWindow(id, count: count)
    }

    /// Request bytes of the exchange left the proxy's buffers behind its input (or may now: an h2 origin opened a
    /// window): the connection looks at its bound again.
    func requestBodyMovedDownstream() {
        connection.requestBytesMayHaveLeft()
    }

    /// Request body bytes of this stream inside the proxy: in the session's input, and queued towards the origin by
    /// its exchange (the upstream's output; for an h2 origin, the pair's other end and the origin codec's queue).
    var heldRequestBytes: Int {
        let queued = session?.machine.exchange?.upstream.map(Self.heldRequestBytes) ?? 0
        return (exchangeInput.map { evbuffer_get_length($0) } ?? 0) + queued
    }

    /// The exchange moved every byte the client sent on, and its origin would take more now: what the stream waits
    /// for is the client's bytes, so the connection's bound must not hold them back (`settleConnectionWindow`).
    var starvesForRequestBody: Bool {
        guard !requestEndedByClient, let session, heldRequestBytes == 0 else { return false }
        if case .over = phase { return false }
        return Self.takesRequestBytesNow(session)
    }

    /// Whether `session`'s exchange forwards to an upstream that would take request body bytes now. Not while held
    /// (SPEC §18.2) or connecting, and not while it stores the body (SPEC §18.3) or reads a refused one to throw it
    /// away: those bytes go nowhere but the proxy's own store or bin, and no other stream waits for them, so such a
    /// stream left idle by its client must not lift the connection's bound (session 17's review: one idle stored
    /// upload let 99 MiB through to a stalled origin); it waits for the bound like any other.
    private static func takesRequestBytesNow(_ session: HTTP1Session) -> Bool {
        guard case .forwarding(let driver) = session.machine.state, let upstream = driver.upstream, upstream.state == .busy
        else { return false }
        return upstream.originStream?.takesRequestBytesNow ?? true  // an h2 origin's stream: its windows open
    }

    /// Request bytes `upstream` holds, not yet out of the proxy: in its output, and for a stream of an h2 origin, in
    /// its end of the pair and the codec's queue (`HTTP2OriginStream.heldRequestBytes`).
    private static func heldRequestBytes(_ upstream: UpstreamConnection) -> Int {
        guard upstream.state != .closed else { return 0 }
        return evbuffer_get_length(upstream.output) + (upstream.originStream?.heldRequestBytes ?? 0)
    }

    private func write(_ text: String) {
        guard let exchangeInput else { return }
        text.withUTF8Bytes { _ = evbuffer_add(exchangeInput, $0.baseAddress, $0.count) }
    }

    private func write(_ bytes: [UInt8], count: Int? = nil) {
        guard let exchangeInput else { return }
        bytes.withUnsafeBytes { _ = evbuffer_add(exchangeInput, $0.baseAddress, count ?? $0.count) }
    }

    /// The stream wrote to the session's input (a head as text, body bytes, a last chunk): the session reads it.
    func exchangeInputArrived() {
        session?.transport.streamInputArrived()
    }

    /// The stream took bytes of the session's output: the session may write more (its write callback).
    func exchangeOutputTaken() {
        session?.transport.streamOutputTaken()
    }

    // MARK: the response

    /// The session wrote part of the response: relay what is whole to the codec.
    func responseReadable() {
        guard let input = exchangeOutput else { return }
        relay: while !paused {
            switch phase {
            case .over:
                evbuffer_drain(input, evbuffer_get_length(input))
                return
            case .head:
                guard readHead(input) else { break relay }
            case .body(let framing, let remaining, var decoder):
                guard readBody(input, framing, remaining, &decoder) else { break relay }
            }
        }
        settleAfterSessionEnd(input)
    }

    /// Once the session has ended and every byte it wrote went to the codec (not paused, its output empty),
    /// the response is what it is: a close-delimited body whose session ended cleanly is complete; anything else
    /// not complete by its framing was cut, and the stream is reset (never ended as if whole). Until then the bytes
    /// waiting here (the codec's queue was full when the session ended, as when a drain closes it) go out first.
    private func settleAfterSessionEnd(_ input: OpaquePointer) {
        guard let clean = sessionEnd, !paused, evbuffer_get_length(input) == 0 else { return }
        switch phase {
        case .over:
            break
        case .body(.untilClose, _, _) where clean:
            finish(trailers: [])
        default:
            phase = .over
            try? connection.codec.resetStream(id, code: .internalError)
        }
    }

    /// The codec's queue for this stream drained: read on.
    func resumeResponse() {
        guard paused else { return }
        paused = false
        responseReadable()
    }

    /// Reads one response head (1xx or final); false when more bytes are needed or the stream is over.
    private func readHead(_ input: OpaquePointer) -> Bool {
        let result = FrontParse.parse(input, limit: Flow.maxRelayedResponseHeadBytes, incomplete: .incomplete,
                                      isIncomplete: { if case .incomplete = $0 { true } else { false } }) {
            HTTP1Parser.parseResponseHead($0, limits: Flow.relayedResponseLimits)
        }
        switch result {
        case .incomplete:
            return false
        case .invalid(let error):
            fail("the exchange's response head is not valid HTTP/1.1: \(error)")
            return false
        case .complete(let head, let length):
            evbuffer_drain(input, length)
            return relay(head)
        }
    }

    /// The exchange hands its response head over in memory (`OriginResponse`), in place of the text this stream
    /// would read back: taken only while a head is awaited and nothing the session wrote waits in its output before
    /// it, so heads and bytes keep their order. False when not taken: the caller writes the text.
    func take(_ head: ResponseHead) -> Bool {
        guard let exchangeOutput, case .head = phase, !paused, evbuffer_get_length(exchangeOutput) == 0 else { return false }
        handing = true
        _ = relay(head)
        handing = false
        // Inside the exchange's callbacks: what the codec queued is written from the loop.
        connection.scheduleFlush()
        return true
    }

    /// Why this stream's client cannot take the final head relayed from `head`, or nil: larger than the client said
    /// it accepts (SETTINGS_MAX_HEADER_LIST_SIZE) or than the proxy sends in one header block (`HeaderBlockLimits`).
    /// The exchange asks before the response starts, and answers as for an origin head beyond the proxy's own limits.
    /// `relayed` makes the head as relayed; only made when `head` and 1 KiB for the fields the proxy adds (`Via`,
    /// the framing, `Data-Mode-*`) may not fit. Should they take more, the codec still refuses the head (`relay`).
    func refusal(of head: ResponseHead, relayed: () -> ResponseHead) -> String? {
        let codec = connection.codec
        var size = 1024
        for field in head.fields { size += field.name.utf8.count + field.value.utf8.count + 32 }
        guard size > codec.headerListLimit else { return nil }
        let relayed = relayed()
        return codec.headerListProblem(pseudo: [(":status", String(relayed.status))],
                                       fields: HTTP2ResponseTranslation.fields(of: relayed))
            .map { "the response head cannot go out in HTTP/2: " + $0 }
    }

    /// Sends a response head (1xx or final) to the codec and sets up the body's relay; false when the stream is
    /// over (no body, or failed). `head` was read by `HTTP1Parser` (`readHead`) or accepted by `HeadHandoff.response`
    /// (`take`, from `OriginResponse.handToStream`): its translated fields need no second check in the codec.
    private func relay(_ head: ResponseHead) -> Bool {
        let fields = HTTP2ResponseTranslation.fields(of: head)
        let codec = connection.codec
        if head.status < 200 {
            // 100 and 103 are relayed; 101 cannot be (HTTP/2 has no Upgrade, RFC 9113 §8.6).
            do throws(HTTP2SessionError) {
                try codec.sendInformational(id, status: head.status, fields: fields, from: .translatedFromHTTP1Head)
            } catch .headerListTooLarge(let problem) {
                // A hint the client cannot take is left out; the final response follows as it would have.
                connection.worker.logger.debug("http2 interim response not relayed",
                                               metadata: ["stream": "\(id)", "detail": "\(problem)"])
            } catch {
                fail("an interim response cannot go out in HTTP/2: \(error)")
                return false
            }
            return true
        }
        guard case .success(let framing) = head.bodyFraming(requestMethod: method) else {
            fail("the exchange's response is not framed")
            return false
        }
        let noBody: Bool
        switch framing {
        case .none, .contentLength(0): noBody = true
        default: noBody = false
        }
        do throws(HTTP2SessionError) {
            try codec.sendResponseHead(id, status: head.status, fields: fields, endStream: noBody, from: .translatedFromHTTP1Head)
        } catch {
            fail("the response head cannot go out in HTTP/2: \(error)")
            return false
        }
        if noBody {
            phase = .over
            return false
        }
        let remaining: UInt64
        if case .contentLength(let length) = framing { remaining = length } else { remaining = 0 }
        phase = .body(framing, remaining: remaining, decoder: ChunkedDecoder(maxLineLength: 4096,
                                                                          maxTrailerSection: Flow.responseLimits.headerSection))
        return true
    }

    /// Relays body bytes; false when more bytes are needed, the codec said stop, or the body is over.
    private func readBody(_ input: OpaquePointer, _ framing: BodyFraming, _ remaining: UInt64,
                          _ decoder: inout ChunkedDecoder) -> Bool {
        let available = evbuffer_get_length(input)
        switch framing {
        case .contentLength:
            guard available > 0 else { return false }
            let n = Int(min(UInt64(available), remaining, UInt64(responseRoom)))
            guard send(input, count: n) else { return false }
            let left = remaining - UInt64(n)
            phase = .body(framing, remaining: left, decoder: decoder)
            if left == 0 { finish(trailers: []) }
            return left != 0 && !paused
        case .untilClose:
            // Whole only when the session ended cleanly and every byte it wrote went out: `settleAfterSessionEnd`.
            guard available > 0 else { return false }
            return send(input, count: min(available, responseRoom)) && !paused
        case .chunked:
            switch ChunkedElements.next(input, &decoder) {
            case .data(let available):
                let n = min(available, responseRoom)
                guard send(input, count: n) else { return false }
                decoder.consumeData(n)
                phase = .body(framing, remaining: 0, decoder: decoder)
                return !paused
            case .framing:
                phase = .body(framing, remaining: 0, decoder: decoder)
                return true
            case .end(let trailers):
                finish(trailers: trailers)
                return false
            case .needMore:
                return false
            case .invalid(let error):
                fail("the exchange's chunked body is invalid: \(error)")
                return false
            }
        case .none:
            finish(trailers: [])
            return false
        }
    }

    /// How many more bytes the codec's queue for this stream takes before it says stop: a relay step takes no more, so
    /// the queue keeps to its watermark (a whole step past it doubled the queue's storage, for every unread stream).
    private var responseRoom: Int {
        max(1, connection.codec.configuration.responseBodyHighWatermark - connection.codec.bufferedResponseBytes(id))
    }

    /// Hands `count` bytes at the front of `input` to the codec; false when the stream failed.
    private func send(_ input: OpaquePointer, count: Int) -> Bool {
        guard count > 0, let start = evbuffer_pullup(input, count) else { return count == 0 }
        let more: Bool
        do throws(HTTP2SessionError) {
            more = try connection.codec.sendResponseBody(id, UnsafeRawBufferPointer(start: start, count: count))
        } catch {
            fail("the response body cannot go out: \(error)")
            return false
        }
        evbuffer_drain(input, count)
        if !more { paused = true }
        return true
    }

    /// The response is over, or nobody reads the session's input any more: the request body bytes written to it and not
    /// taken go back to the client's windows. The exchange is done with the request either way (an origin that
    /// answered before reading the whole body gets no more of it), and what the client still sends is given back
    /// as it comes (`requestBody`), so its upload runs to the end instead of waiting on a window that never
    /// opens. RST_STREAM NO_ERROR would end it sooner (RFC 9113 §8.1), but curl 7.88 (Debian 12) then drops
    /// the response and fails with "stream not closed cleanly".
    private func giveBackUnreadRequestBody() {
        guard unconsumed > 0 else { return }
        let count = unconsumed
        unconsumed = 0
        connection.codec.consumeRequestBody(id, count: count)
    }

    private func finish(trailers: [HTTPField]) {
        giveBackUnreadRequestBody()
        phase = .over
        do throws(HTTP2SessionError) {
            try connection.codec.finishResponse(id, trailers: HTTP2ResponseTranslation.trailerFields(trailers))
        } catch {
            fail("the response end cannot go out: \(error)")
        }
    }

    /// The response cannot be relayed as it is: the stream is reset (INTERNAL_ERROR) and the exchange ended.
    private func fail(_ detail: String) {
        if case .over = phase { return }
        phase = .over
        giveBackUnreadRequestBody()
        connection.worker.logger.debug("http2 stream reset", metadata: ["stream": "\(id)", "detail": "\(detail)"])
        try? connection.codec.resetStream(id, code: .internalError)
        // A head handed in failed inside the exchange's own call (`take`): the exchange is not aborted under its
        // feet; the reset closes the stream from the loop (`closed`), which ends it.
        if !handing { session?.abort(.upstreamAborted, detail: detail) }
    }

    // MARK: ends

    /// The session let go of the buffers (`ClientTransport.release`). `clean`: it ended gracefully, so a body delimited
    /// by the close is complete; otherwise whatever is not complete is cut and the stream is reset. A session ends
    /// cleanly with its response still on its way here (a drain closes it as soon as its own output is empty).
    func exchangeSessionEnded(clean: Bool) {
        session = nil
        sessionEnd = clean
        giveBackUnreadRequestBody()
        // Nobody reads the input any more: what waits in it is dropped, and no longer held against the connection's
        // bound (its callback, deferred, looks at the bound again).
        if let exchangeInput { evbuffer_drain(exchangeInput, evbuffer_get_length(exchangeInput)) }
        // This runs inside the exchange's callbacks, not the connection's: what it queues is written from the loop.
        defer { connection.scheduleFlush() }
        // Relays what is still waiting here, then settles the response (`settleAfterSessionEnd`), now or once the
        // codec's queue drains (`resumeResponse`).
        responseReadable()
    }

    /// The codec closed the stream (both sides done, or reset by either side): the exchange ends if it has not,
    /// and the buffers are freed.
    func closed(_ end: HTTP2StreamEnd) {
        phase = .over
        if let session {
            self.session = nil
            switch end {
            case .completed:
                session.close()
            case .resetByClient, .resetByProxy:
                Self.abort(session, detail: "the client reset the HTTP/2 stream")
            }
        }
        freeBuffers()
    }

    /// The connection is going away: everything of this stream with it.
    func connectionClosed() {
        phase = .over
        if let session {
            self.session = nil
            session.abort(.clientAborted, detail: "the HTTP/2 connection closed")
        }
        freeBuffers()
    }

    /// Ends the exchange as the client's abort. A stream reset in the same read as its HEADERS finds its session not
    /// yet started on the head handed to it: the session reads it first, so the request is judged and leaves its one
    /// access-log line (`client-aborted`), as a reset a moment later and an HTTP/1.1 client gone after its head do;
    /// otherwise it left none. No more work than that later reset costs: the codec's reset budget (CVE-2023-44487)
    /// counts either.
    private static func abort(_ session: HTTP1Session, detail: String) {
        session.processInput()
        session.abort(.clientAborted, detail: detail)
    }

    /// Frees the buffers (the session let go of them before: it ended first). Their callbacks go first: a deferred one
    /// already scheduled would otherwise still run once the buffer is freed for good.
    private func freeBuffers() {
        if let exchangeInput {
            evbuffer_remove_cb(exchangeInput, http2StreamInputCallback, context(self))
            evbuffer_free(exchangeInput)
            self.exchangeInput = nil
        }
        if let exchangeOutput {
            evbuffer_remove_cb(exchangeOutput, http2StreamOutputCallback, context(self))
            evbuffer_free(exchangeOutput)
            self.exchangeOutput = nil
        }
    }
}
