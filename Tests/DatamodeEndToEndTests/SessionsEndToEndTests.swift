// End-to-end tests of SPEC §12 sessions through the real binary: two test rigs in parallel against one proxy,
// each in its own session mode, each asserting on its own counters (the proof issue 15 asks for); the
// session header's rules; proxy-user sessions; idle expiry.
import DatamodeTestSupport
import Foundation
import Synchronization
import Testing

@Suite("Sessions: end to end", .serialized)
struct SessionsEndToEndTests {
    static let config = "sessions: {enabled: true}\n"

    /// One rig: its own connection, its own session, `count` requests that do not allow constrained access.
    static func runRig(proxyPort: UInt16, origin: RecordingOrigin, session: String, count: Int) throws -> [Int] {
        let client = try RawHTTPClient(port: proxyPort)
        defer { client.close() }
        var statuses: [Int] = []
        for i in 0..<count {
            let response = try proxied(client, origin.url("/\(session)/\(i)"),
                                       headers: [("Data-Mode-Session", session), ("Allow-Constrained", "?0")])
            statuses.append(response.status)
        }
        return statuses
    }

    static func count(_ document: [String: Any], _ outcome: String, _ reason: String = "") -> Int {
        ((document["requests"] as? [String: Any])?[outcome] as? [String: Any])?[reason] as? Int ?? 0
    }

    @Test("two rigs in parallel, one proxy, two session modes: each asserts on its own counters")
    func parallelRigs() throws {
        let origin = try RecordingOrigin()
        defer { origin.stop() }
        try withAdminProxy(config: Self.config) { proxy, admin in
            #expect(try admin.put("/sessions/rig-a", #"{"mode": "constrained"}"#).status == 201)
            #expect(try admin.put("/sessions/rig-b", #"{"mode": "normal", "profile": "nlc-3g"}"#).status == 201)
            let perRig = 25
            let results = Mutex<[String: Result<[Int], any Error>]>([:])
            let rigs = ["rig-a", "rig-b"]
            DispatchQueue.concurrentPerform(iterations: rigs.count) { index in
                let session = rigs[index]
                let result = Result { try Self.runRig(proxyPort: proxy.port, origin: origin, session: session, count: perRig) }
                results.withLock { $0[session] = result }
            }
            let a = try results.withLock { $0["rig-a"]! }.get()
            let b = try results.withLock { $0["rig-b"]! }.get()
            #expect(a == Array(repeating: 403, count: perRig), "rig-a runs constrained: every request rejected")
            #expect(b == Array(repeating: 200, count: perRig), "rig-b runs normal: every request forwarded")

            // Rig A's assertions, on rig A's session only.
            let docA = try admin.get("/sessions/rig-a").object
            #expect(docA["mode"] as? String == "constrained")
            #expect(Self.count(docA, "rejected", "constrained") == perRig)
            #expect(Self.count(docA, "forwarded") == 0)
            #expect(docA["requestsTotal"] as? Int == perRig)
            let rejected = docA["rejected"] as? [[String: Any]] ?? []
            #expect(rejected.count == perRig)
            #expect(Set(rejected.compactMap { $0["url"] as? String })
                == Set((0..<perRig).map { origin.url("/rig-a/\($0)") }))
            #expect(rejected.allSatisfy { $0["error"] as? String == "constrained" && $0["time"] is String })
            // Rig B's, on rig B's.
            let docB = try admin.get("/sessions/rig-b").object
            #expect(docB["mode"] as? String == "normal")
            #expect(docB["profile"] as? String == "nlc-3g")
            #expect(Self.count(docB, "forwarded") == perRig)
            #expect(Self.count(docB, "rejected", "constrained") == 0)
            #expect((docB["rejected"] as? [Any])?.isEmpty == true)
            #expect(((docB["bytes"] as? [String: Any])?["out"] as? Int ?? 0) > 0)
            // The global mode never moved, and the origin saw rig B alone, without the session header.
            #expect(try admin.get("/mode").object["mode"] as? String == "normal")
            let seen = origin.requests
            #expect(seen.count == perRig)
            #expect(seen.allSatisfy { $0.head.target.hasPrefix("/rig-b/") })
            #expect(seen.allSatisfy { $0.head.values(of: "data-mode-session").isEmpty })
            #expect(seen.allSatisfy { $0.head.values(of: "save-data").isEmpty })
        }
    }

    @Test("the session header: unknown → 400 unknown-session, created → judged by it, deleted → unknown again")
    func headerRules() throws {
        let origin = try RecordingOrigin()
        defer { origin.stop() }
        try withAdminProxy(config: Self.config) { proxy, admin in
            let client = try RawHTTPClient(port: proxy.port)
            defer { client.close() }
            let unknown = try proxied(client, origin.url("/x"), headers: [("Data-Mode-Session", "nope")])
            #expect(unknown.status == 400)
            #expect(unknown.problem?.error == "unknown-session")
            #expect(try admin.get("/sessions/nope").status == 404)

            #expect(try admin.put("/sessions/s1", #"{"mode": "constrained"}"#).status == 201)
            #expect(try admin.put("/sessions/s1", #"{"mode": "constrained"}"#).status == 200, "an existing session: 200")
            let forwarded = try proxied(client, origin.url("/allowed"), headers: [("Data-Mode-Session", "s1")])
            #expect(forwarded.status == 200)
            #expect(origin.requests.last?.head.values(of: "save-data") == ["on"], "the session's constrained mode sets Save-Data")
            let twoNames = try proxied(client, origin.url("/x"), headers: [("Data-Mode-Session", "s1"), ("Data-Mode-Session", "s2")])
            #expect(twoNames.status == 400)
            #expect(twoNames.problem?.error == "bad-request")

            #expect(try admin.put("/sessions/s1", #"{"mode": "normal", "profile": "no-such-profile"}"#).errorCode == "unknown-profile")
            #expect(try admin.put("/sessions/s1", #"{"mode": "warp"}"#).status == 400)
            #expect(try admin.put("/sessions/global", #"{"mode": "normal"}"#).status == 400)

            let list = try admin.get("/sessions").object["sessions"] as? [[String: Any]] ?? []
            #expect(list.compactMap { $0["id"] as? String } == ["s1"])
            let deleted = try admin.delete("/sessions/s1")
            #expect(deleted.status == 200)
            #expect(Self.count(deleted.object, "forwarded") == 1, "DELETE answers the final counters")
            let gone = try proxied(client, origin.url("/x"), headers: [("Data-Mode-Session", "s1")])
            #expect(gone.problem?.error == "unknown-session")
            #expect(try admin.put("/sessions/s1", #"{"mode": "normal"}"#).status == 201, "a new session of the same id")
            #expect(try admin.get("/sessions/s1").object["requestsTotal"] as? Int == 0, "counts from zero")
        }
    }

    @Test("the last 100 rejected URLs, oldest first")
    func lastHundredRejected() throws {
        let origin = try RecordingOrigin()
        defer { origin.stop() }
        try withAdminProxy(config: Self.config) { proxy, admin in
            #expect(try admin.put("/sessions/many", #"{"mode": "constrained"}"#).status == 201)
            let statuses = try Self.runRig(proxyPort: proxy.port, origin: origin, session: "many", count: 130)
            #expect(statuses.allSatisfy { $0 == 403 })
            let document = try admin.get("/sessions/many").object
            #expect(Self.count(document, "rejected", "constrained") == 130)
            let urls = (document["rejected"] as? [[String: Any]] ?? []).compactMap { $0["url"] as? String }
            #expect(urls == (30..<130).map { origin.url("/many/\($0)") })
        }
    }

    @Test("sessions off: the header is ignored but still never forwarded; PUT /sessions/{id} is 409 sessions-disabled")
    func disabled() throws {
        let origin = try RecordingOrigin()
        defer { origin.stop() }
        try withAdminProxy { proxy, admin in
            let client = try RawHTTPClient(port: proxy.port)
            defer { client.close() }
            let response = try proxied(client, origin.url("/x"), headers: [("Data-Mode-Session", "whatever")])
            #expect(response.status == 200)
            #expect(origin.requests.first?.head.values(of: "data-mode-session").isEmpty == true)
            #expect(try admin.get("/sessions").object["enabled"] as? Bool == false)
            // SPEC §12: a rig must not believe it has a session that nothing honours.
            let refused = try admin.put("/sessions/whatever", #"{"mode": "constrained"}"#)
            #expect(refused.status == 409 && refused.errorCode == "sessions-disabled", "\(refused.bodyText)")
            #expect(refused.mediaType == "application/problem+json")
            #expect(try admin.get("/sessions/whatever").status == 404)
            #expect((try admin.get("/sessions").object["sessions"] as? [Any])?.isEmpty == true)
        }
    }

    @Test("from-proxy-user: the user names the session; another header is 400")
    func proxyUser() throws {
        let origin = try RecordingOrigin()
        defer { origin.stop() }
        let config = "sessions: {enabled: true, from-proxy-user: true}\naccess: {users: {alice: secret, bob: hunter2}}\n"
        try withAdminProxy(config: config) { proxy, admin in
            #expect(try admin.put("/sessions/alice", #"{"mode": "constrained"}"#).status == 201)
            let client = try RawHTTPClient(port: proxy.port)
            defer { client.close() }
            let alice = ("Proxy-Authorization", "Basic " + Data("alice:secret".utf8).base64EncodedString())
            let bob = ("Proxy-Authorization", "Basic " + Data("bob:hunter2".utf8).base64EncodedString())
            #expect(try proxied(client, origin.url("/a"), headers: [alice, ("Allow-Constrained", "?0")]).status == 403)
            #expect(try proxied(client, origin.url("/b"), headers: [bob, ("Allow-Constrained", "?0")]).status == 200,
                    "a user without a session is judged by the global mode")
            let other = try proxied(client, origin.url("/c"), headers: [alice, ("Data-Mode-Session", "bob")])
            #expect(other.status == 400)
            #expect(other.problem?.error == "bad-request")
            #expect(Self.count(try admin.get("/sessions/alice").object, "rejected", "constrained") == 1)
        }
    }

    @Test("a session without traffic or API calls for idle-expiry is forgotten")
    func idleExpiry() throws {
        try withAdminProxy(config: "sessions: {enabled: true, idle-expiry: 400ms}\n") { _, admin in
            #expect(try admin.put("/sessions/brief", #"{"mode": "expensive"}"#).status == 201)
            let deadline = Date().addingTimeInterval(10)
            var status = 200
            while Date() < deadline {
                Thread.sleep(forTimeInterval: 0.3)
                // Not GET /sessions/brief: reading it is an API call that keeps it alive.
                let list = try admin.get("/sessions").object["sessions"] as? [[String: Any]] ?? []
                if list.isEmpty { status = 404; break }
            }
            #expect(status == 404)
            #expect(try admin.get("/sessions/brief").status == 404)
        }
    }
}
