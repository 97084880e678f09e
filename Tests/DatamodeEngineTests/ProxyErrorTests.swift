import DatamodeTestSupport
import Testing

/// SPEC §6 "Access" and CONNECT: the remaining errors the proxy produces itself, each a problem document with
/// its stable code, and none of them reaching the origin.
@Suite struct ProxyErrorTests {
    @Test func aClientOutsideAccessAllowIsDenied() throws {
        let origin = try RecordingOrigin { _ in .ok() }
        defer { origin.stop() }
        let proxy = try ProxyHarness(yaml: "access: {allow: [10.0.0.0/8]}")
        defer { proxy.stop() }
        let client = try proxy.connect()

        try client.send(RequestText.make("GET", origin.url("/")))
        expectProblem(try client.readResponse(), status: 403, error: "access-denied")
        expectOriginUntouched(origin)
    }

    @Test func basicProxyAuthenticationIsRequiredAndNotForwarded() throws {
        let origin = try RecordingOrigin { _ in .ok("in") }
        defer { origin.stop() }
        let proxy = try ProxyHarness(yaml: "access: {users: {alice: \"s3cret\"}}")
        defer { proxy.stop() }
        let client = try proxy.connect()

        try client.send(RequestText.make("GET", origin.url("/private")))
        let challenge = try client.readResponse()
        expectProblem(challenge, status: 407, error: "proxy-auth-required")
        #expect(challenge.value(of: "Proxy-Authenticate")?.hasPrefix("Basic ") == true)

        try client.send(RequestText.make("GET", origin.url("/private"),
                                         headers: [("Proxy-Authorization", "Basic YWxpY2U6d3Jvbmc=")]))  // alice:wrong
        expectProblem(try client.readResponse(), status: 407, error: "proxy-auth-required")
        #expect(origin.requests.isEmpty)

        try client.send(RequestText.make("GET", origin.url("/private"),
                                         headers: [("Proxy-Authorization", "Basic YWxpY2U6czNjcmV0")]))  // alice:s3cret
        let response = try client.readResponse()
        #expect(response.status == 200)
        #expect(response.bodyText == "in")
        let request = try #require(origin.requests.first)
        #expect(!request.contains("Proxy-Authorization"))
        #expect(!request.headText.contains("YWxpY2U6czNjcmV0"))
    }

    @Test func connectToAPortNotInConnectPortsIsDenied() throws {
        let origin = try RecordingOrigin { _ in .ok() }
        defer { origin.stop() }
        let proxy = try ProxyHarness()
        defer { proxy.stop() }
        let client = try proxy.connect()

        try client.send("CONNECT \(origin.authority) HTTP/1.1\r\nHost: \(origin.authority)\r\n\r\n")
        expectProblem(try client.readResponse(method: "CONNECT"), status: 403, error: "connect-port-denied")
        expectOriginUntouched(origin)
    }

    @Test func aTunnelThroughAnAllowedPortRelaysBytesBothWays() throws {
        // The recording origin stands in for a TLS server: through the tunnel the client speaks plain HTTP to it.
        let origin = try RecordingOrigin { request in .ok("tunnelled \(request.target)") }
        defer { origin.stop() }
        let proxy = try ProxyHarness(yaml: "connect: {ports: [\(origin.port)]}")
        defer { proxy.stop() }
        let client = try proxy.connect()

        try client.send("CONNECT \(origin.authority) HTTP/1.1\r\nHost: \(origin.authority)\r\n\r\n")
        let established = try client.readResponse(method: "CONNECT")
        #expect(established.status == 200)

        let inner = "GET /inside HTTP/1.1\r\nHost: \(origin.authority)\r\nConnection: keep-alive\r\nVia: 1.1 datamode-proxy\r\n\r\n"
        try client.send(inner)
        let response = try client.readResponse()
        #expect(response.bodyText == "tunnelled /inside")
        // A tunnel relays bytes as they are: no rewriting, no hop-by-hop removal, no Via, no tags.
        #expect(origin.requests.first?.headText == inner)
    }
}
