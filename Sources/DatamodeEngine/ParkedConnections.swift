import CDatamodeShims
import CLibevent
import DatamodePolicy
#if canImport(Glibc)
import Glibc
#endif

/// The idle keep-alive connections of one worker while they wait for their next request with nothing of their
/// session left (issue 31's idle row; nginx keeps only a connection's core between keep-alive requests the same
/// way): per connection, its socket, what the next session needs to know about the peer, and one read event that
/// also carries the rest of `client-idle` as its timeout. The session that parks (`HTTP1Session.park`) frees its
/// transport, bufferevent, buffers and timers; the first byte or the client's EOF makes a new session on the same
/// socket (`fired`), and the idle timeout closes it without a word.
///
/// The records are values in one array and the events live in slabs of `slabSize`, filled lowest first: an object
/// per parked connection, allocated when it parked, would sit between the blocks its session freed, and that
/// space would stay resident (0.58 KiB of RSS per idle connection with one, against 0.78 with the whole session).
/// A slab left empty at the end is freed, so a burst of idle connections leaves nothing behind once they close.
final class ParkedConnections {
    struct Record {
        var fd: Int32 = -1
        /// When `client-idle` runs out (monotonic nanoseconds).
        var idleUntil: UInt64 = 0
        /// The peer's address bytes (4 or 16 of them, `addressLength`; 0: none), kept without an array of its own.
        var address: (UInt64, UInt64) = (0, 0)
        var addressLength: UInt8 = 0
        var peerText = ""
        /// A transparent connection's original destination (SPEC §16), classified before it could park.
        var transparent: TransparentConnection?
    }

    static let slabSize = 128
    unowned let worker: Worker
    private let eventSize = Int(event_get_struct_event_size())
    /// Each slab holds `slabSize` events; slab `s` is records `s * slabSize ..< (s + 1) * slabSize`.
    private var slabs: [UnsafeMutableRawPointer] = []
    /// Free record numbers per slab.
    private var free: [[Int32]] = []
    private var records: [Record] = []
    /// Which record a socket's event belongs to (the callback is given the socket).
    private var byFD: [Int32: Int32] = [:]

    init(worker: Worker) {
        self.worker = worker
    }

    deinit {
        for slab in slabs { Glibc.free(slab) }
    }

    var count: Int { byFD.count }

    /// Parks `fd`, with `milliseconds` of `client-idle` left. False when no event could be made (the session then
    /// stays as it is).
    func park(fd: Int32, peerAddress: IPAddress?, peerText: String, transparent: TransparentConnection?,
              idleFor milliseconds: Int64) -> Bool {
        guard let number = takeRecord() else { return false }
        let event = eventStorage(number)
        guard event_assign(OpaquePointer(event), worker.base, fd, Int16(EV_READ), parkedConnectionCallback,
                           context(self)) == 0 else {
            giveBack(number)
            return false
        }
        var record = Record(fd: fd, idleUntil: worker.clock.nowNanoseconds() + UInt64(max(0, milliseconds)) * 1_000_000,
                            peerText: peerText, transparent: transparent)
        if let bytes = peerAddress?.bytes, bytes.count == 4 || bytes.count == 16 {
            withUnsafeMutableBytes(of: &record.address) { $0.copyBytes(from: bytes) }
            record.addressLength = UInt8(bytes.count)
        }
        records[Int(number)] = record
        byFD[fd] = number
        dm_event_add_ms(OpaquePointer(event), milliseconds)
        worker.metrics.connectionParked()
        return true
    }

    /// `fd` is readable (a request's first byte, or EOF): a new session reads it, with what is left of
    /// `client-idle`. `timedOut`: `client-idle` ran out first; the connection is cut without a word, as a session
    /// cuts an idle one.
    func fired(fd: Int32, timedOut: Bool) {
        guard let record = unpark(fd) else { return }
        guard !timedOut, let bev = bufferevent_socket_new(worker.base, fd, Int32(BEV_OPT_CLOSE_ON_FREE.rawValue)) else {
            Glibc.close(fd)
            worker.parkedConnectionClosed()
            return
        }
        var peerAddress: IPAddress?
        if record.addressLength > 0 {
            peerAddress = withUnsafeBytes(of: record.address) { IPAddress(bytes: Array($0.prefix(Int(record.addressLength)))) }
        }
        let session = HTTP1Session(worker: worker, bev: bev, peerAddress: peerAddress, peerText: record.peerText,
                                   transparent: record.transparent)
        worker.adopt(session)
        let now = worker.clock.nowNanoseconds()
        session.resume(idleLeftMilliseconds: Int64((record.idleUntil > now ? record.idleUntil - now : 0) / 1_000_000))
    }

    /// Closes every parked connection (drain, shutdown): they are idle, nothing is in flight.
    func closeAll() {
        for fd in Array(byFD.keys) where unpark(fd) != nil {
            Glibc.close(fd)
            worker.parkedConnectionClosed()
        }
    }

    // MARK: records and slabs

    /// Takes `fd`'s record out, its event deleted.
    private func unpark(_ fd: Int32) -> Record? {
        guard let number = byFD.removeValue(forKey: fd) else { return nil }
        event_del(OpaquePointer(eventStorage(number)))
        let record = records[Int(number)]
        records[Int(number)] = Record()
        giveBack(number)
        worker.metrics.connectionUnparked()
        return record
    }

    private func eventStorage(_ number: Int32) -> UnsafeMutableRawPointer {
        slabs[Int(number) / Self.slabSize] + (Int(number) % Self.slabSize) * eventSize
    }

    /// A free record in the lowest slab that has one, or in a new slab.
    private func takeRecord() -> Int32? {
        if let s = free.firstIndex(where: { !$0.isEmpty }) { return free[s].removeLast() }
        guard let slab = malloc(Self.slabSize * eventSize) else { return nil }
        let s = slabs.count
        slabs.append(slab)
        let first = Int32(s * Self.slabSize)
        free.append((1..<Int32(Self.slabSize)).reversed().map { first + $0 })
        records.append(contentsOf: repeatElement(Record(), count: Self.slabSize))
        return first
    }

    /// Returns a record; the slabs at the end that hold nothing any more are freed.
    private func giveBack(_ number: Int32) {
        free[Int(number) / Self.slabSize].append(number)
        while let last = free.last, last.count == Self.slabSize {
            Glibc.free(slabs.removeLast())
            free.removeLast()
            records.removeLast(Self.slabSize)
        }
    }
}
