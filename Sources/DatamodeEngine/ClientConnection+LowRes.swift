import CLibevent
import DatamodeHTTP
import DatamodeMedia

/// A response body held back, bounded, while the proxy decides whether to rewrite it (SPEC §13 manifests).
///
/// The body relay moves the origin's bytes here instead of to the client, exactly as it would have written them
/// (chunk framing included when the client gets chunks), so passing the response through untouched is writing
/// the head that was prepared and then these bytes, after which the relay goes on streaming as if nothing
/// happened. Only a complete body that the rewriter changes is replaced.
final class ResponseCapture {
    enum Phase {
        /// The first bytes decide whether this can be a master playlist or MPD at all.
        case sniffing
        /// It can: buffer the whole body (up to `limit`).
        case buffering
    }

    let buffer: OpaquePointer = evbuffer_new()!
    /// The head that would have been relayed, written when the body passes through.
    let passThroughHead: [UInt8]
    let origin: ResponseHead
    /// The buffered bytes keep chunk framing (decoded before rewriting).
    let chunked: Bool
    let cap: UInt64
    var phase: Phase
    /// Above this many buffered bytes the body passes through.
    let limit = ManifestCap.maximumSize

    /// How much of the start of a body sniffing looks at before it gives up deciding.
    static let sniffWindow = 64 * 1024

    init(passThroughHead: [UInt8], origin: ResponseHead, chunked: Bool, cap: UInt64, phase: Phase) {
        self.passThroughHead = passThroughHead
        self.origin = origin
        self.chunked = chunked
        self.cap = cap
        self.phase = phase
    }

    deinit { evbuffer_free(buffer) }

    /// The first `count` buffered bytes (or all), contiguous, with chunk framing removed. `nil` when the framing
    /// is broken or, with `whole`, the last chunk has not arrived.
    func body(upTo count: Int? = nil, whole: Bool) -> [UInt8]? {
        let length = min(evbuffer_get_length(buffer), count ?? Int.max)
        var raw = [UInt8](repeating: 0, count: length)
        if length > 0 { _ = raw.withUnsafeMutableBytes { evbuffer_copyout(buffer, $0.baseAddress, length) } }
        guard chunked else { return raw }
        return Self.dechunk(raw, whole: whole)
    }

    static func dechunk(_ raw: [UInt8], whole: Bool) -> [UInt8]? {
        var decoder = ChunkedDecoder()
        var out: [UInt8] = []
        out.reserveCapacity(raw.count)
        var i = 0
        return raw.withUnsafeBytes { bytes -> [UInt8]? in
            while i < raw.count {
                if decoder.dataRemaining > 0 {
                    let n = min(Int(decoder.dataRemaining), raw.count - i)
                    out.append(contentsOf: raw[i..<(i + n)])
                    decoder.consumeData(n)
                    i += n
                    continue
                }
                switch decoder.parseFraming(UnsafeRawBufferPointer(rebasing: bytes[i...])) {
                case .needMore: return whole ? nil : out
                case .framing(let length): i += length
                case .end: return out
                case .invalid: return nil
                }
            }
            return whole ? nil : out
        }
    }
}

/// Automatic low-res on the response path (SPEC §13): the one hook where a response may be held back.
extension ClientConnection {
    /// Called with a response head about to be relayed: returns the capture to buffer its body into when this
    /// response may be a master playlist or MPD under a cap, `nil` (stream it) otherwise. Only GETs of a capped
    /// mode get here, so every other response pays one `nil` check.
    func manifestCapture(_ exchange: Exchange, _ head: ResponseHead, framing: BodyFraming, strip: Bool,
                         headBytes: [UInt8]) -> ResponseCapture? {
        guard let cap = exchange.manifestCap, exchange.variant == nil, head.status == 200 else { return nil }
        switch framing {
        case .none, .contentLength(0): return nil
        default: break
        }
        let type = ManifestContentType(head.values(of: "content-type").first)
        guard type != .other else { return nil }
        // A compressed body is not read here, and no-transform forbids it (RFC 9111 §5.2.2.6).
        if head.values(of: "content-encoding").contains(where: { $0.lowercased() != "identity" }) { return nil }
        if head.values(of: "cache-control").contains(where: { $0.lowercased().contains("no-transform") }) { return nil }
        if head.contains("content-range") { return nil }
        if case .contentLength(let length) = framing, length > UInt64(ManifestCap.maximumSize) {
            if type == .manifest { worker.metrics.manifestPassed(.tooLarge) }
            return nil
        }
        let chunked = framing == .chunked && !strip
        return ResponseCapture(passThroughHead: headBytes, origin: head, chunked: chunked, cap: cap, phase: .sniffing)
    }

    /// `pumpResponseBody` for a captured response: buffer, decide, and write the response once decided.
    func pumpCapture(_ exchange: Exchange, _ capture: ResponseCapture, _ upstream: UpstreamConnection) {
        let room = capture.limit + 1 - evbuffer_get_length(capture.buffer)
        let before = evbuffer_get_length(upstream.input)
        let progress = exchange.responseBody.pump(from: upstream.input, to: capture.buffer, budget: max(room, 1))
        let step = Self.step(progress, before: before, left: evbuffer_get_length(upstream.input), exchange)
        if step.result == .invalid {
            // Nothing was written: the machine retracts (dropping the capture) and answers 502.
            perform(exchange, exchange.machine.responseBodyStep(step, unwritten: true))
            return
        }
        let buffered = evbuffer_get_length(capture.buffer)
        if buffered > capture.limit {
            if capture.phase == .buffering || ManifestContentType(capture.origin.values(of: "content-type").first) == .manifest {
                worker.metrics.manifestPassed(.tooLarge)
            }
            passCaptureThrough(exchange, capture)
            perform(exchange, exchange.machine.responseBodyStep(step, unwritten: false))
            if exchange.capture == nil, exchange.response != nil { pumpResponseBody(exchange) }
            return
        }
        let action = exchange.machine.responseBodyStep(step, unwritten: false)
        switch action {
        case .finish:
            finishCapture(exchange, capture)
            perform(exchange, action)
        case .none:
            guard capture.phase == .sniffing else { return }
            let window = min(buffered, ResponseCapture.sniffWindow)
            guard let prefix = capture.body(upTo: window, whole: false) else {
                // Broken chunk framing shows up in the relay itself; until then, stream.
                passCaptureThrough(exchange, capture)
                return
            }
            switch ManifestCap.sniff(prefix, complete: buffered >= ResponseCapture.sniffWindow) {
            case .needMore: return
            case .candidate: capture.phase = .buffering
            case .notAManifest:
                passCaptureThrough(exchange, capture)
                pumpResponseBody(exchange)
            }
        default:
            // Cut short (the origin closed early): what arrived goes out as it came, then the machine truncates.
            passCaptureThrough(exchange, capture)
            perform(exchange, action)
        }
    }

    /// Writes the held-back response as the origin sent it; from here on the body streams.
    func passCaptureThrough(_ exchange: Exchange, _ capture: ResponseCapture) {
        exchange.capture = nil
        evbuffer_add(output, capture.passThroughHead, capture.passThroughHead.count)
        exchange.responseHeadLength = capture.passThroughHead.count
        evbuffer_add_buffer(output, capture.buffer)
        exchange.bytesOut = exchange.responseBody.transferred
    }

    /// The whole body is here: write the capped manifest, or the original.
    private func finishCapture(_ exchange: Exchange, _ capture: ResponseCapture) {
        guard let body = capture.body(whole: true) else {
            passCaptureThrough(exchange, capture)
            return
        }
        switch ManifestCap.rewrite(body, cap: capture.cap) {
        case .rewritten(let kind, let rewritten, _):
            exchange.capture = nil
            let head = MessageHeads.relayedResponse(capture.origin, keepAlive: exchange.machine.keepAlive,
                                                    clientVersion: exchange.clientVersion, stripTransferEncoding: false,
                                                    variant: kind.variantName,
                                                    framing: .contentLength(UInt64(rewritten.count)))
            evbuffer_add(output, head, head.count)
            evbuffer_add(output, rewritten, rewritten.count)
            exchange.responseHeadLength = head.count
            exchange.variant = kind.variantName
            exchange.bytesOut = UInt64(rewritten.count)
            worker.metrics.saved(kind == .hls ? .hlsCap : .dashCap, bytes: body.count - rewritten.count)
        case .malformed:
            worker.metrics.manifestPassed(.malformed)
            passCaptureThrough(exchange, capture)
        case .unchanged, .notAManifest:
            passCaptureThrough(exchange, capture)
        }
    }
}
