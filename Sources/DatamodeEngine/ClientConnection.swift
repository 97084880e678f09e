import CDatamodeShims
import CLibevent
import DatamodeConfig
import DatamodeHTTP
import DatamodePolicy
#if canImport(Glibc)
import Glibc
#endif

/// One client connection: reads request heads, decides, forwards or answers, relays bodies, and keeps the
/// connection alive for the next request. Requests on one connection are handled strictly one at a time, so
/// pipelined requests are answered in order: the next head is not even parsed until the current response is
/// complete (its bytes wait in the input buffer, bounded by the read watermark).
final class ClientConnection {
    /// Lifecycle of the connection (STYLE: named states, not a pile of booleans).
    enum State {
        /// Waiting for, or parsing, the next request head.
        case readingHead
        /// A request is being answered: forwarded upstream, or a local response with its request body discarded.
        case busy
        /// A CONNECT or Upgrade tunnel: bytes are relayed both ways until either side closes.
        case tunnel
        /// The last response is being flushed; the connection closes when the output buffer is empty.
        case closing
        /// Freed. No callback can arrive any more.
        case closed
    }

    unowned let worker: Worker
    private(set) var bev: OpaquePointer
    let input: OpaquePointer
    let output: OpaquePointer
    let peer: SocketAddress
    let peerAddress: IPAddress?
    let peerText: String
    private var timer: OpaquePointer?
    private(set) var state: State = .readingHead
    private var exchange: Exchange?
    /// The client asked to keep the connection (HTTP/1.1 default, or 1.0 with keep-alive) and nothing since
    /// made that impossible.
    private var keepAlive = true
    /// The client has shut down its sending side.
    private var peerClosed = false
    /// Set while `processInput` runs, so a response completed inside it does not recurse into it.
    private var processing = false
    /// When the first byte of the head being read arrived (for `timeouts.client-header`).
    private var headStartedAt: UInt64?
    private var tunnelUpstream: UpstreamConnection?
    private var writer = SpeculativeWriter()

    init(worker: Worker, bev: OpaquePointer, peer: SocketAddress) {
        self.worker = worker
        self.bev = bev
        self.input = bufferevent_get_input(bev)
        self.output = bufferevent_get_output(bev)
        self.peer = peer
        self.peerAddress = peer.ipAddress
        self.peerText = peer.hostText
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
        armTimer(worker.settings.clientIdleMs)
    }

    // MARK: libevent events

    func clientReadable() {
        switch state {
        case .readingHead: processInput()
        case .busy:
            readMoreIfPending()
            pumpRequestBody()
        case .tunnel:
            readMoreIfPending()
            pumpTunnel(fromClient: true)
        case .closing: evbuffer_drain(input, evbuffer_get_length(input))
        case .closed: break
        }
    }

    /// Writes what this exchange queued, towards the client and the upstream (called after every callback).
    func flushPendingWrites() {
        var rounds = 0
        while state != .closed {
            if let upstream = tunnelUpstream ?? exchange?.upstream { upstream.flushPendingWrites() }
            writer.flush(bev, output: output)
            rounds += 1
            guard rounds < 16, moveWhatFlushingMadeRoomFor() else { break }
        }
        guard state != .closed else { return }
        if state == .tunnel && (tunnelClientEnded || tunnelUpstreamEnded) { propagateTunnelEnds() }
        if state == .tunnel && SpliceRelay.enabled && splices.isEmpty { switchTunnelToSpliceIfIdle() }
        if state == .closing && evbuffer_get_length(output) == 0 { close() }
    }

    /// A pump moves only what fits below the destination's high water. If the write that follows empties the
    /// destination, no write event is registered (writes are speculative), and the bytes left in the source
    /// were already read from its socket, so no read event will come for them either: move them now.
    /// Returns whether anything moved.
    private func moveWhatFlushingMadeRoomFor() -> Bool {
        let upstream = tunnelUpstream ?? exchange?.upstream
        let before = evbuffer_get_length(input) + (upstream.map { evbuffer_get_length($0.input) } ?? 0)
        switch state {
        case .busy:
            guard let exchange, let upstream, upstream.isConnected else { return false }
            if exchange.response != nil && evbuffer_get_length(upstream.input) > 0
                && evbuffer_get_length(output) < Flow.highWater {
                pumpResponseBody()
            }
            if state == .busy, let current = self.exchange, current.upstream === upstream,
               !current.requestBody.isComplete, evbuffer_get_length(input) > 0,
               evbuffer_get_length(upstream.output) < Flow.highWater {
                pumpRequestBody()
            }
        case .tunnel:
            guard let upstream, upstream.isConnected else { return false }
            if evbuffer_get_length(upstream.input) > 0 && evbuffer_get_length(output) < Flow.highWater {
                pumpTunnel(fromClient: false)
            }
            if evbuffer_get_length(input) > 0 && evbuffer_get_length(upstream.output) < Flow.highWater {
                pumpTunnel(fromClient: true)
            }
        default:
            return false
        }
        guard state != .closed, let current = tunnelUpstream ?? self.exchange?.upstream, current === upstream else {
            return false
        }
        return evbuffer_get_length(input) + evbuffer_get_length(current.input) < before
    }

    func clientWritable() {
        defer { if state != .closed { writer.drained(bev, output: output) } }
        switch state {
        case .closing:
            if evbuffer_get_length(output) == 0 { close() }
        case .busy:
            pumpResponseBody()
        case .tunnel:
            pumpTunnel(fromClient: false)
        case .readingHead, .closed:
            break
        }
    }

    func clientEvent(_ what: Int16) {
        if what & Int16(BEV_EVENT_EOF) != 0 {
            peerClosed = true
            switch state {
            case .readingHead:
                // Half-close: any complete requests still buffered are answered, then the connection closes
                // once every response byte has been written.
                keepAlive = false
                processInput()
                if state == .readingHead { closeWhenFlushed() }
            case .busy:
                // Answer what was asked, then close. A request body still buffered (the origin reads slower
                // than the client sent) is relayed first; only a body that ends short is an abort
                // (see pumpRequestBody).
                keepAlive = false
                if let exchange, !exchange.requestBody.isComplete { pumpRequestBody() }
            case .tunnel:
                tunnelPeerClosed(client: true)
            case .closing:
                break  // a half-close: the client may still be reading what is being flushed
            case .closed:
                break
            }
            return
        }
        // BEV_EVENT_ERROR (reset, write failure): nothing more can be sent to this client.
        abort(.clientAborted, detail: "client connection error")
    }

    func clientTimerFired() {
        switch state {
        case .readingHead:
            // Idle keep-alive expired, or a head trickled in too slowly (slowloris): cut it without a word.
            close()
        case .closing:
            let backlog = evbuffer_get_length(output)
            if backlog > 0 && backlog < closingBacklog {
                closingBacklog = backlog  // a slow reader that still reads: let it finish
                armTimer(worker.settings.drainMs)
            } else {
                close()
            }
        default:
            break
        }
    }

    /// Bulk request bodies and tunnels: after a full 4 KiB libevent read, take the rest in one readv.
    @inline(__always)
    private func readMoreIfPending() {
        let buffered = evbuffer_get_length(input)
        guard buffered >= BulkRead.libeventReadCap, buffered < Flow.highWater else { return }
        BulkRead.readAvailable(fd: bufferevent_getfd(bev), into: input, budget: Flow.highWater - buffered)
    }

    // MARK: reading requests

    /// Parses and handles every complete request head buffered, one at a time.
    private func processInput() {
        guard !processing else { return }
        processing = true
        defer { processing = false }
        while state == .readingHead {
            let available = evbuffer_get_length(input)
            if available == 0 {
                headStartedAt = nil
                if peerClosed { closeWhenFlushed(); return }
                armTimer(worker.settings.clientIdleMs)
                return
            }
            if headStartedAt == nil {
                headStartedAt = worker.clock.nowNanoseconds()
                armTimer(worker.settings.clientHeaderMs)
            }
            switch parseHead(available: available) {
            case .incomplete:
                if peerClosed { closeWhenFlushed() }
                return
            case .invalid(let error):
                worker.refreshSnapshot()
                let exchange = Exchange(clientVersion: .http11, method: "-", url: "-", startedAt: headStartedAt ?? worker.clock.nowNanoseconds())
                exchange.outcome = .error
                self.exchange = exchange
                respondError(Self.code(for: error, fromClient: true), detail: Self.detail(for: error), close: true)
                return
            case .complete(let head, let length):
                evbuffer_drain(input, length)
                disarmTimer()
                let started = headStartedAt ?? worker.clock.nowNanoseconds()
                headStartedAt = nil
                begin(head, startedAt: started)
            }
        }
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
        keepAlive = head.version == .http11 ? !tokens.contains("close") : tokens.contains("keep-alive")
        if peerClosed { keepAlive = false }

        // Framing first: a request whose body boundaries are ambiguous must never be answered on a kept-alive
        // connection, whatever else is wrong with it (RFC 9112 §6.3, request smuggling).
        let framing: BodyFraming
        switch head.bodyFraming() {
        case .success(let f): framing = f
        case .failure(let error):
            exchange.outcome = .error
            self.exchange = exchange
            respondError(Self.code(for: error, fromClient: true), detail: Self.detail(for: error), close: true)
            return
        }
        exchange.requestBody = BodyRelay(framing: framing)
        exchange.requestFraming = framing
        if !exchange.requestBody.isComplete {
            exchange.expectsContinue = head.values(of: "expect").contains { $0.utf8.count == 12 && $0.lowercased() == "100-continue" }
        }
        self.exchange = exchange

        if head.values(of: "host").count > 1 {
            respondError(.badRequest, detail: "more than one Host header field (RFC 9112 §3.2)", close: true)
            return
        }
        guard worker.accessAllowed(peerAddress) else {
            respondError(.accessDenied, detail: "client \(peerText) is not in access.allow", close: true)
            return
        }
        if !settings.users.isEmpty && !ProxyAuthorization.accepts(head.values(of: "proxy-authorization"), users: settings.users) {
            respondError(.proxyAuthRequired, detail: nil, close: false,
                         extraFields: [("Proxy-Authenticate", "Basic realm=\"datamode-proxy\", charset=\"UTF-8\"")])
            return
        }
        let target: RequestTarget
        switch RequestTarget.parse(head.target, method: head.method) {
        case .success(let t): target = t
        case .failure(let error):
            respondError(Self.code(for: error, fromClient: true), detail: Self.detail(for: error), close: true)
            return
        }
        switch target.form {
        case .origin, .asterisk:
            respondError(.notAProxyRequest, detail: "this is a forward proxy: send absolute-form requests (http://host/path), e.g. curl -x", close: false)
            return
        case .absolute, .authority:
            break
        }
        self.exchange?.url = target.absoluteURL
        if MessageHeads.hasOwnVia(head) {
            respondError(.loopDetected, detail: "the request already passed through this proxy", close: false)
            return
        }

        let facts = RequestFacts(method: head.method, url: target.absoluteURL, host: target.host, port: Int(target.port),
                                 path: target.path, isConnect: target.form == .authority, client: peerAddress,
                                 fields: head.fields.map { (name: $0.name, value: $0.value) })
        var provenance = TagProvenance()
        let decision = decide(facts, mode: settings.mode, policy: settings.policy, provenance: &provenance)
        if let tags = decision.tags, let exchange = self.exchange {
            exchange.tags = tags
            exchange.tagSources = provenance
            exchange.rule = settings.policy.ruleName(for: decision, provenance: provenance)
        }

        if target.form == .authority {
            beginTunnel(head, target: target, decision: decision)
            return
        }

        switch decision {
        case .invalidTag(let detail):
            respondError(.invalidTag, detail: detail, close: false)
        case .reject(_, let rejection):
            self.exchange?.outcome = .rejected
            self.exchange?.reason = rejection.code.rawValue
            let problem = rejection.problem(mode: settings.mode, url: target.absoluteURL)
            respondProblem(problem, close: false, extraFields: [
                ("Network-Unavailable-Reason", rejection.code.rawValue),
            ])
        case .forward(let tags):
            self.exchange?.outcome = .forwarded
            forward(head, to: target, tags: tags, variant: nil)
        case .serveVariant(let tags, let rewrite):
            self.exchange?.outcome = .rewritten
            self.exchange?.variant = rewrite.id
            serveVariant(head, original: target, tags: tags, rewrite: rewrite)
        }
    }

    private func serveVariant(_ head: RequestHead, original: RequestTarget, tags: RequestTags, rewrite: VariantRewrite) {
        switch rewrite.action {
        case .fetch(let url):
            switch RequestTarget.parse(url, method: head.method) {
            case .success(let target) where target.form == .absolute:
                forward(head, to: target, tags: tags, variant: rewrite.id)
            default:
                respondError(.upstreamUnreachable, detail: "variant \(rewrite.id) has an unusable target \(url)", close: false)
            }
        case .redirect(let location):
            let body: [UInt8] = []
            respondLocal(status: 307, reason: "Temporary Redirect",
                         fields: [("Location", location), ("Cache-Control", "no-store"), ("Data-Mode-Variant", rewrite.id)],
                         body: body, close: false)
        case .file(let path, let contentType):
            serveFile(head, path: path, contentType: contentType, variant: rewrite.id)
        }
    }

    // MARK: forwarding

    private func forward(_ head: RequestHead, to target: RequestTarget, tags: RequestTags, variant: String?) {
        let settings = worker.settings
        let tokens = exchange?.connectionTokens ?? head.connectionTokens
        let upgrade = head.contains("upgrade") && tokens.contains("upgrade")
        let bytes = MessageHeads.forwardedRequest(head, target: target, tags: tags, settings: settings.tagSettings,
                                                  mode: settings.mode, upgrade: upgrade,
                                                  framing: exchange?.requestFraming ?? .none, connectionTokens: tokens,
                                                  variantTarget: variant != nil)
        exchange?.headBytes = bytes
        exchange?.variant = variant
        exchange?.upgradeRequested = upgrade
        state = .busy
        connectUpstream(key: UpstreamKey(host: target.host, port: target.port, tls: target.scheme == "https"), reuse: true)
    }

    private func connectUpstream(key: UpstreamKey, reuse: Bool) {
        guard let exchange else { return }
        let upstream = (reuse ? worker.pool.take(key) : nil) ?? UpstreamConnection(worker: worker, key: key)
        exchange.upstream = upstream
        exchange.upstreamReused = upstream.isReused
        self.exchange = exchange
        upstream.attach(self)
        guard self.exchange?.upstream === upstream else { return }  // it had already failed; answered
        upstream.send(exchange.headBytes, responseTimeoutMs: worker.settings.upstreamResponseMs)
        if exchange.requestBody.isComplete { upstream.requestComplete() } else { pumpRequestBody() }
    }

    /// Moves request body bytes from the client to the upstream, as far as the upstream's buffer has room.
    private func pumpRequestBody() {
        if discarding {
            discardRequestBody()
            return
        }
        // The body is relayed (and its framing checked) while the upstream is still connecting too, so a bad
        // chunk is refused with 400 however the client's bytes and the connect race.
        guard let exchange, let upstream = exchange.upstream, upstream.acceptsRequestBytes else { return }
        if exchange.requestBody.isComplete { return }
        let room = Flow.highWater - evbuffer_get_length(upstream.output)
        guard room > 0 else { return }
        let before = evbuffer_get_length(input)
        let progress = exchange.requestBody.pump(from: input, to: upstream.output, budget: room)
        upstream.requestBytesAdded(before - evbuffer_get_length(input))
        exchange.bytesIn = exchange.requestBody.transferred
        switch progress {
        case .inProgress:
            // After the client's EOF the body can only end short: once what it sent has been relayed (or what
            // is left cannot move: a chunk-size line cut by the close), the request is abandoned.
            let left = evbuffer_get_length(input)
            if peerClosed && (left == 0 || left == before) { abort(.clientAborted, detail: "client closed mid-body") }
        case .complete:
            upstream.requestComplete()
        case .invalid(let error):
            // Nothing of this request may reach the origin (SPEC §6: never forwarded). The head and any valid
            // chunks are still only queued: libevent writes them after this callback returns (for a fresh
            // connection, right after the CONNECTED callback that brought us here), so drop them first.
            upstream.discardPendingOutput()
            upstream.close()
            self.exchange?.upstream = nil
            if exchange.responseStarted {
                abort(.badRequest, detail: "invalid chunked request body")
            } else {
                respondError(Self.code(for: error, fromClient: true), detail: Self.detail(for: error), close: true)
            }
        }
    }

    // MARK: upstream events (called by UpstreamConnection)

    func upstreamConnected(_ upstream: UpstreamConnection) {
        guard exchange?.upstream === upstream else { return }
        pumpRequestBody()
    }

    func upstreamWritable(_ upstream: UpstreamConnection) {
        if state == .tunnel { pumpTunnel(fromClient: true); return }
        guard exchange?.upstream === upstream else { return }
        pumpRequestBody()
    }

    func upstreamReadable(_ upstream: UpstreamConnection) {
        if state == .tunnel { pumpTunnel(fromClient: false); return }
        guard let exchange, exchange.upstream === upstream else { return }
        if exchange.response == nil {
            readResponseHead(upstream)
        } else {
            pumpResponseBody()
        }
    }

    /// The upstream failed before or while answering.
    func upstreamFailed(_ upstream: UpstreamConnection, code: ProxyErrorCode, detail: String) {
        if state == .tunnel, tunnelUpstream === upstream {
            if tunnelEstablished { abort(.upstreamAborted, detail: detail) } else {
                tunnelUpstream = nil
                respondError(code, detail: detail, close: true)
            }
            return
        }
        guard let exchange, exchange.upstream === upstream else { return }
        self.exchange?.upstream = nil
        if exchange.response == nil && !exchange.responseStarted {
            // A pooled connection the origin had already closed: retry once on a fresh one, if nothing of the
            // request body has been consumed (so the request can be sent again exactly).
            if exchange.upstreamReused && !exchange.retried && exchange.requestBody.transferred == 0 && code != .upstreamTimeout {
                self.exchange?.retried = true
                connectUpstream(key: upstream.key, reuse: false)
                return
            }
            respondError(code, detail: detail, close: !exchange.requestBody.isComplete)
        } else {
            abort(.upstreamAborted, detail: detail)
        }
    }

    /// The upstream closed its side. Everything it sent before is in `upstream.input` and may be far more than
    /// the client's buffer takes now (a slow reader): the response goes on draining it, and ends only when it is
    /// empty (see `pumpResponseBody`). Ending it here lost the tail of large responses (SPEC §6).
    func upstreamClosed(_ upstream: UpstreamConnection) {
        if state == .tunnel, tunnelUpstream === upstream { tunnelPeerClosed(client: false); return }
        guard let exchange, exchange.upstream === upstream else { return }
        exchange.upstreamEnded = true
        exchange.upstreamReusable = false
        if exchange.response == nil {
            // Bytes may have arrived with the EOF: read a head first (it starts the body relay, which sees the EOF).
            readResponseHead(upstream)
            guard let current = self.exchange, current.upstream === upstream, current.response == nil else { return }
            upstreamFailed(upstream, code: .upstreamProtocolError, detail: "the origin closed the connection without a response")
            return
        }
        pumpResponseBody()
    }

    private func readResponseHead(_ upstream: UpstreamConnection) {
        while let exchange, exchange.upstream === upstream, exchange.response == nil {
            let source = upstream.input
            let available = evbuffer_get_length(source)
            guard available > 0 else { return }
            let window = min(available, Flow.maxResponseHeadBytes)
            guard let start = evbuffer_pullup(source, window) else { return }
            let result = HTTP1Parser.parseResponseHead(UnsafeRawBufferPointer(start: start, count: window), limits: Flow.responseLimits)
            switch result {
            case .incomplete:
                return
            case .invalid(let error):
                upstream.close()
                upstreamFailed(upstream, code: .upstreamProtocolError, detail: "invalid response head: " + Self.detail(for: error))
                return
            case .complete(let head, let length):
                evbuffer_drain(source, length)
                if head.status < 200 {
                    handleInterim(head, upstream: upstream)
                    continue
                }
                upstream.responseHeadReceived()
                startResponse(head, upstream: upstream)
            }
        }
    }

    /// 1xx responses: `100 Continue` and `103 Early Hints` are relayed to HTTP/1.1 clients; `101` turns the
    /// connection into a tunnel when the client asked to upgrade.
    private func handleInterim(_ head: ResponseHead, upstream: UpstreamConnection) {
        guard let exchange else { return }
        if head.status == 101 {
            guard exchange.upgradeRequested else {
                upstream.close()
                upstreamFailed(upstream, code: .upstreamProtocolError, detail: "101 Switching Protocols without an Upgrade request")
                return
            }
            upstream.responseHeadReceived()
            let bytes = MessageHeads.relayedResponse(head, keepAlive: true, clientVersion: exchange.clientVersion,
                                                     stripTransferEncoding: false, variant: exchange.variant, upgrade: true)
            evbuffer_add(output, bytes, bytes.count)
            self.exchange?.status = 101
            self.exchange?.responseStarted = true
            becomeTunnel(with: upstream)
            return
        }
        if exchange.clientVersion == .http11 {
            let bytes = MessageHeads.relayedResponse(head, keepAlive: true, clientVersion: exchange.clientVersion,
                                                     stripTransferEncoding: false, variant: nil)
            evbuffer_add(output, bytes, bytes.count)
        }
    }

    private func startResponse(_ head: ResponseHead, upstream: UpstreamConnection) {
        guard let exchange else { return }
        let framing: BodyFraming
        switch head.bodyFraming(requestMethod: exchange.method) {
        case .success(let f): framing = f
        case .failure(let error):
            upstream.close()
            upstreamFailed(upstream, code: .upstreamProtocolError, detail: "invalid response framing: " + Self.detail(for: error))
            return
        }
        let strip = exchange.clientVersion == .http10 && framing == .chunked
        if framing == .untilClose || strip { keepAlive = false }
        if !exchange.requestBody.isComplete { keepAlive = false }
        let upstreamTokens = head.connectionTokens
        exchange.upstreamReusable = framing != .untilClose
            && !upstreamTokens.contains("close")
            && (head.version == .http11 || upstreamTokens.contains("keep-alive"))
        let bytes = MessageHeads.relayedResponse(head, keepAlive: keepAlive, clientVersion: exchange.clientVersion,
                                                 stripTransferEncoding: strip, variant: exchange.variant, framing: framing,
                                                 connectionTokens: upstreamTokens)
        evbuffer_add(output, bytes, bytes.count)
        exchange.responseHeadLength = bytes.count
        exchange.response = head
        exchange.status = head.status
        exchange.responseStarted = true
        exchange.responseBody = BodyRelay(framing: framing, stripChunkFraming: strip)
        self.exchange = exchange
        pumpResponseBody()
    }

    /// Moves response body bytes from the upstream to the client, as far as the client's buffer has room;
    /// a full client buffer leaves the bytes in the upstream's input, whose read watermark then stops reading
    /// from the origin (backpressure).
    private func pumpResponseBody() {
        guard let exchange, let upstream = exchange.upstream, exchange.response != nil else { return }
        let room = Flow.highWater - evbuffer_get_length(output)
        guard room > 0 else { return }
        let before = evbuffer_get_length(upstream.input)
        let progress = exchange.responseBody.pump(from: upstream.input, to: output, budget: room)
        exchange.bytesOut = exchange.responseBody.transferred
        switch progress {
        case .inProgress:
            // After the origin's EOF nothing more will arrive: the body ends when what it sent has been moved
            // (or when what is left cannot move: a chunk-size line cut by the close).
            let left = evbuffer_get_length(upstream.input)
            guard exchange.upstreamEnded, left == 0 || left == before else { return }
            if case .untilClose = exchange.responseBody.mode {
                finishExchange()
            } else {
                finishTruncated(.upstreamAborted)
            }
        case .complete:
            finishExchange()
        case .invalid(let error):
            upstream.close()
            exchange.upstream = nil
            if retractUnsentResponse(exchange) {
                // Nothing of it reached the client yet: a clean answer is still possible (SPEC §6).
                respondError(.upstreamProtocolError, detail: "invalid chunked response body: " + Self.detail(for: error),
                             close: !exchange.requestBody.isComplete)
            } else {
                finishTruncated(.upstreamProtocolError)
            }
        }
    }

    /// Removes this exchange's response from the client's output if not one byte of it has been written yet
    /// (it is still whole at the tail of the output; anything before it belongs to earlier responses).
    private func retractUnsentResponse(_ exchange: Exchange) -> Bool {
        let queued = exchange.responseHeadLength + Int(exchange.responseBody.delivered)
        let length = evbuffer_get_length(output)
        guard queued > 0, length >= queued else { return false }
        let earlier = evbuffer_new()!
        // The front of a socket bufferevent's output is frozen outside its own writes (see SpeculativeWriter).
        evbuffer_unfreeze(output, 1)
        evbuffer_remove_buffer(output, earlier, length - queued)
        evbuffer_drain(output, queued)
        evbuffer_add_buffer(output, earlier)
        evbuffer_freeze(output, 1)
        evbuffer_free(earlier)
        exchange.response = nil
        exchange.responseStarted = false
        return true
    }

    /// The response cannot be completed (the origin closed mid-body, or broke its framing) after part of it was
    /// relayed: what was relayed is still written, then the connection closes, so the client sees a short
    /// body, never a different message.
    private func finishTruncated(_ reason: AbortReason) {
        guard let exchange else { return }
        exchange.outcome = .error
        if exchange.reason == nil { exchange.reason = reason.rawValue }
        exchange.upstreamReusable = false
        keepAlive = false
        finishExchange()
    }

    // MARK: CONNECT tunnels

    private var tunnelEstablished = false

    private func beginTunnel(_ head: RequestHead, target: RequestTarget, decision: Decision) {
        let settings = worker.settings
        switch decision {
        case .invalidTag(let detail):
            respondError(.invalidTag, detail: detail, close: false)
            return
        case .reject(_, let rejection):
            exchange?.outcome = .rejected
            exchange?.reason = rejection.code.rawValue
            respondProblem(rejection.problem(mode: settings.mode, url: target.absoluteURL), close: false,
                           extraFields: [("Network-Unavailable-Reason", rejection.code.rawValue)])
            return
        case .forward, .serveVariant:
            break
        }
        guard settings.connectPorts.contains(target.port) else {
            respondError(.connectPortDenied, detail: "port \(target.port) is not in connect.ports", close: false)
            return
        }
        exchange?.outcome = .forwarded
        state = .tunnel
        keepAlive = false
        let upstream = UpstreamConnection(worker: worker, key: UpstreamKey(host: target.host, port: target.port))
        tunnelUpstream = upstream
        exchange?.upstream = upstream
        upstream.attach(self)
        guard tunnelUpstream === upstream else { return }  // it had already failed; answered
        upstream.send([], responseTimeoutMs: -1)
    }

    /// CONNECT: the upstream TCP connection is up; say so to the client and start relaying.
    func tunnelConnected(_ upstream: UpstreamConnection) {
        guard tunnelUpstream === upstream, !tunnelEstablished else { return }
        tunnelEstablished = true
        let head = "HTTP/1.1 200 Connection Established\r\nVia: \(MessageHeads.viaValue)\r\n\r\n"
        _ = head.withCString { evbuffer_add(output, $0, strlen($0)) }
        exchange?.status = 200
        // Logged when the tunnel ends (SPEC §8), with the bytes of both directions: see `close()`.
        // Bytes the client sent before our 200 (RFC 9110 §9.3.6 lets a client optimistically send the TLS
        // ClientHello) are relayed now, in order, after the tunnel is established, never interpreted as HTTP.
        pumpTunnel(fromClient: true)
    }

    private func becomeTunnel(with upstream: UpstreamConnection) {
        state = .tunnel
        keepAlive = false
        tunnelUpstream = upstream
        tunnelEstablished = true
        pumpTunnel(fromClient: true)
        pumpTunnel(fromClient: false)
    }

    private func pumpTunnel(fromClient: Bool) {
        guard let upstream = tunnelUpstream, tunnelEstablished, upstream.isConnected else { return }
        if fromClient {
            let room = Flow.highWater - evbuffer_get_length(upstream.output)
            if room > 0 {
                let n = min(evbuffer_get_length(input), room)
                if n > 0 {
                    evbuffer_remove_buffer(input, upstream.output, n)
                    worker.metrics.add(bytesIn: n)
                    exchange?.bytesIn += UInt64(n)
                }
            }
        } else {
            let room = Flow.highWater - evbuffer_get_length(output)
            if room > 0 {
                let n = min(evbuffer_get_length(upstream.input), room)
                if n > 0 {
                    evbuffer_remove_buffer(upstream.input, output, n)
                    worker.metrics.add(bytesOut: n)
                    exchange?.bytesOut += UInt64(n)
                }
            }
        }
    }

    /// The splice(2) relay of an established tunnel, one per direction (see SpliceRelay).
    private var splices: [SpliceRelay] = []
    private var splicedBytes: [UInt64] = [0, 0]

    /// Hands an established plain-TCP tunnel to splice(2) once nothing is buffered in user space, so that
    /// order is kept: everything read so far has been written before the kernel takes over.
    private func switchTunnelToSpliceIfIdle() {
        guard tunnelEstablished, !tunnelClientEnded, !tunnelUpstreamEnded, let upstream = tunnelUpstream,
              upstream.isConnected, upstream.isPlainTCP,
              evbuffer_get_length(input) == 0, evbuffer_get_length(output) == 0,
              evbuffer_get_length(upstream.input) == 0, evbuffer_get_length(upstream.output) == 0 else { return }
        let clientFD = bufferevent_getfd(bev)
        let upstreamFD = upstream.socket
        guard let up = SpliceRelay(base: worker.base, source: clientFD, sink: upstreamFD),
              let down = SpliceRelay(base: worker.base, source: upstreamFD, sink: clientFD) else { return }
        bufferevent_disable(bev, Int16(EV_READ | EV_WRITE))
        upstream.suspendIO()
        up.onProgress = { [unowned self] relay in self.spliceProgressed(relay, index: 0) }
        down.onProgress = { [unowned self] relay in self.spliceProgressed(relay, index: 1) }
        splices = [up, down]
        worker.metrics.tunnelSpliced()
        up.start()
        down.start()
    }

    private func spliceProgressed(_ relay: SpliceRelay, index: Int) {
        let delta = Int(relay.moved - splicedBytes[index])
        splicedBytes[index] = relay.moved
        if delta > 0 {
            if index == 0 { worker.metrics.add(bytesIn: delta) } else { worker.metrics.add(bytesOut: delta) }
            if index == 0 { exchange?.bytesIn += UInt64(delta) } else { exchange?.bytesOut += UInt64(delta) }
        }
        if relay.failed {
            // Relay 0 reads the client and writes the upstream; relay 1 the reverse.
            let clientSide = (index == 0) != relay.failedWriting
            abort(clientSide ? .clientAborted : .upstreamAborted, detail: "tunnel relay failed")
        } else if splices.allSatisfy(\.finished) {
            close()
        }
    }

    /// Which directions of a tunnel have ended (a half-close, `shutdown(SHUT_WR)`, is relayed as one: the
    /// other direction keeps flowing, as TCP allows; e.g. a client that sends its request and half-closes).
    private var tunnelClientEnded = false
    private var tunnelUpstreamEnded = false
    private var tunnelUpstreamShut = false
    private var tunnelClientShut = false

    private func tunnelPeerClosed(client: Bool) {
        if client {
            tunnelClientEnded = true
            pumpTunnel(fromClient: true)
        } else {
            tunnelUpstreamEnded = true
            pumpTunnel(fromClient: false)
        }
        propagateTunnelEnds()
    }

    /// Once everything a side sent before its EOF has been written onwards, the other side's write half is shut
    /// down; when both directions have ended, the tunnel closes after flushing.
    /// The tunnel closes only when both directions have been shut down this way: closing as soon as both EOFs
    /// had been read lost whatever still sat in the buffers of the slower direction.
    private func propagateTunnelEnds() {
        guard state == .tunnel, let upstream = tunnelUpstream else { return }
        if tunnelClientEnded && !tunnelUpstreamShut && evbuffer_get_length(input) == 0
            && evbuffer_get_length(upstream.output) == 0 {
            tunnelUpstreamShut = true
            upstream.shutdownWrite()
        }
        if tunnelUpstreamEnded && !tunnelClientShut && evbuffer_get_length(upstream.input) == 0
            && evbuffer_get_length(output) == 0 {
            tunnelClientShut = true
            shutdown(bufferevent_getfd(bev), Int32(SHUT_WR))
        }
        if tunnelClientShut && tunnelUpstreamShut {
            upstream.close()
            tunnelUpstream = nil
            exchange?.upstream = nil
            close()
        }
    }

    // MARK: local responses

    private func serveFile(_ head: RequestHead, path: String, contentType: String, variant: String) {
        guard head.method == "GET" || head.method == "HEAD" else {
            respondLocal(status: 405, reason: "Method Not Allowed",
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
            respondError(.upstreamUnreachable, detail: "variant \(variant): file \(path) cannot be read", close: false)
            return
        }
        let size = Int(info.st_size)
        let headBytes = MessageHeads.local(status: 200, reason: "OK",
                                           fields: [("Content-Type", contentType), ("Cache-Control", "no-store"),
                                                    ("Data-Mode-Variant", variant)],
                                           bodyLength: size, keepAlive: keepAlive,
                                           clientVersion: head.version)
        evbuffer_add(output, headBytes, headBytes.count)
        exchange?.status = 200
        if head.method == "HEAD" || size == 0 {
            Glibc.close(fd)
        } else {
            // sendfile(2) when the output goes to a socket: the file's bytes never enter user space.
            evbuffer_add_file(output, fd, 0, Int64(size))  // takes ownership of fd
            exchange?.bytesOut = UInt64(size)
        }
        finishLocalResponse()
    }

    private func respondError(_ code: ProxyErrorCode, detail: String?, close: Bool,
                              extraFields: [(String, String)] = []) {
        if exchange?.outcome == .forwarded || exchange?.outcome == nil || exchange?.outcome == .rewritten {
            exchange?.outcome = .error
            exchange?.reason = code.rawValue
        }
        respondProblem(ProblemDetail(code: code, detail: detail), close: close, extraFields: extraFields)
    }

    private func respondProblem(_ problem: ProblemDetail, close: Bool, extraFields: [(String, String)] = []) {
        var fields: [(String, String)] = [
            ("Content-Type", "application/problem+json"),
            ("Cache-Control", "no-store"),
        ]
        fields.append(contentsOf: extraFields)
        let body = Array(problem.json.utf8)
        respondLocal(status: problem.code.status, reason: problem.code.reasonPhrase, fields: fields, body: body, close: close)
    }

    /// Writes a complete response made by the proxy. The request's body (if any) is read and discarded so the
    /// connection stays usable; `close` ends the connection after it instead (framing we cannot trust).
    private func respondLocal(status: Int, reason: String, fields: [(String, String)], body: [UInt8], close: Bool) {
        // A refused CONNECT always closes: the client may already have sent tunnel bytes behind it
        // (RFC 9110 §9.3.6), which must never be read as the next HTTP request (request smuggling).
        if close || exchange?.method == "CONNECT" { keepAlive = false }
        // RFC 9110 §10.1.1: a client that sent `Expect: 100-continue` waits for a 100 that will not come now; it
        // will not send the body, so waiting to discard it would hang both sides. Close after the answer.
        if let exchange, exchange.expectsContinue, !exchange.requestBody.isComplete { keepAlive = false }
        if let upstream = exchange?.upstream {
            upstream.close()
            exchange?.upstream = nil
        }
        let method = exchange?.method ?? "GET"
        let head = MessageHeads.local(status: status, reason: reason, fields: fields, bodyLength: body.count,
                                      keepAlive: keepAlive, clientVersion: exchange?.clientVersion ?? .http11)
        evbuffer_add(output, head, head.count)
        if method != "HEAD" && !body.isEmpty { evbuffer_add(output, body, body.count) }
        exchange?.status = status
        exchange?.bytesOut = UInt64(body.count)
        exchange?.responseStarted = true
        finishLocalResponse()
    }

    /// After a local response: discard the request body, then go on with the next request.
    private func finishLocalResponse() {
        guard let exchange else { return }
        if !keepAlive {
            finishExchange()
            return
        }
        state = .busy
        let progress = exchange.requestBody.pump(from: input, to: nil, budget: Int.max)
        self.exchange = exchange
        switch progress {
        case .complete:
            finishExchange()
        case .inProgress:
            discarding = true  // the rest arrives through clientReadable -> pumpRequestBody
        case .invalid:
            keepAlive = false
            finishExchange()
        }
    }

    /// A local response was written; the request's body is still arriving and is being thrown away.
    private var discarding = false

    private func discardRequestBody() {
        guard let exchange else { return }
        let progress = exchange.requestBody.pump(from: input, to: nil, budget: Int.max)
        self.exchange = exchange
        switch progress {
        case .complete:
            discarding = false
            finishExchange()
        case .invalid:
            discarding = false
            keepAlive = false
            finishExchange()
        case .inProgress:
            // The client closed mid-body: the local response already queued is still written.
            if peerClosed {
                discarding = false
                keepAlive = false
                finishExchange()
            }
        }
    }

    // MARK: completion

    private func finishExchange() {
        guard let exchange else { return }
        if let upstream = exchange.upstream {
            upstream.detach()
            if exchange.upstreamReusable && exchange.requestBody.isComplete && evbuffer_get_length(upstream.input) == 0 {
                worker.pool.put(upstream)
            } else {
                upstream.close()
            }
        }
        logExchange()
        self.exchange = nil
        if !keepAlive || worker.isDraining {
            closeWhenFlushed()
            return
        }
        state = .readingHead
        processInput()
    }

    /// Ends the connection after everything queued for the client has been written, however slowly it reads:
    /// the timer cuts it only when a whole `drain-timeout` passes without the client taking a byte.
    private func closeWhenFlushed() {
        guard state != .closed else { return }
        state = .closing
        bufferevent_setwatermark(bev, Int16(EV_WRITE), 0, 0)
        if evbuffer_get_length(output) == 0 { close(); return }
        closingBacklog = evbuffer_get_length(output)
        armTimer(worker.settings.drainMs)
    }

    /// What the output held when the closing timer was last armed (progress re-arms it).
    private var closingBacklog = 0

    private func logExchange() {
        guard let exchange, !exchange.logged else { return }
        self.exchange?.logged = true
        worker.record(exchange, client: peerText)
    }

    /// Something failed after the response started, or the client vanished: no answer is possible any more.
    /// `reason` names the side that broke off (the access log's and metrics' reason); `detail` is for debugging.
    func abort(_ reason: AbortReason, detail: String) {
        for relay in splices { relay.stop() }
        splices = []
        if let upstream = exchange?.upstream { upstream.close() }
        if let upstream = tunnelUpstream { upstream.close() }
        exchange?.upstream = nil
        tunnelUpstream = nil
        if let current = exchange, current.outcome != .rejected {
            // An established tunnel was forwarded, whichever way it ends; the reason says how it ended.
            if !tunnelEstablished { current.outcome = .error }
            if current.reason == nil { current.reason = reason.rawValue }
            exchange = current
        }
        worker.logger.debug("exchange aborted", metadata: ["reason": "\(reason.rawValue)", "detail": "\(detail)"])
        logExchange()
        close()
    }

    /// Frees the connection. Safe to call more than once.
    func close() {
        guard state != .closed else { return }
        for relay in splices { relay.stop() }
        splices = []
        if let upstream = exchange?.upstream { upstream.close() }
        if let upstream = tunnelUpstream { upstream.close() }
        // A tunnel's line is written here, when it ends; so is that of an exchange cut short without a word.
        logExchange()
        exchange = nil
        tunnelUpstream = nil
        state = .closed
        if let timer { event_free(timer) }
        timer = nil
        bufferevent_free(bev)
        worker.clientClosed(self)
    }

    /// Drain: close now if idle between requests; otherwise close after the current response.
    func drain() {
        if state == .readingHead && evbuffer_get_length(input) == 0 { close() } else { keepAlive = false }
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
