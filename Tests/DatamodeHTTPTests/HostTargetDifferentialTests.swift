import DatamodeHTTP
import DatamodeTestSupport
import Testing

/// `RequestTarget.httpOnHost` is the transparent listener's fast path for `GET /path` + `Host` (SPEC §16): it reads
/// the Host value as an authority and keeps the path it was given. The reference is what the listener did before,
/// `parse("http://" + host + path)` kept only when its path is the request's. Both run on random and mutated Host
/// values and paths; a disagreement is a Host that could steer a request's URL differently from what was checked.
///
/// Seeded: `DATAMODE_PARSER_SEED=<n>` replays a run; without it each run picks a seed and prints it.
@Suite struct HostTargetDifferentialTests {
    static let seed = SeededGenerator.seed(from: "DATAMODE_PARSER_SEED")

    static func reference(_ host: String, _ origin: RequestTarget) -> RequestTarget? {
        guard case .success(let absolute) = RequestTarget.parse("http://" + host + origin.path, method: "GET"),
              absolute.form == .absolute, absolute.path == origin.path else { return nil }
        return absolute
    }

    static func path(using rng: inout SeededGenerator) -> String {
        ["/", "/a/b?c=d&e", "/?q", "/%7Euser/a%20b", "/1k.bin", "/x?y=/z", "//double", "/a:b@c"].randomElement(using: &rng)!
    }

    @Test func httpOnHostAgreesWithParsingTheJoinedURL() {
        print("HostTargetDifferentialTests seed \(Self.seed) (DATAMODE_PARSER_SEED=\(Self.seed) replays it)")
        var rng = SeededGenerator(seed: Self.seed)
        var failures: [String] = []
        var accepted = 0
        let cases = 20_000
        for _ in 0..<cases {
            // Mutation: one byte replaced by any byte, one time in four.
            let host = rng.mutated(rng.authority(), junk: [], odds: 4)
            guard case .success(let origin) = RequestTarget.parse(Self.path(using: &rng), method: "GET") else {
                Issue.record("the test's paths must parse"); return
            }
            let fast = RequestTarget.httpOnHost(host, origin: origin)
            let reference = Self.reference(host, origin)
            if fast != reference {
                failures.append("Host \(host.debugDescription) path \(origin.path): fast \(String(describing: fast)), "
                                + "reference \(String(describing: reference))")
            }
            if fast != nil { accepted += 1 }
            if failures.count >= 5 { break }
        }
        #expect(failures.isEmpty, "seed \(Self.seed):\n\(failures.joined(separator: "\n"))")
        // Both verdicts must be common, or agreeing proves little.
        #expect(accepted > cases / 10 && accepted < cases * 9 / 10, "accepted \(accepted) of \(cases)")
    }

    @Test func onlyAnOriginFormTargetIsMadeAbsolute() {
        guard case .success(let absolute) = RequestTarget.parse("http://example.com/x", method: "GET") else {
            Issue.record("parse"); return
        }
        #expect(RequestTarget.httpOnHost("example.com", origin: absolute) == nil)
    }
}
