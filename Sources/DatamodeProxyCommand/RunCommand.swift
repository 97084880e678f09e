import ArgumentParser
import DatamodeConfig
import DatamodeInstance
import Foundation
import Logging

/// `datamode-proxy run`: loads the configuration (flags > environment > file), builds and starts the process
/// (`ProxyInstance`), and runs its control loop (admin API, signals) until SIGTERM/SIGINT, then drains.
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
        // At start-up and on every SIGHUP: the file again, under the same flags and environment.
        let load = { () throws(ConfigError) -> ProxyConfiguration in try Self.load(configPath).applying(overrides) }

        let instance: ProxyInstance
        do {
            instance = try ProxyInstance(configuration: try load(), logger: logger)
        } catch {
            FileHandle.standardError.write(Data("datamode-proxy: \(error)\n".utf8))
            throw ExitCode(2)
        }
        do {
            try instance.start()
        } catch {
            FileHandle.standardError.write(Data("datamode-proxy: \(error)\n".utf8))
            throw ExitCode(1)
        }
        instance.handleSignals(reloadingWith: load)
        if let authority = instance.certificateAuthority, instance.createdCertificateAuthority {
            // tls.intercept is set and there was no CA: say where the new one is and how to trust it (SPEC §9).
            FileHandle.standardError.write(Data(CACommand.summary(authority, created: true).utf8))
        }
        let started = instance.runtime.load().snapshot
        var ready: Logger.Metadata = [
            "listen": "\(instance.listenAddress)", "admin": "\(instance.adminAddress)", "mode": "\(started.mode)",
            "mode_source": "\(started.modeSource.rawValue)",
            "config": "\(configPath ?? "(built-in defaults)")",
        ]
        if let transparent = instance.transparentAddress { ready["transparent"] = "\(transparent)" }
        logger.info("datamode-proxy \(ProductVersion.string) ready", metadata: ready)
        instance.run()
        let graceful = instance.wait(timeout: started.configuration.drainTimeout)
        logger.info(graceful ? "stopped" : "stopped after drain-timeout with requests still in flight")
    }

    static func load(_ path: String?) throws(ConfigError) -> ProxyConfiguration {
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
