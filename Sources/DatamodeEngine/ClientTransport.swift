import CDatamodeShims
import CLibevent
import COpenSSL
#if canImport(Glibc)
import Glibc
#endif

/// The client's end of the wire: a plain TCP socket, or a TLS session over it once an intercepted tunnel's
/// ClientHello was terminated (SPEC §9). It owns the bufferevent(s), the speculative writes, bulk reads, parking
/// (an idle plain connection gives its buffers back) and the close of either kind (close_notify or a cut).
///
/// It is the only type that knows which kind it is. The session above it reads `input`, writes `output`, and
/// asks what the wire allows (`isPlain`: splice(2), bulk reads and parking work on the socket itself; under TLS
/// the socket carries records, not the payload). Its libevent callbacks go to its owner, the session
/// (`HTTP1Session`), through the context pointer given at `configure`.
final class ClientTransport {
    /// Not reference-counted: the worker outlives everything its loop owns (it is let go only after its thread was
    /// joined), and a checked `unowned` load cost a retain and a release on each of ~11 uses a plain exchange.
    unowned(unsafe) let worker: Worker
    /// The bufferevent the session reads and writes: the socket's, or the TLS filter over it. None for an HTTP/2
    /// stream's exchange (`isStream`), which never takes a path that uses it.
    private(set) var bev: OpaquePointer!
    private(set) var input: OpaquePointer
    private(set) var output: OpaquePointer
    /// The socket (-1 for a stream's exchange).
    let fd: Int32
    /// Writes are speculative: on plain TCP of `output`; under TLS of the records in `socketOutput` (the socket
    /// bufferevent's), see `wrapFilterCallbacks`.
    private(set) var writer = SpeculativeWriter()
    /// The TLS state once a ClientHello was terminated (owned by the filter bufferevent, freed with it).
    private(set) var ssl: OpaquePointer?
    /// Under TLS, the socket bufferevent's output (encrypted records waiting for the socket).
    private var socketOutput: OpaquePointer?
    /// An evbuffer callback on `socketOutput` tells a closing TLS connection when its records are all written.
    private var watchingSocketOutput = false
    /// Under TLS: the socket bufferevent, whose records are written speculatively, and the callbacks
    /// libevent_openssl gave it (they run the handshake, or move records between the filter and the socket), which
    /// ours wrap.
    private var socketBev: OpaquePointer?
    private var filterCallbacks = FilterCallbacks()
    /// The bufferevent was freed by `releaseKeepingSocket`: the connection parked (`ParkedConnections` has the
    /// socket now), and nothing of this transport is used again.
    private(set) var socketHandedOff = false
    /// The owner's context pointer, for the callbacks, and which callbacks.
    private var owner: UnsafeMutableRawPointer?
    private var callbacks = ClientCallbacks.http1
    /// One HTTP/2 stream's exchange (SPEC §17): `input` and `output` are the stream's own buffers (`HTTP2Stream`),
    /// which it fills and empties and whose changes it reports here (`streamInputArrived`, `streamOutputTaken`).
    /// No socket and no bufferevent: no splice, bulk reads, parking or speculative writes.
    let isStream: Bool
    /// The stream told when the session lets go of its end (`release`): whether the end was clean.
    private weak var stream: HTTP2Stream?
    /// A stream's exchange: the session's write callback runs when the stream took the output down to this, as a
    /// bufferevent's does at its write low watermark (0 once the session closes when written).
    private var streamWriteLowWater = Flow.streamLowWater
    /// The HTTP/2 stream this exchange's end belongs to (nil for a connection).
    var http2Stream: HTTP2Stream? { stream }
    /// EV_READ is off while the input sits at its high watermark (`holdReadingIfFull`).
    private var readHold = ReadHold(drained: clientInputDrainedCallback)
    /// A splice relay has the socket (`suspendForSplice`): only `resumeAfterSplice` turns reading back on.
    private var splicing = false
    /// Reads the socket in place of the bufferevent (whose EV_READ stays off), one `recv` per readiness: plain TCP
    /// into `input`, TLS into the socket bufferevent's input, for the filter (`tlsSocketReadable`).
    private var reader = SocketReader()
    /// Under TLS: the socket bufferevent's input (records), and reading held while it sits at its high watermark
    /// because the filter does not take it (its own input full).
    private var socketInput: OpaquePointer?
    private var socketReadHold = ReadHold(drained: clientSocketInputDrainedCallback)

    init(worker: Worker, bev: OpaquePointer) {
        self.worker = worker
        self.bev = bev
        input = bufferevent_get_input(bev)
        output = bufferevent_get_output(bev)
        fd = bufferevent_getfd(bev)
        isStream = false
    }

    /// The exchange of an HTTP/2 stream: it reads `input` and writes `output`, both the stream's.
    init(worker: Worker, stream: HTTP2Stream, input: OpaquePointer, output: OpaquePointer) {
        self.worker = worker
        bev = nil
        self.input = input
        self.output = output
        fd = -1
        isStream = true
        self.stream = stream
    }

    /// Plain TCP: the session may splice, bulk-read and park on the socket itself.
    var isPlain: Bool { ssl == nil && !isStream }

    /// TLS: after the client's close_notify or FIN the filter sends nothing more (libevent_openssl), so the client's
    /// end of the connection is its end both ways, and an exchange with anything left to send ends then (it would
    /// wait for ever, its upstream held: session 19's outside test kept 14 of 15 cut downloads for good). Plain TCP
    /// keeps writing after a half-close.
    var endsBothWaysAtEOF: Bool { ssl != nil && !isStream }

    /// Registers `owner`'s callbacks and the connection's watermarks and limits; reading on, writing speculative.
    /// `callbacks`: the HTTP/1 session's, or the HTTP/2 session's once the client chose `h2` (the same wire,
    /// another owner: `HTTP2Session.adopt`).
    func configure(owner: UnsafeMutableRawPointer, callbacks: ClientCallbacks = .http1) {
        self.owner = owner
        self.callbacks = callbacks
        if isStream { return }
        bufferevent_setcb(bev, callbacks.read, callbacks.write, callbacks.event, owner)
        // Read high watermark: a client cannot make us buffer more than this while we are busy with its
        // previous request (pipelining) or while the upstream is slower than the client (request bodies).
        bufferevent_setwatermark(bev, Int16(EV_READ), 0, Flow.highWater)
        bufferevent_setwatermark(bev, Int16(EV_WRITE), Flow.lowWater, 0)
        bufferevent_set_max_single_read(bev, Flow.maxSingleIO)
        bufferevent_set_max_single_write(bev, Flow.maxSingleIO)
        if isPlain {
            // EV_WRITE stays off: writes are speculative (see SpeculativeWriter). EV_READ too: `SocketReader` reads.
            bufferevent_disable(bev, Int16(EV_READ | EV_WRITE))
            writer.takeOverOutputCallback(bev)
            reader.start(base: worker.base, bev: bev, fd: fd, callback: clientSocketReadableCallback,
                         owner: context(self))
            reader.setReading(true, bev: bev)
        } else {
            bufferevent_enable(bev, Int16(EV_READ | EV_WRITE))
        }
    }

    // MARK: writing

    /// Writes what is queued at once, speculatively: plain TCP its output; TLS the records the filter made of it
    /// (it encrypts as the plaintext is added). `whole`: nothing streams into the output any more, so a large
    /// output is written now too (`SpeculativeWriter.flush`).
    @inline(__always)
    func flush(whole: Bool = false) {
        if isPlain {
            writer.flush(bev, fd: fd, output: output, whole: whole)
        } else if let socketBev, !socketHandedOff {
            writer.flush(socketBev, fd: fd, output: socketOutput!, whole: whole)
        }
    }

    /// The write callback ran: the speculative writer turns its write event off once the output is empty.
    @inline(__always)
    func writeCallbackRan() {
        if isPlain && !socketHandedOff { writer.drained(bev, output: output) }
    }

    /// A file segment was queued (`evbuffer_add_file`): its bytes are not in memory. (Under TLS the filter reads
    /// and encrypts them; the writer only ever sees records.)
    func queuedFile() { if isPlain { writer.queuedFile() } }

    /// A write event is armed: the client's taking of bytes will call back.
    var isWaitingToWrite: Bool { writer.waiting }

    /// What is queued in the output (plaintext under TLS): what backpressure and the pumps measure.
    var outputLength: Int { evbuffer_get_length(output) }

    /// How much the output may hold before the exchange stops moving the answer into it (and its upstream's read
    /// watermark then stops reading the origin): a stream's exchange keeps less (`Flow.streamHighWater`).
    var outputHighWater: Int { isStream ? Flow.streamHighWater : Flow.highWater }

    /// What is queued for the client and not yet written to its socket: under TLS also the records the filter made
    /// and the socket has not taken yet (bounded by the socket bufferevent's write watermark). Whether a connection
    /// may close is decided on this: closing once the plaintext is encrypted would drop those records (SPEC §6).
    /// A transport whose socket went to `ParkedConnections` has no buffers: nothing is unsent.
    var unsentOutput: Int {
        guard !socketHandedOff else { return 0 }
        return evbuffer_get_length(output) + (socketOutput.map { evbuffer_get_length($0) } ?? 0)
    }

    // MARK: a stream's exchange

    /// The stream added to `input` (request bytes, or a head as text): the session reads, as from its read callback.
    func streamInputArrived() {
        guard let owner else { return }
        callbacks.read(nil, owner)
    }

    /// The stream took bytes out of `output`: at the low watermark the session's write callback runs, as a
    /// bufferevent's does after a write.
    func streamOutputTaken() {
        guard let owner, evbuffer_get_length(output) <= streamWriteLowWater else { return }
        callbacks.write(nil, owner)
    }

    /// Takes bytes out of the front of the output (a response taken back before any of it was written). The front
    /// of a socket bufferevent's output is frozen outside its own writes (see SpeculativeWriter); a TLS filter's is not.
    func withOutputFrontUnfrozen(_ body: () -> Void) {
        if isPlain { evbuffer_unfreeze(output, 1) }
        body()
        if isPlain { evbuffer_freeze(output, 1) }
    }

    // MARK: reading

    /// The plain socket is readable (`clientSocketReadableCallback`): one read, reported to the owner as libevent's
    /// read path would (bytes: the read callback; EOF or an error: the event callback, reading off).
    func socketReadable() {
        guard let owner else { return }
        if let socketBev, let socketInput {
            tlsSocketReadable(socketBev, socketInput)
            return
        }
        switch reader.readReady(into: input, scratch: worker.readScratch) {
        case .read: callbacks.read(bev, owner)
        case .nothing: holdReadingIfFull()  // a spurious wake-up, or no room (then hold rather than spin)
        case .end: callbacks.event(bev, Int16(BEV_EVENT_EOF | BEV_EVENT_READING), owner)
        case .failed: callbacks.event(bev, Int16(BEV_EVENT_ERROR | BEV_EVENT_READING), owner)
        }
    }

    /// Under TLS the reader reads the records into the socket bufferevent's input, and libevent_openssl's read callback
    /// decrypts them (run by ours, `filterSocketCallbackRan`, which then writes whatever records it made), as
    /// libevent's own read path would have had it, but with one `recv` where libevent made an `ioctl(FIONREAD)` and
    /// a `readv` (issue 31: the intercepted rows' client socket); after a full 4 KiB read the rest comes in
    /// `BulkRead`'s readv, as libevent read up to 256 KiB at once. The filter stops taking records while its own input
    /// is full: the socket's input then holds reading at its high watermark (`socketReadHold`) until it drains, as a
    /// plain input does. EOF and errors go to libevent_openssl's event callback, as libevent's read path reports them.
    private func tlsSocketReadable(_ socketBev: OpaquePointer, _ socketInput: OpaquePointer) {
        wrapFilterCallbacks(socketBev)  // libevent_openssl sets new ones when the handshake completes
        switch reader.readReady(into: socketInput, scratch: worker.readScratch) {
        case .read(let n):
            let buffered = evbuffer_get_length(socketInput)
            if n == SocketReader.readSize && buffered < Flow.highWater {
                BulkRead.readAvailable(fd: fd, into: socketInput, budget: Flow.highWater - buffered)
            }
            filterSocketCallbackRan(.read)
        case .nothing:
            if socketReadHold.holdIfFull(input: socketInput, owner: context(self)) { reader.setReading(false, bev: bev) }
        case .end: filterSocketCallbackRan(.event, Int16(BEV_EVENT_EOF | BEV_EVENT_READING))
        case .failed: filterSocketCallbackRan(.event, Int16(BEV_EVENT_ERROR | BEV_EVENT_READING))
        }
    }

    /// Records left the held socket input (`clientSocketInputDrainedCallback`): reading goes on, unless the session's
    /// own hold keeps it off.
    func socketInputDrained() {
        guard let socketInput, socketReadHold.releaseIfDrained(input: socketInput, owner: context(self)) else { return }
        if !readHold.isHeld && !socketHandedOff { reader.setReading(true, bev: bev) }
    }

    /// Bulk request bodies and tunnels: after a full 4 KiB libevent read, take the rest in one readv (plain only).
    @inline(__always)
    func readMoreIfPending() {
        guard isPlain else { return }
        let buffered = evbuffer_get_length(input)
        guard buffered >= BulkRead.libeventReadCap, buffered < Flow.highWater else { return }
        BulkRead.readAvailable(fd: bufferevent_getfd(bev), into: input, budget: Flow.highWater - buffered)
    }

    // MARK: splice(2)

    /// The socket, for a splice relay (plain TCP only).
    var socket: Int32 { bufferevent_getfd(bev) }

    /// A splice relay takes the socket: libevent stops reading and writing it (until `resumeAfterSplice`), and the
    /// speculative writer must not stay parked on a write event it will not get (the output is empty).
    func suspendForSplice() {
        splicing = true
        writer.drained(bev, output: output)
        bufferevent_disable(bev, Int16(EV_WRITE))
        reader.setReading(false, bev: bev)
    }

    /// libevent takes the socket back after a body splice.
    func resumeAfterSplice() {
        splicing = false
        if readHold.stillFull(input) { return }  // `inputDrained` resumes it
        readHold.release(input: input, owner: context(self))
        reader.setReading(true, bev: bev)
    }

    /// After an HTTP/1 read callback: an input left at its high watermark (a request body or a tunnel waiting on a
    /// slower origin or a link bucket, SPEC §10; requests pipelined behind a busy one) holds reading (`ReadHold`).
    func holdReadingIfFull() {
        guard !socketHandedOff, !isStream else { return }
        guard readHold.holdIfFull(input: input, owner: context(self)) else { return }
        reader.setReading(false, bev: bev)
        // Under TLS the filter's reading goes off too: libevent runs its read callback again and again while its
        // input sits at the watermark with EV_READ on (`ReadHold`).
        if socketBev != nil { bufferevent_disable(bev, Int16(EV_READ)) }
    }

    /// Bytes left the held input (`clientInputDrainedCallback`): below the watermark, reading goes on (unless a
    /// splice has the socket meanwhile).
    func inputDrained() {
        guard readHold.releaseIfDrained(input: input, owner: context(self)) else { return }
        if socketBev != nil { bufferevent_enable(bev, Int16(EV_READ)) }
        if !splicing && !socketHandedOff && !socketReadHold.isHeld { reader.setReading(true, bev: bev) }
    }

    // MARK: parking (an idle connection gives its buffers back)

    /// Whether the connection can park now: plain TCP (the TLS filter holds the session, which a socket bufferevent
    /// cannot bring back), with nothing buffered either way and no write waiting.
    var canPark: Bool {
        isPlain && !socketHandedOff && !writer.waiting && fd >= 0
            && evbuffer_get_length(input) == 0 && evbuffer_get_length(output) == 0
    }

    /// Frees the bufferevent and its buffers and leaves the socket open, for the `ParkedConnection` that takes
    /// the connection's place.
    func releaseKeepingSocket() {
        guard !socketHandedOff else { return }
        reader.stop()
        // The bufferevent forgets the socket before it is freed (BEV_OPT_CLOSE_ON_FREE).
        bufferevent_disable(bev, Int16(EV_READ | EV_WRITE))
        bufferevent_setfd(bev, -1)
        bufferevent_free(bev)
        socketHandedOff = true
    }

    // MARK: TLS

    /// Terminates TLS with `ssl` (SPEC §9): a `bufferevent_openssl` filter over the socket's bufferevent takes its
    /// place. The ClientHello already sits in the socket bufferevent's input (the first byte was read to decide),
    /// and a filter consumes bytes already buffered, where a new socket TLS bufferevent would have lost them.
    /// False when no filter could be made (`ssl` is freed).
    func startTLS(_ ssl: OpaquePointer) -> Bool {
        let socketBev = bev
        // The reader goes on reading the socket, into the socket bufferevent's input for the filter now
        // (`tlsSocketReadable`). Writes stay speculative, of records now (`wrapFilterCallbacks`): a fresh writer writes
        // whatever the socket's output still holds (the CONNECT's answer) before them.
        writer = SpeculativeWriter()
        writer.limit = SpeculativeWriter.tlsRecordsLimit
        guard let filter = bufferevent_openssl_filter_new(worker.base, socketBev, ssl, BUFFEREVENT_SSL_ACCEPTING,
                                                          TLSBuffereventOptions) else {
            SSL_free(ssl)
            return false
        }
        self.ssl = ssl
        socketOutput = bufferevent_get_output(socketBev)
        // The filter encrypts only while its socket holds less than this (libevent checks the underlying's write
        // high watermark), so a slow client keeps the plaintext in the filter's output, where backpressure sees it,
        // and at most this much ciphertext waits for the socket.
        bufferevent_setwatermark(socketBev, Int16(EV_WRITE), Flow.lowWater, Flow.highWater)
        // Many clients end a TLS connection without close_notify once they have what they wanted; between
        // requests that is an ordinary close, not an error. (Origins do not get this leniency: see UpstreamConnection.)
        bufferevent_openssl_set_allow_dirty_shutdown(filter, 1)
        // The filter turned the socket's EV_READ and EV_WRITE on as it was made: the reader reads, and the writer
        // turns EV_WRITE on only when it must.
        bufferevent_disable(socketBev, Int16(EV_READ | EV_WRITE))
        // The plain writer had taken libevent's callback off this output (`configure`); so does the fresh one.
        writer.takeOverOutputCallback(socketBev!)
        socketInput = bufferevent_get_input(socketBev)
        if readHold.isHeld {
            readHold.release(input: input, owner: context(self))  // `input` becomes the filter's
        }
        reader.setReading(true, bev: socketBev!)
        wrapFilterCallbacks(socketBev!)
        bev = filter
        input = bufferevent_get_input(filter)
        output = bufferevent_get_output(filter)
        if let owner { configure(owner: owner, callbacks: callbacks) }
        // The ClientHello already sits in the socket bufferevent's input, and no new byte will come before the
        // client hears from us: run the handshake on it now (our wrapper of its read callback writes the flight).
        bufferevent_trigger(socketBev, Int16(EV_READ), Int32(BEV_TRIG_IGNORE_WATERMARKS.rawValue))
        return true
    }

    /// Makes the socket bufferevent's callbacks ours, around libevent_openssl's: TLS records are written
    /// speculatively, as plain TCP's output is (`SpeculativeWriter`), instead of through the socket bufferevent's
    /// write event, which cost an epoll_ctl to register it, a loop round, the writev, and an epoll_ctl to unregister
    /// it for every response and every handshake flight.
    ///
    /// Session callbacks end with `flush`, which writes the records the filter made of what they queued. The filter
    /// also makes records inside the socket bufferevent's own callbacks, where no session callback follows: the
    /// handshake's flights (the read callback), more of a large response once the socket drained below its low
    /// watermark (the write callback), anything OpenSSL answers on its own while reading. The wrappers write those
    /// (`filterSocketCallbackRan`). The filter turns the socket bufferevent's EV_WRITE on only as it is made (with an
    /// underlying bufferevent its start_writing and stop_writing only suspend and resume reading), so the writer
    /// owns it: on only while the socket did not take all the records (`waiting`). libevent's write path then runs
    /// the filter's write callback as the socket drains, so a large response to a slow client keeps being encrypted.
    private func wrapFilterCallbacks(_ underlying: OpaquePointer) {
        var read: bufferevent_data_cb?
        var write: bufferevent_data_cb?
        var event: bufferevent_event_cb?
        var filterContext: UnsafeMutableRawPointer?
        bufferevent_getcb(underlying, &read, &write, &event, &filterContext)
        guard filterContext != context(self) else { return }  // ours already
        filterCallbacks = FilterCallbacks(read: read, write: write, event: event, context: filterContext)
        bufferevent_setcb(underlying, filterSocketReadCallback, filterSocketWriteCallback, filterSocketEventCallback,
                          context(self))
        socketBev = underlying
    }

    /// The client's handshake completed (the filter's BEV_EVENT_CONNECTED): libevent_openssl replaced the socket
    /// bufferevent's handshake callbacks (and so our wrappers) with those of an open session; wrap them again. Records
    /// made meanwhile (session tickets) are written by the session callback this runs in, as it ends.
    func tlsHandshakeCompleted() {
        guard let socketBev, !socketHandedOff else { return }
        wrapFilterCallbacks(socketBev)
    }

    /// One of the socket bufferevent's callbacks, libevent_openssl's own, then whatever records it made are written
    /// (and a write event whose records are all out goes off).
    func filterSocketCallbackRan(_ kind: FilterCallbacks.Kind, _ what: Int16 = 0) {
        guard let socketBev else { return }
        // A copy: no access to this transport is held while libevent_openssl (and OpenSSL's callbacks) run.
        let filter = filterCallbacks
        switch kind {
        case .read: filter.read?(socketBev, filter.context)
        case .write: filter.write?(socketBev, filter.context)
        case .event:
            // An error or EOF: the filter reports it to the session (deferred); nothing to write.
            filter.event?(socketBev, what, filter.context)
            return
        }
        guard !socketHandedOff, let socketOutput else { return }
        writer.drained(socketBev, output: socketOutput)
        writer.flush(socketBev, fd: fd, output: socketOutput)
    }

    /// The protocol the client and the proxy agreed on in the handshake (ALPN, RFC 7301): `h2`, `http/1.1`, or nil.
    var negotiatedProtocol: String? {
        guard let ssl else { return nil }
        var data: UnsafePointer<UInt8>?
        var length: UInt32 = 0
        SSL_get0_alpn_selected(ssl, &data, &length)
        guard let data, length > 0 else { return nil }
        return String(decoding: UnsafeBufferPointer(start: data, count: Int(length)), as: UTF8.self)
    }

    /// The TLS state no longer points to the HTTP/1 session that made it (its SNI and ALPN callbacks read it): the
    /// connection went to an HTTP/2 session (SPEC §17).
    func forgetTLSOwner() {
        if let ssl { SSL_set_ex_data(ssl, 0, nil) }
    }

    /// OpenSSL's errors for this connection, oldest first (a failed handshake says why).
    func tlsErrors() -> [String] {
        var messages: [String] = []
        while case let code = bufferevent_get_openssl_error(bev), code != 0 { messages.append(TLSClientContext.errorString(code)) }
        return messages
    }

    /// Sends close_notify and writes it to the socket at once (the connection is being freed, or half-closed; the
    /// alert is a few dozen bytes, which an idle socket's buffer always takes).
    private func sendCloseNotify(_ ssl: OpaquePointer) {
        SSL_shutdown(ssl)
        guard let underlying = bufferevent_get_underlying(bev) else { return }
        let pending = bufferevent_get_output(underlying)!
        let fd = bufferevent_getfd(underlying)
        guard fd >= 0, evbuffer_get_length(pending) > 0 else { return }
        evbuffer_unfreeze(pending, 1)
        evbuffer_write(pending, fd)
        evbuffer_freeze(pending, 1)
    }

    /// Ends the client's sending direction of a tunnel: close_notify under TLS (its own half-close, RFC 8446 §6.1),
    /// `shutdown(SHUT_WR)` on TCP; the other way stays open.
    func shutdownWrite() {
        if isStream { return }  // a stream's exchange is never a tunnel (RFC 9113 §8.5 CONNECT is refused)
        if let ssl { sendCloseNotify(ssl) } else { shutdown(bufferevent_getfd(bev), Int32(SHUT_WR)) }
    }

    // MARK: closing

    /// The connection closes once its output is written: the write callback must fire when the output is empty,
    /// not at the low watermark; under TLS the filter's write callback says nothing about the socket, so its buffer
    /// is watched too (`socketOutputDrained`).
    func closeWhenWritten() {
        guard !socketHandedOff else { return }
        if isStream {
            streamWriteLowWater = 0
            return
        }
        bufferevent_setwatermark(bev, Int16(EV_WRITE), 0, 0)
        if let socketOutput, !watchingSocketOutput {
            watchingSocketOutput = true
            evbuffer_add_cb(socketOutput, callbacks.socketDrained, owner)
        }
    }

    /// Frees everything. `cleanTLSEnd`: a TLS session that ends normally says so (close_notify), so the client can
    /// tell a response delimited by the close from a cut one; an abort or a truncated response ends without it
    /// (RFC 8446 §6.1).
    func release(cleanTLSEnd: Bool) {
        if watchingSocketOutput, let socketOutput {
            watchingSocketOutput = false
            evbuffer_remove_cb(socketOutput, callbacks.socketDrained, owner)
        }
        if cleanTLSEnd, let ssl { sendCloseNotify(ssl) }
        // The socket bufferevent may outlive this transport (libevent frees it with the filter, which waits for
        // its own pending callbacks): its callbacks go back to libevent_openssl's, which point at the filter.
        if let socketBev, !socketHandedOff {
            var current: UnsafeMutableRawPointer?
            bufferevent_getcb(socketBev, nil, nil, nil, &current)
            if current == context(self) {  // ours, not libevent_openssl's newer ones (a handshake just completed)
                bufferevent_setcb(socketBev, filterCallbacks.read, filterCallbacks.write, filterCallbacks.event,
                                  filterCallbacks.context)
            }
            if let socketInput { socketReadHold.release(input: socketInput, owner: context(self)) }
            self.socketBev = nil
            socketInput = nil
        }
        reader.stop()
        // A stream's exchange says how it ended (a close-delimited response ends cleanly, a cut one does not); the
        // stream keeps its buffers and relays what is still in `output`.
        if isStream {
            owner = nil
            stream?.exchangeSessionEnded(clean: cleanTLSEnd)
            return
        }
        // A parked connection's socket and bufferevent are not this transport's any more.
        if !socketHandedOff { bufferevent_free(bev) }
    }
}

/// The libevent callbacks a client wire reports to: its owner's kind decides.
struct ClientCallbacks {
    let read: bufferevent_data_cb
    let write: bufferevent_data_cb
    let event: bufferevent_event_cb
    /// Under TLS: the socket's buffer of records was written out (a closing connection closes then).
    let socketDrained: evbuffer_cb_func

    static let http1 = ClientCallbacks(read: clientReadCallback, write: clientWriteCallback, event: clientEventCallback,
                                       socketDrained: tlsSocketOutputCallback)
    static let http2 = ClientCallbacks(read: http2ReadCallback, write: http2WriteCallback, event: http2EventCallback,
                                       socketDrained: http2SocketOutputCallback)
}

/// The callbacks libevent_openssl set on a TLS filter's socket bufferevent, kept while ours stand in for them
/// (`ClientTransport.tlsHandshakeCompleted`).
struct FilterCallbacks {
    enum Kind { case read, write, event }
    var read: bufferevent_data_cb?
    var write: bufferevent_data_cb?
    var event: bufferevent_event_cb?
    var context: UnsafeMutableRawPointer?
}

/// What the worker asks of every client connection it holds, whatever it speaks.
protocol ClientSession: AnyObject {
    /// Frees the connection at once.
    func close()
    /// Drain (SIGTERM): close when idle, else once what is in flight is done.
    func drain()
}
