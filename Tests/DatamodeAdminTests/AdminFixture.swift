import DatamodeAdmin
import DatamodeConfig
import DatamodePolicy
import DatamodeState
import Foundation
import Logging
import Synchronization
import Testing

/// The admin API over a runtime and a state store in a temporary directory: no listener, no worker, no socket.
/// A request is a value in and a response a value out (Envoy's `test/server/admin/*_handler_test.cc`).
final class AdminFixture: Sendable {
    let directory: String
    let runtime: RuntimeState
    let store: StateStore
    let api: AdminAPI
    /// What `GET /metrics` reads as the workers' counters, and as the reload counts.
    let metrics: Shared<MetricsSnapshot>
    let reloads: Shared<ReloadCounts>
    /// The wall clock of the endpoints, in seconds; moves only when told.
    let clock: Shared<Int64>
    /// The monotonic clock of sessions and schedules, in nanoseconds; moves only when told.
    let monotonic: Shared<UInt64>
    /// What the workers' session counters read as.
    let tallies: Shared<[String: SessionTally]>
    /// Every event emitted, as framed bytes with its scope.
    let emitted: Shared<[(scope: String?, text: String)]>
    /// What the workers' refusal rings read as (newest first).
    let refusals = Shared<[Refusal]>([])
    /// When the fixture's clock starts, and the mode's `since` at start-up: 2026-01-01T00:00:00Z.
    static let start: Int64 = 1_767_225_600

    /// `yaml` as the config file (relative variant files against the fixture's directory), the mode resolved as at
    /// start-up without an API mode.
    init(_ yaml: String = "", token: String? = nil, readToken: String? = nil, caCertificate: String? = nil) throws {
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("datamode-admin-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: directory + "/variants", withIntermediateDirectories: true)
        var configuration = try ProxyConfiguration.parse(yaml: yaml, source: "test.yaml", baseDirectory: directory)
        configuration.stateDirectory = directory + "/state"
        let snapshot = try ConfigurationSnapshot(configuration: configuration)
        let resolution = ModeResolution(api: nil, configuration: configuration)
        runtime = RuntimeState(RuntimeSnapshot(configuration: configuration, policy: snapshot.policy,
                                               mode: resolution.mode, modeSource: resolution.source,
                                               modeSince: Self.start))
        store = try StateStore(directory: configuration.stateDirectory)
        let (metrics, reloads, clock) = (Shared(MetricsSnapshot()), Shared(ReloadCounts()), Shared(Self.start))
        (self.metrics, self.reloads, self.clock) = (metrics, reloads, clock)
        let (monotonic, tallies) = (Shared<UInt64>(1_000_000_000), Shared<[String: SessionTally]>([:]))
        (self.monotonic, self.tallies) = (monotonic, tallies)
        let emitted = Shared<[(scope: String?, text: String)]>([])
        self.emitted = emitted
        let refusals = self.refusals
        api = AdminAPI(runtime: runtime, store: store, token: token, readToken: readToken,
                       logger: Logger(label: "admin-test") { _ in SwiftLogNoOpLogHandler() },
                       metrics: { metrics.value }, reloads: { reloads.value }, sessionTallies: { tallies.value },
                       now: { clock.value }, monotonic: { monotonic.value }, caCertificate: { caCertificate },
                       refusals: { refusals.value })
        api.events.connect { scope, bytes in emitted.value.append((scope, String(decoding: bytes, as: UTF8.self))) }
        api.wallMilliseconds = { clock.value * 1000 }
    }

    deinit { try? FileManager.default.removeItem(atPath: directory) }

    /// Moves the monotonic clock on by `milliseconds`.
    func elapse(milliseconds: UInt64) { monotonic.value += milliseconds * 1_000_000 }

    var now: Int64 { clock.value }
    func advance(_ seconds: Int64) { clock.value += seconds }

    var snapshot: RuntimeSnapshot { runtime.load().snapshot }

    func handle(_ method: String, _ path: String, _ body: String = "", headers: [String: String] = [:]) -> AdminResponse {
        // As the transport gives it: the query apart from the path.
        let parts = path.split(separator: "?", maxSplits: 1).map(String.init)
        return api.handle(AdminRequest(method: method, path: parts.first ?? path, query: parts.count > 1 ? parts[1] : nil,
                                       headers: headers, body: Array(body.utf8)))
    }
}

/// A value the test sets and the admin API reads.
final class Shared<Value: Sendable>: Sendable {
    private let storage: Mutex<Value>
    init(_ value: Value) { storage = Mutex(value) }
    var value: Value {
        get { storage.withLock { $0 } }
        set { storage.withLock { $0 = newValue } }
    }
}

extension AdminResponse {
    func header(_ name: String) -> String? {
        headers.first { $0.0.lowercased() == name.lowercased() }?.1
    }

    var text: String { String(decoding: body, as: UTF8.self) }

    var json: Any? { try? JSONSerialization.jsonObject(with: Data(body)) }

    var object: [String: Any] { json as? [String: Any] ?? [:] }

    /// The `error` code of a problem document.
    var errorCode: String? { object["error"] as? String }
}

/// A problem+json answer (RFC 9457) with the admin API's members.
func expectProblem(_ response: AdminResponse, _ status: Int, _ code: String, sourceLocation: SourceLocation = #_sourceLocation) {
    #expect(response.status == status, "\(response.text)", sourceLocation: sourceLocation)
    #expect(response.header("Content-Type") == "application/problem+json", sourceLocation: sourceLocation)
    #expect(response.errorCode == code, "\(response.text)", sourceLocation: sourceLocation)
    #expect(response.object["status"] as? Int == status, sourceLocation: sourceLocation)
    #expect(response.object["type"] as? String == "urn:datamode:admin:\(code)", sourceLocation: sourceLocation)
    #expect(response.object["detail"] is String, sourceLocation: sourceLocation)
}
