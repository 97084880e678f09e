#if canImport(Glibc)
import Glibc
#endif

/// Time as the engine sees it. Injected (STYLE) so tests can reason about durations; the production clock
/// reads CLOCK_MONOTONIC for durations and CLOCK_REALTIME for log timestamps.
public protocol EngineClock: Sendable {
    /// Monotonic nanoseconds (durations only).
    func nowNanoseconds() -> UInt64
    /// Wall-clock time since the Unix epoch, in nanoseconds (timestamps).
    func wallNanoseconds() -> Int64
}

public struct SystemClock: EngineClock {
    public init() {}
    public func nowNanoseconds() -> UInt64 {
        var ts = timespec()
        clock_gettime(CLOCK_MONOTONIC, &ts)
        return UInt64(ts.tv_sec) * 1_000_000_000 + UInt64(ts.tv_nsec)
    }
    public func wallNanoseconds() -> Int64 {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        return Int64(ts.tv_sec) * 1_000_000_000 + Int64(ts.tv_nsec)
    }
}

/// RFC 3339 UTC timestamps without Foundation (`2026-11-22T12:28:49.123Z`).
public enum Timestamp {
    public static func rfc3339(wallNanoseconds: Int64, fractionDigits: Int = 3) -> String {
        var seconds = time_t(wallNanoseconds / 1_000_000_000)
        var parts = tm()
        gmtime_r(&seconds, &parts)
        func pad(_ value: Int32, _ width: Int) -> String {
            let text = String(value)
            return String(repeating: "0", count: max(0, width - text.count)) + text
        }
        var out = "\(pad(parts.tm_year + 1900, 4))-\(pad(parts.tm_mon + 1, 2))-\(pad(parts.tm_mday, 2))T"
        out += "\(pad(parts.tm_hour, 2)):\(pad(parts.tm_min, 2)):\(pad(parts.tm_sec, 2))"
        if fractionDigits > 0 {
            let millis = Int32((wallNanoseconds % 1_000_000_000) / 1_000_000)
            out += "." + pad(millis, 3)
        }
        return out + "Z"
    }
}
