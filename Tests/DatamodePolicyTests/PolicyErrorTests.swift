import DatamodePolicy
import Testing

/// Compile-time validation: every invalid rule or variant is refused with a subject an operator can find.
@Suite("Policy validation")
struct PolicyErrorTests {
    struct Row: Sendable, CustomStringConvertible {
        var name: String
        var rules: [Rule] = []
        var variants: [Variant] = []
        var subject: String
        var message: String
        var description: String { name }
    }

    static func v(_ id: String = "v", match: String = "http://cdn.example/*",
                  target: String = "http://low.example/$1", source: VariantSource = .config) -> Variant {
        Variant(id: id, match: match, resource: .target(target, redirect: false), source: source)
    }

    static func file(_ path: String, _ type: String? = nil) -> Variant {
        Variant(id: "f", match: "http://cdn.example/a.mp4", resource: .file(path: path, contentType: type))
    }

    static func r(_ name: String = "r", _ match: RuleMatch = RuleMatch(),
                  tags: TagAssignment = TagAssignment(allowConstrained: false)) -> Rule {
        Rule(name: name, match: match, tags: tags)
    }

    static let rows: [Row] = [
        // Variant ids
        Row(name: "empty id", variants: [v("")], subject: "variant \"\"", message: "id must not be empty"),
        Row(name: "id with a space", variants: [v("hero small")], subject: "variant \"hero small\"",
            message: "letters, digits"),
        Row(name: "id with a slash", variants: [v("a/b")], subject: "variant \"a/b\"", message: "letters, digits"),
        Row(name: "id with non-ASCII", variants: [v("héro")], subject: "variant \"héro\"", message: "letters, digits"),
        Row(name: "duplicate id", variants: [v("dup"), v("dup", match: "http://other.example/*")],
            subject: "variant \"dup\"", message: "more than one variant"),
        Row(name: "API variant reusing a config id", variants: [v("dup"), v("dup", source: .api)],
            subject: "variant \"dup\"", message: "config variant"),
        // match
        Row(name: "match without scheme", variants: [v(match: "cdn.example/*")], subject: "variant \"v\"",
            message: "absolute http:// or https://"),
        Row(name: "match with another scheme", variants: [v(match: "ftp://cdn.example/*")], subject: "variant \"v\"",
            message: "absolute http:// or https://"),
        Row(name: "match relative", variants: [v(match: "/img/*")], subject: "variant \"v\"",
            message: "absolute http:// or https://"),
        Row(name: "match with an empty host", variants: [v(match: "http:///img/*")], subject: "variant \"v\"",
            message: "empty host"),
        Row(name: "match with only a port", variants: [v(match: "http://:80/img/*")], subject: "variant \"v\"",
            message: "empty host"),
        Row(name: "match with a space", variants: [v(match: "http://cdn.example/a *")], subject: "variant \"v\"",
            message: "space or control"),
        Row(name: "match with CR LF", variants: [v(match: "http://cdn.example/a\r\n*")], subject: "variant \"v\"",
            message: "space or control"),
        Row(name: "empty match", variants: [v(match: "")], subject: "variant \"v\"", message: "absolute"),
        // target
        Row(name: "relative target", variants: [v(target: "/small/$1")], subject: "variant \"v\"",
            message: "absolute http:// or https://"),
        Row(name: "target with another scheme", variants: [v(target: "file:///etc/passwd")], subject: "variant \"v\"",
            message: "absolute http:// or https://"),
        Row(name: "target with an empty host", variants: [v(target: "http:///x")], subject: "variant \"v\"",
            message: "empty host"),
        Row(name: "target with CR LF (header injection)", variants: [v(target: "http://a.example/\r\nX: y")],
            subject: "variant \"v\"", message: "control"),
        Row(name: "$0", variants: [v(target: "http://low.example/$0")], subject: "variant \"v\"", message: "$0"),
        Row(name: "$3 with two captures", variants: [v(match: "http://cdn.example/*/*", target: "http://low.example/$3")],
            subject: "variant \"v\"", message: "$3 but match has only 2"),
        Row(name: "$2 with one capture", variants: [v(target: "http://low.example/$2")], subject: "variant \"v\"",
            message: "$2 but match has only 1"),
        Row(name: "$1 with an exact match", variants: [v(match: "http://cdn.example/a.jpg", target: "http://low.example/$1")],
            subject: "variant \"v\"", message: "no *"),
        // file
        Row(name: "empty file path", variants: [file("")], subject: "variant \"f\"", message: "file path must not be empty"),
        Row(name: "NUL in file path", variants: [file("a\u{0}b")], subject: "variant \"f\"", message: "NUL"),
        Row(name: "empty content type", variants: [file("a.jpg", "")], subject: "variant \"f\"",
            message: "content-type must not be empty"),
        Row(name: "CR LF in content type", variants: [file("a.jpg", "image/jpeg\r\nX-Evil: 1")], subject: "variant \"f\"",
            message: "control character"),
        // rules
        Row(name: "rule without a name", rules: [r("ok"), r("")], subject: "rule #2", message: "name must not be empty"),
        Row(name: "rule setting no tag", rules: [r("noop", tags: TagAssignment())], subject: "rule \"noop\"",
            message: "neither allow-constrained nor allow-expensive"),
        Row(name: "empty host pattern", rules: [r("h", RuleMatch(host: ""))], subject: "rule \"h\"",
            message: "match.host must not be empty"),
        Row(name: "host pattern with a space", rules: [r("h", RuleMatch(host: "a .example"))], subject: "rule \"h\"",
            message: "match.host"),
        Row(name: "empty path pattern", rules: [r("p", RuleMatch(path: ""))], subject: "rule \"p\"",
            message: "match.path must not be empty"),
        Row(name: "path pattern with a space", rules: [r("p", RuleMatch(path: "/a b"))], subject: "rule \"p\"",
            message: "match.path"),
        Row(name: "empty method", rules: [r("m", RuleMatch(method: ""))], subject: "rule \"m\"", message: "match.method"),
        Row(name: "method with a space", rules: [r("m", RuleMatch(method: "G ET"))], subject: "rule \"m\"",
            message: "match.method"),
        Row(name: "empty header name", rules: [r("hd", RuleMatch(header: ["": "x"]))], subject: "rule \"hd\"",
            message: "match.header name"),
        Row(name: "header name with a colon", rules: [r("hd", RuleMatch(header: ["a:b": "x"]))], subject: "rule \"hd\"",
            message: "match.header name"),
        Row(name: "header value with LF", rules: [r("hd", RuleMatch(header: ["Accept": "a\nb"]))], subject: "rule \"hd\"",
            message: "control character"),
    ]

    @Test(arguments: rows)
    func refuses(row: Row) {
        do {
            _ = try PolicySnapshot(tags: TagSettings(), rules: row.rules, variants: row.variants)
            Issue.record("compiled")
        } catch {
            #expect(error.subject == row.subject)
            #expect(error.message.contains(row.message), "message: \(error.message)")
            #expect(error.description.hasPrefix(row.subject + ": "))
        }
    }

    @Test func replacingAPIVariantsValidatesToo() throws {
        let snapshot = policy(variants: [Self.v("cfg")])
        #expect(throws: PolicyError.self) { try snapshot.replacingAPIVariants([Self.v("cfg")]) }
        #expect(throws: PolicyError.self) { try snapshot.replacingAPIVariants([Self.v("bad id")]) }
        #expect(throws: PolicyError.self) {
            try snapshot.replacingAPIVariants([Self.v("a"), Self.v("a", match: "http://b.example/*")])
        }
        #expect(try snapshot.replacingAPIVariants([Self.v("ok")]).variants.count == 2)
    }

    @Test(arguments: [
        Self.v("a.b_c-D9"),
        Self.v(match: "https://cdn.example:8443/*", target: "https://cdn.example/$1"),
        Self.v(match: "http://*/*", target: "http://$1/low/$2"),
        Self.v(match: "http://cdn.example/a.jpg", target: "http://low.example/price$"),
        Self.v(match: "http://cdn.example/*", target: "http://low.example/$a$"),
        Self.v(match: "http://cdn.example/*/*/*/*/*/*/*/*/*", target: "http://low.example/$9$8$1"),
        Self.file("relative/p.jpg"),
        Self.file("/abs/p.jpg", "image/jpeg; q=1"),
    ])
    func accepts(variant: Variant) throws {
        _ = try PolicySnapshot(tags: TagSettings(), rules: [], variants: [variant])
    }

    @Test func acceptsEveryRuleCriterion() throws {
        let rule = Rule(name: "all", match: RuleMatch(host: "*.example", path: "/v/*", method: "GET",
                                                      header: ["Accept": "*", "X-Empty": ""], client: CIDR("::1/128")),
                        tags: TagAssignment(allowConstrained: false, allowExpensive: true), override: true)
        let snapshot = try PolicySnapshot(tags: TagSettings(), rules: [rule, rule], variants: [])
        #expect(snapshot.rules == [rule, rule])
    }

    @Test func emptySnapshot() {
        #expect(PolicySnapshot.empty.rules.isEmpty)
        #expect(PolicySnapshot.empty.variants.isEmpty)
        #expect(PolicySnapshot.empty.tagSettings == TagSettings())
    }
}
