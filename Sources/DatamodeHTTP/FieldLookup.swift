/// Case-insensitive field access (RFC 9110 §5.1: field names are case-insensitive) without lowercasing copies.
///
/// A field may legitimately appear more than once (RFC 9110 §5.3); `values(of:)` returns every copy in order,
/// because looking only at the first or the last is how two components end up disagreeing on `Connection`,
/// `Content-Length` or `Host`.
enum FieldLookup {
    static func values(_ fields: [HTTPField], _ name: String) -> [String] {
        var result: [String] = []
        // By index here and below: `for f in fields` copied every field (a retain and a release per string).
        for i in fields.indices where ASCII.equalsIgnoringCase(fields[i].name, name) { result.append(fields[i].value) }
        return result
    }

    static func contains(_ fields: [HTTPField], _ name: String) -> Bool {
        fields.contains { ASCII.equalsIgnoringCase($0.name, name) }
    }

    /// How many fields are named `name` (any case), without collecting their values.
    static func count(_ fields: [HTTPField], _ name: String) -> Int {
        var n = 0
        for i in fields.indices where ASCII.equalsIgnoringCase(fields[i].name, name) { n += 1 }
        return n
    }

    /// The options of every `Connection` field (RFC 9110 §7.6.1: a comma list of option names,
    /// case-insensitive). The proxy removes the named hop-by-hop fields before forwarding; missing one copy
    /// would leak a hop-by-hop field to the next hop.
    static func connectionOptions(_ fields: [HTTPField]) -> ConnectionOptions {
        var options = ConnectionOptions()
        for i in fields.indices
        where fields[i].name.utf8.count == 10 && ASCII.equalsIgnoringCase(fields[i].name, "connection") {
            fields[i].value.withUTF8Bytes { options.insert(list: $0) }
        }
        return options
    }
}

extension RequestHead {
    /// Every value of the field `name` (any case), in order of appearance.
    public func values(of name: String) -> [String] { FieldLookup.values(fields, name) }
    /// Whether at least one field `name` (any case) is present.
    public func contains(_ name: String) -> Bool { FieldLookup.contains(fields, name) }
    /// How many fields are named `name` (any case).
    public func count(of name: String) -> Int { FieldLookup.count(fields, name) }
    /// The options of every Connection field.
    public var connectionTokens: ConnectionOptions { FieldLookup.connectionOptions(fields) }
}

extension ResponseHead {
    /// Every value of the field `name` (any case), in order of appearance.
    public func values(of name: String) -> [String] { FieldLookup.values(fields, name) }
    /// Whether at least one field `name` (any case) is present.
    public func contains(_ name: String) -> Bool { FieldLookup.contains(fields, name) }
    /// How many fields are named `name` (any case).
    public func count(of name: String) -> Int { FieldLookup.count(fields, name) }
    /// The options of every Connection field.
    public var connectionTokens: ConnectionOptions { FieldLookup.connectionOptions(fields) }
}
