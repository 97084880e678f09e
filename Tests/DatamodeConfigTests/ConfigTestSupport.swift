import DatamodeConfig
import DatamodePolicy
import Foundation
import Testing

/// Parses YAML from a test, naming it `test.yaml`, with variant files resolved against `base`.
func parse(_ yaml: String, base: String = NSTemporaryDirectory()) throws(ConfigError) -> ProxyConfiguration {
    try ProxyConfiguration.parse(yaml: yaml, source: "test.yaml", baseDirectory: base)
}

/// The error parsing `yaml` gives, or `nil` (recorded as a test failure) if it parsed.
func parseError(_ yaml: String, base: String = NSTemporaryDirectory(),
                sourceLocation: SourceLocation = #_sourceLocation) -> ConfigError? {
    do {
        let configuration = try parse(yaml, base: base)
        Issue.record("expected an error, parsed \(configuration)", sourceLocation: sourceLocation)
        return nil
    } catch {
        return error
    }
}

/// A bad-value case: the YAML, the key path and line the error must name, and a fragment of its message.
struct ErrorCase: Sendable, CustomTestStringConvertible {
    var yaml: String
    var key: String
    var line: Int?
    var message: String
    init(_ yaml: String, key: String, line: Int?, _ message: String) {
        self.yaml = yaml
        self.key = key
        self.line = line
        self.message = message
    }
    var testDescription: String { "\(key) @\(line.map(String.init) ?? "-"): \(yaml.debugDescription)" }
}

/// Asserts the error of `errorCase`: source, key, line and message fragment.
func expectError(_ errorCase: ErrorCase, base: String = NSTemporaryDirectory(),
                 sourceLocation: SourceLocation = #_sourceLocation) {
    guard let error = parseError(errorCase.yaml, base: base, sourceLocation: sourceLocation) else { return }
    #expect(error.source == "test.yaml", sourceLocation: sourceLocation)
    #expect(error.key == errorCase.key, "\(error)", sourceLocation: sourceLocation)
    #expect(error.line == errorCase.line, "\(error)", sourceLocation: sourceLocation)
    #expect(error.message.contains(errorCase.message), "\(error)", sourceLocation: sourceLocation)
}

/// A fresh temporary directory, removed by the caller with `removeItem`.
func makeTemporaryDirectory() throws -> String {
    let path = NSTemporaryDirectory() + "datamode-config-tests-" + UUID().uuidString
    try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    return path
}

/// The repository's `config/datamode.yaml`, found from this file's location.
var shippedConfigPath: String {
    URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().appendingPathComponent("config/datamode.yaml").path
}
