import DatamodeTestSupport
import Testing

/// Checks a response the proxy produced itself (SPEC §6): the status, `application/problem+json`, and a problem
/// document whose `error`, `status` and `type` agree with it.
func expectProblem(_ response: ParsedResponse, status: Int, error: String,
                   sourceLocation: SourceLocation = #_sourceLocation) {
    #expect(response.status == status, "status; body: \(response.bodyText)", sourceLocation: sourceLocation)
    #expect(response.value(of: "Content-Type") == "application/problem+json", sourceLocation: sourceLocation)
    #expect(response.value(of: "Content-Length") == String(response.body.count), sourceLocation: sourceLocation)
    let problem = response.problem
    #expect(problem != nil, "body is not a problem document: \(response.bodyText)", sourceLocation: sourceLocation)
    #expect(problem?.error == error, "error code; body: \(response.bodyText)", sourceLocation: sourceLocation)
    #expect(problem?.status == status, sourceLocation: sourceLocation)
    #expect(problem?.type == "urn:datamode:\(error)", sourceLocation: sourceLocation)
    // SPEC §20: the status line and Proxy-Status (RFC 9209) name the cause, for clients that print nothing else.
    let dataMode = ["constrained", "expensive", "ultra-constrained", "budget-exhausted"].contains(error)
    let usual = [400: "Bad Request", 403: "Forbidden", 407: "Proxy Authentication Required", 409: "Conflict",
                 414: "URI Too Long", 421: "Misdirected Request", 431: "Request Header Fields Too Large",
                 502: "Bad Gateway", 503: "Service Unavailable", 504: "Gateway Timeout",
                 505: "HTTP Version Not Supported", 508: "Loop Detected"][status] ?? "?"
    #expect(response.reason == (dataMode ? "Refused by data mode (\(error))" : "\(usual) (\(error))"),
            "reason phrase", sourceLocation: sourceLocation)
    let proxyStatus = response.value(of: "Proxy-Status") ?? ""
    #expect(proxyStatus.hasPrefix("datamode-proxy; error=") && proxyStatus.hasSuffix("; details=\"\(error)\""),
            "Proxy-Status: \(proxyStatus)", sourceLocation: sourceLocation)
}

/// Checks that nothing at all reached the origin: no request and not one byte (after every connection the
/// proxy may have opened to it has been closed, so that no byte can still be in flight).
func expectOriginUntouched(_ origin: RecordingOrigin, sourceLocation: SourceLocation = #_sourceLocation) {
    #expect(origin.waitUntilConnectionsClosed(timeout: .seconds(10)), "a connection to the origin stayed open",
            sourceLocation: sourceLocation)
    #expect(origin.requests.isEmpty, "origin received: \(origin.requests.map(\.headText))", sourceLocation: sourceLocation)
    #expect(origin.bytesReceived == 0, "origin received \(origin.bytesReceived) bytes; violations: \(origin.violations)",
            sourceLocation: sourceLocation)
}
