import CLibevent
import CDatamodeShims
@testable import DatamodeEngine
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// `LazyTimer` on a real event base: re-arming for later does not make it fire early, re-arming for sooner does
/// make it fire sooner, a disarmed timer never reports due, and "at once" is at once, whatever was pending.
/// Bounds are one-sided where it matters (never due before its deadline, less the documented slack and the coarse
/// clock's resolution) and generous the other way (a loaded machine may run late, never early).
@Suite struct LazyTimerTests {
    final class Box {
        var timer: LazyTimer!
        var dueAt: [UInt64] = []
        var wakes = 0
    }

    static let callback: event_callback_fn = { _, _, ctx in
        let box = Unmanaged<Box>.fromOpaque(ctx!).takeUnretainedValue()
        box.wakes += 1
        if box.timer.fired() { box.dueAt.append(dm_monotonic_coarse_ns()) }
    }

    /// Runs the loop until `done` or `seconds` have passed.
    static func run(_ base: OpaquePointer, seconds: Double, until done: () -> Bool) {
        let end = dm_monotonic_coarse_ns() + UInt64(seconds * 1e9)
        while !done() && dm_monotonic_coarse_ns() < end {
            var tv = timeval(tv_sec: 0, tv_usec: 2_000)
            event_base_loopexit(base, &tv)
            event_base_loop(base, EVLOOP_ONCE)
        }
    }

    static func withTimer(_ body: (OpaquePointer, Box) -> Void) {
        let base = event_base_new()!
        let box = Box()
        box.timer = LazyTimer(base: base, callback: callback, owner: Unmanaged.passUnretained(box).toOpaque())
        body(base, box)
        box.timer.free()
        event_base_free(base)
    }

    static let early = LazyTimer.slackNanoseconds + 5_000_000  // the slack and the coarse clock's resolution

    @Test func reArmingForLaterFiresOnceAtTheLaterDeadline() {
        Self.withTimer { base, box in
            let start = dm_monotonic_coarse_ns()
            box.timer.arm(30)
            Self.run(base, seconds: 0.01) { false }
            box.timer.arm(150)  // the event stays pending for 30 ms, then goes again for the rest
            let deadline = dm_monotonic_coarse_ns() + 150_000_000
            Self.run(base, seconds: 3) { !box.dueAt.isEmpty }
            Self.run(base, seconds: 0.1) { false }
            #expect(box.dueAt.count == 1)
            #expect(box.dueAt.first.map { $0 + Self.early >= deadline } == true, "due \(box.dueAt) from \(start)")
            #expect(box.wakes >= 2, "the early event woke it and went again: \(box.wakes) wakes")
        }
    }

    /// Arms for `first` milliseconds, then at once for `then`; runs until it came due. Returns when the second arm
    /// was made and when it came due (once, or the test fails).
    static func reArmed(_ base: OpaquePointer, _ box: Box, first: Int64, then: Int64) -> (start: UInt64, due: UInt64) {
        box.timer.arm(first)
        let start = dm_monotonic_coarse_ns()
        box.timer.arm(then)
        run(base, seconds: 3) { !box.dueAt.isEmpty }
        #expect(box.dueAt.count == 1)
        return (start, box.dueAt.first ?? .max)
    }

    @Test func reArmingForSoonerFiresSooner() {
        Self.withTimer { base, box in
            let (start, due) = Self.reArmed(base, box, first: 10_000, then: 20)
            #expect(due + Self.early >= start + 20_000_000 && due < start + 3_000_000_000)
        }
    }

    @Test func aDisarmedTimerIsNeverDue() {
        Self.withTimer { base, box in
            box.timer.arm(20)
            box.timer.disarm()
            Self.run(base, seconds: 0.15) { false }
            #expect(box.dueAt.isEmpty)
            #expect(box.wakes <= 1)
            box.timer.arm(20)  // armed again after its event fired idle: it is added again
            Self.run(base, seconds: 3) { !box.dueAt.isEmpty }
            #expect(box.dueAt.count == 1)
        }
    }

    @Test func atOnceIsAtOnceWhateverWasPending() {
        Self.withTimer { base, box in
            let (start, due) = Self.reArmed(base, box, first: 60_000, then: 0)
            #expect(due < start + 2_000_000_000)
            box.timer.arm(-1)  // negative: disarmed
            Self.run(base, seconds: 0.05) { false }
            #expect(box.dueAt.count == 1)
        }
    }
}
