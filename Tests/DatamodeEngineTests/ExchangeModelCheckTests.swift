@testable import DatamodeEngine
import DatamodeTestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// A model check of the exchange and tunnel state machines (SPEC §6 "No byte is lost", "never forwarded").
///
/// Each run generates a scenario — a request body and a response body, each length-delimited, chunked or (the
/// response) delimited by the close; maybe a broken chunk; a client that may half-close early; an origin that
/// may close early or answer before the whole request arrived; tiny watermarks — and then drives the real
/// `ExchangeStateMachine` with a random interleaving of socket events (bytes arriving in any split, EOFs,
/// slow readers, the upstream connecting late). A small simulated executor carries out the actions the way
/// `HTTP1Session` does, over byte-counting buffers, with a body relay that moves data freely and framing
/// elements only whole (as `BodyRelay` does). The invariants, after every step and at the end:
/// - every body byte is delivered exactly once and in order, before any close (counts never pass what was
///   sent; at the end the receiver holds exactly what the sender sent, or a prefix only when the sender
///   itself broke off or broke its framing);
/// - nothing at or after an invalid framing element is ever forwarded;
/// - no action after the exchange is done, and every scenario ends (no hang);
/// - an upstream is recycled only at a message boundary.
/// Seeded and reproducible: a failure prints its seed.
@Suite struct ExchangeModelCheckTests {
    /// The first seed: 1 by default (reproducible in CI); `DATAMODE_MODEL_SEED=<n>` explores another 4,000.
    static let firstSeed: UInt64 = getenv("DATAMODE_MODEL_SEED").flatMap { UInt64(String(cString: $0)) } ?? 1
    static var seeds: ClosedRange<UInt64> { firstSeed...(firstSeed &+ 3999) }

    @Test func randomizedExchangesKeepEveryInvariant() {
        var failures: [String] = []
        for seed in Self.seeds {
            var world = ExchangeWorld(seed: seed)
            if let failure = world.run() {
                failures.append("seed \(seed): \(failure) [\(world.scenario)]")
                if failures.count >= 5 { break }
            }
        }
        #expect(failures.isEmpty, "\(failures.joined(separator: "\n"))")
    }

    @Test func randomizedTunnelsDeliverBothDirectionsBeforeClosing() {
        var failures: [String] = []
        for seed in Self.seeds {
            var world = TunnelWorld(seed: seed)
            if let failure = world.run() {
                failures.append("seed \(seed): \(failure)")
                if failures.count >= 5 { break }
            }
        }
        #expect(failures.isEmpty, "\(failures.joined(separator: "\n"))")
    }
}

// MARK: - the simulated body

/// A body as its relay sees it, one element per byte: payload, part of a framing element (a chunk-size line
/// and the CRLFs around it) that can only move whole, or part of an invalid framing element.
struct ModelBody: CustomStringConvertible {
    enum Byte: Equatable { case data, framing(Int), invalid }
    enum Framing: String { case length, chunked, untilClose }

    let framing: Framing
    let bytes: [Byte]
    let dataCount: Int

    init(framing: Framing, dataLength: Int, invalidAt: Int?, using rng: inout SeededGenerator) {
        self.framing = framing
        var bytes: [Byte] = []
        var element = 0
        if framing == .chunked {
            var left = dataLength
            var chunk = 0
            while left > 0 {
                let n = Int.random(in: 1...min(left, 24), using: &rng)
                let broken = invalidAt == chunk
                let size = Int.random(in: 3...6, using: &rng)  // "17\r\n" and the CRLF before it
                bytes += Array(repeating: broken ? Byte.invalid : .framing(element), count: size)
                element += 1
                bytes += Array(repeating: .data, count: n)
                left -= n
                chunk += 1
            }
            bytes += Array(repeating: .framing(element), count: 7)  // "\r\n0\r\n\r\n"
        } else {
            bytes = Array(repeating: .data, count: dataLength)
        }
        self.bytes = bytes
        self.dataCount = dataLength
    }

    var description: String { "\(framing.rawValue) \(dataCount)B/\(bytes.count)" }
    var hasInvalidFraming: Bool { bytes.contains(.invalid) }
    /// Where the first invalid byte is (the stream's valid prefix ends there).
    var validPrefix: Int { bytes.firstIndex(of: .invalid) ?? bytes.count }
}

/// One relay step over `body`, from position `from` with `available` bytes buffered, at most `budget` bytes of
/// payload (framing moves whole, whatever the budget, as in `BodyRelay`). Returns the step and the bytes moved.
func relay(_ body: ModelBody, from: Int, available: Int, budget: Int) -> (RelayStep, moved: Int) {
    var position = from
    let end = from + available
    var budget = budget
    while true {
        if position == body.bytes.count {
            return (RelayStep(result: body.framing == .untilClose ? .moving : .complete, before: available,
                              left: end - position), position - from)
        }
        guard position < end else { break }
        switch body.bytes[position] {
        case .invalid:
            return (RelayStep(result: .invalid, before: available, left: end - position), position - from)
        case .data:
            guard budget > 0 else { return (RelayStep(result: .moving, before: available, left: end - position), position - from) }
            var n = 0
            while position + n < end && n < budget && body.bytes[position + n] == .data { n += 1 }
            position += n
            budget -= n
        case .framing(let element):
            var n = 0
            while position + n < body.bytes.count && body.bytes[position + n] == .framing(element) { n += 1 }
            guard position + n <= end else {
                return (RelayStep(result: .moving, before: available, left: end - position), position - from)
            }
            position += n
        }
    }
    return (RelayStep(result: .moving, before: available, left: end - position), position - from)
}

// MARK: - the exchange world

/// The bytes of one direction as positions in its stream: what the sender wrote, what the proxy read into its
/// input buffer, what it moved to its output buffer, what the receiver read. Buffers are the differences.
struct Pipe {
    var sent = 0, read = 0, relayed = 0, received = 0
    var input: Int { read - relayed }
    var output: Int { relayed - received }
}

struct ExchangeWorld {
    var rng: SeededGenerator
    let highWater: Int
    let request: ModelBody
    let response: ModelBody
    /// How much of its body the client sends before its half-close (nil: it sends all and keeps the connection).
    let clientStopsAt: Int?
    let clientHalfClosesAfterBody: Bool
    /// How much of the response body the origin sends before it closes (nil: all of it, then it closes only
    /// for a close-delimited body).
    let originStopsAt: Int?
    let originAnswersEarly: Bool
    let clientKeepsConnection: Bool
    var scenario: String

    var machine: ExchangeStateMachine
    var up = Pipe()       // request body: client -> proxy -> origin
    var down = Pipe()     // response body: origin -> proxy -> client
    var connected = false
    var requestSentAction = false
    var headSent = false, headRead = false, headWritten = false
    var clientEOFSent = false, clientEOFSeen = false
    var originEOFSent = false, originEOFSeen = false
    /// How the exchange ended, once it has.
    var outcome: ExchangeStateMachine.Action?
    var connectionClosedAbruptly = false

    init(seed: UInt64) {
        var rng = SeededGenerator(seed: seed)
        highWater = Int.random(in: 8...48, using: &rng)  // above the largest framing element, as 512 KiB is in the engine
        let requestFraming: ModelBody.Framing = Bool.random(using: &rng) ? .length : .chunked
        let requestLength = Int.random(in: 0...3, using: &rng) == 0 ? 0 : Int.random(in: 1...160, using: &rng)
        let badRequestChunk: Int? = requestFraming == .chunked && Int.random(in: 0..<8, using: &rng) == 0
            ? Int.random(in: 0...3, using: &rng) : nil
        request = ModelBody(framing: requestFraming, dataLength: requestLength, invalidAt: badRequestChunk, using: &rng)
        let responseFraming = [ModelBody.Framing.length, .chunked, .untilClose].randomElement(using: &rng)!
        let badResponseChunk: Int? = responseFraming == .chunked && Int.random(in: 0..<8, using: &rng) == 0
            ? Int.random(in: 0...3, using: &rng) : nil
        response = ModelBody(framing: responseFraming, dataLength: Int.random(in: 0...200, using: &rng),
                             invalidAt: badResponseChunk, using: &rng)
        clientStopsAt = Int.random(in: 0..<6, using: &rng) == 0 && request.bytes.count > 0
            ? Int.random(in: 0..<request.bytes.count, using: &rng) : nil
        clientHalfClosesAfterBody = Bool.random(using: &rng)
        originStopsAt = Int.random(in: 0..<6, using: &rng) == 0 && response.bytes.count > 0
            ? Int.random(in: 0..<response.bytes.count, using: &rng) : nil
        originAnswersEarly = Int.random(in: 0..<6, using: &rng) == 0
        clientKeepsConnection = Int.random(in: 0..<5, using: &rng) != 0
        scenario = "hw \(highWater), request \(request), response \(response), client stops \(clientStopsAt.map(String.init) ?? "-")"
            + "\(clientHalfClosesAfterBody ? " half-closes" : ""), origin stops \(originStopsAt.map(String.init) ?? "-")"
            + "\(originAnswersEarly ? " answers early" : "")"
        machine = ExchangeStateMachine(requestComplete: request.bytes.isEmpty, keepAlive: true)
        self.rng = rng
    }

    var clientScript: Int { clientStopsAt ?? request.bytes.count }
    var originScript: Int { originStopsAt ?? response.bytes.count }
    var originWantsToAnswer: Bool { originAnswersEarly || up.received >= request.validPrefix || clientEOFSent }

    // MARK: running

    enum Event { case clientSends, clientHalfCloses, proxyReadsClient, upstreamConnects, originReads,
                      originSendsHead, originSends, originCloses, proxyReadsOrigin, clientReads }

    mutating func run() -> String? {
        for _ in 0..<100_000 {
            if let failure = checkInvariants() { return failure }
            if outcome != nil { return finish() }
            // What the peers and the sockets can do next, in any order.
            var events: [Event] = []
            if up.sent < clientScript { events.append(.clientSends) }
            if up.sent == clientScript && !clientEOFSent && (clientStopsAt != nil || clientHalfClosesAfterBody) {
                events.append(.clientHalfCloses)
            }
            if (up.read < up.sent || (clientEOFSent && !clientEOFSeen)) && up.input < highWater {
                events.append(.proxyReadsClient)
            }
            if !connected { events.append(.upstreamConnects) }
            if connected && up.output > 0 { events.append(.originReads) }
            if originWantsToAnswer && !headSent { events.append(.originSendsHead) }
            if headSent && down.sent < originScript { events.append(.originSends) }
            if headSent && down.sent == originScript && !originEOFSent
                && (originStopsAt != nil || response.framing == .untilClose) {
                events.append(.originCloses)
            }
            if ((!headRead && headSent) || down.read < down.sent || (originEOFSent && !originEOFSeen)) && down.input < highWater {
                events.append(.proxyReadsOrigin)
            }
            if (headRead && !headWritten) || down.output > 0 { events.append(.clientReads) }
            guard let event = events.randomElement(using: &rng) else {
                return "stuck in \(machine.phase) with nothing left to happen (a hang)"
            }
            switch event {
            case .clientSends: clientSends()
            case .clientHalfCloses: clientEOFSent = true
            case .proxyReadsClient: proxyReadsClient()
            case .upstreamConnects: upstreamConnects()
            case .originReads: originReads()
            case .originSendsHead: headSent = true
            case .originSends: originSends()
            case .originCloses: originEOFSent = true
            case .proxyReadsOrigin: proxyReadsOrigin()
            case .clientReads: clientReads()
            }
        }
        return "no end after 100,000 events"
    }

    // MARK: peers and sockets

    mutating func clientSends() {
        up.sent += Int.random(in: 1...(clientScript - up.sent), using: &rng)
    }

    mutating func proxyReadsClient() {
        if up.read < up.sent {
            up.read += Int.random(in: 1...min(up.sent - up.read, highWater - up.input), using: &rng)
            if machine.phase == .connecting || machine.phase == .sending || machine.responseStarted {
                execute(.pumpRequestBody)
            }
        } else if clientEOFSent && !clientEOFSeen {
            clientEOFSeen = true
            execute(machine.clientSentEOF())
        }
    }

    mutating func upstreamConnects() {
        connected = true
        execute(machine.upstreamConnected())
    }

    mutating func originReads() {
        up.received += Int.random(in: 1...up.output, using: &rng)
        execute(.pumpRequestBody)  // the upstream's write callback
    }

    mutating func originSends() {
        down.sent += Int.random(in: 1...(originScript - down.sent), using: &rng)
    }

    mutating func proxyReadsOrigin() {
        if headSent && !headRead {
            headRead = true
            execute(machine.responseHead(untilClose: response.framing == .untilClose, originKeepsConnection: true,
                                         clientKeepsConnection: clientKeepsConnection))
            return
        }
        if down.read < down.sent {
            down.read += Int.random(in: 1...min(down.sent - down.read, highWater - down.input), using: &rng)
            execute(.pumpResponseBody)
        } else if originEOFSent && !originEOFSeen {
            originEOFSeen = true
            execute(machine.originSentEOF())
        }
    }

    mutating func clientReads() {
        if headRead && !headWritten { headWritten = true; return }
        down.received += Int.random(in: 1...down.output, using: &rng)
        execute(.pumpResponseBody)  // the client's write callback
    }

    // MARK: the executor, as HTTP1Session carries actions out

    mutating func execute(_ action: ExchangeStateMachine.Action) {
        switch action {
        case .none:
            break
        case .pumpRequestBody:
            guard machine.phase != .done, !machine.requestComplete else { return }
            let room = highWater - up.output
            guard room > 0 else { return }
            let (step, moved) = relay(request, from: up.relayed, available: up.input, budget: room)
            up.relayed += moved
            execute(machine.requestBodyStep(step))
        case .pumpResponseBody:
            guard case .relaying = machine.phase else { return }
            let room = highWater - down.output
            guard room > 0 else { return }
            let (step, moved) = relay(response, from: down.relayed, available: down.input, budget: room)
            down.relayed += moved
            execute(machine.responseBodyStep(step, unwritten: !headWritten && down.received == 0))
        case .requestSent:
            requestSentAction = true
        case .finish, .refuseRequest, .retractAndAnswerBadGateway, .truncate:
            outcome = action
        case .abort:
            outcome = action
            connectionClosedAbruptly = true
        }
    }

    // MARK: invariants

    func checkInvariants() -> String? {
        if up.relayed > request.validPrefix { return "forwarded request bytes at or past invalid framing" }
        if down.relayed > response.validPrefix { return "relayed response bytes at or past invalid framing" }
        if up.received > up.relayed || down.received > down.relayed { return "a receiver got bytes never relayed" }
        if machine.requestComplete && up.relayed != request.bytes.count { return "request complete with \(up.relayed) of \(request.bytes.count)" }
        return nil
    }

    /// The exchange ended: judge how, then let the client read what was queued (a close after a flush).
    mutating func finish() -> String? {
        guard let outcome else { return nil }
        switch outcome {
        case .finish(let recycle):
            if down.relayed != (response.framing == .untilClose ? down.sent : response.bytes.count) {
                return "finished with \(down.relayed) of \(down.sent) response bytes relayed"
            }
            if response.framing == .untilClose && !originEOFSeen { return "close-delimited body finished before the EOF" }
            if recycle && (!machine.requestComplete || down.input != 0 || originEOFSeen || response.framing == .untilClose) {
                return "recycled an upstream off a message boundary"
            }
            if !machine.requestComplete && machine.keepAlive { return "kept the client connection with the request unread" }
        case .truncate(let reason):
            if reason == .upstreamAborted {
                if !originEOFSeen { return "truncated without the origin's EOF" }
                // Everything the origin sent before its EOF went to the client, but for a cut framing element.
                if response.bytes[down.relayed..<down.sent].contains(.data) {
                    return "truncated with \(down.sent - down.relayed) deliverable bytes left"
                }
                if originStopsAt == nil && response.framing != .untilClose { return "truncated a complete response" }
            } else if !response.hasInvalidFraming {
                return "truncated for bad framing that is not there"
            }
            if machine.keepAlive { return "truncated but kept the connection" }
        case .retractAndAnswerBadGateway:
            if headWritten || down.received > 0 { return "took back a response that had been written" }
            if !response.hasInvalidFraming { return "answered 502 to valid framing" }
        case .refuseRequest:
            if !request.hasInvalidFraming { return "refused valid request framing" }
            if machine.responseStarted { return "refused a request whose response had started" }
        case .abort(let reason):
            if reason == .clientAborted {
                if clientStopsAt == nil { return "aborted a client that sent its whole request" }
                if relay(request, from: up.relayed, available: up.input, budget: Int.max).moved > 0 {
                    return "aborted with deliverable request bytes buffered"
                }
            } else if !request.hasInvalidFraming {
                return "aborted (\(reason)) without a cause"
            }
        default:
            return "ended with \(outcome)"
        }
        // No action after the end.
        var machine = self.machine
        if machine.upstreamConnected() != .none || machine.clientSentEOF() != .none || machine.originSentEOF() != .none
            || machine.requestBodyStep(RelayStep(result: .complete, before: 1, left: 0)) != .none
            || machine.responseBodyStep(RelayStep(result: .complete, before: 1, left: 0), unwritten: true) != .none {
            return "an action after the exchange ended"
        }
        return nil
    }
}

// MARK: - the tunnel world

struct TunnelWorld {
    var rng: SeededGenerator
    let highWater: Int
    /// Bytes each side sends before its EOF (nil: it never half-closes, and the run ends when bytes stop).
    let clientBytes: Int, originBytes: Int
    var machine = TunnelStateMachine(established: true)
    var up = Pipe(), down = Pipe()
    var clientEOFSent = false, originEOFSent = false
    var clientEOFRelayed = false, originEOFRelayed = false
    var closed = false

    init(seed: UInt64) {
        var rng = SeededGenerator(seed: seed &* 31)
        highWater = Int.random(in: 1...32, using: &rng)
        clientBytes = Int.random(in: 0...200, using: &rng)
        originBytes = Int.random(in: 0...200, using: &rng)
        self.rng = rng
    }

    var buffers: TunnelBuffers {
        TunnelBuffers(clientInput: up.input, originOutput: up.output, originInput: down.input, clientOutput: down.output)
    }

    enum Event { case clientSends, originSends, clientCloses, originCloses, proxyReadsClient, proxyReadsOrigin,
                      originReads, clientReads }

    mutating func run() -> String? {
        for _ in 0..<100_000 {
            if closed {
                if up.received != clientBytes || down.received != originBytes {
                    return "closed with \(up.received)/\(clientBytes) up and \(down.received)/\(originBytes) down delivered"
                }
                if machine.nextAction(buffers) != nil { return "an action after close" }
                return nil
            }
            var events: [Event] = []
            if up.sent < clientBytes { events.append(.clientSends) }
            if down.sent < originBytes { events.append(.originSends) }
            if up.sent == clientBytes && !clientEOFSent { events.append(.clientCloses) }
            if down.sent == originBytes && !originEOFSent { events.append(.originCloses) }
            if up.input < highWater && (up.read < up.sent || (clientEOFSent && !machine.clientEnded)) {
                events.append(.proxyReadsClient)
            }
            if down.input < highWater && (down.read < down.sent || (originEOFSent && !machine.originEnded)) {
                events.append(.proxyReadsOrigin)
            }
            if up.output > 0 { events.append(.originReads) }
            if down.output > 0 { events.append(.clientReads) }
            guard let event = events.randomElement(using: &rng) else { return "stuck: \(buffers), \(machine)" }
            switch event {
            case .clientSends: up.sent += Int.random(in: 1...(clientBytes - up.sent), using: &rng)
            case .originSends: down.sent += Int.random(in: 1...(originBytes - down.sent), using: &rng)
            case .clientCloses: clientEOFSent = true
            case .originCloses: originEOFSent = true
            case .proxyReadsClient: proxyReads(client: true)
            case .proxyReadsOrigin: proxyReads(client: false)
            case .originReads:
                up.received += Int.random(in: 1...up.output, using: &rng)
                settle()
            case .clientReads:
                down.received += Int.random(in: 1...down.output, using: &rng)
                settle()
            }
            if machine.originWriteShut && up.received != clientBytes { return "shut the origin's write half early" }
            if machine.clientWriteShut && down.received != originBytes { return "shut the client's write half early" }
        }
        return "no end"
    }

    mutating func proxyReads(client: Bool) {
        if client {
            if up.read < up.sent {
                up.read += Int.random(in: 1...min(up.sent - up.read, highWater - up.input), using: &rng)
            } else {
                machine.clientSentEOF()
            }
        } else {
            if down.read < down.sent {
                down.read += Int.random(in: 1...min(down.sent - down.read, highWater - down.input), using: &rng)
            } else {
                machine.originSentEOF()
            }
        }
        settle()
    }

    /// The executor's pump (both directions, bounded by the watermark), then the machine's actions.
    mutating func settle() {
        let upMove = min(up.input, highWater - up.output)
        if upMove > 0 { up.relayed += upMove }
        let downMove = min(down.input, highWater - down.output)
        if downMove > 0 { down.relayed += downMove }
        while let action = machine.nextAction(buffers) {
            switch action {
            case .shutDownOriginWrite: clientEOFRelayed = true
            case .shutDownClientWrite: originEOFRelayed = true
            case .close: closed = true
            }
        }
    }
}
