/// What happened inside one session (SPEC §12 `GET /sessions/{id}`): requests by outcome and reason, bytes each
/// way, variants served by id and the last rejected URLs. One worker's share, or the sum of all of them.
public struct SessionTally: Sendable, Equatable {
    /// One rejected request.
    public struct Rejected: Sendable, Equatable {
        public var url: String
        public var error: String
        /// Wall-clock nanoseconds since the Unix epoch.
        public var time: Int64
        public init(url: String, error: String, time: Int64) {
            self.url = url
            self.error = error
            self.time = time
        }
    }

    /// The most rejected URLs kept (SPEC §12: the last 100).
    public static let rejectedLimit = 100

    public var serial: UInt64
    /// `outcome` → `reason` (`""` when none) → count.
    public var requests: [String: [String: Int]] = [:]
    public var bytesIn = 0
    public var bytesOut = 0
    public var variants: [String: Int] = [:]
    /// Oldest first, at most `rejectedLimit`.
    public var rejected: [Rejected] = []
    /// Monotonic nanoseconds of the last request finished in the session (0: none).
    public var lastSeen: UInt64 = 0

    public init(serial: UInt64) { self.serial = serial }

    /// Adds another worker's share (of the same session incarnation).
    public mutating func merge(_ other: SessionTally) {
        for (outcome, reasons) in other.requests {
            for (reason, count) in reasons { requests[outcome, default: [:]][reason, default: 0] += count }
        }
        bytesIn += other.bytesIn
        bytesOut += other.bytesOut
        for (id, count) in other.variants { variants[id, default: 0] += count }
        if !other.rejected.isEmpty {
            rejected = Array((rejected + other.rejected).sorted { $0.time < $1.time }.suffix(Self.rejectedLimit))
        }
        lastSeen = max(lastSeen, other.lastSeen)
    }

    /// All requests counted.
    public var requestCount: Int { requests.values.reduce(0) { $0 + $1.values.reduce(0, +) } }
}
