@testable import DatamodePolicy
import Testing

/// The refusal body is written from a prefix per (conditions, mode) and the URL: it must be byte for byte the
/// document `problem(mode:url:)` describes, for every combination and for URLs that need escaping.
@Suite("Rejection problem body")
struct ProblemBodyTests {
    static let urls = [
        "http://example.com/video/v1.mp4",
        "http://127.0.0.1:8080/a?b=c&d=\"e\"",
        "http://h/back\\slash",
        "http://h/ctl\u{01}\t\n",
        "http://h/ünïcödé/😀",
        "",
    ]

    @Test("equals problem(mode:url:).json for every set of violated conditions, mode and URL")
    func equalsDocument() {
        let conditions = DataCondition.allCases
        for bits in 1..<8 {
            let reasons = conditions.enumerated().filter { bits & (1 << $0.offset) != 0 }.map(\.element)
            let rejection = Rejection(reasons: reasons)
            for modeBits in 0..<8 {
                let mode = DataMode(constrained: modeBits & 1 != 0, expensive: modeBits & 2 != 0,
                                    ultraConstrained: modeBits & 4 != 0)
                for url in Self.urls {
                    let expected = Array(rejection.problem(mode: mode, url: url).json.utf8)
                    #expect(rejection.problemBody(mode: mode, url: url) == expected, "\(reasons) \(mode) \(url)")
                }
            }
        }
    }

    @Test("the body ends with the URL member and is one JSON object")
    func shape() {
        let body = Rejection(reasons: [.constrained]).problemBody(mode: .init(constrained: true, expensive: false),
                                                                    url: "http://x/\"q\"")
        let text = String(decoding: body, as: UTF8.self)
        #expect(text.hasPrefix("{\"type\":\"urn:datamode:constrained\""))
        #expect(text.hasSuffix(",\"url\":\"http://x/\\\"q\\\"\"}"))
    }
}

@Suite("DataMode index")
struct DataModeIndexTests {
    @Test("all[i].index == i for the eight modes, and every mode is among them once")
    func roundTrip() {
        #expect(DataMode.all.count == 8)
        for (i, mode) in DataMode.all.enumerated() { #expect(mode.index == i) }
        #expect(Set(DataMode.all).count == 8)
        #expect(DataMode.normal.index == 0)
    }
}
