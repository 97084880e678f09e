import DatamodePolicy
import Testing

/// SPEC §3: each tag resolved separately from override rule > client header > rule > prefetch > default.
@Suite("Request tags")
struct TagResolutionTests {
    struct RuleSpec: Sendable {
        var override = false
        var value: Bool
        var matches = true
        /// The rule sets the other tag instead of the one under test.
        var setsOtherTag = false
    }

    struct Row: Sendable, CustomStringConvertible {
        var name: String
        var header: String? = nil
        var rules: [RuleSpec] = []
        var prefetch = false
        var prefetchIsDiscretionary = true
        var defaultValue = true
        var expected: Bool
        var description: String { name }
    }

    static let rows: [Row] = [
        Row(name: "nothing: default true", expected: true),
        Row(name: "configured default false", defaultValue: false, expected: false),
        Row(name: "header ?0", header: "?0", expected: false),
        Row(name: "header ?1 beats default false", header: "?1", defaultValue: false, expected: true),
        Row(name: "rule false", rules: [RuleSpec(value: false)], expected: false),
        Row(name: "rule true beats default false", rules: [RuleSpec(value: true)], defaultValue: false, expected: true),
        Row(name: "non-matching rule ignored", rules: [RuleSpec(value: false, matches: false)], expected: true),
        Row(name: "header ?1 beats rule false", header: "?1", rules: [RuleSpec(value: false)], expected: true),
        Row(name: "header ?0 beats rule true", header: "?0", rules: [RuleSpec(value: true)], expected: false),
        Row(name: "override false beats header ?1", header: "?1", rules: [RuleSpec(override: true, value: false)],
            expected: false),
        Row(name: "override true beats header ?0", header: "?0", rules: [RuleSpec(override: true, value: true)],
            expected: true),
        Row(name: "override later in order still beats an earlier plain rule",
            rules: [RuleSpec(value: false), RuleSpec(override: true, value: true)], expected: true),
        Row(name: "non-matching override ignored", header: "?1",
            rules: [RuleSpec(override: true, value: false, matches: false)], expected: true),
        Row(name: "override setting only the other tag leaves the header in charge", header: "?1",
            rules: [RuleSpec(override: true, value: false, setsOtherTag: true)], expected: true),
        Row(name: "plain rule setting only the other tag is skipped for this tag",
            rules: [RuleSpec(value: true, setsOtherTag: true), RuleSpec(value: false)], expected: false),
        Row(name: "first matching plain rule wins", rules: [RuleSpec(value: false), RuleSpec(value: true)],
            expected: false),
        Row(name: "first matching plain rule wins after a non-matching one",
            rules: [RuleSpec(value: true, matches: false), RuleSpec(value: false), RuleSpec(value: true)], expected: false),
        Row(name: "first matching override wins",
            rules: [RuleSpec(override: true, value: true), RuleSpec(override: true, value: false)], expected: true),
        Row(name: "prefetch is discretionary", prefetch: true, expected: false),
        Row(name: "header ?1 beats prefetch", header: "?1", prefetch: true, expected: true),
        Row(name: "rule true beats prefetch", rules: [RuleSpec(value: true)], prefetch: true, expected: true),
        Row(name: "override true beats prefetch", rules: [RuleSpec(override: true, value: true)], prefetch: true,
            expected: true),
        Row(name: "prefetch-is-discretionary off: default", prefetch: true, prefetchIsDiscretionary: false,
            expected: true),
        Row(name: "prefetch-is-discretionary off: configured default false", prefetch: true,
            prefetchIsDiscretionary: false, defaultValue: false, expected: false),
    ]

    @Test(arguments: rows, Tag.allCases)
    func precedence(row: Row, tag: Tag) throws {
        let rules = row.rules.enumerated().map { i, spec in
            Rule(name: "r\(i)", match: RuleMatch(host: spec.matches ? "cdn.example" : "elsewhere.example"),
                 tags: (spec.setsOtherTag ? tag.other : tag).assignment(spec.value), override: spec.override)
        }
        let settings = TagSettings(prefetchIsDiscretionary: row.prefetchIsDiscretionary,
                                   defaults: tag.defaults(row.defaultValue))
        var fields: [(String, String)] = [("Accept", "*/*")]
        if let header = row.header { fields.append((tag.header, header)) }
        if row.prefetch { fields.append(("Sec-Purpose", "prefetch")) }
        let snapshot = policy(tags: settings, rules: rules, variants: [])
        let resolved = try resolveTags(request("http://cdn.example/a.mp4", fields: fields), policy: snapshot).get()
        #expect(tag.value(of: resolved) == row.expected)

        // The other tag is untouched by this tag's header and rules: only prefetch/default, or the
        // rules that deliberately set the other tag.
        var otherExpected = row.prefetch && row.prefetchIsDiscretionary ? false : true
        if let first = row.rules.first(where: { $0.setsOtherTag && $0.matches }) { otherExpected = first.value }
        #expect(tag.other.value(of: resolved) == otherExpected)

        // `decide` reports the same tags in normal mode.
        #expect(decide(request("http://cdn.example/a.mp4", fields: fields), mode: normal, policy: snapshot).tags
            == resolved)

        // And says where this tag came from (SPEC §8: the log names the rule that set the tags).
        var provenance = TagProvenance()
        _ = resolveTags(request("http://cdn.example/a.mp4", fields: fields), policy: snapshot, provenance: &provenance)
        #expect((tag == .constrained ? provenance.constrained : provenance.expensive) == Self.expectedSource(row))
    }

    /// The precedence of SPEC §3 read off a row: matching override rule, header, matching plain rule, prefetch,
    /// default (rule indices are positions in the row, as in the policy).
    static func expectedSource(_ row: Row) -> TagSource {
        let applicable = row.rules.enumerated().filter { $0.element.matches && !$0.element.setsOtherTag }
        if let rule = applicable.first(where: { $0.element.override }) { return .rule(rule.offset) }
        if row.header != nil { return .header }
        if let rule = applicable.first(where: { !$0.element.override }) { return .rule(rule.offset) }
        if row.prefetch && row.prefetchIsDiscretionary { return .prefetch }
        return .defaults
    }

    /// The log's `rule`: for a rejection the rule behind the violated tag, else the one behind allow-constrained,
    /// else allow-expensive.
    @Test func ruleNameFollowsTheDecidingTag() {
        let snapshot = policy(rules: [
            Rule(name: "pages", match: RuleMatch(path: "*.html"), tags: TagAssignment(allowExpensive: false)),
            Rule(name: "videos", match: RuleMatch(path: "*.mp4"), tags: TagAssignment(allowConstrained: true)),
            Rule(name: "big", match: RuleMatch(path: "*.mp4"), tags: TagAssignment(allowExpensive: false)),
        ])
        func ruleName(_ url: String, _ mode: DataMode, fields: [(String, String)] = []) -> String? {
            var provenance = TagProvenance()
            let decision = decide(request(url, fields: fields), mode: mode, policy: snapshot, provenance: &provenance)
            return snapshot.ruleName(for: decision, provenance: provenance)
        }
        #expect(ruleName("http://cdn.example/a.mp4", expensive) == "big")      // rejected: expensive violated
        #expect(ruleName("http://cdn.example/a.mp4", normal) == "videos")      // forwarded: allow-constrained first
        #expect(ruleName("http://cdn.example/a.html", normal) == "pages")      // only allow-expensive has a rule
        #expect(ruleName("http://cdn.example/a.html", both, fields: [("Allow-Constrained", "?0")]) == nil)  // header
        #expect(ruleName("http://cdn.example/a.css", normal) == nil)
    }

    @Test func oneRuleCanSetBothTags() throws {
        let snapshot = policy(rules: [Rule(name: "both", match: RuleMatch(host: "cdn.example"),
                                           tags: TagAssignment(allowConstrained: false, allowExpensive: false))])
        #expect(try resolveTags(request("http://cdn.example/"), policy: snapshot).get() == tags(false, false))
        // The client's header still decides the tag it carries.
        #expect(try resolveTags(request("http://cdn.example/", fields: [("Allow-Expensive", "?1")]),
                                policy: snapshot).get() == tags(false, true))
    }

    @Test func overrideAndHeaderAndPlainRuleMixPerTag() throws {
        let snapshot = policy(rules: [
            Rule(name: "plain", match: RuleMatch(host: "cdn.example"),
                 tags: TagAssignment(allowConstrained: false, allowExpensive: false)),
            Rule(name: "force", match: RuleMatch(host: "cdn.example"),
                 tags: TagAssignment(allowExpensive: true), override: true),
        ])
        let facts = request("http://cdn.example/", fields: [("Allow-Constrained", "?1"), ("Allow-Expensive", "?0")])
        // constrained: header ?1 beats plain false; expensive: override true beats header ?0.
        #expect(try resolveTags(facts, policy: snapshot).get() == tags(true, true))
        // Without headers: plain rule for constrained, override for expensive.
        #expect(try resolveTags(request("http://cdn.example/"), policy: snapshot).get() == tags(false, true))
    }

    // MARK: Client header values

    static let validValues: [(String, Bool)] = [
        ("?1", true), ("?0", false), ("true", true), ("false", false), ("TRUE", true), ("False", false),
        ("tRuE", true), ("1", true), ("0", false), (" ?1 ", true), ("\t?0", false), ("?0\t ", false),
        ("?1, ?1", true), ("true,1,?1", true), ("0 , false", false),
    ]

    @Test(arguments: validValues, Tag.allCases)
    func acceptsBooleanSpellings(value: (String, Bool), tag: Tag) throws {
        let resolved = try resolveTags(request("http://cdn.example/", fields: [(tag.header, value.0)]),
                                       policy: .empty).get()
        #expect(tag.value(of: resolved) == value.1)
        #expect(tag.other.value(of: resolved) == true)
    }

    static let invalidValues: [String] = [
        "", " ", "maybe", "yes", "no", "on", "off", "2", "-1", "01", "?2", "?", "??1", "?true", "? 1", "t", "f",
        "tru", "truee", "\"?1\"", "?1;a=b", "?1 ?0", "?1,", ",?1", "?1,,?1", "1.0", "+1", "\u{00A0}?1",
    ]

    @Test(arguments: invalidValues, Tag.allCases)
    func refusesOtherValues(value: String, tag: Tag) throws {
        let facts = request("http://cdn.example/", fields: [(tag.header, value)])
        let detail = try #require(decide(facts, mode: normal, policy: .empty).invalidTagDetail)
        #expect(detail.contains(tag.header))
        if case .failure(let error) = resolveTags(facts, policy: .empty) {
            #expect(error.detail == detail)
            #expect(error.problem.code == .invalidTag)
            #expect(error.problem.json.contains("\"status\":400"))
        } else {
            Issue.record("resolveTags accepted \(value)")
        }
    }

    static let conflicting: [[String]] = [
        ["?1", "?0"], ["?0", "?1"], ["true", "0"], ["?1, ?0"], ["1,false"], ["?1", "?1", "false"], ["?1", "?1, ?0"],
    ]

    @Test(arguments: conflicting, Tag.allCases)
    func refusesConflictingCopies(copies: [String], tag: Tag) throws {
        let fields = copies.map { (tag.header, $0) }
        let detail = try #require(decide(request("http://cdn.example/", fields: fields), mode: constrained,
                                         policy: .empty).invalidTagDetail)
        #expect(detail.contains(tag.header))
        #expect(detail.contains("conflicting"))
    }

    @Test(arguments: [["?1", "?1"], ["true", "1", "?1"], ["?0", "false"], ["0, ?0", "FALSE"]], Tag.allCases)
    func agreeingCopiesAreFine(copies: [String], tag: Tag) throws {
        let resolved = try resolveTags(request("http://cdn.example/", fields: copies.map { (tag.header, $0) }),
                                       policy: .empty).get()
        #expect(tag.value(of: resolved) == (copies[0].contains("1") || copies[0].lowercased() == "true"))
    }

    @Test(arguments: ["allow-constrained", "ALLOW-CONSTRAINED", "Allow-constrained", "aLLoW-CoNsTrAiNeD"])
    func headerNameIsCaseInsensitive(name: String) throws {
        let resolved = try resolveTags(request("http://cdn.example/", fields: [(name, "?0")]), policy: .empty).get()
        #expect(resolved == tags(false, true))
    }

    @Test(arguments: ["Allow-Constrained-X", "X-Allow-Constrained", "Allow-Constraine", "AllowConstrained"])
    func similarHeaderNamesAreIgnored(name: String) throws {
        #expect(try resolveTags(request("http://cdn.example/", fields: [(name, "garbage")]), policy: .empty).get()
            == .allowAll)
    }

    @Test(arguments: Tag.allCases)
    func headerIsValidatedEvenWhenAnOverrideRuleWins(tag: Tag) {
        let snapshot = policy(rules: [Rule(name: "force", match: RuleMatch(), tags: tag.assignment(false),
                                           override: true)])
        #expect(decide(request("http://cdn.example/", fields: [(tag.header, "maybe")]), mode: normal,
                       policy: snapshot).invalidTagDetail != nil)
        #expect(decide(request("http://cdn.example/", fields: [(tag.header, "?1"), (tag.header, "?0")]),
                       mode: normal, policy: snapshot).invalidTagDetail != nil)
    }

    @Test func invalidDetailNamesTheValue() throws {
        let detail = try #require(decide(request("http://cdn.example/", fields: [("Allow-Expensive", "sometimes")]),
                                         mode: normal, policy: .empty).invalidTagDetail)
        #expect(detail.contains("Allow-Expensive"))
        #expect(detail.contains("\"sometimes\""))
    }

    // MARK: Prefetch

    static let prefetchForms: [((String, String), Bool)] = [
        (("Sec-Purpose", "prefetch"), true),
        (("sec-purpose", "prefetch;anonymous-client-ip"), true),
        (("Sec-Purpose", "Prefetch"), true),
        (("Sec-Purpose", "prefetch;prerender"), true),
        (("SEC-PURPOSE", " prefetch "), true),
        (("Purpose", "prefetch"), true),
        (("PURPOSE", "Prefetch"), true),
        (("X-Moz", "prefetch"), true),
        (("x-moz", "PREFETCH"), true),
        (("Sec-Purpose", "prerender"), false),
        (("Sec-Purpose", "noprefetch"), false),
        (("Sec-Purpose", "prefetched"), false),
        (("Purpose", "preview"), false),
        (("X-Moz", "prefetched"), false),
        (("X-Purpose", "prefetch"), false),
        (("Accept", "prefetch"), false),
        (("Sec-Fetch-Dest", "prefetch"), false),
    ]

    @Test(arguments: prefetchForms)
    func prefetchMarksBothTagsFalse(field: (String, String), isPrefetch: Bool) throws {
        let resolved = try resolveTags(request("http://cdn.example/", fields: [field]), policy: .empty).get()
        #expect(resolved == (isPrefetch ? tags(false, false) : .allowAll))
        // Under Low Data Mode a prefetch is rejected (there is no variant).
        let decision = decide(request("http://cdn.example/", fields: [field]), mode: constrained, policy: .empty)
        #expect((decision.rejection != nil) == isPrefetch)
    }
}
