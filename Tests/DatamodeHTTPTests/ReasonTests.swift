import DatamodeHTTP
import Testing

/// The `.malformed` reason ends up in the problem detail. Several checks overlap (a line starting with SP is also
/// an empty name; '@' is also not a host character), so these rows pin the specific diagnosis.
@Suite("Refusal reasons")
struct ReasonTests {
    static func reason<H>(_ r: HeadParseResult<H>) -> String? {
        if case .invalid(.malformed(let s)) = r { return s }
        return nil
    }

    static func reason<T>(_ r: Result<T, HTTPWireError>) -> String? {
        if case .failure(.malformed(let s)) = r { return s }
        return nil
    }

    static let cases: [Row<String, String>] = [
        Row("obs-fold", reason(parseRequest(request(["A: b", " c"]))) ?? "", "obs-fold"),
        Row("space before colon", reason(parseRequest(request(["A : b"]))) ?? "", "before colon"),
        Row("NUL", reason(parseRequest(request(["A: \0"]))) ?? "", "NUL"),
        Row("bare LF", reason(parseRequest("GET / HTTP/1.1\r\nA: b\n\r\n")) ?? "", "bare LF"),
        Row("userinfo", reason(RequestTarget.parse("http://u@h/", method: "GET")) ?? "", "userinfo"),
        Row("fragment", reason(RequestTarget.parse("http://h/#f", method: "GET")) ?? "", "fragment"),
        Row("scheme", reason(RequestTarget.parse("ftp://h/", method: "GET")) ?? "", "unsupported scheme"),
        Row("CL+TE", reason(requestHead(["Content-Length: 1", "Transfer-Encoding: chunked"])!.bodyFraming()) ?? "",
            "both Transfer-Encoding and Content-Length"),
        Row("CL.CL", reason(requestHead(["Content-Length: 1, 2"])!.bodyFraming()) ?? "", "conflicting Content-Length"),
    ]

    @Test(arguments: cases)
    func reasonNamesTheProblem(_ row: Row<String, String>) {
        #expect(row.input.contains(row.expected), "\(row.name): \(row.input)")
    }
}
