import DatamodePolicy

/// Automatic low-res for streaming manifests (SPEC §13 `media`): a bitrate cap per mode condition.
public struct MediaSection: Sendable, Equatable {
    /// `hls-max-bitrate`: the cap (bits per second) applied to HLS master playlists and DASH MPDs while the
    /// condition is in the mode; `nil` = no cap for that condition. Default: 730 kbit/s while constrained.
    public var hlsMaxBitrate: [DataCondition: UInt64]

    public init(hlsMaxBitrate: [DataCondition: UInt64] = [.constrained: 730_000]) {
        self.hlsMaxBitrate = hlsMaxBitrate
    }

    /// The cap that applies in `mode`: with several capped conditions, the lowest; `nil` when none is capped.
    public func manifestCap(in mode: DataMode) -> UInt64? {
        var cap: UInt64?
        for condition in DataCondition.allCases where mode.has(condition) {
            if let value = hlsMaxBitrate[condition] { cap = min(cap ?? value, value) }
        }
        return cap
    }
}

extension ConfigValue {
    /// A rate in bits per second (SPEC §8 units): an integer, or a number with `k`/`M`/`G` or
    /// `kbit`/`Mbit`/`Gbit` (powers of 1000), optionally with a decimal fraction (`1.5M`). Positive; `nil` if
    /// malformed.
    static func bitRate(_ text: String) -> UInt64? {
        let trimmed = text.trimmingCharacters(in: " ")
        let number = trimmed.prefix { ($0.isASCII && $0.isNumber) || $0 == "." }
        let unit = trimmed.dropFirst(number.count).trimmingCharacters(in: " ")
        let parts = number.split(separator: ".", omittingEmptySubsequences: false)
        guard !number.isEmpty, parts.count <= 2, let whole = parts.first, !whole.isEmpty, whole.count <= 12,
              let integer = UInt64(whole) else { return nil }
        var fraction: Substring = ""
        if parts.count == 2 {
            fraction = parts[1]
            guard !fraction.isEmpty, fraction.count <= 6, fraction.allSatisfy({ $0.isASCII && $0.isNumber }) else { return nil }
        }
        let multiplier: UInt64
        switch unit {
        case "", "bit", "bps": multiplier = 1
        case "k", "kbit", "kbps": multiplier = 1_000
        case "M", "Mbit", "Mbps": multiplier = 1_000_000
        case "G", "Gbit", "Gbps": multiplier = 1_000_000_000
        default: return nil
        }
        var scale: UInt64 = 1
        for _ in fraction { scale *= 10 }
        let fractionValue = UInt64(fraction) ?? 0
        let (product, overflow) = integer.multipliedReportingOverflow(by: multiplier)
        guard !overflow else { return nil }
        let value = product + fractionValue * multiplier / scale
        // A fraction finer than one bit per second is a typo, not a rate.
        guard fractionValue * multiplier % scale == 0, value > 0 else { return nil }
        return value
    }
}

extension ConfigNode {
    /// A positive rate such as `730k`, `2M` or `1.5Mbit`.
    func bitRate() throws(ConfigError) -> UInt64 {
        guard case .scalar(let scalar) = node, !isNull, let value = ConfigValue.bitRate(scalar.string) else {
            throw expected("a rate in bits per second such as 730k, 2M or 1.5Mbit (k/M/G are powers of 1000), or null")
        }
        return value
    }
}

extension ConfigParser {
    /// `media: {hls-max-bitrate: {constrained, expensive, ultra-constrained}}`. A condition left out keeps its
    /// default; `null` removes the cap for it.
    func media(_ node: ConfigNode) throws(ConfigError) -> MediaSection {
        let section = try node.section(known: ["hls-max-bitrate"])
        var media = MediaSection()
        if let value = section["hls-max-bitrate"] {
            let caps = try value.section(known: DataCondition.allCases.map(\.rawValue))
            for condition in DataCondition.allCases {
                guard let cap = caps[condition.rawValue] else { continue }
                media.hlsMaxBitrate[condition] = cap.isNull ? nil : try cap.bitRate()
            }
        }
        return media
    }
}
