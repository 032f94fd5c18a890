/* test_load.c - the HF folder loader (model/load.c).
 *
 * Part 1 writes tiny synthetic checkpoints of every architecture (per-expert and fused expert
 * layouts, F32 / BF16 / F16, one file or shards with an index, tied or not, misaligned data)
 * and checks that every weight of the loaded model_t has the config's shape and holds exactly
 * the file's values. Part 2 feeds it broken folders: each must fail with one message naming
 * the file and the tensor or field. Part 3 loads every fixture folder under argv[1] (the HF
 * reference fixtures made by tests/fixtures/make_fixtures.py) and checks it the same way.
 *
 * The expected values always come from reading the safetensors files back independently, so
 * the check covers names, shapes, the split of fused experts and every dtype conversion.
 */
#include <dirent.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/safetensors.h"
#include "model/model.h"
#include "tests/unit/check.h"

static char s_root[256];

/* ---- the independent reader: every tensor of every .safetensors in a folder ------------- */

typedef struct {
    st_file_t *f[64];
    int n;
} src_t;

static void s_src_open(src_t *s, const char *dir)
{
    memset(s, 0, sizeof *s);
    DIR *d = opendir(dir);
    STRATA_ASSERT(d);
    struct dirent *e;
    while ((e = readdir(d)) && s->n < 64) {
        size_t l = strlen(e->d_name);
        if (l < 12 || strcmp(e->d_name + l - 12, ".safetensors")) continue;
        char p[512];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        strata_errbuf_t eb;
        if (st_open(&s->f[s->n], p, &eb) == 0) s->n++;
    }
    closedir(d);
}

static void s_src_close(src_t *s)
{
    for (int i = 0; i < s->n; i++) st_close(s->f[i]);
}

static const st_tensor_t *s_src_find(src_t *s, const char *name)
{
    for (int i = 0; i < s->n; i++) {
        const st_tensor_t *t = st_find(s->f[i], name);
        if (t) return t;
    }
    return NULL;
}

static float s_elem(const st_tensor_t *t, size_t i)
{
    const uint8_t *p = t->data;
    if (t->dtype == ST_F32) {
        float f;
        memcpy(&f, p + 4 * i, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, p + 2 * i, 2);
    return t->dtype == ST_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

/* ---- checks of a loaded model against the files ---------------------------------------- */

typedef struct {
    src_t src;
    int mats, vecs;
    bool bad;
} vctx_t;

static bool s_same(float a, float b) { return a == b || (isnan(a) && isnan(b)); }

static void s_check_mat(vctx_t *v, const qmat_t *q, const char *name, size_t off, int64_t rows, int64_t cols)
{
    const st_tensor_t *t = s_src_find(&v->src, name);
    T_CHECK(t != NULL, "source tensor %s not found", name);
    if (!t) return;
    T_CHECK(q->rows == rows && q->cols == cols, "%s: loaded [%d, %d], config wants [%lld, %lld]", name, q->rows,
            q->cols, (long long)rows, (long long)cols);
    if (q->rows != rows || q->cols != cols || !q->data) {
        v->bad = true;
        return;
    }
    wfmt_t want = t->dtype == ST_BF16 ? WF_BF16 : WF_F32;
    T_CHECK(q->fmt == want, "%s: format %s for dtype %s", name, wfmt_name(q->fmt), st_dtype_name(t->dtype));
    float *row = malloc((size_t)cols * sizeof *row);
    size_t bad = 0;
    for (int64_t r = 0; r < rows; r++) {
        qmat_dequant_row(q, (int32_t)r, row);
        for (int64_t c = 0; c < cols; c++) bad += !s_same(row[c], s_elem(t, off + (size_t)(r * cols + c)));
    }
    free(row);
    T_CHECK(bad == 0, "%s (+%zu): %zu elements differ from the file", name, off, bad);
    v->mats++;
}

/* A matrix the loader must hold as F32 (router, shared gate). */
static void s_check_mat_f32(vctx_t *v, const qmat_t *q, const char *name, int64_t rows, int64_t cols)
{
    const st_tensor_t *t = s_src_find(&v->src, name);
    T_CHECK(q->fmt == WF_F32, "%s: router-like matrix must be F32, is %s", name, wfmt_name(q->fmt));
    T_CHECK(t && q->rows == rows && q->cols == cols && q->data, "%s: shape [%d, %d]", name, q->rows, q->cols);
    if (!t || q->fmt != WF_F32 || q->rows != rows || q->cols != cols || !q->data) return;
    size_t bad = 0;
    for (int64_t i = 0; i < rows * cols; i++) bad += !s_same(((const float *)q->data)[i], s_elem(t, (size_t)i));
    T_CHECK(bad == 0, "%s: %zu elements differ", name, bad);
    v->mats++;
}

static void s_check_vec(vctx_t *v, const float *p, const char *name, int64_t len)
{
    const st_tensor_t *t = s_src_find(&v->src, name);
    T_CHECK(t && p, "vector %s: loaded %p, in file %p", name, (const void *)p, (const void *)t);
    if (!t || !p) return;
    T_CHECK(t->ndim == 1 && t->shape[0] == len, "%s: file length %lld, config wants %lld", name,
            (long long)t->shape[0], (long long)len);
    if (t->shape[0] != len) return;
    T_CHECK(((uintptr_t)p & 3) == 0, "%s: misaligned float pointer", name);
    size_t bad = 0;
    for (int64_t i = 0; i < len; i++) bad += !s_same(p[i], s_elem(t, (size_t)i));
    T_CHECK(bad == 0, "%s: %zu elements differ", name, bad);
    v->vecs++;
}

static void s_check_ffn(vctx_t *v, const ffn_t *f, const char *pre, const char *g, const char *u, const char *d,
                        int64_t I, int64_t H)
{
    char n[256];
    snprintf(n, sizeof n, "%s.%s.weight", pre, g);
    s_check_mat(v, &f->gate, n, 0, I, H);
    snprintf(n, sizeof n, "%s.%s.weight", pre, u);
    s_check_mat(v, &f->up, n, 0, I, H);
    snprintf(n, sizeof n, "%s.%s.weight", pre, d);
    s_check_mat(v, &f->down, n, 0, H, I);
}

/* Check every weight of m against the files of dir; returns the number of matrices checked. */
/* A gpt-oss expert matrix against GptOssExperts' tensor t of x @ W layout: row r, column k of
 * expert e is t[e][k][r * step + off] ([E][cols][src_cols]). For an MXFP4 checkpoint, t is
 * transformers' own dequantization (the fixture's dequant.safetensors), so the weights Strata
 * decodes must equal transformers' bit for bit. */
static void s_check_gpt_oss_mat(vctx_t *v, const qmat_t *q, const st_tensor_t *t, const char *name, int64_t e,
                                int64_t rows, int64_t cols, int64_t src_cols, int step, int off, bool mxfp4)
{
    T_CHECK(q->rows == rows && q->cols == cols && q->data, "%s expert %lld: loaded [%d, %d], want [%lld, %lld]", name,
            (long long)e, q->rows, q->cols, (long long)rows, (long long)cols);
    if (q->rows != rows || q->cols != cols || !q->data) return;
    T_CHECK(!mxfp4 || (q->fmt == WF_MXFP4 && q->group == 32), "%s expert %lld: format %s, want mxfp4", name,
            (long long)e, wfmt_name(q->fmt));
    float *row = malloc((size_t)cols * sizeof *row);
    size_t bad = 0;
    for (int64_t r = 0; r < rows; r++) {
        qmat_dequant_row(q, (int32_t)r, row);
        for (int64_t k = 0; k < cols; k++) {
            float want = s_elem(t, (size_t)((e * cols + k) * src_cols + r * step + off));
            /* bit for bit, the sign of zero included */
            bad += memcmp(&row[k], &want, 4) != 0 && !(isnan(row[k]) && isnan(want));
        }
    }
    free(row);
    T_CHECK(bad == 0, "%s expert %lld: %zu elements differ from %s", name, (long long)e, bad,
            mxfp4 ? "transformers' dequantization" : "the file");
    v->mats++;
}

/* gpt-oss's MoE block: router weight and bias, expert biases de-interleaved, expert matrices. */
static void s_check_gpt_oss_moe(vctx_t *v, const model_config_t *c, const layer_t *ly, int l)
{
    const int64_t E = c->n_experts, H = c->hidden, I = c->moe_inter;
    char n[256], dn[256];
    snprintf(n, sizeof n, "model.layers.%d.mlp.router.weight", l);
    s_check_mat_f32(v, &ly->router, n, E, H);
    snprintf(n, sizeof n, "model.layers.%d.mlp.router.bias", l);
    s_check_vec(v, ly->router_b, n, E);
    snprintf(n, sizeof n, "model.layers.%d.mlp.experts.gate_up_proj_bias", l);
    const st_tensor_t *gb = s_src_find(&v->src, n);
    snprintf(n, sizeof n, "model.layers.%d.mlp.experts.down_proj_bias", l);
    const st_tensor_t *db = s_src_find(&v->src, n);
    T_CHECK(gb && db && ly->egate_b && ly->eup_b && ly->edown_b, "layer %d: expert biases missing", l);
    if (!gb || !db || !ly->egate_b || !ly->eup_b || !ly->edown_b) return;
    size_t bad = 0;
    for (int64_t e = 0; e < E; e++) {
        for (int64_t j = 0; j < I; j++) {
            bad += !s_same(ly->egate_b[e * I + j], s_elem(gb, (size_t)(e * 2 * I + 2 * j)));
            bad += !s_same(ly->eup_b[e * I + j], s_elem(gb, (size_t)(e * 2 * I + 2 * j + 1)));
        }
        for (int64_t h = 0; h < H; h++) bad += !s_same(ly->edown_b[e * H + h], s_elem(db, (size_t)(e * H + h)));
    }
    T_CHECK(bad == 0, "layer %d: %zu expert bias elements differ", l, bad);
    snprintf(n, sizeof n, "model.layers.%d.mlp.experts.gate_up_proj", l);
    snprintf(dn, sizeof dn, "model.layers.%d.mlp.experts.down_proj", l);
    const st_tensor_t *gu = s_src_find(&v->src, n), *dp = s_src_find(&v->src, dn);
    T_CHECK(gu && dp, "layer %d: no %s / %s to check the experts against", l, n, dn);
    if (!gu || !dp) return;
    const bool mx = c->experts_mxfp4[l];
    for (int64_t e = 0; e < E; e++) {
        const ffn_t *f = &ly->experts[e];
        s_check_gpt_oss_mat(v, &f->gate, gu, n, e, I, H, 2 * I, 2, 0, mx);
        s_check_gpt_oss_mat(v, &f->up, gu, n, e, I, H, 2 * I, 2, 1, mx);
        s_check_gpt_oss_mat(v, &f->down, dp, dn, e, H, I, H, 1, 0, mx);
    }
}

static int s_verify(const model_t *m, const char *dir)
{
    vctx_t v = {0};
    s_src_open(&v.src, dir);
    const model_config_t *c = &m->cfg;
    const int64_t H = c->hidden, V = c->vocab, hd = c->head_dim, QD = (int64_t)c->n_heads * hd,
                  KD = (int64_t)c->n_kv_heads * hd, E = c->n_experts;
    char n[256], pre[256];
    s_check_mat(&v, &m->embed, "model.embed_tokens.weight", 0, V, H);
    s_check_vec(&v, m->final_norm, "model.norm.weight", H);
    if (c->tie_embeddings)
        T_CHECK(m->lm_head.data == m->embed.data && m->lm_head.fmt == m->embed.fmt, "tied lm_head is not embed");
    else
        s_check_mat(&v, &m->lm_head, "lm_head.weight", 0, V, H);
    for (int l = 0; l < c->n_layers; l++) {
        const layer_t *ly = &m->layers[l];
        snprintf(n, sizeof n, "model.layers.%d.input_layernorm.weight", l);
        s_check_vec(&v, ly->attn_norm, n, H);
        snprintf(n, sizeof n, "model.layers.%d.post_attention_layernorm.weight", l);
        s_check_vec(&v, ly->ffn_norm, n, H);
        const char *pn[4] = {"q_proj", "k_proj", "v_proj", "o_proj"};
        const qmat_t *w[4] = {&ly->wq, &ly->wk, &ly->wv, &ly->wo};
        const float *b[4] = {ly->bq, ly->bk, ly->bv, ly->bo};
        const int64_t rows[4] = {QD, KD, KD, H}, cols[4] = {H, H, H, QD};
        for (int i = 0; i < 4; i++) {
            snprintf(n, sizeof n, "model.layers.%d.self_attn.%s.weight", l, pn[i]);
            s_check_mat(&v, w[i], n, 0, rows[i], cols[i]);
            bool want = i < 3 ? c->qkv_bias : c->o_bias;
            snprintf(n, sizeof n, "model.layers.%d.self_attn.%s.bias", l, pn[i]);
            if (want) s_check_vec(&v, b[i], n, rows[i]);
            else T_CHECK(b[i] == NULL, "%s: bias loaded but config has none", n);
        }
        if (c->qk_norm == QK_NORM_NONE) {
            T_CHECK(!ly->q_norm && !ly->k_norm, "layer %d: q/k norm without qk_norm", l);
        } else {
            bool head = c->qk_norm == QK_NORM_HEAD;
            snprintf(n, sizeof n, "model.layers.%d.self_attn.q_norm.weight", l);
            s_check_vec(&v, ly->q_norm, n, head ? hd : QD);
            snprintf(n, sizeof n, "model.layers.%d.self_attn.k_norm.weight", l);
            s_check_vec(&v, ly->k_norm, n, head ? hd : KD);
        }
        snprintf(n, sizeof n, "model.layers.%d.self_attn.sinks", l);
        if (c->attn_sinks) s_check_vec(&v, ly->sinks, n, c->n_heads);
        else T_CHECK(ly->sinks == NULL, "layer %d: sinks loaded but the config has none", l);
        if (!c->layer_sparse[l]) {
            snprintf(pre, sizeof pre, "model.layers.%d.mlp", l);
            s_check_ffn(&v, &ly->dense, pre, "gate_proj", "up_proj", "down_proj", c->dense_inter, H);
            T_CHECK(ly->experts == NULL, "dense layer %d has experts", l);
            continue;
        }
        if (c->arch == ARCH_GPT_OSS) {
            T_CHECK(ly->experts != NULL, "sparse layer %d without experts", l);
            if (ly->experts) s_check_gpt_oss_moe(&v, c, ly, l);
            continue;
        }
        bool mix = c->arch == ARCH_MIXTRAL;
        const char *moe = "mlp";
        snprintf(n, sizeof n, "model.layers.%d.block_sparse_moe.gate.weight", l);
        if (mix && s_src_find(&v.src, n)) moe = "block_sparse_moe";
        snprintf(n, sizeof n, "model.layers.%d.%s.gate.weight", l, moe);
        s_check_mat_f32(&v, &ly->router, n, E, H);
        T_CHECK(ly->experts != NULL, "sparse layer %d without experts", l);
        if (!ly->experts) continue;
        const int64_t I = c->moe_inter;
        snprintf(n, sizeof n, "model.layers.%d.%s.experts.gate_up_proj", l, moe);
        bool fused = s_src_find(&v.src, n) != NULL;
        for (int64_t e = 0; e < E; e++) {
            const ffn_t *f = &ly->experts[e];
            if (fused) {
                /* gate_up [E][2I][H]: gate rows first, then up; down [E][H][I] */
                s_check_mat(&v, &f->gate, n, (size_t)(e * 2 * I * H), I, H);
                s_check_mat(&v, &f->up, n, (size_t)((e * 2 + 1) * I * H), I, H);
                char dn[256];
                snprintf(dn, sizeof dn, "model.layers.%d.%s.experts.down_proj", l, moe);
                s_check_mat(&v, &f->down, dn, (size_t)(e * H * I), H, I);
            } else {
                snprintf(pre, sizeof pre, "model.layers.%d.%s.experts.%lld", l, moe, (long long)e);
                s_check_ffn(&v, f, pre, mix ? "w1" : "gate_proj", mix ? "w3" : "up_proj", mix ? "w2" : "down_proj", I,
                            H);
            }
        }
        if (c->shared_inter > 0) {
            snprintf(pre, sizeof pre, "model.layers.%d.mlp.shared_expert", l);
            s_check_ffn(&v, &ly->shared, pre, "gate_proj", "up_proj", "down_proj", c->shared_inter, H);
            snprintf(n, sizeof n, "model.layers.%d.mlp.shared_expert_gate.weight", l);
            s_check_mat_f32(&v, &ly->shared_gate, n, 1, H);
        }
    }
    s_src_close(&v.src);
    return v.mats;
}

/* ---- synthetic checkpoints ------------------------------------------------------------- */

typedef struct {
    char name[128];
    st_dtype_t dt;
    int nd;
    int64_t sh[3];
} spec_t;

typedef struct {
    spec_t t[1024];
    int n;
} specs_t;

static void s_add(specs_t *s, st_dtype_t dt, int nd, int64_t a, int64_t b, int64_t c, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));
static void s_add(specs_t *s, st_dtype_t dt, int nd, int64_t a, int64_t b, int64_t c, const char *fmt, ...)
{
    STRATA_ASSERT(s->n < 1024);
    spec_t *t = &s->t[s->n++];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->name, sizeof t->name, fmt, ap);
    va_end(ap);
    t->dt = dt;
    t->nd = nd;
    t->sh[0] = a, t->sh[1] = b, t->sh[2] = c;
}

static spec_t *s_spec(specs_t *s, const char *name)
{
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->t[i].name, name)) return &s->t[i];
    return NULL;
}

static void s_del(specs_t *s, const char *name)
{
    spec_t *t = s_spec(s, name);
    STRATA_ASSERT(t);
    *t = s->t[--s->n];
}

/* The tensors a checkpoint of config c holds (HF names), all in dtype dt. */
static void s_specs(specs_t *s, const model_config_t *c, st_dtype_t dt, bool fused, bool lm_head)
{
    const int64_t H = c->hidden, V = c->vocab, hd = c->head_dim, QD = (int64_t)c->n_heads * hd,
                  KD = (int64_t)c->n_kv_heads * hd, E = c->n_experts, I = c->moe_inter;
    s->n = 0;
    s_add(s, dt, 2, V, H, 0, "model.embed_tokens.weight");
    s_add(s, dt, 1, H, 0, 0, "model.norm.weight");
    if (lm_head) s_add(s, dt, 2, V, H, 0, "lm_head.weight");
    bool mix = c->arch == ARCH_MIXTRAL;
    for (int l = 0; l < c->n_layers; l++) {
        s_add(s, dt, 1, H, 0, 0, "model.layers.%d.input_layernorm.weight", l);
        s_add(s, dt, 1, H, 0, 0, "model.layers.%d.post_attention_layernorm.weight", l);
        s_add(s, dt, 2, QD, H, 0, "model.layers.%d.self_attn.q_proj.weight", l);
        s_add(s, dt, 2, KD, H, 0, "model.layers.%d.self_attn.k_proj.weight", l);
        s_add(s, dt, 2, KD, H, 0, "model.layers.%d.self_attn.v_proj.weight", l);
        s_add(s, dt, 2, H, QD, 0, "model.layers.%d.self_attn.o_proj.weight", l);
        if (c->qkv_bias) {
            s_add(s, dt, 1, QD, 0, 0, "model.layers.%d.self_attn.q_proj.bias", l);
            s_add(s, dt, 1, KD, 0, 0, "model.layers.%d.self_attn.k_proj.bias", l);
            s_add(s, dt, 1, KD, 0, 0, "model.layers.%d.self_attn.v_proj.bias", l);
        }
        if (c->o_bias) s_add(s, dt, 1, H, 0, 0, "model.layers.%d.self_attn.o_proj.bias", l);
        if (c->qk_norm != QK_NORM_NONE) {
            bool head = c->qk_norm == QK_NORM_HEAD;
            s_add(s, dt, 1, head ? hd : QD, 0, 0, "model.layers.%d.self_attn.q_norm.weight", l);
            s_add(s, dt, 1, head ? hd : KD, 0, 0, "model.layers.%d.self_attn.k_norm.weight", l);
        }
        if (!c->layer_sparse[l]) {
            s_add(s, dt, 2, c->dense_inter, H, 0, "model.layers.%d.mlp.gate_proj.weight", l);
            s_add(s, dt, 2, c->dense_inter, H, 0, "model.layers.%d.mlp.up_proj.weight", l);
            s_add(s, dt, 2, H, c->dense_inter, 0, "model.layers.%d.mlp.down_proj.weight", l);
            continue;
        }
        const char *moe = mix && !fused ? "block_sparse_moe" : "mlp";
        s_add(s, dt, 2, E, H, 0, "model.layers.%d.%s.gate.weight", l, moe);
        if (fused) {
            s_add(s, dt, 3, E, 2 * I, H, "model.layers.%d.%s.experts.gate_up_proj", l, moe);
            s_add(s, dt, 3, E, H, I, "model.layers.%d.%s.experts.down_proj", l, moe);
        } else {
            for (int e = 0; e < E; e++) {
                s_add(s, dt, 2, I, H, 0, "model.layers.%d.%s.experts.%d.%s.weight", l, moe, e, mix ? "w1" : "gate_proj");
                s_add(s, dt, 2, H, I, 0, "model.layers.%d.%s.experts.%d.%s.weight", l, moe, e, mix ? "w2" : "down_proj");
                s_add(s, dt, 2, I, H, 0, "model.layers.%d.%s.experts.%d.%s.weight", l, moe, e, mix ? "w3" : "up_proj");
            }
        }
        if (c->shared_inter) {
            s_add(s, dt, 2, c->shared_inter, H, 0, "model.layers.%d.mlp.shared_expert.gate_proj.weight", l);
            s_add(s, dt, 2, c->shared_inter, H, 0, "model.layers.%d.mlp.shared_expert.up_proj.weight", l);
            s_add(s, dt, 2, H, c->shared_inter, 0, "model.layers.%d.mlp.shared_expert.down_proj.weight", l);
            s_add(s, dt, 2, 1, H, 0, "model.layers.%d.mlp.shared_expert_gate.weight", l);
        }
    }
}

static size_t s_numel(const spec_t *t)
{
    size_t n = 1;
    for (int i = 0; i < t->nd; i++) n *= (size_t)t->sh[i];
    return n;
}

/* Write specs [i0, i1) as one safetensors file with seeded values; `pre` extra bytes of an
 * unused U8 tensor go first so every later tensor is misaligned when pre is odd. */
static void s_write_st(const char *path, const specs_t *s, int i0, int i1, uint64_t *seed, int pre)
{
    json_t *h = json_object();
    size_t off = 0;
    if (pre) {
        json_t *e = json_pack("{s:s, s:[i], s:[I,I]}", "dtype", "U8", "shape", pre, "data_offsets", (json_int_t)0,
                              (json_int_t)pre);
        json_object_set_new(h, "model.rotary_emb.pad_u8", e);
        off = (size_t)pre;
    }
    for (int i = i0; i < i1; i++) {
        const spec_t *t = &s->t[i];
        json_t *shape = json_array();
        for (int d = 0; d < t->nd; d++) json_array_append_new(shape, json_integer(t->sh[d]));
        size_t nb = s_numel(t) * st_dtype_size(t->dt);
        json_object_set_new(h, t->name,
                            json_pack("{s:s, s:o, s:[I,I]}", "dtype", st_dtype_name(t->dt), "shape", shape,
                                      "data_offsets", (json_int_t)off, (json_int_t)(off + nb)));
        off += nb;
    }
    json_object_set_new(h, "__metadata__", json_pack("{s:s}", "format", "pt"));
    char *hs = json_dumps(h, JSON_COMPACT);
    json_decref(h);
    size_t hl = strlen(hs), pad = (8 - hl % 8) % 8;
    FILE *f = fopen(path, "wb");
    STRATA_ASSERT(f);
    uint64_t L = hl + pad;
    fwrite(&L, 8, 1, f);
    fwrite(hs, 1, hl, f);
    for (size_t i = 0; i < pad; i++) fputc(' ', f);
    for (int i = 0; i < pre; i++) fputc(7, f);
    for (int i = i0; i < i1; i++) {
        const spec_t *t = &s->t[i];
        for (size_t k = 0; k < s_numel(t); k++) {
            float x = t_randf(seed);
            if (t->dt == ST_F32) {
                fwrite(&x, 4, 1, f);
            } else if (t->dt == ST_BF16 || t->dt == ST_F16) {
                uint16_t b = t->dt == ST_BF16 ? f32_to_bf16(x) : f32_to_f16(x);
                fwrite(&b, 2, 1, f);
            } else {
                for (size_t j = 0; j < st_dtype_size(t->dt); j++) fputc((int)(t_rng_next(seed) & 0xff), f);
            }
        }
    }
    fclose(f);
    free(hs);
}

static void s_mkdir_clean(const char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", dir, dir);
    STRATA_ASSERT(system(cmd) == 0);
}

/* A folder with config.json (text) and the specs, in `shards` files (1 = model.safetensors). */
static void s_write_folder(const char *dir, const char *config, const specs_t *s, int shards, uint64_t *seed, int pre)
{
    char p[512];
    s_mkdir_clean(dir);
    snprintf(p, sizeof p, "%s/config.json", dir);
    FILE *f = fopen(p, "w");
    fputs(config, f);
    fclose(f);
    if (shards <= 1) {
        snprintf(p, sizeof p, "%s/model.safetensors", dir);
        s_write_st(p, s, 0, s->n, seed, pre);
        return;
    }
    json_t *wm = json_object();
    for (int k = 0; k < shards; k++) {
        int i0 = s->n * k / shards, i1 = s->n * (k + 1) / shards;
        char fn[64];
        snprintf(fn, sizeof fn, "model-%05d-of-%05d.safetensors", k + 1, shards);
        snprintf(p, sizeof p, "%s/%s", dir, fn);
        s_write_st(p, s, i0, i1, seed, k == 0 ? pre : 0);
        for (int i = i0; i < i1; i++) json_object_set_new(wm, s->t[i].name, json_string(fn));
    }
    json_t *idx = json_pack("{s:{s:i}, s:o}", "metadata", "total_size", 0, "weight_map", wm);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    json_dump_file(idx, p, JSON_INDENT(1));
    json_decref(idx);
}

static const char *CFG_MIXTRAL =
    "{\"architectures\":[\"MixtralForCausalLM\"],\"model_type\":\"mixtral\",\"vocab_size\":64,\"hidden_size\":32,"
    "\"intermediate_size\":16,\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
    "\"num_local_experts\":4,\"num_experts_per_tok\":2,\"max_position_embeddings\":256,\"rms_norm_eps\":1e-5,"
    "\"rope_theta\":1000000.0,\"sliding_window\":null,\"tie_word_embeddings\":false,\"torch_dtype\":\"float32\"}";
static const char *CFG_QWEN2 =
    "{\"architectures\":[\"Qwen2MoeForCausalLM\"],\"model_type\":\"qwen2_moe\",\"vocab_size\":64,"
    "\"hidden_size\":32,\"intermediate_size\":48,\"moe_intermediate_size\":16,"
    "\"shared_expert_intermediate_size\":24,\"num_hidden_layers\":3,\"num_attention_heads\":4,"
    "\"num_key_value_heads\":4,\"num_experts\":4,\"num_experts_per_tok\":2,\"decoder_sparse_step\":1,"
    "\"mlp_only_layers\":[1],\"norm_topk_prob\":false,\"max_position_embeddings\":256,\"rms_norm_eps\":1e-6,"
    "\"rope_theta\":10000.0,\"use_sliding_window\":false,\"sliding_window\":4096,\"max_window_layers\":2,"
    "\"tie_word_embeddings\":true}";
static const char *CFG_QWEN3 =
    "{\"architectures\":[\"Qwen3MoeForCausalLM\"],\"model_type\":\"qwen3_moe\",\"vocab_size\":64,"
    "\"hidden_size\":32,\"intermediate_size\":48,\"moe_intermediate_size\":16,\"num_hidden_layers\":2,"
    "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":12,\"num_experts\":4,"
    "\"num_experts_per_tok\":2,\"norm_topk_prob\":true,\"decoder_sparse_step\":2,\"mlp_only_layers\":[],"
    "\"max_position_embeddings\":256,\"rms_norm_eps\":1e-6,\"attention_bias\":true,"
    "\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":1000000.0},\"use_sliding_window\":false,"
    "\"sliding_window\":null,\"tie_word_embeddings\":false,\"dtype\":\"bfloat16\"}";
static const char *CFG_OLMOE =
    "{\"architectures\":[\"OlmoeForCausalLM\"],\"model_type\":\"olmoe\",\"vocab_size\":64,\"hidden_size\":32,"
    "\"intermediate_size\":16,\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
    "\"num_experts\":4,\"num_experts_per_tok\":2,\"norm_topk_prob\":false,\"clip_qkv\":null,"
    "\"max_position_embeddings\":256,\"rms_norm_eps\":1e-5,\"rope_theta\":10000.0,\"tie_word_embeddings\":false,"
    "\"pad_token_id\":1,\"eos_token_id\":2}";

static void s_cfg(const char *js, model_config_t *c)
{
    strata_errbuf_t eb;
    int rc = model_config_parse(c, js, strlen(js), "synthetic", &eb);
    if (rc) fprintf(stderr, "synthetic config refused: %s\n", eb.msg);
    STRATA_ASSERT(rc == 0);
}

/* Load dir; expect success and a model equal to the files. */
static void s_load_ok(const char *what, const char *dir)
{
    model_t m;
    strata_errbuf_t eb = {{0}};
    int rc = model_load(&m, dir, &eb);
    T_CHECK(rc == 0, "%s: load failed: %s", what, eb.msg);
    if (rc) return;
    int mats = s_verify(&m, dir);
    T_CHECK(mats > 10, "%s: only %d matrices checked", what, mats);
    model_free(&m);
    T_CHECK(m.layers == NULL && m.priv == NULL, "%s: model_free left state", what);
}

static void test_synthetic(uint64_t *seed)
{
    const char *cfgs[4] = {CFG_MIXTRAL, CFG_QWEN2, CFG_QWEN3, CFG_OLMOE};
    const char *names[4] = {"mixtral", "qwen2", "qwen3", "olmoe"};
    const st_dtype_t dts[3] = {ST_F32, ST_BF16, ST_F16};
    static specs_t s;
    char dir[512];
    for (int a = 0; a < 4; a++) {
        model_config_t c;
        s_cfg(cfgs[a], &c);
        for (int d = 0; d < 3; d++)
            for (int fused = 0; fused < 2; fused++) {
                int shards = (a + d + fused) % 3 == 0 ? 3 : 1;
                int pre = (a + d) % 2 ? 3 : 0; /* odd prefix: every tensor misaligned */
                s_specs(&s, &c, dts[d], fused, !c.tie_embeddings || a == 1);
                snprintf(dir, sizeof dir, "%s/%s_%s_%s", s_root, names[a], st_dtype_name(dts[d]),
                         fused ? "fused" : "split");
                s_write_folder(dir, cfgs[a], &s, shards, seed, pre);
                char what[128];
                snprintf(what, sizeof what, "%s %s %s %d shard(s) pre %d", names[a], st_dtype_name(dts[d]),
                         fused ? "fused" : "per-expert", shards, pre);
                s_load_ok(what, dir);
            }
    }
    /* mixed dtypes in one checkpoint: bf16 matrices, f32 norms, f16 router */
    model_config_t c;
    s_cfg(CFG_QWEN3, &c);
    s_specs(&s, &c, ST_BF16, false, true);
    for (int i = 0; i < s.n; i++) {
        if (strstr(s.t[i].name, "norm")) s.t[i].dt = ST_F32;
        if (strstr(s.t[i].name, "mlp.gate.")) s.t[i].dt = ST_F16;
    }
    snprintf(dir, sizeof dir, "%s/mixed", s_root);
    s_write_folder(dir, CFG_QWEN3, &s, 1, seed, 1);
    s_load_ok("mixed dtypes", dir);
}

/* ---- broken folders -------------------------------------------------------------------- */

static void s_load_bad(const char *what, const char *dir, const char *want1, const char *want2)
{
    model_t m;
    strata_errbuf_t eb = {{0}};
    int rc = model_load(&m, dir, &eb);
    T_CHECK(rc < 0, "%s: loaded", what);
    if (rc == 0) {
        model_free(&m);
        return;
    }
    T_CHECK(strstr(eb.msg, want1) && (!want2 || strstr(eb.msg, want2)), "%s: message lacks '%s'/'%s': %s", what,
            want1, want2 ? want2 : "", eb.msg);
    T_CHECK(!strchr(eb.msg, '\n'), "%s: message is not one line", what);
    T_CHECK(m.layers == NULL && m.priv == NULL, "%s: failed load left state", what);
}

static void s_truncate(const char *path, off_t by)
{
    struct stat st;
    STRATA_ASSERT(stat(path, &st) == 0);
    STRATA_ASSERT(truncate(path, st.st_size - by) == 0);
}

static void test_broken(uint64_t *seed)
{
    static specs_t s;
    model_config_t c;
    char dir[512], p[600];
    s_cfg(CFG_MIXTRAL, &c);
    snprintf(dir, sizeof dir, "%s/broken", s_root);

    s_specs(&s, &c, ST_BF16, false, true);
    s_del(&s, "model.layers.1.block_sparse_moe.experts.3.w2.weight");
    s_write_folder(dir, CFG_MIXTRAL, &s, 1, seed, 0);
    s_load_bad("missing expert tensor", dir, "model.safetensors", "model.layers.1.block_sparse_moe.experts.3.w2.weight");

    s_specs(&s, &c, ST_BF16, false, false);
    s_write_folder(dir, CFG_MIXTRAL, &s, 1, seed, 0);
    s_load_bad("missing lm_head", dir, "lm_head.weight", "missing");

    s_specs(&s, &c, ST_F32, false, true);
    s_spec(&s, "model.layers.0.self_attn.k_proj.weight")->sh[0] = 32;
    s_write_folder(dir, CFG_MIXTRAL, &s, 1, seed, 0);
    s_load_bad("wrong shape", dir, "model.layers.0.self_attn.k_proj.weight", "[32, 32]");

    s_specs(&s, &c, ST_F32, false, true);
    s_spec(&s, "model.norm.weight")->nd = 2;
    s_spec(&s, "model.norm.weight")->sh[1] = 1;
    s_write_folder(dir, CFG_MIXTRAL, &s, 1, seed, 0);
    s_load_bad("wrong rank", dir, "model.norm.weight", "expected [32]");

    s_specs(&s, &c, ST_F32, false, true);
    s_spec(&s, "model.layers.0.self_attn.q_proj.weight")->dt = ST_I8;
    s_write_folder(dir, CFG_MIXTRAL, &s, 1, seed, 0);
    s_load_bad("integer dtype", dir, "q_proj.weight", "dtype I8");

    s_specs(&s, &c, ST_F32, true, true);
    s_spec(&s, "model.layers.0.mlp.experts.gate_up_proj")->sh[1] = 16; /* [E][I][H]: not gate+up */
    s_write_folder(dir, CFG_MIXTRAL, &s, 1, seed, 0);
    s_load_bad("fused gate_up without up", dir, "gate_up_proj", "expected [4, 32, 32]");

    s_specs(&s, &c, ST_F32, false, true);
    s_write_folder(dir, CFG_MIXTRAL, &s, 1, seed, 0);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    s_truncate(p, 10);
    s_load_bad("truncated file", dir, "model.safetensors", "outside the data area");
    FILE *f = fopen(p, "r+b");
    uint64_t huge = 1u << 30;
    fwrite(&huge, 8, 1, f);
    fclose(f);
    s_load_bad("header longer than the file", dir, "model.safetensors", "header length");
    unlink(p);
    s_load_bad("no weights", dir, "no model.safetensors", NULL);

    /* sharded */
    s_specs(&s, &c, ST_F32, false, true);
    s_write_folder(dir, CFG_MIXTRAL, &s, 3, seed, 0);
    s_load_ok("sharded baseline", dir);
    snprintf(p, sizeof p, "%s/model-00002-of-00003.safetensors", dir);
    unlink(p);
    s_load_bad("missing shard", dir, "model.safetensors.index.json", "model-00002-of-00003.safetensors");
    s_write_folder(dir, CFG_MIXTRAL, &s, 3, seed, 0);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    json_t *idx = json_load_file(p, 0, NULL);
    json_t *wm = json_object_get(idx, "weight_map");
    json_object_set_new(wm, "model.norm.weight", json_string("model-00003-of-00003.safetensors"));
    json_dump_file(idx, p, 0);
    s_load_bad("tensor not in its shard", dir, "model.norm.weight", "not in shard");
    json_object_set_new(wm, "model.norm.weight", json_string("../model-00001-of-00003.safetensors"));
    json_dump_file(idx, p, 0);
    s_load_bad("shard outside the folder", dir, "weight_map.model.norm.weight", "file name");
    json_object_del(wm, "model.norm.weight");
    json_dump_file(idx, p, 0);
    s_load_bad("tensor missing from the index", dir, "model.norm.weight", "missing");
    json_decref(idx);
    f = fopen(p, "w");
    fputs("{\"weight_map\": 3}", f);
    fclose(f);
    s_load_bad("bad index", dir, "model.safetensors.index.json", "weight_map");

    /* config problems surface with the config's path */
    s_specs(&s, &c, ST_F32, false, true);
    s_write_folder(dir, "{\"architectures\":[\"MixtralForCausalLM\"],\"num_attention_heads\":0}", &s, 1, seed, 0);
    s_load_bad("bad config", dir, "config.json", "num_attention_heads");
    snprintf(p, sizeof p, "%s/config.json", dir);
    unlink(p);
    s_load_bad("no config", dir, "config.json", NULL);

    /* a config whose sizes disagree with the weights */
    char *big = strdup(CFG_MIXTRAL);
    char *hp = strstr(big, "\"intermediate_size\":16");
    memcpy(hp, "\"intermediate_size\":17", 22);
    s_specs(&s, &c, ST_F32, false, true);
    s_write_folder(dir, big, &s, 1, seed, 0);
    s_load_bad("config/weights disagree", dir, "w1.weight", "expected [17, 32]");
    free(big);

    /* tied model that also saved lm_head, plus an unused rotary buffer: both ignored */
    s_cfg(CFG_QWEN2, &c);
    s_specs(&s, &c, ST_F32, false, true);
    s_add(&s, ST_F32, 1, 8, 0, 0, "model.layers.0.self_attn.rotary_emb.inv_freq");
    s_write_folder(dir, CFG_QWEN2, &s, 1, seed, 0);
    s_load_ok("tied with lm_head saved, extra inv_freq", dir);
}

/* NaN/Inf weights load, with a warning naming the tensor. */
static void test_nonfinite(uint64_t *seed)
{
    static specs_t s;
    model_config_t c;
    char dir[512], p[600], logp[600];
    s_cfg(CFG_OLMOE, &c);
    s_specs(&s, &c, ST_F32, false, true);
    snprintf(dir, sizeof dir, "%s/nan", s_root);
    s_write_folder(dir, CFG_OLMOE, &s, 1, seed, 0);
    /* poke a NaN and an Inf into the first elements of layer 1's k_norm */
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    st_file_t *st;
    strata_errbuf_t eb;
    STRATA_ASSERT(st_open(&st, p, &eb) == 0);
    uint64_t begin = st_find(st, "model.layers.1.self_attn.k_norm.weight")->begin, hl;
    st_close(st);
    FILE *f = fopen(p, "r+b");
    STRATA_ASSERT(fread(&hl, 8, 1, f) == 1);
    long pos = (long)(8 + hl + begin);
    float bad[2] = {NAN, INFINITY};
    fseek(f, pos, SEEK_SET);
    fwrite(bad, 4, 2, f);
    fclose(f);

    snprintf(logp, sizeof logp, "%s/nan.log", s_root);
    fflush(stderr);
    int saved = dup(2), fd = open(logp, O_CREAT | O_TRUNC | O_WRONLY, 0600);
    dup2(fd, 2);
    model_t m;
    int rc = model_load(&m, dir, &eb);
    fflush(stderr);
    dup2(saved, 2);
    close(fd);
    close(saved);
    T_CHECK(rc == 0, "NaN weights: load failed: %s", eb.msg);
    if (rc == 0) {
        T_CHECK(isnan(m.layers[1].k_norm[0]) && isinf(m.layers[1].k_norm[1]), "NaN/Inf values not loaded as is");
        model_free(&m);
    }
    char buf[8192] = {0};
    f = fopen(logp, "r");
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    T_CHECK(strstr(buf, "model.layers.1.self_attn.k_norm.weight") && strstr(buf, "2 NaN/Inf"),
            "no warning naming the tensor; log: %s", buf);
}

/* ---- the reference fixtures ------------------------------------------------------------ */

static int test_fixtures(const char *root)
{
    DIR *d = opendir(root);
    T_CHECK(d != NULL, "fixtures folder %s cannot be opened", root);
    if (!d) return 0;
    int loaded = 0;
    struct dirent *e;
    char names[64][256];
    int nn = 0;
    while ((e = readdir(d)) && nn < 64) {
        if (e->d_name[0] == '.') continue;
        char p[1024];
        snprintf(p, sizeof p, "%.700s/%.255s/config.json", root, e->d_name);
        if (access(p, R_OK) == 0) snprintf(names[nn++], sizeof names[0], "%s", e->d_name);
    }
    closedir(d);
    for (int i = 0; i < nn; i++) {
        char dir[1024], p[1100];
        snprintf(dir, sizeof dir, "%.700s/%.255s", root, names[i]);
        model_t m;
        strata_errbuf_t eb = {{0}};
        int rc = model_load(&m, dir, &eb);
        T_CHECK(rc == 0, "fixture %s: %s", names[i], eb.msg);
        if (rc) continue;
        int mats = s_verify(&m, dir);
        /* ref.json names the architecture transformers ran */
        snprintf(p, sizeof p, "%s/ref.json", dir);
        json_t *ref = json_load_file(p, 0, NULL);
        if (ref) {
            const char *arch = json_string_value(json_object_get(ref, "arch"));
            T_CHECK(arch && !strcmp(arch, m.cfg.arch_name), "fixture %s: ref.json arch %s, loaded %s", names[i],
                    arch ? arch : "?", m.cfg.arch_name);
            json_int_t vs = json_integer_value(json_object_get(ref, "vocab_size"));
            T_CHECK(vs == m.cfg.vocab, "fixture %s: vocab %lld vs %d", names[i], (long long)vs, m.cfg.vocab);
            json_decref(ref);
        }
        fprintf(stderr, "fixture %-24s %-20s %d layers, %d experts, %d matrices checked\n", names[i],
                m.cfg.arch_name, m.cfg.n_layers, m.cfg.n_experts, mats);
        model_free(&m);
        loaded++;
    }
    return loaded;
}

int main(int argc, char **argv)
{
    uint64_t seed = t_seed();
    log_set_level(LOG_ERROR);
    snprintf(s_root, sizeof s_root, "/tmp/strata-test-load-%d", (int)getpid());
    s_mkdir_clean(s_root);
    test_synthetic(&seed);
    test_broken(&seed);
    log_set_level(LOG_WARN);
    test_nonfinite(&seed);
    log_set_level(LOG_ERROR);
    if (argc > 1) {
        int n = test_fixtures(argv[1]);
        fprintf(stderr, "%d fixture folder(s) loaded from %s\n", n, argv[1]);
        /* the reference fixtures are part of the tree: at least one must be there (and
         * STRATA_FIXTURES_MIN can ask for more) */
        const char *min = getenv("STRATA_FIXTURES_MIN");
        int want = min ? atoi(min) : 1;
        T_CHECK(n >= want, "only %d fixture folder(s) in %s, expected at least %d", n, argv[1], want);
    }
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", s_root);
    if (system(cmd)) fprintf(stderr, "cleanup of %s failed\n", s_root);
    return t_done("test_load");
}
