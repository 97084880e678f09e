import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A keep-alive HTTP/1.1 origin over TLS (Python's `http.server` + `ssl`, one thread per connection) with a fresh
/// self-signed certificate for `localhost` and 127.0.0.1: what interception tests talk to through the proxy
/// (SPEC §9). `TLSFileServer` (`openssl s_server -WWW`) answers HTTP/1.0 and closes after each response; this one
/// keeps connections, echoes request heads, serves large deterministic bodies and upgrades to a WebSocket echo.
///
/// Paths:
/// - `/echo-headers`: the request head as the origin received it (text), to see what the proxy forwarded;
/// - `POST` anything: `received N bytes sha256 HEX` of the body (by `Content-Length` or chunked); `POST /slow-read`
///   reads the body slowly (16 KiB every 2 ms); `POST /answer-early` answers `answered early` before it reads the
///   body (by `Content-Length`), then reads and discards it, as nginx's `return 200` does; `POST /answer-after/N`
///   the same after reading N bytes of it; `POST /refuse-and-close` answers `413` on the head and closes with the
///   body unread (the kernel resets the connection under a client still sending);
/// - `/bytes/N`: N bytes, byte i being `HTTPSOrigin.patternByte(i)` (a test compares what it got with them);
/// - `/chunked/N`: a `103 Early Hints`, then those N bytes chunked (chunks of 1 to 9,000 bytes) with a trailer
///   `x-checksum: <sha256 of the body>`;
/// - `/early-hints-hop-by-hop`: a `103` with `Link` and `Host`, `Connection`, `Keep-Alive`, `Proxy-Connection`,
///   `Upgrade`, `TE`, then a `200` with the body `after hints\n`;
/// - `/forbidden-trailers`: `body before trailers\n` chunked, then a trailer section of `Content-Length`, `Host`,
///   `TE`, `Transfer-Encoding`, `Connection`, `Keep-Alive`, `Upgrade`, `Proxy-Connection` and `Trailer` (none allowed in
///   trailers, RFC 9110 §6.5.1) and `X-Checksum: abc123` (allowed);
/// - `/close-delimited/N`, `/cut/N`: N bytes without `Content-Length`, then a clean TLS close (close_notify) or a
///   dropped TCP connection (a truncation the client must be able to see);
/// - `/cut-mid-record/N`: as `/cut/N`, but the last thing on the wire is half a TLS record (a record header that
///   announces more bytes than follow), the shape of a connection cut inside a record;
/// - `/ws`: `101 Switching Protocols` to any `Upgrade: websocket` request, then echoes raw bytes until EOF;
/// - `/alt-svc`: a response advertising HTTP/3 and HTTP/2 alternatives in `Alt-Svc` (SPEC §16);
/// - `/then-unsolicited`: `answered\n`, then 200 ms later a whole second response nobody asked for, on the same
///   connection (an origin that is confused: its connection must not be reused);
/// - `/big-head/N`: a `200` whose head carries about N bytes of fields (`X-Filler-NNN`, 500 bytes a line, each far
///   under any per-field limit), body `big head\n`; `/big-early-hints/N`: a `103` of about N bytes of `Link` fields
///   (500 bytes a line), then a `200` with the body `after hints\n`;
/// - any other path: the file of that name under `directory/www`, else 404.
/// Every response carries `X-Origin-Connections`: how many TLS connections the origin has accepted so far.
public final class HTTPSOrigin: @unchecked Sendable {
    public let directory: String
    /// The self-signed certificate (PEM): make the proxy trust it with `SSL_CERT_FILE`.
    public let certificatePath: String
    public let port: UInt16
    private let process: Process
    private let logPath: String

    public struct Failure: Error, CustomStringConvertible {
        public var description: String
    }

    /// `names` and `addresses`: the certificate's subjectAltName entries. `bind`: where it listens (`::` is both
    /// families). `tls: false` serves the same paths in plain HTTP. `launcher`: a command the Python interpreter is
    /// run under, e.g. `ip netns exec NAME` (SPEC §16's tests put origins inside a network namespace).
    public init(directory: String, names: [String] = ["localhost"], addresses: [String] = ["127.0.0.1"],
                bind: String = "127.0.0.1", tls: Bool = true, launcher: [String] = []) throws {
        self.directory = directory
        try FileManager.default.createDirectory(atPath: directory + "/www", withIntermediateDirectories: true)
        certificatePath = directory + "/origin-cert.pem"
        let keyPath = directory + "/origin-key.pem"
        let generated = try ExternalCommand.run("/usr/bin/openssl", [
            "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", "/CN=localhost",
            "-days", "2", "-addext", "subjectAltName=" + (names.map { "DNS:\($0)" } + addresses.map { "IP:\($0)" }).joined(separator: ","),
            "-keyout", keyPath, "-out", certificatePath,
        ])
        guard generated.status == 0 else { throw Failure(description: "openssl req failed: \(generated.output)") }
        let scriptPath = directory + "/origin.py"
        try Self.script.write(toFile: scriptPath, atomically: true, encoding: .utf8)
        logPath = directory + "/origin.log"
        _ = FileManager.default.createFile(atPath: logPath, contents: nil)
        process = Process()
        let command = launcher + ["/usr/bin/python3", "-u", scriptPath, certificatePath, keyPath, directory + "/www", bind,
                                  tls ? "tls" : "plain"]
        process.executableURL = URL(fileURLWithPath: command[0])
        process.arguments = Array(command.dropFirst())
        process.standardInput = FileHandle.nullDevice
        process.standardOutput = FileHandle(forWritingAtPath: logPath)
        process.standardError = FileHandle(forWritingAtPath: logPath)
        try process.run()
        let deadline = Date().addingTimeInterval(20)
        var found: UInt16?
        while found == nil && Date() < deadline {
            let log = (try? String(contentsOfFile: logPath, encoding: .utf8)) ?? ""
            if let line = log.split(separator: "\n").first(where: { $0.hasPrefix("PORT ") }) {
                found = UInt16(line.dropFirst(5).trimmingCharacters(in: .whitespaces))
            }
            if found == nil {
                guard process.isRunning else { break }
                usleep(20_000)
            }
        }
        guard let found else {
            if process.isRunning { kill(process.processIdentifier, SIGKILL) }
            throw Failure(description: "the HTTPS origin did not start: \((try? String(contentsOfFile: logPath, encoding: .utf8)) ?? "")")
        }
        port = found
    }

    /// Byte `i` of `/bytes/N`.
    public static func patternByte(_ i: Int) -> UInt8 { UInt8(truncatingIfNeeded: i &* 31 &+ 7) }

    /// Writes a file that `GET /name` serves.
    public func publish(_ name: String, _ bytes: [UInt8]) throws {
        let url = URL(fileURLWithPath: directory + "/www/" + name)
        try FileManager.default.createDirectory(at: url.deletingLastPathComponent(), withIntermediateDirectories: true)
        try Data(bytes).write(to: url)
    }

    /// What the origin logged (one line per request: method and path).
    public var log: String { (try? String(contentsOfFile: logPath, encoding: .utf8)) ?? "" }

    /// SIGKILL: the runner's blocked signal mask is inherited (see `TLSFileServer.stop`).
    public func stop() {
        if process.isRunning {
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
    }

    deinit { stop() }

    static let script = #"""
    import hashlib, http.server, socket, socketserver, ssl, sys, os, threading, time

    cert, key, root, bind, mode = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
    lock = threading.Lock()
    accepted = [0]

    def pattern(n):
        # byte i is (i * 31 + 7) & 0xFF (HTTPSOrigin.patternByte)
        return bytes(((i * 31 + 7) & 0xFF) for i in range(256)) * (n // 256) + bytes(((i * 31 + 7) & 0xFF) for i in range(n % 256))

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self):
            super().setup()
            with lock:
                accepted[0] += 1

        def log_message(self, fmt, *args):
            # getattr: a request that does not parse (SPEC §16's blind relay test sends one) has neither yet.
            sys.stdout.write("REQUEST %s %s\n" % (getattr(self, "command", None), getattr(self, "path", "-")))

        def reply(self, status, body, content_type="application/octet-stream", extra=()):
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("X-Origin-Connections", str(accepted[0]))
            for name, value in extra:
                self.send_header(name, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_HEAD(self):
            self.do_GET()

        def read_body(self, n):
            # /slow-read: an origin that takes its time (16 KiB every 2 ms), so the proxy's buffers fill toward it.
            if not self.path.startswith("/slow-read"):
                return self.rfile.read(n)
            out = bytearray()
            while len(out) < n:
                out += self.rfile.read(min(16384, n - len(out)))
                time.sleep(0.002)
            return bytes(out)

        def do_POST(self):
            if self.path.startswith("/stall-read/"):
                # An origin that reads nothing of the body for N milliseconds, then all of it.
                time.sleep(int(self.path.rsplit("/", 1)[1]) / 1000)
            if self.path == "/refuse-and-close":
                # A server refusing an upload on its head (a 413): the answer, then the connection closed with
                # the body unread, so the kernel resets it while the client is still sending. The answer is sent
                # whole first, as a server that lingers does (RFC 9112 §9.6): shutdown(SHUT_WR) queues the FIN
                # behind it, and the close comes later. Closed at once, the answer could still sit unsent in this
                # socket's queue, which a close with unread data throws away with the reset (session 19: the
                # client's read then found the stream ended with nothing in it, about one run in fifteen under load).
                self.reply(413, b"", extra=(("Connection", "close"),))
                self.wfile.flush()
                self.close_connection = True
                socket.socket.shutdown(self.connection, socket.SHUT_WR)
                time.sleep(0.3)
                self.connection.close()
                return
            if self.path == "/answer-early" or self.path.startswith("/answer-after/"):
                # As nginx's `return 200`: the whole response first (after N bytes of the body for
                # /answer-after/N), then the rest of the body read and discarded.
                left = int(self.headers.get("Content-Length", "0"))
                if self.path.startswith("/answer-after/"):
                    first = min(left, int(self.path.rsplit("/", 1)[1]))
                    self.rfile.read(first)
                    left -= first
                self.reply(200, b"answered early\n")
                self.wfile.flush()
                while left > 0:
                    piece = self.rfile.read(min(65536, left))
                    if not piece:
                        break
                    left -= len(piece)
                return
            digest = hashlib.sha256()
            received = 0
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                    if size == 0:
                        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                            pass
                        break
                    chunk = self.read_body(size)
                    digest.update(chunk)
                    received += len(chunk)
                    self.rfile.readline()
            else:
                body = self.read_body(int(self.headers.get("Content-Length", "0")))
                digest.update(body)
                received = len(body)
            self.reply(200, ("received %d bytes sha256 %s\n" % (received, digest.hexdigest())).encode())

        def do_GET(self):
            if self.path == "/then-unsolicited":
                # The answer, then (200 ms later, the connection idle at the proxy) bytes nobody asked for.
                self.reply(200, b"answered\n", "text/plain")
                self.wfile.flush()
                time.sleep(0.2)
                self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\nunsolicited\n")
                self.wfile.flush()
            elif self.path == "/alt-svc":
                self.reply(200, b"alternatives\n", "text/plain",
                           [("Alt-Svc", 'h3=":443"; ma=86400, h3-29=":443", h2="alt.example:443"; ma=60')])
            elif self.path.startswith("/big-head/"):
                fields = [("X-Filler-%03d" % i, "v" * 484) for i in range(int(self.path[10:]) // 500)]
                self.reply(200, b"big head\n", "text/plain", fields)
            elif self.path.startswith("/big-early-hints/"):
                hints = "".join("Link: </filler-%03d.css>; rel=preload; x=%s\r\n" % (i, "v" * 456)
                                for i in range(int(self.path[17:]) // 500))
                self.wfile.write(("HTTP/1.1 103 Early Hints\r\n" + hints + "\r\n").encode())
                self.reply(200, b"after hints\n", "text/plain")
            elif self.path == "/echo-headers":
                text = self.requestline + "\r\n" + str(self.headers)
                self.reply(200, text.encode(), "text/plain")
            elif self.path.startswith("/bytes/"):
                self.reply(200, pattern(int(self.path[7:])))
            elif self.path.startswith("/chunked/"):
                # N pattern bytes in chunks of 1 to 9000 bytes, then a trailer section (`x-checksum`), after a
                # 103 Early Hints: framing the proxy must carry (SPEC §17: trailers and 1xx relayed).
                n = int(self.path[9:])
                body = pattern(n)
                self.wfile.write(b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n")
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.send_header("Trailer", "x-checksum")
                self.end_headers()
                i, step = 0, 1
                while i < n:
                    part = body[i:i + step]
                    self.wfile.write(b"%x\r\n" % len(part) + part + b"\r\n")
                    i += len(part)
                    step = step * 7 % 9001 or 1
                self.wfile.write(b"0\r\nx-checksum: %s\r\n\r\n" % hashlib.sha256(body).hexdigest().encode())
                self.wfile.flush()
            elif self.path == "/early-hints-hop-by-hop":
                # A 103 with a request's Host and the connection-specific fields of RFC 9113 §8.2.2 beside its Link.
                self.wfile.write(b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n"
                                 b"Host: hints.example\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\n"
                                 b"Proxy-Connection: keep-alive\r\nUpgrade: h2c\r\nTE: trailers\r\n\r\n")
                self.reply(200, b"after hints\n", "text/plain")
            elif self.path == "/forbidden-trailers":
                # A trailer section with fields RFC 9110 §6.5.1 keeps out of trailers (framing, routing) and the
                # connection-specific ones of RFC 9113 §8.2.2, beside one a trailer may carry (`X-Checksum`).
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Transfer-Encoding", "chunked")
                self.send_header("Trailer", "X-Checksum")
                self.end_headers()
                self.wfile.write(b"15\r\nbody before trailers\n\r\n0\r\n"
                                 b"Content-Length: 5\r\nHost: trailer.example\r\nTE: trailers\r\n"
                                 b"Transfer-Encoding: chunked\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\n"
                                 b"Upgrade: h2c\r\nProxy-Connection: keep-alive\r\nTrailer: X-Checksum\r\n"
                                 b"X-Checksum: abc123\r\n\r\n")
                self.wfile.flush()
            elif self.path.startswith(("/close-delimited/", "/cut/", "/cut-mid-record/")):
                # No Content-Length: the body ends with the connection. /close-delimited/N ends it properly
                # (close_notify), /cut/N just drops the TCP connection after N bytes (a truncation).
                n = int(self.path.rsplit("/", 1)[1])
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(pattern(n))
                self.wfile.flush()
                self.close_connection = True
                try:
                    if self.path.startswith("/cut-mid-record/"):
                        # An application-data record header announcing 16 KiB, then 100 bytes of it, then the cut.
                        os.write(self.connection.fileno(), b"\x17\x03\x03\x40\x00" + b"\x5a" * 100)
                        self.connection.shutdown(socket.SHUT_RDWR)
                    elif self.path.startswith("/cut/"):
                        self.connection.shutdown(socket.SHUT_RDWR)
                    else:
                        self.connection.unwrap()
                except OSError:
                    pass
            elif self.path == "/ws" and self.headers.get("Upgrade", "").lower() == "websocket":
                self.send_response(101)
                self.send_header("Upgrade", "websocket")
                self.send_header("Connection", "Upgrade")
                self.end_headers()
                self.wfile.flush()
                self.close_connection = True
                while True:
                    data = self.connection.recv(65536)
                    if not data:
                        break
                    self.connection.sendall(data)
            else:
                path = os.path.normpath(os.path.join(root, self.path.lstrip("/").split("?")[0]))
                if path.startswith(root) and os.path.isfile(path):
                    with open(path, "rb") as f:
                        self.reply(200, f.read())
                else:
                    self.reply(404, b"not found\n", "text/plain")

    class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
        daemon_threads = True
        allow_reuse_address = True
        # socketserver's default backlog is 5: a hundred connections at once (an h2 client's streams, each on an
        # HTTP/1.1 origin connection) overflowed it, and the kernel's SYN retries outlasted the proxy's connect
        # timeout. nginx listens with 511.
        request_queue_size = 511

        address_family = socket.AF_INET6 if ":" in bind else socket.AF_INET

        def server_bind(self):
            # Not HTTPServer's: its getfqdn() is a reverse lookup, which hangs where no resolver is reachable.
            socketserver.TCPServer.server_bind(self)
            self.server_name, self.server_port = "origin", self.server_address[1]

        def get_request(self):
            sock, address = self.socket.accept()
            if mode == "plain":
                return sock, address
            return context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), address

        def finish_request(self, request, client_address):
            if mode != "plain":
                try:
                    request.do_handshake()
                except (ssl.SSLError, OSError):
                    return
            super().finish_request(request, client_address)

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server = Server((bind, 0), Handler)
    sys.stdout.write("PORT %d\n" % server.server_address[1])
    server.serve_forever()
    """#
}
