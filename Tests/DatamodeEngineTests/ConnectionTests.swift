import DatamodeTestSupport
import Testing

/// SPEC §6: keep-alive to clients, pooled keep-alive connections to origins, pipelined requests in order.
@Suite struct ConnectionTests {
    @Test func pipelinedRequestsAreAnsweredInOrderOnOneConnection() throws {
        let origin = try RecordingOrigin { request in .ok("answer to \(request.target) \(request.bodyText)") }
        defer { origin.stop() }
        let proxy = try ProxyHarness()
        defer { proxy.stop() }
        let client = try proxy.connect()

        // Three requests in one write, the middle one with a body that looks like a request head.
        let pipeline = RequestText.make("GET", origin.url("/1"))
            + RequestText.make("POST", origin.url("/2"), body: "GET /smuggled HTTP/1.1\r\n\r\n")
            + RequestText.make("GET", origin.url("/3"))
        try client.send(pipeline)

        let first = try client.readResponse()
        let second = try client.readResponse()
        let third = try client.readResponse()
        #expect(first.bodyText == "answer to /1 ")
        #expect(second.bodyText == "answer to /2 GET /smuggled HTTP/1.1\r\n\r\n")
        #expect(third.bodyText == "answer to /3 ")
        #expect([first, second, third].allSatisfy { $0.status == 200 })

        let requests = origin.requests
        #expect(requests.map(\.target) == ["/1", "/2", "/3"])
        #expect(requests.allSatisfy { $0.connection == 1 })
        #expect(origin.connectionCount == 1)

        // Still in step after the pipeline: one more request on the same connection.
        try client.send(RequestText.make("GET", origin.url("/4")))
        #expect(try client.readResponse().bodyText == "answer to /4 ")
    }

    @Test func sequentialRequestsReuseOneUpstreamConnection() throws {
        let origin = try RecordingOrigin { request in .ok(request.target) }
        defer { origin.stop() }
        let proxy = try ProxyHarness()
        defer { proxy.stop() }
        let client = try proxy.connect()

        for path in ["/a", "/b", "/c", "/d"] {
            try client.send(RequestText.make("GET", origin.url(path)))
            let response = try client.readResponse()
            #expect(response.status == 200)
            #expect(response.bodyText == path)
        }
        let requests = origin.requests
        #expect(origin.connectionCount == 1)
        #expect(requests.map(\.connection) == [1, 1, 1, 1])
        #expect(requests.map(\.indexOnConnection) == [0, 1, 2, 3])
    }

    /// The pool keeps one list of idle connections per origin: requests alternating between origins, from one client
    /// and then another, each find their own origin's connection, and no origin sees a second one. One worker: each
    /// worker has a pool of its own, and with two the second client may be accepted by the other one.
    @Test func requestsAlternatingBetweenOriginsEachReuseTheirOwnConnection() throws {
        let first = try RecordingOrigin { request in .ok("first " + request.target) }
        defer { first.stop() }
        let second = try RecordingOrigin { request in .ok("second " + request.target) }
        defer { second.stop() }
        let proxy = try ProxyHarness(threads: 1)
        defer { proxy.stop() }
        let client = try proxy.connect()

        for round in 0..<4 {
            for (origin, name) in [(first, "first"), (second, "second"), (second, "second"), (first, "first")] {
                try client.send(RequestText.make("GET", origin.url("/\(round)")))
                let response = try client.readResponse()
                #expect(response.status == 200 && response.bodyText == "\(name) /\(round)")
            }
        }
        #expect(first.connectionCount == 1 && second.connectionCount == 1)
        #expect(first.requests.count == 8 && second.requests.count == 8)

        // A second client while the first is idle: each origin's one pooled connection serves it too.
        let other = try proxy.connect()
        try other.send(RequestText.make("GET", second.url("/other")))
        #expect(try other.readResponse().bodyText == "second /other")
        try other.send(RequestText.make("GET", first.url("/other")))
        #expect(try other.readResponse().bodyText == "first /other")
        #expect(first.connectionCount == 1 && second.connectionCount == 1)
    }

    @Test func aKeptUpstreamConnectionIsReusedAfterBodiesOfEveryFraming() throws {
        let origin = try RecordingOrigin { request in
            switch request.target {
            case "/chunked": .respond(status: 200, body: Array("chunked".utf8), framing: .chunked(chunkSize: 3))
            default: .ok(request.bodyText)
            }
        }
        defer { origin.stop() }
        let proxy = try ProxyHarness()
        defer { proxy.stop() }
        let client = try proxy.connect()

        try client.send(RequestText.make("POST", origin.url("/length"), body: "12345"))
        #expect(try client.readResponse().bodyText == "12345")
        try client.send(RequestText.make("POST", origin.url("/upload-chunked"),
                                         headers: [("Transfer-Encoding", "chunked")], body: "3\r\nabc\r\n0\r\n\r\n"))
        #expect(try client.readResponse().bodyText == "abc")
        try client.send(RequestText.make("GET", origin.url("/chunked")))
        #expect(try client.readResponse().bodyText == "chunked")
        try client.send(RequestText.make("GET", origin.url("/last")))
        #expect(try client.readResponse().status == 200)

        #expect(origin.connectionCount == 1)
        #expect(origin.requests.map(\.target) == ["/length", "/upload-chunked", "/chunked", "/last"])
    }

    @Test func connectionCloseFromTheClientIsHonoured() throws {
        let origin = try RecordingOrigin { _ in .ok("bye") }
        defer { origin.stop() }
        let proxy = try ProxyHarness()
        defer { proxy.stop() }
        let client = try proxy.connect()

        try client.send(RequestText.make("GET", origin.url("/bye"), headers: [("Connection", "close")]))
        let response = try client.readResponse()
        #expect(response.status == 200)
        #expect(response.bodyText == "bye")
        #expect(response.values(of: "Connection").map { $0.lowercased() } == ["close"])
        #expect(client.isClosedByPeer())
    }

    @Test func anHTTP10ClientGetsTheChunkedBodyDecodedAndTheConnectionClosed() throws {
        let origin = try RecordingOrigin { _ in
            .respond(status: 200, body: Array("for an old client".utf8), framing: .chunked(chunkSize: 5))
        }
        defer { origin.stop() }
        let proxy = try ProxyHarness()
        defer { proxy.stop() }
        let client = try proxy.connect()

        try client.send(RequestText.make("GET", origin.url("/old"), version: "HTTP/1.0"))
        let response = try client.readResponse()
        #expect(response.status == 200)
        #expect(!response.contains("Transfer-Encoding"))
        #expect(response.bodyText == "for an old client")
        #expect(client.isClosedByPeer())
    }
}
