import DatamodeConfig
import DatamodePolicy
import Foundation
import Testing

/// `tls:` (SPEC §9): interception is opt-in per host, bypass first; the CA defaults to the state directory.
@Suite("tls section")
struct TLSConfigTests {
    @Test func defaultsInterceptNothingAndVerifyOrigins() throws {
        let configuration = try parse("")
        #expect(configuration.tls.intercept.isEmpty)
        #expect(configuration.tls.bypass.isEmpty)
        #expect(configuration.tls.upstreamVerify)
        #expect(!configuration.tls.intercepts(host: "example.com"))
        #expect(configuration.caPaths.certificate == "./state/ca.pem")
        #expect(configuration.caPaths.key == "./state/ca-key.pem")
    }

    @Test func bypassIsCheckedFirstAndGlobsIgnoreCase() throws {
        let configuration = try parse("""
            tls:
              intercept: ["*"]
              bypass: ["*.bank.example", pinned.example]
              upstream-verify: false
            """)
        #expect(configuration.tls.intercepts(host: "cdn.example"))
        #expect(configuration.tls.intercepts(host: "::1"))
        #expect(!configuration.tls.intercepts(host: "www.bank.example"))
        #expect(!configuration.tls.intercepts(host: "PINNED.example"))
        #expect(!configuration.tls.upstreamVerify)
        let some = try parse("tls: {intercept: [\"*.video.example\", api.example]}")
        #expect(some.tls.intercepts(host: "a.video.example"))
        #expect(some.tls.intercepts(host: "API.example"))
        #expect(!some.tls.intercepts(host: "video.example"))
        #expect(!some.tls.intercepts(host: "other.example"))
    }

    @Test func caPathsAreRelativeToTheConfigFile() throws {
        let configuration = try parse("tls:\n  ca: {cert: ca/root.pem, key: /secure/root-key.pem}", base: "/etc/datamode")
        #expect(configuration.caPaths.certificate == "/etc/datamode/ca/root.pem")
        #expect(configuration.caPaths.key == "/secure/root-key.pem")
        var overridden = try parse("state-dir: /var/lib/datamode")
        #expect(overridden.caPaths.key == "/var/lib/datamode/ca-key.pem")
        overridden.stateDirectory = "/tmp/s/"
        #expect(overridden.caPaths.certificate == "/tmp/s/ca.pem")
    }

    static let badValues: [ErrorCase] = [
        ErrorCase("tls:\n  intercepts: []", key: "tls.intercepts", line: 2, "unknown key"),
        ErrorCase("tls:\n  intercept: \"*\"", key: "tls.intercept", line: 2, "expected a list of host globs"),
        ErrorCase("tls:\n  intercept: [\"https://cdn.example\"]", key: "tls.intercept[0]", line: 2, "no scheme, port or path"),
        ErrorCase("tls:\n  bypass: [\"bank.example/login\"]", key: "tls.bypass[0]", line: 2, "no scheme, port or path"),
        ErrorCase("tls:\n  intercept: [\"\"]", key: "tls.intercept[0]", line: 2, "expected a host glob"),
        ErrorCase("tls:\n  upstream-verify: no", key: "tls.upstream-verify", line: 2, "expected true or false"),
        ErrorCase("tls:\n  ca: {cert: a.pem}", key: "tls.ca", line: 2, "needs both cert and key"),
        ErrorCase("tls:\n  ca: {cert: a.pem, key: b.pem, chain: c.pem}", key: "tls.ca.chain", line: 2, "unknown key"),
    ]

    @Test(arguments: badValues)
    func badValuesNameTheKeyAndLine(_ errorCase: ErrorCase) {
        expectError(errorCase)
    }
}
