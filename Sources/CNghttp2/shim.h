#ifndef DATAMODE_CNGHTTP2_SHIM_H
#define DATAMODE_CNGHTTP2_SHIM_H
/* nghttp2.h uses ssize_t and size_t without including what defines them on every libc. */
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
/* Debian 12's libnghttp2-dev 1.52.0-1+deb12u2 or later: its security patches add
   nghttp2_option_set_stream_reset_rate_limit (CVE-2023-44487) and nghttp2_option_set_max_continuations
   (CVE-2024-27316), which DatamodeHTTP2 calls; an unpatched 1.52.0 fails to compile against it, on purpose. */
#include <nghttp2/nghttp2.h>
#endif
