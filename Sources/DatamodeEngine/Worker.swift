import CDatamodeShims
import CLibevent
import DatamodeConfig
import DatamodeDeferral
import DatamodeHTTP
import DatamodePolicy
import DatamodeState
import Logging
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// One worker thread: its own event_base, evdns base, listener (SO_REUSEPORT), connections and upstream pool.
/// Nothing here is shared with other workers; the control plane reaches a worker only through its wake-up
/// pipe and through `RuntimeState` (an atomic generation check per request).
final class Worker {
    /// Commands sent through the wake-up pipe, one byte each.
    enum Command: UInt8 {
        /// Stop accepting, close idle connections, finish in-flight requests, then leave the loop.
        case drain = 0x64
        /// Leave the loop now (drain timeout passed).
        case quit = 0x71
        /// Transcoded images are waiting in `imageResults` (SPEC §13).
        case imagesDone = 0x69
        /// Copy the session counters into `sessionReport` (the control plane's read of them, SPEC §12).
        case reportSessions = 0x73
        /// The deferral store answered in `deferralResults` (SPEC §18.3).
        case deferralStored = 0x74
    }

    let index: Int
    let base: OpaquePointer
    /// Where `SocketReader` receives before appending to an input (one read at a time on this worker's thread).
    let readScratch = UnsafeMutableRawPointer.allocate(byteCount: SocketReader.readSize, alignment: 16)
    let dns: OpaquePointer
    let runtime: RuntimeState
    let clock: any EngineClock
    let metrics = WorkerMetrics()
    /// Written by this worker only; read through `sessionReport`.
    let sessionTallies = WorkerSessionTallies()
    /// This worker's latest refusals (SPEC §20 `GET /refusals`), written only when a request is refused.
    let refusals = RefusalRing()
    let sessionReport = WorkerMailbox<[String: SessionTally]>()
    let accessLog: AccessLog
    let logger: Logger
    let pool = UpstreamPool()
    /// Empty splice pipes kept for the next body or tunnel relay (`PipePool`).
    let pipes = PipePool()
    /// HTTP/2 connections to origins that chose h2, shared by this worker's exchanges (SPEC §17).
    let originSessions = HTTP2OriginPool()
    /// URLs' body lengths seen whole, for what variants and refusals saved (SPEC §13).
    var knownLengths = KnownLengths()
    /// Where a response head relayed from the origin's bytes is written before it is copied into the client's
    /// output (`OriginResponse.startFromBytes`): kept between heads, so relaying one allocates nothing.
    var relayedHeadWriter = HeadWriter(capacity: Worker.relayedHeadWriterCapacity)
    static let relayedHeadWriterCapacity = 2048
    /// The last key `upstreamKey` made: most requests of a worker go where the one before went.
    private var lastUpstreamKey: UpstreamKey?
    let shaper: LinkShaper
    /// Data budgets (SPEC §11), shared by every worker; each counts in its own slots.
    let budgets: BudgetLedger
    /// This worker's view of `shaper`: a shaped exchange finds its buckets here without the shared mutex.
    private var linkCache: [LinkShaper.Key: LinkBuckets] = [:]
    private(set) var settings: WorkerSettings
    /// Where refused uploads are stored (SPEC §18.3); nil when the proxy runs without one (tests of other parts).
    let deferredStore: DeferredStore?
    let deferralCounters: DeferralCounters
    /// Tells the admin plane's event stream about a stored upload (`deferred` events).
    let deferralEvents: (@Sendable (DeferredEntry, String) -> Void)?
    /// Requests held for their refusal to lift (SPEC §18.2).
    private(set) var held: HeldRequests!
    private var generation: UInt64
    private var listener: OpaquePointer?
    /// The transparent listener (SPEC §16), when configured.
    private var transparentListener: OpaquePointer?
    /// Listeners paused after descriptor exhaustion, resumed by the next tick.
    private var pausedListeners: [OpaquePointer] = []
    /// Every client connection, HTTP/1 or HTTP/2 (a stream's own session is its connection's, not listed here).
    private var clients: [ObjectIdentifier: any ClientSession] = [:]
    /// Idle keep-alive connections with nothing of their session left (not in `clients` meanwhile).
    private(set) var parked: ParkedConnections!
    private var upstreams: [ObjectIdentifier: UpstreamConnection] = [:]
    private var wakeEvent: OpaquePointer?
    private var tickEvent: OpaquePointer?
    private let wakePipe: (read: Int32, write: Int32)
    private(set) var isDraining = false
    /// Created on the first `https://` upstream; nil with `tlsUnavailableReason` when that failed.
    private(set) lazy var tlsContext: TLSClientContext? = {
        do {
            return try TLSClientContext(verify: upstreamVerify)
        } catch {
            tlsUnavailableReason = "\(error)"
            logger.error("TLS client context unavailable", metadata: ["error": "\(error)"])
            return nil
        }
    }()
    private(set) var tlsUnavailableReason: String?
    /// `tls.upstream-verify` at start-up (the client context is made once per worker).
    private let upstreamVerify: Bool
    /// The TLS server side of interception; nil without a CA (then nothing is intercepted).
    let tlsServer: TLSServerContext?
    /// host:port pairs this process listens on; a request targeting one of them is a loop (or an SSRF to the
    /// admin API) and is refused.
    private var ownAddresses: [(address: IPAddress, port: UInt16)]

    init(index: Int, runtime: RuntimeState, clock: any EngineClock, accessLog: AccessLog, shaper: LinkShaper = LinkShaper(),
         budgets: BudgetLedger = BudgetLedger(budgets: [], slots: 1, now: 0), logger: Logger,
         ownAddresses: [(address: IPAddress, port: UInt16)], authority: CertificateAuthority? = nil,
         heldCount: HeldCount = HeldCount(), deferral: DeferralWiring = DeferralWiring()) throws(EngineError) {
        deferredStore = deferral.store
        deferralCounters = deferral.counters
        deferralEvents = deferral.events
        tlsServer = try authority.map { authority throws(EngineError) in try TLSServerContext(authority: authority, clock: clock) }
        self.index = index
        self.shaper = shaper
        self.budgets = budgets
        self.runtime = runtime
        self.clock = clock
        self.accessLog = accessLog
        self.logger = logger
        self.ownAddresses = ownAddresses
        guard let base = Self.makeBase() else { throw EngineError("event_base_new failed") }
        self.base = base
        // No nameserver probing at start; /etc/resolv.conf and /etc/hosts as the system configures them.
        guard let dns = evdns_base_new(base, EVDNS_BASE_INITIALIZE_NAMESERVERS | EVDNS_BASE_DISABLE_WHEN_INACTIVE) else {
            event_base_free(base)
            throw EngineError("evdns_base_new failed (is /etc/resolv.conf readable?)")
        }
        self.dns = dns
        var fds: [Int32] = [0, 0]
        guard pipe(&fds) == 0 else {
            evdns_base_free(dns, 0)
            event_base_free(base)
            throw EngineError("pipe2 failed: \(String(cString: strerror(errno)))")
        }
        for fd in fds {
            _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
            _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
        }
        wakePipe = (fds[0], fds[1])
        let (generation, snapshot) = runtime.load()
        self.generation = generation
        self.settings = WorkerSettings(snapshot)
        self.upstreamVerify = snapshot.configuration.tls.upstreamVerify
        held = HeldRequests(worker: self, count: heldCount)
        parked = ParkedConnections(worker: self)
    }

    /// The worker's event base, with epoll's changelist: an event added and deleted again before the loop next waits
    /// (a write event turned on for a TLS record and off once it is written, reading held and released) costs no
    /// epoll_ctl, and one changed twice costs one. libevent's caveat (fds cloned with dup(), which the engine never
    /// makes) does not apply; an fd closed and reused within one iteration is retried as an ADD by libevent itself.
    /// And without a lock: only the worker's own thread touches its base (other threads write to its wake pipe,
    /// `send`; the base is made before the thread starts and freed after it ends), while libevent's threading, on for
    /// the control loop (`ProxyServerProcess`), took the base's mutex about 68 times a request (callgrind, h2 row).
    private static func makeBase() -> OpaquePointer? {
        guard let config = event_config_new() else { return nil }
        defer { event_config_free(config) }
        event_config_set_flag(config, Int32(EVENT_BASE_FLAG_EPOLL_USE_CHANGELIST.rawValue))
        event_config_set_flag(config, Int32(EVENT_BASE_FLAG_NOLOCK.rawValue))
        return event_base_new_with_config(config)
    }

    deinit {
        readScratch.deallocate()
        if let wakeEvent { event_free(wakeEvent) }
        if let tickEvent { event_free(tickEvent) }
        if let listener { evconnlistener_free(listener) }
        if let transparentListener { evconnlistener_free(transparentListener) }
        evdns_base_free(dns, 1)
        event_base_free(base)
        Glibc.close(wakePipe.read)
        Glibc.close(wakePipe.write)
    }

    /// Binds this worker's listener. `port` 0 lets the kernel choose; the chosen port is returned so the
    /// other workers bind the same one (SO_REUSEPORT spreads connections across them).
    func listen(on address: SocketAddress) throws(EngineError) -> UInt16 {
        let created = try bind(address, callback: listenerAcceptCallback)
        listener = created
        return SocketAddress.local(of: evconnlistener_get_fd(created))?.port ?? address.port
    }

    /// Binds this worker's transparent listener (SPEC §16), like `listen`.
    func listenTransparent(on address: SocketAddress) throws(EngineError) -> UInt16 {
        let created = try bind(address, callback: transparentAcceptCallback)
        transparentListener = created
        return SocketAddress.local(of: evconnlistener_get_fd(created))?.port ?? address.port
    }

    private func bind(_ address: SocketAddress, callback: evconnlistener_cb) throws(EngineError) -> OpaquePointer {
        let flags = UInt32(LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE | LEV_OPT_REUSEABLE_PORT | LEV_OPT_CLOSE_ON_EXEC)
        let created = address.withSockaddr { pointer, length in
            evconnlistener_new_bind(base, callback, context(self), flags, 1024, pointer, Int32(length))
        }
        guard let created else { throw ListenGuard.bindError(address, errno) }
        evconnlistener_set_error_cb(created, listenerErrorCallback)
        return created
    }

    /// Set when `run()` has returned (read by the thread that waits for the worker).
    let finished = Atomic<Bool>(false)

    /// The thread body: runs the loop until drained or told to quit.
    func run() {
        defer { finished.store(true, ordering: .releasing) }
        dm_block_process_signals()
        wakeEvent = dm_read_event_new(base, wakePipe.read, workerWakeCallback, context(self))
        event_add(wakeEvent, nil)
        tickEvent = event_new(base, -1, Int16(EV_PERSIST), workerTickCallback, context(self))
        dm_event_add_ms(tickEvent, 1000)
        event_base_dispatch(base)
        // Whatever is left after a quit: close it so every descriptor is released.
        for client in Array(clients.values) { client.close() }
        parked.closeAll()
        pool.closeAll()
        for upstream in Array(upstreams.values) { upstream.close() }
        originSessions.closeAll()
    }

    /// Thread-safe: asks the worker to do something at its next loop iteration.
    func send(_ command: Command) {
        var byte = command.rawValue
        _ = Glibc.write(wakePipe.write, &byte, 1)
    }

    func wakeUp(fd: Int32) {
        var byte: UInt8 = 0
        while Glibc.read(fd, &byte, 1) == 1 {
            switch Command(rawValue: byte) {
            case .drain: beginDrain()
            case .quit: event_base_loopbreak(base)
            case .imagesDone: deliverImageResults()
            case .reportSessions: sessionReport.put(sessionTallies.tallies)
            case .deferralStored: deliverDeferralResults()
            case nil: break
            }
        }
    }

    /// The deferral store's answers for this worker's uploads (written on the store thread, SPEC §18.3).
    private let deferralResults = Mutex<[DeferralResult]>([])

    /// Thread-safe (called on the store thread): hands a commit's result to this worker's loop.
    func deferralStored(_ result: DeferralResult) {
        let first = deferralResults.withLock { results in
            results.append(result)
            return results.count == 1
        }
        if first { send(.deferralStored) }
    }

    private func deliverDeferralResults() {
        let results = deferralResults.withLock { results in
            defer { results.removeAll() }
            return results
        }
        for result in results {
            guard let driver = result.token.driver, let intake = driver.intake, intake === result.token.intake else { continue }
            switch result.result {
            case .written(let count, let written): intake.written(count, written)
            case .stored(let stored): intake.stored(stored)
            }
        }
    }

    /// Results of the transcoding pool for this worker's connections (written by pool threads).
    private let imageResults = Mutex<[ImageResult]>([])

    /// Thread-safe (called on a pool thread): hands a result to this worker's loop.
    func imageTranscoded(_ result: ImageResult) {
        let first = imageResults.withLock { results in
            results.append(result)
            return results.count == 1
        }
        if first { send(.imagesDone) }
    }

    private func deliverImageResults() {
        let results = imageResults.withLock { results in
            defer { results.removeAll() }
            return results
        }
        for result in results {
            guard let driver = result.token.driver else { continue }
            driver.response?.capture?.imageTranscoded(driver, outcome: result.outcome)
        }
    }

    private func beginDrain() {
        guard !isDraining else { return }
        isDraining = true
        if let listener {
            evconnlistener_free(listener)
            self.listener = nil
        }
        if let transparentListener {
            evconnlistener_free(transparentListener)
            self.transparentListener = nil
        }
        pausedListeners = []
        pool.closeAll()
        held.releaseAll()
        for client in Array(clients.values) { client.drain() }
        parked.closeAll()
        exitIfDrained()
    }

    private func exitIfDrained() {
        if isDraining && clients.isEmpty && parked.count == 0 {
            for upstream in Array(upstreams.values) { upstream.close() }
            event_base_loopexit(base, nil)
        }
    }

    /// Once a second: resume accepting after descriptor exhaustion.
    func tick() {
        for paused in pausedListeners { evconnlistener_enable(paused) }
        pausedListeners = []
    }

    // MARK: snapshot

    /// Adopts a newer runtime snapshot, if any (a safe point: between requests).
    @inline(__always)
    func refreshSnapshot() {
        let current = runtime.generation
        guard current != generation else { return }
        let (loadedGeneration, snapshot) = runtime.load()
        generation = loadedGeneration
        settings = WorkerSettings(snapshot)
        sessionTallies.prune(keeping: snapshot.sessions)
    }

    /// Set once before the worker's thread starts.
    func ownAddressesUpdate(_ addresses: [(address: IPAddress, port: UInt16)]) {
        ownAddresses = addresses
    }

    /// The token buckets `profile` uses for traffic of `client` in the configured scope (SPEC §10).
    func linkBuckets(_ profile: LinkProfile, client: IPAddress?) -> LinkBuckets {
        let key = LinkShaper.Key(client: settings.shapingScope == .client ? (client?.bytes ?? []) : [], profile: profile)
        if let found = linkCache[key] { return found }
        if linkCache.count >= LinkShaper.pruneThreshold { linkCache.removeAll(keepingCapacity: true) }
        let found = shaper.buckets(key, now: clock.nowNanoseconds())
        linkCache[key] = found
        return found
    }

    func accessAllowed(_ address: IPAddress?) -> Bool {
        guard let address else { return false }
        return settings.allow.contains { $0.contains(address) }
    }

    /// Whether connecting to `address` would reach this process: one of its listeners (proxy or admin) by its
    /// own address, by loopback, or by the unspecified address.
    func isOwnAddress(_ address: SocketAddress) -> Bool {
        guard let ip = address.ipAddress else { return false }
        for own in ownAddresses where own.port == address.port {
            if own.address == ip || Self.isLoopbackOrUnspecified(ip) { return true }
        }
        return false
    }

    static func isLoopbackOrUnspecified(_ ip: IPAddress) -> Bool {
        let b = ip.bytes
        if b.count == 4 { return b[0] == 127 || b == [0, 0, 0, 0] }
        return b[0..<15].allSatisfy { $0 == 0 } && (b[15] == 1 || b[15] == 0)
    }

    // MARK: connections

    func accept(fd: Int32, address: UnsafeMutablePointer<sockaddr>?, length: Int32,
                transparent: TransparentConnection? = nil) {
        guard let address, let peer = SocketAddress(address, length: socklen_t(length)) else {
            Glibc.close(fd)
            return
        }
        dm_set_nodelay(fd)
        guard let bev = bufferevent_socket_new(base, fd, Int32(BEV_OPT_CLOSE_ON_FREE.rawValue)) else {
            Glibc.close(fd)
            return
        }
        refreshSnapshot()
        let client = HTTP1Session(worker: self, bev: bev, peer: peer, transparent: transparent)
        clients[ObjectIdentifier(client)] = client
        metrics.connectionOpened()
        client.start()
    }

    /// A connection on the transparent listener (SPEC §16): its original destination is read from the socket. None
    /// (the connection was not redirected), or one that is this proxy (a connection straight to one of its
    /// listeners), and it is closed and logged `transparent-no-destination`: never relayed to itself.
    func acceptTransparent(fd: Int32, address: UnsafeMutablePointer<sockaddr>?, length: Int32) {
        var storage = sockaddr_storage()
        var storageLength = socklen_t(0)
        let found = dm_original_destination(fd, &storage, &storageLength) == 0
        let destination = found ? withUnsafePointer(to: &storage) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { SocketAddress($0, length: storageLength) }
        } : nil
        guard let destination, let ip = destination.ipAddress, destination.port != 0, !isOwnAddress(destination),
              !Self.isUnspecified(ip) else {
            let peer = address.flatMap { SocketAddress($0, length: socklen_t(length)) }
            noTransparentDestination(client: peer?.hostText ?? "-", destination: destination)
            Glibc.close(fd)
            return
        }
        let pinned = PinnedDestination(address: ip.description, port: destination.port)
        accept(fd: fd, address: address, length: length, transparent: TransparentConnection(destination: pinned))
    }

    private func noTransparentDestination(client: String, destination: SocketAddress?) {
        let exchange = Exchange(clientVersion: .http11, method: "-", url: "-", startedAt: clock.nowNanoseconds())
        exchange.outcome = .error
        exchange.reason = AbortReason.transparentNoDestination.rawValue
        exchange.source = .transparent
        record(exchange, client: client)
        logger.info("transparent-no-destination", metadata: [
            "client": "\(client)",
            "destination": "\(destination.map { "\($0.hostText):\($0.port)" } ?? "none (not redirected)")",
        ])
    }

    static func isUnspecified(_ ip: IPAddress) -> Bool { ip.bytes.allSatisfy { $0 == 0 } }

    /// accept(2) failed. Out of descriptors (EMFILE/ENFILE): pause accepting for a second instead of spinning,
    /// and say so once; the connections already open keep being served.
    func acceptFailed(_ listener: OpaquePointer?) {
        let error = errno
        if error == EMFILE || error == ENFILE || error == ENOBUFS || error == ENOMEM {
            if let listener, !pausedListeners.contains(listener) {
                pausedListeners.append(listener)
                evconnlistener_disable(listener)
                logger.warning("accept failed, pausing new connections for 1s", metadata: [
                    "worker": "\(index)", "error": "\(String(cString: strerror(error)))",
                    "open_connections": "\(clients.count + parked.count)",
                ])
            }
        } else {
            logger.warning("accept failed", metadata: ["worker": "\(index)", "error": "\(String(cString: strerror(error)))"])
        }
    }

    /// Admission's verdict on `head` from `client`, under this worker's settings and budgets now.
    func admit(_ head: RequestHead, source: RequestSource, client: IPAddress?, clientText: String) -> Admission {
        let settings = self.settings
        let tlsServer = self.tlsServer
        let wallNow = clock.wallNanoseconds()
        return Admission.admit(head, source: source, client: client, clientText: clientText,
                               settings: settings, budgets: budgets,
                               intercepts: { tlsServer != nil && settings.tls.intercepts(host: $0) },
                               now: wallNow / 1_000_000_000, nowNanoseconds: wallNow)
    }

    func clientClosed(_ client: AnyObject) {
        if clients.removeValue(forKey: ObjectIdentifier(client)) != nil { metrics.connectionClosed() }
        exitIfDrained()
    }

    /// `session` parked its connection (`ParkedConnections`): it is let go, and the connection stays open.
    func clientParked(_ session: HTTP1Session) {
        clients.removeValue(forKey: ObjectIdentifier(session))
    }

    /// A parked connection woke with its next request: `session` is its session from now on.
    func adopt(_ session: HTTP1Session) {
        clients[ObjectIdentifier(session)] = session
    }

    /// A parked connection was closed (its idle time ran out, or a drain or shutdown).
    func parkedConnectionClosed() {
        metrics.connectionClosed()
        exitIfDrained()
    }

    /// The connection `old` was is now `new`'s (an intercepted client chose `h2`): still one connection.
    func clientChangedHands(from old: AnyObject, to new: any ClientSession) {
        clients.removeValue(forKey: ObjectIdentifier(old))
        clients[ObjectIdentifier(new)] = new
    }

    /// The pool's key for an origin: the last one made when it names the same origin, else a new one. A key hashes
    /// its host when it is made (~300 instructions, callgrind); comparing it with the last costs a few dozen.
    func upstreamKey(host: String, port: UInt16, tls: Bool, pinned: PinnedDestination?) -> UpstreamKey {
        if let last = lastUpstreamKey, last.port == port, last.tls == tls, last.pinned == pinned, last.host == host {
            return last
        }
        let key = UpstreamKey(host: host, port: port, tls: tls, pinned: pinned)
        lastUpstreamKey = key
        return key
    }

    func upstreamOpened(_ upstream: UpstreamConnection) {
        upstreams[ObjectIdentifier(upstream)] = upstream
        metrics.upstreamOpenedOrClosed()
    }

    func upstreamClosed(_ upstream: UpstreamConnection) {
        upstreams.removeValue(forKey: ObjectIdentifier(upstream))
        metrics.upstreamOpenedOrClosed()
    }

    // MARK: accounting

    func record(_ exchange: Exchange, client: String) {
        let now = clock.nowNanoseconds()
        let duration = Double(now &- exchange.startedAt) / 1_000_000_000
        let outcome = exchange.outcome ?? .error
        let outcomeReason = metrics.count(outcome: outcome, reason: exchange.reason, durationSeconds: duration)
        // A tunnel's bytes are counted while they flow (a tunnel may live for hours; the counter must move with
        // it), by `pumpTunnel` and `spliceProgressed`; every other exchange's here, once, when it ends.
        if !exchange.bytesCountedWhileFlowing {
            metrics.add(bytesIn: Int(exchange.bytesIn))
            metrics.add(bytesOut: Int(exchange.bytesOut))
        }
        if let session = exchange.session {
            sessionTallies.record(session, outcomeReason: outcomeReason, bytesIn: exchange.bytesIn,
                                  bytesOut: exchange.bytesOut, variant: exchange.variant,
                                  rejected: outcome == .rejected
                                      ? (exchange.url, exchange.reason ?? outcome.rawValue, clock.wallNanoseconds()) : nil,
                                  now: now)
        }
        if outcome == .rejected {
            refusals.append(Refusal(time: clock.wallNanoseconds(), client: client, method: exchange.method,
                                    url: exchange.url, error: exchange.reason ?? outcome.rawValue,
                                    reasons: exchange.refusalReasons, rule: exchange.rule, session: exchange.session?.id))
        }
        if accessLog.isEnabled {
            accessLog.write(time: clock.wallNanoseconds(), client: client, proto: exchange.protocolName,
                            method: exchange.method, url: exchange.url,
                            status: exchange.status, bytesIn: exchange.bytesIn, bytesOut: exchange.bytesOut,
                            outcome: outcome.rawValue, reason: exchange.reason, variant: exchange.variant,
                            tags: exchange.tags, tagSources: exchange.tagSources, rule: exchange.rule,
                            source: exchange.source.rawValue, durationSeconds: duration)
        }
    }
}
