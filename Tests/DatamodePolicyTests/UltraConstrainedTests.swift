import DatamodePolicy
import Testing

/// SPEC §15 in the policy: the third condition's names, its tag (opt-in: default false, false for a prefetch, set
/// by headers and rules like the other two) and its error code. The decision for every mode × tags × `when` is
/// checked against a table in ReferenceModelTests.swift.
@Suite("Ultra-constrained (SPEC §15)")
struct UltraConstrainedTests {
    // MARK: Mode names

    static let names: [(String, DataMode)] = [
        ("normal", DataMode(constrained: false, expensive: false, ultraConstrained: false)),
        ("constrained", DataMode(constrained: true, expensive: false, ultraConstrained: false)),
        ("expensive", DataMode(constrained: false, expensive: true, ultraConstrained: false)),
        ("constrained-expensive", DataMode(constrained: true, expensive: true, ultraConstrained: false)),
        ("ultra-constrained", DataMode(constrained: false, expensive: false, ultraConstrained: true)),
        ("constrained-ultra-constrained", DataMode(constrained: true, expensive: false, ultraConstrained: true)),
        ("expensive-ultra-constrained", DataMode(constrained: false, expensive: true, ultraConstrained: true)),
        ("constrained-expensive-ultra-constrained", DataMode(constrained: true, expensive: true, ultraConstrained: true)),
    ]

    @Test(arguments: names)
    func eachCanonicalNameIsItsModesName(name: String, mode: DataMode) {
        #expect(DataMode(name: name) == mode)
        #expect(DataMode(name: name.uppercased()) == mode)
        #expect(mode.name == name)
        #expect(mode.description == name)
    }

    @Test func aliasesKeepTheirMeaningAndSatelliteIsAllThree() {
        #expect(DataMode(name: "low-data") == DataMode(constrained: true, expensive: false))
        #expect(DataMode(name: "cellular") == DataMode(constrained: false, expensive: true))
        #expect(DataMode(name: "satellite") == satellite)
        #expect(DataMode(name: "Satellite")?.name == "constrained-expensive-ultra-constrained")
        #expect(DataMode.acceptedNames == DataMode.canonicalNames + ["low-data", "cellular", "satellite"])
        #expect(Set(DataMode.canonicalNames.compactMap { DataMode(name: $0) }).count == 8)
    }

    @Test(arguments: ["ultra", "ultraconstrained", "ultra_constrained", "expensive-constrained",
                      "ultra-constrained-constrained", "constrained-ultra-constrained-expensive", "sat", "satellite ", ""])
    func otherNamesAreRefused(name: String) {
        #expect(DataMode(name: name) == nil)
    }

    @Test func aModeWrittenWithTwoConditionsHasNoThird() {
        #expect(DataMode(constrained: true, expensive: true).ultraConstrained == false)
        #expect(DataMode(constrained: true, expensive: true).name == "constrained-expensive")
        #expect(!everyMode[0...3].contains { $0.ultraConstrained })
        #expect(everyMode[4...7].allSatisfy { $0.ultraConstrained })
    }

    // MARK: The tag

    static let url = "http://cdn.example/a.mp4"

    @Test func theDefaultIsFalseAndTheOtherTwoStayTrue() throws {
        let resolved = try resolveTags(request(Self.url), policy: .empty).get()
        #expect(resolved == RequestTags(allowConstrained: true, allowExpensive: true, allowUltraConstrained: false))
        #expect(resolved == .allowAll)
        #expect(TagSettings().defaults.allowUltraConstrained == false)
    }

    @Test func aConfiguredDefaultOfTrueOptsEveryRequestIn() throws {
        let settings = TagSettings(defaults: RequestTags(allowConstrained: true, allowExpensive: true, allowUltraConstrained: true))
        let snapshot = policy(tags: settings)
        #expect(try resolveTags(request(Self.url), policy: snapshot).get().allowUltraConstrained)
        #expect(decide(request(Self.url), mode: satellite, policy: snapshot).isForward)
        // A prefetch is still discretionary: every tag false.
        let prefetch = request(Self.url, fields: [("Sec-Purpose", "prefetch")])
        #expect(try resolveTags(prefetch, policy: snapshot).get()
            == RequestTags(allowConstrained: false, allowExpensive: false, allowUltraConstrained: false))
        // ...unless prefetches are not discretionary.
        var notDiscretionary = settings
        notDiscretionary.prefetchIsDiscretionary = false
        #expect(try resolveTags(prefetch, policy: policy(tags: notDiscretionary)).get().allowUltraConstrained)
    }

    /// The precedence table of TagResolutionTests, run for the third tag: override rule > header > plain rule >
    /// prefetch > default, each tag separately (a rule that sets another tag leaves this one alone).
    @Test(arguments: TagResolutionTests.rows)
    func precedenceIsTheSameAsForTheOtherTags(row: TagResolutionTests.Row) throws {
        let rules = row.rules.enumerated().map { i, spec in
            Rule(name: "r\(i)", match: RuleMatch(host: spec.matches ? "cdn.example" : "elsewhere.example"),
                 tags: spec.setsOtherTag ? TagAssignment(allowConstrained: spec.value)
                     : TagAssignment(allowUltraConstrained: spec.value),
                 override: spec.override)
        }
        let settings = TagSettings(prefetchIsDiscretionary: row.prefetchIsDiscretionary,
                                   defaults: RequestTags(allowConstrained: true, allowExpensive: true,
                                                         allowUltraConstrained: row.defaultValue))
        var fields: [(String, String)] = [("Accept", "*/*")]
        if let header = row.header { fields.append(("Allow-Ultra-Constrained", header)) }
        if row.prefetch { fields.append(("Sec-Purpose", "prefetch")) }
        let snapshot = policy(tags: settings, rules: rules)
        let resolved = try resolveTags(request(Self.url, fields: fields), policy: snapshot).get()
        #expect(resolved.allowUltraConstrained == row.expected)

        var constrainedExpected = !(row.prefetch && row.prefetchIsDiscretionary)
        if let first = row.rules.first(where: { $0.setsOtherTag && $0.matches }) { constrainedExpected = first.value }
        #expect(resolved.allowConstrained == constrainedExpected)
        #expect(resolved.allowExpensive == !(row.prefetch && row.prefetchIsDiscretionary))
    }

    @Test(arguments: TagResolutionTests.validValues)
    func acceptsTheSameBooleanSpellings(value: (String, Bool)) throws {
        let resolved = try resolveTags(request(Self.url, fields: [("Allow-Ultra-Constrained", value.0)]),
                                       policy: .empty).get()
        #expect(resolved == RequestTags(allowConstrained: true, allowExpensive: true, allowUltraConstrained: value.1))
    }

    @Test(arguments: TagResolutionTests.invalidValues)
    func refusesTheSameOtherValues(value: String) throws {
        let facts = request(Self.url, fields: [("Allow-Ultra-Constrained", value)])
        let detail = try #require(decide(facts, mode: normal, policy: .empty).invalidTagDetail)
        #expect(detail.contains("Allow-Ultra-Constrained"))
    }

    @Test(arguments: TagResolutionTests.conflicting)
    func refusesConflictingCopies(copies: [String]) throws {
        let fields = copies.map { ("Allow-Ultra-Constrained", $0) }
        let detail = try #require(decide(request(Self.url, fields: fields), mode: satellite, policy: .empty).invalidTagDetail)
        #expect(detail.contains("Allow-Ultra-Constrained"))
        #expect(detail.contains("conflicting"))
    }

    @Test(arguments: ["allow-ultra-constrained", "ALLOW-ULTRA-CONSTRAINED", "Allow-Ultra-constrained"])
    func headerNameIsCaseInsensitive(name: String) throws {
        #expect(try resolveTags(request(Self.url, fields: [(name, "?1")]), policy: .empty).get().allowUltraConstrained)
    }

    /// `Allow-Ultra-Constrainex` has the same length as the real name: only the exact name counts.
    @Test(arguments: ["Allow-Ultra-Constrained-X", "X-Allow-Ultra-Constrained", "Allow-Ultra-Constrainex",
                      "Allow-UltraConstrained", "Allow-Ultra"])
    func similarHeaderNamesAreIgnored(name: String) throws {
        #expect(try resolveTags(request(Self.url, fields: [(name, "garbage")]), policy: .empty).get() == .allowAll)
    }

    @Test func theHeaderIsValidatedEvenWhenAnOverrideRuleDecides() {
        let snapshot = policy(rules: [Rule(name: "force", match: RuleMatch(),
                                           tags: TagAssignment(allowUltraConstrained: true), override: true)])
        #expect(decide(request(Self.url, fields: [("Allow-Ultra-Constrained", "maybe")]), mode: normal,
                       policy: snapshot).invalidTagDetail != nil)
    }

    // MARK: Rules

    @Test func aRuleMaySetOnlyTheThirdTag() throws {
        let snapshot = policy(rules: [Rule(name: "maps", match: RuleMatch(host: "tiles.example"),
                                           tags: TagAssignment(allowUltraConstrained: true))])
        #expect(try resolveTags(request("http://tiles.example/1/2/3.png"), policy: snapshot).get()
            == RequestTags(allowConstrained: true, allowExpensive: true, allowUltraConstrained: true))
        #expect(try resolveTags(request(Self.url), policy: snapshot).get() == .allowAll)
        #expect(decide(request("http://tiles.example/1/2/3.png"), mode: satellite, policy: snapshot).isForward)
        #expect(decide(request(Self.url), mode: satellite, policy: snapshot).rejection?.code == .ultraConstrained)
    }

    /// Once the other two tags are settled, the scan must still reach a later rule that sets only the third one
    /// (and an override for it after every plain rule).
    @Test func aLaterRuleForTheThirdTagIsStillReached() throws {
        var rules = (0..<50).map { i in
            Rule(name: "early\(i)", match: RuleMatch(host: i == 0 ? "cdn.example" : "other\(i).example"),
                 tags: TagAssignment(allowConstrained: false, allowExpensive: false))
        }
        rules.append(Rule(name: "late", match: RuleMatch(path: "*.mp4"), tags: TagAssignment(allowUltraConstrained: true)))
        let plain = policy(rules: rules)
        #expect(try resolveTags(request(Self.url), policy: plain).get()
            == RequestTags(allowConstrained: false, allowExpensive: false, allowUltraConstrained: true))
        // The client's header beats the plain rule; an override beats the header.
        let silent = request(Self.url, fields: [("Allow-Ultra-Constrained", "?0")])
        #expect(try resolveTags(silent, policy: plain).get().allowUltraConstrained == false)
        rules.append(Rule(name: "force", match: RuleMatch(host: "*.example"),
                          tags: TagAssignment(allowUltraConstrained: true), override: true))
        #expect(try resolveTags(silent, policy: policy(rules: rules)).get().allowUltraConstrained)
    }

    /// Where the third tag came from, and the rule the access log names for it (SPEC §8).
    @Test func provenanceAndRuleNameCoverTheThirdTag() {
        let snapshot = policy(rules: [
            Rule(name: "maps", match: RuleMatch(host: "tiles.example"), tags: TagAssignment(allowUltraConstrained: true)),
            Rule(name: "no-video", match: RuleMatch(path: "*.mp4"), tags: TagAssignment(allowUltraConstrained: false),
                 override: true),
        ])
        func decided(_ url: String, _ mode: DataMode, _ fields: [(String, String)] = [])
            -> (decision: Decision, source: TagSource, rule: String?) {
            var provenance = TagProvenance()
            let decision = decide(request(url, fields: fields), mode: mode, policy: snapshot, provenance: &provenance)
            return (decision, provenance.ultraConstrained, snapshot.ruleName(for: decision, provenance: provenance))
        }
        let maps = decided("http://tiles.example/1.png", satellite)
        #expect(maps.decision.isForward)
        #expect(maps.source == .rule(0))
        #expect(maps.rule == "maps")
        // The override beats the client's opt-in; the refusal names the rule behind the violated tag.
        let video = decided("http://tiles.example/a.mp4", satellite, [("Allow-Ultra-Constrained", "?1")])
        #expect(video.decision.rejection?.code == .ultraConstrained)
        #expect(video.source == .rule(1))
        #expect(video.rule == "no-video")
        #expect(decided("http://cdn.example/", satellite, [("Allow-Ultra-Constrained", "?1")]).source == .header)
        #expect(decided("http://cdn.example/", satellite, [("Purpose", "prefetch")]).source == .prefetch)
        let silent = decided("http://cdn.example/", satellite)
        #expect(silent.source == .defaults)
        #expect(silent.rule == nil)
        // A refusal for an earlier condition names that condition's rule, not the third tag's.
        let both = policy(rules: [
            Rule(name: "c", match: RuleMatch(), tags: TagAssignment(allowConstrained: false)),
            Rule(name: "u", match: RuleMatch(), tags: TagAssignment(allowUltraConstrained: false)),
        ])
        var provenance = TagProvenance()
        let decision = decide(request("http://cdn.example/"), mode: satellite, policy: both, provenance: &provenance)
        #expect(decision.rejection?.reasons == [.constrained, .ultraConstrained])
        #expect(both.ruleName(for: decision, provenance: provenance) == "c")
    }

    @Test func aRuleThatSetsNoTagIsRefusedNamingAllThree() {
        do {
            _ = try PolicySnapshot(tags: TagSettings(), rules: [Rule(name: "empty", match: RuleMatch(), tags: TagAssignment())],
                                   variants: [])
            Issue.record("compiled")
        } catch {
            #expect(error.subject == "rule \"empty\"")
            #expect(error.message.contains("allow-ultra-constrained"))
        }
    }

    // MARK: Decision and error

    @Test func theErrorCodeIs403WithItsOwnTitle() {
        let code = ProxyErrorCode.ultraConstrained
        #expect(code.rawValue == "ultra-constrained")
        #expect(code.status == 403)
        #expect(code.title == "Not allowed on an ultra-constrained network")
        #expect(ProxyErrorCode(rawValue: "ultra-constrained") == code)
    }

    @Test func theRejectionBodyHasTheSpecMembers() throws {
        let mode = DataMode(name: "ultra-constrained")!
        let facts = request("http://cdn.example/video.mp4")
        let rejection = try #require(decide(facts, mode: mode, policy: .empty).rejection)
        #expect(rejection.networkUnavailableReason == "ultra-constrained")
        let json = rejection.problem(mode: mode, url: facts.url).json
        for member in [
            "\"type\":\"urn:datamode:ultra-constrained\"", "\"title\":\"Not allowed on an ultra-constrained network\"",
            "\"status\":403", "\"error\":\"ultra-constrained\"", "\"reasons\":[\"ultra-constrained\"]",
            "\"mode\":\"ultra-constrained\"", "\"url\":\"http://cdn.example/video.mp4\"", "\"detail\":",
        ] {
            #expect(json.contains(member), "\(member) missing in \(json)")
        }
    }

    @Test func aTunnelIsJudgedByTheThirdTagToo() {
        #expect(decide(connect("cdn.example:443"), mode: satellite, policy: .empty).rejection?.code == .ultraConstrained)
        #expect(decide(connect("cdn.example:443", fields: [("Allow-Ultra-Constrained", "?1")]), mode: satellite,
                       policy: .empty).isForward)
        let hostRule = policy(rules: [Rule(name: "api", match: RuleMatch(host: "api.example"),
                                           tags: TagAssignment(allowUltraConstrained: true))])
        #expect(decide(connect("api.example:443"), mode: satellite, policy: hostRule).isForward)
    }

    /// The invariant of issue 18: without the header and without the condition, nothing changes but the value of
    /// the new tag (false), for every old mode and every old combination of the two other headers.
    @Test(arguments: allModes)
    func withoutTheConditionTheThirdTagChangesNoDecision(mode: DataMode) {
        for c in [nil, true, false] as [Bool?] {
            for e in [nil, true, false] as [Bool?] {
                var fields: [(String, String)] = []
                if let c { fields.append(("Allow-Constrained", c ? "?1" : "?0")) }
                if let e { fields.append(("Allow-Expensive", e ? "?1" : "?0")) }
                let decision = decide(request(Self.url, fields: fields), mode: mode, policy: .empty)
                let violated = mode.constrained && c == false || mode.expensive && e == false
                #expect(decision.isForward == !violated)
                #expect(decision.tags?.allowUltraConstrained == false)
                #expect(decision.rejection.map { $0.reasons.contains(.ultraConstrained) } != true)
            }
        }
    }
}
