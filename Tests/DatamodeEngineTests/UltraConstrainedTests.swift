import DatamodePolicy
import DatamodeTestSupport
import Foundation
import Testing

/// SPEC §15 through the engine: the third tag on the wire (parsed as strictly as the others, written upstream
/// exactly once), rejections with `Network-Unavailable-Reason: ultra-constrained`, variants and tunnels.
@Suite struct UltraConstrainedEngineTests {
    static let satellite = DataMode(constrained: true, expensive: true, ultraConstrained: true)
    static let ultraOnly = DataMode(constrained: false, expensive: false, ultraConstrained: true)

    // MARK: the tag written upstream

    @Test func withoutTheHeaderOrTheConditionTheOriginGetsAllowUltraConstrainedFalse() throws {
        let origin = try RecordingOrigin { _ in .ok() }
        defer { origin.stop() }
        let proxy = try ProxyHarness()
        defer { proxy.stop() }
        let client = try proxy.connect()

        try client.send(RequestText.make("GET", origin.url("/plain")))
        #expect(try client.readResponse().status == 200)
        let request = try #require(origin.requests.first)
        #expect(request.values(of: "Allow-Constrained") == ["?1"])
        #expect(request.values(of: "Allow-Expensive") == ["?1"])
        #expect(request.values(of: "Allow-Ultra-Constrained") == ["?0"])
        #expect(!request.contains("Save-Data"))
    }

    /// The client's own copies, in any spelling and however many, become exactly one field with the resolved value.
    @Test(arguments: [
        ([("Allow-Ultra-Constrained", "true")], "?1"),
        ([("allow-ultra-constrained", "?1"), ("ALLOW-ULTRA-CONSTRAINED", "1")], "?1"),
        ([("Allow-Ultra-Constrained", "?0, false")], "?0"),
        ([("Allow-Ultra-Constrained", "FALSE")], "?0"),
    ])
    func theClientsCopiesBecomeExactlyOneResolvedField(headers: [(String, String)], forwarded: String) throws {
        let origin = try RecordingOrigin { _ in .ok() }
        defer { origin.stop() }
        let proxy = try ProxyHarness()
        defer { proxy.stop() }
        let client = try proxy.connect()

        try client.send(RequestText.make("GET", origin.url("/tagged"), headers: headers))
        #expect(try client.readResponse().status == 200)
        let request = try #require(origin.requests.first)
        #expect(request.values(of: "Allow-Ultra-Constrained") == [forwarded], "\(request.headText)")
    }

    @Test func tagsForwardFalseStripsAllThree() throws {
        let origin = try RecordingOrigin { _ in .ok() }
        defer { origin.stop() }
        let proxy = try ProxyHarness(yaml: "tags: {forward: false}", mode: Self.satellite)
        defer { proxy.stop() }
        let client = try proxy.connect()

        try client.send(RequestText.make("GET", origin.url("/stripped"), headers: [("Allow-Ultra-Constrained", "?1")]))
        #expect(try client.readResponse().status == 200)
        let request = try #require(origin.requests.first)
        #expect(!request.contains("Allow-Constrained"))
        #expect(!request.contains("Allow-Expensive"))
        #expect(!request.contains("Allow-Ultra-Constrained"))
    }

    @Test(arguments: [
        [("Allow-Ultra-Constrained", "maybe")],
        [("Allow-Ultra-Constrained", "?2")],
        [("Allow-Ultra-Constrained", "")],
        [("Allow-Ultra-Constrained", "?1"), ("Allow-Ultra-Constrained", "?0")],
    ])
    func anInvalidOrConflictingTagIsRefused(headers: [(String, String)]) throws {
        let origin = try RecordingOrigin { _ in .ok() }
        defer { origin.stop() }
        let proxy = try ProxyHarness()
        defer { proxy.stop() }
        let client = try proxy.connect()

        try client.send(RequestText.make("GET", origin.url("/tagged"), headers: headers))
        let response = try client.readResponse()
        expectProblem(response, status: 400, error: "invalid-tag")
        #expect(response.problem?.detail?.contains("Allow-Ultra-Constrained") == true)
        expectOriginUntouched(origin)
    }

    // MARK: the decision

    @Test func inSatelliteModeOnlyAnOptedInRequestReachesTheOrigin() throws {
        let origin = try RecordingOrigin { request in .ok(request.target) }
        defer { origin.stop() }
        let proxy = try ProxyHarness(mode: Self.satellite)
        defer { proxy.stop() }
        let client = try proxy.connect()

        try client.send(RequestText.make("GET", origin.url("/page")))
        let rejected = try client.readResponse()
        expectProblem(rejected, status: 403, error: "ultra-constrained")
        #expect(rejected.value(of: "Network-Unavailable-Reason") == "ultra-constrained")
        #expect(rejected.value(of: "Cache-Control") == "no-store")
        let problem = try #require(rejected.problem)
        #expect(problem.title == "Not allowed on an ultra-constrained network")
        #expect(problem.reasons == ["ultra-constrained"])
        #expect(problem.mode == "constrained-expensive-ultra-constrained")
        #expect(problem.url == origin.url("/page"))
        #expect(origin.requests.isEmpty)

        // Same connection: opted in, it is forwarded with the tag (and Save-Data: the mode is constrained too).
        try client.send(RequestText.make("GET", origin.url("/page"), headers: [("Allow-Ultra-Constrained", "?1")]))
        let forwarded = try client.readResponse()
        #expect(forwarded.status == 200)
        #expect(forwarded.bodyText == "/page")
        let request = try #require(origin.requests.first)
        #expect(request.values(of: "Allow-Ultra-Constrained") == ["?1"])
        #expect(request.values(of: "Save-Data") == ["on"])
        #expect(origin.requests.count == 1)
    }

    @Test func severalViolationsNameTheFirstInSpecOrderAndListAll() throws {
        let origin = try RecordingOrigin { _ in .ok() }
        defer { origin.stop() }
        let proxy = try ProxyHarness(mode: DataMode(constrained: false, expensive: true, ultraConstrained: true))
        defer { proxy.stop() }
        let client = try proxy.connect()

        try client.send(RequestText.make("GET", origin.url("/x"), headers: [("Allow-Expensive", "?0")]))
        let response = try client.readResponse()
        expectProblem(response, status: 403, error: "expensive")
        #expect(response.value(of: "Network-Unavailable-Reason") == "expensive")
        #expect(response.problem?.reasons == ["expensive", "ultra-constrained"])
        #expect(response.problem?.mode == "expensive-ultra-constrained")
        expectOriginUntouched(origin)
    }

    /// Save-Data follows the constrained condition only (SPEC §3); an ultra-constrained mode alone does not send it.
    @Test func ultraConstrainedAloneSendsNoSaveData() throws {
        let origin = try RecordingOrigin { _ in .ok() }
        defer { origin.stop() }
        let proxy = try ProxyHarness(mode: Self.ultraOnly)
        defer { proxy.stop() }
        let client = try proxy.connect()

        try client.send(RequestText.make("GET", origin.url("/in"), headers: [("Allow-Ultra-Constrained", "1")]))
        #expect(try client.readResponse().status == 200)
        let request = try #require(origin.requests.first)
        #expect(request.values(of: "Allow-Ultra-Constrained") == ["?1"])
        #expect(!request.contains("Save-Data"))
    }

    @Test func aRuleOptsAHostIn() throws {
        let origin = try RecordingOrigin { _ in .ok() }
        defer { origin.stop() }
        let proxy = try ProxyHarness(yaml: """
            rules:
              - name: essential
                match: {path: "/essential/*"}
                tags: {allow-ultra-constrained: true}
            """, mode: Self.ultraOnly)
        defer { proxy.stop() }
        let client = try proxy.connect()

        try client.send(RequestText.make("GET", origin.url("/essential/status")))
        #expect(try client.readResponse().status == 200)
        #expect(origin.requests.last?.values(of: "Allow-Ultra-Constrained") == ["?1"])
        try client.send(RequestText.make("GET", origin.url("/feed")))
        expectProblem(try client.readResponse(), status: 403, error: "ultra-constrained")
        #expect(origin.requests.map(\.target) == ["/essential/status"])
    }

    @Test func aModeChangeToUltraConstrainedAppliesToTheNextRequest() throws {
        let origin = try RecordingOrigin { _ in .ok() }
        defer { origin.stop() }
        let proxy = try ProxyHarness()
        defer { proxy.stop() }
        let client = try proxy.connect()

        try client.send(RequestText.make("GET", origin.url("/a")))
        #expect(try client.readResponse().status == 200)
        proxy.setMode(Self.ultraOnly)
        try client.send(RequestText.make("GET", origin.url("/b")))
        expectProblem(try client.readResponse(), status: 403, error: "ultra-constrained")
        proxy.setMode(.normal)
        try client.send(RequestText.make("GET", origin.url("/c")))
        #expect(try client.readResponse().status == 200)
        #expect(origin.requests.map(\.target) == ["/a", "/c"])
    }

    // MARK: variants and tunnels

    @Test func aWhenUltraConstrainedVariantIsServedInThatModeOnly() throws {
        let origin = try RecordingOrigin { request in .ok("from \(request.target)") }
        defer { origin.stop() }
        let proxy = try ProxyHarness(yaml: """
            variants:
              - id: tiles-low
                match: "\(origin.url("/tiles/*.png"))"
                target: "\(origin.url("/tiles/low/$1.png"))"
                when: ultra-constrained
            """, mode: .normal)
        defer { proxy.stop() }
        let client = try proxy.connect()

        try client.send(RequestText.make("GET", origin.url("/tiles/1.png")))
        let normal = try client.readResponse()
        #expect(normal.bodyText == "from /tiles/1.png")
        #expect(!normal.contains("Data-Mode-Variant"))

        // Opted in, so nothing is violated: the variant applies because the mode has the condition.
        proxy.setMode(Self.ultraOnly)
        try client.send(RequestText.make("GET", origin.url("/tiles/1.png"), headers: [("Allow-Ultra-Constrained", "?1")]))
        let low = try client.readResponse()
        #expect(low.bodyText == "from /tiles/low/1.png")
        #expect(low.value(of: "Data-Mode-Variant") == "tiles-low")
        #expect(low.value(of: "Cache-Control") == "no-store")
    }

    @Test func aTunnelIsRefusedUnlessItOptsIn() throws {
        let origin = try RecordingOrigin { request in .ok("tunnelled \(request.target)") }
        defer { origin.stop() }
        let proxy = try ProxyHarness(yaml: "connect: {ports: [\(origin.port)]}", mode: Self.satellite)
        defer { proxy.stop() }

        let refused = try proxy.connect()
        try refused.send("CONNECT \(origin.authority) HTTP/1.1\r\nHost: \(origin.authority)\r\n\r\n")
        let response = try refused.readResponse(method: "CONNECT")
        expectProblem(response, status: 403, error: "ultra-constrained")
        #expect(response.value(of: "Network-Unavailable-Reason") == "ultra-constrained")
        expectOriginUntouched(origin)

        let client = try proxy.connect()
        try client.send("CONNECT \(origin.authority) HTTP/1.1\r\nHost: \(origin.authority)\r\n"
            + "Allow-Ultra-Constrained: ?1\r\n\r\n")
        #expect(try client.readResponse(method: "CONNECT").status == 200)
        try client.send("GET /inside HTTP/1.1\r\nHost: \(origin.authority)\r\n\r\n")
        #expect(try client.readResponse().bodyText == "tunnelled /inside")
    }
}
