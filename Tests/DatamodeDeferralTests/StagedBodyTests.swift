@testable import DatamodeDeferral
import DatamodeHTTP
import Foundation
import Testing

/// A body stored while it arrives (`StagedBody`, SPEC §6 and §18.3): written to its file in pieces, made durable and
/// committed with its entry, bounded by `max-body` and `max-bytes` as it grows, and removed when it is not stored.
@Suite("Deferred store: staged bodies")
struct StagedBodyTests {
    let now: Int64 = 1_800_000_000_000

    func file(_ directory: StoreDirectory, _ id: String) -> String {
        DeferredDatabase.bodyDirectory(of: directory.database) + "/" + id
    }

    /// `count` pieces of `size` patterned bytes, the whole body last.
    func pieces(_ count: Int, of size: Int) -> ([[UInt8]], [UInt8]) {
        let whole = upload(count * size, seed: 9).body
        return (stride(from: 0, to: whole.count, by: size).map { Array(whole[$0..<$0 + size]) }, whole)
    }

    @Test("pieces appended, then enqueued: one entry whose body is the pieces in order, in its file")
    func appendAndCommit() throws {
        let directory = try StoreDirectory()
        defer { directory.remove() }
        let db = try DeferredDatabase(path: directory.database, limits: DeferredStoreLimits())
        let staged = StagedBody(id: DeferralRules.newID())
        let (parts, whole) = pieces(5, of: 100_000)
        for (index, part) in parts.enumerated() {
            #expect(try db.appendBody(staged, part) == (index + 1) * 100_000)
        }
        #expect(FileManager.default.fileExists(atPath: file(directory, staged.id)))
        #expect(db.totals == DeferredTotals(entries: 0, bytes: 0), "nothing counts before the commit")
        let sent = DeferredUpload(method: "PUT", url: "http://origin.example/big", headers: [HTTPField(name: "X-A", value: "1")],
                                  body: [])
        let entry = try db.enqueue(sent, staged: staged, now: now)
        #expect(entry.id == staged.id && entry.bytes == whole.count && entry.headers == sent.headers)
        #expect(try db.body(entry.id) == whole)
        #expect(try db.countLive() == DeferredTotals(entries: 1, bytes: UInt64(whole.count)))
        // The entry owns the file now: a late discard leaves it.
        db.discardBody(staged)
        #expect(try db.body(entry.id) == whole)
    }

    @Test("a piece past max-body is refused, the file removed, and the upload cannot be stored any more")
    func tooLargeMidway() throws {
        let directory = try StoreDirectory()
        defer { directory.remove() }
        let db = try DeferredDatabase(path: directory.database, limits: DeferredStoreLimits(maxBody: 250_000))
        let staged = StagedBody(id: DeferralRules.newID())
        let (parts, _) = pieces(3, of: 100_000)
        _ = try db.appendBody(staged, parts[0])
        _ = try db.appendBody(staged, parts[1])
        #expect(throws: DeferredStoreError.tooLarge(bytes: 300_000, maxBody: 250_000)) { try db.appendBody(staged, parts[2]) }
        #expect(!FileManager.default.fileExists(atPath: file(directory, staged.id)))
        #expect(throws: DeferredStoreError.tooLarge(bytes: 300_000, maxBody: 250_000)) {
            try db.enqueue(DeferredUpload(method: "POST", url: "http://origin.example/", headers: [], body: []), staged: staged, now: now)
        }
        #expect(try db.list(statuses: nil, limit: 10).isEmpty)
        #expect(try db.countLive() == DeferredTotals(entries: 0, bytes: 0))
    }

    @Test("a piece that would take the live bodies past max-bytes is refused as full before the upload ends")
    func fullMidway() throws {
        let directory = try StoreDirectory()
        defer { directory.remove() }
        let db = try DeferredDatabase(path: directory.database, limits: DeferredStoreLimits(maxBody: 500_000, maxBytes: 600_000))
        _ = try db.enqueue(upload(400_000), now: now)
        let staged = StagedBody(id: DeferralRules.newID())
        let (parts, _) = pieces(3, of: 100_000)
        _ = try db.appendBody(staged, parts[0])
        _ = try db.appendBody(staged, parts[1])
        let error = failure { () throws(DeferredStoreError) in try db.appendBody(staged, parts[2]) }
        #expect(error == .full(bytes: 400_000, maxBytes: 600_000) && error?.isFull == true)
        #expect(!FileManager.default.fileExists(atPath: file(directory, staged.id)))
        #expect(try db.countLive() == DeferredTotals(entries: 1, bytes: 400_000))
    }

    @Test("a discarded body leaves nothing; one left by a crash before its commit is swept at the next open")
    func discardAndSweep() throws {
        let directory = try StoreDirectory()
        defer { directory.remove() }
        let (parts, _) = pieces(2, of: 100_000)
        var abandoned = ""
        do {
            let db = try DeferredDatabase(path: directory.database, limits: DeferredStoreLimits())
            let discarded = StagedBody(id: DeferralRules.newID())
            _ = try db.appendBody(discarded, parts[0])
            db.discardBody(discarded)
            #expect(!FileManager.default.fileExists(atPath: file(directory, discarded.id)))
            #expect(failure { () throws(DeferredStoreError) in
                try db.enqueue(DeferredUpload(method: "POST", url: "http://origin.example/", headers: [], body: []),
                               staged: discarded, now: now)
            } != nil, "a discarded body is never committed")
            #expect(try db.list(statuses: nil, limit: 10).isEmpty)
            // Written, never committed nor discarded: as after SIGKILL mid-upload.
            let left = StagedBody(id: DeferralRules.newID())
            _ = try db.appendBody(left, parts[0])
            _ = try db.appendBody(left, parts[1])
            abandoned = left.id
        }
        #expect(FileManager.default.fileExists(atPath: file(directory, abandoned)))
        let reopened = try DeferredDatabase(path: directory.database, limits: DeferredStoreLimits())
        #expect(reopened.sweptFiles == 1)
        #expect(!FileManager.default.fileExists(atPath: file(directory, abandoned)))
        #expect(try reopened.list(statuses: nil, limit: 10).isEmpty)
    }

    @Test("through the store thread: appends in order, then the commit, the completions on the store's thread")
    func throughTheStore() throws {
        let directory = try StoreDirectory()
        defer { directory.remove() }
        let store = try DeferredStore(path: directory.database, limits: DeferredStoreLimits())
        defer { store.close() }
        let staged = store.stageBody()
        let (parts, whole) = pieces(4, of: 70_000)
        for part in parts.dropLast() { store.appendBody(staged, part) { _ in } }
        #expect(try waitFor { store.appendBody(staged, parts.last!, completion: $0) }.get() == whole.count)
        let entry = try waitFor {
            store.enqueue(DeferredUpload(method: "POST", url: "http://origin.example/s", headers: [], body: []), staged: staged,
                          now: now, completion: $0)
        }.get()
        #expect(entry.bytes == whole.count && store.totals == DeferredTotals(entries: 1, bytes: UInt64(whole.count)))
        #expect(try waitFor { store.readBody(entry.id, offset: 0, count: whole.count + 1, completion: $0) }.get() == whole)
    }
}
