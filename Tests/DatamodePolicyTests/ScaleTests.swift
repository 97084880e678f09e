import DatamodePolicy
import Testing

/// A large policy stays correct: the indexes (host buckets, exact URL map, authority buckets, wildcard lists)
/// must give the same answers as reading the policy top to bottom. Speed is measured by hand, not here.
@Suite("Large policies")
struct ScaleTests {
    /// 1,000 rules: 900 literal-host rules, 100 wildcard-host or host-less rules interleaved.
    static let rules: [Rule] = (0..<1000).map { i in
        if i % 10 == 5 {
            return Rule(name: "wild\(i)", match: RuleMatch(host: "*.w\(i).example"),
                        tags: TagAssignment(allowConstrained: false))
        }
        if i == 999 {
            return Rule(name: "late-pathless", match: RuleMatch(path: "/late/*"), tags: TagAssignment(allowExpensive: false))
        }
        return Rule(name: "host\(i)", match: RuleMatch(host: "h\(i).example"),
                    tags: TagAssignment(allowConstrained: i % 2 == 0, allowExpensive: i % 3 == 0 ? false : nil),
                    override: i % 7 == 0)
    }

    /// 10,000 variants over 100 hosts: exact, literal-host globs, and wildcard-host globs.
    static let variants: [Variant] = (0..<10_000).map { i in
        let host = "cdn\(i % 100).example"
        let resource = VariantResource.target("http://low.example/\(i)/$1", redirect: false)
        switch i % 4 {
        case 0:
            return Variant(id: "exact\(i)", match: "http://\(host)/v/\(i).mp4",
                           resource: .target("http://low.example/\(i).mp4", redirect: false), when: .always)
        case 1:
            return Variant(id: "glob\(i)", match: "http://\(host)/g\(i)/*.jpg", resource: resource, when: .always)
        case 2:
            return Variant(id: "wild\(i)", match: "http://*.w\(i).example/*", resource: resource, when: .always)
        default:
            return Variant(id: "dis\(i)", match: "https://\(host)/d\(i)/*", resource: resource, when: .disallowed)
        }
    }

    static let snapshot = policy(rules: rules, variants: variants)

    @Test(arguments: [0, 2, 4, 14, 100, 498, 996])
    func literalHostRules(i: Int) throws {
        let resolved = try resolveTags(request("http://h\(i).example/x"), policy: Self.snapshot).get()
        #expect(resolved == tags(i % 2 == 0, i % 3 == 0 ? false : true))
    }

    @Test func overrideRuleBeatsTheHeaderInALargePolicy() throws {
        // rule 14 is an override (14 % 7 == 0) setting allow-constrained true.
        let resolved = try resolveTags(request("http://h14.example/", fields: [("Allow-Constrained", "?0")]),
                                       policy: Self.snapshot).get()
        #expect(resolved.allowConstrained == true)
        // rule 16 is plain: the header wins.
        #expect(try resolveTags(request("http://h16.example/", fields: [("Allow-Constrained", "?0")]),
                                policy: Self.snapshot).get().allowConstrained == false)
    }

    @Test(arguments: [5, 15, 505, 995])
    func wildcardHostRules(i: Int) throws {
        #expect(try resolveTags(request("http://a.w\(i).example/x"), policy: Self.snapshot).get() == tags(false, true))
    }

    @Test func lastRuleStillReached() throws {
        #expect(try resolveTags(request("http://nowhere.example/late/x"), policy: Self.snapshot).get() == tags(true, false))
        #expect(try resolveTags(request("http://nowhere.example/x"), policy: Self.snapshot).get() == .allowAll)
    }

    @Test(arguments: [0, 4, 400, 9_996])
    func exactVariants(i: Int) {
        #expect(decide(request("http://cdn\(i % 100).example/v/\(i).mp4"), mode: normal, policy: Self.snapshot).rewrite
            == VariantRewrite(id: "exact\(i)", action: .fetch(url: "http://low.example/\(i).mp4")))
    }

    @Test(arguments: [1, 5, 101, 9_997])
    func literalHostGlobVariants(i: Int) {
        #expect(decide(request("http://cdn\(i % 100).example/g\(i)/a.b.jpg"), mode: normal, policy: Self.snapshot).rewrite
            == VariantRewrite(id: "glob\(i)", action: .fetch(url: "http://low.example/\(i)/a.b")))
    }

    @Test(arguments: [2, 6, 9_998])
    func wildcardHostVariants(i: Int) {
        #expect(decide(request("http://x.w\(i).example/p/q"), mode: normal, policy: Self.snapshot).rewrite
            == VariantRewrite(id: "wild\(i)", action: .fetch(url: "http://low.example/\(i)/x")))
    }

    @Test func disallowedVariantOnlyWhenRejected() {
        let url = "https://cdn3.example/d3/a"
        #expect(decide(request(url), mode: constrained, policy: Self.snapshot).isForward)
        #expect(decide(request(url, fields: [("Allow-Constrained", "?0")]), mode: constrained, policy: Self.snapshot)
            .rewrite?.id == "dis3")
    }

    @Test func noMatchForwardsOrRejects() {
        #expect(decide(request("http://cdn5.example/none"), mode: both, policy: Self.snapshot).isForward)
        #expect(decide(request("http://cdn5.example/none", fields: [("Allow-Expensive", "?0")]), mode: both,
                       policy: Self.snapshot).rejection?.reasons == [.expensive])
        #expect(decide(connect("h4.example:443"), mode: constrained, policy: Self.snapshot).isForward)
    }
}
