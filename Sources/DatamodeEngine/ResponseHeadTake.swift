import CLibevent
import DatamodeHTTP

/// Takes an origin's next response head (an interim 1xx or the final one) from its `UpstreamConnection`: a head an
/// origin's HTTP/2 stream handed over, else the text at the front of the connection's input, parsed strictly and
/// bounded (`FrontParse`) and then drained. A final head or a `101` stops the connection's response timer.
/// Read through its Strings (`strings`) or as offsets into the bytes (`spans`, `OriginResponse.startFromBytes`).
enum ResponseHeadTake {
    static func strings(from upstream: UpstreamConnection) -> HeadParseResult<ResponseHead> {
        if let (head, length) = upstream.takeHandedHead() {
            if endsWaiting(head.status) { upstream.responseHeadReceived() }
            return .complete(head, length: length)
        }
        let result = front(upstream) { HTTP1Parser.parseResponseHead($0, limits: Flow.responseLimits) }
        if case .complete(let head, let length) = result {
            evbuffer_drain(upstream.input, length)
            if endsWaiting(head.status) { upstream.responseHeadReceived() }
        }
        return result
    }

    /// `strings` for a relay from the head's bytes: the head at the front of the input is read as offsets
    /// (`HTTP1Parser.parseResponseHeadSpans`), and `use` gets them with the bytes they point into, which stay there
    /// until it returns; then a complete head is drained (unless `use` closed the connection). Nil while heads are
    /// handed over (an origin's HTTP/2 stream): `strings` reads those.
    static func spans<R>(from upstream: UpstreamConnection,
                         _ use: (HeadParseResult<ResponseHeadSpans>, UnsafeRawBufferPointer) -> R) -> R? {
        guard !upstream.hasHandedHeads else { return nil }
        let result = front(upstream) { HTTP1Parser.parseResponseHeadSpans($0, limits: Flow.responseLimits) }
        guard case .complete(let head, let length) = result else { return use(result, UnsafeRawBufferPointer(start: nil, count: 0)) }
        if endsWaiting(head.status) { upstream.responseHeadReceived() }
        // FrontParse made the head's bytes contiguous at the front: pulling them up again only returns where.
        let bytes = UnsafeRawBufferPointer(start: evbuffer_pullup(upstream.input, length), count: length)
        let used = use(result, bytes)
        // A head refused for its framing closed the connection, and its input with it.
        if upstream.state != .closed { evbuffer_drain(upstream.input, length) }
        return used
    }

    private static func endsWaiting(_ status: Int) -> Bool { status >= 200 || status == 101 }

    private static func front<H>(_ upstream: UpstreamConnection,
                                 _ parse: (UnsafeRawBufferPointer) -> HeadParseResult<H>) -> HeadParseResult<H> {
        FrontParse.parse(upstream.input, limit: Flow.maxResponseHeadBytes, incomplete: .incomplete,
                         isIncomplete: { if case .incomplete = $0 { true } else { false } }, parse)
    }
}
