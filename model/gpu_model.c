/* gpu_model.c - the model on one GPU under a memory budget: its layout and the budget.
 *
 * Owns gpu_opts_default, the budgeted device allocations (s_dalloc) and the uploads, the
 * workspace and the host staging buffers, how many expert slots the budget leaves
 * (s_slot_count) and the split plan (s_split_plan), creation (gpu_model_create, s_create_*,
 * s_enable_blas, s_map_embed, s_lock_spans), gpu_model_free and the statistics' getters. At
 * creation it lays out and fills the slots with gpu_slots.c's functions (gslots_*, gpu_int.h;
 * with every expert resident it uploads each slot itself, once, from a packed staging copy)
 * and records in the cache's policy what each holds; after that it touches no slot, copy
 * stream or policy state but to free them. It launches no step and touches no mailbox, ring
 * entry or graph but to free them (a prelaunched step is let go first, gstep_release).
 *
 * Resident on the GPU: attention weights, norms, routers, shared experts, dense MLPs, the
 * final norm and the LM head. The embedding stays in host memory: with an expert cache it is
 * page-locked and the GPU looks a step's rows up there (s_map_embed), else a step looks them
 * up on the CPU and copies n x hidden floats. When the budget holds every expert, each sits in a
 * slot of its own. When it does not, by default every expert stays resident but the last rows
 * of its down projection, its tail, and slots cache the tails (split experts, s_split_plan:
 * a layer needs a few MB, which the prediction of the next layer hides behind compute, where a
 * whole expert it needed could not be hidden). Else (gpu_opts_t.split_experts off, or no
 * split fits) slots cache whole experts. How a slot holds an expert or a tail, and what a copy
 * into it reads: gpu_slots.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/gpu_int.h"

/* budget kept free below the slot array for what the driver allocates later (graphs, kernel
 * code loaded on first use, the slot array's rounding); dropped when a budget is too tight */
#define GPU_SLOT_MARGIN ((int64_t)64 << 20)
/* prefetch copies of whole experts on the copy stream at once (double-buffered: one lands while the next is
 * queued). The host refills while it waits for each layer's routing, so more would only commit
 * copies earlier, on staler predictions; measured at Mixtral-8x7B 24 GiB depth 16, batch 1:
 * 1 in flight 138.0 tok/s, 2 in flight 138.3 */
#define GPU_MAX_INFLIGHT 2
/* The prefetch depth by default. Whole experts, measured at Mixtral-8x7B 24 GiB: depth 31 (the
 * whole rest of the step) against 16 gave batch 1 125.8 against 123.4 tok/s in strata bench,
 * but batch 16 222.5 against 238.8 (more copies on far, wrong predictions); 8 was slower at
 * batch 1 (131 against 138). Split experts, gpu_decode batch 1: depth 1 137.2, 2 164.7, 3
 * 157.3, 4 152.0, 16 109.4 tok/s (every layer needs tails, so far predictions crowd out the
 * near ones: prefetch accuracy 0.92 at 2, 0.72 at 16). */
#define GPU_DEPTH_WHOLE 16
#define GPU_DEPTH_SPLIT 2

void gpu_opts_default(gpu_opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->kv_blocks = 256;
    o->block_size = 16;
    o->max_tokens = 512;
    o->prefetch_depth = -1; /* GPU_DEPTH_WHOLE or GPU_DEPTH_SPLIT */
    o->blas = true;
    o->use_graphs = true;
    o->split_experts = true;
}

/* ---- budgeted device memory ---- */

static int s_dalloc(gpu_model_t *g, void **p, size_t bytes, const char *what, strata_errbuf_t *eb)
{
    bytes = ALIGN256(bytes ? bytes : 1);
    if (g->budget > 0 && g->used + (int64_t)bytes > g->budget)
        return strata_seterr(eb, STRATA_ETOOLARGE, "gpu: %s needs %zu bytes but only %lld of --gpu-mem %lld are left", what,
                             bytes, (long long)(g->budget - g->used), (long long)g->budget);
    if (g->n_allocs == g->cap_allocs) {
        int cap = g->cap_allocs ? 2 * g->cap_allocs : 256;
        void **a = realloc(g->allocs, (size_t)cap * sizeof *a);
        if (!a) return strata_seterr(eb, STRATA_ENOMEM, "gpu: out of host memory");
        g->allocs = a;
        g->cap_allocs = cap;
    }
    int rc = cuda_malloc(p, bytes);
    if (rc) return strata_seterr(eb, rc, "gpu: cudaMalloc of %zu bytes for %s failed", bytes, what);
    g->allocs[g->n_allocs++] = *p;
    g->used += (int64_t)bytes;
    return 0;
}

static int s_upload(gpu_model_t *g, void **dst, const void *src, size_t bytes, const char *what, strata_errbuf_t *eb)
{
    int rc = s_dalloc(g, dst, bytes, what, eb);
    if (rc) return rc;
    if (bytes && (rc = cuda_h2d(g->cx, *dst, src, bytes))) return strata_seterr(eb, rc, "gpu: upload of %s failed", what);
    return 0;
}

static int s_upload_f32(gpu_model_t *g, float **dst, const float *src, size_t n, const char *what, strata_errbuf_t *eb)
{
    if (!src) {
        *dst = NULL;
        return 0;
    }
    return s_upload(g, (void **)dst, src, n * sizeof(float), what, eb);
}

static int s_upload_qmat(gpu_model_t *g, qmat_t *dst, const qmat_t *src, const char *what, strata_errbuf_t *eb)
{
    *dst = *src;
    if (!src->data) return 0;
    size_t db = qmat_data_bytes(src->fmt, src->rows, src->cols);
    size_t sb = qmat_scale_bytes(src->fmt, src->rows, src->cols, src->group);
    int rc = s_upload(g, (void **)&dst->data, src->data, db, what, eb);
    if (!rc && sb) rc = s_upload(g, (void **)&dst->scales, src->scales, sb, what, eb);
    return rc;
}

static int s_upload_ffn(gpu_model_t *g, ffn_t *dst, const ffn_t *src, const char *what, strata_errbuf_t *eb)
{
    int rc = s_upload_qmat(g, &dst->gate, &src->gate, what, eb);
    if (!rc) rc = s_upload_qmat(g, &dst->up, &src->up, what, eb);
    if (!rc) rc = s_upload_qmat(g, &dst->down, &src->down, what, eb);
    return rc;
}

/* ---- creation ---- */

void gpu_model_free(gpu_model_t *g)
{
    if (!g) return;
    if (g->cx) gstep_release(g), cuda_sync(g->cx);
    if (g->graphs)
        for (int i = 0; i < GPU_MAX_GRAPHS * g->n_seg; i++) cuda_graph_destroy(g->graphs[i]);
    free(g->graphs);
    if (g->ev)
        for (int s = 0; s < g->n_slots; s++) cuda_event_destroy(g->ev[s]);
    free(g->ev);
    for (int i = 0; i < g->n_allocs; i++) cuda_free(g->allocs[i]);
    free(g->allocs);
    if (g->L)
        for (int l = 0; l < g->m->cfg.n_layers; l++) {
            cuda_host_free(g->L[l].table_host);
        }
    free(g->L);
    xcache_free(&g->xc);
    free(g->lst);
    free(g->ens_miss);
    free(g->ens_vic);
    cuda_host_free(g->host_experts);
    cuda_host_free(g->host_tails);
    for (int i = 0; i < g->n_locked; i++) cuda_host_unregister(g->locked[i]);
    free(g->locked);
    cuda_host_free(g->h_x);
    cuda_host_free(g->h_ids);
    cuda_host_free(g->h_tok);
    cuda_event_destroy(g->ev_ids);
    cuda_event_destroy(g->ev_picked);
    free(g->dev_meta);
    cuda_host_unregister(g->embed_lock);
    cuda_host_free(g->embed_copy);
    cuda_host_free(g->h_meta);
    cuda_host_free(g->h_idx);
    cuda_host_free(g->h_pidx);
    cuda_host_free(g->h_box);
    free(g->patch_dst);
    free(g->patch_val);
    cuda_host_free(g->h_samp);
    cuda_host_free(g->h_xn);
    cuda_host_free(g->h_tw);
    cuda_host_free(g->h_xflag);
    cuda_host_free(g->h_cbox);
    cuda_host_free(g->h_cy);
    free(g->cpu_fy);
    free(g->cpu_scr);
    free(g->cpu_dest);
    free(g->cpu_cnt);
    free(g->cpu_row);
    tpool_destroy(g->embed_pool);
    cuda_ctx_destroy(g->cx);
    free(g);
}

static int s_create_layers(gpu_model_t *g, strata_errbuf_t *eb)
{
    const model_t *m = g->m;
    const model_config_t *c = &m->cfg;
    int rc = 0;
    size_t H = (size_t)c->hidden, qd = (size_t)c->n_heads * c->head_dim, kd = (size_t)c->n_kv_heads * c->head_dim;
    size_t E = (size_t)c->n_experts, I = (size_t)c->moe_inter;
    g->L = calloc((size_t)c->n_layers, sizeof *g->L);
    g->lst = calloc((size_t)c->n_layers, sizeof *g->lst);
    g->ens_miss = malloc(sizeof *g->ens_miss * (E ? E : 1));
    g->ens_vic = malloc(sizeof *g->ens_vic * (E ? E : 1));
    /* the MoE layers' ordinals (g->xc.moe_ord / moe_layer); the slots come with the budget */
    if (!g->L || !g->lst || !g->ens_miss || !g->ens_vic || xcache_init(&g->xc, c->n_layers, c->layer_sparse, c->n_experts, c->top_k, 0) < 0)
        return strata_seterr(eb, STRATA_ENOMEM, "gpu: out of host memory");
    for (int l = 0; l < c->n_layers && !rc; l++) {
        const layer_t *S = &m->layers[l];
        glayer_t *D = &g->L[l];
        size_t qn = c->qk_norm == QK_NORM_HEAD ? (size_t)c->head_dim : qd;
        size_t kn = c->qk_norm == QK_NORM_HEAD ? (size_t)c->head_dim : kd;
        rc = s_upload_f32(g, &D->attn_norm, S->attn_norm, H, "attn_norm", eb);
        if (!rc) rc = s_upload_f32(g, &D->ffn_norm, S->ffn_norm, H, "ffn_norm", eb);
        if (!rc && c->qkv_bias) rc = s_upload_f32(g, &D->bq, S->bq, qd, "q bias", eb);
        if (!rc && c->qkv_bias) rc = s_upload_f32(g, &D->bk, S->bk, kd, "k bias", eb);
        if (!rc && c->qkv_bias) rc = s_upload_f32(g, &D->bv, S->bv, kd, "v bias", eb);
        if (!rc && c->o_bias) rc = s_upload_f32(g, &D->bo, S->bo, H, "o bias", eb);
        if (!rc && c->attn_sinks) rc = s_upload_f32(g, &D->sinks, S->sinks, (size_t)c->n_heads, "attention sinks", eb);
        if (!rc && c->qk_norm != QK_NORM_NONE) rc = s_upload_f32(g, &D->q_norm, S->q_norm, qn, "q_norm", eb);
        if (!rc && c->qk_norm != QK_NORM_NONE) rc = s_upload_f32(g, &D->k_norm, S->k_norm, kn, "k_norm", eb);
        if (!rc) rc = s_upload_qmat(g, &D->wq, &S->wq, "wq", eb);
        if (!rc) rc = s_upload_qmat(g, &D->wk, &S->wk, "wk", eb);
        if (!rc) rc = s_upload_qmat(g, &D->wv, &S->wv, "wv", eb);
        if (!rc) rc = s_upload_qmat(g, &D->wo, &S->wo, "wo", eb);
        if (rc) break;
        if (c->layer_sparse[l]) {
            rc = s_upload_qmat(g, &D->router, &S->router, "router", eb);
            if (!rc && c->router_bias) rc = s_upload_f32(g, &D->router_b, S->router_b, E, "router bias", eb);
            /* the experts' biases stay resident for every expert, wherever its weights are */
            D->mo = (cuda_moe_opts_t){.clamped = c->ffn_act == FFN_ACT_GPT_OSS, .limit = c->act_limit,
                                      .alpha = c->act_alpha};
            if (!rc && c->expert_bias) rc = s_upload_f32(g, (float **)&D->mo.gate_bias, S->egate_b, E * I, "gate biases", eb);
            if (!rc && c->expert_bias) rc = s_upload_f32(g, (float **)&D->mo.up_bias, S->eup_b, E * I, "up biases", eb);
            if (!rc && c->expert_bias) rc = s_upload_f32(g, (float **)&D->mo.down_bias, S->edown_b, E * H, "down biases", eb);
            if (!rc && c->shared_inter > 0) rc = s_upload_ffn(g, &D->shared, &S->shared, "shared expert", eb);
            if (!rc && c->shared_inter > 0) rc = s_upload_qmat(g, &D->shared_gate, &S->shared_gate, "shared gate", eb);
            if (!rc)
                rc = s_dalloc(g, (void **)&D->table_dev, (size_t)c->n_experts * sizeof(cuda_expert_t), "expert table", eb);
            if (cuda_host_alloc((void **)&D->table_host, (size_t)c->n_experts * sizeof(cuda_expert_t)))
                return strata_seterr(eb, STRATA_ENOMEM, "gpu: out of host memory");
        } else {
            rc = s_upload_ffn(g, &D->dense, &S->dense, "dense mlp", eb);
        }
    }
    return rc;
}

static int s_create_workspace(gpu_model_t *g, strata_errbuf_t *eb)
{
    const model_config_t *c = &g->m->cfg;
    size_t T = (size_t)g->o.max_tokens, H = (size_t)c->hidden;
    size_t qd = (size_t)c->n_heads * c->head_dim, kd = (size_t)c->n_kv_heads * c->head_dim;
    size_t ne = c->n_experts > 0 ? (size_t)c->n_experts : 1, tk = c->top_k > 0 ? (size_t)c->top_k : 1;
    size_t D = g->depth > 0 ? (size_t)g->depth : 1; /* predictions: D layers per token */
    g->pred_cap = (int32_t)D;
    /* a mailbox: its count, then (address, word) pairs for every word of every expert's entry */
    const size_t box_n = 2 + 2 * ne * (sizeof(cuda_expert_t) / 8);
    /* positions, sequences, logit rows and block tables: one buffer (d_pos, staged in h_meta);
     * + 2: gpu_step.c's s_put_meta's last 64-bit word */
    const size_t meta_bytes = ((3 + (size_t)g->bt_stride) * T + 2) * 4;
    const size_t moe_bytes = c->n_experts > 0 ? cuda_moe_scratch_bytes((int)T, c->top_k, c->hidden, g->inter, c->n_experts) : 0;
    size_t mi = 0;
    for (int l = 0; l < c->n_layers; l++) {
        const layer_t *S = &g->m->layers[l];
        if (c->layer_sparse[l] && c->shared_inter > 0 && (size_t)S->shared.gate.rows > mi) mi = S->shared.gate.rows;
        if (!c->layer_sparse[l] && (size_t)S->dense.gate.rows > mi) mi = S->dense.gate.rows;
    }
    int64_t before = g->used;
    int rc = 0;
#define WS(ptr, bytes) \
    if (!rc) rc = s_dalloc(g, (void **)&g->ptr, (bytes), "workspace " #ptr, eb)
    WS(x, T * H * 4);
    WS(xn, T * H * 4);
    WS(q, T * qd * 4);
    WS(k, T * kd * 4);
    WS(v, T * kd * 4);
    WS(att, T * qd * 4);
    WS(y, T * H * 4);
    WS(xl, T * H * 4);
    WS(rlog, T * ne * 4);
    WS(prlog, T * D * ne * 4);
    WS(tw, T * tk * 4);
    WS(ptw, T * D * tk * 4);
    WS(tidx, T * tk * 4);
    WS(ptidx, T * D * tk * 4);
    WS(sg, T * 4);
    WS(ffn_scr, 3 * T * (mi ? mi : 1) * 4);
    WS(logits, T * (size_t)c->vocab * 4);
    WS(d_pos, meta_bytes);
    if (!rc) g->d_seq = g->d_pos + T, g->d_rows = g->d_pos + 2 * T, g->d_bt = g->d_pos + 3 * T;
    WS(d_ids, T * 4);
    WS(d_tok, T * 4);
    WS(d_samp, T * sizeof(cuda_sample_param_t));
    if (c->n_experts > 0) WS(moe_scr, moe_bytes);
#undef WS
    /* the MoE scratch holds nothing from one matmul to the next but a routing (one token) or
     * the experts' heads (gpu_step.c's s_early), and no matmul runs then: the GEMM keeps its k parts there */
    if (!rc && g->moe_scr) cuda_ctx_lend_parts(g->cx, g->moe_scr, moe_bytes);
    {
        /* int8 activations for INT4/INT8 matmuls: the widest input is hidden, q or an MLP */
        int wide = c->hidden > (int)qd ? c->hidden : (int)qd;
        if ((int)mi > wide) wide = (int)mi;
        size_t qb = cuda_q8_bytes((int)T, wide);
        if (!rc && g->budget > 0 && g->used + (int64_t)qb > g->budget)
            rc = strata_seterr(eb, STRATA_ETOOLARGE, "gpu: int8 activation workspace needs %zu bytes beyond --gpu-mem", qb);
        if (!rc && (rc = cuda_ctx_reserve_q8(g->cx, (int)T, wide)))
            strata_seterr(eb, rc, "gpu: int8 activation workspace failed");
        if (!rc) g->used += (int64_t)qb;
    }
    g->st.workspace_bytes = g->used - before;
    if (rc) return rc;
    if (cuda_host_alloc((void **)&g->h_x, T * H * 4) || cuda_host_alloc((void **)&g->h_meta, meta_bytes) ||
        cuda_host_alloc((void **)&g->h_ids, T * 4) || cuda_host_alloc((void **)&g->h_tok, T * 4) ||
        cuda_host_alloc((void **)&g->h_idx, GPU_RING * T * tk * 4) ||
        cuda_host_alloc((void **)&g->h_pidx, GPU_RING * T * D * tk * 4) ||
        cuda_host_alloc((void **)&g->h_box, GPU_RING * box_n * 8) ||
        cuda_host_alloc((void **)&g->h_samp, T * sizeof(cuda_sample_param_t)))
        return strata_seterr(eb, STRATA_ENOMEM, "gpu: pinned host staging failed");
    g->h_bt = g->h_meta + 3 * T;
    /* gpu_step.c's s_put_meta sends what differs from dev_meta: the two start equal */
    g->dev_meta = calloc(meta_bytes, 1);
    if (!g->dev_meta) return strata_seterr(eb, STRATA_ENOMEM, "gpu: out of host memory");
    memset(g->h_meta, 0, meta_bytes);
    if (cuda_memset(g->cx, g->d_pos, 0, meta_bytes))
        return strata_seterr(eb, STRATA_ECUDA, "gpu: clearing the step's inputs failed");
    g->idx_n = T * tk;
    g->pidx_n = T * D * tk;
    g->box_n = box_n;
    memset(g->h_box, 0, GPU_RING * box_n * 8);
    g->patch_dst = malloc(sizeof *g->patch_dst * (box_n / 2));
    g->patch_val = malloc(sizeof *g->patch_val * (box_n / 2));
    if (!g->patch_dst || !g->patch_val) return strata_seterr(eb, STRATA_ENOMEM, "gpu: out of host memory");
    return 0;
}

/* How many expert slots the budget leaves: at most one per expert, GPU_SLOT_MARGIN kept free
 * unless that leaves less than one layer's worth. */
static int64_t s_slot_count(const gpu_model_t *g)
{
    const int E = g->m->cfg.n_experts;
    int64_t left = g->budget > 0 ? g->budget - g->used : INT64_MAX;
    int64_t n = g->budget > 0 ? (left - GPU_SLOT_MARGIN) / (int64_t)g->expert_bytes : g->n_total;
    if (g->budget > 0 && n < E) n = left / (int64_t)g->expert_bytes; /* too tight for the margin */
    return n > g->n_total ? g->n_total : n;
}

/* Split experts. When whole-expert slots cannot hold every expert, a whole expert that a layer
 * needs (Mixtral int4: 99 MB, 1.8 ms at 55 GB/s) cannot hide behind that layer's ~0.1 ms of
 * compute, and the gates predict poorly as far ahead as it would take. Instead every expert
 * stays resident but the last rows of its down projection, its tail (rows split.., split a
 * multiple of 128, the GEMM's row tile), and the slots cache tails. A step moves about the same
 * bytes (the experts' share that is not resident, times the routed fraction), but as a few MB
 * that every layer needs, which the prediction of the next layer hides behind compute. The
 * smallest tails that leave 2 x n_experts tail slots (one layer's routing and the next ones'
 * prefetch): under uniform routing every choice moves the same bytes a step, and smaller
 * tails land sooner. Sets the split layout; returns the tail slots, or 0 when none fits (whole
 * experts stay). */
static int64_t s_split_plan(gpu_model_t *g, const ffn_t *e0)
{
    const qmat_t *d = &e0->down;
    const int64_t E = g->m->cfg.n_experts, want = 2 * E < g->n_total ? 2 * E : g->n_total;
    if (g->budget <= 0 || d->rows < 256) return 0;
    const uint8_t *p[6];
    size_t n[6];
    gslots_pieces(e0, p, n);
    const size_t dr = qmat_data_bytes(d->fmt, 1, d->cols), sr = d->scales ? qmat_scale_bytes(d->fmt, 1, d->cols, d->group) : 0;
    const int64_t left = g->budget - g->used - GPU_SLOT_MARGIN;
    for (int split = (d->rows - 1) / 128 * 128; split >= 128; split -= 128) {
        const size_t rest = (size_t)(d->rows - split);
        n[4] = split * dr, n[5] = split * sr;
        const int64_t head = (int64_t)gslots_layout(n, g->hoff);
        const int64_t tail = (int64_t)(ALIGN256(rest * dr) + ALIGN256(rest * sr));
        if (g->n_total * head + want * tail > left) continue;
        g->split = split;
        g->d_row = dr, g->ds_row = sr;
        g->head_bytes = (size_t)head;
        g->tail_data = rest * dr;
        g->copy_bytes = rest * (dr + sr);
        g->slot_bytes = (size_t)tail;
        int64_t t = (left - g->n_total * head) / tail;
        return t < g->n_total ? t : g->n_total;
    }
    return 0;
}

/* The prefetch prediction: every MoE layer's router, dequantized to f32 with its ffn_norm
 * weights folded into the columns, stacked in layer order so that the next D layers' gates are
 * one contiguous [D * n_experts][hidden] matrix; and the all-ones norm weight. */
static int s_create_prediction(gpu_model_t *g, strata_errbuf_t *eb)
{
    const model_config_t *c = &g->m->cfg;
    const size_t E = (size_t)c->n_experts, H = (size_t)c->hidden;
    float *h = malloc(sizeof(float) * (size_t)g->xc.n_moe * E * H);
    if (!h) return strata_seterr(eb, STRATA_ENOMEM, "gpu: out of host memory for the prediction routers");
    for (int o = 0; o < g->xc.n_moe; o++) {
        const layer_t *S = &g->m->layers[g->xc.moe_layer[o]];
        for (size_t e = 0; e < E; e++) {
            float *r = h + ((size_t)o * E + e) * H;
            qmat_dequant_row(&S->router, (int32_t)e, r);
            for (size_t i = 0; i < H; i++) r[i] *= S->ffn_norm[i];
        }
    }
    int rc = s_upload(g, (void **)&g->pred_router, h, sizeof(float) * (size_t)g->xc.n_moe * E * H, "prediction routers", eb);
    if (!rc && c->router_bias) { /* their biases, stacked the same way */
        for (int o = 0; o < g->xc.n_moe; o++) memcpy(h + (size_t)o * E, g->m->layers[g->xc.moe_layer[o]].router_b, E * 4);
        rc = s_upload(g, (void **)&g->pred_bias, h, sizeof(float) * (size_t)g->xc.n_moe * E, "prediction biases", eb);
    }
    for (size_t i = 0; i < H; i++) h[i] = 1.0f;
    if (!rc) rc = s_upload(g, (void **)&g->ones, h, sizeof(float) * H, "prediction norm", eb);
    free(h);
    return rc;
}

typedef struct {
    uintptr_t lo, hi;
} s_range_t;

static int s_range_cmp(const void *a, const void *b)
{
    const s_range_t *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* With an expert cache, steps look their rows up on the GPU (gpu_step.c's s_stage), in the
 * embedding where it sits in host memory: page-locked (read over PCIe, a few KB a step; on the
 * GPU it would take the slots of 64 tails at Mixtral's size), or, where that fails (its pages
 * overlap the experts' locked ranges), a pinned copy. Neither (or an embedding with scales):
 * steps embed on the host, none is chained. */
static void s_map_embed(gpu_model_t *g)
{
    const qmat_t *E = &g->m->embed;
    void *dev = NULL;
    if (!E->data || E->scales || cuda_event_create(&g->ev_ids) || cuda_event_create(&g->ev_picked)) return;
    const size_t bytes = qmat_data_bytes(E->fmt, E->rows, E->cols);
    const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE), lo = (uintptr_t)E->data & ~(pg - 1),
                    hi = ((uintptr_t)E->data + bytes + pg - 1) & ~(pg - 1);
    if (!cuda_host_register((void *)lo, hi - lo)) {
        g->embed_lock = (void *)lo;
        g->st.host_locked_bytes += (int64_t)(hi - lo);
        if (cuda_host_device_ptr(E->data, &dev)) dev = NULL;
    } else if (!cuda_host_alloc(&g->embed_copy, bytes)) {
        memcpy(g->embed_copy, E->data, bytes);
        if (cuda_host_device_ptr(g->embed_copy, &dev)) dev = NULL;
    }
    g->embed_dev = *E;
    g->embed_dev.data = dev;
    if (!dev) log_warn("gpu: the embedding is not readable by the GPU: each step embeds on the host after the one before");
}

/* Page-lock the experts' spans of the model's memory (merged into ranges of whole pages), so
 * copies DMA straight from it: no pinned copy of every expert. 0, or <0 with nothing left
 * locked (the caller falls back to the pinned copy). */
static int s_lock_spans(gpu_model_t *g)
{
    const model_config_t *c = &g->m->cfg;
    const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    s_range_t *r = malloc(sizeof *r * (size_t)g->n_total);
    if (!r) return STRATA_ENOMEM;
    int n = 0, rc = 0;
    for (int l = 0; l < c->n_layers; l++)
        for (int e = 0; c->layer_sparse[l] && e < c->n_experts; e++) {
            uintptr_t lo = (uintptr_t)gslots_span_start(g, &g->m->layers[l].experts[e]);
            r[n++] = (s_range_t){lo & ~(pg - 1), (lo + g->span_bytes + pg - 1) & ~(pg - 1)};
        }
    qsort(r, (size_t)n, sizeof *r, s_range_cmp);
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (m && r[i].lo <= r[m - 1].hi) {
            if (r[i].hi > r[m - 1].hi) r[m - 1].hi = r[i].hi;
        } else {
            r[m++] = r[i];
        }
    }
    g->locked = calloc((size_t)m, sizeof *g->locked);
    for (int i = 0; i < m && !rc && g->locked; i++) {
        if ((rc = cuda_host_register((void *)r[i].lo, r[i].hi - r[i].lo))) break;
        g->locked[g->n_locked++] = (void *)r[i].lo;
        g->st.host_locked_bytes += (int64_t)(r[i].hi - r[i].lo);
    }
    if (!g->locked) rc = STRATA_ENOMEM;
    free(r);
    if (rc) {
        for (int i = 0; i < g->n_locked; i++) cuda_host_unregister(g->locked[i]);
        free(g->locked);
        g->locked = NULL;
        g->n_locked = 0;
        g->st.host_locked_bytes = 0;
    }
    return rc;
}

static int s_create_experts(gpu_model_t *g, strata_errbuf_t *eb)
{
    const model_t *m = g->m;
    const model_config_t *c = &m->cfg;
    int rc;
    int first = -1;
    for (int l = 0; l < c->n_layers; l++)
        if (c->layer_sparse[l]) {
            if (first < 0) first = l;
            g->n_total += c->n_experts;
        }
    if (first < 0) {
        g->all_resident = true;
        return 0;
    }
    const ffn_t *e0 = &m->layers[first].experts[0];
    g->expert_fmt = e0->gate.fmt;
    g->inter = e0->gate.rows;
    gslots_expert_layout(g, e0);
    for (int l = 0; l < c->n_layers; l++) {
        if (!c->layer_sparse[l]) continue;
        for (int e = 0; e < c->n_experts; e++) {
            const ffn_t *x = &m->layers[l].experts[e];
            if (x->gate.fmt != g->expert_fmt || x->up.fmt != g->expert_fmt || x->down.fmt != g->expert_fmt ||
                x->gate.rows != g->inter || x->gate.group != e0->gate.group || x->down.group != e0->down.group)
                return strata_seterr(eb, STRATA_EUNSUPPORTED,
                                     "gpu: layer %d expert %d differs in format or shape from the others", l, e);
        }
    }
    gslots_span_layout(g);
    /* What the device really lost so far (the driver rounds small allocations up and keeps its
     * own pieces) is charged when it exceeds the requested bytes, and the slots keep
     * GPU_SLOT_MARGIN spare, so that nvidia-smi stays within --gpu-mem plus the CUDA context. */
    {
        size_t fr = 0, tot = 0;
        if (g->free0 && cuda_mem_info(&fr, &tot) == 0 && g->free0 > fr && (int64_t)(g->free0 - fr) > g->used)
            g->used = (int64_t)(g->free0 - fr);
    }
    /* slots: whatever the budget leaves, at most one per expert, at least one layer's worth */
    int64_t n = s_slot_count(g);
    if (n < g->n_total && g->depth > 0) {
        /* a cache: the prediction stack takes its bytes first, if a layer's worth of slots is left */
        int64_t pb = (int64_t)(ALIGN256(sizeof(float) * (size_t)g->xc.n_moe * c->n_experts * c->hidden) +
                               ALIGN256(sizeof(float) * (size_t)c->hidden));
        g->used += pb;
        int64_t n2 = s_slot_count(g);
        g->used -= pb;
        if (n2 >= c->n_experts) {
            if ((rc = s_create_prediction(g, eb))) return rc;
            n = s_slot_count(g);
        } else {
            log_warn("gpu: --gpu-mem leaves no room for the prefetch prediction (%.1f MB); prefetch is off", pb / 1e6);
            g->depth = 0;
        }
    }
    g->slot_bytes = g->expert_bytes;
    if (n < g->n_total && g->o.split_experts) {
        int64_t t = s_split_plan(g, e0);
        if (t > 0) {
            n = t;
            rc = s_dalloc(g, (void **)&g->heads_dev, (size_t)g->n_total * g->head_bytes, "expert heads", eb);
            if (rc) return rc;
        }
    }
    if (n < c->n_experts)
        return strata_seterr(eb, STRATA_ETOOLARGE,
                             "gpu: --gpu-mem %lld leaves room for %lld expert slots of %zu bytes; one layer needs %d",
                             (long long)g->budget, (long long)(n < 0 ? 0 : n), g->expert_bytes, c->n_experts);
    g->n_slots = (int32_t)n;
    g->all_resident = !g->split && g->n_slots == g->n_total;
    if ((rc = s_dalloc(g, (void **)&g->slots_dev, (size_t)g->n_slots * g->slot_bytes, "expert slots", eb))) return rc;
    g->st.slot_bytes_total = (int64_t)g->n_slots * (int64_t)g->slot_bytes + (int64_t)g->n_total * (int64_t)g->head_bytes;
    g->st.slots = g->n_slots;
    g->st.experts_on_gpu = g->n_slots;
    if (g->split) {
        const uint8_t *p[6];
        size_t pn[6], full = 0;
        gslots_pieces(e0, p, pn);
        for (int i = 0; i < 6; i++) full += pn[i];
        const size_t head = full - g->copy_bytes;
        g->st.experts_on_gpu = ((double)g->n_total * head + (double)g->n_slots * g->copy_bytes) / full;
        g->st.split_rows = g->split;
    }
    g->ev = calloc((size_t)g->n_slots, sizeof *g->ev);
    if (!g->ev || xcache_set_slots(&g->xc, g->n_slots) < 0)
        return strata_seterr(eb, STRATA_ENOMEM, "gpu: out of host memory");
    g->xc.landed = gslots_landed;
    g->xc.ctx = g;
    for (int s = 0; s < g->n_slots; s++)
        if ((rc = cuda_event_create(&g->ev[s]))) return strata_seterr(eb, rc, "gpu: event creation failed");
    uint8_t *stage = NULL;
    if (g->split) {
        size_t total = (size_t)g->n_total * g->slot_bytes;
        if ((rc = cuda_host_alloc((void **)&g->host_tails, total)))
            return strata_seterr(eb, rc, "gpu: pinned host copy of the expert tails (%zu bytes) failed", total);
        g->st.host_locked_bytes = (int64_t)total;
        log_info("gpu: staging %.2f GB of expert tails in pinned host memory", total / 1e9);
    } else if (!g->all_resident && g->span_layout) {
        double t0 = strata_now();
        g->st.from_model = s_lock_spans(g) == 0;
        if (g->st.from_model)
            log_info("gpu: copies read the model's memory, %.2f GB page-locked in %d ranges (%.1f s)",
                     g->st.host_locked_bytes / 1e9, g->n_locked, strata_now() - t0);
        else
            log_warn("gpu: page-locking the model's expert memory failed; staging a pinned copy instead");
    }
    if (!g->all_resident && !g->split && !g->st.from_model) {
        size_t total = (size_t)c->n_layers * c->n_experts * g->expert_bytes;
        if ((rc = cuda_host_alloc((void **)&g->host_experts, total)))
            return strata_seterr(eb, rc, "gpu: pinned host copy of the experts (%zu bytes) failed", total);
        g->st.host_locked_bytes = (int64_t)total;
        log_info("gpu: staging %.2f GB of experts in pinned host memory", total / 1e9);
    } else if (g->all_resident && (rc = cuda_host_alloc((void **)&stage, g->expert_bytes))) {
        return strata_seterr(eb, rc, "gpu: pinned staging failed");
    }
    /* fill: pinned copies of every expert (none when copies read the model's memory; split:
     * every head to the GPU and every tail staged); the first n_slots go to the GPU in layer
     * order */
    int s = 0;
    for (int l = 0; l < c->n_layers; l++) {
        if (!c->layer_sparse[l]) continue;
        for (int e = 0; e < c->n_experts; e++) {
            const uint8_t *h = g->split ? NULL : g->all_resident ? stage : gslots_host_expert(g, l, e);
            if (g->split) rc = gslots_split_upload(g, l, e);
            else if (!g->st.from_model) gslots_expert_pack(g, (uint8_t *)h, &m->layers[l].experts[e]);
            if (rc) break;
            if (s < g->n_slots) {
                xcache_assign(&g->xc, s, l, e);
                g->xc.slot[s].state = XC_READY;
                if (g->all_resident) rc = cuda_h2d(g->cx, g->slots_dev + (size_t)s * g->slot_bytes, h, g->copy_bytes);
                else rc = gslots_fill(g, s, l, e, CUDA_STREAM_COMPUTE);
                if (rc || (g->all_resident && (rc = cuda_sync(g->cx)))) break; /* stage is reused */
                s++;
            }
        }
        if (rc) break;
        glayer_t *L = &g->L[l];
        for (int e = 0; e < c->n_experts; e++) {
            int si = g->xc.slot_of[(size_t)l * c->n_experts + e];
            /* split: every head is resident, so every entry holds its head from the start (the
             * heads compute before the host patches a routed expert's entry: gpu_step.c's
             * s_early); a tail without a slot is read from host memory. Whole experts: none, gate
             * NULL. */
            L->table_host[e] = si >= 0 || g->split ? gslots_expert_at(g, l, e, si) : (cuda_expert_t){0};
        }
        if (!rc) rc = cuda_h2d(g->cx, L->table_dev, L->table_host, (size_t)c->n_experts * sizeof(cuda_expert_t));
    }
    cuda_sync(g->cx);
    cuda_host_free(stage);
    return rc ? strata_seterr(eb, rc, "gpu: expert upload failed") : 0;
}

/* cuBLAS for prefill-sized dense matmuls (cuda_ctx_enable_blas), with a scratch for the
 * largest dense matrix but the LM head (a prefill asks it for a row or a few), charged to the
 * budget by what the device lost. Left out, with a note, when a step never has the rows, the
 * budget has no room or cuBLAS fails: the tensor-core GEMM takes those matmuls. */
static void s_enable_blas(gpu_model_t *g)
{
    const model_config_t *c = &g->m->cfg;
    if (g->o.max_tokens < CUDA_BLAS_MIN_ROWS) return;
    size_t elems = 0;
    for (int l = 0; l < c->n_layers; l++) {
        const glayer_t *L = &g->L[l];
        const qmat_t *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->shared.gate, &L->shared.up, &L->shared.down,
                              &L->dense.gate, &L->dense.up, &L->dense.down};
        for (size_t i = 0; i < sizeof ws / sizeof *ws; i++)
            if (ws[i]->data && (size_t)ws[i]->rows * ws[i]->cols > elems) elems = (size_t)ws[i]->rows * ws[i]->cols;
    }
    /* the scratch, cuBLAS's workspace (32 MiB) and what its handle and kernels take */
    const int64_t want = (int64_t)elems * 2 + ((int64_t)96 << 20);
    if (!elems || (g->budget > 0 && g->used + want + GPU_SLOT_MARGIN > g->budget)) {
        if (elems) log_info("gpu: no cuBLAS for prefill: it needs about %.0f MB beyond --gpu-mem", want / 1e6);
        return;
    }
    size_t f0 = 0, f1 = 0, tot;
    if (cuda_mem_info(&f0, &tot)) f0 = 0;
    if (cuda_ctx_enable_blas(g->cx, elems)) {
        log_warn("gpu: cuBLAS unavailable; prefill matmuls take the tensor-core GEMM");
        return;
    }
    if (f0 && !cuda_mem_info(&f1, &tot) && f0 > f1) {
        g->used += (int64_t)(f0 - f1);
        g->st.workspace_bytes += (int64_t)(f0 - f1);
    }
}

/* The CPU-expert path's buffers and rates (gpu_cpu.c), when o.remote is set and the cache holds
 * whole experts (split experts keep every head resident: their misses are tails, read or
 * copied in microseconds). */
static int s_create_cpu(gpu_model_t *g, strata_errbuf_t *eb)
{
    const model_config_t *c = &g->m->cfg;
    const moe_remote_t *r = g->o.remote;
    if (!r || g->split || g->all_resident || c->n_experts <= 0) return 0;
    if (r->n_dest > GPU_CPU_DEST)
        return strata_seterr(eb, STRATA_EINVAL_INPUT, "gpu: %d prefetchers for CPU experts, at most %d", r->n_dest,
                             GPU_CPU_DEST);
    const size_t R = GPU_CPU_ROWS, H = (size_t)c->hidden, K = (size_t)c->top_k;
    int max_inter = g->inter;
    if (cuda_host_alloc((void **)&g->h_xn, R * H * 4) || cuda_host_alloc((void **)&g->h_tw, R * K * 4) ||
        cuda_host_alloc((void **)&g->h_xflag, GPU_RING * 8 * 8) ||
        cuda_host_alloc((void **)&g->h_cbox, GPU_RING * GPU_CPU_BOX * 8) || cuda_host_alloc((void **)&g->h_cy, R * H * 4))
        return strata_seterr(eb, STRATA_ENOMEM, "gpu: pinned host staging for CPU experts failed");
    g->cpu_fy = malloc(R * K * H * 4);
    g->cpu_scr = malloc(2 * R * K * (size_t)max_inter * 4);
    g->cpu_dest = malloc((size_t)c->n_experts);
    g->cpu_cnt = calloc((size_t)c->n_experts, sizeof *g->cpu_cnt);
    g->cpu_row = malloc(R * K * sizeof *g->cpu_row);
    if (!g->cpu_fy || !g->cpu_scr || !g->cpu_dest || !g->cpu_cnt || !g->cpu_row) return strata_seterr(eb, STRATA_ENOMEM, "gpu: out of host memory");
    memset(g->cpu_dest, -1, (size_t)c->n_experts);
    memset(g->h_xflag, 0, GPU_RING * 8 * 8);
    memset(g->h_cbox, 0, GPU_RING * GPU_CPU_BOX * 8);
    if (g->o.cpu_policy == GPU_CPU_STATIC) {
        /* the layers the slots leave out, first ones first, as llama.cpp's --n-cpu-moe */
        int n = g->o.cpu_layers > 0 ? g->o.cpu_layers : g->xc.n_moe - g->n_slots / c->n_experts;
        g->cpu_static = n < 0 ? 0 : n > g->xc.n_moe ? g->xc.n_moe : n;
        g->st.cpu_layers = g->cpu_static;
    }
    g->cpu_on = true;
    int rc = gcpu_probe(g);
    if (rc) return strata_seterr(eb, rc, "gpu: probing the copy rate for the CPU experts' cost model failed");
    log_info("gpu: CPU experts on %d prefetcher(s), %s; PCIe %.1f GB/s", r->n_dest,
             g->o.cpu_policy == GPU_CPU_ALL      ? "every miss"
             : g->o.cpu_policy == GPU_CPU_STATIC ? "static placement"
                                                 : "cost model",
             1e-3 / g->pcie_us_b);
    if (g->o.cpu_policy == GPU_CPU_STATIC)
        log_info("gpu: static placement: the first %d of %d MoE layers' experts on the CPU", g->cpu_static, g->xc.n_moe);
    return 0;
}

int gpu_model_create(gpu_model_t **out, const model_t *m, const gpu_opts_t *o, strata_errbuf_t *eb)
{
    const model_config_t *c = &m->cfg;
    int rc;
    if (o->max_tokens <= 0 || o->kv_blocks <= 0 || o->block_size <= 0)
        return strata_seterr(eb, STRATA_EINVAL_INPUT, "gpu: max_tokens, kv_blocks and block_size must be positive");
    if (cuda_device_count() <= o->device)
        return strata_seterr(eb, STRATA_EUNSUPPORTED, "gpu: no CUDA device %d (found %d)", o->device, cuda_device_count());
    gpu_model_t *g = calloc(1, sizeof *g);
    if (!g) return strata_seterr(eb, STRATA_ENOMEM, "gpu: out of host memory");
    g->m = m;
    g->o = *o;
    g->budget = o->gpu_mem;
    if ((rc = cuda_ctx_create(&g->cx, o->device))) {
        strata_seterr(eb, rc, "gpu: CUDA context on device %d failed", o->device);
        goto fail;
    }
    {
        size_t tot = 0;
        if (cuda_mem_info(&g->free0, &tot)) g->free0 = 0;
    }
    /* The expert shape is needed to size the MoE scratch: read it before the workspace. */
    for (int l = 0; l < c->n_layers; l++)
        if (c->layer_sparse[l]) {
            g->inter = m->layers[l].experts[0].gate.rows;
            break;
        }
    if ((rc = s_create_layers(g, eb))) goto fail;
    g->depth = o->prefetch_depth < 0 ? GPU_DEPTH_WHOLE : o->prefetch_depth;
    if (g->depth > g->xc.n_moe - 1) g->depth = g->xc.n_moe - 1;
    if (g->depth < 0) g->depth = 0;
    if ((rc = s_upload_f32(g, &g->final_norm, m->final_norm, (size_t)c->hidden, "final_norm", eb))) goto fail;
    if ((rc = s_upload_f32(g, &g->inv_freq, c->inv_freq, 512, "inv_freq", eb))) goto fail;
    if ((rc = s_upload_qmat(g, &g->lm_head, &m->lm_head, "lm_head", eb))) goto fail;
    g->st.resident_bytes = g->used;
    g->layer_elems = (size_t)o->kv_blocks * c->n_kv_heads * o->block_size * c->head_dim;
    g->win = model_sliding_window(c) > 0;
    g->bt_stride = o->kv_blocks * (g->win ? 2 : 1);
    if ((rc = s_dalloc(g, (void **)&g->k_cache, g->layer_elems * c->n_layers * 4, "KV cache (k)", eb))) goto fail;
    if ((rc = s_dalloc(g, (void **)&g->v_cache, g->layer_elems * c->n_layers * 4, "KV cache (v)", eb))) goto fail;
    g->st.kv_bytes = (int64_t)(2 * g->layer_elems * c->n_layers * 4);
    /* llama.cpp's placement prefetches nothing: the CPU layers' experts never enter a slot */
    if (o->remote && o->cpu_policy == GPU_CPU_STATIC) g->depth = 0;
    if ((rc = s_create_workspace(g, eb))) goto fail;
    if ((rc = s_create_experts(g, eb))) goto fail;
    if ((rc = s_create_cpu(g, eb))) goto fail;
    if (!g->all_resident) s_map_embed(g);
    if (g->all_resident && o->blas) s_enable_blas(g);
    g->n_seg = g->all_resident ? 1 : g->xc.n_moe + 1;
    g->graphs = calloc((size_t)GPU_MAX_GRAPHS * g->n_seg, sizeof *g->graphs);
    if (!g->graphs) {
        rc = strata_seterr(eb, STRATA_ENOMEM, "gpu: out of host memory");
        goto fail;
    }
    g->st.n_experts_total = g->n_total;
    /* split: one layer's tails at batch 1 (one on the link, one queued behind it on the other
     * copy stream), so a layer two ahead is copied on the prediction of the layer before it
     * when the link is the bottleneck. strata bench 24 GiB batch 1, alternating runs: 197.4
     * and 198.9 tok/s against 194.2 and 191.7 with two layers' tails (4); with more than one
     * DMA a tail: 2 162.2, 4 164.7, 6 163.0 */
    g->max_inflight = g->split ? c->top_k : GPU_MAX_INFLIGHT;
    if (g->split && o->prefetch_depth < 0 && g->depth > GPU_DEPTH_SPLIT) g->depth = GPU_DEPTH_SPLIT;

    g->st.budget_used = g->used;
    char slots[192];
    if (g->split)
        snprintf(slots, sizeof slots,
                 "every expert's head (all but down rows %d..) %.2f MB x %d, %d tail slots x %.2f MB (%.2f experts' "
                 "worth of %d)",
                 g->split, g->head_bytes / 1e6, g->n_total, g->n_slots, g->slot_bytes / 1e6, g->st.experts_on_gpu,
                 g->n_total);
    else
        snprintf(slots, sizeof slots, "%d expert slots x %.2f MB (%s)", g->n_slots, g->expert_bytes / 1e6,
                 g->all_resident ? "all resident" : "cached");
    log_info("gpu: resident %.1f MB, KV %.1f MB, workspace %.1f MB, %s, budget %.1f of %s MB", g->st.resident_bytes / 1e6,
             g->st.kv_bytes / 1e6, g->st.workspace_bytes / 1e6, slots, g->used / 1e6,
             g->budget ? "--gpu-mem" : "unbounded");
    *out = g;
    return 0;
fail:
    gpu_model_free(g);
    return rc;
}

void gpu_get_stats(const gpu_model_t *g, gpu_stats_t *st) { *st = g->st; }

int gpu_get_layer_stats(const gpu_model_t *g, gpu_layer_stats_t *out, int max)
{
    int n = g->m->cfg.n_layers < max ? g->m->cfg.n_layers : max;
    if (out && n > 0) memcpy(out, g->lst, sizeof *out * (size_t)n);
    return g->m->cfg.n_layers;
}

void gpu_reset_stats(gpu_model_t *g)
{
    gpu_stats_t keep = g->st;
    memset(&g->st, 0, sizeof g->st);
    memset(g->lst, 0, sizeof *g->lst * (size_t)g->m->cfg.n_layers);
    g->st.slots = keep.slots;
    g->st.experts_on_gpu = keep.experts_on_gpu;
    g->st.n_experts_total = keep.n_experts_total;
    g->st.resident_bytes = keep.resident_bytes;
    g->st.kv_bytes = keep.kv_bytes;
    g->st.workspace_bytes = keep.workspace_bytes;
    g->st.slot_bytes_total = keep.slot_bytes_total;
    g->st.budget_used = keep.budget_used;
    g->st.host_locked_bytes = keep.host_locked_bytes;
    g->st.from_model = keep.from_model;
    g->st.split_rows = keep.split_rows;
    g->st.cpu_layers = keep.cpu_layers;
}
