import DatamodeState

/// `GET /healthz` → 200 while the control loop runs (liveness; no token needed).
enum HealthEndpoint {
    static func handle(_ request: AdminRequest) -> AdminResponse {
        return AdminJSON.ok(["status": "ok"])
    }
}
