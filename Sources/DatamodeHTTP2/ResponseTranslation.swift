/// HTTP/1.1 responses into HTTP/2 fields, and the checks every field the proxy sends in HTTP/2 must pass.
///
/// Translation is strict in both directions (SPEC §17): the proxy never sends what it would refuse to receive.
/// nghttp2 does not validate the fields an application submits, so the codec does, before it submits them.
import DatamodeHTTP

/// Where the fields of a head the codecs send come from, for the checks before they are submitted (nghttp2
/// submits what it is given).
public enum HTTP2FieldSource: Sendable {
    /// Anything: every field is checked (`HTTP2ResponseTranslation.problem(with:)`), and one that fails is refused.
    case unchecked
    /// Translated from an HTTP/1.1 head that `HTTP1Parser` read or that `HeadHandoff` accepted
    /// (`HTTP2ResponseTranslation.fields(of:)`, `HTTP2OriginRequestTranslation.request(of:)`): every name is a
    /// token and every value a field value by `FieldBytes`' scans, the same scans `problem(with:)` runs; the
    /// translations lowercase the names, keep the values (or write `te: trailers`) and drop the
    /// connection-specific fields. Nothing is left for the checks to find (`FieldSourceTests` holds it on random
    /// and mutated heads).
    case translatedFromHTTP1Head
}

public enum HTTP2ResponseTranslation {
    /// The fields of an HTTP/1.1 response head (RFC 9112) as HTTP/2 carries them (RFC 9113 §8.2): names
    /// lowercased; the connection-specific fields (`connection`, `keep-alive`, `proxy-connection`,
    /// `transfer-encoding`, `upgrade`, `te`) dropped, and every field the origin's `Connection` names (hop-by-hop,
    /// RFC 9110 §7.6.1). The status line's reason phrase has no place in HTTP/2 and goes; the status becomes
    /// `:status`, written by the session. `content-length` stays: the engine relays exactly that many bytes; but not
    /// on a 1xx or a 204, where a server must not send it (RFC 9110 §8.6) and an HTTP/2 client takes one that
    /// disagrees with the (absent) DATA as a malformed response (RFC 9113 §8.1.1): curl's nghttp2 failed the
    /// request, where an HTTP/1.1 client is served (session 17's review). A 1xx, which only tells of the final response
    /// to come (RFC 9110 §15.2: `Link` hints), loses a `host` too: a request's field an origin echoed into its interim
    /// head, which `:authority` stands for in HTTP/2 (RFC 9113 §8.3.1) and no client acts on (session 18's review).
    public static func fields(of head: ResponseHead) -> [HTTPField] {
        let named = head.connectionTokens
        let interim = head.status < 200
        let lengthNotAllowed = interim || head.status == 204
        var fields: [HTTPField] = []
        fields.reserveCapacity(head.fields.count)
        // By index: `for field in head.fields` copied each field (a retain and a release per string).
        for i in head.fields.indices {
            let name = lowercased(head.fields[i].name)
            if isConnectionSpecific(name) || named.fieldNames.contains(name) { continue }
            if lengthNotAllowed && name == "content-length" { continue }
            if interim && name == "host" { continue }
            fields.append(HTTPField(name: name, value: head.fields[i].value))
        }
        return fields
    }

    /// The fields of a trailer section (from a chunked HTTP/1.1 body) as HTTP/2 trailers: names lowercased, and
    /// without what no trailer may carry on (`TrailerSection`: the connection-specific fields of `fields(of:)`, and
    /// framing and routing, RFC 9110 §6.5.1).
    public static func trailerFields(_ trailers: [HTTPField]) -> [HTTPField] {
        trailers.compactMap { field in
            TrailerSection.isDropped(field.name) ? nil : HTTPField(name: lowercased(field.name), value: field.value)
        }
    }

    /// Why `field` cannot go out in HTTP/2, or nil: the checks `HTTP2ServerSession` applies to every field it is
    /// given (RFC 9113 §8.2.1, §8.2.2).
    public static func problem(with field: HTTPField) -> String? {
        // The connection-specific names are lowercase tokens: the order of the checks does not change the answer.
        if isConnectionSpecific(field.name) { return "connection-specific field \(field.name)" }
        return problem(name: field.name, value: field.value)
    }

    /// `problem(with:)` for a field whose name is known not to be connection-specific.
    static func problem(name: String, value: String) -> String? {
        guard isLowercaseToken(name) else { return "field name \"\(name)\" is not a lowercase token" }
        let valid = value.withUTF8Bytes { HTTP2RequestBuilder.isValidValue(UnsafeRawBufferPointer($0)) }
        guard valid else { return "invalid value for \(name)" }
        return nil
    }

    private static func isLowercaseToken(_ name: String) -> Bool {
        // Over the contiguous bytes: iterating a String's UTF8View byte by byte costs several times as much.
        return name.withUTF8Bytes { FieldBytes.isLowercaseToken(UnsafeRawBufferPointer($0)) }
    }

    /// The fields RFC 9113 §8.2.2 forbids in HTTP/2 (`te` is allowed only as `te: trailers`, which no response
    /// carries, so responses drop it whole).
    static func isConnectionSpecific(_ lowercaseName: String) -> Bool {
        // Gated on the length first: most names match none of the lengths, and a String switch compares each case.
        switch lowercaseName.utf8.count {
        case 2: lowercaseName == "te"
        case 7: lowercaseName == "upgrade"
        case 10: lowercaseName == "connection" || lowercaseName == "keep-alive"
        case 16: lowercaseName == "proxy-connection"
        case 17: lowercaseName == "transfer-encoding"
        default: false
        }
    }

    /// `s` with ASCII uppercase letters lowercased; `s` itself when it has none. One buffer, no intermediate
    /// array: a name of up to 15 bytes stays a small string (no allocation at all).
    static func lowercased(_ s: String) -> String {
        // Over the contiguous bytes, as `isLowercaseToken`: the generic UTF8View walk was most of a head's
        // translation (callgrind, issue 26).
        return s.withUTF8Bytes { utf8 in
            guard FieldBytes.hasUppercase(UnsafeRawBufferPointer(utf8)) else { return nil }
            return String(unsafeUninitializedCapacity: utf8.count) { buffer in
                for i in utf8.indices {
                    let b = utf8[i]
                    buffer[i] = b &- UInt8(ascii: "A") < 26 ? b | 0x20 : b
                }
                return utf8.count
            }
        } ?? s
    }
}
