import CLibevent
import COpenSSL
#if canImport(Glibc)
import Glibc
#endif

/// Reads the socket under an origin's TLS filter (`UpstreamWires.socket`) for it, once the handshake is done:
/// OpenSSL's read side becomes a BIO on the socket itself, with read-ahead, so records go from the kernel into
/// OpenSSL's record buffer in one `recv` of up to `recordBufferSize`; a readiness runs libevent_openssl's read
/// callback, which decrypts until the socket has nothing more or the filter takes nothing more.
///
/// Before, the socket was read into its bufferevent's input and libevent_openssl's BIO copied it from there into
/// OpenSSL's buffer: a copy of every byte from the origin, and the evbuffer's chains made and freed (issue 31,
/// HTTPS 100 KiB; bench/results/2026-11-30-https-profile-session22.md). libevent's own read path of the socket
/// bufferevent was worse still: `ioctl(FIONREAD)` and at most 4 KiB per readiness (`EVBUFFER_MAX_READ`).
///
/// It belongs to the wire, not to its owner: the `UpstreamConnection` starts it when connected and hands it with the
/// wire to an `HTTP2OriginSession` when the origin chose h2. Its owner calls `stop` before freeing the filter.
///
/// Reading the socket waits while the filter takes nothing (its owner turned its reading off, or its input is at its
/// watermark: `held`), so an answer nobody reads waits in the kernel, not here
/// (`unreadAnswersOfOneConnectionHoldLittleEach`). The filter reads the socket again by itself once it may (libevent
/// runs its read path when its reading is enabled or its watermark releases it): when the socket then has nothing
/// more, reading waits on the socket again. A `recv` shorter than asked means the socket is empty: the next read in
/// the same run says "would block" without asking the kernel (the socket's readiness brings the filter back).
///
/// The end of the stream and a socket error are not told to OpenSSL: they go to libevent_openssl's event callback,
/// as its own socket bufferevent would report them (the filter then applies its dirty-shutdown rule, as before).
final class TLSSocketFeed {
    private let socketBev: OpaquePointer
    /// The socket bufferevent's input: what libevent read during the handshake and OpenSSL has not taken yet.
    private let leftover: OpaquePointer
    private let fd: Int32
    private var reader = SocketReader()
    /// Reading the socket waits for the filter to take more.
    private var held = false
    private var stopped = false
    /// In this run of the filter: the socket said "would block" (or ended, or failed).
    private var reachedEnd = false
    /// The last `recv` was shorter than asked: the socket is empty until its next readiness.
    private var drained = false
    private var ended = false
    private var failed = false

    /// OpenSSL's record buffer with read-ahead: four records of 16 KiB and their headers come in one `recv`.
    /// Set before the handshake (`TLSClientContext.makeSSL`), released while empty (`SSL_MODE_RELEASE_BUFFERS`).
    static let recordBufferSize = 64 * 1024 + 1024

    /// Takes over reading the socket under `filter` (its libevent read path goes off). Nil when the filter has no
    /// socket bufferevent under it.
    init?(worker: Worker, filter: OpaquePointer) {
        guard let socketBev = bufferevent_get_underlying(filter), case let fd = bufferevent_getfd(socketBev), fd >= 0,
              let ssl = bufferevent_openssl_get_ssl(filter), let bio = BIO_new(Self.method)
        else { return nil }
        self.socketBev = socketBev
        leftover = bufferevent_get_input(socketBev)
        self.fd = fd
        // The BIO keeps the feed (released when OpenSSL frees the BIO with the filter); `stop` makes it inert.
        BIO_set_data(bio, Unmanaged.passRetained(self).toOpaque())
        bufferevent_disable(socketBev, Int16(EV_READ))
        SSL_set0_rbio(ssl, bio)
        SSL_set_read_ahead(ssl, 1)
        reader.start(base: worker.base, fd: fd, callback: tlsSocketFeedReadableCallback, owner: context(self))
        reader.setReading(true, bev: socketBev)
        // Records that came with the end of the handshake wait in `leftover`: the filter takes them first, once its
        // owner turns its reading on.
    }

    /// The socket is readable (`tlsSocketFeedReadableCallback`): the filter decrypts what it brings.
    func readable() {
        guard !held, !stopped else { return }
        drained = false
        reachedEnd = false
        runFilter()
        if stopped { return }
        if ended {
            runFilter(event: Int16(BEV_EVENT_EOF | BEV_EVENT_READING))
        } else if failed {
            runFilter(event: Int16(BEV_EVENT_ERROR | BEV_EVENT_READING))
        } else if !reachedEnd {
            // The filter stopped before the socket was empty: it takes nothing more for now.
            held = true
            reader.setReading(false, bev: socketBev)
        }
    }

    /// libevent_openssl's own callback on the socket bufferevent, as libevent's read path would have run it: the read
    /// one (it decrypts until the socket is empty, as far as the filter takes it), or the event one for an end or an
    /// error.
    private func runFilter(event: Int16? = nil) {
        var read: bufferevent_data_cb?
        var eventCallback: bufferevent_event_cb?
        var filterContext: UnsafeMutableRawPointer?
        bufferevent_getcb(socketBev, &read, nil, &eventCallback, &filterContext)
        if let event {
            stopped = true
            reader.stop()
            eventCallback?(socketBev, event, filterContext)
        } else {
            read?(socketBev, filterContext)
        }
    }

    /// OpenSSL asks for up to `count` bytes (the BIO's read): what the handshake left first, then the socket.
    fileprivate func read(into buffer: UnsafeMutableRawPointer, count: Int) -> Int {
        let waiting = evbuffer_get_length(leftover)
        if waiting > 0 { return Int(evbuffer_remove(leftover, buffer, min(waiting, count))) }
        guard !stopped, !drained, !ended, !failed else { return wouldBlock() }
        let n = recv(fd, buffer, count, 0)
        if n > 0 {
            if n < count { drained = true }
            return n
        }
        if n == 0 {
            ended = true
        } else if errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR {
            drained = true
        } else {
            failed = true
        }
        return wouldBlock()
    }

    /// The socket has nothing more for now: reading waits on it again (the filter read it by itself, outside a
    /// readiness, or an end is to be reported from the next readiness: an ended socket stays readable).
    private func wouldBlock() -> Int {
        reachedEnd = true
        if held && !stopped {
            held = false
            reader.setReading(true, bev: socketBev)
        }
        return -1
    }

    /// Reading stops for good (the wire is being freed).
    func stop() {
        stopped = true
        reader.stop()
    }

    /// Made once, read only after (every worker's feeds share it).
    nonisolated(unsafe) private static let method: OpaquePointer = {
        let method = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "datamode TLS socket feed")!
        BIO_meth_set_create(method) { bio in
            BIO_set_init(bio, 1)
            return 1
        }
        BIO_meth_set_destroy(method) { bio in
            if let data = BIO_get_data(bio) { Unmanaged<TLSSocketFeed>.fromOpaque(data).release() }
            BIO_set_data(bio, nil)
            return 1
        }
        BIO_meth_set_read(method) { bio, buffer, count in
            BIO_clear_flags(bio, BIO_FLAGS_READ | BIO_FLAGS_WRITE | BIO_FLAGS_IO_SPECIAL | BIO_FLAGS_SHOULD_RETRY)
            guard let data = BIO_get_data(bio), let buffer, count > 0 else { return 0 }
            let n = Unmanaged<TLSSocketFeed>.fromOpaque(data).takeUnretainedValue().read(into: buffer, count: Int(count))
            if n < 0 { BIO_set_flags(bio, BIO_FLAGS_READ | BIO_FLAGS_SHOULD_RETRY) }
            return Int32(n)
        }
        BIO_meth_set_ctrl(method) { bio, command, _, _ in
            switch command {
            case BIO_CTRL_FLUSH, BIO_CTRL_DUP: return 1
            case BIO_CTRL_PENDING:
                guard let data = BIO_get_data(bio) else { return 0 }
                return Int(evbuffer_get_length(Unmanaged<TLSSocketFeed>.fromOpaque(data).takeUnretainedValue().leftover))
            default: return 0
            }
        }
        return method
    }()
}

let tlsSocketFeedReadableCallback: event_callback_fn = { _, _, ctx in
    owner(ctx, as: TLSSocketFeed.self).readable()
}
