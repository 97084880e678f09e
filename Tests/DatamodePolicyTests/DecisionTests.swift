import DatamodePolicy
import Testing

/// SPEC §4: violation, forward and reject in every mode.
@Suite("Decision")
struct DecisionTests {
    /// (mode, client tags, expected violated reasons)
    static let table: [(DataMode, RequestTags, [DataCondition])] = [
        (normal, tags(true, true), []), (normal, tags(false, true), []),
        (normal, tags(true, false), []), (normal, tags(false, false), []),
        (constrained, tags(true, true), []), (constrained, tags(false, true), [.constrained]),
        (constrained, tags(true, false), []), (constrained, tags(false, false), [.constrained]),
        (expensive, tags(true, true), []), (expensive, tags(false, true), []),
        (expensive, tags(true, false), [.expensive]), (expensive, tags(false, false), [.expensive]),
        (both, tags(true, true), []), (both, tags(false, true), [.constrained]),
        (both, tags(true, false), [.expensive]), (both, tags(false, false), [.constrained, .expensive]),
    ]

    @Test(arguments: table)
    func forwardsOrRejects(mode: DataMode, clientTags: RequestTags, reasons: [DataCondition]) throws {
        let facts = request("http://cdn.example/video.mp4", fields: [
            ("Allow-Constrained", clientTags.allowConstrained ? "?1" : "?0"),
            ("Allow-Expensive", clientTags.allowExpensive ? "?1" : "?0"),
        ])
        let decision = decide(facts, mode: mode, policy: .empty)
        if reasons.isEmpty {
            #expect(decision == .forward(clientTags))
        } else {
            let expectedCode: ProxyErrorCode = reasons.contains(.constrained) ? .constrained : .expensive
            #expect(decision == .reject(clientTags, Rejection(reasons: reasons)))
            let rejection = try #require(decision.rejection)
            #expect(rejection.code == expectedCode)
            #expect(rejection.networkUnavailableReason == expectedCode.rawValue)
            #expect(rejection.problem(mode: mode, url: facts.url).code.status == 403)
        }
    }

    @Test func rejectionBodyHasTheSpecMembers() {
        let facts = request("http://cdn.example/video.mp4", fields: [("Allow-Constrained", "?0")])
        guard case .reject(_, let rejection) = decide(facts, mode: constrained, policy: .empty) else {
            Issue.record("not rejected")
            return
        }
        let json = rejection.problem(mode: constrained, url: facts.url).json
        for member in [
            "\"type\":\"urn:datamode:constrained\"", "\"title\":\"Not allowed on a constrained network\"",
            "\"status\":403", "\"error\":\"constrained\"", "\"reasons\":[\"constrained\"]", "\"mode\":\"constrained\"",
            "\"url\":\"http://cdn.example/video.mp4\"",
        ] {
            #expect(json.contains(member), "\(member) missing in \(json)")
        }
        #expect(json.hasPrefix("{") && json.hasSuffix("}"))
    }

    @Test func bothViolatedReportsConstrainedFirst() {
        let facts = request("http://cdn.example/video.mp4", fields: [("Allow-Constrained", "?0"), ("Allow-Expensive", "0")])
        let rejection = decide(facts, mode: both, policy: .empty).rejection
        #expect(rejection?.reasons == [.constrained, .expensive])
        #expect(rejection?.code == .constrained)
        let json = rejection?.problem(mode: both, url: facts.url).json ?? ""
        #expect(json.contains("\"error\":\"constrained\""))
        #expect(json.contains("\"reasons\":[\"constrained\",\"expensive\"]"))
        #expect(json.contains("\"mode\":\"constrained-expensive\""))
    }

    @Test func expensiveOnlyRejection() {
        let facts = request("http://cdn.example/big.iso", fields: [("Allow-Expensive", "false")])
        let json = decide(facts, mode: expensive, policy: .empty).rejection?.problem(mode: expensive, url: facts.url).json
        #expect(json?.contains("\"type\":\"urn:datamode:expensive\"") == true)
        #expect(json?.contains("\"title\":\"Not allowed on an expensive network\"") == true)
        #expect(json?.contains("\"reasons\":[\"expensive\"]") == true)
    }

    @Test func urlIsJSONEscapedInTheProblem() {
        let rejection = Rejection(reasons: [.constrained])
        let json = rejection.problem(mode: constrained, url: "http://cdn.example/a\"b\\c").json
        #expect(json.contains(#""url":"http://cdn.example/a\"b\\c""#))
    }

    @Test(arguments: allModes)
    func defaultsForwardEverything(mode: DataMode) {
        #expect(decide(request("http://cdn.example/"), mode: mode, policy: .empty) == .forward(.allowAll))
    }

    @Test(arguments: allModes)
    func configuredDefaultsCanRejectByDefault(mode: DataMode) {
        let snapshot = policy(tags: TagSettings(defaults: tags(false, false)))
        let decision = decide(request("http://cdn.example/"), mode: mode, policy: snapshot)
        if mode == normal {
            #expect(decision == .forward(tags(false, false)))
        } else {
            #expect(decision.rejection != nil)
        }
    }
}

/// SPEC §8 rule criteria: every present criterion must hold.
@Suite("Rule matching")
struct RuleMatchTests {
    struct Row: Sendable, CustomStringConvertible {
        var name: String
        var match: RuleMatch
        var request: RequestFacts
        var matches: Bool
        var description: String { name }
    }

    static let rows: [Row] = [
        Row(name: "empty match matches everything", match: RuleMatch(), request: request("http://a.example/x"), matches: true),
        Row(name: "literal host", match: RuleMatch(host: "cdn.example"), request: request("http://cdn.example/x"), matches: true),
        Row(name: "literal host, other host", match: RuleMatch(host: "cdn.example"), request: request("http://cdn2.example/x"),
            matches: false),
        Row(name: "host pattern is case-insensitive", match: RuleMatch(host: "CDN.Example"),
            request: request("http://cdn.example/x"), matches: true),
        Row(name: "host glob", match: RuleMatch(host: "*.video.example"), request: request("http://a.b.video.example/x"),
            matches: true),
        Row(name: "host glob needs the dot", match: RuleMatch(host: "*.video.example"),
            request: request("http://video.example/x"), matches: false),
        Row(name: "host glob ignores the port", match: RuleMatch(host: "*.video.example"),
            request: request("http://a.video.example:8080/x"), matches: true),
        Row(name: "host with a port never matches a port-less host", match: RuleMatch(host: "a.example:8080"),
            request: request("http://a.example:8080/x"), matches: false),
        Row(name: "IPv6 host in brackets", match: RuleMatch(host: "[::1]"), request: request("http://[::1]:8080/x"),
            matches: true),
        Row(name: "path glob", match: RuleMatch(path: "*.mp4"), request: request("http://a.example/v/a.mp4"), matches: true),
        Row(name: "path glob ignores the query", match: RuleMatch(path: "*.mp4"),
            request: request("http://a.example/v/a.mp4?start=10"), matches: true),
        Row(name: "query is not part of the path", match: RuleMatch(path: "*start*"),
            request: request("http://a.example/v/a.mp4?start=10"), matches: false),
        Row(name: "path glob is case-insensitive", match: RuleMatch(path: "/videos/*.mp4"),
            request: request("http://a.example/Videos/A.MP4"), matches: true),
        Row(name: "path glob is anchored", match: RuleMatch(path: "*.mp4"), request: request("http://a.example/a.mp4x"),
            matches: false),
        Row(name: "path glob anchored at the start", match: RuleMatch(path: "/videos/*"),
            request: request("http://a.example/x/videos/a"), matches: false),
        Row(name: "method exact", match: RuleMatch(method: "POST"), request: request("http://a.example/", method: "POST"),
            matches: true),
        Row(name: "method other", match: RuleMatch(method: "POST"), request: request("http://a.example/"), matches: false),
        Row(name: "method is case-sensitive", match: RuleMatch(method: "GET"),
            request: request("http://a.example/", method: "get"), matches: false),
        Row(name: "header glob on some copy", match: RuleMatch(header: ["Accept": "video/*"]),
            request: request("http://a.example/", fields: [("Accept", "text/html"), ("accept", "video/mp4")]), matches: true),
        Row(name: "header name case-insensitive, value glob case-insensitive", match: RuleMatch(header: ["accept": "VIDEO/*"]),
            request: request("http://a.example/", fields: [("ACCEPT", "video/mp4")]), matches: true),
        Row(name: "header value OWS trimmed", match: RuleMatch(header: ["X-App": "player"]),
            request: request("http://a.example/", fields: [("X-App", "  player\t")]), matches: true),
        Row(name: "header value glob is anchored", match: RuleMatch(header: ["X-App": "player"]),
            request: request("http://a.example/", fields: [("X-App", "player2")]), matches: false),
        Row(name: "header missing", match: RuleMatch(header: ["Accept": "*"]), request: request("http://a.example/"),
            matches: false),
        Row(name: "header '*' matches an empty value", match: RuleMatch(header: ["X-Empty": "*"]),
            request: request("http://a.example/", fields: [("X-Empty", "")]), matches: true),
        Row(name: "every header entry must match",
            match: RuleMatch(header: ["Accept": "video/*", "X-App": "player"]),
            request: request("http://a.example/", fields: [("Accept", "video/mp4")]), matches: false),
        Row(name: "every header entry matches",
            match: RuleMatch(header: ["Accept": "video/*", "X-App": "player"]),
            request: request("http://a.example/", fields: [("X-App", "player"), ("Accept", "video/mp4")]), matches: true),
        Row(name: "client in block", match: RuleMatch(client: CIDR("10.0.0.0/8")),
            request: request("http://a.example/", client: "10.1.2.3"), matches: true),
        Row(name: "client outside block", match: RuleMatch(client: CIDR("10.0.0.0/8")),
            request: request("http://a.example/", client: "192.168.1.1"), matches: false),
        Row(name: "IPv4-mapped client in IPv4 block", match: RuleMatch(client: CIDR("10.0.0.0/8")),
            request: request("http://a.example/", client: "::ffff:10.1.2.3"), matches: true),
        Row(name: "unknown client never matches a client criterion", match: RuleMatch(client: CIDR("0.0.0.0/0")),
            request: request("http://a.example/", client: nil), matches: false),
        Row(name: "all criteria hold",
            match: RuleMatch(host: "*.example", path: "/v/*", method: "GET", header: ["Range": "bytes=*"],
                             client: CIDR("127.0.0.0/8")),
            request: request("http://a.example/v/1.mp4", fields: [("Range", "bytes=0-")]), matches: true),
        Row(name: "one criterion fails",
            match: RuleMatch(host: "*.example", path: "/v/*", method: "GET", header: ["Range": "bytes=*"],
                             client: CIDR("10.0.0.0/8")),
            request: request("http://a.example/v/1.mp4", fields: [("Range", "bytes=0-")]), matches: false),
        Row(name: "CONNECT: host rule applies", match: RuleMatch(host: "*.video.example"),
            request: connect("a.video.example:443"), matches: true),
        Row(name: "CONNECT: method CONNECT", match: RuleMatch(method: "CONNECT"), request: connect("a.example:443"),
            matches: true),
        Row(name: "CONNECT: path rule never matches", match: RuleMatch(host: "*.video.example", path: "*"),
            request: connect("a.video.example:443"), matches: false),
        Row(name: "CONNECT: header rule applies", match: RuleMatch(header: ["User-Agent": "*curl*"]),
            request: connect("a.example:443", fields: [("User-Agent", "curl/8.5")]), matches: true),
    ]

    @Test(arguments: rows)
    func criterion(row: Row) throws {
        let snapshot = policy(rules: [Rule(name: "r", match: row.match, tags: TagAssignment(allowConstrained: false))])
        let resolved = try resolveTags(row.request, policy: snapshot).get()
        #expect(resolved.allowConstrained == !row.matches)
    }

    @Test func connectRejectedByHostRuleUnderConstrainedMode() {
        let snapshot = policy(rules: [
            Rule(name: "video", match: RuleMatch(host: "*.video.example"), tags: TagAssignment(allowConstrained: false)),
            Rule(name: "mp4", match: RuleMatch(path: "*.mp4"), tags: TagAssignment(allowExpensive: false)),
        ])
        #expect(decide(connect("a.video.example:443"), mode: both, policy: snapshot)
            == .reject(tags(false, true), Rejection(reasons: [.constrained])))
        #expect(decide(connect("other.example:443"), mode: both, policy: snapshot) == .forward(.allowAll))
    }

    /// Rules with a literal host and rules with a glob host live in different indexes; order still decides.
    @Test(arguments: [true, false])
    func orderHoldsAcrossLiteralAndWildcardHosts(wildcardFirst: Bool) throws {
        let wildcard = Rule(name: "wild", match: RuleMatch(host: "*.example"), tags: TagAssignment(allowConstrained: false))
        let literal = Rule(name: "lit", match: RuleMatch(host: "cdn.example"), tags: TagAssignment(allowConstrained: true))
        let noHost = Rule(name: "any", match: RuleMatch(path: "/x"), tags: TagAssignment(allowConstrained: true))
        let snapshot = policy(rules: wildcardFirst ? [wildcard, literal, noHost] : [literal, wildcard, noHost])
        let resolved = try resolveTags(request("http://cdn.example/x"), policy: snapshot).get()
        #expect(resolved.allowConstrained == !wildcardFirst)
    }
}
