import CDatamodeShims
import CLibevent
#if canImport(Glibc)
import Glibc
#endif

/// Established CONNECT/Upgrade tunnels are relayed with splice(2) socket → pipe → socket, so tunnel bytes never
/// enter user space. Measured against moving evbuffer chains (100 MiB through CONNECT, proxy pinned to one
/// core): 0.31 against 0.71–0.74 CPU s/GB at the same throughput. `DATAMODE_TUNNEL_SPLICE=0` turns it off
/// (the evbuffer path is kept: it also carries a tunnel's first bytes and every TLS upstream).
///
/// One `SpliceRelay` is one direction. It reads from `source` into its pipe only while the pipe is empty, and
/// drains the pipe into `sink`; a full sink parks the direction on a write event (backpressure: nothing is
/// read while anything is in flight). EOF is relayed as a half-close once the pipe is empty.
final class SpliceRelay {
    static let enabled: Bool = getenv("DATAMODE_TUNNEL_SPLICE").map { String(cString: $0) != "0" } ?? true
    /// The pipe's size, and the most one read moves, unless a relay asks for more (`init(pipeSize:)`).
    static let chunk = 256 * 1024

    let source: Int32
    let sink: Int32
    private var pipe: [Int32] = [-1, -1]
    private var inPipe = 0
    private var readEvent: OpaquePointer?
    private var writeEvent: OpaquePointer?
    /// `readEvent` is added. It is added only when a read would block (EAGAIN): a relay that stopped reading (a
    /// full sink, an empty quota) and resumes reads at once, and registers nothing when the source has bytes, as a
    /// shaped body's always has (one epoll_ctl less per wake-up each way).
    private var readArmed = false
    /// The source reached EOF (what it sent may still be in the pipe).
    private(set) var ended = false
    /// EOF was read and everything before it was written to the sink: this direction is over.
    var finished: Bool { ended && inPipe == 0 }
    private(set) var failed = false
    /// The failure was writing to the sink (else reading the source): tells which peer broke off.
    private(set) var failedWriting = false
    private(set) var moved: UInt64 = 0
    /// Called after every step that may have changed `ended` / `failed` / `moved`.
    var onProgress: ((SpliceRelay) -> Void)?

    /// At most this many bytes are read from the source (a Content-Length body: not one byte of the next
    /// message may be taken from the socket); nil for a tunnel, which runs until EOF.
    let limit: UInt64?
    /// A tunnel passes the source's EOF on as a half-close of the sink; a body does not (the client connection
    /// carries on).
    let passesEOF: Bool
    private var taken: UInt64 = 0
    /// A limited relay moved all its bytes.
    var complete: Bool { limit.map { moved == $0 } ?? false }
    /// For a shaped body (SPEC §10): how many of the bytes wanted may be read from the source now, asked before
    /// each read, when the pipe is empty (everything moved so far has reached the sink). 0: none now; the one who
    /// answered wakes the relay (`resume`) when some may. nil: unshaped.
    var quota: ((Int) -> Int)?
    /// The quota was 0: reading waits for `resume`.
    private(set) var waitingForQuota = false

    /// The pipe's size as asked (the kernel may give less: then each read moves less), and the most one read moves.
    let pipeSize: Int

    private let base: OpaquePointer
    /// Where the pipe came from and goes back to, empty, when the relay ends (nil: made and closed here).
    private let pipes: PipePool?
    /// `stop` ran: no event is made or added any more.
    private var stopped = false

    init?(base: OpaquePointer, source: Int32, sink: Int32, limit: UInt64? = nil, pipeSize: Int = SpliceRelay.chunk,
          pipes: PipePool? = nil) {
        self.base = base
        self.source = source
        self.sink = sink
        self.limit = limit
        self.passesEOF = limit == nil
        self.pipeSize = pipeSize
        self.pipes = pipeSize == SpliceRelay.chunk ? pipes : nil
        if let kept = self.pipes?.take() {
            pipe = [kept.read, kept.write]
        } else {
            guard dm_splice_pipe(&pipe, Int32(pipeSize)) == 0 else { return nil }
        }
    }

    deinit {
        stop()
        // Only an empty pipe is kept: bytes left in one would reach the next relay's sink.
        if inPipe == 0, let pipes, pipe[0] >= 0 {
            pipes.give(read: pipe[0], write: pipe[1])
        } else {
            if pipe[0] >= 0 { Glibc.close(pipe[0]) }
            if pipe[1] >= 0 { Glibc.close(pipe[1]) }
        }
    }

    /// Waits for the source to be readable (a tunnel: its bytes come later).
    func start() {
        armRead()
    }

    /// Moves what it can now, then waits only for what would block (a body whose bytes are already in the source's
    /// socket moves without an event made or added). `onProgress` is called before this returns.
    func startAtOnce() {
        sourceReadable()
    }

    private func armRead() {
        guard !readArmed, !stopped else { return }
        if readEvent == nil {
            readEvent = event_new(base, source, Int16(EV_READ | EV_PERSIST), spliceReadableCallback, context(self))
        }
        readArmed = true
        event_add(readEvent, nil)
    }

    private func armWrite() {
        guard !stopped else { return }
        if writeEvent == nil {
            writeEvent = event_new(base, sink, Int16(EV_WRITE | EV_PERSIST), spliceWritableCallback, context(self))
        }
        event_add(writeEvent, nil)
    }

    private func disarmRead() {
        guard readArmed else { return }
        readArmed = false
        event_del(readEvent)
    }

    func stop() {
        stopped = true
        if let readEvent { event_free(readEvent) }
        if let writeEvent { event_free(writeEvent) }
        readEvent = nil
        writeEvent = nil
    }

    func sourceReadable() {
        while !ended && !failed {
            if inPipe > 0 && !drain() { break }
            var want = limit.map { Int(min(UInt64(pipeSize), $0 - taken)) } ?? pipeSize
            guard want > 0 else {
                disarmRead()  // the whole body is in: nothing more is read
                break
            }
            if let quota {
                want = min(want, quota(want))
                guard want > 0 else {
                    waitingForQuota = true
                    disarmRead()
                    break
                }
            }
            let n = dm_splice(source, pipe[1], want)
            if n > 0 {
                inPipe += n
                taken += UInt64(n)
                continue
            }
            if n == 0 {
                ended = true
                disarmRead()
                if inPipe == 0 && passesEOF { shutdown(sink, Int32(SHUT_WR)) }
            } else if errno == EAGAIN {
                armRead()
            } else {
                failed = true
            }
            break
        }
        onProgress?(self)
    }

    /// The quota may allow bytes again (the shaping timer fired): reading resumes, unless the relay waits for the
    /// sink, whose write event resumes it.
    func resume() {
        guard waitingForQuota, !stopped else { return }
        waitingForQuota = false
        sourceReadable()
    }

    func sinkWritable() {
        if drain() {
            if let writeEvent { event_del(writeEvent) }
            if ended {
                if passesEOF { shutdown(sink, Int32(SHUT_WR)) }
            } else if limit.map({ taken < $0 }) ?? true {
                sourceReadable()
                return
            }
        }
        onProgress?(self)
    }

    /// Empties the pipe into the sink; false when the sink is full (then waits for it, not reading meanwhile).
    private func drain() -> Bool {
        while inPipe > 0 {
            let n = dm_splice(pipe[0], sink, inPipe)
            if n > 0 {
                inPipe -= n
                moved += UInt64(n)
                continue
            }
            if n < 0 && errno == EAGAIN {
                disarmRead()
                armWrite()
                return false
            }
            failed = true
            failedWriting = true
            return false
        }
        return true
    }
}

/// Empty splice pipes kept between the relays of one worker (issue 31): a pipe costs `pipe2`, `fcntl` to size it and
/// two `close`s, which made splicing a 100 KiB body cost more than copying it. Only pipes of the default size
/// (`SpliceRelay.chunk`) are kept, and only empty ones (`SpliceRelay.deinit`); a few at most, each holding two
/// descriptors and no pages while empty. Used on its worker's thread only.
final class PipePool {
    static let capacity = 8
    private var kept: [(read: Int32, write: Int32)] = []

    init() {
        kept.reserveCapacity(Self.capacity)
    }

    deinit {
        for pipe in kept {
            Glibc.close(pipe.read)
            Glibc.close(pipe.write)
        }
    }

    func take() -> (read: Int32, write: Int32)? {
        kept.popLast()
    }

    func give(read: Int32, write: Int32) {
        guard kept.count < Self.capacity else {
            Glibc.close(read)
            Glibc.close(write)
            return
        }
        kept.append((read, write))
    }
}
