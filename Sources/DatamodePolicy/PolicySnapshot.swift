/// The compiled, immutable policy: tag settings, rules and variants, validated and indexed once per
/// configuration load (or admin API change) and then shared read-only by every worker.
///
/// Compiling moves every cost that does not depend on the request out of the hot path: globs are split into
/// literal segments, header names lowercased, content types guessed, target templates parsed, and both rules
/// and variants indexed (see `PolicyIndex`) so that a request against 1,000 rules and 10,000 variants costs a few
/// hash lookups and short lists, not a scan.
public struct PolicySnapshot: Sendable {
    public let tagSettings: TagSettings
    /// The rules in configuration order.
    public let rules: [Rule]
    /// The variants in definition order: config variants first, then API variants (SPEC §5 "first in order").
    public let variants: [Variant]
    /// The compiled form; a class so passing a snapshot around copies one reference.
    let index: PolicyIndex

    public init(tags: TagSettings, rules: [Rule], variants: [Variant]) throws(PolicyError) {
        let ordered = variants.filter { $0.source == .config } + variants.filter { $0.source != .config }
        self.tagSettings = tags
        self.rules = rules
        self.variants = ordered
        self.index = try PolicyIndex(rules: rules, variants: ordered)
    }

    /// No rules, no variants, default tag settings: every request is forwarded with its own or default tags.
    public static let empty: PolicySnapshot = {
        do {
            return try PolicySnapshot(tags: TagSettings(), rules: [], variants: [])
        } catch {
            fatalError("the empty policy cannot fail to compile: \(error)")
        }
    }()

    /// The same policy with the API variants replaced by `api` (each marked `source: .api`); config variants
    /// are kept, first. Used by `PUT`/`DELETE /variants/{id}`.
    public func replacingAPIVariants(_ api: [Variant]) throws(PolicyError) -> PolicySnapshot {
        let config = variants.filter { $0.source == .config }
        let marked = api.map { variant -> Variant in
            var variant = variant
            variant.source = .api
            return variant
        }
        return try PolicySnapshot(tags: tagSettings, rules: rules, variants: config + marked)
    }

    /// The variant with this id, if any.
    public func variant(id: String) -> Variant? {
        variants.first { $0.id == id }
    }

    /// The content type guessed from a file name's extension (`image/jpeg` for `.jpg`, `application/octet-stream`
    /// when unknown): what a file variant without `content-type` is served with.
    public static func guessedContentType(forFile path: String) -> String {
        PolicyIndex.guessContentType(path: path)
    }

    /// The content type a variant is served with: the configured one, else the one guessed from the file
    /// extension; `nil` for a target variant.
    public func contentType(ofVariant id: String) -> String? {
        guard let i = variants.firstIndex(where: { $0.id == id }) else { return nil }
        if case .file(_, let contentType) = index.variants[i].resource { return contentType }
        return nil
    }
}

// MARK: - Compiled form

/// One `match.header` entry of a rule.
struct HeaderCriterion: Sendable {
    /// Lowercased field name.
    let name: [UInt8]
    /// Case-insensitive glob on the field value (OWS trimmed).
    let value: Glob
}

/// A rule with its globs compiled.
struct CompiledRule: Sendable {
    let host: Glob?
    let path: Glob?
    let method: String?
    let headers: [HeaderCriterion]
    let client: CIDR?
    let allowConstrained: Bool?
    let allowExpensive: Bool?
    let allowUltraConstrained: Bool?
    let override: Bool
}

/// The part of a rule the hot loop reads: plain integers, so scanning rules costs no reference counting.
struct RuleEntry: Sendable {
    /// Index in `PolicyIndex.ruleGlobs`, or -1.
    var hostGlob: Int32
    var pathGlob: Int32
    /// The rule also has a method, client or header criterion (read from `CompiledRule`).
    var hasOtherCriteria: Bool
    var override: Bool
    /// -1 unset, 0 false, 1 true.
    var constrained: Int8
    var expensive: Int8
    var ultraConstrained: Int8
}

/// A piece of a target template: literal text or capture `$N` (stored 0-based).
enum TargetPart: Sendable, Hashable {
    case literal(String)
    case capture(Int)
}

enum CompiledResource: Sendable {
    case target([TargetPart], redirect: Bool)
    case file(path: String, contentType: String)
}

struct CompiledVariant: Sendable {
    let id: String
    /// The normalized `match` pattern, case-sensitive.
    let glob: Glob
    let resource: CompiledResource
    /// The `WhenMask` bit of its `when`.
    let whenBit: UInt8
}

/// Bits for "which `when` values apply in this situation".
enum WhenMask {
    static let disallowed: UInt8 = 1
    static let constrained: UInt8 = 2
    static let expensive: UInt8 = 4
    static let always: UInt8 = 8
    static let ultraConstrained: UInt8 = 16

    static func bit(_ condition: VariantCondition) -> UInt8 {
        switch condition {
        case .disallowed: disallowed
        case .constrained: constrained
        case .expensive: expensive
        case .ultraConstrained: ultraConstrained
        case .always: always
        }
    }
}

/// A dictionary from string keys (looked up by `Substring` slices of the request, without allocating) to
/// ascending entry numbers, plus which key lengths exist, so a request tries only slices of those lengths.
struct SliceIndex: Sendable {
    private(set) var buckets: [Substring: [Int32]] = [:]
    /// `hasLength[n]`: some key is `n` bytes long.
    private(set) var hasLength: [Bool] = []

    var isEmpty: Bool { buckets.isEmpty }

    /// The distinct key lengths, ascending.
    private(set) var lengths: [Int] = []

    mutating func insert(_ key: Substring, _ entry: Int32) {
        buckets[key, default: []].append(entry)
        let n = key.utf8.count
        if hasLength.count <= n { hasLength += [Bool](repeating: false, count: n + 1 - hasLength.count) }
        if !hasLength[n] {
            hasLength[n] = true
            lengths.insert(n, at: lengths.firstIndex(where: { $0 > n }) ?? lengths.endIndex)
        }
    }

    /// One more than the longest key (0 when empty).
    var maxLength: Int { hasLength.count }

    @inline(__always)
    func mayHave(length n: Int) -> Bool { n < hasLength.count && hasLength[n] }

    @inline(__always)
    subscript(key: Substring) -> [Int32]? { buckets[key] }
}

/// The compiled policy. Indexes, so a request costs a few hash lookups and short lists, whatever the policy size:
///
/// - Rules: a literal host goes into a host dictionary; a host glob whose text after its last `*` contains a dot
///   (`*.video.example`) is keyed by that dotted suffix (`.video.example`), found by trying each dot-suffix of
///   the request host; the rest (no host, or `*`-only hosts) are in a list.
/// - Variants: exact patterns in a URL dictionary; globs with a literal authority keyed by their literal prefix up
///   to its last `/` (`http://cdn.example/img/` for `http://cdn.example/img/*.jpg`), found by trying each `/`-prefix
///   of the request URL; globs with a wildcard authority keyed by a dotted suffix like rules; a glob whose literal
///   tail (after its last `*`) is rarer than that key is keyed by the tail instead, found by trying the URL's
///   suffixes of each tail length; the rest in a list.
///
/// Every bucket keeps definition order, and each bucket yields its first hit; the smallest index over all
/// buckets wins, which is exactly "first in order" over the whole policy.
final class PolicyIndex: Sendable {
    let rules: [CompiledRule]
    /// The lowercased field names the rules' `headers` criteria match on, each once.
    let headerCriterionNames: [[UInt8]]
    let ruleEntries: [RuleEntry]
    /// Host and path globs of all rules, case-insensitive.
    let ruleGlobs: GlobTable
    /// Rules whose host criterion is literal, by that host.
    let rulesByHost: [String: [Int32]]
    /// Rules whose host glob ends in a literal dotted suffix, by the suffix from its first dot.
    let rulesByHostSuffix: SliceIndex
    /// Rules without a host criterion whose path glob starts with a literal directory (`/video/` for
    /// `/video/*`), by that lowercased prefix up to its last `/`; found by trying each `/`-prefix of the path.
    let rulesByPathPrefix: SliceIndex
    /// Rules without a host criterion and no literal path directory, or whose host glob has no dotted suffix.
    let otherRules: [Int32]
    /// Whether any override rule sets each tag (if none, a header settles that tag without looking further).
    let overrideSetsConstrained: Bool
    let overrideSetsExpensive: Bool
    let overrideSetsUltraConstrained: Bool
    /// Whether any plain (non-override) rule sets `allow-ultra-constrained` (see `RuleScan.plainSetsU`).
    let plainSetsUltraConstrained: Bool

    let variants: [CompiledVariant]
    let variantWhen: [UInt8]
    /// The `match` globs of all variants, case-sensitive, numbered like `variants`.
    let variantGlobs: GlobTable
    /// Variants whose pattern has no `*`, by the exact URL.
    let exactVariants: [String: [Int32]]
    /// Glob variants with a literal authority, by their literal prefix up to its last `/`.
    let variantsByDirectory: SliceIndex
    /// Glob variants with a `*` in the authority and a dotted literal suffix, by that suffix of the authority.
    let variantsByAuthoritySuffix: SliceIndex
    /// Glob variants by the literal text after their last `*` (`-123.mp4`), when that bucket is the smaller one.
    let variantsByTail: SliceIndex
    /// The other glob variants.
    let otherVariants: [Int32]
    /// The union of the `when` bits of all variants: a request none of them can apply to skips the lookups.
    let whenBits: UInt8

    init(rules: [Rule], variants: [Variant]) throws(PolicyError) {
        var compiledRules: [CompiledRule] = []
        compiledRules.reserveCapacity(rules.count)
        var entries: [RuleEntry] = []
        entries.reserveCapacity(rules.count)
        var ruleGlobs = GlobTable(caseInsensitive: true)
        var byHost: [String: [Int32]] = [:]
        var bySuffix = SliceIndex()
        var byPathPrefix = SliceIndex()
        var other: [Int32] = []
        var overrideC = false, overrideE = false, overrideU = false, plainU = false
        for (i, rule) in rules.enumerated() {
            let compiled = try PolicyIndex.compile(rule, position: i + 1)
            let n = Int32(i)
            if let host = compiled.host {
                if host.isLiteral {
                    byHost[host.pattern, default: []].append(n)
                } else if let suffix = PolicyIndex.dottedSuffix(ofGlob: host.pattern[...]) {
                    bySuffix.insert(suffix, n)
                } else {
                    other.append(n)
                }
            } else if let path = compiled.path, let prefix = PolicyIndex.directoryPrefix(ofGlob: path.pattern[...]) {
                byPathPrefix.insert(prefix, n)
            } else {
                other.append(n)
            }
            if compiled.override {
                overrideC = overrideC || compiled.allowConstrained != nil
                overrideE = overrideE || compiled.allowExpensive != nil
                overrideU = overrideU || compiled.allowUltraConstrained != nil
            } else {
                plainU = plainU || compiled.allowUltraConstrained != nil
            }
            func tri(_ b: Bool?) -> Int8 { b.map { $0 ? 1 : 0 } ?? -1 }
            entries.append(RuleEntry(
                hostGlob: compiled.host.map { ruleGlobs.append($0) } ?? -1,
                pathGlob: compiled.path.map { ruleGlobs.append($0) } ?? -1,
                hasOtherCriteria: compiled.method != nil || compiled.client != nil || !compiled.headers.isEmpty,
                override: compiled.override,
                constrained: tri(compiled.allowConstrained), expensive: tri(compiled.allowExpensive),
                ultraConstrained: tri(compiled.allowUltraConstrained)))
            compiledRules.append(compiled)
        }
        self.rules = compiledRules
        var criterionNames: [[UInt8]] = []
        for rule in compiledRules {
            for criterion in rule.headers where !criterionNames.contains(criterion.name) { criterionNames.append(criterion.name) }
        }
        self.headerCriterionNames = criterionNames
        self.ruleEntries = entries
        self.ruleGlobs = ruleGlobs
        self.rulesByHost = byHost
        self.rulesByHostSuffix = bySuffix
        self.rulesByPathPrefix = byPathPrefix
        self.otherRules = other
        self.overrideSetsConstrained = overrideC
        self.overrideSetsExpensive = overrideE
        self.overrideSetsUltraConstrained = overrideU
        self.plainSetsUltraConstrained = plainU

        var compiledVariants: [CompiledVariant] = []
        compiledVariants.reserveCapacity(variants.count)
        var when: [UInt8] = []
        when.reserveCapacity(variants.count)
        var variantGlobs = GlobTable(caseInsensitive: false)
        var seen: Set<String> = []
        var exact: [String: [Int32]] = [:]
        var byDirectory = SliceIndex()
        var byAuthoritySuffix = SliceIndex()
        var byTail = SliceIndex()
        var otherVariants: [Int32] = []
        var bits: UInt8 = 0
        // Each glob can be found by up to two keys: its directory (literal authority) or dotted authority suffix
        // (wildcard authority), and its literal tail. It goes into the bucket that is smaller, so that even
        // 10,000 globs in one directory (`http://cdn.example/v/*-123.mp4`) do not make one long list.
        var globKeys: [(n: Int32, host: Substring?, hostIsDirectory: Bool, tail: Substring?)] = []
        var hostKeyCount: [Substring: Int] = [:]
        var tailKeyCount: [Substring: Int] = [:]
        for (i, variant) in variants.enumerated() {
            let subject = "variant \"\(variant.id)\""
            guard seen.insert(variant.id).inserted else {
                throw PolicyError(subject: subject, message: "id is used by more than one variant"
                    + (variant.source == .api ? " (a config variant cannot be replaced through the API)" : ""))
            }
            let (compiled, authorityLength) = try PolicyIndex.compile(variant, subject: subject)
            let n = Int32(i)
            let pattern = compiled.glob.pattern
            if compiled.glob.isLiteral {
                exact[pattern, default: []].append(n)
            } else {
                var hostKey: Substring? = nil
                if authorityLength != nil {
                    // The literal prefix always reaches past the authority's `/` (normalization puts one there).
                    let prefix = compiled.glob.literalPrefix
                    let slash = prefix.utf8.lastIndex(of: UInt8(ascii: "/"))!
                    hostKey = pattern[...slash]
                } else {
                    hostKey = PolicyIndex.dottedSuffix(ofGlob: PolicyIndex.authority(ofPattern: pattern))
                }
                let star = pattern.utf8.lastIndex(of: UInt8(ascii: "*"))!
                let tail = pattern[pattern.utf8.index(after: star)...]
                let tailKey: Substring? = tail.isEmpty ? nil : tail
                if let hostKey { hostKeyCount[hostKey, default: 0] += 1 }
                if let tailKey { tailKeyCount[tailKey, default: 0] += 1 }
                globKeys.append((n, hostKey, authorityLength != nil, tailKey))
            }
            let glob = variantGlobs.append(compiled.glob)
            assert(glob == n)
            bits |= compiled.whenBit
            when.append(compiled.whenBit)
            compiledVariants.append(compiled)
        }
        for key in globKeys {
            let hostCount = key.host.map { hostKeyCount[$0]! } ?? Int.max
            let tailCount = key.tail.map { tailKeyCount[$0]! } ?? Int.max
            if let host = key.host, hostCount <= tailCount {
                if key.hostIsDirectory { byDirectory.insert(host, key.n) } else { byAuthoritySuffix.insert(host, key.n) }
            } else if let tail = key.tail {
                byTail.insert(tail, key.n)
            } else {
                otherVariants.append(key.n)
            }
        }
        self.variants = compiledVariants
        self.variantWhen = when
        self.variantGlobs = variantGlobs
        self.exactVariants = exact
        self.variantsByDirectory = byDirectory
        self.variantsByAuthoritySuffix = byAuthoritySuffix
        self.variantsByTail = byTail
        self.otherVariants = otherVariants
        self.whenBits = bits
    }

    /// For a host glob (or a pattern's authority) with a `*`: the literal text after the last `*`, from its first
    /// dot (`*.video.example` -> `.video.example`, `cdn*.example:8080` -> `.example:8080`). Any text the glob
    /// matches ends with it, and it starts at a dot, so it is one of the dot-suffixes of that text. `nil` when the
    /// tail has no dot (`*`, `*:8080`, `*.example.*`).
    /// The literal text of a path glob up to the last `/` before its first `*` (`/video/` for `/video/*.mp4`,
    /// `/a/b/` for the literal `/a/b/c`); nil when the pattern does not start with a literal `/…/`.
    static func directoryPrefix(ofGlob glob: Substring) -> Substring? {
        let utf8 = glob.utf8
        guard utf8.first == UInt8(ascii: "/") else { return nil }
        let literalEnd = utf8.firstIndex(of: UInt8(ascii: "*")) ?? utf8.endIndex
        guard let slash = utf8[..<literalEnd].lastIndex(of: UInt8(ascii: "/")) else { return nil }
        return glob[...slash]
    }

    static func dottedSuffix(ofGlob glob: Substring) -> Substring? {
        guard let star = glob.utf8.lastIndex(of: UInt8(ascii: "*")) else { return nil }
        let tail = glob[glob.utf8.index(after: star)...]
        guard let dot = tail.utf8.firstIndex(of: UInt8(ascii: ".")) else { return nil }
        return tail[dot...]
    }

    /// The authority of a normalized `scheme://authority/...` pattern.
    static func authority(ofPattern pattern: String) -> Substring {
        let utf8 = pattern.utf8
        guard let separator = pattern.firstRange(of: "://") else { return "" }
        let start = separator.upperBound
        let end = utf8[start...].firstIndex(where: { $0 == UInt8(ascii: "/") || $0 == UInt8(ascii: "?")
            || $0 == UInt8(ascii: "#") }) ?? utf8.endIndex
        return pattern[start..<end]
    }

    // MARK: Rules

    static func compile(_ rule: Rule, position: Int) throws(PolicyError) -> CompiledRule {
        let subject = rule.name.isEmpty ? "rule #\(position)" : "rule \"\(rule.name)\""
        func fail(_ message: String) -> PolicyError { PolicyError(subject: subject, message: message) }
        guard !rule.name.isEmpty else { throw fail("name must not be empty") }
        guard !rule.tags.isEmpty else {
            throw fail("sets neither allow-constrained nor allow-expensive nor allow-ultra-constrained, "
                + "so it would have no effect")
        }
        var host: Glob? = nil
        if var text = rule.match.host {
            if text.hasPrefix("[") && text.hasSuffix("]") && text.count >= 2 {
                text = String(text.dropFirst().dropLast())   // an IPv6 literal: hosts are compared without brackets
            }
            guard !text.isEmpty else { throw fail("match.host must not be empty (omit it to match every host)") }
            guard !containsSpaceOrControl(text) else {
                throw fail("match.host \(JSONText.quote(text)) contains a space or control character")
            }
            host = Glob(text, caseInsensitive: true)
        }
        var path: Glob? = nil
        if let text = rule.match.path {
            guard !text.isEmpty else { throw fail("match.path must not be empty (omit it to match every path)") }
            guard !containsSpaceOrControl(text) else {
                throw fail("match.path \(JSONText.quote(text)) contains a space or control character")
            }
            path = Glob(text, caseInsensitive: true)
        }
        if let method = rule.match.method {
            guard !method.isEmpty, method.utf8.allSatisfy(isTokenChar) else {
                throw fail("match.method \(JSONText.quote(method)) is not an HTTP method (RFC 9110 token)")
            }
        }
        var headers: [HeaderCriterion] = []
        for (name, value) in rule.match.header.sorted(by: { $0.key < $1.key }) {
            guard !name.isEmpty, name.utf8.allSatisfy(isTokenChar) else {
                throw fail("match.header name \(JSONText.quote(name)) is not an HTTP field name")
            }
            guard !value.utf8.contains(where: { $0 < 0x20 && $0 != 0x09 || $0 == 0x7f }) else {
                throw fail("match.header \(JSONText.quote(name)) value contains a control character")
            }
            headers.append(HeaderCriterion(name: Array(Glob.asciiLowercased(name).utf8),
                                           value: Glob(value, caseInsensitive: true)))
        }
        return CompiledRule(host: host, path: path, method: rule.match.method, headers: headers,
                            client: rule.match.client, allowConstrained: rule.tags.allowConstrained,
                            allowExpensive: rule.tags.allowExpensive,
                            allowUltraConstrained: rule.tags.allowUltraConstrained, override: rule.override)
    }

    // MARK: Variants

    /// Compiles a variant; also returns the UTF-8 length of its literal `scheme://authority` prefix, or nil
    /// when the authority has a `*`.
    static func compile(_ variant: Variant, subject: String) throws(PolicyError) -> (CompiledVariant, Int?) {
        func fail(_ message: String) -> PolicyError { PolicyError(subject: subject, message: message) }
        guard !variant.id.isEmpty else { throw fail("id must not be empty") }
        guard variant.id.utf8.allSatisfy(Variant.isIDCharacter) else {
            throw fail("id may contain only letters, digits, '.', '_' and '-'")
        }
        let normalized: (pattern: String, authorityLength: Int?)
        switch normalizeURLPattern(variant.match) {
        case .success(let n): normalized = n
        case .failure(let problem): throw fail("match \(JSONText.quote(variant.match)) \(problem.text)")
        }
        let glob = Glob(normalized.pattern, caseInsensitive: false)
        let resource: CompiledResource
        switch variant.resource {
        case .target(let template, let redirect):
            if case .failure(let problem) = checkAbsoluteURL(template) {
                throw fail("target \(JSONText.quote(template)) \(problem.text)")
            }
            let parts = try parseTemplate(template, captures: glob.starCount, fail: fail)
            resource = .target(parts, redirect: redirect)
        case .file(let path, let contentType):
            guard !path.isEmpty else { throw fail("file path must not be empty") }
            guard !path.utf8.contains(0) else { throw fail("file path contains a NUL byte") }
            let type: String
            if let contentType {
                guard !contentType.allSatisfy({ $0 == " " || $0 == "\t" }) else {
                    throw fail("content-type must not be empty (omit it to guess from the file extension)")
                }
                // It becomes a response header: CR/LF in it would let a variant inject header fields.
                guard !contentType.utf8.contains(where: { $0 < 0x20 && $0 != 0x09 || $0 == 0x7f }) else {
                    throw fail("content-type \(JSONText.quote(contentType)) contains a control character")
                }
                type = contentType
            } else {
                type = guessContentType(path: path)
            }
            resource = .file(path: path, contentType: type)
        }
        let compiled = CompiledVariant(id: variant.id, glob: glob, resource: resource,
                                       whenBit: WhenMask.bit(variant.when))
        return (compiled, normalized.authorityLength)
    }

    struct PatternProblem: Error { let text: String }

    /// Checks a variant `match` and normalizes it the way the engine normalizes request URLs (lowercase scheme and
    /// host, default port omitted, an empty path written `/`), so that an exact pattern is a plain string lookup.
    /// Returns the pattern and the length of its literal `scheme://authority` (nil if the authority has a `*`).
    static func normalizeURLPattern(_ text: String) -> Result<(pattern: String, authorityLength: Int?), PatternProblem> {
        let parts: (scheme: String, authority: Substring, rest: Substring)
        switch splitAbsoluteURL(text) {
        case .success(let p): parts = p
        case .failure(let problem): return .failure(problem)
        }
        let schemeText = parts.scheme
        var authority = Glob.asciiLowercased(String(parts.authority))
        let authorityIsLiteral = !authority.contains("*")
        var rest = String(parts.rest)
        if authorityIsLiteral {
            let defaultPort = schemeText == "http" ? ":80" : ":443"
            if authority.hasSuffix(defaultPort) {
                authority.removeLast(defaultPort.count)
                if authority.isEmpty || authority.hasSuffix(":") && !authority.hasPrefix("[") {
                    return .failure(PatternProblem(text: "has an empty host"))
                }
            }
            if rest.isEmpty || rest.hasPrefix("?") || rest.hasPrefix("#") { rest = "/" + rest }
        }
        let prefix = schemeText + "://" + authority
        return .success((prefix + rest, authorityIsLiteral ? prefix.utf8.count : nil))
    }

    static func checkAbsoluteURL(_ text: String) -> Result<Void, PatternProblem> {
        splitAbsoluteURL(text).map { _ in () }
    }

    /// `scheme://authority rest` where the scheme is http or https (any case) and the authority is non-empty.
    static func splitAbsoluteURL(_ text: String) -> Result<(scheme: String, authority: Substring, rest: Substring), PatternProblem> {
        guard !containsSpaceOrControl(text) else {
            return .failure(PatternProblem(text: "contains a space or control character"))
        }
        guard let separator = text.firstRange(of: "://") else {
            return .failure(PatternProblem(text: "must be an absolute http:// or https:// URL"))
        }
        let scheme = Glob.asciiLowercased(String(text[..<separator.lowerBound]))
        guard scheme == "http" || scheme == "https" else {
            return .failure(PatternProblem(text: "must be an absolute http:// or https:// URL"))
        }
        let afterScheme = text[separator.upperBound...]
        let authorityEnd = afterScheme.firstIndex(where: { $0 == "/" || $0 == "?" || $0 == "#" }) ?? afterScheme.endIndex
        let authority = afterScheme[..<authorityEnd]
        guard !authority.isEmpty else { return .failure(PatternProblem(text: "has an empty host")) }
        return .success((scheme, authority, afterScheme[authorityEnd...]))
    }

    /// Splits a target template into literals and `$1`…`$9` references, checking each against the number of
    /// captures. A `$` not followed by a digit is literal.
    static func parseTemplate(_ template: String, captures: Int,
                              fail: (String) -> PolicyError) throws(PolicyError) -> [TargetPart] {
        var parts: [TargetPart] = []
        var literal = ""
        var iterator = template.unicodeScalars.makeIterator()
        var pending = iterator.next()
        while let scalar = pending {
            pending = iterator.next()
            guard scalar == "$", let next = pending, next.value >= 0x30, next.value <= 0x39 else {
                literal.unicodeScalars.append(scalar)
                continue
            }
            let n = Int(next.value - 0x30)
            if n == 0 {
                throw fail("target refers to $0; captures are numbered from $1")
            }
            if n > captures {
                let have = captures == 0 ? "match has no *" : "match has only \(captures) * (capture\(captures == 1 ? "" : "s"))"
                throw fail("target refers to $\(n) but \(have)")
            }
            if !literal.isEmpty { parts.append(.literal(literal)); literal = "" }
            parts.append(.capture(n - 1))
            pending = iterator.next()
        }
        if !literal.isEmpty { parts.append(.literal(literal)) }
        return parts
    }

    /// The content type for a file variant without a configured one, from its extension.
    static func guessContentType(path: String) -> String {
        let name = path.split(separator: "/", omittingEmptySubsequences: false).last ?? ""
        guard let dot = name.lastIndex(of: ".") else { return "application/octet-stream" }
        switch Glob.asciiLowercased(String(name[name.index(after: dot)...])) {
        case "jpg", "jpeg": return "image/jpeg"
        case "png": return "image/png"
        case "gif": return "image/gif"
        case "webp": return "image/webp"
        case "avif": return "image/avif"
        case "svg": return "image/svg+xml"
        case "mp4", "m4v": return "video/mp4"
        case "webm": return "video/webm"
        case "m3u8": return "application/vnd.apple.mpegurl"
        case "mp3": return "audio/mpeg"
        case "json": return "application/json"
        case "txt": return "text/plain; charset=utf-8"
        case "html", "htm": return "text/html; charset=utf-8"
        case "css": return "text/css; charset=utf-8"
        case "js", "mjs": return "text/javascript"
        default: return "application/octet-stream"
        }
    }

    static func containsSpaceOrControl(_ s: String) -> Bool {
        s.utf8.contains { $0 <= 0x20 || $0 == 0x7f }
    }

    /// RFC 9110 §5.6.2 tchar.
    static func isTokenChar(_ b: UInt8) -> Bool {
        switch b {
        case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
             UInt8(ascii: "0")...UInt8(ascii: "9"):
            return true
        default:
            return "!#$%&'*+-.^_`|~".utf8.contains(b)
        }
    }
}
