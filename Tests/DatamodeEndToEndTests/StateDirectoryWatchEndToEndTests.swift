// End-to-end tests of `store.kind: file` (SPEC §19): the real binary watches its state directory and applies, within
// a second, a mode, a link profile or variants another process wrote there — by an atomic rename, or by the
// `..data` symlink swap of a Kubernetes ConfigMap volume — and refuses a malformed file with a log line naming it.
import DatamodeTestSupport
import Foundation
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite("StateDirectoryWatch: another process writes the state directory", .serialized)
struct StateDirectoryWatchEndToEndTests {
    static let config = """
        mode: normal
        profiles:
          my-sat: {down: 2Mbit, up: 256kbit, latency: 600ms, jitter: 20ms}
        """

    /// Writes `text` as `path` by a temporary in the same directory and a rename: the reader sees old or new.
    static func writeAtomically(_ text: String, to path: String) throws {
        try text.write(toFile: path + ".writing", atomically: false, encoding: .utf8)
        guard rename(path + ".writing", path) == 0 else { throw POSIXError(.init(rawValue: errno) ?? .EIO) }
    }

    /// An admin answer's body for a failure message.
    static func peek(_ admin: AdminAPIClient, _ path: String) -> String {
        (try? admin.get(path))?.bodyText ?? "(no answer)"
    }

    /// Polls `GET /mode` until it names `mode`; how long that took, or nil when it did not within `timeout`.
    static func waitForMode(_ admin: AdminAPIClient, _ mode: String, timeout: Duration = .seconds(1)) -> Duration? {
        let started = ContinuousClock.now
        let seen = AdminPolling.until(timeout: timeout, interval: .milliseconds(5)) {
            (try? modeFacts(admin))?.mode == mode
        }
        return seen ? ContinuousClock.now - started : nil
    }

    @Test("A mode written by an atomic rename is in force within 1 s, traffic follows it, and removing the file returns to the config mode")
    func atomicRename() throws {
        let origin = try RecordingOrigin { _ in .ok("hello") }
        defer { origin.stop() }
        let proxy = try ProxyProcess(config: Self.config)
        defer { halt(proxy) }
        let admin = AdminAPIClient(port: proxy.adminPort)
        let client = try RawHTTPClient(port: proxy.port)
        defer { client.close() }
        let refusable = [("Allow-Constrained", "?0")]
        #expect(try proxied(client, origin.url("/a"), headers: refusable).status == 200)

        try Self.writeAtomically(#"{"mode": "constrained", "since": 1767225700}"#, to: proxy.stateDirectory + "/mode.json")
        let took = Self.waitForMode(admin, "constrained")
        #expect(took != nil, "the mode written to the state directory was not in force within 1 s: \(Self.peek(admin, "/mode"))")
        #expect(try modeFacts(admin) == ModeFacts("constrained", true, false, "api"))
        #expect(try admin.get("/mode").object["since"] as? String == "2026-01-01T00:01:40Z")
        let refused = try proxied(client, origin.url("/b"), headers: refusable)
        #expect(refused.status == 403, "\(refused.status) \(refused.bodyText)")

        try FileManager.default.removeItem(atPath: proxy.stateDirectory + "/mode.json")
        #expect(Self.waitForMode(admin, "normal") != nil)
        #expect(try modeFacts(admin) == ModeFacts("normal", false, false, "config"))
        #expect(try proxied(client, origin.url("/c"), headers: refusable).status == 200)
        print("state-dir watch: an atomic rename of mode.json in force after \(took.map { "\($0)" } ?? "never")")
    }

    @Test("A ConfigMap-style ..data symlink swap changes mode and profile; a malformed version is refused with a log line naming the file and the running state kept")
    func configMapSwap() throws {
        let root = FileManager.default.temporaryDirectory.appendingPathComponent("datamode-configmap-\(UUID().uuidString.prefix(8))").path
        let stateDir = root + "/state"
        try FileManager.default.createDirectory(atPath: stateDir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: root) }
        // As the kubelet lays out a ConfigMap volume: a timestamped directory with the data, `..data` pointing at
        // it, and each key a symlink through `..data`.
        var version = 0
        func publish(_ files: [String: String]) throws {
            version += 1
            let name = "..2026_01_01_00_00_0\(version).000000000"
            try FileManager.default.createDirectory(atPath: stateDir + "/" + name, withIntermediateDirectories: false)
            for (file, text) in files { try text.write(toFile: stateDir + "/" + name + "/" + file, atomically: false, encoding: .utf8) }
            unlink(stateDir + "/..data_tmp")
            try FileManager.default.createSymbolicLink(atPath: stateDir + "/..data_tmp", withDestinationPath: name)
            guard rename(stateDir + "/..data_tmp", stateDir + "/..data") == 0 else { throw POSIXError(.EIO) }
        }
        try publish(["mode.json": #"{"mode": "expensive"}"#, "conditions.json": #"{"profile": "my-sat"}"#])
        for file in ["mode.json", "conditions.json"] {
            try FileManager.default.createSymbolicLink(atPath: stateDir + "/" + file, withDestinationPath: "..data/" + file)
        }
        let proxy = try ProxyProcess(config: Self.config, arguments: ["--state-dir", stateDir])
        defer { halt(proxy) }
        let admin = AdminAPIClient(port: proxy.adminPort)
        #expect(try modeFacts(admin) == ModeFacts("expensive", false, true, "api"), "the ConfigMap's mode at start-up")
        #expect(try admin.get("/conditions").object["profile"] as? String == "my-sat")

        try publish(["mode.json": #"{"mode": "constrained"}"#, "conditions.json": #"{"profile": "geo-satellite"}"#])
        let took = Self.waitForMode(admin, "constrained")
        #expect(took != nil, "the swapped ConfigMap was not in force within 1 s: \(Self.peek(admin, "/mode"))")
        #expect(AdminPolling.until(timeout: .seconds(1)) {
            (try? admin.get("/conditions"))?.object["profile"] as? String == "geo-satellite"
        }, "the swapped profile: \(Self.peek(admin, "/conditions"))")

        // A bad version: mode.json does not parse, conditions.json names a profile that does not exist.
        try publish(["mode.json": #"{"mode": "warp-speed"}"#, "conditions.json": #"{"profile": "no-such-link"}"#])
        let logged = AdminPolling.until(timeout: .seconds(2)) {
            proxy.stderr.contains("state file refused") && proxy.stderr.contains(stateDir + "/conditions.json")
        }
        #expect(logged, "no refusal naming the files in the log:\n\(proxy.stderr)")
        let refusals = proxy.stderr.split(separator: "\n").filter { $0.contains("state file refused") }
        #expect(refusals.contains { $0.contains(stateDir + "/mode.json") && $0.contains("not a mode name") }, "\(refusals)")
        #expect(refusals.contains { $0.contains("no-such-link") }, "\(refusals)")
        #expect(try modeFacts(admin) == ModeFacts("constrained", true, false, "api"), "the running mode is kept")
        #expect(try admin.get("/conditions").object["profile"] as? String == "geo-satellite")
        #expect(proxy.process.isRunning)

        // A good version after the bad one is applied.
        try publish(["mode.json": #"{"mode": "normal"}"#])
        #expect(Self.waitForMode(admin, "normal") != nil)
        #expect(AdminPolling.until(timeout: .seconds(1)) {
            (try? admin.get("/conditions"))?.object["source"] as? String == "none"
        }, "conditions.json gone from the ConfigMap: \(Self.peek(admin, "/conditions"))")
        print("state-dir watch: a ConfigMap ..data swap in force after \(took.map { "\($0)" } ?? "never")")
    }

    @Test("Variants written to the state directory by another process are served")
    func variants() throws {
        let origin = try RecordingOrigin { request in .ok(request.target.hasSuffix("-small.jpg") ? "small" : "full") }
        defer { origin.stop() }
        let proxy = try ProxyProcess(config: Self.config)
        defer { halt(proxy) }
        let admin = AdminAPIClient(port: proxy.adminPort)
        let variants = jsonText(["variants": [["id": "small", "match": origin.url("/img/*.jpg"),
                                               "target": origin.url("/img/$1-small.jpg"), "when": "always"]]])
        try Self.writeAtomically(variants, to: proxy.stateDirectory + "/variants.json")
        #expect(AdminPolling.until(timeout: .seconds(1)) {
            (try? admin.get("/variants"))?.array?.compactMap { $0["id"] as? String } == ["small"]
        }, "\(Self.peek(admin, "/variants"))")
        let client = try RawHTTPClient(port: proxy.port)
        defer { client.close() }
        let served = try proxied(client, origin.url("/img/hero.jpg"))
        #expect(served.status == 200 && served.bodyText == "small", "\(served.status) \(served.bodyText)")
    }
}
