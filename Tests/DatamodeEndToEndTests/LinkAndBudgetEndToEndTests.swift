// End-to-end tests of SPEC §10 and §11 through the built binary: `datamode-proxy conditions` and
// `datamode-proxy budgets`, and budget usage that a SIGKILL cannot roll back by more than a second.
import DatamodeTestSupport
import Foundation
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite("Link conditions and budgets: end to end", .serialized)
struct LinkAndBudgetEndToEndTests {
    @Test("`datamode-proxy conditions [NAME | --reset]` shows, sets and clears the profile; an unknown one fails")
    func conditionsCommand() throws {
        try withAdminProxy(config: "mode: constrained\nconditions:\n  constrained: {profile: nlc-3g}\n") { proxy, admin throws in
            let address = "127.0.0.1:\(proxy.adminPort)"
            let show = try ProxyProcess.runCLI(["conditions", "--admin", address])
            #expect(show.status == 0, "\(show.stderr)")
            #expect(show.stdout.contains("\"profile\":\"nlc-3g\""), "\(show.stdout)")

            let set = try ProxyProcess.runCLI(["conditions", "geo-satellite", "--admin", address])
            #expect(set.status == 0, "\(set.stderr)")
            #expect(try admin.get("/conditions").object["profile"] as? String == "geo-satellite")
            #expect(try admin.get("/mode").object["profile"] as? String == "geo-satellite")
            #expect(try admin.get("/metrics").bodyText.contains("datamode_link_profile{profile=\"geo-satellite\",source=\"api\"} 1"))

            let unknown = try ProxyProcess.runCLI(["conditions", "carrier-pigeon", "--admin", address])
            #expect(unknown.status != 0)
            #expect((unknown.stdout + unknown.stderr).contains("400: no profile named \"carrier-pigeon\""), "\(unknown.stderr)")
            #expect(try admin.get("/conditions").object["profile"] as? String == "geo-satellite")

            let reset = try ProxyProcess.runCLI(["conditions", "--reset", "--admin", address])
            #expect(reset.status == 0, "\(reset.stderr)")
            #expect(try admin.get("/conditions").object["source"] as? String == "mode")
        }
    }

    @Test("`datamode-proxy budgets` lists usage; --reset NAME resets one; a SIGKILL loses at most a second of counting")
    func budgetsSurviveKill() throws {
        let origin = try RecordingOrigin { _ in .ok(String(repeating: "b", count: 100_000)) }
        defer { origin.stop() }
        let root = FileManager.default.temporaryDirectory.appendingPathComponent("datamode-budget-e2e-\(UUID().uuidString.prefix(8))").path
        try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: root) }
        let config = "budgets:\n  - {name: daily, bytes: 5GB, period: day, then: constrained}\n"
        var counted = 0
        try withAdminProxy(config: config, arguments: ["--state-dir", root + "/state"], directory: root) { proxy, admin throws in
            let client = try RawHTTPClient(port: proxy.port)
            for index in 0..<3 { #expect(try proxied(client, origin.url("/\(index)")).status == 200) }
            // The worker may count the last body's bytes just after the client has them (a loaded CI run read 204,602
            // here, two of three): wait until all three are counted, then take the settled value.
            func used() throws -> Int { try admin.get("/budgets").array?.first?["used"] as? Int ?? 0 }
            let settled = try AdminPolling.until(timeout: .seconds(5)) { try used() > 300_000 }
            #expect(settled)
            usleep(100_000)
            counted = try used()
            #expect(counted > 300_000)
            let listed = try ProxyProcess.runCLI(["budgets", "--admin", "127.0.0.1:\(proxy.adminPort)"])
            #expect(listed.status == 0, "\(listed.stderr)")
            #expect(listed.stdout.contains("\"used\":\(counted)"), "\(listed.stdout)")
            // More than a second later the usage is on disk: a SIGKILL now loses nothing of it.
            usleep(1_500_000)
            proxy.signal(SIGKILL)
            #expect(proxy.waitForExit(timeout: 10) == SIGKILL)
        }
        try withAdminProxy(config: config, arguments: ["--state-dir", root + "/state"], directory: root) { proxy, admin throws in
            #expect(try admin.get("/budgets").array?.first?["used"] as? Int == counted)
            let reset = try ProxyProcess.runCLI(["budgets", "--reset", "daily", "--admin", "127.0.0.1:\(proxy.adminPort)"])
            #expect(reset.status == 0, "\(reset.stderr)")
            #expect(try admin.get("/budgets").array?.first?["used"] as? Int == 0)
            let missing = try ProxyProcess.runCLI(["budgets", "--reset", "weekly", "--admin", "127.0.0.1:\(proxy.adminPort)"])
            #expect(missing.status != 0)
        }
    }
}
