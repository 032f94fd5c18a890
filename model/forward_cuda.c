/* forward_cuda.c - the model on one GPU under a memory budget, with an expert cache.
 *
 * Resident on the GPU: attention weights, norms, routers, shared experts, dense MLPs, the
 * final norm and the LM head. The embedding stays in host memory: with an expert cache it is
 * page-locked and the GPU looks a step's rows up there (s_map_embed), else a step looks them
 * up on the CPU and copies n x hidden floats. When the budget holds every expert, each sits in a
 * slot of its own. When it does not, by default every expert stays resident but the last rows
 * of its down projection, its tail, and slots cache the tails (split experts, s_split_plan:
 * a layer needs a few MB, which the prediction of the next layer hides behind compute, where a
 * whole expert it needed could not be hidden). The tails are staged once in pinned host memory
 * in slot layout, rows then scales (host_tails), so a copy is one DMA; and a step of up to
 * GPU_HOST_READ_ROWS tokens reads a tail that is neither resident nor in flight straight from
 * there, over PCIe, in the expert kernel (a host-read miss), instead of queueing a DMA behind
 * the prefetches on the copy engine. Else (gpu_opts_t.split_experts off, or no
 * split fits) slots cache whole experts. When every expert is one span of the model's memory
 * with the same layout (a packed model, the weight arena: s_span_layout), a whole-expert slot
 * holds that span as it is, and copies read the model's memory, page-locked (s_lock_spans);
 * else a slot is [gate.data|gate.scales|up.data|up.scales|down.data|down.scales], every piece
 * 256-byte aligned, and copies read a pinned copy of every expert in that layout.
 *
 * A step is one CUDA graph per decode size when every expert is resident. With fewer slots
 * than experts it is n_moe + 1 segments, each a graph too (s_segment): segment k ends with MoE
 * layer k's gate, and with the gates of the next prefetch_depth MoE layers applied to the
 * same hidden state (one GEMV over those layers' routers stacked, their ffn_norm folded in, on
 * the hidden state normalized once), both written to pinned host memory by the router's launch
 * itself. The window skips the layers whose experts are pinned (s_window_lo). Between
 * segments the host waits for the routing's picks to land (s_route: not for the stream, so the
 * prediction still running does not delay it), makes the routed experts resident, sends the
 * words of the layer's expert table that changed and enqueues the next segment (or, a
 * prelaunched step, whose next segment is enqueued already, fills its mailbox: s_run); then it
 * waits for the prediction's picks (s_predict) and starts copies of predicted experts that are
 * not resident, alternating
 * between two copy streams, nearest layer first and at most max_inflight at a time. The
 * compute stream waits on a copy's event only when a layer actually uses that expert; a routed
 * expert that is neither resident nor in flight loads on demand on the compute stream, ordered
 * before the expert kernel (or, a split tail in a small step, is read from host memory).
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
 *
 * Eviction safety: when layer L's routing has landed, every kernel up to layer L's gate has
 * completed (each kernel waits for the one before it, pdl_enter), and until the host enqueues
 * (or lets go, through its mailbox) the segment after layer L + 1's routing the GPU reads no
 * slot but those layer L routes to, so
 * any slot that layer L does not use and that is not in flight can be overwritten at once, by
 * either stream. Which one is store/xcache.h's decision (the expert
 * expected to be needed last, Belady's rule on average); a prefetch evicts only an expert
 * needed later than the one it brings.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/cpu/threadpool.h"
#include "kernels/cuda/cuda_sample.h"
#include "model/gpu.h"
#include "store/xcache.h"

#define ALIGN256(x) (((x) + 255) & ~(size_t)255)
#define GPU_MAX_GRAPHS 33 /* decode graphs keyed by n_tokens 1..32 */
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
/* a step of this many rows or more embeds them in GPU_EMBED_THREADS host threads */
#define GPU_EMBED_POOL_ROWS 64
#define GPU_EMBED_THREADS 4
/* Split experts: a step of up to this many tokens reads a missed tail from pinned host memory in
 * the expert kernels (the integer path, which reads a row once for all of a tile's tokens);
 * larger steps copy it (the GEMM would read it once per token tile, over PCIe). */
#define GPU_HOST_READ_ROWS 16
/* ring entries of the host's routing, prediction and mailbox buffers (by segment); a step keeps
 * at most 3 segments' in use (s_run) */
#define GPU_RING 4
/* segments a prelaunched step keeps enqueued beyond the one the host routes (s_advance) */
#define GPU_LEAD 1

typedef struct {
    float *attn_norm, *ffn_norm, *bq, *bk, *bv, *bo, *q_norm, *k_norm;
    qmat_t wq, wk, wv, wo, router, shared_gate;
    ffn_t shared, dense;
    cuda_expert_t *table_dev;   /* [n_experts] device pointers of resident experts */
    cuda_expert_t *table_host;  /* [n_experts] staging copy, pinned: its copy never waits on the stream */
} glayer_t;

struct gpu_model {
    const model_t *m;
    gpu_opts_t o;
    cuda_ctx_t *cx;
    int64_t budget, used;
    size_t free0;                /* device memory free once the context exists */
    void **allocs;               /* every device allocation, freed at the end */
    int n_allocs, cap_allocs;

    glayer_t *L;
    float *final_norm, *inv_freq;
    qmat_t lm_head;
    wfmt_t expert_fmt;
    int32_t inter;               /* expert intermediate size */

    /* paged KV: [layer][block][kv_head][block_size][head_dim] fp32 */
    float *k_cache, *v_cache;
    size_t layer_elems;

    /* workspace (device) */
    float *x, *xn, *q, *k, *v, *att, *y, *rlog, *tw, *sg, *ffn_scr, *xl, *logits, *prlog, *ptw;
    bool xn_q8;  /* s_ffn_pre left xn's int8 rows in the context's workspace for s_ffn_post */
    bool routed; /* and the gate's routing in moe_scr */
    bool att_tc; /* this step's attention on tensor cores (mostly prefill: runs of >= 16 rows) */
    bool pre_attn, pre_attn_q8; /* s_ffn_post normed x into xn for the next layer's attention
                                   (and left its int8 rows in the workspace) */
    int32_t *tidx, *ptidx, *d_pos, *d_seq, *d_bt, *d_rows, *d_ids;
    int32_t *d_tok;              /* [max_tokens] a step's tokens, for the lookup on the GPU (s_stage) */
    cuda_sample_param_t *d_samp; /* [max_tokens] a sampled step's parameters by logit row */
    void *moe_scr;
    /* host staging */
    float *h_x;                  /* [max_tokens][hidden] embedded rows */
    int32_t *h_bt;               /* [max_tokens][kv_blocks] flattened block tables (h_meta + 3 T) */
    int32_t *h_meta;             /* [3][max_tokens] positions, sequences, logit rows (d_pos, d_seq, d_rows),
                                    then h_bt (d_bt) */
    int32_t *h_ids;              /* [max_tokens] a chained step's picks (s_picks) */
    int32_t *h_tok;              /* [max_tokens] staging of d_tok */
    /* By segment k % GPU_RING, for the host to read without waiting for the stream (s_wait_rows):
     * the routing of segment k's gate, -1s until it lands; the prediction of the next layers;
     * and (prelaunched steps) the mailbox of the words of the gate's expert table that change
     * (cuda_wait_patch). */
    int32_t *h_idx, *h_pidx;     /* [GPU_RING][idx_n], [GPU_RING][pidx_n] */
    uint64_t *h_box;             /* [GPU_RING][box_n] */
    size_t idx_n, pidx_n, box_n;
    uint64_t **patch_dst, *patch_val; /* [n_experts * words of an entry]: s_ensure's changed words */
    bool step_pre;               /* the step in flight is prelaunched (s_prelaunch) */
    int32_t n_launched, n_routed; /* its segments enqueued, and routed by the host (s_route) */
    cuda_sample_param_t *h_samp; /* [max_tokens] staging of d_samp */
    tpool_t *embed_pool;         /* s_embed's threads, created by the first large step */

    /* expert cache */
    bool all_resident;
    int32_t n_slots, n_total;
    size_t expert_bytes, off[6]; /* an expert's host layout: gate, its scales, up, its scales, down, its scales */
    size_t copy_bytes;           /* what one copy into a slot moves: the expert's span, expert_bytes,
                                    or (split) a tail's rows and scales */
    size_t span_bytes;           /* span layout: an expert's span of the model's memory */
    size_t slot_bytes;           /* a slot's stride: expert_bytes, or (split) a tail's */
    /* split experts (s_split_plan): every expert resident but down's rows split.., its tail;
     * the slots cache tails. 0: slots hold whole experts */
    int32_t split;
    size_t d_row, ds_row;        /* bytes of one down row, of its scales */
    size_t head_bytes, hoff[6];  /* a head: gate, its scales, up, its scales, down rows < split, theirs */
    size_t tail_data;            /* a tail's down rows; their scales follow at ALIGN256(tail_data) */
    uint8_t *host_tails;         /* pinned [n_moe][n_experts][slot_bytes]: every tail in slot layout,
                                    what tail copies and host-read misses read */
    uint8_t *heads_dev;          /* [n_moe][n_experts][head_bytes] */
    bool span_layout;            /* a slot holds the expert's span of the model's memory as is */
    void **locked;               /* [n_locked] page-locked ranges of the model's memory */
    int n_locked;
    uint8_t *slots_dev;          /* [n_slots][slot_bytes] */
    xcache_t xc;                 /* the policy: what each slot holds, routing, prediction, victims */
    cuda_event_t **ev;           /* [n_slots] copy-stream event of the last prefetch into each slot */
    uint8_t *host_experts;       /* pinned [n_layers*n_experts][expert_bytes], NULL if all resident
                                    or st.from_model (copies read the model's memory) */
    int32_t depth;               /* prefetch window in MoE layers not pinned (0: no prediction) */
    int32_t pred_cap;            /* MoE layers a prediction's workspace holds, pinned ones included */
    int32_t max_inflight;        /* prefetch copies on the copy streams at once */
    uint32_t n_copies;           /* prefetch copies issued: even ones on CUDA_STREAM_COPY, odd on COPY2 */
    float *pred_router;          /* [n_moe][n_experts][hidden] f32 routers x ffn_norm, or NULL */
    float *ones;                 /* [hidden] 1.0: the unweighted RMSNorm for the prediction */
    gpu_layer_stats_t *lst;      /* [n_layers] */

    cuda_graph_t **graphs;       /* [GPU_MAX_GRAPHS][n_seg] decode graphs by n_tokens and segment */
    int32_t n_seg;               /* segments of a step: 1, or n_moe + 1 with a cache */
    int32_t graph_nlog[GPU_MAX_GRAPHS];
    int8_t graph_mode[GPU_MAX_GRAPHS]; /* s_mode_t its last segment was captured for */
    gpu_stats_t st;
    /* the step gpu_step_ahead started (ahead_n rows; 0: none) */
    int32_t ahead_n, ahead_nlog;
    int32_t ahead_tok[GPU_MAX_GRAPHS]; /* its tokens; its positions, sequences and logit rows are
                                          in h_meta, its block tables in h_bt, as s_stage left them */
    const batch_t *next;         /* gpu_set_next's guess, for the next step's s_picks */
    cuda_event_t *ev_picked;     /* a chained step's picks are made, */
    cuda_event_t *ev_ids;        /* and landed in h_ids */
    int32_t *dev_meta;           /* what d_pos.. holds: the h_meta that s_put_meta sent last */
    qmat_t embed_dev;            /* the embedding where the GPU reads it in host memory (s_map_embed);
                                    data NULL: no chained steps */
    void *embed_lock;            /* its page-locked range of the model's memory, or */
    void *embed_copy;            /* its pinned copy */
};

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
        return strata_seterr(eb, STRATA_ENOMEM, "gpu: %s needs %zu bytes but only %lld of --gpu-mem %lld are left", what,
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

/* ---- expert slots ---- */

/* The six pieces of expert e in host memory, in slot order: gate, its scales, up, its scales,
 * down, its scales (n[i] == 0: none). */
static void s_pieces(const ffn_t *e, const uint8_t *p[6], size_t n[6])
{
    const qmat_t *q[3] = {&e->gate, &e->up, &e->down};
    for (int i = 0; i < 3; i++) {
        p[2 * i] = q[i]->data;
        n[2 * i] = qmat_data_bytes(q[i]->fmt, q[i]->rows, q[i]->cols);
        p[2 * i + 1] = q[i]->scales;
        n[2 * i + 1] = q[i]->scales ? qmat_scale_bytes(q[i]->fmt, q[i]->rows, q[i]->cols, q[i]->group) : 0;
    }
}

/* Pieces of n[i] bytes laid out one after another, each 256-byte aligned: their offsets;
 * returns the total. */
static size_t s_layout(const size_t n[6], size_t off[6])
{
    size_t o = 0;
    for (int i = 0; i < 6; i++) {
        off[i] = o;
        o += ALIGN256(n[i]);
    }
    return o;
}

/* The slot layout of whole experts shaped as e. */
static void s_expert_layout(gpu_model_t *g, const ffn_t *e)
{
    const uint8_t *p[6];
    size_t n[6];
    s_pieces(e, p, n);
    g->expert_bytes = g->copy_bytes = s_layout(n, g->off);
}

/* The span layout: when every routed expert's pieces lie in one span of host memory, at the
 * same 16-byte aligned offsets from its start, and the span is not much more than the pieces
 * (a packed model, the weight arena), a slot holds the span as it is, so a copy is one DMA
 * straight from the model's memory. Else (pieces scattered, as an HF checkpoint loads) the
 * slot layout of s_expert_layout stays. */
static void s_span_layout(gpu_model_t *g)
{
    const model_config_t *c = &g->m->cfg;
    size_t off0[6] = {0}, span0 = 0;
    bool first = true;
    for (int l = 0; l < c->n_layers; l++) {
        if (!c->layer_sparse[l]) continue;
        for (int e = 0; e < c->n_experts; e++) {
            const uint8_t *p[6];
            size_t n[6], off[6];
            s_pieces(&g->m->layers[l].experts[e], p, n);
            uintptr_t lo = UINTPTR_MAX, hi = 0;
            for (int i = 0; i < 6; i++)
                if (n[i]) {
                    lo = (uintptr_t)p[i] < lo ? (uintptr_t)p[i] : lo;
                    hi = (uintptr_t)p[i] + n[i] > hi ? (uintptr_t)p[i] + n[i] : hi;
                }
            for (int i = 0; i < 6; i++) {
                off[i] = n[i] ? (uintptr_t)p[i] - lo : 0;
                if (off[i] % 16) return;
            }
            if (first) {
                memcpy(off0, off, sizeof off);
                span0 = hi - lo;
                first = false;
            } else if (memcmp(off, off0, sizeof off) || hi - lo != span0) {
                return;
            }
        }
    }
    if (first || span0 > g->expert_bytes + g->expert_bytes / 8) return;
    g->span_layout = true;
    memcpy(g->off, off0, sizeof off0);
    g->copy_bytes = g->span_bytes = span0;
    g->expert_bytes = ALIGN256(span0);
}

/* The start of expert e's bytes as a slot holds them (the span layout's span). */
static const uint8_t *s_span_start(const gpu_model_t *g, const ffn_t *e)
{
    return (const uint8_t *)e->gate.data - g->off[0];
}

/* Pack expert e into dst (host) in slot layout. */
static void s_expert_pack(const gpu_model_t *g, uint8_t *dst, const ffn_t *e)
{
    if (g->span_layout) {
        memcpy(dst, s_span_start(g, e), g->span_bytes);
        return;
    }
    const uint8_t *p[6];
    size_t n[6];
    s_pieces(e, p, n);
    for (int i = 0; i < 6; i++)
        if (n[i]) memcpy(dst + g->off[i], p[i], n[i]);
}

/* Split experts: where the head of expert (layer l, expert e) lives on the device. */
static uint8_t *s_head(const gpu_model_t *g, int l, int e)
{
    return g->heads_dev + ((size_t)g->xc.moe_ord[l] * g->m->cfg.n_experts + e) * g->head_bytes;
}

/* Split experts: where the tail of expert (layer l, expert e) is staged in pinned host memory. */
static uint8_t *s_host_tail(const gpu_model_t *g, int l, int e)
{
    return g->host_tails + ((size_t)g->xc.moe_ord[l] * g->m->cfg.n_experts + e) * g->slot_bytes;
}

/* Device qmats of the expert (layer l, expert e) if it (split: its tail) sat in slot s; with
 * split experts, s < 0 reads the tail from its staged host copy over PCIe. */
static cuda_expert_t s_expert_at(const gpu_model_t *g, int l, int e, int s)
{
    const ffn_t *src = &g->m->layers[l].experts[e];
    uint8_t *b = s < 0 ? s_host_tail(g, l, e) : g->slots_dev + (size_t)s * g->slot_bytes;
    cuda_expert_t x = {src->gate, src->up, src->down, {0}, 0};
    const size_t *off = g->off;
    if (g->split) {
        uint8_t *t = b;
        b = s_head(g, l, e);
        off = g->hoff;
        x.split = g->split;
        x.down_tail = src->down;
        x.down_tail.data = t - (size_t)g->split * g->d_row;
        x.down_tail.scales = src->down.scales ? t + ALIGN256(g->tail_data) - (size_t)g->split * g->ds_row : NULL;
    }
    x.gate.data = b + off[0];
    x.gate.scales = x.gate.scales ? b + off[1] : NULL;
    x.up.data = b + off[2];
    x.up.scales = x.up.scales ? b + off[3] : NULL;
    x.down.data = b + off[4];
    x.down.scales = x.down.scales ? b + off[5] : NULL;
    return x;
}

static const uint8_t *s_host_expert(const gpu_model_t *g, int l, int e)
{
    if (g->st.from_model) return s_span_start(g, &g->m->layers[l].experts[e]);
    return g->host_experts + ((size_t)l * g->m->cfg.n_experts + e) * g->expert_bytes;
}

/* Copy expert (l, e), or its tail, into slot s on the given stream. */
static int s_slot_fill(gpu_model_t *g, int s, int l, int e, int stream)
{
    uint8_t *dst = g->slots_dev + (size_t)s * g->slot_bytes;
    if (!g->split) return cuda_h2d_async(g->cx, stream, dst, s_host_expert(g, l, e), g->copy_bytes);
    /* the staged tail: its rows, the padding to 256 bytes, their scales */
    return cuda_h2d_async(g->cx, stream, dst, s_host_tail(g, l, e), ALIGN256(g->tail_data) + g->copy_bytes - g->tail_data);
}

/* s_slot_fill, counted in the statistics. */
static int s_copy_in(gpu_model_t *g, int s, int l, int e, int stream)
{
    g->st.bytes_h2d += g->copy_bytes;
    return s_slot_fill(g, s, l, e, stream);
}

static int s_landed(void *ctx, int s) { return cuda_event_done(((gpu_model_t *)ctx)->ev[s]); }

/* Start copies of predicted experts that are not resident (the window of xc), on the copy
 * stream, nearest layer first, until max_inflight copies are in flight, while layer cur
 * (its routed experts flagged in xc.need) computes. A copy evicts only an expert needed later
 * than the one it brings. past_cur: cur is being placed (s_ensure), so the window's layers up
 * to cur are left alone (a routed expert it has found without a slot stays so). */
static int s_issue(gpu_model_t *g, int cur, bool past_cur)
{
    xcache_t *xc = &g->xc;
    const int E = xc->n_experts, cur_ord = xc->moe_ord[cur];
    int rc, inflight = xcache_inflight(xc);
    for (int d = past_cur && xc->win_lo <= cur_ord ? cur_ord + 1 - xc->win_lo : 0; d < xc->win_n && inflight < g->max_inflight;
         d++) {
        int l = g->xc.moe_layer[xc->win_lo + d];
        for (int e = 0; e < E && inflight < g->max_inflight; e++) {
            if (!xc->pneed[(size_t)l * E + e] || xc->slot_of[(size_t)l * E + e] >= 0) continue;
            int s = xcache_victim(xc, cur, cur_ord, true, (float)(xc->win_lo + d - cur_ord));
            if (s < 0) return 0; /* nothing evictable that is needed later: the miss path will load it */
            xcache_assign(xc, s, l, e);
            /* the copy engine runs them in order either way; queued on two streams, the next
             * starts sooner (Mixtral 24 GiB batch 1: 179.6 -> 180.5 and 180.7 -> 181.7 tok/s) */
            const int stream = g->n_copies++ & 1 ? CUDA_STREAM_COPY2 : CUDA_STREAM_COPY;
            if ((rc = s_copy_in(g, s, l, e, stream))) return rc;
            if ((rc = cuda_event_record(g->cx, g->ev[s], stream))) return rc;
            xc->slot[s].state = XC_LOADING;
            xc->slot[s].prefetched = true;
            inflight++;
            g->st.prefetches++;
            g->lst[l].prefetches++;
        }
    }
    return 0;
}

_Static_assert(sizeof(cuda_expert_t) % 8 == 0, "s_ensure patches the expert table in 64-bit words");

/* Host wait for event ev, with placing >= 0 (layer placing is being placed: a prelaunched step,
 * whose stream cannot wait on a copy) keeping the copy streams fed meanwhile from the window's
 * layers after it (s_issue): a prefetch that lands while the host waits for the other is
 * followed at once by the next (the link idled until the layer's table went up, 34 us at a
 * time, in the 24 GiB trace of session 16). */
static int s_wait_event(gpu_model_t *g, cuda_event_t *ev, int placing)
{
    int d;
    while ((d = cuda_event_done(ev)) == 0)
        if (placing >= 0 && g->xc.win_n > 0 && (d = s_issue(g, placing, true))) return d;
    return d < 0 ? d : 0;
}

/* Make every expert routed in layer l (idx[n][top_k], the host's copy of its routing) resident
 * and refresh the layer's table. With box, the table's changed words go to the mailbox the
 * segment's cuda_wait_patch polls, else on the stream. The stream waits for the copies the
 * layer uses on their events, or with host_waits (a prelaunched step: the layer's kernels are
 * enqueued already) the host does, before it fills the mailbox. */
static int s_ensure(gpu_model_t *g, int l, int n, const int32_t *idx, uint64_t *box, bool host_waits)
{
    const model_config_t *c = &g->m->cfg;
    const int E = c->n_experts;
    glayer_t *L = &g->L[l];
    xcache_t *xc = &g->xc;
    int rc;
    for (int i = 0; i < n * c->top_k; i++) STRATA_ASSERT(idx[i] >= 0 && idx[i] < E);
    xcache_route(xc, l, idx, n * c->top_k);
    /* a pinned layer's miss takes a slot (a DMA): the window never prefetches the pinned
     * layers, so a tail host-read there would be host-read at every step */
    const bool host_read = g->split && n <= GPU_HOST_READ_ROWS && !xc->pinned[xc->moe_ord[l]];
    for (int e = 0; e < E; e++) {
        if (!xc->need[e]) continue;
        g->st.expert_uses++;
        g->lst[l].uses++;
        int s = xc->slot_of[(size_t)l * E + e];
        if (s >= 0) {
            xc_slot_t *sl = &xc->slot[s];
            if (sl->state == XC_LOADING) {
                if ((rc = host_waits ? s_wait_event(g, g->ev[s], l) : cuda_stream_wait_event(g->cx, CUDA_STREAM_COMPUTE, g->ev[s])))
                    return rc;
                sl->state = XC_READY;
            }
            if (sl->prefetched) {
                g->st.prefetch_used++;
                g->lst[l].prefetch_used++;
                sl->prefetched = false;
            }
            g->st.hits++;
            g->lst[l].hits++;
        } else if (host_read) {
            /* the kernels read the staged tail over PCIe (below): no slot, and no DMA queued
             * behind the prefetches */
            g->st.bytes_h2d += g->copy_bytes;
            g->st.misses++;
            g->st.host_reads++;
            g->lst[l].misses++;
        } else {
            s = xcache_victim(xc, l, xc->moe_ord[l], true, -1.0f);
            if (s < 0) s = xcache_victim(xc, l, xc->moe_ord[l], false, -1.0f);
            STRATA_ASSERT(s >= 0); /* n_slots >= n_experts of one layer, checked at create */
            xcache_assign(xc, s, l, e);
            /* the host waits on a copy stream's event: the compute stream holds the layer's
             * kernels already */
            if ((rc = s_copy_in(g, s, l, e, host_waits ? CUDA_STREAM_COPY : CUDA_STREAM_COMPUTE))) return rc;
            if (host_waits && ((rc = cuda_event_record(g->cx, g->ev[s], CUDA_STREAM_COPY)) || (rc = s_wait_event(g, g->ev[s], l))))
                return rc;
            xc->slot[s].state = XC_READY;
            xc->slot[s].prefetched = false;
            g->st.misses++;
            g->lst[l].misses++;
        }
    }
    /* The routed experts' entries: their slots, or (a routed expert with no slot) the staged
     * tail in host memory, a host-read miss. Nothing reads the other entries this step (slots
     * still loading for this layer that nobody routed to stay in flight, and become READY when
     * next used). Only the words that changed go up: as a kernel's parameters
     * (cuda_patch_words), which reads nothing over the busy link, or, more than it takes, the
     * whole table (cuda_h2d_small); or through the mailbox. */
    int np = 0;
    for (int e = 0; e < E; e++) {
        if (!xc->need[e]) continue;
        const cuda_expert_t x = s_expert_at(g, l, e, xc->slot_of[(size_t)l * E + e]);
        uint64_t w[sizeof x / 8], *old = (uint64_t *)&L->table_host[e];
        memcpy(w, &x, sizeof w);
        for (size_t i = 0; i < sizeof x / 8; i++) {
            if (w[i] == old[i]) continue;
            g->patch_dst[np] = (uint64_t *)&L->table_dev[e] + i;
            g->patch_val[np++] = old[i] = w[i];
        }
    }
    if (box) {
        for (int i = 0; i < np; i++) box[2 + 2 * i] = (uint64_t)(uintptr_t)g->patch_dst[i], box[3 + 2 * i] = g->patch_val[i];
        __atomic_store_n(box, (uint64_t)np + 1, __ATOMIC_RELEASE);
        return 0;
    }
    if (np <= CUDA_PATCH_MAX) return cuda_patch_words(g->cx, np, g->patch_dst, g->patch_val);
    return cuda_h2d_small(g->cx, L->table_dev, L->table_host, (size_t)E * sizeof(cuda_expert_t));
}

/* ---- creation ---- */

static void s_release(gpu_model_t *g);

void gpu_model_free(gpu_model_t *g)
{
    if (!g) return;
    if (g->cx) s_release(g), cuda_sync(g->cx);
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
    g->L = calloc((size_t)c->n_layers, sizeof *g->L);
    g->lst = calloc((size_t)c->n_layers, sizeof *g->lst);
    /* the MoE layers' ordinals (g->xc.moe_ord / moe_layer); the slots come with the budget */
    if (!g->L || !g->lst || xcache_init(&g->xc, c->n_layers, c->layer_sparse, c->n_experts, c->top_k, 0) < 0)
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
        if (!rc && c->qk_norm != QK_NORM_NONE) rc = s_upload_f32(g, &D->q_norm, S->q_norm, qn, "q_norm", eb);
        if (!rc && c->qk_norm != QK_NORM_NONE) rc = s_upload_f32(g, &D->k_norm, S->k_norm, kn, "k_norm", eb);
        if (!rc) rc = s_upload_qmat(g, &D->wq, &S->wq, "wq", eb);
        if (!rc) rc = s_upload_qmat(g, &D->wk, &S->wk, "wk", eb);
        if (!rc) rc = s_upload_qmat(g, &D->wv, &S->wv, "wv", eb);
        if (!rc) rc = s_upload_qmat(g, &D->wo, &S->wo, "wo", eb);
        if (rc) break;
        if (c->layer_sparse[l]) {
            rc = s_upload_qmat(g, &D->router, &S->router, "router", eb);
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
     * + 2: s_put_meta's last 64-bit word */
    const size_t meta_bytes = ((3 + (size_t)g->o.kv_blocks) * T + 2) * 4;
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
     * the experts' heads (s_early), and no matmul runs then: the GEMM keeps its k parts there */
    if (!rc && g->moe_scr) cuda_ctx_lend_parts(g->cx, g->moe_scr, moe_bytes);
    {
        /* int8 activations for INT4/INT8 matmuls: the widest input is hidden, q or an MLP */
        int wide = c->hidden > (int)qd ? c->hidden : (int)qd;
        if ((int)mi > wide) wide = (int)mi;
        size_t qb = cuda_q8_bytes((int)T, wide);
        if (!rc && g->budget > 0 && g->used + (int64_t)qb > g->budget)
            rc = strata_seterr(eb, STRATA_ENOMEM, "gpu: int8 activation workspace needs %zu bytes beyond --gpu-mem", qb);
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
    /* s_put_meta sends what differs from dev_meta: the two start equal */
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
    s_pieces(e0, p, n);
    const size_t dr = qmat_data_bytes(d->fmt, 1, d->cols), sr = d->scales ? qmat_scale_bytes(d->fmt, 1, d->cols, d->group) : 0;
    const int64_t left = g->budget - g->used - GPU_SLOT_MARGIN;
    for (int split = (d->rows - 1) / 128 * 128; split >= 128; split -= 128) {
        const size_t rest = (size_t)(d->rows - split);
        n[4] = split * dr, n[5] = split * sr;
        const int64_t head = (int64_t)s_layout(n, g->hoff);
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

/* With an expert cache, steps look their rows up on the GPU (s_stage), in the embedding where
 * it sits in host memory: page-locked (read over PCIe, a few KB a step; on the GPU it would
 * take the slots of 64 tails at Mixtral's size), or, where that fails (its pages overlap the
 * experts' locked ranges), a pinned copy. Neither (or an embedding with scales): steps embed on
 * the host, none is chained. */
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
            uintptr_t lo = (uintptr_t)s_span_start(g, &g->m->layers[l].experts[e]);
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

/* Split experts: upload the head of expert (l, e) from the model's memory and stage its tail
 * (down rows split.. and their scales) in host_tails. */
static int s_split_upload(gpu_model_t *g, int l, int e)
{
    uint8_t *b = s_head(g, l, e), *t = s_host_tail(g, l, e);
    const uint8_t *p[6];
    size_t n[6];
    s_pieces(&g->m->layers[l].experts[e], p, n);
    memcpy(t, p[4] + (size_t)g->split * g->d_row, g->tail_data);
    if (p[5]) memcpy(t + ALIGN256(g->tail_data), p[5] + (size_t)g->split * g->ds_row, g->copy_bytes - g->tail_data);
    n[4] = (size_t)g->split * g->d_row;
    n[5] = (size_t)g->split * g->ds_row;
    int rc = 0;
    for (int i = 0; i < 6 && !rc; i++)
        if (n[i]) rc = cuda_h2d(g->cx, b + g->hoff[i], p[i], n[i]);
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
    s_expert_layout(g, e0);
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
    s_span_layout(g);
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
        return strata_seterr(eb, STRATA_ENOMEM,
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
        s_pieces(e0, p, pn);
        for (int i = 0; i < 6; i++) full += pn[i];
        const size_t head = full - g->copy_bytes;
        g->st.experts_on_gpu = ((double)g->n_total * head + (double)g->n_slots * g->copy_bytes) / full;
        g->st.split_rows = g->split;
    }
    g->ev = calloc((size_t)g->n_slots, sizeof *g->ev);
    if (!g->ev || xcache_set_slots(&g->xc, g->n_slots) < 0)
        return strata_seterr(eb, STRATA_ENOMEM, "gpu: out of host memory");
    g->xc.landed = s_landed;
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
            const uint8_t *h = g->split ? NULL : g->all_resident ? stage : s_host_expert(g, l, e);
            if (g->split) rc = s_split_upload(g, l, e);
            else if (!g->st.from_model) s_expert_pack(g, (uint8_t *)h, &m->layers[l].experts[e]);
            if (rc) break;
            if (s < g->n_slots) {
                xcache_assign(&g->xc, s, l, e);
                g->xc.slot[s].state = XC_READY;
                if (g->all_resident) rc = cuda_h2d(g->cx, g->slots_dev + (size_t)s * g->slot_bytes, h, g->copy_bytes);
                else rc = s_slot_fill(g, s, l, e, CUDA_STREAM_COMPUTE);
                if (rc || (g->all_resident && (rc = cuda_sync(g->cx)))) break; /* stage is reused */
                s++;
            }
        }
        if (rc) break;
        glayer_t *L = &g->L[l];
        for (int e = 0; e < c->n_experts; e++) {
            int si = g->xc.slot_of[(size_t)l * c->n_experts + e];
            /* split: every head is resident, so every entry holds its head from the start (the
             * heads compute before the host patches a routed expert's entry: s_early); a tail
             * without a slot is read from host memory. Whole experts: none, gate NULL. */
            L->table_host[e] = si >= 0 || g->split ? s_expert_at(g, l, e, si) : (cuda_expert_t){0};
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
    if ((rc = s_dalloc(g, (void **)&g->k_cache, g->layer_elems * c->n_layers * 4, "KV cache (k)", eb))) goto fail;
    if ((rc = s_dalloc(g, (void **)&g->v_cache, g->layer_elems * c->n_layers * 4, "KV cache (v)", eb))) goto fail;
    g->st.kv_bytes = (int64_t)(2 * g->layer_elems * c->n_layers * 4);
    if ((rc = s_create_workspace(g, eb))) goto fail;
    if ((rc = s_create_experts(g, eb))) goto fail;
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
     * when the link is the bottleneck. strata bench 24 GiB batch 1, session 15, alternating
     * runs: 197.4 and 198.9 tok/s against 194.2 and 191.7 with two layers' tails (4); session
     * 8, before the tails were one DMA each: 2 162.2, 4 164.7, 6 163.0 */
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

/* ---- the step ---- */

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
    if ((rc = cuda_rope_kv(cx, g->q, g->k, g->v, n, c->n_heads, c->n_kv_heads, hd, c->rot_dim, g->d_pos, g->inv_freq,
                           c->attn_factor, head_norm ? L->q_norm : NULL, head_norm ? L->k_norm : NULL, c->rms_eps, kl,
                           vl, g->d_seq, g->d_bt, g->o.kv_blocks, g->o.block_size)))
        return rc;
    const float scale = 1.0f / sqrtf((float)hd);
    rc = g->att_tc ? cuda_attention_prefill(cx, g->att, g->q, kl, vl, n, g->d_seq, g->d_pos, g->d_bt, g->o.kv_blocks,
                                            c->n_heads, c->n_kv_heads, hd, g->o.block_size, scale)
                   : STRATA_EINVAL_INPUT;
    if (rc == STRATA_EINVAL_INPUT) /* not taken, or a shape it does not take */
        rc = cuda_attention(cx, g->att, g->q, kl, vl, n, g->d_seq, g->d_pos, g->d_bt, g->o.kv_blocks, c->n_heads,
                            c->n_kv_heads, hd, g->o.block_size, scale, &aq);
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

/* Whether a step of n tokens computes each MoE layer's experts in two parts around the wait for
 * its mailbox (cuda_moe_ffn_part): the heads, resident, while the routed tails are still on their
 * way, then the tails' rows of down once the host has placed them. A split expert's entry keeps
 * its head's words; only down_tail's change. */
static bool s_early(const gpu_model_t *g, int n)
{
    return s_mailbox(g, n) && cuda_moe_parts_ok(n, g->expert_fmt, g->m->cfg.hidden, g->inter);
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
    if ((rc = cuda_router_topk(cx, g->rlog, g->x, n, &L->router, c->n_experts, c->top_k, renorm, g->tidx, g->tw, &pre,
                               &route, g->all_resident ? NULL : g->h_idx + ri * g->idx_n)))
        return rc;
    if (g->all_resident) return 0;
    int D = s_window(g, l);
    if (D > 0) {
        /* the next D MoE layers' gates on this hidden state (normalized once, their ffn_norm
         * folded into the stacked routers) predict what they will route to */
        qmat_t w = {.fmt = WF_F32, .rows = D * c->n_experts, .cols = c->hidden,
                    .data = g->pred_router + (size_t)s_window_lo(g, l) * c->n_experts * c->hidden};
        cuda_next_norm_t unit = {g->ones, g->xl, c->rms_eps, NULL};
        if ((rc = cuda_router_topk(cx, g->prlog, g->x, n, &w, c->n_experts, c->top_k, false, g->ptidx, g->ptw, &unit,
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
    const cuda_expert_t *t = g->L[l].table_dev;
    const unsigned flags = (g->xn_q8 ? CUDA_MOE_X_Q8 : 0) | (g->routed ? CUDA_MOE_ROUTED : 0);
    if (!part)
        return cuda_moe_ffn(g->cx, g->x, g->xn, n, c->hidden, g->inter, g->expert_fmt, t, c->n_experts, g->tidx, g->tw,
                            c->top_k, g->moe_scr, flags, nn);
    return cuda_moe_ffn_part(g->cx, part, g->split, g->x, g->xn, n, c->hidden, g->inter, g->expert_fmt, t, c->n_experts,
                             g->tidx, g->tw, c->top_k, g->moe_scr, flags, nn);
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
    /* without a shared expert to add, the combine also norms x for the next layer's attention */
    const bool fuse = c->shared_inter <= 0 && l + 1 < c->n_layers;
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
 * copy streams fed from the prediction window meanwhile (s_issue, layer refill computing): a
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
        if (refill >= 0 && g->xc.win_n > 0 && (rc = s_issue(g, refill, false))) return rc;
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
    int rc = s_wait_rows(g, idx, (size_t)n * g->m->cfg.top_k, k > 0 ? g->xc.moe_layer[k - 1] : -1);
    if (!rc)
        rc = s_ensure(g, g->xc.moe_layer[k], n, idx, s_mailbox(g, n) ? g->h_box + ri * g->box_n : NULL, g->step_pre);
    if (!rc) g->n_routed = k + 1;
    return rc;
}

/* Then wait for segment k's prediction of the next layers (its last router) and start the
 * copies of the predicted experts that are not resident. */
static int s_predict(gpu_model_t *g, int k, int n)
{
    const int l = g->xc.moe_layer[k], D = s_window(g, l), top_k = g->m->cfg.top_k;
    const int32_t *pidx = g->h_pidx + (size_t)(k % GPU_RING) * g->pidx_n;
    int rc;
    if (D > 0 && (rc = s_wait_rows(g, pidx, (size_t)n * D * top_k, -1))) return rc;
    xcache_predicted(&g->xc, s_window_lo(g, l), D, pidx, n, top_k);
    return D > 0 ? s_issue(g, l, false) : 0;
}

/* Split experts: how many MoE layers' tails the cache pins (xcache_pin: the first, whose
 * experts nothing predicts in time, then spread over the step) for a step of n tokens: as many
 * as leave room for the current layer's experts and the prefetch window's, the expected
 * distinct experts a layer routes n tokens to, and at least one. Mixtral 24 GiB, 29 tail slots,
 * batch 1, the first layers pinned: 1 layer 166.6 tok/s, 2 (this rule) 172.3, 3 173.6; at
 * batch 16 a rule for batch 1 (5 of 53 slots' layers kept in the group) left too few for the
 * window: hit rate 0.22, 214.6 tok/s against 352.7. Spread instead of the first ones (session
 * 15): gpu_decode 24G batch 1 at 256 tokens a step (74 slots, 8 pinned) 224.7 and 222.9 tok/s
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
        int need = s_blocks_needed(g, b, s);
        for (int j = 0; j < need; j++) {
            int32_t blk = b->block_tables[s][j];
            if (blk < 0 || blk >= g->o.kv_blocks) {
                log_error("gpu: sequence %d uses KV block %d of %d", s, blk, g->o.kv_blocks);
                return STRATA_EINVAL_INPUT;
            }
            g->h_bt[(size_t)s * g->o.kv_blocks + j] = blk;
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
    if ((rc = s_put_meta(g, 3 * T + (size_t)n_seqs * g->o.kv_blocks))) return rc;
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
static int s_launch(gpu_model_t *g, int k, const batch_t *b, s_mode_t mode)
{
    const int n = b->n_tokens, n_seg = g->n_seg;
    if (k < n_seg - 1) {
        const size_t ri = (size_t)(k % GPU_RING);
        memset(g->h_idx + ri * g->idx_n, 0xff, (size_t)n * g->m->cfg.top_k * 4);
        memset(g->h_pidx + ri * g->pidx_n, 0xff, (size_t)n * g->pred_cap * g->m->cfg.top_k * 4);
        __atomic_store_n(g->h_box + ri * g->box_n, (uint64_t)0, __ATOMIC_RELEASE);
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
        if (!b->block_tables[s]) return false;
        for (int j = 0, need = s_blocks_needed(g, b, s); j < need; j++)
            if (b->block_tables[s][j] != g->h_bt[(size_t)s * g->o.kv_blocks + j]) return false;
    }
    return true;
}

/* A prelaunched step's segments that were enqueued but not routed wait for their mailboxes:
 * fill them empty so that they finish (an abandoned step ahead, or an error), with whatever the
 * tables held; nothing uses what they compute. Then wait for them, since their routers still
 * write the ring entries the next step resets. */
static void s_release(gpu_model_t *g)
{
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
    const int d = s_wait_event(g, g->ev_ids, -1);
    if (d && !rc) rc = d;
    if (rc) {
        g->ahead_n = 0;
        s_release(g);
        return rc;
    }
    memcpy(ids, g->h_ids, (size_t)n * 4);
    memcpy(g->ahead_tok, g->h_ids, (size_t)n * 4);
    return 0;
}

int gpu_step_ahead(gpu_model_t *g, const batch_t *b)
{
    if (s_ahead_is(g, b)) return 0; /* started already, chained behind the last step (s_picks) */
    s_release(g);
    g->ahead_n = 0;
    const int n = b->n_tokens;
    /* only a cache's first segment has anything to overlap: the prefetches of the layers
     * after the first gate */
    if (g->all_resident || n <= 0 || n >= GPU_MAX_GRAPHS || b->n_logits != n) return 0;
    int rc;
    if ((rc = s_begin(g, b, -1)) || (rc = s_run(g, 0, b, S_LOGITS, true))) {
        s_release(g);
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
        return k > 0 && g->xc.win_n > 0 ? s_issue(g, g->xc.moe_layer[k - 1], false) : 0;
    const batch_t b = {.n_tokens = n, .n_logits = g->ahead_nlog};
    if ((rc = s_advance(g, k, &b, S_LOGITS, last - 1))) {
        g->ahead_n = 0;
        s_release(g);
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
    if (!ahead) s_release(g);
    if (n == 0) return 0;
    int rc;
    if (ahead) g->st.steps_ahead++;
    else if ((rc = s_begin(g, b, mode))) return rc;
    cuda_ctx_t *cx = g->cx;
    if (mode == S_SAMPLE) {
        for (int i = 0; i < b->n_logits; i++)
            g->h_samp[i] = (cuda_sample_param_t){samp[i].temperature, samp[i].top_k, samp[i].top_p, 0.f, samp[i].u};
        if ((rc = cuda_h2d_small(cx, g->d_samp, g->h_samp, (size_t)b->n_logits * sizeof *g->h_samp))) {
            s_release(g);
            return rc;
        }
    }
    g->st.steps++;
    if ((rc = s_run(g, ahead ? g->n_routed : 0, b, mode, false))) {
        s_release(g);
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
}
