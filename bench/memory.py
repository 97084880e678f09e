#!/usr/bin/env python3
"""bench/memory.py: how much memory datamode-proxy takes in a burst, and how much of it it gives back (issue 24).

Starts a local nginx origin and the release binary on free loopback ports, then, on a fresh proxy each:

  (a) storms: --connections concurrent connections for --duration seconds, a mix of small keep-alive GETs (1 KiB),
      1 MiB downloads, 1 MiB uploads and CONNECT tunnels (lib/memload.c), plus --https-connections keep-alive
      clients through HTTPS interception (lib/tlsload.c, 100 KiB GETs); then --quiet seconds of nothing. --storms
      of them in a row on the same process.
  (b) subscribers: --subscribers `GET /events` streams that never read, then --mode-changes `PUT /mode` (admin API,
      alternating constrained/normal, one keep-alive connection); then --quiet seconds of nothing; then how many
      of the streams the proxy closed.

The proxy's VmRSS (/proc/PID/status) is read before each load, every 100 ms during it (the peak), and every second
of the quiet after it. Several binaries can be measured in one run (`--proxy before=PATH --proxy after=PATH`), one
after the other, each on fresh processes. Writes bench/results/<UTC stamp>-memory.md and .json.

    bench/memory.py                                  build HEAD (release) and measure it
    bench/memory.py --proxy before=/tmp/dm-old --commit before=01ba27e --proxy after=.build/release/datamode-proxy

Needs nginx, cc, libssl-dev and openssl (bench/run installs them) and a nofile limit of about 10,000 (the proxy
holds two descriptors per proxied connection; the hard limit is raised to when the soft one is lower).
"""
import argparse
import datetime as dt
import json
import os
import platform
import resource
import shutil
import socket
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(HERE, "lib"))

import https  # noqa: E402
from procs import Procs, free_port, wait_listening  # noqa: E402

NO_PROXY_ENV = {k: v for k, v in os.environ.items()
                if k.lower() not in ("http_proxy", "https_proxy", "all_proxy", "no_proxy")}

ORIGIN_CONF = """# bench/memory.py's origin: 1 KiB, 100 KiB and 1 MiB files, and /upload that takes a body and answers "ok".
worker_processes 2;
daemon off;
master_process on;
user root;
pid {work}/origin.pid;
error_log {work}/origin.error.log crit;
worker_rlimit_nofile {nofile};
events {{ worker_connections {nofile}; }}
http {{
    access_log off;
    sendfile on;
    tcp_nodelay on;
    keepalive_timeout 300s;
    keepalive_requests 100000000;
    client_max_body_size 4m;
    client_body_temp_path {work}/origin-tmp/body;
    proxy_temp_path {work}/origin-tmp/proxy;
    fastcgi_temp_path {work}/origin-tmp/fastcgi;
    uwsgi_temp_path {work}/origin-tmp/uwsgi;
    scgi_temp_path {work}/origin-tmp/scgi;
    default_type application/octet-stream;
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        root {docroot};
        # An upload is read whole before the answer (as an application would): nginx buffers the body, then asks
        # itself for /ok without it. (`return` alone answers at once and leaves the body unread.)
        location = /upload {{
            client_body_buffer_size 2m;
            proxy_pass http://127.0.0.1:{port}/ok;
            proxy_method GET;
            proxy_pass_request_body off;
            proxy_set_header Content-Length "";
        }}
        location = /ok {{ return 200 "ok\\n"; }}
        location / {{ }}
    }}
    server {{
        listen 127.0.0.1:{tls_port} ssl backlog=4096;
        ssl_certificate {work}/origin-tls/origin.pem;
        ssl_certificate_key {work}/origin-tls/origin-key.pem;
        ssl_protocols TLSv1.2 TLSv1.3;
        root {docroot};
        location / {{ }}
    }}
}}
"""

PROXY_CONF = """# bench/memory.py's datamode-proxy: HTTPS interception for the origin, CONNECT to its ports, access log off.
listen: 127.0.0.1:{port}
admin: {{listen: "127.0.0.1:{admin}"}}
threads: {threads}
log: {{access: "off"}}
connect: {{ports: [{origin_port}, {origin_tls_port}]}}
tls: {{intercept: ["127.0.0.1"], upstream-verify: true}}
"""


def log(msg):
    print(f"[memory {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def status_kib(pid, field):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def mib(kib):
    return None if kib is None else round(kib / 1024, 1)


class Sampler:
    """Reads VmRSS of pid every `interval` seconds on a thread until stopped; keeps the peak."""

    def __init__(self, pid, interval=0.1):
        self.pid, self.interval = pid, interval
        self.peak = 0
        self.samples = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        t0 = time.time()
        while not self._stop.is_set():
            rss = status_kib(self.pid, "VmRSS")
            if rss is not None:
                self.peak = max(self.peak, rss)
                self.samples.append((round(time.time() - t0, 2), rss))
            self._stop.wait(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


class Run:
    def __init__(self, a):
        self.a = a
        self.work = a.workdir
        self.procs = Procs(os.path.join(self.work, "logs"))

    # ------------------------------------------------------------ setup

    def prepare(self):
        if os.path.isdir(self.work):
            shutil.rmtree(self.work)
        for d in ("logs", "docroot", "origin-tmp"):
            os.makedirs(os.path.join(self.work, d))
        os.chmod(self.work, 0o755)
        doc = os.path.join(self.work, "docroot")
        for name, size in (("1k.bin", 1024), ("100k.bin", 100 * 1024), ("1m.bin", 1024 * 1024)):
            with open(os.path.join(doc, name), "wb") as f:
                f.write(os.urandom(size))
        https.make_origin_certificates(self.work)
        self.tlsload = https.build_tlsload(self.work)
        self.memload = os.path.join(self.work, "memload")
        r = subprocess.run(["cc", "-O2", os.path.join(HERE, "lib", "memload.c"), "-o", self.memload],
                           capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise SystemExit("could not build lib/memload.c: " + r.stderr[-400:])

    def start_origin(self):
        self.origin_port, self.origin_tls_port = free_port(), free_port()
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        conf = os.path.join(self.work, "origin.conf")
        with open(conf, "w") as f:
            f.write(ORIGIN_CONF.format(work=self.work, nofile=max(1024, nofile - 100), port=self.origin_port,
                                       tls_port=self.origin_tls_port, docroot=os.path.join(self.work, "docroot")))
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        self.origin = self.procs.start("origin", [nginx, "-c", conf, "-e", os.path.join(self.work, "origin.error.log")])
        if not wait_listening(self.origin_port, proc=self.origin) or not wait_listening(self.origin_tls_port, proc=self.origin):
            raise SystemExit("nginx did not start: see " + os.path.join(self.work, "logs"))
        log(f"origin nginx pid {self.origin.pid} on 127.0.0.1:{self.origin_port} (TLS {self.origin_tls_port})")

    def start_proxy(self, binary, name):
        port, admin = free_port(), free_port()
        state = os.path.join(self.work, f"{name}-state")
        shutil.rmtree(state, ignore_errors=True)
        os.makedirs(state, mode=0o700)
        conf = os.path.join(self.work, f"{name}.yaml")
        with open(conf, "w") as f:
            f.write(PROXY_CONF.format(port=port, admin=admin, threads=self.a.threads, origin_port=self.origin_port,
                                      origin_tls_port=self.origin_tls_port))
        env = dict(NO_PROXY_ENV, SSL_CERT_FILE=os.path.join(self.work, "origin-tls", "origin-ca.pem"))
        argv = [binary, "run", "--config", conf, "--state-dir", state]
        p = self.procs.start(name, argv, cwd=self.work, env=env)
        if not wait_listening(port, timeout=20, proc=p) or not wait_listening(admin, timeout=5, proc=p):
            raise SystemExit(f"{binary} did not start: see {self.work}/logs/{name}.log")
        with socket.create_connection(("127.0.0.1", admin), timeout=5) as s:
            s.sendall(b"GET /ca.pem HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n")
            data = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        cafile = os.path.join(self.work, f"{name}-ca.pem")
        with open(cafile, "wb") as f:
            f.write(data.partition(b"\r\n\r\n")[2])
        log(f"{name}: pid {p.pid} on 127.0.0.1:{port}, admin {admin}")
        return p, port, admin, cafile

    # ------------------------------------------------------------ loads

    def quiet(self, pid):
        """RSS every second for --quiet seconds: [(seconds, KiB)]."""
        out = []
        for second in range(1, self.a.quiet + 1):
            time.sleep(1)
            out.append((second, status_kib(pid, "VmRSS")))
        return out

    def storms(self, binary, label):
        p, port, admin, cafile = self.start_proxy(binary, f"{label}-storms")
        time.sleep(1)
        start_kib = status_kib(p.pid, "VmRSS")
        rows = []
        plain = self.a.connections - self.a.https_connections
        for storm in range(1, self.a.storms + 1):
            before = status_kib(p.pid, "VmRSS")
            mem_argv = [self.memload, "--proxy", f"127.0.0.1:{port}", "--origin", f"127.0.0.1:{self.origin_port}",
                        "-c", str(plain), "-d", str(self.a.duration), "--mix", self.a.mix]
            tls_argv = [self.tlsload, "--connect", f"127.0.0.1:{port}", "--target", f"127.0.0.1:{self.origin_tls_port}",
                        "--proxy", "--path", "/100k.bin", "--size", str(100 * 1024), "--cafile", cafile,
                        "-c", str(self.a.https_connections), "-d", str(self.a.duration)]
            with Sampler(p.pid) as sampler:
                outs = {}
                clients = [("memload", mem_argv)] + ([("tlsload", tls_argv)] if self.a.https_connections else [])
                running = []
                for name, argv in clients:
                    path = os.path.join(self.work, "logs", f"{label}-storm{storm}-{name}.out")
                    f = open(path, "wb")
                    running.append((name, subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=NO_PROXY_ENV,
                                                           start_new_session=True), f, path))
                for name, c, f, path in running:
                    try:
                        c.wait(timeout=self.a.duration + 120)
                    except subprocess.TimeoutExpired:
                        self.procs.stop(c)
                    f.close()
                    with open(path) as r:
                        lines = [ln for ln in r.read().splitlines() if ln.startswith("BENCH_JSON ")]
                    outs[name] = json.loads(lines[-1][len("BENCH_JSON "):]) if lines else {"failed": f"rc {c.returncode}"}
            alive = p.poll() is None
            after = self.quiet(p.pid) if alive else []
            row = {"storm": storm, "before_kib": before, "peak_kib": sampler.peak, "after_kib": after[-1][1] if after else None,
                   "quiet_kib": after, "hwm_kib": status_kib(p.pid, "VmHWM"), "clients": outs, "proxy_alive": alive,
                   "samples": sampler.samples[::5]}
            rows.append(row)
            m = outs.get("memload", {})
            t = outs.get("tlsload", {})
            log(f"{label} storm {storm}: RSS {mib(before)} -> peak {mib(sampler.peak)} -> {mib(row['after_kib'])} MiB "
                f"{self.a.quiet} s after; memload {m.get('exchanges')} errors {m.get('errors')}; "
                f"tlsload {t.get('requests')} errors {t.get('errors')}; first errors: {m.get('first_error')} / {t.get('first_error')}")
        self.procs.stop(p)
        return {"start_kib": start_kib, "storms": rows}

    def subscribers(self, binary, label):
        p, port, admin, _ = self.start_proxy(binary, f"{label}-events")
        time.sleep(1)
        before = status_kib(p.pid, "VmRSS")
        streams = []
        for _ in range(self.a.subscribers):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            if self.a.subscriber_rcvbuf:
                # Set before connect: a fixed receive buffer the kernel does not grow (see --subscriber-rcvbuf).
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.a.subscriber_rcvbuf)
            s.settimeout(5)
            s.connect(("127.0.0.1", admin))
            s.sendall(b"GET /events HTTP/1.1\r\nHost: admin\r\nAccept: text/event-stream\r\n\r\n")
            streams.append(s)     # and never read
        time.sleep(1)
        opened = status_kib(p.pid, "VmRSS")
        statuses = {}
        t0 = time.time()
        with Sampler(p.pid) as sampler:
            admin_conn = socket.create_connection(("127.0.0.1", admin), timeout=30)
            reader = admin_conn.makefile("rb")
            for i in range(self.a.mode_changes):
                body = b'{"mode": "constrained"}' if i % 2 == 0 else b'{"mode": "normal"}'
                admin_conn.sendall(b"PUT /mode HTTP/1.1\r\nHost: admin\r\nContent-Type: application/json\r\n"
                                   b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
                status = int(reader.readline().split()[1])
                length = 0
                while True:
                    line = reader.readline()
                    if line in (b"\r\n", b""):
                        break
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                reader.read(length)
                statuses[status] = statuses.get(status, 0) + 1
            admin_conn.close()
            time.sleep(0.5)
        elapsed = time.time() - t0
        after = self.quiet(p.pid)
        # Which streams did the proxy close? Read each to its end (kernel buffers only: the RSS is read already).
        closed = 0
        for s in streams:
            s.settimeout(0.5)
            try:
                while s.recv(1 << 20):
                    pass
                closed += 1
            except OSError:
                pass
            s.close()
        self.procs.stop(p)
        rec = {"before_kib": before, "subscribed_kib": opened, "peak_kib": sampler.peak,
               "after_kib": after[-1][1] if after else None, "quiet_kib": after, "put_statuses": statuses,
               "put_seconds": round(elapsed, 1), "closed_by_proxy": closed, "subscribers": self.a.subscribers,
               "samples": sampler.samples[::5]}
        log(f"{label} subscribers: RSS {mib(before)} -> {mib(opened)} with {self.a.subscribers} streams -> peak "
            f"{mib(sampler.peak)} -> {mib(rec['after_kib'])} MiB {self.a.quiet} s after; {closed} closed by the proxy; "
            f"PUT statuses {statuses}")
        return rec


# ---------------------------------------------------------------- report

def report(a, results, stamp, command):
    out = [f"# Memory after a burst: datamode-proxy ({stamp} UTC)", "",
           f"Command: `{command}`", "",
           f"Machine: {platform.node()}, {os.cpu_count()} cores, {platform.platform()}; nofile {resource.getrlimit(resource.RLIMIT_NOFILE)}.",
           f"Proxy: `threads: {a.threads}` (0 = one worker per core), HTTPS interception on, access log off; nothing pinned.",
           ""]
    for label, r in results.items():
        out.append(f"- **{label}**: `{r['binary']}`, commit {r['commit']}")
    out += ["", f"## (a) {a.storms} storms of {a.connections:,} concurrent connections for {a.duration} s, "
                f"then {a.quiet} s quiet", "",
            f"{a.connections - a.https_connections:,} plain (lib/memload.c, mix small,download,upload,connect = {a.mix}) "
            f"+ {a.https_connections} HTTPS-intercepted (lib/tlsload.c, 100 KiB GETs). RSS in MiB (VmRSS).", "",
            "| binary | storm | before | peak | " + f"{a.quiet} s after | exchanges (plain / https) | errors (plain / https) |",
            "|---|---|---|---|---|---|---|"]
    for label, r in results.items():
        st = r.get("storms")
        if not st:
            continue
        for row in st["storms"]:
            m, t = row["clients"].get("memload", {}), row["clients"].get("tlsload", {})
            ex = sum((m.get("exchanges") or {}).values())
            er = sum((m.get("errors") or {}).values())
            out.append(f"| {label} | {row['storm']} | {mib(row['before_kib'])} | {mib(row['peak_kib'])} | "
                       f"{mib(row['after_kib'])} | {ex:,} / {t.get('requests', 0):,} | {er} / {sum((t.get('errors') or {}).values())} |")
    out += ["", f"RSS during the quiet after each storm (MiB, at 1, 2, … {a.quiet} s):", ""]
    for label, r in results.items():
        for row in (r.get("storms") or {}).get("storms", []):
            out.append(f"- {label} storm {row['storm']}: " + " ".join(str(mib(k)) for _, k in row["quiet_kib"]))
    out += ["", f"## (b) {a.subscribers} `/events` subscribers that never read, {a.mode_changes:,} `PUT /mode`, "
                f"then {a.quiet} s quiet", "",
            f"Each subscriber sends `GET /events` and never reads (SO_RCVBUF {a.subscriber_rcvbuf or 'default'}); the "
            "mode changes go one after the other on one keep-alive admin connection. RSS in MiB (VmRSS).", "",
            f"| binary | before | with {a.subscribers} streams | peak | {a.quiet} s after | closed by the proxy | PUT /mode |",
            "|---|---|---|---|---|---|---|"]
    for label, r in results.items():
        e = r.get("events")
        if not e:
            continue
        out.append(f"| {label} | {mib(e['before_kib'])} | {mib(e['subscribed_kib'])} | {mib(e['peak_kib'])} | "
                   f"{mib(e['after_kib'])} | {e['closed_by_proxy']} of {e['subscribers']} | "
                   f"{e['put_statuses']} in {e['put_seconds']} s |")
    out += ["", f"RSS during the quiet after the mode changes (MiB, at 1, 2, … {a.quiet} s):", ""]
    for label, r in results.items():
        e = r.get("events")
        if e:
            out.append(f"- {label}: " + " ".join(str(mib(k)) for _, k in e["quiet_kib"]))
    return "\n".join(out) + "\n"


def git_commit():
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True,
                               text=True).stdout.strip()
        return head + (" (with uncommitted changes)" if dirty else "")
    except OSError:
        return "unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--proxy", action="append", default=[], metavar="LABEL=PATH",
                    help="a datamode-proxy binary to measure (repeatable); default: build HEAD with swift build -c release")
    ap.add_argument("--commit", action="append", default=[], metavar="LABEL=COMMIT",
                    help="the commit a --proxy binary was built from, for the report (default: HEAD's)")
    ap.add_argument("--connections", type=int, default=2000)
    ap.add_argument("--https-connections", type=int, default=200, help="of --connections, through interception")
    ap.add_argument("--mix", default="4,2,2,2", help="memload weights: small,download,upload,connect")
    ap.add_argument("--duration", type=float, default=30)
    ap.add_argument("--storms", type=int, default=3)
    ap.add_argument("--quiet", type=int, default=10)
    ap.add_argument("--subscribers", type=int, default=500)
    ap.add_argument("--mode-changes", type=int, default=1500)
    ap.add_argument("--subscriber-rcvbuf", type=int, default=4096,
                    help="SO_RCVBUF of each subscriber (0: the kernel's default). Linux 6.x grows the receive buffer of "
                         "a socket that never reads until all 1,500 events (~290 KB) fit in it, and the proxy never "
                         "queues any; a fixed small buffer makes the backlog reach the proxy, as it does on kernels that "
                         "do not grow it")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--only", default="storms,events")
    ap.add_argument("--workdir", default=os.path.join(HERE, "work", "memory"))
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--stamp", default=None)
    a = ap.parse_args()
    command = "bench/memory.py" + ("".join(" " + x for x in sys.argv[1:]))

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    need = 2 * a.connections + a.subscribers + 1000
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < need:
        raise SystemExit(f"nofile limit {resource.getrlimit(resource.RLIMIT_NOFILE)[0]} < {need}: raise `ulimit -Hn`")

    binaries = []
    commits = dict(x.split("=", 1) for x in a.commit)
    for spec in a.proxy:
        label, _, path = spec.partition("=")
        if not path:
            label, path = os.path.basename(spec), spec
        binaries.append((label, os.path.abspath(path), commits.get(label, git_commit())))
    if not binaries:
        log("building datamode-proxy (swift build -c release --product datamode-proxy)")
        subprocess.run(["swift", "build", "-c", "release", "--product", "datamode-proxy"], cwd=REPO, check=True)
        bindir = subprocess.run(["swift", "build", "-c", "release", "--show-bin-path"], cwd=REPO, check=True,
                                capture_output=True, text=True).stdout.strip()
        binaries.append(("HEAD", os.path.join(bindir, "datamode-proxy"), git_commit()))

    run = Run(a)
    stamp = a.stamp or dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d-%H%M")
    results = {}
    try:
        run.prepare()
        run.start_origin()
        for label, path, commit in binaries:
            r = {"binary": path, "commit": commit}
            if "storms" in a.only:
                r["storms"] = run.storms(path, label)
            if "events" in a.only:
                r["events"] = run.subscribers(path, label)
            results[label] = r
    finally:
        run.procs.stop_all()
    os.makedirs(a.out, exist_ok=True)
    md = report(a, results, stamp, command)
    with open(os.path.join(a.out, f"{stamp}-memory.md"), "w") as f:
        f.write(md)
    with open(os.path.join(a.out, f"{stamp}-memory.json"), "w") as f:
        json.dump({"command": command, "args": vars(a), "results": results}, f, indent=1)
    print(md)


if __name__ == "__main__":
    main()
