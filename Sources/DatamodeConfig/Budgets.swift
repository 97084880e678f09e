import DatamodePolicy
#if canImport(Glibc)
import Glibc
#endif

/// A data budget (SPEC §11): bytes exchanged with origins for the traffic it matches, per UTC period.
public struct Budget: Sendable, Hashable {
    public var name: String
    /// The allowance per period, in bytes.
    public var bytes: UInt64
    public var period: BudgetPeriod
    public var match: BudgetMatch
    /// What happens to matching traffic once the allowance is spent, until the period ends.
    public var then: BudgetAction
    /// Transfers and tunnels in flight are closed when the budget is spent (else they finish).
    public var hard: Bool

    public init(name: String, bytes: UInt64, period: BudgetPeriod, match: BudgetMatch = BudgetMatch(),
                then: BudgetAction, hard: Bool = false) {
        self.name = name
        self.bytes = bytes
        self.period = period
        self.match = match
        self.then = then
        self.hard = hard
    }
}

/// Which traffic a budget counts and restricts; both criteria must hold, a missing one matches everything.
public struct BudgetMatch: Sendable, Hashable {
    public var client: CIDR?
    /// A case-insensitive host glob (`*.video.example`).
    public var host: Glob?

    public init(client: CIDR? = nil, host: Glob? = nil) {
        self.client = client
        self.host = host
    }

    /// A budget without a match applies to all traffic: when spent, it changes the global mode (`GET /mode`).
    public var matchesEverything: Bool { client == nil && host == nil }

    public func matches(client address: IPAddress?, host name: String) -> Bool {
        if let client {
            guard let address, client.contains(address) else { return false }
        }
        if let host, !host.matches(name) { return false }
        return true
    }
}

/// `then`: conditions that join the mode, or a refusal (`403 budget-exhausted`).
public enum BudgetAction: Sendable, Hashable {
    case join(DataMode)
    case reject

    /// `reject`, a mode name (`constrained-expensive`, `low-data`) or a condition name (`ultra-constrained`).
    public init?(_ text: String) {
        if text == "reject" {
            self = .reject
        } else if let mode = DataMode(name: text), mode != .normal {
            self = .join(mode)
        } else {
            return nil
        }
    }

    public var name: String {
        switch self {
        case .reject: "reject"
        case .join(let mode): mode.name
        }
    }
}

/// A budget's period: boundaries are UTC (SPEC §11).
public enum BudgetPeriod: String, Sendable, Hashable, CaseIterable {
    case hour, day, month

    /// The start (seconds since the epoch) of the period that contains `seconds`.
    public func start(containing seconds: Int64) -> Int64 {
        switch self {
        case .hour: return seconds - Self.floorMod(seconds, 3600)
        case .day: return seconds - Self.floorMod(seconds, 86_400)
        case .month:
            var time = time_t(seconds)
            var parts = tm()
            gmtime_r(&time, &parts)
            parts.tm_mday = 1
            parts.tm_hour = 0
            parts.tm_min = 0
            parts.tm_sec = 0
            return Int64(timegm(&parts))
        }
    }

    /// The end (exclusive) of the period that starts at `start`.
    public func end(ofPeriodStarting start: Int64) -> Int64 {
        switch self {
        case .hour: return start + 3600
        case .day: return start + 86_400
        case .month:
            var time = time_t(start)
            var parts = tm()
            gmtime_r(&time, &parts)
            parts.tm_mon += 1  // timegm normalises December + 1 to January of the next year
            parts.tm_mday = 1
            parts.tm_hour = 0
            parts.tm_min = 0
            parts.tm_sec = 0
            return Int64(timegm(&parts))
        }
    }

    private static func floorMod(_ value: Int64, _ modulus: Int64) -> Int64 {
        let r = value % modulus
        return r < 0 ? r + modulus : r
    }
}

extension ConfigValue {
    /// Bytes with SI or binary units (SPEC §8): `KB`/`MB`/`GB`/`TB` powers of 1000, `KiB`/`MiB`/`GiB`/`TiB` powers of
    /// 1024, `B` or none; decimals allowed (`1.5GB`). `nil` if malformed or beyond 2^62.
    static func byteCount(_ text: String) -> UInt64? {
        let trimmed = text.trimmingCharacters(in: " ")
        let number = trimmed.prefix { ($0.isASCII && $0.isNumber) || $0 == "." }
        let unit = trimmed.dropFirst(number.count).trimmingCharacters(in: " ")
        let parts = number.split(separator: ".", omittingEmptySubsequences: false)
        guard !number.isEmpty, parts.count <= 2, parts.allSatisfy({ !$0.isEmpty }), parts[0].count <= 15,
              (parts.count == 1 || parts[1].count <= 6), let whole = UInt64(parts[0]) else { return nil }
        let multiplier: UInt64
        switch unit {
        case "", "B": multiplier = 1
        case "KB": multiplier = 1_000
        case "MB": multiplier = 1_000_000
        case "GB": multiplier = 1_000_000_000
        case "TB": multiplier = 1_000_000_000_000
        case "KiB": multiplier = 1 << 10
        case "MiB": multiplier = 1 << 20
        case "GiB": multiplier = 1 << 30
        case "TiB": multiplier = 1 << 40
        default: return nil
        }
        var fraction: UInt64 = 0
        var scale: UInt64 = 1
        if parts.count == 2 {
            for digit in parts[1] {
                fraction = fraction * 10 + UInt64(digit.wholeNumberValue!)
                scale *= 10
            }
        }
        let (product, overflow) = whole.multipliedReportingOverflow(by: multiplier)
        guard !overflow, product <= 1 << 62 else { return nil }
        return product + fraction * multiplier / scale
    }
}
