import DatamodeAdmin
import DatamodeConfig
import DatamodePolicy
import Foundation
import Testing

/// `GET /variants`, `GET|PUT|DELETE /variants/{id}` (SPEC §5, §7).
@Suite("Admin: /variants")
struct VariantsEndpointTests {
    static let file = """
        variants:
          - {id: cfg, match: "http://a.example/img/*", target: "http://a.example/small/$1"}
        """

    @Test("GET lists every variant with its fields and source, config first")
    func list() throws {
        let admin = try AdminFixture(Self.file)
        #expect(admin.handle("PUT", "/variants/api", #"{"match": "http://b.example/*.mp4", "target": "http://b.example/$1.jpg", "action": "redirect", "when": "always"}"#).status == 201)
        let response = admin.handle("GET", "/variants")
        #expect(response.status == 200)
        let list = try #require(response.json as? [[String: Any]])
        #expect(list.map { $0["id"] as? String } == ["cfg", "api"])
        #expect(list.map { $0["source"] as? String } == ["config", "api"])
        #expect(list[0]["action"] as? String == "forward")
        #expect(list[0]["when"] as? String == "disallowed")
        #expect(list[1]["action"] as? String == "redirect")
        #expect(list[1]["when"] as? String == "always")
        #expect(list[1]["target"] as? String == "http://b.example/$1.jpg")
    }

    @Test("PUT creates (201), replaces (200), persists and publishes")
    func put() throws {
        let admin = try AdminFixture(Self.file)
        let created = admin.handle("PUT", "/variants/hero", #"{"match": "http://c.example/hero.jpg", "target": "http://c.example/hero-small.jpg"}"#)
        #expect(created.status == 201, "\(created.text)")
        #expect(created.object["source"] as? String == "api")
        let replaced = admin.handle("PUT", "/variants/hero", #"{"match": "http://c.example/hero.png", "target": "http://c.example/hero-small.png"}"#)
        #expect(replaced.status == 200)
        #expect(admin.snapshot.policy.variants.map(\.id) == ["cfg", "hero"])
        #expect(admin.snapshot.policy.variant(id: "hero")?.match == "http://c.example/hero.png")
        let saved = try admin.store.loadVariants(files: admin.snapshot.configuration.variantFiles)
        #expect(saved.map(\.id) == ["hero"])
        #expect(saved.first?.match == "http://c.example/hero.png")
    }

    @Test("a file variant is confined to the variants directory")
    func fileVariant() throws {
        let admin = try AdminFixture()
        try "small".write(toFile: admin.directory + "/variants/small.jpg", atomically: true, encoding: .utf8)
        try "secret".write(toFile: admin.directory + "/secret.txt", atomically: true, encoding: .utf8)
        let inside = admin.handle("PUT", "/variants/small", #"{"match": "http://a.example/big.jpg", "file": "variants/small.jpg"}"#)
        #expect(inside.status == 201, "\(inside.text)")
        #expect((inside.object["file"] as? String)?.hasSuffix("/variants/small.jpg") == true)
        let outside = admin.handle("PUT", "/variants/leak", #"{"match": "http://a.example/x", "file": "secret.txt"}"#)
        expectProblem(outside, 400, "invalid-variant")
        #expect(admin.snapshot.policy.variant(id: "leak") == nil)
    }

    @Test("PUT refuses a body that is not one variant, and changes nothing", arguments: [
        ("", "bad-request", "a JSON object body is required"),
        (#"{"match": "http://a.example/*", "target": "http://b.example/", "colour": "red"}"#, "bad-request", "unknown key \"colour\""),
        (#"{"target": "http://b.example/"}"#, "bad-request", "\"match\""),
        (#"{"match": "http://a.example/*"}"#, "bad-request", "exactly one of"),
        (#"{"match": "http://a.example/*", "target": "http://b.example/", "file": "x.jpg"}"#, "bad-request", "exactly one of"),
        (#"{"id": "other", "match": "http://a.example/*", "target": "http://b.example/"}"#, "bad-request", "differs from the path"),
        (#"{"source": "config", "match": "http://a.example/*", "target": "http://b.example/"}"#, "bad-request", "\"source\""),
        (#"{"when": "sometimes", "match": "http://a.example/*", "target": "http://b.example/"}"#, "bad-request", "\"when\""),
        (#"{"action": "proxy", "match": "http://a.example/*", "target": "http://b.example/"}"#, "bad-request", "\"action\""),
        (#"{"content-type": "image/png", "match": "http://a.example/*", "target": "http://b.example/"}"#, "bad-request", "file variants only"),
        (#"{"match": "", "target": "http://b.example/"}"#, "bad-request", "non-empty string"),
        // An empty file names no file (SPEC §5: refused as invalid-variant, not as a malformed body).
        (#"{"match": "http://a.example/*", "file": ""}"#, "invalid-variant", "it is empty"),
        // Valid JSON, refused by the policy compiler: the same checks as a config variant.
        (#"{"match": "http://a.example/*", "target": "http://b.example/$3"}"#, "invalid-variant", "$3"),
    ])
    func putRefused(_ body: String, _ code: String, _ detail: String) throws {
        let admin = try AdminFixture(Self.file)
        let generation = admin.runtime.generation
        let response = admin.handle("PUT", "/variants/new", body)
        expectProblem(response, 400, code)
        #expect((response.object["detail"] as? String)?.contains(detail) == true, "\(response.text)")
        #expect(admin.runtime.generation == generation)
        #expect(admin.snapshot.policy.variants.map(\.id) == ["cfg"])
        #expect(!FileManager.default.fileExists(atPath: admin.store.variantsPath))
    }

    /// The path's id is percent-decoded to bytes, and they must be an id's (`[A-Za-z0-9._-]`, SPEC §5): a byte that is not
    /// UTF-8 was taken for an empty id, and a UTF-8 one was decoded into the answer. The refusal quotes the id as
    /// received, with anything but printable ASCII (and `"`, `\`) percent-encoded.
    @Test("an id outside [A-Za-z0-9._-] once percent-decoded: 400 invalid-variant quoting it as received", arguments: [
        ("caf%E9", #""caf%E9""#), ("caf%C3%A9", #""caf%C3%A9""#), ("caf%c3%a9", #""caf%c3%a9""#), ("a%00b", #""a%00b""#),
        ("a%2Fb", #""a%2Fb""#), ("a%22b", #""a%22b""#), ("%20", #""%20""#),
    ])
    func putRefusesAnIDOutsideTheCharacters(_ segment: String, _ quoted: String) throws {
        let admin = try AdminFixture(Self.file)
        let response = admin.handle("PUT", "/variants/" + segment, #"{"match": "http://a.example/*", "target": "http://b.example/"}"#)
        expectProblem(response, 400, "invalid-variant")
        let detail = response.object["detail"] as? String ?? ""
        #expect(detail == "variant id \(quoted) may contain only letters, digits, '.', '_' and '-' (percent-decoded)", "\(detail)")
        #expect(admin.snapshot.policy.variants.map(\.id) == ["cfg"])
        #expect(!FileManager.default.fileExists(atPath: admin.store.variantsPath))
        expectProblem(admin.handle("GET", "/variants/" + segment), 404, "not-found")
        expectProblem(admin.handle("DELETE", "/variants/" + segment), 404, "not-found")
    }

    @Test("config variants are read-only here (409)", arguments: ["PUT", "DELETE"])
    func configVariantsReadOnly(_ method: String) throws {
        let admin = try AdminFixture(Self.file)
        let response = admin.handle(method, "/variants/cfg", #"{"match": "http://a.example/*", "target": "http://b.example/"}"#)
        expectProblem(response, 409, "conflict")
        #expect(admin.snapshot.policy.variant(id: "cfg")?.source == .config)
    }

    @Test("GET and DELETE of one variant; 404 for one that does not exist")
    func item() throws {
        let admin = try AdminFixture(Self.file)
        #expect(admin.handle("GET", "/variants/cfg").object["id"] as? String == "cfg")
        expectProblem(admin.handle("GET", "/variants/none"), 404, "not-found")
        expectProblem(admin.handle("DELETE", "/variants/none"), 404, "not-found")
        #expect(admin.handle("PUT", "/variants/api", #"{"match": "http://b.example/*", "target": "http://c.example/$1"}"#).status == 201)
        let deleted = admin.handle("DELETE", "/variants/api")
        #expect(deleted.status == 200)
        #expect(deleted.object["deleted"] as? String == "api")
        #expect(admin.snapshot.policy.variants.map(\.id) == ["cfg"])
        #expect(try admin.store.loadVariants(files: admin.snapshot.configuration.variantFiles).isEmpty)
    }

    @Test("the id in the path is percent-decoded, then checked as a config variant's; a refusal quotes it as received")
    func percentEncodedID() throws {
        let admin = try AdminFixture()
        let response = admin.handle("PUT", "/variants/h%65ro", #"{"match": "http://a.example/x", "target": "http://a.example/y"}"#)
        #expect(response.status == 201, "\(response.text)")
        #expect(response.object["id"] as? String == "hero")
        #expect(admin.handle("GET", "/variants/hero").status == 200)
        let spaced = admin.handle("PUT", "/variants/hero%20small", #"{"match": "http://a.example/x", "target": "http://a.example/y"}"#)
        expectProblem(spaced, 400, "invalid-variant")
        #expect((spaced.object["detail"] as? String)?.contains("\"hero%20small\"") == true, "\(spaced.text)")
    }

    @Test("other methods: 405 with Allow", arguments: [
        ("PUT", "/variants", "GET, HEAD"),
        ("DELETE", "/variants", "GET, HEAD"),
        ("POST", "/variants/x", "GET, HEAD, PUT, DELETE"),
    ])
    func otherMethods(_ method: String, _ path: String, _ allow: String) throws {
        let response = try AdminFixture().handle(method, path)
        expectProblem(response, 405, "method-not-allowed")
        #expect(response.header("Allow") == allow)
    }
}
