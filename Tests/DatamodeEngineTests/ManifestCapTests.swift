import DatamodeHTTP
import DatamodePolicy
import DatamodeTestSupport
import Foundation
import Testing

/// SPEC §13 through the real engine: master playlists and MPDs capped under a capped mode, everything else
/// (media playlists, segments, other modes, malformed or oversized manifests) relayed byte for byte.
@Suite struct ManifestCapTests {
    static let constrained = DataMode(constrained: true, expensive: false)
    static let hlsType = ("Content-Type", "application/vnd.apple.mpegurl")

    static func origin(_ body: String, headers: [(String, String)] = [hlsType],
                       framing: OriginBodyFraming = .contentLength) throws -> RecordingOrigin {
        try RecordingOrigin { _ in
            .respond(status: 200, headers: headers.map { HTTPField(name: $0.0, value: $0.1) }, body: Array(body.utf8),
                     framing: framing)
        }
    }

    static func get(_ proxy: ProxyHarness, _ url: String, method: String = "GET") throws -> ParsedResponse {
        let client = try proxy.connect()
        defer { client.close() }
        try client.send(RequestText.make(method, url))
        return try client.readResponse(method: method)
    }

    static func metrics(_ proxy: ProxyHarness) throws -> MetricsScrape {
        try MetricsScrape(try proxy.admin().get("/metrics").bodyText)
    }

    @Test("constrained: the Apple ladder is capped at 730k, marked hls-cap, no-store, with its own Content-Length",
          arguments: [OriginBodyFraming.contentLength, .chunked(chunkSize: 100), .closeDelimited])
    func hlsCapped(_ framing: OriginBodyFraming) throws {
        let origin = try Self.origin(SampleManifests.appleLadder, headers: [
            Self.hlsType, ("ETag", "\"ladder-v1\""), ("Cache-Control", "max-age=60"),
        ], framing: framing)
        defer { origin.stop() }
        let proxy = try ProxyHarness(mode: Self.constrained)
        defer { proxy.stop() }
        let response = try Self.get(proxy, origin.url("/video/master.m3u8"))
        #expect(response.status == 200)
        #expect(response.value(of: "Data-Mode-Variant") == "hls-cap")
        #expect(response.values(of: "Cache-Control") == ["no-store"])
        #expect(!response.contains("ETag"))
        #expect(response.value(of: "Content-Length") == String(response.body.count))
        #expect(!response.contains("Transfer-Encoding"))
        #expect(response.bodyText.contains("\nv3/prog_index.m3u8\n"))
        #expect(!response.bodyText.contains("v4/prog_index.m3u8"))
        #expect(!response.bodyText.contains("v9/prog_index.m3u8"))
        let saved = try Self.metrics(proxy).counter("datamode_bytes_saved_total", ["kind": "hls-cap"])
        #expect(saved == Double(SampleManifests.appleLadder.utf8.count - response.body.count))
    }

    @Test("a master playlist served as text/plain is recognised by its content; a DASH MPD too")
    func detectionByContent() throws {
        let hls = try Self.origin(SampleManifests.appleLadder, headers: [("Content-Type", "text/plain")])
        defer { hls.stop() }
        let dash = try Self.origin(SampleManifests.multiPeriodMPD, headers: [("Content-Type", "application/dash+xml")],
                                   framing: .chunked(chunkSize: 333))
        defer { dash.stop() }
        let octet = try Self.origin(SampleManifests.multiPeriodMPD, headers: [("Content-Type", "application/octet-stream")])
        defer { octet.stop() }
        let proxy = try ProxyHarness(mode: Self.constrained)
        defer { proxy.stop() }
        #expect(try Self.get(proxy, hls.url("/master.txt")).value(of: "Data-Mode-Variant") == "hls-cap")
        let mpd = try Self.get(proxy, dash.url("/show.mpd"))
        #expect(mpd.value(of: "Data-Mode-Variant") == "dash-cap")
        #expect(!mpd.bodyText.contains("id=\"v1080\"") && mpd.bodyText.contains("id=\"v432\""))
        #expect(try Self.get(proxy, octet.url("/show")).value(of: "Data-Mode-Variant") == "dash-cap")
        let metrics = try Self.metrics(proxy)
        #expect(metrics.counter("datamode_bytes_saved_total", ["kind": "dash-cap"]) > 0)
    }

    @Test("untouched: normal mode, HEAD, media playlists, segments, no-transform, gzip, non-200, within the cap")
    func untouched() throws {
        let ladder = Array(SampleManifests.appleLadder.utf8)
        let segment = [UInt8](repeating: 0x47, count: 200_000)
        let origin = try RecordingOrigin { request in
            let path = request.target.split(separator: "/").last.map(String.init) ?? ""
            func ok(_ body: [UInt8], _ headers: [(String, String)]) -> OriginResponse {
                .respond(status: 200, headers: headers.map { HTTPField(name: $0.0, value: $0.1) }, body: body)
            }
            switch path {
            case "media.m3u8": return ok(Array(SampleManifests.mediaPlaylist.utf8), [Self.hlsType])
            case "seg.ts": return ok(segment, [("Content-Type", "application/octet-stream")])
            case "nt.m3u8": return ok(ladder, [Self.hlsType, ("Cache-Control", "no-transform")])
            case "gz.m3u8": return ok(ladder, [Self.hlsType, ("Content-Encoding", "gzip")])
            case "404.m3u8":
                return .respond(status: 404, headers: [HTTPField(name: "Content-Type", value: "application/vnd.apple.mpegurl")],
                                body: ladder)
            default: return ok(ladder, [Self.hlsType])
            }
        }
        defer { origin.stop() }
        let proxy = try ProxyHarness(yaml: "media:\n  hls-max-bitrate: {constrained: 730k, expensive: 100M}\n",
                                     mode: Self.constrained)
        defer { proxy.stop() }
        for (path, body) in [("/media.m3u8", Array(SampleManifests.mediaPlaylist.utf8)), ("/seg.ts", segment),
                             ("/nt.m3u8", ladder), ("/gz.m3u8", ladder), ("/404.m3u8", ladder)] {
            let response = try Self.get(proxy, origin.url(path))
            #expect(response.body == body, "\(path)")
            #expect(!response.contains("Data-Mode-Variant"), "\(path)")
        }
        let head = try Self.get(proxy, origin.url("/master.m3u8"), method: "HEAD")
        #expect(!head.contains("Data-Mode-Variant"))
        proxy.setMode(DataMode(constrained: false, expensive: true))  // a cap above every stream
        #expect(try Self.get(proxy, origin.url("/master.m3u8")).body == ladder)
        proxy.setMode(.normal)
        let normal = try Self.get(proxy, origin.url("/master.m3u8"))
        #expect(normal.body == ladder && !normal.contains("Data-Mode-Variant"))
        #expect(try Self.metrics(proxy).counter("datamode_bytes_saved_total", ["kind": "hls-cap"]) == 0)
    }

    @Test("a session's mode decides (SPEC §12): capped for a constrained session while the global mode is normal")
    func sessionMode() throws {
        let origin = try Self.origin(SampleManifests.appleLadder)
        defer { origin.stop() }
        let proxy = try ProxyHarness(yaml: "sessions: {enabled: true}\n", mode: .normal)
        defer { proxy.stop() }
        #expect(try proxy.admin().put("/sessions/low", #"{"mode": "constrained"}"#).status == 201)
        let client = try proxy.connect()
        defer { client.close() }
        try client.send(RequestText.make("GET", origin.url("/m.m3u8"), headers: [("Data-Mode-Session", "low")]))
        #expect(try client.readResponse().value(of: "Data-Mode-Variant") == "hls-cap")
        try client.send(RequestText.make("GET", origin.url("/m.m3u8")))
        #expect(try client.readResponse().bodyText == SampleManifests.appleLadder)
    }

    @Test("a malformed master playlist passes unchanged and is counted")
    func malformedPassesThrough() throws {
        let broken = "#EXTM3U\n#EXT-X-STREAM-INF:BANDWIDTH=900000\nhigh.m3u8\n#EXT-X-STREAM-INF:BANDWIDTH=x\nlow.m3u8\n"
        let origin = try Self.origin(broken)
        defer { origin.stop() }
        let proxy = try ProxyHarness(mode: Self.constrained)
        defer { proxy.stop() }
        let response = try Self.get(proxy, origin.url("/master.m3u8"))
        #expect(response.bodyText == broken)
        #expect(!response.contains("Data-Mode-Variant"))
        #expect(try Self.metrics(proxy).counter("datamode_manifests_untouched_total", ["reason": "malformed"]) == 1)
    }

    @Test("a master playlist over 1 MiB passes untouched and is counted, whatever its framing",
          arguments: [OriginBodyFraming.contentLength, .chunked(chunkSize: 16_384), .closeDelimited])
    func oversizedPassesThrough(_ framing: OriginBodyFraming) throws {
        var text = SampleManifests.appleLadder
        while text.utf8.count <= (1 << 20) + 10 { text += "# padding comment to make the playlist large\n" }
        let origin = try Self.origin(text, framing: framing)
        defer { origin.stop() }
        let proxy = try ProxyHarness(mode: Self.constrained)
        defer { proxy.stop() }
        let response = try Self.get(proxy, origin.url("/big.m3u8"))
        #expect(response.bodyText == text)
        #expect(!response.contains("Data-Mode-Variant"))
        #expect(try Self.metrics(proxy).counter("datamode_manifests_untouched_total", ["reason": "too-large"]) == 1)
    }

    @Test("keep-alive: a capped manifest, then a segment, then another manifest on one connection")
    func keepAlive() throws {
        let origin = try RecordingOrigin { request in
            request.target.hasSuffix(".ts")
                ? .respond(status: 200, headers: [HTTPField(name: "Content-Type", value: "video/mp2t")],
                           body: [UInt8](repeating: 0x47, count: 3000), framing: .chunked(chunkSize: 1000))
                : .respond(status: 200, headers: [HTTPField(name: "Content-Type", value: "application/vnd.apple.mpegurl")],
                           body: Array(SampleManifests.appleLadder.utf8), framing: .chunked(chunkSize: 500))
        }
        defer { origin.stop() }
        let proxy = try ProxyHarness(mode: Self.constrained)
        defer { proxy.stop() }
        let client = try proxy.connect()
        defer { client.close() }
        for path in ["/a.m3u8", "/s.ts", "/b.m3u8"] {
            try client.send(RequestText.make("GET", origin.url(path)))
            let response = try client.readResponse()
            #expect(response.status == 200)
            if path.hasSuffix(".ts") {
                #expect(response.body.count == 3000 && !response.contains("Data-Mode-Variant"))
            } else {
                #expect(response.value(of: "Data-Mode-Variant") == "hls-cap")
            }
        }
    }

    @Test("an origin that breaks its chunked framing mid-manifest gets 502, nothing half-written")
    func brokenFraming() throws {
        let origin = try RecordingOrigin { _ in
            .raw("HTTP/1.1 200 OK\r\nContent-Type: application/vnd.apple.mpegurl\r\nTransfer-Encoding: chunked\r\n\r\n"
                 + "8\r\n#EXTM3U\n\r\nzz\r\n", thenClose: true)
        }
        defer { origin.stop() }
        let proxy = try ProxyHarness(mode: Self.constrained)
        defer { proxy.stop() }
        let response = try Self.get(proxy, origin.url("/master.m3u8"))
        #expect(response.status == 502)
        #expect(response.problem?.error == "upstream-protocol-error")
    }

    /// A held-back manifest is dechunked to be sniffed; a chunk size above SPEC §6's bound (here 2^64-1 and 2^63+5,
    /// more than an `Int` holds) must be refused by the relay before that, not reach the sniffer's arithmetic.
    @Test("an origin's chunk size above 0x0fffffffffffffff in a manifest gets 502", arguments: ["ffffffffffffffff", "8000000000000005"])
    func oversizedChunkInAManifest(_ size: String) throws {
        let origin = try RecordingOrigin { _ in
            .raw("HTTP/1.1 200 OK\r\nContent-Type: application/vnd.apple.mpegurl\r\nTransfer-Encoding: chunked\r\n\r\n"
                 + "8\r\n#EXTM3U\n\r\n\(size)\r\n#EXT-X-STREAM-INF:BANDWIDTH=1\nv1.m3u8\n", thenClose: false)
        }
        defer { origin.stop() }
        let proxy = try ProxyHarness(mode: Self.constrained)
        defer { proxy.stop() }
        let response = try Self.get(proxy, origin.url("/master.m3u8"))
        #expect(response.status == 502)
        #expect(response.problem?.error == "upstream-protocol-error")
    }
}
