import DatamodeEngine

/// `GET /healthz` → 200 while the control loop runs (liveness; no token needed).
enum HealthEndpoint {
    static func handle(_ request: AdminRequest) -> AdminResponse {
        guard request.method == "GET" || request.method == "HEAD" else { return AdminProblem.methodNotAllowed("GET, HEAD") }
        return AdminJSON.ok(["status": "ok"])
    }
}
