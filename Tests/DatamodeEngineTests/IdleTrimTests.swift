@testable import DatamodeEngine
import DatamodeInstance
import DatamodeTestSupport
import Foundation
import Testing

/// When the proxy gives its free heap back to the kernel (issue 24): a burst left 470 MB of RSS that never came
/// back. Driven tick by tick on an injected time line, as the control loop drives it every second.
@Suite struct IdleTrimTests {
    static let second: UInt64 = 1_000_000_000
    static let plenty: @Sendable () -> Int? = { 400 << 20 }

    /// Ticks once a second from `start` with `perSecond[i]` activity in second i; returns the seconds at which it
    /// said to trim (and tells it each trim was done).
    /// RSS is 500 MiB after a busy second and 50 MiB after a trim.
    static func run(_ trim: inout IdleTrim, from start: UInt64 = 0, activity: inout UInt64, perSecond: [UInt64],
                    freeBytes: () -> Int? = plenty) -> [Int] {
        var trims: [Int] = []
        var rss = 50 << 20
        for (i, count) in perSecond.enumerated() {
            activity += count
            if count > 0 { rss = 500 << 20 }
            let now = start + UInt64(i + 1) * second
            if trim.tick(now: now, activity: activity, residentBytes: { rss }, freeBytes: freeBytes) {
                trims.append(i + 1)
                rss = 50 << 20
                trim.trimmed(now: now, resident: rss)
            }
        }
        return trims
    }

    @Test func aBurstIsTrimmedOnceTwoSecondsAfterItEnds() {
        var trim = IdleTrim(now: 0, activity: 0)
        var activity: UInt64 = 0
        let trims = Self.run(&trim, activity: &activity, perSecond: Array(repeating: 5000, count: 30) + Array(repeating: 0, count: 10))
        // Quiet from second 30 (the end of the last busy tick): trimmed at 32, and only then.
        #expect(trims == [32])
    }

    @Test func aTrickleAfterTheBurstIsQuietToo() {
        var trim = IdleTrim(now: 0, activity: 0)
        var activity: UInt64 = 0
        let trims = Self.run(&trim, activity: &activity, perSecond: Array(repeating: 5000, count: 10) + Array(repeating: 20, count: 20))
        #expect(trims == [12], "once, not again for the trickle that goes on")
    }

    @Test func aSteadyLoadIsNeverTrimmedAndNeitherIsAnIdleProxy() {
        var busy = IdleTrim(now: 0, activity: 0)
        var activity: UInt64 = 0
        let busyTrims = Self.run(&busy, activity: &activity, perSecond: Array(repeating: 800, count: 60))
        #expect(busyTrims.isEmpty)
        var idle = IdleTrim(now: 0, activity: 0)
        var none: UInt64 = 0
        let idleTrims = Self.run(&idle, activity: &none, perSecond: Array(repeating: 0, count: 60))
        #expect(idleTrims.isEmpty)
    }

    @Test func aSecondBurstIsTrimmedAgain() {
        var trim = IdleTrim(now: 0, activity: 0)
        var activity: UInt64 = 0
        let storm = Array(repeating: UInt64(3000), count: 30) + Array(repeating: 0, count: 10)
        let trims = Self.run(&trim, activity: &activity, perSecond: storm + storm + storm)
        #expect(trims == [32, 72, 112])
    }

    @Test func littleFreeMemoryIsNotWorthATrimAndUnknownIsTried() {
        var trim = IdleTrim(now: 0, activity: 0)
        var activity: UInt64 = 0
        let burst = Array(repeating: UInt64(5000), count: 5) + Array(repeating: 0, count: 5)
        let littleFree = Self.run(&trim, activity: &activity, perSecond: burst, freeBytes: { 1 << 20 })
        #expect(littleFree.isEmpty)
        var unknown = IdleTrim(now: 0, activity: 0)
        var other: UInt64 = 0
        let unknownFree = Self.run(&unknown, activity: &other, perSecond: burst, freeBytes: { nil })
        #expect(unknownFree == [7])
    }

    /// bench/memory.py: the connections of a storm still closing after its trim made a second one 2 s later, which
    /// found nothing to give back (54 → 54 MiB). malloc's free bytes stay high after a trim (the chunks stay in its
    /// bins, only their pages go), so they cannot tell; RSS can.
    @Test func theTailOfABurstAfterItsTrimIsNotTrimmedAgainForNothing() {
        let s = Self.second
        var rss = 500 << 20
        var trim = IdleTrim(now: 0, activity: 0)
        var activity: UInt64 = 0
        var trims: [UInt64] = []
        for second in 1...100 {
            activity += second <= 30 ? 5000 : (second == 33 ? 40 : 0)   // the storm, then its tail at 33
            let now = UInt64(second) * s
            if trim.tick(now: now, activity: activity, residentBytes: { rss }, freeBytes: Self.plenty) {
                trims.append(UInt64(second))
                rss = 50 << 20
                trim.trimmed(now: now, resident: rss)
            }
            if second == 50 { rss += 4 << 20 }   // a little freed later without RSS growing much: not worth it
        }
        #expect(trims == [32, 92], "the storm's; then, 60 s on, one more for what was freed since")
    }

    @Test func aLateTickCountsTheTimeItWasQuiet() {
        var trim = IdleTrim(now: 0, activity: 0)
        let s = Self.second
        let busy = trim.tick(now: s, activity: 1000, residentBytes: Self.plenty, freeBytes: Self.plenty)
        #expect(!busy)
        // The loop was busy: the next tick comes 3 s later, with nothing done meanwhile.
        let late = trim.tick(now: 4 * s, activity: 1000, residentBytes: Self.plenty, freeBytes: Self.plenty)
        #expect(late)
    }
}

/// The running proxy carries it out: after its work, once quiet, it trims once; not again while it stays quiet.
@Suite struct IdleTrimInProcessTests {
    func waitUntil(within: Duration, _ condition: () -> Bool) -> Bool {
        let deadline = ContinuousClock.now + within
        while ContinuousClock.now < deadline {
            if condition() { return true }
            Thread.sleep(forTimeInterval: 0.05)
        }
        return condition()
    }

    @Test func theRunningProxyTrimsOnceAfterABurstAndNotAgainWhileQuiet() throws {
        let origin = try RecordingOrigin { _ in .ok("hello") }
        defer { origin.stop() }
        // Any free memory is worth it here: what the test is about is when, not how much.
        let proxy = try ProxyHarness(idleTrim: IdleTrim.Settings(worthTrimming: 0))
        defer { proxy.stop() }
        for _ in 0..<20 {
            let client = try proxy.connect()
            try client.send(RequestText.make("GET", origin.url("/")))
            #expect(try client.readResponse().bodyText == "hello")
            client.close()
        }
        #expect(waitUntil(within: .seconds(10)) { proxy.instance.memoryTrims >= 1 }, "quiet for 2 s after its work: trimmed")
        Thread.sleep(forTimeInterval: 3)
        #expect(proxy.instance.memoryTrims == 1, "once per burst")
    }
}
