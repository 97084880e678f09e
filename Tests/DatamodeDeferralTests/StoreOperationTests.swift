@testable import DatamodeDeferral
import DatamodeHTTP
import Foundation
import Testing

/// Each operation of the store on its own, synchronously on the test's thread (`DeferredDatabase`), with the
/// live totals checked against a recount from the file after every step.
@Suite("Deferred store operations")
struct StoreOperationTests {
    let now: Int64 = 1_800_000_000_000

    func open(_ directory: StoreDirectory, limits: DeferredStoreLimits = DeferredStoreLimits()) throws -> DeferredDatabase {
        try DeferredDatabase(path: directory.database, limits: limits)
    }

    /// The running totals are what the file says.
    func expectTotals(_ db: DeferredDatabase, _ entries: Int, _ bytes: UInt64, sourceLocation: SourceLocation = #_sourceLocation) throws {
        #expect(db.totals == DeferredTotals(entries: entries, bytes: bytes), sourceLocation: sourceLocation)
        #expect(try db.countLive() == db.totals, sourceLocation: sourceLocation)
    }

    @Test("enqueue stores method, URL, headers in order, session and body, and returns the queued entry")
    func enqueueAndGet() throws {
        let directory = try StoreDirectory()
        defer { directory.remove() }
        let db = try open(directory)
        let headers = [HTTPField(name: "Content-Type", value: "image/jpeg"), HTTPField(name: "X-b", value: "2"),
                       HTTPField(name: "x-A", value: "a: b, c"), HTTPField(name: "X-b", value: ""),
                       HTTPField(name: "X-Bytes", value: "caf\u{E9} \u{1F600}")]
        let sent = DeferredUpload(method: "PUT", url: "https://API.example:8443/photos/1?x=1", headers: headers,
                                  body: upload(70_000).body, session: "rig-a")
        let entry = try db.enqueue(sent, now: now)
        #expect(entry.status == .queued)
        #expect(entry.method == "PUT")
        #expect(entry.url == "https://API.example:8443/photos/1?x=1")
        #expect(entry.origin == "https://api.example:8443")
        #expect(entry.headers == headers)
        #expect(entry.bytes == 70_000)
        #expect(entry.session == "rig-a")
        #expect(entry.attempts == 0)
        #expect(entry.queuedAt == now && entry.nextAttemptAt == now)
        #expect(entry.deliveredAt == nil && entry.finishedAt == nil && entry.lastError == nil && entry.originStatus == nil)
        // No client key: the id is the delivery's Idempotency-Key.
        #expect(entry.idempotencyKey == entry.id)
        #expect(!entry.clientSentIdempotencyKey)
        #expect(try db.get(entry.id) == entry)
        #expect(try db.body(entry.id) == sent.body)
        #expect(try db.get("no-such-id") == nil)
        try expectTotals(db, 1, 70_000)
    }

    @Test("a body above inlineBody is a file beside the database until its entry ends; one below, a row", arguments: [
        (DeferredStoreLimits.defaultInlineBody, true), (DeferredStoreLimits.defaultInlineBody + 1, false),
    ])
    func bodyLayout(_ size: Int, _ inline: Bool) throws {
        let directory = try StoreDirectory()
        defer { directory.remove() }
        let db = try open(directory)
        let sent = upload(size, seed: 3)
        let entry = try db.enqueue(sent, now: now)
        let file = DeferredDatabase.bodyDirectory(of: directory.database) + "/" + entry.id
        #expect(FileManager.default.fileExists(atPath: file) == !inline)
        if !inline { #expect(FileManager.default.contents(atPath: file) == Data(sent.body)) }
        #expect(try db.body(entry.id) == sent.body)
        #expect(try db.readBody(entry.id, offset: size - 10, count: 100) == Array(sent.body.suffix(10)))
        _ = try db.markDelivering(entry.id, now: now)
        _ = try db.markDelivered(entry.id, originStatus: 200, now: now)
        #expect(!FileManager.default.fileExists(atPath: file))
        try expectTotals(db, 0, 0)
    }

    @Test("every way an entry ends removes its body file", arguments: ["delivered", "failed", "cancelled", "expired"])
    func bodyFileRemoved(_ ending: String) throws {
        let directory = try StoreDirectory()
        defer { directory.remove() }
        let db = try open(directory, limits: DeferredStoreLimits(inlineBody: 0))
        let entry = try db.enqueue(upload(10), now: now)
        let file = DeferredDatabase.bodyDirectory(of: directory.database) + "/" + entry.id
        #expect(FileManager.default.fileExists(atPath: file))
        switch ending {
        case "delivered":
            _ = try db.markDelivering(entry.id, now: now)
            _ = try db.markDelivered(entry.id, originStatus: 200, now: now)
        case "failed": _ = try db.markFailed(entry.id, error: "x", now: now)
        case "cancelled": _ = try db.cancel(entry.id, now: now)
        default: #expect(try db.expire(now: now + 10, maxAge: 10).count == 1)
        }
        #expect(!FileManager.default.fileExists(atPath: file))
        try expectTotals(db, 0, 0)
    }

    @Test("ids are 22 URL-safe characters and never repeat")
    func ids() throws {
        var seen = Set<String>()
        for _ in 0..<10_000 {
            let id = DeferralRules.newID()
            #expect(id.count == 22)
            #expect(id.utf8.allSatisfy { byte in
                (byte >= 0x30 && byte <= 0x39) || (byte >= 0x41 && byte <= 0x5A) || (byte >= 0x61 && byte <= 0x7A)
                    || byte == UInt8(ascii: "-") || byte == UInt8(ascii: "_")
            })
            seen.insert(id)
        }
        #expect(seen.count == 10_000)
    }

    @Test("the client's Idempotency-Key is kept as the delivery's key")
    func clientIdempotencyKey() throws {
        let directory = try StoreDirectory()
        defer { directory.remove() }
        let db = try open(directory)
        let entry = try db.enqueue(upload(10, headers: [HTTPField(name: "idempotency-KEY", value: "  order-42 ")]), now: now)
        #expect(entry.idempotencyKey == "order-42")
        #expect(entry.clientSentIdempotencyKey)
        // An empty one is not a key.
        let other = try db.enqueue(upload(10, headers: [HTTPField(name: "Idempotency-Key", value: "")]), now: now)
        #expect(other.idempotencyKey == other.id)
    }

    @Test("an empty body is stored as an empty body")
    func emptyBody() throws {
        let directory = try StoreDirectory()
        defer { directory.remove() }
        let db = try open(directory)
        let entry = try db.enqueue(upload(0), now: now)
        #expect(entry.bytes == 0)
        #expect(try db.body(entry.id) == [])
        try expectTotals(db, 1, 0)
    }

    @Test("a body is read in pieces: any offset and count, short at the end, empty past it")
    func readBodyPieces() throws {
        let directory = try StoreDirectory()
        defer { directory.remove() }
        let db = try open(directory)
        let sent = upload(300_000, seed: 7)
        let entry = try db.enqueue(sent, now: now)
        var assembled: [UInt8] = []
        var offset = 0
        while true {
            let piece = try db.readBody(entry.id, offset: offset, count: 65_536)
            if piece.isEmpty { break }
            assembled += piece
            offset += piece.count
        }
        #expect(assembled == sent.body)
        #expect(try db.readBody(entry.id, offset: 299_990, count: 100) == Array(sent.body[299_990...]))
        #expect(try db.readBody(entry.id, offset: 400_000, count: 100) == [])
        #expect(throws: DeferredStoreError.notFound(id: "nope")) { try db.readBody("nope", offset: 0, count: 1) }
    }

    @Test("max-body: a larger body is refused and nothing is stored")
    func tooLarge() throws {
        let directory = try StoreDirectory()
        defer { directory.remove() }
        let db = try open(directory, limits: DeferredStoreLimits(maxBody: 1000, maxBytes: 10_000))
        _ = try db.enqueue(upload(1000), now: now)
        #expect(throws: DeferredStoreError.tooLarge(bytes: 1001, maxBody: 1000)) { try db.enqueue(upload(1001), now: now) }
        #expect(try db.list(statuses: nil, limit: 100).count == 1)
        try expectTotals(db, 1, 1000)
    }

    @Test("max-bytes: the upload that would pass it is refused as full, nothing is stored, and space comes back when bodies are dropped")
    func full() throws {
        let directory = try StoreDirectory()
        defer { directory.remove() }
        let db = try open(directory, limits: DeferredStoreLimits(maxBody: 4000, maxBytes: 10_000))
        var ids: [String] = []
        for _ in 0..<3 { ids.append(try db.enqueue(upload(3000), now: now).id) }
        #expect(throws: DeferredStoreError.full(bytes: 9000, maxBytes: 10_000)) { try db.enqueue(upload(1001), now: now) }
        #expect(failure { () throws(DeferredStoreError) in try db.enqueue(upload(1001), now: now) }?.isFull == true)
        #expect(try db.list(statuses: nil, limit: 100).count == 3)
        try expectTotals(db, 3, 9000)
        // Exactly up to the limit is accepted.
        _ = try db.enqueue(upload(1000), now: now)
        try expectTotals(db, 4, 10_000)
        // A delivered entry's body no longer counts (it is dropped), whatever happens to the entry.
        _ = try db.markDelivering(ids[0], now: now)
        try expectTotals(db, 4, 10_000)
        _ = try db.markDelivered(ids[0], originStatus: 201, now: now + 5)
        try expectTotals(db, 3, 7000)
        _ = try db.enqueue(upload(3000), now: now)
        try expectTotals(db, 4, 10_000)
    }

    @Test("nextDue: queued and due, oldest first, at most `concurrency` per origin counting running deliveries")
    func nextDue() throws {
        let directory = try StoreDirectory()
        defer { directory.remove() }
        let db = try open(directory)
        // a1 a2 a3 on origin a, b1 on b, by queue time; a0 is the newest although stored first.
        let a0 = try db.enqueue(upload(10, url: "http://a.example/0"), now: now + 50)
        let a1 = try db.enqueue(upload(10, url: "http://a.example/1"), now: now + 1)
        let a2 = try db.enqueue(upload(10, url: "http://A.example:80/2"), now: now + 2)
        let b1 = try db.enqueue(upload(10, url: "https://b.example/1"), now: now + 3)
        let a3 = try db.enqueue(upload(10, url: "http://a.example/3"), now: now + 4)
        let future = try db.enqueue(upload(10, url: "http://c.example/1"), now: now + 1000)

        let ids = { (entries: [DeferredEntry]) in entries.map(\.id) }
        #expect(try ids(db.nextDue(now: now + 100, concurrency: 2, limit: 100, admit: nil)) == [a1.id, a2.id, b1.id])
        #expect(try ids(db.nextDue(now: now + 100, concurrency: 10, limit: 100, admit: nil)) == [a1.id, a2.id, b1.id, a3.id, a0.id])
        #expect(try ids(db.nextDue(now: now + 100, concurrency: 10, limit: 2, admit: nil)) == [a1.id, a2.id])
        #expect(try ids(db.nextDue(now: now + 2000, concurrency: 10, limit: 100, admit: nil)).last == future.id)
        // One delivery running on a: one more slot there.
        _ = try db.markDelivering(a1.id, now: now + 100)
        #expect(try ids(db.nextDue(now: now + 100, concurrency: 2, limit: 100, admit: nil)) == [a2.id, b1.id])
        // `admit` refuses a2: it takes no slot, a3 gets it.
        let refused = a2.id
        #expect(try ids(db.nextDue(now: now + 100, concurrency: 2, limit: 100, admit: { $0.id != refused })) == [b1.id, a3.id])
        // nextDue changes nothing.
        #expect(try db.get(a2.id)?.status == .queued)
    }

    @Test("markDelivering counts the attempt and refuses an entry that is not queued")
    func markDelivering() throws {
        let directory = try StoreDirectory()
        defer { directory.remove() }
        let db = try open(directory)
        let entry = try db.enqueue(upload(), now: now)
        let started = try db.markDelivering(entry.id, now: now + 10)
        #expect(started.status == .delivering)
        #expect(started.attempts == 1)
        #expect(throws: DeferredStoreError.wrongState(id: entry.id, status: .delivering)) {
            try db.markDelivering(entry.id, now: now + 11)
        }
        #expect(throws: DeferredStoreError.notFound(id: "x")) { try db.markDelivering("x", now: now) }
        // A delivering entry keeps its body (it is being read) and still counts.
        #expect(try db.body(entry.id) == upload().body)
        try expectTotals(db, 1, 1000)
    }

    @Test("markDelivered records the origin's status and drops the body; a 4xx is final too")
    func markDelivered() throws {
        let directory = try StoreDirectory()
        defer { directory.remove() }
        let db = try open(directory)
        let first = try db.enqueue(upload(), now: now)
        let second = try db.enqueue(upload(), now: now)
        #expect(throws: DeferredStoreError.wrongState(id: first.id, status: .queued)) {
            try db.markDelivered(first.id, originStatus: 200, now: now)
        }
        _ = try db.markDelivering(first.id, now: now + 1)
        let done = try db.markDelivered(first.id, originStatus: 201, now: now + 20)
        #expect(done.status == .delivered)
        #expect(done.originStatus == 201)
        #expect(done.deliveredAt == now + 20 && done.finishedAt == now + 20)
        #expect(done.bytes == 1000)
        #expect(throws: DeferredStoreError.wrongState(id: first.id, status: .delivered)) { try db.body(first.id) }
        _ = try db.markDelivering(second.id, now: now + 1)
        #expect(try db.markDelivered(second.id, originStatus: 404, now: now + 30).status == .delivered)
        try expectTotals(db, 0, 0)
        #expect(try db.nextDue(now: .max, concurrency: 10, limit: 10, admit: nil).isEmpty)
    }

    @Test("backoff: 1 s after the first failure, doubling, at most 5 min", arguments: [
        (1, Int64(1000)), (2, 2000), (3, 4000), (4, 8000), (5, 16_000), (6, 32_000), (7, 64_000), (8, 128_000),
        (9, 256_000), (10, 300_000), (11, 300_000), (64, 300_000), (10_000, 300_000),
    ])
    func backoff(_ attempts: Int, _ milliseconds: Int64) {
        #expect(DeferralRules.backoffMilliseconds(afterAttempts: attempts) == milliseconds)
    }

    @Test("markRetry puts the entry back with the backoff, its error and the 5xx; it is not due before")
    func markRetry() throws {
        let directory = try StoreDirectory()
        defer { directory.remove() }
        let db = try open(directory)
        let entry = try db.enqueue(upload(), now: now)
        var clock = now
        var expectedDelays: [Int64] = []
        for attempt in 1...11 {
            _ = try db.markDelivering(entry.id, now: clock)
            let retried = try db.markRetry(entry.id, error: "connection refused", originStatus: attempt % 2 == 0 ? 503 : nil, now: clock)
            let delay = retried.nextAttemptAt - clock
            expectedDelays.append(delay)
            #expect(retried.status == .queued)
            #expect(retried.attempts == attempt)
            #expect(retried.lastError == "connection refused")
            #expect(retried.originStatus == (attempt % 2 == 0 ? 503 : nil))
            #expect(try db.nextDue(now: retried.nextAttemptAt - 1, concurrency: 2, limit: 10, admit: nil).isEmpty)
            #expect(try db.nextDue(now: retried.nextAttemptAt, concurrency: 2, limit: 10, admit: nil).map(\.id) == [entry.id])
            clock = retried.nextAttemptAt
        }
        #expect(expectedDelays == [1000, 2000, 4000, 8000, 16_000, 32_000, 64_000, 128_000, 256_000, 300_000, 300_000])
        #expect(throws: DeferredStoreError.wrongState(id: entry.id, status: .queued)) {
            try db.markRetry(entry.id, error: "x", originStatus: nil, now: clock)
        }
        // Retrying kept the body and the queue time (it stays the oldest).
        #expect(try db.body(entry.id) == upload().body)
        #expect(try db.get(entry.id)?.queuedAt == now)
        try expectTotals(db, 1, 1000)
    }

    @Test("markFailed ends a queued or delivering entry with its error and drops the body")
    func markFailed() throws {
        let directory = try StoreDirectory()
        defer { directory.remove() }
        let db = try open(directory)
        let queued = try db.enqueue(upload(), now: now)
        let running = try db.enqueue(upload(), now: now)
        _ = try db.markDelivering(running.id, now: now)
        let failedQueued = try db.markFailed(queued.id, error: "URL no longer allowed", now: now + 1)
        let failedRunning = try db.markFailed(running.id, error: "TLS certificate rejected", now: now + 2)
        #expect(failedQueued.status == .failed && failedQueued.lastError == "URL no longer allowed" && failedQueued.finishedAt == now + 1)
        #expect(failedRunning.status == .failed && failedRunning.deliveredAt == nil)
        #expect(throws: DeferredStoreError.wrongState(id: queued.id, status: .failed)) {
            try db.markFailed(queued.id, error: "again", now: now)
        }
        try expectTotals(db, 0, 0)
    }

    @Test("cancel: a queued entry only; a running delivery, a finished entry and an unknown id are refused")
    func cancel() throws {
        let directory = try StoreDirectory()
        defer { directory.remove() }
        let db = try open(directory)
        let queued = try db.enqueue(upload(), now: now)
        let running = try db.enqueue(upload(), now: now)
        _ = try db.markDelivering(running.id, now: now)
        let cancelled = try db.cancel(queued.id, now: now + 7)
        #expect(cancelled.status == .cancelled && cancelled.finishedAt == now + 7)
        #expect(throws: DeferredStoreError.wrongState(id: queued.id, status: .cancelled)) { try db.cancel(queued.id, now: now) }
        #expect(throws: DeferredStoreError.wrongState(id: running.id, status: .delivering)) { try db.cancel(running.id, now: now) }
        #expect(throws: DeferredStoreError.notFound(id: "unknown")) { try db.cancel("unknown", now: now) }
        #expect(throws: DeferredStoreError.wrongState(id: queued.id, status: .cancelled)) { try db.body(queued.id) }
        try expectTotals(db, 1, 1000)
    }

    @Test("expire: queued entries as old as max-age end expired; younger ones and running deliveries stay")
    func expire() throws {
        let directory = try StoreDirectory()
        defer { directory.remove() }
        let db = try open(directory)
        let maxAge: Int64 = 7 * 86_400_000
        let old = try db.enqueue(upload(), now: now - maxAge)
        let older = try db.enqueue(upload(), now: now - maxAge - 1)
        let young = try db.enqueue(upload(), now: now - maxAge + 1)
        let running = try db.enqueue(upload(), now: now - maxAge - 5)
        _ = try db.markDelivering(running.id, now: now)
        let expired = try db.expire(now: now, maxAge: maxAge)
        #expect(Set(expired.map(\.id)) == [old.id, older.id])
        #expect(expired.allSatisfy { $0.status == .expired && $0.finishedAt == now })
        #expect(try db.get(young.id)?.status == .queued)
        #expect(try db.get(running.id)?.status == .delivering)
        try expectTotals(db, 2, 2000)
        // The running one fails and comes back: the next pass expires it.
        _ = try db.markRetry(running.id, error: "timeout", originStatus: nil, now: now)
        #expect(try db.expire(now: now, maxAge: maxAge).map(\.id) == [running.id])
        #expect(try db.expire(now: now, maxAge: maxAge).isEmpty)
    }

    @Test("purge removes finished entries after the retention, never live ones")
    func purge() throws {
        let directory = try StoreDirectory()
        defer { directory.remove() }
        let db = try open(directory)
        let day = DeferralRules.finishedRetentionMilliseconds
        let live = try db.enqueue(upload(), now: now - 10 * day)
        let cancelledLongAgo = try db.enqueue(upload(), now: now - 3 * day)
        _ = try db.cancel(cancelledLongAgo.id, now: now - day)
        let cancelledRecently = try db.enqueue(upload(), now: now - 3 * day)
        _ = try db.cancel(cancelledRecently.id, now: now - day + 1)
        let delivered = try db.enqueue(upload(), now: now - 3 * day)
        _ = try db.markDelivering(delivered.id, now: now - 2 * day)
        _ = try db.markDelivered(delivered.id, originStatus: 200, now: now - 2 * day)
        #expect(try db.purgeFinished(now: now, keep: day) == 2)
        #expect(try db.get(cancelledLongAgo.id) == nil)
        #expect(try db.get(delivered.id) == nil)
        #expect(try db.get(cancelledRecently.id)?.status == .cancelled)
        #expect(try db.get(live.id)?.status == .queued)
        #expect(try db.purgeFinished(now: now, keep: day) == 0)
        try expectTotals(db, 1, 1000)
    }

    @Test("list: oldest first, filtered by status, limited")
    func list() throws {
        let directory = try StoreDirectory()
        defer { directory.remove() }
        let db = try open(directory)
        let second = try db.enqueue(upload(), now: now + 2)
        let first = try db.enqueue(upload(), now: now + 1)
        let third = try db.enqueue(upload(), now: now + 3)
        _ = try db.cancel(third.id, now: now + 4)
        #expect(try db.list(statuses: nil, limit: 10).map(\.id) == [first.id, second.id, third.id])
        #expect(try db.list(statuses: [.queued], limit: 10).map(\.id) == [first.id, second.id])
        #expect(try db.list(statuses: [.cancelled, .expired], limit: 10).map(\.id) == [third.id])
        #expect(try db.list(statuses: nil, limit: 1).map(\.id) == [first.id])
    }

    @Test("everything survives closing and opening again; a delivery a crash left running goes back to queued")
    func reopenAndRecover() throws {
        let directory = try StoreDirectory()
        defer { directory.remove() }
        var ids: [String] = []
        do {
            let db = try open(directory)
            for index in 0..<4 { ids.append(try db.enqueue(upload(5000, seed: UInt8(index)), now: now + Int64(index)).id) }
            _ = try db.markDelivering(ids[0], now: now)
            _ = try db.markDelivering(ids[1], now: now)
            _ = try db.markDelivered(ids[1], originStatus: 204, now: now)
            _ = try db.markDelivering(ids[2], now: now)
            #expect(db.recovered == 0)
        }
        let db = try open(directory)
        #expect(db.recovered == 2)
        #expect(try db.get(ids[0])?.status == .queued)
        #expect(try db.get(ids[0])?.attempts == 1)
        #expect(try db.get(ids[1])?.status == .delivered)
        #expect(try db.get(ids[2])?.status == .queued)
        for index in [0, 2, 3] { #expect(try db.body(ids[index]) == upload(5000, seed: UInt8(index)).body) }
        try expectTotals(db, 3, 15_000)
        #expect(try db.nextDue(now: now + 10, concurrency: 5, limit: 10, admit: nil).map(\.id) == [ids[0], ids[2], ids[3]])
    }

    @Test("a second store on the same file is refused while the first is open")
    func inUse() throws {
        let directory = try StoreDirectory()
        defer { directory.remove() }
        let first = try open(directory)
        _ = try first.enqueue(upload(), now: now)
        #expect(throws: DeferredStoreError.inUse(path: directory.database)) { try open(directory) }
        // The first is unharmed.
        _ = try first.enqueue(upload(), now: now)
        try expectTotals(first, 2, 2000)
    }
}

@Suite("Deferral rules")
struct DeferralRulesTests {
    @Test("origins: lowercase, default port written, userinfo and path dropped", arguments: [
        ("http://a.example/x", "http://a.example:80"),
        ("HTTP://A.Example:80/x?y", "http://a.example:80"),
        ("https://a.example", "https://a.example:443"),
        ("https://a.example:8443/", "https://a.example:8443"),
        ("http://user:pw@a.example:81/", "http://a.example:81"),
        ("http://[::1]/x", "http://[::1]:80"),
        ("http://[::1]:8080/x", "http://[::1]:8080"),
        ("http://a.example?q", "http://a.example:80"),
    ])
    func origin(_ url: String, _ expected: String) {
        #expect(DeferralRules.origin(of: url) == expected)
    }

    @Test("base64url without padding (RFC 4648 §5 test vectors)", arguments: [
        ("", ""), ("f", "Zg"), ("fo", "Zm8"), ("foo", "Zm9v"), ("foob", "Zm9vYg"), ("fooba", "Zm9vYmE"), ("foobar", "Zm9vYmFy"),
    ])
    func base64url(_ text: String, _ expected: String) {
        #expect(DeferralRules.base64url(Array(text.utf8)) == expected)
        #expect(DeferralRules.base64url([0xFB, 0xFF, 0xBF]) == "-_-_")
    }

    @Test("headers come back exactly, in order; a damaged encoding is refused")
    func headerCoding() {
        let fields = [HTTPField(name: "A", value: "1"), HTTPField(name: "a", value: "x: y\r\n"), HTTPField(name: "Empty", value: ""),
                      HTTPField(name: "Unicode", value: "\u{E9}\u{1F600}"), HTTPField(name: "A", value: "2")]
        let encoded = HeaderCoding.encode(fields)
        #expect(HeaderCoding.decode(encoded) == fields)
        #expect(HeaderCoding.decode([]) == [])
        #expect(HeaderCoding.decode(Array(encoded.dropLast())) == nil)
        #expect(HeaderCoding.decode([5, 0, 0, 0, 65]) == nil)
    }
}
