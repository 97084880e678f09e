import CDatamodeShims
import CLibevent
import DatamodeConfig
import DatamodeHTTP
import DatamodePolicy
#if canImport(Glibc)
import Glibc
#endif

/// Forwarding an exchange: the forwarded head to its upstream lease (`UpstreamLease`), the request body towards it,
/// the response body back, and the exchange machine's actions carried out.
extension ExchangeDriver {
    // MARK: forwarding

    func forward(_ head: RequestHead, to target: RequestTarget, tags: RequestTags,
                         variant: String?) {
        let settings = worker.settings
        let tokens = connectionTokens
        let upgrade = head.contains("upgrade") && tokens.contains("upgrade")
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
        session.machine.forward(self)
        let key = session.upstreamKey(host: target.host, port: target.port, tls: target.scheme == "https",
                                      own: variant == nil || session.transparent != nil
                                          && TransparentConnection.isSameOrigin(exchange.url, target))
        let framing = requestFraming
        lease.forward(to: key) { forOriginStream in
            MessageHeads.forwardedRequest(head, target: target, tags: tags, settings: settings.tagSettings,
                                          mode: exchange.mode, upgrade: upgrade, framing: framing,
                                          connectionTokens: tokens, variantTarget: variant != nil, asHead: forOriginStream)
        }
    }

    /// Carries out an exchange-level action.
    func perform(_ action: ExchangeStateMachine.Action) {
        switch action {
        case .none:
            break
        case .pumpRequestBody:
            pumpRequestBody()
        case .pumpResponseBody:
            response?.pump()
        case .requestSent:
            upstream?.requestComplete()
        case .finish(let recycle):
            finishExchange(recycleUpstream: recycle)
        case .refuseRequest:
            // Nothing of this request may reach the origin (SPEC §6: never forwarded). The head and any valid
            // chunks are still only queued: libevent writes them after this callback returns (for a fresh
            // connection, right after the CONNECTED callback that brought us here), so drop them first.
            upstream?.discardPendingOutput()
            heldLease?.close()
            let error = wireError ?? .malformed("invalid chunked request body")
            respondError(error.clientErrorCode, detail: error.detail, close: true)
        case .retractAndAnswerBadGateway:
            heldLease?.close()
            response?.retract()
            let detail = wireError.map(\.detail) ?? "invalid framing"
            respondError(.upstreamProtocolError, detail: "invalid chunked response body: " + detail,
                         close: !requestBody.isComplete)
        case .truncate(let reason):
            session.truncated = true
            exchange.outcome = .error
            if exchange.reason == nil { exchange.reason = reason.rawValue }
            finishExchange(recycleUpstream: false)
        case .abort(let reason):
            session.abort(reason, detail: "the client broke off its request")
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
    /// move now, and counts what moved: charged to the allowance, and the client's bytes of it (`clientBytes`) added
    /// to the exchange's record unless `record` is false (a body held back is not the client's yet), and to the
    /// metrics at once for tunnels. nil: nothing may move now (the shaping timer or the sink's write event comes back).
    @inline(__always)
    func relay(_ direction: LinkDirection, _ body: inout BodyRelay, from source: OpaquePointer, to sink: OpaquePointer,
               room: Int, record: Bool = true) -> RelayStep? {
        let allowed = allowance.room(direction, room: room, available: evbuffer_get_length(source), session: session)
        guard allowed > 0 else { return nil }
        let taken = body.transferred, clientBytes = body.clientBytes
        let progress = body.pump(from: source, to: sink, budget: allowed)
        // What the relay took, not what the source lost: a bufferevent pair (an HTTP/2 stream's end) or a TLS
        // filter refills the source from inside the move, as soon as it drains below its watermark, and "before
        // less after" then saw a few bytes where hundreds of KB had moved (uncharged to the bucket and budgets).
        let moved = Int(body.transferred - taken)
        let left = evbuffer_get_length(source)
        counted(direction, moved, recorded: record ? Int(body.clientBytes - clientBytes) : 0)
        if progress == .complete, !body.droppedTrailerFields.isEmpty { trailerFieldsDropped(direction, body.droppedTrailerFields) }
        return step(progress, before: left + moved, left: left)
    }

    /// A chunked body ended with trailer fields left out (`TrailerSection`): RFC 9110 §6.5.2 lets a recipient discard
    /// them, and the log says which.
    private func trailerFieldsDropped(_ direction: LinkDirection, _ names: [String]) {
        worker.logger.info("trailer fields dropped", metadata: [
            "url": "\(exchange.url)", "body": "\(direction == .down ? "response" : "request")",
            "fields": "\(names.joined(separator: ", "))",
        ])
    }

    /// `bytes` of a body or a tunnel crossed the link `direction` (moved by `relay` or by splice(2)): the one place
    /// they are counted. `recorded`: how many of them the exchange's record counts, when not all (see `relay`).
    @inline(__always)
    func counted(_ direction: LinkDirection, _ bytes: Int, recorded: Int? = nil) {
        guard bytes > 0 else { return }
        allowance.charge(direction, bytes, session: session)
        let bytes = recorded ?? bytes
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

    /// Moves what the origin sent of the response body on (`OriginResponse.pump`).
    func pumpResponseBody() {
        response?.pump()
    }
}
