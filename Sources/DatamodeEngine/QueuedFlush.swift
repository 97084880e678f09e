import CLibevent

/// An HTTP/2 session's "write what the codec queued", asked for from inside other callbacks (an exchange's, a
/// stream's), run once the callbacks queued behind it in the loop's pass have added their frames.
///
/// A response crosses the engine in several deferred callbacks of one pass of the loop: its head is handed to the
/// client's stream in one, its body comes through the stream's pair in the next. libevent runs its active queue in
/// order, so a flush activated by the first ran before the second, and every small response went out as two codec
/// rounds and two TLS records: HEADERS alone, then DATA (callgrind, issue 26: two `SSL_write` per h2 response).
/// The flush now goes to the back of the queue once before it runs, so the callbacks queued behind it (the body's,
/// other streams') add their frames first and one write carries them all. It still runs in the same pass: an event
/// activated while the queue runs is run before the loop polls again, so nothing waits on the clock or the next
/// readiness (the wire callbacks keep flushing at once, as before).
struct QueuedFlush {
    private var event: OpaquePointer?
    /// The event went to the back of the queue once already: the next run flushes.
    private var requeued = false

    init(base: OpaquePointer, callback: event_callback_fn, owner: UnsafeMutableRawPointer) {
        event = event_new(base, -1, 0, callback, owner)
    }

    /// Asks for a flush (once, however often asked before it runs).
    mutating func schedule() {
        guard let event, event_pending(event, Int16(EV_TIMEOUT), nil) == 0 else { return }
        requeued = false
        event_active(event, Int32(EV_TIMEOUT), 0)
    }

    /// The event ran: true when the owner flushes now; false when it went to the back of the queue once more.
    mutating func ran() -> Bool {
        guard let event else { return false }
        if requeued {
            requeued = false
            return true
        }
        requeued = true
        event_active(event, Int32(EV_TIMEOUT), 0)
        return false
    }

    /// The session is released: no flush runs any more.
    mutating func free() {
        guard let event else { return }
        self.event = nil
        event_free(event)
    }
}
