import CLibevent
import DatamodeHTTP
import DatamodePolicy

/// An exchange's hold on its upstream connection (its lease), from choosing the connection to giving it back: a
/// stream of the origin's HTTP/2 connection, an idle keep-alive connection from the pool or a new one; the forwarded
/// head queued on it and kept, so that a stale reused connection can be retried on a new one; the connection's
/// events, checked to be for the exchange's current lease and carried to its driver; at the end, the connection
/// parked in the pool at a clean message boundary, or closed.
///
/// Its `ExchangeDriver` owns it (one per driver, made when first needed) and decides everything about the exchange;
/// the connection reports to the lease (`UpstreamConnection.owner`), and the lease to the driver.
final class UpstreamLease {
    /// The driver whose exchange holds the lease. Not counted: the driver owns the lease. Each event handler holds
    /// the driver in a local for its whole run (an answer it gives may end the exchange, and the session let go of
    /// the driver).
    unowned(unsafe) let driver: ExchangeDriver
    /// The connection held: it reports its events here, and goes back to the pool or is closed when the exchange ends.
    private(set) var upstream: UpstreamConnection?
    /// The connection came from the pool (a failure on it may be a stale keep-alive, retried on a new connection).
    private(set) var isReused = false
    /// The forwarded head, kept until a response arrives so a stale pooled connection can be retried: its text, or
    /// the head an origin stream took in memory (written as text for a retry).
    private(set) var forwardedHead = ForwardedHead.text([])

    init(driver: ExchangeDriver) {
        self.driver = driver
    }

    deinit {
        // The connection's back-reference is not counted: it must not outlive the lease (see `UpstreamConnection.owner`).
        if let upstream, upstream.owner === self { upstream.detach() }
    }

    // MARK: taking and giving back

    /// Forwards the request to `key` (on a connection reused when it may be, see `choose`), its head made by
    /// `makeHead` in the form that connection takes: in memory for a stream of the origin's HTTP/2 connection.
    func forward(to key: UpstreamKey, head makeHead: (_ forOriginStream: Bool) -> ForwardedHead) {
        let upstream = take(key: key, reuse: true)
        forwardedHead = makeHead(upstream.originStream != nil)
        start(upstream)
    }

    /// Takes a connection to `key` (reused when `reuse` allows, see `choose`), queues the forwarded head on it and
    /// starts it; then the request's body follows, or its end is marked.
    func connect(key: UpstreamKey, reuse: Bool) {
        start(take(key: key, reuse: reuse))
    }

    private func take(key: UpstreamKey, reuse: Bool) -> UpstreamConnection {
        let upstream = choose(key: key, reuse: reuse, upgrade: driver.upgradeRequested)
        self.upstream = upstream
        isReused = upstream.isReused
        upstream.attach(self)
        return upstream
    }

    private func start(_ upstream: UpstreamConnection) {
        let driver = self.driver
        let length = queueHead(on: upstream)
        driver.allowance.charge(.up, length, session: driver.session)
        upstream.start()
        guard isForwarding(upstream) else { return }
        if upstream.isConnected { driver.perform(driver.machine.upstreamConnected()) }
        if driver.requestBody.isComplete { upstream.requestComplete() } else { driver.pumpRequestBody() }
    }

    /// Queues the forwarded head on `upstream`: handed to its origin stream in memory when the stream's parser would
    /// read exactly that head back from the text (`HTTP2OriginStream.handedLength`, `HeadHandoff`) and the
    /// stream takes it (nothing of the request waits in the pair before it); else as the text, which the stream
    /// parses as before (and refuses what the parser refuses). Returns the text's length: what the link is charged.
    private func queueHead(on upstream: UpstreamConnection) -> Int {
        let timeoutMs = driver.worker.settings.upstreamResponseMs
        if case .head(let head) = forwardedHead {
            if upstream.originStream != nil, let length = HTTP2OriginStream.handedLength(of: head),
               upstream.handRequestHead(head, responseTimeoutMs: timeoutMs) {
                return length
            }
            forwardedHead = .text(head.serialized())
        }
        guard case .text(let text) = forwardedHead else { preconditionFailure("the forwarded head is text by now") }
        upstream.send(text, responseTimeoutMs: timeoutMs)
        return text.count
    }

    /// The upstream for an exchange to `key`: when `reuse` allows, a stream of the origin's HTTP/2 connection (SPEC
    /// §17; never for an Upgrade, HTTP/2 has none) or an idle keep-alive connection from the pool; else a new
    /// connection, offering h2 to a TLS origin when `http2.upstream` says so.
    private func choose(key: UpstreamKey, reuse: Bool, upgrade: Bool) -> UpstreamConnection {
        let worker = driver.worker
        if reuse && key.tls && !upgrade, let session = worker.originSessions.session(for: key) {
            return UpstreamConnection(worker: worker, key: key, session: session)
        }
        if reuse, let pooled = worker.pool.take(key) { return pooled }
        return UpstreamConnection(worker: worker, key: key, offersH2: !upgrade && worker.settings.http2.upstream)
    }

    /// A CONNECT (or a blind relay of an intercepted one): a new plain TCP connection to `key`, with no request and
    /// no response timer; its bytes are the tunnel's.
    func connectTunnel(key: UpstreamKey) {
        let upstream = UpstreamConnection(worker: driver.worker, key: key)
        self.upstream = upstream
        upstream.attach(self)
        upstream.send([], responseTimeoutMs: -1)
        upstream.start()
    }

    /// Gives the connection back: to the pool at a clean message boundary, else closed.
    func release(recycle: Bool) {
        guard let upstream else { return }
        upstream.detach()
        self.upstream = nil
        if recycle && !upstream.hasResponseBytes {
            driver.worker.pool.put(upstream)
        } else {
            upstream.close()
        }
    }

    /// Closes the connection, whatever it was doing, and lets it go.
    func close() {
        upstream?.close()
        upstream = nil
    }

    // MARK: upstream events (called by UpstreamConnection)

    /// Whether `upstream` is this exchange's lease and the exchange is still being forwarded (an upstream's
    /// callback may arrive for an exchange that has just ended, or for a connection it no longer holds).
    func isForwarding(_ upstream: UpstreamConnection) -> Bool {
        let driver = self.driver
        return driver.session.machine.phase == .forwarding && driver.session.machine.exchange === driver
            && self.upstream === upstream
    }

    /// The same for a CONNECT or Upgrade tunnel.
    func isTunnelling(_ upstream: UpstreamConnection) -> Bool {
        let driver = self.driver
        return driver.session.machine.phase == .tunnel && driver.session.machine.exchange === driver
            && self.upstream === upstream
    }

    /// A CONNECT's upstream is up (`Tunnel.connected`).
    func tunnelConnected(_ upstream: UpstreamConnection) {
        let driver = self.driver
        guard isTunnelling(upstream) else { return }
        driver.tunnel?.connected()
    }

    func upstreamConnected(_ upstream: UpstreamConnection) {
        let driver = self.driver
        guard isForwarding(upstream) else { return }
        driver.perform(driver.machine.upstreamConnected())
    }

    func upstreamWritable(_ upstream: UpstreamConnection) {
        let driver = self.driver
        if isTunnelling(upstream) { driver.tunnel?.pump(fromClient: true); return }
        guard isForwarding(upstream) else { return }
        driver.pumpRequestBody()
    }

    /// The origin's socket was read (at most 4 KiB, `SocketReader`). A body or a tunnel reads on at once what else is
    /// waiting (`UpstreamConnection.readMoreIfPending`). A response head is read first: a body that may be spliced
    /// then stays in the socket from its first byte on (`BodySplice`), instead of being copied into user space and
    /// out again; any other is read on after its head (and a head longer than the read, before it ends), in the
    /// same callback, whatever the head took of the input (the rest of a 5,000-byte response waited for the next
    /// readiness, and reached the client in a second write).
    func upstreamReadable(_ upstream: UpstreamConnection) {
        let driver = self.driver
        if isTunnelling(upstream) {
            upstream.readMoreIfPending()
            driver.tunnel?.pump(fromClient: false)
            return
        }
        guard isForwarding(upstream) else { return }
        guard driver.response == nil else {
            upstream.readMoreIfPending()
            driver.pumpResponseBody()
            return
        }
        let firstReadFull = evbuffer_get_length(upstream.input) >= BulkRead.libeventReadCap
        OriginResponse.readHead(driver, upstream)
        guard firstReadFull, isForwarding(upstream), BodySplice.remaining(driver) == nil,
              upstream.readOn() > 0 else { return }
        if driver.response == nil {
            OriginResponse.readHead(driver, upstream)
        } else {
            driver.pumpResponseBody()
        }
    }

    /// The upstream failed before or while answering: the request goes again on a new connection when the
    /// exchange machine says it may (a stale reused connection), else the failure is answered.
    func upstreamFailed(_ upstream: UpstreamConnection, code: ProxyErrorCode, detail: String) {
        let driver = self.driver
        if isTunnelling(upstream) {
            if driver.tunnel?.machine.phase == .connecting && !driver.connectAnswered {
                self.upstream = nil
                driver.respondError(code, detail: detail, close: true)
            } else {
                driver.session.abort(.upstreamAborted, detail: detail)
            }
            return
        }
        guard isForwarding(upstream) else { return }
        self.upstream = nil
        switch driver.machine.upstreamFailed(reusedConnection: isReused || upstream.requestNotProcessed,
                                             bodyBytesConsumed: driver.requestBody.transferred,
                                             timedOut: code == .upstreamTimeout) {
        case .retryOnNewConnection:
            connect(key: upstream.key, reuse: false)
        case .answer(let close):
            driver.respondError(code, detail: detail + notSentAgain(upstream), close: close)
        case .abort:
            driver.session.abort(.upstreamAborted, detail: detail)
        }
    }

    /// Why a request the origin did not process (`UpstreamConnection.requestNotProcessed`: RFC 9113 §8.7 says it may
    /// go again) is answered with the failure all the same, for the problem's detail: without it, the detail reads
    /// as if the origin had refused the request itself.
    private func notSentAgain(_ upstream: UpstreamConnection) -> String {
        guard upstream.requestNotProcessed else { return "" }
        if driver.requestBody.transferred > 0 {
            return "; not sent again: its body had begun to go out, and the proxy keeps no copy of it"
        }
        if driver.machine.retried { return "; not sent again: it was already sent again once" }
        return ""
    }

    /// The upstream's connection failed (reset, TLS error, a record cut short) while it was busy. If its response
    /// has begun, or bytes of it wait unread, they are relayed as after an EOF and the response then ends
    /// truncated (`ExchangeStateMachine.originBrokeOffAfterSending`); returns false when there is nothing to relay
    /// and the failure is answered as such (`upstreamFailed`).
    func upstreamBrokeOff(_ upstream: UpstreamConnection) -> Bool {
        let driver = self.driver
        guard isForwarding(upstream),
              driver.response != nil || upstream.hasResponseBytes else { return false }
        if driver.response != nil {
            driver.perform(driver.machine.originBrokeOffAfterSending())
            return true
        }
        // No head relayed yet (held for a link profile's latency, or not read): mark the break, then take the
        // EOF path, which reads the head when it may and relays the body behind it.
        _ = driver.machine.originBrokeOffAfterSending()
        upstreamClosed(upstream)
        return true
    }

    /// The upstream closed its side. Everything it sent before is in `upstream.input` and may be far more than
    /// the client's buffer takes now (a slow reader): the exchange machine keeps the response draining it, and
    /// ends it only when it is empty. Ending it here lost the tail of large responses (SPEC §6).
    func upstreamClosed(_ upstream: UpstreamConnection) {
        let driver = self.driver
        if isTunnelling(upstream) { driver.tunnel?.peerClosed(client: false); return }
        guard isForwarding(upstream) else { return }
        // A response held back for a link profile's latency is relayed when the hold ends, its EOF with it.
        if driver.response == nil, upstream.hasResponseBytes,
           !driver.allowance.latencyElapsed(arrived: true, session: driver.session) {
            driver.originClosedWhileHeld = true
            return
        }
        let action = driver.machine.originSentEOF()
        guard driver.response == nil else {
            driver.perform(action)
            return
        }
        // Bytes may have arrived with the EOF: read a head first (it starts the body relay, which sees the EOF).
        OriginResponse.readHead(driver, upstream)
        guard isForwarding(upstream), driver.response == nil else { return }
        // Closed first, as on every failure path: left open, it kept its socket and this lease as its owner.
        upstream.close()
        upstreamFailed(upstream, code: .upstreamProtocolError, detail: "the origin closed the connection without a response")
    }
}
