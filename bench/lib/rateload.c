/*
 * rateload: HTTP/1.1 keep-alive GETs at a fixed rate (open loop), for latency at the same load through every proxy.
 *
 * wrk keeps each of its connections busy (closed loop): a proxy that answers faster is sent more, so its p99 is
 * taken at a higher request rate than a slower peer's, with the client's core (wrk and the origin share it) closer to
 * saturation. Here request k is due at start + k/rate on connection k mod C, whatever came back; one request is in
 * flight per connection (as wrk), a due request waits for its connection, and its latency counts from when it was due,
 * not from when it went out (the queueing a slow answer causes is in the figure: no coordinated omission).
 *
 *   rateload --connect HOST:PORT --path PATH [--host HOST] [-c CONNECTIONS] --rate PER_SECOND [-d SECONDS]
 *            [--warmup SECONDS]
 *
 * PATH is the request target as sent: an absolute URL through a proxy, /path direct. Every answer must be 200 with
 * a Content-Length (the bench's fixed files). Prints one line: BENCH_JSON {...} (latencies in microseconds over the
 * requests due after the warm-up; requests not answered within 2 s of the end count as errors).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define QUEUE 4096 /* due requests a connection can hold; past that the proxy is far over the rate: an error */

typedef struct {
    int fd;
    uint64_t due[QUEUE];
    int head, count;          /* due times waiting, the first in flight when busy */
    int busy;
    char buf[65536];
    size_t have;
    long need;                /* bytes of the answer in all, once its head is read; -1 before */
} conn_t;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void die(const char *what) {
    perror(what);
    exit(2);
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static char request[4096];
static size_t request_len;
static uint64_t *lat;
static size_t lat_n, lat_cap;
static uint64_t measure_from, measure_to;
static long errors_status, errors_io, errors_overflow, answered, bytes_in;

static void send_next(conn_t *c) {
    if (c->busy || c->count == 0) return;
    ssize_t n = send(c->fd, request, request_len, MSG_NOSIGNAL);
    if (n != (ssize_t)request_len) {
        fprintf(stderr, "rateload: send: %s\n", n < 0 ? strerror(errno) : "short write");
        exit(2);
    }
    c->busy = 1;
    c->have = 0;
    c->need = -1;
}

/* Length of the whole answer once its head is in buf, or -1 while it is not; -2 for an answer that is not a 200
   with a Content-Length. */
static long answer_length(conn_t *c) {
    char *end = memmem(c->buf, c->have, "\r\n\r\n", 4);
    if (!end) return c->have >= sizeof c->buf ? -2 : -1;
    size_t head = (size_t)(end - c->buf) + 4;
    if (c->have < 12 || memcmp(c->buf, "HTTP/1.1 200", 12) != 0) return -2;
    for (char *p = c->buf; p < end; ) {
        char *eol = memmem(p, (size_t)(end - p) + 2, "\r\n", 2);
        if (!eol) break;
        if ((size_t)(eol - p) > 15 && strncasecmp(p, "content-length:", 15) == 0) return (long)head + atol(p + 15);
        p = eol + 2;
    }
    return -2;
}

static void readable(conn_t *c) {
    for (;;) {
        if (!c->busy) {
            char sink[256];
            ssize_t n = recv(c->fd, sink, sizeof sink, 0);
            if (n == 0 || (n < 0 && errno != EAGAIN)) { fprintf(stderr, "rateload: the server closed a connection between answers (no keep-alive?)\n"); exit(2); }
            if (n > 0) { fprintf(stderr, "rateload: bytes nobody asked for\n"); exit(2); }
            return;
        }
        size_t room = sizeof c->buf - c->have;
        if (c->need >= 0) room = sizeof c->buf; /* the body is counted, not kept */
        ssize_t n = recv(c->fd, c->need >= 0 ? c->buf : c->buf + c->have, room, 0);
        if (n < 0 && errno == EAGAIN) return;
        if (n <= 0) { fprintf(stderr, "rateload: the connection ended before an answer was whole: %s\n", n < 0 ? strerror(errno) : "closed by the server"); exit(2); }
        bytes_in += n;
        if (c->need < 0) {
            c->have += (size_t)n;
            long len = answer_length(c);
            if (len == -2) { errors_status++; fprintf(stderr, "rateload: not a 200 with a length: %.40s\n", c->buf); exit(2); }
            if (len == -1) continue;
            c->need = len;
        } else {
            c->have += (size_t)n;
        }
        if ((long)c->have > c->need) { fprintf(stderr, "rateload: more bytes than the answer's length\n"); exit(2); }
        if ((long)c->have == c->need) {
            uint64_t due = c->due[c->head];
            uint64_t t = now_ns();
            if (due >= measure_from && due < measure_to) {
                if (lat_n == lat_cap) { lat_cap = lat_cap ? lat_cap * 2 : 1 << 16; lat = realloc(lat, lat_cap * sizeof *lat); }
                lat[lat_n++] = (t - due) / 1000;
            }
            answered++;
            c->head = (c->head + 1) % QUEUE;
            c->count--;
            c->busy = 0;
            send_next(c);
            if (!c->busy) return;
        }
    }
}

int main(int argc, char **argv) {
    const char *connect_to = NULL, *path = NULL, *host = "127.0.0.1";
    int conns = 50;
    double rate = 0, duration = 10, warmup = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) { fprintf(stderr, "rateload: %s needs a value\n", a); return 2; }
        if (!strcmp(a, "--connect")) connect_to = v;
        else if (!strcmp(a, "--path")) path = v;
        else if (!strcmp(a, "--host")) host = v;
        else if (!strcmp(a, "-c")) conns = atoi(v);
        else if (!strcmp(a, "--rate")) rate = atof(v);
        else if (!strcmp(a, "-d")) duration = atof(v);
        else if (!strcmp(a, "--warmup")) warmup = atof(v);
        else { fprintf(stderr, "rateload: unknown argument %s\n", a); return 2; }
        i++;
    }
    if (!connect_to || !path || !(rate > 0 && rate <= 1e7) || conns <= 0 || conns > 10000 || duration <= 0 || warmup < 0) {
        fprintf(stderr, "usage: rateload --connect HOST:PORT --path PATH [--host HOST] [-c N (1-10000)] --rate R (up to 1e7/s) "
                        "[-d S] [--warmup S]\n");
        return 2;
    }
    char addr_s[64];
    const char *colon = strrchr(connect_to, ':');
    if (!colon || (size_t)(colon - connect_to) >= sizeof addr_s) { fprintf(stderr, "rateload: --connect HOST:PORT\n"); return 2; }
    memcpy(addr_s, connect_to, (size_t)(colon - connect_to));
    addr_s[colon - connect_to] = 0;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
    if (inet_pton(AF_INET, addr_s, &sa.sin_addr) != 1) { fprintf(stderr, "rateload: bad address %s\n", addr_s); return 2; }
    request_len = (size_t)snprintf(request, sizeof request, "GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", path, host);

    int ep = epoll_create1(0);
    conn_t *cs = calloc((size_t)conns, sizeof *cs);
    for (int i = 0; i < conns; i++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0) die("socket");
        if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) die("connect");
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        fcntl(fd, F_SETFL, O_NONBLOCK);
        cs[i].fd = fd;
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &cs[i]};
        if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) != 0) die("epoll_ctl");
    }

    uint64_t start = now_ns() + 1000000, step = (uint64_t)(1e9 / rate);
    measure_from = start + (uint64_t)(warmup * 1e9);
    measure_to = measure_from + (uint64_t)(duration * 1e9);
    uint64_t k = 0, grace_end = measure_to + 2000000000ull;
    struct epoll_event evs[256];
    for (;;) {
        uint64_t t = now_ns();
        while (t < measure_to) {
            uint64_t due = start + k * step;
            if (due > t) break;
            conn_t *c = &cs[k % (uint64_t)conns];
            if (c->count == QUEUE) { errors_overflow++; } else {
                c->due[(c->head + c->count) % QUEUE] = due;
                c->count++;
                send_next(c);
            }
            k++;
        }
        int pending = 0;
        for (int i = 0; i < conns; i++) pending += cs[i].count;
        if (t >= measure_to && (pending == 0 || t >= grace_end)) break;
        uint64_t next = t >= measure_to ? grace_end : start + k * step;
        uint64_t wait = next > t ? next - t : 0;
        struct timespec ts = {.tv_sec = (time_t)(wait / 1000000000ull), .tv_nsec = (long)(wait % 1000000000ull)};
        int n = epoll_pwait2(ep, evs, 256, &ts, NULL);
        if (n < 0 && errno != EINTR) die("epoll_pwait2");
        for (int i = 0; i < n; i++) readable(evs[i].data.ptr);
    }
    long unanswered = 0;
    for (int i = 0; i < conns; i++) unanswered += cs[i].count;
    qsort(lat, lat_n, sizeof *lat, cmp_u64);
#define PCT(p) (lat_n ? lat[(size_t)((p) * (double)(lat_n - 1))] : 0)
    printf("BENCH_JSON {\"rate\": %.0f, \"connections\": %d, \"duration_us\": %.0f, \"requests\": %zu, \"answered_all\": %ld, "
           "\"bytes\": %ld, \"errors\": {\"status\": %ld, \"io\": %ld, \"overflow\": %ld, \"unanswered\": %ld}, "
           "\"lat_p50_us\": %lu, \"lat_p90_us\": %lu, \"lat_p99_us\": %lu, \"lat_p999_us\": %lu, \"lat_max_us\": %lu}\n",
           rate, conns, duration * 1e6, lat_n, answered, bytes_in, errors_status, errors_io, errors_overflow, unanswered,
           (unsigned long)PCT(0.50), (unsigned long)PCT(0.90), (unsigned long)PCT(0.99), (unsigned long)PCT(0.999),
           (unsigned long)(lat_n ? lat[lat_n - 1] : 0));
    return 0;
}
