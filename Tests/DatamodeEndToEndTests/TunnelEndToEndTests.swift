import DatamodeHTTP
import DatamodeTestSupport
import Foundation
import Synchronization
import Testing

/// CONNECT tunnels and protocol upgrades through the real binary (SPEC §6): a tunnel is opened only after the
/// request's tags and decision, only to `connect.ports`, and then carries bytes unchanged both ways; an
/// `Upgrade` becomes a tunnel only after a real `101`.
@Suite struct TunnelEndToEndTests {
    /// `CONNECT host:port` as curl sends it.
    static func connectRequest(_ authority: String, headers: [(String, String)] = []) -> String {
        RequestText.make("CONNECT", authority, headers: headers, host: authority)
    }

    // MARK: CONNECT

    @Test func connectTunnelCarriesAnHTTPExchangeByteExact() throws {
        let origin = try RecordingOrigin { request in
            request.target == "/second"
                ? .respond(status: 201, headers: [HTTPField(name: "X-Origin", value: "two")], body: Array("created \(request.bodyText)".utf8))
                : .respond(status: 200, headers: [HTTPField(name: "X-Origin", value: "one")], body: Array("tunnel body".utf8))
        }
        defer { origin.stop() }
        let proxy = try ProxyProcess(config: "connect: {ports: [\(origin.port)]}\n")
        defer { proxy.stop() }

        let client = try RawHTTPClient(port: proxy.port)
        try client.send(Self.connectRequest(origin.authority))
        let established = try client.readResponse(method: "CONNECT")
        #expect(established.status == 200)

        // Inside the tunnel: things the proxy would rewrite or refuse if it read them as a proxy request
        // (origin-form target, Proxy-Connection, an invalid Allow-Constrained, no Via). They must arrive as sent.
        let first = "GET /first?q=1 HTTP/1.1\r\nHost: \(origin.authority)\r\nProxy-Connection: keep-alive\r\n"
            + "Allow-Constrained: maybe\r\nX-Spaces:   kept  \r\n\r\n"
        try client.send(first)
        let firstResponse = try client.readResponse()
        #expect(firstResponse.headText == "HTTP/1.1 200 OK\r\nX-Origin: one\r\nContent-Length: 11\r\n\r\n")
        #expect(firstResponse.bodyText == "tunnel body")

        let second = "POST /second HTTP/1.1\r\nHost: \(origin.authority)\r\nContent-Length: 5\r\n\r\nhello"
        try client.send(second)
        let secondResponse = try client.readResponse()
        #expect(secondResponse.headText == "HTTP/1.1 201 Created\r\nX-Origin: two\r\nContent-Length: 13\r\n\r\n")
        #expect(secondResponse.bodyText == "created hello")

        let received = origin.waitForRequests(2)
        try #require(received.count == 2)
        #expect(received[0].raw == Array(first.utf8))
        #expect(received[1].raw == Array(second.utf8))
        // One tunnel, one upstream connection.
        #expect(received.allSatisfy { $0.connection == 1 })
        #expect(origin.connectionCount == 1)
        #expect(origin.violations.isEmpty)
    }

    @Test func bytesSentBeforeTheEstablishedResponseAreRelayedInOrderNotParsed() throws {
        let origin = try RecordingOrigin { _ in .ok("early") }
        defer { origin.stop() }
        let proxy = try ProxyProcess(config: "connect: {ports: [\(origin.port)]}\n")
        defer { proxy.stop() }

        // The client does not wait for the 200 (RFC 9110 §9.3.6 allows it, as TLS False Start does): the
        // tunnelled request follows the CONNECT in the same write.
        let inner = "GET /early HTTP/1.1\r\nHost: \(origin.authority)\r\n\r\n"
        let client = try RawHTTPClient(port: proxy.port)
        try client.send(Self.connectRequest(origin.authority) + inner)
        let established = try client.readResponse(method: "CONNECT")
        #expect(established.status == 200)
        let response = try client.readResponse()
        #expect(response.status == 200)
        #expect(response.bodyText == "early")
        let received = origin.waitForRequests(1)
        try #require(received.count == 1)
        #expect(received[0].raw == Array(inner.utf8))
        #expect(!received[0].contains("Via"))
    }

    @Test func connectTunnelCarriesBinaryBytesBothWaysUnchanged() throws {
        let echo = try EchoServer()
        defer { echo.stop() }
        let proxy = try ProxyProcess(config: "connect: {ports: [\(echo.port)]}\n")
        defer { proxy.stop() }

        let client = try RawHTTPClient(port: proxy.port)
        #expect(try client.openTunnel(to: "127.0.0.1:\(echo.port)").status == 200)
        // Every byte value (CR, LF, NUL included), then more than every buffer on the way holds.
        let small = (0...255).map { UInt8($0) }
        #expect(try client.echoRoundTrip(small) == small)
        let large = PatternBody(length: 8 << 20, seed: 7).bytes
        let back = try client.echoRoundTrip(large)
        #expect(back.count == large.count)
        #expect(StreamChecksum.of(back) == StreamChecksum.of(large))
        #expect(echo.connectionCount == 1)
    }

    /// An established tunnel is handed to the kernel's splice(2) relay (the default), or kept on the evbuffer
    /// path with `DATAMODE_TUNNEL_SPLICE=0`; either way every byte arrives, and the metric says which ran.
    @Test(arguments: [true, false])
    func establishedTunnelsUseSpliceUnlessTurnedOff(splice: Bool) throws {
        let tunnel = try EchoTunnel(splice: splice)
        let payload = PatternBody(length: 4 << 20, seed: 5).bytes
        let back = try tunnel.client.echoRoundTrip(payload)
        #expect(back.count == payload.count)
        #expect(StreamChecksum.of(back) == StreamChecksum.of(payload))
        let metrics = try AdminAPIClient(port: tunnel.proxy.adminPort).get("/metrics").bodyText
        let line = metrics.split(separator: "\n").first { $0.hasPrefix("datamode_tunnel_splices_total ") }
        #expect(line == (splice ? "datamode_tunnel_splices_total 1" : "datamode_tunnel_splices_total 0"))
    }

    /// Several tunnels at once, each moving 4 MiB both ways at full speed: every byte of every tunnel arrives
    /// (a lost wake-up in the relay shows up as a tunnel that stops short of the end).
    @Test func concurrentTunnelsDeliverEveryByte() throws {
        let echo = try EchoServer()
        defer { echo.stop() }
        let proxy = try ProxyProcess(config: "connect: {ports: [\(echo.port)]}\n")
        defer { proxy.stop() }
        let payload = PatternBody(length: 4 << 20, seed: 11).bytes
        let expected = StreamChecksum.of(payload)
        // A stall hits a few per cent of transfers when it happens at all: 48 of them make it show.
        let tunnels = 6
        let rounds = 8
        let results = Mutex<[String]>([])
        for round in 0..<rounds {
            let group = DispatchGroup()
            for index in 0..<tunnels {
                group.enter()
                Thread.detachNewThread {
                    defer { group.leave() }
                    let outcome: String
                    do {
                        // No byte for 5 s on loopback is a stall, not slowness.
                        let client = try RawHTTPClient(port: proxy.port, timeout: .seconds(5))
                        let status = try client.openTunnel(to: "127.0.0.1:\(echo.port)").status
                        let back = try client.echoRoundTrip(payload)
                        outcome = status == 200 && StreamChecksum.of(back) == expected ? "ok" : "round \(round) tunnel \(index): corrupted"
                    } catch {
                        outcome = "round \(round) tunnel \(index): \(error)"
                    }
                    results.withLock { $0.append(outcome) }
                }
            }
            group.wait()
        }
        let failures = results.withLock { $0.filter { $0 != "ok" } }
        #expect(failures.isEmpty, "\(failures.count) of \(tunnels * rounds) tunnels failed: \(failures)")
    }

    /// TCP half-close through a tunnel: a client that has sent everything shuts down its sending side and
    /// still reads the whole answer (netcat -N, many request/response protocols over CONNECT). The proxy must
    /// pass the EOF on to the origin and keep relaying the origin's bytes until the origin closes.
    @Test func aClientHalfCloseStillDeliversTheRestOfTheTunnelledResponse() throws {
        let echo = try EchoServer(repliesAfterEOF: true)  // answers only after it has read the client's EOF
        defer { echo.stop() }
        let proxy = try ProxyProcess(config: "connect: {ports: [\(echo.port)]}\n")
        defer { proxy.stop() }

        let client = try RawHTTPClient(port: proxy.port)
        #expect(try client.openTunnel(to: "127.0.0.1:\(echo.port)").status == 200)
        let payload = PatternBody(length: 256 * 1024, seed: 9).bytes
        try client.send(payload)
        client.shutdownWrite()
        let back = try client.readAll()
        // Counts and checksums, not the arrays: a failure message holding 256 KiB twice takes minutes to render.
        #expect(back.count == payload.count)
        #expect(StreamChecksum.of(back) == StreamChecksum.of(payload))
    }

    @Test func connectCarriesTLSEndToEnd() throws {
        let directory = try ScratchDirectory.make("tls")
        defer { ScratchDirectory.remove(directory) }
        let server = try TLSFileServer(directory: directory)
        defer { server.stop() }
        let document = PatternBody(length: 200_000, seed: 42).bytes
        try server.publish("document.bin", document)
        let proxy = try ProxyProcess(config: "connect: {ports: [\(server.port)]}\n")
        defer { proxy.stop() }

        let curl = try ExternalCommand.run("/usr/bin/curl", [
            "-sS", "--max-time", "20", "--proxy", "http://127.0.0.1:\(proxy.port)",
            "--cacert", server.certificatePath, "https://localhost:\(server.port)/document.bin",
        ])
        #expect(curl.status == 0, "\(curl.output.prefix(2000))")
        #expect(curl.stdoutBytes.count == document.count)
        #expect(StreamChecksum.of(curl.stdoutBytes) == StreamChecksum.of(document))

        // The access log records the tunnel as a CONNECT to that authority, once it has ended (curl has closed it;
        // the proxy notices and writes the line a moment later), with at least the document's bytes out.
        var entries: [[String: Any]] = []
        _ = AdminPolling.until {
            entries = proxy.accessLog.filter { $0["method"] as? String == "CONNECT" }
            return !entries.isEmpty
        }
        #expect(entries.contains { ($0["url"] as? String) == "localhost:\(server.port)" && ($0["status"] as? Int) == 200 })
        #expect(entries.contains { ($0["bytesOut"] as? Int ?? 0) > document.count })
    }

    @Test func connectToAPortOutsideConnectPortsIsRefused() throws {
        let echo = try EchoServer()
        defer { echo.stop() }
        let proxy = try ProxyProcess(config: "")  // connect.ports defaults to [443]
        defer { proxy.stop() }

        let response = try RawHTTPClient.exchange(Self.connectRequest("127.0.0.1:\(echo.port)"), to: proxy.port, method: "CONNECT")
        #expect(response.status == 403)
        #expect(response.value(of: "Content-Type") == "application/problem+json")
        #expect(response.problem?.error == "connect-port-denied")
        #expect(response.problem?.status == 403)
        #expect(echo.connectionCount == 0)

        // curl sees the refusal as a failed CONNECT too.
        let curl = try ExternalCommand.run("/usr/bin/curl", [
            "-sS", "--max-time", "10", "-p", "--proxy", "http://127.0.0.1:\(proxy.port)", "http://127.0.0.1:\(echo.port)/",
        ])
        #expect(curl.status != 0)
        #expect(curl.output.contains("403"))
        #expect(echo.connectionCount == 0)
    }

    /// Bytes a client sends right behind a CONNECT belong to the tunnel it expected. When the CONNECT is refused
    /// they must not be read as a new proxy request: that would let tunnel payload (which a client-side
    /// filter never inspected as a request) reach an origin through the proxy.
    @Test func bytesBehindARefusedConnectAreNeverForwarded() throws {
        let origin = try RecordingOrigin { _ in .ok("smuggled") }
        defer { origin.stop() }
        let proxy = try ProxyProcess(config: "")
        defer { proxy.stop() }

        let client = try RawHTTPClient(port: proxy.port)
        let smuggled = RequestText.make("GET", origin.url("/smuggled"))
        try client.send(Self.connectRequest("127.0.0.1:\(origin.port)") + smuggled)
        let refusal = try client.readResponse(method: "CONNECT")
        #expect(refusal.status == 403)
        #expect(refusal.problem?.error == "connect-port-denied")
        // Whatever the proxy does next (close, or answer an error), it must not forward the bytes.
        if !client.isClosedByPeer(within: .seconds(2)) {
            let next = try? client.readResponse()
            #expect(next?.status != 200, "the bytes behind a refused CONNECT were forwarded as a request")
        }
        #expect(origin.requests.isEmpty, "origin received: \(origin.requests.map(\.headText))")
    }

    @Test func hostRulesApplyToConnectButOtherTunnelsStillOpen() throws {
        let echo = try EchoServer()
        defer { echo.stop() }
        let proxy = try ProxyProcess(config: """
            mode: constrained
            connect: {ports: [443, \(echo.port)]}
            rules:
              - name: video-hosts
                match: {host: "*.video.example"}
                tags: {allow-constrained: false}
            """)
        defer { proxy.stop() }

        // The rule matches the CONNECT's host: rejected before any DNS lookup or connection.
        let refused = try RawHTTPClient.exchange(Self.connectRequest("cdn.video.example:443"), to: proxy.port, method: "CONNECT")
        #expect(refused.status == 403)
        #expect(refused.value(of: "Network-Unavailable-Reason") == "constrained")
        #expect(refused.problem?.error == "constrained")
        #expect(refused.problem?.reasons == ["constrained"])
        #expect(refused.problem?.mode == "constrained")

        // The client's own tag on a CONNECT counts too.
        let tagged = try RawHTTPClient.exchange(Self.connectRequest("127.0.0.1:\(echo.port)", headers: [("Allow-Constrained", "?0")]),
                                             to: proxy.port, method: "CONNECT")
        #expect(tagged.status == 403)
        #expect(tagged.problem?.error == "constrained")
        let invalid = try RawHTTPClient.exchange(Self.connectRequest("127.0.0.1:\(echo.port)", headers: [("Allow-Constrained", "perhaps")]),
                                              to: proxy.port, method: "CONNECT")
        #expect(invalid.status == 400)
        #expect(invalid.problem?.error == "invalid-tag")
        #expect(echo.connectionCount == 0)

        // Another host under the same mode is tunnelled.
        let client = try RawHTTPClient(port: proxy.port)
        #expect(try client.openTunnel(to: "127.0.0.1:\(echo.port)").status == 200)
        #expect(try client.echoRoundTrip(Array("ping".utf8)) == Array("ping".utf8))
    }

    @Test func connectToAnUnreachablePortIs502() throws {
        let closed = try LoopbackPort.refusingConnections()
        let proxy = try ProxyProcess(config: "connect: {ports: [\(closed)]}\n")
        defer { proxy.stop() }
        let response = try RawHTTPClient.exchange(Self.connectRequest("127.0.0.1:\(closed)"), to: proxy.port, method: "CONNECT")
        #expect(response.status == 502)
        #expect(response.problem?.error == "upstream-unreachable")
    }

    // MARK: Upgrade

    static func webSocketRequest(_ url: String) -> String {
        RequestText.make("GET", url, headers: [
            ("Upgrade", "websocket"), ("Connection", "Upgrade"),
            ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="), ("Sec-WebSocket-Version", "13"),
        ])
    }

    /// A masked client text frame (RFC 6455 §5.2) carrying `text` (< 126 bytes).
    static func maskedTextFrame(_ text: String) -> [UInt8] {
        let payload = Array(text.utf8)
        let mask: [UInt8] = [0x37, 0xfa, 0x21, 0x3d]
        return [0x81, 0x80 | UInt8(payload.count)] + mask + payload.enumerated().map { $0.element ^ mask[$0.offset % 4] }
    }

    @Test func webSocketUpgradeBecomesATunnelAfter101() throws {
        let origin = try UpgradeEchoOrigin()
        defer { origin.stop() }
        let proxy = try ProxyProcess(config: "")
        defer { proxy.stop() }

        let client = try RawHTTPClient(port: proxy.port)
        try client.send(Self.webSocketRequest(origin.url("/chat")))
        let switching = try client.readResponse()
        #expect(switching.status == 101)
        let fields = switching.headText.lowercased().components(separatedBy: "\r\n")
        #expect(fields.contains("upgrade: websocket"))
        #expect(fields.contains { $0.hasPrefix("connection:") && $0.contains("upgrade") })

        // After the 101 the bytes are the new protocol's: a frame, then something that looks like HTTP and must
        // not be read as a request; each comes back exactly.
        let frame = Self.maskedTextFrame("hello through the proxy")
        #expect(try client.echoRoundTrip(frame) == frame)
        let lookalike = Array("GET http://example.invalid/ HTTP/1.1\r\n\r\n".utf8) + [0, 13, 10, 255]
        #expect(try client.echoRoundTrip(lookalike) == lookalike)

        // The upgrade was forwarded as one (RFC 9110 §7.8): Upgrade and Connection: upgrade kept for it.
        let heads = origin.requestHeads
        try #require(heads.count == 1)
        let lines = heads[0].lowercased().components(separatedBy: "\r\n")
        #expect(lines.first == "get /chat http/1.1")
        #expect(lines.contains("upgrade: websocket"))
        #expect(lines.contains { $0.hasPrefix("connection:") && $0.contains("upgrade") })
        #expect(lines.contains("sec-websocket-key: dghlihnhbxbszsbub25jzq=="))
        #expect(origin.connectionCount == 1)
    }

    @Test func anUpgradeAnsweredWith426StaysHTTP() throws {
        let origin = try RecordingOrigin { request in
            request.contains("Upgrade")
                ? .status(426, "upgrade refused", headers: [("Upgrade", "websocket"), ("Connection", "Upgrade")])
                : .ok("plain")
        }
        defer { origin.stop() }
        let proxy = try ProxyProcess(config: "")
        defer { proxy.stop() }

        let client = try RawHTTPClient(port: proxy.port)
        try client.send(Self.webSocketRequest(origin.url("/chat")))
        let refused = try client.readResponse()
        #expect(refused.status == 426)
        #expect(refused.bodyText == "upgrade refused")

        // Same client connection: the next bytes are a proxy request again, handled as one (forwarded in
        // origin-form with Via), not relayed raw through a tunnel.
        try client.send(RequestText.make("GET", origin.url("/next")))
        let next = try client.readResponse()
        #expect(next.status == 200)
        #expect(next.bodyText == "plain")
        let received = origin.waitForRequests(2)
        try #require(received.count == 2)
        #expect(received[1].target == "/next")
        #expect(received[1].values(of: "Via").contains { $0.contains("datamode-proxy") })
        #expect(!received[1].contains("Upgrade"))
    }

    @Test func a101WithoutAnUpgradeRequestIsAnUpstreamProtocolError() throws {
        let origin = try RecordingOrigin { _ in
            .raw("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\nraw bytes")
        }
        defer { origin.stop() }
        let proxy = try ProxyProcess(config: "")
        defer { proxy.stop() }
        let response = try RawHTTPClient.exchange(RequestText.make("GET", origin.url("/plain")), to: proxy.port)
        #expect(response.status == 502)
        #expect(response.problem?.error == "upstream-protocol-error")
    }
}
