import CLibevent
import DatamodeConfig
import DatamodeHTTP
import DatamodeMedia
import DatamodeState

/// A response body held back, bounded, while the proxy decides whether to rewrite it (SPEC §13: manifests and
/// images).
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

    /// What the body may become.
    enum Purpose {
        /// A master playlist or MPD capped at this many bits per second.
        case manifest(cap: UInt64)
        /// An image transcoded with these settings; `acceptsWebP` from the request's `Accept`.
        case image(ImagesSection, acceptsWebP: Bool)
    }

    let purpose: Purpose
    let buffer: OpaquePointer = evbuffer_new()!
    /// The head that would have been relayed, written when the body passes through.
    let passThroughHead: [UInt8]
    let origin: ResponseHead
    /// The buffered bytes keep chunk framing (decoded before rewriting).
    let chunked: Bool
    var phase: Phase
    /// Above this many buffered bytes the body passes through.
    let limit: Int
    /// An image sent to the transcoding pool: its body and the machine's `.finish` action, carried out when the
    /// result comes back.
    var pendingImage: (body: [UInt8], key: ImageCache.Key?, format: ImageProbe.Format)?

    /// How much of the start of a body sniffing looks at before it gives up deciding.
    static let sniffWindow = 64 * 1024

    init(purpose: Purpose, passThroughHead: [UInt8], origin: ResponseHead, chunked: Bool, phase: Phase, limit: Int) {
        self.purpose = purpose
        self.passThroughHead = passThroughHead
        self.origin = origin
        self.chunked = chunked
        self.phase = phase
        self.limit = limit
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
        if type == .generic, case .contentLength(let length) = framing, let upstream = exchange.upstream {
            // Most bodies of a generic type (octet-stream downloads, text) show in their first bytes that they are no
            // manifest. Those bytes usually arrive with the head: looked at in place, such a response streams at once
            // instead of being held back and copied (the capture cost every such response in constrained mode,
            // where the default cap applies: the policy-cost row of bench/run).
            let available = min(evbuffer_get_length(upstream.input), 512)
            if available > 0 {
                var prefix = [UInt8](repeating: 0, count: available)
                _ = evbuffer_copyout(upstream.input, &prefix, available)
                if case .notAManifest = ManifestCap.sniff(prefix, complete: UInt64(available) >= length) { return nil }
            }
        }
        let chunked = framing == .chunked && !strip
        return ResponseCapture(purpose: .manifest(cap: cap), passThroughHead: headBytes, origin: head, chunked: chunked,
                               phase: .sniffing, limit: ManifestCap.maximumSize)
    }

    /// Like `manifestCapture`, for images (SPEC §13): a 200 JPEG, PNG or WebP while transcoding applies.
    func imageCapture(_ exchange: Exchange, _ head: ResponseHead, framing: BodyFraming, strip: Bool,
                      headBytes: [UInt8]) -> ResponseCapture? {
        guard let settings = exchange.imageSettings, exchange.variant == nil, head.status == 200 else { return nil }
        switch framing {
        case .none, .contentLength(0): return nil
        default: break
        }
        guard let type = head.values(of: "content-type").first,
              ImageProbe.Format(mediaType: Self.mediaTypeEssence(type)) != nil else { return nil }
        if head.values(of: "content-encoding").contains(where: { $0.lowercased() != "identity" }) { return nil }
        if head.values(of: "cache-control").contains(where: { $0.lowercased().contains("no-transform") }) { return nil }
        if head.contains("content-range") { return nil }
        if case .contentLength(let length) = framing, length > UInt64(settings.maxInput) {
            worker.metrics.imagePassed(.tooLarge)
            return nil
        }
        return ResponseCapture(purpose: .image(settings, acceptsWebP: exchange.acceptsWebP), passThroughHead: headBytes,
                               origin: head, chunked: framing == .chunked && !strip, phase: .sniffing,
                               limit: settings.maxInput)
    }

    static func mediaTypeEssence(_ value: String) -> String {
        let essence = value.split(separator: ";", maxSplits: 1, omittingEmptySubsequences: false).first ?? ""
        return String(essence.filter { $0 != " " && $0 != "\t" }).lowercased()
    }

    /// `pumpResponseBody` for a captured response: buffer, decide, and write the response once decided.
    func pumpCapture(_ exchange: Exchange, _ capture: ResponseCapture, _ upstream: UpstreamConnection) {
        let before = evbuffer_get_length(upstream.input)
        // A held-back body is still the origin's bytes crossing the link: it passes the link profile's bucket and
        // counts against data budgets as it is taken in, exactly as a streamed one does (SPEC §10, §11).
        let room = allowedMove(exchange, room: max(capture.limit + 1 - evbuffer_get_length(capture.buffer), 1),
                               available: before, bucket: exchange.link?.down)
        guard room > 0 else { return }
        let progress = exchange.responseBody.pump(from: upstream.input, to: capture.buffer, budget: room)
        let moved = before - evbuffer_get_length(upstream.input)
        exchange.link?.down.charge(moved, now: worker.clock.nowNanoseconds())
        countOriginBytes(exchange, moved)
        let step = Self.step(progress, before: before, left: evbuffer_get_length(upstream.input), exchange)
        if step.result == .invalid {
            // Nothing was written: the machine retracts (dropping the capture) and answers 502.
            perform(exchange, exchange.machine.responseBodyStep(step, unwritten: true))
            return
        }
        let buffered = evbuffer_get_length(capture.buffer)
        if buffered > capture.limit {
            switch capture.purpose {
            case .manifest:
                if capture.phase == .buffering || ManifestContentType(capture.origin.values(of: "content-type").first) == .manifest {
                    worker.metrics.manifestPassed(.tooLarge)
                }
            case .image:
                worker.metrics.imagePassed(.tooLarge)
            }
            passCaptureThrough(exchange, capture)
            perform(exchange, exchange.machine.responseBodyStep(step, unwritten: false))
            if exchange.capture == nil, exchange.response != nil { pumpResponseBody(exchange) }
            return
        }
        let action = exchange.machine.responseBodyStep(step, unwritten: false)
        switch action {
        case .finish(let recycle):
            if case .image(let settings, let acceptsWebP) = capture.purpose {
                finishImage(exchange, capture, settings, acceptsWebP: acceptsWebP, recycle: recycle)
                return
            }
            finishCapture(exchange, capture)
            perform(exchange, action)
        case .none:
            guard capture.phase == .sniffing else { return }
            if case .image(let settings, _) = capture.purpose {
                probeEarly(exchange, capture, settings, buffered: buffered)
                return
            }
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
        guard case .manifest(let cap) = capture.purpose else { return }
        switch ManifestCap.rewrite(body, cap: cap) {
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

/// Images (SPEC §13): probed from their header, transcoded on the pool, written back on the worker's loop.
extension ClientConnection {
    /// Enough of the image to read its header: decide now whether it may be decoded at all, so that a
    /// decompression bomb or an animation is streamed on instead of buffered.
    private func probeEarly(_ exchange: Exchange, _ capture: ResponseCapture, _ settings: ImagesSection, buffered: Int) {
        guard buffered >= 64 * 1024, let prefix = capture.body(upTo: 256 * 1024, whole: false) else { return }
        guard let probe = ImageProbe(prefix) else {
            if buffered >= 256 * 1024 {
                worker.metrics.imagePassed(.undecodable)
                passCaptureThrough(exchange, capture)
                pumpResponseBody(exchange)
            }
            return
        }
        if let reason = Self.refusal(probe, settings) {
            worker.metrics.imagePassed(reason)
            passCaptureThrough(exchange, capture)
            pumpResponseBody(exchange)
            return
        }
        capture.phase = .buffering
    }

    private static func refusal(_ probe: ImageProbe, _ settings: ImagesSection) -> WorkerMetrics.ImagePassReason? {
        if probe.width * probe.height > settings.maxPixels { return .tooManyPixels }
        if probe.animated { return .animated }
        return nil
    }

    /// The whole image is here: answer from the cache, or send it to the pool (the exchange finishes when the
    /// result is back), or pass it through.
    private func finishImage(_ exchange: Exchange, _ capture: ResponseCapture, _ settings: ImagesSection,
                             acceptsWebP: Bool, recycle: Bool) {
        guard let body = capture.body(whole: true), let probe = ImageProbe(body) else {
            worker.metrics.imagePassed(.undecodable)
            passCaptureThrough(exchange, capture)
            perform(exchange, .finish(recycleUpstream: recycle))
            return
        }
        if let reason = Self.refusal(probe, settings) {
            worker.metrics.imagePassed(reason)
            passCaptureThrough(exchange, capture)
            perform(exchange, .finish(recycleUpstream: recycle))
            return
        }
        let output: ImageProbe.Format
        switch settings.format {
        case .auto: output = acceptsWebP ? .webp : probe.format
        case .original: output = probe.format
        case .jpeg: output = .jpeg
        }
        let etag = capture.origin.values(of: "etag").first
        let lastModified = capture.origin.values(of: "last-modified").first
        let key = etag == nil && lastModified == nil ? nil
            : ImageCache.Key(url: exchange.url, etag: etag, lastModified: lastModified, format: output,
                             maxWidth: settings.maxWidth, quality: settings.quality)
        if let key, let cached = ImageCache.shared.get(key) {
            worker.metrics.imageCacheHit()
            writeTranscoded(exchange, capture, body: body, output: cached, format: output)
            perform(exchange, .finish(recycleUpstream: recycle))
            return
        }
        // The origin's part is over: its connection goes back to the pool while the image is transcoded.
        releaseUpstream(of: exchange, recycle: recycle)
        capture.pendingImage = (body, key, output)
        let job = ImageJob(input: body, probe: probe, maxWidth: settings.maxWidth, quality: settings.quality,
                           output: output, worker: worker, token: ImageJobToken(connection: self, exchange: exchange))
        guard ImageTranscoder.shared.submit(job) else {
            worker.metrics.imagePassed(.busy)
            passCaptureThrough(exchange, capture)
            finishExchange(exchange, recycleUpstream: false)
            return
        }
    }

    /// A result from the pool, on this connection's worker loop. Whatever did not become a smaller image (a
    /// failure, a limit hit) sends the original bytes, counted by why.
    func imageTranscoded(_ exchange: Exchange, outcome: TranscodeOutcome) {
        guard !released, machine.exchange === exchange, let capture = exchange.capture,
              let pending = capture.pendingImage else { return }
        capture.pendingImage = nil
        switch outcome {
        case .encoded(let output) where output.count < pending.body.count:
            if let key = pending.key { ImageCache.shared.put(key, output) }
            writeTranscoded(exchange, capture, body: pending.body, output: output, format: pending.format)
        case .encoded, .failed, .tooManyScans, .tooSlow:
            worker.metrics.imagePassed(Self.passReason(outcome))
            passCaptureThrough(exchange, capture)
        }
        finishExchange(exchange, recycleUpstream: false)
        flushPendingWrites()
    }

    private static func passReason(_ outcome: TranscodeOutcome) -> WorkerMetrics.ImagePassReason {
        switch outcome {
        case .encoded: .notSmaller
        case .failed: .undecodable
        case .tooManyScans: .tooManyScans
        case .tooSlow: .tooSlow
        }
    }

    private func writeTranscoded(_ exchange: Exchange, _ capture: ResponseCapture, body: [UInt8], output: [UInt8],
                                 format: ImageProbe.Format) {
        guard output.count < body.count else {
            worker.metrics.imagePassed(.notSmaller)
            passCaptureThrough(exchange, capture)
            return
        }
        exchange.capture = nil
        var head = capture.origin
        let vary = head.values(of: "vary").filter { !$0.isEmpty }
        head.fields.removeAll { field in
            let name = field.name.lowercased()
            return name == "content-type" || name == "vary"
        }
        head.fields.append(HTTPField(name: "Content-Type", value: format.mediaType))
        let tokens = vary.flatMap { $0.split(separator: ",") }.map { String($0.filter { $0 != " " && $0 != "\t" }).lowercased() }
        let varies = tokens.contains("accept") || tokens.contains("*")
        head.fields.append(HTTPField(name: "Vary", value: (vary + (varies ? [] : ["Accept"])).joined(separator: ", ")))
        let bytes = MessageHeads.relayedResponse(head, keepAlive: exchange.machine.keepAlive,
                                                 clientVersion: exchange.clientVersion, stripTransferEncoding: false,
                                                 variant: "transcoded", framing: .contentLength(UInt64(output.count)))
        evbuffer_add(output_: self.output, bytes)
        evbuffer_add(output_: self.output, output)
        exchange.responseHeadLength = bytes.count
        exchange.variant = "transcoded"
        exchange.bytesOut = UInt64(output.count)
        worker.metrics.saved(.transcoded, bytes: body.count - output.count)
        worker.metrics.imageTranscoded()
    }
}

private func evbuffer_add(output_ buffer: OpaquePointer, _ bytes: [UInt8]) {
    bytes.withUnsafeBytes { _ = evbuffer_add(buffer, $0.baseAddress, $0.count) }
}
