/* gpu_decode - decode and prefill speed of a real-shaped MoE model on one GPU under a memory
 * budget, next to the physical bound (bench/roofline.h). No process group: the model is built
 * in this process and driven through model/gpu.h directly.
 *
 *   1. ceilings: host memory read bandwidth, pinned host->GPU copy bandwidth, GPU memory read
 *      bandwidth (kernels/cuda/probe.h), and host memory read by the copy and the CPU at once
 *      (bench/shared_probe.h);
 *   2. the model: --shape S builds a synthetic model of that shape in memory on every core
 *      (model/synth_fast.h: the same bytes `strata synth` writes), --model DIR maps a packed
 *      folder (a virtual synthetic folder is generated in memory instead);
 *   3. gpu_model_create under --gpu-mem (resident weights, KV, workspace, expert slots);
 *   4. for each batch size B: B sequences prefill a short prompt, decode --warmup steps, then
 *      --steps timed steps (random token ids in, argmax out): tok/s (aggregate and per sequence), expert-cache hit rate,
 *      prefetch accuracy, PCIe GB/s;
 *   5. one --prefill-token prompt in chunks of the step size: prefill tok/s;
 *   6. the three roofline bounds for each run on this machine (uniform routing over the measured
 *      slot count): PCIe only, PCIe + CPU with the bandwidths added (also at the measured hit
 *      rate), PCIe + CPU with host memory shared; measured / each, and the bounds projected onto
 *      an RTX 3090 / PCIe 3 / 2 x E5-2699 v4 and an RTX 4090 / PCIe 4 / DDR5.
 * A table on stdout; --json FILE writes the rows, --results FILE appends them as results rows
 * (bench/results.h, JSON lines). --backend cpu runs the same loop through the
 * CPU forward pass (no cache; the bound is then host memory), which is how it is tested on a
 * machine without a GPU.
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "build_commit.h"
#include "bench/results.h"
#include "bench/roofline.h"
#include "bench/shapes.h"
#include "kernels/cpu/ops.h"
#include "model/synth_fast.h"
#ifdef STRATA_HAVE_CUDA
#include "kernels/cuda/cuda_ops.h"
#include "bench/shared_probe.h"
#include "kernels/cuda/probe.h"
#include "model/gpu.h"
#endif

#define GIB (1024.0 * 1024.0 * 1024.0)
#define MAX_BATCHES 16

typedef struct {
    const char *shape, *model, *fmt, *skew, *json, *results, *backend, *attn_fmt;
    int group, steps, warmup, prompt, prefill, threads, device, prefetch_depth, max_tokens;
    int64_t gpu_mem;
    uint64_t seed;
    int batches[MAX_BATCHES], n_batches;
    bool no_graphs, no_probe, whole_experts, no_blas;
    double probe_mib;
} s_opts_t;

static void s_help(FILE *f)
{
    char shapes[1024];
    shape_list(shapes, sizeof shapes);
    fprintf(f,
            "usage: gpu_decode (--shape S [--format F] | --model DIR) [options]\n\n"
            "Decode (batch 1 and 16 by default) and 512-token prefill speed of a model on one GPU under\n"
            "--gpu-mem, with expert-cache hit rate, prefetch accuracy, PCIe GB/s, and three roofline\n"
            "bounds (PCIe only; PCIe + CPU, bandwidths added; PCIe + CPU, host memory shared) with the\n"
            "ratio measured/bound of each and their projection onto RTX 3090 and RTX 4090 hosts.\n\n"
            "  --shape S          build a synthetic model of shape S in memory (%s)\n"
            "  --format F         int4 (default), mxfp4, fp8, int8, bf16 (with --shape)\n"
            "  --attn-format F    attention projections and lm_head: bf16 (default) or 'same' as --format\n"
            "                     (with --shape; 'same' with int4 is 4.5 bits everywhere, as llama.cpp's Q4_0)\n"
            "  --group G          int4 group (default 32)\n"
            "  --seed N           synthetic weights seed (default 1)\n"
            "  --route-skew K     uniform (default) or zipf:S (synthetic expert popularity)\n"
            "  --model DIR        a packed model folder instead (virtual synthetic folders are\n"
            "                     generated in memory)\n"
            "  --gpu-mem BYTES    GPU memory budget (K/M/G suffixes; default 0 = no budget)\n"
            "  --batch LIST       decode batch sizes, comma-separated (default 1,16)\n"
            "  --steps N          timed decode steps per batch size (default 64)\n"
            "  --warmup N         untimed decode steps first (default 8)\n"
            "  --prompt N         tokens each sequence holds before decoding (default 32)\n"
            "  --prefill N        prefill prompt length (default 512; 0 = skip)\n"
            "  --max-tokens N     most tokens a step carries (default 512)\n"
            "  --prefetch-depth D MoE layers ahead to predict and prefetch (default: the GPU model's, 2 with split\n"
            "                     experts, 16 with whole ones; 0 = off)\n"
            "  --no-graphs        no CUDA graphs\n"
            "  --no-blas          no cuBLAS for prefill-sized matmuls (default: with every expert resident,\n"
            "                     when the budget has room for a dequantized matrix)\n"
            "  --whole-experts    a budget's slots hold whole experts (default: when not every expert fits,\n"
            "                     every expert stays resident but the last rows of its down projection)\n"
            "  --device N         CUDA device (default 0)\n"
            "  --backend B        cuda (default when built with CUDA) or cpu\n"
            "  --threads T        CPU threads for building the model and the cpu backend (0 = all)\n"
            "  --no-probe         skip the bandwidth probes (use 0: no bound)\n"
            "  --probe-mib N      size of the bandwidth probe buffers (default 1024)\n"
            "  --json FILE        write the rows as JSON (an array)\n"
            "  --results FILE     append the rows to FILE as results rows (JSON lines, bench/README.md\n"
            "                     \"Results\"): case, date, commit, machine, command, figure, bound\n"
            "  -h, --help         this help\n\n"
            "Exit codes: 0 ok, 1 runtime failure (no GPU, out of memory), 2 bad usage.\n",
            shapes);
}

static int s_parse_list(const char *s, int *out, int cap, int *n)
{
    *n = 0;
    while (*s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 1 || v > 4096 || *n == cap) return -1;
        out[(*n)++] = (int)v;
        s = end;
        if (*s == ',') s++;
        else if (*s) return -1;
    }
    return *n ? 0 : -1;
}

/* GPU memory this process holds as nvidia-smi reports it (MiB), or -1 without nvidia-smi. */
static double s_smi_mib(void)
{
    FILE *f = popen("nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null", "r");
    if (!f) return -1;
    char line[256];
    double mib = -1;
    long me = (long)getpid();
    while (fgets(line, sizeof line, f)) {
        long pid = 0;
        double m = 0;
        if (sscanf(line, "%ld , %lf", &pid, &m) == 2 && pid == me) mib = m;
    }
    pclose(f);
    return mib;
}

/* ---- backends: the GPU model, or the CPU forward pass --------------------------------- */

typedef struct {
    bool cuda;
    const model_t *m;
#ifdef STRATA_HAVE_CUDA
    gpu_model_t *g;
#endif
    tpool_t *pool;
    forward_ctx_t *fwd;
    kv_cache_t kv;
    float *logits;
    int32_t kv_blocks, block_size, max_tokens;
} s_be_t;

static int s_step(s_be_t *be, const batch_t *b, int32_t *ids)
{
#ifdef STRATA_HAVE_CUDA
    if (be->cuda) return gpu_forward_greedy(be->g, b, ids);
#endif
    int rc = model_forward(be->fwd, &be->kv, b, be->logits);
    if (rc < 0) return rc;
    const int V = be->m->cfg.vocab;
    for (int32_t r = 0; r < b->n_logits; r++) {
        const float *l = be->logits + (size_t)r * V;
        int best = 0;
        for (int v = 1; v < V; v++)
            if (l[v] > l[best]) best = v;
        ids[r] = best;
    }
    return 0;
}

#define S_MAX_LAYERS 256

typedef struct {
    uint64_t expert_uses, hits, misses, host_reads, prefetches, prefetch_used, bytes_h2d;
    uint64_t layer[S_MAX_LAYERS][4]; /* per layer: uses, hits, prefetches, prefetch_used */
    int32_t n_layers;
    int32_t slots, split_rows; /* the cache's slots (whole experts or tails); split rows or 0 */
    double experts_on_gpu;     /* the roofline's slots (gpu_stats_t) */
    int64_t resident_bytes, kv_bytes, workspace_bytes, budget_used;
    bool valid;
} s_cache_t;

static void s_stats(s_be_t *be, s_cache_t *c, bool reset)
{
    memset(c, 0, sizeof *c);
#ifdef STRATA_HAVE_CUDA
    if (be->cuda) {
        gpu_stats_t st;
        gpu_get_stats(be->g, &st);
        c->expert_uses = st.expert_uses, c->hits = st.hits, c->misses = st.misses, c->prefetches = st.prefetches;
        c->host_reads = st.host_reads;
        c->prefetch_used = st.prefetch_used, c->bytes_h2d = st.bytes_h2d, c->slots = st.slots;
        c->split_rows = st.split_rows, c->experts_on_gpu = st.experts_on_gpu;
        c->resident_bytes = st.resident_bytes, c->kv_bytes = st.kv_bytes, c->workspace_bytes = st.workspace_bytes;
        c->budget_used = st.budget_used, c->valid = true;
        gpu_layer_stats_t ls[S_MAX_LAYERS];
        c->n_layers = gpu_get_layer_stats(be->g, ls, S_MAX_LAYERS);
        if (c->n_layers > S_MAX_LAYERS) c->n_layers = S_MAX_LAYERS;
        for (int l = 0; l < c->n_layers; l++) {
            c->layer[l][0] = ls[l].uses, c->layer[l][1] = ls[l].hits;
            c->layer[l][2] = ls[l].prefetches, c->layer[l][3] = ls[l].prefetch_used;
        }
        if (reset) gpu_reset_stats(be->g);
    }
#else
    (void)be;
    (void)reset;
#endif
}

/* Per-layer cache figures of a run (MoE layers that served experts): JSON, and the spread
 * of the hit rate on stdout. */
static json_t *s_layers_json(const s_cache_t *c)
{
    json_t *a = json_array();
    double lo = 2, hi = -1;
    int llo = -1, lhi = -1;
    for (int l = 0; l < c->n_layers; l++) {
        const uint64_t *v = c->layer[l];
        if (!v[0]) continue;
        double h = (double)v[1] / (double)v[0];
        if (h < lo) lo = h, llo = l;
        if (h > hi) hi = h, lhi = l;
        json_array_append_new(a, json_pack("{s:i,s:I,s:f,s:I,s:o}", "layer", l, "uses", (json_int_t)v[0], "hit_rate", h,
                                           "prefetches", (json_int_t)v[2], "prefetch_accuracy",
                                           v[2] ? json_real((double)v[3] / (double)v[2]) : json_null()));
    }
    if (llo >= 0 && lo < 1)
        printf("         hit rate per layer: lowest %.3f (layer %d), highest %.3f (layer %d)\n", lo, llo, hi, lhi);
    return a;
}

/* ---- one decode measurement ----------------------------------------------------------- */

typedef struct {
    int batch;
    double decode_tok_s, per_seq_tok_s, step_ms;
    s_cache_t cache;
    double seconds;
    double context;        /* average KV tokens per sequence during the timed steps */
    int32_t prefill_tokens;
    double prefill_tok_s;
} s_res_t;

static int s_decode(s_be_t *be, const s_opts_t *o, int B, int32_t nb_per_seq, s_res_t *res)
{
    int rc = 0;
    const int V = be->m->cfg.vocab;
    int32_t *blocks = malloc(sizeof(int32_t) * (size_t)B * nb_per_seq);
    const int32_t **bts = malloc(sizeof(*bts) * (size_t)B);
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)(B > o->prompt ? B : o->prompt) * 2);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)(B > o->prompt ? B : o->prompt) * 2);
    int32_t *seq = malloc(sizeof(int32_t) * (size_t)(B > o->prompt ? B : o->prompt) * 2);
    int32_t *rows = malloc(sizeof(int32_t) * (size_t)B);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)B);
    int32_t *last = malloc(sizeof(int32_t) * (size_t)B);
    int32_t *npos = malloc(sizeof(int32_t) * (size_t)B);
    if (!blocks || !bts || !tok || !pos || !seq || !rows || !ids || !last || !npos) {
        rc = -ENOMEM;
        goto done;
    }
    for (int i = 0; i < B * nb_per_seq; i++) blocks[i] = i;
    for (int i = 0; i < B; i++) bts[i] = blocks + (size_t)i * nb_per_seq;
    uint64_t st = o->seed * 31 + (uint64_t)B;
    /* prompts: one step per sequence */
    for (int i = 0; i < B; i++) {
        for (int t = 0; t < o->prompt; t++) {
            tok[t] = (int32_t)(strata_splitmix64(&st) % (uint64_t)V);
            pos[t] = t;
            seq[t] = i;
        }
        int32_t row = o->prompt - 1;
        batch_t b = {o->prompt, tok, pos, seq, bts, 1, &row};
        if ((rc = s_step(be, &b, &ids[i])) < 0) goto done;
        last[i] = ids[i];
        npos[i] = o->prompt;
    }
    for (int i = 0; i < B; i++) rows[i] = i;
    s_cache_t dummy;
    double t0 = 0;
    for (int s = 0; s < o->warmup + o->steps; s++) {
        if (s == o->warmup) {
            s_stats(be, &dummy, true);
            t0 = strata_now();
        }
        /* Each step feeds fresh random token ids, not the argmax: on random weights greedy
         * feedback repeats one token, which pins the routing to the same experts every step
         * and would measure a skewed, not a uniform, expert load. The step's cost is the same. */
        for (int i = 0; i < B; i++) {
            tok[i] = (int32_t)((strata_splitmix64(&st) ^ (uint64_t)last[i]) % (uint64_t)V);
            pos[i] = npos[i]++;
            seq[i] = i;
        }
        batch_t b = {B, tok, pos, seq, bts, B, rows};
        if ((rc = s_step(be, &b, ids)) < 0) goto done;
        memcpy(last, ids, sizeof(int32_t) * (size_t)B);
    }
    res->seconds = strata_now() - t0;
    res->batch = B;
    res->decode_tok_s = (double)B * o->steps / res->seconds;
    res->per_seq_tok_s = (double)o->steps / res->seconds;
    res->step_ms = 1e3 * res->seconds / o->steps;
    res->context = o->prompt + o->warmup + o->steps / 2.0;
    s_stats(be, &res->cache, false);
done:
    free(blocks), free(bts), free(tok), free(pos), free(seq), free(rows), free(ids), free(last), free(npos);
    return rc;
}

/* One prompt of n tokens in steps of at most max_tokens; tok/s over the whole prompt. */
static int s_prefill(s_be_t *be, const s_opts_t *o, int n, s_res_t *res)
{
    int rc = 0;
    const int V = be->m->cfg.vocab, T = be->max_tokens;
    int32_t nb = (n + be->block_size - 1) / be->block_size;
    int32_t *bt = malloc(sizeof(int32_t) * (size_t)nb), *tok = malloc(sizeof(int32_t) * (size_t)T),
            *pos = malloc(sizeof(int32_t) * (size_t)T), *seq = calloc((size_t)T, sizeof(int32_t)), id = 0;
    if (!bt || !tok || !pos || !seq) {
        rc = -ENOMEM;
        goto done;
    }
    for (int i = 0; i < nb; i++) bt[i] = i;
    const int32_t *bts[1] = {bt};
    uint64_t st = o->seed * 77 + 5;
    s_cache_t dummy;
    for (int pass = 0; pass < 2; pass++) { /* the first pass warms up */
        if (pass == 1) s_stats(be, &dummy, true);
        double t0 = strata_now();
        for (int p0 = 0; p0 < n; p0 += T) {
            int k = n - p0 < T ? n - p0 : T;
            for (int t = 0; t < k; t++) {
                tok[t] = (int32_t)(strata_splitmix64(&st) % (uint64_t)V);
                pos[t] = p0 + t;
            }
            int32_t row = k - 1;
            batch_t b = {k, tok, pos, seq, bts, 1, &row};
            if ((rc = s_step(be, &b, &id)) < 0) goto done;
        }
        res->seconds = strata_now() - t0;
    }
    res->batch = 1;
    res->prefill_tokens = n;
    res->prefill_tok_s = n / res->seconds;
    res->context = n / 2.0;
    s_stats(be, &res->cache, false);
done:
    free(bt), free(tok), free(pos), free(seq);
    return rc;
}

/* ---- output ---------------------------------------------------------------------------- */

static json_t *s_proj(const roofline_model_t *rm, const roofline_run_t *r)
{
    json_t *p = json_object();
    const machine_t *ms[2] = {&roofline_rtx3090, &roofline_rtx4090};
    const char *names[2] = {"rtx3090_pcie3_2xe5v4", "rtx4090_pcie4_ddr5"};
    for (int i = 0; i < 2; i++) {
        roofline_run_t rr = *r;
        rr.cpu_backend = false;
        rr.slots = -1;
        rr.hit_rate = -1;
        if (rr.gpu_mem <= 0 || rr.gpu_mem > ms[i]->gpu_mem) rr.gpu_mem = ms[i]->gpu_mem;
        roofline_t o;
        if (roofline_decode(rm, ms[i], &rr, &o) == 0)
            json_object_set_new(p, names[i],
                                json_pack("{s:f,s:f,s:f,s:f,s:f,s:s,s:f}", "bound_tok_s", o.bw_added_tok_s,
                                          "bound_pcie_only_tok_s", o.pcie_only_tok_s, "bound_host_shared_tok_s",
                                          o.host_shared_tok_s, "hit_rate", o.hit_rate, "cpu_share", o.cpu_share, "limit",
                                          o.bw_added_limit, "host_shared_gb_s_assumed", o.host_bw / 1e9));
        else
            json_object_set_new(p, names[i], json_null());
    }
    return p;
}

/* The three bounds of b (NULL: none) into row, each with measured / it: bound_pcie_only_tok_s,
 * bound_bw_added_tok_s, bound_host_shared_tok_s and ratio_*, their limits, the host rate the
 * shared one used; bound_tok_s and bound_limit stay the bandwidths-added bound's. */
static void s_bounds_json(json_t *row, const roofline_t *b, double tok_s)
{
#define S_B(key, v) json_object_set_new(row, key, b && (v) > 0 ? json_real(v) : json_null())
#define S_R(key, v) json_object_set_new(row, key, b && (v) > 0 ? json_real(tok_s / (v)) : json_null())
    S_B("bound_pcie_only_tok_s", b ? b->pcie_only_tok_s : 0);
    S_R("ratio_pcie_only", b ? b->pcie_only_tok_s : 0);
    S_B("bound_bw_added_tok_s", b ? b->bw_added_tok_s : 0);
    S_R("ratio_bw_added", b ? b->bw_added_tok_s : 0);
    S_B("bound_host_shared_tok_s", b ? b->host_shared_tok_s : 0);
    S_R("ratio_host_shared", b ? b->host_shared_tok_s : 0);
    S_B("bound_tok_s", b ? b->bw_added_tok_s : 0);
    S_B("host_shared_gb_s_used", b ? b->host_bw / 1e9 : 0);
#undef S_B
#undef S_R
    json_object_set_new(row, "host_shared_assumed", b ? json_boolean(b->host_bw_assumed) : json_null());
    json_object_set_new(row, "bound_limit", b ? json_string(b->bw_added_limit) : json_null());
    json_object_set_new(row, "bound_pcie_only_limit", b && b->pcie_only_tok_s > 0 ? json_string(b->pcie_only_limit) : json_null());
    json_object_set_new(row, "bound_host_shared_limit", b ? json_string(b->host_shared_limit) : json_null());
}

/* The results case of a run (bench/results.h): shape, formats, budget, batch (0: the prefill of
 * `prefill` tokens), and the options that change the figure. */
static void s_case(char *buf, size_t cap, const s_opts_t *o, const char *shape, wfmt_t fmt, int group, wfmt_t attn,
                   int batch, int max_batch, int prefill, bool cuda)
{
    char budget[32], what[96], extra[160] = "";
    results_budget_name(budget, sizeof budget, (double)o->gpu_mem);
    if (batch > 0) {
        int n = snprintf(what, sizeof what, "batch %d decode", batch);
        /* under a budget the step's KV is sized for the largest batch, which takes expert slots */
        if (o->gpu_mem > 0 && max_batch != batch) snprintf(what + n, sizeof what - (size_t)n, " (KV for %d)", max_batch);
    } else {
        snprintf(what, sizeof what, "prefill %d", prefill);
    }
    size_t n = 0;
    if (attn != fmt) n += (size_t)snprintf(extra + n, sizeof extra - n, " attn %s", wfmt_name(attn));
    if (fmt == WF_INT4 && group != 32) n += (size_t)snprintf(extra + n, sizeof extra - n, " g%d", group);
    if (o->skew && strcmp(o->skew, "uniform")) n += (size_t)snprintf(extra + n, sizeof extra - n, " %s", o->skew);
    if (o->whole_experts) n += (size_t)snprintf(extra + n, sizeof extra - n, " whole-experts");
    if (o->no_graphs) n += (size_t)snprintf(extra + n, sizeof extra - n, " no-graphs");
    if (o->no_blas) n += (size_t)snprintf(extra + n, sizeof extra - n, " no-blas");
    if (o->prefetch_depth >= 0) snprintf(extra + n, sizeof extra - n, " prefetch-depth %d", o->prefetch_depth);
    snprintf(buf, cap, "%s %s%s %s %s [gpu_decode%s]", shape, wfmt_name(fmt), extra, budget, what, cuda ? "" : " cpu");
}

int main(int argc, char **argv)
{
    s_opts_t o = {.fmt = "int4", .group = 32, .steps = 64, .warmup = 8, .prompt = 32, .prefill = 512, .seed = 1,
                  .prefetch_depth = -1, .max_tokens = 512, .probe_mib = 1024, .batches = {1, 16}, .n_batches = 2};
#ifdef STRATA_HAVE_CUDA
    o.backend = "cuda";
#else
    o.backend = "cpu";
#endif
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEED()                                                                  \
    do {                                                                        \
        if (!v) {                                                               \
            fprintf(stderr, "gpu_decode: %s needs a value (see --help)\n", a);  \
            return 2;                                                           \
        }                                                                       \
        i++;                                                                    \
    } while (0)
#define INTARG(field, lo, hi)                                                                     \
    do {                                                                                          \
        NEED();                                                                                   \
        char *e_;                                                                                 \
        long x_ = strtol(v, &e_, 10);                                                             \
        if (*e_ || e_ == v || x_ < (lo) || x_ > (hi)) {                                           \
            fprintf(stderr, "gpu_decode: %s '%s': expected an integer in [%d, %d]\n", a, v, (int)(lo), (int)(hi)); \
            return 2;                                                                             \
        }                                                                                         \
        field = (int)x_;                                                                          \
    } while (0)
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            s_help(stdout);
            return 0;
        } else if (!strcmp(a, "--shape")) {
            NEED();
            o.shape = v;
        } else if (!strcmp(a, "--model")) {
            NEED();
            o.model = v;
        } else if (!strcmp(a, "--format")) {
            NEED();
            o.fmt = v;
        } else if (!strcmp(a, "--attn-format")) {
            NEED();
            o.attn_fmt = v;
        } else if (!strcmp(a, "--route-skew")) {
            NEED();
            o.skew = v;
        } else if (!strcmp(a, "--json")) {
            NEED();
            o.json = v;
        } else if (!strcmp(a, "--results")) {
            NEED();
            o.results = v;
        } else if (!strcmp(a, "--backend")) {
            NEED();
            o.backend = v;
        } else if (!strcmp(a, "--group")) {
            INTARG(o.group, 32, 128);
        } else if (!strcmp(a, "--steps")) {
            INTARG(o.steps, 1, 1000000);
        } else if (!strcmp(a, "--warmup")) {
            INTARG(o.warmup, 0, 1000000);
        } else if (!strcmp(a, "--prompt")) {
            INTARG(o.prompt, 1, 65536);
        } else if (!strcmp(a, "--prefill")) {
            INTARG(o.prefill, 0, 1 << 20);
        } else if (!strcmp(a, "--max-tokens")) {
            INTARG(o.max_tokens, 1, 1 << 16);
        } else if (!strcmp(a, "--threads")) {
            INTARG(o.threads, 0, 4096);
        } else if (!strcmp(a, "--device")) {
            INTARG(o.device, 0, 64);
        } else if (!strcmp(a, "--prefetch-depth")) {
            INTARG(o.prefetch_depth, 0, 64);
        } else if (!strcmp(a, "--seed")) {
            NEED();
            o.seed = strtoull(v, NULL, 0);
        } else if (!strcmp(a, "--probe-mib")) {
            int mib = 0;
            INTARG(mib, 16, 1 << 20);
            o.probe_mib = mib;
        } else if (!strcmp(a, "--gpu-mem")) {
            NEED();
            if (strata_parse_bytes(v, &o.gpu_mem) < 0) {
                fprintf(stderr, "gpu_decode: --gpu-mem '%s': expected bytes with an optional K/M/G/T suffix\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--batch")) {
            NEED();
            if (s_parse_list(v, o.batches, MAX_BATCHES, &o.n_batches) < 0) {
                fprintf(stderr, "gpu_decode: --batch '%s': expected sizes in [1, 4096] separated by commas\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--no-graphs")) {
            o.no_graphs = true;
        } else if (!strcmp(a, "--whole-experts")) {
            o.whole_experts = true;
        } else if (!strcmp(a, "--no-blas")) {
            o.no_blas = true;
        } else if (!strcmp(a, "--no-probe")) {
            o.no_probe = true;
        } else {
            fprintf(stderr, "gpu_decode: unknown argument '%s' (see --help)\n", a);
            return 2;
        }
    }
    if (!o.shape == !o.model) {
        fprintf(stderr, "gpu_decode: give exactly one of --shape and --model (see --help)\n");
        return 2;
    }
    bool cuda = !strcmp(o.backend, "cuda");
    if (!cuda && strcmp(o.backend, "cpu")) {
        fprintf(stderr, "gpu_decode: --backend '%s': expected cuda or cpu\n", o.backend);
        return 2;
    }
#ifndef STRATA_HAVE_CUDA
    if (cuda) {
        fprintf(stderr, "gpu_decode: built without CUDA; use --backend cpu\n");
        return 2;
    }
#endif
    const shape_t *shape = NULL;
    wfmt_t fmt = WF_INT4;
    double zipf_s = 0;
    if (o.shape) {
        if (!(shape = shape_find(o.shape))) {
            char l[1024];
            shape_list(l, sizeof l);
            fprintf(stderr, "gpu_decode: --shape '%s': unknown; one of %s\n", o.shape, l);
            return 2;
        }
        int f = wfmt_parse(o.fmt);
        if (f != WF_INT4 && f != WF_FP8 && f != WF_INT8 && f != WF_BF16 && f != WF_MXFP4) {
            fprintf(stderr, "gpu_decode: --format '%s': expected int4, mxfp4, fp8, int8 or bf16\n", o.fmt);
            return 2;
        }
        fmt = (wfmt_t)f;
    }
    if (o.attn_fmt && strcmp(o.attn_fmt, "bf16") && strcmp(o.attn_fmt, "same")) {
        fprintf(stderr, "gpu_decode: --attn-format '%s': expected bf16 or same\n", o.attn_fmt);
        return 2;
    }
    if (o.skew && synth_parse_skew(o.skew, &zipf_s) < 0) {
        fprintf(stderr, "gpu_decode: --route-skew '%s': expected uniform or zipf:S\n", o.skew);
        return 2;
    }
    if (o.group != 32 && o.group != 64 && o.group != 128) {
        fprintf(stderr, "gpu_decode: --group %d: expected 32, 64 or 128\n", o.group);
        return 2;
    }
    if (!getenv("STRATA_LOG")) log_set_level(LOG_WARN);

    int rc = 1;
    model_t m;
    memset(&m, 0, sizeof m);
    bool loaded = false;
    s_be_t be = {.cuda = cuda, .m = &m};
    double vram_ctx = -1;
    json_t *rows = json_array();
    strata_errbuf_t eb = {{0}};
    char host[128] = "?", gpu_name[128] = "", machine_name[300];
    gethostname(host, sizeof host - 1);
    tpool_t *pool = tpool_create(o.threads);
    if (!pool) {
        fprintf(stderr, "gpu_decode: cannot start threads\n");
        return 1;
    }
    cpu_ops_init();

    /* 1. ceilings */
    machine_t here = {.name = ""};
#ifdef STRATA_HAVE_CUDA
    size_t gpu_total = 0;
    shared_probe_t shared = {0};
    double t_probe = strata_now();
#endif
    if (!o.no_probe) here.cpu_bw = roofline_cpu_membw(pool, (size_t)(o.probe_mib * 1048576.0), 5);
#ifdef STRATA_HAVE_CUDA
    if (cuda) {
        if (cuda_device_count() <= o.device) {
            fprintf(stderr, "gpu_decode: no CUDA device %d (cuda_device_count() = %d)\n", o.device, cuda_device_count());
            goto done;
        }
        if (cuda_probe_device(o.device, gpu_name, sizeof gpu_name, &gpu_total) < 0) goto done;
        here.gpu_mem = (double)gpu_total;
        if (!o.no_probe) {
            size_t pb = (size_t)(o.probe_mib * 1048576.0);
            if (cuda_probe_h2d(o.device, pb / 4, 5, &here.pcie_bw) < 0 || cuda_probe_membw(o.device, pb, 5, &here.hbm_bw) < 0)
                goto done;
            /* the copy and the CPU at once (ceilings' host_shared_gb_s) */
            if (shared_probe_run(pool, o.device, (size_t)64 << 20, pb, 3, 0.5, &shared) < 0) goto done;
            here.host_bw = shared.host_bw;
        }
    }
#endif
    snprintf(machine_name, sizeof machine_name, "%s%s%s", host, gpu_name[0] ? "/" : "", gpu_name);
    snprintf(here.name, sizeof here.name, "this: %.50s", gpu_name[0] ? gpu_name : host);
    printf("machine %s: cpu read %.1f GB/s%s", machine_name, here.cpu_bw / 1e9, cuda ? "" : "\n");
#ifdef STRATA_HAVE_CUDA
    if (cuda)
        printf(", h2d %.1f GB/s, gpu read %.0f GB/s, gpu memory %.1f GiB; both at once h2d %.1f + cpu %.1f = %.1f GB/s "
               "(probes %.1f s)\n",
               here.pcie_bw / 1e9, here.hbm_bw / 1e9, here.gpu_mem / GIB, shared.h2d_bw / 1e9, shared.cpu_bw / 1e9,
               shared.host_bw / 1e9, strata_now() - t_probe);
#endif
    char machine_desc[512], commit[128], command[4096];
    results_machine(machine_desc, sizeof machine_desc, gpu_name[0] ? gpu_name : NULL, here.gpu_mem, here.pcie_bw);
    results_commit(commit, sizeof commit, STRATA_BUILD_COMMIT, NULL);
    results_command(command, sizeof command, NULL, argc, argv);

    /* 2. the model */
    double t_build = strata_now();
    synth_write_stats_t ws = {0};
    char fmt_name[32] = "";
    const char *shape_name = o.shape;
    if (shape) {
        char *config = NULL;
        if (shape_config_json(shape, &config) < 0) goto done;
        synth_params_t p;
        synth_params_default(&p, fmt);
        if (o.attn_fmt && !strcmp(o.attn_fmt, "same")) p.attn_fmt = fmt;
        p.group = o.group;
        p.seed = o.seed;
        p.zipf_s = zipf_s;
        int e = synth_fast_model(&m, config, &p, o.threads, &ws, &eb);
        free(config);
        if (e < 0) {
            fprintf(stderr, "gpu_decode: building %s: %s\n", shape->name, eb.msg[0] ? eb.msg : strata_strerror(e));
            goto done;
        }
        loaded = true;
        printf("model %s %s: synthetic, %.2f GB built in memory in %.2f s (%.2f GB/s)\n", shape->name, o.fmt,
               (double)ws.file_bytes / 1e9, ws.seconds, (double)ws.file_bytes / 1e9 / ws.gen_seconds);
    } else {
        bool virt = false;
        synth_gen_t *g = NULL;
        if (synth_is_synthetic(o.model) && synth_dir_open(&g, o.model, &virt, &eb) == 0 && virt) {
            int e = synth_fast_model_gen(&m, g, o.threads, &ws, &eb);
            synth_gen_free(g);
            if (e < 0) {
                fprintf(stderr, "gpu_decode: generating %s: %s\n", o.model, eb.msg);
                goto done;
            }
        } else {
            synth_gen_free(g);
            int e = model_load(&m, o.model, &eb);
            if (e < 0) {
                fprintf(stderr, "gpu_decode: %s\n", eb.msg[0] ? eb.msg : strata_strerror(e));
                goto done;
            }
        }
        loaded = true;
        const char *b = strrchr(o.model, '/');
        shape_name = b && b[1] ? b + 1 : o.model;
        /* a synthetic folder names its shape in its marker */
        static char marker_shape[64];
        if (synth_dir_shape(o.model, marker_shape, sizeof marker_shape)) shape_name = marker_shape;
        printf("model %s: loaded in %.2f s\n", o.model, strata_now() - t_build);
    }
    roofline_model_t rm;
    wfmt_t expert_fmt = WF_F32; /* the routed experts' format and int4 group, as built or loaded */
    int expert_group = 32;
    {
        /* bytes per expert / resident from the model's own matrices */
        packed_write_opts_t po;
        packed_manifest_t pm;
        wfmt_t ef = WF_F32;
        int eg = 32;
        for (int l = 0; l < m.cfg.n_layers; l++)
            if (m.cfg.layer_sparse[l]) {
                ef = m.layers[l].experts[0].gate.fmt;
                eg = m.layers[l].experts[0].gate.group ? m.layers[l].experts[0].gate.group : 32;
                break;
            }
        packed_write_opts_default(&po, ef);
        po.group = eg;
        po.attn_fmt = m.layers[0].wq.fmt;
        po.embed_fmt = m.embed.fmt == WF_BF16 ? WF_BF16 : WF_F32;
        if (packed_plan(&m.cfg, &po, &pm, NULL, &eb) < 0) {
            fprintf(stderr, "gpu_decode: %s\n", eb.msg);
            goto done;
        }
        roofline_model_from_manifest(&rm, &m.cfg, &pm);
        packed_manifest_free(&pm);
        expert_fmt = ef;
        expert_group = eg;
        if (ef == WF_INT4) snprintf(fmt_name, sizeof fmt_name, "int4-g%d", eg);
        else snprintf(fmt_name, sizeof fmt_name, "%s", wfmt_name(ef));
    }

    /* 3. the backend */
    int maxB = 1;
    for (int i = 0; i < o.n_batches; i++) maxB = o.batches[i] > maxB ? o.batches[i] : maxB;
    const int bs = 16;
    int32_t nb_per_seq = (o.prompt + o.warmup + o.steps + bs) / bs + 1;
    int32_t kv_blocks = maxB * nb_per_seq;
    if ((o.prefill + bs - 1) / bs + 1 > kv_blocks) kv_blocks = (o.prefill + bs - 1) / bs + 1;
    int max_tokens = o.max_tokens;
    if (max_tokens < maxB) max_tokens = maxB;
    if (max_tokens < o.prompt) max_tokens = o.prompt;
    be.kv_blocks = kv_blocks;
    be.block_size = bs;
    be.max_tokens = max_tokens;
    double t_create = strata_now();
#ifdef STRATA_HAVE_CUDA
    if (cuda) {
        gpu_opts_t go;
        gpu_opts_default(&go);
        go.device = o.device;
        go.gpu_mem = o.gpu_mem;
        go.kv_blocks = kv_blocks;
        go.block_size = bs;
        go.max_tokens = max_tokens;
        if (o.prefetch_depth >= 0) go.prefetch_depth = o.prefetch_depth;
        go.use_graphs = !o.no_graphs;
        go.split_experts = !o.whole_experts;
        go.blas = !o.no_blas;
        vram_ctx = s_smi_mib(); /* the CUDA context (and what the probes left) before the model */
        int e = gpu_model_create(&be.g, &m, &go, &eb);
        if (e < 0) {
            fprintf(stderr, "gpu_decode: %s\n", eb.msg[0] ? eb.msg : strata_strerror(e));
            goto done;
        }
    }
#endif
    if (!cuda) {
        be.pool = pool;
        be.fwd = forward_ctx_create(&m, max_tokens, pool);
        be.logits = malloc(sizeof(float) * (size_t)max_tokens * m.cfg.vocab);
        if (!be.fwd || !be.logits || kv_cache_init(&be.kv, &m.cfg, kv_blocks, bs) < 0) {
            fprintf(stderr, "gpu_decode: out of memory for the CPU backend\n");
            goto done;
        }
    }
    s_cache_t c0;
    s_stats(&be, &c0, false);
    printf("backend %s ready in %.2f s: budget %.2f GiB, resident %.2f GiB, kv %.2f GiB, workspace %.2f GiB, "
           "%.2f of %lld experts' worth on the GPU",
           o.backend, strata_now() - t_create, o.gpu_mem / GIB, c0.resident_bytes / GIB, c0.kv_bytes / GIB,
           c0.workspace_bytes / GIB, c0.valid ? c0.experts_on_gpu : (double)rm.n_experts_total, (long long)rm.n_experts_total);
    if (c0.split_rows) printf(" (split: down rows %d.. of every expert cached in %d tail slots)", c0.split_rows, c0.slots);
    printf("\n");

    /* 4-6. runs */
    printf("\n%-8s %6s %10s %10s %9s %7s %8s %8s %10s %7s %10s %7s %11s %7s %10s %10s %10s\n", "run", "batch", "tok/s",
           "tok/s/seq", "step ms", "hit", "prefetch", "pcie", "pcie-only", "ratio", "bw-added", "ratio", "host-shared",
           "ratio", "bw@hit", "3090", "4090");
    int n_runs = o.n_batches + (o.prefill > 0 ? 1 : 0);
    for (int k = 0; k < n_runs; k++) {
        bool pre = k == o.n_batches;
        s_res_t res = {0};
        int e = pre ? s_prefill(&be, &o, o.prefill, &res) : s_decode(&be, &o, o.batches[k], nb_per_seq, &res);
        if (e < 0) {
            fprintf(stderr, "gpu_decode: %s run failed: %s\n", pre ? "prefill" : "decode", strata_strerror(e));
            goto done;
        }
        const s_cache_t *c = &res.cache;
        double hit = c->valid && c->expert_uses ? (double)c->hits / (double)c->expert_uses : (cuda ? 0 : 1);
        double pacc = c->valid && c->prefetches ? (double)c->prefetch_used / (double)c->prefetches : 0;
        double pcie = c->valid ? (double)c->bytes_h2d / res.seconds / 1e9 : 0;
        roofline_run_t rr;
        roofline_run_default(&rr);
        rr.batch = res.batch;
        rr.context = res.context;
        rr.gpu_mem = (double)o.gpu_mem;
        rr.reserved_bytes = (double)(c->kv_bytes + c->workspace_bytes);
        rr.slots = c->valid ? c->experts_on_gpu : -1;
        rr.cpu_backend = !cuda;
        roofline_t b1 = {0}, b2 = {0};
        bool have_bound = !o.no_probe && roofline_decode(&rm, &here, &rr, &b1) == 0;
        roofline_run_t rh = rr;
        rh.hit_rate = hit;
        if (have_bound) roofline_decode(&rm, &here, &rh, &b2);
        json_t *proj = s_proj(&rm, &rr);
        json_t *p3 = json_object_get(proj, "rtx3090_pcie3_2xe5v4"), *p4 = json_object_get(proj, "rtx4090_pcie4_ddr5");
        double t3 = p3 ? json_real_value(json_object_get(p3, "bound_tok_s")) : 0;
        double t4 = p4 ? json_real_value(json_object_get(p4, "bound_tok_s")) : 0;
        double tok_s = pre ? res.prefill_tok_s : res.decode_tok_s;
        /* decode rows only: prefill has no bound */
        bool bd = have_bound && !pre, po = bd && b1.pcie_only_tok_s > 0;
        if (pre) {
            printf("%-8s %6d %10.1f %10s %9.1f %7.3f %8.3f %7.2fG %10s %7s %10s %7s %11s %7s %10s %10s %10s\n", "prefill",
                   res.prefill_tokens, tok_s, "-", 1e3 * res.seconds, hit, pacc, pcie, "-", "-", "-", "-", "-", "-", "-",
                   "-", "-");
        } else {
            char f_po[16] = "-", f_por[16] = "-";
            if (po) {
                snprintf(f_po, sizeof f_po, "%.1f", b1.pcie_only_tok_s);
                snprintf(f_por, sizeof f_por, "%.3f", tok_s / b1.pcie_only_tok_s);
            }
            printf("%-8s %6d %10.2f %10.2f %9.2f %7.3f %8.3f %7.2fG %10s %7s %10.1f %7.3f %11.1f %7.3f %10.1f %10.1f "
                   "%10.1f\n",
                   "decode", res.batch, tok_s, res.per_seq_tok_s, res.step_ms, hit, pacc, pcie, f_po, f_por,
                   b1.bw_added_tok_s, bd ? tok_s / b1.bw_added_tok_s : 0, b1.host_shared_tok_s,
                   bd ? tok_s / b1.host_shared_tok_s : 0, b2.bw_added_tok_s, t3, t4);
        }
        json_t *row = json_pack("{s:s,s:s,s:s,s:s,s:I,s:i,s:s}", "host", machine_name, "model_shape", shape_name, "format",
                                fmt_name, "backend", o.backend, "gpu_mem", (json_int_t)o.gpu_mem, "batch", res.batch, "kind",
                                pre ? "prefill" : "decode");
        json_object_set_new(row, "route_skew", json_string(o.skew ? o.skew : "uniform"));
        json_object_set_new(row, "attn_format", json_string(wfmt_name(m.layers[0].wq.fmt)));
        json_object_set_new(row, "decode_tok_s", pre ? json_null() : json_real(res.decode_tok_s));
        json_object_set_new(row, "decode_tok_s_per_seq", pre ? json_null() : json_real(res.per_seq_tok_s));
        json_object_set_new(row, "prefill_tok_s", pre ? json_real(res.prefill_tok_s) : json_null());
        json_object_set_new(row, "prefill_tokens", pre ? json_integer(res.prefill_tokens) : json_null());
        json_object_set_new(row, "seconds", json_real(res.seconds));
        json_object_set_new(row, "hit_rate", c->valid ? json_real(hit) : json_null());
        json_object_set_new(row, "prefetch_accuracy", c->valid && c->prefetches ? json_real(pacc) : json_null());
        json_object_set_new(row, "prefetches", json_integer((json_int_t)c->prefetches));
        json_object_set_new(row, "misses", json_integer((json_int_t)c->misses));
        json_object_set_new(row, "misses_host_read", json_integer((json_int_t)c->host_reads));
        json_object_set_new(row, "pcie_gb_s", c->valid ? json_real(pcie) : json_null());
        json_object_set_new(row, "layers", pre ? json_null() : s_layers_json(c));
        json_object_set_new(row, "slots", json_real(c->valid ? c->experts_on_gpu : (double)rm.n_experts_total));
        json_object_set_new(row, "experts_total", json_integer(rm.n_experts_total));
        json_object_set_new(row, "split_rows", c->valid && c->split_rows ? json_integer(c->split_rows) : json_null());
        json_object_set_new(row, "tail_slots", c->valid && c->split_rows ? json_integer(c->slots) : json_null());
        s_bounds_json(row, bd ? &b1 : NULL, tok_s);
        json_object_set_new(row, "bound_at_hit_tok_s", bd ? json_real(b2.bw_added_tok_s) : json_null());
        json_object_set_new(row, "bytes_per_token", json_real(b1.bytes_per_token));
        json_object_set_new(row, "projections", pre ? json_null() : json_incref(proj));
        json_t *ceil = json_pack("{s:f,s:f,s:f,s:f}", "gpu_mem", here.gpu_mem, "hbm_gb_s", here.hbm_bw / 1e9, "pcie_gb_s",
                                 here.pcie_bw / 1e9, "cpu_gb_s", here.cpu_bw / 1e9);
#ifdef STRATA_HAVE_CUDA
        bool sh = shared.host_bw > 0;
        json_object_set_new(ceil, "h2d_shared_gb_s", sh ? json_real(shared.h2d_bw / 1e9) : json_null());
        json_object_set_new(ceil, "cpu_shared_gb_s", sh ? json_real(shared.cpu_bw / 1e9) : json_null());
        json_object_set_new(ceil, "host_shared_gb_s", sh ? json_real(shared.host_bw / 1e9) : json_null());
#else
        json_object_set_new(ceil, "h2d_shared_gb_s", json_null());
        json_object_set_new(ceil, "cpu_shared_gb_s", json_null());
        json_object_set_new(ceil, "host_shared_gb_s", json_null());
#endif
        json_object_set_new(row, "ceilings", ceil);
        json_object_set_new(row, "model_build_s", json_real(ws.seconds));
        /* the results envelope: decode against the PCIe-only bound on the GPU (this engine computes
         * every expert there), against host memory on the CPU backend; prefill has none */
        char case_name[512];
        s_case(case_name, sizeof case_name, &o, shape_name, expert_fmt, expert_group, m.layers[0].wq.fmt,
               pre ? 0 : res.batch, maxB, res.prefill_tokens, cuda);
        results_envelope_t env = {.case_name = case_name, .commit = commit, .machine = machine_desc, .command = command,
                                  .shape = shape_name, .format = fmt_name, .attn_format = wfmt_name(m.layers[0].wq.fmt),
                                  .route_skew = o.skew, .gpu_budget = (double)o.gpu_mem, .figure = tok_s,
                                  .unit = pre ? "prefill tok/s" : "decode tok/s (aggregate)", .bound = NAN};
        if (bd && cuda && po) env.bound = b1.pcie_only_tok_s, env.bound_name = "pcie_only";
        else if (bd && !cuda) env.bound = b1.bw_added_tok_s, env.bound_name = "cpu_memory";
        results_envelope(row, &env);
        json_decref(proj);
        json_array_append_new(rows, row);
    }
    if (cuda) {
        /* the budget check: what nvidia-smi sees against --gpu-mem plus the context */
        double vram = s_smi_mib();
        if (vram_ctx >= 0)
            printf("\nVRAM (nvidia-smi, this process): %.0f MiB = CUDA context %.0f MiB + %.0f MiB; --gpu-mem %.0f MiB, "
                   "charged to it %.0f MiB\n",
                   vram, vram_ctx, vram - vram_ctx, o.gpu_mem / 1048576.0, c0.budget_used / 1048576.0);
        else /* no context before the model (--no-probe): the rest of what nvidia-smi sees is it */
            printf("\nVRAM (nvidia-smi, this process): %.0f MiB; --gpu-mem %.0f MiB, charged to it %.0f MiB, the rest "
                   "(the CUDA context) %.0f MiB\n",
                   vram, o.gpu_mem / 1048576.0, c0.budget_used / 1048576.0, vram - c0.budget_used / 1048576.0);
        for (size_t i = 0; i < json_array_size(rows); i++) {
            json_t *r = json_array_get(rows, i);
            json_object_set_new(r, "vram_smi_mib", vram >= 0 ? json_real(vram) : json_null());
            json_object_set_new(r, "vram_context_mib", vram_ctx >= 0 ? json_real(vram_ctx) : json_null());
            json_object_set_new(r, "budget_used_mib", json_real(c0.budget_used / 1048576.0));
        }
    }
    if (!o.no_probe && o.n_batches) {
        printf("\n");
        roofline_run_t rr;
        roofline_run_default(&rr);
        rr.batch = o.batches[0];
        rr.context = o.prompt + o.warmup + o.steps / 2.0;
        rr.gpu_mem = (double)o.gpu_mem;
        rr.reserved_bytes = (double)(c0.kv_bytes + c0.workspace_bytes);
        rr.slots = c0.valid ? c0.experts_on_gpu : -1;
        rr.cpu_backend = !cuda;
        json_t *first = json_array_get(rows, 0);
        roofline_print(stdout, &rm, &here, &rr, json_real_value(json_object_get(first, "decode_tok_s")));
    }
    if (o.json) {
        if (json_dump_file(rows, o.json, JSON_INDENT(2)) < 0) {
            fprintf(stderr, "gpu_decode: cannot write %s\n", o.json);
            goto done;
        }
    }
    if (o.results) {
        if (results_append(o.results, rows) < 0) {
            fprintf(stderr, "gpu_decode: cannot append to %s: %s\n", o.results, strerror(errno));
            goto done;
        }
        printf("results: %zu rows appended to %s\n", json_array_size(rows), o.results);
    }
    rc = 0;
done:
#ifdef STRATA_HAVE_CUDA
    if (be.g) gpu_model_free(be.g);
#endif
    if (be.fwd) forward_ctx_free(be.fwd);
    kv_cache_free(&be.kv);
    free(be.logits);
    if (loaded) model_free(&m);
    json_decref(rows);
    tpool_destroy(pool);
    return rc;
}
