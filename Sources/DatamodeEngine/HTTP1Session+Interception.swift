import CDatamodeShims
import CLibevent
import COpenSSL
import DatamodeConfig
import DatamodeHTTP
import DatamodePolicy
import DatamodeState
#if canImport(Glibc)
import Glibc
#endif

/// HTTPS interception (SPEC §9): a CONNECT to an intercepted host is answered by the proxy itself; a TLS ClientHello
/// behind it is terminated with a leaf of the local CA, and the requests inside run the same HTTP path as any other,
/// each as an absolute-form `https://` request for the tunnel's authority. Anything that is not a ClientHello is
/// relayed blind, as without interception.
///
/// Transport: `ClientTransport.startTLS` puts a `bufferevent_openssl` filter over the client's socket bufferevent.
/// The HTTP path keeps working on an input and an output evbuffer of plaintext; what it must not do under TLS
/// (speculative writes, bulk reads and splice(2) straight on the socket) the transport refuses (`isPlain`).
extension HTTP1Session {
    /// How long the whole thing may take: the ClientHello and the handshake, like a request head.
    func beginInterception(_ driver: ExchangeDriver, target: RequestTarget) {
        guard worker.settings.connectPorts.contains(target.port) else {
            driver.respondError(.connectPortDenied, detail: "port \(target.port) is not in connect.ports", close: false)
            return
        }
        driver.exchange.outcome = .forwarded
        driver.machine.closeAfter()
        driver.exchange.status = 200
        driver.connectAnswered = true
        intercepted = InterceptedTunnel(host: target.host, port: target.port)
        // A transparent connection's CONNECT was implicit (SPEC §16): its client waits for no answer.
        if transparent == nil {
            let head = "HTTP/1.1 200 Connection Established\r\nVia: \(MessageHeads.viaValue)\r\n\r\n"
            _ = head.withCString { evbuffer_add(output, $0, strlen($0)) }
        }
        apply(machine.openInterception(driver))
        // A client may send its ClientHello without waiting for the 200 (RFC 9110 §9.3.6).
        clientHelloReadable(driver)
    }

    /// The first bytes after the 200 decide: a TLS handshake record (content type 22, RFC 8446 §5.1) is terminated;
    /// anything else is relayed blind to the CONNECT target.
    func clientHelloReadable(_ driver: ExchangeDriver) {
        guard transport.isPlain, driver.tunnel == nil, evbuffer_get_length(input) > 0 else { return }
        var first: UInt8 = 0
        evbuffer_copyout(input, &first, 1)
        if first == 0x16 {
            startTLS(driver)
        } else {
            relayBlind(driver)
        }
    }

    private func relayBlind(_ driver: ExchangeDriver) {
        guard let tunnel = intercepted else { return }
        intercepted = nil
        apply(.disarmTimer)
        Tunnel.start(driver, established: false)
        machine.tunnel(driver)
        driver.lease.connectTunnel(key: upstreamKey(host: tunnel.host, port: tunnel.port, tls: false, own: true))
    }

    private func startTLS(_ driver: ExchangeDriver) {
        guard let tunnel = intercepted, let server = worker.tlsServer else { return }
        guard let ssl = server.makeSSL(for: self, host: tunnel.host) else {
            // Only a host the CONNECT parser accepted gets here; a leaf that cannot be made is the proxy's failure.
            worker.metrics.tlsHandshakeFailed(.client, .protocolError)
            driver.exchange.outcome = .error
            driver.exchange.reason = AbortReason.tlsClientRejected.rawValue
            worker.logger.warning("cannot make a leaf certificate", metadata: ["host": "\(tunnel.host)"])
            close()
            return
        }
        guard transport.startTLS(ssl) else {
            worker.metrics.tlsHandshakeFailed(.client, .protocolError)
            driver.exchange.outcome = .error
            driver.exchange.reason = AbortReason.tlsClientRejected.rawValue
            close()
            return
        }
    }

    func interceptionHandshakeCompleted(_ driver: ExchangeDriver) {
        guard let tunnel = intercepted else { return }
        tunnel.established = true
        worker.metrics.tlsIntercepted()
        // The CONNECT's own line: the tunnel was opened and is now read as requests.
        driver.logExchange()
        // HTTP/2 (SPEC §17): the same wire, read by an HTTP/2 session; each stream becomes an exchange.
        if transport.negotiatedProtocol == "h2" {
            HTTP2Session.takeOver(from: self, tunnel: tunnel)
            return
        }
        apply(machine.interceptionEstablished())
        if machine.isReadingHead { processInput() }
    }

    /// The client's handshake failed: it refused the leaf (an alert such as unknown_ca), closed, or spoke
    /// something else. Logged as `tls-client-rejected` and counted (SPEC §9).
    func interceptionHandshakeFailed(_ driver: ExchangeDriver, _ what: Int16) {
        let messages = transport.tlsErrors()
        let reason: TLSFailureReason
        if messages.contains(where: { $0.contains("alert") && ($0.contains("unknown ca") || $0.contains("certificate")) }) {
            reason = .rejectedCertificate
        } else if messages.isEmpty && what & Int16(BEV_EVENT_EOF) != 0 || messages.isEmpty {
            reason = .closed
        } else {
            reason = .protocolError
        }
        worker.metrics.tlsHandshakeFailed(.client, reason)
        driver.exchange.outcome = .error
        driver.exchange.reason = AbortReason.tlsClientRejected.rawValue
        worker.logger.info("tls-client-rejected", metadata: [
            "client": "\(peerText)", "host": "\(intercepted?.serverName ?? intercepted?.host ?? "")",
            "reason": "\(reason.rawValue)", "detail": "\(messages.joined(separator: "; "))",
        ])
        close()
    }
}
