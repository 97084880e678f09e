/// The upstream's response-head timeout as a value (SPEC §6: it counts from the moment the whole request, body
/// included, has been sent; an upload that keeps making progress is never cut by it). Starting it with the
/// head cut a 3 MB upload at 512 KiB/s with `upstream-response: 3s` while bytes flowed.
///
/// Pure: the `UpstreamConnection` reports what it queued and what its output holds, and arms or fires the
/// libevent timer as told. Tested without sleeping.
struct OriginResponseTimer {
    enum Phase: Equatable {
        /// No response is awaited (a tunnel, a pooled idle connection, or the head arrived).
        case off
        /// The request is still being sent: the timer is a send watchdog that fires only after a whole period
        /// in which nothing moved (nginx's `proxy_send_timeout`), so a stalled upload still ends.
        case sending
        /// Everything was handed over; the timeout starts once the last byte has left the output buffer.
        case sent
        /// The last byte was written: the timer counts the origin's silence (nginx's `proxy_read_timeout`).
        case awaitingHead
    }

    enum Action: Equatable {
        case none
        case arm(milliseconds: Int64)
        /// The origin made no progress for a whole period: 504 `upstream-timeout` with this detail.
        case timeOut(detail: String)
    }

    private(set) var phase: Phase = .off
    let timeoutMs: Int64
    /// Request bytes queued so far, and what the watchdog saw when it was last armed.
    private var queued: UInt64 = 0
    private var mark: (queued: UInt64, pending: Int) = (0, 0)

    init(timeoutMs: Int64) {
        self.timeoutMs = timeoutMs
    }

    /// The request head was queued (`connected`: the connection is up, so the clock can run now).
    mutating func requestStarted(connected: Bool, pending: Int) -> Action {
        guard timeoutMs > 0 else { phase = .off; return .none }
        phase = .sending
        return connected ? armWatchdog(pending: pending) : .none
    }

    /// The connection came up.
    mutating func connected(pending: Int) -> Action {
        switch phase {
        case .sending, .sent: return armWatchdog(pending: pending)
        case .off, .awaitingHead: return .none
        }
    }

    /// More request bytes were queued.
    mutating func queued(_ n: Int) {
        queued &+= UInt64(n)
    }

    /// The whole request is queued; `pending`: what the output still holds.
    mutating func requestComplete(pending: Int) -> Action {
        guard phase == .sending else { return .none }
        phase = .sent
        return written(pending: pending)
    }

    /// The output was written to (or flushed); once it is empty after the whole request, the head timeout runs.
    mutating func written(pending: Int) -> Action {
        guard phase == .sent, pending == 0 else { return .none }
        phase = .awaitingHead
        return .arm(milliseconds: timeoutMs)
    }

    /// The response head arrived.
    mutating func headReceived() {
        phase = .off
    }

    /// The timer fired; `pending`: what the output holds now.
    mutating func fired(pending: Int) -> Action {
        switch phase {
        case .off:
            return .none
        case .sending, .sent:
            // Progress (bytes the client queued, or the origin took) re-arms the watchdog.
            if queued != mark.queued || pending != mark.pending { return armWatchdog(pending: pending) }
            phase = .off
            return .timeOut(detail: "made no progress sending the request within timeouts.upstream-response")
        case .awaitingHead:
            phase = .off
            return .timeOut(detail: "sent no response head within timeouts.upstream-response")
        }
    }

    private mutating func armWatchdog(pending: Int) -> Action {
        mark = (queued, pending)
        return .arm(milliseconds: timeoutMs)
    }
}
