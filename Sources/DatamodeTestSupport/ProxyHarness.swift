import DatamodeConfig
import DatamodeEngine
import DatamodePolicy
import Foundation
import Logging

/// An in-process proxy for loopback tests: the real `ProxyServer` with a configuration given as YAML.
///
/// Whatever the YAML says, the proxy listens on 127.0.0.1 port `listenPort`, 0 unless a test of the listen
/// address itself asks for one (the real port is read back into `port`),
/// keeps its state in a fresh temporary directory, and writes no access log unless asked; the admin address
/// is moved to port 0 too, so that no test depends on a fixed port.
public final class ProxyHarness: @unchecked Sendable {
    public let server: ProxyServer
    /// Flip the mode with `runtime.update { $0.mode = ... }`; the next request head read sees it.
    public let runtime: RuntimeState
    /// The port the proxy listens on (127.0.0.1).
    public let port: UInt16
    /// The temporary state directory (removed by `stop()`).
    public let stateDirectory: String
    private var stopped = false

    /// Parses `yaml` (relative variant files against `baseDirectory`), applies the test overrides and starts
    /// the proxy. `mode` overrides the file's mode; `accessLog` keeps the file's `log.access` (default stdout)
    /// instead of turning it off; `threads` replaces 0 (one worker per core) when the file does not set it.
    public init(yaml: String = "", mode: DataMode? = nil, accessLog: Bool = false,
                baseDirectory: String = FileManager.default.temporaryDirectory.path, threads: Int = 2,
                listenPort: UInt16 = 0) throws {
        var configuration = try ProxyConfiguration.parse(yaml: yaml, source: "test.yaml", baseDirectory: baseDirectory)
        let loopback = IPAddress(bytes: [127, 0, 0, 1])!
        configuration.listen = ListenAddress(address: loopback, port: listenPort)
        configuration.admin.listen = ListenAddress(address: loopback, port: 0)
        let directory = FileManager.default.temporaryDirectory
            .appendingPathComponent("datamode-test-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        configuration.stateDirectory = directory
        if !accessLog { configuration.log.access = .off }
        if configuration.threads == 0 { configuration.threads = threads }
        if let mode { configuration.mode = mode }

        let snapshot = try ConfigurationSnapshot(configuration: configuration)
        let effective = configuration.effectiveMode
        runtime = RuntimeState(RuntimeSnapshot(
            configuration: configuration, policy: snapshot.policy, mode: effective,
            modeSource: configuration.modeSource, modeSince: Int64(Date().timeIntervalSince1970)))
        let logger = Logger(label: "datamode-test") { _ in SwiftLogNoOpLogHandler() }
        server = ProxyServer(runtime: runtime, logger: logger)
        stateDirectory = directory
        do {
            try server.start()
        } catch {
            try? FileManager.default.removeItem(atPath: directory)
            throw error
        }
        port = server.listenAddress.port
    }

    /// Sets the active mode (as the admin API would), for every request head read from now on.
    public func setMode(_ mode: DataMode) {
        runtime.update { $0.mode = mode }
    }

    /// A new client connection to the proxy.
    public func connect(timeout: Duration = .seconds(10), receiveBuffer: Int32? = nil) throws -> RawHTTPClient {
        try RawHTTPClient(port: port, timeout: timeout, receiveBuffer: receiveBuffer)
    }

    /// Stops the proxy (graceful, 5 s at most) and removes the state directory. Idempotent.
    public func stop() {
        guard !stopped else { return }
        stopped = true
        server.stop(timeout: .seconds(5))
        try? FileManager.default.removeItem(atPath: stateDirectory)
    }

    deinit { stop() }
}
