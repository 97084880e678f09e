import DatamodeHTTP
import Testing

/// SPEC §6 limits: request line 414, header section 431 (size and count), enforced at the exact boundary
/// and while the head is still incomplete.
@Suite("Head size limits")
struct LimitTests {
    static let limits = HTTPLimits(requestLine: 64, headerSection: 100, headerCount: 3)

    /// A request line of exactly `length` bytes (CRLF excluded).
    static func requestLine(length: Int) -> String {
        let fixed = "GET /".utf8.count + " HTTP/1.1".utf8.count
        return "GET /" + String(repeating: "a", count: length - fixed) + " HTTP/1.1"
    }

    @Test func requestLineOfExactlyTheLimitPasses() {
        let line = Self.requestLine(length: 64)
        #expect(line.utf8.count == 64)
        #expect(Verdict(parseRequest(line + "\r\n\r\n", limits: Self.limits)) == .complete(length: 68))
    }

    @Test func requestLineOneByteOverFails() {
        let line = Self.requestLine(length: 65)
        #expect(Verdict(parseRequest(line + "\r\n\r\n", limits: Self.limits)) == .requestLineTooLong)
    }

    @Test func leadingEmptyLinesDoNotCountTowardsTheRequestLine() {
        let text = "\r\n\r\n" + Self.requestLine(length: 64) + "\r\n\r\n"
        #expect(Verdict(parseRequest(text, limits: Self.limits)) == .complete(length: 72))
    }

    /// "No CRLF within requestLine+2 bytes" is detected without waiting for the line to end.
    @Test(arguments: [
        (64, Verdict.incomplete),           // could still end with CRLF right here
        (65, Verdict.requestLineTooLong),   // 65 content bytes: already too long
    ])
    func requestLineTooLongWhileIncomplete(_ contentBytes: Int, _ expected: Verdict) {
        let partial = "GET /" + String(repeating: "a", count: contentBytes - 5)
        #expect(Verdict(parseRequest(partial, limits: Self.limits)) == expected)
    }

    @Test func exactLimitLineWithCROnlyIsIncomplete() {
        let partial = Self.requestLine(length: 64) + "\r"
        #expect(Verdict(parseRequest(partial, limits: Self.limits)) == .incomplete)
    }

    @Test func statusLineIsBoundedToo() {
        let reasonFor = { (n: Int) in String(repeating: "r", count: n - "HTTP/1.1 200 ".utf8.count) }
        #expect(Verdict(parseResponse("HTTP/1.1 200 " + reasonFor(64) + "\r\n\r\n", limits: Self.limits)) == .complete(length: 68))
        #expect(Verdict(parseResponse("HTTP/1.1 200 " + reasonFor(65) + "\r\n\r\n", limits: Self.limits)) == .requestLineTooLong)
        #expect(Verdict(parseResponse("HTTP/1.1 200 " + reasonFor(65), limits: Self.limits)) == .requestLineTooLong)
    }

    @Test(arguments: [(3, true), (4, false)])
    func headerCountBoundary(_ count: Int, _ passes: Bool) {
        let fields = (0..<count).map { "F\($0): v" }
        let text = request(fields)
        let expected: Verdict = passes ? .complete(length: text.utf8.count) : .headerSectionTooLarge
        #expect(Verdict(parseRequest(text, limits: Self.limits)) == expected)
    }

    @Test func headerCountExceededWhileIncomplete() {
        // Three fields are complete; the first byte of a fourth field line is enough to refuse.
        let text = "GET / HTTP/1.1\r\nA: 1\r\nB: 2\r\nC: 3\r\nD"
        #expect(Verdict(parseRequest(text, limits: Self.limits)) == .headerSectionTooLarge)
        #expect(Verdict(parseRequest("GET / HTTP/1.1\r\nA: 1\r\nB: 2\r\nC: 3\r\n", limits: Self.limits)) == .incomplete)
    }

    /// The header section is everything after the request line through the final CRLF.
    static func section(size: Int) -> String {
        // "X: " + value + CRLF + CRLF
        let value = String(repeating: "v", count: size - 7)
        return "X: " + value + "\r\n\r\n"
    }

    @Test(arguments: [(100, true), (101, false)])
    func headerSectionSizeBoundary(_ size: Int, _ passes: Bool) {
        let line = "GET / HTTP/1.1\r\n"
        let text = line + Self.section(size: size)
        #expect(text.utf8.count - line.utf8.count == size)
        let expected: Verdict = passes ? .complete(length: text.utf8.count) : .headerSectionTooLarge
        #expect(Verdict(parseRequest(text, limits: Self.limits)) == expected)
    }

    @Test func headerSectionTooLargeWhileIncomplete() {
        let line = "GET / HTTP/1.1\r\n"
        // 100 section bytes without the end of the section: it can no longer end within the limit.
        let partial = line + "X: " + String(repeating: "v", count: 97)
        #expect(Verdict(parseRequest(partial, limits: Self.limits)) == .headerSectionTooLarge)
        let shorter = line + "X: " + String(repeating: "v", count: 96)
        #expect(Verdict(parseRequest(shorter, limits: Self.limits)) == .incomplete)
    }

    @Test func defaultsMatchSpec() {
        let d = HTTPLimits()
        #expect(d.requestLine == 8 * 1024 && d.headerSection == 64 * 1024 && d.headerCount == 100)
        let line = "GET /" + String(repeating: "a", count: 8 * 1024) + " HTTP/1.1\r\n\r\n"
        #expect(Verdict(parseRequest(line)) == .requestLineTooLong)
        let many = request((0..<101).map { "F\($0): v" })
        #expect(Verdict(parseRequest(many)) == .headerSectionTooLarge)
    }
}
