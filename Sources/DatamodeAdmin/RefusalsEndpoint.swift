import DatamodeState
import Foundation

/// `GET /refusals` (SPEC §20): the last 200 refused requests of every worker, newest first.
struct RefusalsEndpoint {
    let api: AdminAPI

    func handle(_ request: AdminRequest) -> AdminResponse {
        AdminJSON.ok(["refusals": api.refusals().map(Self.document)])
    }

    /// One refusal: `time` (RFC 3339, milliseconds), `client`, `method`, `url`, `error`, `reasons`, and `rule` and
    /// `session` (null when none).
    static func document(_ refusal: Refusal) -> [String: Any] {
        [
            "time": Timestamp.rfc3339(wallNanoseconds: refusal.time, fractionDigits: 3), "client": refusal.client,
            "method": refusal.method, "url": refusal.url, "error": refusal.error, "reasons": refusal.reasons,
            "rule": refusal.rule ?? NSNull(), "session": refusal.session ?? NSNull(),
        ]
    }
}

/// `GET /stats/timeline` (SPEC §20): bytes relayed and saved per second over the last hour, oldest first.
struct TimelineEndpoint {
    let api: AdminAPI

    func handle(_ request: AdminRequest) -> AdminResponse {
        let points = api.timeline.points(now: api.now()).map { point -> [String: Any] in
            ["t": point.t, "bytesIn": point.bytesIn, "bytesOut": point.bytesOut, "saved": point.saved]
        }
        return AdminJSON.ok(["interval": 1, "points": points])
    }
}
