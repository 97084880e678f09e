import CDatamodeShims
import CLibevent
#if canImport(Glibc)
import Glibc
#endif

/// Speculative writes, as HAProxy does them.
///
/// A bufferevent with EV_WRITE enabled registers its write event (epoll_ctl) whenever data is added to its
/// output, waits a loop iteration for writability (epoll_wait), writes, and unregisters (epoll_ctl): 4
/// epoll_ctl and 2 extra wakeups per proxied exchange (strace -c: 14 syscalls per 1 KiB request). Instead,
/// plain TCP bufferevents keep EV_WRITE off; at the end of every callback what their outputs hold is written
/// straight away, and only when the socket does not take it all is EV_WRITE turned on, until the output is
/// empty again. A TLS filter's output is plaintext: there the socket bufferevent under it, which holds the records,
/// is written the same way (`ClientTransport.wrapFilterCallbacks`).
struct SpeculativeWriter {
    /// Whether EV_WRITE is on (data is waiting for the socket to drain).
    private(set) var waiting = false
    /// Whether the output may hold a file segment (`evbuffer_add_file`): its bytes are not in memory, so only
    /// libevent's own write (sendfile) can send them. Cleared once the output has been empty.
    private var fileQueued = false

    /// The output now holds a file segment.
    mutating func queuedFile() { fileQueued = true }

    /// Outputs larger than this go through libevent's own write path while a body is still streaming into them.
    /// Speculating on bulk bodies measured worse (1.37 against 0.92 CPU s/GB for 100 MiB in the same bench; in
    /// issue 31's rig still 0.43 against 0.40 for an unspliced 100 MiB body), and the saving is per exchange, not
    /// per byte. An output that nothing streams into any more is written whatever its size (`flush(_:output:whole:)`).
    static let speculativeLimit = 16 * 1024
    /// A TLS client's records (`ClientTransport.startTLS`): a 100 KiB answer's ~104 KiB of records went through
    /// libevent's write path, with an epoll_ctl pair and a loop round each time (perf tracepoints: 4.5 epoll_ctl and
    /// 3.0 writev a request); written at once they cost 145 against 164 µs a request (issue 31's HTTPS 100 KiB row).
    /// Bulk downloads keep the socket's output above this and go on through libevent's path.
    static let tlsRecordsLimit = 256 * 1024
    /// Outputs up to this are written speculatively.
    var limit = Self.speculativeLimit
    /// The output has no callback of libevent's (`takeOverOutputCallback`): while EV_WRITE is on, this writer puts
    /// libevent's rule back (`dm_socket_output_watch`), so the buffer's callback list is empty the rest of the time.
    private var watchesOutput = false

    /// Removes libevent's callback from `bev`'s output (`dm_socket_output_callbacks_off`); from now on this writer
    /// must be the only one to turn `bev`'s EV_WRITE on. Only while EV_WRITE is off.
    mutating func takeOverOutputCallback(_ bev: OpaquePointer) {
        guard !watchesOutput, !waiting else { return }
        dm_socket_output_callbacks_off(bev)
        watchesOutput = true
    }

    @inline(__always)
    private mutating func startWaiting(_ bev: OpaquePointer) {
        bufferevent_enable(bev, Int16(EV_WRITE))
        if watchesOutput { dm_socket_output_watch(bev, 1) }
        waiting = true
    }

    /// Writes what `bev`'s output holds; enables EV_WRITE only if some remains. Errors are left for libevent
    /// to report: data stays queued, EV_WRITE goes on, and its write fails again with the error event.
    ///
    /// `whole`: nothing streams into the output any more (a response ended in this callback and no other is being
    /// relayed), so it is written now whatever its size. Through libevent's path a 100 KiB answer cost an
    /// epoll_ctl pair, a loop round and a writev: 35.7 against 28.6 µs of proxy CPU a request in issue 31's rig
    /// (wrk, 50 connections, 100 KiB), nearly all of it kernel time; 40.3 against 34.8 in the bench (2026-11-30-1549).
    /// `fd`: `bev`'s socket (-1 when it has none yet), as its owner keeps it.
    mutating func flush(_ bev: OpaquePointer, fd: Int32, output: OpaquePointer, whole: Bool = false) {
        guard !waiting else { return }
        let pending = evbuffer_get_length(output)
        guard pending > 0 else {
            fileQueued = false
            return
        }
        guard pending <= limit || whole else {
            startWaiting(bev)
            return
        }
        if fd >= 0 {
            // A socket bufferevent keeps the front of its output frozen except inside its own write; do the
            // same as it does around evbuffer_write_atmost.
            evbuffer_unfreeze(output, 1)
            if fileQueued { evbuffer_write(output, fd) } else { Self.send(output, fd: fd) }
            evbuffer_freeze(output, 1)
        }
        if evbuffer_get_length(output) == 0 { fileQueued = false }
        if evbuffer_get_length(output) > 0 { startWaiting(bev) }
    }

    /// At most this many bytes over more than one chain are copied into one buffer and go with send(2), not
    /// sendmsg(2): a small relayed answer is two chains (the head written here, the body as read), and sendmsg costs
    /// the kernel more than the copy costs us (perf, 1 KiB keep-alive against nginx: `____sys_sendmsg`,
    /// `___sys_sendmsg`, `__sys_sendmsg`, `copy_msghdr_from_user` and a second `__check_object_size`, ~1.2 samples
    /// in 1,000 requests at 4,999 Hz, against ~0.4 for `__sys_sendto`).
    static let gatherLimit = 4096

    /// Writes the front of `output` (at most 16 chains: a TLS output has a chain per record) with one send(2), or
    /// sendmsg(2) when it spans chains holding more than `gatherLimit`, and drains what the socket took. libevent's
    /// `evbuffer_write` uses writev(2), which goes through the VFS layer (`vfs_writev`, `fdget_pos`) on every call;
    /// the socket calls do not. Failures leave the data queued: EV_WRITE goes on and libevent's own write reports the
    /// error.
    private static func send(_ output: OpaquePointer, fd: Int32) {
        var vectors = (iovec(), iovec(), iovec(), iovec(), iovec(), iovec(), iovec(), iovec(),
                       iovec(), iovec(), iovec(), iovec(), iovec(), iovec(), iovec(), iovec())
        withUnsafeMutableBytes(of: &vectors) { raw in
            // On Linux <event2/buffer.h> defines evbuffer_iovec as struct iovec.
            let vecs = raw.baseAddress!.assumingMemoryBound(to: iovec.self)
            let count = Int(evbuffer_peek(output, -1, nil, vecs, 16))
            guard count > 0 else { return }
            let used = min(count, 16)
            var total = 0
            for i in 0..<used { total += vecs[i].iov_len }
            let sent: Int
            if used == 1 {
                sent = dm_send(fd, vecs[0].iov_base, total, Int32(MSG_NOSIGNAL))
            } else if total <= gatherLimit {
                sent = withUnsafeTemporaryAllocation(byteCount: gatherLimit, alignment: 16) { gathered in
                    var offset = 0
                    for i in 0..<used {
                        memcpy(gathered.baseAddress! + offset, vecs[i].iov_base, vecs[i].iov_len)
                        offset += vecs[i].iov_len
                    }
                    return dm_send(fd, gathered.baseAddress, total, Int32(MSG_NOSIGNAL))
                }
            } else {
                var message = msghdr()
                message.msg_iov = vecs
                message.msg_iovlen = used
                sent = dm_sendmsg(fd, &message, Int32(MSG_NOSIGNAL))
            }
            if sent > 0 { evbuffer_drain(output, sent) }
        }
    }

    /// Hands the writing to libevent's path until the output is empty again (`drained`).
    mutating func waitForSocket(_ bev: OpaquePointer) {
        guard !waiting else { return }
        startWaiting(bev)
    }

    /// From the write callback: once the output is empty, EV_WRITE goes off again.
    mutating func drained(_ bev: OpaquePointer, output: OpaquePointer) {
        guard waiting, evbuffer_get_length(output) == 0 else { return }
        fileQueued = false
        bufferevent_disable(bev, Int16(EV_WRITE))
        if watchesOutput { dm_socket_output_watch(bev, 0) }
        waiting = false
    }
}
