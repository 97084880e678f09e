import DatamodeHTTP

/// Where a stored upload is in its life (SPEC §18.3 `GET /deferred`).
///
/// `queued` and `delivering` are the live states: their entries keep their bodies and count against `max-bytes`.
/// The other four are final: the body is dropped when the entry ends (in its transaction, or its file right after
/// it), and the entry itself (method, URL, status, times) is kept for `GET /deferred` until `purgeFinished`
/// removes it, 24 h later.
public enum DeferredStatus: String, Sendable, CaseIterable, Hashable {
    /// Stored, waiting for its conditions to lift or for its next attempt (`nextAttemptAt`).
    case queued
    /// Handed to the engine, which is sending it to the origin. A crash leaves it here; the next open puts it
    /// back to `queued` (at least once).
    case delivering
    /// The origin answered (`originStatus`); a `4xx` is final too (SPEC §18.3).
    case delivered
    /// Given up without an answer from the origin, for a reason that retrying cannot fix (`lastError`).
    case failed
    /// Not delivered within `max-age`.
    case expired
    /// `DELETE /deferred/{id}` before it was delivered.
    case cancelled

    /// Whether an entry in this state still holds its body and counts against `max-bytes`.
    public var isLive: Bool { self == .queued || self == .delivering }
}

/// An upload to store: what the client sent, as received (SPEC §18.3).
public struct DeferredUpload: Sendable, Equatable {
    public var method: String
    /// The absolute URL it is for (`RequestTarget.absoluteURL`: lowercase scheme and host).
    public var url: String
    /// The header fields as received, in order, names as the client spelt them.
    public var headers: [HTTPField]
    public var body: [UInt8]
    /// The session it belongs to (SPEC §12), judged by that session's mode when it is delivered; nil: global.
    public var session: String?

    public init(method: String, url: String, headers: [HTTPField], body: [UInt8], session: String? = nil) {
        self.method = method
        self.url = url
        self.headers = headers
        self.body = body
        self.session = session
    }
}

/// A stored upload without its body (read it with `DeferredStore.readBody`). Times are wall-clock milliseconds
/// since the Unix epoch, as the caller passed them as `now`.
public struct DeferredEntry: Sendable, Equatable {
    /// Unguessable and URL-safe: 22 characters of base64url, 128 random bits (`Data-Mode-Deferred`, `/deferred/{id}`).
    public var id: String
    public var method: String
    public var url: String
    /// `scheme://host:port` of `url`, lowercase, the port always written: what `concurrency` is counted per.
    public var origin: String
    public var headers: [HTTPField]
    /// The body's length. Kept after the body is dropped, for `GET /deferred`.
    public var bytes: Int
    public var session: String?
    /// The client's own `Idempotency-Key`, else `id`: what the delivery carries (SPEC §18.3).
    public var idempotencyKey: String
    public var status: DeferredStatus
    /// Deliveries started (`markDelivering`), including one a crash interrupted.
    public var attempts: Int
    public var lastError: String?
    /// The origin's status of the last answer: the final one once `delivered`, a `5xx` while retrying.
    public var originStatus: Int?
    public var queuedAt: Int64
    /// Not before this may it be delivered (backoff after a failed attempt); `queuedAt` at first.
    public var nextAttemptAt: Int64
    public var deliveredAt: Int64?
    /// When it reached a final state; `purgeFinished` counts the 24 h from here.
    public var finishedAt: Int64?

    public init(id: String, method: String, url: String, origin: String, headers: [HTTPField], bytes: Int,
                session: String?, idempotencyKey: String, status: DeferredStatus,
                attempts: Int, lastError: String?, originStatus: Int?, queuedAt: Int64, nextAttemptAt: Int64,
                deliveredAt: Int64?, finishedAt: Int64?) {
        self.id = id
        self.method = method
        self.url = url
        self.origin = origin
        self.headers = headers
        self.bytes = bytes
        self.session = session
        self.idempotencyKey = idempotencyKey
        self.status = status
        self.attempts = attempts
        self.lastError = lastError
        self.originStatus = originStatus
        self.queuedAt = queuedAt
        self.nextAttemptAt = nextAttemptAt
        self.deliveredAt = deliveredAt
        self.finishedAt = finishedAt
    }

    /// Whether the client sent `Idempotency-Key` itself: then the delivery adds none. (The id is made after the
    /// request arrived, so a client cannot have sent it.)
    public var clientSentIdempotencyKey: Bool { idempotencyKey != id }
}

/// The live part of the queue (`queued` and `delivering`): `datamode_deferred_queue_entries` and
/// `datamode_deferred_queue_bytes`.
public struct DeferredTotals: Sendable, Equatable {
    public var entries: Int
    /// Body bytes.
    public var bytes: UInt64
    public init(entries: Int, bytes: UInt64) {
        self.entries = entries
        self.bytes = bytes
    }
}

/// The bounds the store enforces itself (the `deferral` section's `max-body` and `max-bytes`), and where it keeps
/// bodies.
public struct DeferredStoreLimits: Sendable, Equatable {
    /// The largest body stored.
    public var maxBody: Int
    /// All live bodies together.
    public var maxBytes: UInt64
    /// Bodies up to this size are kept in the database, in the entry's own transaction (one fsync); larger ones
    /// in a file of their own beside it, written and fsync'd before the entry is committed (three fsyncs, but the
    /// bytes are written once instead of twice, WAL then database). bench/deferral-store measured the two; README
    /// "Deferral store" has the figures. Changed only to measure or to test one layout alone.
    public var inlineBody: Int

    /// The default `inlineBody`: 64 KiB.
    public static let defaultInlineBody = 64 << 10

    public init(maxBody: Int = 64 << 20, maxBytes: UInt64 = 1 << 30, inlineBody: Int = DeferredStoreLimits.defaultInlineBody) {
        self.maxBody = maxBody
        self.maxBytes = maxBytes
        self.inlineBody = inlineBody
    }
}

/// Why a store operation did not happen. Every error about the file names it.
public enum DeferredStoreError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The file (or its directory) cannot be opened or created.
    case cannotOpen(path: String, detail: String)
    /// The file is not an SQLite database (garbage, truncated below its header, another format).
    case notADatabase(path: String)
    /// An SQLite database, but not a deferral store (another application's, or ours without our schema).
    case foreign(path: String, detail: String)
    /// The database is damaged: `quick_check` found a fault, or SQLite reported corruption while using it.
    case corrupt(path: String, detail: String)
    /// Written by a newer datamode-proxy (its schema version is above the one this build knows).
    case newerSchema(path: String, version: Int)
    /// Another process (or another store in this one) has it open: two proxies on one state directory would
    /// deliver every upload twice.
    case inUse(path: String)
    /// The live bodies would exceed `max-bytes`: the upload is refused with `"deferral": "full"`.
    case full(bytes: UInt64, maxBytes: UInt64)
    /// The file system is full (SQLITE_FULL, ENOSPC): the upload is refused, nothing stored before is lost.
    case diskFull(path: String)
    /// The body is larger than `max-body`.
    case tooLarge(bytes: Int, maxBody: Int)
    /// No entry has this id (never had, or it was purged).
    case notFound(id: String)
    /// The entry is not in a state this operation applies to (say, `markDelivered` on a `queued` entry, or
    /// `cancel` on a `delivered` one).
    case wrongState(id: String, status: DeferredStatus)
    /// Any other failure of the file (an I/O error, a read-only file system).
    case io(path: String, detail: String)
    /// The store was closed.
    case closed

    /// Whether the engine refuses the upload with `"deferral": "full"` (SPEC §18.3): the queue or the disk is full.
    public var isFull: Bool {
        switch self {
        case .full, .diskFull: true
        default: false
        }
    }

    public var description: String {
        switch self {
        case .cannotOpen(let path, let detail): "\(path): cannot open the deferral store: \(detail)"
        case .notADatabase(let path): "\(path): not a deferral store (not an SQLite database; a damaged or foreign file)"
        case .foreign(let path, let detail): "\(path): not a deferral store: \(detail)"
        case .corrupt(let path, let detail): "\(path): the deferral store is damaged: \(detail)"
        case .newerSchema(let path, let version):
            "\(path): the deferral store has schema version \(version), newer than this build's \(DeferredDatabase.schemaVersion)"
        case .inUse(let path): "\(path): the deferral store is in use by another process"
        case .full(let bytes, let maxBytes): "the deferral queue is full (\(bytes) of \(maxBytes) bytes)"
        case .diskFull(let path): "\(path): the file system is full"
        case .tooLarge(let bytes, let maxBody): "the body (\(bytes) bytes) is larger than max-body (\(maxBody) bytes)"
        case .notFound(let id): "no deferred upload \(id)"
        case .wrongState(let id, let status): "deferred upload \(id) is \(status.rawValue)"
        case .io(let path, let detail): "\(path): \(detail)"
        case .closed: "the deferral store is closed"
        }
    }
}
