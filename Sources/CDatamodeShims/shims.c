#define _GNU_SOURCE
/* dm_ec_p256_leaf_keygen uses the EC_KEY API on purpose (see its comment in the header). */
#define OPENSSL_SUPPRESS_DEPRECATED
#include "CDatamodeShims.h"
#include <fcntl.h>
#include <unistd.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <pthread.h>
#include <malloc.h>
#include <string.h>
#include <time.h>
#include <event2/buffer.h>
#include <event2/buffer_compat.h>
#include <event2/bufferevent_struct.h>

struct event *dm_timer_new(struct event_base *base, event_callback_fn cb, void *arg) {
    return evtimer_new(base, cb, arg);
}

struct event *dm_signal_new(struct event_base *base, int signum, event_callback_fn cb, void *arg) {
    return event_new(base, signum, EV_SIGNAL | EV_PERSIST, cb, arg);
}

struct event *dm_read_event_new(struct event_base *base, int fd, event_callback_fn cb, void *arg) {
    return event_new(base, fd, EV_READ | EV_PERSIST, cb, arg);
}

int dm_event_add_ms(struct event *ev, int64_t milliseconds) {
    if (milliseconds < 0) return event_add(ev, NULL);
    struct timeval tv = { .tv_sec = milliseconds / 1000, .tv_usec = (milliseconds % 1000) * 1000 };
    return event_add(ev, &tv);
}

int dm_event_add_us(struct event *ev, int64_t microseconds) {
    if (microseconds < 0) microseconds = 0;
    struct timeval tv = { .tv_sec = microseconds / 1000000, .tv_usec = microseconds % 1000000 };
    return event_add(ev, &tv);
}

uint64_t dm_monotonic_coarse_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int dm_set_nodelay(int fd) {
    int one = 1;
    return setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

/* linux/netfilter_ipv4.h and linux/netfilter_ipv6/ip6_tables.h: both are 80, each at its own level. Defined here
   so the shim needs no kernel headers. */
#ifndef SO_ORIGINAL_DST
#define SO_ORIGINAL_DST 80
#endif
#ifndef IP6T_SO_ORIGINAL_DST
#define IP6T_SO_ORIGINAL_DST 80
#endif

int dm_original_destination(int fd, struct sockaddr_storage *out, socklen_t *length) {
    struct sockaddr_storage local;
    socklen_t local_length = sizeof(local);
    if (getsockname(fd, (struct sockaddr *)&local, &local_length) != 0) return -1;
    memset(out, 0, sizeof(*out));
    if (local.ss_family == AF_INET6) {
        /* An IPv6 socket: its own table first; an IPv4 client on a dual-stack socket ([::]) answers at SOL_IP. */
        socklen_t size = sizeof(struct sockaddr_in6);
        if (getsockopt(fd, SOL_IPV6, IP6T_SO_ORIGINAL_DST, out, &size) == 0) {
            *length = size;
            return 0;
        }
    }
    socklen_t size = sizeof(struct sockaddr_in);
    if (getsockopt(fd, SOL_IP, SO_ORIGINAL_DST, out, &size) == 0) {
        *length = size;
        return 0;
    }
    return -1;
}

long dm_ssl_set_sni(SSL *ssl, const char *name) {
    return SSL_set_tlsext_host_name(ssl, name);
}

long dm_ssl_ctx_min_tls12(SSL_CTX *ctx) {
    return SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
}

int dm_ssl_ctx_cipher_order(SSL_CTX *ctx, int server) {
    if (SSL_CTX_set_ciphersuites(ctx, "TLS_AES_128_GCM_SHA256:TLS_CHACHA20_POLY1305_SHA256:TLS_AES_256_GCM_SHA384") != 1)
        return 0;
    if (SSL_CTX_set_cipher_list(ctx, "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:"
                                     "ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305:DEFAULT") != 1)
        return 0;
    if (server) SSL_CTX_set_options(ctx, SSL_OP_CIPHER_SERVER_PREFERENCE | SSL_OP_PRIORITIZE_CHACHA);
    return 1;
}

EVP_PKEY *dm_ec_p256_keygen(void) {
    return EVP_EC_gen("P-256");
}

EVP_PKEY *dm_ec_p256_leaf_keygen(void) {
    EC_KEY *ec = EC_KEY_new_by_curve_name(NID_X9_62_prime256v1);
    if (ec == NULL) return NULL;
    EVP_PKEY *key = EVP_PKEY_new();
    if (key == NULL || EC_KEY_generate_key(ec) != 1 || EVP_PKEY_assign_EC_KEY(key, ec) != 1) {
        EVP_PKEY_free(key);
        EC_KEY_free(ec);
        return NULL;
    }
    return key;
}

long dm_ssl_ctx_set_servername_callback(SSL_CTX *ctx, int (*cb)(SSL *, int *, void *)) {
    return SSL_CTX_set_tlsext_servername_callback(ctx, cb);
}

long dm_ssl_ctx_server_session_cache(SSL_CTX *ctx, long size) {
    SSL_CTX_sess_set_cache_size(ctx, size);
    return SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_SERVER);
}

int dm_bufferevent_set_timeouts_ms(struct bufferevent *bev, int64_t read_ms, int64_t write_ms) {
    struct timeval r = { .tv_sec = read_ms / 1000, .tv_usec = (read_ms % 1000) * 1000 };
    struct timeval w = { .tv_sec = write_ms / 1000, .tv_usec = (write_ms % 1000) * 1000 };
    return bufferevent_set_timeouts(bev, read_ms > 0 ? &r : NULL, write_ms > 0 ? &w : NULL);
}

void dm_ignore_sigpipe(void) {
    signal(SIGPIPE, SIG_IGN);
}

static void dm_process_signals(sigset_t *set) {
    sigemptyset(set);
    sigaddset(set, SIGHUP);
    sigaddset(set, SIGTERM);
    sigaddset(set, SIGINT);
}

void dm_block_process_signals(void) {
    sigset_t set;
    dm_process_signals(&set);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
}

void dm_unblock_process_signals(void) {
    sigset_t set;
    dm_process_signals(&set);
    pthread_sigmask(SIG_UNBLOCK, &set, NULL);
}

long dm_splice(int fd_in, int fd_out, size_t length) {
    return (long)splice(fd_in, NULL, fd_out, NULL, length, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
}

int dm_splice_pipe(int fds[2], int size) {
    if (pipe2(fds, O_NONBLOCK | O_CLOEXEC) != 0) return -1;
    fcntl(fds[1], F_SETPIPE_SZ, size);
    return 0;
}

int dm_malloc_thresholds(int mmap_threshold, int trim_threshold) {
#ifdef M_MMAP_THRESHOLD
    return mallopt(M_MMAP_THRESHOLD, mmap_threshold) == 1 && mallopt(M_TRIM_THRESHOLD, trim_threshold) == 1;
#else
    (void)mmap_threshold; (void)trim_threshold;
    return 0;
#endif
}

int dm_malloc_trim(void) {
#ifdef __GLIBC__
    return malloc_trim(0);
#else
    return 0;
#endif
}

long long dm_malloc_free_bytes(void) {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
    return (long long)mallinfo2().fordblks;
#else
    return -1;
#endif
}

/* libevent's allocator with a small per-thread cache of evbuffer chains (issue 31; see the header). */

#define DM_CHAIN_CLASSES 3
static const size_t dm_chain_class_size[DM_CHAIN_CLASSES] = { 1024, 2048, 4096 };
static const int dm_chain_class_cap[DM_CHAIN_CLASSES] = { 32, 16, 8 };

struct dm_chain_cache {
    void *head[DM_CHAIN_CLASSES];
    int count[DM_CHAIN_CLASSES];
    int registered;
};
static __thread struct dm_chain_cache dm_chain_cache;
static pthread_key_t dm_chain_cache_key;
static pthread_once_t dm_chain_cache_once = PTHREAD_ONCE_INIT;

static void dm_chain_cache_release(void *cache_pointer) {
    struct dm_chain_cache *cache = cache_pointer;
    for (int k = 0; k < DM_CHAIN_CLASSES; k++) {
        while (cache->head[k]) {
            void *block = cache->head[k];
            cache->head[k] = *(void **)block;
            free(block);
        }
        cache->count[k] = 0;
    }
}

static void dm_chain_cache_make_key(void) {
    pthread_key_create(&dm_chain_cache_key, dm_chain_cache_release);
}

/* The class a request of `size` bytes is served from: only libevent's chain sizes, exact powers of two. */
static int dm_chain_class_of_request(size_t size) {
    for (int k = 0; k < DM_CHAIN_CLASSES; k++) if (size == dm_chain_class_size[k]) return k;
    return -1;
}

/* The class a freed block can serve: its usable size holds the class's size and wastes little past it. */
static int dm_chain_class_of_block(void *block) {
    size_t usable = malloc_usable_size(block);
    for (int k = 0; k < DM_CHAIN_CLASSES; k++) {
        if (usable >= dm_chain_class_size[k] && usable < dm_chain_class_size[k] + 64) return k;
    }
    return -1;
}

static void *dm_chain_malloc(size_t size) {
    int k = dm_chain_class_of_request(size);
    if (k >= 0 && dm_chain_cache.head[k]) {
        void *block = dm_chain_cache.head[k];
        dm_chain_cache.head[k] = *(void **)block;
        dm_chain_cache.count[k] -= 1;
        return block;
    }
    return malloc(size);
}

static void *dm_chain_realloc(void *block, size_t size) {
    return realloc(block, size);
}

static void dm_chain_free(void *block) {
    if (!block) return;
    int k = dm_chain_class_of_block(block);
    if (k < 0 || dm_chain_cache.count[k] >= dm_chain_class_cap[k]) {
        free(block);
        return;
    }
    if (!dm_chain_cache.registered) {
        /* The thread's blocks go back to malloc when it exits. */
        pthread_once(&dm_chain_cache_once, dm_chain_cache_make_key);
        pthread_setspecific(dm_chain_cache_key, &dm_chain_cache);
        dm_chain_cache.registered = 1;
    }
    *(void **)block = dm_chain_cache.head[k];
    dm_chain_cache.head[k] = block;
    dm_chain_cache.count[k] += 1;
}

void dm_event_use_chain_cache(void) {
    event_set_mem_functions(dm_chain_malloc, dm_chain_realloc, dm_chain_free);
}

long long dm_event_chain_cache_bytes(void) {
    long long bytes = 0;
    for (int k = 0; k < DM_CHAIN_CLASSES; k++) bytes += (long long)dm_chain_cache.count[k] * (long long)dm_chain_class_size[k];
    return bytes;
}

void dm_event_chain_cache_drain(void) {
    dm_chain_cache_release(&dm_chain_cache);
}

/* libevent 2.1's bufferevent_socket_outbuf_cb (bufferevent_sock.c), but for `write_suspended`, which only rate
   limits and hostname lookups set (neither is used on these bufferevents). */
static void dm_socket_output_added(struct evbuffer *buffer, const struct evbuffer_cb_info *info, void *arg) {
    struct bufferevent *bev = arg;
    (void)buffer;
    if (info->n_added && (bev->enabled & EV_WRITE) && !event_pending(&bev->ev_write, EV_WRITE, NULL)) {
        event_add(&bev->ev_write, evutil_timerisset(&bev->timeout_write) ? &bev->timeout_write : NULL);
    }
}

void dm_socket_output_callbacks_off(struct bufferevent *bev) {
    evbuffer_setcb(bufferevent_get_output(bev), NULL, NULL);
}

void dm_socket_output_watch(struct bufferevent *bev, int on) {
    struct evbuffer *output = bufferevent_get_output(bev);
    if (on) {
        evbuffer_add_cb(output, dm_socket_output_added, bev);
    } else {
        evbuffer_remove_cb(output, dm_socket_output_added, bev);
    }
}

#include <sys/syscall.h>

ssize_t dm_recv(int fd, void *buffer, size_t length, int flags) {
    return syscall(SYS_recvfrom, fd, buffer, length, flags, NULL, NULL);
}

ssize_t dm_send(int fd, const void *buffer, size_t length, int flags) {
    return syscall(SYS_sendto, fd, buffer, length, flags, NULL, 0);
}

ssize_t dm_sendmsg(int fd, const struct msghdr *message, int flags) {
    return syscall(SYS_sendmsg, fd, message, flags);
}
