/* synth.c - random models with real shapes (see synth.h). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/synth.h"

/* Fill c for arch with the given shapes; see synth.h. */
void synth_config(model_config_t *c, arch_t arch, int32_t vocab, int32_t hidden, int32_t n_layers, int32_t n_heads,
                  int32_t n_kv_heads, int32_t head_dim, int32_t n_experts, int32_t top_k, int32_t moe_inter)
{
    static const char *const names[] = {"MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM",
                                        "OlmoeForCausalLM", "GptOssForCausalLM"};
    memset(c, 0, sizeof(*c));
    c->arch = arch;
    strncpy(c->arch_name, names[arch], sizeof(c->arch_name) - 1);
    c->vocab = vocab;
    c->hidden = hidden;
    c->n_layers = n_layers;
    c->n_heads = n_heads;
    c->n_kv_heads = n_kv_heads;
    c->head_dim = head_dim;
    c->max_pos = 4096;
    c->rms_eps = 1e-6f;
    c->rope_theta = 10000.0f;
    c->rot_dim = head_dim;
    c->attn_factor = 1.0f;
    c->n_experts = n_experts;
    c->top_k = top_k;
    c->moe_inter = moe_inter;
    c->dense_inter = 2 * moe_inter;
    c->bos_id = -1;
    c->eos_id = -1;
    for (int l = 0; l < n_layers && l < 256; l++) c->layer_sparse[l] = true;
    switch (arch) {
    case ARCH_MIXTRAL: c->norm_topk = true; break;
    case ARCH_QWEN2_MOE:
        c->qkv_bias = true;
        c->shared_inter = 2 * moe_inter;
        break;
    case ARCH_QWEN3_MOE:
        c->qk_norm = QK_NORM_HEAD;
        c->norm_topk = true;
        break;
    case ARCH_OLMOE: c->qk_norm = QK_NORM_FULL; break;
    case ARCH_GPT_OSS:
        c->qkv_bias = c->o_bias = true;
        c->attn_sinks = true;
        c->norm_topk = true;
        c->router_bias = c->expert_bias = true;
        c->ffn_act = FFN_ACT_GPT_OSS;
        c->act_limit = 7.0f;
        c->act_alpha = 1.702f;
        c->sliding_window = 128; /* GptOssConfig: even layers slide over 128 tokens */
        for (int l = 0; l < n_layers && l < 256; l += 2) c->layer_sliding[l] = true;
        break;
    }
    synth_config_rope(c);
}

/* HF default rope: inv_freq[i] = theta^(-2i/rot_dim). */
void synth_config_rope(model_config_t *c)
{
    for (int i = 0; i < c->rot_dim / 2 && i < 512; i++)
        c->inv_freq[i] = (float)(1.0 / pow((double)c->rope_theta, 2.0 * i / c->rot_dim));
}

typedef struct {
    model_t *m;
    uint64_t rng;
    float *tmp; /* [tmp_n] fp32 staging for one matrix */
    size_t tmp_n;
    int fail;   /* first error */
} s_gen_t;

/* Uniform in [-1, 1). */
static float s_uni(uint64_t *s) { return (float)((double)(strata_splitmix64(s) >> 11) * 0x1.0p-52 - 1.0); }

static void *s_own(s_gen_t *g, size_t bytes)
{
    if (g->fail) return NULL;
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p || model_own_buffer(g->m, p) < 0) {
        free(p);
        g->fail = STRATA_ENOMEM;
        return NULL;
    }
    return p;
}

/* A vector of `n` values center + spread * U(-1,1). */
static float *s_vec(s_gen_t *g, int32_t n, float center, float spread)
{
    float *v = s_own(g, (size_t)n * sizeof(float));
    if (!v) return NULL;
    for (int32_t i = 0; i < n; i++) v[i] = center + spread * s_uni(&g->rng);
    return v;
}

/* A rows x cols matrix, U(-1,1) * scale, stored in fmt. */
static void s_mat(s_gen_t *g, qmat_t *q, wfmt_t fmt, int group, int32_t rows, int32_t cols, float scale)
{
    memset(q, 0, sizeof(*q));
    if (g->fail) return;
    size_t n = (size_t)rows * cols;
    if (n > g->tmp_n) {
        float *t = realloc(g->tmp, n * sizeof(float));
        if (!t) {
            g->fail = STRATA_ENOMEM;
            return;
        }
        g->tmp = t;
        g->tmp_n = n;
    }
    for (size_t i = 0; i < n; i++) g->tmp[i] = scale * s_uni(&g->rng);
    if (fmt == WF_MXFP4) group = 32;
    else if (fmt != WF_INT4) group = 0;
    void *data = s_own(g, qmat_data_bytes(fmt, rows, cols));
    size_t sb = qmat_scale_bytes(fmt, rows, cols, group);
    void *scales = sb ? s_own(g, sb) : NULL;
    if (g->fail) return;
    int rc = qmat_quantize(fmt, group, g->tmp, rows, cols, data, scales);
    if (rc < 0) {
        g->fail = rc;
        return;
    }
    q->fmt = fmt;
    q->rows = rows;
    q->cols = cols;
    q->group = group;
    q->data = data;
    q->scales = scales;
}

static void s_ffn(s_gen_t *g, ffn_t *f, wfmt_t fmt, int group, int32_t hidden, int32_t inter)
{
    s_mat(g, &f->gate, fmt, group, inter, hidden, 1.0f / sqrtf((float)hidden));
    s_mat(g, &f->up, fmt, group, inter, hidden, 1.0f / sqrtf((float)hidden));
    s_mat(g, &f->down, fmt, group, hidden, inter, 1.0f / sqrtf((float)inter));
}

/* Random weights for c; see synth.h. */
int synth_model(model_t *m, const model_config_t *c, wfmt_t fmt, int group, uint64_t seed)
{
    memset(m, 0, sizeof(*m));
    if (c->n_layers <= 0 || c->n_layers > 256 || c->hidden <= 0 || c->vocab <= 0) return STRATA_EINVAL_INPUT;
    m->cfg = *c;
    s_gen_t g = {m, seed ^ 0x5EED5EED5EEDull, NULL, 0, 0};
    int32_t H = c->hidden, qd = c->n_heads * c->head_dim, kd = c->n_kv_heads * c->head_dim;
    float sh = 1.0f / sqrtf((float)H);
    wfmt_t efmt = fmt == WF_F32 ? WF_F32 : WF_BF16;

    s_mat(&g, &m->embed, efmt, 0, c->vocab, H, 1.0f);
    m->final_norm = s_vec(&g, H, 1.0f, 0.1f);
    s_mat(&g, &m->lm_head, fmt, group, c->vocab, H, sh);
    m->layers = s_own(&g, (size_t)c->n_layers * sizeof(layer_t));
    for (int l = 0; l < c->n_layers && !g.fail; l++) {
        layer_t *L = &m->layers[l];
        L->attn_norm = s_vec(&g, H, 1.0f, 0.1f);
        L->ffn_norm = s_vec(&g, H, 1.0f, 0.1f);
        s_mat(&g, &L->wq, fmt, group, qd, H, sh);
        s_mat(&g, &L->wk, fmt, group, kd, H, sh);
        s_mat(&g, &L->wv, fmt, group, kd, H, sh);
        s_mat(&g, &L->wo, fmt, group, H, qd, 1.0f / sqrtf((float)qd));
        if (c->qkv_bias) {
            L->bq = s_vec(&g, qd, 0.0f, 0.5f);
            L->bk = s_vec(&g, kd, 0.0f, 0.5f);
            L->bv = s_vec(&g, kd, 0.0f, 0.5f);
        }
        if (c->o_bias) L->bo = s_vec(&g, H, 0.0f, 0.1f);
        if (c->qk_norm == QK_NORM_HEAD) {
            L->q_norm = s_vec(&g, c->head_dim, 1.0f, 0.1f);
            L->k_norm = s_vec(&g, c->head_dim, 1.0f, 0.1f);
        } else if (c->qk_norm == QK_NORM_FULL) {
            L->q_norm = s_vec(&g, qd, 1.0f, 0.1f);
            L->k_norm = s_vec(&g, kd, 1.0f, 0.1f);
        }
        if (c->attn_sinks) L->sinks = s_vec(&g, c->n_heads, 0.0f, 1.0f);
        if (c->layer_sparse[l]) {
            const int32_t E = c->n_experts, I = c->moe_inter;
            s_mat(&g, &L->router, WF_F32, 0, E, H, 2.0f * sh);
            if (c->router_bias) L->router_b = s_vec(&g, E, 0.0f, 0.1f);
            if (c->expert_bias) {
                L->egate_b = s_vec(&g, E * I, 0.0f, 0.1f);
                L->eup_b = s_vec(&g, E * I, 0.0f, 0.1f);
                L->edown_b = s_vec(&g, E * H, 0.0f, 0.1f);
            }
            L->experts = s_own(&g, (size_t)E * sizeof(ffn_t));
            for (int e = 0; e < E && !g.fail; e++) s_ffn(&g, &L->experts[e], fmt, group, H, I);
            if (c->shared_inter > 0) {
                s_ffn(&g, &L->shared, fmt, group, H, c->shared_inter);
                s_mat(&g, &L->shared_gate, WF_F32, 0, 1, H, sh);
            }
        } else {
            s_ffn(&g, &L->dense, fmt, group, H, c->dense_inter);
        }
    }
    free(g.tmp);
    if (g.fail) {
        model_free(m);
        return g.fail;
    }
    return 0;
}
