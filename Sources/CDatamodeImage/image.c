#define _GNU_SOURCE
#include "dm_image.h"
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <jpeglib.h>
#include <png.h>
#include <webp/decode.h>
#include <webp/encode.h>

/* ---------- probing: headers only ---------- */

static uint32_t be16(const uint8_t *p) { return ((uint32_t)p[0] << 8) | p[1]; }
static uint32_t be32(const uint8_t *p) { return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3]; }
static uint32_t le24(const uint8_t *p) { return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16); }
static uint32_t le32(const uint8_t *p) { return le24(p) | ((uint32_t)p[3] << 24); }

static int probe_jpeg(const uint8_t *d, size_t n, dm_image_info *info) {
    size_t i = 2;
    while (i + 4 <= n) {
        if (d[i] != 0xFF) return -1;
        uint8_t marker = d[i + 1];
        if (marker == 0xFF) { i++; continue; }
        if (marker == 0xD8 || (marker >= 0xD0 && marker <= 0xD7) || marker == 0x01) { i += 2; continue; }
        if (marker == 0xD9 || marker == 0xDA) return -1; /* end or scan before a frame header */
        uint32_t segment = be16(d + i + 2);
        if (segment < 2) return -1;
        /* SOF0..SOF15 except DHT (C4), JPG (C8), DAC (CC) */
        if (marker >= 0xC0 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 && marker != 0xCC) {
            if (i + 9 > n) return -1;
            info->height = be16(d + i + 5);
            info->width = be16(d + i + 7);
            info->format = DM_IMAGE_JPEG;
            return (info->width && info->height) ? 0 : -1;
        }
        i += 2 + segment;
    }
    return -1;
}

static int probe_png(const uint8_t *d, size_t n, dm_image_info *info) {
    static const uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
    if (n < 33 || memcmp(d, sig, 8) != 0 || memcmp(d + 12, "IHDR", 4) != 0) return -1;
    info->width = be32(d + 16);
    info->height = be32(d + 20);
    info->format = DM_IMAGE_PNG;
    /* An APNG has an acTL chunk before the first IDAT. */
    size_t i = 8;
    while (i + 8 <= n) {
        uint32_t len = be32(d + i);
        if (memcmp(d + i + 4, "acTL", 4) == 0) { info->animated = 1; break; }
        if (memcmp(d + i + 4, "IDAT", 4) == 0) break;
        if (len > n) break;
        i += 12 + (size_t)len;
    }
    return (info->width && info->height && info->width < 0x80000000u && info->height < 0x80000000u) ? 0 : -1;
}

static int probe_webp(const uint8_t *d, size_t n, dm_image_info *info) {
    if (n < 30 || memcmp(d, "RIFF", 4) != 0 || memcmp(d + 8, "WEBP", 4) != 0) return -1;
    info->format = DM_IMAGE_WEBP;
    const uint8_t *c = d + 12;
    if (memcmp(c, "VP8X", 4) == 0) {
        info->animated = (c[8] & 0x02) != 0;
        info->width = le24(c + 12) + 1;
        info->height = le24(c + 15) + 1;
        return 0;
    }
    if (memcmp(c, "VP8 ", 4) == 0) {
        if (c[11] != 0x9D || c[12] != 0x01 || c[13] != 0x2A) return -1;
        info->width = (uint32_t)(c[14] | (c[15] << 8)) & 0x3FFF;
        info->height = (uint32_t)(c[16] | (c[17] << 8)) & 0x3FFF;
        return (info->width && info->height) ? 0 : -1;
    }
    if (memcmp(c, "VP8L", 4) == 0) {
        if (c[8] != 0x2F) return -1;
        uint32_t bits = le32(c + 9);
        info->width = (bits & 0x3FFF) + 1;
        info->height = ((bits >> 14) & 0x3FFF) + 1;
        return 0;
    }
    return -1;
}

int dm_image_probe(const uint8_t *data, size_t length, dm_image_info *info) {
    memset(info, 0, sizeof(*info));
    if (length >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF) return probe_jpeg(data, length, info);
    if (length >= 8 && data[0] == 0x89 && data[1] == 'P') return probe_png(data, length, info);
    if (length >= 12 && memcmp(data, "RIFF", 4) == 0) return probe_webp(data, length, info);
    return -1;
}

/* ---------- limits on the work of one transcode ---------- */

/* The limits while a transcode runs. The budget is the thread's CPU time, not the wall clock: the pool runs at a
   lower priority than the event loops, so on a busy machine a wall-clock budget would measure the load, not the
   image, and give up on ordinary images. */
typedef struct {
    int max_scans;
    uint64_t deadline; /* on the thread's CPU clock, in ns; 0: none */
    int exceeded;      /* DM_IMAGE_TOO_MANY_SCANS or DM_IMAGE_TOO_SLOW once a limit is hit */
} work_limits;

static uint64_t thread_cpu_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* 1 (and noted) when the budget is used up. */
static int out_of_time(work_limits *limits) {
    if (limits->deadline != 0 && thread_cpu_ns() > limits->deadline) limits->exceeded = DM_IMAGE_TOO_SLOW;
    return limits->exceeded != 0;
}

/* ---------- decoding to 8-bit RGB or RGBA ---------- */

typedef struct { uint8_t *pixels; uint32_t width, height; int channels; } raster;

struct jpeg_failure { struct jpeg_error_mgr manager; jmp_buf jump; };
static void jpeg_fail(j_common_ptr cinfo) { longjmp(((struct jpeg_failure *)cinfo->err)->jump, 1); }
static void jpeg_quiet(j_common_ptr cinfo, int level) { (void)cinfo; (void)level; }

/* libjpeg calls its progress monitor before each scan is taken in, after each row of blocks and for each row
   decoded or encoded: the place to stop a decode that takes too many passes over the image (a progressive JPEG may
   repeat scans that add nothing; the decoder only warns, as djpeg does without -maxscans) or too long. Stopping is
   the error path: longjmp to the setjmp of the caller, which frees everything. */
struct jpeg_watch { struct jpeg_progress_mgr manager; work_limits *limits; };
static void jpeg_check_limits(j_common_ptr cinfo) {
    work_limits *limits = ((struct jpeg_watch *)cinfo->progress)->limits;
    if (cinfo->is_decompressor && limits->max_scans > 0
        && ((j_decompress_ptr)cinfo)->input_scan_number > limits->max_scans)
        limits->exceeded = DM_IMAGE_TOO_MANY_SCANS;
    if (limits->exceeded || out_of_time(limits)) jpeg_fail(cinfo);
}

/* Decodes a JPEG, letting libjpeg-turbo scale by 1/2, 1/4 or 1/8 while decoding when the image is at least
   that much wider than the target (the cheapest resize there is). */
static int decode_jpeg(const uint8_t *d, size_t n, const dm_image_info *info, uint32_t max_width, work_limits *limits,
                       raster *out) {
    struct jpeg_decompress_struct cinfo;
    struct jpeg_failure failure;
    struct jpeg_watch watch = {.manager = {.progress_monitor = jpeg_check_limits}, .limits = limits};
    volatile uint8_t *pixels = NULL;
    cinfo.err = jpeg_std_error(&failure.manager);
    failure.manager.error_exit = jpeg_fail;
    failure.manager.emit_message = jpeg_quiet;
    if (setjmp(failure.jump)) { jpeg_destroy_decompress(&cinfo); free((void *)pixels); return -1; }
    jpeg_create_decompress(&cinfo);
    cinfo.progress = &watch.manager;
    jpeg_mem_src(&cinfo, d, (unsigned long)n);
    jpeg_read_header(&cinfo, TRUE);
    /* The size the caller checked (max-pixels) must be the size decoded. */
    if (cinfo.image_width != info->width || cinfo.image_height != info->height) longjmp(failure.jump, 1);
    cinfo.out_color_space = JCS_RGB;
    unsigned denom = 1;
    while (denom < 8 && cinfo.image_width / (denom * 2) >= max_width) denom *= 2;
    cinfo.scale_num = 1;
    cinfo.scale_denom = denom;
    cinfo.dct_method = JDCT_ISLOW;
    jpeg_start_decompress(&cinfo);
    size_t stride = (size_t)cinfo.output_width * 3;
    pixels = malloc(stride * cinfo.output_height);
    if (!pixels) longjmp(failure.jump, 1);
    while (cinfo.output_scanline < cinfo.output_height) {
        JSAMPROW row = (JSAMPROW)(pixels + stride * cinfo.output_scanline);
        jpeg_read_scanlines(&cinfo, &row, 1);
    }
    out->width = cinfo.output_width;
    out->height = cinfo.output_height;
    out->channels = 3;
    out->pixels = (uint8_t *)pixels;
    jpeg_finish_decompress(&cinfo);
    jpeg_destroy_decompress(&cinfo);
    return 0;
}

static int decode_png(const uint8_t *d, size_t n, const dm_image_info *info, raster *out) {
    png_image image;
    memset(&image, 0, sizeof(image));
    image.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_memory(&image, d, n)) return -1;
    if (image.width != info->width || image.height != info->height) { png_image_free(&image); return -1; }
    int alpha = (image.format & PNG_FORMAT_FLAG_ALPHA) != 0;
    image.format = alpha ? PNG_FORMAT_RGBA : PNG_FORMAT_RGB;
    size_t size = PNG_IMAGE_SIZE(image);
    uint8_t *pixels = malloc(size);
    if (!pixels) { png_image_free(&image); return -1; }
    if (!png_image_finish_read(&image, NULL, pixels, 0, NULL)) { free(pixels); png_image_free(&image); return -1; }
    out->pixels = pixels;
    out->width = image.width;
    out->height = image.height;
    out->channels = alpha ? 4 : 3;
    return 0;
}

static int decode_webp(const uint8_t *d, size_t n, const dm_image_info *info, int alpha, raster *out) {
    int w = 0, h = 0;
    if (!WebPGetInfo(d, n, &w, &h) || (uint32_t)w != info->width || (uint32_t)h != info->height) return -1;
    uint8_t *pixels = alpha ? WebPDecodeRGBA(d, n, &w, &h) : WebPDecodeRGB(d, n, &w, &h);
    if (!pixels) return -1;
    /* Copy into malloc'ed memory so that every raster is freed the same way. */
    size_t size = (size_t)w * h * (alpha ? 4 : 3);
    uint8_t *copy = malloc(size);
    if (!copy) { WebPFree(pixels); return -1; }
    memcpy(copy, pixels, size);
    WebPFree(pixels);
    out->pixels = copy;
    out->width = (uint32_t)w;
    out->height = (uint32_t)h;
    out->channels = alpha ? 4 : 3;
    return 0;
}

/* ---------- resizing: area averaging (box filter over the source pixels each target pixel covers) ---------- */

static int resize(raster *r, uint32_t max_width, work_limits *limits) {
    if (r->width <= max_width) return 0;
    uint32_t tw = max_width;
    uint32_t th = (uint32_t)(((uint64_t)r->height * tw + r->width / 2) / r->width);
    if (th == 0) th = 1;
    int c = r->channels;
    uint8_t *dst = malloc((size_t)tw * th * c);
    if (!dst) return -1;
    for (uint32_t y = 0; y < th; y++) {
        if (out_of_time(limits)) { free(dst); return -1; }
        uint32_t y0 = (uint32_t)((uint64_t)y * r->height / th);
        uint32_t y1 = (uint32_t)((uint64_t)(y + 1) * r->height / th);
        if (y1 <= y0) y1 = y0 + 1;
        for (uint32_t x = 0; x < tw; x++) {
            uint32_t x0 = (uint32_t)((uint64_t)x * r->width / tw);
            uint32_t x1 = (uint32_t)((uint64_t)(x + 1) * r->width / tw);
            if (x1 <= x0) x1 = x0 + 1;
            uint32_t sum[4] = {0, 0, 0, 0};
            for (uint32_t sy = y0; sy < y1; sy++) {
                const uint8_t *p = r->pixels + ((size_t)sy * r->width + x0) * c;
                for (uint32_t sx = x0; sx < x1; sx++, p += c)
                    for (int k = 0; k < c; k++) sum[k] += p[k];
            }
            uint32_t count = (y1 - y0) * (x1 - x0);
            uint8_t *q = dst + ((size_t)y * tw + x) * c;
            for (int k = 0; k < c; k++) q[k] = (uint8_t)((sum[k] + count / 2) / count);
        }
    }
    free(r->pixels);
    r->pixels = dst;
    r->width = tw;
    r->height = th;
    return 0;
}

/* ---------- encoding ---------- */

static int encode_jpeg(const raster *r, int quality, work_limits *limits, uint8_t **out, size_t *out_length) {
    struct jpeg_compress_struct cinfo;
    struct jpeg_failure failure;
    struct jpeg_watch watch = {.manager = {.progress_monitor = jpeg_check_limits}, .limits = limits};
    unsigned char *volatile buffer = NULL;
    unsigned long size = 0;
    volatile uint8_t *rgb = NULL;
    cinfo.err = jpeg_std_error(&failure.manager);
    failure.manager.error_exit = jpeg_fail;
    failure.manager.emit_message = jpeg_quiet;
    if (setjmp(failure.jump)) { jpeg_destroy_compress(&cinfo); free(buffer); free((void *)rgb); return -1; }
    jpeg_create_compress(&cinfo);
    cinfo.progress = &watch.manager;
    jpeg_mem_dest(&cinfo, (unsigned char **)&buffer, &size);
    cinfo.image_width = r->width;
    cinfo.image_height = r->height;
    cinfo.input_components = 3;
    cinfo.in_color_space = JCS_RGB;
    jpeg_set_defaults(&cinfo);
    jpeg_set_quality(&cinfo, quality, TRUE);
    cinfo.optimize_coding = TRUE;
    jpeg_start_compress(&cinfo, TRUE);
    const uint8_t *source = r->pixels;
    if (r->channels == 4) { /* alpha cannot go to JPEG: composite on white */
        size_t count = (size_t)r->width * r->height;
        rgb = malloc(count * 3);
        if (!rgb) longjmp(failure.jump, 1);
        for (size_t i = 0; i < count; i++) {
            unsigned a = r->pixels[i * 4 + 3];
            for (int k = 0; k < 3; k++)
                rgb[i * 3 + k] = (uint8_t)((r->pixels[i * 4 + k] * a + 255 * (255 - a) + 127) / 255);
        }
        source = (const uint8_t *)rgb;
    }
    while (cinfo.next_scanline < cinfo.image_height) {
        JSAMPROW row = (JSAMPROW)(source + (size_t)cinfo.next_scanline * r->width * 3);
        jpeg_write_scanlines(&cinfo, &row, 1);
    }
    jpeg_finish_compress(&cinfo);
    jpeg_destroy_compress(&cinfo);
    free((void *)rgb);
    *out = malloc(size);
    if (!*out) { free(buffer); return -1; }
    memcpy(*out, buffer, size);
    free(buffer);
    *out_length = size;
    return 0;
}

static int encode_webp(const raster *r, int quality, uint8_t **out, size_t *out_length) {
    uint8_t *encoded = NULL;
    size_t size = r->channels == 4
        ? WebPEncodeRGBA(r->pixels, (int)r->width, (int)r->height, (int)r->width * 4, (float)quality, &encoded)
        : WebPEncodeRGB(r->pixels, (int)r->width, (int)r->height, (int)r->width * 3, (float)quality, &encoded);
    if (size == 0 || !encoded) return -1;
    *out = malloc(size);
    if (!*out) { WebPFree(encoded); return -1; }
    memcpy(*out, encoded, size);
    WebPFree(encoded);
    *out_length = size;
    return 0;
}

static int encode_png(const raster *r, uint8_t **out, size_t *out_length) {
    png_image image;
    memset(&image, 0, sizeof(image));
    image.version = PNG_IMAGE_VERSION;
    image.width = r->width;
    image.height = r->height;
    image.format = r->channels == 4 ? PNG_FORMAT_RGBA : PNG_FORMAT_RGB;
    png_alloc_size_t size = 0;
    if (!png_image_write_get_memory_size(image, size, 0, r->pixels, 0, NULL)) return -1;
    uint8_t *buffer = malloc(size);
    if (!buffer) return -1;
    if (!png_image_write_to_memory(&image, buffer, &size, 0, r->pixels, 0, NULL)) { free(buffer); return -1; }
    *out = buffer;
    *out_length = size;
    return 0;
}

int dm_image_transcode(const uint8_t *data, size_t length, const dm_image_info *info, uint32_t max_width,
                       int quality, int out_format, const dm_image_limits *limits, uint8_t **out, size_t *out_length) {
    work_limits work = {
        .max_scans = limits->max_scans,
        .deadline = limits->cpu_budget_ns ? thread_cpu_ns() + limits->cpu_budget_ns : 0,
    };
    raster r = {0};
    int ok;
    int keep_alpha = out_format != DM_IMAGE_JPEG;
    switch (info->format) {
    case DM_IMAGE_JPEG: ok = decode_jpeg(data, length, info, max_width, &work, &r); break;
    case DM_IMAGE_PNG: ok = decode_png(data, length, info, &r); break;
    case DM_IMAGE_WEBP: ok = decode_webp(data, length, info, keep_alpha, &r); break;
    default: return DM_IMAGE_FAILED;
    }
    if (ok != 0) return work.exceeded ? work.exceeded : DM_IMAGE_FAILED;
    if (out_of_time(&work) || resize(&r, max_width, &work) != 0 || out_of_time(&work)) {
        free(r.pixels);
        return work.exceeded ? work.exceeded : DM_IMAGE_FAILED;
    }
    switch (out_format) {
    case DM_IMAGE_JPEG: ok = encode_jpeg(&r, quality, &work, out, out_length); break;
    case DM_IMAGE_WEBP: ok = encode_webp(&r, quality, out, out_length); break;
    case DM_IMAGE_PNG: ok = encode_png(&r, out, out_length); break;
    default: ok = -1;
    }
    free(r.pixels);
    if (ok != 0) return work.exceeded ? work.exceeded : DM_IMAGE_FAILED;
    return DM_IMAGE_OK;
}

void dm_image_free(uint8_t *buffer) { free(buffer); }

void dm_image_lower_thread_priority(int nice_value) {
    setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), nice_value);
}
