/// Capping streaming manifests to a bitrate (SPEC §13): HLS master playlists and DASH MPDs lose the streams above
/// the cap. Pure Swift on byte arrays: no I/O, no C, no Foundation, so the engine can run it on its event loop for
/// the bounded (≤ 1 MiB) manifests it buffers, and a fuzzer can hammer it.
///
/// The contract every function here keeps: the output is either the input exactly, or the input with whole
/// entries cut out and every other byte as it was (relative URIs keep working: the manifest's URL is unchanged).
/// Anything the strict parsers refuse is `.malformed` and is passed through by the caller, never half-rewritten.

/// Which manifest format a body is.
public enum ManifestKind: String, Sendable, Hashable {
    /// An HLS master (multivariant) playlist, RFC 8216 §4.3.4.
    case hls
    /// A DASH Media Presentation Description, ISO/IEC 23009-1.
    case dash

    /// The `Data-Mode-Variant` value and metrics label of a rewrite of this kind.
    public var variantName: String {
        switch self {
        case .hls: "hls-cap"
        case .dash: "dash-cap"
        }
    }
}

/// What `ManifestCap.rewrite` made of a body.
public enum ManifestRewriteResult: Equatable, Sendable {
    /// Not a master playlist or MPD (a media playlist, a segment, anything else): pass it through.
    case notAManifest
    /// It claims to be a manifest but does not parse strictly: pass it through unchanged.
    case malformed(String)
    /// A manifest whose every stream is within the cap (or kept as the lowest): nothing to change.
    case unchanged(ManifestKind)
    /// A manifest with `removed` entries cut out.
    case rewritten(ManifestKind, body: [UInt8], removed: Int)
}

/// An early verdict on the first bytes of a body, so that only manifests are buffered whole.
public enum ManifestSniff: Equatable, Sendable {
    /// Could be a master playlist or an MPD: keep buffering.
    case needMore
    /// Looks like one (buffer it whole, then `rewrite`).
    case candidate(ManifestKind)
    /// Certainly not a master playlist or MPD (a media playlist, a segment, HTML …): stream it.
    case notAManifest
}

public enum ManifestCap {
    /// The largest manifest the proxy buffers and rewrites (SPEC §13); larger ones pass untouched.
    public static let maximumSize = 1 << 20

    /// Rewrites `body` for `cap` bits per second: HLS or DASH by content (`#EXTM3U` first, or an `MPD` root element).
    public static func rewrite(_ body: [UInt8], cap: UInt64) -> ManifestRewriteResult {
        guard body.count <= maximumSize else { return .malformed("larger than \(maximumSize) bytes") }
        if HLSMasterPlaylist.startsLikePlaylist(body) { return HLSMasterPlaylist.rewrite(body, cap: cap) }
        if DASHManifest.startsLikeMPD(body) { return DASHManifest.rewrite(body, cap: cap) }
        return .notAManifest
    }

    /// Looks at the first bytes of a body (`complete`: they are the whole body). Decides as early as it can: a
    /// segment or HTML page is recognised from its first bytes, a media playlist from its first media tag.
    public static func sniff(_ prefix: [UInt8], complete: Bool) -> ManifestSniff {
        if let verdict = HLSMasterPlaylist.sniff(prefix, complete: complete) { return verdict }
        if let verdict = DASHManifest.sniff(prefix, complete: complete) { return verdict }
        return .notAManifest
    }
}

/// Within one group of alternatives (HLS variant streams, HLS I-frame streams, one DASH AdaptationSet): which
/// entries stay under `cap`. Entries above it go; if that leaves no video entry where there was one, the lowest
/// video entries stay (every entry at that lowest bandwidth: codec alternatives of one rung); a group of audio
/// only keeps its lowest likewise. Audio-only entries within the cap stay, but never as the only ones for video.
struct CapSelection {
    struct Entry {
        var bandwidth: UInt64
        var audioOnly: Bool
    }

    /// The indices of `entries` to keep, in order.
    static func kept(_ entries: [Entry], cap: UInt64) -> [Bool] {
        var keep = entries.map { $0.bandwidth <= cap }
        let hasVideo = entries.contains { !$0.audioOnly }
        let keptVideo = zip(entries, keep).contains { entry, kept in kept && !entry.audioOnly }
        if hasVideo && !keptVideo {
            let lowest = entries.filter { !$0.audioOnly }.map(\.bandwidth).min()!
            for (i, entry) in entries.enumerated() where !entry.audioOnly && entry.bandwidth == lowest { keep[i] = true }
        } else if !hasVideo && !entries.isEmpty && !keep.contains(true) {
            let lowest = entries.map(\.bandwidth).min()!
            for (i, entry) in entries.enumerated() where entry.bandwidth == lowest { keep[i] = true }
        }
        return keep
    }
}

/// Byte helpers shared by the two parsers.
extension Array where Element == UInt8 {
    func hasPrefix(_ prefix: [UInt8], at offset: Int = 0) -> Bool {
        guard offset >= 0, count - offset >= prefix.count else { return false }
        for i in 0..<prefix.count where self[offset + i] != prefix[i] { return false }
        return true
    }
}

/// `bytes` with the half-open `ranges` (sorted, disjoint) cut out.
func removing(_ ranges: [Range<Int>], from bytes: [UInt8]) -> [UInt8] {
    var out: [UInt8] = []
    out.reserveCapacity(bytes.count)
    var position = 0
    for range in ranges {
        out.append(contentsOf: bytes[position..<range.lowerBound])
        position = range.upperBound
    }
    out.append(contentsOf: bytes[position...])
    return out
}

/// Parses an unsigned decimal integer (digits only, at most 19 of them).
func decimal<C: Collection>(_ digits: C) -> UInt64? where C.Element == UInt8 {
    guard !digits.isEmpty, digits.count <= 19 else { return nil }
    var value: UInt64 = 0
    for byte in digits {
        guard byte >= UInt8(ascii: "0"), byte <= UInt8(ascii: "9") else { return nil }
        value = value * 10 + UInt64(byte - UInt8(ascii: "0"))
    }
    return value
}

/// What a response's `Content-Type` says about it being a manifest, before any body byte arrived.
public enum ManifestContentType: Equatable, Sendable {
    /// Declared as an HLS playlist or a DASH MPD: buffered (bounded) and looked at.
    case manifest
    /// A type manifests are commonly mis-served as (none, text/plain, octet-stream, XML): its first bytes decide.
    case generic
    /// Anything else (segments, images, HTML …): streamed untouched, at no extra cost.
    case other

    public static let manifestTypes: Set<String> = [
        "application/vnd.apple.mpegurl", "application/x-mpegurl", "audio/mpegurl", "audio/x-mpegurl",
        "application/dash+xml", "video/vnd.mpeg.dash.mpd",
    ]
    public static let genericTypes: Set<String> = [
        "text/plain", "application/octet-stream", "binary/octet-stream", "application/xml", "text/xml",
    ]

    /// Classifies a `Content-Type` value (`nil`: the response has none); parameters and case are ignored.
    /// Runs for every 200 GET response in a mode that caps manifests, so it reads the value's bytes in place: no
    /// split, no filtered or lowercased copy (those were a microsecond per response in the policy row of bench/run).
    public init(_ value: String?) {
        guard var value else { self = .generic; return }
        self = value.withUTF8 { Self.classify($0) }
    }

    /// The longest essence worth comparing: every known type is shorter.
    static let essenceLimit = 32
    static let manifestTypeBytes: [[UInt8]] = manifestTypes.map { Array($0.utf8) }
    static let genericTypeBytes: [[UInt8]] = genericTypes.map { Array($0.utf8) }

    /// The media type's essence (what precedes `;`, spaces and tabs dropped, lowercased) against the known lists.
    static func classify(_ bytes: UnsafeBufferPointer<UInt8>) -> ManifestContentType {
        withUnsafeTemporaryAllocation(of: UInt8.self, capacity: essenceLimit) { essence -> ManifestContentType in
            var count = 0
            for byte in bytes {
                if byte == UInt8(ascii: ";") { break }
                if byte == UInt8(ascii: " ") || byte == UInt8(ascii: "\t") { continue }
                guard count < essenceLimit else { return .other }
                essence[count] = byte >= UInt8(ascii: "A") && byte <= UInt8(ascii: "Z") ? byte | 0x20 : byte
                count += 1
            }
            let found = UnsafeBufferPointer(rebasing: essence[0..<count])
            if manifestTypeBytes.contains(where: { $0.elementsEqual(found) }) { return .manifest }
            if genericTypeBytes.contains(where: { $0.elementsEqual(found) }) { return .generic }
            return .other
        }
    }
}
