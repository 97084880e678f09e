// End-to-end tests of `datamode-proxy mode` and `datamode-proxy variants` (SPEC §8 CLI) against a running proxy,
// and with nothing listening.
import DatamodeTestSupport
import Foundation
import Testing

@Suite("AdminEndToEnd: CLI", .serialized)
struct AdminEndToEndCLITests {
    @Test("`datamode-proxy mode [NAME] [--reset]` shows, sets and resets the running proxy's mode")
    func modeCommand() throws {
        try withAdminProxy(config: "mode: expensive\n") { proxy, admin throws in
            let address = "127.0.0.1:\(proxy.adminPort)"
            let show = try ProxyProcess.runCLI(["mode", "--admin", address])
            #expect(show.status == 0, "\(show.stderr)")
            #expect(show.stdout.contains("expensive"), "mode printed: \(show.stdout)")

            let set = try ProxyProcess.runCLI(["mode", "constrained", "--admin", address])
            #expect(set.status == 0, "\(set.stderr)")
            #expect(set.stdout.contains("constrained"), "\(set.stdout)")
            #expect(try modeFacts(admin) == ModeFacts("constrained", true, false, "api"))

            let alias = try ProxyProcess.runCLI(["mode", "cellular", "--admin", address])
            #expect(alias.status == 0, "\(alias.stderr)")
            #expect(try modeFacts(admin) == ModeFacts("expensive", false, true, "api"))

            let reset = try ProxyProcess.runCLI(["mode", "--reset", "--admin", address])
            #expect(reset.status == 0, "\(reset.stderr)")
            #expect(try modeFacts(admin) == ModeFacts("expensive", false, true, "config"))

            let bad = try ProxyProcess.runCLI(["mode", "warp-speed", "--admin", address])
            #expect(bad.status != 0)
            #expect((bad.stderr + bad.stdout).contains("warp-speed"), "\(bad.stderr)")
            #expect(try modeFacts(admin) == ModeFacts("expensive", false, true, "config"))

            let both = try ProxyProcess.runCLI(["mode", "normal", "--reset", "--admin", address])
            #expect(both.status != 0)
            #expect(try modeFacts(admin) == ModeFacts("expensive", false, true, "config"))

            // The address can come from DATAMODE_ADMIN_LISTEN.
            let fromEnv = try ProxyProcess.runCLI(["mode", "normal"], environment: ["DATAMODE_ADMIN_LISTEN": address])
            #expect(fromEnv.status == 0, "\(fromEnv.stderr)")
            #expect(try modeFacts(admin) == ModeFacts("normal", false, false, "api"))
        }
    }

    @Test("`datamode-proxy variants list|add|remove` against a running proxy; errors of the API are non-zero exits")
    func variantsCommand() throws {
        let config = """
            variants:
              - id: cfg-hero
                match: "http://cdn.example/img/*.jpg"
                target: "http://cdn.example/img/$1@small.jpg"
            """
        try withAdminProxy(config: config) { proxy, admin throws in
            let address = "127.0.0.1:\(proxy.adminPort)"
            let add = try ProxyProcess.runCLI(["variants", "add", "cli-video", "--match", "http://cdn.example/v/*.mp4",
                                               "--target", "http://cdn.example/v/$1-240p.mp4", "--when", "constrained",
                                               "--admin", address])
            #expect(add.status == 0, "\(add.stderr)")
            let added = try #require(variant("cli-video", in: try admin.get("/variants")))
            #expect(added["match"] as? String == "http://cdn.example/v/*.mp4")
            #expect(added["target"] as? String == "http://cdn.example/v/$1-240p.mp4")
            #expect(added["when"] as? String == "constrained" && added["source"] as? String == "api", "\(added)")

            // The default variants directory: variants/ beside the config file (SPEC §5).
            try FileManager.default.createDirectory(atPath: proxy.directory + "/variants", withIntermediateDirectories: true)
            let poster = proxy.directory + "/variants/poster.jpg"
            try Data([0xFF, 0xD8]).write(to: URL(fileURLWithPath: poster))
            let addFile = try ProxyProcess.runCLI(["variants", "add", "cli-poster", "--match", "http://cdn.example/promo.mp4",
                                                   "--file", poster, "--content-type", "image/jpeg", "--admin", address])
            #expect(addFile.status == 0, "\(addFile.stderr)")
            #expect(variant("cli-poster", in: try admin.get("/variants"))?["file"] as? String == poster)

            let list = try ProxyProcess.runCLI(["variants", "list", "--admin", address])
            #expect(list.status == 0, "\(list.stderr)")
            #expect(list.stdout.contains("cfg-hero") && list.stdout.contains("cli-video") && list.stdout.contains("cli-poster"),
                    "list: \(list.stdout)")

            let conflict = try ProxyProcess.runCLI(["variants", "add", "cfg-hero", "--match", "http://cdn.example/*",
                                                    "--target", "http://evil.example/$1", "--admin", address])
            #expect(conflict.status != 0, "adding over a config variant succeeded: \(conflict.stdout)")
            #expect(conflict.stderr.contains("409"), "\(conflict.stderr)")

            let badCapture = try ProxyProcess.runCLI(["variants", "add", "bad", "--match", "http://cdn.example/*/*.jpg",
                                                      "--target", "http://cdn.example/$3.jpg", "--admin", address])
            #expect(badCapture.status != 0)
            #expect(badCapture.stderr.contains("400"), "\(badCapture.stderr)")
            let missingFile = try ProxyProcess.runCLI(["variants", "add", "bad", "--match", "http://cdn.example/x",
                                                       "--file", "/nonexistent/poster.jpg", "--admin", address])
            #expect(missingFile.status != 0)
            #expect(variant("bad", in: try admin.get("/variants")) == nil)

            let remove = try ProxyProcess.runCLI(["variants", "remove", "cli-video", "--admin", address])
            #expect(remove.status == 0, "\(remove.stderr)")
            #expect(variant("cli-video", in: try admin.get("/variants")) == nil)
            let again = try ProxyProcess.runCLI(["variants", "remove", "cli-video", "--admin", address])
            #expect(again.status != 0)
            #expect(again.stderr.contains("404"), "\(again.stderr)")
            let configRemove = try ProxyProcess.runCLI(["variants", "remove", "cfg-hero", "--admin", address])
            #expect(configRemove.status != 0)
            #expect(variant("cfg-hero", in: try admin.get("/variants")) != nil)
        }
    }

    @Test("The CLI sends the token from --token or DATAMODE_ADMIN_TOKEN; without it the 401 is a non-zero exit")
    func cliToken() throws {
        try withAdminProxy(config: "admin: {token: s3cret}\n", token: "s3cret") { proxy, admin throws in
            let address = "127.0.0.1:\(proxy.adminPort)"
            let without = try ProxyProcess.runCLI(["mode", "constrained", "--admin", address])
            #expect(without.status != 0)
            #expect(without.stderr.contains("401"), "\(without.stderr)")
            #expect(try modeFacts(admin)?.source == "default")

            let wrong = try ProxyProcess.runCLI(["variants", "list", "--admin", address, "--token", "nope"])
            #expect(wrong.status != 0)

            let flag = try ProxyProcess.runCLI(["mode", "constrained", "--admin", address, "--token", "s3cret"])
            #expect(flag.status == 0, "\(flag.stderr)")
            #expect(try modeFacts(admin) == ModeFacts("constrained", true, false, "api"))

            let env = try ProxyProcess.runCLI(["variants", "add", "tok", "--match", "http://a.example/*", "--target", "http://b.example/$1",
                                               "--admin", address], environment: ["DATAMODE_ADMIN_TOKEN": "s3cret"])
            #expect(env.status == 0, "\(env.stderr)")
            #expect(variant("tok", in: try admin.get("/variants")) != nil)
        }
    }

    @Test("With no proxy listening, every admin command fails with a message saying the proxy is not reachable",
          arguments: [["mode"], ["mode", "constrained"], ["mode", "--reset"], ["variants", "list"],
                      ["variants", "add", "x", "--match", "http://a.example/*", "--target", "http://b.example/$1"],
                      ["variants", "remove", "x"]])
    func nothingListening(command: [String]) throws {
        let port = try LoopbackPort.refusingConnections()
        let address = "127.0.0.1:\(port)"
        let result = try ProxyProcess.runCLI(command + ["--admin", address])
        #expect(result.status != 0, "\(command) with nothing on \(address) exited 0: \(result.stdout)")
        let message = result.stderr.lowercased()
        #expect(message.contains("reach") || message.contains("not running") || message.contains("is datamode-proxy running"),
                "\(command): \(result.stderr)")
        #expect(result.stderr.contains(address), "the message does not name \(address): \(result.stderr)")
    }

    @Test("A proxy that is not running is a runtime failure, not a usage error: no usage text, not exit 64 (EX_USAGE)")
    func notReachableIsNotUsageError() throws {
        let port = try LoopbackPort.refusingConnections()
        let result = try ProxyProcess.runCLI(["mode", "--admin", "127.0.0.1:\(port)"])
        #expect(result.status != 0)
        #expect(result.status != 64, "exit 64 = EX_USAGE, but the command line was right")
        #expect(!result.stderr.contains("Usage:"), "usage text printed for a runtime failure: \(result.stderr)")
    }

    @Test("With no --admin, the CLI uses the documented default 127.0.0.1:8878 and says so when nothing is there",
          .enabled(if: !AdminEndToEndCLITests.defaultAdminPortInUse(), "something listens on 127.0.0.1:8878 here"))
    func defaultAddress() throws {
        let result = try ProxyProcess.runCLI(["mode"])
        #expect(result.status != 0)
        #expect(result.stderr.contains("127.0.0.1:8878"), "\(result.stderr)")
    }

    static func defaultAdminPortInUse() -> Bool {
        (try? RawHTTPClient(port: 8878, timeout: .seconds(1))) != nil
    }
}
