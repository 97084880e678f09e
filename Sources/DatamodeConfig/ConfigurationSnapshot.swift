import DatamodePolicy

/// A configuration compiled for the engine: immutable, built once per load, swapped whole.
///
/// Workers hold one snapshot and pick up a newer one at a safe point (between requests); nothing in it is
/// ever mutated, so it is shared across threads without locks. A reload that fails leaves the running
/// snapshot in place; one that succeeds yields the next generation.
public struct ConfigurationSnapshot: Sendable {
    /// 1 for the configuration loaded at start-up, +1 for every successful reload.
    public let generation: UInt64
    public let configuration: ProxyConfiguration
    /// The file's rules and variants, compiled.
    public let policy: PolicySnapshot

    /// Compiles `configuration` (after overrides) and runs the start-up checks.
    public init(configuration: ProxyConfiguration, generation: UInt64 = 1) throws(ConfigError) {
        try configuration.validateForStartup()
        do {
            self.policy = try PolicySnapshot(tags: configuration.tags, rules: configuration.rules,
                                             variants: configuration.variants)
        } catch {
            throw PolicyErrorPlacement(source: configuration.provenance.source, lines: configuration.provenance.lines)
                .place(error, rules: configuration.rules, variants: configuration.variants)
        }
        self.generation = generation
        self.configuration = configuration
    }

    /// The snapshot that replaces this one on reload: `configuration` compiled as generation + 1.
    public func reloaded(with configuration: ProxyConfiguration) throws(ConfigError) -> ConfigurationSnapshot {
        try ConfigurationSnapshot(configuration: configuration, generation: generation &+ 1)
    }
}
