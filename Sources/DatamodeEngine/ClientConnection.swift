import CDatamodeShims
import CLibevent
import DatamodeConfig
import DatamodeHTTP
import DatamodePolicy
import DatamodeState
#if canImport(Glibc)
import Glibc
#endif

/// One client connection: the executor of its state machines. It reads request heads, decides, forwards or
/// answers, relays bodies, and keeps the connection alive for the next request. What to do next is decided by
/// values (`ClientConnectionStateMachine` for the connection, `ExchangeStateMachine` for each exchange,
/// `TunnelStateMachine` for a tunnel); this class feeds them what libevent reported and what its buffers hold,
/// and carries out the actions they return.
///
/// Requests on one connection are handled strictly one at a time, so pipelined requests are answered in order:
/// the next head is not even parsed until the current response is complete (its bytes wait in the input
/// buffer, bounded by the read watermark).
final class ClientConnection {
    typealias StateMachine = ClientConnectionStateMachine<Exchange>

    unowned let worker: Worker
    /// The wire to the client: plain TCP or TLS, its buffers, speculative writes, parking.
    let transport: ClientTransport
    /// What the client sent (plaintext under TLS), and what is queued for it.
    @inline(__always) var input: OpaquePointer { transport.input }
    @inline(__always) var output: OpaquePointer { transport.output }
    let peerAddress: IPAddress?
    let peerText: String
    private var timer: OpaquePointer?
    var machine: StateMachine
    /// Set while `processInput` runs, so a response completed inside it does not recurse into it.
    private var processing = false
    /// The bufferevent and the timer have been freed.
    private(set) var released = false
    /// Where this connection's requests come from: nil for the proxy port itself (absolute-form requests), or the
    /// intercepted tunnel whose TLS the proxy terminated (origin-form requests for its authority, SPEC §9). The
    /// HTTP path below is the same for both; SPEC §16's transparent listener and HTTP/2 will be further sources.
    var intercepted: InterceptedTunnel?
    /// A response was cut short: the TLS session must not end with a close_notify that would present it as whole.
    var truncated = false
    /// Wakes the connection when a link profile's bucket refills or its added latency passes (created on first use).
    var shapingTimer: OpaquePointer?
    /// When `shapingTimer` is due (monotonic nanoseconds); nil when not armed.
    var shapingDeadline: UInt64?

    init(worker: Worker, bev: OpaquePointer, peer: SocketAddress) {
        self.worker = worker
        transport = ClientTransport(worker: worker, bev: bev)
        self.peerAddress = peer.ipAddress
        self.peerText = peer.hostText
        let settings = worker.settings
        machine = StateMachine(timeouts: settings.clientTimeouts)
    }

    func start() {
        transport.configure(owner: context(self))
        timer = dm_timer_new(worker.base, clientTimerCallback, context(self))
        apply(machine.started())
    }

    // MARK: parking (an idle connection gives its buffers back)

    /// Gives the buffers and the timer back while the connection waits idle between requests (the transport
    /// parks when it can: plain TCP, nothing buffered); its socket's next byte or the end of `client-idle` brings
    /// the connection back. Returns whether it parked.
    private func park(idleLeft milliseconds: Int64) -> Bool {
        guard machine.isReadingHead, transport.park(idleFor: milliseconds) else { return false }
        if let timer { event_free(timer) }
        timer = nil
        machine.parked()
        return true
    }

    /// The parked socket is readable (a request's first byte, or EOF), or `client-idle` ran out (`timedOut`).
    func parkedReadFired(timedOut: Bool) {
        guard machine.isParked else { return }
        transport.parkedReadFired()
        timer = dm_timer_new(worker.base, clientTimerCallback, context(self))
        if timedOut {
            clientTimerFired()
        } else {
            // The idle clock keeps running until a head's first byte arrives (which arms client-header).
            let now = worker.clock.nowNanoseconds()
            let until = transport.parkedUntil
            armTimer(Int64((until > now ? until - now : 0) / 1_000_000))
            guard transport.unpark() else {
                close()
                return
            }
            machine.unparked()
        }
    }

    /// Carries out a connection-level action.
    func apply(_ action: StateMachine.Action) {
        switch action {
        case .none:
            break
        case .armTimer(let milliseconds):
            // Closing: the write callback must fire once everything is written (to the socket, under TLS).
            if case .closing = machine.state { transport.closeWhenWritten() }
            armTimer(milliseconds)
        case .disarmTimer:
            disarmTimer()
        case .close:
            release(graceful: true)
        case .park(let milliseconds):
            if !park(idleLeft: milliseconds) { armTimer(milliseconds) }
        }
    }

    /// What is queued in the client's output (plaintext under TLS): what backpressure and the pumps measure.
    @inline(__always) var outputLength: Int { transport.outputLength }

    /// What is queued for the client and not yet written to its socket (see `ClientTransport.unsentOutput`).
    var unsentOutput: Int { transport.unsentOutput }

    // MARK: libevent events

    func clientReadable() {
        switch machine.state {
        case .readingHead:
            processInput()
        case .forwarding(let exchange):
            readMoreIfPending()
            pumpRequestBody(exchange)
        case .drainingRefusedBody(let exchange):
            discardRequestBody(exchange)
        case .tunnel(let exchange):
            readMoreIfPending()
            pumpTunnel(exchange, fromClient: true)
        case .openingInterception(let exchange):
            clientHelloReadable(exchange)
        case .closing:
            evbuffer_drain(input, evbuffer_get_length(input))
        case .parked, .closed:
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
            transport.flush()
            rounds += 1
            guard rounds < 16, moveWhatFlushingMadeRoomFor() else { break }
        }
        afterFlush()
        return flushed
    }

    func afterFlush() {
        switch machine.state {
        case .tunnel(let exchange):
            guard let tunnel = exchange.tunnel else { return }
            if tunnel.clientEnded || tunnel.originEnded { propagateTunnelEnds(exchange) }
            if !released && SpliceRelay.enabled && exchange.splices.isEmpty { switchTunnelToSpliceIfIdle(exchange) }
        case .forwarding(let exchange):
            if exchange.splices.isEmpty && exchange.response != nil { switchBodyToSpliceIfIdle(exchange) }
        case .closing:
            if unsentOutput == 0 { apply(machine.outputDrained()) }
        default:
            break
        }
    }

    /// A pump moves only what fits below the destination's high water. If the write that follows empties the
    /// destination, no write event is registered (writes are speculative), and the bytes left in the source
    /// were already read from its socket, so no read event will come for them either: move them now.
    /// Returns whether anything moved.
    func moveWhatFlushingMadeRoomFor() -> Bool {
        guard let exchange = machine.exchange, let upstream = exchange.upstream, upstream.isConnected else { return false }
        let before = evbuffer_get_length(input) + evbuffer_get_length(upstream.input)
        switch machine.state {
        case .forwarding:
            if exchange.response != nil && evbuffer_get_length(upstream.input) > 0 && outputLength < Flow.highWater {
                pumpResponseBody(exchange)
            }
            if isCurrent(exchange), exchange.upstream === upstream, !exchange.requestBody.isComplete,
               evbuffer_get_length(input) > 0, evbuffer_get_length(upstream.output) < Flow.highWater {
                pumpRequestBody(exchange)
            }
        case .tunnel:
            if evbuffer_get_length(upstream.input) > 0 && outputLength < Flow.highWater {
                pumpTunnel(exchange, fromClient: false)
            }
            if evbuffer_get_length(input) > 0 && evbuffer_get_length(upstream.output) < Flow.highWater {
                pumpTunnel(exchange, fromClient: true)
            }
        default:
            return false
        }
        guard isCurrent(exchange), exchange.upstream === upstream else { return false }
        return evbuffer_get_length(input) + evbuffer_get_length(upstream.input) < before
    }

    func clientWritable() {
        defer { if !released { transport.writeCallbackRan() } }
        switch machine.state {
        case .closing:
            if unsentOutput == 0 { apply(machine.outputDrained()) }
        case .forwarding(let exchange):
            pumpResponseBody(exchange)
        case .tunnel(let exchange):
            pumpTunnel(exchange, fromClient: false)
        case .readingHead, .drainingRefusedBody, .parked, .openingInterception, .closed:
            break
        }
    }

    func clientEvent(_ what: Int16) {
        if what & Int16(BEV_EVENT_CONNECTED) != 0 {
            // Only a TLS filter reports this: the client's handshake completed.
            if case .openingInterception(let exchange) = machine.state { interceptionHandshakeCompleted(exchange) }
            return
        }
        if case .openingInterception(let exchange) = machine.state, !transport.isPlain {
            interceptionHandshakeFailed(exchange, what)
            return
        }
        guard what & Int16(BEV_EVENT_EOF) != 0 else {
            // BEV_EVENT_ERROR (reset, write failure): nothing more can be sent to this client.
            abort(.clientAborted, detail: "client connection error")
            return
        }
        // A half-close: what the client sent before it is answered, and what is queued for it is still written.
        machine.clientSentEOF()
        switch machine.state {
        case .readingHead:
            processInput()
            if machine.isReadingHead { apply(machine.closeWhenFlushed(outputBacklog: unsentOutput)) }
        case .forwarding(let exchange):
            perform(exchange, exchange.machine.clientSentEOF())
        case .drainingRefusedBody(let exchange):
            discardRequestBody(exchange)
        case .tunnel(let exchange):
            tunnelPeerClosed(exchange, client: true)
        case .openingInterception(let exchange):
            // Gone before any byte of a ClientHello: the CONNECT is over.
            if exchange.tunnel == nil { close() }
        case .closing, .parked, .closed:
            break
        }
    }

    /// The TLS socket wrote some records (an evbuffer callback, inside libevent's write): once everything is out,
    /// a closing connection closes, from the timer (never from inside the buffer's own callback).
    func socketOutputDrained() {
        guard case .closing = machine.state, unsentOutput == 0 else { return }
        armTimer(0)
    }

    func clientTimerFired() {
        apply(machine.timerFired(outputBacklog: unsentOutput))
    }

    /// Bulk request bodies and tunnels: after a full 4 KiB libevent read, take the rest in one readv.
    @inline(__always)
    func readMoreIfPending() { transport.readMoreIfPending() }

    /// Whether `exchange` is still the one this connection is busy with (an upstream callback may arrive for
    /// one that has just ended).
    func isCurrent(_ exchange: Exchange) -> Bool {
        machine.exchange === exchange
    }

    // MARK: reading requests

    /// Parses and handles every complete request head buffered, one at a time.
    func processInput() {
        guard !processing else { return }
        processing = true
        defer { processing = false }
        while machine.isReadingHead {
            let available = evbuffer_get_length(input)
            if available == 0 {
                apply(machine.inputEmpty(outputBacklog: unsentOutput))
                return
            }
            if case .readingHead(nil) = machine.state {
                apply(machine.headBytesBuffered(now: worker.clock.nowNanoseconds()))
            }
            switch parseHead(available: available) {
            case .incomplete:
                apply(machine.incompleteHeadAtEOF(outputBacklog: unsentOutput))
                return
            case .invalid(let error):
                worker.refreshSnapshot()
                let exchange = Exchange(clientVersion: .http11, method: "-", url: "-", startedAt: headStarted())
                exchange.outcome = .error
                respondError(exchange, Self.code(for: error, fromClient: true), detail: Self.detail(for: error), close: true)
                return
            case .complete(let head, let length):
                evbuffer_drain(input, length)
                let started = headStarted()
                begin(head, startedAt: started)
            }
        }
    }

    /// Stops the head timer; returns when the head's first byte arrived.
    func headStarted() -> UInt64 {
        let (since, action) = machine.headParsed()
        apply(action)
        return since ?? worker.clock.nowNanoseconds()
    }

    func parseHead(available: Int) -> HeadParseResult<RequestHead> {
        let limits = worker.settings.limits
        return FrontParse.parse(input, limit: worker.settings.maxHeadBytes, incomplete: .incomplete,
                                isIncomplete: { if case .incomplete = $0 { true } else { false } }) {
            HTTP1Parser.parseRequestHead($0, limits: limits)
        }
    }

    // MARK: deciding

    /// Where this connection's requests come from, as admission takes it.
    var requestSource: RequestSource {
        guard let intercepted else { return .forwardProxy }
        return .intercepted(InterceptedOrigin(host: intercepted.host, port: intercepted.port, authority: intercepted.authority,
                                              proxyUser: intercepted.proxyUser))
    }

    /// A request head was read: admission decides (`Admission.admit`, pure), and this carries the verdict out.
    func begin(_ head: RequestHead, startedAt: UInt64) {
        worker.refreshSnapshot()
        let settings = worker.settings
        // A reload's timeouts apply to connections already open from their next request on, as before.
        machine.timeouts = settings.clientTimeouts
        let exchange = Exchange(clientVersion: head.version, method: head.method, url: head.target, startedAt: startedAt)
        exchange.connectionTokens = head.connectionTokens
        let tlsServer = worker.tlsServer
        let admission = Admission.admit(head, source: requestSource, client: peerAddress, clientText: peerText,
                                        settings: settings, budgets: worker.budgets,
                                        intercepts: { tlsServer != nil && settings.tls.intercepts(host: $0) },
                                        now: worker.clock.wallNanoseconds() / 1_000_000_000)
        guard let framing = admission.framing else {
            // Ambiguous framing: refused and closed before anything else is looked at (RFC 9112 §6.3).
            exchange.outcome = .error
            carryOut(admission.verdict, exchange, head)
            return
        }
        exchange.requestBody = BodyRelay(framing: framing)
        exchange.requestFraming = framing
        exchange.machine = ExchangeStateMachine(requestComplete: exchange.requestBody.isComplete, keepAlive: admission.keepAlive)
        if !exchange.requestBody.isComplete {
            exchange.expectsContinue = head.values(of: "expect").contains { $0.utf8.count == 12 && $0.lowercased() == "100-continue" }
        }
        if let url = admission.url { exchange.url = url }
        exchange.session = admission.session
        exchange.budgetMask = admission.budgetMask
        if let mode = admission.mode { exchange.mode = mode }
        if let tags = admission.tags {
            exchange.tags = tags
            exchange.tagSources = admission.tagSources
            exchange.rule = admission.rule
        }
        switch admission.verdict {
        case .refuse, .reject, .budgetExhausted:
            break
        case .intercept, .tunnel, .forward, .serveVariant:
            applyLinkProfile(exchange, linkProfile(for: exchange, mode: exchange.mode))
            if let intercepted {
                // SPEC §10: a tunnel's latency is added once; inside an intercepted tunnel that is the first
                // request's response head, not every request's.
                if intercepted.latencyAdded {
                    exchange.latency = .none
                } else if case .pending = exchange.latency {
                    intercepted.latencyAdded = true
                }
            }
        }
        carryOut(admission.verdict, exchange, head)
        // The requests inside an intercepted tunnel act as the user of its CONNECT.
        if case .intercept = admission.verdict { intercepted?.proxyUser = admission.proxyUser }
    }

    /// Carries out what admission decided.
    private func carryOut(_ verdict: Admission.Verdict, _ exchange: Exchange, _ head: RequestHead) {
        switch verdict {
        case .refuse(let code, let detail, let close, let fields):
            respondError(exchange, code, detail: detail, close: close, extraFields: fields)
        case .reject(let rejection, let budget):
            exchange.outcome = .rejected
            exchange.reason = rejection.code.rawValue
            let reasonField = [("Network-Unavailable-Reason", rejection.code.rawValue)]
            if let budget {
                var problem = rejection.problem(mode: exchange.mode, url: exchange.url)
                problem.extra.append(("budget", JSONText.quote(budget)))
                respondProblem(exchange, problem, close: false, extraFields: reasonField)
            } else {
                respondProblem(exchange, rejection.code, body: rejection.problemBody(mode: exchange.mode, url: exchange.url),
                               close: false, extraFields: reasonField)
            }
            if head.method == "GET", let known = worker.knownLengths[exchange.url] {
                worker.metrics.saved(.rejected, bytes: Int(known))
            }
        case .budgetExhausted(let index):
            refuseForBudget(exchange, index, url: exchange.url)
        case .intercept(let target):
            beginInterception(exchange, target: target)
        case .tunnel(let target):
            beginTunnel(exchange, target: target)
        case .forward(let target, let tags):
            exchange.outcome = .forwarded
            forward(exchange, head, to: target, tags: tags, variant: nil)
        case .serveVariant(let target, let tags, let rewrite):
            exchange.outcome = .rewritten
            exchange.variant = rewrite.id
            serveVariant(exchange, head, tags: tags, rewrite: rewrite)
        }
    }

    func serveVariant(_ exchange: Exchange, _ head: RequestHead, tags: RequestTags, rewrite: VariantRewrite) {
        switch rewrite.action {
        case .fetch(let url):
            switch RequestTarget.parse(url, method: head.method) {
            case .success(let target) where target.form == .absolute:
                forward(exchange, head, to: target, tags: tags, variant: rewrite.id)
            default:
                respondError(exchange, .upstreamUnreachable, detail: "variant \(rewrite.id) has an unusable target \(url)",
                             close: false)
            }
        case .redirect(let location):
            respondLocal(exchange, status: 307, reason: "Temporary Redirect",
                         fields: [("Location", location), ("Cache-Control", "no-store"), ("Data-Mode-Variant", rewrite.id)],
                         body: [], close: false)
        case .file(let path, let contentType):
            serveFile(exchange, head, path: path, contentType: contentType, variant: rewrite.id)
        }
    }

    // MARK: completion

    func finishExchange(_ exchange: Exchange, recycleUpstream: Bool) {
        releaseUpstream(of: exchange, recycle: recycleUpstream)
        logExchange(exchange)
        apply(machine.exchangeFinished(keepAlive: exchange.machine.keepAlive, draining: worker.isDraining,
                                       outputBacklog: unsentOutput))
        if machine.isReadingHead { processInput() }
    }

    /// Detaches the exchange's upstream: back to the pool at a clean message boundary, else closed.
    func releaseUpstream(of exchange: Exchange, recycle: Bool) {
        guard let upstream = exchange.upstream else { return }
        upstream.detach()
        exchange.upstream = nil
        if recycle && evbuffer_get_length(upstream.input) == 0 {
            worker.pool.put(upstream)
        } else {
            upstream.close()
        }
    }

    func logExchange(_ exchange: Exchange) {
        guard !exchange.logged else { return }
        exchange.logged = true
        worker.record(exchange, client: peerText)
    }

    /// Something failed after the response started, or the client vanished: no answer is possible any more.
    /// `reason` names the side that broke off (the access log's and metrics' reason); `detail` is for debugging.
    func abort(_ reason: AbortReason, detail: String) {
        if let exchange = machine.exchange, exchange.outcome != .rejected {
            // An established tunnel was forwarded, whichever way it ends; the reason says how it ended.
            if exchange.tunnel == nil || exchange.tunnel?.phase == .connecting { exchange.outcome = .error }
            if exchange.reason == nil { exchange.reason = reason.rawValue }
        }
        worker.logger.debug("exchange aborted", metadata: ["reason": "\(reason.rawValue)", "detail": "\(detail)"])
        close()
    }

    /// Frees the connection at once. Safe to call more than once.
    func close() {
        guard !released else { return }
        let exchange = machine.exchange
        machine.closed()
        release(exchange)
    }

    /// Frees everything: the exchange's upstream and splices (when it still has one), the timer, the bufferevent.
    func release(_ exchange: Exchange? = nil, graceful: Bool = false) {
        guard !released else { return }
        released = true
        // A TLS session that ends normally says so (close_notify), so the client can tell a response delimited by
        // the close from a cut one; an abort or a truncated response ends without it (RFC 8446 §6.1).
        let cleanTLSEnd = graceful && !truncated && intercepted?.established == true
        if let exchange {
            for relay in exchange.splices { relay.stop() }
            exchange.splices = []
            exchange.tunnel?.fail()
            exchange.upstream?.close()
            exchange.upstream = nil
            // A tunnel's line is written here, when it ends; so is that of an exchange cut short without a word.
            logExchange(exchange)
        }
        if let timer { event_free(timer) }
        timer = nil
        releaseShapingTimer()
        transport.release(cleanTLSEnd: cleanTLSEnd)
        worker.clientClosed(self)
    }

    /// Drain: close now if idle between requests; otherwise close after the current response.
    func drain() {
        if machine.isParked {
            close()
        } else if machine.isReadingHead && evbuffer_get_length(input) == 0 {
            // Idle between requests: an intercepted client is told with close_notify that nothing was cut.
            machine.closed()
            release(graceful: unsentOutput == 0)
        } else {
            machine.exchange?.machine.closeAfter()
        }
    }

    // MARK: timers

    func armTimer(_ milliseconds: Int64) {
        guard let timer else { return }
        dm_event_add_ms(timer, milliseconds)
    }

    func disarmTimer() {
        guard let timer else { return }
        event_del(timer)
    }

    // MARK: error mapping

    static func code(for error: HTTPWireError, fromClient: Bool) -> ProxyErrorCode {
        guard fromClient else { return .upstreamProtocolError }
        switch error {
        case .malformed: return .badRequest
        case .requestLineTooLong: return .uriTooLong
        case .headerSectionTooLarge: return .headersTooLarge
        }
    }

    static func detail(for error: HTTPWireError) -> String {
        switch error {
        case .malformed(let why): why
        case .requestLineTooLong: "the request line is longer than limits.request-line"
        case .headerSectionTooLarge: "the header section exceeds limits.header-section or limits.header-count"
        }
    }
}
