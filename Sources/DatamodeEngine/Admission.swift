import DatamodeConfig
import DatamodeHTTP
import DatamodePolicy
import DatamodeState

/// Where a request came from. The source decides how its target is read and who its user is; everything after
/// admission is the same for every source (SPEC §6, §9; SPEC §16's transparent capture and §17's HTTP/2 streams
/// will be further cases).
enum RequestSource: Equatable {
    /// The proxy port: absolute-form requests and CONNECT; credentials in `Proxy-Authorization`.
    case forwardProxy
    /// Inside an intercepted tunnel: origin-form requests (or absolute `https://` ones) for the tunnel's origin.
    /// The client authenticated on its CONNECT; the requests inside carry no credentials, and that user stands
    /// for them.
    case intercepted(InterceptedOrigin)
    /// The transparent listener (SPEC §16): the client does not know a proxy is there, and sends no credentials.
    case transparent(TransparentRequests)
}

/// What a transparent connection carries, as admission reads its heads (SPEC §16).
enum TransparentRequests: Equatable {
    /// Origin-form HTTP/1.x requests: each is `http://<Host><path>`.
    case http
    /// A TLS ClientHello: one implicit CONNECT to its SNI name (else the address), intercepted or relayed blind.
    case tls
    /// Neither: one implicit CONNECT to the address, relayed blind (never intercepted).
    case other
}

/// The origin an intercepted tunnel was opened to, as a value: what admission needs of an `InterceptedTunnel`.
struct InterceptedOrigin: Equatable {
    /// Lowercased host (IPv6 without brackets) and port of the CONNECT.
    var host: String
    var port: UInt16
    /// `Host` as an absolute URL spells it: host, `:port` unless 443; IPv6 in brackets.
    var authority: String
    /// The user the CONNECT authenticated as, if any.
    var proxyUser: String?

    init(host: String, port: UInt16, proxyUser: String? = nil) {
        let bracketed = host.contains(":") ? "[\(host)]" : host
        self.init(host: host, port: port, authority: port == 443 ? bracketed : "\(bracketed):\(port)", proxyUser: proxyUser)
    }

    init(host: String, port: UInt16, authority: String, proxyUser: String?) {
        self.host = host
        self.port = port
        self.authority = authority
        self.proxyUser = proxyUser
    }
}

/// What the spent budgets matching a request do to it (SPEC §11).
struct BudgetJudgement: Equatable {
    /// Bit i: the request counts against budget i of the ledger.
    var mask: UInt64 = 0
    /// The mode with the conditions of every spent matching budget joined.
    var mode: DataMode
    /// The first spent budget that added a condition.
    var joinedBy: String?
    /// A spent budget with `then: reject`, if any.
    var rejectedBy: Int?
}

/// What the budgets look like to admission: which exist, and which are spent now. `BudgetLedger` is the real
/// one; a table test passes its own.
protocol BudgetView {
    var budgets: [Budget] { get }
    func isSpent(_ index: Int, now: Int64) -> Bool
    /// The end of budget `index`'s current period, wall-clock seconds (when a spent one lifts, SPEC §18.1).
    func periodEnd(_ index: Int) -> Int64
}

extension BudgetLedger: BudgetView {
    func periodEnd(_ index: Int) -> Int64 { period(index).end }
}

/// The decision about one request head, made before any byte of it moves: refuse it, open a tunnel, intercept
/// it, forward it or serve a variant (with room for SPEC §18's hold and store). A pure function of the head, its
/// source, the client, the settings, the budgets and the time: `admit` touches no socket, no buffer and no
/// clock of its own, so every rule of SPEC §6–§12 that decides a request is table-tested without sockets
/// (`AdmissionTests`); the exchange driver carries the verdict out.
///
/// The order is the order of the checks a proxy owes: framing first (an ambiguous body must never be answered on
/// a kept-alive connection, RFC 9112 §6.3: request smuggling), then Host, access, authentication, the target, a
/// loop, sessions, budgets, and the data-mode policy.
struct Admission {
    enum Verdict {
        /// Answer now with the proxy's own problem; `close`: the connection cannot carry another request.
        case refuse(ProxyErrorCode, detail: String?, close: Bool, fields: [(String, String)] = [])
        /// Refused by the data-mode policy (403 `constrained`, …); `budget`: the spent budget whose condition
        /// caused it, named in the problem (SPEC §11).
        case reject(Rejection, budget: String?)
        /// A spent budget with `then: reject` matches (403 `budget-exhausted`); its index in the ledger.
        case budgetExhausted(Int)
        /// A CONNECT to a host the proxy intercepts: answered by the proxy, its TLS terminated (SPEC §9).
        case intercept(RequestTarget)
        /// A CONNECT relayed blind.
        case tunnel(RequestTarget)
        /// Forward the request to its target.
        case forward(RequestTarget, RequestTags)
        /// Serve a registered variant instead (SPEC §7).
        case serveVariant(RequestTarget, RequestTags, VariantRewrite)
    }

    var verdict: Verdict
    /// The request body's framing; nil when it was ambiguous (the verdict then refuses and closes).
    var framing: BodyFraming?
    /// The client connection may carry another request after this one (before the response has its say).
    var keepAlive: Bool
    /// The options of the request's `Connection` fields, read once here for the exchange too.
    var connectionTokens: ConnectionOptions
    /// The request's absolute URL, once its target was understood.
    var url: String?
    /// The user the request authenticated as (its CONNECT's, inside an intercepted tunnel).
    var proxyUser: String?
    /// The session the request belongs to (SPEC §12).
    var session: SessionMembership?
    /// The mode the request was judged by (a session's, with spent budgets' conditions), once known.
    var mode: DataMode?
    /// Which budgets the request counts against (bit i: budget i), whatever the verdict.
    var budgetMask: UInt64 = 0
    /// The resolved tags, where they set them, and the rule that did.
    var tags: RequestTags?
    var tagSources = TagProvenance()
    var rule: String?
    /// For a refusal by the data mode or a budget (`reject`, `budgetExhausted`): when its conditions lift, if a
    /// known event lifts them (SPEC §18.1); nil otherwise.
    var lift: RefusalLift?
    /// For a refusal by the data mode: the `hold` of the rule behind the refused tag (SPEC §18.2), if it has one.
    var ruleHold: Duration?

    /// The proxy's own refusal becomes the verdict (`judge` returns right after).
    mutating func refuse(_ code: ProxyErrorCode, _ detail: String?, close: Bool, fields: [(String, String)] = []) {
        verdict = .refuse(code, detail: detail, close: close, fields: fields)
    }

    /// Refused by the data mode or a budget (`reject`, `budgetExhausted`): what a hold waits to see lifted.
    var isRefusedByPolicy: Bool {
        switch verdict {
        case .reject, .budgetExhausted: true
        default: false
        }
    }

    /// Decides about `head`. `client`/`clientText`: the peer's address and how the log spells it; `intercepts`:
    /// whether a CONNECT to the target would be intercepted (the host is listed and interception is set up);
    /// `now`: wall-clock seconds, for budget periods; `nowNanoseconds`: the same moment to the nanosecond, for
    /// when a refusal lifts (`now` seconds when not given).
    static func admit(_ head: RequestHead, source: RequestSource, client: IPAddress?, clientText: String,
                      settings: WorkerSettings, budgets: some BudgetView, intercepts: (String) -> Bool,
                      now: Int64, nowNanoseconds: Int64? = nil) -> Admission {
        let tokens = head.connectionTokens
        // A client that half-closed still gets every request it sent before answered (pipelining, SPEC §6).
        let keepAlive = head.version == .http11 ? !tokens.contains("close") : tokens.contains("keep-alive")
        var admission = Admission(verdict: .refuse(.badRequest, detail: nil, close: true), keepAlive: keepAlive,
                                  connectionTokens: tokens)
        judge(&admission, head, source: source, client: client, clientText: clientText, settings: settings,
              budgets: budgets, intercepts: intercepts, now: now, wallNow: nowNanoseconds ?? now * 1_000_000_000)
        return admission
    }

    /// `admit`'s checks, in order, each writing its part of `admission` and the first refusal ending them. Apart from
    /// `admit` so that the decision is made in place: with a return at every refusal, the ~400-byte admission was
    /// copied out, and the local destroyed, on every request (~900 instructions a plain exchange, callgrind).
    private static func judge(_ admission: inout Admission, _ head: RequestHead, source: RequestSource,
                              client: IPAddress?, clientText: String, settings: WorkerSettings, budgets: some BudgetView,
                              intercepts: (String) -> Bool, now: Int64, wallNow: Int64) {
        switch head.bodyFraming() {
        case .success(let framing): admission.framing = framing
        case .failure(let error):
            return admission.refuse(error.clientErrorCode, error.detail, close: true)
        }
        if head.count(of: "host") > 1 {
            return admission.refuse(.badRequest, "more than one Host header field (RFC 9112 §3.2)", close: true)
        }
        guard let client, settings.allow.contains(where: { $0.contains(client) }) else {
            return admission.refuse(.accessDenied, "client \(clientText) is not in access.allow", close: true)
        }
        switch source {
        case .intercepted(let origin):
            admission.proxyUser = origin.proxyUser
        case .forwardProxy where !settings.users.isEmpty:
            guard let user = ProxyAuthorization.user(head.values(of: "proxy-authorization"), users: settings.users) else {
                return admission.refuse(.proxyAuthRequired, nil, close: false,
                                        fields: [("Proxy-Authenticate", "Basic realm=\"datamode-proxy\", charset=\"UTF-8\"")])
            }
            admission.proxyUser = user
        case .forwardProxy, .transparent:
            break
        }
        var target: RequestTarget
        switch RequestTarget.parse(head.target, method: head.method) {
        case .success(let parsed): target = parsed
        case .failure(let error):
            return admission.refuse(error.clientErrorCode, error.detail, close: true)
        }
        if case .intercepted(let origin) = source {
            switch targetInside(origin, target, host: head.values(of: "host").first) {
            case .success(let inside): target = inside
            case .failure(let refusal): return admission.refuse(refusal.code, refusal.detail, close: refusal.code == .badRequest)
            }
        }
        var intercepts = intercepts
        if case .transparent(let requests) = source {
            switch targetTransparent(requests, target, host: head.values(of: "host").first, method: head.method) {
            case .success(let transparent): target = transparent
            case .failure(let refusal): return admission.refuse(refusal.code, refusal.detail, close: true)
            }
            // Only a ClientHello can be terminated.
            if requests != .tls { intercepts = { _ in false } }
        }
        switch target.form {
        case .origin, .asterisk:
            return admission.refuse(.notAProxyRequest,
                          "this is a forward proxy: send absolute-form requests (http://host/path), e.g. curl -x", close: false)
        case .absolute, .authority:
            break
        }
        admission.url = target.absoluteURL
        if MessageHeads.hasOwnVia(head) {
            return admission.refuse(.loopDetected, "the request already passed through this proxy", close: false)
        }

        // The session's mode replaces the global one (SPEC §12); the policy stays a function of the mode it is given.
        var mode = settings.mode
        switch settings.sessions.membership(fields: head.fields, proxyUser: admission.proxyUser, client: client) {
        case .none:
            break
        case .session(let membership, let sessionMode):
            mode = sessionMode
            admission.session = membership
        case .refused(let code, let detail):
            return admission.refuse(code, detail, close: false)
        }
        // Spent budgets that match the request join their conditions to it, or refuse it (SPEC §11).
        let baseMode = mode
        let judgement = judgeBudgets(budgets, client: client, host: target.host, mode: mode, now: now)
        admission.budgetMask = judgement.mask
        if let index = judgement.rejectedBy {
            admission.verdict = .budgetExhausted(index)
            admission.lift = lift(head, target, client: client, settings: settings, budgets: budgets, tags: nil,
                                  scopeMode: baseMode, session: admission.session?.id, now: now, wallNow: wallNow)
            return
        }
        mode = judgement.mode
        admission.mode = mode

        let facts = RequestFacts(method: head.method, url: target.absoluteURL, host: target.host, port: Int(target.port),
                                 path: target.path, isConnect: target.form == .authority, client: client,
                                 fields: policyFields(head.fields, settings.policy))
        let decision = decide(facts, mode: mode, policy: settings.policy, provenance: &admission.tagSources)
        if let tags = decision.tags {
            admission.tags = tags
            admission.rule = settings.policy.ruleName(for: decision, provenance: admission.tagSources)
        }
        // Refusals are the same for a CONNECT and any other request.
        switch decision {
        case .invalidTag(let detail):
            return admission.refuse(.invalidTag, detail, close: false)
        case .reject(let tags, let rejection):
            // A refusal a spent budget caused names it (SPEC §11).
            let budget = rejection.reasons.contains(where: { !baseMode.has($0) }) ? judgement.joinedBy : nil
            admission.verdict = .reject(rejection, budget: budget)
            if !settings.ruleHolds.isEmpty, let rule = admission.rule { admission.ruleHold = settings.ruleHolds[rule] }
            admission.lift = lift(head, target, client: client, settings: settings, budgets: budgets, tags: tags,
                                  scopeMode: baseMode, session: admission.session?.id, now: now, wallNow: wallNow)
        case .forward(let tags):
            admission.verdict = target.form == .authority
                ? (intercepts(target.host) ? .intercept(target) : .tunnel(target)) : .forward(target, tags)
        case .serveVariant(let tags, let rewrite):
            admission.verdict = target.form == .authority
                ? (intercepts(target.host) ? .intercept(target) : .tunnel(target)) : .serveVariant(target, tags, rewrite)
        }
    }

    /// The fields of a request the policy reads (`PolicySnapshot.readsField`), for its `RequestFacts`: none, and no
    /// array, for most requests.
    static func policyFields(_ fields: [HTTPField], _ policy: PolicySnapshot) -> [(name: String, value: String)] {
        var read: [(name: String, value: String)] = []
        for i in fields.indices where policy.readsField(fields[i].name) {
            read.append((name: fields[i].name, value: fields[i].value))
        }
        return read
    }

    /// Marks which budgets a request counts against and judges it by the spent ones.
    static func judgeBudgets(_ view: some BudgetView, client: IPAddress?, host: String, mode: DataMode,
                             now: Int64) -> BudgetJudgement {
        var judgement = BudgetJudgement(mode: mode)
        for (index, budget) in view.budgets.enumerated() where budget.match.matches(client: client, host: host) {
            judgement.mask |= 1 << UInt64(index)
            guard view.isSpent(index, now: now) else { continue }
            switch budget.then {
            case .reject:
                if judgement.rejectedBy == nil { judgement.rejectedBy = index }
            case .join(let joined):
                if judgement.joinedBy == nil && !joined.isSubset(of: judgement.mode) { judgement.joinedBy = budget.name }
                judgement.mode = judgement.mode.union(joined)
            }
        }
        return judgement
    }

    /// Why a request inside an intercepted tunnel is not for the tunnel's origin.
    struct InsideRefusal: Error, Equatable {
        var code: ProxyErrorCode
        var detail: String
    }

    /// What a request inside an intercepted tunnel is: an absolute-form `https://` request for the tunnel's
    /// authority (SPEC §9). Origin-form is what clients send inside TLS; absolute-form is accepted when it names the
    /// same authority. A `Host` (or absolute URL) naming another authority is `421`: this tunnel's TLS session was
    /// made for one origin, and a client that reuses it for another (connection coalescing) must retry elsewhere
    /// (RFC 9110 §15.5.20). A CONNECT or `OPTIONS *` inside is `400`.
    static func targetInside(_ origin: InterceptedOrigin, _ target: RequestTarget, host: String?)
        -> Result<RequestTarget, InsideRefusal> {
        let authority = origin.authority
        switch target.form {
        case .authority:
            return .failure(InsideRefusal(code: .badRequest, detail: "CONNECT inside an intercepted tunnel is not supported"))
        case .asterisk:
            return .failure(InsideRefusal(code: .badRequest, detail: "OPTIONS * inside an intercepted tunnel is not supported"))
        case .absolute:
            guard target.scheme == "https", target.host == origin.host, target.port == origin.port else {
                return .failure(InsideRefusal(code: .misdirectedRequest,
                                              detail: "\(target.absoluteURL) is not on this tunnel's origin https://\(authority)"))
            }
        case .origin:
            break
        }
        if let host, !sameAuthority(host, origin) {
            return .failure(InsideRefusal(code: .misdirectedRequest,
                                          detail: "Host \(host) is not this tunnel's origin \(authority)"))
        }
        if target.form == .absolute { return .success(target) }
        return .success(RequestTarget(form: .absolute, scheme: "https", host: origin.host, port: origin.port, path: target.path,
                                      hostHeaderValue: authority, absoluteURL: "https://" + authority + target.path))
    }

    /// What a request on the transparent listener is (SPEC §16). An origin-form request is the absolute-form
    /// `http://<Host><path>`: the client addressed an origin, not a proxy, and `Host` is all it said of its name
    /// (RFC 9112 §3.2: required; missing or invalid is `400`). An absolute `http://` form is taken as it is. The
    /// implicit CONNECT the listener made of a ClientHello or of other bytes is taken as it is; a CONNECT or
    /// `OPTIONS *` the client itself sent on a transparent HTTP connection is `400`: it was not talking to a proxy.
    /// Wherever the name points, the connection goes to the original destination (`UpstreamKey.pinned`).
    static func targetTransparent(_ requests: TransparentRequests, _ target: RequestTarget, host: String?, method: String)
        -> Result<RequestTarget, InsideRefusal> {
        switch (requests, target.form) {
        case (.tls, .authority), (.other, .authority):
            return .success(target)
        case (.tls, _), (.other, _), (.http, .authority), (.http, .asterisk):
            return .failure(InsideRefusal(code: .badRequest,
                                          detail: "\(method) \(target.absoluteURL) is not an origin request (transparent listener)"))
        case (.http, .absolute):
            guard target.scheme == "http" else {
                return .failure(InsideRefusal(code: .badRequest, detail: "only http:// requests come in the clear"))
            }
            return .success(target)
        case (.http, .origin):
            guard let host, !host.isEmpty else {
                return .failure(InsideRefusal(code: .badRequest,
                                              detail: "a request without Host: the transparent listener needs it to name the origin (RFC 9112 §3.2)"))
            }
            guard let absolute = RequestTarget.httpOnHost(host, origin: target) else {
                return .failure(InsideRefusal(code: .badRequest, detail: "Host \(host) is not a valid authority"))
            }
            return .success(absolute)
        }
    }

    /// `Host` names the tunnel's authority: the same host (case-insensitive), with its port or, for 443, without.
    static func sameAuthority(_ host: String, _ origin: InterceptedOrigin) -> Bool {
        let value = host.lowercased()
        if value == origin.authority { return true }
        let bracketed = origin.host.contains(":") ? "[\(origin.host)]" : origin.host
        return value == "\(bracketed):\(origin.port)" || (origin.port == 443 && value == bracketed)
    }
}
