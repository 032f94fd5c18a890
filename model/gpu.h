/* gpu.h - the model on a GPU within a memory budget: resident weights, a paged KV cache,
 * workspace, and an expert cache filled on demand and by prefetch over PCIe, whose slots hold
 * the tails of split experts (every expert resident but the last rows of its down projection)
 * or whole experts. Uses only kernels/cuda/cuda_ops.h (no CUDA headers).
 *
 * Budget (--gpu-mem): every device allocation is charged against it; creation fails with a
 * clear message when the resident part does not fit. What is left after resident weights, KV
 * and workspace holds the experts (split_experts: heads of all, tails in slots; else whole
 * experts in slots, at most one per expert). A copy into a slot is one DMA (two for a tail),
 * straight from the model's own memory, page-locked, when every expert is one span of it with
 * the same layout (a packed model, the weight arena), else from a pinned copy of every expert.
 */
#ifndef STRATA_GPU_H
#define STRATA_GPU_H

#include <stdbool.h>
#include <stdint.h>

#include "model/model.h"

/* Which missed experts run on the CPU, when o.remote is set:
 *   COST    per layer, the cost model: each miss goes to the side (a copy into a slot over
 *           PCIe, or a prefetcher) that finishes it first, at rates measured as it runs;
 *   ALL     every miss whose prefetcher is up (copies only when one is down);
 *   STATIC  llama.cpp's placement: every expert of the first cpu_layers MoE layers on the CPU,
 *           the others cached on the GPU, no prefetch. */
typedef enum { GPU_CPU_COST = 0, GPU_CPU_ALL = 1, GPU_CPU_STATIC = 2 } gpu_cpu_policy_t;
/* Steps of up to this many tokens hand misses to the CPU (prefill-sized ones copy them). */
/* (decode-shaped steps, which take the fused router and the captured graphs; larger ones failed
 * on the GPU host with the prefetchers taking every miss, not yet understood) */
#define GPU_CPU_ROWS 16

typedef struct {
    int device;
    int64_t gpu_mem;         /* bytes; 0 = no budget (every expert resident) */
    int32_t kv_blocks;       /* paged KV blocks on the GPU */
    int32_t block_size;      /* tokens per KV block */
    int32_t max_tokens;      /* most tokens one step carries */
    int32_t prefetch_depth;  /* MoE layers ahead whose experts are predicted and prefetched (0 = off,
                              * < 0: 16 with whole experts, 2 with split ones);
                              * with a cache this takes ALIGN256(moe_layers * n_experts * hidden * 4)
                              * + ALIGN256(hidden * 4) bytes of the budget, or is turned off when
                              * that would leave less than one layer of slots */
    bool use_graphs;         /* capture decode steps as CUDA graphs when every expert is resident */
    bool split_experts;      /* when whole experts do not all fit: keep every expert resident but
                              * the last rows of its down projection, and cache those (default) */
    bool blas;               /* with every expert resident and room in the budget, cuBLAS for the
                              * dense matmuls of prefill-sized steps (cuda_ctx_enable_blas; default) */
    /* CPU experts (whole-expert cache, steps of up to GPU_CPU_ROWS tokens): the missed experts
     * the prefetchers may compute on their cores (model.h moe_remote_t; owner -1: not there),
     * or NULL; with cpu_policy which of them they do (gpu_cpu.c) */
    const moe_remote_t *remote;
    gpu_cpu_policy_t cpu_policy;
    int32_t cpu_layers;      /* GPU_CPU_STATIC: the first MoE layers whose experts all run on the CPU
                              * (0: as many as the slots leave out) */
} gpu_opts_t;

/* Where the host thread spends a step with an expert cache, MoE layer by MoE layer (gpu_step.c
 * s_advance): waiting for a router's picks (the GPU's attention and gate meanwhile, and the
 * prefetches fed), placing the layer's experts (the miss path and the cost model), waiting for
 * the rows a CPU job reads, posting the CPU's jobs, launching segments, waiting for the
 * prediction and starting its copies, and waiting for the CPU's results. */
typedef enum {
    GPU_HOST_ROWS = 0,
    GPU_HOST_PLACE,
    GPU_HOST_FLAG,
    GPU_HOST_POST,
    GPU_HOST_LAUNCH,
    GPU_HOST_PREDICT,
    GPU_HOST_CPU_WAIT,
    GPU_HOST_PHASES
} gpu_host_phase_t;

/* Its short name, as the executor's stats give it (host_<name>_us_total). */
static inline const char *gpu_host_phase_name(int phase)
{
    static const char *const names[GPU_HOST_PHASES] = {"rows", "place", "flag", "post", "launch", "predict", "cpu_wait"};
    return phase >= 0 && phase < GPU_HOST_PHASES ? names[phase] : "?";
}

typedef struct {
    uint64_t steps;
    uint64_t steps_ahead;      /* ... that gpu_step_ahead had started */
    uint64_t steps_chained;    /* steps started behind the one before, on its picks (gpu_set_next) */
    uint64_t expert_uses;      /* (layer, expert) activations served */
    uint64_t hits;             /* ... found resident, or arrived by prefetch before needed */
    uint64_t misses;           /* ... loaded on demand */
    uint64_t host_reads;       /* ... of which read from host memory by the kernels (split tails) */
    uint64_t prefetches;       /* experts copied ahead of need */
    uint64_t prefetch_used;    /* ... that the next layers did use */
    uint64_t bytes_h2d;        /* expert bytes copied host -> GPU */
    int32_t slots, n_experts_total; /* the cache's slots (whole experts, or tails) */
    double experts_on_gpu;     /* whole experts' worth of expert bytes on the GPU: slots, or with
                                  split experts every head plus the tails in slots (fractional);
                                  the slots of the roofline's bound (bench/roofline.h) */
    int64_t resident_bytes, kv_bytes, workspace_bytes, slot_bytes_total, budget_used;
    int64_t host_locked_bytes; /* host memory the cache keeps page-locked for its copies */
    bool from_model;           /* copies read the model's own memory (page-locked: a packed model,
                                  the weight arena), not a pinned copy of every expert */
    int32_t split_rows;        /* split experts: down rows of every expert resident (0: whole experts) */
    /* CPU experts (o.remote): routed experts computed on the CPU instead of on the GPU (neither
     * hits nor misses), their (token, expert) pairs, those the executor computed itself because a
     * prefetcher failed its job (the host's wait for the CPU's results once the GPU's work on
     * the layer was enqueued: host_us[GPU_HOST_CPU_WAIT]) */
    uint64_t cpu_uses, cpu_rows, cpu_local;
    uint64_t cpu_layers_posted;  /* MoE layers with CPU experts, and of them those whose GPU had */
    uint64_t cpu_gpu_waits;      /* finished its own experts before the CPU's results were in */
    double cpu_kappa;            /* the cost model's tuned multiplier of the CPU's cost (gcpu_tune):
                                    the centre of the step size class whose tuner moved last */
    int32_t cpu_layers;        /* GPU_CPU_STATIC: MoE layers whose experts run on the CPU */
    double host_us[GPU_HOST_PHASES]; /* the host thread's time in each phase of the MoE layers'
                                        hand-offs, us (gpu_host_phase_name) */
} gpu_stats_t;

/* The expert cache of one layer (all zero for dense layers and with every expert resident). */
typedef struct {
    uint64_t uses, hits, misses, prefetches, prefetch_used;
} gpu_layer_stats_t;

typedef struct gpu_model gpu_model_t;

/* Defaults: device 0, no budget, 256 blocks of 16, 512 tokens a step, prefetch depth by the cache's
 * kind (16 whole, 2 split), graphs on, split experts. */
void gpu_opts_default(gpu_opts_t *o);
/* Put model m on the GPU under o. m must outlive the gpu model. Returns 0 or <0 with eb set:
 * STRATA_ETOOLARGE when the model does not fit o->gpu_mem (eb says what did not fit, and by how much). */
int gpu_model_create(gpu_model_t **out, const model_t *m, const gpu_opts_t *o, strata_errbuf_t *eb);
void gpu_model_free(gpu_model_t *g);
/* One step over b (batch_t semantics of model.h; block ids index the GPU KV cache).
 * logits: host [n_logits][vocab]. Returns 0 or <0. */
int gpu_forward(gpu_model_t *g, const batch_t *b, float *logits);
/* Greedy variant: argmax on the GPU, only the ids come back. ids: host [n_logits]. */
int gpu_forward_greedy(gpu_model_t *g, const batch_t *b, int32_t *ids);
/* One logit row's sampling, as cpu_sample takes it (kernels/cpu/ops.h): temperature <= 0 or
 * top_k == 1 greedy, top_k <= 0 no top-k, top_p >= 1 no nucleus, u the row's uniform draw. */
typedef struct {
    float temperature;
    int32_t top_k;
    float top_p;
    double u;
} gpu_sample_t;
/* Sampling variant: each logit row's token drawn on the GPU as cpu_sample draws it
 * (kernels/cuda/cuda_sample.h: the same token but where a mass lies within rounding of a
 * boundary); only the ids come back. samp, ids: host [n_logits]. STRATA_EUNSUPPORTED for a
 * vocabulary above 2^21. */
int gpu_forward_sample(gpu_model_t *g, const batch_t *b, const gpu_sample_t *samp, int32_t *ids);
/* Start the step the caller expects next, before it is asked for: with an expert cache, the
 * first segment (the layers up to the first MoE gate, whose K/V rows it writes) and the
 * prefetches that gate predicts, so the copies run while the caller waits for its next plan
 * (a prelaunched step, split experts at up to 16 rows, also computes on to the second gate).
 * The next gpu_forward* of the same rows (tokens, positions, sequences, logit rows, and the
 * blocks they use) goes on from there; any other step lets it finish unused, then runs whole
 * (the K/V rows written for the guess are rewritten when those positions are computed). A guess that is not
 * decode-shaped (more than 32 rows, or not a logit row each) or a model without a cache starts
 * nothing. A step of these rows started already (chained: gpu_set_next) is kept as it is.
 * Returns 0, or <0 for a batch a step would refuse. */
int gpu_step_ahead(gpu_model_t *g, const batch_t *b);
/* The step the caller expects after the next gpu_forward_greedy or gpu_forward_sample, as it
 * would pass it to gpu_step_ahead, but with row i's token the pick of that step's logit row i
 * (next->tokens is not read): that forward starts it on the GPU before it returns, behind its
 * own sampling, the rows embedded on the GPU (a chained step; a prelaunched one only), and
 * gpu_step_ahead of those rows then keeps it. Only the next forward reads it (NULL: none);
 * its arrays must live until that forward returns. */
void gpu_set_next(gpu_model_t *g, const batch_t *next);
/* While the caller waits for its next plan: carry the step gpu_step_ahead started one MoE
 * layer further if its routing is there (up to the last gate: the rest needs the step's
 * mode), else keep the prefetch copies going; never waits for the GPU. Returns 1 if it went a
 * layer further, 0 if not (or nothing was started ahead), <0 on an error (the step ahead is
 * then dropped). */
int gpu_ahead_progress(gpu_model_t *g);
void gpu_get_stats(const gpu_model_t *g, gpu_stats_t *st);
/* Copies up to max layers' cache statistics into out (may be NULL); returns the layer count. */
int gpu_get_layer_stats(const gpu_model_t *g, gpu_layer_stats_t *out, int max);
void gpu_reset_stats(gpu_model_t *g);

#endif
