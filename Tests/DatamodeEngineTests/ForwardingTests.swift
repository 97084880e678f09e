import DatamodeHTTP
import DatamodeTestSupport
import Testing

/// SPEC §6 "Proxying": what the origin receives for ordinary requests, byte for byte.
@Suite struct ForwardingTests {
    @Test func getIsForwardedInOriginFormWithExactlyTheRewrittenHead() throws {
        let origin = try RecordingOrigin { _ in .ok("hello", headers: [("Content-Type", "text/plain")]) }
        defer { origin.stop() }
        let proxy = try ProxyHarness()
        defer { proxy.stop() }
        let client = try proxy.connect()

        try client.send("GET \(origin.url("/path/a.txt?q=1&r=%20")) HTTP/1.1\r\nHost: \(origin.authority)\r\n"
            + "User-Agent: raw-test\r\nAccept: */*\r\n\r\n")
        let response = try client.readResponse()

        #expect(response.status == 200)
        #expect(response.bodyText == "hello")
        #expect(response.value(of: "Content-Type") == "text/plain")
        #expect(response.value(of: "Content-Length") == "5")
        #expect(response.value(of: "Via") == "1.1 datamode-proxy")
        let requests = origin.requests
        try #require(requests.count == 1)
        #expect(requests[0].headText == "GET /path/a.txt?q=1&r=%20 HTTP/1.1\r\n"
            + "Host: \(origin.authority)\r\n"
            + "User-Agent: raw-test\r\n"
            + "Accept: */*\r\n"
            + "Via: 1.1 datamode-proxy\r\n"
            + "Allow-Constrained: ?1\r\n"
            + "Allow-Expensive: ?1\r\n"
            + "Allow-Ultra-Constrained: ?0\r\n"
            + "\r\n")
        #expect(requests[0].body.isEmpty)
    }

    @Test func postWithContentLengthBodyArrivesByteForByte() throws {
        let origin = try RecordingOrigin { request in .status(201, "stored \(request.payloadLength)") }
        defer { origin.stop() }
        let proxy = try ProxyHarness()
        defer { proxy.stop() }
        let client = try proxy.connect()

        let body = "{\"name\":\"caf\u{e9}\",\"bytes\":[0,1,2]}\r\n\r\nGET /not-a-request HTTP/1.1\r\n\r\n"
        try client.send(RequestText.make("POST", origin.url("/upload"), headers: [("Content-Type", "application/json")],
                                         body: body))
        let response = try client.readResponse()

        #expect(response.status == 201)
        #expect(response.bodyText == "stored \(body.utf8.count)")
        let requests = origin.requests
        try #require(requests.count == 1)
        #expect(requests[0].method == "POST")
        #expect(requests[0].target == "/upload")
        #expect(requests[0].value(of: "Content-Length") == String(body.utf8.count))
        #expect(!requests[0].contains("Transfer-Encoding"))
        #expect(requests[0].body == Array(body.utf8))
        #expect(origin.violations.isEmpty)
    }

    /// `Content-Length: 5, 5` and duplicate equal fields are one length (RFC 9110 §8.6); the next hop must see
    /// exactly one `Content-Length: 5`, never the list, which a laxer parser could read differently.
    @Test(arguments: [["5, 5"], ["5", "5"], ["05"]])
    func equalContentLengthsAreForwardedAsOne(_ values: [String]) throws {
        let origin = try RecordingOrigin { request in .ok(request.bodyText) }
        defer { origin.stop() }
        let proxy = try ProxyHarness()
        defer { proxy.stop() }
        let client = try proxy.connect()
        let lengths = values.map { "Content-Length: \($0)\r\n" }.joined()
        try client.send("POST \(origin.url("/cl")) HTTP/1.1\r\nHost: \(origin.authority)\r\n\(lengths)\r\nhello")
        let response = try client.readResponse()
        #expect(response.status == 200)
        #expect(response.bodyText == "hello")
        let requests = origin.requests
        try #require(requests.count == 1)
        #expect(requests[0].values(of: "Content-Length") == ["5"])
    }

    @Test func postWithChunkedBodyArrivesChunkedWithItsFramingIntact() throws {
        let origin = try RecordingOrigin { request in .ok(request.bodyText) }
        defer { origin.stop() }
        let proxy = try ProxyHarness()
        defer { proxy.stop() }
        let client = try proxy.connect()

        let chunked = "5;ext=\"quoted value\"\r\nhello\r\n1B\r\n, chunked world of 27 bytes\r\n"
            + "0\r\nX-Checksum: abc\r\n\r\n"
        try client.send("POST \(origin.url("/chunks")) HTTP/1.1\r\nHost: \(origin.authority)\r\n"
            + "Transfer-Encoding: chunked\r\nContent-Type: text/plain\r\n\r\n" + chunked)
        let response = try client.readResponse()

        #expect(response.status == 200)
        #expect(response.bodyText == "hello, chunked world of 27 bytes")
        let requests = origin.requests
        try #require(requests.count == 1)
        #expect(requests[0].value(of: "Transfer-Encoding") == "chunked")
        #expect(!requests[0].contains("Content-Length"))
        // Chunk sizes, extensions, trailers: the framing is relayed exactly as the client sent it.
        #expect(requests[0].body == Array(chunked.utf8))
        #expect(requests[0].bodyText == "hello, chunked world of 27 bytes")
    }

    @Test func hopByHopFieldsNeverReachTheOrigin() throws {
        let origin = try RecordingOrigin { _ in .ok() }
        defer { origin.stop() }
        let proxy = try ProxyHarness()
        defer { proxy.stop() }
        let client = try proxy.connect()

        try client.send(RequestText.make("GET", origin.url("/hop"), headers: [
            ("Connection", "keep-alive, X-Private-Hop"),
            ("X-Private-Hop", "secret"),
            ("Proxy-Connection", "keep-alive"),
            ("Keep-Alive", "timeout=5, max=100"),
            ("TE", "trailers"),
            ("Trailer", "X-Checksum"),
            ("Upgrade", "h2c"),
            ("Proxy-Authorization", "Basic dXNlcjpwYXNz"),
            ("X-End-To-End", "kept"),
        ]))
        let response = try client.readResponse()

        #expect(response.status == 200)
        let requests = origin.requests
        try #require(requests.count == 1)
        let received = requests[0]
        for name in ["X-Private-Hop", "Proxy-Connection", "Keep-Alive", "TE", "Trailer", "Upgrade", "Proxy-Authorization"] {
            #expect(!received.contains(name), "\(name) was forwarded: \(received.headText)")
        }
        // The proxy may say something about its own connection to the origin, never repeat the client's.
        let connection = received.values(of: "Connection").joined(separator: ",").lowercased()
        #expect(!connection.contains("x-private-hop") && !connection.contains("keep-alive"), "\(received.headText)")
        #expect(received.value(of: "X-End-To-End") == "kept")
        #expect(!received.headText.contains("secret") && !received.headText.contains("dXNlcjpwYXNz"))
    }

    @Test func hopByHopFieldsOfTheResponseNeverReachTheClient() throws {
        let origin = try RecordingOrigin { _ in
            .ok("r", headers: [("Connection", "X-Response-Hop"), ("X-Response-Hop", "secret"),
                               ("Keep-Alive", "timeout=5"), ("Proxy-Authenticate", "Basic realm=\"origin\""),
                               ("X-End-To-End", "kept")])
        }
        defer { origin.stop() }
        let proxy = try ProxyHarness()
        defer { proxy.stop() }
        let client = try proxy.connect()

        try client.send(RequestText.make("GET", origin.url("/r")))
        let response = try client.readResponse()

        #expect(response.status == 200)
        #expect(response.bodyText == "r")
        for name in ["X-Response-Hop", "Keep-Alive", "Proxy-Authenticate"] {
            #expect(!response.contains(name), "\(name) was relayed: \(response.headText)")
        }
        #expect(!response.values(of: "Connection").joined().lowercased().contains("x-response-hop"))
        #expect(response.value(of: "X-End-To-End") == "kept")
    }

    @Test func hostIsRegeneratedFromTheTarget() throws {
        let origin = try RecordingOrigin { _ in .ok() }
        defer { origin.stop() }
        let proxy = try ProxyHarness()
        defer { proxy.stop() }
        let client = try proxy.connect()

        try client.send(RequestText.make("GET", origin.url("/host"), host: "evil.example"))
        let response = try client.readResponse()

        #expect(response.status == 200)
        let requests = origin.requests
        try #require(requests.count == 1)
        #expect(requests[0].values(of: "Host") == [origin.authority])
        #expect(!requests[0].headText.contains("evil.example"))
    }

    @Test func viaIsAddedAfterTheClientsOwn() throws {
        let origin = try RecordingOrigin { _ in .ok() }
        defer { origin.stop() }
        let proxy = try ProxyHarness()
        defer { proxy.stop() }
        let client = try proxy.connect()

        try client.send(RequestText.make("GET", origin.url("/via"), headers: [("Via", "1.0 corporate-gateway")]))
        let response = try client.readResponse()

        #expect(response.status == 200)
        #expect(response.values(of: "Via").last == "1.1 datamode-proxy")
        let requests = origin.requests
        try #require(requests.count == 1)
        #expect(requests[0].values(of: "Via") == ["1.0 corporate-gateway", "1.1 datamode-proxy"])
    }

    @Test(arguments: [
        "1.1 datamode-proxy",
        "1.0 corporate-gateway, 1.1 datamode-proxy (datamode)",
    ])
    func aRequestCarryingOurViaIsALoop(via: String) throws {
        let origin = try RecordingOrigin { _ in .ok() }
        defer { origin.stop() }
        let proxy = try ProxyHarness()
        defer { proxy.stop() }
        let client = try proxy.connect()

        try client.send(RequestText.make("GET", origin.url("/loop"), headers: [("Via", via)]))
        let response = try client.readResponse()

        expectProblem(response, status: 508, error: "loop-detected")
        expectOriginUntouched(origin)
    }

    @Test func aRequestTargetingTheProxyItselfIsALoop() throws {
        let proxy = try ProxyHarness()
        defer { proxy.stop() }
        let client = try proxy.connect()

        try client.send(RequestText.make("GET", "http://127.0.0.1:\(proxy.port)/self"))
        let response = try client.readResponse()

        expectProblem(response, status: 508, error: "loop-detected")
    }

    @Test func originFormIsNotAProxyRequestAndTheConnectionStaysUsable() throws {
        let origin = try RecordingOrigin { _ in .ok("after") }
        defer { origin.stop() }
        let proxy = try ProxyHarness()
        defer { proxy.stop() }
        let client = try proxy.connect()

        try client.send("GET /index.html HTTP/1.1\r\nHost: \(origin.authority)\r\n\r\n")
        let response = try client.readResponse()
        expectProblem(response, status: 400, error: "not-a-proxy-request")
        #expect(origin.requests.isEmpty)

        try client.send(RequestText.make("GET", origin.url("/next")))
        let next = try client.readResponse()
        #expect(next.status == 200)
        #expect(next.bodyText == "after")
        #expect(origin.requests.map(\.target) == ["/next"])
    }

    @Test func headAnd204And304CarryNoBodyAndTheConnectionStaysUsable() throws {
        let origin = try RecordingOrigin { request in
            switch request.target {
            case "/head":
                // A HEAD response announces the GET's length but has no body.
                return .respond(status: 200, headers: [HTTPField(name: "Content-Length", value: "1234"),
                                                       HTTPField(name: "Content-Type", value: "text/plain")],
                                framing: .bodiless)
            case "/no-content": return .status(204)
            case "/not-modified":
                return .respond(status: 304, headers: [HTTPField(name: "ETag", value: "\"v1\"")], framing: .bodiless)
            default: return .ok("after")
            }
        }
        defer { origin.stop() }
        let proxy = try ProxyHarness()
        defer { proxy.stop() }
        let client = try proxy.connect()

        try client.send(RequestText.make("HEAD", origin.url("/head")))
        let head = try client.readResponse(method: "HEAD")
        #expect(head.status == 200)
        #expect(head.value(of: "Content-Length") == "1234")
        #expect(head.body.isEmpty)

        try client.send(RequestText.make("GET", origin.url("/no-content")))
        let noContent = try client.readResponse()
        #expect(noContent.status == 204)
        #expect(noContent.body.isEmpty)
        #expect(!noContent.contains("Content-Length") && !noContent.contains("Transfer-Encoding"))

        try client.send(RequestText.make("GET", origin.url("/not-modified"), headers: [("If-None-Match", "\"v1\"")]))
        let notModified = try client.readResponse()
        #expect(notModified.status == 304)
        #expect(notModified.value(of: "ETag") == "\"v1\"")
        #expect(notModified.body.isEmpty)

        // Had the proxy sent a body after any of them, it would be read here as (part of) the next response.
        try client.send(RequestText.make("GET", origin.url("/after")))
        let after = try client.readResponse()
        #expect(after.status == 200)
        #expect(after.bodyText == "after")
        #expect(client.bufferedByteCount == 0)
        #expect(origin.requests.map(\.target) == ["/head", "/no-content", "/not-modified", "/after"])
        #expect(origin.requests.first?.method == "HEAD")
    }

    @Test func expect100ContinueIsRelayedBothWays() throws {
        let origin = try RecordingOrigin(sendsContinue: true) { request in .ok("got \(request.bodyText)") }
        defer { origin.stop() }
        let proxy = try ProxyHarness()
        defer { proxy.stop() }
        let client = try proxy.connect()

        try client.send("POST \(origin.url("/expect")) HTTP/1.1\r\nHost: \(origin.authority)\r\n"
            + "Expect: 100-continue\r\nContent-Length: 11\r\n\r\n")
        // The client waits for the origin's 100 before sending the body, as curl does.
        let interim = try client.readResponse()
        #expect(interim.status == 100)
        #expect(interim.body.isEmpty)

        try client.send("hello world")
        let final = try client.readResponse()
        #expect(final.status == 200)
        #expect(final.bodyText == "got hello world")
        let requests = origin.requests
        try #require(requests.count == 1)
        #expect(requests[0].value(of: "Expect") == "100-continue")
        #expect(requests[0].body == Array("hello world".utf8))
    }

    @Test func anUnsolicitedInterimResponseIsRelayedBeforeTheFinalOne() throws {
        let origin = try RecordingOrigin { _ in
            .interim(status: 103, headers: [HTTPField(name: "Link", value: "</style.css>; rel=preload")], then: .ok("final"))
        }
        defer { origin.stop() }
        let proxy = try ProxyHarness()
        defer { proxy.stop() }
        let client = try proxy.connect()

        try client.send(RequestText.make("GET", origin.url("/hints")))
        let first = try client.readResponse()
        #expect(first.status == 103)
        #expect(first.value(of: "Link") == "</style.css>; rel=preload")
        let final = try client.readResponse()
        #expect(final.status == 200)
        #expect(final.bodyText == "final")
    }

    @Test func chunkedAndCloseDelimitedResponsesReachTheClientWhole() throws {
        let origin = try RecordingOrigin { request in
            switch request.target {
            case "/chunked":
                return .respond(status: 200, body: Array("a chunked response body".utf8), framing: .chunked(chunkSize: 4))
            default:
                return .respond(status: 200, body: Array("until close".utf8), framing: .closeDelimited)
            }
        }
        defer { origin.stop() }
        let proxy = try ProxyHarness()
        defer { proxy.stop() }
        let client = try proxy.connect()

        try client.send(RequestText.make("GET", origin.url("/chunked")))
        let chunked = try client.readResponse()
        #expect(chunked.status == 200)
        #expect(chunked.framing == .chunked)
        #expect(chunked.bodyText == "a chunked response body")

        try client.send(RequestText.make("GET", origin.url("/close")))
        let untilClose = try client.readResponse()
        #expect(untilClose.status == 200)
        #expect(untilClose.bodyText == "until close")
        #expect(client.isClosedByPeer())
    }
}
