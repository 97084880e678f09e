import DatamodeHTTP
import Testing

@Suite("Response head parsing")
struct ResponseHeadTests {
    @Test func parsesAResponse() throws {
        let text = "HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\nContent-Length: 3\r\n\r\nabc"
        let result = parseResponse(text)
        #expect(Verdict(result) == .complete(length: text.utf8.count - 3))
        let h = try #require(head(result))
        #expect(h.version == .http11 && h.status == 404 && h.reason == "Not Found")
        #expect(h.values(of: "CONTENT-TYPE") == ["text/plain"])
        #expect(h.contains("content-length"))
    }

    static let statusLines: [Row<String, Verdict>] = [
        Row("empty reason with SP", "HTTP/1.1 200 \r\n\r\n", .complete(length: 17)),
        Row("no SP, no reason", "HTTP/1.1 204\r\n\r\n", .complete(length: 16)),
        Row("HTTP/1.0", "HTTP/1.0 200 OK\r\n\r\n", .complete(length: 19)),
        Row("HTTP/1.9 is still 1.x", "HTTP/1.9 200 OK\r\n\r\n", .complete(length: 19)),
        Row("status 100", "HTTP/1.1 100 Continue\r\n\r\n", .complete(length: 25)),
        Row("status 999", "HTTP/1.1 999 X\r\n\r\n", .complete(length: 18)),
        Row("reason with tab and UTF-8", "HTTP/1.1 200 all\tgood ✓\r\n\r\n", .complete(length: 29)),
        Row("status 099", "HTTP/1.1 099 X\r\n\r\n", .malformed),
        Row("two-digit status", "HTTP/1.1 20 OK\r\n\r\n", .malformed),
        Row("four-digit status", "HTTP/1.1 2000 OK\r\n\r\n", .malformed),
        Row("HTTP/2", "HTTP/2 200 OK\r\n\r\n", .malformed),
        Row("HTTP/2.0", "HTTP/2.0 200 OK\r\n\r\n", .malformed),
        Row("lowercase http", "http/1.1 200 OK\r\n\r\n", .malformed),
        Row("two spaces before status", "HTTP/1.1  200 OK\r\n\r\n", .malformed),
        Row("bare LF after status line", "HTTP/1.1 200 OK\n\r\n", .malformed),
        Row("NUL in reason", "HTTP/1.1 200 O\0K\r\n\r\n", .malformed),
        Row("obs-fold", "HTTP/1.1 200 OK\r\nA: b\r\n c\r\n\r\n", .malformed),
        Row("space before colon", "HTTP/1.1 200 OK\r\nContent-Length : 5\r\n\r\n", .malformed),
        Row("leading CRLF (not allowed before a status line)", "\r\nHTTP/1.1 200 OK\r\n\r\n", .malformed),
        Row("partial", "HTTP/1.1 200 O", .incomplete),
        Row("partial version", "HTTP/1", .incomplete),
        Row("bad partial version", "HTTP/3", .malformed),
    ]

    @Test(arguments: statusLines)
    func statusLine(_ row: Row<String, Verdict>) {
        #expect(Verdict(parseResponse(row.input)) == row.expected, "\(row.name)")
    }

    @Test func latin1ReasonIsRefused() {
        let bytes = Array("HTTP/1.1 200 caf".utf8) + [0xE9] + Array("\r\n\r\n".utf8)
        #expect(Verdict(parseResponse(bytes)) == .malformed)
    }

    @Test func byteByByte() {
        let all = Array("HTTP/1.1 200 OK\r\nA: b\r\nC: d\r\n\r\n".utf8)
        for k in 0..<all.count {
            #expect(Verdict(parseResponse(Array(all[0..<k]))) == .incomplete, "prefix \(k)")
        }
        #expect(Verdict(parseResponse(all)) == .complete(length: all.count))
    }
}
