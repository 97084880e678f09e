import CDatamodeShims
import CLibevent
import DatamodeHTTP
import DatamodeState
#if canImport(Glibc)
import Glibc
#endif

/// A connection on the transparent listener (SPEC §16): the kernel redirected it to the proxy, and where it was
/// going is read back from the socket. Every connection to the origin it causes goes to that address, never to
/// a lookup of the Host or SNI name the client wrote: a forged name must not steer the connection elsewhere.
final class TransparentConnection {
    /// The original destination (`SO_ORIGINAL_DST` / `IP6T_SO_ORIGINAL_DST`).
    let destination: PinnedDestination
    /// What the first bytes were; nil until they are known.
    var kind: TransparentKind?
    /// Fires when a client sent nothing at all within `serverFirstAfterMs`: a protocol where the server speaks
    /// first (SMTP, SSH banners, databases), relayed blind.
    var timer: OpaquePointer?

    /// Whether a variant's `target` is on the origin of the request it stands in for (`url`): then it is fetched
    /// from the same original destination.
    static func isSameOrigin(_ url: String, _ target: RequestTarget) -> Bool {
        guard case .success(let original) = RequestTarget.parse(url, method: "GET") else { return false }
        return original.scheme == target.scheme && original.host == target.host && original.port == target.port
    }

    /// The implicit `CONNECT` of a connection whose first bytes are TLS (to its SNI name, `serverName`) or
    /// anything else (to the destination address), with the destination's port; nil when it does not parse (only a
    /// validated name or an address gets here: that is the proxy's bug). Also returns the authority it names.
    func connectHead(serverName: String?, limits: HTTPLimits) -> (authority: String, head: RequestHead?) {
        let authority = serverName.map { "\($0):\(destination.port)" } ?? self.authority
        let line = "CONNECT \(authority) HTTP/1.1\r\nHost: \(authority)\r\n\r\n"
        let parsed = Array(line.utf8).withUnsafeBytes { HTTP1Parser.parseRequestHead($0, limits: limits) }
        guard case .complete(let head, _) = parsed else { return (authority, nil) }
        return (authority, head)
    }

    /// How long a client may stay silent before its connection is taken as server-first and relayed blind (Istio's
    /// protocol detection waits 100 ms in the same spot; clients of HTTP and TLS speak at once after connecting).
    static let serverFirstAfterMs: Int64 = 500

    init(destination: PinnedDestination) {
        self.destination = destination
    }

    /// `host:port` for a request line: IPv6 in brackets.
    var authority: String {
        let host = destination.address.contains(":") ? "[\(destination.address)]" : destination.address
        return "\(host):\(destination.port)"
    }
}

extension HTTP1Session {
    // MARK: the opening: what the first bytes are

    /// Before the first request: arms the server-first timer.
    func startTransparent() {
        // Only while the first bytes are unknown: an HTTP/2 stream's session shares its connection's, long classified.
        guard let transparent, transparent.kind == nil else { return }
        transparent.timer = dm_timer_new(worker.base, transparentTimerCallback, context(self))
        if let timer = transparent.timer { dm_event_add_ms(timer, TransparentConnection.serverFirstAfterMs) }
    }

    /// Whether the connection still waits for its first bytes to be classified.
    var isTransparentOpening: Bool { transparent != nil && transparent?.kind == nil }

    /// Bytes arrived (or the client's EOF, `atEnd`) before the connection's kind is known: classify what is
    /// buffered, without draining it (the bytes stay for whichever path takes the connection).
    func transparentOpeningReadable(atEnd: Bool = false) {
        guard let transparent, transparent.kind == nil else { return }
        let available = evbuffer_get_length(input)
        if available > 0 {
            stopServerFirstTimer()
            // The head timer (`client-header`) bounds a client that starts and never finishes.
            apply(machine.headBytesBuffered(now: now()))
        } else if atEnd {
            // Connected and closed without a byte: nothing to relay, nothing to log but the connection.
            close()
            return
        }
        let length = min(available, TransparentOpening.peekLimit)
        let opening: TransparentOpening
        if let front = evbuffer_pullup(input, length) {
            opening = TransparentOpening.classify(UnsafeRawBufferPointer(start: front, count: length),
                                                  requestLineLimit: worker.settings.limits.requestLine, atEnd: atEnd)
        } else {
            opening = atEnd ? .other : .needMore
        }
        switch opening {
        case .needMore:
            // More bytes will come, bounded by the read watermark and client-header; a head as large as the peek
            // limit that is still undecided is no HTTP or TLS opening.
            if available >= TransparentOpening.peekLimit { beginTransparentTunnel(serverName: nil, kind: .other) }
        case .http:
            transparent.kind = .http
            worker.metrics.transparentConnection(.http)
            processInput()
        case .tls(let serverName):
            beginTransparentTunnel(serverName: serverName, kind: .tlsTunnel)
        case .other:
            beginTransparentTunnel(serverName: nil, kind: .other)
        }
    }

    /// The client said nothing for `serverFirstAfterMs`: the server speaks first; relay blind.
    func transparentTimerFired() {
        guard isTransparentOpening, evbuffer_get_length(input) == 0 else { return }
        beginTransparentTunnel(serverName: nil, kind: .other)
    }

    func stopServerFirstTimer() {
        guard let timer = transparent?.timer else { return }
        event_free(timer)
        transparent?.timer = nil
    }

    /// A TLS ClientHello (`kind` `.tlsTunnel` until interception says otherwise) or anything else: an implicit
    /// `CONNECT host:port`, where `host` is the SNI name (else the destination address) and `port` the destination
    /// port. Admission judges it as any CONNECT (host rules, `connect.ports`, `tls.intercept` / `tls.bypass`;
    /// `other` is never intercepted and not limited to `connect.ports`); its upstream goes to the destination.
    /// A refusal cannot be told to a client that speaks TLS or an unknown protocol: the connection is closed,
    /// and the refusal logged.
    private func beginTransparentTunnel(serverName: String?, kind: TransparentKind) {
        guard let transparent else { return }
        stopServerFirstTimer()
        transparent.kind = kind
        let (authority, parsed) = transparent.connectHead(serverName: serverName, limits: worker.settings.limits)
        let started = headStarted()
        worker.refreshSnapshot()
        guard let head = parsed else {
            // Only a validated name or an address gets here; a head that does not parse is the proxy's bug.
            worker.logger.error("transparent: cannot make a CONNECT head", metadata: ["authority": "\(authority)"])
            close()
            return
        }
        let exchange = Exchange(clientVersion: .http11, method: head.method, url: head.target, startedAt: started)
        exchange.source = .transparent
        let driver = ExchangeDriver(session: self, exchange: exchange)
        // Nothing is ever answered on the wire before the tunnel: the client did not ask for a CONNECT.
        driver.connectAnswered = true
        driver.begin(head, source: .transparent(kind == .other ? .other : .tls))
        if intercepted != nil {
            transparent.kind = .tlsIntercepted
        } else if driver.tunnel == nil {
            // Refused (host rule, data mode, connect.ports, access): whatever the driver queued is HTTP the client
            // cannot read. Drop it and close; the line says why.
            evbuffer_drain(output, evbuffer_get_length(output))
            close()
        }
        worker.metrics.transparentConnection(transparent.kind ?? kind)
    }

    // MARK: the upstream

    /// Where a request of this connection goes: to the original destination when the connection is transparent
    /// and the target is the origin the client named (`own`: its own target, or a variant's on the same origin);
    /// a variant's target elsewhere (the proxy's configuration, not the client's) is resolved as usual.
    func upstreamKey(host: String, port: UInt16, tls: Bool, own: Bool) -> UpstreamKey {
        onWorker { $0.upstreamKey(host: host, port: port, tls: tls, pinned: own ? transparent?.destination : nil) }
    }
}
