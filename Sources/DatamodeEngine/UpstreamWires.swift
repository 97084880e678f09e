import CDatamodeShims
import CLibevent
#if canImport(Glibc)
import Glibc
#endif

/// The bufferevents an `UpstreamConnection` reads and writes through: a socket's, plain or TLS (made before it
/// connects, and again for each address tried), or one end of a pair whose other end an HTTP/2 origin stream holds.
enum UpstreamWires {
    /// A socket's bufferevent, not connected yet: for an `https` key a TLS filter over it (offering h2 when
    /// `offersH2`), with the upstream's watermarks and single read and write sizes. The second value is the TLS
    /// state, if any. Connect the socket's bufferevent (`connectable`), not the filter.
    ///
    /// TLS is a `bufferevent_openssl` filter over a socket bufferevent, not a socket TLS bufferevent: libevent_openssl
    /// reads a socket TLS bufferevent one record per readiness (it goes on only while `SSL_pending`, which is 0 after
    /// a whole record), so a shared HTTP/2 origin connection with a hundred answers waiting took a hundred loop rounds,
    /// each an epoll_wait, two reads (a record's header, then its body), an epoll_ctl and a write (issue 31, perf
    /// tracepoints: 6.7 system calls a request). A filter decrypts every record its socket bufferevent read in one go.
    static func socket(_ worker: Worker, key: UpstreamKey, offersH2: Bool) -> (OpaquePointer, OpaquePointer?) {
        let options = Int32(BEV_OPT_CLOSE_ON_FREE.rawValue)
        let socketBev = bufferevent_socket_new(worker.base, -1, options)!
        bufferevent_set_max_single_read(socketBev, Flow.maxSingleIO)
        bufferevent_set_max_single_write(socketBev, Flow.maxSingleIO)
        var ssl: OpaquePointer?
        var bev = socketBev
        if key.tls, let context = worker.tlsContext, let state = context.makeSSL(host: key.host, offerH2: offersH2) {
            if let filter = bufferevent_openssl_filter_new(worker.base, socketBev, state, BUFFEREVENT_SSL_CONNECTING,
                                                           TLSBuffereventOptions) {
                ssl = state
                bev = filter
                bufferevent_set_max_single_read(filter, Flow.maxSingleIO)
                bufferevent_set_max_single_write(filter, Flow.maxSingleIO)
                // The filter encrypts only while its socket holds less than this, so a slow origin keeps the request
                // in the filter's output, where backpressure sees it.
                bufferevent_setwatermark(socketBev, Int16(EV_WRITE), Flow.lowWater, Flow.highWater)
                // A filter starts its handshake when its socket calls back, which a connect alone does not: the
                // ClientHello is made now, into the socket's output, and goes out as the connection is made.
                bufferevent_trigger(socketBev, Int16(EV_WRITE), Int32(BEV_TRIG_IGNORE_WATERMARKS.rawValue))
            }  // else libevent freed `state` (BEV_OPT_CLOSE_ON_FREE): `key.tls` without `ssl` fails the connection
        }
        bufferevent_setwatermark(bev, Int16(EV_READ), 0, Flow.highWater)
        bufferevent_setwatermark(bev, Int16(EV_WRITE), Flow.lowWater, 0)
        // EV_WRITE stays off until the connection is made (`UpstreamConnection.connected`): plain TCP writes
        // speculatively, and a TLS filter would encrypt the request queued so far the moment its handshake ends,
        // before the connection heard whether the origin chose h2 (and the head must go to a stream instead).
        bufferevent_disable(bev, Int16(EV_WRITE))
        return (bev, ssl)
    }

    /// The bufferevent to connect: a TLS filter's socket bufferevent, or the socket's own.
    static func connectable(_ bev: OpaquePointer) -> OpaquePointer {
        bufferevent_get_underlying(bev) ?? bev
    }

    /// The socket has a peer: the TCP connection was made (a TLS failure after it is the origin's TLS, not reachability).
    static func hasPeer(_ bev: OpaquePointer) -> Bool {
        let fd = bufferevent_getfd(bev)
        guard fd >= 0 else { return false }
        var address = sockaddr_storage()
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        return withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getpeername(fd, $0, &length) == 0 }
        }
    }

    /// What `output` holds, moved into a new buffer (the caller frees it): a request queued before its wire changes.
    static func takeQueued(_ output: OpaquePointer) -> OpaquePointer {
        let pending = evbuffer_new()!
        evbuffer_add_buffer(pending, output)
        return pending
    }

    /// A bufferevent pair for a stream: the first end is the exchange's wire, the second the stream's.
    static func pair(_ worker: Worker) -> (OpaquePointer, OpaquePointer) {
        var pair: [OpaquePointer?] = [nil, nil]
        guard bufferevent_pair_new(worker.base, Int32(BEV_OPT_DEFER_CALLBACKS.rawValue), &pair) == 0,
              let end = pair[0], let partner = pair[1] else { fatalError("bufferevent_pair_new failed: out of memory") }
        bufferevent_setwatermark(end, Int16(EV_READ), 0, Flow.highWater)
        bufferevent_setwatermark(end, Int16(EV_WRITE), Flow.lowWater, 0)
        return (end, partner)
    }
}
