import DatamodePolicy

/// A link profile (SPEC §10): the network a mode stands for, as rates each way and an added latency.
public struct LinkProfile: Sendable, Hashable {
    public var name: String
    /// Origin to client, bits per second.
    public var down: UInt64
    /// Client to origin, bits per second.
    public var up: UInt64
    /// Added once per request before its response head is relayed, and once per tunnel before its first byte.
    public var latency: Duration
    /// Each added latency is moved by a uniform random amount in ±jitter (never below zero).
    public var jitter: Duration

    public init(name: String, down: UInt64, up: UInt64, latency: Duration, jitter: Duration = .zero) {
        self.name = name
        self.down = down
        self.up = up
        self.latency = latency
        self.jitter = jitter
    }

    /// Latency in microseconds (the engine's unit for it).
    public var latencyMicroseconds: Int64 { Self.microseconds(latency) }
    public var jitterMicroseconds: Int64 { Self.microseconds(jitter) }

    static func microseconds(_ duration: Duration) -> Int64 {
        let (seconds, attoseconds) = duration.components
        return seconds * 1_000_000 + attoseconds / 1_000_000_000_000
    }

    /// The built-in profiles of SPEC §10, with the numbers of their sources (cited in `config/datamode.yaml`).
    ///
    /// Chrome DevTools presets are `front_end/core/sdk/NetworkManager.ts` of ChromeDevTools/devtools-frontend
    /// (`Slow3GConditions` titled "3G", `Slow4GConditions` titled "Slow 4G", `Fast4GConditions`): bytes per second
    /// `kbit * 1000 / 8 * factor` and a latency of `targetLatency * factor`, the factors being DevTools' own
    /// adjustment from a target network to what its request-level throttling must apply to feel like it.
    /// Network Link Conditioner's profiles give a delay each way; the latency here is their sum (a round trip).
    public static let builtIn: [LinkProfile] = [
        // DevTools "3G": 500 * 1000 / 8 * .8 bytes/s each way, latency 400 * 5 ms.
        LinkProfile(name: "devtools-3g", down: 400_000, up: 400_000, latency: .milliseconds(2000)),
        // DevTools "Slow 4G": 1.6 * 1000 * 1000 / 8 * .9 down, 750 * 1000 / 8 * .9 up, latency 150 * 3.75 ms.
        LinkProfile(name: "devtools-slow-4g", down: 1_440_000, up: 675_000, latency: .microseconds(562_500)),
        // DevTools "Fast 4G": 9 * 1000 * 1000 / 8 * .9 down, 1.5 * 1000 * 1000 / 8 * .9 up, latency 60 * 2.75 ms.
        LinkProfile(name: "devtools-fast-4g", down: 8_100_000, up: 1_350_000, latency: .milliseconds(165)),
        // Network Link Conditioner "3G": 780 / 330 kbit/s, 100 ms delay each way.
        LinkProfile(name: "nlc-3g", down: 780_000, up: 330_000, latency: .milliseconds(200)),
        // NLC "DSL": 2 Mbit/s / 256 kbit/s, 5 ms each way.
        LinkProfile(name: "nlc-dsl", down: 2_000_000, up: 256_000, latency: .milliseconds(10)),
        // NLC "LTE": 50 / 10 Mbit/s, 50 ms down, 65 ms up.
        LinkProfile(name: "nlc-lte", down: 50_000_000, up: 10_000_000, latency: .milliseconds(115)),
        // NLC "Very Bad Network": 1 / 1 Mbit/s, 500 ms each way (its 10% packet loss is not emulated).
        LinkProfile(name: "nlc-very-bad-network", down: 1_000_000, up: 1_000_000, latency: .milliseconds(1000)),
        // A geostationary consumer link (this project's definition): ~600 ms round trip through 36,000 km orbit.
        LinkProfile(name: "geo-satellite", down: 12_000_000, up: 3_000_000, latency: .milliseconds(600)),
    ]
}

/// `shaping-scope` (SPEC §10): who shares one pair of token buckets.
public enum ShapingScope: String, Sendable, Hashable, CaseIterable {
    /// One pair per client address: each device on the proxy gets the whole profile.
    case client
    /// One pair for all traffic through the proxy: the proxy is the link.
    case link
}

/// `conditions`: the profile in force while the mode has each condition (SPEC §10).
public struct ConditionProfiles: Sendable, Hashable {
    public var constrained: String?
    public var expensive: String?
    public var ultraConstrained: String?

    public init(constrained: String? = nil, expensive: String? = nil, ultraConstrained: String? = nil) {
        self.constrained = constrained
        self.expensive = expensive
        self.ultraConstrained = ultraConstrained
    }
}

/// Link conditions of SPEC §10: the named profiles (built-ins, overridden or extended by the file), which one
/// each mode condition brings, and the shaping scope.
public struct LinkSection: Sendable, Equatable {
    /// Every profile by name: the built-ins, then the file's (a file profile of a built-in's name replaces it).
    public var profiles: [String: LinkProfile]
    public var conditions: ConditionProfiles
    public var scope: ShapingScope

    public init(profiles: [String: LinkProfile] = LinkSection.builtInProfiles, conditions: ConditionProfiles = ConditionProfiles(),
                scope: ShapingScope = .client) {
        self.profiles = profiles
        self.conditions = conditions
        self.scope = scope
    }

    public static let builtInProfiles: [String: LinkProfile] =
        Dictionary(uniqueKeysWithValues: LinkProfile.builtIn.map { ($0.name, $0) })

    /// Names of every profile, sorted (for error messages and `GET /conditions`).
    public var profileNames: [String] { profiles.keys.sorted() }
}

/// Why a profile is in force (`GET /conditions`).
public enum ProfileSource: String, Sendable, Hashable {
    /// Set with `PUT /conditions`.
    case api
    /// The mode has a condition mapped to it in `conditions`.
    case mode
    /// No profile: traffic is not shaped.
    case none
}

/// Which profile is in force, and why (SPEC §10): a session's (§12, decided by its caller), else the one set
/// through the admin API, else the mode's mapping with precedence ultra-constrained > constrained > expensive,
/// else none. A pure function of its inputs, so a request can be judged by its own effective mode (budgets, §11).
public struct ProfileResolution: Sendable, Hashable {
    public var profile: LinkProfile?
    public var source: ProfileSource
    /// The condition whose mapping chose it (`source == .mode`).
    public var condition: DataCondition?

    public init(api: String?, mode: DataMode, link: LinkSection) {
        if let api, let profile = link.profiles[api] {
            self.profile = profile
            source = .api
            condition = nil
            return
        }
        let mapped: [(DataCondition, String?)] = [(.ultraConstrained, link.conditions.ultraConstrained),
                                                  (.constrained, link.conditions.constrained),
                                                  (.expensive, link.conditions.expensive)]
        for (condition, name) in mapped where mode.has(condition) {
            if let name, let profile = link.profiles[name] {
                self.profile = profile
                source = .mode
                self.condition = condition
                return
            }
        }
        profile = nil
        source = .none
        condition = nil
    }
}
