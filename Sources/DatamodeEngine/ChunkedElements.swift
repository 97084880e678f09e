import CLibevent
import DatamodeHTTP

/// Reads a chunked body (RFC 9112 §7.1) element by element from the front of a buffer, for the HTTP/2 streams that
/// turn an HTTP/1.1 message the engine wrote into DATA and trailers (`HTTP2Stream`'s responses, `HTTP2OriginStream`'s
/// requests). The chunk data is left in place for the caller to move; framing elements are parsed strictly
/// (`ChunkedDecoder`) and removed.
enum ChunkedElements {
    enum Step {
        /// This many bytes at the front are chunk data (at least one): move them on, then `consumeData`.
        case data(Int)
        /// A framing element (a size line, a chunk's CRLF) was read and removed.
        case framing
        /// The last chunk and its trailer section were read and removed: the body is over.
        case end(trailers: [HTTPField])
        /// More bytes are needed.
        case needMore
        /// The framing is invalid, or an element is larger than the limit.
        case invalid(String)
    }

    static func next(_ input: OpaquePointer, _ decoder: inout ChunkedDecoder) -> Step {
        let available = evbuffer_get_length(input)
        guard available > 0 else { return .needMore }
        if decoder.dataRemaining > 0 {
            return .data(Int(min(UInt64(available), decoder.dataRemaining)))
        }
        // The element is parsed where it lies when it fits the buffer's first chain (a size line almost always
        // does); only an element that spans chains is made contiguous, growing, up to the limit: pulling up the
        // limit at once would copy the chunk data behind every size line.
        let limit = 4096 + decoder.maxTrailerSection + 8
        var window = min(available, limit, max(evbuffer_get_contiguous_space(input), 1))
        var parsed: ChunkedFramingResult = .needMore
        var start: UnsafeMutablePointer<UInt8>?
        while true {
            start = evbuffer_pullup(input, window)
            guard let start else { return .needMore }
            parsed = decoder.parseFraming(UnsafeRawBufferPointer(start: start, count: window))
            guard case .needMore = parsed, window < min(available, limit) else { break }
            window = min(window * 2 + 64, available, limit)
        }
        switch parsed {
        case .needMore:
            return available >= limit ? .invalid("a chunk framing element is larger than the limit") : .needMore
        case .framing(let length):
            evbuffer_drain(input, length)
            return .framing
        case .end(let length):
            // The relay that wrote the text has left out what no trailer may carry on (`BodyRelay`); were anything
            // left, it goes here too, before the head parser reads the section (`Content-Length` beside
            // `Transfer-Encoding` would make it refuse every field).
            let element = UnsafeRawBufferPointer(start: start!, count: length)
            let trailers = decoder.dropsTrailerFields
                ? TrailerSection.withoutDroppedFields(element).map { $0.element.withUnsafeBytes { Self.trailers($0) } } ?? []
                : Self.trailers(element)
            evbuffer_drain(input, length)
            return .end(trailers: trailers)
        case .invalid(let error):
            return .invalid("\(error)")
        }
    }

    /// The last-chunk element (`0` line, trailer fields, CRLF) as fields, read by the strict head parser.
    static func trailers(_ element: UnsafeRawBufferPointer) -> [HTTPField] {
        guard let lineEnd = element.firstIndex(of: UInt8(ascii: "\n")), lineEnd + 1 < element.count - 2 else { return [] }
        let section = Array("HTTP/1.1 200 T\r\n".utf8) + Array(element[(lineEnd + 1)...])
        let parsed = section.withUnsafeBytes { HTTP1Parser.parseResponseHead($0, limits: Flow.responseLimits) }
        if case .complete(let head, _) = parsed { return head.fields }
        return []
    }
}
