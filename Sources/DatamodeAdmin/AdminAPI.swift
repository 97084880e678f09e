import DatamodeConfig
import DatamodePolicy
import DatamodeState
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
    /// The stored uploads (SPEC §18.3 `/deferred`); nil: the endpoints answer 503 `store-unavailable`.
    public var deferral: DeferralAdmin?
    /// When each session was last created, changed or read through the API (monotonic nanoseconds).
    var sessionTouched: [String: UInt64] = [:]
    /// The local CA's certificate (PEM), when one is loaded (SPEC §9).
    let caCertificate: () -> String?

    /// The workers' latest refusals, newest first (`ProxyServer.refusals`, SPEC §20).
    let refusals: () -> [Refusal]
    /// Bytes per second over the last hour (SPEC §20), sampled by `sampleTimeline`.
    var timeline = Timeline()
    /// The shared store's state (SPEC §19): nil with `store.kind: file` (the directory is always there), else
    /// whether Redis is reachable now. Read by `/healthz` and `/metrics`.
    public var storeUp: (() -> Bool)?
    /// With a shared store (SPEC §19): resets budget `index` for the whole fleet (its shared counter and this
    /// process's share of it), or throws `unavailable`. nil: the budget is this process's own.
    public var sharedBudgetReset: ((Int) throws(StateStore.StateError) -> Void)?
    /// What the shared store last held for each followed file, as applied or refused (`applyShared`): the same
    /// value seen again by the next sync is neither applied nor refused again.
    var sharedSeen: [String: [UInt8]?] = [:]
    /// The sessions and schedules held as the shared store's (SPEC §19): what an empty Redis is seeded with.
    public let sharedScopes = SharedScopeCache()
    /// Wall-clock milliseconds since the Unix epoch (the injected clock): where a shared schedule starts.
    public var wallMilliseconds: () -> Int64 = { Int64(Date().timeIntervalSince1970 * 1000) }
    /// With a shared store, per session: when its key expires as last read or refreshed (monotonic nanoseconds;
    /// what expires it here while Redis is down), the last use here already refreshed in Redis, and its
    /// incarnation (`SharedSession.Value`).
    var sessionFleetExpiry: [String: UInt64] = [:]
    var sessionRefreshed: [String: UInt64] = [:]
    var sessionIncarnation: [String: String] = [:]

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
                caCertificate: @escaping () -> String? = { nil },
                refusals: @escaping () -> [Refusal] = { [] }) {
        self.caCertificate = caCertificate
        self.refusals = refusals
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

    /// The `413` for a request larger than the admin listener takes (`limit` bytes, its head and body as sent).
    /// The transport sends it itself, often before the request is whole, so it is made once, up front.
    public static func requestTooLarge(limit: Int) -> AdminResponse {
        AdminProblem.response(413, "request-too-large", "an admin request, its head and body as sent, is at most \(limit) bytes")
    }

    public func handle(_ request: AdminRequest) -> AdminResponse {
        let found = Self.route(for: request.path)
        guard admits(request, to: found?.route) else {
            var response = AdminProblem.response(401, "unauthorized", "a valid 'Authorization: Bearer <token>' header is required")
            response.headers.append(("WWW-Authenticate", "Bearer realm=\"datamode-proxy admin\""))
            return response
        }
        guard let (route, parameters) = found else { return Self.notFound(request.path) }
        guard route.method(request.method) != nil else { return Self.methodNotAllowed(route) }
        return route.handler(self, request, parameters)
    }

    /// Whether the request's credentials reach `route` (nil: a path no route has the shape of, which needs
    /// `admin.token` like any other, so that a 404 tells nothing to whoever has none). `admin.read-token` reaches the
    /// methods that change nothing of a route its readers include (SPEC §7, §9).
    func admits(_ request: AdminRequest, to route: AdminRoute?) -> Bool {
        switch route?.readers {
        case .anyone: return true
        case .anyoneOnLoopback where runtime.load().snapshot.configuration.admin.listen.isLoopback: return true
        default: break
        }
        guard let token else { return true }
        let authorization = request.headers["authorization"]
        if Self.authorized(authorization, token: token) { return true }
        guard let route, route.readers != .token, route.method(request.method)?.mutates == false,
              let readToken else { return false }
        return Self.authorized(authorization, token: readToken)
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

    /// Adds this second's point to the timeline from the workers' running totals (SPEC §20). Called by the control
    /// plane once a second, serialised with admin requests.
    public func sampleTimeline() {
        timeline.sample(t: now(), Timeline.Totals(metrics()))
    }

    /// A state write that failed: `503 store-unavailable` when the shared store could not take it (nothing changed,
    /// on any proxy: SPEC §19), else `500 state-write-failed` (the disk).
    func stateWriteFailure(_ error: StateStore.StateError) -> AdminResponse {
        if error.unavailable {
            var response = AdminProblem.response(503, "store-unavailable", "\(error)")
            response.headers.append(("Retry-After", "1"))
            return response
        }
        return AdminProblem.response(500, "state-write-failed", "\(error)")
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
    /// `members`: extension members of the problem (RFC 9457 §3.2), beside the standard ones.
    static func response(_ status: Int, _ code: String, _ detail: String, members: [String: Any] = [:]) -> AdminResponse {
        let body: [String: Any] = members.merging(["type": "urn:datamode:admin:\(code)", "title": title(status), "status": status,
                                                   "error": code, "detail": detail]) { _, standard in standard }
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
        case 413: "Request too large"
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
