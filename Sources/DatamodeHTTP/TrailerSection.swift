/// The trailer fields this proxy drops instead of forwarding, whichever way a chunked body goes and whatever the
/// recipient speaks: one definition for the HTTP/1.1 relay (`BodyRelay`), the HTTP/2 streams (`ChunkedElements`) and
/// the HTTP/2 translation (`HTTP2ResponseTranslation.trailerFields`).
///
/// RFC 9110 §6.5.1 keeps message framing and routing out of trailers, and §6.5.2 lets a recipient discard what it
/// does not accept there. A sender that puts `Content-Length`, `Transfer-Encoding` or `Host` in a trailer section
/// either errs or aims at a recipient that merges trailers into the head (request smuggling, cache poisoning);
/// the connection-specific fields describe one connection, not the message, and make an HTTP/2 message malformed
/// (RFC 9113 §8.2.2). Refusing the whole body for them came too late to help anyone: the body had already gone out,
/// and the client was left with a cut HTTP/1.1 body or an h2 stream reset after its last byte.
public enum TrailerSection {
    /// Whether a trailer field named `name` (any case) is dropped: framing (`Content-Length`, `Transfer-Encoding`,
    /// `Trailer`), routing (`Host`), and the connection-specific fields (`Connection`, `Keep-Alive`,
    /// `Proxy-Connection`, `TE`, `Upgrade`).
    public static func isDropped(_ name: UnsafeRawBufferPointer) -> Bool {
        @inline(__always) func is_(_ lower: StaticString) -> Bool {
            let l = lower.utf8Start
            for i in 0..<name.count where name[i] | 0x20 != l[i] { return false }
            return true
        }
        // `| 0x20` lowercases a letter and keeps `-`; no other token byte (RFC 9110 §5.1) folds onto a letter or `-`.
        switch name.count {
        case 2: return is_("te")
        case 4: return is_("host")
        case 7: return is_("upgrade") || is_("trailer")
        case 10: return is_("connection") || is_("keep-alive")
        case 14: return is_("content-length")
        case 16: return is_("proxy-connection")
        case 17: return is_("transfer-encoding")
        default: return false
        }
    }

    public static func isDropped(_ name: String) -> Bool {
        name.withUTF8Bytes { isDropped(UnsafeRawBufferPointer($0)) }
    }

    /// `element`, the last-chunk element a `ChunkedDecoder` ended a body with (`.end(length:)`: the last-chunk line,
    /// the trailer section and its final CRLF, already validated), without the lines of the dropped fields; every
    /// other byte as it came. `dropped`: the names removed, as received (for the log). nil when `element` is not
    /// such an element.
    public static func withoutDroppedFields(_ element: UnsafeRawBufferPointer) -> (element: [UInt8], dropped: [String])? {
        guard let lineEnd = element.firstIndex(of: ByteClass.lf) else { return nil }
        var kept = Array(element[...lineEnd])
        var dropped: [String] = []
        var i = lineEnd + 1
        while i < element.count, element[i] != ByteClass.cr {
            guard let colon = element[i...].firstIndex(of: ByteClass.colon),
                  let end = element[colon...].firstIndex(of: ByteClass.lf) else { return nil }
            let name = UnsafeRawBufferPointer(rebasing: element[i..<colon])
            if isDropped(name) {
                dropped.append(String(decoding: name, as: UTF8.self))
            } else {
                kept += element[i...end]
            }
            i = end + 1
        }
        guard i + 1 < element.count, element[i + 1] == ByteClass.lf else { return nil }
        kept += [ByteClass.cr, ByteClass.lf]
        return (kept, dropped)
    }
}
