import CDatamodeShims
import CLibevent

/// A client connection's one shaping timer (SPEC §10, §11): it wakes the connection when a link profile's bucket
/// refills, its added latency passes, or a spent hard budget is to end the exchange. Made on first use (an idle or
/// unshaped connection has none), armed for the soonest deadline asked, freed with the connection or when it parks.
struct ShapingTimer {
    private var event: OpaquePointer?
    /// When it is due (monotonic nanoseconds); nil when not armed.
    private(set) var deadline: UInt64?

    /// Arms it for `deadline` unless it is armed sooner; `owner` is the session its callback
    /// (`clientShapingTimerCallback`) reports to.
    mutating func arm(at deadline: UInt64, base: OpaquePointer, owner: UnsafeMutableRawPointer, now: () -> UInt64) {
        if let armed = self.deadline, armed <= deadline { return }
        if event == nil { event = dm_timer_new(base, clientShapingTimerCallback, owner) }
        guard let event else { return }
        self.deadline = deadline
        let now = now()
        dm_event_add_us(event, Int64(deadline > now ? (deadline - now + 999) / 1000 : 0))
    }

    /// It fired: nothing is armed any more.
    mutating func fired() {
        deadline = nil
    }

    mutating func release() {
        if let event { event_free(event) }
        event = nil
        deadline = nil
    }
}
