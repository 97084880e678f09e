/// The stable `error` codes of SPEC §4, §6 and §15, each with its HTTP status and a human title.
///
/// This is the one place where a failure of the proxy port becomes a status code: the engine and the policy
/// produce `ProxyErrorCode` values and render them with `ProblemDetail` (`urn:datamode:<code>`). The admin plane
/// answers with its own problem documents (`AdminProblem` in DatamodeAdmin: `urn:datamode:admin:<code>`, codes such
/// as `unauthorized`, `not-found`, `conflict`); it borrows only `invalidVariant`'s and `sessionsDisabled`'s code and
/// status from here.
public enum ProxyErrorCode: String, CaseIterable, Hashable, Sendable {
    case badRequest = "bad-request"
    case invalidTag = "invalid-tag"
    case notAProxyRequest = "not-a-proxy-request"
    case uriTooLong = "uri-too-long"
    case headersTooLarge = "headers-too-large"
    case accessDenied = "access-denied"
    case proxyAuthRequired = "proxy-auth-required"
    case connectPortDenied = "connect-port-denied"
    case loopDetected = "loop-detected"
    case dnsFailure = "dns-failure"
    case upstreamUnreachable = "upstream-unreachable"
    case upstreamProtocolError = "upstream-protocol-error"
    case upstreamTimeout = "upstream-timeout"
    case overloaded = "overloaded"
    case constrained = "constrained"
    case expensive = "expensive"
    /// SPEC §15: the mode is ultra-constrained and the request did not opt in.
    case ultraConstrained = "ultra-constrained"
    /// A variant refused when it is declared (`PUT /variants/{id}`), e.g. a `file` outside the variants directory.
    case invalidVariant = "invalid-variant"
    /// SPEC §12: `Data-Mode-Session` names a session that does not exist (a typo would otherwise silently run a
    /// test under the global mode).
    case unknownSession = "unknown-session"
    /// SPEC §9: the TLS connection to an origin failed (its certificate did not verify, or the handshake broke).
    case upstreamTLSError = "upstream-tls-error"
    /// SPEC §9: a request inside an intercepted tunnel names another authority than the tunnel's (RFC 9110 §15.5.20).
    case misdirectedRequest = "misdirected-request"
    /// SPEC §10: `PUT /conditions` names no known link profile.
    case unknownProfile = "unknown-profile"
    /// SPEC §11: a data budget with `then: reject` is spent for this request's traffic.
    case budgetExhausted = "budget-exhausted"
    /// SPEC §12: `PUT /sessions/{id}` while sessions are off: a rig must not believe it has a session that nothing
    /// honours (the session header is ignored while they are off).
    case sessionsDisabled = "sessions-disabled"
    /// SPEC §17: the HTTP/2 connection preface in clear text on the proxy port (HTTP/2 is spoken inside
    /// intercepted TLS only); answered and closed.
    case httpVersionNotSupported = "http-version-not-supported"

    public var status: Int {
        switch self {
        case .badRequest, .invalidTag, .notAProxyRequest, .invalidVariant, .unknownSession, .unknownProfile: 400
        case .uriTooLong: 414
        case .headersTooLarge: 431
        case .accessDenied, .connectPortDenied, .constrained, .expensive, .ultraConstrained, .budgetExhausted: 403
        case .proxyAuthRequired: 407
        case .loopDetected: 508
        case .dnsFailure, .upstreamUnreachable, .upstreamProtocolError, .upstreamTLSError: 502
        case .misdirectedRequest: 421
        case .sessionsDisabled: 409
        case .upstreamTimeout: 504
        case .overloaded: 503
        case .httpVersionNotSupported: 505
        }
    }

    public var title: String {
        switch self {
        case .badRequest: "Malformed request"
        case .invalidTag: "Invalid data-mode tag"
        case .notAProxyRequest: "Not a proxy request"
        case .uriTooLong: "Request line too long"
        case .headersTooLarge: "Request header section too large"
        case .accessDenied: "Client not allowed to use this proxy"
        case .proxyAuthRequired: "Proxy authentication required"
        case .connectPortDenied: "CONNECT to this port is not allowed"
        case .loopDetected: "Proxy loop detected"
        case .dnsFailure: "Upstream host name could not be resolved"
        case .upstreamUnreachable: "Upstream unreachable"
        case .upstreamProtocolError: "Upstream sent an invalid response"
        case .upstreamTimeout: "Upstream timed out"
        case .overloaded: "Proxy overloaded"
        case .constrained: "Not allowed on a constrained network"
        case .expensive: "Not allowed on an expensive network"
        case .ultraConstrained: "Not allowed on an ultra-constrained network"
        case .invalidVariant: "Invalid variant"
        case .unknownSession: "Unknown session"
        case .upstreamTLSError: "TLS connection to the upstream failed"
        case .misdirectedRequest: "Request sent to the wrong tunnel"
        case .unknownProfile: "Unknown link profile"
        case .budgetExhausted: "Data budget exhausted"
        case .sessionsDisabled: "Sessions are off"
        case .httpVersionNotSupported: "HTTP version not supported here"
        }
    }

    /// What the status line says (SPEC §20): apt, pip and wget print the reason phrase and nothing else of a
    /// refusal (a refused CONNECT's body reaches no one), so it names the cause: `Refused by data mode
    /// (constrained)` for a data-mode refusal, `<usual phrase> (<error code>)` for anything else the proxy says
    /// itself. Built once per code (a refusal is a hot path: a quarter of the requests of the policy-cost row).
    public var statusReason: String { Self.statusReasons[self]! }

    /// `Proxy-Status` (RFC 9209 §2) on every response the proxy makes itself: this proxy's name, the RFC's
    /// error type (§2.3) and in `details` the stable `error` code, so a client or a cache in front of the proxy
    /// tells "the proxy refused" from "the origin answered 403" without reading the body.
    public var proxyStatus: String { Self.proxyStatuses[self]! }

    /// Whether the refusal is the data mode's (SPEC §4, §11, §15) rather than a failure or a policy of access.
    public var isDataModeRefusal: Bool {
        switch self {
        case .constrained, .expensive, .ultraConstrained, .budgetExhausted: true
        default: false
        }
    }

    /// RFC 9209 §2.3's error type for this code.
    public var proxyStatusErrorType: String {
        switch self {
        case .badRequest, .invalidTag, .notAProxyRequest, .uriTooLong, .headersTooLarge, .invalidVariant,
             .unknownSession, .unknownProfile, .misdirectedRequest, .httpVersionNotSupported:
            "http_request_error"
        case .accessDenied, .proxyAuthRequired, .connectPortDenied, .constrained, .expensive, .ultraConstrained,
             .budgetExhausted, .sessionsDisabled:
            "http_request_denied"
        case .loopDetected: "proxy_loop_detected"
        case .dnsFailure: "dns_error"
        case .upstreamUnreachable: "connection_refused"
        case .upstreamProtocolError: "http_protocol_error"
        case .upstreamTimeout: "connection_timeout"
        case .upstreamTLSError: "tls_certificate_error"
        case .overloaded: "proxy_internal_error"
        }
    }

    /// The proxy's name in `Proxy-Status` (an sf-token, RFC 8941 §3.3.4).
    public static let proxyStatusName = "datamode-proxy"

    private static let statusReasons: [ProxyErrorCode: String] = Dictionary(uniqueKeysWithValues: allCases.map { code in
        (code, code.isDataModeRefusal ? "Refused by data mode (\(code.rawValue))" : "\(code.reasonPhrase) (\(code.rawValue))")
    })

    private static let proxyStatuses: [ProxyErrorCode: String] = Dictionary(uniqueKeysWithValues: allCases.map { code in
        (code, "\(proxyStatusName); error=\(code.proxyStatusErrorType); details=\"\(code.rawValue)\"")
    })

    /// The usual reason phrase of the status (RFC 9110 §15), without the cause.
    public var reasonPhrase: String {
        switch status {
        case 400: "Bad Request"
        case 403: "Forbidden"
        case 407: "Proxy Authentication Required"
        case 409: "Conflict"
        case 414: "URI Too Long"
        case 421: "Misdirected Request"
        case 431: "Request Header Fields Too Large"
        case 502: "Bad Gateway"
        case 503: "Service Unavailable"
        case 505: "HTTP Version Not Supported"
        case 504: "Gateway Timeout"
        case 508: "Loop Detected"
        default: "Error"
        }
    }
}

/// An RFC 9457 problem document (`application/problem+json`) as this proxy writes it.
public struct ProblemDetail: Sendable, Hashable {
    public var code: ProxyErrorCode
    public var detail: String?
    /// Extra members, already JSON-encoded values keyed by member name, written in order.
    public var extra: [(String, String)]

    public init(code: ProxyErrorCode, detail: String? = nil, extra: [(String, String)] = []) {
        self.code = code
        self.detail = detail
        self.extra = extra
    }

    public static func == (lhs: ProblemDetail, rhs: ProblemDetail) -> Bool {
        lhs.code == rhs.code && lhs.detail == rhs.detail && lhs.extra.elementsEqual(rhs.extra, by: { $0 == $1 })
    }
    public func hash(into hasher: inout Hasher) {
        hasher.combine(code)
        hasher.combine(detail)
    }

    /// The JSON body: `type`, `title`, `status`, `error`, then `detail` and the extra members.
    public var json: String {
        var out = "{\"type\":\"urn:datamode:\(code.rawValue)\",\"title\":\(JSONText.quote(code.title)),"
        out += "\"status\":\(code.status),\"error\":\"\(code.rawValue)\""
        if let detail { out += ",\"detail\":\(JSONText.quote(detail))" }
        for (name, value) in extra { out += ",\(JSONText.quote(name)):\(value)" }
        out += "}"
        return out
    }
}

/// Minimal JSON text helpers for the few documents the hot path writes (no Foundation on the hot path).
public enum JSONText {
    /// `s` as a JSON string literal (RFC 8259 §7).
    public static func quote(_ s: String) -> String {
        // Most values (URLs, codes, mode names) need no escape: one copy, not one append per scalar (the
        // per-scalar path showed in the profile of the policy-cost row, where a quarter of requests are refused).
        if !needsEscape(s) { return "\"" + s + "\"" }
        var out = "\""
        out.reserveCapacity(s.utf8.count + 2)
        for scalar in s.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            default:
                if scalar.value < 0x20 {
                    let hex = String(scalar.value, radix: 16)
                    out += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
                } else {
                    out.unicodeScalars.append(scalar)
                }
            }
        }
        out += "\""
        return out
    }

    /// Whether `s` has a byte a JSON string literal must escape.
    public static func needsEscape(_ s: String) -> Bool {
        s.utf8.contains { $0 == 0x22 || $0 == 0x5C || $0 < 0x20 }
    }

    /// A JSON array of strings.
    public static func array(_ items: [String]) -> String {
        "[" + items.map(quote).joined(separator: ",") + "]"
    }
}
