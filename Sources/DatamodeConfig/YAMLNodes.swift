import Foundation
import Yams

/// Reading a composed YAML tree with the key path and line of every value at hand, so each error names
/// exactly what is wrong and where. Values are read from the node text, not from Yams' YAML 1.1 type
/// guesses: `off` stays the word `off` (for `log.access`), and a boolean is only `true` or `false`.
struct ConfigNode {
    let node: Node
    /// Dotted key path, e.g. `rules[0].match.client`.
    let path: String
    let source: String

    var line: Int? { node.mark?.line }

    func error(_ message: String) -> ConfigError {
        ConfigError(source: source, key: path, line: line, message: message)
    }

    func expected(_ what: String) -> ConfigError {
        error("expected \(what), got \(describe)")
    }

    /// How the value reads in an error message: `"abc"`, `a list`, `a mapping`, `nothing (null)`.
    var describe: String {
        switch node {
        case .scalar(let scalar):
            if isNull { return "nothing (null)" }
            return quoted(scalar.string)
        case .mapping: return "a mapping"
        case .sequence: return "a list"
        case .alias: return "an alias"
        }
    }

    var isNull: Bool {
        guard case .scalar(let scalar) = node else { return false }
        if scalar.style != .plain && scalar.style != .any { return false }
        return node.null != nil
    }

    // MARK: Scalars

    /// Any non-null scalar, as written. Numbers are accepted as their text (a numeric password is a password).
    func string() throws(ConfigError) -> String {
        guard case .scalar(let scalar) = node, !isNull else { throw expected("a string") }
        return scalar.string
    }

    /// A non-empty string.
    func nonEmptyString(_ what: String = "a non-empty string") throws(ConfigError) -> String {
        guard case .scalar(let scalar) = node, !isNull, !scalar.string.isEmpty else { throw expected(what) }
        return scalar.string
    }

    /// `true` or `false` only: not `yes`/`on`/`1`, and not the quoted string `"true"`.
    func bool() throws(ConfigError) -> Bool {
        if case .scalar(let scalar) = node, scalar.style == .plain || scalar.style == .any {
            switch scalar.string {
            case "true", "True", "TRUE": return true
            case "false", "False", "FALSE": return false
            default: break
            }
        }
        throw expected("true or false")
    }

    /// A decimal integer in `range`.
    func integer(in range: ClosedRange<Int>, what: String = "an integer") throws(ConfigError) -> Int {
        guard case .scalar(let scalar) = node, !isNull else { throw expected(what) }
        guard let value = parseDecimal(scalar.string) else { throw expected(what) }
        guard range.contains(value) else {
            throw error("expected \(what) from \(range.lowerBound) to \(range.upperBound), got \(value)")
        }
        return value
    }

    // MARK: Collections

    /// The items of a list; `null` (a key whose items are all commented out) reads as an empty list.
    func sequence(_ what: String = "a list") throws(ConfigError) -> [ConfigNode] {
        if isNull { return [] }
        guard case .sequence(let items) = node else { throw expected(what) }
        return items.enumerated().map { ConfigNode(node: $1, path: "\(path)[\($0)]", source: source) }
    }

    /// The entries of a mapping with free-form keys (header names, user names); `null` reads as empty.
    func freeMapping(_ what: String = "a mapping") throws(ConfigError) -> [(key: ConfigNode, value: ConfigNode)] {
        if isNull { return [] }
        guard case .mapping(let mapping) = node else { throw expected(what) }
        var entries: [(key: ConfigNode, value: ConfigNode)] = []
        for (keyNode, valueNode) in mapping {
            let key = ConfigNode(node: keyNode, path: path, source: source)
            guard case .scalar(let scalar) = keyNode, !key.isNull else { throw key.expected("a string key") }
            let childPath = path.isEmpty ? scalar.string : "\(path).\(scalar.string)"
            entries.append((key: ConfigNode(node: keyNode, path: childPath, source: source),
                            value: ConfigNode(node: valueNode, path: childPath, source: source)))
        }
        return entries
    }

    /// A mapping whose keys must all be in `known`; an unknown key is an error at its own line, with a
    /// suggestion when it is a near miss of a known one. `null` reads as an empty mapping (all defaults).
    func section(known: [String], what: String = "a mapping") throws(ConfigError) -> Section {
        var section = Section(node: self)
        for (key, value) in try freeMapping(what) {
            let name = key.node.scalar?.string ?? ""
            guard known.contains(name) else {
                var message = "unknown key \(quoted(name))"
                if let suggestion = closestKey(to: name, among: known) {
                    message += " (did you mean \(quoted(suggestion))?)"
                }
                message += "; expected one of: " + known.joined(separator: ", ")
                throw key.error(message)
            }
            section.entries[name] = (key: key, value: value)
        }
        return section
    }

    /// A mapping whose known keys have been checked.
    struct Section {
        let node: ConfigNode
        var entries: [String: (key: ConfigNode, value: ConfigNode)] = [:]

        init(node: ConfigNode) { self.node = node }

        subscript(_ key: String) -> ConfigNode? { entries[key]?.value }

        /// A key that must be present; its absence is reported at the mapping's line.
        func required(_ key: String, _ what: String) throws(ConfigError) -> ConfigNode {
            guard let value = entries[key]?.value else {
                let path = node.path.isEmpty ? key : "\(node.path).\(key)"
                throw ConfigError(source: node.source, key: path, line: node.line, message: "missing; expected \(what)")
            }
            return value
        }
    }
}

/// `"text"` with quotes and backslashes escaped, for messages.
func quoted(_ text: String) -> String {
    var out = "\""
    for character in text {
        switch character {
        case "\"": out += "\\\""
        case "\\": out += "\\\\"
        case "\n": out += "\\n"
        case "\t": out += "\\t"
        default: out.append(character)
        }
    }
    return out + "\""
}

/// A plain decimal integer (optional sign); no `0x`, `0o`, `_` or exponent. `nil` on overflow.
func parseDecimal(_ text: String) -> Int? {
    var digits = Substring(text)
    var negative = false
    if let first = digits.first, first == "-" || first == "+" {
        negative = first == "-"
        digits = digits.dropFirst()
    }
    guard !digits.isEmpty, digits.count <= 18, digits.allSatisfy({ $0.isASCII && $0.isNumber }),
          let magnitude = Int(digits) else { return nil }
    return negative ? -magnitude : magnitude
}

/// The known key nearest to a misspelt one, if it is close enough to be a plausible typo.
func closestKey(to key: String, among known: [String]) -> String? {
    let lowered = key.lowercased()
    var best: (key: String, distance: Int)?
    for candidate in known {
        let distance = editDistance(lowered, candidate.lowercased())
        if best == nil || distance < best!.distance { best = (candidate, distance) }
    }
    guard let best else { return nil }
    let limit = max(1, min(3, best.key.count / 3))
    if best.distance <= limit { return best.key }
    // `client_header` or `clientHeader` for `client-header`; `matches` for `match`.
    let squeeze = { (s: String) in s.lowercased().filter { $0.isLetter || $0.isNumber } }
    if let same = known.first(where: { squeeze($0) == squeeze(key) }) { return same }
    return known.first { candidate in
        let a = squeeze(candidate), b = squeeze(key)
        return min(a.count, b.count) >= 4 && (a.hasPrefix(b) || b.hasPrefix(a))
    }
}

/// Edit distance counting an insertion, a deletion, a substitution or a swap of two neighbours as one
/// (optimal string alignment), so `hots` is one step from `host`.
func editDistance(_ a: String, _ b: String) -> Int {
    let a = Array(a), b = Array(b)
    if a.isEmpty { return b.count }
    if b.isEmpty { return a.count }
    var table = [[Int]](repeating: [Int](repeating: 0, count: b.count + 1), count: a.count + 1)
    for i in 0...a.count { table[i][0] = i }
    for j in 0...b.count { table[0][j] = j }
    for i in 1...a.count {
        for j in 1...b.count {
            let cost = a[i - 1] == b[j - 1] ? 0 : 1
            table[i][j] = min(table[i - 1][j] + 1, table[i][j - 1] + 1, table[i - 1][j - 1] + cost)
            if i > 1, j > 1, a[i - 1] == b[j - 2], a[i - 2] == b[j - 1] {
                table[i][j] = min(table[i][j], table[i - 2][j - 2] + 1)
            }
        }
    }
    return table[a.count][b.count]
}
