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
/// - chunked framing gives the same outcome whether the bytes arrive at once or in two reads.
import DatamodeHTTP

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> Int32 {
    let bytes = UnsafeRawBufferPointer(start: data, count: size)
    // Small limits so that inputs up to -max_len=4096 reach every limit check.
    let small = HTTPLimits(requestLine: 512, headerSection: 2048, headerCount: 32)
    let split = size / 2

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

    // MARK: response heads
    let response = HTTP1Parser.parseResponseHead(bytes, limits: small)
    if case .complete(let head, let length) = response {
        guard length > 0 && length <= size else { fatalError("response length out of range") }
        checkPrefix(HTTP1Parser.parseResponseHead(UnsafeRawBufferPointer(rebasing: bytes[0..<(length - 1)]), limits: small),
                    expectComplete: nil, what: "response prefix length-1")
        _ = head.bodyFraming(requestMethod: "GET")
        _ = head.bodyFraming(requestMethod: "HEAD")
        let wire = head.serialized()
        let again = wire.withUnsafeBytes { HTTP1Parser.parseResponseHead($0, limits: HTTPLimits()) }
        guard case .complete(let head2, let length2) = again, head2 == head, length2 == wire.count else {
            fatalError("response round trip failed: \(head) -> \(again)")
        }
    }

    // MARK: chunked bodies
    let whole = driveChunked(bytes, firstRead: size)
    let twoReads = driveChunked(bytes, firstRead: split)
    guard whole == twoReads else { fatalError("chunked outcome differs by read size: \(whole) vs \(twoReads)") }

    // MARK: request targets on raw input
    if size <= 1024, let s = String(validating: bytes, as: UTF8.self) {
        for method in ["GET", "CONNECT", "OPTIONS"] {
            if case .success(let target) = RequestTarget.parse(s, method: method) { checkTarget(target, method: method) }
        }
    }
    return 0
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
