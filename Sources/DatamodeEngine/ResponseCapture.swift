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

    // MARK: which responses are held back

    /// Called with a response head about to be relayed under a manifest `cap`: the capture to buffer its body into
    /// when this response may be a master playlist or MPD, `nil` (stream it) otherwise. `arrived`: the origin's
    /// bytes already read behind the head (a generic type's first bytes usually tell it is no manifest). Only
    /// GETs of a capped mode get here, so every other response pays one `nil` check.
    static func forManifest(_ head: ResponseHead, framing: BodyFraming, strip: Bool, headBytes: [UInt8], cap: UInt64,
                            arrived: OpaquePointer?, metrics: WorkerMetrics) -> ResponseCapture? {
        guard head.status == 200 else { return nil }
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
            if type == .manifest { metrics.manifestPassed(.tooLarge) }
            return nil
        }
        if type == .generic, case .contentLength(let length) = framing, let arrived {
            // Most bodies of a generic type (octet-stream downloads, text) show in their first bytes that they are no
            // manifest. Those bytes usually arrive with the head: looked at in place, such a response streams at once
            // instead of being held back and copied (the capture cost every such response in constrained mode,
            // where the default cap applies: the policy-cost row of bench/run).
            let available = min(evbuffer_get_length(arrived), 512)
            if available > 0 {
                var prefix = [UInt8](repeating: 0, count: available)
                _ = evbuffer_copyout(arrived, &prefix, available)
                if case .notAManifest = ManifestCap.sniff(prefix, complete: UInt64(available) >= length) { return nil }
            }
        }
        let chunked = framing == .chunked && !strip
        return ResponseCapture(purpose: .manifest(cap: cap), passThroughHead: headBytes, origin: head, chunked: chunked,
                               phase: .sniffing, limit: ManifestCap.maximumSize)
    }

    /// Like `forManifest`, for images (SPEC §13): a 200 JPEG, PNG or WebP while transcoding applies.
    static func forImage(_ head: ResponseHead, framing: BodyFraming, strip: Bool, headBytes: [UInt8],
                         settings: ImagesSection, acceptsWebP: Bool, metrics: WorkerMetrics) -> ResponseCapture? {
        guard head.status == 200 else { return nil }
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
            metrics.imagePassed(.tooLarge)
            return nil
        }
        return ResponseCapture(purpose: .image(settings, acceptsWebP: acceptsWebP), passThroughHead: headBytes,
                               origin: head, chunked: framing == .chunked && !strip, phase: .sniffing,
                               limit: settings.maxInput)
    }

    static func mediaTypeEssence(_ value: String) -> String {
        let essence = value.split(separator: ";", maxSplits: 1, omittingEmptySubsequences: false).first ?? ""
        return String(essence.filter { $0 != " " && $0 != "\t" }).lowercased()
    }
}

/// What becomes of a held-back response (SPEC §13): buffered as its body arrives, then rewritten (a capped
/// manifest, a transcoded image) or passed through as the origin sent it; its exchange's driver relays the rest.
extension ResponseCapture {
    /// The driver's `pumpResponseBody` for a held-back response: buffer, decide, and write the response once decided.
    func pump(_ driver: ExchangeDriver, _ upstream: UpstreamConnection) {
        // A held-back body is still the origin's bytes crossing the link: it passes the link profile's bucket and
        // counts against data budgets as it is taken in, exactly as a streamed one does (SPEC §10, §11).
        guard let response = driver.response,
              let step = driver.relay(.down, &response.body, from: upstream.input, to: buffer,
                               room: max(limit + 1 - evbuffer_get_length(buffer), 1), record: false)
        else { return }
        if step.result == .invalid {
            // Nothing was written: the exchange machine retracts (dropping the capture) and answers 502.
            driver.perform(driver.machine.responseBodyStep(step, unwritten: true))
            return
        }
        let buffered = evbuffer_get_length(buffer)
        if buffered > limit {
            switch purpose {
            case .manifest:
                if phase == .buffering || ManifestContentType(origin.values(of: "content-type").first) == .manifest {
                    driver.worker.metrics.manifestPassed(.tooLarge)
                }
            case .image:
                driver.worker.metrics.imagePassed(.tooLarge)
            }
            passThrough(driver)
            driver.perform(driver.machine.responseBodyStep(step, unwritten: false))
            if let response = driver.response, response.capture == nil { driver.pumpResponseBody() }
            return
        }
        let action = driver.machine.responseBodyStep(step, unwritten: false)
        switch action {
        case .finish(let recycle):
            if case .image(let settings, let acceptsWebP) = purpose {
                finishImage(driver, settings, acceptsWebP: acceptsWebP, recycle: recycle)
                return
            }
            finishManifest(driver)
            driver.perform(action)
        case .none:
            guard phase == .sniffing else { return }
            if case .image(let settings, _) = purpose {
                probeEarly(driver, settings, buffered: buffered)
                return
            }
            let window = min(buffered, ResponseCapture.sniffWindow)
            guard let prefix = body(upTo: window, whole: false) else {
                // Broken chunk framing shows up in the relay itself; until then, stream.
                passThrough(driver)
                return
            }
            switch ManifestCap.sniff(prefix, complete: buffered >= ResponseCapture.sniffWindow) {
            case .needMore: return
            case .candidate: phase = .buffering
            case .notAManifest:
                passThrough(driver)
                driver.pumpResponseBody()
            }
        default:
            // Cut short (the origin closed early): what arrived goes out as it came, then the exchange machine truncates.
            passThrough(driver)
            driver.perform(action)
        }
    }

    /// Writes the held-back response as the origin sent it; from here on the body streams.
    func passThrough(_ driver: ExchangeDriver) {
        driver.response?.capture = nil
        evbuffer_add(driver.output, passThroughHead, passThroughHead.count)
        driver.response?.headLength = passThroughHead.count
        evbuffer_add_buffer(driver.output, buffer)
        if let response = driver.response { driver.exchange.bytesOut = response.body.clientBytes }
    }

    /// The whole body is here: write the capped manifest, or the original.
    private func finishManifest(_ driver: ExchangeDriver) {
        guard let body = body(whole: true) else {
            passThrough(driver)
            return
        }
        guard case .manifest(let cap) = purpose else { return }
        switch ManifestCap.rewrite(body, cap: cap) {
        case .rewritten(let kind, let rewritten, _):
            driver.response?.capture = nil
            let head = MessageHeads.relayedResponse(origin, keepAlive: driver.machine.keepAlive,
                                                    clientVersion: driver.exchange.clientVersion, stripTransferEncoding: false,
                                                    variant: kind.variantName,
                                                    framing: .contentLength(UInt64(rewritten.count)))
            evbuffer_add(driver.output, head, head.count)
            evbuffer_add(driver.output, rewritten, rewritten.count)
            driver.response?.headLength = head.count
            driver.exchange.variant = kind.variantName
            driver.exchange.bytesOut = UInt64(rewritten.count)
            driver.worker.metrics.saved(kind == .hls ? .hlsCap : .dashCap, bytes: body.count - rewritten.count)
        case .malformed:
            driver.worker.metrics.manifestPassed(.malformed)
            passThrough(driver)
        case .unchanged, .notAManifest:
            passThrough(driver)
        }
    }

    // MARK: images: probed from their header, transcoded on the pool, written back on the worker's loop

    /// Enough of the image to read its header: decide now whether it may be decoded at all, so that a
    /// decompression bomb or an animation is streamed on instead of buffered.
    private func probeEarly(_ driver: ExchangeDriver, _ settings: ImagesSection, buffered: Int) {
        guard buffered >= 64 * 1024, let prefix = body(upTo: 256 * 1024, whole: false) else { return }
        guard let probe = ImageProbe(prefix) else {
            if buffered >= 256 * 1024 {
                driver.worker.metrics.imagePassed(.undecodable)
                passThrough(driver)
                driver.pumpResponseBody()
            }
            return
        }
        if let reason = Self.refusal(probe, settings) {
            driver.worker.metrics.imagePassed(reason)
            passThrough(driver)
            driver.pumpResponseBody()
            return
        }
        phase = .buffering
    }

    private static func refusal(_ probe: ImageProbe, _ settings: ImagesSection) -> WorkerMetrics.ImagePassReason? {
        if probe.width * probe.height > settings.maxPixels { return .tooManyPixels }
        if probe.animated { return .animated }
        return nil
    }

    /// The whole image is here: answer from the cache, or send it to the pool (the exchange finishes when the
    /// result is back), or pass it through.
    private func finishImage(_ driver: ExchangeDriver, _ settings: ImagesSection,
                             acceptsWebP: Bool, recycle: Bool) {
        guard let body = body(whole: true), let probe = ImageProbe(body) else {
            driver.worker.metrics.imagePassed(.undecodable)
            passThrough(driver)
            driver.perform(.finish(recycleUpstream: recycle))
            return
        }
        if let reason = Self.refusal(probe, settings) {
            driver.worker.metrics.imagePassed(reason)
            passThrough(driver)
            driver.perform(.finish(recycleUpstream: recycle))
            return
        }
        let output: ImageProbe.Format
        switch settings.format {
        case .auto: output = acceptsWebP ? .webp : probe.format
        case .original: output = probe.format
        case .jpeg: output = .jpeg
        }
        let etag = origin.values(of: "etag").first
        let lastModified = origin.values(of: "last-modified").first
        let key = etag == nil && lastModified == nil ? nil
            : ImageCache.Key(url: driver.exchange.url, etag: etag, lastModified: lastModified, format: output,
                             maxWidth: settings.maxWidth, quality: settings.quality)
        if let key, let cached = ImageCache.shared.get(key) {
            driver.worker.metrics.imageCacheHit()
            writeTranscoded(driver, body: body, output: cached, format: output)
            driver.perform(.finish(recycleUpstream: recycle))
            return
        }
        // The origin's part is over: its connection goes back to the pool while the image is transcoded.
        driver.heldLease?.release(recycle: recycle)
        pendingImage = (body, key, output)
        let job = ImageJob(input: body, probe: probe, maxWidth: settings.maxWidth, quality: settings.quality,
                           output: output, worker: driver.worker, token: ImageJobToken(driver: driver))
        guard ImageTranscoder.shared.submit(job) else {
            driver.worker.metrics.imagePassed(.busy)
            passThrough(driver)
            driver.finishExchange(recycleUpstream: false)
            return
        }
    }

    /// A result from the pool, on this connection's worker loop. Whatever did not become a smaller image (a
    /// failure, a limit hit) sends the original bytes, counted by why.
    func imageTranscoded(_ driver: ExchangeDriver, outcome: TranscodeOutcome) {
        guard !driver.session.released, driver.isCurrent, driver.response?.capture === self,
              let pending = pendingImage else { return }
        pendingImage = nil
        switch outcome {
        case .encoded(let output) where output.count < pending.body.count:
            if let key = pending.key { ImageCache.shared.put(key, output) }
            writeTranscoded(driver, body: pending.body, output: output, format: pending.format)
        case .encoded, .failed, .tooManyScans, .tooSlow:
            driver.worker.metrics.imagePassed(Self.passReason(outcome))
            passThrough(driver)
        }
        driver.finishExchange(recycleUpstream: false)
        driver.session.flushPendingWrites()
    }

    private static func passReason(_ outcome: TranscodeOutcome) -> WorkerMetrics.ImagePassReason {
        switch outcome {
        case .encoded: .notSmaller
        case .failed: .undecodable
        case .tooManyScans: .tooManyScans
        case .tooSlow: .tooSlow
        }
    }

    private func writeTranscoded(_ driver: ExchangeDriver, body: [UInt8], output: [UInt8],
                                 format: ImageProbe.Format) {
        guard output.count < body.count else {
            driver.worker.metrics.imagePassed(.notSmaller)
            passThrough(driver)
            return
        }
        driver.response?.capture = nil
        var head = origin
        let vary = head.values(of: "vary").filter { !$0.isEmpty }
        head.fields.removeAll { field in
            let name = field.name.lowercased()
            return name == "content-type" || name == "vary"
        }
        head.fields.append(HTTPField(name: "Content-Type", value: format.mediaType))
        let tokens = vary.flatMap { $0.split(separator: ",") }.map { String($0.filter { $0 != " " && $0 != "\t" }).lowercased() }
        let varies = tokens.contains("accept") || tokens.contains("*")
        head.fields.append(HTTPField(name: "Vary", value: (vary + (varies ? [] : ["Accept"])).joined(separator: ", ")))
        let bytes = MessageHeads.relayedResponse(head, keepAlive: driver.machine.keepAlive,
                                                 clientVersion: driver.exchange.clientVersion, stripTransferEncoding: false,
                                                 variant: "transcoded", framing: .contentLength(UInt64(output.count)))
        evbuffer_add(output_: driver.output, bytes)
        evbuffer_add(output_: driver.output, output)
        driver.response?.headLength = bytes.count
        driver.exchange.variant = "transcoded"
        driver.exchange.bytesOut = UInt64(output.count)
        driver.worker.metrics.saved(.transcoded, bytes: body.count - output.count)
        driver.worker.metrics.imageTranscoded()
    }
}

private func evbuffer_add(output_ buffer: OpaquePointer, _ bytes: [UInt8]) {
    bytes.withUnsafeBytes { _ = evbuffer_add(buffer, $0.baseAddress, $0.count) }
}
