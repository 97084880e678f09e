import DatamodeAdmin
import DatamodePolicy
import Foundation
import Testing

/// `GET|PUT|DELETE /mode` (SPEC §2, §7).
@Suite("Admin: /mode")
struct ModeEndpointTests {
    @Test("GET says the mode, its conditions, its source and since when")
    func get() throws {
        let admin = try AdminFixture("mode: cellular\n")
        let response = admin.handle("GET", "/mode")
        #expect(response.status == 200)
        #expect(response.header("Content-Type") == "application/json")
        #expect(response.header("Cache-Control") == "no-store")
        let document = response.object
        #expect(document["mode"] as? String == "expensive")
        #expect(document["constrained"] as? Bool == false)
        #expect(document["expensive"] as? Bool == true)
        #expect(document["ultraConstrained"] as? Bool == false)
        #expect(document["source"] as? String == "config")
        #expect(document["since"] as? String == "2026-01-01T00:00:00Z")
        #expect(Set(document.keys) == ["mode", "constrained", "expensive", "ultraConstrained", "source", "since", "profile"])
        #expect(document["profile"] is NSNull)
    }

    @Test("PUT accepts a name, an alias or the conditions, a missing condition being false", arguments: [
        (#"{"mode": "constrained"}"#, "constrained"),
        (#"{"mode": "low-data"}"#, "constrained"),
        (#"{"mode": "cellular"}"#, "expensive"),
        (#"{"mode": "constrained-expensive"}"#, "constrained-expensive"),
        (#"{"mode": "satellite"}"#, "constrained-expensive-ultra-constrained"),
        (#"{"ultraConstrained": true}"#, "ultra-constrained"),
        (#"{"mode": "normal"}"#, "normal"),
        (#"{"constrained": true}"#, "constrained"),
        (#"{"expensive": true, "constrained": false}"#, "expensive"),
        (#"{"constrained": true, "expensive": true}"#, "constrained-expensive"),
    ])
    func put(_ body: String, _ mode: String) throws {
        let admin = try AdminFixture("mode: cellular\n")
        admin.advance(60)
        let response = admin.handle("PUT", "/mode", body)
        #expect(response.status == 200, "\(response.text)")
        #expect(response.object["mode"] as? String == mode)
        #expect(response.object["source"] as? String == "api")
        #expect(response.object["since"] as? String == "2026-01-01T00:01:00Z")
        // Published to the workers and persisted, with the same `since`.
        #expect(admin.snapshot.mode.name == mode)
        #expect(admin.snapshot.modeSource == .api)
        let saved = try #require(try admin.store.loadMode())
        #expect(saved.mode.name == mode)
        #expect(saved.since == admin.now)
    }

    @Test("PUT refuses a body that is not one mode, and changes nothing", arguments: [
        ("", "a JSON object body is required"),
        ("{mode: constrained}", "not valid JSON"),
        (#"["constrained"]"#, "must be a JSON object"),
        (#"{"mode": "fast"}"#, "\"mode\" must be one of"),
        (#"{"mode": 1}"#, "\"mode\" must be one of"),
        (#"{"mode": "constrained", "expensive": true}"#, "not both"),
        (#"{"colour": "red"}"#, "unknown key \"colour\""),
        (#"{"constrained": 1}"#, "\"constrained\" must be true or false"),
        (#"{"expensive": "yes"}"#, "\"expensive\" must be true or false"),
        ("{}", "give \"mode\""),
    ])
    func putRefused(_ body: String, _ detail: String) throws {
        let admin = try AdminFixture()
        let generation = admin.runtime.generation
        let response = admin.handle("PUT", "/mode", body)
        expectProblem(response, 400, "bad-request")
        #expect((response.object["detail"] as? String)?.contains(detail) == true, "\(response.text)")
        #expect(admin.runtime.generation == generation)
        #expect(try admin.store.loadMode() == nil)
    }

    @Test("since moves when the mode changes or passes to or from the API, not on a PUT of the API mode in force")
    func since() throws {
        let admin = try AdminFixture("mode: constrained\n")
        admin.advance(10)
        // The file's mode, now held by the API: since moves.
        #expect(admin.handle("PUT", "/mode", #"{"mode": "constrained"}"#).object["since"] as? String == "2026-01-01T00:00:10Z")
        admin.advance(10)
        #expect(admin.handle("PUT", "/mode", #"{"mode": "constrained"}"#).object["since"] as? String == "2026-01-01T00:00:10Z")
        admin.advance(10)
        #expect(admin.handle("PUT", "/mode", #"{"mode": "expensive"}"#).object["since"] as? String == "2026-01-01T00:00:30Z")
        admin.advance(10)
        // Back to the file's mode: since moves even though DELETE is what changed it.
        let deleted = admin.handle("DELETE", "/mode").object
        #expect(deleted["mode"] as? String == "constrained")
        #expect(deleted["source"] as? String == "config")
        #expect(deleted["since"] as? String == "2026-01-01T00:00:40Z")
    }

    @Test("DELETE returns to the flag or file mode and forgets the persisted one", arguments: [
        ("", "normal", "default"),
        ("mode: low-data\n", "constrained", "config"),
    ])
    func delete(_ yaml: String, _ mode: String, _ source: String) throws {
        let admin = try AdminFixture(yaml)
        #expect(admin.handle("PUT", "/mode", #"{"mode": "constrained-expensive"}"#).status == 200)
        let response = admin.handle("DELETE", "/mode")
        #expect(response.status == 200)
        #expect(response.object["mode"] as? String == mode)
        #expect(response.object["source"] as? String == source)
        #expect(admin.snapshot.modeSource.rawValue == source)
        #expect(try admin.store.loadMode() == nil)
        // Again: nothing to forget, still fine.
        #expect(admin.handle("DELETE", "/mode").status == 200)
    }

    @Test("a PUT that cannot be persisted is not applied")
    func unwritableState() throws {
        let admin = try AdminFixture()
        try FileManager.default.removeItem(atPath: admin.store.directory)
        let generation = admin.runtime.generation
        let response = admin.handle("PUT", "/mode", #"{"mode": "constrained"}"#)
        #expect(response.status == 500)
        #expect(response.errorCode == "state-write-failed")
        #expect(admin.runtime.generation == generation)
        #expect(admin.snapshot.mode == .normal)
    }

    @Test("other methods: 405 with Allow", arguments: ["POST", "PATCH", "OPTIONS"])
    func otherMethods(_ method: String) throws {
        let response = try AdminFixture().handle(method, "/mode")
        expectProblem(response, 405, "method-not-allowed")
        #expect(response.header("Allow") == "GET, HEAD, PUT, DELETE")
    }
}
