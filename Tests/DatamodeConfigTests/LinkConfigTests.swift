import DatamodeConfig
import DatamodePolicy
import Foundation
import Testing

/// SPEC §10 configuration: `profiles`, `conditions`, `shaping-scope`, the built-in profiles and which profile is
/// in force.
@Suite("Link conditions: config")
struct LinkConfigTests {
    @Test("Rates: k/M/G and kbit/Mbit/Gbit are powers of 1000, decimals allowed", arguments: [
        ("400kbit", UInt64(400_000)), ("1.44Mbit", 1_440_000), ("2Mbit", 2_000_000), ("1Gbit", 1_000_000_000),
        ("730k", 730_000), ("2M", 2_000_000), ("1G", 1_000_000_000), ("64kbit", 64_000), ("562.5k", 562_500),
        ("9000", 9_000), ("8.1Mbit", 8_100_000), ("1.35 Mbit", 1_350_000),
    ])
    func rates(_ text: String, _ bits: UInt64) throws {
        let configuration = try parse("profiles:\n  p: {down: \(text), up: \(text)}\n")
        #expect(configuration.link.profiles["p"]?.down == bits)
        #expect(configuration.link.profiles["p"]?.up == bits)
    }

    @Test("Latencies: ms or s with decimals, 0 allowed", arguments: [
        ("600ms", Duration.milliseconds(600)), ("562.5ms", .microseconds(562_500)), ("0.2s", .milliseconds(200)),
        ("0", .zero), ("0ms", .zero),
    ])
    func latencies(_ text: String, _ duration: Duration) throws {
        let configuration = try parse("profiles:\n  p: {down: 1M, up: 1M, latency: \(text)}\n")
        #expect(configuration.link.profiles["p"]?.latency == duration)
    }

    static let errors: [ErrorCase] = [
        ErrorCase("profiles:\n  p: {down: fast, up: 1M}", key: "profiles.p.down", line: 2,
                  "expected a rate in bits per second such as 400kbit, 1.44Mbit, 2M or 1Gbit"),
        ErrorCase("profiles:\n  p: {down: 2MB, up: 1M}", key: "profiles.p.down", line: 2, "expected a rate"),
        ErrorCase("profiles:\n  p: {down: 1.2345M, up: 1M}", key: "profiles.p.down", line: 2, "expected a rate"),
        ErrorCase("profiles:\n  p: {down: 500, up: 1M}", key: "profiles.p.down", line: 2, "from 1kbit to 100Gbit"),
        ErrorCase("profiles:\n  p: {down: 1M}", key: "profiles.p", line: 2, "needs an up rate"),
        ErrorCase("profiles:\n  p: {up: 1M}", key: "profiles.p", line: 2, "needs a down rate"),
        ErrorCase("profiles:\n  p: {down: 1M, up: 1M, latency: 2}", key: "profiles.p.latency", line: 2,
                  "expected a latency such as 600ms"),
        ErrorCase("profiles:\n  p: {down: 1M, up: 1M, latency: 2m}", key: "profiles.p.latency", line: 2, "expected a latency"),
        ErrorCase("profiles:\n  p: {down: 1M, up: 1M, latency: 10ms, jitter: 20ms}", key: "profiles.p.jitter", line: 2,
                  "larger than the latency"),
        ErrorCase("profiles:\n  p: {down: 1M, up: 1M, loss: 10%}", key: "profiles.p.loss", line: 2, "unknown key"),
        ErrorCase("profiles:\n  \"a b\": {down: 1M, up: 1M}", key: "profiles.a b", line: 2, "expected a profile name"),
        ErrorCase("conditions:\n  constrained: {profile: dialup}", key: "conditions.constrained.profile", line: 2,
                  #"unknown profile "dialup"; known: devtools-3g"#),
        ErrorCase("conditions:\n  metered: {profile: nlc-3g}", key: "conditions.metered", line: 2, "unknown key"),
        ErrorCase("conditions:\n  constrained: nlc-3g", key: "conditions.constrained", line: 2, "expected a mapping {profile: NAME}"),
        ErrorCase("shaping-scope: host", key: "shaping-scope", line: 1, "expected client or link"),
    ]

    @Test("Bad values name the key and line", arguments: errors)
    func badValues(_ errorCase: ErrorCase) {
        expectError(errorCase)
    }

    @Test("Defaults: the built-in profiles of SPEC §10, no profile for any condition, client scope")
    func defaults() throws {
        let link = try parse("").link
        #expect(link.scope == .client)
        #expect(link.conditions == ConditionProfiles())
        let table: [(String, UInt64, UInt64, Duration)] = [
            ("devtools-3g", 400_000, 400_000, .milliseconds(2000)),
            ("devtools-slow-4g", 1_440_000, 675_000, .microseconds(562_500)),
            ("devtools-fast-4g", 8_100_000, 1_350_000, .milliseconds(165)),
            ("nlc-3g", 780_000, 330_000, .milliseconds(200)),
            ("nlc-dsl", 2_000_000, 256_000, .milliseconds(10)),
            ("nlc-lte", 50_000_000, 10_000_000, .milliseconds(115)),
            ("nlc-very-bad-network", 1_000_000, 1_000_000, .milliseconds(1000)),
            ("geo-satellite", 12_000_000, 3_000_000, .milliseconds(600)),
        ]
        #expect(link.profiles.count == table.count)
        for (name, down, up, latency) in table {
            let profile = try #require(link.profiles[name])
            #expect(profile.down == down && profile.up == up && profile.latency == latency && profile.jitter == .zero, "\(name)")
        }
    }

    @Test("A file profile overrides a built-in (keeping the fields it leaves out) and adds new ones")
    func overridesAndAdditions() throws {
        let link = try parse("""
            profiles:
              nlc-3g: {latency: 300ms, jitter: 50ms}
              my-sat: {down: 2Mbit, up: 256kbit, latency: 600ms}
            conditions:
              constrained: {profile: my-sat}
              expensive: {profile: nlc-3g}
              ultra-constrained: {profile: null}
            shaping-scope: link
            """).link
        #expect(link.profiles["nlc-3g"] == LinkProfile(name: "nlc-3g", down: 780_000, up: 330_000, latency: .milliseconds(300),
                                                       jitter: .milliseconds(50)))
        #expect(link.profiles["my-sat"] == LinkProfile(name: "my-sat", down: 2_000_000, up: 256_000, latency: .milliseconds(600)))
        #expect(link.conditions == ConditionProfiles(constrained: "my-sat", expensive: "nlc-3g", ultraConstrained: nil))
        #expect(link.scope == .link)
    }

    @Test("The profile in force: API > ultra-constrained > constrained > expensive > none")
    func resolution() throws {
        let link = try parse("""
            conditions:
              constrained: {profile: nlc-3g}
              expensive: {profile: nlc-lte}
              ultra-constrained: {profile: geo-satellite}
            """).link
        func resolve(_ api: String?, _ mode: String) -> (String?, ProfileSource, DataCondition?) {
            let resolution = ProfileResolution(api: api, mode: DataMode(name: mode)!, link: link)
            return (resolution.profile?.name, resolution.source, resolution.condition)
        }
        #expect(resolve(nil, "normal") == (nil, .none, nil))
        #expect(resolve(nil, "expensive") == ("nlc-lte", .mode, .expensive))
        #expect(resolve(nil, "constrained-expensive") == ("nlc-3g", .mode, .constrained))
        #expect(resolve(nil, "satellite") == ("geo-satellite", .mode, .ultraConstrained))
        #expect(resolve("devtools-3g", "satellite") == ("devtools-3g", .api, nil))
        #expect(resolve("devtools-3g", "normal") == ("devtools-3g", .api, nil))
        // An API profile the configuration no longer has (a reload dropped it) falls back to the mode's.
        #expect(resolve("gone", "expensive") == ("nlc-lte", .mode, .expensive))
        // A condition without a mapping gives way to the next one that has one.
        let partial = try parse("conditions:\n  expensive: {profile: nlc-dsl}\n").link
        #expect(ProfileResolution(api: nil, mode: DataMode(name: "satellite")!, link: partial).profile?.name == "nlc-dsl")
    }
}
