import ArgumentParser
import DatamodeAdmin
import DatamodeConfig
import DatamodeEngine
import DatamodePolicy
import Foundation
import Logging

/// `datamode-proxy run`: loads the configuration (flags > environment > file), starts the workers, and runs
/// the control loop (signals) until SIGTERM/SIGINT, then drains.
struct RunCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "run",
        abstract: "Start the proxy.",
        discussion: """
            Settings come from, highest first: these flags, the DATAMODE_* environment variables \
            (DATAMODE_CONFIG, DATAMODE_LISTEN, DATAMODE_ADMIN_LISTEN, DATAMODE_MODE, DATAMODE_ADMIN_TOKEN, \
            DATAMODE_STATE_DIR, DATAMODE_THREADS), the config file, built-in defaults. Without --config or \
            DATAMODE_CONFIG the built-in defaults are used. SIGHUP reloads the file; SIGTERM/SIGINT drain and exit.
            """
    )

    @Option(name: .long, help: "The YAML configuration file (e.g. config/datamode.yaml).")
    var config: String?

    @Option(name: .long, help: "Proxy listen address, e.g. 127.0.0.1:8877.")
    var listen: String?

    @Option(name: .customLong("admin-listen"), help: "Admin API listen address, e.g. 127.0.0.1:8878.")
    var adminListen: String?

    @Option(name: .long, help: ArgumentHelp("Data mode: normal, constrained, expensive, constrained-expensive, "
        + "ultra-constrained, constrained-ultra-constrained, expensive-ultra-constrained, "
        + "constrained-expensive-ultra-constrained (aliases low-data, cellular, satellite)."))
    var mode: String?

    @Option(name: .customLong("state-dir"), help: "Where the API-set mode and API variants persist.")
    var stateDir: String?

    @Option(name: .long, help: "Worker threads; 0 = one per core.")
    var threads: String?

    func run() throws {
        LoggingSystem.bootstrap { label in
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = .info
            return handler
        }
        let logger = Logger(label: "datamode-proxy")
        let flags = ConfigOverrides(origin: .flags, configPath: config, listen: listen, adminListen: adminListen,
                                    mode: mode, stateDirectory: stateDir, threads: threads)
        let overrides = flags.overriding(ConfigOverrides.fromEnvironment(ProcessInfo.processInfo.environment))
        let configPath = overrides.configPath

        let loaded: ProxyConfiguration
        do {
            loaded = try Self.load(configPath).applying(overrides)
            try loaded.validateForStartup()
        } catch {
            FileHandle.standardError.write(Data("datamode-proxy: \(error)\n".utf8))
            throw ExitCode(2)
        }
        let now = Int64(Date().timeIntervalSince1970)

        // State the admin API persisted: it beats flags and the file (SPEC §2). Unreadable state stops start-up.
        // The file's policy is compiled once, with the persisted API variants.
        let store: StateStore
        let saved: (mode: DataMode, since: Int64)?
        let snapshot: ConfigurationSnapshot
        do {
            store = try StateStore(directory: loaded.stateDirectory)
            saved = try store.loadMode()
            let apiVariants = try store.loadVariants(files: loaded.variantFiles)
            do {
                snapshot = try ConfigurationSnapshot(configuration: loaded, apiVariants: apiVariants)
            } catch {
                switch error {
                case .configuration(let error):
                    FileHandle.standardError.write(Data("datamode-proxy: \(error)\n".utf8))
                    throw ExitCode(2)
                case .apiVariants(let error):
                    throw StateStore.StateError(description: "\(store.variantsPath): \(error); fix or delete the file")
                }
            }
        } catch let exit as ExitCode {
            throw exit
        } catch {
            FileHandle.standardError.write(Data("datamode-proxy: state: \(error)\n".utf8))
            throw ExitCode(2)
        }
        let configuration = snapshot.configuration
        let policy = snapshot.policy
        let resolution = ModeResolution(api: saved?.mode, configuration: configuration)
        let mode = resolution.mode
        let runtime = RuntimeState(RuntimeSnapshot(
            configuration: configuration, policy: policy, mode: mode, modeSource: resolution.source,
            modeSince: saved?.since ?? now))

        let server = ProxyServer(runtime: runtime, logger: logger)
        let control: ControlLoop
        let admin: AdminTransport
        do {
            // The admin listener is bound first, so the workers know its real port (it may be 0 in the
            // config) and refuse to proxy to it.
            control = try ControlLoop()
            let api = AdminAPI(runtime: runtime, store: store, token: configuration.admin.token, logger: logger,
                               metrics: { server.metrics() })
            admin = try AdminTransport(loop: control, address: configuration.admin.listen, handler: api.handle)
            server.addOwnAddress(admin.listenAddress)
            try server.start()
        } catch {
            FileHandle.standardError.write(Data("datamode-proxy: \(error)\n".utf8))
            throw ExitCode(1)
        }
        logger.info("datamode-proxy \(ProductVersion.string) ready", metadata: [
            "listen": "\(server.listenAddress)", "admin": "\(admin.listenAddress)", "mode": "\(mode)",
            "mode_source": "\(resolution.source.rawValue)",
            "config": "\(configPath ?? "(built-in defaults)")",
        ])

        var current = snapshot
        control.onSignal(SIGHUP) { _ in
            do {
                // Every check before the first change: a refused reload leaves the running state whole. The
                // admin API's writes run on this thread too, so the API variants cannot change meanwhile.
                let configuration = try Self.load(configPath).applying(overrides)
                let apiVariants = runtime.load().snapshot.policy.variants.filter { $0.source == .api }
                try store.checkFiles(of: apiVariants, against: configuration.variantFiles)
                let reloaded = try current.reloaded(with: configuration, apiVariants: apiVariants)
                runtime.update { state in
                    state.configuration = reloaded.configuration
                    state.policy = reloaded.policy
                    state.apply(ModeResolution(api: state.apiMode, configuration: reloaded.configuration),
                                now: Int64(Date().timeIntervalSince1970))
                }
                current = reloaded
                logger.info("configuration reloaded", metadata: ["generation": "\(reloaded.generation)"])
            } catch {
                logger.error("reload failed; keeping the running configuration", metadata: ["error": "\(error)"])
            }
        }
        let stop: (Int32) -> Void = { signal in
            logger.info("stopping: draining in-flight requests", metadata: ["signal": "\(signal)"])
            server.drain()
            control.stop()
        }
        control.onSignal(SIGTERM, stop)
        control.onSignal(SIGINT, stop)
        control.run()
        withExtendedLifetime(admin) {}
        let graceful = server.wait(timeout: configuration.drainTimeout)
        logger.info(graceful ? "stopped" : "stopped after drain-timeout with requests still in flight")
    }

    static func load(_ path: String?) throws -> ProxyConfiguration {
        guard let path else { return .defaults }
        return try ProxyConfiguration.load(path: path)
    }
}

/// `datamode-proxy check --config F`: validates a configuration without starting anything.
struct CheckCommand: ParsableCommand {
    static let configuration = CommandConfiguration(commandName: "check", abstract: "Validate a configuration file and exit.")

    @Option(name: .long, help: "The YAML configuration file.")
    var config: String

    func run() throws {
        do {
            let snapshot = try ConfigurationSnapshot(configuration: try ProxyConfiguration.load(path: config))
            print("\(config): OK (\(snapshot.configuration.rules.count) rules, \(snapshot.configuration.variants.count) variants, mode \(snapshot.configuration.effectiveMode))")
        } catch {
            FileHandle.standardError.write(Data("datamode-proxy: \(error)\n".utf8))
            throw ExitCode(2)
        }
    }
}
