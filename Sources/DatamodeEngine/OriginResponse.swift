import CLibevent
import DatamodeHTTP

/// The origin's final response on its way to the client: its head as relayed (or held back), its body's relay,
/// and how the body leaves user space: streamed through the one relay, held back and maybe rewritten
/// (`ResponseCapture`, SPEC §13), or spliced (`BodySplice`). Made when the final head arrives; the driver's
/// `response` is nil before that, and again after a response that was not written yet was retracted for a `502`.
///
/// Reading the head (`OriginResponse.readHead`) also passes interim responses on (`100`, `103`) and turns a `101`
/// into a tunnel.
final class OriginResponse {
    /// The driver that owns this (and outlives it): not reference-counted, as it is read on every relay step.
    unowned(unsafe) let driver: ExchangeDriver
    let status: Int
    let framing: BodyFraming
    var body: BodyRelay
    /// The length of the relayed head: with `body.delivered`, what this response has queued towards the client (to
    /// tell whether any of it has been written yet).
    var headLength = 0
    /// The head went to an HTTP/2 stream in memory (`handToStream`): it is out of the pair already, so the response
    /// can no longer be taken back whole.
    var headHanded = false
    /// The body being held back while it may be rewritten (SPEC §13); nil on the streaming path.
    var capture: ResponseCapture?
    /// The rest of a large Content-Length body, moved by splice(2); nil for every other body.
    var splice: BodySplice?

    init(driver: ExchangeDriver, status: Int, framing: BodyFraming, body: BodyRelay) {
        self.driver = driver
        self.status = status
        self.framing = framing
        self.body = body
    }

    // MARK: the head

    /// Reads what the origin sent as far as a final head: interim heads are passed on (or become a tunnel), a final
    /// one starts the response (`start`). A link profile's latency is added before the head is relayed (SPEC §10).
    static func readHead(_ driver: ExchangeDriver, _ upstream: UpstreamConnection) {
        guard driver.allowance.latencyElapsed(arrived: upstream.hasResponseBytes, session: driver.session)
        else { return }
        let lease = driver.lease
        while lease.isForwarding(upstream), driver.response == nil {
            // Nil from `ResponseHeadTake.spans`: a head handed over by an origin's HTTP/2 stream, read with its Strings.
            if relaysFromBytes(driver), let read = ResponseHeadTake.spans(from: upstream) { startFromBytes(driver, $0, $1, upstream) } {
                switch read {
                case .waiting, .failed: return
                case .interim(let head): interim(driver, head, upstream)
                case .started(let response, let action): started(driver, response, action)
                }
            } else if !readOneHead(driver, upstream) {
                return
            }
        }
    }

    /// Reads one head through its Strings (`ResponseHeadTake.strings`); false when no head was complete
    /// or the origin failed.
    private static func readOneHead(_ driver: ExchangeDriver, _ upstream: UpstreamConnection) -> Bool {
        switch ResponseHeadTake.strings(from: upstream) {
        case .incomplete:
            return false
        case .invalid(let error):
            upstream.close()
            driver.lease.upstreamFailed(upstream, code: .upstreamProtocolError, detail: "invalid response head: " + error.detail)
            return false
        case .complete(var head, let length):
            driver.allowance.charge(.down, length, session: driver.session)
            // SPEC §16: a transparent client must stay on TCP, where the redirect catches it.
            if driver.session.transparent != nil { head = AltSvc.withoutHTTP3(head) }
            if head.status < 200 {
                interim(driver, head, upstream)
            } else {
                start(driver, head, upstream)
            }
            return true
        }
    }

    /// 1xx responses: `100 Continue` and `103 Early Hints` are relayed to HTTP/1.1 clients; `101` turns the
    /// connection into a tunnel when the client asked to upgrade.
    private static func interim(_ driver: ExchangeDriver, _ head: ResponseHead, _ upstream: UpstreamConnection) {
        let exchange = driver.exchange
        driver.machine.originSentInterim()
        if head.status == 101 {
            guard driver.upgradeRequested else {
                upstream.close()
                driver.lease.upstreamFailed(upstream, code: .upstreamProtocolError,
                                      detail: "101 Switching Protocols without an Upgrade request")
                return
            }
            let bytes = MessageHeads.relayedResponse(head, keepAlive: true, clientVersion: exchange.clientVersion,
                                                     stripTransferEncoding: false, variant: exchange.variant, upgrade: true)
            evbuffer_add(driver.output, bytes, bytes.count)
            exchange.status = 101
            Tunnel.upgrade(driver)
            return
        }
        if exchange.clientVersion == .http11 {
            if driver.transport.isStream,
               handToStream(driver, MessageHeads.relayedResponseHead(head, keepAlive: true, clientVersion: exchange.clientVersion,
                                                                     stripTransferEncoding: false, variant: nil)) != nil {
                return
            }
            let bytes = MessageHeads.relayedResponse(head, keepAlive: true, clientVersion: exchange.clientVersion,
                                                     stripTransferEncoding: false, variant: nil)
            evbuffer_add(driver.output, bytes, bytes.count)
        }
    }

    /// An HTTP/2 stream's exchange hands the relayed head to the stream in memory (`HTTP2Stream.take`) when its text
    /// would parse back to it (`HeadHandoff`, with the limits the stream reads the text with) and nothing written
    /// before it waits in the output. Returns the text's length, or nil: the caller writes the text.
    ///
    /// Only the limits are checked (`HeadHandoff.Source.checkedParts`): every part of `relayed` is known good by how
    /// it was made (`MessageHeads.relayedResponse`). The origin's status, reason and fields were read by
    /// `HTTP1Parser` or handed over from an h2 origin's stream as `checkedParts`; what the proxy adds is a constant, a
    /// number, or a variant id, which configuration and the admin API hold to letters, digits, `-`, `_` and `.`
    /// (`ConfigParser.isValidVariantID`), or a media cap's fixed name. `HandoffSourceTests` holds it on random and
    /// mutated origin heads; debug builds check the bytes too.
    private static func handToStream(_ driver: ExchangeDriver, _ relayed: ResponseHead) -> Int? {
        guard let stream = driver.transport.http2Stream,
              let length = HeadHandoff.response(relayed, limits: Flow.relayedResponseLimits,
                                                maxHeadBytes: Flow.maxRelayedResponseHeadBytes, from: .checkedParts),
              stream.take(relayed) else { return nil }
        return length
    }

    /// The final head: its framing decides the body's relay and keep-alive, its relayed form is queued for the
    /// client (or held back with the body), and the exchange machine relays the body.
    private static func start(_ driver: ExchangeDriver, _ head: ResponseHead, _ upstream: UpstreamConnection) {
        let exchange = driver.exchange
        let framing: BodyFraming
        switch head.bodyFraming(requestMethod: exchange.method) {
        case .success(let f): framing = f
        case .failure(let error):
            upstream.close()
            driver.lease.upstreamFailed(upstream, code: .upstreamProtocolError,
                                  detail: "invalid response framing: " + error.detail)
            return
        }
        let strip = exchange.clientVersion == .http10 && framing == .chunked
        let upstreamTokens = head.connectionTokens
        // An HTTP/2 client's limit on heads (`HTTP2Stream.refusal`) is one more limit on the origin's head: past it,
        // `502` as past the proxy's own (`Flow.responseLimits`), before the response starts. (`keepAlive` only adds
        // `Connection`, which HTTP/2 drops.)
        if let stream = driver.transport.http2Stream, let refusal = stream.refusal(of: head, relayed: {
            MessageHeads.relayedResponseHead(head, keepAlive: true, clientVersion: exchange.clientVersion,
                                             stripTransferEncoding: strip, variant: exchange.variant, framing: framing,
                                             connectionTokens: upstreamTokens, heldMilliseconds: exchange.heldMilliseconds)
        }) {
            upstream.close()
            driver.lease.upstreamFailed(upstream, code: .upstreamProtocolError, detail: refusal)
            return
        }
        let action = responseHead(driver, version: head.version, framing: framing, tokens: upstreamTokens, strip: strip)
        let response = OriginResponse(driver: driver, status: head.status, framing: framing,
                                      body: BodyRelay(framing: framing, stripChunkFraming: strip, overHTTP2: driver.transport.isStream))
        upstream.responseBodyStarts(forStream: driver.transport.isStream)
        let mayBeHeldBack = exchange.variant == nil && (driver.manifestCap != nil || driver.imageSettings != nil)
        if !mayBeHeldBack, driver.transport.isStream,
           let length = handToStream(driver, MessageHeads.relayedResponseHead(
               head, keepAlive: driver.machine.keepAlive, clientVersion: exchange.clientVersion, stripTransferEncoding: strip,
               variant: exchange.variant, framing: framing, connectionTokens: upstreamTokens,
               heldMilliseconds: exchange.heldMilliseconds)) {
            response.headLength = length
            response.headHanded = true
        } else {
            let bytes = MessageHeads.relayedResponse(head, keepAlive: driver.machine.keepAlive, clientVersion: exchange.clientVersion,
                                                     stripTransferEncoding: strip, variant: exchange.variant, framing: framing,
                                                     connectionTokens: upstreamTokens, heldMilliseconds: exchange.heldMilliseconds)
            if mayBeHeldBack, let capture = heldBack(driver, head, framing, strip, bytes) {
                response.capture = capture  // SPEC §13: held back until it is known to be a manifest or not
            } else {
                evbuffer_add(driver.output, bytes, bytes.count)
                response.headLength = bytes.count
            }
        }
        started(driver, response, action)
    }

    /// The exchange machine's step for a final head: whether the response ends with the origin's connection, and
    /// whether each side's connection is kept.
    private static func responseHead(_ driver: ExchangeDriver, version: HTTPVersion, framing: BodyFraming,
                                     tokens: ConnectionOptions, strip: Bool) -> ExchangeStateMachine.Action {
        driver.machine.responseHead(
            untilClose: framing == .untilClose,
            originKeepsConnection: !tokens.contains("close") && (version == .http11 || tokens.contains("keep-alive")),
            clientKeepsConnection: !strip)
    }

    /// A final head is relayed (or held back): the response is the exchange's, and the machine relays its body.
    private static func started(_ driver: ExchangeDriver, _ response: OriginResponse, _ action: ExchangeStateMachine.Action) {
        let exchange = driver.exchange
        driver.response = response
        exchange.status = response.status
        if exchange.method == "GET", response.status == 200, case .contentLength(let length) = response.framing {
            let worker = driver.worker
            if exchange.variant == nil {
                worker.knownLengths.record(exchange.url, length: length)
            } else if let saving = worker.knownLengths.saving(exchange.url, replacement: length) {
                worker.metrics.saved(.variant, bytes: saving)
            }
        }
        driver.perform(action)
    }

    // MARK: the head, from its bytes

    /// Whether the exchange's response head is relayed from the origin's bytes (`startFromBytes`) rather than through
    /// its Strings (`start`): for an HTTP/1 client, when nothing rewrites the head (a variant, Alt-Svc on the
    /// transparent path) or may hold it back (a manifest cap, image transcoding). The relayed text is the same
    /// either way (`SpannedRelayDifferentialTests`).
    private static func relaysFromBytes(_ driver: ExchangeDriver) -> Bool {
        !driver.transport.isStream && driver.session.transparent == nil && driver.exchange.variant == nil
            && driver.manifestCap == nil && driver.imageSettings == nil
    }

    /// What reading a head from its bytes came to; `started` and `interim` go on after the bytes are drained.
    enum ReadFromBytes {
        case waiting
        case failed
        case interim(ResponseHead)
        case started(OriginResponse, ExchangeStateMachine.Action)
    }

    /// `start` for a head read as offsets into `bytes` (the front of the origin's input, drained when this returns):
    /// the same framing rules, machine step and relay (`MessageHeads.relayedResponse(_:in:...)`), with no String
    /// built for the origin's fields.
    private static func startFromBytes(_ driver: ExchangeDriver, _ result: HeadParseResult<ResponseHeadSpans>,
                                       _ bytes: UnsafeRawBufferPointer, _ upstream: UpstreamConnection) -> ReadFromBytes {
        let head: ResponseHeadSpans
        switch result {
        case .incomplete:
            return .waiting
        case .invalid(let error):
            upstream.close()
            driver.lease.upstreamFailed(upstream, code: .upstreamProtocolError, detail: "invalid response head: " + error.detail)
            return .failed
        case .complete(let spans, let length):
            driver.allowance.charge(.down, length, session: driver.session)
            head = spans
        }
        if head.status < 200 { return .interim(head.head(in: bytes)) }
        let exchange = driver.exchange
        let framing: BodyFraming
        switch head.bodyFraming(in: bytes, requestMethod: exchange.method) {
        case .success(let f): framing = f
        case .failure(let error):
            upstream.close()
            driver.lease.upstreamFailed(upstream, code: .upstreamProtocolError,
                                        detail: "invalid response framing: " + error.detail)
            return .failed
        }
        let strip = exchange.clientVersion == .http10 && framing == .chunked
        let tokens = head.connectionTokens(in: bytes)
        let action = responseHead(driver, version: head.version, framing: framing, tokens: tokens, strip: strip)
        let worker = driver.worker
        worker.relayedHeadWriter.reset()
        MessageHeads.relayedResponse(head, in: bytes, keepAlive: driver.machine.keepAlive, clientVersion: exchange.clientVersion,
                                     stripTransferEncoding: strip, framing: framing, connectionTokens: tokens,
                                     heldMilliseconds: exchange.heldMilliseconds, into: &worker.relayedHeadWriter)
        let response = OriginResponse(driver: driver, status: head.status, framing: framing,
                                      body: BodyRelay(framing: framing, stripChunkFraming: strip, overHTTP2: false))
        upstream.responseBodyStarts(forStream: false)
        let output = driver.output
        response.headLength = worker.relayedHeadWriter.withBytes { relayed in
            evbuffer_add(output, relayed.baseAddress, relayed.count)
            return relayed.count
        }
        // A head far larger than most (up to `Flow.maxResponseHeadBytes`) is not kept for the worker's life.
        if worker.relayedHeadWriter.capacity > 8 * Worker.relayedHeadWriterCapacity {
            worker.relayedHeadWriter = HeadWriter(capacity: Worker.relayedHeadWriterCapacity)
        }
        return .started(response, action)
    }

    /// The capture a response head about to be relayed is held back in, when it may be rewritten (a manifest under
    /// a cap, an image to transcode), else nil.
    private static func heldBack(_ driver: ExchangeDriver, _ head: ResponseHead, _ framing: BodyFraming, _ strip: Bool,
                                 _ headBytes: [UInt8]) -> ResponseCapture? {
        let metrics = driver.worker.metrics
        if let cap = driver.manifestCap,
           let capture = ResponseCapture.forManifest(head, framing: framing, strip: strip, headBytes: headBytes, cap: cap,
                                                     arrived: driver.upstream?.input, metrics: metrics) {
            return capture
        }
        guard let settings = driver.imageSettings else { return nil }
        return ResponseCapture.forImage(head, framing: framing, strip: strip, headBytes: headBytes, settings: settings,
                                        acceptsWebP: driver.acceptsWebP, metrics: metrics)
    }

    // MARK: the body

    /// Moves body bytes from the upstream to the client, as far as the client's buffer has room; a full client
    /// buffer leaves the bytes in the upstream's input, whose read watermark then stops reading from the origin
    /// (backpressure).
    func pump() {
        let driver = driver
        guard let upstream = driver.upstream else { return }
        if let capture {
            capture.pump(driver, upstream)
            return
        }
        guard let step = driver.relay(.down, &body, from: upstream.input, to: driver.output,
                                      room: driver.transport.outputHighWater - driver.outputLength) else { return }
        // Nothing of this response has been written while all of it is still queued at the output's tail.
        let unwritten = !headHanded && driver.outputLength >= headLength + Int(body.delivered)
        driver.perform(driver.machine.responseBodyStep(step, unwritten: unwritten))
    }

    /// Removes this response from the client's output, where it is still whole at the tail (anything before it
    /// belongs to earlier responses), so that a clean answer can take its place.
    func retract() {
        let driver = driver
        guard capture == nil else {
            // Held back (SPEC §13): nothing of it was queued.
            driver.response = nil
            return
        }
        let queued = headLength + Int(body.delivered)
        let output = driver.output
        let length = driver.outputLength
        guard !headHanded, queued > 0, length >= queued else { return }
        let earlier = evbuffer_new()!
        driver.transport.withOutputFrontUnfrozen {
            evbuffer_remove_buffer(output, earlier, length - queued)
            evbuffer_drain(output, queued)
            evbuffer_add_buffer(output, earlier)
        }
        evbuffer_free(earlier)
        driver.response = nil
    }

    /// After each callback: a large Content-Length body goes to splice(2) once it may (see `BodySplice`). Returns
    /// whether the whole body moved at once and the exchange went on: what that queued is still to be flushed.
    func switchToSpliceIfIdle() -> Bool {
        let driver = driver
        guard let remaining = BodySplice.remaining(driver) else {
            if let splice, splice.relay == nil {
                splice.stopDraining()
                self.splice = nil
            }
            return false
        }
        let splice = splice ?? BodySplice(driver: driver)
        self.splice = splice
        switch splice.startWhenIdle(remaining: remaining) {
        case .started: return false
        case .ended: return true
        case .failed:
            self.splice = nil
            return false
        }
    }
}
