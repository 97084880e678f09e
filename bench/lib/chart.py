"""PNG chart: per response size, proxy CPU µs/request (lower is better) and requests/s (direct as a line)."""
import statistics

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PROXIES = ["datamode-proxy", "haproxy", "nginx", "squid", "tinyproxy"]
HTTPS_PROXIES = ["datamode-https", "squid-bump", "mitmproxy"]   # measurement 7 (https.py)
SHORT = {"datamode-proxy": "datamode-\nproxy", "haproxy": "HAProxy", "nginx": "nginx", "squid": "Squid", "tinyproxy": "tinyproxy",
         "datamode-https": "datamode-\nproxy", "squid-bump": "Squid\nssl_bump", "mitmproxy": "mitmproxy"}
COLOR = {"datamode-proxy": "#e8710a", "haproxy": "#5b7fa6", "nginx": "#5b7fa6", "squid": "#5b7fa6", "tinyproxy": "#5b7fa6",
         "datamode-https": "#e8710a", "squid-bump": "#5b7fa6", "mitmproxy": "#5b7fa6"}


def _stat(recs, key):
    vals = [r[key] for r in recs if isinstance(r, dict) and r.get("available") and not r.get("failed") and r.get(key) is not None]
    if not vals:
        return None
    return statistics.median(vals), min(vals), max(vals)


def _bars(ax, block, key, fmt, direct=None, direct_label="", proxies=PROXIES):
    xs, labels = range(len(proxies)), [SHORT[p] for p in proxies]
    top = 0
    stats = [_stat(block.get(p, []), key) for p in proxies]
    for x, p, s in zip(xs, proxies, stats):
        if s is None:
            continue
        med, lo, hi = s
        ax.bar(x, med, color=COLOR[p], width=0.65, zorder=2)
        ax.errorbar(x, med, yerr=[[med - lo], [hi - med]], color="black", capsize=4, lw=1, zorder=3)
        top = max(top, hi)
    if direct:
        top = max(top, direct)
    for x, s in zip(xs, stats):
        if s is None:
            ax.text(x, (top or 1) * 0.08, "not\navailable", ha="center", va="bottom", fontsize=10, color="#888888")
        else:
            ax.text(x, s[2] + top * 0.02, fmt.format(s[0]), ha="center", va="bottom", fontsize=10, fontweight="bold")
    if direct:
        ax.axhline(direct, color="#2a9d3f", ls="--", lw=2, zorder=4)
        ax.text(len(proxies) - 0.5, direct, direct_label, ha="right", va="bottom", fontsize=9.5, color="#2a9d3f",
                fontweight="bold")
    ax.set_xlim(-0.6, len(proxies) - 0.4)
    ax.set_xticks(list(xs))
    ax.set_xticklabels(labels, fontsize=10)
    ax.set_ylim(0, (top or 1) * 1.18)
    ax.grid(axis="y", color="#dddddd", zorder=0)
    ax.spines[["top", "right"]].set_visible(False)


def _worst_other(m):
    worst = 0.0
    for block in m.values():
        if isinstance(block, dict):
            for recs in block.values():
                if isinstance(recs, list):
                    for r in recs:
                        if isinstance(r, dict) and r.get("other_pct") is not None:
                            worst = max(worst, r["other_pct"])
    return worst


def draw(res, path):
    m = res.get("measurements", {})
    env = res.get("env", {})
    p = res.get("params", {})
    fig, axes = plt.subplots(2, 2, figsize=(13, 8.5))
    rows = (("small_1k", "1 KiB"), ("small_100k", "100 KiB"))
    proxies = PROXIES
    if "small_1k" not in m and "https_1k" in m:   # --only https: its keep-alive runs instead
        rows, proxies = (("https_1k", "HTTPS 1 KiB"), ("https_100k", "HTTPS 100 KiB")), HTTPS_PROXIES
    for row, (key, title) in enumerate(rows):
        block = m.get(key, {})
        ax = axes[row][0]
        _bars(ax, block, "cpu_us_per_req", "{:.0f}", proxies=proxies)
        ax.set_title(f"{title}: proxy CPU µs per request (lower is better)", fontsize=12, loc="left")
        ax.set_ylabel("µs / request")
        ax = axes[row][1]
        d = _stat(block.get("direct", []), "rps")
        _bars(ax, block, "rps", "{:,.0f}", direct=d[0] if d else None,
              direct_label=f"direct (no proxy): {d[0]:,.0f}" if d else "", proxies=proxies)
        ax.set_title(f"{title}: requests/s (higher is better)", fontsize=12, loc="left")
        ax.set_ylabel("requests / s")
    commit = env.get("commit", "?")
    commit = commit[:10] if len(commit) >= 40 else commit
    fig.suptitle(f"datamode-proxy vs peers — {res.get('stamp', '')}\n"
                 f"keep-alive, {p.get('connections')} connections, proxy pinned to 1 core; "
                 f"median of {p.get('rounds')} interleaved rounds, whiskers min–max",
                 fontsize=12.5, fontweight="bold")
    worst = _worst_other(m)
    noise = (f"quiet machine (other CPU ≤ {worst:.0f}% of a core)" if worst <= 10 else
             f"BUSY machine: other processes used up to {worst:.0f}% of a core during the runs")
    client = "wrk" if proxies is PROXIES else "tlsload"
    fig.text(0.5, 0.005, f"commit {commit} · {p.get('duration')} s per run · {client} + nginx origin on the other core · {noise}",
             ha="center", fontsize=9.5, color="#555555" if worst <= 10 else "#b00020")
    fig.tight_layout(rect=(0, 0.025, 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)
