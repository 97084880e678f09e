/*
 * tlsload: the HTTPS load generator of bench/run's `https` measurement (wrk cannot send https through a proxy).
 *
 * N threads, one connection each, blocking sockets: TCP connect to --connect (the proxy, or the origin for the
 * direct row), with --proxy a `CONNECT <target>` first, then a TLS handshake verified against --cafile (the
 * proxy's CA through an intercepting proxy, the origin's CA direct) with the target's IP or name checked as curl
 * does (no SNI for an IP literal), ALPN http/1.1, then GET --path:
 *   keep-alive mode (default): requests one after the other on the connection for --duration seconds;
 *   --new-connections: one request per connection, then close and start over (a full handshake every time:
 *   no session cache, no tickets).
 *   --h2 --streams S: ALPN h2 instead, and S requests in flight on each connection at all times (nghttp2's client
 *   session on the blocking socket), a new one submitted as each completes (SPEC §17's bench row).
 * Every response must be `200` with a Content-Length of --size bytes (otherwise it counts as an error).
 * Prints one line: BENCH_JSON {...} (requests, connections, errors by kind, latency percentiles in µs).
 *
 * Built by bench/lib/bench.py: cc -O2 -pthread tlsload.c -lssl -lcrypto -lnghttp2
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
#include <nghttp2/nghttp2.h>

enum { E_CONNECT, E_PROXY, E_HANDSHAKE, E_WRITE, E_READ, E_STATUS, E_SIZE, E_KINDS };
static const char *error_names[E_KINDS] = {"connect", "proxy", "handshake", "write", "read", "status", "size"};

static struct sockaddr_in connect_addr;
static char target[256], target_host[256], path[1024];
static int use_proxy, new_connections, connections = 10, use_h2, h2_streams = 10;
static double duration = 5;
static long expect_size = -1;
static int target_is_ip;
static SSL_CTX *ctx;
static double deadline;
static char first_error[512];
static atomic_int first_error_taken;

typedef struct {
    pthread_t thread;
    uint64_t requests, conns, bytes;
    uint64_t errors[E_KINDS];
    uint32_t *latencies;
    size_t count, capacity;
} worker;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void note_error(worker *w, int kind, const char *detail) {
    w->errors[kind]++;
    if (!atomic_exchange(&first_error_taken, 1)) {
        unsigned long e = ERR_peek_last_error();
        char ssl[256] = "";
        if (e) ERR_error_string_n(e, ssl, sizeof ssl);
        snprintf(first_error, sizeof first_error, "%s: %s%s%s", error_names[kind], detail, ssl[0] ? " / " : "", ssl);
    }
    ERR_clear_error();
}

static void record(worker *w, double seconds) {
    if (w->count == w->capacity) {
        w->capacity = w->capacity ? w->capacity * 2 : 65536;
        w->latencies = realloc(w->latencies, w->capacity * sizeof *w->latencies);
        if (!w->latencies) { perror("realloc"); exit(2); }
    }
    w->latencies[w->count++] = (uint32_t)(seconds * 1e6);
}

/* Reads from fd (plain, before TLS) until the CONNECT reply's head is complete; 1 when it is a 2xx. */
static int proxy_connect(int fd) {
    char req[600], buf[4096];
    int n = snprintf(req, sizeof req, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target);
    if (send(fd, req, n, MSG_NOSIGNAL) != n) return 0;
    size_t have = 0;
    while (have < sizeof buf - 1) {
        ssize_t r = recv(fd, buf + have, 1, 0);   /* byte by byte: nothing after the head may be consumed */
        if (r <= 0) return 0;
        have += r;
        if (have >= 4 && memcmp(buf + have - 4, "\r\n\r\n", 4) == 0) break;
    }
    buf[have] = 0;
    return strncmp(buf, "HTTP/1.", 7) == 0 && have > 12 && buf[9] == '2';
}

/* One connection up to a verified TLS session; NULL (error counted) otherwise. */
static SSL *open_connection(worker *w, int *fd_out) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) { note_error(w, E_CONNECT, strerror(errno)); return NULL; }
    struct timeval tv = {10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, (struct sockaddr *)&connect_addr, sizeof connect_addr) != 0) {
        note_error(w, E_CONNECT, strerror(errno));
        close(fd);
        return NULL;
    }
    if (use_proxy && !proxy_connect(fd)) {
        note_error(w, E_PROXY, "CONNECT not answered 2xx");
        close(fd);
        return NULL;
    }
    SSL *ssl = SSL_new(ctx);
    X509_VERIFY_PARAM *param = SSL_get0_param(ssl);
    if (target_is_ip) {
        X509_VERIFY_PARAM_set1_ip_asc(param, target_host);
    } else {
        SSL_set_tlsext_host_name(ssl, target_host);
        X509_VERIFY_PARAM_set1_host(param, target_host, 0);
    }
    SSL_set_fd(ssl, fd);
    if (SSL_connect(ssl) != 1) {
        char why[200];
        long v = SSL_get_verify_result(ssl);
        snprintf(why, sizeof why, "TLS handshake failed (verify: %s)", X509_verify_cert_error_string(v));
        note_error(w, E_HANDSHAKE, why);
        SSL_free(ssl);
        close(fd);
        return NULL;
    }
    w->conns++;
    *fd_out = fd;
    return ssl;
}

static void close_connection(SSL *ssl, int fd) {
    SSL_shutdown(ssl);
    SSL_free(ssl);
    close(fd);
}

/* One GET on the session; 1 when a complete 200 of the expected size came back. */
static int exchange(worker *w, SSL *ssl, const char *request, int request_len) {
    static __thread char buf[256 * 1024];
    if (SSL_write(ssl, request, request_len) != request_len) { note_error(w, E_WRITE, "SSL_write"); return 0; }
    size_t have = 0;
    char *end = NULL;
    while (!end) {
        if (have == sizeof buf) { note_error(w, E_READ, "response head too large"); return 0; }
        int r = SSL_read(ssl, buf + have, (int)(sizeof buf - have - 1));
        if (r <= 0) { note_error(w, E_READ, "connection closed or timed out before the response head"); return 0; }
        have += r;
        buf[have] = 0;
        end = strstr(buf, "\r\n\r\n");
    }
    size_t head = (size_t)(end - buf) + 4;
    int status = (have > 12 && strncmp(buf, "HTTP/1.", 7) == 0) ? atoi(buf + 9) : 0;
    long length = -1;
    for (char *line = strstr(buf, "\r\n"); line && line < end; line = strstr(line + 2, "\r\n")) {
        if (strncasecmp(line + 2, "content-length:", 15) == 0) length = strtol(line + 17, NULL, 10);
    }
    if (length < 0) { note_error(w, E_READ, "response without Content-Length"); return 0; }
    size_t body = have - head;
    while (body < (size_t)length) {
        int r = SSL_read(ssl, buf, sizeof buf);
        if (r <= 0) { note_error(w, E_READ, "connection closed or timed out inside the body"); return 0; }
        body += r;
    }
    if (body != (size_t)length) { note_error(w, E_READ, "bytes after the body (not asked for)"); return 0; }
    w->bytes += head + body;
    if (status != 200) {
        char why[64];
        snprintf(why, sizeof why, "status %d", status);
        note_error(w, E_STATUS, why);
        return 0;
    }
    if (expect_size >= 0 && length != expect_size) { note_error(w, E_SIZE, "unexpected body size"); return 0; }
    return 1;
}


/* ---- HTTP/2 (--h2) ---------------------------------------------------------------------------------------- */

typedef struct {
    worker *w;
    SSL *ssl;
    int failed;
    int in_flight;
} h2conn;

typedef struct {
    double start;
    int status;
    long length;
    long bytes;
} h2stream;

static ssize_t h2_send(nghttp2_session *s, const uint8_t *data, size_t length, int flags, void *user) {
    (void)s; (void)flags;
    h2conn *c = user;
    int r = SSL_write(c->ssl, data, (int)length);
    if (r <= 0) { c->failed = 1; return NGHTTP2_ERR_CALLBACK_FAILURE; }
    return r;
}

static int h2_header(nghttp2_session *s, const nghttp2_frame *frame, const uint8_t *name, size_t namelen,
                     const uint8_t *value, size_t valuelen, uint8_t flags, void *user) {
    (void)flags; (void)user;
    if (frame->hd.type != NGHTTP2_HEADERS) return 0;
    h2stream *st = nghttp2_session_get_stream_user_data(s, frame->hd.stream_id);
    if (!st) return 0;
    char text[32];
    size_t n = valuelen < sizeof text - 1 ? valuelen : sizeof text - 1;
    memcpy(text, value, n);
    text[n] = 0;
    if (namelen == 7 && !memcmp(name, ":status", 7)) st->status = atoi(text);
    if (namelen == 14 && !memcmp(name, "content-length", 14)) st->length = atol(text);
    return 0;
}

static int h2_data(nghttp2_session *s, uint8_t flags, int32_t id, const uint8_t *data, size_t len, void *user) {
    (void)flags; (void)data;
    h2conn *c = user;
    h2stream *st = nghttp2_session_get_stream_user_data(s, id);
    if (st) st->bytes += (long)len;
    c->w->bytes += len;
    return 0;
}

static int submit_h2(nghttp2_session *s, h2conn *c);

static int h2_close(nghttp2_session *s, int32_t id, uint32_t error_code, void *user) {
    h2conn *c = user;
    h2stream *st = nghttp2_session_get_stream_user_data(s, id);
    if (!st) return 0;
    c->in_flight--;
    if (error_code) {
        note_error(c->w, E_READ, "stream reset");
    } else if (st->status != 200) {
        char why[64];
        snprintf(why, sizeof why, "status %d", st->status);
        note_error(c->w, E_STATUS, why);
    } else if (st->length < 0 || st->bytes != st->length || (expect_size >= 0 && st->bytes != expect_size)) {
        note_error(c->w, E_SIZE, "unexpected body size");
    } else {
        c->w->requests++;
        record(c->w, now() - st->start);
    }
    free(st);
    if (now() < deadline && !c->failed) submit_h2(s, c);
    return 0;
}

static int submit_h2(nghttp2_session *s, h2conn *c) {
    h2stream *st = calloc(1, sizeof *st);
    st->start = now();
    st->length = -1;
    nghttp2_nv nva[] = {
        {(uint8_t *)":method", (uint8_t *)"GET", 7, 3, NGHTTP2_NV_FLAG_NONE},
        {(uint8_t *)":scheme", (uint8_t *)"https", 7, 5, NGHTTP2_NV_FLAG_NONE},
        {(uint8_t *)":authority", (uint8_t *)target, 10, strlen(target), NGHTTP2_NV_FLAG_NONE},
        {(uint8_t *)":path", (uint8_t *)path, 5, strlen(path), NGHTTP2_NV_FLAG_NONE},
        {(uint8_t *)"user-agent", (uint8_t *)"tlsload", 10, 7, NGHTTP2_NV_FLAG_NONE},
    };
    if (nghttp2_submit_request(s, NULL, nva, 5, NULL, st) < 0) { free(st); return -1; }
    c->in_flight++;
    return 0;
}

/* One h2 connection for as long as the run lasts (or until it fails): S streams in flight. */
static void run_h2_connection(worker *w, SSL *ssl) {
    h2conn c = {w, ssl, 0, 0};
    nghttp2_session_callbacks *cb;
    nghttp2_session_callbacks_new(&cb);
    nghttp2_session_callbacks_set_send_callback(cb, h2_send);
    nghttp2_session_callbacks_set_on_header_callback(cb, h2_header);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, h2_data);
    nghttp2_session_callbacks_set_on_stream_close_callback(cb, h2_close);
    nghttp2_session *s;
    nghttp2_session_client_new(&s, cb, &c);
    nghttp2_session_callbacks_del(cb);
    nghttp2_settings_entry settings[] = {{NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, 100},
                                         {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, 1 << 20}};
    nghttp2_submit_settings(s, NGHTTP2_FLAG_NONE, settings, 2);
    for (int i = 0; i < h2_streams; i++) submit_h2(s, &c);
    static __thread uint8_t buf[64 * 1024];
    while (!c.failed && (now() < deadline || c.in_flight > 0)) {
        if (nghttp2_session_send(s) != 0) { note_error(w, E_WRITE, "nghttp2_session_send"); break; }
        if (c.in_flight == 0) break;
        int r = SSL_read(ssl, buf, sizeof buf);
        if (r <= 0) { note_error(w, E_READ, "connection closed or timed out"); break; }
        if (nghttp2_session_mem_recv(s, buf, (size_t)r) < 0) { note_error(w, E_READ, "nghttp2_session_mem_recv"); break; }
    }
    nghttp2_session_del(s);
}

static void *run(void *arg) {
    worker *w = arg;
    if (use_h2) {
        while (now() < deadline) {
            int fd = -1;
            SSL *ssl = open_connection(w, &fd);
            if (!ssl) { usleep(10000); continue; }
            const unsigned char *chosen = NULL;
            unsigned int chosen_len = 0;
            SSL_get0_alpn_selected(ssl, &chosen, &chosen_len);
            if (chosen_len != 2 || memcmp(chosen, "h2", 2) != 0) {
                note_error(w, E_HANDSHAKE, "the server did not choose h2 (ALPN)");
                close_connection(ssl, fd);
                usleep(10000);
                continue;
            }
            run_h2_connection(w, ssl);
            close_connection(ssl, fd);
        }
        return NULL;
    }
    char request[1500];
    int request_len = snprintf(request, sizeof request,
                               "GET %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: tlsload\r\nAccept: */*\r\n\r\n", path, target);
    SSL *ssl = NULL;
    int fd = -1;
    while (now() < deadline) {
        double start = now();
        if (!ssl) {
            ssl = open_connection(w, &fd);
            if (!ssl) { usleep(10000); continue; }
        }
        int ok = exchange(w, ssl, request, request_len);
        if (ok) {
            w->requests++;
            record(w, now() - start);
        }
        if (!ok || new_connections) {
            close_connection(ssl, fd);
            ssl = NULL;
        }
    }
    if (ssl) close_connection(ssl, fd);
    return NULL;
}

static int compare(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static void usage(void) {
    fprintf(stderr, "usage: tlsload --connect IP:PORT --target HOST:PORT [--proxy] --path /p --cafile F "
                    "[-c N] [-d SECONDS] [--size BYTES] [--new-connections] [--h2 [--streams S]]\n");
    exit(2);
}

int main(int argc, char **argv) {
    const char *connect_to = NULL, *cafile = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--proxy")) use_proxy = 1;
        else if (!strcmp(a, "--h2")) use_h2 = 1;
        else if (!strcmp(a, "--new-connections")) new_connections = 1;
        else if (!v) usage();
        else if (!strcmp(a, "--connect")) connect_to = argv[++i];
        else if (!strcmp(a, "--target")) snprintf(target, sizeof target, "%s", argv[++i]);
        else if (!strcmp(a, "--path")) snprintf(path, sizeof path, "%s", argv[++i]);
        else if (!strcmp(a, "--cafile")) cafile = argv[++i];
        else if (!strcmp(a, "-c")) connections = atoi(argv[++i]);
        else if (!strcmp(a, "-d")) duration = atof(argv[++i]);
        else if (!strcmp(a, "--size")) expect_size = atol(argv[++i]);
        else if (!strcmp(a, "--streams")) h2_streams = atoi(argv[++i]);
        else usage();
    }
    if (!connect_to || !target[0] || !path[0] || !cafile || connections < 1) usage();
    char host[256];
    snprintf(host, sizeof host, "%s", connect_to);
    char *colon = strrchr(host, ':');
    if (!colon) usage();
    *colon = 0;
    memset(&connect_addr, 0, sizeof connect_addr);
    connect_addr.sin_family = AF_INET;
    connect_addr.sin_port = htons((uint16_t)atoi(colon + 1));
    if (inet_pton(AF_INET, host, &connect_addr.sin_addr) != 1) usage();
    snprintf(target_host, sizeof target_host, "%s", target);
    colon = strrchr(target_host, ':');
    if (colon) *colon = 0;
    struct in_addr probe;
    target_is_ip = inet_pton(AF_INET, target_host, &probe) == 1;

    ctx = SSL_CTX_new(TLS_client_method());
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    if (SSL_CTX_load_verify_locations(ctx, cafile, NULL) != 1) {
        fprintf(stderr, "tlsload: cannot load --cafile %s\n", cafile);
        return 2;
    }
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);   /* a full handshake on every new connection */
    SSL_CTX_set_options(ctx, SSL_OP_NO_TICKET);
    static const unsigned char alpn[] = "\x08http/1.1";
    static const unsigned char alpn_h2[] = "\x02h2";
    if (use_h2) SSL_CTX_set_alpn_protos(ctx, alpn_h2, sizeof alpn_h2 - 1);
    else SSL_CTX_set_alpn_protos(ctx, alpn, sizeof alpn - 1);

    worker *workers = calloc(connections, sizeof *workers);
    double started = now();
    deadline = started + duration;
    for (int i = 0; i < connections; i++) pthread_create(&workers[i].thread, NULL, run, &workers[i]);
    uint64_t requests = 0, conns = 0, bytes = 0, errors[E_KINDS] = {0};
    size_t total = 0;
    for (int i = 0; i < connections; i++) {
        pthread_join(workers[i].thread, NULL);
        requests += workers[i].requests;
        conns += workers[i].conns;
        bytes += workers[i].bytes;
        total += workers[i].count;
        for (int k = 0; k < E_KINDS; k++) errors[k] += workers[i].errors[k];
    }
    double elapsed = now() - started;
    uint32_t *all = malloc((total ? total : 1) * sizeof *all);
    size_t at = 0;
    for (int i = 0; i < connections; i++) {
        if (workers[i].count) memcpy(all + at, workers[i].latencies, workers[i].count * sizeof *all);
        at += workers[i].count;
    }
    qsort(all, total, sizeof *all, compare);
    uint32_t p50 = total ? all[total / 2] : 0, p99 = total ? all[(size_t)(total * 0.99)] : 0;
    printf("BENCH_JSON {\"requests\": %llu, \"connections\": %llu, \"bytes\": %llu, \"duration_us\": %.0f, "
           "\"lat_p50_us\": %u, \"lat_p99_us\": %u, \"errors\": {",
           (unsigned long long)requests, (unsigned long long)conns, (unsigned long long)bytes, elapsed * 1e6, p50, p99);
    for (int k = 0; k < E_KINDS; k++) printf("%s\"%s\": %llu", k ? ", " : "", error_names[k], (unsigned long long)errors[k]);
    printf("}, \"first_error\": \"");
    for (const char *c = first_error; *c; c++) putchar(*c == '"' || *c == '\\' ? '\'' : *c);
    printf("\"}\n");
    return 0;
}
