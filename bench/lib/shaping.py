"""Link shaping (SPEC §10): achieved rate and added latency against each profile, and the CPU cost of shaping.

One datamode-proxy (one worker, `shaping-scope: link`, mode constrained) whose profile is switched through the
admin API (`PUT /conditions`) for each profile in turn: the eight built-ins plus `bench-64k` (64 kbit/s, the low
end of the ±5% target) and `bench-1g` (1 Gbit/s, the high end), both without latency.

Per profile:
- single: one download sized to last `--shape-seconds` at the profile's down rate; achieved rate = body bytes /
  (time_total - time_starttransfer), i.e. the body phase, after the latency.
- parallel: 10 downloads at once (link scope: they share one bucket), each a tenth of that; achieved rate = all
  body bytes / (last body end - first body start).
- latency: p50 of time_starttransfer of a 1 KiB GET with the profile minus p50 without one, against the
  profile's latency (target ±5 ms).
CPU: 100 MiB downloads with `bench-1g` against the same instance without a profile (which splices): proxy CPU
s/GB of each, in `--rounds` interleaved rounds, median (min–max).
"""
import json
import os
import statistics
import subprocess
import time
import urllib.request

BUILT_IN = [  # name, down bit/s, latency ms (config/datamode.yaml)
    ("devtools-3g", 400_000, 2000), ("devtools-slow-4g", 1_440_000, 562.5), ("devtools-fast-4g", 8_100_000, 165),
    ("nlc-3g", 780_000, 200), ("nlc-dsl", 2_000_000, 10), ("nlc-lte", 50_000_000, 115),
    ("nlc-very-bad-network", 1_000_000, 1000), ("geo-satellite", 12_000_000, 600),
]
EXTRA = [("bench-64k", 64_000, 0), ("bench-1g", 1_000_000_000, 0)]
PROFILES = sorted(BUILT_IN + EXTRA, key=lambda p: p[1])
EXTRA_YAML = """
mode: constrained
shaping-scope: link
profiles:
  bench-64k: {down: 64kbit, up: 64kbit, latency: 0}
  bench-1g: {down: 1Gbit, up: 1Gbit, latency: 0}
"""
CHUNK = 100 * 1024 * 1024  # the 100m.bin the bench already serves


def admin(port, method, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method,
                                 headers={"Content-Type": "application/json"} if data else {})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read() or b"null")


def file_of(bench, size):
    """A docroot path of exactly `size` bytes (created once)."""
    name = f"shape-{size}.bin"
    path = os.path.join(bench.work, "docroot", name)
    if not os.path.exists(path):
        block = os.urandom(1 << 20)
        with open(path, "wb") as f:
            left = size
            while left > 0:
                f.write(block[:min(left, len(block))])
                left -= min(left, len(block))
    return "/" + name


def urls_for(bench, size):
    """URLs whose bodies add up to about `size`: one file, or several 100 MiB downloads on one connection."""
    base = f"http://{bench.origin_hostport()}"
    if size <= CHUNK:
        return [base + file_of(bench, size)]
    return [base + "/100m.bin"] * max(1, round(size / CHUNK))


def curl(bench, proxy_port, urls, timeout):
    argv = ["taskset", "-c", str(bench.a.client_cpu), "curl", "-s", "-x", f"http://127.0.0.1:{proxy_port}",
            "-w", "%{http_code} %{size_download} %{time_starttransfer} %{time_total}\\n"]
    for u in urls:
        argv += ["-o", "/dev/null", u]
    return argv


def parse(text):
    rows = []
    for ln in text.splitlines():
        p = ln.split()
        if len(p) == 4 and p[0] == "200":
            rows.append((int(p[1]), float(p[2]), float(p[3])))
    return rows


def single(bench, t, rate, seconds):
    size = max(16_000, int(rate / 8 * seconds))
    urls = urls_for(bench, size)
    text, _, rc = bench.run_client(curl(bench, t.port, urls, 0)[3:], timeout=seconds * 4 + 60)
    rows = parse(text)
    if len(rows) != len(urls):
        return {"ok": False, "reason": f"curl rc={rc}: {text.strip()[-160:]}"}
    nbytes = sum(r[0] for r in rows)
    body = sum(r[2] - r[1] for r in rows)
    achieved = nbytes * 8 / body if body > 0 else None
    return {"ok": True, "bytes": nbytes, "body_s": body, "achieved_bps": achieved,
            "ratio": achieved / rate if achieved else None}


def parallel(bench, t, rate, seconds, n=10):
    size = max(16_000, int(rate / 8 * seconds / n))
    urls = urls_for(bench, size)
    procs = []
    for _ in range(n):
        launched = time.time()
        p = subprocess.Popen(curl(bench, t.port, urls, 0), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             start_new_session=True)
        bench.procs.started.append(("client", p))
        procs.append((launched, p))
    starts, ends, nbytes, failed = [], [], 0, 0
    for launched, p in procs:
        try:
            out, _ = p.communicate(timeout=seconds * 4 + 60)
        except subprocess.TimeoutExpired:
            bench.procs.stop(p)
            out = b""
        bench.procs.started.remove(("client", p))
        rows = parse(out.decode("utf-8", "replace"))
        if len(rows) != len(urls):
            failed += 1
            continue
        starts.append(launched + rows[0][1])
        ends.append(launched + sum(r[2] for r in rows))
        nbytes += sum(r[0] for r in rows)
    if failed or not starts:
        return {"ok": False, "reason": f"{failed} of {n} downloads failed"}
    window = max(ends) - min(starts)
    achieved = nbytes * 8 / window if window > 0 else None
    return {"ok": True, "bytes": nbytes, "window_s": window, "achieved_bps": achieved,
            "ratio": achieved / rate if achieved else None}


def spread(rec, key, spec):
    """`median (min–max)` of a CPU row's rounds; a single value for a file written before rounds were kept."""
    value, span = rec.get(key), rec.get(key + "_range")
    if value is None:
        return "—"
    if not span or span[0] == span[1]:
        return spec.format(value)
    return f"{spec.format(value)} ({spec.format(span[0])}–{spec.format(span[1])})"


def first_byte_p50(bench, t, samples):
    url = f"http://{bench.origin_hostport()}/1k.bin"
    text, _, _ = bench.run_client(curl(bench, t.port, [url] * samples, 0)[3:], timeout=samples * 5 + 30)
    rows = parse(text)
    return statistics.median(r[1] for r in rows) * 1000 if rows else None


def measure(bench):
    t = bench.start_datamode("datamode-shaping", "datamode-proxy (shaping)", extra_yaml=lambda base: base + EXTRA_YAML)
    out = {"profiles": [], "seconds": bench.a.shape_seconds, "downloads": bench.a.downloads}
    if not t.available:
        out["reason"] = t.reason
        return out
    seconds = bench.a.shape_seconds
    samples = bench.a.latency_samples
    admin(t.admin_port, "DELETE", "/conditions")
    baseline = first_byte_p50(bench, t, samples)
    out["baseline_first_byte_ms"] = baseline
    only = set(bench.a.shape_profiles.split(",")) if bench.a.shape_profiles else None
    for name, rate, latency in PROFILES:
        if only and name not in only:
            continue
        admin(t.admin_port, "PUT", "/conditions", {"profile": name})
        rec = {"profile": name, "down_bps": rate, "latency_ms": latency}
        rec["single"] = single(bench, t, rate, seconds)
        rec["parallel"] = parallel(bench, t, rate, seconds)
        p50 = first_byte_p50(bench, t, samples)
        rec["added_latency_ms"] = (p50 - baseline) if (p50 is not None and baseline is not None) else None
        out["profiles"].append(rec)
        s, p = rec["single"], rec["parallel"]
        bench.log_line(f"shaping {name}: single {fmt_ratio(s)}, 10 parallel {fmt_ratio(p)}, "
                       f"latency +{rec['added_latency_ms'] or 0:.1f} ms (profile {latency} ms)")
    # CPU of shaping at 1 Gbit/s against the unshaped (spliced) path, same instance, in interleaved rounds (one
    # sample read 0.70 s/GB in 2026-12-02-0311 where three runs on the same binary read 0.35-0.48 minutes later).
    cpu = {"unshaped": {"rounds": []}, "bench-1g": {"rounds": []}}
    for _ in range(max(1, bench.a.rounds)):
        for label, profile in (("unshaped", None), ("bench-1g", "bench-1g")):
            if profile:
                admin(t.admin_port, "PUT", "/conditions", {"profile": profile})
            else:
                admin(t.admin_port, "DELETE", "/conditions")
            rec = bench.measure_download(t, False, bench.a.downloads)
            cpu[label]["rounds"].append(rec)
            bench.log_line(f"shaping cpu {label}: {rec.get('mb_s') or 0:.0f} MB/s, "
                           f"{rec.get('cpu_s_per_gb') or 0:.2f} CPU s/GB")
    for block in cpu.values():
        for key in ("mb_s", "cpu_s_per_gb"):
            values = [r[key] for r in block["rounds"] if r.get(key) is not None]
            block[key] = statistics.median(values) if values else None
            block[key + "_range"] = [min(values), max(values)] if values else None
    out["cpu"] = cpu
    admin(t.admin_port, "DELETE", "/conditions")
    bench.procs.stop(t.proc)
    return out


def fmt_ratio(rec):
    if not rec.get("ok"):
        return "failed (" + rec.get("reason", "?") + ")"
    return f"{rec['achieved_bps'] / 1e6:.3f} Mbit/s ({(rec['ratio'] - 1) * 100:+.1f}%)"


def section(res):
    block = res.get("measurements", {}).get("shaping")
    if not block:
        return ""
    lines = ["## 8. Link shaping (SPEC §10)", ""]
    if block.get("reason"):
        return "\n".join(lines + [f"not available: {block['reason']}", ""])
    lines += [f"One worker, `shaping-scope: link`, profile switched with `PUT /conditions`; downloads sized to last "
              f"{block['seconds']} s at the profile's rate; target ±5% (64 kbit/s to 1 Gbit/s) and ±5 ms of latency "
              f"at p50 (baseline first byte without a profile: {block.get('baseline_first_byte_ms') or 0:.2f} ms).", "",
              "| profile | down | single download | 10 parallel (link) | added latency p50 | profile latency |",
              "|---|---:|---:|---:|---:|---:|"]
    for rec in block["profiles"]:
        lat = rec.get("added_latency_ms")
        lines.append(f"| `{rec['profile']}` | {rec['down_bps'] / 1e6:g} Mbit/s | {fmt_ratio(rec['single'])} | "
                     f"{fmt_ratio(rec['parallel'])} | {'—' if lat is None else f'{lat:.1f} ms'} | {rec['latency_ms']} ms |")
    cpu = block.get("cpu", {})
    if cpu:
        lines += ["", "| 100 MiB download | MB/s | proxy CPU s/GB |", "|---|---:|---:|"]
        for label in ("unshaped", "bench-1g"):
            r = cpu.get(label, {})
            lines.append(f"| {label} | {spread(r, 'mb_s', '{:.0f}')} | {spread(r, 'cpu_s_per_gb', '{:.2f}')} |")
        rounds = len(cpu.get("bench-1g", {}).get("rounds", [])) or 1
        lines += ["", f"Median (min–max) over {rounds} interleaved rounds of {block.get('downloads', 3)} downloads each."]
    return "\n".join(lines) + "\n"
