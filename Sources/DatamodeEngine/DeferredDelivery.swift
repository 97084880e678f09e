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

/// What the workers and the delivery need of deferral (SPEC §18.3): the store, the shared counters and where
/// `deferred` events go. Empty (no store) for a proxy run without one: refused uploads are then refused as before.
public struct DeferralWiring: Sendable {
    public var store: DeferredStore?
    public var counters: DeferralCounters
    public var events: (@Sendable (DeferredEntry, String) -> Void)?

    public init(store: DeferredStore? = nil, counters: DeferralCounters = DeferralCounters(),
                events: (@Sendable (DeferredEntry, String) -> Void)? = nil) {
        self.store = store
        self.counters = counters
        self.events = events
    }
}

/// Delivers stored uploads when their conditions lift (SPEC §18.3), on a thread of its own: never on a worker's
/// loop, and the store's disk work stays on the store's thread.
///
/// Each pass (every `passMilliseconds`, or at once when woken: a flush, a delivery that ended) expires what is
/// older than `max-age`, asks the store for what is due — oldest first, at most `concurrency` per origin counting
/// the deliveries running, judged by the mode its session (else the global scope) has now with the spent budgets
/// that match it — marks each `delivering` and hands it to a delivery thread (`DeliveryClient`). The origin's
/// answer ends it (`delivered` with its status; a `4xx` is final too); a connection failure or a `5xx` puts it
/// back with the store's backoff. A crash between the origin's answer and its record delivers it again at the
/// next start, with the same `Idempotency-Key` (at least once).
public final class DeferredDelivery: @unchecked Sendable {
    /// How often the queue is looked at when nothing wakes the delivery.
    static let passMilliseconds: Int64 = 200
    /// Most entries started per pass.
    static let batch = 64

    let store: DeferredStore
    let runtime: RuntimeState
    let budgets: BudgetLedger
    let counters: DeferralCounters
    let events: (@Sendable (DeferredEntry, String) -> Void)?
    let clock: any EngineClock
    let logger: Logger
    private let gate = DeliveryGate()
    private let state = Mutex(LoopState())
    private var thread = pthread_t()

    struct LoopState {
        var stopping = false
        var woken = false
        /// The flush under way, until every upload it covers has been started.
        var flush: Flush?
        var running = 0
        var lastExpiry: Int64 = 0
        var lastPurge: Int64 = 0
    }

    public init(store: DeferredStore, runtime: RuntimeState, budgets: BudgetLedger, wiring: DeferralWiring,
                clock: any EngineClock, logger: Logger) {
        self.store = store
        self.runtime = runtime
        self.budgets = budgets
        self.counters = wiring.counters
        self.events = wiring.events
        self.clock = clock
        self.logger = logger
    }

    /// Starts the delivery thread.
    public func start() {
        let context = Unmanaged.passRetained(self).toOpaque()
        let rc = pthread_create(&thread, nil, { context in
            let delivery = Unmanaged<DeferredDelivery>.fromOpaque(context!).takeRetainedValue()
            delivery.run()
            return nil
        }, context)
        if rc != 0 {
            Unmanaged<DeferredDelivery>.fromOpaque(context).release()
            logger.error("cannot start the deferred delivery thread", metadata: ["errno": "\(rc)"])
        }
    }

    /// Stops starting deliveries and waits for the thread (deliveries running are left to end or to be retried
    /// after the next start: they stay `delivering` in the store, which puts them back at open).
    public func stop() {
        state.withLock { $0.stopping = true }
        wake()
        pthread_join(thread, nil)
    }

    /// A flush covers the uploads queued when it was asked for (`queuedAt` up to `cutoff`): each is started once,
    /// whatever the mode and the backoff, within `concurrency` per origin; those `concurrency` holds back start as
    /// the running deliveries end, in later passes.
    struct Flush: Sendable {
        var cutoff: Int64
        /// The covered uploads started so far: one that fails goes back to the backoff, not straight back out.
        var started: Set<String> = []

        func covers(_ entry: DeferredEntry) -> Bool { entry.queuedAt <= cutoff && !started.contains(entry.id) }
    }

    /// `POST /deferred/flush`: every queued upload is delivered now, whatever the mode and the backoff. Returns
    /// how many are queued.
    public func flush() -> Int {
        let now = nowMilliseconds
        state.withLock { $0.flush = Flush(cutoff: now) }
        wake()
        return store.totals.entries
    }

    /// Looks at the queue now (something changed).
    public func wake() {
        gate.withLock {
            state.withLock { $0.woken = true }
            gate.broadcast()
        }
    }

    private func run() {
        while true {
            let stopping = state.withLock { $0.stopping }
            if stopping { return }
            pass()
            gate.withLock {
                let woken = state.withLock { state -> Bool in
                    defer { state.woken = false }
                    return state.woken || state.stopping
                }
                if !woken { gate.wait(milliseconds: Self.passMilliseconds) }
            }
        }
    }

    private var nowMilliseconds: Int64 { clock.wallNanoseconds() / 1_000_000 }

    /// One look at the queue.
    private func pass() {
        let now = nowMilliseconds
        let snapshot = runtime.load().snapshot
        let deferral = snapshot.configuration.deferral
        let (expireDue, purgeDue, flush) = state.withLock { state -> (Bool, Bool, Flush?) in
            let expire = now - state.lastExpiry >= 1000
            let purge = now - state.lastPurge >= 3_600_000
            if expire { state.lastExpiry = now }
            if purge { state.lastPurge = now }
            return (expire, purge, state.flush)
        }
        if expireDue {
            if case .success(let expired) = wait({ self.store.expire(now: now, maxAge: deferral.maxAge, completion: $0) }) {
                for entry in expired {
                    counters.count(.expired)
                    events?(entry, "expired")
                }
            }
        }
        if purgeDue { _ = wait({ self.store.purgeFinished(now: now, completion: $0) }) }

        let judge = DeferredJudge(runtime: runtime, budgets: budgets, clock: clock)
        // While a flush is under way the store is asked for everything queued: what it covers goes, the rest only
        // when its backoff is over and its mode lets it through, as in any pass.
        let admit: @Sendable (DeferredEntry) -> Bool = { entry in
            if let flush, flush.covers(entry) { return true }
            return flush == nil || entry.nextAttemptAt <= now ? judge.allows(entry) : false
        }
        let due: Result<[DeferredEntry], DeferredStoreError> = wait { completion in
            self.store.nextDue(now: flush == nil ? now : .max, concurrency: deferral.concurrency, limit: Self.batch,
                               admit: admit, completion: completion)
        }
        guard case .success(let entries) = due else {
            if case .failure(let error) = due { logger.error("deferral store", metadata: ["error": "\(error)"]) }
            return
        }
        var flushed: [String] = []
        for entry in entries {
            guard case .success(let started) = wait({ self.store.markDelivering(entry.id, now: now, completion: $0) })
            else { continue }
            if flush?.covers(entry) == true { flushed.append(entry.id) }
            deliver(started, settings: snapshot.configuration)
        }
        if let flush {
            state.withLock { state in
                // A newer flush replaced this one meanwhile: it covers these again, and starts over.
                guard state.flush?.cutoff == flush.cutoff else { return }
                state.flush?.started.formUnion(flushed)
                // Nothing covered was left to start and nothing runs: every upload the flush covered has gone.
                if entries.isEmpty && state.running == 0 { state.flush = nil }
            }
        }
    }

    /// Sends one entry on a thread of its own and records the outcome.
    private func deliver(_ entry: DeferredEntry, settings: ProxyConfiguration) {
        state.withLock { $0.running += 1 }
        let judge = DeferredJudge(runtime: runtime, budgets: budgets, clock: clock)
        let client = DeliveryClient(store: store, connectTimeout: settings.timeouts.upstreamConnect.milliseconds,
                                    responseTimeout: settings.timeouts.upstreamResponse.milliseconds,
                                    tags: settings.tags.forward ? judge.tags(entry) : nil,
                                    verifyTLS: settings.tls.upstreamVerify, offerH2: settings.http2.upstream)
        let job = DeliveryJob { [self] in
            let outcome = client.deliver(entry)
            record(entry, outcome)
            state.withLock { $0.running -= 1 }
            wake()
        }
        job.start(logger: logger)
    }

    private func record(_ entry: DeferredEntry, _ outcome: DeliveryClient.Outcome) {
        let now = nowMilliseconds
        switch outcome {
        case .answered(let status) where status < 500:
            if case .success(let done) = wait({ self.store.markDelivered(entry.id, originStatus: status, now: now, completion: $0) }) {
                counters.count(.delivered)
                events?(done, "delivered")
            }
        case .answered(let status):
            _ = wait { self.store.markRetry(entry.id, error: "origin answered \(status)", originStatus: status, now: now,
                                            completion: $0) }
        case .failed(let error):
            _ = wait { self.store.markRetry(entry.id, error: error, now: now, completion: $0) }
        case .unusable(let error):
            if case .success(let done) = wait({ self.store.markFailed(entry.id, error: error, now: now, completion: $0) }) {
                counters.count(.failed)
                events?(done, "failed")
            }
        }
        logger.info("deferred upload delivery", metadata: ["id": "\(entry.id)", "url": "\(entry.url)", "outcome": "\(outcome)"])
    }

    /// Runs a store operation and waits for its completion (on this thread, never a loop's).
    func wait<T: Sendable>(_ operation: (@escaping @Sendable (Result<T, DeferredStoreError>) -> Void) -> Void)
        -> Result<T, DeferredStoreError> {
        let box = DeliveryResultBox<T>()
        operation { result in box.put(result) }
        return box.take()
    }
}

/// Whether a stored upload's conditions have lifted (SPEC §18.3): judged as admission would judge it now — by its
/// session's mode (the global one when it has none, or when the session is gone), with the conditions of the spent
/// budgets matching its host joined, under the policy now — from its method, URL and stored fields. Runs on the
/// store thread.
struct DeferredJudge: Sendable {
    let runtime: RuntimeState
    let budgets: BudgetLedger
    let clock: any EngineClock

    /// The tags the upload resolves to under the policy now (the delivery writes them, SPEC §3); nil when invalid.
    func tags(_ entry: DeferredEntry) -> RequestTags? {
        guard case .success(let target) = RequestTarget.parse(entry.url, method: entry.method) else { return nil }
        let facts = RequestFacts(method: entry.method, url: target.absoluteURL, host: target.host, port: Int(target.port),
                                 path: target.path, isConnect: false, client: nil,
                                 fields: entry.headers.map { (name: $0.name, value: $0.value) })
        return try? resolveTags(facts, policy: runtime.load().snapshot.policy).get()
    }

    func allows(_ entry: DeferredEntry) -> Bool {
        guard case .success(let target) = RequestTarget.parse(entry.url, method: entry.method) else { return true }
        let snapshot = runtime.load().snapshot
        var mode = snapshot.mode
        if let session = entry.session, let scope = snapshot.sessions[session] { mode = scope.mode }
        let judgement = Admission.judgeBudgets(budgets, client: nil, host: target.host, mode: mode,
                                               now: clock.wallNanoseconds() / 1_000_000_000)
        if judgement.rejectedBy != nil { return false }
        let facts = RequestFacts(method: entry.method, url: target.absoluteURL, host: target.host, port: Int(target.port),
                                 path: target.path, isConnect: false, client: nil,
                                 fields: entry.headers.map { (name: $0.name, value: $0.value) })
        switch decide(facts, mode: judgement.mode, policy: snapshot.policy) {
        case .forward, .serveVariant: return true
        case .reject: return false
        case .invalidTag: return true  // it cannot get better by waiting; the origin may say what it thinks
        }
    }
}

/// A mutex and a condition variable at fixed addresses, with a timed wait.
final class DeliveryGate: @unchecked Sendable {
    private let mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
    private let condition = UnsafeMutablePointer<pthread_cond_t>.allocate(capacity: 1)

    init() {
        pthread_mutex_init(mutex, nil)
        pthread_cond_init(condition, nil)
    }

    deinit {
        pthread_cond_destroy(condition)
        pthread_mutex_destroy(mutex)
        condition.deallocate()
        mutex.deallocate()
    }

    func withLock<T>(_ body: () -> T) -> T {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return body()
    }

    /// Call inside `withLock`.
    func wait(milliseconds: Int64) {
        var deadline = timespec()
        clock_gettime(CLOCK_REALTIME, &deadline)
        let nanoseconds = Int(deadline.tv_nsec) + Int(milliseconds % 1000) * 1_000_000
        deadline.tv_sec += Int(milliseconds / 1000) + nanoseconds / 1_000_000_000
        deadline.tv_nsec = nanoseconds % 1_000_000_000
        _ = pthread_cond_timedwait(condition, mutex, &deadline)
    }

    func wait() { pthread_cond_wait(condition, mutex) }
    func broadcast() { pthread_cond_broadcast(condition) }
}

/// One store result, handed from the store thread to the thread waiting for it.
final class DeliveryResultBox<T: Sendable>: @unchecked Sendable {
    private let gate = DeliveryGate()
    private var result: Result<T, DeferredStoreError>?

    func put(_ value: Result<T, DeferredStoreError>) {
        gate.withLock {
            result = value
            gate.broadcast()
        }
    }

    func take() -> Result<T, DeferredStoreError> {
        gate.withLock {
            while result == nil { gate.wait() }
            return result!
        }
    }
}

/// A detached thread running one delivery.
final class DeliveryJob: @unchecked Sendable {
    let body: () -> Void

    init(_ body: @escaping () -> Void) {
        self.body = body
    }

    func start(logger: Logger) {
        var thread = pthread_t()
        let context = Unmanaged.passRetained(self).toOpaque()
        let rc = pthread_create(&thread, nil, { context in
            let job = Unmanaged<DeliveryJob>.fromOpaque(context!).takeRetainedValue()
            job.body()
            return nil
        }, context)
        if rc == 0 {
            pthread_detach(thread)
        } else {
            Unmanaged<DeliveryJob>.fromOpaque(context).release()
            logger.error("cannot start a delivery thread; running it on the delivery loop", metadata: ["errno": "\(rc)"])
            body()
        }
    }
}
