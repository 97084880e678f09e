/// An HTTP/2 body with `content-length` (DATA frames, ended by END_STREAM) written as HTTP/1.1 text, where the length
/// alone frames it: its last byte waits for END_STREAM.
///
/// RFC 9113 §8.1.1: DATA past `content-length`, even in a later frame, makes the message malformed. The HTTP/1.1
/// reader sees a whole message once the length's last byte is written, so that byte is held until END_STREAM says
/// nothing more follows (`release`); excess DATA then cuts the message before it is whole. END_STREAM usually rides
/// on the last DATA frame, so nothing waits. `HTTP2Stream` holds request bodies to it, `HTTP2OriginStream` response
/// bodies (tests `dataPastContentLengthInALaterFrameIsAStreamErrorBeforeTheRequestIsWhole`,
/// `dataPastContentLengthFromAnH2OriginIsNeverPresentedAsWhole`).
struct LengthDelimitedBody {
    let length: UInt64
    /// Bytes of DATA so far, the held one included.
    private var received: UInt64 = 0
    private var held: UInt8?

    init(length: UInt64) {
        self.length = length
    }

    /// How many of `bytes`, a DATA frame's payload, to write now: all of them, but the body's last byte, which is
    /// held. Past the length (one frame with too much) everything is written: the codec refuses such a frame.
    mutating func writable(_ bytes: some BidirectionalCollection<UInt8>) -> Int {
        received += UInt64(bytes.count)
        guard received == length, let last = bytes.last else { return bytes.count }
        held = last
        return bytes.count - 1
    }

    /// END_STREAM: the held byte, to write now (nil when none is held).
    mutating func release() -> UInt8? {
        defer { held = nil }
        return held
    }
}
