import DatamodeHTTP
import DatamodePolicy

/// Builds the heads this proxy writes: the request it forwards upstream, the response it relays to the
/// client, and the responses it makes itself.
enum MessageHeads {
    /// This proxy's Via token (RFC 9110 §7.6.3). A request that already carries it has looped back to us.
    static let viaToken = "datamode-proxy"
    static let viaValue = "1.1 datamode-proxy"
    static let via = PreparedField("Via", "1.1 datamode-proxy")
    /// The three data-mode tags (SPEC §3), each allowed (`?1`) or not.
    static let constrainedAllowed = PreparedField("Allow-Constrained", "?1")
    static let constrainedNotAllowed = PreparedField("Allow-Constrained", "?0")
    static let expensiveAllowed = PreparedField("Allow-Expensive", "?1")
    static let expensiveNotAllowed = PreparedField("Allow-Expensive", "?0")
    static let ultraConstrainedAllowed = PreparedField("Allow-Ultra-Constrained", "?1")
    static let ultraConstrainedNotAllowed = PreparedField("Allow-Ultra-Constrained", "?0")
    static let saveData = PreparedField("Save-Data", "on")

    // Header fields never forwarded, whichever way (RFC 9110 §7.6.1; `KnownField.isRequestHopByHop` and
    // `isResponseHopByHop`): they describe one connection, not the message. `Proxy-Authorization` is our own
    // credential and must not leak to an origin; `Host` is always regenerated from the request target so the two
    // can never disagree (a classic cache-poisoning vector). The client's `Allow-*` tags are replaced by the
    // resolved ones (SPEC §3, §15): exactly one of each, never the client's copy beside ours.
    //
    // The preconditions of RFC 9110 §13.1 (`KnownField.isConditional`): a client sends them about its cached
    // copy of the URL it asked for; a variant target is another resource, and its answer to them (a `304`, a
    // `412`, a `206` of other bytes) would be applied to the original URL's cache entry. Not forwarded to a
    // variant target (SPEC §5). What lets a cache store or revalidate a response (`KnownField.isCaching`) is
    // removed from a variant served in place of the requested URL.

    /// Whether the Connection header lists any field name that is not removed anyway (`close`, `keep-alive`
    /// and the hop-by-hop names): only then is each field checked against the list.
    private static func listsOtherFields(_ listed: ConnectionOptions, request: Bool) -> Bool {
        listed.fieldNames.contains { token in
            let known = KnownField.of(token)
            return !(request ? known.isRequestHopByHop : known.isResponseHopByHop)
        }
    }

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
    /// `asHead`: the head, not its text, for a stream of an origin's HTTP/2 connection, which takes it in memory
    /// (`HTTP2OriginStream.take`). The same function writes both, so the head is what the text would parse to
    /// (`HeadHandoff` checks that it would, field by field, before the head is handed).
    static func forwardedRequest(_ head: RequestHead, target: RequestTarget, tags: RequestTags,
                                 settings: TagSettings, mode: DataMode, upgrade: Bool, framing: BodyFraming,
                                 connectionTokens listed: ConnectionOptions, variantTarget: Bool = false,
                                 asHead: Bool = false) -> ForwardedHead {
        if asHead {
            var builder = RequestHeadBuilder(capacity: head.fields.count + 8)
            forwardedRequest(head, target: target, tags: tags, settings: settings, mode: mode, upgrade: upgrade,
                             framing: framing, connectionTokens: listed, variantTarget: variantTarget, into: &builder)
            return .head(builder.head)
        }
        var writer = HeadWriter(capacity: 256 + head.fields.count * 48)
        forwardedRequest(head, target: target, tags: tags, settings: settings, mode: mode, upgrade: upgrade,
                         framing: framing, connectionTokens: listed, variantTarget: variantTarget, into: &writer)
        return .text(writer.take())
    }

    private static func forwardedRequest<Sink: RequestHeadSink>(_ head: RequestHead, target: RequestTarget,
                                                                tags: RequestTags, settings: TagSettings,
                                                                mode: DataMode, upgrade: Bool, framing: BodyFraming,
                                                                connectionTokens listed: ConnectionOptions,
                                                                variantTarget: Bool, into writer: inout Sink) {
        writer.requestLine(method: head.method, target: target.path, version: .http11)
        writer.field("Host", target.hostHeaderValue)
        let addSaveData = settings.saveData && mode.constrained
        let dropRange = variantTarget && head.fields.contains { KnownField.of($0.name) == .ifRange }
        let checkListed = !listed.isEmpty && listsOtherFields(listed, request: true)
        // By index, as the response's loop below: `for field in head.fields` copied every field (a retain and a
        // release per string) around the calls in the body.
        let fields = head.fields
        for i in fields.indices {
            let known = KnownField.of(fields[i].name)
            if known.isRequestHopByHop {
                if upgrade && known == .upgrade { writer.field(fields[i].name, fields[i].value) }
                continue
            }
            if checkListed && listed.contains(fields[i].name) { continue }
            if variantTarget && known.isConditional { continue }
            if dropRange && known == .range { continue }
            if addSaveData && known == .saveData { continue }
            // The framing sent is always our own, written from the parse below, never what survived filtering:
            // `Connection: Transfer-Encoding` once removed the header but not the chunks (request smuggling).
            if known == .contentLength || known == .transferEncoding { continue }
            writer.field(fields[i].name, fields[i].value)
        }
        switch framing {
        case .contentLength(let length): writer.field("Content-Length", decimal: length)
        case .chunked: writer.field("Transfer-Encoding", "chunked")
        case .none, .untilClose: break
        }
        if upgrade { writer.field("Connection", "upgrade") }
        writer.field(via)
        if settings.forward {
            writer.field(tags.allowConstrained ? constrainedAllowed : constrainedNotAllowed)
            writer.field(tags.allowExpensive ? expensiveAllowed : expensiveNotAllowed)
            writer.field(tags.allowUltraConstrained ? ultraConstrainedAllowed : ultraConstrainedNotAllowed)
        }
        if addSaveData { writer.field(saveData) }
        writer.end()
    }

    /// The response relayed to the client: hop-by-hop fields removed, our `Via`, the connection's fate, and
    /// `Data-Mode-Variant` when a variant served it. A variant's response stands in for the requested URL, so its
    /// caching fields are replaced by `Cache-Control: no-store` (SPEC §5): a browser back in normal mode must
    /// fetch the real resource, not revalidate the low-res one.
    static func relayedResponse(_ head: ResponseHead, keepAlive: Bool, clientVersion: HTTPVersion,
                                stripTransferEncoding: Bool, variant: String?, upgrade: Bool = false,
                                framing: BodyFraming? = nil, connectionTokens: ConnectionOptions? = nil,
                                heldMilliseconds: Int64? = nil) -> [UInt8] {
        var writer = HeadWriter(capacity: 256 + head.fields.count * 48)
        relayedResponse(status: head.status, reason: head.reason, fields: head.fields,
                        listed: connectionTokens ?? head.connectionTokens, keepAlive: keepAlive,
                        clientVersion: clientVersion, stripTransferEncoding: stripTransferEncoding, variant: variant,
                        upgrade: upgrade, framing: framing, heldMilliseconds: heldMilliseconds, into: &writer)
        return writer.take()
    }

    /// `relayedResponse` of an HTTP/1 origin's head read as offsets (`HTTP1Parser.parseResponseHeadSpans`): each
    /// kept line is copied from `bytes`, where the head was read, with no String built. The same function writes
    /// it, so the text is byte for byte what `relayedResponse` writes for `head.head(in: bytes)`
    /// (`SpannedRelayDifferentialTests`, and the fuzz target). No variant, no upgrade: those heads take the Strings.
    static func relayedResponse(_ head: ResponseHeadSpans, in bytes: UnsafeRawBufferPointer, keepAlive: Bool,
                                clientVersion: HTTPVersion, stripTransferEncoding: Bool, framing: BodyFraming,
                                connectionTokens: ConnectionOptions, heldMilliseconds: Int64? = nil) -> [UInt8] {
        var writer = HeadWriter(capacity: 256 + head.fields.spans.count * 48)
        relayedResponse(head, in: bytes, keepAlive: keepAlive, clientVersion: clientVersion,
                        stripTransferEncoding: stripTransferEncoding, framing: framing, connectionTokens: connectionTokens,
                        heldMilliseconds: heldMilliseconds, into: &writer)
        return writer.take()
    }

    /// `relayedResponse(_:in:...)` appended to `writer`.
    static func relayedResponse(_ head: ResponseHeadSpans, in bytes: UnsafeRawBufferPointer, keepAlive: Bool,
                                clientVersion: HTTPVersion, stripTransferEncoding: Bool, framing: BodyFraming,
                                connectionTokens: ConnectionOptions, heldMilliseconds: Int64?, into writer: inout HeadWriter) {
        let spans = head.fields.spans
        relayedResponse(status: head.status,
                        reason: head.reason(in: bytes),
                        fields: SpannedFields(bytes: bytes, spans: spans), listed: connectionTokens, keepAlive: keepAlive,
                        clientVersion: clientVersion, stripTransferEncoding: stripTransferEncoding, variant: nil,
                        upgrade: false, framing: framing, heldMilliseconds: heldMilliseconds, into: &writer)
    }

    /// `relayedResponse` as a head, not text: for an HTTP/2 stream, which takes it in memory (`HTTP2Stream.take`).
    /// The same function writes both, so the head is what the text would parse to (`HeadHandoff` checks that it
    /// would, field by field, before the head is handed).
    static func relayedResponseHead(_ head: ResponseHead, keepAlive: Bool, clientVersion: HTTPVersion,
                                    stripTransferEncoding: Bool, variant: String?, framing: BodyFraming? = nil,
                                    connectionTokens: ConnectionOptions? = nil, heldMilliseconds: Int64? = nil) -> ResponseHead {
        var builder = ResponseHeadBuilder(capacity: head.fields.count + 4)
        relayedResponse(status: head.status, reason: head.reason, fields: head.fields,
                        listed: connectionTokens ?? head.connectionTokens, keepAlive: keepAlive,
                        clientVersion: clientVersion, stripTransferEncoding: stripTransferEncoding, variant: variant,
                        upgrade: false, framing: framing, heldMilliseconds: heldMilliseconds, into: &builder)
        return builder.head
    }

    private static func relayedResponse<Sink: HeadSink, Fields: RelayedFields>(
        status: Int, reason: String, fields: Fields, listed: ConnectionOptions, keepAlive: Bool,
        clientVersion: HTTPVersion, stripTransferEncoding: Bool, variant: String?, upgrade: Bool,
        framing: BodyFraming?, heldMilliseconds: Int64?, into writer: inout Sink
    ) {
        writer.statusLine(version: .http11, status: status, reason: reason)
        // A body's framing is written from the parse, never copied (see forwardedRequest); only bodiless
        // responses (HEAD, 204, 304) keep the origin's Content-Length, which then describes the resource.
        let ownFraming: Bool
        switch framing {
        case .contentLength?, .chunked?, .untilClose?: ownFraming = true
        case .none?, nil: ownFraming = false
        }
        let inPlace = variant != nil && !upgrade
        let checkListed = !listed.isEmpty && listsOtherFields(listed, request: false)
        for i in 0..<fields.count {
            let known = fields.known(i)
            if known.isResponseHopByHop {
                if upgrade && known == .upgrade { fields.write(i, to: &writer) }
                continue
            }
            if checkListed && fields.isListed(i, in: listed) { continue }
            if stripTransferEncoding && known == .transferEncoding { continue }
            if variant != nil && known == .dataModeVariant { continue }
            if inPlace && known.isCaching { continue }
            if ownFraming && (known == .contentLength || known == .transferEncoding) { continue }
            fields.write(i, to: &writer)
        }
        switch framing {
        case .contentLength(let length)?: writer.field("Content-Length", decimal: length)
        case .chunked? where !stripTransferEncoding: writer.field("Transfer-Encoding", "chunked")
        default: break
        }
        writer.field(via)
        if let variant { writer.field("Data-Mode-Variant", variant) }
        // SPEC §18.2: how long the proxy held the request before its conditions lifted.
        if let heldMilliseconds { writer.field("Data-Mode-Held", String(heldMilliseconds)) }
        if inPlace { writer.field("Cache-Control", "no-store") }
        if upgrade {
            writer.field("Connection", "upgrade")
        } else if status >= 200 {
            if !keepAlive {
                writer.field("Connection", "close")
            } else if clientVersion == .http10 {
                writer.field("Connection", "keep-alive")
            }
        }
        writer.end()
    }

    /// A response the proxy makes itself, with a complete body.
    static func local(status: Int, reason: String, fields: [(String, String)], bodyLength: Int, keepAlive: Bool,
                      clientVersion: HTTPVersion) -> [UInt8] {
        var writer = HeadWriter(capacity: 256)
        writer.statusLine(version: .http11, status: status, reason: reason)
        for (name, value) in fields { writer.field(name, value) }
        writer.field("Content-Length", String(bodyLength))
        writer.field(via)
        if !keepAlive {
            writer.field("Connection", "close")
        } else if clientVersion == .http10 {
            writer.field("Connection", "keep-alive")
        }
        writer.end()
        return writer.take()
    }
}

/// Where a head is written: HTTP/1.1 text (`HeadWriter`) or a head in memory (`ResponseHeadBuilder`).
protocol HeadSink {
    mutating func statusLine(version: HTTPVersion, status: Int, reason: String)
    mutating func field(_ name: String, _ value: String)
    mutating func field(_ name: String, decimal value: UInt64)
    mutating func field(_ prepared: PreparedField)
    /// A field line from bytes the parser read (a token; a valid value, UTF-8, no OWS around it).
    mutating func field(name: UnsafeBufferPointer<UInt8>, value: UnsafeBufferPointer<UInt8>)
    mutating func end()
}

/// The fields of a head being relayed, in order: Strings (`ResponseHead.fields`), or offsets into the bytes an
/// origin's head was read from (`SpannedFields`). The relay's rules are written once, over this.
protocol RelayedFields {
    var count: Int { get }
    func known(_ i: Int) -> KnownField
    /// Whether the field's name is one of `listed`'s other options (a name `Connection` asks to remove).
    func isListed(_ i: Int, in listed: ConnectionOptions) -> Bool
    func write<Sink: HeadSink>(_ i: Int, to sink: inout Sink)
}

extension Array: RelayedFields where Element == HTTPField {
    @inline(__always) func known(_ i: Int) -> KnownField { KnownField.of(self[i].name) }
    @inline(__always) func isListed(_ i: Int, in listed: ConnectionOptions) -> Bool { listed.contains(self[i].name) }
    @inline(__always) func write<Sink: HeadSink>(_ i: Int, to sink: inout Sink) { sink.field(self[i].name, self[i].value) }
}

/// A spanned head's fields with the bytes they lie in.
struct SpannedFields: RelayedFields {
    let bytes: UnsafeRawBufferPointer
    let spans: [FieldSpan]

    var count: Int { spans.count }
    @inline(__always) func name(_ i: Int) -> UnsafeBufferPointer<UInt8> { ResponseHeadSpans.slice(bytes, spans[i].name) }
    @inline(__always) func known(_ i: Int) -> KnownField { KnownField.of(utf8: name(i)) }
    @inline(__always) func isListed(_ i: Int, in listed: ConnectionOptions) -> Bool { listed.contains(name(i)) }
    @inline(__always) func write<Sink: HeadSink>(_ i: Int, to sink: inout Sink) {
        sink.field(name: name(i), value: ResponseHeadSpans.slice(bytes, spans[i].value))
    }
}

extension HeadWriter: HeadSink {}

/// Where a request head is written: HTTP/1.1 text (`HeadWriter`) or a head in memory (`RequestHeadBuilder`).
protocol RequestHeadSink {
    mutating func requestLine(method: String, target: String, version: HTTPVersion)
    mutating func field(_ name: String, _ value: String)
    mutating func field(_ name: String, decimal value: UInt64)
    mutating func field(_ prepared: PreparedField)
    mutating func end()
}

extension HeadWriter: RequestHeadSink {}

/// Collects a request head as `HeadWriter` would write it.
struct RequestHeadBuilder: RequestHeadSink {
    private(set) var head = RequestHead(method: "", target: "", version: .http11, fields: [])

    init(capacity: Int) {
        head.fields.reserveCapacity(capacity)
    }

    mutating func requestLine(method: String, target: String, version: HTTPVersion) {
        head.method = method
        head.target = target
        head.version = version
    }

    mutating func field(_ name: String, _ value: String) {
        head.fields.append(HTTPField(name: name, value: value))
    }

    mutating func field(_ name: String, decimal value: UInt64) { field(name, String(value)) }

    mutating func field(_ prepared: PreparedField) { field(prepared.name.description, prepared.value.description) }

    mutating func end() {}
}

/// The request head forwarded to an origin, in the form its connection takes: HTTP/1.1 text, or the head itself
/// for a stream of the origin's HTTP/2 connection, which takes it in memory (`HTTP2OriginStream.take`).
enum ForwardedHead {
    case text([UInt8])
    case head(RequestHead)
}

/// Collects a response head as `HeadWriter` would write it.
struct ResponseHeadBuilder: HeadSink {
    private(set) var head = ResponseHead(version: .http11, status: 0, reason: "", fields: [])

    init(capacity: Int) {
        head.fields.reserveCapacity(capacity)
    }

    mutating func statusLine(version: HTTPVersion, status: Int, reason: String) {
        head.version = version
        head.status = status
        head.reason = reason
    }

    mutating func field(_ name: String, _ value: String) {
        head.fields.append(HTTPField(name: name, value: value))
    }

    mutating func field(_ name: String, decimal value: UInt64) { field(name, String(value)) }

    mutating func field(_ prepared: PreparedField) { field(prepared.name.description, prepared.value.description) }

    mutating func field(name: UnsafeBufferPointer<UInt8>, value: UnsafeBufferPointer<UInt8>) {
        field(String(decoding: name, as: UTF8.self), String(decoding: value, as: UTF8.self))
    }

    mutating func end() {}
}
