/// A map from stream ids to one value per open stream, for the lookups on every frame and every header field.
///
/// A `Dictionary` keyed by stream id hashes each lookup with SipHash (Swift's `Hasher`, seeded per process against
/// flooding): about 160 instructions a lookup, and an h2 exchange through the proxy looks its streams up some 60
/// times (each header field of each head on both codecs, each DATA read, each frame sent). Stream ids need no
/// flood-resistant hash: a peer chooses them, but only ever increasing, odd (client) or even (server), and at most
/// `SETTINGS_MAX_CONCURRENT_STREAMS` of them are open at once, so a multiplicative (Fibonacci) hash spreads them
/// and the table stays small. Open addressing with linear probing and backward-shift deletion (no tombstones:
/// lookups never slow down as streams come and go); at most half full.
///
/// Keys are stream ids, never 0 (the connection's own id): 0 marks a free slot.
public struct StreamTable<Value> {
    private var keys: [HTTP2StreamID]
    private var values: [Value?]
    /// capacity - 1; the capacity is a power of two.
    private var mask: Int
    /// 32 - log2(capacity): the multiplicative hash keeps the top bits.
    private var shift: UInt32
    public private(set) var count = 0

    public init() {
        keys = Array(repeating: 0, count: Self.initialCapacity)
        values = Array(repeating: nil, count: Self.initialCapacity)
        mask = Self.initialCapacity - 1
        shift = 32 - UInt32(Self.initialCapacity.trailingZeroBitCount)
    }

    private static var initialCapacity: Int { 16 }

    public var isEmpty: Bool { count == 0 }

    @inline(__always)
    private func home(_ key: HTTP2StreamID) -> Int {
        Int((UInt32(bitPattern: key) &* 0x9E37_79B1) >> shift)
    }

    /// The slot holding `key`, or nil.
    @inline(__always)
    private func slot(of key: HTTP2StreamID) -> Int? {
        precondition(key != 0, "stream 0 is the connection, not a stream")
        var index = home(key)
        while true {
            let found = keys[index]
            if found == key { return index }
            if found == 0 { return nil }
            index = (index + 1) & mask
        }
    }

    public subscript(key: HTTP2StreamID) -> Value? {
        get {
            guard let index = slot(of: key) else { return nil }
            return values[index]
        }
        set {
            if let newValue { insert(newValue, for: key) } else { removeValue(forKey: key) }
        }
        _modify {
            // Read-modify-write in place (`table[id]!.field = x`), as Dictionary's own `_modify`: no copy of the
            // value, so a copy-on-write buffer inside it stays unique.
            if let index = slot(of: key) {
                var value = values[index].take()
                defer {
                    if let value { values[index] = value } else { remove(at: index) }
                }
                yield &value
            } else {
                var value: Value? = nil
                defer { if let value { insert(value, for: key) } }
                yield &value
            }
        }
    }

    private mutating func insert(_ value: Value, for key: HTTP2StreamID) {
        if let index = slot(of: key) {
            values[index] = value
            return
        }
        if (count + 1) * 2 > keys.count { grow() }
        var index = home(key)
        while keys[index] != 0 { index = (index + 1) & mask }
        keys[index] = key
        values[index] = value
        count += 1
    }

    @discardableResult
    public mutating func removeValue(forKey key: HTTP2StreamID) -> Value? {
        guard let index = slot(of: key) else { return nil }
        let value = values[index].take()
        remove(at: index)
        return value
    }

    /// Frees `index` and shifts back the entries after it whose probe passed through it, so every key stays
    /// reachable from its home slot without tombstones (Knuth's algorithm R).
    private mutating func remove(at index: Int) {
        var hole = index
        keys[hole] = 0
        values[hole] = nil
        count -= 1
        var next = (hole + 1) & mask
        while keys[next] != 0 {
            let wanted = home(keys[next])
            // The entry at `next` may move into the hole when its home is not in (hole, next] (cyclically).
            let stays = hole <= next ? (hole < wanted && wanted <= next) : (hole < wanted || wanted <= next)
            if !stays {
                keys[hole] = keys[next]
                values[hole] = values[next].take()
                keys[next] = 0
                hole = next
            }
            next = (next + 1) & mask
        }
    }

    private mutating func grow() {
        let oldKeys = keys
        var oldValues = values
        let capacity = keys.count * 2
        keys = Array(repeating: 0, count: capacity)
        values = Array(repeating: nil, count: capacity)
        mask = capacity - 1
        shift = 32 - UInt32(capacity.trailingZeroBitCount)
        count = 0
        for index in oldKeys.indices where oldKeys[index] != 0 {
            insert(oldValues[index].take()!, for: oldKeys[index])
        }
    }

    public mutating func removeAll() {
        self = StreamTable()
    }

    /// The ids of the open streams, in no particular order.
    public var ids: [HTTP2StreamID] { keys.filter { $0 != 0 } }

    /// The values, in no particular order.
    public var allValues: [Value] { values.compactMap { $0 } }

    /// Whether some open stream's id satisfies `predicate`.
    public func containsID(where predicate: (HTTP2StreamID) -> Bool) -> Bool {
        keys.contains { $0 != 0 && predicate($0) }
    }
}
