import CLibevent

/// Reading held off while a connection's input sits at its high watermark, for both ends of an exchange
/// (`ClientTransport`, `UpstreamConnection`) and every kind of wire (plain TCP, TLS, an HTTP/2 stream's pair).
///
/// libevent 2.1 runs the read callback again, deferred and without a syscall, for as long as an input at its high
/// watermark has EV_READ enabled (`bufferevent_inbuf_wm_check`): a body waiting on a slow peer or a link bucket
/// (SPEC §10) cost up to a whole core in read callbacks that moved nothing (`ReadHoldTests`,
/// `InterceptedReadHoldTests`, `InterceptedUploadReadHoldTests`). So reading goes off (the owner's switch: the
/// bufferevent's EV_READ, or a plain socket's `SocketReader`), and an evbuffer callback on the input (`drained`,
/// reporting to the owner) says when bytes leave it.
struct ReadHold {
    /// EV_READ is off until the input drains below the watermark.
    private(set) var isHeld = false
    /// The owner's evbuffer callback: it calls the owner's `inputDrained`.
    private let drained: evbuffer_cb_func

    init(drained: evbuffer_cb_func) {
        self.drained = drained
    }

    /// After a read callback: holds reading when `input` is at the high watermark. True when it just did: the owner
    /// turns reading off (on its bufferevent, or its `SocketReader`).
    mutating func holdIfFull(input: OpaquePointer, owner: UnsafeMutableRawPointer) -> Bool {
        guard !isHeld, evbuffer_get_length(input) >= Flow.highWater else { return false }
        isHeld = true
        evbuffer_add_cb(input, drained, owner)
        return true
    }

    /// Bytes left the held input: true when it is below the watermark now and the hold is released (the owner turns
    /// reading back on, unless something else of its own keeps it off).
    mutating func releaseIfDrained(input: OpaquePointer, owner: UnsafeMutableRawPointer) -> Bool {
        guard isHeld, evbuffer_get_length(input) < Flow.highWater else { return false }
        release(input: input, owner: owner)
        return true
    }

    /// Held, and the input still full: whoever wants to turn reading on leaves it to `releaseIfDrained`.
    func stillFull(_ input: OpaquePointer) -> Bool {
        isHeld && evbuffer_get_length(input) >= Flow.highWater
    }

    mutating func release(input: OpaquePointer, owner: UnsafeMutableRawPointer) {
        guard isHeld else { return }
        isHeld = false
        evbuffer_remove_cb(input, drained, owner)
    }
}
