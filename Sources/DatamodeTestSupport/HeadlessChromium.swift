import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// Headless Chromium (Debian `chromium`) as a real browser client of the proxy: its own scratch `HOME` whose NSS
/// database (`$HOME/.pki/nssdb`, made with `certutil` from `libnss3-tools`) trusts the CAs a test adds, and a fresh
/// profile for every page load (nothing cached from one load to the next: a screenshot in constrained mode shows
/// what the proxy served in constrained mode).
///
/// Every load goes through `--proxy-server=http://127.0.0.1:PORT` with `--proxy-bypass-list=<-loopback>`: without
/// it Chromium sends loopback URLs around the proxy, and the tests' origins are on loopback.
public final class HeadlessChromium: @unchecked Sendable {
    public struct Failure: Error, CustomStringConvertible {
        public var description: String
    }

    public let binary: String
    /// The scratch `HOME` (NSS database and profiles).
    public let home: String
    private var loads = 0

    /// `CHROMIUM_BIN`, else `chromium` on PATH or in /usr/bin. Missing is an error, never a skip: the tests need it
    /// and `scripts/bootstrap.sh --test` installs it.
    public static func locate() throws -> String {
        let environment = ProcessInfo.processInfo.environment
        if let path = environment["CHROMIUM_BIN"], !path.isEmpty {
            guard FileManager.default.isExecutableFile(atPath: path) else {
                throw Failure(description: "CHROMIUM_BIN=\(path) is not an executable file")
            }
            return path
        }
        let directories = (environment["PATH"] ?? "").split(separator: ":").map(String.init) + ["/usr/bin"]
        for directory in directories where FileManager.default.isExecutableFile(atPath: directory + "/chromium") {
            return directory + "/chromium"
        }
        throw Failure(description: "chromium is not installed (Debian package `chromium`; scripts/bootstrap.sh --test installs it)")
    }

    static func certutil() throws -> String {
        for path in ["/usr/bin/certutil", "/bin/certutil"] where FileManager.default.isExecutableFile(atPath: path) {
            return path
        }
        throw Failure(description: "certutil is not installed (Debian package `libnss3-tools`; scripts/bootstrap.sh --test installs it)")
    }

    /// Makes `directory` the browser's HOME, with an empty NSS database.
    public init(directory: String) throws {
        binary = try Self.locate()
        home = directory
        let database = directory + "/.pki/nssdb"
        try FileManager.default.createDirectory(atPath: database, withIntermediateDirectories: true)
        let made = try ExternalCommand.run(try Self.certutil(), ["-N", "-d", "sql:" + database, "--empty-password"])
        guard made.status == 0 else { throw Failure(description: "certutil -N failed: \(made.output)") }
    }

    /// Adds the PEM certificate at `path` to the NSS database as a CA trusted to issue server certificates
    /// (`-t C,,`), as a user does with a proxy's CA.
    public func trustCertificateAuthority(pemPath path: String, nickname: String) throws {
        let added = try ExternalCommand.run(try Self.certutil(), [
            "-A", "-d", "sql:" + home + "/.pki/nssdb", "-n", nickname, "-t", "C,,", "-i", path,
        ])
        guard added.status == 0 else { throw Failure(description: "certutil -A \(path) failed: \(added.output)") }
    }

    /// What one page load produced.
    public struct Load {
        public var screenshot: PNGImage
        /// Chromium's stderr and stdout, for failure messages.
        public var output: String
    }

    /// Loads `url` through the proxy on `proxyPort` in a `width` × `height` window and returns the screenshot
    /// (Chromium takes it once the page's load event fired, so images have been fetched and decoded).
    public func screenshot(_ url: String, proxyPort: UInt16, width: Int = 800, height: Int = 600,
                           timeout: Double = 120) throws -> Load {
        loads += 1
        let path = home + "/screenshot-\(loads).png"
        let result = try run(url, proxyPort: proxyPort, extra: [
            "--screenshot=" + path, "--window-size=\(width),\(height)", "--hide-scrollbars", "--force-device-scale-factor=1",
        ], timeout: timeout)
        guard let bytes = FileManager.default.contents(atPath: path) else {
            throw Failure(description: "chromium wrote no screenshot (exit \(result.status)):\n\(result.output)")
        }
        do {
            return Load(screenshot: try PNGImage(decoding: Array(bytes)), output: result.output)
        } catch {
            throw Failure(description: "the screenshot \(path) does not decode: \(error)")
        }
    }

    private func run(_ url: String, proxyPort: UInt16, extra: [String], timeout: Double) throws -> ExternalCommand.Result {
        let profile = home + "/profile-\(loads)-\(UUID().uuidString.prefix(8))"
        var arguments = [
            "--headless", "--disable-gpu", "--no-first-run", "--no-default-browser-check", "--disable-extensions",
            "--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-default-apps",
            "--disable-features=Translate,OptimizationHints,MediaRouter", "--mute-audio", "--disable-dev-shm-usage",
            "--user-data-dir=" + profile,
            "--proxy-server=http://127.0.0.1:\(proxyPort)", "--proxy-bypass-list=<-loopback>",
        ]
        // The sandbox needs user namespaces that a root process (CI, containers) does not get.
        if geteuid() == 0 { arguments.append("--no-sandbox") }
        arguments += extra
        arguments.append(url)
        let environment = [
            "HOME": home, "PATH": ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin",
            "XDG_CONFIG_HOME": home + "/.config", "XDG_CACHE_HOME": home + "/.cache",
        ]
        let result = try ExternalCommand.run(binary, arguments, environment: environment, timeout: timeout)
        try? FileManager.default.removeItem(atPath: profile)
        return result
    }
}
