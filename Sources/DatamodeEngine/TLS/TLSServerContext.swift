import CDatamodeShims
import CLibevent
import COpenSSL
import DatamodeState

/// The TLS server side of interception (SPEC §9), one per worker (no sharing, no locks): an `SSL_CTX` made once
/// and reused for every intercepted connection, the SNI callback that picks the leaf, ALPN (`h2` or `http/1.1`),
/// and the worker's cache of minted leaves.
///
/// Session resumption: OpenSSL issues stateless session tickets by default and this context also keeps a
/// bounded server-side session cache, so a client that comes back to the same worker skips the full handshake.
final class TLSServerContext {
    let context: OpaquePointer
    let authority: CertificateAuthority
    let leaves: LeafCache

    init(authority: CertificateAuthority, clock: any EngineClock, cacheCapacity: Int = 1024) throws(EngineError) {
        guard let context = SSL_CTX_new(TLS_server_method()) else {
            throw EngineError("SSL_CTX_new (server) failed: \(TLSClientContext.lastError())")
        }
        self.context = context
        self.authority = authority
        self.leaves = LeafCache(authority: authority, clock: clock, capacity: cacheCapacity)
        dm_ssl_ctx_min_tls12(context)
        // AES-128-GCM first (`TLSClientContext` says why); the proxy's order decides, but for a client that lists
        // ChaCha20 first (one without AES instructions, as Go and BoringSSL servers also allow).
        guard dm_ssl_ctx_cipher_order(context, 1) == 1 else {
            SSL_CTX_free(context)
            throw EngineError("cannot set the cipher order (server): \(TLSClientContext.lastError())")
        }
        dm_ssl_ctx_server_session_cache(context, 4096)
        // The session id context makes cached sessions resumable (OpenSSL refuses to resume without one).
        let sessionContext = Array("datamode-proxy".utf8)
        SSL_CTX_set_session_id_context(context, sessionContext, UInt32(sessionContext.count))
        // Every leaf has the same key: set it once, the certificate is chosen per connection.
        guard SSL_CTX_use_PrivateKey(context, authority.leafKey) == 1 else {
            SSL_CTX_free(context)
            throw EngineError("cannot use the leaf key: \(TLSClientContext.lastError())")
        }
        dm_ssl_ctx_set_servername_callback(context, tlsServerNameCallback)
        SSL_CTX_set_alpn_select_cb(context, tlsALPNSelectCallback, nil)
    }

    deinit {
        SSL_CTX_free(context)
    }

    /// A connection state for a client whose CONNECT named `host`; the SNI callback may pick another leaf.
    /// The leaf for `host` is set now, so that a client without SNI gets it (SPEC §9: the CONNECT host).
    func makeSSL(for connection: HTTP1Session, host: String) -> OpaquePointer? {
        guard let leaf = leaves.leaf(for: host), let ssl = SSL_new(context) else { return nil }
        guard SSL_use_certificate(ssl, leaf) == 1 else {
            SSL_free(ssl)
            return nil
        }
        SSL_set_ex_data(ssl, 0, DatamodeEngine.context(connection))
        return ssl
    }

    /// The SNI callback: the leaf for the name the client asked for, when it differs from the CONNECT host.
    /// A name that cannot be a host (or whose leaf cannot be made) ends the handshake with `unrecognized_name`.
    static func serverName(_ ssl: OpaquePointer, alert: UnsafeMutablePointer<Int32>?) -> Int32 {
        guard let raw = SSL_get_servername(ssl, TLSEXT_NAMETYPE_host_name) else { return SSL_TLSEXT_ERR_OK }
        let name = String(cString: raw).lowercased()
        guard let pointer = SSL_get_ex_data(ssl, 0) else { return SSL_TLSEXT_ERR_OK }
        let connection = owner(pointer, as: HTTP1Session.self)
        guard let tunnel = connection.intercepted, name != tunnel.host else { return SSL_TLSEXT_ERR_OK }
        guard let server = connection.worker.tlsServer, let leaf = server.leaves.leaf(for: name),
              SSL_use_certificate(ssl, leaf) == 1 else {
            alert?.pointee = SSL_AD_UNRECOGNIZED_NAME
            return SSL_TLSEXT_ERR_ALERT_FATAL
        }
        tunnel.serverName = name
        return SSL_TLSEXT_ERR_OK
    }

    /// ALPN (RFC 7301), the server's preference: `h2` when the client offers it and `offeringH2` (SPEC §17,
    /// `http2.client`), else `http/1.1` when offered; otherwise no ALPN at all (the client then speaks HTTP/1.1,
    /// RFC 7301 §3.2 allows the server to ignore the extension).
    static func selectALPN(_ out: UnsafeMutablePointer<UnsafePointer<UInt8>?>?, _ outLength: UnsafeMutablePointer<UInt8>?,
                           _ offered: UnsafePointer<UInt8>?, _ offeredLength: UInt32, offeringH2: Bool) -> Int32 {
        guard let offered, let out, let outLength else { return SSL_TLSEXT_ERR_NOACK }
        let preferences: [[UInt8]] = offeringH2 ? [Array("h2".utf8), Array("http/1.1".utf8)] : [Array("http/1.1".utf8)]
        for wanted in preferences {
            var i = 0
            let n = Int(offeredLength)
            while i < n {
                let length = Int(offered[i])
                let start = i + 1
                guard start + length <= n else { break }
                if length == wanted.count && (0..<length).allSatisfy({ offered[start + $0] == wanted[$0] }) {
                    out.pointee = offered + start
                    outLength.pointee = UInt8(length)
                    return SSL_TLSEXT_ERR_OK
                }
                i = start + length
            }
        }
        return SSL_TLSEXT_ERR_NOACK
    }
}

/// The intercepted tunnel a client connection's requests come from (SPEC §9): each request inside is handled as an
/// absolute-form `https://` request for this authority.
final class InterceptedTunnel {
    /// The CONNECT target: lowercased host (IPv6 without brackets) and port.
    let host: String
    let port: UInt16
    /// The SNI name the client asked for, when it differs from `host`.
    var serverName: String?
    /// The handshake completed.
    var established = false
    /// The user the CONNECT authenticated as (`access.users`); the requests inside carry no credentials of their own.
    var proxyUser: String?
    /// The link profile's latency was added to a request inside (SPEC §10: once per tunnel).
    var latencyAdded = false
    /// `Host` as an absolute URL spells it: host, `:port` unless 443; IPv6 in brackets.
    let authority: String

    init(host: String, port: UInt16) {
        self.host = host
        self.port = port
        let bracketed = host.contains(":") ? "[\(host)]" : host
        authority = port == 443 ? bracketed : "\(bracketed):\(port)"
    }
}

/// Minted leaves of one worker, by host name, bounded (least recently used evicted). A leaf close to the end of its
/// validity is minted again.
final class LeafCache {
    private struct Entry {
        var certificate: OpaquePointer
        var notAfter: Int64
        var lastUse: UInt64
    }

    private let authority: CertificateAuthority
    private let clock: any EngineClock
    let capacity: Int
    private var entries: [String: Entry] = [:]
    private var uses: UInt64 = 0
    /// Leaves minted by this worker (for tests and the bench).
    private(set) var minted = 0

    init(authority: CertificateAuthority, clock: any EngineClock, capacity: Int) {
        self.authority = authority
        self.clock = clock
        self.capacity = max(1, capacity)
    }

    deinit {
        for entry in entries.values { X509_free(entry.certificate) }
    }

    var count: Int { entries.count }

    /// The leaf for `host` (X509*, owned by the cache), minted on first use. `nil` for an impossible name.
    func leaf(for host: String) -> OpaquePointer? {
        uses += 1
        let now = clock.wallNanoseconds() / 1_000_000_000
        if var entry = entries[host], entry.notAfter - now > 86400 {
            entry.lastUse = uses
            entries[host] = entry
            return entry.certificate
        }
        guard let (certificate, notAfter) = authority.mintLeaf(for: host, now: now) else { return nil }
        minted += 1
        if let old = entries.removeValue(forKey: host) { X509_free(old.certificate) }
        if entries.count >= capacity, let oldest = entries.min(by: { $0.value.lastUse < $1.value.lastUse }) {
            // Eviction happens only on a mint, which costs far more than this scan.
            X509_free(oldest.value.certificate)
            entries.removeValue(forKey: oldest.key)
        }
        entries[host] = Entry(certificate: certificate, notAfter: notAfter, lastUse: uses)
        return certificate
    }
}
