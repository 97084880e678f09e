import CLibevent
import Dispatch
@testable import DatamodeEngine
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// `SpeculativeWriter` on a real loopback TCP pair (`SocketReaderTests.Pair`): a large output waits for libevent's
/// write path while a body still streams into it, and is written at once when nothing streams into it any more
/// (`whole`), byte for byte, the socket's back-pressure included.
@Suite struct SpeculativeWriterTests {
    /// A socket bufferevent on the pair's non-blocking end, as a plain client transport has.
    final class Writing {
        let pair: SocketReaderTests.Pair
        let bev: OpaquePointer
        var writer = SpeculativeWriter()

        init() throws {
            pair = try SocketReaderTests.Pair()
            bev = bufferevent_socket_new(pair.base, pair.ours, 0)!
            bufferevent_disable(bev, Int16(EV_READ | EV_WRITE))
        }

        var output: OpaquePointer { bufferevent_get_output(bev) }
        var queued: Int { evbuffer_get_length(output) }

        func queue(_ bytes: [UInt8]) {
            evbuffer_unfreeze(output, 1)
            evbuffer_add(output, bytes, bytes.count)
            evbuffer_freeze(output, 1)
        }

        func flush(whole: Bool) { writer.flush(bev, fd: pair.ours, output: output, whole: whole) }

        /// Reads `count` bytes at the peer, running the event loop (libevent's own writes) in between; the write
        /// callback's part (`drained`) is played once the output is empty.
        func receive(_ count: Int) -> [UInt8] {
            var received: [UInt8] = []
            var chunk = [UInt8](repeating: 0, count: 65_536)
            while received.count < count {
                _ = event_base_loop(pair.base, EVLOOP_NONBLOCK)
                if queued == 0 { writer.drained(bev, output: output) }
                let n = recv(pair.peer, &chunk, chunk.count, Int32(MSG_DONTWAIT))
                if n > 0 { received += chunk[0..<n] } else { usleep(1000) }
            }
            return received
        }

        /// Small socket buffers on both sides: with the peer not reading, a send soon takes only part.
        func shrinkSocketBuffers() {
            var small: Int32 = 4096
            setsockopt(pair.ours, SOL_SOCKET, SO_SNDBUF, &small, socklen_t(MemoryLayout<Int32>.size))
            setsockopt(pair.peer, SOL_SOCKET, SO_RCVBUF, &small, socklen_t(MemoryLayout<Int32>.size))
        }

        deinit { bufferevent_free(bev) }
    }

    static func answer(_ count: Int) -> [UInt8] { (0..<count).map { UInt8(truncatingIfNeeded: $0 &* 131 &+ $0 >> 9) } }

    @Test func aLargeOutputAStreamingBodyStillFeedsWaitsForLibeventsWritePath() throws {
        let writing = try Writing()
        let bytes = Self.answer(100 * 1024)
        writing.queue(bytes)
        writing.flush(whole: false)
        #expect(writing.queued == bytes.count, "nothing is written in the callback")
        #expect(writing.writer.waiting)
        #expect(writing.receive(bytes.count) == bytes)
        #expect(!writing.writer.waiting)
    }

    @Test func aLargeOutputNothingStreamsIntoAnyMoreIsWrittenInTheCallback() throws {
        let writing = try Writing()
        let bytes = Self.answer(100 * 1024)
        writing.queue(bytes)
        writing.flush(whole: true)
        #expect(writing.queued < bytes.count - SpeculativeWriter.speculativeLimit, "written before the loop runs")
        #expect(writing.receive(bytes.count) == bytes)
        #expect(writing.queued == 0 && !writing.writer.waiting)
    }

    @Test func aWholeOutputTheSocketCannotTakeWaitsForWritabilityAndLosesNothing() throws {
        let writing = try Writing()
        // The peer not reading: the first send takes only part.
        writing.shrinkSocketBuffers()
        let bytes = Self.answer(256 * 1024)
        writing.queue(bytes)
        writing.flush(whole: true)
        #expect(writing.queued > 0 && writing.queued < bytes.count)
        #expect(writing.writer.waiting, "the rest waits for the write event")
        // A second flush while waiting writes nothing out of order.
        let before = writing.queued
        writing.flush(whole: true)
        #expect(writing.queued == before)
        #expect(writing.receive(bytes.count) == bytes)
        #expect(writing.queued == 0 && !writing.writer.waiting)
    }

    /// Without libevent's output callback (`takeOverOutputCallback`, issue 31: ~80 instructions for every add, drain
    /// and move on the output) the writer puts its rule back while EV_WRITE is on: libevent's write path empties the
    /// output and deletes its write event, then bytes are added before the write callback's `drained` (a body pumped
    /// from the callback): they must still go out. Without the rule they wait for ever (this test then times out).
    @Test func withoutLibeventsOutputCallbackBytesAddedAfterTheOutputEmptiedStillGoOut() throws {
        let writing = try Writing()
        writing.writer.takeOverOutputCallback(writing.bev)
        writing.shrinkSocketBuffers()
        let first = Self.answer(128 * 1024), second = Array(Self.answer(96 * 1024 + 7).reversed())
        writing.queue(first)
        writing.flush(whole: true)
        #expect(writing.writer.waiting)
        var received: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65_536)
        var addedSecond = false, emptiedWhileWaiting = false
        let deadline = DispatchTime.now().uptimeNanoseconds + 10_000_000_000
        while received.count < first.count + second.count, DispatchTime.now().uptimeNanoseconds < deadline {
            _ = event_base_loop(writing.pair.base, EVLOOP_NONBLOCK)
            if writing.queued == 0 && !addedSecond {
                // libevent wrote the last byte and deleted its write event; EV_WRITE is still on.
                emptiedWhileWaiting = writing.writer.waiting
                writing.queue(second)
                addedSecond = true
            } else if writing.queued == 0 && addedSecond {
                writing.writer.drained(writing.bev, output: writing.output)
            }
            let n = recv(writing.pair.peer, &chunk, chunk.count, Int32(MSG_DONTWAIT))
            if n > 0 { received += chunk[0..<n] } else { usleep(500) }
        }
        #expect(emptiedWhileWaiting)
        #expect(received.count == first.count + second.count, "bytes added after the output emptied were not written")
        let inOrder = received == first + second  // (not inside #expect: a failure would print 224 KiB)
        #expect(inOrder)
        #expect(writing.queued == 0 && !writing.writer.waiting)
    }

    /// Taken over, a small output is written at once as before, and the writer waits (and stops waiting) as before.
    @Test func withoutLibeventsOutputCallbackSmallAndLargeOutputsAreWrittenWhole() throws {
        let writing = try Writing()
        writing.writer.takeOverOutputCallback(writing.bev)
        for size in [1, 1_279, 16 * 1024, 100 * 1024] {
            let bytes = Self.answer(size)
            writing.queue(bytes)
            writing.flush(whole: size <= 16 * 1024)
            #expect(writing.receive(bytes.count) == bytes)
            #expect(writing.queued == 0 && !writing.writer.waiting)
        }
    }

    /// Queues `bytes` as chains of their own, `cut` at the given offsets (a head written, then a body moved in).
    static func queueChains(_ writing: Writing, _ bytes: [UInt8], cut: [Int]) {
        var start = 0
        for end in cut + [bytes.count] {
            let piece = evbuffer_new()!
            evbuffer_add(piece, Array(bytes[start..<end]), end - start)
            evbuffer_unfreeze(writing.output, 1)
            evbuffer_add_buffer(writing.output, piece)
            evbuffer_freeze(writing.output, 1)
            evbuffer_free(piece)
            start = end
        }
    }

    /// A small output over several chains (`gatherLimit`) is copied into one buffer and sent whole, and one over the
    /// limit goes in one sendmsg: every byte, in order, the chains' boundaries nowhere in the stream.
    @Test func smallOutputsOverSeveralChainsAreSentWholeAndInOrder() throws {
        let writing = try Writing()
        writing.writer.takeOverOutputCallback(writing.bev)
        for (size, cut) in [(1_279, [211]), (SpeculativeWriter.gatherLimit, [1, 2, 4_000]), (9_000, [300, 4_096])] {
            let bytes = Self.answer(size)
            Self.queueChains(writing, bytes, cut: cut)
            #expect(evbuffer_peek(writing.output, -1, nil, nil, 0) == Int32(cut.count + 1))
            writing.flush(whole: false)
            #expect(writing.queued == 0, "written in the callback")
            #expect(writing.receive(bytes.count) == bytes)
        }
    }

    /// Gathered, a send the socket takes none of drains nothing: the writer waits, and the bytes go out after what
    /// filled the socket, in order. (The socket is filled by the test itself, not through the writer, so the writer
    /// is not waiting when it gathers: through the writer, a full socket leaves it waiting and it sends nothing.)
    @Test func aGatheredSendAFullSocketRefusesDrainsNothing() throws {
        let writing = try Writing()
        writing.shrinkSocketBuffers()
        var filler: [UInt8] = []
        let piece = Self.answer(1_024)
        while true {
            let n = piece.withUnsafeBytes { Glibc.send(writing.pair.ours, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            guard n > 0 else { break }
            filler += piece[..<n]
        }
        #expect(errno == EAGAIN || errno == EWOULDBLOCK)
        #expect(!writing.writer.waiting)
        let small3 = Array(Self.answer(3_000).reversed())
        Self.queueChains(writing, small3, cut: [100, 2_000])
        writing.flush(whole: false)
        #expect(writing.queued == small3.count, "a refused gathered send drained bytes")
        #expect(writing.writer.waiting)
        let received = writing.receive(filler.count + small3.count)
        let inOrder = received == filler + small3  // (not inside #expect: a failure would print the filler)
        #expect(inOrder)
        #expect(writing.queued == 0 && !writing.writer.waiting)
    }

    /// A send to a peer that reset the connection fails without a SIGPIPE (the raw system call keeps `MSG_NOSIGNAL`;
    /// a signal would end this whole test process) and drains nothing: the bytes stay queued and the writer waits, so
    /// libevent's own write reports the error. Gathered or not.
    @Test func aSendToAResetPeerFailsQuietlyAndDrainsNothing() throws {
        for cut in [[Int](), [300]] {
            let writing = try Writing()
            writing.pair.resetPeer()
            usleep(20_000)
            // The first send after the RST may still be taken; keep sending until the socket reports the reset.
            let bytes = Self.answer(1_000)
            var failed = false
            for _ in 0..<20 where !failed {
                Self.queueChains(writing, bytes, cut: cut)
                let before = writing.queued
                writing.flush(whole: false)
                failed = writing.queued == before
                if !failed { usleep(5_000) }
            }
            #expect(failed, "a reset connection's send drained what it could not send")
            #expect(writing.writer.waiting)
        }
    }
}
