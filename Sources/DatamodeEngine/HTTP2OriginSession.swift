import CDatamodeShims
import CLibevent
import DatamodeHTTP
import DatamodeHTTP2

/// An HTTP/2 connection to an origin (SPEC §17 "Origin side"), shared by the exchanges of one worker that go to the
/// same origin (host, port, TLS verification: the `UpstreamKey`). It is born when a TLS origin chooses `h2` in the
/// handshake of an `UpstreamConnection` (`UpstreamConnection.adoptHTTP2`), takes that connection's TLS wire over,
/// and from then on carries one `HTTP2OriginStream` per exchange, up to the origin's
/// `SETTINGS_MAX_CONCURRENT_STREAMS`; further streams wait their turn, in order. It moves bytes between the wire and
/// the codec (`HTTP2ClientSession`), turns the codec's events into stream calls, and closes: on the origin's close
/// or a connection error (every stream then breaks off), after the origin's GOAWAY once its streams are done, or
/// after the pool's idle timeout with no stream (GOAWAY first).
final class HTTP2OriginSession {
    unowned let worker: Worker
    let key: UpstreamKey
    let codec: HTTP2ClientSession
    private var bev: OpaquePointer?
    private var streams = StreamTable<HTTP2OriginStream>()
    /// Translated requests waiting for the origin's concurrency, oldest first.
    private var waiting: [HTTP2OriginStream] = []
    /// Streams whose exchange has not let go (started, waiting, or still reading its request head).
    private var attached = 0
    private var timer: OpaquePointer?
    private var queuedFlush: QueuedFlush?
    /// Reads the wire's socket for its TLS filter (`TLSSocketFeed`), handed over with the wire.
    private var feed: TLSSocketFeed?
    /// Writes the wire's TLS records at once after each flush (`TLSRecordWriter`), as an HTTP/1.1 TLS origin's are:
    /// through libevent's write path every WINDOW_UPDATE and request cost an `epoll_ctl` pair, a loop round and a
    /// `writev` (strace, HTTPS 100 KiB at 50 connections: 0.44 of each a request).
    private var records: TLSRecordWriter?
    /// No new stream: GOAWAY went either way, or the connection failed. It closes once its streams are done.
    private(set) var closing = false
    /// The lowest last stream of the origin's GOAWAYs (RFC 9113 §6.8: a stream above it was not processed).
    private(set) var goawayLastStreamID: HTTP2StreamID?
    private(set) var released = false
    /// Response bytes arrived, or moved on while squeezed: `flushOutput` looks at the windows (`settleStreamWindows`).
    private var windowsToSettle = false
    /// What the streams held when `settleStreamWindows` last counted, and the response bytes that arrived since: their
    /// sum bounds what they hold now (only arrivals add), so the streams are counted only once it reaches the bound.
    private var heldWhenSettled = 0
    private var arrivedSinceSettled = 0
    /// A round of events is under way (`inRound`: a read of the wire, or one batch of the codec's events): streams
    /// stage what they write for their exchanges (`HTTP2OriginStream.write`), listed in `stagedStreams`, and it moves
    /// on to their pairs when the round ends.
    private(set) var handlingEvents = false
    private var stagedStreams: [HTTP2OriginStream] = []
    /// The chain of the wire's input being read (`wireReadable`), and whether a read is under way.
    private let frames = evbuffer_new()!
    private var reading = false

    /// Until the origin's first SETTINGS say how many streams it takes, one: its SETTINGS come with the end of the
    /// handshake, and guessing higher (RFC 9113 §6.5.2 only recommends 100) gets streams refused by a smaller origin.
    static let initialConcurrency = 1

    init?(worker: Worker, key: UpstreamKey, wire: OpaquePointer, feed: TLSSocketFeed?) {
        self.worker = worker
        self.key = key
        let settings = worker.settings
        guard let codec = try? HTTP2ClientSession(configuration: HTTP2ClientConfiguration(
            initialWindowSize: UInt32(settings.http2.initialWindow),
            headerLimits: Flow.responseLimits,
            requestBodyHighWatermark: Flow.highWater, requestBodyLowWatermark: Flow.lowWater)) else { return nil }
        self.codec = codec
        bev = wire
        self.feed = feed
        bufferevent_setcb(wire, http2OriginReadCallback, http2OriginWriteCallback, http2OriginEventCallback, context(self))
        bufferevent_enable(wire, Int16(EV_READ | EV_WRITE))
        records = TLSRecordWriter(filter: wire)
        timer = dm_timer_new(worker.base, http2OriginTimerCallback, context(self))
        queuedFlush = QueuedFlush(base: worker.base, callback: http2OriginFlushCallback, owner: context(self))
        worker.metrics.http2OriginConnectionOpened()
        worker.originSessions.add(self)
        armIdleTimer()
    }

    deinit {
        evbuffer_free(frames)
    }

    /// Whether a new exchange may be given a stream here (it may still have to wait for the concurrency).
    var acceptsStreams: Bool { !released && !closing }

    /// Streams started or waiting: how busy it is.
    var load: Int { streams.count + waiting.count }

    /// How many streams may be open at once now.
    var concurrency: Int {
        codec.remoteSettingsReceived ? (codec.peerMaxConcurrentStreams ?? Int.max) : Self.initialConcurrency
    }

    // MARK: streams

    /// A new exchange's stream over a pair: `upstreamEnd` becomes the exchange's upstream wire.
    func attachStream(end: OpaquePointer, upstream: UpstreamConnection) -> HTTP2OriginStream {
        attached += 1
        worker.metrics.http2OriginStreamOpened()
        if let timer { event_del(timer) }
        return HTTP2OriginStream(session: self, end: end, upstream: upstream)
    }

    /// The stream's request head was read and translated: it starts now, or waits its turn.
    func streamReady(_ stream: HTTP2OriginStream) {
        guard !released, !closing else {
            stream.connectionClosed("the HTTP/2 connection to the origin is closing")
            return
        }
        if waiting.isEmpty && streams.count < concurrency {
            begin(stream)
        } else {
            waiting.append(stream)
        }
        scheduleFlush()
    }

    private func begin(_ stream: HTTP2OriginStream) {
        guard stream.start(), let id = stream.id else { return }
        streams[id] = stream
    }

    /// Starts waiting streams while the origin's concurrency allows.
    private func startWaiting() {
        while !waiting.isEmpty && !closing && streams.count < concurrency && codec.canStartStream {
            begin(waiting.removeFirst())
        }
    }

    /// The stream's exchange let go (`HTTP2OriginStream.upstreamReleased`); `wasWaiting`: it is in `waiting` (only then
    /// is the queue searched: a started stream's release searched all of it, 1.7K instructions a request with 372
    /// streams queued in the bench's h2 row).
    func streamReleased(_ stream: HTTP2OriginStream, wasWaiting: Bool) {
        attached -= 1
        if wasWaiting, let index = waiting.firstIndex(where: { $0 === stream }) { waiting.remove(at: index) }
        scheduleFlush()
        if attached == 0 { armIdleTimer() }
    }

    // MARK: reading

    func wireReadable() {
        // A read begun while one is under way (its events made the wire read more) is the same read: the loop below
        // goes on with what came, after the events of the bytes before it.
        guard !released, !reading, let bev else { return }
        reading = true
        defer { reading = false }
        let input = bufferevent_get_input(bev)!
        // One round for all of it: the input is in chains of a TLS record or less, and what the streams write for
        // their exchanges moves on once, at the end (`stage`).
        inRound {
            while !released && evbuffer_get_length(input) > 0 {
                // The first chain moves to `frames` whole (no copy), and stays there while its events are handled:
                // the codec reports response bodies where they lie in it (`responseBodyAt`), and the streams copy
                // them from there once, into what goes to their exchanges.
                let length = evbuffer_get_contiguous_space(input)
                guard length > 0, evbuffer_remove_buffer(input, frames, length) == Int32(length),
                      let start = evbuffer_pullup(frames, length) else { return }
                let bytes = UnsafeRawBufferPointer(start: start, count: length)
                handle(codec.receive(bytes, bodyInPlace: true), in: bytes)
                evbuffer_drain(frames, length)
            }
        }
    }

    /// `stream` staged bytes in this round of events: they move to its pair when the round ends.
    func stage(_ stream: HTTP2OriginStream) {
        stagedStreams.append(stream)
    }

    /// Runs `body` as a round of events: what the streams stage in it moves to their pairs when it ends, whatever
    /// happened in it (a stream released in it has dropped its own). A round begun inside another is part of it.
    private func inRound(_ body: () -> Void) {
        guard !handlingEvents else { return body() }
        handlingEvents = true
        defer {
            handlingEvents = false
            while let stream = stagedStreams.popLast() { stream.flushStaged() }
        }
        body()
    }

    /// `received`: the bytes the events were read from (their `responseBodyAt` ranges are of it).
    private func handle(_ events: [HTTP2ClientEvent], in received: UnsafeRawBufferPointer? = nil) {
        inRound { dispatch(events, in: received) }
    }

    private func dispatch(_ events: [HTTP2ClientEvent], in received: UnsafeRawBufferPointer?) {
        for event in events {
            switch event {
            case .informational(let id, let status, let fields):
                streams[id]?.informational(status: status, fields: fields)
            case .response(let id, let status, let fields, let endStream):
                streams[id]?.responseHead(status: status, fields: fields, endStream: endStream)
            case .responseBody(let id, let bytes):
                bytes.withUnsafeBytes { responseBody(id, $0) }
            case .responseBodyAt(let id, let range):
                guard let received else { preconditionFailure("a body in place without the bytes it lies in") }
                responseBody(id, UnsafeRawBufferPointer(rebasing: received[range]))
            case .responseEnd(let id, let trailers):
                streams[id]?.responseEnded(trailers: trailers)
            case .requestBodyDrained(let id):
                streams[id]?.requestBodyDrained()
            case .requestBodySent(let id):
                streams[id]?.requestBodyMoved()
            case .sendWindowOpened(let id):
                if id == 0 { streams.forEachValue { $0.requestBodyMoved() } } else { streams[id]?.requestBodyMoved() }
            case .malformedResponse(_, let detail):
                worker.metrics.http2OriginError("protocol-error")
                worker.logger.info("http2 origin response refused", metadata: ["origin": "\(key.host):\(key.port)", "detail": "\(detail)"])
            case .streamClosed(let id, let end):
                // nghttp2's own messaging checks (a connection-specific field, a length that disagrees with the
                // DATA) reset the stream with PROTOCOL_ERROR without a `malformedResponse`: counted here.
                if case .resetByClient(.protocolError) = end { worker.metrics.http2OriginError("protocol-error") }
                streams.removeValue(forKey: id)?.closed(end)
                startWaiting()
            case .concurrencyChanged:
                startWaiting()
            case .goaway(let lastStreamID, let code):
                // Streams above `lastStreamID` are closed by the codec as refused (they may go again elsewhere).
                goawayLastStreamID = min(lastStreamID, goawayLastStreamID ?? lastStreamID)
                worker.logger.debug("http2 origin goaway", metadata: ["origin": "\(key.host):\(key.port)",
                                                                    "last": "\(lastStreamID)", "code": "\(code)"])
                beginClosing()
            case .connectionError(let error):
                worker.metrics.http2OriginError(error.reasonLabel)
                worker.logger.info("http2 origin connection error", metadata: [
                    "origin": "\(key.host):\(key.port)", "reason": "\(error.reasonLabel)", "detail": "\(error.detail)",
                ])
                release(detail: "the HTTP/2 connection to the origin failed: \(error.detail)")
            }
        }
    }

    /// No new streams here; the pool forgets it; waiting streams go elsewhere.
    private func beginClosing() {
        guard !closing else { return }
        closing = true
        worker.originSessions.remove(self)
        let stranded = waiting
        waiting.removeAll()
        for stream in stranded { stream.connectionClosed("the origin is closing the HTTP/2 connection (GOAWAY)") }
    }

    // MARK: writing

    /// Moves the codec's frames to the wire while it takes them; closes once a closing connection has nothing left.
    private func responseBody(_ id: HTTP2StreamID, _ bytes: UnsafeRawBufferPointer) {
        if let stream = streams[id] {
            stream.responseBody(bytes)
            arrivedSinceSettled += bytes.count
            windowsToSettle = true
        } else {
            codec.consumeResponseBody(id, count: bytes.count)
        }
    }

    func flushOutput() {
        guard !released, let bev else { return }
        if windowsToSettle {
            windowsToSettle = false
            settleStreamWindows()
        }
        let output = bufferevent_get_output(bev)!
        var rounds = 0
        while codec.wantsWrite, evbuffer_get_length(output) < Flow.highWater, rounds < 64 {
            rounds += 1
            let limit = Flow.highWater - evbuffer_get_length(output)
            let events = GatheredWrite.into(output) { sink in codec.writeOutput(limit: limit, sink) }
            handle(events)
            if released { return }
        }
        records?.flush(plaintext: output)
        // nghttp2 ended the session on its own, without a callback: a header block it cannot decompress makes it send
        // GOAWAY COMPRESSION_ERROR and ignore all further input (RFC 9113 §4.3). No stream on it will hear anything
        // more, and new ones must not join it: they fail now, as when the wire is lost.
        if !closing && !codec.wantsRead && !codec.wantsWrite && evbuffer_get_length(output) == 0 {
            release(detail: "the HTTP/2 connection to the origin ended: nghttp2 stopped reading it")
            return
        }
        if closing && streams.isEmpty && attached == 0 && !codec.wantsWrite && evbuffer_get_length(output) == 0 {
            release(detail: "closed")
        }
    }

    /// The response bytes the streams received and their exchanges did not take yet (`unconsumedResponseBytes`: each
    /// stream's window goes back only as its exchange takes them) at which every stream's window is squeezed
    /// (`HTTP2ClientSession.squeezeStreamWindows`, back below half of it). Every client of the origin shares this
    /// connection, and what one holds unread would otherwise be the origin's whole grant on each of its streams
    /// (session 18's outside test: 1 MiB a stream, 40 unread h2 streams ≈ 45 MB); squeezed, a stream not taken
    /// holds what it had and one squeezed window more, while the streams that are taken go on in 64 KiB windows.
    static let heldResponseBound = 4 << 20

    /// Looked at from `flushOutput`, before the frames are written (a SETTINGS it queues goes out with them): on
    /// response bytes arriving, and while squeezed on bytes moving on.
    private func settleStreamWindows() {
        if !codec.streamWindowsSqueezed && heldWhenSettled + arrivedSinceSettled < Self.heldResponseBound { return }
        var held = 0
        streams.forEachValue { held += $0.unconsumedResponseBytes }
        heldWhenSettled = held
        arrivedSinceSettled = 0
        if !codec.streamWindowsSqueezed {
            guard held >= Self.heldResponseBound, codec.squeezeStreamWindows() else { return }
            worker.logger.info("http2 origin stream windows squeezed", metadata: [
                "origin": "\(key.host):\(key.port)", "held": "\(held)", "streams": "\(streams.count)",
            ])
        } else if held < Self.heldResponseBound / 2, codec.restoreStreamWindows() {
            worker.logger.info("http2 origin stream windows restored", metadata: [
                "origin": "\(key.host):\(key.port)", "held": "\(held)",
            ])
        }
    }

    /// A stream's exchange took response bytes: while squeezed, the windows may come back.
    func responseBytesMayHaveMoved() {
        guard codec.streamWindowsSqueezed, !released else { return }
        windowsToSettle = true
        scheduleFlush()
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

    func wireEvent(_ what: Int16) {
        release(detail: "the origin closed the HTTP/2 connection")
    }

    // MARK: idle, closing

    private func armIdleTimer() {
        guard let timer, !released else { return }
        dm_event_add_ms(timer, max(1, worker.pool.idleTimeoutMs))
    }

    /// No stream for the pool's idle timeout: GOAWAY, then close once written (`flushOutput`); a wire that does not
    /// take the GOAWAY within `drain-timeout` is closed anyway.
    func timerFired() {
        guard !released else { return }
        if closing {
            release(detail: "the origin did not take the GOAWAY")
            return
        }
        guard attached == 0 else { return }
        codec.shutdown()
        beginClosing()
        flushOutput()
        if !released, let timer { dm_event_add_ms(timer, max(1, worker.settings.drainMs)) }
    }

    /// The worker stops: GOAWAY, and the wire goes (streams in flight break off).
    func close() {
        codec.shutdown()
        flushOutput()
        release(detail: "the proxy is closing the HTTP/2 connection to the origin")
    }

    private func release(detail: String) {
        guard !released else { return }
        beginClosing()
        released = true
        let open = streams.allValues
        streams.removeAll()
        for stream in open { stream.connectionClosed(detail) }
        if let timer { event_free(timer) }
        timer = nil
        queuedFlush?.free()
        feed?.stop()
        feed = nil
        if let bev { bufferevent_free(bev) }
        bev = nil
        worker.metrics.http2OriginConnectionClosed()
        worker.originSessions.forget(self)
    }
}

/// A worker's HTTP/2 connections to origins, per `UpstreamKey` (no sharing across workers, no locks).
final class HTTP2OriginPool {
    /// The sessions that take new streams, per origin.
    private var sessions: [UpstreamKey: [HTTP2OriginSession]] = [:]
    /// Every session not yet released (closing ones too): the pool holds them alive while libevent calls them.
    private var alive: [ObjectIdentifier: HTTP2OriginSession] = [:]

    func add(_ session: HTTP2OriginSession) {
        sessions[session.key, default: []].append(session)
        alive[ObjectIdentifier(session)] = session
    }

    /// Released: nothing of it is called by libevent any more.
    func forget(_ session: HTTP2OriginSession) {
        alive.removeValue(forKey: ObjectIdentifier(session))
    }

    var count: Int { alive.count }

    /// Per origin: the connection whose handshake (offering h2) is under way, and the new connections waiting for
    /// its answer instead of connecting themselves.
    private var handshaking: [UpstreamKey: (connection: UpstreamConnection, waiters: [UpstreamConnection])] = [:]
    /// Origins whose last handshake chose HTTP/1.1: new connections to them do not wait for one another.
    private var http1Origins: Set<UpstreamKey> = []

    /// A new connection offering h2 is about to connect: true when it should wait for a sibling's handshake
    /// (`UpstreamConnection.siblingHandshakeFinished` follows), false when it connects now (and, if it is the first,
    /// others will wait for it).
    func awaitHandshake(_ connection: UpstreamConnection) -> Bool {
        if http1Origins.contains(connection.key) { return false }
        if handshaking[connection.key] != nil {
            handshaking[connection.key]!.waiters.append(connection)
            return true
        }
        handshaking[connection.key] = (connection, [])
        return false
    }

    /// The handshake of `connection` ended: with an HTTP/2 session, with HTTP/1.1, or failed (`session` nil,
    /// `choseHTTP1` false). Its waiters join the session or connect on their own.
    func handshakeFinished(_ connection: UpstreamConnection, session: HTTP2OriginSession?, choseHTTP1: Bool) {
        guard let entry = handshaking[connection.key], entry.connection === connection else { return }
        handshaking[connection.key] = nil
        if choseHTTP1 {
            if http1Origins.count >= 4096 { http1Origins.removeAll() }
            http1Origins.insert(connection.key)
        } else if session != nil {
            http1Origins.remove(connection.key)
        }
        for waiter in entry.waiters { waiter.siblingHandshakeFinished(session) }
    }

    /// A waiting connection went away (its exchange did).
    func stopWaiting(_ connection: UpstreamConnection) {
        handshaking[connection.key]?.waiters.removeAll { $0 === connection }
    }

    func remove(_ session: HTTP2OriginSession) {
        sessions[session.key]?.removeAll { $0 === session }
        if sessions[session.key]?.isEmpty == true { sessions[session.key] = nil }
    }

    /// The session a new exchange to `key` uses: the oldest with room under its concurrency (so few connections
    /// carry the load and the rest go idle), else the one with the shortest wait.
    func session(for key: UpstreamKey) -> HTTP2OriginSession? {
        guard let candidates = sessions[key] else { return nil }
        var shortest: HTTP2OriginSession?
        for session in candidates where session.acceptsStreams {
            if session.load < session.concurrency { return session }
            if shortest == nil || session.load < shortest!.load { shortest = session }
        }
        return shortest
    }

    func closeAll() {
        let all = Array(alive.values)
        sessions = [:]
        for session in all { session.close() }
    }
}
