import Foundation
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// The one listener of the test peers (`RecordingOrigin`, `EchoServer`, `UpgradeEchoOrigin`): 127.0.0.1, port 0
/// read back, one thread per accepted connection running the peer's `serve`, and `stop()` that shuts every
/// socket down. Descriptors are closed only by the thread that owns them (`stop()` merely shuts them down, which
/// wakes every blocked call), so a stopped peer can never close a descriptor number another test now uses.
///
/// Accepted sockets get TCP_NODELAY, so a peer's small writes (a head, an echo) leave at once. Running out of
/// descriptors (EMFILE, ENFILE: the descriptor-pressure tests) pauses accepting briefly instead of spinning.
final class LoopbackAcceptor: @unchecked Sendable {
    let port: UInt16

    private struct State {
        var stopped = false
        var listenFD: Int32
        var open: [Int: Int32] = [:]
        var accepted = 0
    }

    private let state: Mutex<State>

    /// Listens at once (connections queue in the backlog until `start`). `receiveBuffer` sets SO_RCVBUF,
    /// inherited by accepted sockets: a slow reader whose backlog shows at the peer.
    init(receiveBuffer: Int32? = nil) throws {
        let (fd, port) = try Socket.listen(receiveBuffer: receiveBuffer)
        self.port = port
        state = Mutex(State(listenFD: fd))
    }

    /// Starts accepting; `serve(fd, number)` runs on its own thread per connection (`number` is 1-based, in
    /// accept order) and the socket is closed after it returns.
    func start(_ serve: @escaping @Sendable (Int32, Int) -> Void) {
        let fd = state.withLock { $0.listenFD }
        Thread.detachNewThread { [self] in acceptLoop(fd, serve) }
    }

    /// Connections accepted so far.
    var accepted: Int { state.withLock { $0.accepted } }
    /// Connections accepted and not yet closed.
    var openCount: Int { state.withLock { $0.open.count } }
    /// Whether `stop()` was called.
    var isStopped: Bool { state.withLock { $0.stopped } }

    /// Stops accepting and shuts every connection down. Idempotent.
    func stop() {
        state.withLock { state in
            guard !state.stopped else { return }
            state.stopped = true
            _ = shutdown(state.listenFD, Int32(SHUT_RDWR))
            for fd in state.open.values { _ = shutdown(fd, Int32(SHUT_RDWR)) }
        }
    }

    private func acceptLoop(_ listenFD: Int32, _ serve: @escaping @Sendable (Int32, Int) -> Void) {
        while true {
            let fd = accept(listenFD, nil, nil)
            if fd < 0 {
                let code = errno
                // Close the listener only once stop() has shut it down (under the same lock), never before.
                let stopped = state.withLock { state -> Bool in
                    if state.stopped { Glibc.close(listenFD) }
                    return state.stopped
                }
                if stopped { return }
                if code == EMFILE || code == ENFILE { Thread.sleep(forTimeInterval: 0.01) }
                continue
            }
            _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
            var one: Int32 = 1
            _ = setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
            let number: Int? = state.withLock { state in
                if state.stopped { return nil }
                state.accepted += 1
                state.open[state.accepted] = fd
                return state.accepted
            }
            guard let number else {
                Glibc.close(fd)
                continue
            }
            Thread.detachNewThread { [self] in
                serve(fd, number)
                state.withLock { _ = $0.open.removeValue(forKey: number) }
                Glibc.close(fd)
            }
        }
    }
}
