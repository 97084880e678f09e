import Synchronization

/// One refused request, as `GET /refusals` and the admin page show it (SPEC §20).
public struct Refusal: Sendable, Equatable {
    /// Wall-clock nanoseconds since the Unix epoch.
    public var time: Int64
    public var client: String
    public var method: String
    public var url: String
    /// The stable `error` code (`constrained`, `budget-exhausted`, …).
    public var error: String
    /// Every violated condition (SPEC §15), or the error code alone when the refusal is not a condition's.
    public var reasons: [String]
    /// The rule that set the tags, if one did.
    public var rule: String?
    /// The session the request belonged to (SPEC §12), if any.
    public var session: String?

    public init(time: Int64, client: String, method: String, url: String, error: String, reasons: [String],
                rule: String?, session: String?) {
        self.time = time
        self.client = client
        self.method = method
        self.url = url
        self.error = error
        self.reasons = reasons
        self.rule = rule
        self.session = session
    }
}

/// One worker's latest refusals: a ring of `capacity`, written by that worker only when it refuses a request, read
/// by the admin plane now and then. The lock is never contended on the request path (one writer; a reader takes
/// it for a copy of at most `capacity` values), and a forwarded request never touches it.
public final class RefusalRing: Sendable {
    /// How many refusals `GET /refusals` shows (SPEC §20: the last 200), and so how many each worker keeps.
    public static let capacity = 200

    private struct Ring {
        var items: [Refusal] = []
        /// Where the next one goes once the ring is full.
        var next = 0
    }
    private let ring = Mutex(Ring())

    public init() {}

    public func append(_ refusal: Refusal) {
        ring.withLock { ring in
            if ring.items.count < Self.capacity {
                ring.items.append(refusal)
            } else {
                ring.items[ring.next] = refusal
                ring.next = (ring.next + 1) % Self.capacity
            }
        }
    }

    /// This worker's refusals, oldest first.
    public var refusals: [Refusal] {
        ring.withLock { ring in Array(ring.items[ring.next...] + ring.items[..<ring.next]) }
    }

    /// The latest `capacity` refusals of all `rings` together, newest first.
    public static func latest(_ rings: [RefusalRing]) -> [Refusal] {
        Array(rings.flatMap(\.refusals).sorted { $0.time > $1.time }.prefix(capacity))
    }
}
