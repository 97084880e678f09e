"""Measurement 7, page weight (SPEC §13 images): a fixed set of generated images fetched through datamode-proxy
in normal mode and in constrained mode with images.transcode {when: constrained, max-width: 800, quality: 60}.

Reports bytes saved (per image, median and total), images transcoded per proxy CPU-second, the latency a
transcode adds (paired per image: constrained minus normal, p50/p99), and the 1 KiB throughput of untouched
traffic through the constrained instance alone and while images are being transcoded beside it."""
import io
import random
import socket
import statistics
import threading
import time

# (file, Pillow format, width, height, encoder quality): photos as a CMS would serve them, screenshots/PNG art,
# WebP already; sizes from a thumbnail to a phone photo. Fixed seeds: the same bytes on every run.
IMAGES = [
    ("photo-640.jpg", "JPEG", 640, 480, 85), ("photo-1280.jpg", "JPEG", 1280, 960, 85),
    ("photo-2048.jpg", "JPEG", 2048, 1536, 85), ("photo-3000.jpg", "JPEG", 3000, 2000, 90),
    ("photo-4032.jpg", "JPEG", 4032, 3024, 90),
    ("shot-1280.png", "PNG", 1280, 800, None), ("art-1600.png", "PNG", 1600, 1200, None),
    ("hero-1920.webp", "WEBP", 1920, 1080, 80), ("card-1200.webp", "WEBP", 1200, 900, 80),
    ("banner-2400.jpg", "JPEG", 2400, 800, 80),
]
YAML = "\nimages:\n  transcode: {when: constrained, max-width: 800, quality: 60, format: auto}\n"
ACCEPT = "image/avif,image/webp,image/apng,image/*,*/*;q=0.8"   # what Chrome sends for <img>


def generate(docroot):
    """Writes IMAGES into docroot/img (Debian's Pillow, python3-pil): smooth gradients, shapes and fine noise,
    which resize and compress like photographs do."""
    from PIL import Image, ImageDraw
    import os
    os.makedirs(os.path.join(docroot, "img"), exist_ok=True)
    sizes = {}
    for i, (name, fmt, w, h, q) in enumerate(IMAGES):
        rnd = random.Random(1000 + i)
        img = Image.linear_gradient("L").resize((w, h)).convert("RGB")
        radial = Image.radial_gradient("L").resize((w, h))
        img = Image.merge("RGB", (img.getchannel(0), radial, img.getchannel(0).transpose(Image.Transpose.FLIP_LEFT_RIGHT)))
        draw = ImageDraw.Draw(img)
        for _ in range(60):
            x, y, s = rnd.randrange(w), rnd.randrange(h), rnd.randrange(8, max(9, min(w, h) // 3))
            draw.ellipse((x, y, x + s, y + s), fill=(rnd.randrange(256), rnd.randrange(256), rnd.randrange(256)))
        img = Image.blend(img, Image.effect_noise((w, h), 20).convert("RGB"), 0.10)
        out = io.BytesIO()
        if q is None:
            img.save(out, fmt)
        else:
            img.save(out, fmt, quality=q)
        with open(os.path.join(docroot, "img", name), "wb") as f:
            f.write(out.getvalue())
        sizes[name] = len(out.getvalue())
    return sizes


def fetch(port, url, host, accept=ACCEPT, timeout=60):
    """One GET through the proxy on a fresh connection: (status, headers, body length, seconds)."""
    start = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(f"GET {url} HTTP/1.1\r\nHost: {host}\r\nAccept: {accept}\r\nConnection: close\r\n\r\n".encode())
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
        length = int(headers.get("content-length", "-1")) if headers.get("content-length", "").isdigit() else None
        received = len(body)
        while length is None or received < length:
            chunk = s.recv(262144)
            if not chunk:
                break
            received += len(chunk)
    try:
        status = int(lines[0].split()[1])
    except (IndexError, ValueError):
        status = 0
    return status, headers, received, time.perf_counter() - start


def percentile(values, p):
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, max(0, int(round(p / 100 * (len(values) - 1)))))]


class Load:
    """Fetches the images in a loop from `threads` threads (unique query strings: no cache hits) until stopped."""

    def __init__(self, port, host, threads):
        self.port, self.host, self.threads = port, host, threads
        self.stop_flag = threading.Event()
        self.count = 0
        self.lock = threading.Lock()
        self.workers = []

    def start(self):
        def loop(k):
            n = 0
            while not self.stop_flag.is_set():
                name = IMAGES[(k + n) % len(IMAGES)][0]
                try:
                    fetch(self.port, f"http://{self.host}/img/{name}?load={k}-{n}", self.host)
                    with self.lock:
                        self.count += 1
                except OSError:
                    time.sleep(0.05)
                n += 1
        self.workers = [threading.Thread(target=loop, args=(k,), daemon=True) for k in range(self.threads)]
        for w in self.workers:
            w.start()

    def stop(self):
        self.stop_flag.set()
        for w in self.workers:
            w.join(timeout=70)
