import DatamodeTestSupport
import Foundation
import Testing

/// Issue 12: an idle keep-alive client connection gives its bufferevent and buffers back (it is "parked") and
/// takes them again when its next byte or its EOF arrives, without changing anything a client can see.
/// `client-idle: 800ms` parks a connection after 400 ms idle (half of it) and closes it at 800 ms.
@Suite struct IdleParkingTests {
    static let yaml = "timeouts: {client-idle: 800ms}\n"

    func waitUntil(_ condition: () -> Bool, within: Duration = .seconds(5)) -> Bool {
        let deadline = ContinuousClock.now + within
        while ContinuousClock.now < deadline {
            if condition() { return true }
            Thread.sleep(forTimeInterval: 0.02)
        }
        return condition()
    }

    @Test func aParkedConnectionServesItsNextRequestsAndPipelines() throws {
        let origin = try RecordingOrigin { request in .ok("answer to \(request.target)") }
        defer { origin.stop() }
        let proxy = try ProxyHarness(yaml: Self.yaml, threads: 1)
        defer { proxy.stop() }
        let client = try proxy.connect()

        try client.send(RequestText.make("GET", origin.url("/1")))
        #expect(try client.readResponse().bodyText == "answer to /1")
        #expect(waitUntil { proxy.server.metrics().connectionsParked == 1 }, "idle for 400 ms: parked")

        // Two pipelined requests in one write wake it; both are answered, in order.
        try client.send(RequestText.make("GET", origin.url("/2")) + RequestText.make("GET", origin.url("/3")))
        #expect(try client.readResponse().bodyText == "answer to /2")
        #expect(try client.readResponse().bodyText == "answer to /3")
        #expect(proxy.server.metrics().connectionsParked == 0)
        #expect(origin.requests.map(\.target) == ["/1", "/2", "/3"])

        // Parked again, then woken by a head that arrives a byte at a time.
        #expect(waitUntil { proxy.server.metrics().connectionsParked == 1 })
        let trickled = client.trickle(Array(RequestText.make("GET", origin.url("/4")).utf8), step: 7, pause: .milliseconds(5))
        #expect(!trickled.cutOff)
        #expect(try client.readResponse().bodyText == "answer to /4")
    }

    @Test func aParkedConnectionStillClosesAtClientIdleAndOnItsClientsEOF() throws {
        let origin = try RecordingOrigin { _ in .ok("x") }
        defer { origin.stop() }
        let proxy = try ProxyHarness(yaml: Self.yaml, threads: 1)
        defer { proxy.stop() }

        let idle = try proxy.connect()
        try idle.send(RequestText.make("GET", origin.url("/a")))
        _ = try idle.readResponse()
        let started = ContinuousClock.now
        #expect(idle.isClosedByPeer(within: .seconds(5)), "client-idle ends a parked connection")
        let waited = ContinuousClock.now - started
        #expect(waited >= .milliseconds(600), "not before client-idle (\(waited))")

        let ended = try proxy.connect()
        try ended.send(RequestText.make("GET", origin.url("/b")))
        _ = try ended.readResponse()
        #expect(waitUntil { proxy.server.metrics().connectionsParked == 1 })
        ended.shutdownWrite()
        #expect(ended.isClosedByPeer(within: .seconds(2)), "a parked client's EOF closes it at once")
        #expect(waitUntil { proxy.server.metrics().connectionsActive == 0 && proxy.server.metrics().connectionsParked == 0 })
    }

    /// A parked connection woken by a request and the client's EOF in one go (the new session's first read sees
    /// both): the request is answered whole, then the connection closes.
    @Test func aParkedConnectionWokenByARequestAndEOFAnswersItWhole() throws {
        let body = String(repeating: "z", count: 300_000)
        let origin = try RecordingOrigin { request in .ok(request.target == "/big" ? body : "small") }
        defer { origin.stop() }
        let proxy = try ProxyHarness(yaml: Self.yaml, threads: 1)
        defer { proxy.stop() }
        let client = try proxy.connect()
        try client.send(RequestText.make("GET", origin.url("/first")))
        #expect(try client.readResponse().bodyText == "small")
        #expect(waitUntil { proxy.server.metrics().connectionsParked == 1 })
        try client.send(RequestText.make("GET", origin.url("/big")))
        client.shutdownWrite()
        let response = try client.readResponse()
        #expect(response.bodyText.count == body.count && response.bodyText == body)
        #expect(client.isClosedByPeer(within: .seconds(5)))
        #expect(origin.requests.map(\.target) == ["/first", "/big"])
    }

    /// More parked connections than one slab of `ParkedConnections` holds, woken in an order that frees records
    /// in every slab and takes them again: each connection gets its own answers, and when they all end, none is
    /// left parked or open.
    @Test func manyParkedConnectionsAcrossSlabsWakeToTheirOwnAnswers() throws {
        let origin = try RecordingOrigin { request in .ok("answer to \(request.target)") }
        defer { origin.stop() }
        let proxy = try ProxyHarness(yaml: "timeouts: {client-idle: 30s}\n", threads: 1)
        defer { proxy.stop() }
        let count = 300
        var clients: [RawHTTPClient] = []
        for n in 0..<count {
            let client = try proxy.connect()
            try client.send(RequestText.make("GET", origin.url("/first/\(n)")))
            #expect(try client.readResponse().bodyText == "answer to /first/\(n)")
            clients.append(client)
        }
        #expect(waitUntil { proxy.server.metrics().connectionsParked == count }, "all parked")
        // Odd ones first, then even ones backwards: records are given back and taken again all over the slabs.
        let order = Array(stride(from: 1, to: count, by: 2)) + Array(stride(from: count - 2, through: 0, by: -2))
        for n in order {
            try clients[n].send(RequestText.make("GET", origin.url("/second/\(n)")))
            #expect(try clients[n].readResponse().bodyText == "answer to /second/\(n)")
        }
        #expect(waitUntil { proxy.server.metrics().connectionsParked == count }, "all parked again")
        for n in order { clients[n].shutdownWrite() }
        for client in clients { #expect(client.isClosedByPeer(within: .seconds(5))) }
        #expect(waitUntil { proxy.server.metrics().connectionsActive == 0 && proxy.server.metrics().connectionsParked == 0 })
    }

    @Test func aGracefulStopClosesParkedConnections() throws {
        let origin = try RecordingOrigin { _ in .ok("x") }
        defer { origin.stop() }
        let proxy = try ProxyHarness(yaml: Self.yaml, threads: 1)
        let client = try proxy.connect()
        try client.send(RequestText.make("GET", origin.url("/a")))
        _ = try client.readResponse()
        #expect(waitUntil { proxy.server.metrics().connectionsParked == 1 })
        let started = ContinuousClock.now
        proxy.stop()
        #expect(ContinuousClock.now - started < .seconds(3), "a parked connection does not hold up the drain")
        #expect(client.isClosedByPeer(within: .seconds(2)))
    }
}

/// SPEC §8: a reload's client timeouts reach connections already open, from their next request on.
@Suite struct ReloadedClientTimeoutTests {
    @Test func aReloadedClientIdleReachesAnOpenConnectionAtItsNextRequest() throws {
        let origin = try RecordingOrigin { _ in .ok("x") }
        defer { origin.stop() }
        let proxy = try ProxyHarness(yaml: "timeouts: {client-idle: 30s}\n", threads: 1)
        defer { proxy.stop() }
        let client = try proxy.connect()
        try client.send(RequestText.make("GET", origin.url("/before")))
        _ = try client.readResponse()

        guard case .applied = proxy.reload(yaml: "timeouts: {client-idle: 300ms}\n") else {
            Issue.record("the reload was refused")
            return
        }
        try client.send(RequestText.make("GET", origin.url("/after")))
        _ = try client.readResponse()
        let started = ContinuousClock.now
        #expect(client.isClosedByPeer(within: .seconds(5)), "closed at the reloaded client-idle, not after 30 s")
        #expect(ContinuousClock.now - started < .seconds(3))
    }
}
