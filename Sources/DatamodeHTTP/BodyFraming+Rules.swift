/// Message body length rules (RFC 9112 §6), strict.
///
/// Request smuggling lives here: when the proxy and the origin compute different body lengths for the same
/// bytes, the remainder of one request is read by the origin as the start of another (CL.TE, TE.CL, TE.TE,
/// CL.CL). So every framing that two compliant-but-lenient implementations could read differently is refused
/// instead of "repaired": both Transfer-Encoding and Content-Length, any coding list other than exactly
/// `chunked`, Content-Length values that are signed, hex, padded or disagree.
extension RequestHead {
    /// How this request's body is delimited, or why the framing is refused (400, connection closed).
    public func bodyFraming() -> Result<BodyFraming, HTTPWireError> {
        // RFC 9112 §6.3 rule 7: a request with neither Transfer-Encoding nor Content-Length has no body.
        FramingFields(fields).strictFraming(version: version, message: "request", otherwise: .none)
    }
}

extension ResponseHead {
    /// How this response's body is delimited (RFC 9112 §6.3), given the method of the request it answers,
    /// or why the framing is refused (502 `upstream-protocol-error`, connection to the origin closed).
    public func bodyFraming(requestMethod: String) -> Result<BodyFraming, HTTPWireError> {
        // RFC 9112 §6.3 rule 1: responses to HEAD, 1xx, 204 and 304 end at the head, whatever their fields say
        // (a HEAD response carries the Content-Length the GET would have had).
        Self.bodyFraming(status: status, requestMethod: requestMethod) {
            // Rule 8: with neither field the body runs until the origin closes the connection.
            FramingFields(fields).strictFraming(version: version, message: "response", otherwise: .untilClose)
        }
    }

    /// The rules that end a response at its head whatever its fields say; `byFields` decides the others.
    @inline(__always)
    static func bodyFraming(status: Int, requestMethod: String,
                            byFields: () -> Result<BodyFraming, HTTPWireError>) -> Result<BodyFraming, HTTPWireError> {
        if requestMethod == "HEAD" { return .success(.none) }
        if status < 200 || status == 204 || status == 304 { return .success(.none) }
        // Rule 2: a 2xx to CONNECT turns the connection into a tunnel; there is no body to frame.
        if requestMethod == "CONNECT" && status < 300 { return .success(.none) }
        return byFields()
    }
}

extension FramingFields {
    /// The strict framing decision shared by requests and responses; `otherwise` is the framing of a message
    /// with neither Transfer-Encoding nor Content-Length.
    func strictFraming(version: HTTPVersion, message: String, otherwise: BodyFraming) -> Result<BodyFraming, HTTPWireError> {
        if let error { return .failure(error) }
        if hasTransferEncoding {
            // RFC 9112 §6.1: Transfer-Encoding overrides Content-Length, and a sender MUST NOT send both, but
            // intermediaries that honour the other one are exactly the CL.TE / TE.CL attack (on responses:
            // response queue poisoning of a downstream cache or client); refuse.
            if contentLength != nil {
                return .failure(.malformed("both Transfer-Encoding and Content-Length"))
            }
            // RFC 9112 §6.1: an HTTP/1.0 message with Transfer-Encoding MUST be treated as having faulty
            // framing: 1.0 recipients do not know chunked and would read the chunks as the body.
            if version == .http10 {
                return .failure(.malformed("Transfer-Encoding in an HTTP/1.0 \(message)"))
            }
            // RFC 9112 §6.3 rule 4: a request whose final coding is not chunked cannot be delimited (400); a
            // response's would be read until close, which a proxy that re-frames it cannot do safely. We go
            // further and accept only the single coding `chunked`: `chunked, chunked` or `gzip, chunked` are
            // read differently by different servers (TE.TE).
            guard transferEncodingIsChunkedOnly else {
                return .failure(.malformed("Transfer-Encoding other than chunked"))
            }
            return .success(.chunked)
        }
        if let contentLength { return .success(.contentLength(contentLength)) }
        return .success(otherwise)
    }
}

/// The framing-relevant facts of a field list, gathered in one pass without allocating.
struct FramingFields {
    var hasTransferEncoding = false
    /// True if every Transfer-Encoding copy, joined with commas, is exactly one `chunked` (any case, OWS around).
    var transferEncodingIsChunkedOnly = false
    /// The Transfer-Encoding codings seen so far, and whether each was `chunked`.
    private var codings = 0
    private var allChunked = true
    /// The agreed Content-Length, if any copy is present and all are valid and equal.
    var contentLength: UInt64?
    /// A Content-Length problem; reported before anything else is decided.
    var error: HTTPWireError?

    /// 18 decimal digits always fit in UInt64 and exceed any body we would stream; more is refused rather than
    /// risk an overflow that a lenient peer would wrap or truncate.
    static let maxContentLengthDigits = 18

    init() {}

    init(_ fields: [HTTPField]) {
        // By index: `for field in fields` copied each field (a retain and a release per string) around the calls
        // below, which take an `inout` (callgrind: ~46 each per HTTP/2 request). A name's length decides before its
        // bytes are looked at.
        for i in fields.indices where Self.mayCount(nameLength: fields[i].name.utf8.count) {
            fields[i].name.withUTF8Bytes { name in
                fields[i].value.withUTF8Bytes { value in add(name: name, value: value) }
            }
        }
    }

    /// Whether a name this long may be one `add` counts (most names are not: nothing else is looked at).
    @inline(__always)
    static func mayCount(nameLength n: Int) -> Bool { n == 17 || n == 14 || n == 10 }

    /// Takes one field line into the facts: a copy of `Transfer-Encoding`, `Content-Length` or `Connection`
    /// (any case) counts, any other name is ignored. Both spellings of a head (Strings, or offsets into the bytes
    /// parsed: `ResponseHeadSpans`) come here, so there is one set of framing rules.
    mutating func add(name: UnsafeBufferPointer<UInt8>, value: UnsafeBufferPointer<UInt8>) {
        switch name.count {
        case 17 where ASCII.equalsIgnoringCase(name, "transfer-encoding"):
            hasTransferEncoding = true
            Self.scanCodings(value, count: &codings, allChunked: &allChunked)
            transferEncodingIsChunkedOnly = codings == 1 && allChunked
        case 14 where ASCII.equalsIgnoringCase(name, "content-length"):
            if error == nil { scanContentLength(value) }
        case 10 where ASCII.equalsIgnoringCase(name, "connection"):
            if error == nil, let named = Self.framingFieldNamed(inConnection: value) {
                error = .malformed("Connection names \(named)")
            }
        default:
            break
        }
    }

    /// RFC 9110 §7.6.1 lets `Connection` name fields to remove before forwarding. Naming a framing field asks
    /// a proxy to forward the body without the field that delimits it: the chunks of `Connection:
    /// Transfer-Encoding` + `Transfer-Encoding: chunked` reach the origin raw, and their data is read as the
    /// next request on a pooled connection (request smuggling; on responses, a desynchronised client).
    /// `Host` is refused for the same reason: removing it would leave the origin to guess the authority.
    /// Returns the first such token found.
    static func framingFieldNamed(inConnection u: UnsafeBufferPointer<UInt8>) -> String? {
        var start = 0
        for i in 0...u.count where i == u.count || u[i] == 0x2C {
            let (a, b) = ASCII.trimOWS(u, start, i)
            start = i + 1
            let token = UnsafeBufferPointer(rebasing: u[a..<b])
            switch token.count {
            case 14 where ASCII.equalsIgnoringCase(token, "content-length"): return "Content-Length"
            case 17 where ASCII.equalsIgnoringCase(token, "transfer-encoding"): return "Transfer-Encoding"
            case 4 where ASCII.equalsIgnoringCase(token, "host"): return "Host"
            default: continue
            }
        }
        return nil
    }

    /// Counts the comma-separated codings of one Transfer-Encoding field value. An empty element counts as a
    /// coding that is not `chunked`, so `chunked,` and an empty copy next to `chunked` are both refused.
    private static func scanCodings(_ u: UnsafeBufferPointer<UInt8>, count: inout Int, allChunked: inout Bool) {
        var start = 0
        var i = 0
        while i <= u.count {
            if i == u.count || u[i] == 0x2C {
                let (a, b) = ASCII.trimOWS(u, start, i)
                count += 1
                if !isChunked(u, a, b) { allChunked = false }
                start = i + 1
            }
            i += 1
        }
    }

    private static func isChunked(_ u: UnsafeBufferPointer<UInt8>, _ a: Int, _ b: Int) -> Bool {
        let word: StaticString = "chunked"
        guard b - a == word.utf8CodeUnitCount else { return false }
        let w = word.utf8Start
        for k in 0..<(b - a) where ByteClass.lower(u[a + k]) != w[k] { return false }
        return true
    }

    /// RFC 9110 §8.6: `Content-Length = 1*DIGIT`. A list of identical values (`5, 5`, or the same value in two
    /// field lines) was produced by a merging intermediary and MAY be accepted as one; any difference is the
    /// CL.CL smuggling vector and is refused. Signs, hex, inner spaces and empty elements are refused too:
    /// `parseInt`-style parsers accept them and would disagree with us.
    private mutating func scanContentLength(_ u: UnsafeBufferPointer<UInt8>) {
        var agreed: UInt64?
        var start = 0
        var i = 0
        while i <= u.count {
            if i == u.count || u[i] == 0x2C {
                let (a, b) = ASCII.trimOWS(u, start, i)
                guard b > a else { return error = .malformed("empty Content-Length") }
                guard b - a <= Self.maxContentLengthDigits else { return error = .malformed("Content-Length too large") }
                var v: UInt64 = 0
                for k in a..<b {
                    let d = u[k]
                    guard ByteClass.isDigit(d) else { return error = .malformed("invalid Content-Length") }
                    v = v * 10 + UInt64(d &- 0x30)
                }
                if let agreed, agreed != v { return error = .malformed("conflicting Content-Length values") }
                agreed = v
                start = i + 1
            }
            i += 1
        }
        // The loop ends on i == u.count, which always sets `agreed` or returns.
        guard let value = agreed else { return }
        if let contentLength, contentLength != value {
            error = .malformed("conflicting Content-Length values")
        } else {
            contentLength = value
        }
    }
}
