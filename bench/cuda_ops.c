/* cuda_ops - the speed of the individual CUDA ops at real model shapes, against GPU memory
 * bandwidth (weights read once) and, for large batches, tensor throughput.
 *
 * Cases: cuda_matmul on the Mixtral-8x7B projections (4096x4096, 1024x4096, 14336x4096,
 * 4096x14336, 32000x4096) and cuda_moe_ffn on a Mixtral-8x7B layer (8 experts, top 2) and a
 * Qwen3-30B-A3B layer (128 experts, top 8), in int4 g32 (integer path) and bf16, and a gpt-oss-20b
 * layer (32 experts, top 4, MXFP4 on int8 and on fp32 activation rows), at token
 * counts 1, 16, 64, 128 and 512 (the GEMM's k parts in a lent scratch, as the GPU model lends
 * its MoE scratch); cuda_attention at 1 token over 64/1024 positions and a 512-token
 * prefill. Weights are random bytes (timing does not depend on their values).
 * Each case: the median of 5 batches of back-to-back calls. A table; --json FILE writes rows. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/strata.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/probe.h"

static cuda_ctx_t *ctx;
static uint8_t *pool;     /* device: random bytes every weight points into */
static size_t pool_bytes;
static uint16_t *scales;  /* device: fp16 0.01 everywhere */
static size_t scale_elems;

static void *s_dev(size_t bytes)
{
    void *p = NULL;
    if (cuda_malloc(&p, bytes) || cuda_memset(ctx, p, 0, bytes)) {
        fprintf(stderr, "cuda_ops: cudaMalloc of %zu bytes failed\n", bytes);
        exit(1);
    }
    return p;
}

/* A weight matrix in the pool at byte offset *off (advanced, 256-aligned). */
static qmat_t s_mat(wfmt_t fmt, int rows, int cols, size_t *off)
{
    qmat_t w = {fmt, rows, cols, fmt == WF_INT4 ? 32 : 0, NULL, NULL};
    size_t db = qmat_data_bytes(fmt, rows, cols);
    if (*off + db > pool_bytes) *off = 0; /* reuse: values do not matter, only addresses must be valid */
    w.data = pool + *off;
    *off += (db + 255) & ~(size_t)255;
    size_t se = qmat_scale_bytes(fmt, rows, cols, w.group) / 2;
    if (se) w.scales = se <= scale_elems ? scales : NULL;
    return w;
}

typedef struct {
    const char *op, *shape, *fmt;
    int n;
    double us, weight_bytes, flops;
} s_row_t;

static s_row_t rows_out[256];
static int n_rows;
static double hbm_bw;

typedef int (*s_fn)(void *arg);

/* Median over 5 batches of the per-call time, each batch long enough to be measured. */
static double s_time(s_fn fn, void *arg)
{
    for (int i = 0; i < 3; i++)
        if (fn(arg)) exit(1);
    cuda_sync(ctx);
    double t0 = strata_now();
    if (fn(arg)) exit(1);
    cuda_sync(ctx);
    double one = strata_now() - t0;
    int reps = one > 0.02 ? 1 : (int)(0.02 / (one > 1e-6 ? one : 1e-6)) + 1;
    if (reps > 500) reps = 500;
    double b[5];
    for (int k = 0; k < 5; k++) {
        t0 = strata_now();
        for (int i = 0; i < reps; i++)
            if (fn(arg)) exit(1);
        cuda_sync(ctx);
        b[k] = (strata_now() - t0) / reps;
    }
    for (int i = 0; i < 5; i++)
        for (int j = i + 1; j < 5; j++)
            if (b[j] < b[i]) {
                double t = b[i];
                b[i] = b[j];
                b[j] = t;
            }
    return b[2] * 1e6;
}

static void s_report(const char *op, const char *shape, const char *fmt, int n, double us, double wbytes, double flops)
{
    s_row_t *r = &rows_out[n_rows++];
    *r = (s_row_t){op, shape, fmt, n, us, wbytes, flops};
    double gbs = wbytes / (us * 1e-6) / 1e9;
    printf("%-10s %-22s %-5s %5d %10.1f %9.0f %7.3f %8.1f\n", op, shape, fmt, n, us, gbs,
           hbm_bw > 0 ? gbs * 1e9 / hbm_bw : 0.0, flops / (us * 1e-6) / 1e12);
    fflush(stdout);
}

typedef struct {
    float *y, *x;
    int n;
    qmat_t w;
} s_mm_t;

static int s_mm(void *a)
{
    s_mm_t *m = a;
    return cuda_matmul(ctx, m->y, m->x, m->n, &m->w, NULL);
}

typedef struct {
    float *out, *x, *w;
    int n, H, I, E, K;
    wfmt_t fmt;
    cuda_expert_t *ex;
    int32_t *idx;
    void *scr;
    cuda_moe_opts_t opts;
} s_moe_t;

static int s_moe(void *a)
{
    s_moe_t *m = a;
    return cuda_moe_ffn_ex(ctx, 0, m->H, m->out, m->x, m->n, m->H, m->I, m->fmt, m->ex, m->E, m->idx, m->w, m->K, m->scr, 0,
                           NULL, &m->opts);
}

typedef struct {
    float *out, *q, *kc, *vc;
    int n;
    int32_t *seq, *pos, *bt;
    int max_blocks;
} s_att_t;

static int s_att(void *a)
{
    s_att_t *t = a;
    return cuda_attention(ctx, t->out, t->q, t->kc, t->vc, t->n, t->seq, t->pos, t->bt, t->max_blocks, 32, 8, 128, 16,
                          0.088f, NULL);
}

/* cuda_moe_ffn on one layer of E experts (top K) of H x I in fmt, at each token count of ns,
 * uniformly routed; f32_rows: the activations stay fp32 (cuda_moe_opts_t.f32_act, gpt-oss's
 * clamped SwiGLU), as the GPU model runs MXFP4 experts below the tensor cores' sizes. */
static int s_moe_case(const char *name, int H, int I, int E, int K, wfmt_t fmt, bool f32_rows, float *x, float *y,
                      const int *ns, size_t n_ns)
{
    size_t off = 0;
    cuda_expert_t *hx = calloc((size_t)E, sizeof *hx);
    for (int e = 0; e < E; e++) {
        hx[e].gate = s_mat(fmt, I, H, &off);
        hx[e].up = s_mat(fmt, I, H, &off);
        hx[e].down = s_mat(fmt, H, I, &off);
    }
    double eb = 2.0 * (qmat_data_bytes(fmt, I, H) + qmat_scale_bytes(fmt, I, H, 32)) + qmat_data_bytes(fmt, H, I) +
                qmat_scale_bytes(fmt, H, I, 32);
    cuda_expert_t *dex = s_dev((size_t)E * sizeof *hx);
    if (cuda_h2d(ctx, dex, hx, (size_t)E * sizeof *hx)) return 1;
    for (size_t k = 0; k < n_ns; k++) {
        int n = ns[k];
        int32_t *hidx = malloc(sizeof(int32_t) * n * K);
        float *hw = malloc(sizeof(float) * n * K);
        uint8_t *used = calloc((size_t)E, 1);
        uint64_t st = 12345 + (uint64_t)n;
        for (int t = 0; t < n; t++)
            for (int j = 0; j < K; j++) {
                int e;
                bool dup;
                do { /* uniform routing, top_k distinct experts */
                    st ^= st << 13, st ^= st >> 7, st ^= st << 17;
                    e = (int)(st % (uint64_t)E);
                    dup = false;
                    for (int i = 0; i < j; i++) dup |= hidx[t * K + i] == e;
                } while (dup);
                hidx[t * K + j] = e;
                hw[t * K + j] = 1.0f / K;
                used[e] = 1;
            }
        int distinct = 0;
        for (int e = 0; e < E; e++) distinct += used[e];
        s_moe_t a = {y, x, NULL, n, H, I, E, K, fmt, dex, NULL, NULL, {0}};
        if (f32_rows) a.opts = (cuda_moe_opts_t){.clamped = true, .limit = 7.0f, .alpha = 1.702f, .f32_act = true};
        a.idx = s_dev(sizeof(int32_t) * n * K);
        a.w = s_dev(sizeof(float) * n * K);
        a.scr = s_dev(cuda_moe_scratch_bytes(n, K, H, I, E));
        if (cuda_h2d(ctx, a.idx, hidx, sizeof(int32_t) * n * K) || cuda_h2d(ctx, a.w, hw, sizeof(float) * n * K)) return 1;
        s_report("moe", name, wfmt_name(fmt), n, s_time(s_moe, &a), eb * distinct, 2.0 * 3 * (double)n * K * H * I);
        cuda_free(a.idx), cuda_free(a.w), cuda_free(a.scr);
        free(hidx), free(hw), free(used);
    }
    cuda_free(dex);
    free(hx);
    return 0;
}

static void s_help(FILE *f)
{
    fprintf(f, "usage: cuda_ops [--device N] [--only matmul|moe|attention] [--json FILE]\n\n"
               "Time the CUDA ops at Mixtral-8x7B and Qwen3-30B-A3B shapes (int4 g32 and bf16; 1, 16, 64 and\n"
               "512 tokens), and a gpt-oss-20b MoE layer (MXFP4, int8 and fp32 activation rows), against GPU memory bandwidth: columns are microseconds per call, weight GB/s,\n"
               "that over the measured read bandwidth, and TFLOP/s.\n\n"
               "Exit codes: 0 ok, 1 no GPU or a CUDA failure, 2 bad usage.\n");
}

int main(int argc, char **argv)
{
    int device = 0;
    const char *json = NULL, *only = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            s_help(stdout);
            return 0;
        } else if (v && !strcmp(a, "--device")) {
            device = atoi(v), i++;
        } else if (v && !strcmp(a, "--json")) {
            json = v, i++;
        } else if (v && !strcmp(a, "--only")) {
            only = v, i++;
        } else {
            fprintf(stderr, "cuda_ops: unexpected argument '%s' (see --help)\n", a);
            return 2;
        }
    }
    if (!getenv("STRATA_LOG")) log_set_level(LOG_WARN);
    if (cuda_device_count() <= device) {
        fprintf(stderr, "cuda_ops: no CUDA device %d\n", device);
        return 1;
    }
    if (cuda_probe_membw(device, (size_t)1 << 30, 5, &hbm_bw)) hbm_bw = 0;
    if (cuda_ctx_create(&ctx, device)) return 1;
    const int NMAX = 512, WIDE = 14336;
    if (cuda_ctx_reserve_q8(ctx, NMAX, WIDE)) return 1;
    const size_t parts_bytes = (size_t)32 << 20; /* more than a wave of tiles' k parts take */
    cuda_ctx_lend_parts(ctx, s_dev(parts_bytes), parts_bytes);
    pool_bytes = (size_t)1200 << 20;
    pool = s_dev(pool_bytes);
    {
        /* random bytes, uploaded in 64 MiB pieces */
        size_t piece = (size_t)64 << 20;
        uint64_t *h = malloc(piece), st = 88172645463325252ull;
        for (size_t o = 0; o < pool_bytes; o += piece) {
            for (size_t i = 0; i < piece / 8; i++) {
                st ^= st << 13, st ^= st >> 7, st ^= st << 17;
                h[i] = st;
            }
            if (cuda_h2d(ctx, pool + o, h, o + piece <= pool_bytes ? piece : pool_bytes - o)) return 1;
        }
        free(h);
    }
    scale_elems = (size_t)32000 * 4096 / 32;
    {
        uint16_t *h = malloc(scale_elems * 2);
        for (size_t i = 0; i < scale_elems; i++) h[i] = 0x211f; /* ~0.01 */
        scales = s_dev(scale_elems * 2);
        if (cuda_h2d(ctx, scales, h, scale_elems * 2)) return 1;
        free(h);
    }
    float *x = s_dev((size_t)NMAX * 8 * WIDE * 4), *y = s_dev((size_t)NMAX * 32000 * 4);
    {
        size_t nx = (size_t)NMAX * WIDE;
        float *h = malloc(nx * 4);
        for (size_t i = 0; i < nx; i++) h[i] = (float)((int)(i * 2654435761u % 2001) - 1000) * 1e-3f;
        if (cuda_h2d(ctx, x, h, nx * 4)) return 1;
        free(h);
    }
    printf("GPU read bandwidth %.0f GB/s\n", hbm_bw / 1e9);
    printf("%-10s %-22s %-5s %5s %10s %9s %7s %8s\n", "op", "shape", "fmt", "n", "us", "GB/s", "/hbm", "TFLOP/s");
    static const int ns[] = {1, 16, 64, 128, 512};
    const size_t n_ns = sizeof ns / sizeof *ns;
    static const wfmt_t fmts[] = {WF_INT4, WF_BF16};
    size_t off = 0;
    if (!only || !strcmp(only, "matmul")) {
        static const int mm[][2] = {{4096, 4096}, {1024, 4096}, {14336, 4096}, {4096, 14336}, {32000, 4096}};
        for (size_t f = 0; f < 2; f++)
            for (size_t s = 0; s < sizeof mm / sizeof *mm; s++)
                for (size_t k = 0; k < n_ns; k++) {
                    s_mm_t a = {y, x, ns[k], s_mat(fmts[f], mm[s][0], mm[s][1], &off)};
                    char shape[32];
                    snprintf(shape, sizeof shape, "%dx%d", mm[s][0], mm[s][1]);
                    double wb = (double)qmat_data_bytes(a.w.fmt, a.w.rows, a.w.cols) +
                                qmat_scale_bytes(a.w.fmt, a.w.rows, a.w.cols, a.w.group);
                    s_report("matmul", shape, wfmt_name(fmts[f]), ns[k], s_time(s_mm, &a), wb,
                             2.0 * ns[k] * a.w.rows * a.w.cols);
                }
    }
    if (!only || !strcmp(only, "moe")) {
        static const struct {
            const char *name;
            int H, I, E, K;
            wfmt_t fmt;
            bool f32_rows;
        } ms[] = {{"mixtral-8x7b", 4096, 14336, 8, 2, WF_INT4, false},  {"mixtral-8x7b", 4096, 14336, 8, 2, WF_BF16, false},
                  {"qwen3-30b-a3b", 2048, 768, 128, 8, WF_INT4, false}, {"qwen3-30b-a3b", 2048, 768, 128, 8, WF_BF16, false},
                  {"gpt-oss-20b", 2880, 2880, 32, 4, WF_MXFP4, false},  {"gpt-oss-20b fp32 rows", 2880, 2880, 32, 4, WF_MXFP4, true}};
        for (size_t s = 0; s < sizeof ms / sizeof *ms; s++)
            if (s_moe_case(ms[s].name, ms[s].H, ms[s].I, ms[s].E, ms[s].K, ms[s].fmt, ms[s].f32_rows, x, y, ns, n_ns)) return 1;
    }
    if (!only || !strcmp(only, "attention")) {
        /* 32 heads, 8 KV heads, head_dim 128, blocks of 16; KV for 1024 positions of one sequence,
         * or 512 positions of each of 16 sequences */
        const int bs = 16, maxb = 64, nkv = 8, hd = 128;
        size_t kv_elems = (size_t)16 * maxb * nkv * bs * hd;
        float *kc = s_dev(kv_elems * 4), *vc = s_dev(kv_elems * 4), *q = s_dev((size_t)512 * 32 * hd * 4);
        int32_t *hbt = malloc(sizeof(int32_t) * 16 * maxb);
        for (int i = 0; i < 16 * maxb; i++) hbt[i] = i;
        int32_t *bt = s_dev(sizeof(int32_t) * 16 * maxb), *seq = s_dev(4 * 512), *pos = s_dev(4 * 512);
        if (cuda_h2d(ctx, bt, hbt, sizeof(int32_t) * 16 * maxb)) return 1;
        static const struct {
            const char *name;
            int n, ctx, seqs;
        } as[] = {{"decode ctx 64", 1, 64, 1}, {"decode ctx 1024", 1, 1024, 1}, {"decode 16x ctx 512", 16, 512, 16},
                  {"prefill 512", 512, 0, 1}};
        for (size_t i = 0; i < sizeof as / sizeof *as; i++) {
            int n = as[i].n;
            int32_t hs[512], hp[512];
            double pairs = 0;
            for (int t = 0; t < n; t++) {
                hs[t] = as[i].seqs > 1 ? t : 0;
                hp[t] = as[i].ctx ? as[i].ctx - 1 : t;
                pairs += hp[t] + 1;
            }
            if (cuda_h2d(ctx, seq, hs, 4 * n) || cuda_h2d(ctx, pos, hp, 4 * n)) return 1;
            s_att_t a = {y, q, kc, vc, n, seq, pos, bt, maxb};
            /* bytes: K and V read once per (token, kv head) */
            s_report("attention", as[i].name, "f32", n, s_time(s_att, &a), pairs * 2 * nkv * hd * 4,
                     pairs * 32 * hd * 4.0);
        }
    }
    if (json) {
        json_t *arr = json_array();
        for (int i = 0; i < n_rows; i++) {
            s_row_t *r = &rows_out[i];
            double gbs = r->weight_bytes / (r->us * 1e-6) / 1e9;
            json_array_append_new(arr, json_pack("{s:s,s:s,s:s,s:i,s:f,s:f,s:f,s:f,s:f}", "op", r->op, "shape", r->shape,
                                                 "fmt", r->fmt, "n", r->n, "us", r->us, "gb_s", gbs, "bound_gb_s",
                                                 hbm_bw / 1e9, "ratio", hbm_bw > 0 ? gbs * 1e9 / hbm_bw : 0.0,
                                                 "tflop_s", r->flops / (r->us * 1e-6) / 1e12));
        }
        if (json_dump_file(arr, json, JSON_INDENT(1))) fprintf(stderr, "cuda_ops: cannot write %s\n", json);
        json_decref(arr);
    }
    cuda_ctx_destroy(ctx);
    return 0;
}
