/// A streaming 64-bit checksum for large bodies: FNV-1a over 64-bit little-endian words, then over the
/// 0–7 tail bytes, then the length.
///
/// Word-wise rather than byte-wise so that 50 MiB is hashed quickly even in a debug build. The result does not
/// depend on how the stream is split into `update` calls (a partial word is carried over), so the sender and
/// the receiver can checksum the same stream chunked differently. Any changed, dropped, duplicated or
/// reordered 8-byte word changes the sum with overwhelming probability; it is not cryptographic, and need not be.
public struct StreamChecksum: Sendable, Hashable {
    private static let offsetBasis: UInt64 = 0xcbf2_9ce4_8422_2325
    private static let prime: UInt64 = 0x0000_0100_0000_01b3

    private var state: UInt64 = StreamChecksum.offsetBasis
    private var pending: UInt64 = 0
    private var pendingCount = 0
    /// Bytes seen so far.
    public private(set) var length: UInt64 = 0

    public init() {}

    public mutating func update(_ bytes: UnsafeRawBufferPointer) {
        guard !bytes.isEmpty else { return }
        length &+= UInt64(bytes.count)
        var i = 0
        let n = bytes.count
        // Complete a partial word carried from the previous call.
        while pendingCount > 0 && pendingCount < 8 && i < n {
            pending |= UInt64(bytes[i]) << (8 * UInt64(pendingCount))
            pendingCount += 1
            i += 1
        }
        if pendingCount == 8 {
            mix(pending)
            pending = 0
            pendingCount = 0
        }
        guard let base = bytes.baseAddress else { return }
        while n - i >= 8 {
            mix(UInt64(littleEndian: base.loadUnaligned(fromByteOffset: i, as: UInt64.self)))
            i += 8
        }
        while i < n {
            pending |= UInt64(bytes[i]) << (8 * UInt64(pendingCount))
            pendingCount += 1
            i += 1
        }
    }

    public mutating func update(_ bytes: [UInt8]) {
        bytes.withUnsafeBytes { update($0) }
    }

    public mutating func update<S: Sequence>(contentsOf bytes: S) where S.Element == UInt8 {
        update(Array(bytes))
    }

    @inline(__always)
    private mutating func mix(_ word: UInt64) {
        state = (state ^ word) &* Self.prime
    }

    /// The checksum of everything seen so far (does not end the stream).
    public var value: UInt64 {
        var copy = self
        for k in 0..<copy.pendingCount {
            copy.state = (copy.state ^ ((copy.pending >> (8 * UInt64(k))) & 0xFF)) &* Self.prime
        }
        copy.state = (copy.state ^ copy.length) &* Self.prime
        return copy.state
    }

    /// The checksum of one byte array.
    public static func of(_ bytes: [UInt8]) -> UInt64 {
        var sum = StreamChecksum()
        sum.update(bytes)
        return sum.value
    }
}
