// End-to-end tests of file variants' confinement (SPEC §5 `variants-dir`): the real binary, its admin API and its
// `check` command. Without an admin token (the default) any local process can declare a variant, so a `file` that
// could name any path would turn the proxy into a file server for /etc/passwd.
import DatamodeTestSupport
import Foundation
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite("Variant files end to end", .serialized)
struct VariantFilesEndToEndTests {
    @Test("PUT /variants/{id} with a file outside variants-dir, or not a regular file: 400 invalid-variant, nothing served")
    func apiRefusesFilesOutsideTheVariantsDirectory() throws {
        let origin = try RecordingOrigin { request in .ok("origin \(request.target)") }
        defer { origin.stop() }
        try withAdminProxy { proxy, admin throws in
            let variants = proxy.directory + "/variants"
            try FileManager.default.createDirectory(atPath: variants + "/sub", withIntermediateDirectories: true)
            try Data("poster".utf8).write(to: URL(fileURLWithPath: variants + "/poster.jpg"))
            try FileManager.default.createSymbolicLink(atPath: variants + "/escape.jpg", withDestinationPath: "/etc/passwd")
            #expect(mkfifo(variants + "/pipe", 0o600) == 0)

            let refused: [(file: String, what: String)] = [
                ("../../../../etc/passwd", "a relative path that climbs out"),
                ("/etc/passwd", "an absolute path elsewhere"),
                (proxy.configPath, "the config file, beside the variants directory"),
                ("variants/../datamode.yaml", "a path that leaves through .."),
                ("variants/escape.jpg", "a symbolic link that points out"),
                ("variants/pipe", "a FIFO"),
                ("variants/sub", "a directory"),
                ("/dev/zero", "a device"),
                ("variants/missing.jpg", "a missing file"),
            ]
            for (file, what) in refused {
                let reply = try admin.putVariant("trav", ["match": origin.url("/trav"), "file": file, "when": "always"])
                expectProblem(reply, 400, error: "invalid-variant", "\(what) (\(file))")
            }
            #expect(try admin.get("/variants").array?.isEmpty == true)
            #expect(!FileManager.default.fileExists(atPath: proxy.stateDirectory + "/variants.json"), "a refused variant was persisted")

            let client = try RawHTTPClient(port: proxy.port, timeout: .seconds(5))
            let response = try proxied(client, origin.url("/trav"))
            #expect(response.bodyText == "origin /trav")
            #expect(!response.bodyText.contains("root:"))

            // A file inside the directory is accepted and served.
            let accepted = try admin.putVariant("poster", ["match": origin.url("/promo.mp4"), "file": "variants/poster.jpg",
                                                           "when": "always"])
            #expect(accepted.status == 201, "\(accepted.bodyText)")
            #expect(try proxied(client, origin.url("/promo.mp4")).bodyText == "poster")
        }
    }

    @Test("An API variant's relative file is resolved against the config file's directory, not the working directory")
    func apiRelativeToTheConfigDirectory() throws {
        let origin = try RecordingOrigin { request in .ok("origin \(request.target)") }
        defer { origin.stop() }
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("datamode-vdir-\(UUID().uuidString.prefix(8))").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        // The proxy runs in `directory`; its config file is in `directory/etc`.
        try FileManager.default.createDirectory(atPath: directory + "/etc/variants", withIntermediateDirectories: true)
        try FileManager.default.createDirectory(atPath: directory + "/variants", withIntermediateDirectories: true)
        try Data("beside the config".utf8).write(to: URL(fileURLWithPath: directory + "/etc/variants/poster.jpg"))
        try Data("in the working directory".utf8).write(to: URL(fileURLWithPath: directory + "/variants/poster.jpg"))
        let config = directory + "/etc/datamode.yaml"
        try "mode: normal\n".write(toFile: config, atomically: true, encoding: .utf8)

        try withAdminProxy(arguments: ["--config", config], directory: directory) { proxy, admin throws in
            let reply = try admin.putVariant("poster", ["match": origin.url("/promo.mp4"), "file": "variants/poster.jpg",
                                                        "when": "always"])
            #expect(reply.status == 201, "\(reply.bodyText)")
            #expect(reply.object["file"] as? String == directory + "/etc/variants/poster.jpg", "\(reply.bodyText)")
            let client = try RawHTTPClient(port: proxy.port, timeout: .seconds(5))
            #expect(try proxied(client, origin.url("/promo.mp4")).bodyText == "beside the config")
        }
    }

    @Test("`check` refuses a config variant outside variants-dir, naming the key and line")
    func checkRefusesAConfigVariantOutside() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("datamode-vcheck-\(UUID().uuidString.prefix(8))").path
        try FileManager.default.createDirectory(atPath: directory + "/variants", withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let path = directory + "/datamode.yaml"
        try """
            variants:
              - id: trav
                match: "http://o.example/trav"
                file: "../../../../etc/passwd"
                when: always
            """.write(toFile: path, atomically: true, encoding: .utf8)
        let result = try ProxyProcess.runCLI(["check", "--config", path])
        #expect(result.status != 0, "accepted: \(result.stdout)")
        #expect(result.stderr.contains("\(path):4: variants[0].file:"), "\(result.stderr)")
        #expect(result.stderr.contains("outside the variants directory"), "\(result.stderr)")
    }

    @Test("SIGHUP with a variants-dir that leaves an API variant outside is refused; the running variants stay")
    func reloadThatStrandsAnAPIVariantIsRefused() throws {
        let origin = try RecordingOrigin { request in .ok("origin \(request.target)") }
        defer { origin.stop() }
        try withAdminProxy(config: "mode: normal\n") { proxy, admin throws in
            try FileManager.default.createDirectory(atPath: proxy.directory + "/variants", withIntermediateDirectories: true)
            try FileManager.default.createDirectory(atPath: proxy.directory + "/other", withIntermediateDirectories: true)
            try Data("poster".utf8).write(to: URL(fileURLWithPath: proxy.directory + "/variants/poster.jpg"))
            let put = try admin.putVariant("poster", ["match": origin.url("/promo.mp4"), "file": "variants/poster.jpg",
                                                      "when": "always"])
            #expect(put.status == 201, "\(put.bodyText)")

            try "mode: expensive\nvariants-dir: other\n".write(toFile: proxy.configPath, atomically: true, encoding: .utf8)
            proxy.signal(SIGHUP)
            let logged = AdminPolling.until(timeout: .seconds(5)) { proxy.stderr.contains("reload failed") }
            #expect(logged, "no reload failure logged: \(proxy.stderr)")
            #expect(proxy.stderr.contains("variants.json") || proxy.stderr.contains("poster"), "\(proxy.stderr)")
            #expect(try modeFacts(admin)?.mode == "normal", "the new file was applied")
            let client = try RawHTTPClient(port: proxy.port, timeout: .seconds(5))
            #expect(try proxied(client, origin.url("/promo.mp4")).bodyText == "poster")
        }
    }
}
