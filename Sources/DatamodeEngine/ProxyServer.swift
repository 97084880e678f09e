import CDatamodeShims
import CLibevent
import DatamodeConfig
import DatamodePolicy
import DatamodeState
import Logging
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// The proxy: N workers, each an event loop on its own thread with its own SO_REUSEPORT listener.
///
/// Lifecycle: `start()` binds and starts the workers; `drain()` stops accepting and lets in-flight requests
/// finish; `wait(timeout:)` joins the workers, forcing them out after the timeout.
public final class ProxyServer: @unchecked Sendable {
    public let runtime: RuntimeState
    private let logger: Logger
    private let clock: any EngineClock
    /// Token buckets of link profiles, shared by every worker (SPEC §10).
    let shaper = LinkShaper()
    /// Data budgets (SPEC §11), counted by every worker.
    public let budgets: BudgetLedger
    private var workers: [Worker] = []
    /// Requests held by every worker together (SPEC §18.2: `deferral.max-held`, `datamode_held_requests`).
    let heldCount = HeldCount()
    /// The deferral store and what reports on it (SPEC §18.3); set before `start()`.
    public var deferral = DeferralWiring()
    private var threads: [pthread_t] = []
    private var accessLog: AccessLog?
    /// The address the proxy listens on (with the real port when 0 was asked for).
    public private(set) var listenAddress: ListenAddress
    /// The transparent listener's address (SPEC §16), with the real port; nil when `transparent.listen` is off.
    public private(set) var transparentAddress: ListenAddress?

    /// The local CA for HTTPS interception (SPEC §9); set before `start()`. Without it nothing is intercepted.
    public var certificateAuthority: CertificateAuthority?

    /// Other listeners of this process (the admin API) that proxied requests must never reach.
    private var extraOwnAddresses: [(address: IPAddress, port: UInt16)] = []

    /// Registers another listener of this process (call before `start()`).
    public func addOwnAddress(_ address: ListenAddress) {
        extraOwnAddresses.append((address: address.address, port: address.port))
        if Worker.isLoopbackOrUnspecified(address.address) {
            extraOwnAddresses += Self.localInterfaceAddresses().map { (address: $0, port: address.port) }
        }
    }

    /// Every address of this machine's interfaces (for listeners on 0.0.0.0 / ::).
    static func localInterfaceAddresses() -> [IPAddress] {
        var list: UnsafeMutablePointer<ifaddrs>?
        guard getifaddrs(&list) == 0 else { return [] }
        defer { freeifaddrs(list) }
        var out: [IPAddress] = []
        var cursor = list
        while let entry = cursor {
            if let address = entry.pointee.ifa_addr {
                let family = Int32(address.pointee.sa_family)
                let length = socklen_t(family == AF_INET6 ? MemoryLayout<sockaddr_in6>.size : MemoryLayout<sockaddr_in>.size)
                if family == AF_INET || family == AF_INET6, let ip = SocketAddress(address, length: length)?.ipAddress {
                    out.append(ip)
                }
            }
            cursor = entry.pointee.ifa_next
        }
        return out
    }

    public init(runtime: RuntimeState, logger: Logger, clock: any EngineClock = SystemClock(),
                budgets: BudgetLedger = BudgetLedger(budgets: [], slots: 1, now: 0)) {
        self.budgets = budgets
        self.runtime = runtime
        self.logger = logger
        self.clock = clock
        self.listenAddress = runtime.load().snapshot.configuration.listen
    }

    public func start() throws(EngineError) {
        _ = ProxyServerProcess.setUp
        let snapshot = runtime.load().snapshot
        let configuration = snapshot.configuration
        let accessLog = try AccessLog(destination: configuration.log.access)
        self.accessLog = accessLog
        var count = configuration.threads
        if count <= 0 { count = max(1, Int(sysconf(Int32(_SC_NPROCESSORS_ONLN)))) }
        guard var address = SocketAddress(ipLiteral: configuration.listen.host, port: configuration.listen.port) else {
            throw EngineError("listen: \(configuration.listen) is not an IP address and port")
        }
        // Refuses an address any process listens on, before SO_REUSEPORT could let the workers join it (SPEC §6).
        // Held until every worker listens.
        let listenGuard = try ListenGuard(address)
        address.port = listenGuard.port
        var own = extraOwnAddresses
        for i in 0..<count {
            let worker = try Worker(index: i, runtime: runtime, clock: clock, accessLog: accessLog, shaper: shaper, budgets: budgets,
                                    logger: logger, ownAddresses: [], authority: certificateAuthority,
                                    heldCount: heldCount, deferral: deferral)
            let port = try worker.listen(on: address)
            if i == 0 {
                address.port = port
                listenAddress = ListenAddress(address: configuration.listen.address, port: port)
                own.append((address: configuration.listen.address, port: port))
                if Worker.isLoopbackOrUnspecified(configuration.listen.address) {
                    own += Self.localInterfaceAddresses().map { (address: $0, port: port) }
                }
            }
            workers.append(worker)
        }
        _ = consume listenGuard
        if let transparent = configuration.transparent.listen {
            own += try listenTransparent(transparent)
        }
        // Workers learn the final own addresses (the real port is known only after the first bind).
        for worker in workers { worker.ownAddressesUpdate(own) }
        for worker in workers {
            let box = Unmanaged.passRetained(worker).toOpaque()
            var thread = pthread_t()
            let result = pthread_create(&thread, nil, { argument in
                let worker = Unmanaged<Worker>.fromOpaque(argument!).takeRetainedValue()
                worker.run()
                return nil
            }, box)
            guard result == 0 else { throw EngineError("pthread_create failed: \(result)") }
            threads.append(thread)
        }
        logger.info("listening", metadata: ["address": "\(listenAddress)", "workers": "\(count)"])
        if let transparentAddress {
            logger.info("listening (transparent)", metadata: ["address": "\(transparentAddress)"])
        }
    }

    /// Binds every worker's transparent listener (SPEC §16); returns the addresses it makes this process's own
    /// (a connection whose original destination is one of them is not relayed: it would loop).
    private func listenTransparent(_ configured: ListenAddress) throws(EngineError) -> [(address: IPAddress, port: UInt16)] {
        guard var address = SocketAddress(ipLiteral: configured.host, port: configured.port) else {
            throw EngineError("transparent.listen: \(configured) is not an IP address and port")
        }
        let listenGuard = try ListenGuard(address)
        address.port = listenGuard.port
        for worker in workers { address.port = try worker.listenTransparent(on: address) }
        _ = consume listenGuard
        transparentAddress = ListenAddress(address: configured.address, port: address.port)
        var own = [(address: configured.address, port: address.port)]
        if Worker.isLoopbackOrUnspecified(configured.address) {
            own += Self.localInterfaceAddresses().map { (address: $0, port: address.port) }
        }
        return own
    }

    /// Stops accepting, closes idle connections, lets in-flight requests finish (SPEC §8 SIGTERM).
    public func drain() {
        for worker in workers { worker.send(.drain) }
    }

    /// Waits for every worker to finish; after `timeout` the remaining ones are forced out.
    /// Returns `true` when all finished within the timeout.
    @discardableResult
    public func wait(timeout: Duration) -> Bool {
        let deadline = clock.nowNanoseconds() + UInt64(max(0, timeout.milliseconds)) * 1_000_000
        var graceful = true
        for (index, thread) in threads.enumerated() {
            let worker = workers[index]
            while !worker.finished.load(ordering: .acquiring) {
                if clock.nowNanoseconds() >= deadline {
                    graceful = false
                    worker.send(.quit)
                    break
                }
                usleep(5_000)
            }
            pthread_join(thread, nil)
        }
        threads = []
        workers = []
        // Every line of the finished requests reaches the log, unless its reader has stopped reading.
        accessLog?.finish(timeout: .seconds(2))
        return graceful
    }

    /// Drains and waits: the whole graceful stop.
    @discardableResult
    public func stop(timeout: Duration) -> Bool {
        drain()
        return wait(timeout: timeout)
    }

    /// Every worker's counters summed.
    /// Every worker's session counters, summed per session (SPEC §12). Asks each running worker by message and
    /// waits for its answer (a worker answers between two events, in microseconds; one that does not within a
    /// second, or has stopped, is left out). Call from the control plane, one caller at a time.
    public func sessionTallies() -> [String: SessionTally] {
        let running = workers.filter { !$0.finished.load(ordering: .acquiring) }
        for worker in running {
            worker.sessionReport.clear()
            worker.send(.reportSessions)
        }
        var total: [String: SessionTally] = [:]
        for worker in running {
            var report: [String: SessionTally]?
            for _ in 0..<10_000 {
                report = worker.sessionReport.take()
                if report != nil || worker.finished.load(ordering: .acquiring) { break }
                usleep(100)
            }
            for (id, tally) in report ?? [:] {
                if total[id] == nil {
                    total[id] = tally
                } else if total[id]!.serial == tally.serial {
                    total[id]!.merge(tally)
                } else if total[id]!.serial < tally.serial {
                    total[id] = tally
                }
            }
        }
        return total
    }

    /// A count that only grows with the workers' work (exchanges; connections opened and closed, either side).
    /// The control loop reads it every second (`IdleTrim`).
    public var activity: UInt64 {
        workers.reduce(0) { $0 + UInt64($1.metrics.activityCount) }
    }

    /// The latest refusals of every worker together, newest first (SPEC §20 `GET /refusals`).
    public func refusals() -> [Refusal] {
        RefusalRing.latest(workers.map(\.refusals))
    }

    public func metrics() -> MetricsSnapshot {
        var total = MetricsSnapshot()
        for worker in workers { worker.metrics.accumulate(into: &total) }
        total.heldRequests = heldCount.value
        total.deferred = deferral.counters.snapshot
        if let totals = deferral.store?.totals {
            total.deferredQueueEntries = totals.entries
            total.deferredQueueBytes = totals.bytes
        }
        total.logDropped = accessLog?.dropped ?? 0
        return total
    }
}
