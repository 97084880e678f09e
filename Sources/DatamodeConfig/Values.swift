import DatamodePolicy

/// Parsers for the value kinds of the configuration, shared by the file and the overrides.
enum ConfigValue {
    /// Longest accepted duration: a timer longer than a day is a mistake, not a policy.
    static let maximumDuration: Duration = .seconds(24 * 3600)
    /// Workers beyond this are a typo (the machine has nowhere near as many cores).
    static let maximumThreads = 256

    /// `15s`, `500ms`, `2m`, `1h`, or a bare integer of seconds; positive and at most a day.
    static func duration(_ text: String) -> Duration? {
        let trimmed = text.trimmingCharacters(in: " ")
        let digits = trimmed.prefix { $0.isASCII && $0.isNumber }
        let unit = trimmed.dropFirst(digits.count).trimmingCharacters(in: " ")
        guard !digits.isEmpty, digits.count <= 9, let value = Int64(digits) else { return nil }
        let duration: Duration
        switch unit {
        case "", "s": duration = .seconds(value)
        case "ms": duration = .milliseconds(value)
        case "m", "min": duration = .seconds(value * 60)
        case "h": duration = .seconds(value * 3600)
        default: return nil
        }
        guard duration > .zero, duration <= maximumDuration else { return nil }
        return duration
    }

    /// Bytes: an integer, or a number with `B`, `KiB` or `MiB` (`8KiB`, `64 KiB`). `nil` if malformed.
    static func size(_ text: String) -> Int? {
        let trimmed = text.trimmingCharacters(in: " ")
        let digits = trimmed.prefix { $0.isASCII && $0.isNumber }
        let unit = trimmed.dropFirst(digits.count).trimmingCharacters(in: " ").lowercased()
        guard !digits.isEmpty, digits.count <= 12, let value = Int(digits) else { return nil }
        switch unit {
        case "", "b": return value
        case "kib": return value * 1024
        case "mib": return value * 1024 * 1024
        default: return nil
        }
    }

    /// A data mode name of SPEC §2, or an error message listing the accepted names.
    static func mode(_ text: String) -> DataMode? {
        DataMode(name: text.trimmingCharacters(in: " "))
    }

    static var modeExpectation: String {
        "a data mode (" + DataMode.acceptedNames.joined(separator: ", ") + ")"
    }

    /// A bearer token: visible ASCII, no spaces (it is compared with an `Authorization: Bearer` value).
    static func isValidToken(_ text: String) -> Bool {
        !text.isEmpty && text.unicodeScalars.allSatisfy { $0.value > 0x20 && $0.value < 0x7F }
    }

    /// An HTTP token (RFC 9110 §5.6.2): method names and header field names.
    static func isToken(_ text: String) -> Bool {
        !text.isEmpty && text.unicodeScalars.allSatisfy { scalar in
            switch scalar {
            case "a"..."z", "A"..."Z", "0"..."9": return true
            case "!", "#", "$", "%", "&", "'", "*", "+", "-", ".", "^", "_", "`", "|", "~": return true
            default: return false
            }
        }
    }

    /// A CIDR block, or a single address as a /32 or /128.
    static func cidr(_ text: String) -> CIDR? {
        CIDR(text.trimmingCharacters(in: " "))
    }
}

extension String {
    func trimmingCharacters(in character: Character) -> String {
        var slice = Substring(self)
        while slice.first == character { slice = slice.dropFirst() }
        while slice.last == character { slice = slice.dropLast() }
        return String(slice)
    }
}

extension Substring {
    func trimmingCharacters(in character: Character) -> String { String(self).trimmingCharacters(in: character) }
}

extension ConfigNode {
    /// A positive duration such as `15s` or `500ms`.
    func duration() throws(ConfigError) -> Duration {
        guard case .scalar(let scalar) = node, !isNull, let value = ConfigValue.duration(scalar.string) else {
            throw expected("a duration such as 15s or 500ms (positive, at most 24h)")
        }
        return value
    }

    /// A size in bytes (`8KiB`) within `range`.
    func size(in range: ClosedRange<Int>) throws(ConfigError) -> Int {
        guard case .scalar(let scalar) = node, !isNull, let value = ConfigValue.size(scalar.string) else {
            throw expected("a size such as 8KiB, 1MiB or 512 (bytes)")
        }
        guard range.contains(value) else {
            throw error("expected a size from \(describeSize(range.lowerBound)) to \(describeSize(range.upperBound)), got \(describe)")
        }
        return value
    }

    func listenAddress() throws(ConfigError) -> ListenAddress {
        guard case .scalar(let scalar) = node, !isNull, let value = ListenAddress(scalar.string) else {
            throw expected("an IP address and port such as 127.0.0.1:8877 or [::1]:8877")
        }
        return value
    }

    func cidr() throws(ConfigError) -> CIDR {
        guard case .scalar(let scalar) = node, !isNull, let value = ConfigValue.cidr(scalar.string) else {
            throw expected("a CIDR block such as 10.0.0.0/8 or ::1/128")
        }
        return value
    }
}

func describeSize(_ bytes: Int) -> String {
    if bytes >= 1024 * 1024, bytes % (1024 * 1024) == 0 { return "\(bytes / (1024 * 1024))MiB" }
    if bytes >= 1024, bytes % 1024 == 0 { return "\(bytes / 1024)KiB" }
    return "\(bytes)B"
}

/// Durations as the configuration writes them (`30s`, `500ms`, `2m`, `1h`), for the admin API's bodies.
public enum DurationText {
    /// A positive duration of at most 24 h, or nil.
    public static func parse(_ text: String) -> Duration? { ConfigValue.duration(text) }
}
