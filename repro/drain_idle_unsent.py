#!/usr/bin/env python3
"""The deterministic form of drain_cut.sh: an intercepted HTTP/1.1 client (rig.sh) asks for N bytes and reads nothing
for 2 s: for N between what the kernel's socket buffers take and that plus the proxy's own buffers (about 1 MiB), the
exchange is over (logged) while bytes are still queued in the proxy. SIGTERM; then the client reads everything.
Expected: all N bytes (SPEC §6, §8: in-flight work finishes within drain-timeout).  usage: drain_idle_unsent.py N"""
import json, os, signal, socket, ssl, sys, time
R = os.environ.get("R", "/tmp/r15"); n = int(sys.argv[1])
s = socket.create_connection(("127.0.0.1", 39877))
s.sendall(b"CONNECT localhost:39443 HTTP/1.1\r\nHost: localhost:39443\r\n\r\n")
buf = b""
while b"\r\n\r\n" not in buf: buf += s.recv(1)
ctx = ssl.create_default_context(cafile=R + "/state/ca.pem"); ctx.set_alpn_protocols(["http/1.1"])
t = ctx.wrap_socket(s, server_hostname="localhost")
t.sendall(b"GET /ok/%d HTTP/1.1\r\nHost: localhost:39443\r\n\r\n" % n)
time.sleep(2)
finished = any('"GET"' in l for l in open(R + "/proxy.log"))
os.kill(int(open(R + "/proxy.pid").read()), signal.SIGTERM)
data = b""
try:
    while True:
        d = t.recv(1 << 20)
        if not d: break
        data += d
except (ssl.SSLError, OSError) as e:
    pass
head, _, body = data.partition(b"\r\n\r\n")
print("n=%d exchange over before SIGTERM: %s; body %d -> %s" % (n, finished, len(body), "WHOLE" if len(body) == n else "CUT"))
