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

/* Decodes `data` (`info` from dm_image_probe), resizes it to at most `max_width` pixels wide (aspect kept),
   encodes it as `out_format` at `quality` (1-100; PNG ignores it). On success returns 0 and a malloc'ed buffer
   in *out / *out_length, which the caller frees with dm_image_free. -1 on any failure. */
int dm_image_transcode(const uint8_t *data, size_t length, const dm_image_info *info, uint32_t max_width,
                       int quality, int out_format, uint8_t **out, size_t *out_length);

void dm_image_free(uint8_t *buffer);

/* Gives the calling thread (only it: Linux threads have their own nice value) a lower scheduling priority. */
void dm_image_lower_thread_priority(int nice_value);
#endif
