/* The HTTPS interception floor: the least CPU a user-space TLS-intercepting relay on OpenSSL can spend on an
 * exchange, to set the HTTPS rows against (issue 31: "HTTPS 100 KiB ≥ 10× mitmproxy, ≤ 0.25× Squid").
 *
 * One thread, level-triggered epoll. A client's `CONNECT` is answered `200` without being read further; its TLS is
 * terminated with a fixed leaf (no minting, no cache), and a TLS connection to the origin is opened for it (one per
 * client connection, verification off, ALPN http/1.1). Then every byte is relayed as it is decrypted: no HTTP is
 * parsed, nothing is checked, logged or allocated per exchange. What it spends is the kernel's part (loopback TCP
 * both ways, the copies, the wake-ups), AES-GCM both ways and OpenSSL's record handling, plus one copy each way:
 *   - reads (TLSFLOOR_READ=ahead, below; the others change only this): OpenSSL reads the socket straight into its own buffer (read-ahead, 256 KiB: one recv for a 100 KiB
 *     answer) and `SSL_read` copies the plaintext out;
 *   - writes: the records `SSL_write` makes go into a buffering BIO (one copy) flushed with one write after each
 *     read's relay, as a socket BIO would otherwise write every 16 KiB record on its own.
 * Handshakes are done blocking when a connection arrives (the rows it is for are keep-alive). A write the socket does
 * not take at once is waited for with poll(2). It is for measuring, not for use.
 *
 *   tlsfloor PORT ORIGIN_PORT CERT KEY
 *
 * TLSFLOOR_READ chooses how records reach OpenSSL (session 38):
 *   ahead   (default, session 27) the socket read straight into a 256 KiB read-ahead buffer. OpenSSL 3.0 moves what
 *           follows each record to the front of that buffer on every SSL_read (ssl3_read_n's `clearold`): ~300 KB
 *           of memmove a 100 KiB answer, so this is not the floor it was taken for;
 *   record  read-ahead with OpenSSL's own buffer (~17 KiB): a recv a record, little moved;
 *   staged  the socket read into a buffer of our own (one recv of up to 256 KiB), OpenSSL reading its records from
 *           it through a BIO without read-ahead (a copy, as libevent's filter does from its evbuffer).
 * TLSFLOOR_CIPHERS=aes128 puts AES-128-GCM first on both sides, as datamode-proxy does since cbcd068.
 *
 * Used by hand with the bench's TLS origin and bench/lib/tlsload (see bench/results/2026-12-01-tls-floor-session27.md).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

enum { BUFFER = 262144, MAX_FDS = 65536 };

typedef struct side {
    int fd;
    SSL *ssl;
    unsigned char *staged;  /* TLSFLOOR_READ=staged: records read from the socket, not yet taken by OpenSSL */
    size_t stagedStart, stagedEnd;
    BIO *out;          /* the buffering BIO SSL writes into, over the socket */
    struct side *peer;
} side;

static side *sides[MAX_FDS];
static unsigned char buffer[BUFFER];
static int poller, originPort;
static enum { READ_AHEAD, READ_RECORD, READ_STAGED } readMode = READ_AHEAD;
static BIO_METHOD *stagedMethod;

/* TLSFLOOR_READ=staged: OpenSSL's reads served from the side's own buffer, refilled with one recv when empty. */
static int stagedRead(BIO *bio, char *out, size_t want, size_t *got) {
    side *s = BIO_get_data(bio);
    BIO_clear_retry_flags(bio);
    if (s->stagedStart == s->stagedEnd) {
        ssize_t n = recv(s->fd, s->staged, BUFFER, 0);
        if (n <= 0) {
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) BIO_set_retry_read(bio);
            *got = 0;
            return 0;
        }
        s->stagedStart = 0;
        s->stagedEnd = (size_t)n;
    }
    size_t n = s->stagedEnd - s->stagedStart;
    if (n > want) n = want;
    memcpy(out, s->staged + s->stagedStart, n);
    s->stagedStart += n;
    *got = n;
    return 1;
}

static long stagedControl(BIO *bio, int command, long number, void *pointer) {
    (void)bio; (void)number; (void)pointer;
    return command == BIO_CTRL_FLUSH ? 1 : 0;
}
static SSL_CTX *serverContext, *clientContext;

static void die(const char *what) {
    perror(what);
    ERR_print_errors_fp(stderr);
    exit(1);
}

static void setBlocking(int fd, int blocking) {
    int flags = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, blocking ? flags & ~O_NONBLOCK : flags | O_NONBLOCK);
}

static void waitFor(int fd, short events) {
    struct pollfd p = {.fd = fd, .events = events};
    poll(&p, 1, 1000);
}

/* One side's SSL over its socket: records read as TLSFLOOR_READ says, writes buffered until flushed. */
static side *makeSide(int fd, SSL_CTX *context) {
    side *s = calloc(1, sizeof *s);
    s->fd = fd;
    s->ssl = SSL_new(context);
    if (readMode != READ_STAGED) SSL_set_read_ahead(s->ssl, 1);
    if (readMode == READ_AHEAD) SSL_set_default_read_buffer_len(s->ssl, BUFFER);
    BIO *socket = BIO_new_socket(fd, BIO_NOCLOSE);
    s->out = BIO_new(BIO_f_buffer());
    BIO_set_write_buffer_size(s->out, BUFFER + 4096);
    BIO_push(s->out, socket);
    if (readMode == READ_STAGED) {
        s->staged = malloc(BUFFER);
        BIO *in = BIO_new(stagedMethod);
        BIO_set_data(in, s);
        BIO_set_init(in, 1);
        SSL_set0_rbio(s->ssl, in);
    } else {
        BIO_up_ref(socket);
        SSL_set0_rbio(s->ssl, socket);
    }
    SSL_set0_wbio(s->ssl, s->out);
    return s;
}

static void closeBoth(side *s) {
    side *sides2[2] = {s, s->peer};
    for (int i = 0; i < 2; i++) {
        side *x = sides2[i];
        if (!x) continue;
        epoll_ctl(poller, EPOLL_CTL_DEL, x->fd, NULL);
        sides[x->fd] = NULL;
        SSL_free(x->ssl);
        close(x->fd);
        free(x->staged);
        free(x);
    }
}

/* Writes what the buffering BIO holds, waiting for the socket when it does not take it at once. */
static int flush(side *s) {
    while (BIO_flush(s->out) <= 0) {
        if (!BIO_should_retry(s->out)) return -1;
        waitFor(s->fd, POLLOUT);
    }
    return 0;
}

static int writeAll(side *s, const unsigned char *bytes, int length) {
    while (length > 0) {
        int n = SSL_write(s->ssl, bytes, length);
        if (n > 0) {
            bytes += n;
            length -= n;
            continue;
        }
        int error = SSL_get_error(s->ssl, n);
        if (error != SSL_ERROR_WANT_WRITE) return -1;
        if (flush(s) < 0) return -1;
    }
    return 0;
}

/* Everything `from` decrypts now goes to its peer, then one flush. */
static void relay(side *from) {
    side *to = from->peer;
    for (;;) {
        int n = SSL_read(from->ssl, buffer, BUFFER);
        if (n > 0) {
            if (writeAll(to, buffer, n) < 0) { closeBoth(from); return; }
            continue;
        }
        int error = SSL_get_error(from->ssl, n);
        if (error == SSL_ERROR_WANT_READ) break;
        closeBoth(from);
        return;
    }
    if (flush(to) < 0) closeBoth(from);
}

static int connectOrigin(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in address = {.sin_family = AF_INET, .sin_port = htons(originPort)};
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&address, sizeof address) < 0) { close(fd); return -1; }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

/* A new client: CONNECT answered, both handshakes done (blocking), both sides watched. */
static void accepted(int client) {
    char head[4096];
    size_t have = 0;
    setBlocking(client, 1);
    while (have < sizeof head - 1) {
        ssize_t n = recv(client, head + have, sizeof head - 1 - have, 0);
        if (n <= 0) { close(client); return; }
        have += (size_t)n;
        head[have] = 0;
        if (strstr(head, "\r\n\r\n")) break;
    }
    static const char established[] = "HTTP/1.1 200 Connection established\r\n\r\n";
    if (send(client, established, sizeof established - 1, MSG_NOSIGNAL) < 0) { close(client); return; }
    int origin = connectOrigin();
    if (origin < 0) { close(client); return; }
    side *c = makeSide(client, serverContext), *o = makeSide(origin, clientContext);
    c->peer = o;
    o->peer = c;
    if (SSL_accept(c->ssl) != 1 || flush(c) < 0 || SSL_connect(o->ssl) != 1 || flush(o) < 0) {
        ERR_clear_error();
        closeBoth(c);
        return;
    }
    /* SSL_connect wrote through the buffering BIO: what it held is out (flushed above). */
    setBlocking(client, 0);
    setBlocking(origin, 0);
    int one = 1;
    setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    sides[client] = c;
    sides[origin] = o;
    struct epoll_event event = {.events = EPOLLIN};
    event.data.fd = client;
    epoll_ctl(poller, EPOLL_CTL_ADD, client, &event);
    event.data.fd = origin;
    epoll_ctl(poller, EPOLL_CTL_ADD, origin, &event);
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: tlsfloor PORT ORIGIN_PORT CERT KEY\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    originPort = atoi(argv[2]);
    const char *mode = getenv("TLSFLOOR_READ");
    if (mode && strcmp(mode, "record") == 0) readMode = READ_RECORD;
    else if (mode && strcmp(mode, "staged") == 0) readMode = READ_STAGED;
    else if (mode && strcmp(mode, "ahead") != 0) { fprintf(stderr, "TLSFLOOR_READ: ahead, record or staged\n"); return 2; }
    stagedMethod = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "tlsfloor staged");
    BIO_meth_set_read_ex(stagedMethod, stagedRead);
    BIO_meth_set_ctrl(stagedMethod, stagedControl);
    serverContext = SSL_CTX_new(TLS_server_method());
    if (SSL_CTX_use_certificate_chain_file(serverContext, argv[3]) != 1) die("certificate");
    if (SSL_CTX_use_PrivateKey_file(serverContext, argv[4], SSL_FILETYPE_PEM) != 1) die("key");
    static const unsigned char alpn[] = "\x08http/1.1";
    clientContext = SSL_CTX_new(TLS_client_method());
    SSL_CTX_set_alpn_protos(clientContext, alpn, sizeof alpn - 1);
    SSL_CTX_set_verify(clientContext, SSL_VERIFY_NONE, NULL);
    const char *ciphers = getenv("TLSFLOOR_CIPHERS");
    if (ciphers && strcmp(ciphers, "aes128") != 0) { fprintf(stderr, "TLSFLOOR_CIPHERS: aes128 or unset\n"); return 2; }
    if (ciphers) {
        const char *suites = "TLS_AES_128_GCM_SHA256:TLS_CHACHA20_POLY1305_SHA256:TLS_AES_256_GCM_SHA384";
        if (SSL_CTX_set_ciphersuites(serverContext, suites) != 1 || SSL_CTX_set_ciphersuites(clientContext, suites) != 1)
            die("ciphersuites");
        SSL_CTX_set_options(serverContext, SSL_OP_CIPHER_SERVER_PREFERENCE);
    }

    int listener = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0), one = 1;
    setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in address = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[1]))};
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(listener, (struct sockaddr *)&address, sizeof address) < 0 || listen(listener, 4096) < 0) die("listen");
    poller = epoll_create1(0);
    struct epoll_event event = {.events = EPOLLIN, .data.fd = listener};
    epoll_ctl(poller, EPOLL_CTL_ADD, listener, &event);
    struct epoll_event ready[64];
    for (;;) {
        int n = epoll_wait(poller, ready, 64, -1);
        for (int i = 0; i < n; i++) {
            int fd = ready[i].data.fd;
            if (fd == listener) {
                int client;
                while ((client = accept4(listener, NULL, NULL, 0)) >= 0) {
                    if (client >= MAX_FDS) { close(client); continue; }
                    accepted(client);
                }
            } else if (sides[fd]) {
                relay(sides[fd]);
            }
        }
    }
}
