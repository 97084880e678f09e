import CDatamodeShims
import CLibevent

/// A connection's timeout timer, set again on every request (a client's idle and header timeouts, an origin
/// connection's response and pool-idle timeouts) and almost never due. Arming it for no sooner than its event is
/// already pending only moves the deadline; disarming only forgets it. The event, when it fires before the
/// deadline, goes again for the rest, and after a disarm does nothing. `event_add`/`event_del` on every arm and
/// disarm cost ~230 and ~140 instructions (a min-heap update), four adds and three deletes a plain keep-alive
/// exchange (callgrind); nginx and HAProxy keep timers the same way.
///
/// The clock is the coarse monotonic one (the vDSO's last tick, 1–4 ms resolution): within `slackNanoseconds` of the
/// deadline counts as due, so a timeout may end up to ~9 ms early. Configured timeouts are whole milliseconds up to a
/// day (`ConfigValue.maximumDuration`): the deadline arithmetic cannot overflow.
struct LazyTimer {
    private let event: OpaquePointer
    /// When the timer is due (coarse monotonic nanoseconds), or 0: not armed.
    private var deadline: UInt64 = 0
    /// When the event was last added to fire, or 0: not pending (it fired, or was never added).
    private var eventDue: UInt64 = 0

    static let slackNanoseconds: UInt64 = 5_000_000

    init(base: OpaquePointer, callback: event_callback_fn, owner: UnsafeMutableRawPointer) {
        event = dm_timer_new(base, callback, owner)
    }

    /// Due in `milliseconds` (0: at once); a negative value disarms.
    mutating func arm(_ milliseconds: Int64) {
        guard milliseconds >= 0 else { return disarm() }
        let due = max(dm_monotonic_coarse_ns() &+ UInt64(milliseconds) &* 1_000_000, 1)
        deadline = due
        // Pending no later than the deadline (and not for "at once"): it will go again for the rest when it fires.
        if eventDue != 0 && eventDue <= due && milliseconds > 0 { return }
        dm_event_add_ms(event, milliseconds)
        eventDue = due
    }

    mutating func disarm() {
        deadline = 0
    }

    /// The event fired: whether the timer is due. If it is armed for later, the event goes again for the rest.
    mutating func fired() -> Bool {
        eventDue = 0
        guard deadline != 0 else { return false }
        let now = dm_monotonic_coarse_ns()
        if now &+ Self.slackNanoseconds >= deadline {
            deadline = 0
            return true
        }
        let rest = deadline - now
        dm_event_add_us(event, Int64(rest / 1000))
        eventDue = deadline
        return false
    }

    /// Frees the event; the timer is not used again.
    func free() {
        event_free(event)
    }
}
