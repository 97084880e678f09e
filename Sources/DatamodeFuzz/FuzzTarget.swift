/// libFuzzer entry point for DatamodeHTTP. libFuzzer provides `main`; this file has no top-level code.
///
/// Build and run: see README "Fuzzing" (DATAMODE_FUZZ=1 swift build -c release --sanitize fuzzer ...).
///
/// Besides "never crash, never read out of bounds" (ASan), each input checks properties that a smuggling bug
/// would break:
/// - incremental consistency: a prefix of a complete head is `.incomplete`, a prefix of an incomplete head too,
///   and a prefix never completes differently from the whole;
/// - round trip: a parsed head, serialised and re-parsed, is the same head (what we forward means what we checked);
/// - request targets normalise idempotently;
/// - the transparent listener's `Host` fast path (`RequestTarget.httpOnHost`) and the HTTP/2 codec's `:authority` and
///   `:path` check (`RequestTarget.isAbsolute`) agree with parsing the joined URL;
/// - `RequestTarget.parse`'s shortcut for targets in their one spelling agrees with `parseInFull`;
/// - chunked framing gives the same outcome whether the bytes arrive at once or in two reads;
/// - the engine's in-place paths agree with the reference parsers: the input, arriving in pieces (derived from
///   the input, so a finding reproduces) in an evbuffer's chains, through `FrontParse` (request and response
///   heads) and `BodyRelay` (chunked bodies, framing kept and stripped, with small backpressure budgets), reaches
///   the same verdict at the same byte, with the same head or the same bytes forwarded, as `HTTP1Parser` and
///   `ChunkedDecoder` on the whole input;
/// - a head that `HeadHandoff` lets skip its text (the HTTP/2 streams' seams) is what the parser reads from that text;
/// - a response head read as offsets (`HTTP1Parser.parseResponseHeadSpans`) is the parsed head, with the same framing,
///   `Connection` options and relayed bytes (`SpannedHeadCheck`);
/// - a parsed head translates to HTTP/2 fields the codecs' checks accept (`HTTP2FieldSource.translatedFromHTTP1Head`);
/// - the parser's literals for known spellings and its out-of-line name scan agree with building the String and
///   testing each byte (`ParserFastPaths`).
import CLibevent
import DatamodeEngine
import DatamodeHTTP
import DatamodeHTTP2
#if canImport(Glibc)
import Glibc
#endif

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> Int32 {
    let bytes = UnsafeRawBufferPointer(start: data, count: size)
    // Small limits so that inputs up to -max_len=4096 reach every limit check.
    let small = HTTPLimits(requestLine: 512, headerSection: 2048, headerCount: 32)
    let split = size / 2

    // MARK: the parser's fast paths for names and short strings, on the input's first bytes and its middle
    for (from, to) in [(0, min(size, 40)), (split, min(size, split + 12))] {
        if let disagreement = ParserFastPaths.disagreement(bytes, from, to) {
            fatalError("parser fast path disagrees with its reference: \(disagreement)")
        }
    }

    // MARK: request heads
    let request = HTTP1Parser.parseRequestHead(bytes, limits: small)
    switch request {
    case .complete(let head, let length):
        guard length > 0 && length <= size else { fatalError("request length \(length) out of 0...\(size)") }
        checkPrefix(HTTP1Parser.parseRequestHead(UnsafeRawBufferPointer(rebasing: bytes[0..<(length - 1)]), limits: small),
                    expectComplete: nil, what: "request prefix length-1")
        checkPrefix(HTTP1Parser.parseRequestHead(UnsafeRawBufferPointer(rebasing: bytes[0..<split]), limits: small),
                    expectComplete: split >= length ? (head, length) : nil, what: "request prefix half")
        _ = head.bodyFraming()
        _ = head.connectionTokens
        checkFieldSource(head)
        if case .success(let target) = RequestTarget.parse(head.target, method: head.method) {
            checkTarget(target, method: head.method)
        }
        let wire = head.serialized()
        let again = wire.withUnsafeBytes { HTTP1Parser.parseRequestHead($0, limits: HTTPLimits()) }
        guard case .complete(let head2, let length2) = again, head2 == head, length2 == wire.count else {
            fatalError("request round trip failed: \(head) -> \(again)")
        }
    case .incomplete:
        checkPrefix(HTTP1Parser.parseRequestHead(UnsafeRawBufferPointer(rebasing: bytes[0..<split]), limits: small),
                    expectComplete: nil, what: "prefix of incomplete request")
    case .invalid:
        if case .complete = HTTP1Parser.parseRequestHead(UnsafeRawBufferPointer(rebasing: bytes[0..<split]), limits: small) {
            fatalError("prefix of an invalid request parsed complete")
        }
    }

    // MARK: the transparent listener's Host fast path against parsing the joined URL
    // The input up to its first newline is a Host value, the rest a path.
    if let newline = bytes.firstIndex(of: 0x0A) {
        let host = String(decoding: UnsafeRawBufferPointer(rebasing: bytes[0..<newline]), as: UTF8.self)
        let path = String(decoding: UnsafeRawBufferPointer(rebasing: bytes[(newline + 1)...]), as: UTF8.self)
        if case .success(let origin) = RequestTarget.parse(path, method: "GET"), origin.form == .origin {
            var reference: RequestTarget?
            if case .success(let absolute) = RequestTarget.parse("http://" + host + origin.path, method: "GET"),
               absolute.form == .absolute, absolute.path == origin.path {
                reference = absolute
            }
            let fast = RequestTarget.httpOnHost(host, origin: origin)
            guard fast == reference else {
                fatalError("httpOnHost \(host.debugDescription) \(path.debugDescription): \(String(describing: fast)) vs \(String(describing: reference))")
            }
        }
        // The same two parts as an HTTP/2 request's :authority and :path (`RequestTarget.isAbsolute`).
        var joinedKeepsPath = false
        if case .success(let absolute) = RequestTarget.parse("https://" + host + path, method: "GET") {
            joinedKeepsPath = absolute.path == path
        }
        guard RequestTarget.isAbsolute(scheme: "https", authority: host, path: path) == joinedKeepsPath else {
            fatalError("isAbsolute \(host.debugDescription) \(path.debugDescription): reference \(joinedKeepsPath)")
        }
    }

    // MARK: the shortcut for targets in their one spelling against parsing them in full
    // The input up to its first newline is a target, as it is and after "http://" (so the shortcut is often taken).
    let line = String(decoding: UnsafeRawBufferPointer(rebasing: bytes[0..<(bytes.firstIndex(of: 0x0A) ?? bytes.count)]),
                      as: UTF8.self)
    for target in [line, "http://" + line] {
        let parsed = RequestTarget.parse(target, method: "GET")
        let inFull = RequestTarget.parseInFull(target, method: "GET")
        guard parsed == inFull else {
            fatalError("target \(target.debugDescription): parse \(parsed) vs parseInFull \(inFull)")
        }
    }

    // MARK: heads handed over in memory (`HeadHandoff`) against parsing their text
    checkHandoff(bytes, limits: small)

    // MARK: response heads
    let response = HTTP1Parser.parseResponseHead(bytes, limits: small)
    if case .complete(let head, let length) = response {
        guard length > 0 && length <= size else { fatalError("response length out of range") }
        checkPrefix(HTTP1Parser.parseResponseHead(UnsafeRawBufferPointer(rebasing: bytes[0..<(length - 1)]), limits: small),
                    expectComplete: nil, what: "response prefix length-1")
        _ = head.bodyFraming(requestMethod: "GET")
        _ = head.bodyFraming(requestMethod: "HEAD")
        checkFieldSource(head)
        let wire = head.serialized()
        let again = wire.withUnsafeBytes { HTTP1Parser.parseResponseHead($0, limits: HTTPLimits()) }
        guard case .complete(let head2, let length2) = again, head2 == head, length2 == wire.count else {
            fatalError("response round trip failed: \(head) -> \(again)")
        }
    }

    // MARK: the relay of a response head from its bytes against its Strings (`SpannedHeadCheck`)
    for limits in [small, HTTPLimits()] {
        if let disagreement = SpannedHeadCheck.disagreement(bytes, limits: limits) {
            fatalError("response head relayed from its bytes: \(disagreement)")
        }
    }

    // MARK: chunked bodies
    let whole = driveChunked(bytes, firstRead: size)
    let twoReads = driveChunked(bytes, firstRead: split)
    guard whole == twoReads else { fatalError("chunked outcome differs by read size: \(whole) vs \(twoReads)") }

    // MARK: the engine's in-place paths against the references above
    var splitter = Splitter(bytes)
    let requestInPlace = inPlaceHead(bytes, limit: small.maxRequestHeadBytes, &splitter) {
        HTTP1Parser.parseRequestHead($0, limits: small)
    }
    checkSameHead(requestInPlace, request, what: "request head")
    // No empty lines are skipped before a status line: status line, CRLF, header section.
    let responseInPlace = inPlaceHead(bytes, limit: small.requestLine + 2 + small.headerSection, &splitter) {
        HTTP1Parser.parseResponseHead($0, limits: small)
    }
    checkSameHead(responseInPlace, response, what: "response head")
    let reference = ReferenceChunked(bytes)
    for strip in [false, true] {
        checkRelay(bytes, strip: strip, reference, &splitter)
    }

    // MARK: the transparent listener's first bytes (SPEC §16)
    checkTransparentOpening(bytes, split: split)

    // MARK: request targets on raw input
    if size <= 1024, let s = String(validating: bytes, as: UTF8.self) {
        for method in ["GET", "CONNECT", "OPTIONS"] {
            if case .success(let target) = RequestTarget.parse(s, method: method) { checkTarget(target, method: method) }
        }
    }
    return 0
}

/// The input as a head built without any check: its first line the start line's parts (split at spaces), each next
/// line a field split at its first colon (any bytes, as `String(decoding:)` keeps them). Whenever `HeadHandoff` says a
/// head may skip its text, the strict parser must read that same head, with that length, from the text.
private func checkHandoff(_ bytes: UnsafeRawBufferPointer, limits: HTTPLimits) {
    let lines = bytes.split(separator: 0x0A, omittingEmptySubsequences: false).map { String(decoding: $0, as: UTF8.self) }
    guard let first = lines.first else { return }
    let fields = lines.dropFirst().map { line -> HTTPField in
        guard let colon = line.firstIndex(of: ":") else { return HTTPField(name: line, value: "") }
        return HTTPField(name: String(line[..<colon]), value: String(line[line.index(after: colon)...]))
    }
    let parts = first.split(separator: " ", maxSplits: 2, omittingEmptySubsequences: false).map(String.init)
    let maxHeadBytes = limits.maxRequestHeadBytes
    func text(_ start: String) -> [UInt8] {
        var text = Array((start + "\r\n").utf8)
        for field in fields { text += Array((field.name + ": " + field.value + "\r\n").utf8) }
        return text + [0x0D, 0x0A]
    }
    func read<H>(_ text: [UInt8], _ parse: (UnsafeRawBufferPointer) -> HeadParseResult<H>) -> HeadParseResult<H> {
        text.withUnsafeBytes { parse(UnsafeRawBufferPointer(rebasing: $0.prefix(maxHeadBytes))) }
    }
    let request = RequestHead(method: parts[0], target: parts.count > 1 ? parts[1] : "/", version: .http11, fields: fields)
    if let length = HeadHandoff.request(request, limits: limits, maxHeadBytes: maxHeadBytes) {
        let parsed = read(text(request.method + " " + request.target + " HTTP/1.1")) { HTTP1Parser.parseRequestHead($0, limits: limits) }
        guard case .complete(let back, let parsedLength) = parsed, back == request, parsedLength == length else {
            fatalError("handed request head \(request) (\(length)) parses as \(parsed)")
        }
    }
    let status = parts.count > 1 ? Int(parts[1]) ?? 200 : 200
    let response = ResponseHead(version: .http11, status: status, reason: parts.count > 2 ? parts[2] : "", fields: fields)
    if let length = HeadHandoff.response(response, limits: limits, maxHeadBytes: maxHeadBytes) {
        let parsed = read(text("HTTP/1.1 \(status) " + response.reason)) { HTTP1Parser.parseResponseHead($0, limits: limits) }
        guard case .complete(let back, let parsedLength) = parsed, back == response, parsedLength == length else {
            fatalError("handed response head \(response) (\(length)) parses as \(parsed)")
        }
    }
}

private func checkPrefix<H: Equatable>(_ result: HeadParseResult<H>, expectComplete: (H, Int)?, what: String) {
    switch (result, expectComplete) {
    case (.incomplete, nil): return
    case (.complete(let h, let l), let (eh, el)?) where h == eh && l == el: return
    default: fatalError("\(what): unexpected \(result)")
    }
}

/// Normalisation is idempotent: the canonical URL parses to the same target.
private func checkTarget(_ target: RequestTarget, method: String) {
    guard target.form == .absolute || target.form == .authority else { return }
    // `parse` keeps the client's string as the absolute URL when it is already the one spelling: kept or built,
    // it must be exactly scheme://Host + path.
    if target.form == .absolute, target.absoluteURL != target.scheme + "://" + target.hostHeaderValue + target.path {
        fatalError("absolute URL \(target.absoluteURL) is not its parts' spelling: \(target)")
    }
    guard case .success(let again) = RequestTarget.parse(target.absoluteURL, method: method), again == target else {
        fatalError("request target not idempotent: \(target)")
    }
}

enum ChunkedOutcome: Equatable {
    case end(Int)
    case needMore(Int)
    case invalid(HTTPWireError)
}

/// Drives a decoder the way the engine does: framing passes through, data is "moved" by the caller.
/// The first `firstRead` bytes are visible first, then the rest.
private func driveChunked(_ bytes: UnsafeRawBufferPointer, firstRead: Int) -> ChunkedOutcome {
    var decoder = ChunkedDecoder(maxLineLength: 64, maxTrailerSection: 256)
    var position = 0
    var visible = firstRead
    while true {
        if decoder.dataRemaining > 0 {
            let n = min(Int(clamping: decoder.dataRemaining), visible - position)
            if n > 0 {
                decoder.consumeData(n)
                position += n
                continue
            }
        } else {
            let result = decoder.parseFraming(UnsafeRawBufferPointer(rebasing: bytes[position..<visible]))
            switch result {
            case .framing(let length):
                guard length > 0 && position + length <= visible else { fatalError("framing length \(length) out of range") }
                position += length
                continue
            case .end(let length):
                guard length > 0 && position + length <= visible, decoder.isComplete else { fatalError("bad end") }
                return .end(position + length)
            case .invalid(let error):
                return .invalid(error)
            case .needMore:
                break
            }
        }
        if visible < bytes.count {
            visible = bytes.count
            continue
        }
        return .needMore(position)
    }
}

// MARK: - in place

/// Piece lengths and budgets for the in-place runs, from a hash of the input: the same input always arrives the
/// same way, so a finding reproduces from its file.
private struct Splitter {
    var state: UInt64

    init(_ bytes: UnsafeRawBufferPointer) {
        var h: UInt64 = 0xcbf2_9ce4_8422_2325
        for b in bytes { h = (h ^ UInt64(b)) &* 0x0000_0100_0000_01b3 }
        state = h
    }

    mutating func next(_ bound: Int) -> Int {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return Int((z ^ (z >> 31)) % UInt64(max(bound, 1)))
    }

    /// Up to 64 pieces: single bytes, a few bytes, or larger.
    mutating func pieces(_ count: Int) -> [Range<Int>] {
        var pieces: [Range<Int>] = []
        var at = 0
        let style = next(3)
        while at < count {
            var length = style == 0 ? 1 : style == 1 ? 1 + next(8) : 1 + next(512)
            if pieces.count == 63 { length = count }
            pieces.append(at..<min(count, at + length))
            at = min(count, at + length)
        }
        return pieces
    }
}

/// An evbuffer fed one piece at a time, each appended into the last chain or added as a chain of its own.
private final class Arrivals {
    let buffer = evbuffer_new()!

    deinit { evbuffer_free(buffer) }

    func arrive(_ bytes: UnsafeRawBufferPointer, ownChain: Bool) {
        guard let base = bytes.baseAddress, !bytes.isEmpty else { return }
        if ownChain {
            let copy = malloc(bytes.count)!
            copy.copyMemory(from: base, byteCount: bytes.count)
            evbuffer_add_reference(buffer, copy, bytes.count, { data, _, _ in free(UnsafeMutableRawPointer(mutating: data)) }, nil)
        } else {
            evbuffer_add(buffer, base, bytes.count)
        }
    }
}

/// What the engine decides: one `FrontParse` after each arrival; the first result that is not `.incomplete` is
/// final. `stuck`: still `.incomplete` with `limit` bytes buffered, past which `FrontParse` never looks.
private func inPlaceHead<H>(_ bytes: UnsafeRawBufferPointer, limit: Int, _ splitter: inout Splitter,
                            _ parse: (UnsafeRawBufferPointer) -> HeadParseResult<H>) -> (result: HeadParseResult<H>, stuck: Bool) {
    let arrivals = Arrivals()
    for piece in splitter.pieces(bytes.count) {
        arrivals.arrive(UnsafeRawBufferPointer(rebasing: bytes[piece]), ownChain: splitter.next(2) == 0)
        let result = FrontParse.parse(arrivals.buffer, limit: limit, incomplete: .incomplete,
                                      isIncomplete: { if case .incomplete = $0 { true } else { false } }, parse)
        if case .incomplete = result {
            if evbuffer_get_length(arrivals.buffer) >= limit { return (result, true) }
            continue
        }
        return (result, false)
    }
    return (.incomplete, false)
}

private func checkSameHead<H: Equatable>(_ inPlace: (result: HeadParseResult<H>, stuck: Bool), _ reference: HeadParseResult<H>,
                                         what: String) {
    if inPlace.stuck { fatalError("\(what) in place: incomplete with the limit buffered; reference \(reference)") }
    switch (inPlace.result, reference) {
    case (.incomplete, .incomplete): return
    case (.complete(let a, let la), .complete(let b, let lb)) where a == b && la == lb: return
    case (.invalid(let a), .invalid(let b)) where a == b: return
    default: fatalError("\(what) in place \(inPlace.result), reference \(reference)")
    }
}

/// `ChunkedDecoder` as the relay configures it, over the whole input at once.
private struct ReferenceChunked {
    enum Outcome { case complete, needMore, invalid }
    var outcome = Outcome.needMore
    var consumed = 0
    var payload: [UInt8] = []
    /// What the relay forwards when it keeps the framing: what it took, but a trailer section without the fields
    /// no trailer may carry on (`TrailerSection`); nil unless complete.
    var forwarded: [UInt8]?

    init(_ bytes: UnsafeRawBufferPointer) {
        var decoder = ChunkedDecoder()
        while consumed < bytes.count {
            if decoder.dataRemaining > 0 {
                let n = min(Int(clamping: decoder.dataRemaining), bytes.count - consumed)
                payload += bytes[consumed..<(consumed + n)]
                decoder.consumeData(n)
                consumed += n
                continue
            }
            switch decoder.parseFraming(UnsafeRawBufferPointer(rebasing: bytes[consumed...])) {
            case .needMore: return
            case .framing(let length): consumed += length
            case .end(let length):
                let element = UnsafeRawBufferPointer(rebasing: bytes[consumed..<(consumed + length)])
                forwarded = Array(bytes[..<consumed])
                    + (decoder.dropsTrailerFields ? TrailerSection.withoutDroppedFields(element)!.element : Array(element))
                consumed += length
                outcome = .complete
                return
            case .invalid:
                outcome = .invalid
                return
            }
        }
    }
}

/// `BodyRelay` as the engine drives it: each arrival pumped with small budgets until nothing moves.
private func checkRelay(_ bytes: UnsafeRawBufferPointer, strip: Bool, _ reference: ReferenceChunked, _ splitter: inout Splitter) {
    var relay = BodyRelay(framing: .chunked, stripChunkFraming: strip)
    let source = Arrivals()
    let destination = evbuffer_new()!
    defer { evbuffer_free(destination) }
    var outcome = ReferenceChunked.Outcome.needMore
    var arrived = 0
    arrivals: for piece in splitter.pieces(bytes.count) {
        source.arrive(UnsafeRawBufferPointer(rebasing: bytes[piece]), ownChain: splitter.next(2) == 0)
        arrived = piece.upperBound
        while true {
            let before = relay.transferred
            switch relay.pump(from: source.buffer, to: destination, budget: [1, 3, 64, 1 << 20][splitter.next(4)]) {
            case .complete:
                outcome = .complete
                break arrivals
            case .invalid:
                outcome = .invalid
                break arrivals
            case .inProgress:
                if relay.transferred == before { continue arrivals }
            }
        }
    }
    var delivered = [UInt8](repeating: 0, count: evbuffer_get_length(destination))
    if !delivered.isEmpty { _ = delivered.withUnsafeMutableBytes { evbuffer_copyout(destination, $0.baseAddress, $0.count) } }
    let expected = strip ? reference.payload : reference.forwarded ?? Array(bytes[..<reference.consumed])
    guard outcome == reference.outcome, relay.transferred == UInt64(reference.consumed),
          evbuffer_get_length(source.buffer) == arrived - reference.consumed, delivered == expected else {
        fatalError("chunked in place (strip \(strip)): \(outcome) after \(relay.transferred) bytes, \(delivered.count) delivered; "
                   + "reference: \(reference.outcome) after \(reference.consumed) bytes, \(expected.count) expected")
    }
}

/// What the transparent listener makes of the first bytes: never a crash; a server name is always a valid DNS name;
/// a prefix of something recognised is `needMore` or the same thing (more bytes never change a verdict made).
func checkTransparentOpening(_ bytes: UnsafeRawBufferPointer, split: Int) {
    let whole = TransparentOpening.classify(bytes, requestLineLimit: 512)
    if case .tls(let name?) = whole, ClientHello.validHostName(ArraySlice(name.utf8)) != name {
        fatalError("server name \(name) is not a valid host name")
    }
    let prefix = TransparentOpening.classify(UnsafeRawBufferPointer(rebasing: bytes[0..<split]), requestLineLimit: 512)
    switch whole {
    case .tls, .http:
        guard prefix == .needMore || prefix == whole else { fatalError("prefix classified \(prefix), whole \(whole)") }
    case .needMore:
        guard prefix == .needMore else { fatalError("prefix of needMore classified \(prefix)") }
    case .other:
        break
    }
    if TransparentOpening.classify(bytes, requestLineLimit: 512, atEnd: true) == .needMore {
        fatalError("needMore at EOF")
    }
}

/// A head `HTTP1Parser` read needs no second field check once translated to HTTP/2 (`HTTP2FieldSource`).
func checkFieldSource(_ head: ResponseHead) {
    for field in HTTP2ResponseTranslation.fields(of: head) {
        if let problem = HTTP2ResponseTranslation.problem(with: field) {
            fatalError("parsed response head \(head) translates to a field the codec refuses: \(problem)")
        }
    }
}

func checkFieldSource(_ head: RequestHead) {
    if case .failure(.invalidField(let problem)) = HTTP2OriginRequestTranslation.request(
        of: head, defaultAuthority: "origin.test", from: .unchecked),
       problem.hasPrefix("field name") || problem.hasPrefix("invalid value") {
        fatalError("parsed request head \(head) translates to a field the codec refuses: \(problem)")
    }
}
