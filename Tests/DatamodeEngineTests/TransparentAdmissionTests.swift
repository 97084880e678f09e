import DatamodeConfig
@testable import DatamodeEngine
import DatamodeHTTP
import DatamodePolicy
import Testing

/// SPEC §16 as admission sees it: an origin-form request on the transparent listener is `http://Host/path`,
/// Host required; the listener's implicit CONNECT is judged like any CONNECT, and only a ClientHello's is
/// intercepted; a CONNECT or `OPTIONS *` the client sends itself is refused.
@Suite struct TransparentAdmissionTests {
    static func summary(_ request: String, _ requests: TransparentRequests, settings: WorkerSettings,
                        intercepts: Bool = false) -> String {
        AdmissionTests.summary(AdmissionTests.admit(request, source: .transparent(requests), settings: settings,
                                                    intercepts: intercepts))
    }

    @Test func originFormBecomesAbsoluteFromHost() throws {
        let plain = try AdmissionTests.settings("")
        let rows: [(String, String)] = [
            ("GET /a?b HTTP/1.1\r\nHost: cdn.example\r\n\r\n", "forward http://cdn.example/a?b"),
            ("GET /a HTTP/1.1\r\nHost: CDN.example:8080\r\n\r\n", "forward http://cdn.example:8080/a"),
            ("GET /a HTTP/1.1\r\nHost: [fd00::2]\r\n\r\n", "forward http://[fd00::2]/a"),
            ("GET http://cdn.example/a HTTP/1.1\r\nHost: cdn.example\r\n\r\n", "forward http://cdn.example/a"),
            ("GET /a HTTP/1.1\r\n\r\n", "refuse bad-request close"),
            ("GET /a HTTP/1.0\r\n\r\n", "refuse bad-request close"),
            ("GET /a HTTP/1.1\r\nHost: \r\n\r\n", "refuse bad-request close"),
            ("GET /a HTTP/1.1\r\nHost: a b\r\n\r\n", "refuse bad-request close"),
            ("GET /a HTTP/1.1\r\nHost: user@evil.example\r\n\r\n", "refuse bad-request close"),
            ("GET /a HTTP/1.1\r\nHost: evil.example/x?\r\n\r\n", "refuse bad-request close"),
            ("GET https://cdn.example/a HTTP/1.1\r\nHost: cdn.example\r\n\r\n", "refuse bad-request close"),
            ("CONNECT cdn.example:443 HTTP/1.1\r\nHost: cdn.example:443\r\n\r\n", "refuse bad-request close"),
            ("OPTIONS * HTTP/1.1\r\nHost: cdn.example\r\n\r\n", "refuse bad-request close"),
            ("GET /a HTTP/1.1\r\nHost: cdn.example\r\nVia: 1.1 datamode-proxy\r\n\r\n", "refuse loop-detected"),
        ]
        for (request, expected) in rows {
            #expect(Self.summary(request, .http, settings: plain) == expected, "\(request.debugDescription)")
        }
    }

    @Test func theDataModeAppliesToTransparentRequests() throws {
        let settings = try AdmissionTests.settings("""
            rules:
              - {name: video, match: {host: "*.video.example"}, tags: {allow-constrained: false}}
            """, mode: .constrained)
        #expect(Self.summary("GET /v.mp4 HTTP/1.1\r\nHost: cdn.video.example\r\n\r\n", .http, settings: settings)
            == "reject constrained")
        #expect(Self.summary("CONNECT cdn.video.example:443 HTTP/1.1\r\nHost: cdn.video.example:443\r\n\r\n", .tls,
                             settings: settings) == "reject constrained")
    }

    @Test func proxyCredentialsAreNotAskedFor() throws {
        let settings = try AdmissionTests.settings("access: {users: {alice: secret}}")
        #expect(Self.summary("GET /a HTTP/1.1\r\nHost: a.example\r\n\r\n", .http, settings: settings) == "forward http://a.example/a")
        #expect(AdmissionTests.summary(AdmissionTests.admit("GET http://a.example/a HTTP/1.1\r\nHost: a.example\r\n\r\n",
                                                            settings: settings)) == "refuse proxy-auth-required")
    }

    @Test func onlyAClientHelloIsIntercepted() throws {
        let plain = try AdmissionTests.settings("")
        let connect = "CONNECT 10.0.0.2:22 HTTP/1.1\r\nHost: 10.0.0.2:22\r\n\r\n"
        #expect(Self.summary(connect, .tls, settings: plain, intercepts: true) == "intercept 10.0.0.2:22")
        #expect(Self.summary(connect, .other, settings: plain, intercepts: true) == "tunnel 10.0.0.2:22")
        #expect(Self.summary("GET / HTTP/1.1\r\nHost: a\r\n\r\n", .tls, settings: plain) == "refuse bad-request close")
    }
}
