import CDatamodeShims
import CLibevent
import COpenSSL
import DatamodeConfig
import DatamodeHTTP
import DatamodePolicy
#if canImport(Glibc)
import Glibc
#endif

/// HTTPS interception (SPEC §9): a CONNECT to an intercepted host is answered by the proxy itself; a TLS ClientHello
/// behind it is terminated with a leaf of the local CA, and the requests inside run the same HTTP path as any other,
/// each as an absolute-form `https://` request for the tunnel's authority. Anything that is not a ClientHello is
/// relayed blind, as without interception.
///
/// Transport: `bufferevent_openssl` as a filter over the client's socket bufferevent. The ClientHello is already in
/// that bufferevent's input when the decision is made (the first byte was read to make it), and a filter consumes
/// bytes already buffered, where a new socket TLS bufferevent would have lost them. The HTTP path keeps working on
/// an input and an output evbuffer of plaintext; what it must not do under TLS (speculative writes, bulk reads and
/// splice(2) straight on the socket) is switched off by `clientIsPlain`.
extension ClientConnection {
    /// How long the whole thing may take: the ClientHello and the handshake, like a request head.
    func beginInterception(_ exchange: Exchange, target: RequestTarget) {
        guard worker.settings.connectPorts.contains(target.port) else {
            respondError(exchange, .connectPortDenied, detail: "port \(target.port) is not in connect.ports", close: false)
            return
        }
        exchange.outcome = .forwarded
        exchange.machine.closeAfter()
        exchange.status = 200
        exchange.connectAnswered = true
        intercepted = InterceptedTunnel(host: target.host, port: target.port)
        let head = "HTTP/1.1 200 Connection Established\r\nVia: \(MessageHeads.viaValue)\r\n\r\n"
        _ = head.withCString { evbuffer_add(output, $0, strlen($0)) }
        apply(machine.openInterception(exchange))
        // A client may send its ClientHello without waiting for the 200 (RFC 9110 §9.3.6).
        clientHelloReadable(exchange)
    }

    /// The first bytes after the 200 decide: a TLS handshake record (content type 22, RFC 8446 §5.1) is terminated;
    /// anything else is relayed blind to the CONNECT target.
    func clientHelloReadable(_ exchange: Exchange) {
        guard intercepted?.ssl == nil, exchange.tunnel == nil, evbuffer_get_length(input) > 0 else { return }
        var first: UInt8 = 0
        evbuffer_copyout(input, &first, 1)
        if first == 0x16 {
            startTLS(exchange)
        } else {
            relayBlind(exchange)
        }
    }

    private func relayBlind(_ exchange: Exchange) {
        guard let tunnel = intercepted else { return }
        intercepted = nil
        apply(.disarmTimer)
        exchange.tunnel = TunnelStateMachine()
        machine.tunnel(exchange)
        let upstream = UpstreamConnection(worker: worker, key: UpstreamKey(host: tunnel.host, port: tunnel.port))
        exchange.upstream = upstream
        upstream.attach(self)
        upstream.send([], responseTimeoutMs: -1)
        upstream.start()
    }

    private func startTLS(_ exchange: Exchange) {
        guard let tunnel = intercepted, let server = worker.tlsServer else { return }
        guard let ssl = server.makeSSL(for: self, host: tunnel.host) else {
            // Only a host the CONNECT parser accepted gets here; a leaf that cannot be made is the proxy's failure.
            worker.metrics.tlsHandshakeFailed(.client, .protocolError)
            exchange.outcome = .error
            exchange.reason = AbortReason.tlsClientRejected.rawValue
            worker.logger.warning("cannot make a leaf certificate", metadata: ["host": "\(tunnel.host)"])
            close()
            return
        }
        let socketBev = bev
        // The speculative writer may have left EV_WRITE on the socket; the filter drives the socket from now on.
        writer = SpeculativeWriter()
        guard let filter = bufferevent_openssl_filter_new(worker.base, socketBev, ssl, BUFFEREVENT_SSL_ACCEPTING,
                                                          TLSBuffereventOptions) else {
            SSL_free(ssl)
            worker.metrics.tlsHandshakeFailed(.client, .protocolError)
            exchange.outcome = .error
            exchange.reason = AbortReason.tlsClientRejected.rawValue
            close()
            return
        }
        tunnel.ssl = ssl
        socketOutput = bufferevent_get_output(socketBev)
        // The filter encrypts only while its socket holds less than this (libevent checks the underlying's write
        // high watermark), so a slow client keeps the plaintext in the filter's output, where backpressure sees it,
        // and at most this much ciphertext waits for the socket.
        bufferevent_setwatermark(socketBev, Int16(EV_WRITE), Flow.lowWater, Flow.highWater)
        // Many clients end a TLS connection without close_notify once they have what they wanted; between
        // requests that is an ordinary close, not an error. (Origins do not get this leniency: see UpstreamConnection.)
        bufferevent_openssl_set_allow_dirty_shutdown(filter, 1)
        adoptBufferevent(filter)
        // The ClientHello already sits in the socket bufferevent's input, and no new byte will come before the
        // client hears from us: run the handshake on it now.
        bufferevent_trigger(socketBev, Int16(EV_READ), Int32(BEV_TRIG_IGNORE_WATERMARKS.rawValue))
    }

    /// Makes `filter` the client's bufferevent, with the same callbacks, watermarks and limits as the socket's.
    private func adoptBufferevent(_ filter: OpaquePointer) {
        replaceBufferevent(filter)
        bufferevent_setcb(filter, clientReadCallback, clientWriteCallback, clientEventCallback, context(self))
        bufferevent_setwatermark(filter, Int16(EV_READ), 0, Flow.highWater)
        bufferevent_setwatermark(filter, Int16(EV_WRITE), Flow.lowWater, 0)
        bufferevent_set_max_single_read(filter, Flow.maxSingleIO)
        bufferevent_set_max_single_write(filter, Flow.maxSingleIO)
        // TLS keeps libevent's own write path (its output is plaintext, see SpeculativeWriter).
        bufferevent_enable(filter, Int16(EV_READ | EV_WRITE))
    }

    func interceptionHandshakeCompleted(_ exchange: Exchange) {
        guard let tunnel = intercepted else { return }
        tunnel.established = true
        worker.metrics.tlsIntercepted()
        // The CONNECT's own line: the tunnel was opened and is now read as requests.
        logExchange(exchange)
        apply(machine.interceptionEstablished())
        if machine.isReadingHead { processInput() }
    }

    /// The client's handshake failed: it refused the leaf (an alert such as unknown_ca), closed, or spoke
    /// something else. Logged as `tls-client-rejected` and counted (SPEC §9).
    func interceptionHandshakeFailed(_ exchange: Exchange, _ what: Int16) {
        var messages: [String] = []
        while case let code = bufferevent_get_openssl_error(bev), code != 0 { messages.append(TLSClientContext.errorString(code)) }
        let reason: TLSFailureReason
        if messages.contains(where: { $0.contains("alert") && ($0.contains("unknown ca") || $0.contains("certificate")) }) {
            reason = .rejectedCertificate
        } else if messages.isEmpty && what & Int16(BEV_EVENT_EOF) != 0 || messages.isEmpty {
            reason = .closed
        } else {
            reason = .protocolError
        }
        worker.metrics.tlsHandshakeFailed(.client, reason)
        exchange.outcome = .error
        exchange.reason = AbortReason.tlsClientRejected.rawValue
        worker.logger.info("tls-client-rejected", metadata: [
            "client": "\(peerText)", "host": "\(intercepted?.serverName ?? intercepted?.host ?? "")",
            "reason": "\(reason.rawValue)", "detail": "\(messages.joined(separator: "; "))",
        ])
        close()
    }

    /// Sends close_notify and writes it to the socket at once (the connection is being freed; the alert is a
    /// few dozen bytes, which an idle socket's buffer always takes).
    func sendCloseNotify(_ ssl: OpaquePointer) {
        SSL_shutdown(ssl)
        guard let underlying = bufferevent_get_underlying(bev) else { return }
        let pending = bufferevent_get_output(underlying)!
        let fd = bufferevent_getfd(underlying)
        guard fd >= 0, evbuffer_get_length(pending) > 0 else { return }
        evbuffer_unfreeze(pending, 1)
        evbuffer_write(pending, fd)
        evbuffer_freeze(pending, 1)
    }
}
