import DatamodeHTTP
import DatamodeTestSupport
import Foundation
import Testing

/// Who may use the proxy, and what it must never be used for (SPEC §6, §8): `access.allow`, Basic proxy
/// authentication, and requests aimed back at the proxy's own listeners (a loop, or an SSRF into the admin API).
@Suite struct AccessEndToEndTests {
    static func basic(_ user: String, _ password: String) -> String {
        "Basic " + Data("\(user):\(password)".utf8).base64EncodedString()
    }

    // MARK: access.allow

    @Test func clientsOutsideAccessAllowAreRefused() throws {
        let origin = try RecordingOrigin()
        defer { origin.stop() }
        let proxy = try ProxyProcess(config: "access: {allow: [\"10.0.0.0/8\"]}\nconnect: {ports: [\(origin.port)]}\n")
        defer { proxy.stop() }

        let response = try RawHTTPClient.exchange(RequestText.make("GET", origin.url("/secret")), to: proxy.port)
        #expect(response.status == 403)
        #expect(response.value(of: "Content-Type") == "application/problem+json")
        #expect(response.problem?.error == "access-denied")
        #expect(response.problem?.status == 403)

        let tunnel = try RawHTTPClient.exchange(RequestText.make("CONNECT", origin.authority, host: origin.authority),
                                             to: proxy.port, method: "CONNECT")
        #expect(tunnel.status == 403)
        #expect(tunnel.problem?.error == "access-denied")
        #expect(origin.connectionCount == 0)
    }

    @Test func clientsInsideAccessAllowAreServed() throws {
        let origin = try RecordingOrigin { _ in .ok("allowed") }
        defer { origin.stop() }
        let proxy = try ProxyProcess(config: "access: {allow: [\"10.0.0.0/8\", 127.0.0.1/32]}\n")
        defer { proxy.stop() }
        let response = try RawHTTPClient.exchange(RequestText.make("GET", origin.url("/")), to: proxy.port)
        #expect(response.status == 200)
        #expect(response.bodyText == "allowed")
    }

    // MARK: Basic proxy authentication

    @Test func basicProxyAuthentication() throws {
        let origin = try RecordingOrigin { _ in .ok("welcome") }
        defer { origin.stop() }
        let proxy = try ProxyProcess(config: "access:\n  users:\n    alice: \"correct horse\"\n    bob: b0b\n")
        defer { proxy.stop() }
        let url = origin.url("/private")

        // Missing credentials: 407 with a Basic challenge; the connection stays usable.
        let client = try RawHTTPClient(port: proxy.port)
        try client.send(RequestText.make("GET", url))
        let missing = try client.readResponse()
        #expect(missing.status == 407)
        #expect(missing.problem?.error == "proxy-auth-required")
        #expect(missing.value(of: "Proxy-Authenticate")?.lowercased().hasPrefix("basic realm=") == true)

        // Wrong password, unknown user, a password that is a prefix, not base64, another scheme: still 407.
        for credentials in [Self.basic("alice", "wrong"), Self.basic("mallory", "correct horse"), Self.basic("alice", "correct"),
                            Self.basic("alice", "correct horse "), "Basic !!!notbase64", "Bearer correct horse",
                            "Basic " + Data("alice".utf8).base64EncodedString()] {
            try client.send(RequestText.make("GET", url, headers: [("Proxy-Authorization", credentials)]))
            let refused = try client.readResponse()
            #expect(refused.status == 407, "accepted \(credentials)")
            #expect(refused.problem?.error == "proxy-auth-required")
        }
        #expect(origin.requests.isEmpty)

        // Good credentials (scheme case-insensitive): forwarded, and the credentials are not.
        try client.send(RequestText.make("GET", url, headers: [("Proxy-Authorization", Self.basic("alice", "correct horse"))]))
        let good = try client.readResponse()
        #expect(good.status == 200)
        #expect(good.bodyText == "welcome")
        try client.send(RequestText.make("GET", url, headers: [
            ("Proxy-Authorization", "basic " + Data("bob:b0b".utf8).base64EncodedString()),
        ]))
        #expect(try client.readResponse().status == 200)

        // curl's own Basic support.
        let curl = try ExternalCommand.run("/usr/bin/curl", [
            "-sS", "--max-time", "10", "--proxy", "http://127.0.0.1:\(proxy.port)", "--proxy-user", "alice:correct horse", url,
        ])
        #expect(curl.status == 0)
        #expect(curl.stdout == "welcome")

        let received = origin.waitForRequests(3)
        #expect(received.count == 3)
        for request in received {
            #expect(!request.contains("Proxy-Authorization"), "forwarded: \(request.headText)")
        }
    }

    @Test func basicAuthenticationGuardsConnectToo() throws {
        let echo = try EchoServer()
        defer { echo.stop() }
        let proxy = try ProxyProcess(config: "connect: {ports: [\(echo.port)]}\naccess: {users: {alice: secret}}\n")
        defer { proxy.stop() }
        let authority = "127.0.0.1:\(echo.port)"

        let missing = try RawHTTPClient.exchange(RequestText.make("CONNECT", authority, host: authority), to: proxy.port, method: "CONNECT")
        #expect(missing.status == 407)
        #expect(missing.value(of: "Proxy-Authenticate") != nil)
        #expect(echo.connectionCount == 0)

        let client = try RawHTTPClient(port: proxy.port)
        #expect(try client.openTunnel(to: authority, headers: [("Proxy-Authorization", Self.basic("alice", "secret"))]).status == 200)
        #expect(try client.echoRoundTrip(Array("inside".utf8)) == Array("inside".utf8))
    }

    // MARK: the proxy's own addresses

    /// A proxy whose admin API listens on a port known before start-up (so that `connect.ports` can name it and
    /// so that the loop check does not depend on learning an ephemeral port). The port is one the kernel just
    /// handed out and released; a start that loses the race for it is retried.
    static func proxyWithKnownAdminPort(config: (UInt16) -> String) throws -> (ProxyProcess, UInt16) {
        var lastError: (any Error)?
        for _ in 0..<3 {
            let port = try LoopbackPort.refusingConnections()
            do {
                let proxy = try ProxyProcess(config: config(port), arguments: ["--admin-listen", "127.0.0.1:\(port)"])
                if proxy.adminPort == port { return (proxy, port) }
                proxy.stop()
            } catch {
                lastError = error
            }
        }
        if let lastError { throw lastError }
        struct AdminPortLost: Error {}
        throw AdminPortLost()
    }

    @Test func requestsToTheProxysOwnPortAreLoops() throws {
        let proxy = try ProxyProcess(config: "")
        defer { proxy.stop() }
        for url in ["http://127.0.0.1:\(proxy.port)/", "http://LOCALHOST:\(proxy.port)/x"] {
            let response = try RawHTTPClient.exchange(RequestText.make("GET", url), to: proxy.port)
            #expect(response.status == 508, "\(url)")
            #expect(response.problem?.error == "loop-detected", "\(url)")
        }
        // A request that already passed through this proxy.
        let looped = try RawHTTPClient.exchange(RequestText.make("GET", "http://example.invalid/", headers: [("Via", "1.1 datamode-proxy")]),
                                             to: proxy.port)
        #expect(looped.status == 508)
        #expect(looped.problem?.error == "loop-detected")
    }

    /// `--admin-listen 127.0.0.1:0` (what tests and `docker run` with an ephemeral port use): the port the
    /// kernel chose is the admin API all the same.
    @Test func requestsToAnEphemeralAdminPortAreLoops() throws {
        let proxy = try ProxyProcess(config: "")  // admin on 127.0.0.1:0
        defer { proxy.stop() }
        for url in ["http://127.0.0.1:\(proxy.adminPort)/mode", "http://localhost:\(proxy.adminPort)/healthz"] {
            let response = try RawHTTPClient.exchange(RequestText.make("GET", url), to: proxy.port)
            #expect(response.status == 508, "\(url): \(response.status) \(response.bodyText.prefix(200))")
            #expect(response.problem?.error == "loop-detected", "\(url)")
        }
    }

    @Test func connectToTheAdminPortIsALoop() throws {
        // Even with the admin port allowed for CONNECT.
        let (proxy, adminPort) = try Self.proxyWithKnownAdminPort { "connect: {ports: [443, \($0)]}\n" }
        defer { proxy.stop() }
        let response = try RawHTTPClient.exchange(RequestText.make("CONNECT", "127.0.0.1:\(adminPort)", host: "127.0.0.1:\(adminPort)"),
                                               to: proxy.port, method: "CONNECT")
        #expect(response.status == 508)
        #expect(response.problem?.error == "loop-detected")
    }

    /// An SSRF into the admin API: a client of the proxy must not be able to change the mode. Every spelling of
    /// an address that reaches the admin listener is refused, not just the literal one it was configured with
    /// (0.0.0.0 and the IPv4-mapped IPv6 address both connect to 127.0.0.1 on Linux).
    @Test(arguments: ["127.0.0.1", "localhost", "0.0.0.0", "127.0.0.2", "[::ffff:127.0.0.1]", "[::ffff:7f00:1]"])
    func theAdminAPIIsNotReachableThroughTheProxy(host: String) throws {
        let (proxy, adminPort) = try Self.proxyWithKnownAdminPort { _ in "" }
        defer { proxy.stop() }
        let url = "http://\(host):\(adminPort)/mode"
        let response = try RawHTTPClient.exchange(RequestText.make("PUT", url, headers: [("Content-Type", "application/json")],
                                                                body: "{\"mode\": \"constrained\"}"), to: proxy.port)
        let direct = try AdminAPIClient(port: adminPort).get("/mode")
        #expect(direct.object["mode"] as? String == "normal", "PUT \(url) through the proxy changed the mode: \(response.headText)\(response.bodyText)")
        #expect(direct.object["source"] as? String != "api")
        #expect(response.status != 200)
        if response.status != 502 {
            // 502 = nothing there (127.0.0.2 where 127/8 is not all local); otherwise it must be a loop.
            #expect(response.status == 508, "\(url): \(response.status)")
        }
    }
}
