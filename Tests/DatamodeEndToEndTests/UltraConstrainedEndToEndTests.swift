// End-to-end tests of SPEC §15 through the real binary: the mode's names on every input (admin API, --mode,
// DATAMODE_MODE, the CLI), GET /mode and metrics, persistence (old state files included), and the access log.
// The README's satellite walk-through is in ReadmeWalkthroughTests.swift.
import DatamodeTestSupport
import Foundation
import Testing

/// GET /mode's conditions, all three.
struct Conditions: Equatable, CustomStringConvertible {
    var mode: String
    var constrained: Bool
    var expensive: Bool
    var ultraConstrained: Bool
    var source: String

    init(_ mode: String, _ c: Bool, _ e: Bool, _ u: Bool, _ source: String) {
        self.mode = mode
        constrained = c
        expensive = e
        ultraConstrained = u
        self.source = source
    }

    init?(_ reply: AdminReply) {
        let o = reply.object
        guard let mode = o["mode"] as? String, let c = o["constrained"] as? Bool, let e = o["expensive"] as? Bool,
              let u = o["ultraConstrained"] as? Bool, let source = o["source"] as? String else { return nil }
        self.init(mode, c, e, u, source)
    }

    var description: String { "\(mode) (c \(constrained), e \(expensive), u \(ultraConstrained), \(source))" }
}

@Suite("UltraConstrained: end to end", .serialized)
struct UltraConstrainedEndToEndTests {
    static let satellite = "constrained-expensive-ultra-constrained"

    @Test("PUT /mode by every new name, satellite and ultraConstrained; GET /mode and metrics follow")
    func putAndGetMode() throws {
        try withAdminProxy { _, admin throws in
            #expect(Conditions(try admin.get("/mode")) == Conditions("normal", false, false, false, "default"))
            #expect(try admin.scrape().value("datamode_mode", ["condition": "ultra-constrained"]) == 0)

            let cases: [(String, Conditions)] = [
                (#"{"mode": "ultra-constrained"}"#, Conditions("ultra-constrained", false, false, true, "api")),
                (#"{"mode": "constrained-ultra-constrained"}"#, Conditions("constrained-ultra-constrained", true, false, true, "api")),
                (#"{"mode": "expensive-ultra-constrained"}"#, Conditions("expensive-ultra-constrained", false, true, true, "api")),
                (#"{"mode": "constrained-expensive-ultra-constrained"}"#, Conditions(Self.satellite, true, true, true, "api")),
                (#"{"mode": "satellite"}"#, Conditions(Self.satellite, true, true, true, "api")),
                (#"{"ultraConstrained": true}"#, Conditions("ultra-constrained", false, false, true, "api")),
                (#"{"constrained": true, "ultraConstrained": true}"#, Conditions("constrained-ultra-constrained", true, false, true, "api")),
                (#"{"constrained": true, "expensive": true, "ultraConstrained": true}"#, Conditions(Self.satellite, true, true, true, "api")),
                // The two-condition forms mean what they meant: a missing ultraConstrained is false.
                (#"{"constrained": true, "expensive": true}"#, Conditions("constrained-expensive", true, true, false, "api")),
                (#"{"mode": "low-data"}"#, Conditions("constrained", true, false, false, "api")),
                (#"{"ultraConstrained": false}"#, Conditions("normal", false, false, false, "api")),
            ]
            for (body, expected) in cases {
                let reply = try admin.put("/mode", body)
                #expect(reply.status == 200, "PUT /mode \(body): \(reply.bodyText)")
                #expect(Conditions(reply) == expected, "PUT /mode \(body) answered \(reply.bodyText)")
                #expect(Conditions(try admin.get("/mode")) == expected, "GET /mode after \(body)")
                let scrape = try admin.scrape()
                #expect(scrape.types["datamode_mode"] == "gauge")
                #expect(scrape.value("datamode_mode", ["condition": "constrained"]) == (expected.constrained ? 1 : 0))
                #expect(scrape.value("datamode_mode", ["condition": "expensive"]) == (expected.expensive ? 1 : 0))
                #expect(scrape.value("datamode_mode", ["condition": "ultra-constrained"]) == (expected.ultraConstrained ? 1 : 0),
                        "after \(body)")
            }
        }
    }

    @Test("PUT /mode refuses mixed, unknown or non-boolean forms of the new condition")
    func putModeBad() throws {
        try withAdminProxy(config: "mode: expensive\n") { _, admin throws in
            for body in [
                #"{"mode": "satellite", "ultraConstrained": true}"#, #"{"ultraConstrained": "yes"}"#,
                #"{"ultraConstrained": 1}"#, #"{"ultra-constrained": true}"#, #"{"ultraconstrained": true}"#,
                #"{"mode": "ultra"}"#, #"{"mode": "satelite"}"#,
            ] {
                expectProblem(try admin.put("/mode", body), 400, error: "bad-request", "PUT /mode \(body)")
            }
            #expect(Conditions(try admin.get("/mode")) == Conditions("expensive", false, true, false, "config"))
        }
    }

    @Test("--mode and DATAMODE_MODE take satellite and the new names", arguments: [
        (["--mode", "satellite"], [:], Conditions(Self.satellite, true, true, true, "flag")),
        ([], ["DATAMODE_MODE": "expensive-ultra-constrained"], Conditions("expensive-ultra-constrained", false, true, true, "flag")),
        ([], [:], Conditions("ultra-constrained", false, false, true, "config")),
    ] as [([String], [String: String], Conditions)])
    func flagEnvironmentAndFile(arguments: [String], environment: [String: String], expected: Conditions) throws {
        try withAdminProxy(config: "mode: ultra-constrained\n", arguments: arguments, environment: environment) { _, admin throws in
            #expect(Conditions(try admin.get("/mode")) == expected)
            #expect(try admin.scrape().value("datamode_mode", ["condition": "ultra-constrained"]) == 1)
        }
    }

    @Test("An API satellite mode persists across a restart; a mode.json written before §15 still reads, without it")
    func persistence() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("datamode-ultra-\(UUID().uuidString.prefix(8))").path
        try FileManager.default.createDirectory(atPath: directory + "/state", withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }

        // A state file as the versions before the third condition wrote it.
        try Data(#"{"mode": "constrained-expensive", "since": 1700000000}"#.utf8)
            .write(to: URL(fileURLWithPath: directory + "/state/mode.json"))
        try withAdminProxy(directory: directory) { _, admin throws in
            let reply = try admin.get("/mode")
            #expect(Conditions(reply) == Conditions("constrained-expensive", true, true, false, "api"))
            #expect(reply.object["since"] as? String == "2023-11-14T22:13:20Z")
            #expect(try admin.put("/mode", #"{"mode": "satellite"}"#).status == 200)
        }
        try withAdminProxy(arguments: ["--mode", "normal"], directory: directory) { _, admin throws in
            #expect(Conditions(try admin.get("/mode")) == Conditions(Self.satellite, true, true, true, "api"))
        }
    }

    @Test("`datamode-proxy mode satellite` sets it and prints ultraConstrained; unknown names list the new ones")
    func cli() throws {
        try withAdminProxy { proxy, admin throws in
            let address = "127.0.0.1:\(proxy.adminPort)"
            let set = try ProxyProcess.runCLI(["mode", "satellite", "--admin", address])
            #expect(set.status == 0, "\(set.stderr)")
            #expect(set.stdout.contains("\"mode\":\"\(Self.satellite)\""), "\(set.stdout)")
            #expect(set.stdout.contains("\"ultraConstrained\":true"), "\(set.stdout)")
            #expect(Conditions(try admin.get("/mode")) == Conditions(Self.satellite, true, true, true, "api"))

            let show = try ProxyProcess.runCLI(["mode", "--admin", address])
            #expect(show.stdout.contains("\"ultraConstrained\":true"), "\(show.stdout)")

            let bad = try ProxyProcess.runCLI(["mode", "ultra", "--admin", address])
            #expect(bad.status != 0)
            #expect(bad.stderr.contains("expensive-ultra-constrained") && bad.stderr.contains("satellite"), "\(bad.stderr)")
            #expect(Conditions(try admin.get("/mode"))?.mode == Self.satellite)
        }
        let help = try ProxyProcess.runCLI(["mode", "--help"])
        #expect(help.status == 0)
        for name in ["ultra-constrained", "constrained-expensive-ultra-constrained", "satellite"] {
            #expect(help.stdout.contains(name), "mode --help lacks \(name): \(help.stdout)")
        }
        let runHelp = try ProxyProcess.runCLI(["run", "--help"])
        #expect(runHelp.stdout.contains("satellite"), "\(runHelp.stdout)")
    }

    @Test("The access log shows the third tag, where it came from and its rule; a refusal is counted by its reason")
    func accessLogAndMetrics() throws {
        let origin = try RecordingOrigin { _ in .ok("in") }
        defer { origin.stop() }
        let config = """
            rules:
              - name: essential
                match: {path: "/essential/*"}
                tags: {allow-ultra-constrained: true}
            """
        try withAdminProxy(config: config, arguments: ["--mode", "satellite"]) { proxy, admin throws in
            let client = try RawHTTPClient(port: proxy.port)
            let refused = try proxied(client, origin.url("/silent"))
            #expect(refused.status == 403)
            #expect(refused.value(of: "Network-Unavailable-Reason") == "ultra-constrained")
            #expect(try proxied(client, origin.url("/opted-in"), headers: [("Allow-Ultra-Constrained", "?1")]).status == 200)
            #expect(try proxied(client, origin.url("/essential/status")).status == 200)
            #expect(origin.requests.map(\.target) == ["/opted-in", "/essential/status"])
            #expect(origin.requests.map { $0.value(of: "Allow-Ultra-Constrained") } == ["?1", "?1"])

            let scrape = try admin.scrape()
            #expect(scrape.counter("datamode_requests_total", ["outcome": "rejected", "reason": "ultra-constrained"]) == 1)
            #expect(scrape.counter("datamode_requests_total", ["outcome": "forwarded", "reason": ""]) == 2)

            var lines: [[String: Any]] = []
            for _ in 0..<250 {
                lines = proxy.accessLog
                if lines.count >= 3 { break }
                usleep(20_000)
            }
            func line(_ path: String) throws -> [String: Any] {
                try #require(lines.first { $0["url"] as? String == origin.url(path) }, "no line for \(path) in \(lines)")
            }
            let silent = try line("/silent")
            #expect(silent["outcome"] as? String == "rejected")
            #expect(silent["reason"] as? String == "ultra-constrained")
            #expect(silent["status"] as? Int == 403)
            #expect(silent["tags"] as? [String: Bool]
                == ["allow-constrained": true, "allow-expensive": true, "allow-ultra-constrained": false])
            #expect((silent["tagSources"] as? [String: String])?["allow-ultra-constrained"] == "default")
            #expect(silent["rule"] is NSNull)

            let optedIn = try line("/opted-in")
            #expect(optedIn["outcome"] as? String == "forwarded")
            #expect((optedIn["tags"] as? [String: Bool])?["allow-ultra-constrained"] == true)
            #expect((optedIn["tagSources"] as? [String: String])?["allow-ultra-constrained"] == "header")

            let essential = try line("/essential/status")
            #expect(essential["outcome"] as? String == "forwarded")
            #expect((essential["tags"] as? [String: Bool])?["allow-ultra-constrained"] == true)
            #expect((essential["tagSources"] as? [String: String])?["allow-ultra-constrained"] == "rule")
            #expect(essential["rule"] as? String == "essential")
        }
    }
}
