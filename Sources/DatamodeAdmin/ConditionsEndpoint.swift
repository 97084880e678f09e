import DatamodeConfig
import DatamodePolicy
import DatamodeState
import Foundation

/// `GET /conditions`, `PUT /conditions`, `DELETE /conditions` (SPEC §10): the link profile in force, its values
/// and why; a profile set through the API beats the mode's mapping until it is deleted. Like the API mode, a
/// profile set here is persisted (`conditions.json`) before it is applied, so it survives a restart.
struct ConditionsEndpoint {
    let api: AdminAPI

    func handle(_ request: AdminRequest) -> AdminResponse {
        switch request.method {
        case "GET", "HEAD": return AdminJSON.ok(Self.document(api.runtime.load().snapshot))
        case "PUT": return put(request)
        case "DELETE": return delete()
        default: return AdminAPI.methodNotAllowed(request)
        }
    }

    /// The profile in force under the global mode: its name (null when none) and values, the source (`api`,
    /// `mode` or `none`), the condition that brought it, the scope, and every profile name there is.
    static func document(_ snapshot: RuntimeSnapshot) -> [String: Any] {
        let resolution = snapshot.profileInForce
        var document: [String: Any] = [
            "profile": resolution.profile?.name ?? NSNull(),
            "source": resolution.source.rawValue,
            "mode": snapshot.mode.name,
            "scope": snapshot.configuration.link.scope.rawValue,
            "profiles": snapshot.configuration.link.profileNames,
        ]
        if let profile = resolution.profile { document.merge(values(profile)) { _, new in new } }
        if let condition = resolution.condition { document["condition"] = condition.rawValue }
        // Set through the API but gone from the configuration since (a reload): say so rather than hide it.
        if let name = snapshot.apiProfile, resolution.source != .api { document["apiProfile"] = name }
        return document
    }

    /// A profile's values in JSON: rates in bits per second, latency and jitter in milliseconds.
    static func values(_ profile: LinkProfile) -> [String: Any] {
        ["down": profile.down, "up": profile.up,
         "latencyMs": Double(profile.latencyMicroseconds) / 1000, "jitterMs": Double(profile.jitterMicroseconds) / 1000]
    }

    private func put(_ request: AdminRequest) -> AdminResponse {
        let object: [String: Any]
        switch AdminJSON.object(request.body) {
        case .success(let o): object = o
        case .failure(let f): return f.response
        }
        if let key = Set(object.keys).subtracting(["profile"]).sorted().first {
            return AdminProblem.response(400, "bad-request", "unknown key \"\(key)\"; use {\"profile\": NAME} (DELETE /conditions clears it)")
        }
        guard let name = object["profile"] as? String else {
            return AdminProblem.response(400, "bad-request", "give {\"profile\": NAME}; DELETE /conditions clears the profile")
        }
        let known = api.runtime.load().snapshot.configuration.link
        guard known.profiles[name] != nil else {
            return Self.unknownProfile(name, known: known.profileNames)
        }
        do {
            try api.store.saveProfile(name)
        } catch {
            return api.stateWriteFailure(error)
        }
        let snapshot = api.runtime.update { state -> RuntimeSnapshot in
            state.apiProfile = name
            return state
        }
        api.logger.info("link profile set through the admin API", metadata: ["profile": "\(name)"])
        let document = Self.document(snapshot)
        api.events.emit(.conditions, scope: "global", data: document)
        return AdminJSON.ok(document)
    }

    private func delete() -> AdminResponse {
        do {
            try api.store.deleteProfile()
        } catch {
            return api.stateWriteFailure(error)
        }
        let snapshot = api.runtime.update { state -> RuntimeSnapshot in
            state.apiProfile = nil
            return state
        }
        api.logger.info("API link profile cleared")
        let document = Self.document(snapshot)
        api.events.emit(.conditions, scope: "global", data: document)
        return AdminJSON.ok(document)
    }

    /// `400 unknown-profile` (SPEC §6, §10): the SPEC's own error code, in the proxy's problem format.
    static func unknownProfile(_ name: String, known: [String]) -> AdminResponse {
        let problem = ProblemDetail(code: .unknownProfile,
                                    detail: "no profile named \"\(name)\"; known: \(known.joined(separator: ", "))")
        return AdminResponse(status: 400, headers: [("Content-Type", "application/problem+json"), ("Cache-Control", "no-store")],
                             body: Array((problem.json + "\n").utf8))
    }
}
