/// The vocabulary of data modes (SPEC §1–5, §15). Pure values: no I/O, no C.

/// One condition of the network path, the twin of `NWPath.isConstrained` / `NWPath.isExpensive` /
/// `NWPath.isUltraConstrained`. Declared in the SPEC's order (constrained, expensive, ultra-constrained): a
/// rejection's `error` is the first violated one in this order (SPEC §15).
public enum DataCondition: String, CaseIterable, Hashable, Sendable {
    case constrained
    case expensive
    /// A satellite-class link (SPEC §15). Unlike the other two it is opt-in: only a request that allows it may use it.
    case ultraConstrained = "ultra-constrained"
}

/// The active data mode: the set of conditions that hold (SPEC §2, §15). A set, not three flags: modes join by
/// union (a spent budget's conditions, SPEC §11), compare by inclusion, and index per-mode tables by their bits.
public struct DataMode: OptionSet, Hashable, Sendable, CustomStringConvertible {
    /// Bit 0 constrained, bit 1 expensive, bit 2 ultra-constrained.
    public let rawValue: UInt8

    public init(rawValue: UInt8) { self.rawValue = rawValue & 0b111 }

    /// Low Data Mode: `NWPath.isConstrained`.
    public static let constrained = DataMode(rawValue: 1)
    /// A metered path: `NWPath.isExpensive`.
    public static let expensive = DataMode(rawValue: 2)
    /// A satellite-class link (SPEC §15): `NWPath.isUltraConstrained`.
    public static let ultraConstrained = DataMode(rawValue: 4)

    /// The set holding `condition`.
    public init(_ condition: DataCondition) {
        switch condition {
        case .constrained: self = .constrained
        case .expensive: self = .expensive
        case .ultraConstrained: self = .ultraConstrained
        }
    }

    public init(constrained: Bool, expensive: Bool, ultraConstrained: Bool = false) {
        self.init(rawValue: (constrained ? 1 : 0) | (expensive ? 2 : 0) | (ultraConstrained ? 4 : 0))
    }

    public var constrained: Bool {
        get { contains(.constrained) }
        set { if newValue { insert(.constrained) } else { remove(.constrained) } }
    }
    public var expensive: Bool {
        get { contains(.expensive) }
        set { if newValue { insert(.expensive) } else { remove(.expensive) } }
    }
    /// SPEC §15. False unless stated, so a mode written with the first two conditions means what it did before
    /// the third existed.
    public var ultraConstrained: Bool {
        get { contains(.ultraConstrained) }
        set { if newValue { insert(.ultraConstrained) } else { remove(.ultraConstrained) } }
    }

    public static let normal: DataMode = []

    /// The mode as a number below 8 (constrained 1, expensive 2, ultra-constrained 4): an index into per-mode tables
    /// made once per snapshot or once per process, so the request path does not resolve them again.
    @inlinable public var index: Int { Int(rawValue) }

    /// The eight modes, by `index`.
    public static let all: [DataMode] = (0..<8).map { DataMode(rawValue: UInt8($0)) }

    /// Parses a mode name (case-insensitive): one of the eight canonical names of SPEC §2 and §15 (`normal`,
    /// `constrained`, `expensive`, `constrained-expensive`, `ultra-constrained`, `constrained-ultra-constrained`,
    /// `expensive-ultra-constrained`, `constrained-expensive-ultra-constrained`) or an alias: `low-data`
    /// (= constrained), `cellular` (= expensive), `satellite` (= all three). `nil` for anything else.
    public init?(name: String) {
        switch name.lowercased() {
        case "normal": self = .normal
        case "constrained", "low-data": self.init(constrained: true, expensive: false)
        case "expensive", "cellular": self.init(constrained: false, expensive: true)
        case "constrained-expensive": self.init(constrained: true, expensive: true)
        case "ultra-constrained": self.init(constrained: false, expensive: false, ultraConstrained: true)
        case "constrained-ultra-constrained": self.init(constrained: true, expensive: false, ultraConstrained: true)
        case "expensive-ultra-constrained": self.init(constrained: false, expensive: true, ultraConstrained: true)
        case "constrained-expensive-ultra-constrained", "satellite":
            self.init(constrained: true, expensive: true, ultraConstrained: true)
        default: return nil
        }
    }

    /// The canonical name of SPEC §2 / §15: the conditions that hold, in the order constrained, expensive,
    /// ultra-constrained, joined by `-`; `normal` for none. A literal per case: naming a mode never allocates.
    public var name: String {
        switch (constrained, expensive, ultraConstrained) {
        case (false, false, false): "normal"
        case (true, false, false): "constrained"
        case (false, true, false): "expensive"
        case (true, true, false): "constrained-expensive"
        case (false, false, true): "ultra-constrained"
        case (true, false, true): "constrained-ultra-constrained"
        case (false, true, true): "expensive-ultra-constrained"
        case (true, true, true): "constrained-expensive-ultra-constrained"
        }
    }

    public var description: String { name }

    /// Whether `condition` holds in this mode.
    public func has(_ condition: DataCondition) -> Bool { contains(DataMode(condition)) }

    /// The eight canonical names, in the order of SPEC §15.
    public static let canonicalNames = [
        "normal", "constrained", "expensive", "constrained-expensive", "ultra-constrained",
        "constrained-ultra-constrained", "expensive-ultra-constrained", "constrained-expensive-ultra-constrained",
    ]

    /// Every name accepted by `init(name:)`, for error messages: the canonical names, then the aliases.
    public static let acceptedNames = canonicalNames + ["low-data", "cellular", "satellite"]
}

/// Where the active mode came from, highest precedence first (SPEC §2, §7).
public enum ModeSource: String, Hashable, Sendable {
    case api, flag, config, `default`
    /// A step of a `PUT /schedule` timeline (SPEC §12).
    case schedule
}

/// The permissions every request resolves (SPEC §3, §15), twins of `URLRequest.allowsConstrainedNetworkAccess`,
/// `allowsExpensiveNetworkAccess` and `allowsUltraConstrainedNetworkAccess`.
public struct RequestTags: Hashable, Sendable {
    public var allowConstrained: Bool
    public var allowExpensive: Bool
    /// SPEC §15: opt-in, so `false` unless stated (as on Apple platforms, where it defaults to false).
    public var allowUltraConstrained: Bool
    public init(allowConstrained: Bool, allowExpensive: Bool, allowUltraConstrained: Bool = false) {
        self.allowConstrained = allowConstrained
        self.allowExpensive = allowExpensive
        self.allowUltraConstrained = allowUltraConstrained
    }
    /// The SPEC defaults: constrained and expensive access allowed. Ultra-constrained access stays false: it is
    /// the one permission a request must ask for (SPEC §15), so even this value does not grant it.
    public static let allowAll = RequestTags(allowConstrained: true, allowExpensive: true)
}

/// The `tags` section of the configuration (SPEC §3, §8).
public struct TagSettings: Hashable, Sendable {
    /// Write the resolved tags upstream as `Allow-Constrained` / `Allow-Expensive` / `Allow-Ultra-Constrained`
    /// (false: strip all three).
    public var forward: Bool
    /// Send `Save-Data: on` upstream while the mode is constrained.
    public var saveData: Bool
    /// Prefetch-marked requests get every tag false.
    public var prefetchIsDiscretionary: Bool
    /// Tags of a request nothing else decided (`allowUltraConstrained` false unless configured, SPEC §15).
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
    public var allowUltraConstrained: Bool?
    public init(allowConstrained: Bool? = nil, allowExpensive: Bool? = nil, allowUltraConstrained: Bool? = nil) {
        self.allowConstrained = allowConstrained
        self.allowExpensive = allowExpensive
        self.allowUltraConstrained = allowUltraConstrained
    }

    /// The rule sets no tag at all.
    public var isEmpty: Bool { allowConstrained == nil && allowExpensive == nil && allowUltraConstrained == nil }
}

/// A configured tagging rule (SPEC §3 step 2, §8).
public struct Rule: Hashable, Sendable {
    public var name: String
    public var match: RuleMatch
    public var tags: TagAssignment
    /// `true`: this rule's tags beat the client's own `Allow-*` headers.
    public var override: Bool
    /// `hold` (SPEC §18.2): a request refused because of this rule's tags is held up to this long (bounded by
    /// `deferral.max-hold`) for its conditions to lift, as with `Prefer: wait`. Nil: not held.
    public var hold: Duration?
    public init(name: String, match: RuleMatch, tags: TagAssignment, override: Bool = false, hold: Duration? = nil) {
        self.name = name
        self.match = match
        self.tags = tags
        self.override = override
        self.hold = hold
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
    /// Whenever the mode is ultra-constrained (SPEC §15).
    case ultraConstrained = "ultra-constrained"
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

    /// The characters of a variant id: letters, digits, `.`, `_` and `-` (SPEC §5). An id appears in
    /// `/variants/{id}`, in `Data-Mode-Variant` and in the access log as it is, so it needs no escaping anywhere.
    public static func isIDCharacter(_ b: UInt8) -> Bool {
        switch b {
        case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
             UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "."), UInt8(ascii: "_"), UInt8(ascii: "-"):
            return true
        default:
            return false
        }
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
