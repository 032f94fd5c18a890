/* pack_write.c - the packed-model writer behind `strata pack`.
 *
 * It plans every record first (formats, files, offsets), checks the plan with the loader's own
 * validator, then streams the tensors out in file order: each matrix is dequantized from the
 * source model row by row to fp32 and quantized again with qmat_quantize, a chunk of rows at a
 * time, on a thread pool. While writing it keeps a crc32 of every byte meant to be in each
 * file (padding included); after writing it re-reads every file and compares. The manifest is
 * written last (temporary file + rename), so a folder whose pack was interrupted has no
 * manifest and is never mistaken for a packed model. docs/PACKED_FORMAT.md has the layout.
 */
#include "model/packed.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "kernels/cpu/threadpool.h"

#define S_TRY(x)               \
    do {                       \
        rc = (x);              \
        if (rc < 0) goto fail; \
    } while (0)

#define S_CHUNK_FLOATS (4u << 20) /* fp32 staging per chunk: 16 MiB */

static const unsigned char s_zeros[65536];

void packed_write_opts_default(packed_write_opts_t *o, wfmt_t fmt)
{
    memset(o, 0, sizeof *o);
    o->fmt = fmt;
    o->group = 32;
    o->attn_fmt = fmt == WF_F32 ? WF_F32 : WF_BF16;
    o->embed_fmt = fmt == WF_F32 ? WF_F32 : WF_BF16;
    o->embed_as_source = true;
    o->alignment = PACKED_DEFAULT_ALIGN;
    o->threads = 0;
    o->progress = false;
}

static uint64_t s_align(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

/* The format and group of one tensor. INT4 needs cols to be a multiple of the group: a tensor
 * that does not fit takes the largest of 128/64/32 that divides it (not above the one asked),
 * and one whose cols is not a multiple of 32 falls back to INT8. */
static void s_pick_fmt(const packed_write_opts_t *o, const packed_slot_t *sl, wfmt_t *fmt, int32_t *group,
                       int32_t *fallbacks)
{
    wfmt_t f;
    switch (sl->cls) {
    case PC_NORM:
    case PC_BIAS:
    case PC_ROUTER:
    case PC_SHARED_GATE: f = WF_F32; break;
    case PC_EMBED: f = o->embed_fmt; break;
    case PC_LM_HEAD:
    case PC_ATTN: f = o->attn_fmt; break;
    default: f = o->fmt; break;
    }
    *group = 0;
    if (f == WF_MXFP4) {
        if (sl->cols % 32 == 0) {
            *group = 32;
        } else {
            f = WF_INT8;
            (*fallbacks)++;
            log_debug("pack: %s [%d x %d] does not fit mxfp4 blocks of 32; stored as int8", sl->name, sl->rows,
                      sl->cols);
        }
    }
    if (f == WF_INT4) {
        int32_t g = o->group;
        while (g >= 32 && sl->cols % g) g /= 2;
        if (g < 32) {
            f = WF_INT8;
            g = 0;
        }
        if (g != o->group) {
            (*fallbacks)++;
            log_debug("pack: %s [%d x %d] does not fit int4 group %d; stored as %s group %d", sl->name, sl->rows,
                      sl->cols, o->group, wfmt_name(f), g);
        }
        *group = g;
    }
    *fmt = f;
}

/* Plan: files, records and blocks for the slots, in slot order. */
static int s_plan(const model_config_t *c, const packed_slot_t *slots, int32_t n_slots,
                  const packed_write_opts_t *o, packed_manifest_t *pm, int32_t *fallbacks)
{
    int rc = 0;
    int32_t *layer_file = NULL;
    uint64_t *cursor = NULL;
    memset(pm, 0, sizeof *pm);
    pm->version = PACKED_VERSION;
    snprintf(pm->arch, sizeof pm->arch, "%s", c->arch_name);
    pm->fmt = o->fmt;
    pm->group = o->fmt == WF_INT4 ? o->group : o->fmt == WF_MXFP4 ? 32 : 0;
    pm->attn_fmt = o->attn_fmt;
    pm->embed_fmt = o->embed_fmt;
    pm->alignment = o->alignment;

    int32_t n_sparse = 0;
    for (int l = 0; l < c->n_layers; l++) n_sparse += c->layer_sparse[l] ? 1 : 0;
    pm->n_files = 1 + n_sparse;
    pm->files = calloc((size_t)pm->n_files, sizeof *pm->files);
    pm->tensors = calloc((size_t)n_slots, sizeof *pm->tensors);
    pm->blocks = calloc((size_t)n_sparse * (size_t)c->n_experts + 1, sizeof *pm->blocks);
    layer_file = calloc((size_t)c->n_layers + 1, sizeof *layer_file);
    cursor = calloc((size_t)pm->n_files, sizeof *cursor);
    if (!pm->files || !pm->tensors || !pm->blocks || !layer_file || !cursor) {
        rc = -ENOMEM;
        goto fail;
    }
    snprintf(pm->files[0].name, sizeof pm->files[0].name, "resident.bin");
    for (int l = 0, f = 1; l < c->n_layers; l++) {
        layer_file[l] = 0;
        if (!c->layer_sparse[l]) continue;
        snprintf(pm->files[f].name, sizeof pm->files[f].name, "experts-%03d.bin", l);
        layer_file[l] = f++;
    }
    pm->n_tensors = n_slots;
    for (int32_t s = 0; s < n_slots; s++) {
        const packed_slot_t *sl = &slots[s];
        packed_tensor_t *t = &pm->tensors[s];
        snprintf(t->name, sizeof t->name, "%s", sl->name);
        s_pick_fmt(o, sl, &t->fmt, &t->group, fallbacks);
        t->ndim = sl->ndim;
        t->rows = sl->rows;
        t->cols = sl->cols;
        t->file = sl->cls == PC_EXPERT ? layer_file[sl->layer] : 0;
        uint64_t *cur = &cursor[t->file];
        packed_block_t *b = NULL;
        if (sl->cls == PC_EXPERT) {
            /* slots list each expert's gate, up, down together; the first one opens a block */
            const packed_slot_t *prev = s > 0 ? &slots[s - 1] : NULL;
            if (!prev || prev->cls != PC_EXPERT || prev->layer != sl->layer || prev->expert != sl->expert) {
                *cur = s_align(*cur, pm->alignment);
                b = &pm->blocks[pm->n_blocks++];
                b->layer = sl->layer;
                b->expert = sl->expert;
                b->file = t->file;
                b->offset = *cur;
            } else {
                b = &pm->blocks[pm->n_blocks - 1];
                STRATA_ASSERT(b->layer == sl->layer && b->expert == sl->expert);
            }
        }
        t->bytes = qmat_data_bytes(t->fmt, t->rows, t->cols);
        t->scale_bytes = qmat_scale_bytes(t->fmt, t->rows, t->cols, t->group);
        *cur = s_align(*cur, PACKED_TENSOR_ALIGN);
        t->offset = *cur;
        *cur += t->bytes;
        if (t->scale_bytes) {
            *cur = s_align(*cur, PACKED_TENSOR_ALIGN);
            t->scale_offset = *cur;
            *cur += t->scale_bytes;
        }
        if (b) b->bytes = *cur - b->offset;
    }
    for (int32_t f = 0; f < pm->n_files; f++) pm->files[f].bytes = cursor[f];
    if (*fallbacks)
        log_warn("pack: %d tensors have columns that int4 group %d does not divide; they use a smaller group, or "
                 "int8 if 32 does not divide them either (the manifest records each; STRATA_LOG=debug lists them)",
                 *fallbacks, o->group);
    rc = 0;
    goto done;
fail:
    packed_manifest_free(pm);
done:
    free(layer_file);
    free(cursor);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Output files: sequential writes with a running crc32.                                      */

typedef struct {
    int fd;
    uint64_t pos;    /* bytes emitted so far (written or skipped as zeros) */
    uLong crc;       /* crc32 of bytes [0, pos) as meant to be in the file */
    char path[4200];
} s_out_t;

static int s_out_write(s_out_t *f, const void *buf, size_t n, strata_errbuf_t *eb)
{
    const unsigned char *p = buf;
    f->crc = crc32_z(f->crc, p, n);
    f->pos += n;
    while (n) {
        ssize_t w = write(f->fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return strata_seterr(eb, -errno, "%s: write failed: %s", f->path, strerror(errno));
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Zero padding up to `to`: a hole in the file (lseek), zeros in the crc. */
static int s_out_pad(s_out_t *f, uint64_t to, strata_errbuf_t *eb)
{
    STRATA_ASSERT(to >= f->pos);
    uint64_t gap = to - f->pos;
    if (!gap) return 0;
    if (lseek(f->fd, (off_t)gap, SEEK_CUR) < 0)
        return strata_seterr(eb, -errno, "%s: seek failed: %s", f->path, strerror(errno));
    for (uint64_t left = gap; left;) {
        size_t k = left < sizeof s_zeros ? (size_t)left : sizeof s_zeros;
        f->crc = crc32_z(f->crc, s_zeros, k);
        left -= k;
    }
    f->pos = to;
    return 0;
}

static int s_out_open(s_out_t *f, const char *dir, const char *name, strata_errbuf_t *eb)
{
    snprintf(f->path, sizeof f->path, "%s/%s", dir, name);
    f->pos = 0;
    f->crc = crc32(0, Z_NULL, 0);
    f->fd = open(f->path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (f->fd < 0) return strata_seterr(eb, -errno, "%s: cannot create: %s", f->path, strerror(errno));
    return 0;
}

/* Finish a file: check its length against the plan, make it durable, record the crc. */
static int s_out_close(s_out_t *f, packed_file_t *pf, strata_errbuf_t *eb)
{
    int rc = 0;
    if (f->fd < 0) return 0;
    if (f->pos != pf->bytes) {
        rc = strata_seterr(eb, STRATA_EIO, "%s: wrote %" PRIu64 " bytes, planned %" PRIu64, f->path, f->pos, pf->bytes);
    } else if (ftruncate(f->fd, (off_t)f->pos) < 0 || fdatasync(f->fd) < 0) {
        rc = strata_seterr(eb, -errno, "%s: cannot finish: %s", f->path, strerror(errno));
    }
    pf->crc32 = (uint32_t)f->crc;
    close(f->fd);
    f->fd = -1;
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Quantizing one chunk of rows on the pool.                                                  */

typedef struct {
    const qmat_t *src;
    wfmt_t fmt;
    int32_t group, cols, r0;   /* chunk starts at source row r0 */
    float *f32;                /* [chunk rows][cols] staging */
    unsigned char *data;       /* chunk's data bytes */
    unsigned char *scales;     /* whole tensor's scales */
    atomic_int err;
} s_chunk_t;

static void s_chunk_fn(void *ctx, int64_t i0, int64_t i1, int tid)
{
    s_chunk_t *c = ctx;
    const int64_t cols = c->cols;
    float *f = c->f32 + i0 * cols;
    for (int64_t i = i0; i < i1; i++) qmat_dequant_row(c->src, (int32_t)(c->r0 + i), c->f32 + i * cols);
    void *data = c->data + qmat_data_bytes(c->fmt, i0, cols);
    if (c->fmt == WF_F32) {
        memcpy(data, f, (size_t)(i1 - i0) * (size_t)cols * sizeof(float));
        return;
    }
    void *sc = c->scales ? c->scales + qmat_scale_bytes(c->fmt, c->r0 + i0, cols, c->group) : NULL;
    int rc = qmat_quantize(c->fmt, c->group, f, (int32_t)(i1 - i0), (int32_t)cols, data, sc);
    if (rc < 0) atomic_store(&c->err, rc);
}

/* Write one matrix: data in row chunks, then its scales. */
static int s_write_matrix(tpool_t *pool, s_out_t *out, const packed_tensor_t *t, const qmat_t *src,
                          float *f32, unsigned char *dbuf, strata_errbuf_t *eb)
{
    int rc = 0;
    unsigned char *scales = NULL;
    if (!src || !src->data || src->rows != t->rows || src->cols != t->cols)
        return strata_seterr(eb, STRATA_EINVAL_INPUT, "source model: tensor '%s' is missing or not [%d, %d]", t->name,
                             t->rows, t->cols);
    if (src->fmt == WF_MXFP4 && t->fmt == WF_MXFP4) {
        /* the source is in the format asked (an MXFP4 checkpoint packed as mxfp4, say): its
         * bytes are written as they are, never requantized */
        S_TRY(s_out_pad(out, t->offset, eb));
        S_TRY(s_out_write(out, src->data, t->bytes, eb));
        if (t->scale_bytes) {
            S_TRY(s_out_pad(out, t->scale_offset, eb));
            S_TRY(s_out_write(out, src->scales, t->scale_bytes, eb));
        }
        return 0;
    }
    if (t->scale_bytes) {
        scales = malloc(t->scale_bytes);
        if (!scales) return -ENOMEM;
    }
    int64_t chunk = S_CHUNK_FLOATS / (uint64_t)t->cols;
    if (chunk < 1) chunk = 1;
    S_TRY(s_out_pad(out, t->offset, eb));
    for (int64_t r0 = 0; r0 < t->rows; r0 += chunk) {
        int64_t n = t->rows - r0 < chunk ? t->rows - r0 : chunk;
        s_chunk_t c = {.src = src, .fmt = t->fmt, .group = t->group, .cols = t->cols, .r0 = (int32_t)r0,
                       .f32 = f32, .data = dbuf, .scales = scales};
        atomic_init(&c.err, 0);
        int64_t grain = 65536 / t->cols + 1;
        tpool_run(pool, n, grain, s_chunk_fn, &c);
        if (atomic_load(&c.err) < 0) {
            rc = strata_seterr(eb, STRATA_EINVAL_INPUT,
                               "cannot quantize '%s' [%d x %d] to %s in rows %lld..%lld: a NaN or Inf weight, or a "
                               "scale out of range",
                               t->name, t->rows, t->cols, wfmt_name(t->fmt), (long long)r0, (long long)(r0 + n - 1));
            goto fail;
        }
        S_TRY(s_out_write(out, dbuf, qmat_data_bytes(t->fmt, n, t->cols), eb));
    }
    if (t->scale_bytes) {
        S_TRY(s_out_pad(out, t->scale_offset, eb));
        S_TRY(s_out_write(out, scales, t->scale_bytes, eb));
    }
fail:
    free(scales);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Side files: config.json and the tokenizer files travel with the weights.                   */

int packed_copy_file(const char *src, const char *dst, bool required, uint32_t *crc_out, strata_errbuf_t *eb)
{
    int rc = 0, in = -1, out = -1;
    unsigned char buf[65536];
    uLong crc = crc32(0, Z_NULL, 0);
    in = open(src, O_RDONLY | O_CLOEXEC);
    if (in < 0) {
        if (!required && errno == ENOENT) return 0;
        return strata_seterr(eb, STRATA_EINVAL_INPUT, "%s: cannot open: %s", src, strerror(errno));
    }
    out = open(dst, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out < 0) {
        rc = strata_seterr(eb, -errno, "%s: cannot create: %s", dst, strerror(errno));
        goto fail;
    }
    for (;;) {
        ssize_t r = read(in, buf, sizeof buf);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            rc = strata_seterr(eb, STRATA_EIO, "%s: read failed: %s", src, strerror(errno));
            goto fail;
        }
        if (r == 0) break;
        crc = crc32(crc, buf, (uInt)r);
        for (ssize_t off = 0; off < r;) {
            ssize_t w = write(out, buf + off, (size_t)(r - off));
            if (w < 0 && errno == EINTR) continue;
            if (w < 0) {
                rc = strata_seterr(eb, -errno, "%s: write failed: %s", dst, strerror(errno));
                goto fail;
            }
            off += w;
        }
    }
    if (fdatasync(out) < 0) {
        rc = strata_seterr(eb, -errno, "%s: fdatasync failed: %s", dst, strerror(errno));
        goto fail;
    }
    if (crc_out) *crc_out = (uint32_t)crc;
fail:
    if (in >= 0) close(in);
    if (out >= 0) close(out);
    return rc;
}

static const char *const s_side_files[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                           "generation_config.json", "vocab.json", "merges.txt", "tokenizer.model",
                                           "chat_template.jinja", "chat_template.json", NULL};

int packed_copy_side_files(const char *src_dir, const char *dst_dir, uint32_t *config_crc, strata_errbuf_t *eb)
{
    char a[4200], b[4200];
    int rc;
    snprintf(a, sizeof a, "%s/config.json", src_dir);
    snprintf(b, sizeof b, "%s/config.json", dst_dir);
    if ((rc = packed_copy_file(a, b, true, config_crc, eb)) < 0) return rc;
    for (const char *const *sf = s_side_files; *sf; sf++) {
        snprintf(a, sizeof a, "%s/%s", src_dir, *sf);
        snprintf(b, sizeof b, "%s/%s", dst_dir, *sf);
        if ((rc = packed_copy_file(a, b, false, NULL, eb)) < 0) return rc;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */

int packed_plan(const model_config_t *c, const packed_write_opts_t *o, packed_manifest_t *pm, int32_t *fallbacks,
                strata_errbuf_t *eb)
{
    int rc = 0;
    packed_slot_t *slots = NULL;
    int32_t n_slots = 0, fb = 0;
    memset(pm, 0, sizeof *pm);
    if (o->fmt < 0 || o->fmt >= WF_COUNT || o->attn_fmt < 0 || o->attn_fmt >= WF_COUNT ||
        (o->embed_fmt != WF_F32 && o->embed_fmt != WF_BF16))
        return strata_seterr(eb, STRATA_EINVAL_INPUT, "packed_plan: bad format choice");
    if ((o->fmt == WF_INT4 || o->attn_fmt == WF_INT4) && o->group != 32 && o->group != 64 && o->group != 128)
        return strata_seterr(eb, STRATA_EINVAL_INPUT, "packed_plan: int4 group must be 32, 64 or 128 (got %d)", o->group);
    if (o->alignment < PACKED_MIN_ALIGN || o->alignment > PACKED_MAX_ALIGN || (o->alignment & (o->alignment - 1)))
        return strata_seterr(eb, STRATA_EINVAL_INPUT, "packed_plan: alignment %" PRIu64 " must be a power of two in [%u, %u]",
                             o->alignment, PACKED_MIN_ALIGN, PACKED_MAX_ALIGN);
    S_TRY(packed_slots(c, NULL, &slots, &n_slots));
    S_TRY(s_plan(c, slots, n_slots, o, pm, &fb));
    S_TRY(packed_manifest_check(pm, c, "pack plan", NULL, eb));
    if (fallbacks) *fallbacks = fb;
fail:
    if (rc < 0) packed_manifest_free(pm);
    free(slots);
    return rc;
}

int packed_write(const model_t *src, const char *src_dir, const char *out_dir, const packed_write_opts_t *o,
                 packed_write_stats_t *st, strata_errbuf_t *eb)
{
    int rc = 0;
    const model_config_t *c = &src->cfg;
    packed_slot_t *slots = NULL;
    int32_t n_slots = 0;
    packed_manifest_t pm = {0};
    tpool_t *pool = NULL;
    float *f32 = NULL;
    unsigned char *dbuf = NULL;
    s_out_t res = {.fd = -1}, exp = {.fd = -1};
    char b[4200];
    double t0 = strata_now();
    packed_write_stats_t stats = {0};
    packed_write_opts_t oo = *o;

    /* Embeddings in the source's precision by default: a BF16 table stays BF16 (lossless), an
     * F32 or F16 one is kept in F32. A row lookup costs no bandwidth to speak of, and measured
     * on the fp32 fixtures bf16-rounded embeddings alone move the logits more than bf16 experts
     * do (docs/PACKED_FORMAT.md). */
    if (oo.embed_as_source) oo.embed_fmt = src->embed.fmt == WF_BF16 ? WF_BF16 : WF_F32;
    o = &oo;

    if (o->fmt < 0 || o->fmt >= WF_COUNT || o->attn_fmt < 0 || o->attn_fmt >= WF_COUNT ||
        (o->embed_fmt != WF_F32 && o->embed_fmt != WF_BF16))
        return strata_seterr(eb, STRATA_EINVAL_INPUT, "packed_write: bad format choice");
    if (o->fmt == WF_INT4 || o->attn_fmt == WF_INT4) {
        if (o->group != 32 && o->group != 64 && o->group != 128)
            return strata_seterr(eb, STRATA_EINVAL_INPUT, "packed_write: int4 group must be 32, 64 or 128 (got %d)", o->group);
    }
    if (o->alignment < PACKED_MIN_ALIGN || o->alignment > PACKED_MAX_ALIGN || (o->alignment & (o->alignment - 1)))
        return strata_seterr(eb, STRATA_EINVAL_INPUT, "packed_write: alignment %" PRIu64 " must be a power of two in [%u, %u]",
                             o->alignment, PACKED_MIN_ALIGN, PACKED_MAX_ALIGN);
    if (packed_is_packed(out_dir))
        return strata_seterr(eb, STRATA_EEXISTS, "%s: already holds %s", out_dir, PACKED_MANIFEST);

    /* plan, and check the plan with the loader's validator before writing a byte */
    S_TRY(packed_slots(c, (model_t *)src, &slots, &n_slots));
    S_TRY(s_plan(c, slots, n_slots, o, &pm, &stats.fallbacks));
    S_TRY(packed_manifest_check(&pm, c, "pack plan", NULL, eb));

    S_TRY(packed_copy_side_files(src_dir, out_dir, &pm.config_crc32, eb));

    pool = tpool_create(o->threads);
    if (!pool) {
        rc = strata_seterr(eb, STRATA_ENOMEM, "packed_write: cannot start the thread pool");
        goto fail;
    }
    /* widest data of a chunk: F32, rows of at least one full row */
    int32_t max_cols = 1;
    for (int32_t s = 0; s < n_slots; s++)
        if (pm.tensors[s].cols > max_cols) max_cols = pm.tensors[s].cols;
    size_t dcap = ((size_t)S_CHUNK_FLOATS + (size_t)max_cols) * sizeof(float);
    f32 = malloc(dcap);
    dbuf = malloc(dcap);
    if (!f32 || !dbuf) {
        rc = -ENOMEM;
        goto fail;
    }

    S_TRY(s_out_open(&res, out_dir, pm.files[0].name, eb));
    int32_t cur_layer = -2;
    uint64_t written = 0;
    for (int32_t s = 0; s < n_slots; s++) {
        const packed_slot_t *sl = &slots[s];
        const packed_tensor_t *t = &pm.tensors[s];
        if (sl->layer != cur_layer) {
            /* layer boundary: report */
            if (o->progress && cur_layer >= 0) {
                double dt = strata_now() - t0;
                log_info("pack: layer %d/%d done: %.1f MiB written, %.1f MB/s", cur_layer + 1, c->n_layers,
                         (double)written / (1 << 20), dt > 0 ? (double)written / 1e6 / dt : 0.0);
            }
            cur_layer = sl->layer;
        }
        s_out_t *out = &res;
        if (t->file != 0) {
            if (exp.fd < 0) S_TRY(s_out_open(&exp, out_dir, pm.files[t->file].name, eb));
            out = &exp;
        }
        if (sl->v) {
            if (!*sl->v) {
                rc = strata_seterr(eb, STRATA_EINVAL_INPUT, "source model: vector '%s' is missing", sl->name);
                goto fail;
            }
            S_TRY(s_out_pad(out, t->offset, eb));
            S_TRY(s_out_write(out, *sl->v, (size_t)t->cols * sizeof(float), eb));
        } else {
            S_TRY(s_write_matrix(pool, out, t, sl->q, f32, dbuf, eb));
        }
        written += t->bytes + t->scale_bytes;
        stats.payload_bytes += t->bytes + t->scale_bytes;
        stats.params += (uint64_t)t->rows * (uint64_t)t->cols;
        if (sl->cls == PC_EXPERT || sl->cls == PC_SHARED || sl->cls == PC_DENSE) {
            stats.ffn_bytes += t->bytes + t->scale_bytes;
            stats.ffn_params += (uint64_t)t->rows * (uint64_t)t->cols;
        }
        /* the expert file of this layer is complete after its last expert's down */
        if (exp.fd >= 0 && (s + 1 == n_slots || pm.tensors[s + 1].file != t->file))
            S_TRY(s_out_close(&exp, &pm.files[t->file], eb));
    }
    S_TRY(s_out_close(&res, &pm.files[0], eb));
    if (o->progress) {
        double dt = strata_now() - t0;
        log_info("pack: all %d layers done: %.1f MiB written, %.1f MB/s", c->n_layers, (double)written / (1 << 20),
                 dt > 0 ? (double)written / 1e6 / dt : 0.0);
    }

    /* re-read and compare with the crc of what was meant to be written; the expert blocks'
     * crc32s come from the same re-read */
    double tv = strata_now();
    S_TRY(packed_verify(out_dir, &pm, true, eb));
    for (int32_t f = 0; f < pm.n_files; f++) stats.file_bytes += pm.files[f].bytes;
    if (o->progress)
        log_info("pack: verified %d files (%.1f MiB, crc32) in %.2f s", pm.n_files,
                 (double)stats.file_bytes / (1 << 20), strata_now() - tv);

    snprintf(b, sizeof b, "%s/%s", out_dir, PACKED_MANIFEST);
    S_TRY(packed_manifest_save(&pm, b, eb));
    int dfd = open(out_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        (void)fsync(dfd);
        close(dfd);
    }
    stats.seconds = strata_now() - t0;
    if (st) *st = stats;
    rc = 0;
fail:
    if (res.fd >= 0) close(res.fd);
    if (exp.fd >= 0) close(exp.fd);
    if (pool) tpool_destroy(pool);
    free(f32);
    free(dbuf);
    free(slots);
    packed_manifest_free(&pm);
    return rc;
}
