/// A compiled glob where `*` matches any run of characters, possibly empty; every other character is literal.
///
/// Compiled once per policy snapshot into literal segments (the text between stars), so matching a
/// request is a prefix test, a suffix test and a leftmost search for each middle segment, with no allocation.
/// This is enough for a correct answer: with only `*` wildcards, an anchored first segment, an anchored last
/// segment and leftmost placement of the middle ones finds a match whenever one exists. Captures follow from
/// the same placement (leftmost-shortest for all stars but the last, which takes the rest up to the suffix):
/// `http://cdn.example/img/*.jpg` against `http://cdn.example/img/a.b.jpg` captures `a.b`.
///
/// Rules use the case-insensitive form (host and path globs, SPEC §8); variant URL patterns the
/// case-sensitive one (paths are case-sensitive, RFC 3986 §6.2.2.1; scheme and host are normalized to
/// lowercase on both sides beforehand). Case folding is ASCII only.
public struct Glob: Sendable, Hashable, CustomStringConvertible {
    /// The pattern as written (lowercased when case-insensitive).
    public let pattern: String
    public let caseInsensitive: Bool
    /// All literal segments, concatenated (ASCII-lowercased when case-insensitive).
    let literal: [UInt8]
    /// `ends[k]` is the end offset in `literal` of segment `k`; there are `starCount + 1` segments.
    let ends: [Int32]

    public init(_ pattern: String, caseInsensitive: Bool) {
        self.caseInsensitive = caseInsensitive
        self.pattern = caseInsensitive ? Glob.asciiLowercased(pattern) : pattern
        var literal: [UInt8] = []
        var ends: [Int32] = []
        literal.reserveCapacity(pattern.utf8.count)
        for byte in self.pattern.utf8 {
            if byte == UInt8(ascii: "*") {
                ends.append(Int32(literal.count))
            } else {
                literal.append(byte)
            }
        }
        ends.append(Int32(literal.count))
        self.literal = literal
        self.ends = ends
    }

    /// How many `*` the pattern has: the number of captures.
    public var starCount: Int { ends.count - 1 }
    /// A pattern without `*` matches exactly one string.
    public var isLiteral: Bool { ends.count == 1 }
    /// The text before the first `*` (the whole pattern for a literal one).
    public var literalPrefix: Substring {
        let idx = pattern.utf8.firstIndex(of: UInt8(ascii: "*")) ?? pattern.utf8.endIndex
        return pattern[..<idx]
    }

    public var description: String { pattern }

    // MARK: Matching

    public func matches(_ text: String) -> Bool {
        var text = text
        return text.withUTF8 { matches($0) }
    }

    public func matches(_ text: Substring) -> Bool {
        var text = text
        return text.withUTF8 { matches($0) }
    }

    /// Whether the whole of `text` matches. Never allocates.
    public func matches(_ text: UnsafeBufferPointer<UInt8>) -> Bool {
        literal.withUnsafeBufferPointer { lit in
            ends.withUnsafeBufferPointer { ends in
                GlobCore.place(text, lit, ends, caseInsensitive: caseInsensitive, starts: nil)
            }
        }
    }

    /// The runs matched by each `*`, in order, or `nil` when `text` does not match.
    public func captures(in text: String) -> [Substring]? {
        var copy = text
        guard let ranges = copy.withUTF8({ captureRanges($0) }) else { return nil }
        let utf8 = text.utf8
        return ranges.map { r in
            text[utf8.index(utf8.startIndex, offsetBy: r.lowerBound)..<utf8.index(utf8.startIndex, offsetBy: r.upperBound)]
        }
    }

    /// Byte ranges in `text` matched by each `*`, or `nil` when it does not match. Allocates only on a match.
    public func captureRanges(_ text: UnsafeBufferPointer<UInt8>) -> [Range<Int>]? {
        guard matches(text) else { return nil }
        var starts = [Int](repeating: 0, count: ends.count)
        literal.withUnsafeBufferPointer { lit in
            ends.withUnsafeBufferPointer { ends in
                starts.withUnsafeMutableBufferPointer { starts in
                    _ = GlobCore.place(text, lit, ends, caseInsensitive: caseInsensitive, starts: starts)
                }
            }
        }
        var ranges: [Range<Int>] = []
        ranges.reserveCapacity(starCount)
        for k in 1..<ends.count {
            let previousEnd = starts[k - 1] + Int(ends[k - 1]) - (k == 1 ? 0 : Int(ends[k - 2]))
            ranges.append(previousEnd..<starts[k])
        }
        return ranges
    }

    static func asciiLowercased(_ s: String) -> String {
        guard s.utf8.contains(where: { $0 &- UInt8(ascii: "A") < 26 }) else { return s }
        return String(decoding: s.utf8.map { $0 &- UInt8(ascii: "A") < 26 ? $0 | 0x20 : $0 }, as: UTF8.self)
    }
}

/// The matching algorithm over raw buffers, shared by `Glob` and `GlobTable`.
enum GlobCore {
    /// Places every segment of a glob (`lit` split at `ends`) in `text`; `starts[k]` receives where segment `k`
    /// begins. Returns whether the whole text matches.
    @inline(__always)
    static func place(_ text: UnsafeBufferPointer<UInt8>, _ lit: UnsafeBufferPointer<UInt8>,
                      _ ends: UnsafeBufferPointer<Int32>, caseInsensitive: Bool,
                      starts: UnsafeMutableBufferPointer<Int>?) -> Bool {
        let n = text.count
        guard n >= lit.count else { return false }
        let last = ends.count - 1
        let firstLength = Int(ends[0])
        // Segment 0 is anchored at the start.
        guard equal(text, 0, lit, 0, firstLength, caseInsensitive) else { return false }
        if last == 0 { return n == firstLength }
        // The last segment is anchored at the end.
        let lastStart = Int(ends[last - 1])
        let lastLength = lit.count - lastStart
        let suffixAt = n - lastLength
        guard suffixAt >= firstLength, equal(text, suffixAt, lit, lastStart, lastLength, caseInsensitive) else {
            return false
        }
        if let starts { starts[0] = 0; starts[last] = suffixAt }
        // Middle segments: leftmost placement between the prefix and the suffix.
        var pos = firstLength
        var k = 1
        while k < last {
            let segStart = Int(ends[k - 1])
            let segLength = Int(ends[k]) - segStart
            guard let found = search(text, pos, suffixAt, lit, segStart, segLength, caseInsensitive) else {
                return false
            }
            if let starts { starts[k] = found }
            pos = found + segLength
            k += 1
        }
        return true
    }

    @inline(__always)
    static func fold(_ b: UInt8, _ caseInsensitive: Bool) -> UInt8 {
        caseInsensitive && b &- UInt8(ascii: "A") < 26 ? b | 0x20 : b
    }

    @inline(__always)
    static func equal(_ text: UnsafeBufferPointer<UInt8>, _ offset: Int, _ lit: UnsafeBufferPointer<UInt8>,
                      _ litOffset: Int, _ length: Int, _ caseInsensitive: Bool) -> Bool {
        var i = 0
        while i < length {
            if fold(text[offset + i], caseInsensitive) != lit[litOffset + i] { return false }
            i += 1
        }
        return true
    }

    /// Leftmost occurrence of the segment inside `text[from..<limit]`.
    static func search(_ text: UnsafeBufferPointer<UInt8>, _ from: Int, _ limit: Int, _ lit: UnsafeBufferPointer<UInt8>,
                       _ segStart: Int, _ segLength: Int, _ caseInsensitive: Bool) -> Int? {
        if segLength == 0 { return from }
        let first = lit[segStart]
        var i = from
        while i + segLength <= limit {
            if fold(text[i], caseInsensitive) == first && equal(text, i, lit, segStart, segLength, caseInsensitive) {
                return i
            }
            i += 1
        }
        return nil
    }
}

/// Many compiled globs in flat storage (one byte buffer, one offsets buffer, one entry per glob), so that trying
/// a list of globs against a request touches no reference counts: the policy's hot loops run on plain integers.
struct GlobTable: Sendable {
    struct Entry: Sendable {
        var literalStart: Int32
        var literalCount: Int32
        var endsStart: Int32
        var endsCount: Int32
    }

    let caseInsensitive: Bool
    private(set) var bytes: [UInt8] = []
    private(set) var ends: [Int32] = []
    private(set) var entries: [Entry] = []

    init(caseInsensitive: Bool) { self.caseInsensitive = caseInsensitive }

    /// Adds a glob compiled with the same case sensitivity; returns its number in the table.
    mutating func append(_ glob: Glob) -> Int32 {
        precondition(glob.caseInsensitive == caseInsensitive)
        let entry = Entry(literalStart: Int32(bytes.count), literalCount: Int32(glob.literal.count),
                          endsStart: Int32(ends.count), endsCount: Int32(glob.ends.count))
        bytes += glob.literal
        ends += glob.ends
        entries.append(entry)
        return Int32(entries.count - 1)
    }

    func withView<R>(_ body: (View) -> R) -> R {
        bytes.withUnsafeBufferPointer { bytes in
            ends.withUnsafeBufferPointer { ends in
                entries.withUnsafeBufferPointer { entries in
                    body(View(bytes: bytes, ends: ends, entries: entries, caseInsensitive: caseInsensitive))
                }
            }
        }
    }

    struct View {
        let bytes: UnsafeBufferPointer<UInt8>
        let ends: UnsafeBufferPointer<Int32>
        let entries: UnsafeBufferPointer<Entry>
        let caseInsensitive: Bool

        @inline(__always)
        func matches(_ glob: Int32, _ text: UnsafeBufferPointer<UInt8>) -> Bool {
            let e = entries[Int(glob)]
            let lit = UnsafeBufferPointer(rebasing: bytes[Int(e.literalStart)..<Int(e.literalStart + e.literalCount)])
            let segs = UnsafeBufferPointer(rebasing: ends[Int(e.endsStart)..<Int(e.endsStart + e.endsCount)])
            return GlobCore.place(text, lit, segs, caseInsensitive: caseInsensitive, starts: nil)
        }
    }
}
