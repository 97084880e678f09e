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
extension ClientConnection {
    // MARK: CONNECT and Upgrade tunnels

    func beginTunnel(_ exchange: Exchange, target: RequestTarget) {
        guard worker.settings.connectPorts.contains(target.port) else {
            respondError(exchange, .connectPortDenied, detail: "port \(target.port) is not in connect.ports", close: false)
            return
        }
        exchange.outcome = .forwarded
        exchange.machine.closeAfter()
        exchange.tunnel = TunnelStateMachine()
        machine.tunnel(exchange)
        let upstream = UpstreamConnection(worker: worker, key: UpstreamKey(host: target.host, port: target.port))
        exchange.upstream = upstream
        upstream.attach(self)
        upstream.send([], responseTimeoutMs: -1)
        upstream.start()
    }

    /// CONNECT: the upstream TCP connection is up; say so to the client and start relaying.
    func tunnelConnected(_ upstream: UpstreamConnection) {
        guard let exchange = tunnelExchange(of: upstream), exchange.tunnel?.phase == .connecting else { return }
        exchange.tunnel?.established()
        if !exchange.connectAnswered {
            let head = "HTTP/1.1 200 Connection Established\r\nVia: \(MessageHeads.viaValue)\r\n\r\n"
            _ = head.withCString { evbuffer_add(output, $0, strlen($0)) }
        }
        exchange.status = 200
        // Logged when the tunnel ends (SPEC §8), with the bytes of both directions: see `release()`.
        // Bytes the client sent before our 200 (RFC 9110 §9.3.6 lets a client optimistically send the TLS
        // ClientHello) are relayed now, in order, after the tunnel is established, never interpreted as HTTP.
        pumpTunnel(exchange, fromClient: true)
    }

    /// `101 Switching Protocols`: the exchange's upstream becomes the other end of a tunnel.
    func becomeTunnel(_ exchange: Exchange) {
        exchange.machine.closeAfter()
        exchange.machine.end()
        exchange.tunnel = TunnelStateMachine(established: true)
        machine.tunnel(exchange)
        pumpTunnel(exchange, fromClient: true)
        pumpTunnel(exchange, fromClient: false)
    }

    func pumpTunnel(_ exchange: Exchange, fromClient: Bool) {
        guard let upstream = exchange.upstream, exchange.tunnel?.phase == .established, upstream.isConnected else { return }
        if fromClient {
            var n = min(evbuffer_get_length(input), Flow.highWater - evbuffer_get_length(upstream.output))
            if n > 0 && exchange.budgetMask != 0 { n = budgetRoom(exchange, n) }
            if n > 0, let link = exchange.link {
                n = shapedBudget(link.up, wanted: n)
                link.up.charge(n, now: worker.clock.nowNanoseconds())
            }
            if n > 0 {
                evbuffer_remove_buffer(input, upstream.output, n)
                worker.metrics.add(bytesIn: n)
                exchange.bytesIn += UInt64(n)
                countOriginBytes(exchange, n)
            }
        } else {
            var n = min(evbuffer_get_length(upstream.input), Flow.highWater - outputLength)
            // A link profile's latency is added once per tunnel, before its first byte (SPEC §10).
            guard latencyElapsed(exchange, arrived: evbuffer_get_length(upstream.input) > 0) else { return }
            if n > 0 && exchange.budgetMask != 0 { n = budgetRoom(exchange, n) }
            if n > 0, let link = exchange.link {
                n = shapedBudget(link.down, wanted: n)
                link.down.charge(n, now: worker.clock.nowNanoseconds())
            }
            if n > 0 {
                evbuffer_remove_buffer(upstream.input, output, n)
                worker.metrics.add(bytesOut: n)
                exchange.bytesOut += UInt64(n)
                countOriginBytes(exchange, n)
            }
        }
    }

    /// Hands an established plain-TCP tunnel to splice(2) once nothing is buffered in user space, so that
    /// order is kept: everything read so far has been written before the kernel takes over.
    func switchTunnelToSpliceIfIdle(_ exchange: Exchange) {
        guard transport.isPlain, exchange.tunnel?.canSplice == true, exchange.link == nil, !hasHardBudget(exchange),
              let upstream = exchange.upstream,
              upstream.isConnected, upstream.isPlainTCP,
              evbuffer_get_length(input) == 0, outputLength == 0,
              evbuffer_get_length(upstream.input) == 0, evbuffer_get_length(upstream.output) == 0 else { return }
        let clientFD = transport.socket
        let upstreamFD = upstream.socket
        guard let up = SpliceRelay(base: worker.base, source: clientFD, sink: upstreamFD),
              let down = SpliceRelay(base: worker.base, source: upstreamFD, sink: clientFD),
              exchange.tunnel?.spliced() == true else { return }
        transport.suspendForSplice()
        upstream.suspendIO()
        up.onProgress = { [unowned self, unowned exchange] relay in self.spliceProgressed(exchange, relay, index: 0) }
        down.onProgress = { [unowned self, unowned exchange] relay in self.spliceProgressed(exchange, relay, index: 1) }
        exchange.splices = [up, down]
        worker.metrics.tunnelSpliced()
        up.start()
        down.start()
    }

    func spliceProgressed(_ exchange: Exchange, _ relay: SpliceRelay, index: Int) {
        let delta = Int(relay.moved - exchange.splicedBytes[index])
        exchange.splicedBytes[index] = relay.moved
        if delta > 0 {
            countOriginBytes(exchange, delta)
            if index == 0 { worker.metrics.add(bytesIn: delta) } else { worker.metrics.add(bytesOut: delta) }
            if index == 0 { exchange.bytesIn += UInt64(delta) } else { exchange.bytesOut += UInt64(delta) }
        }
        if relay.failed {
            // Relay 0 reads the client and writes the upstream; relay 1 the reverse.
            let clientSide = (index == 0) != relay.failedWriting
            abort(clientSide ? .clientAborted : .upstreamAborted, detail: "tunnel relay failed")
        } else if exchange.splices.allSatisfy(\.finished), exchange.tunnel?.spliceFinished() == .close {
            close()
        }
    }

    func tunnelPeerClosed(_ exchange: Exchange, client: Bool) {
        if client {
            exchange.tunnel?.clientSentEOF()
            pumpTunnel(exchange, fromClient: true)
        } else {
            exchange.tunnel?.originSentEOF()
            pumpTunnel(exchange, fromClient: false)
        }
        propagateTunnelEnds(exchange)
    }

    /// Passes each side's EOF on once everything it sent before has been written onwards; closes when both
    /// have been (see `TunnelStateMachine`).
    func propagateTunnelEnds(_ exchange: Exchange) {
        guard let upstream = exchange.upstream else { return }
        while let action = exchange.tunnel?.nextAction(TunnelBuffers(
            clientInput: evbuffer_get_length(input), originOutput: evbuffer_get_length(upstream.output),
            originInput: evbuffer_get_length(upstream.input), clientOutput: unsentOutput)) {
            switch action {
            case .shutDownOriginWrite:
                upstream.shutdownWrite()
            case .shutDownClientWrite:
                // TLS has its own half-close: close_notify (RFC 8446 §6.1); the socket stays open for the other way.
                transport.shutdownWrite()
            case .close:
                close()
                return
            }
        }
    }
}
