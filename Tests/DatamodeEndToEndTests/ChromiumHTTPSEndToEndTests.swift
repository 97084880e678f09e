import DatamodeTestSupport
import Foundation
import Testing

/// SPEC §9 with a real browser: headless Chromium, which trusts the proxy's CA through its NSS database (as a user
/// would after `certutil -A`), loads an HTTPS page through the intercepting proxy. In `normal` mode the page's hero
/// image is the origin's (red); in `constrained` mode the proxy answers it with its registered low-res `https://`
/// variant (a small blue image, scaled up by the page to the same box) and refuses the page's video with
/// `constrained`. The screenshot's pixels say which image the browser drew; the access log and `/metrics` say what
/// the proxy did. The origin is `openssl s_server -WWW` with its own certificate, which the proxy trusts through
/// `SSL_CERT_FILE`; Chromium never sees it (it sees only the proxy's leaves).
@Suite(.serialized) struct ChromiumHTTPSEndToEndTests {
    static let heroColour = PNGImage.RGBA(220, 30, 30)
    static let lowResColour = PNGImage.RGBA(30, 60, 220)
    static let background = PNGImage.RGBA(255, 255, 255)
    /// The hero's box on the page (CSS pixels = screenshot pixels at scale factor 1).
    static let heroBox = (width: 320, height: 200)

    static let page = """
        <!doctype html>
        <html><head><meta charset="utf-8"><title>datamode-proxy HTTPS page</title>
        <style>html, body { margin: 0; background: #ffffff; } img, video { display: block; }</style></head>
        <body>
        <img id="hero" src="/img/hero.png" width="320" height="200" alt="hero">
        <video id="clip" src="/media/clip.mp4" width="320" height="120" preload="auto" muted></video>
        </body></html>
        """

    /// An origin serving the page, the hero (320×200 red), its low-res variant (32×20 blue) and the video.
    static func origin(_ directory: String) throws -> TLSFileServer {
        let origin = try TLSFileServer(directory: directory + "/origin")
        try origin.publish("index.html", Array(page.utf8))
        try origin.publish("img/hero.png", PNGImage(width: heroBox.width, height: heroBox.height, fill: heroColour).encoded())
        try origin.publish("img/hero-small.png", PNGImage(width: 32, height: 20, fill: lowResColour).encoded())
        try origin.publish("media/clip.mp4", [UInt8](repeating: 0x42, count: 256 * 1024))
        return origin
    }

    static func config(host: String, originPort: UInt16) -> String {
        """
        mode: normal
        tls:
          intercept: ["\(host)"]
        connect: {ports: [\(originPort)]}
        rules:
          - name: no-video-on-low-data
            match: {path: "*.mp4"}
            tags: {allow-constrained: false}
        variants:
          - id: hero-low-res
            match: "https://\(host):\(originPort)/img/hero.png"
            target: "https://\(host):\(originPort)/img/hero-small.png"
            when: constrained
        """
    }

    /// The access log lines for `path` (any scheme and authority) logged since line `from`.
    static func entries(_ proxy: ProxyProcess, path: String, from: Int) -> [[String: Any]] {
        proxy.accessLog.dropFirst(from).filter { ($0["url"] as? String)?.hasSuffix(path) == true }
    }

    static func describe(_ image: PNGImage, _ points: [(Int, Int)]) -> String {
        points.map { "(\($0.0), \($0.1)): \(image.pixel(x: $0.0, y: $0.1))" }.joined(separator: ", ")
    }

    /// An IP host (no SNI: the leaf is minted for the CONNECT host, with an IP subjectAltName) and a name (the
    /// leaf is minted for the SNI name Chromium sends).
    @Test(.timeLimit(.minutes(5)), arguments: ["127.0.0.1", "localhost"])
    func theHeroIsTheLowResVariantAndTheVideoIsRefusedInConstrainedMode(host: String) throws {
        let directory = try ScratchDirectory.make("datamode-chromium")
        defer { ScratchDirectory.remove(directory) }
        let browser = try HeadlessChromium(directory: directory + "/browser")
        let origin = try Self.origin(directory)
        defer { origin.stop() }
        let proxy = try ProxyProcess(config: Self.config(host: host, originPort: origin.port),
                                     environment: ["SSL_CERT_FILE": origin.certificatePath])
        defer { proxy.stop() }
        let admin = AdminAPIClient(port: proxy.adminPort)

        // The user trusts the proxy's CA, as the README says: GET /ca.pem, then certutil.
        let ca = try admin.get("/ca.pem")
        try #require(ca.status == 200, "GET /ca.pem: \(ca.status) \(ca.bodyText)")
        #expect(ca.bodyText.hasPrefix("-----BEGIN CERTIFICATE-----"))
        let caPath = directory + "/proxy-ca.pem"
        try ca.bodyText.write(toFile: caPath, atomically: true, encoding: .utf8)
        try browser.trustCertificateAuthority(pemPath: caPath, nickname: "datamode-proxy")

        let url = "https://\(host):\(origin.port)/index.html"
        let center = (Self.heroBox.width / 2, Self.heroBox.height / 2)
        let probes = [center, (20, 20), (Self.heroBox.width - 20, Self.heroBox.height - 20)]

        // normal: the origin's hero, the video forwarded.
        let normal = try browser.screenshot(url, proxyPort: proxy.port)
        for (x, y) in probes {
            #expect(normal.screenshot.pixel(x: x, y: y).isClose(to: Self.heroColour),
                    "normal mode: hero pixels \(Self.describe(normal.screenshot, probes))\n\(proxy.stdout)\n\(normal.output)")
        }
        #expect(normal.screenshot.pixel(x: normal.screenshot.width - 10, y: 10).isClose(to: Self.background))
        AdminPolling.until(timeout: .seconds(30)) { !Self.entries(proxy, path: "/media/clip.mp4", from: 0).isEmpty }
        let normalHero = Self.entries(proxy, path: "/img/hero.png", from: 0)
        #expect(!normalHero.isEmpty && normalHero.allSatisfy { $0["status"] as? Int == 200 && $0["variant"] is NSNull },
                "normal mode hero: \(normalHero)")
        let normalVideo = Self.entries(proxy, path: "/media/clip.mp4", from: 0)
        #expect(!normalVideo.isEmpty && normalVideo.allSatisfy { ($0["status"] as? Int).map { $0 == 200 || $0 == 206 } == true },
                "normal mode video: \(normalVideo)")
        let logged = proxy.accessLog.count

        // constrained: the low-res variant drawn in the hero's box, the video refused.
        let put = try admin.put("/mode", #"{"mode": "constrained"}"#)
        try #require(put.status == 200, "PUT /mode: \(put.status) \(put.bodyText)")
        let constrained = try browser.screenshot(url, proxyPort: proxy.port)
        for (x, y) in probes {
            #expect(constrained.screenshot.pixel(x: x, y: y).isClose(to: Self.lowResColour),
                    "constrained mode: hero pixels \(Self.describe(constrained.screenshot, probes))\n\(proxy.stdout)\n\(constrained.output)")
        }
        AdminPolling.until(timeout: .seconds(30)) { !Self.entries(proxy, path: "/media/clip.mp4", from: logged).isEmpty }
        let hero = Self.entries(proxy, path: "/img/hero.png", from: logged)
        #expect(!hero.isEmpty && hero.allSatisfy { $0["status"] as? Int == 200 && $0["variant"] as? String == "hero-low-res" },
                "constrained mode hero: \(hero)")
        let video = Self.entries(proxy, path: "/media/clip.mp4", from: logged)
        #expect(!video.isEmpty && video.allSatisfy {
            $0["status"] as? Int == 403 && $0["outcome"] as? String == "rejected" && $0["reason"] as? String == "constrained"
        }, "constrained mode video: \(video)")

        let metrics = try admin.scrape()
        #expect(metrics.counter("datamode_requests_total", ["outcome": "rejected", "reason": "constrained"]) >= 1)
        #expect(metrics.counter("datamode_requests_total", ["outcome": "rewritten", "reason": ""]) >= 1)
        #expect(metrics.counter("datamode_tls_intercepted_total") >= 2, "\(metrics.text)")
    }

    /// SPEC §17 with a real browser: a page of 30 images and a video over HTTP/2. Chromium offers `h2` and the proxy
    /// takes it, so the page loads over one multiplexed connection, as it would without the proxy; in constrained
    /// mode every image is its low-res variant (pixels) and the video is refused on its own stream while the images
    /// around it load.
    @Test(.timeLimit(.minutes(5)))
    func aPageOfThirtyImagesLoadsOverOneH2ConnectionWithVariants() throws {
        let host = "localhost"
        let directory = try ScratchDirectory.make("datamode-chromium-h2")
        defer { ScratchDirectory.remove(directory) }
        let browser = try HeadlessChromium(directory: directory + "/browser")
        let origin = try TLSFileServer(directory: directory + "/origin")
        defer { origin.stop() }
        let count = 30
        let images = (0..<count).map { "<img src=\"/img/p\($0).png\" width=\"40\" height=\"40\">" }.joined()
        let page = """
            <!doctype html><html><head><meta charset="utf-8"><title>thirty</title>
            <style>html, body { margin: 0; background: #ffffff; } img { display: block; float: left; }
            video { display: block; clear: both; }</style></head>
            <body><div style="width: 400px">\(images)</div>
            <video src="/media/clip.mp4" width="320" height="60" preload="auto" muted></video></body></html>
            """
        try origin.publish("index.html", Array(page.utf8))
        for i in 0..<count {
            try origin.publish("img/p\(i).png", PNGImage(width: 40, height: 40, fill: Self.heroColour).encoded())
            try origin.publish("small/p\(i).png", PNGImage(width: 4, height: 4, fill: Self.lowResColour).encoded())
        }
        try origin.publish("media/clip.mp4", [UInt8](repeating: 0x42, count: 256 * 1024))
        let config = """
            mode: constrained
            tls:
              intercept: ["\(host)"]
            connect: {ports: [\(origin.port)]}
            rules:
              - {name: no-video-on-low-data, match: {path: "*.mp4"}, tags: {allow-constrained: false}}
            variants:
              - {id: small-images, match: "https://\(host):\(origin.port)/img/*.png", target: "https://\(host):\(origin.port)/small/$1.png", when: constrained}
            """
        let proxy = try ProxyProcess(config: config, environment: ["SSL_CERT_FILE": origin.certificatePath])
        defer { proxy.stop() }
        let admin = AdminAPIClient(port: proxy.adminPort)
        let ca = try admin.get("/ca.pem")
        let caPath = directory + "/proxy-ca.pem"
        try ca.bodyText.write(toFile: caPath, atomically: true, encoding: .utf8)
        try browser.trustCertificateAuthority(pemPath: caPath, nickname: "datamode-proxy")

        let shot = try browser.screenshot("https://\(host):\(origin.port)/index.html", proxyPort: proxy.port)
        // Ten images per 400-pixel row: the centre of image i is at (40·(i mod 10) + 20, 40·(i div 10) + 20).
        let probes = [0, 9, 15, 29].map { (40 * ($0 % 10) + 20, 40 * ($0 / 10) + 20) }
        for (x, y) in probes {
            #expect(shot.screenshot.pixel(x: x, y: y).isClose(to: Self.lowResColour),
                    "image pixels \(Self.describe(shot.screenshot, probes))\n\(shot.output)")
        }
        AdminPolling.until(timeout: .seconds(30)) {
            !Self.entries(proxy, path: "/media/clip.mp4", from: 0).isEmpty
                && (0..<count).allSatisfy { !Self.entries(proxy, path: "/img/p\($0).png", from: 0).isEmpty }
        }
        let lines = proxy.accessLog
        let imageLines = lines.filter { ($0["url"] as? String)?.contains("/img/p") == true }
        #expect(imageLines.count >= count, "\(imageLines.count) image lines")
        #expect(imageLines.allSatisfy { $0["proto"] as? String == "h2" && $0["variant"] as? String == "small-images" },
                "\(imageLines)")
        let video = Self.entries(proxy, path: "/media/clip.mp4", from: 0)
        #expect(!video.isEmpty && video.allSatisfy { $0["status"] as? Int == 403 && $0["proto"] as? String == "h2" },
                "\(video)")
        // The page, its thirty images and the video share a connection: Chromium opens at most a second, speculative
        // one while the first handshake is under way (its socket pool does), never one per six requests as HTTP/1.1
        // makes it.
        let connects = lines.filter { $0["method"] as? String == "CONNECT" && ($0["url"] as? String)?.hasPrefix(host) == true }
        #expect(connects.count >= 1 && connects.count <= 2, "\(connects)")
        let metrics = try admin.scrape()
        #expect(metrics.counter("datamode_http2_streams_total", ["side": "client"]) >= Double(count + 2), "\(metrics.text)")
    }
}
