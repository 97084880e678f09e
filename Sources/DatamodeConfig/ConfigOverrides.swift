import DatamodePolicy

/// Settings given on the command line or in `DATAMODE_*` environment variables (SPEC §8). Flags beat the
/// environment, which beats the file: `flags.overriding(.fromEnvironment(env))` then `config.applying(_:)`.
///
/// Values stay text until applied, so a bad one is refused by the same checks as the file, with an error
/// whose source is the flag or variable that carried it (`--threads`, `DATAMODE_THREADS`).
public struct ConfigOverrides: Sendable, Equatable {
    /// Where a set of overrides comes from; names the flag or variable in errors.
    public enum Origin: Sendable, Hashable {
        case flags
        case environment
    }

    /// `--config` / `DATAMODE_CONFIG`: which file to load (used by the caller, not by `applying`).
    public var configPath: String?
    /// `--listen` / `DATAMODE_LISTEN`.
    public var listen: String?
    /// `--admin-listen` / `DATAMODE_ADMIN_LISTEN`.
    public var adminListen: String?
    /// `--mode` / `DATAMODE_MODE`.
    public var mode: String?
    /// `--state-dir` / `DATAMODE_STATE_DIR`.
    public var stateDirectory: String?
    /// `--threads` / `DATAMODE_THREADS`.
    public var threads: String?
    /// `DATAMODE_ADMIN_TOKEN` (a token on a command line would be visible to every user in `ps`).
    public var adminToken: String?

    /// Where values set directly on this value come from.
    public var origin: Origin
    /// Per-field origin of values merged in by `overriding(_:)`.
    private var fieldOrigins: [Field: Origin] = [:]

    public init(origin: Origin = .flags, configPath: String? = nil, listen: String? = nil, adminListen: String? = nil,
                mode: String? = nil, stateDirectory: String? = nil, threads: String? = nil, adminToken: String? = nil) {
        self.origin = origin
        self.configPath = configPath
        self.listen = listen
        self.adminListen = adminListen
        self.mode = mode
        self.stateDirectory = stateDirectory
        self.threads = threads
        self.adminToken = adminToken
    }

    /// The `DATAMODE_*` variables of `env`. An empty variable counts as unset (`DATAMODE_MODE=` in a
    /// compose file means "not given", as with most container images).
    public static func fromEnvironment(_ env: [String: String]) -> ConfigOverrides {
        func value(_ field: Field) -> String? {
            guard let text = env[field.environmentName], !text.isEmpty else { return nil }
            return text
        }
        return ConfigOverrides(origin: .environment, configPath: value(.configPath), listen: value(.listen),
                               adminListen: value(.adminListen), mode: value(.mode),
                               stateDirectory: value(.stateDirectory), threads: value(.threads),
                               adminToken: value(.adminToken))
    }

    /// `self`'s values where set, else `lower`'s (flags `.overriding(environment)`).
    public func overriding(_ lower: ConfigOverrides) -> ConfigOverrides {
        var merged = self
        for field in Field.allCases where self[field] == nil && lower[field] != nil {
            merged[field] = lower[field]
            merged.fieldOrigins[field] = lower.origin(of: field)
        }
        return merged
    }

    /// The flag or variable name that carried `field`, for errors.
    func sourceName(of field: Field) -> String {
        switch origin(of: field) {
        case .flags: field.flagName
        case .environment: field.environmentName
        }
    }

    private func origin(of field: Field) -> Origin { fieldOrigins[field] ?? origin }

    enum Field: CaseIterable, Hashable, Sendable {
        case configPath, listen, adminListen, mode, stateDirectory, threads, adminToken

        var flagName: String {
            switch self {
            case .configPath: "--config"
            case .listen: "--listen"
            case .adminListen: "--admin-listen"
            case .mode: "--mode"
            case .stateDirectory: "--state-dir"
            case .threads: "--threads"
            case .adminToken: "--admin-token"
            }
        }

        var environmentName: String {
            switch self {
            case .configPath: "DATAMODE_CONFIG"
            case .listen: "DATAMODE_LISTEN"
            case .adminListen: "DATAMODE_ADMIN_LISTEN"
            case .mode: "DATAMODE_MODE"
            case .stateDirectory: "DATAMODE_STATE_DIR"
            case .threads: "DATAMODE_THREADS"
            case .adminToken: "DATAMODE_ADMIN_TOKEN"
            }
        }

        /// The configuration key it overrides.
        var key: String {
            switch self {
            case .configPath: "config"
            case .listen: "listen"
            case .adminListen: "admin.listen"
            case .mode: "mode"
            case .stateDirectory: "state-dir"
            case .threads: "threads"
            case .adminToken: "admin.token"
            }
        }
    }

    subscript(field: Field) -> String? {
        get {
            switch field {
            case .configPath: configPath
            case .listen: listen
            case .adminListen: adminListen
            case .mode: mode
            case .stateDirectory: stateDirectory
            case .threads: threads
            case .adminToken: adminToken
            }
        }
        set {
            switch field {
            case .configPath: configPath = newValue
            case .listen: listen = newValue
            case .adminListen: adminListen = newValue
            case .mode: mode = newValue
            case .stateDirectory: stateDirectory = newValue
            case .threads: threads = newValue
            case .adminToken: adminToken = newValue
            }
        }
    }
}

extension ProxyConfiguration {
    /// This configuration with `overrides` applied, each value checked like the file's. A mode set here
    /// reports `modeSource == .flag`.
    public func applying(_ overrides: ConfigOverrides) throws(ConfigError) -> ProxyConfiguration {
        var result = self
        func fail(_ field: ConfigOverrides.Field, _ value: String, expected: String) -> ConfigError {
            ConfigError(source: overrides.sourceName(of: field), key: field.key,
                        message: "expected \(expected), got \(quoted(value))")
        }
        func note(_ field: ConfigOverrides.Field) {
            result.provenance.overrides[field.key] = overrides.sourceName(of: field)
        }
        if let text = overrides.listen {
            guard let address = ListenAddress(text) else {
                throw fail(.listen, text, expected: "an IP address and port such as 127.0.0.1:8877 or [::1]:8877")
            }
            result.listen = address
            note(.listen)
        }
        if let text = overrides.adminListen {
            guard let address = ListenAddress(text) else {
                throw fail(.adminListen, text, expected: "an IP address and port such as 127.0.0.1:8878 or [::1]:8878")
            }
            result.admin.listen = address
            note(.adminListen)
        }
        if let text = overrides.mode {
            guard let mode = ConfigValue.mode(text) else { throw fail(.mode, text, expected: ConfigValue.modeExpectation) }
            result.mode = mode
            result.modeSetByOverride = true
            note(.mode)
        }
        if let text = overrides.stateDirectory {
            guard !text.isEmpty else { throw fail(.stateDirectory, text, expected: "a directory path") }
            result.stateDirectory = text
            note(.stateDirectory)
        }
        if let text = overrides.threads {
            guard let threads = parseDecimal(text.trimmingCharacters(in: " ")),
                  (0...ConfigValue.maximumThreads).contains(threads) else {
                throw fail(.threads, text,
                           expected: "a number of worker threads from 0 to \(ConfigValue.maximumThreads) (0 = one per core)")
            }
            result.threads = threads
            note(.threads)
        }
        if let text = overrides.adminToken {
            guard ConfigValue.isValidToken(text) else {
                throw ConfigError(source: overrides.sourceName(of: .adminToken), key: "admin.token",
                                  message: "expected a token of visible ASCII characters without spaces")
            }
            result.admin.token = text
            note(.adminToken)
        }
        return result
    }
}
