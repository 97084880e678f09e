import DatamodeTestSupport
import Testing

/// SPEC §6: failures on the way to the origin become problem documents with stable error codes.
@Suite struct UpstreamErrorTests {
    @Test func anUnresolvableHostIsADNSFailure() throws {
        let proxy = try ProxyHarness()
        defer { proxy.stop() }
        let client = try proxy.connect(timeout: .seconds(20))

        try client.send(RequestText.make("GET", "http://nonexistent.invalid/"))
        let response = try client.readResponse()

        expectProblem(response, status: 502, error: "dns-failure")
    }

    @Test func aRefusedConnectionIsUpstreamUnreachable() throws {
        let port = try LoopbackPort.refusingConnections()
        let proxy = try ProxyHarness()
        defer { proxy.stop() }
        let client = try proxy.connect()

        try client.send(RequestText.make("GET", "http://127.0.0.1:\(port)/"))
        let response = try client.readResponse()

        expectProblem(response, status: 502, error: "upstream-unreachable")
    }

    @Test func anOriginThatDoesNotAnswerInTimeIsAnUpstreamTimeout() throws {
        let origin = try RecordingOrigin { _ in .delay(.seconds(3), then: .ok("too late")) }
        defer { origin.stop() }
        let proxy = try ProxyHarness(yaml: "timeouts: {upstream-response: 1s}")
        defer { proxy.stop() }
        let client = try proxy.connect()

        try client.send(RequestText.make("GET", origin.url("/slow")))
        let response = try client.readResponse()

        expectProblem(response, status: 504, error: "upstream-timeout")
        #expect(origin.requests.map(\.target) == ["/slow"])
    }

    static let malformedResponses: [(String, String)] = [
        ("Content-Length and Transfer-Encoding", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"),
        ("two different Content-Lengths", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!"),
        ("signed Content-Length", "HTTP/1.1 200 OK\r\nContent-Length: +5\r\n\r\nhello"),
        ("Transfer-Encoding other than chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n"),
        ("status code not three digits", "HTTP/1.1 20 OK\r\nContent-Length: 0\r\n\r\n"),
        ("bare LF line endings", "HTTP/1.1 200 OK\nContent-Length: 0\n\n"),
        ("obs-fold", "HTTP/1.1 200 OK\r\nX-Folded: a\r\n b\r\nContent-Length: 0\r\n\r\n"),
        ("whitespace before colon", "HTTP/1.1 200 OK\r\nContent-Length : 0\r\n\r\n"),
        ("not HTTP at all", "SSH-2.0-OpenSSH_9.6\r\n\r\n"),
        ("HTTP/2 preface", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
    ]

    @Test(arguments: malformedResponses)
    func aMalformedResponseIsAnUpstreamProtocolError(name: String, response raw: String) throws {
        let origin = try RecordingOrigin { _ in .raw(raw, thenClose: false) }
        defer { origin.stop() }
        let proxy = try ProxyHarness()
        defer { proxy.stop() }
        let client = try proxy.connect()

        try client.send(RequestText.make("GET", origin.url("/bad")))
        let response = try client.readResponse()

        expectProblem(response, status: 502, error: "upstream-protocol-error")
        // None of the origin's bytes reach the client.
        #expect(!response.headText.contains("Content-Length: 5\r\nTransfer"), "\(name)")
    }

    @Test func anOriginThatClosesWithoutAnsweringIsABadGateway() throws {
        let origin = try RecordingOrigin { _ in .closeWithoutResponse }
        defer { origin.stop() }
        let proxy = try ProxyHarness()
        defer { proxy.stop() }
        let client = try proxy.connect()

        try client.send(RequestText.make("GET", origin.url("/vanish")))
        let response = try client.readResponse()

        #expect(response.status == 502)
        #expect(response.value(of: "Content-Type") == "application/problem+json")
        #expect(["upstream-protocol-error", "upstream-unreachable"].contains(response.problem?.error ?? ""))
    }

    @Test func aTruncatedResponseBodyClosesTheClientConnection() throws {
        let origin = try RecordingOrigin { _ in .raw("HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly 20 bytes here..", thenClose: true) }
        defer { origin.stop() }
        let proxy = try ProxyHarness()
        defer { proxy.stop() }
        let client = try proxy.connect()

        try client.send(RequestText.make("GET", origin.url("/short")))
        // The head was already relayed; the only honest signal left is to cut the connection short.
        #expect(throws: (any Error).self) { try client.readResponse() }
        #expect(client.isClosedByPeer())
    }
}
