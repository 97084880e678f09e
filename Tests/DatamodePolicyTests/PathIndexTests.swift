import DatamodePolicy
import Testing

/// Rules without a host are indexed by the literal directory of their path glob; these rows check the index
/// keeps SPEC §3's "first matching rule" and §8's case-insensitive, query-free path matching.
@Suite struct PathIndexTests {
    static let videoOff = Rule(name: "video-off", match: RuleMatch(path: "/video/*"), tags: TagAssignment(allowConstrained: false))
    static let cdnOn = Rule(name: "cdn-on", match: RuleMatch(host: "cdn.example"), tags: TagAssignment(allowConstrained: true))
    static let deepOn = Rule(name: "deep-on", match: RuleMatch(path: "/video/hd/*.mp4"), tags: TagAssignment(allowConstrained: true))
    static let exactOff = Rule(name: "exact-off", match: RuleMatch(path: "/a/b/c"), tags: TagAssignment(allowConstrained: false))
    static let anyMp4Off = Rule(name: "mp4-off", match: RuleMatch(path: "*.mp4"), tags: TagAssignment(allowConstrained: false))

    struct Row: Sendable, CustomStringConvertible {
        var rules: [Rule]
        var url: String
        var allowConstrained: Bool
        var description: String { "\(rules.map(\.name)) \(url) -> \(allowConstrained)" }
    }

    static let rows: [Row] = [
        // Order across buckets: the path rule comes first, so it wins over the later host rule.
        Row(rules: [videoOff, cdnOn], url: "http://cdn.example/video/a.mp4", allowConstrained: false),
        Row(rules: [cdnOn, videoOff], url: "http://cdn.example/video/a.mp4", allowConstrained: true),
        // A deeper directory is a different key; the first in order still wins.
        Row(rules: [deepOn, videoOff], url: "http://x.example/video/hd/a.mp4", allowConstrained: true),
        Row(rules: [videoOff, deepOn], url: "http://x.example/video/hd/a.mp4", allowConstrained: false),
        Row(rules: [deepOn, videoOff], url: "http://x.example/video/sd/a.mp4", allowConstrained: false),
        // Case-insensitive, query ignored (a `/` inside the query is not a directory).
        Row(rules: [videoOff], url: "http://x.example/VIDEO/A.MP4", allowConstrained: false),
        Row(rules: [videoOff], url: "http://x.example/img/a.jpg?next=/video/x", allowConstrained: true),
        Row(rules: [videoOff], url: "http://x.example/videos/a.mp4", allowConstrained: true),
        // A literal path matches only itself.
        Row(rules: [exactOff], url: "http://x.example/a/b/c", allowConstrained: false),
        Row(rules: [exactOff], url: "http://x.example/a/b/cd", allowConstrained: true),
        Row(rules: [exactOff], url: "http://x.example/a/b/c/d", allowConstrained: true),
        // A glob without a literal directory stays in the scanned list and still applies, in order.
        Row(rules: [anyMp4Off, deepOn], url: "http://x.example/video/hd/a.mp4", allowConstrained: false),
        Row(rules: [deepOn, anyMp4Off], url: "http://x.example/video/hd/a.mp4", allowConstrained: true),
    ]

    @Test(arguments: rows)
    func firstMatchingRuleWins(_ row: Row) {
        let decision = decide(request(row.url), mode: normal, policy: policy(rules: row.rules))
        #expect(decision.tags?.allowConstrained == row.allowConstrained)
    }

    @Test func pathRulesNeverApplyToATunnel() {
        let decision = decide(connect("x.example:443"), mode: constrained, policy: policy(rules: [Self.videoOff]))
        #expect(decision == .forward(tags(true, true)))
    }

    /// 500 path-only decoys (the bench's shape) do not hide the real rule behind them.
    @Test func manyPathRulesStillResolve() {
        var rules = (0..<500).map { Rule(name: "decoy-\($0)", match: RuleMatch(path: "/nomatch-\($0)/*"), tags: TagAssignment(allowConstrained: false)) }
        rules.append(Self.videoOff)
        let p = policy(rules: rules)
        #expect(decide(request("http://o.example/video/v1.mp4"), mode: constrained, policy: p).tags?.allowConstrained == false)
        #expect(decide(request("http://o.example/pub/f1.bin"), mode: constrained, policy: p).tags?.allowConstrained == true)
        #expect(decide(request("http://o.example/nomatch-7/x"), mode: constrained, policy: p).tags?.allowConstrained == false)
    }
}
