import CDatamodeShims
import CHiredis
import CLibevent
#if canImport(Glibc)
import Glibc
#endif

// The one place where libevent calls back into Swift.
//
// Swift 6 checks nothing inside `@convention(c)` callbacks, so they are kept trivial: each is a non-capturing
// closure in a file-level `let`, typed with libevent's own callback typedef, that turns the context pointer
// back into its owner object and calls one method. Owners are kept alive by their `Worker` (a strong
// reference in a table) for as long as libevent can call them, so contexts are passed unretained; the only
// retained context is `DNSLookup`, whose callback always fires exactly once (even when cancelled).

@inline(__always)
func owner<T: AnyObject>(_ context: UnsafeMutableRawPointer?, as _: T.Type) -> T {
    Unmanaged<T>.fromOpaque(context!).takeUnretainedValue()
}

@inline(__always)
func context<T: AnyObject>(_ object: T) -> UnsafeMutableRawPointer {
    Unmanaged.passUnretained(object).toOpaque()
}

// MARK: re-entrancy

/// Swift code must never be re-entered by libevent while it is inside a call into libevent: a method that holds an
/// exclusive access (a `mutating` call on a struct field of a connection, an `inout`) and calls, say,
/// `evbuffer_remove_buffer` would meet itself again in the nested callback, and the runtime aborts the whole process
/// ("Simultaneous accesses ... Fatal access conflict", found from outside with a chunked upload inside intercepted
/// TLS: draining a `bufferevent_openssl`'s input unsuspends its reading, which runs `SSL_read` and the read callback
/// on the spot). Two rules keep callbacks at the loop's top level:
/// - every TLS bufferevent is made with `BEV_OPT_DEFER_CALLBACKS` (`TLSBuffereventOptions`): libevent_openssl runs
///   its read, write and event callbacks from inside evbuffer calls (a drain unsuspends reading; an add writes at
///   once), plain socket bufferevents only ever from the loop;
/// - in debug builds each connection callback below checks that no other one is running on this worker's thread
///   (`CallbackNesting`), so a new path back in fails every test that takes it, not one production run in five.
/// DNS (`evdns_getaddrinfo` answers numeric hosts at once), OpenSSL's SNI and ALPN callbacks and evbuffer callbacks
/// are synchronous by design and are not connection callbacks; they touch no connection state that a caller holds.
enum CallbackNesting {
    #if DEBUG
    /// How many connection callbacks are running on this thread (0 or 1 when all is well).
    nonisolated(unsafe) static var depthKey: pthread_key_t = {
        var key = pthread_key_t()
        pthread_key_create(&key, nil)
        return key
    }()

    @inline(__always)
    static func enter(_ name: StaticString) {
        let depth = Int(bitPattern: pthread_getspecific(depthKey))
        precondition(depth == 0, "libevent re-entered Swift: \(name) inside another connection callback")
        pthread_setspecific(depthKey, UnsafeRawPointer(bitPattern: depth + 1))
    }

    @inline(__always)
    static func leave() {
        let depth = Int(bitPattern: pthread_getspecific(depthKey))
        pthread_setspecific(depthKey, UnsafeRawPointer(bitPattern: depth - 1))
    }
    #else
    @inline(__always) static func enter(_: StaticString) {}
    @inline(__always) static func leave() {}
    #endif
}

/// The options of every TLS bufferevent: see `CallbackNesting` for why its callbacks are deferred to the loop.
let TLSBuffereventOptions = Int32(BEV_OPT_CLOSE_ON_FREE.rawValue | BEV_OPT_DEFER_CALLBACKS.rawValue)

// MARK: client side

// Every callback ends with `flushPendingWrites()`: writes are speculative (SpeculativeWriter), so whatever a
// handler queued is written before control returns to the loop.

let clientReadCallback: bufferevent_data_cb = { _, ctx in
    CallbackNesting.enter("clientReadCallback")
    defer { CallbackNesting.leave() }
    let client = owner(ctx, as: HTTP1Session.self)
    client.worker.metrics.clientReadCallback()
    client.clientReadable()
    client.flushPendingWrites()
    if !client.released { client.transport.holdReadingIfFull() }
}
/// A plain client socket is readable (`SocketReader`): its transport reads and calls the callbacks above, as
/// libevent's read path would (so this one does not count as a connection callback itself).
let clientSocketReadableCallback: event_callback_fn = { _, _, ctx in
    owner(ctx, as: ClientTransport.self).socketReadable()
}
let clientWriteCallback: bufferevent_data_cb = { _, ctx in
    CallbackNesting.enter("clientWriteCallback")
    defer { CallbackNesting.leave() }
    let client = owner(ctx, as: HTTP1Session.self)
    client.clientWritable()
    client.flushPendingWrites()
}
let clientEventCallback: bufferevent_event_cb = { _, what, ctx in
    CallbackNesting.enter("clientEventCallback")
    defer { CallbackNesting.leave() }
    let client = owner(ctx, as: HTTP1Session.self)
    client.clientEvent(what)
    client.flushPendingWrites()
}
let parkedConnectionCallback: event_callback_fn = { fd, what, ctx in
    CallbackNesting.enter("parkedConnectionCallback")
    defer { CallbackNesting.leave() }
    owner(ctx, as: ParkedConnections.self).fired(fd: fd, timedOut: what & Int16(EV_TIMEOUT) != 0)
}
let clientTimerCallback: event_callback_fn = { _, _, ctx in
    CallbackNesting.enter("clientTimerCallback")
    defer { CallbackNesting.leave() }
    let client = owner(ctx, as: HTTP1Session.self)
    // A keep-alive client's park timer is set again on every request and fires early by design (`LazyTimer`):
    // there is nothing to flush then (~660 instructions a time, once a request under callgrind's slowdown).
    guard client.clientTimerFired() else { return }
    client.flushPendingWrites()
}

let transparentTimerCallback: event_callback_fn = { _, _, ctx in
    CallbackNesting.enter("transparentTimerCallback")
    defer { CallbackNesting.leave() }
    let client = owner(ctx, as: HTTP1Session.self)
    client.transparentTimerFired()
    client.flushPendingWrites()
}

let clientShapingTimerCallback: event_callback_fn = { _, _, ctx in
    CallbackNesting.enter("clientShapingTimerCallback")
    defer { CallbackNesting.leave() }
    let client = owner(ctx, as: HTTP1Session.self)
    client.shapingTimerFired()
    client.flushPendingWrites()
}

// MARK: HTTP/2 client side (SPEC §17)

// An HTTP/2 connection's wire (the same TLS bufferevent its HTTP/1 session had) and each stream's end of its pair.
// Every wire callback ends with `flushOutput()`: what the streams and the codec queued goes to the wire before the
// loop. A stream's callbacks only schedule it (`scheduleFlush`), so the frames of every stream that moved in one loop
// iteration leave in one write rather than one write (and one TLS record) each.

let http2ReadCallback: bufferevent_data_cb = { _, ctx in
    CallbackNesting.enter("http2ReadCallback")
    defer { CallbackNesting.leave() }
    let session = owner(ctx, as: HTTP2Session.self)
    session.clientReadable()
    session.flushOutput()
}
let http2WriteCallback: bufferevent_data_cb = { _, ctx in
    CallbackNesting.enter("http2WriteCallback")
    defer { CallbackNesting.leave() }
    let session = owner(ctx, as: HTTP2Session.self)
    session.clientWritable()
    session.flushOutput()
}
let http2EventCallback: bufferevent_event_cb = { _, what, ctx in
    CallbackNesting.enter("http2EventCallback")
    defer { CallbackNesting.leave() }
    let session = owner(ctx, as: HTTP2Session.self)
    session.clientEvent(what)
    session.flushOutput()
}
let http2TimerCallback: event_callback_fn = { _, _, ctx in
    CallbackNesting.enter("http2TimerCallback")
    defer { CallbackNesting.leave() }
    let session = owner(ctx, as: HTTP2Session.self)
    session.timerFired()
    session.flushOutput()
}
let http2FlushCallback: event_callback_fn = { _, _, ctx in
    CallbackNesting.enter("http2FlushCallback")
    defer { CallbackNesting.leave() }
    owner(ctx, as: HTTP2Session.self).flushEventRan()
}
/// The stream's buffers changed (deferred evbuffer callbacks, from the loop): the exchange's read and write callbacks
/// run as a bufferevent's would (each with its own nesting check), and the stream relays and gives windows back.
let http2StreamInputCallback: evbuffer_cb_func = { _, info, ctx in
    let stream = owner(ctx, as: HTTP2Stream.self)
    if info!.pointee.n_added > 0 { stream.exchangeInputArrived() }
    CallbackNesting.enter("http2StreamInputCallback")
    defer { CallbackNesting.leave() }
    stream.requestBodyMovedOn()
    stream.connection.scheduleFlush()
}
let http2StreamOutputCallback: evbuffer_cb_func = { _, info, ctx in
    let stream = owner(ctx, as: HTTP2Stream.self)
    let (added, taken) = (info!.pointee.n_added, info!.pointee.n_deleted)
    if added > 0 {
        CallbackNesting.enter("http2StreamOutputCallback")
        defer { CallbackNesting.leave() }
        stream.responseReadable()
        stream.connection.scheduleFlush()
    }
    if taken > 0 { stream.exchangeOutputTaken() }
}

// MARK: HTTP/2 origin side (SPEC §17)

// An HTTP/2 connection to an origin (the TLS bufferevent its first upstream connection had) and each stream's end of
// its pair, flushed as the client side's are (the wire's callbacks flush, the streams' schedule one flush).

let http2OriginReadCallback: bufferevent_data_cb = { _, ctx in
    CallbackNesting.enter("http2OriginReadCallback")
    defer { CallbackNesting.leave() }
    let session = owner(ctx, as: HTTP2OriginSession.self)
    session.wireReadable()
    session.flushOutput()
}
let http2OriginWriteCallback: bufferevent_data_cb = { _, ctx in
    CallbackNesting.enter("http2OriginWriteCallback")
    defer { CallbackNesting.leave() }
    owner(ctx, as: HTTP2OriginSession.self).flushOutput()
}
let http2OriginEventCallback: bufferevent_event_cb = { _, what, ctx in
    CallbackNesting.enter("http2OriginEventCallback")
    defer { CallbackNesting.leave() }
    owner(ctx, as: HTTP2OriginSession.self).wireEvent(what)
}
let http2OriginTimerCallback: event_callback_fn = { _, _, ctx in
    CallbackNesting.enter("http2OriginTimerCallback")
    defer { CallbackNesting.leave() }
    owner(ctx, as: HTTP2OriginSession.self).timerFired()
}
let http2OriginFlushCallback: event_callback_fn = { _, _, ctx in
    CallbackNesting.enter("http2OriginFlushCallback")
    defer { CallbackNesting.leave() }
    owner(ctx, as: HTTP2OriginSession.self).flushEventRan()
}
let http2OriginStreamReadCallback: bufferevent_data_cb = { _, ctx in
    CallbackNesting.enter("http2OriginStreamReadCallback")
    defer { CallbackNesting.leave() }
    let stream = owner(ctx, as: HTTP2OriginStream.self)
    let session = stream.session
    stream.requestReadable()
    session.scheduleFlush()
}
let http2OriginStreamWriteCallback: bufferevent_data_cb = { _, ctx in
    CallbackNesting.enter("http2OriginStreamWriteCallback")
    defer { CallbackNesting.leave() }
    let stream = owner(ctx, as: HTTP2OriginStream.self)
    let session = stream.session
    stream.responseMovedOn()
    session.scheduleFlush()
}

let heldRequestsTimerCallback: event_callback_fn = { _, _, ctx in
    CallbackNesting.enter("heldRequestsTimerCallback")
    defer { CallbackNesting.leave() }
    owner(ctx, as: HeldRequests.self).timerFired()
}

let controlTickCallback: event_callback_fn = { _, _, ctx in
    owner(ctx, as: Ticker.self).fired()
}

// MARK: upstream side

/// After an upstream callback: the attached client's flush writes its exchange's upstream too, so the
/// upstream is flushed on its own only when no client took care of it (it used to be flushed twice).
@inline(__always)
func flushAfterUpstreamCallback(_ upstream: UpstreamConnection, _ client: HTTP1Session?) {
    if let client, client.flushPendingWrites() === upstream { return }
    upstream.flushPendingWrites()
}

let upstreamReadCallback: bufferevent_data_cb = { _, ctx in
    CallbackNesting.enter("upstreamReadCallback")
    defer { CallbackNesting.leave() }
    let upstream = owner(ctx, as: UpstreamConnection.self)
    let client = upstream.attachedClient
    upstream.worker.metrics.upstreamReadCallback()
    upstream.upstreamReadable()
    flushAfterUpstreamCallback(upstream, client)
    upstream.holdReadingIfFull()
}
/// A plain origin socket is readable (`SocketReader`): the connection reads and calls the callbacks above.
let upstreamSocketReadableCallback: event_callback_fn = { _, _, ctx in
    owner(ctx, as: UpstreamConnection.self).socketReadable()
}
let upstreamWriteCallback: bufferevent_data_cb = { _, ctx in
    CallbackNesting.enter("upstreamWriteCallback")
    defer { CallbackNesting.leave() }
    let upstream = owner(ctx, as: UpstreamConnection.self)
    let client = upstream.attachedClient
    upstream.upstreamWritable()
    flushAfterUpstreamCallback(upstream, client)
}
let upstreamEventCallback: bufferevent_event_cb = { _, what, ctx in
    CallbackNesting.enter("upstreamEventCallback")
    defer { CallbackNesting.leave() }
    let upstream = owner(ctx, as: UpstreamConnection.self)
    let client = upstream.attachedClient
    upstream.upstreamEvent(what)
    flushAfterUpstreamCallback(upstream, client)
}
let upstreamTimerCallback: event_callback_fn = { _, _, ctx in
    CallbackNesting.enter("upstreamTimerCallback")
    defer { CallbackNesting.leave() }
    let upstream = owner(ctx, as: UpstreamConnection.self)
    let client = upstream.attachedClient
    upstream.upstreamTimerFired()
    flushAfterUpstreamCallback(upstream, client)
}

// MARK: DNS

let dnsResultCallback: evdns_getaddrinfo_cb = { result, addresses, ctx in
    let lookup = Unmanaged<DNSLookup>.fromOpaque(ctx!).takeRetainedValue()
    let upstream = lookup.upstreamConnection
    let client = upstream?.attachedClient
    lookup.completed(result: result, addresses: addresses)
    // A failed lookup answers the client (502 dns-failure) from here: flush like any other callback.
    client?.flushPendingWrites()
    upstream?.flushPendingWrites()
}

// MARK: worker

let listenerAcceptCallback: evconnlistener_cb = { _, fd, address, length, ctx in
    owner(ctx, as: Worker.self).accept(fd: fd, address: address, length: length)
}

let transparentAcceptCallback: evconnlistener_cb = { _, fd, address, length, ctx in
    owner(ctx, as: Worker.self).acceptTransparent(fd: fd, address: address, length: length)
}
let listenerErrorCallback: evconnlistener_errorcb = { listener, ctx in
    owner(ctx, as: Worker.self).acceptFailed(listener)
}
let workerWakeCallback: event_callback_fn = { fd, _, ctx in
    owner(ctx, as: Worker.self).wakeUp(fd: fd)
}
let workerTickCallback: event_callback_fn = { _, _, ctx in
    owner(ctx, as: Worker.self).tick()
}
let signalCallback: event_callback_fn = { signal, _, ctx in
    owner(ctx, as: SignalWatcher.self).received(signal: signal)
}

// MARK: admin listener

/// evhttp frees an admin connection (its close callback; the context is the transport).
let adminConnectionClosedCallback: @convention(c) (OpaquePointer?, UnsafeMutableRawPointer?) -> Void = { connection, ctx in
    if let connection { owner(ctx, as: AdminTransport.self).connectionClosed(connection) }
}
/// evhttp wants a bufferevent for a new admin connection (`AdminTransport.makeBufferevent`).
let adminBuffereventCallback: @convention(c) (OpaquePointer?, UnsafeMutableRawPointer?) -> OpaquePointer? = { base, ctx in
    guard let base else { return nil }
    return owner(ctx, as: AdminTransport.self).makeBufferevent(base)
}
/// Right after evhttp made its connection around that bufferevent (an `event_base_once`).
let adminIntakeAttachCallback: event_callback_fn = { _, _, ctx in
    let intake = owner(ctx, as: AdminIntake.self)
    intake.transport.attach(intake)
}
/// An admin connection's input changed: bytes read are counted (an evbuffer callback: synchronous, before the
/// bufferevent's read callback).
let adminIntakeCallback: evbuffer_cb_func = { _, info, ctx in
    guard let info, info.pointee.n_added > 0 else { return }
    let intake = owner(ctx, as: AdminIntake.self)
    intake.transport.received(info.pointee.n_added, on: intake)
}
/// A connection taken from evhttp to refuse a request too large (`AdminTransport.refuse`).
let adminRefusalReadCallback: bufferevent_data_cb = { _, ctx in
    let intake = owner(ctx, as: AdminIntake.self)
    intake.transport.refusalReadable(intake)
}
let adminRefusalWriteCallback: bufferevent_data_cb = { _, ctx in
    let intake = owner(ctx, as: AdminIntake.self)
    intake.transport.refusalWritten(intake)
}
let adminRefusalEventCallback: bufferevent_event_cb = { _, _, ctx in
    let intake = owner(ctx, as: AdminIntake.self)
    intake.transport.refusalEnded(intake)
}
/// evhttp wrote a stream's last batch whole. The context is the transport (it outlives every connection), which
/// looks the stream up by its connection: a stream already dropped is simply not found.
let adminStreamWrittenCallback: @convention(c) (OpaquePointer?, UnsafeMutableRawPointer?) -> Void = { connection, ctx in
    if let connection { owner(ctx, as: AdminTransport.self).streamWritten(connection) }
}
/// libevent is done with an event batch it referenced (written, or its connection freed).
let eventBatchFreeCallback: evbuffer_ref_cleanup_cb = { data, _, _ in
    UnsafeMutableRawPointer(mutating: data)?.deallocate()
}
let controlTimerCallback: event_callback_fn = { _, _, ctx in
    owner(ctx, as: ControlTimer.self).fired()
}
let directoryWatchCallback: event_callback_fn = { _, _, ctx in
    owner(ctx, as: DirectoryWatch.self).readable()
}
// MARK: Redis (SPEC §19): hiredis's callbacks, on the link's thread

private func redisOwner(_ context: UnsafePointer<redisAsyncContext>?) -> RedisConnection? {
    guard let data = context?.pointee.data else { return nil }
    return Unmanaged<RedisConnection>.fromOpaque(data).takeUnretainedValue()
}
let redisConnectCallback: @convention(c) (UnsafePointer<redisAsyncContext>?, Int32) -> Void = { context, status in
    redisOwner(context)?.connected(status: status)
}
let redisDisconnectCallback: @convention(c) (UnsafePointer<redisAsyncContext>?, Int32) -> Void = { context, status in
    redisOwner(context)?.disconnected(status: status)
}
/// A command's reply (nil reply: dropped unanswered); the completion was retained for this one call.
let redisReplyCallback: @convention(c) (UnsafeMutablePointer<redisAsyncContext>?, UnsafeMutableRawPointer?, UnsafeMutableRawPointer?) -> Void = { context, reply, data in
    if reply != nil { redisOwner(UnsafePointer(context))?.replied() }
    let completion = Unmanaged<RedisCompletion>.fromOpaque(data!).takeRetainedValue()
    completion.completion(RedisReply(reply))
}
/// The subscriber's replies: the confirmation, then each message, for as long as the connection lives.
let redisMessageCallback: @convention(c) (UnsafeMutablePointer<redisAsyncContext>?, UnsafeMutableRawPointer?, UnsafeMutableRawPointer?) -> Void = { _, reply, data in
    owner(data, as: RedisConnection.self).message(RedisReply(reply))
}
let redisWatchdogCallback: event_callback_fn = { _, _, ctx in
    owner(ctx, as: RedisLink.self).watch()
}
let redisRetryCallback: event_callback_fn = { _, _, ctx in
    owner(ctx, as: RedisConnection.self).connect()
}
let controlPostCallback: event_callback_fn = { _, _, ctx in
    Unmanaged<ControlPost>.fromOpaque(ctx!).takeRetainedValue().run()
}

let adminRequestCallback: @convention(c) (OpaquePointer?, UnsafeMutableRawPointer?) -> Void = { request, ctx in
    guard let request else { return }
    owner(ctx, as: AdminTransport.self).handle(request)
}

// MARK: splice tunnels (on by default; DATAMODE_TUNNEL_SPLICE=0 turns them off)

let spliceReadableCallback: event_callback_fn = { _, _, ctx in
    CallbackNesting.enter("spliceReadableCallback")
    defer { CallbackNesting.leave() }
    owner(ctx, as: SpliceRelay.self).sourceReadable()
}
let spliceWritableCallback: event_callback_fn = { _, _, ctx in
    CallbackNesting.enter("spliceWritableCallback")
    defer { CallbackNesting.leave() }
    owner(ctx, as: SpliceRelay.self).sinkWritable()
}

// MARK: TLS interception (OpenSSL calls these during a client's handshake, on the worker's thread)

/// An origin connection's input shrank while its reading is held at the high watermark.
let upstreamInputDrainedCallback: evbuffer_cb_func = { _, info, ctx in
    guard let info, info.pointee.n_deleted > 0 else { return }
    owner(ctx, as: UpstreamConnection.self).inputDrained()
}

/// A plain client connection's input shrank while its reading is held at the high watermark.
let clientInputDrainedCallback: evbuffer_cb_func = { _, info, ctx in
    guard let info, info.pointee.n_deleted > 0 else { return }
    owner(ctx, as: ClientTransport.self).inputDrained()
}

/// Records left a TLS client's held socket input (`ClientTransport.socketInputDrained`).
let clientSocketInputDrainedCallback: evbuffer_cb_func = { _, info, ctx in
    guard let info, info.pointee.n_deleted > 0 else { return }
    owner(ctx, as: ClientTransport.self).socketInputDrained()
}

// A TLS client's socket bufferevent (`ClientTransport.wrapFilterCallbacks`): libevent_openssl's callbacks run inside
// ours, then the records they made are written speculatively. Not connection callbacks (`CallbackNesting`): they
// touch only the transport's writer (the filter's callbacks to the session are deferred; OpenSSL's SNI and ALPN
// callbacks run inside the handshake, as they always did), and `startTLS` runs the read one from inside the
// session's read callback, to answer the ClientHello already read.
let filterSocketReadCallback: bufferevent_data_cb = { _, ctx in
    owner(ctx, as: ClientTransport.self).filterSocketCallbackRan(.read)
}
let filterSocketWriteCallback: bufferevent_data_cb = { _, ctx in
    owner(ctx, as: ClientTransport.self).filterSocketCallbackRan(.write)
}
let filterSocketEventCallback: bufferevent_event_cb = { _, what, ctx in
    owner(ctx, as: ClientTransport.self).filterSocketCallbackRan(.event, what)
}

let tlsSocketOutputCallback: evbuffer_cb_func = { buffer, _, ctx in
    guard let buffer, evbuffer_get_length(buffer) == 0 else { return }
    owner(ctx, as: HTTP1Session.self).socketOutputDrained()
}

let http2SocketOutputCallback: evbuffer_cb_func = { buffer, _, ctx in
    guard let buffer, evbuffer_get_length(buffer) == 0 else { return }
    owner(ctx, as: HTTP2Session.self).socketOutputDrained()
}

let tlsServerNameCallback: @convention(c) (OpaquePointer?, UnsafeMutablePointer<Int32>?, UnsafeMutableRawPointer?) -> Int32 = {
    ssl, alert, _ in
    guard let ssl else { return 0 }
    return TLSServerContext.serverName(ssl, alert: alert)
}
let tlsALPNSelectCallback: @convention(c) (OpaquePointer?, UnsafeMutablePointer<UnsafePointer<UInt8>?>?,
                                           UnsafeMutablePointer<UInt8>?, UnsafePointer<UInt8>?, UInt32,
                                           UnsafeMutableRawPointer?) -> Int32 = { ssl, out, outLength, offered, offeredLength, _ in
    // `h2` only when the connection's worker offers it now (`http2.client`, reloadable).
    let offersH2 = ssl.flatMap { SSL_get_ex_data($0, 0) }.map { owner($0, as: HTTP1Session.self).worker.settings.http2.client } ?? false
    return TLSServerContext.selectALPN(out, outLength, offered, offeredLength, offeringH2: offersH2)
}
