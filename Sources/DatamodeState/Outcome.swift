/// What the access log and metrics say about a request (SPEC §7 `outcome`).
@usableFromInline package enum Outcome: String {
    case forwarded, rewritten, rejected, error
}

/// Why an exchange was cut short once no answer could be sent any more (or a tunnel ended by a failure rather
/// than by both sides closing): the access log's and metrics' `reason`. Where SPEC §6 has a code for the cause,
/// it is that code; the two others name the side that broke off. README lists them all.
package enum AbortReason: String, CaseIterable {
    /// The client closed its connection mid-request, or reset it (or failed) at any point.
    case clientAborted = "client-aborted"
    /// The origin closed its connection mid-response, or reset it (or failed) after its response head.
    case upstreamAborted = "upstream-aborted"
    /// The origin's body framing broke (a bad chunk) after the response started: SPEC §6's code for it.
    case upstreamProtocolError = "upstream-protocol-error"
    /// The client's chunked body broke after the response started: SPEC §6's code for bad framing.
    case badRequest = "bad-request"
    /// SPEC §9: the client's TLS handshake on an intercepted tunnel failed (it refused the leaf, or closed).
    case tlsClientRejected = "tls-client-rejected"
    /// A `hard` data budget it counted against was spent (SPEC §11): the transfer or tunnel was closed.
    case budgetExhausted = "budget-exhausted"
    /// SPEC §16: a connection on the transparent listener had no original destination (it was not redirected),
    /// or its destination was the proxy itself: closed, never relayed to itself.
    case transparentNoDestination = "transparent-no-destination"
}
