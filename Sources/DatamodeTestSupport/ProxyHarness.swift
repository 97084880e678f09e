import DatamodeConfig
import DatamodeEngine
import DatamodeInstance
import DatamodePolicy
import DatamodeState
import Foundation
import Logging

/// An in-process proxy for loopback tests: the process `datamode-proxy run` builds (`ProxyInstance`: state store,
/// mode, policy, workers and admin API), with a configuration given as YAML, its control loop on a thread of its own.
///
/// Whatever the YAML says, the proxy listens on 127.0.0.1 port `listenPort`, 0 unless a test of the listen
/// address itself asks for one (the real port is read back into `port`),
/// keeps its state in a fresh temporary directory, and writes no access log unless asked; the admin address
/// is moved to port 0 too (read back into `adminPort`), so that no test depends on a fixed port.
public final class ProxyHarness: @unchecked Sendable {
    /// The process under test.
    public let instance: ProxyInstance
    /// The workers.
    public var server: ProxyServer { instance.server }
    /// Flip the mode with `runtime.update { $0.mode = ... }`; the next request head read sees it.
    public var runtime: RuntimeState { instance.runtime }
    /// The port the proxy listens on (127.0.0.1).
    public let port: UInt16
    /// The port the admin API listens on (127.0.0.1).
    public let adminPort: UInt16
    /// The temporary state directory (removed by `stop()`).
    public let stateDirectory: String
    private let baseDirectory: String
    private let accessLog: Bool
    private let threads: Int
    private let listenPort: UInt16
    private let controlLoopEnded = DispatchSemaphore(value: 0)
    private var stopped = false
    /// The state directory was given by the test, which owns it (a restart test reuses it).
    private let ownsStateDirectory: Bool

    /// Parses `yaml` (relative variant files against `baseDirectory`), applies the test overrides and starts
    /// the proxy. `mode` overrides the file's mode; `accessLog` keeps the file's `log.access` (default stdout)
    /// instead of turning it off; `threads` replaces 0 (one worker per core) when the file does not set it.
    public init(yaml: String = "", mode: DataMode? = nil, accessLog: Bool = false,
                baseDirectory: String = FileManager.default.temporaryDirectory.path, threads: Int = 2,
                listenPort: UInt16 = 0, eventHeartbeat: Duration? = nil, clock: any EngineClock = SystemClock(),
                stateDirectory: String? = nil, idleTrim: IdleTrim.Settings = IdleTrim.Settings()) throws {
        ownsStateDirectory = stateDirectory == nil
        let directory = stateDirectory ?? FileManager.default.temporaryDirectory
            .appendingPathComponent("datamode-test-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        self.stateDirectory = directory
        self.baseDirectory = baseDirectory
        self.accessLog = accessLog
        self.threads = threads
        self.listenPort = listenPort
        var configuration: ProxyConfiguration
        do {
            configuration = try Self.configuration(yaml, baseDirectory: baseDirectory, stateDirectory: directory,
                                                   accessLog: accessLog, threads: threads, listenPort: listenPort)
            if let mode { configuration.mode = mode }
            instance = try ProxyInstance(configuration: configuration,
                                         logger: Logger(label: "datamode-test") { _ in SwiftLogNoOpLogHandler() }, clock: clock,
                                         idleTrim: idleTrim)
            if let eventHeartbeat { instance.eventHeartbeat = eventHeartbeat }
            try instance.start()
        } catch {
            if ownsStateDirectory { try? FileManager.default.removeItem(atPath: directory) }
            throw error
        }
        port = instance.listenAddress.port
        adminPort = instance.adminAddress.port
        Thread.detachNewThread { [instance, controlLoopEnded] in
            instance.run()
            controlLoopEnded.signal()
        }
    }

    /// `yaml` with the test overrides: loopback listeners on port 0 (or `listenPort`), the given state directory.
    private static func configuration(_ yaml: String, baseDirectory: String, stateDirectory: String, accessLog: Bool,
                                      threads: Int, listenPort: UInt16) throws(ConfigError) -> ProxyConfiguration {
        var configuration = try ProxyConfiguration.parse(yaml: yaml, source: "test.yaml", baseDirectory: baseDirectory)
        let loopback = IPAddress(bytes: [127, 0, 0, 1])!
        configuration.listen = ListenAddress(address: loopback, port: listenPort)
        configuration.admin.listen = ListenAddress(address: loopback, port: 0)
        configuration.stateDirectory = stateDirectory
        if !accessLog { configuration.log.access = .off }
        if configuration.threads == 0 { configuration.threads = threads }
        return configuration
    }

    /// Reloads with `yaml` under the same test overrides, as `SIGHUP` would with a new file.
    @discardableResult
    public func reload(yaml: String) -> ProxyInstance.ReloadResult {
        instance.reload { () throws(ConfigError) -> ProxyConfiguration in
            try Self.configuration(yaml, baseDirectory: baseDirectory, stateDirectory: stateDirectory,
                                   accessLog: accessLog, threads: threads, listenPort: listenPort)
        }
    }

    /// Sets the active mode (as the admin API would), for every request head read from now on.
    public func setMode(_ mode: DataMode) {
        runtime.update { $0.mode = mode }
    }

    /// A new client connection to the proxy.
    public func connect(timeout: Duration = .seconds(10), receiveBuffer: Int32? = nil, source: String? = nil) throws -> RawHTTPClient {
        try RawHTTPClient(port: port, timeout: timeout, receiveBuffer: receiveBuffer, source: source)
    }

    /// A client of this proxy's admin API.
    public func admin(token: String? = nil) -> AdminAPIClient {
        AdminAPIClient(port: adminPort, token: token)
    }

    /// Stops the proxy (graceful, 5 s at most) and removes the state directory. Idempotent.
    public func stop() {
        guard !stopped else { return }
        stopped = true
        instance.drain()
        controlLoopEnded.wait()
        instance.wait(timeout: .seconds(5))
        if ownsStateDirectory { try? FileManager.default.removeItem(atPath: stateDirectory) }
    }

    deinit { stop() }
}
