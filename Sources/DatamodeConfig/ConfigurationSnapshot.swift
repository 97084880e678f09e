import DatamodePolicy

/// A configuration compiled for the engine: immutable, built once per load, swapped whole.
///
/// Nothing in it is ever mutated, so it is shared across threads without locks. The process publishes it to the
/// workers through `RuntimeState`, whose generation is the one they watch; a reload that fails leaves the running
/// one in place.
public struct ConfigurationSnapshot: Sendable {
    public let configuration: ProxyConfiguration
    /// The file's rules and variants, compiled, with the admin API's variants when some were given.
    public let policy: PolicySnapshot

    /// Why a snapshot with API variants could not be built: the file's fault, or the API variants'.
    public enum Failure: Error, CustomStringConvertible {
        /// The configuration is invalid on its own (named by file, key and line).
        case configuration(ConfigError)
        /// The configuration is valid, but not with these API variants (say, an API variant's id is now taken by
        /// a file variant).
        case apiVariants(PolicyError)

        public var description: String {
            switch self {
            case .configuration(let error): "\(error)"
            case .apiVariants(let error): "\(error)"
            }
        }
    }

    /// Compiles `configuration` (after overrides) and runs the start-up checks.
    public init(configuration: ProxyConfiguration) throws(ConfigError) {
        try configuration.validateForStartup()
        do {
            self.policy = try Self.compile(configuration, apiVariants: [])
        } catch {
            throw Self.placed(error, in: configuration)
        }
        self.configuration = configuration
    }

    /// Compiles `configuration` (after overrides) together with the admin API's variants (each marked `.api`) in
    /// one pass, and runs the start-up checks. Only a failure compiles again, without the API variants, to say
    /// whose fault it is (a parsed configuration is known to compile alone: the parser checked it).
    public init(configuration: ProxyConfiguration, apiVariants: [Variant]) throws(Failure) {
        do {
            try configuration.validateForStartup()
        } catch {
            throw .configuration(error)
        }
        do {
            self.policy = try Self.compile(configuration, apiVariants: apiVariants)
        } catch {
            if !apiVariants.isEmpty {
                do {
                    _ = try Self.compile(configuration, apiVariants: [])
                } catch let own {
                    throw .configuration(Self.placed(own, in: configuration))
                }
                throw .apiVariants(error)
            }
            throw .configuration(Self.placed(error, in: configuration))
        }
        self.configuration = configuration
    }

    /// The parser already compiled the file's policy to check it: that one is used, as is or with the API variants.
    private static func compile(_ configuration: ProxyConfiguration, apiVariants: [Variant]) throws(PolicyError) -> PolicySnapshot {
        if let parsed = configuration.parsedPolicy.snapshot {
            return apiVariants.isEmpty ? parsed : try parsed.replacingAPIVariants(apiVariants)
        }
        let api = apiVariants.map { variant -> Variant in
            var variant = variant
            variant.source = .api
            return variant
        }
        return try PolicySnapshot(tags: configuration.tags, rules: configuration.rules, variants: configuration.variants + api)
    }

    /// A policy error of the file, named by the key and line of the rule or variant it is about.
    private static func placed(_ error: PolicyError, in configuration: ProxyConfiguration) -> ConfigError {
        PolicyErrorPlacement(source: configuration.provenance.source, lines: configuration.provenance.lines)
            .place(error, rules: configuration.rules, variants: configuration.variants)
    }
}
