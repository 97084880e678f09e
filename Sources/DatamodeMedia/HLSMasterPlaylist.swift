/// HLS master (multivariant) playlists, RFC 8216 §4: parsed strictly line by line, capped by removing whole
/// `#EXT-X-STREAM-INF` entries (the tag, its URI line and anything between) and whole `#EXT-X-I-FRAME-STREAM-INF`
/// lines. `#EXT-X-MEDIA` renditions, session data, comments and unknown tags are kept byte for byte, so the groups
/// the kept streams refer to are still there.
enum HLSMasterPlaylist {
    static let signature = Array("#EXTM3U".utf8)
    static let streamInf = Array("#EXT-X-STREAM-INF".utf8)
    static let iFrameStreamInf = Array("#EXT-X-I-FRAME-STREAM-INF".utf8)
    /// Tags that only a media playlist has (RFC 8216 §4.3.2, §4.3.3): a body with one is not a master playlist.
    static let mediaTags = ["#EXTINF", "#EXT-X-TARGETDURATION", "#EXT-X-MEDIA-SEQUENCE", "#EXT-X-BYTERANGE",
                            "#EXT-X-ENDLIST", "#EXT-X-PLAYLIST-TYPE", "#EXT-X-DISCONTINUITY-SEQUENCE",
                            "#EXT-X-DISCONTINUITY", "#EXT-X-PART", "#EXT-X-PART-INF", "#EXT-X-MAP",
                            "#EXT-X-PROGRAM-DATE-TIME", "#EXT-X-I-FRAMES-ONLY", "#EXT-X-KEY", "#EXT-X-GAP"]
        .map { Array($0.utf8) }

    static func startsLikePlaylist(_ body: [UInt8]) -> Bool {
        body.hasPrefix(signature) && (body.count == signature.count || body[signature.count] == 0x0A
            || body[signature.count] == 0x0D)
    }

    /// One line: its bytes without the terminator, and the range including the terminator.
    struct Line {
        var content: Range<Int>
        var whole: Range<Int>
    }

    /// Splits into lines on LF (a CR is allowed only right before it); `nil` for a bare CR or a control byte.
    static func lines(_ body: [UInt8], upTo limit: Int? = nil) -> [Line]? {
        var lines: [Line] = []
        var start = 0
        var i = 0
        let end = min(limit ?? body.count, body.count)
        while i < end {
            let byte = body[i]
            if byte == 0x0A {
                let contentEnd = i > start && body[i - 1] == 0x0D ? i - 1 : i
                lines.append(Line(content: start..<contentEnd, whole: start..<(i + 1)))
                start = i + 1
            } else if byte == 0x0D {
                guard i + 1 < body.count, body[i + 1] == 0x0A else {
                    if i + 1 == end && limit != nil { break }  // the LF may follow later
                    return nil
                }
            } else if (byte < 0x20 && byte != 0x09) || byte == 0x7F {
                return nil
            }
            i += 1
        }
        if limit == nil && start < body.count { lines.append(Line(content: start..<body.count, whole: start..<body.count)) }
        return lines
    }

    static func isTag(_ body: [UInt8], _ line: Line, _ tag: [UInt8]) -> Bool {
        let next = line.content.lowerBound + tag.count
        return body.hasPrefix(tag, at: line.content.lowerBound)
            && (next == line.content.upperBound || body[next] == UInt8(ascii: ":"))
    }

    static func isMediaTag(_ body: [UInt8], _ line: Line) -> Bool {
        mediaTags.contains { isTag(body, line, $0) }
    }

    static func isBlank(_ body: [UInt8], _ line: Line) -> Bool {
        body[line.content].allSatisfy { $0 == 0x20 || $0 == 0x09 }
    }

    static func sniff(_ prefix: [UInt8], complete: Bool) -> ManifestSniff? {
        let checked = min(prefix.count, signature.count)
        guard Array(prefix[0..<checked]) == Array(signature[0..<checked]) else { return nil }
        if prefix.count <= signature.count { return complete ? .notAManifest : .needMore }
        guard startsLikePlaylist(prefix) else { return nil }
        guard let lines = lines(prefix, upTo: complete ? nil : prefix.count) else { return .candidate(.hls) }
        for line in lines.dropFirst() {
            if isTag(prefix, line, streamInf) || isTag(prefix, line, iFrameStreamInf) { return .candidate(.hls) }
            if isMediaTag(prefix, line) { return .notAManifest }
            if !isBlank(prefix, line) && prefix[line.content.lowerBound] != UInt8(ascii: "#") { return .notAManifest }
        }
        return complete ? .candidate(.hls) : .needMore
    }

    /// One stream of a group: where it is and what it costs.
    struct Stream {
        var range: Range<Int>
        var entry: CapSelection.Entry
    }

    static func rewrite(_ body: [UInt8], cap: UInt64) -> ManifestRewriteResult {
        guard String(validating: body, as: UTF8.self) != nil else { return .malformed("not UTF-8") }
        guard let lines = lines(body) else { return .malformed("a control character or a bare CR") }
        var variants: [Stream] = []
        var iFrames: [Stream] = []
        var pending: (start: Int, entry: CapSelection.Entry)?
        var sawMediaTag = false
        var sawSegmentURI = false
        for (number, line) in lines.enumerated().dropFirst() {
            if isBlank(body, line) { continue }
            let text = body[line.content]
            if text.first == UInt8(ascii: "#") {
                if isTag(body, line, streamInf) {
                    guard pending == nil else { return .malformed("line \(number + 1): EXT-X-STREAM-INF without a URI before it") }
                    switch attributes(body, line, tag: streamInf) {
                    case .failure(let problem): return .malformed("line \(number + 1): \(problem)")
                    case .success(let attributes):
                        guard let bandwidth = attributes.bandwidth else {
                            return .malformed("line \(number + 1): EXT-X-STREAM-INF without BANDWIDTH")
                        }
                        pending = (line.whole.lowerBound, CapSelection.Entry(bandwidth: bandwidth, audioOnly: attributes.audioOnly))
                    }
                } else if isTag(body, line, iFrameStreamInf) {
                    guard pending == nil else { return .malformed("line \(number + 1): EXT-X-I-FRAME-STREAM-INF before a URI") }
                    switch attributes(body, line, tag: iFrameStreamInf) {
                    case .failure(let problem): return .malformed("line \(number + 1): \(problem)")
                    case .success(let attributes):
                        guard let bandwidth = attributes.bandwidth, attributes.hasURI else {
                            return .malformed("line \(number + 1): EXT-X-I-FRAME-STREAM-INF without BANDWIDTH or URI")
                        }
                        iFrames.append(Stream(range: line.whole, entry: CapSelection.Entry(bandwidth: bandwidth, audioOnly: false)))
                    }
                } else if isMediaTag(body, line) {
                    sawMediaTag = true
                }
                continue
            }
            // A URI line: a variant stream's, or a media segment's.
            if let stream = pending {
                variants.append(Stream(range: stream.start..<line.whole.upperBound, entry: stream.entry))
                pending = nil
            } else {
                sawSegmentURI = true
            }
        }
        let isMaster = !variants.isEmpty || !iFrames.isEmpty || pending != nil
        guard isMaster else { return .notAManifest }
        if pending != nil { return .malformed("EXT-X-STREAM-INF without its URI line at the end") }
        if sawMediaTag || sawSegmentURI { return .malformed("a master playlist with media playlist tags or segment URIs") }

        var removals: [Range<Int>] = []
        for group in [variants, iFrames] {
            let keep = CapSelection.kept(group.map(\.entry), cap: cap)
            for (stream, kept) in zip(group, keep) where !kept { removals.append(stream.range) }
        }
        guard !removals.isEmpty else { return .unchanged(.hls) }
        removals.sort { $0.lowerBound < $1.lowerBound }
        return .rewritten(.hls, body: removing(removals, from: body), removed: removals.count)
    }

    struct Attributes {
        var bandwidth: UInt64?
        var audioOnly = false
        var hasURI = false
    }

    /// Parses a tag's attribute list strictly (RFC 8216 §4.2): `NAME=value` pairs separated by commas, names of
    /// `[A-Z0-9-]`, values quoted (no `"`, CR or LF inside) or unquoted (no comma, quote or whitespace); every
    /// name once.
    static func attributes(_ body: [UInt8], _ line: Line, tag: [UInt8]) -> Result<Attributes, AttributeError> {
        var i = line.content.lowerBound + tag.count
        let end = line.content.upperBound
        guard i < end, body[i] == UInt8(ascii: ":"), i + 1 < end else { return .failure(AttributeError("no attribute list")) }
        i += 1
        var names: Set<[UInt8]> = []
        var result = Attributes()
        var codecs: ArraySlice<UInt8>?
        var resolution = false
        while true {
            let nameStart = i
            while i < end, isNameByte(body[i]) { i += 1 }
            guard i > nameStart, i < end, body[i] == UInt8(ascii: "=") else {
                return .failure(AttributeError("bad attribute name at column \(nameStart - line.content.lowerBound + 1)"))
            }
            let name = Array(body[nameStart..<i])
            guard names.insert(name).inserted else {
                return .failure(AttributeError("attribute \(String(decoding: name, as: UTF8.self)) given twice"))
            }
            i += 1
            let value: ArraySlice<UInt8>
            if i < end, body[i] == UInt8(ascii: "\"") {
                let valueStart = i + 1
                i = valueStart
                while i < end, body[i] != UInt8(ascii: "\"") { i += 1 }
                guard i < end else { return .failure(AttributeError("unterminated quoted string")) }
                value = body[valueStart..<i]
                i += 1
            } else {
                let valueStart = i
                while i < end, body[i] != UInt8(ascii: ",") {
                    let byte = body[i]
                    guard byte != UInt8(ascii: "\""), byte != 0x20, byte != 0x09 else {
                        return .failure(AttributeError("bad unquoted value of \(String(decoding: name, as: UTF8.self))"))
                    }
                    i += 1
                }
                guard i > valueStart else { return .failure(AttributeError("empty value of \(String(decoding: name, as: UTF8.self))")) }
                value = body[valueStart..<i]
            }
            switch String(decoding: name, as: UTF8.self) {
            case "BANDWIDTH":
                guard let bandwidth = decimal(value) else { return .failure(AttributeError("BANDWIDTH is not a decimal integer")) }
                result.bandwidth = bandwidth
            case "CODECS": codecs = value
            case "RESOLUTION": resolution = true
            case "URI": result.hasURI = true
            default: break
            }
            if i == end { break }
            guard body[i] == UInt8(ascii: ","), i + 1 < end else { return .failure(AttributeError("a trailing comma")) }
            i += 1
        }
        if !resolution, let codecs { result.audioOnly = isAudioOnly(codecs) }
        return .success(result)
    }

    struct AttributeError: Error, CustomStringConvertible {
        var description: String
        init(_ description: String) { self.description = description }
    }

    static func isNameByte(_ byte: UInt8) -> Bool {
        (byte >= UInt8(ascii: "A") && byte <= UInt8(ascii: "Z")) || (byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9"))
            || byte == UInt8(ascii: "-")
    }

    /// Codec families (RFC 6381 sample entry names) of audio and of text tracks.
    static let audioCodecs: Set<String> = ["mp4a", "ac-3", "ec-3", "ac-4", "opus", "Opus", "fLaC", "flac", "alac",
                                           "dtsc", "dtse", "dtsh", "dtsl", "dtsx", "mhm1", "mhm2", "mp3", "vorbis"]
    static let textCodecs: Set<String> = ["wvtt", "stpp", "tx3g", "c608", "c708"]

    /// True when a `CODECS` list names audio (and perhaps text) codecs only: an audio-only variant.
    static func isAudioOnly(_ codecs: ArraySlice<UInt8>) -> Bool {
        var sawAudio = false
        for codec in codecs.split(separator: UInt8(ascii: ",")) {
            let trimmed = codec.drop { $0 == 0x20 }.reversed().drop { $0 == 0x20 }.reversed()
            let family = String(decoding: trimmed.prefix { $0 != UInt8(ascii: ".") }, as: UTF8.self)
            if audioCodecs.contains(family) { sawAudio = true } else if !textCodecs.contains(family) { return false }
        }
        return sawAudio
    }
}
