import DatamodeConfig
import DatamodeEngine
import DatamodePolicy
import Foundation
import Logging

/// The admin API (SPEC §7): routes a request to its endpoint after the bearer-token check.
///
/// Its caller runs one request at a time (`ProxyInstance` serialises them with reloads), so endpoints are serial;
/// they reach the workers solely by replacing the `RuntimeState` snapshot (never a lock on the request path) and
/// read the workers' counters through `metrics`.
public final class AdminAPI: @unchecked Sendable {
    let runtime: RuntimeState
    let store: StateStore
    let token: String?
    let metrics: () -> MetricsSnapshot
    let reloads: () -> ReloadCounts
    let logger: Logger
    let now: () -> Int64
    /// `admin.read-token`: grants only the read endpoints a path monitor needs (SPEC §7).
    let readToken: String?
    /// The workers' session counters, summed now (`ProxyServer.sessionTallies`).
    let sessionTallies: () -> [String: SessionTally]
    /// Monotonic nanoseconds (the injected clock): session idle expiry and schedules count with it.
    let monotonic: () -> UInt64
    /// The link profile names a session may name (SPEC §10).
    let knownProfiles: () -> Set<String>
    /// The event stream's source (SPEC §12 `GET /events`).
    public let events: EventHub
    /// Running mode timelines (SPEC §12 `PUT /schedule`).
    public let schedules = ScheduleBook()
    /// When each session was last created, changed or read through the API (monotonic nanoseconds).
    var sessionTouched: [String: UInt64] = [:]
    /// The local CA's certificate (PEM), when one is loaded (SPEC §9).
    let caCertificate: () -> String?

    /// Data budgets (SPEC §11), counted by the workers.
    let budgets: BudgetLedger
    /// Whether each budget was spent at the last `emitBudgetChanges` (a `budget` event marks each change).
    var budgetSpent: [String: Bool] = [:]

    public init(runtime: RuntimeState, store: StateStore, token: String?, readToken: String? = nil, logger: Logger,
                budgets: BudgetLedger = BudgetLedger(budgets: [], slots: 1, now: 0),
                metrics: @escaping () -> MetricsSnapshot, reloads: @escaping () -> ReloadCounts = { ReloadCounts() },
                sessionTallies: @escaping () -> [String: SessionTally] = { [:] },
                now: @escaping () -> Int64 = { Int64(Date().timeIntervalSince1970) },
                monotonic: @escaping () -> UInt64 = { SystemClock().nowNanoseconds() },
                knownProfiles: @escaping () -> Set<String> = { LinkProfileNames.builtIn },
                events: EventHub = EventHub(),
                caCertificate: @escaping () -> String? = { nil }) {
        self.caCertificate = caCertificate
        self.runtime = runtime
        self.store = store
        self.token = token
        self.readToken = readToken
        self.logger = logger
        self.metrics = metrics
        self.reloads = reloads
        self.sessionTallies = sessionTallies
        self.now = now
        self.monotonic = monotonic
        self.knownProfiles = knownProfiles
        self.events = events
        self.budgets = budgets
    }

    public func handle(_ request: AdminRequest) -> AdminResponse {
        // Liveness reveals nothing and must work for a container HEALTHCHECK that has no token.
        if request.path == "/healthz" { return HealthEndpoint.handle(request) }
        if request.path == "/ca.pem" && CACertificateEndpoint.openWithoutToken(self) {
            return CACertificateEndpoint(api: self).handle(request)
        }
        if let token, !Self.authorized(request.headers["authorization"], token: token),
           !(Self.isMonitorRead(request) && readToken.map { Self.authorized(request.headers["authorization"], token: $0) } == true) {
            var response = AdminProblem.response(401, "unauthorized", "a valid 'Authorization: Bearer <token>' header is required")
            response.headers.append(("WWW-Authenticate", "Bearer realm=\"datamode-proxy admin\""))
            return response
        }
        switch request.path {
        case "/mode": return ModeEndpoint(api: self).handle(request)
        case "/variants": return VariantsEndpoint(api: self).handleCollection(request)
        case "/metrics": return MetricsEndpoint(api: self).handle(request)
        case "/sessions": return SessionsEndpoint(api: self).handleCollection(request)
        case "/events": return EventsEndpoint(api: self).handle(request)
        case "/schedule": return ScheduleEndpoint(api: self).handle(request)
        case "/ca.pem": return CACertificateEndpoint(api: self).handle(request)
        case "/conditions": return ConditionsEndpoint(api: self).handle(request)
        case "/budgets": return BudgetsEndpoint(api: self).handleCollection(request)
        default:
            if request.path.hasPrefix("/budgets/") {
                return BudgetsEndpoint(api: self).handleItem(request, path: String(request.path.dropFirst("/budgets/".count)))
            }
            if request.path.hasPrefix("/sessions/") {
                let id = String(request.path.dropFirst("/sessions/".count)).removingPercentEncoding ?? ""
                return SessionsEndpoint(api: self).handleItem(request, id: id)
            }
            if request.path.hasPrefix("/variants/") {
                let id = String(request.path.dropFirst("/variants/".count)).removingPercentEncoding ?? ""
                return VariantsEndpoint(api: self).handleItem(request, id: id)
            }
            return Self.notFound(request.path)
        }
    }

    /// The 404 for a path no endpoint answers: every endpoint with its methods.
    static func notFound(_ path: String) -> AdminResponse {
        AdminProblem.response(404, "not-found", "no admin endpoint at \(path); see GET|HEAD|PUT|DELETE /mode, GET|HEAD /variants, "
            + "GET|HEAD|PUT|DELETE /variants/{id}, GET|HEAD|PUT|DELETE /conditions, GET|HEAD /budgets, POST /budgets/{name}/reset, "
            + "GET|HEAD /metrics, GET|HEAD /sessions, GET|HEAD|PUT|DELETE /sessions/{id}, GET /events, "
            + "GET|HEAD|PUT|DELETE /schedule, GET|HEAD /healthz, GET|HEAD /ca.pem")
    }

    /// What `admin.read-token` grants (SPEC §7, §9): reading the mode, following the events and fetching the CA
    /// certificate, nothing that changes state, and only with a method the endpoint answers (`/events` has no HEAD).
    static func isMonitorRead(_ request: AdminRequest) -> Bool {
        switch request.method {
        case "GET": ["/mode", "/events", "/conditions", "/budgets", "/ca.pem"].contains(request.path)
        case "HEAD": ["/mode", "/conditions", "/budgets", "/ca.pem"].contains(request.path)
        default: false
        }
    }

    /// Emits a `budget` event (SPEC §12) for every budget that became spent, or whole again at a new period, since
    /// the last call. Called by the control plane's budget tick (every 100 ms), serialised with admin requests.
    public func emitBudgetChanges() {
        let now = self.now()
        for (index, budget) in budgets.budgets.enumerated() {
            let spent = budgets.isSpent(index, now: now)
            guard budgetSpent[budget.name, default: false] != spent else { continue }
            budgetSpent[budget.name] = spent
            events.emit(.budget, scope: "global", data: BudgetsEndpoint.document(budgets, index, now: now))
        }
    }

    static func authorized(_ header: String?, token: String) -> Bool {
        guard let header, header.count > 7, header.prefix(7).lowercased() == "bearer " else { return false }
        let given = Array(header.dropFirst(7).trimmingCharacters(in: .whitespaces).utf8)
        let expected = Array(token.utf8)
        var difference = given.count == expected.count ? 0 : 1
        for i in 0..<max(given.count, expected.count) {
            difference |= Int((i < given.count ? given[i] : 0) ^ (i < expected.count ? expected[i] : 0))
        }
        return difference == 0
    }
}

/// Configuration reloads since start-up, by result (`datamode_reloads_total`): a refused one keeps the running
/// configuration, and is counted so that a file that stopped loading shows up on a dashboard, not only in a log.
public struct ReloadCounts: Sendable, Equatable {
    public var ok: Int
    public var failed: Int
    public init(ok: Int = 0, failed: Int = 0) {
        self.ok = ok
        self.failed = failed
    }
}

/// Problem documents of the admin API (RFC 9457), with admin-specific error codes.
enum AdminProblem {
    static func response(_ status: Int, _ code: String, _ detail: String) -> AdminResponse {
        let body: [String: Any] = ["type": "urn:datamode:admin:\(code)", "title": title(status), "status": status,
                                   "error": code, "detail": detail]
        return AdminResponse(status: status, headers: [("Content-Type", "application/problem+json"), ("Cache-Control", "no-store")],
                             body: AdminJSON.encode(body))
    }

    static func methodNotAllowed(_ allowed: String) -> AdminResponse {
        var response = response(405, "method-not-allowed", "allowed: \(allowed)")
        response.headers.append(("Allow", allowed))
        return response
    }

    private static func title(_ status: Int) -> String {
        switch status {
        case 400: "Bad request"
        case 401: "Unauthorized"
        case 404: "Not found"
        case 405: "Method not allowed"
        case 409: "Conflict"
        case 503: "Service unavailable"
        default: "Admin API error"
        }
    }
}

enum AdminJSON {
    static func encode(_ value: Any) -> [UInt8] {
        guard let data = try? JSONSerialization.data(withJSONObject: value, options: [.sortedKeys, .withoutEscapingSlashes]) else {
            return Array("{}".utf8)
        }
        return Array(data) + [0x0a]
    }

    static func ok(_ value: Any, status: Int = 200) -> AdminResponse {
        AdminResponse(status: status, headers: [("Content-Type", "application/json"), ("Cache-Control", "no-store")], body: encode(value))
    }

    /// Parses a JSON object body, or says why not.
    static func object(_ body: [UInt8]) -> Result<[String: Any], AdminFailure> {
        guard !body.isEmpty else { return .failure(AdminFailure(400, "bad-request", "a JSON object body is required")) }
        guard let value = try? JSONSerialization.jsonObject(with: Data(body)) else {
            return .failure(AdminFailure(400, "bad-request", "the body is not valid JSON"))
        }
        guard let object = value as? [String: Any] else {
            return .failure(AdminFailure(400, "bad-request", "the body must be a JSON object"))
        }
        return .success(object)
    }

    /// A JSON boolean (JSONSerialization gives NSNumber; 0/1 numbers are not booleans).
    static func bool(_ value: Any?) -> Bool? {
        // JSON true/false decode to a boolean NSNumber (objCType "c"); 0 and 1 decode to integers ("i", "q").
        guard let number = value as? NSNumber, String(cString: number.objCType) == "c" else { return nil }
        return number.boolValue
    }
}

struct AdminFailure: Error {
    var status: Int
    var code: String
    var detail: String
    init(_ status: Int, _ code: String, _ detail: String) {
        self.status = status
        self.code = code
        self.detail = detail
    }
    var response: AdminResponse { AdminProblem.response(status, code, detail) }
}
