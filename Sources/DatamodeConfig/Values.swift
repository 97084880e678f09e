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

    /// Slowest and fastest link rates accepted: below 1 kbit/s a 64 KiB response takes nine minutes (a typo, not
    /// a network); above 100 Gbit/s the proxy could not tell shaping from not shaping.
    static let rateRange: ClosedRange<UInt64> = 1_000...100_000_000_000

    /// A rate in bits per second (SPEC §8): a decimal number and `k`/`M`/`G` or `kbit`/`Mbit`/`Gbit` (powers of
    /// 1000; `bit`, `bps` and no unit mean bits per second): `400kbit`, `1.44Mbit`, `2M`, `1Gbit`. At most three
    /// decimals; the result is rounded to a whole bit per second. `nil` if malformed.
    static func rate(_ text: String) -> UInt64? {
        let trimmed = text.trimmingCharacters(in: " ")
        guard let (value, unit) = decimal(trimmed, fractionDigits: 3) else { return nil }
        let multiplier: UInt64
        switch unit.lowercased() {
        case "", "bit", "bps", "bit/s": multiplier = 1
        case "k", "kbit", "kbps", "kbit/s": multiplier = 1_000
        case "m", "mbit", "mbps", "mbit/s": multiplier = 1_000_000
        case "g", "gbit", "gbps", "gbit/s": multiplier = 1_000_000_000
        default: return nil
        }
        // value is in thousandths.
        let (product, overflow) = value.multipliedReportingOverflow(by: multiplier)
        guard !overflow else { return nil }
        return (product + 500) / 1000
    }

    /// A latency: a decimal number of `ms` or `s` (`600ms`, `562.5ms`, `0.2s`, `0`), from 0 to a minute, kept to
    /// the microsecond. `nil` if malformed or out of range.
    static func latency(_ text: String) -> Duration? {
        let trimmed = text.trimmingCharacters(in: " ")
        guard let (value, unit) = decimal(trimmed, fractionDigits: 3) else { return nil }
        let duration: Duration
        switch unit {
        case "ms": duration = .microseconds(Int64(value))
        case "s": duration = .microseconds(Int64(value) * 1000)
        case "" where value == 0: duration = .zero
        default: return nil
        }
        guard duration <= .seconds(60) else { return nil }
        return duration
    }

    /// A non-negative decimal with at most `fractionDigits` decimals, in units of 10^-fractionDigits, and what
    /// follows it (trimmed). `nil` when there is no number.
    private static func decimal(_ text: String, fractionDigits: Int) -> (UInt64, String)? {
        let whole = text.prefix { $0.isASCII && $0.isNumber }
        var rest = text.dropFirst(whole.count)
        var fraction = Substring("")
        if rest.first == "." {
            rest = rest.dropFirst()
            fraction = rest.prefix { $0.isASCII && $0.isNumber }
            rest = rest.dropFirst(fraction.count)
            guard !fraction.isEmpty else { return nil }
        }
        guard !whole.isEmpty, whole.count <= 12, fraction.count <= fractionDigits, let integer = UInt64(whole) else { return nil }
        var scaled = integer
        for _ in 0..<fractionDigits { scaled *= 10 }
        var fractionValue: UInt64 = 0
        for digit in fraction.padding(fractionDigits) { fractionValue = fractionValue * 10 + UInt64(digit.wholeNumberValue!) }
        return (scaled + fractionValue, rest.trimmingCharacters(in: " "))
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

    /// Right-padded with zeros to `length` digits.
    func padding(_ length: Int) -> String { String(self) + String(repeating: "0", count: Swift.max(0, length - count)) }
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

    /// A rate in bits per second such as `400kbit` or `1.44Mbit`, within `ConfigValue.rateRange`.
    func rate() throws(ConfigError) -> UInt64 {
        guard case .scalar(let scalar) = node, !isNull, let value = ConfigValue.rate(scalar.string) else {
            throw expected("a rate in bits per second such as 400kbit, 1.44Mbit, 2M or 1Gbit")
        }
        guard ConfigValue.rateRange.contains(value) else {
            throw error("expected a rate from 1kbit to 100Gbit, got \(describe)")
        }
        return value
    }

    /// A latency such as `600ms` or `562.5ms`, 0 to 60 s.
    func latency() throws(ConfigError) -> Duration {
        guard case .scalar(let scalar) = node, !isNull, let value = ConfigValue.latency(scalar.string) else {
            throw expected("a latency such as 600ms, 562.5ms or 0 (at most 60s)")
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
