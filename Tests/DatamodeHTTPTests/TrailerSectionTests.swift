import DatamodeHTTP
import Testing

/// What no trailer section may carry on (RFC 9110 §6.5.1, §6.5.2; RFC 9113 §8.2.2), and the last-chunk element a relay
/// forwards without it, every other byte as it came.
@Suite struct TrailerSectionTests {
    @Test func theDroppedNamesInAnyCase() {
        for name in ["Content-Length", "TRANSFER-ENCODING", "host", "Trailer", "Connection", "keep-alive",
                     "Proxy-Connection", "te", "Upgrade"] {
            #expect(TrailerSection.isDropped(name), "\(name)")
        }
        for name in ["X-Checksum", "Content-Type", "Server-Timing", "tE-", "hosts", "Content-Lengths", "Via", "t", ""] {
            #expect(!TrailerSection.isDropped(name), "\(name)")
        }
    }

    @Test func theElementLosesOnlyTheDroppedLines() throws {
        let element = "0;ext=1\r\nContent-Length: 5\r\nX-Checksum:  abc \r\nHost: trailer.example\r\nTE: trailers\r\n"
            + "Transfer-Encoding: chunked\r\nConnection: keep-alive\r\nX-Other: \u{e9}\r\nTrailer: X\r\n\r\n"
        let filtered = try #require(Array(element.utf8).withUnsafeBytes { TrailerSection.withoutDroppedFields($0) })
        #expect(String(decoding: filtered.element, as: UTF8.self) == "0;ext=1\r\nX-Checksum:  abc \r\nX-Other: \u{e9}\r\n\r\n")
        #expect(filtered.dropped == ["Content-Length", "Host", "TE", "Transfer-Encoding", "Connection", "Trailer"])

        let nothing = try #require(Array("0\r\n\r\n".utf8).withUnsafeBytes { TrailerSection.withoutDroppedFields($0) })
        #expect(nothing.element == Array("0\r\n\r\n".utf8) && nothing.dropped.isEmpty)
        let all = try #require(Array("0\r\nHost: a\r\n\r\n".utf8).withUnsafeBytes { TrailerSection.withoutDroppedFields($0) })
        #expect(all.element == Array("0\r\n\r\n".utf8) && all.dropped == ["Host"])
        #expect(Array("0\r\nHost: a\r\n".utf8).withUnsafeBytes { TrailerSection.withoutDroppedFields($0) } == nil)
    }
}
