/// Validates chunked transfer coding (RFC 9112 §7.1) while the engine streams it through unchanged.
///
/// The decoder never copies chunk data: it only tells the caller how many bytes at the front of its buffer are
/// framing (size lines, the CRLF after data, trailers), and how much chunk data follows (`dataRemaining`),
/// which the caller moves itself and reports with `consumeData`. Framing is passed on verbatim, so the bytes the
/// origin sees are exactly the ones validated here. Any chunk size or line ending that another parser could read
/// differently (`0x5`, `+5`, ` 5`, a bare LF, a missing CRLF after data, a size past 63 or 64 bits) is the TE.TE /
/// chunk-size smuggling family and is refused; see `scanChunkSize`, the one place a chunk size is read.
public struct ChunkedDecoder: Sendable {
    /// Where in the chunked grammar the next framing element starts.
    enum State: Hashable, Sendable {
        /// `chunk-size [ chunk-ext ] CRLF`
        case sizeLine
        /// The CRLF that ends chunk data (after `dataRemaining` reached 0).
        case dataCRLF
        /// The message is over.
        case complete
    }

    /// Longest chunk-size line, CRLF excluded (extensions included): bounds what we buffer for one line.
    public let maxLineLength: Int
    /// Largest trailer section including its final CRLF.
    public let maxTrailerSection: Int
    var state: State = .sizeLine

    /// Chunk-data bytes still expected. While > 0 the caller moves data itself (zero-copy) and reports it with consumeData.
    public private(set) var dataRemaining: UInt64 = 0
    public private(set) var isComplete: Bool = false
    /// The trailer section of the element that ended the body has fields `TrailerSection.isDropped` names: forward
    /// `TrailerSection.withoutDroppedFields` of the element, not the element.
    public private(set) var dropsTrailerFields: Bool = false

    /// The largest chunk size accepted, inclusive: 2^60 - 1. SPEC §6 refuses anything above, as nginx and HAProxy
    /// refuse such sizes.
    ///
    /// Chunk-size smuggling: a recipient that keeps the size in a signed 64-bit integer (an `off_t`) reads
    /// `8000000000000005` as a negative number and `ffffffffffffffff` as -1; one that accumulates in 64 bits and
    /// wraps reads `10000000000000005` as 5. Each then frames the rest of the stream differently from us, and what
    /// we forward as chunk data is read as the next request. Up to 2^60 - 1 a 64-bit reading, signed or not, agrees
    /// with ours, and a size, or a size added to any real offset, fits an `Int`.
    public static let maxChunkSize: UInt64 = 0x0fff_ffff_ffff_ffff

    /// At most 16 hex digits, leading zeros included. The value decides (`maxChunkSize`); the digit cap only bounds
    /// the work per line and keeps the rule simple: `00000000000000005` is refused although its value is small (no
    /// sender pads a size that far).
    public static let maxChunkSizeDigits = 16

    public init(maxLineLength: Int = 4096, maxTrailerSection: Int = 64 * 1024) {
        self.maxLineLength = max(maxLineLength, 1)
        self.maxTrailerSection = max(maxTrailerSection, 2)
    }

    /// Call only when dataRemaining == 0 && !isComplete. Looks at the front of `bytes` for ONE framing element:
    /// a chunk-size line (with optional chunk extensions), the CRLF that must follow chunk data, or the last-chunk
    /// line together with the trailer section and final CRLF.
    public mutating func parseFraming(_ bytes: UnsafeRawBufferPointer) -> ChunkedFramingResult {
        precondition(dataRemaining == 0 && !isComplete, "ChunkedDecoder.parseFraming called while chunk data is pending or after the end")
        switch state {
        case .sizeLine:
            return parseSizeLine(bytes)
        case .dataCRLF:
            // RFC 9112 §7.1: chunk = chunk-size [ chunk-ext ] CRLF chunk-data CRLF. Anything else after the data
            // means the declared size was not the real one: the sender and we disagree on where the chunk ends.
            if bytes.isEmpty { return .needMore }
            guard bytes[0] == ByteClass.cr else { return .invalid(.malformed("chunk data not followed by CRLF")) }
            if bytes.count < 2 { return .needMore }
            guard bytes[1] == ByteClass.lf else { return .invalid(.malformed("chunk data not followed by CRLF")) }
            state = .sizeLine
            return .framing(length: 2)
        case .complete:
            return .invalid(.malformed("chunked message already complete"))
        }
    }

    /// Reports `count` bytes of chunk data moved by the caller.
    public mutating func consumeData(_ count: Int) {
        precondition(count >= 0 && UInt64(count) <= dataRemaining, "ChunkedDecoder.consumeData beyond the chunk")
        dataRemaining -= UInt64(count)
    }

    /// `chunk-size [ chunk-ext ] CRLF`, where `chunk-size = 1*HEXDIG` and
    /// `chunk-ext = *( BWS ";" BWS chunk-ext-name [ BWS "=" BWS chunk-ext-val ] )` (RFC 9112 §7.1, §7.1.1).
    private mutating func parseSizeLine(_ p: UnsafeRawBufferPointer) -> ChunkedFramingResult {
        let n = p.count
        // Content bytes live at indices < maxLineLength; looking at one more tells "too long" from "need more".
        let to = maxLineLength < n ? maxLineLength + 1 : n
        let ranOut: ChunkedFramingResult = to > maxLineLength ? .invalid(.malformed("chunk size line too long")) : .needMore

        var i: Int
        let size: UInt64
        switch Self.scanChunkSize(p, upTo: to) {
        case .size(let value, let end):
            size = value
            i = end
        case .ranOut:
            return ranOut
        case .invalid(let reason):
            return .invalid(.malformed(reason))
        }

        var sawExtension = false
        while true {
            let wsStart = i
            while i < to && ByteClass.isOWS(p[i]) { i += 1 }
            if i == to { return ranOut }
            let b = p[i]
            if b == ByteClass.cr {
                // BWS is only allowed before ';' and around '='; `5 \r\n` is read as 5 by some and refused by others.
                if i != wsStart { return .invalid(.malformed("whitespace at end of chunk size line")) }
                break
            }
            if b == ByteClass.lf { return .invalid(.malformed("bare LF in chunk size line")) }
            guard b == 0x3B else {
                return .invalid(.malformed(sawExtension ? "invalid chunk extension" : "invalid chunk size"))
            }
            sawExtension = true
            i += 1
            while i < to && ByteClass.isOWS(p[i]) { i += 1 }
            let nameStart = i
            while i < to && ByteClass.isTchar(p[i]) { i += 1 }
            if i == to { return ranOut }
            if i == nameStart { return .invalid(.malformed("empty chunk extension name")) }
            let afterName = i
            while i < to && ByteClass.isOWS(p[i]) { i += 1 }
            if i == to { return ranOut }
            guard p[i] == 0x3D else {
                // No value: rewind so the loop head sees (and judges) the whitespace.
                i = afterName
                continue
            }
            i += 1
            while i < to && ByteClass.isOWS(p[i]) { i += 1 }
            if i == to { return ranOut }
            if p[i] == 0x22 {
                // quoted-string (RFC 9110 §5.6.4)
                i += 1
                while true {
                    if i == to { return ranOut }
                    let c = p[i]
                    if c == 0x22 { i += 1; break }
                    if c == 0x5C {
                        i += 1
                        if i == to { return ranOut }
                        let q = p[i]
                        guard q == ByteClass.htab || q == ByteClass.sp || ByteClass.isVisible(q) || q >= 0x80 else {
                            return .invalid(.malformed("invalid quoted-pair in chunk extension"))
                        }
                        i += 1
                        continue
                    }
                    guard c == ByteClass.htab || c == ByteClass.sp || (ByteClass.isVisible(c) && c != 0x5C) || c >= 0x80 else {
                        return .invalid(.malformed("invalid character in chunk extension"))
                    }
                    i += 1
                }
            } else {
                let valueStart = i
                while i < to && ByteClass.isTchar(p[i]) { i += 1 }
                if i == to { return ranOut }
                if i == valueStart { return .invalid(.malformed("empty chunk extension value")) }
            }
        }

        // p[i] is CR
        guard i + 1 < n else { return .needMore }
        guard p[i + 1] == ByteClass.lf else { return .invalid(.malformed("bare CR in chunk size line")) }
        let length = i + 2
        if size > 0 {
            dataRemaining = size
            state = .dataCRLF
            return .framing(length: length)
        }
        // last-chunk: one element with the trailer section and final CRLF that follow it, handed out only once
        // all of it is here and valid (the common "0\r\n\r\n" at once). Were the last-chunk line passed on alone,
        // a bad trailer seen later would leave the recipient with a body that ended, or did not, depending on how
        // the bytes happened to arrive. Bounded: the line by maxLineLength, the section by maxTrailerSection.
        return parseTrailers(p, from: length)
    }

    /// What `scanChunkSize` found at the front of a size line.
    enum ChunkSizeScan: Equatable {
        /// `value`, in hex digits that end before index `end` (where the extensions, BWS or the CRLF start).
        case size(UInt64, end: Int)
        /// Only (acceptable) digits up to the end of what is visible: more digits may follow.
        case ranOut
        case invalid(String)
    }

    /// `chunk-size = 1*HEXDIG` (RFC 9112 §7.1) at the front of `p[..<end]`, at most `maxChunkSizeDigits` digits and
    /// at most `maxChunkSize`. Every chunk size the proxy reads goes through here, whatever way the bytes arrived,
    /// so that no path can accept a size another refuses.
    ///
    /// A violation is reported as soon as it is visible (a 17th digit, a value past the bound): more bytes can
    /// only add digits, never make the size smaller. No sign, no `0x`, no leading whitespace: `parseInt`-style
    /// readers accept those and would disagree on where the chunk ends.
    @inline(__always)
    static func scanChunkSize(_ p: UnsafeRawBufferPointer, upTo end: Int) -> ChunkSizeScan {
        var i = 0
        var size: UInt64 = 0
        while i < end, let h = ByteClass.hexValue(p[i]) {
            if i == maxChunkSizeDigits { return .invalid("chunk size has more than 16 hex digits") }
            // size <= maxChunkSize < 2^60 here, so the shift cannot overflow.
            size = size << 4 | UInt64(h)
            if size > maxChunkSize { return .invalid("chunk size above 0x0fffffffffffffff") }
            i += 1
        }
        if i == end { return .ranOut }
        if i == 0 { return .invalid("invalid chunk size") }
        return .size(size, end: i)
    }

    /// `trailer-section = *( field-line CRLF )` then CRLF (RFC 9112 §7.1.2) from `start`, with the header field-line
    /// rules; the end reported includes everything before `start` (the last-chunk line).
    /// Trailers that would change framing or routing (Content-Length, Transfer-Encoding, Host) or that are
    /// connection-specific are not refused but noted (`dropsTrailerFields`): the caller forwards the element without
    /// them (`TrailerSection`). RFC 9110 §6.5.1 forbids them there, and a recipient that merges trailers into the head
    /// would be smuggled to; refusing the body instead cut a response whose every byte had already gone out.
    private mutating func parseTrailers(_ p: UnsafeRawBufferPointer, from start: Int) -> ChunkedFramingResult {
        var fields: [HTTPField] = []
        let collect = p.count - start > 2
        switch FieldSection.scan(p, from: start, sizeLimit: maxTrailerSection, countLimit: Int.max, collect: collect, fields: &fields) {
        case .incomplete: return .needMore
        case .invalid(.headerSectionTooLarge): return .invalid(.malformed("trailer section too large"))
        case .invalid(let e): return .invalid(e)
        case .complete(let end):
            dropsTrailerFields = fields.contains { TrailerSection.isDropped($0.name) }
            state = .complete
            isComplete = true
            return .end(length: end)
        }
    }
}

public enum ChunkedFramingResult: Hashable, Sendable {
    /// No whole framing element at the front yet, and no violation visible.
    case needMore
    /// The first `length` bytes are framing: pass them through verbatim; `dataRemaining` may now be > 0.
    case framing(length: Int)
    /// The first `length` bytes finish the message (last-chunk, trailers, final CRLF); `isComplete` is true.
    case end(length: Int)
    case invalid(HTTPWireError)
}
