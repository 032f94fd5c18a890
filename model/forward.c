/* forward.c - one step of the model over a batch of tokens (CPU backend, fp32 activations).
 *
 * Per step: embed -> for each layer { h = x + attn(rmsnorm(x)); x = h + ffn(rmsnorm(h)) }
 * -> final rmsnorm -> lm_head for the rows that need logits. Semantics follow HF
 * transformers (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, gpt-oss) in fp32. gpt-oss adds attention
 * sinks, sliding-window layers (a token attends to the last sliding_window positions, itself
 * included), a router bias, expert biases and its clamped SwiGLU.
 *
 * MoE layers group the step's tokens by expert: every expert with at least one routed token
 * runs once over its tokens (inputs gathered contiguous, outputs scatter-added with the gate
 * weight), which is the shape the GPU grouped GEMM shares.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/ops.h"
#include "model/model.h"

struct forward_ctx {
    const model_t *m;
    tpool_t *pool;            /* may be NULL */
    int32_t max_tokens;       /* T: most tokens one step may carry */
    int n_threads;            /* tpool_size(pool), 1 without a pool */
    int32_t max_inter;        /* largest FFN intermediate size over all layers */
    int32_t window;           /* sliding_window when some layer slides, else 0 (batch_t.win_tables unused) */
    /* activations, row-major, fp32 */
    float *x;                 /* [T][hidden] residual stream */
    float *xn;                /* [T][hidden] normed input of the current sublayer */
    float *q;                 /* [T][n_heads*head_dim] */
    float *k;                 /* [T][n_kv_heads*head_dim] */
    float *v;                 /* [T][n_kv_heads*head_dim] */
    float *att;               /* [T][n_heads*head_dim] attention output before wo */
    float *y;                 /* [T][hidden] sublayer output */
    /* MoE routing */
    float *rlog;              /* [T][n_experts] router logits */
    int32_t *top_idx;         /* [T][top_k] chosen experts */
    float *top_w;             /* [T][top_k] their weights */
    int32_t *e_off;           /* [n_experts+1] start of each expert's run in e_tok/e_w */
    int32_t *e_fill;          /* [n_experts] fill cursor while grouping */
    int32_t *e_tok;           /* [T*top_k] token index, grouped by expert, tokens ascending */
    float *e_w;               /* [T*top_k] gate weight of that (token, expert) pair */
    float *xg;                /* [T][hidden] a wave of experts' gathered inputs; also the logit rows */
    float *yp;                /* [T*top_k][hidden] every (token, expert) pair's output, by pair index */
    int8_t *here;             /* [n_experts] this layer's experts that run here */
    float *ffn_scratch;       /* [2*T*max_inter] for cpu_ffn_swiglu(_many) */
    float *sg;                /* [T] shared-expert gate logit */
    int64_t *route_count;     /* [n_layers][n_experts] picks since creation */
    /* attention scratch: one row per thread, att_cap floats each (grown on demand) */
    float *att_scratch;       /* [n_threads][att_cap] */
    int64_t att_cap;
    /* experts computed elsewhere (forward_set_remote), else NULL */
    const moe_remote_t *remote;
    int8_t *posted;           /* [n_dest] the destinations this layer's job went to */
    int32_t *rx_e, *rx_n;     /* [n_experts] a job's experts and their row counts */
    /* read-ahead hints (remote->hint_depth > 0): the next MoE layers' predicted experts */
    float *plog;              /* [T][n_experts] a predicted layer's router logits */
    int32_t *ptop;            /* [T*top_k] its picks */
    float *pw;                /* [top_k] their weights (unused) */
    uint8_t *pset;            /* [hint_depth][n_experts] picked by some token */
    int32_t *player;          /* [hint_depth]: the MoE layer of each row of pset, -1 past the last */
    int32_t *h_layer, *h_expert; /* [FWD_MAX_HINTS] one destination's hints */
    uint64_t steps;           /* model_forward calls: the step id of remote jobs */
};

#define FWD_MAX_HINTS 256 /* hints a job carries at most (store/ring.h RING_MAX_HINTS) */
#define FWD_PINNED_TRIES 20 /* posts again of a job of pinned experts whose prefetcher died or stalled
                             * (each after rows() waited up to its timeout for it: a restart) */

static int32_t s_ffn_inter(const ffn_t *f) { return f->gate.data ? f->gate.rows : 0; }

/* Check the weights the forward pass touches against the config; log what is wrong. */
static int s_check_model(const model_t *m, int32_t *max_inter)
{
    const model_config_t *c = &m->cfg;
    int32_t mi = 0;
    if (c->hidden <= 0 || c->n_layers <= 0 || c->n_heads <= 0 || c->n_kv_heads <= 0 || c->head_dim <= 0 ||
        c->vocab <= 0 || c->n_heads % c->n_kv_heads != 0 || c->n_layers > 256 || c->rot_dim < 0 ||
        c->rot_dim > c->head_dim || c->rot_dim % 2 != 0 || c->rot_dim / 2 > 512) {
        log_error("forward: inconsistent model config (hidden %d layers %d heads %d/%d head_dim %d rot_dim %d)",
                  c->hidden, c->n_layers, c->n_heads, c->n_kv_heads, c->head_dim, c->rot_dim);
        return STRATA_EINVAL_INPUT;
    }
    if (m->embed.rows != c->vocab || m->embed.cols != c->hidden || m->lm_head.rows != c->vocab ||
        m->lm_head.cols != c->hidden || !m->final_norm || !m->layers) {
        log_error("forward: embed/lm_head/final_norm do not match vocab %d hidden %d", c->vocab, c->hidden);
        return STRATA_EINVAL_INPUT;
    }
    int32_t qd = c->n_heads * c->head_dim, kd = c->n_kv_heads * c->head_dim;
    for (int l = 0; l < c->n_layers; l++) {
        const layer_t *L = &m->layers[l];
        if (L->wq.rows != qd || L->wq.cols != c->hidden || L->wk.rows != kd || L->wk.cols != c->hidden ||
            L->wv.rows != kd || L->wv.cols != c->hidden || L->wo.rows != c->hidden || L->wo.cols != qd ||
            !L->attn_norm || !L->ffn_norm || (c->qk_norm != QK_NORM_NONE && (!L->q_norm || !L->k_norm)) ||
            (c->attn_sinks && !L->sinks)) {
            log_error("forward: layer %d attention weights do not match the config", l);
            return STRATA_EINVAL_INPUT;
        }
        if (c->layer_sparse[l]) {
            if (!L->experts || c->n_experts <= 0 || c->top_k <= 0 || c->top_k > c->n_experts ||
                L->router.rows != c->n_experts || L->router.cols != c->hidden || (c->router_bias && !L->router_b) ||
                (c->expert_bias && (!L->egate_b || !L->eup_b || !L->edown_b))) {
                log_error("forward: layer %d MoE weights do not match the config", l);
                return STRATA_EINVAL_INPUT;
            }
            for (int e = 0; e < c->n_experts; e++) {
                int32_t r = s_ffn_inter(&L->experts[e]);
                if (r <= 0) {
                    log_error("forward: layer %d expert %d has no weights", l, e);
                    return STRATA_EINVAL_INPUT;
                }
                if (r > mi) mi = r;
            }
            if (c->shared_inter > 0) {
                if (s_ffn_inter(&L->shared) <= 0 || L->shared_gate.rows != 1 || L->shared_gate.cols != c->hidden) {
                    log_error("forward: layer %d shared expert weights missing", l);
                    return STRATA_EINVAL_INPUT;
                }
                if (s_ffn_inter(&L->shared) > mi) mi = s_ffn_inter(&L->shared);
            }
        } else {
            if (s_ffn_inter(&L->dense) <= 0) {
                log_error("forward: layer %d dense MLP weights missing", l);
                return STRATA_EINVAL_INPUT;
            }
            if (s_ffn_inter(&L->dense) > mi) mi = s_ffn_inter(&L->dense);
        }
    }
    *max_inter = mi;
    return 0;
}

static void *s_alloc(size_t n, size_t size, int *fail)
{
    void *p = calloc(n ? n : 1, size);
    if (!p) *fail = 1;
    return p;
}

/* Scratch buffers for up to max_tokens tokens a step; NULL on bad model or no memory. */
forward_ctx_t *forward_ctx_create(const model_t *m, int32_t max_tokens, tpool_t *pool)
{
    int32_t mi = 0;
    if (max_tokens <= 0 || s_check_model(m, &mi) < 0) return NULL;
    const model_config_t *c = &m->cfg;
    cpu_ops_init();
    forward_ctx_t *f = calloc(1, sizeof(*f));
    if (!f) return NULL;
    f->m = m;
    f->pool = pool;
    f->max_tokens = max_tokens;
    f->n_threads = pool ? tpool_size(pool) : 1;
    if (f->n_threads < 1) f->n_threads = 1;
    f->max_inter = mi;
    f->window = model_sliding_window(c);
    size_t T = (size_t)max_tokens, H = (size_t)c->hidden;
    size_t qd = (size_t)c->n_heads * c->head_dim, kd = (size_t)c->n_kv_heads * c->head_dim;
    size_t ne = c->n_experts > 0 ? (size_t)c->n_experts : 1, tk = c->top_k > 0 ? (size_t)c->top_k : 1;
    int fail = 0;
    f->x = s_alloc(T * H, sizeof(float), &fail);
    f->xn = s_alloc(T * H, sizeof(float), &fail);
    f->q = s_alloc(T * qd, sizeof(float), &fail);
    f->k = s_alloc(T * kd, sizeof(float), &fail);
    f->v = s_alloc(T * kd, sizeof(float), &fail);
    f->att = s_alloc(T * qd, sizeof(float), &fail);
    f->y = s_alloc(T * H, sizeof(float), &fail);
    f->rlog = s_alloc(T * ne, sizeof(float), &fail);
    f->top_idx = s_alloc(T * tk, sizeof(int32_t), &fail);
    f->top_w = s_alloc(T * tk, sizeof(float), &fail);
    f->e_off = s_alloc(ne + 1, sizeof(int32_t), &fail);
    f->e_fill = s_alloc(ne, sizeof(int32_t), &fail);
    f->e_tok = s_alloc(T * tk, sizeof(int32_t), &fail);
    f->e_w = s_alloc(T * tk, sizeof(float), &fail);
    f->xg = s_alloc(T * H, sizeof(float), &fail);
    f->yp = s_alloc(T * tk * H, sizeof(float), &fail);
    f->here = s_alloc(ne, 1, &fail);
    f->ffn_scratch = s_alloc(2 * T * (size_t)mi, sizeof(float), &fail);
    f->sg = s_alloc(T, sizeof(float), &fail);
    f->route_count = s_alloc((size_t)c->n_layers * ne, sizeof(int64_t), &fail);
    if (fail) {
        log_error("forward: out of memory for %d tokens", max_tokens);
        forward_ctx_free(f);
        return NULL;
    }
    return f;
}

/* Free what forward_set_remote allocated, and forget the remote. */
static void s_remote_free(forward_ctx_t *f)
{
    free(f->posted);
    free(f->rx_e);
    free(f->rx_n);
    free(f->plog);
    free(f->ptop);
    free(f->pw);
    free(f->pset);
    free(f->player);
    free(f->h_layer);
    free(f->h_expert);
    f->posted = NULL;
    f->pset = NULL;
    f->rx_e = f->rx_n = f->ptop = f->player = f->h_layer = f->h_expert = NULL;
    f->plog = f->pw = NULL;
    f->remote = NULL;
}

/* Free the scratch buffers (f may be NULL). */
void forward_ctx_free(forward_ctx_t *f)
{
    if (!f) return;
    free(f->x);
    free(f->xn);
    free(f->q);
    free(f->k);
    free(f->v);
    free(f->att);
    free(f->y);
    free(f->rlog);
    free(f->top_idx);
    free(f->route_count);
    free(f->top_w);
    free(f->e_off);
    free(f->e_fill);
    free(f->e_tok);
    free(f->e_w);
    free(f->xg);
    free(f->ffn_scratch);
    free(f->sg);
    free(f->att_scratch);
    free(f->yp);
    free(f->here);
    s_remote_free(f);
    free(f);
}

int forward_set_remote(forward_ctx_t *f, const moe_remote_t *r)
{
    const model_config_t *c = &f->m->cfg;
    s_remote_free(f);
    if (!r || c->n_experts <= 0) return 0;
    int fail = 0;
    size_t ne = (size_t)c->n_experts;
    f->posted = s_alloc(r->n_dest > 0 ? (size_t)r->n_dest : 1, 1, &fail);
    f->rx_e = s_alloc(ne, sizeof(int32_t), &fail);
    f->rx_n = s_alloc(ne, sizeof(int32_t), &fail);
    if (r->hint_depth > 0 && r->hint && r->pinned) {
        f->plog = s_alloc((size_t)f->max_tokens * ne, sizeof(float), &fail);
        f->ptop = s_alloc((size_t)f->max_tokens * (size_t)c->top_k, sizeof(int32_t), &fail);
        f->pw = s_alloc((size_t)c->top_k, sizeof(float), &fail);
        f->pset = s_alloc((size_t)r->hint_depth * ne, 1, &fail);
        f->player = s_alloc((size_t)r->hint_depth, sizeof(int32_t), &fail);
        f->h_layer = s_alloc(FWD_MAX_HINTS, sizeof(int32_t), &fail);
        f->h_expert = s_alloc(FWD_MAX_HINTS, sizeof(int32_t), &fail);
    }
    if (fail) {
        forward_set_remote(f, NULL);
        return -ENOMEM;
    }
    f->remote = r;
    return 0;
}

/* Validate a batch from outside the forward pass (scheduler, CLI) before touching memory. */
static int s_check_batch(const forward_ctx_t *f, const kv_cache_t *kv, const batch_t *b, int64_t *max_ctx)
{
    const model_config_t *c = &f->m->cfg;
    if (b->n_tokens < 0 || b->n_tokens > f->max_tokens) {
        log_error("forward: batch of %d tokens, context holds %d", b->n_tokens, f->max_tokens);
        return STRATA_EINVAL_INPUT;
    }
    if (kv->n_layers != c->n_layers || kv->n_kv_heads != c->n_kv_heads || kv->head_dim != c->head_dim ||
        kv->block_size <= 0 || kv->n_blocks <= 0 || !kv->k || !kv->v) {
        log_error("forward: KV cache geometry does not match the model");
        return STRATA_EINVAL_INPUT;
    }
    if (b->n_tokens > 0 && (!b->tokens || !b->pos || !b->seq || !b->block_tables)) {
        log_error("forward: batch arrays missing");
        return STRATA_EINVAL_INPUT;
    }
    int64_t mc = 0;
    for (int32_t t = 0; t < b->n_tokens; t++) {
        int32_t tok = b->tokens[t], pos = b->pos[t], s = b->seq[t];
        if (tok < 0 || tok >= c->vocab) {
            log_error("forward: token %d at row %d outside vocab %d", tok, t, c->vocab);
            return STRATA_EINVAL_INPUT;
        }
        if (pos < 0 || s < 0 || !b->block_tables[s]) {
            log_error("forward: row %d has position %d, sequence %d", t, pos, s);
            return STRATA_EINVAL_INPUT;
        }
        const int32_t *bt = b->block_tables[s];
        for (int32_t j = 0; j <= pos / kv->block_size; j++) {
            if (bt[j] < 0 || bt[j] >= kv->n_blocks) {
                log_error("forward: row %d (seq %d pos %d) uses block %d of %d", t, s, pos, bt[j], kv->n_blocks);
                return STRATA_EINVAL_INPUT;
            }
        }
        /* the window table's entries from the token's window on (those a sliding layer reads) */
        const int32_t *wt = b->win_tables && f->window > 0 ? b->win_tables[s] : bt;
        if (!wt) {
            log_error("forward: row %d (seq %d) has no window table", t, s);
            return STRATA_EINVAL_INPUT;
        }
        const int32_t w0 = f->window > 0 && pos + 1 > f->window ? pos + 1 - f->window : 0;
        for (int32_t j = w0 / kv->block_size; wt != bt && j <= pos / kv->block_size; j++) {
            if (wt[j] < 0 || wt[j] >= kv->n_blocks) {
                log_error("forward: row %d (seq %d pos %d) uses window block %d of %d", t, s, pos, wt[j], kv->n_blocks);
                return STRATA_EINVAL_INPUT;
            }
        }
        if (pos + 1 > mc) mc = pos + 1;
    }
    if (b->n_logits < 0 || b->n_logits > b->n_tokens || (b->n_logits > 0 && !b->logit_rows)) {
        log_error("forward: %d logit rows for %d tokens", b->n_logits, b->n_tokens);
        return STRATA_EINVAL_INPUT;
    }
    for (int32_t i = 0; i < b->n_logits; i++) {
        if (b->logit_rows[i] < 0 || b->logit_rows[i] >= b->n_tokens) {
            log_error("forward: logit row %d outside the batch of %d", b->logit_rows[i], b->n_tokens);
            return STRATA_EINVAL_INPUT;
        }
    }
    *max_ctx = mc;
    return 0;
}

typedef struct {
    forward_ctx_t *f;
    const kv_cache_t *kv;
    const batch_t *b;
    int layer;
} s_attn_job_t;

/* The block table layer l reads and writes for sequence s: a sliding layer's is the window table
 * when the batch has them. */
static const int32_t *s_table(const model_config_t *c, const batch_t *b, int l, int32_t s)
{
    return b->win_tables && model_layer_window(c, l) > 0 ? b->win_tables[s] : b->block_tables[s];
}

/* Attention for tokens [i0, i1): each attends over 0..pos of its own sequence (the window's
 * positions on a sliding layer). */
static void s_attn_fn(void *ctx, int64_t i0, int64_t i1, int tid)
{
    s_attn_job_t *j = ctx;
    forward_ctx_t *f = j->f;
    const model_config_t *c = &f->m->cfg;
    const kv_cache_t *kv = j->kv;
    STRATA_ASSERT(tid >= 0 && tid < f->n_threads);
    size_t layer_elems = (size_t)kv->n_blocks * kv->n_kv_heads * kv->block_size * kv->head_dim;
    const float *kl = kv->k + (size_t)j->layer * layer_elems;
    const float *vl = kv->v + (size_t)j->layer * layer_elems;
    size_t qd = (size_t)c->n_heads * c->head_dim;
    float scale = 1.0f / sqrtf((float)c->head_dim);
    float *scratch = f->att_scratch + (size_t)tid * (size_t)f->att_cap;
    const int32_t win = model_layer_window(c, j->layer);
    const float *sinks = f->m->layers[j->layer].sinks;
    for (int64_t t = i0; t < i1; t++) {
        const int32_t *bt = s_table(c, j->b, j->layer, j->b->seq[t]);
        int32_t n_ctx = j->b->pos[t] + 1, start = win > 0 && n_ctx > win ? n_ctx - win : 0;
        cpu_attention(f->att + t * qd, f->q + t * qd, kl, vl, bt, start, n_ctx, c->n_heads, c->n_kv_heads,
                      c->head_dim, kv->block_size, scale, sinks, scratch);
    }
}

/* x += attn(rmsnorm(x)) for layer l. */
static void s_attention(forward_ctx_t *f, kv_cache_t *kv, const batch_t *b, int l)
{
    const model_t *m = f->m;
    const model_config_t *c = &m->cfg;
    const layer_t *L = &m->layers[l];
    int n = b->n_tokens, H = c->hidden, hd = c->head_dim;
    int qd = c->n_heads * hd, kd = c->n_kv_heads * hd;

    cpu_rmsnorm(f->xn, f->x, L->attn_norm, n, H, c->rms_eps);
    const cpu_mm_item_t qkv[3] = {{f->q, &L->wq, c->qkv_bias ? L->bq : NULL},
                                  {f->k, &L->wk, c->qkv_bias ? L->bk : NULL},
                                  {f->v, &L->wv, c->qkv_bias ? L->bv : NULL}};
    cpu_matmul_multi(f->pool, f->xn, n, qkv, 3);
    if (c->qk_norm == QK_NORM_HEAD) {
        cpu_rmsnorm(f->q, f->q, L->q_norm, n * c->n_heads, hd, c->rms_eps);
        cpu_rmsnorm(f->k, f->k, L->k_norm, n * c->n_kv_heads, hd, c->rms_eps);
    } else if (c->qk_norm == QK_NORM_FULL) {
        cpu_rmsnorm(f->q, f->q, L->q_norm, n, qd, c->rms_eps);
        cpu_rmsnorm(f->k, f->k, L->k_norm, n, kd, c->rms_eps);
    }
    if (c->rot_dim > 0) {
        cpu_rope(f->q, n, c->n_heads, hd, c->rot_dim, b->pos, c->inv_freq, c->attn_factor);
        cpu_rope(f->k, n, c->n_kv_heads, hd, c->rot_dim, b->pos, c->inv_freq, c->attn_factor);
    }
    /* Every token writes its K/V before any token attends, so a token sees the earlier
     * tokens of its own sequence from this same step (prefill) as well as older steps. */
    size_t layer_elems = (size_t)kv->n_blocks * kv->n_kv_heads * kv->block_size * hd;
    float *kl = kv->k + (size_t)l * layer_elems, *vl = kv->v + (size_t)l * layer_elems;
    for (int t = 0; t < n; t++) {
        int32_t pos = b->pos[t];
        int32_t blk = s_table(c, b, l, b->seq[t])[pos / kv->block_size], off = pos % kv->block_size;
        for (int h = 0; h < c->n_kv_heads; h++) {
            size_t dst = (((size_t)blk * kv->n_kv_heads + h) * kv->block_size + off) * hd;
            memcpy(kl + dst, f->k + (size_t)t * kd + (size_t)h * hd, (size_t)hd * sizeof(float));
            memcpy(vl + dst, f->v + (size_t)t * kd + (size_t)h * hd, (size_t)hd * sizeof(float));
        }
    }
    s_attn_job_t job = {f, kv, b, l};
    tpool_run(f->pool, n, 1, s_attn_fn, &job);
    cpu_matmul(f->pool, f->y, f->att, n, &L->wo, c->o_bias ? L->bo : NULL);
    for (size_t i = 0; i < (size_t)n * H; i++) f->x[i] += f->y[i];
}

/* The normed input rows of pairs [p0, p0 + cnt), one expert's tokens, into dst[cnt][hidden]. */
static void s_gather(const forward_ctx_t *f, float *dst, int32_t p0, int32_t cnt)
{
    size_t H = (size_t)f->m->cfg.hidden;
    for (int32_t i = 0; i < cnt; i++) memcpy(dst + (size_t)i * H, f->xn + (size_t)f->e_tok[p0 + i] * H, H * sizeof(float));
}

cpu_ffn_opts_t forward_expert_opts(const model_t *m, const layer_t *L, int e)
{
    const model_config_t *c = &m->cfg;
    cpu_ffn_opts_t o = {.clamped = c->ffn_act == FFN_ACT_GPT_OSS, .limit = c->act_limit, .alpha = c->act_alpha};
    if (c->expert_bias) {
        o.gate_bias = L->egate_b + (size_t)e * c->moe_inter;
        o.up_bias = L->eup_b + (size_t)e * c->moe_inter;
        o.down_bias = L->edown_b + (size_t)e * c->hidden;
    }
    return o;
}

/* The experts of this layer marked in f->here, each over its tokens, outputs into f->yp at their
 * pair indices (the inputs gathered into f->xg in waves that fit its T rows). */
static void s_run_here(forward_ctx_t *f, const layer_t *L)
{
    const model_config_t *c = &f->m->cfg;
    int H = c->hidden, ne = c->n_experts;
    for (int e = 0; e < ne;) {
        cpu_ffn_item_t items[CPU_FFN_MANY_MAX];
        cpu_ffn_opts_t opts[CPU_FFN_MANY_MAX];
        int ni = 0;
        int32_t rows = 0;
        for (; e < ne && ni < CPU_FFN_MANY_MAX; e++) {
            int32_t p0 = f->e_off[e], cnt = f->e_off[e + 1] - p0;
            if (cnt == 0 || !f->here[e]) continue;
            if (rows + cnt > f->max_tokens) break; /* the next wave */
            s_gather(f, f->xg + (size_t)rows * H, p0, cnt);
            const ffn_t *E = &L->experts[e];
            const bool ex = c->expert_bias || c->ffn_act != FFN_ACT_SILU;
            if (ex) opts[ni] = forward_expert_opts(f->m, L, e);
            items[ni] = (cpu_ffn_item_t){.x = f->xg + (size_t)rows * H, .out = f->yp + (size_t)p0 * H, .n = cnt,
                                         .gate = &E->gate, .up = &E->up, .down = &E->down,
                                         .opts = ex ? &opts[ni] : NULL};
            ni++;
            rows += cnt;
        }
        if (ni) cpu_ffn_swiglu_many(f->pool, items, ni, f->ffn_scratch);
    }
}

/* y += every pair's output times its gate weight, pairs in expert order (f->yp by pair index). */
static void s_combine(forward_ctx_t *f, int n)
{
    int H = f->m->cfg.hidden, tk = f->m->cfg.top_k;
    for (int32_t p = 0; p < n * tk; p++) {
        float w = f->e_w[p];
        float *dst = f->y + (size_t)f->e_tok[p] * H;
        const float *src = f->yp + (size_t)p * H;
        for (int d = 0; d < H; d++) dst[d] += w * src[d];
    }
}

/* The experts that the routers of the next remote->hint_depth MoE layers pick for this layer's
 * n normed rows (f->xn): pset, layer by layer (player). */
static void s_predict(forward_ctx_t *f, int l, int n)
{
    const model_config_t *c = &f->m->cfg;
    const int ne = c->n_experts, tk = c->top_k, depth = f->remote->hint_depth;
    memset(f->pset, 0, (size_t)depth * ne);
    int l2 = l;
    for (int d = 0; d < depth; d++) {
        do l2++;
        while (l2 < c->n_layers && !c->layer_sparse[l2]);
        f->player[d] = l2 < c->n_layers ? l2 : -1;
        if (f->player[d] < 0) continue;
        const layer_t *L2 = &f->m->layers[l2];
        cpu_matmul(f->pool, f->plog, f->xn, n, &L2->router, L2->router_b);
        for (int t = 0; t < n; t++) {
            int32_t *idx = f->ptop + (size_t)t * tk;
            cpu_gate_topk(f->plog + (size_t)t * ne, ne, tk, false, idx, f->pw);
            for (int i = 0; i < tk; i++) f->pset[(size_t)d * ne + idx[i]] = 1;
        }
    }
}

/* Hand destination d the predicted experts (s_predict) that are pinned to it, nearest layer first. */
static void s_hint(forward_ctx_t *f, int d)
{
    const moe_remote_t *r = f->remote;
    const int ne = f->m->cfg.n_experts;
    int n = 0;
    for (int k = 0; k < r->hint_depth && n < FWD_MAX_HINTS; k++) {
        int l2 = f->player[k];
        if (l2 < 0) break;
        for (int e = 0; e < ne && n < FWD_MAX_HINTS; e++) {
            size_t at = (size_t)l2 * ne + e;
            if (!f->pset[(size_t)k * ne + e] || r->owner[at] != d || !r->pinned[at]) continue;
            f->h_layer[n] = l2;
            f->h_expert[n++] = e;
        }
    }
    if (n) r->hint(r->ctx, d, f->h_layer, f->h_expert, n);
}

/* Gather destination d's rows of layer l into its ring and post its job (with its read-ahead
 * hints when ahead): 1 posted, 0 not (no expert of d here, or d is down). */
static int s_post_dest(forward_ctx_t *f, int l, int d, bool ahead)
{
    const moe_remote_t *r = f->remote;
    const int H = f->m->cfg.hidden, ne = f->m->cfg.n_experts;
    const int8_t *own = r->owner + (size_t)l * ne;
    float *rows = NULL;
    int ni = 0;
    int32_t row = 0;
    for (int e = 0; e < ne; e++) {
        int32_t p0 = f->e_off[e], cnt = f->e_off[e + 1] - p0;
        if (own[e] != d || cnt == 0) continue;
        if (!rows && !(rows = r->rows(r->ctx, d))) return 0; /* down */
        s_gather(f, rows + (size_t)row * H, p0, cnt);
        f->rx_e[ni] = e;
        f->rx_n[ni++] = cnt;
        row += cnt;
    }
    if (!ni) return 0;
    if (ahead) s_hint(f, d);
    return r->post(r->ctx, d, l, f->rx_e, f->rx_n, ni, f->steps) == 0;
}

/* Whether layer l has tokens for an expert pinned to destination d. */
static bool s_has_pinned(const forward_ctx_t *f, int l, int d)
{
    const moe_remote_t *r = f->remote;
    const int ne = f->m->cfg.n_experts;
    for (int e = 0; e < ne && r->pinned; e++) {
        size_t at = (size_t)l * ne + e;
        if (r->owner[at] == d && r->pinned[at] && f->e_off[e + 1] > f->e_off[e]) return true;
    }
    return false;
}

/* s_moe's experts with some computed elsewhere (f->remote): each destination's experts are
 * posted first (their tokens' rows gathered into its ring), this process's run meanwhile, then
 * every destination is waited for; one that is down or fails has its experts run here, unless
 * one of them is pinned to it (r->pinned: a disk tier, whose bytes only it can read): then the
 * job is posted again while the destination comes back from a death or a stall, and fails the
 * step if it does not or the job fails by itself. Every pair's output lands at its pair index in
 * f->yp, and the outputs are added in expert order, so y is bit for bit what the all-local path
 * gives when the kernels agree (same ISA and activation mode: a token's FFN output does not
 * depend on the tokens beside it). 0, or <0 (pinned experts that could not run). */
static int s_moe_remote(forward_ctx_t *f, const layer_t *L, int l, int n_tok)
{
    const moe_remote_t *r = f->remote;
    const model_config_t *c = &f->m->cfg;
    int H = c->hidden, ne = c->n_experts;
    const int8_t *own = r->owner + (size_t)l * ne;
    int rc = 0;
    const bool ahead = f->pset && r->pinned;
    if (ahead) s_predict(f, l, n_tok);
    for (int e = 0; e < ne; e++) f->here[e] = own[e] < 0;
    bool pinned_to[r->n_dest > 0 ? r->n_dest : 1]; /* d has tokens for experts pinned to it */
    for (int d = 0; d < r->n_dest; d++) pinned_to[d] = s_has_pinned(f, l, d);
    for (int d = 0; d < r->n_dest; d++) {
        f->posted[d] = (int8_t)s_post_dest(f, l, d, ahead);
        const bool pinned = pinned_to[d];
        for (int tries = 0; pinned && !f->posted[d] && tries < FWD_PINNED_TRIES; tries++)
            f->posted[d] = (int8_t)s_post_dest(f, l, d, ahead); /* down: rows() waits for it each time */
        if (f->posted[d]) continue;
        if (pinned) rc = STRATA_EIO; /* still down */
        else
            for (int e = 0; e < ne; e++) f->here[e] |= own[e] == d;
    }
    s_run_here(f, L);
    for (int d = 0; d < r->n_dest; d++) {
        if (!f->posted[d]) continue;
        const float *out = NULL;
        int wrc = r->wait(r->ctx, d, &out);
        const bool pinned = pinned_to[d];
        /* pinned experts run nowhere else: a prefetcher that died or stalled meanwhile (not a job
         * that failed by itself) gets the job again once it is back (rows() waits for it) */
        for (int tries = 0; wrc < 0 && pinned && r->retry && r->retry(r->ctx, d) && tries < FWD_PINNED_TRIES; tries++) {
            wrc = STRATA_EIO;
            if (s_post_dest(f, l, d, false)) wrc = r->wait(r->ctx, d, &out);
        }
        if (wrc == 0) {
            size_t row = 0;
            for (int e = 0; e < ne; e++) {
                int32_t p0 = f->e_off[e], cnt = f->e_off[e + 1] - p0;
                if (own[e] != d || cnt == 0) continue;
                memcpy(f->yp + (size_t)p0 * H, out + row * H, (size_t)cnt * H * sizeof(float));
                row += (size_t)cnt;
            }
            continue;
        }
        if (pinned) {
            if (rc == 0) rc = wrc;
            continue;
        }
        for (int e = 0; e < ne; e++) f->here[e] = own[e] == d;
        s_run_here(f, L);
    }
    return rc;
}

/* y = sum over routed experts of w * expert(xn) (+ the gated shared expert), grouped by expert.
 * 0, or <0 when experts pinned to a prefetcher could not run (s_moe_remote). */
static int s_moe(forward_ctx_t *f, int l, int n)
{
    const layer_t *L = &f->m->layers[l];
    const model_config_t *c = &f->m->cfg;
    int H = c->hidden, ne = c->n_experts, tk = c->top_k;
    /* Mixtral always renormalises its top-k weights (HF MixtralSparseMoeBlock). */
    bool renorm = c->norm_topk || c->arch == ARCH_MIXTRAL;

    /* the router, and Qwen2-MoE's shared-expert gate, in one dispatch */
    const cpu_mm_item_t rg[2] = {{f->rlog, &L->router, L->router_b}, {f->sg, &L->shared_gate, NULL}};
    cpu_matmul_multi(f->pool, f->xn, n, rg, c->shared_inter > 0 ? 2 : 1);
    memset(f->e_off, 0, (size_t)(ne + 1) * sizeof(int32_t));
    for (int t = 0; t < n; t++) {
        int32_t *idx = f->top_idx + (size_t)t * tk;
        cpu_gate_topk(f->rlog + (size_t)t * ne, ne, tk, renorm, idx, f->top_w + (size_t)t * tk);
        for (int i = 0; i < tk; i++) {
            STRATA_ASSERT(idx[i] >= 0 && idx[i] < ne);
            f->e_off[idx[i] + 1]++;
            f->route_count[(size_t)l * ne + idx[i]]++;
        }
    }
    for (int e = 0; e < ne; e++) {
        f->e_off[e + 1] += f->e_off[e];
        f->e_fill[e] = f->e_off[e];
    }
    for (int t = 0; t < n; t++) {
        for (int i = 0; i < tk; i++) {
            int32_t e = f->top_idx[(size_t)t * tk + i];
            int32_t p = f->e_fill[e]++;
            f->e_tok[p] = t;
            f->e_w[p] = f->top_w[(size_t)t * tk + i];
        }
    }
    memset(f->y, 0, (size_t)n * H * sizeof(float));
    /* Every active expert over its tokens, its outputs at their pair indices, then added in
     * expert order, as one expert at a time would. */
    if (f->remote) {
        int rc = s_moe_remote(f, L, l, n);
        if (rc < 0) return rc;
    } else {
        memset(f->here, 1, (size_t)ne);
        s_run_here(f, L);
    }
    s_combine(f, n);
    if (c->shared_inter > 0) {
        /* Qwen2-MoE: + sigmoid(x @ shared_gate^T) * shared_ffn(x) */
        for (int t = 0; t < n; t++) f->sg[t] = 1.0f / (1.0f + expf(-f->sg[t]));
        cpu_ffn_swiglu(f->pool, f->y, f->xn, n, &L->shared.gate, &L->shared.up, &L->shared.down, NULL,
                       f->ffn_scratch, f->sg, true);
    }
    return 0;
}

/* x += ffn(rmsnorm(x)) for layer l (MoE or dense). 0 or <0 (s_moe). */
static int s_ffn(forward_ctx_t *f, int l, int n)
{
    const model_config_t *c = &f->m->cfg;
    const layer_t *L = &f->m->layers[l];
    int H = c->hidden;
    cpu_rmsnorm(f->xn, f->x, L->ffn_norm, n, H, c->rms_eps);
    if (c->layer_sparse[l]) {
        int rc = s_moe(f, l, n);
        if (rc < 0) return rc;
    } else {
        cpu_ffn_swiglu(f->pool, f->y, f->xn, n, &L->dense.gate, &L->dense.up, &L->dense.down, NULL, f->ffn_scratch,
                       NULL, false);
    }
    for (size_t i = 0; i < (size_t)n * H; i++) f->x[i] += f->y[i];
    return 0;
}

const int64_t *forward_route_counts(const forward_ctx_t *f) { return f->route_count; }

/* Run one step over b, writing K/V into kv and logits[n_logits][vocab]. Returns 0 or <0. */
int model_forward(forward_ctx_t *f, kv_cache_t *kv, const batch_t *b, float *logits)
{
    int rc = 0;
    int64_t max_ctx = 0;
    if ((rc = s_check_batch(f, kv, b, &max_ctx)) < 0) return rc; /* logged what was wrong */
    if (b->n_tokens == 0) return 0;
    if (b->n_logits > 0 && !logits) return STRATA_EINVAL_INPUT;
    f->steps++;
    const model_t *m = f->m;
    const model_config_t *c = &m->cfg;
    int n = b->n_tokens, H = c->hidden;

    if (max_ctx > f->att_cap) {
        /* grow the per-thread attention scratch to the longest context of this step */
        int64_t cap = f->att_cap ? f->att_cap : 256;
        while (cap < max_ctx) cap *= 2;
        float *p = realloc(f->att_scratch, (size_t)cap * (size_t)f->n_threads * sizeof(float));
        if (!p) {
            rc = STRATA_ENOMEM;
            goto fail;
        }
        f->att_scratch = p;
        f->att_cap = cap;
    }
    for (int t = 0; t < n; t++) qmat_dequant_row(&m->embed, b->tokens[t], f->x + (size_t)t * H);
    for (int l = 0; l < c->n_layers; l++) {
        s_attention(f, kv, b, l);
        if ((rc = s_ffn(f, l, n)) < 0) goto fail;
    }
    if (b->n_logits > 0) {
        for (int i = 0; i < b->n_logits; i++)
            memcpy(f->xg + (size_t)i * H, f->x + (size_t)b->logit_rows[i] * H, (size_t)H * sizeof(float));
        cpu_rmsnorm(f->xg, f->xg, m->final_norm, b->n_logits, H, c->rms_eps);
        cpu_matmul(f->pool, logits, f->xg, b->n_logits, &m->lm_head, NULL);
    }
    return 0;
fail:
    return rc;
}
