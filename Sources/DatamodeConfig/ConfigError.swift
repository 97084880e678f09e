/// A configuration that cannot be used, named so an operator can fix it without reading code.
///
/// Every failure of loading, parsing, validating or overriding the configuration is one of these: the file
/// (or the flag / environment variable) it came from, the dotted key path of the offending setting, the line
/// when it is known, and a message that says what was expected and what was found. `SIGHUP` logs it and keeps
/// the running configuration; `datamode-proxy check` prints it and exits non-zero.
public struct ConfigError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The file path, or the override that carried the bad value (`DATAMODE_MODE`, `--mode`).
    public var source: String
    /// Dotted key path such as `timeouts.client-header`, `variants[2].target` or `rules[0].match.client`;
    /// empty when the problem is the file as a whole (unreadable, not YAML).
    public var key: String
    /// 1-based line in the file, when known.
    public var line: Int?
    /// What was expected and what was found.
    public var message: String

    public init(source: String, key: String, line: Int? = nil, message: String) {
        self.source = source
        self.key = key
        self.line = line
        self.message = message
    }

    /// `config/datamode.yaml:12: timeouts.client-header: expected a duration such as 15s or 500ms, got "abc"`
    public var description: String {
        var text = source
        if let line { text += ":\(line)" }
        text += ": "
        if !key.isEmpty { text += "\(key): " }
        return text + message
    }
}
