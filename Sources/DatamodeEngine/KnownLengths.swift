/// The body lengths of URLs this worker has relayed whole, so that what a variant or a refusal saved can be
/// counted (SPEC §13 `datamode_bytes_saved_total{kind="variant"}`: "origin length minus variant length, where
/// both are known"). The proxy never fetches the original of a URL it answers with a variant, so the original's
/// length is known only when the same URL was fetched before (typically in normal mode). Bounded: when full it is
/// forgotten at once, so it costs at most `capacity` short entries per worker and nothing on the request path but
/// one hash lookup for the responses it records.
struct KnownLengths {
    let capacity: Int
    private var lengths: [String: UInt64] = [:]

    init(capacity: Int = 4096) {
        self.capacity = capacity
    }

    /// A `200` to a `GET` of `url`, not a variant, framed with `Content-Length: length`.
    mutating func record(_ url: String, length: UInt64) {
        // The count first: the URL is hashed twice only when the table is full.
        if lengths.count >= capacity && lengths[url] == nil { lengths.removeAll(keepingCapacity: true) }
        lengths[url] = length
    }

    subscript(url: String) -> UInt64? { lengths[url] }

    /// What serving `replacement` bytes instead of `url` saved, when `url`'s length is known and larger.
    func saving(_ url: String, replacement: UInt64) -> Int? {
        guard let original = lengths[url], original > replacement else { return nil }
        return Int(original - replacement)
    }
}
