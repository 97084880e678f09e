import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// Waiting for something that becomes true asynchronously (a counter the workers bump after the response was
/// written, a connection the proxy notices closing) without asserting anything about how long it takes:
/// the deadline only bounds a test that would otherwise hang.
public enum AdminPolling {
    /// Calls `condition` until it returns true or `timeout` passes; returns its last answer.
    @discardableResult
    public static func until(timeout: Duration = .seconds(10), interval: Duration = .milliseconds(10),
                             _ condition: () throws -> Bool) rethrows -> Bool {
        let deadline = ContinuousClock.now + timeout
        while true {
            if try condition() { return true }
            if ContinuousClock.now >= deadline { return false }
            Thread.sleep(forTimeInterval: Double(interval.components.attoseconds) / 1e18 + Double(interval.components.seconds))
        }
    }
}
