// SPEC §18.1 through the real binary: a refusal whose conditions lift at a known time says when (`Retry-After`,
// `retryAfter`, `liftsAt`), to within a second, for a schedule on the global scope and on a session, and for the
// end of a spent budget's period; one that lifts at no known time says nothing.
import DatamodeTestSupport
import Foundation
import Testing

@Suite("Retry-After on refusals: end to end", .serialized)
struct RetryAfterEndToEndTests {
    static let refusedHeaders = [("Allow-Constrained", "?0")]
    /// Nothing listens there: a request that is let through would be a 502, never the 403 asserted.
    static let url = "http://127.0.0.1:9/report.bin"

    /// Checks a refusal's timing against `expected` (when it lifts, by the test's clock), within a second.
    static func expectLift(_ response: ParsedResponse, at expected: Date, _ what: String,
                           sourceLocation: SourceLocation = #_sourceLocation) {
        #expect(response.status == 403, "\(what): \(response.status) \(response.bodyText)", sourceLocation: sourceLocation)
        let now = Date()
        let wanted = expected.timeIntervalSince(now).rounded(.up)
        let header = response.value(of: "Retry-After").flatMap { Int($0) }
        #expect(header != nil, "\(what): no Retry-After in \(response.headText)", sourceLocation: sourceLocation)
        if let header {
            #expect(abs(Double(header) - wanted) <= 1, "\(what): Retry-After \(header), wanted \(wanted)",
                    sourceLocation: sourceLocation)
        }
        let body = (try? JSONSerialization.jsonObject(with: Data(response.body))) as? [String: Any] ?? [:]
        #expect(body["retryAfter"] as? Int == header, "\(what): retryAfter in \(response.bodyText)", sourceLocation: sourceLocation)
        let liftsAt = rfc3339(body["liftsAt"])
        #expect(liftsAt != nil, "\(what): liftsAt in \(response.bodyText)", sourceLocation: sourceLocation)
        if let liftsAt {
            #expect(abs(liftsAt.timeIntervalSince(expected)) <= 1, "\(what): liftsAt \(liftsAt), wanted \(expected)",
                    sourceLocation: sourceLocation)
        }
    }

    @Test("a schedule step that lifts the refusal: global scope and a session's, each its own")
    func schedule() throws {
        let config = "mode: constrained\nsessions: {enabled: true}\n"
        try withAdminProxy(config: config) { proxy, admin in
            let client = try RawHTTPClient(port: proxy.port)
            let plain = try proxied(client, Self.url, headers: Self.refusedHeaders)
            #expect(plain.status == 403)
            #expect(plain.value(of: "Retry-After") == nil, "no schedule: no known time, no Retry-After")
            #expect(plain.problem != nil && !plain.bodyText.contains("liftsAt"))

            let globalSet = Date()
            let steps = #"{"steps": [{"after": "20s", "mode": "expensive"}, {"after": "10s", "mode": "normal"}]}"#
            #expect(try admin.put("/schedule", steps).status == 200)
            // The first step leaves the mode expensive: a request that refuses only constrained lifts then; one that
            // refuses both lifts only at the second step.
            Self.expectLift(try proxied(client, Self.url, headers: Self.refusedHeaders),
                            at: globalSet.addingTimeInterval(20), "global, lifted by the first step")
            Self.expectLift(try proxied(client, Self.url, headers: Self.refusedHeaders + [("Allow-Expensive", "?0")]),
                            at: globalSet.addingTimeInterval(30), "global, lifted only by the second step")

            #expect(try admin.put("/sessions/rig", #"{"mode": "constrained"}"#).status == 201)
            let sessionSet = Date()
            #expect(try admin.put("/schedule", #"{"steps": [{"after": "7s", "mode": "normal"}], "session": "rig"}"#).status == 200)
            Self.expectLift(try proxied(client, Self.url, headers: Self.refusedHeaders + [("Data-Mode-Session", "rig")]),
                            at: sessionSet.addingTimeInterval(7), "session rig, its own schedule")
            // The global schedule is not the session's, nor the other way round.
            Self.expectLift(try proxied(client, Self.url, headers: Self.refusedHeaders),
                            at: globalSet.addingTimeInterval(20), "global again")
            #expect(try admin.delete("/schedule").status == 204)
            let cancelled = try proxied(client, Self.url, headers: Self.refusedHeaders)
            #expect(cancelled.status == 403 && cancelled.value(of: "Retry-After") == nil, "a cancelled schedule lifts nothing")
        }
    }

    @Test("a spent budget: the refusal lifts at the end of its period (the next UTC hour)")
    func budget() throws {
        let origin = try RecordingOrigin { _ in .ok(String(repeating: "b", count: 4_000)) }
        defer { origin.stop() }
        let config = """
            budgets:
              - {name: hourly, bytes: 1KB, period: hour, then: constrained}
              - {name: cap, bytes: 1KB, period: hour, then: reject, match: {host: "localhost"}}
            """
        try withAdminProxy(config: config) { proxy, admin in
            let client = try RawHTTPClient(port: proxy.port)
            #expect(try proxied(client, origin.url("/spend")).status == 200)
            _ = try proxied(client, "http://localhost:\(origin.port)/spend")
            Thread.sleep(forTimeInterval: 0.3)  // SPEC §11: spent for heads read 100 ms after the byte that spent it
            let now = Date().timeIntervalSince1970
            let hourEnd = Date(timeIntervalSince1970: (now / 3600).rounded(.down) * 3600 + 3600)
            let refused = try proxied(client, origin.url("/later"), headers: Self.refusedHeaders)
            Self.expectLift(refused, at: hourEnd, "budget hourly")
            #expect(refused.problem?.error == "constrained")
            #expect(refused.bodyText.contains("\"budget\":\"hourly\""))
            let exhausted = try proxied(client, "http://localhost:\(origin.port)/later")
            #expect(exhausted.problem?.error == "budget-exhausted", "\(exhausted.bodyText)")
            Self.expectLift(exhausted, at: hourEnd, "budget cap (then: reject)")
            _ = admin
        }
    }
}
