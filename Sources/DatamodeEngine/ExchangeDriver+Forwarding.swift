import CDatamodeShims
import CLibevent
import DatamodeConfig
import DatamodeHTTP
import DatamodePolicy
#if canImport(Glibc)
import Glibc
#endif

/// Forwarding an exchange: the upstream connection, the request body towards it, the response head and body
/// back, and the exchange machine's actions carried out.
extension ExchangeDriver {
    // MARK: forwarding

    func forward(_ head: RequestHead, to target: RequestTarget, tags: RequestTags,
                         variant: String?) {
        let settings = worker.settings
        let tokens = connectionTokens
        let upgrade = head.contains("upgrade") && tokens.contains("upgrade")
        headBytes = MessageHeads.forwardedRequest(head, target: target, tags: tags, settings: settings.tagSettings,
                                                           mode: exchange.mode, upgrade: upgrade,
                                                           framing: requestFraming, connectionTokens: tokens,
                                                           variantTarget: variant != nil)
        exchange.variant = variant
        if head.method == "GET" {
            // SPEC §13 by the request's own mode (a session's, SPEC §12); precomputed for the global one.
            let global = exchange.mode == settings.mode
            manifestCap = global ? settings.manifestCap : settings.manifestCap(in: exchange.mode)
            let images = global ? settings.imageSettings
                : (settings.imagesApply(in: exchange.mode) ? settings.images : nil)
            if let images, variant == nil {
                imageSettings = images
                acceptsWebP = head.values(of: "accept").contains { $0.lowercased().contains("image/webp") }
            }
        }
        upgradeRequested = upgrade
        client.machine.forward(self)
        connectUpstream(key: UpstreamKey(host: target.host, port: target.port, tls: target.scheme == "https"),
                        reuse: true)
    }

    func connectUpstream(key: UpstreamKey, reuse: Bool) {
        let upstream = (reuse ? worker.pool.take(key) : nil) ?? UpstreamConnection(worker: worker, key: key)
        self.upstream = upstream
        upstreamReused = upstream.isReused
        upstream.attach(self)
        upstream.send(headBytes, responseTimeoutMs: worker.settings.upstreamResponseMs)
        allowance.charge(.up, headBytes.count, session: client)
        upstream.start()
        guard isForwarding(upstream) else { return }
        if upstream.isConnected { perform(machine.upstreamConnected()) }
        if requestBody.isComplete { upstream.requestComplete() } else { pumpRequestBody() }
    }

    /// Carries out an exchange-level action.
    func perform(_ action: ExchangeStateMachine.Action) {
        switch action {
        case .none:
            break
        case .pumpRequestBody:
            pumpRequestBody()
        case .pumpResponseBody:
            pumpResponseBody()
        case .requestSent:
            upstream?.requestComplete()
        case .finish(let recycle):
            finishExchange(recycleUpstream: recycle)
        case .refuseRequest:
            // Nothing of this request may reach the origin (SPEC §6: never forwarded). The head and any valid
            // chunks are still only queued: libevent writes them after this callback returns (for a fresh
            // connection, right after the CONNECTED callback that brought us here), so drop them first.
            upstream?.discardPendingOutput()
            upstream?.close()
            self.upstream = nil
            let error = wireError ?? .malformed("invalid chunked request body")
            respondError(HTTP1Session.code(for: error, fromClient: true), detail: HTTP1Session.detail(for: error), close: true)
        case .retractAndAnswerBadGateway:
            upstream?.close()
            self.upstream = nil
            retractUnsentResponse()
            let detail = wireError.map(HTTP1Session.detail(for:)) ?? "invalid framing"
            respondError(.upstreamProtocolError, detail: "invalid chunked response body: " + detail,
                         close: !requestBody.isComplete)
        case .truncate(let reason):
            client.truncated = true
            exchange.outcome = .error
            if exchange.reason == nil { exchange.reason = reason.rawValue }
            finishExchange(recycleUpstream: false)
        case .abort(let reason):
            client.abort(reason, detail: "the client broke off its request")
        }
    }

    /// Moves request body bytes from the client to the upstream, as far as the upstream's buffer has room. The
    /// body is relayed (and its framing checked) while the upstream is still connecting too, so a bad chunk is
    /// refused with 400 however the client's bytes and the connect race.
    func pumpRequestBody() {
        guard let upstream, upstream.acceptsRequestBytes, !requestBody.isComplete,
              let step = relay(.up, &requestBody, from: input, to: upstream.output,
                               room: Flow.highWater - evbuffer_get_length(upstream.output)) else { return }
        upstream.requestBytesAdded(step.before - step.left)
        perform(machine.requestBodyStep(step))
    }

    /// The one relay, for every body and both ways of a tunnel: moves from `source` to `sink`, through `body`'s
    /// framing (checked as it passes), what the destination's `room` and the allowance (budgets, link bucket) let
    /// move now, and counts what moved: charged to the allowance, and, unless `record` is false (a body held back
    /// is not the client's yet), added to the exchange's record (and to the metrics at once for a tunnel, which
    /// may live for hours). nil: nothing may move now (the shaping timer or the sink's write event comes back).
    @inline(__always)
    func relay(_ direction: LinkDirection, _ body: inout BodyRelay, from source: OpaquePointer, to sink: OpaquePointer,
               room: Int, record: Bool = true) -> RelayStep? {
        let before = evbuffer_get_length(source)
        let allowed = allowance.room(direction, room: room, available: before, session: client)
        guard allowed > 0 else { return nil }
        let progress = body.pump(from: source, to: sink, budget: allowed)
        let left = evbuffer_get_length(source)
        counted(direction, before - left, record: record)
        return step(progress, before: before, left: left)
    }

    /// `bytes` of a body or a tunnel crossed the link `direction` (moved by `relay` or by splice(2)): the one place
    /// they are counted.
    @inline(__always)
    func counted(_ direction: LinkDirection, _ bytes: Int, record: Bool = true) {
        guard bytes > 0 else { return }
        allowance.charge(direction, bytes, session: client)
        guard record else { return }
        switch direction {
        case .up:
            exchange.bytesIn &+= UInt64(bytes)
            if exchange.bytesCountedWhileFlowing { worker.metrics.add(bytesIn: bytes) }
        case .down:
            exchange.bytesOut &+= UInt64(bytes)
            if exchange.bytesCountedWhileFlowing { worker.metrics.add(bytesOut: bytes) }
        }
    }

    func step(_ progress: BodyRelay.Progress, before: Int, left: Int) -> RelayStep {
        switch progress {
        case .inProgress: return RelayStep(result: .moving, before: before, left: left)
        case .complete: return RelayStep(result: .complete, before: before, left: left)
        case .invalid(let error):
            wireError = error
            return RelayStep(result: .invalid, before: before, left: left)
        }
    }

    // MARK: upstream events (called by UpstreamConnection)

    /// Whether `upstream` is this exchange's lease and the exchange is still being forwarded (an upstream's
    /// callback may arrive for an exchange that has just ended, or for a connection it no longer holds).
    func isForwarding(_ upstream: UpstreamConnection) -> Bool {
        guard case .forwarding(let driver) = client.machine.state else { return false }
        return driver === self && self.upstream === upstream
    }

    /// The same for a CONNECT or Upgrade tunnel.
    func isTunnelling(_ upstream: UpstreamConnection) -> Bool {
        guard case .tunnel(let driver) = client.machine.state else { return false }
        return driver === self && self.upstream === upstream
    }

    func upstreamConnected(_ upstream: UpstreamConnection) {
        guard isForwarding(upstream) else { return }
        perform(machine.upstreamConnected())
    }

    func upstreamWritable(_ upstream: UpstreamConnection) {
        if isTunnelling(upstream) { tunnel?.pump(fromClient: true); return }
        guard isForwarding(upstream) else { return }
        pumpRequestBody()
    }

    func upstreamReadable(_ upstream: UpstreamConnection) {
        if isTunnelling(upstream) { tunnel?.pump(fromClient: false); return }
        guard isForwarding(upstream) else { return }
        if response == nil {
            readResponseHead(upstream)
        } else {
            pumpResponseBody()
        }
    }

    /// The upstream failed before or while answering.
    func upstreamFailed(_ upstream: UpstreamConnection, code: ProxyErrorCode, detail: String) {
        if isTunnelling(upstream) {
            if tunnel?.machine.phase == .connecting && !connectAnswered {
                self.upstream = nil
                respondError(code, detail: detail, close: true)
            } else {
                client.abort(.upstreamAborted, detail: detail)
            }
            return
        }
        guard isForwarding(upstream) else { return }
        self.upstream = nil
        switch machine.upstreamFailed(reusedConnection: upstreamReused,
                                               bodyBytesConsumed: requestBody.transferred,
                                               timedOut: code == .upstreamTimeout) {
        case .retryOnNewConnection:
            connectUpstream(key: upstream.key, reuse: false)
        case .answer(let close):
            respondError(code, detail: detail, close: close)
        case .abort:
            client.abort(.upstreamAborted, detail: detail)
        }
    }

    /// The upstream's connection failed (reset, TLS error, a record cut short) while it was busy. If its response
    /// has begun, or bytes of it wait unread, they are relayed as after an EOF and the response then ends
    /// truncated (`ExchangeStateMachine.originBrokeOffAfterSending`); returns false when there is nothing to relay
    /// and the failure is answered as such (`upstreamFailed`).
    func upstreamBrokeOff(_ upstream: UpstreamConnection) -> Bool {
        guard isForwarding(upstream),
              response != nil || evbuffer_get_length(upstream.input) > 0 else { return false }
        if response != nil {
            perform(machine.originBrokeOffAfterSending())
            return true
        }
        // No head relayed yet (held for a link profile's latency, or not read): mark the break, then take the
        // EOF path, which reads the head when it may and relays the body behind it.
        _ = machine.originBrokeOffAfterSending()
        upstreamClosed(upstream)
        return true
    }

    /// The upstream closed its side. Everything it sent before is in `upstream.input` and may be far more than
    /// the client's buffer takes now (a slow reader): the exchange machine keeps the response draining it, and
    /// ends it only when it is empty. Ending it here lost the tail of large responses (SPEC §6).
    func upstreamClosed(_ upstream: UpstreamConnection) {
        if isTunnelling(upstream) { tunnel?.peerClosed(client: false); return }
        guard isForwarding(upstream) else { return }
        // A response held back for a link profile's latency is relayed when the hold ends, its EOF with it.
        if response == nil, evbuffer_get_length(upstream.input) > 0,
           !allowance.latencyElapsed(arrived: true, session: client) {
            originClosedWhileHeld = true
            return
        }
        let action = machine.originSentEOF()
        guard response == nil else {
            perform(action)
            return
        }
        // Bytes may have arrived with the EOF: read a head first (it starts the body relay, which sees the EOF).
        readResponseHead(upstream)
        guard isForwarding(upstream), response == nil else { return }
        upstreamFailed(upstream, code: .upstreamProtocolError, detail: "the origin closed the connection without a response")
    }

    func readResponseHead(_ upstream: UpstreamConnection) {
        // A link profile's latency is added before the head is relayed (SPEC §10).
        guard allowance.latencyElapsed(arrived: evbuffer_get_length(upstream.input) > 0, session: client) else { return }
        while isForwarding(upstream), response == nil {
            switch upstream.takeResponseHead() {
            case .incomplete:
                return
            case .invalid(let error):
                upstream.close()
                upstreamFailed(upstream, code: .upstreamProtocolError, detail: "invalid response head: " + HTTP1Session.detail(for: error))
                return
            case .complete(let head, let length):
                allowance.charge(.down, length, session: client)
                if head.status < 200 {
                    handleInterim(head, upstream)
                } else {
                    startResponse(head, upstream)
                }
            }
        }
    }

    /// 1xx responses: `100 Continue` and `103 Early Hints` are relayed to HTTP/1.1 clients; `101` turns the
    /// connection into a tunnel when the client asked to upgrade.
    func handleInterim(_ head: ResponseHead, _ upstream: UpstreamConnection) {
        if head.status == 101 {
            guard upgradeRequested else {
                upstream.close()
                upstreamFailed(upstream, code: .upstreamProtocolError, detail: "101 Switching Protocols without an Upgrade request")
                return
            }
            let bytes = MessageHeads.relayedResponse(head, keepAlive: true, clientVersion: exchange.clientVersion,
                                                     stripTransferEncoding: false, variant: exchange.variant, upgrade: true)
            evbuffer_add(output, bytes, bytes.count)
            exchange.status = 101
            becomeTunnel()
            return
        }
        if exchange.clientVersion == .http11 {
            let bytes = MessageHeads.relayedResponse(head, keepAlive: true, clientVersion: exchange.clientVersion,
                                                     stripTransferEncoding: false, variant: nil)
            evbuffer_add(output, bytes, bytes.count)
        }
    }

    func startResponse(_ head: ResponseHead, _ upstream: UpstreamConnection) {
        let framing: BodyFraming
        switch head.bodyFraming(requestMethod: exchange.method) {
        case .success(let f): framing = f
        case .failure(let error):
            upstream.close()
            upstreamFailed(upstream, code: .upstreamProtocolError, detail: "invalid response framing: " + HTTP1Session.detail(for: error))
            return
        }
        let strip = exchange.clientVersion == .http10 && framing == .chunked
        let upstreamTokens = head.connectionTokens
        let action = machine.responseHead(
            untilClose: framing == .untilClose,
            originKeepsConnection: !upstreamTokens.contains("close") && (head.version == .http11 || upstreamTokens.contains("keep-alive")),
            clientKeepsConnection: !strip)
        let bytes = MessageHeads.relayedResponse(head, keepAlive: machine.keepAlive, clientVersion: exchange.clientVersion,
                                                 stripTransferEncoding: strip, variant: exchange.variant, framing: framing,
                                                 connectionTokens: upstreamTokens)
        if exchange.variant == nil, manifestCap != nil || imageSettings != nil, let capture = heldBack(head, framing, strip, bytes) {
            self.capture = capture  // SPEC §13: held back until it is known to be a manifest or not
        } else {
            evbuffer_add(output, bytes, bytes.count)
            responseHeadLength = bytes.count
        }
        response = head
        exchange.status = head.status
        responseBody = BodyRelay(framing: framing, stripChunkFraming: strip)
        if exchange.method == "GET", head.status == 200, case .contentLength(let length) = framing {
            if exchange.variant == nil {
                worker.knownLengths.record(exchange.url, length: length)
            } else if let saving = worker.knownLengths.saving(exchange.url, replacement: length) {
                worker.metrics.saved(.variant, bytes: saving)
            }
        }
        perform(action)
    }

    /// The capture a response head about to be relayed is held back in, when it may be rewritten (a manifest under
    /// a cap, an image to transcode), else nil.
    func heldBack(_ head: ResponseHead, _ framing: BodyFraming, _ strip: Bool, _ headBytes: [UInt8]) -> ResponseCapture? {
        if let cap = manifestCap, let capture = ResponseCapture.forManifest(head, framing: framing, strip: strip,
                                                                            headBytes: headBytes, cap: cap,
                                                                            arrived: upstream?.input, metrics: worker.metrics) {
            return capture
        }
        guard let settings = imageSettings else { return nil }
        return ResponseCapture.forImage(head, framing: framing, strip: strip, headBytes: headBytes, settings: settings,
                                        acceptsWebP: acceptsWebP, metrics: worker.metrics)
    }

    /// Moves response body bytes from the upstream to the client, as far as the client's buffer has room;
    /// a full client buffer leaves the bytes in the upstream's input, whose read watermark then stops reading
    /// from the origin (backpressure).
    func pumpResponseBody() {
        guard let upstream = upstream, response != nil else { return }
        if let capture = capture {
            capture.pump(self, upstream)
            return
        }
        guard let step = relay(.down, &responseBody, from: upstream.input, to: output,
                               room: Flow.highWater - outputLength) else { return }
        // Nothing of this response has been written while all of it is still queued at the output's tail.
        let unwritten = outputLength >= responseHeadLength + Int(responseBody.delivered)
        perform(machine.responseBodyStep(step, unwritten: unwritten))
    }

    /// Removes this exchange's response from the client's output, where it is still whole at the tail (anything
    /// before it belongs to earlier responses), so that a clean answer can take its place.
    func retractUnsentResponse() {
        if capture != nil {
            // Held back (SPEC §13): nothing of it was queued.
            self.capture = nil
            response = nil
            return
        }
        let queued = responseHeadLength + Int(responseBody.delivered)
        let length = outputLength
        guard queued > 0, length >= queued else { return }
        let earlier = evbuffer_new()!
        transport.withOutputFrontUnfrozen {
            evbuffer_remove_buffer(output, earlier, length - queued)
            evbuffer_drain(output, queued)
            evbuffer_add_buffer(output, earlier)
        }
        evbuffer_free(earlier)
        response = nil
    }
}

/// Content-Length response bodies, moved kernel to kernel (`BodySplice`).
extension ExchangeDriver {
    /// After each callback: a large Content-Length body goes to splice(2) once it may (see `BodySplice`).
    func switchBodyToSpliceIfIdle() {
        guard let remaining = BodySplice.remaining(self) else {
            if let bodySplice, bodySplice.relay == nil {
                bodySplice.stopDraining()
                self.bodySplice = nil
            }
            return
        }
        let splice = bodySplice ?? BodySplice(driver: self)
        bodySplice = splice
        if !splice.startWhenIdle(remaining: remaining) { bodySplice = nil }
    }
}
