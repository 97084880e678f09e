import DatamodeTestSupport
import Foundation
import Testing

/// SPEC §20's admin page in a real browser (headless Chromium over the DevTools protocol) against the real
/// binary: it shows the proxy at work (mode, budget gauge, refusals, the relayed-bytes chart), a click on a mode
/// button changes the proxy's mode once the admin token is given, and a change made elsewhere reaches the page
/// through `/events`.
@Suite struct AdminPageEndToEndTests {
    static let token = "page-t0ken"

    @Test func thePageShowsTheProxyAtWorkAndChangesTheMode() throws {
        let body = String(repeating: "b", count: 300_000)
        let origin = try RecordingOrigin { _ in .ok(body) }
        defer { origin.stop() }
        let proxy = try ProxyProcess(config: """
            admin: {token: \(Self.token)}
            rules:
              - name: videos
                match: {path: "*.mp4"}
                tags: {allow-constrained: false}
            budgets:
              - {name: daily, bytes: 10MB, period: day, then: constrained}
            """)
        defer { proxy.stop() }
        let admin = AdminAPIClient(port: proxy.adminPort, token: Self.token)
        let curl = ["-s", "-o", "/dev/null", "-w", "%{http_code}", "-x", "http://127.0.0.1:\(proxy.port)"]
        // Some work to look at: a refusal in constrained mode, then bytes relayed in normal mode.
        #expect(try admin.put("/mode", #"{"mode": "constrained"}"#).status == 200)
        #expect(try ExternalCommand.run("/usr/bin/curl", curl + [origin.url("/intro.mp4")]).stdout == "403")
        #expect(try admin.delete("/mode").status == 200)
        #expect(try ExternalCommand.run("/usr/bin/curl", curl + [origin.url("/page")]).stdout == "200")

        let directory = try ScratchDirectory.make("admin-page")
        defer { ScratchDirectory.remove(directory) }
        let page = "http://127.0.0.1:\(proxy.adminPort)/"
        let text = { (id: String) in "document.getElementById('\(id)').textContent" }
        let values = try BrowserDriver.run([
            .navigate(page),
            // With admin.token set, the page's reads are refused until the token is given: it asks for it.
            .wait("document.getElementById('token-form').classList.contains('needed')"),
            .click("#token"),
            .insertText(Self.token),
            .click("#token-save"),
            .wait("\(text("live")) === 'live' && \(text("mode")) === 'normal'"
                  + " && document.querySelectorAll('#refusals tr').length === 1"
                  + " && \(text("relayed-legend")).includes('out 300')"),
            .value(text("mode-source"), name: "source"),
            .value("document.querySelector('#refusals tr').innerText", name: "refusal"),
            .value("[...document.querySelectorAll('#budgets [data-budget]')].map(b => b.dataset.budget)", name: "budgets"),
            .value("document.querySelector('#relayed-chart path[data-series=out]').getAttribute('d').split('L').length",
                   name: "outPoints"),
            .screenshot(path: directory + "/page.png"),
            // A person's click, with the token the tab keeps.
            .click("button[data-mode=constrained]"),
            .wait("\(text("mode")) === 'constrained' && document.querySelector('button.active').dataset.mode === 'constrained'"),
            .value("fetch('/mode', {headers: {Authorization: 'Bearer \(Self.token)'}}).then(r => r.json())", name: "afterClick"),
            // Another operator changes the mode: the page follows through /events.
            .http(method: "PUT", url: page + "mode", headers: ["Authorization": "Bearer \(Self.token)",
                                                                "Content-Type": "application/json"],
                  body: #"{"mode": "expensive"}"#),
            .wait("\(text("mode")) === 'expensive' && document.querySelector('button.active').dataset.mode === 'expensive'"),
            .value("sessionStorage.getItem('datamode-admin-token')", name: "kept"),
        ], directory: directory + "/browser")

        #expect((values["source"] as? String)?.hasPrefix("set by default") == true, "\(values)")
        let refusal = try #require(values["refusal"] as? String)
        #expect(refusal.contains(origin.url("/intro.mp4")) && refusal.contains("constrained") && refusal.contains("videos"),
                "\(refusal)")
        #expect(values["budgets"] as? [String] == ["daily"])
        #expect((values["outPoints"] as? Int ?? 0) >= 1)
        let afterClick = try #require(values["afterClick"] as? [String: Any])
        #expect(afterClick["mode"] as? String == "constrained")
        #expect(afterClick["source"] as? String == "api")
        #expect(values["kept"] as? String == Self.token)
        #expect(try admin.get("/mode").object["mode"] as? String == "expensive")

        // The screenshot: the dark header band, the active mode button's blue, the refusal's red.
        let image = try PNGImage(decoding: Array(try #require(FileManager.default.contents(atPath: directory + "/page.png"))))
        #expect(image.width == 1280 && image.height == 900)
        #expect(image.pixel(x: 4, y: 4).isClose(to: .init(0x1d, 0x24, 0x30), tolerance: 8), "\(image.pixel(x: 4, y: 4))")
        var blue = 0, red = 0
        for y in stride(from: 0, to: image.height, by: 2) {
            for x in stride(from: 0, to: image.width, by: 2) {
                let p = image.pixel(x: x, y: y)
                if p.isClose(to: .init(0x2f, 0x6f, 0xde), tolerance: 12) { blue += 1 }
                if p.isClose(to: .init(0xc8, 0x42, 0x3b), tolerance: 24) { red += 1 }
            }
        }
        #expect(blue > 50, "the active mode button and the chart: \(blue)")
        #expect(red > 5, "the refusal's error: \(red)")
        if let keep = ProcessInfo.processInfo.environment["DATAMODE_PAGE_SCREENSHOT"] {
            try? FileManager.default.removeItem(atPath: keep)
            try FileManager.default.copyItem(atPath: directory + "/page.png", toPath: keep)
        }
    }
}
