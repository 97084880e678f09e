/// Bytes received and not yet consumed, with O(1) consumption from the front (compacted now and then).
struct ByteQueue {
    private var storage: [UInt8] = []
    private var start = 0

    var count: Int { storage.count - start }
    var isEmpty: Bool { count == 0 }

    mutating func append(_ bytes: UnsafeRawBufferPointer) {
        if start > 0 && (start >= 64 * 1024 || start == storage.count) && start * 2 >= storage.count {
            storage.removeFirst(start)
            start = 0
        }
        storage.append(contentsOf: bytes)
    }

    mutating func append(_ bytes: [UInt8]) {
        bytes.withUnsafeBytes { append($0) }
    }

    /// Drops `n` bytes from the front.
    mutating func consume(_ n: Int) {
        precondition(n <= count)
        start += n
        if start == storage.count {
            storage.removeAll(keepingCapacity: true)
            start = 0
        }
    }

    /// The first `n` bytes, copied.
    func prefix(_ n: Int) -> [UInt8] {
        Array(storage[start..<(start + n)])
    }

    /// Takes every byte out.
    mutating func takeAll() -> [UInt8] {
        let out = Array(storage[start...])
        storage.removeAll(keepingCapacity: true)
        start = 0
        return out
    }

    func withUnsafeBytes<R>(_ body: (UnsafeRawBufferPointer) throws -> R) rethrows -> R {
        try storage.withUnsafeBytes { all in
            try body(UnsafeRawBufferPointer(rebasing: all[start...]))
        }
    }
}
