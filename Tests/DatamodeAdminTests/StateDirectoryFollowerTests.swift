import DatamodeAdmin
import DatamodePolicy
import Foundation
import Testing

/// `AdminAPI.followStateDirectory` (SPEC §19 `store.kind: file`): what another process writes to the state
/// directory is applied as the matching admin write would be; a malformed file is refused and the running state
/// kept. Socket-free: the watch that calls it lives in the instance (tested end to end).
@Suite("Admin: following the state directory")
struct StateDirectoryFollowerTests {
    static let yaml = """
        mode: normal
        profiles:
          my-sat: {down: 2Mbit, up: 256kbit, latency: 600ms, jitter: 20ms}
        """

    /// Writes `text` to `name` in the fixture's state directory as a careful writer does: a temporary, renamed.
    static func write(_ admin: AdminFixture, _ name: String, _ text: String) throws {
        let path = admin.store.directory + "/" + name
        try text.write(toFile: path + ".incoming", atomically: false, encoding: .utf8)
        #expect(rename(path + ".incoming", path) == 0)
    }

    @Test("A mode written by another process is put in force with its since, as PUT /mode would; removing it returns to the config mode")
    func mode() throws {
        let admin = try AdminFixture(Self.yaml)
        #expect(admin.api.followStateDirectory() == StateFollowOutcome(), "nothing written: nothing to apply")
        try Self.write(admin, "mode.json", #"{"mode": "constrained", "since": 1767225700}"#)
        let outcome = admin.api.followStateDirectory()
        #expect(outcome.applied == ["mode.json"] && outcome.refused.isEmpty, "\(outcome)")
        #expect(admin.snapshot.mode == DataMode(name: "constrained") && admin.snapshot.modeSource == .api)
        #expect(admin.snapshot.modeSince == 1_767_225_700)
        #expect(admin.emitted.value.contains { $0.text.contains("event: mode") && $0.text.contains("constrained") })
        // Seen again (another event in the directory): not a change.
        #expect(admin.api.followStateDirectory() == StateFollowOutcome())

        try FileManager.default.removeItem(atPath: admin.store.modePath)
        #expect(admin.api.followStateDirectory().applied == ["mode.json"])
        #expect(admin.snapshot.mode == .normal && admin.snapshot.modeSource == .config)
    }

    @Test("The proxy's own PUT, seen again in the directory, changes nothing")
    func ownWrite() throws {
        let admin = try AdminFixture(Self.yaml)
        #expect(admin.handle("PUT", "/mode", #"{"mode": "expensive"}"#).status == 200)
        #expect(admin.handle("PUT", "/conditions", #"{"profile": "my-sat"}"#).status == 200)
        let before = admin.emitted.value.count
        #expect(admin.api.followStateDirectory() == StateFollowOutcome())
        #expect(admin.emitted.value.count == before)
    }

    @Test("A malformed file is refused, the running state kept, and refused once, not at every later look",
          arguments: [("mode.json", "garbage"), ("mode.json", #"{"mode": "warp-speed"}"#), ("mode.json", ""),
                      ("conditions.json", #"{"profile": "no-such-link"}"#), ("conditions.json", #"{"profile": 7}"#),
                      ("variants.json", #"{"variants": [{"id": "a"}]}"#),
                      ("variants.json", #"{"variants": [{"id": "a", "match": "http://a.example/*/*", "target": "http://b.example/$3"}]}"#)])
    func refused(file: String, contents: String) throws {
        let admin = try AdminFixture(Self.yaml)
        #expect(admin.handle("PUT", "/mode", #"{"mode": "constrained"}"#).status == 200)
        #expect(admin.handle("PUT", "/conditions", #"{"profile": "my-sat"}"#).status == 200)
        let before = admin.snapshot
        try Self.write(admin, file, contents)
        let outcome = admin.api.followStateDirectory()
        #expect(outcome.refused == [file] && outcome.applied.isEmpty, "\(outcome)")
        #expect(admin.snapshot.mode == before.mode && admin.snapshot.apiProfile == "my-sat")
        #expect(admin.snapshot.policy.variants.count == before.policy.variants.count)
        #expect(admin.api.followStateDirectory() == StateFollowOutcome())
    }

    @Test("A link profile and API variants written by another process are put in force")
    func profileAndVariants() throws {
        let admin = try AdminFixture(Self.yaml)
        try Self.write(admin, "conditions.json", #"{"profile": "my-sat"}"#)
        try Self.write(admin, "variants.json", """
            {"variants": [{"id": "small", "match": "http://img.example/*.jpg", "target": "http://img.example/$1-s.jpg", "when": "constrained"}]}
            """)
        let outcome = admin.api.followStateDirectory()
        #expect(Set(outcome.applied) == ["conditions.json", "variants.json"] && outcome.refused.isEmpty, "\(outcome)")
        #expect(admin.snapshot.apiProfile == "my-sat")
        #expect(admin.snapshot.policy.variants.map(\.id) == ["small"])
        #expect(admin.snapshot.policy.variants.first?.source == .api)
        let listed = admin.handle("GET", "/variants").text
        #expect(listed.contains("\"small\"") && listed.contains("\"api\""), "\(listed)")

        try FileManager.default.removeItem(atPath: admin.store.variantsPath)
        try FileManager.default.removeItem(atPath: admin.store.conditionsPath)
        #expect(Set(admin.api.followStateDirectory().applied) == ["conditions.json", "variants.json"])
        #expect(admin.snapshot.apiProfile == nil && admin.snapshot.policy.variants.isEmpty)
    }
}
