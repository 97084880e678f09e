extension String {
    /// Calls `body` with the string's UTF-8 bytes, in place. `withUTF8` is mutating, and the `var` copy made to call it
    /// costs a retain and a release each time: about 400 of each per HTTP/2 request across the field checks and
    /// translations (callgrind, issue 26). A native string (every string on Linux) is contiguous; any other is
    /// copied, as `withUTF8` would.
    @inlinable @inline(__always)
    package func withUTF8Bytes<R>(_ body: (UnsafeBufferPointer<UInt8>) throws -> R) rethrows -> R {
        if let result = try utf8.withContiguousStorageIfAvailable(body) { return result }
        var copy = self
        return try copy.withUTF8(body)
    }
}
