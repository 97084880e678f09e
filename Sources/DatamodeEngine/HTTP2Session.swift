import CDatamodeShims
import CLibevent
import DatamodeHTTP
import DatamodeHTTP2
import DatamodePolicy
import DatamodeState

/// An HTTP/2 client connection (the session layer, as HAProxy's `h2c`): an intercepted TLS connection whose
/// client chose `h2` in the handshake (SPEC §17). It owns the wire (the `ClientTransport` its HTTP/1 session had
/// until then), the codec (`HTTP2ServerSession`: framing, HPACK, flow control and the limits of §17 on nghttp2),
/// and one `HTTP2Stream` per request, each an exchange of its own. It moves bytes between the wire and the codec,
/// turns the codec's events into stream calls, and closes: on the client's close, a connection error (GOAWAY is
/// already queued), idleness, or a drain once the streams in flight are done.
final class HTTP2Session: ClientSession {
    unowned let worker: Worker
    let transport: ClientTransport
    let codec: HTTP2ServerSession
    let peerAddress: IPAddress?
    let peerText: String
    /// The interception every stream's request is judged inside (SPEC §9): the CONNECT's authority, its user.
    let tunnel: InterceptedTunnel
    /// A connection of the transparent listener (SPEC §16): every stream's upstream goes to its original destination.
    let transparent: TransparentConnection?
    private var streams = StreamTable<HTTP2Stream>()
    private var timer: OpaquePointer?
    /// Runs `flushOutput` from the loop, for what a stream's exchange did outside this connection's callbacks
    /// (its session ended: `HTTP2Stream.exchangeSessionEnded`).
    private var queuedFlush: QueuedFlush?
    private(set) var released = false
    /// Nothing more is read: the connection closes once its output is written (GOAWAY is in it).
    private var closing = false
    /// When bytes last moved either way (monotonic nanoseconds): idleness and a client that stopped reading.
    private var lastProgress: UInt64
    /// The most request body bytes the streams may hold inside the proxy before the connection window stops
    /// reopening (`settleConnectionWindow`): four read watermarks (a single upload's own buffers, from the exchange's
    /// input to an h2 origin codec's queue), or the connection window when that is larger.
    let requestBytesBound: Int
    /// Held request bytes may have gone since the bound was last looked at: `flushOutput` looks again, once.
    private var boundToSettle = false

    /// Nil when nghttp2 could not make a session (out of memory).
    init?(worker: Worker, transport: ClientTransport, peerAddress: IPAddress?, peerText: String, tunnel: InterceptedTunnel,
          transparent: TransparentConnection?) {
        self.worker = worker
        self.transport = transport
        self.peerAddress = peerAddress
        self.peerText = peerText
        self.tunnel = tunnel
        self.transparent = transparent
        let settings = worker.settings
        guard let codec = try? HTTP2ServerSession(configuration: HTTP2ServerConfiguration(
            maxConcurrentStreams: UInt32(settings.http2.maxConcurrentStreams),
            initialWindowSize: UInt32(settings.http2.initialWindow),
            headerLimits: settings.limits,
            // A stream's answer waits for the client here, up to two of its exchange's steps (`Flow.streamHighWater`).
            responseBodyHighWatermark: 2 * Flow.streamHighWater,
            responseBodyLowWatermark: Flow.streamHighWater / 2)) else { return nil }
        self.codec = codec
        requestBytesBound = max(4 * Flow.highWater, Int(codec.configuration.connectionWindowSize))
        lastProgress = worker.clock.nowNanoseconds()
    }

    /// An intercepted client chose `h2` in the handshake `session` terminated: an HTTP/2 session takes its wire over
    /// (the worker counts it as the same connection); the HTTP/1 session lets go (`handOver(to:)`).
    static func takeOver(from session: HTTP1Session, tunnel: InterceptedTunnel) {
        session.transport.forgetTLSOwner()
        guard let successor = HTTP2Session(worker: session.worker, transport: session.transport,
                                           peerAddress: session.peerAddress, peerText: session.peerText, tunnel: tunnel,
                                           transparent: session.transparent) else {
            session.close()
            return
        }
        session.handOver(to: successor)
        successor.start()
    }

    /// `buffer` starts with the HTTP/2 connection preface's request line (RFC 9113 §3.4): in clear text on the
    /// proxy port that is SPEC §17's `505`.
    static func startsWithPreface(_ buffer: OpaquePointer) -> Bool {
        let line = Array("PRI * HTTP/2.0\r\n".utf8)
        guard evbuffer_get_length(buffer) >= line.count, let start = evbuffer_pullup(buffer, line.count) else { return false }
        return UnsafeRawBufferPointer(start: start, count: line.count).elementsEqual(line)
    }

    /// Takes the wire over (callbacks, timer) and reads what the client already sent (its preface, often).
    func start() {
        transport.configure(owner: context(self), callbacks: .http2)
        timer = dm_timer_new(worker.base, http2TimerCallback, context(self))
        queuedFlush = QueuedFlush(base: worker.base, callback: http2FlushCallback, owner: context(self))
        worker.metrics.http2ConnectionOpened()
        armTimer()
        clientReadable()
    }

    private var idleMilliseconds: Int64 { max(1, worker.settings.clientIdleMs) }

    /// The timer fires in `milliseconds` (a whole `client-idle` period when nil).
    private func armTimer(milliseconds: Int64? = nil) {
        if let timer { dm_event_add_ms(timer, max(1, milliseconds ?? idleMilliseconds)) }
    }

    // MARK: reading

    func clientReadable() {
        guard !released else { return }
        let input = transport.input
        while evbuffer_get_length(input) > 0 {
            if closing {
                evbuffer_drain(input, evbuffer_get_length(input))
                return
            }
            let length = evbuffer_get_contiguous_space(input)
            guard length > 0, let start = evbuffer_pullup(input, length) else { return }
            let events = codec.receive(UnsafeRawBufferPointer(start: start, count: length))
            evbuffer_drain(input, length)
            lastProgress = worker.clock.nowNanoseconds()
            handle(events)
        }
    }

    private func handle(_ events: [HTTP2ServerEvent]) {
        for event in events {
            switch event {
            case .request(let id, let request, let endStream):
                open(id, request, endStream: endStream)
            case .requestBody(let id, let bytes):
                if let stream = streams[id] {
                    stream.requestBody(bytes)
                    requestBytesMayHaveLeft()  // their share of the connection window is the bound's to give back
                } else {
                    codec.consumeRequestBody(id, count: bytes.count)
                }
            case .requestEnd(let id, let trailers):
                streams[id]?.requestEnded(trailers: trailers)
            case .requestRefused(let id, let refusal):
                refused(id, refusal)
            case .responseBodyDrained(let id):
                streams[id]?.resumeResponse()
            case .streamClosed(let id, let end):
                streams.removeValue(forKey: id)?.closed(end)
                requestBytesMayHaveLeft()
            case .goaway:
                break  // the codec stops wanting to read once the streams in flight are done
            case .connectionError(let error):
                worker.metrics.http2Error(error.reasonLabel)
                worker.logger.info("http2 connection error", metadata: [
                    "client": "\(peerText)", "reason": "\(error.reasonLabel)", "code": "\(error.code)",
                    "detail": "\(error.detail)",
                ])
                closing = true
            case .limitExceeded(let reason):
                worker.metrics.http2Error(reason.rawValue)
            }
        }
    }

    /// SPEC §17 "flow control is backpressure ... the connection window likewise": the connection window of every
    /// request body byte the streams received (`HTTP2ServerSession.connectionWindowWithheld`, counted from arrival;
    /// `HTTP2Stream.requestBodyMovedOn` gives back only the streams' own windows) goes back while the
    /// streams hold less than `requestBytesBound` inside the proxy (`HTTP2Stream.heldRequestBytes`: their exchanges'
    /// inputs and everything queued towards their origins). So what one connection makes the proxy hold is about
    /// the bound plus one connection window, however many streams it opens: each stream's buffers keep to their own
    /// watermarks, but 100 streams' buffers took 100 MiB from one connection (review16) when the connection window
    /// reopened as each stream's input drained into the buffers behind it.
    ///
    /// Looked at again whenever held bytes may have gone (`requestBytesMayHaveLeft`): a stream's input changed, its
    /// upstream's output drained, an h2 origin codec sent DATA or opened a window, a stream closed or its exchange
    /// ended. Bytes nobody reads (refused, answered early, reset) go back to both windows at once, never withheld.
    ///
    /// Head-of-line: that is what a connection window means. A stalled origin can use the whole bound up and so hold
    /// the uploads of the connection's other streams too, until its bytes move. One exception keeps that from
    /// becoming a deadlock the proxy made: a stream whose exchange moved on every byte it got and whose origin would
    /// take more now (`HTTP2Stream.starvesForRequestBody`) gets the window back anyway, as when its bytes wait behind
    /// streams queued for an origin's concurrency that only its own completion frees. The client decides which
    /// stream that window goes to, and clients that share it fairly (curl, nghttp2) spend it first on the streams
    /// that sent least, the queued ones, until their own buffers' watermarks close their windows
    /// (`curlsParallelUploadsToAnOriginTakingTwoStreamsAllArrive`): the exception cannot be granted once per starving
    /// stream only. So a client that keeps one such stream starving (sends it nothing while its origin takes more)
    /// keeps the bound lifted, and its other streams are held by their own buffers' watermarks alone, as before the
    /// bound — and so does any client that feeds some streams before others (session 18's outside test: 178 MiB held
    /// for 60 stalled uploads beside one flowing). What keeps the bound then is `settleStreamWindows`: at the bound
    /// every stream's window is squeezed, so the connection window that goes back to a starving stream can move at
    /// most a squeezed window on each of the others.
    /// Runs from `flushOutput`, before the frames are written: a WINDOW_UPDATE it queues goes out with them.
    private func settleConnectionWindow() {
        var held = 0
        streams.forEachValue { held += $0.heldRequestBytes }
        settleStreamWindows(held: held)
        let withheld = codec.connectionWindowWithheld
        guard withheld > 0 else { return }
        if held >= requestBytesBound {
            var starving = false
            streams.forEachValue { if !starving && $0.starvesForRequestBody { starving = true } }
            guard starving else { return }
        }
        codec.consumeConnectionWindow(count: withheld)
    }

    /// At `requestBytesBound` the streams' windows are squeezed (`HTTP2ServerSession.squeezeStreamWindows`: the
    /// client's unused grants taken back, every stream down to 64 KiB), and while squeezed a stream's window reopens
    /// only while the stream itself holds less than that (`HTTP2Stream.giveBackStreamWindow`). So what a connection
    /// makes the proxy hold stays about the bound plus one connection window plus a squeezed window a stream, however
    /// the client shares the connection window out, and a stream whose bytes keep moving keeps moving. Below half
    /// the bound the configured windows come back (no SETTINGS back and forth at the edge: crossing it either way
    /// takes half the bound of bytes moving on).
    private func settleStreamWindows(held: Int) {
        if !codec.streamWindowsSqueezed {
            guard held >= requestBytesBound, codec.squeezeStreamWindows() else { return }
            worker.logger.info("http2 stream windows squeezed", metadata: [
                "client": "\(peerText)", "held": "\(held)", "streams": "\(streams.count)",
            ])
        } else if held < requestBytesBound / 2, codec.restoreStreamWindows() {
            worker.logger.info("http2 stream windows restored", metadata: ["client": "\(peerText)", "held": "\(held)"])
        }
        streams.forEachValue { $0.giveBackStreamWindow() }
    }

    /// Whether the streams' windows are squeezed (`settleStreamWindows`).
    var streamWindowsSqueezed: Bool { codec.streamWindowsSqueezed }

    /// Held request bytes may have gone, or a stream's origin may take more: the bound is looked at again from the
    /// loop (`flushOutput`), once however often asked before (an h2 origin's WINDOW_UPDATE tells each of its streams).
    func requestBytesMayHaveLeft() {
        guard !released, codec.connectionWindowWithheld > 0 || codec.streamWindowsSqueezed else { return }
        boundToSettle = true
        scheduleFlush()
    }

    /// A request that passed strict translation: a stream, an exchange.
    private func open(_ id: HTTP2StreamID, _ request: HTTP2Request, endStream: Bool) {
        guard !closing else {
            try? codec.resetStream(id, code: .refusedStream)
            return
        }
        worker.metrics.http2StreamOpened()
        let stream = HTTP2Stream(connection: self, id: id, method: request.method)
        streams[id] = stream
        guard stream.start(request, endStream: endStream) else {
            streams.removeValue(forKey: id)
            try? codec.resetStream(id, code: .internalError)
            return
        }
    }

    /// A stream the codec refused before it became a request: `431` or `414` when it awaits an answer (the same
    /// problem documents an HTTP/1 request gets), nothing for the ones already reset.
    private func refused(_ id: HTTP2StreamID, _ refusal: HTTP2RequestRefusal) {
        let error: HTTPWireError
        switch refusal {
        case .headerSectionTooLarge: error = .headerSectionTooLarge
        case .pathTooLong: error = .requestLineTooLong
        case .malformed, .tooManyStreams: return
        }
        let body = Array(ProblemDetail(code: error.clientErrorCode, detail: error.detail).json.utf8)
        do throws(HTTP2SessionError) {
            try codec.sendResponseHead(id, status: error.clientErrorCode.status, fields: [
                HTTPField(name: "content-type", value: "application/problem+json"),
                HTTPField(name: "cache-control", value: "no-store"),
                HTTPField(name: "proxy-status", value: error.clientErrorCode.proxyStatus),
                HTTPField(name: "content-length", value: String(body.count)),
            ], endStream: false)
            let queued = body.withUnsafeBytes { bytes in Result { () throws(HTTP2SessionError) in try codec.sendResponseBody(id, bytes) } }
            _ = try queued.get()
            try codec.finishResponse(id)
        } catch {
            try? codec.resetStream(id, code: .internalError)
            return
        }
        // Its line, as an HTTP/1.1 request the parser refuses gets one (SPEC §8: one line per request): no method or
        // URL was taken from a head past the limits.
        let exchange = Exchange(clientVersion: .http11, method: "-", url: "-", startedAt: worker.clock.nowNanoseconds())
        exchange.overHTTP2 = true
        exchange.source = transparent != nil ? .transparent : .intercepted
        exchange.outcome = .error
        exchange.status = error.clientErrorCode.status
        exchange.bytesOut = UInt64(body.count)
        worker.record(exchange, client: peerText)
    }

    // MARK: writing

    /// Moves the codec's frames to the wire while it takes them (called after every callback, as the HTTP/1
    /// session's `flushPendingWrites`), and closes once nothing is left to say.
    func flushOutput() {
        guard !released else { return }
        if boundToSettle {
            boundToSettle = false
            settleConnectionWindow()
        }
        var rounds = 0
        while codec.wantsWrite, transport.outputLength < Flow.highWater, rounds < 64 {
            rounds += 1
            let output = transport.output
            let before = transport.outputLength
            let events = GatheredWrite.into(output) { sink in
                codec.writeOutput(limit: Flow.highWater - before, sink)
            }
            if transport.outputLength > before { lastProgress = worker.clock.nowNanoseconds() }
            handle(events)
        }
        transport.flush()
        if !closing && !codec.wantsRead && !codec.wantsWrite && streams.isEmpty { closing = true }
        if closing && !codec.wantsWrite { closeWhenWritten() }
    }

    /// Asks the loop to run `flushOutput` soon (once, however often asked before it runs), after the callbacks
    /// queued behind it (`QueuedFlush`).
    func scheduleFlush() {
        guard !released else { return }
        queuedFlush?.schedule()
    }

    /// The flush event ran (`QueuedFlush`): the frames go out now, or once more of the queue has run.
    func flushEventRan() {
        if queuedFlush?.ran() == true { flushOutput() }
    }

    func clientWritable() {
        guard !released else { return }
        transport.writeCallbackRan()
        lastProgress = worker.clock.nowNanoseconds()
        if closing && transport.unsentOutput == 0 && !codec.wantsWrite { release(graceful: true) }
    }

    /// Under TLS the socket's buffer is watched too: once it is written, a closing connection closes (from the
    /// timer, never inside the buffer's own callback).
    func socketOutputDrained() {
        guard closing, transport.unsentOutput == 0, let timer else { return }
        dm_event_add_ms(timer, 0)
    }

    private func closeWhenWritten() {
        if transport.unsentOutput == 0 {
            release(graceful: true)
        } else {
            transport.closeWhenWritten()
        }
    }

    // MARK: events, timer

    func clientEvent(_ what: Int16) {
        // EOF or an error: the client is gone (HTTP/2 has no half-close of the connection).
        release(graceful: false)
    }

    /// Every `client-idle`: a connection with no stream and nothing moving is ended with GOAWAY; one whose
    /// client stopped reading (output queued, or a response waiting for a window it never opens, nothing moved for
    /// a whole period) is closed; a closing one whose GOAWAY cannot be written is closed.
    func timerFired() {
        guard !released else { return }
        if closing && transport.unsentOutput == 0 {
            release(graceful: true)
            return
        }
        let idleFor = worker.clock.nowNanoseconds() &- lastProgress
        let period = UInt64(idleMilliseconds) * 1_000_000
        if idleFor >= period {
            // Nothing moved for a whole period while something waits for the client: it stopped reading, or never
            // opens its window (SPEC §17: the client-idle timeout applies).
            let waitingForWindow = streams.containsID { codec.bufferedResponseBytes($0) > 0 }
            if closing || transport.unsentOutput > 0 || waitingForWindow {
                worker.logger.info("http2 client idle", metadata: [
                    "client": "\(peerText)", "detail": "nothing moved for client-idle with a response waiting for the client",
                ])
                release(graceful: false)
                return
            }
            if streams.isEmpty {
                codec.drain()
                closing = true
            }
            armTimer()
            return
        }
        // Looked at again when a period since the last progress runs out, not a whole period from now: a client that
        // stopped reading is closed `client-idle` after the last byte moved, not up to twice that (session 18's
        // outside test: 120 s for 60 s).
        armTimer(milliseconds: Int64((period - idleFor) / 1_000_000) + 1)
    }

    // MARK: closing

    /// Drain (SIGTERM, SPEC §17): GOAWAY with the last stream id; the streams in flight finish.
    func drain() {
        guard !released, !closing else { return }
        codec.drain()
        flushOutput()
    }

    func close() {
        release(graceful: false)
    }

    private func release(graceful: Bool) {
        guard !released else { return }
        released = true
        let open = streams.allValues
        streams.removeAll()
        for stream in open { stream.connectionClosed() }
        if let timer { event_free(timer) }
        timer = nil
        queuedFlush?.free()
        transport.release(cleanTLSEnd: graceful)
        worker.metrics.http2ConnectionClosed()
        worker.clientClosed(self)
    }
}
