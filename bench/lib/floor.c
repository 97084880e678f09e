/* The floor: the least CPU an HTTP/1.1 keep-alive relay can spend on an exchange, to set a proxy's row against.
 *
 * One thread, level-triggered epoll, one origin connection per client connection (as HAProxy and nginx keep them),
 * TCP_NODELAY both ways. It parses nothing but the end of a response head and its Content-Length, checks nothing,
 * logs nothing, allocates nothing per exchange: what it spends is the kernel's part of relaying (the loopback TCP
 * both ways, the copies, the wake-ups) plus a few hundred instructions. A request is assumed to arrive in one read
 * and to fit the origin's socket at once (GET heads from wrk do); it is for measuring, not for use.
 *
 *   floor MODE PORT ORIGIN_PORT
 *   MODE 0: the response is recv'd into one 256 KiB buffer and sent on (what every user-space proxy does).
 *   MODE 1: the head is peeked and consumed, the body spliced origin -> pipe -> client through a pipe kept per
 *           connection (issue 31's "splice from ~64 KiB with a pool of pipes", at its cheapest).
 *
 * Used by hand with the bench's origin and wrk (see bench/results/2026-11-30-plain-floor-session23.md). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

enum { BUFFER = 262144 };

typedef struct relay {
    int client, origin, pipe[2];
    int blocked;      /* waiting for the client to take bytes: EPOLLOUT on, the origin not read */
    long body;        /* MODE 1: body bytes still to splice */
    size_t inPipe;    /* MODE 1: bytes in the pipe, not yet spliced to the client */
    char *pending;    /* bytes the client socket did not take */
    size_t pendingLength;
} relay;

static int mode, poller, originPort;
static char buffer[BUFFER + 1];

static void control(int op, int fd, unsigned events, void *tag) {
    struct epoll_event event = {.events = events, .data.ptr = tag};
    epoll_ctl(poller, op, fd, &event);
}

static int dialOrigin(void) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0), one = 1;
    struct sockaddr_in address = {.sin_family = AF_INET, .sin_port = htons(originPort)};
    inet_pton(AF_INET, "127.0.0.1", &address.sin_addr);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    connect(fd, (void *)&address, sizeof address);
    return fd;
}

/* Closed relays stay allocated (events for them may follow in the same batch); a measurement run is short. */
static void drop(relay *r) {
    if (r->client < 0) return;
    close(r->client);
    close(r->origin);
    if (r->pipe[0] >= 0) { close(r->pipe[0]); close(r->pipe[1]); }
    r->client = -1;
}

/* Sends what waits for the client: 0 all out, 1 the client's socket is full, -1 failed. */
static int flush(relay *r) {
    if (r->pendingLength) {
        ssize_t n = send(r->client, r->pending, r->pendingLength, MSG_NOSIGNAL);
        if (n < 0 && errno != EAGAIN) return -1;
        if (n > 0) {
            memmove(r->pending, r->pending + n, r->pendingLength - n);
            r->pendingLength -= n;
        }
        if (r->pendingLength) return 1;
    }
    while (r->inPipe) {
        ssize_t n = splice(r->pipe[0], NULL, r->client, NULL, r->inPipe, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
        if (n < 0 && errno == EAGAIN) return 1;
        if (n <= 0) return -1;
        r->inPipe -= n;
    }
    return 0;
}

static int queue(relay *r, const char *bytes, size_t length) {
    size_t sent = 0;
    if (!r->pendingLength) {
        ssize_t n = send(r->client, bytes, length, MSG_NOSIGNAL);
        if (n < 0 && errno != EAGAIN) return -1;
        if (n > 0) sent = n;
    }
    if (sent < length) {
        r->pending = realloc(r->pending, r->pendingLength + length - sent);
        memcpy(r->pending + r->pendingLength, bytes + sent, length - sent);
        r->pendingLength += length - sent;
    }
    return 0;
}

static void block(relay *r, int on) {
    if (r->blocked == on) return;
    r->blocked = on;
    control(EPOLL_CTL_MOD, r->client, on ? EPOLLIN | EPOLLOUT : EPOLLIN, r);
    control(EPOLL_CTL_MOD, r->origin, on ? 0 : EPOLLIN, (char *)r + 1);
}

/* The origin is readable: relay until it has nothing more or the client is full. -1: the relay is over. */
static int originReadable(relay *r) {
    for (;;) {
        if (mode == 0) {
            ssize_t n = recv(r->origin, buffer, BUFFER, 0);
            if (n < 0 && errno == EAGAIN) return 0;
            if (n <= 0 || queue(r, buffer, n) < 0) return -1;
        } else if (r->body == 0) {
            ssize_t n = recv(r->origin, buffer, 4096, MSG_PEEK);
            if (n < 0 && errno == EAGAIN) return 0;
            if (n <= 0) return -1;
            buffer[n] = 0;
            char *end = strstr(buffer, "\r\n\r\n");
            if (!end) return 0;
            size_t headLength = end + 4 - buffer;
            char *length = strcasestr(buffer, "content-length:");
            r->body = length ? atol(length + 15) : 0;
            if (recv(r->origin, buffer, headLength, 0) != (ssize_t)headLength || queue(r, buffer, headLength) < 0)
                return -1;
        } else {
            ssize_t n = splice(r->origin, NULL, r->pipe[1], NULL, r->body, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
            if (n < 0 && errno == EAGAIN) return 0;
            if (n <= 0) return -1;
            r->body -= n;
            r->inPipe += n;
        }
        int flushed = flush(r);
        if (flushed < 0) return -1;
        if (flushed) { block(r, 1); return 0; }
    }
}

int main(int argc, char **argv) {
    if (argc != 4) { fprintf(stderr, "usage: floor MODE PORT ORIGIN_PORT\n"); return 2; }
    signal(SIGPIPE, SIG_IGN);
    mode = atoi(argv[1]);
    originPort = atoi(argv[3]);
    int listener = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0), one = 1;
    setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in address = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2]))};
    inet_pton(AF_INET, "127.0.0.1", &address.sin_addr);
    if (bind(listener, (void *)&address, sizeof address) || listen(listener, 4096)) { perror("listen"); return 1; }
    poller = epoll_create1(0);
    control(EPOLL_CTL_ADD, listener, EPOLLIN, NULL);
    struct epoll_event events[256];
    for (;;) {
        int count = epoll_wait(poller, events, 256, -1);
        for (int i = 0; i < count; i++) {
            void *tag = events[i].data.ptr;
            if (!tag) {
                int fd;
                while ((fd = accept4(listener, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
                    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    relay *r = calloc(1, sizeof *r);
                    r->client = fd;
                    r->origin = dialOrigin();
                    r->pipe[0] = r->pipe[1] = -1;
                    if (mode == 1) {
                        pipe2(r->pipe, O_NONBLOCK | O_CLOEXEC);
                        fcntl(r->pipe[1], F_SETPIPE_SZ, BUFFER);
                    }
                    control(EPOLL_CTL_ADD, fd, EPOLLIN, r);
                    control(EPOLL_CTL_ADD, r->origin, EPOLLIN, (char *)r + 1);
                }
                continue;
            }
            relay *r = (relay *)((long)tag & ~1L);
            if (r->client < 0) continue;
            if ((long)tag & 1) {
                if (originReadable(r) < 0) drop(r);
                continue;
            }
            if (events[i].events & EPOLLOUT) {
                int flushed = flush(r);
                if (flushed < 0) { drop(r); continue; }
                if (!flushed) {
                    block(r, 0);
                    if (originReadable(r) < 0) { drop(r); continue; }
                }
            }
            if (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
                ssize_t n = recv(r->client, buffer, BUFFER, 0);
                if (n == 0 || (n < 0 && errno != EAGAIN)) { drop(r); continue; }
                if (n > 0) send(r->origin, buffer, n, MSG_NOSIGNAL);
            }
        }
    }
}
