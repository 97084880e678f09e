import DatamodeState
import Foundation

/// One admin endpoint, registered once (Envoy's `addHandler(prefix, help, handler, removable, mutates_state)`): its
/// path, the methods it answers and whether each changes state, who may call the ones that do not, a line of help,
/// and its handler. The router, the token check, the 404 text and the 405's `Allow` read `AdminAPI.routes` and
/// nothing else; a handler is called only with a method its row lists.
struct AdminRoute: Sendable {
    /// `/mode`, or a pattern: `{name}` stands for one path segment, still percent-encoded; a `{name}` that ends the
    /// pattern takes the rest of the path, slashes included (`/sessions/a/b` is session `a/b`), and may be empty.
    let path: String
    let methods: [AdminMethod]
    let readers: AdminReaders
    let help: String
    /// The request, and the path's `{…}` segments in order.
    let handler: @Sendable (AdminAPI, AdminRequest, [String]) -> AdminResponse

    init(_ path: String, _ methods: [AdminMethod], readers: AdminReaders, help: String,
         _ handler: @escaping @Sendable (AdminAPI, AdminRequest, [String]) -> AdminResponse) {
        self.path = path
        self.methods = methods
        self.readers = readers
        self.help = help
        self.handler = handler
    }

    /// The `{…}` segments of `requestPath` when it has this route's shape; nil when it does not.
    func match(_ requestPath: String) -> [String]? {
        let pattern = path.split(separator: "/", omittingEmptySubsequences: false)
        let given = requestPath.split(separator: "/", omittingEmptySubsequences: false)
        var parameters: [String] = []
        for (index, segment) in pattern.enumerated() {
            guard index < given.count else { return nil }
            if segment.hasPrefix("{") {
                if index == pattern.count - 1 {
                    parameters.append(given[index...].joined(separator: "/"))
                    return parameters
                }
                parameters.append(String(given[index]))
            } else if segment != given[index] {
                return nil
            }
        }
        return given.count == pattern.count ? parameters : nil
    }

    /// The method as this route answers it; nil when it does not answer it.
    func method(_ name: String) -> AdminMethod? {
        methods.first { $0.name == name }
    }
}

/// A method a route answers, and whether it changes state: one that does needs `admin.token`, whoever may read
/// the route (SPEC §7).
struct AdminMethod: Sendable, Equatable {
    let name: String
    let mutates: Bool

    static let get = AdminMethod(name: "GET", mutates: false)
    static let head = AdminMethod(name: "HEAD", mutates: false)
    static let put = AdminMethod(name: "PUT", mutates: true)
    static let post = AdminMethod(name: "POST", mutates: true)
    static let delete = AdminMethod(name: "DELETE", mutates: true)
}

/// Who may call a route's methods that change nothing, when `admin.token` is set (without one, everyone may call
/// everything). A method that changes state always needs `admin.token`.
enum AdminReaders: Sendable, Equatable {
    /// Anyone, without a token, whatever the method (a route open so has none that changes state): liveness, for a
    /// container HEALTHCHECK that has no token.
    case anyone
    /// Anyone, whatever the method, while the admin listener is on loopback (whoever reaches it runs on this machine,
    /// and a browser fetching it has no way to send a token); elsewhere as `readToken` (SPEC §9 `/ca.pem`).
    case anyoneOnLoopback
    /// `admin.token` or `admin.read-token`: what a client-side path monitor needs (SPEC §7).
    case readToken
    /// `admin.token` only.
    case token
}

extension AdminAPI {
    /// Every admin endpoint (SPEC §7), in the order the 404 text names them. A path matches the first row it fits.
    static let routes: [AdminRoute] = [
        AdminRoute("/", [.get, .head], readers: .anyoneOnLoopback,
                   help: "the admin page: mode with buttons, profile, budgets, refusals, charts, live from /events") {
            _, request, _ in AdminPage.handle(request)
        },
        AdminRoute("/mode", [.get, .head, .put, .delete], readers: .readToken,
                   help: "the data mode in force and who set it; PUT sets it (persisted), DELETE returns to flag/config") {
            api, request, _ in ModeEndpoint(api: api).handle(request)
        },
        AdminRoute("/variants", [.get, .head], readers: .token,
                   help: "every variant, from the configuration file and from the API") {
            api, request, _ in VariantsEndpoint(api: api).handleCollection(request)
        },
        AdminRoute("/variants/{id}", [.get, .head, .put, .delete], readers: .token,
                   help: "one variant; PUT creates or replaces an API variant, DELETE removes it (config ones are read-only)") {
            api, request, parameters in
            VariantsEndpoint(api: api).handleItem(request, pathSegment: parameters[0])
        },
        AdminRoute("/conditions", [.get, .head, .put, .delete], readers: .readToken,
                   help: "the link profile in force, its values and why; PUT {\"profile\": NAME} sets one until DELETE") {
            api, request, _ in ConditionsEndpoint(api: api).handle(request)
        },
        AdminRoute("/budgets", [.get, .head], readers: .readToken,
                   help: "every data budget: used, remaining, spent, resetsAt") {
            api, request, _ in BudgetsEndpoint(api: api).handleCollection(request)
        },
        AdminRoute("/budgets/{name}/reset", [.post], readers: .token,
                   help: "starts a budget's count over (persisted)") {
            api, request, parameters in BudgetsEndpoint(api: api).handleItem(request, name: parameters[0])
        },
        AdminRoute("/metrics", [.get, .head], readers: .token,
                   help: "Prometheus text: requests, bytes, connections, mode, durations, budgets") {
            api, request, _ in MetricsEndpoint(api: api).handle(request)
        },
        AdminRoute("/sessions", [.get, .head], readers: .token,
                   help: "every session with its mode, profile and counters") {
            api, request, _ in SessionsEndpoint(api: api).handleCollection(request)
        },
        AdminRoute("/sessions/{id}", [.get, .head, .put, .delete], readers: .token,
                   help: "one session; PUT {\"mode\", \"profile\"} creates or changes it, DELETE ends it") {
            api, request, parameters in
            SessionsEndpoint(api: api).handleItem(request, id: parameters[0].removingPercentEncoding ?? "")
        },
        AdminRoute("/events", [.get], readers: .readToken,
                   help: "text/event-stream: the mode now, then each mode, conditions, budget, variants, reload event; ?session=ID") {
            api, request, _ in EventsEndpoint(api: api).handle(request)
        },
        AdminRoute("/schedule", [.get, .head, .put, .delete], readers: .token,
                   help: "mode timelines; PUT {\"steps\": [...]} runs one, DELETE cancels it (?session=ID)") {
            api, request, _ in ScheduleEndpoint(api: api).handle(request)
        },
        AdminRoute("/deferred", [.get, .head], readers: .token,
                   help: "stored uploads (SPEC §18.3): id, method, url, bytes, status, attempts, lastError, times") {
            api, request, _ in DeferredEndpoint(api: api).handleCollection(request)
        },
        AdminRoute("/deferred/flush", [.post], readers: .token,
                   help: "delivers every queued upload now, whatever the mode (for test rigs)") {
            api, request, _ in DeferredEndpoint(api: api).handleFlush(request)
        },
        AdminRoute("/deferred/{id}", [.get, .head, .delete], readers: .token,
                   help: "one stored upload; DELETE cancels it while it is queued") {
            api, request, parameters in
            DeferredEndpoint(api: api).handleItem(request, pathSegment: parameters[0])
        },
        AdminRoute("/refusals", [.get, .head], readers: .token,
                   help: "the last 200 refused requests, newest first: time, client, method, url, error, reasons, rule, session") {
            api, request, _ in RefusalsEndpoint(api: api).handle(request)
        },
        AdminRoute("/stats/timeline", [.get, .head], readers: .token,
                   help: "bytes relayed (bytesIn, bytesOut) and saved by kind, one point per second over the last hour") {
            api, request, _ in TimelineEndpoint(api: api).handle(request)
        },
        AdminRoute("/healthz", [.get, .head], readers: .anyone,
                   help: "liveness: 200 while the control loop runs, no token needed") {
            api, request, _ in HealthEndpoint.handle(request, storeUp: api.storeUp)
        },
        AdminRoute("/ca.pem", [.get, .head], readers: .anyoneOnLoopback,
                   help: "the local CA's certificate, for clients to trust (no token needed on a loopback listener)") {
            api, request, _ in CACertificateEndpoint(api: api).handle(request)
        },
    ]

    /// The route `path` has the shape of, with its `{…}` segments.
    static func route(for path: String) -> (route: AdminRoute, parameters: [String])? {
        for route in routes {
            if let parameters = route.match(path) { return (route, parameters) }
        }
        return nil
    }

    /// The 404 for a path no route has the shape of: every route with its methods in `detail`, and as `endpoints`
    /// with its help too (as Envoy's admin lists its handlers' help for an unknown path).
    static func notFound(_ path: String) -> AdminResponse {
        AdminProblem.response(404, "not-found", "no admin endpoint at \(path); see \(endpointList)",
                              members: ["endpoints": routes.map { route -> [String: Any] in
                                  ["path": route.path, "methods": route.methods.map(\.name), "help": route.help]
                              }])
    }

    /// The 405 for a method `route` does not answer: `Allow` lists the ones it does (HEAD too where it is answered).
    static func methodNotAllowed(_ route: AdminRoute) -> AdminResponse {
        AdminProblem.methodNotAllowed(route.methods.map(\.name).joined(separator: ", "))
    }

    /// The same 405, for an endpoint's `default:` branch (the router answers an unlisted method before any handler).
    static func methodNotAllowed(_ request: AdminRequest) -> AdminResponse {
        guard let (route, _) = route(for: request.path) else { return notFound(request.path) }
        return methodNotAllowed(route)
    }

    private static let endpointList = routes.map { route in
        route.methods.map(\.name).joined(separator: "|") + " " + route.path
    }.joined(separator: ", ")
}
