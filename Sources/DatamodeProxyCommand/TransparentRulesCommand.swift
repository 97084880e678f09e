import ArgumentParser
import Foundation

/// `datamode-proxy transparent-rules --port P --uid U [--ipv6] [--ports LIST] [--apply | --remove]` (SPEC §16):
/// the iptables rules that send a network namespace's outbound TCP to the transparent listener. Printed by
/// default (to review, or to run elsewhere); `--apply` runs them, `--remove` deletes them.
///
/// Everything lives in chains of its own, `DATAMODE_OUTPUT` in the nat table (loopback destinations and the proxy's
/// own user return, TCP is redirected) and `DATAMODE_OUTPUT` in the filter table (UDP 443 rejected, so browsers
/// fall back from QUIC to TCP at once), each reached by one jump from `OUTPUT`. `--remove` deletes those chains and
/// every jump to them, nothing else; both are idempotent (`--apply` replaces what an earlier run left).
struct TransparentRulesCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "transparent-rules",
        abstract: "Print, apply or remove the iptables rules of the transparent sidecar (SPEC §16).",
        discussion: """
            Run in the application's network namespace, with NET_ADMIN (an init container): outbound TCP is \
            redirected to --port, except to loopback and from --uid (the proxy's own user, whose connections \
            must never come back to it); outbound UDP 443 (QUIC) is rejected. Without --apply or --remove the \
            commands are printed and nothing is changed.
            """
    )

    @Option(name: .long, help: "The transparent listener's port (transparent.listen).")
    var port: Int

    @Option(name: .long, help: "The numeric uid the proxy runs as: its traffic is never redirected.")
    var uid: Int

    @Flag(name: .long, help: "IPv6 too (ip6tables).")
    var ipv6 = false

    @Option(name: .long, help: "Destination ports to redirect, e.g. 80,443,8000-8100 (default: all TCP).")
    var ports: String?

    @Flag(name: .long, help: "Apply the rules (replacing any this command applied before).")
    var apply = false

    @Flag(name: .long, help: "Remove the rules and chains this command applied, nothing else.")
    var remove = false

    func validate() throws {
        guard (1...65535).contains(port) else { throw ValidationError("--port must be 1 to 65535, got \(port)") }
        guard (0...Int(UInt32.max - 1)).contains(uid) else { throw ValidationError("--uid must be a numeric uid, got \(uid)") }
        if apply && remove { throw ValidationError("--apply and --remove exclude each other") }
        if let ports { _ = try TransparentRules.portSpecs(ports) }
    }

    func run() throws {
        let rules = TransparentRules(port: port, uid: uid, ipv6: ipv6,
                                     ports: try ports.map(TransparentRules.portSpecs) ?? [])
        guard apply || remove else {
            print(rules.script(), terminator: "")
            return
        }
        do {
            let runner = try IPTablesRunner(families: rules.families)
            if remove {
                try rules.remove(using: runner)
            } else {
                try rules.apply(using: runner)
            }
        } catch {
            throw CommandFailure(error)
        }
    }
}

/// The rules as values: what is printed is exactly what `--apply` runs.
struct TransparentRules {
    static let chain = "DATAMODE_OUTPUT"

    enum Family: String {
        case ipv4 = "iptables"
        case ipv6 = "ip6tables"

        var loopback: String { self == .ipv4 ? "127.0.0.0/8" : "::1/128" }
    }

    var port: Int
    var uid: Int
    var ipv6: Bool
    /// `--dport` values (`80`, `8000:8100`); empty: every port.
    var ports: [String]

    var families: [Family] { ipv6 ? [.ipv4, .ipv6] : [.ipv4] }

    /// `80,443,8000-8100` → `["80", "443", "8000:8100"]`; every port 1…65535, ranges ascending.
    static func portSpecs(_ list: String) throws -> [String] {
        var specs: [String] = []
        for item in list.split(separator: ",", omittingEmptySubsequences: false) {
            let bounds = item.split(separator: "-", omittingEmptySubsequences: false)
            let numbers = bounds.compactMap { Int($0.trimmingCharacters(in: .whitespaces)) }
            guard (1...2).contains(bounds.count), numbers.count == bounds.count,
                  numbers.allSatisfy({ (1...65535).contains($0) }), numbers.first! <= numbers.last! else {
                throw ValidationError("--ports: \"\(item)\" is not a port (1-65535) or a range such as 8000-8100")
            }
            specs.append(numbers.count == 1 ? "\(numbers[0])" : "\(numbers[0]):\(numbers[1])")
        }
        return specs
    }

    /// The commands that create the chains and their jumps, as argument lists (without the program).
    func creation(_ family: Family) -> [[String]] {
        let chain = Self.chain
        var commands: [[String]] = [
            ["-t", "nat", "-N", chain],
            ["-t", "nat", "-A", chain, "-d", family.loopback, "-j", "RETURN"],
            ["-t", "nat", "-A", chain, "-m", "owner", "--uid-owner", "\(uid)", "-j", "RETURN"],
        ]
        if ports.isEmpty {
            commands.append(["-t", "nat", "-A", chain, "-p", "tcp", "-j", "REDIRECT", "--to-ports", "\(port)"])
        } else {
            for spec in ports {
                commands.append(["-t", "nat", "-A", chain, "-p", "tcp", "--dport", spec, "-j", "REDIRECT", "--to-ports", "\(port)"])
            }
        }
        commands += [
            ["-t", "nat", "-A", "OUTPUT", "-p", "tcp", "-j", chain],
            ["-t", "filter", "-N", chain],
            ["-t", "filter", "-A", chain, "-d", family.loopback, "-j", "RETURN"],
            ["-t", "filter", "-A", chain, "-p", "udp", "--dport", "443", "-j", "REJECT"],
            ["-t", "filter", "-A", "OUTPUT", "-p", "udp", "-j", chain],
        ]
        return commands
    }

    func script() -> String {
        var text = "# datamode-proxy transparent-rules --port \(port) --uid \(uid)"
        text += (ipv6 ? " --ipv6" : "") + (ports.isEmpty ? "" : " --ports \(ports.joined(separator: ",").replacingOccurrences(of: ":", with: "-"))")
        text += "\n# Outbound TCP to the transparent listener on port \(port), except to loopback and from uid \(uid);\n"
        text += "# outbound UDP 443 (QUIC) rejected. Run with NET_ADMIN; undo with --remove.\n"
        for family in families {
            for command in creation(family) {
                text += ([family.rawValue, "-w"] + command).joined(separator: " ") + "\n"
            }
        }
        return text
    }

    /// Replaces whatever an earlier run left with a fresh set; on a failure, what was made is taken away again.
    func apply(using runner: IPTablesRunner) throws {
        try remove(using: runner)
        for family in families {
            for command in creation(family) {
                let result = runner.run(family, command)
                guard result.status == 0 else {
                    try? remove(using: runner)
                    throw IPTablesFailure(family: family, arguments: command, output: result.output)
                }
            }
        }
    }

    /// Deletes every jump from OUTPUT to our chain and the chain itself, in both tables; what is absent is skipped.
    func remove(using runner: IPTablesRunner) throws {
        for family in families {
            for table in ["nat", "filter"] {
                let listing = runner.run(family, ["-t", table, "-S", "OUTPUT"])
                guard listing.status == 0 else {
                    throw IPTablesFailure(family: family, arguments: ["-t", table, "-S", "OUTPUT"], output: listing.output)
                }
                for line in listing.output.split(separator: "\n") {
                    let words = line.split(separator: " ").map(String.init)
                    guard words.first == "-A", words.count >= 4, words[words.count - 2] == "-j", words.last == Self.chain else { continue }
                    let delete = ["-t", table, "-D"] + words.dropFirst()
                    let result = runner.run(family, delete)
                    guard result.status == 0 else { throw IPTablesFailure(family: family, arguments: delete, output: result.output) }
                }
                guard runner.run(family, ["-t", table, "-S", Self.chain]).status == 0 else { continue }
                for command in [["-t", table, "-F", Self.chain], ["-t", table, "-X", Self.chain]] {
                    let result = runner.run(family, command)
                    guard result.status == 0 else { throw IPTablesFailure(family: family, arguments: command, output: result.output) }
                }
            }
        }
    }
}

/// A failed iptables command: the command and what it said, on one line.
struct IPTablesFailure: Error, CustomStringConvertible {
    var family: TransparentRules.Family
    var arguments: [String]
    var output: String

    var description: String {
        let said = output.split(separator: "\n").first.map(String.init) ?? "no output"
        return "\(([family.rawValue] + arguments).joined(separator: " ")) failed: \(said)"
    }
}

/// Runs iptables / ip6tables, after checking the two things that are missing most often, each with one line saying
/// what to do: the program itself, and the NET_ADMIN capability.
struct IPTablesRunner {
    private var programs: [TransparentRules.Family: String] = [:]

    init(families: [TransparentRules.Family]) throws {
        for family in families {
            guard let path = Self.find(family.rawValue) else {
                throw CommandFailure("\(family.rawValue) not found on PATH: install it (Debian: apt-get install iptables)")
            }
            programs[family] = path
        }
        guard Self.hasNetAdmin() else {
            throw CommandFailure("the NET_ADMIN capability is missing: run as root or with --cap-add NET_ADMIN "
                + "(Kubernetes: securityContext.capabilities.add: [NET_ADMIN])")
        }
    }

    /// posix_spawn, not Foundation's `Process`: `Process` needs a socket pair over loopback (CFSocket), which a
    /// fresh network namespace, where init containers run these rules, may not have up yet.
    func run(_ family: TransparentRules.Family, _ arguments: [String]) -> (status: Int32, output: String) {
        let argv = [programs[family]!, "-w"] + arguments
        var fds: [Int32] = [0, 0]
        guard pipe(&fds) == 0 else { return (127, "pipe: \(String(cString: strerror(errno)))") }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_adddup2(&actions, fds[1], 1)
        posix_spawn_file_actions_adddup2(&actions, fds[1], 2)
        posix_spawn_file_actions_addclose(&actions, fds[0])
        var cArguments = argv.map { strdup($0) } + [nil]
        defer { for argument in cArguments { free(argument) } }
        var pid = pid_t()
        let spawned = posix_spawn(&pid, argv[0], &actions, nil, &cArguments, environ)
        close(fds[1])
        defer { close(fds[0]) }
        guard spawned == 0 else { return (127, "cannot run \(argv[0]): \(String(cString: strerror(spawned)))") }
        var output: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let n = read(fds[0], &buffer, buffer.count)
            if n > 0 { output += buffer[0..<n]; continue }
            if n < 0 && errno == EINTR { continue }
            break
        }
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
        // WIFEXITED / WEXITSTATUS: a signal is reported as 128 + its number, like a shell.
        let exited = status & 0x7f == 0
        return (exited ? (status >> 8) & 0xff : 128 + (status & 0x7f), String(decoding: output, as: UTF8.self))
    }

    static func find(_ program: String) -> String? {
        let path = ProcessInfo.processInfo.environment["PATH"] ?? "/usr/sbin:/usr/bin:/sbin:/bin"
        for directory in path.split(separator: ":") {
            let candidate = "\(directory)/\(program)"
            if FileManager.default.isExecutableFile(atPath: candidate) { return candidate }
        }
        return nil
    }

    /// CAP_NET_ADMIN (12) in the effective set (`CapEff` of /proc/self/status).
    static func hasNetAdmin() -> Bool {
        guard let status = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8),
              let line = status.split(separator: "\n").first(where: { $0.hasPrefix("CapEff:") }),
              let mask = UInt64(line.dropFirst("CapEff:".count).trimmingCharacters(in: .whitespaces), radix: 16) else {
            return false
        }
        return mask & (1 << 12) != 0
    }
}
