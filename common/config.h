/* config.h - the process group's config file (INI, parsed with inih).
 *
 * One file configures the whole group; every service reads it with --config FILE.
 * Unknown sections or keys are errors that name the file, line and key. Missing keys take
 * the defaults below. "{run_dir}" in an endpoint is replaced by group.run_dir.
 *
 *   [group]      name = strata          run_dir = /tmp/strata-<name>
 *                model = DIR (packed or HF folder)   tokenizer = FILE (default DIR/tokenizer.json)
 *   [router]     endpoint = tcp://127.0.0.1:7757   max_frame_bytes = 1048576
 *                max_queue = 1024   max_inflight_per_client = 64   cpus = 0-1   numa_node = -1
 *   [scheduler]  endpoint = ipc://{run_dir}/scheduler.sock   max_batch_tokens = 256
 *                max_seqs = 64   kv_blocks = 2048   block_size = 16   max_context = 0 (model's)
 *                cpus =   numa_node = -1
 *   [executor]   endpoint = ipc://{run_dir}/executor.sock   backend = cpu|cuda   threads = 0 (all cpus)
 *                gpu_mem = 0 (bytes; suffixes K M G GiB accepted)   cpus =   numa_node = -1
 *                prefetch_depth = -1 (cuda: MoE layers ahead to prefetch, 0 off; -1 the backend's default)
 *                expert_cache = split|whole (cuda, when the experts do not all fit: every expert
 *                resident but its down projection's last rows, which slots cache (split, default),
 *                or slots caching whole experts)
 *                cpu_act = f32|q8 (cpu backend: INT4 matmul activations; default STRATA_CPU_ACT, else f32)
 *   [prefetcher.N]  (one per NUMA node N) endpoint = ipc://{run_dir}/prefetcher-N.sock
 *                numa_node = N   cpus =   threads = 0
 *   [launcher]   restart_backoff_ms = 200   restart_backoff_max_ms = 10000   ready_timeout_s = 60
 *                watchdog_s = 30 (WATCHDOG_USEC given to services; 0 = off)
 *
 * cpus is a cpulist ("0-3,8"); empty means no pinning. numa_node -1 means no memory policy.
 */
#ifndef STRATA_CONFIG_H
#define STRATA_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include "common/strata.h"

#define CONFIG_MAX_PREFETCHERS 8

typedef struct {
    char cpus[128];       /* cpulist, "" = not pinned */
    int numa_node;        /* -1 = no policy */
} config_placement_t;

typedef struct {
    char name[64];
    char run_dir[256];
    char model[512];
    char tokenizer[512];

    struct {
        char endpoint[256];
        int64_t max_frame_bytes;
        int max_queue;
        int max_inflight_per_client;
        config_placement_t place;
    } router;

    struct {
        char endpoint[256];
        int max_batch_tokens;
        int max_seqs;
        int kv_blocks;
        int block_size;
        int max_context;
        config_placement_t place;
    } scheduler;

    struct {
        char endpoint[256];
        char backend[16];  /* "cpu" or "cuda" */
        int threads;
        char cpu_act[8];   /* "f32", "q8", or "" (STRATA_CPU_ACT, else f32) */
        int64_t gpu_mem;
        int prefetch_depth; /* -1: the backend's default */
        char expert_cache[8]; /* "split", "whole", or "" (split) */
        char expert_path[8];  /* where experts not in GPU memory run: "auto" (the executor decides: the CPU
                                 backend as below, the GPU backend copies them), "cpu" (every expert in a
                                 prefetcher's arena, on the GPU backend every miss, runs on that prefetcher's
                                 cores), "pcie" (none), "cost" (GPU backend: a cost model splits each layer's
                                 misses between copies and the prefetchers' cores) or "static" (GPU backend:
                                 every expert of the first cpu_moe_layers MoE layers on the CPU, the rest
                                 cached on the GPU; llama.cpp's --n-cpu-moe) */
        int cpu_moe_layers;   /* static: those layers; 0 = as many as the expert slots leave out */
        int cpu_expert_timeout_ms; /* longest wait for a prefetcher's experts before computing them here */
        config_placement_t place;
    } executor;

    int n_prefetchers;
    struct {
        int node;
        char endpoint[256];
        int threads;
        config_placement_t place;
    } prefetcher[CONFIG_MAX_PREFETCHERS];

    struct {
        int restart_backoff_ms;
        int restart_backoff_max_ms;
        int ready_timeout_s;
        int watchdog_s;   /* a READY service silent for this long is killed and restarted; 0 = off */
    } launcher;
} strata_config_t;

/* Fill c with defaults (group name "strata"). */
void config_defaults(strata_config_t *c);
/* Parse an INI file over the defaults. On error returns <0; eb names file, line and key. */
int config_load(strata_config_t *c, const char *path, strata_errbuf_t *eb);
/* Same from a string (fuzzing, tests). */
int config_parse(strata_config_t *c, const char *text, const char *name, strata_errbuf_t *eb);
/* What the parser cannot see in the text: the directory of every ipc:// endpoint, but the run
 * dir (strata up makes that), exists and belongs to this user. name: the config, for messages.
 * 0, or STRATA_EINVAL_INPUT with eb naming the section, the endpoint and the directory. */
int config_check_paths(const strata_config_t *c, const char *name, strata_errbuf_t *eb);

#endif
