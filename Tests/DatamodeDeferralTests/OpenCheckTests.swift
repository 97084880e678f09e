@testable import DatamodeDeferral
import Foundation
import Testing

/// Start-up stops on a store it cannot trust (SPEC §18): every damaged, foreign or unreadable file is a typed
/// error that names it.
@Suite("Deferred store: damaged and foreign files")
struct OpenCheckTests {
    let now: Int64 = 1_800_000_000_000

    /// A store with a few entries of several pages each, closed cleanly (everything in the database file).
    func makeStore(_ directory: StoreDirectory) throws {
        let db = try DeferredDatabase(path: directory.database, limits: DeferredStoreLimits())
        for index in 0..<6 { _ = try db.enqueue(upload(40_000, seed: UInt8(index)), now: now) }
    }

    func openError(_ path: String, sourceLocation: SourceLocation = #_sourceLocation) -> DeferredStoreError? {
        let error = failure { () throws(DeferredStoreError) in try DeferredDatabase(path: path, limits: DeferredStoreLimits()) }
        #expect(error != nil, "opened \(path)", sourceLocation: sourceLocation)
        if let error { #expect(error.description.contains(path), "\(error)", sourceLocation: sourceLocation) }
        return error
    }

    func write(_ bytes: [UInt8], to path: String) throws {
        try Data(bytes).write(to: URL(fileURLWithPath: path))
    }

    func randomBytes(_ count: Int) -> [UInt8] {
        var generator = SystemRandomNumberGenerator()
        return (0..<count).map { _ in UInt8.random(in: 0...255, using: &generator) }
    }

    @Test("a file of garbage is not a database")
    func garbage() throws {
        let directory = try StoreDirectory()
        defer { directory.remove() }
        try write(randomBytes(65_536), to: directory.database)
        #expect(openError(directory.database) == .notADatabase(path: directory.database))
        // The file is left as it was, for whoever investigates.
        #expect(try Data(contentsOf: URL(fileURLWithPath: directory.database)).count == 65_536)
    }

    @Test("a short text file is not a database")
    func text() throws {
        let directory = try StoreDirectory()
        defer { directory.remove() }
        try write(Array("queued: 3\n".utf8), to: directory.database)
        #expect(openError(directory.database) == .notADatabase(path: directory.database))
    }

    @Test("a store truncated inside its header is not a database")
    func truncatedHeader() throws {
        let directory = try StoreDirectory()
        defer { directory.remove() }
        try makeStore(directory)
        #expect(truncate(directory.database, 50) == 0)
        #expect(openError(directory.database) == .notADatabase(path: directory.database))
    }

    @Test("a store truncated to half its pages is damaged")
    func truncatedHalf() throws {
        let directory = try StoreDirectory()
        defer { directory.remove() }
        try makeStore(directory)
        let size = try FileManager.default.attributesOfItem(atPath: directory.database)[.size] as! Int
        #expect(size > 200_000)
        #expect(truncate(directory.database, off_t(size / 2 / 4096 * 4096)) == 0)
        guard case .corrupt(let path, _) = openError(directory.database) else {
            Issue.record("expected .corrupt")
            return
        }
        #expect(path == directory.database)
    }

    @Test("garbage written over the middle of a store is found at open")
    func garbageInside() throws {
        let directory = try StoreDirectory()
        defer { directory.remove() }
        try makeStore(directory)
        // Page 1 (the header and the schema) intact; pages 2 to 5 (the tables' roots and indexes) overwritten.
        let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: directory.database))
        try handle.seek(toOffset: 4096)
        try handle.write(contentsOf: Data(randomBytes(4 * 4096)))
        try handle.close()
        guard case .corrupt(let path, let detail) = openError(directory.database) else {
            Issue.record("expected .corrupt")
            return
        }
        #expect(path == directory.database)
        #expect(!detail.isEmpty)
    }

    @Test("another application's SQLite database is foreign")
    func foreignDatabase() throws {
        let directory = try StoreDirectory()
        defer { directory.remove() }
        do {
            let other = try SQLiteConnection(path: directory.database)
            try other.execute("CREATE TABLE notes (text TEXT); INSERT INTO notes VALUES ('hello');")
        }
        guard case .foreign(let path, let detail) = openError(directory.database) else {
            Issue.record("expected .foreign")
            return
        }
        #expect(path == directory.database)
        #expect(detail.contains("another application"))
    }

    @Test("our application id without our tables is foreign")
    func ourIDOtherSchema() throws {
        let directory = try StoreDirectory()
        defer { directory.remove() }
        try makeStore(directory)
        do {
            let other = try SQLiteConnection(path: directory.database)
            try other.execute("DROP TABLE bodies")
        }
        guard case .foreign(_, let detail) = openError(directory.database) else {
            Issue.record("expected .foreign")
            return
        }
        #expect(detail.contains("bodies"))
    }

    @Test("a store written by a newer schema is refused, not rewritten")
    func newerSchema() throws {
        let directory = try StoreDirectory()
        defer { directory.remove() }
        try makeStore(directory)
        do {
            let other = try SQLiteConnection(path: directory.database)
            try other.execute("PRAGMA user_version = 99")
        }
        #expect(openError(directory.database) == .newerSchema(path: directory.database, version: 99))
    }

    @Test("a missing directory or a directory in the file's place cannot be opened")
    func notAFile() throws {
        let directory = try StoreDirectory()
        defer { directory.remove() }
        let missing = directory.path + "/no-such-dir/" + DeferredStore.fileName
        guard case .cannotOpen(let path, let detail) = openError(missing) else {
            Issue.record("expected .cannotOpen")
            return
        }
        #expect(path == missing)
        #expect(detail.contains("no-such-dir"))
        try FileManager.default.createDirectory(atPath: directory.database, withIntermediateDirectories: false)
        guard case .cannotOpen = openError(directory.database) else {
            Issue.record("expected .cannotOpen")
            return
        }
    }

    /// A store with one body in a file; returns that file's path.
    func storeWithBodyFile(_ directory: StoreDirectory) throws -> String {
        let db = try DeferredDatabase(path: directory.database, limits: DeferredStoreLimits(inlineBody: 0))
        let entry = try db.enqueue(upload(5000), now: now)
        return DeferredDatabase.bodyDirectory(of: directory.database) + "/" + entry.id
    }

    @Test("a live entry whose body file is missing is damage, named by the file")
    func missingBodyFile() throws {
        let directory = try StoreDirectory()
        defer { directory.remove() }
        let file = try storeWithBodyFile(directory)
        try FileManager.default.removeItem(atPath: file)
        let error = failure { () throws(DeferredStoreError) in try DeferredDatabase(path: directory.database, limits: DeferredStoreLimits()) }
        guard case .corrupt(let path, let detail) = error else {
            Issue.record("expected .corrupt, got \(String(describing: error))")
            return
        }
        #expect(path == file)
        #expect(detail.contains("missing"))
        #expect(error!.description.contains(file))
    }

    @Test("a body file shorter than its entry says is damage, named by the file")
    func shortBodyFile() throws {
        let directory = try StoreDirectory()
        defer { directory.remove() }
        let file = try storeWithBodyFile(directory)
        #expect(truncate(file, 4999) == 0)
        let error = failure { () throws(DeferredStoreError) in try DeferredDatabase(path: directory.database, limits: DeferredStoreLimits()) }
        #expect(error == .corrupt(path: file, detail: "the body of deferred upload \((file as NSString).lastPathComponent) has 4999 bytes, not 5000"))
    }

    @Test("body files no entry names (a crash between the file and its commit) are removed at open; other files are left")
    func orphanFilesSwept() throws {
        let directory = try StoreDirectory()
        defer { directory.remove() }
        let file = try storeWithBodyFile(directory)
        let bodies = DeferredDatabase.bodyDirectory(of: directory.database)
        let orphan = bodies + "/" + DeferralRules.newID()
        let stranger = bodies + "/notes.txt"
        try write([1, 2, 3], to: orphan)
        try write([4], to: stranger)
        let db = try DeferredDatabase(path: directory.database, limits: DeferredStoreLimits())
        #expect(db.sweptFiles == 1)
        #expect(!FileManager.default.fileExists(atPath: orphan))
        #expect(FileManager.default.fileExists(atPath: stranger))
        #expect(FileManager.default.fileExists(atPath: file))
        #expect(db.totals == DeferredTotals(entries: 1, bytes: 5000))
    }

    @Test("the store's own open (on its thread) reports the same errors")
    func throughTheStore() throws {
        let directory = try StoreDirectory()
        defer { directory.remove() }
        try write(randomBytes(10_000), to: directory.database)
        #expect(throws: DeferredStoreError.notADatabase(path: directory.database)) {
            _ = try DeferredStore(path: directory.database, limits: DeferredStoreLimits())
        }
    }

    @Test("a new store is created with its schema, and opens again")
    func createAndReopen() throws {
        let directory = try StoreDirectory()
        defer { directory.remove() }
        try makeStore(directory)
        let db = try DeferredDatabase(path: directory.database, limits: DeferredStoreLimits())
        #expect(db.totals == DeferredTotals(entries: 6, bytes: 240_000))
        #expect(try db.list(statuses: nil, limit: 100).count == 6)
    }
}
