/* packed.c - the packed model format: tensor slots, manifest parse/check/save, verification
 * and model_load_packed (zero-copy mmap). docs/PACKED_FORMAT.md is the specification. */
#include "model/packed.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#define S_MAX_RECORDS (1 << 24)

/* Propagate an error quietly: input errors are reported once, through eb, by the caller. */
#define S_TRY(x)            \
    do {                    \
        rc = (x);           \
        if (rc < 0) goto fail; \
    } while (0)

/* ------------------------------------------------------------------------------------------ */
/* Slots: the tensors a config needs, in file order.                                          */

typedef struct {
    packed_slot_t *v;
    int32_t n, cap;
    int err;
} s_list_t;

__attribute__((format(printf, 10, 11)))
static void s_add(s_list_t *L, packed_class_t cls, int layer, int expert, int ndim, int rows, int cols,
                  qmat_t *q, float **v, const char *fmt, ...)
{
    if (L->err) return;
    if (L->n == L->cap) {
        int32_t cap = L->cap ? L->cap * 2 : 256;
        packed_slot_t *nv = realloc(L->v, (size_t)cap * sizeof *nv);
        if (!nv) {
            L->err = -ENOMEM;
            return;
        }
        L->v = nv;
        L->cap = cap;
    }
    packed_slot_t *s = &L->v[L->n++];
    memset(s, 0, sizeof *s);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->name, sizeof s->name, fmt, ap);
    va_end(ap);
    s->cls = cls;
    s->layer = layer;
    s->expert = expert;
    s->ndim = ndim;
    s->rows = rows;
    s->cols = cols;
    s->q = q;
    s->v = v;
}

int packed_slots(const model_config_t *c, model_t *m, packed_slot_t **out, int32_t *n_out)
{
    s_list_t L = {0};
    const int H = c->hidden, hd = c->head_dim;
    const int nq = c->n_heads * hd, nkv = c->n_kv_heads * hd;

    s_add(&L, PC_EMBED, -1, -1, 2, c->vocab, H, m ? &m->embed : NULL, NULL, "embed");
    for (int l = 0; l < c->n_layers; l++) {
        layer_t *ly = m ? &m->layers[l] : NULL;
#define QP(f) (ly ? &ly->f : NULL)
        s_add(&L, PC_NORM, l, -1, 1, 1, H, NULL, QP(attn_norm), "layers.%d.attn_norm", l);
        s_add(&L, PC_ATTN, l, -1, 2, nq, H, QP(wq), NULL, "layers.%d.wq", l);
        s_add(&L, PC_ATTN, l, -1, 2, nkv, H, QP(wk), NULL, "layers.%d.wk", l);
        s_add(&L, PC_ATTN, l, -1, 2, nkv, H, QP(wv), NULL, "layers.%d.wv", l);
        s_add(&L, PC_ATTN, l, -1, 2, H, nq, QP(wo), NULL, "layers.%d.wo", l);
        if (c->qkv_bias) {
            s_add(&L, PC_BIAS, l, -1, 1, 1, nq, NULL, QP(bq), "layers.%d.bq", l);
            s_add(&L, PC_BIAS, l, -1, 1, 1, nkv, NULL, QP(bk), "layers.%d.bk", l);
            s_add(&L, PC_BIAS, l, -1, 1, 1, nkv, NULL, QP(bv), "layers.%d.bv", l);
        }
        if (c->o_bias) s_add(&L, PC_BIAS, l, -1, 1, 1, H, NULL, QP(bo), "layers.%d.bo", l);
        if (c->qk_norm == QK_NORM_HEAD) {
            s_add(&L, PC_NORM, l, -1, 1, 1, hd, NULL, QP(q_norm), "layers.%d.q_norm", l);
            s_add(&L, PC_NORM, l, -1, 1, 1, hd, NULL, QP(k_norm), "layers.%d.k_norm", l);
        } else if (c->qk_norm == QK_NORM_FULL) {
            s_add(&L, PC_NORM, l, -1, 1, 1, nq, NULL, QP(q_norm), "layers.%d.q_norm", l);
            s_add(&L, PC_NORM, l, -1, 1, 1, nkv, NULL, QP(k_norm), "layers.%d.k_norm", l);
        }
        if (c->attn_sinks) s_add(&L, PC_BIAS, l, -1, 1, 1, c->n_heads, NULL, QP(sinks), "layers.%d.sinks", l);
        s_add(&L, PC_NORM, l, -1, 1, 1, H, NULL, QP(ffn_norm), "layers.%d.ffn_norm", l);
        if (c->layer_sparse[l]) {
            s_add(&L, PC_ROUTER, l, -1, 2, c->n_experts, H, QP(router), NULL, "layers.%d.router", l);
            if (c->router_bias)
                s_add(&L, PC_BIAS, l, -1, 1, 1, c->n_experts, NULL, QP(router_b), "layers.%d.router_bias", l);
            if (c->expert_bias) {
                /* every expert's biases of the layer, [n_experts][inter] / [n_experts][hidden]:
                 * resident, indexed by expert, so an expert block holds matrices only */
                const int EI = c->n_experts * c->moe_inter, EH = c->n_experts * H;
                s_add(&L, PC_BIAS, l, -1, 1, 1, EI, NULL, QP(egate_b), "layers.%d.experts_gate_bias", l);
                s_add(&L, PC_BIAS, l, -1, 1, 1, EI, NULL, QP(eup_b), "layers.%d.experts_up_bias", l);
                s_add(&L, PC_BIAS, l, -1, 1, 1, EH, NULL, QP(edown_b), "layers.%d.experts_down_bias", l);
            }
            for (int e = 0; e < c->n_experts; e++) {
                ffn_t *x = (ly && ly->experts) ? &ly->experts[e] : NULL;
                const int I = c->moe_inter;
                s_add(&L, PC_EXPERT, l, e, 2, I, H, x ? &x->gate : NULL, NULL, "layers.%d.experts.%d.gate", l, e);
                s_add(&L, PC_EXPERT, l, e, 2, I, H, x ? &x->up : NULL, NULL, "layers.%d.experts.%d.up", l, e);
                s_add(&L, PC_EXPERT, l, e, 2, H, I, x ? &x->down : NULL, NULL, "layers.%d.experts.%d.down", l, e);
            }
            if (c->shared_inter > 0) {
                const int I = c->shared_inter;
                s_add(&L, PC_SHARED, l, -1, 2, I, H, QP(shared.gate), NULL, "layers.%d.shared.gate", l);
                s_add(&L, PC_SHARED, l, -1, 2, I, H, QP(shared.up), NULL, "layers.%d.shared.up", l);
                s_add(&L, PC_SHARED, l, -1, 2, H, I, QP(shared.down), NULL, "layers.%d.shared.down", l);
                s_add(&L, PC_SHARED_GATE, l, -1, 2, 1, H, QP(shared_gate), NULL, "layers.%d.shared_gate", l);
            }
        } else {
            const int I = c->dense_inter;
            s_add(&L, PC_DENSE, l, -1, 2, I, H, QP(dense.gate), NULL, "layers.%d.dense.gate", l);
            s_add(&L, PC_DENSE, l, -1, 2, I, H, QP(dense.up), NULL, "layers.%d.dense.up", l);
            s_add(&L, PC_DENSE, l, -1, 2, H, I, QP(dense.down), NULL, "layers.%d.dense.down", l);
        }
#undef QP
    }
    s_add(&L, PC_NORM, -1, -1, 1, 1, H, NULL, m ? &m->final_norm : NULL, "final_norm");
    if (!c->tie_embeddings)
        s_add(&L, PC_LM_HEAD, -1, -1, 2, c->vocab, H, m ? &m->lm_head : NULL, NULL, "lm_head");
    if (L.err) {
        free(L.v);
        return L.err;
    }
    *out = L.v;
    *n_out = L.n;
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Manifest parsing.                                                                          */

static bool s_key_in(const char *key, const char *const *allowed)
{
    for (; *allowed; allowed++)
        if (!strcmp(key, *allowed)) return true;
    return false;
}

/* Every key of o must be in allowed. */
static int s_keys_known(json_t *o, const char *const *allowed, const char *where, const char *name,
                        strata_errbuf_t *eb)
{
    const char *key;
    json_t *v;
    json_object_foreach(o, key, v) {
        if (!s_key_in(key, allowed))
            return strata_seterr(eb, STRATA_EFORMAT, "%s: unknown field '%s%s'", name, where, key);
    }
    return 0;
}

static int s_get_int(json_t *o, const char *key, const char *where, int64_t lo, int64_t hi, int64_t *out,
                     const char *name, strata_errbuf_t *eb)
{
    json_t *v = json_object_get(o, key);
    if (!v) return strata_seterr(eb, STRATA_EFORMAT, "%s: field '%s%s' is missing", name, where, key);
    if (!json_is_integer(v))
        return strata_seterr(eb, STRATA_EFORMAT, "%s: field '%s%s' must be an integer", name, where, key);
    int64_t x = (int64_t)json_integer_value(v);
    if (x < lo || x > hi)
        return strata_seterr(eb, STRATA_EFORMAT, "%s: field '%s%s' = %" PRId64 " is out of range [%" PRId64 ", %" PRId64 "]",
                             name, where, key, x, lo, hi);
    *out = x;
    return 0;
}

static int s_get_str(json_t *o, const char *key, const char *where, char *dst, size_t cap, const char *name,
                     strata_errbuf_t *eb)
{
    json_t *v = json_object_get(o, key);
    if (!v) return strata_seterr(eb, STRATA_EFORMAT, "%s: field '%s%s' is missing", name, where, key);
    if (!json_is_string(v))
        return strata_seterr(eb, STRATA_EFORMAT, "%s: field '%s%s' must be a string", name, where, key);
    size_t n = json_string_length(v);
    const char *s = json_string_value(v);
    if (n == 0 || n >= cap || strlen(s) != n)
        return strata_seterr(eb, STRATA_EFORMAT, "%s: field '%s%s' must be a non-empty string shorter than %zu bytes",
                             name, where, key, cap);
    memcpy(dst, s, n + 1);
    return 0;
}

static int s_get_fmt(json_t *o, const char *key, const char *where, wfmt_t *out, const char *name,
                     strata_errbuf_t *eb)
{
    char s[16];
    int rc = s_get_str(o, key, where, s, sizeof s, name, eb);
    if (rc < 0) return rc;
    int f = wfmt_parse(s);
    if (f < 0 || f >= WF_COUNT)
        return strata_seterr(eb, STRATA_EFORMAT, "%s: field '%s%s' = '%s' is not a weight format (f32, bf16, int8, fp8, int4)",
                             name, where, key, s);
    *out = (wfmt_t)f;
    return 0;
}

/* A file name must be plain: [A-Za-z0-9._-], not starting with '.'. */
static bool s_plain_name(const char *s)
{
    if (!*s || *s == '.') return false;
    for (; *s; s++) {
        char ch = *s;
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '.' ||
              ch == '_' || ch == '-'))
            return false;
    }
    return true;
}

static json_t *s_get_array(json_t *o, const char *key, const char *name, strata_errbuf_t *eb, int *rc)
{
    json_t *v = json_object_get(o, key);
    if (!v) {
        *rc = strata_seterr(eb, STRATA_EFORMAT, "%s: field '%s' is missing", name, key);
        return NULL;
    }
    if (!json_is_array(v) || json_array_size(v) > S_MAX_RECORDS) {
        *rc = strata_seterr(eb, STRATA_EFORMAT, "%s: field '%s' must be an array of at most %d records", name, key,
                            S_MAX_RECORDS);
        return NULL;
    }
    return v;
}

/* Record i of the array field `key` (arr): an object with no key outside `keys`. `where` gets
 * "key[i]." for the messages about its fields. NULL with *rc set on error. */
static json_t *s_record(json_t *arr, const char *key, int32_t i, const char *const *keys, char *where, size_t cap,
                        const char *name, strata_errbuf_t *eb, int *rc)
{
    json_t *o = json_array_get(arr, (size_t)i);
    snprintf(where, cap, "%s[%d].", key, i);
    if (!json_is_object(o)) {
        *rc = strata_seterr(eb, STRATA_EFORMAT, "%s: field '%s[%d]' must be an object", name, key, i);
        return NULL;
    }
    *rc = s_keys_known(o, keys, where, name, eb);
    return *rc < 0 ? NULL : o;
}

static int s_file_index(const packed_manifest_t *pm, json_t *o, const char *where, int32_t *out, const char *name,
                        strata_errbuf_t *eb)
{
    char fname[64];
    int rc = s_get_str(o, "file", where, fname, sizeof fname, name, eb);
    if (rc < 0) return rc;
    for (int32_t i = 0; i < pm->n_files; i++) {
        if (!strcmp(pm->files[i].name, fname)) {
            *out = i;
            return 0;
        }
    }
    return strata_seterr(eb, STRATA_EFORMAT, "%s: field '%sfile' = '%s' is not listed in 'files'", name, where, fname);
}

void packed_manifest_free(packed_manifest_t *pm)
{
    if (!pm) return;
    free(pm->files);
    free(pm->tensors);
    free(pm->blocks);
    memset(pm, 0, sizeof *pm);
}

int packed_manifest_parse(packed_manifest_t *pm, const char *json, size_t len, const char *name,
                          strata_errbuf_t *eb)
{
    static const char *const top_keys[] = {"magic", "version", "created_by", "arch", "format", "group", "attn_format",
                                           "embed_format", "alignment", "tensor_align", "config", "config_crc32",
                                           "files", "tensors", "experts", "stats", NULL};
    static const char *const file_keys[] = {"name", "bytes", "crc32", NULL};
    static const char *const tensor_keys[] = {"name", "format", "shape", "group", "file", "offset", "bytes",
                                              "scale_offset", "scale_bytes", NULL};
    static const char *const block_keys[] = {"layer", "expert", "file", "offset", "bytes", "crc32", NULL};
    const int64_t U63 = INT64_MAX;
    int rc = 0;
    int64_t x;
    char s[64], where[64];
    json_error_t jerr;
    memset(pm, 0, sizeof *pm);

    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        rc = strata_seterr(eb, STRATA_EFORMAT, "%s: not valid JSON (line %d, column %d): %s", name, jerr.line,
                           jerr.column, jerr.text);
        goto fail;
    }
    if (!json_is_object(root)) {
        rc = strata_seterr(eb, STRATA_EFORMAT, "%s: the manifest must be a JSON object", name);
        goto fail;
    }
    /* magic and version first: a later version may change every other field. */
    S_TRY(s_get_str(root, "magic", "", s, sizeof s, name, eb));
    if (strcmp(s, PACKED_MAGIC)) {
        rc = strata_seterr(eb, STRATA_EFORMAT, "%s: field 'magic' = '%s', expected '%s'", name, s, PACKED_MAGIC);
        goto fail;
    }
    S_TRY(s_get_int(root, "version", "", 0, INT32_MAX, &x, name, eb));
    if (x != PACKED_VERSION) {
        rc = strata_seterr(eb, STRATA_EVERSION, "%s: field 'version' = %" PRId64 ", this build reads version %d (repack the model)",
                           name, x, PACKED_VERSION);
        goto fail;
    }
    pm->version = (int32_t)x;
    S_TRY(s_keys_known(root, top_keys, "", name, eb));
    S_TRY(s_get_str(root, "arch", "", pm->arch, sizeof pm->arch, name, eb));
    S_TRY(s_get_fmt(root, "format", "", &pm->fmt, name, eb));
    S_TRY(s_get_fmt(root, "attn_format", "", &pm->attn_fmt, name, eb));
    S_TRY(s_get_fmt(root, "embed_format", "", &pm->embed_fmt, name, eb));
    S_TRY(s_get_int(root, "group", "", 0, 4096, &x, name, eb));
    pm->group = (int32_t)x;
    S_TRY(s_get_int(root, "alignment", "", PACKED_MIN_ALIGN, PACKED_MAX_ALIGN, &x, name, eb));
    if (x & (x - 1)) {
        rc = strata_seterr(eb, STRATA_EFORMAT, "%s: field 'alignment' = %" PRId64 " is not a power of two", name, x);
        goto fail;
    }
    pm->alignment = (uint64_t)x;
    S_TRY(s_get_int(root, "tensor_align", "", PACKED_TENSOR_ALIGN, PACKED_TENSOR_ALIGN, &x, name, eb));
    S_TRY(s_get_str(root, "config", "", s, sizeof s, name, eb));
    if (strcmp(s, "config.json")) {
        rc = strata_seterr(eb, STRATA_EFORMAT, "%s: field 'config' = '%s', expected 'config.json'", name, s);
        goto fail;
    }
    S_TRY(s_get_int(root, "config_crc32", "", 0, UINT32_MAX, &x, name, eb));
    pm->config_crc32 = (uint32_t)x;
    json_t *st = json_object_get(root, "stats");
    if (st && !json_is_object(st)) {
        rc = strata_seterr(eb, STRATA_EFORMAT, "%s: field 'stats' must be an object", name);
        goto fail;
    }
    json_t *cb = json_object_get(root, "created_by");
    if (cb && !json_is_string(cb)) {
        rc = strata_seterr(eb, STRATA_EFORMAT, "%s: field 'created_by' must be a string", name);
        goto fail;
    }

    /* files */
    json_t *arr = s_get_array(root, "files", name, eb, &rc);
    if (!arr) goto fail;
    pm->n_files = (int32_t)json_array_size(arr);
    if (pm->n_files == 0 || pm->n_files > 65536) {
        rc = strata_seterr(eb, STRATA_EFORMAT, "%s: field 'files' must list 1 to 65536 files", name);
        goto fail;
    }
    pm->files = calloc((size_t)pm->n_files, sizeof *pm->files);
    if (!pm->files) {
        rc = -ENOMEM;
        goto fail;
    }
    for (int32_t i = 0; i < pm->n_files; i++) {
        packed_file_t *f = &pm->files[i];
        json_t *o = s_record(arr, "files", i, file_keys, where, sizeof where, name, eb, &rc);
        if (!o) goto fail;
        S_TRY(s_get_str(o, "name", where, f->name, sizeof f->name, name, eb));
        if (!s_plain_name(f->name) || !strcmp(f->name, PACKED_MANIFEST) || !strcmp(f->name, "config.json")) {
            rc = strata_seterr(eb, STRATA_EFORMAT, "%s: field 'files[%d].name' = '%s' is not a plain weight file name",
                               name, i, f->name);
            goto fail;
        }
        for (int32_t j = 0; j < i; j++) {
            if (!strcmp(pm->files[j].name, f->name)) {
                rc = strata_seterr(eb, STRATA_EFORMAT, "%s: field 'files[%d].name' = '%s' repeats files[%d]", name, i,
                                   f->name, j);
                goto fail;
            }
        }
        S_TRY(s_get_int(o, "bytes", where, 0, U63, &x, name, eb));
        f->bytes = (uint64_t)x;
        S_TRY(s_get_int(o, "crc32", where, 0, UINT32_MAX, &x, name, eb));
        f->crc32 = (uint32_t)x;
    }

    /* tensors */
    arr = s_get_array(root, "tensors", name, eb, &rc);
    if (!arr) goto fail;
    pm->n_tensors = (int32_t)json_array_size(arr);
    pm->tensors = calloc((size_t)pm->n_tensors + 1, sizeof *pm->tensors);
    if (!pm->tensors) {
        rc = -ENOMEM;
        goto fail;
    }
    for (int32_t i = 0; i < pm->n_tensors; i++) {
        packed_tensor_t *t = &pm->tensors[i];
        json_t *o = s_record(arr, "tensors", i, tensor_keys, where, sizeof where, name, eb, &rc);
        if (!o) goto fail;
        S_TRY(s_get_str(o, "name", where, t->name, sizeof t->name, name, eb));
        S_TRY(s_get_fmt(o, "format", where, &t->fmt, name, eb));
        json_t *sh = json_object_get(o, "shape");
        size_t nd = json_is_array(sh) ? json_array_size(sh) : 0;
        if (nd < 1 || nd > 2) {
            rc = strata_seterr(eb, STRATA_EFORMAT, "%s: field 'tensors[%d].shape' must be an array of 1 or 2 integers",
                               name, i);
            goto fail;
        }
        int64_t dims[2] = {1, 1};
        for (size_t d = 0; d < nd; d++) {
            json_t *dv = json_array_get(sh, d);
            if (!json_is_integer(dv) || json_integer_value(dv) < 1 || json_integer_value(dv) > INT32_MAX) {
                rc = strata_seterr(eb, STRATA_EFORMAT, "%s: field 'tensors[%d].shape[%zu]' must be an integer in [1, %d]",
                                   name, i, d, INT32_MAX);
                goto fail;
            }
            dims[d] = (int64_t)json_integer_value(dv);
        }
        t->ndim = (int32_t)nd;
        t->rows = nd == 2 ? (int32_t)dims[0] : 1;
        t->cols = nd == 2 ? (int32_t)dims[1] : (int32_t)dims[0];
        S_TRY(s_get_int(o, "group", where, 0, 4096, &x, name, eb));
        t->group = (int32_t)x;
        S_TRY(s_file_index(pm, o, where, &t->file, name, eb));
        S_TRY(s_get_int(o, "offset", where, 0, U63, &x, name, eb));
        t->offset = (uint64_t)x;
        S_TRY(s_get_int(o, "bytes", where, 1, U63, &x, name, eb));
        t->bytes = (uint64_t)x;
        S_TRY(s_get_int(o, "scale_offset", where, 0, U63, &x, name, eb));
        t->scale_offset = (uint64_t)x;
        S_TRY(s_get_int(o, "scale_bytes", where, 0, U63, &x, name, eb));
        t->scale_bytes = (uint64_t)x;
    }

    /* expert blocks */
    arr = s_get_array(root, "experts", name, eb, &rc);
    if (!arr) goto fail;
    pm->n_blocks = (int32_t)json_array_size(arr);
    pm->blocks = calloc((size_t)pm->n_blocks + 1, sizeof *pm->blocks);
    if (!pm->blocks) {
        rc = -ENOMEM;
        goto fail;
    }
    for (int32_t i = 0; i < pm->n_blocks; i++) {
        packed_block_t *b = &pm->blocks[i];
        json_t *o = s_record(arr, "experts", i, block_keys, where, sizeof where, name, eb, &rc);
        if (!o) goto fail;
        S_TRY(s_get_int(o, "layer", where, 0, INT32_MAX, &x, name, eb));
        b->layer = (int32_t)x;
        S_TRY(s_get_int(o, "expert", where, 0, INT32_MAX, &x, name, eb));
        b->expert = (int32_t)x;
        S_TRY(s_file_index(pm, o, where, &b->file, name, eb));
        S_TRY(s_get_int(o, "offset", where, 0, U63, &x, name, eb));
        b->offset = (uint64_t)x;
        S_TRY(s_get_int(o, "bytes", where, 1, U63, &x, name, eb));
        b->bytes = (uint64_t)x;
        if (json_object_get(o, "crc32")) { /* optional: manifests before block crc32s have none */
            S_TRY(s_get_int(o, "crc32", where, 0, UINT32_MAX, &x, name, eb));
            b->crc32 = (uint32_t)x;
            b->has_crc = true;
        }
    }
    json_decref(root);
    return 0;
fail:
    json_decref(root);
    packed_manifest_free(pm);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Manifest check against a config.                                                          */

static bool s_fmt_allowed(packed_class_t cls, wfmt_t f)
{
    switch (cls) {
    case PC_NORM:
    case PC_BIAS:
    case PC_ROUTER:
    case PC_SHARED_GATE: return f == WF_F32;
    case PC_EMBED: return f == WF_F32 || f == WF_BF16;
    default: return f >= 0 && f < WF_COUNT;
    }
}

static const char *s_allowed_text(packed_class_t cls)
{
    switch (cls) {
    case PC_NORM:
    case PC_BIAS:
    case PC_ROUTER:
    case PC_SHARED_GATE: return "f32";
    case PC_EMBED: return "f32 or bf16";
    default: return "f32, bf16, int8, fp8 or int4";
    }
}

static int s_cmp_tensor_name(const void *a, const void *b, void *ctx)
{
    const packed_manifest_t *pm = ctx;
    return strcmp(pm->tensors[*(const int32_t *)a].name, pm->tensors[*(const int32_t *)b].name);
}

typedef struct {
    int32_t file;
    uint64_t start, end;
    int32_t who; /* tensor index, or -1 - block index */
} s_range_t;

static int s_cmp_range(const void *a, const void *b)
{
    const s_range_t *x = a, *y = b;
    if (x->file != y->file) return x->file < y->file ? -1 : 1;
    if (x->start != y->start) return x->start < y->start ? -1 : 1;
    return 0;
}

/* [off, off+len) inside a file of size fsz, without overflow. */
static bool s_inside(uint64_t off, uint64_t len, uint64_t fsz) { return len <= fsz && off <= fsz - len; }

int packed_manifest_check(const packed_manifest_t *pm, const model_config_t *c, const char *name,
                          int32_t *idx, strata_errbuf_t *eb)
{
    int rc = 0;
    packed_slot_t *slots = NULL;
    int32_t n_slots = 0;
    int32_t *order = NULL, *grid = NULL;
    bool *used = NULL;
    s_range_t *ranges = NULL;

    if (strcmp(pm->arch, c->arch_name)) {
        rc = strata_seterr(eb, STRATA_EINVAL_INPUT, "%s: field 'arch' = '%s' but config.json says '%s'", name, pm->arch,
                           c->arch_name);
        goto fail;
    }
    S_TRY(packed_slots(c, NULL, &slots, &n_slots));
    order = malloc(((size_t)pm->n_tensors + 1) * sizeof *order);
    used = calloc((size_t)pm->n_tensors + 1, sizeof *used);
    ranges = malloc(((size_t)pm->n_tensors * 2 + (size_t)pm->n_blocks + 1) * sizeof *ranges);
    if (!order || !used || !ranges) {
        rc = -ENOMEM;
        goto fail;
    }
    for (int32_t i = 0; i < pm->n_tensors; i++) order[i] = i;
    qsort_r(order, (size_t)pm->n_tensors, sizeof *order, s_cmp_tensor_name, (void *)pm);
    for (int32_t i = 1; i < pm->n_tensors; i++) {
        const packed_tensor_t *a = &pm->tensors[order[i - 1]], *b = &pm->tensors[order[i]];
        if (!strcmp(a->name, b->name)) {
            rc = strata_seterr(eb, STRATA_EFORMAT, "%s: tensor '%s' appears twice (tensors[%d] and tensors[%d])", name,
                               a->name, order[i - 1], order[i]);
            goto fail;
        }
    }

    /* every slot: present, shape, format, sizes, ranges */
    int32_t n_ranges = 0;
    for (int32_t s = 0; s < n_slots; s++) {
        const packed_slot_t *sl = &slots[s];
        int32_t lo = 0, hi = pm->n_tensors - 1, found = -1;
        while (lo <= hi) {
            int32_t mid = lo + (hi - lo) / 2;
            int cmp = strcmp(pm->tensors[order[mid]].name, sl->name);
            if (!cmp) {
                found = order[mid];
                break;
            }
            if (cmp < 0) lo = mid + 1;
            else hi = mid - 1;
        }
        if (found < 0) {
            rc = strata_seterr(eb, STRATA_EINVAL_INPUT, "%s: tensor '%s' is missing (config.json needs it)", name,
                               sl->name);
            goto fail;
        }
        const packed_tensor_t *t = &pm->tensors[found];
        const packed_file_t *f = &pm->files[t->file];
        used[found] = true;
        if (idx) idx[s] = found;
        if (t->ndim != sl->ndim || t->rows != sl->rows || t->cols != sl->cols) {
            if (sl->ndim == 1)
                rc = strata_seterr(eb, STRATA_EINVAL_INPUT, "%s: field 'tensors[%d].shape' of '%s' must be [%d] (config.json)",
                                   name, found, t->name, sl->cols);
            else
                rc = strata_seterr(eb, STRATA_EINVAL_INPUT, "%s: field 'tensors[%d].shape' of '%s' must be [%d, %d] (config.json)",
                                   name, found, t->name, sl->rows, sl->cols);
            goto fail;
        }
        if (!s_fmt_allowed(sl->cls, t->fmt) || (sl->ndim == 1 && t->fmt != WF_F32)) {
            rc = strata_seterr(eb, STRATA_EINVAL_INPUT, "%s: field 'tensors[%d].format' of '%s' is '%s'; it must be %s",
                               name, found, t->name, wfmt_name(t->fmt), s_allowed_text(sl->cls));
            goto fail;
        }
        if (t->fmt == WF_MXFP4) {
            if (t->group != 32 || t->cols % 32) {
                rc = strata_seterr(eb, STRATA_EINVAL_INPUT,
                                   "%s: field 'tensors[%d].group' of '%s' = %d must be 32 for mxfp4, with columns (%d) "
                                   "a multiple of 32", name, found, t->name, t->group, t->cols);
                goto fail;
            }
        } else if (t->fmt == WF_INT4) {
            if (t->group < 32 || t->group % 32 || t->cols % t->group) {
                rc = strata_seterr(eb, STRATA_EINVAL_INPUT,
                                   "%s: field 'tensors[%d].group' of '%s' = %d must be a multiple of 32 dividing %d columns",
                                   name, found, t->name, t->group, t->cols);
                goto fail;
            }
        } else if (t->group != 0) {
            rc = strata_seterr(eb, STRATA_EINVAL_INPUT, "%s: field 'tensors[%d].group' of '%s' must be 0 for format %s",
                               name, found, t->name, wfmt_name(t->fmt));
            goto fail;
        }
        uint64_t want_data = qmat_data_bytes(t->fmt, t->rows, t->cols);
        uint64_t want_scales = qmat_scale_bytes(t->fmt, t->rows, t->cols, t->group);
        if (t->bytes != want_data) {
            rc = strata_seterr(eb, STRATA_EINVAL_INPUT, "%s: field 'tensors[%d].bytes' of '%s' = %" PRIu64 ", format %s needs %" PRIu64,
                               name, found, t->name, t->bytes, wfmt_name(t->fmt), want_data);
            goto fail;
        }
        if (t->scale_bytes != want_scales) {
            rc = strata_seterr(eb, STRATA_EINVAL_INPUT, "%s: field 'tensors[%d].scale_bytes' of '%s' = %" PRIu64 ", format %s needs %" PRIu64,
                               name, found, t->name, t->scale_bytes, wfmt_name(t->fmt), want_scales);
            goto fail;
        }
        if (t->offset % PACKED_TENSOR_ALIGN || (t->scale_bytes && t->scale_offset % PACKED_TENSOR_ALIGN)) {
            rc = strata_seterr(eb, STRATA_EINVAL_INPUT, "%s: field 'tensors[%d].%s' of '%s' is not a multiple of %u",
                               name, found, t->offset % PACKED_TENSOR_ALIGN ? "offset" : "scale_offset", t->name,
                               PACKED_TENSOR_ALIGN);
            goto fail;
        }
        if (!t->scale_bytes && t->scale_offset) {
            rc = strata_seterr(eb, STRATA_EINVAL_INPUT, "%s: field 'tensors[%d].scale_offset' of '%s' must be 0 (no scales)",
                               name, found, t->name);
            goto fail;
        }
        if (!s_inside(t->offset, t->bytes, f->bytes)) {
            rc = strata_seterr(eb, STRATA_EINVAL_INPUT,
                               "%s: field 'tensors[%d].offset' of '%s': bytes [%" PRIu64 ", %" PRIu64 ") lie outside file '%s' (%" PRIu64 " bytes)",
                               name, found, t->name, t->offset, t->offset + t->bytes, f->name, f->bytes);
            goto fail;
        }
        if (t->scale_bytes && !s_inside(t->scale_offset, t->scale_bytes, f->bytes)) {
            rc = strata_seterr(eb, STRATA_EINVAL_INPUT,
                               "%s: field 'tensors[%d].scale_offset' of '%s': bytes [%" PRIu64 ", %" PRIu64 ") lie outside file '%s' (%" PRIu64 " bytes)",
                               name, found, t->name, t->scale_offset, t->scale_offset + t->scale_bytes, f->name, f->bytes);
            goto fail;
        }
        ranges[n_ranges++] = (s_range_t){t->file, t->offset, t->offset + t->bytes, found};
        if (t->scale_bytes)
            ranges[n_ranges++] = (s_range_t){t->file, t->scale_offset, t->scale_offset + t->scale_bytes, found};
    }
    for (int32_t i = 0; i < pm->n_tensors; i++) {
        if (!used[i]) {
            rc = strata_seterr(eb, STRATA_EINVAL_INPUT, "%s: field 'tensors[%d].name' = '%s' is not a tensor of this config",
                               name, i, pm->tensors[i].name);
            goto fail;
        }
    }
    qsort(ranges, (size_t)n_ranges, sizeof *ranges, s_cmp_range);
    for (int32_t i = 1; i < n_ranges; i++) {
        const s_range_t *a = &ranges[i - 1], *b = &ranges[i];
        if (a->file == b->file && b->start < a->end) {
            rc = strata_seterr(eb, STRATA_EINVAL_INPUT, "%s: tensors '%s' and '%s' overlap in file '%s' at byte %" PRIu64,
                               name, pm->tensors[a->who].name, pm->tensors[b->who].name, pm->files[a->file].name, b->start);
            goto fail;
        }
    }

    /* expert blocks: one per (sparse layer, expert), aligned, disjoint, holding their tensors */
    int32_t n_sparse = 0;
    for (int l = 0; l < c->n_layers; l++) n_sparse += c->layer_sparse[l] ? 1 : 0;
    int64_t want_blocks = (int64_t)n_sparse * c->n_experts;
    if (pm->n_blocks != want_blocks) {
        rc = strata_seterr(eb, STRATA_EINVAL_INPUT, "%s: field 'experts' has %d blocks; config.json needs %" PRId64 " (%d MoE layers x %d experts)",
                           name, pm->n_blocks, want_blocks, n_sparse, c->n_experts);
        goto fail;
    }
    if (want_blocks > 0) {
        grid = malloc((size_t)c->n_layers * (size_t)c->n_experts * sizeof *grid);
        if (!grid) {
            rc = -ENOMEM;
            goto fail;
        }
        for (int64_t i = 0; i < (int64_t)c->n_layers * c->n_experts; i++) grid[i] = -1;
    }
    n_ranges = 0;
    for (int32_t i = 0; i < pm->n_blocks; i++) {
        const packed_block_t *b = &pm->blocks[i];
        const packed_file_t *f = &pm->files[b->file];
        if (b->layer >= c->n_layers || !c->layer_sparse[b->layer] || b->expert >= c->n_experts) {
            rc = strata_seterr(eb, STRATA_EINVAL_INPUT, "%s: field 'experts[%d]': layer %d expert %d is not an expert of this config",
                               name, i, b->layer, b->expert);
            goto fail;
        }
        int32_t *g = &grid[(int64_t)b->layer * c->n_experts + b->expert];
        if (*g >= 0) {
            rc = strata_seterr(eb, STRATA_EINVAL_INPUT, "%s: field 'experts[%d]': layer %d expert %d repeats experts[%d]",
                               name, i, b->layer, b->expert, *g);
            goto fail;
        }
        *g = i;
        if (b->offset % pm->alignment) {
            rc = strata_seterr(eb, STRATA_EINVAL_INPUT, "%s: field 'experts[%d].offset' = %" PRIu64 " is not a multiple of 'alignment' (%" PRIu64 ")",
                               name, i, b->offset, pm->alignment);
            goto fail;
        }
        if (!s_inside(b->offset, b->bytes, f->bytes)) {
            rc = strata_seterr(eb, STRATA_EINVAL_INPUT, "%s: field 'experts[%d].offset': bytes [%" PRIu64 ", %" PRIu64 ") lie outside file '%s' (%" PRIu64 " bytes)",
                               name, i, b->offset, b->offset + b->bytes, f->name, f->bytes);
            goto fail;
        }
        ranges[n_ranges++] = (s_range_t){b->file, b->offset, b->offset + b->bytes, i};
    }
    qsort(ranges, (size_t)n_ranges, sizeof *ranges, s_cmp_range);
    for (int32_t i = 1; i < n_ranges; i++) {
        const s_range_t *a = &ranges[i - 1], *b = &ranges[i];
        if (a->file == b->file && b->start < a->end) {
            rc = strata_seterr(eb, STRATA_EINVAL_INPUT, "%s: fields 'experts[%d]' and 'experts[%d]' overlap in file '%s'",
                               name, a->who, b->who, pm->files[a->file].name);
            goto fail;
        }
    }
    for (int32_t s = 0; s < n_slots; s++) {
        const packed_slot_t *sl = &slots[s];
        if (sl->cls != PC_EXPERT) continue;
        /* find the tensor again (idx may be NULL) */
        int32_t lo = 0, hi = pm->n_tensors - 1, ti = -1;
        while (lo <= hi) {
            int32_t mid = lo + (hi - lo) / 2;
            int cmp = strcmp(pm->tensors[order[mid]].name, sl->name);
            if (!cmp) {
                ti = order[mid];
                break;
            }
            if (cmp < 0) lo = mid + 1;
            else hi = mid - 1;
        }
        STRATA_ASSERT(ti >= 0);
        const packed_tensor_t *t = &pm->tensors[ti];
        int32_t bi = grid[(int64_t)sl->layer * c->n_experts + sl->expert];
        const packed_block_t *b = &pm->blocks[bi];
        bool in = t->file == b->file && t->offset >= b->offset && t->offset + t->bytes <= b->offset + b->bytes &&
                  (!t->scale_bytes ||
                   (t->scale_offset >= b->offset && t->scale_offset + t->scale_bytes <= b->offset + b->bytes));
        if (!in) {
            rc = strata_seterr(eb, STRATA_EINVAL_INPUT, "%s: tensor '%s' (tensors[%d]) lies outside its expert block experts[%d]",
                               name, t->name, ti, bi);
            goto fail;
        }
    }
    rc = 0;
fail:
    free(slots);
    free(order);
    free(used);
    free(ranges);
    free(grid);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Manifest save.                                                                             */

static int s_write_all(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -errno;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Append the JSON text of v (compact) to a growing string. */
typedef struct {
    char *p;
    size_t n, cap;
    int err;
} s_str_t;

static void s_cat(s_str_t *s, const char *txt)
{
    size_t k = strlen(txt);
    if (s->err) return;
    if (s->n + k + 1 > s->cap) {
        size_t cap = s->cap ? s->cap : 4096;
        while (cap < s->n + k + 1) cap *= 2;
        char *np = realloc(s->p, cap);
        if (!np) {
            s->err = -ENOMEM;
            return;
        }
        s->p = np;
        s->cap = cap;
    }
    memcpy(s->p + s->n, txt, k + 1);
    s->n += k;
}

static void s_cat_json(s_str_t *s, json_t *v)
{
    if (!v) {
        s->err = -ENOMEM;
        return;
    }
    char *t = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    json_decref(v);
    if (!t) {
        s->err = -ENOMEM;
        return;
    }
    s_cat(s, t);
    free(t);
}

static void s_cat_kv(s_str_t *s, const char *key, json_t *v, bool last)
{
    s_cat(s, "  \"");
    s_cat(s, key);
    s_cat(s, "\": ");
    s_cat_json(s, v);
    s_cat(s, last ? "\n" : ",\n");
}

int packed_manifest_save(const packed_manifest_t *pm, const char *path, strata_errbuf_t *eb)
{
    /* Hand-assembled so that each record sits on one line (readable, diffable); every value is
     * encoded by jansson. */
    s_str_t s = {0};
    char tmp[4200];
    int fd = -1, rc = 0;
    s_cat(&s, "{\n");
    s_cat_kv(&s, "magic", json_string(PACKED_MAGIC), false);
    s_cat_kv(&s, "version", json_integer(pm->version), false);
    s_cat_kv(&s, "created_by", json_string("strata " STRATA_VERSION), false);
    s_cat_kv(&s, "arch", json_string(pm->arch), false);
    s_cat_kv(&s, "format", json_string(wfmt_name(pm->fmt)), false);
    s_cat_kv(&s, "group", json_integer(pm->group), false);
    s_cat_kv(&s, "attn_format", json_string(wfmt_name(pm->attn_fmt)), false);
    s_cat_kv(&s, "embed_format", json_string(wfmt_name(pm->embed_fmt)), false);
    s_cat_kv(&s, "alignment", json_integer((json_int_t)pm->alignment), false);
    s_cat_kv(&s, "tensor_align", json_integer(PACKED_TENSOR_ALIGN), false);
    s_cat_kv(&s, "config", json_string("config.json"), false);
    s_cat_kv(&s, "config_crc32", json_integer(pm->config_crc32), false);
    /* stats: informational */
    {
        uint64_t params = 0, payload = 0, fparams = 0, fbytes = 0, total = 0;
        for (int32_t i = 0; i < pm->n_tensors; i++) {
            const packed_tensor_t *t = &pm->tensors[i];
            uint64_t p = (uint64_t)t->rows * (uint64_t)t->cols, b = t->bytes + t->scale_bytes;
            params += p;
            payload += b;
            if (strstr(t->name, ".experts.") || strstr(t->name, ".shared.") || strstr(t->name, ".dense.")) {
                fparams += p;
                fbytes += b;
            }
        }
        for (int32_t i = 0; i < pm->n_files; i++) total += pm->files[i].bytes;
        json_t *st = json_pack("{s:I,s:I,s:I,s:f,s:f}", "params", (json_int_t)params, "payload_bytes",
                               (json_int_t)payload, "file_bytes", (json_int_t)total, "bits_per_weight",
                               params ? 8.0 * (double)payload / (double)params : 0.0, "ffn_bits_per_weight",
                               fparams ? 8.0 * (double)fbytes / (double)fparams : 0.0);
        s_cat_kv(&s, "stats", st, false);
    }
    s_cat(&s, "  \"files\": [\n");
    for (int32_t i = 0; i < pm->n_files; i++) {
        const packed_file_t *f = &pm->files[i];
        s_cat(&s, "    ");
        s_cat_json(&s, json_pack("{s:s,s:I,s:I}", "name", f->name, "bytes", (json_int_t)f->bytes, "crc32",
                                 (json_int_t)f->crc32));
        s_cat(&s, i + 1 < pm->n_files ? ",\n" : "\n");
    }
    s_cat(&s, "  ],\n  \"tensors\": [\n");
    for (int32_t i = 0; i < pm->n_tensors; i++) {
        const packed_tensor_t *t = &pm->tensors[i];
        json_t *shape = t->ndim == 1 ? json_pack("[i]", t->cols) : json_pack("[i,i]", t->rows, t->cols);
        s_cat(&s, "    ");
        s_cat_json(&s, json_pack("{s:s,s:s,s:o,s:i,s:s,s:I,s:I,s:I,s:I}", "name", t->name, "format",
                                 wfmt_name(t->fmt), "shape", shape, "group", t->group, "file",
                                 pm->files[t->file].name, "offset", (json_int_t)t->offset, "bytes",
                                 (json_int_t)t->bytes, "scale_offset", (json_int_t)t->scale_offset,
                                 "scale_bytes", (json_int_t)t->scale_bytes));
        s_cat(&s, i + 1 < pm->n_tensors ? ",\n" : "\n");
    }
    s_cat(&s, "  ],\n  \"experts\": [\n");
    for (int32_t i = 0; i < pm->n_blocks; i++) {
        const packed_block_t *b = &pm->blocks[i];
        s_cat(&s, "    ");
        json_t *o = json_pack("{s:i,s:i,s:s,s:I,s:I}", "layer", b->layer, "expert", b->expert, "file",
                              pm->files[b->file].name, "offset", (json_int_t)b->offset, "bytes", (json_int_t)b->bytes);
        if (o && b->has_crc) json_object_set_new(o, "crc32", json_integer((json_int_t)b->crc32));
        s_cat_json(&s, o);
        s_cat(&s, i + 1 < pm->n_blocks ? ",\n" : "\n");
    }
    s_cat(&s, "  ]\n}\n");
    if (s.err) {
        rc = strata_seterr(eb, s.err, "%s: cannot build the manifest: %s", path, strata_strerror(s.err));
        goto fail;
    }
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        rc = strata_seterr(eb, -errno, "%s: cannot create: %s", tmp, strerror(errno));
        goto fail;
    }
    rc = s_write_all(fd, s.p, s.n);
    if (rc == 0 && fsync(fd) < 0) rc = -errno;
    if (rc < 0) {
        rc = strata_seterr(eb, rc, "%s: write failed: %s", tmp, strata_strerror(rc));
        goto fail;
    }
    close(fd);
    fd = -1;
    if (rename(tmp, path) < 0) {
        rc = strata_seterr(eb, -errno, "%s: cannot rename to %s: %s", tmp, path, strerror(errno));
        goto fail;
    }
    free(s.p);
    return 0;
fail:
    if (fd >= 0) {
        close(fd);
        unlink(tmp);
    }
    free(s.p);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Files.                                                                                     */

bool packed_is_packed(const char *dir)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, PACKED_MANIFEST);
    return access(path, F_OK) == 0;
}

int32_t packed_file_blocks(const packed_manifest_t *pm, int32_t fi, int32_t *out)
{
    int32_t n = 0;
    for (int32_t b = 0; b < pm->n_blocks; b++) {
        if (pm->blocks[b].file != fi) continue;
        int32_t k = n++;
        while (k > 0 && pm->blocks[out[k - 1]].offset > pm->blocks[b].offset) out[k] = out[k - 1], k--;
        out[k] = b;
    }
    return n;
}

/* A damaged block: STRATA_EFORMAT, for it will not read better a second time. */
static int s_block_mismatch(const packed_block_t *b, const char *where, uint32_t got, strata_errbuf_t *eb)
{
    return strata_seterr(eb, STRATA_EFORMAT,
                         "%s: the block of layer %d expert %d at offset %" PRIu64 " (%" PRIu64 " bytes) has crc32 0x%08x; "
                         "the manifest says 0x%08x: the file is damaged",
                         where, b->layer, b->expert, b->offset, b->bytes, (unsigned)got, (unsigned)b->crc32);
}

int packed_check_block(const packed_block_t *b, const char *where, const unsigned char *data, strata_errbuf_t *eb)
{
    if (!b->has_crc) return 0;
    uint32_t got = (uint32_t)crc32(0, data, (uInt)b->bytes);
    return got == b->crc32 ? 0 : s_block_mismatch(b, where, got, eb);
}

int packed_verify(const char *dir, packed_manifest_t *pm, bool set_blocks, strata_errbuf_t *eb)
{
    enum { CHUNK = 4 << 20 };
    int rc = 0, fd = -1;
    char path[4200];
    unsigned char *buf = malloc(CHUNK);
    int32_t *blk = malloc(sizeof *blk * (size_t)(pm->n_blocks + 1));
    uLong *bcrc = malloc(sizeof *bcrc * (size_t)(pm->n_blocks + 1));
    if (!buf || !blk || !bcrc) {
        rc = -ENOMEM;
        goto fail;
    }
    for (int32_t i = 0; i < pm->n_files; i++) {
        const packed_file_t *f = &pm->files[i];
        snprintf(path, sizeof path, "%s/%s", dir, f->name);
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            rc = strata_seterr(eb, STRATA_EIO, "%s: cannot open: %s", path, strerror(errno));
            goto fail;
        }
        /* Drop cached pages (clean after the writer's fdatasync) so the re-read comes from the
         * device where the kernel allows it; best effort. */
        (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        const int32_t nb = packed_file_blocks(pm, i, blk);
        for (int32_t k = 0; k < nb; k++) bcrc[k] = crc32(0, Z_NULL, 0);
        uLong crc = crc32(0, Z_NULL, 0);
        uint64_t total = 0;
        int32_t first = 0; /* blocks before it end at or before total */
        for (;;) {
            ssize_t r = read(fd, buf, CHUNK);
            if (r < 0 && errno == EINTR) continue;
            if (r < 0) {
                rc = strata_seterr(eb, STRATA_EIO, "%s: read failed: %s", path, strerror(errno));
                goto fail;
            }
            if (r == 0) break;
            crc = crc32(crc, buf, (uInt)r);
            const uint64_t end = total + (uint64_t)r;
            for (int32_t k = first; k < nb; k++) { /* each block's share of these bytes */
                const packed_block_t *b = &pm->blocks[blk[k]];
                if (b->offset >= end) break;
                const uint64_t lo = b->offset > total ? b->offset : total;
                const uint64_t hi = b->offset + b->bytes < end ? b->offset + b->bytes : end;
                if (hi > lo) bcrc[k] = crc32_z(bcrc[k], buf + (lo - total), (size_t)(hi - lo));
                if (b->offset + b->bytes <= end && k == first) first++;
            }
            total = end;
        }
        close(fd);
        fd = -1;
        /* a damaged block is named first (the file's crc32 then differs too) */
        for (int32_t k = 0; k < nb && !set_blocks && total == f->bytes; k++) {
            const packed_block_t *bk = &pm->blocks[blk[k]];
            if (bk->has_crc && (uint32_t)bcrc[k] != bk->crc32) {
                rc = s_block_mismatch(bk, path, (uint32_t)bcrc[k], eb);
                goto fail;
            }
        }
        if (total != f->bytes || (uint32_t)crc != f->crc32) {
            rc = strata_seterr(eb, STRATA_EIO, "%s: re-read gives %" PRIu64 " bytes crc32 0x%08x; expected %" PRIu64 " bytes crc32 0x%08x",
                               path, total, (unsigned)crc, f->bytes, (unsigned)f->crc32);
            goto fail;
        }
        for (int32_t k = 0; k < nb && set_blocks; k++) {
            pm->blocks[blk[k]].crc32 = (uint32_t)bcrc[k];
            pm->blocks[blk[k]].has_crc = true;
        }
    }
fail:
    if (fd >= 0) close(fd);
    free(buf);
    free(blk);
    free(bcrc);
    return rc;
}

typedef struct {
    const packed_manifest_t *pm;
    const int32_t *blk;
    const unsigned char *data;
    _Atomic int32_t bad;       /* first failing position in blk + 1, 0: none */
    uint32_t got;
} s_blocks_t;

static void s_check_blocks_fn(void *ctx, int64_t i0, int64_t i1, int tid)
{
    (void)tid;
    s_blocks_t *c = ctx;
    for (int64_t k = i0; k < i1; k++) {
        const packed_block_t *b = &c->pm->blocks[c->blk[k]];
        if (!b->has_crc) continue;
        const uint32_t got = (uint32_t)crc32_z(crc32(0, Z_NULL, 0), c->data + b->offset, (size_t)b->bytes);
        int32_t none = 0;
        if (got != b->crc32 && atomic_compare_exchange_strong(&c->bad, &none, (int32_t)k + 1)) c->got = got;
    }
}

int packed_check_blocks(const packed_manifest_t *pm, const char *file, const unsigned char *data, tpool_t *pool,
                        strata_errbuf_t *eb)
{
    int32_t fi = -1;
    for (int32_t i = 0; i < pm->n_files && fi < 0; i++)
        if (!strcmp(pm->files[i].name, file)) fi = i;
    if (fi < 0 || pm->n_blocks == 0) return 0;
    int32_t *blk = malloc(sizeof *blk * (size_t)pm->n_blocks);
    if (!blk) return -ENOMEM;
    s_blocks_t c = {.pm = pm, .blk = blk, .data = data};
    atomic_init(&c.bad, 0);
    const int32_t nb = packed_file_blocks(pm, fi, blk);
    tpool_run(pool, nb, 1, s_check_blocks_fn, &c);
    int rc = 0;
    for (int32_t k = 0; k < nb; k++) rc += pm->blocks[blk[k]].has_crc;
    const int32_t bad = atomic_load(&c.bad);
    if (bad) rc = s_block_mismatch(&pm->blocks[blk[bad - 1]], file, c.got, eb);
    free(blk);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Loader.                                                                                    */

int packed_model_build(model_t *m, const packed_manifest_t *pm, const int32_t *idx, const unsigned char *const *files)
{
    int rc = 0;
    packed_slot_t *slots = NULL;
    int32_t n_slots = 0;

    m->layers = calloc((size_t)m->cfg.n_layers, sizeof *m->layers);
    if (!m->layers || model_own_buffer(m, m->layers) < 0) {
        free(m->layers);
        m->layers = NULL;
        rc = -ENOMEM;
        goto fail;
    }
    for (int l = 0; l < m->cfg.n_layers; l++) {
        if (!m->cfg.layer_sparse[l]) continue;
        ffn_t *x = calloc((size_t)m->cfg.n_experts, sizeof *x);
        if (!x || model_own_buffer(m, x) < 0) {
            free(x);
            rc = -ENOMEM;
            goto fail;
        }
        m->layers[l].experts = x;
    }
    S_TRY(packed_slots(&m->cfg, m, &slots, &n_slots));
    for (int32_t s = 0; s < n_slots; s++) {
        const packed_tensor_t *t = &pm->tensors[idx[s]];
        /* the files are read-only; qmat_t and the vector slots are const in use */
        unsigned char *base = (unsigned char *)(uintptr_t)files[t->file];
        STRATA_ASSERT(base);
        if (slots[s].q) {
            qmat_t *q = slots[s].q;
            q->fmt = t->fmt;
            q->rows = t->rows;
            q->cols = t->cols;
            q->group = t->fmt == WF_INT4 || t->fmt == WF_MXFP4 ? t->group : 0;
            q->data = base + t->offset;
            q->scales = t->scale_bytes ? base + t->scale_offset : NULL;
        } else {
            STRATA_ASSERT(slots[s].v);
            *slots[s].v = (float *)(void *)(base + t->offset);
        }
    }
    if (m->cfg.tie_embeddings) m->lm_head = m->embed;
fail:
    free(slots);
    return rc;
}

int model_load_packed_mem(model_t *m, const char *manifest, size_t len, const packed_source_t *src,
                          strata_errbuf_t *eb)
{
    int rc = 0;
    const char *ctext = NULL;
    size_t clen = 0;
    packed_manifest_t pm = {0};
    packed_slot_t *slots = NULL;
    int32_t n_slots = 0, *idx = NULL;
    const unsigned char **maps = NULL;

    memset(m, 0, sizeof *m);
    S_TRY(packed_manifest_parse(&pm, manifest, len, src->manifest_name, eb));
    S_TRY(src->config(src->ctx, &m->cfg, &ctext, &clen, eb));
    uint32_t ccrc = (uint32_t)crc32(crc32(0, Z_NULL, 0), (const Bytef *)ctext, (uInt)clen);
    if (ccrc != pm.config_crc32) {
        rc = strata_seterr(eb, STRATA_EINVAL_INPUT, "%s: crc32 0x%08x does not match field 'config_crc32' (0x%08x) of %s",
                           src->config_name, (unsigned)ccrc, (unsigned)pm.config_crc32, src->manifest_name);
        goto fail;
    }

    /* The sizes of the files must be the sizes in the manifest: a truncated file is caught here,
     * before any range check trusts files[].bytes. */
    maps = calloc((size_t)pm.n_files + 1, sizeof *maps);
    if (!maps) {
        rc = -ENOMEM;
        goto fail;
    }
    for (int32_t i = 0; i < pm.n_files; i++) S_TRY(src->check_file(src->ctx, &pm, i, eb));
    S_TRY(packed_slots(&m->cfg, NULL, &slots, &n_slots));
    idx = malloc(((size_t)n_slots + 1) * sizeof *idx);
    if (!idx) {
        rc = -ENOMEM;
        goto fail;
    }
    S_TRY(packed_manifest_check(&pm, &m->cfg, src->manifest_name, idx, eb));
    free(slots);
    slots = NULL;
    if (!src->map_file) { /* the checks only (model_check) */
        model_free(m);
        memset(m, 0, sizeof *m);
        rc = 0;
        goto done;
    }

    /* Only now, with every range checked, are the files' bytes looked at. */
    for (int32_t i = 0; i < pm.n_files; i++) {
        if (pm.files[i].bytes == 0) continue;
        S_TRY(src->map_file(src->ctx, m, &pm, i, &maps[i], eb));
    }

    S_TRY(packed_model_build(m, &pm, idx, maps));
    rc = 0;
    goto done;
fail:
    model_free(m);
    memset(m, 0, sizeof *m);
done:
    free(slots);
    free(idx);
    free(maps);
    packed_manifest_free(&pm);
    return rc;
}

/* model_load_packed's source: the files of a folder, weight files mapped read-only. */
typedef struct {
    const char *dir;
    const char *mpath;       /* DIR/strata-manifest.json */
    const char *cpath;       /* DIR/config.json */
    char *ctext;             /* config.json's bytes, malloc'd */
} s_dir_src_t;

static int s_dir_config(void *ctx, model_config_t *cfg, const char **text, size_t *len, strata_errbuf_t *eb)
{
    s_dir_src_t *d = ctx;
    int rc = model_config_load(cfg, d->cpath, eb);
    if (rc < 0) return rc;
    rc = strata_read_file(d->cpath, PACKED_MAX_META_BYTES, &d->ctext, len, eb);
    *text = d->ctext;
    return rc;
}

static int s_dir_check_file(void *ctx, const packed_manifest_t *pm, int32_t i, strata_errbuf_t *eb)
{
    const s_dir_src_t *d = ctx;
    char path[4200];
    struct stat stt;
    snprintf(path, sizeof path, "%s/%s", d->dir, pm->files[i].name);
    if (stat(path, &stt) < 0 || !S_ISREG(stt.st_mode)) {
        return strata_seterr(eb, STRATA_EINVAL_INPUT, "%s: cannot open weight file named by field 'files[%d].name' of %s: %s",
                             path, i, d->mpath, strerror(errno));
    }
    if ((uint64_t)stt.st_size != pm->files[i].bytes) {
        return strata_seterr(eb, STRATA_EINVAL_INPUT, "%s: file is %" PRIu64 " bytes but field 'files[%d].bytes' of %s says %" PRIu64 " (truncated or replaced?)",
                             path, (uint64_t)stt.st_size, i, d->mpath, pm->files[i].bytes);
    }
    return 0;
}

/* Map the file read-only; the model's qmat_t's point straight into the mapping. */
static int s_dir_map_file(void *ctx, model_t *m, const packed_manifest_t *pm, int32_t i, const unsigned char **data,
                          strata_errbuf_t *eb)
{
    const s_dir_src_t *d = ctx;
    char path[4200];
    uint64_t bytes = pm->files[i].bytes;
    snprintf(path, sizeof path, "%s/%s", d->dir, pm->files[i].name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return strata_seterr(eb, STRATA_EINVAL_INPUT, "%s: cannot open: %s", path, strerror(errno));
    void *p = mmap(NULL, bytes, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        int rc = strata_seterr(eb, -errno, "%s: mmap of %" PRIu64 " bytes failed: %s", path, bytes, strerror(errno));
        close(fd);
        return rc;
    }
    close(fd);
    int rc = model_own_mmap(m, p, bytes);
    if (rc < 0) {
        munmap(p, bytes);
        return rc;
    }
    *data = p;
    return 0;
}

/* model_load_packed's checks, or (check) only them: nothing mapped, m zeroed after. */
static int s_load_packed_dir(model_t *m, const char *dir, bool check, strata_errbuf_t *eb)
{
    int rc = 0;
    char mpath[4200], cpath[4200];
    char *text = NULL;
    size_t len = 0;
    s_dir_src_t d = {.dir = dir, .mpath = mpath, .cpath = cpath};
    const packed_source_t src = {.manifest_name = mpath, .config_name = cpath, .ctx = &d, .config = s_dir_config,
                                 .check_file = s_dir_check_file, .map_file = check ? NULL : s_dir_map_file};

    memset(m, 0, sizeof *m);
    snprintf(mpath, sizeof mpath, "%s/%s", dir, PACKED_MANIFEST);
    snprintf(cpath, sizeof cpath, "%s/config.json", dir);
    S_TRY(strata_read_file(mpath, PACKED_MAX_META_BYTES, &text, &len, eb));
    S_TRY(model_load_packed_mem(m, text, len, &src, eb));
fail:
    free(text);
    free(d.ctext);
    return rc;
}

int model_load_packed(model_t *m, const char *dir, strata_errbuf_t *eb) { return s_load_packed_dir(m, dir, false, eb); }

int packed_check_dir(const char *dir, strata_errbuf_t *eb)
{
    model_t m;
    return s_load_packed_dir(&m, dir, true, eb);
}
