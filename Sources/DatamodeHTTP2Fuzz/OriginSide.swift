/// The origin side of the fuzz target (SPEC §17 "Origin side"): inputs whose first byte has its high bit set are what
/// an origin sends to `HTTP2ClientSession` after its SETTINGS, in pieces as for the client side. Three requests are in
/// flight (a GET, a HEAD, a POST whose body is fed as the codec asks), so responses, trailers, resets and GOAWAY land
/// on streams in every state. Checked, by rules written here:
/// - a surfaced response head is what an HTTP/1.1 exchange may be handed: `:status` 100–999, not 101, field names
///   lowercase tokens, none connection-specific, values without CR/LF/NUL/controls (the checks the engine's
///   `HTTP2OriginStream` relies on when it writes the head back as HTTP/1.1);
/// - body bytes never pass the response's `content-length`, and a `responseEnd` meets it;
/// - events in a possible order (no body before the head or after the end; 1xx only before the final head);
/// - the output is whole frames;
/// - with bodies taken in place (`receive(_:bodyInPlace:)`, when the first byte's 0x20 bit is set), every range lies
///   within the piece it was read from.
import DatamodeHTTP
import DatamodeHTTP2

func fuzzOriginSide(_ input: UnsafeBufferPointer<UInt8>, piece: Int) {
    let squeezing = input[0] & 0x40 != 0
    let inPlace = input[0] & 0x20 != 0
    let configuration = HTTP2ClientConfiguration(initialWindowSize: squeezing ? 1 << 17 : 4096,
                                                 headerLimits: HTTPLimits(requestLine: 256, headerSection: 1024, headerCount: 16),
                                                 requestBodyHighWatermark: 512, requestBodyLowWatermark: 128)
    guard let session = try? HTTP2ClientSession(configuration: configuration) else { fatalError("session creation failed") }
    var checker = OriginChecker()
    var output: [UInt8] = []
    func drain() {
        for event in session.writeOutput(limit: 4096, { output += $0 }) { checker.check(event, session) }
    }
    do {
        let get = try session.startRequest(method: "GET", scheme: "https", authority: "origin.test", path: "/a",
                                           fields: [HTTPField(name: "accept", value: "*/*")], endStream: true)
        let head = try session.startRequest(method: "HEAD", scheme: "https", authority: "origin.test", path: "/b",
                                            fields: [], endStream: true)
        let post = try session.startRequest(method: "POST", scheme: "https", authority: "origin.test", path: "/c",
                                            fields: [HTTPField(name: "content-type", value: "text/plain")], endStream: false)
        checker.methods = [get: "GET", head: "HEAD", post: "POST"]
        try Array(repeating: 0x62, count: 900).withUnsafeBytes { _ = try session.sendRequestBody(post, $0) }
        try session.finishRequest(post, trailers: [HTTPField(name: "x-sum", value: "2")])
    } catch {
        fatalError("starting requests: \(error)")
    }
    drain()
    // The origin's SETTINGS (empty), then the input.
    let settings: [UInt8] = [0, 0, 0, 4, 0, 0, 0, 0, 0]
    for event in settings.withUnsafeBytes({ session.receive($0) }) { checker.check(event, session) }
    drain()
    var offset = 1
    while offset < input.count {
        let end = min(offset + piece, input.count)
        let bytes = UnsafeRawBufferPointer(UnsafeBufferPointer(rebasing: input[offset..<end]))
        for event in session.receive(bytes, bodyInPlace: inPlace) {
            checker.check(event, session, in: inPlace ? bytes : nil)
        }
        if squeezing { toggleSqueeze(session.squeezeStreamWindows, session.restoreStreamWindows, piece: offset / piece) }
        drain()
        offset = end
    }
    for _ in 0..<64 where session.wantsWrite { drain() }
    // The client's connection preface (RFC 9113 §3.4) comes first, then whole frames.
    let preface = Array("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".utf8)
    guard output.starts(with: preface) else { fatalError("no client preface") }
    checkWholeFrames(Array(output.dropFirst(preface.count)))
}

struct OriginChecker {
    var methods: [Int32: String] = [:]
    var finalHead: [Int32: UInt64?] = [:]
    var received: [Int32: UInt64] = [:]
    var ended: Set<Int32> = []
    var closed: Set<Int32> = []

    /// `piece`: the bytes the events were read from with bodies in place (nil: they were copied).
    mutating func check(_ event: HTTP2ClientEvent, _ session: HTTP2ClientSession, in piece: UnsafeRawBufferPointer? = nil) {
        switch event {
        case .informational(let id, let status, let fields):
            guard methods[id] != nil, finalHead[id] == nil, !closed.contains(id) else { fatalError("1xx out of place on \(id)") }
            guard (100...199).contains(status), status != 101 else { fatalError("interim status \(status)") }
            fields.forEach(checkResponseField)
        case .response(let id, let status, let fields, let endStream):
            guard methods[id] != nil, finalHead[id] == nil, !closed.contains(id) else { fatalError("second head on \(id)") }
            guard (200...999).contains(status) else { fatalError("final status \(status)") }
            fields.forEach(checkResponseField)
            let lengths = fields.filter { $0.name == "content-length" }.map(\.value)
            var length: UInt64? = nil
            if let first = lengths.first, methods[id] != "HEAD", status != 204, status != 304 {
                guard let parsed = UInt64(first), lengths.allSatisfy({ $0 == first }) else { fatalError("content-length \(lengths)") }
                length = parsed
            }
            finalHead[id] = length
            received[id] = 0
            if endStream {
                if let length, length != 0 { fatalError("ended at the head with content-length \(length)") }
                ended.insert(id)
            }
        case .responseBody(let id, let bytes):
            body(id, count: bytes.count, session)
        case .responseBodyAt(let id, let range):
            guard let piece, range.lowerBound >= 0, range.upperBound <= piece.count else {
                fatalError("a body in place at \(range), outside the \(piece?.count ?? 0) bytes read")
            }
            body(id, count: range.count, session)
        case .responseEnd(let id, let trailers):
            guard let length = finalHead[id], !ended.contains(id), !closed.contains(id) else { fatalError("end out of place on \(id)") }
            if let length, received[id]! != length { fatalError("end before content-length") }
            trailers.forEach(checkResponseField)
            ended.insert(id)
        case .streamClosed(let id, _):
            guard methods[id] != nil, closed.insert(id).inserted else { fatalError("stream \(id) closed twice or unknown") }
        case .requestBodyDrained, .requestBodySent, .sendWindowOpened, .malformedResponse, .concurrencyChanged, .goaway,
             .connectionError:
            break
        }
    }

    mutating func body(_ id: Int32, count: Int, _ session: HTTP2ClientSession) {
        guard let length = finalHead[id], !ended.contains(id), !closed.contains(id) else { fatalError("body out of place on \(id)") }
        received[id]! += UInt64(count)
        if let length, received[id]! > length { fatalError("body past content-length") }
        session.consumeResponseBody(id, count: count)
    }

    func checkResponseField(_ field: HTTPField) {
        if let problem = HTTP2ResponseTranslation.problem(with: field) { fatalError("response field: \(problem)") }
    }
}
