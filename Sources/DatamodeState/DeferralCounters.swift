import Synchronization

/// `datamode_deferred_total{outcome}` (SPEC §18.3): uploads stored (`queued`), and how stored uploads ended, and
/// uploads refused because the queue or the disk was full (`full`). Shared by the workers (intake), the delivery
/// and the admin plane (cancel); a mutex taken once per stored upload, never per request.
public final class DeferralCounters: Sendable {
    public enum Outcome: String, CaseIterable, Sendable {
        case queued, delivered, failed, expired, cancelled
        /// Refused with `"deferral": "full"`.
        case refusedFull = "full"
    }

    private let counts = Mutex([Int](repeating: 0, count: Outcome.allCases.count))

    public init() {}

    public func count(_ outcome: Outcome, by n: Int = 1) {
        let index = Outcome.allCases.firstIndex(of: outcome)!
        counts.withLock { $0[index] += n }
    }

    /// Every outcome with its count, zeros included, in `Outcome` order.
    public var snapshot: [(outcome: String, count: Int)] {
        let values = counts.withLock { $0 }
        return Outcome.allCases.enumerated().map { ($0.element.rawValue, values[$0.offset]) }
    }
}
