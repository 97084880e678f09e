import DatamodeHTTP
import DatamodeTestSupport
import Foundation
import Testing

/// The README's "Watch a video in constrained mode", through the real binary and curl: the master playlist the
/// README writes is served, fetched through `run --mode constrained`, and must come back exactly as the README
/// shows it (head fields and body), and untouched in normal mode.
@Suite struct LowResWalkthroughTests {
    /// The section of the README under `heading`, up to the next `## `.
    static func section(_ heading: String) throws -> Substring {
        let readme = try String(contentsOfFile: ProxyProcess.packageRoot + "/README.md", encoding: .utf8)
        let start = try #require(readme.range(of: heading))
        let rest = readme[start.upperBound...]
        return rest[..<(rest.range(of: "\n## ")?.lowerBound ?? rest.endIndex)]
    }

    @Test func videoWalkthrough() throws {
        let text = try Self.section("## Watch a video in constrained mode")
        // The playlist of the heredoc, and the response the README shows after `curl … master.m3u8`.
        let heredoc = try #require(text.range(of: "<<'M3U8'\n"))
        let end = try #require(text.range(of: "\nM3U8\n", range: heredoc.upperBound..<text.endIndex))
        let master = String(text[heredoc.upperBound..<end.lowerBound]) + "\n"
        let shown = text[end.upperBound...].split(separator: "\n", omittingEmptySubsequences: false)
            .drop { !$0.hasPrefix("#   HTTP/1.1") }.prefix { $0.hasPrefix("#") }
            .map { $0.hasPrefix("#   ") ? String($0.dropFirst(4)) : String($0.dropFirst(1)) }
        let blank = try #require(shown.firstIndex(of: ""))
        let shownHead = Array(shown[1..<blank])
        let shownBody = shown[(blank + 1)...].joined(separator: "\n") + "\n"
        #expect(shownHead.contains("Data-Mode-Variant: hls-cap") && shownHead.contains("Content-Length: 694"))
        #expect(shownBody.hasPrefix("#EXTM3U\n") && shownBody.contains("v730k/index.m3u8") && !shownBody.contains("v2000k"))

        let origin = try RecordingOrigin { _ in
            .respond(status: 200, headers: [HTTPField(name: "Content-type", value: "application/vnd.apple.mpegurl")],
                     body: Array(master.utf8))
        }
        defer { origin.stop() }
        let proxy = try ProxyProcess(config: "mode: constrained\n")
        defer { proxy.stop() }
        let url = origin.url("/master.m3u8")
        let result = try ExternalCommand.run("/usr/bin/curl", ["-s", "-D", "-", "--max-time", "10", "-x",
                                                              "127.0.0.1:\(proxy.port)", url])
        let parts = result.stdout.components(separatedBy: "\r\n\r\n")
        let head = parts[0].components(separatedBy: "\r\n")
        #expect(head.first == "HTTP/1.1 200 OK")
        for field in shownHead where !field.hasPrefix("HTTP/") {
            #expect(head.contains(field), "README shows \(field); got \(head)")
        }
        #expect(parts.dropFirst().joined(separator: "\r\n\r\n") == shownBody)
        #expect(text.contains("1,233 bytes at the origin") && master.utf8.count == 1_233)

        // "In normal mode (datamode-proxy mode normal) the same request returns the origin's 1,233 bytes".
        #expect(try AdminAPIClient(port: proxy.adminPort).put("/mode", #"{"mode": "normal"}"#).status == 200)
        let normal = try ExternalCommand.run("/usr/bin/curl", ["-s", "--max-time", "10", "-x", "127.0.0.1:\(proxy.port)", url])
        #expect(normal.stdout == master)
    }

    /// 355149 as the README writes it: 355,149.
    static func grouped(_ n: Int) -> String {
        let digits = String(n)
        var out = ""
        for (i, digit) in digits.enumerated() {
            if i > 0 && (digits.count - i) % 3 == 0 { out += "," }
            out.append(digit)
        }
        return out
    }

    /// "Images in constrained mode": the README's own lines make the photo (bench/lib/pageweight.py's generator)
    /// and configure the proxy; curl through it must see what the README shows.
    @Test func imagesWalkthrough() throws {
        let text = try Self.section("## Images in constrained mode")
        let lines = try ReadmeSatelliteWalkthroughTests.readmeCommands(section: "## Images in constrained mode")
        let generate = try #require(lines.first { $0.hasPrefix("/usr/bin/python3 -c") })
        let scratch = try ScratchDirectory.make("readme-images")
        defer { ScratchDirectory.remove(scratch) }
        let made = try ExternalCommand.run("/bin/sh", ["-c", "cd '\(ProxyProcess.packageRoot)' && "
                                                             + generate.replacingOccurrences(of: "/tmp/photos", with: scratch)],
                                           timeout: 120)
        #expect(made.status == 0, "\(made.output)")
        let photo = try #require(FileManager.default.contents(atPath: scratch + "/img/photo-2048.jpg"))
        #expect(text.contains("a JPEG of \(Self.grouped(photo.count)) bytes"), "the photo the README describes: \(photo.count)")
        let heredoc = try #require(text.range(of: "<<'YAML'\n"))
        let end = try #require(text.range(of: "\nYAML\n", range: heredoc.upperBound..<text.endIndex))
        let origin = try RecordingOrigin { _ in
            .respond(status: 200, headers: [HTTPField(name: "Content-Type", value: "image/jpeg")], body: Array(photo))
        }
        defer { origin.stop() }
        let proxy = try ProxyProcess(config: String(text[heredoc.upperBound..<end.lowerBound]) + "\n", arguments: ["--mode", "constrained"])
        defer { proxy.stop() }
        let result = try ExternalCommand.run("/usr/bin/curl", ["-s", "-o", scratch + "/photo.webp", "-D", "-", "--max-time", "30",
                                                              "-x", "127.0.0.1:\(proxy.port)", "-H", "Accept: image/avif,image/webp,*/*",
                                                              origin.url("/photo-2048.jpg")])
        let head = result.stdout.components(separatedBy: "\r\n")
        #expect(head.first == "HTTP/1.1 200 OK", "\(result.stdout)")
        for field in ["Content-Type: image/webp", "Vary: Accept", "Data-Mode-Variant: transcoded"] {
            #expect(head.contains(field), "\(field) in \(head)")
        }
        let webp = try #require(FileManager.default.contents(atPath: scratch + "/photo.webp"))
        #expect(text.contains("Content-Length: \(webp.count)"), "the README's WebP size; got \(webp.count)")
        #expect(webp.count < photo.count / 10)
        // Without WebP in Accept: a JPEG, of the size the README shows.
        let jpeg = try ExternalCommand.run("/usr/bin/curl", ["-s", "-o", scratch + "/photo.jpg", "-w", "%{size_download}",
                                                            "--max-time", "30", "-x", "127.0.0.1:\(proxy.port)",
                                                            origin.url("/photo-2048.jpg")])
        let size = Int(jpeg.stdout) ?? 0
        #expect(text.contains("a 800×600 JPEG of \(Self.grouped(size)) bytes"), "the README's JPEG size; got \(size)")
    }
}
