import DatamodeHTTP

/// The relay of an origin's head from its bytes (`HTTP1Parser.parseResponseHeadSpans`, `ResponseHeadSpans`,
/// `MessageHeads.relayedResponse(_:in:...)`) against the reference, the head's Strings (`parseResponseHead`,
/// `ResponseHead.bodyFraming`, `connectionTokens`, `MessageHeads.relayedResponse`): the same verdict at the same
/// byte, the same head, framing and `Connection` options, and byte for byte the same relayed text for every
/// option the engine relays with. `package`: `SpannedRelayDifferentialTests` and the fuzz target run it.
package enum SpannedHeadCheck {
    /// What differs between the two readings of `bytes` under `limits`, or nil.
    package static func disagreement(_ bytes: UnsafeRawBufferPointer, limits: HTTPLimits) -> String? {
        var writer = HeadWriter(capacity: 64)
        return disagreement(bytes, limits: limits, reusing: &writer)
    }

    /// `disagreement`, the engine's way of writing the relayed text included: into `writer`, reset and reused
    /// (the worker keeps one, `Worker.relayedHeadWriter`); pass the same writer for many heads.
    package static func disagreement(_ bytes: UnsafeRawBufferPointer, limits: HTTPLimits,
                                     reusing writer: inout HeadWriter) -> String? {
        let reference = HTTP1Parser.parseResponseHead(bytes, limits: limits)
        let spanned = HTTP1Parser.parseResponseHeadSpans(bytes, limits: limits)
        switch (reference, spanned) {
        case (.incomplete, .incomplete):
            return nil
        case (.invalid(let a), .invalid(let b)):
            return a == b ? nil : "refused differently: \(a) against \(b)"
        case (.complete(let head, let length), .complete(let spans, let spannedLength)):
            guard length == spannedLength else { return "lengths \(length) against \(spannedLength)" }
            let built = spans.head(in: bytes)
            guard built == head else { return "heads differ: \(head) against \(built)" }
            return relayDisagreement(head, spans, bytes, &writer)
        default:
            return "verdicts differ: \(reference) against \(spanned)"
        }
    }

    private static func relayDisagreement(_ head: ResponseHead, _ spans: ResponseHeadSpans,
                                          _ bytes: UnsafeRawBufferPointer, _ writer: inout HeadWriter) -> String? {
        let tokens = head.connectionTokens
        guard spans.connectionTokens(in: bytes) == tokens else { return "Connection options differ" }
        for method in ["GET", "HEAD", "CONNECT", "POST"] {
            let framing = head.bodyFraming(requestMethod: method)
            guard spans.bodyFraming(in: bytes, requestMethod: method) == framing else {
                return "framing for \(method) differs: \(framing) against \(spans.bodyFraming(in: bytes, requestMethod: method))"
            }
            guard case .success(let f) = framing, head.status >= 200 else { continue }
            for clientVersion in [HTTPVersion.http11, .http10] {
                let strip = clientVersion == .http10 && f == .chunked
                for keepAlive in [true, false] {
                    for held: Int64? in [nil, 250] {
                        let text = MessageHeads.relayedResponse(head, keepAlive: keepAlive, clientVersion: clientVersion,
                                                                stripTransferEncoding: strip, variant: nil, framing: f,
                                                                connectionTokens: tokens, heldMilliseconds: held)
                        let fromBytes = MessageHeads.relayedResponse(spans, in: bytes, keepAlive: keepAlive,
                                                                     clientVersion: clientVersion, stripTransferEncoding: strip,
                                                                     framing: f, connectionTokens: tokens, heldMilliseconds: held)
                        writer.reset()
                        MessageHeads.relayedResponse(spans, in: bytes, keepAlive: keepAlive, clientVersion: clientVersion,
                                                     stripTransferEncoding: strip, framing: f, connectionTokens: tokens,
                                                     heldMilliseconds: held, into: &writer)
                        guard writer.withBytes({ Array($0) }) == text else { return "relayed text differs when written again" }
                        guard fromBytes == text else {
                            return "relayed text differs (\(method), \(clientVersion), keep-alive \(keepAlive)): "
                                + "\(String(decoding: text, as: UTF8.self).debugDescription) against "
                                + "\(String(decoding: fromBytes, as: UTF8.self).debugDescription)"
                        }
                    }
                }
            }
        }
        return nil
    }
}
