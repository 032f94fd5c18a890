/* load.c - load a Hugging Face checkpoint folder into a model_t; model ownership helpers.
 *
 * A folder holds config.json and either model.safetensors or model.safetensors.index.json
 * with its shards. Weights stay in the read-only mappings where they can (zero copy):
 *   - matrices: F32 and BF16 are used in place (WF_F32 / WF_BF16); F16 is converted to an
 *     owned F32 buffer. The router and the shared-expert gate are always F32.
 *   - vectors (norms, biases): F32 in place, BF16 and F16 converted to owned F32 buffers.
 * Data that is not aligned to its element size is copied, so kernels may assume alignment.
 *
 * Tensor names follow transformers: model.embed_tokens, model.layers.N.{input_layernorm,
 * post_attention_layernorm, self_attn.{q,k,v,o}_proj, self_attn.{q,k}_norm}, model.norm,
 * lm_head. Experts come in two layouts and both are read:
 *   - per expert, as on the Hub: Mixtral block_sparse_moe.experts.E.{w1 = gate, w3 = up,
 *     w2 = down}; Qwen2/Qwen3/OLMoE mlp.experts.E.{gate,up,down}_proj;
 *   - fused, as transformers 5.x holds them in memory (its conversion mapping merges the
 *     per-expert tensors): <moe>.experts.gate_up_proj [n_experts][2*inter][hidden], whose
 *     rows [0, inter) are the gate and [inter, 2*inter) the up projection of each expert
 *     (torch.cat([gate, up], dim=1); forward does .chunk(2, dim=-1) as gate, up), and
 *     <moe>.experts.down_proj [n_experts][hidden][inter]. Both are nn.Linear layout
 *     [out][in], so every expert is a contiguous slice and stays zero copy.
 * Mixtral's router is block_sparse_moe.gate (4.x) or mlp.gate (5.x renames it).
 *
 * gpt-oss (GptOssExperts) keeps its experts fused and in x @ W layout: mlp.experts.gate_up_proj
 * [E][hidden][2 inter] with gate and up interleaved on the last dim (even, odd), down_proj
 * [E][inter][hidden], biases gate_up_proj_bias [E][2 inter] and down_proj_bias [E][hidden];
 * these are transposed into owned Linear-layout matrices (BF16 stays BF16 bits). An MXFP4
 * checkpoint (quantization_config quant_method mxfp4) ships *_blocks uint8 [E][rows][cols/32][16]
 * and *_scales uint8 e8m0 [E][rows][cols/32] in Linear layout: down_proj is used in place, gate
 * and up are the even and odd rows of gate_up_proj copied byte for byte (WF_MXFP4, never
 * dequantized). Its router is mlp.router.{weight,bias}, and self_attn.sinks [n_heads] the
 * attention sinks.
 *
 * Every tensor the config needs must be present with the exact shape and a float dtype;
 * otherwise one error line names the file, the tensor and the expected shape. NaN or Inf
 * values produce a warning naming the tensor. Tensors the model does not use are logged and
 * ignored (HF's rotary inv_freq buffers at debug level, anything else as a warning).
 */
#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/safetensors.h"
#include "model/model.h"
#include "model/packed.h"

/* ---- ownership ------------------------------------------------------------------------- */

typedef struct {
    void *addr;
    size_t len;
} own_map_t;

typedef struct {
    void **bufs;        /* [n_bufs] malloc'd, freed by model_free */
    size_t n_bufs, cap_bufs;
    own_map_t *maps;    /* [n_maps] mappings, munmapped by model_free */
    size_t n_maps, cap_maps;
} model_priv_t;

static model_priv_t *s_priv(model_t *m)
{
    if (!m->priv) m->priv = calloc(1, sizeof(model_priv_t));
    return m->priv;
}

/* Take ownership of p (malloc'd). On failure (-ENOMEM) p stays the caller's. */
int model_own_buffer(model_t *m, void *p)
{
    model_priv_t *pv = s_priv(m);
    if (!pv) return -ENOMEM;
    if (pv->n_bufs == pv->cap_bufs) {
        size_t cap = pv->cap_bufs ? pv->cap_bufs * 2 : 64;
        void **nb = realloc(pv->bufs, cap * sizeof *nb);
        if (!nb) return -ENOMEM;
        pv->bufs = nb;
        pv->cap_bufs = cap;
    }
    pv->bufs[pv->n_bufs++] = p;
    return 0;
}

/* Take ownership of the mapping [addr, addr+len). On failure (-ENOMEM) it stays the caller's. */
int model_own_mmap(model_t *m, void *addr, size_t len)
{
    model_priv_t *pv = s_priv(m);
    if (!pv) return -ENOMEM;
    if (pv->n_maps == pv->cap_maps) {
        size_t cap = pv->cap_maps ? pv->cap_maps * 2 : 8;
        own_map_t *nm = realloc(pv->maps, cap * sizeof *nm);
        if (!nm) return -ENOMEM;
        pv->maps = nm;
        pv->cap_maps = cap;
    }
    pv->maps[pv->n_maps++] = (own_map_t){addr, len};
    return 0;
}

/* Release everything handed to the model (buffers, mappings) and zero it. Only what was given
 * through model_own_buffer / model_own_mmap is freed: loaders register their layer and expert
 * arrays there too. */
void model_free(model_t *m)
{
    if (!m) return;
    model_priv_t *pv = m->priv;
    if (pv) {
        for (size_t i = 0; i < pv->n_bufs; i++) free(pv->bufs[i]);
        for (size_t i = 0; i < pv->n_maps; i++) munmap(pv->maps[i].addr, pv->maps[i].len);
        free(pv->bufs);
        free(pv->maps);
        free(pv);
    }
    memset(m, 0, sizeof *m);
}

/* ---- the checkpoint's files ------------------------------------------------------------ */

typedef struct {
    char *name;          /* file name inside the folder */
    st_file_t *st;
    uint8_t *used;       /* [st_count] tensor used by the model (index in name order) */
} shard_t;

typedef struct {
    const st_tensor_t *t;
    const char *path;      /* its file, for messages */
} scan_item_t;

typedef struct {
    model_t *m;
    const char *dir;
    strata_errbuf_t *eb;
    char index_path[4096];  /* model.safetensors.index.json, or "" */
    json_t *index;          /* its parsed JSON (weight_map inside), or NULL */
    json_t *weight_map;
    shard_t *shards;
    size_t n_shards;
    bool scan;              /* scan for NaN/Inf */
    scan_item_t *scan_list; /* [n_scan] every tensor used, in first-use order */
    size_t n_scan, cap_scan;
    const st_tensor_t *embed; /* model.embed_tokens.weight in its file */
} ld_t;

static int s_path(char *out, size_t n, const char *dir, const char *name, strata_errbuf_t *eb)
{
    if ((size_t)snprintf(out, n, "%s/%s", dir, name) >= n)
        return strata_seterr(eb, STRATA_EINVAL_INPUT, "%s: path too long", dir);
    return 0;
}

static bool s_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

static int s_open_shard(ld_t *L, const char *name)
{
    char path[4096];
    int rc;
    if ((rc = s_path(path, sizeof path, L->dir, name, L->eb)) < 0) return rc;
    shard_t *sh = &L->shards[L->n_shards];
    memset(sh, 0, sizeof *sh);
    if (!(sh->name = strdup(name))) return strata_seterr(L->eb, STRATA_ENOMEM, "%s: out of memory", path);
    L->n_shards++;
    if ((rc = st_open(&sh->st, path, L->eb)) < 0) return rc;
    sh->used = calloc(st_count(sh->st) + 1, 1);
    if (!sh->used) return strata_seterr(L->eb, STRATA_ENOMEM, "%s: out of memory", path);
    return 0;
}

/* A shard name from the index must be a plain file name in the folder. */
static bool s_plain_name(const char *s)
{
    return s[0] && strcmp(s, ".") && strcmp(s, "..") && !strchr(s, '/');
}

static int s_open_files(ld_t *L)
{
    int rc;
    char single[4096];
    if ((rc = s_path(single, sizeof single, L->dir, "model.safetensors", L->eb)) < 0) return rc;
    if ((rc = s_path(L->index_path, sizeof L->index_path, L->dir, "model.safetensors.index.json", L->eb)) < 0)
        return rc;
    if (s_exists(single)) {
        /* transformers prefers the single file when both exist. */
        L->index_path[0] = 0;
        L->shards = calloc(1, sizeof *L->shards);
        if (!L->shards) return strata_seterr(L->eb, STRATA_ENOMEM, "%s: out of memory", single);
        return s_open_shard(L, "model.safetensors");
    }
    if (!s_exists(L->index_path))
        return strata_seterr(L->eb, STRATA_EINVAL_INPUT,
                             "%s: no model.safetensors or model.safetensors.index.json in the folder", L->dir);

    json_error_t jerr;
    L->index = json_load_file(L->index_path, JSON_REJECT_DUPLICATES, &jerr);
    if (!L->index)
        return strata_seterr(L->eb, STRATA_EINVAL_INPUT, "%s: JSON: %s (line %d, column %d)", L->index_path,
                             jerr.text, jerr.line, jerr.column);
    L->weight_map = json_object_get(L->index, "weight_map");
    if (!json_is_object(L->weight_map) || json_object_size(L->weight_map) == 0)
        return strata_seterr(L->eb, STRATA_EINVAL_INPUT, "%s: weight_map: missing, empty or not an object",
                             L->index_path);
    /* The distinct shard names, in first-seen order. */
    L->shards = calloc(json_object_size(L->weight_map), sizeof *L->shards);
    if (!L->shards) return strata_seterr(L->eb, STRATA_ENOMEM, "%s: out of memory", L->index_path);
    const char *tname;
    json_t *fv;
    json_object_foreach(L->weight_map, tname, fv) {
        if (!json_is_string(fv) || !s_plain_name(json_string_value(fv)))
            return strata_seterr(L->eb, STRATA_EINVAL_INPUT,
                                 "%s: weight_map.%.200s: must be a file name inside the folder", L->index_path, tname);
        const char *fname = json_string_value(fv);
        bool seen = false;
        for (size_t i = 0; i < L->n_shards && !seen; i++) seen = !strcmp(L->shards[i].name, fname);
        if (seen) continue;
        char path[4096];
        if ((rc = s_path(path, sizeof path, L->dir, fname, L->eb)) < 0) return rc;
        if (!s_exists(path))
            return strata_seterr(L->eb, STRATA_EINVAL_INPUT, "%s: weight_map.%.200s: shard '%.200s' does not exist",
                                 L->index_path, tname, fname);
        if ((rc = s_open_shard(L, fname)) < 0) return rc;
    }
    /* Every tensor must be in the shard the index names. */
    json_object_foreach(L->weight_map, tname, fv) {
        const char *fname = json_string_value(fv);
        for (size_t i = 0; i < L->n_shards; i++) {
            if (strcmp(L->shards[i].name, fname)) continue;
            if (!st_find(L->shards[i].st, tname))
                return strata_seterr(L->eb, STRATA_EINVAL_INPUT,
                                     "%s: weight_map.%.200s: tensor is not in shard '%.200s'", L->index_path, tname,
                                     fname);
        }
    }
    return 0;
}

/* Find a tensor: in the shard the index names, else in the single file. */
static const st_tensor_t *s_lookup(ld_t *L, const char *name, shard_t **sh)
{
    if (L->weight_map) {
        json_t *fv = json_object_get(L->weight_map, name);
        if (!fv) return NULL;
        for (size_t i = 0; i < L->n_shards; i++)
            if (!strcmp(L->shards[i].name, json_string_value(fv))) {
                *sh = &L->shards[i];
                return st_find((*sh)->st, name);
            }
        return NULL;
    }
    *sh = &L->shards[0];
    return st_find(L->shards[0].st, name);
}

/* The file named in messages about a missing tensor. */
static const char *s_where(ld_t *L)
{
    return L->weight_map ? L->index_path : st_path(L->shards[0].st);
}

/* ---- tensor access --------------------------------------------------------------------- */

static void s_fmt_shape(char *buf, size_t n, int ndim, const int64_t *shape)
{
    size_t o = 0;
    o += (size_t)snprintf(buf + o, n - o, "[");
    for (int i = 0; i < ndim && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (o < n) snprintf(buf + o, n - o, "]");
}

/* ---- NaN/Inf scan ---------------------------------------------------------------------- */

/* Elements [e0, e1) of t that are NaN or Inf (all exponent bits set). */
static size_t s_count_nonfinite(const st_tensor_t *t, size_t e0, size_t e1)
{
    size_t n = 0;
    const uint8_t *p = t->data;
    if (t->dtype == ST_F32) {
        for (size_t i = e0; i < e1; i++) {
            uint32_t u;
            memcpy(&u, p + 4 * i, 4);
            n += (u & 0x7f800000u) == 0x7f800000u;
        }
    } else {
        uint16_t mask = t->dtype == ST_BF16 ? 0x7f80 : 0x7c00;
        for (size_t i = e0; i < e1; i++) {
            uint16_t u;
            memcpy(&u, p + 2 * i, 2);
            n += (u & mask) == mask;
        }
    }
    return n;
}

#define SCAN_CHUNK ((size_t)1 << 24) /* elements per work item */

typedef struct {
    const scan_item_t *items;
    size_t n_items;
    size_t *bad;                /* [n_items], added to atomically */
    size_t n_chunks, next;      /* next: chunk counter, taken atomically */
    size_t *first_chunk;        /* [n_items + 1] prefix sums of chunks per item */
} scan_job_t;

static void *s_scan_worker(void *arg)
{
    scan_job_t *j = arg;
    size_t item = 0;
    for (;;) {
        size_t c = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED);
        if (c >= j->n_chunks) break;
        while (j->first_chunk[item + 1] <= c) item++; /* chunks are taken in increasing order */
        const st_tensor_t *t = j->items[item].t;
        size_t cnt = t->nbytes / st_dtype_size(t->dtype), e0 = (c - j->first_chunk[item]) * SCAN_CHUNK;
        size_t e1 = e0 + SCAN_CHUNK < cnt ? e0 + SCAN_CHUNK : cnt;
        size_t bad = s_count_nonfinite(t, e0, e1);
        if (bad) __atomic_fetch_add(&j->bad[item], bad, __ATOMIC_RELAXED);
    }
    return NULL;
}

/* Scan every used tensor on all cores (the data is read once anyway when it is first used;
 * this moves that read to load time) and warn about each tensor holding NaN or Inf. */
static int s_scan(ld_t *L)
{
    scan_job_t j = {.items = L->scan_list, .n_items = L->n_scan};
    j.bad = calloc(j.n_items + 1, sizeof *j.bad);
    j.first_chunk = calloc(j.n_items + 1, sizeof *j.first_chunk);
    if (!j.bad || !j.first_chunk) {
        free(j.bad);
        free(j.first_chunk);
        return strata_seterr(L->eb, STRATA_ENOMEM, "%s: out of memory", L->dir);
    }
    for (size_t i = 0; i < j.n_items; i++) {
        const st_tensor_t *t = j.items[i].t;
        size_t cnt = t->nbytes / st_dtype_size(t->dtype);
        j.first_chunk[i + 1] = j.first_chunk[i] + (cnt + SCAN_CHUNK - 1) / SCAN_CHUNK;
    }
    j.n_chunks = j.first_chunk[j.n_items];
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    size_t nt = ncpu < 1 ? 1 : ncpu > 32 ? 32 : (size_t)ncpu;
    if (nt > j.n_chunks) nt = j.n_chunks ? j.n_chunks : 1;
    pthread_t th[32];
    size_t started = 0;
    for (size_t i = 1; i < nt; i++, started++)
        if (pthread_create(&th[i - 1], NULL, s_scan_worker, &j)) break;
    s_scan_worker(&j);
    for (size_t i = 0; i < started; i++) pthread_join(th[i], NULL);
    for (size_t i = 0; i < j.n_items; i++)
        if (j.bad[i])
            log_warn("%s: tensor '%s': %zu NaN/Inf value%s", j.items[i].path, j.items[i].t->name, j.bad[i],
                     j.bad[i] > 1 ? "s" : "");
    free(j.bad);
    free(j.first_chunk);
    return 0;
}

/* Look up name, check dtype (F32/BF16/F16, or U8 when u8) and shape; mark it used. *t = NULL
 * when absent and not required. U8 tensors (MXFP4 blocks and scales) are not NaN-scanned. */
static int s_get_typed(ld_t *L, const char *name, int ndim, const int64_t *shape, bool required, bool u8,
                       const st_tensor_t **out)
{
    shard_t *sh = NULL;
    const st_tensor_t *t = s_lookup(L, name, &sh);
    *out = NULL;
    if (!t) {
        if (!required) return 0;
        char want[128];
        s_fmt_shape(want, sizeof want, ndim, shape);
        return strata_seterr(L->eb, STRATA_EINVAL_INPUT, "%s: tensor '%.200s' %s is missing%s (needed by the config)",
                             s_where(L), name, want, L->weight_map ? " from weight_map" : "");
    }
    if (u8 ? t->dtype != ST_U8 : (t->dtype != ST_F32 && t->dtype != ST_BF16 && t->dtype != ST_F16))
        return strata_seterr(L->eb, STRATA_EUNSUPPORTED, "%s: tensor '%.200s': dtype %s is not supported (%s)",
                             st_path(sh->st), name, st_dtype_name(t->dtype), u8 ? "MXFP4 needs U8" : "F32, BF16 or F16");
    bool ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = t->shape[i] == shape[i];
    if (!ok) {
        char got[128], want[128];
        s_fmt_shape(got, sizeof got, t->ndim, t->shape);
        s_fmt_shape(want, sizeof want, ndim, shape);
        return strata_seterr(L->eb, STRATA_EINVAL_INPUT,
                             "%s: tensor '%.200s': shape %s disagrees with config.json (expected %s)",
                             st_path(sh->st), name, got, want);
    }
    size_t idx = (size_t)(t - st_tensor(sh->st, 0));
    if (!sh->used[idx] && u8) {
        sh->used[idx] = 1;
    } else if (!sh->used[idx]) {
        sh->used[idx] = 1;
        if (L->n_scan == L->cap_scan) {
            size_t cap = L->cap_scan ? 2 * L->cap_scan : 256;
            scan_item_t *ns = realloc(L->scan_list, cap * sizeof *ns);
            if (!ns) return strata_seterr(L->eb, STRATA_ENOMEM, "%s: out of memory", L->dir);
            L->scan_list = ns;
            L->cap_scan = cap;
        }
        L->scan_list[L->n_scan++] = (scan_item_t){t, st_path(sh->st)};
    }
    *out = t;
    return 0;
}

static int s_get(ld_t *L, const char *name, int ndim, const int64_t *shape, bool required, const st_tensor_t **out)
{
    return s_get_typed(L, name, ndim, shape, required, false, out);
}

/* Elements [off, off+n) of t as an owned F32 buffer, or in place when t is aligned F32. */
static int s_as_f32(ld_t *L, const st_tensor_t *t, size_t off, size_t n, float **out)
{
    const uint8_t *src = (const uint8_t *)t->data + off * st_dtype_size(t->dtype);
    if (t->dtype == ST_F32 && ((uintptr_t)src & 3) == 0) {
        *out = (float *)src;
        return 0;
    }
    float *f = malloc((n ? n : 1) * sizeof *f);
    if (!f || model_own_buffer(L->m, f) < 0) {
        free(f);
        return strata_seterr(L->eb, STRATA_ENOMEM, "%s: out of memory converting '%.200s'", L->dir, t->name);
    }
    for (size_t i = 0; i < n; i++) {
        if (t->dtype == ST_F32) {
            memcpy(&f[i], src + 4 * i, 4);
        } else {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            f[i] = t->dtype == ST_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
        }
    }
    *out = f;
    return 0;
}

/* A matrix from elements [off, off + rows*cols) of t. BF16 stays BF16 unless want_f32. */
static int s_qmat_from(ld_t *L, const st_tensor_t *t, size_t off, int64_t rows, int64_t cols, bool want_f32,
                       qmat_t *q)
{
    memset(q, 0, sizeof *q);
    q->rows = (int32_t)rows;
    q->cols = (int32_t)cols;
    size_t n = (size_t)rows * (size_t)cols;
    const uint8_t *src = (const uint8_t *)t->data + off * st_dtype_size(t->dtype);
    if (t->dtype == ST_BF16 && !want_f32) {
        q->fmt = WF_BF16;
        if (((uintptr_t)src & 1) == 0) {
            q->data = src;
            return 0;
        }
        uint16_t *b = malloc((n ? n : 1) * 2);
        if (!b || model_own_buffer(L->m, b) < 0) {
            free(b);
            return strata_seterr(L->eb, STRATA_ENOMEM, "%s: out of memory copying '%.200s'", L->dir, t->name);
        }
        memcpy(b, src, n * 2);
        q->data = b;
        return 0;
    }
    float *f;
    int rc = s_as_f32(L, t, off, n, &f);
    if (rc < 0) return rc;
    q->fmt = WF_F32;
    q->data = f;
    return 0;
}

/* A [rows][cols] matrix called name. */
static int s_mat(ld_t *L, const char *name, int64_t rows, int64_t cols, bool want_f32, qmat_t *q)
{
    const st_tensor_t *t;
    int64_t shape[2] = {rows, cols};
    int rc = s_get(L, name, 2, shape, true, &t);
    if (rc < 0) return rc;
    return s_qmat_from(L, t, 0, rows, cols, want_f32, q);
}

/* A [len] F32 vector called name; *v = NULL if absent and not required. */
static int s_vec(ld_t *L, const char *name, int64_t len, bool required, float **v)
{
    const st_tensor_t *t;
    *v = NULL;
    int rc = s_get(L, name, 1, &len, required, &t);
    if (rc < 0 || !t) return rc;
    return s_as_f32(L, t, 0, (size_t)len, v);
}

/* ---- the model ------------------------------------------------------------------------- */

#define NAME(buf, ...) snprintf(buf, sizeof buf, __VA_ARGS__)

static int s_ffn(ld_t *L, const char *prefix, const char *g, const char *u, const char *d, int64_t inter,
                 ffn_t *f)
{
    const int64_t H = L->m->cfg.hidden;
    char n[256];
    int rc;
    NAME(n, "%s.%s.weight", prefix, g);
    if ((rc = s_mat(L, n, inter, H, false, &f->gate)) < 0) return rc;
    NAME(n, "%s.%s.weight", prefix, u);
    if ((rc = s_mat(L, n, inter, H, false, &f->up)) < 0) return rc;
    NAME(n, "%s.%s.weight", prefix, d);
    return s_mat(L, n, H, inter, false, &f->down);
}

static int s_experts(ld_t *L, int l, layer_t *ly, const char *moe)
{
    const model_config_t *c = &L->m->cfg;
    const int64_t E = c->n_experts, H = c->hidden, I = c->moe_inter;
    char n[256], n2[256];
    int rc;
    ly->experts = calloc((size_t)E, sizeof *ly->experts);
    if (!ly->experts || model_own_buffer(L->m, ly->experts) < 0) {
        free(ly->experts);
        ly->experts = NULL;
        return strata_seterr(L->eb, STRATA_ENOMEM, "%s: out of memory", L->dir);
    }
    shard_t *sh;
    NAME(n, "model.layers.%d.%s.experts.gate_up_proj", l, moe);
    if (s_lookup(L, n, &sh)) {
        /* Fused (transformers 5.x): expert e's gate is rows [0, I) of slice e, up is [I, 2I). */
        const st_tensor_t *gu, *dn;
        int64_t s_gu[3] = {E, 2 * I, H}, s_dn[3] = {E, H, I};
        NAME(n2, "model.layers.%d.%s.experts.down_proj", l, moe);
        if ((rc = s_get(L, n, 3, s_gu, true, &gu)) < 0 || (rc = s_get(L, n2, 3, s_dn, true, &dn)) < 0) return rc;
        for (int64_t e = 0; e < E; e++) {
            ffn_t *f = &ly->experts[e];
            if ((rc = s_qmat_from(L, gu, (size_t)(e * 2 * I * H), I, H, false, &f->gate)) < 0 ||
                (rc = s_qmat_from(L, gu, (size_t)((e * 2 + 1) * I * H), I, H, false, &f->up)) < 0 ||
                (rc = s_qmat_from(L, dn, (size_t)(e * H * I), H, I, false, &f->down)) < 0)
                return rc;
        }
        return 0;
    }
    bool mix = c->arch == ARCH_MIXTRAL;
    for (int64_t e = 0; e < E; e++) {
        NAME(n, "model.layers.%d.%s.experts.%lld", l, moe, (long long)e);
        if ((rc = s_ffn(L, n, mix ? "w1" : "gate_proj", mix ? "w3" : "up_proj", mix ? "w2" : "down_proj", I,
                        &ly->experts[e])) < 0)
            return rc;
    }
    return 0;
}

/* ---- gpt-oss experts ------------------------------------------------------------------- */

/* dst[r][c] = src[e][c][r * step + off] for the [rows][cols] matrix of expert e of t, whose
 * slice e is [cols][src_cols] (x @ W layout, as GptOssExperts holds gate_up_proj and
 * down_proj): transposed into HF Linear layout, BF16 kept as BF16 bits, F32 and F16 as F32. */
static int s_transposed(ld_t *L, const st_tensor_t *t, int64_t e, int64_t rows, int64_t cols, int64_t src_cols,
                        int step, int off, qmat_t *q)
{
    memset(q, 0, sizeof *q);
    q->rows = (int32_t)rows;
    q->cols = (int32_t)cols;
    const size_t es = st_dtype_size(t->dtype);
    const uint8_t *src = (const uint8_t *)t->data + (size_t)e * (size_t)cols * (size_t)src_cols * es;
    const bool bf = t->dtype == ST_BF16;
    void *buf = malloc((size_t)rows * (size_t)cols * (bf ? 2 : 4) + 1);
    if (!buf || model_own_buffer(L->m, buf) < 0) {
        free(buf);
        return strata_seterr(L->eb, STRATA_ENOMEM, "%s: out of memory transposing '%.200s'", L->dir, t->name);
    }
    for (int64_t r = 0; r < rows; r++) {
        const size_t sc = (size_t)(r * step + off);
        for (int64_t c = 0; c < cols; c++) {
            const uint8_t *p = src + ((size_t)c * (size_t)src_cols + sc) * es;
            size_t d = (size_t)r * (size_t)cols + (size_t)c;
            if (bf) {
                memcpy((uint16_t *)buf + d, p, 2);
            } else if (t->dtype == ST_F32) {
                memcpy((float *)buf + d, p, 4);
            } else {
                uint16_t h;
                memcpy(&h, p, 2);
                ((float *)buf)[d] = f16_to_f32(h);
            }
        }
    }
    q->fmt = bf ? WF_BF16 : WF_F32;
    q->data = buf;
    return 0;
}

/* An MXFP4 pair as the checkpoint ships it: <base>_blocks uint8 [E][rows][cols/32][16] and
 * <base>_scales uint8 e8m0 [E][rows][cols/32]. A scale of 0xFF (NaN in the OCP spec) is refused. */
static int s_mx_pair(ld_t *L, const char *base, int64_t E, int64_t rows, int64_t cols, const st_tensor_t **blk,
                     const st_tensor_t **scl)
{
    char n[256];
    int rc;
    if (cols % 32)
        return strata_seterr(L->eb, STRATA_EINVAL_INPUT, "%s: tensor '%.200s_blocks': %lld columns are not a multiple "
                             "of the MXFP4 block (32)", s_where(L), base, (long long)cols);
    int64_t sb[4] = {E, rows, cols / 32, 16}, ss[3] = {E, rows, cols / 32};
    NAME(n, "%s_blocks", base);
    if ((rc = s_get_typed(L, n, 4, sb, true, true, blk)) < 0) return rc;
    NAME(n, "%s_scales", base);
    if ((rc = s_get_typed(L, n, 3, ss, true, true, scl)) < 0) return rc;
    if ((*blk)->dtype != ST_U8 || (*scl)->dtype != ST_U8)
        return strata_seterr(L->eb, STRATA_EINVAL_INPUT, "%s: tensor '%.200s_%s': dtype %s, MXFP4 needs U8",
                             s_where(L), base, (*blk)->dtype != ST_U8 ? "blocks" : "scales",
                             st_dtype_name((*blk)->dtype != ST_U8 ? (*blk)->dtype : (*scl)->dtype));
    const uint8_t *s = (*scl)->data;
    for (size_t i = 0; i < (*scl)->nbytes; i++)
        if (s[i] == 0xFF)
            return strata_seterr(L->eb, STRATA_EINVAL_INPUT,
                                 "%s: tensor '%.200s_scales': element %zu is 0xFF, NaN in the MXFP4 (e8m0) scale "
                                 "format", s_where(L), base, i);
    return 0;
}

/* Rows r*step + off (r < rows) of expert e of an MXFP4 pair, as a [rows][cols] WF_MXFP4 matrix:
 * the bytes are the checkpoint's, bit for bit; a contiguous slice (step 1) is used in place. */
static int s_mx_rows(ld_t *L, const st_tensor_t *blk, const st_tensor_t *scl, int64_t e, int64_t src_rows,
                     int64_t rows, int64_t cols, int step, int off, qmat_t *q)
{
    memset(q, 0, sizeof *q);
    q->fmt = WF_MXFP4;
    q->rows = (int32_t)rows;
    q->cols = (int32_t)cols;
    q->group = 32;
    const size_t rb = (size_t)cols / 2, rs = (size_t)cols / 32;
    const uint8_t *b = (const uint8_t *)blk->data + (size_t)e * (size_t)src_rows * rb;
    const uint8_t *s = (const uint8_t *)scl->data + (size_t)e * (size_t)src_rows * rs;
    if (step == 1) {
        q->data = b + (size_t)off * rb;
        q->scales = s + (size_t)off * rs;
        return 0;
    }
    uint8_t *db = malloc((size_t)rows * (rb + rs) + 1);
    if (!db || model_own_buffer(L->m, db) < 0) {
        free(db);
        return strata_seterr(L->eb, STRATA_ENOMEM, "%s: out of memory copying '%.200s'", L->dir, blk->name);
    }
    uint8_t *ds = db + (size_t)rows * rb;
    for (int64_t r = 0; r < rows; r++) {
        memcpy(db + (size_t)r * rb, b + (size_t)(r * step + off) * rb, rb);
        memcpy(ds + (size_t)r * rs, s + (size_t)(r * step + off) * rs, rs);
    }
    q->data = db;
    q->scales = ds;
    return 0;
}

/* Elements i*step + off of a [n][src_len] vector tensor, per row, as an owned F32 [n][len]. */
static int s_vec_strided(ld_t *L, const st_tensor_t *t, int64_t n, int64_t src_len, int64_t len, int step, int off,
                         float **out)
{
    float *all;
    int rc = s_as_f32(L, t, 0, (size_t)(n * src_len), &all);
    if (rc < 0) return rc;
    float *f = malloc((size_t)(n * len) * sizeof *f + 1);
    if (!f || model_own_buffer(L->m, f) < 0) {
        free(f);
        return strata_seterr(L->eb, STRATA_ENOMEM, "%s: out of memory converting '%.200s'", L->dir, t->name);
    }
    for (int64_t r = 0; r < n; r++)
        for (int64_t i = 0; i < len; i++) f[r * len + i] = all[r * src_len + i * step + off];
    *out = f;
    return 0;
}

/* GptOssExperts: gate_up_proj [E][hidden][2 inter], its last dim interleaving gate (even) and
 * up (odd) columns, and down_proj [E][inter][hidden], both x @ W; or, with MXFP4
 * (quantization_config), gate_up_proj_blocks/_scales [E][2 inter][hidden/32][16 | -] whose
 * rows interleave gate and up the same way, and down_proj_blocks/_scales [E][hidden][inter/32].
 * Biases gate_up_proj_bias [E][2 inter] (interleaved too) and down_proj_bias [E][hidden].
 * Gate and up become separate [inter][hidden] matrices, down a [hidden][inter] one. */
static int s_experts_gpt_oss(ld_t *L, int l, layer_t *ly)
{
    const model_config_t *c = &L->m->cfg;
    const int64_t E = c->n_experts, H = c->hidden, I = c->moe_inter;
    char n[256];
    int rc;
    const st_tensor_t *gub, *dnb;
    int64_t s_gub[2] = {E, 2 * I}, s_dnb[2] = {E, H};
    NAME(n, "model.layers.%d.mlp.experts.gate_up_proj_bias", l);
    if ((rc = s_get(L, n, 2, s_gub, true, &gub)) < 0) return rc;
    NAME(n, "model.layers.%d.mlp.experts.down_proj_bias", l);
    if ((rc = s_get(L, n, 2, s_dnb, true, &dnb)) < 0) return rc;
    if ((rc = s_vec_strided(L, gub, E, 2 * I, I, 2, 0, &ly->egate_b)) < 0 ||
        (rc = s_vec_strided(L, gub, E, 2 * I, I, 2, 1, &ly->eup_b)) < 0 ||
        (rc = s_vec_strided(L, dnb, E, H, H, 1, 0, &ly->edown_b)) < 0)
        return rc;
    if (c->experts_mxfp4[l]) {
        const st_tensor_t *gb, *gs, *db, *ds;
        NAME(n, "model.layers.%d.mlp.experts.gate_up_proj", l);
        if ((rc = s_mx_pair(L, n, E, 2 * I, H, &gb, &gs)) < 0) return rc;
        NAME(n, "model.layers.%d.mlp.experts.down_proj", l);
        if ((rc = s_mx_pair(L, n, E, H, I, &db, &ds)) < 0) return rc;
        for (int64_t e = 0; e < E; e++) {
            ffn_t *f = &ly->experts[e];
            if ((rc = s_mx_rows(L, gb, gs, e, 2 * I, I, H, 2, 0, &f->gate)) < 0 ||
                (rc = s_mx_rows(L, gb, gs, e, 2 * I, I, H, 2, 1, &f->up)) < 0 ||
                (rc = s_mx_rows(L, db, ds, e, H, H, I, 1, 0, &f->down)) < 0)
                return rc;
        }
        return 0;
    }
    const st_tensor_t *gu, *dn;
    int64_t s_gu[3] = {E, H, 2 * I}, s_dn[3] = {E, I, H};
    NAME(n, "model.layers.%d.mlp.experts.gate_up_proj", l);
    if ((rc = s_get(L, n, 3, s_gu, true, &gu)) < 0) return rc;
    NAME(n, "model.layers.%d.mlp.experts.down_proj", l);
    if ((rc = s_get(L, n, 3, s_dn, true, &dn)) < 0) return rc;
    for (int64_t e = 0; e < E; e++) {
        ffn_t *f = &ly->experts[e];
        if ((rc = s_transposed(L, gu, e, I, H, 2 * I, 2, 0, &f->gate)) < 0 ||
            (rc = s_transposed(L, gu, e, I, H, 2 * I, 2, 1, &f->up)) < 0 ||
            (rc = s_transposed(L, dn, e, H, I, H, 1, 0, &f->down)) < 0)
            return rc;
    }
    return 0;
}

static int s_layer(ld_t *L, int l)
{
    const model_config_t *c = &L->m->cfg;
    layer_t *ly = &L->m->layers[l];
    const int64_t H = c->hidden, hd = c->head_dim, QD = (int64_t)c->n_heads * hd, KD = (int64_t)c->n_kv_heads * hd;
    char n[256];
    int rc;

    NAME(n, "model.layers.%d.input_layernorm.weight", l);
    if ((rc = s_vec(L, n, H, true, &ly->attn_norm)) < 0) return rc;
    NAME(n, "model.layers.%d.post_attention_layernorm.weight", l);
    if ((rc = s_vec(L, n, H, true, &ly->ffn_norm)) < 0) return rc;

    static const char *const proj[4] = {"q_proj", "k_proj", "v_proj", "o_proj"};
    qmat_t *w[4] = {&ly->wq, &ly->wk, &ly->wv, &ly->wo};
    float **b[4] = {&ly->bq, &ly->bk, &ly->bv, &ly->bo};
    const int64_t rows[4] = {QD, KD, KD, H}, cols[4] = {H, H, H, QD};
    for (int i = 0; i < 4; i++) {
        NAME(n, "model.layers.%d.self_attn.%s.weight", l, proj[i]);
        if ((rc = s_mat(L, n, rows[i], cols[i], false, w[i])) < 0) return rc;
        bool has_bias = i < 3 ? c->qkv_bias : c->o_bias;
        if (has_bias) {
            NAME(n, "model.layers.%d.self_attn.%s.bias", l, proj[i]);
            if ((rc = s_vec(L, n, rows[i], true, b[i])) < 0) return rc;
        }
    }
    if (c->attn_sinks) {
        NAME(n, "model.layers.%d.self_attn.sinks", l);
        if ((rc = s_vec(L, n, c->n_heads, true, &ly->sinks)) < 0) return rc;
    }
    if (c->qk_norm != QK_NORM_NONE) {
        bool head = c->qk_norm == QK_NORM_HEAD;
        NAME(n, "model.layers.%d.self_attn.q_norm.weight", l);
        if ((rc = s_vec(L, n, head ? hd : QD, true, &ly->q_norm)) < 0) return rc;
        NAME(n, "model.layers.%d.self_attn.k_norm.weight", l);
        if ((rc = s_vec(L, n, head ? hd : KD, true, &ly->k_norm)) < 0) return rc;
    }

    if (!c->layer_sparse[l]) {
        NAME(n, "model.layers.%d.mlp", l);
        return s_ffn(L, n, "gate_proj", "up_proj", "down_proj", c->dense_inter, &ly->dense);
    }
    /* Mixtral's MoE block is block_sparse_moe (Hub) or mlp (transformers 5.x renames it). */
    const char *moe = "mlp";
    shard_t *sh;
    if (c->arch == ARCH_MIXTRAL) {
        NAME(n, "model.layers.%d.block_sparse_moe.gate.weight", l);
        if (s_lookup(L, n, &sh)) moe = "block_sparse_moe";
    }
    if (c->arch == ARCH_GPT_OSS) {
        NAME(n, "model.layers.%d.mlp.router.weight", l);
        if ((rc = s_mat(L, n, c->n_experts, H, true, &ly->router)) < 0) return rc;
        NAME(n, "model.layers.%d.mlp.router.bias", l);
        if ((rc = s_vec(L, n, c->n_experts, true, &ly->router_b)) < 0) return rc;
        ly->experts = calloc((size_t)c->n_experts, sizeof *ly->experts);
        if (!ly->experts || model_own_buffer(L->m, ly->experts) < 0) {
            free(ly->experts);
            ly->experts = NULL;
            return strata_seterr(L->eb, STRATA_ENOMEM, "%s: out of memory", L->dir);
        }
        return s_experts_gpt_oss(L, l, ly);
    }
    NAME(n, "model.layers.%d.%s.gate.weight", l, moe);
    if ((rc = s_mat(L, n, c->n_experts, H, true, &ly->router)) < 0) return rc;
    if ((rc = s_experts(L, l, ly, moe)) < 0) return rc;
    if (c->shared_inter > 0) {
        NAME(n, "model.layers.%d.mlp.shared_expert", l);
        if ((rc = s_ffn(L, n, "gate_proj", "up_proj", "down_proj", c->shared_inter, &ly->shared)) < 0) return rc;
        NAME(n, "model.layers.%d.mlp.shared_expert_gate.weight", l);
        if ((rc = s_mat(L, n, 1, H, true, &ly->shared_gate)) < 0) return rc;
    }
    return 0;
}

/* Log the tensors nothing used. */
static void s_report_unused(ld_t *L)
{
    size_t unused = 0;
    for (size_t s = 0; s < L->n_shards; s++) {
        shard_t *sh = &L->shards[s];
        for (size_t i = 0; i < st_count(sh->st); i++) {
            if (sh->used[i]) continue;
            const char *name = st_tensor(sh->st, i)->name;
            if (L->weight_map) {
                /* A tensor the index puts elsewhere is that shard's business. */
                json_t *fv = json_object_get(L->weight_map, name);
                if (!fv) {
                    log_warn("%s: tensor '%s' is not in the index; ignored", st_path(sh->st), name);
                    continue;
                }
                if (strcmp(json_string_value(fv), sh->name)) continue;
            }
            size_t len = strlen(name);
            if (L->m->cfg.tie_embeddings && !strcmp(name, "lm_head.weight")) {
                /* transformers ties the head to the embedding and drops this copy */
                const st_tensor_t *h = st_tensor(sh->st, i);
                bool same = L->embed &&
                            L->embed->dtype == h->dtype && L->embed->nbytes == h->nbytes &&
                            !memcmp(L->embed->data, h->data, h->nbytes);
                if (same) log_debug("%s: lm_head.weight equals the tied embedding; ignored", st_path(sh->st));
                else log_warn("%s: lm_head.weight differs from model.embed_tokens.weight but tie_word_embeddings "
                              "is true; the embedding is used, as in transformers", st_path(sh->st));
                continue;
            }
            if (len >= 8 && !strcmp(name + len - 8, "inv_freq")) {
                log_debug("%s: tensor '%s' (rotary buffer) ignored", st_path(sh->st), name);
                continue;
            }
            if (++unused <= 8) log_warn("%s: tensor '%s' is not used by %s; ignored", st_path(sh->st), name,
                                        L->m->cfg.arch_name);
        }
    }
    if (unused > 8) log_warn("%s: %zu tensors in all are not used; ignored", L->dir, unused);
}

static int s_load_hf(ld_t *L)
{
    model_t *m = L->m;
    const model_config_t *c = &m->cfg;
    int rc;
    const int64_t V = c->vocab, H = c->hidden;

    if ((rc = s_open_files(L)) < 0) return rc;
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    if (!m->layers || model_own_buffer(m, m->layers) < 0) {
        free(m->layers);
        m->layers = NULL;
        return strata_seterr(L->eb, STRATA_ENOMEM, "%s: out of memory", L->dir);
    }
    int64_t eshape[2] = {V, H};
    if ((rc = s_get(L, "model.embed_tokens.weight", 2, eshape, true, &L->embed)) < 0 ||
        (rc = s_qmat_from(L, L->embed, 0, V, H, false, &m->embed)) < 0)
        return rc;
    if ((rc = s_vec(L, "model.norm.weight", H, true, &m->final_norm)) < 0) return rc;
    if (c->tie_embeddings) {
        m->lm_head = m->embed;
    } else if ((rc = s_mat(L, "lm_head.weight", V, H, false, &m->lm_head)) < 0) {
        return rc;
    }
    for (int l = 0; l < c->n_layers; l++)
        if ((rc = s_layer(L, l)) < 0) return rc;
    s_report_unused(L);
    if (L->scan && (rc = s_scan(L)) < 0) return rc;

    /* The mappings now belong to the model. */
    for (size_t s = 0; s < L->n_shards; s++) {
        void *addr;
        size_t len;
        if (st_take_mapping(L->shards[s].st, &addr, &len) < 0) continue;
        if (model_own_mmap(m, addr, len) < 0) {
            munmap(addr, len);
            return strata_seterr(L->eb, STRATA_ENOMEM, "%s: out of memory", L->dir);
        }
    }
    return 0;
}

/* Load an HF checkpoint folder, or a packed folder (it holds strata-manifest.json). */
/* What s_open_files and the load left in L: the shards, the scan list, the index. */
static void s_close_files(ld_t *L)
{
    for (size_t s = 0; s < L->n_shards; s++) {
        st_close(L->shards[s].st);
        free(L->shards[s].name);
        free(L->shards[s].used);
    }
    free(L->shards);
    free(L->scan_list);
    json_decref(L->index);
}

int model_check(const char *dir, strata_errbuf_t *eb)
{
    int rc;
    char path[4096];
    struct stat st;
    if (!dir[0]) return strata_seterr(eb, STRATA_EINVAL_INPUT, "[group] model is not set");
    if (stat(dir, &st) < 0) return strata_seterr(eb, STRATA_EINVAL_INPUT, "model folder %s: %s", dir, strerror(errno));
    if (!S_ISDIR(st.st_mode)) return strata_seterr(eb, STRATA_EINVAL_INPUT, "model folder %s: not a directory", dir);
    if ((rc = s_path(path, sizeof path, dir, "strata-manifest.json", eb)) < 0) return rc;
    if (s_exists(path)) return packed_check_dir(dir, eb);
    model_t m = {0};
    ld_t L = {.m = &m, .dir = dir, .eb = eb};
    if ((rc = s_path(path, sizeof path, dir, "config.json", eb)) < 0) return rc;
    if ((rc = model_config_load(&m.cfg, path, eb)) >= 0) rc = s_open_files(&L);
    s_close_files(&L);
    model_free(&m);
    return rc < 0 ? rc : 0;
}

int model_load(model_t *m, const char *dir, strata_errbuf_t *eb)
{
    int rc;
    char path[4096];
    ld_t L = {.m = m, .dir = dir, .eb = eb};
    const char *skip = getenv("STRATA_SKIP_NAN_SCAN");
    L.scan = !(skip && !strcmp(skip, "1"));
    memset(m, 0, sizeof *m);

    if ((rc = s_path(path, sizeof path, dir, "strata-manifest.json", eb)) < 0) return rc;
    if (s_exists(path)) return model_load_packed(m, dir, eb);
    if ((rc = s_path(path, sizeof path, dir, "config.json", eb)) < 0) return rc;
    if ((rc = model_config_load(&m->cfg, path, eb)) < 0) goto fail;
    if ((rc = s_load_hf(&L)) < 0) goto fail;
    log_info("loaded %s from %s: %d layers, %d experts (top %d), hidden %d, vocab %d, %zu file%s",
             m->cfg.arch_name, dir, m->cfg.n_layers, m->cfg.n_experts, m->cfg.top_k, m->cfg.hidden, m->cfg.vocab,
             L.n_shards, L.n_shards == 1 ? "" : "s");
    rc = 0;
fail:
    s_close_files(&L);
    if (rc < 0) model_free(m);
    return rc;
}
