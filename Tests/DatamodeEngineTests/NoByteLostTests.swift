import DatamodeHTTP
import DatamodeTestSupport
import Foundation
import Testing

/// SPEC §6 "No byte is lost": every body byte an origin sent before it closed reaches the client before the
/// proxy closes the client connection, however slowly the client reads; the same for request bodies and tunnels.
///
/// Found from outside: a 5 MB file from `python3 -m http.server` (HTTP/1.0, Content-Length, then close) lost its
/// last ~540 KB in 5 of 30 downloads, and in 10 of 10 with a slow client: the origin's FIN arrived while the tail
/// still sat in the proxy's buffers, and the proxy ended the response there. The race is between the origin's
/// EOF and the client draining the proxy's buffers, so every large case runs several times, and the slow reader
/// (a small receive buffer, a pause per read) makes the proxy's buffers full when the EOF arrives.
@Suite struct NoByteLostTests {
    /// How the origin frames and ends its response.
    enum OriginStyle: String, CaseIterable, CustomTestStringConvertible {
        /// `HTTP/1.0 200`, Content-Length, then close (python3 -m http.server).
        case http10LengthThenClose
        /// `HTTP/1.1 200`, Content-Length, `Connection: close`, then close.
        case http11ConnectionClose
        /// No length: the body ends where the origin closes.
        case closeDelimited
        /// Content-Length on a kept-alive connection.
        case keepAlive
        /// Chunked on a kept-alive connection.
        case chunked

        var testDescription: String { rawValue }

        func response(for pattern: PatternBody) -> OriginResponse {
            let type = HTTPField(name: "Content-Type", value: "application/octet-stream")
            switch self {
            case .http10LengthThenClose, .keepAlive:
                return .stream(status: 200, headers: [type], body: BodyGenerator(pattern), framing: .contentLength)
            case .http11ConnectionClose:
                return .stream(status: 200, headers: [type, HTTPField(name: "Connection", value: "close")],
                               body: BodyGenerator(pattern), framing: .contentLength)
            case .closeDelimited:
                return .stream(status: 200, headers: [type], body: BodyGenerator(pattern), framing: .closeDelimited)
            case .chunked:
                return .stream(status: 200, headers: [type], body: BodyGenerator(pattern),
                               framing: .chunked(chunkSize: 64 * 1024 + 7))
            }
        }
    }

    /// How the client asks and reads.
    enum ClientStyle: String, CaseIterable, CustomTestStringConvertible {
        /// HTTP/1.1, reads as fast as it can, keeps the connection.
        case keepAlive
        /// HTTP/1.1 with an 8 KiB receive buffer and a pause after every read.
        case slowReader
        /// HTTP/1.0 (chunked framing is removed for it; the proxy closes after the body).
        case http10

        var testDescription: String { rawValue }
    }

    static let sizes: [(bytes: UInt64, runs: Int)] = [(1024, 2), (300 * 1024, 4), (5_000_000, 4)]

    @Test(arguments: OriginStyle.allCases, ClientStyle.allCases)
    func everyResponseByteReachesTheClient(origin style: OriginStyle, client clientStyle: ClientStyle) throws {
        let origin = try RecordingOrigin(responseVersion: style == .http10LengthThenClose ? .http10 : .http11) { request in
            let size = UInt64(request.target.split(separator: "/").last.flatMap { UInt64($0) } ?? 0)
            return style.response(for: PatternBody(length: size, seed: size & 0xff))
        }
        defer { origin.stop() }
        let proxy = try ProxyHarness()
        defer { proxy.stop() }

        for (size, runs) in Self.sizes {
            let pattern = PatternBody(length: size, seed: size & 0xff)
            for run in 1...runs {
                let client = try proxy.connect(timeout: .seconds(60),
                                               receiveBuffer: clientStyle == .slowReader ? 8 * 1024 : nil)
                defer { client.close() }
                let version = clientStyle == .http10 ? "HTTP/1.0" : "HTTP/1.1"
                try client.send("GET \(origin.url("/body/\(size)")) \(version)\r\nHost: \(origin.authority)\r\n\r\n")
                var received = StreamChecksum()
                let response: ParsedResponse
                do {
                    response = try client.readResponse(bodySink: { piece in
                        received.update(piece)
                        if clientStyle == .slowReader { Thread.sleep(forTimeInterval: 0.0005) }
                    })
                } catch {
                    Issue.record("\(size) bytes, run \(run): \(error); \(received.length) bytes arrived")
                    continue
                }
                #expect(response.status == 200)
                #expect(received.length == size, "\(size) bytes, run \(run): \(received.length) arrived")
                #expect(received.value == pattern.checksum, "\(size) bytes, run \(run): checksum")

                // A kept-alive client connection stays in step (the origin closing its own connection after a
                // delimited body does not end the client's); a body delimited by the close, or an HTTP/1.0
                // client, ends the connection after the last byte.
                if clientStyle != .http10 && style != .closeDelimited {
                    try client.send("GET \(origin.url("/body/10")) HTTP/1.1\r\nHost: \(origin.authority)\r\n\r\n")
                    let next = try client.readResponse()
                    #expect(next.bodyLength == 10)
                } else {
                    #expect(client.isClosedByPeer(within: .seconds(10)), "the proxy closes after a body it cannot reuse")
                }
            }
        }
    }

    /// Request bodies: the client sends the whole body and half-closes at once, while the origin reads slowly;
    /// the body is still in the proxy's buffers when the client's FIN arrives. All of it must reach the origin,
    /// and the response must reach the client.
    @Test(arguments: [false, true])
    func everyRequestByteReachesTheOriginWhenTheClientHalfCloses(chunked: Bool) throws {
        let origin = try RecordingOrigin(maxRecordedBodyBytes: 1 << 16, readPause: .milliseconds(1)) { request in
            .ok("\(request.payloadLength) \(request.payloadChecksum)")
        }
        defer { origin.stop() }
        let proxy = try ProxyHarness()
        defer { proxy.stop() }

        for run in 1...3 {
            let size: UInt64 = 3_000_000
            let pattern = PatternBody(length: size, seed: UInt64(run))
            let client = try proxy.connect(timeout: .seconds(60))
            defer { client.close() }
            let framing = chunked ? "Transfer-Encoding: chunked" : "Content-Length: \(size)"
            try client.send("PUT \(origin.url("/upload")) HTTP/1.1\r\nHost: \(origin.authority)\r\n\(framing)\r\n\r\n")
            var sum = StreamChecksum()
            try pattern.forEachChunk(chunkSize: 100_003) { piece in
                sum.update(piece)
                if chunked { try client.send(String(piece.count, radix: 16) + "\r\n") }
                try client.send(Array(piece))
                if chunked { try client.send("\r\n") }
            }
            if chunked { try client.send("0\r\n\r\n") }
            client.shutdownWrite()
            let response = try client.readResponse()
            #expect(response.status == 200, "run \(run): \(response.bodyText)")
            #expect(response.bodyText == "\(size) \(sum.value)", "run \(run)")
        }
    }
}

/// Tunnels: an origin inside a CONNECT tunnel sends 5 MB and closes, to a slow reader that has half-closed its
/// own side (both EOFs are in while most of the body is still in the proxy's buffers, or in the splice pipe).
@Suite struct TunnelNoByteLostTests {
    @Test(arguments: [false, true])
    func everyTunnelByteReachesTheClient(clientHalfCloses: Bool) throws {
        let size: UInt64 = 5_000_000
        let pattern = PatternBody(length: size, seed: 5)
        let origin = try RecordingOrigin(responseVersion: .http10) { _ in
            .stream(status: 200, body: BodyGenerator(pattern), framing: .contentLength)
        }
        defer { origin.stop() }
        let proxy = try ProxyHarness(yaml: "connect: {ports: [\(origin.port)]}")
        defer { proxy.stop() }

        for run in 1...4 {
            let client = try proxy.connect(timeout: .seconds(60), receiveBuffer: 8 * 1024)
            defer { client.close() }
            try client.send("CONNECT \(origin.authority) HTTP/1.1\r\nHost: \(origin.authority)\r\n\r\n")
            let established = try client.readResponse(method: "CONNECT")
            try #require(established.status == 200)
            try client.send("GET /tunnelled HTTP/1.0\r\nHost: \(origin.authority)\r\n\r\n")
            if clientHalfCloses { client.shutdownWrite() }
            var received = StreamChecksum()
            do {
                let response = try client.readResponse(bodySink: { piece in
                    received.update(piece)
                    Thread.sleep(forTimeInterval: 0.0005)
                })
                #expect(response.status == 200)
            } catch {
                Issue.record("run \(run): \(error); \(received.length) bytes arrived")
            }
            #expect(received.length == size, "run \(run)")
            #expect(received.value == pattern.checksum, "run \(run)")
        }
    }
}

/// Large Content-Length bodies move kernel to kernel (splice(2), exactly the body's bytes taken from the
/// origin's socket): byte-exact, the pooled upstream reused for the next response, and an origin that closes
/// mid-body still cuts the client short instead of hanging it.
@Suite struct BodySpliceTests {
    @Test func aSplicedBodyArrivesIntactAndTheConnectionsStayInStep() throws {
        let origin = try RecordingOrigin { request in
            let size = UInt64(request.target.split(separator: "/").last.flatMap { UInt64($0) } ?? 0)
            return .stream(status: 200, body: BodyGenerator(PatternBody(length: size, seed: size & 0xff)), framing: .contentLength)
        }
        defer { origin.stop() }
        let proxy = try ProxyHarness(threads: 1)
        defer { proxy.stop() }
        let client = try proxy.connect(timeout: .seconds(60), receiveBuffer: 64 * 1024)

        for (run, size) in [20_000_000, 300_000, 10, 7_000_000].enumerated() {
            let pattern = PatternBody(length: UInt64(size), seed: UInt64(size) & 0xff)
            try client.send(RequestText.make("GET", origin.url("/body/\(size)")))
            var received = StreamChecksum()
            let response = try client.readResponse(bodySink: { received.update($0) })
            #expect(response.status == 200)
            #expect(received.length == UInt64(size), "run \(run)")
            #expect(received.value == pattern.checksum, "run \(run)")
        }
        #expect(proxy.server.metrics().bodySplices >= 1, "the large bodies went through splice(2)")
        #expect(origin.connectionCount == 1, "the upstream connection was pooled and reused after each body")
    }

    @Test func anOriginThatClosesMidSplicedBodyCutsTheClientShort() throws {
        let origin = try RecordingOrigin { _ in
            .raw("HTTP/1.1 200 OK\r\nContent-Length: 50000000\r\n\r\n" + String(repeating: "x", count: 3_000_000), thenClose: true)
        }
        defer { origin.stop() }
        let proxy = try ProxyHarness(threads: 1)
        defer { proxy.stop() }
        let client = try proxy.connect(timeout: .seconds(30), receiveBuffer: 16 * 1024)
        try client.send(RequestText.make("GET", origin.url("/short")))
        var received = 0
        #expect(throws: (any Error).self) {
            _ = try client.readResponse(bodySink: { received += $0.count; Thread.sleep(forTimeInterval: 0.0002) })
        }
        #expect(received == 3_000_000, "every byte the origin sent before closing reached the client")
        #expect(client.isClosedByPeer())
    }
}

/// Found from outside: three pipelined requests written at once and followed at once by a half-close got one
/// answer; the two others were dropped without a word. Every request sent before the EOF is answered, in order,
/// then the connection closes (SPEC §6: pipelined requests answered in order; no byte is lost).
@Suite struct PipelinedHalfCloseTests {
    @Test(arguments: [false, true])
    func everyRequestSentBeforeAHalfCloseIsAnswered(withBodies: Bool) throws {
        let origin = try RecordingOrigin { request in .ok("\(request.target) \(request.payloadLength)") }
        defer { origin.stop() }
        let proxy = try ProxyHarness()
        defer { proxy.stop() }

        for run in 1...5 {
            let client = try proxy.connect()
            defer { client.close() }
            var batch = ""
            var expected: [String] = []
            for (index, path) in ["/a", "/b", "/c"].enumerated() {
                if withBodies && index == 0 {
                    batch += "POST \(origin.url(path)) HTTP/1.1\r\nHost: \(origin.authority)\r\nContent-Length: 5\r\n\r\nhello"
                    expected.append("\(path) 5")
                } else if withBodies && index == 1 {
                    batch += "POST \(origin.url(path)) HTTP/1.1\r\nHost: \(origin.authority)\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
                    expected.append("\(path) 3")
                } else {
                    batch += "GET \(origin.url(path)) HTTP/1.1\r\nHost: \(origin.authority)\r\n\r\n"
                    expected.append("\(path) 0")
                }
            }
            try client.send(batch)
            client.shutdownWrite()
            for want in expected {
                let response = try client.readResponse()
                #expect(response.status == 200, "run \(run)")
                #expect(response.bodyText == want, "run \(run)")
            }
            #expect(client.isClosedByPeer(), "run \(run): the connection closes once everything was answered")
        }
    }
}
