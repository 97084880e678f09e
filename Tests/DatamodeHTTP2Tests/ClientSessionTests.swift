import CNghttp2
import DatamodeHTTP
import DatamodeTestSupport
@testable import DatamodeHTTP2
import Testing

/// `HTTP2ClientSession` (the origin side's codec, SPEC §17) against the proxy's own server session in memory, and
/// against hand-made frames for what a server library would never send.
@Suite struct ClientSessionTests {
    /// Moves bytes both ways until nothing flows; returns the client's and the server's events.
    static func pump(_ client: HTTP2ClientSession, _ server: HTTP2ServerSession,
                     onServer: (HTTP2ServerEvent) -> Void = { _ in },
                     onClient: (HTTP2ClientEvent) -> Void = { _ in }) -> ([HTTP2ClientEvent], [HTTP2ServerEvent]) {
        var clientEvents: [HTTP2ClientEvent] = []
        var serverEvents: [HTTP2ServerEvent] = []
        for _ in 0..<10_000 {
            var toServer: [UInt8] = []
            for e in client.writeOutput({ toServer.append(contentsOf: $0) }) { clientEvents.append(e); onClient(e) }
            for e in toServer.withUnsafeBytes({ server.receive($0) }) { serverEvents.append(e); onServer(e) }
            var toClient: [UInt8] = []
            for e in server.writeOutput({ toClient.append(contentsOf: $0) }) { serverEvents.append(e); onServer(e) }
            for e in toClient.withUnsafeBytes({ client.receive($0) }) { clientEvents.append(e); onClient(e) }
            if toServer.isEmpty && toClient.isEmpty && !client.wantsWrite && !server.wantsWrite { break }
        }
        return (clientEvents, serverEvents)
    }

    @Test func aGetRoundTripsWithA103AndTrailers() throws {
        let client = try HTTP2ClientSession()
        let server = try HTTP2ServerSession()
        let id = try client.startRequest(method: "GET", scheme: "https", authority: "example.com", path: "/a?b=1",
                                         fields: [HTTPField(name: "accept", value: "*/*")], endStream: true)
        var requestSeen: HTTP2Request?
        let (events, _) = Self.pump(client, server, onServer: { event in
            guard case .request(let sid, let request, endStream: true) = event else { return }
            requestSeen = request
            try? server.sendInformational(sid, status: 103, fields: [HTTPField(name: "link", value: "</s.css>; rel=preload")])
            try? server.sendResponseHead(sid, status: 200, fields: [HTTPField(name: "content-type", value: "text/plain")],
                                         endStream: false)
            _ = Array("hello".utf8).withUnsafeBytes { try? server.sendResponseBody(sid, $0) }
            try? server.finishResponse(sid, trailers: [HTTPField(name: "x-checksum", value: "abc")])
        })
        #expect(requestSeen?.path == "/a?b=1" && requestSeen?.authority == "example.com")
        #expect(requestSeen?.fields.contains(HTTPField(name: "accept", value: "*/*")) == true)
        #expect(events.contains(.informational(id, status: 103, fields: [HTTPField(name: "link", value: "</s.css>; rel=preload")])))
        #expect(events.contains(.response(id, status: 200, fields: [HTTPField(name: "content-type", value: "text/plain")],
                                          endStream: false)))
        let body = events.flatMap { event -> [UInt8] in if case .responseBody(id, let bytes) = event { bytes } else { [] } }
        #expect(body == Array("hello".utf8))
        #expect(events.contains(.responseEnd(id, trailers: [HTTPField(name: "x-checksum", value: "abc")])))
        #expect(events.contains(.streamClosed(id, .completed)))
        #expect(client.openStreams == 0)
    }

    /// What an HTTP/2 client connection's bound on held request bytes reads from this codec (`HTTP2Session`
    /// `.settleConnectionWindow`): how much of a request body is still queued, whether the origin's windows let more
    /// go, and the events that say either changed (DATA sent; a WINDOW_UPDATE, a SETTINGS).
    @Test func queuedRequestBytesAndTheOriginsWindowsAreReported() throws {
        let client = try HTTP2ClientSession()
        let server = try HTTP2ServerSession(configuration: HTTP2ServerConfiguration(initialWindowSize: 65_536,
                                                                                     connectionWindowSize: 65_536))
        let id = try client.startRequest(method: "POST", scheme: "https", authority: "example.com", path: "/up",
                                         fields: [], endStream: false)
        _ = [UInt8](repeating: 7, count: 100_000).withUnsafeBytes { try? client.sendRequestBody(id, $0) }
        #expect(client.bufferedRequestBytes(id) == 100_000)
        var serverStream: HTTP2StreamID = 0
        var received = 0
        let (first, _) = Self.pump(client, server, onServer: { event in
            guard case .requestBody(let sid, let bytes) = event else { return }
            serverStream = sid
            received += bytes.count
        })
        // The server consumed nothing: the origin's windows are shut, the rest waits in the queue.
        #expect(received > 60_000 && received < 100_000)
        #expect(client.bufferedRequestBytes(id) == 100_000 - received)
        #expect(!client.requestWindowOpen(id))
        #expect(first.contains(.requestBodySent(id)) && first.contains(.sendWindowOpened(0)))
        server.consumeRequestBody(serverStream, count: received)
        let (second, _) = Self.pump(client, server)
        #expect(second.contains(.sendWindowOpened(0)) && second.contains(.sendWindowOpened(id)))
        #expect(second.contains(.requestBodySent(id)))
        #expect(client.bufferedRequestBytes(id) == 0 && client.requestWindowOpen(id))
    }

    /// Three megabytes each way through 64 KiB windows that reopen only as each side consumes: byte-exact, and the
    /// request queue says stop and go (flow control is backpressure).
    @Test func largeBodiesEachWayAreByteExactUnderFlowControl() throws {
        let client = try HTTP2ClientSession(configuration: HTTP2ClientConfiguration(initialWindowSize: 65_535))
        let server = try HTTP2ServerSession(configuration: HTTP2ServerConfiguration(initialWindowSize: 65_535))
        let upload = (0..<3_000_000).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ $0 >> 11) }
        let id = try client.startRequest(method: "POST", scheme: "https", authority: "example.com", path: "/up",
                                         fields: [], endStream: false)
        var sent = 0
        var stopped = 0
        func feed() {
            while sent < upload.count {
                let n = min(50_000, upload.count - sent)
                let more = upload[sent..<(sent + n)].withUnsafeBytes { (try? client.sendRequestBody(id, $0)) ?? false }
                sent += n
                if !more { stopped += 1; return }
            }
            try? client.finishRequest(id)
        }
        feed()
        var received: [UInt8] = []
        var downloaded: [UInt8] = []
        let download = (0..<3_000_000).map { UInt8(truncatingIfNeeded: $0 &* 13) }
        var served = 0
        var serverStream: HTTP2StreamID = 0
        func serve() {
            while served < download.count {
                let n = min(40_000, download.count - served)
                let more = download[served..<(served + n)].withUnsafeBytes { (try? server.sendResponseBody(serverStream, $0)) ?? false }
                served += n
                if !more { return }
            }
            try? server.finishResponse(serverStream)
        }
        let (events, _) = Self.pump(client, server, onServer: { event in
            switch event {
            case .requestBody(let sid, let bytes):
                received += bytes
                server.consumeRequestBody(sid, count: bytes.count)
            case .requestEnd(let sid, _):
                serverStream = sid
                try? server.sendResponseHead(sid, status: 200, fields: [], endStream: false)
                serve()
            case .responseBodyDrained:
                serve()
            default:
                break
            }
        }, onClient: { event in
            switch event {
            case .requestBodyDrained: feed()
            case .responseBody(let sid, let bytes):
                downloaded += bytes
                client.consumeResponseBody(sid, count: bytes.count)
            default: break
            }
        })
        #expect(received == upload)
        #expect(downloaded == download)
        #expect(stopped > 0, "the request queue said stop at its watermark")
        #expect(events.contains(.streamClosed(id, .completed)))
    }

    static let inPlaceSeed = SeededGenerator.seed(from: "DATAMODE_H2_IN_PLACE_SEED")

    /// `receive(_:bodyInPlace: true)`, what the engine's origin sessions read with (`HTTP2OriginSession.wireReadable`),
    /// reports the same events as the copying `receive`, each body a range of the bytes read that holds exactly what
    /// the copy would carry: the same origin bytes, cut into the same random pieces, go to two codecs that made the
    /// same requests, and a round of random answers (empty, one byte, within and across frames, trailers or not)
    /// comes out equal, piece by piece.
    @Test func bodiesTakenInPlaceAreWhatTheCopyWouldCarry() throws {
        print("DATAMODE_H2_IN_PLACE_SEED=\(Self.inPlaceSeed)")
        var rng = SeededGenerator(seed: Self.inPlaceSeed)
        for round in 0..<40 {
            let copying = try HTTP2ClientSession()
            let inPlace = try HTTP2ClientSession()
            let server = try HTTP2ServerSession()
            var ids: [HTTP2StreamID] = []
            for n in 0..<Int.random(in: 1...4, using: &rng) {
                let id = try copying.startRequest(method: "GET", scheme: "https", authority: "a", path: "/\(n)", fields: [],
                                                  endStream: true)
                #expect(try inPlace.startRequest(method: "GET", scheme: "https", authority: "a", path: "/\(n)", fields: [],
                                                 endStream: true) == id)
                ids.append(id)
            }
            // Both codecs wrote the same requests; the server reads one copy and answers into `toClient`.
            var toServer: [UInt8] = []
            _ = copying.writeOutput { toServer.append(contentsOf: $0) }
            _ = inPlace.writeOutput { _ in }
            let requests = toServer.withUnsafeBytes { server.receive($0) }
            for case .request(let sid, _, endStream: true) in requests {
                let size = [0, 1, 16_383, 16_385, Int.random(in: 0...60_000, using: &rng)].randomElement(using: &rng)!
                try server.sendResponseHead(sid, status: 200, fields: [], endStream: false)
                let body = (0..<size).map { _ in UInt8.random(in: 0...255, using: &rng) }
                _ = try body.withUnsafeBytes { try server.sendResponseBody(sid, $0) }
                try server.finishResponse(sid, trailers: Bool.random(using: &rng) ? [HTTPField(name: "x-sum", value: "1")] : [])
            }
            var toClient: [UInt8] = []
            for _ in 0..<64 where server.wantsWrite { _ = server.writeOutput { toClient.append(contentsOf: $0) } }
            var offset = 0
            while offset < toClient.count {
                let end = min(toClient.count, offset + Int.random(in: 1...20_000, using: &rng))
                let expected = toClient[offset..<end].withUnsafeBytes { copying.receive($0) }
                let got = toClient[offset..<end].withUnsafeBytes { bytes in
                    inPlace.receive(bytes, bodyInPlace: true).map { event -> HTTP2ClientEvent in
                        guard case .responseBodyAt(let id, let range) = event else { return event }
                        return .responseBody(id, Array(bytes[range]))
                    }
                }
                // Told apart by a short account, not the bodies (they run to 60 KB).
                let same = got == expected
                #expect(same, "round \(round), bytes \(offset)..<\(end): \(Self.account(got)) against \(Self.account(expected))")
                for case .responseBody(let id, let bytes) in expected {
                    copying.consumeResponseBody(id, count: bytes.count)
                    inPlace.consumeResponseBody(id, count: bytes.count)
                }
                offset = end
            }
            #expect(!ids.isEmpty && copying.openStreams == 0 && inPlace.openStreams == 0, "round \(round): streams left open")
        }
    }

    /// Events as a line each, a body as its stream, length and a checksum.
    static func account(_ events: [HTTP2ClientEvent]) -> String {
        events.map { event in
            guard case .responseBody(let id, let bytes) = event else { return "\(event)" }
            return "body(\(id), \(bytes.count) bytes, sum \(bytes.reduce(0) { ($0 &* 31) &+ Int($1) }))"
        }.joined(separator: "; ")
    }

    /// An origin's connection is shared by the exchanges of different clients: an answer nobody reads yet holds its
    /// own stream's window, never the connection's, so another stream's answer still arrives whole. (Session 18: the
    /// connection window went back only as streams consumed, and one stalled download held a 1 KB answer on the same
    /// connection for as long as its client read nothing.)
    @Test func anUnreadAnswerHoldsItsOwnStreamOnly() throws {
        let client = try HTTP2ClientSession(configuration: HTTP2ClientConfiguration(initialWindowSize: 65_536))
        let server = try HTTP2ServerSession()
        let slow = try client.startRequest(method: "GET", scheme: "https", authority: "a", path: "/slow", fields: [],
                                           endStream: true)
        let fast = try client.startRequest(method: "GET", scheme: "https", authority: "a", path: "/fast", fields: [],
                                           endStream: true)
        let body = (0..<300_000).map { UInt8(truncatingIfNeeded: $0 &* 31) }
        var served: [HTTP2StreamID: Int] = [:]
        func serve(_ sid: HTTP2StreamID) {
            while let done = served[sid], done < body.count {
                let n = min(16_384, body.count - done)
                let more = body[done..<(done + n)].withUnsafeBytes { (try? server.sendResponseBody(sid, $0)) ?? false }
                served[sid] = done + n
                if !more { return }
            }
            try? server.finishResponse(sid)
        }
        var slowBytes = 0
        var fastBody: [UInt8] = []
        let (events, _) = Self.pump(client, server, onServer: { event in
            switch event {
            case .request(let sid, _, endStream: true):
                try? server.sendResponseHead(sid, status: 200, fields: [], endStream: false)
                served[sid] = 0
                serve(sid)
            case .responseBodyDrained(let sid):
                serve(sid)
            default:
                break
            }
        }, onClient: { event in
            guard case .responseBody(let sid, let bytes) = event else { return }
            if sid == slow {
                slowBytes += bytes.count  // never consumed: its client reads nothing
            } else {
                fastBody += bytes
                client.consumeResponseBody(sid, count: bytes.count)
            }
        })
        #expect(fastBody == body, "\(fastBody.count) of \(body.count) bytes of the read answer arrived")
        #expect(events.contains(.streamClosed(fast, .completed)))
        #expect(slowBytes > 0 && slowBytes <= 65_536, "the unread answer kept to its own stream window: \(slowBytes)")
    }

    /// The origin side's squeeze takes back what the origin was granted and did not send yet, on every stream, and
    /// restoring gives it back (`HTTP2OriginSession.settleStreamWindows`).
    @Test func squeezingTakesTheOriginsUnusedGrantsBack() throws {
        let client = try HTTP2ClientSession(configuration: HTTP2ClientConfiguration(initialWindowSize: 1 << 20))
        let server = try HTTP2ServerSession()
        let sent = try client.startRequest(method: "GET", scheme: "https", authority: "a", path: "/sent", fields: [],
                                           endStream: true)
        let idle = try client.startRequest(method: "GET", scheme: "https", authority: "a", path: "/idle", fields: [],
                                           endStream: true)
        let body = [UInt8](repeating: 7, count: 100_000)
        _ = Self.pump(client, server, onServer: { event in
            guard case .request(let sid, _, endStream: true) = event else { return }
            try? server.sendResponseHead(sid, status: 200, fields: [], endStream: false)
            if sid == sent { _ = body.withUnsafeBytes { try? server.sendResponseBody(sid, $0) } }
        })
        #expect(nghttp2_session_get_stream_remote_window_size(server.session, sent) == (1 << 20) - 100_000)
        #expect(client.squeezeStreamWindows())
        #expect(!client.squeezeStreamWindows(), "squeezed once")
        _ = Self.pump(client, server)
        #expect(client.streamWindowsSqueezed)
        #expect(nghttp2_session_get_stream_remote_window_size(server.session, sent) == 0)
        #expect(nghttp2_session_get_stream_remote_window_size(server.session, idle) == 65_535)
        #expect(client.restoreStreamWindows())
        _ = Self.pump(client, server)
        #expect(!client.streamWindowsSqueezed)
        #expect(nghttp2_session_get_stream_remote_window_size(server.session, sent) == (1 << 20) - 100_000)
        #expect(nghttp2_session_get_stream_remote_window_size(server.session, idle) == 1 << 20)
    }

    /// The origin's SETTINGS_MAX_CONCURRENT_STREAMS bounds `canStartStream`; GOAWAY ends it.
    @Test func concurrencyAndGoawayBoundNewStreams() throws {
        let client = try HTTP2ClientSession()
        let server = try HTTP2ServerSession(configuration: HTTP2ServerConfiguration(maxConcurrentStreams: 2))
        let (first, _) = Self.pump(client, server)
        #expect(first.contains(.concurrencyChanged(2)))
        #expect(client.peerMaxConcurrentStreams == 2)
        _ = try client.startRequest(method: "GET", scheme: "https", authority: "a", path: "/1", fields: [], endStream: true)
        _ = try client.startRequest(method: "GET", scheme: "https", authority: "a", path: "/2", fields: [], endStream: true)
        #expect(!client.canStartStream)
        #expect(throws: HTTP2SessionError.connectionClosed) {
            try client.startRequest(method: "GET", scheme: "https", authority: "a", path: "/3", fields: [], endStream: true)
        }
        server.drain()
        let (events, _) = Self.pump(client, server)
        #expect(events.contains { if case .goaway = $0 { true } else { false } })
        #expect(!client.canStartStream)
    }

    /// What a server library never sends, by hand: each is a stream error, never handed on as a response.
    static let malformedBlocks: [(String, [UInt8])] = {
        var rows: [(String, [UInt8])] = []
        rows.append(("connection-specific field", HPACK.block([(":status", "200"), ("connection", "close")])))
        rows.append(("transfer-encoding", HPACK.block([(":status", "200"), ("transfer-encoding", "chunked")])))
        let status200: [UInt8] = HPACK.indexed(8)
        rows.append(("uppercase name", status200 + HPACK.literal(Array("X-Upper".utf8), Array("1".utf8))))
        rows.append(("CR LF in a value", status200 + HPACK.literal(Array("x-a".utf8), Array("a\r\nx-b: 1".utf8))))
        rows.append(("request pseudo-header", HPACK.block([(":status", "200"), (":path", "/")])))
        rows.append(("no :status", HPACK.block([("content-type", "text/plain")])))
        rows.append(("101", HPACK.block([(":status", "101")])))
        return rows
    }()

    @Test(arguments: Self.malformedBlocks)
    func aMalformedResponseIsAStreamError(_ what: String, _ block: [UInt8]) throws {
        let client = try HTTP2ClientSession()
        let id = try client.startRequest(method: "GET", scheme: "https", authority: "a", path: "/", fields: [], endStream: true)
        _ = client.writeOutput { _ in }
        let bytes = Wire.settingsFrame() + Wire.headersFrame(id, block, endStream: false)
        var events = bytes.withUnsafeBytes { client.receive($0) }
        var out: [UInt8] = []
        events += client.writeOutput { out.append(contentsOf: $0) }
        #expect(!events.contains { if case .response = $0 { true } else { false } }, "\(what): \(events)")
        let reset = RawFrame.parse(out).contains { $0.type == Wire.rstStream && $0.stream == id }
        let goaway = RawFrame.parse(out).contains { $0.type == Wire.goaway }
        #expect(reset || goaway, "\(what): the stream is reset (or the connection ends): \(events)")
    }
}
