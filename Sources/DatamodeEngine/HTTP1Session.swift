import CDatamodeShims
import CLibevent
import DatamodeConfig
import DatamodeHTTP
import DatamodePolicy
import DatamodeState
#if canImport(Glibc)
import Glibc
#endif

/// An HTTP/1 client connection (the session layer, as HAProxy's `h1c`): reads request heads in order, gives each
/// an `ExchangeDriver` (which carries it from admission to its log line), keeps the connection alive for the
/// next, and owns what belongs to the connection: its transport, its timers, parking, an intercepted CONNECT's
/// opening. What to do next is decided by `HTTP1SessionStateMachine`, a value whose states carry the driver
/// of the moment; this class feeds it what libevent reported and carries out the actions it returns.
///
/// Requests on one connection are handled strictly one at a time, so pipelined requests are answered in order:
/// the next head is not even parsed until the current response is complete (its bytes wait in the input
/// buffer, bounded by the read watermark).
final class HTTP1Session: ClientSession {
    typealias StateMachine = HTTP1SessionStateMachine<ExchangeDriver>

    /// Not reference-counted: the worker outlives everything its loop owns (see `ClientTransport.worker`).
    unowned(unsafe) let worker: Worker
    /// The wire to the client: plain TCP or TLS, its buffers, speculative writes, parking.
    let transport: ClientTransport
    /// What the client sent (plaintext under TLS), and what is queued for it.
    @inline(__always) var input: OpaquePointer { transport.input }
    @inline(__always) var output: OpaquePointer { transport.output }
    let peerAddress: IPAddress?
    let peerText: String
    private var timer: LazyTimer?
    var machine: StateMachine
    /// Set while `processInput` runs, so a response completed inside it does not recurse into it.
    private var processing = false
    /// An HTTP/2 stream's request head handed over in memory (`HeadHandoff`): read before `input`, which has its body.
    var handedHead: RequestHead?
    /// The bufferevent and the timer have been freed.
    private(set) var released = false
    /// Where this connection's requests come from: nil for the proxy port itself (absolute-form requests), or the
    /// intercepted tunnel whose TLS the proxy terminated (origin-form requests for its authority, SPEC §9). The
    /// HTTP path below is the same for both; SPEC §16's transparent listener and HTTP/2 will be further sources.
    var intercepted: InterceptedTunnel?
    /// A connection on the transparent listener (SPEC §16): where it was going, and what it turned out to be.
    var transparent: TransparentConnection?
    /// A response was cut short: the TLS session must not end with a close_notify that would present it as whole.
    var truncated = false
    /// Wakes the connection when a link profile's bucket refills or its added latency passes.
    private(set) var shaping = ShapingTimer()

    convenience init(worker: Worker, bev: OpaquePointer, peer: SocketAddress, transparent: TransparentConnection? = nil) {
        self.init(worker: worker, bev: bev, peerAddress: peer.ipAddress, peerText: peer.hostText, transparent: transparent)
    }

    /// A connection accepted, or woken from parking (`ParkedConnection`, which kept its peer).
    init(worker: Worker, bev: OpaquePointer, peerAddress: IPAddress?, peerText: String,
         transparent: TransparentConnection? = nil) {
        self.worker = worker
        self.transparent = transparent
        transport = ClientTransport(worker: worker, bev: bev)
        self.peerAddress = peerAddress
        self.peerText = peerText
        machine = StateMachine(timeouts: worker.settings.clientTimeouts)
    }

    /// The exchange of one HTTP/2 stream (SPEC §17): its HTTP/1.1 translation arrives in `input`, a buffer of the
    /// stream's, as a request inside `tunnel` (the connection's interception), and the response goes to `output`, the
    /// stream's other buffer. Everything above the transport is the HTTP/1 path, unchanged.
    /// On a transparent connection (SPEC §16) the stream's upstreams are pinned to its original destination and its
    /// line says `transparent`, as its connection's requests would.
    init(worker: Worker, stream: HTTP2Stream, input: OpaquePointer, output: OpaquePointer, peerAddress: IPAddress?,
         peerText: String, tunnel: InterceptedTunnel, transparent: TransparentConnection?) {
        self.worker = worker
        transport = ClientTransport(worker: worker, stream: stream, input: input, output: output)
        self.peerAddress = peerAddress
        self.peerText = peerText
        machine = StateMachine(timeouts: worker.settings.clientTimeouts)
        intercepted = tunnel
        self.transparent = transparent
    }

    func start() {
        transport.configure(owner: context(self))
        timer = LazyTimer(base: worker.base, callback: clientTimerCallback, owner: context(self))
        apply(machine.started())
        startTransparent()
    }

    // MARK: parking (an idle connection gives its buffers back)

    /// Waiting idle between requests, the connection keeps only its socket and a read event: it goes to the
    /// worker's `ParkedConnections` (when the transport can: plain TCP, nothing buffered), and this session, its
    /// transport, bufferevent and timers are freed. The socket's next byte or EOF makes a new session (`resume`),
    /// and `client-idle` still runs. Returns whether it parked.
    private func park(idleLeft milliseconds: Int64) -> Bool {
        guard machine.isReadingHead, transport.canPark,
              worker.parked.park(fd: transport.socket, peerAddress: peerAddress, peerText: peerText,
                                 transparent: transparent, idleFor: milliseconds)
        else { return false }
        transport.releaseKeepingSocket()
        released = true
        timer?.free()
        timer = nil
        shaping.release()
        machine.parked()
        worker.clientParked(self)
        return true
    }

    /// A parked connection's next bytes (or EOF) arrived: this new session reads them, with `milliseconds` of
    /// `client-idle` left (the idle clock keeps running until a head's first byte arms `client-header`).
    func resume(idleLeftMilliseconds milliseconds: Int64) {
        transport.configure(owner: context(self))
        timer = LazyTimer(base: worker.base, callback: clientTimerCallback, owner: context(self))
        armTimer(milliseconds)
    }

    /// Carries out a connection-level action.
    func apply(_ action: StateMachine.Action) {
        switch action {
        case .none:
            break
        case .armTimer(let milliseconds):
            // Closing: the write callback must fire once everything is written (to the socket, under TLS).
            if case .closing = machine.phase { transport.closeWhenWritten() }
            armTimer(milliseconds)
        case .disarmTimer:
            disarmTimer()
        case .close:
            release(graceful: true)
        case .park(let milliseconds):
            if !park(idleLeft: milliseconds) { armTimer(milliseconds) }
        case .linger(let milliseconds):
            transport.shutdownWrite()
            armTimer(milliseconds)
        }
    }

    /// What is queued in the client's output (plaintext under TLS): what backpressure and the pumps measure.
    @inline(__always) var outputLength: Int { transport.outputLength }

    /// What is queued for the client and not yet written to its socket (see `ClientTransport.unsentOutput`).
    var unsentOutput: Int { transport.unsentOutput }

    // MARK: libevent events

    func clientReadable() {
        switch machine.phase {
        case .readingHead where isTransparentOpening:
            transparentOpeningReadable()
        case .readingHead:
            processInput()
        case .forwarding:
            transport.readMoreIfPending()
            machine.exchange?.pumpRequestBody()
        case .drainingRefusedBody:
            machine.exchange?.discardRequestBody()
        case .storing:
            transport.readMoreIfPending()
            machine.exchange?.intake?.readable()
        case .tunnel:
            transport.readMoreIfPending()
            machine.exchange?.tunnel?.pump(fromClient: true)
        case .openingInterception:
            if let driver = machine.exchange { clientHelloReadable(driver) }
        case .closing, .lingering:
            evbuffer_drain(input, evbuffer_get_length(input))
        case .held, .parked, .closed:
            // Held: what follows the head (a body, a pipelined request) waits in the input, below its watermark.
            break
        }
    }

    /// Writes what this exchange queued, towards the client and the upstream (called after every callback).
    /// Returns the upstream it flushed, if any.
    @discardableResult
    func flushPendingWrites() -> UpstreamConnection? {
        var rounds = 0
        var flushed: UpstreamConnection?
        while !machine.isClosed && !machine.isParked {
            flushed = machine.exchange?.upstream
            flushed?.flushPendingWrites()
            transport.flush(whole: !machine.isRelaying)
            rounds += 1
            guard rounds < 16, machine.isRelaying, let driver = machine.exchange,
                  driver.moveWhatFlushingMadeRoomFor() else { break }
        }
        switch machine.phase {
        case .forwarding, .tunnel:
            if let driver = machine.exchange, driver.afterFlush() { return flushPendingWrites() }
        case .closing:
            if unsentOutput == 0 { apply(machine.outputDrained()) }
        default:
            break
        }
        return flushed
    }

    func clientWritable() {
        defer { if !released { transport.writeCallbackRan() } }
        switch machine.state {
        case .closing:
            if unsentOutput == 0 { apply(machine.outputDrained()) }
        case .forwarding(let driver):
            driver.pumpResponseBody()
        case .tunnel(let driver):
            driver.tunnel?.pump(fromClient: false)
        case .readingHead, .drainingRefusedBody, .held, .storing, .parked, .openingInterception, .lingering, .closed:
            break
        }
    }

    func clientEvent(_ what: Int16) {
        if what & Int16(BEV_EVENT_CONNECTED) != 0 {
            // Only a TLS filter reports this: the client's handshake completed.
            transport.tlsHandshakeCompleted()
            if case .openingInterception(let driver) = machine.state { interceptionHandshakeCompleted(driver) }
            return
        }
        if case .openingInterception(let driver) = machine.state, !transport.isPlain {
            interceptionHandshakeFailed(driver, what)
            return
        }
        guard what & Int16(BEV_EVENT_EOF) != 0 else {
            // BEV_EVENT_ERROR (reset, write failure): nothing more can be sent to this client.
            abort(.clientAborted, detail: "client connection error")
            return
        }
        // Under TLS, the end both ways (`endsBothWaysAtEOF`): what is left to send never would be (session 19).
        if transport.endsBothWaysAtEOF, machine.exchange != nil || unsentOutput > 0 {
            return abort(.clientAborted, detail: "client ended its TLS connection before the response was sent")
        }
        // A half-close: what the client sent before it is answered, and what is queued for it is still written.
        machine.clientSentEOF()
        switch machine.state {
        case .readingHead where isTransparentOpening:
            transparentOpeningReadable(atEnd: true)
        case .readingHead:
            processInput()
            if machine.isReadingHead { apply(machine.closeWhenFlushed(outputBacklog: unsentOutput)) }
        case .forwarding(let driver):
            driver.perform(driver.machine.clientSentEOF())
        case .drainingRefusedBody(let driver):
            driver.discardRequestBody()
        case .tunnel(let driver):
            driver.tunnel?.peerClosed(client: true)
        case .openingInterception(let driver):
            // Gone before any byte of a ClientHello: the CONNECT is over.
            if driver.tunnel == nil { close() }
        case .storing(let driver):
            driver.intake?.clientEnded()
        case .held:
            // SPEC §18.2: a client that goes away is dropped at once (its place among the held is given back).
            abort(.clientAborted, detail: "client left while its request was held")
        case .lingering:
            apply(machine.clientEndedWhileLingering())
        case .closing, .parked, .closed:
            break
        }
    }

    /// The TLS socket wrote some records (an evbuffer callback, inside libevent's write): once everything is out,
    /// a closing connection closes, from the timer (never from inside the buffer's own callback).
    func socketOutputDrained() {
        guard case .closing = machine.phase, unsentOutput == 0 else { return }
        armTimer(0)
    }

    /// The timer's event fired: false when the timer was not due (it was armed again for later, `LazyTimer`) and
    /// nothing changed.
    func clientTimerFired() -> Bool {
        guard timer?.fired() == true else { return false }
        apply(machine.timerFired(outputBacklog: unsentOutput))
        return true
    }

    // MARK: reading requests

    /// Parses and handles every complete request head buffered, one at a time.
    func processInput() {
        guard !processing else { return }
        processing = true
        defer { processing = false }
        while machine.isReadingHead {
            let available = evbuffer_get_length(input)
            if available == 0 && handedHead == nil {
                apply(machine.inputEmpty(outputBacklog: unsentOutput))
                return
            }
            // The head timer starts on the head's first byte, but it is armed only when the head did not come whole
            // in this read: a whole head disarms it a few lines on, in the same callback, where no timer can fire (one
            // event_add per request for nothing, issue 31).
            var headTimer = StateMachine.Action.none
            if case .readingHead(nil) = machine.phase {
                headTimer = machine.headBytesBuffered(now: now())
            }
            let parsed = if let head = handedHead.take() { HeadParseResult.complete(head, length: 0) }
                else { onWorker { FrontParse.requestHead(input, settings: $0.settings) } }
            switch consume parsed {  // the head moves out of the result, not copied out and destroyed twice
            case .incomplete:
                apply(headTimer)
                apply(machine.incompleteHeadAtEOF(outputBacklog: unsentOutput))
                return
            case .invalid(let error):
                apply(headTimer)
                onWorker { $0.refreshSnapshot() }
                let exchange = Exchange(clientVersion: .http11, method: "-", url: "-", startedAt: headStarted())
                exchange.source = exchangeSource
                exchange.outcome = .error
                let driver = ExchangeDriver(session: self, exchange: exchange)
                if HTTP2Session.startsWithPreface(input) {
                    driver.respondError(.httpVersionNotSupported,
                                        detail: "HTTP/2 is spoken inside intercepted TLS (ALPN h2), not in clear text on the proxy port",
                                        close: true)
                } else {
                    driver.respondError(error.clientErrorCode, detail: error.detail, close: true)
                }
                return
            case .complete(let head, let length):
                evbuffer_drain(input, length)
                let started = headStarted()
                onWorker { $0.refreshSnapshot() }
                // A reload's timeouts apply to connections already open from their next request on, as before.
                machine.timeouts = onWorker { $0.settings.clientTimeouts }
                let exchange = Exchange(clientVersion: head.version, method: head.method, url: head.target, startedAt: started)
                exchange.overHTTP2 = transport.isStream
                exchange.source = exchangeSource
                ExchangeDriver(session: self, exchange: exchange).begin(head, source: requestSource)
            }
        }
    }

    /// Runs `body` on the worker without retaining it: it outlives the session (see `worker`), and a call through an
    /// `unowned(unsafe)` reference retains and releases it around the call (two atomic operations).
    @inline(__always) func onWorker<R>(_ body: (Worker) -> R) -> R {
        Unmanaged.passUnretained(worker)._withUnsafeGuaranteedRef(body)
    }

    @inline(__always) func now() -> UInt64 { onWorker { $0.clock.nowNanoseconds() } }

    /// Stops the head timer; returns when the head's first byte arrived.
    func headStarted() -> UInt64 {
        let (since, action) = machine.headParsed()
        apply(action)
        return since ?? now()
    }

    // MARK: deciding

    /// How this connection's requests came, as the access log says it (SPEC §16).
    var exchangeSource: ExchangeSource {
        transparent != nil ? .transparent : intercepted != nil ? .intercepted : .proxy
    }

    /// Where this connection's requests come from, as admission takes it.
    var requestSource: RequestSource {
        guard let intercepted else { return transparent == nil ? .forwardProxy : .transparent(.http) }
        return .intercepted(InterceptedOrigin(host: intercepted.host, port: intercepted.port, authority: intercepted.authority,
                                              proxyUser: intercepted.proxyUser))
    }

    /// The exchange `driver` drove is over (its line written, its upstream given back). The next head is read
    /// when the connection can be kept; otherwise it closes once what is queued has been written.
    func exchangeFinished(_ driver: ExchangeDriver) {
        apply(machine.exchangeFinished(keepAlive: driver.machine.keepAlive, draining: worker.isDraining,
                                       outputBacklog: unsentOutput,
                                       requestUnread: !driver.requestBody.isComplete && !transport.isStream))
        if machine.isReadingHead { processInput() }
    }

    /// Something failed after the response started, or the client vanished: no answer is possible any more.
    /// `reason` names the side that broke off (the access log's and metrics' reason); `detail` is for debugging.
    func abort(_ reason: AbortReason, detail: String) {
        if let driver = machine.exchange, driver.exchange.outcome != .rejected {
            let exchange = driver.exchange
            // An established tunnel was forwarded, whichever way it ends; the reason says how it ended.
            if driver.tunnel == nil || driver.tunnel?.machine.phase == .connecting { exchange.outcome = .error }
            if exchange.reason == nil { exchange.reason = reason.rawValue }
        }
        worker.logger.debug("exchange aborted", metadata: ["reason": "\(reason.rawValue)", "detail": "\(detail)"])
        close()
    }

    /// Frees the connection at once. Safe to call more than once.
    func close() {
        guard !released else { return }
        let driver = machine.exchange
        machine.closed()
        release(driver)
    }

    /// Frees the exchange's upstream and splices (if any), the timers and the wire; all but the wire for `successor`.
    func release(_ driver: ExchangeDriver? = nil, graceful: Bool = false, handingTo successor: HTTP2Session? = nil) {
        guard !released else { return }
        released = true
        // A TLS session that ends normally says so (close_notify), so the client can tell a response delimited by
        // the close from a cut one; an abort or a truncated response ends without it (RFC 8446 §6.1).
        let cleanTLSEnd = graceful && !truncated && intercepted?.established == true
        // A tunnel's line is written here, when it ends; so is that of an exchange cut short without a word.
        driver?.released()
        timer?.free()
        timer = nil
        shaping.release()
        stopServerFirstTimer()
        if let successor { return worker.clientChangedHands(from: self, to: successor) }
        transport.release(cleanTLSEnd: cleanTLSEnd)
        worker.clientClosed(self)
    }

    /// The client chose `h2` in the intercepted handshake (SPEC §17): the wire goes to `successor`, which is this
    /// same connection from now on; this session lets go of its timers and its place without closing anything.
    func handOver(to successor: HTTP2Session) {
        guard !released else { return }
        machine.closed()
        release(handingTo: successor)
    }

    /// Drain: close if idle between requests, once what is queued for the client is written; otherwise close after
    /// the current response.
    func drain() {
        if machine.isReadingHead && evbuffer_get_length(input) == 0 {
            // Idle between requests, though the last response may still be on its way to a slow reader: the
            // connection closes once that is written (SPEC §6), and an intercepted client is told with close_notify
            // that nothing was cut. Freeing it at once dropped what was queued.
            apply(machine.closeWhenFlushed(outputBacklog: unsentOutput))
        } else {
            machine.exchange?.machine.closeAfter()
        }
    }

    // MARK: timers

    /// Arms the connection's shaping timer for `deadline` (monotonic nanoseconds), unless it is armed sooner: one
    /// timer per connection wakes whatever a link profile's bucket or latency, or a spent budget, holds back.
    func armShapingTimer(at deadline: UInt64) {
        guard !released else { return }
        shaping.arm(at: deadline, base: worker.base, owner: context(self)) { now() }
    }

    func shapingTimerFired() {
        shaping.fired()
        worker.metrics.shapingTimerFired()
        switch machine.state {
        case .forwarding(let driver), .tunnel(let driver), .drainingRefusedBody(let driver), .openingInterception(let driver):
            driver.shapingTimerFired()
        case .readingHead, .held, .storing, .parked, .closing, .lingering, .closed:
            break
        }
    }

    func armTimer(_ milliseconds: Int64) {
        timer?.arm(milliseconds)
    }

    func disarmTimer() {
        timer?.disarm()
    }
}
