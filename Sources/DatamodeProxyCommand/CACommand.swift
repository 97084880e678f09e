import ArgumentParser
import DatamodeConfig
import DatamodeEngine
import Foundation

/// `datamode-proxy ca init [--force] | export | path` (SPEC §9): the local CA of HTTPS interception, found where
/// `run` would look for it (`tls.ca`, else `ca.pem` / `ca-key.pem` in the state directory; flags > environment > file).
struct CACommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "ca",
        abstract: "Create, export or locate the local CA used for HTTPS interception.",
        discussion: """
            Clients must trust this CA for the proxy to see inside their HTTPS (tls.intercept). Its key never \
            leaves the state directory (mode 0600, directory 0700).
            """,
        subcommands: [Init.self, Export.self, Path.self]
    )

    /// Where the configuration is (the same resolution as `run`).
    struct Location: ParsableArguments {
        @Option(name: .long, help: "The YAML configuration file (tls.ca, state-dir).")
        var config: String?

        @Option(name: .customLong("state-dir"), help: "The state directory (default ./state).")
        var stateDir: String?

        func paths() throws -> (certificate: String, key: String) {
            let flags = ConfigOverrides(origin: .flags, configPath: config, stateDirectory: stateDir)
            let overrides = flags.overriding(ConfigOverrides.fromEnvironment(ProcessInfo.processInfo.environment))
            do {
                let file = try overrides.configPath.map { path throws(ConfigError) in try ProxyConfiguration.load(path: path) }
                return try (file ?? .defaults).applying(overrides).caPaths
            } catch {
                throw CommandFailure(error)
            }
        }
    }

    struct Init: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "init", abstract: "Create the CA (never replaces one without --force).")

        @Flag(name: .long, help: "Replace an existing CA. Every client that trusted the old one must trust the new one.")
        var force = false

        @OptionGroup var location: Location

        func run() throws {
            let (certificate, key) = try location.paths()
            if force && CertificateAuthority.exists(certificatePath: certificate, keyPath: key) {
                FileHandle.standardError.write(Data(("datamode-proxy: warning: replacing the CA at \(certificate); clients "
                    + "that trusted the old one will refuse intercepted connections until they trust the new one, and "
                    + "should remove the old one from their trust store\n").utf8))
            }
            do {
                let authority = try CertificateAuthority.create(certificatePath: certificate, keyPath: key, replace: force)
                print(CACommand.summary(authority, created: true), terminator: "")
            } catch {
                throw CommandFailure(error)
            }
        }
    }

    struct Export: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "export", abstract: "Print the CA certificate (PEM) and its SHA-256 fingerprint.")

        @OptionGroup var location: Location

        func run() throws {
            let (certificate, _) = try location.paths()
            do {
                let (pem, fingerprint) = try CertificateAuthority.certificateOnly(path: certificate)
                print(pem, terminator: "")
                print("SHA-256 Fingerprint=\(fingerprint)")
            } catch {
                throw CommandFailure(error)
            }
        }
    }

    struct Path: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "path", abstract: "Print where the CA certificate is (the key is ca-key.pem beside it unless tls.ca.key says otherwise).")

        @OptionGroup var location: Location

        func run() throws {
            print(try location.paths().certificate)
        }
    }

    /// What `ca init` and a `run` that created the CA print: where it is, its fingerprint, and how to trust it.
    static func summary(_ authority: CertificateAuthority, created: Bool) -> String {
        """
        \(created ? "Created" : "Using") the datamode-proxy CA
          certificate: \(authority.certificatePath)
          key:         \(authority.keyPath) (mode 0600; never share it)
          SHA-256:     \(authority.fingerprint)
        Trust it in the clients whose HTTPS the proxy intercepts (tls.intercept), e.g.:
          curl --cacert \(authority.certificatePath) -x http://127.0.0.1:8877 https://example.com/
          certutil -d sql:$HOME/.pki/nssdb -A -t C,, -n datamode-proxy -i \(authority.certificatePath)   (Chromium, Firefox: NSS)
          sudo cp \(authority.certificatePath) /usr/local/share/ca-certificates/datamode-proxy.crt && sudo update-ca-certificates

        """
    }
}
