import DatamodeHTTP
import DatamodePolicy
import Foundation
import Yams

/// YAML text -> validated `ProxyConfiguration`, one function per section of SPEC §8.
///
/// Every key is known here: anything else at any level is an error naming it. Values are checked where
/// they are read, so each error carries the key path and line of the value itself. Rules and variants are
/// finally compiled by `PolicySnapshot` (patterns, targets, capture references), and its verdict is
/// mapped back to the rule's or variant's key and line.
struct ConfigParser {
    let source: String
    let baseDirectory: String
    private var provenance: Provenance
    /// Lines of each rule and variant and of their fields, to place policy errors.
    private var itemLines: [String: Int] = [:]
    /// Where variant files may be (set from `variants-dir` before the variants are read).
    private var variantFiles: VariantFiles

    init(source: String, baseDirectory: String) {
        self.source = source
        self.baseDirectory = baseDirectory
        self.variantFiles = VariantFiles(baseDirectory: baseDirectory, directory: baseDirectory + "/variants")
        self.provenance = Provenance(source: source, baseDirectory: baseDirectory)
    }

    static let topLevelKeys = ["listen", "admin", "mode", "state-dir", "threads", "tags", "rules", "variants",
                               "connect", "access", "limits", "timeouts", "drain-timeout", "log", "variants-dir", "sessions",
                               "tls", "profiles", "conditions", "shaping-scope", "budgets",
                               "media", "images", "deferral", "http2", "transparent", "store"]

    mutating func parse(_ yaml: String) throws(ConfigError) -> ProxyConfiguration {
        var configuration = ProxyConfiguration.defaults
        guard let root = try YAMLCompose.compose(yaml, source: source) else {
            configuration.provenance = provenance
            return configuration
        }
        let top = ConfigNode(node: root, path: "", source: source)
        if top.isNull {
            configuration.provenance = provenance
            return configuration
        }
        guard case .mapping = root else {
            throw ConfigError(source: source, key: "", line: top.line,
                              message: "expected a mapping of settings (listen:, mode:, …) at the top level, got \(top.describe)")
        }
        let section = try top.section(known: Self.topLevelKeys)
        for (key, entry) in section.entries { record(key, entry.value) }

        if let node = section["listen"] { configuration.listen = try node.listenAddress() }
        if let node = section["admin"] { configuration.admin = try admin(node) }
        if let node = section["mode"] {
            let text = try node.string()
            guard let mode = ConfigValue.mode(text) else { throw node.expected(ConfigValue.modeExpectation) }
            configuration.mode = mode
        }
        if let node = section["state-dir"] { configuration.stateDirectory = try node.nonEmptyString("a directory path") }
        if let node = section["threads"] {
            configuration.threads = try node.integer(in: 0...ConfigValue.maximumThreads,
                                                     what: "a number of worker threads (0 = one per core)")
        }
        if let node = section["tags"] { configuration.tags = try tags(node) }
        if let node = section["rules"] { configuration.rules = try rules(node) }
        // Before `variants`: their files are checked against it.
        if let node = section["variants-dir"], !node.isNull {
            configuration.variantsDirectory = try variantsDirectory(node)
            variantFiles.directory = configuration.variantsDirectory!
        }
        if let node = section["variants"] { configuration.variants = try variants(node) }
        if let node = section["connect"] { configuration.connect = try connect(node) }
        if let node = section["access"] { configuration.access = try access(node) }
        if let node = section["limits"] { configuration.limits = try limits(node) }
        if let node = section["timeouts"] { configuration.timeouts = try timeouts(node) }
        if let node = section["drain-timeout"] { configuration.drainTimeout = try node.duration() }
        if let node = section["log"] { configuration.log = try log(node) }
        if let node = section["media"] { configuration.media = try media(node) }
        if let node = section["images"] { configuration.images = try images(node) }
        if let node = section["sessions"] { configuration.sessions = try sessions(node) }
        if let node = section["tls"] { configuration.tls = try tls(node) }
        if let node = section["budgets"] { configuration.budgets = try budgets(node) }
        if let node = section["deferral"] { configuration.deferral = try deferral(node) }
        if let node = section["http2"] { configuration.http2 = try http2(node) }
        if let node = section["transparent"] { configuration.transparent = try transparent(node) }
        if let node = section["store"] { configuration.store = try store(node) }
        configuration.link = try link(profiles: section["profiles"], conditions: section["conditions"],
                                      scope: section["shaping-scope"])

        configuration.parsedPolicy.snapshot = try compilePolicy(configuration)
        configuration.provenance = provenance
        return configuration
    }

    private mutating func record(_ path: String, _ node: ConfigNode) {
        if let line = node.line { provenance.lines[path] = line }
    }

    // MARK: Sections

    private mutating func admin(_ node: ConfigNode) throws(ConfigError) -> AdminSection {
        let section = try node.section(known: ["listen", "token", "read-token"])
        var admin = AdminSection()
        if let value = section["listen"] {
            record("admin.listen", value)
            admin.listen = try value.listenAddress()
        }
        if let value = section["token"], !value.isNull {
            let token = try value.string()
            guard ConfigValue.isValidToken(token) else {
                throw value.expected("a token of visible ASCII characters without spaces, or null")
            }
            admin.token = token
        }
        if let value = section["read-token"], !value.isNull {
            let token = try value.string()
            guard ConfigValue.isValidToken(token) else {
                throw value.expected("a token of visible ASCII characters without spaces, or null")
            }
            admin.readToken = token
        }
        return admin
    }

    private func sessions(_ node: ConfigNode) throws(ConfigError) -> SessionsSection {
        let section = try node.section(known: ["enabled", "clients", "from-proxy-user", "idle-expiry"])
        var sessions = SessionsSection()
        if let value = section["enabled"] { sessions.enabled = try value.bool() }
        if let value = section["clients"] {
            var clients: [CIDR] = []
            for item in try value.sequence("a list of CIDR blocks such as [127.0.0.0/8, \"::1/128\"]") {
                clients.append(try item.cidr())
            }
            sessions.clients = clients
        }
        if let value = section["from-proxy-user"] { sessions.fromProxyUser = try value.bool() }
        if let value = section["idle-expiry"] {
            sessions.idleExpiry = try value.duration()
        }
        return sessions
    }

    private func tags(_ node: ConfigNode) throws(ConfigError) -> TagSettings {
        let section = try node.section(known: ["forward", "save-data", "prefetch-is-discretionary", "defaults"])
        var tags = TagSettings()
        if let value = section["forward"] { tags.forward = try value.bool() }
        if let value = section["save-data"] { tags.saveData = try value.bool() }
        if let value = section["prefetch-is-discretionary"] { tags.prefetchIsDiscretionary = try value.bool() }
        if let value = section["defaults"] {
            let defaults = try value.section(known: Self.tagKeys)
            if let flag = defaults["allow-constrained"] { tags.defaults.allowConstrained = try flag.bool() }
            if let flag = defaults["allow-expensive"] { tags.defaults.allowExpensive = try flag.bool() }
            if let flag = defaults["allow-ultra-constrained"] { tags.defaults.allowUltraConstrained = try flag.bool() }
        }
        return tags
    }

    /// The request tags of SPEC §3 and §15, as `tags.defaults` and a rule's `tags` spell them.
    private static let tagKeys = ["allow-constrained", "allow-expensive", "allow-ultra-constrained"]

    private mutating func rules(_ node: ConfigNode) throws(ConfigError) -> [Rule] {
        var rules: [Rule] = []
        var firstLineOfName: [String: Int] = [:]
        for item in try node.sequence("a list of rules") {
            let section = try item.section(known: ["name", "match", "tags", "override", "hold"], what: "a rule (a mapping with name, match, tags)")
            itemLines[item.path] = item.line
            for (key, entry) in section.entries where entry.value.line != nil {
                itemLines["\(item.path).\(key)"] = entry.value.line
            }
            let nameNode = try section.required("name", "the rule's name")
            let name = try nameNode.nonEmptyString("a rule name")
            if let first = firstLineOfName[name] {
                throw nameNode.error("duplicate rule name \(quoted(name)) (first at line \(first))")
            }
            firstLineOfName[name] = nameNode.line ?? 0

            var match = RuleMatch()
            if let matchNode = section["match"] {
                let criteria = try matchNode.section(known: ["host", "path", "method", "header", "client"])
                for (key, entry) in criteria.entries where entry.value.line != nil {
                    itemLines["\(item.path).match.\(key)"] = entry.value.line
                }
                if let value = criteria["host"] { match.host = try value.nonEmptyString("a host glob such as *.video.example") }
                if let value = criteria["path"] { match.path = try value.nonEmptyString("a path glob such as *.mp4") }
                if let value = criteria["method"] {
                    let method = try value.string()
                    guard ConfigValue.isToken(method) else { throw value.expected("an HTTP method such as GET") }
                    match.method = method
                }
                if let value = criteria["header"] {
                    for (key, glob) in try value.freeMapping("a mapping of header name to value glob") {
                        let name = key.node.scalar?.string ?? ""
                        guard ConfigValue.isToken(name) else { throw key.expected("a header field name") }
                        if match.header.keys.contains(where: { $0.caseInsensitiveCompare(name) == .orderedSame }) {
                            throw key.error("header \(quoted(name)) is given twice (header names are case-insensitive)")
                        }
                        match.header[name] = try glob.string()
                    }
                }
                if let value = criteria["client"] { match.client = try value.cidr() }
            }

            let tagsNode = try section.required("tags", "the tags the rule sets (allow-constrained, allow-expensive, "
                + "allow-ultra-constrained)")
            let tagSection = try tagsNode.section(known: Self.tagKeys)
            var assignment = TagAssignment()
            if let value = tagSection["allow-constrained"] { assignment.allowConstrained = try value.bool() }
            if let value = tagSection["allow-expensive"] { assignment.allowExpensive = try value.bool() }
            if let value = tagSection["allow-ultra-constrained"] { assignment.allowUltraConstrained = try value.bool() }
            guard !assignment.isEmpty else {
                throw tagsNode.error("a rule must set at least one of allow-constrained, allow-expensive, "
                    + "allow-ultra-constrained")
            }
            var override = false
            if let value = section["override"] { override = try value.bool() }
            // SPEC §18.2: a request this rule's tags get refused is held up to this long for them to lift.
            var hold: Duration?
            if let value = section["hold"] { hold = try value.duration() }
            rules.append(Rule(name: name, match: match, tags: assignment, override: override, hold: hold))
        }
        return rules
    }

    private static let variantKeys = ["id", "match", "target", "file", "content-type", "when", "action"]

    private mutating func variants(_ node: ConfigNode) throws(ConfigError) -> [Variant] {
        var variants: [Variant] = []
        var firstLineOfID: [String: Int] = [:]
        for item in try node.sequence("a list of variants") {
            let section = try item.section(known: Self.variantKeys, what: "a variant (a mapping with id, match, target or file)")
            itemLines[item.path] = item.line
            for (key, entry) in section.entries where entry.value.line != nil {
                itemLines["\(item.path).\(key)"] = entry.value.line
            }
            let idNode = try section.required("id", "the variant's id")
            let id = try idNode.nonEmptyString("a variant id")
            guard Self.isValidVariantID(id) else {
                throw idNode.expected("an id of letters, digits, '-', '_' and '.' (it appears in /variants/{id})")
            }
            if let first = firstLineOfID[id] {
                throw idNode.error("duplicate variant id \(quoted(id)) (first at line \(first))")
            }
            firstLineOfID[id] = idNode.line ?? 0
            let match = try section.required("match", "an absolute URL pattern such as http://cdn.example/img/*.jpg")
                .nonEmptyString("an absolute URL pattern such as http://cdn.example/img/*.jpg")

            let resource: VariantResource
            switch (section["target"], section["file"]) {
            case (nil, nil):
                throw ConfigError(source: source, key: "\(item.path).target", line: item.line,
                                  message: "variant \(quoted(id)) needs a target URL or a file (exactly one)")
            case (.some, .some(let file)):
                throw ConfigError(source: source, key: "\(item.path).file", line: file.line,
                                  message: "variant \(quoted(id)) has both target and file; give exactly one")
            case (.some(let target), nil):
                if let contentType = section["content-type"] {
                    throw contentType.error("content-type applies only to a file variant (a target's response keeps its own)")
                }
                var redirect = false
                if let action = section["action"] {
                    switch try action.string() {
                    case "forward": redirect = false
                    case "redirect": redirect = true
                    default: throw action.expected("forward or redirect")
                    }
                }
                resource = .target(try target.nonEmptyString("a target URL"), redirect: redirect)
            case (nil, .some(let file)):
                if let action = section["action"] {
                    throw action.error("action applies only to a target variant (a file is always served by the proxy)")
                }
                var contentType: String?
                if let value = section["content-type"] {
                    let text = try value.string()
                    guard Self.isMediaType(text) else { throw value.expected("a media type such as image/jpeg") }
                    contentType = text
                }
                let path = try self.variantFile(file, id: id)
                resource = .file(path: path, contentType: contentType)
            }

            var when = VariantCondition.disallowed
            if let value = section["when"] {
                guard let condition = VariantCondition(rawValue: try value.string()) else {
                    throw value.expected(VariantCondition.allCases.map(\.rawValue).joined(separator: ", ").replacingLastComma(with: " or "))
                }
                when = condition
            }
            variants.append(Variant(id: id, match: match, resource: resource, when: when, source: .config))
        }
        return variants
    }

    /// The real path of a variant's file, which must be a readable regular file inside the variants directory
    /// now: a variant that would fail on its first request, or serve a file it was never meant to, is refused
    /// at load time instead.
    private func variantFile(_ node: ConfigNode, id: String) throws(ConfigError) -> String {
        let written = try node.nonEmptyString("a file path")
        switch variantFiles.resolve(written) {
        case .success(let path): return path
        case .failure(let problem): throw node.error("variant \(quoted(id)): \(problem)")
        }
    }

    /// `variants-dir`: an existing directory, relative to the config file's directory.
    private func variantsDirectory(_ node: ConfigNode) throws(ConfigError) -> String {
        let written = try node.nonEmptyString("a directory path")
        let path = ProxyConfiguration.absolutePath(written.hasPrefix("/") ? written : baseDirectory + "/" + written)
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory) else {
            throw node.error("the variants directory \(quoted(path)) does not exist")
        }
        guard isDirectory.boolValue else { throw node.error("\(quoted(path)) is not a directory") }
        return path
    }

    static func isValidVariantID(_ id: String) -> Bool {
        id.count <= 128 && id.unicodeScalars.allSatisfy { scalar in
            switch scalar {
            case "a"..."z", "A"..."Z", "0"..."9", "-", "_", ".": return true
            default: return false
            }
        } && id != "." && id != ".."
    }

    /// `type/subtype` with optional parameters, both tokens (RFC 9110 §8.3.1).
    static func isMediaType(_ text: String) -> Bool {
        let essence = text.split(separator: ";", maxSplits: 1).first.map(String.init) ?? ""
        let parts = essence.trimmingCharacters(in: " ").split(separator: "/", omittingEmptySubsequences: false)
        return parts.count == 2 && parts.allSatisfy { ConfigValue.isToken(String($0)) }
    }

    private func connect(_ node: ConfigNode) throws(ConfigError) -> ConnectSection {
        let section = try node.section(known: ["ports"])
        var connect = ConnectSection()
        if let value = section["ports"] {
            var ports: [UInt16] = []
            for item in try value.sequence("a list of ports such as [443]") {
                let port = UInt16(try item.integer(in: 1...65535, what: "a port number"))
                if !ports.contains(port) { ports.append(port) }
            }
            connect.ports = ports
        }
        return connect
    }

    private func access(_ node: ConfigNode) throws(ConfigError) -> AccessSection {
        let section = try node.section(known: ["allow", "users"])
        var access = AccessSection()
        if let value = section["allow"] {
            var allow: [CIDR] = []
            for item in try value.sequence("a list of CIDR blocks such as [127.0.0.0/8, \"::1/128\"]") {
                allow.append(try item.cidr())
            }
            access.allow = allow
        }
        if let value = section["users"] {
            var users: [String: String] = [:]
            for (key, password) in try value.freeMapping("a mapping of user name to password") {
                let name = key.node.scalar?.string ?? ""
                // RFC 7617 §2: the user-id of Basic credentials cannot contain a colon.
                guard !name.isEmpty, !name.contains(":"),
                      name.unicodeScalars.allSatisfy({ $0.value >= 0x20 && $0.value != 0x7F }) else {
                    throw key.expected("a user name without ':' or control characters")
                }
                let text = try password.string()
                guard !text.isEmpty, text.unicodeScalars.allSatisfy({ $0.value >= 0x20 && $0.value != 0x7F }) else {
                    throw password.expected("a non-empty password without control characters")
                }
                users[name] = text
            }
            access.users = users
        }
        return access
    }

    private func limits(_ node: ConfigNode) throws(ConfigError) -> HTTPLimits {
        let section = try node.section(known: ["request-line", "header-section", "header-count"])
        var limits = HTTPLimits()
        if let value = section["request-line"] { limits.requestLine = try value.size(in: 64...(1 << 20)) }
        if let value = section["header-section"] { limits.headerSection = try value.size(in: 64...(16 << 20)) }
        if let value = section["header-count"] {
            limits.headerCount = try value.integer(in: 1...10_000, what: "a number of header fields")
        }
        return limits
    }

    private func timeouts(_ node: ConfigNode) throws(ConfigError) -> TimeoutsSection {
        let section = try node.section(known: ["client-header", "client-idle", "upstream-connect", "upstream-response"])
        var timeouts = TimeoutsSection()
        if let value = section["client-header"] { timeouts.clientHeader = try value.duration() }
        if let value = section["client-idle"] { timeouts.clientIdle = try value.duration() }
        if let value = section["upstream-connect"] { timeouts.upstreamConnect = try value.duration() }
        if let value = section["upstream-response"] { timeouts.upstreamResponse = try value.duration() }
        return timeouts
    }

    private func log(_ node: ConfigNode) throws(ConfigError) -> LogSection {
        let section = try node.section(known: ["access"])
        var log = LogSection()
        if let value = section["access"] {
            switch try value.nonEmptyString("stdout, off or a file path") {
            case "stdout": log.access = .stdout
            case "off": log.access = .off
            case let path: log.access = .file(path)
            }
        }
        return log
    }

    /// `tls:` (SPEC §9). Globs are host globs as in `rules[].match.host`; a CA path is relative to the config file.
    private mutating func tls(_ node: ConfigNode) throws(ConfigError) -> TLSSection {
        let section = try node.section(known: ["intercept", "bypass", "ca", "upstream-verify"])
        var tls = TLSSection()
        if let value = section["intercept"] { tls.intercept = try hostGlobs(value) }
        if let value = section["bypass"] { tls.bypass = try hostGlobs(value) }
        if let value = section["ca"] {
            let ca = try value.section(known: ["cert", "key"])
            if let cert = ca["cert"], !cert.isNull { tls.caCertificate = try filePath(cert, "a PEM certificate path") }
            if let key = ca["key"], !key.isNull { tls.caKey = try filePath(key, "a PEM private key path") }
            if (tls.caCertificate == nil) != (tls.caKey == nil) {
                throw value.error("tls.ca needs both cert and key, or neither (then ca.pem and ca-key.pem in state-dir)")
            }
        }
        if let value = section["upstream-verify"] { tls.upstreamVerify = try value.bool() }
        return tls
    }

    /// A list of host globs: host characters (letters, digits, `-`, `.`, `_`, `:` for IPv6) and `*`; nothing else
    /// (a scheme, a port or a path is a mistake that would never match).
    private func hostGlobs(_ node: ConfigNode) throws(ConfigError) -> [Glob] {
        var globs: [Glob] = []
        for item in try node.sequence("a list of host globs such as [\"*.example.com\", cdn.example]") {
            let text = try item.nonEmptyString("a host glob such as *.example.com")
            guard text.count <= 253, text.unicodeScalars.allSatisfy({ scalar in
                switch scalar {
                case "a"..."z", "A"..."Z", "0"..."9", "-", ".", "_", ":", "*": true
                default: false
                }
            }) else {
                throw item.expected("a host glob of letters, digits, '-', '.', '_', ':' and '*' (no scheme, port or path)")
            }
            globs.append(Glob(text, caseInsensitive: true))
        }
        return globs
    }

    private func filePath(_ node: ConfigNode, _ what: String) throws(ConfigError) -> String {
        let written = try node.nonEmptyString(what)
        return ProxyConfiguration.absolutePath(written.hasPrefix("/") ? written : baseDirectory + "/" + written)
    }

    // MARK: Data budgets (SPEC §11)

    /// At most this many budgets: each request checks every one, and the engine keeps them in a 64-bit mask.
    static let maximumBudgets = 64

    private func budgets(_ node: ConfigNode) throws(ConfigError) -> [Budget] {
        var budgets: [Budget] = []
        var firstLineOfName: [String: Int] = [:]
        for item in try node.sequence("a list of budgets") {
            let section = try item.section(known: ["name", "bytes", "period", "match", "then", "hard"],
                                           what: "a budget (a mapping with name, bytes, period, then)")
            let nameNode = try section.required("name", "the budget's name")
            let name = try nameNode.nonEmptyString("a budget name")
            guard Self.isValidVariantID(name) else {
                throw nameNode.expected("a name of letters, digits, '-', '_' and '.' (it appears in /budgets/{name})")
            }
            if let first = firstLineOfName[name] {
                throw nameNode.error("duplicate budget name \(quoted(name)) (first at line \(first))")
            }
            firstLineOfName[name] = nameNode.line ?? 0
            let bytesNode = try section.required("bytes", "the allowance, such as 5GB")
            guard case .scalar(let scalar) = bytesNode.node, !bytesNode.isNull,
                  let bytes = ConfigValue.byteCount(scalar.string), bytes > 0 else {
                throw bytesNode.expected("a positive size such as 5GB, 500MB or 2GiB")
            }
            let periodNode = try section.required("period", "hour, day or month")
            guard let period = BudgetPeriod(rawValue: try periodNode.string()) else { throw periodNode.expected("hour, day or month") }
            var match = BudgetMatch()
            if let matchNode = section["match"], !matchNode.isNull {
                let criteria = try matchNode.section(known: ["client", "host"])
                if let value = criteria["client"] { match.client = try value.cidr() }
                if let value = criteria["host"] {
                    match.host = Glob(try value.nonEmptyString("a host glob such as *.video.example"), caseInsensitive: true)
                }
            }
            let thenNode = try section.required("then", "a condition or mode name, or reject")
            guard let then = BudgetAction(try thenNode.string()) else {
                throw thenNode.expected("a condition or mode name (constrained, expensive, ultra-constrained, "
                    + "constrained-expensive, ...) or reject")
            }
            var hard = false
            if let value = section["hard"] { hard = try value.bool() }
            budgets.append(Budget(name: name, bytes: bytes, period: period, match: match, then: then, hard: hard))
        }
        guard budgets.count <= Self.maximumBudgets else {
            throw node.error("at most \(Self.maximumBudgets) budgets, got \(budgets.count)")
        }
        return budgets
    }

    // MARK: Link conditions (SPEC §10)

    private static let profileKeys = ["down", "up", "latency", "jitter"]

    private func link(profiles: ConfigNode?, conditions: ConfigNode?, scope: ConfigNode?) throws(ConfigError) -> LinkSection {
        var link = LinkSection()
        if let profiles, !profiles.isNull {
            for (key, value) in try profiles.freeMapping("a mapping of profile name to {down, up, latency, jitter}") {
                let name = key.node.scalar?.string ?? ""
                guard Self.isValidVariantID(name) else {
                    throw key.expected("a profile name of letters, digits, '-', '_' and '.'")
                }
                let fields = try value.section(known: Self.profileKeys, what: "a profile (a mapping with down, up, latency, jitter)")
                // A file profile named like a built-in overrides it; the fields it leaves out keep the built-in's.
                var profile = link.profiles[name] ?? LinkProfile(name: name, down: 0, up: 0, latency: .zero)
                if let rate = fields["down"] { profile.down = try rate.rate() }
                if let rate = fields["up"] { profile.up = try rate.rate() }
                if let latency = fields["latency"] { profile.latency = try latency.latency() }
                if let jitter = fields["jitter"] { profile.jitter = try jitter.latency() }
                guard profile.down > 0 else { throw value.error("profile \(quoted(name)) needs a down rate such as 2Mbit") }
                guard profile.up > 0 else { throw value.error("profile \(quoted(name)) needs an up rate such as 256kbit") }
                if profile.jitter > profile.latency, let jitter = fields["jitter"] {
                    throw jitter.error("jitter (\(profile.jitter)) is larger than the latency (\(profile.latency)): "
                        + "an added latency cannot be negative")
                }
                link.profiles[name] = profile
            }
        }
        if let conditions, !conditions.isNull {
            let section = try conditions.section(known: ["constrained", "expensive", "ultra-constrained"])
            func profile(_ key: String) throws(ConfigError) -> String? {
                guard let node = section[key], !node.isNull else { return nil }
                let fields = try node.section(known: ["profile"], what: "a mapping {profile: NAME}")
                guard let value = fields["profile"], !value.isNull else { return nil }
                let name = try value.nonEmptyString("a profile name")
                guard link.profiles[name] != nil else {
                    throw value.error("unknown profile \(quoted(name)); known: \(link.profileNames.joined(separator: ", "))")
                }
                return name
            }
            link.conditions = ConditionProfiles(constrained: try profile("constrained"), expensive: try profile("expensive"),
                                                ultraConstrained: try profile("ultra-constrained"))
        }
        if let scope, !scope.isNull {
            guard let value = ShapingScope(rawValue: try scope.string()) else { throw scope.expected("client or link") }
            link.scope = value
        }
        return link
    }

    // MARK: Policy

    /// Compiles rules and variants exactly as the engine will, so a pattern, target or capture reference
    /// the policy refuses is reported here, at load time, with the item's key and line. The result is kept in the
    /// configuration: a `ConfigurationSnapshot` of it without API variants uses it as is.
    private func compilePolicy(_ configuration: ProxyConfiguration) throws(ConfigError) -> PolicySnapshot {
        do {
            return try PolicySnapshot(tags: configuration.tags, rules: configuration.rules, variants: configuration.variants)
        } catch {
            throw PolicyErrorPlacement(source: source, lines: itemLines)
                .place(error, rules: configuration.rules, variants: configuration.variants)
        }
    }
}

/// Maps a `PolicyError` back to the rule or variant it is about.
struct PolicyErrorPlacement {
    let source: String
    /// `variants[1]`, `variants[1].target`, `rules[0]` … to line.
    let lines: [String: Int]

    func place(_ error: PolicyError, rules: [Rule], variants: [Variant]) -> ConfigError {
        let item: String?
        if let index = variants.firstIndex(where: { error.subject == "variant \(quoted($0.id))" || error.subject == "variant \($0.id)" }) {
            item = "variants[\(index)]"
        } else if let index = rules.firstIndex(where: { error.subject == "rule \(quoted($0.name))" || error.subject == "rule \($0.name)" }) {
            item = "rules[\(index)]"
        } else {
            item = nil
        }
        guard let item else {
            return ConfigError(source: source, key: "", message: error.description)
        }
        // Policy messages start with the field they are about: `target "…" refers to $3 …`, `match.host …`.
        var key = item
        let field = error.message.prefix { $0 != " " }
        if lines["\(item).\(field)"] != nil {
            key = "\(item).\(field)"
        } else if item.hasPrefix("variants"), error.message.contains("$"), lines["\(item).target"] != nil {
            key = "\(item).target"
        }
        return ConfigError(source: source, key: key, line: lines[key] ?? lines[item], message: error.description)
    }
}

private extension String {
    /// `a, b, c` -> `a, b or c`.
    func replacingLastComma(with separator: String) -> String {
        guard let range = range(of: ", ", options: .backwards) else { return self }
        return replacingCharacters(in: range, with: separator)
    }
}
