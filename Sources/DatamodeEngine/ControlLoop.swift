import CDatamodeShims
import CLibevent
#if canImport(Glibc)
import Glibc
#endif

/// The control plane's event loop, on the main thread: process signals (SIGHUP reload, SIGTERM/SIGINT stop)
/// and the admin API listener. Workers block these signals, so only this base receives them.
public final class ControlLoop: @unchecked Sendable {
    let base: OpaquePointer
    private var watchers: [SignalWatcher] = []
    private var tickers: [Ticker] = []

    public init() throws(EngineError) {
        _ = ProxyServerProcess.setUp
        guard let base = event_base_new() else { throw EngineError("event_base_new failed") }
        self.base = base
    }

    deinit {
        watchers.removeAll()
        tickers.removeAll()
        event_base_free(base)
    }

    /// Calls `handler` on this loop's thread whenever `signal` arrives.
    public func onSignal(_ signal: Int32, _ handler: @escaping (Int32) -> Void) {
        dm_unblock_process_signals()
        let watcher = SignalWatcher(handler: handler)
        watcher.event = dm_signal_new(base, signal, signalCallback, context(watcher))
        event_add(watcher.event, nil)
        watchers.append(watcher)
    }

    /// Calls `handler` on this loop's thread every `milliseconds` (budget period roll-over and persistence).
    public func every(milliseconds: Int64, _ handler: @escaping () -> Void) {
        let ticker = Ticker(handler: handler)
        ticker.event = event_new(base, -1, Int16(EV_PERSIST), controlTickCallback, context(ticker))
        dm_event_add_ms(ticker.event, milliseconds)
        tickers.append(ticker)
    }

    /// Runs until `stop()`.
    public func run() {
        event_base_dispatch(base)
    }

    /// Thread-safe.
    public func stop() {
        event_base_loopexit(base, nil)
    }

    /// A timer on this loop; `handler` runs on the loop's thread each time it fires. Keep the timer to keep it.
    public func timer(_ handler: @escaping () -> Void) -> ControlTimer {
        ControlTimer(base: base, handler: handler)
    }

    /// Runs `work` on this loop's thread soon. Thread-safe.
    public func post(_ work: @escaping @Sendable () -> Void) {
        let box = Unmanaged.passRetained(ControlPost(work)).toOpaque()
        if event_base_once(base, -1, Int16(EV_TIMEOUT), controlPostCallback, box, nil) != 0 {
            Unmanaged<ControlPost>.fromOpaque(box).release()
        }
    }
}

/// A one-shot timer of the control loop, re-armed by its owner (schedules, heartbeats, session expiry).
public final class ControlTimer {
    private var event: OpaquePointer?
    private let handler: () -> Void

    init(base: OpaquePointer, handler: @escaping () -> Void) {
        self.handler = handler
        event = dm_timer_new(base, controlTimerCallback, context(self))
    }

    deinit { if let event { event_free(event) } }

    /// Fires once after `milliseconds` (0: at the next loop iteration), replacing any earlier arming.
    public func schedule(milliseconds: Int64) {
        guard let event else { return }
        dm_event_add_ms(event, max(0, milliseconds))
    }

    public func cancel() {
        guard let event else { return }
        event_del(event)
    }

    func fired() { handler() }
}

final class ControlPost {
    let work: () -> Void
    init(_ work: @escaping () -> Void) { self.work = work }
    func run() { work() }
}

final class Ticker {
    let handler: () -> Void
    var event: OpaquePointer?
    init(handler: @escaping () -> Void) { self.handler = handler }
    deinit { if let event { event_free(event) } }
    func fired() { handler() }
}

final class SignalWatcher {
    let handler: (Int32) -> Void
    var event: OpaquePointer?
    init(handler: @escaping (Int32) -> Void) { self.handler = handler }
    deinit { if let event { event_free(event) } }
    func received(signal: Int32) { handler(signal) }
}

/// Process-wide libevent set-up, run once before any base exists.
enum ProxyServerProcess {
    static let setUp: Void = {
        // First: libevent's allocations from here on go through it (evbuffer chains reused per thread).
        dm_event_use_chain_cache()
        // Locking callbacks, so another thread can wake a base (event_base_loopexit from the control thread).
        evthread_use_pthreads()
        // A peer closing mid-write must be an EPIPE error, not the end of the process.
        dm_ignore_sigpipe()
    }()
}
