/// What `FieldSection.scan` keeps of each valid field line: one grammar, whatever is made of it.
protocol FieldCollector {
    /// A field line of `p`: its name, and its value without the OWS around it. Both are valid (a token; field-value
    /// bytes, UTF-8 where any is above 0x7F).
    mutating func collect(_ p: UnsafeRawBufferPointer, name: Range<Int>, value: Range<Int>)
}

extension Array: FieldCollector where Element == HTTPField {
    @inline(__always)
    mutating func collect(_ p: UnsafeRawBufferPointer, name: Range<Int>, value: Range<Int>) {
        append(HTTPField(name: CommonSpellings.string(p, name.lowerBound, name.upperBound),
                         value: CommonSpellings.value(p, value.lowerBound, value.upperBound)))
    }
}

/// Keeps nothing: a trailer section that is only checked.
struct DiscardedFields: FieldCollector {
    @inline(__always)
    mutating func collect(_ p: UnsafeRawBufferPointer, name: Range<Int>, value: Range<Int>) {}
}

/// Where one field line's name and value lie in the bytes it was parsed from.
public struct FieldSpan: Hashable, Sendable {
    public var name: Range<Int>
    public var value: Range<Int>
}

/// A header section's field lines as offsets, in order: no String is built for them.
public struct FieldSpans: FieldCollector, Hashable, Sendable {
    public private(set) var spans: [FieldSpan] = []

    init() { spans.reserveCapacity(16) }

    @inline(__always)
    mutating func collect(_ p: UnsafeRawBufferPointer, name: Range<Int>, value: Range<Int>) {
        spans.append(FieldSpan(name: name, value: value))
    }
}

/// A response head as offsets into the bytes `HTTP1Parser.parseResponseHeadSpans` read it from, valid only with
/// those bytes. What the relay of an HTTP/1 origin's head needs is read from the bytes without building a String:
/// framing, `Connection` options, and each line copied as `HeadWriter` would write it from the Strings.
/// `head(in:)` builds the `ResponseHead` that `parseResponseHead` gives for the same bytes.
public struct ResponseHeadSpans: Hashable, Sendable {
    public var version: HTTPVersion
    public var status: Int
    public var reason: Range<Int>
    public var fields: FieldSpans

    /// The head with its Strings, as `HTTP1Parser.parseResponseHead` gives it: `bytes` must be those parsed.
    public func head(in bytes: UnsafeRawBufferPointer) -> ResponseHead {
        var built: [HTTPField] = []
        built.reserveCapacity(fields.spans.count)
        for span in fields.spans { built.collect(bytes, name: span.name, value: span.value) }
        return ResponseHead(version: version, status: status, reason: reason(in: bytes), fields: built)
    }

    /// The reason phrase, as `parseResponseHead` spells it.
    public func reason(in bytes: UnsafeRawBufferPointer) -> String {
        CommonSpellings.string(bytes, reason.lowerBound, reason.upperBound)
    }

    /// `ResponseHead.bodyFraming(requestMethod:)` of `head(in: bytes)`, from the bytes.
    public func bodyFraming(in bytes: UnsafeRawBufferPointer, requestMethod: String) -> Result<BodyFraming, HTTPWireError> {
        ResponseHead.bodyFraming(status: status, requestMethod: requestMethod) {
            var framing = FramingFields()
            for span in fields.spans where FramingFields.mayCount(nameLength: span.name.count) {
                framing.add(name: Self.slice(bytes, span.name), value: Self.slice(bytes, span.value))
            }
            return framing.strictFraming(version: version, message: "response", otherwise: .untilClose)
        }
    }

    /// `ResponseHead.connectionTokens` of `head(in: bytes)`, from the bytes.
    public func connectionTokens(in bytes: UnsafeRawBufferPointer) -> ConnectionOptions {
        var options = ConnectionOptions()
        for span in fields.spans where span.name.count == 10 {
            let name = Self.slice(bytes, span.name)
            if ASCII.equalsIgnoringCase(name, "connection") { options.insert(list: Self.slice(bytes, span.value)) }
        }
        return options
    }

    /// `bytes[range]` as bytes: the parser checked that the range is within them.
    @inline(__always)
    public static func slice(_ bytes: UnsafeRawBufferPointer, _ range: Range<Int>) -> UnsafeBufferPointer<UInt8> {
        guard let base = bytes.baseAddress, !range.isEmpty else { return UnsafeBufferPointer(start: nil, count: 0) }
        return UnsafeBufferPointer(start: base.assumingMemoryBound(to: UInt8.self) + range.lowerBound, count: range.count)
    }
}
