import CLibevent
#if canImport(Glibc)
import Glibc
#endif

/// The rest of a large Content-Length response body, moved kernel to kernel (splice(2)) once nothing of the
/// exchange is buffered in user space (so order is kept), the request is complete, and the framing is passed
/// through unchanged. The relay reads exactly the bytes left of the body from the origin's socket, never the
/// next response. Made only for a body that qualifies: other exchanges pay one check (`ExchangeDriver.afterFlush`).
///
/// An origin faster than the client never leaves those buffers empty by itself (the first 100 MiB download of
/// bench/run on a fresh connection was never spliced). So once the body qualifies, the origin is no longer read
/// while the client is being written to, or while a link bucket holds the bytes back: what was read drains
/// (`draining`), then the rest is spliced.
///
/// A shaped body (SPEC §10) is spliced too: before each read into the pipe the relay asks the link bucket how much
/// may pass (`SpliceRelay.quota`), after what it moved so far was counted, so each read is capped by the bucket's
/// tokens; when the bucket is empty the relay stops reading and the session's shaping timer wakes it (`resume`).
/// At 1 Gbit/s this moves 256 KiB per wake-up kernel to kernel instead of relaying through the buffers, where a
/// body held back at the origin's read watermark cost most of a core (bench/results, section 8). An exchange with
/// a `hard` budget is not spliced: each of its moves is capped by what is left of the budget.
final class BodySplice {
    /// Whether large Content-Length bodies are spliced (`DATAMODE_BODY_SPLICE=0` turns it off, as
    /// `DATAMODE_TUNNEL_SPLICE` does for tunnels: an operator's escape hatch).
    static let enabled: Bool = getenv("DATAMODE_BODY_SPLICE").map { String(cString: $0) != "0" } ?? true
    /// Below this much body left, copying the rest costs less than splicing it. The first threshold was 1 MiB:
    /// with 64 KiB, 100 KiB responses had cost 105 instead of 58 us each (bench/results/2026-11-24-2312.md: a
    /// pipe made, two events and two bufferevent switches per response), and the bulk read took such a body into
    /// user space before it could qualify anyway. Now pipes are kept (`PipePool`), the first moves need no event
    /// (`SpliceRelay.startAtOnce`), and the body stays in the socket while the head is read
    /// (`UpstreamLease.upstreamReadable`).
    static let threshold: UInt64 = 64 << 10

    /// The driver that owns this (and outlives it): not reference-counted, as it is read on every relay step.
    unowned(unsafe) let driver: ExchangeDriver
    /// The origin is not read while what was read of the body drains to the client.
    private(set) var draining = false
    /// The splice relay, once started.
    private(set) var relay: SpliceRelay?
    /// Bytes the relay had moved at its last report.
    private var moved: UInt64 = 0

    init(driver: ExchangeDriver) {
        self.driver = driver
    }

    /// What is left of the driver's response body when it may be spliced now or after a drain, else nil.
    static func remaining(_ driver: ExchangeDriver) -> UInt64? {
        guard enabled, driver.transport.isPlain, driver.allowance.allowsBodySplice(driver.worker.budgets),
              let response = driver.response, response.capture == nil,
              case .relaying(untilClose: false) = driver.machine.phase, driver.machine.requestComplete,
              !driver.machine.originEnded,
              let remaining = response.body.remainingLength, remaining >= threshold,
              let upstream = driver.upstream, upstream.isConnected, upstream.isPlainTCP,
              evbuffer_get_length(upstream.output) == 0, evbuffer_get_length(driver.input) == 0 else { return nil }
        return remaining
    }

    /// What `startWhenIdle` did.
    enum Start {
        /// Splicing, or draining first.
        case started
        /// The whole body moved at once and the exchange went on (it may have ended): the caller flushes again.
        case ended
        /// No pipe could be made: the body streams on through the buffers.
        case failed
    }

    /// The body qualifies (`remaining` bytes left): splice now if nothing is buffered, else drain first. What is in
    /// the origin's socket already moves at once (`SpliceRelay.startAtOnce`); only what would block waits for an
    /// event.
    func startWhenIdle(remaining: UInt64) -> Start {
        guard relay == nil, let upstream = driver.upstream else { return .started }
        guard evbuffer_get_length(upstream.input) == 0, driver.outputLength == 0 else {
            // Only while a write event or the shaping timer is armed: it comes when the client takes bytes or the
            // bucket refills, and the relay then moves what was read. Without one, nothing would wake the exchange
            // once the origin is no longer read.
            if !draining && (driver.transport.isWaitingToWrite || driver.session.shaping.deadline != nil) {
                draining = true
                upstream.suspendIO()
            }
            return .started
        }
        // A shaped body moves a bucket's quantum per wake-up: up to 1 MiB through one pipe that size at high rates
        // (at 1 Gbit/s, 0.37 against 0.76 CPU s/GB with 256 KiB pipes, which woke the relay four times as often
        // and each time read and wrote a quarter as much); other relays keep 256 KiB pipes (pipe pages count
        // against a user's limit, and tunnels are many).
        let pipeSize = driver.allowance.link.map { max(SpliceRelay.chunk, $0.down.quantum) } ?? SpliceRelay.chunk
        let worker = driver.worker
        guard let relay = SpliceRelay(base: worker.base, source: upstream.socket, sink: driver.transport.socket,
                                      limit: remaining, pipeSize: pipeSize, pipes: worker.pipes) else {
            stopDraining()
            return .failed
        }
        draining = false
        relay.onProgress = { [unowned self] relay in self.progressed(relay) }
        if driver.allowance.link != nil {
            relay.quota = { [unowned self] wanted in self.quota(wanted) }
        }
        self.relay = relay
        worker.metrics.bodySpliced()
        startingAtOnce = true
        relay.startAtOnce()
        startingAtOnce = false
        if endedAtOnce { return .ended }
        // The relay waits for one of the sockets: libevent lets go of both until it is over. Not before: a body
        // that moved whole at once (the usual case, its bytes already in the socket) costs no epoll_ctl this way.
        if self.relay === relay {
            driver.transport.suspendForSplice()
            upstream.suspendIO()
        }
        return .started
    }

    /// Inside `startWhenIdle`'s first moves: an end reached there is not flushed here but by the caller, which is
    /// inside a flush already (`HTTP1Session.flushPendingWrites`).
    private var startingAtOnce = false
    /// The relay ended inside `startWhenIdle`.
    private var endedAtOnce = false

    /// The body no longer qualifies (or no pipe could be made): the origin is read again.
    func stopDraining() {
        guard draining else { return }
        draining = false
        driver.upstream?.resumeIO()
    }

    /// The bucket refilled (the session's shaping timer): a relay waiting for it reads again.
    func resume() {
        relay?.resume()
    }

    /// How many of `wanted` bytes the link bucket lets the relay read now. What the relay moved so far is counted
    /// first (charged to the bucket), so the answer accounts for it; 0 arms the shaping timer (`Allowance.room`).
    private func quota(_ wanted: Int) -> Int {
        guard let relay else { return 0 }
        countMoved(relay)
        return driver.allowance.room(.down, room: wanted, available: wanted, session: driver.session)
    }

    /// What the relay moved since its last report is relayed body, counted once (`ExchangeDriver.counted`).
    private func countMoved(_ relay: SpliceRelay) {
        let delta = relay.moved - moved
        moved = relay.moved
        if delta > 0 {
            driver.response?.body.movedElsewhere(delta)
            driver.counted(.down, Int(delta))
        }
    }

    private func progressed(_ relay: SpliceRelay) {
        countMoved(relay)
        if relay.failed {
            driver.session.abort(relay.failedWriting ? .clientAborted : .upstreamAborted, detail: "body splice failed")
            return
        }
        guard relay.complete || relay.finished else { return }
        // The body is over, or the origin closed before its end: libevent takes both sockets back.
        let driver = self.driver
        stop()
        driver.response?.splice = nil
        driver.transport.resumeAfterSplice()
        driver.upstream?.resumeIO()
        if relay.complete {
            driver.perform(driver.machine.responseBodyStep(RelayStep(result: .complete, before: 0, left: 0), unwritten: false))
        } else {
            _ = driver.machine.originSentEOF()
            driver.perform(driver.machine.responseBodyStep(RelayStep(result: .moving, before: 0, left: 0), unwritten: false))
        }
        if startingAtOnce {
            endedAtOnce = true
        } else {
            driver.session.flushPendingWrites()
        }
    }

    /// The exchange ends (or its session is freed): the relay stops.
    func stop() {
        relay?.stop()
        relay = nil
    }
}
