import DatamodePolicy
import Testing

/// The indexed policy (host buckets, dotted-suffix buckets, directory buckets, early exits) must agree with a
/// plain top-to-bottom reading of SPEC §3–5 on many generated policies and requests.
@Suite("Indexed policy agrees with a linear reference")
struct ReferenceModelTests {
    /// SplitMix64: deterministic, so a failure reproduces.
    struct Random {
        var state: UInt64
        mutating func next() -> UInt64 {
            state &+= 0x9E37_79B9_7F4A_7C15
            var z = state
            z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
            z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
            return z ^ (z >> 31)
        }
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

    static func referenceTags(_ request: RequestFacts, rules: [Rule], settings: TagSettings, headers: (Bool?, Bool?),
                              prefetch: Bool) -> RequestTags {
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
            allowExpensive: resolve({ $0.allowExpensive }, header: headers.1, defaultValue: settings.defaults.allowExpensive))
    }

    static func randomRule(_ i: Int, _ random: inout Random) -> Rule {
        var match = RuleMatch(host: random.pick(hostPatterns))
        if random.chance(25) { match.path = random.pick(["/img/*", "*.mp4", "/v/*", "*"]) }
        if random.chance(10) { match.method = random.pick(["GET", "POST", "CONNECT"]) }
        if random.chance(10) { match.header = ["Accept": random.pick(["video/*", "*"])] }
        if random.chance(10) { match.client = CIDR(random.pick(["10.0.0.0/8", "127.0.0.1", "::1"])) }
        let tags: TagAssignment = switch random.next() % 3 {
        case 0: TagAssignment(allowConstrained: random.chance(50))
        case 1: TagAssignment(allowExpensive: random.chance(50))
        default: TagAssignment(allowConstrained: random.chance(50), allowExpensive: random.chance(50))
        }
        return Rule(name: "r\(i)", match: match, tags: tags, override: random.chance(20))
    }

    @Test(arguments: 0..<40)
    func rulesAgree(seed: Int) throws {
        var random = Random(state: UInt64(seed) &* 7919)
        let rules = (0..<Int(random.next() % 30 + 1)).map { Self.randomRule($0, &random) }
        let settings = TagSettings(prefetchIsDiscretionary: random.chance(70),
                                   defaults: RequestTags(allowConstrained: random.chance(80), allowExpensive: random.chance(80)))
        let snapshot = try PolicySnapshot(tags: settings, rules: rules, variants: [])
        for _ in 0..<60 {
            let host = random.pick(Self.hosts)
            var fields: [(String, String)] = []
            var headers: (Bool?, Bool?) = (nil, nil)
            if random.chance(30) { let v = random.chance(50); headers.0 = v; fields.append(("Allow-Constrained", v ? "?1" : "?0")) }
            if random.chance(30) { let v = random.chance(50); headers.1 = v; fields.append(("allow-expensive", v ? "true" : "0")) }
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
            for mode in allModes {
                for allow in [true, false] {
                    let facts = request(url, fields: allow ? [] : [("Allow-Constrained", "?0"), ("Allow-Expensive", "?0")])
                    let violated = !allow && mode != normal
                    func covers(_ v: Variant) -> Bool {
                        switch v.when {
                        case .disallowed: violated
                        case .constrained: mode.constrained
                        case .expensive: mode.expensive
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
