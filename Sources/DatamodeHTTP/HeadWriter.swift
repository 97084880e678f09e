/// Writes HTTP/1.1 message heads (RFC 9112 §3, §4, §5) into one growing byte array.
///
/// The proxy re-serialises every head it forwards instead of copying the client's bytes: what goes out is then
/// exactly what was validated and what policy saw (hop-by-hop fields removed, Host rewritten, Via added), with
/// canonical `name: value` CRLF syntax that every recipient reads the same way.
///
/// The writer does not re-validate: names and values must come from `HTTP1Parser` or from configuration that
/// was checked with `HeadWriter.isValidFieldName` / `isValidFieldValue`. Writing CR or LF here would be header
/// injection (response splitting), so debug builds assert it.
public struct HeadWriter {
    public private(set) var bytes: [UInt8]

    public init(capacity: Int = 512) {
        bytes = []
        bytes.reserveCapacity(capacity)
    }

    /// `method SP request-target SP HTTP-version CRLF`
    public mutating func requestLine(method: String, target: String, version: HTTPVersion) {
        assert(Self.isValidToken(method) && !target.isEmpty && target.utf8.allSatisfy(ByteClass.isVisible), "invalid request line")
        bytes.append(contentsOf: method.utf8)
        bytes.append(ByteClass.sp)
        bytes.append(contentsOf: target.utf8)
        bytes.append(ByteClass.sp)
        appendVersion(version)
        appendCRLF()
    }

    /// `HTTP-version SP status-code SP [ reason-phrase ] CRLF`; the SP before an empty reason is kept (RFC 9112 §4).
    public mutating func statusLine(version: HTTPVersion, status: Int, reason: String) {
        assert((100...999).contains(status) && Self.isValidFieldValue(reason), "invalid status line")
        appendVersion(version)
        bytes.append(ByteClass.sp)
        let s = min(max(status, 100), 999)
        bytes.append(0x30 + UInt8(s / 100))
        bytes.append(0x30 + UInt8(s / 10 % 10))
        bytes.append(0x30 + UInt8(s % 10))
        bytes.append(ByteClass.sp)
        bytes.append(contentsOf: reason.utf8)
        appendCRLF()
    }

    /// `field-name ":" SP field-value CRLF`
    public mutating func field(_ name: String, _ value: String) {
        assert(Self.isValidFieldName(name) && Self.isValidFieldValue(value), "invalid field line")
        // Through the strings' contiguous UTF-8: appending a `String.UTF8View` copies through its generic path.
        name.withUTF8Bytes { bytes.append(contentsOf: $0) }
        bytes.append(ByteClass.colon)
        bytes.append(ByteClass.sp)
        value.withUTF8Bytes { bytes.append(contentsOf: $0) }
        appendCRLF()
    }

    /// The empty line that ends the head.
    public mutating func end() {
        appendCRLF()
    }

    @inline(__always) private mutating func appendCRLF() {
        bytes.append(ByteClass.cr)
        bytes.append(ByteClass.lf)
    }

    @inline(__always) private mutating func appendVersion(_ version: HTTPVersion) {
        // "HTTP/" DIGIT "." DIGIT
        bytes.append(0x48)
        bytes.append(0x54)
        bytes.append(0x54)
        bytes.append(0x50)
        bytes.append(0x2F)
        bytes.append(0x30 + version.major % 10)
        bytes.append(0x2E)
        bytes.append(0x30 + version.minor % 10)
    }

    /// A token (RFC 9110 §5.6.2): method and field names.
    public static func isValidToken(_ s: String) -> Bool {
        return s.withUTF8Bytes { FieldBytes.isToken(UnsafeRawBufferPointer($0)) }
    }

    public static func isValidFieldName(_ s: String) -> Bool { isValidToken(s) }

    /// A field value the parser would accept back unchanged: VCHAR / SP / HTAB / obs-text, no CR, LF or NUL,
    /// no leading or trailing whitespace (it would be trimmed on the way back).
    public static func isValidFieldValue(_ s: String) -> Bool {
        return s.withUTF8Bytes { FieldBytes.checkValue(UnsafeRawBufferPointer($0)) != nil }
    }
}

extension RequestHead {
    /// The head as it goes on the wire: request line, each field in order, empty line.
    public func serialized() -> [UInt8] {
        var w = HeadWriter(capacity: 64 + target.utf8.count + fields.count * 48)
        w.requestLine(method: method, target: target, version: version)
        for f in fields { w.field(f.name, f.value) }
        w.end()
        return w.bytes
    }
}

extension ResponseHead {
    /// The head as it goes on the wire: status line, each field in order, empty line.
    public func serialized() -> [UInt8] {
        var w = HeadWriter(capacity: 64 + fields.count * 48)
        w.statusLine(version: version, status: status, reason: reason)
        for f in fields { w.field(f.name, f.value) }
        w.end()
        return w.bytes
    }
}
