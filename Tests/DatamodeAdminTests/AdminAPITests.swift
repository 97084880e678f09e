import DatamodeAdmin
import Testing

/// `AdminAPI.handle`: the bearer token (SPEC §7) and the routing, before any endpoint.
@Suite("Admin: authorization and routing")
struct AdminAPITests {
    @Test("with a token set, only the exact bearer token passes", arguments: [
        (nil, 401),
        ("Bearer t0ken", 200),
        ("bearer t0ken", 200),            // the scheme is case-insensitive (RFC 9110 §11.1)
        ("BEARER t0ken", 200),
        ("Bearer t0ken  ", 200),          // trailing whitespace is not part of the token
        ("Bearer T0KEN", 401),            // the token itself is not
        ("Bearer t0ke", 401),
        ("Bearer t0ken2", 401),
        ("Bearer", 401),
        ("Bearer ", 401),
        ("Basic dDBrZW4=", 401),
        ("t0ken", 401),
    ] as [(String?, Int)])
    func token(_ authorization: String?, _ status: Int) throws {
        let admin = try AdminFixture(token: "t0ken")
        let response = admin.handle("GET", "/mode", headers: authorization.map { ["authorization": $0] } ?? [:])
        #expect(response.status == status, "\(response.text)")
        if status == 401 {
            expectProblem(response, 401, "unauthorized")
            #expect(response.header("WWW-Authenticate") == #"Bearer realm="datamode-proxy admin""#)
        }
    }

    @Test("a refused request changes nothing")
    func refusedWrite() throws {
        let admin = try AdminFixture(token: "t0ken")
        let generation = admin.runtime.generation
        let response = admin.handle("PUT", "/mode", #"{"mode": "constrained"}"#, headers: ["authorization": "Bearer nope"])
        #expect(response.status == 401)
        #expect(admin.runtime.generation == generation)
        #expect(try admin.store.loadMode() == nil)
    }

    @Test("without a token every endpoint is open")
    func noToken() throws {
        let admin = try AdminFixture()
        for path in ["/mode", "/variants", "/metrics", "/healthz"] {
            #expect(admin.handle("GET", path).status == 200, "\(path)")
        }
    }

    /// Every endpoint with its methods, item paths included, and the same text for a path under `/budgets/` that is
    /// not `{name}/reset` as for any other unknown path.
    @Test("an unknown path is a 404 problem that names every endpoint and its methods",
          arguments: ["/index.html", "//", "/modes", "/variant", "/metrics/x", "/mode/", "/budgets/daily", "/budgets/", "/budgets/daily/reset/x"])
    func unknownPath(_ path: String) throws {
        let response = try AdminFixture().handle("GET", path)
        expectProblem(response, 404, "not-found")
        #expect(response.header("Cache-Control") == "no-store")
        let detail = response.object["detail"] as? String ?? ""
        #expect(detail.hasPrefix("no admin endpoint at \(path); see "), "\(detail)")
        for endpoint in ["GET|HEAD|PUT|DELETE /mode", "GET|HEAD /variants", "GET|HEAD|PUT|DELETE /variants/{id}",
                         "GET|HEAD|PUT|DELETE /conditions", "GET|HEAD /budgets", "POST /budgets/{name}/reset",
                         "GET|HEAD /metrics", "GET|HEAD /sessions", "GET|HEAD|PUT|DELETE /sessions/{id}", "GET /events",
                         "GET|HEAD|PUT|DELETE /schedule", "GET|HEAD /healthz", "GET|HEAD /ca.pem"] {
            #expect(detail.contains(" \(endpoint),") || detail.hasSuffix(" \(endpoint)"), "\(endpoint) missing from: \(detail)")
        }
    }

    /// `/events` answers GET only: the read token's grant does not reach a method the endpoint does not answer, so
    /// HEAD with it is refused as with no token (with `admin.token` it is the endpoint's 405).
    @Test("admin.read-token is refused on HEAD /events, which /events does not answer")
    func readTokenHeadEvents() throws {
        let admin = try AdminFixture(token: "all", readToken: "look")
        expectProblem(admin.handle("HEAD", "/events", headers: ["authorization": "Bearer look"]), 401, "unauthorized")
        expectProblem(admin.handle("HEAD", "/events", headers: ["authorization": "Bearer all"]), 405, "method-not-allowed")
        #expect(admin.handle("GET", "/events", headers: ["authorization": "Bearer look"]).status == 200)
        #expect(admin.handle("HEAD", "/mode", headers: ["authorization": "Bearer look"]).status == 200)
    }

    @Test("an unknown path with a token set is refused before it is routed")
    func unknownPathNeedsTheToken() throws {
        let response = try AdminFixture(token: "t0ken").handle("GET", "/secret")
        #expect(response.status == 401)
    }
}
