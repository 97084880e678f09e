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

    public init() throws(EngineError) {
        _ = ProxyServerProcess.setUp
        guard let base = event_base_new() else { throw EngineError("event_base_new failed") }
        self.base = base
    }

    deinit {
        watchers.removeAll()
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

    /// Runs until `stop()`.
    public func run() {
        event_base_dispatch(base)
    }

    /// Thread-safe.
    public func stop() {
        event_base_loopexit(base, nil)
    }
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
        // Locking callbacks, so another thread can wake a base (event_base_loopexit from the control thread).
        evthread_use_pthreads()
        // A peer closing mid-write must be an EPIPE error, not the end of the process.
        dm_ignore_sigpipe()
    }()
}
