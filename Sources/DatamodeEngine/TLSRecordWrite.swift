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
    private var writer = SpeculativeWriter()

    /// Takes over writing the socket under `filter` (its handshake is over); nil when it has none.
    init?(filter: OpaquePointer) {
        guard let socket = bufferevent_get_underlying(filter) else { return nil }
        self.socket = socket
        records = bufferevent_get_output(socket)
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
        writer.flush(socket, output: records)
    }
}

/// Full TLS records for an HTTP/1.1 TLS client's response bodies.
///
/// libevent_openssl encrypts its output one chain at a time (`SSL_write` per chain), so a body moved on in small
/// chains leaves as as many short records, each with its own `SSL_write`, header, nonce and tag. Bodies from an h2
/// origin arrive so: one chain per DATA chunk (nginx sends 8 KiB frames, and a frame cut by a TLS record comes in two
/// pieces); the HTTPS 100 KiB row with the default configuration made 15.9 `SSL_write` calls a request against 3.0
/// over an HTTP/1.1 origin (uprobes), whose filter reads into large chains. Before such a body is relayed, its front
/// is made one chain (`evbuffer_pullup`: one copy of what is there, at most `most`) when its first chain is shorter
/// than a full record and more waits behind it.
enum RecordSizedChains {
    /// A full record's payload (RFC 8446 §5.1).
    static let recordPayload = 16 * 1024
    /// The most made contiguous at once: four full records.
    static let most = 64 * 1024

    static func coalesce(_ source: OpaquePointer) {
        let front = evbuffer_get_contiguous_space(source)
        guard front < recordPayload else { return }
        let length = min(evbuffer_get_length(source), most)
        guard length > front else { return }
        _ = evbuffer_pullup(source, length)
    }
}
