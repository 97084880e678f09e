/// An HTTP/1.1 request the engine forwards, as the request of an HTTP/2 stream to an origin (SPEC §17 "Origin side").
///
/// The engine's exchanges speak HTTP/1.1 to their upstream; when the origin chose h2 the request they wrote is read
/// back (strictly, by `HTTP1Parser`) and sent as HEADERS with these fields. Translation is as strict this way as
/// the other (the proxy never sends what it would refuse to receive): names lowercased, `Host` becomes
/// `:authority`, the connection-specific fields and every field the request's `Connection` names are dropped
/// (RFC 9113 §8.2.2), `te` kept only as `te: trailers`; a field whose value HTTP/2 cannot carry refuses the request.
import DatamodeHTTP

/// The pseudo-headers and fields of an HTTP/2 request to an origin.
public struct HTTP2OriginRequest: Hashable, Sendable {
    public var method: String
    public var authority: String
    /// Origin-form (`/…`), or `*` for a server-wide OPTIONS.
    public var path: String
    public var fields: [HTTPField]

    public init(method: String, authority: String, path: String, fields: [HTTPField]) {
        self.method = method
        self.authority = authority
        self.path = path
        self.fields = fields
    }
}

public enum HTTP2OriginRequestTranslation {
    /// `head` as an HTTP/2 request; `defaultAuthority` when it has no `Host` (HTTP/1.0). The error says why it
    /// cannot go out in HTTP/2. `source` `.translatedFromHTTP1Head`: `head` is one `HTTP1Parser` read or
    /// `HeadHandoff.request` accepted, and its fields' names and values need no second check (debug builds check
    /// them anyway, and stop on one that fails).
    public static func request(of head: RequestHead, defaultAuthority: String,
                               from source: HTTP2FieldSource = .unchecked) -> Result<HTTP2OriginRequest, HTTP2SessionError> {
        guard head.method != "CONNECT" else { return .failure(.invalidField("CONNECT is not forwarded over HTTP/2")) }
        var path = head.target
        var targetAuthority: String?
        if !(path.hasPrefix("/") || path == "*") {
            // Absolute-form (RFC 9112 §3.2.2): the authority and path of the URL.
            let utf8 = Array(path.utf8)
            guard let colon = utf8.firstIndex(of: UInt8(ascii: ":")), utf8.count > colon + 2,
                  utf8[colon + 1] == UInt8(ascii: "/"), utf8[colon + 2] == UInt8(ascii: "/") else {
                return .failure(.invalidField("request target \(head.target) is neither origin- nor absolute-form"))
            }
            let rest = Substring(String(decoding: utf8[(colon + 3)...], as: UTF8.self))
            let slash = rest.firstIndex(where: { $0 == "/" || $0 == "?" }) ?? rest.endIndex
            targetAuthority = String(rest[..<slash])
            let tail = String(rest[slash...])
            path = tail.isEmpty ? "/" : (tail.hasPrefix("?") ? "/" + tail : tail)
        }
        // One pass for the fields that decide the rest: Host (at most one) and whether any Connection names options.
        var host: String?
        var hostCount = 0
        var hasConnection = false
        // By index, here and below: `for field in head.fields` copied each field (a retain and a release per string).
        for i in head.fields.indices {
            switch head.fields[i].name.utf8.count {
            case 4 where ASCII.equalsIgnoringCase(head.fields[i].name, "host"):
                hostCount += 1
                if host == nil { host = head.fields[i].value }
            case 10 where ASCII.equalsIgnoringCase(head.fields[i].name, "connection"):
                hasConnection = true
            default:
                break
            }
        }
        guard hostCount <= 1 else { return .failure(.invalidField("more than one Host field")) }
        let authority = targetAuthority ?? host ?? defaultAuthority
        guard !authority.isEmpty else { return .failure(.invalidField("no authority")) }
        let named = hasConnection ? head.connectionTokens.fieldNames : []
        var fields: [HTTPField] = []
        fields.reserveCapacity(head.fields.count)
        for i in head.fields.indices {
            let name = HTTP2ResponseTranslation.lowercased(head.fields[i].name)
            if name == "host" || (!named.isEmpty && named.contains(name)) { continue }
            if name == "te" {
                // `te: trailers` is the one TE HTTP/2 carries (RFC 9113 §8.2.2).
                if head.fields[i].value.split(separator: ",").contains(where: {
                    ASCII.equalsIgnoringCase($0.trimmingSpaces, "trailers")
                }) {
                    fields.append(HTTPField(name: "te", value: "trailers"))
                }
                continue
            }
            if HTTP2ResponseTranslation.isConnectionSpecific(name) { continue }
            switch source {
            case .unchecked:
                if let problem = HTTP2ResponseTranslation.problem(name: name, value: head.fields[i].value) {
                    return .failure(.invalidField(problem))
                }
            case .translatedFromHTTP1Head:
                assert(HTTP2ResponseTranslation.problem(name: name, value: head.fields[i].value) == nil,
                       "a field of a checked HTTP/1.1 head fails the HTTP/2 field checks")
            }
            fields.append(HTTPField(name: name, value: head.fields[i].value))
        }
        return .success(HTTP2OriginRequest(method: head.method, authority: authority, path: path, fields: fields))
    }
}

extension Substring {
    /// Without leading and trailing spaces and tabs (OWS, RFC 9110 §5.6.3).
    var trimmingSpaces: String {
        let isSpace: (Character) -> Bool = { $0 == " " || $0 == "\t" }
        guard let start = firstIndex(where: { !isSpace($0) }), let end = lastIndex(where: { !isSpace($0) }) else { return "" }
        return String(self[start...end])
    }
}
