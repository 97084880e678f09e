import CDatamodeShims
import DatamodeConfig
import DatamodePolicy
import DatamodeState
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// One JSON line per request (SPEC §8): time, client, method, url, status, bytes, outcome, reason, variant,
/// duration; `bytesIn` / `bytesOut` are the body (or tunnel) bytes from and to the client, `bytes` repeats
/// `bytesOut`. A tunnel's line is written when it ends, so its counts and duration cover the whole tunnel.
/// `tags`, `rule` and `tagSources` say why a request was allowed or refused (README: the access log).
///
/// Writing it never blocks a worker (SPEC §8). Workers only append the line to a bounded backlog (a mutex held
/// for one copy); a dedicated writer thread does the write(2)s, in batches. When the reader of stdout stalls (a
/// pipe into a busy log shipper), the writer blocks, the backlog fills, and further lines are dropped and counted
/// (`datamode_log_dropped_total`) — requests go on. Why a thread rather than non-blocking writes from the
/// workers' loops: stdout is an open file description shared with the parent (a shell's terminal, a supervisor's
/// pipe), so setting O_NONBLOCK on it would change it under them too; and regular files ignore O_NONBLOCK, so a
/// log file on a stalled disk would still block. One writer also means lines never interleave.
public final class AccessLog: Sendable {
    /// At most this many bytes of lines wait or are being written; a line that does not fit is dropped.
    /// A few thousand typical lines: room for a reader's hiccup, not for a reader that has stopped.
    static let backlogLimit = 1 << 20

    private let output: LogOutput?

    /// Opens the destination; a file that cannot be opened is an error naming it.
    public init(destination: AccessLogDestination) throws(EngineError) {
        switch destination {
        case .off:
            output = nil
        case .stdout:
            output = try LogOutput(fd: 1, ownsDescriptor: false)
        case .file(let path):
            let opened = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o644)
            guard opened >= 0 else {
                throw EngineError("cannot open access log \(path): \(String(cString: strerror(errno)))")
            }
            output = try LogOutput(fd: opened, ownsDescriptor: true)
        }
        output?.startWriter()
    }

    deinit {
        output?.finish()
    }

    public var isEnabled: Bool { output != nil }

    /// Lines dropped because the destination did not keep up (or failed).
    var dropped: Int { output?.dropped.load(ordering: .relaxed) ?? 0 }

    /// Lets the writer write what is queued, waiting at most `timeout` (a destination that stopped reading must
    /// not keep the process from exiting). No line is accepted afterwards.
    func finish(timeout: Duration) {
        guard let output else { return }
        output.finish()
        let deadline = ContinuousClock.now + timeout
        while !output.writerDone.load(ordering: .acquiring) && ContinuousClock.now < deadline { usleep(2_000) }
    }

    func write(time: Int64, client: String, proto: String, method: String, url: String, status: Int, bytesIn: UInt64,
               bytesOut: UInt64, outcome: String, reason: String?, variant: String?, tags: RequestTags?,
               tagSources: TagProvenance, rule: String?, source: String, durationSeconds: Double) {
        guard let output else { return }
        var line = "{\"time\":\"\(Timestamp.rfc3339(wallNanoseconds: time))\",\"client\":\(JSONText.quote(client))"
        line += ",\"proto\":\"\(proto)\""
        line += ",\"method\":\(JSONText.quote(method)),\"url\":\(JSONText.quote(url)),\"status\":\(status)"
        line += ",\"bytes\":\(bytesOut),\"bytesIn\":\(bytesIn),\"bytesOut\":\(bytesOut),\"outcome\":\"\(outcome)\""
        line += ",\"reason\":" + (reason.map(JSONText.quote) ?? "null")
        line += ",\"variant\":" + (variant.map(JSONText.quote) ?? "null")
        line += ",\"source\":\"\(source)\""
        if let tags {
            line += ",\"tags\":{\"allow-constrained\":\(tags.allowConstrained),\"allow-expensive\":\(tags.allowExpensive)"
            line += ",\"allow-ultra-constrained\":\(tags.allowUltraConstrained)}"
            line += ",\"rule\":" + (rule.map(JSONText.quote) ?? "null")
            line += ",\"tagSources\":{\"allow-constrained\":\"\(tagSources.constrained.name)\""
            line += ",\"allow-expensive\":\"\(tagSources.expensive.name)\""
            line += ",\"allow-ultra-constrained\":\"\(tagSources.ultraConstrained.name)\"}"
        } else {
            line += ",\"tags\":null,\"rule\":null,\"tagSources\":null"
        }
        let micros = Int((durationSeconds * 1_000_000).rounded())
        line += ",\"duration\":\(micros / 1_000_000).\(Self.sixDigits(micros % 1_000_000))}\n"
        line.withUTF8 { output.append(UnsafeRawBufferPointer($0)) }
    }

    private static func sixDigits(_ value: Int) -> String {
        let text = String(value)
        return String(repeating: "0", count: 6 - text.count) + text
    }
}

/// An engine failure to start or run, with a message for the operator.
public struct EngineError: Error, CustomStringConvertible, Sendable {
    public var description: String
    public init(_ description: String) { self.description = description }
}

/// The backlog and the writer thread of an enabled access log. Shared by the workers (appending) and the writer
/// thread (which keeps it alive until it has finished).
final class LogOutput: Sendable {
    private struct Backlog {
        /// Lines waiting for the writer.
        var waiting: [UInt8] = []
        /// Bytes the writer took and has not finished writing (they count against the limit too).
        var writing = 0
        var finishing = false
    }

    let fd: Int32
    private let ownsDescriptor: Bool
    private let backlog = Mutex(Backlog())
    let dropped = Atomic<Int>(0)
    let writerDone = Atomic<Bool>(false)
    /// The writer sleeps in a read of `wake.read`; an append to an empty backlog writes one byte to `wake.write`.
    private let wake: (read: Int32, write: Int32)

    init(fd: Int32, ownsDescriptor: Bool) throws(EngineError) {
        var fds: [Int32] = [0, 0]
        guard pipe(&fds) == 0 else {
            if ownsDescriptor { Glibc.close(fd) }
            throw EngineError("access log: pipe failed: \(String(cString: strerror(errno)))")
        }
        for fd in fds { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
        _ = fcntl(fds[1], F_SETFL, fcntl(fds[1], F_GETFL) | O_NONBLOCK)
        self.fd = fd
        self.ownsDescriptor = ownsDescriptor
        self.wake = (fds[0], fds[1])
    }

    deinit {
        if ownsDescriptor { Glibc.close(fd) }
        Glibc.close(wake.read)
        Glibc.close(wake.write)
    }

    func startWriter() {
        let box = Unmanaged.passRetained(self).toOpaque()
        var thread = pthread_t()
        let result = pthread_create(&thread, nil, { argument in
            let output = Unmanaged<LogOutput>.fromOpaque(argument!).takeRetainedValue()
            output.runWriter()
            return nil
        }, box)
        if result == 0 {
            pthread_detach(thread)
        } else {
            Unmanaged<LogOutput>.fromOpaque(box).release()
            writerDone.store(true, ordering: .releasing)
        }
    }

    /// Called by workers: queues one whole line, or drops it when the backlog is full. Never blocks on I/O.
    func append(_ line: UnsafeRawBufferPointer) {
        let wasEmpty = backlog.withLock { state -> Bool? in
            guard !state.finishing, state.waiting.count + state.writing + line.count <= AccessLog.backlogLimit else {
                return nil
            }
            let wasEmpty = state.waiting.isEmpty
            state.waiting.append(contentsOf: line)
            return wasEmpty
        }
        switch wasEmpty {
        case nil: dropped.add(1, ordering: .relaxed)
        case true?: signalWriter()
        case false?: break
        }
    }

    /// No more lines; the writer writes what is queued and stops.
    func finish() {
        backlog.withLock { $0.finishing = true }
        signalWriter()
    }

    private func signalWriter() {
        var byte: UInt8 = 1
        _ = Glibc.write(wake.write, &byte, 1)  // a full pipe already holds a wake-up
    }

    private func runWriter() {
        dm_block_process_signals()
        defer { writerDone.store(true, ordering: .releasing) }
        var batch: [UInt8] = []
        var signals = [UInt8](repeating: 0, count: 64)
        while true {
            let n = Glibc.read(wake.read, &signals, signals.count)
            if n < 0 && errno == EINTR { continue }
            let finishing = backlog.withLock { state -> Bool in
                swap(&state.waiting, &batch)
                state.writing = batch.count
                return state.finishing
            }
            if !batch.isEmpty { writeAll(batch) }
            batch.removeAll(keepingCapacity: true)
            backlog.withLock { $0.writing = 0 }
            if finishing && backlog.withLock({ $0.waiting.isEmpty }) { return }
            if n == 0 { return }  // cannot happen: this object holds the write end
        }
    }

    /// Writes the batch whole, waiting as long as the destination needs; lines it cannot take at all are dropped.
    private func writeAll(_ batch: [UInt8]) {
        batch.withUnsafeBytes { bytes in
            var offset = 0
            while offset < bytes.count {
                let n = Glibc.write(fd, bytes.baseAddress! + offset, bytes.count - offset)
                if n > 0 { offset += n; continue }
                if n < 0 && errno == EINTR { continue }
                if n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) {
                    // Someone made the shared descriptor non-blocking: wait for room, this thread may block.
                    var entry = pollfd(fd: fd, events: Int16(POLLOUT), revents: 0)
                    _ = poll(&entry, 1, 100)
                    continue
                }
                // EPIPE, EBADF, ENOSPC…: what is left of this batch is lost; count its lines.
                let lost = bytes[offset...].reduce(0) { $0 + ($1 == UInt8(ascii: "\n") ? 1 : 0) }
                dropped.add(lost, ordering: .relaxed)
                return
            }
        }
    }
}
