import DatamodeTestSupport
import Foundation
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// An outside tester's sweep of how the real binary relays an HTTP/1 origin's response head to an HTTP/1 client
/// (SPEC §6), for the path that copies field names and values from the origin's bytes (a plain forward-proxy
/// exchange: no variant, not transparent, no manifest cap or image transcoding; the default configuration's
/// `normal` mode). A Python origin writes exact bytes per case; a raw socket client (and curl) reads what the proxy
/// relays and compares it byte for byte: the status line as sent (reason included), hop-by-hop fields gone, one
/// `Via`, the framing the proxy writes itself, every other field in order with the OWS around its value removed;
/// the body whole; then whether the client's and the origin's connections are kept or closed as they must be.
@Suite("Response head relay sweep (SPEC §6)", .serialized)
struct ResponseHeadRelaySweepTests {
    static let via = "Via: 1.1 datamode-proxy\r\n"

    /// The proxy (default configuration unless a test gives one) and the origin; set up in `init`, read-only after
    /// (clients on several threads share it).
    final class Rig: @unchecked Sendable {
        let directory: String
        let proxy: ProxyProcess
        let originProcess: Process
        var originPort: UInt16 = 0

        init(config: String = "") throws {
            directory = try ScratchDirectory.make("datamode-head-sweep")
            let script = directory + "/origin.py"
            try ResponseHeadRelaySweepTests.origin.write(toFile: script, atomically: true, encoding: .utf8)
            let log = directory + "/origin.log"
            _ = FileManager.default.createFile(atPath: log, contents: nil)
            originProcess = Process()
            originProcess.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
            originProcess.arguments = ["-u", script]
            originProcess.standardInput = FileHandle.nullDevice
            originProcess.standardOutput = FileHandle(forWritingAtPath: log)
            originProcess.standardError = FileHandle(forWritingAtPath: log)
            try originProcess.run()
            do {
                let deadline = Date().addingTimeInterval(10)
                while originPort == 0 && Date() < deadline {
                    let text = (try? String(contentsOfFile: log, encoding: .utf8)) ?? ""
                    if let line = text.split(separator: "\n").first(where: { $0.hasPrefix("PORT ") }) {
                        originPort = UInt16(line.dropFirst(5)) ?? 0
                    } else {
                        usleep(10_000)
                    }
                }
                guard originPort != 0 else { throw ProxyProcess.LaunchError(description: "the origin did not start") }
                proxy = try ProxyProcess(config: config, directory: directory + "/proxy")
            } catch {
                kill(originProcess.processIdentifier, SIGKILL)
                originProcess.waitUntilExit()
                ScratchDirectory.remove(directory)
                throw error
            }
        }

        func stop() {
            proxy.stop()
            if originProcess.isRunning {
                kill(originProcess.processIdentifier, SIGKILL)
                originProcess.waitUntilExit()
            }
            ScratchDirectory.remove(directory)
        }

        var originLog: String { (try? String(contentsOfFile: directory + "/origin.log", encoding: .utf8)) ?? "" }

        func url(_ path: String) -> String { "http://127.0.0.1:\(originPort)\(path)" }

        func connect() throws -> RawHTTPClient { try RawHTTPClient(port: proxy.port, timeout: .seconds(5)) }

        /// `GET` (or `method`) of `path` in absolute form, with `Host` and `headers`.
        func request(_ path: String, method: String = "GET", version: String = "HTTP/1.1",
                     headers: [(String, String)] = []) -> String {
            RequestText.make(method, url(path), headers: headers, version: version)
        }

        /// Which origin connection served `/conn` (the origin numbers its connections from 1).
        func originConnection(on client: RawHTTPClient) throws -> String {
            try client.send(request("/conn"))
            let response = try client.readResponse()
            return response.bodyText
        }
    }

    /// A relayed response the client must see: the status line, the fields between it and `Via` (the framing
    /// included, where the proxy writes it), the body as decoded.
    struct Expected {
        var statusLine: String
        var fields: [String]
        var body: [UInt8]
        /// The origin closes after it (an HTTP/1.0 origin, a body delimited by the close).
        var originCloses = false
        /// The origin's connection cannot be reused after it (it said close, or sent bytes past the response), but
        /// the client's is kept.
        var originDropped = false

        init(_ statusLine: String, _ fields: [String], body: String = "hello", originCloses: Bool = false) {
            self.statusLine = statusLine
            self.fields = fields
            self.body = Array(body.utf8)
            self.originCloses = originCloses
        }

        init(_ statusLine: String, _ fields: [String], bytes: [UInt8], originCloses: Bool = false) {
            self.statusLine = statusLine
            self.fields = fields
            self.body = bytes
            self.originCloses = originCloses
        }

        /// The head text, with `connection` (e.g. `Connection: close`) after `Via` when given.
        func head(connection: String? = nil) -> String {
            statusLine + "\r\n" + fields.map { $0 + "\r\n" }.joined() + ResponseHeadRelaySweepTests.via
                + (connection.map { $0 + "\r\n" } ?? "") + "\r\n"
        }
    }

    static func pattern(_ count: Int) -> [UInt8] { (0..<count).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ 7) } }

    /// On one client connection: `/conn`, the case, `/conn` again. The case's head and body must be `expected`,
    /// the client connection kept, and the origin connection reused unless the origin closed it.
    func expectRelayed(_ rig: Rig, _ name: String, _ expected: Expected, method: String = "GET",
                       sourceLocation: SourceLocation = #_sourceLocation) throws {
        let client = try rig.connect()
        defer { client.close() }
        let before = try rig.originConnection(on: client)
        try client.send(rig.request("/case/" + name, method: method))
        let response = try client.readFinalResponse(method: method)
        #expect(response.headText.debugDescription == expected.head(connection: expected.originCloses ? "Connection: close" : nil)
            .debugDescription, "\(name): head", sourceLocation: sourceLocation)
        #expect(response.body == expected.body, "\(name): body \(response.body.count) bytes, want \(expected.body.count)",
                sourceLocation: sourceLocation)
        if expected.originCloses {
            // A body delimited by the origin's close ends the client's connection too.
            #expect(client.isClosedByPeer(within: .seconds(2)), "\(name): client connection kept", sourceLocation: sourceLocation)
            let next = try rig.connect()
            defer { next.close() }
            let after = try rig.originConnection(on: next)
            #expect(after != before, "\(name): a closed origin connection reused", sourceLocation: sourceLocation)
        } else if expected.originDropped {
            let after = try rig.originConnection(on: client)
            #expect(after != before, "\(name): origin connection reused (\(before) then \(after))",
                    sourceLocation: sourceLocation)
        } else {
            let after = try rig.originConnection(on: client)
            #expect(after == before, "\(name): origin connection not reused (\(before) then \(after))",
                    sourceLocation: sourceLocation)
        }
    }

    /// The case is refused: `502` `upstream-protocol-error`, nothing of the origin's response relayed, and the
    /// origin's connection never reused.
    func expectRefused(_ rig: Rig, _ name: String, sourceLocation: SourceLocation = #_sourceLocation) throws {
        let client = try rig.connect()
        defer { client.close() }
        let before = try rig.originConnection(on: client)
        try client.send(rig.request("/case/" + name))
        let response = try client.readFinalResponse()
        #expect(response.status == 502, "\(name): \(response.headText.debugDescription)", sourceLocation: sourceLocation)
        #expect(response.problem?.error == "upstream-protocol-error", "\(name): \(response.bodyText)",
                sourceLocation: sourceLocation)
        #expect(!response.bodyText.contains("hello"), "\(name): origin body relayed", sourceLocation: sourceLocation)
        let next: RawHTTPClient
        if response.values(of: "Connection").contains(where: { $0.lowercased() == "close" }) {
            #expect(client.isClosedByPeer(within: .seconds(2)), sourceLocation: sourceLocation)
            next = try rig.connect()
        } else {
            next = client
        }
        let after = try rig.originConnection(on: next)
        #expect(after != before, "\(name): origin connection reused after a protocol error", sourceLocation: sourceLocation)
        #expect(!rig.proxy.hasExited, "\(name): the proxy died", sourceLocation: sourceLocation)
    }

    func withRig(config: String = "", _ body: (Rig) throws -> Void) throws {
        let rig = try Rig(config: config)
        defer { rig.stop() }
        try body(rig)
        #expect(!rig.proxy.hasExited, "the proxy died: \(rig.proxy.stderr.suffix(3000))")
    }

    // MARK: the status line

    @Test("a reason phrase with a trailing space, a leading tab, or empty is relayed as sent")
    func reasonPhrases() throws {
        try withRig { rig in
            try expectRelayed(rig, "reason-trailing-space", Expected("HTTP/1.1 200 OK ", ["Content-Length: 5"]))
            try expectRelayed(rig, "reason-leading-tab", Expected("HTTP/1.1 200 \tOK", ["Content-Length: 5"]))
            try expectRelayed(rig, "reason-empty", Expected("HTTP/1.1 404 ", ["Content-Length: 5"]))
            try expectRelayed(rig, "reason-obs-text", Expected("HTTP/1.1 200 Gr\u{fc}\u{df}e", ["Content-Length: 5"]))
            try expectRelayed(rig, "long-reason", Expected("HTTP/1.1 200 " + String(repeating: "r", count: 4000),
                                                           ["Content-Length: 5"]))
            // Without the SP before the (empty) reason (RFC 9112 §4 requires it): read leniently, relayed with it.
            try expectRelayed(rig, "reason-missing", Expected("HTTP/1.1 404 ", ["Content-Length: 5"]))
        }
    }

    // MARK: field values

    @Test("obs-text (UTF-8) in a value is copied byte for byte")
    func obsText() throws {
        try withRig { rig in
            try expectRelayed(rig, "obs-text", Expected("HTTP/1.1 200 OK",
                                                        ["X-Name: caf\u{e9} \u{2615} ok", "Content-Length: 5"]))
        }
    }

    @Test("spaces and tabs around values are removed, inside them kept; an empty value stays")
    func optionalWhitespace() throws {
        try withRig { rig in
            try expectRelayed(rig, "ows", Expected("HTTP/1.1 200 OK", [
                "X-A: spaced", "X-B: tabbed", "X-C: mixed  inner \t x", "X-Empty: ", "X-Blank: ", "Content-Length: 5",
            ]))
        }
    }

    @Test("field names keep their case and every tchar; values keep colons and quotes")
    func namesAndValues() throws {
        try withRig { rig in
            try expectRelayed(rig, "names", Expected("HTTP/1.1 200 OK", [
                "x-lower: a", "X-UPPER: B", "MiXeD-CaSe: c", "X!#$%&'*+-.^_`|~: v", "X-Url: http://a:b/c?d=e:f",
                "X-Quote: \"a, b\"", "Content-Length: 5",
            ]))
        }
    }

    // MARK: framing

    @Test("Content-Length: 5, 5 (and twice 5) relays as one Content-Length: 5")
    func repeatedContentLength() throws {
        try withRig { rig in
            try expectRelayed(rig, "cl-list-same", Expected("HTTP/1.1 200 OK", ["X-After: 1", "Content-Length: 5"]))
            try expectRelayed(rig, "cl-repeated-same", Expected("HTTP/1.1 200 OK", ["X-Mid: 1", "Content-Length: 5"]))
        }
    }

    @Test("Content-Length: 5, 6 (or on two lines) is a 502")
    func conflictingContentLength() throws {
        try withRig { rig in
            try expectRefused(rig, "cl-conflict")
            try expectRefused(rig, "cl-conflict-lines")
            try expectRefused(rig, "cl-signed")
        }
    }

    @Test("Content-Length is written from its parsed value (005 → 5, 0 kept); overflowing, empty or other codings: 502")
    func framingValues() throws {
        try withRig { rig in
            try expectRelayed(rig, "cl-leading-zeros", Expected("HTTP/1.1 200 OK", ["Content-Length: 5"]))
            try expectRelayed(rig, "cl-zero", Expected("HTTP/1.1 200 OK", ["X-A: 1", "Content-Length: 0"], body: ""))
            for name in ["cl-overflow", "cl-empty", "cl-list-empty-element", "te-chunked-twice", "te-identity", "te-http10"] {
                try expectRefused(rig, name)
            }
        }
    }

    @Test("an origin that closes mid-body: the head and every byte it sent, then the client connection closed")
    func cutBody() throws {
        try withRig { rig in
            let client = try rig.connect()
            defer { client.close() }
            try client.send(rig.request("/case/cut-body-close"))
            let head = Expected("HTTP/1.1 200 OK", ["Content-Length: 5"]).head()
            let got = try client.readAll()
            #expect(String(decoding: got, as: UTF8.self).debugDescription == (head + "hel").debugDescription)
        }
    }

    @Test("an origin that closes before or inside its head: 502 upstream-protocol-error")
    func noHead() throws {
        try withRig { rig in
            try expectRefused(rig, "nothing-close")
            try expectRefused(rig, "partial-head-close")
        }
    }

    @Test("the access log records the status and body bytes of heads relayed from their bytes")
    func accessLog() throws {
        try withRig { rig in
            let cases: [(String, Int, Int)] = [("reason-empty", 404, 5), ("204-cl", 204, 0), ("status-999", 999, 5),
                                               ("cl-leading-zeros", 200, 5), ("http10-close", 200, 300_000)]
            for (name, _, _) in cases {
                let client = try rig.connect()
                defer { client.close() }
                try client.send(rig.request("/case/" + name))
                _ = try client.readResponse()
            }
            let lines = rig.proxy.accessLog(atLeast: cases.count) { ($0["url"] as? String)?.contains("/case/") == true }
            for (name, status, bytes) in cases {
                let line = lines.first { ($0["url"] as? String)?.hasSuffix("/case/" + name) == true }
                #expect(line?["status"] as? Int == status, "\(name): \(String(describing: line))")
                #expect(line?["bytes"] as? Int == bytes, "\(name): \(String(describing: line))")
                #expect(line?["outcome"] as? String == "forwarded", "\(name)")
            }
        }
    }

    @Test("status codes 599 and 999 are relayed as sent")
    func unusualStatuses() throws {
        try withRig { rig in
            try expectRelayed(rig, "status-599", Expected("HTTP/1.1 599 Odd", ["Content-Length: 5"]))
            try expectRelayed(rig, "status-999", Expected("HTTP/1.1 999 Weird", ["Content-Length: 5"]))
        }
    }

    @Test("chunked with trailers: Trailer removed, the proxy's Transfer-Encoding, the body and trailers whole")
    func chunkedWithTrailers() throws {
        try withRig { rig in
            let client = try rig.connect()
            defer { client.close() }
            let before = try rig.originConnection(on: client)
            try client.send(rig.request("/case/chunked-trailers"))
            let response = try client.readResponse()
            #expect(response.headText.debugDescription
                == Expected("HTTP/1.1 200 OK", ["X-After: 1", "Transfer-Encoding: chunked"]).head().debugDescription)
            #expect(response.bodyText == "hello world")
            #expect(response.trailers.map { "\($0.name): \($0.value)" } == ["X-Sum: abc", "X-Other: d"])
            #expect(try rig.originConnection(on: client) == before)
        }
    }

    @Test("Transfer-Encoding: gzip, chunked is a 502")
    func transferCodingOtherThanChunked() throws {
        try withRig { rig in
            try expectRefused(rig, "te-gzip-chunked")
            try expectRefused(rig, "te-cl-both")
        }
    }

    // MARK: hop-by-hop

    @Test("Connection: x-hop, keep-alive removes X-Hop (every line of it) and every hop-by-hop field")
    func connectionListedFields() throws {
        try withRig { rig in
            try expectRelayed(rig, "connection-listed", Expected("HTTP/1.1 200 OK", ["X-Keep: 1", "Content-Length: 5"]))
        }
    }

    @Test("hop-by-hop names in any case, Connection lists with empty elements and on two lines")
    func hopByHopSpellings() throws {
        try withRig { rig in
            try expectRelayed(rig, "hop-case", Expected("HTTP/1.1 200 OK", ["X-Keep: 1", "Transfer-Encoding: chunked"]))
            try expectRelayed(rig, "connection-odd-list", Expected("HTTP/1.1 200 OK", ["X-Keep: 1", "Content-Length: 5"]))
        }
    }

    @Test("Connection: close from an HTTP/1.1 origin, keep-alive from an HTTP/1.0 one: the origin's connection's fate")
    func originConnectionFate() throws {
        try withRig { rig in
            var closing = Expected("HTTP/1.1 200 OK", ["Content-Length: 5"])
            closing.originDropped = true
            try expectRelayed(rig, "connection-close-11", closing)
            try expectRelayed(rig, "http10-keep-alive", Expected("HTTP/1.1 200 OK", ["Content-Length: 5"]))
        }
    }

    @Test("bytes past the response (at once or late, after a length, chunks or a 204): relayed never, origin connection dropped")
    func bytesPastTheResponse() throws {
        try withRig { rig in
            for (name, expected) in [("cl-extra", Expected("HTTP/1.1 200 OK", ["Content-Length: 5"])),
                                     ("cl-extra-late", Expected("HTTP/1.1 200 OK", ["Content-Length: 5"])),
                                     ("chunked-extra", Expected("HTTP/1.1 200 OK", ["Transfer-Encoding: chunked"])),
                                     ("204-body", Expected("HTTP/1.1 204 No Content", [], body: ""))] {
                var dropped = expected
                dropped.originDropped = true
                if name == "cl-extra-late" {
                    // The late bytes reach the pooled connection before the next request does.
                    let client = try rig.connect()
                    defer { client.close() }
                    let before = try rig.originConnection(on: client)
                    try client.send(rig.request("/case/" + name))
                    let response = try client.readResponse()
                    #expect(response.headText == expected.head() && response.bodyText == "hello", "\(name)")
                    usleep(200_000)
                    try client.send(rig.request("/conn"))
                    let next = try client.readResponse()
                    #expect(next.bodyText.hasPrefix("conn=") && next.bodyText != before,
                            "\(name): \(next.headText.debugDescription) \(next.bodyText)")
                } else {
                    try expectRelayed(rig, name, dropped)
                }
            }
        }
    }

    @Test("Connection naming Content-Length or Transfer-Encoding is a 502")
    func connectionNamingFraming() throws {
        try withRig { rig in
            try expectRefused(rig, "connection-content-length")
            try expectRefused(rig, "connection-transfer-encoding")
        }
    }

    // MARK: bodies by the close, and no bodies

    @Test("an HTTP/1.0 origin without a length: the whole body, then the client connection closed")
    func closeDelimitedBody() throws {
        try withRig { rig in
            try expectRelayed(rig, "http10-close", Expected("HTTP/1.1 200 OK", ["Content-Type: text/plain"],
                                                            bytes: Self.pattern(300_000), originCloses: true))
        }
    }

    @Test("an HTTP/1.0 origin with a length that closes: relayed, its connection not reused, the client's kept")
    func http10OriginWithLength() throws {
        try withRig { rig in
            let client = try rig.connect()
            defer { client.close() }
            let before = try rig.originConnection(on: client)
            try client.send(rig.request("/case/http10-cl"))
            let response = try client.readResponse()
            #expect(response.headText.debugDescription
                == Expected("HTTP/1.1 200 OK", ["Content-Length: 5"]).head().debugDescription)
            #expect(response.bodyText == "hello")
            #expect(try rig.originConnection(on: client) != before)
        }
    }

    @Test("204 and 304 with a Content-Length: no body read, the Content-Length kept, both connections reused")
    func bodilessStatuses() throws {
        try withRig { rig in
            try expectRelayed(rig, "204-cl", Expected("HTTP/1.1 204 No Content", ["Content-Length: 5", "X-A: 1"], body: ""))
            try expectRelayed(rig, "304-cl", Expected("HTTP/1.1 304 Not Modified", ["ETag: \"v1\"", "Content-Length: 5"],
                                                      body: ""))
            try expectRelayed(rig, "304-chunked", Expected("HTTP/1.1 304 Not Modified", ["Transfer-Encoding: chunked", "X-A: 1"],
                                                           body: ""))
        }
    }

    @Test("HEAD: the response's Content-Length kept, no body read, both connections reused")
    func headRequest() throws {
        try withRig { rig in
            try expectRelayed(rig, "head-cl", Expected("HTTP/1.1 200 OK", ["Content-Type: text/plain", "Content-Length: 1000"],
                                                       body: ""), method: "HEAD")
            try expectRelayed(rig, "head-chunked", Expected("HTTP/1.1 200 OK", ["Transfer-Encoding: chunked", "X-A: 1"], body: ""),
                              method: "HEAD")
        }
    }

    // MARK: interim responses

    @Test("100 Continue and 103 Early Hints with fields are relayed before the final head", arguments: ["interim", "interim-one-write"])
    func interimResponses(name: String) throws {
        try withRig { rig in
            let client = try rig.connect()
            defer { client.close() }
            let before = try rig.originConnection(on: client)
            try client.send(rig.request("/case/" + name))
            let continued = try client.readResponse()
            #expect(continued.headText.debugDescription == "HTTP/1.1 100 Continue\r\n\(Self.via)\r\n".debugDescription)
            let hints = try client.readResponse()
            #expect(hints.headText.debugDescription == ("HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload; as=style\r\n"
                + "Link: </app.js>; rel=preload\r\nX-Hint: \u{e9}\r\n\(Self.via)\r\n").debugDescription)
            let final = try client.readResponse()
            #expect(final.headText.debugDescription
                == Expected("HTTP/1.1 200 OK", ["Link: </style.css>; rel=preload; as=style", "Content-Length: 5"]).head()
                .debugDescription)
            #expect(final.bodyText == "hello")
            #expect(try rig.originConnection(on: client) == before)
        }
    }

    @Test("102 and 199 are relayed; a 103's hop-by-hop fields are removed (its Content-Length, which RFC 9110 §8.6 forbids in a 1xx, is copied)")
    func otherInterimResponses() throws {
        try withRig { rig in
            let client = try rig.connect()
            defer { client.close() }
            try client.send(rig.request("/case/interim-102-199"))
            #expect(try client.readResponse().headText.debugDescription
                == "HTTP/1.1 102 Processing\r\nX-P: 1\r\n\(Self.via)\r\n".debugDescription)
            #expect(try client.readResponse().headText.debugDescription == "HTTP/1.1 199 Misc\r\n\(Self.via)\r\n".debugDescription)
            let final = try client.readResponse()
            #expect(final.headText == Expected("HTTP/1.1 200 OK", ["Content-Length: 5"]).head() && final.bodyText == "hello")
            try client.send(rig.request("/case/interim-hop"))
            #expect(try client.readResponse().headText.debugDescription
                == "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\nContent-Length: 7\r\n\(Self.via)\r\n".debugDescription)
            let second = try client.readResponse()
            #expect(second.headText == Expected("HTTP/1.1 200 OK", ["Content-Length: 5"]).head() && second.bodyText == "hello")
        }
    }

    @Test("an HTTP/1.0 client gets no interim responses, only the final head")
    func interimToHTTP10Client() throws {
        try withRig { rig in
            let client = try rig.connect()
            defer { client.close() }
            try client.send(rig.request("/case/interim-one-write", version: "HTTP/1.0"))
            let final = try client.readResponse()
            #expect(final.headText.debugDescription
                == Expected("HTTP/1.1 200 OK", ["Link: </style.css>; rel=preload; as=style", "Content-Length: 5"])
                .head(connection: "Connection: close").debugDescription)
            #expect(final.bodyText == "hello")
            #expect(client.isClosedByPeer(within: .seconds(2)))
        }
    }

    // MARK: heads in pieces

    @Test("a head one byte at a time, and heads split before, inside and after the final CRLF")
    func headsInPieces() throws {
        try withRig { rig in
            let expected = Expected("HTTP/1.1 200 OK", ["X-Slow: a b", "Content-Length: 5"])
            for name in ["slow-head", "split-before-final-crlf", "split-inside-final-crlf", "split-after-head",
                         "split-inside-field", "split-inside-status"] {
                try expectRelayed(rig, name, expected)
            }
        }
    }

    // MARK: large heads

    @Test("250 fields, 300 fields, and a head near 64 KiB are relayed whole; 301 fields is a 502")
    func largeHeads() throws {
        try withRig { rig in
            try expectRelayed(rig, "fields-250", Expected("HTTP/1.1 200 OK",
                                                          (0..<250).map { "X-F-\($0): v-\($0)" } + ["Content-Length: 5"]))
            try expectRelayed(rig, "fields-299", Expected("HTTP/1.1 200 OK",
                                                          (0..<299).map { "X-F-\($0): v-\($0)" } + ["Content-Length: 5"]))
            try expectRelayed(rig, "near-64k", Expected("HTTP/1.1 200 OK", (0..<63).map {
                "X-Big-\($0): " + String(repeating: Character(UnicodeScalar(UInt8(97 + $0 % 26))), count: 1000)
            } + ["Content-Length: 5"]))
            try expectRefused(rig, "fields-300")
        }
    }

    @Test("large heads in pieces (7000 bytes, 100 bytes at a time); 120 KB of fields relayed, past 128 KiB a 502")
    func largeHeadsInPieces() throws {
        try withRig { rig in
            try expectRelayed(rig, "near-64k-pieces", Expected("HTTP/1.1 200 OK", (0..<63).map {
                "X-Big-\($0): " + String(repeating: Character(UnicodeScalar(UInt8(97 + $0 % 26))), count: 1000)
            } + ["Content-Length: 5"]))
            try expectRelayed(rig, "fields-250-pieces", Expected("HTTP/1.1 200 OK",
                                                                 (0..<250).map { "X-F-\($0): v-\($0)" } + ["Content-Length: 5"]))
            try expectRelayed(rig, "near-120k", Expected("HTTP/1.1 200 OK", (0..<120).map {
                "X-Big-\($0): " + String(repeating: "v", count: 1000)
            } + ["Content-Length: 5"]))
            try expectRefused(rig, "over-128k")
        }
    }

    // MARK: invalid heads

    /// Origin heads the proxy must refuse (SPEC §6: bare CR or LF, obs-fold, NUL, whitespace before a colon, and
    /// what is no HTTP/1 head at all), and two it refuses by choice: obs-text that is not UTF-8 (Latin-1), which
    /// RFC 9110 §5.5 lets a recipient read as opaque bytes.
    static let refused = ["status-101-unasked", "bad-obs-fold", "bad-space-before-colon", "bad-bare-lf", "bad-bare-cr", "bad-nul",
                          "bad-ctl", "bad-del", "bad-empty-name", "bad-name-char", "bad-status-short", "bad-status-long",
                          "bad-status-099", "bad-version-2", "bad-version-lower", "bad-icy", "bad-reason-nul", "bad-reason-cr",
                          "bad-leading-space-field", "bad-no-colon", "bad-chunk-size", "latin1-value", "latin1-reason"]

    @Test("an invalid origin head is a 502 upstream-protocol-error, its connection dropped", arguments: refused)
    func invalidHeads(name: String) throws {
        try withRig { rig in try expectRefused(rig, name) }
    }

    // MARK: HTTP/1.0 clients

    @Test("an HTTP/1.0 client gets a chunked response unchunked, delimited by the close")
    func http10ClientChunked() throws {
        try withRig { rig in
            let client = try rig.connect()
            defer { client.close() }
            try client.send(rig.request("/case/chunked-trailers", version: "HTTP/1.0"))
            let response = try client.readResponse()
            #expect(response.headText.debugDescription
                == Expected("HTTP/1.1 200 OK", ["X-After: 1"]).head(connection: "Connection: close").debugDescription)
            #expect(response.bodyText == "hello world")
        }
    }

    /// The cases an HTTP/1.0 client asks for, with the head it must get (before `Via` and the connection's fate).
    static let http10Cases: [(String, Expected)] = [
        ("reason-empty", Expected("HTTP/1.1 404 ", ["Content-Length: 5"])),
        ("obs-text", Expected("HTTP/1.1 200 OK", ["X-Name: caf\u{e9} \u{2615} ok", "Content-Length: 5"])),
        ("ows", Expected("HTTP/1.1 200 OK", ["X-A: spaced", "X-B: tabbed", "X-C: mixed  inner \t x", "X-Empty: ", "X-Blank: ",
                                            "Content-Length: 5"])),
        ("cl-list-same", Expected("HTTP/1.1 200 OK", ["X-After: 1", "Content-Length: 5"])),
        ("connection-listed", Expected("HTTP/1.1 200 OK", ["X-Keep: 1", "Content-Length: 5"])),
        ("204-cl", Expected("HTTP/1.1 204 No Content", ["Content-Length: 5", "X-A: 1"], body: "")),
        ("split-before-final-crlf", Expected("HTTP/1.1 200 OK", ["X-Slow: a b", "Content-Length: 5"])),
    ]

    @Test("an HTTP/1.0 client: the same heads, Connection: close and the close; with keep-alive asked, kept")
    func http10ClientHeads() throws {
        try withRig { rig in
            for (name, expected) in Self.http10Cases {
                let client = try rig.connect()
                try client.send(rig.request("/case/" + name, version: "HTTP/1.0"))
                let response = try client.readResponse()
                #expect(response.headText.debugDescription == expected.head(connection: "Connection: close").debugDescription,
                        "\(name), HTTP/1.0")
                #expect(response.body == expected.body, "\(name), HTTP/1.0")
                #expect(client.isClosedByPeer(within: .seconds(2)), "\(name), HTTP/1.0: connection kept")
                client.close()

                let kept = try rig.connect()
                defer { kept.close() }
                try kept.send(rig.request("/case/" + name, version: "HTTP/1.0", headers: [("Connection", "keep-alive")]))
                let again = try kept.readResponse()
                #expect(again.headText.debugDescription == expected.head(connection: "Connection: keep-alive").debugDescription,
                        "\(name), HTTP/1.0 keep-alive")
                #expect(again.body == expected.body, "\(name), HTTP/1.0 keep-alive")
                try kept.send(rig.request("/conn", version: "HTTP/1.0", headers: [("Connection", "keep-alive")]))
                #expect(try kept.readResponse().status == 200, "\(name), HTTP/1.0 keep-alive: second request")
            }
            // HTTP/1.0 client, HTTP/1.0 origin without a length: the body whole, then the close.
            let client = try rig.connect()
            defer { client.close() }
            try client.send(rig.request("/case/http10-close", version: "HTTP/1.0", headers: [("Connection", "keep-alive")]))
            let response = try client.readResponse()
            #expect(response.headText.debugDescription
                == Expected("HTTP/1.1 200 OK", ["Content-Type: text/plain"]).head(connection: "Connection: close").debugDescription)
            #expect(response.body == Self.pattern(300_000))
        }
    }

    // MARK: many at once, and pipelined

    /// Cases whose heads come in pieces or large, with what the client must see.
    static let mixed: [(String, Expected)] = [
        ("slow-head", Expected("HTTP/1.1 200 OK", ["X-Slow: a b", "Content-Length: 5"])),
        ("split-before-final-crlf", Expected("HTTP/1.1 200 OK", ["X-Slow: a b", "Content-Length: 5"])),
        ("split-inside-field", Expected("HTTP/1.1 200 OK", ["X-Slow: a b", "Content-Length: 5"])),
        ("near-64k-pieces", Expected("HTTP/1.1 200 OK", (0..<63).map {
            "X-Big-\($0): " + String(repeating: Character(UnicodeScalar(UInt8(97 + $0 % 26))), count: 1000)
        } + ["Content-Length: 5"])),
        ("fields-250-pieces", Expected("HTTP/1.1 200 OK", (0..<250).map { "X-F-\($0): v-\($0)" } + ["Content-Length: 5"])),
        ("ows", Expected("HTTP/1.1 200 OK", ["X-A: spaced", "X-B: tabbed", "X-C: mixed  inner \t x", "X-Empty: ", "X-Blank: ",
                                            "Content-Length: 5"])),
        ("chunked-trailers", Expected("HTTP/1.1 200 OK", ["X-After: 1", "Transfer-Encoding: chunked"], body: "hello world")),
        ("connection-listed", Expected("HTTP/1.1 200 OK", ["X-Keep: 1", "Content-Length: 5"])),
        ("reason-leading-tab", Expected("HTTP/1.1 200 \tOK", ["Content-Length: 5"])),
        ("204-cl", Expected("HTTP/1.1 204 No Content", ["Content-Length: 5", "X-A: 1"], body: "")),
    ]

    @Test("24 clients at once on one worker, heads in pieces interleaved: each gets its own head and body exactly")
    func manyAtOnce() throws {
        try withRig(config: "threads: 1\n") { rig in
            final class Box: @unchecked Sendable { var failures: [String] = [] }
            let box = Box()
            let lock = NSLock()
            let group = DispatchGroup()
            for index in 0..<24 {
                group.enter()
                Thread.detachNewThread {
                    defer { group.leave() }
                    do {
                        let client = try rig.connect()
                        defer { client.close() }
                        for round in 0..<3 {
                            let (name, expected) = Self.mixed[(index * 3 + round * 7) % Self.mixed.count]
                            try client.send(rig.request("/case/" + name))
                            let response = try client.readResponse()
                            if response.headText != expected.head() || response.body != expected.body {
                                lock.lock(); box.failures.append("client \(index) \(name): \(response.headText.prefix(300).debugDescription)")
                                lock.unlock()
                            }
                        }
                    } catch {
                        lock.lock(); box.failures.append("client \(index): \(error)"); lock.unlock()
                    }
                }
            }
            group.wait()
            #expect(box.failures.isEmpty, "\(box.failures.prefix(5))")
        }
    }

    @Test("pipelined requests: each relayed head and body in order, exactly")
    func pipelined() throws {
        try withRig { rig in
            let client = try rig.connect()
            defer { client.close() }
            let names = ["ows", "split-before-final-crlf", "chunked-trailers", "204-cl", "near-64k-pieces", "reason-leading-tab"]
            try client.send(names.map { rig.request("/case/" + $0) }.joined())
            let table = Dictionary(Self.mixed, uniquingKeysWith: { a, _ in a })
            for name in names {
                let expected = table[name]!
                let response = try client.readResponse()
                #expect(response.headText.debugDescription == expected.head().debugDescription, "\(name)")
                #expect(response.body == expected.body, "\(name)")
            }
        }
    }

    @Test("40 clients that leave while their head arrives in pieces: the proxy lives on and holds no connection after")
    func clientsLeavingMidHead() throws {
        try withRig(config: "threads: 1\n") { rig in
            let names = ["slow-head", "near-64k-pieces", "fields-250-pieces", "split-before-final-crlf", "interim"]
            var clients: [RawHTTPClient] = []
            for index in 0..<40 {
                let client = try rig.connect()
                try client.send(rig.request("/case/" + names[index % names.count]))
                clients.append(client)
            }
            for (index, client) in clients.enumerated() {
                usleep(useconds_t(index % 4 * 2_000))
                if index % 2 == 0 { client.reset() } else { client.close() }
            }
            let client = try rig.connect()
            defer { client.close() }
            #expect(try rig.originConnection(on: client).hasPrefix("conn="))
            client.close()
            var active = -1.0
            for _ in 0..<50 {
                active = try AdminAPIClient(port: rig.proxy.adminPort).scrape().value("datamode_connections_active") ?? -1
                if active == 0 { break }
                usleep(200_000)
            }
            #expect(active == 0, "connections still active")
        }
    }

    // MARK: random heads against a model

    @Test("600 random valid heads in random pieces: the relayed head and body are what a model of SPEC §6 says")
    func randomHeadsAgainstAModel() throws {
        try withRig { rig in
            let client = try rig.connect()
            defer { client.close() }
            let origin = try RawHTTPClient(port: rig.originPort, timeout: .seconds(5))
            defer { origin.close() }
            var mismatches: [String] = []
            for seed in 0..<600 {
                try origin.send("GET /expected/\(seed) HTTP/1.1\r\nHost: origin\r\n\r\n")
                let expected = try origin.readResponse().body
                try client.send(rig.request("/random/\(seed)"))
                let response = try client.readResponse()
                let got = response.headBytes + response.body
                if got != expected {
                    mismatches.append("seed \(seed): got \(String(decoding: got, as: UTF8.self).prefix(400).debugDescription)"
                        + " want \(String(decoding: expected, as: UTF8.self).prefix(400).debugDescription)")
                }
            }
            #expect(mismatches.isEmpty, "\(mismatches.count) of 600: \(mismatches.prefix(3))")
        }
    }

    @Test("200 random valid heads to an HTTP/1.0 client asking for keep-alive: chunked ones unchunked and closed, others kept")
    func randomHeadsToHTTP10Clients() throws {
        try withRig { rig in
            var client = try rig.connect()
            defer { client.close() }
            let origin = try RawHTTPClient(port: rig.originPort, timeout: .seconds(5))
            defer { origin.close() }
            var mismatches: [String] = []
            for seed in 0..<200 {
                try origin.send("GET /expected/\(seed) HTTP/1.1\r\nHost: origin\r\n\r\n")
                let model = String(decoding: try origin.readResponse().body, as: UTF8.self)
                let end = model.range(of: "\r\n\r\n")!
                let head = String(model[..<end.lowerBound]), body = String(model[end.upperBound...])
                let chunkedTail = "\r\nTransfer-Encoding: chunked\r\nVia: 1.1 datamode-proxy"
                let chunked = head.hasSuffix(chunkedTail)
                let expected = chunked
                    ? String(head.dropLast(chunkedTail.count)) + "\r\n" + Self.via + "Connection: close\r\n\r\n" + body
                    : head + "\r\nConnection: keep-alive\r\n\r\n" + body
                try client.send(rig.request("/random/\(seed)", version: "HTTP/1.0", headers: [("Connection", "keep-alive")]))
                let response: ParsedResponse
                do {
                    response = try client.readResponse()
                } catch {
                    mismatches.append("seed \(seed): \(error)")
                    client.close()
                    client = try rig.connect()
                    continue
                }
                let got = response.headText + response.bodyText
                if got != expected {
                    mismatches.append("seed \(seed): got \(got.prefix(400).debugDescription) want \(expected.prefix(400).debugDescription)")
                }
                if chunked {
                    if !client.isClosedByPeer(within: .seconds(2)) { mismatches.append("seed \(seed): connection kept") }
                    client.close()
                    client = try rig.connect()
                }
            }
            #expect(mismatches.isEmpty, "\(mismatches.count) of 200: \(mismatches.prefix(3))")
        }
    }

    @Test("1500 random heads with bytes replaced, then the close: a 502, a valid relayed head, or the close; never a hang or crash")
    func mutatedHeads() throws {
        try withRig { rig in
            var client = try rig.connect()
            defer { client.close() }
            var failures: [String] = []
            var outcomes: [String: Int] = [:]
            for seed in 0..<1500 {
                try client.send(rig.request("/mutated/\(seed)"))
                do {
                    let response = try client.readFinalResponse()
                    if response.status == 502 {
                        outcomes["502", default: 0] += 1
                        if response.problem?.error != "upstream-protocol-error" {
                            failures.append("seed \(seed): 502 \(response.bodyText)")
                        }
                    } else {
                        outcomes["relayed", default: 0] += 1
                        if !response.headText.hasSuffix(Self.via + "\r\n") && !response.headText.hasSuffix("Connection: close\r\n\r\n") {
                            failures.append("seed \(seed): \(response.headText.suffix(200).debugDescription)")
                        }
                    }
                } catch TestSocketError.closed {
                    outcomes["closed", default: 0] += 1
                } catch {
                    failures.append("seed \(seed): \(error)")
                    if rig.proxy.hasExited { break }
                }
                // Whatever happened, the next case goes on a fresh client connection unless this one is sure to be good.
                client.close()
                client = try rig.connect()
            }
            #expect(failures.isEmpty, "\(failures.count): \(failures.prefix(5))")
            #expect(!rig.proxy.hasExited)
            #expect(outcomes["502", default: 0] > 0 && outcomes["relayed", default: 0] > 0, "\(outcomes)")
        }
    }

    // MARK: curl

    /// curl through the proxy, two URLs on one connection: what it wrote (`-i --raw`), and per transfer
    /// `num_connects http_code`.
    func curl(_ rig: Rig, _ paths: [String], _ extra: [String] = []) throws -> (output: String, transfers: [String]) {
        let result = try ExternalCommand.run("/usr/bin/curl", ["-sS", "-i", "--raw", "--noproxy", "", "-x",
                                                               "http://127.0.0.1:\(rig.proxy.port)", "--max-time", "10",
                                                               "-w", "%{stderr}T %{num_connects} %{http_code}\n"]
                                                 + extra + paths.map(rig.url), timeout: 20)
        #expect(result.status == 0, "curl: \(result.stderr)")
        let transfers = result.stderr.split(separator: "\n").filter { $0.hasPrefix("T ") }.map { String($0.dropFirst(2)) }
        return (result.stdout, transfers)
    }

    @Test("curl: relayed heads and bodies as sent on the wire, one connection for two transfers")
    func curlClient() throws {
        try withRig { rig in
            let ows = Expected("HTTP/1.1 200 OK", ["X-A: spaced", "X-B: tabbed", "X-C: mixed  inner \t x", "X-Empty: ",
                                                   "X-Blank: ", "Content-Length: 5"])
            let listed = Expected("HTTP/1.1 200 OK", ["X-Keep: 1", "Content-Length: 5"])
            let first = try curl(rig, ["/case/ows", "/case/connection-listed"])
            #expect(first.output.debugDescription == (ows.head() + "hello" + listed.head() + "hello").debugDescription)
            #expect(first.transfers == ["1 200", "0 200"])

            let chunked = Expected("HTTP/1.1 200 OK", ["X-After: 1", "Transfer-Encoding: chunked"]).head()
            let interim = "HTTP/1.1 100 Continue\r\n\(Self.via)\r\n" + "HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload; as=style\r\n"
                + "Link: </app.js>; rel=preload\r\nX-Hint: \u{e9}\r\n\(Self.via)\r\n"
            let final = Expected("HTTP/1.1 200 OK", ["Link: </style.css>; rel=preload; as=style", "Content-Length: 5"]).head()
            let second = try curl(rig, ["/case/chunked-trailers", "/case/interim"])
            #expect(second.output.debugDescription == (chunked + "5\r\nhello\r\n6\r\n world\r\n0\r\nX-Sum: abc\r\nX-Other: d\r\n\r\n"
                + interim + final + "hello").debugDescription)
            #expect(second.transfers == ["1 200", "0 200"])

            let bodiless = try curl(rig, ["/case/204-cl", "/case/304-cl", "/case/reason-empty"])
            #expect(bodiless.output.debugDescription == (Expected("HTTP/1.1 204 No Content", ["Content-Length: 5", "X-A: 1"]).head()
                + Expected("HTTP/1.1 304 Not Modified", ["ETag: \"v1\"", "Content-Length: 5"]).head()
                + Expected("HTTP/1.1 404 ", ["Content-Length: 5"]).head() + "hello").debugDescription)
            #expect(bodiless.transfers == ["1 204", "0 304", "0 404"])

            let head = try curl(rig, ["/case/head-cl", "/case/head-chunked"], ["-I"])
            #expect(head.output.debugDescription
                == (Expected("HTTP/1.1 200 OK", ["Content-Type: text/plain", "Content-Length: 1000"]).head()
                    + Expected("HTTP/1.1 200 OK", ["Transfer-Encoding: chunked", "X-A: 1"]).head()).debugDescription)
            #expect(head.transfers == ["1 200", "0 200"])

            let old = try curl(rig, ["/case/chunked-trailers"], ["--http1.0"])
            #expect(old.output.debugDescription
                == (Expected("HTTP/1.1 200 OK", ["X-After: 1"]).head(connection: "Connection: close") + "hello world").debugDescription)
        }
    }

    /// The origin: `/conn` answers which of its connections it came on (`conn=N`); `/case/NAME` writes the case's
    /// pieces (bytes, or a pause in seconds) and keeps the connection for the next request unless the case ends
    /// with `None`, which closes it. `/random/SEED` writes a random valid head and body in random pieces, and
    /// `/expected/SEED` (asked of the origin directly) answers with what the client must get for it, from a model of
    /// SPEC §6 written in Python; `/mutated/SEED` writes that head with 1 to 3 bytes replaced, then closes.
    static let origin = #"""
    import socket, sys, threading, time

    def pattern(n):
        return bytes(((i * 31 + 7) & 0xFF) for i in range(256)) * (n // 256) + bytes(((i * 31 + 7) & 0xFF) for i in range(n % 256))

    def slow(data, pause):
        out = []
        for i in range(len(data)):
            out += [data[i:i + 1], pause]
        return out

    def fields(n, cl=b"Content-Length: 5\r\n"):
        return b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-F-%d: v-%d\r\n" % (i, i) for i in range(n)) + cl + b"\r\nhello"

    SLOW = b"HTTP/1.1 200 OK\r\nX-Slow: a b\r\nContent-Length: 5\r\n"
    BIG = b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-Big-%d: %s\r\n" % (i, bytes([97 + i % 26]) * 1000) for i in range(63)) \
        + b"Content-Length: 5\r\n\r\nhello"
    CHUNKED = b"HTTP/1.1 200 OK\r\nTrailer: X-Sum\r\nTransfer-Encoding: chunked\r\nX-After: 1\r\n\r\n" \
        b"5\r\nhello\r\n6\r\n world\r\n0\r\nX-Sum: abc\r\nX-Other: d\r\n\r\n"

    CASES = {
        "reason-trailing-space": [b"HTTP/1.1 200 OK \r\nContent-Length: 5\r\n\r\nhello"],
        "reason-leading-tab": [b"HTTP/1.1 200 \tOK\r\nContent-Length: 5\r\n\r\nhello"],
        "reason-empty": [b"HTTP/1.1 404 \r\nContent-Length: 5\r\n\r\nhello"],
        "reason-obs-text": [b"HTTP/1.1 200 Gr\xc3\xbc\xc3\x9fe\r\nContent-Length: 5\r\n\r\nhello"],
        "obs-text": [b"HTTP/1.1 200 OK\r\nX-Name: caf\xc3\xa9 \xe2\x98\x95 ok\r\nContent-Length: 5\r\n\r\nhello"],
        "ows": [b"HTTP/1.1 200 OK\r\nX-A:   spaced   \r\nX-B:\ttabbed\t\r\nX-C: \t mixed  inner \t x \t \r\n"
                b"X-Empty:\r\nX-Blank: \t \r\nContent-Length: \t5 \r\n\r\nhello"],
        "cl-list-same": [b"HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\nX-After: 1\r\n\r\nhello"],
        "cl-repeated-same": [b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Mid: 1\r\nContent-Length: 5\r\n\r\nhello"],
        "cl-conflict": [b"HTTP/1.1 200 OK\r\nContent-Length: 5, 6\r\n\r\nhello!"],
        "cl-conflict-lines": [b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!"],
        "cl-signed": [b"HTTP/1.1 200 OK\r\nContent-Length: +5\r\n\r\nhello"],
        "chunked-trailers": [CHUNKED],
        "te-gzip-chunked": [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"],
        "te-cl-both": [b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"],
        "connection-listed": [b"HTTP/1.1 200 OK\r\nConnection: x-hop, keep-alive\r\nX-Hop: secret\r\nKeep-Alive: timeout=5\r\n"
                              b"X-Keep: 1\r\nProxy-Connection: keep-alive\r\nTE: trailers\r\nTrailer: X-None\r\nUpgrade: h2c\r\n"
                              b"Proxy-Authenticate: Basic realm=\"x\"\r\nx-hop: again\r\nContent-Length: 5\r\n\r\nhello"],
        "connection-content-length": [b"HTTP/1.1 200 OK\r\nConnection: content-length\r\nContent-Length: 5\r\n\r\nhello"],
        "connection-transfer-encoding": [b"HTTP/1.1 200 OK\r\nConnection: Transfer-Encoding\r\nTransfer-Encoding: chunked\r\n\r\n"
                                         b"5\r\nhello\r\n0\r\n\r\n"],
        "http10-close": [b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n", 0.05, pattern(300000), None],
        "http10-cl": [b"HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\nhello", None],
        "204-cl": [b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\nX-A: 1\r\n\r\n"],
        "304-cl": [b"HTTP/1.1 304 Not Modified\r\nETag: \"v1\"\r\nContent-Length: 5\r\n\r\n"],
        "head-cl": [b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 1000\r\n\r\n"],
        "interim": [b"HTTP/1.1 100 Continue\r\n\r\n", 0.05,
                    b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload; as=style\r\nLink:  </app.js>; rel=preload \r\n"
                    b"X-Hint: \xc3\xa9\r\n\r\n", 0.05,
                    b"HTTP/1.1 200 OK\r\nLink: </style.css>; rel=preload; as=style\r\nContent-Length: 5\r\n\r\nhello"],
        "slow-head": slow(SLOW + b"\r\n", 0.004) + [b"hello"],
        "split-before-final-crlf": [SLOW, 0.1, b"\r\nhello"],
        "split-inside-final-crlf": [SLOW + b"\r", 0.1, b"\nhello"],
        "split-after-head": [SLOW + b"\r\n", 0.1, b"hello"],
        "split-inside-field": [SLOW[:20], 0.1, SLOW[20:] + b"\r\nhello"],
        "split-inside-status": [SLOW[:6], 0.1, SLOW[6:] + b"\r\nhello"],
        "fields-250": [fields(250)],
        "fields-299": [fields(299)],
        "fields-300": [fields(300)],
        "near-64k": [BIG],
        "near-64k-pieces": [x for i in range(0, len(BIG), 7000) for x in (BIG[i:i + 7000], 0.005)],
        "fields-250-pieces": [x for f in [fields(250)] for i in range(0, len(f), 100) for x in (f[i:i + 100], 0.001)],
        "near-120k": [b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-Big-%d: %s\r\n" % (i, b"v" * 1000) for i in range(120))
                      + b"Content-Length: 5\r\n\r\nhello"],
        "over-128k": [b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-Big-%d: %s\r\n" % (i, b"v" * 1000) for i in range(132))
                      + b"Content-Length: 5\r\n\r\nhello"],
        "interim-one-write": [b"HTTP/1.1 100 Continue\r\n\r\n"
                              b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload; as=style\r\nLink:  </app.js>; rel=preload \r\n"
                              b"X-Hint: \xc3\xa9\r\n\r\n"
                              b"HTTP/1.1 200 OK\r\nLink: </style.css>; rel=preload; as=style\r\nContent-Length: 5\r\n\r\nhello"],
        "names": [b"HTTP/1.1 200 OK\r\nx-lower: a\r\nX-UPPER: B\r\nMiXeD-CaSe: c\r\nX!#$%&'*+-.^_`|~: v\r\n"
                  b"X-Url: http://a:b/c?d=e:f\r\nX-Quote: \"a, b\"\r\nContent-Length: 5\r\n\r\nhello"],
        "hop-case": [b"HTTP/1.1 200 OK\r\nCONNECTION: X-HOP\r\nx-HoP: 1\r\nKEEP-ALIVE: t=1\r\nX-Keep: 1\r\n"
                     b"TRANSFER-ENCODING: Chunked\r\nPROXY-AUTHENTICATE: Basic\r\n\r\n5\r\nhello\r\n0\r\n\r\n"],
        "connection-odd-list": [b"HTTP/1.1 200 OK\r\nConnection: , x-hop ,,\tkeep-alive , \r\nX-Hop: 1\r\nX-Keep: 1\r\n"
                                b"Connection: x-two\r\nX-Two: 2\r\nContent-Length: 5\r\n\r\nhello"],
        "connection-close-11": [b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 5\r\n\r\nhello", None],
        "http10-keep-alive": [b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 5\r\n\r\nhello"],
        "cl-extra": [b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhelloHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nEXTRA"],
        "cl-extra-late": [b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", 0.05, b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nEVIL"],
        "chunked-extra": [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nEVIL"],
        "204-body": [b"HTTP/1.1 204 No Content\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nEVIL"],
        "cl-leading-zeros": [b"HTTP/1.1 200 OK\r\nContent-Length: 005\r\n\r\nhello"],
        "cl-zero": [b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nX-A: 1\r\n\r\n"],
        "cl-overflow": [b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999999\r\n\r\nhello"],
        "cl-empty": [b"HTTP/1.1 200 OK\r\nContent-Length: \r\n\r\nhello"],
        "cl-list-empty-element": [b"HTTP/1.1 200 OK\r\nContent-Length: 5,\r\n\r\nhello"],
        "te-chunked-twice": [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"],
        "te-identity": [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: identity\r\nContent-Length: 5\r\n\r\nhello"],
        "te-http10": [b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", None],
        "status-999": [b"HTTP/1.1 999 Weird\r\nContent-Length: 5\r\n\r\nhello"],
        "status-599": [b"HTTP/1.1 599 Odd\r\nContent-Length: 5\r\n\r\nhello"],
        "interim-102-199": [b"HTTP/1.1 102 Processing\r\nX-P: 1\r\n\r\nHTTP/1.1 199 Misc\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"],
        "interim-hop": [b"HTTP/1.1 103 Early Hints\r\nConnection: x-a\r\nX-A: 1\r\nKeep-Alive: t=1\r\nLink: </a>\r\nContent-Length: 7\r\n\r\n"
                        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"],
        "partial-head-close": [b"HTTP/1.1 200 OK\r\nContent-Len", None],
        "nothing-close": [None],
        "cut-body-close": [b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhel", None],
        "head-chunked": [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-A: 1\r\n\r\n"],
        "304-chunked": [b"HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\nX-A: 1\r\n\r\n"],
        "long-reason": [b"HTTP/1.1 200 " + b"r" * 4000 + b"\r\nContent-Length: 5\r\n\r\nhello"],
        "status-101-unasked": [b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\nhello"],
        "bad-obs-fold": [b"HTTP/1.1 200 OK\r\nX-A: a\r\n b\r\nContent-Length: 5\r\n\r\nhello"],
        "bad-space-before-colon": [b"HTTP/1.1 200 OK\r\nX-A : a\r\nContent-Length: 5\r\n\r\nhello"],
        "bad-bare-lf": [b"HTTP/1.1 200 OK\r\nX-A: a\nContent-Length: 5\r\n\r\nhello"],
        "bad-bare-cr": [b"HTTP/1.1 200 OK\r\nX-A: a\rb\r\nContent-Length: 5\r\n\r\nhello"],
        "bad-nul": [b"HTTP/1.1 200 OK\r\nX-A: a\x00b\r\nContent-Length: 5\r\n\r\nhello"],
        "bad-ctl": [b"HTTP/1.1 200 OK\r\nX-A: a\x01b\r\nContent-Length: 5\r\n\r\nhello"],
        "bad-del": [b"HTTP/1.1 200 OK\r\nX-A: a\x7fb\r\nContent-Length: 5\r\n\r\nhello"],
        "bad-empty-name": [b"HTTP/1.1 200 OK\r\n: a\r\nContent-Length: 5\r\n\r\nhello"],
        "bad-name-char": [b"HTTP/1.1 200 OK\r\nX(A): a\r\nContent-Length: 5\r\n\r\nhello"],
        "bad-status-short": [b"HTTP/1.1 20 OK\r\nContent-Length: 5\r\n\r\nhello"],
        "bad-status-long": [b"HTTP/1.1 2000 OK\r\nContent-Length: 5\r\n\r\nhello"],
        "bad-status-099": [b"HTTP/1.1 099 Low\r\nContent-Length: 5\r\n\r\nhello"],
        "bad-version-2": [b"HTTP/2.0 200 OK\r\nContent-Length: 5\r\n\r\nhello"],
        "bad-version-lower": [b"http/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"],
        "bad-icy": [b"ICY 200 OK\r\nContent-Length: 5\r\n\r\nhello"],
        "bad-reason-nul": [b"HTTP/1.1 200 O\x00K\r\nContent-Length: 5\r\n\r\nhello"],
        "bad-reason-cr": [b"HTTP/1.1 200 O\rK\r\nContent-Length: 5\r\n\r\nhello"],
        "bad-leading-space-field": [b"HTTP/1.1 200 OK\r\n X-A: a\r\nContent-Length: 5\r\n\r\nhello"],
        "bad-no-colon": [b"HTTP/1.1 200 OK\r\nX-A a\r\nContent-Length: 5\r\n\r\nhello"],
        "bad-chunk-size": [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n"],
        "reason-missing": [b"HTTP/1.1 404\r\nContent-Length: 5\r\n\r\nhello"],
        "latin1-value": [b"HTTP/1.1 200 OK\r\nX-Name: caf\xe9\r\nContent-Length: 5\r\n\r\nhello"],
        "latin1-reason": [b"HTTP/1.1 200 caf\xe9\r\nContent-Length: 5\r\n\r\nhello"],
    }

    # Random valid heads (`/random/SEED`) and, from a model of SPEC §6 written here, what the client must get for
    # each (`/expected/SEED`, asked of the origin directly): the status line as sent, hop-by-hop and Connection-listed
    # fields gone (any case), OWS around values removed, the framing written last, then Via.
    import random
    TCHAR = "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
    HOP = ["connection", "keep-alive", "proxy-connection", "te", "trailer", "upgrade", "proxy-authenticate"]
    OWS = ["", " ", "\t", "  ", " \t ", "\t\t"]
    VCHAR = [chr(c) for c in range(0x21, 0x7f)] + ["\u00e9", "\u2615", "\u00fc"]

    def mixcase(rng, text):
        return "".join(c.upper() if rng.random() < 0.5 else c.lower() for c in text)

    def random_case(seed):
        rng = random.Random(seed)
        status = rng.choice([200, 201, 203, 400, 404, 410, 418, 500, 503, 599])
        reason = rng.choice(["OK", "", " ", "\tTabbed", "Trailing ", "Gr\u00fc\u00dfe", "a  b\tc", "x" * rng.randint(1, 300)])
        chunked = rng.random() < 0.4
        body = ("body-%d-" % seed).encode() * rng.randint(0, 50)
        listed = ["x-l%d" % rng.randint(0, 3) for _ in range(rng.randint(0, 3))]
        fields = []
        for _ in range(rng.randint(0, 40)):
            kind = rng.random()
            if kind < 0.15:
                name = mixcase(rng, rng.choice(HOP[1:]))
            elif kind < 0.3:
                name = mixcase(rng, rng.choice(["x-l0", "x-l1", "x-l2", "x-l3"]))
            else:
                name = "".join(rng.choice(TCHAR) for _ in range(rng.randint(1, 20)))
                if name.lower() in HOP + ["content-length", "transfer-encoding", "host"]:
                    name = "x-" + name
            inner = ""
            for _ in range(rng.randint(0, 30)):
                inner += rng.choice(VCHAR) if rng.random() < 0.85 else rng.choice([" ", "\t"])
            inner = inner.strip(" \t")
            fields.append((name, inner, rng.choice(OWS), rng.choice(OWS)))
        if listed or rng.random() < 0.3:
            tokens = listed + (["keep-alive"] if rng.random() < 0.5 else [])
            at = rng.randint(0, len(fields))
            fields.insert(at, (mixcase(rng, "connection"), ", ".join(tokens), rng.choice(OWS), rng.choice(OWS)))
        framing = ("Transfer-Encoding", "chunked") if chunked else ("Content-Length", str(len(body)))
        fields.insert(rng.randint(0, len(fields)), (mixcase(rng, framing[0]), framing[1], rng.choice(OWS), rng.choice(OWS)))
        wire = ("HTTP/1.1 %d %s\r\n" % (status, reason)).encode()
        wire += b"".join(("%s:%s%s%s\r\n" % (n, a, v, b)).encode() for n, v, a, b in fields) + b"\r\n"
        if chunked:
            rest, out = body, b""
            while rest:
                n = rng.randint(1, 40)
                out += b"%x\r\n" % len(rest[:n]) + rest[:n] + b"\r\n"
                rest = rest[n:]
            wire += out + b"0\r\n\r\n"
        else:
            wire += body
        listed_lower = set()
        for n, v, _, _ in fields:
            if n.lower() == "connection":
                listed_lower |= {t.strip(" \t").lower() for t in v.split(",")}
        expected = ("HTTP/1.1 %d %s\r\n" % (status, reason)).encode()
        for n, v, _, _ in fields:
            low = n.lower()
            if low in HOP or low in listed_lower or low in ("content-length", "transfer-encoding"):
                continue
            expected += ("%s: %s\r\n" % (n, v)).encode()
        expected += ("%s: %s\r\n" % framing).encode() + b"Via: 1.1 datamode-proxy\r\n\r\n" + body
        cuts = sorted(rng.sample(range(1, len(wire)), min(rng.randint(0, 4), len(wire) - 1)))
        pieces = []
        last = 0
        for cut in cuts + [len(wire)]:
            pieces += [wire[last:cut], 0.001]
            last = cut
        return pieces, expected

    def mutated_case(seed):
        """A random head with 1 to 3 of its bytes replaced (CR, LF, NUL, colon, space, tab, comma, a digit, a byte
        past 0x7f...), then the close."""
        rng = random.Random(seed * 7919 + 1)
        pieces, _ = random_case(seed)
        wire = bytearray(b"".join(p for p in pieces if isinstance(p, bytes)))
        end = wire.find(b"\r\n\r\n") + 4
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(0, end)
            wire[at] = rng.choice([0x0d, 0x0a, 0x00, 0x3a, 0x20, 0x09, 0x2c, 0x30, 0x39, 0x7f, 0x80, 0xc3, 0xff, 0x01, 0x22,
                                   rng.randrange(0, 256)])
        return bytes(wire)

    counter = [0]
    lock = threading.Lock()

    def handle(conn, serial):
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    piece = conn.recv(65536)
                    if not piece:
                        return
                    buf += piece
                head, buf = buf.split(b"\r\n\r\n", 1)
                target = head.split(b"\r\n")[0].split(b" ")[1].decode()
                path = target.split("//", 1)[-1]
                path = path[path.find("/"):] if "://" in target else target
                sys.stdout.write("REQ %d %r\n" % (serial, head))
                if path.startswith("/expected/"):
                    body = random_case(int(path.split("/")[2]))[1]
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
                    continue
                if path.startswith("/random/"):
                    for piece in random_case(int(path.split("/")[2]))[0]:
                        if isinstance(piece, float):
                            time.sleep(piece)
                        else:
                            conn.sendall(piece)
                    continue
                if path.startswith("/mutated/"):
                    conn.sendall(mutated_case(int(path.split("/")[2])))
                    return
                if path == "/conn":
                    body = b"conn=%d" % serial
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
                    continue
                for piece in CASES[path.split("/")[2]]:
                    if piece is None:
                        return
                    if isinstance(piece, float):
                        time.sleep(piece)
                    else:
                        conn.sendall(piece)
        except Exception as e:
            sys.stdout.write("ERROR %d %r\n" % (serial, e))
        finally:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()

    listener = socket.socket(socket.AF_INET)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    sys.stdout.write("PORT %d\n" % listener.getsockname()[1])
    while True:
        sock, _ = listener.accept()
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with lock:
            counter[0] += 1
            serial = counter[0]
        threading.Thread(target=handle, args=(sock, serial), daemon=True).start()
    """#
}
