import DatamodeDeferral
import DatamodeState
import Foundation
import Synchronization

/// What the admin plane needs of the deferral store (SPEC §18.3), wired by the composition root.
public struct DeferralAdmin: Sendable {
    public let store: DeferredStore
    public let counters: DeferralCounters
    /// Starts delivering every queued upload now; returns how many are queued.
    public let flush: @Sendable () -> Int
    /// Wall-clock milliseconds.
    public let now: @Sendable () -> Int64

    public init(store: DeferredStore, counters: DeferralCounters, flush: @escaping @Sendable () -> Int,
                now: @escaping @Sendable () -> Int64) {
        self.store = store
        self.counters = counters
        self.flush = flush
        self.now = now
    }
}

/// `GET /deferred`, `GET|DELETE /deferred/{id}`, `POST /deferred/flush` (SPEC §18.3).
///
/// The store works on its own thread; these wait for its answer on the control loop (a read of an indexed table,
/// a cancel's commit), bounded by `timeout`: the workers' loops never wait for it.
public struct DeferredEndpoint {
    let api: AdminAPI
    static let timeout: Duration = .seconds(10)

    func handleCollection(_ request: AdminRequest) -> AdminResponse {
        guard let deferral = api.deferral else { return Self.unavailable() }
        switch Self.wait({ deferral.store.list(completion: $0) }) {
        case .success(let entries): return AdminJSON.ok(entries.map(Self.document))
        case .failure(let error): return Self.failure(error)
        }
    }

    /// `pathSegment`: the `{id}` of the path as received, percent-encoded; a 404 quotes it so
    /// (`AdminPathSegment.quoted`), never decoded into the answer, and one that does not decode to text is no upload's.
    func handleItem(_ request: AdminRequest, pathSegment: String) -> AdminResponse {
        guard let deferral = api.deferral else { return Self.unavailable() }
        let notFound = AdminProblem.response(404, "not-found", "no deferred upload \(AdminPathSegment.quoted(pathSegment))")
        guard let id = pathSegment.removingPercentEncoding, !id.isEmpty else { return notFound }
        switch request.method {
        case "DELETE":
            switch Self.wait({ deferral.store.cancel(id, now: deferral.now(), completion: $0) }) {
            case .success(let entry):
                deferral.counters.count(.cancelled)
                api.events.emit(.deferred, scope: entry.session ?? "global", data: Self.eventData(entry, outcome: "cancelled"))
                return AdminJSON.ok(Self.document(entry))
            case .failure(.notFound): return notFound
            case .failure(let error): return Self.failure(error)
            }
        default:
            switch Self.wait({ deferral.store.get(id, completion: $0) }) {
            case .success(let entry?): return AdminJSON.ok(Self.document(entry))
            case .success(nil): return notFound
            case .failure(let error): return Self.failure(error)
            }
        }
    }

    func handleFlush(_ request: AdminRequest) -> AdminResponse {
        guard let deferral = api.deferral else { return Self.unavailable() }
        let queued = deferral.flush()
        api.logger.info("deferred uploads flushed through the admin API", metadata: ["queued": "\(queued)"])
        return AdminJSON.ok(["flushing": queued], status: 202)
    }

    /// One entry as `GET /deferred` shows it: id, method, url, bytes, status, attempts, lastError, queuedAt,
    /// deliveredAt, originStatus, and its session.
    static func document(_ entry: DeferredEntry) -> [String: Any] {
        var document: [String: Any] = [
            "id": entry.id, "method": entry.method, "url": entry.url, "bytes": entry.bytes,
            "status": entry.status.rawValue, "attempts": entry.attempts,
            "queuedAt": time(entry.queuedAt),
            "lastError": entry.lastError ?? NSNull(),
            "deliveredAt": entry.deliveredAt.map(time) ?? NSNull(),
            "originStatus": entry.originStatus ?? NSNull(),
            "session": entry.session ?? NSNull(),
            "idempotencyKey": entry.idempotencyKey,
        ]
        if entry.status == .queued && entry.nextAttemptAt > entry.queuedAt {
            document["nextAttemptAt"] = time(entry.nextAttemptAt)
        }
        return document
    }

    /// A `deferred` event (SPEC §18.3): `outcome` is queued, delivered, failed, expired or cancelled.
    public static func eventData(_ entry: DeferredEntry, outcome: String) -> [String: Any] {
        var data = document(entry)
        data["outcome"] = outcome
        data["scope"] = entry.session ?? "global"
        return data
    }

    static func time(_ milliseconds: Int64) -> String {
        Timestamp.rfc3339(wallNanoseconds: milliseconds * 1_000_000)
    }

    static func unavailable() -> AdminResponse {
        AdminProblem.response(503, "store-unavailable", "this proxy runs without a deferral store")
    }

    static func failure(_ error: DeferredStoreError) -> AdminResponse {
        switch error {
        case .notFound(let id): AdminProblem.response(404, "not-found", "no deferred upload \(id)")
        case .wrongState(let id, let status):
            AdminProblem.response(409, "wrong-state", "deferred upload \(id) is \(status.rawValue)",
                                  members: ["status": status.rawValue])
        default: AdminProblem.response(503, "store-unavailable", "\(error)")
        }
    }

    /// Runs a store operation and waits for its answer, at most `timeout`.
    static func wait<T: Sendable>(_ operation: (@escaping @Sendable (Result<T, DeferredStoreError>) -> Void) -> Void)
        -> Result<T, DeferredStoreError> {
        let semaphore = DispatchSemaphore(value: 0)
        let box = ResultBox<T>()
        operation { result in
            box.value.withLock { $0 = result }
            semaphore.signal()
        }
        let seconds = timeout.components.seconds
        guard semaphore.wait(timeout: .now() + .seconds(Int(seconds))) == .success else {
            return .failure(.io(path: "deferral store", detail: "no answer within \(seconds) s"))
        }
        return box.value.withLock { $0 } ?? .failure(.closed)
    }
}

final class ResultBox<T: Sendable>: Sendable {
    let value = Mutex<Result<T, DeferredStoreError>?>(nil)
}
