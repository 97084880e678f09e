/// Strict HTTP/1.1 head parser (RFC 9112 §2–§5).
///
/// A proxy sits between two parsers it does not control: the client's and the origin's. Every place where
/// two HTTP implementations can disagree on where a message starts, where a field ends or how long a body is
/// becomes a request-smuggling or header-injection vector (the CL.TE / TE.CL / TE.TE families, obs-fold,
/// bare CR/LF, NUL, whitespace before the colon). This parser therefore accepts only the unambiguous grammar
/// and refuses everything else, so that what the proxy forwards means the same thing to every recipient.
///
/// Shape: a pure function over the bytes buffered so far. It keeps no state between calls, so the engine can
/// call it again after each read; it reports a violation or an exceeded limit as soon as it is visible, even
/// before the head is complete, so a client cannot make the proxy buffer an invalid or oversized head.
///
/// Cost: one pass over the bytes; each `String` is created once from an already-validated byte range.
public enum HTTP1Parser {
    /// RFC 9112 §2.2: a server SHOULD ignore at least one empty line received before the request-line
    /// (clients may send a stray CRLF after a POST body). We ignore a few, and refuse an endless stream of them
    /// so that a client cannot keep a connection busy without ever starting a request.
    public static let maxLeadingEmptyLines = 8

    /// Parses a request head from the start of `bytes`.
    ///
    /// Returns `.incomplete` only while no violation is visible and no limit is exceeded.
    public static func parseRequestHead(_ bytes: UnsafeRawBufferPointer, limits: HTTPLimits) -> HeadParseResult<RequestHead> {
        let n = bytes.count
        var i = 0
        var emptyLines = 0
        // RFC 9112 §2.2: leading empty lines before the request-line, each exactly CRLF.
        while i < n {
            let b = bytes[i]
            if b == ByteClass.lf { return .invalid(.malformed("bare LF before request line")) }
            guard b == ByteClass.cr else { break }
            guard i + 1 < n else { return .incomplete }
            guard bytes[i + 1] == ByteClass.lf else { return .invalid(.malformed("bare CR before request line")) }
            emptyLines += 1
            if emptyLines > maxLeadingEmptyLines {
                return .invalid(.malformed("too many empty lines before request line"))
            }
            i += 2
        }
        if i == n { return .incomplete }

        switch scanRequestLine(bytes, from: i, limit: limits.requestLine) {
        case .incomplete: return .incomplete
        case .invalid(let error): return .invalid(error)
        case .complete(let line):
            switch fieldSection(bytes, from: line.next, limits: limits) {
            case .incomplete: return .incomplete
            case .invalid(let error): return .invalid(error)
            case .complete(let fields, let end):
                let head = RequestHead(
                    method: CommonSpellings.string(bytes, line.methodStart, line.methodEnd),
                    target: ASCII.string(bytes, line.targetStart, line.targetEnd),
                    version: line.version,
                    fields: fields
                )
                return .complete(head, length: end)
            }
        }
    }

    /// The header section after a start line (requests and responses alike): the fields, and where the head
    /// ends (after the empty line).
    private static func fieldSection(_ bytes: UnsafeRawBufferPointer, from start: Int, limits: HTTPLimits)
        -> HeadParseResult<[HTTPField]>
    {
        var fields: [HTTPField] = []
        fields.reserveCapacity(16)
        switch FieldSection.scan(bytes, from: start, sizeLimit: limits.headerSection, countLimit: limits.headerCount,
                                 collect: true, fields: &fields) {
        case .incomplete: return .incomplete
        case .invalid(let error): return .invalid(error)
        case .complete(let end): return .complete(fields, length: end)
        }
    }

    /// Parses a response head from the start of `bytes`.
    ///
    /// No leading empty lines are skipped: RFC 9112 §2.2 allows that only before a request-line, and a stray
    /// CRLF from an origin means it sent more body than it declared, i.e. the framing is already wrong.
    /// The status line is bounded by `limits.requestLine` (reported as `.requestLineTooLong`).
    public static func parseResponseHead(_ bytes: UnsafeRawBufferPointer, limits: HTTPLimits) -> HeadParseResult<ResponseHead> {
        var fields: [HTTPField] = []
        fields.reserveCapacity(16)
        switch scanResponseHead(bytes, limits: limits, into: &fields) {
        case .incomplete: return .incomplete
        case .invalid(let error): return .invalid(error)
        case .complete(let line, let end):
            let reason = CommonSpellings.string(bytes, line.reasonStart, line.reasonEnd)
            return .complete(ResponseHead(version: line.version, status: line.status, reason: reason, fields: fields),
                             length: end)
        }
    }

    /// `parseResponseHead` without a String: the same grammar and limits, the head as offsets into `bytes`
    /// (`ResponseHeadSpans`), for a relay that copies the origin's bytes. `spans.head(in: bytes)` is the head
    /// `parseResponseHead` gives (`ResponseHeadSpansDifferentialTests`, and the fuzz target on every input).
    public static func parseResponseHeadSpans(_ bytes: UnsafeRawBufferPointer, limits: HTTPLimits)
        -> HeadParseResult<ResponseHeadSpans>
    {
        var fields = FieldSpans()
        switch scanResponseHead(bytes, limits: limits, into: &fields) {
        case .incomplete: return .incomplete
        case .invalid(let error): return .invalid(error)
        case .complete(let line, let end):
            return .complete(ResponseHeadSpans(version: line.version, status: line.status,
                                               reason: line.reasonStart..<line.reasonEnd, fields: fields),
                             length: end)
        }
    }

    enum HeadScan<Line> {
        case incomplete
        case invalid(HTTPWireError)
        case complete(Line, end: Int)
    }

    private static func scanResponseHead<Collector: FieldCollector>(
        _ bytes: UnsafeRawBufferPointer, limits: HTTPLimits, into collector: inout Collector
    ) -> HeadScan<StatusLine> {
        if bytes.isEmpty { return .incomplete }
        switch scanStatusLine(bytes, limit: limits.requestLine) {
        case .incomplete: return .incomplete
        case .invalid(let error): return .invalid(error)
        case .complete(let line):
            switch FieldSection.scan(bytes, from: line.next, sizeLimit: limits.headerSection,
                                     countLimit: limits.headerCount, into: &collector) {
            case .incomplete: return .incomplete
            case .invalid(let error): return .invalid(error)
            case .complete(let end): return .complete(line, end: end)
            }
        }
    }

    // MARK: - Start lines

    struct RequestLine {
        var methodStart: Int, methodEnd: Int
        var targetStart: Int, targetEnd: Int
        var version: HTTPVersion
        /// Index just after the CRLF.
        var next: Int
    }

    struct StatusLine {
        var version: HTTPVersion
        var status: Int
        var reasonStart: Int, reasonEnd: Int
        var next: Int
    }

    enum LineScan<Line> {
        case incomplete
        case complete(Line)
        case invalid(HTTPWireError)
    }

    /// `request-line = method SP request-target SP HTTP-version CRLF` (RFC 9112 §3), with exactly one SP
    /// between the parts: RFC 9112 §3 allows lenient whitespace parsing, but a proxy that splits differently
    /// from the origin forwards a different target than it checked, so we refuse it.
    static func scanRequestLine(_ p: UnsafeRawBufferPointer, from start: Int, limit: Int) -> LineScan<RequestLine> {
        let n = p.count
        // Content bytes may sit at indices < start + limit; scanning one further tells "too long" from "incomplete".
        let room = n - start
        let limit = max(limit, 0)
        let to = limit < room ? start + limit + 1 : n
        @inline(__always) func ranOut() -> LineScan<RequestLine> {
            to < n || to - start > limit ? .invalid(.requestLineTooLong) : .incomplete
        }

        var i = start
        while i < to && ByteClass.isTchar(p[i]) { i += 1 }
        if i == to { return ranOut() }
        if i == start { return .invalid(.malformed("request line does not start with a method")) }
        guard p[i] == ByteClass.sp else { return .invalid(.malformed("invalid character in method")) }
        let methodEnd = i
        i += 1

        let targetStart = i
        while i < to && ByteClass.isVisible(p[i]) { i += 1 }
        if i == to { return ranOut() }
        if i == targetStart {
            return .invalid(.malformed(p[i] == ByteClass.sp ? "more than one space after method" : "empty request-target"))
        }
        let b = p[i]
        guard b == ByteClass.sp else {
            if b == ByteClass.cr || b == ByteClass.lf { return .invalid(.malformed("missing HTTP version")) }
            return .invalid(.malformed("invalid character in request-target"))
        }
        let targetEnd = i
        i += 1

        switch scanVersion(p, from: i, to: to, request: true) {
        case .incomplete: return ranOut()
        case .invalid(let error): return .invalid(error)
        case .complete(let version):
            i += 8
            if i == to { return ranOut() }
            switch lineEnd(p, at: i) {
            case .incomplete: return .incomplete
            case .invalid(let error): return .invalid(error)
            case .complete:
                return .complete(RequestLine(
                    methodStart: start, methodEnd: methodEnd, targetStart: targetStart, targetEnd: targetEnd,
                    version: version, next: i + 2
                ))
            }
        }
    }

    /// `status-line = HTTP-version SP status-code SP [ reason-phrase ] CRLF` (RFC 9112 §4). A missing SP
    /// after the code (no reason at all) is accepted: common in the wild and unambiguous.
    static func scanStatusLine(_ p: UnsafeRawBufferPointer, limit: Int) -> LineScan<StatusLine> {
        let n = p.count
        let limit = max(limit, 0)
        let to = limit < n ? limit + 1 : n
        @inline(__always) func ranOut() -> LineScan<StatusLine> {
            to < n || to > limit ? .invalid(.requestLineTooLong) : .incomplete
        }
        let version: HTTPVersion
        switch scanVersion(p, from: 0, to: to, request: false) {
        case .incomplete: return ranOut()
        case .invalid(let error): return .invalid(error)
        case .complete(let v): version = v
        }
        var i = 8
        if i == to { return ranOut() }
        guard p[i] == ByteClass.sp else { return .invalid(.malformed("expected one space after HTTP version")) }
        i += 1
        var status = 0
        for k in 0..<3 {
            if i == to { return ranOut() }
            let d = p[i]
            guard ByteClass.isDigit(d), !(k == 0 && d == 0x30) else {
                return .invalid(.malformed("status code is not three digits 100-999"))
            }
            status = status * 10 + Int(d &- 0x30)
            i += 1
        }
        if i == to { return ranOut() }
        var reasonStart = i, reasonEnd = i
        if p[i] == ByteClass.sp {
            i += 1
            reasonStart = i
            // A reason phrase is made of field-value bytes (RFC 9112 §4): the same scan as a value.
            let high: Bool
            (i, high) = FieldSection.valueEnd(p, from: i, to: to)
            if i == to { return ranOut() }
            reasonEnd = i
            if high && !FieldSection.isValidUTF8(p, reasonStart, reasonEnd) {
                return .invalid(.malformed("reason phrase is not UTF-8"))
            }
        }
        let b = p[i]
        guard b == ByteClass.cr || b == ByteClass.lf else {
            return .invalid(.malformed(ByteClass.isDigit(b) ? "status code is not three digits 100-999" : "invalid character in status line"))
        }
        switch lineEnd(p, at: i) {
        case .incomplete: return .incomplete
        case .invalid(let error): return .invalid(error)
        case .complete:
            return .complete(StatusLine(version: version, status: status, reasonStart: reasonStart, reasonEnd: reasonEnd, next: i + 2))
        }
    }

    /// `HTTP-version = "HTTP/" DIGIT "." DIGIT` (RFC 9112 §2.3), case-sensitive. Requests: 1.0 or 1.1 only.
    /// Responses: any 1.x (RFC 9110 §6.2: a 1.x recipient understands every 1.x message).
    /// Checks the bytes that are there; `.incomplete` if fewer than 8 are.
    static func scanVersion(_ p: UnsafeRawBufferPointer, from start: Int, to: Int, request: Bool) -> LineScan<HTTPVersion> {
        // "HTTP/" then DIGIT "." DIGIT
        let prefix: (UInt8, UInt8, UInt8, UInt8, UInt8) = (0x48, 0x54, 0x54, 0x50, 0x2F)
        var i = start
        var k = 0
        while k < 8 {
            if i == to { return .incomplete }
            let b = p[i]
            let ok: Bool
            switch k {
            case 0: ok = b == prefix.0
            case 1: ok = b == prefix.1
            case 2: ok = b == prefix.2
            case 3: ok = b == prefix.3
            case 4: ok = b == prefix.4
            case 5:
                guard ByteClass.isDigit(b) else { return .invalid(.malformed("invalid HTTP version")) }
                ok = true
                if b != 0x31 { return .invalid(.malformed("unsupported HTTP version")) }
            case 6: ok = b == 0x2E
            default:
                guard ByteClass.isDigit(b) else { return .invalid(.malformed("invalid HTTP version")) }
                ok = true
                if request && b > 0x31 { return .invalid(.malformed("unsupported HTTP version")) }
            }
            if !ok { return .invalid(.malformed("invalid HTTP version")) }
            i += 1
            k += 1
        }
        return .complete(HTTPVersion(major: 1, minor: p[start + 7] &- 0x30))
    }

    /// The line terminator at `i` must be exactly CRLF (RFC 9112 §2.2): a bare LF or bare CR is read as a line
    /// end by some implementations and not by others, which is how smuggled headers get through.
    @inline(__always)
    static func lineEnd(_ p: UnsafeRawBufferPointer, at i: Int) -> LineScan<Void> {
        let b = p[i]
        if b == ByteClass.lf { return .invalid(.malformed("bare LF line ending")) }
        guard b == ByteClass.cr else { return .invalid(.malformed("unexpected bytes at end of line")) }
        guard i + 1 < p.count else { return .incomplete }
        guard p[i + 1] == ByteClass.lf else { return .invalid(.malformed("bare CR")) }
        return .complete(())
    }
}

/// The field-line grammar shared by header sections and chunked trailer sections (RFC 9112 §5, §7.1.2).
enum FieldSection {
    enum Scan {
        /// The section ends at `end` (just after the empty line's CRLF).
        case complete(end: Int)
        case incomplete
        case invalid(HTTPWireError)
    }

    /// Scans field lines from `start` through the empty line that ends the section.
    ///
    /// - sizeLimit: bytes of the section including the final CRLF; beyond it `.headerSectionTooLarge`,
    ///   as soon as the section cannot end within it (so an attacker cannot make us buffer more).
    /// - countLimit: field lines; the (countLimit+1)th line is refused as soon as its first byte is seen.
    /// - collect: append each field to `fields` (trailer validation does not need the Strings).
    static func scan(
        _ p: UnsafeRawBufferPointer, from start: Int, sizeLimit: Int, countLimit: Int,
        collect: Bool, fields: inout [HTTPField]
    ) -> Scan {
        if collect { return scan(p, from: start, sizeLimit: sizeLimit, countLimit: countLimit, into: &fields) }
        var discarded = DiscardedFields()
        return scan(p, from: start, sizeLimit: sizeLimit, countLimit: countLimit, into: &discarded)
    }

    /// `scan`, handing each valid field line to `collector`: one grammar, whatever is kept of it (Strings for a
    /// head, offsets for a relay that copies bytes, nothing for a trailer section that is only checked).
    static func scan<Collector: FieldCollector>(
        _ p: UnsafeRawBufferPointer, from start: Int, sizeLimit: Int, countLimit: Int, into collector: inout Collector
    ) -> Scan {
        let n = p.count
        let sizeLimit = max(sizeLimit, 0)
        // Bytes at indices >= start + sizeLimit are beyond the limit; never look at them.
        let limited = sizeLimit <= n - start
        let to = limited ? start + sizeLimit : n
        let ranOut: Scan = limited ? .invalid(.headerSectionTooLarge) : .incomplete

        var i = start
        var count = 0
        while true {
            guard i < to else { return ranOut }
            let first = p[i]
            if first == ByteClass.cr {
                guard i + 1 < to else { return ranOut }
                guard p[i + 1] == ByteClass.lf else { return .invalid(.malformed("bare CR in header section")) }
                return .complete(end: i + 2)
            }
            if first == ByteClass.lf { return .invalid(.malformed("bare LF in header section")) }
            // RFC 9112 §5.2: obs-fold. A proxy MUST either reject or replace it with SP before forwarding;
            // we reject, since unfolding changes bytes and folding is read differently by different parsers.
            // The same test refuses whitespace between the start line and the first field (RFC 9112 §2.2).
            if ByteClass.isOWS(first) { return .invalid(.malformed("obs-fold or line starting with whitespace")) }

            count += 1
            if count > countLimit { return .invalid(.headerSectionTooLarge) }

            let nameStart = i
            i = nameEnd(p, from: i, to: to)
            guard i < to else { return ranOut }
            let c = p[i]
            if c != ByteClass.colon {
                // RFC 9112 §5.1: no whitespace is allowed between the field name and colon; a server MUST
                // reject such a message and a proxy MUST remove the whitespace. "Transfer-Encoding : chunked"
                // is the classic smuggling vector: half the parsers see Transfer-Encoding, half do not.
                if ByteClass.isOWS(c) { return .invalid(.malformed("whitespace before colon in field line")) }
                if c == ByteClass.cr || c == ByteClass.lf { return .invalid(.malformed("field line without colon")) }
                if c == 0 { return .invalid(.malformed("NUL in field name")) }
                return .invalid(.malformed("invalid character in field name"))
            }
            if i == nameStart { return .invalid(.malformed("empty field name")) }
            let nameEnd = i
            i += 1

            let valueStart = i
            let high: Bool
            (i, high) = valueEnd(p, from: i, to: to)
            guard i < to else { return ranOut }
            let b = p[i]
            if b == ByteClass.lf { return .invalid(.malformed("bare LF in field line")) }
            guard b == ByteClass.cr else {
                return .invalid(.malformed(b == 0 ? "NUL in field value" : "control character in field value"))
            }
            guard i + 1 < to else { return ranOut }
            guard p[i + 1] == ByteClass.lf else { return .invalid(.malformed("bare CR in field value")) }

            // RFC 9110 §5.5: leading and trailing OWS is not part of the value.
            var vs = valueStart, ve = i
            while vs < ve && ByteClass.isOWS(p[vs]) { vs += 1 }
            while ve > vs && ByteClass.isOWS(p[ve - 1]) { ve -= 1 }
            // obs-text is passed through only if it is UTF-8: we never re-encode bytes behind the client's back,
            // and a String must hold exactly what was on the wire so that re-serialising is lossless.
            if high && !isValidUTF8(p, vs, ve) { return .invalid(.malformed("field value is not UTF-8")) }
            collector.collect(p, name: nameStart..<nameEnd, value: vs..<ve)
            i += 2
        }
    }

    /// Where a field name ends: the first byte from `start` on (before `to`) that is not a tchar, or `to`.
    ///
    /// Out of line, with one induction variable: inlined into `scan`, whose later code needs the name's bounds in
    /// several registers, the loop kept four counters and rebuilt both masks every byte (18 instructions a byte,
    /// a third of `scan`'s own cost; callgrind per instruction). `ByteClass.isTchar` is the test either way.
    /// The test is `ByteClass.tcharTable` (`isTchar` as a table): ~6 instructions a byte where the masks took ~11.
    @inline(never)
    static func nameEnd(_ p: UnsafeRawBufferPointer, from start: Int, to: Int) -> Int {
        guard let base = p.baseAddress else { return start }
        let table = ByteClass.tcharTable
        var i = start
        while i < to && table[Int(base.load(fromByteOffset: i, as: UInt8.self))] != 0 { i += 1 }
        return i
    }

    /// Where a field value ends: the first byte from `start` on (before `to`) that is not a field-value byte
    /// (`ByteClass.isFieldValueByte`), or `to`; and whether a byte before it is obs-text (0x80 and up).
    ///
    /// Eight bytes at a time while all eight are printable ASCII (0x20-0x7E), as every byte of a typical value is;
    /// from the first word that holds anything else (HTAB, obs-text, the CR that ends the line, a byte to refuse) on,
    /// byte by byte, as `valueEndByteByByte` does throughout (the reference; `FieldValueScanDifferentialTests`).
    /// The word test is exact for "any byte below 0x20, equal to 0x7F, or above": it may only stop the fast path
    /// early, never late (bit-twiddling `hasless`, Anderson's "Bit Twiddling Hacks").
    @inline(__always)
    static func valueEnd(_ p: UnsafeRawBufferPointer, from start: Int, to: Int) -> (end: Int, high: Bool) {
        var i = start
        if let base = p.baseAddress {
            while i + 8 <= to {
                let w = UInt64(littleEndian: base.loadUnaligned(fromByteOffset: i, as: UInt64.self))
                let ones: UInt64 = 0x0101_0101_0101_0101
                let tops: UInt64 = 0x8080_8080_8080_8080
                let below20 = (w &- ones &* 0x20) & ~w & tops
                let del = w ^ (ones &* 0x7F)
                let is7F = (del &- ones) & ~del & tops
                if (below20 | is7F | (w & tops)) != 0 { break }
                i += 8
            }
        }
        return valueEndByteByByte(p, from: i, to: to)
    }

    /// `valueEnd` one byte at a time: the reference.
    static func valueEndByteByByte(_ p: UnsafeRawBufferPointer, from start: Int, to: Int) -> (end: Int, high: Bool) {
        var i = start
        var high = false
        while i < to {
            let b = p[i]
            guard ByteClass.isFieldValueByte(b) else { break }
            if b >= 0x80 { high = true }
            i += 1
        }
        return (i, high)
    }

    static func isValidUTF8(_ p: UnsafeRawBufferPointer, _ from: Int, _ to: Int) -> Bool {
        String(validating: UnsafeRawBufferPointer(rebasing: p[from..<to]), as: UTF8.self) != nil
    }
}
