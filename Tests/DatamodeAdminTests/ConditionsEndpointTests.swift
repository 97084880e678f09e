import DatamodeAdmin
import DatamodePolicy
import Foundation
import Testing

/// `GET|PUT|DELETE /conditions` (SPEC §10), and the profile in `GET /mode` and `/metrics`.
@Suite("Admin: /conditions")
struct ConditionsEndpointTests {
    static let yaml = """
        mode: constrained
        profiles:
          my-sat: {down: 2Mbit, up: 256kbit, latency: 600ms, jitter: 20ms}
        conditions:
          constrained: {profile: nlc-3g}
        """

    @Test("GET says the profile in force, its values, why, the scope and every profile name")
    func get() throws {
        let admin = try AdminFixture(Self.yaml)
        let response = admin.handle("GET", "/conditions")
        #expect(response.status == 200)
        #expect(response.header("Content-Type") == "application/json")
        let document = response.object
        #expect(document["profile"] as? String == "nlc-3g")
        #expect(document["source"] as? String == "mode")
        #expect(document["condition"] as? String == "constrained")
        #expect(document["mode"] as? String == "constrained")
        #expect(document["down"] as? Int == 780_000)
        #expect(document["up"] as? Int == 330_000)
        #expect(document["latencyMs"] as? Double == 200)
        #expect(document["jitterMs"] as? Double == 0)
        #expect(document["scope"] as? String == "client")
        let names = try #require(document["profiles"] as? [String])
        #expect(names.contains("my-sat") && names.contains("geo-satellite") && names.count == 9)
    }

    @Test("GET in a mode without a profile: profile null, source none")
    func none() throws {
        let admin = try AdminFixture("")
        let document = admin.handle("GET", "/conditions").object
        #expect(document["profile"] is NSNull)
        #expect(document["source"] as? String == "none")
        #expect(document["down"] == nil)
    }

    @Test("PUT sets a profile that beats the mode's, persisted and published; DELETE returns to the mode's")
    func putAndDelete() throws {
        let admin = try AdminFixture(Self.yaml)
        let put = admin.handle("PUT", "/conditions", #"{"profile": "my-sat"}"#)
        #expect(put.status == 200, "\(put.text)")
        #expect(put.object["profile"] as? String == "my-sat")
        #expect(put.object["source"] as? String == "api")
        #expect(put.object["latencyMs"] as? Double == 600)
        #expect(put.object["jitterMs"] as? Double == 20)
        #expect(admin.snapshot.apiProfile == "my-sat")
        #expect(try admin.store.loadProfile() == "my-sat")
        #expect(admin.handle("GET", "/mode").object["profile"] as? String == "my-sat")

        let delete = admin.handle("DELETE", "/conditions")
        #expect(delete.status == 200)
        #expect(delete.object["profile"] as? String == "nlc-3g")
        #expect(delete.object["source"] as? String == "mode")
        #expect(admin.snapshot.apiProfile == nil)
        #expect(try admin.store.loadProfile() == nil)
    }

    @Test("PUT and DELETE emit a conditions event (SPEC §12) with the document")
    func events() throws {
        let admin = try AdminFixture(Self.yaml)
        let frames = Shared<[String]>([])
        admin.api.events.connect { _, bytes in frames.value.append(String(decoding: bytes, as: UTF8.self)) }
        _ = admin.handle("PUT", "/conditions", #"{"profile": "my-sat"}"#)
        _ = admin.handle("DELETE", "/conditions")
        let sent = frames.value
        #expect(sent.count == 2)
        #expect(sent.allSatisfy { $0.hasPrefix("event: conditions\n") })
        #expect(sent.first?.contains("\"profile\":\"my-sat\"") == true)
        #expect(sent.last?.contains("\"profile\":\"nlc-3g\"") == true)
    }

    @Test("PUT of an unknown profile: 400 unknown-profile, nothing changes")
    func unknownProfile() throws {
        let admin = try AdminFixture(Self.yaml)
        let response = admin.handle("PUT", "/conditions", #"{"profile": "dial-up"}"#)
        #expect(response.status == 400)
        #expect(response.header("Content-Type") == "application/problem+json")
        #expect(response.errorCode == "unknown-profile")
        #expect(response.object["type"] as? String == "urn:datamode:unknown-profile")
        #expect((response.object["detail"] as? String)?.contains("dial-up") == true)
        #expect(admin.snapshot.apiProfile == nil)
        #expect(try admin.store.loadProfile() == nil)
    }

    @Test("PUT refuses a body that is not one profile name", arguments: [
        "", "{", #"{"profile": 3}"#, #"{"profile": null}"#, #"{"name": "nlc-3g"}"#, #"{"profile": "nlc-3g", "x": 1}"#,
    ])
    func badBodies(_ body: String) throws {
        let admin = try AdminFixture(Self.yaml)
        let response = admin.handle("PUT", "/conditions", body)
        #expect(response.status == 400)
        #expect(response.errorCode == "bad-request")
        #expect(admin.snapshot.apiProfile == nil)
    }

    @Test("Other methods: 405 with Allow")
    func methods() throws {
        let admin = try AdminFixture(Self.yaml)
        let response = admin.handle("POST", "/conditions", "{}")
        #expect(response.status == 405)
        #expect(response.header("Allow") == "GET, HEAD, PUT, DELETE")
    }

    @Test("/metrics shows the profile in force and its source")
    func metrics() throws {
        let admin = try AdminFixture(Self.yaml)
        #expect(admin.handle("GET", "/metrics").text.contains("datamode_link_profile{profile=\"nlc-3g\",source=\"mode\"} 1\n"))
        _ = admin.handle("PUT", "/conditions", #"{"profile": "my-sat"}"#)
        #expect(admin.handle("GET", "/metrics").text.contains("datamode_link_profile{profile=\"my-sat\",source=\"api\"} 1\n"))
        _ = admin.handle("PUT", "/mode", #"{"mode": "normal"}"#)
        _ = admin.handle("DELETE", "/conditions")
        #expect(admin.handle("GET", "/metrics").text.contains("datamode_link_profile{profile=\"none\",source=\"none\"} 1\n"))
    }
}
