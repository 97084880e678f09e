import CDatamodeShims
import CLibevent
import DatamodeConfig
import DatamodeHTTP
import DatamodePolicy
import DatamodeState
#if canImport(Glibc)
import Glibc
#endif

/// Drives one exchange from admission to its log line: carries out admission's verdict, holds the upstream's
/// lease (`UpstreamLease`, which hears that upstream's events and passes them here), relays the request body (the
/// response goes through its `OriginResponse`), and answers locally when it must. What to do next is decided by
/// `ExchangeStateMachine`; this class feeds it and carries its actions out.
///
/// The session it belongs to (`HTTP1Session`, HTTP/1) reads heads in order and gives each one a driver; the
/// driver reads the request body from, and writes the response to, that session's buffers, and tells the session
/// when it is over (`exchangeFinished`). The `Exchange` it drives is the record: what the log line and the
/// metrics say about it.
final class ExchangeDriver {
    /// Strong: a driver keeps its session alive while it runs (a splice relay's or the image pool's callback may
    /// close the session and then still touch it). No cycle outlives the exchange: the session lets go of its
    /// driver when the exchange finishes or the connection closes.
    let session: HTTP1Session
    /// What is recorded of this exchange (its log line).
    let exchange: Exchange
    /// Strong, taken from the session once: the worker outlives every exchange, and a checked `unowned` load cost a
    /// retain and a release on every use (~19 a plain exchange, callgrind).
    let worker: Worker
    @inline(__always) var transport: ClientTransport { session.transport }
    /// The request body comes from here, and the response goes there (plaintext under TLS).
    @inline(__always) var input: OpaquePointer { session.input }
    @inline(__always) var output: OpaquePointer { session.output }
    @inline(__always) var outputLength: Int { session.outputLength }

    /// The exchange's lifecycle: phases, EOFs, keep-alive, upstream reuse (see `ExchangeStateMachine`).
    var machine = ExchangeStateMachine(requestComplete: true, keepAlive: true)
    /// The exchange's hold on its upstream (its lease): chosen, retried, given back to the pool or closed; it hears
    /// the connection's events and passes them here. Made when the exchange first takes a connection (`lease`).
    private(set) var heldLease: UpstreamLease?
    var lease: UpstreamLease {
        if let heldLease { return heldLease }
        let lease = UpstreamLease(driver: self)
        heldLease = lease
        return lease
    }
    /// The lease's connection, while it holds one.
    @inline(__always) var upstream: UpstreamConnection? { heldLease?.upstream }
    var requestFraming: BodyFraming = .none
    /// The request's `Connection` tokens, computed once per request (keep-alive, upgrade, hop-by-hop removal).
    var connectionTokens = ConnectionOptions()
    var requestBody = BodyRelay(framing: .none)
    var upgradeRequested = false
    /// The request has a body and `Expect: 100-continue`: its client waits before sending the body.
    var expectsContinue = false
    /// The origin's final response, from its head on; nil before (and after a retraction).
    var response: OriginResponse?
    /// The bitrate cap for manifests when this is a GET under a capped mode (SPEC §13), else nil.
    var manifestCap: UInt64?
    /// Image transcoding settings when this is a GET under a mode that transcodes (SPEC §13), else nil.
    var imageSettings: ImagesSection?
    /// The request's `Accept` has `image/webp` (read only when `imageSettings` is set).
    var acceptsWebP = false
    /// The framing error behind a refusal found while relaying a body (for the problem's detail).
    var wireError: HTTPWireError?
    /// For a CONNECT or Upgrade: the tunnel.
    var tunnel: Tunnel?
    /// An intercepted CONNECT was answered `200` by the proxy before any origin connection (SPEC §9): a blind relay
    /// that follows must not answer again, and a failure to reach the origin can only close the tunnel.
    var connectAnswered = false
    /// The origin closed while its response head was held back for the added latency: handled on release.
    var originClosedWhileHeld = false
    /// What may cross the link, and when: the link profile's buckets and latency, the data budgets (SPEC §10, §11).
    var allowance = Allowance()
    /// A refusal's known end (SPEC §18.1), from admission: `Retry-After` and `liftsAt` on the refusal.
    var refusalLift: RefusalLift?
    /// A refused upload being stored instead (SPEC §18.3).
    var intake: DeferralIntake?

    init(session: HTTP1Session, exchange: Exchange) {
        self.session = session
        self.exchange = exchange
        worker = session.worker
    }

    /// Whether this driver is still the one its session is busy with (an upstream callback may arrive for one
    /// that has just ended).
    var isCurrent: Bool { session.machine.exchange === self }

    /// A request head was read: admission decides (`Admission.admit`, pure), and this carries the verdict out.
    /// `source`: where the session's requests come from (the proxy port, an intercepted tunnel).
    func begin(_ head: RequestHead, source: RequestSource) {
        let admission = worker.admit(head, source: source, client: session.peerAddress, clientText: session.peerText)
        // SPEC §18.2: a refusal the client (or a rule) asked to wait out is held, head only, until it lifts.
        if admission.framing != nil, admission.isRefusedByPolicy,
           let milliseconds = HeldRequests.holdMilliseconds(head, ruleHold: admission.ruleHold, settings: worker.settings),
           worker.held.hold(self, head, source: source, milliseconds: milliseconds) {
            session.machine.hold(self)
            return
        }
        proceed(admission, head)
    }

    /// A held request is let go (`HeldRequests`): decided again, it is carried out as that decision says, with
    /// `Data-Mode-Held` on its response when it is no longer refused.
    func releaseHeld(_ admission: Admission, _ head: RequestHead, heldMilliseconds: Int64?) {
        exchange.heldMilliseconds = heldMilliseconds
        proceed(admission, head)
    }

    /// Records what admission learned and carries its verdict out.
    private func proceed(_ admission: Admission, _ head: RequestHead) {
        let settings = worker.settings
        connectionTokens = admission.connectionTokens
        guard let framing = admission.framing else {
            // Ambiguous framing: refused and closed before anything else is looked at (RFC 9112 §6.3).
            exchange.outcome = .error
            carryOut(admission.verdict, head)
            return
        }
        requestBody = BodyRelay(framing: framing, overHTTP2: transport.isStream)
        requestFraming = framing
        machine = ExchangeStateMachine(requestComplete: requestBody.isComplete, keepAlive: admission.keepAlive)
        if !requestBody.isComplete {
            expectsContinue = head.values(of: "expect").contains { $0.utf8.count == 12 && $0.lowercased() == "100-continue" }
        }
        if let url = admission.url { exchange.url = url }
        exchange.session = admission.session
        allowance.budgetMask = admission.budgetMask
        // Only when there is one: assigning the optional copied it through its generic value witness, nil or not
        // (~350 instructions a plain exchange, callgrind).
        if case .some = admission.lift { refusalLift = admission.lift }
        if let mode = admission.mode { exchange.mode = mode }
        if let tags = admission.tags {
            exchange.tags = tags
            exchange.tagSources = admission.tagSources
            exchange.rule = admission.rule
        }
        switch admission.verdict {
        case .refuse:
            break
        case .reject, .budgetExhausted:
            // SPEC §18.3: a refused upload that asks for it is stored and answered 202 instead.
            if DeferralIntake.wants(head, url: admission.url, worker: worker),
               DeferralIntake.start(self, head, refusal: admission.verdict) { return }
        case .intercept, .tunnel, .forward, .serveVariant:
            allowance.apply(Allowance.profile(session: exchange.session, mode: exchange.mode, settings: settings),
                            worker: worker, client: session.peerAddress)
            if let intercepted = session.intercepted {
                // SPEC §10: a tunnel's latency is added once; inside an intercepted tunnel that is the first
                // request's response head, not every request's.
                if intercepted.latencyAdded {
                    allowance.latency = .none
                } else if case .pending = allowance.latency {
                    intercepted.latencyAdded = true
                }
            }
        }
        carryOut(admission.verdict, head)
        // The requests inside an intercepted tunnel act as the user of its CONNECT.
        if case .intercept = admission.verdict { session.intercepted?.proxyUser = admission.proxyUser }
    }

    /// Carries out what admission decided.
    private func carryOut(_ verdict: Admission.Verdict, _ head: RequestHead) {
        switch verdict {
        case .refuse(let code, let detail, let close, let fields):
            respondError(code, detail: detail, close: close, extraFields: fields)
        case .reject(let rejection, let budget):
            exchange.outcome = .rejected
            exchange.reason = rejection.code.rawValue
            respond(.rejection(rejection, mode: exchange.mode, url: exchange.url, budget: budget, lift: refusalLift),
                    close: false)
            if head.method == "GET", let known = worker.knownLengths[exchange.url] {
                worker.metrics.saved(.rejected, bytes: Int(known))
            }
        case .budgetExhausted(let index):
            refuseForBudget(index, url: exchange.url)
        case .intercept(let target):
            session.beginInterception(self, target: target)
        case .tunnel(let target):
            Tunnel.connect(self, to: target)
        case .forward(let target, let tags):
            exchange.outcome = .forwarded
            forward(head, to: target, tags: tags, variant: nil)
        case .serveVariant(_, let tags, let rewrite):
            exchange.outcome = .rewritten
            exchange.variant = rewrite.id
            serveVariant(head, tags: tags, rewrite: rewrite)
        }
    }

    func serveVariant(_ head: RequestHead, tags: RequestTags, rewrite: VariantRewrite) {
        switch rewrite.action {
        case .fetch(let url):
            switch RequestTarget.parse(url, method: head.method) {
            case .success(let target) where target.form == .absolute:
                forward(head, to: target, tags: tags, variant: rewrite.id)
            default:
                respondError(.upstreamUnreachable, detail: "variant \(rewrite.id) has an unusable target \(url)",
                             close: false)
            }
        case .redirect(let location):
            respond(.redirect(to: location, variant: rewrite.id), close: false)
        case .file(let path, let contentType):
            serveFile(head, path: path, contentType: contentType, variant: rewrite.id)
        }
    }

    // MARK: completion

    /// The exchange is over: its upstream goes back to the pool (or is closed), its line is written, and the
    /// session goes on with the next request (or closes).
    func finishExchange(recycleUpstream: Bool) {
        heldLease?.release(recycle: recycleUpstream)
        logExchange()
        session.exchangeFinished(self)
    }

    func logExchange() {
        guard !exchange.logged else { return }
        exchange.logged = true
        worker.record(exchange, client: session.peerText)
    }

    /// The session is freed (an abort, an error, the end of a tunnel): the upstream and the splices go with it,
    /// and the line is written if it was not (a tunnel's is written here, when it ends).
    func released() {
        worker.held.drop(self)
        response?.splice?.stop()
        response?.splice = nil
        tunnel?.stop()
        heldLease?.close()
        logExchange()
    }

    // MARK: after each callback

    /// Called after the session flushed its writes: a tunnel passes ends on and may go to splice(2); a large body
    /// may go to splice(2). Returns whether a body spliced whole at once ended the exchange (flush again).
    func afterFlush() -> Bool {
        if let tunnel {
            tunnel.afterFlush()
        } else if let response, response.splice?.relay == nil {
            return response.switchToSpliceIfIdle()
        }
        return false
    }

    /// A pump moves only what fits below the destination's high water. If the write that follows empties the
    /// destination, no write event is registered (writes are speculative), and the bytes left in the source
    /// were already read from its socket, so no read event will come for them either: move them now.
    /// Returns whether anything moved.
    func moveWhatFlushingMadeRoomFor() -> Bool {
        guard let upstream, upstream.isConnected else { return false }
        let before = evbuffer_get_length(input) + evbuffer_get_length(upstream.input)
        // Nothing waits in either source (nearly every call: a small exchange's flushes find both empty), so nothing
        // can move and the answer below would be false too (callgrind, 1 KiB exchange: 621 -> 342 instructions a
        // request in this function, most of them length reads).
        guard before > 0 else { return false }
        if let tunnel {
            if evbuffer_get_length(upstream.input) > 0 && outputLength < Flow.highWater {
                tunnel.pump(fromClient: false)
            }
            if evbuffer_get_length(input) > 0 && evbuffer_get_length(upstream.output) < Flow.highWater {
                tunnel.pump(fromClient: true)
            }
        } else {
            if response != nil && evbuffer_get_length(upstream.input) > 0 && outputLength < transport.outputHighWater {
                pumpResponseBody()
            }
            if isCurrent, self.upstream === upstream, !requestBody.isComplete,
               evbuffer_get_length(input) > 0, evbuffer_get_length(upstream.output) < Flow.highWater {
                pumpRequestBody()
            }
        }
        guard isCurrent, self.upstream === upstream else { return false }
        return evbuffer_get_length(input) + evbuffer_get_length(upstream.input) < before
    }

    // MARK: shaping

    /// The session's shaping timer fired: a bucket has refilled or an added latency has passed; move what waited,
    /// or end the exchange when a hard budget it counts against is spent (SPEC §11).
    func shapingTimerFired() {
        if allowance.budgetCut {
            exchange.outcome = exchange.outcome ?? .error
            exchange.reason = AbortReason.budgetExhausted.rawValue
            session.abort(.budgetExhausted, detail: "a hard data budget is spent")
            return
        }
        guard session.machine.isRelaying else { return }
        if let tunnel {
            tunnel.pump(fromClient: true)
            tunnel.pump(fromClient: false)
            return
        }
        guard let upstream else { return }
        if response == nil {
            OriginResponse.readHead(self, upstream)
            if originClosedWhileHeld, case .none = allowance.latency, self.upstream === upstream {
                originClosedWhileHeld = false
                lease.upstreamClosed(upstream)
            }
        } else if let splice = response?.splice, splice.relay != nil {
            splice.resume()
        } else {
            pumpResponseBody()
        }
        if isCurrent { pumpRequestBody() }
    }
}
