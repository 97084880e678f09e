import DatamodeEngine
import DatamodeHTTP
import DatamodePolicy
import DatamodeTestSupport
import Foundation
import Synchronization
import Testing

/// SPEC §10 through real sockets: a link profile's rates make transfers take the time they would on that link,
/// each way and through tunnels, its latency comes before the response head (once per tunnel), the scope decides
/// who shares the buckets, and a profile change applies to the next request.
///
/// The issue's "3G makes 1 MB take 10 s" is scaled to faster profiles so each test takes a second or two. The
/// bounds are loose on the fast side (the machine is loaded: a transfer may take longer than the link allows)
/// and tight on the slow side, where shaping is what is under test: no transfer may beat its link by more than
/// the burst. Accuracy (±5%) is measured in bench/, not here.
@Suite(.serialized) struct LinkShapingTests {
    /// 8 Mbit/s = 1,000,000 bytes/s down; a fast up link unless a test needs it slow.
    static func yaml(down: String = "8Mbit", up: String = "8Mbit", latency: String = "0", scope: String = "client",
                     extra: String = "") -> String {
        """
        mode: constrained
        profiles:
          test-link: {down: \(down), up: \(up), latency: \(latency)}
        conditions:
          constrained: {profile: test-link}
        shaping-scope: \(scope)
        \(extra)
        """
    }

    static func seconds(_ duration: Duration) -> Double {
        Double(duration.components.seconds) + Double(duration.components.attoseconds) / 1e18
    }

    static func download(_ client: RawHTTPClient, _ url: String) throws -> (ParsedResponse, Double, StreamChecksum) {
        var received = StreamChecksum()
        let started = ContinuousClock.now
        try client.send(RequestText.make("GET", url))
        let response = try client.readResponse(bodySink: { received.update($0) })
        return (response, seconds(ContinuousClock.now - started), received)
    }

    /// `download`, and the response must be a `200` with the pattern's body, whole. Returns the seconds it took.
    static func downloadWhole(_ client: RawHTTPClient, _ url: String, _ pattern: PatternBody,
                              sourceLocation: SourceLocation = #_sourceLocation) throws -> Double {
        let (response, elapsed, received) = try download(client, url)
        #expect(response.status == 200, sourceLocation: sourceLocation)
        #expect(received.length == pattern.length, sourceLocation: sourceLocation)
        #expect(received.value == pattern.checksum, sourceLocation: sourceLocation)
        return elapsed
    }

    @Test("1.5 MB through an 8 Mbit/s profile takes about 1.5 s and arrives whole")
    func downloadIsShaped() throws {
        let pattern = PatternBody(length: 1_500_000, seed: 3)
        let origin = try RecordingOrigin { _ in .stream(status: 200, body: BodyGenerator(pattern)) }
        defer { origin.stop() }
        let proxy = try ProxyHarness(yaml: Self.yaml())
        defer { proxy.stop() }
        let client = try proxy.connect(timeout: .seconds(30))

        let elapsed = try Self.downloadWhole(client, origin.url("/big.bin"), pattern)
        // 1.5 s at the rate, less at most the 50 ms burst; generous above.
        #expect(elapsed >= 1.35, "took \(elapsed) s")
        #expect(elapsed < 6, "took \(elapsed) s")
    }

    @Test("A large shaped body goes to splice(2) with each read capped by the bucket: 3 MB at 16 Mbit/s takes about 1.5 s")
    func largeShapedBodyIsSplicedAndStillShaped() throws {
        let pattern = PatternBody(length: 3_000_000, seed: 4)
        let origin = try RecordingOrigin { _ in .stream(status: 200, body: BodyGenerator(pattern), framing: .contentLength) }
        defer { origin.stop() }
        let proxy = try ProxyHarness(yaml: Self.yaml(down: "16Mbit"))
        defer { proxy.stop() }
        let client = try proxy.connect(timeout: .seconds(30))

        let elapsed = try Self.downloadWhole(client, origin.url("/big.bin"), pattern)
        // The body left user space once what was read drained through the bucket...
        #expect(proxy.server.metrics().bodySplices == 1)
        // ...and the splice kept the rate: 1.5 s at 2 MB/s, less at most the 50 ms burst.
        #expect(elapsed >= 1.35, "took \(elapsed) s")
        #expect(elapsed < 8, "took \(elapsed) s")
    }

    @Test("At 1 Gbit/s a large body moves kernel to kernel, arrives whole, and each byte counts once against a budget")
    func gigabitBodyIsSplicedAndCountedOnce() throws {
        let pattern = PatternBody(length: 16 << 20, seed: 6)
        let origin = try RecordingOrigin { _ in .stream(status: 200, body: BodyGenerator(pattern), framing: .contentLength) }
        defer { origin.stop() }
        let proxy = try ProxyHarness(yaml: Self.yaml(down: "1Gbit", up: "1Gbit", extra: """
            budgets:
              - {name: all, bytes: 1GB, period: month, then: constrained}
            """))
        defer { proxy.stop() }
        let client = try proxy.connect(timeout: .seconds(60))

        _ = try Self.downloadWhole(client, origin.url("/big.bin"), pattern)
        #expect(proxy.server.metrics().bodySplices == 1)
        // The request as the origin got it, the body, and the response head: the spliced bytes were counted once
        // each (a lost or doubled report of the relay would be 256 KiB off).
        let used = proxy.instance.budgets.used(0)
        let sentToOrigin = UInt64(origin.bytesReceived)
        #expect(used >= sentToOrigin + pattern.length + 17, "used \(used)")
        #expect(used <= sentToOrigin + pattern.length + 300, "used \(used)")
    }

    @Test("The same download is not shaped in a mode without a profile")
    func unshapedModeIsNotShaped() throws {
        let pattern = PatternBody(length: 1_500_000, seed: 3)
        let origin = try RecordingOrigin { _ in .stream(status: 200, body: BodyGenerator(pattern)) }
        defer { origin.stop() }
        let proxy = try ProxyHarness(yaml: Self.yaml(down: "100kbit"), mode: .normal)
        defer { proxy.stop() }
        let client = try proxy.connect(timeout: .seconds(30))
        let (response, elapsed, received) = try Self.download(client, origin.url("/big.bin"))
        #expect(response.status == 200)
        #expect(received.value == pattern.checksum)
        // At 100 kbit/s this would take two minutes.
        #expect(elapsed < 20, "took \(elapsed) s")
    }

    @Test("An upload passes the up bucket: 750 kB at 4 Mbit/s takes about 1.5 s")
    func uploadIsShaped() throws {
        let origin = try RecordingOrigin(maxRecordedBodyBytes: 1 << 20) { request in
            .ok("\(request.payloadLength) \(request.payloadChecksum)")
        }
        defer { origin.stop() }
        let proxy = try ProxyHarness(yaml: Self.yaml(down: "1Gbit", up: "4Mbit"))
        defer { proxy.stop() }
        let client = try proxy.connect(timeout: .seconds(30))
        let pattern = PatternBody(length: 750_000, seed: 5)
        let started = ContinuousClock.now
        try client.send("PUT \(origin.url("/up.bin")) HTTP/1.1\r\nHost: \(origin.authority)\r\nContent-Length: \(pattern.length)\r\n\r\n")
        let sent = try client.send(pattern)
        let response = try client.readResponse()
        let elapsed = Self.seconds(ContinuousClock.now - started)
        #expect(response.status == 200)
        #expect(response.bodyText == "\(pattern.length) \(sent)")
        #expect(elapsed >= 1.35, "took \(elapsed) s")
        #expect(elapsed < 6, "took \(elapsed) s")
    }

    @Test("The latency comes before the response head, once per request; a profile change applies to the next request")
    func latencyBeforeTheHead() throws {
        let origin = try RecordingOrigin { _ in .ok("small") }
        defer { origin.stop() }
        let proxy = try ProxyHarness(yaml: Self.yaml(down: "1Gbit", up: "1Gbit", latency: "600ms"), mode: .normal)
        defer { proxy.stop() }
        let client = try proxy.connect()

        func timed() throws -> Double {
            let started = ContinuousClock.now
            try client.send(RequestText.make("GET", origin.url("/s")))
            let response = try client.readResponse()
            #expect(response.bodyText == "small")
            return Self.seconds(ContinuousClock.now - started)
        }
        // Normal mode: no profile.
        let plain = try timed()
        #expect(plain < 0.5, "took \(plain) s")
        // The mode brings the profile: the next request on the same connection waits for its latency.
        proxy.runtime.update { $0.mode = DataMode(constrained: true, expensive: false) }
        let slowed = try timed()
        #expect(slowed >= 0.59, "took \(slowed) s")
        // And PUT /conditions semantics: a profile set through the API beats the mode's, and goes when cleared.
        proxy.runtime.update {
            $0.mode = .normal
            $0.apiProfile = "test-link"
        }
        #expect(try timed() >= 0.59)
        proxy.runtime.update { $0.apiProfile = nil }
        let again = try timed()
        #expect(again < 0.5, "took \(again) s")
    }

    @Test("Jitter moves each added latency uniformly within ±jitter")
    func jitter() throws {
        let origin = try RecordingOrigin { _ in .ok("j") }
        defer { origin.stop() }
        let proxy = try ProxyHarness(yaml: """
            mode: constrained
            profiles:
              jittery: {down: 1Gbit, up: 1Gbit, latency: 200ms, jitter: 200ms}
            conditions:
              constrained: {profile: jittery}
            """)
        defer { proxy.stop() }
        let client = try proxy.connect()
        var times: [Double] = []
        for index in 0..<8 {
            let started = ContinuousClock.now
            try client.send(RequestText.make("GET", origin.url("/\(index)")))
            #expect(try client.readResponse().bodyText == "j")
            times.append(Self.seconds(ContinuousClock.now - started))
        }
        // Each within 0–400 ms (loaded machine: generous above); eight uniform draws all within 50 ms of each other
        // would be a one-in-a-million event.
        #expect(times.allSatisfy { $0 < 1.0 }, "\(times)")
        #expect(times.max()! - times.min()! > 0.05, "\(times)")
    }

    @Test("A session's profile beats the API's and the mode's, for that session's requests only (SPEC §10, §12)")
    func sessionProfile() throws {
        let origin = try RecordingOrigin { _ in .ok("s") }
        defer { origin.stop() }
        let proxy = try ProxyHarness(yaml: Self.yaml(down: "1Gbit", up: "1Gbit", latency: "500ms", extra: "sessions: {enabled: true}"),
                                     mode: .normal)
        defer { proxy.stop() }
        #expect(try proxy.admin().put("/sessions/rig", #"{"mode": "normal", "profile": "test-link"}"#).status == 201)
        let client = try proxy.connect()
        func timed(_ headers: [(String, String)]) throws -> Double {
            let started = ContinuousClock.now
            try client.send(RequestText.make("GET", origin.url("/x"), headers: headers))
            #expect(try client.readResponse().bodyText == "s")
            return Self.seconds(ContinuousClock.now - started)
        }
        let inSession = try timed([("Data-Mode-Session", "rig")])
        #expect(inSession >= 0.49, "in the session: \(inSession) s")
        let outside = try timed([])
        #expect(outside < 0.45, "outside the session (normal mode, no profile): \(outside) s")
    }

    @Test("A response the origin sends and closes at once is held for the latency, then relayed whole")
    func heldResponseWithOriginClose() throws {
        let origin = try RecordingOrigin { _ in
            .raw("HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil-close body", thenClose: true)
        }
        defer { origin.stop() }
        let proxy = try ProxyHarness(yaml: Self.yaml(down: "1Gbit", up: "1Gbit", latency: "300ms"))
        defer { proxy.stop() }
        let client = try proxy.connect()
        let started = ContinuousClock.now
        try client.send(RequestText.make("GET", origin.url("/c")))
        let response = try client.readResponse()
        #expect(response.status == 200)
        #expect(response.bodyText == "until-close body")
        #expect(Self.seconds(ContinuousClock.now - started) >= 0.29)
    }

    @Test("A CONNECT tunnel is shaped and gets the latency once, before its first byte")
    func tunnelIsShaped() throws {
        let echo = try EchoServer()
        defer { echo.stop() }
        let proxy = try ProxyHarness(yaml: Self.yaml(down: "4Mbit", up: "1Gbit", latency: "400ms",
                                                     extra: "connect: {ports: [\(echo.port)]}"))
        defer { proxy.stop() }
        let client = try proxy.connect(timeout: .seconds(30))
        #expect(try client.openTunnel(to: "127.0.0.1:\(echo.port)").status == 200)

        var started = ContinuousClock.now
        #expect(try client.echoRoundTrip([1, 2, 3]) == [1, 2, 3])
        let first = Self.seconds(ContinuousClock.now - started)
        #expect(first >= 0.39, "first byte after \(first) s")
        started = ContinuousClock.now
        #expect(try client.echoRoundTrip([4]) == [4])
        let second = Self.seconds(ContinuousClock.now - started)
        #expect(second < 0.35, "second round trip took \(second) s")

        // 500 kB at 4 Mbit/s (500 kB/s) down: about a second; not spliced.
        let payload = (0..<500_000).map { UInt8(truncatingIfNeeded: $0 &* 31) }
        started = ContinuousClock.now
        #expect(try client.echoRoundTrip(payload) == payload)
        let bulk = Self.seconds(ContinuousClock.now - started)
        #expect(bulk >= 0.9, "took \(bulk) s")
        #expect(bulk < 6, "took \(bulk) s")
        #expect(proxy.server.metrics().tunnelSplices == 0)
    }

    /// `connections` downloads at once, 1 MB in all, through 4 Mbit/s (500 kB/s), from two client addresses
    /// taking turns: the wall time of all, and the shortest download.
    static func twoClients(scope: String, connections: Int) throws -> (wall: Double, shortest: Double) {
        let pattern = PatternBody(length: 1_000_000 / UInt64(connections), seed: 9)
        let origin = try RecordingOrigin { _ in .stream(status: 200, body: BodyGenerator(pattern)) }
        defer { origin.stop() }
        // Two workers: with SO_REUSEPORT the connections spread over both, and a link cap must hold across them.
        let proxy = try ProxyHarness(yaml: Self.yaml(down: "4Mbit", scope: scope), threads: 2)
        defer { proxy.stop() }
        let sources = (0..<connections).map { $0 % 2 == 0 ? "127.0.0.1" : "127.0.0.2" }
        let url = origin.url("/part")
        let durations = Mutex<[Double]>([])
        let started = ContinuousClock.now
        DispatchQueue.concurrentPerform(iterations: connections) { index in
            if let client = try? proxy.connect(timeout: .seconds(30), source: sources[index]),
               let (response, elapsed, received) = try? Self.download(client, url),
               response.status == 200, received.value == pattern.checksum {
                durations.withLock { $0.append(elapsed) }
            }
        }
        let wall = Self.seconds(ContinuousClock.now - started)
        let all = durations.withLock { $0 }
        #expect(all.count == connections, "every download completes intact")
        return (wall, all.min() ?? 0)
    }

    @Test("At high rates a spliced body waits for a quarter of the burst at a time, not for every 256 KiB")
    func fastLinkWakesPerQuantum() throws {
        // 400 Mbit/s: a 2.5 MB burst, so a 625 KB quantum. The 16 MiB less the burst is ~23 wake-ups of the shaping
        // timer (a few while what was read drained before the splice); with the quantum capped at 256 KiB, 54.
        // Upper bound only: a slow machine wakes less often, finding more in the bucket each time.
        let pattern = PatternBody(length: 16 << 20, seed: 7)
        let origin = try RecordingOrigin { _ in .stream(status: 200, body: BodyGenerator(pattern), framing: .contentLength) }
        defer { origin.stop() }
        let proxy = try ProxyHarness(yaml: Self.yaml(down: "400Mbit", up: "1Gbit"))
        defer { proxy.stop() }
        let client = try proxy.connect(timeout: .seconds(60))

        let (response, _, received) = try Self.download(client, origin.url("/big.bin"))
        #expect(response.status == 200)
        #expect(received.value == pattern.checksum)
        #expect(proxy.server.metrics().bodySplices == 1)
        let wakeups = proxy.server.metrics().shapingWakeups
        #expect(wakeups <= 35, "\(wakeups) shaping wake-ups")
    }

    @Test("Link scope: all traffic shares one pair of buckets, across workers")
    func linkScopeSharesOneBucket() throws {
        // 1 MB in all at 500 kB/s: about two seconds whoever asks and whichever worker serves them.
        let (wall, _) = try Self.twoClients(scope: "link", connections: 4)
        #expect(wall >= 1.85, "took \(wall) s")
        #expect(wall < 8)
    }

    @Test("Link scope: spliced bodies on several connections and workers share the one bucket")
    func splicedBodiesShareTheLinkBucket() throws {
        // 3 × 2 MB at 24 Mbit/s (3 MB/s) for the whole link: about two seconds, each body spliced.
        let pattern = PatternBody(length: 2_000_000, seed: 10)
        let origin = try RecordingOrigin { _ in .stream(status: 200, body: BodyGenerator(pattern), framing: .contentLength) }
        defer { origin.stop() }
        let proxy = try ProxyHarness(yaml: Self.yaml(down: "24Mbit", scope: "link"), threads: 2)
        defer { proxy.stop() }
        let url = origin.url("/part")
        let intact = Mutex(0)
        let started = ContinuousClock.now
        DispatchQueue.concurrentPerform(iterations: 3) { _ in
            if let client = try? proxy.connect(timeout: .seconds(30)),
               let (response, _, received) = try? Self.download(client, url),
               response.status == 200, received.value == pattern.checksum {
                intact.withLock { $0 += 1 }
            }
        }
        let wall = Self.seconds(ContinuousClock.now - started)
        #expect(intact.withLock { $0 } == 3, "every download completes intact")
        #expect(proxy.server.metrics().bodySplices == 3)
        #expect(wall >= 1.85, "took \(wall) s")
        #expect(wall < 10, "took \(wall) s")
    }

    @Test("Client scope: each client address has its own pair of buckets")
    func clientScopeIsPerAddress() throws {
        // Two addresses, each 500 kB at 500 kB/s on its own buckets: a second each, not two in all.
        let (wall, shortest) = try Self.twoClients(scope: "client", connections: 2)
        #expect(shortest >= 0.9, "fastest took \(shortest) s")
        #expect(wall < 1.8, "took \(wall) s: the two clients shared a bucket")
    }
}
