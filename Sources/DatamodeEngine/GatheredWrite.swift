import CLibevent

/// An HTTP/2 codec's output gathered into few `evbuffer_add`s. nghttp2 hands its output frame by frame (a HEADERS
/// of forty bytes, a DATA frame, a WINDOW_UPDATE); over a client's TLS filter each `evbuffer_add` is an `SSL_write`
/// of its own, so a TLS record (header, MAC, and often a send) per frame. Gathered, a response's frames leave in one
/// record of up to 16 KiB, the most one record carries (RFC 8446 §5.1).
enum GatheredWrite {
    static let capacity = 16 * 1024

    /// Runs `produce` with a sink whose bytes reach `output` in order, in pieces of up to `capacity` bytes (a piece
    /// as large as that on its own goes through unchanged); returns what `produce` returns. Nothing is added to
    /// `output` until a piece is full or `produce` has returned, so `produce` must not read `output`'s length to
    /// learn what it wrote.
    static func into<T>(_ output: OpaquePointer, _ produce: ((UnsafeRawBufferPointer) -> Void) -> T) -> T {
        withUnsafeTemporaryAllocation(byteCount: capacity, alignment: 16) { scratch in
            let base = scratch.baseAddress!
            var used = 0
            let result = produce { bytes in
                guard let start = bytes.baseAddress, bytes.count > 0 else { return }
                if used > 0 && used + bytes.count > capacity {
                    _ = evbuffer_add(output, base, used)
                    used = 0
                }
                if bytes.count >= capacity {
                    _ = evbuffer_add(output, start, bytes.count)
                    return
                }
                (base + used).copyMemory(from: start, byteCount: bytes.count)
                used += bytes.count
            }
            if used > 0 { _ = evbuffer_add(output, base, used) }
            return result
        }
    }
}
