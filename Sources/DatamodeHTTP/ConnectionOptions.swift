/// The options of a message's `Connection` fields (RFC 9110 §7.6.1), parsed once per message.
///
/// `close`, `keep-alive` and `upgrade` decide the connection's fate and are asked about on every message, so they
/// are flags. Any other option names a field the next hop must not see; those names are kept, lowercased, in
/// `fieldNames`. Almost every message carries only the flags (`Connection: keep-alive`), so the common case
/// allocates nothing: a `Set<String>` here cost a hash table per response (the bench's malloc count, issue 12).
/// Equality ignores order and repetition, as for the set it replaces.
public struct ConnectionOptions: Sendable, Hashable, ExpressibleByArrayLiteral {
    public private(set) var close = false
    public private(set) var keepAlive = false
    public private(set) var upgrade = false
    /// Every other option, lowercased, each once, in order of first appearance.
    public private(set) var fieldNames: [String] = []

    public init() {}

    public init(arrayLiteral tokens: String...) {
        for token in tokens { insert(token.lowercased()) }
    }

    /// No option at all.
    public var isEmpty: Bool { !close && !keepAlive && !upgrade && fieldNames.isEmpty }

    /// Whether `token` (any case) is one of the options.
    public func contains(_ token: String) -> Bool {
        token.withUTF8Bytes { contains($0) }
    }

    /// `contains` for a name's bytes (any case).
    public func contains(_ name: UnsafeBufferPointer<UInt8>) -> Bool {
        if ASCII.equalsIgnoringCase(name, "close") { return close }
        if ASCII.equalsIgnoringCase(name, "keep-alive") { return keepAlive }
        if ASCII.equalsIgnoringCase(name, "upgrade") { return upgrade }
        return fieldNames.contains { option in
            option.withUTF8Bytes { o in
                o.count == name.count && (0..<o.count).allSatisfy { ByteClass.lower(name[$0]) == o[$0] }
            }
        }
    }

    /// Adds a lowercased option.
    mutating func insert(_ token: String) {
        switch token {
        case "close": close = true
        case "keep-alive": keepAlive = true
        case "upgrade": upgrade = true
        default: if !fieldNames.contains(token) { fieldNames.append(token) }
        }
    }

    /// Adds every option of one `Connection` field value: a comma list of names, OWS around each, empty
    /// elements ignored (RFC 9110 §5.6.1).
    mutating func insert(list u: UnsafeBufferPointer<UInt8>) {
        var start = 0
        for i in 0...u.count where i == u.count || u[i] == 0x2C {
            let (a, b) = ASCII.trimOWS(u, start, i)
            if b > a { insert(UnsafeBufferPointer(rebasing: u[a..<b])) }
            start = i + 1
        }
    }

    /// Adds the option spelled by `bytes` (any case) without building a String for the three flags.
    mutating func insert(_ bytes: UnsafeBufferPointer<UInt8>) {
        if ASCII.equalsIgnoringCase(bytes, "close") { close = true; return }
        if ASCII.equalsIgnoringCase(bytes, "keep-alive") { keepAlive = true; return }
        if ASCII.equalsIgnoringCase(bytes, "upgrade") { upgrade = true; return }
        insert(String(unsafeUninitializedCapacity: bytes.count) { out in
            for k in 0..<bytes.count { out[k] = ByteClass.lower(bytes[k]) }
            return bytes.count
        })
    }

    public static func == (a: ConnectionOptions, b: ConnectionOptions) -> Bool {
        a.close == b.close && a.keepAlive == b.keepAlive && a.upgrade == b.upgrade
            && Set(a.fieldNames) == Set(b.fieldNames)
    }

    public func hash(into hasher: inout Hasher) {
        hasher.combine(close)
        hasher.combine(keepAlive)
        hasher.combine(upgrade)
        hasher.combine(Set(fieldNames))
    }
}
