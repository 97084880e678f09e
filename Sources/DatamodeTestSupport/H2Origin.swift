import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// An HTTP/2-only TLS origin (ALPN `h2`) for SPEC §17's origin side, in Python with the `h2` package (PyPI, installed
/// by `scripts/bootstrap.sh --test`): an implementation that is not the proxy's (nghttp2), with the answers a test
/// needs and the misbehaviour a real origin may show. A fresh self-signed certificate for `localhost` and 127.0.0.1,
/// to trust with `SSL_CERT_FILE`. It takes `maxConcurrentStreams` streams at once (its SETTINGS) and counts what it
/// saw: `GET /stats` → `{"connections", "maxOpen", "streams"}`.
///
/// Paths: `/hello` (a short body with `content-length`), `/stream/N` (N pattern bytes, no length), `/sized/N` (N
/// pattern bytes with `content-length`, in DATA frames of 8 KiB as nginx sends them), `/echo` (the request
/// body back, no length, with trailers `x-body-length` and `x-request-fields`: the field names it received),
/// `/trailers`, `/early-hints` (103 then 200), `/early-hints-reset` (103 then RST_STREAM INTERNAL_ERROR, in one write),
/// `/early-hints-refused` (103 then RST_STREAM REFUSED_STREAM), `/early-hints-goaway` (103, GOAWAY with last stream 0,
/// the connection closed), `/goaway-unprocessed` (the request read whole, then GOAWAY with a last stream below it),
/// `/big-field/N` (a 200 with one field of N bytes), `/many-fields/N` (a 200 with N short fields besides its
/// `content-length`), `/not-modified` (a 304 with a `content-length`, the head ending the stream; a HEAD request for any
/// path is answered the same way with a 200),
/// `/answer-early` (answered on the request head, the body acknowledged
/// and dropped as it comes), `/answer-early-reset` (the same, then RST_STREAM NO_ERROR), `/reset-after/N` (N bytes, then RST_STREAM INTERNAL_ERROR),
/// `/cut-length/N` (`content-length` 2N, N bytes, then RST_STREAM), `/close-after/N` (N bytes, then the TCP
/// connection closed), `/close-once` (the first time on the whole server: the connection closed before any answer),
/// `/refuse-once` (REFUSED_STREAM the first time on
/// each connection), `/stall-read/MS` (no DATA of the stream acknowledged for MS milliseconds after its head, so the
/// origin's windows stay shut that long; then all of it, and once the stream ended the answer `received N bytes sha256
/// HEX`, as `HTTPSOrigin`'s), `/stall-stream/MS` (the same, but the connection's window is opened as DATA arrives:
/// only the stream's own window stays shut), `/sink/…` (the request recorded whole — fields in order, body — and answered `201` once its
/// stream ended: `received`), `/bad-response/KIND` (a malformed response: a `connection` or `transfer-encoding` field, an
/// uppercase name, CR/LF in a value, a request pseudo-header, no `:status`, more DATA than `content-length`).
public final class H2Origin: @unchecked Sendable {
    public let directory: String
    public let certificatePath: String
    public let port: UInt16
    private let process: Process
    private let logPath: String

    public struct Failure: Error, CustomStringConvertible {
        public var description: String
    }

    public init(directory: String, maxConcurrentStreams: Int = 100) throws {
        self.directory = directory
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        certificatePath = directory + "/h2-cert.pem"
        let keyPath = directory + "/h2-key.pem"
        let generated = try ExternalCommand.run("/usr/bin/openssl", [
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost", "-days", "1",
            "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", keyPath, "-out", certificatePath,
        ])
        guard generated.status == 0 else { throw Failure(description: "openssl req failed: \(generated.output)") }
        let scriptPath = directory + "/h2origin.py"
        try Self.script.write(toFile: scriptPath, atomically: true, encoding: .utf8)
        logPath = directory + "/h2origin.log"
        _ = FileManager.default.createFile(atPath: logPath, contents: nil)
        process = Process()
        // `python3` on PATH: the one `scripts/bootstrap.sh --test` installed `h2` for.
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["python3", "-u", scriptPath, certificatePath, keyPath, String(maxConcurrentStreams)]
        process.standardInput = FileHandle.nullDevice
        process.standardOutput = FileHandle(forWritingAtPath: logPath)
        process.standardError = FileHandle(forWritingAtPath: logPath)
        try process.run()
        let deadline = Date().addingTimeInterval(20)
        var found: UInt16?
        while found == nil && Date() < deadline {
            let log = (try? String(contentsOfFile: logPath, encoding: .utf8)) ?? ""
            if let line = log.split(separator: "\n").first(where: { $0.hasPrefix("PORT ") }) {
                found = UInt16(line.dropFirst(5))
            }
            if found == nil {
                guard process.isRunning else { break }
                usleep(20_000)
            }
        }
        guard let found else {
            if process.isRunning { kill(process.processIdentifier, SIGKILL) }
            throw Failure(description: "the h2 origin did not start: \((try? String(contentsOfFile: logPath, encoding: .utf8)) ?? "")")
        }
        port = found
    }

    public var log: String { (try? String(contentsOfFile: logPath, encoding: .utf8)) ?? "" }

    /// A request `/sink/…` received: its fields as they arrived (pseudo-headers first) and its body.
    public struct Received: Sendable {
        public var fields: [(name: String, value: String)]
        public var body: [UInt8]

        public func values(of name: String) -> [String] { fields.filter { $0.name == name }.map(\.value) }
    }

    /// The `/sink/…` requests received so far, in the order their streams ended.
    public var received: [Received] {
        var out: [Received] = []
        while let head = try? String(contentsOfFile: directory + "/received-\(out.count).head", encoding: .utf8),
              let body = FileManager.default.contents(atPath: directory + "/received-\(out.count).body") {
            let fields = head.split(separator: "\n").map { line -> (name: String, value: String) in
                let colon = line.dropFirst().firstIndex(of: ":") ?? line.endIndex
                return (String(line[..<colon]), String(line[colon...].dropFirst().drop { $0 == " " }))
            }
            out.append(Received(fields: fields, body: Array(body)))
        }
        return out
    }

    /// Waits until `count` `/sink/…` requests were received (or `timeout` passed) and returns them.
    public func waitForReceived(_ count: Int, timeout: Duration) -> [Received] {
        let deadline = ContinuousClock.now + timeout
        var got = received
        while got.count < count && ContinuousClock.now < deadline {
            usleep(50_000)
            got = received
        }
        return got
    }

    public func stop() {
        if process.isRunning {
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
    }

    deinit { stop() }

    /// The pattern `/stream/N` sends: byte i is `(i * 31 + 7) mod 256`.
    public static func patternByte(_ i: Int) -> UInt8 { UInt8(truncatingIfNeeded: i &* 31 &+ 7) }

    static let script = #"""
import hashlib, json, os, select, socket, ssl, sys, threading, time
import h2.config, h2.connection, h2.events, h2.errors, h2.settings

cert, key, max_streams = sys.argv[1], sys.argv[2], int(sys.argv[3])
directory = cert.rsplit("/", 1)[0]
stats = {"connections": 0, "maxOpen": 0, "streams": 0, "sunk": 0}
lock = threading.Lock()

def pattern(n):
    # byte i is (i * 31 + 7) & 0xff, which repeats every 256 bytes
    block = bytes(((i * 31 + 7) & 0xff) for i in range(256))
    return block * (n // 256) + block[:n % 256]

class Connection:
    def __init__(self, sock):
        self.sock = sock
        config = h2.config.H2Configuration(client_side=False, validate_outbound_headers=False,
                                           normalize_outbound_headers=False)
        self.conn = h2.connection.H2Connection(config=config)
        self.requests = {}      # stream id -> (headers, body bytearray)
        self.pending = {}       # stream id -> [bytes left, then action after: None | ("trailers", list) | ("reset", code)]
        self.frame_cap = {}     # stream id -> the largest DATA frame it sends (/sized/)
        self.refused = False
        self.open = set()
        self.release_at = {}    # /stall-read/ stream id -> when its DATA starts being acknowledged
        self.stalled = []       # (stream id, flow-controlled length) not acknowledged yet
        self.digests = {}       # /stall-read/ stream id -> [sha256, byte count] (the body is not kept)
        self.stream_only = set()  # /stall-stream/ stream ids: the connection's window was opened on arrival

    def send(self):
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def run(self):
        self.conn.local_settings = h2.settings.Settings(client=False, initial_values={
            h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: max_streams})
        self.conn.initiate_connection()
        self.send()
        while True:
            try:
                self.release_stalled()
                self.sock.settimeout(0.05 if self.stalled else None)
                data = self.sock.recv(65536)
            except socket.timeout:
                continue
            except (ConnectionError, ssl.SSLError, OSError):
                return
            if not data:
                return
            try:
                events = self.conn.receive_data(data)
            except h2.exceptions.ProtocolError as error:
                print("protocol error", error, flush=True)
                self.send()
                return
            try:
                for event in events:
                    self.handle(event)
                self.flush_bodies()
                self.send()
            except ConnectionError:
                return

    def handle(self, event):
        if isinstance(event, h2.events.RequestReceived):
            sid = event.stream_id
            self.open.add(sid)
            with lock:
                stats["streams"] += 1
                stats["maxOpen"] = max(stats["maxOpen"], len(self.open))
            self.requests[sid] = (event.headers, bytearray())
            path = dict((n.decode() if isinstance(n, bytes) else n, v) for n, v in event.headers).get(":path", b"")
            text = path.decode() if isinstance(path, bytes) else path
            if text.startswith("/stall-read/") or text.startswith("/stall-stream/"):
                self.release_at[sid] = time.time() + int(text.split("?")[0].split("/")[2]) / 1000
                self.digests[sid] = [hashlib.sha256(), 0]
            if text.startswith("/stall-stream/"):
                self.stream_only.add(sid)
            if event.stream_ended or (path.decode() if isinstance(path, bytes) else path).startswith("/answer-early"):
                self.respond(sid)
        elif isinstance(event, h2.events.DataReceived):
            sid = event.stream_id
            if sid in self.digests:
                self.digests[sid][0].update(event.data)
                self.digests[sid][1] += len(event.data)
            elif sid in self.requests:
                self.requests[sid][1].extend(event.data)
            if time.time() < self.release_at.get(sid, 0):
                self.stalled.append((sid, event.flow_controlled_length))
                if sid in self.stream_only and event.flow_controlled_length:
                    # /stall-stream/: the connection's window opens at once, the stream's only later.
                    self.conn.increment_flow_control_window(event.flow_controlled_length)
            else:
                self.conn.acknowledge_received_data(event.flow_controlled_length, sid)
        elif isinstance(event, h2.events.StreamEnded):
            if event.stream_id in self.requests:
                self.respond(event.stream_id)
        elif isinstance(event, (h2.events.StreamReset,)):
            self.pending.pop(event.stream_id, None)
            self.open.discard(event.stream_id)
        elif isinstance(event, h2.events.ConnectionTerminated):
            pass

    def finish(self, sid):
        self.open.discard(sid)

    def release_stalled(self):
        """The DATA of /stall-read/ streams whose time came is acknowledged: the origin's windows open."""
        now = time.time()
        kept = []
        for sid, length in self.stalled:
            if now < self.release_at.get(sid, 0):
                kept.append((sid, length))
            elif sid in self.stream_only:
                if length and sid in self.open:
                    self.conn.increment_flow_control_window(length, stream_id=sid)
            else:
                self.conn.acknowledge_received_data(length, sid)
        if len(kept) != len(self.stalled):
            self.stalled = kept
            self.send()

    def respond(self, sid):
        headers, body = self.requests.pop(sid)
        fields = {}
        for name, value in headers:
            name = name.decode() if isinstance(name, bytes) else name
            value = value.decode() if isinstance(value, bytes) else value
            fields.setdefault(name, value)
        path = fields.get(":path", "/").split("?")[0]
        names = ",".join(n.decode() if isinstance(n, bytes) else n for n, _ in headers)
        if fields.get(":method") == "HEAD" or path == "/not-modified":
            # No body, whatever content-length says (RFC 9110 §8.6): the head ends the stream.
            status = "200" if fields.get(":method") == "HEAD" else "304"
            self.conn.send_headers(sid, [(":status", status), ("content-length", "1234"), ("etag", '"v1"')],
                                   end_stream=True)
            self.finish(sid)
            return
        if path.startswith("/stall-read/") or path.startswith("/stall-stream/"):
            digest, count = self.digests.pop(sid)
            self.release_at.pop(sid, None)
            payload = ("received %d bytes sha256 %s\n" % (count, digest.hexdigest())).encode()
            self.conn.send_headers(sid, [(":status", "200"), ("content-length", str(len(payload)))])
            self.queue(sid, payload, None)
        elif path == "/hello":
            payload = b"hello over h2\n"
            self.conn.send_headers(sid, [(":status", "200"), ("content-length", str(len(payload))),
                                         ("x-request-fields", names), ("x-authority", fields.get(":authority", ""))])
            self.queue(sid, payload, None)
        elif path.startswith("/sized/"):
            size = int(path.split("/")[2])
            self.conn.send_headers(sid, [(":status", "200"), ("content-length", str(size))])
            self.frame_cap[sid] = 8192
            self.queue(sid, pattern(size), None)
        elif path.startswith("/stream/"):
            self.conn.send_headers(sid, [(":status", "200"), ("content-type", "application/octet-stream")])
            self.queue(sid, pattern(int(path.split("/")[2])), None)
        elif path == "/request-head":
            # The request's fields as they arrived, in order, one `name: value` a line.
            payload = "".join("%s: %s\n" % (n.decode() if isinstance(n, bytes) else n,
                                             v.decode() if isinstance(v, bytes) else v) for n, v in headers).encode()
            self.conn.send_headers(sid, [(":status", "200"), ("content-length", str(len(payload)))])
            self.queue(sid, payload, None)
        elif path == "/echo":
            self.conn.send_headers(sid, [(":status", "200"), ("x-request-fields", names)])
            self.queue(sid, bytes(body), ("trailers", [("x-body-length", str(len(body)))]))
        elif path in ("/answer-early", "/answer-early-reset"):
            # Answered on the request head, the body still coming: it is acknowledged and thrown away; with
            # -reset, RST_STREAM NO_ERROR after the response asks the client to stop sending (RFC 9113 §8.1).
            payload = b"answered early over h2\n"
            self.conn.send_headers(sid, [(":status", "200"), ("content-length", str(len(payload)))])
            self.queue(sid, payload, ("end-reset", None) if path.endswith("-reset") else None)
        elif path.startswith("/sink/"):
            # The body first, then the head that says it is whole (the test reads heads).
            with lock:
                n = stats["sunk"]
                stats["sunk"] += 1
            with open("%s/received-%d.body" % (directory, n), "wb") as f:
                f.write(bytes(body))
            text = "".join("%s: %s\n" % (n_.decode() if isinstance(n_, bytes) else n_,
                                          v.decode() if isinstance(v, bytes) else v) for n_, v in headers)
            with open("%s/received-%d.head.tmp" % (directory, n), "w") as f:
                f.write(text)
            os.rename("%s/received-%d.head.tmp" % (directory, n), "%s/received-%d.head" % (directory, n))
            self.conn.send_headers(sid, [(":status", "201"), ("content-length", "0")], end_stream=True)
            self.finish(sid)
        elif path == "/trailers":
            self.conn.send_headers(sid, [(":status", "200")])
            self.queue(sid, b"body before trailers\n", ("trailers", [("x-checksum", "c0ffee")]))
        elif path == "/early-hints":
            self.conn.send_headers(sid, [(":status", "103"), ("link", "</style.css>; rel=preload")])
            self.conn.send_headers(sid, [(":status", "200"), ("content-length", "6")])
            self.queue(sid, b"early\n", None)
        elif path == "/early-hints-reset":
            # The reset right behind the interim head, in the same write: the proxy reads both at once.
            self.conn.send_headers(sid, [(":status", "103"), ("link", "</style.css>; rel=preload")])
            self.conn.reset_stream(sid, h2.errors.ErrorCodes.INTERNAL_ERROR)
            self.finish(sid)
        elif path == "/early-hints-goaway":
            # A 103, then GOAWAY saying no stream was processed (last stream 0, which the 103 contradicts) and the
            # connection closed: every time, on every connection.
            self.conn.send_headers(sid, [(":status", "103"), ("link", "</style.css>; rel=preload")])
            self.conn.close_connection(last_stream_id=0)
            self.send()
            self.sock.shutdown(socket.SHUT_RDWR)
            raise ConnectionError("closed on purpose")
        elif path == "/early-hints-refused":
            # A 103, then RST_STREAM REFUSED_STREAM (which the 103 contradicts): every time.
            self.conn.send_headers(sid, [(":status", "103"), ("link", "</style.css>; rel=preload")])
            self.conn.reset_stream(sid, h2.errors.ErrorCodes.REFUSED_STREAM)
            self.finish(sid)
        elif path == "/goaway-unprocessed":
            # The whole request read, then GOAWAY NO_ERROR whose last stream is below this one (RFC 9113 §6.8: it was
            # not processed), no answer: every time, on every connection.
            self.conn.close_connection(last_stream_id=max(sid - 2, 0))
            self.finish(sid)
        elif path.startswith("/many-fields/"):
            payload = b"many fields\n"
            extra = [("x-f%03d" % i, "v") for i in range(int(path.split("/")[2]))]
            self.conn.send_headers(sid, [(":status", "200"), ("content-length", str(len(payload)))] + extra)
            self.queue(sid, payload, None)
        elif path.startswith("/big-field/"):
            payload = b"big field\n"
            self.conn.send_headers(sid, [(":status", "200"), ("content-length", str(len(payload))),
                                         ("x-big", "v" * int(path.split("/")[2]))])
            self.queue(sid, payload, None)
        elif path.startswith("/reset-after/"):
            self.conn.send_headers(sid, [(":status", "200")])
            self.queue(sid, pattern(int(path.split("/")[2])), ("reset", h2.errors.ErrorCodes.INTERNAL_ERROR))
        elif path.startswith("/excess-data/"):
            n = int(path.split("/")[2])
            self.conn.send_headers(sid, [(":status", "200"), ("content-length", str(n))])
            self.queue(sid, pattern(n), ("excess", b"0123456789"))
        elif path.startswith("/cut-length/"):
            n = int(path.split("/")[2])
            self.conn.send_headers(sid, [(":status", "200"), ("content-length", str(2 * n))])
            self.queue(sid, pattern(n), ("reset", h2.errors.ErrorCodes.INTERNAL_ERROR))
        elif path.startswith("/close-after/"):
            self.conn.send_headers(sid, [(":status", "200")])
            self.queue(sid, pattern(int(path.split("/")[2])), ("close", None))
        elif path == "/close-once":
            with lock:
                first = not stats.get("closedOnce")
                stats["closedOnce"] = 1
            if first:
                # The connection lost before any answer, no GOAWAY: as a stale keep-alive connection.
                self.sock.shutdown(socket.SHUT_RDWR)
                raise ConnectionError("closed on purpose")
            self.conn.send_headers(sid, [(":status", "200"), ("content-length", "9")])
            self.queue(sid, b"answered\n", None)
        elif path == "/refuse-once":
            if not self.refused:
                self.refused = True
                self.conn.reset_stream(sid, h2.errors.ErrorCodes.REFUSED_STREAM)
                self.finish(sid)
                return
            self.conn.send_headers(sid, [(":status", "200"), ("content-length", "9")])
            self.queue(sid, b"accepted\n", None)
        elif path.startswith("/bad-response"):
            kind = path.split("/")[2] if path.count("/") > 1 else "connection"
            headers = {
                "connection": [(":status", "200"), ("connection", "close"), ("content-length", "4")],
                "transfer-encoding": [(":status", "200"), ("transfer-encoding", "chunked")],
                "uppercase": [(":status", "200"), ("X-Upper", "1"), ("content-length", "4")],
                "crlf": [(":status", "200"), ("x-split", "a\r\nset-cookie: injected=1"), ("content-length", "4")],
                "pseudo": [(":status", "200"), (":path", "/elsewhere"), ("content-length", "4")],
                "no-status": [("content-length", "4")],
                "longer-than-length": [(":status", "200"), ("content-length", "2")],
            }[kind]
            self.conn.send_headers(sid, headers)
            self.queue(sid, b"bad\n", None)
        elif path == "/stats":
            with lock:
                payload = json.dumps(stats).encode()
            self.conn.send_headers(sid, [(":status", "200"), ("content-length", str(len(payload)))])
            self.queue(sid, payload, None)
        else:
            self.conn.send_headers(sid, [(":status", "404"), ("content-length", "0")], end_stream=True)
            self.finish(sid)

    def queue(self, sid, payload, after):
        self.pending[sid] = [bytes(payload), after]

    def flush_bodies(self):
        for sid in list(self.pending):
            payload, after = self.pending[sid]
            while payload:
                window = min(self.conn.local_flow_control_window(sid), self.conn.max_outbound_frame_size,
                             self.frame_cap.get(sid, 1 << 30))
                if window <= 0:
                    break
                chunk, payload = payload[:window], payload[window:]
                self.conn.send_data(sid, chunk)
            self.pending[sid][0] = payload
            if payload:
                continue
            del self.pending[sid]
            if after is None:
                self.conn.end_stream(sid)
            elif after[0] == "trailers":
                self.conn.send_headers(sid, after[1], end_stream=True)
            elif after[0] == "excess":
                # The whole body its content-length declared, a pause, then more DATA and END_STREAM.
                self.send()
                time.sleep(0.3)
                self.conn.send_data(sid, after[1], end_stream=True)
            elif after[0] == "end-reset":
                self.conn.end_stream(sid)
                self.conn.reset_stream(sid, h2.errors.ErrorCodes.NO_ERROR)
            elif after[0] == "close":
                # The connection lost mid-body: no END_STREAM, no RST_STREAM, no GOAWAY.
                self.send()
                self.sock.shutdown(socket.SHUT_RDWR)
                raise ConnectionError("closed on purpose")
            else:
                self.conn.reset_stream(sid, after[1])
            self.finish(sid)

def serve(raw):
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    context.set_alpn_protocols(["h2"])
    try:
        sock = context.wrap_socket(raw, server_side=True)
    except (ssl.SSLError, OSError):
        return
    with lock:
        stats["connections"] += 1
    try:
        Connection(sock).run()
    finally:
        sock.close()

listener = socket.socket()
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("127.0.0.1", 0))
listener.listen(128)
print("PORT %d" % listener.getsockname()[1], flush=True)
while True:
    raw, _ = listener.accept()
    threading.Thread(target=serve, args=(raw,), daemon=True).start()
"""#
}
