import CLibevent
@testable import DatamodeEngine
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// `SocketReader` on real loopback TCP sockets: what one readiness reads, and how it reports the end of a stream, a
/// reset and a full input, as libevent's own read path (`bufferevent_readcb`) does.
@Suite struct SocketReaderTests {
    /// A connected loopback TCP pair: `ours` non-blocking (the reader's end), `peer` blocking.
    final class Pair {
        let base = event_base_new()!
        let ours: Int32
        private(set) var peer: Int32
        let input = evbuffer_new()!
        let scratch = UnsafeMutableRawPointer.allocate(byteCount: SocketReader.readSize, alignment: 16)
        var reader = SocketReader()

        init() throws {
            let listener = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            var address = sockaddr_in()
            address.sin_family = sa_family_t(AF_INET)
            address.sin_addr.s_addr = inet_addr("127.0.0.1")
            var length = socklen_t(MemoryLayout<sockaddr_in>.size)
            try withUnsafeMutablePointer(to: &address) {
                try $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    try #require(bind(listener, $0, length) == 0 && listen(listener, 1) == 0)
                    try #require(getsockname(listener, $0, &length) == 0)
                }
            }
            let client = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            try withUnsafePointer(to: &address) {
                try $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { try #require(connect(client, $0, length) == 0) }
            }
            let accepted = accept(listener, nil, nil)
            Glibc.close(listener)
            try #require(accepted >= 0)
            peer = client
            ours = accepted
            _ = fcntl(ours, F_SETFL, fcntl(ours, F_GETFL) | O_NONBLOCK)
            // The reader's event is made and added, as an owner does; the test calls `readReady` itself.
            reader.start(base: base, bev: nil, fd: ours, callback: { _, _, _ in }, owner: scratch)
            let unused = bufferevent_socket_new(base, -1, 0)!
            reader.setReading(true, bev: unused)
            bufferevent_free(unused)
        }

        func send(_ bytes: [UInt8]) {
            var sent = 0
            while sent < bytes.count {
                let n = bytes[sent...].withUnsafeBytes { Glibc.send(peer, $0.baseAddress, $0.count, 0) }
                precondition(n > 0)
                sent += n
            }
        }

        /// Waits until `ours` has at least `count` bytes to read (loopback delivers at once, but not synchronously).
        func awaitReadable(_ count: Int = 1) {
            for _ in 0..<200 {
                var n: Int32 = 0
                if ioctl(ours, UInt(FIONREAD), &n) == 0, Int(n) >= count { return }
                usleep(1000)
            }
        }

        /// The peer closes with SO_LINGER 0: the kernel sends a RST.
        func resetPeer() {
            var hard = linger(l_onoff: 1, l_linger: 0)
            setsockopt(peer, SOL_SOCKET, SO_LINGER, &hard, socklen_t(MemoryLayout<linger>.size))
            Glibc.close(peer)
            peer = -1
        }

        func readReady() -> SocketReader.Outcome {
            reader.readReady(into: input, scratch: scratch)
        }

        var inputBytes: [UInt8] {
            let n = evbuffer_get_length(input)
            var bytes = [UInt8](repeating: 0, count: n)
            _ = evbuffer_copyout(input, &bytes, n)
            return bytes
        }

        deinit {
            reader.stop()
            Glibc.close(ours)
            if peer >= 0 { Glibc.close(peer) }
            evbuffer_free(input)
            scratch.deallocate()
            event_base_free(base)
        }
    }

    @Test func aReadyReadAppendsWhatCameAndNothingIsLeftOut() throws {
        let pair = try Pair()
        let request = Array("GET http://origin/ HTTP/1.1\r\nHost: origin\r\n\r\n".utf8)
        pair.send(request)
        pair.awaitReadable(request.count)
        #expect(pair.readReady() == .read(request.count))
        #expect(pair.inputBytes == request)
        // Nothing more is waiting: a spurious wake-up reads nothing and reports nothing.
        #expect(pair.readReady() == .nothing)
        #expect(pair.reader.isReading)
    }

    @Test func oneReadinessTakesAtMostLibeventsFourKiBAndTheNextTakesTheRest() throws {
        let pair = try Pair()
        let body = (0..<10_000).map { UInt8(truncatingIfNeeded: $0 &* 31) }
        pair.send(body)
        pair.awaitReadable(body.count)
        #expect(pair.readReady() == .read(SocketReader.readSize))
        var total = SocketReader.readSize
        while total < body.count, case .read(let n) = pair.readReady() { total += n }
        #expect(total == body.count)
        #expect(pair.inputBytes == body)
    }

    @Test func aFullInputIsNotReadPastTheHighWatermark() throws {
        let pair = try Pair()
        let filler = [UInt8](repeating: 0x61, count: Flow.highWater)
        evbuffer_add(pair.input, filler, filler.count)
        pair.send([1, 2, 3])
        pair.awaitReadable(3)
        #expect(pair.readReady() == .nothing)
        #expect(evbuffer_get_length(pair.input) == Flow.highWater)
        // Room for two bytes: two are read, the third stays in the socket.
        evbuffer_drain(pair.input, 2)
        #expect(pair.readReady() == .read(2))
        evbuffer_drain(pair.input, evbuffer_get_length(pair.input) - 2)
        #expect(pair.inputBytes == [1, 2])
        #expect(pair.readReady() == .read(1))
    }

    @Test func thePeersFINEndsTheStreamAfterItsLastBytesAndReadingGoesOff() throws {
        let pair = try Pair()
        pair.send([9, 8, 7])
        shutdown(pair.peer, Int32(SHUT_WR))
        pair.awaitReadable(3)
        #expect(pair.readReady() == .read(3))
        #expect(pair.readReady() == .end)
        #expect(!pair.reader.isReading)
        #expect(pair.inputBytes == [9, 8, 7])
        // Reading off: a later readiness reports nothing again, as libevent's disabled EV_READ would not call back.
        #expect(pair.readReady() == .nothing)
    }

    @Test func aResetIsAFailureAndReadingGoesOff() throws {
        let pair = try Pair()
        pair.resetPeer()
        var outcome = SocketReader.Outcome.nothing
        for _ in 0..<200 where outcome == .nothing {
            outcome = pair.readReady()
            if outcome == .nothing { usleep(1000) }
        }
        #expect(outcome == .failed)
        #expect(errno == ECONNRESET)
        #expect(!pair.reader.isReading)
    }

    /// The bufferevent over a socket the reader reads keeps no libevent read watermark (its callback would run on every
    /// add to and drain of the input for nothing: the reader bounds the input itself), and the reader's fd is the
    /// socket's while it reads it, -1 once stopped.
    @Test func theReadersBuffereventKeepsNoReadWatermarkAndItsFdIsTheSockets() throws {
        let pair = try Pair()
        let bev = try #require(bufferevent_socket_new(pair.base, pair.ours, 0))
        defer { bufferevent_free(bev) }
        bufferevent_setwatermark(bev, Int16(EV_READ), 0, Flow.highWater)
        var reader = SocketReader()
        #expect(reader.fd == -1)
        reader.start(base: pair.base, bev: bev, fd: pair.ours, callback: { _, _, _ in }, owner: pair.scratch)
        var low = 0, high = 0
        #expect(bufferevent_getwatermark(bev, Int16(EV_READ), &low, &high) == 0)
        #expect(high == 0)
        #expect(reader.fd == pair.ours)
        reader.stop()
        #expect(reader.fd == -1)
    }
}
