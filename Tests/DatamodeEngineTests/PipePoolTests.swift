import CLibevent
@testable import DatamodeEngine
import Glibc
import Testing

/// The worker's kept splice pipes (`PipePool`): a relay gives its pipe back only empty, and the pool keeps a few.
@Suite struct PipePoolTests {
    static func isOpen(_ fd: Int32) -> Bool { fcntl(fd, F_GETFD) != -1 }

    static func socketPair() -> (Int32, Int32) {
        var fds: [Int32] = [-1, -1]
        precondition(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0, &fds) == 0)
        return (fds[0], fds[1])
    }

    @Test func thePoolKeepsAtMostItsCapacityAndClosesTheRest() {
        let pool = PipePool()
        var given: [(Int32, Int32)] = []
        for _ in 0..<(PipePool.capacity + 2) {
            var fds: [Int32] = [-1, -1]
            #expect(pipe(&fds) == 0)
            given.append((fds[0], fds[1]))
            pool.give(read: fds[0], write: fds[1])
        }
        // (Closed descriptors are not checked by number: another test running alongside may reuse it at once.)
        var taken: [(read: Int32, write: Int32)] = []
        while let pipe = pool.take() { taken.append(pipe) }
        #expect(taken.count == PipePool.capacity, "beyond capacity, pipes are closed, not kept")
        #expect(Set(taken.map(\.read)) == Set(given.prefix(PipePool.capacity).map(\.0)))
        for pipe in taken { #expect(Self.isOpen(pipe.read) && Self.isOpen(pipe.write)); close(pipe.read); close(pipe.write) }
    }

    @Test func aRelayGivesItsPipeBackOnlyEmpty() throws {
        let base = event_base_new()!
        defer { event_base_free(base) }
        let pool = PipePool()
        let (sourceIn, source) = Self.socketPair()
        let (sink, sinkOut) = Self.socketPair()
        defer { [sourceIn, source, sink, sinkOut].forEach { close($0) } }
        let payload = [UInt8](repeating: 7, count: 1000)
        #expect(send(sourceIn, payload, payload.count, 0) == payload.count)

        // Every byte moves at once: the pipe is empty and goes back to the pool.
        var relay: SpliceRelay? = SpliceRelay(base: base, source: source, sink: sink, limit: 1000, pipes: pool)
        relay!.startAtOnce()
        #expect(relay!.complete)
        relay = nil
        let kept = try #require(pool.take())
        #expect(Self.isOpen(kept.read))
        pool.give(read: kept.read, write: kept.write)

        // A sink that takes nothing more: bytes stay in the pipe, which is closed, not kept.
        var small: Int32 = 4096
        setsockopt(sink, SOL_SOCKET, SO_SNDBUF, &small, socklen_t(MemoryLayout<Int32>.size))
        let big = [UInt8](repeating: 9, count: 200_000)
        var sent = 0
        while sent < big.count {
            let n = big.withUnsafeBytes { send(sourceIn, $0.baseAddress! + sent, big.count - sent, 0) }
            if n <= 0 { break }
            sent += n
        }
        relay = SpliceRelay(base: base, source: source, sink: sink, limit: UInt64(sent), pipes: pool)
        relay!.startAtOnce()
        #expect(!relay!.complete)
        #expect(pool.take() == nil, "the relay took the kept pipe")
        relay!.stop()
        relay = nil
        #expect(pool.take() == nil, "a pipe with bytes in it is not kept")
    }
}
