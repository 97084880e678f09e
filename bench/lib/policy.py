"""Measurement 4: a datamode-proxy configuration with 1,000 rules and 10,000 variants, and a URL mix
that is forwarded, rejected and rewritten under `constrained`.

URL classes (all on the origin, which answers any path with the 1 KiB file):
  forwarded  http://O/pub/f<i>.bin    no rule applies -> allow-constrained true -> forwarded
  rejected   http://O/video/v<i>.mp4  rule "video" sets allow-constrained false, no variant -> 403 constrained
  rewritten  http://O/img/i<i>.jpg    rule "img" sets allow-constrained false, an exact variant
                                       maps it to http://O/small/i<i>.jpg -> forwarded there (Data-Mode-Variant)
The 998 decoy rules come first, so every request walks the whole rule list (the worst case for a linear
scan); half of them are host globs, half path globs that share the request's host. The 10,000 variants
are 9,400 exact decoys and 500 glob decoys on other hosts, plus the 100 real exact variants.
"""
import json

N_RULES = 1000
N_VARIANTS = 10000
N_REAL_VARIANTS = 100
N_GLOB_DECOYS = 500
MIX = {"forwarded": 200, "rejected": 100, "rewritten": 100}  # one cycle of 400 URLs, 2:1:1
# The sessions variant: this many live sessions (all `constrained`, the global mode `normal`), one per request in turn.
N_SESSIONS = 1000
SESSIONS_YAML = "sessions: {enabled: true, idle-expiry: 24h}\n"


def _q(s):
    return json.dumps(s)  # a JSON string is a valid YAML double-quoted scalar


def urls(origin):
    """[(class, url)] for one cycle, interleaved f, r, f, w, ... so any window is a fair mix."""
    fwd = [f"http://{origin}/pub/f{i}.bin" for i in range(MIX["forwarded"])]
    rej = [f"http://{origin}/video/v{i}.mp4" for i in range(MIX["rejected"])]
    rw = [f"http://{origin}/img/i{i % N_REAL_VARIANTS}.jpg" for i in range(MIX["rewritten"])]
    out = []
    for i in range(MIX["rejected"]):
        out += [("forwarded", fwd[2 * i]), ("rejected", rej[i]), ("forwarded", fwd[2 * i + 1]), ("rewritten", rw[i])]
    return out


def config_yaml(base_yaml, origin):
    """base_yaml: the common datamode config text (listen, threads, log...). Returns the full YAML."""
    lines = [base_yaml.rstrip("\n"), "rules:"]
    decoys = N_RULES - 2
    for n in range(decoys):
        if n % 2 == 0:
            m = f"{{host: {_q(f'*.decoy-{n}.example')}}}"
        else:
            m = f"{{path: {_q(f'/nomatch-{n}/*')}}}"
        lines.append(f"  - {{name: {_q(f'decoy-{n}')}, match: {m}, tags: {{allow-constrained: false}}}}")
    lines.append("  - {name: video, match: {path: \"/video/*\"}, tags: {allow-constrained: false}}")
    lines.append("  - {name: img, match: {path: \"/img/*\"}, tags: {allow-constrained: false}}")
    lines.append("variants:")
    n_exact_decoys = N_VARIANTS - N_REAL_VARIANTS - N_GLOB_DECOYS
    for n in range(n_exact_decoys):
        lines.append(f"  - {{id: {_q(f'x{n}')}, match: {_q(f'http://d{n}.example/p/{n}.jpg')}, "
                     f"target: {_q(f'http://d{n}.example/p/{n}-small.jpg')}}}")
    for n in range(N_GLOB_DECOYS):
        lines.append(f"  - {{id: {_q(f'g{n}')}, match: {_q(f'http://g{n}.example/*/*.jpg')}, "
                     f"target: {_q(f'http://g{n}.example/$1/$2-small.jpg')}}}")
    for i in range(N_REAL_VARIANTS):
        lines.append(f"  - {{id: {_q(f'img-{i}')}, match: {_q(f'http://{origin}/img/i{i}.jpg')}, "
                     f"target: {_q(f'http://{origin}/small/i{i}.jpg')}}}")
    return "\n".join(lines) + "\n"
