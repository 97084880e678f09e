@testable import DatamodeMedia
import DatamodeTestSupport
import Testing

@Suite("HLS master playlist cap")
struct HLSCapTests {
    func rewritten(_ text: String, cap: UInt64, sourceLocation: SourceLocation = #_sourceLocation) -> String? {
        guard case .rewritten(.hls, let body, _) = ManifestCap.rewrite(text.bytes, cap: cap) else {
            Issue.record("not rewritten: \(ManifestCap.rewrite(text.bytes, cap: cap))", sourceLocation: sourceLocation)
            return nil
        }
        return String(decoding: body, as: UTF8.self)
    }

    @Test("the Apple ladder capped at 730k keeps 145k-730k, the audio-only variant, low I-frame streams and every group")
    func appleLadderAt730k() throws {
        let out = try #require(rewritten(SampleManifests.appleLadder, cap: 730_000))
        for kept in ["v1/prog_index.m3u8", "v2/prog_index.m3u8", "v3/prog_index.m3u8", "audio/he/prog_index.m3u8",
                     "v1/iframe_index.m3u8", "v4/iframe_index.m3u8"] {
            #expect(out.contains("\n\(kept)\n") || out.contains("URI=\"\(kept)\""), "\(kept) kept")
        }
        for removed in ["v4/prog_index.m3u8", "v5/", "v6/", "v7/", "v8/prog", "v9/", "v8/iframe_index.m3u8"] {
            #expect(!out.contains(removed), "\(removed) removed")
        }
        // Every EXT-X-MEDIA rendition stays, so the groups the kept streams name (aac-he, aac-lc, subs, cc) exist.
        #expect(out.split(separator: "\n").filter { $0.hasPrefix("#EXT-X-MEDIA:") }.count == 4)
        // Everything else byte for byte: the output is the input with whole lines removed, in order.
        let inputLines = SampleManifests.appleLadder.split(separator: "\n", omittingEmptySubsequences: false)
        var remaining = inputLines[...]
        for line in out.split(separator: "\n", omittingEmptySubsequences: false) {
            guard let index = remaining.firstIndex(of: line) else { Issue.record("line not from the input: \(line)"); break }
            remaining = remaining[(index + 1)...]
        }
    }

    @Test("all video streams above the cap: the lowest video stays, never the audio-only variant alone")
    func lowestVideoStays() throws {
        let out = try #require(rewritten(SampleManifests.appleLadder, cap: 100_000))
        #expect(out.contains("\nv1/prog_index.m3u8\n"))
        #expect(out.contains("\naudio/he/prog_index.m3u8\n"))  // 64k is within the cap
        #expect(!out.contains("v2/prog_index.m3u8"))
        // I-frame streams are their own group: the lowest (45k) is within 100k; the others go.
        #expect(out.contains("v1/iframe_index.m3u8") && !out.contains("v4/iframe_index.m3u8"))
        let tiny = try #require(rewritten(SampleManifests.appleLadder, cap: 1_000))
        #expect(tiny.contains("\nv1/prog_index.m3u8\n") && !tiny.contains("audio/he/prog_index.m3u8\n#"))
        #expect(!tiny.contains("\naudio/he/prog_index.m3u8\n"))
        #expect(tiny.contains("v1/iframe_index.m3u8") && !tiny.contains("v4/iframe"))
    }

    @Test("an audio-only ladder keeps its lowest rendition when all exceed")
    func audioOnlyLadder() throws {
        let text = "#EXTM3U\n#EXT-X-STREAM-INF:BANDWIDTH=96000,CODECS=\"mp4a.40.2\"\na96.m3u8\n"
            + "#EXT-X-STREAM-INF:BANDWIDTH=256000,CODECS=\"mp4a.40.2\"\na256.m3u8\n"
        let out = try #require(rewritten(text, cap: 64_000))
        #expect(out == "#EXTM3U\n#EXT-X-STREAM-INF:BANDWIDTH=96000,CODECS=\"mp4a.40.2\"\na96.m3u8\n")
    }

    @Test("a cap above every stream changes nothing; CRLF line ends are kept")
    func unchangedAndCRLF() throws {
        #expect(ManifestCap.rewrite(SampleManifests.appleLadder.bytes, cap: 10_000_000) == .unchanged(.hls))
        let crlf = "#EXTM3U\r\n#EXT-X-STREAM-INF:BANDWIDTH=200000\r\nlow.m3u8\r\n#EXT-X-STREAM-INF:BANDWIDTH=900000\r\nhigh.m3u8\r\n"
        #expect(try #require(rewritten(crlf, cap: 730_000)) == "#EXTM3U\r\n#EXT-X-STREAM-INF:BANDWIDTH=200000\r\nlow.m3u8\r\n")
    }

    @Test("media playlists and non-playlists are not manifests")
    func notManifests() {
        #expect(ManifestCap.rewrite(SampleManifests.mediaPlaylist.bytes, cap: 1) == .notAManifest)
        #expect(ManifestCap.rewrite("<html></html>".bytes, cap: 1) == .notAManifest)
        #expect(ManifestCap.rewrite([0x47, 0x40, 0x00, 0x10], cap: 1) == .notAManifest)
        #expect(ManifestCap.sniff(SampleManifests.mediaPlaylist.bytes, complete: false) == .notAManifest)
        #expect(ManifestCap.sniff(Array(SampleManifests.appleLadder.bytes.prefix(4)), complete: false) == .needMore)
        #expect(ManifestCap.sniff(Array(SampleManifests.appleLadder.bytes.prefix(300)), complete: false) == .needMore)
        #expect(ManifestCap.sniff(Array(SampleManifests.appleLadder.bytes.prefix(1200)), complete: false) == .candidate(.hls))
        #expect(ManifestCap.sniff([0x47, 0x40, 0x00], complete: false) == .notAManifest)
    }

    @Test("malformed master playlists are refused whole", arguments: [
        "#EXTM3U\n#EXT-X-STREAM-INF:BANDWIDTH=900000\nhigh.m3u8\n#EXT-X-STREAM-INF:BANDWIDTH=100000\n",  // no URI
        "#EXTM3U\n#EXT-X-STREAM-INF:RESOLUTION=1x1\nhigh.m3u8\n",                  // no BANDWIDTH
        "#EXTM3U\n#EXT-X-STREAM-INF:BANDWIDTH=9e5\nhigh.m3u8\n",                   // not an integer
        "#EXTM3U\n#EXT-X-STREAM-INF:BANDWIDTH=900000,BANDWIDTH=1\nhigh.m3u8\n",   // twice
        "#EXTM3U\n#EXT-X-STREAM-INF:BANDWIDTH=900000,CODECS=\"avc1\nhigh.m3u8\n", // unterminated quote
        "#EXTM3U\n#EXT-X-STREAM-INF:BANDWIDTH=900000,\nhigh.m3u8\n",               // trailing comma
        "#EXTM3U\n#EXT-X-STREAM-INF:bandwidth=900000\nhigh.m3u8\n",                // lower-case name
        "#EXTM3U\n#EXT-X-STREAM-INF:BANDWIDTH=900000\rhigh.m3u8\n",                // bare CR
        "#EXTM3U\n#EXT-X-STREAM-INF:BANDWIDTH=900000\nhigh\u{0}.m3u8\n",           // NUL
        "#EXTM3U\n#EXT-X-TARGETDURATION:6\n#EXT-X-STREAM-INF:BANDWIDTH=9\nx.m3u8\n", // media and master tags
        "#EXTM3U\nseg.ts\n#EXT-X-STREAM-INF:BANDWIDTH=900000\nx.m3u8\n",           // a URI outside a stream
        "#EXTM3U\n#EXT-X-I-FRAME-STREAM-INF:BANDWIDTH=900000\n",                   // I-frame without URI
        "#EXTM3U\n#EXT-X-STREAM-INF\nx.m3u8\n",                                     // no attribute list
    ])
    func malformed(_ text: String) {
        guard case .malformed = ManifestCap.rewrite(text.bytes, cap: 100) else {
            Issue.record("expected malformed: \(ManifestCap.rewrite(text.bytes, cap: 100))")
            return
        }
    }

    @Test("invalid UTF-8 is malformed")
    func invalidUTF8() {
        var bytes = "#EXTM3U\n#EXT-X-STREAM-INF:BANDWIDTH=900000\nx".bytes
        bytes += [0xFF, 0x0A]
        guard case .malformed = ManifestCap.rewrite(bytes, cap: 100) else { Issue.record("accepted"); return }
    }
}

extension String {
    var bytes: [UInt8] { Array(utf8) }
}
