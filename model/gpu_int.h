/* gpu_int.h - internal to model/: the state of the model on one GPU (struct gpu_model) and the
 * interface between the four files that implement model/gpu.h. Nothing outside model/
 * includes it.
 *
 *   gpu_model.c  the layout and the budget: uploads, workspace, how many slots and the split
 *                plan, creation and freeing, the statistics' getters
 *   gpu_slots.c  the expert slots: how a slot holds an expert or a tail, copies into slots,
 *                prefetch issue, and the miss path (gslots_ensure)
 *   gpu_step.c   one step: the launches, segments and their CUDA graphs, mailboxes, routing
 *                and prediction waits, staging, steps ahead and chained steps
 *   gpu_cpu.c    CPU experts: which misses go to the prefetchers (the cost model), their jobs,
 *                the results onto the GPU's residual
 *
 * Each file reaches into the others only through the functions declared here. gpu_model.c
 * sizes and allocates every field of struct gpu_model; the comments on its groups of fields
 * name the file that writes them after creation. The kernels/cuda headers included here are
 * extern "C" C headers, no CUDA header.
 */
#ifndef STRATA_MODEL_GPU_INT_H
#define STRATA_MODEL_GPU_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/threadpool.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/cuda_sample.h"
#include "model/gpu.h"
#include "store/xcache.h"

#define ALIGN256(x) (((x) + 255) & ~(size_t)255)
#define GPU_MAX_GRAPHS 33 /* decode graphs keyed by n_tokens 1..32 */
/* Split experts: a step of up to this many tokens reads a missed tail from pinned host memory in
 * the expert kernels (the integer path, which reads a row once for all of a tile's tokens);
 * larger steps copy it (the GEMM would read it once per token tile, over PCIe). */
#define GPU_HOST_READ_ROWS 16
/* ring entries of the host's routing, prediction and mailbox buffers (by segment); a step keeps
 * at most 3 segments' in use (gpu_step.c's s_run) */
#define GPU_RING 4
/* prefetchers the CPU-expert path tells apart (moe_remote_t.n_dest at most) */
#define GPU_CPU_DEST 8
/* misses of one layer the cost model weighs (more: copied) */
#define GPU_CPU_MISS_MAX 1024
/* words of a CPU-expert box (h_cbox, by segment): [0] open, [1 + t] token t has rows to add,
 * [GPU_CPU_ARRIVED] set by the GPU once its own experts of the layer are done (it then waits) */
#define GPU_CPU_ARRIVED (1 + GPU_CPU_ROWS)
#define GPU_CPU_BOX (2 + GPU_CPU_ROWS)
/* the cost model's step sizes (gpu_cpu.c s_size_class): 1, 2-4, more tokens */
#define GPU_CPU_CLASSES 3

typedef struct {
    float *attn_norm, *ffn_norm, *bq, *bk, *bv, *bo, *q_norm, *k_norm;
    float *sinks;                  /* [n_heads] attention sink logits (gpt-oss), or NULL */
    float *router_b;               /* [n_experts] the router's bias (gpt-oss), or NULL */
    cuda_moe_opts_t mo;            /* the experts' biases ([n_experts][..], resident) and activation;
                                      all zero: plain SwiGLU */
    qmat_t wq, wk, wv, wo, router, shared_gate;
    ffn_t shared, dense;
    cuda_expert_t *table_dev;   /* [n_experts] device pointers of resident experts */
    cuda_expert_t *table_host;  /* [n_experts] staging copy, pinned: its copy never waits on the stream */
} glayer_t;

struct gpu_model {
    /* gpu_model.c: the budget and every device allocation */
    const model_t *m;
    gpu_opts_t o;
    cuda_ctx_t *cx;
    int64_t budget, used;
    size_t free0;                /* device memory free once the context exists */
    void **allocs;               /* every device allocation, freed at the end */
    int n_allocs, cap_allocs;

    /* resident weights (gpu_model.c); the MoE layers' expert tables change in gslots_ensure */
    glayer_t *L;
    float *final_norm, *inv_freq;
    qmat_t lm_head;
    wfmt_t expert_fmt;
    int32_t inter;               /* expert intermediate size */

    /* paged KV: [layer][block][kv_head][block_size][head_dim] fp32 */
    float *k_cache, *v_cache;
    size_t layer_elems;

    /* workspace (device); the flags xn_q8 .. pre_attn_q8 are gpu_step.c's, from one launch to
     * the next */
    float *x, *xn, *q, *k, *v, *att, *y, *rlog, *tw, *sg, *ffn_scr, *xl, *logits, *prlog, *ptw;
    bool xn_q8;  /* s_ffn_pre left xn's int8 rows in the context's workspace for s_ffn_post */
    bool routed; /* and the gate's routing in moe_scr */
    bool att_tc; /* this step's attention on tensor cores (mostly prefill: runs of >= 16 rows) */
    bool pre_attn, pre_attn_q8; /* s_ffn_post normed x into xn for the next layer's attention
                                   (and left its int8 rows in the workspace) */
    int32_t *tidx, *ptidx, *d_pos, *d_seq, *d_bt, *d_rows, *d_ids;
    /* a sequence's row of d_bt / h_bt: its block table (kv_blocks entries), then for a model with
     * sliding-window layers its window table (batch_t.win_tables) as many more */
    int32_t bt_stride;
    bool win;                    /* the model has sliding-window layers */
    int32_t *d_tok;              /* [max_tokens] a step's tokens, for the lookup on the GPU (s_stage) */
    cuda_sample_param_t *d_samp; /* [max_tokens] a sampled step's parameters by logit row */
    void *moe_scr;
    /* host staging (gpu_step.c; a mailbox and patch_dst/patch_val are gslots_ensure's) */
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
    uint64_t **patch_dst, *patch_val; /* [n_experts * words of an entry]: gslots_ensure's changed words */
    bool step_pre;               /* the step in flight is prelaunched (s_prelaunch) */
    int32_t n_launched, n_routed; /* its segments enqueued, and routed by the host (s_route) */
    cuda_sample_param_t *h_samp; /* [max_tokens] staging of d_samp */
    tpool_t *embed_pool;         /* s_embed's threads, created by the first large step */

    /* expert cache: laid out at creation (gpu_model.c, through gpu_slots.c's layouts); the
     * slots' contents, their events and the copies change in gpu_slots.c only */
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
    int32_t *ens_miss, *ens_vic; /* [n_experts] gslots_ensure's copied misses and their slots */
    uint8_t *host_experts;       /* pinned [n_layers*n_experts][expert_bytes], NULL if all resident
                                    or st.from_model (copies read the model's memory) */
    int32_t depth;               /* prefetch window in MoE layers not pinned (0: no prediction) */
    int32_t pred_cap;            /* MoE layers a prediction's workspace holds, pinned ones included */
    int32_t max_inflight;        /* prefetch copies on the copy streams at once */
    uint32_t n_copies;           /* prefetch copies issued: even ones on CUDA_STREAM_COPY, odd on COPY2 */
    float *pred_router;          /* [n_moe][n_experts][hidden] f32 routers x ffn_norm, or NULL */
    float *pred_bias;            /* [n_moe][n_experts] their biases (gpt-oss), or NULL */
    float *ones;                 /* [hidden] 1.0: the unweighted RMSNorm for the prediction */
    gpu_layer_stats_t *lst;      /* [n_layers] */

    /* CPU experts (gpu_cpu.c; o.remote, whole experts): allocated by gpu_model.c, written by
     * gpu_cpu.c, the hand-off's launches gpu_step.c's */
    bool cpu_on;                 /* steps of up to GPU_CPU_ROWS tokens hand misses to the CPU */
    float *h_xn, *h_tw;          /* pinned [GPU_CPU_ROWS][hidden], [..][top_k]: a MoE layer's normed rows
                                    and routing weights, copied at the end of its gate's segment */
    uint64_t *h_xflag;           /* pinned [GPU_RING][8]: word 0 set by a kernel once those copies landed */
    uint64_t *h_cbox;            /* pinned [GPU_RING][GPU_CPU_BOX]: cuda_wait_add_rows's box */
    float *h_cy;                 /* pinned [GPU_CPU_ROWS][hidden]: each token's weighted sum of its CPU experts */
    float *cpu_fy;               /* [GPU_CPU_ROWS * top_k][hidden]: outputs the executor computed itself */
    float *cpu_scr;              /* cpu_ffn_swiglu_many's scratch for those */
    int8_t *cpu_dest;            /* [n_experts] the current layer's experts on the CPU: their destination, else -1 */
    int32_t *cpu_cnt;            /* [n_experts] tokens the current layer routes to each expert */
    int32_t *cpu_row;            /* [GPU_CPU_ROWS * top_k] each (token, k) pair's row in its prefetcher's job, or -1 */
    int32_t cpu_n;               /* experts of the current layer on the CPU */
    int32_t cpu_static;          /* GPU_CPU_STATIC: MoE ordinals below this run on the CPU */
    double pcie_us_b;            /* the cost model's rates: us per byte over PCIe (probed at creation), */
    double cpu_us_b[GPU_CPU_DEST]; /* and on each prefetcher (measured per job, averaged), */
    double cpu_lat_us[GPU_CPU_DEST]; /* its fixed cost per job: both fitted to the jobs' times */
    double cpu_fit[GPU_CPU_DEST][4]; /* averages over the answered jobs of bytes, us, bytes^2, bytes*us */
    double cpu_miss[GPU_CPU_CLASSES]; /* experts a MoE layer moves (copied ahead or on a miss, or to the CPU),
                                    averaged over layers, by step size (1, 2-4, more) */
    uint64_t cpu_moved;          /* st.prefetches + st.misses + st.cpu_uses at the last plan */
    double cpu_t_post[GPU_CPU_DEST]; /* the current layer's job: posted at (strata_now), 0: none */
    double cpu_t_box;            /* when the host last set a layer's box (strata_now), */
    int32_t cpu_k_box;           /* that layer's MoE ordinal */
    uint64_t cpu_step_box;       /* and its step (st.steps) */
    double cpu_ser_us;           /* the serial part of a layer: from one layer's box to the next
                                    one's rows on the host (the GPU's combine, attention and gate,
                                    which neither side's experts overlap), averaged over the layers
                                    whose GPU was waiting for the box (else the GPU's own experts,
                                    held up by copies, would count as serial) */
    bool cpu_gpu_waited;         /* the GPU waited for the last box the host opened */
    /* the tuner (gcpu_tune), by step size class: the centre of kappa, its move factor and last
     * direction, the phase (0..3: x d, / d, / d, x d) and its steps, the step times of the x d
     * and / d phases, the current phase's, and the last phase's mean step (s; 0: none yet) */
    double cpu_kappa[GPU_CPU_CLASSES], cpu_kfac[GPU_CPU_CLASSES];
    int32_t cpu_kdir[GPU_CPU_CLASSES], cpu_kphase[GPU_CPU_CLASSES], cpu_kcnt[GPU_CPU_CLASSES];
    double cpu_ksum[GPU_CPU_CLASSES][2], cpu_kphsum[GPU_CPU_CLASSES], cpu_kmean[GPU_CPU_CLASSES];
    double cpu_tune_t;           /* when the last CPU-expert step started (strata_now), 0: none */
    int32_t cpu_tune_n;          /* its tokens */
    uint64_t cpu_log_step;       /* the step whose cost-model figures were logged last */
    double cpu_bytes[GPU_CPU_DEST];  /* its expert bytes x row factor (the model's unit) */

    /* gpu_step.c: the graphs, steps ahead and chained steps */
    cuda_graph_t **graphs;       /* [GPU_MAX_GRAPHS][n_seg] decode graphs by n_tokens and segment */
    int32_t n_seg;               /* segments of a step: 1, or n_moe + 1 with a cache */
    int32_t graph_nlog[GPU_MAX_GRAPHS];
    int8_t graph_mode[GPU_MAX_GRAPHS]; /* gpu_step.c's s_mode_t its last segment was captured for */
    gpu_stats_t st;              /* each file counts what it does */
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

/* ---- gpu_slots.c ---- */

/* The six pieces of expert e in host memory in slot order, their starts p and bytes n. */
void gslots_pieces(const ffn_t *e, const uint8_t *p[6], size_t n[6]);
/* Offsets of pieces of n[i] bytes one after another, each 256-byte aligned; returns the total. */
size_t gslots_layout(const size_t n[6], size_t off[6]);
/* Sets g's whole-expert slot layout (expert_bytes, copy_bytes, off) from expert e's shape. */
void gslots_expert_layout(gpu_model_t *g, const ffn_t *e);
/* Switches g to the span layout when every routed expert is one span of the same shape. */
void gslots_span_layout(gpu_model_t *g);
/* The start of expert e's span of the model's memory (span layout). */
const uint8_t *gslots_span_start(const gpu_model_t *g, const ffn_t *e);
/* Packs expert e into dst (host) in slot layout. */
void gslots_expert_pack(const gpu_model_t *g, uint8_t *dst, const ffn_t *e);
/* Split experts: uploads the head of expert (l, e) and stages its tail in host_tails; 0 or <0. */
int gslots_split_upload(gpu_model_t *g, int l, int e);
/* The expert table entry of (l, e) held in slot s (split: s < 0 reads the tail from host memory). */
cuda_expert_t gslots_expert_at(const gpu_model_t *g, int l, int e, int s);
/* Where whole expert (l, e) is read from in host memory, in slot layout. */
const uint8_t *gslots_host_expert(const gpu_model_t *g, int l, int e);
/* Enqueues the copy of expert (l, e), or its tail, into slot s on stream; 0 or <0. */
int gslots_fill(gpu_model_t *g, int s, int l, int e, int stream);
/* xcache_t.landed for ctx = g: 1 when the copy into slot s has landed, 0 if not, <0 on error. */
int gslots_landed(void *ctx, int s);
/* Starts prefetch copies from the prediction window while layer cur computes; 0 or <0. */
int gslots_issue(gpu_model_t *g, int cur, bool past_cur);
/* Waits on the host for ev, prefetching meanwhile while layer placing (>= 0) is placed; 0 or <0. */
int gslots_wait_event(gpu_model_t *g, cuda_event_t *ev, int placing);
/* The miss path: places layer l's routed experts (wait, copy on demand, host-read), sends its table. */
int gslots_ensure(gpu_model_t *g, int l, int n, const int32_t *idx, uint64_t *box, bool host_waits);

/* ---- gpu_cpu.c ---- */

/* Whether a step of n tokens hands MoE layers' misses to the CPU: its segments carry the stores of
 * the normed rows to the host (cuda_put_host) and cuda_wait_add_rows. */
bool gcpu_step(const gpu_model_t *g, int n);
/* MoE layer k's box in h_cbox (its ring entry). */
uint64_t *gcpu_box(const gpu_model_t *g, int k);
/* At a step's start (n tokens): the tuner's clock, its phases and its moves. */
void gcpu_tune(gpu_model_t *g, int n);
/* The tuner's factor on the CPU's cost for a step of n tokens, in its current phase. */
double gcpu_kappa(const gpu_model_t *g, int n);
/* Which of layer l's misses[0..nm) (experts with no slot, routed this step) run on the CPU:
 * sets cpu_dest and cpu_n; the rest are copied. */
void gcpu_plan(gpu_model_t *g, int l, int n, const int32_t *idx, const int32_t *misses, int nm);
/* MoE layer k, from gslots_ensure right after gcpu_plan: post its CPU experts' rows to their
 * prefetchers (waiting for the rows the segment stores, cuda_put_host); without any, opens its
 * box at once. 0 or <0. */
int gcpu_post(gpu_model_t *g, int k, int n, const int32_t *idx);
/* After the next segment is enqueued: wait for the CPU's results (computing here what a
 * prefetcher failed), add up each token's, open the box. Always opens it. 0 or <0. */
int gcpu_finish(gpu_model_t *g, int k, int n, const int32_t *idx);
/* After a prediction (xcache_predicted): the predicted experts of the window that the CPU is to
 * compute, marked 2 in pneed so that gslots_issue does not copy them: with the cost model the
 * share of the window's misses that balances the CPU's rate against the link's, with ALL every
 * one. */
void gcpu_leave(gpu_model_t *g, int n);
/* Creation: the cost model's PCIe rate, probed with copies into slot 0; 0 or <0. */
int gcpu_probe(gpu_model_t *g);

/* ---- gpu_step.c ---- */

/* Lets a prelaunched step's unrouted segments finish through their mailboxes, and waits for them. */
void gstep_release(gpu_model_t *g);

#endif
