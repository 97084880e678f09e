import DatamodeConfig
import DatamodePolicy
import Foundation
import Testing

@Suite("Rules")
struct RuleTests {
    @Test("a rule with every criterion")
    func fullRule() throws {
        let configuration = try parse("""
            rules:
              - name: videos
                match:
                  host: "*.video.example"
                  path: "*.mp4"
                  method: GET
                  header: {Accept: "video/*", X-Client: app}
                  client: 10.0.0.0/8
                tags: {allow-constrained: false, allow-expensive: false}
                override: true
              - name: downloads
                tags:
                  allow-expensive: false
            """)
        #expect(configuration.rules == [
            Rule(name: "videos",
                 match: RuleMatch(host: "*.video.example", path: "*.mp4", method: "GET",
                                  header: ["Accept": "video/*", "X-Client": "app"], client: CIDR("10.0.0.0/8")),
                 tags: TagAssignment(allowConstrained: false, allowExpensive: false), override: true),
            Rule(name: "downloads", match: RuleMatch(), tags: TagAssignment(allowConstrained: nil, allowExpensive: false),
                 override: false),
        ])
    }

    static let badRules: [ErrorCase] = [
        ErrorCase("rules:\n  - match: {host: a}\n    tags: {allow-expensive: false}", key: "rules[0].name", line: 2,
                  "missing; expected the rule's name"),
        ErrorCase("rules:\n  - name: \"\"\n    tags: {allow-expensive: false}", key: "rules[0].name", line: 2, "expected a rule name"),
        ErrorCase("rules:\n  - name: r\n    match: {host: a}", key: "rules[0].tags", line: 2, "missing; expected the tags the rule sets"),
        ErrorCase("rules:\n  - name: r\n    tags: {}", key: "rules[0].tags", line: 3,
                  "a rule must set at least one of allow-constrained, allow-expensive, allow-ultra-constrained"),
        ErrorCase("rules:\n  - name: r\n    tags: {allow-expensive: maybe}", key: "rules[0].tags.allow-expensive", line: 3,
                  "expected true or false"),
        ErrorCase("rules:\n  - name: r\n    tags: {allow-expensive: false}\n    override: yes", key: "rules[0].override", line: 4,
                  "expected true or false"),
        ErrorCase("rules:\n  - name: r\n    match:\n      client: 10.0.0.0/40\n    tags: {allow-expensive: false}",
                  key: "rules[0].match.client", line: 4, "expected a CIDR block"),
        ErrorCase("rules:\n  - name: r\n    match: {method: \"GET POST\"}\n    tags: {allow-expensive: false}",
                  key: "rules[0].match.method", line: 3, "expected an HTTP method"),
        ErrorCase("rules:\n  - name: r\n    match: {header: Accept}\n    tags: {allow-expensive: false}",
                  key: "rules[0].match.header", line: 3, "expected a mapping of header name to value glob"),
        ErrorCase("rules:\n  - name: r\n    match:\n      header: {\"Bad Name\": x}\n    tags: {allow-expensive: false}",
                  key: "rules[0].match.header.Bad Name", line: 4, "expected a header field name"),
        ErrorCase("rules:\n  - name: r\n    match:\n      header: {accept: x, Accept: y}\n    tags: {allow-expensive: false}",
                  key: "rules[0].match.header.Accept", line: 4, "given twice"),
        ErrorCase("rules:\n  - name: r\n    match: {host: \"\"}\n    tags: {allow-expensive: false}",
                  key: "rules[0].match.host", line: 3, "expected a host glob"),
        ErrorCase("rules:\n  - name: r\n    match: {path: \"\"}\n    tags: {allow-expensive: false}",
                  key: "rules[0].match.path", line: 3, "expected a path glob"),
        ErrorCase("rules:\n  - name: r\n    tags: {allow-expensive: false}\n  - name: r\n    tags: {allow-constrained: false}",
                  key: "rules[1].name", line: 4, #"duplicate rule name "r" (first at line 2)"#),
        // Found by the policy compiler, placed on the rule's field.
        ErrorCase("rules:\n  - name: r\n    match:\n      host: \"a b\"\n    tags: {allow-expensive: false}",
                  key: "rules[0].match.host", line: 4, #"rule "r": match.host"#),
    ]

    @Test("a bad rule names its key and line", arguments: badRules)
    func badRule(_ errorCase: ErrorCase) {
        expectError(errorCase)
    }
}

@Suite("Variants")
struct VariantTests {
    /// A directory with `variants/poster.jpg` and `variants/promo.jpg` (`variants/` is the default variants-dir).
    static func fixture() throws -> String {
        let directory = try makeTemporaryDirectory()
        try FileManager.default.createDirectory(atPath: directory + "/variants", withIntermediateDirectories: true)
        _ = FileManager.default.createFile(atPath: directory + "/variants/poster.jpg", contents: Data([1, 2, 3]))
        _ = FileManager.default.createFile(atPath: directory + "/variants/promo.jpg", contents: Data([1, 2, 3]))
        return directory
    }

    @Test("URL and file variants, with their defaults")
    func bothKinds() throws {
        let directory = try Self.fixture()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let configuration = try parse("""
            variants:
              - id: hero-small
                match: "http://cdn.example/img/*.jpg"
                target: "http://cdn.example/img/$1@small.jpg"
              - id: hero-redirect
                match: "http://cdn.example/hero/*.jpg"
                target: "http://cdn.example/small/$1.jpg"
                action: redirect
                when: always
              - id: promo
                match: "http://cdn.example/promo.mp4"
                file: "variants/promo.jpg"
                content-type: image/jpeg
                when: constrained
              - id: poster
                match: "http://cdn.example/poster.mp4"
                file: ./variants/../variants/poster.jpg
                when: expensive
              - id: absolute
                match: "http://cdn.example/a.mp4"
                file: \(directory)/variants/poster.jpg
            """, base: directory)
        #expect(configuration.variants == [
            Variant(id: "hero-small", match: "http://cdn.example/img/*.jpg",
                    resource: .target("http://cdn.example/img/$1@small.jpg", redirect: false), when: .disallowed, source: .config),
            Variant(id: "hero-redirect", match: "http://cdn.example/hero/*.jpg",
                    resource: .target("http://cdn.example/small/$1.jpg", redirect: true), when: .always, source: .config),
            Variant(id: "promo", match: "http://cdn.example/promo.mp4",
                    resource: .file(path: directory + "/variants/promo.jpg", contentType: "image/jpeg"), when: .constrained),
            Variant(id: "poster", match: "http://cdn.example/poster.mp4",
                    resource: .file(path: directory + "/variants/poster.jpg", contentType: nil), when: .expensive),
            Variant(id: "absolute", match: "http://cdn.example/a.mp4",
                    resource: .file(path: directory + "/variants/poster.jpg", contentType: nil)),
        ])
    }

    @Test("a relative file is found next to a loaded config file, not in the working directory")
    func relativeToConfigFile() throws {
        let directory = try Self.fixture()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let path = directory + "/datamode.yaml"
        try """
            variants:
              - {id: promo, match: "http://cdn.example/promo.mp4", file: variants/promo.jpg}
            """.write(toFile: path, atomically: true, encoding: .utf8)
        let configuration = try ProxyConfiguration.load(path: path)
        #expect(configuration.variants.first?.resource == .file(path: directory + "/variants/promo.jpg", contentType: nil))
    }

    static let badVariants: [ErrorCase] = [
        ErrorCase("variants:\n  - match: http://a.example/\n    target: http://b.example/", key: "variants[0].id", line: 2,
                  "missing; expected the variant's id"),
        ErrorCase("variants:\n  - id: \"a b\"\n    match: http://a.example/\n    target: http://b.example/", key: "variants[0].id", line: 2,
                  "expected an id of letters, digits"),
        ErrorCase("variants:\n  - id: v\n    target: http://b.example/", key: "variants[0].match", line: 2, "missing; expected an absolute URL pattern"),
        ErrorCase("variants:\n  - id: v\n    match: http://a.example/", key: "variants[0].target", line: 2,
                  #"variant "v" needs a target URL or a file (exactly one)"#),
        ErrorCase("variants:\n  - id: v\n    match: http://a.example/\n    target: http://b.example/\n    file: poster.jpg",
                  key: "variants[0].file", line: 5, #"variant "v" has both target and file; give exactly one"#),
        ErrorCase("variants:\n  - id: v\n    match: http://a.example/\n    target: http://b.example/\n    content-type: image/jpeg",
                  key: "variants[0].content-type", line: 5, "content-type applies only to a file variant"),
        ErrorCase("variants:\n  - id: v\n    match: http://a.example/\n    file: poster.jpg\n    action: redirect",
                  key: "variants[0].action", line: 5, "action applies only to a target variant"),
        ErrorCase("variants:\n  - id: v\n    match: http://a.example/\n    target: http://b.example/\n    action: proxy",
                  key: "variants[0].action", line: 5, #"expected forward or redirect, got "proxy""#),
        ErrorCase("variants:\n  - id: v\n    match: http://a.example/\n    target: http://b.example/\n    when: sometimes",
                  key: "variants[0].when", line: 5, #"expected disallowed, constrained, expensive, ultra-constrained or always, got "sometimes""#),
        ErrorCase("variants:\n  - id: v\n    match: http://a.example/\n    file: poster.jpg\n    content-type: jpeg",
                  key: "variants[0].content-type", line: 5, "expected a media type"),
        ErrorCase("variants:\n  - id: v\n    match: http://a.example/\n    file: missing.jpg",
                  key: "variants[0].file", line: 4, #"variant "v": file"#),
        ErrorCase("variants:\n  - id: v\n    match: http://a.example/\n    file: variants",
                  key: "variants[0].file", line: 4, "is not a regular file"),
        ErrorCase("variants:\n  - id: v\n    match: http://a.example/\n    target: http://b.example/\n"
                  + "  - id: v\n    match: http://c.example/\n    target: http://d.example/",
                  key: "variants[1].id", line: 5, #"duplicate variant id "v" (first at line 2)"#),
        // Found by the policy compiler and placed on the variant's field and line.
        ErrorCase("variants:\n  - id: ok\n    match: http://a.example/\n    target: http://b.example/\n"
                  + "  - id: thumbs\n    match: \"http://cdn.example/*/img/*.jpg\"\n    target: \"http://cdn.example/$1/$3.jpg\"",
                  key: "variants[1].target", line: 7, #"variant "thumbs": target"#),
        ErrorCase("variants:\n  - id: v\n    match: cdn.example/x.jpg\n    target: http://b.example/",
                  key: "variants[0].match", line: 3, #"variant "v": match"#),
        ErrorCase("variants:\n  - id: v\n    match: http://a.example/\n    target: /relative.jpg",
                  key: "variants[0].target", line: 4, #"variant "v": target"#),
    ]

    @Test("a bad variant names its key and line", arguments: badVariants)
    func badVariant(_ errorCase: ErrorCase) throws {
        let directory = try Self.fixture()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        expectError(errorCase, base: directory)
    }

    @Test("a missing file's error names the absolute path")
    func missingFilePath() throws {
        let directory = try Self.fixture()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let error = parseError("variants:\n  - {id: v, match: \"http://a.example/\", file: nope/missing.jpg}", base: directory)
        #expect(error?.message == #"variant "v": file "\#(directory)/nope/missing.jpg" does not exist"#)
        #expect(error?.line == 2)
    }
}
