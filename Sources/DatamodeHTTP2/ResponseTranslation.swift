/// HTTP/1.1 responses into HTTP/2 fields, and the checks every field the proxy sends in HTTP/2 must pass.
///
/// Translation is strict in both directions (SPEC §17): the proxy never sends what it would refuse to receive.
/// nghttp2 does not validate the fields an application submits, so the codec does, before it submits them.
import DatamodeHTTP

public enum HTTP2ResponseTranslation {
    /// The fields of an HTTP/1.1 response head (RFC 9112) as HTTP/2 carries them (RFC 9113 §8.2): names
    /// lowercased; the connection-specific fields (`connection`, `keep-alive`, `proxy-connection`,
    /// `transfer-encoding`, `upgrade`, `te`) dropped, and every field the origin's `Connection` names (hop-by-hop,
    /// RFC 9110 §7.6.1). The status line's reason phrase has no place in HTTP/2 and goes; the status becomes
    /// `:status`, written by the session. `content-length` stays: the engine relays exactly that many bytes.
    public static func fields(of head: ResponseHead) -> [HTTPField] {
        let named = head.connectionTokens
        var fields: [HTTPField] = []
        fields.reserveCapacity(head.fields.count)
        for field in head.fields {
            let name = lowercased(field.name)
            if isConnectionSpecific(name) || named.fieldNames.contains(name) { continue }
            fields.append(HTTPField(name: name, value: field.value))
        }
        return fields
    }

    /// The fields of a response's trailer section (from a chunked HTTP/1.1 body) as HTTP/2 trailers: the same
    /// rules as `fields(of:)` and no framing or routing fields (RFC 9110 §6.5.1).
    public static func trailerFields(_ trailers: [HTTPField]) -> [HTTPField] {
        trailers.compactMap { field in
            let name = lowercased(field.name)
            if isConnectionSpecific(name) || name == "content-length" || name == "host" || name == "trailer" {
                return nil
            }
            return HTTPField(name: name, value: field.value)
        }
    }

    /// Why `field` cannot go out in HTTP/2, or nil: the checks `HTTP2ServerSession` applies to every field it is
    /// given (RFC 9113 §8.2.1, §8.2.2).
    public static func problem(with field: HTTPField) -> String? {
        let name = field.name.utf8
        guard !name.isEmpty, name.allSatisfy(HTTP2RequestBuilder.isLowercaseTchar) else {
            return "field name \"\(field.name)\" is not a lowercase token"
        }
        if isConnectionSpecific(field.name) { return "connection-specific field \(field.name)" }
        var value = field.value
        let valid = value.withUTF8 { HTTP2RequestBuilder.isValidValue(UnsafeRawBufferPointer($0)) }
        guard valid else { return "invalid value for \(field.name)" }
        return nil
    }

    /// The fields RFC 9113 §8.2.2 forbids in HTTP/2 (`te` is allowed only as `te: trailers`, which no response
    /// carries, so responses drop it whole).
    static func isConnectionSpecific(_ lowercaseName: String) -> Bool {
        switch lowercaseName {
        case "connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "te": true
        default: false
        }
    }

    static func lowercased(_ s: String) -> String {
        guard s.utf8.contains(where: { $0 >= UInt8(ascii: "A") && $0 <= UInt8(ascii: "Z") }) else { return s }
        return String(decoding: s.utf8.map { $0 >= UInt8(ascii: "A") && $0 <= UInt8(ascii: "Z") ? $0 | 0x20 : $0 },
                      as: UTF8.self)
    }
}
