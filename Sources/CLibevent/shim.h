#ifndef DATAMODE_CLIBEVENT_SHIM_H
#define DATAMODE_CLIBEVENT_SHIM_H
/* System headers first: <event2/event-config.h> defines _GNU_SOURCE before <sys/time.h>,
   which inside a Clang module breaks fd_set (see shared/SWIFT-LIBEVENT-NOTES.md). */
#include <stdint.h>
#include <sys/types.h>
#include <sys/time.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <netdb.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/listener.h>
#include <event2/dns.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <event2/util.h>
#endif
