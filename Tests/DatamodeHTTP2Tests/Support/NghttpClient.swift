/// A real HTTP/2 client, nghttp2's own client session, wired to the server session in memory: the happy paths
/// are checked against an independent, complete implementation, not against frames the test wrote.
import CNghttp2
import DatamodeHTTP
import DatamodeHTTP2

final class NghttpClient {
    struct Response {
        /// Every `:status` received, 1xx included, in order.
        var statuses: [Int] = []
        /// Fields of each header section (1xx, final, trailers), in order, pseudo-headers included.
        var sections: [[(String, String)]] = [[]]
        var body: [UInt8] = []
        var closed: UInt32?
        var resetByServer: UInt32?

        var finalFields: [(String, String)] { sections.count > statuses.count ? [] : sections[statuses.count - 1] }
        var trailers: [(String, String)] { sections.count > statuses.count ? sections[statuses.count] : [] }
    }

    /// A request body the client sends as its window allows; `pauseAt` stops it there (DEFERRED) until resumed.
    struct OutgoingBody {
        var bytes: [UInt8]
        var offset = 0
        var trailers: [(String, String)] = []
        var pauseAt: Int?
    }

    var session: OpaquePointer!
    var responses: [Int32: Response] = [:]
    var bodies: [Int32: OutgoingBody] = [:]
    var goaway: (lastStreamID: Int32, code: UInt32)?

    /// `window`: the client's SETTINGS_INITIAL_WINDOW_SIZE (how fast the server may send response bodies).
    init(window: UInt32 = 65_535) {
        var callbacks: OpaquePointer?
        nghttp2_session_callbacks_new(&callbacks)
        defer { nghttp2_session_callbacks_del(callbacks) }
        nghttp2_session_callbacks_set_on_header_callback(callbacks) { _, frame, name, nameLength, value, valueLength, _, user in
            let client = NghttpClient.from(user)
            let id = frame!.pointee.hd.stream_id
            let n = String(decoding: UnsafeRawBufferPointer(start: name, count: nameLength), as: UTF8.self)
            let v = String(decoding: UnsafeRawBufferPointer(start: value, count: valueLength), as: UTF8.self)
            if n == ":status" { client.responses[id, default: Response()].statuses.append(Int(v)!) }
            let count = client.responses[id, default: Response()].sections.count
            client.responses[id, default: Response()].sections[count - 1].append((n, v))
            return 0
        }
        nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks) { _, frame, user in
            let client = NghttpClient.from(user)
            let hd = frame!.pointee.hd
            if hd.type == UInt8(NGHTTP2_HEADERS.rawValue) {
                client.responses[hd.stream_id, default: Response()].sections.append([])
            } else if hd.type == UInt8(NGHTTP2_RST_STREAM.rawValue) {
                client.responses[hd.stream_id, default: Response()].resetByServer = frame!.pointee.rst_stream.error_code
            } else if hd.type == UInt8(NGHTTP2_GOAWAY.rawValue) {
                client.goaway = (frame!.pointee.goaway.last_stream_id, frame!.pointee.goaway.error_code)
            }
            return 0
        }
        nghttp2_session_callbacks_set_on_data_chunk_recv_callback(callbacks) { _, _, id, data, length, user in
            NghttpClient.from(user).responses[id, default: Response()].body
                .append(contentsOf: UnsafeRawBufferPointer(start: data, count: length))
            return 0
        }
        nghttp2_session_callbacks_set_on_stream_close_callback(callbacks) { _, id, code, user in
            NghttpClient.from(user).responses[id, default: Response()].closed = code
            return 0
        }
        var created: OpaquePointer?
        nghttp2_session_client_new(&created, callbacks, Unmanaged.passUnretained(self).toOpaque())
        session = created
        var settings = [nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE.rawValue),
                                               value: window)]
        nghttp2_submit_settings(session, 0, &settings, 1)
    }

    deinit { nghttp2_session_del(session) }

    static func from(_ user: UnsafeMutableRawPointer?) -> NghttpClient {
        Unmanaged<NghttpClient>.fromOpaque(user!).takeUnretainedValue()
    }

    /// Submits a request; `body` nil sends END_STREAM on HEADERS.
    @discardableResult
    func request(method: String = "GET", path: String = "/", authority: String = "example.com", scheme: String = "https",
                 _ fields: [(String, String)] = [], body: OutgoingBody? = nil) -> Int32 {
        let pairs = [(":method", method), (":scheme", scheme), (":authority", authority), (":path", path)] + fields
        var provider = nghttp2_data_provider()
        provider.read_callback = { _, id, buffer, length, flags, _, user in
            let client = NghttpClient.from(user)
            guard var body = client.bodies[id] else { return Int(NGHTTP2_ERR_CALLBACK_FAILURE.rawValue) }
            let end = min(body.bytes.count, body.pauseAt ?? Int.max)
            let n = min(length, end - body.offset)
            if n == 0 && body.offset < body.bytes.count { return Int(NGHTTP2_ERR_DEFERRED.rawValue) }
            body.bytes.withUnsafeBytes { buffer!.update(from: $0.baseAddress!.assumingMemoryBound(to: UInt8.self) + body.offset, count: n) }
            body.offset += n
            client.bodies[id] = body
            if body.offset == body.bytes.count {
                flags!.pointee |= NGHTTP2_DATA_FLAG_EOF.rawValue
                if !body.trailers.isEmpty {
                    flags!.pointee |= NGHTTP2_DATA_FLAG_NO_END_STREAM.rawValue
                    _ = NghttpClient.withNV(body.trailers) { nghttp2_submit_trailer(client.session, id, $0, $1) }
                }
            }
            return n
        }
        let id = NghttpClient.withNV(pairs) { list, count in
            body == nil ? nghttp2_submit_request(session, nil, list, count, nil, nil)
                : nghttp2_submit_request(session, nil, list, count, &provider, nil)
        }
        precondition(id > 0, "nghttp2_submit_request: \(id)")
        if let body { bodies[id] = body }
        return id
    }

    /// Lets a paused body go on to its end.
    func resume(_ id: Int32) {
        bodies[id]?.pauseAt = nil
        nghttp2_session_resume_data(session, id)
    }

    func reset(_ id: Int32, _ code: HTTP2ErrorCode) {
        nghttp2_submit_rst_stream(session, 0, id, code.rawValue)
    }

    /// Everything the client has to send.
    func output() -> [UInt8] {
        var out: [UInt8] = []
        while true {
            var chunk: UnsafePointer<UInt8>?
            let n = nghttp2_session_mem_send(session, &chunk)
            precondition(n >= 0, "client mem_send \(n)")
            if n == 0 { break }
            out += UnsafeBufferPointer(start: chunk, count: n)
        }
        return out
    }

    func input(_ bytes: [UInt8]) {
        let n = bytes.withUnsafeBufferPointer { nghttp2_session_mem_recv(session, $0.baseAddress, $0.count) }
        precondition(n == bytes.count, "client mem_recv \(n)")
    }

    static func withNV<R>(_ pairs: [(String, String)], _ body: (UnsafePointer<nghttp2_nv>, Int) -> R) -> R {
        var storage: [[UInt8]] = pairs.flatMap { [Array($0.0.utf8) + [0], Array($0.1.utf8) + [0]] }
        return storage.withUnsafeMutableBufferPointer { arrays in
            var list: [nghttp2_nv] = []
            func go(_ i: Int) -> R {
                if i == pairs.count { return list.withUnsafeBufferPointer { body($0.baseAddress!, $0.count) } }
                return arrays[2 * i].withUnsafeMutableBufferPointer { name in
                    arrays[2 * i + 1].withUnsafeMutableBufferPointer { value in
                        list.append(nghttp2_nv(name: name.baseAddress!, value: value.baseAddress!, namelen: name.count - 1,
                                               valuelen: value.count - 1, flags: 0))
                        return go(i + 1)
                    }
                }
            }
            return go(0)
        }
    }
}

/// The client and the server session, with the bytes between them moved in memory, and the server's events
/// handed to `engine`, the test's stand-in for the engine.
final class Link {
    let client: NghttpClient
    let server: HTTP2ServerSession
    let clock = TestClock()
    var events: [HTTP2ServerEvent] = []
    /// Bytes the server wrote, in order.
    var serverBytes = 0

    init(_ configuration: HTTP2ServerConfiguration = HTTP2ServerConfiguration(), clientWindow: UInt32 = 65_535) throws {
        client = NghttpClient(window: clientWindow)
        let clock = clock
        server = try HTTP2ServerSession(configuration: configuration, now: { clock.nanoseconds })
        // Both SETTINGS and their ACKs first, so that every test runs under the server's windows and limits.
        try pump()
    }

    /// Moves bytes both ways until neither side has anything to say; `engine` sees every server event as it comes
    /// and may call the server (respond, consume) from it; `afterRound` runs once per round (the engine's slow
    /// upstream) and says whether it still has work.
    func pump(maxRounds: Int = 1_000_000, engine: (HTTP2ServerEvent) throws -> Void = { _ in },
              afterRound: () throws -> Bool = { false }) throws {
        for _ in 0..<maxRounds {
            let toServer = client.output()
            var batch = toServer.withUnsafeBytes { server.receive($0) }
            for event in batch { events.append(event); try engine(event) }
            var toClient: [UInt8] = []
            batch = server.writeOutput { toClient += $0 }
            for event in batch { events.append(event); try engine(event) }
            let busy = try afterRound()
            serverBytes += toClient.count
            if !toClient.isEmpty { client.input(toClient) }
            if toServer.isEmpty && toClient.isEmpty && !server.wantsWrite && !busy { return }
        }
        Issue.record("the link never went quiet")
    }
}

import Testing
