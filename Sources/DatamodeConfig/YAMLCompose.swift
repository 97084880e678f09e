import Foundation
import Yams

/// Turns YAML text into a node tree, or a `ConfigError` with the line of the syntax error.
enum YAMLCompose {
    /// `nil` for an empty document (an empty file, or only comments).
    static func compose(_ yaml: String, source: String) throws(ConfigError) -> Node? {
        do {
            return try Yams.compose(yaml: yaml)
        } catch let error as YamlError {
            throw translate(error, yaml: yaml, source: source)
        } catch {
            throw ConfigError(source: source, key: "", message: "not valid YAML: \(error)")
        }
    }

    private static func translate(_ error: YamlError, yaml: String, source: String) -> ConfigError {
        switch error {
        case let .scanner(context, problem, mark, _), let .parser(context, problem, mark, _),
             let .composer(context, problem, mark, _):
            if problem == "but found another document" {
                return ConfigError(source: source, key: "", line: mark.line,
                                   message: "not valid YAML: a configuration file holds one document, found a second (---)")
            }
            var message = "not valid YAML: \(problem)"
            if let context { message += " (\(context.text) at line \(context.mark.line), column \(context.mark.column))" }
            return ConfigError(source: source, key: "", line: mark.line, message: message)
        case let .reader(problem, offset, _, _):
            var line: Int?
            if let offset {
                let prefix = yaml.prefix(offset)
                line = prefix.reduce(1) { $1 == "\n" ? $0 + 1 : $0 }
            }
            return ConfigError(source: source, key: "", line: line, message: "not valid YAML: \(problem)")
        case let .duplicatedKeysInMapping(duplicates, context):
            return duplicateKeyError(yaml: yaml, source: source, names: duplicates, firstMark: context.mark)
        default:
            return ConfigError(source: source, key: "", message: "not valid YAML: \(error)")
        }
    }

    /// A key given twice in one mapping is almost always a mistake (the second silently winning hides the
    /// first), so it is refused. Yams reports only the first occurrence and not the mapping it is in; to name
    /// the key path and the repeated line, the first occurrence is renamed to a marker, the text composed
    /// again, and the marker found in the tree. If that fails (say the key appears three times), the error
    /// still names the key and its first line.
    private static func duplicateKeyError(yaml: String, source: String, names: [String], firstMark: Mark) -> ConfigError {
        let name = names.first ?? "?"
        let fallback = ConfigError(source: source, key: name, line: firstMark.line,
                                   message: "duplicate key \(quoted(name)); each key may appear once in a mapping")
        let marker = "datamode-duplicate-key-marker-"
        guard let renamed = insert(marker, into: yaml, at: firstMark),
              let root = try? Yams.compose(yaml: renamed),
              let found = find(keyPrefix: marker, in: root, path: "") else { return fallback }
        let path = found.parentPath.isEmpty ? name : "\(found.parentPath).\(name)"
        let repeated = found.siblings.first { $0.scalar?.string == name }?.mark?.line
        var message = "duplicate key \(quoted(name))"
        if let repeated {
            message += " (first at line \(firstMark.line)); each key may appear once in a mapping"
            return ConfigError(source: source, key: path, line: repeated, message: message)
        }
        return ConfigError(source: source, key: path, line: firstMark.line, message: message + "; each key may appear once in a mapping")
    }

    /// Inserts `text` at a mark (line and column in Unicode scalars), after an opening quote if there is one.
    private static func insert(_ text: String, into yaml: String, at mark: Mark) -> String? {
        var lines = yaml.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        guard mark.line >= 1, mark.line <= lines.count else { return nil }
        var scalars = Array(lines[mark.line - 1].unicodeScalars)
        var column = mark.column - 1
        guard column >= 0, column < scalars.count else { return nil }
        if scalars[column] == "\"" || scalars[column] == "'" { column += 1 }
        scalars.insert(contentsOf: text.unicodeScalars, at: column)
        var line = String.UnicodeScalarView()
        line.append(contentsOf: scalars)
        lines[mark.line - 1] = String(line)
        return lines.joined(separator: "\n")
    }

    private struct Found {
        var parentPath: String
        var siblings: [Node]
    }

    private static func find(keyPrefix: String, in node: Node, path: String) -> Found? {
        switch node {
        case .mapping(let mapping):
            for (key, _) in mapping where key.scalar?.string.hasPrefix(keyPrefix) == true {
                return Found(parentPath: path, siblings: mapping.keys.filter { $0 != key })
            }
            for (key, value) in mapping {
                let name = key.scalar?.string ?? "?"
                if let found = find(keyPrefix: keyPrefix, in: value, path: path.isEmpty ? name : "\(path).\(name)") {
                    return found
                }
            }
        case .sequence(let items):
            for (index, item) in items.enumerated() {
                if let found = find(keyPrefix: keyPrefix, in: item, path: "\(path)[\(index)]") { return found }
            }
        default:
            break
        }
        return nil
    }
}
