import CLibevent

/// Speculative writes of an HTTP/1.1 TLS origin's records (issue 31), as the client side writes its own
/// (`ClientTransport.wrapFilterCallbacks`).
///
/// The filter encrypts a request as it is queued, into its socket bufferevent's output; through libevent's write path
/// those records waited for the socket's write event: an epoll_ctl to add it, a loop round, the write, an epoll_ctl to
/// remove it (strace of the HTTPS 100 KiB row: recvfrom ×2, readv, sendmsg, writev and 2 epoll_ctl a request). Once
/// the handshake is over, the socket's EV_WRITE is off and what the filter made is written at the end of every
/// callback (`UpstreamConnection.flushPendingWrites`), libevent's path taking over only for what the socket does not
/// take at once.
///
/// While plaintext waits in the filter's output (an upload: the filter encrypts only while its socket holds less than
/// the high watermark, and goes on only from the socket's write callback), libevent's write path keeps the socket,
/// and the filter carries on from it; the writes go speculative again once both outputs are empty. Records the filter
/// makes by itself after the handshake (a KeyUpdate answer) go out with the connection's next flush.
struct TLSRecordWriter {
    /// The socket bufferevent under the filter.
    private let socket: OpaquePointer
    /// Its output: the records.
    private let records: OpaquePointer
    /// Its socket.
    private let fd: Int32
    private var writer = SpeculativeWriter()

    /// Takes over writing the socket under `filter` (its handshake is over); nil when it has none.
    init?(filter: OpaquePointer) {
        guard let socket = bufferevent_get_underlying(filter) else { return nil }
        self.socket = socket
        records = bufferevent_get_output(socket)
        fd = bufferevent_getfd(socket)
        writer.limit = SpeculativeWriter.tlsRecordsLimit
        bufferevent_disable(socket, Int16(EV_WRITE))
    }

    /// After a callback: the records made so far go out now, unless plaintext still waits in `plaintext` (the filter's
    /// output), which libevent's write path then drives.
    mutating func flush(plaintext: OpaquePointer) {
        guard evbuffer_get_length(plaintext) == 0 else {
            writer.waitForSocket(socket)
            return
        }
        writer.drained(socket, output: records)
        writer.flush(socket, fd: fd, output: records)
    }
}
