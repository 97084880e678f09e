import DatamodeTestSupport
import Foundation
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// `https://` upstreams (SPEC §5 variant targets on CDNs, and absolute-form `https://` requests): fetched over
/// TLS with SNI and certificate verification against the trust store; a failure is 502 upstream-unreachable
/// whose detail says why. The origin is `openssl s_server -WWW` with a certificate made for the test.
@Suite struct TLSUpstreamEndToEndTests {
    /// A TLS origin serving files from a directory, with its certificate (CN and SAN `localhost`).
    final class TLSOrigin {
        let directory: String
        let certificate: String
        let port: UInt16
        let process: Process

        init() throws {
            directory = FileManager.default.temporaryDirectory.appendingPathComponent("datamode-tls-\(UUID().uuidString.prefix(8))").path
            try FileManager.default.createDirectory(atPath: directory + "/www/img", withIntermediateDirectories: true)
            certificate = directory + "/cert.pem"
            let key = directory + "/key.pem"
            let generate = Process()
            generate.executableURL = URL(fileURLWithPath: "/usr/bin/openssl")
            generate.arguments = ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost",
                                  "-addext", "subjectAltName=DNS:localhost", "-days", "1", "-keyout", key, "-out", certificate]
            generate.standardOutput = FileHandle.nullDevice
            generate.standardError = FileHandle.nullDevice
            try generate.run()
            generate.waitUntilExit()
            try "tls hello\n".write(toFile: directory + "/www/hello.txt", atomically: true, encoding: .utf8)
            try "small over tls\n".write(toFile: directory + "/www/img/a@small.jpg", atomically: true, encoding: .utf8)
            port = try Self.freePort()
            process = Process()
            process.executableURL = URL(fileURLWithPath: "/usr/bin/openssl")
            process.arguments = ["s_server", "-accept", "127.0.0.1:\(port)", "-cert", certificate, "-key", key, "-WWW", "-quiet"]
            process.currentDirectoryURL = URL(fileURLWithPath: directory + "/www")
            process.standardOutput = FileHandle.nullDevice
            process.standardError = FileHandle.nullDevice
            process.standardInput = FileHandle.nullDevice
            try process.run()
            try Self.waitUntilListening(port)
        }

        func stop() {
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }

        /// A port nothing listens on right now (bind to 0, read, close); s_server cannot report a chosen port.
        static func freePort() throws -> UInt16 {
            let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            defer { close(fd) }
            var address = sockaddr_in()
            address.sin_family = sa_family_t(AF_INET)
            address.sin_addr.s_addr = inet_addr("127.0.0.1")
            var length = socklen_t(MemoryLayout<sockaddr_in>.size)
            _ = withUnsafeMutablePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) } }
            _ = withUnsafeMutablePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) } }
            return UInt16(bigEndian: address.sin_port)
        }

        static func waitUntilListening(_ port: UInt16) throws {
            for _ in 0..<200 {
                let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
                var address = sockaddr_in()
                address.sin_family = sa_family_t(AF_INET)
                address.sin_port = port.bigEndian
                address.sin_addr.s_addr = inet_addr("127.0.0.1")
                let result = withUnsafeMutablePointer(to: &address) {
                    $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
                }
                close(fd)
                if result == 0 { return }
                usleep(25_000)
            }
            throw ProxyProcess.LaunchError(description: "openssl s_server did not start on port \(port)")
        }
    }

    /// Sends one absolute-form request to the proxy and returns the whole response text (the proxy closes).
    static func request(_ proxyPort: UInt16, _ target: String) throws -> String {
        let client = try RawHTTPClient(port: proxyPort)
        try client.send("GET \(target) HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        return String(decoding: try client.readAll(), as: UTF8.self)
    }

    @Test func httpsUpstreamIsFetchedOverVerifiedTLS() throws {
        let origin = try TLSOrigin()
        defer { origin.stop() }
        let proxy = try ProxyProcess(environment: ["SSL_CERT_FILE": origin.certificate])
        defer { proxy.stop() }
        let text = try Self.request(proxy.port, "https://localhost:\(origin.port)/hello.txt")
        #expect(text.hasPrefix("HTTP/1.1 200"), "\(text)")
        #expect(text.hasSuffix("tls hello\n"))
    }

    @Test func anUntrustedCertificateIsRefusedWithTheReason() throws {
        let origin = try TLSOrigin()
        defer { origin.stop() }
        // No SSL_CERT_FILE: the system store does not know this self-signed certificate.
        let proxy = try ProxyProcess()
        defer { proxy.stop() }
        let text = try Self.request(proxy.port, "https://localhost:\(origin.port)/hello.txt")
        #expect(text.hasPrefix("HTTP/1.1 502"), "\(text)")
        #expect(text.contains("\"error\":\"upstream-unreachable\""))
        #expect(text.contains("certificate verification failed"))
    }

    @Test func aNameMismatchIsRefusedWithTheReason() throws {
        let origin = try TLSOrigin()
        defer { origin.stop() }
        let proxy = try ProxyProcess(environment: ["SSL_CERT_FILE": origin.certificate])
        defer { proxy.stop() }
        // Trusted certificate, wrong name: 127.0.0.1 is not in its subjectAltName.
        let text = try Self.request(proxy.port, "https://127.0.0.1:\(origin.port)/hello.txt")
        #expect(text.hasPrefix("HTTP/1.1 502"), "\(text)")
        #expect(text.contains("certificate verification failed"))
    }

    @Test func aVariantTargetOnHTTPSIsFetchedOverTLS() throws {
        let origin = try TLSOrigin()
        defer { origin.stop() }
        let config = """
            mode: constrained
            variants:
              - id: img-small-tls
                match: "http://cdn.example/img/*.jpg"
                target: "https://localhost:\(origin.port)/img/$1@small.jpg"
                when: constrained
            """
        let proxy = try ProxyProcess(config: config, environment: ["SSL_CERT_FILE": origin.certificate])
        defer { proxy.stop() }
        let text = try Self.request(proxy.port, "http://cdn.example/img/a.jpg")
        #expect(text.hasPrefix("HTTP/1.1 200"), "\(text)")
        #expect(text.contains("Data-Mode-Variant: img-small-tls"))
        #expect(text.hasSuffix("small over tls\n"))
    }
}
