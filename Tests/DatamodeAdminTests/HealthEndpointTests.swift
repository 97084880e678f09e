import DatamodeAdmin
import Testing

/// `GET /healthz` (SPEC §7): liveness, for a container HEALTHCHECK that has no token.
@Suite("Admin: /healthz")
struct HealthEndpointTests {
    @Test("GET and HEAD answer 200, with or without a token configured", arguments: [
        ("GET", nil), ("HEAD", nil), ("GET", "t0ken"), ("HEAD", "t0ken"),
    ] as [(String, String?)])
    func alive(_ method: String, _ token: String?) throws {
        let response = try AdminFixture(token: token).handle(method, "/healthz")
        #expect(response.status == 200)
        #expect(response.header("Content-Type") == "application/json")
        #expect(response.object["status"] as? String == "ok")
    }

    @Test("other methods: 405 with Allow, before any token check", arguments: ["PUT", "POST", "DELETE"])
    func otherMethods(_ method: String) throws {
        let response = try AdminFixture(token: "t0ken").handle(method, "/healthz")
        expectProblem(response, 405, "method-not-allowed")
        #expect(response.header("Allow") == "GET, HEAD")
    }
}
