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
    /// The head written so far is `storage[..<used]`; what follows is capacity, its bytes undefined. Each line is
    /// copied in with one bounds check and `memcpy`s: appending to an array byte by byte and string by string cost
    /// ~310 instructions a field line (callgrind, plain 1 KiB exchange: 26 `append(contentsOf:)` a request).
    private var storage: [UInt8]
    private var used = 0

    /// The head written so far.
    public var bytes: [UInt8] { Array(storage[..<used]) }

    public init(capacity: Int = 512) {
        storage = []
        storage.reserveCapacity(max(capacity, 64))
        Self.grow(&storage, by: storage.capacity)
    }

    /// Bytes written so far.
    public var count: Int { used }

    /// Bytes the storage holds without growing.
    public var capacity: Int { storage.count }

    /// Starts a new head in the same storage: a writer kept between heads allocates once.
    public mutating func reset() { used = 0 }

    /// Calls `body` with the head written so far, in place.
    public func withBytes<R>(_ body: (UnsafeRawBufferPointer) -> R) -> R {
        storage.withUnsafeBytes { body(UnsafeRawBufferPointer(rebasing: $0[..<used])) }
    }

    /// The head written so far, handed over without a copy; the writer is empty afterwards.
    public mutating func take() -> [UInt8] {
        var out: [UInt8] = []
        swap(&out, &storage)
        out.removeLast(out.count - used)
        used = 0
        return out
    }

    /// `method SP request-target SP HTTP-version CRLF`
    public mutating func requestLine(method: String, target: String, version: HTTPVersion) {
        assert(Self.isValidToken(method) && !target.isEmpty && target.utf8.allSatisfy(ByteClass.isVisible), "invalid request line")
        method.withUTF8Bytes { m in
            target.withUTF8Bytes { t in
                write(count: m.count + t.count + 12) { b in
                    var at = Self.copy(m, to: b, at: 0)
                    b[at] = ByteClass.sp
                    at = Self.copy(t, to: b, at: at + 1)
                    b[at] = ByteClass.sp
                    at = Self.version(version, to: b, at: at + 1)
                    b[at] = ByteClass.cr
                    b[at + 1] = ByteClass.lf
                }
            }
        }
    }

    /// `HTTP-version SP status-code SP [ reason-phrase ] CRLF`; the SP before an empty reason is kept (RFC 9112 §4).
    public mutating func statusLine(version: HTTPVersion, status: Int, reason: String) {
        // reason-phrase = 1*( HTAB / SP / VCHAR / obs-text ) (RFC 9112 §4): unlike a field value, whitespace at its
        // ends is part of it ("200 OK " is valid, and relayed as read).
        assert((100...999).contains(status) && reason.utf8.allSatisfy(ByteClass.isFieldValueByte), "invalid status line")
        let s = min(max(status, 100), 999)
        reason.withUTF8Bytes { r in
            write(count: r.count + 15) { b in
                let at = Self.version(version, to: b, at: 0)
                b[at] = ByteClass.sp
                b[at + 1] = 0x30 + UInt8(s / 100)
                b[at + 2] = 0x30 + UInt8(s / 10 % 10)
                b[at + 3] = 0x30 + UInt8(s % 10)
                b[at + 4] = ByteClass.sp
                let end = Self.copy(r, to: b, at: at + 5)
                b[end] = ByteClass.cr
                b[end + 1] = ByteClass.lf
            }
        }
    }

    /// `field-name ":" SP field-value CRLF`
    public mutating func field(_ name: String, _ value: String) {
        name.withUTF8Bytes { n in
            value.withUTF8Bytes { v in field(name: n, value: v) }
        }
    }

    /// A field line made once (`PreparedField`), copied in whole.
    public mutating func field(_ prepared: PreparedField) {
        let line = prepared.line
        write(count: line.count) { b in _ = Self.copy(line, to: b, at: 0) }
    }

    /// `field-name ":" SP 1*DIGIT CRLF`: a length or a count, written without making its String.
    public mutating func field(_ name: String, decimal value: UInt64) {
        var digits = 1
        var rest = value
        while rest >= 10 {
            rest /= 10
            digits += 1
        }
        name.withUTF8Bytes { n in
            write(count: n.count + digits + 4) { b in
                var at = Self.copy(n, to: b, at: 0)
                b[at] = ByteClass.colon
                b[at + 1] = ByteClass.sp
                at += 2
                var v = value
                for k in stride(from: at + digits - 1, through: at, by: -1) {
                    b[k] = 0x30 + UInt8(v % 10)
                    v /= 10
                }
                b[at + digits] = ByteClass.cr
                b[at + digits + 1] = ByteClass.lf
            }
        }
    }

    /// `field-name ":" SP field-value CRLF` from bytes: a token, and a value with no OWS around it that holds only
    /// field-value bytes (as the parser reads them).
    @inline(__always)
    public mutating func field(name n: UnsafeBufferPointer<UInt8>, value v: UnsafeBufferPointer<UInt8>) {
        assert(FieldBytes.isToken(UnsafeRawBufferPointer(n)) && FieldBytes.checkValue(UnsafeRawBufferPointer(v)) != nil,
               "invalid field line")
        write(count: n.count + v.count + 4) { b in
            var at = Self.copy(n, to: b, at: 0)
            b[at] = ByteClass.colon
            b[at + 1] = ByteClass.sp
            at = Self.copy(v, to: b, at: at + 2)
            b[at] = ByteClass.cr
            b[at + 1] = ByteClass.lf
        }
    }

    /// The empty line that ends the head.
    public mutating func end() {
        write(count: 2) { b in
            b[0] = ByteClass.cr
            b[1] = ByteClass.lf
        }
    }

    /// Runs `body` on room for exactly `count` more bytes (it must write all of them), growing the storage first
    /// if the head would not fit.
    @inline(__always)
    private mutating func write(count: Int, _ body: (UnsafeMutablePointer<UInt8>) -> Void) {
        if storage.count - used < count { Self.grow(&storage, by: max(count, storage.count)) }
        let at = used
        storage.withUnsafeMutableBufferPointer { body($0.baseAddress! + at) }
        used += count
    }

    /// Zeros to lengthen the storage with: appending a buffer is specialised for bytes, where
    /// `Array(unsafeUninitializedCapacity:)` and `repeatElement` went through generic code (~500 instructions a head).
    private static let zeros = [UInt8](repeating: 0, count: 4096)

    private static func grow(_ storage: inout [UInt8], by count: Int) {
        var left = count
        zeros.withUnsafeBufferPointer { z in
            while left > 0 {
                let step = min(left, z.count)
                storage.append(contentsOf: UnsafeBufferPointer(rebasing: z[..<step]))
                left -= step
            }
        }
    }

    @inline(__always)
    private static func copy(_ bytes: UnsafeBufferPointer<UInt8>, to b: UnsafeMutablePointer<UInt8>, at: Int) -> Int {
        if let base = bytes.baseAddress, bytes.count > 0 {
            (b + at).update(from: base, count: bytes.count)
        }
        return at + bytes.count
    }

    /// "HTTP/" DIGIT "." DIGIT, eight bytes.
    @inline(__always)
    private static func version(_ version: HTTPVersion, to b: UnsafeMutablePointer<UInt8>, at: Int) -> Int {
        b[at] = 0x48
        b[at + 1] = 0x54
        b[at + 2] = 0x54
        b[at + 3] = 0x50
        b[at + 4] = 0x2F
        b[at + 5] = 0x30 + version.major % 10
        b[at + 6] = 0x2E
        b[at + 7] = 0x30 + version.minor % 10
        return at + 8
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
        return w.take()
    }
}

extension ResponseHead {
    /// The head as it goes on the wire: status line, each field in order, empty line.
    public func serialized() -> [UInt8] {
        var w = HeadWriter(capacity: 64 + fields.count * 48)
        w.statusLine(version: version, status: status, reason: reason)
        for f in fields { w.field(f.name, f.value) }
        w.end()
        return w.take()
    }
}

/// A field line the proxy writes on every message (its `Via`, the data-mode tags): made once, so a writer copies
/// its bytes instead of writing the name and value again (~140 instructions a line, callgrind), and a head
/// builder takes its name and value. Nothing in it is reference-counted: copying one costs no retain.
public struct PreparedField: @unchecked Sendable {  // `line` is written once, in init, then only read
    public let name: StaticString
    public let value: StaticString
    /// `name: value` CRLF, as `HeadWriter.field(_:_:)` writes it; made once and never freed (a process has a
    /// handful of these, made as static constants).
    public let line: UnsafeBufferPointer<UInt8>

    public init(_ name: StaticString, _ value: StaticString) {
        self.name = name
        self.value = value
        var writer = HeadWriter(capacity: name.utf8CodeUnitCount + value.utf8CodeUnitCount + 4)
        writer.field(name.description, value.description)
        let bytes = writer.take()
        let storage = UnsafeMutableBufferPointer<UInt8>.allocate(capacity: bytes.count)
        _ = storage.initialize(from: bytes)
        line = UnsafeBufferPointer(storage)
    }
}
