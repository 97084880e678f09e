import CLibevent
import DatamodeConfig
import DatamodeHTTP
import DatamodeMedia
import DatamodeState

/// Automatic low-res on the response path (SPEC §13): the one hook where a response may be held back.
extension ExchangeDriver {
    /// Called with a response head about to be relayed: returns the capture to buffer its body into when this
    /// response may be a master playlist or MPD under a cap, `nil` (stream it) otherwise. Only GETs of a capped
    /// mode get here, so every other response pays one `nil` check.
    func manifestCapture(_ head: ResponseHead, framing: BodyFraming, strip: Bool,
                         headBytes: [UInt8]) -> ResponseCapture? {
        guard let cap = manifestCap, exchange.variant == nil, head.status == 200 else { return nil }
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
        if type == .generic, case .contentLength(let length) = framing, let upstream = upstream {
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
    func imageCapture(_ head: ResponseHead, framing: BodyFraming, strip: Bool,
                      headBytes: [UInt8]) -> ResponseCapture? {
        guard let settings = imageSettings, exchange.variant == nil, head.status == 200 else { return nil }
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
        return ResponseCapture(purpose: .image(settings, acceptsWebP: acceptsWebP), passThroughHead: headBytes,
                               origin: head, chunked: framing == .chunked && !strip, phase: .sniffing,
                               limit: settings.maxInput)
    }

    static func mediaTypeEssence(_ value: String) -> String {
        let essence = value.split(separator: ";", maxSplits: 1, omittingEmptySubsequences: false).first ?? ""
        return String(essence.filter { $0 != " " && $0 != "\t" }).lowercased()
    }

    /// `pumpResponseBody` for a captured response: buffer, decide, and write the response once decided.
    func pumpCapture(_ capture: ResponseCapture, _ upstream: UpstreamConnection) {
        // A held-back body is still the origin's bytes crossing the link: it passes the link profile's bucket and
        // counts against data budgets as it is taken in, exactly as a streamed one does (SPEC §10, §11).
        guard let step = relay(.down, &responseBody, from: upstream.input, to: capture.buffer,
                               room: max(capture.limit + 1 - evbuffer_get_length(capture.buffer), 1), record: false)
        else { return }
        if step.result == .invalid {
            // Nothing was written: the machine retracts (dropping the capture) and answers 502.
            perform(machine.responseBodyStep(step, unwritten: true))
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
            passCaptureThrough(capture)
            perform(machine.responseBodyStep(step, unwritten: false))
            if self.capture == nil, response != nil { pumpResponseBody() }
            return
        }
        let action = machine.responseBodyStep(step, unwritten: false)
        switch action {
        case .finish(let recycle):
            if case .image(let settings, let acceptsWebP) = capture.purpose {
                finishImage(capture, settings, acceptsWebP: acceptsWebP, recycle: recycle)
                return
            }
            finishCapture(capture)
            perform(action)
        case .none:
            guard capture.phase == .sniffing else { return }
            if case .image(let settings, _) = capture.purpose {
                probeEarly(capture, settings, buffered: buffered)
                return
            }
            let window = min(buffered, ResponseCapture.sniffWindow)
            guard let prefix = capture.body(upTo: window, whole: false) else {
                // Broken chunk framing shows up in the relay itself; until then, stream.
                passCaptureThrough(capture)
                return
            }
            switch ManifestCap.sniff(prefix, complete: buffered >= ResponseCapture.sniffWindow) {
            case .needMore: return
            case .candidate: capture.phase = .buffering
            case .notAManifest:
                passCaptureThrough(capture)
                pumpResponseBody()
            }
        default:
            // Cut short (the origin closed early): what arrived goes out as it came, then the machine truncates.
            passCaptureThrough(capture)
            perform(action)
        }
    }

    /// Writes the held-back response as the origin sent it; from here on the body streams.
    func passCaptureThrough(_ capture: ResponseCapture) {
        self.capture = nil
        evbuffer_add(output, capture.passThroughHead, capture.passThroughHead.count)
        responseHeadLength = capture.passThroughHead.count
        evbuffer_add_buffer(output, capture.buffer)
        exchange.bytesOut = responseBody.transferred
    }

    /// The whole body is here: write the capped manifest, or the original.
    private func finishCapture(_ capture: ResponseCapture) {
        guard let body = capture.body(whole: true) else {
            passCaptureThrough(capture)
            return
        }
        guard case .manifest(let cap) = capture.purpose else { return }
        switch ManifestCap.rewrite(body, cap: cap) {
        case .rewritten(let kind, let rewritten, _):
            self.capture = nil
            let head = MessageHeads.relayedResponse(capture.origin, keepAlive: machine.keepAlive,
                                                    clientVersion: exchange.clientVersion, stripTransferEncoding: false,
                                                    variant: kind.variantName,
                                                    framing: .contentLength(UInt64(rewritten.count)))
            evbuffer_add(output, head, head.count)
            evbuffer_add(output, rewritten, rewritten.count)
            responseHeadLength = head.count
            exchange.variant = kind.variantName
            exchange.bytesOut = UInt64(rewritten.count)
            worker.metrics.saved(kind == .hls ? .hlsCap : .dashCap, bytes: body.count - rewritten.count)
        case .malformed:
            worker.metrics.manifestPassed(.malformed)
            passCaptureThrough(capture)
        case .unchanged, .notAManifest:
            passCaptureThrough(capture)
        }
    }
}

/// Images (SPEC §13): probed from their header, transcoded on the pool, written back on the worker's loop.
extension ExchangeDriver {
    /// Enough of the image to read its header: decide now whether it may be decoded at all, so that a
    /// decompression bomb or an animation is streamed on instead of buffered.
    private func probeEarly(_ capture: ResponseCapture, _ settings: ImagesSection, buffered: Int) {
        guard buffered >= 64 * 1024, let prefix = capture.body(upTo: 256 * 1024, whole: false) else { return }
        guard let probe = ImageProbe(prefix) else {
            if buffered >= 256 * 1024 {
                worker.metrics.imagePassed(.undecodable)
                passCaptureThrough(capture)
                pumpResponseBody()
            }
            return
        }
        if let reason = Self.refusal(probe, settings) {
            worker.metrics.imagePassed(reason)
            passCaptureThrough(capture)
            pumpResponseBody()
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
    private func finishImage(_ capture: ResponseCapture, _ settings: ImagesSection,
                             acceptsWebP: Bool, recycle: Bool) {
        guard let body = capture.body(whole: true), let probe = ImageProbe(body) else {
            worker.metrics.imagePassed(.undecodable)
            passCaptureThrough(capture)
            perform(.finish(recycleUpstream: recycle))
            return
        }
        if let reason = Self.refusal(probe, settings) {
            worker.metrics.imagePassed(reason)
            passCaptureThrough(capture)
            perform(.finish(recycleUpstream: recycle))
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
            writeTranscoded(capture, body: body, output: cached, format: output)
            perform(.finish(recycleUpstream: recycle))
            return
        }
        // The origin's part is over: its connection goes back to the pool while the image is transcoded.
        releaseUpstream(recycle: recycle)
        capture.pendingImage = (body, key, output)
        let job = ImageJob(input: body, probe: probe, maxWidth: settings.maxWidth, quality: settings.quality,
                           output: output, worker: worker, token: ImageJobToken(driver: self))
        guard ImageTranscoder.shared.submit(job) else {
            worker.metrics.imagePassed(.busy)
            passCaptureThrough(capture)
            finishExchange(recycleUpstream: false)
            return
        }
    }

    /// A result from the pool, on this connection's worker loop. Whatever did not become a smaller image (a
    /// failure, a limit hit) sends the original bytes, counted by why.
    func imageTranscoded(outcome: TranscodeOutcome) {
        guard !client.released, isCurrent, let capture,
              let pending = capture.pendingImage else { return }
        capture.pendingImage = nil
        switch outcome {
        case .encoded(let output) where output.count < pending.body.count:
            if let key = pending.key { ImageCache.shared.put(key, output) }
            writeTranscoded(capture, body: pending.body, output: output, format: pending.format)
        case .encoded, .failed, .tooManyScans, .tooSlow:
            worker.metrics.imagePassed(Self.passReason(outcome))
            passCaptureThrough(capture)
        }
        finishExchange(recycleUpstream: false)
        client.flushPendingWrites()
    }

    private static func passReason(_ outcome: TranscodeOutcome) -> WorkerMetrics.ImagePassReason {
        switch outcome {
        case .encoded: .notSmaller
        case .failed: .undecodable
        case .tooManyScans: .tooManyScans
        case .tooSlow: .tooSlow
        }
    }

    private func writeTranscoded(_ capture: ResponseCapture, body: [UInt8], output: [UInt8],
                                 format: ImageProbe.Format) {
        guard output.count < body.count else {
            worker.metrics.imagePassed(.notSmaller)
            passCaptureThrough(capture)
            return
        }
        self.capture = nil
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
        let bytes = MessageHeads.relayedResponse(head, keepAlive: machine.keepAlive,
                                                 clientVersion: exchange.clientVersion, stripTransferEncoding: false,
                                                 variant: "transcoded", framing: .contentLength(UInt64(output.count)))
        evbuffer_add(output_: self.output, bytes)
        evbuffer_add(output_: self.output, output)
        responseHeadLength = bytes.count
        exchange.variant = "transcoded"
        exchange.bytesOut = UInt64(output.count)
        worker.metrics.saved(.transcoded, bytes: body.count - output.count)
        worker.metrics.imageTranscoded()
    }
}

private func evbuffer_add(output_ buffer: OpaquePointer, _ bytes: [UInt8]) {
    bytes.withUnsafeBytes { _ = evbuffer_add(buffer, $0.baseAddress, $0.count) }
}
