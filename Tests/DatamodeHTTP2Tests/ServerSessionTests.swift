import CNghttp2
import DatamodeHTTP
import DatamodeHTTP2
import Testing

/// The happy paths against nghttp2's own client session, in memory (SPEC §17): requests come out as the engine
/// reads them, responses, bodies, 1xx and trailers go back, flow control holds bytes to the windows.
@Suite("HTTP/2 server session")
struct ServerSessionTests {
    static func bytes(_ count: Int, seed: UInt64) -> [UInt8] {
        var state = seed
        return (0..<count).map { _ in
            state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
            return UInt8(truncatingIfNeeded: state >> 33)
        }
    }

    @Test("GET: a request the admission can read, a response the client reads")
    func get() throws {
        let link = try Link()
        let id = link.client.request(path: "/a.jpg?x=1", [("user-agent", "t/1"), ("cookie", "a=1"), ("accept", "*/*"),
                                                           ("cookie", "b=2")])
        try link.pump { event in
            guard case .request(let stream, _, _) = event else { return }
            try link.server.sendResponseHead(stream, status: 200, fields: [HTTPField(name: "content-length", value: "5")],
                                             endStream: false)
            try Array("hello".utf8).withUnsafeBytes { _ = try link.server.sendResponseBody(stream, $0) }
            try link.server.finishResponse(stream)
        }
        let requests = link.events.compactMap { event -> (Int32, HTTP2Request, Bool)? in
            if case .request(let s, let r, let e) = event { (s, r, e) } else { nil }
        }
        try #require(requests.count == 1)
        let (stream, request, endStream) = requests[0]
        #expect(stream == id && endStream)
        #expect(request.method == "GET" && request.scheme == "https" && request.authority == "example.com")
        #expect(request.path == "/a.jpg?x=1" && request.contentLength == nil)
        // RFC 9113 §8.2.3: cookie crumbs joined with "; " where the first one was.
        #expect(request.fields == [HTTPField(name: "user-agent", value: "t/1"), HTTPField(name: "cookie", value: "a=1; b=2"),
                                   HTTPField(name: "accept", value: "*/*")])
        #expect(request.requestHead == RequestHead(method: "GET", target: "/a.jpg?x=1", version: .http11, fields: [
            HTTPField(name: "host", value: "example.com"), HTTPField(name: "user-agent", value: "t/1"),
            HTTPField(name: "cookie", value: "a=1; b=2"), HTTPField(name: "accept", value: "*/*"),
        ]))
        let response = try #require(link.client.responses[id])
        #expect(response.statuses == [200])
        #expect(response.body == Array("hello".utf8))
        #expect(response.closed == 0)
        #expect(link.events.contains(.streamClosed(id, .completed)))
    }

    @Test("POST of 5 MB, byte-exact, with 16 KiB windows: a window reopens only as the engine consumes")
    func largeUploadHeldToTheWindow() throws {
        let window: UInt32 = 16 * 1024
        let link = try Link(HTTP2ServerConfiguration(initialWindowSize: window, connectionWindowSize: 65_535))
        let body = Self.bytes(5 * 1024 * 1024 + 7, seed: 1)
        let id = link.client.request(method: "POST", path: "/upload", [("content-length", String(body.count))],
                                     body: .init(bytes: body))
        var received: [UInt8] = []
        var consumed = 0
        var maxHeld = 0
        var ended = false
        var consuming = false
        let engine: (HTTP2ServerEvent) throws -> Void = { event in
            switch event {
            case .requestBody(let stream, let bytes):
                #expect(stream == id)
                received += bytes
                maxHeld = max(maxHeld, received.count - consumed)
            case .requestEnd(let stream, let trailers):
                #expect(stream == id && trailers.isEmpty)
                ended = true
            default: break
            }
        }
        // An engine whose origin takes nothing: the client stops at the stream's window.
        try link.pump(engine: engine)
        #expect(received.count == Int(window))
        #expect(!ended)
        // Then an origin that takes 4 KiB per round.
        consuming = true
        try link.pump(engine: engine, afterRound: {
            guard consuming, consumed < received.count else { return false }
            let n = min(4096, received.count - consumed)
            link.server.consumeRequestBody(id, count: n)
            consumed += n
            return true
        })
        #expect(ended)
        #expect(received == body)
        #expect(maxHeld <= Int(window))
    }

    @Test("A 5 MB response to a client with a 16 KiB window: the queue stops the origin at the high watermark")
    func largeDownloadPacedByTheClient() throws {
        let configuration = HTTP2ServerConfiguration(responseBodyHighWatermark: 64 * 1024, responseBodyLowWatermark: 16 * 1024)
        let link = try Link(configuration, clientWindow: 16 * 1024)
        let body = Self.bytes(5 * 1024 * 1024 + 3, seed: 2)
        let id = link.client.request(path: "/big")
        var sent = 0
        var finished = false
        var paused = false
        var drained = 0
        var maxQueued = 0
        func feed(_ stream: Int32) throws {
            while !paused && sent < body.count {
                let n = min(32 * 1024, body.count - sent)
                paused = try body[sent..<(sent + n)].withUnsafeBytes { try !link.server.sendResponseBody(stream, $0) }
                sent += n
                maxQueued = max(maxQueued, link.server.bufferedResponseBytes(stream))
            }
            if sent == body.count && !finished {
                try link.server.finishResponse(stream)
                finished = true
            }
        }
        try link.pump { event in
            switch event {
            case .request(let stream, _, _):
                try link.server.sendResponseHead(stream, status: 200, fields: [], endStream: false)
                try feed(stream)
            case .responseBodyDrained(let stream):
                drained += 1
                #expect(link.server.bufferedResponseBytes(stream) < 16 * 1024)
                paused = false
                try feed(stream)
            default: break
            }
        }
        #expect(link.client.responses[id]?.body == body)
        #expect(link.client.responses[id]?.closed == 0)
        #expect(drained > 10)
        #expect(maxQueued < 64 * 1024 + 32 * 1024)
    }

    @Test("Ten concurrent streams, answered in reverse order")
    func tenConcurrentStreams() throws {
        let link = try Link()
        let ids = (0..<10).map { i in
            link.client.request(method: "POST", path: "/\(i)", body: .init(bytes: Array("body \(i)".utf8)))
        }
        var open: [Int32] = []
        var bodies: [Int32: [UInt8]] = [:]
        try link.pump { event in
            switch event {
            case .request(let stream, _, _): open.append(stream)
            case .requestBody(let stream, let bytes):
                bodies[stream, default: []] += bytes
                link.server.consumeRequestBody(stream, count: bytes.count)
            default: break
            }
        }
        #expect(open == ids)
        for (i, id) in ids.enumerated() { #expect(bodies[id] == Array("body \(i)".utf8)) }
        try link.pump()
        for id in open.reversed() {
            try link.server.sendResponseHead(id, status: 200, fields: [], endStream: false)
            try Array("stream \(id)".utf8).withUnsafeBytes { _ = try link.server.sendResponseBody(id, $0) }
            try link.server.finishResponse(id)
        }
        try link.pump()
        for id in ids {
            #expect(link.client.responses[id]?.body == Array("stream \(id)".utf8))
            #expect(link.events.contains(.streamClosed(id, .completed)))
        }
    }

    @Test("Trailers both ways (RFC 9113 §8.1)")
    func trailers() throws {
        let link = try Link()
        let id = link.client.request(method: "POST", body: .init(bytes: Array("abc".utf8), trailers: [("x-checksum", "900150983cd24fb0")]))
        try link.pump { event in
            switch event {
            case .requestBody(let stream, let bytes): link.server.consumeRequestBody(stream, count: bytes.count)
            case .requestEnd(let stream, _):
                try link.server.sendResponseHead(stream, status: 200, fields: [], endStream: false)
                try Array("ok".utf8).withUnsafeBytes { _ = try link.server.sendResponseBody(stream, $0) }
                try link.server.finishResponse(stream, trailers: [HTTPField(name: "grpc-status", value: "0")])
            default: break
            }
        }
        #expect(link.events.contains(.requestEnd(id, trailers: [HTTPField(name: "x-checksum", value: "900150983cd24fb0")])))
        let response = try #require(link.client.responses[id])
        #expect(response.body == Array("ok".utf8))
        #expect(response.trailers.map { "\($0.0): \($0.1)" } == ["grpc-status: 0"])
        #expect(response.closed == 0)
    }

    @Test("103 Early Hints before the final response; 101 refused")
    func earlyHints() throws {
        let link = try Link()
        let id = link.client.request()
        try link.pump { event in
            guard case .request(let stream, _, _) = event else { return }
            #expect(throws: HTTP2SessionError.invalidStatus(101)) {
                try link.server.sendInformational(stream, status: 101)
            }
            try link.server.sendInformational(stream, status: 103, fields: [HTTPField(name: "link", value: "</s.css>; rel=preload")])
            try link.server.sendResponseHead(stream, status: 204, fields: [], endStream: true)
            #expect(throws: HTTP2SessionError.invalidState("1xx after the final response")) {
                try link.server.sendInformational(stream, status: 103)
            }
        }
        let response = try #require(link.client.responses[id])
        #expect(response.statuses == [103, 204])
        #expect(response.sections[0].contains { $0 == ("link", "</s.css>; rel=preload") })
        #expect(response.closed == 0)
    }

    @Test("The client resets mid-body: the engine learns it, the connection window comes back")
    func clientResetMidBody() throws {
        let link = try Link(HTTP2ServerConfiguration(initialWindowSize: 65_536, connectionWindowSize: 65_536))
        let id = link.client.request(method: "POST", body: .init(bytes: Self.bytes(100_000, seed: 3), pauseAt: 40_000))
        var received = 0
        try link.pump { event in if case .requestBody(_, let bytes) = event { received += bytes.count } }
        #expect(received == 40_000)
        // The engine consumed nothing: the client has 64 KiB - 40,000 of the connection window left.
        #expect(nghttp2_session_get_remote_window_size(link.client.session) == 65_536 - 40_000)
        link.client.reset(id, .cancel)
        try link.pump()
        #expect(link.events.contains(.streamClosed(id, .resetByClient(.cancel))))
        // The stream's unconsumed bytes went back to the connection window (more than half: WINDOW_UPDATE sent).
        #expect(nghttp2_session_get_remote_window_size(link.client.session) == 65_536)
        // Calls about the closed stream are refused or do nothing.
        link.server.consumeRequestBody(id, count: 10)
        #expect(throws: HTTP2SessionError.unknownStream(id)) {
            try link.server.sendResponseHead(id, status: 200, fields: [], endStream: true)
        }
    }

    @Test("A stream's window reopens while the connection's is withheld; the connection's reopens later")
    func streamAndConnectionWindowsGivenBackApart() throws {
        let link = try Link(HTTP2ServerConfiguration(initialWindowSize: 65_536, connectionWindowSize: 65_536))
        let id = link.client.request(method: "POST", body: .init(bytes: Self.bytes(100_000, seed: 4), pauseAt: 40_000))
        var received = 0
        try link.pump { event in if case .requestBody(_, let bytes) = event { received += bytes.count } }
        #expect(received == 40_000)
        // The bytes moved on from the stream, not yet out of the proxy: the stream may send again, the connection not.
        link.server.consumeStreamWindow(id, count: 40_000)
        try link.pump()
        #expect(link.server.connectionWindowWithheld == 40_000)
        #expect(nghttp2_session_get_stream_remote_window_size(link.client.session, id) == 65_536)
        #expect(nghttp2_session_get_remote_window_size(link.client.session) == 65_536 - 40_000)
        // They left the proxy: the connection's window opens too (more than half: WINDOW_UPDATE sent).
        link.server.consumeConnectionWindow(count: 50_000)
        try link.pump()
        #expect(link.server.connectionWindowWithheld == 0)
        #expect(nghttp2_session_get_remote_window_size(link.client.session) == 65_536)
        // Nothing more is withheld: nothing more goes back.
        link.server.consumeConnectionWindow(count: 1_000)
        #expect(link.server.connectionWindowWithheld == 0)
    }

    /// Bytes a stream cannot move on yet (its exchange's input full, its origin's concurrency taken) hold the
    /// stream's window, and the connection's only as long as the engine withholds it: they count as withheld from
    /// their arrival, so the engine can give the connection window back while the stream's stays shut. (Session 18:
    /// counted only once the stream's window went back, such bytes pinned more than half the connection window,
    /// nghttp2 never sent its WINDOW_UPDATE, and the upload that could finish starved behind them.)
    @Test func bytesAStreamCannotMoveOnDoNotPinTheConnectionWindow() throws {
        let link = try Link(HTTP2ServerConfiguration(initialWindowSize: 65_536, connectionWindowSize: 65_536))
        let stuck = link.client.request(method: "POST", body: .init(bytes: Self.bytes(50_000, seed: 5), pauseAt: 50_000))
        try link.pump()
        #expect(link.server.connectionWindowWithheld == 50_000)
        // The engine cannot move the stream's bytes on, but its bound lets the connection's window go back.
        link.server.consumeConnectionWindow(count: link.server.connectionWindowWithheld)
        try link.pump()
        #expect(link.server.connectionWindowWithheld == 0)
        #expect(nghttp2_session_get_remote_window_size(link.client.session) == 65_536)
        #expect(nghttp2_session_get_stream_remote_window_size(link.client.session, stuck) == 65_536 - 50_000)
        // So another stream's whole body gets through, consumed as it comes.
        let other = link.client.request(method: "POST", body: .init(bytes: Self.bytes(200_000, seed: 6)))
        var received = 0
        try link.pump { event in
            guard case .requestBody(other, let bytes) = event else { return }
            received += bytes.count
            link.server.consumeRequestBody(other, count: bytes.count)
        }
        #expect(received == 200_000)
        #expect(link.events.contains { if case .requestEnd(other, _) = $0 { true } else { false } })
    }

    /// Squeezing takes back what a stream was granted and did not use (its window may go below zero), new streams
    /// open with the squeezed window, the bytes given back reopen it from there, and restoring gives the difference
    /// back to every stream.
    @Test func squeezingTakesUnusedGrantsBackAndRestoringGivesThemBack() throws {
        let link = try Link(HTTP2ServerConfiguration(initialWindowSize: 1 << 20, connectionWindowSize: 1 << 20))
        let held = link.client.request(method: "POST", body: .init(bytes: Self.bytes(300_000, seed: 8), pauseAt: 100_000))
        try link.pump()
        #expect(nghttp2_session_get_stream_remote_window_size(link.client.session, held) == (1 << 20) - 100_000)
        #expect(link.server.squeezeStreamWindows())
        #expect(!link.server.squeezeStreamWindows(), "squeezed once")
        try link.pump()
        #expect(link.server.streamWindowsSqueezed)
        // 1 MiB - 100,000 + (65,535 - 1 MiB) < 0: nothing more may be sent on it.
        #expect(nghttp2_session_get_stream_remote_window_size(link.client.session, held) == 0)
        let fresh = link.client.request(method: "POST", body: .init(bytes: Self.bytes(10, seed: 9), pauseAt: 0))
        try link.pump()
        #expect(nghttp2_session_get_stream_remote_window_size(link.client.session, fresh) == 65_535)
        // The 100,000 bytes moved on: the stream may send from the squeezed window again.
        link.server.consumeStreamWindow(held, count: 100_000)
        try link.pump()
        #expect(nghttp2_session_get_stream_remote_window_size(link.client.session, held) == 65_535)
        #expect(link.server.restoreStreamWindows())
        #expect(!link.server.restoreStreamWindows(), "restored once")
        try link.pump()
        #expect(!link.server.streamWindowsSqueezed)
        #expect(nghttp2_session_get_stream_remote_window_size(link.client.session, held) == 1 << 20)
        #expect(nghttp2_session_get_stream_remote_window_size(link.client.session, fresh) == 1 << 20)
    }

    /// A configured window no larger than the squeezed one is never squeezed.
    @Test func aSmallConfiguredWindowIsNotSqueezed() throws {
        let link = try Link(HTTP2ServerConfiguration(initialWindowSize: 65_535, connectionWindowSize: 65_535))
        #expect(!link.server.squeezeStreamWindows())
        #expect(!link.server.streamWindowsSqueezed)
    }

    /// A refused stream's bytes (nobody reads them) go back to both windows at once: nothing stays withheld.
    @Test func bytesNobodyReadsAreNotWithheld() throws {
        let link = try Link(HTTP2ServerConfiguration(initialWindowSize: 65_536, connectionWindowSize: 65_536))
        let id = link.client.request(method: "POST", body: .init(bytes: Self.bytes(40_000, seed: 7), pauseAt: 40_000))
        try link.pump { event in
            if case .requestBody(let sid, let bytes) = event { link.server.consumeRequestBody(sid, count: bytes.count) }
        }
        #expect(link.server.connectionWindowWithheld == 0)
        link.client.reset(id, .cancel)
        try link.pump()
        #expect(link.server.connectionWindowWithheld == 0)
    }

    @Test("The engine resets a stream mid-response: the client sees RST_STREAM with the code")
    func proxyResetMidResponse() throws {
        let link = try Link()
        let id = link.client.request()
        try link.pump { event in
            guard case .request(let stream, _, _) = event else { return }
            try link.server.sendResponseHead(stream, status: 200, fields: [HTTPField(name: "content-length", value: "10")],
                                             endStream: false)
            try Array("12345".utf8).withUnsafeBytes { _ = try link.server.sendResponseBody(stream, $0) }
        }
        try link.server.resetStream(id, code: .internalError)
        try link.pump()
        #expect(link.client.responses[id]?.resetByServer == HTTP2ErrorCode.internalError.rawValue)
        #expect(link.events.contains(.streamClosed(id, .resetByProxy(.internalError))))
    }

    /// SPEC §6 "No byte is lost": body bytes queued before the engine resets the stream (an origin cut mid-body)
    /// reach the client before the RST_STREAM. nghttp2 sends a reset ahead of the stream's queued DATA and drops
    /// that DATA, so the reset used to overtake them: the client lost the end of what the origin had sent.
    @Test("A reset behind queued body bytes: the bytes go out first, then RST_STREAM with the code")
    func resetBehindQueuedBodySendsTheBytesFirst() throws {
        let link = try Link()
        let id = link.client.request()
        let body = Self.bytes(100_000, seed: 5)
        try link.pump { event in
            guard case .request(let stream, _, _) = event else { return }
            try link.server.sendResponseHead(stream, status: 200, fields: [], endStream: false)
            try body.withUnsafeBytes { _ = try link.server.sendResponseBody(stream, $0) }
            try link.server.resetStream(stream, code: .internalError)
        }
        try link.pump()
        #expect(link.client.responses[id]?.body == body, "\(link.client.responses[id]?.body.count ?? 0) of 100000")
        #expect(link.client.responses[id]?.resetByServer == HTTP2ErrorCode.internalError.rawValue)
        #expect(link.events.contains(.streamClosed(id, .resetByProxy(.internalError))))
    }

    @Test("Drain: GOAWAY with the last stream id, open streams finish, then the session is done")
    func drain() throws {
        let link = try Link()
        let first = link.client.request()
        let second = link.client.request()
        try link.pump()
        link.server.announceShutdown()
        try link.pump()
        #expect(link.client.goaway?.lastStreamID == Int32.max)
        link.server.drain()
        try link.pump()
        #expect(link.client.goaway?.lastStreamID == second)
        #expect(link.client.goaway?.code == 0)
        #expect(link.server.wantsRead)
        for id in [first, second] {
            try link.server.sendResponseHead(id, status: 204, fields: [], endStream: true)
        }
        try link.pump()
        #expect(link.client.responses[first]?.statuses == [204] && link.client.responses[second]?.statuses == [204])
        #expect(!link.server.wantsRead && !link.server.wantsWrite)
    }

    @Test("Fields the proxy would send are held to the rules it receives by (translation is strict both ways)")
    func outgoingFieldsChecked() throws {
        let link = try Link()
        let id = link.client.request()
        try link.pump()
        for bad in [HTTPField(name: "Content-Type", value: "a"), HTTPField(name: "transfer-encoding", value: "chunked"),
                    HTTPField(name: "connection", value: "close"), HTTPField(name: "x", value: "a\r\nb"),
                    HTTPField(name: ":status", value: "200"), HTTPField(name: "x", value: " padded")] {
            #expect(throws: HTTP2SessionError.self) {
                try link.server.sendResponseHead(id, status: 200, fields: [bad], endStream: true)
            }
        }
        try link.server.sendResponseHead(id, status: 200, fields: [], endStream: true)
        try link.pump()
        #expect(link.client.responses[id]?.statuses == [200])
    }
}
