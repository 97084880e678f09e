import DatamodePolicy
import DatamodeTestSupport
import Testing

/// The engine hands `decide` only the fields `PolicySnapshot.readsField` names (not a copy of every field). That is
/// only right if no decision depends on another field: on random requests whose fields mix the client's tags (valid
/// and not), prefetch markers, the names rules match on and others, in every case, under policies with and
/// without header criteria, deciding on the read fields gives the same decision and provenance as on all of them.
///
/// Seeded: `DATAMODE_MODEL_SEED=<n>` replays a run; without it each run picks a seed and prints it.
@Suite struct FieldsReadTests {
    static let seed = SeededGenerator.seed(from: "DATAMODE_MODEL_SEED")

    @Test func decidingOnTheFieldsReadIsDecidingOnAll() throws {
        print("FieldsReadTests seed \(Self.seed) (DATAMODE_MODEL_SEED=\(Self.seed) replays it)")
        var rng = SeededGenerator(seed: Self.seed)
        let policies = [
            try PolicySnapshot(tags: TagSettings(), rules: [], variants: []),
            try PolicySnapshot(tags: TagSettings(), rules: [
                Rule(name: "save", match: RuleMatch(header: ["Save-Data": "on"]), tags: TagAssignment(allowConstrained: false)),
                Rule(name: "agent", match: RuleMatch(header: ["user-agent": "*bot*"]), tags: TagAssignment(allowExpensive: false),
                     override: true),
                Rule(name: "video", match: RuleMatch(path: "*.mp4"), tags: TagAssignment(allowConstrained: false)),
            ], variants: []),
        ]
        let names = ["Allow-Constrained", "allow-expensive", "ALLOW-ULTRA-CONSTRAINED", "Purpose", "sec-purpose", "X-Moz",
                     "Save-Data", "save-data", "User-Agent", "Accept", "Host", "Via", "Allow-Constrainedx", "Purposes"]
        let values = ["?0", "?1", "?2", "", "on", "prefetch", "Prefetch;anonymous", "mybot/1", "curl/8", "?1, ?0", "x"]
        var differing = 0
        var failures: [String] = []
        for _ in 0..<20_000 {
            let fields = (0..<Int.random(in: 0...6, using: &rng)).map { _ in
                (name: names.randomElement(using: &rng)!, value: values.randomElement(using: &rng)!)
            }
            let policy = policies.randomElement(using: &rng)!
            let mode: DataMode = [[], .constrained, .expensive, [.constrained, .expensive]].randomElement(using: &rng)!
            let path = ["/a.mp4", "/b.jpg"].randomElement(using: &rng)!
            let all = RequestFacts(method: "GET", url: "http://h.example" + path, host: "h.example", port: 80, path: path,
                                   fields: fields)
            var read = all
            read.fields = fields.filter { policy.readsField($0.name) }
            if read.fields.count != fields.count { differing += 1 }
            var provenanceAll = TagProvenance(), provenanceRead = TagProvenance()
            let decisionAll = decide(all, mode: mode, policy: policy, provenance: &provenanceAll)
            let decisionRead = decide(read, mode: mode, policy: policy, provenance: &provenanceRead)
            if decisionAll != decisionRead || provenanceAll != provenanceRead {
                failures.append("\(fields) in \(mode): \(decisionAll) / \(decisionRead)")
                if failures.count >= 5 { break }
            }
        }
        #expect(failures.isEmpty, "seed \(Self.seed):\n\(failures.joined(separator: "\n"))")
        #expect(differing > 10_000, "requests with fields the policy does not read: \(differing)")
    }
}
