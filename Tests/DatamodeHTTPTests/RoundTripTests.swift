import DatamodeHTTP
import DatamodeTestSupport
import Testing

@Suite("Head writing and round trips")
struct RoundTripTests {
    @Test func writesCanonicalHeads() {
        var w = HeadWriter()
        w.requestLine(method: "GET", target: "/x", version: .http11)
        w.field("Host", "example.com")
        w.end()
        #expect(w.bytes == Array("GET /x HTTP/1.1\r\nHost: example.com\r\n\r\n".utf8))

        var r = HeadWriter()
        r.statusLine(version: .http10, status: 204, reason: "")
        r.field("Via", "1.1 datamode-proxy")
        r.end()
        #expect(r.bytes == Array("HTTP/1.0 204 \r\nVia: 1.1 datamode-proxy\r\n\r\n".utf8))
    }

    /// The writer copies lines into room it grows itself: heads far beyond the capacity it was given, with lines
    /// longer than all of it, come out byte for byte as the same lines appended one by one, and `take` hands over
    /// exactly the head (not the room behind it).
    @Test func headsLargerThanTheirCapacityAreWrittenWhole() {
        var random = SystemRandomNumberGenerator()
        for _ in 0..<200 {
            var w = HeadWriter(capacity: Int.random(in: 0...80, using: &random))
            var expected = Array("HTTP/1.1 200 OK\r\n".utf8)
            w.statusLine(version: .http11, status: 200, reason: "OK")
            for k in 0..<Int.random(in: 0...40, using: &random) {
                let value = String(repeating: "v", count: Int.random(in: 0...3000, using: &random))
                w.field("F\(k)", value)
                expected += Array("F\(k): \(value)\r\n".utf8)
            }
            w.end()
            expected += [13, 10]
            #expect(w.bytes == expected)
            #expect(w.take() == expected)
            #expect(w.bytes.isEmpty)
        }
    }

    @Test func serializedNormalisesWhitespace() throws {
        let h = try #require(head(parseRequest("\r\nGET / HTTP/1.1\r\nA:b  \r\nB: \tc d\r\n\r\n")))
        #expect(h.serialized() == Array("GET / HTTP/1.1\r\nA: b\r\nB: c d\r\n\r\n".utf8))
    }

    @Test func fieldValidators() {
        #expect(HeadWriter.isValidFieldValue("a b\tc é"))
        #expect(!HeadWriter.isValidFieldValue("a\r\nInjected: 1"))
        #expect(!HeadWriter.isValidFieldValue(" leading"))
        #expect(!HeadWriter.isValidFieldName("Bad Name"))
        #expect(HeadWriter.isValidFieldName("X-Good"))
    }

    @Test func fieldLookup() throws {
        let h = try #require(requestHead([
            "Connection: keep-alive, X-Hop", "connection: UPGRADE,,", "X-Hop: 1", "x-hop: 2", "Upgrade: websocket",
        ]))
        #expect(h.values(of: "X-HOP") == ["1", "2"])
        #expect(h.values(of: "missing") == [])
        #expect(h.contains("upgrade"))
        #expect(!h.contains("upgrad"))
        #expect(h.connectionTokens == ["keep-alive", "x-hop", "upgrade"])
        #expect(h.connectionTokens.fieldNames == ["x-hop"])
        #expect(h.connectionTokens.contains("X-HOP") && h.connectionTokens.contains("Upgrade"))
        #expect(!h.connectionTokens.contains("close") && !h.connectionTokens.contains("x-ho"))
        #expect(h.count(of: "x-hop") == 2 && h.count(of: "HOST") == 0)
        let r = try #require(head(parseResponse("HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")))
        #expect(r.connectionTokens == ["close"])
        #expect(r.values(of: "connection") == ["close"])
    }

    /// A small seeded generator of valid heads, with the irregularities the parser must normalise away
    /// (leading CRLFs, OWS around values, odd name case, obs-text).
    struct HeadGenerator {
        var rng: SeededGenerator
        static let methods = ["GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH", "CONNECT", "X-CUSTOM_1"]
        static let targets = [
            "http://example.com/", "http://a.b.c:8080/p/q?x=1&y=%20", "https://[::1]:8443/", "/origin?only",
            "*", "example.com:443", "http://EXAMPLE.com", "http://h/a;b=c/d!$&'()*+,;=:@",
        ]
        static let names = ["Host", "User-Agent", "accept", "X-Custom", "Content-Length", "transfer-encoding", "A", "x!#$%&'*+-.^_`|~"]
        static let valueParts = ["text/html", "q=0.9", "gzip", " ", "\t", "é", "☕", "a,b", "\"quoted\"", "(c)", "42", "", "x=y;z"]
        static let ows = ["", " ", "\t", "  \t "]

        init(seed: UInt64) { rng = SeededGenerator(seed: seed) }

        mutating func pick<T>(_ a: [T]) -> T { a[Int(rng.next() % UInt64(a.count))] }

        mutating func requestText() -> String {
            var s = String(repeating: "\r\n", count: Int(rng.next() % 3))
            s += "\(pick(Self.methods)) \(pick(Self.targets)) HTTP/1.\(rng.next() % 2)\r\n"
            s += fieldsText()
            return s
        }

        mutating func responseText() -> String {
            let status = 100 + Int(rng.next() % 900)
            let reason = pick(["OK", "", "Not Found", "all good ✓", "a\tb"])
            let sp = reason.isEmpty && rng.next() % 2 == 0 ? "" : " "
            return "HTTP/1.\(rng.next() % 10) \(status)\(sp)\(reason)\r\n" + fieldsText()
        }

        mutating func fieldsText() -> String {
            var s = ""
            for _ in 0..<Int(rng.next() % 12) {
                var value = ""
                for _ in 0..<Int(rng.next() % 4) { value += pick(Self.valueParts) }
                s += "\(pick(Self.names)):\(pick(Self.ows))\(value)\(pick(Self.ows))\r\n"
            }
            return s + "\r\n"
        }
    }

    @Test(arguments: [1, 2, 3, 42, 2024] as [UInt64])
    func requestRoundTrip(seed: UInt64) throws {
        var g = HeadGenerator(seed: seed)
        for _ in 0..<200 {
            let text = g.requestText()
            let first = try #require(head(parseRequest(text)), "generated head must parse: \(text.debugDescription)")
            let wire = first.serialized()
            let second = parseRequest(wire)
            #expect(head(second) == first, "\(text.debugDescription)")
            #expect(Verdict(second) == .complete(length: wire.count))
            #expect(wire == head(second)?.serialized())
        }
    }

    @Test(arguments: [7, 8, 9] as [UInt64])
    func responseRoundTrip(seed: UInt64) throws {
        var g = HeadGenerator(seed: seed)
        for _ in 0..<200 {
            let text = g.responseText()
            let first = try #require(head(parseResponse(text)), "generated head must parse: \(text.debugDescription)")
            let wire = first.serialized()
            #expect(head(parseResponse(wire)) == first, "\(text.debugDescription)")
        }
    }
}
