/* exec.h - the executor's engine: runs the scheduler's step plans on a model.
 *
 * An exec_t owns the KV cache (kv_blocks x block_size, paged; block ids in a plan index it)
 * and the compute backend: "cpu" (model_forward over a thread pool) or "cuda" (model/gpu.h,
 * whose KV cache lives on the GPU). It holds no request state: everything it needs comes in
 * each plan (proto/msg.h msg_step_t), so a new executor continues any sequence once the
 * scheduler has re-prefilled it.
 *
 * Sampling is deterministic per sequence: the uniform number for a sequence's next token is
 * draw number n_sampled of the xoshiro256** stream seeded with the sequence's seed
 * (model/generate.h sampler_rng_*), the same stream `strata generate` draws from one token
 * at a time. So a token depends only on (logits, sampling params, seed, n_sampled), and a
 * replay after a restart draws the same numbers.
 *
 * Log-probabilities (a sequence's plan with logprobs): the sampled token's under the model's own
 * distribution, log-softmax of the raw logits row before temperature, top-k and top-p, and the
 * top_logprobs most likely tokens (model/generate.h sampler_logprobs), from the row the host
 * samples. The CUDA backend samples on the GPU and brings back only ids, so a step in which some
 * sequence asks for them brings its logits rows back instead (gpu_forward) and samples them all
 * on the host with cpu_sample: the same tokens, but where a mass lies within rounding of a
 * boundary (kernels/cuda/cuda_sample.h); a step that asks for none costs nothing more.
 *
 * The service loop (main.c) adds the ZeroMQ socket; tests drive exec_step directly.
 */
#ifndef STRATA_EXEC_H
#define STRATA_EXEC_H

#include <stdbool.h>
#include <stdint.h>

#include "model/gpu.h"
#include "model/model.h"
#include "proto/msg.h"

typedef struct exec exec_t;

typedef struct {
    char backend[16];      /* "cpu" or "cuda" */
    int threads;           /* cpu: worker threads, 0 = all online cpus */
    int64_t gpu_mem;       /* cuda: memory budget in bytes, 0 = no budget */
    int prefetch_depth;    /* cuda: MoE layers ahead to prefetch; -1 = the backend's default */
    bool whole_experts;    /* cuda: a cache of whole experts, not split ones (gpu.h) */
    int32_t kv_blocks;     /* KV cache blocks */
    int32_t block_size;    /* tokens per block */
    int32_t max_tokens;    /* most tokens one step carries (the scheduler's max_batch_tokens) */
    int32_t max_context;   /* highest position + 1 a sequence may reach; 0 = the model's max_pos */
    const moe_remote_t *remote; /* experts computed by the prefetchers (exec_remote.h), or NULL */
    int cpu_policy;        /* cuda: gpu_cpu_policy_t, which misses remote computes (model/gpu.h) */
    int cpu_layers;        /* cuda, GPU_CPU_STATIC: gpu_opts_t.cpu_layers */
} exec_opts_t;

/* Counters since exec_create; the cache fields are filled by the cuda backend only. */
typedef struct {
    uint64_t steps, tokens, sampled, bad_plans;
    uint64_t logprob_rows;          /* sampled rows that returned log-probabilities */
    double forward_us, sample_us;   /* totals, wall time */
    double compute_cpu_us;          /* CPU time of the calling thread in forward + sampling */
    bool has_cache;                 /* the fields below are meaningful */
    uint64_t hits, misses, host_reads, prefetches, prefetch_used, bytes_h2d;
    uint64_t steps_ahead;      /* steps exec_step_ahead had started */
    uint64_t steps_chained;    /* steps started on the GPU behind the one before (gpu_set_next) */
    int32_t slots, n_experts_total;
    double experts_on_gpu;          /* gpu_stats_t's: the roofline's slots */
    uint64_t cpu_layers_posted, cpu_gpu_waits; /* gpu_stats_t's: MoE layers with CPU experts, and
                                                  those whose GPU waited for the CPU's results */
    double cpu_kappa;               /* gpu_stats_t's: the cost model's tuned factor */
    double host_us[GPU_HOST_PHASES]; /* gpu_stats_t's: the host thread's time by phase */
} exec_stats_t;

/* Defaults: cpu, all threads, 2048 blocks of 16, 256 tokens a step, model's context. */
void exec_opts_default(exec_opts_t *o);

/* An engine for model m (which must outlive it) under o. Fresh random instance id. Returns 0,
 * STRATA_EUNSUPPORTED (backend not built or no GPU: a configuration problem) or <0, eb set. */
int exec_create(exec_t **out, const model_t *m, const exec_opts_t *o, strata_errbuf_t *eb);
void exec_free(exec_t *e);

/* Random per exec_create, never 0. */
uint64_t exec_instance(const exec_t *e);
/* Positions a sequence may reach: min(model max_pos, opts.max_context, kv_blocks*block_size). */
int32_t exec_max_context(const exec_t *e);
/* Tokens the model's sliding-window layers attend to, itself included; 0 when no layer slides
 * (the hello's sliding_window: the scheduler then sends window tables, msg_step_seq_t.win_blocks). */
int32_t exec_sliding_window(const exec_t *e);

/* Run plan st: tokens[st->n_seqs] receives each sequence's sampled token (-1 where sample is
 * false); *forward_us / *sample_us the time spent. A plan that is not valid for this engine
 * (stale instance, too many tokens, positions or blocks outside the cache, a window table
 * without a block that a position written or attended needs, token ids outside the vocab) is
 * refused before anything runs: returns STRATA_EINVAL_INPUT with *code
 * (MSG_E_UNAVAILABLE for a stale instance, else MSG_E_INVALID_PARAM) and text[tlen] naming
 * the sequence and field. A compute failure returns another <0 with MSG_E_INTERNAL. */
int exec_step(exec_t *e, const msg_step_t *st, int32_t *tokens, double *forward_us, double *sample_us,
              msg_errcode_t *code, char *text, size_t tlen);

/* After plan st ran and gave tokens: with the CUDA backend's expert cache, start the step that
 * continues every sequence of st by its sampled token (gpu_step_ahead), so that its first
 * prefetches run while the scheduler plans. Only when every sequence of st sampled and holds
 * the block of its next position; the next exec_step uses it if its plan is that step, and
 * runs whole otherwise. Nothing to do (0) elsewhere; <0 only from the GPU. */
int exec_step_ahead(exec_t *e, const msg_step_t *st, const int32_t *tokens);
/* While no plan has come: carry the step started ahead a layer further (gpu_ahead_progress).
 * 1 if it did, 0 if there was nothing to do, <0 on an error (the step ahead is dropped). */
int exec_ahead_progress(exec_t *e);

/* The log-probabilities of the last exec_step that succeeded, for its result: one row per
 * sequence of its plan (msg_lp_rows_t: top_n -1 where the sequence did not sample with
 * logprobs), or every count 0 when no sequence asked. Points into e until the next exec_step. */
void exec_logprobs(const exec_t *e, msg_lp_rows_t *out);

void exec_get_stats(const exec_t *e, exec_stats_t *st);

/* CPU time of the calling thread, microseconds. */
double exec_thread_cpu_us(void);

/* The uniform draw number n of the stream seeded with seed (sampler_rng_*), as exec_step uses it. */
double exec_draw(uint64_t seed, uint64_t n);

#endif
