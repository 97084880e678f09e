import DatamodeAdmin
import DatamodeConfig
import DatamodeEngine
import DatamodeInstance
import DatamodePolicy
import DatamodeState
import Foundation
import Logging
import Synchronization
import Testing

/// A wall clock that moves only when told (seconds since the epoch).
final class TestClock: EngineClock {
    private let seconds = Atomic<Int64>(1_000_000)
    func nowNanoseconds() -> UInt64 { UInt64(seconds.load(ordering: .relaxed)) * 1_000_000_000 }
    func wallNanoseconds() -> Int64 { seconds.load(ordering: .relaxed) * 1_000_000_000 }
    var now: Int64 { seconds.load(ordering: .relaxed) }
    func advance(_ by: Int64) { seconds.add(by, ordering: .relaxed) }
}

/// A process built in a fresh state directory, never started: no socket, no thread.
struct Fixture {
    let directory: String
    let clock = TestClock()

    init() throws {
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("datamode-instance-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
    }

    var stateDirectory: String { directory + "/state" }

    /// `yaml` parsed as the file, with `DATAMODE_MODE` = `flagMode` when given, in this fixture's state directory.
    func configuration(_ yaml: String, flagMode: String? = nil) throws(ConfigError) -> ProxyConfiguration {
        var file = try ProxyConfiguration.parse(yaml: yaml, source: "test.yaml", baseDirectory: directory)
        file.stateDirectory = stateDirectory
        return try file.applying(ConfigOverrides(mode: flagMode))
    }

    func instance(_ yaml: String = "", flagMode: String? = nil) throws -> ProxyInstance {
        try ProxyInstance(configuration: try configuration(yaml, flagMode: flagMode),
                          logger: Logger(label: "test") { _ in SwiftLogNoOpLogHandler() }, clock: clock)
    }

    func remove() { try? FileManager.default.removeItem(atPath: directory) }
}

extension ProxyInstance {
    func admin(_ method: String, _ path: String, _ body: String = "") -> AdminResponse {
        adminAPI.handle(AdminRequest(method: method, path: path, body: Array(body.utf8)))
    }

    func modeDocument() throws -> [String: Any] {
        let response = admin("GET", "/mode")
        return try #require(try JSONSerialization.jsonObject(with: Data(response.body)) as? [String: Any])
    }
}

@Suite("ProxyInstance: start-up")
struct ProxyInstanceStartupTests {
    @Test("the mode at start-up: the persisted API mode, else the flag, else the file, else normal", arguments: [
        // (file mode, flag mode, persisted API mode) -> (mode, source)
        (nil, nil, nil, "normal", "default"),
        ("constrained", nil, nil, "constrained", "config"),
        ("constrained", "cellular", nil, "expensive", "flag"),
        ("constrained", "cellular", "normal", "normal", "api"),
    ] as [(String?, String?, String?, String, String)])
    func startupMode(_ fileMode: String?, _ flagMode: String?, _ apiMode: String?, _ mode: String, _ source: String) throws {
        let fixture = try Fixture()
        defer { fixture.remove() }
        if let apiMode {
            try StateStore(directory: fixture.stateDirectory).saveMode(try #require(DataMode(name: apiMode)), since: 42)
        }
        let instance = try fixture.instance(fileMode.map { "mode: \($0)\n" } ?? "", flagMode: flagMode)
        let snapshot = instance.runtime.load().snapshot
        #expect(snapshot.mode.name == mode)
        #expect(snapshot.modeSource.rawValue == source)
        // `since` of a persisted mode is when it was set, not when the process started.
        #expect(snapshot.modeSince == (apiMode == nil ? fixture.clock.now : 42))
    }

    @Test("persisted API variants are compiled with the file's")
    func apiVariantsAtStartup() throws {
        let fixture = try Fixture()
        defer { fixture.remove() }
        let api = Variant(id: "api-one", match: "http://a.example/*", resource: .target("http://b.example/$1", redirect: false),
                          source: .api)
        try StateStore(directory: fixture.stateDirectory).saveVariants([api])
        let instance = try fixture.instance("""
            variants:
              - {id: cfg-one, match: "http://c.example/*", target: "http://d.example/$1"}
            """)
        let variants = instance.runtime.load().snapshot.policy.variants
        #expect(variants.map(\.id) == ["cfg-one", "api-one"])
        #expect(variants.map(\.source) == [.config, .api])
    }

    @Test("unreadable state stops start-up, naming the file")
    func unreadableState() throws {
        let fixture = try Fixture()
        defer { fixture.remove() }
        try FileManager.default.createDirectory(atPath: fixture.stateDirectory, withIntermediateDirectories: true)
        try "{not json".write(toFile: fixture.stateDirectory + "/mode.json", atomically: true, encoding: .utf8)
        do {
            _ = try fixture.instance()
            Issue.record("started with a corrupt mode.json")
        } catch {
            guard case ProxyInstance.StartupError.state = error else { Issue.record("not a state error: \(error)"); return }
            #expect("\(error)".hasPrefix("state: "))
            #expect("\(error)".contains("mode.json"))
        }
    }

    @Test("an API variant whose id the file now takes stops start-up, naming variants.json")
    func conflictingAPIVariant() throws {
        let fixture = try Fixture()
        defer { fixture.remove() }
        let api = Variant(id: "v", match: "http://a.example/*", resource: .target("http://b.example/$1", redirect: false),
                          source: .api)
        try StateStore(directory: fixture.stateDirectory).saveVariants([api])
        do {
            _ = try fixture.instance("""
                variants:
                  - {id: v, match: "http://c.example/*", target: "http://d.example/$1"}
                """)
            Issue.record("started with two variants \"v\"")
        } catch {
            guard case ProxyInstance.StartupError.state = error else { Issue.record("not a state error: \(error)"); return }
            #expect("\(error)".contains("variants.json"))
        }
    }

    @Test("the admin API off loopback without a token is a configuration error")
    func exposedAdmin() throws {
        let fixture = try Fixture()
        defer { fixture.remove() }
        #expect {
            _ = try fixture.instance("admin: {listen: 0.0.0.0:8878}\n")
        } throws: { error in
            guard case ProxyInstance.StartupError.configuration(let problem) = error else { return false }
            return problem.key == "admin.token"
        }
    }
}

@Suite("ProxyInstance: reload")
struct ProxyInstanceReloadTests {
    @Test("an applied reload swaps the configuration and makes one new generation")
    func applied() throws {
        let fixture = try Fixture()
        defer { fixture.remove() }
        let instance = try fixture.instance("mode: normal\n")
        let before = instance.runtime.generation
        let result = instance.reload(with: try fixture.configuration("""
            mode: constrained
            rules:
              - {name: videos, match: {path: "*.mp4"}, tags: {allow-constrained: false}}
            """))
        #expect(result == .applied(generation: before + 1))
        #expect(instance.runtime.generation == before + 1)
        let snapshot = instance.runtime.load().snapshot
        #expect(snapshot.policy.rules.map(\.name) == ["videos"])
        #expect(snapshot.mode.name == "constrained")
        #expect(snapshot.modeSource == .config)
        #expect(instance.reloadCounts == ReloadCounts(ok: 1, failed: 0))
    }

    @Test("a refused reload keeps the running configuration and generation, and is counted")
    func refused() throws {
        let fixture = try Fixture()
        defer { fixture.remove() }
        let instance = try fixture.instance("mode: constrained\n")
        let before = instance.runtime.generation
        let result = instance.reload { () throws(ConfigError) -> ProxyConfiguration in
            try fixture.configuration("mode: normal\ntimeouts:\n  client-header: soon\n")
        }
        guard case .refused(let reason) = result else { Issue.record("applied: \(result)"); return }
        #expect(reason.contains("timeouts.client-header"), "\(reason)")
        #expect(reason.contains("test.yaml:3"), "\(reason)")
        #expect(instance.runtime.generation == before)
        #expect(instance.runtime.load().snapshot.mode.name == "constrained")
        #expect(instance.reloadCounts == ReloadCounts(ok: 0, failed: 1))
    }

    /// The issue's newcomer ran `ca init` and sent SIGHUP, because the message said `ca init` would help; it
    /// cannot (the CA is loaded at start-up), so the message says what does: a restart.
    @Test("turning tls.intercept on by a reload, after `ca init`, is refused with a message that says restart")
    func interceptionNeedsARestart() throws {
        let fixture = try Fixture()
        defer { fixture.remove() }
        let instance = try fixture.instance("mode: normal\n")
        let paths = try fixture.configuration("").caPaths
        _ = try CertificateAuthority.create(certificatePath: paths.certificate, keyPath: paths.key)
        let result = instance.reload { () throws(ConfigError) -> ProxyConfiguration in
            try fixture.configuration("tls: {intercept: [localhost]}\n")
        }
        guard case .refused(let reason) = result else { Issue.record("applied: \(result)"); return }
        #expect(reason.contains("restart the proxy"), "\(reason)")
        #expect(!reason.contains("ca init"), "\(reason)")
    }

    @Test("a file that takes an API variant's id is refused, and the API variant stays")
    func apiVariantConflict() throws {
        let fixture = try Fixture()
        defer { fixture.remove() }
        let instance = try fixture.instance()
        let put = instance.admin("PUT", "/variants/v", #"{"match": "http://a.example/*", "target": "http://b.example/$1"}"#)
        #expect(put.status == 201)
        let result = instance.reload(with: try fixture.configuration("""
            variants:
              - {id: v, match: "http://c.example/*", target: "http://d.example/$1"}
            """))
        guard case .refused = result else { Issue.record("applied: \(result)"); return }
        let variants = instance.runtime.load().snapshot.policy.variants
        #expect(variants.map(\.id) == ["v"])
        #expect(variants.map(\.source) == [.api])
    }

    @Test("a reload keeps the API mode; DELETE /mode then returns to the reloaded file's mode")
    func apiModeSurvivesReload() throws {
        let fixture = try Fixture()
        defer { fixture.remove() }
        let instance = try fixture.instance("mode: normal\n")
        #expect(instance.admin("PUT", "/mode", #"{"mode": "expensive"}"#).status == 200)
        let setAt = fixture.clock.now
        fixture.clock.advance(10)
        let result = instance.reload(with: try fixture.configuration("mode: constrained\n"))
        guard case .applied = result else { Issue.record("refused: \(result)"); return }
        var mode = try instance.modeDocument()
        #expect(mode["mode"] as? String == "expensive")
        #expect(mode["source"] as? String == "api")
        #expect(instance.runtime.load().snapshot.modeSince == setAt)

        #expect(instance.admin("DELETE", "/mode").status == 200)
        mode = try instance.modeDocument()
        #expect(mode["mode"] as? String == "constrained")
        #expect(mode["source"] as? String == "config")
        #expect(instance.runtime.load().snapshot.modeSince == fixture.clock.now)
    }

    @Test("since moves on a reload only when the file's mode changes")
    func sinceOnReload() throws {
        let fixture = try Fixture()
        defer { fixture.remove() }
        let instance = try fixture.instance("mode: normal\n")
        let started = fixture.clock.now
        fixture.clock.advance(5)
        instance.reload(with: try fixture.configuration("mode: normal\nthreads: 1\n"))
        #expect(instance.runtime.load().snapshot.modeSince == started)
        fixture.clock.advance(5)
        instance.reload(with: try fixture.configuration("mode: constrained\n"))
        #expect(instance.runtime.load().snapshot.modeSince == fixture.clock.now)
    }

    @Test("/metrics counts reloads by result")
    func metricsCountReloads() throws {
        let fixture = try Fixture()
        defer { fixture.remove() }
        let instance = try fixture.instance()
        instance.reload(with: try fixture.configuration("mode: constrained\n"))
        instance.reload(with: try fixture.configuration("mode: expensive\n"))
        instance.reload { () throws(ConfigError) -> ProxyConfiguration in try fixture.configuration("bogus-key: 1\n") }
        let text = String(decoding: instance.admin("GET", "/metrics").body, as: UTF8.self)
        #expect(text.contains("# TYPE datamode_reloads_total counter\n"))
        #expect(text.contains("datamode_reloads_total{result=\"ok\"} 2\n"), "\(text)")
        #expect(text.contains("datamode_reloads_total{result=\"failed\"} 1\n"), "\(text)")
    }
}

/// The local CA at start-up and on reload (SPEC §9).
@Suite("ProxyInstance: CA")
struct ProxyInstanceCATests {
    @Test("no tls.intercept and no CA: none is made; with tls.intercept: made once, then loaded")
    func createdOnlyForInterception() throws {
        let fixture = try Fixture()
        defer { fixture.remove() }
        let plain = try fixture.instance()
        #expect(plain.certificateAuthority == nil)
        #expect(!FileManager.default.fileExists(atPath: fixture.stateDirectory + "/ca.pem"))
        let first = try fixture.instance("tls: {intercept: [\"*\"]}")
        #expect(first.createdCertificateAuthority)
        let second = try fixture.instance("tls: {intercept: [\"*\"]}")
        #expect(!second.createdCertificateAuthority)
        #expect(second.certificateAuthority?.fingerprint == first.certificateAuthority?.fingerprint)
        // An existing CA is loaded even without interception, so that a reload can turn it on.
        let later = try fixture.instance()
        #expect(later.certificateAuthority?.fingerprint == first.certificateAuthority?.fingerprint)
        let reloaded = later.reload(with: try fixture.configuration("tls: {intercept: [cdn.example]}"))
        guard case .applied = reloaded else {
            Issue.record("refused: \(reloaded)")
            return
        }
        #expect(later.runtime.load().snapshot.configuration.tls.intercepts(host: "cdn.example"))
    }

    @Test("a reload that turns interception on without a loaded CA is refused and counted")
    func reloadWithoutCA() throws {
        let fixture = try Fixture()
        defer { fixture.remove() }
        let instance = try fixture.instance()
        let result = instance.reload(with: try fixture.configuration("tls: {intercept: [\"*\"]}"))
        guard case .refused(let reason) = result else {
            Issue.record("applied: \(result)")
            return
        }
        #expect(reason.contains("restart"))
        #expect(instance.reloadCounts == ReloadCounts(ok: 0, failed: 1))
        #expect(instance.runtime.load().snapshot.configuration.tls.intercept.isEmpty)
    }

    @Test("a CA key readable by others stops start-up with an error naming it")
    func unsafeKey() throws {
        let fixture = try Fixture()
        defer { fixture.remove() }
        _ = try fixture.instance("tls: {intercept: [\"*\"]}")
        chmod(fixture.stateDirectory + "/ca-key.pem", 0o644)
        #expect {
            _ = try fixture.instance()
        } throws: { error in
            "\(error)".contains("ca-key.pem: the CA key is readable by group or others")
        }
    }
}
