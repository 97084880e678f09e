import DatamodeConfig
import Testing

/// SPEC §17 `http2`: every key, its bounds, and the errors that name them.
@Suite("HTTP/2 configuration")
struct HTTP2ConfigTests {
    @Test("the defaults are SPEC §17's, in the defaults, an empty section and the shipped file")
    func defaults() throws {
        let expected = HTTP2Section(client: true, upstream: true, maxConcurrentStreams: 100, initialWindow: 1 << 20)
        #expect(ProxyConfiguration.defaults.http2 == expected)
        #expect(try parse("").http2 == expected)
        #expect(try parse("http2: {}\n").http2 == expected)
        #expect(try ProxyConfiguration.load(path: shippedConfigPath).http2 == expected)
    }

    @Test("every key set to a non-default value")
    func everyKey() throws {
        let http2 = try parse("http2: {client: false, upstream: false, max-concurrent-streams: 8, initial-window: 64KiB}").http2
        #expect(http2 == HTTP2Section(client: false, upstream: false, maxConcurrentStreams: 8, initialWindow: 65_536))
        #expect(try parse("http2: {initial-window: 65535}").http2.initialWindow == 65_535)
    }

    @Test("bad http2 values name their key and line", arguments: [
        ErrorCase("http2:\n  client: maybe", key: "http2.client", line: 2, "expected true or false"),
        ErrorCase("http2:\n  max-concurrent-streams: 0", key: "http2.max-concurrent-streams", line: 2, "from 1 to 10000"),
        ErrorCase("http2:\n  max-concurrent-streams: 10001", key: "http2.max-concurrent-streams", line: 2, "from 1 to 10000"),
        ErrorCase("http2:\n  initial-window: 1KiB", key: "http2.initial-window", line: 2, "from 65535 bytes"),
        ErrorCase("http2:\n  initial-window: 2GiB", key: "http2.initial-window", line: 2, "from 65535 bytes"),
        ErrorCase("http2:\n  initial-window: lots", key: "http2.initial-window", line: 2, "such as 1MiB"),
        ErrorCase("http2:\n  push: true", key: "http2.push", line: 2, "unknown key"),
        ErrorCase("http2: on", key: "http2", line: 1, "expected a mapping"),
    ])
    func errors(_ errorCase: ErrorCase) {
        expectError(errorCase)
    }
}
