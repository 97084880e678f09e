import DatamodeHTTP
import Testing

@Suite("Request head parsing")
struct RequestHeadTests {
    @Test func parsesATypicalProxyRequest() throws {
        let text = "GET http://example.com/a?b=1 HTTP/1.1\r\nHost: example.com\r\nUser-Agent:curl/8.0\r\nAccept: \t*/* \t\r\nX-Empty:\r\n\r\nBODY"
        let result = parseRequest(text)
        #expect(Verdict(result) == .complete(length: text.utf8.count - 4))
        let h = try #require(head(result))
        #expect(h.method == "GET")
        #expect(h.target == "http://example.com/a?b=1")
        #expect(h.version == .http11)
        #expect(h.fields == [
            HTTPField(name: "Host", value: "example.com"),
            HTTPField(name: "User-Agent", value: "curl/8.0"),
            HTTPField(name: "Accept", value: "*/*"),
            HTTPField(name: "X-Empty", value: ""),
        ])
    }

    @Test func keepsUTF8ObsTextExactly() throws {
        let h = try #require(head(parseRequest("GET / HTTP/1.0\r\nX-Name: café ☕\r\n\r\n")))
        #expect(h.version == .http10)
        #expect(h.values(of: "x-name") == ["café ☕"])
    }

    /// Each row is a whole valid head: it must parse complete with `length` = all of it.
    static let valid: [Row<String, Void>] = [
        Row("one leading CRLF ignored", "\r\nGET / HTTP/1.1\r\n\r\n", ()),
        Row("eight leading CRLFs ignored", String(repeating: "\r\n", count: 8) + "GET / HTTP/1.1\r\n\r\n", ()),
        Row("no fields", "OPTIONS * HTTP/1.1\r\n\r\n", ()),
        Row("tchar method", "M-!#$%&'*+.^_`|~9 / HTTP/1.1\r\n\r\n", ()),
        Row("tchar field name", "GET / HTTP/1.1\r\nX!#$%&'*+-.^_`|~:v\r\n\r\n", ()),
        Row("tab in value", "GET / HTTP/1.1\r\nA: b\tc\r\n\r\n", ()),
        Row("empty value", "GET / HTTP/1.1\r\nA:\r\n\r\n", ()),
        Row("only OWS value", "GET / HTTP/1.1\r\nA: \t \r\n\r\n", ()),
        Row("HTTP/1.0", "GET http://a/ HTTP/1.0\r\nA: b\r\n\r\n", ()),
        Row("target with every visible char but #", "GET /!\"$%&'()*+,-./:;<=>?@[\\]^_`{|}~ HTTP/1.1\r\n\r\n", ()),
    ]

    @Test(arguments: valid)
    func acceptsValid(_ row: Row<String, Void>) {
        #expect(Verdict(parseRequest(row.input)) == .complete(length: row.input.utf8.count), "\(row.name)")
    }

    /// Each row is one class of syntax that two parsers can read differently (SPEC §6: refused with 400).
    static let malformed: [Row<[UInt8], Verdict>] = [
        // request line
        Row("lowercase http version", bytes("GET / http/1.1\r\n\r\n"), .malformed),
        Row("HTTP/2.0 request", bytes("GET / HTTP/2.0\r\n\r\n"), .malformed),
        Row("HTTP/1.2 request", bytes("GET / HTTP/1.2\r\n\r\n"), .malformed),
        Row("HTTP/0.9 (no version)", bytes("GET /\r\n\r\n"), .malformed),
        Row("two spaces after method", bytes("GET  / HTTP/1.1\r\n\r\n"), .malformed),
        Row("two spaces before version", bytes("GET /  HTTP/1.1\r\n\r\n"), .malformed),
        Row("tab as separator", bytes("GET\t/ HTTP/1.1\r\n\r\n"), .malformed),
        Row("leading space", bytes(" GET / HTTP/1.1\r\n\r\n"), .malformed),
        Row("trailing space after version", bytes("GET / HTTP/1.1 \r\n\r\n"), .malformed),
        Row("non-token method", bytes("G(T / HTTP/1.1\r\n\r\n"), .malformed),
        Row("non-ASCII in target", bytes("GET /é HTTP/1.1\r\n\r\n"), .malformed),
        Row("DEL in target", bytes("GET /\u{7F} HTTP/1.1\r\n\r\n"), .malformed),
        Row("NUL in request line", bytes("GET /\0 HTTP/1.1\r\n\r\n"), .malformed),
        Row("bare LF ends request line", bytes("GET / HTTP/1.1\n\r\n"), .malformed),
        Row("bare CR ends request line", bytes("GET / HTTP/1.1\rX\r\n\r\n"), .malformed),
        Row("bare LF as leading empty line", bytes("\nGET / HTTP/1.1\r\n\r\n"), .malformed),
        Row("bare CR as leading empty line", bytes("\rGET / HTTP/1.1\r\n\r\n"), .malformed),
        Row("nine leading CRLFs", bytes(String(repeating: "\r\n", count: 9) + "GET / HTTP/1.1\r\n\r\n"), .malformed),
        // field lines
        Row("space before colon (TE smuggling)", bytes(request(["Transfer-Encoding : chunked"])), .malformed),
        Row("tab before colon", bytes(request(["Content-Length\t: 5"])), .malformed),
        Row("empty field name", bytes(request([": value"])), .malformed),
        Row("no colon", bytes(request(["NoColon"])), .malformed),
        Row("obs-fold with space", bytes(request(["A: b", " c"])), .malformed),
        Row("obs-fold with tab", bytes(request(["A: b", "\tc"])), .malformed),
        Row("whitespace line after request line", bytes("GET / HTTP/1.1\r\n Host: x\r\n\r\n"), .malformed),
        Row("NUL in value", bytes(request(["A: b\0c"])), .malformed),
        Row("NUL in name", bytes(request(["A\0: b"])), .malformed),
        Row("bare CR in value", bytes(request(["A: b\rc"])), .malformed),
        Row("bare LF in value", bytes("GET / HTTP/1.1\r\nA: b\nB: c\r\n\r\n"), .malformed),
        Row("bare LF ends field line", bytes("GET / HTTP/1.1\r\nA: b\n\r\n"), .malformed),
        Row("bare LF ends header section", bytes("GET / HTTP/1.1\r\nA: b\r\n\n"), .malformed),
        Row("bare CR ends header section", bytes("GET / HTTP/1.1\r\nA: b\r\n\rX"), .malformed),
        Row("control char 0x01 in value", bytes(request(["A: b\u{01}"])), .malformed),
        Row("control char 0x1F in value", bytes(request(["A: \u{1F}b"])), .malformed),
        Row("DEL in value", bytes(request(["A: b\u{7F}"])), .malformed),
        Row("ESC in value", bytes(request(["A: \u{1B}[31m"])), .malformed),
        Row("non-token char in name", bytes(request(["A(b): c"])), .malformed),
        Row("non-ASCII name", bytes(request(["Ä: c"])), .malformed),
        Row("Latin-1 obs-text (not UTF-8)", bytes("GET / HTTP/1.1\r\nA: caf") + [0xE9] + bytes("\r\n\r\n"), .malformed),
        Row("truncated UTF-8 sequence", bytes("GET / HTTP/1.1\r\nA: ") + [0xE2, 0x98] + bytes("\r\n\r\n"), .malformed),
        Row("overlong UTF-8", bytes("GET / HTTP/1.1\r\nA: ") + [0xC0, 0xAF] + bytes("\r\n\r\n"), .malformed),
    ]

    @Test(arguments: malformed)
    func refusesMalformed(_ row: Row<[UInt8], Verdict>) {
        #expect(Verdict(parseRequest(row.input)) == row.expected, "\(row.name)")
    }

    /// Violations must be reported before the head is complete, so the proxy never waits on (or buffers)
    /// a head that can only be refused.
    static let malformedWhileIncomplete: [Row<String, Verdict>] = [
        Row("bad version prefix", "GET / HTTQ", .malformed),
        Row("HTTP/2 seen early", "GET / HTTP/2", .malformed),
        Row("double space seen early", "GET  ", .malformed),
        Row("space before colon, value not yet sent", "GET / HTTP/1.1\r\nTransfer-Encoding ", .malformed),
        Row("obs-fold, rest not yet sent", "GET / HTTP/1.1\r\nA: b\r\n ", .malformed),
        Row("NUL in partial value", "GET / HTTP/1.1\r\nA: b\0", .malformed),
        Row("bare LF in partial head", "GET / HTTP/1.1\r\nA: b\nB", .malformed),
        Row("partial valid head", "GET / HTTP/1.1\r\nA: b\r\nB", .incomplete),
        Row("lone CR at the end", "GET / HTTP/1.1\r\nA: b\r", .incomplete),
        Row("lone leading CR", "\r", .incomplete),
        Row("empty input", "", .incomplete),
    ]

    @Test(arguments: malformedWhileIncomplete)
    func reportsViolationsBeforeTheEnd(_ row: Row<String, Verdict>) {
        #expect(Verdict(parseRequest(row.input)) == row.expected, "\(row.name)")
    }

    @Test func byteByByteIsIncompleteUntilTheLastByte() throws {
        let text = "\r\nPOST http://example.com/upload?x=1 HTTP/1.1\r\nHost: example.com\r\nContent-Length: 10\r\nX-A: é\r\n\r\n0123456789"
        let all = Array(text.utf8)
        let headLength = all.count - 10
        for k in 0..<headLength {
            let verdict = Verdict(parseRequest(Array(all[0..<k])))
            #expect(verdict == .incomplete, "prefix of \(k) bytes: \(verdict)")
        }
        for k in headLength...all.count {
            #expect(Verdict(parseRequest(Array(all[0..<k]))) == .complete(length: headLength))
        }
        let whole = try #require(head(parseRequest(all)))
        #expect(whole.values(of: "content-length") == ["10"])
    }
}

func bytes(_ s: String) -> [UInt8] { Array(s.utf8) }
