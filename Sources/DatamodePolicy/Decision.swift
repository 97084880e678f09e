/// What the engine must do with a request (SPEC §4). The policy only decides; the engine carries it out.
public enum Decision: Sendable, Equatable {
    /// Forward upstream with these tags written on the request (SPEC §3 "On the forwarded request").
    case forward(RequestTags)
    /// Serve a registered variant instead of the requested URL (SPEC §5).
    case serveVariant(RequestTags, VariantRewrite)
    /// Answer `403` with the rejection's problem document; nothing is sent upstream.
    case reject(RequestTags, Rejection)
    /// The client's own `Allow-*` header is malformed or contradicts itself: `400 invalid-tag`.
    /// The string is the problem `detail` (which header, what value).
    case invalidTag(String)

    /// The resolved tags, when the request got that far.
    public var tags: RequestTags? {
        switch self {
        case .forward(let tags), .serveVariant(let tags, _), .reject(let tags, _): tags
        case .invalidTag: nil
        }
    }
}

/// The variant chosen for a request and what serving it means.
public struct VariantRewrite: Sendable, Hashable {
    /// The variant id, sent back as `Data-Mode-Variant`.
    public var id: String
    public enum Action: Sendable, Hashable {
        /// Forward the request to this URL instead (captures substituted) and stream its response back.
        case fetch(url: String)
        /// Answer `307` with this `Location`.
        case redirect(location: String)
        /// Answer from a local file (`GET`/`HEAD`).
        case file(path: String, contentType: String)
    }
    public var action: Action

    public init(id: String, action: Action) {
        self.id = id
        self.action = action
    }
}

/// Why a request is refused (SPEC §4, §15).
public struct Rejection: Sendable, Hashable {
    /// The violated conditions, in the order constrained, expensive, ultra-constrained.
    public var reasons: [DataCondition]
    /// The first violated condition in that order (SPEC §15): `.constrained`, else `.expensive`, else
    /// `.ultraConstrained`.
    public var code: ProxyErrorCode

    public init(reasons: [DataCondition]) {
        self.reasons = reasons
        self.code = reasons.contains(.constrained) ? .constrained
            : reasons.contains(.expensive) ? .expensive : .ultraConstrained
    }

    /// The header `Network-Unavailable-Reason` value, the twin of `URLError.networkUnavailableReason`.
    public var networkUnavailableReason: String { code.rawValue }

    /// The `403` problem document: the SPEC §4 members `type`, `title`, `status`, `error`, a `detail`,
    /// then `reasons`, `mode` and `url`.
    public func problem(mode: DataMode, url: String) -> ProblemDetail {
        let detail: String
        switch (reasons.contains(.constrained), reasons.contains(.expensive), reasons.contains(.ultraConstrained)) {
        case (true, true, false):
            detail = "The network is constrained and expensive, and this request allows neither."
        case (true, false, false):
            detail = "The network is constrained (Low Data Mode) and this request does not allow constrained access."
        case (false, true, false), (false, false, false):
            detail = "The network is expensive and this request does not allow expensive access."
        case (false, false, true):
            detail = "The network is ultra-constrained (a satellite-class link) and this request has not opted in "
                + "to ultra-constrained access (Allow-Ultra-Constrained: ?1)."
        case (true, false, true):
            detail = "The network is constrained and ultra-constrained, and this request allows neither."
        case (false, true, true):
            detail = "The network is expensive and ultra-constrained, and this request allows neither."
        case (true, true, true):
            detail = "The network is constrained, expensive and ultra-constrained, and this request allows none of them."
        }
        return ProblemDetail(code: code, detail: detail, extra: [
            ("reasons", JSONText.array(reasons.map(\.rawValue))),
            ("mode", JSONText.quote(mode.name)),
            ("url", JSONText.quote(url)),
        ])
    }

    /// `problem(mode:url:).json` as bytes, made without building the document: everything before `url` depends
    /// only on the violated conditions and the mode, so it is written once per pair (a quarter of the requests in
    /// the policy row of bench/run are refused, and building each document showed in its profile).
    public func problemBody(mode: DataMode, url: String) -> [UInt8] {
        let prefix = Self.prefixes[Self.conditionBits(reasons) * 8 + mode.index]
        var out: [UInt8] = []
        out.reserveCapacity(prefix.count + url.utf8.count + 10)
        out.append(contentsOf: prefix)
        out.append(contentsOf: ",\"url\":".utf8)
        if JSONText.needsEscape(url) {
            out.append(contentsOf: JSONText.quote(url).utf8)
        } else {
            out.append(UInt8(ascii: "\""))
            out.append(contentsOf: url.utf8)
            out.append(UInt8(ascii: "\""))
        }
        out.append(UInt8(ascii: "}"))
        return out
    }

    static func conditionBits(_ reasons: [DataCondition]) -> Int {
        reasons.reduce(0) { bits, reason in
            bits | (reason == .constrained ? 1 : reason == .expensive ? 2 : 4)
        }
    }

    /// By condition bits × 8 + `DataMode.index`: the document up to (not including) `,"url":…}`.
    static let prefixes: [[UInt8]] = (0..<64).map { index in
        let bits = index / 8
        let reasons = DataCondition.allCases.enumerated().filter { bits & (1 << $0.offset) != 0 }.map(\.element)
        var problem = Rejection(reasons: reasons).problem(mode: DataMode.all[index % 8], url: "")
        problem.extra.removeLast()
        return Array(problem.json.utf8.dropLast())
    }
}

/// The client's `Allow-Constrained` / `Allow-Expensive` / `Allow-Ultra-Constrained` header is invalid
/// (SPEC §3, §15: `400 invalid-tag`).
public struct InvalidTagError: Error, Sendable, Hashable, CustomStringConvertible {
    /// Names the header and the offending value(s); becomes the problem `detail`.
    public var detail: String
    public init(detail: String) { self.detail = detail }
    public var description: String { detail }
    public var problem: ProblemDetail { ProblemDetail(code: .invalidTag, detail: detail) }
}

/// Decides what to do with one request head under `mode` (SPEC §3–5, §15). Pure and allocation-light:
/// it reads the facts and the compiled policy and returns a value.
public func decide(_ request: RequestFacts, mode: DataMode, policy: PolicySnapshot) -> Decision {
    var provenance = TagProvenance()
    return decide(request, mode: mode, policy: policy, provenance: &provenance)
}

/// `decide`, also saying where each tag came from (see `PolicySnapshot.ruleName(for:provenance:)`).
public func decide(_ request: RequestFacts, mode: DataMode, policy: PolicySnapshot,
                   provenance: inout TagProvenance) -> Decision {
    let tags: RequestTags
    switch resolveTags(request, policy: policy, provenance: &provenance) {
    case .success(let resolved): tags = resolved
    case .failure(let error): return .invalidTag(error.detail)
    }
    let violatesConstrained = mode.constrained && !tags.allowConstrained
    let violatesExpensive = mode.expensive && !tags.allowExpensive
    let violatesUltraConstrained = mode.ultraConstrained && !tags.allowUltraConstrained
    let violated = violatesConstrained || violatesExpensive || violatesUltraConstrained
    if let rewrite = policy.index.variantRewrite(for: request, mode: mode, violated: violated) {
        return .serveVariant(tags, rewrite)
    }
    guard violated else { return .forward(tags) }
    var reasons: [DataCondition] = []
    if violatesConstrained { reasons.append(.constrained) }
    if violatesExpensive { reasons.append(.expensive) }
    if violatesUltraConstrained { reasons.append(.ultraConstrained) }
    return .reject(tags, Rejection(reasons: reasons))
}

extension PolicySnapshot {
    /// Whether deciding about a request reads its field `name` (any case): the client's `Allow-*` tags and prefetch
    /// markers (`classifyFieldName`) and the fields some rule's `headers` criterion matches on. `decide` reads no
    /// other field, so `RequestFacts.fields` need hold only these: the engine copied every field of every request
    /// into the facts (an array, two retains a field and its release, ~1.2K instructions a plain request, callgrind).
    public func readsField(_ name: String) -> Bool {
        if classifyFieldName(name) != .none { return true }
        let names = index.headerCriterionNames
        guard !names.isEmpty else { return false }
        let utf8 = name.utf8
        return names.contains { criterion in
            criterion.count == utf8.count && zip(utf8, criterion).allSatisfy { asciiLower($0) == $1 }
        }
    }

    /// The name of the rule behind a decision's tags, for the access log (SPEC §8): for a rejection, the rule that
    /// set the first violated tag (constrained, then expensive, then ultra-constrained: the rejection's `error`);
    /// otherwise the rule that set `allow-constrained`, else the one that set `allow-expensive`, else the one that
    /// set `allow-ultra-constrained`; nil when no rule set the tag in question. A copy of the stored name (no
    /// allocation), taken with the decision so a later reload cannot change what it refers to.
    public func ruleName(for decision: Decision, provenance: TagProvenance) -> String? {
        switch decision {
        case .invalidTag:
            return nil
        case .reject(_, let rejection):
            switch rejection.reasons.first {
            case .expensive?: return name(of: provenance.expensive)
            case .ultraConstrained?: return name(of: provenance.ultraConstrained)
            case .constrained?, nil: return name(of: provenance.constrained)
            }
        case .forward, .serveVariant:
            return name(of: provenance.constrained) ?? name(of: provenance.expensive)
                ?? name(of: provenance.ultraConstrained)
        }
    }

    private func name(of source: TagSource) -> String? {
        guard case .rule(let index) = source, rules.indices.contains(index) else { return nil }
        return rules[index].name
    }
}
