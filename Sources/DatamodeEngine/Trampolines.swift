import CDatamodeShims
import CLibevent

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

// MARK: client side

// Every callback ends with `flushPendingWrites()`: writes are speculative (SpeculativeWriter), so whatever a
// handler queued is written before control returns to the loop.

let clientReadCallback: bufferevent_data_cb = { _, ctx in
    let client = owner(ctx, as: ClientConnection.self)
    client.clientReadable()
    client.flushPendingWrites()
}
let clientWriteCallback: bufferevent_data_cb = { _, ctx in
    let client = owner(ctx, as: ClientConnection.self)
    client.clientWritable()
    client.flushPendingWrites()
}
let clientEventCallback: bufferevent_event_cb = { _, what, ctx in
    let client = owner(ctx, as: ClientConnection.self)
    client.clientEvent(what)
    client.flushPendingWrites()
}
let clientParkedReadCallback: event_callback_fn = { _, what, ctx in
    let client = owner(ctx, as: ClientConnection.self)
    client.parkedReadFired(timedOut: what & Int16(EV_TIMEOUT) != 0)
    client.flushPendingWrites()
}
let clientTimerCallback: event_callback_fn = { _, _, ctx in
    let client = owner(ctx, as: ClientConnection.self)
    client.clientTimerFired()
    client.flushPendingWrites()
}

let clientShapingTimerCallback: event_callback_fn = { _, _, ctx in
    let client = owner(ctx, as: ClientConnection.self)
    client.shapingTimerFired()
    client.flushPendingWrites()
}

let controlTickCallback: event_callback_fn = { _, _, ctx in
    owner(ctx, as: Ticker.self).fired()
}

// MARK: upstream side

/// After an upstream callback: the attached client's flush writes its exchange's upstream too, so the
/// upstream is flushed on its own only when no client took care of it (it used to be flushed twice).
@inline(__always)
func flushAfterUpstreamCallback(_ upstream: UpstreamConnection, _ client: ClientConnection?) {
    if let client, client.flushPendingWrites() === upstream { return }
    upstream.flushPendingWrites()
}

let upstreamReadCallback: bufferevent_data_cb = { _, ctx in
    let upstream = owner(ctx, as: UpstreamConnection.self)
    let client = upstream.attachedClient
    upstream.upstreamReadable()
    flushAfterUpstreamCallback(upstream, client)
}
let upstreamWriteCallback: bufferevent_data_cb = { _, ctx in
    let upstream = owner(ctx, as: UpstreamConnection.self)
    let client = upstream.attachedClient
    upstream.upstreamWritable()
    flushAfterUpstreamCallback(upstream, client)
}
let upstreamEventCallback: bufferevent_event_cb = { _, what, ctx in
    let upstream = owner(ctx, as: UpstreamConnection.self)
    let client = upstream.attachedClient
    upstream.upstreamEvent(what)
    flushAfterUpstreamCallback(upstream, client)
}
let upstreamTimerCallback: event_callback_fn = { _, _, ctx in
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

let adminStreamClosedCallback: @convention(c) (OpaquePointer?, UnsafeMutableRawPointer?) -> Void = { connection, ctx in
    let subscriber = owner(ctx, as: EventSubscriber.self)
    if let connection { subscriber.transport.subscriberClosed(connection) }
}
let controlTimerCallback: event_callback_fn = { _, _, ctx in
    owner(ctx, as: ControlTimer.self).fired()
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
    owner(ctx, as: SpliceRelay.self).sourceReadable()
}
let spliceWritableCallback: event_callback_fn = { _, _, ctx in
    owner(ctx, as: SpliceRelay.self).sinkWritable()
}

// MARK: TLS interception (OpenSSL calls these during a client's handshake, on the worker's thread)

let tlsSocketOutputCallback: evbuffer_cb_func = { buffer, _, ctx in
    guard let buffer, evbuffer_get_length(buffer) == 0 else { return }
    owner(ctx, as: ClientConnection.self).socketOutputDrained()
}

let tlsServerNameCallback: @convention(c) (OpaquePointer?, UnsafeMutablePointer<Int32>?, UnsafeMutableRawPointer?) -> Int32 = {
    ssl, alert, _ in
    guard let ssl else { return 0 }
    return TLSServerContext.serverName(ssl, alert: alert)
}
let tlsALPNSelectCallback: @convention(c) (OpaquePointer?, UnsafeMutablePointer<UnsafePointer<UInt8>?>?,
                                           UnsafeMutablePointer<UInt8>?, UnsafePointer<UInt8>?, UInt32,
                                           UnsafeMutableRawPointer?) -> Int32 = { _, out, outLength, offered, offeredLength, _ in
    TLSServerContext.selectALPN(out, outLength, offered, offeredLength)
}
