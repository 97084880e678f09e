import DatamodeConfig
import DatamodePolicy
import Testing

/// SPEC §13 `media.hls-max-bitrate`: the caps per condition, their units, and the cap a mode gets.
@Suite("Media configuration")
struct MediaConfigTests {
    @Test("the default caps constrained at 730 kbit/s only, in the defaults and in the shipped file")
    func defaults() throws {
        let expected: [DataCondition: UInt64] = [.constrained: 730_000]
        #expect(ProxyConfiguration.defaults.media.hlsMaxBitrate == expected)
        #expect(try parse("").media.hlsMaxBitrate == expected)
        #expect(try ProxyConfiguration.load(path: shippedConfigPath).media.hlsMaxBitrate == expected)
    }

    @Test("rates take k, M, G and kbit, Mbit, Gbit as powers of 1000, with a decimal fraction")
    func units() throws {
        let cases: [(String, UInt64)] = [("730k", 730_000), ("2M", 2_000_000), ("1.5Mbit", 1_500_000),
                                         ("145000", 145_000), ("1G", 1_000_000_000), ("64 kbit", 64_000)]
        for (text, value) in cases {
            let configuration = try parse("media:\n  hls-max-bitrate: {expensive: \(text)}\n")
            #expect(configuration.media.hlsMaxBitrate[.expensive] == value, "\(text)")
            // A condition left out keeps its default.
            #expect(configuration.media.hlsMaxBitrate[.constrained] == 730_000)
        }
    }

    @Test("null removes a condition's cap")
    func nullRemoves() throws {
        let configuration = try parse("media:\n  hls-max-bitrate:\n    constrained: null\n    ultra-constrained: 200k\n")
        #expect(configuration.media.hlsMaxBitrate == [.ultraConstrained: 200_000])
    }

    @Test("several capped conditions in the mode: the lowest cap applies; none capped: no cap")
    func capInMode() {
        let media = MediaSection(hlsMaxBitrate: [.constrained: 730_000, .expensive: 2_000_000, .ultraConstrained: 150_000])
        #expect(media.manifestCap(in: .normal) == nil)
        #expect(media.manifestCap(in: DataMode(name: "expensive")!) == 2_000_000)
        #expect(media.manifestCap(in: DataMode(name: "constrained-expensive")!) == 730_000)
        #expect(media.manifestCap(in: DataMode(name: "satellite")!) == 150_000)
        #expect(MediaSection(hlsMaxBitrate: [:]).manifestCap(in: DataMode(name: "satellite")!) == nil)
    }

    @Test("bad media values name their key and line", arguments: [
        ErrorCase("media:\n  hls-max-bitrate: {constrained: fast}", key: "media.hls-max-bitrate.constrained", line: 2,
                  "expected a rate in bits per second"),
        ErrorCase("media:\n  hls-max-bitrate:\n    expensive: 2MiB", key: "media.hls-max-bitrate.expensive", line: 3,
                  "expected a rate in bits per second"),
        ErrorCase("media:\n  hls-max-bitrate:\n    expensive: 0", key: "media.hls-max-bitrate.expensive", line: 3,
                  "expected a rate in bits per second"),
        ErrorCase("media:\n  hls-max-bitrate:\n    expensive: -5k", key: "media.hls-max-bitrate.expensive", line: 3,
                  "expected a rate"),
        ErrorCase("media:\n  hls-max-bitrate:\n    low-data: 1M", key: "media.hls-max-bitrate.low-data", line: 3,
                  "unknown key"),
        ErrorCase("media:\n  dash-max-bitrate: 1M", key: "media.dash-max-bitrate", line: 2, "unknown key"),
        ErrorCase("media: 730k", key: "media", line: 1, "expected"),
    ])
    func errors(_ errorCase: ErrorCase) {
        expectError(errorCase)
    }
}

@Suite("Images configuration")
struct ImagesConfigTests {
    @Test("defaults: never, 800 px, quality 60, auto, 8 MiB, 40 Mpx; the shipped file says the same")
    func defaults() throws {
        let expected = ImagesSection(when: nil, maxWidth: 800, quality: 60, format: .auto, maxInput: 8 << 20, maxPixels: 40_000_000)
        #expect(ProxyConfiguration.defaults.images == expected)
        #expect(try ProxyConfiguration.load(path: shippedConfigPath).images == expected)
        #expect(!expected.applies(in: DataMode(name: "satellite")!))
    }

    @Test("every key parses; when names a condition")
    func values() throws {
        let images = try parse("""
            images:
              transcode: {when: constrained, max-width: 640, quality: 50, format: original, max-input: 2MiB, max-pixels: 1000000}
            """).images
        #expect(images == ImagesSection(when: .constrained, maxWidth: 640, quality: 50, format: .original,
                                        maxInput: 2 << 20, maxPixels: 1_000_000))
        #expect(images.applies(in: DataMode(name: "constrained-expensive")!))
        #expect(!images.applies(in: DataMode(name: "expensive")!))
    }

    @Test("bad image values name their key and line", arguments: [
        ErrorCase("images:\n  transcode: {when: always}", key: "images.transcode.when", line: 2, "expected a condition"),
        ErrorCase("images:\n  transcode:\n    max-width: 0", key: "images.transcode.max-width", line: 3, "width"),
        ErrorCase("images:\n  transcode:\n    quality: 101", key: "images.transcode.quality", line: 3, "quality"),
        ErrorCase("images:\n  transcode:\n    format: gif", key: "images.transcode.format", line: 3, "auto, original, jpeg"),
        ErrorCase("images:\n  transcode:\n    max-input: 1GiB", key: "images.transcode.max-input", line: 3, "expected a size"),
        ErrorCase("images:\n  transcode:\n    max-pixels: lots", key: "images.transcode.max-pixels", line: 3, "pixels"),
        ErrorCase("images:\n  transcode:\n    width: 3", key: "images.transcode.width", line: 3, "unknown key"),
    ])
    func errors(_ errorCase: ErrorCase) {
        expectError(errorCase)
    }
}
