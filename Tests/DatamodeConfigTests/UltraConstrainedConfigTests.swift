import DatamodeConfig
import DatamodePolicy
import Foundation
import Testing

/// SPEC §15 in the configuration: the new mode names (file, `--mode`, `DATAMODE_MODE`),
/// `tags.defaults.allow-ultra-constrained`, rules that set the tag, and `when: ultra-constrained`.
@Suite("Ultra-constrained configuration")
struct UltraConstrainedConfigTests {
    @Test("tags.defaults.allow-ultra-constrained is false by default and in the shipped file")
    func defaultIsFalse() throws {
        #expect(ProxyConfiguration.defaults.tags.defaults.allowUltraConstrained == false)
        #expect(try parse("").tags.defaults.allowUltraConstrained == false)
        #expect(try ProxyConfiguration.load(path: shippedConfigPath).tags.defaults.allowUltraConstrained == false)
        let text = try String(contentsOfFile: shippedConfigPath, encoding: .utf8)
        #expect(text.split(separator: "\n").contains("    allow-ultra-constrained: false"))
    }

    @Test("tags.defaults.allow-ultra-constrained: true opts every request in, leaving the other defaults")
    func defaultCanBeTrue() throws {
        let configuration = try parse("tags:\n  defaults:\n    allow-ultra-constrained: true\n")
        #expect(configuration.tags.defaults
            == RequestTags(allowConstrained: true, allowExpensive: true, allowUltraConstrained: true))
    }

    @Test("a bad tags.defaults.allow-ultra-constrained names its key and line")
    func badDefault() {
        expectError(ErrorCase("tags:\n  defaults:\n    allow-ultra-constrained: sometimes",
                              key: "tags.defaults.allow-ultra-constrained", line: 3,
                              #"expected true or false, got "sometimes""#))
        expectError(ErrorCase("tags:\n  defaults:\n    allow-ultraconstrained: true",
                              key: "tags.defaults.allow-ultraconstrained", line: 3, "unknown key"))
    }

    @Test("a rule may set allow-ultra-constrained, alone or with the others")
    func rules() throws {
        let configuration = try parse("""
            rules:
              - name: maps-over-satellite
                match: {host: "tiles.example"}
                tags: {allow-ultra-constrained: true}
              - name: all-three
                tags: {allow-constrained: false, allow-expensive: false, allow-ultra-constrained: false}
                override: true
            """)
        #expect(configuration.rules == [
            Rule(name: "maps-over-satellite", match: RuleMatch(host: "tiles.example"),
                 tags: TagAssignment(allowUltraConstrained: true)),
            Rule(name: "all-three", match: RuleMatch(),
                 tags: TagAssignment(allowConstrained: false, allowExpensive: false, allowUltraConstrained: false),
                 override: true),
        ])
        expectError(ErrorCase("rules:\n  - name: r\n    tags: {allow-ultra-constrained: perhaps}",
                              key: "rules[0].tags.allow-ultra-constrained", line: 3, "expected true or false"))
        expectError(ErrorCase("rules:\n  - name: r\n    tags: {}", key: "rules[0].tags", line: 3, "allow-ultra-constrained"))
    }

    @Test("when: ultra-constrained")
    func variantWhen() throws {
        let configuration = try parse("""
            variants:
              - id: tiles-low
                match: "http://tiles.example/*.png"
                target: "http://tiles.example/low/$1.png"
                when: ultra-constrained
            """)
        #expect(configuration.variants.first?.when == .ultraConstrained)
    }

    static let modes: [(String, DataMode)] = [
        ("ultra-constrained", DataMode(constrained: false, expensive: false, ultraConstrained: true)),
        ("constrained-ultra-constrained", DataMode(constrained: true, expensive: false, ultraConstrained: true)),
        ("expensive-ultra-constrained", DataMode(constrained: false, expensive: true, ultraConstrained: true)),
        ("constrained-expensive-ultra-constrained", DataMode(constrained: true, expensive: true, ultraConstrained: true)),
        ("satellite", DataMode(constrained: true, expensive: true, ultraConstrained: true)),
        ("SATELLITE", DataMode(constrained: true, expensive: true, ultraConstrained: true)),
    ]

    @Test("the new mode names in the file, --mode and DATAMODE_MODE", arguments: modes)
    func modeNames(_ name: String, _ expected: DataMode) throws {
        let file = try parse("mode: \(name)")
        #expect(file.mode == expected)
        #expect(file.modeSource == .config)
        let flag = try parse("mode: normal").applying(ConfigOverrides(mode: name))
        #expect(flag.mode == expected)
        #expect(flag.modeSource == .flag)
        let environment = try parse("").applying(.fromEnvironment(["DATAMODE_MODE": name]))
        #expect(environment.effectiveMode == expected)
        #expect(environment.modeSource == .flag)
    }

    @Test("an unknown mode's error lists the new names and satellite")
    func unknownModeListsEveryName() throws {
        expectError(ErrorCase("mode: ultra", key: "mode", line: 1, "constrained-expensive-ultra-constrained"))
        expectError(ErrorCase("mode: ultra", key: "mode", line: 1, "satellite"))
    }
}
