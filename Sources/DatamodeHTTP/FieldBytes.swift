/// The byte rules of a field that other modules check without parsing text: the HTTP/2 codec on every field it
/// receives or sends (RFC 9113 §8.2.1), the head handoff on every field it hands over (`HeadHandoff`). One
/// implementation, the parser's: a value is scanned as the parser scans it (`FieldSection.valueEnd`, eight bytes at
/// a time while they are printable ASCII), so a check here and a parse of the same bytes cannot disagree.
public enum FieldBytes {
    /// nil when `value` holds a byte no field value may carry (NUL, CR, LF, another control, DEL: RFC 9110 §5.5) or
    /// starts or ends with SP or HTAB (a parse would trim it, so the value would not come back unchanged);
    /// otherwise whether a byte is obs-text (0x80 and up: valid UTF-8 is left to the caller to require).
    @inline(__always)
    public static func checkValue(_ value: UnsafeRawBufferPointer) -> Bool? {
        let (end, high) = FieldSection.valueEnd(value, from: 0, to: value.count)
        guard end == value.count else { return nil }
        if let first = value.first, ByteClass.isOWS(first) { return nil }
        if let last = value.last, ByteClass.isOWS(last) { return nil }
        return high
    }

    /// `checkValue` one byte at a time: the reference (`FieldBytesDifferentialTests`).
    public static func checkValueByteByByte(_ value: UnsafeRawBufferPointer) -> Bool? {
        var high = false
        for b in value {
            if b < 0x20 && b != 0x09 || b == 0x7F { return nil }
            if b >= 0x80 { high = true }
        }
        if let first = value.first, first == 0x20 || first == 0x09 { return nil }
        if let last = value.last, last == 0x20 || last == 0x09 { return nil }
        return high
    }

    /// tchar (RFC 9110 §5.6.2): `!#$%&'*+-.^_\`|~`, DIGIT, ALPHA.
    @inline(__always) public static func isTchar(_ b: UInt8) -> Bool { ByteClass.isTchar(b) }

    /// tchar without the uppercase letters.
    @inline(__always) public static func isLowercaseTchar(_ b: UInt8) -> Bool { ByteClass.isLowercaseTchar(b) }

    /// A token (RFC 9110 §5.6.2), not empty: what a field name is.
    @inline(__always)
    public static func isToken(_ name: UnsafeRawBufferPointer) -> Bool {
        guard !name.isEmpty else { return false }
        for b in name where !ByteClass.isTchar(b) { return false }
        return true
    }

    /// A token without uppercase letters, not empty: a field name as HTTP/2 carries it (RFC 9113 §8.2.1).
    @inline(__always)
    public static func isLowercaseToken(_ name: UnsafeRawBufferPointer) -> Bool {
        guard !name.isEmpty else { return false }
        for b in name where !ByteClass.isLowercaseTchar(b) { return false }
        return true
    }

    /// Whether `name` holds an ASCII uppercase letter.
    @inline(__always)
    public static func hasUppercase(_ name: UnsafeRawBufferPointer) -> Bool {
        for b in name where b &- UInt8(ascii: "A") < 26 { return true }
        return false
    }
}
