import DatamodeHTTP
import DatamodePolicy

/// Builds the heads this proxy writes: the request it forwards upstream, the response it relays to the
/// client, and the responses it makes itself.
enum MessageHeads {
    /// This proxy's Via token (RFC 9110 §7.6.3). A request that already carries it has looped back to us.
    static let viaToken = "datamode-proxy"
    static let viaValue = "1.1 datamode-proxy"

    /// Header fields never forwarded, whichever way (RFC 9110 §7.6.1): they describe one connection, not the
    /// message. `Proxy-Authorization` is our own credential and must not leak to an origin; `Host` is always
    /// regenerated from the request target so the two can never disagree (a classic cache-poisoning vector).
    /// The client's `Allow-*` tags are replaced by the resolved ones (SPEC §3, §15): exactly one of each, never
    /// the client's copy beside ours.
    private static let requestHopByHop: Set<String> = [
        "connection", "proxy-connection", "keep-alive", "te", "trailer", "upgrade",
        "proxy-authorization", "host", "allow-constrained", "allow-expensive", "allow-ultra-constrained",
    ]
    private static let responseHopByHop: Set<String> = [
        "connection", "proxy-connection", "keep-alive", "te", "trailer", "upgrade", "proxy-authenticate",
    ]

    /// The preconditions of RFC 9110 §13.1. A client sends them about its cached copy of the URL it asked for; a
    /// variant target is another resource, and its answer to them (a `304`, a `412`, a `206` of other bytes)
    /// would be applied to the original URL's cache entry. Not forwarded to a variant target (SPEC §5).
    private static let conditionalRequestFields: Set<String> = [
        "if-none-match", "if-modified-since", "if-match", "if-unmodified-since", "if-range",
    ]
    /// What lets a cache store, reuse or revalidate a response (RFC 9111 §5.2, §5.3; RFC 9110 §8.8): a variant
    /// served in place of the requested URL must never be cached as it, so the target's are replaced by
    /// `Cache-Control: no-store` (SPEC §5). `Expires` goes too, for HTTP/1.0 caches that ignore Cache-Control.
    private static let variantCachingFields: Set<String> = ["cache-control", "etag", "last-modified", "expires"]

    /// Whether any `Via` member of the request was added by this proxy.
    static func hasOwnVia(_ head: RequestHead) -> Bool {
        for value in head.values(of: "via") {
            for member in value.split(separator: ",") {
                // received-protocol SP received-by [comment]
                let parts = member.split(separator: " ", omittingEmptySubsequences: true)
                if parts.count >= 2, parts[1].lowercased() == viaToken { return true }
            }
        }
        return false
    }

    /// The request sent upstream: origin-form target, `Host` from the target, hop-by-hop fields removed, the
    /// resolved data-mode tags (all three, SPEC §3 and §15), `Save-Data` while constrained, and our `Via`.
    /// `framing` is the request's validated framing: a `Content-Length` is written once, as the number the
    /// parser accepted (a `5, 5` list or duplicate fields become one `Content-Length: 5`, RFC 9110 §8.6).
    /// `variantTarget`: the request goes to a variant's target in place of the URL the client asked for, so the
    /// client's preconditions about its cached original are dropped, and with `If-Range` the `Range` it guards
    /// (those bytes would be spliced onto the original's): the client gets the variant whole. A plain `Range`
    /// (a player seeking in what it is being served) is kept.
    static func forwardedRequest(_ head: RequestHead, target: RequestTarget, tags: RequestTags,
                                 settings: TagSettings, mode: DataMode, upgrade: Bool, framing: BodyFraming,
                                 connectionTokens listed: Set<String>, variantTarget: Bool = false) -> [UInt8] {
        var writer = HeadWriter(capacity: 256 + head.fields.count * 48)
        writer.requestLine(method: head.method, target: target.path, version: .http11)
        writer.field("Host", target.hostHeaderValue)
        let addSaveData = settings.saveData && mode.constrained
        let dropRange = variantTarget && head.contains("if-range")
        for field in head.fields {
            let name = field.name.lowercased()
            if requestHopByHop.contains(name) {
                if upgrade && name == "upgrade" { writer.field(field.name, field.value) }
                continue
            }
            if listed.contains(name) { continue }
            if variantTarget && conditionalRequestFields.contains(name) { continue }
            if dropRange && name == "range" { continue }
            if addSaveData && name == "save-data" { continue }
            // The framing sent is always our own, written from the parse below, never what survived filtering:
            // `Connection: Transfer-Encoding` once removed the header but not the chunks (request smuggling).
            if name == "content-length" || name == "transfer-encoding" { continue }
            writer.field(field.name, field.value)
        }
        switch framing {
        case .contentLength(let length): writer.field("Content-Length", String(length))
        case .chunked: writer.field("Transfer-Encoding", "chunked")
        case .none, .untilClose: break
        }
        if upgrade { writer.field("Connection", "upgrade") }
        writer.field("Via", viaValue)
        if settings.forward {
            writer.field("Allow-Constrained", tags.allowConstrained ? "?1" : "?0")
            writer.field("Allow-Expensive", tags.allowExpensive ? "?1" : "?0")
            writer.field("Allow-Ultra-Constrained", tags.allowUltraConstrained ? "?1" : "?0")
        }
        if addSaveData { writer.field("Save-Data", "on") }
        writer.end()
        return writer.bytes
    }

    /// The response relayed to the client: hop-by-hop fields removed, our `Via`, the connection's fate, and
    /// `Data-Mode-Variant` when a variant served it. A variant's response stands in for the requested URL, so its
    /// caching fields are replaced by `Cache-Control: no-store` (SPEC §5): a browser back in normal mode must
    /// fetch the real resource, not revalidate the low-res one.
    static func relayedResponse(_ head: ResponseHead, keepAlive: Bool, clientVersion: HTTPVersion,
                                stripTransferEncoding: Bool, variant: String?, upgrade: Bool = false,
                                framing: BodyFraming? = nil, connectionTokens: Set<String>? = nil) -> [UInt8] {
        var writer = HeadWriter(capacity: 256 + head.fields.count * 48)
        writer.statusLine(version: .http11, status: head.status, reason: head.reason)
        let listed = connectionTokens ?? head.connectionTokens
        // A body's framing is written from the parse, never copied (see forwardedRequest); only bodiless
        // responses (HEAD, 204, 304) keep the origin's Content-Length, which then describes the resource.
        let ownFraming: Bool
        switch framing {
        case .contentLength?, .chunked?, .untilClose?: ownFraming = true
        case .none?, nil: ownFraming = false
        }
        let inPlace = variant != nil && !upgrade
        for field in head.fields {
            let name = field.name.lowercased()
            if responseHopByHop.contains(name) {
                if upgrade && name == "upgrade" { writer.field(field.name, field.value) }
                continue
            }
            if listed.contains(name) { continue }
            if stripTransferEncoding && name == "transfer-encoding" { continue }
            if variant != nil && name == "data-mode-variant" { continue }
            if inPlace && variantCachingFields.contains(name) { continue }
            if ownFraming && (name == "content-length" || name == "transfer-encoding") { continue }
            writer.field(field.name, field.value)
        }
        switch framing {
        case .contentLength(let length)?: writer.field("Content-Length", String(length))
        case .chunked? where !stripTransferEncoding: writer.field("Transfer-Encoding", "chunked")
        default: break
        }
        writer.field("Via", viaValue)
        if let variant { writer.field("Data-Mode-Variant", variant) }
        if inPlace { writer.field("Cache-Control", "no-store") }
        if upgrade {
            writer.field("Connection", "upgrade")
        } else if head.status >= 200 {
            if !keepAlive {
                writer.field("Connection", "close")
            } else if clientVersion == .http10 {
                writer.field("Connection", "keep-alive")
            }
        }
        writer.end()
        return writer.bytes
    }

    /// A response the proxy makes itself, with a complete body.
    static func local(status: Int, reason: String, fields: [(String, String)], bodyLength: Int, keepAlive: Bool,
                      clientVersion: HTTPVersion) -> [UInt8] {
        var writer = HeadWriter(capacity: 256)
        writer.statusLine(version: .http11, status: status, reason: reason)
        for (name, value) in fields { writer.field(name, value) }
        writer.field("Content-Length", String(bodyLength))
        writer.field("Via", viaValue)
        if !keepAlive {
            writer.field("Connection", "close")
        } else if clientVersion == .http10 {
            writer.field("Connection", "keep-alive")
        }
        writer.end()
        return writer.bytes
    }
}
