import DatamodePolicy
import Testing

/// SPEC §5: which variant, when, and what it becomes.
@Suite("Variants")
struct VariantTests {
    static let url = "http://cdn.example/img/hero.jpg"

    static func smallVariant(_ when: VariantCondition) -> Variant {
        Variant(id: "hero-small", match: "http://cdn.example/img/*.jpg",
                resource: .target("http://cdn.example/img/$1@small.jpg", redirect: false), when: when)
    }

    struct WhenRow: Sendable, CustomStringConvertible {
        var when: VariantCondition
        var mode: DataMode
        var clientTags: RequestTags
        var served: Bool
        var description: String { "when \(when.rawValue), mode \(mode), tags \(clientTags)" }
    }

    /// Every `when` × every mode × (allowed / disallowed request), with the SPEC §5 answer spelled out.
    static let whenRows: [WhenRow] = {
        var rows: [WhenRow] = []
        for when in VariantCondition.allCases {
            for mode in allModes {
                for clientTags in [tags(true, true), tags(false, true), tags(true, false), tags(false, false)] {
                    let violated = mode.constrained && !clientTags.allowConstrained
                        || mode.expensive && !clientTags.allowExpensive
                    let served: Bool = switch when {
                    case .disallowed: violated
                    case .constrained: mode.constrained
                    case .expensive: mode.expensive
                    case .ultraConstrained: mode.ultraConstrained
                    case .always: true
                    }
                    rows.append(WhenRow(when: when, mode: mode, clientTags: clientTags, served: served))
                }
            }
        }
        return rows
    }()

    @Test(arguments: whenRows)
    func whenCoversTheSituation(row: WhenRow) {
        let facts = request(Self.url, fields: [
            ("Allow-Constrained", row.clientTags.allowConstrained ? "?1" : "?0"),
            ("Allow-Expensive", row.clientTags.allowExpensive ? "?1" : "?0"),
        ])
        let decision = decide(facts, mode: row.mode, policy: policy(variants: [Self.smallVariant(row.when)]))
        let plain = decide(facts, mode: row.mode, policy: .empty)
        if row.served {
            #expect(decision == .serveVariant(row.clientTags, VariantRewrite(
                id: "hero-small", action: .fetch(url: "http://cdn.example/img/hero@small.jpg"))))
        } else {
            #expect(decision == plain, "without a covering variant the decision is what it would be with none")
        }
    }

    @Test func explicitWhenRows() {
        let low = request(Self.url, fields: [("Allow-Constrained", "?0")])
        let ok = request(Self.url)
        // disallowed: only the request that would be rejected
        #expect(decide(low, mode: constrained, policy: policy(variants: [Self.smallVariant(.disallowed)])).rewrite != nil)
        #expect(decide(ok, mode: constrained, policy: policy(variants: [Self.smallVariant(.disallowed)])).isForward)
        #expect(decide(low, mode: expensive, policy: policy(variants: [Self.smallVariant(.disallowed)])).isForward)
        // constrained: every request while constrained, even allowed ones
        #expect(decide(ok, mode: constrained, policy: policy(variants: [Self.smallVariant(.constrained)])).rewrite != nil)
        #expect(decide(ok, mode: both, policy: policy(variants: [Self.smallVariant(.constrained)])).rewrite != nil)
        #expect(decide(ok, mode: expensive, policy: policy(variants: [Self.smallVariant(.constrained)])).isForward)
        // expensive
        #expect(decide(ok, mode: expensive, policy: policy(variants: [Self.smallVariant(.expensive)])).rewrite != nil)
        #expect(decide(ok, mode: constrained, policy: policy(variants: [Self.smallVariant(.expensive)])).isForward)
        // always, even in normal mode
        #expect(decide(ok, mode: normal, policy: policy(variants: [Self.smallVariant(.always)])).rewrite != nil)
        // a variant whose `when` does not cover a violation leaves the rejection
        #expect(decide(low, mode: constrained, policy: policy(variants: [Self.smallVariant(.expensive)])).rejection != nil)
    }

    @Test func defaultWhenIsDisallowed() {
        #expect(Variant(id: "x", match: "http://a.example/", resource: .target("http://b.example/", redirect: false)).when
            == .disallowed)
    }

    // MARK: Captures and `$N`

    struct CaptureRow: Sendable, CustomStringConvertible {
        var match: String
        var target: String
        var url: String
        var expected: String?
        var description: String { "\(match) -> \(target) for \(url)" }
    }

    static let captureRows: [CaptureRow] = [
        CaptureRow(match: "http://cdn.example/img/*.jpg", target: "http://cdn.example/img/$1@small.jpg",
                   url: "http://cdn.example/img/a.b.jpg", expected: "http://cdn.example/img/a.b@small.jpg"),
        CaptureRow(match: "http://cdn.example/img/*.jpg", target: "http://cdn.example/img/$1@small.jpg",
                   url: "http://cdn.example/img/dir/x.jpg", expected: "http://cdn.example/img/dir/x@small.jpg"),
        CaptureRow(match: "http://cdn.example/img/*.jpg", target: "http://cdn.example/img/$1@small.jpg",
                   url: "http://cdn.example/img/a.jpg?v=2", expected: nil),   // the query is part of the URL
        CaptureRow(match: "http://cdn.example/img/*", target: "http://low.example/$1",
                   url: "http://cdn.example/img/a.jpg?v=2", expected: "http://low.example/a.jpg?v=2"),
        CaptureRow(match: "http://*.example/*/*.mp4", target: "http://low.example/$2/$3-$1.mp4",
                   url: "http://media.example/v/2024/clip.mp4", expected: "http://low.example/v/2024/clip-media.mp4"),
        CaptureRow(match: "http://cdn.example/*/*", target: "http://cdn.example/$2/$1/$2",
                   url: "http://cdn.example/a/b", expected: "http://cdn.example/b/a/b"),
        CaptureRow(match: "http://cdn.example/*", target: "http://cdn.example/price$/$1$x$",
                   url: "http://cdn.example/p", expected: "http://cdn.example/price$/p$x$"),
        CaptureRow(match: "http://cdn.example/*", target: "http://cdn.example/$$1",
                   url: "http://cdn.example/p", expected: "http://cdn.example/$p"),
        CaptureRow(match: "http://cdn.example/*", target: "http://cdn.example/$10",
                   url: "http://cdn.example/p", expected: "http://cdn.example/p0"),
        CaptureRow(match: "http://cdn.example/*", target: "http://cdn.example/static.jpg",
                   url: "http://cdn.example/p", expected: "http://cdn.example/static.jpg"),
        CaptureRow(match: "http://cdn.example/*", target: "http://cdn.example/",
                   url: "http://cdn.example/", expected: "http://cdn.example/"),
        CaptureRow(match: "http://*/*", target: "https://$1.low.example/$2",
                   url: "http://a.example:8080/x", expected: "https://a.example:8080.low.example/x"),
        CaptureRow(match: "http://cdn.example/Img/*.JPG", target: "http://cdn.example/$1.jpg",
                   url: "http://cdn.example/img/a.jpg", expected: nil),   // paths are case-sensitive
        CaptureRow(match: "http://cdn.example/*", target: "http://cdn.example/s/$1",
                   url: "https://cdn.example/a", expected: nil),          // the scheme is part of the URL
        CaptureRow(match: "http://cdn.example/a/*", target: "http://cdn.example/é/$1",
                   url: "http://cdn.example/a/ü%20x", expected: "http://cdn.example/é/ü%20x"),
    ]

    @Test(arguments: captureRows)
    func substitutesCaptures(row: CaptureRow) {
        let snapshot = policy(variants: [Variant(id: "v", match: row.match,
                                                 resource: .target(row.target, redirect: false), when: .always)])
        let decision = decide(request(row.url), mode: normal, policy: snapshot)
        if let expected = row.expected {
            #expect(decision.rewrite == VariantRewrite(id: "v", action: .fetch(url: expected)))
        } else {
            #expect(decision == .forward(.allowAll))
        }
    }

    @Test func redirectAction() {
        let snapshot = policy(variants: [Variant(id: "r", match: "http://cdn.example/img/*.jpg",
                                                 resource: .target("http://cdn.example/img/$1@small.jpg", redirect: true))])
        let decision = decide(request(Self.url, fields: [("Allow-Constrained", "?0")]), mode: constrained,
                              policy: snapshot)
        #expect(decision == .serveVariant(tags(false, true), VariantRewrite(
            id: "r", action: .redirect(location: "http://cdn.example/img/hero@small.jpg"))))
    }

    @Test(arguments: [
        ("variants/promo-poster.jpg", nil, "image/jpeg"),
        ("/srv/p.JPEG", nil, "image/jpeg"),
        ("/srv/p.png", nil, "image/png"),
        ("/srv/p.gif", nil, "image/gif"),
        ("/srv/p.webp", nil, "image/webp"),
        ("/srv/p.avif", nil, "image/avif"),
        ("/srv/p.svg", nil, "image/svg+xml"),
        ("/srv/p.mp4", nil, "video/mp4"),
        ("/srv/p.webm", nil, "video/webm"),
        ("/srv/p.m3u8", nil, "application/vnd.apple.mpegurl"),
        ("/srv/p.mp3", nil, "audio/mpeg"),
        ("/srv/p.json", nil, "application/json"),
        ("/srv/p.txt", nil, "text/plain; charset=utf-8"),
        ("/srv/p.html", nil, "text/html; charset=utf-8"),
        ("/srv/p.css", nil, "text/css; charset=utf-8"),
        ("/srv/p.js", nil, "text/javascript"),
        ("/srv/p.bin", nil, "application/octet-stream"),
        ("/srv/noextension", nil, "application/octet-stream"),
        ("/srv.d/noextension", nil, "application/octet-stream"),
        ("/srv/p.jpg", "image/x-custom", "image/x-custom"),
    ] as [(String, String?, String)])
    func fileAction(path: String, configured: String?, expected: String) {
        let snapshot = policy(variants: [Variant(id: "promo-video-poster", match: "http://cdn.example/promo.mp4",
                                                 resource: .file(path: path, contentType: configured))])
        let decision = decide(request("http://cdn.example/promo.mp4", fields: [("Allow-Expensive", "?0")]),
                              mode: expensive, policy: snapshot)
        #expect(decision == .serveVariant(tags(true, false), VariantRewrite(
            id: "promo-video-poster", action: .file(path: path, contentType: expected))))
        #expect(snapshot.contentType(ofVariant: "promo-video-poster") == expected)
    }

    // MARK: Precedence

    static func target(_ id: String, _ match: String, when: VariantCondition = .always,
                       source: VariantSource = .config) -> Variant {
        Variant(id: id, match: match, resource: .target("http://low.example/\(id)", redirect: false), when: when,
                source: source)
    }

    @Test func exactBeatsEveryGlobWhateverTheOrder() {
        let snapshot = policy(variants: [
            Self.target("glob", "http://cdn.example/img/*"),
            Self.target("wild", "http://*/*"),
            Self.target("exact", "http://cdn.example/img/hero.jpg"),
        ])
        #expect(decide(request(Self.url), mode: normal, policy: snapshot).rewrite?.id == "exact")
        #expect(decide(request("http://cdn.example/img/other.jpg"), mode: normal, policy: snapshot).rewrite?.id == "glob")
    }

    @Test func exactThatDoesNotCoverLetsAGlobApply() {
        let snapshot = policy(variants: [
            Self.target("exact", Self.url, when: .expensive),
            Self.target("glob", "http://cdn.example/img/*", when: .constrained),
        ])
        #expect(decide(request(Self.url), mode: constrained, policy: snapshot).rewrite?.id == "glob")
        #expect(decide(request(Self.url), mode: expensive, policy: snapshot).rewrite?.id == "exact")
        #expect(decide(request(Self.url), mode: both, policy: snapshot).rewrite?.id == "exact")
    }

    @Test func sameExactPatternTwiceFirstCoveringWins() {
        let snapshot = policy(variants: [
            Self.target("first", Self.url, when: .expensive),
            Self.target("second", Self.url, when: .always),
            Self.target("third", Self.url, when: .always),
        ])
        #expect(decide(request(Self.url), mode: normal, policy: snapshot).rewrite?.id == "second")
        #expect(decide(request(Self.url), mode: expensive, policy: snapshot).rewrite?.id == "first")
    }

    struct OrderRow: Sendable, CustomStringConvertible {
        var patterns: [String]
        var winner: String
        var description: String { patterns.joined(separator: ", ") }
    }

    /// Globs with a literal host and globs with a wildcard host sit in different indexes; the first in
    /// definition order still wins.
    static let orderRows: [OrderRow] = [
        OrderRow(patterns: ["http://cdn.example/img/*", "http://*.example/*"], winner: "v0"),
        OrderRow(patterns: ["http://*.example/*", "http://cdn.example/img/*"], winner: "v0"),
        OrderRow(patterns: ["http://other.example/*", "http://*.example/*", "http://cdn.example/img/*"], winner: "v1"),
        OrderRow(patterns: ["http://other.example/*", "http://cdn.example/*.png", "http://cdn.example/img/*"], winner: "v2"),
        OrderRow(patterns: ["http://cdn.example/*.png", "http://*.org/*", "http://*/*.jpg", "http://cdn.example/*"],
                 winner: "v2"),
        OrderRow(patterns: ["https://cdn.example/*", "http://cdn.example:8080/*", "http://cdn.example/*"], winner: "v2"),
        OrderRow(patterns: ["http://cdn.example*", "http://cdn.example/*"], winner: "v0"),
    ]

    @Test(arguments: orderRows)
    func firstGlobInOrderWins(row: OrderRow) {
        let snapshot = policy(variants: row.patterns.enumerated().map { Self.target("v\($0)", $1) })
        #expect(decide(request(Self.url), mode: normal, policy: snapshot).rewrite?.id == row.winner)
    }

    @Test func apiVariantsComeAfterConfigVariants() throws {
        let api = Self.target("api", "http://cdn.example/*", source: .api)
        let config = Self.target("config", "http://cdn.example/img/*")
        // Even when handed over first, API variants are ordered after config ones.
        let snapshot = policy(variants: [api, config])
        #expect(snapshot.variants.map(\.id) == ["config", "api"])
        #expect(decide(request(Self.url), mode: normal, policy: snapshot).rewrite?.id == "config")

        let replaced = try snapshot.replacingAPIVariants([Self.target("api2", "http://x.example/*")])
        #expect(replaced.variants.map(\.id) == ["config", "api2"])
        #expect(replaced.variants.map(\.source) == [.config, .api])
        #expect(decide(request("http://x.example/"), mode: normal, policy: replaced).rewrite?.id == "api2")
        #expect(decide(request("http://cdn.example/"), mode: normal, policy: replaced).rewrite == nil,
                "the old API variant is gone")
        let cleared = try replaced.replacingAPIVariants([])
        #expect(cleared.variants.map(\.id) == ["config"])
    }

    // MARK: CONNECT

    @Test(arguments: allModes)
    func variantsNeverApplyToConnect(mode: DataMode) {
        let snapshot = policy(variants: [Self.target("any", "https://*", when: .always),
                                         Self.target("exact", "https://video.example/", when: .always)])
        let facts = connect("video.example:443", fields: [("Allow-Constrained", "?0"), ("Allow-Expensive", "?0")])
        let decision = decide(facts, mode: mode, policy: snapshot)
        #expect(decision.rewrite == nil)
        #expect((decision.rejection != nil) == (mode != normal))
        // Even facts that look like a URL the variant would match are not rewritten when they are a tunnel.
        var tunnel = request("https://video.example/")
        tunnel.isConnect = true
        #expect(decide(tunnel, mode: mode, policy: snapshot).rewrite == nil)
    }

    // MARK: Pattern normalization

    @Test(arguments: [
        ("HTTP://CDN.Example/img/hero.jpg", "http://cdn.example/img/hero.jpg", true),
        ("http://cdn.example/IMG/hero.jpg", "http://cdn.example/img/hero.jpg", false),
        ("http://cdn.example:80/img/hero.jpg", "http://cdn.example/img/hero.jpg", true),
        ("https://cdn.example:443/a", "https://cdn.example/a", true),
        ("http://cdn.example:443/a", "http://cdn.example:443/a", true),
        ("http://cdn.example:8080/a", "http://cdn.example:8080/a", true),
        ("http://cdn.example:8080/a", "http://cdn.example/a", false),
        ("http://cdn.example", "http://cdn.example/", true),
        ("http://cdn.example?x=1", "http://cdn.example/?x=1", true),
        ("HTTP://CDN.EXAMPLE/*", "http://cdn.example/Any", true),
        ("http://*.EXAMPLE/A*", "http://cdn.example/Ab", true),
        ("http://*.EXAMPLE/A*", "http://cdn.example/ab", false),
        ("http://[::1]:80/x", "http://[::1]/x", true),
        ("http://[::1]:8080/x*", "http://[::1]:8080/x1", true),
    ])
    func patternsAreNormalizedLikeRequestURLs(match: String, url: String, matches: Bool) {
        let snapshot = policy(variants: [Variant(id: "v", match: match,
                                                 resource: .target("http://low.example/", redirect: false), when: .always)])
        #expect((decide(request(url), mode: normal, policy: snapshot).rewrite != nil) == matches)
        #expect(snapshot.variants[0].match == match, "the variant is kept as written (for GET /variants)")
    }
}
