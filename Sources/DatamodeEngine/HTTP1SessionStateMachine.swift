/// A client connection's lifecycle as a value: which phase it is in, with that phase's own data, and the
/// timers it needs. Events in, an `Action` out; no I/O and no clock of its own (times are passed in), so every
/// client-side timeout of SPEC §6 is testable without sleeping (hummingbird's `HTTPConnectionStateHandler`
/// idea). Generic over what an exchange is, so tests drive it with plain values.
///
/// What happens inside one exchange is `ExchangeStateMachine`'s business, and inside a tunnel
/// `TunnelStateMachine`'s; this one decides between them: read a head, forward, drain a refused body, tunnel,
/// flush and close.
struct HTTP1SessionStateMachine<Exchange> {
    enum State {
        /// Waiting for, or parsing, the next request head. `since`: when its first byte arrived (for
        /// `timeouts.client-header`); nil while idle between requests (`timeouts.client-idle`).
        case readingHead(since: UInt64?)
        /// Forwarding an exchange to an origin and relaying its response.
        case forwarding(Exchange)
        /// The exchange's request would be refused and asked to wait (SPEC §18.2): its head is read, nothing is
        /// forwarded or answered, and nothing more is read (its body, a pipelined request) until the worker's
        /// `HeldRequests` lets it go. The client leaving ends it at once.
        case held(Exchange)
        /// A refused upload is being stored instead (SPEC §18.3): its body is read whole, then the store's commit
        /// awaited (`DeferralIntake`); the `202` (or the refusal) follows.
        case storing(Exchange)
        /// A local answer for the exchange was queued; the rest of its request body is read and thrown away so
        /// that the connection can carry the next request (HAProxy's `H1_CS_DRAINING`).
        case drainingRefusedBody(Exchange)
        /// A CONNECT or Upgrade tunnel.
        case tunnel(Exchange)
        /// A CONNECT to an intercepted host (SPEC §9) was answered `200`: waiting for the client's first bytes
        /// (a TLS ClientHello is terminated, anything else becomes a blind tunnel), then for its TLS handshake.
        /// Bounded by `client-header`: a client that never completes a handshake is cut like a slow head.
        case openingInterception(Exchange)
        /// Writing what is queued for the client, then closing. `backlog`: what the output held when the timer
        /// was last armed (a reader that still reads gets another period).
        case closing(backlog: Int)
        /// Everything was written and the write side shut (FIN, or close_notify under TLS), but the client is still
        /// sending a request body nobody will read (the origin answered before reading it, or the body was
        /// refused on a connection that cannot be kept). Closing now would answer its next bytes with a RST, and a
        /// RST can destroy the response the client has not read yet (RFC 9112 §9.6). What it sends is read and
        /// thrown away until it closes or `Timeouts.lingerAtMost` passes (nginx's lingering close).
        case lingering
        /// Idle between requests, handed to a `ParkedConnection`: this session, its bufferevent, buffers and timers
        /// are freed (nginx frees an idle keep-alive connection's buffers the same way; they were ~1 KiB of the
        /// ~1.5 KiB an idle connection held, issue 12), and the first byte or the client's EOF makes a new session.
        /// Nothing changes a parked machine any more.
        case parked
        /// Freed: no event changes anything any more.
        case closed
    }

    /// The client-side timeouts of SPEC §6 / §8, in milliseconds.
    struct Timeouts: Equatable {
        var clientIdle: Int64
        var clientHeader: Int64
        var drain: Int64

        /// How long a connection waits idle before it is parked: `parkAfter`, or half of `client-idle` when that
        /// is shorter (so that a parked connection always has some idle time left).
        var park: Int64 { min(Self.parkAfter, clientIdle / 2) }

        /// Parking costs a session, a bufferevent set-up and two epoll_ctl when the next request comes; a client
        /// that sends its next request within this many milliseconds never pays it. Short, as nginx frees a
        /// kept-alive connection's buffers at once: connections opened in a burst all hold their sessions and
        /// buffers until they park, and the heap keeps that peak. bench/run's idle row (5,000 connections opened 50
        /// at a time): 1.6 KiB per connection after 1 s, 1.0 after 100 ms before the timer was also freed while
        /// parked; with `ParkedConnections`, 0.62–0.69 after 100 ms and 0.40–0.44 after 20 ms on a quiet machine
        /// (a faster client has more connections inside the window at once).
        static var parkAfter: Int64 { 20 }

        /// The longest a closing connection keeps reading a request body nobody wants (`lingering`): a client
        /// that watches for an early response (curl, browsers) stops sending at once; one that does not has had
        /// this long to read the response before the close.
        static var lingerAtMost: Int64 { 5_000 }
    }

    enum Action: Equatable {
        case none
        /// (Re)start the connection's timer.
        case armTimer(milliseconds: Int64)
        case disarmTimer
        /// Everything queued has been written (or nothing will be): free the connection now.
        case close
        /// Idle long enough: free the buffers if nothing is queued (`parked()`), and arm the timer for the rest of
        /// `client-idle` either way.
        case park(thenArmMilliseconds: Int64)
        /// Everything was written: shut the write side, keep reading (and throwing away) what the client still
        /// sends, and arm the timer for the most that may take.
        case linger(milliseconds: Int64)
    }

    /// Which phase the connection is in, without its exchange: what the session asks on every callback. A plain
    /// value, so reading it copies no reference (the `State` enum, stored, made every read of the machine from its
    /// session an outlined copy and a retain of its exchange: ~1.6K instructions a plain exchange, callgrind).
    enum Phase: Equatable {
        case readingHead(since: UInt64?)
        case forwarding, held, storing, drainingRefusedBody, tunnel, openingInterception
        case closing(backlog: Int)
        case lingering, parked, closed
    }

    private(set) var phase: Phase = .readingHead(since: nil)
    /// The exchange being forwarded, refused or tunnelled (phases `forwarding` … `openingInterception`), if any.
    private(set) var exchange: Exchange?

    /// The phase with its exchange, as one value.
    private(set) var state: State {
        get {
            switch phase {
            case .readingHead(let since): .readingHead(since: since)
            case .forwarding: .forwarding(exchange!)
            case .held: .held(exchange!)
            case .storing: .storing(exchange!)
            case .drainingRefusedBody: .drainingRefusedBody(exchange!)
            case .tunnel: .tunnel(exchange!)
            case .openingInterception: .openingInterception(exchange!)
            case .closing(let backlog): .closing(backlog: backlog)
            case .lingering: .lingering
            case .parked: .parked
            case .closed: .closed
            }
        }
        set {
            switch newValue {
            case .readingHead(let since): (phase, exchange) = (.readingHead(since: since), nil)
            case .forwarding(let next): (phase, exchange) = (.forwarding, next)
            case .held(let next): (phase, exchange) = (.held, next)
            case .storing(let next): (phase, exchange) = (.storing, next)
            case .drainingRefusedBody(let next): (phase, exchange) = (.drainingRefusedBody, next)
            case .tunnel(let next): (phase, exchange) = (.tunnel, next)
            case .openingInterception(let next): (phase, exchange) = (.openingInterception, next)
            case .closing(let backlog): (phase, exchange) = (.closing(backlog: backlog), nil)
            case .lingering: (phase, exchange) = (.lingering, nil)
            case .parked: (phase, exchange) = (.parked, nil)
            case .closed: (phase, exchange) = (.closed, nil)
            }
        }
    }
    /// The client half-closed: whatever it already sent is answered, then the connection closes.
    private(set) var clientEnded = false
    /// The timer armed in `readingHead(since: nil)` is the park timer, not yet `client-idle`'s end.
    private(set) var parkDue = false
    /// The exchange that made the connection close left its request body unread: once the output is written, the
    /// connection lingers (`lingering`) instead of closing at once. Only a socket of its own lingers (an HTTP/2
    /// stream's exchange ends with its stream).
    private(set) var lingerOnClose = false
    var timeouts: Timeouts

    init(timeouts: Timeouts) {
        self.timeouts = timeouts
    }

    var isClosed: Bool { phase == .closed }

    var isReadingHead: Bool {
        if case .readingHead = phase { return true }
        return false
    }

    var isParked: Bool { phase == .parked }

    /// Bytes flow between the client and an origin: an exchange is forwarded, or a tunnel is open.
    var isRelaying: Bool { phase == .forwarding || phase == .tunnel }

    // MARK: events

    /// The connection was accepted: wait for a first head, at most `client-idle`.
    func started() -> Action {
        .armTimer(milliseconds: timeouts.clientIdle)
    }

    /// Waiting idle for a next head: the park timer first, when parking leaves some idle time.
    private mutating func waitIdle() -> Action {
        let park = timeouts.park
        guard park > 0, park < timeouts.clientIdle else {
            parkDue = false
            return .armTimer(milliseconds: timeouts.clientIdle)
        }
        parkDue = true
        return .armTimer(milliseconds: park)
    }

    /// Bytes of a head are buffered; the first of them starts `client-header` (slowloris: a head that trickles
    /// in is cut however busy the client looks).
    mutating func headBytesBuffered(now: UInt64) -> Action {
        guard case .readingHead(nil) = phase else { return .none }
        state = .readingHead(since: now)
        parkDue = false
        return .armTimer(milliseconds: timeouts.clientHeader)
    }

    /// Nothing is buffered between requests. An ended client is done; otherwise wait at most `client-idle`.
    mutating func inputEmpty(outputBacklog: Int) -> Action {
        guard case .readingHead = phase else { return .none }
        state = .readingHead(since: nil)
        if clientEnded { return closeWhenFlushed(outputBacklog: outputBacklog) }
        return waitIdle()
    }

    /// A head is buffered only in part and the client ended: it will never be complete.
    mutating func incompleteHeadAtEOF(outputBacklog: Int) -> Action {
        guard case .readingHead = phase, clientEnded else { return .none }
        return closeWhenFlushed(outputBacklog: outputBacklog)
    }

    /// A complete (or invalid) head was parsed: its timer stops; the decision that follows picks the next state.
    /// Returns when the head's first byte arrived.
    mutating func headParsed() -> (since: UInt64?, action: Action) {
        guard case .readingHead(let since) = phase else {
            impossibleEvent("headParsed", state)
            return (nil, .none)
        }
        state = .readingHead(since: nil)
        parkDue = false
        return (since, .disarmTimer)
    }

    mutating func forward(_ exchange: Exchange) { if !isClosed { state = .forwarding(exchange) } }
    mutating func hold(_ exchange: Exchange) { if !isClosed { state = .held(exchange) } }
    mutating func store(_ exchange: Exchange) { if !isClosed { state = .storing(exchange) } }
    mutating func drainRefusedBody(_ exchange: Exchange) { if !isClosed { state = .drainingRefusedBody(exchange) } }
    mutating func tunnel(_ exchange: Exchange) { if !isClosed { state = .tunnel(exchange) } }

    /// The `200` for an intercepted CONNECT is queued: the ClientHello and the handshake must come within
    /// `client-header`.
    mutating func openInterception(_ exchange: Exchange) -> Action {
        guard !isClosed else { return .none }
        state = .openingInterception(exchange)
        return .armTimer(milliseconds: timeouts.clientHeader)
    }

    /// The client's TLS handshake completed: its requests are read as from any connection, the first within
    /// `client-idle`.
    mutating func interceptionEstablished() -> Action {
        guard case .openingInterception = phase else { return .none }
        state = .readingHead(since: nil)
        return .armTimer(milliseconds: timeouts.clientIdle)
    }

    /// The exchange is over. The next head is read when the connection can be kept; otherwise it closes once
    /// what is queued has been written.
    /// `requestUnread`: the client may still be sending the exchange's request body (the connection lingers).
    mutating func exchangeFinished(keepAlive: Bool, draining: Bool, outputBacklog: Int,
                                   requestUnread: Bool = false) -> Action {
        guard !isClosed else { return .none }
        if keepAlive && !draining {
            // The next request, pipelined or not, is read; a client that half-closed is closed once nothing
            // complete is left (`inputEmpty`, `incompleteHeadAtEOF`).
            state = .readingHead(since: nil)
            return .none
        }
        lingerOnClose = requestUnread
        return closeWhenFlushed(outputBacklog: outputBacklog)
    }

    /// Flush, then close, however slowly the client reads (SPEC §6 "No byte is lost").
    mutating func closeWhenFlushed(outputBacklog: Int) -> Action {
        guard !isClosed else { return .none }
        if outputBacklog == 0 { return closeOrLinger() }
        state = .closing(backlog: outputBacklog)
        return .armTimer(milliseconds: timeouts.drain)
    }

    /// The client half-closed. Its phase decides what that means; the connection only remembers it.
    mutating func clientSentEOF() {
        clientEnded = true
    }

    /// Everything was written: close, or linger while the client may still be sending a body (`lingering`).
    private mutating func closeOrLinger() -> Action {
        if lingerOnClose && !clientEnded {
            state = .lingering
            return .linger(milliseconds: Timeouts.lingerAtMost)
        }
        state = .closed
        return .close
    }

    /// The client ended its side while the connection lingered: nothing more will come, close now.
    mutating func clientEndedWhileLingering() -> Action {
        guard case .lingering = phase else { return .none }
        state = .closed
        return .close
    }

    /// The buffers were freed after `.park`.
    mutating func parked() {
        guard case .readingHead(nil) = phase else { return }
        state = .parked
    }

    /// The output was written out.
    mutating func outputDrained() -> Action {
        guard case .closing = phase else {
            impossibleEvent("outputDrained", state)
            return .none
        }
        return closeOrLinger()
    }

    /// The timer fired.
    mutating func timerFired(outputBacklog: Int) -> Action {
        switch phase {
        case .readingHead(nil) where parkDue:
            parkDue = false
            return .park(thenArmMilliseconds: max(1, timeouts.clientIdle - timeouts.park))
        case .readingHead, .parked:
            // Idle keep-alive expired, or a head trickled in too slowly: cut it without a word.
            state = .closed
            return .close
        case .openingInterception:
            // No ClientHello, or a handshake that does not finish: cut it as a slow head is cut.
            state = .closed
            return .close
        case .closing(let backlog):
            if outputBacklog > 0 && outputBacklog < backlog {
                // A slow reader that still reads: let it finish. Only a whole period without progress cuts it.
                state = .closing(backlog: outputBacklog)
                return .armTimer(milliseconds: timeouts.drain)
            }
            if outputBacklog == 0 { return closeOrLinger() }
            state = .closed
            return .close
        case .lingering:
            state = .closed
            return .close
        case .forwarding, .drainingRefusedBody, .tunnel, .held, .storing, .closed:
            return .none
        }
    }

    /// The connection was freed (an error, an abort, or the end).
    mutating func closed() {
        state = .closed
        parkDue = false
    }
}
