import DatamodeHTTP
import DatamodeTestSupport
import Foundation
import Testing

/// An origin connection whose input sits at the high watermark (the client is slower than the origin, or a link
/// bucket holds the bytes back) is not read, nor woken, again until the input drains: libevent 2.1 would otherwise
/// re-run the read callback without a syscall for as long as it waits, a busy loop worth most of a core. Counted in
/// read callbacks (`MetricsSnapshot.upstreamReadCallbacks`), not time: a body a few MB long needs a few hundred at
/// most, the busy loop ran tens of thousands a second.
@Suite(.serialized) struct ReadHoldTests {
    static func download(_ client: RawHTTPClient, _ url: String, pause: UInt32 = 0) throws -> (ParsedResponse, StreamChecksum) {
        var received = StreamChecksum()
        try client.send(RequestText.make("GET", url))
        let response = try client.readResponse(bodySink: {
            received.update($0)
            if pause > 0 { usleep(pause) }
        })
        return (response, received)
    }

    @Test("A chunked body waiting on a link bucket does not wake the worker over and over")
    func bodyHeldByTheBucket() throws {
        // Chunked: not spliced, so the body waits in the origin connection's input for the bucket (1.5 s at 2 MB/s).
        let pattern = PatternBody(length: 3_000_000, seed: 21)
        let origin = try RecordingOrigin { _ in
            .stream(status: 200, body: BodyGenerator(pattern), framing: .chunked(chunkSize: 64 * 1024))
        }
        defer { origin.stop() }
        let proxy = try ProxyHarness(yaml: LinkShapingTests.yaml(down: "16Mbit", up: "16Mbit"))
        defer { proxy.stop() }
        let client = try proxy.connect(timeout: .seconds(30))

        let (response, received) = try Self.download(client, origin.url("/big.bin"))
        #expect(response.status == 200)
        #expect(received.length == pattern.length)
        #expect(received.value == pattern.checksum)
        let callbacks = proxy.server.metrics().upstreamReadCallbacks
        #expect(callbacks < 3_000, "\(callbacks) read callbacks for a 3 MB body")
        #expect(proxy.server.metrics().bodySplices == 0)
    }

    @Test("An upload waiting on the up bucket does not wake the worker over and over")
    func uploadHeldByTheBucket() throws {
        let origin = try RecordingOrigin(maxRecordedBodyBytes: 1 << 20) { request in
            .ok("\(request.payloadLength) \(request.payloadChecksum)")
        }
        defer { origin.stop() }
        let proxy = try ProxyHarness(yaml: LinkShapingTests.yaml(down: "1Gbit", up: "16Mbit"))
        defer { proxy.stop() }
        let client = try proxy.connect(timeout: .seconds(30))
        // 3 MB at 2 MB/s: the body waits in the client connection's input for about 1.5 s.
        let pattern = PatternBody(length: 3_000_000, seed: 23)
        try client.send("PUT \(origin.url("/up.bin")) HTTP/1.1\r\nHost: \(origin.authority)\r\nContent-Length: \(pattern.length)\r\n\r\n")
        let sent = try client.send(pattern)
        let response = try client.readResponse()
        #expect(response.status == 200)
        #expect(response.bodyText == "\(pattern.length) \(sent)")
        let callbacks = proxy.server.metrics().clientReadCallbacks
        #expect(callbacks < 3_000, "\(callbacks) read callbacks for a 3 MB upload")
    }

    @Test("A chunked body waiting on a slow client does not wake the worker over and over, and arrives whole")
    func bodyHeldByASlowClient() throws {
        let pattern = PatternBody(length: 12_000_000, seed: 22)
        let origin = try RecordingOrigin { _ in
            .stream(status: 200, body: BodyGenerator(pattern), framing: .chunked(chunkSize: 64 * 1024))
        }
        defer { origin.stop() }
        let proxy = try ProxyHarness()
        defer { proxy.stop() }
        let client = try proxy.connect(timeout: .seconds(30), receiveBuffer: 32 * 1024)

        // The client takes its bytes slowly: the proxy's buffers fill and the origin's bytes wait in its input.
        let (response, received) = try Self.download(client, origin.url("/big.bin"), pause: 4_000)
        #expect(response.status == 200)
        #expect(received.length == pattern.length)
        #expect(received.value == pattern.checksum)
        let callbacks = proxy.server.metrics().upstreamReadCallbacks
        #expect(callbacks < 3_000, "\(callbacks) read callbacks for a 12 MB body")

        // The connection is still in step: the next response comes through the same origin connection.
        origin.setHandler { _ in .ok("small") }
        try client.send(RequestText.make("GET", origin.url("/small")))
        #expect(try client.readResponse().bodyText == "small")
    }
}

/// The same busy loop on the TLS side (SPEC §9, §17): an intercepted download to a slow client leaves the origin
/// connection's input (a TLS bufferevent, or an HTTP/2 origin stream's pair) at its high watermark. It cost ~80% of
/// a core for as long as the client took (20 MB at 4 MB/s: 3.9 s of proxy CPU against 0.08 s once held).
@Suite(.serialized) struct InterceptedReadHoldTests {
    @Test("An intercepted download to a slow client does not wake the worker over and over", arguments: ["http/1.1", "h2"])
    func interceptedBodyHeldByASlowClient(originProtocol: String) throws {
        let directory = try ScratchDirectory.make("datamode-tls-hold")
        defer { ScratchDirectory.remove(directory) }
        let size = 8_000_000
        let port: UInt16
        let path: String
        var stops: [() -> Void] = []
        defer { stops.forEach { $0() } }
        if originProtocol == "h2" {
            let origin = try H2Origin(directory: directory + "/h2")
            stops.append(origin.stop)
            (port, path) = (origin.port, "/stream/\(size)")
        } else {
            let origin = try HTTPSOrigin(directory: directory + "/h1")
            stops.append(origin.stop)
            (port, path) = (origin.port, "/bytes/\(size)")
        }
        let proxy = try ProxyHarness(yaml: """
            connect: {ports: [\(port)]}
            tls: {intercept: [localhost], upstream-verify: false}
            http2: {upstream: \(originProtocol == "h2")}
            """)
        defer { proxy.stop() }
        // curl takes 2 MB/s: the proxy's buffers toward it fill and the origin's bytes wait in its input.
        let result = try ExternalCommand.run("/usr/bin/curl", [
            "-sS", "--http1.1", "-x", "http://127.0.0.1:\(proxy.port)", "--cacert", proxy.stateDirectory + "/ca.pem",
            "--limit-rate", "2M", "-o", directory + "/body.bin", "-w", "%{http_code} %{size_download}",
            "https://localhost:\(port)\(path)",
        ], timeout: 60)
        #expect(result.stdout == "200 \(size)", "\(result.output)")
        let body = try Data(contentsOf: URL(fileURLWithPath: directory + "/body.bin"))
        #expect(body.count == size && body.enumerated().allSatisfy { $0.element == HTTPSOrigin.patternByte($0.offset) })
        let callbacks = proxy.server.metrics().upstreamReadCallbacks
        #expect(callbacks < 3_000, "\(callbacks) read callbacks for an \(size)-byte body")
        // Counted whole, though an h2 origin stream's pair refills the exchange's input as the relay empties it.
        #expect(proxy.server.metrics().bytesOut >= size, "\(proxy.server.metrics().bytesOut) bytes out counted")
    }
}

/// The client's side inside interception: an upload waiting on the up bucket leaves the client connection's input
/// (the TLS filter's, or an HTTP/2 stream's end of its pair) at its high watermark. An intercepted 6 MB upload at
/// 16 Mbit/s cost 2.4 s of proxy CPU over its 2.8 s. And every byte is charged: a bufferevent pair refills the
/// exchange's input while the relay empties it, so counting "what the source held before, less what it holds
/// after" saw a few bytes where hundreds of KB had moved; an HTTP/2 upload went through the up bucket at 6 times
/// its rate (3 MB at 16 Mbit/s in 0.4 s) and was under-counted in bytes and budgets.
@Suite(.serialized) struct InterceptedUploadReadHoldTests {
    @Test("An intercepted upload waiting on the up bucket does not wake the worker over and over, and is shaped and counted whole",
          arguments: ["--http1.1", "--http2"])
    func interceptedUploadHeldByTheBucket(http: String) throws {
        let directory = try ScratchDirectory.make("datamode-tls-upload-hold")
        defer { ScratchDirectory.remove(directory) }
        let origin = try HTTPSOrigin(directory: directory + "/origin")
        defer { origin.stop() }
        let proxy = try ProxyHarness(yaml: LinkShapingTests.yaml(down: "1Gbit", up: "16Mbit", extra: """
            connect: {ports: [\(origin.port)]}
            tls: {intercept: [localhost], upstream-verify: false}
            """))
        defer { proxy.stop() }
        // 3 MB at 2 MB/s: the body waits in the client connection's input for about 1.5 s.
        var body = [UInt8](repeating: 0, count: 3_000_000)
        for i in body.indices { body[i] = UInt8(truncatingIfNeeded: i &* 7 &+ i >> 11) }
        try Data(body).write(to: URL(fileURLWithPath: directory + "/up.bin"))
        let digest = try ExternalCommand.run("/usr/bin/sha256sum", [directory + "/up.bin"], timeout: 30)
        let result = try ExternalCommand.run("/usr/bin/curl", [
            "-sS", http, "-x", "http://127.0.0.1:\(proxy.port)", "--cacert", proxy.stateDirectory + "/ca.pem", "-w", "\n%{time_total}",
            "--data-binary", "@" + directory + "/up.bin", "https://localhost:\(origin.port)/upload",
        ], timeout: 60)
        let lines = result.stdout.split(separator: "\n").map(String.init)
        #expect(lines.first == "received \(body.count) bytes sha256 \(digest.stdout.prefix(64))", "\(result.output)")
        // 3 MB at 2 MB/s: 1.5 s, less at most the 50 ms burst.
        let elapsed = Double(lines.last ?? "") ?? 0
        #expect(elapsed >= 1.35, "took \(elapsed) s")
        #expect(proxy.server.metrics().bytesIn >= body.count, "\(proxy.server.metrics().bytesIn) bytes in counted")
        let callbacks = proxy.server.metrics().clientReadCallbacks
        #expect(callbacks < 3_000, "\(callbacks) read callbacks for a 3 MB upload")
    }
}
