import CDatamodeShims
import CLibevent
import DatamodeConfig
import DatamodeHTTP
import DatamodePolicy
#if canImport(Glibc)
import Glibc
#endif

/// CONNECT and Upgrade tunnels: establishing, relaying through the buffers or splice(2), and passing each side's
/// EOF on as the tunnel machine says.
extension ExchangeDriver {
    // MARK: CONNECT and Upgrade tunnels

    func beginTunnel(target: RequestTarget) {
        guard worker.settings.connectPorts.contains(target.port) else {
            respondError(.connectPortDenied, detail: "port \(target.port) is not in connect.ports", close: false)
            return
        }
        exchange.outcome = .forwarded
        machine.closeAfter()
        startTunnel(established: false)
        client.machine.tunnel(self)
        let upstream = UpstreamConnection(worker: worker, key: UpstreamKey(host: target.host, port: target.port))
        self.upstream = upstream
        upstream.attach(self)
        upstream.send([], responseTimeoutMs: -1)
        upstream.start()
    }

    /// CONNECT: the upstream TCP connection is up; say so to the client and start relaying.
    func tunnelConnected(_ upstream: UpstreamConnection) {
        guard isTunnelling(upstream), tunnel?.phase == .connecting else { return }
        tunnel?.established()
        if !connectAnswered {
            let head = "HTTP/1.1 200 Connection Established\r\nVia: \(MessageHeads.viaValue)\r\n\r\n"
            _ = head.withCString { evbuffer_add(output, $0, strlen($0)) }
        }
        exchange.status = 200
        // Logged when the tunnel ends (SPEC §8), with the bytes of both directions: see `release()`.
        // Bytes the client sent before our 200 (RFC 9110 §9.3.6 lets a client optimistically send the TLS
        // ClientHello) are relayed now, in order, after the tunnel is established, never interpreted as HTTP.
        pumpTunnel(fromClient: true)
    }

    /// `101 Switching Protocols`: the exchange's upstream becomes the other end of a tunnel.
    func becomeTunnel() {
        machine.closeAfter()
        machine.end()
        startTunnel(established: true)
        client.machine.tunnel(self)
        pumpTunnel(fromClient: true)
        pumpTunnel(fromClient: false)
    }

    /// Relays what one side of the tunnel sent to the other, through the one relay (`relay`): a tunnel is two
    /// bodies delimited by their ends.
    func pumpTunnel(fromClient: Bool) {
        guard let upstream, tunnel?.phase == .established, upstream.isConnected else { return }
        if fromClient {
            _ = relay(.up, &requestBody, from: input, to: upstream.output,
                      room: Flow.highWater - evbuffer_get_length(upstream.output))
        } else {
            // A link profile's latency is added once per tunnel, before its first byte (SPEC §10).
            guard allowance.latencyElapsed(arrived: evbuffer_get_length(upstream.input) > 0, session: client) else { return }
            _ = relay(.down, &responseBody, from: upstream.input, to: output, room: Flow.highWater - outputLength)
        }
    }

    /// Hands an established plain-TCP tunnel to splice(2) once nothing is buffered in user space, so that
    /// order is kept: everything read so far has been written before the kernel takes over.
    func switchTunnelToSpliceIfIdle() {
        guard transport.isPlain, tunnel?.canSplice == true, allowance.allowsSplice(worker.budgets),
              let upstream = upstream,
              upstream.isConnected, upstream.isPlainTCP,
              evbuffer_get_length(input) == 0, outputLength == 0,
              evbuffer_get_length(upstream.input) == 0, evbuffer_get_length(upstream.output) == 0 else { return }
        let clientFD = transport.socket
        let upstreamFD = upstream.socket
        guard let up = SpliceRelay(base: worker.base, source: clientFD, sink: upstreamFD),
              let down = SpliceRelay(base: worker.base, source: upstreamFD, sink: clientFD),
              tunnel?.spliced() == true else { return }
        transport.suspendForSplice()
        upstream.suspendIO()
        up.onProgress = { [unowned self] relay in self.spliceProgressed(relay, index: 0) }
        down.onProgress = { [unowned self] relay in self.spliceProgressed(relay, index: 1) }
        splices = [up, down]
        worker.metrics.tunnelSpliced()
        up.start()
        down.start()
    }

    func spliceProgressed(_ relay: SpliceRelay, index: Int) {
        let delta = Int(relay.moved - splicedBytes[index])
        splicedBytes[index] = relay.moved
        counted(index == 0 ? .up : .down, delta)
        if relay.failed {
            // Relay 0 reads the client and writes the upstream; relay 1 the reverse.
            let clientSide = (index == 0) != relay.failedWriting
            client.abort(clientSide ? .clientAborted : .upstreamAborted, detail: "tunnel relay failed")
        } else if splices.allSatisfy(\.finished), tunnel?.spliceFinished() == .close {
            client.close()
        }
    }

    func tunnelPeerClosed(client: Bool) {
        if client {
            tunnel?.clientSentEOF()
            pumpTunnel(fromClient: true)
        } else {
            tunnel?.originSentEOF()
            pumpTunnel(fromClient: false)
        }
        propagateTunnelEnds()
    }

    /// Passes each side's EOF on once everything it sent before has been written onwards; closes when both
    /// have been (see `TunnelStateMachine`).
    func propagateTunnelEnds() {
        guard let upstream = upstream else { return }
        while let action = tunnel?.nextAction(TunnelBuffers(
            clientInput: evbuffer_get_length(input), originOutput: evbuffer_get_length(upstream.output),
            originInput: evbuffer_get_length(upstream.input), clientOutput: client.unsentOutput)) {
            switch action {
            case .shutDownOriginWrite:
                upstream.shutdownWrite()
            case .shutDownClientWrite:
                // TLS has its own half-close: close_notify (RFC 8446 §6.1); the socket stays open for the other way.
                transport.shutdownWrite()
            case .close:
                client.close()
                return
            }
        }
    }

    /// From here on the exchange is a tunnel: two bodies delimited by their ends, whose bytes are counted in the
    /// metrics as they flow.
    func startTunnel(established: Bool) {
        tunnel = TunnelStateMachine(established: established)
        requestBody = BodyRelay(framing: .untilClose)
        responseBody = BodyRelay(framing: .untilClose)
        exchange.bytesCountedWhileFlowing = true
    }
}
