import DatamodeHTTP
import DatamodeTestSupport
import Testing

/// `RequestTarget.parse` keeps the client's own string as `absoluteURL` when it is already the one spelling
/// (lowercase scheme and host, the port as `hostHeaderValue` writes it, a path), and builds it otherwise. Either
/// way it must be exactly `scheme://hostHeaderValue` + path: on targets made of pieces in every spelling (case,
/// default and explicit ports, leading zeros, empty and query-only paths, IPv6), the kept and the built agree.
///
/// Seeded: `DATAMODE_PARSER_SEED=<n>` replays a run; without it each run picks a seed and prints it.
@Suite struct AbsoluteURLSpellingTests {
    static let seed = SeededGenerator.seed(from: "DATAMODE_PARSER_SEED")

    @Test func theKeptSpellingIsTheBuiltOne() {
        print("AbsoluteURLSpellingTests seed \(Self.seed) (DATAMODE_PARSER_SEED=\(Self.seed) replays it)")
        var rng = SeededGenerator(seed: Self.seed)
        let schemes = ["http", "HTTP", "https", "Https", "hTTp"]
        let hosts = ["example.com", "EXAMPLE.com", "127.0.0.1", "[::1]", "[::ABCD]", "a-b.c", "x"]
        let ports = ["", ":", ":80", ":443", ":080", ":8080", ":00080", ":65535", ":1", ":0443"]
        let paths = ["", "/", "/a?b", "?q", "/1k.bin", "/A%20b", "/?", "//x"]
        var kept = 0
        var failures: [String] = []
        for _ in 0..<20_000 {
            var target = schemes.randomElement(using: &rng)! + "://" + hosts.randomElement(using: &rng)!
                + ports.randomElement(using: &rng)! + paths.randomElement(using: &rng)!
            if Bool.random(using: &rng) {
                // Flip the case of one letter anywhere (the path's case must survive, the scheme's and host's not).
                var bytes = Array(target.utf8)
                let k = Int.random(in: 0..<bytes.count, using: &rng)
                if (0x41...0x5A).contains(bytes[k]) || (0x61...0x7A).contains(bytes[k]) { bytes[k] ^= 0x20 }
                target = String(decoding: bytes, as: UTF8.self)
            }
            guard case .success(let parsed) = RequestTarget.parse(target, method: "GET") else { continue }
            let built = parsed.scheme + "://" + parsed.hostHeaderValue + parsed.path
            if parsed.absoluteURL == target { kept += 1 }
            if parsed.form != .absolute || parsed.absoluteURL != built {
                failures.append("\(target): absoluteURL \(parsed.absoluteURL), built \(built)")
            }
        }
        #expect(failures.isEmpty, "\(failures.prefix(10))")
        #expect(kept > 1_000, "the client's spelling was kept \(kept) times")
    }

    @Test func aDefaultOrPaddedPortIsNotKept() throws {
        for (target, url) in [("http://a:80/x", "http://a/x"), ("http://a:080/x", "http://a/x"),
                              ("http://a:0443/x", "http://a:443/x"), ("HTTP://A:8080/x", "http://a:8080/x"),
                              ("http://a:8080?q", "http://a:8080/?q"), ("http://a:8080/X", "http://a:8080/X")] {
            guard case .success(let parsed) = RequestTarget.parse(target, method: "GET") else {
                Issue.record("\(target) refused")
                continue
            }
            #expect(parsed.absoluteURL == url)
            #expect(parsed.hostHeaderValue == String(url.dropFirst(7).prefix { $0 != "/" && $0 != "?" }))
        }
    }
}
