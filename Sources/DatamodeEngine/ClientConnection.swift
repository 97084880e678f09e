import CDatamodeShims
import CLibevent
import DatamodeConfig
import DatamodeHTTP
import DatamodePolicy
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
    private(set) var bev: OpaquePointer
    let input: OpaquePointer
    let output: OpaquePointer
    let peer: SocketAddress
    let peerAddress: IPAddress?
    let peerText: String
    private var timer: OpaquePointer?
    private var machine: StateMachine
    /// Set while `processInput` runs, so a response completed inside it does not recurse into it.
    private var processing = false
    /// The bufferevent and the timer have been freed.
    private var released = false
    private var writer = SpeculativeWriter()

    init(worker: Worker, bev: OpaquePointer, peer: SocketAddress) {
        self.worker = worker
        self.bev = bev
        self.input = bufferevent_get_input(bev)
        self.output = bufferevent_get_output(bev)
        self.peer = peer
        self.peerAddress = peer.ipAddress
        self.peerText = peer.hostText
        let settings = worker.settings
        machine = StateMachine(timeouts: .init(clientIdle: settings.clientIdleMs, clientHeader: settings.clientHeaderMs,
                                               drain: settings.drainMs))
    }

    func start() {
        bufferevent_setcb(bev, clientReadCallback, clientWriteCallback, clientEventCallback, context(self))
        // Read high watermark: a client cannot make us buffer more than this while we are busy with its
        // previous request (pipelining) or while the upstream is slower than the client (request bodies).
        bufferevent_setwatermark(bev, Int16(EV_READ), 0, Flow.highWater)
        bufferevent_setwatermark(bev, Int16(EV_WRITE), Flow.lowWater, 0)
        bufferevent_set_max_single_read(bev, Flow.maxSingleIO)
        bufferevent_set_max_single_write(bev, Flow.maxSingleIO)
        timer = dm_timer_new(worker.base, clientTimerCallback, context(self))
        // EV_WRITE stays off: writes are speculative (see SpeculativeWriter).
        bufferevent_disable(bev, Int16(EV_WRITE))
        bufferevent_enable(bev, Int16(EV_READ))
        apply(machine.started())
    }

    /// Carries out a connection-level action.
    private func apply(_ action: StateMachine.Action) {
        switch action {
        case .none:
            break
        case .armTimer(let milliseconds):
            // Closing: the write callback must fire when the output is empty, not at the low watermark.
            if case .closing = machine.state { bufferevent_setwatermark(bev, Int16(EV_WRITE), 0, 0) }
            armTimer(milliseconds)
        case .disarmTimer:
            disarmTimer()
        case .close:
            release()
        }
    }

    private var outputLength: Int { evbuffer_get_length(output) }

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
        case .closing:
            evbuffer_drain(input, evbuffer_get_length(input))
        case .closed:
            break
        }
    }

    /// Writes what this exchange queued, towards the client and the upstream (called after every callback).
    /// Returns the upstream it flushed, if any.
    @discardableResult
    func flushPendingWrites() -> UpstreamConnection? {
        var rounds = 0
        var flushed: UpstreamConnection?
        while !machine.isClosed {
            flushed = machine.exchange?.upstream
            flushed?.flushPendingWrites()
            writer.flush(bev, output: output)
            rounds += 1
            guard rounds < 16, moveWhatFlushingMadeRoomFor() else { break }
        }
        afterFlush()
        return flushed
    }

    private func afterFlush() {
        switch machine.state {
        case .tunnel(let exchange):
            guard let tunnel = exchange.tunnel else { return }
            if tunnel.clientEnded || tunnel.originEnded { propagateTunnelEnds(exchange) }
            if !released && SpliceRelay.enabled && exchange.splices.isEmpty { switchTunnelToSpliceIfIdle(exchange) }
        case .closing:
            if outputLength == 0 { apply(machine.outputDrained()) }
        default:
            break
        }
    }

    /// A pump moves only what fits below the destination's high water. If the write that follows empties the
    /// destination, no write event is registered (writes are speculative), and the bytes left in the source
    /// were already read from its socket, so no read event will come for them either: move them now.
    /// Returns whether anything moved.
    private func moveWhatFlushingMadeRoomFor() -> Bool {
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
        defer { if !released { writer.drained(bev, output: output) } }
        switch machine.state {
        case .closing:
            if outputLength == 0 { apply(machine.outputDrained()) }
        case .forwarding(let exchange):
            pumpResponseBody(exchange)
        case .tunnel(let exchange):
            pumpTunnel(exchange, fromClient: false)
        case .readingHead, .drainingRefusedBody, .closed:
            break
        }
    }

    func clientEvent(_ what: Int16) {
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
            if machine.isReadingHead { apply(machine.closeWhenFlushed(outputBacklog: outputLength)) }
        case .forwarding(let exchange):
            perform(exchange, exchange.machine.clientSentEOF())
        case .drainingRefusedBody(let exchange):
            discardRequestBody(exchange)
        case .tunnel(let exchange):
            tunnelPeerClosed(exchange, client: true)
        case .closing, .closed:
            break
        }
    }

    func clientTimerFired() {
        apply(machine.timerFired(outputBacklog: outputLength))
    }

    /// Bulk request bodies and tunnels: after a full 4 KiB libevent read, take the rest in one readv.
    @inline(__always)
    private func readMoreIfPending() {
        let buffered = evbuffer_get_length(input)
        guard buffered >= BulkRead.libeventReadCap, buffered < Flow.highWater else { return }
        BulkRead.readAvailable(fd: bufferevent_getfd(bev), into: input, budget: Flow.highWater - buffered)
    }

    /// Whether `exchange` is still the one this connection is busy with (an upstream callback may arrive for
    /// one that has just ended).
    private func isCurrent(_ exchange: Exchange) -> Bool {
        machine.exchange === exchange
    }

    // MARK: reading requests

    /// Parses and handles every complete request head buffered, one at a time.
    private func processInput() {
        guard !processing else { return }
        processing = true
        defer { processing = false }
        while machine.isReadingHead {
            let available = evbuffer_get_length(input)
            if available == 0 {
                apply(machine.inputEmpty(outputBacklog: outputLength))
                return
            }
            if case .readingHead(nil) = machine.state {
                apply(machine.headBytesBuffered(now: worker.clock.nowNanoseconds()))
            }
            switch parseHead(available: available) {
            case .incomplete:
                apply(machine.incompleteHeadAtEOF(outputBacklog: outputLength))
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
    private func headStarted() -> UInt64 {
        let (since, action) = machine.headParsed()
        apply(action)
        return since ?? worker.clock.nowNanoseconds()
    }

    private func parseHead(available: Int) -> HeadParseResult<RequestHead> {
        let limits = worker.settings.limits
        let contiguous = evbuffer_get_contiguous_space(input)
        if contiguous > 0, let start = evbuffer_pullup(input, contiguous) {
            let result = HTTP1Parser.parseRequestHead(UnsafeRawBufferPointer(start: start, count: contiguous), limits: limits)
            if case .incomplete = result, contiguous < available {
                // The head spans chains: make (a bounded prefix of) it contiguous and try again.
            } else {
                return result
            }
        }
        let window = min(available, worker.settings.maxHeadBytes)
        guard let start = evbuffer_pullup(input, window) else { return .incomplete }
        return HTTP1Parser.parseRequestHead(UnsafeRawBufferPointer(start: start, count: window), limits: limits)
    }

    // MARK: deciding

    private func begin(_ head: RequestHead, startedAt: UInt64) {
        worker.refreshSnapshot()
        let settings = worker.settings
        let exchange = Exchange(clientVersion: head.version, method: head.method, url: head.target, startedAt: startedAt)
        let tokens = head.connectionTokens
        exchange.connectionTokens = tokens
        let keepAlive = (head.version == .http11 ? !tokens.contains("close") : tokens.contains("keep-alive"))
            && !machine.clientEnded

        // Framing first: a request whose body boundaries are ambiguous must never be answered on a kept-alive
        // connection, whatever else is wrong with it (RFC 9112 §6.3, request smuggling).
        let framing: BodyFraming
        switch head.bodyFraming() {
        case .success(let f): framing = f
        case .failure(let error):
            exchange.outcome = .error
            respondError(exchange, Self.code(for: error, fromClient: true), detail: Self.detail(for: error), close: true)
            return
        }
        exchange.requestBody = BodyRelay(framing: framing)
        exchange.requestFraming = framing
        exchange.machine = ExchangeStateMachine(requestComplete: exchange.requestBody.isComplete, keepAlive: keepAlive)
        if !exchange.requestBody.isComplete {
            exchange.expectsContinue = head.values(of: "expect").contains { $0.utf8.count == 12 && $0.lowercased() == "100-continue" }
        }

        if head.values(of: "host").count > 1 {
            respondError(exchange, .badRequest, detail: "more than one Host header field (RFC 9112 §3.2)", close: true)
            return
        }
        guard worker.accessAllowed(peerAddress) else {
            respondError(exchange, .accessDenied, detail: "client \(peerText) is not in access.allow", close: true)
            return
        }
        if !settings.users.isEmpty && !ProxyAuthorization.accepts(head.values(of: "proxy-authorization"), users: settings.users) {
            respondError(exchange, .proxyAuthRequired, detail: nil, close: false,
                         extraFields: [("Proxy-Authenticate", "Basic realm=\"datamode-proxy\", charset=\"UTF-8\"")])
            return
        }
        let target: RequestTarget
        switch RequestTarget.parse(head.target, method: head.method) {
        case .success(let t): target = t
        case .failure(let error):
            respondError(exchange, Self.code(for: error, fromClient: true), detail: Self.detail(for: error), close: true)
            return
        }
        switch target.form {
        case .origin, .asterisk:
            respondError(exchange, .notAProxyRequest,
                         detail: "this is a forward proxy: send absolute-form requests (http://host/path), e.g. curl -x",
                         close: false)
            return
        case .absolute, .authority:
            break
        }
        exchange.url = target.absoluteURL
        if MessageHeads.hasOwnVia(head) {
            respondError(exchange, .loopDetected, detail: "the request already passed through this proxy", close: false)
            return
        }

        let facts = RequestFacts(method: head.method, url: target.absoluteURL, host: target.host, port: Int(target.port),
                                 path: target.path, isConnect: target.form == .authority, client: peerAddress,
                                 fields: head.fields.map { (name: $0.name, value: $0.value) })
        var provenance = TagProvenance()
        let decision = decide(facts, mode: settings.mode, policy: settings.policy, provenance: &provenance)
        if let tags = decision.tags {
            exchange.tags = tags
            exchange.tagSources = provenance
            exchange.rule = settings.policy.ruleName(for: decision, provenance: provenance)
        }

        // Refusals are the same for a CONNECT and any other request.
        switch decision {
        case .invalidTag(let detail):
            respondError(exchange, .invalidTag, detail: detail, close: false)
            return
        case .reject(_, let rejection):
            exchange.outcome = .rejected
            exchange.reason = rejection.code.rawValue
            respondProblem(exchange, rejection.problem(mode: settings.mode, url: target.absoluteURL), close: false,
                           extraFields: [("Network-Unavailable-Reason", rejection.code.rawValue)])
            return
        case .forward, .serveVariant:
            break
        }
        if target.form == .authority {
            beginTunnel(exchange, target: target)
            return
        }
        switch decision {
        case .forward(let tags):
            exchange.outcome = .forwarded
            forward(exchange, head, to: target, tags: tags, variant: nil)
        case .serveVariant(let tags, let rewrite):
            exchange.outcome = .rewritten
            exchange.variant = rewrite.id
            serveVariant(exchange, head, tags: tags, rewrite: rewrite)
        case .invalidTag, .reject:
            break  // answered above
        }
    }

    private func serveVariant(_ exchange: Exchange, _ head: RequestHead, tags: RequestTags, rewrite: VariantRewrite) {
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

    // MARK: forwarding

    private func forward(_ exchange: Exchange, _ head: RequestHead, to target: RequestTarget, tags: RequestTags,
                         variant: String?) {
        let settings = worker.settings
        let tokens = exchange.connectionTokens
        let upgrade = head.contains("upgrade") && tokens.contains("upgrade")
        exchange.headBytes = MessageHeads.forwardedRequest(head, target: target, tags: tags, settings: settings.tagSettings,
                                                           mode: settings.mode, upgrade: upgrade,
                                                           framing: exchange.requestFraming, connectionTokens: tokens,
                                                           variantTarget: variant != nil)
        exchange.variant = variant
        exchange.upgradeRequested = upgrade
        machine.forward(exchange)
        connectUpstream(exchange, key: UpstreamKey(host: target.host, port: target.port, tls: target.scheme == "https"),
                        reuse: true)
    }

    private func connectUpstream(_ exchange: Exchange, key: UpstreamKey, reuse: Bool) {
        let upstream = (reuse ? worker.pool.take(key) : nil) ?? UpstreamConnection(worker: worker, key: key)
        exchange.upstream = upstream
        exchange.upstreamReused = upstream.isReused
        upstream.attach(self)
        upstream.send(exchange.headBytes, responseTimeoutMs: worker.settings.upstreamResponseMs)
        upstream.start()
        guard forwardedExchange(of: upstream) === exchange else { return }
        if upstream.isConnected { perform(exchange, exchange.machine.upstreamConnected()) }
        if exchange.requestBody.isComplete { upstream.requestComplete() } else { pumpRequestBody(exchange) }
    }

    /// Carries out an exchange-level action.
    private func perform(_ exchange: Exchange, _ action: ExchangeStateMachine.Action) {
        switch action {
        case .none:
            break
        case .pumpRequestBody:
            pumpRequestBody(exchange)
        case .pumpResponseBody:
            pumpResponseBody(exchange)
        case .requestSent:
            exchange.upstream?.requestComplete()
        case .finish(let recycle):
            finishExchange(exchange, recycleUpstream: recycle)
        case .refuseRequest:
            // Nothing of this request may reach the origin (SPEC §6: never forwarded). The head and any valid
            // chunks are still only queued: libevent writes them after this callback returns (for a fresh
            // connection, right after the CONNECTED callback that brought us here), so drop them first.
            exchange.upstream?.discardPendingOutput()
            exchange.upstream?.close()
            exchange.upstream = nil
            let error = exchange.wireError ?? .malformed("invalid chunked request body")
            respondError(exchange, Self.code(for: error, fromClient: true), detail: Self.detail(for: error), close: true)
        case .retractAndAnswerBadGateway:
            exchange.upstream?.close()
            exchange.upstream = nil
            retractUnsentResponse(exchange)
            let detail = exchange.wireError.map(Self.detail(for:)) ?? "invalid framing"
            respondError(exchange, .upstreamProtocolError, detail: "invalid chunked response body: " + detail,
                         close: !exchange.requestBody.isComplete)
        case .truncate(let reason):
            exchange.outcome = .error
            if exchange.reason == nil { exchange.reason = reason.rawValue }
            finishExchange(exchange, recycleUpstream: false)
        case .abort(let reason):
            abort(reason, detail: "the client broke off its request")
        }
    }

    /// Moves request body bytes from the client to the upstream, as far as the upstream's buffer has room. The
    /// body is relayed (and its framing checked) while the upstream is still connecting too, so a bad chunk is
    /// refused with 400 however the client's bytes and the connect race.
    private func pumpRequestBody(_ exchange: Exchange) {
        guard let upstream = exchange.upstream, upstream.acceptsRequestBytes, !exchange.requestBody.isComplete else { return }
        let room = Flow.highWater - evbuffer_get_length(upstream.output)
        guard room > 0 else { return }
        let before = evbuffer_get_length(input)
        let progress = exchange.requestBody.pump(from: input, to: upstream.output, budget: room)
        let left = evbuffer_get_length(input)
        upstream.requestBytesAdded(before - left)
        exchange.bytesIn = exchange.requestBody.transferred
        perform(exchange, exchange.machine.requestBodyStep(Self.step(progress, before: before, left: left, exchange)))
    }

    private static func step(_ progress: BodyRelay.Progress, before: Int, left: Int, _ exchange: Exchange) -> RelayStep {
        switch progress {
        case .inProgress: return RelayStep(result: .moving, before: before, left: left)
        case .complete: return RelayStep(result: .complete, before: before, left: left)
        case .invalid(let error):
            exchange.wireError = error
            return RelayStep(result: .invalid, before: before, left: left)
        }
    }

    // MARK: upstream events (called by UpstreamConnection)

    /// The exchange this upstream serves, if it is still the current one.
    private func forwardedExchange(of upstream: UpstreamConnection) -> Exchange? {
        guard case .forwarding(let exchange) = machine.state, exchange.upstream === upstream else { return nil }
        return exchange
    }

    private func tunnelExchange(of upstream: UpstreamConnection) -> Exchange? {
        guard case .tunnel(let exchange) = machine.state, exchange.upstream === upstream else { return nil }
        return exchange
    }

    func upstreamConnected(_ upstream: UpstreamConnection) {
        guard let exchange = forwardedExchange(of: upstream) else { return }
        perform(exchange, exchange.machine.upstreamConnected())
    }

    func upstreamWritable(_ upstream: UpstreamConnection) {
        if let exchange = tunnelExchange(of: upstream) { pumpTunnel(exchange, fromClient: true); return }
        guard let exchange = forwardedExchange(of: upstream) else { return }
        pumpRequestBody(exchange)
    }

    func upstreamReadable(_ upstream: UpstreamConnection) {
        if let exchange = tunnelExchange(of: upstream) { pumpTunnel(exchange, fromClient: false); return }
        guard let exchange = forwardedExchange(of: upstream) else { return }
        if exchange.response == nil {
            readResponseHead(exchange, upstream)
        } else {
            pumpResponseBody(exchange)
        }
    }

    /// The upstream failed before or while answering.
    func upstreamFailed(_ upstream: UpstreamConnection, code: ProxyErrorCode, detail: String) {
        if let exchange = tunnelExchange(of: upstream) {
            if exchange.tunnel?.phase == .connecting {
                exchange.upstream = nil
                respondError(exchange, code, detail: detail, close: true)
            } else {
                abort(.upstreamAborted, detail: detail)
            }
            return
        }
        guard let exchange = forwardedExchange(of: upstream) else { return }
        exchange.upstream = nil
        guard !exchange.machine.responseStarted else {
            abort(.upstreamAborted, detail: detail)
            return
        }
        // A pooled connection the origin had already closed: retry once on a fresh one, if nothing of the
        // request body has been consumed (so the request can be sent again exactly).
        if exchange.upstreamReused && !exchange.retried && exchange.requestBody.transferred == 0 && code != .upstreamTimeout {
            exchange.retried = true
            exchange.machine.retrying()
            connectUpstream(exchange, key: upstream.key, reuse: false)
            return
        }
        respondError(exchange, code, detail: detail, close: !exchange.requestBody.isComplete)
    }

    /// The upstream closed its side. Everything it sent before is in `upstream.input` and may be far more than
    /// the client's buffer takes now (a slow reader): the exchange machine keeps the response draining it, and
    /// ends it only when it is empty. Ending it here lost the tail of large responses (SPEC §6).
    func upstreamClosed(_ upstream: UpstreamConnection) {
        if let exchange = tunnelExchange(of: upstream) { tunnelPeerClosed(exchange, client: false); return }
        guard let exchange = forwardedExchange(of: upstream) else { return }
        let action = exchange.machine.originSentEOF()
        guard exchange.response == nil else {
            perform(exchange, action)
            return
        }
        // Bytes may have arrived with the EOF: read a head first (it starts the body relay, which sees the EOF).
        readResponseHead(exchange, upstream)
        guard forwardedExchange(of: upstream) === exchange, exchange.response == nil else { return }
        upstreamFailed(upstream, code: .upstreamProtocolError, detail: "the origin closed the connection without a response")
    }

    private func readResponseHead(_ exchange: Exchange, _ upstream: UpstreamConnection) {
        while forwardedExchange(of: upstream) === exchange, exchange.response == nil {
            switch upstream.takeResponseHead() {
            case .incomplete:
                return
            case .invalid(let error):
                upstream.close()
                upstreamFailed(upstream, code: .upstreamProtocolError, detail: "invalid response head: " + Self.detail(for: error))
                return
            case .complete(let head, _):
                if head.status < 200 {
                    handleInterim(exchange, head, upstream)
                } else {
                    startResponse(exchange, head, upstream)
                }
            }
        }
    }

    /// 1xx responses: `100 Continue` and `103 Early Hints` are relayed to HTTP/1.1 clients; `101` turns the
    /// connection into a tunnel when the client asked to upgrade.
    private func handleInterim(_ exchange: Exchange, _ head: ResponseHead, _ upstream: UpstreamConnection) {
        if head.status == 101 {
            guard exchange.upgradeRequested else {
                upstream.close()
                upstreamFailed(upstream, code: .upstreamProtocolError, detail: "101 Switching Protocols without an Upgrade request")
                return
            }
            let bytes = MessageHeads.relayedResponse(head, keepAlive: true, clientVersion: exchange.clientVersion,
                                                     stripTransferEncoding: false, variant: exchange.variant, upgrade: true)
            evbuffer_add(output, bytes, bytes.count)
            exchange.status = 101
            becomeTunnel(exchange)
            return
        }
        if exchange.clientVersion == .http11 {
            let bytes = MessageHeads.relayedResponse(head, keepAlive: true, clientVersion: exchange.clientVersion,
                                                     stripTransferEncoding: false, variant: nil)
            evbuffer_add(output, bytes, bytes.count)
        }
    }

    private func startResponse(_ exchange: Exchange, _ head: ResponseHead, _ upstream: UpstreamConnection) {
        let framing: BodyFraming
        switch head.bodyFraming(requestMethod: exchange.method) {
        case .success(let f): framing = f
        case .failure(let error):
            upstream.close()
            upstreamFailed(upstream, code: .upstreamProtocolError, detail: "invalid response framing: " + Self.detail(for: error))
            return
        }
        let strip = exchange.clientVersion == .http10 && framing == .chunked
        let upstreamTokens = head.connectionTokens
        let action = exchange.machine.responseHead(
            untilClose: framing == .untilClose,
            originKeepsConnection: !upstreamTokens.contains("close") && (head.version == .http11 || upstreamTokens.contains("keep-alive")),
            clientKeepsConnection: !strip)
        let bytes = MessageHeads.relayedResponse(head, keepAlive: exchange.machine.keepAlive, clientVersion: exchange.clientVersion,
                                                 stripTransferEncoding: strip, variant: exchange.variant, framing: framing,
                                                 connectionTokens: upstreamTokens)
        evbuffer_add(output, bytes, bytes.count)
        exchange.responseHeadLength = bytes.count
        exchange.response = head
        exchange.status = head.status
        exchange.responseBody = BodyRelay(framing: framing, stripChunkFraming: strip)
        perform(exchange, action)
    }

    /// Moves response body bytes from the upstream to the client, as far as the client's buffer has room;
    /// a full client buffer leaves the bytes in the upstream's input, whose read watermark then stops reading
    /// from the origin (backpressure).
    private func pumpResponseBody(_ exchange: Exchange) {
        guard let upstream = exchange.upstream, exchange.response != nil else { return }
        let room = Flow.highWater - outputLength
        guard room > 0 else { return }
        let before = evbuffer_get_length(upstream.input)
        let progress = exchange.responseBody.pump(from: upstream.input, to: output, budget: room)
        exchange.bytesOut = exchange.responseBody.transferred
        let step = Self.step(progress, before: before, left: evbuffer_get_length(upstream.input), exchange)
        // Nothing of this response has been written while all of it is still queued at the output's tail.
        let unwritten = outputLength >= exchange.responseHeadLength + Int(exchange.responseBody.delivered)
        perform(exchange, exchange.machine.responseBodyStep(step, unwritten: unwritten))
    }

    /// Removes this exchange's response from the client's output, where it is still whole at the tail (anything
    /// before it belongs to earlier responses), so that a clean answer can take its place.
    private func retractUnsentResponse(_ exchange: Exchange) {
        let queued = exchange.responseHeadLength + Int(exchange.responseBody.delivered)
        let length = outputLength
        guard queued > 0, length >= queued else { return }
        let earlier = evbuffer_new()!
        // The front of a socket bufferevent's output is frozen outside its own writes (see SpeculativeWriter).
        evbuffer_unfreeze(output, 1)
        evbuffer_remove_buffer(output, earlier, length - queued)
        evbuffer_drain(output, queued)
        evbuffer_add_buffer(output, earlier)
        evbuffer_freeze(output, 1)
        evbuffer_free(earlier)
        exchange.response = nil
    }

    // MARK: CONNECT and Upgrade tunnels

    private func beginTunnel(_ exchange: Exchange, target: RequestTarget) {
        guard worker.settings.connectPorts.contains(target.port) else {
            respondError(exchange, .connectPortDenied, detail: "port \(target.port) is not in connect.ports", close: false)
            return
        }
        exchange.outcome = .forwarded
        exchange.machine.closeAfter()
        exchange.tunnel = TunnelStateMachine()
        machine.tunnel(exchange)
        let upstream = UpstreamConnection(worker: worker, key: UpstreamKey(host: target.host, port: target.port))
        exchange.upstream = upstream
        upstream.attach(self)
        upstream.send([], responseTimeoutMs: -1)
        upstream.start()
    }

    /// CONNECT: the upstream TCP connection is up; say so to the client and start relaying.
    func tunnelConnected(_ upstream: UpstreamConnection) {
        guard let exchange = tunnelExchange(of: upstream), exchange.tunnel?.phase == .connecting else { return }
        exchange.tunnel?.established()
        let head = "HTTP/1.1 200 Connection Established\r\nVia: \(MessageHeads.viaValue)\r\n\r\n"
        _ = head.withCString { evbuffer_add(output, $0, strlen($0)) }
        exchange.status = 200
        // Logged when the tunnel ends (SPEC §8), with the bytes of both directions: see `release()`.
        // Bytes the client sent before our 200 (RFC 9110 §9.3.6 lets a client optimistically send the TLS
        // ClientHello) are relayed now, in order, after the tunnel is established, never interpreted as HTTP.
        pumpTunnel(exchange, fromClient: true)
    }

    /// `101 Switching Protocols`: the exchange's upstream becomes the other end of a tunnel.
    private func becomeTunnel(_ exchange: Exchange) {
        exchange.machine.closeAfter()
        exchange.machine.end()
        exchange.tunnel = TunnelStateMachine(established: true)
        machine.tunnel(exchange)
        pumpTunnel(exchange, fromClient: true)
        pumpTunnel(exchange, fromClient: false)
    }

    private func pumpTunnel(_ exchange: Exchange, fromClient: Bool) {
        guard let upstream = exchange.upstream, exchange.tunnel?.phase == .established, upstream.isConnected else { return }
        if fromClient {
            let n = min(evbuffer_get_length(input), Flow.highWater - evbuffer_get_length(upstream.output))
            if n > 0 {
                evbuffer_remove_buffer(input, upstream.output, n)
                worker.metrics.add(bytesIn: n)
                exchange.bytesIn += UInt64(n)
            }
        } else {
            let n = min(evbuffer_get_length(upstream.input), Flow.highWater - outputLength)
            if n > 0 {
                evbuffer_remove_buffer(upstream.input, output, n)
                worker.metrics.add(bytesOut: n)
                exchange.bytesOut += UInt64(n)
            }
        }
    }

    /// Hands an established plain-TCP tunnel to splice(2) once nothing is buffered in user space, so that
    /// order is kept: everything read so far has been written before the kernel takes over.
    private func switchTunnelToSpliceIfIdle(_ exchange: Exchange) {
        guard exchange.tunnel?.canSplice == true, let upstream = exchange.upstream,
              upstream.isConnected, upstream.isPlainTCP,
              evbuffer_get_length(input) == 0, outputLength == 0,
              evbuffer_get_length(upstream.input) == 0, evbuffer_get_length(upstream.output) == 0 else { return }
        let clientFD = bufferevent_getfd(bev)
        let upstreamFD = upstream.socket
        guard let up = SpliceRelay(base: worker.base, source: clientFD, sink: upstreamFD),
              let down = SpliceRelay(base: worker.base, source: upstreamFD, sink: clientFD),
              exchange.tunnel?.spliced() == true else { return }
        bufferevent_disable(bev, Int16(EV_READ | EV_WRITE))
        upstream.suspendIO()
        up.onProgress = { [unowned self, unowned exchange] relay in self.spliceProgressed(exchange, relay, index: 0) }
        down.onProgress = { [unowned self, unowned exchange] relay in self.spliceProgressed(exchange, relay, index: 1) }
        exchange.splices = [up, down]
        worker.metrics.tunnelSpliced()
        up.start()
        down.start()
    }

    private func spliceProgressed(_ exchange: Exchange, _ relay: SpliceRelay, index: Int) {
        let delta = Int(relay.moved - exchange.splicedBytes[index])
        exchange.splicedBytes[index] = relay.moved
        if delta > 0 {
            if index == 0 { worker.metrics.add(bytesIn: delta) } else { worker.metrics.add(bytesOut: delta) }
            if index == 0 { exchange.bytesIn += UInt64(delta) } else { exchange.bytesOut += UInt64(delta) }
        }
        if relay.failed {
            // Relay 0 reads the client and writes the upstream; relay 1 the reverse.
            let clientSide = (index == 0) != relay.failedWriting
            abort(clientSide ? .clientAborted : .upstreamAborted, detail: "tunnel relay failed")
        } else if exchange.splices.allSatisfy(\.finished), exchange.tunnel?.spliceFinished() == .close {
            close()
        }
    }

    private func tunnelPeerClosed(_ exchange: Exchange, client: Bool) {
        if client {
            exchange.tunnel?.clientSentEOF()
            pumpTunnel(exchange, fromClient: true)
        } else {
            exchange.tunnel?.originSentEOF()
            pumpTunnel(exchange, fromClient: false)
        }
        propagateTunnelEnds(exchange)
    }

    /// Passes each side's EOF on once everything it sent before has been written onwards; closes when both
    /// have been (see `TunnelStateMachine`).
    private func propagateTunnelEnds(_ exchange: Exchange) {
        guard let upstream = exchange.upstream else { return }
        while let action = exchange.tunnel?.nextAction(TunnelBuffers(
            clientInput: evbuffer_get_length(input), originOutput: evbuffer_get_length(upstream.output),
            originInput: evbuffer_get_length(upstream.input), clientOutput: outputLength)) {
            switch action {
            case .shutDownOriginWrite:
                upstream.shutdownWrite()
            case .shutDownClientWrite:
                shutdown(bufferevent_getfd(bev), Int32(SHUT_WR))
            case .close:
                close()
                return
            }
        }
    }

    // MARK: local responses

    private func serveFile(_ exchange: Exchange, _ head: RequestHead, path: String, contentType: String, variant: String) {
        guard head.method == "GET" || head.method == "HEAD" else {
            respondLocal(exchange, status: 405, reason: "Method Not Allowed",
                         fields: [("Allow", "GET, HEAD"), ("Cache-Control", "no-store"), ("Data-Mode-Variant", variant)],
                         body: [], close: false)
            return
        }
        // The path was checked when the variant was declared (a regular file inside the variants directory), but
        // it may have been replaced since. O_NONBLOCK: opening a FIFO would otherwise wait for a writer, stalling
        // this worker and every connection on it. O_NOFOLLOW: a symbolic link swapped in is not followed out of
        // the directory (the declared path is a real path, so a link there is never legitimate). Then only a
        // regular file is served; anything else is an error response, not a hang.
        let fd = open(path, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC)
        var info = stat()
        guard fd >= 0, fstat(fd, &info) == 0, (info.st_mode & S_IFMT) == S_IFREG else {
            if fd >= 0 { Glibc.close(fd) }
            respondError(exchange, .upstreamUnreachable, detail: "variant \(variant): file \(path) cannot be read", close: false)
            return
        }
        if exchange.expectsContinue && !exchange.requestBody.isComplete { exchange.machine.closeAfter() }
        let size = Int(info.st_size)
        let headBytes = MessageHeads.local(status: 200, reason: "OK",
                                           fields: [("Content-Type", contentType), ("Cache-Control", "no-store"),
                                                    ("Data-Mode-Variant", variant)],
                                           bodyLength: size, keepAlive: exchange.machine.keepAlive,
                                           clientVersion: head.version)
        evbuffer_add(output, headBytes, headBytes.count)
        exchange.status = 200
        if head.method == "HEAD" || size == 0 {
            Glibc.close(fd)
        } else {
            // sendfile(2) when the output goes to a socket: the file's bytes never enter user space.
            evbuffer_add_file(output, fd, 0, Int64(size))  // takes ownership of fd
            exchange.bytesOut = UInt64(size)
        }
        finishLocalResponse(exchange)
    }

    private func respondError(_ exchange: Exchange, _ code: ProxyErrorCode, detail: String?, close: Bool,
                              extraFields: [(String, String)] = []) {
        if exchange.outcome == .forwarded || exchange.outcome == nil || exchange.outcome == .rewritten {
            exchange.outcome = .error
            exchange.reason = code.rawValue
        }
        respondProblem(exchange, ProblemDetail(code: code, detail: detail), close: close, extraFields: extraFields)
    }

    private func respondProblem(_ exchange: Exchange, _ problem: ProblemDetail, close: Bool,
                                extraFields: [(String, String)] = []) {
        var fields: [(String, String)] = [
            ("Content-Type", "application/problem+json"),
            ("Cache-Control", "no-store"),
        ]
        fields.append(contentsOf: extraFields)
        let body = Array(problem.json.utf8)
        respondLocal(exchange, status: problem.code.status, reason: problem.code.reasonPhrase, fields: fields, body: body,
                     close: close)
    }

    /// Writes a complete response made by the proxy. The request's body (if any) is read and discarded so the
    /// connection stays usable; `close` ends the connection after it instead (framing we cannot trust).
    private func respondLocal(_ exchange: Exchange, status: Int, reason: String, fields: [(String, String)],
                              body: [UInt8], close: Bool) {
        // A refused CONNECT always closes: the client may already have sent tunnel bytes behind it
        // (RFC 9110 §9.3.6), which must never be read as the next HTTP request (request smuggling).
        if close || exchange.method == "CONNECT" { exchange.machine.closeAfter() }
        // RFC 9110 §10.1.1: a client that sent `Expect: 100-continue` waits for a 100 that will not come now; it
        // will not send the body, so waiting to discard it would hang both sides. Close after the answer.
        if exchange.expectsContinue && !exchange.requestBody.isComplete { exchange.machine.closeAfter() }
        if let upstream = exchange.upstream {
            upstream.close()
            exchange.upstream = nil
        }
        let head = MessageHeads.local(status: status, reason: reason, fields: fields, bodyLength: body.count,
                                      keepAlive: exchange.machine.keepAlive, clientVersion: exchange.clientVersion)
        evbuffer_add(output, head, head.count)
        if exchange.method != "HEAD" && !body.isEmpty { evbuffer_add(output, body, body.count) }
        exchange.status = status
        exchange.bytesOut = UInt64(body.count)
        finishLocalResponse(exchange)
    }

    /// After a local response: discard the request body (draining it is a state of its own), then go on with the
    /// next request.
    private func finishLocalResponse(_ exchange: Exchange) {
        exchange.machine.end()
        guard exchange.machine.keepAlive else {
            finishExchange(exchange, recycleUpstream: false)
            return
        }
        machine.drainRefusedBody(exchange)
        discardRequestBody(exchange)
    }

    private func discardRequestBody(_ exchange: Exchange) {
        switch exchange.requestBody.pump(from: input, to: nil, budget: Int.max) {
        case .complete:
            finishExchange(exchange, recycleUpstream: false)
        case .invalid:
            exchange.machine.closeAfter()
            finishExchange(exchange, recycleUpstream: false)
        case .inProgress:
            // The client ended mid-body: the local response already queued is still written, then we close.
            if machine.clientEnded {
                exchange.machine.closeAfter()
                finishExchange(exchange, recycleUpstream: false)
            }
        }
    }

    // MARK: completion

    private func finishExchange(_ exchange: Exchange, recycleUpstream: Bool) {
        if let upstream = exchange.upstream {
            upstream.detach()
            exchange.upstream = nil
            if recycleUpstream && evbuffer_get_length(upstream.input) == 0 {
                worker.pool.put(upstream)
            } else {
                upstream.close()
            }
        }
        logExchange(exchange)
        apply(machine.exchangeFinished(keepAlive: exchange.machine.keepAlive, draining: worker.isDraining,
                                       outputBacklog: outputLength))
        if machine.isReadingHead { processInput() }
    }

    private func logExchange(_ exchange: Exchange) {
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
    private func release(_ exchange: Exchange? = nil) {
        guard !released else { return }
        released = true
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
        bufferevent_free(bev)
        worker.clientClosed(self)
    }

    /// Drain: close now if idle between requests; otherwise close after the current response.
    func drain() {
        if machine.isReadingHead && evbuffer_get_length(input) == 0 {
            close()
        } else {
            machine.exchange?.machine.closeAfter()
        }
    }

    // MARK: timers

    private func armTimer(_ milliseconds: Int64) {
        guard let timer else { return }
        dm_event_add_ms(timer, milliseconds)
    }

    private func disarmTimer() {
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
