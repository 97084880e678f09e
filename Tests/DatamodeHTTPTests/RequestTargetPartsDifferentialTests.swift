import DatamodeHTTP
import DatamodeTestSupport
import Testing

/// `RequestTarget.isAbsolute` is the HTTP/2 codec's fast path for `:scheme`, `:authority` and `:path` (SPEC §17):
/// it reads the parts where they are. The reference is what the codec did before, `parse(scheme + "://" +
/// authority + path)` accepted only when its path is the request's. Both run on random and mutated parts; a
/// disagreement is an h2 request whose target would be read one way by the proxy and another by the origin.
///
/// Seeded: `DATAMODE_PARSER_SEED=<n>` replays a run; without it each run picks a seed and prints it.
@Suite struct RequestTargetPartsDifferentialTests {
    static let seed = SeededGenerator.seed(from: "DATAMODE_PARSER_SEED")

    static func reference(_ scheme: String, _ authority: String, _ path: String) -> Bool {
        guard case .success(let target) = RequestTarget.parse(scheme + "://" + authority + path, method: "GET") else {
            return false
        }
        return target.path == path
    }

    static func path(using rng: inout SeededGenerator) -> String {
        var s = Int.random(in: 0..<4, using: &rng) > 0
            ? ["/", "/a/b?c=d&e", "/?q", "/%7Euser/a%20b", "/1k.bin", "/x?y=/z", "//double", "/a:b@c"].randomElement(using: &rng)!
            : ["?q", "", "*", "a/b", "/a#frag"].randomElement(using: &rng)!
        if Int.random(in: 0..<4, using: &rng) == 0 {
            let cut = s.index(s.startIndex, offsetBy: Int.random(in: 0...s.count, using: &rng))
            s.insert(contentsOf: [" ", "#", "\u{7f}", "é", "\0", "%", "?", "/"].randomElement(using: &rng)!, at: cut)
        }
        return s
    }

    static func mutated(_ s: String, using rng: inout SeededGenerator) -> String {
        // One byte replaced by any byte, one time in four.
        rng.mutated(s, junk: [], odds: 4)
    }

    @Test func isAbsoluteAgreesWithParsingTheJoinedURL() {
        print("RequestTargetPartsDifferentialTests seed \(Self.seed) (DATAMODE_PARSER_SEED=\(Self.seed) replays it)")
        var rng = SeededGenerator(seed: Self.seed)
        var failures: [String] = []
        var accepted = 0
        let cases = 20_000
        for _ in 0..<cases {
            // Mostly the schemes the codec is given, sometimes one the parse refuses.
            let scheme = Int.random(in: 0..<4, using: &rng) > 0
                ? "https" : ["http", "HTTPS", "ftp", "https:", ""].randomElement(using: &rng)!
            let authority = Self.mutated(rng.authority(), using: &rng)
            let path = Self.mutated(Self.path(using: &rng), using: &rng)
            let fast = RequestTarget.isAbsolute(scheme: scheme, authority: authority, path: path)
            let reference = Self.reference(scheme, authority, path)
            if fast != reference {
                failures.append("\(scheme.debugDescription) \(authority.debugDescription) \(path.debugDescription): "
                                + "fast \(fast), reference \(reference)")
            }
            if fast { accepted += 1 }
            if failures.count >= 5 { break }
        }
        #expect(failures.isEmpty, "seed \(Self.seed):\n\(failures.joined(separator: "\n"))")
        // Both verdicts must be common, or agreeing proves little.
        #expect(accepted > cases / 10 && accepted < cases * 9 / 10, "accepted \(accepted) of \(cases)")
    }
}
