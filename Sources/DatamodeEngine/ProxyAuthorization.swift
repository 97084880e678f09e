/// Basic proxy authentication (RFC 9110 §11.7.1, RFC 7617), checked against `access.users`.
enum ProxyAuthorization {
    /// Whether one of the `Proxy-Authorization` values carries valid Basic credentials.
    static func accepts(_ values: [String], users: [String: String]) -> Bool {
        user(values, users: users) != nil
    }

    /// The user whose valid Basic credentials one of the `Proxy-Authorization` values carries, else nil.
    static func user(_ values: [String], users: [String: String]) -> String? {
        for value in values {
            let trimmed = value.drop(while: { $0 == " " })
            guard trimmed.count > 6, trimmed.prefix(6).lowercased() == "basic " else { continue }
            let encoded = trimmed.dropFirst(6).trimmingSpaces
            guard let decoded = Base64.decode(encoded), let text = String(validating: decoded, as: UTF8.self),
                  let colon = text.firstIndex(of: ":") else { continue }
            let user = String(text[..<colon])
            let password = String(text[text.index(after: colon)...])
            if let expected = users[user], constantTimeEquals(Array(expected.utf8), Array(password.utf8)) { return user }
        }
        return nil
    }

    /// Compares without an early exit, so response timing does not reveal how much of a password matched.
    static func constantTimeEquals(_ a: [UInt8], _ b: [UInt8]) -> Bool {
        var difference = UInt8(a.count == b.count ? 0 : 1)
        for i in 0..<max(a.count, b.count) {
            difference |= (i < a.count ? a[i] : 0) ^ (i < b.count ? b[i] : 0)
        }
        return difference == 0
    }
}

extension Substring {
    var trimmingSpaces: Substring {
        var s = self
        while s.first == " " || s.first == "\t" { s.removeFirst() }
        while s.last == " " || s.last == "\t" { s.removeLast() }
        return s
    }
}

/// Standard base64 (RFC 4648 §4) decoding, strict about the alphabet and padding.
enum Base64 {
    static func decode<S: StringProtocol>(_ text: S) -> [UInt8]? {
        var out: [UInt8] = []
        var accumulator: UInt32 = 0
        var bits = 0
        var padding = 0
        for byte in text.utf8 {
            let value: UInt32
            switch byte {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"): value = UInt32(byte - UInt8(ascii: "A"))
            case UInt8(ascii: "a")...UInt8(ascii: "z"): value = UInt32(byte - UInt8(ascii: "a") + 26)
            case UInt8(ascii: "0")...UInt8(ascii: "9"): value = UInt32(byte - UInt8(ascii: "0") + 52)
            case UInt8(ascii: "+"): value = 62
            case UInt8(ascii: "/"): value = 63
            case UInt8(ascii: "="): padding += 1; continue
            default: return nil
            }
            if padding > 0 { return nil }
            accumulator = (accumulator << 6) | value
            bits += 6
            if bits >= 8 {
                bits -= 8
                out.append(UInt8((accumulator >> UInt32(bits)) & 0xff))
            }
        }
        guard padding <= 2 else { return nil }
        return out
    }
}
