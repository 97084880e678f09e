import DatamodeTestSupport
import Foundation
import Testing

/// HTTP/2 inside interception (SPEC §17) through the real binary, with curl as the client (`--http2`, ALPN
/// `h2, http/1.1`): every stream is an exchange of its own, with the whole of §3–§15, on one connection.
/// The origin is the HTTP/1.1 `HTTPSOrigin` (h2 client ↔ HTTP/1.1 origin).
@Suite struct HTTP2EndToEndTests {
    typealias Rig = InterceptionEndToEndTests.Rig

    /// curl over h2 through the proxy: `-i` output and `-w` lines.
    static func h2(_ rig: Rig, _ arguments: [String]) throws -> ExternalCommand.Result {
        try rig.curl(arguments, http: "--http2")
    }

    @Test func curlSpeaksH2InsideTheTunnelAndSharesOneConnection() throws {
        let rig = try Rig()
        let result = try Self.h2(rig, ["-i", rig.url("/hello.txt"), rig.url("/hello.txt"), rig.url("/hello.txt"),
                                       "-w", "proto=%{http_version} connects=%{num_connects}\n"])
        #expect(result.status == 0, "\(result.output)")
        #expect(result.stdout.components(separatedBy: "HTTP/2 200").count == 4, "\(result.stdout)")
        #expect(result.stdout.components(separatedBy: "hello over tls\n").count == 4, "\(result.stdout)")
        #expect(result.stdout.components(separatedBy: "proto=2 ").count == 4, "\(result.stdout)")
        #expect(result.stdout.components(separatedBy: "connects=0").count == 3, "one connection for all: \(result.stdout)")
        let gets = rig.proxy.accessLog.filter { $0["method"] as? String == "GET" }
        #expect(gets.count == 3)
        #expect(gets.allSatisfy { $0["proto"] as? String == "h2" && $0["status"] as? Int == 200 }, "\(gets)")
        #expect(rig.proxy.accessLog.filter { $0["method"] as? String == "CONNECT" }.count == 1)
        let metrics = try rig.metrics()
        #expect(metrics.counter("datamode_http2_streams_total", ["side": "client"]) == 3)
        #expect(metrics.counter("datamode_tls_intercepted_total") == 1)
        // curl has gone: its connection is no longer counted as open.
        #expect(AdminPolling.until(timeout: .seconds(10)) {
            (try? rig.metrics().counter("datamode_http2_connections_active", ["side": "client"])) == 0
        })
    }

    @Test func http1IsStillSpokenWhenTheClientAsksForIt() throws {
        let rig = try Rig()
        let result = try rig.curl(["-i", rig.url("/hello.txt")])
        #expect(result.stdout.hasPrefix("HTTP/1.1 200"), "\(result.output)")
        #expect(rig.proxy.accessLog.contains { $0["method"] as? String == "GET" && $0["proto"] as? String == "http/1.1" })
    }

    @Test func h2IsNotOfferedWhenTurnedOff() throws {
        let rig = try Rig("http2: {client: false}")
        let result = try Self.h2(rig, ["-i", rig.url("/hello.txt")])
        #expect(result.stdout.hasPrefix("HTTP/1.1 200"), "\(result.output)")
    }

    /// SPEC §17: a refusal is a complete 403 problem+json on its stream; variants of every kind work per stream;
    /// the streams share one connection and none disturbs the others.
    @Test func constrainedModeRefusesAndRewritesStreamByStream() throws {
        let rig = try Rig("""
            mode: constrained
            rules:
              - {name: video, match: {path: "*.mp4"}, tags: {allow-constrained: false}}
            """, tls: "intercept: [localhost]")
        try rig.origin.publish("media/video.mp4", [UInt8](repeating: 0x56, count: 100_000))
        try rig.origin.publish("img/hero.jpg", Array("full-size hero\n".utf8))
        try rig.origin.publish("img/hero@small.jpg", Array("small hero\n".utf8))
        try FileManager.default.createDirectory(atPath: rig.proxy.directory + "/variants", withIntermediateDirectories: true)
        try Data("poster bytes\n".utf8).write(to: URL(fileURLWithPath: rig.proxy.directory + "/variants/poster.jpg"))
        let admin = AdminAPIClient(port: rig.proxy.adminPort)
        #expect(try admin.putVariant("hero-small", ["match": rig.url("/img/*.jpg"), "target": rig.url("/img/$1@small.jpg"),
                                                    "when": "constrained"]).status < 300)
        #expect(try admin.putVariant("promo-poster", ["match": rig.url("/promo.mp4"), "file": "variants/poster.jpg"]).status < 300)

        // One curl, one connection, four streams: a refusal between answers.
        let result = try Self.h2(rig, ["-i", rig.url("/img/hero.jpg"), rig.url("/media/video.mp4"), rig.url("/promo.mp4"),
                                       rig.url("/hello.txt"), "-w", "connects=%{num_connects}\n"])
        #expect(result.status == 0, "\(result.output)")
        let parts = result.stdout.components(separatedBy: "HTTP/2 ").dropFirst().map { "HTTP/2 " + $0 }
        try #require(parts.count == 4, "\(result.stdout)")
        #expect(parts[0].hasPrefix("HTTP/2 200") && parts[0].contains("data-mode-variant: hero-small")
                && parts[0].contains("small hero\n"), "\(parts[0])")
        #expect(parts[1].hasPrefix("HTTP/2 403"), "\(parts[1])")
        #expect(parts[1].contains("content-type: application/problem+json"), "\(parts[1])")
        #expect(parts[1].contains("network-unavailable-reason: constrained"), "\(parts[1])")
        #expect(parts[1].contains("\"error\":\"constrained\""), "\(parts[1])")
        #expect(parts[2].hasPrefix("HTTP/2 200") && parts[2].contains("poster bytes\n"), "\(parts[2])")
        #expect(parts[3].hasPrefix("HTTP/2 200") && parts[3].contains("hello over tls\n"), "\(parts[3])")
        #expect(result.stdout.components(separatedBy: "connects=0").count == 4, "\(result.stdout)")
        // The origin saw the tags and Save-Data on an h2 stream's request, as on any other.
        let echoed = try Self.h2(rig, [rig.url("/echo-headers")])
        #expect(echoed.stdout.lowercased().contains("\nsave-data: on"), "\(echoed.stdout)")
        #expect(echoed.stdout.lowercased().contains("\nallow-constrained: ?1"), "\(echoed.stdout)")
        let lines = rig.proxy.accessLog.filter { $0["proto"] as? String == "h2" }
        #expect(lines.contains { $0["status"] as? Int == 403 && $0["reason"] as? String == "constrained" })
        #expect(lines.contains { $0["variant"] as? String == "hero-small" })
    }

    /// A 5 MB body each way, byte-exact, over one h2 stream each (flow control both ways, SPEC §17).
    @Test func fiveMegabytesEachWayAreByteExact() throws {
        let rig = try Rig()
        let size = 5 * 1024 * 1024
        let download = try Self.h2(rig, ["-o", rig.directory + "/down.bin", "-w", "%{http_code} %{size_download}",
                                         rig.url("/bytes/\(size)")])
        #expect(download.stdout == "200 \(size)", "\(download.output)")
        let got = try Data(contentsOf: URL(fileURLWithPath: rig.directory + "/down.bin"))
        #expect(got.count == size)
        #expect(got.enumerated().allSatisfy { $0.element == HTTPSOrigin.patternByte($0.offset) })

        var upload = [UInt8](repeating: 0, count: size)
        for i in 0..<size { upload[i] = UInt8(truncatingIfNeeded: i &* 31 &+ i >> 9) }
        try Data(upload).write(to: URL(fileURLWithPath: rig.directory + "/up.bin"))
        let digest = try ExternalCommand.run("/usr/bin/sha256sum", [rig.directory + "/up.bin"], timeout: 30)
        let expected = String(digest.stdout.prefix(64))
        // With a length, and chunked (no length: the stream frames it, the proxy chunks it to the origin).
        let sized = try Self.h2(rig, ["--data-binary", "@" + rig.directory + "/up.bin", rig.url("/upload")])
        #expect(sized.stdout == "received \(size) bytes sha256 \(expected)\n", "\(sized.output)")
        let chunked = try Self.h2(rig, ["-T", rig.directory + "/up.bin", "-H", "Transfer-Encoding:", "-X", "POST",
                                        rig.url("/upload-chunked")])
        #expect(chunked.stdout == "received \(size) bytes sha256 \(expected)\n", "\(chunked.output)")
        // A slow origin: the stream's window opens only as the bytes move on (backpressure), and every byte arrives.
        let slow = try Self.h2(rig, ["--data-binary", "@" + rig.directory + "/up.bin", rig.url("/slow-read")])
        #expect(slow.stdout == "received \(size) bytes sha256 \(expected)\n", "\(slow.output)")
    }

    /// A client that reads slowly (curl's --limit-rate: it stops reading the socket between bursts): the socket takes
    /// only part of the TLS records the proxy writes after each callback, the rest waits for libevent's write event,
    /// and the filter must go on encrypting as the socket drains, or the download stalls (SPEC §6, §17).
    @Test func fiveMegabytesToASlowReaderAreByteExact() throws {
        let rig = try Rig()
        let size = 5 * 1024 * 1024
        let download = try Self.h2(rig, ["-o", rig.directory + "/down.bin", "-w", "%{http_code} %{size_download}",
                                         "--limit-rate", "3M", rig.url("/bytes/\(size)")])
        #expect(download.stdout == "200 \(size)" && download.status == 0, "\(download.output)")
        let got = try Data(contentsOf: URL(fileURLWithPath: rig.directory + "/down.bin"))
        #expect(got.count == size)
        #expect(got.enumerated().allSatisfy { $0.element == HTTPSOrigin.patternByte($0.offset) })
    }

    /// An h2 client (Python's `h2`, flow control by the book) that uploads `size` bytes to `path` through the proxy
    /// on one stream, then sends one GET on the same connection; prints what it saw, or `STALL` when 10 s pass with
    /// its window shut.
    static let earlyAnswerClient = #"""
    import socket, ssl, sys
    import h2.config, h2.connection, h2.events
    proxy_port, target, ca, size, path = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
    raw = socket.create_connection(("127.0.0.1", proxy_port), timeout=10)
    raw.sendall(b"CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (target.encode(), target.encode()))
    head = b""
    while b"\r\n\r\n" not in head:
        head += raw.recv(1)
    context = ssl.create_default_context(cafile=ca)
    context.set_alpn_protocols(["h2"])
    tls = context.wrap_socket(raw, server_hostname=target.split(":")[0])
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()

    def exchange(method, path, size):
        sid = conn.get_next_available_stream_id()
        fields = [(":method", method), (":path", path), (":scheme", "https"), (":authority", target)]
        conn.send_headers(sid, fields + ([("content-length", str(size))] if size else []), end_stream=not size)
        sent, body, status, ended, reset = 0, b"", None, False, None
        while True:
            while sent < size and reset is None:
                n = min(conn.local_flow_control_window(sid), conn.max_outbound_frame_size, size - sent)
                if n <= 0:
                    break
                conn.send_data(sid, bytes(n), end_stream=sent + n == size)
                sent += n
            tls.sendall(conn.data_to_send())
            if (ended and sent == size) or reset is not None:
                return "%s %r sent=%d reset=%s" % (status, body, sent, reset)
            try:
                data = tls.recv(65536)
            except socket.timeout:
                return "STALL %s %r sent=%d of %d" % (status, body, sent, size)
            if not data:
                return "EOF %s %r sent=%d" % (status, body, sent)
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived):
                    status = dict(event.headers)[b":status"].decode()
                elif isinstance(event, h2.events.DataReceived) and event.stream_id == sid:
                    body += event.data
                    conn.acknowledge_received_data(event.flow_controlled_length, sid)
                elif isinstance(event, h2.events.StreamEnded) and event.stream_id == sid:
                    ended = True
                elif isinstance(event, h2.events.StreamReset) and event.stream_id == sid:
                    reset = event.error_code

    for path in sys.argv[5:]:
        print(exchange("POST", path, size))
    print(exchange("GET", "/hello.txt", 0))
    """#

    /// An origin that answers an upload before reading it (nginx's `return 200`): the response arrives whole, and
    /// the client can send the rest of its body (HTTP/2: the stream's windows are given back, bytes the exchange
    /// had not taken included) or is read until it stops (HTTP/1.1: the proxy lingers after the close, RFC 9112
    /// §9.6). HTTP/1.1 failed before: the proxy closed with the client's body still arriving, the RST destroyed the
    /// response, and curl printed `100` and "Connection reset by peer". curl is not the h2 client here: curl 7.88
    /// waits forever on an h2 upload answered early, against nginx directly too.
    @Test(arguments: ["h2", "http/1.1"])
    func anUploadAnsweredBeforeItIsReadEndsAtOnce(version: String) throws {
        let rig = try Rig()
        let size = 3_000_000
        if version == "h2" {
            let script = rig.directory + "/early.py"
            try Self.earlyAnswerClient.write(toFile: script, atomically: true, encoding: .utf8)
            // `python3` on PATH: the one `scripts/bootstrap.sh --test` installed `h2` for (as `H2Origin`).
            let result = try ExternalCommand.run("/usr/bin/env", ["python3", script, String(rig.proxy.port), "localhost:\(rig.origin.port)",
                                                                  rig.caPath, String(size), "/answer-early",
                                                                  "/answer-after/1000000"], timeout: 60)
            let early = "200 b'answered early\\n' sent=\(size) reset=None\n"
            #expect(result.stdout == early + early + "200 b'hello over tls\\n' sent=0 reset=None\n", "\(result.output)")
            return
        }
        try Data(count: size).write(to: URL(fileURLWithPath: rig.directory + "/zeros.bin"))
        // Uploads in one curl run: four answered early (each on a connection of its own: the proxy closes it after
        // the answer), one read and answered.
        let early = [rig.url("/answer-early"), rig.url("/answer-after/1000000")]
        let result = try rig.curl(["--data-binary", "@" + rig.directory + "/zeros.bin", "--max-time", "20",
                                   "-w", "%{http_code} %{http_version} exit=%{exitcode}\n"] + early + early + [rig.url("/upload")])
        #expect(result.status == 0, "\(result.output)")
        let answered = String(repeating: "answered early\n200 1.1 exit=0\n", count: 4)
        #expect(result.stdout.hasPrefix(answered + "received \(size) bytes sha256 "), "\(result.output)")
        #expect(result.stdout.hasSuffix("\n200 1.1 exit=0\n"), "\(result.output)")
    }

    /// The same early answer on plain HTTP (no TLS): the lingering connection shuts its write side with a FIN
    /// instead of close_notify, and the client gets every answer.
    @Test func anUploadAnsweredBeforeItIsReadEndsAtOnceOnPlainHTTP() throws {
        let directory = try ScratchDirectory.make("datamode-plain-early")
        defer { ScratchDirectory.remove(directory) }
        let origin = try HTTPSOrigin(directory: directory + "/origin", tls: false)
        defer { origin.stop() }
        let proxy = try ProxyProcess(config: "", directory: directory + "/proxy")
        defer { proxy.stop() }
        try Data(count: 3_000_000).write(to: URL(fileURLWithPath: directory + "/zeros.bin"))
        let url = { (path: String) in "http://127.0.0.1:\(origin.port)\(path)" }
        let early = [url("/answer-early"), url("/answer-after/1000000")]
        let result = try ExternalCommand.run("/usr/bin/curl", [
            "-sS", "--max-time", "20", "-x", "http://127.0.0.1:\(proxy.port)", "--data-binary", "@" + directory + "/zeros.bin",
            "-w", "%{http_code} exit=%{exitcode}\n"] + early + early + [url("/upload")], timeout: 60)
        #expect(result.status == 0, "\(result.output)")
        let answered = String(repeating: "answered early\n200 exit=0\n", count: 4)
        #expect(result.stdout.hasPrefix(answered + "received 3000000 bytes sha256 "), "\(result.output)")
        #expect(result.stdout.hasSuffix("\n200 exit=0\n"), "\(result.output)")
    }

    /// The lingering close has an end: a client that keeps sending a body nobody reads, and never closes, gets the
    /// whole early answer and its FIN, and the connection is closed about 5 s later (`Timeouts.lingerAtMost`), not
    /// at once (the answer would be lost to a reset) and not never (a client could hold a socket forever).
    @Test func aClientThatNeverStopsSendingIsClosedWhenTheLingerRunsOut() throws {
        try Self.withPlainOrigin("datamode-linger-expiry") { origin, client in
            try client.send("POST http://127.0.0.1:\(origin.port)/answer-early HTTP/1.1\r\nHost: 127.0.0.1:\(origin.port)\r\n"
                            + "Content-Length: 100000000\r\n\r\n")
            let response = try client.readResponse(method: "POST")
            #expect(response.status == 200)
            #expect(String(decoding: response.body, as: UTF8.self) == "answered early\n")
            // The FIN after the answer: the connection lingers, reading what the client still sends.
            #expect(client.isClosedByPeer(within: .seconds(5)), "no FIN after the answer")
            let answered = ContinuousClock.now
            // Trickle the body (4 KiB every 20 ms) until sending fails: the proxy closed the socket.
            let piece = [UInt8](repeating: 0x61, count: 4096)
            var cutAt: ContinuousClock.Instant?
            while cutAt == nil && ContinuousClock.now - answered < .seconds(20) {
                do { try client.send(piece) } catch { cutAt = .now }
                usleep(20_000)
            }
            let cut = try #require(cutAt, "the proxy still read the body 20 s after the answer")
            let lingered = cut - answered
            #expect(lingered > .seconds(3) && lingered < .seconds(10), "lingered \(lingered)")
        }
    }

    /// A plain-HTTP origin (`HTTPSOrigin` without TLS), a proxy with the default configuration in front of it, and a
    /// raw client connected to the proxy.
    static func withPlainOrigin(_ name: String, _ body: (HTTPSOrigin, RawHTTPClient) throws -> Void) throws {
        let directory = try ScratchDirectory.make(name)
        defer { ScratchDirectory.remove(directory) }
        let origin = try HTTPSOrigin(directory: directory + "/origin", tls: false)
        defer { origin.stop() }
        let proxy = try ProxyProcess(config: "", directory: directory + "/proxy")
        defer { proxy.stop() }
        try body(origin, try RawHTTPClient(port: proxy.port))
    }

    /// No byte is lost and no truncation is sealed as complete (SPEC §6 over h2): a close-delimited body ends the
    /// stream cleanly only when the origin ended it cleanly; a cut one resets the stream.
    @Test(arguments: [("/close-delimited/300000", true), ("/cut/300000", false), ("/cut-mid-record/100000", false)])
    func aCloseDelimitedBodyEndsTheStreamAsTheOriginEndedIt(path: String, whole: Bool) throws {
        let rig = try Rig()
        let result = try Self.h2(rig, ["-o", rig.directory + "/body.bin", "-w", "%{http_code}", rig.url(path)])
        if whole {
            #expect(result.status == 0, "\(result.output)")
            let got = try Data(contentsOf: URL(fileURLWithPath: rig.directory + "/body.bin"))
            #expect(got.count == 300_000)
        } else {
            // curl: (92) HTTP/2 stream was not closed cleanly: INTERNAL_ERROR
            #expect(result.status != 0, "a cut body must not look complete: \(result.output)")
            #expect(result.stderr.contains("INTERNAL_ERROR"), "\(result.output)")
        }
    }

    /// SPEC §17: `:authority` other than the tunnel's is 421 on that stream.
    @Test func anotherAuthorityIs421OnItsStream() throws {
        let rig = try Rig()
        let result = try Self.h2(rig, ["-i", "-H", "Host: elsewhere.example", rig.url("/hello.txt")])
        #expect(result.stdout.hasPrefix("HTTP/2 421"), "\(result.output)")
        #expect(result.stdout.contains("misdirected-request"))
    }

    /// A stream's request head goes to its exchange in memory only when the exchange's parser would read it back
    /// unchanged within the proxy's limits (`HeadHandoff`); a head past a limit goes as text, and the parser answers
    /// it on its stream exactly as it answers an HTTP/1.1 client: a path past the 8 KiB request line is 414. Over h2 the
    /// next stream on the same connection is served; over HTTP/1.1 the 414 closes the connection, as it always has.
    @Test func aRequestPastALimitIsAnsweredAsOverHTTP1() throws {
        let rig = try Rig()
        let long = rig.url("/hello.txt?" + String(repeating: "a", count: 9_000))
        for http in ["--http2", "--http1.1"] {
            let result = try rig.curl(["-i", long, rig.url("/hello.txt"), "-w", "code=%{http_code} connects=%{num_connects}\n"],
                                      http: http)
            #expect(result.stdout.contains("414") && result.stdout.contains("uri-too-long"), "\(http): \(result.output)")
            let next = http == "--http2" ? "hello over tls\ncode=200 connects=0" : "hello over tls\ncode=200"
            #expect(result.stdout.contains(next), "\(http), then the next request: \(result.output)")
        }
        // Each 414 leaves its access-log line, as every request does (SPEC §8), whichever side refused the head: over
        // h2 the codec refuses a :path past the limit itself, before any exchange exists.
        let refused = rig.proxy.accessLog(atLeast: 2) { $0["status"] as? Int == 414 }
        #expect(Set(refused.compactMap { $0["proto"] as? String }) == ["h2", "http/1.1"], "\(refused)")
        #expect(refused.allSatisfy { $0["outcome"] as? String == "error" && $0["source"] as? String == "intercepted" }, "\(refused)")
    }

    /// A chunked origin body with trailers behind a 103 (SPEC §17: 1xx and trailers relayed): the h2 client gets
    /// the 103, the body byte-exact and the trailer.
    @Test func aChunkedBodyWithTrailersAndAn103ArriveOverH2() throws {
        let rig = try Rig()
        let size = 300_000
        let result = try Self.h2(rig, ["-sS", "-D", rig.directory + "/heads.txt", "-o", rig.directory + "/chunked.bin",
                                       "-w", "%{http_code}", rig.url("/chunked/\(size)")])
        #expect(result.stdout == "200", "\(result.output)")
        let got = try Data(contentsOf: URL(fileURLWithPath: rig.directory + "/chunked.bin"))
        #expect(got.count == size && got.enumerated().allSatisfy { $0.element == HTTPSOrigin.patternByte($0.offset) })
        let heads = try String(contentsOfFile: rig.directory + "/heads.txt", encoding: .utf8)
        #expect(heads.contains("HTTP/2 103") && heads.contains("link: </style.css>; rel=preload"), "\(heads)")
        let digest = try ExternalCommand.run("/usr/bin/sha256sum", [rig.directory + "/chunked.bin"], timeout: 30)
        #expect(heads.contains("x-checksum: \(digest.stdout.prefix(64))"), "the trailer, after the body: \(heads)")
    }

    /// A `103` from an HTTP/1.1 origin goes to an h2 client through the translation a final head goes through (RFC 9113
    /// §8.2.2): its `Link` arrives, and neither the request's `Host` it carried nor the connection-specific fields.
    /// The 103's `host` used to reach the client.
    @Test func anEarlyHintsHeadLosesHostAndTheConnectionSpecificFieldsOverH2() throws {
        let rig = try Rig()
        let dump = rig.directory + "/hints.txt"
        let result = try Self.h2(rig, ["-D", dump, "-w", "code=%{http_code}\n", rig.url("/early-hints-hop-by-hop")])
        #expect(result.status == 0 && result.stdout == "after hints\ncode=200\n", "\(result.output)")
        let sections = try String(contentsOfFile: dump, encoding: .utf8).components(separatedBy: "\r\n\r\n")
        try #require(sections.count >= 2 && sections[0].hasPrefix("HTTP/2 103"), "\(sections)")
        let lines = sections[0].components(separatedBy: "\r\n").dropFirst()
        #expect(lines.contains("link: </style.css>; rel=preload"), "\(sections[0])")
        let names = Set(lines.map { String($0.prefix { $0 != ":" }) })
        #expect(names.isDisjoint(with: ["host", "connection", "keep-alive", "proxy-connection", "transfer-encoding",
                                        "upgrade", "te"]), "\(sections[0])")
        #expect(sections[1].hasPrefix("HTTP/2 200"), "\(sections)")
    }

    /// An origin's trailer section with fields no trailer may carry (RFC 9110 §6.5.1: framing and routing; RFC 9113
    /// §8.2.2: connection-specific) beside one it may (`X-Checksum`): every client gets the whole body, the allowed
    /// trailer and none of the others, and its response ends normally (RFC 9110 §6.5.2: a recipient may discard them).
    /// An h2 client used to get the body, then RST_STREAM INTERNAL_ERROR (curl failed the transfer), and an HTTP/1.1
    /// client a body cut before its last chunk: the proxy refused the whole trailer section once the body had gone out.
    @Test func forbiddenTrailerFieldsAreDroppedAndTheOthersRelayed() throws {
        let rig = try Rig()
        let forbidden = ["content-length", "host", "te", "transfer-encoding", "connection", "keep-alive", "upgrade",
                         "proxy-connection", "trailer"]
        for http in ["--http2", "--http1.1"] {
            let dump = rig.directory + "/trailers\(http).txt"
            let result = try rig.curl(["-D", dump, "-w", "code=%{http_code}\n", rig.url("/forbidden-trailers")], http: http)
            #expect(result.status == 0, "\(http): \(result.output)")
            #expect(result.stdout == "body before trailers\ncode=200\n", "\(http): \(result.output)")
            // What follows the head in curl's dump is the trailer section.
            let sections = try String(contentsOfFile: dump, encoding: .utf8).components(separatedBy: "\r\n\r\n")
            let trailers = sections.count > 1 ? sections[1].lowercased().components(separatedBy: "\r\n") : []
            #expect(trailers.contains("x-checksum: abc123"), "\(http): \(sections)")
            let names = trailers.map { String($0.prefix { $0 != ":" }) }
            #expect(Set(names).isDisjoint(with: forbidden), "\(http): \(sections)")
        }
        let streams = rig.proxy.accessLog.filter { $0["url"] as? String == rig.url("/forbidden-trailers") }
        #expect(streams.count == 2 && streams.allSatisfy { $0["outcome"] as? String == "forwarded" }, "\(streams)")
        #expect(rig.proxy.stderr.contains("trailer fields dropped"), "said in the log: \(rig.proxy.stderr)")
        #expect(rig.proxy.stderr.contains("Content-Length, Host, TE, Transfer-Encoding, Connection"), "\(rig.proxy.stderr)")

        // A plain-HTTP client, on the wire: the same trailer section.
        try Self.withPlainOrigin("datamode-plain-trailers") { origin, client in
            try client.send("GET http://127.0.0.1:\(origin.port)/forbidden-trailers HTTP/1.1\r\nHost: 127.0.0.1:\(origin.port)\r\n\r\n")
            let response = try client.readResponse()
            #expect(response.status == 200 && response.body == Array("body before trailers\n".utf8))
            #expect(response.trailers.map { "\($0.name.lowercased()): \($0.value)" } == ["x-checksum: abc123"], "\(response.trailers)")
            // The connection is kept: the response ended where its framing said.
            try client.send("GET http://127.0.0.1:\(origin.port)/forbidden-trailers HTTP/1.1\r\nHost: 127.0.0.1:\(origin.port)\r\n\r\n")
            #expect(try client.readResponse().status == 200)
        }
    }

    /// A response head larger than the h2 client takes, though within what the proxy relays to an HTTP/1.1 client: one
    /// over what the proxy sends in one header block (`limits.header-section` plus 16 KiB; curl announces no
    /// SETTINGS_MAX_HEADER_LIST_SIZE), and one over what the client announced (Python `h2`: 64 KiB). Each is answered
    /// at once on its stream, `502` `upstream-protocol-error` as an origin head over the proxy's own limits is, and the
    /// next stream on the connection is served. curl used to wait for ever (nghttp2 dropped the HEADERS it would not
    /// send and left the stream open), and the smaller head went out to a client that had said it would not take it.
    @Test func aResponseHeadTooLargeForTheH2ClientIsABadGateway() throws {
        let rig = try Rig()
        let http1 = try rig.curl(["-o", "/dev/null", "-w", "%{http_code}", rig.url("/big-head/130000")])
        #expect(http1.stdout == "200", "an HTTP/1.1 client takes it: \(http1.output)")

        let curl = try Self.h2(rig, ["--max-time", "10", "-w", "%{http_code} took=%{time_total}\n",
                                     "-o", rig.directory + "/big.txt", rig.url("/big-head/130000"),
                                     "-o", rig.directory + "/hello.txt", rig.url("/hello.txt")])
        let codes = curl.stdout.split(separator: "\n").map { $0.split(separator: " ").first.map(String.init) ?? "" }
        #expect(codes == ["502", "200"], "\(curl.output)")
        let took = curl.stdout.components(separatedBy: "took=").dropFirst().compactMap { Double($0.prefix { $0 != "\n" }) }
        #expect(took.count == 2 && took.allSatisfy { $0 < 3 }, "answered at once: \(curl.stdout)")
        let problem = (try? String(contentsOfFile: rig.directory + "/big.txt", encoding: .utf8)) ?? ""
        #expect(problem.contains("\"error\":\"upstream-protocol-error\""), "\(problem)")

        let probe = try H2Probe.run("mixed", proxyPort: rig.proxy.port, host: "localhost", port: rig.origin.port,
                                    caPath: rig.caPath, arguments: ["/big-head/70000", "/hello.txt"])
        #expect(probe.line.hasPrefix("streams 502:") && probe.line.hasSuffix(" 200:15"), "\(probe.output)")

        #expect(AdminPolling.until(timeout: .seconds(10)) {
            rig.proxy.accessLog.filter { $0["method"] as? String == "CONNECT" }.count == 3
        })
        let big = rig.proxy.accessLog.filter { ($0["url"] as? String)?.contains("/big-head/") == true }
        #expect(big.map { $0["proto"] as? String } == ["http/1.1", "h2", "h2"], "\(big)")
        #expect(big.dropFirst().allSatisfy { $0["status"] as? Int == 502 && $0["reason"] as? String == "upstream-protocol-error" },
                "\(big)")
    }

    /// A 1xx the h2 client cannot take (a `103` over the 64 KiB Python `h2` announces) is left out, and the final
    /// response follows on its stream (a hint is only a hint); an HTTP/1.1 client gets the `103`. It went out, and
    /// the client ended the connection.
    @Test func anInterimHeadTooLargeForTheH2ClientIsLeftOut() throws {
        let rig = try Rig()
        let http1 = try rig.curl(["-D", rig.directory + "/heads.txt", rig.url("/big-early-hints/70000")])
        #expect(http1.stdout == "after hints\n", "\(http1.output)")
        let heads = (try? String(contentsOfFile: rig.directory + "/heads.txt", encoding: .utf8)) ?? ""
        #expect(heads.hasPrefix("HTTP/1.1 103") && heads.contains("</filler-139.css>"), "\(heads.prefix(300))")
        let probe = try H2Probe.run("mixed", proxyPort: rig.proxy.port, host: "localhost", port: rig.origin.port,
                                    caPath: rig.caPath, arguments: ["/big-early-hints/70000", "/hello.txt"])
        #expect(probe.line == "streams 200:12 200:15", "\(probe.output)")
    }

    /// A head longer than the stream's pair window (64 KiB), written to the pair as text (as every head is while the
    /// response may be held back, here for image transcoding in the mode), reaches the h2 client whole. The pair
    /// stopped at the window with the head unfinished: logged 200, never sent, curl waited for ever.
    @Test func aHeadLongerThanTheStreamsWindowArrivesWhenWrittenAsText() throws {
        let rig = try Rig("mode: expensive\nimages: {transcode: {when: expensive}}")
        let result = try Self.h2(rig, ["--max-time", "10", "-D", rig.directory + "/heads.txt",
                                       "-w", "%{http_code} %{size_download}\n", "-o", "/dev/null", rig.url("/big-head/70000"),
                                       "-o", "/dev/null", rig.url("/hello.txt")])
        #expect(result.stdout == "200 9\n200 15\n" && result.status == 0, "\(result.output)")
        let heads = (try? String(contentsOfFile: rig.directory + "/heads.txt", encoding: .utf8)) ?? ""
        #expect(heads.contains("x-filler-139: "), "every field: \(heads.suffix(300))")
    }

    /// The access log's `bytesOut` and `bytesIn` (SPEC §8: the body bytes to and from the client) and
    /// `datamode_bytes_total` count what an h2 client receives and sends, its DATA: not the HTTP/1.1 chunk framing the
    /// stream's exchange carries a body in, which the client never sees. A chunked origin body of 3,000,000 bytes is
    /// 3,000,000 out, an upload of as many without `content-length` (chunked towards the origin) 3,000,000 in; they
    /// counted the framing (3,002,595 for the download), what crosses the stream's pair.
    @Test func bodyByteCountsAreWhatTheH2ClientSendsAndReceives() throws {
        let rig = try Rig()
        let size = 3_000_000
        let download = try Self.h2(rig, ["-o", rig.directory + "/chunked.bin", "-w", "%{http_code} %{size_download}",
                                         rig.url("/chunked/\(size)")])
        #expect(download.stdout == "200 \(size)", "\(download.output)")
        try Data((0..<size).map { HTTPSOrigin.patternByte($0) }).write(to: URL(fileURLWithPath: rig.directory + "/up.bin"))
        // From a pipe: curl does not know the length, so the request has no `content-length` (a file's has one).
        let upload = try ExternalCommand.run("/bin/sh", ["-c", "exec /usr/bin/curl \"$@\" < \"$0\"", rig.directory + "/up.bin",
                                                         "-sS", "--max-time", "30", "--suppress-connect-headers", "-x", rig.proxyURL,
                                                         "--http2", "--cacert", rig.caPath, "-T", "-", "-X", "POST",
                                                         rig.url("/upload")], timeout: 60)
        #expect(upload.stdout.hasPrefix("received \(size) bytes "), "\(upload.output)")
        // Both connections' CONNECT lines are written when their tunnels end; a stream's line when its exchange ends,
        // which on a loaded machine may come after its connection's (seen once): every line is waited for.
        for method in ["CONNECT", "GET", "POST"] {
            _ = rig.proxy.accessLog(atLeast: method == "CONNECT" ? 2 : 1, matching: { $0["method"] as? String == method })
        }
        let lines = rig.proxy.accessLog
        let get = try #require(lines.first { $0["method"] as? String == "GET" }, "\(lines)")
        #expect(get["bytesOut"] as? Int == size && get["bytes"] as? Int == size, "\(get)")
        let post = try #require(lines.first { $0["method"] as? String == "POST" }, "\(lines)")
        #expect(post["bytesIn"] as? Int == size, "\(post)")
        // The counter is the lines' sum: the CONNECTs' (nothing of their own) and the POST's short answer besides.
        let metrics = try rig.metrics()
        let out = lines.reduce(0) { $0 + ($1["bytesOut"] as? Int ?? 0) }
        let into = lines.reduce(0) { $0 + ($1["bytesIn"] as? Int ?? 0) }
        #expect(out < size + 1_000 && into == size, "\(lines)")
        #expect(metrics.value("datamode_bytes_total", ["direction": "out"]) == Double(out), "\(metrics.text)")
        #expect(metrics.value("datamode_bytes_total", ["direction": "in"]) == Double(into), "\(metrics.text)")
    }

    /// SPEC §18.3 inside interception, over h2: a refused `https://` upload with `Prefer: respond-async` is stored
    /// and answered 202 on its stream, then delivered over TLS to the origin, verified, when the mode lifts (the
    /// byte-exact checks of deliveries are DeferredUploadEndToEndTests', over plain HTTP to a recording origin).
    @Test func anHTTPSUploadIsDeferredAndDeliveredOverTLS() throws {
        let rig = try Rig("mode: constrained")
        let body = (0..<200_000).map { UInt8(truncatingIfNeeded: $0 &* 17 &+ 3) }
        try Data(body).write(to: URL(fileURLWithPath: rig.directory + "/photo.bin"))
        let stored = try Self.h2(rig, ["-i", "-H", "Allow-Constrained: ?0", "-H", "Prefer: respond-async",
                                       "--data-binary", "@" + rig.directory + "/photo.bin", rig.url("/backup/photo.bin")])
        #expect(stored.stdout.hasPrefix("HTTP/2 202"), "\(stored.output)")
        #expect(stored.stdout.contains("\"status\":\"queued\""), "\(stored.stdout)")
        let admin = AdminAPIClient(port: rig.proxy.adminPort)
        #expect(try admin.put("/mode", #"{"mode": "normal"}"#).status == 200)
        var entry: [String: Any] = [:]
        #expect(AdminPolling.until(timeout: .seconds(30)) {
            entry = (try? admin.get("/deferred").array ?? [])?.first ?? [:]
            return entry["status"] as? String == "delivered"
        }, "\(entry)")
        #expect(entry["originStatus"] as? Int == 200 && entry["attempts"] as? Int == 1, "\(entry)")
        #expect(entry["url"] as? String == rig.url("/backup/photo.bin"))
    }
}
