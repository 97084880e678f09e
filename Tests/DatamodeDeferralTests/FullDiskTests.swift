@testable import DatamodeDeferral
import Foundation
import Testing

/// A full disk refuses the new upload and loses nothing already accepted (SPEC §18.3).
@Suite("Deferred store: full disk")
struct FullDiskTests {
    let now: Int64 = 1_800_000_000_000

    /// Fills `db` with 256 KiB uploads until it refuses one; returns the ids accepted (with their seeds) and the
    /// refusal. At most 1000 tries.
    func fill(_ db: DeferredDatabase) -> (accepted: [(id: String, seed: UInt8)], refusal: DeferredStoreError?) {
        var accepted: [(id: String, seed: UInt8)] = []
        for index in 0..<1000 {
            let seed = UInt8(truncatingIfNeeded: index)
            switch Result(catching: { () throws(DeferredStoreError) in try db.enqueue(upload(262_144, seed: seed), now: now) }) {
            case .success(let entry): accepted.append((entry.id, seed))
            case .failure(let error): return (accepted, error)
            }
        }
        return (accepted, nil)
    }

    /// Every accepted upload is there, whole, and the totals say so.
    func expectIntact(_ db: DeferredDatabase, _ accepted: [(id: String, seed: UInt8)],
                      sourceLocation: SourceLocation = #_sourceLocation) throws {
        for (id, seed) in accepted {
            #expect(try db.get(id)?.status == .queued, sourceLocation: sourceLocation)
            #expect(try db.body(id) == upload(262_144, seed: seed).body, sourceLocation: sourceLocation)
        }
        #expect(try db.list(statuses: nil, limit: 10_000).count == accepted.count, sourceLocation: sourceLocation)
        #expect(db.totals == DeferredTotals(entries: accepted.count, bytes: UInt64(accepted.count) * 262_144),
                sourceLocation: sourceLocation)
        #expect(try db.countLive() == db.totals, sourceLocation: sourceLocation)
    }

    @Test("SQLITE_FULL (the file capped with max_page_count): the upload is refused as diskFull, the others stay")
    func capped() throws {
        let directory = try StoreDirectory()
        defer { directory.remove() }
        var accepted: [(id: String, seed: UInt8)] = []
        do {
            // Bodies kept in the database (inline up to 1 MiB), so that the database is what fills up.
            let db = try DeferredDatabase(path: directory.database,
                                          limits: DeferredStoreLimits(maxBody: 1 << 20, maxBytes: 1 << 40, inlineBody: 1 << 20))
            try db.limitPages(try db.pageCount() + 600)  // about 2.3 MiB: eight or nine uploads
            let result = fill(db)
            accepted = result.accepted
            #expect(result.refusal == .diskFull(path: directory.database))
            #expect(result.refusal?.isFull == true)
            #expect(accepted.count >= 5)
            try expectIntact(db, accepted)
            // The refusal left nothing behind: a smaller upload still fits where the refused one did not.
            let small = try db.enqueue(upload(1000), now: now)
            _ = try db.cancel(small.id, now: now)
            _ = try db.purgeFinished(now: now, keep: 0)
            try expectIntact(db, accepted)
        }
        let reopened = try DeferredDatabase(path: directory.database,
                                            limits: DeferredStoreLimits(maxBody: 1 << 20, maxBytes: 1 << 40, inlineBody: 1 << 20))
        try expectIntact(reopened, accepted)
    }

    @Test("ENOSPC (a 4 MiB tmpfs): refused as diskFull, nothing accepted lost (before or after reopening), room after cancelling",
          .enabled(if: SmallFileSystem.available, "needs root to mount a tmpfs"))
    func realFileSystem() throws {
        let mount = try SmallFileSystem(megabytes: 4)
        defer { mount.remove() }
        let path = mount.path + "/" + DeferredStore.fileName
        let limits = DeferredStoreLimits(maxBody: 1 << 20, maxBytes: 1 << 40)
        // Alternately a body in a file (256 KiB) and one in the database (48 KiB): either may meet ENOSPC first.
        func sized(_ seed: UInt8) -> DeferredUpload { upload(seed % 2 == 0 ? 262_144 : 49_152, seed: seed) }
        var accepted: [(id: String, seed: UInt8)] = []
        do {
            // The threaded store, as the engine runs it (its checkpoints shape what a full disk leaves).
            let store = try DeferredStore(path: path, limits: limits)
            var refusal: DeferredStoreError?
            for index in 0..<100 where refusal == nil {
                let seed = UInt8(index)
                switch waitFor({ store.enqueue(sized(seed), now: now, completion: $0) }) {
                case .success(let entry): accepted.append((entry.id, seed))
                case .failure(let error): refusal = error
                }
            }
            #expect(refusal == .diskFull(path: path) || refusal == .diskFull(path: path + "-bodies"), "\(String(describing: refusal))")
            #expect(refusal?.isFull == true)
            #expect(accepted.count >= 4)
            let check = { (sourceLocation: SourceLocation) throws in
                let listed = try waitFor { store.list(completion: $0) }.get()
                #expect(listed.map(\.id) == accepted.map(\.id), sourceLocation: sourceLocation)
                for (id, seed) in accepted {
                    let body = try waitFor { store.readBody(id, offset: 0, count: 1 << 20, completion: $0) }.get()
                    #expect(body == sized(seed).body, sourceLocation: sourceLocation)
                }
            }
            try check(#_sourceLocation)
            // Cancelling half of them frees their space: uploads fit again.
            for (id, _) in accepted.prefix(accepted.count / 2) {
                _ = try waitFor { store.cancel(id, now: now, completion: $0) }.get()
            }
            _ = try waitFor { store.purgeFinished(now: now, keep: .zero, completion: $0) }.get()
            accepted.removeFirst(accepted.count / 2)
            for seed in [UInt8(200), 201] {
                let again = try waitFor { store.enqueue(sized(seed), now: now, completion: $0) }.get()
                accepted.append((again.id, seed))
            }
            try check(#_sourceLocation)
            store.close()
        }
        let reopened = try DeferredDatabase(path: path, limits: limits)
        for (id, seed) in accepted { #expect(try reopened.body(id) == sized(seed).body) }
        #expect(try reopened.list(statuses: nil, limit: 1000).map(\.id) == accepted.map(\.id))
        #expect(try reopened.countLive() == reopened.totals)
    }
}

/// A tmpfs of a few MiB mounted on a fresh directory: a file system that really fills up (root only).
struct SmallFileSystem {
    let path: String

    static let available: Bool = {
        guard getuid() == 0, let probe = try? SmallFileSystem(megabytes: 1) else { return false }
        probe.remove()
        return true
    }()

    struct MountFailed: Error {}

    init(megabytes: Int) throws {
        path = FileManager.default.temporaryDirectory.appendingPathComponent("deferral-tmpfs-\(UUID().uuidString.prefix(8))").path
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: false)
        guard Glibc.mount("tmpfs", path, "tmpfs", 0, "size=\(megabytes)m,mode=0700") == 0 else {
            try? FileManager.default.removeItem(atPath: path)
            throw MountFailed()
        }
    }

    func remove() {
        umount2(path, Int32(MNT_DETACH))
        try? FileManager.default.removeItem(atPath: path)
    }
}
