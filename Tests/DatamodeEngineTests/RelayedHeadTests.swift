import DatamodeHTTP
@testable import DatamodeEngine
import Testing

/// An HTTP/2 stream's exchange hands the relayed response head over in memory (`MessageHeads.relayedResponseHead`)
/// where a connection's writes its text (`relayedResponse`); one function writes both. The head must be exactly what
/// the text says, for every option that changes the text, or an h2 client and an HTTP/1.1 client would be told
/// different things.
@Suite struct RelayedHeadTests {
    static let origin = ResponseHead(version: .http11, status: 200, reason: "OK", fields: [
        HTTPField(name: "Content-Type", value: "image/jpeg"),
        HTTPField(name: "Connection", value: "x-hop, keep-alive"),
        HTTPField(name: "X-Hop", value: "1"),
        HTTPField(name: "Keep-Alive", value: "timeout=5"),
        HTTPField(name: "Transfer-Encoding", value: "chunked"),
        HTTPField(name: "Content-Length", value: "12"),
        HTTPField(name: "ETag", value: "\"a\""),
        HTTPField(name: "Cache-Control", value: "max-age=60"),
        HTTPField(name: "Data-Mode-Variant", value: "forged"),
        HTTPField(name: "Set-Cookie", value: "a=b"),
    ])

    @Test(arguments: [false, true], [nil, "low"] as [String?])
    func theHandedHeadIsTheTextsHead(keepAlive: Bool, variant: String?) {
        for framing: BodyFraming? in [nil, .contentLength(12), .chunked, .untilClose, BodyFraming.none] {
            for strip in [false, true] {
                for held: Int64? in [nil, 250] {
                    let text = MessageHeads.relayedResponse(Self.origin, keepAlive: keepAlive, clientVersion: .http11,
                                                            stripTransferEncoding: strip, variant: variant, framing: framing,
                                                            heldMilliseconds: held)
                    let head = MessageHeads.relayedResponseHead(Self.origin, keepAlive: keepAlive, clientVersion: .http11,
                                                                stripTransferEncoding: strip, variant: variant, framing: framing,
                                                                heldMilliseconds: held)
                    #expect(head.serialized() == text, "framing \(String(describing: framing)) strip \(strip) held \(String(describing: held))")
                    let parsed = text.withUnsafeBytes { HTTP1Parser.parseResponseHead($0, limits: Flow.relayedResponseLimits) }
                    guard case .complete(let back, let length) = parsed else {
                        Issue.record("the text does not parse: \(parsed)")
                        continue
                    }
                    #expect(back == head)
                    #expect(HeadHandoff.response(head, limits: Flow.relayedResponseLimits, maxHeadBytes: Flow.maxRelayedResponseHeadBytes) == length)
                }
            }
        }
    }

    /// A reason phrase may start or end with whitespace (RFC 9112 §4: `reason-phrase = 1*( HTAB / SP / VCHAR /
    /// obs-text )`); it is relayed as read. Debug builds asserted a field value's rule on it (no whitespace at the
    /// ends) and stopped on `HTTP/1.1 200 OK ` from an origin; `SpannedRelayDifferentialTests` found it.
    @Test(arguments: ["OK ", " OK", "\tOK", ""])
    func aReasonIsRelayedAsRead(_ reason: String) {
        let origin = ResponseHead(version: .http11, status: 200, reason: reason, fields: [])
        let text = MessageHeads.relayedResponse(origin, keepAlive: true, clientVersion: .http11, stripTransferEncoding: false,
                                                variant: nil, framing: .contentLength(0))
        #expect(text.starts(with: Array("HTTP/1.1 200 \(reason)\r\n".utf8)))
        guard case .complete(let back, _) = text.withUnsafeBytes({ HTTP1Parser.parseResponseHead($0, limits: Flow.responseLimits) })
        else {
            Issue.record("the relayed head does not parse")
            return
        }
        #expect(back.reason == reason)
    }

    /// An origin head at the origin-side limits (300 fields, a 128 KiB section) is relayed with every field the proxy
    /// may add; an HTTP/2 stream must read that back (`Flow.relayedResponseLimits`), or a head an HTTP/1.1 client gets
    /// whole would reset the stream of an h2 client.
    @Test func aHeadAtTheOriginLimitsFitsWhatAStreamReadsBack() {
        let limits = Flow.responseLimits
        var fields = [HTTPField(name: "Content-Length", value: "12")]
        // 299 more fields, the last one filling the section to its limit.
        for i in 1..<(limits.headerCount - 1) { fields.append(HTTPField(name: "x-f\(i)", value: "v")) }
        let used = fields.reduce(2) { $0 + $1.name.utf8.count + $1.value.utf8.count + 4 }
        fields.append(HTTPField(name: "x-fill", value: String(repeating: "f", count: limits.headerSection - used - 10)))
        let origin = ResponseHead(version: .http11, status: 200, reason: "OK", fields: fields)
        let originText = origin.serialized()
        guard case .complete = originText.withUnsafeBytes({ HTTP1Parser.parseResponseHead($0, limits: limits) }) else {
            Issue.record("the origin's head must be within the origin-side limits")
            return
        }
        let text = MessageHeads.relayedResponse(origin, keepAlive: false, clientVersion: .http11, stripTransferEncoding: false,
                                                variant: "a-long-variant-name-from-the-configuration", framing: .contentLength(12),
                                                heldMilliseconds: 123_456)
        let parsed = text.withUnsafeBytes { HTTP1Parser.parseResponseHead($0, limits: Flow.relayedResponseLimits) }
        guard case .complete(_, let length) = parsed else {
            Issue.record("the relayed head does not fit what a stream reads back: \(parsed)")
            return
        }
        #expect(length <= Flow.maxRelayedResponseHeadBytes)
    }
}
