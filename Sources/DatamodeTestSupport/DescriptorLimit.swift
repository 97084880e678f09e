import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// This process's descriptor limit (RLIMIT_NOFILE).
public enum DescriptorLimit {
    /// Raises the soft limit to at least `wanted` (capped at the hard limit); returns the soft limit now in force.
    /// Raising is process-wide and harmless to other tests; it is never lowered here.
    @discardableResult
    public static func raise(to wanted: Int) -> Int {
        var limit = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return 0 }
        let target = min(rlim_t(wanted), limit.rlim_max)
        if limit.rlim_cur < target {
            limit.rlim_cur = target
            _ = setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
            _ = getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
        }
        return Int(limit.rlim_cur)
    }
}
