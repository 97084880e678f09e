import CDatamodeShims
import CLibevent

/// The bufferevents an `UpstreamConnection` reads and writes through: a socket's, plain or TLS (made before it
/// connects, and again for each address tried), or one end of a pair whose other end an HTTP/2 origin stream holds.
enum UpstreamWires {
    /// A socket's bufferevent, not connected yet: TLS for an `https` key (offering h2 when `offersH2`), with the
    /// upstream's watermarks and single read and write sizes. The second value is the TLS state, if any.
    static func socket(_ worker: Worker, key: UpstreamKey, offersH2: Bool) -> (OpaquePointer, OpaquePointer?) {
        let options = Int32(BEV_OPT_CLOSE_ON_FREE.rawValue)
        var ssl: OpaquePointer?
        let bev: OpaquePointer
        if key.tls, let context = worker.tlsContext, let state = context.makeSSL(host: key.host, offerH2: offersH2),
           let tlsBev = bufferevent_openssl_socket_new(worker.base, -1, state, BUFFEREVENT_SSL_CONNECTING,
                                                       TLSBuffereventOptions) {
            ssl = state
            bev = tlsBev
        } else {
            bev = bufferevent_socket_new(worker.base, -1, options)!
        }
        bufferevent_setwatermark(bev, Int16(EV_READ), 0, Flow.highWater)
        bufferevent_setwatermark(bev, Int16(EV_WRITE), Flow.lowWater, 0)
        bufferevent_set_max_single_read(bev, Flow.maxSingleIO)
        bufferevent_set_max_single_write(bev, Flow.maxSingleIO)
        return (bev, ssl)
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
