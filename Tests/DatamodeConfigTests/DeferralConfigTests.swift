import DatamodeConfig
import DatamodePolicy
import Testing

/// SPEC §18 `deferral`: every key, its units and bounds, and the errors that name them.
@Suite("Deferral configuration")
struct DeferralConfigTests {
    @Test("the defaults are SPEC §18's, in the defaults, an empty section and the shipped file")
    func defaults() throws {
        let expected = DeferralSection(maxHold: .seconds(30), maxHeld: 1000, uploads: [], maxBody: 64 << 20,
                                       maxBytes: 1 << 30, maxAge: .seconds(7 * 86_400), concurrency: 2)
        #expect(ProxyConfiguration.defaults.deferral == expected)
        #expect(try parse("").deferral == expected)
        #expect(try parse("deferral:\n").deferral == expected)
        #expect(try parse("deferral: {}\n").deferral == expected)
        #expect(try ProxyConfiguration.load(path: shippedConfigPath).deferral == expected)
    }

    @Test("every key set to a non-default value")
    func everyKey() throws {
        let deferral = try parse("""
            deferral:
              max-hold: 2m
              max-held: 0
              uploads: ["https://api.example/upload/*", "*/telemetry"]
              max-body: 10MB
              max-bytes: 2.5GB
              max-age: 36h
              concurrency: 8
            """).deferral
        #expect(deferral.maxHold == .seconds(120))
        #expect(deferral.maxHeld == 0)
        #expect(deferral.uploads.map(\.pattern) == ["https://api.example/upload/*", "*/telemetry"])
        #expect(deferral.maxBody == 10_000_000)
        #expect(deferral.maxBytes == 2_500_000_000)
        #expect(deferral.maxAge == .seconds(36 * 3600))
        #expect(deferral.concurrency == 8)
    }

    @Test("max-age takes days and the other duration units", arguments: [
        ("7d", Duration.seconds(7 * 86_400)), ("366d", .seconds(366 * 86_400)), ("90m", .seconds(5400)),
        ("1500ms", .milliseconds(1500)), ("45", .seconds(45)), ("2 h", .seconds(7200)),
    ])
    func maxAgeUnits(_ text: String, _ expected: Duration) throws {
        #expect(try parse("deferral: {max-age: \(text)}").deferral.maxAge == expected)
    }

    @Test("sizes take SI and binary units", arguments: [
        ("max-body", "1KiB", UInt64(1024)), ("max-body", "512MiB", 512 << 20), ("max-body", "3MB", 3_000_000),
        ("max-bytes", "1TiB", 1 << 40), ("max-bytes", "64MiB", 64 << 20),
    ])
    func sizes(_ key: String, _ text: String, _ expected: UInt64) throws {
        // max-bytes must hold max-body, so each is checked beside a value that does.
        let yaml = key == "max-body" ? "deferral: {max-body: \(text), max-bytes: 1TiB}" : "deferral: {max-body: 1MiB, max-bytes: \(text)}"
        let deferral = try parse(yaml).deferral
        #expect((key == "max-body" ? UInt64(deferral.maxBody) : deferral.maxBytes) == expected)
    }

    @Test("upload globs match the canonical URL: scheme and host lowercased, path case kept")
    func uploadGlobs() throws {
        let deferral = try parse("deferral:\n  uploads: [\"HTTPS://API.Example/Upload/*\", \"*.example/beacon\"]").deferral
        #expect(deferral.uploads.map(\.pattern) == ["https://api.example/Upload/*", "*.example/beacon"])
        #expect(deferral.storesUpload(url: "https://api.example/Upload/photo.jpg"))
        #expect(!deferral.storesUpload(url: "https://api.example/upload/photo.jpg"))
        #expect(!deferral.storesUpload(url: "http://api.example/Upload/photo.jpg"))
        #expect(deferral.storesUpload(url: "http://cdn.example/beacon"))
        #expect(!DeferralSection().storesUpload(url: "https://api.example/Upload/photo.jpg"))
    }

    @Test("bad deferral values name their key and line", arguments: [
        ErrorCase("deferral:\n  max-hold: forever", key: "deferral.max-hold", line: 2, "expected a duration"),
        ErrorCase("deferral:\n  max-hold: 0s", key: "deferral.max-hold", line: 2, "expected a duration"),
        ErrorCase("deferral:\n  max-hold: 2d", key: "deferral.max-hold", line: 2, "at most 24h"),
        ErrorCase("deferral:\n  max-held: -1", key: "deferral.max-held", line: 2, "from 0 to 100000"),
        ErrorCase("deferral:\n  max-held: many", key: "deferral.max-held", line: 2, "a number of requests"),
        ErrorCase("deferral:\n  uploads: https://api.example/*", key: "deferral.uploads", line: 2, "a list of URL globs"),
        ErrorCase("deferral:\n  uploads:\n    - api.example/upload/*", key: "deferral.uploads[0]", line: 3,
                  "starting with http://, https:// or *"),
        ErrorCase("deferral:\n  uploads:\n    - \"https://\"", key: "deferral.uploads[0]", line: 3, "starting with http://"),
        ErrorCase("deferral:\n  uploads:\n    - \"https://a.example/x y\"", key: "deferral.uploads[0]", line: 3,
                  "without spaces"),
        ErrorCase("deferral:\n  uploads: [\"\"]", key: "deferral.uploads[0]", line: 2, "expected a URL glob"),
        ErrorCase("deferral:\n  max-body: 0", key: "deferral.max-body", line: 2, "a positive size"),
        ErrorCase("deferral:\n  max-body: big", key: "deferral.max-body", line: 2, "a positive size"),
        ErrorCase("deferral:\n  max-body: 1GiB\n  max-bytes: 2GiB", key: "deferral.max-body", line: 2, "at most 512MiB"),
        ErrorCase("deferral:\n  max-bytes: 10 MiB", key: "deferral.max-bytes", line: 2, "smaller than max-body"),
        ErrorCase("deferral:\n  max-body: 2MiB\n  max-bytes: 1MiB", key: "deferral.max-bytes", line: 3,
                  "smaller than max-body"),
        ErrorCase("deferral:\n  max-body: 2GB", key: "deferral.max-body", line: 2, "at most 512MiB"),
        ErrorCase("deferral:\n  max-bytes: 1XB", key: "deferral.max-bytes", line: 2, "a positive size such as 1GiB"),
        ErrorCase("deferral:\n  max-age: 0d", key: "deferral.max-age", line: 2, "at most 366d"),
        ErrorCase("deferral:\n  max-age: 367d", key: "deferral.max-age", line: 2, "at most 366d"),
        ErrorCase("deferral:\n  max-age: 1w", key: "deferral.max-age", line: 2, "such as 7d"),
        ErrorCase("deferral:\n  concurrency: 0", key: "deferral.concurrency", line: 2, "from 1 to 64"),
        ErrorCase("deferral:\n  concurrency: 65", key: "deferral.concurrency", line: 2, "from 1 to 64"),
        ErrorCase("deferral:\n  max_hold: 1s", key: "deferral.max_hold", line: 2, #"did you mean "max-hold""#),
        ErrorCase("deferral:\n  retries: 3", key: "deferral.retries", line: 2, "unknown key"),
        ErrorCase("deferral: 30s", key: "deferral", line: 1, "expected a mapping"),
    ])
    func errors(_ errorCase: ErrorCase) {
        expectError(errorCase)
    }
}
