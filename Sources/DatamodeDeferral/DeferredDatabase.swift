import CSQLite
import DatamodeHTTP
#if canImport(Glibc)
import Glibc
#endif

/// The store's file and every operation on it, synchronous. Not thread-safe: `DeferredStore` owns one and runs
/// it on its own thread only. Tests may use one directly on one thread.
///
/// The file: one SQLite database, WAL journal with `synchronous=FULL` (each commit is on disk before it returns),
/// `locking_mode=EXCLUSIVE` (one process at a time). Entries and inline bodies are two tables: an entry's status
/// changes often, and SQLite rewrites a whole row on every UPDATE, so a body in the entry's row would be written
/// again at each change; in its own table it is written once and deleted once. Bodies larger than
/// `limits.inlineBody` live in files beside the database (`BodyFiles`), written and fsync'd before the entry that
/// names them is committed.
final class DeferredDatabase {
    /// `PRAGMA user_version` of the schema below. A file with a larger one was written by a newer build.
    static let schemaVersion = 1
    /// `PRAGMA application_id`: "DMDF". Tells a deferral store from any other SQLite file.
    static let applicationID: Int32 = 0x444D_4446

    /// Checkpoint the WAL into the database once it holds this many pages (4 KiB each: 16 MiB), even while
    /// operations keep coming: a WAL is read through on every lookup, and SQLite's own automatic checkpoint
    /// (which would run inside a commit, before its caller hears of it) is replaced by these two.
    static let busyCheckpointPages = 4096
    /// When no operation is waiting, checkpoint from this many pages (4 MiB): small commits are copied in batches.
    static let idleCheckpointPages = 1024

    let path: String
    let limits: DeferredStoreLimits
    private let db: SQLiteConnection
    private var files: BodyFiles!
    private var statements: Statements!
    /// The live entries (queued, delivering) and their body bytes, kept in step with every commit.
    private(set) var totals = DeferredTotals(entries: 0, bytes: 0)
    /// Entries put back from `delivering` to `queued` when the file was opened.
    private(set) var recovered = 0
    /// Pages in the WAL since the last checkpoint, as the WAL hook reports them.
    fileprivate(set) var walPages = 0
    /// Body files no entry named, removed when the file was opened (a crash between a body file and its commit,
    /// or between an entry's end and its file's removal).
    private(set) var sweptFiles = 0

    /// The directory of the large bodies of the database at `path`.
    static func bodyDirectory(of path: String) -> String { path + "-bodies" }

    private static let schema = """
        CREATE TABLE entries (
            seq INTEGER PRIMARY KEY,
            id TEXT NOT NULL UNIQUE,
            status TEXT NOT NULL CHECK (status IN ('queued', 'delivering', 'delivered', 'failed', 'expired', 'cancelled')),
            method TEXT NOT NULL,
            url TEXT NOT NULL,
            origin TEXT NOT NULL,
            session TEXT,
            idempotency_key TEXT NOT NULL,
            bytes INTEGER NOT NULL CHECK (bytes >= 0),
            attempts INTEGER NOT NULL DEFAULT 0,
            last_error TEXT,
            origin_status INTEGER,
            queued_at INTEGER NOT NULL,
            next_attempt_at INTEGER NOT NULL,
            delivered_at INTEGER,
            finished_at INTEGER,
            body_file INTEGER NOT NULL CHECK (body_file IN (0, 1)),
            headers BLOB NOT NULL
        ) STRICT;
        CREATE INDEX entries_by_status ON entries (status, next_attempt_at);
        CREATE INDEX entries_by_finish ON entries (finished_at) WHERE finished_at IS NOT NULL;
        CREATE TABLE bodies (
            seq INTEGER PRIMARY KEY,
            data BLOB NOT NULL
        ) STRICT;
        """

    private static let entryColumns = """
        id, method, url, origin, headers, bytes, session, idempotency_key, status, attempts, last_error,
        origin_status, queued_at, next_attempt_at, delivered_at, finished_at, seq, body_file
        """

    /// Opens the store at `path` (creating it when missing), checks it, and puts entries a crash left
    /// `delivering` back to `queued`. `path`'s directory must exist.
    init(path: String, limits: DeferredStoreLimits) throws(DeferredStoreError) {
        self.path = path
        self.limits = limits
        try Self.checkHeader(path)
        db = try SQLiteConnection(path: path)
        do throws(DeferredStoreError) {
            try configureAndCheck()
            statements = try Statements(db)
            files = try BodyFiles(directory: Self.bodyDirectory(of: path))
            try recover()
            try checkBodyFiles()
        } catch {
            // Our application id and version, but not our tables: not something this code wrote.
            if case .io(_, let detail) = error, detail.contains("no such table") || detail.contains("no such column") {
                throw .foreign(path: path, detail: "the schema is not the deferral store's (\(detail))")
            }
            throw error
        }
    }

    deinit {
        files?.close()
        // Statements first: the connection closes (checkpointing the WAL into the database and removing it) once
        // none is left.
        statements = nil
    }

    // MARK: Opening

    /// A file that exists must start like an SQLite database: SQLite itself would only say "file is not a
    /// database" at the first statement, without telling garbage from a truncated file.
    private static func checkHeader(_ path: String) throws(DeferredStoreError) {
        let directory = path.split(separator: "/", omittingEmptySubsequences: false).dropLast().joined(separator: "/")
        var info = stat()
        if !directory.isEmpty {
            guard stat(directory, &info) == 0, (info.st_mode & S_IFMT) == S_IFDIR else {
                throw .cannotOpen(path: path, detail: "the directory \(directory) does not exist")
            }
        }
        guard stat(path, &info) == 0 else { return }
        guard (info.st_mode & S_IFMT) == S_IFREG else { throw .cannotOpen(path: path, detail: "not a regular file") }
        guard info.st_size > 0 else { return }
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw .cannotOpen(path: path, detail: String(cString: strerror(errno))) }
        defer { close(fd) }
        var header = [UInt8](repeating: 0, count: 100)
        let count = header.withUnsafeMutableBytes { read(fd, $0.baseAddress, 100) }
        let magic = Array("SQLite format 3\0".utf8)
        guard count == 100, Array(header[0..<16]) == magic else { throw .notADatabase(path: path) }
    }

    private func configureAndCheck() throws(DeferredStoreError) {
        // One process at a time: the lock is taken at the first read below and kept until close. With it, the WAL
        // index lives in this process's memory (no -shm file).
        try db.execute("PRAGMA locking_mode = EXCLUSIVE")
        let schemaObjects = try db.integer("SELECT count(*) FROM sqlite_schema")
        let application = Int32(truncatingIfNeeded: try db.integer("PRAGMA application_id"))
        let version = Int(try db.integer("PRAGMA user_version"))
        let isNew = schemaObjects == 0 && application == 0 && version == 0
        if !isNew {
            guard application == Self.applicationID else {
                throw .foreign(path: path, detail: "an SQLite database of another application (application_id \(application))")
            }
            guard version <= Self.schemaVersion else { throw .newerSchema(path: path, version: version) }
        }
        guard try db.text("PRAGMA journal_mode = WAL")?.lowercased() == "wal" else {
            throw .io(path: path, detail: "cannot switch to the WAL journal")
        }
        // Every commit waits for the WAL's fsync: once `enqueue` reports success the upload survives a crash or a
        // power cut (SPEC §18.3: the 202 follows the durable commit).
        try db.execute("PRAGMA synchronous = FULL")
        // Debian builds SQLite with SECURE_DELETE on, which zeroes freed pages: dropping a delivered 64 MiB body
        // would write 64 MiB. FAST zeroes only what costs no extra I/O (b-tree pages, not freed overflow pages).
        try db.execute("PRAGMA secure_delete = FAST")
        // After a checkpoint the WAL is cut back to this size (a 64 MiB body makes it grow that much).
        try db.execute("PRAGMA journal_size_limit = \(8 << 20)")
        try db.execute("PRAGMA cache_size = -8192")
        installWALHook()
        let check = try db.text("PRAGMA quick_check") ?? "no answer"
        guard check == "ok" else { throw .corrupt(path: path, detail: "quick_check: \(check)") }
        if isNew {
            try db.execute("BEGIN IMMEDIATE")
            do throws(DeferredStoreError) {
                try db.execute(Self.schema)
                try db.execute("PRAGMA application_id = \(Self.applicationID)")
                try db.execute("PRAGMA user_version = \(Self.schemaVersion)")
                try db.execute("COMMIT")
            } catch {
                _ = try? db.execute("ROLLBACK")
                throw error
            }
        }
        // The database and WAL files may just have been created: their directory entries must be on disk too.
        Self.syncDirectory(of: path)
    }

    private func installWALHook() {
        let context = Unmanaged.passUnretained(self).toOpaque()
        sqlite3_wal_hook(db.handle, { context, _, _, pages in
            let database = Unmanaged<DeferredDatabase>.fromOpaque(context!).takeUnretainedValue()
            database.walPages = Int(pages)
            return SQLITE_OK
        }, context)
    }

    static func syncDirectory(of path: String) {
        let parts = path.split(separator: "/", omittingEmptySubsequences: false).dropLast()
        let directory = parts.isEmpty ? "." : (parts.joined(separator: "/").isEmpty ? "/" : parts.joined(separator: "/"))
        let fd = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { return }
        fsync(fd)
        close(fd)
    }

    /// At least once: what was being delivered when the process died goes back to the queue (its attempt counted).
    private func recover() throws(DeferredStoreError) {
        try transaction { () throws(DeferredStoreError) in
            try statements.recoverDelivering.run()
            recovered = db.changes
        }
        let live = statements.liveTotals
        defer { live.reset() }
        if try live.step() { totals = DeferredTotals(entries: Int(live.int64(0)), bytes: UInt64(live.int64(1))) }
    }

    /// Every live entry with a body file has it, whole; files no live entry names are removed.
    private func checkBodyFiles() throws(DeferredStoreError) {
        var keep = Set<String>()
        let select = statements.liveBodyFiles
        defer { select.reset() }
        while try select.step() {
            let id = select.text(0)
            let bytes = Int(select.int64(1))
            keep.insert(id)
            guard let size = files.size(id) else {
                throw .corrupt(path: files.path(id), detail: "the body of deferred upload \(id) is missing")
            }
            guard size == bytes else {
                throw .corrupt(path: files.path(id), detail: "the body of deferred upload \(id) has \(size) bytes, not \(bytes)")
            }
        }
        sweptFiles = files.sweep(keeping: keep)
    }

    // MARK: Operations

    /// Stores `upload` as a new `queued` entry and returns it once committed (on disk: WAL fsync'd). Refuses
    /// with `.tooLarge` beyond `maxBody`, `.full` beyond `maxBytes`, `.diskFull` when the file system is full;
    /// a refused upload leaves nothing behind.
    func enqueue(_ upload: DeferredUpload, now: Int64) throws(DeferredStoreError) -> DeferredEntry {
        try enqueue(upload, id: DeferralRules.newID(), size: upload.body.count, staged: nil, now: now)
    }

    /// Appends `bytes` to `staged`'s body file (created with the first piece) and returns the bytes written so far.
    /// Refuses with `.tooLarge` beyond `maxBody` and `.full` when the live bodies and this one would exceed
    /// `maxBytes` (known before the upload ends: the client is refused without sending the rest); any failure
    /// removes the file, and every later operation on `staged` fails the same way.
    func appendBody(_ staged: StagedBody, _ bytes: [UInt8]) throws(DeferredStoreError) -> Int {
        if let failure = staged.failure { throw failure }
        do throws(DeferredStoreError) {
            let size = staged.written + bytes.count
            guard size <= limits.maxBody else { throw .tooLarge(bytes: size, maxBody: limits.maxBody) }
            guard totals.bytes + UInt64(size) <= limits.maxBytes else { throw .full(bytes: totals.bytes, maxBytes: limits.maxBytes) }
            if staged.fd < 0 { staged.fd = try files.create(staged.id) }
            try files.append(staged.id, staged.fd, bytes)
            staged.written = size
            return size
        } catch {
            discardBody(staged)
            staged.failure = error
            throw error
        }
    }

    /// Stores `upload` (its `body` unused) with the body `staged` holds: the file is made durable, then the entry
    /// committed, as `enqueue` does with a body it writes whole.
    func enqueue(_ upload: DeferredUpload, staged: StagedBody, now: Int64) throws(DeferredStoreError) -> DeferredEntry {
        if let failure = staged.failure { throw failure }
        if staged.fd < 0 { staged.fd = try files.create(staged.id) }
        return try enqueue(upload, id: staged.id, size: staged.written, staged: staged, now: now)
    }

    /// Closes and removes `staged`'s file, unless its entry was committed (the file is the entry's then); it
    /// cannot be stored after that.
    func discardBody(_ staged: StagedBody) {
        guard !staged.committed else { return }
        if staged.fd >= 0 {
            _ = Glibc.close(staged.fd)
            staged.fd = -1
        }
        files.remove(staged.id)
        if staged.failure == nil { staged.failure = .io(path: files.path(staged.id), detail: "the body was discarded") }
    }

    /// The entry of `upload` under `id`, its body `size` bytes: `upload.body`, or the open file of `staged`.
    private func enqueue(_ upload: DeferredUpload, id: String, size: Int, staged: StagedBody?,
                         now: Int64) throws(DeferredStoreError) -> DeferredEntry {
        do throws(DeferredStoreError) {
            guard size <= limits.maxBody else { throw .tooLarge(bytes: size, maxBody: limits.maxBody) }
            guard totals.bytes + UInt64(size) <= limits.maxBytes else { throw .full(bytes: totals.bytes, maxBytes: limits.maxBytes) }
        } catch {
            if let staged { discardBody(staged) }
            throw error
        }
        let entry = DeferredEntry(
            id: id, method: upload.method, url: upload.url, origin: DeferralRules.origin(of: upload.url),
            headers: upload.headers, bytes: size, session: upload.session,
            idempotencyKey: DeferralRules.idempotencyKey(in: upload.headers) ?? id, status: .queued, attempts: 0,
            lastError: nil, originStatus: nil, queuedAt: now, nextAttemptAt: now, deliveredAt: nil, finishedAt: nil)
        let inFile = staged != nil || size > limits.inlineBody
        // A large body is on disk, whole, before the entry naming it is committed.
        if let staged {
            let fd = staged.fd
            staged.fd = -1
            do throws(DeferredStoreError) {
                try files.seal(id, fd)
            } catch {
                staged.failure = error
                throw error
            }
        } else if inFile {
            try files.write(id, upload.body)
        }
        do throws(DeferredStoreError) {
            try transaction { () throws(DeferredStoreError) in
                let insert = statements.insertEntry
                insert.bind(1, entry.id)
                insert.bind(2, entry.method)
                insert.bind(3, entry.url)
                insert.bind(4, entry.origin)
                insert.bind(5, entry.session)
                insert.bind(6, entry.idempotencyKey)
                insert.bind(7, Int64(size))
                insert.bind(8, now)
                insert.bind(9, copying: HeaderCoding.encode(entry.headers))
                insert.bind(10, Int64(inFile ? 1 : 0))
                try insert.run()
                guard !inFile else { return }
                let seq = db.lastInsertRowID
                let body = statements.insertBody
                body.bind(1, seq)
                try body.withBound(2, borrowing: upload.body) { () throws(DeferredStoreError) in try body.run() }
            }
        } catch {
            if inFile { files.remove(id) }
            staged?.failure = error
            throw error
        }
        staged?.committed = true
        totals.entries += 1
        totals.bytes += UInt64(size)
        return entry
    }

    /// Entries that may be delivered at `now`: `queued`, their `nextAttemptAt` reached, oldest first, and per
    /// origin no more than `concurrency` minus the deliveries already running there. `admit` (nil: all) is asked
    /// about each candidate in that order: an entry it refuses (its conditions still hold) takes no slot.
    func nextDue(now: Int64, concurrency: Int, limit: Int, admit: ((DeferredEntry) -> Bool)?) throws(DeferredStoreError) -> [DeferredEntry] {
        var running: [String: Int] = [:]
        let busy = statements.deliveringByOrigin
        defer { busy.reset() }
        while try busy.step() { running[busy.text(0)] = Int(busy.int64(1)) }
        var out: [DeferredEntry] = []
        let due = statements.due
        defer { due.reset() }
        due.bind(1, now)
        while out.count < limit, try due.step() {
            let origin = due.text(3)
            guard running[origin, default: 0] < concurrency else { continue }
            let entry = try readEntry(due)
            if let admit, !admit(entry) { continue }
            running[origin, default: 0] += 1
            out.append(entry)
        }
        return out
    }

    /// `queued` → `delivering`, counting the attempt. Only a `queued` entry can start a delivery: a second
    /// `markDelivering` of the same entry fails, so one upload is never sent twice at once.
    func markDelivering(_ id: String, now: Int64) throws(DeferredStoreError) -> DeferredEntry {
        try transition(id, from: [.queued]) { () throws(DeferredStoreError) in
            let update = statements.markDelivering
            update.bind(1, id)
            try update.run()
        }
    }

    /// `delivering` → `delivered` with the origin's status (any: a `4xx` is final too); the body is dropped.
    func markDelivered(_ id: String, originStatus: Int, now: Int64) throws(DeferredStoreError) -> DeferredEntry {
        try finish(id, from: [.delivering], to: .delivered, now: now, error: nil, originStatus: originStatus)
    }

    /// `delivering` → `queued` after a connection failure or a `5xx`: the next attempt waits
    /// `DeferralRules.backoffMilliseconds(afterAttempts:)` (1 s doubling to 5 min).
    func markRetry(_ id: String, error: String, originStatus: Int?, now: Int64) throws(DeferredStoreError) -> DeferredEntry {
        var delay: Int64 = 0
        return try transition(id, from: [.delivering]) { () throws(DeferredStoreError) in
            let attempts = try currentAttempts(id)
            delay = DeferralRules.backoffMilliseconds(afterAttempts: attempts)
            let update = statements.markRetry
            update.bind(1, error)
            update.bind(2, originStatus.map(Int64.init))
            update.bind(3, now + delay)
            update.bind(4, id)
            try update.run()
        }
    }

    /// `queued` or `delivering` → `failed`, for a reason retrying cannot fix; the body is dropped.
    func markFailed(_ id: String, error: String, now: Int64) throws(DeferredStoreError) -> DeferredEntry {
        try finish(id, from: [.queued, .delivering], to: .failed, now: now, error: error, originStatus: nil)
    }

    /// `queued` → `cancelled` (`DELETE /deferred/{id}`); the body is dropped. A delivery already running is not
    /// cancelled (`.wrongState(delivering)`): its request may have reached the origin.
    func cancel(_ id: String, now: Int64) throws(DeferredStoreError) -> DeferredEntry {
        try finish(id, from: [.queued], to: .cancelled, now: now, error: nil, originStatus: nil)
    }

    /// Every `queued` entry stored at or before `now - maxAge` becomes `expired`; returns them. Entries being
    /// delivered are left to finish (a failure puts them back to `queued`, and the next call expires them).
    func expire(now: Int64, maxAge: Int64) throws(DeferredStoreError) -> [DeferredEntry] {
        var ids: [String] = []
        let old = statements.expiredCandidates
        old.bind(1, now - maxAge)
        do {
            defer { old.reset() }
            while try old.step() { ids.append(old.text(0)) }
        }
        guard !ids.isEmpty else { return [] }
        var out: [(entry: DeferredEntry, inFile: Bool)] = []
        try transaction { () throws(DeferredStoreError) in
            for id in ids { out.append(try finishInTransaction(id, to: .expired, now: now, error: nil, originStatus: nil)) }
        }
        for (entry, inFile) in out {
            if inFile { files.remove(entry.id) }
            totals.entries -= 1
            totals.bytes -= UInt64(entry.bytes)
        }
        return out.map(\.entry)
    }

    /// Removes the finished entries (delivered, failed, expired, cancelled) that finished at or before
    /// `now - keep`; returns how many.
    func purgeFinished(now: Int64, keep: Int64) throws(DeferredStoreError) -> Int {
        try transaction { () throws(DeferredStoreError) in
            let purge = statements.purge
            purge.bind(1, now - keep)
            try purge.run()
            return db.changes
        }
    }

    /// One entry, or nil.
    func get(_ id: String) throws(DeferredStoreError) -> DeferredEntry? {
        let select = statements.byID
        defer { select.reset() }
        select.bind(1, id)
        guard try select.step() else { return nil }
        return try readEntry(select)
    }

    /// Entries oldest first, optionally only those in `statuses`, at most `limit`.
    func list(statuses: Set<DeferredStatus>?, limit: Int) throws(DeferredStoreError) -> [DeferredEntry] {
        let select = statements.all
        defer { select.reset() }
        var out: [DeferredEntry] = []
        while out.count < limit, try select.step() {
            if let statuses, let status = DeferredStatus(rawValue: select.text(8)), !statuses.contains(status) { continue }
            out.append(try readEntry(select))
        }
        return out
    }

    /// Up to `count` bytes of `id`'s body from `offset` (fewer at the end; none past it). Only a live entry has
    /// a body: a finished one is `.wrongState`.
    func readBody(_ id: String, offset: Int, count: Int) throws(DeferredStoreError) -> [UInt8] {
        let select = statements.seqByID
        select.bind(1, id)
        let found: (seq: Int64, status: String, inFile: Bool)?
        do {
            defer { select.reset() }
            found = try select.step() ? (select.int64(0), select.text(1), select.int64(2) != 0) : nil
        }
        guard let found else { throw .notFound(id: id) }
        let status = DeferredStatus(rawValue: found.status) ?? .failed
        guard status.isLive else { throw .wrongState(id: id, status: status) }
        if found.inFile { return try files.read(id, offset: offset, count: count) }
        return try db.readBlob(table: "bodies", column: "data", rowid: found.seq, offset: offset, count: count)
    }

    /// Copies the WAL into the database file when it is worth it (see `busyCheckpointPages`); run after an
    /// operation's completion, never inside its commit. The next write starts the WAL over and cuts it back to
    /// `journal_size_limit`. Returns whether it checkpointed. A failure (a full disk) is left for the next call:
    /// the WAL still holds every commit.
    @discardableResult
    func checkpointIfDue(idle: Bool) -> Bool {
        guard walPages >= (idle ? Self.idleCheckpointPages : Self.busyCheckpointPages) else { return false }
        guard (try? db.execute("PRAGMA wal_checkpoint(PASSIVE)")) != nil else { return false }
        walPages = 0
        return true
    }

    /// Recounts the live totals from the file (for tests: they must equal the running `totals`).
    func countLive() throws(DeferredStoreError) -> DeferredTotals {
        let live = statements.liveTotals
        defer { live.reset() }
        guard try live.step() else { return DeferredTotals(entries: 0, bytes: 0) }
        return DeferredTotals(entries: Int(live.int64(0)), bytes: UInt64(live.int64(1)))
    }

    /// Caps the database at `pages` pages (`PRAGMA max_page_count`, this connection only): a write beyond it
    /// fails with SQLITE_FULL exactly as on a full file system. For tests without a small file system to fill.
    func limitPages(_ pages: Int) throws(DeferredStoreError) {
        try db.execute("PRAGMA max_page_count = \(pages)")
    }

    /// Pages in the database (WAL included).
    func pageCount() throws(DeferredStoreError) -> Int { Int(try db.integer("PRAGMA page_count")) }

    // MARK: Helpers

    /// Runs `body` in one write transaction: all of it is committed (and fsync'd) or none of it.
    private func transaction<R>(_ body: () throws(DeferredStoreError) -> R) throws(DeferredStoreError) -> R {
        try statements.begin.run()
        do throws(DeferredStoreError) {
            let result = try body()
            try statements.commit.run()
            return result
        } catch {
            if db.inTransaction { _ = try? statements.rollback.run() }
            throw error
        }
    }

    /// Checks `id`'s state is one of `from`, runs `change` in the same transaction and returns the entry after it.
    private func transition(_ id: String, from: Set<DeferredStatus>, _ change: () throws(DeferredStoreError) -> Void) throws(DeferredStoreError) -> DeferredEntry {
        try transaction { () throws(DeferredStoreError) in
            try requireStatus(id, in: from)
            try change()
            guard let entry = try get(id) else { throw .notFound(id: id) }
            return entry
        }
    }

    private func finish(_ id: String, from: Set<DeferredStatus>, to status: DeferredStatus, now: Int64, error: String?,
                        originStatus: Int?) throws(DeferredStoreError) -> DeferredEntry {
        let (entry, inFile) = try transaction { () throws(DeferredStoreError) in
            try requireStatus(id, in: from)
            return try finishInTransaction(id, to: status, now: now, error: error, originStatus: originStatus)
        }
        // After the commit: a crash before this leaves a file of a finished entry, which the next open sweeps.
        if inFile { files.remove(id) }
        totals.entries -= 1
        totals.bytes -= UInt64(entry.bytes)
        return entry
    }

    /// Ends a live entry: its status, times, error and origin status, and its inline body deleted. Returns the
    /// entry and whether its body is a file (to remove once this transaction has committed).
    private func finishInTransaction(_ id: String, to status: DeferredStatus, now: Int64, error: String?,
                                     originStatus: Int?) throws(DeferredStoreError) -> (DeferredEntry, Bool) {
        let update = statements.finish
        update.bind(1, status.rawValue)
        update.bind(2, now)
        update.bind(3, status == .delivered ? now : nil)
        update.bind(4, error)
        update.bind(5, originStatus.map(Int64.init))
        update.bind(6, id)
        try update.run()
        let drop = statements.deleteBody
        drop.bind(1, id)
        try drop.run()
        let select = statements.byID
        defer { select.reset() }
        select.bind(1, id)
        guard try select.step() else { throw .notFound(id: id) }
        return (try readEntry(select), select.int64(17) != 0)
    }

    private func requireStatus(_ id: String, in allowed: Set<DeferredStatus>) throws(DeferredStoreError) {
        let select = statements.seqByID
        defer { select.reset() }
        select.bind(1, id)
        guard try select.step() else { throw .notFound(id: id) }
        guard let status = DeferredStatus(rawValue: select.text(1)) else {
            throw .corrupt(path: path, detail: "entry \(id) has an unknown status \(select.text(1))")
        }
        guard allowed.contains(status) else { throw .wrongState(id: id, status: status) }
    }

    private func currentAttempts(_ id: String) throws(DeferredStoreError) -> Int {
        guard let entry = try get(id) else { throw .notFound(id: id) }
        return entry.attempts
    }

    /// An entry from a row of `entryColumns`.
    private func readEntry(_ row: Statement) throws(DeferredStoreError) -> DeferredEntry {
        let id = row.text(0)
        guard let headers = HeaderCoding.decode(row.blob(4)) else {
            throw .corrupt(path: path, detail: "entry \(id): its headers cannot be read")
        }
        guard let status = DeferredStatus(rawValue: row.text(8)) else {
            throw .corrupt(path: path, detail: "entry \(id) has an unknown status \(row.text(8))")
        }
        return DeferredEntry(
            id: id, method: row.text(1), url: row.text(2), origin: row.text(3), headers: headers,
            bytes: Int(row.int64(5)), session: row.optionalText(6), idempotencyKey: row.text(7), status: status,
            attempts: Int(row.int64(9)), lastError: row.optionalText(10), originStatus: row.optionalInt64(11).map(Int.init),
            queuedAt: row.int64(12), nextAttemptAt: row.int64(13), deliveredAt: row.optionalInt64(14),
            finishedAt: row.optionalInt64(15))
    }

    /// Every statement, prepared once at open.
    private struct Statements {
        let begin, commit, rollback: Statement
        let insertEntry, insertBody: Statement
        let recoverDelivering, liveTotals, liveBodyFiles: Statement
        let deliveringByOrigin, due: Statement
        let byID, seqByID, all: Statement
        let markDelivering, markRetry, finish, deleteBody: Statement
        let expiredCandidates, purge: Statement

        init(_ db: SQLiteConnection) throws(DeferredStoreError) {
            let columns = DeferredDatabase.entryColumns
            begin = try db.prepare("BEGIN IMMEDIATE")
            commit = try db.prepare("COMMIT")
            rollback = try db.prepare("ROLLBACK")
            insertEntry = try db.prepare("""
                INSERT INTO entries (id, status, method, url, origin, session, idempotency_key, bytes, queued_at,
                                     next_attempt_at, headers, body_file)
                VALUES (?1, 'queued', ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?8, ?9, ?10)
                """)
            insertBody = try db.prepare("INSERT INTO bodies (seq, data) VALUES (?1, ?2)")
            recoverDelivering = try db.prepare("UPDATE entries SET status = 'queued' WHERE status = 'delivering'")
            liveTotals = try db.prepare("""
                SELECT count(*), coalesce(sum(bytes), 0) FROM entries WHERE status IN ('queued', 'delivering')
                """)
            liveBodyFiles = try db.prepare("""
                SELECT id, bytes FROM entries WHERE body_file = 1 AND status IN ('queued', 'delivering')
                """)
            deliveringByOrigin = try db.prepare("""
                SELECT origin, count(*) FROM entries WHERE status = 'delivering' GROUP BY origin
                """)
            due = try db.prepare("""
                SELECT \(columns) FROM entries WHERE status = 'queued' AND next_attempt_at <= ?1 ORDER BY queued_at, seq
                """)
            byID = try db.prepare("SELECT \(columns) FROM entries WHERE id = ?1")
            seqByID = try db.prepare("SELECT seq, status, body_file FROM entries WHERE id = ?1")
            all = try db.prepare("SELECT \(columns) FROM entries ORDER BY queued_at, seq")
            markDelivering = try db.prepare("""
                UPDATE entries SET status = 'delivering', attempts = attempts + 1 WHERE id = ?1
                """)
            markRetry = try db.prepare("""
                UPDATE entries SET status = 'queued', last_error = ?1, origin_status = ?2, next_attempt_at = ?3
                WHERE id = ?4
                """)
            finish = try db.prepare("""
                UPDATE entries SET status = ?1, finished_at = ?2, delivered_at = ?3,
                                   last_error = coalesce(?4, last_error), origin_status = coalesce(?5, origin_status)
                WHERE id = ?6
                """)
            deleteBody = try db.prepare("DELETE FROM bodies WHERE seq = (SELECT seq FROM entries WHERE id = ?1)")
            expiredCandidates = try db.prepare("""
                SELECT id FROM entries WHERE status = 'queued' AND queued_at <= ?1 ORDER BY queued_at, seq
                """)
            purge = try db.prepare("""
                DELETE FROM entries WHERE finished_at IS NOT NULL AND finished_at <= ?1
                  AND status IN ('delivered', 'failed', 'expired', 'cancelled')
                """)
        }
    }
}
