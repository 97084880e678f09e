import DatamodePolicy
import DatamodeTestSupport
import Testing

/// The indexed policy (host buckets, dotted-suffix buckets, directory buckets, early exits) must agree with a
/// plain top-to-bottom reading of SPEC §3–5 and §15 on many generated policies and requests, with all three tags.
@Suite("Indexed policy agrees with a linear reference")
struct ReferenceModelTests {
    /// Picks from the shared seeded generator (SplitMix64): deterministic, so a failure reproduces.
    struct Random {
        var generator: SeededGenerator
        init(state: UInt64) { generator = SeededGenerator(seed: state) }
        mutating func next() -> UInt64 { generator.next() }
        mutating func pick<T>(_ items: [T]) -> T { items[Int(next() % UInt64(items.count))] }
        mutating func chance(_ percent: UInt64) -> Bool { next() % 100 < percent }
    }

    static let hostPatterns: [String?] = [
        nil, "cdn.example", "*.example", "*.cdn.example", "c*n.example", "*", "cdn.*", "a.cdn.example", "*.org",
        "10.*.1", "*example", "*.CDN.example", "b.example", "*.example.org",
    ]
    static let hosts = ["cdn.example", "a.cdn.example", "b.example", "x.org", "10.5.1", "cdn.example.org", "example"]
    static let paths = ["/", "/img/a.jpg", "/v/clip.mp4?x=1", "/img/b.jpg?v=/2", "/V/CLIP.MP4"]

    // MARK: Rules

    static func referenceTags(_ request: RequestFacts, rules: [Rule], settings: TagSettings,
                              headers: (Bool?, Bool?, Bool?), prefetch: Bool) -> RequestTags {
        func matches(_ rule: Rule) -> Bool {
            let m = rule.match
            if let host = m.host, !Glob(host, caseInsensitive: true).matches(request.host) { return false }
            if let path = m.path {
                if request.isConnect { return false }
                let pathOnly = request.path.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false)[0]
                if !Glob(path, caseInsensitive: true).matches(pathOnly) { return false }
            }
            if let method = m.method, method != request.method { return false }
            for (name, value) in m.header {
                let glob = Glob(value, caseInsensitive: true)
                if !request.fields.contains(where: { $0.name.lowercased() == name.lowercased() && glob.matches($0.value) }) {
                    return false
                }
            }
            if let client = m.client {
                guard let address = request.client, client.contains(address) else { return false }
            }
            return true
        }
        func resolve(_ get: (TagAssignment) -> Bool?, header: Bool?, defaultValue: Bool) -> Bool {
            if let r = rules.first(where: { $0.override && get($0.tags) != nil && matches($0) }) { return get(r.tags)! }
            if let header { return header }
            if let r = rules.first(where: { !$0.override && get($0.tags) != nil && matches($0) }) { return get(r.tags)! }
            if prefetch && settings.prefetchIsDiscretionary { return false }
            return defaultValue
        }
        return RequestTags(
            allowConstrained: resolve({ $0.allowConstrained }, header: headers.0, defaultValue: settings.defaults.allowConstrained),
            allowExpensive: resolve({ $0.allowExpensive }, header: headers.1, defaultValue: settings.defaults.allowExpensive),
            allowUltraConstrained: resolve({ $0.allowUltraConstrained }, header: headers.2,
                                           defaultValue: settings.defaults.allowUltraConstrained))
    }

    static func randomRule(_ i: Int, _ random: inout Random) -> Rule {
        var match = RuleMatch(host: random.pick(hostPatterns))
        if random.chance(25) { match.path = random.pick(["/img/*", "*.mp4", "/v/*", "*"]) }
        if random.chance(10) { match.method = random.pick(["GET", "POST", "CONNECT"]) }
        if random.chance(10) { match.header = ["Accept": random.pick(["video/*", "*"])] }
        if random.chance(10) { match.client = CIDR(random.pick(["10.0.0.0/8", "127.0.0.1", "::1"])) }
        let tags: TagAssignment = switch random.next() % 5 {
        case 0: TagAssignment(allowConstrained: random.chance(50))
        case 1: TagAssignment(allowExpensive: random.chance(50))
        case 2: TagAssignment(allowConstrained: random.chance(50), allowExpensive: random.chance(50))
        case 3: TagAssignment(allowUltraConstrained: random.chance(50))
        default: TagAssignment(allowConstrained: random.chance(50), allowExpensive: random.chance(50),
                               allowUltraConstrained: random.chance(50))
        }
        return Rule(name: "r\(i)", match: match, tags: tags, override: random.chance(20))
    }

    @Test(arguments: 0..<40)
    func rulesAgree(seed: Int) throws {
        var random = Random(state: UInt64(seed) &* 7919)
        let rules = (0..<Int(random.next() % 30 + 1)).map { Self.randomRule($0, &random) }
        let settings = TagSettings(prefetchIsDiscretionary: random.chance(70),
                                   defaults: RequestTags(allowConstrained: random.chance(80), allowExpensive: random.chance(80),
                                                         allowUltraConstrained: random.chance(20)))
        let snapshot = try PolicySnapshot(tags: settings, rules: rules, variants: [])
        for _ in 0..<60 {
            let host = random.pick(Self.hosts)
            var fields: [(String, String)] = []
            var headers: (Bool?, Bool?, Bool?) = (nil, nil, nil)
            if random.chance(30) { let v = random.chance(50); headers.0 = v; fields.append(("Allow-Constrained", v ? "?1" : "?0")) }
            if random.chance(30) { let v = random.chance(50); headers.1 = v; fields.append(("allow-expensive", v ? "true" : "0")) }
            if random.chance(30) {
                let v = random.chance(50)
                headers.2 = v
                fields.append((random.pick(["Allow-Ultra-Constrained", "allow-ultra-constrained"]), v ? "?1" : "FALSE"))
            }
            let prefetch = random.chance(20)
            if prefetch { fields.append(("Sec-Purpose", "prefetch")) }
            if random.chance(30) { fields.append(("Accept", random.pick(["video/mp4", "text/html"]))) }
            let client = random.pick(["127.0.0.1", "10.1.2.3", "::1", "::ffff:10.9.9.9"])
            let facts: RequestFacts = random.chance(15)
                ? connect("\(host):443", fields: fields, client: client)
                : request("http://\(host)\(random.pick(Self.paths))", method: random.pick(["GET", "POST"]), fields: fields,
                          client: client)
            let expected = Self.referenceTags(facts, rules: rules, settings: settings, headers: headers, prefetch: prefetch)
            let actual = try resolveTags(facts, policy: snapshot).get()
            #expect(actual == expected, "seed \(seed): \(facts.method) \(facts.url) fields \(fields)")
        }
    }

    // MARK: Variants

    static let variantPatterns = [
        "http://cdn.example/img/a.jpg", "http://cdn.example/img/*.jpg", "http://cdn.example/img/*", "http://cdn.example/*",
        "http://*.example/*", "http://*.cdn.example/img/*", "http://c*n.example/*", "http://*/*.jpg", "http://*/*",
        "https://cdn.example/*", "http://cdn.example/img/b.jpg?v=/*", "http://cdn.example/img/b.jpg?v=/2",
        "http://cdn.example:8080/*", "http://*.example:8080/*", "http://a.cdn.example/*/a.jpg", "http://cdn.example/*/*.jpg",
        "http://b.example/", "http://*.org/*", "http://cdn.example.org/*", "http://cdn.*/*",
    ]
    static let variantURLs = [
        "http://cdn.example/img/a.jpg", "http://cdn.example/img/b.jpg?v=/2", "http://cdn.example/", "https://cdn.example/x",
        "http://a.cdn.example/img/a.jpg", "http://cdn.example:8080/img/a.jpg", "http://b.example/", "http://x.org/a.jpg",
        "http://cdn.example.org/img/a.jpg", "http://b.example:8080/", "http://cdn.example/v/clip.mp4",
    ]

    @Test(arguments: 0..<40)
    func variantsAgree(seed: Int) throws {
        var random = Random(state: UInt64(seed) &* 104_729 &+ 1)
        let variants = (0..<Int(random.next() % 25 + 1)).map { i in
            Variant(id: "v\(i)", match: random.pick(Self.variantPatterns),
                    resource: .target("http://low.example/v\(i)", redirect: false),
                    when: random.pick(VariantCondition.allCases),
                    source: random.chance(30) ? .api : .config)
        }
        let snapshot = try PolicySnapshot(tags: TagSettings(), rules: [], variants: variants)
        let ordered = snapshot.variants
        for url in Self.variantURLs {
            for mode in everyMode {
                for allow in [true, false] {
                    let facts = request(url, fields: allow ? [("Allow-Ultra-Constrained", "?1")]
                                        : [("Allow-Constrained", "?0"), ("Allow-Expensive", "?0")])
                    let violated = !allow && mode != normal
                    func covers(_ v: Variant) -> Bool {
                        switch v.when {
                        case .disallowed: violated
                        case .constrained: mode.constrained
                        case .expensive: mode.expensive
                        case .ultraConstrained: mode.ultraConstrained
                        case .always: true
                        }
                    }
                    let candidates = ordered.filter { covers($0) && Glob($0.match, caseInsensitive: false).matches(url) }
                    let winner = candidates.first(where: { !$0.match.contains("*") }) ?? candidates.first
                    let decision = decide(facts, mode: mode, policy: snapshot)
                    #expect(decision.rewrite?.id == winner?.id, "seed \(seed): \(url) in \(mode), allow \(allow)")
                    if winner == nil {
                        #expect(decision.isForward == !violated)
                    }
                }
            }
        }
    }
}

/// SPEC §4, §5 and §15 for every mode × every combination of the three tags × every variant `when`, checked against
/// tables written out in words rather than computed: what the decision is without a variant, and when a variant of
/// each `when` is served instead.
@Suite("Three conditions: every mode × tags × when against a table")
struct ThreeConditionTableTests {
    /// mode | what the request allows | the decision without a variant.
    ///
    /// In words: a request violates a condition when the mode has it and the request does not allow it. No
    /// violation: forward. Otherwise refuse; the error is the first violated condition in the order constrained,
    /// expensive, ultra-constrained, and the reasons list every violated one in that order.
    static let decisions = """
        normal                                  | constrained expensive ultra-constrained | forward
        normal                                  | expensive ultra-constrained             | forward
        normal                                  | constrained ultra-constrained           | forward
        normal                                  | ultra-constrained                       | forward
        normal                                  | constrained expensive                   | forward
        normal                                  | expensive                               | forward
        normal                                  | constrained                             | forward
        normal                                  | nothing                                 | forward
        constrained                             | constrained expensive ultra-constrained | forward
        constrained                             | expensive ultra-constrained             | refuse constrained: constrained
        constrained                             | constrained ultra-constrained           | forward
        constrained                             | ultra-constrained                       | refuse constrained: constrained
        constrained                             | constrained expensive                   | forward
        constrained                             | expensive                               | refuse constrained: constrained
        constrained                             | constrained                             | forward
        constrained                             | nothing                                 | refuse constrained: constrained
        expensive                               | constrained expensive ultra-constrained | forward
        expensive                               | expensive ultra-constrained             | forward
        expensive                               | constrained ultra-constrained           | refuse expensive: expensive
        expensive                               | ultra-constrained                       | refuse expensive: expensive
        expensive                               | constrained expensive                   | forward
        expensive                               | expensive                               | forward
        expensive                               | constrained                             | refuse expensive: expensive
        expensive                               | nothing                                 | refuse expensive: expensive
        constrained-expensive                   | constrained expensive ultra-constrained | forward
        constrained-expensive                   | expensive ultra-constrained             | refuse constrained: constrained
        constrained-expensive                   | constrained ultra-constrained           | refuse expensive: expensive
        constrained-expensive                   | ultra-constrained                       | refuse constrained: constrained, expensive
        constrained-expensive                   | constrained expensive                   | forward
        constrained-expensive                   | expensive                               | refuse constrained: constrained
        constrained-expensive                   | constrained                             | refuse expensive: expensive
        constrained-expensive                   | nothing                                 | refuse constrained: constrained, expensive
        ultra-constrained                       | constrained expensive ultra-constrained | forward
        ultra-constrained                       | expensive ultra-constrained             | forward
        ultra-constrained                       | constrained ultra-constrained           | forward
        ultra-constrained                       | ultra-constrained                       | forward
        ultra-constrained                       | constrained expensive                   | refuse ultra-constrained: ultra-constrained
        ultra-constrained                       | expensive                               | refuse ultra-constrained: ultra-constrained
        ultra-constrained                       | constrained                             | refuse ultra-constrained: ultra-constrained
        ultra-constrained                       | nothing                                 | refuse ultra-constrained: ultra-constrained
        constrained-ultra-constrained           | constrained expensive ultra-constrained | forward
        constrained-ultra-constrained           | expensive ultra-constrained             | refuse constrained: constrained
        constrained-ultra-constrained           | constrained ultra-constrained           | forward
        constrained-ultra-constrained           | ultra-constrained                       | refuse constrained: constrained
        constrained-ultra-constrained           | constrained expensive                   | refuse ultra-constrained: ultra-constrained
        constrained-ultra-constrained           | expensive                               | refuse constrained: constrained, ultra-constrained
        constrained-ultra-constrained           | constrained                             | refuse ultra-constrained: ultra-constrained
        constrained-ultra-constrained           | nothing                                 | refuse constrained: constrained, ultra-constrained
        expensive-ultra-constrained             | constrained expensive ultra-constrained | forward
        expensive-ultra-constrained             | expensive ultra-constrained             | forward
        expensive-ultra-constrained             | constrained ultra-constrained           | refuse expensive: expensive
        expensive-ultra-constrained             | ultra-constrained                       | refuse expensive: expensive
        expensive-ultra-constrained             | constrained expensive                   | refuse ultra-constrained: ultra-constrained
        expensive-ultra-constrained             | expensive                               | refuse ultra-constrained: ultra-constrained
        expensive-ultra-constrained             | constrained                             | refuse expensive: expensive, ultra-constrained
        expensive-ultra-constrained             | nothing                                 | refuse expensive: expensive, ultra-constrained
        constrained-expensive-ultra-constrained | constrained expensive ultra-constrained | forward
        constrained-expensive-ultra-constrained | expensive ultra-constrained             | refuse constrained: constrained
        constrained-expensive-ultra-constrained | constrained ultra-constrained           | refuse expensive: expensive
        constrained-expensive-ultra-constrained | ultra-constrained                       | refuse constrained: constrained, expensive
        constrained-expensive-ultra-constrained | constrained expensive                   | refuse ultra-constrained: ultra-constrained
        constrained-expensive-ultra-constrained | expensive                               | refuse constrained: constrained, ultra-constrained
        constrained-expensive-ultra-constrained | constrained                             | refuse expensive: expensive, ultra-constrained
        constrained-expensive-ultra-constrained | nothing                                 | refuse constrained: constrained, expensive, ultra-constrained
        """

    /// A variant with this `when` is served instead of the decision above exactly when (SPEC §5, §15):
    static let variantWhen = """
        disallowed        | the request is refused
        constrained       | the mode is constrained
        expensive         | the mode is expensive
        ultra-constrained | the mode is ultra-constrained
        always            | always
        """

    /// `text` without surrounding spaces (no Foundation in this target).
    static func trimmed(_ text: Substring) -> String {
        String(text.drop(while: { $0 == " " }).reversed().drop(while: { $0 == " " }).reversed())
    }

    enum Outcome: Equatable {
        case forward
        case refuse(error: String, reasons: [String])
    }

    struct Row: Sendable, CustomTestStringConvertible {
        var modeName: String
        var allowsText: String
        var outcomeText: String
        var testDescription: String { "\(modeName), allowing \(allowsText): \(outcomeText)" }

        var mode: DataMode { DataMode(name: modeName)! }
        var allows: Set<String> { allowsText == "nothing" ? [] : Set(allowsText.split(separator: " ").map(String.init)) }
        var tags: RequestTags {
            RequestTags(allowConstrained: allows.contains("constrained"), allowExpensive: allows.contains("expensive"),
                        allowUltraConstrained: allows.contains("ultra-constrained"))
        }
        var outcome: Outcome {
            if outcomeText == "forward" { return .forward }
            let rest = outcomeText.dropFirst("refuse ".count)
            let colon = rest.firstIndex(of: ":")!
            return .refuse(error: String(rest[..<colon]),
                           reasons: rest[rest.index(after: colon)...].split(separator: ",").map(ThreeConditionTableTests.trimmed))
        }
        var refused: Bool { outcome != .forward }
    }

    struct WhenRow: Sendable, CustomTestStringConvertible {
        var when: String
        var rule: String
        var testDescription: String { "when: \(when)" }

        /// The sentence of `variantWhen`, read literally.
        func serves(_ row: Row) -> Bool {
            switch rule {
            case "always": return true
            case "the request is refused": return row.refused
            default:
                let condition = DataCondition(rawValue: String(rule.dropFirst("the mode is ".count)))!
                return row.mode.has(condition)
            }
        }
    }

    static func cells(_ table: String) -> [[String]] {
        table.split(separator: "\n").map { $0.split(separator: "|").map(trimmed) }
    }
    static let rows = cells(decisions).map { Row(modeName: $0[0], allowsText: $0[1], outcomeText: $0[2]) }
    static let whens = cells(variantWhen).map { WhenRow(when: $0[0], rule: $0[1]) }

    /// A request that states all three tags in its own headers.
    static func facts(_ row: Row, url: String = "http://cdn.example/img/hero.jpg") -> RequestFacts {
        request(url, fields: [
            ("Allow-Constrained", row.allows.contains("constrained") ? "?1" : "?0"),
            ("Allow-Expensive", row.allows.contains("expensive") ? "?1" : "?0"),
            ("Allow-Ultra-Constrained", row.allows.contains("ultra-constrained") ? "?1" : "?0"),
        ])
    }

    @Test func theTablesCoverEveryCombinationExactlyOnce() {
        #expect(Self.rows.count == 64)
        let pairs = Set(Self.rows.map { "\($0.mode.name) \($0.tags)" })
        #expect(pairs.count == 64)
        #expect(Set(Self.rows.map(\.mode)) == Set(everyMode))
        for row in Self.rows { #expect(row.mode.name == row.modeName, "a table mode is not a canonical name") }
        #expect(Self.whens.map(\.when) == VariantCondition.allCases.map(\.rawValue))
    }

    @Test(arguments: rows)
    func decisionWithoutAVariant(row: Row) throws {
        let facts = Self.facts(row)
        let decision = decide(facts, mode: row.mode, policy: .empty)
        #expect(decision.tags == row.tags)
        switch row.outcome {
        case .forward:
            #expect(decision == .forward(row.tags))
        case .refuse(let error, let reasons):
            let rejection = try #require(decision.rejection)
            #expect(rejection.code.rawValue == error)
            #expect(rejection.networkUnavailableReason == error)
            #expect(rejection.reasons.map(\.rawValue) == reasons)
            let json = rejection.problem(mode: row.mode, url: facts.url).json
            #expect(json.contains("\"error\":\"\(error)\""))
            #expect(json.contains("\"reasons\":\(JSONText.array(reasons))"))
            #expect(json.contains("\"mode\":\"\(row.modeName)\""))
            #expect(rejection.problem(mode: row.mode, url: facts.url).code.status == 403)
        }
        // Without its own Allow-Ultra-Constrained header a request does not allow ultra-constrained (the default).
        if !row.allows.contains("ultra-constrained") {
            let silent = request(facts.url, fields: facts.fields.filter { $0.name != "Allow-Ultra-Constrained" }.map { ($0.name, $0.value) })
            #expect(decide(silent, mode: row.mode, policy: .empty) == decision)
        }
    }

    @Test(arguments: rows, whens)
    func aVariantIsServedAsItsWhenSays(row: Row, when: WhenRow) throws {
        let condition = try #require(VariantCondition(rawValue: when.when))
        let variant = Variant(id: "small", match: "http://cdn.example/img/*.jpg",
                              resource: .target("http://cdn.example/img/$1@small.jpg", redirect: false), when: condition)
        let decision = decide(Self.facts(row), mode: row.mode, policy: policy(variants: [variant]))
        if when.serves(row) {
            #expect(decision == .serveVariant(row.tags, VariantRewrite(
                id: "small", action: .fetch(url: "http://cdn.example/img/hero@small.jpg"))))
        } else {
            #expect(decision == decide(Self.facts(row), mode: row.mode, policy: .empty))
            #expect(decision.rewrite == nil)
        }
        // A URL the variant does not match is never rewritten.
        let other = decide(Self.facts(row, url: "http://cdn.example/page.html"), mode: row.mode, policy: policy(variants: [variant]))
        #expect(other.rewrite == nil)
        #expect((other.rejection != nil) == row.refused)
    }
}
