import DatamodePolicy
import Testing

/// SPEC §20: every response the proxy makes itself says why in its status line and in `Proxy-Status` (RFC 9209).
@Suite("Refusal wording")
struct RefusalWordingTests {
    /// RFC 9209 §2.3's error type expected for each code, written out here rather than derived, so that a code
    /// added without a considered mapping fails this table.
    static let errorTypes: [String: String] = [
        "bad-request": "http_request_error", "invalid-tag": "http_request_error",
        "not-a-proxy-request": "http_request_error", "uri-too-long": "http_request_error",
        "headers-too-large": "http_request_error", "invalid-variant": "http_request_error",
        "unknown-session": "http_request_error", "unknown-profile": "http_request_error",
        "misdirected-request": "http_request_error", "http-version-not-supported": "http_request_error",
        "access-denied": "http_request_denied", "proxy-auth-required": "http_request_denied",
        "connect-port-denied": "http_request_denied", "constrained": "http_request_denied",
        "expensive": "http_request_denied", "ultra-constrained": "http_request_denied",
        "budget-exhausted": "http_request_denied", "sessions-disabled": "http_request_denied",
        "loop-detected": "proxy_loop_detected", "dns-failure": "dns_error",
        "upstream-unreachable": "connection_refused", "upstream-protocol-error": "http_protocol_error",
        "upstream-timeout": "connection_timeout", "upstream-tls-error": "tls_certificate_error",
        "overloaded": "proxy_internal_error",
    ]

    @Test func everyCodeHasAProxyStatusNamingIt() throws {
        #expect(Set(Self.errorTypes.keys) == Set(ProxyErrorCode.allCases.map(\.rawValue)))
        for code in ProxyErrorCode.allCases {
            let type = try #require(Self.errorTypes[code.rawValue])
            #expect(code.proxyStatus == "datamode-proxy; error=\(type); details=\"\(code.rawValue)\"")
        }
    }

    @Test func aDataModeRefusalSaysSoInItsReasonPhrase() {
        #expect(ProxyErrorCode.constrained.statusReason == "Refused by data mode (constrained)")
        #expect(ProxyErrorCode.expensive.statusReason == "Refused by data mode (expensive)")
        #expect(ProxyErrorCode.ultraConstrained.statusReason == "Refused by data mode (ultra-constrained)")
        #expect(ProxyErrorCode.budgetExhausted.statusReason == "Refused by data mode (budget-exhausted)")
    }

    @Test func anyOtherAnswerKeepsItsUsualPhraseAndNamesTheCode() {
        #expect(ProxyErrorCode.dnsFailure.statusReason == "Bad Gateway (dns-failure)")
        #expect(ProxyErrorCode.upstreamTimeout.statusReason == "Gateway Timeout (upstream-timeout)")
        #expect(ProxyErrorCode.accessDenied.statusReason == "Forbidden (access-denied)")
        #expect(ProxyErrorCode.connectPortDenied.statusReason == "Forbidden (connect-port-denied)")
        #expect(ProxyErrorCode.proxyAuthRequired.statusReason == "Proxy Authentication Required (proxy-auth-required)")
        #expect(ProxyErrorCode.loopDetected.statusReason == "Loop Detected (loop-detected)")
        for code in ProxyErrorCode.allCases {
            // RFC 9112 §4: reason-phrase = 1*( HTAB / SP / VCHAR / obs-text ).
            #expect(code.statusReason.utf8.allSatisfy { $0 == 0x09 || (0x20...0x7E).contains($0) }, "\(code)")
            #expect(code.statusReason.hasSuffix("(\(code.rawValue))"))
        }
    }
}
