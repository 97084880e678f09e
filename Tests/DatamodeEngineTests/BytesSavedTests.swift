import DatamodePolicy
import DatamodeTestSupport
import Foundation
import Testing

/// `datamode_bytes_saved_total{kind="variant"|"rejected"}` (SPEC §13; issue 16 asks for every mechanism): what a
/// variant or a refusal saved, counted when the original's length is known, that is when the same worker relayed
/// the same URL whole before (the proxy never fetches an original it answers with a variant).
@Suite struct BytesSavedTests {
    static let constrained = DataMode(constrained: true, expensive: false)

    @Test func variantsAndRefusalsCountWhatTheOriginalWouldHaveCost() throws {
        let directory = try ScratchDirectory.make("datamode-saved")
        defer { ScratchDirectory.remove(directory) }
        try FileManager.default.createDirectory(atPath: directory + "/variants", withIntermediateDirectories: true)
        try Data(repeating: 0x50, count: 300).write(to: URL(fileURLWithPath: directory + "/variants/poster.jpg"))
        let origin = try RecordingOrigin { request in
            switch request.target {
            case "/hero.jpg": .ok(String(repeating: "H", count: 10_000))
            case "/hero-small.jpg": .ok(String(repeating: "s", count: 1_000))
            case "/promo.mp4": .ok(String(repeating: "P", count: 50_000))
            case "/video.mp4": .ok(String(repeating: "V", count: 80_000))
            default: .ok("?")
            }
        }
        defer { origin.stop() }
        let proxy = try ProxyHarness(yaml: """
            threads: 1
            rules:
              - {name: videos, match: {path: "/video.mp4"}, tags: {allow-constrained: false}}
            variants:
              - {id: hero-small, match: "\(origin.url("/hero.jpg"))", target: "\(origin.url("/hero-small.jpg"))", when: constrained}
              - {id: poster, match: "\(origin.url("/promo.mp4"))", file: variants/poster.jpg, when: constrained}
            """, baseDirectory: directory, threads: 1)
        defer { proxy.stop() }
        let client = try proxy.connect()
        func get(_ path: String) throws -> ParsedResponse {
            try client.send(RequestText.make("GET", origin.url(path)))
            return try client.readResponse()
        }
        func saved(_ kind: String) -> Int { proxy.server.metrics().bytesSaved[kind, default: 0] }

        // Never seen whole: nothing is known, nothing is counted.
        proxy.setMode(Self.constrained)
        #expect(try get("/hero.jpg").value(of: "Data-Mode-Variant") == "hero-small")
        #expect(try get("/video.mp4").status == 403)
        #expect(saved("variant") == 0 && saved("rejected") == 0)

        // Seen whole in normal mode, then answered by a variant or refused: the difference is counted.
        proxy.setMode(.normal)
        for path in ["/hero.jpg", "/promo.mp4", "/video.mp4"] { #expect(try get(path).status == 200) }
        proxy.setMode(Self.constrained)
        #expect(try get("/hero.jpg").body.count == 1_000)
        #expect(saved("variant") == 9_000, "a target variant: 10,000 - 1,000")
        #expect(try get("/promo.mp4").body.count == 300)
        #expect(saved("variant") == 9_000 + 49_700, "a file variant: 50,000 - 300")
        #expect(try get("/video.mp4").status == 403)
        #expect(saved("rejected") == 80_000)
        let scraped = try proxy.admin().get("/metrics").bodyText
        #expect(scraped.contains("datamode_bytes_saved_total{kind=\"variant\"} 58700"))
        #expect(scraped.contains("datamode_bytes_saved_total{kind=\"rejected\"} 80000"))
    }
}
