@testable import DatamodeEngine
import Testing

/// The last byte of a `content-length` body waits for END_STREAM, however the DATA frames split it.
@Suite struct LengthDelimitedBodyTests {
    /// Every split of a 6-byte body into frames (empty frames between them too): all but the last byte go at once,
    /// the last one is released at END_STREAM, and nothing is held twice.
    @Test func onlyTheLastByteWaitsWhateverTheFrames() {
        let body: [UInt8] = Array("abcdef".utf8)
        for mask in 0..<(1 << (body.count - 1)) {
            var frames: [[UInt8]] = [[]]
            for (i, byte) in body.enumerated() {
                frames[frames.count - 1].append(byte)
                if i < body.count - 1, mask & (1 << i) != 0 { frames.append([]) }
            }
            frames.insert([], at: frames.count / 2)
            var lengthDelimited = LengthDelimitedBody(length: UInt64(body.count))
            var written: [UInt8] = []
            for frame in frames { written += frame.prefix(lengthDelimited.writable(frame)) }
            #expect(written == Array(body.dropLast()), "frames \(frames)")
            // An empty frame after the body changes nothing.
            #expect(lengthDelimited.writable([]) == 0)
            #expect(lengthDelimited.release() == body.last)
            #expect(lengthDelimited.release() == nil)
        }
    }

    /// One frame with more than the length: written as it is (the codec refuses it); nothing is held.
    @Test func aFramePastTheLengthHoldsNothing() {
        var lengthDelimited = LengthDelimitedBody(length: 3)
        #expect(lengthDelimited.writable([1, 2, 3, 4]) == 4)
        #expect(lengthDelimited.release() == nil)
        // DATA past the length in a later frame: the held byte stays held; the stream's reset discards it.
        var later = LengthDelimitedBody(length: 3)
        #expect(later.writable([1, 2, 3]) == 2)
        #expect(later.writable([4]) == 1)
    }
}
