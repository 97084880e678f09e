import DatamodeTestSupport
import Foundation
import Testing

/// SPEC §6: malformed or ambiguous framing from a client is refused with `400 bad-request`, the connection is
/// closed, and nothing is forwarded: the request smuggling families (CL.TE, TE.CL, TE.TE, CL.CL) and the
/// header-injection tricks (obs-fold, bare CR/LF, NUL, whitespace before the colon).
@Suite struct FramingAttackTests {
    /// Each attempt, with `{o}` standing for the origin's authority (so that anything forwarded would reach
    /// the recording origin).
    static let attempts: [(String, String)] = [
        ("CL.TE: Content-Length and Transfer-Encoding",
         "POST http://{o}/ HTTP/1.1\r\nHost: {o}\r\nContent-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nG"),
        ("TE.CL: Transfer-Encoding before Content-Length",
         "POST http://{o}/ HTTP/1.1\r\nHost: {o}\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n5c\r\nGPOST / HTTP/1.1\r\n\r\n0\r\n\r\n"),
        ("CL.CL: two differing Content-Lengths",
         "POST http://{o}/ HTTP/1.1\r\nHost: {o}\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!"),
        ("CL.CL: a differing list in one Content-Length",
         "POST http://{o}/ HTTP/1.1\r\nHost: {o}\r\nContent-Length: 5, 6\r\n\r\nhello!"),
        ("signed Content-Length",
         "POST http://{o}/ HTTP/1.1\r\nHost: {o}\r\nContent-Length: +5\r\n\r\nhello"),
        ("hex Content-Length",
         "POST http://{o}/ HTTP/1.1\r\nHost: {o}\r\nContent-Length: 0x5\r\n\r\nhello"),
        ("TE.TE: gzip, chunked",
         "POST http://{o}/ HTTP/1.1\r\nHost: {o}\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n"),
        ("TE.TE: chunked twice",
         "POST http://{o}/ HTTP/1.1\r\nHost: {o}\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
        ("TE.TE: a misspelt coding",
         "POST http://{o}/ HTTP/1.1\r\nHost: {o}\r\nTransfer-Encoding: xchunked\r\n\r\n0\r\n\r\n"),
        ("Transfer-Encoding in HTTP/1.0",
         "POST http://{o}/ HTTP/1.0\r\nHost: {o}\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
        ("obs-fold",
         "GET http://{o}/ HTTP/1.1\r\nHost: {o}\r\nX-Folded: a\r\n  Transfer-Encoding: chunked\r\n\r\n"),
        ("bare LF line endings",
         "GET http://{o}/ HTTP/1.1\nHost: {o}\n\n"),
        ("bare LF inside the header section",
         "GET http://{o}/ HTTP/1.1\r\nHost: {o}\nX-Injected: yes\r\n\r\n"),
        ("bare CR inside the header section",
         "GET http://{o}/ HTTP/1.1\r\nHost: {o}\rX-Injected: yes\r\n\r\n"),
        ("whitespace before the colon",
         "POST http://{o}/ HTTP/1.1\r\nHost: {o}\r\nTransfer-Encoding : chunked\r\nContent-Length: 5\r\n\r\nhello"),
        ("NUL in a field value",
         "GET http://{o}/ HTTP/1.1\r\nHost: {o}\r\nX-Nul: a\u{0}b\r\n\r\n"),
        ("NUL in a field name",
         "GET http://{o}/ HTTP/1.1\r\nHost: {o}\r\nX-\u{0}Nul: ab\r\n\r\n"),
        ("two Host fields",
         "GET http://{o}/ HTTP/1.1\r\nHost: {o}\r\nHost: other.example\r\n\r\n"),
        ("two spaces in the request line",
         "GET  http://{o}/ HTTP/1.1\r\nHost: {o}\r\n\r\n"),
        // Connection naming a framing field: filtering would drop the field and forward its body unframed, and
        // the chunk data (a whole second request here) would reach a pooled origin connection raw.
        ("Connection: Transfer-Encoding",
         "POST http://{o}/x HTTP/1.1\r\nHost: {o}\r\nConnection: Transfer-Encoding\r\nTransfer-Encoding: chunked\r\n\r\n"
            + "2a\r\nGET /smuggled HTTP/1.1\r\nHost: {o}\r\nX: yyyyyyy\r\n\r\n0\r\n\r\n"),
        ("Connection: keep-alive, Transfer-Encoding",
         "POST http://{o}/x HTTP/1.1\r\nHost: {o}\r\nConnection: keep-alive, Transfer-Encoding\r\nTransfer-Encoding: chunked\r\n\r\n"
            + "5\r\nhello\r\n0\r\n\r\n"),
        ("Connection: TRANSFER-ENCODING in another case, in a second Connection field",
         "POST http://{o}/x HTTP/1.1\r\nHost: {o}\r\nConnection: keep-alive\r\nConnection:  TRANSFER-ENCODING \r\n"
            + "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
        ("Connection: Content-Length",
         "POST http://{o}/x HTTP/1.1\r\nHost: {o}\r\nConnection: Content-Length\r\nContent-Length: 5\r\n\r\nhello"),
        ("Connection: Host",
         "GET http://{o}/x HTTP/1.1\r\nHost: {o}\r\nConnection: close, host\r\n\r\n"),
    ]

    @Test(arguments: attempts)
    func isRefusedWithTheConnectionClosedAndNothingForwarded(name: String, request: String) throws {
        let origin = try RecordingOrigin { _ in .ok() }
        defer { origin.stop() }
        let proxy = try ProxyHarness()
        defer { proxy.stop() }
        let client = try proxy.connect()

        try client.send(request.replacingOccurrences(of: "{o}", with: origin.authority))
        let response = try client.readResponse()

        expectProblem(response, status: 400, error: "bad-request")
        #expect(response.values(of: "Connection").map { $0.lowercased() } == ["close"], "\(name)")
        #expect(client.isClosedByPeer(), "\(name): connection left open")
        expectOriginUntouched(origin)
    }

    /// The response side of `Connection: Transfer-Encoding`: an origin that names its own framing field in
    /// Connection would have its chunked body relayed unframed on a kept-alive client connection (the client
    /// hangs, the next response is read as part of this one). Refused with 502 before anything is relayed, and
    /// the client connection stays in step.
    @Test(arguments: ["Transfer-Encoding", "keep-alive, transfer-encoding", "Content-Length"])
    func anOriginNamingItsFramingInConnectionGets502(connection: String) throws {
        let framing = connection.lowercased().contains("transfer") ? "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
            : "Content-Length: 5\r\n\r\nhello"
        let origin = try RecordingOrigin { request in
            request.target == "/next" ? .ok("next") : .raw("HTTP/1.1 200 OK\r\nConnection: \(connection)\r\n\(framing)")
        }
        defer { origin.stop() }
        let proxy = try ProxyHarness()
        defer { proxy.stop() }
        let client = try proxy.connect()

        try client.send(RequestText.make("GET", origin.url("/framed")))
        let response = try client.readResponse()
        expectProblem(response, status: 502, error: "upstream-protocol-error")
        #expect(response.problem?.detail?.contains("Connection names") == true, "\(response.bodyText)")

        try client.send(RequestText.make("GET", origin.url("/next")))
        #expect(try client.readResponse().bodyText == "next")
    }

    /// Whatever survives header filtering, the forwarded framing is the proxy's own: a chunked request reaches
    /// the origin with exactly one `Transfer-Encoding: chunked` written by the proxy.
    @Test func theForwardedFramingIsWrittenFromTheParse() throws {
        let origin = try RecordingOrigin { _ in .ok() }
        defer { origin.stop() }
        let proxy = try ProxyHarness()
        defer { proxy.stop() }
        let client = try proxy.connect()

        try client.send("POST \(origin.url("/c")) HTTP/1.1\r\nHost: \(origin.authority)\r\nTransfer-Encoding:  Chunked \r\n\r\n"
            + "5\r\nhello\r\n0\r\n\r\n")
        #expect(try client.readResponse().status == 200)
        let request = try #require(origin.waitForRequests(1).first)
        #expect(request.values(of: "Transfer-Encoding") == ["chunked"])
        #expect(request.payloadLength == 5)
    }

    // MARK: bad chunked framing in the body

    /// Invalid chunked framing after a valid head: the proxy can only see it once body bytes arrive.
    /// The third member is the most of the body that may reach the origin: a streaming proxy passes on valid
    /// chunk data before it can see that the CRLF after it is missing, never a byte of invalid framing.
    static let badChunks: [(String, String, String)] = [
        ("chunk size 0x5", "0x5\r\nhello\r\n0\r\n\r\n", ""),
        ("chunk size with a sign", "+5\r\nhello\r\n0\r\n\r\n", ""),
        ("chunk size with leading whitespace", " 5\r\nhello\r\n0\r\n\r\n", ""),
        ("bare LF after the chunk size", "5\nhello\r\n0\r\n\r\n", ""),
        ("chunk data longer than its size", "3\r\nhello\r\n0\r\n\r\n", "3\r\nhel"),
        ("chunk size over 64 bits", "10000000000000005\r\nhello\r\n0\r\n\r\n", ""),
        // SPEC §6: above 0x0fffffffffffffff, as nginx and HAProxy refuse it. A recipient with a signed 64-bit size
        // reads the first two as -1 and as negative; one that wraps reads 2^64 as 0 (the end of the body).
        ("chunk size 2^64-1", "ffffffffffffffff\r\nhello\r\n0\r\n\r\n", ""),
        ("chunk size 2^63+5", "8000000000000005\r\nhello\r\n0\r\n\r\n", ""),
        ("chunk size 2^64, 17 digits", "10000000000000000\r\nhello\r\n0\r\n\r\n", ""),
        ("chunk size 2^60, just above the bound", "1000000000000000\r\nhello\r\n0\r\n\r\n", ""),
    ]

    static let chunkedHead = "POST http://{o}/upload HTTP/1.1\r\nHost: {o}\r\nTransfer-Encoding: chunked\r\n\r\n"

    /// Whole request in one write: the bad chunk is in the proxy's buffer together with the head, so it can be
    /// refused before anything goes upstream (SPEC §6 "it is never forwarded").
    @Test(arguments: badChunks)
    func aBadChunkSentWithTheHeadIsRefusedAndNeverForwarded(name: String, chunks: String, mayReach: String) throws {
        let origin = try RecordingOrigin { _ in .ok() }
        defer { origin.stop() }
        let proxy = try ProxyHarness()
        defer { proxy.stop() }
        let client = try proxy.connect()

        try client.send((Self.chunkedHead + chunks).replacingOccurrences(of: "{o}", with: origin.authority))
        let response = try client.readResponse()

        expectProblem(response, status: 400, error: "bad-request")
        #expect(client.isClosedByPeer(), "\(name): connection left open")
        #expect(origin.waitUntilConnectionsClosed())
        // What must hold even for a streaming proxy: no complete request, and not one byte of the invalid framing.
        #expect(origin.requests.isEmpty, "\(name)")
        for connection in 0..<origin.connectionCount {
            let received = String(decoding: origin.receivedBytes(onConnection: connection + 1), as: UTF8.self)
            guard let headEnd = received.range(of: "\r\n\r\n") else { continue }
            let body = String(received[headEnd.upperBound...])
            #expect(mayReach.hasPrefix(body), "\(name): origin got \(received.debugDescription)")
        }
        // The contract: nothing at all reaches the origin, not even the head queued before the framing was
        // checked (it is dropped before libevent writes it).
        #expect(origin.bytesReceived == 0, "\(name): origin received \(origin.bytesReceived) bytes")
    }

    /// The bad chunk arrives after a valid chunk was already streamed to the origin: the proxy answers 400,
    /// closes both connections, and the origin never sees a byte of the invalid framing nor a complete request.
    @Test(arguments: badChunks)
    func aBadChunkAfterStreamingStartedNeverReachesTheOrigin(name: String, chunks: String, mayReach: String) throws {
        let origin = try RecordingOrigin { _ in .ok() }
        defer { origin.stop() }
        let proxy = try ProxyHarness()
        defer { proxy.stop() }
        let client = try proxy.connect()

        let head = Self.chunkedHead.replacingOccurrences(of: "{o}", with: origin.authority)
        try client.send(head + "5\r\nfirst\r\n")
        // Wait until the valid part has been streamed through (head + first chunk).
        let before = String(decoding: origin.waitForReceivedBytes(onConnection: 1) {
            String(decoding: $0, as: UTF8.self).hasSuffix("5\r\nfirst\r\n")
        }, as: UTF8.self)
        try #require(before.hasSuffix("\r\n\r\n5\r\nfirst\r\n"), "\(name): the valid start was not streamed: \(before.debugDescription)")

        try client.send(chunks)
        let response = try client.readResponse()

        expectProblem(response, status: 400, error: "bad-request")
        #expect(client.isClosedByPeer(), "\(name): connection left open")
        #expect(origin.waitUntilConnectionsClosed(), "\(name): the upstream connection was kept")
        #expect(origin.requests.isEmpty)
        #expect(origin.connectionCount == 1)
        let received = String(decoding: origin.receivedBytes(onConnection: 1), as: UTF8.self)
        #expect(received.hasPrefix(before) && mayReach.hasPrefix(String(received.dropFirst(before.count))),
                "\(name): origin got more: \(received.debugDescription)")
    }

    /// The last chunk arrives alone, its trailer section a moment later, and the trailer section is refused: the
    /// last-chunk line must not have gone ahead on its own. An origin that saw `0\r\n` would take the body as
    /// ended, or not, depending on how the client's bytes happened to arrive at the proxy.
    @Test(arguments: ["X : a\r\n\r\n", "X: a\u{0}b\r\n\r\n", "X: a\r\n  folded\r\n\r\n"])
    func aLastChunkIsNotForwardedBeforeItsTrailerSectionIsValid(trailers: String) throws {
        let origin = try RecordingOrigin { _ in .ok() }
        defer { origin.stop() }
        let proxy = try ProxyHarness()
        defer { proxy.stop() }
        let client = try proxy.connect()

        try client.send(Self.chunkedHead.replacingOccurrences(of: "{o}", with: origin.authority) + "5\r\nfirst\r\n")
        let before = origin.waitForReceivedBytes(onConnection: 1) {
            String(decoding: $0, as: UTF8.self).hasSuffix("5\r\nfirst\r\n")
        }
        try client.send("0\r\n")
        Thread.sleep(forTimeInterval: 0.2)
        try client.send(trailers)

        expectProblem(try client.readResponse(), status: 400, error: "bad-request")
        #expect(origin.waitUntilConnectionsClosed())
        #expect(origin.requests.isEmpty)
        let received = origin.receivedBytes(onConnection: 1)
        #expect(received == before, "origin got more: \(String(decoding: received.dropFirst(before.count), as: UTF8.self).debugDescription)")
    }

    /// A trailer field no trailer may carry on (framing, routing, connection-specific: `TrailerSection`, RFC 9110
    /// §6.5.1) is left out of the trailer section the origin gets, in whatever pieces it arrives; the body and the
    /// other trailer fields go as they came. A recipient that merged trailers into the head never sees them.
    @Test func aTrailerSectionReachesTheOriginWithoutFramingOrRoutingFields() throws {
        let origin = try RecordingOrigin { _ in .ok() }
        defer { origin.stop() }
        let proxy = try ProxyHarness()
        defer { proxy.stop() }
        let client = try proxy.connect()

        try client.send(Self.chunkedHead.replacingOccurrences(of: "{o}", with: origin.authority) + "5\r\nfirst\r\n0\r\nContent-")
        Thread.sleep(forTimeInterval: 0.2)
        try client.send("Length: 5\r\nX-Checksum: c\r\nHost: elsewhere.example\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
        let response = try client.readResponse()
        #expect(response.status == 200)
        let received = String(decoding: origin.receivedBytes(onConnection: 1), as: UTF8.self)
        #expect(received.hasSuffix("\r\n\r\n5\r\nfirst\r\n0\r\nX-Checksum: c\r\n\r\n"), "\(received.debugDescription)")
        #expect(origin.requests.count == 1)
    }

    // MARK: limits (SPEC §6 defaults: request line 8 KiB, header section 64 KiB, 100 fields)

    @Test func aRequestLineOver8KiBIsURITooLong() throws {
        let origin = try RecordingOrigin { _ in .ok() }
        defer { origin.stop() }
        let proxy = try ProxyHarness()
        defer { proxy.stop() }
        let client = try proxy.connect()

        let path = "/" + String(repeating: "a", count: 8 * 1024)
        try client.send(RequestText.make("GET", origin.url(path)))
        let response = try client.readResponse()

        expectProblem(response, status: 414, error: "uri-too-long")
        #expect(client.isClosedByPeer())
        expectOriginUntouched(origin)
    }

    @Test func aRequestLineJustUnder8KiBIsForwarded() throws {
        let origin = try RecordingOrigin { _ in .ok() }
        defer { origin.stop() }
        let proxy = try ProxyHarness()
        defer { proxy.stop() }
        let client = try proxy.connect()

        // "GET " + URL + " HTTP/1.1" == 8192 bytes exactly.
        let fixed = "GET \(origin.url("/")) HTTP/1.1".utf8.count
        let path = "/" + String(repeating: "b", count: 8 * 1024 - fixed)
        try client.send(RequestText.make("GET", origin.url(path)))
        let response = try client.readResponse()

        #expect(response.status == 200)
        #expect(origin.requests.map(\.target) == [path])
    }

    @Test func aHeaderSectionOver64KiBIsHeadersTooLarge() throws {
        let origin = try RecordingOrigin { _ in .ok() }
        defer { origin.stop() }
        let proxy = try ProxyHarness()
        defer { proxy.stop() }
        let client = try proxy.connect()

        // 66 fields of ~1 KiB: under the count limit, over the size limit.
        let value = String(repeating: "v", count: 1000)
        let headers = (0..<66).map { ("X-Big-\($0)", value) }
        try client.send(RequestText.make("GET", origin.url("/big-head"), headers: headers))
        let response = try client.readResponse()

        expectProblem(response, status: 431, error: "headers-too-large")
        #expect(client.isClosedByPeer())
        expectOriginUntouched(origin)
    }

    @Test func moreThan100FieldsIsHeadersTooLarge() throws {
        let origin = try RecordingOrigin { _ in .ok() }
        defer { origin.stop() }
        let proxy = try ProxyHarness()
        defer { proxy.stop() }
        let client = try proxy.connect()

        // Host + 100 more = 101 field lines.
        let headers = (0..<100).map { ("X-Field-\($0)", "v") }
        try client.send(RequestText.make("GET", origin.url("/many"), headers: headers))
        let response = try client.readResponse()

        expectProblem(response, status: 431, error: "headers-too-large")
        #expect(client.isClosedByPeer())
        expectOriginUntouched(origin)
    }

    @Test func exactly100FieldsAreForwarded() throws {
        let origin = try RecordingOrigin { _ in .ok() }
        defer { origin.stop() }
        let proxy = try ProxyHarness()
        defer { proxy.stop() }
        let client = try proxy.connect()

        let headers = (0..<99).map { ("X-Field-\($0)", "v") }
        try client.send(RequestText.make("GET", origin.url("/hundred"), headers: headers))
        let response = try client.readResponse()

        #expect(response.status == 200)
        #expect(origin.requests.first?.values(of: "X-Field-98") == ["v"])
    }

    @Test func configuredLimitsApply() throws {
        let origin = try RecordingOrigin { _ in .ok() }
        defer { origin.stop() }
        let proxy = try ProxyHarness(yaml: "limits: {request-line: 100B, header-count: 3}")
        defer { proxy.stop() }

        let long = try proxy.connect()
        try long.send(RequestText.make("GET", origin.url("/" + String(repeating: "x", count: 100))))
        expectProblem(try long.readResponse(), status: 414, error: "uri-too-long")

        let many = try proxy.connect()
        try many.send(RequestText.make("GET", origin.url("/"), headers: [("A", "1"), ("B", "2"), ("C", "3")]))
        expectProblem(try many.readResponse(), status: 431, error: "headers-too-large")
        expectOriginUntouched(origin)
    }
}
