import CDatamodeShims
import CLibevent
import COpenSSL
import DatamodeState

/// The TLS client side for `https://` upstreams: one `SSL_CTX` per worker (no sharing), verifying the origin's
/// certificate against the system trust store (`SSL_CERT_FILE` / `SSL_CERT_DIR` override it, as for any
/// OpenSSL client) and its name with `SSL_set1_host`, sending SNI, TLS 1.2 at least.
final class TLSClientContext {
    private let context: OpaquePointer

    /// Whether origins' certificates are verified (`tls.upstream-verify`, SPEC §9).
    let verify: Bool

    init(verify: Bool = true) throws(EngineError) {
        self.verify = verify
        guard let context = SSL_CTX_new(TLS_client_method()) else {
            throw EngineError("SSL_CTX_new failed: \(Self.lastError())")
        }
        self.context = context
        dm_ssl_ctx_min_tls12(context)
        // AES-128-GCM, then ChaCha20, then AES-256-GCM, the order Go and BoringSSL use on CPUs with AES instructions
        // (OpenSSL's own puts AES-256 first): an intercepted download is decrypted from the origin and encrypted for
        // the client, and AES-256's four more rounds a block were 12% of that crypto (issue 31, callgrind of the HTTPS
        // 100 KiB row: 514K against 451K instructions a response). Origins that follow the client's order take it.
        guard dm_ssl_ctx_cipher_order(context, 0) == 1 else {
            SSL_CTX_free(context)
            throw EngineError("cannot set the cipher order: \(Self.lastError())")
        }
        SSL_CTX_set_verify(context, verify ? SSL_VERIFY_PEER : SSL_VERIFY_NONE, nil)
        if SSL_CTX_set_default_verify_paths(context) != 1 {
            SSL_CTX_free(context)
            throw EngineError("cannot load the system trust store: \(Self.lastError())")
        }
    }

    deinit {
        SSL_CTX_free(context)
    }

    /// A new connection state for `host`: SNI (not for IP literals, RFC 6066 §3) and name verification; ALPN
    /// `h2, http/1.1` when `offerH2` (SPEC §17: the origin chooses, `negotiatedH2` says what it chose).
    func makeSSL(host: String, offerH2: Bool = false) -> OpaquePointer? {
        guard let ssl = SSL_new(context) else { return nil }
        if offerH2 {
            let protocols: [UInt8] = [2] + Array("h2".utf8) + [8] + Array("http/1.1".utf8)
            // 0 is success for this one OpenSSL call; without ALPN the origin simply speaks HTTP/1.1.
            _ = SSL_set_alpn_protos(ssl, protocols, UInt32(protocols.count))
        }
        let isIPLiteral = SocketAddress(ipLiteral: host, port: 0) != nil
        if !isIPLiteral { dm_ssl_set_sni(ssl, host) }
        if !verify { return ssl }
        if isIPLiteral {
            let param = SSL_get0_param(ssl)
            X509_VERIFY_PARAM_set1_ip_asc(param, host)
        } else {
            SSL_set1_host(ssl, host)
        }
        return ssl
    }

    /// Whether the origin chose `h2` in the handshake on `ssl`.
    static func negotiatedH2(_ ssl: OpaquePointer) -> Bool {
        var data: UnsafePointer<UInt8>?
        var length: UInt32 = 0
        SSL_get0_alpn_selected(ssl, &data, &length)
        guard let data, length == 2 else { return false }
        return data[0] == UInt8(ascii: "h") && data[1] == UInt8(ascii: "2")
    }

    /// Why the handshake on `bev` failed: a metrics reason, and words an operator can act on.
    static func failure(_ bev: OpaquePointer, ssl: OpaquePointer?, eof: Bool) -> (TLSFailureReason, String) {
        var messages: [String] = []
        while case let code = bufferevent_get_openssl_error(bev), code != 0 { messages.append(errorString(code)) }
        if let ssl {
            let verify = SSL_get_verify_result(ssl)
            if verify != X509_V_OK {
                let text = X509_verify_cert_error_string(verify).map { String(cString: $0) } ?? "error \(verify)"
                return (.verifyFailed, "certificate verification failed: \(text)")
            }
        }
        if messages.isEmpty { return (.closed, eof ? "the origin closed during the TLS handshake" : "TLS handshake failed") }
        return (.protocolError, "TLS handshake failed: " + messages.joined(separator: "; "))
    }

    static func lastError() -> String {
        errorString(ERR_get_error())
    }

    static func errorString(_ code: UInt) -> String {
        var buffer = [CChar](repeating: 0, count: 256)
        ERR_error_string_n(code, &buffer, buffer.count)
        return String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}
