import CLibevent

/// Reads the socket under an origin's TLS filter (`UpstreamWires.socket`) for it, once the handshake is done: one
/// `recv` per readiness and, after a full 4 KiB, the rest in one readv (`BulkRead`), into the socket bufferevent's
/// input; then libevent_openssl's read callback runs and decrypts every record there.
///
/// libevent's own read path of the socket bufferevent asks `ioctl(FIONREAD)` and then reads at most 4 KiB
/// (`EVBUFFER_MAX_READ`) per readiness: a 100 KiB answer took 25 loop rounds of epoll_wait, ioctl and readv (issue
/// 31, bench 2026-11-30-0734: HTTPS 100 KiB 219 → 269 µs a request with the filter alone). The client side reads its
/// TLS socket the same way (`ClientTransport.tlsSocketReadable`).
///
/// It belongs to the wire, not to its owner: the `UpstreamConnection` starts it when connected and hands it with the
/// wire to an `HTTP2OriginSession` when the origin chose h2. Its owner calls `stop` before freeing the filter.
///
/// The filter decrypts whatever the input holds (a record cut short included: OpenSSL keeps the part), unless it takes
/// nothing more (its owner turned its reading off, or its input is at its watermark). Bytes left in the input mean
/// that: reading is held until the filter took them all (`held`), so an answer nobody reads waits in the kernel, not
/// here (`unreadAnswersOfOneConnectionHoldLittleEach`: a feed that read on to `Flow.highWater` held 41 MB for 40 such
/// answers, the bound 30). A readiness reads at most `readBudget`.
final class TLSSocketFeed {
    private let socketBev: OpaquePointer
    private let socketInput: OpaquePointer
    private let fd: Int32
    private let scratch: UnsafeMutableRawPointer
    private var reader = SocketReader()
    /// Reading waits for the filter to take what the input holds (`tlsSocketFeedDrainedCallback` on the input).
    private var held = false
    /// Most read in one readiness: what libevent reads at most in one go (`Flow.maxSingleIO`), so an answer of up to
    /// ~250 KiB that is all there is read, decrypted, relayed and written in one loop round. With 4 records (64 KiB) a
    /// 100 KiB answer took two rounds, each a recv, a readv and a sendmsg to the client. Issue 31's rig (50 clients,
    /// 100 KiB, the proxy on one core, client and origin on the other): 114–126 against 104–123 µs a request over an
    /// HTTP/1.1 TLS origin; the bench's same-run A/B (2026-11-30-1549) 121.6 against 124.9, better in two rounds of
    /// three. A held input (below) still bounds what waits here to one budget per connection.
    static let readBudget = Flow.maxSingleIO

    /// Takes over reading the socket under `filter` (its libevent read path goes off). Nil when the filter has no
    /// socket bufferevent under it.
    init?(worker: Worker, filter: OpaquePointer) {
        guard let socketBev = bufferevent_get_underlying(filter), case let fd = bufferevent_getfd(socketBev), fd >= 0
        else { return nil }
        self.socketBev = socketBev
        socketInput = bufferevent_get_input(socketBev)
        self.fd = fd
        scratch = worker.readScratch
        bufferevent_disable(socketBev, Int16(EV_READ))
        reader.start(base: worker.base, bev: socketBev, fd: fd, callback: tlsSocketFeedReadableCallback,
                     owner: context(self))
        reader.setReading(true, bev: socketBev)
        // Records that came with the end of the handshake may wait in the input already (the filter takes them once its
        // owner turns its reading on).
        holdIfUntaken()
    }

    /// The socket is readable (`tlsSocketFeedReadableCallback`).
    func readable() {
        guard !held else { return }
        switch reader.readReady(into: socketInput, scratch: scratch) {
        case .read(let n):
            if n == SocketReader.readSize {
                BulkRead.readAvailable(fd: fd, into: socketInput, budget: Self.readBudget - n)
            }
            runFilter()
            holdIfUntaken()
        case .nothing: holdIfUntaken()
        case .end: runFilter(event: Int16(BEV_EVENT_EOF | BEV_EVENT_READING))
        case .failed: runFilter(event: Int16(BEV_EVENT_ERROR | BEV_EVENT_READING))
        }
    }

    /// libevent_openssl's own callback on the socket bufferevent, as libevent's read path would have run it: the read
    /// one (it decrypts what the input holds, as far as the filter takes it), or the event one for an end or an error.
    private func runFilter(event: Int16? = nil) {
        var read: bufferevent_data_cb?
        var eventCallback: bufferevent_event_cb?
        var filterContext: UnsafeMutableRawPointer?
        bufferevent_getcb(socketBev, &read, nil, &eventCallback, &filterContext)
        if let event { eventCallback?(socketBev, event, filterContext) } else { read?(socketBev, filterContext) }
    }

    /// The filter left bytes in the input: it takes no more for now, and reading waits for it.
    private func holdIfUntaken() {
        guard !held, evbuffer_get_length(socketInput) > 0 else { return }
        held = true
        evbuffer_add_cb(socketInput, tlsSocketFeedDrainedCallback, context(self))
        reader.setReading(false, bev: socketBev)
    }

    /// Bytes left the held input (`tlsSocketFeedDrainedCallback`): once the filter took them all, reading goes on.
    func drained() {
        guard held, evbuffer_get_length(socketInput) == 0 else { return }
        release()
        reader.setReading(true, bev: socketBev)
    }

    private func release() {
        guard held else { return }
        held = false
        evbuffer_remove_cb(socketInput, tlsSocketFeedDrainedCallback, context(self))
    }

    /// Reading stops for good (the wire is being freed).
    func stop() {
        release()
        reader.stop()
    }
}

let tlsSocketFeedReadableCallback: event_callback_fn = { _, _, ctx in
    owner(ctx, as: TLSSocketFeed.self).readable()
}
let tlsSocketFeedDrainedCallback: evbuffer_cb_func = { _, info, ctx in
    guard let info, info.pointee.n_deleted > 0 else { return }
    owner(ctx, as: TLSSocketFeed.self).drained()
}
