import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A Prometheus text exposition (format 0.0.4) read strictly enough for tests: every sample line must be
/// `name{labels} value`, every `# TYPE` line is kept, and a series appearing twice is an error.
public struct MetricsScrape: Sendable {
    /// Value of each series, keyed by its canonical text: `name` or `name{a="x",b="y"}` with labels sorted.
    public private(set) var samples: [String: Double] = [:]
    /// `# TYPE` of each metric family.
    public private(set) var types: [String: String] = [:]
    public let text: String

    public init(_ text: String) throws {
        self.text = text
        for rawLine in text.split(separator: "\n", omittingEmptySubsequences: true) {
            let line = rawLine.trimmingCharacters(in: .whitespaces)
            if line.isEmpty { continue }
            if line.hasPrefix("#") {
                let parts = line.split(separator: " ", maxSplits: 3).map(String.init)
                if parts.count >= 4 && parts[1] == "TYPE" { types[parts[2]] = parts[3] }
                continue
            }
            guard let space = line.lastIndex(of: " "), let value = Double(line[line.index(after: space)...]) else {
                throw TestSocketError.protocolError("metrics line without a value: \(line)")
            }
            let series = try Self.canonical(String(line[..<space]).trimmingCharacters(in: .whitespaces))
            guard samples[series] == nil else { throw TestSocketError.protocolError("series twice: \(series)") }
            samples[series] = value
        }
    }

    /// `name{b="2",a="1"}` -> `name{a="1",b="2"}`.
    static func canonical(_ series: String) throws -> String {
        guard let open = series.firstIndex(of: "{") else { return series }
        guard series.hasSuffix("}") else { throw TestSocketError.protocolError("bad series: \(series)") }
        let name = series[..<open]
        let inner = series[series.index(after: open)..<series.index(before: series.endIndex)]
        var labels: [(String, String)] = []
        var rest = Substring(inner)
        while !rest.isEmpty {
            guard let equals = rest.firstIndex(of: "="), rest[rest.index(after: equals)...].hasPrefix("\"") else {
                throw TestSocketError.protocolError("bad labels: \(series)")
            }
            let key = String(rest[..<equals])
            var index = rest.index(equals, offsetBy: 2)
            var value = ""
            while index < rest.endIndex && rest[index] != "\"" {
                if rest[index] == "\\" { index = rest.index(after: index) }
                guard index < rest.endIndex else { break }
                value.append(rest[index])
                index = rest.index(after: index)
            }
            guard index < rest.endIndex else { throw TestSocketError.protocolError("unterminated label: \(series)") }
            labels.append((key, value))
            rest = rest[rest.index(after: index)...]
            if rest.hasPrefix(",") { rest = rest.dropFirst() }
        }
        labels.sort { $0.0 < $1.0 }
        return name + "{" + labels.map { "\($0.0)=\"\($0.1)\"" }.joined(separator: ",") + "}"
    }

    /// The value of `name` with exactly these labels, or nil when the series is absent.
    public func value(_ name: String, _ labels: [String: String] = [:]) -> Double? {
        if labels.isEmpty { return samples[name] }
        let key = name + "{" + labels.sorted { $0.key < $1.key }.map { "\($0.key)=\"\($0.value)\"" }.joined(separator: ",") + "}"
        return samples[key]
    }

    /// `value`, with an absent series read as 0 (a counter that has not moved yet may be omitted).
    public func counter(_ name: String, _ labels: [String: String] = [:]) -> Double {
        value(name, labels) ?? 0
    }

    /// The `le` bounds and cumulative counts of histogram `name`, in the order of increasing bound.
    public func buckets(_ name: String) -> [(le: Double, count: Double)] {
        let prefix = name + "_bucket{le=\""
        return samples.compactMap { key, value -> (Double, Double)? in
            guard key.hasPrefix(prefix), key.hasSuffix("\"}") else { return nil }
            let bound = key.dropFirst(prefix.count).dropLast(2)
            let le = bound == "+Inf" ? Double.infinity : Double(bound)
            return le.map { ($0, value) }
        }.sorted { $0.0 < $1.0 }
    }
}
