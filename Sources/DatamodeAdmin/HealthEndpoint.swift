import DatamodeState

/// `GET /healthz` → 200 while the control loop runs (liveness; no token needed). With a shared store (SPEC §19) it
/// says whether the store is reachable (`"store": "up"` or `"down"`), still 200: a proxy without its store goes on
/// serving with the state it last knew, so it is alive and should not be restarted for it.
enum HealthEndpoint {
    static func handle(_ request: AdminRequest, storeUp: (() -> Bool)?) -> AdminResponse {
        var document: [String: Any] = ["status": "ok"]
        if let storeUp { document["store"] = storeUp() ? "up" : "down" }
        return AdminJSON.ok(document)
    }
}
