import DatamodeConfig
import DatamodePolicy
import DatamodeState
import Foundation
import Synchronization

/// The sessions and schedules this proxy holds as the shared store's (SPEC §19 with §12), by value: what it seeds
/// a Redis that came back empty with. Written by the control plane, read by the store's thread.
public final class SharedScopeCache: Sendable {
    private struct Known {
        var sessions: [String: [UInt8]] = [:]
        var schedules: [String: [UInt8]] = [:]
    }
    private let known = Mutex(Known())

    public init() {}

    /// Every session's value, by id.
    public var sessions: [String: [UInt8]] { known.withLock { $0.sessions } }
    /// Every schedule's value, by field (`SharedSchedule.field`).
    public var schedules: [String: [UInt8]] { known.withLock { $0.schedules } }

    func session(_ id: String) -> [UInt8]? { known.withLock { $0.sessions[id] } }
    func setSession(_ id: String, _ value: [UInt8]?) { known.withLock { $0.sessions[id] = value } }
    func setSchedule(_ field: String, _ value: [UInt8]?) { known.withLock { $0.schedules[field] = value } }
}

/// A session as the shared store holds it: the mode and profile set through the API, when that mode was set, and
/// an incarnation (a session deleted and created again under the same id is a new one: its counters start over).
/// A scheduled mode is never written here: each proxy runs the schedule itself. Each write also carries a token of
/// its own (`write`), so that a `PUT` repeating the last one is still a change every proxy sees (it cancels the
/// session's schedule there too).
enum SharedSession {
    struct Value: Equatable {
        var mode: DataMode
        var profile: String?
        var since: Int64
        var incarnation: String
    }

    static func newIncarnation() -> String { String(UInt64.random(in: 1...UInt64.max), radix: 16) }

    static func encode(_ value: Value) -> [UInt8] {
        var bytes = AdminJSON.encode(["mode": value.mode.name, "profile": value.profile ?? NSNull(), "since": value.since,
                                      "incarnation": value.incarnation, "write": newIncarnation()] as [String: Any])
        if bytes.last == 0x0a { bytes.removeLast() }
        return bytes
    }

    /// Parses a value as strictly as `PUT /sessions/{id}` checks a body; `origin` names the key in the error.
    static func decode(_ bytes: [UInt8], origin: String, profiles: Set<String>) throws(StateStore.StateError) -> Value {
        guard let object = (try? JSONSerialization.jsonObject(with: Data(bytes))) as? [String: Any] else {
            throw StateStore.StateError(description: "\(origin): not a JSON object")
        }
        guard let name = object["mode"] as? String, let mode = DataMode(name: name) else {
            throw StateStore.StateError(description: "\(origin): \"mode\" is missing or not a mode name; fix or delete it")
        }
        var profile: String?
        if let value = object["profile"], !(value is NSNull) {
            guard let text = value as? String, profiles.contains(text) else {
                throw StateStore.StateError(description: "\(origin): \"profile\" is not a link profile this proxy knows; fix or delete it")
            }
            profile = text
        }
        guard let since = (object["since"] as? NSNumber)?.int64Value, let incarnation = object["incarnation"] as? String,
              !incarnation.isEmpty else {
            throw StateStore.StateError(description: "\(origin): \"since\" (seconds) and \"incarnation\" are required; fix or delete it")
        }
        return Value(mode: mode, profile: profile, since: since, incarnation: incarnation)
    }
}

/// A schedule as the shared store holds it: `PUT /schedule`'s body with `start`, the wall-clock milliseconds its
/// first `after` counts from. Every proxy runs the timeline itself from that start (no leader: a step reaches every
/// proxy within SPEC §12's 50 ms of its nominal time as long as their clocks agree), and a proxy that learns of it
/// late works out where in it the fleet is.
public enum SharedSchedule {
    /// The global schedule's field.
    public static let globalField = "global"

    /// The field of the schedules' hash: `global`, or the session id (never `global`: `SessionsEndpoint.isValidID`).
    static func field(_ scope: String?) -> String { scope ?? globalField }

    static func encode(_ schedule: ModeSchedule, startMilliseconds: Int64) -> [UInt8] {
        let steps = schedule.steps.map { step -> [String: Any] in
            ["after": "\(ModeSchedule.nanoseconds(step.after) / 1_000_000)ms", "mode": step.mode.name]
        }
        var bytes = AdminJSON.encode(["steps": steps, "repeat": schedule.repeats, "session": schedule.scope ?? NSNull(),
                                      "start": startMilliseconds] as [String: Any])
        if bytes.last == 0x0a { bytes.removeLast() }
        return bytes
    }

    /// Parses a value as `PUT /schedule` parses a body, and checks it belongs to `field`.
    static func decode(_ bytes: [UInt8], field: String, origin: String,
                       sessions: [String: SessionScope]) throws(StateStore.StateError) -> (ScheduleEndpoint.ParsedSchedule, Int64) {
        guard let object = (try? JSONSerialization.jsonObject(with: Data(bytes))) as? [String: Any] else {
            throw StateStore.StateError(description: "\(origin) field \(field): not a JSON object")
        }
        guard let start = (object["start"] as? NSNumber)?.int64Value, !(object["start"] is String) else {
            throw StateStore.StateError(description: "\(origin) field \(field): \"start\" (wall-clock milliseconds) is required")
        }
        switch ScheduleEndpoint.parse(object, sessions: sessions, extraKeys: ["start"]) {
        case .success(let parsed):
            guard Self.field(parsed.scope) == field else {
                throw StateStore.StateError(description: "\(origin) field \(field): names \(Self.field(parsed.scope)) as its session")
            }
            return (parsed, start)
        case .failure(let failure):
            throw StateStore.StateError(description: "\(origin) field \(field): \(failure.detail)")
        }
    }
}

/// One session as read from the shared store: its value (nil: none, deleted or expired) and how many milliseconds
/// its key has left to live (nil: not read).
public struct SharedSessionRead: Sendable {
    public var id: String
    public var value: [UInt8]?
    public var lifetimeMilliseconds: Int64?
    public init(id: String, value: [UInt8]?, lifetimeMilliseconds: Int64?) {
        self.id = id
        self.value = value
        self.lifetimeMilliseconds = lifetimeMilliseconds
    }
}

extension AdminAPI {
    /// Applies sessions read from the shared store (SPEC §19 `store.kind: redis`): a new or changed value is put in
    /// force as `PUT /sessions/{id}` would (its schedule cancelled, a `mode` event for its scope); a session gone from
    /// the store is forgotten as `DELETE` would. `complete`: `reads` is every session the store holds, so a local
    /// one not among them is gone too. A bad value is refused once with a log line naming `prefix`'s key; the
    /// running session is kept. The caller serialises this with admin requests (the control plane).
    public func applySharedSessions(_ reads: [SharedSessionRead], complete: Bool, keyPrefix: String) {
        var read = Set<String>()
        for entry in reads {
            read.insert(entry.id)
            applySharedSession(entry, origin: keyPrefix + "session:" + entry.id)
        }
        guard complete else { return }
        let known = Set(runtime.load().snapshot.sessions.keys).union(sharedScopes.sessions.keys)
        for id in known.subtracting(read).sorted() {
            applySharedSession(SharedSessionRead(id: id, value: nil, lifetimeMilliseconds: nil), origin: keyPrefix + "session:" + id)
        }
    }

    private func applySharedSession(_ entry: SharedSessionRead, origin: String) {
        let id = entry.id
        if let lifetime = entry.lifetimeMilliseconds, lifetime >= 0 {
            sessionFleetExpiry[id] = monotonic() + UInt64(lifetime) * 1_000_000
        }
        let seenKey = "session:" + id
        guard sharedSeen[seenKey] != .some(entry.value) else { return }
        sharedSeen[seenKey] = .some(entry.value)
        guard let bytes = entry.value else {
            sharedScopes.setSession(id, nil)
            sessionIncarnation[id] = nil
            guard runtime.load().snapshot.sessions[id] != nil else { return }
            removeSession(id)
            logger.info("session gone from the shared store (deleted through another proxy, or expired)", metadata: ["session": "\(id)"])
            return
        }
        let value: SharedSession.Value
        do throws(StateStore.StateError) {
            guard SessionsEndpoint.isValidID(id) else {
                throw StateStore.StateError(description: "\(origin): not a valid session id")
            }
            value = try SharedSession.decode(bytes, origin: origin, profiles: knownProfiles())
        } catch {
            logger.error("shared state refused; the running state is kept", metadata: ["key": "\(origin)", "error": "\(error)"])
            return
        }
        let sameIncarnation = sessionIncarnation[id] == value.incarnation
        let scope = runtime.update { state -> SessionScope in
            var scope: SessionScope
            if let current = state.sessions[id], sameIncarnation {
                scope = current
            } else {
                state.sessionSerial += 1
                scope = SessionScope(mode: value.mode, profile: value.profile, modeSource: .api, since: value.since,
                                     serial: state.sessionSerial, slot: state.sessions[id]?.slot ?? state.freeSessionSlot())
            }
            scope.mode = value.mode
            scope.profile = value.profile
            scope.modeSource = .api
            scope.since = value.since
            state.sessions[id] = scope
            return scope
        }
        sessionIncarnation[id] = value.incarnation
        sharedScopes.setSession(id, bytes)
        // As `PUT /sessions/{id}` on the proxy that made it: the scope's schedule is cancelled.
        if schedules.cancel(scope: id) { sharedScopes.setSchedule(id, nil) }
        events.emit(.mode, scope: id, data: EventHub.modeData(scope: id, mode: SessionsEndpoint.modeDocument(scope)))
        logger.info("session set through another proxy", metadata: ["session": "\(id)", "mode": "\(value.mode)"])
    }

    /// Applies the schedules the shared store holds, by field (SPEC §19): a new one runs here from its shared start
    /// (the last step already due applied at once, as the fleet has it), one gone is cancelled. A schedule of a
    /// session not known here yet is left for the next read. A bad value is refused once with a log line naming the
    /// key and field; the running schedule is kept.
    public func applySharedSchedules(_ fields: [String: [UInt8]], key: String) {
        let sessions = runtime.load().snapshot.sessions
        for (field, bytes) in fields.sorted(by: { $0.key < $1.key }) {
            let seenKey = "schedule:" + field
            guard sharedSeen[seenKey] != .some(.some(bytes)) else { continue }
            if field != "global" && sessions[field] == nil { continue }
            sharedSeen[seenKey] = .some(bytes)
            let parsed: ScheduleEndpoint.ParsedSchedule
            let start: Int64
            do throws(StateStore.StateError) {
                (parsed, start) = try SharedSchedule.decode(bytes, field: field, origin: key, sessions: sessions)
            } catch {
                logger.error("shared state refused; the running state is kept", metadata: ["key": "\(key)", "field": "\(field)", "error": "\(error)"])
                continue
            }
            let monotonicNow = monotonic()
            let elapsed = wallMilliseconds() - start
            var schedule: ModeSchedule
            var passed: ModeSchedule.Step?
            if elapsed < 0 {
                schedule = ModeSchedule(scope: parsed.scope, steps: parsed.steps, repeats: parsed.repeats,
                                        start: monotonicNow + UInt64(-elapsed) * 1_000_000)
            } else {
                // Where the fleet is in the timeline, counted from its start (0), then moved onto this proxy's
                // monotonic clock, which may have started after the timeline did (a boot since).
                let elapsedNanoseconds = UInt64(elapsed) * 1_000_000
                schedule = ModeSchedule(scope: parsed.scope, steps: parsed.steps, repeats: parsed.repeats, start: 0)
                passed = schedule.skip(to: elapsedNanoseconds)
                schedule.start = monotonicNow &- min(monotonicNow, elapsedNanoseconds)
                schedule.previousNominal = monotonicNow &- min(monotonicNow, elapsedNanoseconds - schedule.previousNominal)
            }
            sharedScopes.setSchedule(field, bytes)
            if let passed { applyScheduled(passed.mode, scope: parsed.scope) }
            if schedule.nextDue != nil { schedules.set(schedule) } else { schedules.cancel(scope: parsed.scope) }
            logger.info("schedule set through another proxy", metadata: ["scope": "\(field)", "steps": "\(parsed.steps.count)",
                                                                         "elapsedMs": "\(max(0, elapsed))"])
        }
        for seenKey in sharedSeen.keys.filter({ $0.hasPrefix("schedule:") }).sorted() {
            let field = String(seenKey.dropFirst("schedule:".count))
            guard fields[field] == nil else { continue }
            sharedSeen[seenKey] = nil
            sharedScopes.setSchedule(field, nil)
            if schedules.cancel(scope: field == "global" ? nil : field) {
                logger.info("schedule cancelled through another proxy", metadata: ["scope": "\(field)"])
            }
        }
    }

    /// Sessions' idle expiry with a shared store (SPEC §12 with §19), run by the expiry timer: while the store is
    /// up, every session used or read here since the last call gets its key's whole lifetime again (the key's
    /// expiry is the fleet's), and the ids are returned for the store to refresh. While it is down, a session is
    /// forgotten once it is idle here and its key's lifetime, as last read, has run out.
    public func sharedSessionTick(storeUp: Bool, expiry: Duration) -> [String] {
        let sessions = runtime.load().snapshot.sessions
        guard !sessions.isEmpty else { return [] }
        let now = monotonic()
        let limit = ModeSchedule.nanoseconds(expiry)
        let tallies = sessionTallies()
        var refresh: [String] = []
        var expired: [String] = []
        for (id, scope) in sessions {
            let seen = tallies[id].flatMap { $0.serial == scope.serial ? $0.lastSeen : nil } ?? 0
            let last = max(sessionTouched[id] ?? 0, seen)
            if storeUp {
                guard last > sessionRefreshed[id] ?? 0 else { continue }
                sessionRefreshed[id] = last
                sessionFleetExpiry[id] = max(sessionFleetExpiry[id] ?? 0, last + limit)
                refresh.append(id)
            } else if now >= max(sessionFleetExpiry[id] ?? 0, last + limit) {
                expired.append(id)
            }
        }
        for id in expired.sorted() {
            removeSession(id)
            sharedScopes.setSession(id, nil)
            sharedSeen["session:" + id] = nil
            logger.info("session expired", metadata: ["session": "\(id)"])
        }
        return refresh.sorted()
    }
}
