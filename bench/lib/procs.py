"""Process bookkeeping for the bench: start, pin, measure (/proc) and stop exactly what we started.

Everything the bench starts goes through Procs.start(), which records the PID. Procs.stop_all()
signals those PIDs (and, for multi-process servers, the descendants found for those PIDs in /proc),
never anything found by name.
"""
import os
import signal
import socket
import subprocess
import sys
import time

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


# ---------------------------------------------------------------- /proc readers

def _stat_fields(pid):
    with open(f"/proc/{pid}/stat", "rb") as f:
        data = f.read().decode()
    # comm may contain spaces/parens: split after the last ')'
    rest = data[data.rindex(")") + 2:].split()
    return rest  # rest[0] is field 3 (state)


def ppid_of(pid):
    try:
        return int(_stat_fields(pid)[1])
    except (OSError, ValueError, IndexError):
        return None


def descendants(pid):
    """PIDs of all live descendants of pid (children, grandchildren, ...)."""
    children = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        p = ppid_of(int(name))
        if p is not None:
            children.setdefault(p, []).append(int(name))
    out, todo = [], [pid]
    while todo:
        cur = todo.pop()
        for c in children.get(cur, []):
            out.append(c)
            todo.append(c)
    return out


def tree(pid):
    return [pid] + descendants(pid)


def cpu_ticks(pids):
    """utime+stime (all threads) of the given processes, in clock ticks; vanished PIDs count 0."""
    total = 0
    for pid in pids:
        try:
            f = _stat_fields(pid)
            total += int(f[11]) + int(f[12])  # fields 14 (utime) and 15 (stime)
        except (OSError, ValueError, IndexError):
            pass
    return total


def kernel_ticks(pids):
    """stime (all threads) of the given processes, in clock ticks: the part of cpu_ticks spent in the kernel."""
    total = 0
    for pid in pids:
        try:
            total += int(_stat_fields(pid)[12])  # field 15 (stime)
        except (OSError, ValueError, IndexError):
            pass
    return total


def all_process_ticks():
    """{pid: (comm, utime+stime ticks)} for every process now."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                data = f.read().decode("utf-8", "replace")
            comm = data[data.index("(") + 1:data.rindex(")")]
            rest = data[data.rindex(")") + 2:].split()
            out[int(name)] = (comm, int(rest[11]) + int(rest[12]))
        except (OSError, ValueError, IndexError):
            pass
    return out


def busiest_others(before, after, exclude, wall, top=3):
    """[(comm, % of one core)] of the processes (not in exclude) that used the most CPU between two
    all_process_ticks() snapshots, summed by command name. Processes that came and went in between are
    not seen here (the subtraction from /proc/stat still counts them)."""
    by = {}
    for pid, (comm, ticks) in after.items():
        if pid in exclude:
            continue
        d = ticks - before.get(pid, (comm, 0))[1]
        if d > 0:
            by[comm] = by.get(comm, 0) + d
    ranked = sorted(by.items(), key=lambda kv: -kv[1])[:top]
    return [(c, round(100 * t / CLK_TCK / wall, 1)) for c, t in ranked if wall > 0]


def cpu_seconds(pids):
    return cpu_ticks(pids) / CLK_TCK


def rss_kib(pids):
    """Sum of VmRSS (KiB) over the given processes."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
                        break
        except OSError:
            pass
    return total


def system_cpu():
    """/proc/stat aggregate: (busy seconds, dict of columns in seconds). busy = user+nice+system+irq+softirq."""
    with open("/proc/stat") as f:
        first = f.readline().split()
    names = ["user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal", "guest", "guest_nice"]
    vals = {n: int(v) / CLK_TCK for n, v in zip(names, first[1:])}
    busy = vals["user"] + vals["nice"] + vals["system"] + vals["irq"] + vals["softirq"]
    return busy, vals


def per_cpu_busy():
    """{cpu index: busy seconds} from /proc/stat."""
    out = {}
    with open("/proc/stat") as f:
        for line in f:
            parts = line.split()
            if parts and parts[0].startswith("cpu") and parts[0] != "cpu":
                v = [int(x) for x in parts[1:]]
                out[int(parts[0][3:])] = (v[0] + v[1] + v[2] + v[5] + v[6]) / CLK_TCK
    return out


def _live_orphan_or_child(pid, parent):
    """True if pid still runs (not a zombie) and is parent's child or was orphaned by it."""
    try:
        f = _stat_fields(pid)
    except (OSError, ValueError, IndexError):
        return False
    return f[0] != "Z" and int(f[1]) in (parent, 1)


# ---------------------------------------------------------------- ports

def free_port():
    """A TCP port on 127.0.0.1 that is free right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_free(port):
    """Nothing listens on 127.0.0.1:port any more (a stopped proxy's port, before it is started again)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return False
    except OSError:
        return True


def wait_listening(port, timeout=15.0, proc=None):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            return False
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.05)
    return False


# ---------------------------------------------------------------- start / stop

class Procs:
    """Registry of the processes this bench started (by PID)."""

    def __init__(self, logdir):
        self.logdir = logdir
        self.started = []  # list of (name, Popen)

    def start(self, name, argv, cpu=None, cwd=None, env=None, stdin=subprocess.DEVNULL):
        if cpu is not None:
            argv = ["taskset", "-c", str(cpu)] + list(argv)
        log = open(os.path.join(self.logdir, f"{name}.log"), "ab")
        p = subprocess.Popen(argv, stdin=stdin, stdout=log, stderr=subprocess.STDOUT,
                             cwd=cwd, env=env, start_new_session=True)
        log.close()
        self.started.append((name, p))
        return p

    def stop(self, p, grace=5.0):
        """SIGTERM the PID we started, then SIGKILL it and any descendant still alive after the grace."""
        if p.poll() is not None:
            return
        kids = descendants(p.pid)
        try:
            os.kill(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            p.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            print(f"[bench] pid {p.pid} ({' '.join(map(str, p.args[:4]))}) ignored SIGTERM for {grace:.0f} s: SIGKILL",
                  file=sys.stderr, flush=True)
            try:
                os.kill(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
        # workers of multi-process servers normally exit with their master; make sure
        # (only the PIDs that were this process's descendants a moment ago)
        deadline = time.time() + 2
        for k in kids:
            while time.time() < deadline and _live_orphan_or_child(k, p.pid):
                time.sleep(0.05)
            if _live_orphan_or_child(k, p.pid):
                try:
                    os.kill(k, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def stop_all(self):
        for name, p in reversed(self.started):
            try:
                t0 = time.time()
                self.stop(p)
                if os.environ.get("BENCH_DEBUG"):
                    print(f"[bench] stopped {name} pid {p.pid} in {time.time() - t0:.2f} s", file=sys.stderr, flush=True)
            except Exception:
                pass
        self.started = []
