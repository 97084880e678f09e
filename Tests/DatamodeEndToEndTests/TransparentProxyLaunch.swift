import DatamodeTestSupport
import Foundation
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// The proxy with a transparent listener inside a test's network namespace, as both transparent suites start it:
/// `yaml` as its configuration (under `directory/proxy`), its CA copied where the clients can read it
/// (`directory/ca.pem`; the state directory is the proxy's own, 0700), and the `transparent-rules` redirect applied in
/// the namespace for everyone but the proxy (uid 0), both families. Returns the proxy and its transparent port; the
/// proxy is stopped again when a later step fails.
enum TransparentProxyLaunch {
    static func start(in namespace: NetworkNamespace, directory: String, yaml: String,
                      trusting certificatePath: String) throws -> (proxy: ProxyProcess, transparentPort: UInt16) {
        try FileManager.default.createDirectory(atPath: directory + "/proxy", withIntermediateDirectories: true)
        try yaml.write(toFile: directory + "/proxy/datamode.yaml", atomically: true, encoding: .utf8)
        let proxy = try ProxyProcess(command: namespace.launcher + [
            ProxyProcess.binaryPath, "run", "--config", directory + "/proxy/datamode.yaml", "--listen", "127.0.0.1:0",
            "--admin-listen", "127.0.0.1:0", "--state-dir", directory + "/proxy/state",
        ], environment: ["SSL_CERT_FILE": certificatePath], directory: directory + "/proxy")
        do {
            let port = try #require(proxy.transparentPort, "no transparent= in the ready line: \(proxy.stderr)")
            try FileManager.default.copyItem(atPath: directory + "/proxy/state/ca.pem", toPath: directory + "/ca.pem")
            chmod(directory + "/ca.pem", 0o644)
            let rules = try namespace.run([ProxyProcess.binaryPath, "transparent-rules", "--port", "\(port)",
                                           "--uid", "0", "--ipv6", "--apply"])
            guard rules.status == 0 else { throw NetworkNamespace.Failure(description: "transparent-rules: \(rules.output)") }
            return (proxy, port)
        } catch {
            proxy.stop()
            throw error
        }
    }
}
