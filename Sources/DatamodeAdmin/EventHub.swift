import DatamodeState
import Foundation
import Synchronization

/// The source of the admin event stream (SPEC §12 `GET /events`): numbers events and frames them as
/// `text/event-stream` (WHATWG HTML §9.2), then hands the bytes to the transport, which appends them to every open
/// stream whose filter takes their scope. Events come only from the control plane (an admin request, a reload, a
/// schedule step), never from a worker: a thousand subscribers cost the request path nothing.
public final class EventHub: Sendable {
    /// The event types of SPEC §12. `conditions` and `budget` are emitted by the link-conditions and budget code.
    public enum EventType: String, Sendable {
        case mode, conditions, budget, variants, reload, deferred
    }

    private let lastID = Atomic<UInt64>(0)
    private let sink = Mutex<(@Sendable (_ scope: String?, _ bytes: [UInt8]) -> Void)?>(nil)

    public init() {}

    /// Where framed events go (the admin transport, on the control loop). Until set, events are only numbered.
    public func connect(_ sink: @escaping @Sendable (_ scope: String?, _ bytes: [UInt8]) -> Void) {
        self.sink.withLock { $0 = sink }
    }

    /// Emits an event of `type` for `scope` (`global` or a session id) with `data` as its one JSON line. Any thread.
    public func emit(_ type: EventType, scope: String, data: [String: Any]) {
        let bytes = frame(type, data: data)
        let deliver = sink.withLock { $0 }
        deliver?(scope, bytes)
    }

    /// A comment line that keeps idle connections (and proxies between) from timing out (§9.2.6).
    public static let heartbeat = Array(": heartbeat\n\n".utf8)

    /// `event:`, `id:` and one `data:` line (JSON never contains a raw newline), then the blank line that ends it.
    public func frame(_ type: EventType, data: [String: Any]) -> [UInt8] {
        let id = lastID.add(1, ordering: .relaxed).newValue
        var json = AdminJSON.encode(data)
        if json.last == 0x0a { json.removeLast() }
        return Array("event: \(type.rawValue)\nid: \(id)\ndata: ".utf8) + json + Array("\n\n".utf8)
    }

    /// The `mode` event's data: the `GET /mode` document with its scope.
    static func modeData(scope: String, mode: DataModeDocument) -> [String: Any] {
        var data = mode.json
        data["scope"] = scope
        return data
    }
}

/// The members of a mode document (`GET /mode`, a session, a `mode` event).
struct DataModeDocument {
    var json: [String: Any]
}

/// `GET /events` (SPEC §12): the current mode first, then every event as it happens, and a heartbeat comment.
/// `?session=S` follows one session's scope only.
struct EventsEndpoint {
    let api: AdminAPI

    func handle(_ request: AdminRequest) -> AdminResponse {
        var scope: String?
        for pair in (request.query ?? "").split(separator: "&") {
            let parts = pair.split(separator: "=", maxSplits: 1)
            let key = parts.first.map(String.init)?.removingPercentEncoding ?? ""
            let value = parts.count > 1 ? String(parts[1]).replacingOccurrences(of: "+", with: " ").removingPercentEncoding ?? "" : ""
            switch key {
            case "session": scope = value
            default: return AdminProblem.response(400, "bad-request", "unknown query parameter \"\(key)\"; use ?session=ID")
            }
        }
        let snapshot = api.runtime.load().snapshot
        let current: [String: Any]
        if let scope, scope != "global" {
            guard let session = snapshot.sessions[scope] else {
                return AdminProblem.response(400, "unknown-session", "no session \(scope); create it with PUT /sessions/\(scope)")
            }
            current = EventHub.modeData(scope: scope, mode: SessionsEndpoint.modeDocument(session))
        } else {
            current = EventHub.modeData(scope: "global", mode: DataModeDocument(json: ModeEndpoint.document(snapshot)))
        }
        return AdminResponse(status: 200, headers: [("Content-Type", "text/event-stream"), ("Cache-Control", "no-store"),
                                                     ("X-Accel-Buffering", "no")],
                             body: api.events.frame(.mode, data: current), stream: AdminStream(scope: scope))
    }
}
