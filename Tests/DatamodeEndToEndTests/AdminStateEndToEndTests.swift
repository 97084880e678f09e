// End-to-end tests of the admin plane's persistent state (SPEC §7): the API mode and API variants survive a
// restart, a SIGKILL at any moment leaves whole state that the next start accepts, and a state file that
// cannot be read stops start-up with an error naming it.
import DatamodeTestSupport
import Foundation
import Synchronization
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// What a state directory holds, read strictly: nil members = file absent. Throws when a file is present but
/// is not the whole JSON document the proxy writes (a torn or empty write).
struct PersistedState: Equatable, CustomStringConvertible {
    var mode: String?
    var variantIDs: [String]

    struct Torn: Error, CustomStringConvertible {
        var description: String
    }

    init(mode: String?, variantIDs: [String]) {
        self.mode = mode
        self.variantIDs = variantIDs
    }

    init(directory: String) throws {
        func object(_ name: String) throws -> [String: Any]? {
            let path = directory + "/" + name
            guard FileManager.default.fileExists(atPath: path) else { return nil }
            guard let data = FileManager.default.contents(atPath: path) else { throw Torn(description: "\(name) unreadable") }
            guard let object = (try? JSONSerialization.jsonObject(with: data)) as? [String: Any] else {
                throw Torn(description: "\(name) is not a JSON object (\(data.count) bytes): \(String(decoding: data.prefix(200), as: UTF8.self).debugDescription)")
            }
            return object
        }
        if let modeObject = try object("mode.json") {
            guard let name = modeObject["mode"] as? String else { throw Torn(description: "mode.json without mode: \(modeObject)") }
            mode = name
        } else {
            mode = nil
        }
        if let variantsObject = try object("variants.json") {
            guard let list = variantsObject["variants"] as? [[String: Any]] else {
                throw Torn(description: "variants.json without a variants list")
            }
            variantIDs = try list.map {
                guard let id = $0["id"] as? String, $0["match"] is String, $0["target"] is String else {
                    throw Torn(description: "variants.json holds an incomplete variant: \($0)")
                }
                return id
            }
        } else {
            variantIDs = []
        }
    }

    var description: String { "mode \(mode ?? "(none)"), \(variantIDs.count) variants \(variantIDs.suffix(4))" }
}

@Suite("AdminEndToEnd: state", .serialized)
struct AdminEndToEndStateTests {
    @Test("API mode and API variants persist across a restart on the same state dir; the API mode beats --mode there")
    func persistenceAcrossRestart() throws {
        let origin = try RecordingOrigin { request in .ok(request.target.hasSuffix("-small.jpg") ? "small" : "full") }
        defer { origin.stop() }
        let first = try ProxyProcess()
        defer {
            halt(first)
            try? FileManager.default.removeItem(atPath: first.directory)
        }
        let stateDir = first.stateDirectory
        let admin1 = AdminAPIClient(port: first.adminPort)
        let put = try admin1.put("/mode", #"{"mode": "constrained"}"#)
        #expect(put.status == 200)
        let since = try #require(put.object["since"] as? String)
        #expect(try admin1.putVariant("keep", ["match": origin.url("/img/*.jpg"), "target": origin.url("/img/$1-small.jpg"),
                                               "when": "constrained"]).status == 201)
        #expect(try admin1.putVariant("gone", ["match": "http://gone.example/*", "target": "http://gone.example/x/$1"]).status == 201)
        #expect(try admin1.delete("/variants/gone").status == 200)
        let listed = try #require(variant("keep", in: try admin1.get("/variants")))
        // A graceful restart: SIGTERM with nothing in flight exits 0 (within drain-timeout, 10 s).
        first.signal(SIGTERM)
        let status = first.waitForExit(timeout: 12)
        #expect(status == 0, "SIGTERM: exit status \(status.map(String.init) ?? "none, still running")")
        halt(first)

        let persisted = try PersistedState(directory: stateDir)
        #expect(persisted == PersistedState(mode: "constrained", variantIDs: ["keep"]), "on disk: \(persisted)")

        // A second process on the same state dir, with a flag that the API mode must beat.
        let second = try ProxyProcess(arguments: ["--state-dir", stateDir, "--mode", "expensive"])
        defer { halt(second) }
        let admin2 = AdminAPIClient(port: second.adminPort)
        let mode = try admin2.get("/mode")
        #expect(ModeFacts(mode) == ModeFacts("constrained", true, false, "api"), "after restart: \(mode.bodyText)")
        #expect(mode.object["since"] as? String == since, "since survives the restart: \(mode.bodyText) vs \(since)")
        let variants = try admin2.get("/variants")
        #expect(variants.array?.compactMap { $0["id"] as? String } == ["keep"], "\(variants.bodyText)")
        let restored = try #require(variant("keep", in: variants))
        #expect(NSDictionary(dictionary: restored).isEqual(to: listed), "\(restored) vs \(listed)")
        // The restored variant works.
        let client = try RawHTTPClient(port: second.port)
        defer { client.close() }
        let served = try proxied(client, origin.url("/img/hero.jpg"), headers: [("Allow-Constrained", "?0")])
        #expect(served.status == 200 && served.bodyText == "small" && served.value(of: "Data-Mode-Variant") == "keep",
                "\(served.status) \(served.bodyText)")

        // DELETE /mode is persisted too: the third start is back on its flag.
        #expect(ModeFacts(try admin2.delete("/mode")) == ModeFacts("expensive", false, true, "flag"))
        halt(second)
        let third = try ProxyProcess(arguments: ["--state-dir", stateDir, "--mode", "expensive"])
        defer { halt(third) }
        let admin3 = AdminAPIClient(port: third.adminPort)
        #expect(try modeFacts(admin3) == ModeFacts("expensive", false, true, "flag"))
        #expect(try admin3.get("/variants").array?.compactMap { $0["id"] as? String } == ["keep"])
    }

    @Test("SIGKILL at any moment while variants and the mode are being written: the state is whole and the next start accepts it")
    func crashSafety() throws {
        let root = FileManager.default.temporaryDirectory.appendingPathComponent("datamode-crash-\(UUID().uuidString.prefix(8))").path
        let stateDir = root + "/state"
        try FileManager.default.createDirectory(atPath: stateDir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: root) }

        var expected = PersistedState(mode: nil, variantIDs: [])
        var totalAcknowledged = 0
        var landedInFlight = 0
        let iterations = 20
        let started = ContinuousClock.now
        for iteration in 0..<iterations {
            let proxy = try ProxyProcess(arguments: ["--state-dir", stateDir, "--threads", "1"])
            defer { halt(proxy) }
            let admin = AdminAPIClient(port: proxy.adminPort, timeout: .seconds(3))
            // The new process serves exactly what the killed one left.
            let served = try admin.get("/variants").array?.compactMap { $0["id"] as? String } ?? []
            #expect(served == expected.variantIDs, "iteration \(iteration): served \(served.suffix(3)) vs on disk \(expected)")
            let mode = try admin.get("/mode")
            if let name = expected.mode {
                #expect(ModeFacts(mode)?.mode == name && ModeFacts(mode)?.source == "api", "iteration \(iteration): \(mode.bodyText)")
            } else {
                #expect(ModeFacts(mode)?.source == "default", "iteration \(iteration): \(mode.bodyText)")
            }

            let writer = StateWriter(admin: admin, start: expected, prefix: "c\(iteration)-")
            Thread.detachNewThread { writer.run() }
            AdminPolling.until(timeout: .seconds(5), interval: .milliseconds(1)) { writer.acknowledged >= 1 }
            // "Any moment": a different point of the write stream each time (0–59 ms after the first answer).
            usleep(UInt32((iteration * 7_919) % 60) * 1_000)
            proxy.signal(SIGKILL)
            #expect(proxy.waitForExit(timeout: 10) == SIGKILL)
            #expect(writer.waitUntilDone(timeout: .seconds(10)), "iteration \(iteration): the writer did not stop")

            let outcome = writer.outcome
            #expect(outcome.failures.isEmpty, "iteration \(iteration): \(outcome.failures)")
            #expect(outcome.acknowledged >= 1, "iteration \(iteration): no write was acknowledged before the kill")
            totalAcknowledged += outcome.acknowledged
            let onDisk: PersistedState
            do {
                onDisk = try PersistedState(directory: stateDir)
            } catch {
                Issue.record("iteration \(iteration): torn state after SIGKILL: \(error)")
                break
            }
            // Every acknowledged write is on disk; the one in flight may or may not be; nothing else is.
            let allowed = [outcome.model] + (outcome.inFlightApplied.map { [$0] } ?? [])
            #expect(allowed.contains(onDisk), "iteration \(iteration): on disk \(onDisk); acknowledged \(outcome.model); in flight \(outcome.inFlightApplied?.description ?? "none")")
            if onDisk != outcome.model { landedInFlight += 1 }
            expected = onDisk
        }
        // The state the last kill left starts a proxy.
        let last = try ProxyProcess(arguments: ["--state-dir", stateDir])
        defer { halt(last) }
        let finalIDs = try AdminAPIClient(port: last.adminPort).get("/variants").array?.compactMap { $0["id"] as? String }
        #expect(finalIDs == expected.variantIDs)
        let leftovers = (try? FileManager.default.contentsOfDirectory(atPath: stateDir))?.filter { $0.contains(".tmp") } ?? []
        print("crash-safety: \(iterations) SIGKILLs in \(ContinuousClock.now - started), \(totalAcknowledged) acknowledged writes, "
              + "\(landedInFlight) unacknowledged writes found on disk, \(leftovers.count) temporary files left in the state dir")
    }

    @Test("A state file that cannot be parsed stops start-up with an error naming it, and is left as it was",
          arguments: [
              ("variants.json", "garbage\u{1}{{{ not json"),
              ("variants.json", ""),
              ("variants.json", #"{"variants": [{"id": "a", "match": "http://a.example/*", "tar"#),
              ("variants.json", #"{"variants": [{"id": "a"}]}"#),
              ("variants.json", #"{"variants": [{"id": "a", "match": "http://a.example/*/*", "target": "http://b.example/$3"}]}"#),
              ("variants.json", #"["not", "an", "object"]"#),
              // Written by a version without variants-dir: a file outside it is refused, never served or dropped.
              ("variants.json", #"{"variants": [{"id": "old", "match": "http://a.example/x", "file": "/etc/passwd", "when": "always"}]}"#),
              ("mode.json", "garbage"),
              ("mode.json", #"{"mode": "warp-speed", "since": 0}"#),
              ("mode.json", "\u{0}\u{0}\u{0}\u{0}"),
          ])
    func corruptStateRefusesStart(file: String, contents: String) throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("datamode-corrupt-\(UUID().uuidString.prefix(8))").path
        try FileManager.default.createDirectory(atPath: directory + "/state", withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let path = directory + "/state/" + file
        try Data(contents.utf8).write(to: URL(fileURLWithPath: path))

        let proxy = try ProxyProcess(waitForReady: false, directory: directory)
        defer { halt(proxy) }
        let status = proxy.waitForExit(timeout: 15)
        #expect(status != nil, "started on a corrupt \(file)")
        #expect(status != 0)
        #expect(proxy.stderr.contains(path), "stderr does not name \(path): \(proxy.stderr)")
        #expect(!proxy.stderr.contains(" ready"), "it said ready: \(proxy.stderr)")
        #expect(FileManager.default.contents(atPath: path) == Data(contents.utf8), "the corrupt file was changed or removed")
    }

    @Test("An API variant whose id the configuration now uses: the proxy either lets the config win or refuses, naming the state file")
    func persistedIDNowInConfig() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("datamode-dup-\(UUID().uuidString.prefix(8))").path
        try FileManager.default.createDirectory(atPath: directory + "/state", withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let path = directory + "/state/variants.json"
        try Data(jsonText(["variants": [["id": "hero", "match": "http://api.example/*", "target": "http://api.example/s/$1",
                                          "when": "disallowed", "action": "forward", "source": "api"]]]).utf8)
            .write(to: URL(fileURLWithPath: path))
        let config = """
            variants:
              - id: hero
                match: "http://cdn.example/*"
                target: "http://cdn.example/s/$1"
            """
        let proxy = try ProxyProcess(config: config, waitForReady: false, directory: directory)
        defer { halt(proxy) }
        try? proxy.waitForReady(timeout: 15)
        if proxy.process.isRunning {
            let hero = variant("hero", in: try AdminAPIClient(port: proxy.adminPort).get("/variants"))
            #expect(hero?["source"] as? String == "config", "started, but \(String(describing: hero))")
        } else {
            #expect(proxy.process.terminationStatus != 0)
            #expect(proxy.stderr.contains(path), "refused without naming \(path): \(proxy.stderr)")
        }
    }

    @Test("SIGHUP reloads the file but keeps the API mode and the API variants")
    func reloadKeepsAPIState() throws {
        let config = """
            mode: expensive
            variants:
              - id: cfg-one
                match: "http://cdn.example/one/*"
                target: "http://cdn.example/small/$1"
            """
        try withAdminProxy(config: config) { proxy, admin throws in
            #expect(try admin.put("/mode", #"{"mode": "constrained"}"#).status == 200)
            #expect(try admin.putVariant("api-one", ["match": "http://api.example/*", "target": "http://api.example/s/$1"]).status == 201)
            try """
                mode: normal
                variants:
                  - id: cfg-two
                    match: "http://cdn.example/two/*"
                    target: "http://cdn.example/small/$1"
                """.write(toFile: proxy.configPath, atomically: true, encoding: .utf8)
            proxy.signal(SIGHUP)
            let reloaded = AdminPolling.until(timeout: .seconds(5)) {
                (try? admin.get("/variants")).flatMap { variant("cfg-two", in: $0) } != nil
            }
            let listed = try admin.get("/variants")
            #expect(reloaded, "SIGHUP did not reload the file: \(listed.bodyText)")
            let ids = listed.array?.compactMap { $0["id"] as? String }
            #expect(ids == (reloaded ? ["cfg-two", "api-one"] : ["cfg-one", "api-one"]), "\(String(describing: ids))")
            #expect(try modeFacts(admin) == ModeFacts("constrained", true, false, "api"))
            if reloaded {
                #expect(ModeFacts(try admin.delete("/mode")) == ModeFacts("normal", false, false, "config"),
                        "DELETE /mode after a reload returns to the reloaded file's mode")
            }
        }
    }

    @Test("A PUT that cannot be persisted is refused and changes nothing", .enabled(if: getuid() != 0, "root ignores directory permissions"))
    func unwritableStateDirectory() throws {
        try withAdminProxy { proxy, admin throws in
            chmod(proxy.stateDirectory, 0o500)
            defer { chmod(proxy.stateDirectory, 0o700) }
            let put = try admin.put("/mode", #"{"mode": "constrained"}"#)
            #expect(put.status >= 500, "\(put.status) \(put.bodyText)")
            #expect(try modeFacts(admin)?.source == "default")
            #expect(try admin.putVariant("v", ["match": "http://a.example/*", "target": "http://b.example/$1"]).status >= 500)
            #expect(try admin.get("/variants").array?.isEmpty == true)
        }
    }
}

/// The client of the crash test: writes variants (create, delete) and the mode (set, reset) through the admin API
/// as fast as it can, keeping the model of what the state must hold after each acknowledged write, until a
/// request fails because the proxy was killed.
final class StateWriter: @unchecked Sendable {
    enum Operation: CustomStringConvertible {
        case putVariant(String)
        case deleteVariant(String)
        case putMode(String)
        case deleteMode

        func applied(to state: PersistedState) -> PersistedState {
            var state = state
            switch self {
            case .putVariant(let id): if !state.variantIDs.contains(id) { state.variantIDs.append(id) }
            case .deleteVariant(let id): state.variantIDs.removeAll { $0 == id }
            case .putMode(let name): state.mode = name
            case .deleteMode: state.mode = nil
            }
            return state
        }

        var description: String {
            switch self {
            case .putVariant(let id): "PUT /variants/\(id)"
            case .deleteVariant(let id): "DELETE /variants/\(id)"
            case .putMode(let name): "PUT /mode \(name)"
            case .deleteMode: "DELETE /mode"
            }
        }
    }

    struct Outcome {
        var model: PersistedState
        var inFlight: Operation?
        var acknowledged = 0
        var failures: [String] = []
        var done = false
        var inFlightApplied: PersistedState? { inFlight?.applied(to: model) }
    }

    private let admin: AdminAPIClient
    private let prefix: String
    private let state: Mutex<Outcome>

    init(admin: AdminAPIClient, start: PersistedState, prefix: String) {
        self.admin = admin
        self.prefix = prefix
        self.state = Mutex(Outcome(model: start))
    }

    var acknowledged: Int { state.withLock { $0.acknowledged } }
    var outcome: Outcome { state.withLock { $0 } }

    func waitUntilDone(timeout: Duration) -> Bool {
        AdminPolling.until(timeout: timeout, interval: .milliseconds(2)) { state.withLock { $0.done } }
    }

    func run() {
        defer { state.withLock { $0.done = true } }
        let modes = ["constrained", "expensive", "constrained-expensive", "normal"]
        var step = 0
        while true {
            let model = state.withLock { $0.model }
            let operation: Operation
            if step % 16 == 15 {
                operation = .deleteMode
            } else if step % 4 == 3 {
                operation = .putMode(modes[(step / 4) % modes.count])
            } else if step % 4 == 1 && model.variantIDs.count > 12 {
                operation = .deleteVariant(model.variantIDs[0])
            } else {
                operation = .putVariant("\(prefix)\(step)")
            }
            state.withLock { $0.inFlight = operation }
            let reply: AdminReply
            do {
                switch operation {
                case .putVariant(let id):
                    reply = try admin.putVariant(id, ["match": "http://crash.example/\(id)/*", "target": "http://small.example/\(id)/$1"])
                case .deleteVariant(let id):
                    reply = try admin.delete("/variants/\(id)")
                case .putMode(let name):
                    reply = try admin.put("/mode", jsonText(["mode": name]))
                case .deleteMode:
                    reply = try admin.delete("/mode")
                }
            } catch {
                return  // killed: the operation stays in flight
            }
            guard (200..<300).contains(reply.status) else {
                state.withLock { $0.failures.append("\(operation): \(reply.status) \(reply.bodyText)") }
                return
            }
            state.withLock {
                $0.model = operation.applied(to: $0.model)
                $0.inFlight = nil
                $0.acknowledged += 1
            }
            step += 1
        }
    }
}
