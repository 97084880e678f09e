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
        tunnel = TunnelStateMachine()
        exchange.bytesCountedWhileFlowing = true
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
        tunnel = TunnelStateMachine(established: true)
        exchange.bytesCountedWhileFlowing = true
        client.machine.tunnel(self)
        pumpTunnel(fromClient: true)
        pumpTunnel(fromClient: false)
    }

    func pumpTunnel(fromClient: Bool) {
        guard let upstream = upstream, tunnel?.phase == .established, upstream.isConnected else { return }
        if fromClient {
            var n = min(evbuffer_get_length(input), Flow.highWater - evbuffer_get_length(upstream.output))
            if n > 0 && budgetMask != 0 { n = budgetRoom(n) }
            if n > 0, let link = link {
                n = shapedBudget(link.up, wanted: n)
                link.up.charge(n, now: worker.clock.nowNanoseconds())
            }
            if n > 0 {
                evbuffer_remove_buffer(input, upstream.output, n)
                worker.metrics.add(bytesIn: n)
                exchange.bytesIn += UInt64(n)
                countOriginBytes(n)
            }
        } else {
            var n = min(evbuffer_get_length(upstream.input), Flow.highWater - outputLength)
            // A link profile's latency is added once per tunnel, before its first byte (SPEC §10).
            guard latencyElapsed(arrived: evbuffer_get_length(upstream.input) > 0) else { return }
            if n > 0 && budgetMask != 0 { n = budgetRoom(n) }
            if n > 0, let link = link {
                n = shapedBudget(link.down, wanted: n)
                link.down.charge(n, now: worker.clock.nowNanoseconds())
            }
            if n > 0 {
                evbuffer_remove_buffer(upstream.input, output, n)
                worker.metrics.add(bytesOut: n)
                exchange.bytesOut += UInt64(n)
                countOriginBytes(n)
            }
        }
    }

    /// Hands an established plain-TCP tunnel to splice(2) once nothing is buffered in user space, so that
    /// order is kept: everything read so far has been written before the kernel takes over.
    func switchTunnelToSpliceIfIdle() {
        guard transport.isPlain, tunnel?.canSplice == true, link == nil, !hasHardBudget(),
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
        if delta > 0 {
            countOriginBytes(delta)
            if index == 0 { worker.metrics.add(bytesIn: delta) } else { worker.metrics.add(bytesOut: delta) }
            if index == 0 { exchange.bytesIn += UInt64(delta) } else { exchange.bytesOut += UInt64(delta) }
        }
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
}
