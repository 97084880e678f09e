#!/usr/bin/env python3
"""bench runner: starts the origin and the proxies on loopback, runs the measurements interleaved,
stops exactly what it started, and writes bench/results/<stamp>.{md,json,png}.

Run through bench/run (which installs the Debian packages and builds datamode-proxy); see bench/README.md.
"""
import argparse
import datetime as dt
import json
import os
import platform
import re
import resource
import select
import shutil
import signal
import statistics
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.dirname(HERE)
REPO = os.path.dirname(BENCH)
sys.path.insert(0, HERE)

import https  # noqa: E402
import pageweight  # noqa: E402
import policy  # noqa: E402
import procs  # noqa: E402
from procs import Procs, cpu_seconds, kernel_ticks, free_port, rss_kib, system_cpu, per_cpu_busy, tree, wait_listening, port_free  # noqa: E402

SIZES = {"1k": 1024, "100k": 100 * 1024, "100m": 100 * 1024 * 1024}
PEERS = ["haproxy", "nginx", "squid", "tinyproxy"]
DM = "datamode-proxy"
# `--baseline-bin`: another datamode-proxy build measured beside DM in the same run (before/after a change).
BASE = "datamode-baseline"
# Measurement 6 (scale across cores): second instances with two workers each, not pinned.
SCALE_WORKERS = 2
SCALE = {DM: "datamode-proxy-threads2", "haproxy": "haproxy-nbthread2", "nginx": "nginx-workers2"}
# The measurements over plain HTTP (the proxies above); "https" has intercepting proxies of its own (https.py).
PLAIN = ["small", "policy", "download", "connect", "idle", "scale"]
# Measurements that are commands of their own in bench/ (each also runs alone): run with this run's binary, rounds,
# duration and stamp; each writes its table beside this run's report, <stamp>-<name>.md, and the report includes it.
SCRIPTS = ["transparent", "fleet"]
NO_PROXY_ENV = {k: v for k, v in os.environ.items()
                if k.lower() not in ("http_proxy", "https_proxy", "all_proxy", "no_proxy")}


def build_rateload(work):
    """lib/rateload.c, the fixed-rate (open-loop) client of the 1 KiB latency row."""
    out = os.path.join(work, "rateload")
    r = subprocess.run(["cc", "-O2", os.path.join(HERE, "rateload.c"), "-o", out], capture_output=True, text=True,
                       timeout=120)
    if r.returncode != 0:
        raise RuntimeError("could not build lib/rateload.c (needs cc): " + r.stderr[-400:])
    return out


def log(msg):
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def fd_limits():
    """Values for the configs from the file-descriptor limit we run under (inherited by every server)."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return {"nofile": nofile, "worker_connections": max(1024, min(30000, nofile - 200)),
            "maxconn": max(1024, min(30000, (nofile - 200) // 2))}


def render(template, **values):
    values = dict(fd_limits(), **values)
    with open(os.path.join(BENCH, "conf", template)) as f:
        text = f.read()
    for k, v in values.items():
        text = text.replace(f"@{k.upper()}@", str(v))
    left = sorted(set(re.findall(r"@[A-Z_]+@", text)))
    if left:
        raise ValueError(f"{template}: no value for {', '.join(left)}")
    return text


# ---------------------------------------------------------------- targets

class Target:
    """direct (the origin itself) or one proxy process we started."""

    def __init__(self, name, label, connect=True, connect_note=""):
        self.name, self.label = name, label
        self.port = None
        self.proc = None
        self.available = False
        self.reason = ""
        self.connect = connect          # can it CONNECT?
        self.connect_note = connect_note
        self.is_direct = name == "direct"

    def pids(self):
        if self.proc is None or self.proc.poll() is not None:
            return []
        return tree(self.proc.pid)

    def alive(self):
        return self.proc is not None and self.proc.poll() is None


class Bench:
    def __init__(self, a):
        self.a = a
        self.work = a.workdir
        self.procs = Procs(os.path.join(self.work, "logs"))
        self.targets = {}
        self.origin = None
        self.origin_port = None
        self.origin_tls_port = None
        self.results = {"measurements": {}}
        self.t_start = time.time()
        self.client_pids = set()

    # ------------------------------------------------------------ setup

    def prepare(self):
        if os.path.isdir(self.work):
            shutil.rmtree(self.work)
        for d in ("logs", "docroot", "origin-tmp", "nginx-proxy-tmp", "squid", "tinyproxy", "lua"):
            os.makedirs(os.path.join(self.work, d), exist_ok=True)
        # squid and tinyproxy drop privileges: their dirs must be writable by them
        for d in ("squid", "tinyproxy"):
            os.chmod(os.path.join(self.work, d), 0o777)
        os.chmod(self.work, 0o755)
        doc = os.path.join(self.work, "docroot")
        with open(os.path.join(doc, "1k.bin"), "wb") as f:
            f.write(os.urandom(SIZES["1k"]))
        with open(os.path.join(doc, "100k.bin"), "wb") as f:
            f.write(os.urandom(SIZES["100k"]))
        block = os.urandom(1024 * 1024)
        with open(os.path.join(doc, "100m.bin"), "wb") as f:
            for _ in range(100):
                f.write(block)
        self.build_speed_probe()
        # wrk needs the Lua helpers in one dir
        for fn in os.listdir(os.path.join(BENCH, "lua")):
            shutil.copy(os.path.join(BENCH, "lua", fn), os.path.join(self.work, "lua", fn))
        # the origin's HTTPS side: a test CA and a leaf for IP 127.0.0.1 (the proxies verify it against that CA)
        https.make_origin_certificates(self.work)

    # for lib/https.py, which has targets and configs of its own
    sizes = SIZES

    @staticmethod
    def target(name, label):
        return Target(name, label)

    @staticmethod
    def render(template, **values):
        return render(template, **values)

    @staticmethod
    def no_proxy_env():
        return dict(NO_PROXY_ENV)

    def write(self, name, text):
        path = os.path.join(self.work, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def start_origin(self):
        self.origin_port = free_port()
        self.origin_tls_port = free_port()
        conf = self.write("origin-nginx.conf", render("origin-nginx.conf.tmpl", port=self.origin_port,
                                                      tls_port=self.origin_tls_port,
                                                      work=self.work, docroot=os.path.join(self.work, "docroot")))
        self.origin = self.procs.start("origin-nginx", ["nginx", "-c", conf, "-e", os.path.join(self.work, "logs/origin-nginx.err")],
                                       cpu=self.a.client_cpu)
        if not wait_listening(self.origin_port, proc=self.origin):
            raise SystemExit("origin nginx did not start: see " + os.path.join(self.work, "logs"))
        ok, why = self.probe("127.0.0.1", self.origin_port, "/1k.bin")
        if not ok:
            raise SystemExit("origin nginx does not serve /1k.bin: " + why)
        d = Target("direct", "direct (no proxy)", connect=True)
        d.port, d.proc, d.available = self.origin_port, self.origin, True
        self.targets["direct"] = d
        log(f"origin nginx pid {self.origin.pid} on 127.0.0.1:{self.origin_port}")

    def origin_hostport(self):
        return f"127.0.0.1:{self.origin_port}"

    def http_get(self, port, target, timeout=5):
        """One GET on a fresh connection: (status, status line, {header: value} lowercased, body).
        Reads by Content-Length (or to EOF without one), so a server that ignores Connection: close is fine."""
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(f"GET {target} HTTP/1.1\r\nHost: {self.origin_hostport()}\r\nConnection: close\r\n\r\n".encode())
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            lines = head.decode("latin-1", "replace").split("\r\n")
            headers = {}
            for ln in lines[1:]:
                k, _, v = ln.partition(":")
                headers[k.strip().lower()] = v.strip()
            length = int(headers["content-length"]) if headers.get("content-length", "").isdigit() else None
            while length is None or len(body) < length:
                chunk = s.recv(65536)
                if not chunk:
                    break
                body += chunk
        try:
            status = int(lines[0].split()[1])
        except (IndexError, ValueError):
            status = 0
        return status, lines[0], headers, body

    def probe(self, host, port, target, expect=200, size=1024, timeout=5):
        """One GET through/to port; (ok, reason)."""
        try:
            status, status_line, _, body = self.http_get(port, target, timeout)
        except OSError as e:
            return False, f"{type(e).__name__}: {e}"
        if status != expect:
            return False, f"status {status} ({status_line[:80]!r})"
        if size is not None and len(body) < size:
            return False, f"short body {len(body)} < {size}"
        return True, status_line

    def start_proxy(self, name, label, argv, port, cwd=None, connect=True, connect_note="", env=None, cpu=None,
                    probe=True):
        """cpu: what taskset gets (default: the proxy core; the scale row passes every core)."""
        t = Target(name, label, connect=connect, connect_note=connect_note)
        t.port = port
        # how to start it again (section 3 measures idle memory on a fresh process)
        t.spec = dict(name=name, label=label, argv=argv, port=port, cwd=cwd, connect=connect,
                      connect_note=connect_note, env=env, cpu=cpu, probe=probe)
        self.targets[name] = t
        try:
            t.proc = self.procs.start(name, argv, cpu=self.a.proxy_cpu if cpu is None else cpu, cwd=cwd, env=env)
        except OSError as e:
            t.reason = f"could not start: {e}"
            log(f"{name}: {t.reason}")
            return t
        if not wait_listening(port, timeout=20, proc=t.proc):
            t.reason = "did not start listening" + (f" (exited {t.proc.returncode})" if t.proc.poll() is not None else "")
            last = self.log_tail(name)
            if last:
                t.reason += f": {last}"
            log(f"{name}: {t.reason}")
            self.procs.stop(t.proc)
            return t
        if not probe:   # the caller probes it its own way (https.py: through TLS)
            t.available = True
            return t
        ok, why = self.probe("127.0.0.1", port, f"http://{self.origin_hostport()}/1k.bin")
        if not ok:
            t.reason = f"probe through it failed: {why}"
            log(f"{name}: {t.reason}")
            self.procs.stop(t.proc)
            return t
        t.available = True
        log(f"{name} pid {t.proc.pid} on 127.0.0.1:{port} ({why})")
        return t

    def restart(self, t):
        """Stops t's process and starts the same command again; the new Target replaces it."""
        self.procs.stop(t.proc)
        port = t.spec["port"]
        deadline = time.time() + 10
        while time.time() < deadline and not port_free(port):
            time.sleep(0.1)
        new = self.start_proxy(**t.spec)
        for attr in ("admin_port",):
            if hasattr(t, attr):
                setattr(new, attr, getattr(t, attr))
        return new

    def log_line(self, msg):
        log(msg)

    def log_tail(self, name):
        """The last non-empty line of a started process's log (for a 'not available' reason)."""
        try:
            with open(os.path.join(self.work, "logs", name + ".log"), "rb") as f:
                f.seek(0, 2)
                f.seek(max(0, f.tell() - 4096))
                lines = [ln.strip() for ln in f.read().decode("utf-8", "replace").splitlines() if ln.strip()]
            return lines[-1][:200] if lines else ""
        except OSError:
            return ""

    def start_peers(self):
        o = self.origin_port
        w = self.work
        want = [p for p in PEERS if p in self.a.targets]
        if "haproxy" in want:
            self.start_haproxy("haproxy", "HAProxy (reverse proxy, abs-form)")
        if "nginx" in want:
            self.start_nginx("nginx", "nginx-proxy", "nginx (upstream keep-alive)")
        if "squid" in want:
            port = free_port()
            conf = self.write("squid.conf", render("squid.conf.tmpl", port=port, origin_port=o, work=w))
            self.start_proxy("squid", "Squid (cache off)", ["squid", "-N", "-f", conf], port, cwd=os.path.join(w, "squid"))
        if "tinyproxy" in want:
            port = free_port()
            conf = self.write("tinyproxy.conf", render("tinyproxy.conf.tmpl", port=port, origin_port=o, work=w))
            self.start_proxy("tinyproxy", "tinyproxy", ["tinyproxy", "-d", "-c", conf], port)

    def start_haproxy(self, name, label, threads=1, cpu=None):
        port = free_port()
        conf = self.write(f"{name}.cfg", render("haproxy.cfg.tmpl", port=port, origin_port=self.origin_port,
                                                 work=self.work, name=name, threads=threads))
        return self.start_proxy(name, label, ["haproxy", "-db", "-f", conf], port, cpu=cpu,
                                connect=False, connect_note="n/a: not a forward proxy")

    def start_nginx(self, name, conf_name, label, workers=1, cpu=None):
        """conf_name: file names of its config, pid, error log and temp dir (nginx-proxy for the 1-worker peer)."""
        port = free_port()
        os.makedirs(os.path.join(self.work, f"{conf_name}-tmp"), exist_ok=True)
        conf = self.write(f"{conf_name}.conf", render("nginx-proxy.conf.tmpl", port=port, origin_port=self.origin_port,
                                                      work=self.work, name=conf_name, workers=workers))
        return self.start_proxy(name, label, ["nginx", "-c", conf, "-e", os.path.join(self.work, f"logs/{conf_name}.err")],
                                port, cpu=cpu, connect=False, connect_note="n/a: nginx cannot CONNECT")

    def datamode_argv(self, name, conf, port, admin, mode=None, threads=1, binary=None):
        argv = [binary or self.a.proxy_bin, "run", "--config", conf, "--listen", f"127.0.0.1:{port}",
                "--admin-listen", f"127.0.0.1:{admin}", "--threads", str(threads),
                "--state-dir", os.path.join(self.work, f"{name}-state")]
        if mode:
            argv += ["--mode", mode]
        return argv

    def start_datamode(self, name, label, extra_yaml=None, mode=None, threads=1, cpu=None, connect_port=None, env=None,
                       probe=True, binary=None):
        port, admin = free_port(), free_port()
        base = render("datamode.yaml.tmpl", port=port, admin_port=admin, origin_port=connect_port or self.origin_port,
                      work=self.work, name=name, threads=threads)
        text = base if extra_yaml is None else extra_yaml(base)
        conf = self.write(f"{name}.yaml", text)
        os.makedirs(os.path.join(self.work, f"{name}-state"), exist_ok=True)
        t = self.start_proxy(name, label, self.datamode_argv(name, conf, port, admin, mode, threads, binary), port,
                             cwd=self.work, env=dict(NO_PROXY_ENV, **(env or {})), cpu=cpu, probe=probe)
        t.admin_port = admin
        if not t.available:
            # say why, in the proxy's own words, when it is the configuration
            try:
                chk = subprocess.run([self.a.proxy_bin, "check", "--config", conf], capture_output=True, text=True,
                                     timeout=30, cwd=self.work, env=NO_PROXY_ENV)
                if chk.returncode != 0:
                    msg = (chk.stderr or chk.stdout).strip().splitlines()
                    t.reason += f"; `check --config` says: {msg[0][:200] if msg else chk.returncode}"
            except (OSError, subprocess.TimeoutExpired):
                pass
            log(f"{name}: {t.reason}")
        return t

    def start_all(self):
        self.start_origin()
        plain = any(m in PLAIN for m in self.a.only)
        if not plain and not any(m in ("shaping", "pageweight") for m in self.a.only):
            return   # --only https: its proxies are started by https.py
        if DM in self.a.targets:
            if self.a.datamode_unavailable or not self.a.proxy_bin:
                t = Target(DM, "datamode-proxy")
                t.reason = self.a.datamode_unavailable or "no binary"
                self.targets[DM] = t
                log(f"{DM}: not available: {t.reason}")
            else:
                self.start_datamode(DM, "datamode-proxy")
                if self.a.baseline_bin:
                    self.start_datamode(BASE, "datamode-proxy (baseline)", binary=self.a.baseline_bin)
        if plain:
            self.start_peers()   # --only shaping / pageweight measure datamode-proxy alone

    def order(self, names=None):
        """Targets in the fixed interleaving order."""
        if names is None:
            names = [n for n in ["direct", DM, BASE] + PEERS
                     if n == "direct" or n in self.a.targets or (n == BASE and self.a.baseline_bin)]
        return [self.targets[n] for n in names if n in self.targets]

    # ------------------------------------------------------------ sampling

    def snapshot(self, t):
        busy, columns = system_cpu()
        return {
            "t": time.time(),
            "proxy": cpu_seconds(t.pids()) if not t.is_direct else 0.0,
            "proxy_kernel": kernel_ticks(t.pids()) / procs.CLK_TCK if not t.is_direct else 0.0,
            "origin": cpu_seconds(tree(self.origin.pid)),
            "sys": busy,
            "steal": columns["steal"],
            "percpu": per_cpu_busy(),
            "self": sum(resource.getrusage(resource.RUSAGE_SELF)[:2]),
            "procs": procs.all_process_ticks(),
            "known": set(t.pids()) | set(tree(self.origin.pid)) | {os.getpid()},
        }

    def cpu_delta(self, t, before, after, client_s):
        wall = after["t"] - before["t"]
        proxy = after["proxy"] - before["proxy"]
        origin = after["origin"] - before["origin"]
        total = after["sys"] - before["sys"]
        me = after["self"] - before["self"]
        other = max(0.0, total - proxy - origin - client_s - me)
        pc = self.a.proxy_cpu
        proxy_core = after["percpu"].get(pc, 0) - before["percpu"].get(pc, 0)
        other_proxy_core = min(wall, max(0.0, proxy_core - proxy))
        exclude = before["known"] | after["known"] | self.client_pids
        top = procs.busiest_others(before["procs"], after["procs"], exclude, wall)
        # Time the hypervisor ran something else on our virtual CPUs (/proc/stat steal, all CPUs): the load here did
        # not see it as busy, but the proxies lost it (the rows' latencies and rates swing with it).
        steal = max(0.0, after["steal"] - before["steal"])
        return {"other_top": top, "wall_s": wall, "proxy_cpu_s": proxy, "origin_cpu_s": origin, "client_cpu_s": client_s,
                "total_cpu_s": total, "other_cpu_s": other, "other_pct": 100 * other / wall if wall else 0,
                "steal_pct": 100 * steal / wall if wall else 0,
                "other_on_proxy_core_pct": 100 * other_proxy_core / wall if wall else 0}

    def gone(self, t):
        """True when target t cannot be measured: never available, or its process exited (then marked so, with why)."""
        if not t.available or (not t.is_direct and not t.alive()):
            if t.available:
                t.available, t.reason = False, "process exited during the run"
            return True
        return False

    def run_summary_client(self, t, tool, argv, timeout, cpu=None):
        """Runs a client that ends with one `BENCH_JSON {...}` line (wrk's Lua, tlsload, rateload), with the CPU of the
        proxy and of everything else taken around it: (record, summary, before, after). When the client failed or
        printed no summary, summary is None and the record says why."""
        before = self.snapshot(t)
        text, client_s, rc = self.run_client(argv, timeout=timeout, cpu=cpu)
        after = self.snapshot(t)
        rec = self.cpu_delta(t, before, after, client_s)
        line = [ln for ln in text.splitlines() if ln.startswith("BENCH_JSON ")]
        if rc != 0 or not line:
            rec.update(available=True, failed=True, reason=f"{tool} rc={rc}: {text.strip()[-300:]}")
            return rec, None, before, after
        return rec, json.loads(line[-1][len("BENCH_JSON "):]), before, after

    def run_client(self, argv, timeout, cpu=None):
        """Run a client pinned to the client core (or to cpu, a taskset list); returns (stdout, client CPU seconds, rc)."""
        out_path = os.path.join(self.work, "logs", "client.out")
        with open(out_path, "wb") as out:
            p = subprocess.Popen(["taskset", "-c", str(self.a.client_cpu if cpu is None else cpu)] + argv, stdout=out,
                                 stderr=subprocess.STDOUT, env=dict(NO_PROXY_ENV, BENCH_LUA_DIR=os.path.join(self.work, "lua")),
                                 start_new_session=True)
            self.procs.started.append(("client", p))
            self.client_pids.add(p.pid)
            deadline = time.time() + timeout
            rc, ru = None, None
            while True:
                pid, status, ru = os.wait4(p.pid, os.WNOHANG)
                if pid:
                    rc = os.waitstatus_to_exitcode(status)
                    p.returncode = rc
                    break
                if time.time() > deadline:
                    self.procs.stop(p)
                    rc = -9
                    ru = None
                    break
                time.sleep(0.02)
            self.procs.started.remove(("client", p))
        with open(out_path, "rb") as f:
            text = f.read().decode("utf-8", "replace")
        client = (ru.ru_utime + ru.ru_stime) if ru else 0.0
        return text, client, rc

    def wrk(self, t, script, script_args, duration, connections=None, threads=1):
        c = connections or self.a.connections
        lua = os.path.join(self.work, "lua", script)
        if t.is_direct:
            url = f"http://127.0.0.1:{self.origin_port}{script_args[0]}"
            extra = []
        else:
            url = f"http://127.0.0.1:{t.port}/"
            extra = ["--"] + list(script_args)
        argv = ["wrk", f"-t{threads}", f"-c{c}", f"-d{duration}s", "--timeout", "10s", "--latency", "-s", lua, url] + extra
        return argv

    def measure_wrk(self, t, script, script_args, duration, connections=None, threads=1, cpu=None):
        """cpu: None = the usual split (wrk on the client core, proxy pinned to its core); a taskset list =
        wrk runs there and nothing is pinned to one core (the scale row: no per-core figures)."""
        if self.gone(t):
            return {"available": False, "reason": t.reason}
        argv = self.wrk(t, script, script_args, duration, connections, threads)
        rec, w, before, after = self.run_summary_client(t, "wrk", argv, timeout=duration + 30, cpu=cpu)
        if cpu is not None:
            # nothing has a core of its own: "other work on the proxy's core" means nothing here
            rec.pop("other_on_proxy_core_pct", None)
            wall = rec["wall_s"]
            rec.update(wrk_threads=threads, connections=connections or self.a.connections, cpus=str(cpu),
                       proxy_cores=rec["proxy_cpu_s"] / wall if wall and not t.is_direct else None,
                       client_origin_cores=(rec["client_cpu_s"] + rec["origin_cpu_s"]) / wall if wall else None)
        if w is None:
            return rec
        dur = w["duration_us"] / 1e6
        reqs = w["requests"]
        rec.update(available=True, requests=reqs, rps=reqs / dur if dur else 0, p50_ms=w["lat_p50_us"] / 1000,
                   p99_ms=w["lat_p99_us"] / 1000, errors=w["connect"] + w["read"] + w["write"] + w["timeout"] + w["status"],
                   errors_detail={k: w[k] for k in ("connect", "read", "write", "timeout", "status")},
                   bytes=w["bytes"], cpu_us_per_req=(rec["proxy_cpu_s"] * 1e6 / reqs) if reqs and not t.is_direct else None,
                   kernel_us_per_req=((after["proxy_kernel"] - before["proxy_kernel"]) * 1e6 / reqs)
                   if reqs and not t.is_direct else None)
        if not t.is_direct and not t.alive():
            rec["reason"] = "proxy exited during this run"
        return rec

    def measure_download(self, t, tunnel, count):
        if not t.available or (not t.is_direct and not t.alive()):
            return {"available": False, "reason": t.reason or "not running"}
        url = f"http://{self.origin_hostport()}/100m.bin"
        argv = ["curl", "-s", "-w", "%{http_code} %{size_download} %{time_total}\\n"]
        if not t.is_direct:
            argv += ["-x", f"http://127.0.0.1:{t.port}"]
            if tunnel:
                argv += ["-p"]
        for _ in range(count):
            argv += ["-o", "/dev/null", url]
        before = self.snapshot(t)
        text, client_s, rc = self.run_client(argv, timeout=300)
        after = self.snapshot(t)
        rec = self.cpu_delta(t, before, after, client_s)
        rows = []
        for ln in text.splitlines():
            parts = ln.split()
            if len(parts) == 3 and parts[0].isdigit():
                rows.append((int(parts[0]), int(parts[1]), float(parts[2])))
        good = [r for r in rows if r[0] == 200 and r[1] == SIZES["100m"]]
        rec.update(available=True, transfers=len(rows), ok=len(good), errors=count - len(good),
                   statuses=sorted({r[0] for r in rows}))
        if good:
            nbytes = sum(r[1] for r in good)
            secs = sum(r[2] for r in good)
            rec.update(bytes=nbytes, mb_s=nbytes / secs / 1e6,
                       per_transfer_mb_s=[round(r[1] / r[2] / 1e6, 1) for r in good],
                       cpu_s_per_gb=(rec["proxy_cpu_s"] / (nbytes / 1e9)) if not t.is_direct else None)
        if rc != 0:
            rec["reason"] = f"curl rc={rc}: {text.strip()[-200:]}"
        return rec

    # ------------------------------------------------------------ measurements

    def build_speed_probe(self):
        """lib/speedprobe.c: a fixed loop timed on the proxy's core before each measurement (None if cc fails)."""
        out = os.path.join(self.work, "speedprobe")
        r = subprocess.run(["cc", "-O2", os.path.join(BENCH, "lib", "speedprobe.c"), "-o", out],
                           capture_output=True, text=True, timeout=60)
        self.speed_probe_bin = out if r.returncode == 0 else None
        if r.returncode != 0:
            log("speedprobe.c did not build (no speed column): " + r.stderr[-200:])

    def speed_probe(self):
        """Seconds the fixed loop took on the proxy's core now (the proxies idle between measurements), or None."""
        if not self.speed_probe_bin:
            return None
        r = subprocess.run(["taskset", "-c", str(self.a.proxy_cpu), self.speed_probe_bin], capture_output=True,
                           text=True, timeout=30)
        try:
            return float(r.stdout.strip())
        except ValueError:
            return None

    def interleaved(self, key, names, fn, warm=None):
        """Rounds A B C A B C ...; fn(target, round) -> record. Each record also gets the speed probe taken just
        before it (`speed_probe_s`): the machine's own drift, beside the proxies' figures."""
        order = self.order(names)
        out = {t.name: [] for t in order}
        if warm:
            for t in order:
                warm(t)
        for r in range(self.a.rounds):
            for t in order:
                out[t.name].append(self.measured(key, t, r, lambda: fn(t, r)))
        return out

    def measured(self, key, t, r, run):
        """One measurement of round r: the speed probe, then run() -> record; taken again (at most --steal-retries
        times, right away, so the rounds stay interleaved) while the hypervisor stole more than --steal-limit % of a
        core during it: such a sample is the host's, not the proxy's. The steal of each discarded attempt is kept in
        the record (`retaken_for_steal`)."""
        discarded = []
        while True:
            probe = self.speed_probe()
            rec = run()
            rec["round"] = r
            rec["speed_probe_s"] = probe
            steal = rec.get("steal_pct")
            if steal is None or steal <= self.a.steal_limit or len(discarded) >= self.a.steal_retries \
                    or not rec.get("available", True) or rec.get("failed"):
                break
            discarded.append(round(steal, 1))
            log(f"{key} r{r} {t.name}: {steal:.0f}% of a core stolen by the hypervisor during it: measured again")
        if discarded:
            rec["retaken_for_steal"] = discarded
        self.progress(key, t, rec)
        return rec

    def progress(self, key, t, rec):
        if not rec.get("available", True):
            log(f"{key} {t.name}: not available ({rec.get('reason')})")
            return
        bits = []
        for k, fmt in (("rps", "{:.0f} req/s"), ("cpu_us_per_req", "{:.1f} us/req"), ("cpu_ms_per_conn", "{:.2f} ms/conn"),
                       ("p99_ms", "p99 {:.2f} ms"),
                       ("mb_s", "{:.0f} MB/s"), ("cpu_s_per_gb", "{:.2f} s/GB"), ("errors", "{} err"),
                       ("other_pct", "other {:.0f}%"), ("steal_pct", "steal {:.0f}%"), ("speed_probe_s", "probe {:.3f} s")):
            if rec.get(k) is not None:
                bits.append(fmt.format(rec[k]))
        if rec.get("reason"):
            bits.append(rec["reason"][:120])
        log(f"{key} r{rec.get('round', '?')} {t.name}: " + ", ".join(bits))

    def m1_small(self):
        for size in ("1k", "100k"):
            path = f"/{size}.bin"
            absolute = f"http://{self.origin_hostport()}{path}"

            def args_for(t):
                return [path] if t.is_direct else [absolute, self.origin_hostport()]

            def warm(t):
                if self.a.warmup > 0 and t.available:
                    self.measure_wrk(t, "absolute.lua", args_for(t), self.a.warmup)

            res = self.interleaved(f"m1-{size}", None,
                                   lambda t, r: self.measure_wrk(t, "absolute.lua", args_for(t), self.a.duration), warm)
            self.results["measurements"][f"small_{size}"] = res
            if size == "1k" and self.a.fixed_rate > 0:
                rateload = build_rateload(self.work)
                res = self.interleaved("m1-1k-rate", None,
                                       lambda t, r: self.measure_rate(rateload, t, path, absolute, self.a.fixed_rate))
                self.results["measurements"]["small_1k_rate"] = res

    def measure_rate(self, rateload, t, path, absolute, rate):
        """1 KiB GETs at a fixed rate (lib/rateload.c, open loop): latency at the same load through every proxy, where
        wrk's closed loop sends more to the proxy that answers sooner and takes its p99 at a higher rate."""
        if self.gone(t):
            return {"available": False, "reason": t.reason}
        port = self.origin_port if t.is_direct else t.port
        argv = [rateload, "--connect", f"127.0.0.1:{port}", "--path", path if t.is_direct else absolute,
                "--host", self.origin_hostport(), "-c", str(self.a.connections), "--rate", str(rate),
                "-d", str(self.a.duration), "--warmup", str(max(1, self.a.warmup))]
        rec, r, _, _ = self.run_summary_client(t, "rateload", argv, timeout=self.a.duration + 60)
        if r is None:
            return rec
        errors = sum(r["errors"].values())
        answered = r["answered_all"]
        rec.update(available=True, rate=rate, requests=r["requests"], errors=errors, errors_detail=r["errors"],
                   p50_ms=r["lat_p50_us"] / 1000, p90_ms=r["lat_p90_us"] / 1000, p99_ms=r["lat_p99_us"] / 1000,
                   p999_ms=r["lat_p999_us"] / 1000, max_ms=r["lat_max_us"] / 1000,
                   cpu_us_per_req=(rec["proxy_cpu_s"] * 1e6 / answered) if answered and not t.is_direct else None)
        if not t.is_direct and not t.alive():
            rec["reason"] = "proxy exited during this run"
        return rec

    def m2_download(self):
        res = self.interleaved("m2-100m", None, lambda t, r: self.measure_download(t, False, self.a.downloads))
        self.results["measurements"]["download_100m"] = res

    def m5_connect(self):
        def fn(t, r):
            if not t.is_direct and not t.connect:
                return {"available": False, "reason": t.connect_note}
            return self.measure_download(t, not t.is_direct, self.a.downloads)
        res = self.interleaved("m5-connect", None, fn)
        self.results["measurements"]["connect_100m"] = res

    def m3_idle(self):
        res = {}
        n = self.a.idle_conns
        for t in self.order():
            if not t.available or not t.alive():
                res[t.name] = {"available": False, "reason": t.reason or "not running"}
                log(f"m3-idle {t.name}: not available")
                continue
            if t.is_direct:
                addr, target = f"127.0.0.1:{self.origin_port}", "/1k.bin"
            else:
                # A fresh process: memory a proxy kept from sections 1-2 (malloc's free space, buffer pools) would
                # otherwise be reused by the idle connections and not counted.
                t = self.restart(t)
                if not t.available:
                    res[t.name] = {"available": False, "reason": "restart: " + t.reason}
                    log(f"m3-idle {t.name}: restart failed: {t.reason}")
                    continue
                addr, target = f"127.0.0.1:{t.port}", f"http://{self.origin_hostport()}/1k.bin"
            time.sleep(1.0)
            rss0 = rss_kib(t.pids())
            argv = ["taskset", "-c", str(self.a.client_cpu), sys.executable, os.path.join(HERE, "idle.py"),
                    "--addr", addr, "--target", target, "--host", self.origin_hostport(), "-n", str(n),
                    "--concurrency", "50", "--max-seconds", "180"]
            p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 env=NO_PROXY_ENV, start_new_session=True)
            self.procs.started.append(("idle", p))
            ready = None
            deadline = time.time() + 150
            buf = b""
            while time.time() < deadline and p.poll() is None:
                r, _, _ = select.select([p.stdout], [], [], 0.5)
                if r:
                    chunk = os.read(p.stdout.fileno(), 65536)
                    if not chunk:
                        break
                    buf += chunk
                    if b"\n" in buf and buf.startswith(b"READY "):
                        ready = json.loads(buf.split(b"\n")[0][6:])
                        break
            rec = {"available": True, "rss_before_kib": rss0}
            if ready is None:
                why = p.stderr.read1(2000).decode("utf-8", "replace") if p.poll() is not None else "timeout"
                rec.update(failed=True, reason="idle client did not get ready: " + why)
            else:
                time.sleep(2.0)  # let the proxy settle (free per-request buffers)
                rss1 = rss_kib(t.pids())
                rec.update(ready)
                rec["rss_after_kib"] = rss1
                held = ready["open"]
                rec["kib_per_conn"] = (rss1 - rss0) / held if held else None
                if held < 0.9 * n:
                    rec["reason"] = f"held {held} of {n} open (server closed the rest)"
            try:
                p.stdin.write(b"close\n")
                p.stdin.flush()
            except OSError:
                pass
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.procs.stop(p)
            self.procs.started.remove(("idle", p))
            res[t.name] = rec
            log(f"m3-idle {t.name}: rss {rec.get('rss_before_kib')} -> {rec.get('rss_after_kib')} KiB, "
                f"open {rec.get('open')}, {rec.get('kib_per_conn')} KiB/conn {rec.get('reason', '')}")
        self.results["measurements"]["idle"] = res

    def metrics(self, t):
        try:
            with socket.create_connection(("127.0.0.1", t.admin_port), timeout=3) as s:
                s.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                data = b""
                while True:
                    c = s.recv(65536)
                    if not c:
                        break
                    data += c
        except OSError:
            return None
        out = {}
        for ln in data.decode("utf-8", "replace").splitlines():
            if ln.startswith("datamode_requests_total{"):
                labels, _, val = ln.rpartition(" ")
                outcome = labels.split('outcome="', 1)[1].split('"', 1)[0] if 'outcome="' in labels else "?"
                try:
                    out[outcome] = out.get(outcome, 0) + float(val)
                except ValueError:
                    pass
        return out

    def classify_probe(self, t, urls):
        """One request of each class through t: what actually happened (status, variant header)."""
        seen = {}
        for cls, url in urls:
            if cls in seen:
                continue
            try:
                status, status_line, headers, _ = self.http_get(t.port, url)
                v = headers.get("data-mode-variant")
                seen[cls] = status_line + (f" (Data-Mode-Variant: {v})" if v else "")
            except OSError as e:
                seen[cls] = f"error {type(e).__name__}: {e}"
        return seen

    def m4_policy(self):
        key = "policy_1k"
        base = self.targets.get(DM)
        if base is None or not base.available:
            self.results["measurements"][key] = {"available": False, "reason": (base.reason if base else "not requested")}
            log("m4-policy: datamode-proxy not available")
            return
        urls = policy.urls(self.origin_hostport())
        url_file = self.write("policy-urls.txt", "\n".join(u for _, u in urls) + "\n")
        cons = self.start_datamode("datamode-constrained", "datamode-proxy constrained, 1,000 rules + 10,000 variants",
                                   extra_yaml=lambda b: policy.config_yaml(b, self.origin_hostport()), mode="constrained")
        info = {"rules": policy.N_RULES, "variants": policy.N_VARIANTS, "mix": policy.MIX}
        if not cons.available:
            self.results["measurements"][key] = {"available": False, "reason": "constrained instance: " + cons.reason, "info": info}
            return
        info["probe_constrained"] = self.classify_probe(cons, urls)
        info["probe_policy_free"] = self.classify_probe(base, urls)
        # The same policy under the global mode `normal`, with 1,000 live sessions in `constrained`: every
        # request names one of them (Data-Mode-Session), so the decision runs in the session's mode (SPEC §12).
        sess = self.start_datamode("datamode-sessions", "datamode-proxy, 1,000 rules + 10,000 variants, 1,000 sessions",
                                   extra_yaml=lambda b: policy.config_yaml(b, self.origin_hostport()) + policy.SESSIONS_YAML)
        names = [DM, "datamode-constrained"]
        if sess.available:
            made = self.create_sessions(sess, policy.N_SESSIONS, "constrained")
            info["sessions"] = made
            if made == policy.N_SESSIONS:
                names.append("datamode-sessions")
            else:
                log(f"m4-policy: only {made} of {policy.N_SESSIONS} sessions created; the sessions variant is left out")
        m0 = self.metrics(cons)
        args = [url_file, self.origin_hostport()]
        session_args = args + [str(policy.N_SESSIONS)]

        def run(t, seconds):
            return self.measure_wrk(t, "cycle.lua", session_args if t.name == "datamode-sessions" else args, seconds)

        def warm(t):
            if self.a.warmup > 0:
                run(t, self.a.warmup)

        res = self.interleaved("m4-policy", names, lambda t, r: run(t, self.a.duration), warm)
        m1 = self.metrics(cons)
        if m0 is not None and m1 is not None:
            info["constrained_outcomes"] = {k: m1.get(k, 0) - m0.get(k, 0) for k in m1}
        if "datamode-sessions" in names:
            info["sessions_outcomes"] = self.metrics(sess)
        res["info"] = info
        self.results["measurements"][key] = res
        self.procs.stop(cons.proc)
        if sess.proc is not None:
            self.procs.stop(sess.proc)

    def create_sessions(self, t, count, mode):
        """PUT /sessions/s<i> for i < count, on one keep-alive admin connection; how many were created."""
        made = 0
        body = json.dumps({"mode": mode}).encode()
        try:
            with socket.create_connection(("127.0.0.1", t.admin_port), timeout=10) as s:
                f = s.makefile("rb")
                for i in range(count):
                    s.sendall(f"PUT /sessions/s{i} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                              f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
                    status = f.readline().split()
                    length = 0
                    while True:
                        line = f.readline()
                        if line in (b"\r\n", b""):
                            break
                        k, _, v = line.decode("latin-1").partition(":")
                        if k.strip().lower() == "content-length":
                            length = int(v.strip())
                    f.read(length)
                    if len(status) > 1 and status[1] in (b"200", b"201"):
                        made += 1
        except OSError as e:
            log(f"create_sessions: {e}")
        return made

    def m_script(self, name):
        """bench/transparent (issue 27) or bench/fleet (issue 29), as its own process, on every core (as when it runs
        alone: bench/transparent pins its proxy and clients itself, bench/fleet pins nothing); stopped with the rest
        on an interrupt. Its table is read back from the file it writes."""
        a = self.a
        res = {"available": False, "script": f"bench/{name}"}
        self.results["measurements"][name] = res
        if not a.proxy_bin:
            res["reason"] = f"datamode-proxy not available: {a.datamode_unavailable or 'no binary'}"
            log(f"{name}: {res['reason']}")
            return
        if name == "transparent" and os.getuid() != 0:
            res["reason"] = "needs root (a network namespace of its own, iptables inside it)"
            log(f"{name}: {res['reason']}")
            return
        argv = [sys.executable, os.path.join(BENCH, name),
                "--proxy-bin" if name == "transparent" else "--binary", a.proxy_bin,
                "--rounds", str(a.rounds), "--duration", str(a.duration), "--out", a.out, "--stamp", a.stamp]
        res["command"] = " ".join(["bench/" + name] + argv[2:])
        path = os.path.join(a.out, f"{a.stamp}-{name}.md")
        if os.path.exists(path):
            os.remove(path)   # a file of an earlier run with this stamp must not pass for this run's
        log(f"{name}: {res['command']}")
        t0 = time.time()
        p = self.procs.start(f"script-{name}", argv, cpu=",".join(map(str, a.all_cpus)))
        rc = p.wait()
        res["seconds"] = round(time.time() - t0, 1)
        if rc != 0 or not os.path.exists(path):
            with open(os.path.join(self.work, "logs", f"script-{name}.log"), errors="replace") as f:
                tail = [ln.strip() for ln in f.read().splitlines() if ln.strip()][-3:]
            res["reason"] = f"bench/{name} exited {rc}: {' / '.join(tail)[-300:]}"
            log(f"{name}: {res['reason']}")
            return
        with open(path) as f:
            res["markdown"] = f.read()
        res.update(available=True, file=os.path.basename(path))
        log(f"{name}: wrote {path} in {res['seconds']:.0f} s")

    def m7_pageweight(self):
        """SPEC §13 images: bytes saved, transcodes per CPU-second, added latency, untouched throughput meanwhile."""
        key = "pageweight"
        base = self.targets.get(DM)
        if base is None or not base.available:
            self.results["measurements"][key] = {"available": False, "reason": (base.reason if base else "not requested")}
            log("m7-pageweight: datamode-proxy not available")
            return
        try:
            originals = pageweight.generate(os.path.join(self.work, "docroot"))
        except ImportError as e:
            self.results["measurements"][key] = {"available": False, "reason": f"no Pillow (python3-pil): {e}"}
            return
        cons = self.start_datamode("datamode-images", "datamode-proxy constrained, images.transcode",
                                   extra_yaml=lambda b: b + pageweight.YAML, mode="constrained")
        if not cons.available:
            self.results["measurements"][key] = {"available": False, "reason": "constrained instance: " + cons.reason}
            return
        host = self.origin_hostport()
        rounds = max(1, self.a.rounds)
        per_image, added = {}, []
        for r in range(rounds):
            for name, *_ in pageweight.IMAGES:
                url = f"http://{host}/img/{name}?round={r}"   # a new URL per round: never a cache hit
                _, _, normal_bytes, normal_s = pageweight.fetch(base.port, url, host)
                status, headers, cons_bytes, cons_s = pageweight.fetch(cons.port, url, host)
                added.append((cons_s - normal_s) * 1000)
                rec = per_image.setdefault(name, {"original": originals[name], "normal": normal_bytes,
                                                  "constrained": cons_bytes, "status": status,
                                                  "variant": headers.get("data-mode-variant", ""),
                                                  "type": headers.get("content-type", "")})
                rec["constrained"] = cons_bytes
        saved = [1 - v["constrained"] / v["normal"] for v in per_image.values() if v["normal"]]
        total_normal = sum(v["normal"] for v in per_image.values())
        total_cons = sum(v["constrained"] for v in per_image.values())
        # Transcodes per CPU-second: the whole set, fetched by two clients at once, against the proxy's CPU time.
        before = self.snapshot(cons)
        load = pageweight.Load(cons.port, host, threads=2)
        load.start()
        time.sleep(max(2, self.a.duration))
        load.stop()
        after = self.snapshot(cons)
        rec = self.cpu_delta(cons, before, after, 0)
        transcodes = load.count
        transcodes_per_cpu_s = transcodes / rec["proxy_cpu_s"] if rec.get("proxy_cpu_s") else None
        # Untouched traffic (1 KiB) through the constrained instance alone, then with transcoding beside it.
        absolute = f"http://{host}/1k.bin"
        alone = self.measure_wrk(cons, "absolute.lua", [absolute, host], self.a.duration)
        load = pageweight.Load(cons.port, host, threads=2)
        load.start()
        busy = self.measure_wrk(cons, "absolute.lua", [absolute, host], self.a.duration)
        load.stop()
        self.results["measurements"][key] = {
            "available": True, "images": per_image, "rounds": rounds,
            "saved_median_pct": statistics.median(saved) * 100 if saved else None,
            "saved_total_pct": (1 - total_cons / total_normal) * 100 if total_normal else None,
            "bytes_normal": total_normal, "bytes_constrained": total_cons,
            "transcodes": transcodes, "transcode_window": rec, "transcodes_per_cpu_s": transcodes_per_cpu_s,
            "added_latency_ms": {"p50": pageweight.percentile(added, 50), "p99": pageweight.percentile(added, 99),
                                 "samples": len(added)},
            "untouched_1k": {"alone": alone, "while_transcoding": busy},
        }
        log(f"m7-pageweight: median saved {self.results['measurements'][key]['saved_median_pct']:.0f}%")
        self.procs.stop(cons.proc)

    def set_origin_cpus(self, cpus):
        """Re-pin every thread of the running origin nginx (master and worker) to the given CPU set."""
        for pid in tree(self.origin.pid):
            try:
                tids = [int(x) for x in os.listdir(f"/proc/{pid}/task")]
            except OSError:
                continue
            for tid in tids:
                try:
                    os.sched_setaffinity(tid, cpus)
                except OSError:
                    pass

    @staticmethod
    def threads_of(pids):
        """(processes, threads) of a running proxy, from /proc: shows the workers really run."""
        n = 0
        for pid in pids:
            try:
                n += len(os.listdir(f"/proc/{pid}/task"))
            except OSError:
                pass
        return len(pids), n

    def m6_scale(self):
        """Two workers per proxy, nothing pinned: 1 KiB keep-alive at saturation, wrk -t2, many connections.
        On a 2-core machine the proxy shares both cores with wrk and the origin."""
        key = "scale_1k"
        every = ",".join(str(c) for c in self.a.all_cpus)
        w = SCALE_WORKERS
        names = ["direct"]
        if DM in self.a.targets:
            n = SCALE[DM]
            if self.a.datamode_unavailable or not self.a.proxy_bin:
                t = Target(n, f"datamode-proxy threads: {w}")
                t.reason = self.a.datamode_unavailable or "no binary"
                self.targets[n] = t
            else:
                self.start_datamode(n, f"datamode-proxy threads: {w}", threads=w, cpu=every)
            names.append(n)
        if "haproxy" in self.a.targets:
            self.start_haproxy(SCALE["haproxy"], f"HAProxy nbthread {w}", threads=w, cpu=every)
            names.append(SCALE["haproxy"])
        if "nginx" in self.a.targets:
            self.start_nginx(SCALE["nginx"], SCALE["nginx"], f"nginx worker_processes {w}", workers=w, cpu=every)
            names.append(SCALE["nginx"])
        path = "/1k.bin"
        absolute = f"http://{self.origin_hostport()}{path}"
        conns = self.a.scale_connections

        def args_for(t):
            return [path] if t.is_direct else [absolute, self.origin_hostport()]

        def run(t, duration):
            return self.measure_wrk(t, "absolute.lua", args_for(t), duration, connections=conns, threads=w, cpu=every)

        def warm(t):
            if self.a.warmup > 0 and t.available:
                run(t, self.a.warmup)

        info = {"workers": w, "connections": conns, "wrk_threads": w, "cpus": every, "instances": {}}
        for n in names:
            t = self.targets[n]
            info["instances"][n] = {"label": t.label, "available": t.available, "reason": t.reason, "port": t.port}
            if t.available and not t.is_direct:
                procs_n, threads_n = self.threads_of(t.pids())
                info["instances"][n].update(processes=procs_n, threads=threads_n)
        self.set_origin_cpus(set(self.a.all_cpus))
        log(f"m6-scale: {w} workers per proxy on CPUs {every}, origin and wrk -t{w} -c{conns} there too")
        try:
            res = self.interleaved("m6-scale", names, lambda t, r: run(t, self.a.duration), warm)
        finally:
            self.set_origin_cpus({self.a.client_cpu})
        for n in names[1:]:
            t = self.targets[n]
            if t.proc is not None and t.available and not t.alive():
                info["instances"][n]["reason"] = f"exited during the run (rc {t.proc.returncode})"
            if t.proc is not None:
                self.procs.stop(t.proc)
        res["info"] = info
        self.results["measurements"][key] = res

    # ------------------------------------------------------------ run

    def run(self):
        self.prepare()
        self.start_all()
        self.results["targets"] = {n: {"label": t.label, "available": t.available, "reason": t.reason,
                                       "port": t.port, "connect": t.connect, "connect_note": t.connect_note}
                                   for n, t in self.targets.items()}
        m = self.a.only
        if "small" in m:
            self.m1_small()
        if "policy" in m:
            self.m4_policy()
        if "scale" in m:
            self.m6_scale()
        if "download" in m:
            self.m2_download()
        if "connect" in m:
            self.m5_connect()
        if "idle" in m:
            self.m3_idle()
        if "https" in m:
            https.measure(self)
        if "shaping" in m and self.targets.get(DM) is not None and not self.a.datamode_unavailable and self.a.proxy_bin:
            import shaping
            self.results["measurements"]["shaping"] = shaping.measure(self)
        if "pageweight" in m:
            self.m7_pageweight()
        for name in SCRIPTS:
            if name in m:
                self.m_script(name)
        # was anything lost mid-run?
        for n, t in self.targets.items():
            if n in self.results["targets"] and t.available and not t.is_direct and not t.alive():
                self.results["targets"][n]["reason"] = f"exited during the run (rc {t.proc.returncode})"


def sh(argv):
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def environment(a):
    vers = {
        "wrk": sh(["sh", "-c", "wrk -v 2>&1 | head -1"]),
        "nginx": sh(["sh", "-c", "nginx -v 2>&1"]),
        "haproxy": sh(["sh", "-c", "haproxy -v | head -1"]),
        "squid": sh(["sh", "-c", "squid -v | head -1"]),
        "tinyproxy": sh(["tinyproxy", "-v"]),
        "curl": sh(["sh", "-c", "curl --version | head -1"]),
    }
    if "https" in a.only:
        vers["mitmproxy"] = sh(["sh", "-c", f"'{a.mitmdump}' --version 2>&1 | head -1"]) if a.mitmdump else "not installed"
        vers["openssl"] = sh(["openssl", "version"])
    if "fleet" in a.only:
        vers["redis"] = sh(["redis-server", "--version"])
    if a.proxy_bin:
        vers["datamode-proxy"] = sh([a.proxy_bin, "--version"]).splitlines()[0:1] or [""]
        vers["datamode-proxy"] = vers["datamode-proxy"][0]
    if a.baseline_bin:
        vers[BASE] = (sh([a.baseline_bin, "--version"]).splitlines()[0:1] or [""])[0]
    commit = sh(["git", "-C", REPO, "rev-parse", "HEAD"])
    dirty = sh(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)bench"])
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    cpu_model = ""
    with open("/proc/cpuinfo") as f:
        for ln in f:
            if ln.startswith("model name"):
                cpu_model = ln.split(":", 1)[1].strip()
                break
    return {"proxy_bin": a.proxy_bin, "commit": commit or "(no commit yet)", "dirty": bool(dirty), "versions": vers,
            "kernel": platform.release(), "cpus": os.cpu_count(), "cpu_model": cpu_model,
            "loadavg_at_start": load, "python": platform.python_version()}


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--proxy-bin", default="", help="datamode-proxy binary (empty: not available)")
    ap.add_argument("--baseline-bin", default="",
                    help="another datamode-proxy binary, measured beside --proxy-bin in the same run (rows 'datamode-baseline')")
    ap.add_argument("--datamode-unavailable", default="", help="why datamode-proxy is not available (build failed...)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=int, default=10, help="seconds per wrk run")
    ap.add_argument("--warmup", type=int, default=1, help="seconds of wrk warm-up per target before the rounds (0: none)")
    ap.add_argument("--connections", type=int, default=50)
    ap.add_argument("--steal-limit", type=float, default=10.0,
                    help="a measurement during which the hypervisor stole more than this %% of a core is taken again")
    ap.add_argument("--steal-retries", type=int, default=2, help="at most this many times (0: never)")
    ap.add_argument("--fixed-rate", type=int, default=20000,
                    help="requests/s of the 1 KiB fixed-rate latency row (lib/rateload.c; 0: not run)")
    ap.add_argument("--scale-connections", type=int, default=100,
                    help="wrk connections in the scale row (2 workers per proxy, wrk -t2, nothing pinned)")
    ap.add_argument("--downloads", type=int, default=3, help="100 MiB downloads per sample (one connection)")
    ap.add_argument("--idle-conns", type=int, default=5000)
    ap.add_argument("--targets", default=",".join([DM] + PEERS + ["mitmproxy"]),
                    help="comma list of proxies (direct is always run; squid also selects Squid ssl_bump in https)")
    ap.add_argument("--only", default=",".join(PLAIN + ["https", "shaping", "pageweight"] + SCRIPTS),
                    help="comma list of measurements (default, all of them: %(default)s)")
    ap.add_argument("--mitmdump", default="", help="mitmdump binary for the https measurement (empty: not available)")
    ap.add_argument("--tls-new-connections", type=int, default=10,
                    help="concurrent clients in the https new-connection run (one request per connection)")
    ap.add_argument("--shape-seconds", type=int, default=10, help="shaping: how long each download lasts at the profile's rate")
    ap.add_argument("--latency-samples", type=int, default=11, help="shaping: first-byte samples per profile")
    ap.add_argument("--shape-profiles", default="", help="shaping: comma list of profiles (default: all)")
    ap.add_argument("--proxy-cpu", type=int, default=1)
    ap.add_argument("--client-cpu", type=int, default=0)
    ap.add_argument("--out", default=os.path.join(BENCH, "results"))
    ap.add_argument("--stamp", default="")
    ap.add_argument("--workdir", default=os.path.join(BENCH, "work"))
    ap.add_argument("--command", default="", help="the command line to record in the report")
    a = ap.parse_args()
    a.targets = [x for x in a.targets.split(",") if x]
    a.only = [x for x in a.only.split(",") if x]
    a.rounds = max(1, a.rounds)
    if os.cpu_count() < 2:
        raise SystemExit("bench needs 2 cores: one for the proxy, one for client and origin")
    a.all_cpus = sorted(os.sched_getaffinity(0))  # before pinning ourselves: the scale row uses all of them
    os.sched_setaffinity(0, {a.client_cpu})
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(hard, 65536), max(hard, 65536)))
    except (ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    stamp = a.stamp = a.stamp or dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d-%H%M")

    b = Bench(a)

    def on_signal(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started with SIGINT ignored (cmd &)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)

    env = environment(a)
    # how busy is the machine before we start anything? (3 s of /proc/stat)
    b0, p0, w0 = system_cpu()[0], procs.all_process_ticks(), time.time()
    time.sleep(3)
    b1, p1, w1 = system_cpu()[0], procs.all_process_ticks(), time.time()
    env["background_cpu_pct_before"] = round(100 * (b1 - b0) / (w1 - w0), 1)
    env["background_top_before"] = procs.busiest_others(p0, p1, {os.getpid()}, w1 - w0)
    log(f"machine before start: {env['background_cpu_pct_before']:.0f}% of one core busy "
        f"({', '.join(f'{c} {v:.0f}%' for c, v in env['background_top_before'])})")
    t0 = time.time()
    interrupted = None
    try:
        b.run()
    except KeyboardInterrupt as e:
        interrupted = str(e) or "interrupted"
        log(f"interrupted ({interrupted}): stopping what was started")
    except Exception as e:  # noqa: BLE001 - still stop everything and write what was measured
        import traceback
        traceback.print_exc()
        interrupted = f"error: {type(e).__name__}: {e}"
        log(f"bench failed ({interrupted}): stopping what was started")
    finally:
        t_stop = time.time()
        signal.signal(signal.SIGINT, signal.SIG_IGN)   # a second Ctrl-C must not cut the clean-up short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        b.procs.stop_all()
        log(f"stopped everything the bench started in {time.time() - t_stop:.1f} s")
    elapsed = time.time() - t0
    res = b.results
    res.update(stamp=stamp, env=env, elapsed_s=elapsed, interrupted=interrupted,
               params={k: getattr(a, k) for k in ("rounds", "duration", "warmup", "connections", "downloads",
                                                    "idle_conns", "targets", "only", "proxy_cpu", "client_cpu",
                                                    "scale_connections", "all_cpus", "tls_new_connections", "shape_seconds", "latency_samples", "fixed_rate",
                                                    "steal_limit", "steal_retries")},
               command=a.command or " ".join(sys.argv), finished=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))
    os.makedirs(a.out, exist_ok=True)
    base = os.path.join(a.out, stamp)
    with open(base + ".json", "w") as f:
        json.dump(res, f, indent=1, sort_keys=True)
    import report
    png_ok = False
    try:
        import chart
        chart.draw(res, base + ".png")
        png_ok = True
    except Exception as e:  # noqa: BLE001 - the table still gets written
        log(f"chart failed: {type(e).__name__}: {e}")
    with open(base + ".md", "w") as f:
        f.write(report.markdown(res, os.path.basename(base) + ".png" if png_ok else None))
    log(f"wrote {base}.md, {base}.json" + (f", {base}.png" if png_ok else "") + f" in {elapsed / 60:.1f} min")
    print(base + ".md")
    if interrupted:
        sys.exit(130 if not interrupted.startswith("error") else 1)


if __name__ == "__main__":
    main()
