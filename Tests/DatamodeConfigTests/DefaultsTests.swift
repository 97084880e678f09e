import DatamodeConfig
import DatamodePolicy
import Foundation
import Testing

/// One key of SPEC §8 and a check that a configuration holds its default.
struct DefaultCase: Sendable, CustomTestStringConvertible {
    var key: String
    var holds: @Sendable (ProxyConfiguration) -> Bool
    var testDescription: String { key }
}

let defaultCases: [DefaultCase] = [
    DefaultCase(key: "listen") { $0.listen.description == "127.0.0.1:8877" && $0.listen.port == 8877 },
    DefaultCase(key: "admin.listen") { $0.admin.listen.description == "127.0.0.1:8878" },
    DefaultCase(key: "admin.token") { $0.admin.token == nil },
    DefaultCase(key: "mode") { $0.mode == nil && $0.effectiveMode == .normal && $0.modeSource == .default },
    DefaultCase(key: "state-dir") { $0.stateDirectory == "./state" },
    DefaultCase(key: "threads") { $0.threads == 0 && $0.workerCount(cores: 6) == 6 },
    DefaultCase(key: "tags.forward") { $0.tags.forward },
    DefaultCase(key: "tags.save-data") { $0.tags.saveData },
    DefaultCase(key: "tags.prefetch-is-discretionary") { $0.tags.prefetchIsDiscretionary },
    DefaultCase(key: "tags.defaults.allow-constrained") { $0.tags.defaults.allowConstrained },
    DefaultCase(key: "tags.defaults.allow-expensive") { $0.tags.defaults.allowExpensive },
    DefaultCase(key: "rules") { $0.rules.isEmpty },
    DefaultCase(key: "variants") { $0.variants.isEmpty },
    DefaultCase(key: "variants-dir") { $0.variantsDirectory == nil },
    DefaultCase(key: "connect.ports") { $0.connect.ports == [443] && $0.connect.allows(port: 443) && !$0.connect.allows(port: 80) },
    DefaultCase(key: "access.allow") { $0.access.allow.map(\.description) == ["127.0.0.0/8", "::1/128"] },
    DefaultCase(key: "access.users") { $0.access.users.isEmpty && !$0.access.requiresAuthentication },
    DefaultCase(key: "limits.request-line") { $0.limits.requestLine == 8 * 1024 },
    DefaultCase(key: "limits.header-section") { $0.limits.headerSection == 64 * 1024 },
    DefaultCase(key: "limits.header-count") { $0.limits.headerCount == 100 },
    DefaultCase(key: "timeouts.client-header") { $0.timeouts.clientHeader == .seconds(15) },
    DefaultCase(key: "timeouts.client-idle") { $0.timeouts.clientIdle == .seconds(60) },
    DefaultCase(key: "timeouts.upstream-connect") { $0.timeouts.upstreamConnect == .seconds(10) },
    DefaultCase(key: "timeouts.upstream-response") { $0.timeouts.upstreamResponse == .seconds(60) },
    DefaultCase(key: "drain-timeout") { $0.drainTimeout == .seconds(10) },
    DefaultCase(key: "log.access") { $0.log.access == .stdout },
]

@Suite("Defaults")
struct DefaultsTests {
    @Test("ProxyConfiguration.defaults holds every SPEC §8 default", arguments: defaultCases)
    func staticDefaults(_ check: DefaultCase) {
        #expect(check.holds(ProxyConfiguration.defaults))
    }

    /// An empty file, only comments, a lone document marker, or `~` all mean "every default".
    @Test("an empty document is all defaults", arguments: [
        "",
        "\n\n",
        "# just a comment\n",
        "# one\n   # two, indented\n\n# three",
        "---\n",
        "---\n# comment\n...\n",
        "~\n",
    ])
    func emptyDocuments(_ yaml: String) throws {
        let configuration = try parse(yaml)
        #expect(configuration == .defaults)
        for check in defaultCases {
            #expect(check.holds(configuration), "\(check.key)")
        }
    }

    /// A section whose keys are all commented out (`admin:` then nothing) is that section's defaults; a list
    /// whose items are all commented out is empty.
    @Test("a section or list left empty keeps its defaults")
    func emptySections() throws {
        let configuration = try parse("""
            admin:
              # listen: 0.0.0.0:8878
            tags:
            timeouts:
            rules:
            variants:
            """)
        #expect(configuration == .defaults)
    }

    @Test("the shipped config/datamode.yaml parses to the defaults, its mode set explicitly")
    func shippedConfig() throws {
        let configuration = try ProxyConfiguration.load(path: shippedConfigPath)
        var expected = ProxyConfiguration.defaults
        expected.mode = .normal
        #expect(configuration == expected)
        #expect(configuration.modeSource == .config)
        #expect(configuration.effectiveMode == .normal)
        for check in defaultCases where check.key != "mode" {
            #expect(check.holds(configuration), "\(check.key)")
        }
    }

    /// Every key of SPEC §8 appears in the shipped file, so it documents all of them.
    @Test("the shipped config names every key", arguments: [
        "listen:", "admin:", "  listen:", "  token:", "mode:", "state-dir:", "threads:", "tags:", "  forward:",
        "  save-data:", "  prefetch-is-discretionary:", "  defaults:", "    allow-constrained:", "    allow-expensive:",
        "rules:", "variants:", "connect:", "  ports:", "access:", "  allow:", "  users:", "limits:",
        "  request-line:", "  header-section:", "  header-count:", "timeouts:", "  client-header:", "  client-idle:",
        "  upstream-connect:", "  upstream-response:", "drain-timeout:", "log:", "  access:", "variants-dir:",
    ])
    func shippedConfigNamesEveryKey(_ key: String) throws {
        let text = try String(contentsOfFile: shippedConfigPath, encoding: .utf8)
        let lines = text.split(separator: "\n").map(String.init)
        #expect(lines.contains { $0.hasPrefix(key) }, "missing \(key)")
    }

    /// The commented-out examples of the shipped file are valid once uncommented (with the file present).
    @Test("the shipped config's commented examples are valid")
    func shippedExamples() throws {
        let text = try String(contentsOfFile: shippedConfigPath, encoding: .utf8)
        let directory = try makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try FileManager.default.createDirectory(atPath: directory + "/variants", withIntermediateDirectories: true)
        _ = FileManager.default.createFile(atPath: directory + "/variants/promo-poster.jpg", contents: Data([0xFF, 0xD8]))
        // Drop the `rules: []` / `variants: []` / `users: {}` lines and uncomment the examples below them.
        var output: [String] = []
        var inExample = false
        for line in text.split(separator: "\n", omittingEmptySubsequences: false).map(String.init) {
            if line == "rules: []" || line == "variants: []" || line == "  users: {}" { continue }
            if line == "# rules:" || line == "# variants:" || line == "  # users:" { inExample = true }
            if inExample, let range = line.range(of: "# ") {
                let uncommented = line.replacingCharacters(in: range, with: "")
                if uncommented.trimmingCharacters(in: .whitespaces).hasPrefix("#") { continue }
                output.append(uncommented)
                continue
            }
            inExample = false
            output.append(line)
        }
        let configuration = try parse(output.joined(separator: "\n"), base: directory)
        #expect(configuration.rules.map(\.name) == ["videos-are-expensive"])
        #expect(configuration.rules.first?.match.client?.description == "10.0.0.0/8")
        #expect(configuration.variants.map(\.id) == ["hero-small", "promo-video-poster"])
        #expect(configuration.variants.last?.resource == .file(path: directory + "/variants/promo-poster.jpg", contentType: "image/jpeg"))
        #expect(configuration.access.users == ["alice": "correct horse battery staple"])
    }

    @Test("every key set to a non-default value")
    func everyKeySet() throws {
        let configuration = try parse("""
            listen: "[::1]:9000"
            admin: {listen: 127.0.0.2:0, token: s3cret}
            mode: low-data
            state-dir: /var/lib/datamode
            threads: 4
            tags:
              forward: false
              save-data: false
              prefetch-is-discretionary: false
              defaults: {allow-constrained: false, allow-expensive: false}
            connect: {ports: [443, 8443]}
            access:
              allow: [10.0.0.0/8, "2001:db8::/32", 192.168.1.7]
              users: {alice: wonderland, bob: 1234}
            limits: {request-line: 16KiB, header-section: 1MiB, header-count: 50}
            timeouts: {client-header: 500ms, client-idle: 2m, upstream-connect: 3, upstream-response: 1h}
            drain-timeout: 30s
            log: {access: /var/log/datamode/access.log}
            variants-dir: .
            """)
        #expect(configuration.listen.host == "::1")
        #expect(configuration.listen.port == 9000)
        #expect(configuration.listen.description == "[::1]:9000")
        #expect(configuration.admin.listen.description == "127.0.0.2:0")
        #expect(configuration.admin.token == "s3cret")
        #expect(configuration.mode == DataMode(constrained: true, expensive: false))
        #expect(configuration.modeSource == .config)
        #expect(configuration.stateDirectory == "/var/lib/datamode")
        #expect(configuration.threads == 4)
        #expect(configuration.workerCount(cores: 2) == 4)
        #expect(configuration.tags == TagSettings(forward: false, saveData: false, prefetchIsDiscretionary: false,
                                                  defaults: RequestTags(allowConstrained: false, allowExpensive: false)))
        #expect(configuration.connect.ports == [443, 8443])
        #expect(configuration.access.allow.map(\.description) == ["10.0.0.0/8", "2001:db8::/32", "192.168.1.7/32"])
        #expect(configuration.access.users == ["alice": "wonderland", "bob": "1234"])
        #expect(configuration.access.requiresAuthentication)
        #expect(configuration.limits.requestLine == 16384)
        #expect(configuration.limits.headerSection == 1 << 20)
        #expect(configuration.limits.headerCount == 50)
        #expect(configuration.timeouts == TimeoutsSection(clientHeader: .milliseconds(500), clientIdle: .seconds(120),
                                                          upstreamConnect: .seconds(3), upstreamResponse: .seconds(3600)))
        #expect(configuration.drainTimeout == .seconds(30))
        #expect(configuration.log.access == .file("/var/log/datamode/access.log"))
        #expect(configuration.variantsDirectory == configuration.variantFiles.baseDirectory)
    }

    @Test("log.access stdout, off and a path", arguments: [
        ("stdout", AccessLogDestination.stdout),
        ("off", .off),
        ("\"off\"", .off),
        ("access.log", .file("access.log")),
        ("/var/log/a.log", .file("/var/log/a.log")),
    ])
    func logAccess(_ text: String, _ expected: AccessLogDestination) throws {
        #expect(try parse("log:\n  access: \(text)\n").log.access == expected)
    }

    @Test("every mode name and alias", arguments: [
        ("normal", DataMode.normal),
        ("constrained", DataMode(constrained: true, expensive: false)),
        ("low-data", DataMode(constrained: true, expensive: false)),
        ("expensive", DataMode(constrained: false, expensive: true)),
        ("cellular", DataMode(constrained: false, expensive: true)),
        ("constrained-expensive", DataMode(constrained: true, expensive: true)),
    ])
    func modes(_ name: String, _ expected: DataMode) throws {
        let configuration = try parse("mode: \(name)")
        #expect(configuration.mode == expected)
        #expect(configuration.effectiveMode == expected)
        #expect(configuration.modeSource == .config)
    }

    @Test("sizes", arguments: [
        ("8KiB", 8192), ("8 KiB", 8192), ("8kib", 8192), ("1MiB", 1 << 20), ("4096", 4096), ("4096B", 4096),
        ("\"300\"", 300),
    ])
    func sizes(_ text: String, _ bytes: Int) throws {
        #expect(try parse("limits: {request-line: \(text)}").limits.requestLine == bytes)
    }

    @Test("durations", arguments: [
        ("15s", Duration.seconds(15)), ("500ms", .milliseconds(500)), ("2m", .seconds(120)), ("1h", .seconds(3600)),
        ("7", .seconds(7)), ("24h", .seconds(86400)), ("1ms", .milliseconds(1)),
    ])
    func durations(_ text: String, _ expected: Duration) throws {
        #expect(try parse("drain-timeout: \(text)").drainTimeout == expected)
    }
}
