"""Markdown report from the bench's results dict (see bench.py)."""
import statistics

ORDER = ["direct", "datamode-proxy", "datamode-baseline", "haproxy", "nginx", "squid", "tinyproxy"]
NAMES = {"direct": "direct (wrk → origin)", "datamode-proxy": "**datamode-proxy**",
         "datamode-baseline": "datamode-proxy baseline (`--baseline-bin`)", "haproxy": "HAProxy",
         "nginx": "nginx", "squid": "Squid", "tinyproxy": "tinyproxy",
         "datamode-constrained": "**datamode-proxy** constrained, 1,000 rules + 10,000 variants",
         "datamode-proxy-threads2": "**datamode-proxy** `threads: 2`", "haproxy-nbthread2": "HAProxy `nbthread 2`",
         "nginx-workers2": "nginx `worker_processes 2`",
         "datamode-sessions": "**datamode-proxy** 1,000 constrained sessions, 1,000 rules + 10,000 variants"}

SCALE_ORDER = ["direct", "datamode-proxy-threads2", "haproxy-nbthread2", "nginx-workers2"]
STEAL_NOTE_PCT = 5   # steal shown in the other-CPU cell from this much on
BUSY_PCT = 10.0  # other CPU above this (% of one core) marks a measurement as noisy


def ok_records(recs):
    return [r for r in recs if isinstance(r, dict) and r.get("available") and not r.get("failed")]


def stat(recs, key):
    vals = [r[key] for r in recs if r.get(key) is not None]
    if not vals:
        return None
    return statistics.median(vals), min(vals), max(vals)


def fmt(s, spec="{:,.0f}", rng=True):
    if s is None:
        return "—"
    med, lo, hi = s
    out = spec.format(med)
    if rng and (lo != hi):
        out += f" ({spec.format(lo)}–{spec.format(hi)})"
    return out


def fmt_small(s, digits):
    return fmt(s, "{:,.%df}" % digits)


def reason_of(recs, target_info):
    for r in recs:
        if isinstance(r, dict) and r.get("reason"):
            return r["reason"]
    return (target_info or {}).get("reason", "")


def unavailable(recs):
    return not ok_records(recs)


def other_cell(recs):
    s = stat(ok_records(recs), "other_pct")
    if s is None:
        return "—"
    med, lo, hi = s
    steal = stat(ok_records(recs), "steal_pct")
    stolen = steal is not None and steal[2] >= STEAL_NOTE_PCT
    flag = " ⚠" if hi > BUSY_PCT or (steal is not None and steal[2] > BUSY_PCT) else ""
    return f"{med:.0f} (max {hi:.0f}{f'; steal max {steal[2]:.0f}' if stolen else ''}){flag}"


def targets_in(block):
    names = [n for n in ORDER if n in block]
    return names + [n for n in block if n not in names and n != "info"]


def label(name):
    return NAMES.get(name, name)


def per_target_table(res, key, header, cells):
    """A table with a row per target of measurement `key`: `header` its column names after the first; `cells(recs,
    ok)` a row's cells from the target's records and the successful ones. Unavailable targets say why."""
    block = res["measurements"].get(key)
    if not block:
        return "_not run_\n"
    tinfo = res.get("targets", {})
    lines = ["| | " + " | ".join(header) + " |", "|---|" + "---:|" * len(header)]
    for n in targets_in(block):
        recs = block[n]
        if unavailable(recs):
            lines.append(f"| {label(n)} | not available: {reason_of(recs, tinfo.get(n))} |" + " |" * (len(header) - 1))
            continue
        lines.append(f"| {label(n)} | " + " | ".join(cells(recs, ok_records(recs))) + " |")
    return "\n".join(lines) + "\n"


def small_table(res, key):
    def cells(recs, ok):
        errs = sum(r.get("errors", 0) for r in ok)
        reads = sum(r.get("errors_detail", {}).get("read", 0) for r in ok)
        reqs = sum(r.get("requests", 0) for r in ok)
        err_cell = f"{errs:,}"
        if errs and reads == errs and reads >= 0.5 * reqs:
            err_cell += " (reads: closes after every response, no keep-alive)"
        return [fmt(stat(ok, 'rps')), fmt_small(stat(ok, 'p50_ms'), 2), fmt_small(stat(ok, 'p99_ms'), 2),
                fmt_small(stat(ok, 'cpu_us_per_req'), 1), fmt_small(stat(ok, 'kernel_us_per_req'), 1), err_cell,
                other_cell(recs)]
    return per_target_table(res, key, ["requests/s", "p50 ms", "p99 ms", "proxy CPU µs/request", "of which kernel",
                                       "errors", "other CPU % of a core"], cells)


def rate_table(res, key):
    """The fixed-rate 1 KiB row (lib/rateload.c): latency percentiles at the same request rate through each proxy."""
    def cells(recs, ok):
        return [fmt_small(stat(ok, k), 2) for k in ("p50_ms", "p90_ms", "p99_ms", "p999_ms", "max_ms")] + [
            fmt_small(stat(ok, 'cpu_us_per_req'), 1), f"{sum(r.get('errors', 0) for r in ok):,}", other_cell(recs)]
    return per_target_table(res, key, ["p50 ms", "p90 ms", "p99 ms", "p99.9 ms", "max ms", "proxy CPU µs/request",
                                       "errors", "other CPU % of a core"], cells)


def direct_mb_s(block):
    s = stat(ok_records(block.get("direct", [])), "mb_s")
    return s[0] if s else None


def download_table(res, key, na_col=False):
    block = res["measurements"].get(key)
    if not block:
        return "_not run_\n"
    tinfo = res.get("targets", {})
    d = direct_mb_s(block)
    lines = ["| | MB/s | × direct | proxy CPU s/GB | failed downloads | other CPU % of a core |",
             "|---|---:|---:|---:|---:|---:|"]
    for n in targets_in(block):
        recs = block[n]
        if unavailable(recs):
            why = reason_of(recs, tinfo.get(n))
            word = "n/a" if why.startswith("n/a") else "not available"
            why = why[4:].strip(": ") if why.startswith("n/a") else why
            lines.append(f"| {label(n)} | {word}: {why} | | | | |")
            continue
        ok = ok_records(recs)
        s = stat(ok, "mb_s")
        ratio = f"{s[0] / d:.2f}×" if (s and d and n != "direct") else ("1" if n == "direct" else "—")
        errs = sum(r.get("errors", 0) for r in ok)
        lines.append(f"| {label(n)} | {fmt(s)} | {ratio} | {fmt_small(stat(ok, 'cpu_s_per_gb'), 2)} | {errs} | {other_cell(recs)} |")
    return "\n".join(lines) + "\n"


def idle_table(res):
    block = res["measurements"].get("idle")
    if not block:
        return "_not run_\n"
    lines = ["| | connections held open | RSS before (MiB) | RSS after (MiB) | KiB per connection | note |",
             "|---|---:|---:|---:|---:|---|"]
    for n in targets_in(block):
        r = block[n]
        if not r.get("available"):
            lines.append(f"| {label(n)} | not available: {r.get('reason', '')} | | | | |")
            continue
        if r.get("failed"):
            lines.append(f"| {label(n)} | failed: {r.get('reason', '')} | | | | |")
            continue
        kib = r.get("kib_per_conn")
        note = r.get("reason", "")
        if r.get("errors"):
            note += f" {r['errors']} connection errors ({'; '.join(r.get('first_errors', []))})"
        if r.get("statuses") and set(r["statuses"]) != {"200"}:
            note += f" statuses {r['statuses']}"
        kib_cell = f"{kib:.1f}" if kib is not None else "n/a"
        if kib is not None and r.get("open", 0) < 0.9 * r.get("requested", 1):
            kib_cell = "n/a"
        lines.append(f"| {label(n)} | {r.get('open', 0):,} of {r.get('requested', 0):,} | {r['rss_before_kib'] / 1024:.1f} | "
                     f"{r['rss_after_kib'] / 1024:.1f} | {kib_cell} | {note.strip()} |")
    return "\n".join(lines) + "\n"


def policy_section(res):
    block = res["measurements"].get("policy_1k")
    if not block:
        return "_not run_\n"
    if block.get("available") is False:
        return f"datamode-proxy not available: {block.get('reason', '')}\n"
    info = block.get("info", {})
    lines = ["| run | requests/s | p50 ms | p99 ms | proxy CPU µs/request | non-2xx (expected: the rejected share) | other CPU % of a core |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    rows = {"datamode-proxy": "**datamode-proxy** `normal`, no rules or variants (policy-free)",
            "datamode-constrained": "**datamode-proxy** `constrained`, 1,000 rules + 10,000 variants",
            "datamode-sessions": "**datamode-proxy** `normal`, same policy, 1,000 live sessions in `constrained` "
                                 "(each request names one: `Data-Mode-Session`)"}
    base = None
    for n in ("datamode-proxy", "datamode-constrained", "datamode-sessions"):
        if n == "datamode-sessions" and n not in block:
            continue
        recs = block.get(n, [])
        if unavailable(recs):
            lines.append(f"| {rows[n]} | not available: {reason_of(recs, None)} | | | | | |")
            continue
        ok = ok_records(recs)
        st = sum(r.get("errors_detail", {}).get("status", 0) for r in ok)
        tot = sum(r.get("requests", 0) for r in ok)
        other_errs = sum(r.get("errors", 0) for r in ok) - st
        cell = f"{st:,} ({100 * st / tot:.0f}%)" if tot else "—"
        if other_errs:
            cell += f"; {other_errs:,} socket errors"
        s = stat(ok, "cpu_us_per_req")
        if n == "datamode-proxy":
            base = s
        lines.append(f"| {rows[n]} | {fmt(stat(ok, 'rps'))} | {fmt_small(stat(ok, 'p50_ms'), 2)} | {fmt_small(stat(ok, 'p99_ms'), 2)} | "
                     f"{fmt_small(s, 1)} | {cell} | {other_cell(recs)} |")
        if n == "datamode-constrained" and base and s:
            lines.append(f"| policy cost | | | | {s[0] - base[0]:+.1f} µs/request ({s[0] / base[0]:.2f}×) | | |")
        if n == "datamode-sessions" and base and s:
            lines.append(f"| policy cost with 1,000 sessions (budget ≤ 1.05×) | | | | {s[0] - base[0]:+.1f} µs/request "
                         f"({s[0] / base[0]:.2f}×) | | |")
    out = "\n".join(lines) + "\n\n"
    mix = info.get("mix", {})
    if mix:
        tot = sum(mix.values())
        out += ("URL mix per cycle: " + ", ".join(f"{k} {v} ({100 * v / tot:.0f}%)" for k, v in mix.items()) +
                "; the policy-free run asks for the same URLs (the origin answers all of them with 1 KiB).\n")
    if info.get("probe_constrained"):
        out += "\nOne request of each kind, as answered:\n\n| kind | constrained | policy-free |\n|---|---|---|\n"
        for k in ("forwarded", "rejected", "rewritten"):
            out += f"| {k} | {info['probe_constrained'].get(k, '')} | {info.get('probe_policy_free', {}).get(k, '')} |\n"
    if info.get("constrained_outcomes"):
        out += "\nOutcomes counted by the constrained instance's `/metrics` over its warm-up and measured runs: " + \
               ", ".join(f"{k} {v:,.0f}" for k, v in sorted(info["constrained_outcomes"].items())) + "\n"
    if info.get("sessions_outcomes"):
        out += ("\nOutcomes counted by the sessions instance's `/metrics` (its global mode is `normal`: the rejections "
                "and rewrites come from the sessions' mode): " +
                ", ".join(f"{k} {v:,.0f}" for k, v in sorted(info["sessions_outcomes"].items())) + "\n")
    return out


HTTPS_ORDER = ["direct", "datamode-https", "datamode-https-h1origin", "datamode-https-baseline",
               "datamode-https-h1origin-baseline", "squid-bump", "mitmproxy"]
HTTPS_NAMES = {"direct": "direct (client → origin TLS)", "datamode-https": "**datamode-proxy**",
               "datamode-https-h1origin": "datamode-proxy, HTTP/1.1 to the origin (`http2.upstream: false`)",
               "datamode-https-baseline": "datamode-proxy (baseline build)",
               "datamode-https-h1origin-baseline": "datamode-proxy (baseline build), HTTP/1.1 to the origin",
               "squid-bump": "Squid `ssl_bump` (peek, stare, bump)", "mitmproxy": "mitmproxy (`mitmdump`)"}


def https_table(res, key, new_connections):
    block = res["measurements"].get(key)
    if not block:
        return "_not run_\n"
    info = block.get("info", {})
    if new_connections:
        lines = ["| | connections/s | p50 ms | p99 ms | proxy CPU ms/connection | connections per proxy-core second | errors | other CPU % of a core |",
                 "|---|---:|---:|---:|---:|---:|---:|---:|"]
    else:
        lines = ["| | requests/s | p50 ms | p99 ms | proxy CPU µs/request | requests/s per proxy core | errors | other CPU % of a core |",
                 "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for n in [x for x in HTTPS_ORDER if x in block]:
        recs = block[n]
        name = HTTPS_NAMES.get(n, n)
        if unavailable(recs):
            lines.append(f"| {name} | not available: {reason_of(recs, info.get(n))} | | | | | | |")
            continue
        ok = ok_records(recs)
        errs = sum(r.get("errors", 0) for r in ok)
        firsts = [r["first_error"] for r in ok if r.get("errors") and r.get("first_error")]
        err_cell = f"{errs:,}" + (f" (first: {firsts[0][:80]})" if firsts else "")
        if new_connections:
            cells = [fmt(stat(ok, "conns_per_s")), fmt_small(stat(ok, "p50_ms"), 2), fmt_small(stat(ok, "p99_ms"), 2),
                     fmt_small(stat(ok, "cpu_ms_per_conn"), 2), fmt(stat(ok, "conns_per_core_s"))]
        else:
            cells = [fmt(stat(ok, "rps")), fmt_small(stat(ok, "p50_ms"), 2), fmt_small(stat(ok, "p99_ms"), 2),
                     fmt_small(stat(ok, "cpu_us_per_req"), 1), fmt(stat(ok, "rps_per_core"))]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {err_cell} | {other_cell(recs)} |")
    return "\n".join(lines) + "\n"


def https_targets(res):
    """The two targets of issue 13 as ratios of medians, or why they cannot be computed."""
    def med(key, n, field):
        s = stat(ok_records(res["measurements"].get(key, {}).get(n, [])), field)
        return s[0] if s else None
    out = []
    for key, title in (("https_1k", "1 KiB keep-alive"), ("https_100k", "100 KiB keep-alive"),
                       ("https_newconn", "new connections")):
        if key not in res["measurements"]:
            continue
        field = "cpu_ms_per_conn" if key == "https_newconn" else "cpu_us_per_req"
        core = "conns_per_core_s" if key == "https_newconn" else "rps_per_core"
        sq = med(key, "squid-bump", field)
        for n, label in (("datamode-https", "datamode-proxy"),
                         ("datamode-https-h1origin", "datamode-proxy with HTTP/1.1 to the origin")):
            dm, dmc, mpc = med(key, n, field), med(key, n, core), med(key, "mitmproxy", core)
            if n != "datamode-https" and dm is None:
                continue
            vs_mitm = f"{dmc / mpc:.1f}× mitmproxy's per proxy core (target ≥ 10×)" if dmc and mpc else "vs mitmproxy: —"
            vs_squid = f"{dm / sq:.2f}× Squid's CPU per unit (target ≤ 1)" if dm and sq else "vs Squid: —"
            out.append(f"- {title}: {label} {vs_mitm}; {vs_squid}.")
    if "https_h2_1k" in res["measurements"]:
        dmc, mpc = med("https_h2_1k", "datamode-https", "rps_per_core"), med("https_h2_1k", "mitmproxy", "rps_per_core")
        h2cpu, h1cpu = med("https_h2_1k", "datamode-https", "cpu_us_per_req"), med("https_1k", "datamode-https", "cpu_us_per_req")
        vs_mitm = f"{dmc / mpc:.1f}× mitmproxy's per proxy core (target ≥ 20×)" if dmc and mpc else "vs mitmproxy: —"
        vs_h1 = (f"{h2cpu:.1f} µs CPU per request, {h2cpu / h1cpu:.2f}× our HTTP/1.1 intercepted row (target ≤ 1)"
                 if h2cpu and h1cpu else "vs HTTP/1.1: —")
        out.append(f"- HTTP/2, 1 KiB, 10 streams per connection (issue 26): datamode-proxy {vs_mitm}; {vs_h1}.")
    if any("—" in line for line in out):
        out.append("- (—: a row was not available in this run.)")
    return "\n".join(out) + "\n"


def noise_summary(res):
    worst, worst_core, where = 0.0, 0.0, ""
    for key, block in res["measurements"].items():
        if not isinstance(block, dict):
            continue
        for n, recs in block.items():
            if not isinstance(recs, list):
                continue
            for r in ok_records(recs):
                if r.get("other_pct", 0) > worst:
                    worst, where = r["other_pct"], f"{key} / {n} round {r.get('round', 0) + 1}"
                worst_core = max(worst_core, r.get("other_on_proxy_core_pct", 0))
    by, n = {}, 0
    for key, block in res["measurements"].items():
        if isinstance(block, dict):
            for recs in block.values():
                if isinstance(recs, list):
                    for r in ok_records(recs):
                        n += 1
                        for comm, pct in r.get("other_top", []):
                            by[comm] = by.get(comm, 0) + pct
    tops = sorted(by.items(), key=lambda kv: -kv[1])[:4]
    busiest = ("; busiest other processes, mean % of a core over the samples: " +
               ", ".join(f"`{c}` {v / n:.0f}%" for c, v in tops)) if tops and n else ""
    probes = sorted(r["speed_probe_s"] for key, block in res["measurements"].items() if isinstance(block, dict)
                    for recs in block.values() if isinstance(recs, list) for r in ok_records(recs)
                    if r.get("speed_probe_s"))
    speed = ""
    if probes:
        mid = probes[len(probes) // 2]
        speed = (f" Speed probe (`lib/speedprobe.c`, a fixed loop on the proxy's core before each measurement): median "
                 f"{mid:.3f} s, {probes[0]:.3f}–{probes[-1]:.3f} over {len(probes)} measurements, so the machine itself "
                 f"ran up to {100 * (probes[-1] / probes[0] - 1):.0f}% slower at one time than at another; per-round "
                 f"values are in the JSON (`speed_probe_s`).")
    steals = sorted((r["steal_pct"], f"{key} / {n} round {r.get('round', 0) + 1}")
                    for key, block in res["measurements"].items() if isinstance(block, dict)
                    for n, recs in block.items() if isinstance(recs, list) for r in ok_records(recs)
                    if r.get("steal_pct") is not None)
    steal = ""
    if steals:
        steal = (f" Hypervisor steal (`/proc/stat`, time our virtual CPUs were runnable and not run, % of one core): "
                 f"median {steals[len(steals) // 2][0]:.0f}%, at most {steals[-1][0]:.0f}% ({steals[-1][1]}).")
        p = res.get("params", {})
        retaken = [r["retaken_for_steal"] for block in res["measurements"].values() if isinstance(block, dict)
                   for recs in block.values() if isinstance(recs, list) for r in recs if r.get("retaken_for_steal")]
        if "steal_limit" in p:
            steal += (f" A measurement with more than {p['steal_limit']:g}% stolen was taken again, up to "
                      f"{p.get('steal_retries')} times: {len(retaken)} were, {sum(len(x) for x in retaken)} attempts "
                      f"discarded (their steal is in the JSON, `retaken_for_steal`).")
    busy = worst > BUSY_PCT or (steals and steals[-1][0] > BUSY_PCT)
    verdict = ("quiet" if not busy else
               "**busy** (rows marked ⚠ had other work running or CPU stolen; compare them with care)")
    return (f"Other processes' CPU during measurements: at most {worst:.0f}% of one core ({where}); on the proxy's core "
            f"at most {worst_core:.0f}%{busiest}. Machine: {verdict}.{speed}{steal}")


def ratio_cell(block, a, b, key):
    """a over b for key: the ratio of the medians, and the spread of the per-round ratios (same round, A next to B)."""
    sa, sb = stat(ok_records(block.get(a, [])), key), stat(ok_records(block.get(b, [])), key)
    if not sa or not sb or not sb[0]:
        return "—"
    rb = {r.get("round"): r[key] for r in ok_records(block.get(b, [])) if r.get(key)}
    per = [r[key] / rb[r.get("round")] for r in ok_records(block.get(a, []))
           if r.get(key) is not None and r.get("round") in rb]
    out = f"{sa[0] / sb[0]:.2f}×"
    if len(per) > 1 and min(per) != max(per):
        out += f" (per round {min(per):.2f}–{max(per):.2f}×)"
    return out


def scale_section(res):
    block = res["measurements"].get("scale_1k")
    if not block:
        return "_not run_\n"
    info = block.get("info", {})
    inst = info.get("instances", {})
    w = info.get("workers", 2)
    lines = ["| | requests/s | p50 ms | p99 ms | proxy CPU µs/request | proxy CPU, cores | wrk + origin CPU, cores | "
             "errors | other CPU % of a core |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    names = [n for n in SCALE_ORDER if n in block] + [n for n in block if n not in SCALE_ORDER and n != "info"]
    for n in names:
        recs = block[n]
        if unavailable(recs):
            lines.append(f"| {label(n)} | not available: {reason_of(recs, inst.get(n))} | | | | | | | |")
            continue
        ok = ok_records(recs)
        errs = sum(r.get("errors", 0) for r in ok)
        lines.append(f"| {label(n)} | {fmt(stat(ok, 'rps'))} | {fmt_small(stat(ok, 'p50_ms'), 2)} | "
                     f"{fmt_small(stat(ok, 'p99_ms'), 2)} | {fmt_small(stat(ok, 'cpu_us_per_req'), 1)} | "
                     f"{fmt_small(stat(ok, 'proxy_cores'), 2)} | {fmt_small(stat(ok, 'client_origin_cores'), 2)} | "
                     f"{errs:,} | {other_cell(recs)} |")
    out = "\n".join(lines) + "\n\n"
    dm, ha, ng = "datamode-proxy-threads2", "haproxy-nbthread2", "nginx-workers2"
    if dm in block and ha in block:
        out += (f"**datamode-proxy / HAProxy, {w} workers each:** requests/s {ratio_cell(block, dm, ha, 'rps')} "
                f"(higher is better), proxy CPU µs/request {ratio_cell(block, dm, ha, 'cpu_us_per_req')} (lower is better).")
        if ng in block:
            out += (f" Against nginx: requests/s {ratio_cell(block, dm, ng, 'rps')}, "
                    f"CPU µs/request {ratio_cell(block, dm, ng, 'cpu_us_per_req')}.")
        out += "\n\n"
    seen = [f"{label(n)} {v['processes']} process{'es' if v['processes'] != 1 else ''} / {v['threads']} threads"
            for n, v in inst.items() if v.get("threads")]
    if seen:
        out += "Seen in /proc when started: " + "; ".join(seen) + ".\n"
    return out


def dm_line(res):
    env = res.get("env", {})
    t = res.get("targets", {}).get("datamode-proxy")
    if t is None:   # --only https: the intercepting instance's start-up, as https.py recorded it
        t = res.get("measurements", {}).get("https_1k", {}).get("info", {}).get("datamode-https")
    if t is None:
        return "not measured"
    if not t.get("available"):
        return f"not available: {t.get('reason', '')}"
    v = env.get("versions", {}).get("datamode-proxy") or "version unknown (--version printed nothing)"
    return f"{v} (`{env.get('proxy_bin', '')}`)"


def short_version(v):
    v = v.replace("nginx version: ", "").replace("HAProxy version", "HAProxy").replace("Squid Cache: Version", "Squid")
    for cut in (" Copyright", " - https", " (x86_64"):
        v = v.split(cut)[0]
    return v.strip()



def pageweight_section(res):
    m = res["measurements"].get("pageweight")
    if not m:
        return "not measured (`--only pageweight`)\n"
    if not m.get("available"):
        return f"not available: {m.get('reason', '')}\n"
    out = ["| image | original | normal mode | constrained | saved | served as |", "|---|---:|---:|---:|---:|---|"]
    for name, v in m["images"].items():
        saved = 100 * (1 - v["constrained"] / v["normal"]) if v["normal"] else 0
        out.append(f"| `{name}` | {v['original']:,} | {v['normal']:,} | {v['constrained']:,} | {saved:.0f}% | "
                   f"{v['type']}{' (' + v['variant'] + ')' if v['variant'] else ''} |")
    lat = m["added_latency_ms"]
    alone, busy = m["untouched_1k"]["alone"], m["untouched_1k"]["while_transcoding"]

    def rps(r):
        return f"{r['rps']:,.0f} req/s, p99 {r['p99_ms']:.2f} ms" if r.get("rps") else f"not available ({r.get('reason', '')})"
    tps = m.get("transcodes_per_cpu_s")
    out += ["",
            f"- Bytes saved: median **{m['saved_median_pct']:.0f}%** per image (target ≥ 70%), "
            f"{m['saved_total_pct']:.0f}% of all bytes ({m['bytes_normal']:,} → {m['bytes_constrained']:,}); "
            "max-width 800, quality 60, `Accept` as Chrome sends it for `<img>` (WebP allowed).",
            (f"- Images transcoded per proxy CPU-second: **{tps:.1f}**" if tps else "- Images transcoded per CPU-second: n/a")
            + f" ({m['transcodes']} transcodes, two clients, a new URL each time so the cache never answers).",
            f"- Added latency of a transcode (same image, constrained minus normal, {lat['samples']} pairs): "
            f"p50 {lat['p50']:.1f} ms, p99 {lat['p99']:.1f} ms.",
            f"- Untouched 1 KiB traffic through the constrained instance: {rps(alone)} alone; {rps(busy)} "
            "while two clients keep it transcoding.", ""]
    return "\n".join(out) + "\n"

def script_section(res, name):
    """bench/transparent's or bench/fleet's table, as the script wrote it beside this report (its title dropped)."""
    m = res["measurements"].get(name)
    if not m:
        return f"not measured (`--only {name}`)\n"
    if not m.get("available"):
        return f"not available: {m.get('reason', '')}\n"
    body = m["markdown"].splitlines()
    if body and body[0].startswith("# "):
        body = body[1:]
    return (f"Run by this bench as `{m['command']}` ({m['seconds']:.0f} s); its own file: [{m['file']}]({m['file']}).\n"
            + "\n".join(body).rstrip() + "\n")


def markdown(res, png):
    env = res.get("env", {})
    p = res.get("params", {})
    stamp = res.get("stamp", "")
    out = [f"# datamode-proxy bench — {stamp}", ""]
    if res.get("interrupted"):
        out += [f"**Interrupted ({res['interrupted']}): partial results.**", ""]
    out += [
        f"- Command: `{res.get('command', '')}`",
        f"- Commit measured: `{env.get('commit', '?')}`" + (" (with uncommitted changes outside bench/)" if env.get("dirty") else ""),
        f"- datamode-proxy: {dm_line(res)}",
        f"- Machine: {env.get('cpu_model', '')}, {env.get('cpus')} cores, kernel {env.get('kernel')}, load average at start "
        f"{' '.join(env.get('loadavg_at_start', []))}"
        + (f"; CPU busy before the bench started anything: {env['background_cpu_pct_before']:.0f}% of one core"
           if env.get('background_cpu_pct_before') is not None else "")
        + (f" ({', '.join(f'`{c}` {v:.0f}%' for c, v in env.get('background_top_before', []))})" if env.get('background_top_before') else ""),
        f"- Tools: {'; '.join(short_version(v) for k, v in env.get('versions', {}).items() if k != 'datamode-proxy')}",
        f"- Method: proxy pinned to CPU {p.get('proxy_cpu')}, wrk/curl/idle client/tlsload and the nginx origin on CPU {p.get('client_cpu')}; "
        f"one worker per proxy, logging off, keep-alive on; {p.get('rounds')} round{'s' if p.get('rounds') != 1 else ''} interleaved (A B C … A B C …); "
        f"wrk 1 thread, {p.get('connections')} connections, {p.get('duration')} s per run after a {p.get('warmup')} s warm-up; "
        f"cells are median (min–max) over the rounds"
        + (f". Section 6 differs: {p.get('scale_connections')} connections, wrk 2 threads, two workers per proxy, nothing pinned"
           if "scale_1k" in res.get("measurements", {}) else "") + ".",
        f"- {noise_summary(res)}",
        f"- Whole run: {res.get('elapsed_s', 0) / 60:.1f} min. Raw samples: `{stamp}.json`.",
        "",
    ]
    if png:
        out += [f"![requests/s and proxy CPU per request]({png})", ""]
    scale_workers = (res["measurements"].get("scale_1k") or {}).get("info", {}).get("workers", 2)
    out += ["## 1. Small responses, keep-alive, absolute-form", "", "### 1 KiB", "", small_table(res, "small_1k"),
            "### 100 KiB", "", small_table(res, "small_100k"),
            "Proxy CPU µs/request = the proxy's utime+stime (all threads and worker processes, /proc/PID/stat) over the run, "
            "divided by the requests wrk completed. When the client core is the bottleneck requests/s hardly separates "
            "the proxies; this column does.", "",
            f"### 1 KiB at a fixed rate: {p.get('fixed_rate', 0):,} requests/s, {p.get('connections')} connections", "",
            "wrk keeps every connection busy, so a proxy that answers sooner is sent more and its p99 is taken at a higher "
            "rate, with the client's core nearer saturation. Here (`lib/rateload.c`, open loop) request k is due at "
            "k/rate on connection k mod C whatever came back, and its latency counts from when it was due (no coordinated "
            "omission): the same load through every proxy. Errors: requests a proxy could not take at that rate (more "
            "than 4,096 due on one connection, or unanswered 2 s after the end).", "",
            rate_table(res, "small_1k_rate"),
            "## 2. 100 MiB download", "",
            f"{p.get('downloads')} sequential downloads of the 100 MiB file per round (curl, one connection when the proxy keeps it alive); "
            "MB/s = 10^6 bytes/s; s/GB = proxy CPU seconds per 10^9 bytes.", "",
            download_table(res, "download_100m"),
            "## 3. Idle keep-alive client connections", "",
            f"{p.get('idle_conns'):,} client connections, one request each, then held idle; growth of the proxy's RSS "
            "(VmRSS, summed over its processes) divided by the connections still open. Each proxy is restarted first "
            "(memory kept from sections 1-2 would be reused and not counted); direct = the origin nginx, not restarted.", "",
            idle_table(res),
            "## 4. datamode-proxy policy cost (1 KiB, URL mix)", "", policy_section(res),
            "## 5. CONNECT tunnel, 100 MiB", "",
            "curl `-p` (CONNECT to the origin's port, then GET through the tunnel). Direct is the plain download.", "",
            download_table(res, "connect_100m"),
            f"## 6. Scale across cores: {scale_workers} workers, 1 KiB keep-alive", "",
            f"Second instances with two workers each (datamode-proxy `threads: 2`, HAProxy `nbthread 2`, nginx "
            f"`worker_processes 2`), not pinned: they may use both cores (CPUs {','.join(map(str, p.get('all_cpus') or []))}), "
            f"and so do `wrk -t2 -c{p.get('scale_connections')}` and the origin (its one worker floats across the cores "
            "for this row). On this 2-core machine the load generator and the origin share the cores with the proxy, so "
            "this row does not show a proxy's throughput on two cores of its own: it shows how each proxy uses two "
            "cores it shares with the client and the origin — requests/s at saturation, and proxy CPU µs/request "
            "(utime+stime of all its threads and processes, /proc). *Proxy CPU, cores* = the proxy's CPU seconds over "
            "the wall time (2.00 = both cores all the time); *wrk + origin* the same for the client and the origin. "
            "Direct is wrk against the one-worker origin, also on both cores.", "",
            scale_section(res),
            "## 7. HTTPS through interception (SPEC §9)", "",
            "`CONNECT 127.0.0.1:<origin TLS port>`, the proxy terminates TLS with a leaf from its own CA (which the "
            "client verifies, as a browser that trusts the CA would) and talks TLS to the nginx origin, verified "
            "against the origin's CA. Client: `lib/tlsload.c` (wrk cannot send https through a proxy), threads with "
            "blocking sockets, pinned to the client core with the origin. Requests/s per proxy core = requests / "
            "proxy CPU seconds (what one core of the proxy would serve when it, not the client, is the bottleneck).", "",
            f"### 1 KiB, keep-alive, {p.get('connections')} connections", "", https_table(res, "https_1k", False),
            f"### 100 KiB, keep-alive, {p.get('connections')} connections", "", https_table(res, "https_100k", False),
            f"### New intercepted connections, {p.get('tls_new_connections')} clients",
            "", "Each connection: CONNECT, a full TLS handshake (no session resumption), one 1 KiB GET, close. "
            "The proxies' own handshakes to the origin are theirs to pool or not (Squid and mitmproxy open one per "
            "client connection).", "",
            https_table(res, "https_newconn", True),
            f"### HTTP/2 inside the tunnel, 1 KiB, {p.get('connections')} connections × 10 streams (SPEC §17)", "",
            "Each client connection speaks h2 (ALPN) and keeps 10 GETs in flight. mitmproxy speaks h2 on both sides "
            "(the origin offers it), and so does datamode-proxy (SPEC §17: it offers h2 to TLS origins, so its HTTP/1.1 "
            "rows above reach this nginx in h2 too); Squid ssl_bump has no HTTP/2 and no row.", "",
            https_table(res, "https_h2_1k", False),
            "### Targets (issues 13, 26)", "", https_targets(res),
            ]
    import shaping
    out.append(shaping.section(res))
    out += [
            "## 9. Page weight: images transcoded in constrained mode (SPEC §13)", "",
            "A fixed set of generated images (JPEG photos from 640 px to 4032 px, PNG art, WebP) fetched through "
            "datamode-proxy in `normal` mode and through a second instance in `constrained` mode with "
            "`images.transcode: {when: constrained, max-width: 800, quality: 60}`; the proxy is pinned to its one core, "
            "and its transcoding threads share that core.", "",
            pageweight_section(res),
            "## 10. Transparent sidecar beside the explicit proxy (`bench/transparent`, SPEC §16, issue 27)", "",
            script_section(res, "transparent"),
            "## 11. A fleet on one Redis (`bench/fleet`, SPEC §19, issue 29)", "",
            script_section(res, "fleet"),
            ]
    return "\n".join(out) + "\n"
