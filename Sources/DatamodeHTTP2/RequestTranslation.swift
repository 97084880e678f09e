/// Strict translation of an HTTP/2 request header section into a request the HTTP/1.1 side can carry
/// (RFC 9113 §8.1–§8.3, SPEC §17 "Translation is strict").
///
/// HTTP/2 frames a message by the stream, HTTP/1.1 by fields. A proxy that turns one into the other forwards
/// whatever fields it did not refuse, so every field that could change HTTP/1.1 framing or routing
/// (`transfer-encoding`, `connection`, `host`, a CR/LF that starts a new line) is the downgrade-smuggling class:
/// the request is malformed, the stream is reset, and nothing is forwarded. nghttp2 checks much of this itself
/// (`lib/nghttp2_http.c`); this builder checks all of it again on the fields nghttp2 let through, so the codec's
/// guarantees do not rest on one library's defaults, and adds what nghttp2 leaves out (`:scheme` other than
/// `https`, `:authority` required and read like an HTTP/1.1 target, `host` agreeing with it, UTF-8, limits).
///
/// Shape: fields go in one at a time as the HPACK decoder emits them; the first violation sticks; `finish` gives
/// the request or the refusal. Pure Swift, no C: table-tested on its own.
import DatamodeHTTP

struct HTTP2RequestBuilder {
    /// Whether the section is the head of a request or its trailers (RFC 9113 §8.1: one HEADERS section after
    /// the DATA, with END_STREAM).
    enum Part {
        case head
        case trailers
    }

    let part: Part
    let limits: HTTPLimits
    let scheme: String

    /// Every decoded field's size as HTTP/1.1 would carry it (`name: value` CRLF), counted even after a refusal,
    /// so that the session can tell an HPACK bomb from a large section.
    private(set) var decodedSize = 0
    /// The first reason this section cannot become a request.
    private(set) var refusal: HTTP2RequestRefusal?

    private var method: String?
    private var requestScheme: String?
    private var authority: String?
    private var path: String?
    private var sawRegularField = false
    private var fields: [HTTPField] = []
    /// Where the joined cookie sits in `fields`, and its crumbs so far.
    private var cookieIndex: Int?
    private var host: String?
    private var contentLength: UInt64?
    private var fieldCount = 0

    init(part: Part, limits: HTTPLimits, scheme: String) {
        self.part = part
        self.limits = limits
        self.scheme = scheme
        fields.reserveCapacity(16)
    }

    /// One decoded field, as nghttp2 emitted it (bytes, no assumption about their content).
    mutating func add(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) {
        decodedSize += name.count + value.count + 4
        guard refusal == nil else { return }
        if let reason = check(name: name, value: value) { refusal = reason }
    }

    /// The request, once the section ended. `endStream`: the HEADERS frame ended the stream (no body follows).
    func finish(endStream: Bool) -> Result<HTTP2Request, HTTP2RequestRefusal> {
        if let refusal { return .failure(refusal) }
        guard part == .head else {
            return .success(HTTP2Request(method: "", scheme: "", authority: "", path: "", fields: fields,
                                         contentLength: nil))
        }
        guard let method else { return .failure(.malformed(.missingPseudoHeader(":method"))) }
        guard let authority else { return .failure(.malformed(.missingPseudoHeader(":authority"))) }
        if method == "CONNECT" {
            // RFC 9113 §8.5: CONNECT carries :authority only.
            if requestScheme != nil { return .failure(.malformed(.missingPseudoHeader(":scheme must be absent"))) }
            if path != nil { return .failure(.malformed(.missingPseudoHeader(":path must be absent"))) }
            if case .failure = RequestTarget.parse(authority, method: method) {
                return .failure(.malformed(.invalidTarget(authority)))
            }
        } else {
            guard let requestScheme else { return .failure(.malformed(.missingPseudoHeader(":scheme"))) }
            guard let path else { return .failure(.malformed(.missingPseudoHeader(":path"))) }
            guard requestScheme == scheme else { return .failure(.malformed(.schemeNotAllowed(requestScheme))) }
            if let reason = Self.checkTarget(scheme: requestScheme, authority: authority, path: path, method: method) {
                return .failure(.malformed(reason))
            }
        }
        if let host, !ASCII.equalsIgnoringCase(host, authority) {
            return .failure(.malformed(.hostDisagreesWithAuthority))
        }
        // A body cannot follow END_STREAM: a declared length other than 0 is already a disagreement.
        if endStream, let contentLength, contentLength != 0 { return .failure(.malformed(.contentLengthMismatch)) }
        return .success(HTTP2Request(method: method, scheme: requestScheme ?? "", authority: authority,
                                     path: path ?? "", fields: fields, contentLength: contentLength))
    }

    // MARK: - Fields

    private mutating func check(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) -> HTTP2RequestRefusal? {
        guard let first = name.first else { return .malformed(.invalidFieldName) }
        if first == UInt8(ascii: ":") { return pseudoHeader(name: name, value: value) }
        sawRegularField = true
        // One call for the name (a call per byte across the module boundary otherwise).
        guard FieldBytes.isLowercaseToken(name) else { return .malformed(.invalidFieldName) }
        let nameString = String(decoding: name, as: UTF8.self)
        guard let valueString = Self.validValue(value) else { return .malformed(.invalidFieldValue(name: nameString)) }

        switch nameString {
        case "connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade":
            return .malformed(.connectionSpecificField(nameString))
        case "te":
            // RFC 9113 §8.2.2: TE may be present only with the value "trailers".
            guard ASCII.equalsIgnoringCase(valueString, "trailers") else {
                return .malformed(.connectionSpecificField("te"))
            }
        case "content-length":
            if part == .trailers { return .malformed(.forbiddenTrailer(nameString)) }
            guard contentLength == nil, let length = Self.parseContentLength(value) else {
                return .malformed(.invalidContentLength)
            }
            contentLength = length
        case "host":
            if part == .trailers { return .malformed(.forbiddenTrailer(nameString)) }
            guard host == nil else { return .malformed(.hostDisagreesWithAuthority) }
            host = valueString
            // Written back from :authority by `requestHead`; a disagreement is refused in `finish`.
            return limitsExceeded()
        default:
            break
        }

        if nameString == "cookie", part == .head {
            // RFC 9113 §8.2.3: crumbs are joined with "; " for HTTP/1.1, where the first one was. An empty crumb
            // carries nothing; joining it would leave "; " at an end, whitespace HTTP/1.1 trims (found by fuzzing).
            if let cookieIndex {
                if !valueString.isEmpty {
                    let joined = fields[cookieIndex].value
                    fields[cookieIndex].value = joined.isEmpty ? valueString : joined + "; " + valueString
                }
                return limitsExceeded()
            }
            cookieIndex = fields.count
        }
        fieldCount += 1
        fields.append(HTTPField(name: nameString, value: valueString))
        return limitsExceeded()
    }

    private mutating func pseudoHeader(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) -> HTTP2RequestRefusal? {
        let nameString = String(decoding: name, as: UTF8.self)
        // RFC 9113 §8.3: pseudo-headers come before every regular field and never in trailers.
        if part == .trailers || sawRegularField { return .malformed(.misplacedPseudoHeader(nameString)) }
        guard let valueString = Self.validValue(value), !valueString.isEmpty else {
            return .malformed(.missingPseudoHeader(nameString))
        }
        switch nameString {
        case ":method":
            guard method == nil else { return .malformed(.duplicatePseudoHeader(nameString)) }
            guard FieldBytes.isToken(value) else { return .malformed(.invalidMethod) }
            method = valueString
        case ":scheme":
            guard requestScheme == nil else { return .malformed(.duplicatePseudoHeader(nameString)) }
            requestScheme = valueString
        case ":authority":
            guard authority == nil else { return .malformed(.duplicatePseudoHeader(nameString)) }
            authority = valueString
        case ":path":
            guard path == nil else { return .malformed(.duplicatePseudoHeader(nameString)) }
            // The request line's limit (SPEC §6, 414 `uri-too-long`) applies to the path it becomes.
            if value.count > limits.requestLine { return .pathTooLong }
            path = valueString
        default:
            return .malformed(.unknownPseudoHeader(nameString))
        }
        return limitsExceeded()
    }

    private func limitsExceeded() -> HTTP2RequestRefusal? {
        if decodedSize > limits.headerSection || fieldCount > limits.headerCount {
            return part == .head ? .headerSectionTooLarge : .malformed(.trailerSectionTooLarge)
        }
        return nil
    }

    // MARK: - Grammar

    /// tchar (RFC 9110 §5.6.2) without uppercase letters: HTTP/2 field names are lowercase (RFC 9113 §8.2.1).
    @inline(__always)
    static func isLowercaseTchar(_ b: UInt8) -> Bool { FieldBytes.isLowercaseTchar(b) }

    /// A field value the HTTP/1.1 side can carry unchanged (RFC 9110 §5.5, RFC 9113 §8.2.1): VCHAR, SP, HTAB and
    /// UTF-8 obs-text; no NUL, CR, LF or other control; no leading or trailing SP/HTAB. nil when invalid.
    static func validValue(_ value: UnsafeRawBufferPointer) -> String? {
        guard let high = checkValueBytes(value) else { return nil }
        if high { return String(validating: value, as: UTF8.self) }
        return String(decoding: value, as: UTF8.self)
    }

    /// `validValue`'s byte rules alone, for a value that is a Swift `String` already (valid UTF-8): no allocation.
    static func isValidValue(_ value: UnsafeRawBufferPointer) -> Bool {
        checkValueBytes(value) != nil
    }

    /// nil when a byte breaks the rules; else whether any byte is above ASCII (UTF-8 left to check). The HTTP/1.1
    /// parser's own scan (`FieldBytes`), so both sides of the proxy refuse the same bytes.
    @inline(__always)
    private static func checkValueBytes(_ value: UnsafeRawBufferPointer) -> Bool? {
        FieldBytes.checkValue(value)
    }

    /// `content-length = 1*DIGIT` (RFC 9110 §8.6), at most 18 digits (below 2^63, as nghttp2 holds it).
    static func parseContentLength(_ value: UnsafeRawBufferPointer) -> UInt64? {
        guard !value.isEmpty, value.count <= 18 else { return nil }
        var n: UInt64 = 0
        for b in value {
            guard b >= UInt8(ascii: "0"), b <= UInt8(ascii: "9") else { return nil }
            n = n * 10 + UInt64(b - UInt8(ascii: "0"))
        }
        return n
    }

    /// `:authority` and `:path` read together by the HTTP/1.1 absolute-form rules (`RequestTarget`), so an h2
    /// request is held to the same target grammar as an HTTP/1.1 one: no userinfo, no fragment, a valid host and
    /// port, visible ASCII only. `*` is allowed for OPTIONS alone (RFC 9113 §8.3.1).
    static func checkTarget(scheme: String, authority: String, path: String, method: String) -> HTTP2Malformation? {
        if path == "*" {
            guard method == "OPTIONS" else { return .invalidTarget(path) }
            if case .failure = RequestTarget.parse(scheme + "://" + authority + "/", method: method) {
                return .invalidTarget(authority)
            }
            return nil
        }
        guard path.utf8.first == UInt8(ascii: "/") else { return .invalidTarget(path) }
        // The joined URL's parse, without joining it or building the target (`RequestTarget.isAbsolute`): its
        // authority ends at the first "/" or "?", so an authority with either in it would be read as part of the
        // path here and as an authority by whoever sees :authority alone; such a request is refused.
        return RequestTarget.isAbsolute(scheme: scheme, authority: authority, path: path)
            ? nil : .invalidTarget(authority + path)
    }
}
