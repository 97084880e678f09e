import DatamodeConfig
import DatamodePolicy
import DatamodeState
import Foundation

/// `GET /sessions`, `PUT`, `GET`, `DELETE /sessions/{id}` (SPEC §12): named scopes with their own mode and counters,
/// so parallel tests do not fight over one global mode.
///
/// A session's mode and profile live in the `RuntimeSnapshot` (the workers read their copy of it); its counters live
/// in the workers and are summed when read. Sessions are kept in memory only and forgotten after
/// `sessions.idle-expiry` without traffic or API calls.
struct SessionsEndpoint {
    let api: AdminAPI

    /// Session ids: what fits a header value and a URL path segment without quoting, as proxy user names do.
    static func isValidID(_ id: String) -> Bool {
        let bytes = Array(id.utf8)
        return !bytes.isEmpty && bytes.count <= 128 && bytes.allSatisfy { $0 > 0x20 && $0 < 0x7F && $0 != UInt8(ascii: ",") }
            && id != "global"
    }

    func handleCollection(_ request: AdminRequest) -> AdminResponse {
        let snapshot = api.runtime.load().snapshot
        let tallies = api.sessionTallies()
        let list = snapshot.sessions.keys.sorted().map { id in
            Self.document(id: id, snapshot.sessions[id]!, tallies[id].flatMap { $0.serial == snapshot.sessions[id]!.serial ? $0 : nil })
        }
        return AdminJSON.ok(["enabled": snapshot.configuration.sessions.enabled, "sessions": list] as [String: Any])
    }

    func handleItem(_ request: AdminRequest, id: String) -> AdminResponse {
        guard Self.isValidID(id) else {
            return AdminProblem.response(400, "bad-request",
                                         "a session id is 1 to 128 visible ASCII characters without ',' (and not \"global\")")
        }
        switch request.method {
        case "GET", "HEAD": return get(id)
        case "PUT": return put(request, id: id)
        case "DELETE": return delete(id)
        default: return AdminAPI.methodNotAllowed(request)
        }
    }

    private func get(_ id: String) -> AdminResponse {
        let snapshot = api.runtime.load().snapshot
        guard let scope = snapshot.sessions[id] else { return unknown(id) }
        api.sessionTouched[id] = api.monotonic()
        return AdminJSON.ok(Self.document(id: id, scope, api.tally(id, serial: scope.serial)))
    }

    private func put(_ request: AdminRequest, id: String) -> AdminResponse {
        // SPEC §12: while sessions are off the session header is ignored; a session created now would be believed in
        // by a rig and honoured by nothing. Refused before the body is looked at: nothing in it could change that.
        guard api.runtime.load().snapshot.configuration.sessions.enabled else {
            let code = ProxyErrorCode.sessionsDisabled
            return AdminProblem.response(code.status, code.rawValue,
                                         "sessions are off (sessions.enabled: false): no request would be judged by "
                                             + "session \(id); set sessions: {enabled: true} in the configuration")
        }
        let object: [String: Any]
        switch AdminJSON.object(request.body) {
        case .success(let o): object = o
        case .failure(let failure): return failure.response
        }
        var profile: String?
        if let value = object["profile"], !(value is NSNull) {
            guard let name = value as? String else {
                return AdminProblem.response(400, "bad-request", "\"profile\" must be a link profile name or null")
            }
            guard api.knownProfiles().contains(name) else {
                return AdminProblem.response(400, "unknown-profile", "no link profile \"\(name)\"; known: "
                    + api.knownProfiles().sorted().joined(separator: ", "))
            }
            profile = name
        }
        let existing = api.runtime.load().snapshot.sessions[id]
        let mode: DataMode
        if object.keys.contains(where: { $0 == "mode" || ModeEndpoint.conditionKeys.contains($0) }) {
            switch ModeEndpoint.parseMode(object, extraKeys: ["profile"]) {
            case .success(let parsed): mode = parsed
            case .failure(let failure): return failure.response
            }
        } else if let key = Set(object.keys).subtracting(["profile"]).sorted().first {
            return AdminProblem.response(400, "bad-request", "unknown key \"\(key)\"; use {\"mode\": NAME, \"profile\": NAME}")
        } else {
            mode = existing?.mode ?? .normal
        }
        let now = api.now()
        if let shared = api.store.shared {
            // SPEC §19: in Redis first (living idle-expiry unless used), so every proxy honours it; nowhere if Redis
            // cannot take it.
            let incarnation = existing.flatMap { _ in api.sessionIncarnation[id] } ?? SharedSession.newIncarnation()
            let since = existing.map { $0.mode != mode || $0.modeSource != .api ? now : $0.since } ?? now
            let value = SharedSession.encode(.init(mode: mode, profile: profile, since: since, incarnation: incarnation))
            let lifetime = api.runtime.load().snapshot.configuration.sessions.idleExpiry
            do {
                try shared.shareSession(id, value, lifetime: lifetime)
            } catch {
                return api.stateWriteFailure(error)
            }
            api.sessionIncarnation[id] = incarnation
            api.sharedSeen["session:" + id] = .some(value)
            api.sharedScopes.setSession(id, value)
            api.sessionFleetExpiry[id] = api.monotonic() + ModeSchedule.nanoseconds(lifetime)
        }
        let scope = api.runtime.update { state -> SessionScope in
            var scope: SessionScope
            if let current = state.sessions[id] {
                scope = current
                if scope.mode != mode || scope.modeSource != .api { scope.since = now }
                scope.mode = mode
                scope.modeSource = .api
                scope.profile = profile
            } else {
                state.sessionSerial += 1
                scope = SessionScope(mode: mode, profile: profile, modeSource: .api, since: now, serial: state.sessionSerial,
                                     slot: state.freeSessionSlot())
            }
            state.sessions[id] = scope
            return scope
        }
        api.sessionTouched[id] = api.monotonic()
        // SPEC §12: setting the scope's mode cancels its schedule.
        _ = api.schedules.cancel(scope: id)
        api.sharedScopes.setSchedule(id, nil)
        api.events.emit(.mode, scope: id, data: EventHub.modeData(scope: id, mode: Self.modeDocument(scope)))
        api.logger.info("session set", metadata: ["session": "\(id)", "mode": "\(mode)"])
        return AdminJSON.ok(Self.document(id: id, scope, existing == nil ? nil : api.tally(id, serial: scope.serial)),
                            status: existing == nil ? 201 : 200)
    }

    private func delete(_ id: String) -> AdminResponse {
        guard let scope = api.runtime.load().snapshot.sessions[id] else { return unknown(id) }
        let tally = api.tally(id, serial: scope.serial)
        if let shared = api.store.shared {
            // SPEC §19: gone from every proxy, or from none.
            do {
                try shared.shareSession(id, nil, lifetime: .zero)
            } catch {
                return api.stateWriteFailure(error)
            }
            api.sharedSeen["session:" + id] = .some(nil)
            api.sharedScopes.setSession(id, nil)
        }
        api.removeSession(id)
        api.logger.info("session deleted", metadata: ["session": "\(id)"])
        // The final counters, so a rig can assert on them in the same call that cleans up.
        return AdminJSON.ok(Self.document(id: id, scope, tally))
    }

    private func unknown(_ id: String) -> AdminResponse {
        AdminProblem.response(404, "unknown-session", "no session \(id); create it with PUT /sessions/\(id)")
    }

    static func modeDocument(_ scope: SessionScope) -> DataModeDocument {
        DataModeDocument(json: [
            "mode": scope.mode.name,
            "constrained": scope.mode.constrained,
            "expensive": scope.mode.expensive,
            "ultraConstrained": scope.mode.ultraConstrained,
            "source": scope.modeSource.rawValue,
            "since": Timestamp.rfc3339(wallNanoseconds: scope.since * 1_000_000_000, fractionDigits: 0),
        ])
    }

    /// The session document: its mode (as `GET /mode` shows one), profile and counters.
    static func document(id: String, _ scope: SessionScope, _ tally: SessionTally?) -> [String: Any] {
        var json = modeDocument(scope).json
        json["id"] = id
        json["profile"] = scope.profile ?? NSNull()
        let tally = tally ?? SessionTally(serial: scope.serial)
        json["requests"] = tally.requests
        json["requestsTotal"] = tally.requestCount
        json["bytes"] = ["in": tally.bytesIn, "out": tally.bytesOut]
        json["variants"] = tally.variants
        json["rejected"] = tally.rejected.map { entry -> [String: Any] in
            ["url": entry.url, "error": entry.error, "time": Timestamp.rfc3339(wallNanoseconds: entry.time)]
        }
        return json
    }
}

extension AdminAPI {
    /// The session's counters summed over the workers, if it has any (of this incarnation).
    func tally(_ id: String, serial: UInt64) -> SessionTally? {
        guard let tally = sessionTallies()[id], tally.serial == serial else { return nil }
        return tally
    }

    /// Forgets a session: its scope, its schedule and its API activity. The workers drop its counters at their
    /// next snapshot.
    func removeSession(_ id: String) {
        runtime.update { state in state.sessions[id] = nil }
        sessionTouched[id] = nil
        sessionFleetExpiry[id] = nil
        sessionRefreshed[id] = nil
        sessionIncarnation[id] = nil
        _ = schedules.cancel(scope: id)
        sharedScopes.setSchedule(id, nil)
    }

    /// Forgets every session idle for `expiry` or longer (no request finished in it and no API call on it), and
    /// returns their ids. Idle time is counted on the injected monotonic clock.
    @discardableResult
    public func expireIdleSessions(after expiry: Duration) -> [String] {
        let sessions = runtime.load().snapshot.sessions
        guard !sessions.isEmpty else { return [] }
        let now = monotonic()
        let limit = UInt64(expiry.components.seconds) * 1_000_000_000 + UInt64(expiry.components.attoseconds / 1_000_000_000)
        let tallies = sessionTallies()
        var expired: [String] = []
        for (id, scope) in sessions {
            let touched = sessionTouched[id] ?? 0
            let seen = tallies[id].flatMap { $0.serial == scope.serial ? $0.lastSeen : nil } ?? 0
            let last = max(touched, seen)
            if now >= last && now - last >= limit { expired.append(id) }
        }
        for id in expired.sorted() {
            removeSession(id)
            logger.info("session expired", metadata: ["session": "\(id)"])
        }
        return expired
    }

    /// Emits the global scope's `mode` event.
    func emitGlobalMode(_ snapshot: RuntimeSnapshot) {
        events.emit(.mode, scope: "global", data: EventHub.modeData(scope: "global",
                                                                     mode: DataModeDocument(json: ModeEndpoint.document(snapshot))))
    }
}
