import DatamodeConfig
import DatamodePolicy
import DatamodeState
import Foundation
import Synchronization

/// A mode timeline (SPEC §12): steps of `after` then `mode`, each `after` counted from the previous step's
/// nominal time (never from when it actually ran, so lateness does not accumulate), optionally repeated.
public struct ModeSchedule: Sendable, Equatable {
    public typealias Step = ScheduleStep

    /// `nil`: the global mode; else a session id.
    public var scope: String?
    public var steps: [Step]
    public var repeats: Bool
    /// Monotonic nanoseconds the first `after` counts from.
    public var start: UInt64
    /// The next step to apply.
    public var next = 0
    /// The nominal time of the step before `next` (`start` before the first).
    public var previousNominal: UInt64

    public init(scope: String?, steps: [Step], repeats: Bool, start: UInt64) {
        self.scope = scope
        self.steps = steps
        self.repeats = repeats
        self.start = start
        self.previousNominal = start
    }

    /// When the next step is due, or nil when the timeline has ended.
    public var nextDue: UInt64? {
        guard next < steps.count else { return nil }
        return previousNominal + Self.nanoseconds(steps[next].after)
    }

    /// The steps due at `now`, in order, advancing past them.
    public mutating func take(dueAt now: UInt64) -> [Step] {
        var due: [Step] = []
        while let at = nextDue, at <= now, due.count < 10_000 {
            due.append(steps[next])
            previousNominal = at
            next += 1
            if next == steps.count && repeats { next = 0 }
        }
        return due
    }

    /// Moves past every step due at `now` without applying them one by one, and returns the last (nil: none was
    /// due): where a proxy that learns of a running timeline late stands in it (SPEC §19). Whole cycles of a
    /// repeated timeline are skipped at once.
    public mutating func skip(to now: UInt64) -> Step? {
        let cycle = steps.reduce(UInt64(0)) { $0 + Self.nanoseconds($1.after) }
        if repeats, cycle > 0, next == 0, now > previousNominal + 2 * cycle {
            previousNominal += ((now - previousNominal) / cycle - 1) * cycle
        }
        return take(dueAt: now).last
    }

    static func nanoseconds(_ duration: Duration) -> UInt64 {
        let (seconds, attoseconds) = duration.components
        return UInt64(max(0, seconds)) * 1_000_000_000 + UInt64(max(0, attoseconds) / 1_000_000_000)
    }
}

/// The running timelines, one per scope. Touched by the control plane only (serialised by `ProxyInstance`).
public final class ScheduleBook: @unchecked Sendable {
    private var schedules: [String: ModeSchedule] = [:]
    private var changed: (() -> Void)?

    /// Called after every change, so the owner re-arms its timer for `nextDue`.
    public func onChange(_ handler: @escaping () -> Void) { changed = handler }

    static func key(_ scope: String?) -> String { scope ?? "" }

    func set(_ schedule: ModeSchedule) {
        schedules[Self.key(schedule.scope)] = schedule
        changed?()
    }

    /// Cancels the scope's timeline; whether there was one.
    @discardableResult
    func cancel(scope: String?) -> Bool {
        guard schedules.removeValue(forKey: Self.key(scope)) != nil else { return false }
        changed?()
        return true
    }

    func schedule(scope: String?) -> ModeSchedule? { schedules[Self.key(scope)] }
    var all: [ModeSchedule] { schedules.keys.sorted().map { schedules[$0]! } }

    /// Every running schedule's steps still to come, in wall-clock time, by scope (`""`: global): what the
    /// workers read to tell a refused client when its refusal lifts (SPEC §18.1). `wallNow` and `monotonicNow`
    /// are the same moment on both clocks.
    public func outlooks(wallNow: Int64, monotonicNow: UInt64) -> [String: ScheduleOutlook] {
        var out: [String: ScheduleOutlook] = [:]
        for (key, schedule) in schedules {
            guard let due = schedule.nextDue else { continue }
            let delta = due >= monotonicNow ? Int64(due - monotonicNow) : -Int64(monotonicNow - due)
            out[key] = ScheduleOutlook(steps: schedule.steps, repeats: schedule.repeats, next: schedule.next,
                                       nextAt: wallNow + delta)
        }
        return out
    }

    /// The earliest time a step is due, over every scope.
    public var nextDue: UInt64? { schedules.values.compactMap(\.nextDue).min() }

    /// Takes every step due at `now`, by scope; ended timelines are removed.
    func takeDue(at now: UInt64) -> [(scope: String?, steps: [ModeSchedule.Step])] {
        var out: [(scope: String?, steps: [ModeSchedule.Step])] = []
        for key in schedules.keys.sorted() {
            var schedule = schedules[key]!
            let steps = schedule.take(dueAt: now)
            if !steps.isEmpty { out.append((schedule.scope, steps)) }
            schedules[key] = schedule.nextDue == nil ? nil : schedule
        }
        return out
    }
}

extension AdminAPI {
    /// Applies every schedule step due now (called by the owner's timer at `schedules.nextDue`): each sets its
    /// scope's mode as `PUT /mode` would, with `source: schedule`, and is emitted as an event. Returns how many.
    @discardableResult
    public func runDueScheduleSteps() -> Int {
        let now = monotonic()
        var applied = 0
        for (scope, steps) in schedules.takeDue(at: now) {
            // Several steps due at once (the loop was late): the last one is the mode now, each is still an event.
            for step in steps {
                applyScheduled(step.mode, scope: scope)
                applied += 1
            }
        }
        return applied
    }

    func applyScheduled(_ mode: DataMode, scope: String?) {
        let since = now()
        if let scope {
            guard let updated = runtime.update({ state -> SessionScope? in
                guard var session = state.sessions[scope] else { return nil }
                if session.mode != mode || session.modeSource != .schedule { session.since = since }
                session.mode = mode
                session.modeSource = .schedule
                state.sessions[scope] = session
                return session
            }) else {
                _ = schedules.cancel(scope: scope)
                return
            }
            events.emit(.mode, scope: scope, data: EventHub.modeData(scope: scope, mode: SessionsEndpoint.modeDocument(updated)))
        } else {
            let snapshot = runtime.update { state -> RuntimeSnapshot in
                if state.mode != mode || state.modeSource != .schedule { state.modeSince = since }
                state.mode = mode
                state.modeSource = .schedule
                return state
            }
            emitGlobalMode(snapshot)
        }
        logger.info("schedule step applied", metadata: ["scope": "\(scope ?? "global")", "mode": "\(mode)"])
    }
}

/// `GET`, `PUT`, `DELETE /schedule` (SPEC §12). `?session=S` names a session's timeline for `GET` and `DELETE`;
/// a `PUT` names it in its body.
struct ScheduleEndpoint {
    let api: AdminAPI
    static let maximumSteps = 1000

    func handle(_ request: AdminRequest) -> AdminResponse {
        switch request.method {
        case "GET", "HEAD":
            return AdminJSON.ok(["schedules": api.schedules.all.map(document)] as [String: Any])
        case "PUT": return put(request)
        case "DELETE":
            let scope = Self.sessionQuery(request.query)
            guard api.schedules.schedule(scope: scope) != nil else {
                return AdminProblem.response(404, "not-found", "no schedule for \(scope.map { "session " + $0 } ?? "the global mode")")
            }
            if let shared = api.store.shared {
                // SPEC §19: cancelled for the whole fleet, or not at all.
                do {
                    try shared.shareSchedule(SharedSchedule.field(scope), nil)
                } catch {
                    return api.stateWriteFailure(error)
                }
                api.sharedScopes.setSchedule(SharedSchedule.field(scope), nil)
            }
            api.schedules.cancel(scope: scope)
            return AdminResponse(status: 204)
        default: return AdminAPI.methodNotAllowed(request)
        }
    }

    static func sessionQuery(_ query: String?) -> String? {
        for pair in (query ?? "").split(separator: "&") {
            let parts = pair.split(separator: "=", maxSplits: 1)
            if parts.count == 2, parts[0] == "session" { return String(parts[1]).removingPercentEncoding }
        }
        return nil
    }

    private func put(_ request: AdminRequest) -> AdminResponse {
        let object: [String: Any]
        switch AdminJSON.object(request.body) {
        case .success(let o): object = o
        case .failure(let failure): return failure.response
        }
        let parsed: ParsedSchedule
        switch Self.parse(object, sessions: api.runtime.load().snapshot.sessions) {
        case .success(let p): parsed = p
        case .failure(let failure): return failure.response
        }
        let schedule = ModeSchedule(scope: parsed.scope, steps: parsed.steps, repeats: parsed.repeats, start: api.monotonic())
        if let shared = api.store.shared {
            // SPEC §19: in Redis first, with the wall-clock time its first `after` counts from, so that every proxy
            // runs the same timeline from the same start; nowhere if Redis cannot take it.
            let value = SharedSchedule.encode(schedule, startMilliseconds: api.wallMilliseconds())
            do {
                try shared.shareSchedule(SharedSchedule.field(parsed.scope), value)
            } catch {
                return api.stateWriteFailure(error)
            }
            api.sharedSeen["schedule:" + SharedSchedule.field(parsed.scope)] = .some(value)
            api.sharedScopes.setSchedule(SharedSchedule.field(parsed.scope), value)
        }
        api.schedules.set(schedule)
        api.logger.info("schedule set", metadata: ["scope": "\(parsed.scope ?? "global")", "steps": "\(parsed.steps.count)"])
        return AdminJSON.ok(document(schedule))
    }

    /// A schedule as `PUT /schedule` gives it: its scope (nil: global), steps and whether it repeats.
    struct ParsedSchedule {
        var scope: String?
        var steps: [ModeSchedule.Step]
        var repeats: Bool
    }

    /// Parses and checks a `PUT /schedule` body (or a schedule read from the shared store, whose `extraKeys` are
    /// the caller's); a session scope must be one of `sessions`.
    static func parse(_ object: [String: Any], sessions: [String: SessionScope],
                      extraKeys: Set<String> = []) -> Result<ParsedSchedule, AdminFailure> {
        if let key = Set(object.keys).subtracting(["steps", "repeat", "session"]).subtracting(extraKeys).sorted().first {
            return .failure(AdminFailure(400, "bad-request", "unknown key \"\(key)\"; use {\"steps\": [...], \"repeat\": BOOL, \"session\": ID}"))
        }
        var scope: String?
        if let value = object["session"], !(value is NSNull) {
            guard let id = value as? String else { return .failure(AdminFailure(400, "bad-request", "\"session\" must be a session id or null")) }
            guard sessions[id] != nil else {
                return .failure(AdminFailure(400, "unknown-session", "no session \(id); create it with PUT /sessions/\(id)"))
            }
            scope = id
        }
        var repeats = false
        if let value = object["repeat"] {
            guard let flag = AdminJSON.bool(value) else { return .failure(AdminFailure(400, "bad-request", "\"repeat\" must be true or false")) }
            repeats = flag
        }
        guard let list = object["steps"] as? [Any], !list.isEmpty, list.count <= Self.maximumSteps else {
            return .failure(AdminFailure(400, "bad-request", "\"steps\" must be a list of 1 to \(Self.maximumSteps) steps {\"after\": \"30s\", \"mode\": NAME}"))
        }
        var steps: [ModeSchedule.Step] = []
        for (index, item) in list.enumerated() {
            guard let step = item as? [String: Any] else {
                return .failure(AdminFailure(400, "bad-request", "steps[\(index)] must be an object {\"after\": \"30s\", \"mode\": NAME}"))
            }
            guard let text = step["after"] as? String, let after = Self.duration(text) else {
                return .failure(AdminFailure(400, "bad-request", "steps[\(index)].after must be a duration such as \"30s\" or \"500ms\" (0 to 24h)"))
            }
            switch ModeEndpoint.parseMode(step, extraKeys: ["after"]) {
            case .success(let mode): steps.append(ModeSchedule.Step(after: after, mode: mode))
            case .failure(let failure):
                return .failure(AdminFailure(failure.status, failure.code, "steps[\(index)]: " + failure.detail))
            }
        }
        if repeats && steps.allSatisfy({ $0.after == .zero }) {
            return .failure(AdminFailure(400, "bad-request", "a repeated schedule needs at least one step with a positive \"after\""))
        }
        return .success(ParsedSchedule(scope: scope, steps: steps, repeats: repeats))
    }

    static func duration(_ text: String) -> Duration? {
        let trimmed = text.trimmingCharacters(in: .whitespaces)
        if let digits = trimmed.firstIndex(where: { !$0.isNumber }).map({ trimmed[..<$0] }) ?? Optional(Substring(trimmed)),
           !digits.isEmpty, digits.allSatisfy({ $0 == "0" }) {
            let unit = trimmed.dropFirst(digits.count)
            if ["", "s", "ms", "m", "h"].contains(String(unit)) { return .zero }
        }
        return DurationText.parse(trimmed)
    }

    func document(_ schedule: ModeSchedule) -> [String: Any] {
        var json: [String: Any] = [
            "session": schedule.scope ?? NSNull(),
            "repeat": schedule.repeats,
            "steps": schedule.steps.map { step -> [String: Any] in
                let ms = ModeSchedule.nanoseconds(step.after) / 1_000_000
                return ["after": "\(ms)ms", "mode": step.mode.name]
            },
            "next": schedule.next,
        ]
        if let due = schedule.nextDue {
            let now = api.monotonic()
            let wall = api.wallMilliseconds() * 1_000_000 + Int64(due >= now ? due - now : 0)
            json["nextAt"] = Timestamp.rfc3339(wallNanoseconds: wall)
        }
        return json
    }
}
