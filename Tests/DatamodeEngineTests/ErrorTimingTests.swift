import DatamodeHTTP
import DatamodeTestSupport
import Foundation
import Testing

/// Timers and errors that used to cut healthy work or answer nothing (SPEC §6), each found from outside.
@Suite struct ErrorTimingTests {
    // MARK: the response-head timeout counts from the end of the request

    /// A 1.5 MB upload at ~512 KiB/s takes ~3 s; with `upstream-response: 1s` it used to get 504 after 1 s while
    /// bytes were flowing. The timeout counts from the moment the whole request has been sent.
    @Test func anUploadThatKeepsMovingIsNeverCutByTheResponseTimeout() throws {
        let origin = try RecordingOrigin(maxRecordedBodyBytes: 1 << 16) { request in
            .ok("\(request.payloadLength) \(request.payloadChecksum)")
        }
        defer { origin.stop() }
        let proxy = try ProxyHarness(yaml: "timeouts: {upstream-response: 1s}")
        defer { proxy.stop() }
        let client = try proxy.connect(timeout: .seconds(30))

        let size: UInt64 = 1_500_000
        let pattern = PatternBody(length: size, seed: 9)
        try client.send("PUT \(origin.url("/slow-upload")) HTTP/1.1\r\nHost: \(origin.authority)\r\nContent-Length: \(size)\r\n\r\n")
        var sum = StreamChecksum()
        try pattern.forEachChunk(chunkSize: 32 * 1024) { piece in
            sum.update(piece)
            try client.send(Array(piece))
            Thread.sleep(forTimeInterval: 0.06)
        }
        let response = try client.readResponse()
        #expect(response.status == 200, "\(response.bodyText)")
        #expect(response.bodyText == "\(size) \(sum.value)")
    }

    /// After the request is sent, the timeout still applies to an origin that does not answer.
    @Test func anOriginSilentAfterTheUploadStillTimesOut() throws {
        let origin = try RecordingOrigin { _ in .delay(.seconds(4), then: .ok("too late")) }
        defer { origin.stop() }
        let proxy = try ProxyHarness(yaml: "timeouts: {upstream-response: 1s}")
        defer { proxy.stop() }
        let client = try proxy.connect()

        let started = ContinuousClock.now
        try client.send("POST \(origin.url("/u")) HTTP/1.1\r\nHost: \(origin.authority)\r\nContent-Length: 5\r\n\r\nhello")
        let response = try client.readResponse()
        expectProblem(response, status: 504, error: "upstream-timeout")
        #expect(ContinuousClock.now - started < .seconds(3))
    }

    /// An origin that stops taking the request body: the same timeout ends the exchange once nothing moves for a
    /// whole period (it must not hang forever on backpressure).
    @Test func anOriginThatStopsReadingTheUploadTimesOut() throws {
        let origin = try RecordingOrigin(readPause: .seconds(30)) { _ in .ok() }
        defer { origin.stop() }
        let proxy = try ProxyHarness(yaml: "timeouts: {upstream-response: 1s}")
        defer { proxy.stop() }
        let client = try proxy.connect(timeout: .seconds(20))

        let size: UInt64 = 20_000_000
        try client.send("PUT \(origin.url("/stuck")) HTTP/1.1\r\nHost: \(origin.authority)\r\nContent-Length: \(size)\r\n\r\n")
        // Send what the buffers take, without blocking the test on the full 20 MB.
        nonisolated(unsafe) let writer = client  // the test thread only reads from it meanwhile
        let sender = Thread { _ = try? writer.send(PatternBody(length: size, seed: 1)) }
        sender.start()
        let response = try client.readResponse()
        expectProblem(response, status: 504, error: "upstream-timeout")
        origin.stop()
    }

    // MARK: an origin's broken framing before any response byte went out

    static let badFirstChunks: [(String, String)] = [
        ("chunk size 0x5", "0x5\r\nhello\r\n0\r\n\r\n"),
        ("chunk size zz", "zz\r\nhello\r\n0\r\n\r\n"),
        ("a bad chunk after a good one, in the same packet", "5\r\nhello\r\n+3\r\nabc\r\n0\r\n\r\n"),
        ("chunk data longer than its size", "3\r\nhello\r\n0\r\n\r\n"),
        // SPEC §6: a chunk size above 0x0fffffffffffffff, from an origin.
        ("chunk size 2^64-1", "ffffffffffffffff\r\nhello\r\n0\r\n\r\n"),
        ("chunk size 2^63+5", "8000000000000005\r\nhello\r\n0\r\n\r\n"),
        ("chunk size 2^64, 17 digits", "10000000000000000\r\nhello\r\n0\r\n\r\n"),
        ("chunk size 2^60, just above the bound", "1000000000000000\r\nhello\r\n0\r\n\r\n"),
        ("chunk size 2^63+5 after a good chunk", "5\r\nhello\r\n8000000000000005\r\nabc\r\n0\r\n\r\n"),
    ]

    /// The client used to get its connection closed with zero bytes; while nothing of the response has been
    /// written, a clean `502 upstream-protocol-error` is still possible, and the connection stays usable.
    @Test(arguments: badFirstChunks)
    func anOriginsBadChunkBeforeAnyByteWentOutIs502(name: String, chunks: String) throws {
        let origin = try RecordingOrigin { request in
            request.target == "/next" ? .ok("next")
                : .raw("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks, thenClose: true)
        }
        defer { origin.stop() }
        let proxy = try ProxyHarness()
        defer { proxy.stop() }
        let client = try proxy.connect()

        try client.send(RequestText.make("GET", origin.url("/bad-chunks")))
        let response = try client.readResponse()
        expectProblem(response, status: 502, error: "upstream-protocol-error")
        #expect(response.problem?.detail?.contains("chunk") == true, "\(name): \(response.bodyText)")

        try client.send(RequestText.make("GET", origin.url("/next")))
        #expect(try client.readResponse().bodyText == "next", "\(name)")
    }

    // MARK: a client's bad chunk: always 400 while no response byte went out

    /// The head first, the bad chunk a moment later, then the client's half-close: the answer used to depend on
    /// which of the client's EOF, its bytes and the upstream connect came first (400, or a silent close).
    @Test(arguments: [0, 2, 10])
    func aClientsBadChunkIsAlways400(delayMs: Int) throws {
        let origin = try RecordingOrigin { _ in .ok() }
        defer { origin.stop() }
        let proxy = try ProxyHarness()
        defer { proxy.stop() }

        for run in 1...10 {
            let client = try proxy.connect()
            defer { client.close() }
            try client.send("POST \(origin.url("/c")) HTTP/1.1\r\nHost: \(origin.authority)\r\nTransfer-Encoding: chunked\r\n\r\n")
            if delayMs > 0 { Thread.sleep(forTimeInterval: Double(delayMs) / 1000) }
            try client.send("0x4\r\nabcd\r\n0\r\n\r\n")
            if run % 2 == 0 { client.shutdownWrite() }
            let response = try client.readResponse()
            expectProblem(response, status: 400, error: "bad-request")
            #expect(client.isClosedByPeer(), "run \(run)")
        }
        #expect(origin.requests.isEmpty)
    }

    /// The same while the upstream is still connecting: the client's bad chunk and its half-close arrive before
    /// the connection is up (this used to close the client connection without a word: the half-close of a client
    /// whose body was not yet relayed was taken for an abort).
    @Test func aClientsBadChunkIs400WhileTheUpstreamIsStillConnecting() throws {
        let stalled = try StalledListener()
        defer { stalled.stop() }
        let proxy = try ProxyHarness(yaml: "timeouts: {upstream-connect: 5s}")
        defer { proxy.stop() }

        for halfClose in [false, true] {
            let client = try proxy.connect(timeout: .seconds(3))
            defer { client.close() }
            try client.send("POST http://127.0.0.1:\(stalled.port)/c HTTP/1.1\r\nHost: 127.0.0.1:\(stalled.port)\r\n"
                + "Transfer-Encoding: chunked\r\n\r\n")
            Thread.sleep(forTimeInterval: 0.02)
            try client.send("0x4\r\nabcd\r\n0\r\n\r\n")
            if halfClose { client.shutdownWrite() }
            let response = try client.readResponse()
            expectProblem(response, status: 400, error: "bad-request")
        }
    }

    // MARK: Expect: 100-continue and a proxy-made answer

    /// A rejected request with `Expect: 100-continue`: the client will never send the body, so the proxy must
    /// not wait to discard it. It answers with `Connection: close` and closes.
    @Test func aProxyMadeAnswerToAnExpectContinueRequestCloses() throws {
        let origin = try RecordingOrigin { _ in .ok() }
        defer { origin.stop() }
        let proxy = try ProxyHarness(yaml: "mode: constrained")
        defer { proxy.stop() }
        let client = try proxy.connect()

        try client.send("PUT \(origin.url("/video.mp4")) HTTP/1.1\r\nHost: \(origin.authority)\r\nAllow-Constrained: ?0\r\n"
            + "Expect: 100-continue\r\nContent-Length: 100000\r\n\r\n")
        let response = try client.readResponse()
        expectProblem(response, status: 403, error: "constrained")
        #expect(response.values(of: "Connection").map { $0.lowercased() } == ["close"])
        #expect(client.isClosedByPeer(within: .seconds(3)))
        expectOriginUntouched(origin)
    }

    /// Without `Expect`, a refused request's body is still read and discarded, and the connection kept.
    @Test func aProxyMadeAnswerWithoutExpectKeepsTheConnection() throws {
        let origin = try RecordingOrigin { _ in .ok("fine") }
        defer { origin.stop() }
        let proxy = try ProxyHarness(yaml: "mode: constrained")
        defer { proxy.stop() }
        let client = try proxy.connect()

        try client.send("PUT \(origin.url("/video.mp4")) HTTP/1.1\r\nHost: \(origin.authority)\r\nAllow-Constrained: ?0\r\n"
            + "Content-Length: 5\r\n\r\nhello")
        expectProblem(try client.readResponse(), status: 403, error: "constrained")
        try client.send(RequestText.make("GET", origin.url("/ok")))
        #expect(try client.readResponse().bodyText == "fine")
    }
}
