import DatamodeConfig
import DatamodeHTTP
import DatamodePolicy
import DatamodeState
import Synchronization

/// A request's session as the exchange carries it from its head to its log line.
///
/// A class, immutable: the admission and the exchange hand it over, nearly always nil, and as an optional struct it
/// was copied through its generic value witness at each hand-over, nil or not (~150 instructions each, two a plain
/// exchange, callgrind); a reference costs a retain.
final class SessionMembership: Equatable {
    let id: String
    let slot: Int
    let serial: UInt64
    /// The session's link profile (SPEC §10): the shaping, when it exists, takes it before the conditions' mapping.
    let profile: String?

    init(id: String, slot: Int, serial: UInt64, profile: String?) {
        self.id = id
        self.slot = slot
        self.serial = serial
        self.profile = profile
    }

    static func == (a: SessionMembership, b: SessionMembership) -> Bool {
        a.id == b.id && a.slot == b.slot && a.serial == b.serial && a.profile == b.profile
    }
}

/// One worker's session counters. Written only by the worker's thread, without a lock, on the request path;
/// the control plane reads them by message (`Worker.Command.reportSessions`): the worker copies them into its
/// mailbox between two events, so a reader never sees a half-updated tally and the request path never waits.
///
/// A request costs an array index (the session's slot) and a few increments (the outcome × reason table is
/// indexed as `WorkerMetrics`' is); dictionaries are built only when the counters are read. With 1,000 live
/// sessions taking turns (the sessions row of bench/run) nothing here hashes a string but a variant's id.
final class WorkerSessionTallies {
    final class Live {
        let id: String
        let serial: UInt64
        var requests: [Int]
        var bytesIn = 0
        var bytesOut = 0
        var variants: [String: Int] = [:]
        /// A ring of the last `SessionTally.rejectedLimit` rejections; `next` is the oldest once full.
        var rejected: [SessionTally.Rejected] = []
        var next = 0
        var lastSeen: UInt64 = 0
        init(id: String, serial: UInt64) {
            self.id = id
            self.serial = serial
            requests = Array(repeating: 0, count: WorkerMetrics.outcomes.count * WorkerMetrics.reasons.count)
        }

        var tally: SessionTally {
            var out = SessionTally(serial: serial)
            let reasons = WorkerMetrics.reasons
            for (index, count) in requests.enumerated() where count > 0 {
                out.requests[WorkerMetrics.outcomes[index / reasons.count], default: [:]][reasons[index % reasons.count]] = count
            }
            out.bytesIn = bytesIn
            out.bytesOut = bytesOut
            out.variants = variants
            out.rejected = rejected.count < SessionTally.rejectedLimit ? rejected : Array(rejected[next...] + rejected[..<next])
            out.lastSeen = lastSeen
            return out
        }
    }

    /// By `SessionScope.slot`.
    private var slots: [Live?] = []

    /// The counters as values, by session id, for a report.
    var tallies: [String: SessionTally] {
        var out: [String: SessionTally] = [:]
        for case let live? in slots { out[live.id] = live.tally }
        return out
    }

    /// Counts one finished request of `session`. `outcomeReason`: the index `WorkerMetrics.count` counted it
    /// under. `rejected`: the URL and when, for a rejection.
    func record(_ session: SessionMembership, outcomeReason: Int, bytesIn: UInt64, bytesOut: UInt64, variant: String?,
                rejected: (url: String, error: String, wallTime: Int64)?, now: UInt64) {
        if session.slot >= slots.count {
            slots.append(contentsOf: repeatElement(nil, count: session.slot + 1 - slots.count))
        }
        let tally: Live
        if let live = slots[session.slot], live.serial >= session.serial {
            // A newer session took the slot while this request was in flight: the one it belonged to is gone.
            guard live.serial == session.serial else { return }
            tally = live
        } else {
            tally = Live(id: session.id, serial: session.serial)
            slots[session.slot] = tally
        }
        tally.requests[outcomeReason] += 1
        tally.bytesIn += Int(bytesIn)
        tally.bytesOut += Int(bytesOut)
        if let variant { tally.variants[variant, default: 0] += 1 }
        if let rejected {
            let entry = SessionTally.Rejected(url: rejected.url, error: rejected.error, time: rejected.wallTime)
            if tally.rejected.count < SessionTally.rejectedLimit {
                tally.rejected.append(entry)
            } else {
                tally.rejected[tally.next] = entry
                tally.next = (tally.next + 1) % SessionTally.rejectedLimit
            }
        }
        tally.lastSeen = max(tally.lastSeen, now)
    }

    /// Forgets the counters of sessions that no longer exist (or exist anew), after a new snapshot.
    func prune(keeping sessions: [String: SessionScope]) {
        for index in slots.indices {
            guard let live = slots[index] else { continue }
            if sessions[live.id]?.serial != live.serial { slots[index] = nil }
        }
    }
}

/// The sessions part of `WorkerSettings`: what the request path needs to put a request in a session.
struct SessionSettings {
    var enabled: Bool
    var clients: [CIDR]
    var fromProxyUser: Bool
    var table: [String: SessionScope]

    init(_ snapshot: RuntimeSnapshot) {
        let section = snapshot.configuration.sessions
        enabled = section.enabled
        clients = section.clients
        fromProxyUser = section.fromProxyUser
        table = snapshot.sessions
    }

    /// Which session a request belongs to (SPEC §12), or why it is refused.
    enum Membership: Equatable {
        /// No session: the global mode applies.
        case none
        case session(SessionMembership, mode: DataMode)
        /// `400` with this code and detail.
        case refused(ProxyErrorCode, String)
    }

    /// `fields`: the request's header fields (their `Data-Mode-Session` copies are read in place, not
    /// collected); `proxyUser`: the user it authenticated as.
    func membership(fields: [HTTPField], proxyUser: String?, client: IPAddress?) -> Membership {
        guard enabled else { return .none }
        guard let client, clients.contains(where: { $0.contains(client) }) else { return .none }
        var named: String?
        for field in fields where field.name.utf8.count == 17 && KnownField.of(field.name) == .dataModeSession {
            let value = field.value
            guard !value.isEmpty else { return .refused(.badRequest, "an empty Data-Mode-Session header") }
            if let named, named != value {
                return .refused(.badRequest, "two different Data-Mode-Session headers (\(named), \(value))")
            }
            named = value
        }
        if fromProxyUser, let proxyUser {
            if let named, named != proxyUser {
                return .refused(.badRequest, "Data-Mode-Session \(named) differs from the proxy user \(proxyUser), "
                    + "which names the session (sessions.from-proxy-user)")
            }
            // A proxy user without a session is judged by the global mode: not every user is a test rig.
            guard let scope = table[proxyUser] else { return .none }
            return Self.member(proxyUser, scope)
        }
        guard let named else { return .none }
        guard let scope = table[named] else {
            return .refused(.unknownSession, "no session \(named); create it with PUT /sessions/\(named) on the admin API")
        }
        return Self.member(named, scope)
    }

    static func member(_ id: String, _ scope: SessionScope) -> Membership {
        .session(SessionMembership(id: id, slot: scope.slot, serial: scope.serial, profile: scope.profile), mode: scope.mode)
    }
}

/// A single-slot reply box for a message to a worker: the control plane clears it, sends the command, and waits
/// for the worker to fill it.
final class WorkerMailbox<Value: Sendable>: Sendable {
    private let slot = Mutex<Value?>(nil)
    func clear() { slot.withLock { $0 = nil } }
    func put(_ value: Value) { slot.withLock { $0 = value } }
    func take() -> Value? { slot.withLock { value in defer { value = nil }; return value } }
}
