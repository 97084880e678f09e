import DatamodeTestSupport
import Foundation
#if canImport(Glibc)
import Glibc
#endif
import Testing

/// The byte-integrity matrix inside intercepted TLS (SPEC §6, §9): uploads by length and chunked (chunk sizes that
/// straddle records and buffers: 65,536 / 3 / 100,000 / 17), an origin that reads slowly, downloads to a client
/// that reads slowly, several at once on one proxy, with both cores kept busy by spinning processes.
///
/// Found from outside: a chunked upload inside intercepted TLS aborted the proxy (an exclusivity violation: a
/// libevent_openssl callback re-entered Swift while it held an exclusive access) about one run in five with the CPU
/// busy. Each round here runs every row concurrently; the rounds repeat, and the proxy must be alive and every
/// byte accounted for after each.
@Suite(.serialized) struct TLSByteIntegrityTests {
    static let client = #"""
    import hashlib, socket, ssl, sys, time

    proxy_port, port, ca, row = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]

    def pattern(n, seed):
        block = bytes(((i * 131 + seed * 7 + 3) & 0xFF) for i in range(65536))
        out = bytearray()
        while len(out) < n:
            out += block
        return bytes(out[:n])

    raw = socket.create_connection(("127.0.0.1", proxy_port), timeout=60)
    raw.sendall(b"CONNECT localhost:%d HTTP/1.1\r\nHost: localhost:%d\r\n\r\n" % (port, port))
    head = b""
    while b"\r\n\r\n" not in head:
        head += raw.recv(1)
    assert head.startswith(b"HTTP/1.1 200"), head
    context = ssl.create_default_context(cafile=ca)
    context.options &= ~getattr(ssl, "OP_IGNORE_UNEXPECTED_EOF", 0)
    tls = context.wrap_socket(raw, server_hostname="localhost", suppress_ragged_eofs=False)

    leftover = [b""]  # bytes read past the end of a response: the start of the next one (pipelining)

    def read_response():
        data, leftover[0] = leftover[0], b""
        while b"\r\n\r\n" not in data:
            chunk = tls.recv(65536)
            if not chunk:
                raise SystemExit("EOF before the response head (%d bytes)" % len(data))
            data += chunk
        head, body = data.split(b"\r\n\r\n", 1)
        length = int([l.split(b":", 1)[1] for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:")][0])
        while len(body) < length:
            if row == "slow-download":
                time.sleep(0.002)
            chunk = tls.recv(16384 if row == "slow-download" else 65536)
            if not chunk:
                raise SystemExit("EOF after %d of %d body bytes" % (len(body), length))
            body += chunk
        leftover[0] = body[length:]
        return head, body[:length]

    def pattern_download(n):
        return bytes(((i * 31 + 7) & 0xFF) for i in range(256)) * (n // 256) + bytes(((i * 31 + 7) & 0xFF) for i in range(n % 256))

    if row == "pipelined":
        # Three requests in one write, answered in order with every byte (pipelining inside TLS, SPEC §6).
        sizes = [300_000, 17, 1_000_000]
        tls.sendall(b"".join(b"GET /bytes/%d HTTP/1.1\r\nHost: localhost:%d\r\n\r\n" % (n, port) for n in sizes))
        ok = all(read_response()[1] == pattern_download(n) for n in sizes)
        print("ok" if ok and leftover[0] == b"" else "MISMATCH")
    elif row == "expect-upload":
        # Expect: 100-continue: the body goes only after the interim answer (RFC 9110 §10.1.1).
        body = pattern(2_000_000, 9)
        tls.sendall(b"POST /upload HTTP/1.1\r\nHost: localhost:%d\r\nContent-Length: %d\r\nExpect: 100-continue\r\n\r\n"
                    % (port, len(body)))
        interim = b""
        while b"\r\n\r\n" not in interim:
            interim += tls.recv(1)
        assert interim.startswith(b"HTTP/1.1 100"), interim
        tls.sendall(body)
        head, answer = read_response()
        expected = b"received %d bytes sha256 %s\n" % (len(body), hashlib.sha256(body).hexdigest().encode())
        print("ok" if answer == expected else "MISMATCH %r" % answer)
    elif row in ("chunked-upload", "length-upload", "slow-origin-upload"):
        body = pattern(6_300_000, len(row))
        path = b"/slow-read" if row == "slow-origin-upload" else b"/upload"
        if row == "length-upload":
            tls.sendall(b"POST %s HTTP/1.1\r\nHost: localhost:%d\r\nContent-Length: %d\r\n\r\n" % (path, port, len(body)))
            tls.sendall(body)
        else:
            tls.sendall(b"POST %s HTTP/1.1\r\nHost: localhost:%d\r\nTransfer-Encoding: chunked\r\n\r\n" % (path, port))
            sizes, offset, i = [65536, 3, 100000, 17], 0, 0
            while offset < len(body):
                piece = body[offset:offset + sizes[i % 4]]
                tls.sendall(b"%x\r\n" % len(piece) + piece + b"\r\n")
                offset += len(piece)
                i += 1
            tls.sendall(b"0\r\n\r\n")
        head, answer = read_response()
        expected = b"received %d bytes sha256 %s\n" % (len(body), hashlib.sha256(body).hexdigest().encode())
        print("ok" if answer == expected else "MISMATCH %r" % answer)
    else:
        n = 5_000_000
        tls.sendall(b"GET /bytes/%d HTTP/1.1\r\nHost: localhost:%d\r\n\r\n" % (n, port))
        head, body = read_response()
        want = pattern_download(n)
        print("ok" if body == want else "MISMATCH at %d" % next(i for i in range(len(body)) if body[i] != want[i]))
    """#

    static let rows = ["chunked-upload", "length-upload", "slow-origin-upload", "slow-download", "pipelined", "expect-upload"]

    /// Keeps both cores busy while it lives, as the outside suite did (the crash needed a loaded machine).
    final class CPULoad {
        let processes: [Process]
        init(count: Int = 2) throws {
            processes = try (0..<count).map { _ in
                let spinner = Process()
                spinner.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
                spinner.arguments = ["-c", "while True: pass"]
                try spinner.run()
                return spinner
            }
        }
        deinit {
            for spinner in processes where spinner.isRunning {
                kill(spinner.processIdentifier, SIGKILL)
                spinner.waitUntilExit()
            }
        }
    }

    @Test func everyRowArrivesWholeInsideTLSUnderLoadRoundAfterRound() throws {
        let directory = try ScratchDirectory.make("datamode-tls-bytes")
        defer { ScratchDirectory.remove(directory) }
        let origin = try HTTPSOrigin(directory: directory + "/origin")
        defer { origin.stop() }
        let proxy = try ProxyProcess(config: """
            connect: {ports: [\(origin.port)]}
            tls: {intercept: [localhost]}
            """, environment: ["SSL_CERT_FILE": origin.certificatePath], directory: directory + "/proxy")
        defer { proxy.stop() }
        let scriptPath = directory + "/client.py"
        try Self.client.write(toFile: scriptPath, atomically: true, encoding: .utf8)
        let load = try CPULoad()
        defer { withExtendedLifetime(load) {} }
        let rounds = Int(ProcessInfo.processInfo.environment["DATAMODE_TLS_ROUNDS"] ?? "") ?? 4
        for round in 1...rounds {
            let results = try runConcurrently(Self.rows + ["chunked-upload", "chunked-upload"]) { row in
                try ExternalCommand.run("/usr/bin/python3", [scriptPath, String(proxy.port), String(origin.port),
                                                              proxy.stateDirectory + "/ca.pem", row], timeout: 240)
            }
            for (row, result) in results {
                #expect(result.stdout == "ok\n", "round \(round), \(row): \(result.output)")
            }
            #expect(!proxy.hasExited, "round \(round): the proxy died: \(Self.crashReport(proxy.stderr))")
            if proxy.hasExited { return }
        }
    }

    /// The part of a dead proxy's stderr that says why: from the runtime's first fatal line, a few KiB of it.
    static func crashReport(_ stderr: String) -> String {
        let markers = ["Simultaneous accesses", "Fatal error", "Fatal access", "Crash"]
        guard let start = markers.compactMap({ stderr.range(of: $0)?.lowerBound }).min() else { return String(stderr.suffix(3000)) }
        return String(stderr[start...].prefix(6000))
    }

    /// Runs `body` for each row on its own thread and returns the results in row order.
    func runConcurrently(_ rows: [String], _ body: @escaping @Sendable (String) throws -> ExternalCommand.Result) throws
        -> [(String, ExternalCommand.Result)]
    {
        final class Box: @unchecked Sendable { var results: [Int: Result<ExternalCommand.Result, Error>] = [:] }
        let box = Box()
        let lock = NSLock()
        let group = DispatchGroup()
        for (index, row) in rows.enumerated() {
            group.enter()
            Thread.detachNewThread {
                let result = Result { try body(row) }
                lock.lock(); box.results[index] = result; lock.unlock()
                group.leave()
            }
        }
        group.wait()
        return try rows.enumerated().map { ($0.element, try box.results[$0.offset]!.get()) }
    }
}
