/// The vocabulary of data modes (SPEC §1–5). Pure values: no I/O, no C.

/// One condition of the network path, the twin of `NWPath.isConstrained` / `NWPath.isExpensive`.
public enum DataCondition: String, CaseIterable, Hashable, Sendable {
    case constrained
    case expensive
}

/// The active data mode: which conditions hold (SPEC §2).
public struct DataMode: Hashable, Sendable, CustomStringConvertible {
    public var constrained: Bool
    public var expensive: Bool

    public init(constrained: Bool, expensive: Bool) {
        self.constrained = constrained
        self.expensive = expensive
    }

    public static let normal = DataMode(constrained: false, expensive: false)

    /// Parses a mode name: `normal`, `constrained`, `expensive`, `constrained-expensive`, and the aliases
    /// `low-data` (= constrained) and `cellular` (= expensive). Case-insensitive. `nil` for anything else.
    public init?(name: String) {
        switch name.lowercased() {
        case "normal": self = .normal
        case "constrained", "low-data": self.init(constrained: true, expensive: false)
        case "expensive", "cellular": self.init(constrained: false, expensive: true)
        case "constrained-expensive": self.init(constrained: true, expensive: true)
        default: return nil
        }
    }

    /// The canonical name of SPEC §2.
    public var name: String {
        switch (constrained, expensive) {
        case (false, false): "normal"
        case (true, false): "constrained"
        case (false, true): "expensive"
        case (true, true): "constrained-expensive"
        }
    }

    public var description: String { name }

    /// Every name accepted by `init(name:)`, for error messages.
    public static let acceptedNames = ["normal", "constrained", "expensive", "constrained-expensive", "low-data", "cellular"]
}

/// Where the active mode came from, highest precedence first (SPEC §2, §7).
public enum ModeSource: String, Hashable, Sendable {
    case api, flag, config, `default`
}

/// The two permissions every request resolves (SPEC §3), twins of `URLRequest.allowsConstrainedNetworkAccess`
/// and `allowsExpensiveNetworkAccess`.
public struct RequestTags: Hashable, Sendable {
    public var allowConstrained: Bool
    public var allowExpensive: Bool
    public init(allowConstrained: Bool, allowExpensive: Bool) {
        self.allowConstrained = allowConstrained
        self.allowExpensive = allowExpensive
    }
    public static let allowAll = RequestTags(allowConstrained: true, allowExpensive: true)
}

/// The `tags` section of the configuration (SPEC §3, §8).
public struct TagSettings: Hashable, Sendable {
    /// Write the resolved tags upstream as `Allow-Constrained` / `Allow-Expensive` (false: strip them).
    public var forward: Bool
    /// Send `Save-Data: on` upstream while the mode is constrained.
    public var saveData: Bool
    /// Prefetch-marked requests get both tags false.
    public var prefetchIsDiscretionary: Bool
    /// Tags of a request nothing else decided.
    public var defaults: RequestTags

    public init(forward: Bool = true, saveData: Bool = true, prefetchIsDiscretionary: Bool = true,
                defaults: RequestTags = .allowAll) {
        self.forward = forward
        self.saveData = saveData
        self.prefetchIsDiscretionary = prefetchIsDiscretionary
        self.defaults = defaults
    }
}

/// An IPv4 or IPv6 address as 4 or 16 bytes in network order.
public struct IPAddress: Hashable, Sendable, CustomStringConvertible {
    public var bytes: [UInt8]
    public init?(bytes: [UInt8]) {
        guard bytes.count == 4 || bytes.count == 16 else { return nil }
        self.bytes = bytes
    }
    // `init?(_ text: String)`, `description` and IPv4-mapped handling are in IPAddress+Parsing.swift.
}

/// A CIDR block such as `127.0.0.0/8` or `::1/128` (access control, rule `client` matches).
public struct CIDR: Hashable, Sendable, CustomStringConvertible {
    public var network: IPAddress
    public var prefixLength: Int
    public init(network: IPAddress, prefixLength: Int) {
        self.network = network
        self.prefixLength = prefixLength
    }
    // `init?(_ text: String)`, `contains(_:)` and `description` are in CIDR.swift.
}

/// What a rule matches on (SPEC §8 `rules[].match`). Every present criterion must hold.
public struct RuleMatch: Hashable, Sendable {
    /// Case-insensitive glob on the host name (no port), e.g. `*.video.example`.
    public var host: String?
    /// Case-insensitive glob on the path (query excluded), e.g. `*.mp4`.
    public var path: String?
    /// Exact method, e.g. `GET` (compared case-sensitively, RFC 9110 §9.1).
    public var method: String?
    /// Header name (case-insensitive) to a case-insensitive glob on its value; every entry must match some copy.
    public var header: [String: String]
    /// The client's address lies in this block.
    public var client: CIDR?

    public init(host: String? = nil, path: String? = nil, method: String? = nil, header: [String: String] = [:],
                client: CIDR? = nil) {
        self.host = host
        self.path = path
        self.method = method
        self.header = header
        self.client = client
    }
}

/// The tags a rule sets; `nil` leaves that tag to the next source (SPEC §3).
public struct TagAssignment: Hashable, Sendable {
    public var allowConstrained: Bool?
    public var allowExpensive: Bool?
    public init(allowConstrained: Bool? = nil, allowExpensive: Bool? = nil) {
        self.allowConstrained = allowConstrained
        self.allowExpensive = allowExpensive
    }
}

/// A configured tagging rule (SPEC §3 step 2, §8).
public struct Rule: Hashable, Sendable {
    public var name: String
    public var match: RuleMatch
    public var tags: TagAssignment
    /// `true`: this rule's tags beat the client's own `Allow-*` headers.
    public var override: Bool
    public init(name: String, match: RuleMatch, tags: TagAssignment, override: Bool = false) {
        self.name = name
        self.match = match
        self.tags = tags
        self.override = override
    }
}

/// When a variant applies (SPEC §5).
public enum VariantCondition: String, CaseIterable, Hashable, Sendable {
    /// Only to a request that would otherwise be rejected (the default).
    case disallowed
    /// Whenever the mode is constrained.
    case constrained
    /// Whenever the mode is expensive.
    case expensive
    /// In every mode (a map-remote rule).
    case always
}

/// What a variant serves instead of the requested URL.
public enum VariantResource: Hashable, Sendable {
    /// Another URL (with `$1`…`$9` capture references). `redirect: false` fetches and streams it;
    /// `redirect: true` answers `307` with `Location`.
    case target(String, redirect: Bool)
    /// A local file served by the proxy itself. `path` is absolute once configuration is loaded;
    /// `contentType` nil means "guess from the extension".
    case file(path: String, contentType: String?)
}

/// Where a variant was defined (SPEC §7 `GET /variants`).
public enum VariantSource: String, Hashable, Sendable {
    case config, api
}

/// A registered low-resolution variant (SPEC §5).
public struct Variant: Hashable, Sendable {
    public var id: String
    /// An absolute URL pattern; each `*` matches any run of characters and is captured.
    public var match: String
    public var resource: VariantResource
    public var when: VariantCondition
    public var source: VariantSource
    public init(id: String, match: String, resource: VariantResource, when: VariantCondition = .disallowed,
                source: VariantSource = .config) {
        self.id = id
        self.match = match
        self.resource = resource
        self.when = when
        self.source = source
    }
}

/// An invalid rule or variant, named so an operator can find it.
public struct PolicyError: Error, Hashable, Sendable, CustomStringConvertible {
    /// e.g. `variant "hero-small"` or `rule "videos"`.
    public var subject: String
    public var message: String
    public init(subject: String, message: String) {
        self.subject = subject
        self.message = message
    }
    public var description: String { "\(subject): \(message)" }
}
