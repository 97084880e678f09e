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
