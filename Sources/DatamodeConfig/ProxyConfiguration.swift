import DatamodeHTTP
import DatamodePolicy
import Foundation

/// The whole configuration of SPEC §8: one typed section per feature, every key with its default.
///
/// A value is built once (parsed and validated from the file, then `applying` the flag and environment
/// overrides) and never edited in place by the engine: a reload parses a new one, compiles it into a new
/// `ConfigurationSnapshot`, and the workers swap to it whole.
public struct ProxyConfiguration: Sendable, Equatable {
    /// The proxy listener. Default `127.0.0.1:8877`.
    public var listen: ListenAddress
    /// The admin API listener and its token.
    public var admin: AdminSection
    /// The data mode the file (or an override) asks for; `nil` when neither set one.
    public var mode: DataMode?
    /// Where the admin API persists its mode and variants (`state-dir`). Default `./state`, kept as written:
    /// a relative path is relative to the working directory, like `--state-dir`.
    public var stateDirectory: String
    /// Worker threads, each with its own event loop; 0 = one per core.
    public var threads: Int
    /// How request tags are resolved and forwarded (SPEC §3).
    public var tags: TagSettings { didSet { parsedPolicy = PolicyCache() } }
    /// Tagging rules, in order (SPEC §3 step 2).
    public var rules: [Rule] { didSet { parsedPolicy = PolicyCache() } }
    /// Variants of the file, in order, with source `.config`; file paths are real paths inside `variantFiles.directory`.
    public var variants: [Variant] { didSet { parsedPolicy = PolicyCache() } }
    /// `variants-dir` made absolute against the config file's directory; `nil` when not set (then `variants/`
    /// beside the config file, see `variantFiles`).
    public var variantsDirectory: String?
    /// `CONNECT` tunnels.
    public var connect: ConnectSection
    /// Client access control and Basic proxy authentication.
    public var access: AccessSection
    /// Request head size limits.
    public var limits: HTTPLimits
    /// Connection timers.
    public var timeouts: TimeoutsSection
    /// How long `SIGTERM`/`SIGINT` waits for in-flight requests. Default 10 s.
    public var drainTimeout: Duration
    /// Access log destination.
    public var log: LogSection
    /// Bitrate caps for streaming manifests (SPEC §13).
    public var media: MediaSection
    /// Image transcoding (SPEC §13).
    public var images: ImagesSection
    /// Sessions for test rigs (SPEC §12).
    public var sessions: SessionsSection = SessionsSection()
    /// HTTPS interception and the local CA (SPEC §9).
    public var tls: TLSSection
    /// Link profiles, the profile each mode condition brings, and the shaping scope (SPEC §10).
    public var link: LinkSection
    /// Data budgets (SPEC §11), in order.
    public var budgets: [Budget]
    /// Holding refused requests and storing refused uploads (SPEC §18).
    public var deferral: DeferralSection = DeferralSection()
    public var http2: HTTP2Section = HTTP2Section()
    /// The transparent sidecar listener (SPEC §16); off by default.
    public var transparent: TransparentSection = TransparentSection()
    /// Where shared state lives (SPEC §19): the state directory (default) or Redis.
    public var store: StoreSection = StoreSection()

    /// True when an override (`--mode` or `DATAMODE_MODE`) set `mode`, not the file.
    public internal(set) var modeSetByOverride: Bool
    /// Where each setting came from, for errors found after parsing. Not part of equality.
    var provenance: Provenance
    /// The policy the parser compiled to check `tags`, `rules` and `variants`, kept so that the snapshot built from
    /// this configuration need not compile it again; dropped when any of the three changes.
    var parsedPolicy = PolicyCache()

    public init(listen: ListenAddress = .defaultProxy, admin: AdminSection = AdminSection(), mode: DataMode? = nil,
                stateDirectory: String = "./state", threads: Int = 0, tags: TagSettings = TagSettings(),
                rules: [Rule] = [], variants: [Variant] = [], variantsDirectory: String? = nil,
                connect: ConnectSection = ConnectSection(),
                access: AccessSection = AccessSection(), limits: HTTPLimits = HTTPLimits(),
                timeouts: TimeoutsSection = TimeoutsSection(), drainTimeout: Duration = .seconds(10),
                log: LogSection = LogSection(), tls: TLSSection = TLSSection(), link: LinkSection = LinkSection(),
                budgets: [Budget] = [], media: MediaSection = MediaSection(), images: ImagesSection = ImagesSection()) {
        self.listen = listen
        self.admin = admin
        self.mode = mode
        self.stateDirectory = stateDirectory
        self.threads = threads
        self.tags = tags
        self.rules = rules
        self.variants = variants
        self.variantsDirectory = variantsDirectory
        self.connect = connect
        self.access = access
        self.limits = limits
        self.timeouts = timeouts
        self.drainTimeout = drainTimeout
        self.log = log
        self.tls = tls
        self.link = link
        self.budgets = budgets
        self.media = media
        self.images = images
        self.modeSetByOverride = false
        self.provenance = Provenance(source: "defaults")
    }

    /// Every key at its SPEC §8 default: what an empty file gives.
    public static let defaults = ProxyConfiguration()

    /// The mode when the admin API has not set one (SPEC §2): the override's or the file's, else `normal`.
    public var effectiveMode: DataMode { ModeResolution(api: nil, configuration: self).mode }

    /// `.flag` if `--mode`/`DATAMODE_MODE` set the mode, `.config` if the file did, else `.default`.
    public var modeSource: ModeSource { ModeResolution(api: nil, configuration: self).source }

    /// Where file variants may live and what a relative `file` is relative to (SPEC §5): the variants directory
    /// (`variants-dir`, default `variants/` beside the config file) and the config file's directory. Without a
    /// config file both are taken from the working directory (`./variants`). API variants use the same.
    public var variantFiles: VariantFiles {
        let base = provenance.baseDirectory ?? Self.absolutePath(".")
        return VariantFiles(baseDirectory: base, directory: variantsDirectory ?? Self.absolutePath(base + "/variants"))
    }

    /// The CA certificate and key paths (SPEC §9): `tls.ca`, else `ca.pem` / `ca-key.pem` in the state directory.
    public var caPaths: (certificate: String, key: String) { tls.caPaths(stateDirectory: stateDirectory) }

    /// The number of worker threads to start: `threads`, or the core count when it is 0.
    public func workerCount(cores: Int = ProcessInfo.processInfo.activeProcessorCount) -> Int {
        threads > 0 ? threads : max(1, cores)
    }

    // MARK: Loading

    /// Reads and parses the file at `path`. Relative variant `file:` paths and `variants-dir` are resolved
    /// against the file's directory. An unreadable file is an error naming it.
    public static func load(path: String) throws(ConfigError) -> ProxyConfiguration {
        let manager = FileManager.default
        var isDirectory: ObjCBool = false
        guard manager.fileExists(atPath: path, isDirectory: &isDirectory) else {
            throw ConfigError(source: path, key: "", message: "cannot read the configuration file: no such file")
        }
        guard !isDirectory.boolValue else {
            throw ConfigError(source: path, key: "", message: "cannot read the configuration file: it is a directory")
        }
        guard let data = manager.contents(atPath: path) else {
            throw ConfigError(source: path, key: "", message: "cannot read the configuration file: permission denied or I/O error")
        }
        guard let text = String(data: data, encoding: .utf8) else {
            throw ConfigError(source: path, key: "", message: "cannot read the configuration file: it is not UTF-8 text")
        }
        let directory = (absolutePath(path) as NSString).deletingLastPathComponent
        return try parse(yaml: text, source: path, baseDirectory: directory)
    }

    /// Parses and validates YAML text. `source` names it in errors; `baseDirectory` anchors relative
    /// variant file paths and `variants-dir` (a relative `baseDirectory` is taken from the working directory).
    public static func parse(yaml: String, source: String, baseDirectory: String) throws(ConfigError) -> ProxyConfiguration {
        var parser = ConfigParser(source: source, baseDirectory: absolutePath(baseDirectory))
        return try parser.parse(yaml)
    }

    /// `path` made absolute against the working directory, with `.` and `..` removed.
    static func absolutePath(_ path: String) -> String {
        let joined = path.hasPrefix("/") ? path : FileManager.default.currentDirectoryPath + "/" + path
        var parts: [Substring] = []
        for part in joined.split(separator: "/") {
            switch part {
            case ".": continue
            case "..": _ = parts.popLast()
            default: parts.append(part)
            }
        }
        return "/" + parts.joined(separator: "/")
    }

    // MARK: Checks that need the final configuration

    /// Checks that hold only once overrides are applied (a token may come from `DATAMODE_ADMIN_TOKEN` for an
    /// `admin.listen` set in the file): the admin API on a non-loopback address requires a token (SPEC §7),
    /// because anyone who reaches it can switch the mode and map any URL elsewhere.
    public func validateForStartup() throws(ConfigError) {
        if !admin.listen.isLoopback && admin.token == nil {
            let origin = provenance.origin(of: "admin.listen")
            throw ConfigError(source: origin.source, key: "admin.token", line: origin.line,
                              message: "required when the admin API listens on a non-loopback address (\(admin.listen)); "
                                + "set admin.token or DATAMODE_ADMIN_TOKEN, or listen on 127.0.0.1")
        }
    }
}

/// A compiled policy carried beside the settings it was compiled from: a cache, so never part of equality.
struct PolicyCache: Sendable, Equatable {
    var snapshot: PolicySnapshot?

    static func == (lhs: PolicyCache, rhs: PolicyCache) -> Bool { true }
}

/// Where settings came from: the file and lines of keys, or the override that replaced them.
/// It is bookkeeping for error messages, so every two provenances compare equal: two configurations with
/// the same settings are the same configuration wherever they were read from.
struct Provenance: Sendable, Equatable {
    var source: String
    /// The directory of the file (relative paths in it are relative to it); nil for the built-in defaults.
    var baseDirectory: String?
    /// Line of each key path read from the file.
    var lines: [String: Int] = [:]
    /// Key path to the override (`--listen`, `DATAMODE_LISTEN`) that set it.
    var overrides: [String: String] = [:]

    static func == (lhs: Provenance, rhs: Provenance) -> Bool { true }

    func origin(of key: String) -> (source: String, line: Int?) {
        if let override = overrides[key] { return (override, nil) }
        return (source, lines[key])
    }
}
