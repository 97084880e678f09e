#!/usr/bin/env python3
"""Instructions per request of two datamode-proxy binaries, side by side, counted by callgrind.

Wall-clock rows (bench/run) need a quiet machine; instruction counts do not: valgrind's callgrind counts the same
total for the same binary and inputs whatever else the machine is doing. That makes this the A/B for refactors
("behaviour and cost unchanged") on a shared two-core machine. It is a complement to bench/run, not a peer
comparison: instructions are not time (cache misses and syscalls are not in them).

For each binary and each row: the proxy runs under callgrind with one worker thread and instrumentation off; a local
origin answers; instrumentation is switched on (callgrind_control -i) for exactly the N requests of one keep-alive client,
so start-up and shutdown are not counted. Timers that fire during the run (the control tick, the deferred-delivery
pass on the store's SQLite) are, ~8K instructions a request under valgrind's slowdown and varying by ~1% between runs
of one binary: the rows run twice per binary, interleaved, and both figures are shown, with the worker thread's
own count beside them (`--separate-threads=yes`; the thread that ran the most), which the timers of other threads
do not touch.
Valgrind cannot read the debug info of the release build, so the binaries are stripped copies.

    bench/instructions.py BEFORE_BIN AFTER_BIN [--requests 2000] [--haproxy] [--out bench/results/STAMP-instructions.md]
                          [--profiles DIR] [--rows no-mode,refusal] [--cache-sim] [--nginx]

`--profiles DIR` keeps each run's callgrind profile in DIR (named by row, binary and run), with the binaries' symbol
tables kept (only their debug info is stripped), for `callgrind_annotate --inclusive=yes DIR/FILE`: where a row's
instructions go, by function.

`--rows` runs only the rows whose name contains one of the given words (a full A/B is three rows × two binaries × two
runs, about 12 minutes; one row is a third of that). `--runs 1` halves it: the worker thread's count of one binary
repeats within a few instructions, so one run each is enough for a quick A/B (two keep the timers' spread visible).

`--cache-sim` has callgrind simulate the caches and the branch predictor too (about twice as slow) and adds a table:
the worker thread's I1, D1 and last-level misses and mispredicted branches a request, each run on its own line.

`--haproxy` adds HAProxy (the bench's configuration, one thread) on the small GET: the same client, request and
origin, so the figure is a peer's count beside ours (its column is "before"; it has no "after"). `--nginx` adds nginx
the same way (the bench's proxy configuration, its one worker run as the only process).
"""
import argparse
import glob
import http.server
import os
import re
import shutil
import signal
import socket
import socketserver
import subprocess
import sys
import tempfile
import threading
import time

ROWS = {
    # name: (mode, config, request path)
    "small GET, no mode": ("normal", "", "/small"),
    "small GET, constrained, rules": ("constrained", """
rules:
  - {name: videos, match: {path: "*.mp4"}, tags: {allow-constrained: false}}
  - {name: api, match: {host: "api.*"}, tags: {allow-expensive: false}}
variants:
  - {id: hero, match: "http://127.0.0.1:*/img/*.jpg", target: "http://127.0.0.1:$1/img/$2@small.jpg"}
""", "/small"),
    "refusal (403 constrained)": ("constrained", """
rules:
  - {name: videos, match: {path: "*.mp4"}, tags: {allow-constrained: false}}
""", "/movie.mp4"),
}


class Origin(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    body = b"x" * 1024

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def receive(sock):
    """The next bytes; an end of stream before the answer is whole stops the run (it looped forever)."""
    data = sock.recv(65536)
    if not data:
        raise SystemExit("the proxy closed the connection before its answer was whole")
    return data


def run_client(port, origin_port, path, n):
    """n requests on one keep-alive connection; returns the statuses seen."""
    statuses = []
    with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
        buffer = b""
        for _ in range(n):
            sock.sendall(b"GET http://127.0.0.1:%d%s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n"
                         % (origin_port, path.encode(), origin_port))
            while b"\r\n\r\n" not in buffer:
                buffer += receive(sock)
            head, buffer = buffer.split(b"\r\n\r\n", 1)
            length = int(re.search(rb"(?i)content-length:\s*(\d+)", head).group(1))
            while len(buffer) < length:
                buffer += receive(sock)
            buffer = buffer[length:]
            statuses.append(int(head.split(b" ", 2)[1]))
    return statuses


# `--cache-sim`: callgrind also simulates the caches (the host's sizes, as valgrind reads them from CPUID) and the
# branch predictor. Simulated, not measured (this machine's virtual CPU exposes no counters), but the same model for
# both programs: where two programs run about the same instructions in different times, it says whether misses differ.
SIMULATE = False
MISSES = {"I1 misses": ("I1mr",), "LL instruction misses": ("ILmr",), "D1 misses": ("D1mr", "D1mw"),
          "LL data misses": ("DLmr", "DLmw"), "mispredicted branches": ("Bcm", "Bim")}


def counted(argv, port, path, n, origin_port, workdir, keep=None):
    """Instructions the program `argv` (listening on `port`) executed while it answered n requests of one keep-alive
    client, the statuses it answered, its reference-counting calls, and the worker thread's events (`thread_events`:
    its instructions, `Ir`, and with `--cache-sim` its misses)."""
    out = os.path.join(workdir, "callgrind.out")
    for stale in glob.glob(out + "*"):
        os.remove(stale)
    simulate = ["--cache-sim=yes", "--branch-sim=yes"] if SIMULATE else []
    proxy = subprocess.Popen(["valgrind", "--tool=callgrind", "--instr-atstart=no", "--separate-threads=yes",
                              "--callgrind-out-file=" + out] + simulate
                             + argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.time() > deadline or proxy.poll() is not None:
                raise SystemExit("%s did not start: %s" % (argv[0], proxy.stderr.read().decode()[-2000:]))
            time.sleep(0.2)
    run_client(port, origin_port, path, 20)  # warm: the first requests connect upstream and fill caches
    subprocess.run(["callgrind_control", "-i", "on", str(proxy.pid)], check=True, stdout=subprocess.DEVNULL)
    statuses = run_client(port, origin_port, path, n)
    subprocess.run(["callgrind_control", "-i", "off", str(proxy.pid)], check=True, stdout=subprocess.DEVNULL)
    proxy.send_signal(signal.SIGTERM)
    _, err = proxy.communicate(timeout=300)
    total = None
    for line in err.decode().splitlines():
        m = re.search(r"Collected : (\d+)", line)
        if m:
            total = int(m.group(1))
    if total is None:
        raise SystemExit("no callgrind total: " + err.decode()[-2000:])
    files = sorted(glob.glob(out + "-*")) or [out]
    counting = sum(reference_counting(f) for f in files)
    # The thread that answered: the one that ran the most (the store, delivery and control threads run timers only).
    worker_events, worker_file = max(((thread_events(f), f) for f in files), key=lambda pair: pair[0].get("Ir", 0))
    if keep:
        shutil.copy(worker_file, keep)
    return total, statuses, counting, worker_events


def thread_events(path):
    """What one thread's profile (`--separate-threads=yes`) counted, by event (`Ir`, and with `--cache-sim` the
    misses): its `events:` names over its `totals:` or `summary:` line."""
    names, found = ["Ir"], {}
    with open(path, errors="replace") as f:
        for line in f:
            if line.startswith("events:"):
                names = line.split()[1:]
            if line.startswith(("totals:", "summary:")):
                found[line.split(":")[0]] = dict(zip(names, map(int, line.split()[1:])))
    return found.get("totals", found.get("summary", {}))


def misses_cells(events, n):
    """`MISSES` a request, from one worker thread's events."""
    return " | ".join("%.1f" % (sum(events.get(e, 0) for e in names) / n) for names in MISSES.values())


# Swift's reference counting: each call is an atomic read-modify-write (a locked instruction, ~20 cycles) that the
# instruction count shows as one instruction among thousands. A retain or release of an immortal object (an empty
# array, a static one) is a call but no write; those are counted too.
COUNTING = {"swift_retain", "swift_release", "swift_retain_n", "swift_release_n", "swift_unownedRetainStrong",
            "swift_unownedRelease", "swift_unownedRetain"}


def reference_counting(path):
    """Calls to Swift's reference-counting entry points in one callgrind profile file (one thread's, with
    `--separate-threads=yes`; every caller, the runtime's own calls included): `calls=` lines under a `cfn=` naming
    one of `COUNTING`. Names are compressed per file, so each file is read on its own."""
    names, total, counting = {}, 0, False
    if not os.path.exists(path):
        return 0
    with open(path, errors="replace") as f:
        for line in f:
            if line.startswith("fn="):
                counting = False
            if line.startswith(("fn=", "cfn=")):
                m = re.match(r"c?fn=\((\d+)\)(?: (.*))?", line.rstrip("\n"))
                if m and m.group(2):
                    names[m.group(1)] = m.group(2)
                if line.startswith("cfn="):
                    counting = bool(m) and names.get(m.group(1), "") in COUNTING
                continue
            if line.startswith("calls=") and counting:
                total += int(line.split("=", 1)[1].split()[0])
    return total


def instructions(binary, mode, config, path, n, origin_port, workdir, keep=None):
    """datamode-proxy `binary`, one worker, with `config` added, in `mode`: see `counted`."""
    port, admin = free_port(), free_port()
    config_path = os.path.join(workdir, "config.yaml")
    with open(config_path, "w") as f:
        f.write("listen: 127.0.0.1:%d\nadmin: {listen: 127.0.0.1:%d}\nlog: {access: \"off\"}\n%s"
                % (port, admin, config))
    state = tempfile.mkdtemp(dir=workdir)
    argv = [binary, "run", "--config", config_path, "--mode", mode, "--state-dir", state, "--threads", "1"]
    return counted(argv, port, path, n, origin_port, workdir, keep)


def peer_config(template, name, values, workdir, edit=lambda text: text):
    """The bench's configuration `conf/<template>` for a peer, its `@KEY@`s filled from `values` (and `WORK`, `NAME`),
    after `edit`, written into `workdir`: its path."""
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "conf", template)) as f:
        config = edit(f.read())
    for key, value in dict(values, WORK=workdir, NAME=name).items():
        config = config.replace("@%s@" % key, str(value))
    config_path = os.path.join(workdir, name + ".conf")
    with open(config_path, "w") as f:
        f.write(config)
    return config_path


def haproxy_instructions(path, n, origin_port, workdir):
    """HAProxy with the bench's own configuration (`conf/haproxy.cfg.tmpl`, one thread): see `counted`. It relays
    the same absolute-form request to the same origin, so the row says what a peer spends where we spend ours."""
    port = free_port()
    config_path = peer_config("haproxy.cfg.tmpl", "haproxy", {"THREADS": 1, "MAXCONN": 1000, "PORT": port,
                                                              "ORIGIN_PORT": origin_port}, workdir)
    return counted(["haproxy", "-db", "-f", config_path], port, path, n, origin_port, workdir)


def nginx_instructions(path, n, origin_port, workdir):
    """nginx with the bench's own proxy configuration (`conf/nginx-proxy.conf.tmpl`, one worker), run as that one
    process (`master_process off`): see `counted`, and `haproxy_instructions`."""
    port = free_port()
    os.makedirs(os.path.join(workdir, "nginx-proxy-tmp"), exist_ok=True)
    config_path = peer_config("nginx-proxy.conf.tmpl", "nginx-proxy",
                              {"WORKERS": 1, "NOFILE": 4096, "WORKER_CONNECTIONS": 1000, "PORT": port,
                               "ORIGIN_PORT": origin_port}, workdir,
                              edit=lambda text: text.replace("master_process on;", "master_process off;"))
    return counted(["nginx", "-p", workdir, "-c", config_path], port, path, n, origin_port, workdir)


def stripped(binary, workdir, name, keep_symbols=False):
    copy = os.path.join(workdir, name)
    subprocess.run(["strip"] + (["--strip-debug"] if keep_symbols else []) + ["-o", copy, binary], check=True)
    return copy


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=2,
                        help="runs per binary, interleaved (the worker thread's count is the same within a few "
                             "instructions from run to run: one run is enough for a quick A/B)")
    parser.add_argument("--out")
    parser.add_argument("--profiles", help="keep each run's callgrind profile here, with symbols")
    parser.add_argument("--rows", help="only the rows whose name contains one of these comma-separated words "
                        "(%s)" % "; ".join(ROWS))
    parser.add_argument("--cache-sim", action="store_true",
                        help="also simulate caches and branches: misses a request of the worker thread, in a second table")
    parser.add_argument("--nginx", action="store_true",
                        help="also count nginx (the bench's proxy configuration) on the small GET, as a peer's figure")
    parser.add_argument("--haproxy", action="store_true",
                        help="also count HAProxy (the bench's configuration) on the small GET, as a peer's figure")
    args = parser.parse_args()
    global SIMULATE
    SIMULATE = args.cache_sim
    rows = ROWS
    if args.rows:
        def slug(text):
            return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
        words = [slug(w) for w in args.rows.split(",") if slug(w)]
        rows = {name: row for name, row in ROWS.items() if any(w in slug(name) for w in words)}
        if not rows:
            parser.error("--rows %s names no row; the rows are: %s" % (args.rows, "; ".join(ROWS)))

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Origin)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    origin_port = server.server_address[1]

    run_count = "%d run%s" % (args.runs, "" if args.runs == 1 else "s")
    lines = [("| row | before (instr./request, %s) | after (%s) | after / before (means) " % (run_count, run_count))
             + "| worker thread only: before / after (means) | ratio | reference counting, calls/request (before / after) "
             "| statuses |",
             "|---|---|---|---|---|---|---|---|"]
    simulated = ["| row, binary, run | instructions | " + " | ".join(MISSES) + " |",
                 "|---|---:|" + "---:|" * len(MISSES)]
    with tempfile.TemporaryDirectory() as workdir:
        keep_symbols = args.profiles is not None
        if keep_symbols:
            os.makedirs(args.profiles, exist_ok=True)
        binaries = [stripped(args.before, workdir, "before", keep_symbols),
                    stripped(args.after, workdir, "after", keep_symbols)]
        for row, (mode, config, path) in rows.items():
            per, counts, workers = [[], []], [[], []], [[], []]
            seen = set()
            for run in range(args.runs):
                for index, binary in enumerate(binaries):
                    keep = None
                    if args.profiles:
                        keep = os.path.join(args.profiles, "%s-%s-%d.out" % (
                            re.sub(r"[^a-z0-9]+", "-", row.lower()).strip("-"), ("before", "after")[index], run + 1))
                    total, statuses, counting, events = instructions(binary, mode, config, path, args.requests,
                                                                     origin_port, workdir, keep)
                    worker = events.get("Ir", 0)
                    simulated.append("| %s, %s, %d | %.0f | %s |" % (
                        row, ("before", "after")[index], run + 1, worker / args.requests,
                        misses_cells(events, args.requests)))
                    per[index].append(total / args.requests)
                    workers[index].append(worker / args.requests)
                    counts[index].append(counting / args.requests)
                    seen.update(statuses)
            means = [sum(p) / len(p) for p in per]
            worker_means = [sum(w) / len(w) for w in workers]
            lines.append("| %s | %s | %s | %.3f | %.0f / %.0f | %.3f | %.1f / %.1f | %s |" % (
                row, " / ".join("%.0f" % v for v in per[0]), " / ".join("%.0f" % v for v in per[1]),
                means[1] / means[0], worker_means[0], worker_means[1], worker_means[1] / worker_means[0],
                sum(counts[0]) / args.runs, sum(counts[1]) / args.runs, ", ".join(map(str, sorted(seen)))))
            print(lines[-1], flush=True)
        peers = [("HAProxy", "haproxy", "conf/haproxy.cfg.tmpl", haproxy_instructions)] if args.haproxy else []
        if args.nginx:
            peers.append(("nginx", "nginx", "conf/nginx-proxy.conf.tmpl", nginx_instructions))
        for name, program, template, count in peers:
            if not shutil.which(program):
                lines.append("| small GET, no mode: %s | not installed | | | | | | |" % name)
                continue
            runs = []
            for run in range(args.runs):
                runs.append(count(ROWS["small GET, no mode"][2], args.requests, origin_port, workdir))
                events = runs[-1][3]
                simulated.append("| small GET, no mode, %s, %d | %.0f | %s |" % (
                    name, run + 1, events.get("Ir", 0) / args.requests, misses_cells(events, args.requests)))
            lines.append("| small GET, no mode: %s (peer, `%s`) | %s | | | %s | | (C: none) | %s |" % (
                name, template, " / ".join("%.0f" % (total / args.requests) for total, _, _, _ in runs),
                " / ".join("%.0f" % (events.get("Ir", 0) / args.requests) for _, _, _, events in runs),
                ", ".join(map(str, sorted({code for _, statuses, _, _ in runs for code in statuses})))))
            print(lines[-1], flush=True)
    text = "\n".join([
        "# Instructions per request: before vs after",
        "",
        "Command: `bench/instructions.py %s %s --requests %d%s%s%s%s` (callgrind, one worker thread, one keep-alive client, "
        "1 KiB origin answers, instrumented for the N requests only; %s per binary, interleaved)." % (
            args.before, args.after, args.requests, " --runs %d" % args.runs if args.runs != 2 else "",
            " --rows " + args.rows if args.rows else "",
            (" --haproxy" if args.haproxy else "") + (" --nginx" if args.nginx else ""), " --cache-sim" if args.cache_sim else "", run_count),
        "",
    ] + lines + ([
        "",
        "Simulated caches and branch predictor (`--cache-sim`), the worker thread, a request:",
        "",
    ] + simulated if args.cache_sim else []) + [""])
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(text)


if __name__ == "__main__":
    sys.exit(main())
