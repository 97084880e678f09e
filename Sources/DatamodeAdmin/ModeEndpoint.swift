import DatamodeConfig
import DatamodePolicy
import DatamodeState
import Foundation

/// `GET /mode`, `PUT /mode`, `DELETE /mode` (SPEC §2, §7, §15).
///
/// The API mode beats `--mode`/`DATAMODE_MODE`, which beats the file (`ModeResolution`). A PUT is persisted before
/// it is applied, so a mode the caller was told about survives a restart; DELETE forgets it and returns to the
/// flag/config mode.
public struct ModeEndpoint {
    let api: AdminAPI

    func handle(_ request: AdminRequest) -> AdminResponse {
        switch request.method {
        case "GET", "HEAD": return AdminJSON.ok(Self.document(api.runtime.load().snapshot, budgets: api.budgets, now: api.now()))
        case "PUT": return put(request)
        case "DELETE": return delete()
        default: return AdminAPI.methodNotAllowed(request)
        }
    }

    /// The global `mode` event's data (SPEC §12).
    public static func eventData(_ snapshot: RuntimeSnapshot) -> [String: Any] {
        EventHub.modeData(scope: "global", mode: DataModeDocument(json: document(snapshot)))
    }

    /// With `budgets`, the mode is the effective one: spent budgets without a `match` join it (SPEC §11), and the
    /// source says `budget` and names the budget when one adds a condition.
    static func document(_ snapshot: RuntimeSnapshot, budgets: BudgetLedger, now: Int64) -> [String: Any] {
        let effect = budgets.globalEffect(now: now)
        let mode = snapshot.mode.union(effect.mode)
        guard mode != snapshot.mode, let name = effect.budget else { return document(snapshot) }
        var document = document(snapshot)
        document["mode"] = mode.name
        document["constrained"] = mode.constrained
        document["expensive"] = mode.expensive
        document["ultraConstrained"] = mode.ultraConstrained
        document["source"] = "budget"
        document["budget"] = name
        document["profile"] = snapshot.profile(for: mode).profile?.name ?? NSNull()
        return document
    }

    static func document(_ snapshot: RuntimeSnapshot) -> [String: Any] {
        [
            "mode": snapshot.mode.name,
            "constrained": snapshot.mode.constrained,
            "expensive": snapshot.mode.expensive,
            "ultraConstrained": snapshot.mode.ultraConstrained,
            "source": snapshot.modeSource.rawValue,
            "since": Timestamp.rfc3339(wallNanoseconds: snapshot.modeSince * 1_000_000_000, fractionDigits: 0),
            // The link profile in force (SPEC §10; details in GET /conditions).
            "profile": snapshot.profileInForce.profile?.name ?? NSNull(),
        ]
    }

    private func put(_ request: AdminRequest) -> AdminResponse {
        let mode: DataMode
        switch Self.parseMode(request.body) {
        case .success(let parsed): mode = parsed
        case .failure(let failure): return failure.response
        }
        let since = api.now()
        do {
            try api.store.saveMode(mode, since: since)
        } catch {
            return api.stateWriteFailure(error)
        }
        let snapshot = api.runtime.update { state -> RuntimeSnapshot in
            state.apply(ModeResolution(api: mode, configuration: state.configuration), now: since)
            return state
        }
        api.logger.info("mode set through the admin API", metadata: ["mode": "\(mode)"])
        cancelSchedule()
        api.emitGlobalMode(snapshot)
        return AdminJSON.ok(Self.document(snapshot))
    }

    private func delete() -> AdminResponse {
        do {
            try api.store.deleteMode()
        } catch {
            return api.stateWriteFailure(error)
        }
        let now = api.now()
        let snapshot = api.runtime.update { state -> RuntimeSnapshot in
            state.apply(ModeResolution(api: nil, configuration: state.configuration), now: now)
            return state
        }
        api.logger.info("API mode cleared", metadata: ["mode": "\(snapshot.mode)"])
        cancelSchedule()
        api.emitGlobalMode(snapshot)
        return AdminJSON.ok(Self.document(snapshot))
    }

    /// SPEC §12: `PUT` or `DELETE /mode` on a scope cancels that scope's schedule.
    /// With a shared store the write of the mode cancelled it in Redis too, for every proxy (`SharedStateWriter.share`).
    private func cancelSchedule() {
        api.sharedScopes.setSchedule(SharedSchedule.field(nil), nil)
        if api.schedules.cancel(scope: nil) { api.logger.info("global schedule cancelled by a mode change") }
    }

    /// The condition members of a mode document, by JSON name (SPEC §7: camelCase).
    static let conditionKeys = ["constrained", "expensive", "ultraConstrained"]

    /// `{"mode": "<name>"}` or `{"constrained": bool, "expensive": bool, "ultraConstrained": bool}`, where a missing
    /// condition is false (SPEC §7, §15).
    static func parseMode(_ body: [UInt8]) -> Result<DataMode, AdminFailure> {
        switch AdminJSON.object(body) {
        case .success(let object): return parseMode(object)
        case .failure(let f): return .failure(f)
        }
    }

    /// `parseMode` of an already parsed object; `extraKeys` are allowed beside the mode and left to the caller.
    static func parseMode(_ object: [String: Any], extraKeys: Set<String> = []) -> Result<DataMode, AdminFailure> {
        var object = object
        for key in extraKeys { object[key] = nil }
        let unknown = Set(object.keys).subtracting(["mode"] + conditionKeys)
        if let key = unknown.sorted().first {
            let extra = extraKeys.sorted().map { ", \"\($0)\"" }.joined()
            return .failure(AdminFailure(400, "bad-request", "unknown key \"\(key)\"\(extra.isEmpty ? "" : " (allowed besides the mode: " + extra.dropFirst(2) + ")"); use {\"mode\": NAME} or "
                + "{\"constrained\": BOOL, \"expensive\": BOOL, \"ultraConstrained\": BOOL}"))
        }
        let givesConditions = conditionKeys.contains { object[$0] != nil }
        if let name = object["mode"] {
            guard !givesConditions else {
                return .failure(AdminFailure(400, "bad-request",
                                             "give either \"mode\" or \"constrained\"/\"expensive\"/\"ultraConstrained\", not both"))
            }
            guard let text = name as? String, let mode = DataMode(name: text) else {
                return .failure(AdminFailure(400, "bad-request", "\"mode\" must be one of \(DataMode.acceptedNames.joined(separator: ", "))"))
            }
            return .success(mode)
        }
        guard givesConditions else {
            return .failure(AdminFailure(400, "bad-request", "give \"mode\" or \"constrained\"/\"expensive\"/\"ultraConstrained\""))
        }
        var mode = DataMode.normal
        for (key, value) in object {
            guard let flag = AdminJSON.bool(value) else {
                return .failure(AdminFailure(400, "bad-request", "\"\(key)\" must be true or false"))
            }
            switch key {
            case "constrained": mode.constrained = flag
            case "expensive": mode.expensive = flag
            default: mode.ultraConstrained = flag
            }
        }
        return .success(mode)
    }
}
