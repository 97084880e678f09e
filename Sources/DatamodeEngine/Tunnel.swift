import CDatamodeShims
import CLibevent
import DatamodeHTTP
#if canImport(Glibc)
import Glibc
#endif

/// A CONNECT or Upgrade tunnel on an exchange: relays both ways through the buffers (the driver's one relay,
/// two until-close bodies), hands itself to splice(2) once nothing is buffered in user space, and passes each
/// side's EOF on as its machine (`TunnelStateMachine`) says.
final class Tunnel {
    /// The driver that owns this (and outlives it): not reference-counted, as it is read on every relay step.
    unowned(unsafe) let driver: ExchangeDriver
    var machine: TunnelStateMachine
    /// Each way is a body delimited by its end, through the driver's one relay.
    private var up = BodyRelay(framing: .untilClose)
    private var down = BodyRelay(framing: .untilClose)
    /// Its splice relays once spliced: 0 reads the client and writes the upstream, 1 the reverse.
    private(set) var splices: [SpliceRelay] = []
    /// Bytes each splice relay had moved at its last report.
    private var splicedBytes = SIMD2<UInt64>(0, 0)

    private init(driver: ExchangeDriver, established: Bool) {
        self.driver = driver
        machine = TunnelStateMachine(established: established)
    }

    // MARK: starting

    /// From here on `driver`'s exchange is a tunnel, whose bytes are counted in the metrics as they flow.
    @discardableResult
    static func start(_ driver: ExchangeDriver, established: Bool) -> Tunnel {
        let tunnel = Tunnel(driver: driver, established: established)
        driver.tunnel = tunnel
        driver.exchange.bytesCountedWhileFlowing = true
        return tunnel
    }

    /// CONNECT: a tunnel to `target` (a port in `connect.ports`), answered `200` once the origin's TCP connection
    /// is up (`connected`).
    static func connect(_ driver: ExchangeDriver, to target: RequestTarget) {
        // A transparent connection that is neither TLS nor HTTP goes wherever it was going (SPEC §16): connect.ports
        // is about what a CONNECT may ask for.
        let anyPort = driver.session.transparent?.kind == .other
        guard anyPort || driver.worker.settings.connectPorts.contains(target.port) else {
            driver.respondError(.connectPortDenied, detail: "port \(target.port) is not in connect.ports", close: false)
            return
        }
        driver.exchange.outcome = .forwarded
        driver.machine.closeAfter()
        start(driver, established: false)
        driver.session.machine.tunnel(driver)
        let key = driver.session.upstreamKey(host: target.host, port: target.port, tls: false, own: true)
        driver.lease.connectTunnel(key: key)
    }

    /// `101 Switching Protocols`: the exchange's upstream becomes the other end of a tunnel.
    static func upgrade(_ driver: ExchangeDriver) {
        driver.machine.closeAfter()
        driver.machine.end()
        let tunnel = start(driver, established: true)
        driver.session.machine.tunnel(driver)
        tunnel.pump(fromClient: true)
        tunnel.pump(fromClient: false)
    }

    /// CONNECT: the upstream TCP connection is up; say so to the client (unless interception already did) and start
    /// relaying. Bytes the client sent before our 200 (RFC 9110 §9.3.6 lets a client optimistically send the TLS
    /// ClientHello) are relayed now, in order, never interpreted as HTTP. The tunnel's line is logged when it ends
    /// (SPEC §8), with the bytes of both directions.
    func connected() {
        guard machine.phase == .connecting else { return }
        machine.established()
        if !driver.connectAnswered {
            let head = "HTTP/1.1 200 Connection Established\r\nVia: \(MessageHeads.viaValue)\r\n\r\n"
            _ = head.withCString { evbuffer_add(driver.output, $0, strlen($0)) }
        }
        driver.exchange.status = 200
        pump(fromClient: true)
    }

    // MARK: relaying

    /// Relays what one side of the tunnel sent to the other.
    func pump(fromClient: Bool) {
        guard let upstream = driver.upstream, machine.phase == .established, upstream.isConnected else { return }
        if fromClient {
            _ = driver.relay(.up, &up, from: driver.input, to: upstream.output,
                             room: Flow.highWater - evbuffer_get_length(upstream.output))
        } else {
            // A link profile's latency is added once per tunnel, before its first byte (SPEC §10).
            guard driver.allowance.latencyElapsed(arrived: evbuffer_get_length(upstream.input) > 0, session: driver.session)
            else { return }
            _ = driver.relay(.down, &down, from: upstream.input, to: driver.output,
                             room: Flow.highWater - driver.outputLength)
        }
    }

    /// After each callback: ends are passed on, and an idle tunnel goes to splice(2).
    func afterFlush() {
        if machine.clientEnded || machine.originEnded { propagateEnds() }
        if !driver.session.released && SpliceRelay.enabled && splices.isEmpty { switchToSpliceIfIdle() }
    }

    /// Hands an established plain-TCP tunnel to splice(2) once nothing is buffered in user space, so that
    /// order is kept: everything read so far has been written before the kernel takes over.
    func switchToSpliceIfIdle() {
        let transport = driver.transport
        guard transport.isPlain, machine.canSplice, driver.allowance.allowsSplice(driver.worker.budgets),
              let upstream = driver.upstream, upstream.isConnected, upstream.isPlainTCP,
              evbuffer_get_length(driver.input) == 0, driver.outputLength == 0,
              evbuffer_get_length(upstream.input) == 0, evbuffer_get_length(upstream.output) == 0 else { return }
        let clientFD = transport.socket
        let upstreamFD = upstream.socket
        let worker = driver.worker
        guard let up = SpliceRelay(base: worker.base, source: clientFD, sink: upstreamFD, pipes: worker.pipes),
              let down = SpliceRelay(base: worker.base, source: upstreamFD, sink: clientFD, pipes: worker.pipes),
              machine.spliced() else { return }
        transport.suspendForSplice()
        upstream.suspendIO()
        up.onProgress = { [unowned self] relay in self.spliceProgressed(relay, index: 0) }
        down.onProgress = { [unowned self] relay in self.spliceProgressed(relay, index: 1) }
        splices = [up, down]
        driver.worker.metrics.tunnelSpliced()
        up.start()
        down.start()
    }

    private func spliceProgressed(_ relay: SpliceRelay, index: Int) {
        let delta = Int(relay.moved - splicedBytes[index])
        splicedBytes[index] = relay.moved
        driver.counted(index == 0 ? .up : .down, delta)
        if relay.failed {
            // Relay 0 reads the client and writes the upstream; relay 1 the reverse.
            let clientSide = (index == 0) != relay.failedWriting
            driver.session.abort(clientSide ? .clientAborted : .upstreamAborted, detail: "tunnel relay failed")
        } else if splices.allSatisfy(\.finished), machine.spliceFinished() == .close {
            driver.session.close()
        }
    }

    /// One side sent its EOF: what it sent before goes on, then the EOF.
    func peerClosed(client: Bool) {
        if client {
            machine.clientSentEOF()
            pump(fromClient: true)
        } else {
            machine.originSentEOF()
            pump(fromClient: false)
        }
        propagateEnds()
    }

    /// Passes each side's EOF on once everything it sent before has been written onwards; closes when both
    /// have been (see `TunnelStateMachine`).
    func propagateEnds() {
        guard let upstream = driver.upstream else { return }
        while let action = machine.nextAction(TunnelBuffers(
            clientInput: evbuffer_get_length(driver.input), originOutput: evbuffer_get_length(upstream.output),
            originInput: evbuffer_get_length(upstream.input), clientOutput: driver.session.unsentOutput)) {
            switch action {
            case .shutDownOriginWrite:
                upstream.shutdownWrite()
            case .shutDownClientWrite:
                // TLS has its own half-close: close_notify (RFC 8446 §6.1); the socket stays open for the other way.
                driver.transport.shutdownWrite()
            case .close:
                driver.session.close()
                return
            }
        }
    }

    /// The session is freed: the splice relays stop, and the machine knows the tunnel failed.
    func stop() {
        for relay in splices { relay.stop() }
        splices = []
        machine.fail()
    }
}
