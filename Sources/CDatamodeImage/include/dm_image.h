#ifndef DATAMODE_IMAGE_H
#define DATAMODE_IMAGE_H
/* Image probing and transcoding for SPEC §13 (automatic low-res), on libjpeg-turbo, libpng and libwebp.
   Called only from the engine's transcoding pool threads, never on an event loop. Every function is
   reentrant (no globals); errors come back as return codes, never as longjmp out of a caller's frame. */
#include <stddef.h>
#include <stdint.h>

enum dm_image_format { DM_IMAGE_UNKNOWN = 0, DM_IMAGE_JPEG = 1, DM_IMAGE_PNG = 2, DM_IMAGE_WEBP = 3 };

typedef struct dm_image_info {
    int format;        /* enum dm_image_format */
    uint32_t width;
    uint32_t height;
    int animated;      /* APNG (acTL before IDAT) or animated WebP (VP8X animation flag) */
} dm_image_info;

/* Reads the format and the dimensions from the header only (nothing is decoded): 0 when known, -1 when the
   bytes are not a JPEG/PNG/WebP whose size could be read. */
int dm_image_probe(const uint8_t *data, size_t length, dm_image_info *info);

/* Bounds on the work of one transcode (issue 24: a 50 KB progressive JPEG of 6000x6000 with 3,000 scans that add
   nothing kept a pool thread decoding for tens of seconds; max-pixels bounds the pixels, not the passes over them). */
typedef struct dm_image_limits {
    int max_scans;          /* a JPEG with more scans than this is given up, as djpeg -maxscans does (0: no limit) */
    uint64_t cpu_budget_ns; /* CPU time of the calling thread the whole transcode may use (0: no limit) */
} dm_image_limits;

enum dm_image_status {
    DM_IMAGE_OK = 0,
    DM_IMAGE_FAILED = -1,         /* not decodable or encodable, another size than probed, out of memory */
    DM_IMAGE_TOO_MANY_SCANS = -2, /* more than limits->max_scans scans */
    DM_IMAGE_TOO_SLOW = -3,       /* limits->cpu_budget_ns used up */
};

/* Decodes `data` (`info` from dm_image_probe), resizes it to at most `max_width` pixels wide (aspect kept),
   encodes it as `out_format` at `quality` (1-100; PNG ignores it), within `limits`. On success returns DM_IMAGE_OK
   and a malloc'ed buffer in *out / *out_length, which the caller frees with dm_image_free; otherwise one of the
   other dm_image_status values, and nothing to free.
   The limits are checked in libjpeg's progress monitor (each scan, each row of blocks, each row decoded or
   encoded), between the rows of the resize, and between the stages; libpng's and libwebp's one-call decoders and
   encoders cannot be stopped midway: a budget used up inside one is noticed when it returns. */
int dm_image_transcode(const uint8_t *data, size_t length, const dm_image_info *info, uint32_t max_width,
                       int quality, int out_format, const dm_image_limits *limits, uint8_t **out, size_t *out_length);

void dm_image_free(uint8_t *buffer);

/* Gives the calling thread (only it: Linux threads have their own nice value) a lower scheduling priority. */
void dm_image_lower_thread_priority(int nice_value);
#endif
