/// What the four buffers of a tunnel hold, as the executor saw them after a pump.
struct TunnelBuffers: Equatable {
    /// Read from the client, not yet moved towards the origin.
    var clientInput: Int
    /// Queued for the origin, not yet written to its socket.
    var originOutput: Int
    /// Read from the origin, not yet moved towards the client.
    var originInput: Int
    /// Queued for the client, not yet written to its socket.
    var clientOutput: Int

    static let empty = TunnelBuffers(clientInput: 0, originOutput: 0, originInput: 0, clientOutput: 0)
}

/// A CONNECT or Upgrade tunnel as a value: which directions have ended and been passed on. Pure; the
/// `HTTP1Session` reports EOFs and what its buffers hold, and carries out the returned actions.
///
/// A half-close (`shutdown(SHUT_WR)`) is relayed as one, as TCP allows (a client that sends its request and
/// half-closes still gets the answer): once everything a side sent before its EOF has been written onwards,
/// the other side's write half is shut down. The tunnel closes only when both directions have been passed on
/// this way; closing as soon as both EOFs had been read lost whatever the slower direction still buffered.
struct TunnelStateMachine {
    enum Phase: Equatable {
        /// CONNECT: waiting for the origin's TCP connection (the client may already send, RFC 9110 §9.3.6).
        case connecting
        /// Bytes flow through the proxy's buffers.
        case established
        /// Both directions were handed to splice(2): the kernel moves them; `SpliceRelay` reports the ends.
        case spliced
        /// Both directions ended and were passed on, or the tunnel failed: nothing more happens.
        case closed
    }

    enum Action: Equatable {
        /// Everything the client sent was written to the origin: shut down the origin's write half.
        case shutDownOriginWrite
        /// Everything the origin sent was written to the client: shut down the client's write half.
        case shutDownClientWrite
        /// Both directions are over: close both connections.
        case close
    }

    private(set) var phase: Phase = .connecting
    private(set) var clientEnded = false
    private(set) var originEnded = false
    private(set) var originWriteShut = false
    private(set) var clientWriteShut = false

    init(established: Bool = false) {
        if established { phase = .established }
    }

    /// The origin answered the CONNECT (or `101 Switching Protocols` arrived).
    mutating func established() {
        if phase == .connecting { phase = .established }
    }

    /// The buffered path was idle and both directions were handed to splice(2). Only while neither side has
    /// ended: an ended direction is finished on the buffered path.
    mutating func spliced() -> Bool {
        guard phase == .established, !clientEnded, !originEnded else { return false }
        phase = .spliced
        return true
    }

    var canSplice: Bool { phase == .established && !clientEnded && !originEnded }

    mutating func clientSentEOF() { if phase != .closed { clientEnded = true } }
    mutating func originSentEOF() { if phase != .closed { originEnded = true } }

    /// Both directions ended on the splice path (their pipes empty, their half-closes passed on).
    mutating func spliceFinished() -> Action? {
        guard phase == .spliced else { return nil }
        phase = .closed
        return .close
    }

    /// The next thing to do now that the buffers hold `buffers`; call until it returns nil.
    mutating func nextAction(_ buffers: TunnelBuffers) -> Action? {
        guard phase == .established else { return nil }
        if clientEnded && !originWriteShut && buffers.clientInput == 0 && buffers.originOutput == 0 {
            originWriteShut = true
            return .shutDownOriginWrite
        }
        if originEnded && !clientWriteShut && buffers.originInput == 0 && buffers.clientOutput == 0 {
            clientWriteShut = true
            return .shutDownClientWrite
        }
        if originWriteShut && clientWriteShut {
            phase = .closed
            return .close
        }
        return nil
    }

    /// The tunnel failed (a reset, a relay error): nothing more is relayed.
    mutating func fail() {
        phase = .closed
    }
}
