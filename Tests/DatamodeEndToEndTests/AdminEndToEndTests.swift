// End-to-end tests of the admin plane (SPEC §2, §7; issue 5): the real `datamode-proxy` binary, started on
// port 0 for both listeners, driven over real sockets by the admin API client of DatamodeTestSupport, with a
// RecordingOrigin behind it where traffic matters. Crash safety, persistence and the CLI are in
// AdminStateEndToEndTests.swift and AdminCLIEndToEndTests.swift.
import DatamodeTestSupport
import Foundation
import Testing

#if canImport(Glibc)
import Glibc
#endif

// MARK: - Endpoints

@Suite("AdminEndToEnd: endpoints", .serialized)
struct AdminEndToEndTests {
    @Test("GET /healthz answers 200 without the token that every other endpoint requires; other methods 405")
    func healthz() throws {
        try withAdminProxy(config: "admin: {token: s3cret}\n") { proxy, admin throws in
            let health = try admin.get("/healthz")
            #expect(health.status == 200)
            #expect(try admin.request("HEAD", "/healthz").status == 200)
            expectProblem(try admin.request("PUT", "/healthz", body: "{}"), 405, "PUT /healthz")
            expectProblem(try admin.request("DELETE", "/healthz"), 405, "DELETE /healthz")
            // The exemption is /healthz only: the same client without a token is refused elsewhere.
            #expect(try admin.get("/mode").status == 401)
        }
    }

    @Test("GET /mode: defaults to normal, source default, since an RFC 3339 time; the admin port is not the proxy port")
    func modeDefaults() throws {
        try withAdminProxy { proxy, admin throws in
            #expect(proxy.adminPort != proxy.port)
            let reply = try admin.get("/mode")
            #expect(reply.status == 200)
            #expect(reply.mediaType == "application/json")
            #expect(ModeFacts(reply) == ModeFacts("normal", false, false, "default"), "\(reply.bodyText)")
            let since = try #require(rfc3339(reply.object["since"]), "since is not RFC 3339: \(reply.bodyText)")
            #expect(since <= Date().addingTimeInterval(60), "since lies in the future: \(reply.bodyText)")
            // The admin API is not served on the proxy port (STYLE: never admin pages on the proxy port).
            let client = try RawHTTPClient(port: proxy.port)
            try client.send("GET /mode HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            let onProxyPort = try client.readFinalResponse()
            #expect(onProxyPort.status == 400 && onProxyPort.problem?.error == "not-a-proxy-request",
                    "GET /mode on the proxy port: \(onProxyPort.status) \(onProxyPort.bodyText)")
        }
    }

    @Test("PUT /mode by name (aliases too) and by conditions returns and publishes the new state, source api")
    func modePutGood() throws {
        let cases: [(body: String, expected: ModeFacts)] = [
            (#"{"mode": "constrained"}"#, ModeFacts("constrained", true, false, "api")),
            (#"{"mode": "expensive"}"#, ModeFacts("expensive", false, true, "api")),
            (#"{"mode": "constrained-expensive"}"#, ModeFacts("constrained-expensive", true, true, "api")),
            (#"{"mode": "normal"}"#, ModeFacts("normal", false, false, "api")),
            (#"{"mode": "low-data"}"#, ModeFacts("constrained", true, false, "api")),
            (#"{"mode": "cellular"}"#, ModeFacts("expensive", false, true, "api")),
            (#"{"constrained": true, "expensive": true}"#, ModeFacts("constrained-expensive", true, true, "api")),
            (#"{"constrained": true, "expensive": false}"#, ModeFacts("constrained", true, false, "api")),
            (#"{"expensive": true}"#, ModeFacts("expensive", false, true, "api")),
            (#"{"constrained": false, "expensive": false}"#, ModeFacts("normal", false, false, "api")),
        ]
        try withAdminProxy { proxy, admin throws in
            for (body, expected) in cases {
                let reply = try admin.put("/mode", body)
                #expect(reply.status == 200, "PUT /mode \(body): \(reply.status) \(reply.bodyText)")
                #expect(ModeFacts(reply) == expected, "PUT /mode \(body) answered \(reply.bodyText)")
                #expect(rfc3339(reply.object["since"]) != nil, "PUT /mode \(body): since \(reply.bodyText)")
                let now = try admin.get("/mode")
                #expect(ModeFacts(now) == expected, "GET /mode after PUT \(body): \(now.bodyText)")
                #expect(now.object["since"] as? String == reply.object["since"] as? String)
                let scrape = try admin.scrape()
                #expect(scrape.value("datamode_mode", ["condition": "constrained"]) == (expected.constrained ? 1 : 0), "after \(body)")
                #expect(scrape.value("datamode_mode", ["condition": "expensive"]) == (expected.expensive ? 1 : 0), "after \(body)")
            }
        }
    }

    @Test("PUT /mode with bad input: 400 problem+json, and nothing changes (no state file, same mode)")
    func modePutBad() throws {
        let bodies = [
            "{", "", "[]", "\"constrained\"", "null", "{\"mode\": \"constrained\"", // not a JSON object
            #"{"mode": "constrained", "extra": 1}"#, #"{"Mode": "constrained"}"#, #"{"constrained": true, "fast": false}"#, // unknown keys
            #"{"mode": "slow"}"#, #"{"mode": ""}"#, #"{"mode": 1}"#, #"{"mode": null}"#, #"{"mode": ["constrained"]}"#, // bad names
            #"{"constrained": "true"}"#, #"{"constrained": 1}"#, #"{"expensive": 0}"#, #"{"constrained": null}"#,
            #"{"constrained": true, "expensive": "no"}"#, // non-boolean flags
            #"{"mode": "normal", "constrained": true}"#, "{}", // both forms, neither
        ]
        try withAdminProxy(config: "mode: expensive\n") { proxy, admin throws in
            let before = try admin.get("/mode")
            for body in bodies {
                expectProblem(try admin.put("/mode", body), 400, "PUT /mode \(body.debugDescription)")
            }
            let after = try admin.get("/mode")
            #expect(ModeFacts(after) == ModeFacts("expensive", false, true, "config"), "\(after.bodyText)")
            #expect(after.bodyText == before.bodyText)
            #expect(!FileManager.default.fileExists(atPath: proxy.stateDirectory + "/mode.json"),
                    "a refused PUT wrote mode.json")
        }
    }

    @Test("Wrong methods answer 405 with Allow and change nothing")
    func wrongMethods() throws {
        let cases: [(method: String, path: String, body: String?)] = [
            ("POST", "/mode", #"{"mode": "constrained"}"#),
            ("PATCH", "/mode", #"{"mode": "constrained"}"#),
            ("POST", "/variants", #"{"match": "http://a.example/*", "target": "http://b.example/$1"}"#),
            ("PUT", "/variants", #"{"match": "http://a.example/*", "target": "http://b.example/$1"}"#),
            ("DELETE", "/variants", nil),
            ("POST", "/variants/v1", #"{"match": "http://a.example/*", "target": "http://b.example/$1"}"#),
            ("PATCH", "/variants/v1", #"{"match": "http://a.example/*", "target": "http://b.example/$1"}"#),
            ("POST", "/metrics", "{}"),
            ("PUT", "/metrics", "{}"),
            ("DELETE", "/metrics", nil),
            ("POST", "/healthz", "{}"),
        ]
        try withAdminProxy { proxy, admin throws in
            for (method, path, body) in cases {
                let reply = try admin.request(method, path, body: body)
                expectProblem(reply, 405, "\(method) \(path)")
                let allow = reply.value(of: "Allow") ?? ""
                #expect(!allow.isEmpty && !allow.contains(method), "\(method) \(path): Allow \(allow.debugDescription)")
            }
            #expect(try modeFacts(admin) == ModeFacts("normal", false, false, "default"))
            #expect(try admin.get("/variants").array?.isEmpty == true)
            #expect(StateFileSnapshot(directory: proxy.stateDirectory).files.isEmpty)
        }
    }

    @Test("A method the admin API knows but a resource does not support (TRACE) is 405, not another status")
    func traceIs405() throws {
        try withAdminProxy { _, admin throws in
            let reply = try admin.request("TRACE", "/mode")
            #expect(reply.status == 405, "TRACE /mode answered \(reply.status) \(reply.bodyText)")
        }
    }

    @Test("A request larger than the admin API takes is a 413 problem+json (length or chunked), never evhttp's HTML page")
    func oversizedRequests() throws {
        try withAdminProxy { proxy, admin throws in
            let body = proxy.directory + "/body.json"
            // 10 MB as the review sent it (cut while it comes), and exactly the limit (read whole, then refused: the
            // head makes the request larger than the limit), each with a length and chunked.
            for size in [10_000_000, 1 << 20] {
                try Data(repeating: UInt8(ascii: "a"), count: size).write(to: URL(fileURLWithPath: body))
                for framing in [[String](), ["-H", "Transfer-Encoding: chunked"]] {
                    let what = "\(size) bytes" + (framing.isEmpty ? "" : ", chunked")
                    let result = try ExternalCommand.run("/usr/bin/curl", [
                        "-sS", "-X", "PUT", "--data-binary", "@" + body, "-o", proxy.directory + "/problem.json",
                        "-w", "%{http_code} %{content_type}", "http://127.0.0.1:\(proxy.adminPort)/mode",
                    ] + framing, timeout: 60)
                    #expect(result.stdout == "413 application/problem+json", "\(what): \(result.output)")
                    let problem = (try? Data(contentsOf: URL(fileURLWithPath: proxy.directory + "/problem.json")))
                        .flatMap { try? JSONSerialization.jsonObject(with: $0) as? [String: Any] } ?? [:]
                    #expect(problem["error"] as? String == "request-too-large" && problem["status"] as? Int == 413
                            && (problem["detail"] as? String ?? "").contains("1048576"), "\(what): \(problem)")
                }
            }
            // Just under the limit: served, and the refusals changed nothing.
            #expect(try modeFacts(admin) == ModeFacts("normal", false, false, "default"))
            let padded = #"{"mode": "constrained"}"# + String(repeating: " ", count: 1_000_000)
            #expect(try admin.put("/mode", padded).status == 200)
            #expect(try modeFacts(admin) == ModeFacts("constrained", true, false, "api"))
        }
    }

    @Test("Requests pipelined ahead of one too large are answered, each by its own size; then the 413, and the close")
    func oversizedRequestBehindPipelinedOnes() throws {
        try withAdminProxy { proxy, _ throws in
            let client = try RawHTTPClient(port: proxy.adminPort, timeout: .seconds(20))
            defer { client.close() }
            // Each request is counted from where the one before it ended: three of 600 KB (1.8 MB together, each
            // under the limit), then 1.2 MB of chunks, sent while the answers are read.
            let padded = #"{"mode": "constrained"}"# + String(repeating: " ", count: 600_000)
            var bytes = Array(String(repeating: "PUT /mode HTTP/1.1\r\nHost: admin\r\nContent-Length: \(padded.utf8.count)\r\n\r\n"
                                     + padded, count: 3).utf8)
            bytes += Array("PUT /mode HTTP/1.1\r\nHost: admin\r\nTransfer-Encoding: chunked\r\n\r\n".utf8)
            let chunk = Array("1000\r\n".utf8) + [UInt8](repeating: UInt8(ascii: "a"), count: 0x1000) + Array("\r\n".utf8)
            for _ in 0..<300 { bytes += chunk }
            let sent = client.sendInBackground(bytes)
            for index in 0..<3 {
                let mode = try client.readResponse()
                #expect(mode.status == 200, "request \(index): \(mode.headText)\(mode.bodyText)")
            }
            let refused = try client.readResponse()
            #expect(refused.status == 413 && refused.value(of: "Content-Type") == "application/problem+json", "\(refused.headText)")
            #expect(refused.problem?.error == "request-too-large", "\(refused.bodyText)")
            try? sent()
            #expect(client.isClosedByPeer(), "a refused request's connection closes")
        }
    }

    @Test("A refused client that keeps sending is cut off after 16 MiB more, having had its 413")
    func refusedClientThatNeverStops() throws {
        try withAdminProxy { proxy, _ throws in
            let client = try RawHTTPClient(port: proxy.adminPort, timeout: .seconds(20))
            defer { client.close() }
            let body = [UInt8](repeating: UInt8(ascii: "a"), count: 40 << 20)
            let sent = client.sendInBackground(Array("PUT /mode HTTP/1.1\r\nHost: admin\r\nContent-Length: \(body.count)\r\n\r\n".utf8)
                                               + body)
            let refused = try client.readResponse()
            #expect(refused.status == 413 && refused.problem?.error == "request-too-large", "\(refused.headText)")
            #expect(throws: (any Error).self, "40 MiB went out whole: the proxy read them all") { try sent() }
        }
    }

    @Test("Unknown paths answer 404 problem+json")
    func unknownPaths() throws {
        try withAdminProxy { _, admin throws in
            for path in ["/index.html", "//", "/nope", "/mode/extra", "/variant", "/metrics/x", "/healthz/x", "/MODE"] {
                expectProblem(try admin.get(path), 404, "GET \(path)")
            }
            expectProblem(try admin.put("/modes", #"{"mode": "constrained"}"#), 404, "PUT /modes")
            #expect(try modeFacts(admin) == ModeFacts("normal", false, false, "default"))
        }
    }

    @Test("Variants: list config variants; PUT creates (201) and replaces (200); DELETE; config ids are read-only (409)")
    func variantsLifecycle() throws {
        let config = """
            variants:
              - id: cfg-hero
                match: "http://cdn.example/img/*.jpg"
                target: "http://cdn.example/img/$1@small.jpg"
            """
        try withAdminProxy(config: config) { proxy, admin throws in
            // The default variants directory: variants/ beside the config file (SPEC §5).
            try FileManager.default.createDirectory(atPath: proxy.directory + "/variants", withIntermediateDirectories: true)
            let poster = proxy.directory + "/variants/poster.jpg"
            try Data([0xFF, 0xD8, 0xFF, 0xD9]).write(to: URL(fileURLWithPath: poster))

            let initial = try admin.get("/variants")
            #expect(initial.status == 200 && initial.mediaType == "application/json")
            let configVariant = try #require(variant("cfg-hero", in: initial), "GET /variants: \(initial.bodyText)")
            #expect(configVariant["source"] as? String == "config")
            #expect(configVariant["match"] as? String == "http://cdn.example/img/*.jpg")
            #expect(configVariant["target"] as? String == "http://cdn.example/img/$1@small.jpg")
            #expect(configVariant["when"] as? String == "disallowed")
            #expect(initial.array?.count == 1)

            let created = try admin.putVariant("api-video", ["match": "http://cdn.example/v/*.mp4",
                                                             "target": "http://cdn.example/v/$1-240p.mp4", "when": "constrained"])
            #expect(created.status == 201, "\(created.bodyText)")
            #expect(created.object["id"] as? String == "api-video" && created.object["source"] as? String == "api", "\(created.bodyText)")

            let replaced = try admin.putVariant("api-video", ["match": "http://cdn.example/v/*.mp4",
                                                              "target": "http://cdn.example/v/$1-144p.mp4"])
            #expect(replaced.status == 200, "replacing: \(replaced.status) \(replaced.bodyText)")

            let file = try admin.putVariant("api-poster", ["match": "http://cdn.example/promo.mp4", "file": poster,
                                                           "content-type": "image/jpeg"])
            #expect(file.status == 201, "\(file.bodyText)")
            let redirect = try admin.putVariant("api-redirect", ["match": "http://old.example/*", "target": "http://new.example/$1",
                                                                 "action": "redirect", "when": "always"])
            #expect(redirect.status == 201, "\(redirect.bodyText)")

            let listed = try admin.get("/variants")
            let ids = listed.array?.compactMap { $0["id"] as? String } ?? []
            #expect(ids == ["cfg-hero", "api-video", "api-poster", "api-redirect"], "order: config first, then API in order: \(ids)")
            let video = try #require(variant("api-video", in: listed))
            #expect(video["target"] as? String == "http://cdn.example/v/$1-144p.mp4", "the replacement is listed: \(video)")
            #expect(video["when"] as? String == "disallowed", "a replacement is whole, not merged: \(video)")
            #expect(video["source"] as? String == "api")
            let posterVariant = try #require(variant("api-poster", in: listed))
            #expect(posterVariant["file"] as? String == poster && posterVariant["content-type"] as? String == "image/jpeg", "\(posterVariant)")
            #expect(variant("api-redirect", in: listed)?["action"] as? String == "redirect")

            // Config variants are read-only here.
            expectProblem(try admin.putVariant("cfg-hero", ["match": "http://cdn.example/img/*.jpg", "target": "http://evil.example/$1"]),
                          409, "PUT of a config variant id")
            expectProblem(try admin.delete("/variants/cfg-hero"), 409, "DELETE of a config variant id")
            let still = try #require(variant("cfg-hero", in: try admin.get("/variants")))
            #expect(still["target"] as? String == "http://cdn.example/img/$1@small.jpg" && still["source"] as? String == "config")

            let deleted = try admin.delete("/variants/api-video")
            #expect(deleted.status == 200 || deleted.status == 204, "\(deleted.status) \(deleted.bodyText)")
            #expect(variant("api-video", in: try admin.get("/variants")) == nil)
            expectProblem(try admin.delete("/variants/api-video"), 404, "DELETE of a deleted id")
            expectProblem(try admin.delete("/variants/never-was"), 404, "DELETE of an unknown id")
            #expect(try admin.get("/variants").array?.count == 3)
        }
    }

    @Test("PUT /variants/{id} with bad input: 400 problem+json, nothing registered, nothing written")
    func variantsPutBad() throws {
        let good: [String: Any] = ["match": "http://cdn.example/img/*.jpg", "target": "http://cdn.example/img/$1@small.jpg"]
        func with(_ change: [String: Any?]) -> String {
            var object = good
            for (key, value) in change { object[key] = value }
            return jsonText(object)
        }
        let cases: [(id: String, body: String, what: String)] = [
            ("bad", "{", "bad JSON"),
            ("bad", "", "empty body"),
            ("bad", "[]", "an array"),
            ("bad", #"{"match": "http://cdn.example/*", "target": "http://x.example/$1""#, "truncated JSON"),
            ("bad", with(["colour": "red"]), "unknown key"),
            ("bad", with(["match": nil]), "no match"),
            ("bad", jsonText(["match": "http://cdn.example/*.jpg"]), "neither target nor file"),
            ("bad", with(["file": "/etc/hostname"]), "both target and file"),
            ("bad", jsonText(["match": "http://cdn.example/*/*.jpg", "target": "http://cdn.example/$3.jpg"]), "$3 with two captures"),
            ("bad", jsonText(["match": "http://cdn.example/promo.mp4", "file": "/nonexistent/datamode/poster.jpg"]), "missing file"),
            ("bad", jsonText(["match": "http://cdn.example/promo.mp4", "file": "missing-relative.jpg"]), "missing relative file"),
            ("bad", with(["when": "sometimes"]), "bad when"),
            ("bad", with(["action": "teleport"]), "bad action"),
            ("bad", with(["match": 5]), "match not a string"),
            ("bad", with(["target": true]), "target not a string"),
            ("bad", with(["id": "other"]), "body id differs from the path"),
            ("bad", with(["source": "config"]), "claims to be a config variant"),
            ("bad%20id", jsonText(good), "id with a space"),
            ("bad!id", jsonText(good), "id with a '!'"),
        ]
        try withAdminProxy { proxy, admin throws in
            for (id, body, what) in cases {
                let reply = try admin.put("/variants/\(id)", body)
                expectProblem(reply, 400, what)
            }
            let listed = try admin.get("/variants")
            #expect(listed.array?.isEmpty == true, "bad PUTs registered something: \(listed.bodyText)")
            #expect(StateFileSnapshot(directory: proxy.stateDirectory).files.isEmpty, "bad PUTs wrote state")
            // The same id with a good body works afterwards: the refusals left nothing half-done.
            #expect(try admin.put("/variants/bad", jsonText(good)).status == 201)
        }
    }

    /// An id that percent-decodes to bytes outside the allowed characters, UTF-8 or not, is refused for what it is:
    /// `caf%E9` (Latin-1, not UTF-8) used to be reported as an empty id, and `caf%C3%A9` came back garbled. The
    /// problem names the allowed characters and quotes the id as it came, percent-encoded.
    @Test("PUT /variants/{id} with an id outside [A-Za-z0-9._-]: 400 that quotes the id as received")
    func variantsPutIDOutsideTheAllowedCharacters() throws {
        let good: [String: Any] = ["match": "http://cdn.example/img/*.jpg", "target": "http://cdn.example/img/$1@small.jpg"]
        try withAdminProxy { proxy, admin throws in
            for id in ["caf%E9", "caf%C3%A9", "caf%c3%a9", "a%00b", "a%2Fb", "%FF%FE"] {
                let reply = try admin.put("/variants/\(id)", jsonText(good))
                expectProblem(reply, 400, error: "invalid-variant", id)
                let detail = reply.object["detail"] as? String ?? ""
                #expect(detail.contains("\"\(id)\""), "\(id): the id as received: \(reply.bodyText)")
                #expect(detail.contains("letters, digits, '.', '_' and '-'"), "\(id): \(reply.bodyText)")
                #expect(!detail.contains("empty"), "\(id): \(reply.bodyText)")
            }
            expectProblem(try admin.get("/variants/caf%E9"), 404, error: "not-found", "GET of such an id")
            #expect(try admin.get("/variants").array?.isEmpty == true)
            #expect(StateFileSnapshot(directory: proxy.stateDirectory).files.isEmpty, "refused PUTs wrote state")
            // A percent-encoded id of the allowed characters is that id.
            #expect(try admin.put("/variants/caf%2De", jsonText(good)).status == 201)
            #expect(try admin.get("/variants/caf-e").object["id"] as? String == "caf-e")
        }
    }

    /// A deferred upload's id that is not one (not UTF-8 once decoded, or no such upload) is named in the 404 as it
    /// came: `/deferred/%FF` used to answer "no deferred upload " with nothing after it.
    @Test("GET and DELETE /deferred/{id} of an unknown or undecodable id: 404 that quotes the id as received")
    func deferredUnknownIDIsQuotedAsReceived() throws {
        try withAdminProxy { _, admin throws in
            for id in ["%FF", "caf%C3%A9", "no-such-upload"] {
                for reply in [try admin.get("/deferred/\(id)"), try admin.delete("/deferred/\(id)")] {
                    expectProblem(reply, 404, error: "not-found", id)
                    #expect(reply.object["detail"] as? String == "no deferred upload \"\(id)\"", "\(id): \(reply.bodyText)")
                }
            }
        }
    }

    @Test("A GET never changes anything: no state file appears, none is rewritten, the mode's since stays")
    func getsChangeNothing() throws {
        try withAdminProxy { proxy, admin throws in
            func everyGet() throws {
                for path in ["/mode", "/variants", "/metrics", "/healthz", "/variants/api-one", "/variants/none", "/nope"] {
                    _ = try admin.get(path)
                    _ = try admin.request("HEAD", path)
                }
            }
            try everyGet()
            #expect(StateFileSnapshot(directory: proxy.stateDirectory).files.isEmpty, "GETs wrote state")
            #expect(try modeFacts(admin)?.source == "default")

            #expect(try admin.put("/mode", #"{"mode": "constrained"}"#).status == 200)
            #expect(try admin.putVariant("api-one", ["match": "http://a.example/*", "target": "http://b.example/$1"]).status == 201)
            let files = StateFileSnapshot(directory: proxy.stateDirectory)
            let mode = try admin.get("/mode").bodyText
            let variants = try admin.get("/variants").bodyText
            try everyGet()
            #expect(StateFileSnapshot(directory: proxy.stateDirectory) == files, "GETs rewrote state: \(files)")
            #expect(try admin.get("/mode").bodyText == mode)
            #expect(try admin.get("/variants").bodyText == variants)
        }
    }

    // MARK: precedence

    @Test("Mode precedence: the file's mode is used, source config; API beats it; DELETE returns to it")
    func precedenceConfig() throws {
        try withAdminProxy(config: "mode: expensive\n") { proxy, admin throws in
            #expect(try modeFacts(admin) == ModeFacts("expensive", false, true, "config"))
            #expect(ModeFacts(try admin.put("/mode", #"{"mode": "constrained"}"#)) == ModeFacts("constrained", true, false, "api"))
            #expect(try modeFacts(admin) == ModeFacts("constrained", true, false, "api"))
            let back = try admin.delete("/mode")
            #expect(back.status == 200, "\(back.bodyText)")
            #expect(ModeFacts(back) == ModeFacts("expensive", false, true, "config"), "DELETE answered \(back.bodyText)")
            #expect(try modeFacts(admin) == ModeFacts("expensive", false, true, "config"))
            #expect(!FileManager.default.fileExists(atPath: proxy.stateDirectory + "/mode.json"), "DELETE left mode.json")
            // DELETE with nothing set through the API is harmless.
            #expect(try admin.delete("/mode").status == 200)
            #expect(try modeFacts(admin) == ModeFacts("expensive", false, true, "config"))
        }
    }

    @Test("Mode precedence: DATAMODE_MODE beats the file (source flag)")
    func precedenceEnvironment() throws {
        try withAdminProxy(config: "mode: expensive\n", environment: ["DATAMODE_MODE": "low-data"]) { _, admin throws in
            #expect(try modeFacts(admin) == ModeFacts("constrained", true, false, "flag"))
        }
    }

    @Test("Mode precedence: API > --mode > DATAMODE_MODE > file; DELETE returns to the flag's mode, source flag")
    func precedenceFlag() throws {
        try withAdminProxy(config: "mode: expensive\n", arguments: ["--mode", "constrained-expensive"],
                           environment: ["DATAMODE_MODE": "constrained"]) { proxy, admin throws in
            #expect(try modeFacts(admin) == ModeFacts("constrained-expensive", true, true, "flag"))
            #expect(ModeFacts(try admin.put("/mode", #"{"mode": "normal"}"#)) == ModeFacts("normal", false, false, "api"))
            #expect(try modeFacts(admin) == ModeFacts("normal", false, false, "api"))
            #expect(ModeFacts(try admin.delete("/mode")) == ModeFacts("constrained-expensive", true, true, "flag"))
            #expect(try modeFacts(admin) == ModeFacts("constrained-expensive", true, true, "flag"))
        }
    }

    @Test("Mode precedence: with nothing set, DELETE returns to normal, source default")
    func precedenceDefault() throws {
        try withAdminProxy { _, admin throws in
            #expect(try admin.put("/mode", #"{"mode": "expensive"}"#).status == 200)
            #expect(ModeFacts(try admin.delete("/mode")) == ModeFacts("normal", false, false, "default"))
            #expect(try modeFacts(admin) == ModeFacts("normal", false, false, "default"))
        }
    }

    // MARK: the mode reaches traffic

    @Test("A mode flip is seen by the next request on an already-open keep-alive client connection")
    func flipOnOpenConnection() throws {
        let origin = try RecordingOrigin()
        defer { origin.stop() }
        try withAdminProxy { proxy, admin throws in
            let client = try RawHTTPClient(port: proxy.port)
            defer { client.close() }
            let tag = [("Allow-Constrained", "?0")]

            let first = try proxied(client, origin.url("/video.mp4"), headers: tag)
            #expect(first.status == 200 && first.bodyText == "ok", "normal mode: \(first.status) \(first.bodyText)")
            #expect(origin.requests.count == 1)

            #expect(try admin.put("/mode", #"{"mode": "constrained"}"#).status == 200)

            let second = try proxied(client, origin.url("/video.mp4"), headers: tag)
            #expect(second.status == 403, "after PUT constrained, same connection: \(second.status) \(second.bodyText)")
            #expect(second.value(of: "Network-Unavailable-Reason") == "constrained")
            #expect(second.value(of: "Content-Type")?.hasPrefix("application/problem+json") == true)
            #expect(second.problem?.error == "constrained" && second.problem?.mode == "constrained", "\(second.bodyText)")
            #expect(origin.requests.count == 1, "a rejected request reached the origin")

            #expect(try admin.delete("/mode").status == 200)
            let third = try proxied(client, origin.url("/video.mp4"), headers: tag)
            #expect(third.status == 200, "after DELETE /mode, same connection: \(third.status) \(third.bodyText)")
            #expect(origin.waitForRequests(2).count == 2)
        }
    }

    @Test("A mode flip does not cut a request already forwarded: its response still arrives whole")
    func flipDoesNotCutInFlight() throws {
        let origin = try RecordingOrigin { _ in .delay(.milliseconds(300), then: .ok("slow but whole")) }
        defer { origin.stop() }
        try withAdminProxy { proxy, admin throws in
            let client = try RawHTTPClient(port: proxy.port)
            defer { client.close() }
            try client.send(RequestText.make("GET", origin.url("/slow.mp4"), headers: [("Allow-Constrained", "?0")]))
            #expect(origin.waitForRequests(1).count == 1, "the request was not forwarded")
            #expect(try admin.put("/mode", #"{"mode": "constrained"}"#).status == 200)
            let response = try client.readFinalResponse()
            #expect(response.status == 200 && response.bodyText == "slow but whole", "\(response.status) \(response.bodyText)")
            // The next request on the same connection is judged under the new mode.
            #expect(try proxied(client, origin.url("/slow.mp4"), headers: [("Allow-Constrained", "?0")]).status == 403)
        }
    }

    @Test("An API variant registered at run time serves the next disallowed request; after DELETE it is rejected again")
    func apiVariantServesTraffic() throws {
        let origin = try RecordingOrigin { request in
            .ok(request.target.hasSuffix("-small.jpg") ? "small" : "full")
        }
        defer { origin.stop() }
        try withAdminProxy(arguments: ["--mode", "constrained"]) { proxy, admin throws in
            let client = try RawHTTPClient(port: proxy.port)
            defer { client.close() }
            let tag = [("Allow-Constrained", "?0")]
            #expect(try proxied(client, origin.url("/img/hero.jpg"), headers: tag).status == 403)

            let put = try admin.putVariant("hero-small", ["match": origin.url("/img/*.jpg"), "target": origin.url("/img/$1-small.jpg")])
            #expect(put.status == 201, "\(put.bodyText)")
            let served = try proxied(client, origin.url("/img/hero.jpg"), headers: tag)
            #expect(served.status == 200 && served.bodyText == "small", "\(served.status) \(served.bodyText)")
            #expect(served.value(of: "Data-Mode-Variant") == "hero-small")
            #expect(origin.requests.last?.target.hasSuffix("/img/hero-small.jpg") == true, "\(origin.requests.map(\.target))")

            #expect(try admin.delete("/variants/hero-small").status == 200)
            #expect(try proxied(client, origin.url("/img/hero.jpg"), headers: tag).status == 403)
        }
    }

    // MARK: token

    @Test("admin.token: missing or wrong bearer token -> 401 with WWW-Authenticate on every endpoint but /healthz")
    func tokenFromFile() throws {
        try withAdminProxy(config: "admin: {token: s3cret}\n", token: "s3cret") { proxy, admin throws in
            let refused: [(String, String, String?)] = [
                ("GET", "/mode", nil), ("PUT", "/mode", #"{"mode": "constrained"}"#), ("DELETE", "/mode", nil),
                ("GET", "/variants", nil),
                ("PUT", "/variants/sneaky", #"{"match": "http://a.example/*", "target": "http://evil.example/$1"}"#),
                ("DELETE", "/variants/sneaky", nil), ("GET", "/metrics", nil), ("GET", "/nope", nil),
            ]
            let badCredentials = ["", "Bearer wrong", "Bearer s3cre", "Bearer s3cretX", "Bearer", "Bearer  ", "Basic czNjcmV0",
                                  "s3cret", "Token s3cret"]
            for (method, path, body) in refused {
                for credential in badCredentials {
                    let reply = try admin.request(method, path, body: body, authorization: credential)
                    #expect(reply.status == 401, "\(method) \(path) with \(credential.debugDescription): \(reply.status)")
                    let challenge = reply.value(of: "WWW-Authenticate") ?? ""
                    #expect(challenge.lowercased().hasPrefix("bearer"), "\(method) \(path): WWW-Authenticate \(challenge.debugDescription)")
                }
            }
            #expect(try admin.request("GET", "/healthz", authorization: "").status == 200)
            // Nothing the refused requests asked for happened.
            #expect(try modeFacts(admin) == ModeFacts("normal", false, false, "default"))
            #expect(try admin.get("/variants").array?.isEmpty == true)
            #expect(StateFileSnapshot(directory: proxy.stateDirectory).files.isEmpty)
            // The right token works, in either case of the scheme name (RFC 9110 §11.1).
            #expect(try admin.get("/mode").status == 200)
            #expect(try admin.request("GET", "/mode", authorization: "bearer s3cret").status == 200)
            #expect(try admin.put("/mode", #"{"mode": "constrained"}"#).status == 200)
            #expect(try admin.get("/metrics").status == 200)
        }
    }

    @Test("DATAMODE_ADMIN_TOKEN turns the token on, and beats admin.token from the file")
    func tokenFromEnvironment() throws {
        try withAdminProxy(environment: ["DATAMODE_ADMIN_TOKEN": "from-env"]) { _, admin throws in
            #expect(try admin.get("/mode").status == 401)
            #expect(try admin.request("GET", "/mode", authorization: "Bearer from-env").status == 200)
        }
        try withAdminProxy(config: "admin: {token: from-file}\n", environment: ["DATAMODE_ADMIN_TOKEN": "from-env"]) { _, admin throws in
            #expect(try admin.request("GET", "/mode", authorization: "Bearer from-env").status == 200)
            #expect(try admin.request("GET", "/mode", authorization: "Bearer from-file").status == 401)
        }
    }

    @Test("The admin API on a non-loopback address without a token refuses to start", arguments: ["0.0.0.0:0", "[::]:0"])
    func nonLoopbackWithoutToken(address: String) throws {
        let proxy = try ProxyProcess(arguments: ["--admin-listen", address], waitForReady: false)
        defer { halt(proxy) }
        let status = proxy.waitForExit(timeout: 15)
        #expect(status != nil, "still running with an open admin API on \(address)")
        #expect(status != 0)
        #expect(proxy.stderr.contains("admin.token"), "stderr: \(proxy.stderr)")
        #expect(!proxy.stderr.contains(" ready"), "it said ready: \(proxy.stderr)")
    }

    @Test("The admin API on a non-loopback address starts with DATAMODE_ADMIN_TOKEN, and enforces it")
    func nonLoopbackWithToken() throws {
        try withAdminProxy(arguments: ["--admin-listen", "0.0.0.0:0"], environment: ["DATAMODE_ADMIN_TOKEN": "tok"],
                           token: "tok") { _, admin throws in
            #expect(try admin.get("/mode").status == 200)
            #expect(try admin.request("GET", "/mode", authorization: "").status == 401)
        }
    }

    // MARK: metrics

    @Test("GET /metrics: the exact series move by what was forwarded, rewritten, rejected and failed")
    func metricsMove() throws {
        let body = "0123456789"
        let origin = try RecordingOrigin { _ in .ok(body) }
        defer { origin.stop() }
        let deadPort = try LoopbackPort.refusingConnections()
        let config = """
            variants:
              - id: hero-small
                match: "\(origin.url("/img/*.jpg"))"
                target: "\(origin.url("/small/$1.jpg"))"
            """
        try withAdminProxy(config: config) { proxy, admin throws in
            let reply = try admin.get("/metrics")
            #expect(reply.status == 200)
            #expect(reply.value(of: "Content-Type")?.hasPrefix("text/plain") == true, "\(reply.value(of: "Content-Type") ?? "")")
            let before = try MetricsScrape(reply.bodyText)
            #expect(before.types["datamode_requests_total"] == "counter")
            #expect(before.types["datamode_bytes_total"] == "counter")
            #expect(before.types["datamode_connections_active"] == "gauge")
            #expect(before.types["datamode_mode"] == "gauge")
            #expect(before.types["datamode_request_duration_seconds"] == "histogram")
            #expect(before.value("datamode_mode", ["condition": "constrained"]) == 0)
            #expect(before.value("datamode_mode", ["condition": "expensive"]) == 0)
            #expect(before.value("datamode_bytes_total", ["direction": "in"]) != nil)
            #expect(before.value("datamode_bytes_total", ["direction": "out"]) != nil)
            #expect(before.value("datamode_connections_active") == 0)

            #expect(try admin.put("/mode", #"{"mode": "constrained"}"#).status == 200)
            let constrained = try admin.scrape()
            #expect(constrained.value("datamode_mode", ["condition": "constrained"]) == 1)
            #expect(constrained.value("datamode_mode", ["condition": "expensive"]) == 0)

            let client = try RawHTTPClient(port: proxy.port)
            let second = try RawHTTPClient(port: proxy.port)
            let tag = [("Allow-Constrained", "?0")]
            var responses: [ParsedResponse] = []
            responses.append(try proxied(client, origin.url("/page")))                                   // forwarded
            responses.append(try proxied(client, origin.url("/page2")))                                  // forwarded
            responses.append(try proxied(client, origin.url("/upload"), method: "POST", body: String(repeating: "u", count: 25)))  // forwarded
            responses.append(try proxied(client, origin.url("/video.mp4"), headers: tag))                // rejected
            responses.append(try proxied(second, origin.url("/video2.mp4"), headers: tag))               // rejected
            responses.append(try proxied(client, origin.url("/img/hero.jpg"), headers: tag))             // rewritten
            responses.append(try proxied(second, "http://127.0.0.1:\(deadPort)/"))                        // error
            #expect(responses.map(\.status) == [200, 200, 200, 403, 403, 200, 502], "\(responses.map(\.status))")
            #expect(responses[5].value(of: "Data-Mode-Variant") == "hero-small")
            #expect(responses[6].problem?.error == "upstream-unreachable", "\(responses[6].bodyText)")

            // Counters are bumped when an exchange ends; wait (bounded) until all seven are in, then compare exactly.
            var after = try admin.scrape()
            AdminPolling.until {
                after = (try? admin.scrape()) ?? after
                return after.counter("datamode_request_duration_seconds_count") - before.counter("datamode_request_duration_seconds_count") >= 7
            }
            func delta(_ name: String, _ labels: [String: String] = [:]) -> Double {
                after.counter(name, labels) - before.counter(name, labels)
            }
            #expect(delta("datamode_requests_total", ["outcome": "forwarded", "reason": ""]) == 3)
            #expect(delta("datamode_requests_total", ["outcome": "rejected", "reason": "constrained"]) == 2)
            let rewritten = after.samples.filter { $0.key.hasPrefix("datamode_requests_total{outcome=\"rewritten\"") }.values.reduce(0, +)
                - before.samples.filter { $0.key.hasPrefix("datamode_requests_total{outcome=\"rewritten\"") }.values.reduce(0, +)
            #expect(rewritten == 1, "rewritten series: \(after.samples.filter { $0.key.contains("rewritten") })")
            #expect(delta("datamode_requests_total", ["outcome": "error", "reason": "upstream-unreachable"]) == 1)
            let total = after.samples.filter { $0.key.hasPrefix("datamode_requests_total{") }.values.reduce(0, +)
                - before.samples.filter { $0.key.hasPrefix("datamode_requests_total{") }.values.reduce(0, +)
            #expect(total == 7, "every request counted once: \(total)")
            #expect(delta("datamode_request_duration_seconds_count") == 7)
            #expect(delta("datamode_request_duration_seconds_sum") >= 0)
            let buckets = after.buckets("datamode_request_duration_seconds")
            #expect(buckets.count >= 2 && buckets.last?.le == .infinity, "\(buckets)")
            #expect(buckets.last?.count == after.counter("datamode_request_duration_seconds_count"))
            #expect(zip(buckets, buckets.dropFirst()).allSatisfy { $0.count <= $1.count }, "buckets not cumulative: \(buckets)")
            // Body bytes: in = the one request body; out = every response body the clients read.
            #expect(delta("datamode_bytes_total", ["direction": "in"]) == 25)
            let bodiesOut = responses.reduce(0) { $0 + Double($1.bodyLength) }
            #expect(delta("datamode_bytes_total", ["direction": "out"]) == bodiesOut,
                    "out delta \(delta("datamode_bytes_total", ["direction": "out"])) vs bodies read \(bodiesOut)")
            // Connections: two open now, none once both are closed.
            #expect(AdminPolling.until { (try? admin.scrape())?.value("datamode_connections_active") == 2 },
                    "connections_active with two clients open: \(after.value("datamode_connections_active") ?? -1)")
            client.close()
            second.close()
            let closedAll = AdminPolling.until { (try? admin.scrape())?.value("datamode_connections_active") == 0 }
            let activeAfterClose = try admin.scrape().value("datamode_connections_active") ?? -1
            #expect(closedAll, "connections_active after both closed: \(activeAfterClose)")
            // Admin requests are not proxy requests: scraping moved nothing.
            let quiet = try admin.scrape()
            _ = try admin.scrape()
            #expect(try admin.scrape().counter("datamode_request_duration_seconds_count") == quiet.counter("datamode_request_duration_seconds_count"))
        }
    }
}
