import DatamodeAdmin
import DatamodeConfig
import DatamodeDeferral
import DatamodeEngine
import DatamodePolicy
import DatamodeState
import Logging
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// One datamode-proxy: the whole process composed in one place, for the `run` command and the in-process tests
/// alike (Envoy's `Server::Instance`).
///
/// Building it (`init`) reads the state directory, resolves the mode (`ModeResolution`), compiles the policy once
/// with the persisted API variants and prepares the workers and the admin API, without a socket. `start()` binds the
/// admin listener, then the workers; `run()` serves the control plane (admin API, signals) on the calling thread
/// until `drain()`; `wait(timeout:)` joins the workers.
///
/// Every change of the running state goes through `runtime`, whose generation is the one the workers watch: a
/// reload, a mode flip and a variant registration each make one new generation.
public final class ProxyInstance: @unchecked Sendable {
    /// Why the process cannot start. Both are exit status 2 for `run`.
    public enum StartupError: Error, CustomStringConvertible {
        /// The configuration is invalid (named by file or override, key and line).
        case configuration(ConfigError)
        /// The state directory, or a file in it, cannot be used (SPEC §7: never silently dropped).
        case state(StateStore.StateError)
        /// The local CA cannot be loaded or created (SPEC §9), e.g. a key readable by others.
        case certificateAuthority(CertificateAuthorityError)
        /// The shared store cannot be set up (SPEC §19), e.g. its password file cannot be read.
        case store(String)

        public var description: String {
            switch self {
            case .configuration(let error): "\(error)"
            case .state(let error): "state: \(error)"
            case .certificateAuthority(let error): "CA: \(error)"
            case .store(let reason): "store: \(reason)"
            }
        }
    }

    /// What a reload did.
    public enum ReloadResult: Sendable, Equatable {
        /// The new configuration is running; workers pick up `generation` before their next request head.
        case applied(generation: UInt64)
        /// Refused, for `reason` (the file, key and line, or the state file); the running configuration is kept whole.
        case refused(reason: String)
    }

    /// The snapshot every worker reads, with the one generation counter.
    public let runtime: RuntimeState
    /// The workers (not started until `start()`).
    public let server: ProxyServer
    /// The admin API, a pure request → response function (SPEC §7).
    public let adminAPI: AdminAPI
    /// The admin API's persisted mode and variants.
    public let store: StateStore
    /// The local CA (SPEC §9): loaded when one exists, created when `tls.intercept` is set and there is none.
    public let certificateAuthority: CertificateAuthority?
    /// The CA was created by this start-up (the caller tells the user where it is and how to trust it).
    public let createdCertificateAuthority: Bool

    /// Data budgets (SPEC §11): counted by the workers, rolled over and persisted here.
    public let budgets: BudgetLedger
    /// Stored uploads (SPEC §18.3): the store in the state directory and their delivery, opened by `start()` (an
    /// instance that is never started leaves the store alone).
    public private(set) var deferredStore: DeferredStore?
    public private(set) var delivery: DeferredDelivery?
    private let logger: Logger
    private let clock: any EngineClock
    private var budgetTicks = 0
    private var savedUsage: [UInt64] = []
    /// A fleet's budget hashes as the last run saw them (`store.kind: redis`), for the shared store when it starts.
    private var savedShares: [String: (start: Int64, fields: [String: UInt64])] = [:]
    /// What `budget-shares.json` holds now, as text to compare (written when it changed).
    private var persistedShares: [String] = []
    private let reloads: ReloadTally
    /// Serialises the control plane's changes (admin requests, reloads): they run on the control loop's thread,
    /// except a reload a test asks for from its own.
    private let controlPlane = Mutex<Void>(())
    private var control: ControlLoop?
    private var admin: AdminTransport?
    /// When to give free heap memory back to the kernel (`startIdleTrim`); set by `start()`.
    private let idleTrimSettings: IdleTrim.Settings
    private var idleTrim: IdleTrim?
    private let trims = Atomic<Int>(0)

    /// Builds the process for `configuration` (the file with the flags and environment applied): the state store,
    /// the mode, the compiled policy, the workers and the admin API. Binds nothing. `idleTrim` says when free heap
    /// memory goes back to the kernel after a burst (tests lower its threshold).
    public init(configuration: ProxyConfiguration, logger: Logger, clock: any EngineClock = SystemClock(),
                idleTrim: IdleTrim.Settings = IdleTrim.Settings()) throws(StartupError) {
        idleTrimSettings = idleTrim
        do {
            try configuration.validateForStartup()
        } catch {
            throw .configuration(error)
        }
        // State the admin API persisted beats flags and the file (SPEC §2); unreadable state stops start-up.
        let store: StateStore
        let saved: (mode: DataMode, since: Int64)?
        let apiVariants: [Variant]
        let savedProfile: String?
        let savedUsage: [String: (start: Int64, used: UInt64)]
        let savedShares: [String: (start: Int64, fields: [String: UInt64])]
        do throws(StateStore.StateError) {
            store = try StateStore(directory: configuration.stateDirectory)
            saved = try store.loadMode()
            savedProfile = try store.loadProfile()
            if let savedProfile, configuration.link.profiles[savedProfile] == nil {
                throw StateStore.StateError(description: "\(store.conditionsPath): profile \"\(savedProfile)\" is not defined "
                    + "in the configuration; define it under profiles, or delete the file")
            }
            apiVariants = try store.loadVariants(files: configuration.variantFiles)
            savedUsage = try store.loadBudgetUsage()
            savedShares = configuration.store.kind == .redis
                ? try store.loadBudgetShares(keyPrefix: configuration.store.redis.keyPrefix) : [:]
        } catch {
            throw .state(error)
        }
        let snapshot: ConfigurationSnapshot
        do {
            snapshot = try ConfigurationSnapshot(configuration: configuration, apiVariants: apiVariants)
        } catch {
            switch error {
            case .configuration(let error): throw .configuration(error)
            case .apiVariants(let error):
                throw .state(StateStore.StateError(description: "\(store.variantsPath): \(error); fix or delete the file"))
            }
        }
        redisPassword = try Self.redisPassword(configuration.store)
        let resolution = ModeResolution(api: saved?.mode, configuration: configuration)
        let now = Self.seconds(clock)
        let runtime = RuntimeState(RuntimeSnapshot(
            configuration: snapshot.configuration, policy: snapshot.policy, mode: resolution.mode,
            modeSource: resolution.source, modeSince: saved?.since ?? now, apiProfile: savedProfile))
        let (authority, created) = try Self.certificateAuthority(for: configuration)
        if !configuration.tls.upstreamVerify {
            logger.warning("tls.upstream-verify is false: origins' certificates are NOT verified; anyone on the path to an origin can read and change its traffic")
        }
        // Budget usage persisted by an earlier run carries on in its period (never reset early, SPEC §11).
        let budgets = BudgetLedger(budgets: configuration.budgets, slots: configuration.workerCount(), now: now)
        for (index, budget) in configuration.budgets.enumerated() {
            if let saved = savedUsage[budget.name] { budgets.restore(index, start: saved.start, used: saved.used, now: now) }
        }
        let server = ProxyServer(runtime: runtime, logger: logger, clock: clock, budgets: budgets)
        server.certificateAuthority = authority
        self.certificateAuthority = authority
        self.createdCertificateAuthority = created
        let reloads = ReloadTally()
        self.runtime = runtime
        self.server = server
        self.store = store
        self.logger = logger
        self.clock = clock
        self.reloads = reloads
        self.budgets = budgets
        self.adminAPI = AdminAPI(runtime: runtime, store: store, token: configuration.admin.token,
                                 readToken: configuration.admin.readToken, logger: logger, budgets: budgets,
                                 metrics: { server.metrics() }, reloads: { reloads.counts },
                                 sessionTallies: { server.sessionTallies() }, now: { Self.seconds(clock) },
                                 monotonic: { clock.nowNanoseconds() },
                                 knownProfiles: { [runtime] in Set(runtime.load().snapshot.configuration.link.profiles.keys) },
                                 caCertificate: { authority?.certificatePEM }, refusals: { server.refusals() })
        adminAPI.wallMilliseconds = { clock.wallNanoseconds() / 1_000_000 }
        self.savedShares = savedShares
    }

    /// The password in `store.redis.password-file`, without its trailing line break; nil without a file or with the
    /// state directory as the store. An unreadable or empty file stops start-up, naming the file (not its contents).
    private static func redisPassword(_ store: StoreSection) throws(StartupError) -> String? {
        guard store.kind == .redis, let path = store.redis.passwordFile else { return nil }
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw .store("store.redis.password-file \(path): \(String(cString: strerror(errno)))") }
        defer { close(fd) }
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        while bytes.count <= 64 * 1024 {
            let count = read(fd, &buffer, buffer.count)
            if count < 0 && errno == EINTR { continue }
            guard count > 0 else { break }
            bytes += buffer[0..<count]
        }
        while let last = bytes.last, last == 0x0a || last == 0x0d { bytes.removeLast() }
        guard !bytes.isEmpty, bytes.count <= 64 * 1024 else {
            throw .store("store.redis.password-file \(path): \(bytes.isEmpty ? "empty" : "larger than 64 KiB")")
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    /// Connects the shared store (SPEC §19 `store.kind: redis`): admin writes go to Redis first, what Redis holds is
    /// applied on the control loop (pub/sub, every second, and when Redis comes up). Redis down changes nothing the
    /// workers see: they go on with the last state known.
    private func startFleetStore(_ control: ControlLoop) throws(EngineError) {
        let settings = runtime.load().snapshot.configuration.store.redis
        let store = self.store
        let fleet = try FleetStore(settings: settings, password: redisPassword, logger: logger,
                                   lastKnown: { name in store.localBytes(name) },
                                   deliver: { [unowned self] name, bytes, key, announced in
            control.post { [unowned self] in
                self.controlPlane.withLock { _ in _ = self.adminAPI.applyShared(name, bytes, origin: key, announced: announced) }
            }
        })
        let clock = self.clock
        // Sessions and schedules (SPEC §12 with §19): a read older than this proxy's latest write is dropped.
        let api = adminAPI
        fleet.deliverSessions = { [unowned self, unowned fleet] reads, complete, generation in
            control.post { [unowned self] in
                self.controlPlane.withLock { _ in
                    guard generation == fleet.writeGeneration else { return }
                    api.applySharedSessions(reads, complete: complete, keyPrefix: settings.keyPrefix)
                }
            }
        }
        fleet.deliverSchedules = { [unowned self, unowned fleet] fields, generation in
            control.post { [unowned self] in
                self.controlPlane.withLock { _ in
                    guard generation == fleet.writeGeneration else { return }
                    api.applySharedSchedules(fields, key: fleet.schedulesKey)
                }
            }
        }
        fleet.seedScopes = { [runtime] in
            (api.sharedScopes.sessions, api.sharedScopes.schedules, runtime.load().snapshot.configuration.sessions.idleExpiry)
        }
        let shared = FleetBudgets(ledger: budgets, link: fleet.link, prefix: settings.keyPrefix)
        shared.restore(savedShares)
        fleet.onUpCommands = { shared.raiseCommands(now: Self.seconds(clock)) }
        controlPlane.withLock { _ in
            store.shared = fleet
            adminAPI.storeUp = { fleet.isUp }
            if !budgets.isEmpty {
                adminAPI.sharedBudgetReset = { index throws(StateStore.StateError) in try shared.reset(index, now: Self.seconds(clock)) }
            }
        }
        self.fleet = fleet
        fleetBudgets = shared
        fleet.start()
        control.every(milliseconds: 1000) { fleet.sync() }
        logger.info("store: shared state in Redis", metadata: ["url": "\(settings.url)", "prefix": "\(settings.keyPrefix)",
                                                              "auth": "\(redisPassword == nil ? "none" : "password-file")"])
    }

    /// Opens the deferral store (a damaged, foreign or busy one stops start-up, naming the file: SPEC §18) and
    /// wires it to the workers, the delivery and the admin API.
    private func startDeferral() throws(EngineError) {
        let store: DeferredStore
        do throws(DeferredStoreError) {
            store = try Self.openDeferredStore(runtime.load().snapshot.configuration)
        } catch {
            throw EngineError("deferral: \(error)")
        }
        if store.recoveredAtOpen > 0 {
            logger.warning("deferred uploads interrupted while delivering are queued again (they may reach their origin twice, with the same Idempotency-Key)",
                           metadata: ["count": "\(store.recoveredAtOpen)"])
        }
        let events = adminAPI.events
        let wiring = DeferralWiring(store: store, counters: DeferralCounters(), events: { entry, outcome in
            events.emit(.deferred, scope: entry.session ?? "global", data: DeferredEndpoint.eventData(entry, outcome: outcome))
        })
        server.deferral = wiring
        let delivery = DeferredDelivery(store: store, runtime: runtime, budgets: budgets, wiring: wiring, clock: clock,
                                        logger: logger)
        controlPlane.withLock { _ in
            adminAPI.deferral = DeferralAdmin(store: store, counters: wiring.counters, flush: { delivery.flush() },
                                              now: { [clock] in clock.wallNanoseconds() / 1_000_000 })
        }
        deferredStore = store
        self.delivery = delivery
    }

    /// Opens the deferral store in the state directory (created `0600`: uploads carry their clients' data and
    /// credentials for origins), with the `deferral` section's bounds. A damaged or foreign file stops start-up.
    private static func openDeferredStore(_ configuration: ProxyConfiguration) throws(DeferredStoreError) -> DeferredStore {
        let path = configuration.stateDirectory + "/" + DeferredStore.fileName
        let fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0o600)
        if fd >= 0 {
            _ = fchmod(fd, 0o600)
            close(fd)
        }
        let deferral = configuration.deferral
        return try DeferredStore(path: path, limits: DeferredStoreLimits(maxBody: deferral.maxBody, maxBytes: deferral.maxBytes))
    }

    /// The CA of SPEC §9: an existing one is always loaded (so a reload can turn interception on), with its key's
    /// permissions checked; a missing one is created only when interception is configured.
    private static func certificateAuthority(for configuration: ProxyConfiguration) throws(StartupError)
        -> (CertificateAuthority?, Bool) {
        let (certificate, key) = configuration.caPaths
        do {
            if CertificateAuthority.exists(certificatePath: certificate, keyPath: key) {
                return (try CertificateAuthority.load(certificatePath: certificate, keyPath: key), false)
            }
            guard !configuration.tls.intercept.isEmpty else { return (nil, false) }
            return (try CertificateAuthority.create(certificatePath: certificate, keyPath: key), true)
        } catch {
            throw .certificateAuthority(error)
        }
    }

    /// How often an idle event stream gets a heartbeat comment (SPEC §12: 15 s). Tests shorten it; read each time
    /// the heartbeat timer is armed.
    public var eventHeartbeat: Duration {
        get { heartbeatInterval.withLock { $0 } }
        set { heartbeatInterval.withLock { $0 = newValue } }
    }
    private let heartbeatInterval = Mutex<Duration>(.seconds(15))
    private var heartbeatTimer: ControlTimer?
    private var scheduleTimer: ControlTimer?
    private var expiryTimer: ControlTimer?
    /// The state directory's watch (SPEC §19 `store.kind: file`) and the timer that gathers its bursts.
    private var stateWatch: DirectoryWatch?
    private var stateFollowTimer: ControlTimer?
    private var stateFollowArmed = false
    /// The shared state in Redis (SPEC §19 `store.kind: redis`); nil with the state directory as the store.
    private var fleet: FleetStore?
    /// The budgets' shared counters (with `fleet`).
    private var fleetBudgets: FleetBudgets?
    /// The Redis password, read from `store.redis.password-file` at start-up. Never logged.
    private let redisPassword: String?

    deinit {
        // evhttp and the timers before the event base they live on.
        heartbeatTimer = nil
        scheduleTimer = nil
        expiryTimer = nil
        stateWatch = nil
        stateFollowTimer = nil
        admin = nil
        control = nil
    }

    /// Event streams open now (`GET /events`), for tests. Control loop only.
    public var eventSubscriberCount: Int { admin?.subscriberCount ?? 0 }

    /// What the event streams hold in the proxy now, in bytes. Any thread.
    public var eventBacklogBytes: Int { admin?.heldBacklogBytes ?? 0 }

    /// How many times free heap memory was given back to the kernel after a burst (`IdleTrim`). Any thread.
    public var memoryTrims: Int { trims.load(ordering: .relaxed) }

    /// The proxy's address, with the real port once started.
    public var listenAddress: ListenAddress { server.listenAddress }
    /// The transparent listener (SPEC §16) with its real port; nil when off.
    public var transparentAddress: ListenAddress? { server.transparentAddress }

    /// The admin API's address, with the real port once started.
    public var adminAddress: ListenAddress { admin?.listenAddress ?? runtime.load().snapshot.configuration.admin.listen }

    /// Binds the admin listener, then starts the workers.
    public func start() throws(EngineError) {
        if MemoryTuning.apply() {
            logger.info("malloc thresholds set for relay buffers", metadata: [
                "mmap_threshold": "\(MemoryTuning.mmapThreshold)", "trim_threshold": "\(MemoryTuning.trimThreshold)"])
        } else {
            logger.info("malloc thresholds left as GLIBC_TUNABLES sets them")
        }
        let configuration = runtime.load().snapshot.configuration
        // The admin listener is bound first, so the workers know its real port (it may be 0 in the config) and
        // refuse to proxy to it.
        try startDeferral()
        let control = try ControlLoop()
        self.control = control
        admin = try AdminTransport(loop: control, address: configuration.admin.listen,
                                   tooLarge: AdminAPI.requestTooLarge(limit: AdminTransport.maxRequestBytes)) { [unowned self] request in
            self.answer(request)
        }
        server.addOwnAddress(adminAddress)
        startControlTimers(control)
        if configuration.store.kind == .redis {
            try startFleetStore(control)
        } else {
            followStateDirectory(control)
        }
        startIdleTrim(control)
        try server.start()
        // SPEC §20: the timeline's one point per second, from the totals the workers keep anyway.
        controlPlane.withLock { _ in adminAPI.sampleTimeline() }
        control.every(milliseconds: 1000) { [unowned self] in self.controlPlane.withLock { _ in self.adminAPI.sampleTimeline() } }
        delivery?.start()
        if !budgets.isEmpty {
            control.every(milliseconds: 100) { [unowned self] in self.budgetTick() }
        }
    }

    /// Every 100 ms: periods that ended roll over; every second, usage that changed is persisted (SPEC §11: a
    /// crash loses at most a second of counting).
    private func budgetTick() {
        budgets.rollOver(now: Self.seconds(clock))
        fleetBudgets?.flush(now: Self.seconds(clock))
        controlPlane.withLock { _ in adminAPI.emitBudgetChanges() }
        budgetTicks += 1
        if budgetTicks % 10 == 0 { persistBudgets() }
    }

    /// Writes budget usage to the state directory if it changed since the last write, and a fleet's shares as this
    /// proxy knows them if they did. Called every second and at shutdown; a failure is logged and retried at the
    /// next call.
    public func persistBudgets() {
        guard !budgets.isEmpty else { return }
        controlPlane.withLock { _ in
            if let fleetBudgets {
                let shares = fleetBudgets.knownShares()
                let text = shares.map { share in
                    "\(share.name) \(share.start) " + share.fields.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " ")
                }
                if text != persistedShares {
                    do {
                        try store.saveBudgetShares(shares, keyPrefix: fleetBudgets.prefix)
                        persistedShares = text
                    } catch {
                        logger.error("cannot persist the fleet's budget shares", metadata: ["error": "\(error)"])
                    }
                }
            }
            let usage = budgets.usage()
            let values = usage.flatMap { [UInt64(bitPattern: $0.start), $0.used] }
            guard values != savedUsage else { return }
            do {
                try store.saveBudgetUsage(usage)
                savedUsage = values
            } catch {
                logger.error("cannot persist budget usage", metadata: ["error": "\(error)"])
            }
        }
    }

    /// The control plane's own clockwork: events reach the streams on the control loop; heartbeats; schedule
    /// steps at their due time; idle sessions expire.
    private func startControlTimers(_ control: ControlLoop) {
        adminAPI.events.connect { [unowned self] scope, bytes in
            control.post { [unowned self] in self.admin?.publish(scope: scope, bytes) }
        }
        let heartbeat = control.timer { [unowned self] in
            self.admin?.publish(scope: nil, EventHub.heartbeat)
            self.heartbeatTimer?.schedule(milliseconds: self.eventHeartbeat.milliseconds)
        }
        heartbeat.schedule(milliseconds: eventHeartbeat.milliseconds)
        heartbeatTimer = heartbeat
        let schedule = control.timer { [unowned self] in
            self.controlPlane.withLock { _ in _ = self.adminAPI.runDueScheduleSteps() }
            self.armScheduleTimer()
        }
        scheduleTimer = schedule
        adminAPI.schedules.onChange { [unowned self] in self.armScheduleTimer() }
        let expiry = control.timer { [unowned self] in
            let idle = self.runtime.load().snapshot.configuration.sessions.idleExpiry
            self.controlPlane.withLock { _ in
                if let fleet = self.fleet {
                    // Shared sessions expire with their keys; those used here get their whole lifetime again.
                    fleet.refreshSessions(self.adminAPI.sharedSessionTick(storeUp: fleet.isUp, expiry: idle), lifetime: idle)
                } else {
                    _ = self.adminAPI.expireIdleSessions(after: idle)
                }
            }
            self.armExpiryTimer()
        }
        expiryTimer = expiry
        armExpiryTimer()
    }

    /// How long after the first change seen in the state directory its files are read: a writer's burst (a
    /// temporary written, then renamed; a ConfigMap's new directory, its `..data_tmp` link, the rename) is read once,
    /// whole, well within SPEC §19's second.
    static let stateFollowDelayMilliseconds: Int64 = 50

    /// Watches the state directory for what another process writes there (SPEC §19): a change arms the timer once
    /// (later changes do not push it back, so a writer that never stops cannot starve it), and when it fires the
    /// admin API applies the followed files. Where inotify cannot be had, the directory is read every second.
    private func followStateDirectory(_ control: ControlLoop) {
        let follow = control.timer { [unowned self] in
            self.stateFollowArmed = false
            self.controlPlane.withLock { _ in _ = self.adminAPI.followStateDirectory() }
        }
        stateFollowTimer = follow
        do {
            stateWatch = try DirectoryWatch(loop: control, directory: store.directory) { [unowned self] names in
                guard names?.contains(where: StateStore.mayChangeFollowedFiles) ?? true, !self.stateFollowArmed else { return }
                self.stateFollowArmed = true
                follow.schedule(milliseconds: Self.stateFollowDelayMilliseconds)
            }
        } catch {
            logger.warning("cannot watch the state directory; reading it every second instead",
                           metadata: ["directory": "\(store.directory)", "error": "\(error)"])
            control.every(milliseconds: 1000) { [unowned self] in
                self.controlPlane.withLock { _ in _ = self.adminAPI.followStateDirectory() }
            }
        }
    }

    /// What grows with the proxy's work: the workers' exchanges and connections, and admin requests answered.
    private var activity: UInt64 {
        server.activity + UInt64(admin?.requestsAnswered ?? 0)
    }

    /// Every second on the control loop: once the proxy has gone quiet after a burst, malloc's free memory goes back
    /// to the kernel (`IdleTrim`; the workers are near idle by then, so the arena locks it takes cost them nothing).
    private func startIdleTrim(_ control: ControlLoop) {
        idleTrim = IdleTrim(settings: idleTrimSettings, now: clock.nowNanoseconds(), activity: activity)
        control.every(milliseconds: 1000) { [unowned self] in self.idleTrimTick() }
    }

    private func idleTrimTick() {
        let now = clock.nowNanoseconds()
        guard idleTrim?.tick(now: now, activity: activity, residentBytes: MemoryTuning.residentBytes,
                             freeBytes: MemoryTuning.freeBytes) == true else { return }
        let before = MemoryTuning.residentBytes()
        MemoryTuning.trim()
        let after = MemoryTuning.residentBytes()
        idleTrim?.trimmed(now: clock.nowNanoseconds(), resident: after)
        trims.add(1, ordering: .relaxed)
        func mebibytes(_ bytes: Int?) -> String { bytes.map { String($0 >> 20) } ?? "unknown" }
        logger.info("quiet after a burst: free heap memory given back to the kernel", metadata: [
            "rss_mib_before": "\(mebibytes(before))", "rss_mib_after": "\(mebibytes(after))",
            "ms": "\((clock.nowNanoseconds() &- now) / 1_000_000)"])
    }

    /// Due steps are applied from a timer set for the earliest one (on the injected clock's time line). The steps
    /// still to come are published to the workers first (`RuntimeSnapshot.scheduleOutlooks`, SPEC §18.1).
    private func armScheduleTimer() {
        let outlooks = adminAPI.schedules.outlooks(wallNow: clock.wallNanoseconds(), monotonicNow: clock.nowNanoseconds())
        if runtime.load().snapshot.scheduleOutlooks != outlooks {
            runtime.update { $0.scheduleOutlooks = outlooks }
        }
        guard let timer = scheduleTimer else { return }
        guard let due = adminAPI.schedules.nextDue else {
            timer.cancel()
            return
        }
        let now = clock.nowNanoseconds()
        timer.schedule(milliseconds: due > now ? Int64((due - now + 999_999) / 1_000_000) : 0)
    }

    /// Idle sessions are looked for every quarter of `idle-expiry` (at least every second, at most every 50 ms).
    private func armExpiryTimer() {
        let idle = runtime.load().snapshot.configuration.sessions.idleExpiry.milliseconds
        expiryTimer?.schedule(milliseconds: min(1000, max(50, idle / 4)))
    }

    /// `SIGHUP` reloads with `load`; `SIGTERM` and `SIGINT` drain. Call after `start()`, on the thread that calls `run()`.
    public func handleSignals(reloadingWith load: @escaping () throws(ConfigError) -> ProxyConfiguration) {
        guard let control else { return }
        control.onSignal(SIGHUP) { [unowned self] _ in _ = self.reload(load) }
        let stop: (Int32) -> Void = { [unowned self] signal in
            self.logger.info("stopping: draining in-flight requests", metadata: ["signal": "\(signal)"])
            self.drain()
        }
        control.onSignal(SIGTERM, stop)
        control.onSignal(SIGINT, stop)
    }

    /// Serves the control plane (admin API, signals) on the calling thread until `drain()`.
    public func run() {
        control?.run()
    }

    /// Stops accepting, lets in-flight requests finish (SPEC §8) and ends `run()`. Any thread.
    public func drain() {
        server.drain()
        control?.stop()
    }

    /// Joins the workers, forcing them out after `timeout`; `true` when all finished in time.
    @discardableResult
    public func wait(timeout: Duration) -> Bool {
        let finished = server.wait(timeout: timeout)
        // A clean stop loses no counted byte.
        fleetBudgets?.flushBeforeStopping(now: Self.seconds(clock))
        persistBudgets()
        fleet?.stop()
        delivery?.stop()
        deferredStore?.close()
        return finished
    }

    /// Reloads the configuration `load` gives (the file again, with the same flags and environment): every check
    /// before the first change, so a refused reload leaves the running state whole. The API mode and the API
    /// variants are kept. Counted, logged and returned.
    @discardableResult
    public func reload(_ load: () throws(ConfigError) -> ProxyConfiguration) -> ReloadResult {
        controlPlane.withLock { _ in
            let result = apply(load)
            switch result {
            case .applied(let generation):
                reloads.applied.add(1, ordering: .relaxed)
                logger.info("configuration reloaded", metadata: ["generation": "\(generation)"])
            case .refused(let reason):
                reloads.refused.add(1, ordering: .relaxed)
                logger.error("reload failed; keeping the running configuration", metadata: ["error": "\(reason)"])
            }
            return result
        }
    }

    /// Reloads `configuration`, as `reload(_:)`.
    @discardableResult
    public func reload(with configuration: ProxyConfiguration) -> ReloadResult {
        reload { () throws(ConfigError) in configuration }
    }

    /// Reloads applied (`ok`) and refused (`failed`) since start-up, as `/metrics` shows them.
    public var reloadCounts: ReloadCounts { reloads.counts }

    private func apply(_ load: () throws(ConfigError) -> ProxyConfiguration) -> ReloadResult {
        do {
            let configuration = try load()
            if !configuration.tls.intercept.isEmpty && certificateAuthority == nil {
                // The CA goes into every worker's TLS setup at start-up, so one made by `ca init` since cannot be
                // taken up by a reload: only a restart turns interception on.
                return .refused(reason: "tls.intercept needs the local CA, which is loaded only at start-up: "
                    + "restart the proxy to turn interception on (it creates the CA if there is none)")
            }
            // Control-plane changes are serialised (`controlPlane`), so the API variants cannot change meanwhile.
            let apiVariants = runtime.load().snapshot.policy.variants.filter { $0.source == .api }
            try store.checkFiles(of: apiVariants, against: configuration.variantFiles)
            let snapshot = try ConfigurationSnapshot(configuration: configuration, apiVariants: apiVariants)
            let now = Self.seconds(clock)
            let (before, after) = runtime.update { state -> (RuntimeSnapshot, RuntimeSnapshot) in
                let before = state
                state.configuration = snapshot.configuration
                state.policy = snapshot.policy
                // A scheduled mode is kept: the timeline is in memory and goes on.
                if state.modeSource != .schedule {
                    state.apply(ModeResolution(api: state.apiMode, configuration: snapshot.configuration), now: now)
                }
                return (before, state)
            }
            let generation = runtime.generation
            adminAPI.events.emit(.reload, scope: "global", data: ["generation": Int(generation)])
            if before.mode != after.mode || before.modeSource != after.modeSource {
                adminAPI.events.emit(.mode, scope: "global", data: ModeEndpoint.eventData(after))
            }
            if configuration.store != before.configuration.store {
                logger.warning("store changed in the configuration file: it takes effect at the next start")
            }
            if configuration.budgets != budgets.budgets {
                logger.warning("budgets changed in the configuration file: they take effect at the next start (usage is counted against the budgets the proxy started with)")
            }
            return .applied(generation: generation)
        } catch {
            return .refused(reason: "\(error)")
        }
    }

    private func answer(_ request: AdminRequest) -> AdminResponse {
        controlPlane.withLock { _ in adminAPI.handle(request) }
    }

    private static func seconds(_ clock: any EngineClock) -> Int64 {
        clock.wallNanoseconds() / 1_000_000_000
    }
}

/// Reload results, counted (`datamode_reloads_total`).
final class ReloadTally: Sendable {
    let applied = Atomic<Int>(0)
    let refused = Atomic<Int>(0)

    var counts: ReloadCounts {
        ReloadCounts(ok: applied.load(ordering: .relaxed), failed: refused.load(ordering: .relaxed))
    }
}
