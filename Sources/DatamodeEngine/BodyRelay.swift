import CLibevent
import DatamodeHTTP

/// Moves one message body from a source evbuffer to a destination evbuffer without copying the data:
/// chunks of the source buffer are handed over with `evbuffer_remove_buffer`, only framing bytes
/// (chunk-size lines, trailers) are looked at, and only those are ever made contiguous.
///
/// The framing is validated as it passes (RFC 9112 §7.1): a bad chunk size aborts the relay, so the peer on
/// the other side never receives a stream that a different parser could split differently (smuggling). A trailer
/// section with fields no trailer may carry on goes out without them (`TrailerSection`), the one framing rewritten.
/// `package`: the fuzz target (DatamodeFuzz) drives it beside the reference decoder.
package struct BodyRelay {
    enum Mode {
        /// Exactly this many bytes remain.
        case length(UInt64)
        /// Chunked; `stripFraming` removes the chunk framing (for an HTTP/1.0 client, which cannot read it).
        case chunked(ChunkedDecoder, stripFraming: Bool)
        /// Until the source closes.
        case untilClose
        /// Nothing (left) to move.
        case done
    }

    package enum Progress: Equatable {
        /// Some or no bytes moved; the body is not complete.
        case inProgress
        /// The body is complete (for `.untilClose`: never; the caller decides at EOF).
        case complete
        /// The framing is invalid.
        case invalid(HTTPWireError)
    }

    private(set) var mode: Mode
    /// Bytes taken from the source so far (framing included).
    package private(set) var transferred: UInt64 = 0
    /// Bytes put into the destination so far (framing that is stripped is not).
    package private(set) var delivered: UInt64 = 0
    /// Body bytes moved without the chunked framing around them (chunk-size lines, the last chunk, trailers).
    package private(set) var payload: UInt64 = 0
    /// The trailer fields left out of a chunked body's trailer section (`TrailerSection`), as received.
    package private(set) var droppedTrailerFields: [String] = []
    /// The client's side of this body is an HTTP/2 stream (SPEC §17): it sends or receives the body as DATA, and
    /// the chunked framing the exchange sees is the stream's own (`HTTP2Stream`), never the client's.
    let overHTTP2: Bool

    /// What the access log and the metrics count of this body (SPEC §8: the body bytes from or to the client): as
    /// framed on an HTTP/1 client's wire, the DATA payload for an HTTP/2 client.
    var clientBytes: UInt64 { overHTTP2 ? payload : transferred }

    package init(framing: BodyFraming, stripChunkFraming: Bool = false, overHTTP2: Bool = false) {
        self.overHTTP2 = overHTTP2
        switch framing {
        case .none, .contentLength(0): mode = .done
        case .contentLength(let n): mode = .length(n)
        case .chunked: mode = .chunked(ChunkedDecoder(), stripFraming: stripChunkFraming)
        case .untilClose: mode = .untilClose
        }
    }

    var isComplete: Bool {
        if case .done = mode { return true }
        return false
    }

    /// Moves what `source` holds, at most `budget` bytes of payload (backpressure: the caller passes the room
    /// left in the destination). `destination == nil` discards (a rejected request's body).
    package mutating func pump(from source: OpaquePointer, to destination: OpaquePointer?, budget: Int) -> Progress {
        var budget = budget
        while true {
            let available = evbuffer_get_length(source)
            switch mode {
            case .done:
                return .complete
            case .untilClose:
                let n = min(available, budget)
                if n > 0 { move(n, from: source, to: destination) }
                return .inProgress
            case .length(let remaining):
                let n = Int(min(UInt64(min(available, budget)), remaining))
                if n > 0 { move(n, from: source, to: destination) }
                let left = remaining - UInt64(n)
                if left == 0 {
                    mode = .done
                    return .complete
                }
                mode = .length(left)
                return .inProgress
            case .chunked(var decoder, let strip):
                if decoder.dataRemaining > 0 {
                    let n = Int(min(UInt64(min(available, budget)), decoder.dataRemaining))
                    guard n > 0 else { return .inProgress }
                    move(n, from: source, to: destination)
                    decoder.consumeData(n)
                    budget -= n
                    mode = .chunked(decoder, stripFraming: strip)
                    continue
                }
                guard available > 0 else { return .inProgress }
                let result = Self.parseFraming(&decoder, source)
                switch result {
                case .needMore:
                    mode = .chunked(decoder, stripFraming: strip)
                    return .inProgress
                case .framing(let length):
                    if strip { drain(length, from: source) } else { move(length, from: source, to: destination, framing: true) }
                    mode = .chunked(decoder, stripFraming: strip)
                case .end(let length):
                    if strip {
                        drain(length, from: source)
                    } else if decoder.dropsTrailerFields {
                        moveWithoutDroppedTrailers(length, from: source, to: destination)
                    } else {
                        move(length, from: source, to: destination, framing: true)
                    }
                    mode = .done
                    return .complete
                case .invalid(let error):
                    mode = .chunked(decoder, stripFraming: strip)
                    return .invalid(error)
                }
            }
        }
    }

    /// Parses the framing element at the front of `source`, looking first at the contiguous first chain and
    /// making more contiguous only when the element spans chains (bounded by the decoder's own limits).
    private static func parseFraming(_ decoder: inout ChunkedDecoder, _ source: OpaquePointer) -> ChunkedFramingResult {
        FrontParse.parse(source, limit: 72 * 1024, incomplete: .needMore, isIncomplete: { $0 == .needMore }) {
            decoder.parseFraming($0)
        }
    }

    /// From here on a chunked body's framing (chunk-size lines, the last chunk, trailers) is dropped instead of
    /// moved: the destination gets the payload alone. For a body that is kept rather than relayed (a stored upload,
    /// SPEC §18.3), which is sent on later with a `Content-Length` of its own. Other framings carry no framing bytes.
    mutating func stripChunkFraming() {
        if case .chunked(let decoder, _) = mode { mode = .chunked(decoder, stripFraming: true) }
    }

    /// `n` bytes of a length-delimited body were moved outside the relay (splice(2), kernel to kernel).
    mutating func movedElsewhere(_ n: UInt64) {
        guard case .length(let remaining) = mode else { return }
        let n = min(n, remaining)
        transferred += n
        delivered += n
        payload += n
        mode = remaining == n ? .done : .length(remaining - n)
    }

    /// What is left of a length-delimited body (nil for other framings).
    var remainingLength: UInt64? {
        if case .length(let remaining) = mode { return remaining }
        return nil
    }

    /// `framing`: the bytes are chunked framing, not payload.
    private mutating func move(_ n: Int, from source: OpaquePointer, to destination: OpaquePointer?, framing: Bool = false) {
        if let destination {
            evbuffer_remove_buffer(source, destination, n)
            delivered += UInt64(n)
        } else {
            evbuffer_drain(source, n)
        }
        transferred += UInt64(n)
        if !framing { payload += UInt64(n) }
    }

    /// The last-chunk element (`n` bytes), whose trailer section has fields no trailer may carry on
    /// (`TrailerSection`): the element goes out without them, the rest of it unchanged, and their names are kept for
    /// the log (`droppedTrailerFields`).
    private mutating func moveWithoutDroppedTrailers(_ n: Int, from source: OpaquePointer, to destination: OpaquePointer?) {
        guard let start = evbuffer_pullup(source, n),
              let filtered = TrailerSection.withoutDroppedFields(UnsafeRawBufferPointer(start: start, count: n)) else {
            // The decoder validated the element: only a bug gets here. The body still ends, with no trailers.
            assertionFailure("the decoder ended the body with an element that is not a last chunk")
            drain(n, from: source)
            if let destination { evbuffer_add(destination, "0\r\n\r\n", 5); delivered += 5 }
            return
        }
        droppedTrailerFields = filtered.dropped
        if let destination {
            evbuffer_add(destination, filtered.element, filtered.element.count)
            delivered += UInt64(filtered.element.count)
        }
        evbuffer_drain(source, n)
        transferred += UInt64(n)
    }

    private mutating func drain(_ n: Int, from source: OpaquePointer) {
        evbuffer_drain(source, n)
        transferred += UInt64(n)
    }
}
