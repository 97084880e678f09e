import CDatamodeShims
import CLibevent
import DatamodePolicy
#if canImport(Glibc)
import Glibc
#endif

/// An idle keep-alive connection while it waits for its next request with nothing of its session left: the socket,
/// what the next session needs to know about the peer, and one read event that also carries the rest of
/// `client-idle` as its timeout. Its `HTTP1Session`, transport, bufferevent, buffers and timers are freed when it
/// parks (`HTTP1Session.park`), as nginx keeps only a connection's core between keep-alive requests; the first
/// byte or the client's EOF makes a new session on the same socket (`wake`), and the idle timeout closes it.
/// The worker holds it in the session's place, so it is still one open connection (drain and shutdown close it).
final class ParkedConnection: ClientSession {
    unowned let worker: Worker
    private let fd: Int32
    private let peerAddress: IPAddress?
    private let peerText: String
    /// A transparent connection's original destination (SPEC §16), classified before it could park.
    private let transparent: TransparentConnection?
    /// When `client-idle` runs out (monotonic nanoseconds).
    private let idleUntil: UInt64
    private var readEvent: OpaquePointer?
    /// The socket was closed or handed to a new session.
    private var done = false

    private init(worker: Worker, fd: Int32, peerAddress: IPAddress?, peerText: String,
                 transparent: TransparentConnection?, idleUntil: UInt64) {
        self.worker = worker
        self.fd = fd
        self.peerAddress = peerAddress
        self.peerText = peerText
        self.transparent = transparent
        self.idleUntil = idleUntil
    }

    /// A parked connection for `fd`, its read event armed with `milliseconds` of `client-idle` left; nil when no
    /// event could be made (the session then stays as it is).
    static func make(worker: Worker, fd: Int32, peerAddress: IPAddress?, peerText: String,
                     transparent: TransparentConnection?, idleFor milliseconds: Int64) -> ParkedConnection? {
        let until = worker.clock.nowNanoseconds() + UInt64(max(0, milliseconds)) * 1_000_000
        let parked = ParkedConnection(worker: worker, fd: fd, peerAddress: peerAddress, peerText: peerText,
                                      transparent: transparent, idleUntil: until)
        guard let event = event_new(worker.base, fd, Int16(EV_READ), clientParkedReadCallback, context(parked)) else {
            return nil
        }
        parked.readEvent = event
        dm_event_add_ms(event, milliseconds)
        return parked
    }

    /// The socket is readable (a request's first byte, or EOF): a new session reads it, with what is left of
    /// `client-idle`. `timedOut`: `client-idle` ran out first; the connection is cut without a word, as a session
    /// cuts an idle one.
    func wake(timedOut: Bool) {
        freeEvent()
        guard !timedOut, let bev = bufferevent_socket_new(worker.base, fd, Int32(BEV_OPT_CLOSE_ON_FREE.rawValue)) else {
            close()
            return
        }
        done = true
        let session = HTTP1Session(worker: worker, bev: bev, peerAddress: peerAddress, peerText: peerText,
                                   transparent: transparent)
        worker.clientChangedHands(from: self, to: session)
        worker.metrics.connectionUnparked()
        let now = worker.clock.nowNanoseconds()
        session.resume(idleLeftMilliseconds: Int64((idleUntil > now ? idleUntil - now : 0) / 1_000_000))
    }

    func close() {
        guard !done else { return }
        done = true
        freeEvent()
        Glibc.close(fd)
        worker.metrics.connectionUnparked()
        worker.clientClosed(self)
    }

    /// Idle: nothing is in flight, so a drain closes it now.
    func drain() { close() }

    private func freeEvent() {
        if let readEvent { event_free(readEvent) }
        readEvent = nil
    }
}
