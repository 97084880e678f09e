@testable import DatamodeConfig
@testable import DatamodePolicy
import Testing

@Suite("Overrides")
struct OverrideTests {
    static let environment = [
        "DATAMODE_CONFIG": "/etc/datamode.yaml",
        "DATAMODE_LISTEN": "0.0.0.0:3128",
        "DATAMODE_ADMIN_LISTEN": "[::1]:9001",
        "DATAMODE_MODE": "cellular",
        "DATAMODE_ADMIN_TOKEN": "env-token",
        "DATAMODE_STATE_DIR": "/var/lib/datamode",
        "DATAMODE_THREADS": "3",
        "HOME": "/root",
    ]

    @Test("every DATAMODE_* variable is read")
    func fromEnvironment() {
        let overrides = ConfigOverrides.fromEnvironment(Self.environment)
        #expect(overrides.configPath == "/etc/datamode.yaml")
        #expect(overrides.listen == "0.0.0.0:3128")
        #expect(overrides.adminListen == "[::1]:9001")
        #expect(overrides.mode == "cellular")
        #expect(overrides.adminToken == "env-token")
        #expect(overrides.stateDirectory == "/var/lib/datamode")
        #expect(overrides.threads == "3")
    }

    @Test("an empty variable counts as unset")
    func emptyVariable() {
        #expect(ConfigOverrides.fromEnvironment(["DATAMODE_MODE": "", "DATAMODE_THREADS": ""])
            == ConfigOverrides.fromEnvironment([:]))
    }

    @Test("overrides replace the file's values")
    func applyAll() throws {
        let file = try parse("listen: 127.0.0.1:1\nmode: constrained\nthreads: 8\nstate-dir: ./s\nadmin: {token: file-token}")
        let configuration = try file.applying(.fromEnvironment(Self.environment))
        #expect(configuration.listen.description == "0.0.0.0:3128")
        #expect(configuration.admin.listen.description == "[::1]:9001")
        #expect(configuration.admin.token == "env-token")
        #expect(configuration.mode == DataMode(constrained: false, expensive: true))
        #expect(configuration.modeSource == .flag)
        #expect(configuration.stateDirectory == "/var/lib/datamode")
        #expect(configuration.threads == 3)
    }

    /// SPEC §8: flags beat environment variables, which beat the file; SPEC §2 names both sources `flag`.
    @Test("flag > environment > file > default", arguments: [
        // (file mode, env mode, flag mode) -> (effective, source)
        (nil, nil, nil, "normal", ModeSource.default),
        ("constrained", nil, nil, "constrained", .config),
        ("constrained", "expensive", nil, "expensive", .flag),
        ("constrained", "expensive", "normal", "normal", .flag),
        (nil, nil, "low-data", "constrained", .flag),
        (nil, "constrained-expensive", nil, "constrained-expensive", .flag),
    ] as [(String?, String?, String?, String, ModeSource)])
    func precedence(_ fileMode: String?, _ envMode: String?, _ flagMode: String?, _ effective: String, _ source: ModeSource) throws {
        let file = try parse(fileMode.map { "mode: \($0)" } ?? "")
        let environment = ConfigOverrides.fromEnvironment(envMode.map { ["DATAMODE_MODE": $0] } ?? [:])
        let flags = ConfigOverrides(mode: flagMode)
        let configuration = try file.applying(flags.overriding(environment))
        #expect(configuration.effectiveMode.name == effective)
        #expect(configuration.modeSource == source)
    }

    @Test("flags win field by field; the environment fills the rest")
    func overridingMerges() throws {
        let flags = ConfigOverrides(listen: "127.0.0.1:5000", threads: "2")
        let environment = ConfigOverrides.fromEnvironment(["DATAMODE_LISTEN": "127.0.0.1:6000", "DATAMODE_THREADS": "4",
                                                           "DATAMODE_STATE_DIR": "/env/state"])
        let merged = flags.overriding(environment)
        #expect(merged.listen == "127.0.0.1:5000")
        #expect(merged.threads == "2")
        #expect(merged.stateDirectory == "/env/state")
        let configuration = try ProxyConfiguration.defaults.applying(merged)
        #expect(configuration.listen.port == 5000)
        #expect(configuration.threads == 2)
        #expect(configuration.stateDirectory == "/env/state")
    }

    struct BadOverride: Sendable, CustomTestStringConvertible {
        var flags: ConfigOverrides
        var environment: [String: String]
        var source: String
        var key: String
        var message: String
        var testDescription: String { "\(source)" }
    }

    static let badOverrides: [BadOverride] = [
        BadOverride(flags: ConfigOverrides(), environment: ["DATAMODE_THREADS": "abc"], source: "DATAMODE_THREADS", key: "threads",
                    message: #"expected a number of worker threads from 0 to 256 (0 = one per core), got "abc""#),
        BadOverride(flags: ConfigOverrides(threads: "-2"), environment: [:], source: "--threads", key: "threads",
                    message: #"expected a number of worker threads from 0 to 256 (0 = one per core), got "-2""#),
        BadOverride(flags: ConfigOverrides(threads: "999"), environment: ["DATAMODE_THREADS": "2"], source: "--threads", key: "threads",
                    message: #"got "999""#),
        BadOverride(flags: ConfigOverrides(), environment: ["DATAMODE_MODE": "turbo"], source: "DATAMODE_MODE", key: "mode",
                    message: "expected a data mode (normal, constrained, expensive, constrained-expensive, ultra-constrained, "
                        + "constrained-ultra-constrained, expensive-ultra-constrained, constrained-expensive-ultra-constrained, "
                        + #"low-data, cellular, satellite), got "turbo""#),
        BadOverride(flags: ConfigOverrides(mode: "fast"), environment: [:], source: "--mode", key: "mode", message: #"got "fast""#),
        BadOverride(flags: ConfigOverrides(listen: "localhost:1"), environment: [:], source: "--listen", key: "listen",
                    message: #"expected an IP address and port such as 127.0.0.1:8877 or [::1]:8877, got "localhost:1""#),
        BadOverride(flags: ConfigOverrides(), environment: ["DATAMODE_LISTEN": "8877"], source: "DATAMODE_LISTEN", key: "listen",
                    message: #"got "8877""#),
        BadOverride(flags: ConfigOverrides(), environment: ["DATAMODE_ADMIN_LISTEN": "::1:8878"], source: "DATAMODE_ADMIN_LISTEN",
                    key: "admin.listen", message: #"got "::1:8878""#),
        BadOverride(flags: ConfigOverrides(adminListen: "127.0.0.1:"), environment: [:], source: "--admin-listen",
                    key: "admin.listen", message: #"got "127.0.0.1:""#),
        BadOverride(flags: ConfigOverrides(), environment: ["DATAMODE_ADMIN_TOKEN": "two words"], source: "DATAMODE_ADMIN_TOKEN",
                    key: "admin.token", message: "expected a token of visible ASCII characters without spaces"),
        BadOverride(flags: ConfigOverrides(stateDirectory: ""), environment: [:], source: "--state-dir", key: "state-dir",
                    message: "expected a directory path"),
    ]

    @Test("a bad override names the flag or variable", arguments: badOverrides)
    func badOverride(_ bad: BadOverride) {
        let overrides = bad.flags.overriding(.fromEnvironment(bad.environment))
        do {
            let configuration = try ProxyConfiguration.defaults.applying(overrides)
            Issue.record("applied a bad override: \(configuration)")
        } catch {
            #expect(error.source == bad.source)
            #expect(error.key == bad.key)
            #expect(error.line == nil)
            #expect(error.message.contains(bad.message), "\(error)")
        }
    }
}

@Suite("Snapshots and start-up checks")
struct SnapshotTests {
    @Test("the snapshot compiles the file's rules and variants")
    func compiledPolicy() throws {
        let configuration = try parse("""
            rules:
              - {name: r, tags: {allow-expensive: false}}
            variants:
              - {id: v, match: "http://a.example/*", target: "http://b.example/$1"}
            """)
        let snapshot = try ConfigurationSnapshot(configuration: configuration)
        #expect(snapshot.policy.rules.map(\.name) == ["r"])
        #expect(snapshot.policy.variants.map(\.id) == ["v"])
    }

    /// The parser compiles the policy to check it; the snapshot reuses that compile unless the policy's inputs changed.
    @Test("a parsed policy is not compiled again")
    func parsedPolicyReused() throws {
        var configuration = try parse("""
            rules:
              - {name: r, tags: {allow-expensive: false}}
            """)
        let parsed = try #require(configuration.parsedPolicy.snapshot)
        #expect(try ConfigurationSnapshot(configuration: configuration).policy.index === parsed.index)
        configuration.rules = []
        #expect(configuration.parsedPolicy.snapshot == nil)
        #expect(try ConfigurationSnapshot(configuration: configuration).policy.rules.isEmpty)
    }

    /// A reload compiles the file's policy once, with the admin API's variants; a failure still says whose it is.
    @Test("API variants compile with the file's, and a conflict is blamed on the right side")
    func apiVariants() throws {
        let configuration = try parse("""
            variants:
              - {id: v, match: "http://a.example/*", target: "http://b.example/$1"}
            """)
        let api = Variant(id: "w", match: "http://c.example/*", resource: .target("http://d.example/$1", redirect: false))
        let snapshot = try ConfigurationSnapshot(configuration: configuration, apiVariants: [api])
        #expect(snapshot.policy.variants.map(\.id) == ["v", "w"])
        #expect(snapshot.policy.variants.map(\.source) == [.config, .api])

        var taken = api
        taken.id = "v"
        do {
            _ = try ConfigurationSnapshot(configuration: configuration, apiVariants: [taken])
            Issue.record("an API variant took a file variant's id")
        } catch {
            guard case .apiVariants(let problem) = error else { Issue.record("blamed on the file: \(error)"); return }
            #expect(problem.subject.contains("v"))
        }

        // Not parsed (the parser would refuse it): built in code, so only the snapshot compiles it.
        let broken = ProxyConfiguration(variants: [
            Variant(id: "v", match: "http://a.example/*", resource: .target("http://b.example/$3", redirect: false)),
        ])
        do {
            _ = try ConfigurationSnapshot(configuration: broken, apiVariants: [api])
            Issue.record("compiled a target with a capture its pattern lacks")
        } catch {
            guard case .configuration(let problem) = error else { Issue.record("blamed on the API: \(error)"); return }
            #expect(problem.message.contains("$3"), "\(problem)")
        }
    }

    @Test("the admin API off loopback needs a token")
    func adminExposure() throws {
        let exposed = try parse("\nadmin:\n  listen: 0.0.0.0:8878\n")
        #expect(throws: ConfigError.self) { try exposed.validateForStartup() }
        do {
            _ = try ConfigurationSnapshot(configuration: exposed)
            Issue.record("started an exposed admin API without a token")
        } catch {
            #expect(error.source == "test.yaml")
            #expect(error.key == "admin.token")
            #expect(error.line == 3)
        }
        // The token may come from the environment.
        let withToken = try exposed.applying(.fromEnvironment(["DATAMODE_ADMIN_TOKEN": "t0ken"]))
        _ = try ConfigurationSnapshot(configuration: withToken)
        // An override that exposes it is named.
        do {
            _ = try ConfigurationSnapshot(configuration: try ProxyConfiguration.defaults.applying(
                .fromEnvironment(["DATAMODE_ADMIN_LISTEN": "0.0.0.0:8878"])))
            Issue.record("started an exposed admin API without a token")
        } catch {
            #expect(error.source == "DATAMODE_ADMIN_LISTEN")
            #expect(error.key == "admin.token")
        }
        // Loopback needs none.
        _ = try ConfigurationSnapshot(configuration: try parse("admin: {listen: \"[::1]:0\"}"))
    }
}

@Suite("Listen addresses")
struct ListenAddressTests {
    @Test("valid addresses", arguments: [
        ("127.0.0.1:8877", "127.0.0.1", 8877, true, "127.0.0.1:8877"),
        ("0.0.0.0:0", "0.0.0.0", 0, false, "0.0.0.0:0"),
        ("[::1]:8877", "::1", 8877, true, "[::1]:8877"),
        ("[0:0:0:0:0:0:0:1]:80", "::1", 80, true, "[::1]:80"),
        ("[::]:65535", "::", 65535, false, "[::]:65535"),
        ("127.8.9.10:1", "127.8.9.10", 1, true, "127.8.9.10:1"),
        ("192.168.0.1:3128", "192.168.0.1", 3128, false, "192.168.0.1:3128"),
        ("[::ffff:127.0.0.1]:1", "::ffff:127.0.0.1", 1, true, "[::ffff:127.0.0.1]:1"),
    ] as [(String, String, Int, Bool, String)])
    func valid(_ text: String, _ host: String, _ port: Int, _ loopback: Bool, _ description: String) throws {
        let address = try #require(ListenAddress(text))
        #expect(address.host == host)
        #expect(Int(address.port) == port)
        #expect(address.isLoopback == loopback)
        #expect(address.description == description)
        #expect(ListenAddress(address.description) == address)
    }

    @Test("invalid addresses", arguments: [
        "", "127.0.0.1", ":8877", "localhost:8877", "::1:8877", "[::1]", "[::1]8877", "[127.0.0.1]:80",
        "127.0.0.1:65536", "127.0.0.1:-1", "127.0.0.1:80a", "127.0.0.1:+80", " 127.0.0.1:80", "256.0.0.1:80",
        "[fe80::1%eth0]:80", "127.0.0.1:123456",
    ])
    func invalid(_ text: String) {
        #expect(ListenAddress(text) == nil)
    }
}
