import DatamodeState
import Testing

/// The two structures behind the admin page (SPEC §20): the refusal rings and the per-second timeline.
@Suite struct RefusalRingTimelineTests {
    static func refusal(_ time: Int64, _ url: String = "http://h/") -> Refusal {
        Refusal(time: time, client: "127.0.0.1", method: "GET", url: url, error: "constrained", reasons: ["constrained"],
                rule: nil, session: nil)
    }

    @Test func aRingKeepsTheLatest200InOrder() {
        let ring = RefusalRing()
        for i in 0..<450 { ring.append(Self.refusal(Int64(i))) }
        let kept = ring.refusals
        #expect(kept.count == RefusalRing.capacity)
        #expect(kept.map(\.time) == (250..<450).map(Int64.init))
    }

    @Test func theWorkersRingsMergeNewestFirst() {
        let (a, b) = (RefusalRing(), RefusalRing())
        for i in 0..<150 { a.append(Self.refusal(Int64(2 * i), "a")) }
        for i in 0..<150 { b.append(Self.refusal(Int64(2 * i + 1), "b")) }
        let latest = RefusalRing.latest([a, b])
        #expect(latest.count == 200)
        #expect(latest.map(\.time) == (100..<300).reversed().map(Int64.init))
    }

    @Test func theTimelineKeepsAnHourOfSeconds() {
        var timeline = Timeline()
        for t in Int64(0)...5000 {
            timeline.sample(t: t, .init(bytesIn: Int(t) * 10, bytesOut: Int(t) * 20, saved: ["variant": Int(t)]))
        }
        let points = timeline.points(now: 5000)
        #expect(points.count == Timeline.span)
        #expect(points.first?.t == 5000 - Int64(Timeline.span) + 1)
        #expect(points.last?.t == 5000)
        #expect(points.allSatisfy { $0.bytesIn == 10 && $0.bytesOut == 20 && $0.saved == ["variant": 1] })
        // An hour later with no samples, nothing is left to show.
        #expect(timeline.points(now: 5000 + Int64(Timeline.span)).isEmpty)
    }

    @Test func aClockSetBackOnlyMovesTheBaseline() {
        var timeline = Timeline()
        timeline.sample(t: 100, .init(bytesIn: 0, bytesOut: 0, saved: [:]))
        timeline.sample(t: 101, .init(bytesIn: 5, bytesOut: 7, saved: [:]))
        timeline.sample(t: 90, .init(bytesIn: 50, bytesOut: 70, saved: [:]))
        timeline.sample(t: 91, .init(bytesIn: 51, bytesOut: 71, saved: [:]))
        let points = timeline.points(now: 101)
        #expect(points.map(\.t) == [101, 91])
        #expect(points.map(\.bytesIn) == [5, 1])
    }
}
