/// Text forms of `IPAddress`: strict parsing and canonical rendering, without Foundation or `inet_pton`
/// (the policy module has no C).
extension IPAddress {
    /// Parses an IPv4 dotted quad or an IPv6 address (RFC 4291 §2.2).
    ///
    /// IPv4 is strict: exactly four decimal parts, each 0–255, and no leading zeros (`010.0.0.1` is refused
    /// because `inet_aton` reads it as octal 8: an access-control list must not mean two different things to two
    /// readers). IPv6 accepts the full, `::`-compressed and embedded-IPv4 (`::ffff:192.0.2.1`) forms,
    /// hexadecimal in either case. Refused: brackets, zone ids (`%eth0`), surrounding whitespace, more than one `::`.
    public init?(_ text: String) {
        var text = text
        let parsed: [UInt8]? = text.withUTF8 { buffer in
            if buffer.contains(UInt8(ascii: ":")) {
                return IPAddress.parseIPv6(buffer)
            }
            guard let v4 = IPAddress.parseIPv4(buffer[...]) else { return nil }
            return [v4.0, v4.1, v4.2, v4.3]
        }
        guard let parsed else { return nil }
        self.bytes = parsed
    }

    /// `true` for a 4-byte address.
    public var isIPv4: Bool { bytes.count == 4 }

    /// The IPv4 address inside an IPv4-mapped IPv6 address `::ffff:a.b.c.d` (RFC 4291 §2.5.5.2), else `nil`.
    /// A dual-stack listener reports IPv4 clients this way; access lists and rule `client` blocks written
    /// in IPv4 must still match them.
    public var unmappedIPv4: IPAddress? {
        guard bytes.count == 16 else { return nil }
        for i in 0..<10 where bytes[i] != 0 { return nil }
        guard bytes[10] == 0xff, bytes[11] == 0xff else { return nil }
        return IPAddress(bytes: Array(bytes[12..<16]))
    }

    /// IPv4 dotted quad; IPv6 in the RFC 5952 canonical form: lowercase hexadecimal, no leading zeros,
    /// the longest run (first on a tie) of two or more zero groups compressed to `::`, and IPv4-mapped
    /// addresses written `::ffff:a.b.c.d` (RFC 5952 §5).
    public var description: String {
        if bytes.count == 4 {
            return "\(bytes[0]).\(bytes[1]).\(bytes[2]).\(bytes[3])"
        }
        if let v4 = unmappedIPv4 {
            return "::ffff:" + v4.description
        }
        var groups = [Int](repeating: 0, count: 8)
        for i in 0..<8 { groups[i] = Int(bytes[2 * i]) << 8 | Int(bytes[2 * i + 1]) }
        // The longest run of zero groups, first on a tie, only if at least two long (RFC 5952 §4.2.2).
        var bestStart = -1, bestLength = 0, i = 0
        while i < 8 {
            if groups[i] == 0 {
                var j = i
                while j < 8 && groups[j] == 0 { j += 1 }
                if j - i > bestLength { bestStart = i; bestLength = j - i }
                i = j
            } else {
                i += 1
            }
        }
        if bestLength < 2 { bestStart = -1 }
        var out = ""
        i = 0
        while i < 8 {
            if i == bestStart {
                out += "::"
                i += bestLength
                continue
            }
            if i > 0 && i != bestStart + bestLength {   // `::` already ends with a colon
                out += ":"
            }
            out += String(groups[i], radix: 16)
            i += 1
        }
        return out
    }

    // MARK: - Parsers over UTF-8 bytes

    /// Four decimal parts 0–255 separated by dots; no signs, no leading zeros, nothing else.
    static func parseIPv4(_ text: Slice<UnsafeBufferPointer<UInt8>>) -> (UInt8, UInt8, UInt8, UInt8)? {
        var parts: (Int, Int, Int, Int) = (0, 0, 0, 0)
        var partIndex = 0
        var value = 0
        var digits = 0
        var leadingZero = false
        func store(_ value: Int, at index: Int, into parts: inout (Int, Int, Int, Int)) {
            switch index {
            case 0: parts.0 = value
            case 1: parts.1 = value
            case 2: parts.2 = value
            default: parts.3 = value
            }
        }
        for byte in text {
            switch byte {
            case UInt8(ascii: "0")...UInt8(ascii: "9"):
                if digits == 1 && leadingZero { return nil }
                if digits == 0 && byte == UInt8(ascii: "0") { leadingZero = true }
                value = value * 10 + Int(byte - UInt8(ascii: "0"))
                digits += 1
                if digits > 3 || value > 255 { return nil }
            case UInt8(ascii: "."):
                guard digits > 0, partIndex < 3 else { return nil }
                store(value, at: partIndex, into: &parts)
                partIndex += 1
                value = 0
                digits = 0
                leadingZero = false
            default:
                return nil
            }
        }
        guard digits > 0, partIndex == 3 else { return nil }
        parts.3 = value
        return (UInt8(parts.0), UInt8(parts.1), UInt8(parts.2), UInt8(parts.3))
    }

    /// RFC 4291 §2.2 text forms: eight groups of 1–4 hex digits; one `::` standing for one or more zero
    /// groups; optionally the last 32 bits as a dotted quad.
    static func parseIPv6(_ text: UnsafeBufferPointer<UInt8>) -> [UInt8]? {
        let count = text.count
        guard count >= 2, count <= 45 else { return nil }
        var head: [UInt16] = []   // groups before `::` (or all of them when there is none)
        var tail: [UInt16] = []   // groups after `::`
        var sawDoubleColon = false
        var i = 0
        if text[0] == UInt8(ascii: ":") {
            guard text[1] == UInt8(ascii: ":") else { return nil }
            sawDoubleColon = true
            i = 2
            if i == count { return [UInt8](repeating: 0, count: 16) }
        }
        while i < count {
            // One group (or the IPv4 tail) starting at i.
            var j = i
            var value: UInt32 = 0
            while j < count, let digit = hexValue(text[j]) {
                value = value << 4 | UInt32(digit)
                j += 1
                if j - i > 4 { break }
            }
            if j < count && text[j] == UInt8(ascii: ".") {
                // An embedded IPv4 address: must be the last thing and occupy the final 32 bits.
                guard let v4 = parseIPv4(text[i..<count]) else { return nil }
                let hi = UInt16(v4.0) << 8 | UInt16(v4.1)
                let lo = UInt16(v4.2) << 8 | UInt16(v4.3)
                if sawDoubleColon { tail += [hi, lo] } else { head += [hi, lo] }
                i = count
                break
            }
            let length = j - i
            guard length >= 1, length <= 4 else { return nil }
            if sawDoubleColon { tail.append(UInt16(value)) } else { head.append(UInt16(value)) }
            i = j
            if i == count { break }
            guard text[i] == UInt8(ascii: ":") else { return nil }
            i += 1
            if i < count && text[i] == UInt8(ascii: ":") {
                guard !sawDoubleColon else { return nil }
                sawDoubleColon = true
                i += 1
                if i == count { break }
            } else if i == count {
                return nil   // a trailing single colon
            }
        }
        let total = head.count + tail.count
        if sawDoubleColon {
            guard total <= 7 else { return nil }   // `::` stands for at least one group (RFC 4291 §2.2, 2.)
        } else {
            guard total == 8 else { return nil }
        }
        var groups = head
        groups += [UInt16](repeating: 0, count: 8 - total)
        groups += tail
        var bytes = [UInt8]()
        bytes.reserveCapacity(16)
        for g in groups {
            bytes.append(UInt8(g >> 8))
            bytes.append(UInt8(g & 0xff))
        }
        return bytes
    }

    private static func hexValue(_ byte: UInt8) -> UInt8? {
        switch byte {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): byte - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): byte - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): byte - UInt8(ascii: "A") + 10
        default: nil
        }
    }
}
