@testable import DatamodeHTTP
import DatamodeTestSupport
import Testing

/// `RequestTarget.canonicalAbsolute` is `parse`'s shortcut for a target already in its one spelling (what a forward
/// proxy's clients send nearly always): one pass, `spelled` kept as the URL and the authority as the `Host`. The
/// reference is `parseInFull`, every check and the spelling rebuilt. Both run on random targets built from parts
/// (schemes, hosts and ports in and out of their one spelling, paths with and without a query) and on mutated ones;
/// where the shortcut answers, the full parse must give the same target, and where it does not, `parse` is
/// `parseInFull` by construction.
///
/// Seeded: `DATAMODE_PARSER_SEED=<n>` replays a run; without it each run picks a seed and prints it.
@Suite struct CanonicalTargetDifferentialTests {
    static let seed = SeededGenerator.seed(from: "DATAMODE_PARSER_SEED")

    /// Half the time every part is in its one spelling (the shortcut's case), else any part may not be; then one
    /// in two is broken further (`mutated`).
    static func target(using rng: inout SeededGenerator) -> String {
        let usual = Bool.random(using: &rng)
        let schemes = usual ? ["http://", "https://"]
            : ["http://", "https://", "HTTP://", "Http://", "ftp://", "http:/", "http:", "https//", ""]
        let authorities = ["127.0.0.1:46313", "example.com", "a", "a.example:8443", "192.0.2.1:1", "x-y_z~w.example",
                           "!$&'()*+,;=:65535", "b:9"]
        let paths = usual ? ["/", "/1k.bin", "/a/b?c=d&e", "//double", "/a:b@c", "/%7Euser"]
            : ["/", "/1k.bin", "/a/b?c=d&e", "?q", "", "/x#y", "/%7Euser", "/a b", "/é", "//double", "/a:b@c"]
        let authority = usual ? authorities.randomElement(using: &rng)! : rng.authority()
        let target = schemes.randomElement(using: &rng)! + authority + paths.randomElement(using: &rng)!
        return rng.mutated(target, junk: ["@", ":", "/", "?", "#", "%41", "A", "0", ":80", ":443", "\u{0}"], odds: 4)
    }

    @Test func theShortcutAgreesWithTheFullParse() {
        print("CanonicalTargetDifferentialTests seed \(Self.seed) (DATAMODE_PARSER_SEED=\(Self.seed) replays it)")
        var rng = SeededGenerator(seed: Self.seed)
        var failures: [String] = []
        var taken = 0
        let cases = 40_000
        for _ in 0..<cases {
            let target = Self.target(using: &rng)
            let inFull = RequestTarget.parseInFull(target, method: "GET")
            let shortcut = target.withUTF8Bytes { RequestTarget.canonicalAbsolute($0, spelled: target) }
            if let shortcut {
                taken += 1
                if inFull != .success(shortcut) {
                    failures.append("\(target.debugDescription): shortcut \(shortcut), in full \(inFull)")
                }
            }
            if RequestTarget.parse(target, method: "GET") != inFull {
                failures.append("\(target.debugDescription): parse differs from parseInFull")
            }
            if failures.count >= 5 { break }
        }
        #expect(failures.isEmpty, "seed \(Self.seed):\n\(failures.joined(separator: "\n"))")
        // The shortcut must be taken often and declined often, or agreeing proves little.
        #expect(taken > cases / 20 && taken < cases * 9 / 10, "shortcut taken \(taken) of \(cases)")
    }

    @Test func aForwardProxysUsualTargetsTakeTheShortcut() {
        for target in ["http://127.0.0.1:46313/1k.bin", "http://example.com/", "https://a.example:8443/x?y=1"] {
            let shortcut = target.withUTF8Bytes { RequestTarget.canonicalAbsolute($0, spelled: target) }
            #expect(shortcut != nil && RequestTarget.parseInFull(target, method: "GET") == .success(shortcut!), "\(target)")
        }
        // Not in their one spelling: the full parse rewrites them.
        for target in ["http://Example.com/", "http://a:80/", "http://a:0080/", "http://a", "http://a?q", "http://%61/",
                       "http://[::1]/", "http://u@a/", "HTTP://a/"] {
            #expect(target.withUTF8Bytes { RequestTarget.canonicalAbsolute($0, spelled: target) } == nil, "\(target)")
        }
        // CONNECT is authority-form only, whatever the target looks like.
        #expect(RequestTarget.parse("http://a:80/", method: "CONNECT") == RequestTarget.parseInFull("http://a:80/", method: "CONNECT"))
    }
}
