#!/usr/bin/env python3
"""Idle keep-alive client: opens N connections to ADDR, sends one request on each (so the server has
really set the connection up, including its upstream side), reads the whole response, then keeps
every connection open and idle.

Protocol with the bench runner: prints "READY {json}" once all are set up, then waits for a line on
stdin, closes everything, prints "DONE" and exits. Never runs longer than --max-seconds.
"""
import argparse
import concurrent.futures
import json
import resource
import socket
import sys
import threading
import time


def one(addr, request, timeout):
    s = socket.create_connection(addr, timeout=timeout)
    try:
        s.sendall(request)
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = s.recv(65536)
            if not chunk:
                raise ConnectionError("closed before response head")
            buf += chunk
        head, _, body = buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        length, close = 0, lines[0].startswith("HTTP/1.0")
        for line in lines[1:]:
            k, _, v = line.partition(":")
            k, v = k.strip().lower(), v.strip().lower()
            if k == "content-length":
                length = int(v)
            elif k == "connection":
                close = "close" in v or (close and "keep-alive" not in v)
        while len(body) < length:
            chunk = s.recv(65536)
            if not chunk:
                break
            body += chunk
        return s, status, close
    except Exception:
        s.close()
        raise


def still_open(s):
    try:
        s.setblocking(False)
        data = s.recv(1, socket.MSG_PEEK)
        return data != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--addr", required=True, help="host:port to connect to (proxy, or origin for direct)")
    ap.add_argument("--target", required=True, help="request target (absolute URL for a proxy, /path for direct)")
    ap.add_argument("--host", required=True, help="Host header")
    ap.add_argument("-n", type=int, default=5000)
    ap.add_argument("--concurrency", type=int, default=50)
    ap.add_argument("--max-seconds", type=float, default=120)
    a = ap.parse_args()

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = a.n + 1000
    if soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (max(want, soft), max(want, hard)))
        except (ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    host, port = a.addr.rsplit(":", 1)
    addr = (host, int(port))
    request = f"GET {a.target} HTTP/1.1\r\nHost: {a.host}\r\nUser-Agent: bench-idle\r\n\r\n".encode()

    socks, statuses, errors, server_close = [], {}, [], 0
    lock = threading.Lock()
    t0 = time.time()

    def task(_):
        nonlocal server_close
        try:
            s, status, close = one(addr, request, 30)
        except Exception as e:  # noqa: BLE001 - reported, not fatal
            with lock:
                errors.append(type(e).__name__ + ": " + str(e)[:80])
            return
        with lock:
            socks.append(s)
            statuses[status] = statuses.get(status, 0) + 1
            server_close += close

    with concurrent.futures.ThreadPoolExecutor(max_workers=a.concurrency) as ex:
        list(ex.map(task, range(a.n)))
    setup_s = time.time() - t0
    time.sleep(1.0)
    open_now = sum(1 for s in socks if still_open(s))
    report = {"requested": a.n, "responses": len(socks), "open": open_now, "statuses": statuses,
              "server_said_close": server_close, "errors": len(errors), "first_errors": errors[:3],
              "setup_s": round(setup_s, 2)}
    print("READY " + json.dumps(report), flush=True)

    # wait for the runner (bounded)
    done = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.readline(), done.set()), daemon=True).start()
    done.wait(a.max_seconds)
    for s in socks:
        try:
            s.close()
        except OSError:
            pass
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
