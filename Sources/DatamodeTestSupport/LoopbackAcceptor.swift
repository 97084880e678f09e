import Foundation
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// The listener shared by the peers here: 127.0.0.1, port 0 read back, one thread per accepted connection
/// running the peer's `serve`, and `stop()` that shuts every socket down. Descriptors are closed only by the
/// thread that owns them, so a stopped peer can never close a descriptor number another test now uses.
final class LoopbackAcceptor: @unchecked Sendable {
    let port: UInt16

    private struct State {
        var stopped = false
        var listenFD: Int32
        var open: [Int: Int32] = [:]
        var accepted = 0
    }

    private let state: Mutex<State>

    init() throws {
        let (fd, port) = try Socket.listen()
        self.port = port
        state = Mutex(State(listenFD: fd))
    }

    /// Starts accepting; `serve` runs on its own thread per connection and the socket is closed after it.
    func start(_ serve: @escaping @Sendable (Int32) -> Void) {
        let fd = state.withLock { $0.listenFD }
        Thread.detachNewThread { [self] in acceptLoop(fd, serve) }
    }

    /// Connections accepted so far.
    var accepted: Int { state.withLock { $0.accepted } }

    func stop() {
        state.withLock { state in
            guard !state.stopped else { return }
            state.stopped = true
            _ = shutdown(state.listenFD, Int32(SHUT_RDWR))
            for fd in state.open.values { _ = shutdown(fd, Int32(SHUT_RDWR)) }
        }
    }

    private func acceptLoop(_ listenFD: Int32, _ serve: @escaping @Sendable (Int32) -> Void) {
        while true {
            let fd = accept(listenFD, nil, nil)
            if fd < 0 {
                let stopped = state.withLock { state -> Bool in
                    if state.stopped { Glibc.close(listenFD) }
                    return state.stopped
                }
                if stopped { return }
                continue
            }
            _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
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
                serve(fd)
                state.withLock { _ = $0.open.removeValue(forKey: number) }
                Glibc.close(fd)
            }
        }
    }
}
