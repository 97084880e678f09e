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
///
/// Inlinable: the engine's sessions hold it too, and a generic type used from another module without its body runs
/// unspecialized (a metadata lookup for `Value?` on every insert).
public struct StreamTable<Value> {
    @usableFromInline var keys: [HTTP2StreamID]
    @usableFromInline var values: [Value?]
    /// capacity - 1; the capacity is a power of two.
    @usableFromInline var mask: Int
    /// 32 - log2(capacity): the multiplicative hash keeps the top bits.
    @usableFromInline var shift: UInt32
    @usableFromInline var storedCount = 0

    /// How many streams are in the table.
    @inlinable
    public var count: Int { storedCount }

    @inlinable
    public init() {
        keys = Array(repeating: 0, count: Self.initialCapacity)
        values = Array(repeating: nil, count: Self.initialCapacity)
        mask = Self.initialCapacity - 1
        shift = 32 - UInt32(Self.initialCapacity.trailingZeroBitCount)
    }

    @inlinable
    static var initialCapacity: Int { 16 }

    @inlinable
    public var isEmpty: Bool { storedCount == 0 }

    @inlinable @inline(__always)
    func home(_ key: HTTP2StreamID) -> Int {
        Int((UInt32(bitPattern: key) &* 0x9E37_79B1) >> shift)
    }

    /// The slot holding `key`, or nil.
    @inlinable @inline(__always)
    func slot(of key: HTTP2StreamID) -> Int? {
        precondition(key != 0, "stream 0 is the connection, not a stream")
        var index = home(key)
        while true {
            let found = keys[index]
            if found == key { return index }
            if found == 0 { return nil }
            index = (index + 1) & mask
        }
    }

    @inlinable
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

    @inlinable
    mutating func insert(_ value: Value, for key: HTTP2StreamID) {
        if let index = slot(of: key) {
            values[index] = value
            return
        }
        if (storedCount + 1) * 2 > keys.count { grow() }
        var index = home(key)
        while keys[index] != 0 { index = (index + 1) & mask }
        keys[index] = key
        values[index] = value
        storedCount += 1
    }

    @inlinable @discardableResult
    public mutating func removeValue(forKey key: HTTP2StreamID) -> Value? {
        guard let index = slot(of: key) else { return nil }
        let value = values[index].take()
        remove(at: index)
        return value
    }

    /// Frees `index` and shifts back the entries after it whose probe passed through it, so every key stays
    /// reachable from its home slot without tombstones (Knuth's algorithm R).
    @inlinable
    mutating func remove(at index: Int) {
        var hole = index
        keys[hole] = 0
        values[hole] = nil
        storedCount -= 1
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

    @inlinable
    mutating func grow() {
        let oldKeys = keys
        var oldValues = values
        let capacity = keys.count * 2
        keys = Array(repeating: 0, count: capacity)
        values = Array(repeating: nil, count: capacity)
        mask = capacity - 1
        shift = 32 - UInt32(capacity.trailingZeroBitCount)
        storedCount = 0
        for index in oldKeys.indices where oldKeys[index] != 0 {
            insert(oldValues[index].take()!, for: oldKeys[index])
        }
    }

    @inlinable
    public mutating func removeAll() {
        self = StreamTable()
    }

    /// The ids of the open streams, in no particular order.
    @inlinable
    public var ids: [HTTP2StreamID] { keys.filter { $0 != 0 } }

    /// The values, in no particular order.
    @inlinable
    public var allValues: [Value] { values.compactMap { $0 } }

    /// Calls `body` with each value, in no particular order, without making an array of them.
    @inlinable
    public func forEachValue(_ body: (Value) -> Void) {
        for value in values { if let value { body(value) } }
    }

    /// Whether some open stream's id satisfies `predicate`.
    @inlinable
    public func containsID(where predicate: (HTTP2StreamID) -> Bool) -> Bool {
        keys.contains { $0 != 0 && predicate($0) }
    }
}
