import Foundation

/// A raw HTTP/2 client for the malformed and flood cases of SPEC §17, in Python with the `h2`, `hpack` and
/// `hyperframe` packages (PyPI, installed by `scripts/bootstrap.sh --test`): it opens a CONNECT tunnel through the
/// proxy, does TLS with ALPN `h2` against the proxy's CA, and then writes frames no well-behaved library would
/// (outbound validation off, hand-made frames), and reports what came back, one line:
/// `response STATUS BODYLEN`, `reset CODE`, `goaway CODE`, `closed`, or `timeout`.
public enum H2Probe {
    public struct Outcome: CustomStringConvertible {
        public let line: String
        public let output: String
        public var description: String { output }
    }

    /// Runs `scenario` against `https://host:port` through the proxy at `proxyPort`, trusting `caPath`.
    /// `arguments` are the scenario's own (a header name and value, a count).
    public static func run(_ scenario: String, proxyPort: UInt16, host: String, port: UInt16, caPath: String,
                           arguments: [String] = [], timeout: Double = 30) throws -> Outcome {
        // `python3` on PATH: the one `scripts/bootstrap.sh --test` installed `h2` for.
        let result = try ExternalCommand.run("/usr/bin/env", ["python3", "-c", script, scenario, String(proxyPort), host, String(port),
                                                                  caPath] + arguments, timeout: timeout + 10)
        let last = result.stdout.split(separator: "\n").last.map(String.init) ?? ""
        return Outcome(line: last, output: result.output)
    }

    static let script = #"""
import socket, ssl, sys, time
import h2.connection, h2.config, h2.events, h2.errors, h2.settings
from hyperframe.frame import HeadersFrame, ContinuationFrame, RstStreamFrame, SettingsFrame, PingFrame, DataFrame
import hpack

scenario, proxy_port, host, port, ca = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5]
extra = sys.argv[6:]

raw = socket.create_connection(("127.0.0.1", proxy_port), timeout=30)
raw.sendall(("CONNECT %s:%d HTTP/1.1\r\nHost: %s:%d\r\n\r\n" % (host, port, host, port)).encode())
head = b""
while b"\r\n\r\n" not in head:
    chunk = raw.recv(1)
    if not chunk:
        print("closed"); sys.exit(0)
    head += chunk
context = ssl.create_default_context(cafile=ca)
context.set_alpn_protocols(["h2"])
tls = context.wrap_socket(raw, server_hostname=host)
assert tls.selected_alpn_protocol() == "h2", tls.selected_alpn_protocol()

config = h2.config.H2Configuration(client_side=True, validate_outbound_headers=False,
                                   normalize_outbound_headers=False, validate_inbound_headers=False)
conn = h2.connection.H2Connection(config=config)
conn.initiate_connection()
tls.sendall(conn.data_to_send())
authority = "%s:%d" % (host, port)
deadline = time.time() + float(30)

def receive():
    """The next bytes from the proxy: None when the read timed out, b"" once the connection closed or failed."""
    try:
        return tls.recv(65536)
    except socket.timeout:
        return None
    except (ConnectionResetError, ssl.SSLError, OSError):
        return b""

def request_headers(path="/hello.txt", method="GET", extra_fields=()):
    return [(":method", method), (":scheme", "https"), (":authority", authority), (":path", path)] + list(extra_fields)

def pump(until):
    """Reads events until `until(event)` returns a line to print, or the connection ends."""
    tls.settimeout(5)
    while time.time() < deadline:
        data = receive()
        if data is None:
            continue
        if not data:
            return "closed"
        try:
            events = conn.receive_data(data)
        except Exception as error:
            return "client-error %s" % type(error).__name__
        out = conn.data_to_send()
        if out:
            try:
                tls.sendall(out)
            except OSError:
                return "closed"
        for event in events:
            line = until(event)
            if line:
                return line
        # What the events made the client say (WINDOW_UPDATE after acknowledging data).
        out = conn.data_to_send()
        if out:
            try:
                tls.sendall(out)
            except OSError:
                return "closed"
    return "timeout"

def outcome_of(stream_id):
    state = {"status": None, "body": 0}
    def until(event):
        if isinstance(event, h2.events.ResponseReceived) and event.stream_id == stream_id:
            state["status"] = dict(event.headers).get(b":status", b"?").decode()
        elif isinstance(event, h2.events.DataReceived) and event.stream_id == stream_id:
            state["body"] += len(event.data)
            conn.acknowledge_received_data(event.flow_controlled_length, stream_id)
        elif isinstance(event, h2.events.StreamEnded) and event.stream_id == stream_id:
            return "response %s %d" % (state["status"], state["body"])
        elif isinstance(event, h2.events.StreamReset) and event.stream_id == stream_id:
            return "reset %s" % h2.errors.ErrorCodes(event.error_code).name
        elif isinstance(event, h2.events.ConnectionTerminated):
            return "goaway %s" % h2.errors.ErrorCodes(event.error_code).name
        return None
    return until

def goaway(event):
    if isinstance(event, h2.events.ConnectionTerminated):
        return "goaway %s" % h2.errors.ErrorCodes(event.error_code).name
    return None

def send_raw(frame_bytes):
    tls.sendall(frame_bytes)

from hyperframe.frame import Frame, GoAwayFrame
def raw_until(watch):
    """After hand-made frames the client library's state means nothing: read the server's frames raw.
    `watch(frame)` returns a line or None; GOAWAY always ends it."""
    tls.settimeout(5)
    buffer = b""
    while time.time() < deadline:
        data = receive()
        if data is None:
            continue
        if not data:
            return "closed"
        buffer += data
        while len(buffer) >= 9:
            frame, length = Frame.parse_frame_header(memoryview(buffer[:9]))
            if len(buffer) < 9 + length:
                break
            if not isinstance(frame, HeadersFrame) and not isinstance(frame, ContinuationFrame):
                frame.parse_body(memoryview(buffer[9:9 + length]))
            buffer = buffer[9 + length:]
            if isinstance(frame, GoAwayFrame):
                return "goaway %s" % h2.errors.ErrorCodes(frame.error_code).name
            line = watch(frame)
            if line:
                return line
    return "timeout"

def raw_goaway():
    return raw_until(lambda frame: None)

def download_part(path, line, then):
    """GET `path` on stream 1 and read it, opening the window as it comes, until 100,000 bytes arrived; then `then()`
    and `line` (or "ended" if the body was shorter). What `then()` queued is sent."""
    conn.send_headers(1, request_headers(path), end_stream=True)
    tls.sendall(conn.data_to_send())
    got = {"n": 0}
    def until(event):
        if isinstance(event, h2.events.DataReceived) and event.stream_id == 1:
            got["n"] += len(event.data)
            conn.acknowledge_received_data(event.flow_controlled_length, 1)
            if got["n"] >= 100000:
                then()
                return line
        if isinstance(event, h2.events.StreamEnded) and event.stream_id == 1:
            return "ended"
        return None
    first = pump(until)
    tls.sendall(conn.data_to_send())
    return first

if scenario == "get":
    conn.send_headers(1, request_headers(extra[0] if extra else "/hello.txt"), end_stream=True)
    tls.sendall(conn.data_to_send())
    print(pump(outcome_of(1)))
elif scenario == "data-past-length":
    # POST with content-length 5: "hello", half a second, then 5 bytes more with END_STREAM. What came back in the
    # pause (a response means the request was whole at the origin), then how the stream ended.
    conn.send_headers(1, request_headers(extra[0], "POST", [("content-length", "5")]), end_stream=False)
    conn.send_data(1, b"hello")
    tls.sendall(conn.data_to_send())
    seen = []
    tls.settimeout(0.1)
    pause_ends = time.time() + 0.5
    while time.time() < pause_ends:
        try:
            data = tls.recv(65536)
        except socket.timeout:
            continue
        if not data:
            break
        for event in conn.receive_data(data):
            if isinstance(event, h2.events.ResponseReceived):
                seen.append("response-in-pause %s" % dict(event.headers).get(b":status", b"?").decode())
            elif isinstance(event, h2.events.StreamReset):
                seen.append("reset-in-pause %s" % h2.errors.ErrorCodes(event.error_code).name)
        tls.sendall(conn.data_to_send())
    try:
        conn.send_data(1, b"world", end_stream=True)
        tls.sendall(conn.data_to_send())
        seen.append(pump(outcome_of(1)))
    except Exception as error:
        seen.append("send-failed %s" % type(error).__name__)
    print(" ".join(seen))
elif scenario in ("body-before-reset", "slow-body-before-reset"):
    # A GET whose response may be reset: how many body bytes came before the end, whichever it is (curl drops what it
    # buffered when a stream is reset, so its count says nothing about what the proxy sent). slow-body-before-reset
    # reads slowly (a 16 KiB window, nothing read for STALL ms after the request, then the window reopened PAUSE ms
    # after each DATA frame), so that the proxy holds much of the body when the reset comes.
    slow = scenario == "slow-body-before-reset"
    pause = (float(extra[1]) / 1000 if len(extra) > 1 else 0.02) if slow else 0
    stall = (float(extra[2]) / 1000 if len(extra) > 2 else 0) if slow else 0
    if slow:
        conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 16384})
    conn.send_headers(1, request_headers(extra[0]), end_stream=True)
    tls.sendall(conn.data_to_send())
    time.sleep(stall)
    body = {"n": 0}
    def until(event):
        if isinstance(event, h2.events.DataReceived) and event.stream_id == 1:
            body["n"] += len(event.data)
            if pause:
                time.sleep(pause)
            conn.acknowledge_received_data(event.flow_controlled_length, 1)
        elif isinstance(event, h2.events.StreamEnded) and event.stream_id == 1:
            return "ended after %d" % body["n"]
        elif isinstance(event, h2.events.StreamReset) and event.stream_id == 1:
            return "reset %s after %d" % (h2.errors.ErrorCodes(event.error_code).name, body["n"])
        return goaway(event)
    print(pump(until))
elif scenario == "field":
    # One request with a field given as raw bytes (name, value), unvalidated: the smuggling class.
    name, value = extra[0].encode().decode("unicode_escape"), extra[1].encode().decode("unicode_escape")
    fields = request_headers("/echo-headers") + [(name, value)]
    conn.send_headers(1, fields, end_stream=True)
    tls.sendall(conn.data_to_send())
    print(pump(outcome_of(1)))
elif scenario == "pseudo":
    # The pseudo-headers as given, in order: "name=value" items (duplicated, missing, misplaced, unknown).
    fields = [tuple(item.split("=", 1)) for item in extra]
    conn.send_headers(1, fields, end_stream=True)
    tls.sendall(conn.data_to_send())
    print(pump(outcome_of(1)))
elif scenario == "content-length-mismatch":
    conn.send_headers(1, request_headers("/upload", "POST", [("content-length", "10")]), end_stream=False)
    conn.send_data(1, b"12345", end_stream=True)
    tls.sendall(conn.data_to_send())
    print(pump(outcome_of(1)))
elif scenario == "mixed":
    # A refused stream between good ones on one connection: each ends on its own (paths in extra).
    ids = []
    for i, path in enumerate(extra):
        stream_id = 1 + 2 * i
        ids.append(stream_id)
        conn.send_headers(stream_id, request_headers(path), end_stream=True)
    tls.sendall(conn.data_to_send())
    results = {}
    state = {}
    def until(event):
        sid = getattr(event, "stream_id", None)
        if isinstance(event, h2.events.ResponseReceived):
            state[sid] = [dict(event.headers).get(b":status", b"?").decode(), 0]
        elif isinstance(event, h2.events.DataReceived):
            state[sid][1] += len(event.data)
            conn.acknowledge_received_data(event.flow_controlled_length, sid)
        elif isinstance(event, h2.events.StreamEnded):
            results[sid] = "%s:%d" % tuple(state[sid])
        elif isinstance(event, h2.events.StreamReset):
            results[sid] = "reset"
        elif isinstance(event, h2.events.ConnectionTerminated):
            return "goaway"
        if len(results) == len(ids):
            return "streams " + " ".join(results[i] for i in ids)
        return None
    print(pump(until))
elif scenario == "rapid-reset":
    # CVE-2023-44487: open a stream and reset it at once, many times, never waiting for an answer.
    count = int(extra[0]) if extra else 1000
    encoder = hpack.Encoder()
    block = encoder.encode(request_headers("/bytes/100000"))
    batch = b""
    for i in range(count):
        sid = 1 + 2 * i
        frame = HeadersFrame(sid, block)
        frame.flags.add("END_HEADERS"); frame.flags.add("END_STREAM")
        batch += frame.serialize() + RstStreamFrame(sid, error_code=8).serialize()
        if len(batch) > 16384:
            try:
                send_raw(batch)
            except OSError:
                break
            batch = b""
    try:
        send_raw(batch)
    except OSError:
        pass
    print(raw_goaway())
elif scenario == "continuation-flood":
    # CVE-2024-27316: HEADERS without END_HEADERS, then CONTINUATION frames that never end the block.
    count = int(extra[0]) if extra else 10000
    encoder = hpack.Encoder()
    frame = HeadersFrame(1, encoder.encode(request_headers()))
    try:
        send_raw(frame.serialize())
        for i in range(count):
            send_raw(ContinuationFrame(1, encoder.encode([("x-filler-%d" % i, "a" * 100)])).serialize())
    except OSError:
        pass
    print(raw_goaway())
elif scenario == "hpack-bomb":
    # One large dynamic-table entry referenced over and over: a small block that decodes to megabytes.
    encoder = hpack.Encoder()
    big = "x" * 4000
    first = HeadersFrame(1, encoder.encode(request_headers() + [("x-bomb", big)]))
    first.flags.add("END_HEADERS"); first.flags.add("END_STREAM")
    second = HeadersFrame(3, encoder.encode(request_headers() + [("x-bomb", big)] * 2000))
    second.flags.add("END_HEADERS"); second.flags.add("END_STREAM")
    try:
        send_raw(first.serialize() + second.serialize())
    except OSError:
        pass
    def watch(frame):
        if isinstance(frame, RstStreamFrame) and frame.stream_id == 3:
            return "reset %s" % h2.errors.ErrorCodes(frame.error_code).name
        if isinstance(frame, HeadersFrame) and frame.stream_id == 3:
            return "response"
        return None
    print(raw_until(watch))
elif scenario in ("settings-flood", "ping-flood", "empty-frames"):
    count = int(extra[0]) if extra else 10000
    batch = b""
    if scenario == "empty-frames":
        conn.send_headers(1, request_headers("/upload", "POST"), end_stream=False)
        batch += conn.data_to_send()
    for i in range(count):
        if scenario == "settings-flood":
            batch += SettingsFrame(0, settings={4: 65535 + i % 2}).serialize()
        elif scenario == "ping-flood":
            batch += PingFrame(0, opaque_data=i.to_bytes(8, "big")).serialize()
        else:
            batch += DataFrame(1, b"").serialize()
        if len(batch) > 16384:
            try:
                send_raw(batch)
            except OSError:
                break
            batch = b""
    try:
        send_raw(batch)
    except OSError:
        pass
    print(raw_goaway())
elif scenario == "too-many-streams":
    # More open streams than SETTINGS_MAX_CONCURRENT_STREAMS, after acknowledging it.
    count = int(extra[0]) if extra else 200
    pump(lambda e: "ok" if isinstance(e, h2.events.RemoteSettingsChanged) else None)
    encoder = hpack.Encoder()
    batch = b""
    for i in range(count):
        frame = HeadersFrame(1 + 2 * i, encoder.encode(request_headers("/upload", "POST")))
        frame.flags.add("END_HEADERS")
        batch += frame.serialize()
    try:
        send_raw(batch)
    except OSError:
        pass
    print(raw_until(lambda frame: "reset %s" % h2.errors.ErrorCodes(frame.error_code).name
                    if isinstance(frame, RstStreamFrame) else None))
elif scenario == "zero-window":
    # A client that never opens its window: the proxy must not hold the connection forever.
    conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0})
    conn.send_headers(1, request_headers(extra[0] if extra else "/bytes/1000000"), end_stream=True)
    tls.sendall(conn.data_to_send())
    started = time.time()
    def until(event):
        if isinstance(event, h2.events.ConnectionTerminated):
            return "goaway %s after %.1f" % (h2.errors.ErrorCodes(event.error_code).name, time.time() - started)
        return None
    line = pump(until)
    if line == "closed":
        line = "closed after %.1f" % (time.time() - started)
    print(line)
elif scenario == "reset-mid-body":
    # The client resets a large download part-way, then asks again on the same connection.
    first = download_part(extra[0] if extra else "/bytes/5000000", "reset-sent",
                          lambda: conn.reset_stream(1, error_code=8))
    conn.send_headers(3, request_headers("/hello.txt"), end_stream=True)
    tls.sendall(conn.data_to_send())
    print(first + " then " + pump(outcome_of(3)))
elif scenario == "reset-with-headers":
    # HEADERS and the stream's RST_STREAM (CANCEL) in one write, so the proxy reads them together (one TLS record),
    # then a plain GET on the same connection.
    conn.send_headers(1, request_headers(extra[0] if extra else "/hello.txt"), end_stream=True)
    conn.reset_stream(1, error_code=8)
    tls.sendall(conn.data_to_send())
    conn.send_headers(3, request_headers("/hello.txt"), end_stream=True)
    tls.sendall(conn.data_to_send())
    print("reset-sent then " + pump(outcome_of(3)))
elif scenario == "bad-hpack-mid-download":
    # A header block that cannot be decoded (RFC 9113 §4.3: a connection error) while a large download is in
    # flight: GOAWAY COMPRESSION_ERROR at once, then the close, without waiting for the download (the client stops
    # opening its window, so the download could never end).
    first = download_part("/bytes/20000000", "downloading", lambda: None)
    bad = HeadersFrame(3, b"\xff\xff\xff\xff\xff\xff")
    bad.flags.add("END_HEADERS"); bad.flags.add("END_STREAM")
    send_raw(bad.serialize())
    line = raw_goaway()
    tls.settimeout(1)
    closed = "still open"
    give_up = time.time() + 10
    while time.time() < give_up:
        data = receive()
        if data is None:
            continue
        if not data:
            closed = "closed"
            break
    print(first + " then " + line + " then " + closed)
elif scenario == "slow-reader":
    # Reads a large body slowly (a small window, reopened after a pause): every byte arrives, in order.
    conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 16384})
    conn.send_headers(1, request_headers(extra[0]), end_stream=True)
    tls.sendall(conn.data_to_send())
    import hashlib
    digest = hashlib.sha256()
    got = {"n": 0}
    def until(event):
        if isinstance(event, h2.events.DataReceived) and event.stream_id == 1:
            got["n"] += len(event.data)
            digest.update(event.data)
            time.sleep(0.002)
            conn.acknowledge_received_data(event.flow_controlled_length, 1)
        if isinstance(event, h2.events.StreamEnded) and event.stream_id == 1:
            return "body %d sha256 %s" % (got["n"], digest.hexdigest())
        if isinstance(event, h2.events.StreamReset):
            return "reset %s" % h2.errors.ErrorCodes(event.error_code).name
        return None
    print(pump(until))
elif scenario == "upload-stalled":
    # Uploads SIZE bytes (no content-length) as fast as the proxy's windows let it, to an origin that reads nothing
    # for a while: what the client could send by MARK seconds is what the proxy took meanwhile. Then every byte.
    import hashlib
    path, size, mark = extra[0], int(extra[1]), float(extra[2])
    conn.send_headers(1, request_headers(path, "POST"), end_stream=False)
    tls.sendall(conn.data_to_send())
    digest, sent, at_mark, status, body, ended = hashlib.sha256(), 0, None, None, b"", False
    block = bytes(range(256)) * 64
    started = time.time()
    tls.settimeout(0.05)
    while not ended and time.time() - started < 60:
        if at_mark is None and time.time() - started >= mark:
            at_mark = sent
        room = min(conn.local_flow_control_window(1), conn.max_outbound_frame_size, len(block), size - sent)
        if room > 0:
            conn.send_data(1, block[:room], end_stream=sent + room == size)
            digest.update(block[:room])
            sent += room
            tls.sendall(conn.data_to_send())
            continue
        data = receive()
        if data is None:
            continue
        if not data:
            print("closed after %d" % sent); sys.exit(0)
        for event in conn.receive_data(data):
            if isinstance(event, h2.events.ResponseReceived):
                status = dict(event.headers).get(b":status", b"?").decode()
            elif isinstance(event, h2.events.DataReceived):
                body += event.data
                conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                ended = True
            elif isinstance(event, h2.events.StreamReset):
                print("reset %s after %d" % (h2.errors.ErrorCodes(event.error_code).name, sent)); sys.exit(0)
        tls.sendall(conn.data_to_send())
    print("by-mark %s sent %d sha256 %s response %s %s" % (at_mark, sent, digest.hexdigest(), status,
                                                         body.decode(errors="replace").strip()))
elif scenario == "uploads-stalled":
    # COUNT uploads of SIZE bytes each (content-length, END_STREAM) on one connection, sent as fast as the proxy's
    # windows let them, a frame at a time round the streams, to an origin that reads nothing for a while: what the
    # client could send by MARK seconds is what the proxy took meanwhile (SPEC §17: the connection window opens only
    # as bytes move on). Then every stream to its end; each answer must name its own body's length and sha256.
    # OPENER (optional): first an upload the proxy refuses in constrained mode ("refused": `Allow-Constrained: ?0`,
    # a 403 whose body it reads to throw away) or stores ("stored": with `Prefer: respond-async`, SPEC §18.3), of
    # which the client sends 1 byte of 2 MiB and then nothing: a stream that waits for the client alone. Or
    # "flowing": beside the others, all along, an ordinary upload of 16 MiB to /stall-read/0, which the origin reads
    # at once (not counted in by-mark; its answer printed as "opener ...").
    import hashlib
    path, count, size, mark = extra[0], int(extra[1]), int(extra[2]), float(extra[3])
    opener = extra[4] if len(extra) > 4 else "none"
    flow_id, flow_left, flow_digest, flow_answer, flow_status, flow_body = None, 0, hashlib.sha256(), None, "?", b""
    if opener == "flowing":
        flow_id = conn.get_next_available_stream_id()
        flow_left = 16 << 20
        conn.send_headers(flow_id, request_headers("/stall-read/0", "POST", [("content-length", str(flow_left))]),
                          end_stream=False)
        tls.sendall(conn.data_to_send())
        flow_block = bytes((j * 5 + 3) & 0xff for j in range(256)) * 64
    elif opener != "none":
        oid = conn.get_next_available_stream_id()
        fields = [("allow-constrained", "?0"), ("content-length", str(2 << 20))]
        if opener == "stored":
            fields.append(("prefer", "respond-async"))
        conn.send_headers(oid, request_headers("/opener", "POST", fields), end_stream=False)
        conn.send_data(oid, b"x")
        tls.sendall(conn.data_to_send())
        time.sleep(0.5)
    ids = []
    for _ in range(count):
        sid = conn.get_next_available_stream_id()
        conn.send_headers(sid, request_headers(path, "POST", [("content-length", str(size))]), end_stream=False)
        ids.append(sid)
    tls.sendall(conn.data_to_send())
    blocks = dict((sid, bytes((j * 7 + sid) & 0xff for j in range(256)) * 64) for sid in ids)
    digests = dict((sid, hashlib.sha256()) for sid in ids)
    left = dict((sid, size) for sid in ids)
    status, bodies, answers = {}, dict((sid, b"") for sid in ids), {}
    sent, at_mark, closed = 0, None, False
    started = time.time()
    tls.settimeout(0.05)
    while (len(answers) < count or flow_left > 0) and not closed and time.time() - started < 120:
        if at_mark is None and time.time() - started >= mark:
            at_mark = sent
        moved = True
        while moved:
            moved = False
            for sid in ids:
                if left[sid] == 0 or sid in answers:
                    continue
                room = min(conn.local_flow_control_window(sid), conn.max_outbound_frame_size, left[sid])
                if room <= 0:
                    continue
                left[sid] -= room
                conn.send_data(sid, blocks[sid][:room], end_stream=left[sid] == 0)
                digests[sid].update(blocks[sid][:room])
                sent += room
                moved = True
            if flow_left > 0:
                room = min(conn.local_flow_control_window(flow_id), conn.max_outbound_frame_size, flow_left)
                if room > 0:
                    flow_left -= room
                    conn.send_data(flow_id, flow_block[:room], end_stream=flow_left == 0)
                    flow_digest.update(flow_block[:room])
                    moved = True
            out = conn.data_to_send()
            if out:
                tls.sendall(out)
        data = receive()
        if data is None:
            continue
        if not data:
            closed = True
            break
        for event in conn.receive_data(data):
            if isinstance(event, h2.events.ConnectionTerminated):
                closed = True
            elif getattr(event, "stream_id", None) not in left:
                # The opener's answer (a 403, or a 202 once stored), or the connection's own events.
                if isinstance(event, h2.events.DataReceived):
                    conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                if flow_id is not None and getattr(event, "stream_id", None) == flow_id:
                    if isinstance(event, h2.events.ResponseReceived):
                        flow_status = dict(event.headers).get(b":status", b"?").decode()
                    elif isinstance(event, h2.events.DataReceived):
                        flow_body += event.data
                    elif isinstance(event, h2.events.StreamEnded):
                        flow_answer = "%s %s" % (flow_status, flow_body.decode(errors="replace").strip())
                    elif isinstance(event, h2.events.StreamReset):
                        flow_answer = "reset %s" % h2.errors.ErrorCodes(event.error_code).name
            elif isinstance(event, h2.events.ResponseReceived):
                status[event.stream_id] = dict(event.headers).get(b":status", b"?").decode()
            elif isinstance(event, h2.events.DataReceived):
                bodies[event.stream_id] += event.data
                conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                answers[event.stream_id] = "%s %s" % (status.get(event.stream_id), bodies[event.stream_id].decode(errors="replace").strip())
            elif isinstance(event, h2.events.StreamReset):
                answers[event.stream_id] = "reset %s" % h2.errors.ErrorCodes(event.error_code).name
    if at_mark is None:
        at_mark = sent
    expected = dict((sid, "200 received %d bytes sha256 %s" % (size, digests[sid].hexdigest())) for sid in ids)
    wrong = [(sid, answers.get(sid)) for sid in ids if answers.get(sid) != expected[sid]]
    if flow_id is not None:
        while flow_answer is None and not closed and time.time() - started < 120:
            data = receive()
            if data is None:
                continue
            if not data:
                break
            for event in conn.receive_data(data):
                if getattr(event, "stream_id", None) != flow_id:
                    continue
                if isinstance(event, h2.events.ResponseReceived):
                    flow_status = dict(event.headers).get(b":status", b"?").decode()
                elif isinstance(event, h2.events.DataReceived):
                    flow_body += event.data
                    conn.acknowledge_received_data(event.flow_controlled_length, flow_id)
                elif isinstance(event, h2.events.StreamEnded):
                    flow_answer = "%s %s" % (flow_status, flow_body.decode(errors="replace").strip())
            tls.sendall(conn.data_to_send())
        expected_flow = "200 received %d bytes sha256 %s" % (16 << 20, flow_digest.hexdigest())
        print("opener %s" % ("ok" if flow_answer == expected_flow else "wrong: %s" % flow_answer))
    print("first wrong: %s" % (wrong[:1],))
    print("by-mark %d sent %d answered %d matched %d" % (at_mark, sent, len(answers), count - len(wrong)))
elif scenario == "unread-downloads":
    # COUNT GETs of PATH (N pattern bytes each: byte i is (i * 31 + 7) & 0xff) on one connection, whose answers the
    # client leaves unread for HOLD seconds once every one began, while it samples the proxy's (PID's) resident
    # memory; then it reads them all, each checked against the pattern. What the proxy holds meanwhile is what one
    # connection's unread streams cost it.
    import hashlib
    path, count, hold, pid = extra[0], int(extra[1]), float(extra[2]), int(extra[3])
    size = int(path.rsplit("/", 1)[1])
    block = bytes(((i * 31 + 7) & 0xff) for i in range(256))
    expected = hashlib.sha256(block * (size // 256) + block[:size % 256]).hexdigest()
    def rss():
        with open("/proc/%d/status" % pid) as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return -1
    before = rss()
    ids = []
    for _ in range(count):
        sid = conn.get_next_available_stream_id()
        conn.send_headers(sid, request_headers(path), end_stream=True)
        ids.append(sid)
    tls.sendall(conn.data_to_send())
    begun, digests, lengths, ended, failed = set(), {}, {}, set(), []
    def take(events):
        for event in events:
            sid = getattr(event, "stream_id", None)
            if isinstance(event, h2.events.ResponseReceived):
                begun.add(sid)
            elif isinstance(event, h2.events.DataReceived):
                begun.add(sid)
                digests.setdefault(sid, hashlib.sha256()).update(event.data)
                lengths[sid] = lengths.get(sid, 0) + len(event.data)
                if reading[0]:
                    conn.acknowledge_received_data(event.flow_controlled_length, sid)
                else:
                    unacknowledged.append((sid, event.flow_controlled_length))
            elif isinstance(event, h2.events.StreamEnded):
                ended.add(sid)
            elif isinstance(event, (h2.events.StreamReset, h2.events.ConnectionTerminated)):
                failed.append(repr(event))
    reading, unacknowledged = [False], []
    tls.settimeout(0.1)
    started = time.time()
    while len(begun) < count and not failed and time.time() - started < 20:
        data = receive()
        if data:
            take(conn.receive_data(data))
        elif data == b"":
            break
    held = before
    until = time.time() + hold
    while time.time() < until:
        data = receive()  # what the windows still let through, unacknowledged
        if data:
            take(conn.receive_data(data))
        held = max(held, rss())
    reading[0] = True
    conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1 << 20})
    for sid, length in unacknowledged:
        conn.acknowledge_received_data(length, sid)
    conn.increment_flow_control_window(64 << 20)
    tls.sendall(conn.data_to_send())
    started = time.time()
    while len(ended) < count and not failed and time.time() - started < 60:
        data = receive()
        if data == b"":
            break
        if data:
            take(conn.receive_data(data))
            out = conn.data_to_send()
            if out:
                tls.sendall(out)
    whole = sum(1 for sid in ids if sid in ended and lengths.get(sid) == size and digests[sid].hexdigest() == expected)
    print("failed: %s begun %d" % (failed[:1], len(begun)))
    print("rss-before %d rss-held %d whole %d of %d" % (before, held, whole, count))
elif scenario == "drain":
    # SIGTERM to the proxy (pid in extra[1]) while a large body is on its way: GOAWAY comes, the stream finishes.
    # Read raw after the request: a client library closes its state at GOAWAY and would refuse the DATA after it.
    import os, signal
    from hyperframe.frame import WindowUpdateFrame, DataFrame as _DF
    conn.send_headers(1, request_headers(extra[0]), end_stream=True)
    tls.sendall(conn.data_to_send())
    state = {"n": 0, "goaway": "none", "signalled": False}
    tls.settimeout(5)
    buffer = b""
    line = "timeout"
    while time.time() < deadline and line == "timeout":
        data = receive()
        if data is None:
            continue
        if not data:
            line = "closed after %d goaway %s" % (state["n"], state["goaway"]); break
        buffer += data
        while len(buffer) >= 9:
            frame, length = Frame.parse_frame_header(memoryview(buffer[:9]))
            if len(buffer) < 9 + length:
                break
            if not isinstance(frame, (HeadersFrame, ContinuationFrame)):
                frame.parse_body(memoryview(buffer[9:9 + length]))
            buffer = buffer[9 + length:]
            if isinstance(frame, GoAwayFrame):
                state["goaway"] = h2.errors.ErrorCodes(frame.error_code).name
            elif isinstance(frame, _DF) and frame.stream_id == 1:
                state["n"] += len(frame.data)
                if length:
                    try:
                        tls.sendall(WindowUpdateFrame(0, window_increment=length).serialize()
                                    + WindowUpdateFrame(1, window_increment=length).serialize())
                    except OSError:
                        pass   # the proxy may be done and gone; what it sent is still to be read
                if state["n"] >= 100000 and not state["signalled"]:
                    state["signalled"] = True
                    os.kill(int(extra[1]), signal.SIGTERM)
                if "END_STREAM" in frame.flags:
                    line = "body %d goaway %s" % (state["n"], state["goaway"])
                    break
            elif isinstance(frame, RstStreamFrame) and frame.stream_id == 1:
                line = "reset %s after %d" % (h2.errors.ErrorCodes(frame.error_code).name, state["n"])
                break
    print(line)
else:
    print("unknown scenario " + scenario)
"""#
}
