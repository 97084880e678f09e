import CDatamodeShims
import CLibevent
#if canImport(Glibc)
import Glibc
#endif

/// Reads a plain TCP socket into its bufferevent's input with one `recv(2)` per readiness, in place of libevent's own
/// read path (issue 31).
///
/// libevent 2.1's `evbuffer_read` asks the kernel how much is readable (`ioctl(FIONREAD)`) before every `readv`, only
/// to size the read: two of the six system calls of a proxied 1 KiB exchange (strace; HAProxy reads with one `recv`).
/// So a plain socket's bufferevent keeps EV_READ off for good and writes only; this persistent read event takes its
/// place. A readiness reads at most 4 KiB (libevent's own cap) into a scratch buffer and appends it to the input
/// (the chain is sized to what came, as libevent's FIONREAD-sized read makes it); a full read leaves the rest to
/// `BulkRead`, as before. The outcome goes to the owner's usual bufferevent callbacks: bytes to the read callback, EOF or an error
/// to the event callback with `BEV_EVENT_READING`, reading already off, as `bufferevent_readcb` does.
///
/// A TLS client's socket is read the same way, its records into the socket bufferevent's input for the filter
/// (`ClientTransport.tlsSocketReadable`), and so is a TLS origin's (`TLSSocketFeed`); HTTP/2 pairs keep libevent's
/// read path. A socket that goes to a splice relay or parking stops the reader first (`stop`, `setReading(false)`).
struct SocketReader {
    private var event: OpaquePointer?
    /// Whether the read event is added (EV_READ "enabled").
    private(set) var isReading = false

    /// The reader owns the socket's reading: its owner switches reading with `setReading`, not `bufferevent_enable`.
    var isActive: Bool { event != nil }

    /// The socket read, while active (-1 otherwise): its event's, without `bufferevent_getfd` (a locked, virtual
    /// call of ~65 instructions, five times a plain exchange).
    var fd: Int32 { event.map { event_get_fd($0) } ?? -1 }

    /// Takes over reading `fd`, `bev`'s socket (its EV_READ must be off); reading starts off. `bev` keeps no read
    /// watermark: this reader reads no further than `Flow.highWater` and `ReadHold` holds it there, where libevent's
    /// watermark would only run its callback on every add to and drain of the input (~40 instructions each, a
    /// dozen a plain exchange).
    mutating func start(base: OpaquePointer, bev: OpaquePointer?, fd: Int32, callback: event_callback_fn,
                        owner: UnsafeMutableRawPointer) {
        if let bev { bufferevent_setwatermark(bev, Int16(EV_READ), 0, 0) }
        guard event == nil, fd >= 0 else { return }
        event = event_new(base, fd, Int16(EV_READ | EV_PERSIST), callback, owner)
        isReading = false
    }

    /// Turns reading on or off: this reader's event while it is active (one epoll_ctl when it changes, as
    /// `bufferevent_enable` would make), else `bev`'s own EV_READ (TLS, a pair, a socket not yet connected).
    mutating func setReading(_ on: Bool, bev: OpaquePointer) {
        guard let event else {
            if on { bufferevent_enable(bev, Int16(EV_READ)) } else { bufferevent_disable(bev, Int16(EV_READ)) }
            return
        }
        guard on != isReading else { return }
        isReading = on
        if on { event_add(event, nil) } else { event_del(event) }
    }

    /// Gives reading back to libevent (a TLS filter, or the socket leaving): the event is freed.
    mutating func stop() {
        guard let event else { return }
        event_free(event)
        self.event = nil
        isReading = false
    }

    /// What one readiness gave.
    enum Outcome: Equatable {
        /// Bytes were appended to the input.
        case read(Int)
        /// Nothing to read after all (a spurious wake-up, EINTR), or no room: nothing to report.
        case nothing
        /// The peer ended its sending direction.
        case end
        /// The socket failed (`errno` is set).
        case failed
    }

    /// What libevent 2.1 reads per callback at most, and what `BulkRead` continues from.
    static let readSize = BulkRead.libeventReadCap

    /// The socket is readable: one `recv` of at most `min(readSize, budget)` bytes from `fd`, appended to `input`
    /// (whose end a socket bufferevent keeps frozen outside its reads: unfrozen around the append, as libevent does).
    /// At the end of the stream or on an error reading goes off, as libevent's read path turns EV_READ off.
    mutating func readReady(into input: OpaquePointer, scratch: UnsafeMutableRawPointer) -> Outcome {
        guard isReading, let event else { return .nothing }
        let fd = event_get_fd(event)
        let want = min(Self.readSize, Flow.highWater - evbuffer_get_length(input))
        guard want > 0 else { return .nothing }
        let n = dm_recv(fd, scratch, want, 0)
        if n > 0 {
            evbuffer_unfreeze(input, 0)
            evbuffer_add(input, scratch, n)
            evbuffer_freeze(input, 0)
            return .read(n)
        }
        if n < 0, errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR { return .nothing }
        event_del(event)
        isReading = false
        return n == 0 ? .end : .failed
    }
}
