/// libFuzzer entry point for DatamodeHTTP2. libFuzzer provides `main`; this file has no top-level code.
///
/// Build and run: see README "Fuzzing" (DATAMODE_FUZZ=1 … --product DatamodeHTTP2Fuzz). Each input is what a client
/// sends after a valid preface and SETTINGS, arriving in pieces whose size the first byte picks. An engine stand-in
/// answers every request (1xx, body, trailers) and consumes every body byte, so the send paths run too. Besides
/// "never crash, never read out of bounds" (ASan), each input checks what the engine relies on, by rules written
/// here independently of the codec's own:
/// - every surfaced request passes strict translation (SPEC §17): lowercase token names, none connection-specific,
///   no CR/LF/NUL/controls or surrounding whitespace in values, `https`, an authority without userinfo, an
///   origin-form path, one joined cookie, no host field — and its `requestHead`, written as HTTP/1.1 and parsed back
///   by `HTTP1Parser`, is the same head (what the engine forwards means what was checked);
/// - a stream's body never passes its `content-length`, and meets it at `requestEnd`; trailers carry no pseudo,
///   framing or routing field;
/// - events come in a possible order (no body after the end, no second request on a stream);
/// - the output is whole frames.
/// Inputs whose first byte has its high bit set go to the origin side instead (`OriginSide.swift`). Its next bit
/// (0x40) runs either side with a stream window above 64 KiB that the engine stand-in squeezes and restores between
/// pieces (`squeezeStreamWindows`: SETTINGS changing every stream's window while frames arrive).
import DatamodeHTTP
import DatamodeHTTP2

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> Int32 {
    guard size >= 1 else { return 0 }
    let input = UnsafeBufferPointer(start: data, count: size)
    let piece = Int(input[0] % 64) == 0 ? size : Int(input[0] % 64)
    if input[0] & 0x80 != 0 {
        fuzzOriginSide(input, piece: piece)
        return 0
    }
    var clock: UInt64 = 0
    let squeezing = input[0] & 0x40 != 0
    // Small limits so that short inputs reach every one (a window must be above 64 KiB to be squeezed).
    let configuration = HTTP2ServerConfiguration(
        maxConcurrentStreams: 8, initialWindowSize: squeezing ? 1 << 17 : 4096, connectionWindowSize: squeezing ? 1 << 17 : 8192,
        headerLimits: HTTPLimits(requestLine: 256, headerSection: 1024, headerCount: 16),
        floods: HTTP2FloodLimits(resets: HTTP2RateLimit(burst: 20, perSecond: 1), pings: HTTP2RateLimit(burst: 10, perSecond: 1),
                                 settings: HTTP2RateLimit(burst: 5, perSecond: 1), emptyFrames: HTTP2RateLimit(burst: 10, perSecond: 1),
                                 continuations: 4),
        responseBodyHighWatermark: 512, responseBodyLowWatermark: 128)
    guard let session = try? HTTP2ServerSession(configuration: configuration, now: { clock }) else {
        fatalError("session creation failed")
    }
    var checker = Checker()
    var output: [UInt8] = []
    func drain() {
        for event in session.writeOutput(limit: 4096, { output += $0 }) { checker.check(event, session) }
    }
    let start = Array("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".utf8) + [0, 0, 0, 4, 0, 0, 0, 0, 0]
    for event in start.withUnsafeBytes({ session.receive($0) }) { checker.check(event, session) }
    drain()
    var offset = 1
    while offset < size {
        let end = min(offset + piece, size)
        for event in session.receive(UnsafeRawBufferPointer(UnsafeBufferPointer(rebasing: input[offset..<end]))) { checker.check(event, session) }
        if squeezing { toggleSqueeze(session.squeezeStreamWindows, session.restoreStreamWindows, piece: offset / piece) }
        drain()
        clock += 50_000_000
        offset = end
    }
    for _ in 0..<64 where session.wantsWrite { drain() }
    checkWholeFrames(output)
    return 0
}

/// Squeezes on every third piece and restores on the next (the engine's hysteresis, compressed).
func toggleSqueeze(_ squeeze: () -> Bool, _ restore: () -> Bool, piece: Int) {
    switch piece % 3 {
    case 0: _ = squeeze()
    case 1: _ = restore()
    default: break
    }
}

struct Checker {
    var contentLength: [Int32: UInt64?] = [:]
    var received: [Int32: UInt64] = [:]
    var ended: Set<Int32> = []
    var closed: Set<Int32> = []
    var answered: Set<Int32> = []

    mutating func check(_ event: HTTP2ServerEvent, _ session: HTTP2ServerSession) {
        switch event {
        case .request(let id, let request, let endStream):
            guard contentLength[id] == nil, !closed.contains(id) else { fatalError("second request on stream \(id)") }
            checkRequest(request)
            contentLength[id] = request.contentLength
            received[id] = 0
            if endStream { ended.insert(id) }
            answer(id, session, status: request.path.utf8.count % 2 == 0 ? 200 : 204)
        case .requestBody(let id, let bytes):
            guard contentLength[id] != nil, !ended.contains(id), !closed.contains(id) else {
                fatalError("body for stream \(id) outside its request")
            }
            received[id]! += UInt64(bytes.count)
            if let length = contentLength[id]!, received[id]! > length { fatalError("body past content-length") }
            session.consumeRequestBody(id, count: bytes.count)
        case .requestEnd(let id, let trailers):
            guard contentLength[id] != nil, !ended.contains(id), !closed.contains(id) else {
                fatalError("end of stream \(id) outside its request")
            }
            if let length = contentLength[id]!, received[id]! != length { fatalError("end before content-length") }
            for field in trailers {
                checkField(field)
                if ["content-length", "host"].contains(field.name) { fatalError("forbidden trailer \(field.name)") }
            }
            ended.insert(id)
        case .requestRefused(let id, let refusal):
            guard contentLength[id] == nil else { fatalError("refusal after a request on stream \(id)") }
            if refusal.awaitsResponse { answer(id, session, status: 431) }
        case .streamClosed(let id, _):
            guard !closed.contains(id) else { fatalError("stream \(id) closed twice") }
            closed.insert(id)
        case .responseBodyDrained, .goaway, .connectionError, .limitExceeded:
            break
        }
    }

    /// 103, then a response with a small body and, for 200, trailers: every send path of the codec.
    mutating func answer(_ id: Int32, _ session: HTTP2ServerSession, status: Int) {
        guard answered.insert(id).inserted else { fatalError("asked to answer stream \(id) twice") }
        do {
            // A client may announce a SETTINGS_MAX_HEADER_LIST_SIZE no head fits: the hint is then left out, as the
            // engine leaves it out (`HTTP2Stream.relay`), and the stream reset, as the engine answers a final head
            // the client cannot take (`HTTP2Stream.refusal`).
            if status == 200 {
                do throws(HTTP2SessionError) {
                    try session.sendInformational(id, status: 103, fields: [HTTPField(name: "link", value: "</a>")])
                } catch .headerListTooLarge(_) {
                } catch {
                    throw error
                }
            }
            var refused = false
            do throws(HTTP2SessionError) {
                try session.sendResponseHead(id, status: status, fields: [HTTPField(name: "content-type", value: "text/plain")],
                                             endStream: status == 204)
            } catch .headerListTooLarge(_) {
                refused = true
            } catch {
                throw error
            }
            if refused {
                try session.resetStream(id, code: .internalError)
                return
            }
            guard status != 204 else { return }
            try Array(repeating: 0x61, count: 700).withUnsafeBytes { _ = try session.sendResponseBody(id, $0) }
            try session.finishResponse(id, trailers: status == 200 ? [HTTPField(name: "x-sum", value: "1")] : [])
        } catch HTTP2SessionError.connectionClosed, HTTP2SessionError.unknownStream {
            // The connection ended, or the client reset the stream later in the same read.
            return
        } catch {
            fatalError("answering stream \(id): \(error)")
        }
    }

    func checkRequest(_ request: HTTP2Request) {
        guard !request.method.isEmpty, request.method.utf8.allSatisfy(isTchar) else { fatalError("method \(request.method)") }
        let authority = request.authority.utf8
        guard !authority.isEmpty, !authority.contains(UInt8(ascii: "@")),
              authority.allSatisfy({ $0 > 0x20 && $0 < 0x7f }) else { fatalError("authority \(request.authority)") }
        if request.method == "CONNECT" {
            guard request.scheme.isEmpty, request.path.isEmpty else { fatalError("CONNECT with scheme or path") }
        } else {
            guard request.scheme == "https" else { fatalError("scheme \(request.scheme)") }
            let path = request.path.utf8
            guard path.first == UInt8(ascii: "/") || (request.path == "*" && request.method == "OPTIONS"),
                  path.allSatisfy({ $0 > 0x20 && $0 < 0x7f && $0 != UInt8(ascii: "#") }) else { fatalError("path \(request.path)") }
        }
        var cookies = 0
        for field in request.fields {
            checkField(field)
            if field.name == "cookie" { cookies += 1 }
            if field.name == "host" { fatalError("host field surfaced") }
        }
        if cookies > 1 { fatalError("cookie crumbs not joined") }
        let head = request.requestHead
        guard head.fields.first == HTTPField(name: "host", value: request.authority) else { fatalError("Host not first") }
        let wire = head.serialized()
        let parsed = wire.withUnsafeBytes { HTTP1Parser.parseRequestHead($0, limits: HTTPLimits()) }
        guard case .complete(let again, let length) = parsed, again == head, length == wire.count else {
            fatalError("the HTTP/1.1 rendition does not parse back: \(head) -> \(parsed)")
        }
        // The engine hands this head over as `checkedParts` (lengths only): the byte checks must agree, within
        // generous and within tight limits, chunked or not.
        for chunked in [false, true] {
            let handed = request.requestHead(chunked: chunked)
            for limits in [HTTPLimits(), HTTPLimits(requestLine: 64, headerSection: 256, headerCount: 4)] {
                let known = HeadHandoff.request(handed, limits: limits, maxHeadBytes: 300, from: .checkedParts)
                let checked = HeadHandoff.request(handed, limits: limits, maxHeadBytes: 300)
                guard known == checked else { fatalError("handoff of \(handed): checkedParts \(String(describing: known)), checked \(String(describing: checked))") }
            }
        }
    }

    func checkField(_ field: HTTPField) {
        let name = field.name.utf8
        guard !name.isEmpty, name.allSatisfy({ isTchar($0) && !($0 >= 0x41 && $0 <= 0x5a) }) else {
            fatalError("field name \(field.name)")
        }
        switch field.name {
        case "connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade":
            fatalError("connection-specific field \(field.name)")
        case "te" where field.value.lowercased() != "trailers":
            fatalError("te \(field.value)")
        default: break
        }
        let value = field.value.utf8
        guard value.allSatisfy({ $0 >= 0x20 && $0 != 0x7f || $0 == 0x09 }) else { fatalError("control in \(field.name)") }
        if let first = value.first, first == 0x20 || first == 0x09 { fatalError("leading whitespace in \(field.name)") }
        if let last = value.last, last == 0x20 || last == 0x09 { fatalError("trailing whitespace in \(field.name)") }
    }
}

func isTchar(_ b: UInt8) -> Bool {
    switch b {
    case 0x30...0x39, 0x41...0x5a, 0x61...0x7a: true
    default: Array("!#$%&'*+-.^_`|~".utf8).contains(b)
    }
}

/// The server's output parses as a run of whole frames (9-byte header, then the length it states).
func checkWholeFrames(_ bytes: [UInt8]) {
    var i = 0
    while i < bytes.count {
        guard i + 9 <= bytes.count else { fatalError("partial frame header in the output") }
        let length = Int(bytes[i]) << 16 | Int(bytes[i + 1]) << 8 | Int(bytes[i + 2])
        i += 9 + length
    }
    if i != bytes.count { fatalError("partial frame in the output") }
}
