@testable import DatamodeMedia
import DatamodeTestSupport
import Testing

@Suite("DASH MPD cap")
struct DASHCapTests {
    func rewritten(_ text: String, cap: UInt64, sourceLocation: SourceLocation = #_sourceLocation) -> String? {
        guard case .rewritten(.dash, let body, _) = ManifestCap.rewrite(text.bytes, cap: cap) else {
            Issue.record("not rewritten: \(ManifestCap.rewrite(text.bytes, cap: cap))", sourceLocation: sourceLocation)
            return nil
        }
        return String(decoding: body, as: UTF8.self)
    }

    @Test("a multi-period MPD capped at 730k: each AdaptationSet capped on its own, whole lines removed")
    func multiPeriod() throws {
        let out = try #require(rewritten(SampleManifests.multiPeriodMPD, cap: 730_000))
        for kept in ["ad-360", "ad-a128", "v234", "v360", "v432", "a64", "a128", "sub-en"] {
            #expect(out.contains("id=\"\(kept)\""), "\(kept) kept")
        }
        for removed in ["ad-720", "v540", "v720", "v1080"] {
            #expect(!out.contains("id=\"\(removed)\""), "\(removed) removed")
        }
        // a384 (384k) is within 730k: kept. The expected text is the input without exactly the removed lines.
        let removedLines = SampleManifests.multiPeriodMPD.split(separator: "\n", omittingEmptySubsequences: false)
            .filter { line in ["ad-720", "v540", "v720", "v1080"].contains { line.contains("id=\"\($0)\"") } }
        #expect(removedLines.count == 4)
        let expected = SampleManifests.multiPeriodMPD.split(separator: "\n", omittingEmptySubsequences: false)
            .filter { !removedLines.contains($0) }.joined(separator: "\n")
        #expect(out == expected)
    }

    @Test("all above the cap: each set keeps its lowest; an element with children goes whole")
    func lowestStays() throws {
        let out = try #require(rewritten(SampleManifests.multiPeriodMPD, cap: 10_000))
        #expect(out.contains("id=\"ad-360\"") && !out.contains("id=\"ad-720\""))
        #expect(out.contains("id=\"v234\"") && !out.contains("id=\"v360\""))
        #expect(out.contains("id=\"a64\"") && !out.contains("id=\"a128\"") && !out.contains("id=\"a384\""))
        #expect(out.contains("id=\"ad-a128\"") && out.contains("AudioChannelConfiguration"))
        let text = """
            <MPD><Period><AdaptationSet mimeType="audio/mp4">
              <Representation id="lo" bandwidth="64000"/>
              <Representation id="hi" bandwidth="256000">
                <BaseURL>hi/</BaseURL>
              </Representation>
            </AdaptationSet></Period></MPD>
            """
        #expect(try #require(rewritten(text, cap: 100_000)) == """
            <MPD><Period><AdaptationSet mimeType="audio/mp4">
              <Representation id="lo" bandwidth="64000"/>
            </AdaptationSet></Period></MPD>
            """)
    }

    @Test("a kept Representation keeps the one it depends on")
    func dependencies() throws {
        let text = "<MPD><Period><AdaptationSet>\n<Representation id=\"base\" bandwidth=\"900000\"/>\n"
            + "<Representation id=\"enh\" bandwidth=\"500000\" dependencyId=\"base\"/>\n"
            + "<Representation id=\"big\" bandwidth=\"5000000\"/>\n</AdaptationSet></Period></MPD>"
        let out = try #require(rewritten(text, cap: 730_000))
        #expect(out.contains("\"base\"") && out.contains("\"enh\"") && !out.contains("\"big\""))
    }

    @Test("unchanged within the cap; not an MPD; sniffing")
    func unchangedAndSniff() {
        #expect(ManifestCap.rewrite(SampleManifests.multiPeriodMPD.bytes, cap: 8_000_000) == .unchanged(.dash))
        #expect(ManifestCap.rewrite("<?xml version=\"1.0\"?><rss></rss>".bytes, cap: 1) == .notAManifest)
        #expect(ManifestCap.sniff(Array(SampleManifests.multiPeriodMPD.bytes.prefix(20)), complete: false) == .needMore)
        #expect(ManifestCap.sniff(Array(SampleManifests.multiPeriodMPD.bytes.prefix(100)), complete: false) == .candidate(.dash))
        #expect(ManifestCap.sniff("<!DOCTYPE html><html>".bytes, complete: false) == .notAManifest)
        // Found by the fuzzer: a prefix that ends inside "<!--" is undecided, not "not a manifest".
        #expect(ManifestCap.sniff("<?xml version=\"1.0\"?>\n<!-".bytes, complete: false) == .needMore)
        #expect(ManifestCap.sniff("<".bytes, complete: false) == .needMore)
        #expect(ManifestCap.sniff("\u{FEFF}<mpd:MPD xmlns:mpd=\"x\">".bytes, complete: false) == .candidate(.dash))
    }

    @Test("malformed MPDs (and DTDs: no entity expansion) are refused whole", arguments: [
        "<MPD><Period><AdaptationSet><Representation bandwidth=\"1\"></AdaptationSet></Period></MPD>",  // mismatched
        "<MPD><Period><AdaptationSet><Representation id=\"x\"/></AdaptationSet></Period></MPD>",        // no bandwidth
        "<MPD><Period><AdaptationSet><Representation bandwidth=\"1e6\"/></AdaptationSet></Period></MPD>",
        "<MPD><Period><AdaptationSet><Representation bandwidth=1/></AdaptationSet></Period></MPD>",
        "<MPD><Period><AdaptationSet><Representation bandwidth=\"1\" bandwidth=\"2\"/></AdaptationSet></Period></MPD>",
        "<!DOCTYPE MPD [<!ENTITY a \"b\">]><MPD></MPD>",
        "<MPD></MPD><MPD></MPD>",
        "<MPD><Period>",
        "<MPD>a & b</MPD>",
        "<MPD></MPD> trailing",
        "<MPD><!-- a -- b --></MPD>",
        "<MPD a=\"<\"></MPD>",
    ])
    func malformed(_ text: String) {
        switch ManifestCap.rewrite(text.bytes, cap: 100) {
        case .malformed: return
        case .notAManifest where text.hasPrefix("<!DOCTYPE"): return  // not even looked at
        default: break
        }
        Issue.record("expected malformed: \(ManifestCap.rewrite(text.bytes, cap: 100))")
    }
}
