/// Heads handed from one part of the engine to another in memory, in place of HTTP/1.1 text written by one and read
/// back by the other (an HTTP/2 stream and the exchange behind it talk through a bufferevent pair).
///
/// The text is the reference: a head may skip it only when `HTTP1Parser` would give back exactly the same head from
/// `serialized()`, within the limits the reader applies. These functions say when, and the length the text would
/// have had (what the reader charges for it). A head they refuse (a field the parser would refuse or trim, a limit)
/// is written as text, so the reader's parser answers it as before. `HeadHandoffDifferentialTests` compares both
/// ways on random and mutated heads.
public enum HeadHandoff {
    /// What is known of a head's bytes before it is handed over.
    public enum Source: Sendable {
        /// Nothing: every part is checked, byte by byte.
        case unchecked
        /// A strict reader checked every part as the parser would read it, and whatever was added is known good by
        /// how it was made: the method a token, the target visible ASCII, the reason phrase field-value bytes,
        /// every name a token, every value one `FieldBytes.checkValue` accepts. The HTTP/2 codecs' request and
        /// response builders (`HTTP2Request.http1Head`, an h2 origin's response fields) are such readers. Only the
        /// lengths and the limits are left to check; debug builds check the bytes too and stop if they disagree
        /// (`HeadHandoffSourceTests` holds the claim on random and mutated h2 requests).
        case checkedParts
    }

    /// The length of `head.serialized()` when `HTTP1Parser.parseResponseHead` with `limits` would give `head` back
    /// from it unchanged, and it is at most `maxHeadBytes` long; nil otherwise.
    public static func response(_ head: ResponseHead, limits: HTTPLimits, maxHeadBytes: Int,
                                from source: Source = .unchecked) -> Int? {
        // The parser reads any HTTP/1.x status line; `serialized()` writes one digit each.
        guard head.version.major == 1, head.version.minor <= 9, (100...999).contains(head.status) else { return nil }
        if case .checkedParts = source {
            let known = length(head.reason, head.fields, extra: 13, limits: limits, maxHeadBytes: maxHeadBytes)
            assert(known == response(head, limits: limits, maxHeadBytes: maxHeadBytes),
                   "a head said to be checked holds a part the parser would not give back: \(head)")
            return known
        }
        // `HTTP/1.1 200 reason`: a reason is any run of field-value bytes, kept as it is (spaces included).
        guard let reason = bytes(head.reason, isReason) else { return nil }
        let line = 13 + reason
        guard line <= limits.requestLine else { return nil }
        guard let section = section(head.fields, limits: limits) else { return nil }
        let length = line + 2 + section
        return length <= maxHeadBytes ? length : nil
    }

    /// The length of `head.serialized()` when `HTTP1Parser.parseRequestHead` with `limits` would give `head` back
    /// from it unchanged, and it is at most `maxHeadBytes` long; nil otherwise.
    public static func request(_ head: RequestHead, limits: HTTPLimits, maxHeadBytes: Int,
                               from source: Source = .unchecked) -> Int? {
        guard head.version == .http11 || head.version == .http10 else { return nil }
        if case .checkedParts = source {
            let extra = head.method.utf8.count + 1 + 9
            let known = length(head.target, head.fields, extra: extra, limits: limits, maxHeadBytes: maxHeadBytes)
            assert(known == request(head, limits: limits, maxHeadBytes: maxHeadBytes),
                   "a head said to be checked holds a part the parser would not give back: \(head)")
            return known
        }
        guard let method = bytes(head.method, isToken), let target = bytes(head.target, isTarget) else { return nil }
        let line = method + 1 + target + 9
        guard line <= limits.requestLine else { return nil }
        guard let section = section(head.fields, limits: limits) else { return nil }
        let length = line + 2 + section
        return length <= maxHeadBytes ? length : nil
    }

    /// The text's length for a head whose parts are known good (`Source.checkedParts`): the first line is `extra`
    /// bytes and `part` (the target or the reason), then the fields; nil past a limit. The same sums as the checked
    /// path, without reading a byte (a native string knows its UTF-8 length).
    private static func length(_ part: String, _ fields: [HTTPField], extra: Int, limits: HTTPLimits,
                               maxHeadBytes: Int) -> Int? {
        let line = extra + part.utf8.count
        guard line <= limits.requestLine, fields.count <= limits.headerCount else { return nil }
        var section = 2
        for i in fields.indices { section += fields[i].name.utf8.count + fields[i].value.utf8.count + 4 }
        guard section <= limits.headerSection else { return nil }
        let length = line + 2 + section
        return length <= maxHeadBytes ? length : nil
    }

    /// The header section's length (the final CRLF included) when each field comes back unchanged and the section
    /// is within the limits; nil otherwise.
    private static func section(_ fields: [HTTPField], limits: HTTPLimits) -> Int? {
        guard fields.count <= limits.headerCount else { return nil }
        var length = 2
        // By index: `for field in fields` copied each field (a retain and a release per string) around the checks.
        for i in fields.indices {
            guard let name = bytes(fields[i].name, isToken), name > 0,
                  let value = bytes(fields[i].value, isUnchangedValue) else { return nil }
            length += name + value + 4
        }
        return length <= limits.headerSection ? length : nil
    }

    /// `s`'s length in bytes when `valid` holds for its bytes; nil otherwise. Over the contiguous UTF-8 at once: the
    /// generic `String.UTF8View` walk cost as much as parsing the text (callgrind, issue 26).
    @inline(__always)
    private static func bytes(_ s: String, _ valid: (UnsafeBufferPointer<UInt8>) -> Bool) -> Int? {
        return s.withUTF8Bytes { valid($0) ? $0.count : nil }
    }

    /// A reason phrase is any run of field-value bytes, kept as it is (spaces included).
    private static func isReason(_ u: UnsafeBufferPointer<UInt8>) -> Bool {
        FieldSection.valueEnd(UnsafeRawBufferPointer(u), from: 0, to: u.count).end == u.count
    }

    /// A request-target on the wire: VCHAR only, not empty (RFC 9112 §3.2).
    private static func isTarget(_ u: UnsafeBufferPointer<UInt8>) -> Bool {
        guard !u.isEmpty else { return false }
        for b in u where !ByteClass.isVisible(b) { return false }
        return true
    }

    private static func isToken(_ u: UnsafeBufferPointer<UInt8>) -> Bool {
        FieldBytes.isToken(UnsafeRawBufferPointer(u))
    }

    /// VCHAR / SP / HTAB / obs-text, without the leading or trailing whitespace a parse trims
    /// (`HeadWriter.isValidFieldValue`): the parser's own scan.
    private static func isUnchangedValue(_ u: UnsafeBufferPointer<UInt8>) -> Bool {
        FieldBytes.checkValue(UnsafeRawBufferPointer(u)) != nil
    }
}
