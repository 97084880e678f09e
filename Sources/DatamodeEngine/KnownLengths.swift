/// The body lengths of URLs this worker has relayed whole, so that what a variant or a refusal saved can be
/// counted (SPEC §13 `datamode_bytes_saved_total{kind="variant"}`: "origin length minus variant length, where
/// both are known"). The proxy never fetches the original of a URL it answers with a variant, so the original's
/// length is known only when the same URL was fetched before (typically in normal mode).
///
/// Recorded on every whole `200` to a `GET`, so it is on the request path: a `[String: UInt64]` cost ~610
/// instructions a record (SipHash over the URL, the probe, the key's retain; callgrind, issue 31's 1 KiB row).
/// This is a direct-mapped table of `capacity` slots instead, each the URL's 64-bit fingerprint (a seeded hash of
/// its bytes) and its length: a URL replaces whichever URL had its slot, so the table is bounded (16 bytes a slot,
/// allocated at the first record) and keeps no Strings. Two URLs with one fingerprint would share a length; with
/// a per-process seed that is ~2⁻⁶⁴ for any pair, and its worst is a wrong `bytes_saved` estimate.
struct KnownLengths {
    let capacity: Int
    /// One slot per index: a fingerprint (0: empty) and its length.
    private var slots: [(fingerprint: UInt64, length: UInt64)] = []
    private let seed: UInt64

    /// `capacity`: slots, rounded up to a power of two.
    init(capacity: Int = 4096, seed: UInt64 = UInt64.random(in: 1...UInt64.max)) {
        var slots = 1
        while slots < max(1, capacity) { slots <<= 1 }
        self.capacity = slots
        self.seed = seed
    }

    /// A `200` to a `GET` of `url`, not a variant, framed with `Content-Length: length`.
    mutating func record(_ url: String, length: UInt64) {
        if slots.isEmpty { slots = Array(repeating: (0, 0), count: capacity) }
        let print = fingerprint(url)
        slots[slot(print)] = (print, length)
    }

    subscript(url: String) -> UInt64? {
        guard !slots.isEmpty else { return nil }
        let print = fingerprint(url)
        let found = slots[slot(print)]
        return found.fingerprint == print ? found.length : nil
    }

    private func slot(_ print: UInt64) -> Int { Int(truncatingIfNeeded: print) & (capacity - 1) }

    /// What serving `replacement` bytes instead of `url` saved, when `url`'s length is known and larger.
    func saving(_ url: String, replacement: UInt64) -> Int? {
        guard let original = self[url], original > replacement else { return nil }
        return Int(original - replacement)
    }

    /// The URL's bytes, 8 at a time, through a multiply-xorshift mix seeded per table; never 0 (an empty slot).
    func fingerprint(_ url: String) -> UInt64 {
        let hash = url.utf8.withContiguousStorageIfAvailable { Self.hash($0, seed: seed) }
            ?? Array(url.utf8).withUnsafeBufferPointer { Self.hash($0, seed: seed) }
        return hash == 0 ? 1 : hash
    }

    static func hash(_ bytes: UnsafeBufferPointer<UInt8>, seed: UInt64) -> UInt64 {
        var h = seed ^ (UInt64(bytes.count) &* 0x9E37_79B9_7F4A_7C15)
        guard let base = bytes.baseAddress else { return mix(h) }
        let raw = UnsafeRawPointer(base)
        var offset = 0
        while offset + 8 <= bytes.count {
            h = mix(h ^ UInt64(littleEndian: raw.loadUnaligned(fromByteOffset: offset, as: UInt64.self)))
            offset += 8
        }
        if offset < bytes.count {
            var tail: UInt64 = 0
            if bytes.count >= 8 {
                // The last 8 bytes, overlapping the words already mixed (the length is in the seed), not a byte loop.
                tail = UInt64(littleEndian: raw.loadUnaligned(fromByteOffset: bytes.count - 8, as: UInt64.self))
            } else {
                for i in offset..<bytes.count { tail |= UInt64(bytes[i]) << (8 * UInt64(i - offset)) }
            }
            h = mix(h ^ tail)
        }
        return mix(h)
    }

    /// MurmurHash3's 64-bit finalizer: every input bit reaches every output bit.
    @inline(__always)
    static func mix(_ value: UInt64) -> UInt64 {
        var x = value
        x ^= x >> 33
        x &*= 0xFF51_AFD7_ED55_8CCD
        x ^= x >> 33
        x &*= 0xC4CE_B9FE_1A85_EC53
        x ^= x >> 33
        return x
    }
}
