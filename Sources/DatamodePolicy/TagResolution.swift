/// Resolving a request's `allow-constrained`, `allow-expensive` and `allow-ultra-constrained` tags (SPEC §3, §15).
///
/// Each tag is resolved on its own, first source that has an opinion wins:
/// 1. the first matching rule with `override: true` that sets the tag;
/// 2. the client's own `Allow-Constrained` / `Allow-Expensive` / `Allow-Ultra-Constrained` header;
/// 3. the first matching plain rule that sets the tag;
/// 4. a prefetch is discretionary: false (unless `tags.prefetch-is-discretionary: false`);
/// 5. the configured default (for `allow-ultra-constrained`, false unless configured: it is opt-in).
///
/// The client's headers are validated even when an override rule decides the tag: a malformed or
/// self-contradicting `Allow-*` is a client bug that must surface as `400 invalid-tag` whatever the
/// configuration, so a client behaves the same behind every proxy configuration.
public func resolveTags(_ request: RequestFacts, policy: PolicySnapshot) -> Result<RequestTags, InvalidTagError> {
    var provenance = TagProvenance()
    return resolveTags(request, policy: policy, provenance: &provenance)
}

/// `resolveTags`, also saying where each tag's value came from (for the access log, SPEC §8). Same cost: the
/// provenance is three small enum values the resolution knows anyway.
public func resolveTags(_ request: RequestFacts, policy: PolicySnapshot,
                        provenance: inout TagProvenance) -> Result<RequestTags, InvalidTagError> {
    var client = ClientTagFields()
    if let error = client.scan(request.fields) { return .failure(error) }

    var resolution = RuleResolution()
    let index = policy.index
    if !index.rules.isEmpty {
        index.applyRules(to: request, client: client, into: &resolution)
    }
    let settings = policy.tagSettings
    let prefetch = client.prefetch && settings.prefetchIsDiscretionary
    let allowConstrained = resolution.overrideConstrained ?? client.constrained ?? resolution.ruleConstrained
        ?? (prefetch ? false : settings.defaults.allowConstrained)
    let allowExpensive = resolution.overrideExpensive ?? client.expensive ?? resolution.ruleExpensive
        ?? (prefetch ? false : settings.defaults.allowExpensive)
    let allowUltraConstrained = resolution.overrideUltraConstrained ?? client.ultraConstrained
        ?? resolution.ruleUltraConstrained ?? (prefetch ? false : settings.defaults.allowUltraConstrained)
    provenance = TagProvenance(
        constrained: TagSource(override: resolution.overrideConstrained != nil ? resolution.overrideConstrainedRule : -1,
                               header: client.constrained != nil,
                               rule: resolution.ruleConstrained != nil ? resolution.ruleConstrainedRule : -1,
                               prefetch: prefetch),
        expensive: TagSource(override: resolution.overrideExpensive != nil ? resolution.overrideExpensiveRule : -1,
                             header: client.expensive != nil,
                             rule: resolution.ruleExpensive != nil ? resolution.ruleExpensiveRule : -1,
                             prefetch: prefetch),
        ultraConstrained: TagSource(
            override: resolution.overrideUltraConstrained != nil ? resolution.overrideUltraConstrainedRule : -1,
            header: client.ultraConstrained != nil,
            rule: resolution.ruleUltraConstrained != nil ? resolution.ruleUltraConstrainedRule : -1,
            prefetch: prefetch))
    return .success(RequestTags(allowConstrained: allowConstrained, allowExpensive: allowExpensive,
                                allowUltraConstrained: allowUltraConstrained))
}

// MARK: - Client header fields

/// What the client's own header fields say: its `Allow-*` tags and whether it marked a prefetch.
struct ClientTagFields {
    var constrained: Bool? = nil
    var expensive: Bool? = nil
    var ultraConstrained: Bool? = nil
    /// `Sec-Purpose` with the token `prefetch` (Fetch spec; Chrome sends `prefetch` or
    /// `prefetch;anonymous-client-ip`), the legacy `Purpose: prefetch`, or Firefox's `X-Moz: prefetch`.
    var prefetch = false

    /// One pass over the fields; the only allocation is the error message on an invalid tag.
    mutating func scan(_ fields: [(name: String, value: String)]) -> InvalidTagError? {
        for field in fields {
            switch classifyFieldName(field.name) {
            case .none:
                continue
            case .allowConstrained:
                if let error = ClientTagFields.merge(field.value, into: &constrained, header: "Allow-Constrained") {
                    return error
                }
            case .allowExpensive:
                if let error = ClientTagFields.merge(field.value, into: &expensive, header: "Allow-Expensive") {
                    return error
                }
            case .allowUltraConstrained:
                if let error = ClientTagFields.merge(field.value, into: &ultraConstrained,
                                                     header: "Allow-Ultra-Constrained") {
                    return error
                }
            case .prefetchMarker:
                if !prefetch && containsPrefetchToken(field.value) { prefetch = true }
            }
        }
        return nil
    }

    /// Merges every list member of one field value into `current`. A comma list in one field counts as that many
    /// copies (RFC 9110 §5.3); copies must agree, since a tag that says both yes and no cannot be honoured.
    static func merge(_ value: String, into current: inout Bool?, header: String) -> InvalidTagError? {
        var value = value
        return value.withUTF8 { bytes -> InvalidTagError? in
            var start = 0
            while true {
                var end = start
                while end < bytes.count && bytes[end] != UInt8(ascii: ",") { end += 1 }
                let member = trimOWS(bytes, start, end)
                guard let parsed = parseBoolean(member) else {
                    let text = String(decoding: member, as: UTF8.self)
                    return InvalidTagError(detail: "\(header): \(JSONText.quote(text)) is not a boolean; "
                        + "expected ?1 or ?0 (RFC 8941), or true/false, 1/0")
                }
                if let existing = current, existing != parsed {
                    return InvalidTagError(detail: "\(header): conflicting values ?1 and ?0 in the request")
                }
                current = parsed
                if end == bytes.count { return nil }
                start = end + 1
            }
        }
    }

    /// RFC 8941 §3.3.6 booleans `?1` / `?0`, and the common spellings `true`/`false`/`1`/`0` (any case).
    static func parseBoolean(_ b: UnsafeBufferPointer<UInt8>) -> Bool? {
        switch b.count {
        case 1:
            if b[0] == UInt8(ascii: "1") { return true }
            if b[0] == UInt8(ascii: "0") { return false }
        case 2:
            guard b[0] == UInt8(ascii: "?") else { return nil }
            if b[1] == UInt8(ascii: "1") { return true }
            if b[1] == UInt8(ascii: "0") { return false }
        case 4:
            if equalsLowercase(b, "true") { return true }
        case 5:
            if equalsLowercase(b, "false") { return false }
        default:
            break
        }
        return nil
    }
}

enum TagFieldKind {
    case none, allowConstrained, allowExpensive, allowUltraConstrained, prefetchMarker
}

/// Field names are case-insensitive (RFC 9110 §5.1); checked by length first so most fields cost one compare.
@inline(__always)
func classifyFieldName(_ name: String) -> TagFieldKind {
    let utf8 = name.utf8
    switch utf8.count {
    case 23: return equalsLowercase(utf8, "allow-ultra-constrained") ? .allowUltraConstrained : .none
    case 17: return equalsLowercase(utf8, "allow-constrained") ? .allowConstrained : .none
    case 15: return equalsLowercase(utf8, "allow-expensive") ? .allowExpensive : .none
    case 11: return equalsLowercase(utf8, "sec-purpose") ? .prefetchMarker : .none
    case 7: return equalsLowercase(utf8, "purpose") ? .prefetchMarker : .none
    case 5: return equalsLowercase(utf8, "x-moz") ? .prefetchMarker : .none
    default: return .none
    }
}

/// Whether the value has `prefetch` as one of its tokens (case-insensitive), tokens being runs of RFC 9110
/// tchar: `prefetch`, `prefetch;anonymous-client-ip`, `Prefetch` all count; `prefetched` or `noprefetch` don't.
func containsPrefetchToken(_ value: String) -> Bool {
    var value = value
    return value.withUTF8 { bytes in
        var i = 0
        while i < bytes.count {
            guard PolicyIndex.isTokenChar(bytes[i]) else { i += 1; continue }
            var j = i
            while j < bytes.count && PolicyIndex.isTokenChar(bytes[j]) { j += 1 }
            if j - i == 8 && equalsLowercase(UnsafeBufferPointer(rebasing: bytes[i..<j]), "prefetch") { return true }
            i = j
        }
        return false
    }
}

@inline(__always)
func asciiLower(_ b: UInt8) -> UInt8 { b &- UInt8(ascii: "A") < 26 ? b | 0x20 : b }

/// `bytes` equals the lowercase ASCII `lower`, ignoring ASCII case. The caller checked nothing about lengths.
@inline(__always)
func equalsLowercase<C: Collection>(_ bytes: C, _ lower: StaticString) -> Bool where C.Element == UInt8 {
    lower.withUTF8Buffer { expected in
        guard bytes.count == expected.count else { return false }
        var i = 0
        for b in bytes {
            if asciiLower(b) != expected[i] { return false }
            i += 1
        }
        return true
    }
}

/// `bytes[start..<end]` without leading and trailing SP / HTAB (RFC 9110 §5.6.3 OWS).
@inline(__always)
func trimOWS(_ bytes: UnsafeBufferPointer<UInt8>, _ start: Int, _ end: Int) -> UnsafeBufferPointer<UInt8> {
    var s = start, e = end
    while s < e && (bytes[s] == 0x20 || bytes[s] == 0x09) { s += 1 }
    while e > s && (bytes[e - 1] == 0x20 || bytes[e - 1] == 0x09) { e -= 1 }
    return UnsafeBufferPointer(rebasing: bytes[s..<e])
}

// MARK: - Rules

/// The tags found by rules: `override` ones beat the client's header, plain ones don't.
struct RuleResolution {
    var overrideConstrained: Bool? = nil
    var overrideExpensive: Bool? = nil
    var ruleConstrained: Bool? = nil
    var ruleExpensive: Bool? = nil
    var overrideUltraConstrained: Bool? = nil
    var ruleUltraConstrained: Bool? = nil
    /// The index in `PolicySnapshot.rules` of the rule behind each value above (-1: none).
    var overrideConstrainedRule: Int32 = -1
    var overrideExpensiveRule: Int32 = -1
    var ruleConstrainedRule: Int32 = -1
    var ruleExpensiveRule: Int32 = -1
    var overrideUltraConstrainedRule: Int32 = -1
    var ruleUltraConstrainedRule: Int32 = -1
}

/// Where a resolved tag's value came from (SPEC §3), so that an access log line can say why a request was
/// refused (SPEC §8: "the resolved tags with the rule that set them").
public enum TagSource: Sendable, Hashable {
    /// The client's own `Allow-Constrained` / `Allow-Expensive` / `Allow-Ultra-Constrained` header.
    case header
    /// The rule at this index of `PolicySnapshot.rules` (an `override` rule, or a plain one).
    case rule(Int)
    /// A prefetch marker made the request discretionary.
    case prefetch
    /// `tags.defaults`.
    case defaults

    /// The log's word for it: `header`, `rule`, `prefetch` or `default`.
    public var name: String {
        switch self {
        case .header: "header"
        case .rule: "rule"
        case .prefetch: "prefetch"
        case .defaults: "default"
        }
    }

    /// In the order of `resolveTags`: override rule, header, plain rule, prefetch, default.
    init(override: Int32, header: Bool, rule: Int32, prefetch: Bool) {
        if override >= 0 { self = .rule(Int(override)) }
        else if header { self = .header }
        else if rule >= 0 { self = .rule(Int(rule)) }
        else if prefetch { self = .prefetch }
        else { self = .defaults }
    }
}

/// Where each of a request's tags came from.
public struct TagProvenance: Sendable, Hashable {
    public var constrained: TagSource
    public var expensive: TagSource
    public var ultraConstrained: TagSource
    public init(constrained: TagSource = .defaults, expensive: TagSource = .defaults,
                ultraConstrained: TagSource = .defaults) {
        self.constrained = constrained
        self.expensive = expensive
        self.ultraConstrained = ultraConstrained
    }
}

/// The search for the first matching rule per slot (override/plain × constrained/expensive/ultra-constrained). Rules come from
/// several buckets, each in definition order; a slot keeps the smallest index that matched, so the result is
/// "first in configuration order" without merging the buckets.
struct RuleScan {
    static let none = Int32.max
    var overrideC = RuleScan.none, overrideE = RuleScan.none, plainC = RuleScan.none, plainE = RuleScan.none
    var overrideCValue = false, overrideEValue = false, plainCValue = false, plainEValue = false
    var overrideU = RuleScan.none, plainU = RuleScan.none
    var overrideUValue = false, plainUValue = false
    /// The client sent that tag: plain rules cannot change it.
    let clientSetsC: Bool
    let clientSetsE: Bool
    let clientSetsU: Bool
    /// Some override rule sets that tag.
    let overridesC: Bool
    let overridesE: Bool
    let overridesU: Bool
    /// Some plain rule sets `allow-ultra-constrained`. Most policies have none: without this, an empty
    /// ultra-constrained slot would keep every scan going to the last candidate rule.
    let plainSetsU: Bool
    /// No rule index at or above this can change the outcome.
    private(set) var limit: Int32 = -1

    init(client: ClientTagFields, overridesC: Bool, overridesE: Bool, overridesU: Bool, plainSetsU: Bool) {
        clientSetsC = client.constrained != nil
        clientSetsE = client.expensive != nil
        clientSetsU = client.ultraConstrained != nil
        self.overridesC = overridesC
        self.overridesE = overridesE
        self.overridesU = overridesU
        self.plainSetsU = plainSetsU
        updateLimit()
    }

    mutating func updateLimit() {
        var l: Int32 = -1
        if overridesC { l = max(l, overrideC) }
        if overridesE { l = max(l, overrideE) }
        if !clientSetsC && overrideC == RuleScan.none { l = max(l, plainC) }
        if !clientSetsE && overrideE == RuleScan.none { l = max(l, plainE) }
        if overridesU { l = max(l, overrideU) }
        if plainSetsU && !clientSetsU && overrideU == RuleScan.none { l = max(l, plainU) }
        limit = l
    }

    /// Whether rule `i` could still fill or improve a slot.
    @inline(__always)
    func wanted(_ i: Int32, _ e: RuleEntry) -> Bool {
        if e.override {
            return e.constrained >= 0 && i < overrideC || e.expensive >= 0 && i < overrideE
                || e.ultraConstrained >= 0 && i < overrideU
        }
        return e.constrained >= 0 && !clientSetsC && overrideC == RuleScan.none && i < plainC
            || e.expensive >= 0 && !clientSetsE && overrideE == RuleScan.none && i < plainE
            || e.ultraConstrained >= 0 && !clientSetsU && overrideU == RuleScan.none && i < plainU
    }

    mutating func record(_ i: Int32, _ e: RuleEntry) {
        if e.override {
            if e.constrained >= 0 && i < overrideC { overrideC = i; overrideCValue = e.constrained == 1 }
            if e.expensive >= 0 && i < overrideE { overrideE = i; overrideEValue = e.expensive == 1 }
            if e.ultraConstrained >= 0 && i < overrideU { overrideU = i; overrideUValue = e.ultraConstrained == 1 }
        } else {
            if e.constrained >= 0 && i < plainC { plainC = i; plainCValue = e.constrained == 1 }
            if e.expensive >= 0 && i < plainE { plainE = i; plainEValue = e.expensive == 1 }
            if e.ultraConstrained >= 0 && i < plainU { plainU = i; plainUValue = e.ultraConstrained == 1 }
        }
        updateLimit()
    }

    var resolution: RuleResolution {
        RuleResolution(overrideConstrained: overrideC == RuleScan.none ? nil : overrideCValue,
                       overrideExpensive: overrideE == RuleScan.none ? nil : overrideEValue,
                       ruleConstrained: plainC == RuleScan.none ? nil : plainCValue,
                       ruleExpensive: plainE == RuleScan.none ? nil : plainEValue,
                       overrideUltraConstrained: overrideU == RuleScan.none ? nil : overrideUValue,
                       ruleUltraConstrained: plainU == RuleScan.none ? nil : plainUValue,
                       overrideConstrainedRule: overrideC == RuleScan.none ? -1 : overrideC,
                       overrideExpensiveRule: overrideE == RuleScan.none ? -1 : overrideE,
                       ruleConstrainedRule: plainC == RuleScan.none ? -1 : plainC,
                       ruleExpensiveRule: plainE == RuleScan.none ? -1 : plainE,
                       overrideUltraConstrainedRule: overrideU == RuleScan.none ? -1 : overrideU,
                       ruleUltraConstrainedRule: plainU == RuleScan.none ? -1 : plainU)
    }
}

/// What one rule scan reads, gathered so the scan loop is a plain method without captured mutable state
/// (captured `var`s would cost a dynamic exclusivity check per access).
struct RuleScanInput {
    let index: PolicyIndex
    let request: RequestFacts
    let entries: UnsafeBufferPointer<RuleEntry>
    let globs: GlobTable.View
    let host: UnsafeBufferPointer<UInt8>
    /// The path without the query.
    let path: UnsafeBufferPointer<UInt8>
}

extension RuleScan {
    /// Tries the rules of one bucket (ascending), stopping once no later rule can change the outcome.
    mutating func run(_ list: [Int32], _ input: RuleScanInput) {
        for i in list {
            if i >= limit { return }
            let e = input.entries[Int(i)]
            guard wanted(i, e) else { continue }
            if e.hostGlob >= 0 && !input.globs.matches(e.hostGlob, input.host) { continue }
            if e.pathGlob >= 0 {
                // A CONNECT has no path: only host-level rules apply to a tunnel (SPEC §6).
                if input.request.isConnect || !input.globs.matches(e.pathGlob, input.path) { continue }
            }
            if e.hasOtherCriteria && !input.index.otherCriteriaHold(input.index.rules[Int(i)], input.request) {
                continue
            }
            record(i, e)
        }
    }
}

extension PolicyIndex {
    /// Tries the rules that can match this host: its literal-host bucket, the buckets of its dot-suffixes, and
    /// the list of other rules, skipping every rule that could no longer change a tag.
    func applyRules(to request: RequestFacts, client: ClientTagFields, into r: inout RuleResolution) {
        let initial = RuleScan(client: client, overridesC: overrideSetsConstrained, overridesE: overrideSetsExpensive,
                               overridesU: overrideSetsUltraConstrained, plainSetsU: plainSetsUltraConstrained)
        if initial.limit < 0 { return }
        let hostText = request.host
        var host = request.host
        var path = request.path
        r = host.withUTF8 { hostBytes in
            path.withUTF8 { pathBytes in
                // Rules match the path without the query (SPEC §8).
                var pathEnd = 0
                while pathEnd < pathBytes.count && pathBytes[pathEnd] != UInt8(ascii: "?") { pathEnd += 1 }
                let pathOnly = UnsafeBufferPointer(rebasing: pathBytes[0..<pathEnd])
                return ruleGlobs.withView { globs in
                    ruleEntries.withUnsafeBufferPointer { entries in
                        let input = RuleScanInput(index: self, request: request, entries: entries, globs: globs,
                                                  host: hostBytes, path: pathOnly)
                        var scan = initial
                        if !rulesByHost.isEmpty, let list = rulesByHost[hostText] { scan.run(list, input) }
                        if !rulesByHostSuffix.isEmpty {
                            let utf8 = hostText.utf8
                            var p = 0
                            while p < hostBytes.count && scan.limit >= 0 {
                                if hostBytes[p] == UInt8(ascii: "."), rulesByHostSuffix.mayHave(length: hostBytes.count - p),
                                   let list = rulesByHostSuffix[hostText[utf8.index(utf8.startIndex, offsetBy: p)...]] {
                                    scan.run(list, input)
                                }
                                p += 1
                            }
                        }
                        if !rulesByPathPrefix.isEmpty && !request.isConnect {
                            // Keys are lowercased (rule paths are case-insensitive): look up the folded path.
                            let folded = Glob.asciiLowercased(String(decoding: pathOnly, as: UTF8.self))
                            let utf8 = folded.utf8
                            var p = 0
                            for byte in utf8 {
                                p += 1
                                guard scan.limit >= 0 else { break }
                                if byte == UInt8(ascii: "/"), rulesByPathPrefix.mayHave(length: p),
                                   let list = rulesByPathPrefix[folded[..<utf8.index(utf8.startIndex, offsetBy: p)]] {
                                    scan.run(list, input)
                                }
                            }
                        }
                        scan.run(otherRules, input)
                        return scan.resolution
                    }
                }
            }
        }
    }

    /// The method, client and header criteria; every present one must hold (SPEC §8).
    func otherCriteriaHold(_ rule: CompiledRule, _ request: RequestFacts) -> Bool {
        if let method = rule.method, method != request.method { return false }
        if let block = rule.client {
            guard let address = request.client, block.contains(address) else { return false }
        }
        for criterion in rule.headers where !PolicyIndex.someField(of: request, matches: criterion) {
            return false
        }
        return true
    }

    private static func someField(of request: RequestFacts, matches criterion: HeaderCriterion) -> Bool {
        for field in request.fields {
            guard field.name.utf8.count == criterion.name.count,
                  zip(field.name.utf8, criterion.name).allSatisfy({ asciiLower($0) == $1 }) else { continue }
            var value = field.value
            let matched = value.withUTF8 { bytes in
                criterion.value.matches(trimOWS(bytes, 0, bytes.count))
            }
            if matched { return true }
        }
        return false
    }
}
