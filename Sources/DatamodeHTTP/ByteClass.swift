/// Byte classes of the HTTP and URI grammars, as branch-free bitmask tests.
///
/// The parser looks at every byte of every head on the proxy's hot path, so each class is two 64-bit
/// masks (bytes 0–63 and 64–127) folded in at compile time: no table in memory, no lazy global,
/// no `Character`. Bytes >= 0x80 are never in a mask class.
enum ByteClass {
    static let cr: UInt8 = 0x0D
    static let lf: UInt8 = 0x0A
    static let sp: UInt8 = 0x20
    static let htab: UInt8 = 0x09
    static let colon: UInt8 = 0x3A

    /// tchar (RFC 9110 §5.6.2): `!#$%&'*+-.^_\`|~`, DIGIT, ALPHA. Method names, field names,
    /// chunk-extension names and transfer codings are tokens.
    private static let tcharLow: UInt64 = 0x03ff_6cfa_0000_0000
    private static let tcharHigh: UInt64 = 0x57ff_ffff_c7ff_fffe
    /// tchar without ALPHA's uppercase: a field name as HTTP/2 carries it (RFC 9113 §8.2.1).
    private static let lowercaseTcharHigh: UInt64 = 0x57ff_ffff_c000_0000

    /// reg-name characters (RFC 3986 §3.2.2) other than pct-encoded: unreserved and sub-delims.
    private static let regNameLow: UInt64 = 0x2bff_7fd2_0000_0000
    private static let regNameHigh: UInt64 = 0x47ff_fffe_87ff_fffe

    @inline(__always)
    static func inMask(_ b: UInt8, _ low: UInt64, _ high: UInt64) -> Bool {
        if b < 64 { return (low >> UInt64(b)) & 1 == 1 }
        if b < 128 { return (high >> UInt64(b &- 64)) & 1 == 1 }
        return false
    }

    @inline(__always) static func isTchar(_ b: UInt8) -> Bool { inMask(b, tcharLow, tcharHigh) }

    /// `isTchar` as a 256-byte table (1: tchar), for the one loop that runs over every field name's bytes
    /// (`FieldSection.nameEnd`): a load and a test a byte where the masks take a range test, a shift and a select.
    /// Made once from the masks and never freed.
    nonisolated(unsafe) static let tcharTable: UnsafePointer<UInt8> = {  // written once, then only read
        let table = UnsafeMutablePointer<UInt8>.allocate(capacity: 256)
        for b in 0..<256 { table[b] = isTchar(UInt8(b)) ? 1 : 0 }
        return UnsafePointer(table)
    }()
    @inline(__always) static func isLowercaseTchar(_ b: UInt8) -> Bool { inMask(b, tcharLow, lowercaseTcharHigh) }
    @inline(__always) static func isRegNameChar(_ b: UInt8) -> Bool { inMask(b, regNameLow, regNameHigh) }

    /// OWS / BWS element (RFC 9110 §5.6.3).
    @inline(__always) static func isOWS(_ b: UInt8) -> Bool { b == sp || b == htab }

    /// A byte allowed inside a field value (RFC 9110 §5.5): VCHAR, SP, HTAB, obs-text.
    /// Everything else — NUL, CR, LF, other controls, DEL — is refused: NUL and bare CR/LF are
    /// classic header-injection and smuggling vectors because implementations disagree on them.
    @inline(__always) static func isFieldValueByte(_ b: UInt8) -> Bool {
        (b >= 0x20 && b != 0x7F) || b == htab
    }

    /// VCHAR (0x21–0x7E): the only bytes allowed in a request-target on the wire (RFC 9112 §3.2).
    @inline(__always) static func isVisible(_ b: UInt8) -> Bool { b >= 0x21 && b <= 0x7E }

    @inline(__always) static func isDigit(_ b: UInt8) -> Bool { b &- 0x30 < 10 }

    @inline(__always) static func isAlpha(_ b: UInt8) -> Bool { (b | 0x20) &- 0x61 < 26 }

    /// Value of a HEXDIG, or nil.
    @inline(__always) static func hexValue(_ b: UInt8) -> UInt8? {
        if b &- 0x30 < 10 { return b &- 0x30 }
        let l = b | 0x20
        if l &- 0x61 < 6 { return l &- 0x61 &+ 10 }
        return nil
    }

    @inline(__always) static func lower(_ b: UInt8) -> UInt8 {
        b &- 0x41 < 26 ? b | 0x20 : b
    }
}

/// Helpers to make Strings and compare names without Foundation.
public enum ASCII {
    /// One String from an already validated byte range. Valid UTF-8 is copied as is.
    @inline(__always)
    static func string(_ bytes: UnsafeRawBufferPointer, _ from: Int, _ to: Int) -> String {
        String(decoding: UnsafeRawBufferPointer(rebasing: bytes[from..<to]), as: UTF8.self)
    }

    /// Case-insensitive ASCII equality (field names, codings, schemes are case-insensitive; RFC 9110 §5.1).
    /// Whether `bytes` spell `lowercase` in any case; `lowercase` must be lowercase ASCII.
    static func equalsIgnoringCase(_ bytes: UnsafeBufferPointer<UInt8>, _ lowercase: StaticString) -> Bool {
        guard bytes.count == lowercase.utf8CodeUnitCount else { return false }
        let expected = lowercase.utf8Start
        for i in 0..<bytes.count where ByteClass.lower(bytes[i]) != expected[i] { return false }
        return true
    }

    public static func equalsIgnoringCase(_ a: String, _ b: String) -> Bool {
        // Lengths first: O(1) for native strings, and almost every mismatch is decided there.
        guard a.utf8.count == b.utf8.count else { return false }
        return a.withUTF8Bytes { ua in
            b.withUTF8Bytes { ub in
                guard ua.count == ub.count else { return false }
                for i in 0..<ua.count where ByteClass.lower(ua[i]) != ByteClass.lower(ub[i]) {
                    return false
                }
                return true
            }
        }
    }

    /// Trims OWS (SP / HTAB) from both ends of `s[from..<to]` and returns the bounds.
    @inline(__always)
    static func trimOWS(_ u: UnsafeBufferPointer<UInt8>, _ from: Int, _ to: Int) -> (Int, Int) {
        var a = from, b = to
        while a < b && ByteClass.isOWS(u[a]) { a += 1 }
        while b > a && ByteClass.isOWS(u[b - 1]) { b -= 1 }
        return (a, b)
    }
}
