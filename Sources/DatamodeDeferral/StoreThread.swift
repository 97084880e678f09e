#if canImport(Glibc)
import Glibc
#endif

/// A mutex and a condition variable, allocated once so their addresses never move (pthread objects must not).
final class Monitor: @unchecked Sendable {
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

    func withLock<R>(_ body: () throws -> R) rethrows -> R {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return try body()
    }

    /// Waits for a signal; call with the lock held (inside `withLock`), in a loop on the condition waited for.
    func wait() { pthread_cond_wait(condition, mutex) }

    func broadcast() { pthread_cond_broadcast(condition) }
}

/// The store's one thread and its queue: operations run there one after the other, in the order they were
/// submitted, so an operation sees every operation submitted before it.
///
/// The database is opened on this thread and never touched by another. A job is a closure given the database;
/// it calls its caller's completion itself, on this thread.
final class StoreThread: @unchecked Sendable {
    typealias Job = @Sendable (DeferredDatabase) -> Void

    private let monitor = Monitor()
    /// Guarded by `monitor`.
    private var jobs: [Job] = []
    /// Guarded by `monitor`: no job is accepted any more; the thread ends once `jobs` is empty.
    private var stopping = false
    /// Guarded by `monitor`: the outcome of opening the file, once known.
    private var opened: Result<(totals: DeferredTotals, recovered: Int), DeferredStoreError>?
    private var thread = pthread_t()
    private let path: String
    private let limits: DeferredStoreLimits

    /// Starts the thread and waits until it has opened and checked the file.
    init(path: String, limits: DeferredStoreLimits) throws(DeferredStoreError) {
        self.path = path
        self.limits = limits
        let context = Unmanaged.passRetained(self).toOpaque()
        let rc = pthread_create(&thread, nil, { context in
            let owner = Unmanaged<StoreThread>.fromOpaque(context!).takeRetainedValue()
            owner.main()
            return nil
        }, context)
        guard rc == 0 else {
            Unmanaged<StoreThread>.fromOpaque(context).release()
            throw .cannotOpen(path: path, detail: "cannot start the store thread: \(String(cString: strerror(rc)))")
        }
        let result = monitor.withLock { () -> Result<(totals: DeferredTotals, recovered: Int), DeferredStoreError> in
            while opened == nil { monitor.wait() }
            return opened!
        }
        if case .failure(let error) = result {
            pthread_join(thread, nil)
            throw error
        }
    }

    /// What opening found: the live totals and how many entries were put back from `delivering`.
    var openedState: (totals: DeferredTotals, recovered: Int) {
        monitor.withLock { (try? opened?.get()) ?? (DeferredTotals(entries: 0, bytes: 0), 0) }
    }

    /// Queues `job`; false when the thread is stopping (the job will never run).
    func submit(_ job: @escaping Job) -> Bool {
        monitor.withLock {
            guard !stopping else { return false }
            jobs.append(job)
            monitor.broadcast()
            return true
        }
    }

    /// Lets the queued jobs run, then ends the thread and closes the file; returns when it is closed.
    func stop() {
        let first = monitor.withLock {
            defer { stopping = true; monitor.broadcast() }
            return !stopping
        }
        // Stopped from a completion (on this very thread): the loop ends after the current batch, unjoined.
        guard first else { return }
        if pthread_equal(pthread_self(), thread) == 0 { pthread_join(thread, nil) } else { pthread_detach(thread) }
    }

    private func main() {
        let database: DeferredDatabase
        do throws(DeferredStoreError) {
            database = try DeferredDatabase(path: path, limits: limits)
        } catch {
            monitor.withLock {
                stopping = true
                opened = .failure(error)
                monitor.broadcast()
            }
            return
        }
        monitor.withLock {
            opened = .success((database.totals, database.recovered))
            monitor.broadcast()
        }
        while true {
            let batch = monitor.withLock { () -> [Job]? in
                while jobs.isEmpty && !stopping { monitor.wait() }
                if jobs.isEmpty { return nil }
                defer { jobs.removeAll(keepingCapacity: true) }
                return jobs
            }
            guard let batch else { break }
            for job in batch {
                job(database)
                // After the job's completion ran: a large WAL is copied into the database even while busy.
                database.checkpointIfDue(idle: false)
            }
            let idle = monitor.withLock { jobs.isEmpty }
            if idle { database.checkpointIfDue(idle: true) }
        }
        // `database` is released here: SQLite checkpoints the WAL and closes the file.
    }
}
