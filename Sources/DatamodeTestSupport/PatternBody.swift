/// A deterministic, non-repeating byte stream of any length, generated piecewise without holding it:
/// the large-body tests stream it through the proxy and compare checksums at both ends.
///
/// Byte `i` is byte `i % 8` of `splitmix64(seed + i / 8)`, so every 8-byte word differs from its neighbours
/// and a dropped or repeated buffer anywhere in the stream shows up in the checksum.
public struct PatternBody: Sendable, Hashable {
    public var seed: UInt64
    public var length: UInt64

    public init(length: UInt64, seed: UInt64 = 0x5eed) {
        self.length = length
        self.seed = seed
    }

    @inline(__always)
    static func word(_ index: UInt64, seed: UInt64) -> UInt64 {
        var z = (seed &+ index) &* 0x9e37_79b9_7f4a_7c15
        z = (z ^ (z >> 30)) &* 0xbf58_476d_1ce4_e5b9
        z = (z ^ (z >> 27)) &* 0x94d0_49bb_1331_11eb
        return z ^ (z >> 31)
    }

    /// Writes the bytes at `offset ..< offset + buffer.count` of the stream into `buffer`
    /// (the caller keeps `offset + buffer.count <= length`).
    public func fill(offset: UInt64, into buffer: UnsafeMutableRawBufferPointer) {
        guard let base = buffer.baseAddress else { return }
        let n = buffer.count
        var i = 0
        var position = offset
        // Bytes before the next word boundary.
        while i < n && position % 8 != 0 {
            base.storeBytes(of: UInt8(truncatingIfNeeded: Self.word(position / 8, seed: seed) >> (8 * (position % 8))),
                            toByteOffset: i, as: UInt8.self)
            i += 1
            position += 1
        }
        while n - i >= 8 {
            base.storeBytes(of: Self.word(position / 8, seed: seed).littleEndian, toByteOffset: i, as: UInt64.self)
            i += 8
            position += 8
        }
        while i < n {
            base.storeBytes(of: UInt8(truncatingIfNeeded: Self.word(position / 8, seed: seed) >> (8 * (position % 8))),
                            toByteOffset: i, as: UInt8.self)
            i += 1
            position += 1
        }
    }

    /// Calls `body` with consecutive pieces of the stream (at most `chunkSize` bytes each), in order.
    public func forEachChunk(chunkSize: Int = 256 * 1024, _ body: (UnsafeRawBufferPointer) throws -> Void) rethrows {
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: chunkSize, alignment: 8)
        defer { buffer.deallocate() }
        var offset: UInt64 = 0
        while offset < length {
            let n = Int(min(UInt64(chunkSize), length - offset))
            let slice = UnsafeMutableRawBufferPointer(rebasing: buffer[0..<n])
            fill(offset: offset, into: slice)
            try body(UnsafeRawBufferPointer(slice))
            offset += UInt64(n)
        }
    }

    /// The whole stream as an array (for small bodies only).
    public var bytes: [UInt8] {
        var out = [UInt8](repeating: 0, count: Int(length))
        out.withUnsafeMutableBytes { fill(offset: 0, into: $0) }
        return out
    }

    /// The `StreamChecksum` of the whole stream, computed piecewise.
    public var checksum: UInt64 {
        var sum = StreamChecksum()
        forEachChunk { sum.update($0) }
        return sum.value
    }
}
