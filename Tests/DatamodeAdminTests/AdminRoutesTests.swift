@testable import DatamodeAdmin
import DatamodeState
import Testing

/// The route table (`AdminAPI.routes`) against what the router, the token check and the 404 text do with it: every
/// row, every method, as values through `AdminAPI.handle` (no listener, no socket).
@Suite("Admin: the route table")
struct AdminRoutesTests {
    static let paths = AdminAPI.routes.map(\.path)
    /// Methods the admin transport passes on (`AdminTransport.handle`).
    static let allMethods = ["GET", "HEAD", "PUT", "POST", "DELETE", "PATCH", "OPTIONS", "TRACE", "CONNECT"]
    /// A non-loopback listener, so that `/ca.pem` needs a token as the other routes do.
    static let offLoopback = "admin: {listen: 0.0.0.0:8878, token: all}"

    static func row(_ path: String) -> AdminRoute {
        AdminAPI.routes.first { $0.path == path }!
    }

    /// The row's path with each `{…}` filled in.
    static func concrete(_ path: String) -> String {
        path.split(separator: "/", omittingEmptySubsequences: false)
            .map { $0.hasPrefix("{") ? "x1" : String($0) }.joined(separator: "/")
    }

    /// The router's own 404 (an endpoint's 404 for a missing item is an answer from the endpoint).
    static func isRouterNotFound(_ response: AdminResponse) -> Bool {
        response.status == 404 && (response.object["detail"] as? String ?? "").hasPrefix("no admin endpoint at ")
    }

    @Test("rows: unique paths, each with methods and help; a row open to anyone has no method that changes state")
    func rows() {
        #expect(Set(Self.paths).count == Self.paths.count)
        for route in AdminAPI.routes {
            #expect(!route.methods.isEmpty && Set(route.methods.map(\.name)).count == route.methods.count, "\(route.path)")
            #expect(!route.help.isEmpty && !route.help.contains("\n"), "\(route.path)")
            if route.readers == .anyone || route.readers == .anyoneOnLoopback {
                #expect(!route.methods.contains { $0.mutates }, "\(route.path)")
            }
        }
    }

    @Test("each row's path reaches that row and its handler, with every method it lists", arguments: paths)
    func routed(_ path: String) throws {
        let row = Self.row(path)
        let concrete = Self.concrete(path)
        #expect(AdminAPI.route(for: concrete)?.route.path == path, "\(concrete) is taken by an earlier row")
        let admin = try AdminFixture(Self.offLoopback, token: "all")
        for method in row.methods {
            let response = admin.handle(method.name, concrete, headers: ["authorization": "Bearer all"])
            #expect(!Self.isRouterNotFound(response) && response.status != 401, "\(method.name) \(concrete): \(response.text)")
        }
    }

    @Test("admin.read-token: refused on each method that writes and on each row it may not read; let through elsewhere",
          arguments: paths)
    func readToken(_ path: String) throws {
        let row = Self.row(path)
        let admin = try AdminFixture(Self.offLoopback, token: "all", readToken: "look")
        for method in Self.allMethods {
            let response = admin.handle(method, Self.concrete(path), headers: ["authorization": "Bearer look"])
            let listed = row.method(method)
            if row.readers == .anyone || (listed?.mutates == false && row.readers != .token) {
                #expect(response.status != 401, "\(method) \(path): \(response.text)")
            } else {
                expectProblem(response, 401, "unauthorized")
            }
        }
    }

    /// SPEC §7: the read token grants only GET /mode, /events, /conditions, /budgets and /ca.pem (HEAD with each
    /// that answers it), plus /healthz, which needs no token at all, and the admin page (SPEC §20).
    @Test("what admin.read-token reaches is SPEC §7's list")
    func readTokenMatchesTheSpec() throws {
        let admin = try AdminFixture(Self.offLoopback, token: "all", readToken: "look")
        var reached: Set<String> = []
        for route in AdminAPI.routes {
            for method in Self.allMethods
            where admin.api.admits(AdminRequest(method: method, path: Self.concrete(route.path),
                                            headers: ["authorization": "Bearer look"]), to: route) {
                reached.insert("\(method) \(route.path)")
            }
        }
        // SPEC §20: the admin page has the read endpoints' authorisation (it holds no data of its own).
        let monitor = ["GET /mode", "HEAD /mode", "GET /events", "GET /conditions", "HEAD /conditions",
                       "GET /budgets", "HEAD /budgets", "GET /ca.pem", "HEAD /ca.pem", "GET /", "HEAD /"]
        #expect(reached == Set(monitor + Self.allMethods.map { "\($0) /healthz" }))
    }

    @Test("without a token: a row open to anyone answers every method, every other row is a 401", arguments: paths)
    func noToken(_ path: String) throws {
        let row = Self.row(path)
        let admin = try AdminFixture(Self.offLoopback, token: "all")
        for method in Self.allMethods {
            let response = admin.handle(method, Self.concrete(path))
            #expect((response.status == 401) == (row.readers != .anyone), "\(method) \(path): \(response.text)")
        }
    }

    @Test("on a loopback listener /ca.pem and the page need no token, whatever the method; nothing else opens")
    func loopback() throws {
        let admin = try AdminFixture(token: "all", caCertificate: "-----BEGIN CERTIFICATE-----\n")
        for route in AdminAPI.routes {
            let open = route.readers == .anyone || route.readers == .anyoneOnLoopback
            for method in Self.allMethods {
                let response = admin.handle(method, Self.concrete(route.path))
                #expect((response.status == 401) == !open, "\(method) \(route.path): \(response.text)")
            }
        }
    }

    @Test("a method a row does not answer is a 405 whose Allow lists exactly the row's methods", arguments: paths)
    func methodNotAllowed(_ path: String) throws {
        let row = Self.row(path)
        let admin = try AdminFixture(Self.offLoopback, token: "all")
        for method in Self.allMethods where row.method(method) == nil {
            let response = admin.handle(method, Self.concrete(path), headers: ["authorization": "Bearer all"])
            expectProblem(response, 405, "method-not-allowed")
            #expect(response.header("Allow") == row.methods.map(\.name).joined(separator: ", "),
                    "\(method) \(path): Allow \(response.header("Allow") ?? "none")")
        }
    }

    @Test("the 404 text names every row with its methods")
    func notFoundNamesEveryRow() throws {
        let detail = try AdminFixture().handle("GET", "/nowhere").object["detail"] as? String ?? ""
        for route in AdminAPI.routes {
            let entry = route.methods.map(\.name).joined(separator: "|") + " " + route.path
            #expect(detail.contains(" \(entry),") || detail.hasSuffix(" \(entry)"), "\(entry) missing from: \(detail)")
        }
    }

    /// Envoy answers an unknown admin path with every handler's help; here it is a member of the problem document.
    @Test("the 404 lists every row as an endpoint: path, methods, help")
    func notFoundListsEveryRowWithItsHelp() throws {
        let endpoints = try AdminFixture().handle("GET", "/nowhere").object["endpoints"] as? [[String: Any]] ?? []
        #expect(endpoints.map { $0["path"] as? String ?? "" } == Self.paths)
        for (endpoint, route) in zip(endpoints, AdminAPI.routes) {
            #expect(endpoint["methods"] as? [String] == route.methods.map(\.name), "\(route.path)")
            #expect(endpoint["help"] as? String == route.help, "\(route.path)")
        }
    }

    @Test("a pattern's {…}: one segment in the middle, the rest of the path at the end (possibly empty)", arguments: [
        ("/sessions/a", ["a"]), ("/sessions/a/b", ["a/b"]), ("/sessions/", [""]), ("/sessions/a%2Fb", ["a%2Fb"]),
        ("/sessions", nil), ("/session/a", nil),
    ] as [(String, [String]?)])
    func trailingParameter(_ path: String, _ parameters: [String]?) {
        #expect(Self.row("/sessions/{id}").match(path) == parameters)
    }

    @Test("a middle {…} is exactly one segment", arguments: [
        ("/budgets/daily/reset", ["daily"]), ("/budgets//reset", [""]), ("/budgets/daily", nil),
        ("/budgets/a/b/reset", nil), ("/budgets/daily/reset/", nil), ("/budgets/daily/resets", nil),
    ] as [(String, [String]?)])
    func middleParameter(_ path: String, _ parameters: [String]?) {
        #expect(Self.row("/budgets/{name}/reset").match(path) == parameters)
    }
}
