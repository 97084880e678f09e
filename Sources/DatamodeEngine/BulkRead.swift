import CLibevent
#if canImport(Glibc)
import Glibc
#endif

/// Reads past libevent 2.1's 4 KiB-per-callback limit.
///
/// `evbuffer_read` in libevent 2.1 caps every read at `EVBUFFER_MAX_READ` (4096 bytes) whatever
/// `bufferevent_set_max_single_read` says, so a 100 MiB body cost ~26,000 wakeups, each an epoll_wait,
/// an epoll_ctl, a FIONREAD ioctl and a readv (measured with strace -c). When a callback's read came back
/// full, more is probably waiting: this reads it straight into the evbuffer's reserved space with one
/// readv per 128 KiB, bounded by the caller's budget (the watermark room), so backpressure still holds.
/// Plain TCP only: a TLS bufferevent's socket carries records, not payload.
enum BulkRead {
    /// What libevent 2.1 reads per callback at most.
    static let libeventReadCap = 4096
    static let chunk = 128 * 1024

    /// Reads up to `budget` bytes from `fd` into `buffer`; returns how many. Stops at EAGAIN, EOF or an error
    /// (libevent sees those on its next read and reports them as usual).
    @discardableResult
    static func readAvailable(fd: Int32, into buffer: OpaquePointer, budget: Int) -> Int {
        guard fd >= 0 else { return 0 }
        // A socket bufferevent keeps the end of its input buffer frozen except inside its own read; do the
        // same as it does around evbuffer_read.
        evbuffer_unfreeze(buffer, 0)
        defer { evbuffer_freeze(buffer, 0) }
        var total = 0
        var vectors = (iovec(), iovec())
        while total < budget {
            let want = min(budget - total, chunk)
            let got: Int = withUnsafeMutableBytes(of: &vectors) { raw -> Int in
                // On Linux <event2/buffer.h> defines evbuffer_iovec as struct iovec.
                let vecs = raw.baseAddress!.assumingMemoryBound(to: iovec.self)
                let count = Int(evbuffer_reserve_space(buffer, want, vecs, 2))
                guard count > 0 else { return -1 }
                let n = readv(fd, vecs, Int32(count))
                guard n > 0 else {
                    evbuffer_commit_space(buffer, vecs, 0)
                    return -1
                }
                var remaining = n
                var used = 0
                for i in 0..<count where remaining > 0 {
                    let length = min(vecs[i].iov_len, remaining)
                    vecs[i].iov_len = length
                    remaining -= length
                    used += 1
                }
                evbuffer_commit_space(buffer, vecs, Int32(used))
                return n
            }
            if got <= 0 { break }
            total += got
            if got < want { break }  // the socket is drained
        }
        return total
    }
}
