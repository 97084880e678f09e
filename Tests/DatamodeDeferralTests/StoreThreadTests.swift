@testable import DatamodeDeferral
import DatamodeHTTP
import Foundation
import Synchronization
import Testing

/// The threading contract of `DeferredStore`: operations queued and run in order on one store thread,
/// completions called there, the caller never blocked, `close` draining the queue.
@Suite("Deferred store thread")
struct StoreThreadTests {
    let now: Int64 = 1_800_000_000_000

    @Test("completions run on the store thread, never on the caller's, always the same one")
    func completionThread() throws {
        let directory = try StoreDirectory()
        defer { directory.remove() }
        let store = try DeferredStore(path: directory.database, limits: DeferredStoreLimits())
        let caller = pthread_self()
        let threads = Mutex<[pthread_t]>([])
        for _ in 0..<5 {
            let entry = try waitFor { completion in
                store.enqueue(upload(), now: now) { result in
                    threads.withLock { $0.append(pthread_self()) }
                    completion(result)
                }
            }.get()
            _ = try waitFor { completion in
                store.get(entry.id) { result in
                    threads.withLock { $0.append(pthread_self()) }
                    completion(result)
                }
            }.get()
        }
        let seen = threads.withLock { $0 }
        #expect(seen.count == 10)
        #expect(seen.allSatisfy { pthread_equal($0, caller) == 0 })
        #expect(seen.allSatisfy { pthread_equal($0, seen[0]) != 0 })
    }

    @Test("operations run in the order they were submitted; a later one sees the earlier ones")
    func order() throws {
        let directory = try StoreDirectory()
        defer { directory.remove() }
        let store = try DeferredStore(path: directory.database, limits: DeferredStoreLimits())
        let completed = Mutex<[Int]>([])
        for index in 0..<50 {
            let headers = [HTTPField(name: "X-Index", value: "\(index)")]
            store.enqueue(upload(100, headers: headers), now: now + Int64(index)) { result in
                if case .success = result { completed.withLock { $0.append(index) } }
            }
        }
        // Submitted before any of the 50 has necessarily run, it still runs after all of them.
        let listed = try waitFor { store.list(completion: $0) }.get()
        #expect(completed.withLock { $0 } == Array(0..<50))
        #expect(listed.map { $0.headers[0].value } == (0..<50).map { "\($0)" })
        #expect(store.totals == DeferredTotals(entries: 50, bytes: 5000))
    }

    @Test("a completion may submit more work without waiting on it")
    func reentrant() throws {
        let directory = try StoreDirectory()
        defer { directory.remove() }
        let store = try DeferredStore(path: directory.database, limits: DeferredStoreLimits())
        let fetched = try waitFor { (completion: @escaping @Sendable (Result<DeferredEntry?, DeferredStoreError>) -> Void) in
            store.enqueue(upload(), now: now) { result in
                guard case .success(let entry) = result else { return completion(.failure(.closed)) }
                store.markDelivering(entry.id, now: now) { _ in }
                store.get(entry.id, completion: completion)
            }
        }.get()
        #expect(fetched?.status == .delivering)
    }

    @Test("totals are read without waiting and include the operation whose completion reads them")
    func totals() throws {
        let directory = try StoreDirectory()
        defer { directory.remove() }
        let store = try DeferredStore(path: directory.database, limits: DeferredStoreLimits())
        #expect(store.totals == DeferredTotals(entries: 0, bytes: 0))
        let seen = try waitFor { (completion: @escaping @Sendable (Result<DeferredTotals, DeferredStoreError>) -> Void) in
            store.enqueue(upload(1234), now: now) { _ in completion(.success(store.totals)) }
        }.get()
        #expect(seen == DeferredTotals(entries: 1, bytes: 1234))
    }

    @Test("close runs what is queued first; afterwards an operation fails at once with .closed")
    func close() throws {
        let directory = try StoreDirectory()
        defer { directory.remove() }
        let store = try DeferredStore(path: directory.database, limits: DeferredStoreLimits())
        let stored = Atomic<Int>(0)
        for _ in 0..<10 {
            store.enqueue(upload(20_000), now: now) { result in
                if case .success = result { stored.add(1, ordering: .relaxed) }
            }
        }
        store.close()
        #expect(stored.load(ordering: .relaxed) == 10)
        let caller = pthread_self()
        let late = Mutex<(DeferredStoreError?, Bool)>((nil, false))
        store.enqueue(upload(), now: now) { result in
            if case .failure(let error) = result { late.withLock { $0 = (error, pthread_equal(pthread_self(), caller) != 0) } }
        }
        #expect(late.withLock { $0.0 } == .closed)
        #expect(late.withLock { $0.1 })
        // Closed means the file is free: a new store opens it and finds the ten.
        let reopened = try DeferredStore(path: directory.database, limits: DeferredStoreLimits())
        #expect(reopened.totals == DeferredTotals(entries: 10, bytes: 200_000))
    }

    @Test("refusals come back through the completion as typed errors")
    func refusals() throws {
        let directory = try StoreDirectory()
        defer { directory.remove() }
        let store = try DeferredStore(path: directory.database, limits: DeferredStoreLimits(maxBody: 100, maxBytes: 150))
        #expect(waitFor { store.enqueue(upload(101), now: now, completion: $0) }.failureValue == .tooLarge(bytes: 101, maxBody: 100))
        _ = try waitFor { store.enqueue(upload(100), now: now, completion: $0) }.get()
        #expect(waitFor { store.enqueue(upload(51), now: now, completion: $0) }.failureValue == .full(bytes: 100, maxBytes: 150))
        #expect(waitFor { store.cancel("nope", now: now, completion: $0) }.failureValue == .notFound(id: "nope"))
    }
}

extension Result {
    var failureValue: Failure? {
        if case .failure(let error) = self { return error }
        return nil
    }
}
