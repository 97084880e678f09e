import DatamodeTestSupport
import Foundation
import Testing

/// SPEC §17 "Translation is strict" and "Limits", through the real binary, with a raw HTTP/2 client (`H2Probe`,
/// Python `h2`/`hyperframe` with their own checks turned off): every malformed request is a stream error that never
/// reaches the origin, every flood is a GOAWAY counted by reason, and the connection's other streams, and other
/// connections, carry on.
@Suite struct HTTP2StrictnessEndToEndTests {
    typealias Rig = InterceptionEndToEndTests.Rig

    static func probe(_ rig: Rig, _ scenario: String, _ arguments: [String] = []) throws -> H2Probe.Outcome {
        try H2Probe.run(scenario, proxyPort: rig.proxy.port, host: "localhost", port: rig.origin.port, caPath: rig.caPath,
                        arguments: arguments)
    }

    /// The origin never saw a request other than the ones a test made on purpose.
    static func originRequests(_ rig: Rig) -> Int {
        rig.proxy.accessLog.filter { $0["method"] as? String != "CONNECT" && $0["status"] as? Int != 0 }.count
    }

    /// The HTTP/2 downgrade smuggling class: each of these is a stream error (PROTOCOL_ERROR), never forwarded.
    @Test(arguments: [
        ("transfer-encoding", "chunked"), ("connection", "keep-alive"), ("keep-alive", "timeout=5"),
        ("proxy-connection", "keep-alive"), ("upgrade", "websocket"), ("te", "gzip"),
        ("X-Upper", "1"), ("x-bad name", "1"), ("x-crlf", "a\\r\\nx-injected: 1"), ("x-lf", "a\\nb"), ("x-nul", "a\\x00b"),
        ("host", "elsewhere.example"),
    ])
    func aMalformedFieldIsAStreamErrorNeverForwarded(name: String, value: String) throws {
        let rig = try Rig()
        let outcome = try Self.probe(rig, "field", [name, value])
        #expect(outcome.line == "reset PROTOCOL_ERROR", "\(outcome.output)")
        #expect(rig.proxy.accessLog.allSatisfy { $0["method"] as? String == "CONNECT" }, "nothing reached the exchange")
        // The connection and the proxy carry on: a good request right after gets its answer.
        #expect(try Self.probe(rig, "get").line == "response 200 15")
    }

    @Test(arguments: [
        [":method=GET", ":method=GET", ":scheme=https", ":authority=localhost", ":path=/"],      // duplicated
        [":method=GET", ":scheme=https", ":authority=localhost"],                                // :path missing
        [":method=GET", ":scheme=https", ":path=/", "x-a=1", ":authority=localhost"],            // misplaced
        [":method=GET", ":scheme=https", ":authority=localhost", ":path=/", ":status=200"],      // unknown
        [":method=GET", ":scheme=http", ":authority=localhost", ":path=/"],                      // not https
    ])
    func pseudoHeaderAbuseIsAStreamError(fields: [String]) throws {
        let rig = try Rig()
        let fixed = fields.map { $0.replacingOccurrences(of: "=localhost", with: "=localhost:\(rig.origin.port)") }
        let outcome = try Self.probe(rig, "pseudo", fixed)
        #expect(outcome.line == "reset PROTOCOL_ERROR", "\(outcome.output)")
        #expect(rig.proxy.accessLog.allSatisfy { $0["method"] as? String == "CONNECT" })
    }

    /// The same with the excess in a later DATA frame (review15): the origin used to receive the 5 declared bytes as a
    /// whole request and answer it in the pause. The last byte now waits for END_STREAM, so the excess resets the
    /// stream before the request is whole anywhere.
    @Test func dataPastContentLengthInALaterFrameIsAStreamErrorBeforeTheRequestIsWhole() throws {
        let rig = try Rig()
        let outcome = try Self.probe(rig, "data-past-length", ["/upload"])
        #expect(outcome.line == "reset PROTOCOL_ERROR", "\(outcome.output)")
        #expect(!rig.proxy.accessLog.contains { $0["method"] as? String == "POST" && $0["status"] as? Int == 200 },
                "\(rig.proxy.accessLog)")
    }

    @Test func contentLengthThatDisagreesWithDataIsAStreamError() throws {
        let rig = try Rig()
        let outcome = try Self.probe(rig, "content-length-mismatch")
        #expect(outcome.line == "reset PROTOCOL_ERROR", "\(outcome.output)")
        // The exchange may have begun (the head was valid); the origin must not have received a complete request.
        #expect(!rig.proxy.accessLog.contains { $0["method"] as? String == "POST" && $0["status"] as? Int == 200 })
    }

    /// A refusal is a complete answer on its stream; the streams around it complete (SPEC §17).
    @Test func aRefusedStreamLeavesTheOthersAlone() throws {
        let rig = try Rig("""
            mode: constrained
            rules:
              - {name: video, match: {path: "*.mp4"}, tags: {allow-constrained: false}}
            """)
        let outcome = try Self.probe(rig, "mixed", ["/hello.txt", "/video.mp4", "/hello.txt", "/bytes/70000"])
        #expect(outcome.line.hasPrefix("streams 200:15 403:"), "\(outcome.output)")
        #expect(outcome.line.hasSuffix(" 200:15 200:70000"), "\(outcome.output)")
    }

    // MARK: limits, one test per CVE

    static func errors(_ rig: Rig, _ reason: String) throws -> Double? {
        try rig.metrics().counter("datamode_http2_errors_total", ["side": "client", "reason": reason])
    }

    /// CVE-2023-44487 (rapid reset): streams opened and reset faster than they complete end in ENHANCE_YOUR_CALM.
    @Test func cve2023_44487RapidResetIsAGoawayEnhanceYourCalm() throws {
        let rig = try Rig()
        let outcome = try Self.probe(rig, "rapid-reset", ["2000"])
        #expect(outcome.line == "goaway ENHANCE_YOUR_CALM", "\(outcome.output)")
        #expect(try Self.errors(rig, "rapid-reset") == 1)
        #expect(try Self.probe(rig, "get").line == "response 200 15", "other connections carry on")
    }

    /// CVE-2024-27316 (CONTINUATION flood): a header block that never ends is cut off, not buffered.
    @Test func cve2024_27316ContinuationFloodIsAGoaway() throws {
        let rig = try Rig()
        let outcome = try Self.probe(rig, "continuation-flood", ["5000"])
        #expect(outcome.line.hasPrefix("goaway "), "\(outcome.output)")
        #expect(try Self.errors(rig, "continuation-flood") == 1)
        #expect(try Self.probe(rig, "get").line == "response 200 15")
    }

    /// HPACK bomb (RFC 7541 §7.3): a block that decodes to megabytes is refused, not decoded into memory.
    @Test func anHPACKBombIsRefused() throws {
        let rig = try Rig()
        let outcome = try Self.probe(rig, "hpack-bomb")
        #expect(outcome.line.hasPrefix("goaway ") || outcome.line == "response", "\(outcome.output)")
        let counted = try (Self.errors(rig, "hpack-bomb") ?? 0) + (Self.errors(rig, "header-too-large") ?? 0)
        #expect(counted >= 1)
        #expect(try Self.probe(rig, "get").line == "response 200 15")
    }

    /// A header block that cannot be decoded (RFC 9113 §4.3: a connection error), sent while a download is in flight
    /// and no longer read: GOAWAY COMPRESSION_ERROR at once, then the close; the connection does not wait for the
    /// download, which could never end (the client stops opening its window). Other connections are served.
    @Test func anUndecodableHeaderBlockMidDownloadIsAGoawayAndTheClose() throws {
        let rig = try Rig()
        let outcome = try Self.probe(rig, "bad-hpack-mid-download")
        #expect(outcome.line == "downloading then goaway COMPRESSION_ERROR then closed", "\(outcome.output)")
        #expect(try Self.probe(rig, "get").line == "response 200 15")
    }

    /// CVE-2019-9515 (SETTINGS flood), CVE-2019-9512 (PING flood), CVE-2019-9518 (empty frames).
    @Test(arguments: [("settings-flood", "settings-flood"), ("ping-flood", "ping-flood"), ("empty-frames", "empty-frames")])
    func controlFrameFloodsAreAGoawayEnhanceYourCalm(scenario: String, reason: String) throws {
        let rig = try Rig()
        let outcome = try Self.probe(rig, scenario, ["20000"])
        #expect(outcome.line == "goaway ENHANCE_YOUR_CALM", "\(outcome.output)")
        let counted = try (Self.errors(rig, reason) ?? 0) + (Self.errors(rig, "outbound-flood") ?? 0)
        #expect(counted >= 1, "\(outcome.output)")
        #expect(try Self.probe(rig, "get").line == "response 200 15")
    }

    /// More streams than `max-concurrent-streams` after the client acknowledged it: refused (SPEC §17).
    @Test func tooManyStreamsAreRefused() throws {
        let rig = try Rig("http2: {max-concurrent-streams: 10}")
        let outcome = try Self.probe(rig, "too-many-streams", ["40"])
        #expect(outcome.line.hasPrefix("goaway ") || outcome.line == "reset REFUSED_STREAM", "\(outcome.output)")
        #expect(try Self.errors(rig, "too-many-streams") ?? 0 >= 1)
    }

    /// A client that never opens its window does not hold the connection past `client-idle` after the last byte
    /// moved: closed at about 2 s, not at the timer's next whole period (about 4 s; an outside test saw 120 s for 60).
    @Test func aClientThatNeverOpensItsWindowIsClosedAfterClientIdle() throws {
        let rig = try Rig("timeouts: {client-idle: 2s}")
        let outcome = try Self.probe(rig, "zero-window")
        let seconds = outcome.line.split(separator: " ").last.flatMap { Double($0) } ?? -1
        #expect(outcome.line.hasPrefix("closed after") || outcome.line.hasPrefix("goaway"), "\(outcome.output)")
        #expect(seconds >= 1.5 && seconds < 3.5, "\(outcome.output)")
    }

    /// SPEC §17: the HTTP/2 preface in clear text on the proxy port gets 505 and a close.
    @Test func aClearTextPrefaceOnTheProxyPortIs505() throws {
        let rig = try Rig()
        let script = """
            import socket, sys
            s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10)
            s.sendall(b"PRI * HTTP/2.0\\r\\n\\r\\nSM\\r\\n\\r\\n")
            data = b""
            while True:
                chunk = s.recv(65536)
                if not chunk: break
                data += chunk
            print(data.split(b"\\r\\n")[0].decode())
            print("error" if b"http-version-not-supported" in data else "no code")
            """
        let result = try ExternalCommand.run("/usr/bin/python3", ["-c", script, String(rig.proxy.port)], timeout: 30)
        #expect(result.stdout.hasPrefix("HTTP/1.1 505"), "\(result.output)")
    }

    // MARK: the byte-integrity matrix's h2 rows (origin closes: HTTP2EndToEndTests)

    /// A client that resets a stream mid-body: the exchange ends (`client-aborted`), the connection carries on.
    @Test func aStreamResetMidBodyEndsItsExchangeAndTheConnectionCarriesOn() throws {
        let rig = try Rig()
        let outcome = try Self.probe(rig, "reset-mid-body", ["/bytes/5000000"])
        #expect(outcome.line == "reset-sent then response 200 15", "\(outcome.output)")
        AdminPolling.until(timeout: .seconds(10)) {
            rig.proxy.accessLog.contains { ($0["url"] as? String)?.hasSuffix("/bytes/5000000") == true }
        }
        let cut = rig.proxy.accessLog.filter { ($0["url"] as? String)?.hasSuffix("/bytes/5000000") == true }
        #expect(cut.count == 1 && cut[0]["outcome"] as? String == "error" && cut[0]["reason"] as? String == "client-aborted",
                "\(cut)")
    }

    /// A stream reset in the same read as its HEADERS (one TLS record): the request reached the proxy, so it leaves
    /// its one access-log line, `client-aborted`, as a stream reset a moment later does and as an HTTP/1.1 request
    /// whose client drops the connection after the head does; the connection carries on. It used to leave none: the
    /// stream's exchange was aborted before its session had read the head handed to it.
    @Test func aStreamResetWithItsHeadersLeavesItsLogLine() throws {
        let rig = try Rig()
        let outcome = try Self.probe(rig, "reset-with-headers", ["/hello.txt?reset"])
        #expect(outcome.line == "reset-sent then response 200 15", "\(outcome.output)")
        // The connection's CONNECT line is written when it ends: by then every line is in.
        #expect(AdminPolling.until(timeout: .seconds(10)) {
            rig.proxy.accessLog.contains { $0["method"] as? String == "CONNECT" }
        })
        let reset = rig.proxy.accessLog.filter { ($0["url"] as? String)?.hasSuffix("/hello.txt?reset") == true }
        #expect(reset.count == 1, "\(rig.proxy.accessLog)")
        #expect(reset.first?["method"] as? String == "GET" && reset.first?["proto"] as? String == "h2", "\(reset)")
        #expect(reset.first?["outcome"] as? String == "error" && reset.first?["reason"] as? String == "client-aborted",
                "\(reset)")
        #expect(try rig.metrics().counter("datamode_requests_total", ["outcome": "error", "reason": "client-aborted"]) == 1)
    }

    /// A slow reader with a small window: every byte arrives in order, the proxy's buffers stay bounded.
    @Test func aSlowReaderWithASmallWindowGetsEveryByte() throws {
        let rig = try Rig()
        let size = 3_000_000
        let expected = (0..<size).map { HTTPSOrigin.patternByte($0) }
        let path = rig.directory + "/expected.bin"
        try Data(expected).write(to: URL(fileURLWithPath: path))
        let digest = try ExternalCommand.run("/usr/bin/sha256sum", [path], timeout: 30)
        let outcome = try Self.probe(rig, "slow-reader", ["/bytes/\(size)"])
        #expect(outcome.line == "body \(size) sha256 \(digest.stdout.prefix(64))", "\(outcome.output)")
    }

    /// SPEC §17 "flow control is backpressure", the request way: an upload to an origin that reads nothing for three
    /// seconds is held at the client by the windows the proxy does not give back, not taken into the proxy's buffers;
    /// then every byte arrives. What the client can send meanwhile: its stream window (1 MiB), the exchange's input
    /// (512 KiB), the upstream's buffers and the loopback sockets' (a few MB); not the 48 MB it has.
    @Test func anUploadToAnOriginThatReadsNothingIsHeldByTheWindows() throws {
        let rig = try Rig()
        let size = 48_000_000
        let outcome = try Self.probe(rig, "upload-stalled", ["/stall-read/3000", String(size), "2.0"])
        let words = outcome.line.split(separator: " ").map(String.init)
        try #require(words.count >= 9 && words[0] == "by-mark", "\(outcome.output)")
        let byMark = try #require(Int(words[1]))
        #expect(byMark < 16_000_000, "the proxy took \(byMark) bytes while the origin read nothing")
        #expect(words[3] == String(size) && words[7] == "200", "\(outcome.output)")
        #expect(outcome.line.hasSuffix("received \(size) bytes sha256 \(words[5])"), "\(outcome.output)")
    }

    /// SIGTERM (SPEC §17): GOAWAY (NO_ERROR) goes out, and the stream in flight finishes whole.
    @Test func aDrainSendsGoawayAndTheStreamInFlightFinishes() throws {
        let rig = try Rig()
        let size = 4_000_000
        let outcome = try Self.probe(rig, "drain", ["/bytes/\(size)", String(rig.proxy.process.processIdentifier)])
        #expect(outcome.line == "body \(size) goaway NO_ERROR", "\(outcome.output)")
        #expect(rig.proxy.waitForExit(timeout: 20) == 0, "the proxy exits once the stream is done")
    }

    /// CONNECT on a stream (RFC 9113 §8.5) is a tunnel inside the tunnel: refused 400 on its stream, as inside an
    /// HTTP/1 interception; the connection carries on.
    @Test func aConnectStreamIsRefused400() throws {
        let rig = try Rig()
        let outcome = try Self.probe(rig, "pseudo", [":method=CONNECT", ":authority=localhost:\(rig.origin.port)"])
        #expect(outcome.line.hasPrefix("response 400 "), "\(outcome.output)")
        #expect(rig.proxy.accessLog.contains { $0["method"] as? String == "CONNECT" && $0["status"] as? Int == 400
                                                 && $0["proto"] as? String == "h2" })
    }
}
