import CDatamodeShims
import CLibevent
import DatamodeConfig
import DatamodeHTTP
import DatamodePolicy
#if canImport(Glibc)
import Glibc
#endif

/// CONNECT and Upgrade tunnels, as the driver starts them: a CONNECT's upstream connection, a `101`'s upgrade.
/// The tunnel itself is a `Tunnel`.
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
        guard isTunnelling(upstream), let tunnel, tunnel.machine.phase == .connecting else { return }
        tunnel.machine.established()
        if !connectAnswered {
            let head = "HTTP/1.1 200 Connection Established\r\nVia: \(MessageHeads.viaValue)\r\n\r\n"
            _ = head.withCString { evbuffer_add(output, $0, strlen($0)) }
        }
        exchange.status = 200
        // Logged when the tunnel ends (SPEC §8), with the bytes of both directions: see `release()`.
        // Bytes the client sent before our 200 (RFC 9110 §9.3.6 lets a client optimistically send the TLS
        // ClientHello) are relayed now, in order, after the tunnel is established, never interpreted as HTTP.
        tunnel.pump(fromClient: true)
    }

    /// `101 Switching Protocols`: the exchange's upstream becomes the other end of a tunnel.
    func becomeTunnel() {
        machine.closeAfter()
        machine.end()
        startTunnel(established: true)
        client.machine.tunnel(self)
        tunnel?.pump(fromClient: true)
        tunnel?.pump(fromClient: false)
    }

    /// From here on the exchange is a tunnel: two bodies delimited by their ends, whose bytes are counted in the
    /// metrics as they flow.
    func startTunnel(established: Bool) {
        tunnel = Tunnel(driver: self, established: established)
        requestBody = BodyRelay(framing: .untilClose)
        responseBody = BodyRelay(framing: .untilClose)
        exchange.bytesCountedWhileFlowing = true
    }
}
