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
 *                curve_secret_key_file =   curve_clients_file =   insecure = false
 *                With curve_secret_key_file (a secret key of `strata keygen`), the client endpoint
 *                is ZeroMQ CURVE: encrypted, and clients need the router's public key. With
 *                curve_clients_file too, only the clients whose public keys it lists (and the
 *                group's own services) may connect. An endpoint that is not loopback needs
 *                curve_secret_key_file, unless insecure = true (config_check_router).
 *   [scheduler]  endpoint = ipc://{run_dir}/scheduler.sock   max_batch_tokens = 256
 *                max_seqs = 64   kv_blocks = 2048   block_size = 16   max_context = 0 (model's)
 *                cpus =   numa_node = -1
 *   [executor]   endpoint = ipc://{run_dir}/executor.sock   backend = cpu|cuda   threads = 0 (all cpus)
 *                gpu_mem = 0 (bytes; suffixes K M G GiB accepted)   cpus =   numa_node = -1
 *                prefetch_depth = -1 (cuda: MoE layers ahead to prefetch, 0 off; -1 the backend's default;
 *                cpu with a disk tier: MoE layers ahead whose predicted experts are read ahead from disk, default 4)
 *                expert_cache = split|whole (cuda, when the experts do not all fit: every expert
 *                resident but its down projection's last rows, which slots cache (split, default),
 *                or slots caching whole experts)
 *                cpu_act = f32|q8 (INT4 and MXFP4 matmul activations on the CPU; default STRATA_CPU_ACT,
 *                else f32 on the cpu backend, and on cuda the rows the GPU's experts read: q8 for
 *                INT4 experts, f32 for MXFP4)
 *   [prefetcher.N]  (one per NUMA node N) endpoint = ipc://{run_dir}/prefetcher-N.sock
 *                numa_node = N   cpus =   threads = 0
 *                host_mem = (bytes, e.g. 16G, or a fraction of the node's free memory, 0.5 or 50%):
 *                the arena's budget. Unset, the arena holds the whole model; set, it holds the
 *                resident tensors and as many expert slots as fit, and the experts are read
 *                from the packed files on disk into the slots on demand (store/arena.h)
 *   [launcher]   restart_backoff_ms = 200   restart_backoff_max_ms = 10000   ready_timeout_s = 60
 *                watchdog_s = 30 (WATCHDOG_USEC given to services; 0 = off)
 *   [http]       (optional; its presence starts strata-http, the OpenAI-compatible HTTP service)
 *                host = 127.0.0.1   port = 7758   api_key =   api_key_file =   insecure = false
 *                max_body_bytes = 4M   max_connections = 1024   timeout_s = 30 (idle connection)
 *                request_timeout_s = 600   model_name = (the router's model name)   threads = 0 (auto)
 *                cpus =   numa_node = -1
 *                A host that is not a loopback address needs api_key or api_key_file, unless
 *                insecure = true (config_check_http).
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
        char curve_secret_key_file[512]; /* the router's CURVE secret key (Z85 text, mode 0600); "" = no CURVE */
        char curve_clients_file[512];    /* public keys (Z85) of the clients it serves, one a line; "" = any key */
        bool insecure;                   /* bind a non-loopback endpoint without CURVE (warned at every start) */
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
        int64_t host_mem;    /* host budget of the arena, bytes; 0 = none (the whole model) */
        double host_mem_frac;/* or this fraction of the node's free memory at the arena's build; 0 = none */
        config_placement_t place;
    } prefetcher[CONFIG_MAX_PREFETCHERS];

    struct {
        int restart_backoff_ms;
        int restart_backoff_max_ms;
        int ready_timeout_s;
        int watchdog_s;   /* a READY service silent for this long is killed and restarted; 0 = off */
    } launcher;

    struct {
        bool enabled;             /* the file has an [http] section: the launcher starts strata-http */
        char host[128];           /* address or name to listen on (default 127.0.0.1) */
        int port;                 /* 1-65535 (default 7758) */
        char api_key[160];        /* "": none (then api_key_file, if set) */
        char api_key_file[512];   /* file whose first line is the key; "" none */
        bool insecure;            /* serve a non-loopback address without a key (warned at every start) */
        int64_t max_body_bytes;   /* largest request body; more is refused with 413 */
        int max_connections;      /* concurrent HTTP connections */
        int timeout_s;            /* an idle or stalled connection is closed after this */
        int request_timeout_s;    /* longest a generation may take before it is canceled */
        char model_name[128];     /* the model id clients see and send; "" = the router's model name */
        int threads;              /* HTTP workers; 0: half the usable cpus, 1 to 8 */
        config_placement_t place;
    } http;
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
/* The [http] section's bind address (resolved) is loopback, or a key is configured, or insecure
 * is set; 0 also when there is no [http] section. *loopback (may be NULL) says which. 0, or
 * STRATA_EINVAL_INPUT with eb naming the section, the key and what to do. */
int config_check_http(const strata_config_t *c, const char *name, bool *loopback, strata_errbuf_t *eb);
/* The [router] endpoint is loopback (or ipc://), or curve_secret_key_file is set, or insecure is
 * set. *loopback (may be NULL) says whether it is loopback. 0, or STRATA_EINVAL_INPUT with eb
 * naming the endpoint and the keys to set. */
int config_check_router(const strata_config_t *c, const char *name, bool *loopback, strata_errbuf_t *eb);

/* A CURVE key in Z85 text: 40 characters and a NUL. */
#define CONFIG_CURVE_KEY_LEN 40
/* The key of a key file of `strata keygen`: one line of 40 Z85 characters (lines starting with
 * '#' and blank lines are ignored). secret: the file must not be readable by other users (mode
 * 0600); otherwise no other user may write it (it decides whom this process trusts). what names
 * the key in messages (e.g. "[router] curve_secret_key_file"). 0, or STRATA_EINVAL_INPUT /
 * STRATA_EIO with eb naming what, the file and what to do. */
int config_read_curve_key(const char *path, bool secret, const char *what, char out[CONFIG_CURVE_KEY_LEN + 1],
                          strata_errbuf_t *eb);

/* One client of [router] curve_clients_file. */
typedef struct {
    char key[CONFIG_CURVE_KEY_LEN + 1]; /* public key, Z85 */
    char name[64];                      /* the rest of its line (a comment, e.g. who holds it), "" none */
} config_curve_client_t;
#define CONFIG_MAX_CURVE_CLIENTS 65536
/* Parse a clients file: one public key (Z85) a line, optionally followed by whitespace and a
 * name; '#' lines and blank lines are ignored. No other user may write the file. *out is
 * malloc'd (free it; NULL with *n 0 for an empty list). 0, or a negative error with eb naming
 * the file and the line. */
int config_read_curve_clients(const char *path, config_curve_client_t **out, int *n, strata_errbuf_t *eb);
/* 1 if s (any length) is a key: 40 characters of the Z85 alphabet whose every group of five
 * encodes a 32-bit value; else 0. */
int config_z85_key_ok(const char *s, size_t len);

#endif
