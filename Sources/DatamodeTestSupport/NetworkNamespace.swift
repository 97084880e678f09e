import Foundation
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// A network namespace of a test's own (`ip netns add`), for SPEC §16's transparent sidecar: the proxy, the
/// origins and the clients run inside it (`ip netns exec`), iptables rules are applied inside it, and removing it
/// (`remove()`, also on failure: call it in a `defer`) takes its interfaces, addresses and rules with it. Nothing
/// outside the namespace is touched.
///
/// Its loopback is up and carries two "remote" addresses per family, `10.77.0.2`/`10.77.0.3` and
/// `fd77::2`/`fd77::3`: not loopback destinations, so the redirect rules catch connections to them, and no
/// interface module (dummy, veth) is needed.
public final class NetworkNamespace: @unchecked Sendable {
    public let name: String
    private var removed = false

    public static let ip = "/usr/sbin/ip"
    public static let remoteV4 = "10.77.0.2"
    public static let decoyV4 = "10.77.0.3"
    public static let remoteV6 = "fd77::2"
    public static let decoyV6 = "fd77::3"
    /// The uid clients run as (`nobody`): the proxy runs as root, whose traffic the rules let through.
    public static let clientUID = "65534"

    public struct Failure: Error, CustomStringConvertible {
        public var description: String
        public init(description: String) { self.description = description }
    }

    /// Why these tests cannot run here, or nil: they need root, `ip`, `iptables`, `ip6tables`, `setpriv` and curl,
    /// and the right to make a namespace.
    public static let unavailableReason: String? = {
        guard getuid() == 0 else { return "not root (network namespaces and iptables need it)" }
        for tool in [ip, "/usr/sbin/iptables", "/usr/sbin/ip6tables", "/usr/bin/setpriv", "/usr/bin/curl"]
        where !FileManager.default.isExecutableFile(atPath: tool) {
            return "\(tool) is missing (scripts/bootstrap.sh --test installs it)"
        }
        do {
            let probe = try NetworkNamespace()
            defer { probe.remove() }
            let nat = try probe.run(["/usr/sbin/iptables", "-w", "-t", "nat", "-S"])
            guard nat.status == 0 else { return "iptables does not work in a namespace: \(nat.output)" }
        } catch {
            return "cannot make a network namespace: \(error)"
        }
        return nil
    }()

    /// Whether the transparent tests run: always in CI (`CI` set), where a missing tool must fail them; elsewhere
    /// only when they can, and when they cannot the reason is printed, loudly, once.
    public static var testsEnabled: Bool {
        if ProcessInfo.processInfo.environment["CI"] != nil { return true }
        guard let reason = unavailableReason else { return true }
        announceSkip(reason)
        return false
    }

    private static let announced = Mutex(false)

    private static func announceSkip(_ reason: String) {
        let first = announced.withLock { done in
            defer { done = true }
            return !done
        }
        if first {
            FileHandle.standardError.write(Data("""
                ⚠️  SKIPPING the transparent sidecar tests (SPEC §16): \(reason). They run in CI (CI set), where this \
                is a failure.\n
                """.utf8))
        }
    }

    /// Makes the namespace (`dmt-` and a random suffix) and brings its loopback and addresses up. Namespaces that
    /// earlier runs of these tests left (a killed run) are removed first.
    public init() throws {
        Self.removeLeftovers()
        name = "dmt-\(UUID().uuidString.prefix(8).lowercased())"
        let created = try ExternalCommand.run(Self.ip, ["netns", "add", name], timeout: 20)
        guard created.status == 0 else { throw Failure(description: "ip netns add \(name): \(created.output)") }
        let setup: [[String]] = [
            [Self.ip, "link", "set", "lo", "up"],
            [Self.ip, "addr", "add", "\(Self.remoteV4)/32", "dev", "lo"],
            [Self.ip, "addr", "add", "\(Self.decoyV4)/32", "dev", "lo"],
            [Self.ip, "-6", "addr", "add", "\(Self.remoteV6)/128", "dev", "lo"],
            [Self.ip, "-6", "addr", "add", "\(Self.decoyV6)/128", "dev", "lo"],
        ]
        for command in setup {
            let result = try run(command)
            guard result.status == 0 else {
                remove()
                throw Failure(description: "\(command.joined(separator: " ")): \(result.output)")
            }
        }
    }

    /// `ip netns exec NAME`: put it in front of a command to run that command inside.
    public var launcher: [String] { [Self.ip, "netns", "exec", name] }

    /// Runs `command` inside the namespace, as root, or as `clientUID` with no capabilities (`asClient`).
    public func run(_ command: [String], asClient: Bool = false, environment: [String: String]? = nil,
                    timeout: Double = 60) throws -> ExternalCommand.Result {
        let user = asClient
            ? ["/usr/bin/setpriv", "--reuid", Self.clientUID, "--regid", Self.clientUID, "--clear-groups", "--inh-caps=-all"]
            : []
        let full = launcher + user + command
        return try ExternalCommand.run(full[0], Array(full.dropFirst()), environment: environment, timeout: timeout)
    }

    /// curl inside the namespace, as a client without any proxy setting (the environment is emptied).
    public func curl(_ arguments: [String], timeout: Double = 30) throws -> ExternalCommand.Result {
        try run(["/usr/bin/curl", "-sS", "--noproxy", "*", "--max-time", "\(Int(timeout) - 5)"] + arguments, asClient: true,
                environment: ["PATH": "/usr/bin:/bin"], timeout: timeout)
    }

    /// Deletes the namespace, and with it its addresses and iptables rules. Safe to call more than once.
    public func remove() {
        guard !removed else { return }
        removed = true
        _ = try? ExternalCommand.run(Self.ip, ["netns", "del", name], timeout: 20)
    }

    deinit { remove() }

    /// Namespaces of these tests older than a few minutes (a run that was killed before its `defer`).
    static func removeLeftovers() {
        let directory = "/var/run/netns"
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: directory) else { return }
        for name in names where name.hasPrefix("dmt-") {
            let attributes = try? FileManager.default.attributesOfItem(atPath: directory + "/" + name)
            guard let modified = attributes?[.modificationDate] as? Date, modified.timeIntervalSinceNow < -600 else { continue }
            _ = try? ExternalCommand.run(ip, ["netns", "del", name], timeout: 20)
        }
    }
}
