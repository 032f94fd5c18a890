/* gpu_step.c - one step of the model on one GPU: the launches of attention, FFN and MoE, the
 * segments and their CUDA graphs, the mailboxes, the waits for routing and prediction, staging,
 * and steps ahead and chained steps; gpu_forward*, gpu_step_ahead, gpu_ahead_progress,
 * gpu_set_next.
 *
 * It decides when the host places a layer's experts and when it prefetches, never how: a slot,
 * a copy into one and a miss are gpu_slots.c's (gslots_ensure, gslots_issue), and the layout and
 * the sizes of everything are gpu_model.c's. Of the cache's policy (store/xcache.h) it sets only
 * a step's pinned layers and each layer's prediction. It allocates nothing but the embedding
 * threads.
 *
 * A step is one CUDA graph per decode size when every expert is resident. With fewer slots
 * than experts it is n_moe + 1 segments, each a graph too (s_segment): segment k ends with MoE
 * layer k's gate, and with the gates of the next prefetch_depth MoE layers applied to the
 * same hidden state (one GEMV over those layers' routers stacked, their ffn_norm folded in, on
 * the hidden state normalized once), both written to pinned host memory by the router's launch
 * itself. The window skips the layers whose experts are pinned (s_window_lo). Between
 * segments the host waits for the routing's picks to land (s_route: not for the stream, so the
 * prediction still running does not delay it), makes the routed experts resident, sends the
 * words of the layer's expert table that changed (gslots_ensure) and enqueues the next segment
 * (or, a prelaunched step, whose next segment is enqueued already, fills its mailbox: s_run);
 * then it waits for the prediction's picks (s_predict) and starts copies of predicted experts
 * that are not resident (gslots_issue). That the host may then overwrite a slot is the
 * eviction safety gpu_slots.c describes, which rests on this order of segments and mailboxes.
 *
 * In a step whose segments end waiting for a mailbox (split experts, up to GPU_HOST_READ_ROWS
 * tokens: s_mailbox), a MoE layer's experts run in two parts around the wait (s_early): the
 * heads (gate, up and down's resident rows) right after the gate, while the host places the
 * tails, and only the tails' rows of down and the combine after it.
 *
 * A sampled or greedy step that knows the step expected next (gpu_set_next: the executor's
 * guess, one more row of each sequence taking its pick) starts it behind itself on the stream
 * before the host has the picks (s_picks): its positions and block tables go up as a kernel's
 * parameters, its rows are looked up on the GPU in the embedding page-locked in host memory,
 * and its first segments are enqueued; the picks come back on a copy stream. The next plan, if
 * it is the guess, goes on from there (a chained step); else it is let go like any step ahead.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "model/gpu_int.h"

/* a step of this many rows or more embeds them in GPU_EMBED_THREADS host threads */
#define GPU_EMBED_POOL_ROWS 64
#define GPU_EMBED_THREADS 4
/* segments a prelaunched step keeps enqueued beyond the one the host routes (s_advance) */
#define GPU_LEAD 1

static int s_attention(gpu_model_t *g, int l, int n)
{
    const model_config_t *c = &g->m->cfg;
    const glayer_t *L = &g->L[l];
    cuda_ctx_t *cx = g->cx;
    int hd = c->head_dim, qd = c->n_heads * hd, kd = c->n_kv_heads * hd, rc;
    /* the norm and the attention also leave their outputs' int8 rows for the projections */
    bool xq = g->pre_attn_q8, aq = false;
    if (!g->pre_attn && (rc = cuda_rmsnorm_q8(cx, g->xn, g->x, L->attn_norm, n, c->hidden, c->rms_eps, &xq)))
        return rc;
    g->pre_attn = false;
    {
        float *ys[3] = {g->q, g->k, g->v};
        const qmat_t *ws[3] = {&L->wq, &L->wk, &L->wv};
        const float *bs[3] = {L->bq, L->bk, L->bv};
        if ((rc = cuda_matmul_ex(cx, 3, ys, g->xn, n, ws, bs, false, xq))) return rc;
    }
    /* per-head q/k norms run inside cuda_rope_kv; whole-row ones (OLMoE) here */
    if (c->qk_norm == QK_NORM_FULL) {
        if ((rc = cuda_rmsnorm(cx, g->q, g->q, L->q_norm, n, qd, c->rms_eps))) return rc;
        if ((rc = cuda_rmsnorm(cx, g->k, g->k, L->k_norm, n, kd, c->rms_eps))) return rc;
    }
    float *kl = g->k_cache + (size_t)l * g->layer_elems, *vl = g->v_cache + (size_t)l * g->layer_elems;
    bool head_norm = c->qk_norm == QK_NORM_HEAD;
    /* a sliding layer's K/V go through the sequences' window tables */
    const int32_t window = model_layer_window(c, l);
    const int32_t *bt = window > 0 ? g->d_bt + g->o.kv_blocks : g->d_bt;
    if ((rc = cuda_rope_kv(cx, g->q, g->k, g->v, n, c->n_heads, c->n_kv_heads, hd, c->rot_dim, g->d_pos, g->inv_freq,
                           c->attn_factor, head_norm ? L->q_norm : NULL, head_norm ? L->k_norm : NULL, c->rms_eps, kl,
                           vl, g->d_seq, bt, g->bt_stride, g->o.block_size)))
        return rc;
    const float scale = 1.0f / sqrtf((float)hd);
    /* gpt-oss: sinks, and a window on the sliding layers */
    const cuda_attn_opts_t ao = {window, L->sinks};
    const cuda_attn_opts_t *aop = ao.window > 0 || ao.sinks ? &ao : NULL;
    rc = g->att_tc ? cuda_attention_prefill_ex(cx, g->att, g->q, kl, vl, n, g->d_seq, g->d_pos, bt, g->bt_stride,
                                               c->n_heads, c->n_kv_heads, hd, g->o.block_size, scale, aop)
                   : STRATA_EINVAL_INPUT;
    if (rc == STRATA_EINVAL_INPUT) /* not taken, or a shape it does not take */
        rc = cuda_attention_ex(cx, g->att, g->q, kl, vl, n, g->d_seq, g->d_pos, bt, g->bt_stride, c->n_heads,
                               c->n_kv_heads, hd, g->o.block_size, scale, &aq, aop);
    if (rc) return rc;
    const qmat_t *wo = &L->wo;
    const float *bo = L->bo;
    return cuda_matmul_ex(cx, 1, &g->x, g->att, n, &wo, &bo, true, aq);
}

/* The first MoE ordinal of MoE layer l's prediction window: the next MoE layer whose experts
 * are not pinned (xcache_pin): no copy is needed for the pinned ones, so the window looks past
 * them. */
static int s_window_lo(const gpu_model_t *g, int l)
{
    int lo = g->xc.moe_ord[l] + 1;
    while (lo < g->xc.n_moe && g->xc.pinned[lo]) lo++;
    return lo;
}

/* Prediction window of MoE layer l: from s_window_lo on, the MoE layers up to the depth-th one
 * that is not pinned (the pinned ones among them cost a row of the prediction each, nothing
 * else), at most pred_cap (0 without a cache or prediction). */
static int s_window(const gpu_model_t *g, int l)
{
    if (g->all_resident || !g->pred_router) return 0;
    const int lo = s_window_lo(g, l);
    int D = 0;
    for (int left = g->depth; left > 0 && lo + D < g->xc.n_moe && D < g->pred_cap; D++) left -= !g->xc.pinned[lo + D];
    return D;
}

/* Whether the segments of a step of n tokens end waiting for their mailbox (cuda_wait_patch),
 * and so can be prelaunched (s_run): split experts at host-read sizes, where every routed tail
 * is resident, landing on a copy stream, or read from host memory, so no copy has to go on the
 * compute stream between segments. */
static bool s_mailbox(const gpu_model_t *g, int n) { return g->split && n <= GPU_HOST_READ_ROWS; }

/* Whether the experts read fp32 rows (cuda_moe_opts_t.f32_act), which take no parts: MXFP4's,
 * whose int8 rows put gpt-oss's fixtures 5e-2 off their logits. */
static bool s_f32_rows(const gpu_model_t *g) { return g->expert_fmt == WF_MXFP4; }

/* Whether a step of n tokens computes each MoE layer's experts in two parts around the wait for
 * its mailbox (cuda_moe_ffn_part): the heads, resident, while the routed tails are still on their
 * way, then the tails' rows of down once the host has placed them. A split expert's entry keeps
 * its head's words; only down_tail's change. */
static bool s_early(const gpu_model_t *g, int n)
{
    return s_mailbox(g, n) && !s_f32_rows(g) && cuda_moe_parts_ok(n, g->expert_fmt, g->m->cfg.hidden, g->inter);
}

/* First half of the FFN of layer l: the norm, and for a MoE layer its gate; with a cache, also
 * the prediction of the next layers' gates and the copies of both to the host (not waited on). */
static int s_ffn_pre(gpu_model_t *g, int l, int n)
{
    const model_config_t *c = &g->m->cfg;
    const glayer_t *L = &g->L[l];
    cuda_ctx_t *cx = g->cx;
    int rc;
    /* xn's int8 rows stay in the workspace for the experts (ffn_post): the router and the
     * prediction below are fp32 matmuls, or an integer router that writes the same rows */
    g->routed = false;
    if (!c->layer_sparse[l]) return cuda_rmsnorm_q8(cx, g->xn, g->x, L->ffn_norm, n, c->hidden, c->rms_eps, &g->xn_q8);
    /* the norm, the gate and the routing of its pairs in one launch where the router can */
    bool renorm = c->norm_topk || c->arch == ARCH_MIXTRAL;
    cuda_next_norm_t pre = {L->ffn_norm, g->xn, c->rms_eps, &g->xn_q8};
    cuda_route_into_t route = {g->moe_scr, g->inter, &g->routed};
    /* with a cache, the host gets the routing (and below the prediction) from the launch
     * itself, in h_idx (h_pidx), in the ring entry of the segment this gate ends */
    const size_t ri = g->all_resident ? 0 : (size_t)(g->xc.moe_ord[l] % GPU_RING);
    if ((rc = cuda_router_topk(cx, g->rlog, g->x, n, &L->router, L->router_b, c->n_experts, c->top_k, renorm, g->tidx,
                               g->tw, &pre,
                               &route, g->all_resident ? NULL : g->h_idx + ri * g->idx_n)))
        return rc;
    if (g->all_resident) return 0;
    if (gcpu_step(g, n) && (rc = cuda_put_host(cx, g->h_xn, g->xn, (size_t)n * c->hidden, g->h_tw, g->tw, (size_t)n * c->top_k,
                                                g->h_xflag + ri * 8)))
        return rc; /* the CPU experts' inputs to the host (gpu_cpu.c), ahead of the prediction */
    int D = s_window(g, l);
    if (D > 0) {
        /* the next D MoE layers' gates on this hidden state (normalized once, their ffn_norm
         * folded into the stacked routers) predict what they will route to */
        qmat_t w = {.fmt = WF_F32, .rows = D * c->n_experts, .cols = c->hidden,
                    .data = g->pred_router + (size_t)s_window_lo(g, l) * c->n_experts * c->hidden};
        cuda_next_norm_t unit = {g->ones, g->xl, c->rms_eps, NULL};
        const float *pb = g->pred_bias ? g->pred_bias + (size_t)s_window_lo(g, l) * c->n_experts : NULL;
        if ((rc = cuda_router_topk(cx, g->prlog, g->x, n, &w, pb, c->n_experts, c->top_k, false, g->ptidx, g->ptw, &unit,
                                   NULL, g->h_pidx + ri * g->pidx_n)))
            return rc;
    }
    return 0;
}

/* MoE layer l's routed experts onto the residual, whole (part 0) or its part, from what
 * s_ffn_pre left: xn (and its int8 rows), and the routing in moe_scr where the gate put it. */
static int s_moe(gpu_model_t *g, int l, int n, int part, const cuda_next_norm_t *nn)
{
    const model_config_t *c = &g->m->cfg;
    const glayer_t *L = &g->L[l];
    const unsigned flags = (g->xn_q8 ? CUDA_MOE_X_Q8 : 0) | (g->routed ? CUDA_MOE_ROUTED : 0);
    cuda_moe_opts_t mo = L->mo; /* all zero: plain SwiGLU */
    mo.f32_act = s_f32_rows(g);
    return cuda_moe_ffn_ex(g->cx, part, g->split, g->x, g->xn, n, c->hidden, g->inter, g->expert_fmt, L->table_dev,
                           c->n_experts, g->tidx, g->tw, c->top_k, g->moe_scr, flags, nn, &mo);
}

/* Second half: the MLP, or the routed experts' weighted sum and the shared expert's, onto the
 * residual. */
static int s_ffn_post(gpu_model_t *g, int l, int n)
{
    const model_config_t *c = &g->m->cfg;
    const glayer_t *L = &g->L[l];
    cuda_ctx_t *cx = g->cx;
    int rc;
    if (!c->layer_sparse[l]) {
        if ((rc = cuda_ffn_swiglu(cx, g->y, g->xn, n, &L->dense.gate, &L->dense.up, &L->dense.down, g->ffn_scr)))
            return rc;
        return cuda_add(cx, g->x, g->y, (size_t)n * c->hidden);
    }
    /* without a shared expert or CPU experts' rows to add, the combine also norms x for the next
     * layer's attention */
    const bool cpu = gcpu_step(g, n);
    const bool fuse = c->shared_inter <= 0 && l + 1 < c->n_layers && !cpu;
    cuda_next_norm_t nn = {fuse ? g->L[l + 1].attn_norm : NULL, g->xn, c->rms_eps, &g->pre_attn_q8};
    /* the experts' heads ran before the segment's mailbox (s_segment) */
    const int part = !g->all_resident && s_early(g, n) ? CUDA_MOE_TAIL : 0;
    if ((rc = s_moe(g, l, n, part, fuse ? &nn : NULL))) return rc;
    g->pre_attn = fuse;
    if (c->shared_inter > 0) {
        if ((rc = cuda_matmul(cx, g->sg, g->xn, n, &L->shared_gate, NULL))) return rc;
        if ((rc = cuda_ffn_swiglu(cx, g->att, g->xn, n, &L->shared.gate, &L->shared.up, &L->shared.down, g->ffn_scr)))
            return rc;
        if ((rc = cuda_add_sigmoid_scaled(cx, g->x, g->att, g->sg, n, c->hidden))) return rc;
    }
    /* the CPU's experts of this layer, once the host has them (gpu_cpu.c) */
    if (cpu) {
        uint64_t *box = gcpu_box(g, g->xc.moe_ord[l]);
        return cuda_wait_add_rows(cx, box, box + GPU_CPU_ARRIVED, g->x, g->h_cy, n, c->hidden);
    }
    return 0;
}

/* What a step leaves: the logits, the argmax of each logit row, or a token sampled from it. */
typedef enum { S_LOGITS = 0, S_GREEDY = 1, S_SAMPLE = 2 } s_mode_t;

/* Segment k of a step. Without a cache there is one segment: every layer, the final norm, the
 * LM head and the argmax or the sampling. With a cache, segment k (0 <= k <= n_moe) runs from
 * the experts of MoE layer k-1 (k > 0) to the gate of MoE layer k (k < n_moe) or the end;
 * between segments the host waits for the routing and makes the experts resident (s_route),
 * then starts the predicted copies (s_predict). */
static int s_segment(gpu_model_t *g, int k, int n, int n_logits, s_mode_t mode)
{
    const model_config_t *c = &g->m->cfg;
    int rc, l = 0, end = c->n_layers;
    if (!g->all_resident) {
        if (k > 0) {
            l = g->xc.moe_layer[k - 1];
            if ((rc = s_ffn_post(g, l, n))) return rc;
            l++;
        }
        if (k < g->xc.n_moe) end = g->xc.moe_layer[k];
    }
    for (; l < end; l++) {
        if ((rc = s_attention(g, l, n))) return rc;
        if ((rc = s_ffn_pre(g, l, n))) return rc;
        if ((rc = s_ffn_post(g, l, n))) return rc;
    }
    if (end < c->n_layers) {
        if ((rc = s_attention(g, end, n))) return rc;
        if ((rc = s_ffn_pre(g, end, n))) return rc;
        if (s_early(g, n) && (rc = s_moe(g, end, n, CUDA_MOE_HEAD, NULL))) return rc;
        /* a prelaunched step's next segment is enqueued already: this one ends waiting for the
         * host's words of the gate's expert table */
        return s_mailbox(g, n) ? cuda_wait_patch(g->cx, g->h_box + (size_t)(k % GPU_RING) * g->box_n) : 0;
    }
    if ((rc = cuda_gather_rows(g->cx, g->xn, g->x, g->d_rows, n_logits, c->hidden))) return rc;
    if ((rc = cuda_rmsnorm(g->cx, g->xn, g->xn, g->final_norm, n_logits, c->hidden, c->rms_eps))) return rc;
    if ((rc = cuda_matmul(g->cx, g->logits, g->xn, n_logits, &g->lm_head, NULL))) return rc;
    if (mode == S_GREEDY && (rc = cuda_argmax(g->cx, g->logits, n_logits, c->vocab, g->d_ids))) return rc;
    if (mode == S_SAMPLE && (rc = cuda_sample(g->cx, g->logits, n_logits, c->vocab, g->d_samp, g->d_ids))) return rc;
    return 0;
}

/* How many of rows[0..cnt) have landed, counted on from got (the ones before have). */
static size_t s_rows_landed(const int32_t *rows, size_t got, size_t cnt)
{
    while (got < cnt && __atomic_load_n(rows + got, __ATOMIC_ACQUIRE) >= 0) got++;
    return got;
}

/* Wait until the host copies rows[0..cnt) of a router's picks have landed (each >= 0; the host
 * fills them with -1 before the segment is enqueued, s_launch), and with refill >= 0 keep the
 * copy streams fed from the prediction window meanwhile (gslots_issue, layer refill computing): a
 * copy that lands is followed at once by the next. An error on the stream, a stream gone idle
 * without them, or 10 s, end the wait with an error. */
static int s_wait_rows(gpu_model_t *g, const int32_t *rows, size_t cnt, int refill)
{
    size_t got = 0;
    const double t0 = strata_now();
    for (int spin = 0;; spin++) {
        if ((got = s_rows_landed(rows, got, cnt)) == cnt) return 0;
        int q = cuda_query(g->cx), rc;
        if (q < 0) return q;
        if ((q == 1 && __atomic_load_n(rows + got, __ATOMIC_ACQUIRE) < 0) || (spin % 1024 == 1023 && strata_now() - t0 > 10.0)) {
            log_error("gpu: a router's picks never reached the host (%zu of %zu)", got, cnt);
            return STRATA_ECUDA;
        }
        if (refill >= 0 && g->xc.win_n > 0 && (rc = gslots_issue(g, refill, false))) return rc;
    }
}

/* After segment k's gate (MoE layer k): wait for the routing, make its experts resident and
 * refresh the layer's table (prelaunched: through segment k's mailbox), so that segment k + 1
 * can run. While it waits, the host keeps the copy streams fed from the previous layer's
 * prediction. */
static int s_route(gpu_model_t *g, int k, int n)
{
    const size_t ri = (size_t)(k % GPU_RING);
    const int32_t *idx = g->h_idx + ri * g->idx_n;
    double t0 = strata_now();
    int rc = s_wait_rows(g, idx, (size_t)n * g->m->cfg.top_k, k > 0 ? g->xc.moe_layer[k - 1] : -1);
    const double t1 = strata_now();
    g->st.host_us[GPU_HOST_ROWS] += (t1 - t0) * 1e6;
    const double cpu0 = g->st.host_us[GPU_HOST_FLAG] + g->st.host_us[GPU_HOST_POST];
    if (!rc)
        rc = gslots_ensure(g, g->xc.moe_layer[k], n, idx, s_mailbox(g, n) ? g->h_box + ri * g->box_n : NULL, g->step_pre);
    /* less the CPU jobs' post inside it (gcpu_post times its own phases) */
    g->st.host_us[GPU_HOST_PLACE] +=
        (strata_now() - t1) * 1e6 - (g->st.host_us[GPU_HOST_FLAG] + g->st.host_us[GPU_HOST_POST] - cpu0);
    if (!rc) g->n_routed = k + 1;
    return rc;
}

/* Then wait for segment k's prediction of the next layers (its last router) and start the
 * copies of the predicted experts that are not resident. */
static int s_predict(gpu_model_t *g, int k, int n)
{
    const int l = g->xc.moe_layer[k], D = s_window(g, l), top_k = g->m->cfg.top_k;
    const int32_t *pidx = g->h_pidx + (size_t)(k % GPU_RING) * g->pidx_n;
    const double t0 = strata_now();
    int rc = D > 0 ? s_wait_rows(g, pidx, (size_t)n * D * top_k, -1) : 0;
    if (!rc) {
        xcache_predicted(&g->xc, s_window_lo(g, l), D, pidx, n, top_k);
        gcpu_leave(g, n);
        rc = D > 0 ? gslots_issue(g, l, false) : 0;
    }
    g->st.host_us[GPU_HOST_PREDICT] += (strata_now() - t0) * 1e6;
    return rc;
}

/* Split experts: how many MoE layers' tails the cache pins (xcache_pin: the first, whose
 * experts nothing predicts in time, then spread over the step) for a step of n tokens: as many
 * as leave room for the current layer's experts and the prefetch window's, the expected
 * distinct experts a layer routes n tokens to, and at least one. Mixtral 24 GiB, 29 tail slots,
 * batch 1, the first layers pinned: 1 layer 166.6 tok/s, 2 (this rule) 172.3, 3 173.6; at
 * batch 16 a rule for batch 1 (5 of 53 slots' layers kept in the group) left too few for the
 * window: hit rate 0.22, 214.6 tok/s against 352.7. Spread instead of the first ones:
 * gpu_decode 24G batch 1 at 256 tokens a step (74 slots, 8 pinned) 224.7 and 222.9 tok/s
 * against 210.9 and 208.5, strata bench (53 slots, 5 pinned; alternating runs in one call)
 * 189.2 and 187.0 against 186.0 and 184.2: the first layers pinned left the link idle while
 * they computed. */
static int s_pin_layers(const gpu_model_t *g, int n)
{
    const double E = g->m->cfg.n_experts, k = g->m->cfg.top_k;
    const double distinct = E * (1.0 - pow(1.0 - k / E, n));
    const int keep = (int)ceil(distinct * (g->depth + 1));
    int pin = (int)((g->n_slots - keep) / E);
    if (pin > g->xc.n_moe - 1) pin = g->xc.n_moe - 1;
    return pin > 1 ? pin : 1;
}

/* Rows [i0, i1) of a step's embedding into h_x. */
typedef struct {
    const gpu_model_t *g;
    const int32_t *tokens;
} s_embed_job_t;

static void s_embed_rows(void *ctx, int64_t i0, int64_t i1, int tid)
{
    (void)tid;
    const s_embed_job_t *j = ctx;
    const int H = j->g->m->cfg.hidden;
    for (int64_t t = i0; t < i1; t++) qmat_dequant_row(&j->g->m->embed, j->tokens[t], j->g->h_x + (size_t)t * H);
}

/* The step's embedded rows into h_x (tokens checked): on the host, in GPU_EMBED_THREADS threads
 * for a step of GPU_EMBED_POOL_ROWS or more (a 512-token prefill spent about 1.2 ms of host
 * time here before its first kernel, on one thread). Without a pool, on this thread. */
static void s_embed(gpu_model_t *g, const int32_t *tokens, int n)
{
    s_embed_job_t j = {g, tokens};
    if (n >= GPU_EMBED_POOL_ROWS && !g->embed_pool) g->embed_pool = tpool_create(GPU_EMBED_THREADS);
    tpool_run(n >= GPU_EMBED_POOL_ROWS ? g->embed_pool : NULL, n, 32, s_embed_rows, &j);
}

/* KV blocks sequence s of b uses: up to its last row's position. */
static int s_blocks_needed(const gpu_model_t *g, const batch_t *b, int s)
{
    int need = 0;
    for (int t = 0; t < b->n_tokens; t++)
        if (b->seq[t] == s && b->pos[t] / g->o.block_size + 1 > need) need = b->pos[t] / g->o.block_size + 1;
    return need;
}

/* The first entry of sequence s's window table that a sliding layer reads this step: the block
 * of its first row's window start (every entry below it may be -1). */
static int s_window_first(const gpu_model_t *g, const batch_t *b, int s)
{
    int first = INT32_MAX;
    for (int t = 0; t < b->n_tokens; t++)
        if (b->seq[t] == s) {
            const int lo = b->pos[t] + 1 - g->m->cfg.sliding_window;
            const int j = lo > 0 ? lo / g->o.block_size : 0;
            if (j < first) first = j;
        }
    return first == INT32_MAX ? 0 : first;
}

/* Sequence s's window-table entry j as staged in h_bt's second half: the table's, or its block
 * table's without window tables; an entry below the step's windows (-1, never read) as 0. */
static int32_t s_win_entry(const batch_t *b, int s, int j, int first)
{
    if (!b->win_tables) return b->block_tables[s][j];
    return j < first ? 0 : b->win_tables[s][j];
}

/* h_meta[0..words) onto the device: the 64-bit words that differ from what it holds (dev_meta)
 * as a kernel's parameters (cuda_patch_words: a decode step moves a position, now and then a
 * block; a copy waited about 7 us in the stream on either side), else one DMA. */
static int s_put_meta(gpu_model_t *g, size_t words)
{
    const size_t w64 = (words + 1) / 2;
    const uint64_t *h = (const uint64_t *)g->h_meta;
    uint64_t *d = (uint64_t *)g->dev_meta, *dst[CUDA_PATCH_MAX], val[CUDA_PATCH_MAX];
    int np = 0;
    for (size_t i = 0; i < w64 && np <= CUDA_PATCH_MAX; i++)
        if (h[i] != d[i]) {
            if (np < CUDA_PATCH_MAX) dst[np] = (uint64_t *)g->d_pos + i, val[np] = h[i];
            np++;
        }
    memcpy(d, h, w64 * 8);
    if (np <= CUDA_PATCH_MAX) return cuda_patch_words(g->cx, np, dst, val);
    return cuda_h2d_async(g->cx, CUDA_STREAM_COMPUTE, g->d_pos, g->h_meta, w64 * 8);
}

/* A step's inputs checked and staged on the device: embedded rows, positions, sequences,
 * logit rows, block tables; the pins for its size. With d_tok (a chained step: s_picks) its
 * tokens are d_tok[0..n) on the device, embedded there (b->tokens is not read); else, where the
 * GPU reads the embedding in host memory (embed_dev), b->tokens go up and are looked up there
 * too, or else on the host. */
static int s_stage(gpu_model_t *g, const batch_t *b, const int32_t *d_tok)
{
    const model_config_t *c = &g->m->cfg;
    int n = b->n_tokens, rc;
    if (n < 0 || n > g->o.max_tokens || b->n_logits < 0 || b->n_logits > n) {
        log_error("gpu: batch of %d tokens (%d logits) exceeds max_tokens %d", n, b->n_logits, g->o.max_tokens);
        return STRATA_EINVAL_INPUT;
    }
    int n_seqs = 0, runs = 0;
    for (int t = 0; t < n; t++) {
        int32_t tok = d_tok ? 0 : b->tokens[t], pos = b->pos[t], s = b->seq[t];
        if (tok < 0 || tok >= c->vocab || pos < 0 || s < 0 || s >= g->o.max_tokens || !b->block_tables[s] ||
            pos / g->o.block_size >= g->o.kv_blocks) {
            log_error("gpu: row %d: token %d, position %d, sequence %d out of range", t, tok, pos, s);
            return STRATA_EINVAL_INPUT;
        }
        if (s + 1 > n_seqs) n_seqs = s + 1;
        runs += t == 0 || s != b->seq[t - 1];
    }
    for (int i = 0; i < b->n_logits; i++)
        if (b->logit_rows[i] < 0 || b->logit_rows[i] >= n) {
            log_error("gpu: logit row %d outside the batch of %d", b->logit_rows[i], n);
            return STRATA_EINVAL_INPUT;
        }
    for (int s = 0; s < n_seqs; s++) {
        const int need = s_blocks_needed(g, b, s), first = g->win ? s_window_first(g, b, s) : 0;
        if (need > 0 && g->win && b->win_tables && !b->win_tables[s]) {
            log_error("gpu: sequence %d has no window table", s);
            return STRATA_EINVAL_INPUT;
        }
        int32_t *row = g->h_bt + (size_t)s * g->bt_stride;
        for (int j = 0; j < need; j++) {
            const int32_t blk = b->block_tables[s][j], wb = g->win ? s_win_entry(b, s, j, first) : 0;
            if (blk < 0 || blk >= g->o.kv_blocks || wb < 0 || wb >= g->o.kv_blocks) {
                log_error("gpu: sequence %d uses KV block %d of %d", s, blk < 0 || blk >= g->o.kv_blocks ? blk : wb,
                          g->o.kv_blocks);
                return STRATA_EINVAL_INPUT;
            }
            row[j] = blk;
            if (g->win) row[g->o.kv_blocks + j] = wb;
        }
    }
    /* the tensor-core kernel makes a pass per sequence in each 64-row tile: worth it when the
     * step is long runs of one sequence's rows (prefill), not many single decode rows */
    g->att_tc = n >= 64 && runs * 16 <= n;
    cuda_ctx_t *cx = g->cx;
    /* positions, sequences, logit rows and block tables go up together (s_put_meta) */
    const size_t T = (size_t)g->o.max_tokens;
    memcpy(g->h_meta, b->pos, (size_t)n * 4);
    memcpy(g->h_meta + T, b->seq, (size_t)n * 4);
    memcpy(g->h_meta + 2 * T, b->logit_rows, (size_t)b->n_logits * 4);
    if ((rc = s_put_meta(g, 3 * T + (size_t)n_seqs * g->bt_stride))) return rc;
    if (!d_tok && g->embed_dev.data) {
        /* the ids up (h_tok is not written again before this step has run), the lookup on the
         * GPU: the host's, in the executor's threads, took about 400 us before a 128-token
         * prefill's first kernel in the 24 GiB bench */
        memcpy(g->h_tok, b->tokens, (size_t)n * 4);
        if ((rc = cuda_h2d_small(cx, g->d_tok, g->h_tok, (size_t)n * 4))) return rc;
        d_tok = g->d_tok;
    }
    if (d_tok) {
        if ((rc = cuda_embed(cx, g->x, &g->embed_dev, d_tok, n))) return rc;
    } else {
        s_embed(g, b->tokens, n);
        if ((rc = cuda_h2d_async(cx, CUDA_STREAM_COMPUTE, g->x, g->h_x, (size_t)n * c->hidden * 4))) return rc;
    }
    if (g->split) xcache_pin(&g->xc, s_pin_layers(g, n));
    g->pre_attn = g->pre_attn_q8 = false; /* a step that failed half-way may have left them set */
    return 0;
}

/* Segment k of a step of n tokens: its decode graph (captured on first use, the last segment
 * again when the mode or logit count changes), or its kernels when the step is not
 * decode-shaped. Its ring entry is reset first: -1s for its routers' picks, an empty mailbox
 * (the segment that used the entry last, k - GPU_RING, was routed and predicted for). */
static int s_launch_untimed(gpu_model_t *g, int k, const batch_t *b, s_mode_t mode)
{
    const int n = b->n_tokens, n_seg = g->n_seg;
    if (k < n_seg - 1) {
        const size_t ri = (size_t)(k % GPU_RING);
        memset(g->h_idx + ri * g->idx_n, 0xff, (size_t)n * g->m->cfg.top_k * 4);
        memset(g->h_pidx + ri * g->pidx_n, 0xff, (size_t)n * g->pred_cap * g->m->cfg.top_k * 4);
        __atomic_store_n(g->h_box + ri * g->box_n, (uint64_t)0, __ATOMIC_RELEASE);
        if (gcpu_step(g, n)) {
            __atomic_store_n(g->h_xflag + ri * 8, (uint64_t)0, __ATOMIC_RELEASE);
            uint64_t *box = gcpu_box(g, k);
            __atomic_store_n(box + GPU_CPU_ARRIVED, (uint64_t)0, __ATOMIC_RELAXED);
            __atomic_store_n(box, (uint64_t)0, __ATOMIC_RELEASE);
        }
    }
    if (!(g->o.use_graphs && n < GPU_MAX_GRAPHS && b->n_logits == n)) return s_segment(g, k, n, b->n_logits, mode);
    cuda_graph_t **gr = &g->graphs[(size_t)n * n_seg + k];
    bool last = k == n_seg - 1;
    int rc;
    if (!*gr || (last && (g->graph_mode[n] != (int8_t)mode || g->graph_nlog[n] != b->n_logits))) {
        if ((rc = cuda_graph_begin(g->cx))) return rc;
        rc = s_segment(g, k, n, b->n_logits, mode);
        int rc2 = cuda_graph_end(g->cx, gr);
        if (rc || rc2) return rc ? rc : rc2;
        if (last) g->graph_mode[n] = (int8_t)mode, g->graph_nlog[n] = b->n_logits;
    }
    return cuda_graph_launch(g->cx, *gr);
}

static int s_launch(gpu_model_t *g, int k, const batch_t *b, s_mode_t mode)
{
    const double t0 = strata_now();
    const int rc = s_launch_untimed(g, k, b, mode);
    g->st.host_us[GPU_HOST_LAUNCH] += (strata_now() - t0) * 1e6;
    return rc;
}

/* Whether b is the step gpu_step_ahead started: the same rows (tokens, positions, sequences),
 * logit rows and the blocks they use (compared with what s_stage staged for it). */
static bool s_ahead_is(const gpu_model_t *g, const batch_t *b)
{
    const int n = b->n_tokens;
    const size_t T = (size_t)g->o.max_tokens;
    if (g->ahead_n != n || n <= 0 || b->n_logits != g->ahead_nlog) return false;
    if (memcmp(b->tokens, g->ahead_tok, (size_t)n * 4) || memcmp(b->pos, g->h_meta, (size_t)n * 4) ||
        memcmp(b->seq, g->h_meta + T, (size_t)n * 4) || memcmp(b->logit_rows, g->h_meta + 2 * T, (size_t)b->n_logits * 4))
        return false;
    for (int t = 0; t < n; t++) {
        const int s = b->seq[t];
        if (!b->block_tables[s] || (g->win && b->win_tables && !b->win_tables[s])) return false;
        const int32_t *row = g->h_bt + (size_t)s * g->bt_stride;
        const int first = g->win ? s_window_first(g, b, s) : 0;
        for (int j = 0, need = s_blocks_needed(g, b, s); j < need; j++)
            if (b->block_tables[s][j] != row[j] || (g->win && s_win_entry(b, s, j, first) != row[g->o.kv_blocks + j]))
                return false;
    }
    return true;
}

/* A prelaunched step's segments that were enqueued but not routed wait for their mailboxes:
 * fill them empty so that they finish (an abandoned step ahead, or an error), with whatever the
 * tables held; nothing uses what they compute. Then wait for them, since their routers still
 * write the ring entries the next step resets. */
void gstep_release(gpu_model_t *g)
{
    /* CPU experts: an abandoned step's segments wait in cuda_wait_add_rows for the boxes of
     * the layers it routed, which are open, but the next step resets those ring entries: let
     * them finish first */
    if (!g->step_pre && g->cpu_on && g->n_launched > 0 && g->n_launched < g->n_seg) {
        cuda_sync(g->cx);
        g->n_launched = g->n_routed = 0;
        return;
    }
    if (!g->step_pre || g->n_routed >= g->n_launched || g->n_routed >= g->n_seg - 1) return;
    for (int j = g->n_routed; j < g->n_launched && j < g->n_seg - 1; j++) {
        uint64_t *box = g->h_box + (size_t)(j % GPU_RING) * g->box_n;
        if (!__atomic_load_n(box, __ATOMIC_ACQUIRE)) __atomic_store_n(box, (uint64_t)1, __ATOMIC_RELEASE);
    }
    g->n_routed = g->n_launched;
    cuda_sync(g->cx);
}

/* Segment k's turn (the ones before are routed): enqueue the segments it needs, at most up to
 * cap, route it after its gate, predict after. A prelaunched step keeps one more segment
 * enqueued than the one the host waits on, each held back by the mailbox at the end of the one
 * before (cuda_wait_patch), so that it runs as soon as the host has placed the experts,
 * without a launch in between, and the copies layer k's prediction asks for start before the
 * next segment is enqueued (it is needed only after the one enqueued already); otherwise
 * segment k + 1 is enqueued once layer k's experts are placed, and the copies start after. */
static int s_advance(gpu_model_t *g, int k, const batch_t *b, s_mode_t mode, int cap)
{
    const int n = b->n_tokens, lead = g->step_pre ? GPU_LEAD : 0;
    int rc;
    while (g->n_launched <= k + lead && g->n_launched <= cap)
        if ((rc = s_launch(g, g->n_launched++, b, mode))) return rc;
    if ((rc = s_route(g, k, n))) return rc;
    if (gcpu_step(g, n)) {
        /* CPU experts (never prelaunched: whole experts): their rows out (gslots_ensure posted
         * them), the GPU's experts enqueued, the predicted copies started, then the CPU's
         * results in; the box opens on every path, or the next segment would wait for it */
        const int32_t *idx = g->h_idx + (size_t)(k % GPU_RING) * g->idx_n;
        while (!rc && g->n_launched <= k + 1 && g->n_launched <= cap) rc = s_launch(g, g->n_launched++, b, mode);
        if (!rc) rc = s_predict(g, k, n);
        const int rc2 = gcpu_finish(g, k, n, idx);
        return rc ? rc : rc2;
    }
    /* prelaunched, the segment after is enqueued already: the copies first */
    if (g->step_pre && (rc = s_predict(g, k, n))) return rc;
    while (g->n_launched <= k + 1 + lead && g->n_launched <= cap)
        if ((rc = s_launch(g, g->n_launched++, b, mode))) return rc;
    return g->step_pre ? 0 : s_predict(g, k, n);
}

/* Segments from k on. ahead: only segment k's turn, and no segment that depends on the step's
 * mode (the last). */
static int s_run(gpu_model_t *g, int k, const batch_t *b, s_mode_t mode, bool ahead)
{
    const int last = g->n_seg - 1;
    int rc;
    for (; k < last; k++) {
        if ((rc = s_advance(g, k, b, mode, ahead ? last - 1 : last))) return rc;
        if (ahead) return 0;
    }
    while (g->n_launched <= last)
        if ((rc = s_launch(g, g->n_launched++, b, mode))) return rc;
    return 0;
}

/* Whether a step is prelaunched (s_run): its segments end with a mailbox, and every graph it
 * launches has been captured and launched before (mode < 0: a step ahead, which does not
 * launch the last segment). Capturing one, or a kernel's first launch (CUDA loads modules
 * lazily), can wait for the device, which a segment waiting for its mailbox never lets go
 * idle, so those happen in a step that is not prelaunched. */
static bool s_prelaunch(const gpu_model_t *g, const batch_t *b, int mode)
{
    const int n = b->n_tokens, n_seg = g->n_seg;
    if (!s_mailbox(g, n) || !g->o.use_graphs || n >= GPU_MAX_GRAPHS || b->n_logits != n) return false;
    for (int k = 0; k < n_seg; k++)
        if (!g->graphs[(size_t)n * n_seg + k] && (k < n_seg - 1 || mode >= 0)) return false;
    return mode < 0 || (g->graph_mode[n] == (int8_t)mode && g->graph_nlog[n] == b->n_logits);
}

/* A step's start: stage its inputs; nothing of it is enqueued yet. */
static int s_begin(gpu_model_t *g, const batch_t *b, int mode)
{
    int rc = s_stage(g, b, NULL);
    g->step_pre = !rc && s_prelaunch(g, b, mode);
    g->n_launched = g->n_routed = 0;
    return rc;
}

/* The step's picks come back (ids, host [n]); with nb (every segment of this step enqueued,
 * nb's rows taking its picks in order) nb starts behind it on the stream before the host has
 * them: its inputs staged, its rows embedded on the GPU from the picks (embed_dev), its first
 * segments enqueued, as gpu_step_ahead would start it once the host had the ids, minus that
 * round trip (the GPU idled 65 us a step at 24 GiB, batch 1, between the sampling and the next
 * step's first kernel). The host routes it later (gpu_ahead_progress, s_step). A guess staging
 * refuses is dropped. */
static int s_picks(gpu_model_t *g, int n, int32_t *ids, const batch_t *nb)
{
    cuda_ctx_t *cx = g->cx;
    int rc;
    if (!nb || nb->n_tokens != n || !g->embed_dev.data || !s_prelaunch(g, nb, -1))
        return cuda_d2h(cx, ids, g->d_ids, (size_t)n * 4);
    /* the picks come back on a copy stream (idle at a step's end): the compute stream goes on */
    if ((rc = cuda_event_record(cx, g->ev_picked, CUDA_STREAM_COMPUTE)) ||
        (rc = cuda_stream_wait_event(cx, CUDA_STREAM_COPY2, g->ev_picked)) ||
        (rc = cuda_d2h_async(cx, CUDA_STREAM_COPY2, g->h_ids, g->d_ids, (size_t)n * 4)) ||
        (rc = cuda_event_record(cx, g->ev_ids, CUDA_STREAM_COPY2)))
        return rc;
    if (!s_stage(g, nb, g->d_ids)) {
        g->step_pre = true;
        g->n_launched = g->n_routed = 0;
        while (!rc && g->n_launched <= GPU_LEAD) rc = s_launch(g, g->n_launched++, nb, S_LOGITS);
        if (!rc) g->ahead_n = n, g->ahead_nlog = n, g->st.steps_chained++;
    }
    const int d = gslots_wait_event(g, g->ev_ids, -1);
    if (d && !rc) rc = d;
    if (rc) {
        g->ahead_n = 0;
        gstep_release(g);
        return rc;
    }
    memcpy(ids, g->h_ids, (size_t)n * 4);
    memcpy(g->ahead_tok, g->h_ids, (size_t)n * 4);
    return 0;
}

int gpu_step_ahead(gpu_model_t *g, const batch_t *b)
{
    if (s_ahead_is(g, b)) return 0; /* started already, chained behind the last step (s_picks) */
    gstep_release(g);
    g->ahead_n = 0;
    const int n = b->n_tokens;
    /* only a cache's first segment has anything to overlap: the prefetches of the layers
     * after the first gate */
    if (g->all_resident || n <= 0 || n >= GPU_MAX_GRAPHS || b->n_logits != n) return 0;
    int rc;
    if ((rc = s_begin(g, b, -1)) || (rc = s_run(g, 0, b, S_LOGITS, true))) {
        gstep_release(g);
        return rc;
    }
    memcpy(g->ahead_tok, b->tokens, (size_t)n * sizeof *b->tokens);
    g->ahead_nlog = b->n_logits;
    g->ahead_n = n;
    return 0;
}

int gpu_ahead_progress(gpu_model_t *g)
{
    const int k = g->n_routed, last = g->n_seg - 1, n = g->ahead_n;
    if (n <= 0 || !g->step_pre || k >= last) return 0;
    /* not waiting: the routing of segment k is there, or the copy streams are kept fed */
    const int32_t *idx = g->h_idx + (size_t)(k % GPU_RING) * g->idx_n;
    int rc;
    if (s_rows_landed(idx, 0, (size_t)n * g->m->cfg.top_k) < (size_t)n * g->m->cfg.top_k)
        return k > 0 && g->xc.win_n > 0 ? gslots_issue(g, g->xc.moe_layer[k - 1], false) : 0;
    const batch_t b = {.n_tokens = n, .n_logits = g->ahead_nlog};
    if ((rc = s_advance(g, k, &b, S_LOGITS, last - 1))) {
        g->ahead_n = 0;
        gstep_release(g);
        return rc;
    }
    return 1;
}

/* One step: logits (host, S_LOGITS) or ids (host, the other modes; samp: each logit row's
 * parameters with S_SAMPLE). A step that gpu_step_ahead started goes on from its second
 * segment; one it started for other rows is let finish, unused. Decode-shaped steps replay a
 * CUDA graph per size and segment (one segment when every expert is resident; with a cache,
 * the host decides residency between segments: s_run). */
static int s_step(gpu_model_t *g, const batch_t *b, s_mode_t mode, float *logits, int32_t *ids,
                  const gpu_sample_t *samp)
{
    const model_config_t *c = &g->m->cfg;
    const int n = b->n_tokens;
    const batch_t *next = g->next;
    g->next = NULL;
    /* a prelaunched step ahead goes on only if its last segment's graph is there for the mode */
    const bool ahead = s_ahead_is(g, b) && (!g->step_pre || s_prelaunch(g, b, mode));
    g->ahead_n = 0;
    if (!ahead) gstep_release(g);
    if (n == 0) return 0;
    int rc;
    if (ahead) g->st.steps_ahead++;
    else if ((rc = s_begin(g, b, mode))) return rc;
    cuda_ctx_t *cx = g->cx;
    if (mode == S_SAMPLE) {
        for (int i = 0; i < b->n_logits; i++)
            g->h_samp[i] = (cuda_sample_param_t){samp[i].temperature, samp[i].top_k, samp[i].top_p, 0.f, samp[i].u};
        if ((rc = cuda_h2d_small(cx, g->d_samp, g->h_samp, (size_t)b->n_logits * sizeof *g->h_samp))) {
            gstep_release(g);
            return rc;
        }
    }
    g->st.steps++;
    gcpu_tune(g, n);
    if ((rc = s_run(g, ahead ? g->n_routed : 0, b, mode, false))) {
        gstep_release(g);
        return rc;
    }
    if (mode != S_LOGITS) return s_picks(g, b->n_logits, ids, next);
    return cuda_d2h(cx, logits, g->logits, (size_t)b->n_logits * c->vocab * 4);
}

int gpu_forward(gpu_model_t *g, const batch_t *b, float *logits) { return s_step(g, b, S_LOGITS, logits, NULL, NULL); }

void gpu_set_next(gpu_model_t *g, const batch_t *next) { g->next = next; }

int gpu_forward_greedy(gpu_model_t *g, const batch_t *b, int32_t *ids)
{
    return s_step(g, b, S_GREEDY, NULL, ids, NULL);
}

int gpu_forward_sample(gpu_model_t *g, const batch_t *b, const gpu_sample_t *samp, int32_t *ids)
{
    if (g->m->cfg.vocab > CUDA_SAMPLE_MAX_VOCAB) return STRATA_EUNSUPPORTED;
    return s_step(g, b, S_SAMPLE, NULL, ids, samp);
}
