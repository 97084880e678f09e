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

let clientReadCallback: bufferevent_data_cb = { _, ctx in
    owner(ctx, as: ClientConnection.self).clientReadable()
}
let clientWriteCallback: bufferevent_data_cb = { _, ctx in
    owner(ctx, as: ClientConnection.self).clientWritable()
}
let clientEventCallback: bufferevent_event_cb = { _, what, ctx in
    owner(ctx, as: ClientConnection.self).clientEvent(what)
}
let clientTimerCallback: event_callback_fn = { _, _, ctx in
    owner(ctx, as: ClientConnection.self).clientTimerFired()
}

// MARK: upstream side

let upstreamReadCallback: bufferevent_data_cb = { _, ctx in
    owner(ctx, as: UpstreamConnection.self).upstreamReadable()
}
let upstreamWriteCallback: bufferevent_data_cb = { _, ctx in
    owner(ctx, as: UpstreamConnection.self).upstreamWritable()
}
let upstreamEventCallback: bufferevent_event_cb = { _, what, ctx in
    owner(ctx, as: UpstreamConnection.self).upstreamEvent(what)
}
let upstreamTimerCallback: event_callback_fn = { _, _, ctx in
    owner(ctx, as: UpstreamConnection.self).upstreamTimerFired()
}

// MARK: DNS

let dnsResultCallback: evdns_getaddrinfo_cb = { result, addresses, ctx in
    let lookup = Unmanaged<DNSLookup>.fromOpaque(ctx!).takeRetainedValue()
    lookup.completed(result: result, addresses: addresses)
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

let adminRequestCallback: @convention(c) (OpaquePointer?, UnsafeMutableRawPointer?) -> Void = { request, ctx in
    guard let request else { return }
    owner(ctx, as: AdminTransport.self).handle(request)
}
