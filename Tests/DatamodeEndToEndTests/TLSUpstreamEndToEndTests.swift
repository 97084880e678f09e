import DatamodeTestSupport
import Foundation
import Testing

/// `https://` upstreams (SPEC §5 variant targets on CDNs, and absolute-form `https://` requests): fetched over
/// TLS with SNI and certificate verification against the trust store; a failure is 502 upstream-tls-error (SPEC §9)
/// whose detail says why. The origin is `openssl s_server -WWW` with a certificate made for the test.
@Suite struct TLSUpstreamEndToEndTests {
    /// A TLS origin (`openssl s_server -WWW`) with a certificate whose CN and only subjectAltName are `localhost`
    /// (so that 127.0.0.1 is a name mismatch), serving two files.
    static func tlsOrigin(_ directory: String) throws -> TLSFileServer {
        let origin = try TLSFileServer(directory: directory, subjectAltName: "DNS:localhost")
        try origin.publish("hello.txt", Array("tls hello\n".utf8))
        try origin.publish("img/a@small.jpg", Array("small over tls\n".utf8))
        return origin
    }

    /// Sends one absolute-form request to the proxy and returns the whole response text (the proxy closes).
    static func request(_ proxyPort: UInt16, _ target: String) throws -> String {
        let client = try RawHTTPClient(port: proxyPort)
        try client.send("GET \(target) HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        return String(decoding: try client.readAll(), as: UTF8.self)
    }

    @Test func httpsUpstreamIsFetchedOverVerifiedTLS() throws {
        let directory = try ScratchDirectory.make("datamode-tls")
        defer { ScratchDirectory.remove(directory) }
        let origin = try Self.tlsOrigin(directory)
        defer { origin.stop() }
        let proxy = try ProxyProcess(environment: ["SSL_CERT_FILE": origin.certificatePath])
        defer { proxy.stop() }
        let text = try Self.request(proxy.port, "https://localhost:\(origin.port)/hello.txt")
        #expect(text.hasPrefix("HTTP/1.1 200"), "\(text)")
        #expect(text.hasSuffix("tls hello\n"))
    }

    @Test func anUntrustedCertificateIsRefusedWithTheReason() throws {
        let directory = try ScratchDirectory.make("datamode-tls")
        defer { ScratchDirectory.remove(directory) }
        let origin = try Self.tlsOrigin(directory)
        defer { origin.stop() }
        // No SSL_CERT_FILE: the system store does not know this self-signed certificate.
        let proxy = try ProxyProcess()
        defer { proxy.stop() }
        let text = try Self.request(proxy.port, "https://localhost:\(origin.port)/hello.txt")
        #expect(text.hasPrefix("HTTP/1.1 502"), "\(text)")
        #expect(text.contains("\"error\":\"upstream-tls-error\""))
        #expect(text.contains("certificate verification failed"))
    }

    @Test func aNameMismatchIsRefusedWithTheReason() throws {
        let directory = try ScratchDirectory.make("datamode-tls")
        defer { ScratchDirectory.remove(directory) }
        let origin = try Self.tlsOrigin(directory)
        defer { origin.stop() }
        let proxy = try ProxyProcess(environment: ["SSL_CERT_FILE": origin.certificatePath])
        defer { proxy.stop() }
        // Trusted certificate, wrong name: 127.0.0.1 is not in its subjectAltName.
        let text = try Self.request(proxy.port, "https://127.0.0.1:\(origin.port)/hello.txt")
        #expect(text.hasPrefix("HTTP/1.1 502"), "\(text)")
        #expect(text.contains("certificate verification failed"))
    }

    @Test func aVariantTargetOnHTTPSIsFetchedOverTLS() throws {
        let directory = try ScratchDirectory.make("datamode-tls")
        defer { ScratchDirectory.remove(directory) }
        let origin = try Self.tlsOrigin(directory)
        defer { origin.stop() }
        let config = """
            mode: constrained
            variants:
              - id: img-small-tls
                match: "http://cdn.example/img/*.jpg"
                target: "https://localhost:\(origin.port)/img/$1@small.jpg"
                when: constrained
            """
        let proxy = try ProxyProcess(config: config, environment: ["SSL_CERT_FILE": origin.certificatePath])
        defer { proxy.stop() }
        let text = try Self.request(proxy.port, "http://cdn.example/img/a.jpg")
        #expect(text.hasPrefix("HTTP/1.1 200"), "\(text)")
        #expect(text.contains("Data-Mode-Variant: img-small-tls"))
        #expect(text.hasSuffix("small over tls\n"))
    }
}
