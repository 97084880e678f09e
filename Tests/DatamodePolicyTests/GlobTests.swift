@testable import DatamodePolicy
import Testing

@Suite("Globs")
struct GlobTests {
    struct Row: Sendable, CustomStringConvertible {
        var pattern: String
        var text: String
        var caseInsensitive: Bool
        /// nil: no match
        var captures: [String]?
        var description: String { "\(pattern) ~ \(text)\(caseInsensitive ? " (ci)" : "")" }
    }

    static let rows: [Row] = [
        Row(pattern: "http://cdn.example/img/*.jpg", text: "http://cdn.example/img/a.b.jpg", caseInsensitive: false,
            captures: ["a.b"]),
        Row(pattern: "http://cdn.example/img/*.jpg", text: "http://cdn.example/img/.jpg", caseInsensitive: false,
            captures: [""]),
        Row(pattern: "http://cdn.example/img/*.jpg", text: "http://cdn.example/img/a.jpg?v=1", caseInsensitive: false,
            captures: nil),
        Row(pattern: "http://cdn.example/img/*.jpg", text: "http://cdn.example/IMG/a.jpg", caseInsensitive: false,
            captures: nil),
        Row(pattern: "http://cdn.example/img/*", text: "http://cdn.example/img/a/b.jpg?v=1", caseInsensitive: false,
            captures: ["a/b.jpg?v=1"]),
        Row(pattern: "http://*.example/*/*.mp4", text: "http://media.example/v/2024/clip.mp4", caseInsensitive: false,
            captures: ["media", "v", "2024/clip"]),
        Row(pattern: "*", text: "", caseInsensitive: false, captures: [""]),
        Row(pattern: "*", text: "anything", caseInsensitive: false, captures: ["anything"]),
        Row(pattern: "**", text: "ab", caseInsensitive: false, captures: ["", "ab"]),
        Row(pattern: "a*b*c", text: "abc", caseInsensitive: false, captures: ["", ""]),
        Row(pattern: "a*b*c", text: "axbybzc", caseInsensitive: false, captures: ["x", "ybz"]),
        Row(pattern: "a*a", text: "a", caseInsensitive: false, captures: nil),   // prefix and suffix may not overlap
        Row(pattern: "a*a", text: "aa", caseInsensitive: false, captures: [""]),
        Row(pattern: "ab*ba", text: "aba", caseInsensitive: false, captures: nil),
        Row(pattern: "*.mp4", text: "/videos/a.mp4", caseInsensitive: true, captures: ["/videos/a"]),
        Row(pattern: "*.mp4", text: "/videos/A.MP4", caseInsensitive: true, captures: ["/videos/A"]),
        Row(pattern: "*.MP4", text: "/videos/a.mp4", caseInsensitive: true, captures: ["/videos/a"]),
        Row(pattern: "*.mp4", text: "/videos/a.mp4x", caseInsensitive: true, captures: nil),
        Row(pattern: "*.video.example", text: "a.video.example", caseInsensitive: true, captures: ["a"]),
        Row(pattern: "*.video.example", text: "video.example", caseInsensitive: true, captures: nil),
        Row(pattern: "*.video.example", text: "x.y.VIDEO.example", caseInsensitive: true, captures: ["x.y"]),
        Row(pattern: "exact.example", text: "exact.example", caseInsensitive: true, captures: []),
        Row(pattern: "exact.example", text: "exact.example.", caseInsensitive: true, captures: nil),
        Row(pattern: "exact.example", text: "Exact.Example", caseInsensitive: false, captures: nil),
        Row(pattern: "", text: "", caseInsensitive: false, captures: []),
        Row(pattern: "", text: "x", caseInsensitive: false, captures: nil),
        Row(pattern: "/a/*/c/*", text: "/a/b/c/d/c/e", caseInsensitive: false, captures: ["b", "d/c/e"]),
        Row(pattern: "/é/*", text: "/é/ü", caseInsensitive: true, captures: ["ü"]),
    ]

    @Test(arguments: rows)
    func matchesAndCaptures(row: Row) {
        let glob = Glob(row.pattern, caseInsensitive: row.caseInsensitive)
        #expect(glob.matches(row.text) == (row.captures != nil))
        #expect(glob.captures(in: row.text)?.map(String.init) == row.captures)
    }

    @Test func countsStarsAndLiteralPrefix() {
        let glob = Glob("http://*.example/*/*.mp4", caseInsensitive: false)
        #expect(glob.starCount == 3)
        #expect(!glob.isLiteral)
        #expect(glob.literalPrefix == "http://")
        #expect(Glob("http://cdn.example/", caseInsensitive: false).isLiteral)
    }
}
