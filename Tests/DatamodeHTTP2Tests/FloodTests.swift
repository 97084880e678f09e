import DatamodeHTTP
import DatamodeHTTP2
import Testing

/// SPEC §17 "Limits", one test per attack: each ends with the reason the engine counts and the GOAWAY the
/// client sees, and fails when its protection is removed (see the README's HTTP/2 section for which was tried).
@Suite("HTTP/2 limits and floods")
struct FloodTests {
    static func limitError(_ peer: RawPeer) -> HTTP2LimitReason? {
        if case .limit(let reason)? = peer.connectionErrors.first?.cause { return reason }
        return nil
    }

    @Test("CVE-2023-44487 rapid reset: streams opened and reset faster than they complete end the connection")
    func rapidReset() throws {
        let peer = try RawPeer()
        var id: Int32 = 1
        // Ten streams per read, each HEADERS then RST_STREAM(CANCEL) at once, as the attack tools send them.
        for _ in 0..<100 where peer.goaway == nil {
            var bytes: [UInt8] = []
            for _ in 0..<10 {
                bytes += Wire.headersFrame(id, Wire.requestBlock()) + Wire.rstFrame(id, .cancel)
                id += 2
            }
            peer.send(bytes)
        }
        #expect(Self.limitError(peer) == .rapidReset)
        #expect(peer.goaway?.errorCode == .enhanceYourCalm)
        // The default budget is 100 resets: the engine saw little more before the connection ended.
        #expect(peer.requests.count <= 110)
        // Requests surfaced in the same read as their reset come with it, so the engine can skip them.
        let closed = Set(peer.events.compactMap { if case .streamClosed(let s, .resetByClient(.cancel)) = $0 { s } else { nil } })
        #expect(peer.requests.allSatisfy { closed.contains($0.0) })
    }

    @Test("A client that completes streams as often as it cancels them is never cut")
    func cancelsBalancedByCompletions() throws {
        let peer = try RawPeer()
        var id: Int32 = 1
        for _ in 0..<500 {
            peer.send(Wire.headersFrame(id, Wire.requestBlock()) + Wire.rstFrame(id, .cancel))
            peer.send(Wire.headersFrame(id + 2, Wire.requestBlock()))
            try peer.server.sendResponseHead(id + 2, status: 204, fields: [], endStream: true)
            peer.flush()
            id += 4
        }
        #expect(peer.connectionErrors.isEmpty && peer.goaway == nil)
        #expect(peer.requests.count == 1000)
    }

    @Test("CVE-2024-27316 CONTINUATION flood: a header block that never ends is cut at the CONTINUATION limit")
    func continuationFlood() throws {
        let peer = try RawPeer()
        var bytes = Wire.headersFrame(1, Wire.requestBlock(), endStream: true, endHeaders: false)
        for _ in 0..<10_000 { bytes += Wire.continuationFrame(1, [], endHeaders: false) }
        peer.send(bytes)
        #expect(Self.limitError(peer) == .continuationFlood)
        #expect(peer.goaway?.errorCode == .enhanceYourCalm)
        #expect(peer.requests.isEmpty)
    }

    @Test("The CONTINUATION limit is exact: 8 after HEADERS pass, the 9th ends the connection")
    func continuationLimitIsExact() throws {
        func block(continuations: Int) -> [UInt8] {
            var bytes = Wire.headersFrame(1, Wire.requestBlock(), endStream: true, endHeaders: false)
            for i in 0..<continuations { bytes += Wire.continuationFrame(1, [], endHeaders: i == continuations - 1) }
            return bytes
        }
        let within = try RawPeer()
        within.send(block(continuations: 8))
        #expect(within.requests.map(\.0) == [1] && within.connectionErrors.isEmpty)
        let beyond = try RawPeer()
        beyond.send(block(continuations: 9))
        #expect(Self.limitError(beyond) == .continuationFlood)
        #expect(beyond.goaway?.errorCode == .enhanceYourCalm)
    }

    @Test("A header block in HEADERS and three CONTINUATIONs is a request")
    func continuationsWithinTheLimit() throws {
        let peer = try RawPeer()
        let block = Wire.requestBlock([("x-large", String(repeating: "a", count: 50_000))])
        var frames = Wire.headersFrame(1, Array(block[0..<16_000]), endStream: true, endHeaders: false)
        frames += Wire.continuationFrame(1, Array(block[16_000..<32_000]), endHeaders: false)
        frames += Wire.continuationFrame(1, Array(block[32_000..<48_000]), endHeaders: false)
        frames += Wire.continuationFrame(1, Array(block[48_000...]), endHeaders: true)
        peer.send(frames)
        #expect(peer.requests.first?.1.fields.first?.value.utf8.count == 50_000)
        #expect(peer.connectionErrors.isEmpty)
    }

    @Test("HPACK bomb: references to one large table entry decode to megabytes; the connection ends")
    func hpackBomb() throws {
        let peer = try RawPeer()
        // One 4,000-byte entry into the dynamic table (index 62), then 4,000 one-byte references to it: an 8 KiB
        // block that decodes to 16 MB.
        var block = Wire.requestBlock()
        block += HPACK.literalIndexed(Array("x-bomb".utf8), Array(repeating: 0x61, count: 4000))
        for _ in 0..<4000 { block += HPACK.indexed(62) }
        peer.send(Wire.headersFrame(1, block))
        #expect(Self.limitError(peer) == .hpackBomb)
        #expect(peer.goaway?.errorCode == .enhanceYourCalm)
        #expect(peer.requests.isEmpty)
    }

    @Test("A header section over the limit (not a bomb) is answered 431 on its stream; the connection carries on")
    func headerSectionTooLarge() throws {
        let peer = try RawPeer()
        let block = Wire.requestBlock((0..<70).map { ("x-field-\($0)", String(repeating: "b", count: 1000)) })
        var frames: [UInt8] = []
        var offset = 0
        while offset < block.count {
            let end = min(offset + 16_384, block.count)
            let piece = Array(block[offset..<end])
            frames += offset == 0 ? Wire.headersFrame(1, piece, endStream: true, endHeaders: end == block.count)
                : Wire.continuationFrame(1, piece, endHeaders: end == block.count)
            offset = end
        }
        peer.send(frames)
        #expect(peer.requests.isEmpty)
        #expect(peer.refusals.map(\.0) == [1] && peer.refusals.first?.1 == .headerSectionTooLarge)
        #expect(peer.events.contains(.limitExceeded(.headerTooLarge)))
        try peer.server.sendResponseHead(1, status: 431, fields: [HTTPField(name: "content-type", value: "application/problem+json")],
                                         endStream: true)
        peer.flush()
        #expect(peer.frames.contains { $0.type == Wire.headers && $0.stream == 1 && $0.flags & Wire.endStream != 0 })
        #expect(peer.events.contains(.streamClosed(1, .completed)))
        peer.send(Wire.headersFrame(3, Wire.requestBlock()))
        #expect(peer.requests.map(\.0) == [3])
        #expect(peer.connectionErrors.isEmpty)
    }

    @Test("A refused request's body is discarded; after the 431, RST_STREAM(NO_ERROR) only if the body is still coming")
    func refusedRequestBody() throws {
        let limits = HTTPLimits(requestLine: 8192, headerSection: 256, headerCount: 100)
        let large = Wire.requestBlock(method: "POST", [("x-large", String(repeating: "c", count: 300))])
        for bodyEnds in [false, true] {
            let peer = try RawPeer(HTTP2ServerConfiguration(headerLimits: limits))
            peer.send(Wire.headersFrame(1, large, endStream: false) + Wire.dataFrame(1, Array("abc".utf8), endStream: bodyEnds))
            #expect(peer.refusals.first?.1 == .headerSectionTooLarge)
            #expect(!peer.events.contains { if case .requestBody = $0 { true } else { false } })
            try peer.server.sendResponseHead(1, status: 431, fields: [], endStream: true)
            peer.flush()
            #expect(peer.rstCode(1) == (bodyEnds ? nil : .noError), "body ends: \(bodyEnds)")
            #expect(peer.events.contains(.streamClosed(1, .completed)))
        }
    }

    @Test("SETTINGS flood (CVE-2019-9515): SETTINGS faster than the budget, even when every ACK is read")
    func settingsFlood() throws {
        let peer = try RawPeer()
        for _ in 0..<100 where peer.goaway == nil {
            peer.send(Array((0..<10).map { _ in Wire.settingsFrame([(0x3, 100)]) }.joined()))
        }
        #expect(Self.limitError(peer) == .settingsFlood)
        #expect(peer.goaway?.errorCode == .enhanceYourCalm)
    }

    @Test("PING flood (CVE-2019-9512): PINGs faster than the budget, even when every ACK is read")
    func pingFlood() throws {
        let peer = try RawPeer()
        var n: UInt64 = 0
        for _ in 0..<100 where peer.goaway == nil {
            peer.send(Array((0..<10).map { _ in n += 1; return Wire.pingFrame(n) }.joined()))
        }
        #expect(Self.limitError(peer) == .pingFlood)
        #expect(peer.goaway?.errorCode == .enhanceYourCalm)
    }

    @Test("PINGs within the budget, refilled over time, are answered")
    func pingsOverTime() throws {
        let peer = try RawPeer()
        for n in 0..<200 {
            peer.send(Wire.pingFrame(UInt64(n)))
            peer.clock.advance(seconds: 0.25)
        }
        #expect(peer.connectionErrors.isEmpty)
        #expect(peer.frames.filter { $0.type == Wire.ping && $0.flags & Wire.ack != 0 }.count == 200)
    }

    @Test("Empty DATA frames (CVE-2019-9518): DATA without data or END_STREAM, faster than the budget")
    func emptyFrames() throws {
        let peer = try RawPeer()
        peer.send(Wire.headersFrame(1, Wire.requestBlock(method: "POST"), endStream: false))
        for _ in 0..<100 where peer.goaway == nil {
            peer.send(Array((0..<10).map { _ in Wire.dataFrame(1, []) }.joined()))
        }
        #expect(Self.limitError(peer) == .emptyFrames)
        #expect(peer.goaway?.errorCode == .enhanceYourCalm)
    }

    @Test("Control answers queued faster than the client reads them: nghttp2's outbound flood limit, with a GOAWAY")
    func outboundFlood() throws {
        // The ping budget out of the way, so that nghttp2's own limit (1,000 queued answers) is what trips.
        let floods = HTTP2FloodLimits(pings: HTTP2RateLimit(burst: 100_000, perSecond: 0))
        let peer = try RawPeer(HTTP2ServerConfiguration(floods: floods))
        peer.send(Array((0..<5000).map { Wire.pingFrame(UInt64($0)) }.joined()), flush: false)
        peer.flush()
        #expect(Self.limitError(peer) == .outboundFlood)
        #expect(peer.frames.last?.type == Wire.goaway && peer.frames.last?.errorCode == .enhanceYourCalm)
        #expect(!peer.server.wantsRead && !peer.server.wantsWrite)
    }

    @Test("More streams than SETTINGS_MAX_CONCURRENT_STREAMS before the ACK: REFUSED_STREAM, others go on")
    func tooManyStreamsBeforeAck() throws {
        let peer = try RawPeer(HTTP2ServerConfiguration(maxConcurrentStreams: 10))
        peer.send(Array((0..<11).map { Wire.headersFrame(Int32(2 * $0 + 1), Wire.requestBlock(), endStream: false) }.joined()))
        #expect(peer.requests.count == 10)
        #expect(peer.rstCode(21) == .refusedStream)
        #expect(peer.refusals.map(\.0) == [21] && peer.refusals.first?.1 == .tooManyStreams)
        #expect(peer.events.contains(.limitExceeded(.tooManyStreams)))
        #expect(peer.connectionErrors.isEmpty && peer.goaway == nil)
    }

    @Test("More streams than an acknowledged SETTINGS_MAX_CONCURRENT_STREAMS: a connection error (RFC 9113 §5.1.2)")
    func tooManyStreamsAfterAck() throws {
        let peer = try RawPeer(HTTP2ServerConfiguration(maxConcurrentStreams: 10))
        peer.send(Wire.settingsAck)
        peer.send(Array((0..<11).map { Wire.headersFrame(Int32(2 * $0 + 1), Wire.requestBlock(), endStream: false) }.joined()))
        #expect(peer.requests.count == 10)
        #expect(Self.limitError(peer) == .tooManyStreams)
        #expect(peer.goaway?.errorCode == .protocolError)
        #expect(peer.goaway?.lastStreamID == 19)
    }

    @Test("A client that does not speak HTTP/2: a protocol violation, no GOAWAY (RFC 9113 §3.4)")
    func badPreface() throws {
        let peer = try RawPeer(start: Array("GET / HTTP/1.1\r\nHost: a\r\n\r\n".utf8))
        #expect(peer.connectionErrors.first?.cause == .protocolViolation)
        #expect(!peer.frames.contains { $0.type == Wire.goaway })
        #expect(!peer.server.wantsRead)
    }
}
