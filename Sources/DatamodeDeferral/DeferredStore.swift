import Synchronization

/// The durable store of deferred uploads (SPEC §18.3): one SQLite file in the state directory, and one thread
/// that does all the disk work.
///
/// ## Threading contract
/// - Every operation returns at once: it is queued for the store thread, which runs the operations one at a
///   time, in the order they were submitted (an operation sees the effects of every one submitted before it).
/// - `completion` runs **on the store thread**, after the operation's transaction has committed (or failed).
///   The engine must not touch its connections there: it hands the result to the worker that asked, e.g. with
///   a message to that worker's event loop, and carries it out on the loop. A completion must not block: the
///   next operation waits for it to return.
/// - The event loop never waits on the disk: nothing here blocks the caller except `init` (open and check the
///   file, at start-up, before any loop runs) and `close` (at shutdown).
/// - `totals` may be read from any thread at any time, without waiting (metrics).
/// - Once `close` has been called, operations are not run: their completions are called at once, on the calling
///   thread, with `.closed`.
///
/// ## Durability contract (the `202`)
/// `enqueue`'s completion is called with `.success` only after the transaction holding the entry and its body
/// has committed with `synchronous=FULL` (the WAL fsync'd): from then on the upload survives `SIGKILL`, a crash
/// and a power cut. The engine sends `202 Accepted` only from that success, never before; on `.failure` it
/// sends the refusal the request would have had (with `"deferral": "full"` when `error.isFull`), and nothing
/// of the upload is left in the store. The other writes (`mark…`, `cancel`, `expire`, `purgeFinished`) are
/// durable in the same way when their completions run.
public final class DeferredStore: Sendable {
    /// The store's file name in the state directory.
    public static let fileName = "deferred.sqlite"

    /// The file.
    public let path: String
    public let limits: DeferredStoreLimits
    /// Entries a crash had left `delivering`, put back to `queued` when the file was opened (at least once).
    public let recoveredAtOpen: Int
    private let thread: StoreThread
    private let totalsBox = TotalsBox()

    /// Opens the store at `path` (created when missing; its directory must exist), checks it
    /// (`PRAGMA quick_check`, the schema version) and puts entries left `delivering` back to `queued`.
    /// Blocks until done: call it at start-up. A damaged or foreign file is an error naming it, and start-up stops.
    public init(path: String, limits: DeferredStoreLimits) throws(DeferredStoreError) {
        self.path = path
        self.limits = limits
        thread = try StoreThread(path: path, limits: limits)
        let opened = thread.openedState
        recoveredAtOpen = opened.recovered
        totalsBox.publish(opened.totals)
    }

    deinit {
        thread.stop()
    }

    /// The live queue (`queued` and `delivering`), as of the last operation that finished. Never waits.
    public var totals: DeferredTotals { totalsBox.read() }

    /// Runs what is queued, then closes the file (SQLite copies the WAL into it). Blocks until closed.
    public func close() {
        thread.stop()
    }

    // MARK: Operations (each completion runs on the store thread)

    /// Stores `upload` as a new `queued` entry at `now` (wall-clock milliseconds since the epoch). Success means
    /// committed to disk: only then may the `202` be sent (see the type's durability contract). Failures:
    /// `.tooLarge` (over `maxBody`), `.full` (live bodies would exceed `maxBytes`), `.diskFull` (the file system
    /// is full; nothing stored before is lost) and errors of the file.
    public func enqueue(_ upload: DeferredUpload, now: Int64,
                        completion: @escaping @Sendable (Result<DeferredEntry, DeferredStoreError>) -> Void) {
        run(completion) { database throws(DeferredStoreError) in try database.enqueue(upload, now: now) }
    }

    /// A body to store while it arrives (SPEC §6: never held whole), under a new entry id: `appendBody` its pieces,
    /// then `enqueue(_:staged:now:completion:)`, or `discardBody`. Nothing is written until the first piece.
    public func stageBody() -> StagedBody {
        StagedBody(id: DeferralRules.newID())
    }

    /// Writes a piece of `staged`'s body to its file (not durable yet: the commit makes it so); the completion gets
    /// the bytes written so far. Failures: `.tooLarge` beyond `maxBody`, `.full` when the live bodies and this one
    /// would exceed `maxBytes`, `.diskFull`, errors of the file; the file is then removed, and the upload cannot be
    /// stored any more (its `enqueue` fails the same way).
    public func appendBody(_ staged: StagedBody, _ bytes: [UInt8],
                           completion: @escaping @Sendable (Result<Int, DeferredStoreError>) -> Void) {
        run(completion) { database throws(DeferredStoreError) in try database.appendBody(staged, bytes) }
    }

    /// Stores `upload` as `enqueue` does, its body the one written to `staged` (`upload.body` is not used): the
    /// body file is fsync'd, its name fsync'd, and only then the entry committed (the durability contract holds as
    /// for `enqueue`). The operations queued before it (every `appendBody`) have run by then.
    public func enqueue(_ upload: DeferredUpload, staged: StagedBody, now: Int64,
                        completion: @escaping @Sendable (Result<DeferredEntry, DeferredStoreError>) -> Void) {
        run(completion) { database throws(DeferredStoreError) in try database.enqueue(upload, staged: staged, now: now) }
    }

    /// Removes what was written of `staged` (the upload was refused or the client went away); nothing when its
    /// entry was committed meanwhile (the file is the entry's).
    public func discardBody(_ staged: StagedBody) {
        run({ (_: Result<Void, DeferredStoreError>) in }) { database in database.discardBody(staged) }
    }

    /// The entries to deliver now: `queued`, due (`nextAttemptAt <= now`), oldest first, at most `concurrency`
    /// per origin counting the deliveries already running, at most `limit`. `admit`, when given, runs on the store
    /// thread for each candidate in that order and says whether its conditions have lifted (the mode its session
    /// or the global scope would judge it by now, budgets included, lets it through); a refused one takes no slot.
    /// For `POST /deferred/flush` (deliver now whatever the mode), pass `admit: nil` and `now: .max` (backoff
    /// waits ignored). Nothing changes state: call `markDelivering` for each entry actually started.
    public func nextDue(now: Int64, concurrency: Int, limit: Int = 100,
                        admit: (@Sendable (DeferredEntry) -> Bool)? = nil,
                        completion: @escaping @Sendable (Result<[DeferredEntry], DeferredStoreError>) -> Void) {
        run(completion) { database throws(DeferredStoreError) in
            try database.nextDue(now: now, concurrency: concurrency, limit: limit, admit: admit)
        }
    }

    /// `queued` → `delivering` (attempts + 1), before the request is sent to the origin. `.wrongState` when the
    /// entry is not `queued` (already started, cancelled, expired): then it must not be sent.
    public func markDelivering(_ id: String, now: Int64,
                               completion: @escaping @Sendable (Result<DeferredEntry, DeferredStoreError>) -> Void) {
        run(completion) { database throws(DeferredStoreError) in try database.markDelivering(id, now: now) }
    }

    /// `delivering` → `delivered` once the origin answered, with its status (a `4xx` is final too); the body is
    /// dropped. A crash before this commits delivers the upload again (same `Idempotency-Key`).
    public func markDelivered(_ id: String, originStatus: Int, now: Int64,
                              completion: @escaping @Sendable (Result<DeferredEntry, DeferredStoreError>) -> Void) {
        run(completion) { database throws(DeferredStoreError) in
            try database.markDelivered(id, originStatus: originStatus, now: now)
        }
    }

    /// `delivering` → `queued` after a connection failure or a `5xx` (`originStatus`), due again after the
    /// backoff: 1 s after the first attempt, doubling, at most 5 min (`DeferralRules.backoffMilliseconds`).
    public func markRetry(_ id: String, error: String, originStatus: Int? = nil, now: Int64,
                          completion: @escaping @Sendable (Result<DeferredEntry, DeferredStoreError>) -> Void) {
        run(completion) { database throws(DeferredStoreError) in
            try database.markRetry(id, error: error, originStatus: originStatus, now: now)
        }
    }

    /// `queued` or `delivering` → `failed`, when retrying cannot help (`error` says why); the body is dropped.
    public func markFailed(_ id: String, error: String, now: Int64,
                           completion: @escaping @Sendable (Result<DeferredEntry, DeferredStoreError>) -> Void) {
        run(completion) { database throws(DeferredStoreError) in try database.markFailed(id, error: error, now: now) }
    }

    /// `queued` → `cancelled` (`DELETE /deferred/{id}`); the body is dropped. `.wrongState(delivering)` while a
    /// delivery runs, `.wrongState(<final>)` once finished, `.notFound` for an unknown id.
    public func cancel(_ id: String, now: Int64,
                       completion: @escaping @Sendable (Result<DeferredEntry, DeferredStoreError>) -> Void) {
        run(completion) { database throws(DeferredStoreError) in try database.cancel(id, now: now) }
    }

    /// Every `queued` entry stored `maxAge` or longer before `now` becomes `expired` (bodies dropped); the
    /// completion gets them (for `deferred` events).
    public func expire(now: Int64, maxAge: Duration,
                       completion: @escaping @Sendable (Result<[DeferredEntry], DeferredStoreError>) -> Void) {
        let age = Self.milliseconds(maxAge)
        run(completion) { database throws(DeferredStoreError) in try database.expire(now: now, maxAge: age) }
    }

    /// Removes finished entries that finished `keep` or longer before `now` (SPEC §18: kept 24 h for `GET`);
    /// the completion gets how many.
    public func purgeFinished(now: Int64, keep: Duration = .seconds(24 * 3600),
                              completion: @escaping @Sendable (Result<Int, DeferredStoreError>) -> Void) {
        let keep = Self.milliseconds(keep)
        run(completion) { database throws(DeferredStoreError) in try database.purgeFinished(now: now, keep: keep) }
    }

    /// One entry (without its body), or nil.
    public func get(_ id: String, completion: @escaping @Sendable (Result<DeferredEntry?, DeferredStoreError>) -> Void) {
        run(completion) { database throws(DeferredStoreError) in try database.get(id) }
    }

    /// Entries oldest first (without bodies), only those in `statuses` when given, at most `limit`.
    public func list(statuses: Set<DeferredStatus>? = nil, limit: Int = 10_000,
                     completion: @escaping @Sendable (Result<[DeferredEntry], DeferredStoreError>) -> Void) {
        run(completion) { database throws(DeferredStoreError) in try database.list(statuses: statuses, limit: limit) }
    }

    /// Up to `count` bytes of a live entry's body from `offset`: a delivery reads a large body in pieces as the
    /// origin takes them, never all of it at once. Empty at the end.
    public func readBody(_ id: String, offset: Int, count: Int,
                         completion: @escaping @Sendable (Result<[UInt8], DeferredStoreError>) -> Void) {
        run(completion) { database throws(DeferredStoreError) in try database.readBody(id, offset: offset, count: count) }
    }

    // MARK: Plumbing

    private func run<T>(_ completion: @escaping @Sendable (Result<T, DeferredStoreError>) -> Void,
                        _ operation: @escaping @Sendable (DeferredDatabase) throws(DeferredStoreError) -> T) {
        let totals = totalsBox
        let accepted = thread.submit { database in
            let result: Result<T, DeferredStoreError>
            do throws(DeferredStoreError) {
                result = .success(try operation(database))
            } catch {
                result = .failure(error)
            }
            // Before the completion: a completion that reads `totals` sees its own operation counted.
            totals.publish(database.totals)
            completion(result)
        }
        if !accepted { completion(.failure(.closed)) }
    }

    static func milliseconds(_ duration: Duration) -> Int64 {
        let (seconds, attoseconds) = duration.components
        return seconds * 1000 + attoseconds / 1_000_000_000_000_000
    }
}

/// The live totals, written by the store thread, read by anyone (metrics): two relaxed atomics, so a reader may
/// see the entries of one operation with the bytes of the next, never a torn number.
final class TotalsBox: Sendable {
    private let entries = Atomic<Int>(0)
    private let bytes = Atomic<UInt64>(0)

    func publish(_ totals: DeferredTotals) {
        entries.store(totals.entries, ordering: .relaxed)
        bytes.store(totals.bytes, ordering: .relaxed)
    }

    func read() -> DeferredTotals {
        DeferredTotals(entries: entries.load(ordering: .relaxed), bytes: bytes.load(ordering: .relaxed))
    }
}
