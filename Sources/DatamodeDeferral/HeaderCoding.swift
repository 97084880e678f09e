import DatamodeHTTP

/// Header fields as one BLOB, in order and byte for byte: per field the name's length (4 bytes, little-endian), the
/// name, the value's length, the value. A binary form rather than `name: value` lines so that nothing a client
/// sent (a colon in a value, an obs-text byte) can change how it is read back.
enum HeaderCoding {
    static func encode(_ fields: [HTTPField]) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(fields.reduce(0) { $0 + 8 + $1.name.utf8.count + $1.value.utf8.count })
        for field in fields {
            append(field.name, to: &out)
            append(field.value, to: &out)
        }
        return out
    }

    private static func append(_ text: String, to out: inout [UInt8]) {
        let count = UInt32(text.utf8.count)
        for shift in stride(from: 0, to: 32, by: 8) { out.append(UInt8(truncatingIfNeeded: count >> UInt32(shift))) }
        out.append(contentsOf: text.utf8)
    }

    /// The fields, or nil when `bytes` is not a whole encoding (a damaged row).
    static func decode(_ bytes: [UInt8]) -> [HTTPField]? {
        var fields: [HTTPField] = []
        var index = 0
        func string() -> String? {
            guard bytes.count - index >= 4 else { return nil }
            var count = 0
            for k in 0..<4 { count |= Int(bytes[index + k]) << (8 * k) }
            index += 4
            guard bytes.count - index >= count else { return nil }
            defer { index += count }
            return String(decoding: bytes[index..<(index + count)], as: UTF8.self)
        }
        while index < bytes.count {
            guard let name = string(), let value = string() else { return nil }
            fields.append(HTTPField(name: name, value: value))
        }
        return fields
    }
}

/// Ids, origins and the retry schedule: the small pure parts of the store.
public enum DeferralRules {
    /// A new entry id: 128 bits from the system's cryptographic generator (getrandom(2) on Linux), as 22
    /// characters of base64url without padding (RFC 4648 §5): safe in a URL path and a header, never guessable,
    /// so `GET /deferred/{id}` cannot be used to find others' uploads.
    public static func newID() -> String {
        var generator = SystemRandomNumberGenerator()
        let high = generator.next() as UInt64
        let low = generator.next() as UInt64
        var bytes: [UInt8] = []
        for shift in stride(from: 56, through: 0, by: -8) { bytes.append(UInt8(truncatingIfNeeded: high >> UInt64(shift))) }
        for shift in stride(from: 56, through: 0, by: -8) { bytes.append(UInt8(truncatingIfNeeded: low >> UInt64(shift))) }
        return base64url(bytes)
    }

    static let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".utf8)

    static func base64url(_ bytes: [UInt8]) -> String {
        var out: [UInt8] = []
        var index = 0
        while index + 3 <= bytes.count {
            let n = UInt32(bytes[index]) << 16 | UInt32(bytes[index + 1]) << 8 | UInt32(bytes[index + 2])
            for shift in [18, 12, 6, 0] { out.append(alphabet[Int((n >> UInt32(shift)) & 63)]) }
            index += 3
        }
        let rest = bytes.count - index
        if rest == 1 {
            let n = UInt32(bytes[index]) << 16
            for shift in [18, 12] { out.append(alphabet[Int((n >> UInt32(shift)) & 63)]) }
        } else if rest == 2 {
            let n = UInt32(bytes[index]) << 16 | UInt32(bytes[index + 1]) << 8
            for shift in [18, 12, 6] { out.append(alphabet[Int((n >> UInt32(shift)) & 63)]) }
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// `scheme://host:port` of an absolute URL, lowercase, with the scheme's default port written out (80, 443),
    /// so `http://a.example/` and `http://A.example:80/x` are one origin for `concurrency`. A URL without a scheme
    /// is its own origin (the engine stores only absolute URLs).
    public static func origin(of url: String) -> String {
        let bytes = Array(url.utf8)
        var schemeEnd: Int?
        if bytes.count >= 3 {
            for index in 0...(bytes.count - 3) where bytes[index] == UInt8(ascii: ":") {
                if bytes[index + 1] == UInt8(ascii: "/") && bytes[index + 2] == UInt8(ascii: "/") { schemeEnd = index }
                break
            }
        }
        guard let schemeEnd else { return url.lowercased() }
        let scheme = String(decoding: bytes[..<schemeEnd], as: UTF8.self).lowercased()
        let rest = bytes[(schemeEnd + 3)...]
        var authority = rest.prefix { $0 != UInt8(ascii: "/") && $0 != UInt8(ascii: "?") && $0 != UInt8(ascii: "#") }
        if let at = authority.lastIndex(of: UInt8(ascii: "@")) { authority = authority[(at + 1)...] }
        let host = String(decoding: authority, as: UTF8.self).lowercased()
        // A port follows the host's colon; an IPv6 literal's colons are inside its brackets.
        let hasPort: Bool
        if host.hasPrefix("["), let close = host.firstIndex(of: "]") {
            hasPort = host[host.index(after: close)...].hasPrefix(":")
        } else {
            hasPort = host.contains(":")
        }
        let port = hasPort ? "" : scheme == "https" ? ":443" : scheme == "http" ? ":80" : ""
        return "\(scheme)://\(host)\(port)"
    }

    /// The wait before attempt `attempts + 1` after attempt `attempts` failed (SPEC §18.3): 1 s doubling to 5 min.
    /// 1 s after the first failure, 2 s after the second, … 256 s after the ninth, then 300 s.
    public static func backoffMilliseconds(afterAttempts attempts: Int) -> Int64 {
        let exponent = max(0, attempts - 1)
        guard exponent < 9 else { return maximumBackoffMilliseconds }
        return min(Int64(1000) << Int64(exponent), maximumBackoffMilliseconds)
    }

    public static let maximumBackoffMilliseconds: Int64 = 300_000

    /// How long finished entries are kept for `GET /deferred` (SPEC §18).
    public static let finishedRetentionMilliseconds: Int64 = 24 * 3600 * 1000

    /// The client's `Idempotency-Key` (the first, trimmed), if it sent a non-empty one.
    static func idempotencyKey(in fields: [HTTPField]) -> String? {
        for field in fields where field.name.lowercased() == "idempotency-key" {
            let value = field.value.trimmingSpaces
            if !value.isEmpty { return value }
        }
        return nil
    }
}

extension String {
    var trimmingSpaces: String {
        var slice = Substring(self)
        while let first = slice.first, first == " " || first == "\t" { slice = slice.dropFirst() }
        while let last = slice.last, last == " " || last == "\t" { slice = slice.dropLast() }
        return String(slice)
    }
}
