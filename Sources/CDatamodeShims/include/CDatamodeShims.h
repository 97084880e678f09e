#ifndef DATAMODE_SHIMS_H
#define DATAMODE_SHIMS_H
/* One-line C wrappers for what Swift cannot import: function-like macros of libevent and OpenSSL,
   and a few socket options. Nothing here holds state or logic. */
#include <stdint.h>
#include <sys/types.h>
#include <sys/time.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <event2/event.h>
#include <event2/bufferevent.h>
#include <openssl/ssl.h>
#include <openssl/ec.h>

/** evtimer_new(base, cb, arg) */
struct event *dm_timer_new(struct event_base *base, event_callback_fn cb, void *arg);
/** evsignal_new(base, signum, cb, arg) with EV_PERSIST */
struct event *dm_signal_new(struct event_base *base, int signum, event_callback_fn cb, void *arg);
/** A persistent read event on a file descriptor (used for the worker wake-up pipe). */
struct event *dm_read_event_new(struct event_base *base, int fd, event_callback_fn cb, void *arg);
/** evtimer_add / event_add with a millisecond timeout (negative: no timeout). */
int dm_event_add_ms(struct event *ev, int64_t milliseconds);
/** evtimer_add with a microsecond timeout (link shaping needs finer steps than milliseconds at 1 Gbit/s). */
int dm_event_add_us(struct event *ev, int64_t microseconds);
/// CLOCK_MONOTONIC_COARSE in nanoseconds: the vDSO's last tick (1-4 ms resolution), no clock read. For timers
/// that only need to know whether a deadline of seconds has passed (`LazyTimer`).
uint64_t dm_monotonic_coarse_ns(void);
/** Sets TCP_NODELAY: libevent never does, and Nagle + delayed ACK costs ~10 ms per exchange. */
int dm_set_nodelay(int fd);
/** The original destination of a connection the kernel redirected (netfilter REDIRECT/DNAT, SPEC §16):
    getsockopt SO_ORIGINAL_DST (SOL_IP) or IP6T_SO_ORIGINAL_DST (SOL_IPV6), whichever the connection's family
    answers. Fills `out` (a sockaddr_in or sockaddr_in6) and `length`; returns 0, or -1 with errno (ENOENT: the
    connection was not translated and conntrack does not know it). */
int dm_original_destination(int fd, struct sockaddr_storage *out, socklen_t *length);
/** SSL_set_tlsext_host_name(ssl, name): SNI. */
long dm_ssl_set_sni(SSL *ssl, const char *name);
/** SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION). */
long dm_ssl_ctx_min_tls12(SSL_CTX *ctx);
/** The cipher order of both sides of interception: AES-128-GCM, ChaCha20-Poly1305, AES-256-GCM (TLS 1.3; the same
    families first for TLS 1.2, then OpenSSL's defaults). `server`: the proxy's order decides, except that a client
    that lists ChaCha20 first gets it (SSL_OP_CIPHER_SERVER_PREFERENCE | SSL_OP_PRIORITIZE_CHACHA, macros Swift
    cannot import). 1 on success. */
int dm_ssl_ctx_cipher_order(SSL_CTX *ctx, int server);
/** EVP_EC_gen("P-256") (a variadic macro in OpenSSL 3): a new ECDSA P-256 key, NULL on failure. */
EVP_PKEY *dm_ec_p256_keygen(void);
/** A new ECDSA P-256 key made through the EC_KEY API, for the key every leaf shares. OpenSSL 3 encodes the public
    half of a provider-native key (what EVP_EC_gen makes) through its encoder framework on every X509_set_pubkey,
    ~230 us; a key with the legacy EC method encodes it in ~5 us. Measured in the README's choices. */
EVP_PKEY *dm_ec_p256_leaf_keygen(void);
/** SSL_CTX_set_tlsext_servername_callback(ctx, cb): called with the client's SNI during the handshake. */
long dm_ssl_ctx_set_servername_callback(SSL_CTX *ctx, int (*cb)(SSL *, int *, void *));
/** SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_SERVER) with a bounded cache: resumption for clients
    without tickets, on top of the tickets OpenSSL issues by default. */
long dm_ssl_ctx_server_session_cache(SSL_CTX *ctx, long size);
/** bufferevent_set_timeouts with millisecond values (0: none). */
int dm_bufferevent_set_timeouts_ms(struct bufferevent *bev, int64_t read_ms, int64_t write_ms);
/** Ignores SIGPIPE for the whole process: a peer closing mid-write must be an error, not a death. */
void dm_ignore_sigpipe(void);
/** Blocks SIGHUP, SIGTERM and SIGINT in the calling thread (workers), so only the main loop gets them. */
void dm_block_process_signals(void);
/** Unblocks them in the calling thread (the control loop). A process inherits its parent's signal mask, and
    a parent that blocked SIGTERM (test runners, some supervisors) would otherwise make us unstoppable. */
void dm_unblock_process_signals(void);

/** splice(2) with SPLICE_F_MOVE | SPLICE_F_NONBLOCK (a GNU extension Swift's Glibc module does not export). */
long dm_splice(int fd_in, int fd_out, size_t length);
/** A non-blocking, close-on-exec pipe for splice, its capacity raised to `size` when possible. */
int dm_splice_pipe(int fds[2], int size);

/** glibc's mallopt(M_MMAP_THRESHOLD) and mallopt(M_TRIM_THRESHOLD); 1 when both were set (see MemoryTuning.swift). */
int dm_malloc_thresholds(int mmap_threshold, int trim_threshold);
/** glibc's malloc_trim(0): gives free memory back to the kernel from every arena, wherever it is in the arena (see
    IdleTrim.swift). 1 when some was given back; 0 elsewhere than glibc. */
int dm_malloc_trim(void);
/** The free bytes malloc holds in its arenas (glibc's mallinfo2().fordblks); -1 where unknown. */
long long dm_malloc_free_bytes(void);

/** Makes libevent allocate through a small per-thread cache of evbuffer chains (issue 31): a relayed exchange
    allocates and frees ~5 chains of 1, 2 and 4 KiB, sizes past glibc's per-thread cache (tcache, up to 1032 bytes)
    that each took its arena's lock and bins. A thread keeps at most 32 + 16 + 8 of them (96 KiB); any other size,
    and any block past that, is plain malloc and free, and a thread's blocks go back to malloc when it exits.
    Call once, before any other libevent call. */
void dm_event_use_chain_cache(void);
/** The bytes this thread's chain cache holds. */
long long dm_event_chain_cache_bytes(void);
/** Gives this thread's cached chains back to malloc. */
void dm_event_chain_cache_drain(void);

/** A plain socket bufferevent's output without libevent's callback. libevent 2.1 registers one on every socket
    bufferevent's output (`bufferevent_socket_outbuf_cb`: when bytes are added while EV_WRITE is enabled and the write
    event is not pending, add it), and every evbuffer_add, drain and move on that output runs the buffer's callback
    list (~80 instructions each, ~5 a proxied exchange; an empty list returns at once). Speculative writes keep EV_WRITE
    off nearly always, so the callback is needed only while EV_WRITE is on: `dm_socket_output_watch` puts the same
    rule back for exactly that time. Only for a bufferevent whose EV_WRITE is enabled by its `SpeculativeWriter` alone. */
void dm_socket_output_callbacks_off(struct bufferevent *bev);
/** `on`: registers libevent's rule (above) on `bev`'s output; off: removes it. */
void dm_socket_output_watch(struct bufferevent *bev, int on);

/** recv(2), send(2) and sendmsg(2) made with syscall(2), not glibc's wrappers. In a process with more than one thread
    glibc makes every cancellation point (these three) switch the thread's cancellation to asynchronous and back, two
    atomic operations on its `cancelhandling` around the system call; the proxy never cancels a thread. perf, 1 KiB
    keep-alive: `__pthread_enable_asynccancel` and `__pthread_disable_asynccancel` were 0.65% of the proxy's samples.
    Same results and errno as the wrappers. */
ssize_t dm_recv(int fd, void *buffer, size_t length, int flags);
ssize_t dm_send(int fd, const void *buffer, size_t length, int flags);
ssize_t dm_sendmsg(int fd, const struct msghdr *message, int flags);

#endif
