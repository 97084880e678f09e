import DatamodePolicy
import DatamodeTestSupport
import Foundation
import Testing

/// SPEC §3–5 through the engine: tags written upstream, rejections, variants, mode changes.
@Suite struct DataModeTests {
    static let constrained = DataMode(constrained: true, expensive: false)
    static let expensive = DataMode(constrained: false, expensive: true)
    static let both = DataMode(constrained: true, expensive: true)

    // MARK: rejection (SPEC §4)

    @Test func aDisallowedRequestIsRejectedAndTheConnectionServesTheNextOne() throws {
        let origin = try RecordingOrigin { _ in .ok("page") }
        defer { origin.stop() }
        let proxy = try ProxyHarness(mode: Self.constrained)
        defer { proxy.stop() }
        let client = try proxy.connect()

        try client.send(RequestText.make("GET", origin.url("/video.mp4"), headers: [("Allow-Constrained", "?0")]))
        let rejected = try client.readResponse()

        expectProblem(rejected, status: 403, error: "constrained")
        #expect(rejected.value(of: "Network-Unavailable-Reason") == "constrained")
        #expect(rejected.value(of: "Cache-Control") == "no-store")
        let problem = try #require(rejected.problem)
        #expect(problem.title == "Not allowed on a constrained network")
        #expect(problem.reasons == ["constrained"])
        #expect(problem.mode == "constrained")
        #expect(problem.url == origin.url("/video.mp4"))
        expectOriginUntouched(origin)

        // Same connection: the rejection did not close it.
        try client.send(RequestText.make("GET", origin.url("/page")))
        let next = try client.readResponse()
        #expect(next.status == 200)
        #expect(next.bodyText == "page")
        #expect(origin.requests.map(\.target) == ["/page"])
    }

    @Test func aRejectedRequestsBodyIsDiscardedNotParsedAsTheNextRequest() throws {
        let origin = try RecordingOrigin { request in .ok(request.target) }
        defer { origin.stop() }
        let proxy = try ProxyHarness(mode: Self.constrained)
        defer { proxy.stop() }
        let client = try proxy.connect()

        let hidden = RequestText.make("GET", origin.url("/hidden"))
        try client.send(RequestText.make("POST", origin.url("/upload"), headers: [("Allow-Constrained", "false")], body: hidden)
            + RequestText.make("GET", origin.url("/visible")))
        expectProblem(try client.readResponse(), status: 403, error: "constrained")
        let next = try client.readResponse()
        #expect(next.status == 200)
        #expect(next.bodyText == "/visible")
        #expect(origin.requests.map(\.target) == ["/visible"])
    }

    @Test func violatingBothConditionsListsBothReasons() throws {
        let origin = try RecordingOrigin { _ in .ok() }
        defer { origin.stop() }
        let proxy = try ProxyHarness(mode: Self.both)
        defer { proxy.stop() }
        let client = try proxy.connect()

        try client.send(RequestText.make("GET", origin.url("/x"), headers: [("Allow-Constrained", "?0"), ("Allow-Expensive", "0")]))
        let response = try client.readResponse()

        expectProblem(response, status: 403, error: "constrained")
        #expect(response.value(of: "Network-Unavailable-Reason") == "constrained")
        #expect(response.problem?.reasons == ["constrained", "expensive"])
        #expect(response.problem?.mode == "constrained-expensive")
        expectOriginUntouched(origin)
    }

    @Test func anExpensiveViolationIsRejectedAsExpensive() throws {
        let origin = try RecordingOrigin { _ in .ok() }
        defer { origin.stop() }
        let proxy = try ProxyHarness(mode: Self.expensive)
        defer { proxy.stop() }
        let client = try proxy.connect()

        // Allow-Constrained: ?0 is no violation when the mode is only expensive.
        try client.send(RequestText.make("GET", origin.url("/ok"), headers: [("Allow-Constrained", "?0")]))
        #expect(try client.readResponse().status == 200)
        try client.send(RequestText.make("GET", origin.url("/x"), headers: [("Allow-Expensive", "FALSE")]))
        let response = try client.readResponse()

        expectProblem(response, status: 403, error: "expensive")
        #expect(response.value(of: "Network-Unavailable-Reason") == "expensive")
        #expect(response.problem?.reasons == ["expensive"])
        #expect(origin.requests.map(\.target) == ["/ok"])
    }

    @Test func aPrefetchIsDiscretionaryWhileConstrained() throws {
        let origin = try RecordingOrigin { _ in .ok() }
        defer { origin.stop() }
        let proxy = try ProxyHarness(mode: Self.constrained)
        defer { proxy.stop() }
        let client = try proxy.connect()

        try client.send(RequestText.make("GET", origin.url("/next-page"), headers: [("Sec-Purpose", "prefetch")]))
        expectProblem(try client.readResponse(), status: 403, error: "constrained")
        expectOriginUntouched(origin)
    }

    @Test func aRuleTagsMatchingRequests() throws {
        let origin = try RecordingOrigin { _ in .ok() }
        defer { origin.stop() }
        let proxy = try ProxyHarness(yaml: """
            rules:
              - name: videos
                match: {path: "*.mp4"}
                tags: {allow-constrained: false}
            """)
        defer { proxy.stop() }
        let client = try proxy.connect()

        // Normal mode: forwarded, with the rule's tag written upstream.
        try client.send(RequestText.make("GET", origin.url("/movie.mp4")))
        #expect(try client.readResponse().status == 200)
        #expect(origin.requests.last?.value(of: "Allow-Constrained") == "?0")

        proxy.setMode(Self.constrained)
        try client.send(RequestText.make("GET", origin.url("/movie.mp4")))
        expectProblem(try client.readResponse(), status: 403, error: "constrained")
        try client.send(RequestText.make("GET", origin.url("/page.html")))
        #expect(try client.readResponse().status == 200)
        #expect(origin.requests.map(\.target) == ["/movie.mp4", "/page.html"])
    }

    // MARK: tags written upstream (SPEC §3)

    @Test func whileConstrainedTheOriginGetsExactlyOneOfEachTagAndSaveData() throws {
        let origin = try RecordingOrigin { _ in .ok() }
        defer { origin.stop() }
        let proxy = try ProxyHarness(mode: Self.constrained)
        defer { proxy.stop() }
        let client = try proxy.connect()

        // The client's own spellings (and its own Save-Data) must not be duplicated upstream.
        try client.send(RequestText.make("GET", origin.url("/tags"), headers: [
            ("allow-constrained", "true"), ("Allow-Expensive", "1"), ("Save-Data", "on"),
        ]))
        #expect(try client.readResponse().status == 200)
        try client.send(RequestText.make("GET", origin.url("/untagged")))
        #expect(try client.readResponse().status == 200)

        let requests = origin.requests
        try #require(requests.count == 2)
        for request in requests {
            #expect(request.values(of: "Allow-Constrained") == ["?1"], "\(request.headText)")
            #expect(request.values(of: "Allow-Expensive") == ["?1"], "\(request.headText)")
            #expect(request.values(of: "Save-Data") == ["on"], "\(request.headText)")
        }
    }

    @Test func inNormalModeTheOriginGetsTheTagsButNoSaveData() throws {
        let origin = try RecordingOrigin { _ in .ok() }
        defer { origin.stop() }
        let proxy = try ProxyHarness()
        defer { proxy.stop() }
        let client = try proxy.connect()

        try client.send(RequestText.make("GET", origin.url("/normal"), headers: [("Allow-Constrained", "?0")]))
        #expect(try client.readResponse().status == 200)

        let request = try #require(origin.requests.first)
        #expect(request.values(of: "Allow-Constrained") == ["?0"])
        #expect(request.values(of: "Allow-Expensive") == ["?1"])
        #expect(!request.contains("Save-Data"))
    }

    @Test func tagsForwardFalseStripsTheTags() throws {
        let origin = try RecordingOrigin { _ in .ok() }
        defer { origin.stop() }
        let proxy = try ProxyHarness(yaml: "tags: {forward: false, save-data: false}", mode: Self.constrained)
        defer { proxy.stop() }
        let client = try proxy.connect()

        try client.send(RequestText.make("GET", origin.url("/stripped"), headers: [("Allow-Constrained", "?1")]))
        #expect(try client.readResponse().status == 200)

        let request = try #require(origin.requests.first)
        #expect(!request.contains("Allow-Constrained"))
        #expect(!request.contains("Allow-Expensive"))
        #expect(!request.contains("Save-Data"))
    }

    @Test(arguments: [
        [("Allow-Constrained", "maybe")],
        [("Allow-Constrained", "?0"), ("Allow-Constrained", "?1")],
        [("Allow-Expensive", "?2")],
        [("Allow-Expensive", "")],
    ])
    func anInvalidTagIsRefused(headers: [(String, String)]) throws {
        let origin = try RecordingOrigin { _ in .ok() }
        defer { origin.stop() }
        let proxy = try ProxyHarness()
        defer { proxy.stop() }
        let client = try proxy.connect()

        try client.send(RequestText.make("GET", origin.url("/tagged"), headers: headers))
        expectProblem(try client.readResponse(), status: 400, error: "invalid-tag")
        expectOriginUntouched(origin)
    }

    // MARK: mode changes (SPEC §2)

    @Test func aModeChangeAppliesToTheNextRequestOnAnOpenConnection() throws {
        let origin = try RecordingOrigin { request in .ok(request.target) }
        defer { origin.stop() }
        let proxy = try ProxyHarness()
        defer { proxy.stop() }
        let client = try proxy.connect()
        let request = RequestText.make("GET", origin.url("/hd.mp4"), headers: [("Allow-Constrained", "?0")])

        try client.send(request)
        #expect(try client.readResponse().status == 200)

        proxy.runtime.update { $0.mode = Self.constrained }
        try client.send(request)
        let rejected = try client.readResponse()
        expectProblem(rejected, status: 403, error: "constrained")

        proxy.runtime.update { $0.mode = .normal }
        try client.send(request)
        #expect(try client.readResponse().status == 200)

        #expect(origin.requests.count == 2)
        #expect(origin.requests.allSatisfy { !$0.contains("Save-Data") })
    }

    // MARK: variants (SPEC §5)

    @Test func aURLVariantIsFetchedInsteadWhenTheRequestIsDisallowed() throws {
        let original = try RecordingOrigin { request in .ok("original \(request.target)") }
        defer { original.stop() }
        let cdn = try RecordingOrigin { request in .ok("small \(request.target)", headers: [("Content-Type", "image/jpeg")]) }
        defer { cdn.stop() }
        let proxy = try ProxyHarness(yaml: """
            variants:
              - id: hero-small
                match: "\(original.url("/img/*.jpg"))"
                target: "\(cdn.url("/img/$1@small.jpg"))"
                when: disallowed
            """, mode: Self.constrained)
        defer { proxy.stop() }
        let client = try proxy.connect()

        try client.send(RequestText.make("GET", original.url("/img/hero.jpg"), headers: [("Allow-Constrained", "?0")]))
        let rewritten = try client.readResponse()
        #expect(rewritten.status == 200)
        #expect(rewritten.bodyText == "small /img/hero@small.jpg")
        #expect(rewritten.value(of: "Data-Mode-Variant") == "hero-small")
        #expect(rewritten.value(of: "Content-Type") == "image/jpeg")
        let fetched = try #require(cdn.requests.first)
        #expect(fetched.target == "/img/hero@small.jpg")
        #expect(fetched.values(of: "Host") == [cdn.authority])

        // An allowed request is not rewritten (when: disallowed).
        try client.send(RequestText.make("GET", original.url("/img/hero.jpg")))
        let allowed = try client.readResponse()
        #expect(allowed.bodyText == "original /img/hero.jpg")
        #expect(!allowed.contains("Data-Mode-Variant"))
        #expect(original.requests.map(\.target) == ["/img/hero.jpg"])
        #expect(cdn.requests.count == 1)
    }

    @Test func anAlwaysVariantMapsRemoteInEveryMode() throws {
        let origin = try RecordingOrigin { request in .ok(request.target) }
        defer { origin.stop() }
        let proxy = try ProxyHarness(yaml: """
            variants:
              - id: api-v2
                match: "\(origin.url("/api/v1/*"))"
                target: "\(origin.url("/api/v2/$1"))"
                when: always
            """)
        defer { proxy.stop() }
        let client = try proxy.connect()

        try client.send(RequestText.make("GET", origin.url("/api/v1/users?page=2")))
        let response = try client.readResponse()
        #expect(response.bodyText == "/api/v2/users?page=2")
        #expect(response.value(of: "Data-Mode-Variant") == "api-v2")
    }

    @Test func aRedirectVariantAnswers307WithTheTargetAsLocation() throws {
        let origin = try RecordingOrigin { _ in .ok() }
        defer { origin.stop() }
        let proxy = try ProxyHarness(yaml: """
            variants:
              - id: low-res
                match: "\(origin.url("/video/*.mp4"))"
                target: "\(origin.url("/video/$1-240p.mp4"))"
                action: redirect
            """, mode: Self.constrained)
        defer { proxy.stop() }
        let client = try proxy.connect()

        try client.send(RequestText.make("GET", origin.url("/video/intro.mp4"), headers: [("Allow-Constrained", "?0")]))
        let response = try client.readResponse()

        #expect(response.status == 307)
        #expect(response.value(of: "Location") == origin.url("/video/intro-240p.mp4"))
        #expect(response.value(of: "Data-Mode-Variant") == "low-res")
        expectOriginUntouched(origin)
    }

    @Test func aFileVariantIsServedWithItsLengthTypeAndExactBytes() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("datamode-variant-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory.appendingPathComponent("variants"), withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let pattern = PatternBody(length: 300_001, seed: 99)
        let file = directory.appendingPathComponent("variants/promo-poster.jpg")
        try Data(pattern.bytes).write(to: file)

        let origin = try RecordingOrigin { _ in .ok() }
        defer { origin.stop() }
        let proxy = try ProxyHarness(yaml: """
            variants:
              - id: promo-video-poster
                match: "\(origin.url("/promo.mp4"))"
                file: "variants/promo-poster.jpg"
            """, mode: Self.constrained, baseDirectory: directory.path)
        defer { proxy.stop() }
        let client = try proxy.connect()
        let headers = [("Allow-Constrained", "?0")]

        try client.send(RequestText.make("GET", origin.url("/promo.mp4"), headers: headers))
        var sum = StreamChecksum()
        let response = try client.readResponse(bodySink: { sum.update($0) })
        #expect(response.status == 200)
        #expect(response.value(of: "Content-Length") == "300001")
        #expect(response.value(of: "Content-Type") == "image/jpeg")
        #expect(response.value(of: "Data-Mode-Variant") == "promo-video-poster")
        #expect(sum.length == pattern.length)
        #expect(sum.value == pattern.checksum)

        try client.send(RequestText.make("HEAD", origin.url("/promo.mp4"), headers: headers))
        let head = try client.readResponse(method: "HEAD")
        #expect(head.status == 200)
        #expect(head.value(of: "Content-Length") == "300001")
        #expect(head.value(of: "Content-Type") == "image/jpeg")
        #expect(head.body.isEmpty)

        // Nothing followed the HEAD response: the next response is read cleanly.
        try client.send(RequestText.make("GET", origin.url("/promo.mp4"), headers: headers))
        let again = try client.readResponse()
        #expect(again.body.count == 300_001)
        #expect(StreamChecksum.of(again.body) == pattern.checksum)
        expectOriginUntouched(origin)
    }
}
