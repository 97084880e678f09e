import CSQLite
#if canImport(Glibc)
import Glibc
#endif

/// One SQLite connection, used by one thread at a time (the store thread): opened with `SQLITE_OPEN_NOMUTEX`, so
/// SQLite takes no lock of its own on it. The only file of the module that calls SQLite's C API besides
/// `Statement`; no C type leaves the module.
final class SQLiteConnection {
    let handle: OpaquePointer
    let path: String

    /// Opens (creating when missing) the database at `path`.
    init(path: String) throws(DeferredStoreError) {
        var db: OpaquePointer?
        let flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_EXRESCODE
        let rc = sqlite3_open_v2(path, &db, flags, nil)
        guard rc == SQLITE_OK, let db else {
            let detail = db.map { String(cString: sqlite3_errmsg($0)) } ?? String(cString: sqlite3_errstr(rc))
            sqlite3_close_v2(db)
            throw .cannotOpen(path: path, detail: detail)
        }
        handle = db
        self.path = path
        sqlite3_extended_result_codes(db, 1)
    }

    deinit {
        sqlite3_close_v2(handle)
    }

    /// Runs SQL without results (several statements allowed).
    func execute(_ sql: String) throws(DeferredStoreError) {
        let rc = sqlite3_exec(handle, sql, nil, nil, nil)
        guard rc == SQLITE_OK else { throw error(rc, doing: sql) }
    }

    /// The first column of the first row of `sql`, as text (a PRAGMA's answer); nil when there is no row.
    func text(_ sql: String) throws(DeferredStoreError) -> String? {
        let statement = try prepare(sql)
        guard try statement.step() else { return nil }
        return statement.text(0)
    }

    /// The first column of the first row of `sql`, as an integer.
    func integer(_ sql: String) throws(DeferredStoreError) -> Int64 {
        let statement = try prepare(sql)
        guard try statement.step() else { return 0 }
        return statement.int64(0)
    }

    func prepare(_ sql: String) throws(DeferredStoreError) -> Statement {
        var statement: OpaquePointer?
        let rc = sqlite3_prepare_v3(handle, sql, -1, UInt32(SQLITE_PREPARE_PERSISTENT), &statement, nil)
        guard rc == SQLITE_OK, let statement else { throw error(rc, doing: sql) }
        return Statement(handle: statement, connection: self)
    }

    var changes: Int { Int(sqlite3_changes64(handle)) }
    var lastInsertRowID: Int64 { sqlite3_last_insert_rowid(handle) }
    var inTransaction: Bool { sqlite3_get_autocommit(handle) == 0 }

    /// The store's error for SQLite result code `rc`: a full disk, corruption and locks get their own cases,
    /// whatever operation met them; the rest is an I/O error with SQLite's message.
    func error(_ rc: Int32, doing what: String) -> DeferredStoreError {
        let message = String(cString: sqlite3_errmsg(handle))
        // ENOSPC can also surface as an I/O error (a failed fsync or a short write), not only as SQLITE_FULL.
        let systemErrno = sqlite3_system_errno(handle)
        switch rc & 0xFF {
        case SQLITE_FULL: return .diskFull(path: path)
        case SQLITE_IOERR where systemErrno == ENOSPC || systemErrno == EDQUOT: return .diskFull(path: path)
        case SQLITE_CORRUPT: return .corrupt(path: path, detail: message)
        case SQLITE_NOTADB: return .notADatabase(path: path)
        case SQLITE_BUSY, SQLITE_LOCKED: return .inUse(path: path)
        default:
            let statement = what.split(separator: "\n").first.map { String($0.prefix(60)) } ?? ""
            return .io(path: path, detail: "\(message) (SQLite \(rc), during \(statement))")
        }
    }

    // MARK: Incremental BLOB I/O

    /// Reads up to `count` bytes from `offset` of the BLOB in `table.column` of row `rowid`, without loading the
    /// rest of it (`sqlite3_blob_read`): a 64 MiB body is delivered in pieces.
    func readBlob(table: String, column: String, rowid: Int64, offset: Int, count: Int) throws(DeferredStoreError) -> [UInt8] {
        var blob: OpaquePointer?
        var rc = sqlite3_blob_open(handle, "main", table, column, rowid, 0, &blob)
        guard rc == SQLITE_OK, let blob else {
            sqlite3_blob_close(blob)
            throw error(rc, doing: "blob open")
        }
        defer { sqlite3_blob_close(blob) }
        let size = Int(sqlite3_blob_bytes(blob))
        let start = min(max(0, offset), size)
        let length = min(max(0, count), size - start)
        guard length > 0 else { return [] }
        var out = [UInt8](repeating: 0, count: length)
        rc = out.withUnsafeMutableBytes { sqlite3_blob_read(blob, $0.baseAddress, Int32(length), Int32(start)) }
        guard rc == SQLITE_OK else { throw error(rc, doing: "blob read") }
        return out
    }
}

/// A prepared statement, kept for the connection's life and reset after each use.
final class Statement {
    let handle: OpaquePointer
    unowned let connection: SQLiteConnection

    init(handle: OpaquePointer, connection: SQLiteConnection) {
        self.handle = handle
        self.connection = connection
    }

    deinit {
        sqlite3_finalize(handle)
    }

    /// Clears the bindings and rewinds; call before binding a new use (and after the last row, to release locks).
    func reset() {
        sqlite3_reset(handle)
        sqlite3_clear_bindings(handle)
    }

    /// One step: true when a row is ready, false when done.
    func step() throws(DeferredStoreError) -> Bool {
        let rc = sqlite3_step(handle)
        switch rc {
        case SQLITE_ROW: return true
        case SQLITE_DONE: return false
        default:
            let sql = sqlite3_sql(handle).map { String(cString: $0) } ?? ""
            let error = connection.error(rc, doing: sql)
            sqlite3_reset(handle)
            throw error
        }
    }

    /// Steps to the end (a statement without results).
    func run() throws(DeferredStoreError) {
        while try step() {}
        reset()
    }

    // MARK: Binding (1-based)

    func bind(_ index: Int32, _ value: Int64) {
        sqlite3_bind_int64(handle, index, value)
    }

    func bind(_ index: Int32, _ value: Int64?) {
        if let value { sqlite3_bind_int64(handle, index, value) } else { sqlite3_bind_null(handle, index) }
    }

    func bind(_ index: Int32, _ value: String?) {
        guard let value else {
            sqlite3_bind_null(handle, index)
            return
        }
        sqlite3_bind_text64(handle, index, value, UInt64(value.utf8.count), csqlite_transient(), UInt8(SQLITE_UTF8))
    }

    /// Binds a copy of `bytes` (small values: the encoded headers).
    func bind(_ index: Int32, copying bytes: [UInt8]) {
        _ = bytes.withUnsafeBytes { raw in
            if let base = raw.baseAddress {
                sqlite3_bind_blob64(handle, index, base, UInt64(raw.count), csqlite_transient())
            } else {
                sqlite3_bind_zeroblob(handle, index, 0)
            }
        }
    }

    /// Binds `bytes` without copying them (`SQLITE_STATIC`) and runs `body` while they are bound: the pointer is
    /// valid only inside `withUnsafeBytes`, so the statement is stepped there and unbound before it returns.
    func withBound<R>(_ index: Int32, borrowing bytes: [UInt8], _ body: () throws(DeferredStoreError) -> R) throws(DeferredStoreError) -> R {
        let result: Result<R, DeferredStoreError> = bytes.withUnsafeBytes { raw in
            if let base = raw.baseAddress {
                sqlite3_bind_blob64(handle, index, base, UInt64(raw.count), nil)
            } else {
                // An empty body: a BLOB of length 0, not NULL.
                sqlite3_bind_zeroblob(handle, index, 0)
            }
            defer { reset() }
            do throws(DeferredStoreError) {
                return .success(try body())
            } catch {
                return .failure(error)
            }
        }
        return try result.get()
    }

    // MARK: Columns (0-based)

    func isNull(_ column: Int32) -> Bool { sqlite3_column_type(handle, column) == SQLITE_NULL }

    func int64(_ column: Int32) -> Int64 { sqlite3_column_int64(handle, column) }

    func optionalInt64(_ column: Int32) -> Int64? { isNull(column) ? nil : int64(column) }

    func text(_ column: Int32) -> String {
        guard let pointer = sqlite3_column_text(handle, column) else { return "" }
        let count = Int(sqlite3_column_bytes(handle, column))
        return String(decoding: UnsafeBufferPointer(start: pointer, count: count), as: UTF8.self)
    }

    func optionalText(_ column: Int32) -> String? { isNull(column) ? nil : text(column) }

    func blob(_ column: Int32) -> [UInt8] {
        let count = Int(sqlite3_column_bytes(handle, column))
        guard count > 0, let pointer = sqlite3_column_blob(handle, column) else { return [] }
        return [UInt8](UnsafeRawBufferPointer(start: pointer, count: count))
    }
}
