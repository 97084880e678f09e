import DatamodeState

/// One relay step of a message body, as the executor saw it: how the body relay ended the step and what its
/// source buffer held before and after. Pure data, so the state machines below never touch a buffer.
struct RelayStep: Equatable {
    enum Result: Equatable {
        /// Bytes moved or not; the body is not complete.
        case moving
        /// The body is complete (its last byte was moved).
        case complete
        /// The body's framing is invalid (RFC 9112 §7.1: a bad chunk size, data longer than its size).
        case invalid
    }

    var result: Result
    /// Bytes in the source buffer before and after the step.
    var before: Int
    var left: Int

    /// Something is left that cannot move although the destination had room: a framing element (a chunk-size
    /// line) cut short. After the source's EOF it never will.
    var isStalled: Bool { left > 0 && left == before }
}

/// The life of one forwarded exchange on a client connection, from the decision to forward to the end of its
/// response, as a value: events in, an `Action` out. Pure (no I/O, no C, no clock); `HTTP1Session` feeds it
/// what its buffers and sockets did and carries out what it returns (STYLE: a connection is a state machine
/// value plus an executor; models: swift-nio `HTTPServerPipelineHandler`, hummingbird
/// `HTTPConnectionStateHandler`).
///
/// It owns the rules whose absence lost bytes and cut healthy work (SPEC §6 "No byte is lost"):
/// - an EOF from either side ends nothing by itself: what that side sent before it is still relayed, and the
///   body ends only when its source buffer is empty, or what is left cannot move (`RelayStep.isStalled`);
/// - a response whose framing breaks before any byte of it was written is answered `502`, not cut;
/// - an upstream is recycled only at a message boundary: both bodies complete, nothing unread from the origin,
///   and an origin that said it keeps the connection.
struct ExchangeStateMachine {
    enum Phase: Equatable {
        /// The upstream connection is being set up (DNS, TCP, TLS); request bytes are already queued for it.
        case connecting
        /// Connected; the request is going out and no response head has arrived.
        case sending
        /// The response head was relayed; its body is being relayed. `untilClose`: the body is delimited by the
        /// origin closing the connection (RFC 9112 §6.3 rule 8).
        case relaying(untilClose: Bool)
        /// Over (finished, refused, truncated or aborted): no event changes it any more.
        case done
    }

    enum Action: Equatable {
        /// Nothing to do until the next event.
        case none
        /// Move request body bytes towards the origin, then report the step (`requestBodyStep`).
        case pumpRequestBody
        /// Move response body bytes towards the client, then report the step (`responseBodyStep`).
        case pumpResponseBody
        /// The whole request is in the upstream's hands: the response-head timer can start counting.
        case requestSent
        /// The response is complete: end the exchange; put the upstream back in the pool, or close it.
        case finish(recycleUpstream: Bool)
        /// The request's framing is invalid and no response byte has gone out: drop what was queued for the
        /// origin, answer `400` and close (SPEC §6: never forwarded).
        case refuseRequest
        /// The origin's framing broke and nothing of the response has been written yet: take the response back
        /// and answer `502 upstream-protocol-error` (SPEC §6).
        case retractAndAnswerBadGateway
        /// The response cannot be completed after part of it went out: write what was relayed, then close, so
        /// the client sees a short body, never a different message.
        case truncate(AbortReason)
        /// The client broke off (or broke its framing) after the response started: close now.
        case abort(AbortReason)
    }

    private(set) var phase: Phase = .connecting
    /// Every request body byte has been handed to the upstream.
    private(set) var requestComplete: Bool
    /// The client half-closed (EOF).
    private(set) var clientEnded = false
    /// The origin closed its side (EOF).
    private(set) var originEnded = false
    /// The origin's connection ended without a proper close: a reset, or TLS cut short or without close_notify
    /// (RFC 8446 §6.1). What it sent before is relayed all the same, but a body delimited by the close is not whole.
    private(set) var originBrokeOff = false
    /// The client connection may carry another request after this one.
    private(set) var keepAlive: Bool
    /// The origin said it keeps the connection, and nothing since made reuse unsafe.
    private(set) var upstreamReusable = false

    init(requestComplete: Bool, keepAlive: Bool) {
        self.requestComplete = requestComplete
        self.keepAlive = keepAlive
    }

    /// Whether a response head has been relayed (so a local answer is no longer possible).
    var responseStarted: Bool {
        if case .relaying = phase { return true }
        return false
    }

    // MARK: events

    /// The upstream is connected (or was taken connected from the pool).
    mutating func upstreamConnected() -> Action {
        guard phase == .connecting else { return .none }
        phase = .sending
        return requestComplete ? .none : .pumpRequestBody
    }

    /// The client half-closed. What it sent before is still answered: a body still buffered is relayed first,
    /// and requests pipelined behind this one are answered after it (the connection closes once nothing
    /// complete is left to read; see `HTTP1SessionStateMachine`).
    mutating func clientSentEOF() -> Action {
        guard phase != .done else { return .none }
        clientEnded = true
        return requestComplete ? .none : .pumpRequestBody
    }

    /// A request body relay step ran.
    mutating func requestBodyStep(_ step: RelayStep) -> Action {
        guard phase != .done, !requestComplete else { return .none }
        switch step.result {
        case .complete:
            requestComplete = true
            return .requestSent
        case .invalid:
            keepAlive = false
            upstreamReusable = false
            let started = responseStarted
            phase = .done
            return started ? .abort(.badRequest) : .refuseRequest
        case .moving:
            // After the client's EOF the body can only end short.
            guard clientEnded, step.left == 0 || step.isStalled else { return .none }
            keepAlive = false
            upstreamReusable = false
            phase = .done
            return .abort(.clientAborted)
        }
    }

    /// The response head arrived and was queued for the client. `originKeepsConnection`: the origin's head
    /// allows reuse (HTTP/1.1 without `close`, or 1.0 with keep-alive); `clientKeepsConnection`: the relayed
    /// response can keep the client connection (false e.g. when chunked framing is removed for a 1.0 client).
    mutating func responseHead(untilClose: Bool, originKeepsConnection: Bool, clientKeepsConnection: Bool) -> Action {
        guard phase == .sending || phase == .connecting else {
            // A second head while relaying, or one after a local answer: the executor read what it must not.
            impossibleEvent("responseHead", phase)
            return .none
        }
        phase = .relaying(untilClose: untilClose)
        if untilClose || !clientKeepsConnection || !requestComplete { keepAlive = false }
        upstreamReusable = !untilClose && originKeepsConnection && !originEnded
        return .pumpResponseBody
    }

    /// The origin closed its side. Nothing ends here: the body goes on draining what the origin sent.
    mutating func originSentEOF() -> Action {
        guard phase != .done else { return .none }
        originEnded = true
        upstreamReusable = false
        if case .relaying = phase { return .pumpResponseBody }
        return .none  // no head yet: the executor reads one from what arrived, or reports the failure
    }

    /// The origin's connection failed after it had sent something: drain it as after an EOF (every byte it sent
    /// reaches the client, SPEC §6), then end the response as truncated, never as complete. A close-delimited
    /// body inside TLS would otherwise end with the proxy's own close_notify and look whole to the client.
    mutating func originBrokeOffAfterSending() -> Action {
        guard phase != .done else { return .none }
        originBrokeOff = true
        return originSentEOF()
    }

    /// A response body relay step ran. `unwritten`: not one byte of this response has been written to the
    /// client yet (it can still be taken back whole).
    mutating func responseBodyStep(_ step: RelayStep, unwritten: Bool) -> Action {
        guard case .relaying(let untilClose) = phase else { return .none }
        switch step.result {
        case .complete:
            phase = .done
            return .finish(recycleUpstream: upstreamReusable && requestComplete && step.left == 0)
        case .invalid:
            phase = .done
            upstreamReusable = false
            if unwritten {
                if !requestComplete { keepAlive = false }
                return .retractAndAnswerBadGateway
            }
            keepAlive = false
            return .truncate(.upstreamProtocolError)
        case .moving:
            guard originEnded, step.left == 0 || step.isStalled else { return .none }
            phase = .done
            if untilClose && step.left == 0 && !originBrokeOff { return .finish(recycleUpstream: false) }
            keepAlive = false
            return .truncate(.upstreamAborted)
        }
    }

    /// What to do when the upstream fails.
    enum FailureAction: Equatable {
        /// Send the request again on a new connection.
        case retryOnNewConnection
        /// Answer the client with the failure's problem (502/504); `close` when its request body is unread.
        case answer(close: Bool)
        /// The response had started: nothing can be answered any more.
        case abort
    }

    /// Whether the request was already sent again once.
    private(set) var retried = false
    /// The origin sent an interim (1xx) response before its final one.
    private(set) var interimReceived = false

    /// An interim response (`100`, `103`) came from the origin. The origin has begun to act on the request, so it
    /// is never sent again (`upstreamFailed`), whatever the origin says afterwards.
    mutating func originSentInterim() {
        interimReceived = true
    }

    /// The upstream failed. A pooled connection the origin had already closed is retried once on a new one
    /// (RFC 9112 §9.3.1: an idle connection may be closed at any time), but only while no response started,
    /// nothing of the request body was consumed (so the request can be sent again exactly), and the failure was
    /// not a timeout (an origin that is merely slow must not get the request twice). An interim response rules a
    /// retry out too: the origin that sent it had the request and acted on it, so the connection was not stale (nor
    /// was an h2 stream unprocessed, RFC 9113 §8.7), and the client, which already has the first attempt's `103`,
    /// would get a second attempt's as well.
    mutating func upstreamFailed(reusedConnection: Bool, bodyBytesConsumed: UInt64, timedOut: Bool) -> FailureAction {
        guard phase != .done else { return .abort }
        if responseStarted {
            phase = .done
            return .abort
        }
        if reusedConnection && !retried && bodyBytesConsumed == 0 && !timedOut && !interimReceived {
            retried = true
            phase = .connecting
            return .retryOnNewConnection
        }
        phase = .done
        if !requestComplete { keepAlive = false }
        return .answer(close: !requestComplete)
    }

    /// The exchange ended some other way (a local answer, an upstream failure, the client's error).
    mutating func end() {
        phase = .done
        upstreamReusable = false
    }

    /// The client connection cannot be kept after this exchange (e.g. the proxy is draining).
    mutating func closeAfter() {
        keepAlive = false
    }
}

/// An event that the machine's state makes impossible: a bug in the executor that fed it, not something a peer
/// can cause. Debug builds (and the test suite, the model check included) stop on it, as swift-nio's state
/// machines do; release builds ignore the event, as the machine always did.
@inline(__always)
func impossibleEvent(_ event: StaticString, _ state: @autoclosure () -> Any) {
    assert(false, "\(event) is impossible in \(state())")
}
