/*
 * memload: the mixed-connection load of bench/memory.py (many concurrent connections of several kinds at once,
 * which wrk cannot do: one request pattern per run, and no CONNECT).
 *
 * One thread, epoll, non-blocking sockets. -c connections to --proxy, each of one kind (by --mix weights, in a
 * fixed interleaving so the mix is the same on every run), all kept busy until -d seconds have passed:
 *   small     GET http://ORIGIN/1k.bin, keep-alive, again and again;
 *   download  GET http://ORIGIN/1m.bin (about 1 MiB), keep-alive, again and again;
 *   upload    POST http://ORIGIN/upload with a 1 MiB body (the origin answers a few bytes), keep-alive;
 *   connect   CONNECT ORIGIN, then GET /1m.bin inside the tunnel, again and again.
 * A response must be 200 with a Content-Length (the origin is nginx); a connection the server closes is counted and
 * opened again. Every response is read whole at full speed (this is a client that keeps up: what the proxy holds
 * is what it chose to hold). Prints one line: BENCH_JSON {...} (exchanges and bytes by kind, errors by kind).
 *
 * Built by bench/memory.py: cc -O2 memload.c -o memload
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
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum kind { K_SMALL, K_DOWNLOAD, K_UPLOAD, K_CONNECT, K_KINDS };
static const char *kind_names[K_KINDS] = {"small", "download", "upload", "connect"};
enum { E_CONNECT, E_CLOSED, E_STATUS, E_PARSE, E_KINDS };
static const char *error_names[E_KINDS] = {"connect", "closed", "status", "parse"};

#define UPLOAD_SIZE (1 << 20)
#define HEAD_MAX 8192

typedef struct conn {
    int fd;
    enum kind kind;
    int connecting;         /* the TCP connect is under way */
    int tunnel_open;        /* connect: the CONNECT was answered 200 */
    int tunnel_head;        /* connect: this exchange is the CONNECT itself (a head, no body) */
    const char *out;        /* the request head being sent */
    size_t out_len, out_off;
    size_t body_left;       /* upload: body bytes still to send after the head */
    int receiving;          /* the response is not read whole yet */
    int in_body;            /* its head is read; content_left bytes of body to go */
    char head[HEAD_MAX];
    size_t head_len;
    long long content_left;
} conn;

static struct sockaddr_in proxy_addr;
static char origin[64];
static int epfd;
static char req[K_KINDS][512], tunnel_req[512], connect_req[256];
static size_t req_len[K_KINDS], tunnel_req_len, connect_req_len;
static char *upload_body;
static uint64_t exchanges[K_KINDS], bytes_in[K_KINDS], errors[E_KINDS], errors_by_kind[K_KINDS], reconnects;
static char first_error[256];
static int stopping;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void fail(enum kind kind, int what, const char *detail) {
    errors[what]++;
    errors_by_kind[kind]++;
    if (!first_error[0]) snprintf(first_error, sizeof first_error, "%s %s: %s", kind_names[kind], error_names[what], detail);
}

static void watch(conn *c, int op) {
    uint32_t events = EPOLLIN;
    if (c->connecting || c->out_off < c->out_len || c->body_left > 0) events |= EPOLLOUT;
    struct epoll_event ev = {.events = events, .data.ptr = c};
    epoll_ctl(epfd, op, c->fd, &ev);
}

static void start_request(conn *c) {
    c->tunnel_head = c->kind == K_CONNECT && !c->tunnel_open;
    if (c->tunnel_head) {
        c->out = connect_req, c->out_len = connect_req_len;
    } else if (c->kind == K_CONNECT) {
        c->out = tunnel_req, c->out_len = tunnel_req_len;
    } else {
        c->out = req[c->kind], c->out_len = req_len[c->kind];
    }
    c->out_off = 0;
    c->body_left = c->kind == K_UPLOAD && !c->tunnel_head ? UPLOAD_SIZE : 0;
    c->receiving = 1;
    c->in_body = 0;
    c->head_len = 0;
    c->content_left = 0;
    watch(c, EPOLL_CTL_MOD);
}

static void open_conn(conn *c) {
    c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c->fd < 0) {
        fprintf(stderr, "memload: socket: %s (raise ulimit -n)\n", strerror(errno));
        exit(2);
    }
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    c->tunnel_open = 0;
    c->connecting = 1;
    c->out_off = c->out_len = c->body_left = 0;
    if (connect(c->fd, (struct sockaddr *)&proxy_addr, sizeof proxy_addr) < 0 && errno != EINPROGRESS) {
        fail(c->kind, E_CONNECT, strerror(errno));
    }
    watch(c, EPOLL_CTL_ADD);
}

static void reopen(conn *c, int what, const char *detail) {
    fail(c->kind, what, detail);
    epoll_ctl(epfd, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    c->fd = -1;
    if (stopping) return;
    reconnects++;
    open_conn(c);
}

/* The exchange is over when the request is sent whole and the response read whole (an upload's answer may come
   before its body is all sent). */
static void maybe_finished(conn *c) {
    if (c->receiving || c->out_off < c->out_len || c->body_left > 0) return;
    if (c->tunnel_head) c->tunnel_open = 1; else exchanges[c->kind]++;
    start_request(c);
}

/* c->head holds a whole head of `end` bytes: 0, or an error kind with a detail. */
static int parse_head(conn *c, size_t end, char *detail, size_t size) {
    if (end < 12 || strncmp(c->head, "HTTP/1.", 7) != 0) {
        snprintf(detail, size, "not HTTP (%s)", kind_names[c->kind]);
        return E_PARSE;
    }
    int status = atoi(c->head + 9);
    if (status != 200) {
        snprintf(detail, size, "status %d (%s)", status, kind_names[c->kind]);
        return E_STATUS;
    }
    c->content_left = c->tunnel_head ? 0 : -1;
    const char *p = c->head, *stop = c->head + end;
    while (p < stop) {
        const char *eol = memmem(p, stop - p, "\r\n", 2);
        if (!eol) break;
        if (eol - p > 15 && strncasecmp(p, "Content-Length:", 15) == 0) c->content_left = atoll(p + 15);
        p = eol + 2;
    }
    if (c->content_left < 0) {
        snprintf(detail, size, "no Content-Length (%s)", kind_names[c->kind]);
        return E_PARSE;
    }
    return -1;
}

/* Reads what is there; returns -1 when the connection was reopened. */
static int on_read(conn *c) {
    static char buf[262144];
    for (;;) {
        ssize_t n = read(c->fd, buf, sizeof buf);
        if (n == 0) {
            reopen(c, E_CLOSED, c->receiving ? "closed mid-response" : "closed between exchanges");
            return -1;
        }
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
            reopen(c, E_CLOSED, strerror(errno));
            return -1;
        }
        bytes_in[c->kind] += n;
        size_t off = 0;
        while (off < (size_t)n) {
            if (!c->receiving) {
                reopen(c, E_PARSE, "bytes after the response");
                return -1;
            }
            if (!c->in_body) {
                size_t take = (size_t)n - off;
                if (take > HEAD_MAX - 1 - c->head_len) take = HEAD_MAX - 1 - c->head_len;
                size_t before = c->head_len;
                memcpy(c->head + c->head_len, buf + off, take);
                c->head_len += take;
                char *blank = memmem(c->head, c->head_len, "\r\n\r\n", 4);
                if (!blank) {
                    if (c->head_len >= HEAD_MAX - 1) { reopen(c, E_PARSE, "head too long"); return -1; }
                    off += take;
                    continue;
                }
                size_t end = (size_t)(blank - c->head) + 4;
                char detail[96];
                int error = parse_head(c, end, detail, sizeof detail);
                if (error >= 0) { reopen(c, error, detail); return -1; }
                off += end - before;
                c->in_body = 1;
            } else {
                size_t take = (size_t)n - off;
                if ((long long)take > c->content_left) take = (size_t)c->content_left;
                c->content_left -= take;
                off += take;
            }
            if (c->in_body && c->content_left == 0) {
                c->receiving = 0;
                maybe_finished(c);
            }
        }
    }
}

static void on_write(conn *c) {
    while (c->out_off < c->out_len || c->body_left > 0) {
        ssize_t n;
        if (c->out_off < c->out_len) {
            n = write(c->fd, c->out + c->out_off, c->out_len - c->out_off);
        } else {
            size_t chunk = c->body_left > 262144 ? 262144 : c->body_left;
            n = write(c->fd, upload_body, chunk);
        }
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) return;
            reopen(c, E_CLOSED, strerror(errno));
            return;
        }
        if (c->out_off < c->out_len) c->out_off += (size_t)n; else c->body_left -= (size_t)n;
    }
    watch(c, EPOLL_CTL_MOD);
    maybe_finished(c);
}

int main(int argc, char **argv) {
    const char *proxy = NULL;
    int n = 100;
    double duration = 10;
    int weights[K_KINDS] = {4, 2, 2, 2};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--proxy") && i + 1 < argc) proxy = argv[++i];
        else if (!strcmp(argv[i], "--origin") && i + 1 < argc) snprintf(origin, sizeof origin, "%s", argv[++i]);
        else if (!strcmp(argv[i], "-c") && i + 1 < argc) n = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-d") && i + 1 < argc) duration = atof(argv[++i]);
        else if (!strcmp(argv[i], "--mix") && i + 1 < argc) {
            /* small,download,upload,connect weights: 4,2,2,2 */
            if (sscanf(argv[++i], "%d,%d,%d,%d", &weights[0], &weights[1], &weights[2], &weights[3]) != 4) {
                fprintf(stderr, "--mix wants four weights: small,download,upload,connect\n");
                return 2;
            }
        } else {
            fprintf(stderr, "usage: memload --proxy HOST:PORT --origin HOST:PORT [-c N] [-d SECONDS] [--mix S,D,U,C]\n");
            return 2;
        }
    }
    if (!proxy || !origin[0]) {
        fprintf(stderr, "--proxy and --origin are required\n");
        return 2;
    }
    char host[64];
    snprintf(host, sizeof host, "%s", proxy);
    char *colon = strrchr(host, ':');
    if (!colon) return 2;
    *colon = 0;
    proxy_addr.sin_family = AF_INET;
    proxy_addr.sin_port = htons(atoi(colon + 1));
    inet_pton(AF_INET, host, &proxy_addr.sin_addr);

    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    if (rl.rlim_cur < (rlim_t)n + 100) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }

    req_len[K_SMALL] = snprintf(req[K_SMALL], sizeof req[0], "GET http://%s/1k.bin HTTP/1.1\r\nHost: %s\r\n\r\n", origin, origin);
    req_len[K_DOWNLOAD] = snprintf(req[K_DOWNLOAD], sizeof req[0], "GET http://%s/1m.bin HTTP/1.1\r\nHost: %s\r\n\r\n", origin, origin);
    req_len[K_UPLOAD] = snprintf(req[K_UPLOAD], sizeof req[0],
                                 "POST http://%s/upload HTTP/1.1\r\nHost: %s\r\nContent-Type: application/octet-stream\r\n"
                                 "Content-Length: %d\r\n\r\n", origin, origin, UPLOAD_SIZE);
    connect_req_len = snprintf(connect_req, sizeof connect_req, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", origin, origin);
    tunnel_req_len = snprintf(tunnel_req, sizeof tunnel_req, "GET /1m.bin HTTP/1.1\r\nHost: %s\r\n\r\n", origin);
    upload_body = malloc(262144);
    for (int i = 0; i < 262144; i++) upload_body[i] = (char)(i * 131 + 7);

    epfd = epoll_create1(EPOLL_CLOEXEC);
    conn *conns = calloc(n, sizeof(conn));
    int total = 0;
    for (int k = 0; k < K_KINDS; k++) total += weights[k];
    for (int i = 0; i < n; i++) {
        /* a fixed interleaving: connection i gets kind by i mod total against the cumulative weights */
        int slot = i % total, k = 0;
        while (slot >= weights[k]) slot -= weights[k++];
        conns[i].kind = (enum kind)k;
        open_conn(&conns[i]);
    }
    double t0 = now(), deadline = t0 + duration;
    struct epoll_event events[512];
    while (now() < deadline) {
        int got = epoll_wait(epfd, events, 512, 100);
        for (int i = 0; i < got; i++) {
            conn *c = events[i].data.ptr;
            if (c->fd < 0) continue;
            if (c->connecting) {
                int err = 0;
                socklen_t len = sizeof err;
                getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len);
                if (err) { reopen(c, E_CONNECT, strerror(err)); continue; }
                c->connecting = 0;
                start_request(c);
                continue;
            }
            if (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
                if (on_read(c) < 0) continue;
            }
            if (events[i].events & EPOLLOUT) on_write(c);
        }
    }
    stopping = 1;
    double elapsed = now() - t0;
    for (int i = 0; i < n; i++) {
        if (conns[i].fd >= 0) close(conns[i].fd);
    }
    printf("BENCH_JSON {\"connections\": %d, \"duration_s\": %.2f, \"reconnects\": %llu, \"exchanges\": {", n, elapsed,
           (unsigned long long)reconnects);
    for (int k = 0; k < K_KINDS; k++) printf("%s\"%s\": %llu", k ? ", " : "", kind_names[k], (unsigned long long)exchanges[k]);
    printf("}, \"bytes_in\": {");
    for (int k = 0; k < K_KINDS; k++) printf("%s\"%s\": %llu", k ? ", " : "", kind_names[k], (unsigned long long)bytes_in[k]);
    printf("}, \"errors\": {");
    for (int e = 0; e < E_KINDS; e++) printf("%s\"%s\": %llu", e ? ", " : "", error_names[e], (unsigned long long)errors[e]);
    printf("}, \"errors_by_kind\": {");
    for (int k = 0; k < K_KINDS; k++) printf("%s\"%s\": %llu", k ? ", " : "", kind_names[k], (unsigned long long)errors_by_kind[k]);
    printf("}, \"first_error\": \"");
    for (const char *p = first_error; *p; p++) putchar(*p == '"' || *p == '\\' ? '\'' : *p);
    printf("\"}\n");
    return 0;
}
