import DatamodePolicy

/// Automatic low-res for images (SPEC §13 `images.transcode`).
public struct ImagesSection: Sendable, Equatable {
    /// What a transcoded image is encoded as.
    public enum OutputFormat: String, Sendable, CaseIterable {
        /// WebP when the request's `Accept` has `image/webp`, else the original format (SPEC §13).
        case auto
        /// Always the original format (only resized and re-compressed).
        case original
        /// JPEG whatever the input (transparency is composited on white).
        case jpeg
    }

    /// `images.transcode.when`: the condition under which images are transcoded; `nil` (default) = never.
    public var when: DataCondition?
    /// Widest output, in pixels (narrower images are only re-encoded). Default 800.
    public var maxWidth: Int
    /// Encoder quality, 1-100 (JPEG and WebP). Default 60.
    public var quality: Int
    public var format: OutputFormat
    /// Larger responses pass untouched (never buffered whole). Default 8 MiB.
    public var maxInput: Int
    /// Images with more pixels (width × height, read from the header) pass untouched, never decoded: the
    /// defence against decompression bombs. Default 40,000,000.
    public var maxPixels: Int

    public init(when: DataCondition? = nil, maxWidth: Int = 800, quality: Int = 60, format: OutputFormat = .auto,
                maxInput: Int = 8 << 20, maxPixels: Int = 40_000_000) {
        self.when = when
        self.maxWidth = maxWidth
        self.quality = quality
        self.format = format
        self.maxInput = maxInput
        self.maxPixels = maxPixels
    }

    /// Whether images are transcoded in `mode`.
    public func applies(in mode: DataMode) -> Bool {
        when.map(mode.has) ?? false
    }
}

extension ConfigParser {
    /// `images: {transcode: {when, max-width, quality, format, max-input, max-pixels}}`.
    func images(_ node: ConfigNode) throws(ConfigError) -> ImagesSection {
        let section = try node.section(known: ["transcode"])
        var images = ImagesSection()
        guard let transcodeNode = section["transcode"] else { return images }
        let transcode = try transcodeNode.section(known: ["when", "max-width", "quality", "format", "max-input", "max-pixels"])
        if let value = transcode["when"], !value.isNull {
            let conditions = DataCondition.allCases.map(\.rawValue)
            guard let condition = DataCondition(rawValue: try value.string()) else {
                throw value.expected("a condition (" + conditions.joined(separator: ", ") + ") or null")
            }
            images.when = condition
        }
        if let value = transcode["max-width"] { images.maxWidth = try value.integer(in: 16...16_384, what: "a width in pixels") }
        if let value = transcode["quality"] { images.quality = try value.integer(in: 1...100, what: "a quality from 1 to 100") }
        if let value = transcode["format"] {
            guard let format = ImagesSection.OutputFormat(rawValue: try value.string()) else {
                throw value.expected(ImagesSection.OutputFormat.allCases.map(\.rawValue).joined(separator: ", "))
            }
            images.format = format
        }
        if let value = transcode["max-input"] { images.maxInput = try value.size(in: 1024...(64 << 20)) }
        if let value = transcode["max-pixels"] {
            images.maxPixels = try value.integer(in: 1...1_000_000_000, what: "a number of pixels")
        }
        return images
    }
}
