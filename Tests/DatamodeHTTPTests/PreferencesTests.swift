import DatamodeHTTP
import Testing

/// `Prefer` (RFC 7240) as far as SPEC §18 acts on it: `wait=N` and `respond-async`, the first of each counting,
/// anything malformed ignored.
@Suite struct PreferencesTests {
    @Test(arguments: [
        ([], Preferences()),
        (["wait=10"], Preferences(wait: 10)),
        (["respond-async, wait=100"], Preferences(wait: 100, respondAsync: true)),
        (["Respond-Async", "WAIT = 5"], Preferences(wait: 5, respondAsync: true)),
        (["wait=\"7\""], Preferences(wait: 7)),
        (["wait=3;foo=bar, handling=lenient"], Preferences(wait: 3)),
        (["wait=4", "wait=9"], Preferences(wait: 4)),              // RFC 7240 §2: the first instance counts
        (["wait=x, wait=9"], Preferences()),                       // the first is malformed: no wait at all
        (["wait=-1"], Preferences()),
        (["wait="], Preferences()),
        (["wait"], Preferences()),
        (["wait=1.5"], Preferences()),
        (["wait=99999999999999999999"], Preferences(wait: Preferences.maximumWait)),
        (["return=minimal; x=\"a,respond-async\""], Preferences()),  // a comma inside quotes splits nothing
        (["respond-async;x=1"], Preferences(respondAsync: true)),
    ] as [([String], Preferences)])
    func parses(values: [String], expected: Preferences) {
        #expect(Preferences.parse(values) == expected)
    }
}
