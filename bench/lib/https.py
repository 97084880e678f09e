"""Measurement 7: HTTPS through interception (SPEC §9), side by side with Squid ssl_bump, mitmproxy and direct.

Each intercepting proxy gets `CONNECT 127.0.0.1:<origin TLS port>`, terminates the client's TLS with a leaf it
mints from its own CA, and talks TLS to the nginx origin (verified against the bench's origin CA). The client is
lib/tlsload.c (wrk cannot send https through a proxy): it verifies the proxy's leaf against that proxy's CA, as a
browser that trusts the CA would. Three runs per target, interleaved over the rounds:

- https_1k / https_100k: keep-alive, --connections clients, GET of the 1 KiB / 100 KiB file again and again;
- https_newconn: --tls-new-connections clients, each connection CONNECT + full TLS handshake (no resumption) +
  one 1 KiB GET + close;
- https_h2_1k: HTTP/2 inside the tunnel (SPEC §17): --connections clients, each one h2 connection with 10 streams
  in flight (GET 1 KiB); Squid ssl_bump does not speak h2 to clients and has no row; mitmproxy speaks h2 on both
  sides (the nginx origin offers h2), and so does datamode-proxy (h2 to TLS origins, SPEC §17, for every row).

CPU is read from the proxy's processes only (/proc/PID/stat, helpers included: Squid's certificate generator),
as in the other measurements; the client and the origin are pinned to the other core.
"""
import json
import os
import subprocess
import sys
import time

from procs import free_port

TLSLOAD_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tlsload.c")
SQUID_CERTGEN = "/usr/lib/squid/security_file_certgen"
DM_HTTPS = "datamode-https"
# `--baseline-bin`: another build beside it, in the same run (before/after a change).
DM_HTTPS_BASE = "datamode-https-baseline"
# The same build with `http2.upstream: false`: HTTP/1.1 to the origin, one origin connection per client connection,
# as Squid and mitmproxy do. The origin (nginx) picks h2 when offered, so the main row shares one multiplexed origin
# connection; this row is the other half of the engine (issue 31: its pooling bug was invisible to the main row).
DM_HTTPS_H1 = "datamode-https-h1origin"
DM_HTTPS_H1_BASE = "datamode-https-h1origin-baseline"
ORDER = ["direct", DM_HTTPS, DM_HTTPS_H1, DM_HTTPS_BASE, DM_HTTPS_H1_BASE, "squid-bump", "mitmproxy"]


def log(msg):
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_ca(directory, name, subject):
    """An ECDSA P-256 CA (cert name.pem, key name-key.pem) with the extensions browsers and OpenSSL 3 expect."""
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "3",
            "-subj", subject, "-keyout", f"{name}-key.pem", "-out", f"{name}.pem",
            "-addext", "basicConstraints=critical,CA:TRUE,pathlen:0",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=directory)


def make_origin_certificates(work):
    """work/origin-tls/: origin-ca.pem (what the proxies trust) and origin.pem + origin-key.pem (nginx's leaf, IP SAN)."""
    d = os.path.join(work, "origin-tls")
    os.makedirs(d, exist_ok=True)
    make_ca(d, "origin-ca", "/CN=datamode bench origin CA")
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", "/CN=127.0.0.1",
            "-keyout", "origin-key.pem", "-out", "origin.csr", cwd=d)
    with open(os.path.join(d, "leaf.ext"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n"
                "keyUsage=critical,digitalSignature\n")
    openssl("x509", "-req", "-in", "origin.csr", "-CA", "origin-ca.pem", "-CAkey", "origin-ca-key.pem",
            "-CAcreateserial", "-days", "3", "-extfile", "leaf.ext", "-out", "origin.pem", cwd=d)
    for fn in os.listdir(d):   # squid drops privileges and must read its files (bench-only keys)
        os.chmod(os.path.join(d, fn), 0o644)
    os.chmod(d, 0o755)


def build_tlsload(work):
    out = os.path.join(work, "tlsload")
    r = subprocess.run(["cc", "-O2", "-pthread", TLSLOAD_SRC, "-o", out, "-lssl", "-lcrypto", "-lnghttp2"],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise RuntimeError("could not build lib/tlsload.c (needs cc, libssl-dev, libnghttp2-dev): " + r.stderr[-400:])
    return out


def curl_probe(b, t):
    """One GET through the proxy with curl (CA = the proxy's): (ok, reason)."""
    url = f"https://127.0.0.1:{b.origin_tls_port}/1k.bin"
    argv = ["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code} %{size_download}", "--max-time", "20",
            "--cacert", t.cafile, url]
    if not t.is_direct:
        argv[1:1] = ["-x", f"http://127.0.0.1:{t.port}"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=30, env=b.no_proxy_env())
    if r.returncode != 0 or r.stdout.strip() != "200 1024":
        return False, f"curl --cacert through it: rc {r.returncode} {r.stdout.strip()} {r.stderr.strip()[:200]}"
    return True, "200 over TLS, leaf verified against its CA"


def start_datamode(b, name=DM_HTTPS, binary=None, h1_origin=False):
    if b.a.datamode_unavailable or not b.a.proxy_bin:
        t = b.target(name, "datamode-proxy")
        t.reason = b.a.datamode_unavailable or "no binary"
        return t
    origin_ca = os.path.join(b.work, "origin-tls", "origin-ca.pem")

    def with_tls(base):
        text = base + "tls: {intercept: [\"127.0.0.1\"], upstream-verify: true}\n"
        return text + ("http2: {upstream: false}\n" if h1_origin else "")

    # The CA's key goes into the state directory, which must be private (SPEC §9: 0700).
    os.makedirs(os.path.join(b.work, f"{name}-state"), mode=0o700, exist_ok=True)
    # SSL_CERT_FILE: the origin's CA is the trust store the proxy verifies the origin against (SPEC §9).
    label = ("datamode-proxy" + (" (baseline)" if binary is not None else "") +
             (", HTTP/1.1 to the origin" if h1_origin else ""))
    t = b.start_datamode(name, label, extra_yaml=with_tls,
                         connect_port=b.origin_tls_port, env={"SSL_CERT_FILE": origin_ca}, probe=False, binary=binary)
    if not t.available:
        return t
    # its CA, as a client would get it: GET /ca.pem on the (loopback) admin listener
    try:
        status, line, _, body = b.http_get(t.admin_port, "/ca.pem")
    except OSError as e:
        status, line, body = 0, f"{type(e).__name__}: {e}", b""
    if status != 200 or b"BEGIN CERTIFICATE" not in body:
        t.available, t.reason = False, f"no CA from GET /ca.pem ({line[:80]}): this build has no HTTPS interception"
        b.procs.stop(t.proc)
        return t
    t.cafile = b.write(f"{name}-ca.pem", body.decode())
    return t


def start_squid(b):
    w = b.work
    d = os.path.join(w, "squid-bump")
    os.makedirs(d, exist_ok=True)
    os.chmod(d, 0o777)
    make_ca(d, "squid-ca", "/CN=datamode bench Squid CA")
    for fn in ("squid-ca.pem", "squid-ca-key.pem"):
        os.chmod(os.path.join(d, fn), 0o644)
    if not os.access(SQUID_CERTGEN, os.X_OK):
        t = b.target("squid-bump", "Squid ssl_bump")
        t.reason = f"no {SQUID_CERTGEN}: this Squid is not built with OpenSSL (Debian: squid-openssl)"
        return t
    db = os.path.join(d, "ssl_db")
    subprocess.run([SQUID_CERTGEN, "-c", "-s", db, "-M", "16MB"], check=True, capture_output=True, timeout=30)
    subprocess.run(["chown", "-R", "proxy:proxy", db], capture_output=True, timeout=30)
    port = free_port()
    conf = b.write("squid-bump.conf", b.render("squid-bump.conf.tmpl", port=port, work=w, certgen=SQUID_CERTGEN))
    t = b.start_proxy("squid-bump", "Squid ssl_bump", ["squid", "-N", "-f", conf], port, cwd=d, probe=False)
    t.cafile = os.path.join(d, "squid-ca.pem")
    return t


def start_mitmproxy(b):
    if not b.a.mitmdump:
        t = b.target("mitmproxy", "mitmproxy")
        t.reason = "no mitmdump (bench/run installs PyPI mitmproxy into a venv)"
        return t
    confdir = os.path.join(b.work, "mitmproxy")
    os.makedirs(confdir, exist_ok=True)
    port = free_port()
    argv = [b.a.mitmdump, "--listen-host", "127.0.0.1", "--listen-port", str(port), "--quiet",
            "--set", f"confdir={confdir}",
            "--set", "ssl_verify_upstream_trusted_ca=" + os.path.join(b.work, "origin-tls", "origin-ca.pem"),
            "--set", "termlog_verbosity=error", "--set", "flow_detail=0"]
    t = b.start_proxy("mitmproxy", "mitmproxy (mitmdump)", argv, port, cwd=confdir, probe=False,
                      env=b.no_proxy_env())
    t.cafile = os.path.join(confdir, "mitmproxy-ca-cert.pem")
    return t


def start_all(b):
    targets = {}
    d = b.target("direct", "direct (no proxy)")
    d.port, d.proc, d.available = b.origin_tls_port, b.origin, True
    d.cafile = os.path.join(b.work, "origin-tls", "origin-ca.pem")
    targets["direct"] = d
    ok, why = curl_probe(b, d)
    if not ok:
        raise RuntimeError("origin nginx does not serve HTTPS: " + why)
    starters = [(DM_HTTPS, "datamode-proxy", start_datamode),
                (DM_HTTPS_H1, "datamode-proxy", lambda b: start_datamode(b, DM_HTTPS_H1, h1_origin=True)),
                (DM_HTTPS_BASE, "baseline", lambda b: start_datamode(b, DM_HTTPS_BASE, b.a.baseline_bin)),
                (DM_HTTPS_H1_BASE, "baseline",
                 lambda b: start_datamode(b, DM_HTTPS_H1_BASE, b.a.baseline_bin, h1_origin=True)),
                ("squid-bump", "squid", start_squid), ("mitmproxy", "mitmproxy", start_mitmproxy)]
    for name, selector, start in starters:
        if selector == "baseline":
            if not b.a.baseline_bin:
                continue
        elif selector not in b.a.targets:
            continue
        t = start(b)
        t.name = name
        targets[name] = t
        if t.available:
            ok, why = curl_probe(b, t)
            if not ok:
                t.available, t.reason = False, why
                b.procs.stop(t.proc)
            else:
                log(f"https {name} pid {t.proc.pid} on 127.0.0.1:{t.port} ({why})")
        if not t.available:
            log(f"https {name}: not available: {t.reason}")
    return targets


H2_STREAMS = 10


def measure_tls(b, tlsload, t, size, duration, new_connections, h2=False):
    if h2 and t.name == "squid-bump":
        return {"available": False, "reason": "Squid ssl_bump does not speak HTTP/2 to clients"}
    if b.gone(t):
        return {"available": False, "reason": t.reason}
    conns = b.a.tls_new_connections if new_connections else b.a.connections
    argv = [tlsload, "--connect", f"127.0.0.1:{t.port}", "--target", f"127.0.0.1:{b.origin_tls_port}",
            "--path", f"/{size}.bin", "--size", str(b.sizes[size]), "--cafile", t.cafile,
            "-c", str(conns), "-d", str(duration)]
    if not t.is_direct:
        argv.append("--proxy")
    if new_connections:
        argv.append("--new-connections")
    if h2:
        argv += ["--h2", "--streams", str(H2_STREAMS)]
    rec, r, _, _ = b.run_summary_client(t, "tlsload", argv, timeout=duration + 60)
    if r is None:
        return rec
    dur = r["duration_us"] / 1e6
    reqs, conns_done = r["requests"], r["connections"]
    errors = sum(r["errors"].values())
    rec.update(available=True, requests=reqs, connections=conns_done, rps=reqs / dur if dur else 0,
               conns_per_s=conns_done / dur if dur else 0, p50_ms=r["lat_p50_us"] / 1000, p99_ms=r["lat_p99_us"] / 1000,
               errors=errors, errors_detail=r["errors"], bytes=r["bytes"])
    if r.get("first_error"):
        rec["first_error"] = r["first_error"]
    if not t.is_direct and reqs:
        cpu = rec["proxy_cpu_s"]
        rec["cpu_us_per_req"] = cpu * 1e6 / reqs
        rec["rps_per_core"] = reqs / cpu if cpu > 0 else None
        if new_connections and conns_done:
            rec["cpu_ms_per_conn"] = cpu * 1e3 / conns_done
            rec["conns_per_core_s"] = conns_done / cpu if cpu > 0 else None
    if reqs == 0:
        rec.update(failed=True, reason=f"no request completed: {r.get('first_error', '')}"[:300])
    if not t.is_direct and not t.alive():
        rec["reason"] = "proxy exited during this run"
    return rec


def measure(b):
    tlsload = build_tlsload(b.work)
    targets = start_all(b)
    order = [targets[n] for n in ORDER if n in targets]
    info = {n: {"label": t.label, "available": t.available, "reason": t.reason, "port": t.port}
            for n, t in targets.items()}
    runs = [("https_1k", "1k", False), ("https_100k", "100k", False), ("https_newconn", "1k", True),
            ("https_h2_1k", "1k", "h2")]
    blocks = {key: {t.name: [] for t in order} for key, _, _ in runs}
    if b.a.warmup > 0:
        for t in order:
            for key, size, new in runs:
                measure_tls(b, tlsload, t, size, b.a.warmup, new is True, h2=new == "h2")
    for r in range(b.a.rounds):
        for key, size, new in runs:
            for t in order:
                rec = b.measured(key, t, r, lambda: measure_tls(b, tlsload, t, size, b.a.duration, new is True,
                                                                h2=new == "h2"))
                blocks[key][t.name].append(rec)
                if rec.get("first_error") and rec.get("errors"):
                    log(f"  first error: {rec['first_error'][:200]}")
    for key, _, _ in runs:
        blocks[key]["info"] = info
        b.results["measurements"][key] = blocks[key]
    for t in order:
        if not t.is_direct and t.proc is not None:
            b.procs.stop(t.proc)
