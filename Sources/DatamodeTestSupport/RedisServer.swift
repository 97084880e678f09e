import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A real `redis-server` (Debian's, installed by `scripts/bootstrap.sh --test`) for the shared store's tests
/// (SPEC §19): on a free loopback port, in a temporary directory, without persistence unless asked; stopped by its
/// PID. `restart()` starts it again on the same port (the proxies' URL does not change), empty unless `appendOnly`.
public final class RedisServer: @unchecked Sendable {
    public let directory: String
    public let port: UInt16
    public let password: String?
    public let appendOnly: Bool
    private var process: Process?

    public struct LaunchError: Error, CustomStringConvertible {
        public var description: String
    }

    /// The `redis-server` on PATH or in /usr/bin.
    public static var binary: String? {
        for candidate in ["/usr/bin/redis-server", "/usr/local/bin/redis-server"]
        where FileManager.default.isExecutableFile(atPath: candidate) { return candidate }
        return nil
    }

    public init(password: String? = nil, appendOnly: Bool = false) throws {
        guard Self.binary != nil else {
            throw LaunchError(description: "redis-server is not installed: run ./scripts/bootstrap.sh --test")
        }
        directory = try ScratchDirectory.make("datamode-redis")
        port = try LoopbackPort.refusingConnections()
        self.password = password
        self.appendOnly = appendOnly
        try start()
    }

    deinit {
        stop()
        ScratchDirectory.remove(directory)
    }

    /// `redis://127.0.0.1:PORT/0`.
    public var url: String { "redis://127.0.0.1:\(port)/0" }

    public var isRunning: Bool { process?.isRunning ?? false }

    /// Starts the server and waits until it answers `PING`.
    public func start() throws {
        guard !isRunning, let binary = Self.binary else { return }
        let process = Process()
        process.executableURL = URL(fileURLWithPath: binary)
        var arguments = ["--port", "\(port)", "--bind", "127.0.0.1", "--dir", directory, "--save", "",
                         "--appendonly", appendOnly ? "yes" : "no", "--daemonize", "no", "--logfile", directory + "/redis.log"]
        if appendOnly { arguments += ["--appendfsync", "always"] }
        if let password { arguments += ["--requirepass", password] }
        process.arguments = arguments
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        process.standardInput = FileHandle.nullDevice
        try process.run()
        self.process = process
        let deadline = ContinuousClock.now + .seconds(10)
        while ContinuousClock.now < deadline {
            if (try? command(["PING"])) == "PONG" { return }
            guard process.isRunning else { throw LaunchError(description: "redis-server exited: \(log)") }
            usleep(20_000)
        }
        throw LaunchError(description: "redis-server did not answer within 10 s: \(log)")
    }

    /// Kills the server (SIGKILL: no goodbye to its clients) and waits for it.
    public func kill() {
        guard let process, process.isRunning else { return }
        Glibc.kill(process.processIdentifier, SIGKILL)
        Glibc.kill(process.processIdentifier, SIGCONT)
        process.waitUntilExit()
    }

    /// Freezes the server (SIGSTOP): connections stay open and nothing is answered, a Redis that is slow forever.
    public func pause() {
        guard let process, process.isRunning else { return }
        Glibc.kill(process.processIdentifier, SIGSTOP)
    }

    /// Lets a paused server go on (SIGCONT).
    public func resume() {
        guard let process, process.isRunning else { return }
        Glibc.kill(process.processIdentifier, SIGCONT)
    }

    /// Stops the server and waits for it. SIGKILL, as `kill()`: a child of a process whose threads block SIGTERM
    /// (the engine's workers do) inherits that mask, and nothing here needs a clean shutdown (persistence is off,
    /// or the append-only file is fsynced at every write).
    public func stop() {
        kill()
    }

    /// Stops and starts it again on the same port.
    public func restart() throws {
        kill()
        try start()
    }

    public var log: String { (try? String(contentsOfFile: directory + "/redis.log", encoding: .utf8)) ?? "" }

    /// Runs one command through `redis-cli` (Debian's redis-tools, installed with the server) and returns its
    /// answer as redis-cli prints it without a terminal: a value, `OK`, an integer, an empty line for nil.
    public func command(_ arguments: [String]) throws -> String {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/redis-cli")
        var cli = ["-h", "127.0.0.1", "-p", "\(port)"]
        if let password { cli += ["-a", password, "--no-auth-warning"] }
        process.arguments = cli + arguments
        let output = Pipe()
        process.standardOutput = output
        process.standardError = output
        process.standardInput = FileHandle.nullDevice
        try process.run()
        let data = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        var text = String(decoding: data, as: UTF8.self)
        if text.hasSuffix("\n") { text.removeLast() }
        return text
    }

    /// The value of `key` (nil: none).
    public func get(_ key: String) throws -> String? {
        let reply = try command(["GET", key])
        return reply.isEmpty ? nil : reply
    }
}
