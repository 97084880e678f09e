/// Bytes relayed and saved per second over the last hour (SPEC §20 `GET /stats/timeline`, the admin page's charts).
///
/// Built by sampling, not by the workers: once a second the control plane reads the running totals the workers
/// already keep (`MetricsSnapshot`) and stores what changed since the previous sample. The request path does not
/// know the timeline exists.
public struct Timeline: Sendable {
    /// One second's traffic.
    public struct Point: Sendable, Equatable {
        /// Unix seconds: the second that ended at this sample.
        public var t: Int64
        public var bytesIn: Int
        public var bytesOut: Int
        /// By kind of saving (`variant`, `rejected`, `hls-cap`, `dash-cap`, `transcoded`); kinds with 0 left out.
        public var saved: [String: Int]

        public init(t: Int64, bytesIn: Int, bytesOut: Int, saved: [String: Int]) {
            self.t = t
            self.bytesIn = bytesIn
            self.bytesOut = bytesOut
            self.saved = saved
        }
    }

    /// The running totals a sample reads.
    public struct Totals: Sendable, Equatable {
        public var bytesIn: Int
        public var bytesOut: Int
        public var saved: [String: Int]

        public init(bytesIn: Int, bytesOut: Int, saved: [String: Int]) {
            self.bytesIn = bytesIn
            self.bytesOut = bytesOut
            self.saved = saved
        }

        public init(_ snapshot: MetricsSnapshot) {
            self.init(bytesIn: snapshot.bytesIn, bytesOut: snapshot.bytesOut, saved: snapshot.bytesSaved)
        }
    }

    /// How many seconds are kept (SPEC §20: one hour).
    public static let span = 3600

    private var points: [Point] = []
    private var next = 0
    private var last: (t: Int64, totals: Totals)?

    public init() {}

    /// Records the totals read at unix second `t`: the point for `t` holds what grew since the previous sample.
    /// Seconds without a sample (a stalled control loop) are written as zero points, and the growth is given to
    /// the second it was seen in; a sample for a second already recorded (a clock set back) only moves the baseline.
    public mutating func sample(t: Int64, _ totals: Totals) {
        defer { last = (t, totals) }
        guard let last, t > last.t else { return }
        var gap = last.t + 1
        while gap < t, t - gap < Int64(Self.span) {
            append(Point(t: gap, bytesIn: 0, bytesOut: 0, saved: [:]))
            gap += 1
        }
        var saved: [String: Int] = [:]
        for (kind, value) in totals.saved {
            let grown = value - (last.totals.saved[kind] ?? 0)
            if grown > 0 { saved[kind] = grown }
        }
        append(Point(t: t, bytesIn: max(0, totals.bytesIn - last.totals.bytesIn),
                     bytesOut: max(0, totals.bytesOut - last.totals.bytesOut), saved: saved))
    }

    private mutating func append(_ point: Point) {
        if points.count < Self.span {
            points.append(point)
        } else {
            points[next] = point
            next = (next + 1) % Self.span
        }
    }

    /// The points of the last hour before `now` (unix seconds), oldest first.
    public func points(now: Int64) -> [Point] {
        (points[next...] + points[..<next]).filter { $0.t > now - Int64(Self.span) && $0.t <= now }
    }
}
