import DatamodeConfig
@testable import DatamodeEngine
import DatamodePolicy
import DatamodeState
import Testing

/// Sessions are counted by slot (SPEC §12 counters without hashing the id per request): a slot outlives the session
/// that held it, so these pin down what happens when one is reused while a request of the old session is in flight.
@Suite("Session tallies by slot")
struct SessionTallySlotTests {
    static func scope(serial: UInt64, slot: Int) -> SessionScope {
        SessionScope(mode: DataMode(constrained: true, expensive: false), profile: nil, modeSource: .api, since: 0, serial: serial, slot: slot)
    }

    static func member(_ id: String, _ scope: SessionScope) -> SessionMembership {
        SessionMembership(id: id, slot: scope.slot, serial: scope.serial, profile: nil)
    }

    @Test("the lowest free slot goes to a new session; a deleted session's slot is handed out again")
    func freeSlots() throws {
        let configuration = try ProxyConfiguration.parse(yaml: "", source: "test.yaml", baseDirectory: "/")
        var snapshot = RuntimeSnapshot(configuration: configuration,
                                       policy: try ConfigurationSnapshot(configuration: configuration).policy,
                                       mode: .normal, modeSource: .default, modeSince: 0)
        #expect(snapshot.freeSessionSlot() == 0)
        snapshot.sessions = ["a": Self.scope(serial: 1, slot: 0), "b": Self.scope(serial: 2, slot: 1),
                             "c": Self.scope(serial: 3, slot: 2)]
        #expect(snapshot.freeSessionSlot() == 3)
        snapshot.sessions["b"] = nil
        #expect(snapshot.freeSessionSlot() == 1)
        snapshot.sessions["a"] = nil
        #expect(snapshot.freeSessionSlot() == 0)
    }

    @Test("counts by slot; a late request of a deleted session never lands in the next holder of its slot")
    func slotReuse() {
        let tallies = WorkerSessionTallies()
        let old = Self.scope(serial: 1, slot: 4)
        tallies.record(Self.member("old", old), outcomeReason: 0, bytesIn: 10, bytesOut: 20, variant: nil, rejected: nil, now: 5)
        #expect(tallies.tallies["old"]?.bytesOut == 20)
        #expect(tallies.tallies["old"]?.requestCount == 1)

        // "old" is deleted and "new" takes slot 4; the worker prunes on its next snapshot.
        let new = Self.scope(serial: 2, slot: 4)
        tallies.prune(keeping: ["new": new])
        #expect(tallies.tallies.isEmpty)
        tallies.record(Self.member("new", new), outcomeReason: 0, bytesIn: 1, bytesOut: 2, variant: "v", rejected: nil, now: 6)
        // A request of "old" still in flight finishes after that.
        tallies.record(Self.member("old", old), outcomeReason: 0, bytesIn: 100, bytesOut: 200, variant: nil, rejected: nil, now: 7)
        let tally = tallies.tallies
        #expect(tally.keys.sorted() == ["new"])
        #expect(tally["new"]?.bytesOut == 2)
        #expect(tally["new"]?.variants == ["v": 1])
        #expect(tally["new"]?.serial == 2)
    }

    @Test("a request of a newer session replaces an older one's counters left in the slot")
    func newerReplacesOlder() {
        let tallies = WorkerSessionTallies()
        tallies.record(Self.member("a", Self.scope(serial: 1, slot: 0)), outcomeReason: 0, bytesIn: 1, bytesOut: 1,
                       variant: nil, rejected: nil, now: 1)
        tallies.record(Self.member("b", Self.scope(serial: 5, slot: 0)), outcomeReason: 0, bytesIn: 3, bytesOut: 3,
                       variant: nil, rejected: ("http://x/", "constrained", 9), now: 2)
        let tally = tallies.tallies
        #expect(tally.keys.sorted() == ["b"])
        #expect(tally["b"]?.rejected == [SessionTally.Rejected(url: "http://x/", error: "constrained", time: 9)])
    }

    @Test("the rejected ring keeps the last 100, oldest first")
    func rejectedRing() {
        let tallies = WorkerSessionTallies()
        let scope = Self.scope(serial: 1, slot: 2)
        for i in 0..<250 {
            tallies.record(Self.member("s", scope), outcomeReason: 0, bytesIn: 0, bytesOut: 0, variant: nil,
                           rejected: ("http://x/\(i)", "constrained", Int64(i)), now: UInt64(i))
        }
        let rejected = tallies.tallies["s"]?.rejected ?? []
        #expect(rejected.count == SessionTally.rejectedLimit)
        #expect(rejected.first?.url == "http://x/150")
        #expect(rejected.last?.url == "http://x/249")
        #expect(tallies.tallies["s"]?.lastSeen == 249)
    }
}
