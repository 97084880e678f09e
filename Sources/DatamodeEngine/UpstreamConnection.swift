import CDatamodeShims
import CLibevent
import DatamodeHTTP
import DatamodePolicy
#if canImport(Glibc)
import Glibc
#endif

/// Where an upstream connection goes. Connections are pooled per key.
struct UpstreamKey: Hashable {
    /// The name the request gave (TLS verifies it and sends it as SNI), or an IP literal.
    let host: String
    let port: UInt16
    /// `https://` upstream: TLS over the TCP connection.
    let tls: Bool
    /// A transparent connection's original destination (SPEC §16): connected to instead of a lookup of `host`.
    /// Part of the key, so a connection made for one destination is never reused for another, nor for the
    /// same name elsewhere.
    let pinned: PinnedDestination?
    /// The parts hashed once, with the process's seeded hasher (so as hard to collide as the parts themselves):
    /// the pool looks a key up at every take and every put, and hashing the host's String each time cost ~350
    /// instructions a lookup (callgrind, plain exchange).
    private let digest: Int

    init(host: String, port: UInt16, tls: Bool = false, pinned: PinnedDestination? = nil) {
        self.host = host
        self.port = port
        self.tls = tls
        self.pinned = pinned
        var hasher = Hasher()
        hasher.combine(host)
        hasher.combine(port)
        hasher.combine(tls)
        hasher.combine(pinned)
        digest = hasher.finalize()
    }

    func hash(into hasher: inout Hasher) { hasher.combine(digest) }

    static func == (a: UpstreamKey, b: UpstreamKey) -> Bool {
        a.digest == b.digest && a.port == b.port && a.tls == b.tls && a.host == b.host && a.pinned == b.pinned
    }
}

/// An address and port the kernel said a connection was going to (SPEC §16).
struct PinnedDestination: Hashable {
    /// An IP literal (IPv6 without brackets).
    var address: String
    var port: UInt16
}

/// One TCP connection to an origin (or a CONNECT target): resolved asynchronously with evdns, connected with
/// a timeout, then either attached to one client exchange or idle in the worker's pool.
final class UpstreamConnection {
    /// Lifecycle (STYLE: named states).
    enum State {
        /// Waiting for evdns to answer.
        case resolving
        /// TCP connect in progress.
        case connecting
        /// Connected and attached to a client exchange (or a tunnel).
        case busy
        /// Connected, unattached, waiting in the pool for the next request to the same host:port.
        case idle
        /// Writing what is buffered, then closing (the client of a tunnel went away).
        case flushing
        /// Freed.
        case closed
    }

    /// Not reference-counted: the worker outlives everything its loop owns (it is let go only after its thread was
    /// joined), and a checked `unowned` load cost a retain and a release on each of ~11 uses a plain exchange.
    unowned(unsafe) let worker: Worker
    let key: UpstreamKey
    private(set) var state: State = .resolving
    private(set) var bev: OpaquePointer
    private(set) var input: OpaquePointer
    private(set) var output: OpaquePointer
    private var timer: LazyTimer?
    /// The exchange's lease on this connection: it receives the connection's events (nil while idle in the
    /// pool, or flushing after its tunnel's client went away). Not reference-counted: a weak reference to a
    /// per-request object cost a side table, slow loads and a slow deinit on every request (~2,000 instructions,
    /// bench/instructions.py). Every way the lease ends clears it (`detach`, `close`), and a lease that goes away
    /// still holding the connection detaches it in its `deinit`.
    private(set) unowned(unsafe) var owner: UpstreamLease?
    private var lookup: DNSLookup?
    private var addresses: [SocketAddress] = []
    private var nextAddress = 0
    /// Taken from the pool rather than freshly connected (so a failure may be a stale keep-alive).
    private(set) var isReused = false
    /// The TLS state of an `https://` upstream (owned by the bufferevent, freed with it).
    private var ssl: OpaquePointer?
    private var writer = SpeculativeWriter()
    /// An HTTP/1.1 TLS origin's records, written speculatively once the handshake is over.
    private var records: TLSRecordWriter?
    /// Offer `h2` to a TLS origin (SPEC §17): when it chooses it, the connection becomes an `HTTP2OriginSession`
    /// and this exchange its first stream (`adoptHTTP2`).
    private let offersH2: Bool
    /// Over an HTTP/2 origin connection: `bev` is one end of a bufferevent pair, this stream holds the other.
    private(set) var originStream: HTTP2OriginStream?
    /// Response heads the origin stream handed over in memory (`HeadHandoff`) in place of their HTTP/1.1 text, in
    /// order, each with that text's length (charged as the text was). Only heads come this way and they come before
    /// any body byte, so they are read before `input`.
    private var handedHeads: [(head: ResponseHead, length: Int)] = []
    /// The origin never processed the request (a refused stream, one its GOAWAY left out, or the shared connection
    /// lost before any of the answer came, as a stale keep-alive connection): it may go again, once, on a new
    /// connection. A stream's other failures (a reset, a malformed answer) are not retried.
    private(set) var requestNotProcessed = false
    /// The client connection of the exchange this connection serves now (for flushing after an upstream callback).
    var attachedClient: HTTP1Session? { owner?.driver.session }
    /// EV_READ is off while the input sits at its high watermark (`holdReadingIfFull`).
    private var readHold = ReadHold(drained: upstreamInputDrainedCallback)
    /// `suspendIO` turned reading off (a body splice, or its drain): only `resumeIO` turns it back on.
    private var ioSuspended = false
    /// Plain TCP, once connected: reads the socket in place of the bufferevent (whose EV_READ stays off).
    private var reader = SocketReader()
    /// TLS, once the handshake is done: reads the socket under the filter (goes with the wire to an h2 session).
    private var feed: TLSSocketFeed?
    /// The read watermark is `Flow.streamHighWater` (`responseBodyStarts`) until the connection is let go.
    private var readsInStreamSteps = false

    init(worker: Worker, key: UpstreamKey, offersH2: Bool = false) {
        self.worker = worker
        self.key = key
        self.offersH2 = offersH2 && key.tls
        let (bev, ssl) = UpstreamWires.socket(worker, key: key, offersH2: self.offersH2)
        self.bev = bev
        self.ssl = ssl
        input = bufferevent_get_input(bev)
        output = bufferevent_get_output(bev)
        bufferevent_setcb(bev, upstreamReadCallback, upstreamWriteCallback, upstreamEventCallback, context(self))
        timer = LazyTimer(base: worker.base, callback: upstreamTimerCallback, owner: context(self))
        worker.upstreamOpened(self)
    }

    /// A stream of an HTTP/2 connection the origin already has (SPEC §17: requests to it share one connection):
    /// connected from the start, the request written into the pair.
    init(worker: Worker, key: UpstreamKey, session: HTTP2OriginSession) {
        self.worker = worker
        self.key = key
        offersH2 = false
        let (end, partner) = UpstreamWires.pair(worker)
        bev = end
        input = bufferevent_get_input(end)
        output = bufferevent_get_output(end)
        bufferevent_setcb(end, upstreamReadCallback, upstreamWriteCallback, upstreamEventCallback, context(self))
        timer = LazyTimer(base: worker.base, callback: upstreamTimerCallback, owner: context(self))
        state = .busy
        worker.upstreamOpened(self)
        originStream = session.attachStream(end: partner, upstream: self)
        bufferevent_enable(end, Int16(EV_READ | EV_WRITE))
    }

    /// Connected (TCP, TLS, or a stream): the request queued so far goes out, the owner hears it.
    private func connected() {
        state = .busy
        timer?.disarm()
        carryOut(responseTimer.connected(pending: evbuffer_get_length(output)))
        // Plain TCP: writes are speculative (EV_WRITE off), `SocketReader` reads; TLS and pairs keep libevent's paths.
        if isPlainTCP {
            writer.takeOverOutputCallback(bev)
            reader.start(base: worker.base, bev: bev, fd: socket, callback: upstreamSocketReadableCallback, owner: context(self))
            reader.setReading(true, bev: bev)
        } else {
            bufferevent_enable(bev, Int16(EV_READ | EV_WRITE))
            if ssl != nil { records = TLSRecordWriter(filter: bev) }
        }
        guard let owner else { return }
        if responseTimer.timeoutMs < 0 { owner.tunnelConnected(self) } else { owner.upstreamConnected(self) }
        // The origin takes request bytes from now on: a stream of an HTTP/2 client whose bytes all moved on may be
        // waiting for nothing but this (`HTTP2Stream.starvesForRequestBody`).
        requestBodyMoved()
    }

    /// The origin chose `h2` in the handshake: the TLS wire goes to a new `HTTP2OriginSession` (shared from now on by
    /// the exchanges to this origin) and this connection becomes its first stream, the request written so far moved
    /// into the pair. False when no session could be made (the connection then fails).
    private func adoptHTTP2() -> HTTP2OriginSession? {
        // The request is taken out of the wire's output first: the session turns the wire's writing on, and a TLS
        // filter then encrypts what its output holds at once (HTTP/1.1 text, to an origin expecting h2's preface).
        let pending = UpstreamWires.takeQueued(output)
        guard let session = HTTP2OriginSession(worker: worker, key: key, wire: bev, feed: feed) else {
            evbuffer_free(pending)
            return nil
        }
        feed = nil
        becomeStream(of: session, pending: pending)
        return session
    }

    /// `bev` is replaced by one end of a pair whose other end is a stream of `session`, the bytes queued so far
    /// (`pending`, else what `output` holds) moved along; the caller disposes of the old `bev`.
    private func becomeStream(of session: HTTP2OriginSession, pending: OpaquePointer? = nil) {
        let pending = pending ?? UpstreamWires.takeQueued(output)
        let (end, partner) = UpstreamWires.pair(worker)
        ssl = nil
        bev = end
        input = bufferevent_get_input(end)
        output = bufferevent_get_output(end)
        bufferevent_setcb(end, upstreamReadCallback, upstreamWriteCallback, upstreamEventCallback, context(self))
        originStream = session.attachStream(end: partner, upstream: self)
        evbuffer_add_buffer(output, pending)
        evbuffer_free(pending)
    }

    /// The stream over the HTTP/2 connection broke (`HTTP2OriginStream`): what it wrote is in `input` already; the
    /// exchange reads it and then hears the break, as from a TCP connection that failed.
    func originStreamFailed(_ detail: String, unprocessed: Bool) {
        guard state == .busy else { return }
        if unprocessed { requestNotProcessed = true }
        if let owner, owner.upstreamBrokeOff(self) {
            // The response had begun: it ends truncated.
        } else {
            let owner = self.owner
            close()
            owner?.upstreamFailed(self, code: .upstreamProtocolError, detail: "\(key.host):\(key.port): " + detail)
        }
    }

    /// Resolves and connects a new connection (a pooled one is connected already). Nothing fails inside this
    /// call: a failure found synchronously (a literal address refused at once, a name answered from
    /// /etc/hosts) is reported from the next loop iteration, like every other one, so the client never sees
    /// its upstream fail while it is still setting it up.
    func start(waitingForSibling: Bool = true) {
        guard state == .resolving, !starting, lookup == nil, addresses.isEmpty, !awaitingSibling else { return }
        // Another connection to this origin is in its handshake offering h2: its answer may make a new connection
        // needless (SPEC §17: requests to an h2 origin share one connection), so wait for it, as browsers do.
        if offersH2 && waitingForSibling && worker.originSessions.awaitHandshake(self) {
            awaitingSibling = true
            armTimer(worker.settings.upstreamConnectMs)
            return
        }
        starting = true
        resolve()
        starting = false
    }

    /// Waiting for a sibling's handshake (`start`).
    private var awaitingSibling = false

    /// The sibling's handshake ended: join its HTTP/2 session, or connect on our own.
    func siblingHandshakeFinished(_ session: HTTP2OriginSession?) {
        guard awaitingSibling, state == .resolving else { return }
        awaitingSibling = false
        guard let session, session.acceptsStreams else {
            start(waitingForSibling: false)
            return
        }
        // The placeholder bufferevent was never connected: the pair takes its place.
        let old = bev
        becomeStream(of: session)
        bufferevent_free(old)
        connected()
    }

    private var starting = false
    /// A failure found inside `start`, reported from the timer callback.
    private var deferredFailure: (code: ProxyErrorCode, detail: String)?

    /// A bufferevent cannot connect twice: after a failed connect, move the pending output (the request head)
    /// to a fresh one and try the next resolved address.
    private func reconnectToNextAddress() {
        let pending = UpstreamWires.takeQueued(output)
        reader.stop()
        bufferevent_free(bev)
        (bev, ssl) = UpstreamWires.socket(worker, key: key, offersH2: offersH2)
        input = bufferevent_get_input(bev)
        output = bufferevent_get_output(bev)
        bufferevent_setcb(bev, upstreamReadCallback, upstreamWriteCallback, upstreamEventCallback, context(self))
        writer = SpeculativeWriter()
        evbuffer_add_buffer(output, pending)
        evbuffer_free(pending)
        connectNext()
    }

    /// Not TLS, not a stream: the socket carries the payload itself (splice needs that).
    var isPlainTCP: Bool { ssl == nil && originStream == nil }
    var socket: Int32 { reader.isActive ? reader.fd : bufferevent_getfd(bev) }

    /// The splice relay took over this socket: libevent must not read or write it any more.
    func suspendIO() {
        ioSuspended = true
        bufferevent_disable(bev, Int16(EV_WRITE))
        reader.setReading(false, bev: bev)
    }

    /// A body splice gave the socket back: reads resume (a pooled connection must notice the origin closing).
    func resumeIO() {
        guard state != .closed else { return }
        ioSuspended = false
        if readHold.stillFull(input) { return }  // `inputDrained` resumes it
        readHold.release(input: input, owner: context(self))
        reader.setReading(true, bev: bev)
    }

    /// After a read callback: an input left at its high watermark (the client is slower than the origin, or a link
    /// bucket holds the bytes back, SPEC §10) holds reading (`ReadHold`): a body waiting on a 1 Gbit/s bucket cost
    /// ~29,000 read callbacks a second for ~1,100 reads, and one waiting on a 20 MB/s client a whole core.
    func holdReadingIfFull() {
        guard state == .busy else { return }
        if readHold.holdIfFull(input: input, owner: context(self)) { reader.setReading(false, bev: bev) }
    }

    /// Bytes left the held input (`upstreamInputDrainedCallback`): below the watermark, reading goes on (unless a
    /// splice suspended it meanwhile).
    func inputDrained() {
        guard readHold.releaseIfDrained(input: input, owner: context(self)) else { return }
        if !ioSuspended && state != .closed { reader.setReading(true, bev: bev) }
    }

    /// The plain socket is readable (`upstreamSocketReadableCallback`): one read, reported through the bufferevent
    /// callbacks as libevent's read path would (bytes: the read callback; EOF or an error: the event callback).
    func socketReadable() {
        switch reader.readReady(into: input, scratch: worker.readScratch) {
        case .read: upstreamReadCallback(bev, context(self))
        case .nothing: holdReadingIfFull()
        case .end: upstreamEventCallback(bev, Int16(BEV_EVENT_EOF | BEV_EVENT_READING), context(self))
        case .failed: upstreamEventCallback(bev, Int16(BEV_EVENT_ERROR | BEV_EVENT_READING), context(self))
        }
    }

    var isConnected: Bool { state == .busy || state == .idle }
    /// Request bytes may be queued: connected, or still resolving/connecting (they are written once connected,
    /// and moved along if another address is tried).
    var acceptsRequestBytes: Bool { state == .busy || state == .resolving || state == .connecting }

    /// Leases the connection to an exchange (before `start`): its events go to `owner` from now on.
    func attach(_ owner: UpstreamLease) {
        self.owner = owner
        if state == .idle { state = .busy }
    }

    func detach() {
        owner = nil
        if readsInStreamSteps && !reader.isActive { bufferevent_setwatermark(bev, Int16(EV_READ), 0, Flow.highWater) }
        readsInStreamSteps = false
    }

    /// The final head was read: an HTTP/2 stream's exchange reads the body `Flow.streamHighWater` at a time, as its
    /// output keeps as little (a head needs room for all of it). Plain TCP reads keep `Flow.highWater`.
    func responseBodyStarts(forStream: Bool) {
        readsInStreamSteps = forStream
        if forStream && !reader.isActive { bufferevent_setwatermark(bev, Int16(EV_READ), 0, Flow.streamHighWater) }
    }

    /// Queues the request head (sent as soon as the connection is up) and starts the response timer in its
    /// first role, the send watchdog (see `OriginResponseTimer`). A negative timeout: a tunnel, no timer.
    func send(_ head: [UInt8], responseTimeoutMs: Int64) {
        guard state != .closed else { return }
        if !head.isEmpty { evbuffer_add(output, head, head.count) }
        requestStarted(responseTimeoutMs: responseTimeoutMs)
    }

    /// `send` for a stream of an origin's HTTP/2 connection, in memory: the head goes to the stream as it is
    /// (`HTTP2OriginStream.take`) when nothing written before it waits in the pair. False: not taken (not a
    /// stream, or something is in the pair), and the caller sends the text.
    func handRequestHead(_ head: RequestHead, responseTimeoutMs: Int64) -> Bool {
        guard state != .closed, let originStream,
              originStream.take(head, pairEmpty: evbuffer_get_length(output) == 0) else { return false }
        requestStarted(responseTimeoutMs: responseTimeoutMs)
        return true
    }

    private func requestStarted(responseTimeoutMs: Int64) {
        responseTimer = OriginResponseTimer(timeoutMs: responseTimeoutMs)
        carryOut(responseTimer.requestStarted(connected: state == .busy, pending: evbuffer_get_length(output)))
    }

    private var responseTimer = OriginResponseTimer(timeoutMs: -1)

    /// Request bytes left for the origin, or may now (an h2 origin opened a window): an HTTP/2 client's connection
    /// looks at its bound on held request bytes again (`HTTP2Session.settleConnectionWindow`).
    func requestBodyMoved() {
        attachedClient?.transport.http2Stream?.requestBodyMovedDownstream()
    }

    /// The client moved `n` more request bytes into `output`.
    func requestBytesAdded(_ n: Int) {
        responseTimer.queued(n)
    }

    /// The whole request (head and body) is in `output`.
    func requestComplete() {
        // Not connected yet: nothing has been written, whatever the output holds.
        let pending = state == .busy ? evbuffer_get_length(output) : max(1, evbuffer_get_length(output))
        carryOut(responseTimer.requestComplete(pending: pending))
    }

    /// Called after writes: once the whole request has left `output`, the head timeout starts counting.
    private func startHeadTimerIfSent() {
        guard responseTimer.phase == .sent, state == .busy else { return }
        carryOut(responseTimer.written(pending: evbuffer_get_length(output)))
    }

    private func carryOut(_ action: OriginResponseTimer.Action) {
        switch action {
        case .none: break
        case .arm(let milliseconds): armTimer(milliseconds)
        case .timeOut(let detail): fail(.upstreamTimeout, "\(key.host):\(key.port) " + detail)
        }
    }

    /// After a full 4 KiB libevent read, take what else is waiting in one readv (see `BulkRead`).
    @inline(__always)
    func readMoreIfPending() {
        if evbuffer_get_length(input) >= BulkRead.libeventReadCap { readOn() }
    }

    /// The last read was full: take what else is waiting, up to the high watermark. Returns how many bytes came.
    @discardableResult
    func readOn() -> Int {
        let buffered = evbuffer_get_length(input)
        guard isPlainTCP, buffered < Flow.highWater else { return 0 }
        return BulkRead.readAvailable(fd: bufferevent_getfd(bev), into: input, budget: Flow.highWater - buffered)
    }

    /// Drops everything queued for the origin and not yet written.
    func discardPendingOutput() {
        guard state != .closed else { return }
        evbuffer_drain(output, evbuffer_get_length(output))
    }

    /// A final head or a `101` arrived: the response timer stops (`ResponseHeadTake`).
    func responseHeadReceived() {
        responseTimer.headReceived()
        timer?.disarm()
    }

    /// Whether any of the response waits to be read: a handed head or bytes in `input`.
    var hasResponseBytes: Bool { hasHandedHeads || evbuffer_get_length(input) > 0 }
    var hasHandedHeads: Bool { !handedHeads.isEmpty }

    /// The origin stream hands a response head over in memory (`HTTP2OriginStream.passHead`): it is read as if its
    /// text had arrived, from the loop (the read callback deferred, as the pair's own is).
    func handResponseHead(_ head: ResponseHead, length: Int) {
        guard state == .busy else { return }
        handedHeads.append((head, length))
        bufferevent_trigger(bev, Int16(EV_READ), Int32(BEV_TRIG_IGNORE_WATERMARKS.rawValue | BEV_TRIG_DEFER_CALLBACKS.rawValue))
    }

    /// The next head an origin's HTTP/2 stream handed over (`handResponseHead`), if any; read by `ResponseHeadTake`.
    func takeHandedHead() -> (head: ResponseHead, length: Int)? {
        handedHeads.isEmpty ? nil : handedHeads.removeFirst()
    }

    // MARK: resolve and connect

    private func resolve() {
        armTimer(worker.settings.upstreamConnectMs)
        if key.tls && ssl == nil {
            // The trust store could not be loaded (logged at start-up) or SSL_new failed.
            fail(.upstreamUnreachable, "TLS is unavailable for \(key.host): \(worker.tlsUnavailableReason ?? "SSL_new failed")")
            return
        }
        if let pinned = key.pinned {
            guard let literal = SocketAddress(ipLiteral: pinned.address, port: pinned.port) else {
                fail(.upstreamUnreachable, "\(pinned.address) is not an address")
                return
            }
            addresses = [literal]
            connectNext()
            return
        }
        if let literal = SocketAddress(ipLiteral: key.host, port: key.port) {
            addresses = [literal]
            connectNext()
            return
        }
        let lookup = DNSLookup(upstream: self)
        self.lookup = lookup
        lookup.start(dns: worker.dns, host: key.host, port: key.port)
    }

    func resolved(_ result: Result<[SocketAddress], DNSLookup.Failure>) {
        lookup = nil
        guard state == .resolving else { return }
        switch result {
        case .success(let found):
            addresses = found
            connectNext()
        case .failure(let failure):
            fail(.dnsFailure, "cannot resolve \(key.host): \(failure.message)")
        }
    }

    private func connectNext() {
        guard nextAddress < addresses.count else {
            fail(.upstreamUnreachable, "no address of \(key.host) could be connected")
            return
        }
        let address = addresses[nextAddress]
        nextAddress += 1
        // Checked on the resolved address, so no spelling of it (0.0.0.0, [::ffff:127.0.0.1], a name that
        // resolves to loopback) can make the proxy talk to itself: a loop, or an SSRF to the admin API.
        if worker.isOwnAddress(address) {
            fail(.loopDetected, "\(key.host):\(key.port) is this proxy's own listener")
            return
        }
        state = .connecting
        let result = address.withSockaddr { pointer, length in
            bufferevent_socket_connect(UpstreamWires.connectable(bev), UnsafeMutablePointer(mutating: pointer), Int32(length))
        }
        if result != 0 {
            // Immediate failure (e.g. no route for this address family): try the next address.
            if nextAddress < addresses.count {
                reconnectToNextAddress()
            } else {
                fail(.upstreamUnreachable, "cannot connect to \(key.host):\(key.port)")
            }
        }
    }

    // MARK: libevent events

    func upstreamEvent(_ what: Int16) {
        if what & Int16(BEV_EVENT_CONNECTED) != 0 {
            let fd = bufferevent_getfd(bev)
            if fd >= 0 { dm_set_nodelay(fd) }
            if ssl != nil { feed = TLSSocketFeed(worker: worker, filter: bev) }
            if offersH2, let ssl {
                var session: HTTP2OriginSession?
                if TLSClientContext.negotiatedH2(ssl) {
                    session = adoptHTTP2()
                    if session == nil {
                        fail(.upstreamProtocolError, "\(key.host):\(key.port) chose h2 and no HTTP/2 session could be made")
                        return
                    }
                }
                connected()
                worker.originSessions.handshakeFinished(self, session: session, choseHTTP1: session == nil)
                return
            }
            connected()
            return
        }
        switch state {
        case .connecting where key.tls && UpstreamWires.hasPeer(bev):
            // The TCP connection worked; the TLS handshake did not. Another address will not fix that (SPEC §9:
            // 502 upstream-tls-error, the reason in the detail).
            let (reason, detail) = TLSClientContext.failure(bev, ssl: ssl, eof: what & Int16(BEV_EVENT_EOF) != 0)
            worker.metrics.tlsHandshakeFailed(.origin, reason)
            fail(.upstreamTLSError, "\(key.host):\(key.port): " + detail)
        case .connecting:
            let code = errno  // libevent sets it before calling back
            if nextAddress < addresses.count {
                reconnectToNextAddress()
                return
            }
            fail(.upstreamUnreachable, "connect to \(key.host):\(key.port) failed: \(String(cString: strerror(code)))")
        case .idle:
            // The origin closed an idle pooled connection (or sent something unasked): drop it.
            worker.pool.remove(self)
            close()
        case .busy:
            if what & Int16(BEV_EVENT_EOF) != 0 {
                owner?.upstreamClosed(self)
            } else if let owner, owner.upstreamBrokeOff(self) {
                // What the origin sent before the failure is still relayed; the response then ends truncated.
            } else {
                owner?.upstreamFailed(self, code: .upstreamUnreachable, detail: "connection to \(key.host):\(key.port) failed")
                close()
            }
        case .flushing:
            close()
        case .resolving, .closed:
            break
        }
    }

    func upstreamReadable() {
        switch state {
        case .busy:
            owner?.upstreamReadable(self)  // which reads on past the first 4 KiB when it should (`readMoreIfPending`)
        case .idle:
            // An idle connection must be silent; bytes here mean the origin is confused. Do not reuse it. A TLS
            // filter's read callback can come with nothing read: one deferred when it decrypted the last bytes of
            // the response, which the client's side then took before it ran (issue 31: under load, nearly every
            // HTTP/1.1 TLS origin connection was closed and a new handshake paid for the next request).
            guard hasResponseBytes else { return }
            worker.pool.remove(self)
            close()
        case .flushing: evbuffer_drain(input, evbuffer_get_length(input))
        default: break
        }
    }

    /// Writes what is queued for the origin, once connected (plain TCP; TLS writes through libevent).
    func flushPendingWrites() {
        if isPlainTCP, state == .busy || state == .idle || state == .flushing {
            writer.flush(bev, fd: socket, output: output)
            if state == .flushing && evbuffer_get_length(output) == 0 { close(); return }
        } else if records != nil, state == .busy || state == .idle || state == .flushing {
            records!.flush(plaintext: output)  // the records the filter made of it (`TLSRecordWriter`)
        }
        startHeadTimerIfSent()
    }

    func upstreamWritable() {
        defer { if state != .closed && isPlainTCP { writer.drained(bev, output: output) } }
        switch state {
        case .busy:
            owner?.upstreamWritable(self)
            startHeadTimerIfSent()
            requestBodyMoved()
        case .flushing: if evbuffer_get_length(output) == 0 { close() }
        default: break
        }
    }

    func upstreamTimerFired() {
        guard timer?.fired() == true else { return }
        if let failure = deferredFailure {
            deferredFailure = nil
            fail(failure.code, failure.detail)
            return
        }
        switch state {
        case .resolving, .connecting:
            fail(.upstreamTimeout, "connecting to \(key.host):\(key.port) took longer than timeouts.upstream-connect")
        case .busy:
            carryOut(responseTimer.fired(pending: evbuffer_get_length(output)))
        case .idle:
            worker.pool.remove(self)
            close()
        case .flushing:
            close()
        default:
            break
        }
    }

    private func fail(_ code: ProxyErrorCode, _ detail: String) {
        if starting {
            deferredFailure = (code, detail)
            timer?.arm(0)
            return
        }
        let owner = self.owner
        close()
        owner?.upstreamFailed(self, code: code, detail: detail)
    }

    // MARK: pool and closing

    /// Becomes idle in the pool: reads stay enabled so a close by the origin is noticed at once.
    func becomeIdle(timeoutMs: Int64) {
        state = .idle
        owner = nil
        isReused = true
        armTimer(timeoutMs)
    }

    func takenFromPool() {
        timer?.disarm()
        state = .busy
    }

    /// Tunnels: the client half-closed and everything it sent was written; tell the origin.
    func shutdownWrite() {
        guard isConnected else { return }
        shutdown(bufferevent_getfd(bev), Int32(SHUT_WR))
    }

    /// Tunnels: send what is buffered, then close.
    func closeAfterFlush() {
        guard state != .closed else { return }
        owner = nil
        if evbuffer_get_length(output) == 0 || !isConnected { close(); return }
        state = .flushing
        bufferevent_setwatermark(bev, Int16(EV_WRITE), 0, 0)
        armTimer(worker.settings.drainMs)
    }

    func close() {
        guard state != .closed else { return }
        if state == .idle { worker.pool.remove(self) }
        if awaitingSibling { worker.originSessions.stopWaiting(self) }
        awaitingSibling = false
        if offersH2 { worker.originSessions.handshakeFinished(self, session: nil, choseHTTP1: false) }
        state = .closed
        owner = nil
        lookup?.cancel()
        lookup = nil
        timer?.free()
        timer = nil
        if let originStream {
            self.originStream = nil
            originStream.upstreamReleased()
        }
        handedHeads = []
        reader.stop()
        feed?.stop()
        feed = nil
        records = nil
        bufferevent_free(bev)
        worker.upstreamClosed(self)
    }

    private func armTimer(_ milliseconds: Int64) {
        guard milliseconds > 0 else { return }
        timer?.arm(milliseconds)
    }
}

/// Idle keep-alive connections to origins, per host:port, for one worker (no sharing, no locks).
///
/// No host:port has a cap of its own: a burst's connections all go back, the most recently used is taken first,
/// and those the next bursts do not need end at the idle timeout, so the pool holds what the last half minute
/// needed (HAProxy keeps idle server connections the same way). A cap of 64 per origin closed the rest of every
/// burst of an HTTP/2 client's streams to an HTTP/1.1 origin, and the next burst paid a TLS handshake for each.
final class UpstreamPool {
    private var idle: [UpstreamKey: [UpstreamConnection]] = [:]
    private var count = 0
    /// Most idle connections kept in all.
    let maxTotal: Int
    let idleTimeoutMs: Int64

    init(maxTotal: Int = 1024, idleTimeoutMs: Int64 = 30_000) {
        self.maxTotal = maxTotal
        self.idleTimeoutMs = idleTimeoutMs
    }

    // Lists are mutated in place, through `values[index]`: copying one out and storing it back cost two array
    // allocations per exchange (the bench's malloc count, issue 12), and `idle[key]?.popLast()` went through the
    // dictionary's optional `_modify` (~1.1K instructions a take, callgrind). One hash of the key per take and per
    // put. An emptied list keeps its key and its storage for the next exchange to the same origin; empty lists are
    // dropped only when there are many.
    func take(_ key: UpstreamKey) -> UpstreamConnection? {
        guard let index = idle.index(forKey: key), let connection = idle.values[index].popLast() else { return nil }
        count -= 1
        connection.takenFromPool()
        return connection
    }

    func put(_ connection: UpstreamConnection) {
        // A stream of an HTTP/2 connection is over with its exchange (the connection itself is shared).
        guard connection.originStream == nil, count < maxTotal else {
            connection.close()
            return
        }
        connection.becomeIdle(timeoutMs: idleTimeoutMs)
        if let index = idle.index(forKey: connection.key) {
            idle.values[index].append(connection)
        } else {
            if idle.count >= maxTotal { dropEmptyLists() }
            idle[connection.key] = [connection]
        }
        count += 1
    }

    func remove(_ connection: UpstreamConnection) {
        guard let index = idle.index(forKey: connection.key),
              let position = idle.values[index].firstIndex(where: { $0 === connection }) else { return }
        idle.values[index].remove(at: position)
        count -= 1
    }

    /// Keys whose lists are empty, forgotten: at most `maxTotal` keys are ever kept.
    private func dropEmptyLists() {
        idle = idle.filter { !$0.value.isEmpty }
    }

    func closeAll() {
        let all = idle.values.flatMap { $0 }
        idle = [:]
        count = 0
        for connection in all { connection.close() }
    }

}

/// One asynchronous evdns lookup. Retained while libevent holds it; its callback fires exactly once, also
/// when cancelled, and then releases it.
final class DNSLookup {
    struct Failure: Error {
        var message: String
    }

    private weak var upstream: UpstreamConnection?
    private var request: OpaquePointer?
    private var finished = false

    init(upstream: UpstreamConnection) {
        self.upstream = upstream
    }

    var upstreamConnection: UpstreamConnection? { upstream }

    func start(dns: OpaquePointer, host: String, port: UInt16) {
        var hints = addrinfo()
        hints.ai_family = AF_UNSPEC
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        hints.ai_protocol = Int32(IPPROTO_TCP)
        hints.ai_flags = EVUTIL_AI_ADDRCONFIG
        let retained = Unmanaged.passRetained(self).toOpaque()
        // localhost and /etc/hosts names are answered synchronously inside this call (request == nil).
        let request = evdns_getaddrinfo(dns, host, String(port), &hints, dnsResultCallback, retained)
        if !finished { self.request = request }
    }

    func cancel() {
        upstream = nil
        if let request, !finished {
            self.request = nil
            evdns_getaddrinfo_cancel(request)
        }
    }

    func completed(result: Int32, addresses: UnsafeMutablePointer<addrinfo>?) {
        finished = true
        request = nil
        defer { if let addresses { evutil_freeaddrinfo(addresses) } }
        guard let upstream else { return }
        guard result == 0, addresses != nil else {
            let message = result == EVUTIL_EAI_CANCEL ? "cancelled" : String(cString: evutil_gai_strerror(result))
            upstream.resolved(.failure(Failure(message: message)))
            return
        }
        var found: [SocketAddress] = []
        var cursor = addresses
        while let info = cursor {
            if let address = info.pointee.ai_addr, let socketAddress = SocketAddress(address, length: socklen_t(info.pointee.ai_addrlen)) {
                found.append(socketAddress)
            }
            cursor = info.pointee.ai_next
        }
        upstream.resolved(found.isEmpty ? .failure(Failure(message: "no addresses")) : .success(found))
    }
}
