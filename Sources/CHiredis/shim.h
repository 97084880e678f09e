// hiredis 0.14 (Debian libhiredis-dev) on its libevent adapter, for the shared store of SPEC §19. Only
// DatamodeEngine imports it (the engine owns the C boundary).
#include <hiredis/hiredis.h>
#include <hiredis/async.h>
#include <hiredis/adapters/libevent.h>

// The adapter's functions are `static` in its header: one non-static entry point that Swift can call.
static inline int chiredis_libevent_attach(redisAsyncContext *context, struct event_base *base) {
    return redisLibeventAttach(context, base);
}
