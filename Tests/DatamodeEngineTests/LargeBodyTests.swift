import DatamodeHTTP
import DatamodeTestSupport
import Testing

/// SPEC §6: bodies are streamed both ways, never buffered whole. 50 MiB each way, compared by checksum at both
/// ends; neither the origin nor the client keeps the body (the origin's recording limit is far below it).
@Suite struct LargeBodyTests {
    static let size: UInt64 = 50 << 20

    @Test(arguments: [OriginBodyFraming.contentLength, .chunked(chunkSize: 256 * 1024)])
    func a50MiBResponseBodyArrivesIntact(framing: OriginBodyFraming) throws {
        let pattern = PatternBody(length: Self.size, seed: 7)
        let origin = try RecordingOrigin { _ in
            .stream(status: 200, headers: [HTTPField(name: "Content-Type", value: "application/octet-stream")],
                    body: BodyGenerator(pattern), framing: framing)
        }
        defer { origin.stop() }
        let proxy = try ProxyHarness()
        defer { proxy.stop() }
        let client = try proxy.connect(timeout: .seconds(30))

        try client.send(RequestText.make("GET", origin.url("/big.bin")))
        var received = StreamChecksum()
        let response = try client.readResponse(bodySink: { received.update($0) })

        #expect(response.status == 200)
        #expect(response.bodyLength == Self.size)
        #expect(received.length == Self.size)
        #expect(received.value == pattern.checksum)
        if framing == .contentLength {
            #expect(response.value(of: "Content-Length") == String(Self.size))
        } else {
            #expect(response.framing == .chunked)
        }

        // The connection is still in step: a small request after the big one works.
        origin.setHandler { _ in .ok("small") }
        try client.send(RequestText.make("GET", origin.url("/small")))
        #expect(try client.readResponse().bodyText == "small")
    }

    @Test func a50MiBRequestBodyArrivesIntact() throws {
        let origin = try RecordingOrigin(maxRecordedBodyBytes: 1 << 20) { request in
            .ok("\(request.payloadLength) \(request.payloadChecksum)")
        }
        defer { origin.stop() }
        let proxy = try ProxyHarness()
        defer { proxy.stop() }
        let client = try proxy.connect(timeout: .seconds(30))

        let pattern = PatternBody(length: Self.size, seed: 11)
        try client.send("PUT \(origin.url("/upload.bin")) HTTP/1.1\r\nHost: \(origin.authority)\r\n"
            + "Content-Type: application/octet-stream\r\nContent-Length: \(Self.size)\r\n\r\n")
        let sent = try client.send(pattern)
        let response = try client.readResponse()

        #expect(response.status == 200)
        #expect(response.bodyText == "\(Self.size) \(sent)")
        let requests = origin.requests
        try #require(requests.count == 1)
        #expect(requests[0].payloadLength == Self.size)
        #expect(requests[0].payloadChecksum == sent)
        #expect(requests[0].bodyLength == Self.size)
        #expect(requests[0].value(of: "Content-Length") == String(Self.size))
    }

    @Test func aChunkedRequestBodyOfManyChunksArrivesIntact() throws {
        let origin = try RecordingOrigin(maxRecordedBodyBytes: 1 << 20) { request in
            .ok("\(request.payloadLength) \(request.payloadChecksum)")
        }
        defer { origin.stop() }
        let proxy = try ProxyHarness()
        defer { proxy.stop() }
        let client = try proxy.connect(timeout: .seconds(30))

        // 8 MiB in chunks of 64 KiB + 1 (odd sizes, so chunk boundaries never line up with reads).
        let total: UInt64 = 8 << 20
        let pattern = PatternBody(length: total, seed: 3)
        try client.send("POST \(origin.url("/chunked-upload")) HTTP/1.1\r\nHost: \(origin.authority)\r\n"
            + "Transfer-Encoding: chunked\r\n\r\n")
        var sent = StreamChecksum()
        var wire: UInt64 = 0
        try pattern.forEachChunk(chunkSize: 64 * 1024 + 1) { chunk in
            sent.update(chunk)
            let sizeLine = Array((String(chunk.count, radix: 16) + "\r\n").utf8)
            try client.send(sizeLine + Array(chunk) + [13, 10])
            wire += UInt64(sizeLine.count + chunk.count + 2)
        }
        try client.send("0\r\n\r\n")
        wire += 5
        let response = try client.readResponse()

        #expect(response.status == 200)
        #expect(response.bodyText == "\(total) \(sent.value)")
        let requests = origin.requests
        try #require(requests.count == 1)
        #expect(requests[0].bodyLength == wire)
        #expect(requests[0].value(of: "Transfer-Encoding") == "chunked")
    }
}
