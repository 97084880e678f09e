/// DASH MPDs (ISO/IEC 23009-1): a small, strict, bounded XML reader for what capping needs, and the cap itself.
///
/// The reader checks well-formedness as far as it matters here (tags nest and match, attributes are quoted and
/// unique, references are well-formed, text outside the root is whitespace, valid UTF-8) and refuses DTDs outright
/// (no entity expansion, hence no billion laughs). It never builds a tree: it records the `Representation`
/// elements of each `AdaptationSet` with their byte ranges, and the cap removes whole elements (with the
/// indentation before and the line end after them), so every other byte is kept as it was.
enum DASHManifest {
    static let maximumDepth = 64

    static func startsLikeMPD(_ body: [UInt8]) -> Bool {
        if case .candidate = sniff(body, complete: true) { return true }
        return false
    }

    /// Skips the prolog (BOM, XML declaration, comments, processing instructions, whitespace) and looks at the
    /// root element's name. `nil` when the body does not start like XML at all.
    static func sniff(_ prefix: [UInt8], complete: Bool) -> ManifestSniff? {
        var i = 0
        if prefix.hasPrefix([0xEF, 0xBB, 0xBF]) { i = 3 }
        var sawMarkup = false
        while true {
            while i < prefix.count, isSpace(prefix[i]) { i += 1 }
            guard i < prefix.count else { return sawMarkup || i > 0 ? (complete ? .notAManifest : .needMore) : (complete ? nil : .needMore) }
            guard prefix[i] == UInt8(ascii: "<") else { return sawMarkup ? .notAManifest : nil }
            sawMarkup = true
            let rest = prefix.count - i
            if rest < 4 && Array("<!--".utf8).hasPrefix(Array(prefix[i...])) {
                return complete ? .notAManifest : .needMore  // a comment may start here
            }
            if prefix.hasPrefix(Array("<?".utf8), at: i) || prefix.hasPrefix(Array("<!--".utf8), at: i) {
                let close = prefix[i + 1] == UInt8(ascii: "?") ? Array("?>".utf8) : Array("-->".utf8)
                guard let end = find(close, in: prefix, from: i + 2) else { return complete ? .notAManifest : .needMore }
                i = end + close.count
                continue
            }
            // The root element's name.
            var j = i + 1
            while j < prefix.count, isNameByte(prefix[j]) { j += 1 }
            guard j < prefix.count else { return complete ? .notAManifest : .needMore }
            guard j > i + 1, isSpace(prefix[j]) || prefix[j] == UInt8(ascii: ">") || prefix[j] == UInt8(ascii: "/") else {
                return .notAManifest
            }
            return localName(prefix[(i + 1)..<j]) == Array("MPD".utf8)[...] ? .candidate(.dash) : .notAManifest
        }
    }

    struct Representation {
        var range: Range<Int>
        var entry: CapSelection.Entry
        var id: ArraySlice<UInt8>?
        var dependencies: [ArraySlice<UInt8>]
    }

    struct Open {
        var name: ArraySlice<UInt8>
        var start: Int
        /// For an AdaptationSet: whether its content is audio (contentType or mimeType).
        var audio = false
        /// For a Representation being recorded: its index in `representations`.
        var representation: Int?
        var isAdaptationSet = false
    }

    struct MalformedXML: Error {
        var message: String
        init(_ message: String) { self.message = message }
    }

    static func rewrite(_ body: [UInt8], cap: UInt64) -> ManifestRewriteResult {
        guard String(validating: body, as: UTF8.self) != nil else { return .malformed("not UTF-8") }
        do throws(MalformedXML) {
            let groups = try scan(body)
            var removals: [Range<Int>] = []
            var removedIDs: [Int: Bool] = [:]
            var all: [Representation] = []
            var keepAll: [Bool] = []
            for group in groups {
                let keep = CapSelection.kept(group.map(\.entry), cap: cap)
                all.append(contentsOf: group)
                keepAll.append(contentsOf: keep)
            }
            // A kept Representation that depends on another (@dependencyId) keeps that one too.
            var changed = true
            while changed {
                changed = false
                for (index, representation) in all.enumerated() where keepAll[index] {
                    for dependency in representation.dependencies {
                        for (other, candidate) in all.enumerated() where !keepAll[other] && candidate.id == dependency {
                            keepAll[other] = true
                            changed = true
                        }
                    }
                }
            }
            for (index, kept) in keepAll.enumerated() where !kept {
                removals.append(extendToLines(all[index].range, in: body))
                removedIDs[index] = true
            }
            guard !removals.isEmpty else { return .unchanged(.dash) }
            removals.sort { $0.lowerBound < $1.lowerBound }
            return .rewritten(.dash, body: removing(removals, from: body), removed: removals.count)
        } catch {
            return .malformed(error.message)
        }
    }

    /// The element's range, widened to the spaces before it when it starts its line, and to the spaces and line
    /// end after it when it ends its line: removing it then leaves no blank line behind.
    static func extendToLines(_ range: Range<Int>, in body: [UInt8]) -> Range<Int> {
        var start = range.lowerBound
        while start > 0, body[start - 1] == 0x20 || body[start - 1] == 0x09 { start -= 1 }
        guard start == 0 || body[start - 1] == 0x0A else { return range }
        var end = range.upperBound
        while end < body.count, body[end] == 0x20 || body[end] == 0x09 { end += 1 }
        if end < body.count, body[end] == 0x0D { end += 1 }
        guard end < body.count, body[end] == 0x0A else { return start..<range.upperBound }
        return start..<(end + 1)
    }

    /// Reads the whole document; returns the Representations of each AdaptationSet, in document order.
    static func scan(_ body: [UInt8]) throws(MalformedXML) -> [[Representation]] {
        var groups: [[Representation]] = []
        var current: [Int: [Representation]] = [:]  // keyed by the AdaptationSet's depth
        var stack: [Open] = []
        var rootSeen = false
        var i = body.hasPrefix([0xEF, 0xBB, 0xBF]) ? 3 : 0
        while i < body.count {
            let byte = body[i]
            if byte != UInt8(ascii: "<") {
                let start = i
                while i < body.count, body[i] != UInt8(ascii: "<") { i += 1 }
                try checkText(body[start..<i], inside: !stack.isEmpty)
                continue
            }
            if body.hasPrefix(Array("<!--".utf8), at: i) {
                guard let end = find(Array("--".utf8), in: body, from: i + 4), body.hasPrefix(Array("-->".utf8), at: end) else {
                    throw MalformedXML("an unterminated comment or -- inside one")
                }
                i = end + 3
                continue
            }
            if body.hasPrefix(Array("<?".utf8), at: i) {
                guard let end = find(Array("?>".utf8), in: body, from: i + 2) else { throw MalformedXML("an unterminated processing instruction") }
                i = end + 2
                continue
            }
            if body.hasPrefix(Array("<![CDATA[".utf8), at: i) {
                guard !stack.isEmpty else { throw MalformedXML("CDATA outside the root element") }
                guard let end = find(Array("]]>".utf8), in: body, from: i + 9) else { throw MalformedXML("an unterminated CDATA section") }
                i = end + 3
                continue
            }
            if body.hasPrefix(Array("<!".utf8), at: i) { throw MalformedXML("a DOCTYPE or other declaration (not accepted)") }
            if body.hasPrefix(Array("</".utf8), at: i) {
                var j = i + 2
                let nameStart = j
                while j < body.count, isNameByte(body[j]) { j += 1 }
                let name = body[nameStart..<j]
                while j < body.count, isSpace(body[j]) { j += 1 }
                guard j < body.count, body[j] == UInt8(ascii: ">") else { throw MalformedXML("a bad end tag") }
                guard let open = stack.popLast(), open.name == name else { throw MalformedXML("an end tag that does not match") }
                let end = j + 1
                close(open, end: end, depth: stack.count, groups: &groups, current: &current)
                i = end
                continue
            }
            // A start tag.
            guard stack.isEmpty ? !rootSeen : true else { throw MalformedXML("a second root element") }
            var j = i + 1
            guard j < body.count, isNameStartByte(body[j]) else { throw MalformedXML("a bad element name") }
            while j < body.count, isNameByte(body[j]) { j += 1 }
            let name = body[(i + 1)..<j]
            var attributes: [(name: ArraySlice<UInt8>, value: ArraySlice<UInt8>)] = []
            var selfClosing = false
            while true {
                let spaceStart = j
                while j < body.count, isSpace(body[j]) { j += 1 }
                guard j < body.count else { throw MalformedXML("an unterminated start tag") }
                if body[j] == UInt8(ascii: ">") { j += 1; break }
                if body[j] == UInt8(ascii: "/") {
                    guard j + 1 < body.count, body[j + 1] == UInt8(ascii: ">") else { throw MalformedXML("a bad empty-element tag") }
                    selfClosing = true
                    j += 2
                    break
                }
                guard j > spaceStart, isNameStartByte(body[j]) else { throw MalformedXML("a bad attribute") }
                let attributeStart = j
                while j < body.count, isNameByte(body[j]) { j += 1 }
                let attributeName = body[attributeStart..<j]
                while j < body.count, isSpace(body[j]) { j += 1 }
                guard j < body.count, body[j] == UInt8(ascii: "=") else { throw MalformedXML("an attribute without a value") }
                j += 1
                while j < body.count, isSpace(body[j]) { j += 1 }
                guard j < body.count, body[j] == UInt8(ascii: "\"") || body[j] == UInt8(ascii: "'") else {
                    throw MalformedXML("an unquoted attribute value")
                }
                let quote = body[j]
                let valueStart = j + 1
                j = valueStart
                while j < body.count, body[j] != quote {
                    guard body[j] != UInt8(ascii: "<") else { throw MalformedXML("< in an attribute value") }
                    j += 1
                }
                guard j < body.count else { throw MalformedXML("an unterminated attribute value") }
                let value = body[valueStart..<j]
                try checkReferences(value)
                j += 1
                guard !attributes.contains(where: { $0.name == attributeName }) else { throw MalformedXML("an attribute given twice") }
                attributes.append((attributeName, value))
            }
            if stack.isEmpty {
                guard localName(name) == Array("MPD".utf8)[...] else { throw MalformedXML("the root element is not MPD") }
                rootSeen = true
            }
            guard stack.count < maximumDepth else { throw MalformedXML("elements nested deeper than \(maximumDepth)") }
            var open = Open(name: name, start: i)
            let local = localName(name)
            func attribute(_ key: String) -> ArraySlice<UInt8>? {
                attributes.first { $0.name.elementsEqual(key.utf8) }?.value
            }
            if local.elementsEqual("AdaptationSet".utf8) {
                open.isAdaptationSet = true
                open.audio = attribute("contentType").map { $0.elementsEqual("audio".utf8) } == true
                    || attribute("mimeType").map { $0.starts(with: "audio/".utf8) } == true
                current[stack.count] = []
            } else if local.elementsEqual("Representation".utf8), let parent = stack.last, parent.isAdaptationSet {
                guard let text = attribute("bandwidth"), let bandwidth = decimal(text) else {
                    throw MalformedXML("a Representation without a decimal @bandwidth")
                }
                let audio = parent.audio || attribute("mimeType").map { $0.starts(with: "audio/".utf8) } == true
                let dependencies = attribute("dependencyId").map { $0.split(separator: 0x20) } ?? []
                let representation = Representation(range: i..<j, entry: CapSelection.Entry(bandwidth: bandwidth, audioOnly: audio),
                                                    id: attribute("id"), dependencies: dependencies)
                open.representation = current[stack.count - 1]!.count
                current[stack.count - 1]!.append(representation)
            }
            if selfClosing {
                close(open, end: j, depth: stack.count, groups: &groups, current: &current)
            } else {
                stack.append(open)
            }
            i = j
        }
        guard stack.isEmpty else { throw MalformedXML("unclosed elements at the end") }
        guard rootSeen else { throw MalformedXML("no root element") }
        return groups
    }

    private static func close(_ open: Open, end: Int, depth: Int, groups: inout [[Representation]],
                              current: inout [Int: [Representation]]) {
        if let index = open.representation {
            current[depth - 1]![index].range = open.start..<end
        }
        if open.isAdaptationSet, let group = current.removeValue(forKey: depth) {
            groups.append(group)
        }
    }

    /// Character data: outside the root only whitespace; inside, `&` only as a well-formed reference.
    private static func checkText(_ text: ArraySlice<UInt8>, inside: Bool) throws(MalformedXML) {
        if !inside {
            guard text.allSatisfy(isSpace) else { throw MalformedXML("text outside the root element") }
            return
        }
        try checkReferences(text)
    }

    private static func checkReferences(_ text: ArraySlice<UInt8>) throws(MalformedXML) {
        var i = text.startIndex
        while i < text.endIndex {
            let byte = text[i]
            if byte < 0x20 && byte != 0x09 && byte != 0x0A && byte != 0x0D { throw MalformedXML("a control character") }
            if byte == UInt8(ascii: "&") {
                var j = i + 1
                if j < text.endIndex, text[j] == UInt8(ascii: "#") {
                    j += 1
                    let hex = j < text.endIndex && text[j] == UInt8(ascii: "x")
                    if hex { j += 1 }
                    let digitsStart = j
                    while j < text.endIndex, isDigit(text[j], hex: hex) { j += 1 }
                    guard j > digitsStart, j - digitsStart <= 8 else { throw MalformedXML("a bad character reference") }
                } else {
                    let nameStart = j
                    while j < text.endIndex, isNameByte(text[j]) { j += 1 }
                    guard j > nameStart else { throw MalformedXML("a bare &") }
                }
                guard j < text.endIndex, text[j] == UInt8(ascii: ";") else { throw MalformedXML("a reference without ;") }
                i = j
            }
            i += 1
        }
    }

    static func localName(_ name: ArraySlice<UInt8>) -> ArraySlice<UInt8> {
        guard let colon = name.lastIndex(of: UInt8(ascii: ":")) else { return name }
        return name[(colon + 1)...]
    }

    static func isSpace(_ byte: UInt8) -> Bool { byte == 0x20 || byte == 0x09 || byte == 0x0A || byte == 0x0D }

    static func isDigit(_ byte: UInt8, hex: Bool) -> Bool {
        (byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9"))
            || (hex && ((byte >= UInt8(ascii: "a") && byte <= UInt8(ascii: "f")) || (byte >= UInt8(ascii: "A") && byte <= UInt8(ascii: "F"))))
    }

    static func isNameStartByte(_ byte: UInt8) -> Bool {
        (byte >= UInt8(ascii: "a") && byte <= UInt8(ascii: "z")) || (byte >= UInt8(ascii: "A") && byte <= UInt8(ascii: "Z"))
            || byte == UInt8(ascii: "_") || byte == UInt8(ascii: ":") || byte >= 0x80
    }

    static func isNameByte(_ byte: UInt8) -> Bool {
        isNameStartByte(byte) || (byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9"))
            || byte == UInt8(ascii: "-") || byte == UInt8(ascii: ".")
    }

    static func find(_ needle: [UInt8], in haystack: [UInt8], from start: Int) -> Int? {
        guard start <= haystack.count, needle.count <= haystack.count else { return nil }
        var i = start
        while i + needle.count <= haystack.count {
            if haystack[i] == needle[0] && haystack.hasPrefix(needle, at: i) { return i }
            i += 1
        }
        return nil
    }
}
