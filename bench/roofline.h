/* roofline.h - the physical bound on decode speed (DESIGN.md "Physical limits") and the
 * machine ceilings it is computed from.
 *
 * One decode step of `batch` sequences must at least:
 *   - read from GPU memory the resident weights (attention, norms, routers, shared expert,
 *     dense MLPs, lm_head), every sequence's KV cache (a sliding-window layer only its last
 *     window of positions), and the routed experts found in the expert cache, with the bias
 *     vectors of those experts where the model has them (gpt-oss: resident, indexed by expert);
 *   - get the routed experts that miss the cache either over PCIe (then the GPU reads them
 *     too) or computed on the CPU from host memory.
 * Three bounds, each named for what it counts (M = missed expert bytes, x = the share of them
 * computed on the CPU):
 *   pcie_only    x = 0: every miss crosses PCIe. T = max(GPU term, M / pcie). What an engine
 *                that computes every expert on the GPU can reach.
 *   bw_added     the transfer and the CPU path run in parallel, each at its alone-rate:
 *                T(x) = max( (resident + kv + hit + (1-x) M) / hbm,  (1-x) M / pcie,  x M / cpu ),
 *                min over x in [0,1] (closed form in roofline_decode). When the GPU term does
 *                not bind this is M / (pcie + cpu): the two bandwidths add.
 *   host_shared  the same, but a DMA and the CPU both read host memory, so their sum is capped
 *                by the rate measured with both running at once (machine_t.host_bw):
 *                T(x) = max( bw_added's three terms,  ((1-x) M + x M) / host ). The host term is
 *                M / host whatever the split, so the bound is max(T_bw_added, M / host).
   three_tier   host_shared, with the experts that host memory does not hold read from disk
 *                first (a host budget, [prefetcher.N] host_mem): of the bytes that must come from
 *                host memory (the misses; on the CPU backend every expert touched), the share
 *                1 - H / N is on disk (H experts' worth in host memory, N in all, uniform and
 *                independent of the GPU's cache), so T = max(T_host_shared, D / disk) with D
 *                those bytes. Without a host budget it is host_shared.
 * Without a GPU (the CPU backend) every byte comes from host memory: T = all bytes / cpu, and
 * the first three coincide. "hit" includes the bias vectors of the hit experts (expert_vec_bytes); a
 * missed expert's, under 0.3 % of its matrices at gpt-oss's sizes, are left to whichever path
 * computes it and counted nowhere, so each bound stays a bound.
 *
 * Routing is uniform: each token picks top_k distinct experts of E at random, so a step of B
 * tokens touches E (1 - (1 - k/E)^B) distinct experts per MoE layer, and a cache of S slots
 * over N = layers * E experts hits S / N of them (any replacement policy, uniform accesses),
 * unless a measured hit rate is given. Compute (FLOPs) is not a term: decode at these batch
 * sizes is bound by memory traffic. Prefill is not bounded here.
 */
#ifndef STRATA_BENCH_ROOFLINE_H
#define STRATA_BENCH_ROOFLINE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "common/strata.h"
#include "kernels/cpu/threadpool.h"
#include "model/model.h"
#include "model/packed.h"

/* A machine's ceilings. Bandwidths in bytes per second. */
typedef struct {
    char name[64];
    double gpu_mem;   /* bytes of GPU memory; 0 = no GPU */
    double hbm_bw;    /* GPU memory read bandwidth; 0 = no GPU */
    double pcie_bw;   /* host -> GPU copy bandwidth from pinned memory */
    double cpu_bw;    /* host memory read bandwidth, all sockets, the CPU alone */
    double host_bw;   /* host memory read by the H2D copy and the CPU at once (their sum, measured
                       * together: ceilings' host_shared_gb_s); 0 = unknown: roofline_host_bw's
                       * assumption */
    double disk_bw;   /* expert blocks read from disk (ceilings --disk: O_DIRECT, io_uring); 0 = unknown */
} machine_t;

/* When host_bw is unknown, both paths together are taken to read ROOFLINE_HOST_SHARED_FRACTION
 * of the sum of their alone-rates, and never less than the faster one alone: on the H200 host
 * a pinned copy alone read 54 GB/s and 16 CPU threads alone 81 GB/s, together 50 + 65 = 115,
 * 0.85 of 135. */
#define ROOFLINE_HOST_SHARED_FRACTION 0.85

/* The combined host read rate the host_shared bound uses for mc: mc->host_bw when measured,
 * else max(pcie, cpu, ROOFLINE_HOST_SHARED_FRACTION * (pcie + cpu)). *assumed (may be NULL) says
 * which. */
double roofline_host_bw(const machine_t *mc, bool *assumed);

/* The projection targets: RTX 3090 24 GB (936 GB/s) on PCIe 3 x16 at 12 GB/s with 2 x Xeon
 * E5-2699 v4 at 2 x 60 GB/s, and RTX 4090 24 GB (1008 GB/s) on PCIe 4 at 25 GB/s with DDR5 at
 * 80 GB/s. (24 GB = 24 GiB of device memory.) Neither has a measured host_bw: the assumption. */
extern const machine_t roofline_rtx3090;
extern const machine_t roofline_rtx4090;

/* What a model costs in bytes, from its packed layout. */
typedef struct {
    double resident_bytes;      /* weights read every step on the GPU: everything but the embedding, the
                                 * routed experts (data + scales) and their bias vectors */
    double embed_bytes;         /* embedding table (stays in host memory; a row per token is read) */
    double expert_bytes;        /* one routed expert: gate + up + down, data + scales (the largest one);
                                 * what a miss moves */
    double expert_vec_bytes;    /* one routed expert's bias vectors (gpt-oss: gate, up, down biases,
                                 * f32): resident with its layer (in the budget for every expert), read
                                 * only for the experts a step touches; 0 without expert biases */
    double kv_bytes_per_token;  /* K and V of every layer for one token, as this engine stores them (fp32) */
    double kv_window_bytes_per_token; /* the part of kv_bytes_per_token in sliding-window layers */
    int32_t sliding_window;     /* positions a sliding-window layer reads (itself included); 0 = none */
    int32_t n_moe_layers, n_experts, top_k;
    int64_t n_experts_total;    /* n_moe_layers * n_experts */
} roofline_model_t;

/* Bytes of config c laid out as pm (a packed manifest or plan). */
void roofline_model_from_manifest(roofline_model_t *rm, const model_config_t *c, const packed_manifest_t *pm);
/* Same from a config and formats (experts/shared/dense fmt, int4 group, attention projections
 * and lm_head attn_fmt: WF_BF16 as `strata pack`, or fmt as `--attn-format same`), through
 * packed_plan. 0 or <0 with eb set. */
int roofline_model_from_config(roofline_model_t *rm, const model_config_t *c, wfmt_t fmt, int group, wfmt_t attn_fmt,
                               strata_errbuf_t *eb);

/* One run's operating point. */
typedef struct {
    int32_t batch;          /* sequences decoding together (tokens per step) */
    double context;         /* average tokens held in each sequence's KV cache during the steps */
    double gpu_mem;         /* the budget (--gpu-mem) in bytes; 0 = the machine's gpu_mem */
    double reserved_bytes;  /* KV cache + workspace charged to the budget besides resident weights */
    double slots;           /* whole experts' worth on the GPU when known (gpu_stats_t.experts_on_gpu,
                             * may be fractional); < 0: slots from the budget */
    double hit_rate;        /* measured or assumed cache hit rate; < 0: uniform routing, slots / total */
    bool cpu_backend;       /* all weights in host memory, computed on the CPU */
    double host_experts;    /* whole experts' worth host memory holds (a host budget's slots); < 0: every
                             * expert (no disk tier) */
} roofline_run_t;

/* Defaults: batch 1, context 0, budget = machine, reserved 0, slots from the budget, uniform,
 * every expert in host memory. */
void roofline_run_default(roofline_run_t *r);

typedef struct {
    double distinct_experts;    /* per MoE layer per step */
    double slots;               /* expert slots (<= n_experts_total) */
    double hit_rate;
    double gpu_bytes;           /* read from GPU memory per step if every miss is transferred */
    double hit_bytes, miss_bytes, kv_bytes;  /* per step (kv: the positions read, windows applied) */
    double bytes_per_token;     /* (resident + kv + experts touched, with their bias vectors) / batch */
    /* the three bounds (roofline.h's header): aggregate decode tokens per second, the step time
     * each allows, and what binds ("hbm", "pcie", "pcie+cpu", "host memory", "cpu memory") */
    double pcie_only_tok_s, pcie_only_step_s;   /* 0 on the CPU backend (no PCIe) */
    const char *pcie_only_limit;
    double bw_added_tok_s, bw_added_step_s;
    const char *bw_added_limit;
    double cpu_share;           /* bw_added's best split: the fraction of the missed bytes on the CPU
                                 * (also a best split of host_shared) */
    double host_shared_tok_s, host_shared_step_s;
    const char *host_shared_limit;
    double host_bw;             /* the combined host read rate host_shared used (roofline_host_bw) */
    bool host_bw_assumed;       /* true: not measured, ROOFLINE_HOST_SHARED_FRACTION's assumption */
    double host_fraction;       /* of the experts, the share host memory holds (1 without a disk tier) */
    double disk_bytes;          /* per step, read from disk first */
    double three_tier_tok_s, three_tier_step_s; /* 0 when the disk is involved and disk_bw unknown */
    const char *three_tier_limit;               /* host_shared's, or "disk" */
} roofline_t;

/* The decode bound of model m on machine mc at operating point r. Returns 0, or
 * STRATA_EINVAL_INPUT if the machine cannot run it (GPU machine without hbm or pcie bandwidth,
 * CPU run without cpu bandwidth, batch < 1, resident weights larger than the budget). */
int roofline_decode(const roofline_model_t *m, const machine_t *mc, const roofline_run_t *r, roofline_t *out);

/* Host memory read bandwidth in bytes/s: every thread of pool streams its share of a `bytes`
 * buffer (well beyond the caches), best of `passes`. pool may be NULL (one thread). */
double roofline_cpu_membw(tpool_t *pool, size_t bytes, int passes);

/* Read `bytes` of buf once on every thread of pool (NULL: one thread), 16-byte loads whose
 * results are kept; returns the seconds it took. bytes is rounded down to 16 KiB. */
double roofline_cpu_read(tpool_t *pool, const void *buf, size_t bytes);

/* One line per machine: this one and the two projections, the three bounds, what binds the
 * host_shared one, and for this machine measured / each bound. */
void roofline_print(FILE *f, const roofline_model_t *m, const machine_t *here, const roofline_run_t *r,
                    double measured_tok_s);

#endif
