/* test_cuda_ops.c - every CUDA op against its CPU reference op, on fresh random inputs, with
 * the device output poisoned (NaN) before each call so unwritten elements show.
 * Needs a GPU; part of the GPU suite (tests/gpu/run), never of the CPU CI run. */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/strata.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/cuda_ops.h"
#include "tests/unit/check.h"

static uint64_t rng;
static cuda_ctx_t *ctx;

static void s_fill(float *a, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++) a[i] = t_randf(&rng) * scale;
}

static void *s_up(const void *h, size_t bytes)
{
    void *d = NULL;
    if (cuda_malloc(&d, bytes) || (bytes && cuda_h2d(ctx, d, h, bytes))) {
        fprintf(stderr, "upload failed\n");
        exit(1);
    }
    return d;
}

/* device buffer poisoned with 0xff bytes (NaN as float) */
static float *s_poisoned(size_t n)
{
    void *d = NULL;
    if (cuda_malloc(&d, n * sizeof(float)) || cuda_memset(ctx, d, 0xff, n * sizeof(float))) exit(1);
    return d;
}

static float *s_zeroed(size_t n)
{
    void *d = NULL;
    if (cuda_malloc(&d, n * sizeof(float)) || cuda_memset(ctx, d, 0, n * sizeof(float))) exit(1);
    return d;
}

static float *s_down(const float *d, size_t n)
{
    float *h = malloc(n * sizeof(float));
    if (cuda_d2h(ctx, h, d, n * sizeof(float))) exit(1);
    return h;
}

/* A test matrix: host is what the device got (dev); ref is what the CPU reference computes
 * with: host itself, or for MXFP4 its fp32 rows by qmat_dequant_row (the layout's contract), so
 * that the reference needs no MXFP4 matmul of the CPU's. */
typedef struct {
    qmat_t host, dev, ref;
    void *hdata, *hscales;
    float *hf32; /* MXFP4: ref's data */
} tmat_t;

/* MXFP4 test weights straight in the layout: random bytes (every e2m1 code, -0 too) and block
 * scale bytes smin .. smax (2^(s - 127)). */
static void s_mxfp4_fill(uint8_t *data, uint8_t *scales, int rows, int cols, int smin, int smax)
{
    for (size_t i = 0; i < (size_t)rows * cols / 2; i++) data[i] = (uint8_t)t_rng_next(&rng);
    for (size_t i = 0; i < (size_t)rows * (cols / 32); i++)
        scales[i] = (uint8_t)(smin + (int)(t_rng_next(&rng) % (uint64_t)(smax - smin + 1)));
}

/* Upload m->host and set m->ref (see tmat_t). */
static void s_mat_finish(tmat_t *m, size_t db, size_t sb)
{
    const qmat_t *h = &m->host;
    m->dev = *h;
    m->dev.data = s_up(m->hdata, db);
    m->dev.scales = sb ? s_up(m->hscales, sb) : NULL;
    m->ref = *h;
    m->hf32 = NULL;
    if (h->fmt == WF_MXFP4) {
        m->hf32 = malloc((size_t)h->rows * h->cols * sizeof(float));
        for (int r = 0; r < h->rows; r++) qmat_dequant_row(h, r, m->hf32 + (size_t)r * h->cols);
        m->ref = (qmat_t){WF_F32, h->rows, h->cols, 0, m->hf32, NULL};
    }
}

static void s_mat(tmat_t *m, wfmt_t fmt, int rows, int cols, int group)
{
    if (fmt == WF_MXFP4) group = 32;
    size_t db = qmat_data_bytes(fmt, rows, cols), sb = qmat_scale_bytes(fmt, rows, cols, group);
    m->hdata = malloc(db);
    m->hscales = sb ? malloc(sb) : NULL;
    if (fmt == WF_MXFP4) { /* scales 2^-9 .. 2^-3: weights about as large as the other formats' */
        s_mxfp4_fill(m->hdata, m->hscales, rows, cols, 118, 124);
    } else {
        float *w = malloc((size_t)rows * cols * sizeof(float));
        s_fill(w, (size_t)rows * cols, 1.0f);
        T_CHECK(qmat_quantize(fmt, group, w, rows, cols, m->hdata, m->hscales) == 0, "quantize %s %dx%d",
                wfmt_name(fmt), rows, cols);
        free(w);
    }
    m->host = (qmat_t){fmt, rows, cols, fmt == WF_INT4 || fmt == WF_MXFP4 ? group : 0, m->hdata, m->hscales};
    s_mat_finish(m, db, sb);
}

static void s_mat_free(tmat_t *m)
{
    cuda_free((void *)m->dev.data);
    cuda_free((void *)m->dev.scales);
    free(m->hdata);
    free(m->hscales);
    free(m->hf32);
}

/* q8: with the activation workspace reserved, INT4/INT8/MXFP4 take the __dp4a path up to 16 rows,
 * whose activation rounding (1/254 of each 32-block's max) bounds the error near 1e-2, and
 * from 17 rows every format but F32 takes the fp16 tensor-core GEMM when cols % 64 == 0
 * (fp16 activations and weights: about 1e-3). */
static void test_matmul(bool q8)
{
    static const int shapes[][2] = {{96, 128}, {257, 256}, {64, 2048}, {33, 64}, {40, 50}};
    static const int ns[] = {1, 3, 16, 37, 64, 130};
    for (int f = 0; f < WF_COUNT; f++)
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
            for (size_t k = 0; k < sizeof ns / sizeof *ns; k++) {
                int rows = shapes[s][0], cols = shapes[s][1], n = ns[k];
                if ((f == WF_INT4 || f == WF_MXFP4) && cols % 32) continue; /* rows of whole 32-column blocks */
                int group = cols % 128 == 0 ? 128 : cols % 64 == 0 ? 64 : 32;
                tmat_t m;
                s_mat(&m, (wfmt_t)f, rows, cols, group);
                float *x = malloc((size_t)n * cols * sizeof(float)), *bias = malloc(rows * sizeof(float));
                float *ref = malloc((size_t)n * rows * sizeof(float));
                s_fill(x, (size_t)n * cols, 1.f);
                s_fill(bias, rows, 1.f);
                cpu_ops_set_isa(CPU_ISA_REF);
                cpu_matmul(NULL, ref, x, n, &m.ref, (k & 1) ? bias : NULL);
                float *dx = s_up(x, (size_t)n * cols * 4), *db = s_up(bias, rows * 4), *dy = s_poisoned((size_t)n * rows);
                T_CHECK(cuda_matmul(ctx, dy, dx, n, &m.dev, (k & 1) ? db : NULL) == 0, "launch");
                float *y = s_down(dy, (size_t)n * rows);
                double e = t_relerr(y, ref, (size_t)n * rows);
                bool gemm = q8 && n > 16 && f != WF_F32 && cols % 64 == 0;
                bool intpath = q8 && n <= 16 && (f == WF_INT4 || f == WF_INT8 || f == WF_MXFP4) && cols % 32 == 0;
                /* MXFP4's few, far-apart values make a short row's int8 rounding show more */
                double bound = intpath ? (f == WF_MXFP4 ? 2e-2 : 1e-2) : gemm ? 3e-3 : 1e-5;
                T_CHECK(e < bound, "matmul %s %dx%d n=%d q8=%d rel err %.3g", wfmt_name((wfmt_t)f), rows, cols, n, q8, e);
                /* accumulate: dy += x W^T (+ the bias when k is odd, as the first call) gives 2 ref */
                float *want = malloc((size_t)n * rows * sizeof(float));
                for (size_t i = 0; i < (size_t)n * rows; i++) want[i] = 2 * ref[i];
                T_CHECK(cuda_matmul_acc(ctx, dy, dx, n, &m.dev, (k & 1) ? db : NULL) == 0, "launch acc");
                float *y2 = s_down(dy, (size_t)n * rows);
                e = t_relerr(y2, want, (size_t)n * rows);
                T_CHECK(e < bound, "matmul_acc %s %dx%d n=%d q8=%d rel err %.3g", wfmt_name((wfmt_t)f), rows, cols, n, q8, e);
                /* four matrices on one input, two of them with other rows (a GEMM launch takes
                 * three; q/k/v have different rows): with and without the bias */
                tmat_t m2;
                const int rows2 = rows / 2 + 5;
                s_mat(&m2, (wfmt_t)f, rows2, cols, group);
                float *ref2 = malloc((size_t)n * rows2 * sizeof(float));
                cpu_matmul(NULL, ref2, x, n, &m2.ref, NULL);
                float *dy2 = s_poisoned((size_t)n * rows), *dy3 = s_poisoned((size_t)n * rows);
                float *dz2 = s_poisoned((size_t)n * rows2), *dz3 = s_poisoned((size_t)n * rows2);
                float *ys4[4] = {dy2, dz2, dy3, dz3};
                const qmat_t *ws4[4] = {&m.dev, &m2.dev, &m.dev, &m2.dev};
                const float *bs4[4] = {(k & 1) ? db : NULL, NULL, db, NULL};
                T_CHECK(cuda_matmul_multi(ctx, 4, ys4, dx, n, ws4, bs4) == 0, "launch multi");
                float *ya = s_down(dy2, (size_t)n * rows), *yb = s_down(dy3, (size_t)n * rows);
                float *za = s_down(dz2, (size_t)n * rows2), *zb = s_down(dz3, (size_t)n * rows2);
                for (int t = 0; t < n; t++)
                    for (int r = 0; r < rows; r++)
                        want[(size_t)t * rows + r] = ref[(size_t)t * rows + r] + ((k & 1) ? 0.f : bias[r]);
                double ea = t_relerr(ya, ref, (size_t)n * rows), eb = t_relerr(yb, want, (size_t)n * rows);
                double ec = t_relerr(za, ref2, (size_t)n * rows2), ed = t_relerr(zb, ref2, (size_t)n * rows2);
                T_CHECK(ea < bound && eb < bound && ec < bound && ed < bound,
                        "matmul_multi %s %dx%d (+%d rows) n=%d q8=%d rel err %.3g %.3g %.3g %.3g", wfmt_name((wfmt_t)f),
                        rows, cols, rows2, n, q8, ea, eb, ec, ed);
                free(want), free(y2), free(ya), free(yb), free(za), free(zb), free(ref2);
                cuda_free(dy2), cuda_free(dy3), cuda_free(dz2), cuda_free(dz3);
                s_mat_free(&m2);
                free(y), free(x), free(bias), free(ref);
                cuda_free(dx), cuda_free(db), cuda_free(dy);
                s_mat_free(&m);
            }
}

/* Scratch lent for the GEMM's k parts (cuda_ctx_lend_parts): how many of its floats the
 * matmuls since it was poisoned wrote. */
#define PARTS_FLOATS ((size_t)1 << 20)
static size_t s_parts_written(const float *parts)
{
    float *h = s_down(parts, PARTS_FLOATS);
    size_t w = 0;
    for (size_t i = 0; i < PARTS_FLOATS; i++) w += !isnan(h[i]);
    free(h);
    return w;
}

/* k split in parts: q/k/v-like matrices (the first with a bias) on one input of 40 rows, whose
 * tiles fill a few SMs, then the first accumulated, against the CPU; the GEMM must have used the
 * scratch. Then too little scratch: no parts, the same results. */
static void test_matmul_parts(float *parts)
{
    const int cols = 1024, n = 40, rows[3] = {256, 64, 64};
    static const wfmt_t fmts[] = {WF_INT4, WF_INT8, WF_FP8, WF_BF16, WF_MXFP4};
    for (size_t f = 0; f < sizeof fmts / sizeof *fmts; f++)
        for (int lend = 1; lend >= 0; lend--) {
            T_CHECK(cuda_memset(ctx, parts, 0xff, PARTS_FLOATS * 4) == 0, "poison");
            cuda_ctx_lend_parts(ctx, parts, lend ? PARTS_FLOATS * 4 : (size_t)n * 256 * 4);
            tmat_t m[3];
            float *x = malloc((size_t)n * cols * 4), *bias = malloc(rows[0] * 4), *ref[3], *dy[3];
            s_fill(x, (size_t)n * cols, 1.f);
            s_fill(bias, rows[0], 1.f);
            float *dx = s_up(x, (size_t)n * cols * 4), *db = s_up(bias, rows[0] * 4);
            const qmat_t *ws[3];
            for (int i = 0; i < 3; i++) {
                s_mat(&m[i], fmts[f], rows[i], cols, 32);
                ws[i] = &m[i].dev;
                ref[i] = malloc((size_t)n * rows[i] * 4);
                cpu_ops_set_isa(CPU_ISA_REF);
                cpu_matmul(NULL, ref[i], x, n, &m[i].ref, i == 0 ? bias : NULL);
                dy[i] = s_poisoned((size_t)n * rows[i]);
            }
            const float *bs[3] = {db, NULL, NULL};
            T_CHECK(cuda_matmul_multi(ctx, 3, dy, dx, n, ws, bs) == 0, "launch");
            double e[4];
            for (int i = 0; i < 3; i++) {
                float *y = s_down(dy[i], (size_t)n * rows[i]);
                e[i] = t_relerr(y, ref[i], (size_t)n * rows[i]);
                free(y);
            }
            T_CHECK(cuda_matmul_ex(ctx, 1, dy, dx, n, ws, bs, true, false) == 0, "launch acc");
            float *y = s_down(dy[0], (size_t)n * rows[0]);
            for (size_t i = 0; i < (size_t)n * rows[0]; i++) ref[0][i] *= 2;
            e[3] = t_relerr(y, ref[0], (size_t)n * rows[0]);
            free(y);
            T_CHECK(e[0] < 3e-3 && e[1] < 3e-3 && e[2] < 3e-3 && e[3] < 3e-3,
                    "k parts %s lent %d: rel err q %.3g k %.3g v %.3g, accumulated %.3g", wfmt_name(fmts[f]), lend, e[0],
                    e[1], e[2], e[3]);
            const size_t w = s_parts_written(parts);
            T_CHECK(lend ? w > 0 : w == 0, "k parts %s lent %d: %zu floats of the scratch written", wfmt_name(fmts[f]),
                    lend, w);
            for (int i = 0; i < 3; i++) s_mat_free(&m[i]), free(ref[i]), cuda_free(dy[i]);
            free(x), free(bias);
            cuda_free(dx), cuda_free(db);
        }
    cuda_ctx_lend_parts(ctx, NULL, 0);
}

/* E random experts of format f (hidden H, inter I, int4 groups of 32) and their table. */
static void s_experts(tmat_t *g, tmat_t *u, tmat_t *d, cuda_expert_t *ex, int E, wfmt_t f, int H, int I, int group)
{
    for (int e = 0; e < E; e++) {
        s_mat(&g[e], f, I, H, group);
        s_mat(&u[e], f, I, H, group);
        s_mat(&d[e], f, H, I, group);
        ex[e] = (cuda_expert_t){g[e].dev, u[e].dev, d[e].dev};
    }
}

/* Split an expert's down projection dm at row `split` (cuda_expert_t): rows split.. go to a new
 * device buffer *tail (data, then scales at *tail + its data bytes), down_tail points there
 * offset back by split rows, and those rows are poisoned where down keeps them. */
static void s_split_down(cuda_expert_t *ex, const tmat_t *dm, int split, void **tail)
{
    const qmat_t *d = &ex->down;
    const size_t rd = qmat_data_bytes(d->fmt, 1, d->cols), rs = qmat_scale_bytes(d->fmt, 1, d->cols, d->group);
    const size_t nt = (size_t)(d->rows - split), db = nt * rd, sb = nt * rs;
    T_CHECK(cuda_malloc(tail, db + sb + 16) == 0, "tail alloc");
    uint8_t *t = *tail, *src = (uint8_t *)d->data + (size_t)split * rd;
    T_CHECK(cuda_h2d(ctx, t, (const uint8_t *)dm->hdata + (size_t)split * rd, db) == 0, "tail copy");
    cuda_memset(ctx, src, 0x77, db);
    ex->down_tail = *d;
    ex->down_tail.data = t - (size_t)split * rd;
    if (sb) {
        uint8_t *ssrc = (uint8_t *)d->scales + (size_t)split * rs;
        T_CHECK(cuda_h2d(ctx, t + db, (const uint8_t *)dm->hscales + (size_t)split * rs, sb) == 0, "tail scale copy");
        cuda_memset(ctx, ssrc, 0x77, sb);
        ex->down_tail.scales = t + db - (size_t)split * rs;
    }
    ex->split = split;
}

/* cuda_moe_ffn_part of split experts ex (device table and scratch of its own): the head with
 * every tail pointing at poison, then the table's real tails (what cuda_wait_patch writes
 * between them), then the tail, equal cuda_moe_ffn's out. */
static void s_moe_parts(const cuda_expert_t *ex, int E, int split, const float *dx, const float *base, const float *out,
                        int n, int H, int I, wfmt_t f, const int32_t *didx, const float *dw, int K)
{
    cuda_expert_t bad[8];
    const qmat_t *d = &ex[0].down;
    const size_t rd = qmat_data_bytes(d->fmt, 1, d->cols), rs = qmat_scale_bytes(d->fmt, 1, d->cols, d->group);
    const size_t tb = (size_t)(H - split) * (rd + rs) + 16;
    void *poison = NULL, *dscr = NULL;
    cuda_malloc(&poison, tb);
    cuda_memset(ctx, poison, 0x77, tb);
    for (int e = 0; e < E; e++) {
        bad[e] = ex[e];
        bad[e].down_tail.data = (uint8_t *)poison - (size_t)split * rd;
        if (rs) bad[e].down_tail.scales = (uint8_t *)poison + (size_t)(H - split) * rd - (size_t)split * rs;
    }
    cuda_expert_t *dex = s_up(bad, sizeof(cuda_expert_t) * E);
    float *dout = s_up(base, (size_t)n * H * 4);
    const size_t sb = cuda_moe_scratch_bytes(n, K, H, I, E);
    cuda_malloc(&dscr, sb);
    cuda_memset(ctx, dscr, 0xff, sb);
    T_CHECK(cuda_moe_ffn_part(ctx, CUDA_MOE_HEAD, split, dout, dx, n, H, I, f, dex, E, didx, dw, K, dscr, 0, NULL) == 0,
            "moe head launch");
    cuda_sync(ctx);
    cuda_h2d(ctx, dex, ex, sizeof(cuda_expert_t) * E);
    T_CHECK(cuda_moe_ffn_part(ctx, CUDA_MOE_TAIL, split, dout, dx, n, H, I, f, dex, E, didx, dw, K, dscr, 0, NULL) == 0,
            "moe tail launch");
    float *got = s_down(dout, (size_t)n * H);
    double e = t_relerr(got, out, (size_t)n * H);
    T_CHECK(e < 1e-6, "moe parts %s n=%d inter=%d split=%d: rel err %.3g against one launch", wfmt_name(f), n, I, split, e);
    /* a step the parts do not take, or rows that are not a split, are refused */
    T_CHECK(cuda_moe_ffn_part(ctx, CUDA_MOE_HEAD, split + 1, dout, dx, n, H, I, f, dex, E, didx, dw, K, dscr, 0, NULL) ==
                STRATA_EINVAL_INPUT,
            "moe part at rows %d", split + 1);
    T_CHECK(cuda_moe_ffn_part(ctx, CUDA_MOE_HEAD, split, dout, dx, 40, H, I, f, dex, E, didx, dw, K, dscr, 0, NULL) ==
                STRATA_EINVAL_INPUT,
            "moe part at 40 tokens");
    free(got);
    cuda_free(poison), cuda_free(dex), cuda_free(dout), cuda_free(dscr);
}

static void test_moe(void)
{ /* Below 32 tokens INT4/INT8/MXFP4 take the integer (q8) path (hidden and inter are multiples of
   * 32); from 32 tokens every format but F32 takes the fp16 GEMM when both are multiples of
   * 64 (inter 192 or 256, whose down GEMM splits k in parts), and the per-token kernels
   * otherwise (inter 96). c & 4: every expert split
   * (down rows 128.. elsewhere, poisoned in place), hidden 384. */
    static const int ns[] = {1, 2, 5, 16, 40, 100, 300}; /* 300: full GEMM tiles and partial ones */
    static const int inters[] = {96, 192};
    const int E = 8, K = 2;
    for (int f = 0; f < WF_COUNT; f++)
        for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++)
            for (int c = 0; c < 8; c++) {
                /* inter 256 (4 k stages of 64) at every other n: the down GEMM splits k in parts */
                int n = ns[ni], missing = c & 1, I = (c >> 1) & 1 && ni % 2 == 0 ? 256 : inters[(c >> 1) & 1],
                    split = c & 4 ? 128 : 0;
                const int H = split ? 384 : 128;
                bool gemm = n >= 32 && f != WF_F32 && I % 64 == 0;
                tmat_t g[8], u[8], d[8];
                cuda_expert_t ex[8];
                void *tails[8] = {0};
                s_experts(g, u, d, ex, E, (wfmt_t)f, H, I, 32);
                for (int e = 0; split && e < E; e++) s_split_down(&ex[e], &d[e], split, &tails[e]);
                if (missing) ex[3].gate.data = NULL; /* expert 3 not resident: skipped */
                float *x = malloc((size_t)n * H * 4), *base = malloc((size_t)n * H * 4), *ref = malloc((size_t)n * H * 4);
                int32_t *idx = malloc((size_t)n * K * 4);
                float *wt = malloc((size_t)n * K * 4), *logits = malloc(E * 4);
                s_fill(x, (size_t)n * H, 1.f);
                s_fill(base, (size_t)n * H, 1.f);
                memcpy(ref, base, (size_t)n * H * 4);
                float *scratch = malloc(2 * (size_t)I * 4);
                for (int t = 0; t < n; t++) {
                    s_fill(logits, E, 3.f);
                    cpu_gate_topk(logits, E, K, true, idx + t * K, wt + t * K);
                    for (int k = 0; k < K; k++) {
                        int e = idx[t * K + k];
                        if (missing && e == 3) continue;
                        cpu_ffn_swiglu(NULL, ref + (size_t)t * H, x + (size_t)t * H, 1, &g[e].ref, &u[e].ref, &d[e].ref,
                                       NULL, scratch, wt + t * K + k, true);
                    }
                }
                float *dx = s_up(x, (size_t)n * H * 4), *dout = s_up(base, (size_t)n * H * 4);
                int32_t *didx = s_up(idx, (size_t)n * K * 4);
                float *dw = s_up(wt, (size_t)n * K * 4);
                cuda_expert_t *dex = s_up(ex, sizeof ex);
                void *dscr = NULL;
                size_t sb = cuda_moe_scratch_bytes(n, K, H, I, E);
                cuda_malloc(&dscr, sb);
                cuda_memset(ctx, dscr, 0xff, sb);
                T_CHECK(cuda_moe_ffn(ctx, dout, dx, n, H, I, (wfmt_t)f, dex, E, didx, dw, K, dscr, 0, NULL) == 0,
                        "moe launch");
                float *out = s_down(dout, (size_t)n * H);
                double e = t_relerr(out, ref, (size_t)n * H);
                /* the integer path rounds two activations (x, then silu(g)*u) to int8 blocks */
                double bound = gemm ? 5e-3 : f == WF_INT4 || f == WF_INT8 || f == WF_MXFP4 ? 2e-2 : 1e-5;
                T_CHECK(e < bound, "moe %s n=%d inter=%d missing=%d split=%d rel err %.3g", wfmt_name((wfmt_t)f), n, I,
                        missing, split, e);
                if (split && cuda_moe_parts_ok(n, (wfmt_t)f, H, I)) s_moe_parts(ex, E, split, dx, base, out, n, H, I, (wfmt_t)f, didx, dw, K);
                free(out), free(x), free(base), free(ref), free(idx), free(wt), free(logits), free(scratch);
                cuda_free(dx), cuda_free(dout), cuda_free(didx), cuda_free(dw), cuda_free(dex), cuda_free(dscr);
                for (int e2 = 0; e2 < E; e2++) s_mat_free(&g[e2]), s_mat_free(&u[e2]), s_mat_free(&d[e2]), cuda_free(tails[e2]);
            }
}

/* One token on INT4 (then MXFP4) experts with rows of 4096 columns, which take whole-warp rows
 * and the flat grid (moe.cu): gate/up at hidden 4096 (down on 8-lane rows in tiles), or down at
 * inter 4096 (gate/up in tiles). INT4 groups of 32 and of 64, split experts (down rows 512..
 * elsewhere, poisoned in place), the second chosen expert missing, and the token row read from
 * the context's workspace (CUDA_MOE_X_Q8). */
static void test_moe_wide(void)
{
    const int E = 4, K = 2;
    /* 8 cases a format: both shapes with and without a missing expert and the workspace's row */
    for (int c = 0; c < 16; c++) {
        const wfmt_t f = c & 8 ? WF_MXFP4 : WF_INT4;
        const int H = c & 1 ? 1024 : 4096, I = c & 1 ? 4096 : 1024, group = c & 2 ? 64 : 32, split = c & 4 ? 512 : 0;
        const int missing = (c ^ c >> 1 ^ c >> 2) & 1, ws = (c >> 1 ^ c >> 2) & 1;
        tmat_t g[4], u[4], d[4];
        cuda_expert_t ex[4];
        void *tails[4] = {0};
        s_experts(g, u, d, ex, E, f, H, I, group);
        for (int e = 0; split && e < E; e++) s_split_down(&ex[e], &d[e], split, &tails[e]);
        float *x = malloc(H * 4), *nw = malloc(H * 4), *base = malloc(H * 4), *ref = malloc(H * 4), logits[4], wt[2];
        float *scratch = malloc(2 * (size_t)I * 4);
        int32_t idx[2];
        s_fill(x, H, 1.f);
        s_fill(nw, H, 1.f);
        s_fill(base, H, 1.f);
        s_fill(logits, E, 3.f);
        cpu_gate_topk(logits, E, K, true, idx, wt);
        if (missing) ex[idx[1]].gate.data = NULL;
        float *dx = s_up(x, H * 4), *dnw = s_up(nw, H * 4), *dout = s_up(base, H * 4), *xn = s_poisoned(H);
        if (ws) { /* the experts read the workspace's int8 row of the normed x */
            bool done = false;
            cuda_rmsnorm_q8(ctx, xn, dx, dnw, 1, H, 1e-6f, &done);
            T_CHECK(done, "rmsnorm_q8 before the wide experts did not quantize");
            float *h = s_down(xn, H);
            memcpy(x, h, H * 4);
            free(h);
        }
        memcpy(ref, base, H * 4);
        for (int k = 0; k < K; k++)
            if (!(missing && k == 1))
                cpu_ffn_swiglu(NULL, ref, x, 1, &g[idx[k]].ref, &u[idx[k]].ref, &d[idx[k]].ref, NULL, scratch,
                               wt + k, true);
        int32_t *didx = s_up(idx, sizeof idx);
        float *dw = s_up(wt, sizeof wt), *zero = s_zeroed(H);
        cuda_expert_t *dex = s_up(ex, sizeof ex);
        void *dscr = NULL;
        size_t sb = cuda_moe_scratch_bytes(1, K, H, I, E);
        cuda_malloc(&dscr, sb);
        cuda_memset(ctx, dscr, 0xff, sb);
        T_CHECK(cuda_moe_ffn(ctx, dout, ws ? zero : dx, 1, H, I, f, dex, E, didx, dw, K, dscr,
                             ws ? CUDA_MOE_X_Q8 : 0, NULL) == 0,
                "wide moe launch");
        float *out = s_down(dout, H);
        double e = t_relerr(out, ref, H);
        T_CHECK(e < 2e-2, "wide moe %s H=%d I=%d group=%d missing=%d split=%d workspace=%d rel err %.3g", wfmt_name(f),
                H, I, group, missing, split, ws, e);
        if (split && !ws) s_moe_parts(ex, E, split, dx, base, out, 1, H, I, f, didx, dw, K);
        free(out), free(x), free(nw), free(base), free(ref), free(scratch);
        cuda_free(dx), cuda_free(dnw), cuda_free(dout), cuda_free(xn), cuda_free(didx), cuda_free(dw), cuda_free(zero);
        cuda_free(dex), cuda_free(dscr);
        for (int e2 = 0; e2 < E; e2++) s_mat_free(&g[e2]), s_mat_free(&u[e2]), s_mat_free(&d[e2]), cuda_free(tails[e2]);
    }
}

static void test_rmsnorm_rope(void)
{
    const int n = 7, dim = 320;
    float *x = malloc(n * dim * 4), *w = malloc(dim * 4), *ref = malloc(n * dim * 4);
    s_fill(x, n * dim, 2.f);
    s_fill(w, dim, 1.f);
    cpu_rmsnorm(ref, x, w, n, dim, 1e-6f);
    float *dx = s_up(x, n * dim * 4), *dw = s_up(w, dim * 4), *dy = s_poisoned(n * dim);
    cuda_rmsnorm(ctx, dy, dx, dw, n, dim, 1e-6f);
    float *y = s_down(dy, n * dim);
    double e = t_relerr(y, ref, n * dim);
    T_CHECK(e < 1e-6, "rmsnorm rel err %.3g", e);
    free(y);
    cuda_free(dy);

    /* RoPE on q and k, and k/v into a paged cache, in one launch (cuda_rope_kv) */
    static const int hds[][2] = {{128, 128}, {48, 48}, {64, 32}, {64, 0}}; /* head_dim, rot_dim */
    for (int c = 0; c < 8; c++) { /* c >= 4: with per-head q/k norms first */
        const bool qkn = c >= 4;
        int hd = hds[c % 4][0], rd = hds[c % 4][1], nh = 5, nkv = 2, bs = 16, maxb = 16;
        size_t qn = (size_t)n * nh * hd, kn = (size_t)n * nkv * hd, cache = (size_t)maxb * nkv * bs * hd;
        float *q = malloc(qn * 4), *qr = malloc(qn * 4), *k = malloc(kn * 4), *kr = malloc(kn * 4), *v = malloc(kn * 4);
        float inv[128] = {0};
        int32_t pos[7], seq[7] = {0}, bt[16];
        for (int i = 0; i < rd / 2; i++) inv[i] = powf(10000.f, -2.f * i / rd);
        for (int t = 0; t < n; t++) pos[t] = t * 37 + 3;
        for (int i = 0; i < maxb; i++) bt[i] = maxb - 1 - i;
        s_fill(q, qn, 1.f);
        s_fill(k, kn, 1.f);
        s_fill(v, kn, 1.f);
        memcpy(qr, q, qn * 4);
        memcpy(kr, k, kn * 4);
        float qnw[256], knw[256];
        s_fill(qnw, hd, 1.f);
        s_fill(knw, hd, 1.f);
        if (qkn) {
            cpu_rmsnorm(qr, qr, qnw, n * nh, hd, 1e-6f);
            cpu_rmsnorm(kr, kr, knw, n * nkv, hd, 1e-6f);
        }
        if (rd) cpu_rope(qr, n, nh, hd, rd, pos, inv, 1.0f), cpu_rope(kr, n, nkv, hd, rd, pos, inv, 1.0f);
        float *dq = s_up(q, qn * 4), *dk = s_up(k, kn * 4), *dv = s_up(v, kn * 4), *dinv = s_up(inv, sizeof inv);
        float *dkc = s_poisoned(cache), *dvc = s_poisoned(cache);
        int32_t *dpos = s_up(pos, sizeof pos), *dseq = s_up(seq, sizeof seq), *dbt = s_up(bt, sizeof bt);
        float *dqn = s_up(qnw, hd * 4), *dkn = s_up(knw, hd * 4);
        T_CHECK(cuda_rope_kv(ctx, dq, dk, dv, n, nh, nkv, hd, rd, dpos, dinv, 1.0f, qkn ? dqn : NULL, qkn ? dkn : NULL,
                             1e-6f, dkc, dvc, dseq, dbt, maxb, bs) == 0,
                "rope_kv launch");
        cuda_free(dqn), cuda_free(dkn);
        float *gq = s_down(dq, qn), *gk = s_down(dk, kn), *gkc = s_down(dkc, cache), *gvc = s_down(dvc, cache);
        e = t_relerr(gq, qr, qn);
        T_CHECK(e < 1e-5, "rope hd=%d rot=%d qk-norm=%d rel err q %.3g", hd, rd, qkn, e);
        T_CHECK(!memcmp(gk, k, kn * 4), "rope_kv hd=%d rot=%d: k itself changed (only the cache gets it rotated)", hd, rd);
        /* the cache's rows: k normed and rotated (the CPU's), v as it was */
        double ek = 0;
        bool vplaced = true;
        for (int t = 0; t < n; t++)
            for (int h = 0; h < nkv; h++) {
                size_t o = (((size_t)bt[pos[t] / bs] * nkv + h) * bs + pos[t] % bs) * hd, src = ((size_t)t * nkv + h) * hd;
                const double er = t_relerr(gkc + o, kr + src, hd);
                if (er > ek) ek = er;
                vplaced &= !memcmp(gvc + o, v + src, hd * 4);
            }
        T_CHECK(ek < 1e-5 && vplaced, "rope_kv hd=%d rot=%d qk-norm=%d: cache k rows rel err %.3g, v rows %s", hd, rd, qkn,
                ek, vplaced ? "equal" : "differ");
        free(q), free(qr), free(k), free(kr), free(v), free(gq), free(gk), free(gkc), free(gvc);
        cuda_free(dq), cuda_free(dk), cuda_free(dv), cuda_free(dinv), cuda_free(dkc), cuda_free(dvc);
        cuda_free(dpos), cuda_free(dseq), cuda_free(dbt);
    }
    free(x), free(w), free(ref);
    cuda_free(dx), cuda_free(dw);
}

static void test_gate(void)
{
    static const int cfg[][2] = {{8, 2}, {60, 4}, {128, 8}, {64, 6}};
    for (int c = 0; c < 4; c++)
        for (int renorm = 0; renorm < 2; renorm++) {
            int E = cfg[c][0], K = cfg[c][1], n = 9;
            float *l = malloc(n * E * 4), *rw = malloc(n * K * 4);
            int32_t *ri = malloc(n * K * 4);
            s_fill(l, n * E, 4.f);
            for (int t = 0; t < n; t++) cpu_gate_topk(l + t * E, E, K, renorm, ri + t * K, rw + t * K);
            float *dl = s_up(l, n * E * 4), *dw = s_poisoned(n * K);
            int32_t *di = (int32_t *)s_poisoned(n * K);
            cuda_gate_topk(ctx, dl, n, E, K, renorm, di, dw);
            float *w = s_down(dw, n * K);
            int32_t *gi = (int32_t *)s_down((float *)di, n * K);
            int same = !memcmp(gi, ri, n * K * 4);
            T_CHECK(same, "gate E=%d K=%d idx differ", E, K);
            double e = t_relerr(w, rw, n * K);
            T_CHECK(e < 1e-5, "gate E=%d K=%d renorm=%d weight rel err %.3g", E, K, renorm, e);
            free(l), free(rw), free(ri), free(w), free(gi);
            cuda_free(dl), cuda_free(dw), cuda_free(di);
        }
}

/* bt[0..n-1] = a random permutation of 0..n-1 (block tables that share out the cache). */
static void s_perm(int32_t *bt, int n)
{
    for (int i = 0; i < n; i++) bt[i] = i;
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(t_rng_next(&rng) % (uint64_t)(i + 1)), tmp = bt[i];
        bt[i] = bt[j];
        bt[j] = tmp;
    }
}

/* Paged K and V caches of kvn floats, NaN (0xff bytes) except positions lo[s]..last[s] of each
 * of the nseq sequences (lo NULL: from 0; block table row s of bt, maxb blocks a row), random
 * there: a read of a position no row attends shows. */
static void s_kv_caches_from(float **kc, float **vc, size_t kvn, const int32_t *bt, int maxb, int nseq,
                             const int32_t *lo, const int32_t *last, int nkv, int bs, int hd)
{
    *kc = malloc(kvn * 4), *vc = malloc(kvn * 4);
    memset(*kc, 0xff, kvn * 4);
    memset(*vc, 0xff, kvn * 4);
    for (int s = 0; s < nseq; s++)
        for (int p = lo ? lo[s] : 0; p <= last[s]; p++)
            for (int h = 0; h < nkv; h++) {
                size_t o = (((size_t)bt[s * maxb + p / bs] * nkv + h) * bs + p % bs) * hd;
                s_fill(*kc + o, hd, 1.f);
                s_fill(*vc + o, hd, 1.f);
            }
}

static void s_kv_caches(float **kc, float **vc, size_t kvn, const int32_t *bt, int maxb, int nseq, const int32_t *last,
                        int nkv, int bs, int hd)
{
    s_kv_caches_from(kc, vc, kvn, bt, maxb, nseq, NULL, last, nkv, bs, hd);
}

static void test_attention(void)
{
    static const int cfg[][3] = {{8, 2, 128}, {4, 4, 48}, {6, 2, 64}}; /* heads, kv heads, head_dim */
    for (int c = 0; c < 3; c++) {
        const int nh = cfg[c][0], nkv = cfg[c][1], hd = cfg[c][2], bs = 16, nblk = 40, maxb = 12, nseq = 3;
        /* block tables: a random permutation of blocks shared out to sequences */
        int32_t bt[3 * 12], perm[40];
        s_perm(perm, nblk);
        for (int i = 0; i < nseq * maxb; i++) bt[i] = perm[i];
        /* a step: seq 0 prefills 37 tokens, seq 1 decodes at pos 150, seq 2 prefill chunk 20..29 */
        int n = 0;
        int32_t seq[64], pos[64];
        for (int p = 0; p < 37; p++) seq[n] = 0, pos[n++] = p;
        seq[n] = 1, pos[n++] = 150;
        for (int p = 20; p < 30; p++) seq[n] = 2, pos[n++] = p;
        size_t kvn = (size_t)nblk * nkv * bs * hd;
        float *kc = calloc(kvn, 4), *vc = calloc(kvn, 4);
        /* earlier positions already in the cache (seq 1 < 150, seq 2 < 20) */
        for (int s2 = 1; s2 < 3; s2++) {
            int upto = s2 == 1 ? 150 : 20;
            for (int p = 0; p < upto; p++)
                for (int h = 0; h < nkv; h++) {
                    size_t o = (((size_t)bt[s2 * maxb + p / bs] * nkv + h) * bs + p % bs) * hd;
                    s_fill(kc + o, hd, 1.f);
                    s_fill(vc + o, hd, 1.f);
                }
        }
        float *q = malloc((size_t)n * nh * hd * 4), *k = malloc((size_t)n * nkv * hd * 4), *v = malloc((size_t)n * nkv * hd * 4);
        s_fill(q, (size_t)n * nh * hd, 1.f);
        s_fill(k, (size_t)n * nkv * hd, 1.f);
        s_fill(v, (size_t)n * nkv * hd, 1.f);
        float *dkc = s_up(kc, kvn * 4), *dvc = s_up(vc, kvn * 4);
        /* CPU reference: write K/V then attend */
        for (int t = 0; t < n; t++)
            for (int h = 0; h < nkv; h++) {
                size_t o = (((size_t)bt[seq[t] * maxb + pos[t] / bs] * nkv + h) * bs + pos[t] % bs) * hd;
                memcpy(kc + o, k + ((size_t)t * nkv + h) * hd, hd * 4);
                memcpy(vc + o, v + ((size_t)t * nkv + h) * hd, hd * 4);
            }
        float *ref = malloc((size_t)n * nh * hd * 4), *scr = malloc(200 * 4);
        float scale = 1.f / sqrtf((float)hd);
        for (int t = 0; t < n; t++)
            cpu_attention(ref + (size_t)t * nh * hd, q + (size_t)t * nh * hd, kc, vc, bt + seq[t] * maxb, 0, pos[t] + 1,
                          nh, nkv, hd, bs, scale, NULL, scr);
        float *dq = s_up(q, (size_t)n * nh * hd * 4), *dk = s_up(k, (size_t)n * nkv * hd * 4),
              *dv = s_up(v, (size_t)n * nkv * hd * 4), *dout = s_poisoned((size_t)n * nh * hd);
        int32_t *dseq = s_up(seq, n * 4), *dpos = s_up(pos, n * 4), *dbt = s_up(bt, sizeof bt);
        cuda_rope_kv(ctx, dq, dk, dv, n, nh, nkv, hd, 0, dpos, NULL, 1.f, NULL, NULL, 0.f, dkc, dvc, dseq, dbt, maxb, bs);
        cuda_attention(ctx, dout, dq, dkc, dvc, n, dseq, dpos, dbt, maxb, nh, nkv, hd, bs, scale, NULL);
        float *out = s_down(dout, (size_t)n * nh * hd);
        double e = t_relerr(out, ref, (size_t)n * nh * hd);
        T_CHECK(e < 1e-5, "attention h=%d kv=%d hd=%d rel err %.3g", nh, nkv, hd, e);
        float *gkc = s_down(dkc, kvn);
        T_CHECK(!memcmp(gkc, kc, kvn * 4), "rope_kv: k cache differs");
        free(gkc), free(out), free(kc), free(vc), free(q), free(k), free(v), free(ref), free(scr);
        cuda_free(dkc), cuda_free(dvc), cuda_free(dq), cuda_free(dk), cuda_free(dv), cuda_free(dout);
        cuda_free(dseq), cuda_free(dpos), cuda_free(dbt);
    }
}

/* Decode-only steps (cuda_attention's split path) against cpu_attention: 4 rows of 4 sequences at
 * positions 1, 31, 200 and 1500, then the row at 1500 alone (a smaller grid, which takes fewer
 * heads a block for 32/4 heads and head_dim 256). Shapes: 32 heads over 8 and over 4 kv heads at head_dim 128 (Mixtral,
 * Qwen3-30B), and head_dim 256, 80 (not a multiple of 32), 50 (not a multiple of 4), MHA at 256,
 * blocks of 24 and 32. Cache positions no row attends are NaN, so a read past a row's context or
 * of a block of another sequence shows. The int8 rows are asked for, so that path runs too. */
static void test_attention_decode(void)
{
    static const int cfg[][4] = {{32, 8, 128, 16}, {32, 4, 128, 16}, {16, 2, 256, 16},
                                 {8, 4, 80, 24},   {6, 2, 50, 16},   {4, 4, 256, 32}}; /* heads, kv, hd, bs */
    enum { NSEQ = 4 };
    static const int32_t last[NSEQ] = {1, 31, 200, 1500};
    for (int c = 0; c < 6; c++) {
        const int nh = cfg[c][0], nkv = cfg[c][1], hd = cfg[c][2], bs = cfg[c][3];
        const int maxb = last[NSEQ - 1] / bs + 1, nblk = NSEQ * maxb;
        int32_t *bt = malloc((size_t)nblk * 4), seq[NSEQ], pos[NSEQ];
        s_perm(bt, nblk);
        for (int s = 0; s < NSEQ; s++) seq[s] = s, pos[s] = last[s];
        size_t kvn = (size_t)nblk * nkv * bs * hd, qn = (size_t)NSEQ * nh * hd;
        float *kc, *vc;
        s_kv_caches(&kc, &vc, kvn, bt, maxb, NSEQ, last, nkv, bs, hd);
        float *q = malloc(qn * 4), *ref = malloc(qn * 4), *scr = malloc((size_t)(last[NSEQ - 1] + 1) * 4);
        s_fill(q, qn, 2.f);
        const float scale = 1.f / sqrtf((float)hd);
        for (int t = 0; t < NSEQ; t++)
            cpu_attention(ref + (size_t)t * nh * hd, q + (size_t)t * nh * hd, kc, vc, bt + seq[t] * maxb, 0, pos[t] + 1,
                          nh, nkv, hd, bs, scale, NULL, scr);
        float *dq = s_up(q, qn * 4), *dkc = s_up(kc, kvn * 4), *dvc = s_up(vc, kvn * 4);
        int32_t *dseq = s_up(seq, sizeof seq), *dpos = s_up(pos, sizeof pos), *dbt = s_up(bt, (size_t)nblk * 4);
        for (int pass = 0; pass < 2; pass++) {
            const int r0 = pass ? NSEQ - 1 : 0, n = pass ? 1 : NSEQ;
            const size_t on = (size_t)n * nh * hd;
            float *dout = s_poisoned(on);
            bool done = false;
            int rc = cuda_attention(ctx, dout, dq + (size_t)r0 * nh * hd, dkc, dvc, n, dseq + r0, dpos + r0, dbt, maxb,
                                    nh, nkv, hd, bs, scale, &done);
            T_CHECK(rc == 0, "attention decode h=%d kv=%d hd=%d n=%d: rc %d", nh, nkv, hd, n, rc);
            T_CHECK(done == (hd % 32 == 0), "attention decode h=%d kv=%d hd=%d n=%d: q8_done %d", nh, nkv, hd, n, done);
            float *out = s_down(dout, on);
            double e = t_relerr(out, ref + (size_t)r0 * nh * hd, on);
            T_CHECK(e < 1e-5, "attention decode h=%d kv=%d hd=%d bs=%d n=%d rel err %.3g", nh, nkv, hd, bs, n, e);
            free(out);
            cuda_free(dout);
        }
        free(bt), free(kc), free(vc), free(q), free(ref), free(scr);
        cuda_free(dq), cuda_free(dkc), cuda_free(dvc), cuda_free(dseq), cuda_free(dpos), cuda_free(dbt);
    }
}

/* The tensor-core prefill attention (cuda_attention_prefill) against cpu_attention, fp16
 * inputs: a step of 248 rows where seq 0 prefills 0..186, seq 1 decodes at 150 and seq 2 runs
 * a prefill chunk 20..79, so 64-row tiles straddle sequences. Rows in step order with cache
 * blocks of 16, then shuffled (a tile then holds all three sequences, positions in any
 * order), then in step order with blocks of 24 (not dividing the kernel's 64-key tiles).
 * Cache positions no row attends are NaN, so a read of them, or of a block past a sequence's
 * last, shows. */
static void test_attention_prefill(void)
{
    static const int cfg[][3] = {{8, 2, 128}, {4, 4, 128}, {6, 2, 64}, {4, 4, 64}}; /* heads, kv heads, head_dim */
    enum { NSEQ = 3, MAXB = 16, NBLK = NSEQ * MAXB, N = 248 };
    static const int32_t first[NSEQ] = {0, 150, 20}, last[NSEQ] = {186, 150, 79};
    for (int c = 0; c < 12; c++) {
        const int nh = cfg[c % 4][0], nkv = cfg[c % 4][1], hd = cfg[c % 4][2];
        const bool shuffled = c / 4 == 1;
        const int bs = c / 4 == 2 ? 24 : 16;
        int32_t bt[NBLK], seq[N], pos[N];
        s_perm(bt, NBLK);
        int n = 0;
        for (int s = 0; s < NSEQ; s++)
            for (int p = first[s]; p <= last[s]; p++) seq[n] = s, pos[n++] = p;
        T_CHECK(n == N, "prefill step has %d rows", n);
        for (int i = N - 1; shuffled && i > 0; i--) {
            int j = (int)(t_rng_next(&rng) % (uint64_t)(i + 1)), ts = seq[i], tp = pos[i];
            seq[i] = seq[j], pos[i] = pos[j];
            seq[j] = ts, pos[j] = tp;
        }
        size_t kvn = (size_t)NBLK * nkv * bs * hd, qn = (size_t)N * nh * hd;
        float *kc, *vc;
        s_kv_caches(&kc, &vc, kvn, bt, MAXB, NSEQ, last, nkv, bs, hd);
        float *q = malloc(qn * 4), *ref = malloc(qn * 4), *scr = malloc(256 * 4);
        s_fill(q, qn, 2.f);
        float scale = 1.f / sqrtf((float)hd);
        for (int t = 0; t < N; t++)
            cpu_attention(ref + (size_t)t * nh * hd, q + (size_t)t * nh * hd, kc, vc, bt + seq[t] * MAXB, 0, pos[t] + 1,
                          nh, nkv, hd, bs, scale, NULL, scr);
        float *dq = s_up(q, qn * 4), *dkc = s_up(kc, kvn * 4), *dvc = s_up(vc, kvn * 4), *dout = s_poisoned(qn);
        int32_t *dseq = s_up(seq, sizeof seq), *dpos = s_up(pos, sizeof pos), *dbt = s_up(bt, sizeof bt);
        T_CHECK(cuda_attention_prefill(ctx, dout, dq, dkc, dvc, N, dseq, dpos, dbt, MAXB, nh, nkv, hd, bs, scale) == 0,
                "attention_prefill launch");
        float *out = s_down(dout, qn);
        double e = t_relerr(out, ref, qn);
        T_CHECK(e < 3e-3, "attention_prefill h=%d kv=%d hd=%d bs=%d shuffled=%d rel err %.3g", nh, nkv, hd, bs, shuffled,
                e);
        /* a shape it refuses, so cuda_attention falls back */
        if (c == 0) {
            T_CHECK(cuda_attention_prefill(ctx, dout, dq, dkc, dvc, N, dseq, dpos, dbt, MAXB, nh, nkv, 48, bs, scale) ==
                        STRATA_EINVAL_INPUT,
                    "attention_prefill takes head_dim 48");
            T_CHECK(cuda_attention_prefill(ctx, dout, dq, dkc, dvc, N, dseq, dpos, dbt, MAXB, 6, 4, hd, bs, scale) ==
                        STRATA_EINVAL_INPUT,
                    "attention_prefill takes 6 heads over 4 kv heads");
        }
        free(out), free(kc), free(vc), free(q), free(ref), free(scr);
        cuda_free(dq), cuda_free(dkc), cuda_free(dvc), cuda_free(dout), cuda_free(dseq), cuda_free(dpos), cuda_free(dbt);
    }
}

/* Ops that leave their output's int8 rows in the context's workspace (q8_done): a consumer
 * told so (x_q8) must give bit for bit what it gives quantizing the same floats itself, and
 * must really read the workspace (fed zeros as x, it still matches). */
static void test_q8_producers(void)
{
    static const int dims[] = {128, 2080, 4096, 8192};
    static const int ns[] = {1, 3, 16};
    static const wfmt_t fmts[] = {WF_INT8, WF_INT4, WF_MXFP4}; /* the integer path's */
    for (int di = 0; di < 4; di++)
        for (int ni = 0; ni < 3; ni++)
            for (int fi = 0; fi < 3; fi++) {
                const int dim = dims[di], n = ns[ni], rows = 96, f = fmts[fi];
                tmat_t m;
                s_mat(&m, (wfmt_t)f, rows, dim, 32);
                float *x = malloc((size_t)n * dim * 4), *w = malloc((size_t)dim * 4);
                s_fill(x, (size_t)n * dim, 2.f);
                s_fill(w, dim, 1.f);
                float *dx = s_up(x, (size_t)n * dim * 4), *dw = s_up(w, (size_t)dim * 4);
                float *y1 = s_poisoned((size_t)n * dim), *y2 = s_poisoned((size_t)n * dim);
                float *zero = s_zeroed((size_t)n * dim);
                float *o1 = s_poisoned((size_t)n * rows), *o2 = s_poisoned((size_t)n * rows);
                const qmat_t *wp = &m.dev;
                const float *nob = NULL;
                bool done = false;
                cuda_rmsnorm(ctx, y1, dx, dw, n, dim, 1e-6f);
                cuda_matmul_ex(ctx, 1, &o1, y1, n, &wp, &nob, false, false);
                cuda_rmsnorm_q8(ctx, y2, dx, dw, n, dim, 1e-6f, &done);
                T_CHECK(done, "rmsnorm_q8 dim=%d n=%d did not quantize", dim, n);
                cuda_matmul_ex(ctx, 1, &o2, zero, n, &wp, &nob, false, true);
                float *h1 = s_down(y1, (size_t)n * dim), *h2 = s_down(y2, (size_t)n * dim);
                float *r1 = s_down(o1, (size_t)n * rows), *r2 = s_down(o2, (size_t)n * rows);
                T_CHECK(!memcmp(h1, h2, (size_t)n * dim * 4), "rmsnorm_q8 dim=%d n=%d: y differs from rmsnorm", dim, n);
                T_CHECK(!memcmp(r1, r2, (size_t)n * rows * 4), "%s matmul after rmsnorm_q8 dim=%d n=%d differs",
                        wfmt_name((wfmt_t)f), dim, n);
                free(h1), free(h2), free(r1), free(r2), free(x), free(w);
                cuda_free(dx), cuda_free(dw), cuda_free(y1), cuda_free(y2), cuda_free(zero), cuda_free(o1), cuda_free(o2);
                s_mat_free(&m);
            }

    /* attention's output rows for the o-projection: decode rows of 3 sequences */
    {
        const int nh = 8, nkv = 2, hd = 128, bs = 16, maxb = 4, n = 3, cols = nh * hd;
        int32_t bt[3 * 4], seq[3] = {0, 1, 2}, pos[3] = {5, 40, 17};
        for (int i = 0; i < 12; i++) bt[i] = i;
        size_t kvn = (size_t)12 * nkv * bs * hd;
        float *kc = malloc(kvn * 4), *vc = malloc(kvn * 4), *q = malloc((size_t)n * cols * 4);
        s_fill(kc, kvn, 1.f), s_fill(vc, kvn, 1.f), s_fill(q, (size_t)n * cols, 1.f);
        float *dkc = s_up(kc, kvn * 4), *dvc = s_up(vc, kvn * 4), *dq = s_up(q, (size_t)n * cols * 4);
        int32_t *dseq = s_up(seq, sizeof seq), *dpos = s_up(pos, sizeof pos), *dbt = s_up(bt, sizeof bt);
        float *att = s_poisoned((size_t)n * cols), *zero = s_zeroed((size_t)n * cols);
        tmat_t m;
        s_mat(&m, WF_INT4, 256, cols, 32);
        const qmat_t *wp = &m.dev;
        const float *nob = NULL;
        float *o1 = s_poisoned((size_t)n * 256), *o2 = s_poisoned((size_t)n * 256);
        bool done = false;
        cuda_attention(ctx, att, dq, dkc, dvc, n, dseq, dpos, dbt, maxb, nh, nkv, hd, bs, 0.088f, &done);
        T_CHECK(done, "attention did not quantize its output");
        cuda_matmul_ex(ctx, 1, &o2, zero, n, &wp, &nob, false, true);
        cuda_matmul_ex(ctx, 1, &o1, att, n, &wp, &nob, false, false);
        float *r1 = s_down(o1, (size_t)n * 256), *r2 = s_down(o2, (size_t)n * 256);
        T_CHECK(!memcmp(r1, r2, (size_t)n * 256 * 4), "matmul after attention's q8 rows differs");
        free(r1), free(r2), free(kc), free(vc), free(q);
        cuda_free(dkc), cuda_free(dvc), cuda_free(dq), cuda_free(dseq), cuda_free(dpos), cuda_free(dbt);
        cuda_free(att), cuda_free(zero), cuda_free(o1), cuda_free(o2);
        s_mat_free(&m);
    }

    /* the experts reading the tokens' rows from the workspace (gather) */
    for (int ni = 0; ni < 3; ni++)
        for (int fi = 0; fi < 3; fi++) {
            const int n = ns[ni], E = 8, K = 2, H = 128, I = 96, f = fmts[fi];
            tmat_t g[8], u[8], d[8];
            cuda_expert_t ex[8];
            s_experts(g, u, d, ex, E, (wfmt_t)f, H, I, 32);
            float *x = malloc((size_t)n * H * 4), *w = malloc(H * 4), *wt = malloc((size_t)n * K * 4), logits[8];
            int32_t *idx = malloc((size_t)n * K * 4);
            s_fill(x, (size_t)n * H, 1.f);
            s_fill(w, H, 1.f);
            for (int t = 0; t < n; t++) {
                s_fill(logits, E, 3.f);
                cpu_gate_topk(logits, E, K, true, idx + t * K, wt + t * K);
            }
            float *dx = s_up(x, (size_t)n * H * 4), *dw = s_up(w, H * 4), *xn = s_poisoned((size_t)n * H);
            float *zero = s_zeroed((size_t)n * H);
            float *o1 = s_up(x, (size_t)n * H * 4), *o2 = s_up(x, (size_t)n * H * 4);
            int32_t *didx = s_up(idx, (size_t)n * K * 4);
            float *dwt = s_up(wt, (size_t)n * K * 4);
            cuda_expert_t *dex = s_up(ex, sizeof ex);
            void *scr = NULL;
            cuda_malloc(&scr, cuda_moe_scratch_bytes(n, K, H, I, E));
            bool done = false;
            cuda_rmsnorm_q8(ctx, xn, dx, dw, n, H, 1e-6f, &done);
            T_CHECK(done, "rmsnorm_q8 before the experts did not quantize");
            cuda_moe_ffn(ctx, o2, zero, n, H, I, (wfmt_t)f, dex, E, didx, dwt, K, scr, CUDA_MOE_X_Q8, NULL);
            cuda_moe_ffn(ctx, o1, xn, n, H, I, (wfmt_t)f, dex, E, didx, dwt, K, scr, 0, NULL);
            /* the next layer's norm in the combine's launch: out, the normed rows and their int8
             * rows bit for bit as the combine, then cuda_rmsnorm_q8 */
            float *o3 = s_up(x, (size_t)n * H * 4), *y1 = s_poisoned((size_t)n * H), *y3 = s_poisoned((size_t)n * H);
            float *m1 = s_poisoned((size_t)n * I), *m3 = s_poisoned((size_t)n * I);
            tmat_t pm;
            s_mat(&pm, (wfmt_t)f, I, H, 32);
            const qmat_t *pw = &pm.dev;
            const float *nob = NULL;
            bool done1 = false, done3 = false;
            cuda_rmsnorm_q8(ctx, y1, o1, dw, n, H, 1e-6f, &done1);
            cuda_matmul_ex(ctx, 1, &m1, y1, n, &pw, &nob, false, true);
            cuda_moe_ffn(ctx, o3, xn, n, H, I, (wfmt_t)f, dex, E, didx, dwt, K, scr, 0,
                         &(cuda_next_norm_t){dw, y3, 1e-6f, &done3});
            cuda_matmul_ex(ctx, 1, &m3, zero, n, &pw, &nob, false, true);
            T_CHECK(done1 && done3, "rmsnorm after the experts did not quantize");
            float *r3 = s_down(o3, (size_t)n * H), *h1 = s_down(y1, (size_t)n * H), *h3 = s_down(y3, (size_t)n * H);
            float *k1 = s_down(m1, (size_t)n * I), *k3 = s_down(m3, (size_t)n * I);
            float *r1b = s_down(o1, (size_t)n * H);
            T_CHECK(!memcmp(r1b, r3, (size_t)n * H * 4) && !memcmp(h1, h3, (size_t)n * H * 4) &&
                        !memcmp(k1, k3, (size_t)n * I * 4),
                    "%s experts n=%d with the next norm fused differ", wfmt_name((wfmt_t)f), n);
            free(r3), free(h1), free(h3), free(k1), free(k3), free(r1b);
            cuda_free(o3), cuda_free(y1), cuda_free(y3), cuda_free(m1), cuda_free(m3);
            s_mat_free(&pm);
            float *r1 = s_down(o1, (size_t)n * H), *r2 = s_down(o2, (size_t)n * H);
            T_CHECK(!memcmp(r1, r2, (size_t)n * H * 4), "%s experts n=%d reading the workspace's rows differ",
                    wfmt_name((wfmt_t)f), n);
            free(r1), free(r2), free(x), free(w), free(wt), free(idx);
            cuda_free(dx), cuda_free(dw), cuda_free(xn), cuda_free(zero), cuda_free(o1), cuda_free(o2), cuda_free(didx);
            cuda_free(dwt);
            cuda_free(dex), cuda_free(scr);
            for (int e = 0; e < E; e++) s_mat_free(&g[e]), s_mat_free(&u[e]), s_mat_free(&d[e]);
        }
}

/* The router and the gate in one launch (cuda_router_topk) against the two launches: the same
 * top-k, logits and weights to rounding (the dot products are summed in another order);
 * stacked routers (several groups of n_experts a token); with and without a bias (gpt-oss);
 * twice in a row, so the last-block counter must have reset. The host indices arrive without a
 * wait for the stream. */
static void test_router_topk(void)
{
    static const int Es[] = {8, 128}, Ds[] = {1, 3}, ns[] = {1, 5, 16, 20}; /* 20: matmul, gate, copy */
    for (int ei = 0; ei < 2; ei++)
        for (int di = 0; di < 2; di++)
            for (int ni = 0; ni < 4; ni++)
                for (int rb = 0; rb < 4; rb++) {
                    const int renorm = rb & 1, biased = rb >> 1;
                    const int E = Es[ei], D = Ds[di], n = ns[ni], H = 256, K = E == 8 ? 2 : 8, rows = E * D;
                    float *w = malloc((size_t)rows * H * 4), *x = malloc((size_t)n * H * 4), *bh = malloc((size_t)rows * 4);
                    s_fill(w, (size_t)rows * H, 1.f);
                    s_fill(x, (size_t)n * H, 1.f);
                    s_fill(bh, (size_t)rows, 2.f);
                    float *bias = biased ? s_up(bh, (size_t)rows * 4) : NULL;
                    qmat_t wm = {WF_F32, rows, H, 0, s_up(w, (size_t)rows * H * 4), NULL};
                    float *dx = s_up(x, (size_t)n * H * 4), *l1 = s_poisoned((size_t)n * rows),
                          *l2 = s_poisoned((size_t)n * rows);
                    const size_t G = (size_t)n * D;
                    int32_t *i1 = (int32_t *)s_poisoned(G * K), *i2 = (int32_t *)s_poisoned(G * K);
                    float *w1 = s_poisoned(G * K), *w2 = s_poisoned(G * K);
                    cuda_matmul(ctx, l1, dx, n, &wm, bias);
                    cuda_gate_topk(ctx, l1, (int)G, E, K, renorm, i1, w1);
                    int32_t *hi1 = (int32_t *)s_down((float *)i1, G * K);
                    float *hw1 = s_down(w1, G * K), *hl1 = s_down(l1, (size_t)n * rows);
                    int32_t *host = NULL; /* the indices the launch also writes to pinned host memory */
                    cuda_host_alloc((void **)&host, G * K * 4);
                    for (int rep = 0; rep < 2; rep++) {
                        memset(host, 0xff, G * K * 4);
                        T_CHECK(cuda_router_topk(ctx, l2, dx, n, &wm, bias, E, K, renorm, i2, w2, NULL, NULL, host) == 0,
                                "router_topk launch");
                        /* every entry arrives without a wait on the stream (the host's -1s replaced) */
                        double t0 = strata_now();
                        size_t got = 0;
                        while (got < G * K && strata_now() - t0 < 5.0)
                            if (__atomic_load_n(host + got, __ATOMIC_ACQUIRE) >= 0) got++;
                        T_CHECK(got == G * K && !memcmp(host, hi1, G * K * 4),
                                "router_topk E=%d D=%d n=%d run %d: %zu of %zu host indices arrived, %s", E, D, n, rep,
                                got, G * K, memcmp(host, hi1, G * K * 4) ? "differing" : "equal");
                        int32_t *hi2 = (int32_t *)s_down((float *)i2, G * K);
                        T_CHECK(!memcmp(host, hi1, G * K * 4), "router_topk E=%d D=%d n=%d run %d: host indices differ",
                                E, D, n, rep);
                        float *hw2 = s_down(w2, G * K), *hl2 = s_down(l2, (size_t)n * rows);
                        T_CHECK(!memcmp(hi1, hi2, G * K * 4) && t_relerr(hw2, hw1, G * K) < 1e-5 &&
                                    t_relerr(hl2, hl1, (size_t)n * rows) < 1e-5,
                                "router_topk E=%d D=%d n=%d renorm=%d bias=%d run %d differs from matmul + gate", E, D,
                                n, renorm, biased, rep);
                        free(hi2), free(hw2), free(hl2);
                    }
                    cuda_host_free(host);
                    free(hi1), free(hw1), free(hl1), free(w), free(x), free(bh);
                    cuda_free((void *)wm.data), cuda_free(dx), cuda_free(l1), cuda_free(l2), cuda_free(bias);
                    cuda_free(i1), cuda_free(i2), cuda_free(w1), cuda_free(w2);
                }
}

/* The router with the RMSNorm before it and the routing after it (one launch at one token,
 * steps for more): the normed rows match cuda_rmsnorm (the sum of squares is reduced in
 * another order), their int8 rows are the quantization of exactly those floats (an integer
 * matmul reading them gives what it gives quantizing the rows itself), the top-k is the gate's
 * on the normed rows, and the experts told the pairs are routed give bit for bit what they
 * give routing themselves. */
static void test_router_fused(void)
{
    /* hidden 256, and a row of more than one float4 a thread: 6144 (8 a thread at one token), 2048 (2) */
    static const int Es[] = {8, 128}, ns[] = {1, 5, 16}, Hs[] = {256, 6144, 256, 2048};
    for (int ei = 0; ei < 2; ei++)
        for (int hi = 0; hi < 2; hi++)
            for (int ni = 0; ni < 3; ni++)
                for (int D = 1; D <= 2; D++) { /* D 2: stacked routers, the norm only */
                    const int E = Es[ei], n = ns[ni], H = Hs[2 * ei + hi], I = 96, K = E == 8 ? 2 : 8, rows = E * D;
                    const size_t G = (size_t)n * D;
                    float *w = malloc((size_t)rows * H * 4), *x = malloc((size_t)n * H * 4), *nw = malloc(H * 4);
                    s_fill(w, (size_t)rows * H, 1.f);
                    s_fill(x, (size_t)n * H, 3.f);
                    s_fill(nw, H, 1.f);
                    qmat_t wm = {WF_F32, rows, H, 0, s_up(w, (size_t)rows * H * 4), NULL};
                    float *dx = s_up(x, (size_t)n * H * 4), *dnw = s_up(nw, H * 4);
                    float *y1 = s_poisoned((size_t)n * H), *y2 = s_poisoned((size_t)n * H);
                    float *l1 = s_poisoned(G * E), *l2 = s_poisoned(G * E), *w1 = s_poisoned(G * K), *w2 = s_poisoned(G * K);
                    int32_t *i1 = (int32_t *)s_poisoned(G * K), *i2 = (int32_t *)s_poisoned(G * K);
                    void *scr = NULL;
                    cuda_malloc(&scr, cuda_moe_scratch_bytes(n, K, H, I, E));
                    cuda_memset(ctx, scr, 0xff, cuda_moe_scratch_bytes(n, K, H, I, E));
                    bool q8 = false, routed = false;
                    cuda_next_norm_t pre = {dnw, y2, 1e-6f, D == 1 ? &q8 : NULL};
                    cuda_route_into_t rt = {scr, I, &routed};
                    T_CHECK(cuda_router_topk(ctx, l2, dx, n, &wm, NULL, E, K, true, i2, w2, &pre, D == 1 ? &rt : NULL, NULL) == 0,
                            "fused router launch");
                    /* the routing goes in the launch at one token; more take the steps */
                    T_CHECK(D > 1 || (q8 && routed == (n == 1)), "fused router E=%d n=%d: q8 %d routed %d", E, n, q8,
                            routed);
                    /* the int8 rows, read by an integer matmul before anything else overwrites them */
                    tmat_t pm;
                    s_mat(&pm, WF_INT4, 64, H, 32);
                    const qmat_t *pw = &pm.dev;
                    const float *nob = NULL;
                    float *m1 = s_poisoned((size_t)n * 64), *m2 = s_poisoned((size_t)n * 64), *zero = s_zeroed((size_t)n * H);
                    if (D == 1) cuda_matmul_ex(ctx, 1, &m2, zero, n, &pw, &nob, false, true);
                    cuda_matmul_ex(ctx, 1, &m1, y2, n, &pw, &nob, false, false);
                    cuda_rmsnorm(ctx, y1, dx, dnw, n, H, 1e-6f);
                    cuda_matmul(ctx, l1, y1, n, &wm, NULL);
                    cuda_gate_topk(ctx, l1, (int)G, E, K, true, i1, w1);
                    float *hy1 = s_down(y1, (size_t)n * H), *hy2 = s_down(y2, (size_t)n * H);
                    float *hl1 = s_down(l1, G * E), *hl2 = s_down(l2, G * E);
                    int32_t *hi1 = (int32_t *)s_down((float *)i1, G * K), *hi2 = (int32_t *)s_down((float *)i2, G * K);
                    T_CHECK(t_relerr(hy2, hy1, (size_t)n * H) < 1e-6, "fused router E=%d n=%d D=%d H=%d: normed rows differ",
                            E, n, D, H);
                    T_CHECK(t_relerr(hl2, hl1, G * E) < 1e-5, "fused router E=%d n=%d D=%d: logits differ", E, n, D);
                    T_CHECK(!memcmp(hi1, hi2, G * K * 4), "fused router E=%d n=%d D=%d: top-k differs", E, n, D);
                    if (D == 1) {
                        float *k1 = s_down(m1, (size_t)n * 64), *k2 = s_down(m2, (size_t)n * 64);
                        T_CHECK(!memcmp(k1, k2, (size_t)n * 64 * 4), "fused router E=%d n=%d H=%d: int8 rows differ", E,
                                n, H);
                        free(k1), free(k2);
                    }
                    if (D == 1 && H == 256) {
                        /* the experts on the routed scratch and on a fresh one */
                        tmat_t g[128], u[128], d[128];
                        cuda_expert_t *ex = malloc(sizeof(cuda_expert_t) * E);
                        s_experts(g, u, d, ex, E, WF_INT4, H, I, 32);
                        cuda_expert_t *dex = s_up(ex, sizeof(cuda_expert_t) * E);
                        void *scr2 = NULL;
                        cuda_malloc(&scr2, cuda_moe_scratch_bytes(n, K, H, I, E));
                        float *o1 = s_up(x, (size_t)n * H * 4), *o2 = s_up(x, (size_t)n * H * 4);
                        cuda_moe_ffn(ctx, o2, y2, n, H, I, WF_INT4, dex, E, i2, w2, K, scr, routed ? CUDA_MOE_ROUTED : 0,
                                     NULL);
                        cuda_moe_ffn(ctx, o1, y2, n, H, I, WF_INT4, dex, E, i2, w2, K, scr2, 0, NULL);
                        float *r1 = s_down(o1, (size_t)n * H), *r2 = s_down(o2, (size_t)n * H);
                        T_CHECK(!memcmp(r1, r2, (size_t)n * H * 4), "fused router E=%d n=%d: experts on its routing differ",
                                E, n);
                        free(r1), free(r2), free(ex);
                        cuda_free(o1), cuda_free(o2), cuda_free(dex), cuda_free(scr2);
                        for (int e = 0; e < E; e++) s_mat_free(&g[e]), s_mat_free(&u[e]), s_mat_free(&d[e]);
                    }
                    free(hy1), free(hy2), free(hl1), free(hl2), free(hi1), free(hi2), free(w), free(x), free(nw);
                    s_mat_free(&pm);
                    cuda_free((void *)wm.data), cuda_free(dx), cuda_free(dnw), cuda_free(y1), cuda_free(y2);
                    cuda_free(l1), cuda_free(l2), cuda_free(w1), cuda_free(w2), cuda_free(i1), cuda_free(i2);
                    cuda_free(m1), cuda_free(m2), cuda_free(zero), cuda_free(scr);
                }
}

/* cuda_h2d_small: a kernel reads pinned host memory; bad alignment is refused */
static void test_h2d_small(void)
{
    uint32_t *h = NULL;
    T_CHECK(cuda_host_alloc((void **)&h, 4096) == 0, "pinned alloc");
    for (int i = 0; i < 1024; i++) h[i] = (uint32_t)t_rng_next(&rng);
    float *d = s_poisoned(1024);
    T_CHECK(cuda_h2d_small(ctx, d + 1, h + 3, 1000 * 4) == 0, "h2d_small");
    float *out = s_down(d, 1024);
    T_CHECK(!memcmp(out + 1, h + 3, 1000 * 4), "h2d_small: the copy differs");
    T_CHECK(isnan(out[0]) && isnan(out[1001]), "h2d_small wrote outside its range");
    T_CHECK(cuda_h2d_small(ctx, d, (uint8_t *)h + 2, 8) == STRATA_EINVAL_INPUT, "misaligned source accepted");
    free(out);
    cuda_free(d);
    cuda_host_free(h);
}

/* cuda_patch_words: each word where it was told, nothing around it; too many words, or a
 * misaligned one, refused */
static void test_patch_words(void)
{
    const int n = CUDA_PATCH_MAX;
    uint64_t *d = (uint64_t *)s_poisoned(2 * (size_t)(2 * n + 2)), *dst[CUDA_PATCH_MAX + 1], val[CUDA_PATCH_MAX + 1];
    for (int i = 0; i <= n; i++) dst[i] = d + 1 + 2 * i, val[i] = t_rng_next(&rng);
    T_CHECK(cuda_patch_words(ctx, n, dst, val) == 0, "patch_words");
    uint64_t *out = (uint64_t *)s_down((float *)d, 2 * (size_t)(2 * n + 2));
    int bad = 0;
    for (int i = 0; i < 2 * n + 2; i++) /* words 1, 3, ..., 2n - 1 written; the others keep the poison */
        bad += i % 2 && i < 2 * n ? out[i] != val[i / 2] : out[i] != UINT64_MAX;
    T_CHECK(!bad, "patch_words: %d words wrong", bad);
    T_CHECK(cuda_patch_words(ctx, n + 1, dst, val) == STRATA_EINVAL_INPUT, "patch_words took %d words", n + 1);
    uint64_t *mis = (uint64_t *)((uint8_t *)d + 4);
    T_CHECK(cuda_patch_words(ctx, 1, &mis, val) == STRATA_EINVAL_INPUT, "patch_words took a misaligned word");
    free(out);
    cuda_free(d);
}

/* cuda_wait_patch: the stream waits for the host's mailbox, then the words land */
static void test_wait_patch(void)
{
    enum { N = 40 };
    uint64_t *box = NULL;
    T_CHECK(cuda_host_alloc((void **)&box, (2 + 2 * N) * 8) == 0, "pinned alloc");
    memset(box, 0, (2 + 2 * N) * 8);
    uint64_t *d = (uint64_t *)s_poisoned(2 * (2 * N));
    T_CHECK(cuda_wait_patch(ctx, box) == 0, "wait_patch");
    usleep(20000);
    T_CHECK(cuda_query(ctx) == 0, "the stream went on before the mailbox was filled");
    for (int i = 0; i < N; i++) box[2 + 2 * i] = (uint64_t)(uintptr_t)(d + 2 * i), box[3 + 2 * i] = t_rng_next(&rng);
    __atomic_store_n(box, (uint64_t)N + 1, __ATOMIC_RELEASE);
    uint64_t *out = (uint64_t *)s_down((float *)d, 2 * (2 * N));
    int bad = 0;
    for (int i = 0; i < 2 * N; i++) bad += i % 2 ? out[i] != UINT64_MAX : out[i] != box[3 + i];
    T_CHECK(!bad, "wait_patch: %d words wrong", bad);
    free(out);
    cuda_free(d);
    cuda_host_free(box);
}

/* cuda_wait_add_rows: the arrival word is set once the kernels before have finished, the rows
 * wait for the box, then only the flagged tokens' rows are added; rows of DIM, one partial pass
 * of the kernel's reads or several (past 8 x 1024) */
static void s_wait_add_rows(int DIM)
{
    enum { T = 3 };
    uint64_t *box = NULL;
    float *rows = NULL;
    T_CHECK(cuda_host_alloc((void **)&box, (2 + T) * 8) == 0 && cuda_host_alloc((void **)&rows, T * DIM * 4) == 0,
            "pinned alloc");
    memset(box, 0, (2 + T) * 8);
    float *hx = malloc(T * DIM * 4);
    for (int i = 0; i < T * DIM; i++) hx[i] = t_randf(&rng), rows[i] = t_randf(&rng);
    float *d = s_up(hx, T * DIM * 4);
    T_CHECK(cuda_wait_add_rows(ctx, box, box + 1 + T, d, rows, T, DIM) == 0, "wait_add_rows");
    uint64_t arrived = 0;
    for (int i = 0; i < 2000 && !arrived; i++) {
        arrived = __atomic_load_n(box + 1 + T, __ATOMIC_ACQUIRE);
        if (!arrived) usleep(1000);
    }
    T_CHECK(arrived == 1, "wait_add_rows never set its arrival word");
    T_CHECK(cuda_query(ctx) == 0, "the stream went on before the box was opened");
    box[1] = 1, box[3] = 1; /* tokens 0 and 2 */
    __atomic_store_n(box, (uint64_t)1, __ATOMIC_RELEASE);
    float *out = s_down(d, T * DIM);
    int bad = 0;
    for (int t = 0; t < T; t++)
        for (int j = 0; j < DIM; j++) {
            const float want = t == 1 ? hx[t * DIM + j] : hx[t * DIM + j] + rows[t * DIM + j];
            bad += out[t * DIM + j] != want;
        }
    T_CHECK(!bad, "wait_add_rows, rows of %d: %d values wrong", DIM, bad);
    free(out);
    free(hx);
    cuda_free(d);
    cuda_host_free(rows);
    cuda_host_free(box);
}

static void test_wait_add_rows(void)
{
    s_wait_add_rows(300);
    s_wait_add_rows(9000);
}

/* cuda_put_host: two device arrays into pinned host memory, then the flag, which the host may
 * poll for them (no stream sync) */
static void test_put_host(void)
{
    enum { N = 5000, NB = 7 };
    float *ha = NULL, *hb = NULL;
    uint64_t *flag = NULL;
    T_CHECK(cuda_host_alloc((void **)&ha, N * 4) == 0 && cuda_host_alloc((void **)&hb, NB * 4) == 0 &&
                cuda_host_alloc((void **)&flag, 8) == 0,
            "pinned alloc");
    float *a = malloc(N * 4), b[NB];
    for (int i = 0; i < N; i++) a[i] = t_randf(&rng), ha[i] = NAN;
    for (int i = 0; i < NB; i++) b[i] = t_randf(&rng), hb[i] = NAN;
    *flag = 0;
    float *da = s_up(a, N * 4), *db = s_up(b, NB * 4);
    T_CHECK(cuda_put_host(ctx, ha, da, N, hb, db, NB, flag) == 0, "put_host");
    for (int i = 0; i < 5000 && !__atomic_load_n(flag, __ATOMIC_ACQUIRE); i++) usleep(1000);
    T_CHECK(__atomic_load_n(flag, __ATOMIC_ACQUIRE) == 1, "put_host never set its flag");
    T_CHECK(!memcmp(ha, a, N * 4) && !memcmp(hb, b, NB * 4), "put_host: the host's copies differ");
    T_CHECK(cuda_sync(ctx) == 0, "sync");
    free(a);
    cuda_free(da);
    cuda_free(db);
    cuda_host_free(ha);
    cuda_host_free(hb);
    cuda_host_free(flag);
}

static void test_embed_argmax_add(void)
{
    /* rows of 600 (blocks of 256 and a partial one); ids outside the table give zeros; the
     * table on the device, and in pinned host memory read over PCIe (a chained step's) */
    enum { NT = 7, D = 600 };
    for (int c = 0; c < 4; c++) {
        const wfmt_t f = c & 1 ? WF_BF16 : WF_F32;
        tmat_t m;
        s_mat(&m, f, 300, D, 0);
        int32_t toks[NT] = {0, 299, 17, 17, 150, -1, 300};
        float *ref = calloc(NT * D, 4);
        for (int t = 0; t < 5; t++) qmat_dequant_row(&m.host, toks[t], ref + t * D);
        qmat_t w = m.dev;
        void *pinned = NULL;
        if (c & 2) {
            const size_t bytes = qmat_data_bytes(f, 300, D);
            T_CHECK(cuda_host_alloc(&pinned, bytes) == 0, "pinned table");
            memcpy(pinned, m.host.data, bytes);
            T_CHECK(cuda_host_device_ptr(pinned, (void **)&w.data) == 0, "pinned table's device pointer");
        }
        int32_t *dt = s_up(toks, sizeof toks);
        float *dout = s_poisoned(NT * D);
        cuda_embed(ctx, dout, &w, dt, NT);
        float *out = s_down(dout, NT * D);
        T_CHECK(!memcmp(out, ref, NT * D * 4), "embed %s (host memory %d) differs", wfmt_name(f), c >> 1);
        free(out), free(ref);
        cuda_free(dt), cuda_free(dout);
        cuda_host_free(pinned);
        s_mat_free(&m);
    }
    /* argmax: one block a row (V 1000) and split over blocks (5000, 151936), with ties in one
     * block and across blocks; run twice, so the blocks' done counters must have reset */
    static const int Vs[] = {1000, 5000, 151936};
    for (int vi = 0; vi < 3; vi++) {
        const int n = 4, V = Vs[vi];
        float *l = malloc((size_t)n * V * 4);
        s_fill(l, (size_t)n * V, 1.f);
        l[1 * V + 77] = 9.f, l[1 * V + 33] = 9.f;       /* tie: lower id wins */
        l[2 * V + V - 1] = 9.f, l[2 * V + V / 2] = 9.f; /* tie across blocks */
        l[3 * V + 5] = NAN;                             /* NaN never wins */
        int32_t want[4];
        for (int t = 0; t < n; t++) want[t] = cpu_sample(l + (size_t)t * V, V, 0.f, 0, 1.f, 0.5);
        float *dl = s_up(l, (size_t)n * V * 4);
        for (int rep = 0; rep < 2; rep++) {
            int32_t *di = (int32_t *)s_poisoned(n);
            cuda_argmax(ctx, dl, n, V, di);
            int32_t *got = (int32_t *)s_down((float *)di, n);
            T_CHECK(!memcmp(got, want, sizeof want), "argmax V=%d run %d differs (rows got %d %d %d %d want %d %d %d %d)",
                    V, rep, got[0], got[1], got[2], got[3], want[0], want[1], want[2], want[3]);
            free(got);
            cuda_free(di);
        }
        free(l);
        cuda_free(dl);
    }
    float *a = malloc(1000 * 4), *b = malloc(1000 * 4);
    s_fill(a, 1000, 1.f);
    s_fill(b, 1000, 1.f);
    float *da = s_up(a, 4000), *db = s_up(b, 4000);
    cuda_add(ctx, da, db, 1000);
    float *sum = s_down(da, 1000);
    int ok = 1;
    for (int i = 0; i < 1000; i++) ok &= sum[i] == a[i] + b[i];
    T_CHECK(ok, "add differs");
    free(a), free(b), free(sum);
    cuda_free(da), cuda_free(db);
}

/* MXFP4 dequantization bit for bit against qmat_dequant_row, the layout's contract: every scale
 * byte but 0xFF, so that subnormal weights (scale 2^-127) and infinite ones (4 or 6 times
 * 2^127) occur. phase 0 (no workspace): cuda_embed, the element-wise dequantization, from
 * device memory and from pinned host memory (data and scales), then cuda_matmul's fp32 path
 * (16-byte chunks) on one-hot rows, whose output is the weights themselves: y[t][r] =
 * w[r][t] (scale bytes up to 252, so that no weight is infinite and 0 * w is 0; compared by
 * value: the sum of +0 and -0 is +0). phase 1 (workspace reserved): the same through the
 * tensor-core GEMM (64 one-hot rows), phase 2 (cuBLAS on): through the fp16 matrix and cuBLAS
 * (128 rows), with scale bytes 104 .. 140 (weights 2^-24 .. 6 * 2^13, every one an fp16 value,
 * which both dequantize to exactly). */
static void test_mxfp4_exact(int phase)
{
    static const int Rs[] = {96, 1056}; /* a block a row, and a warp a row */
    for (int ri = 0; ri < 2; ri++) {
        const int R = Rs[ri], C = phase == 2 ? 128 : 64, n = C;
        const size_t db = qmat_data_bytes(WF_MXFP4, R, C), sb = qmat_scale_bytes(WF_MXFP4, R, C, 32);
        tmat_t m;
        m.hdata = malloc(db), m.hscales = malloc(sb);
        s_mxfp4_fill(m.hdata, m.hscales, R, C, phase ? 104 : 0, phase ? 140 : 254);
        m.host = (qmat_t){WF_MXFP4, R, C, 32, m.hdata, m.hscales};
        s_mat_finish(&m, db, sb); /* m.hf32: qmat_dequant_row's rows */
        if (phase == 0) {
            int32_t *toks = malloc((size_t)R * 4);
            for (int r = 0; r < R; r++) toks[r] = R - 1 - r;
            float *want = malloc((size_t)R * C * 4);
            for (int r = 0; r < R; r++) memcpy(want + (size_t)r * C, m.hf32 + (size_t)toks[r] * C, (size_t)C * 4);
            int32_t *dt = s_up(toks, (size_t)R * 4);
            for (int pinned = 0; pinned < 2; pinned++) {
                qmat_t w = m.dev;
                void *hd = NULL, *hs = NULL;
                if (pinned) {
                    T_CHECK(cuda_host_alloc(&hd, db) == 0 && cuda_host_alloc(&hs, sb) == 0, "pinned table");
                    memcpy(hd, m.hdata, db);
                    memcpy(hs, m.hscales, sb);
                    T_CHECK(cuda_host_device_ptr(hd, (void **)&w.data) == 0 &&
                                cuda_host_device_ptr(hs, (void **)&w.scales) == 0,
                            "pinned table's device pointers");
                }
                float *dout = s_poisoned((size_t)R * C);
                T_CHECK(cuda_embed(ctx, dout, &w, dt, R) == 0, "mxfp4 embed launch");
                float *out = s_down(dout, (size_t)R * C);
                T_CHECK(!memcmp(out, want, (size_t)R * C * 4),
                        "mxfp4 embed %dx%d (host memory %d) differs from qmat_dequant_row", R, C, pinned);
                free(out);
                cuda_free(dout);
                cuda_host_free(hd), cuda_host_free(hs);
            }
            free(toks), free(want);
            cuda_free(dt);
            /* fresh weights without an infinite one for the one-hot products */
            s_mat_free(&m);
            m.hdata = malloc(db), m.hscales = malloc(sb);
            s_mxfp4_fill(m.hdata, m.hscales, R, C, 0, 252);
            m.host = (qmat_t){WF_MXFP4, R, C, 32, m.hdata, m.hscales};
            s_mat_finish(&m, db, sb);
        }
        float *x = calloc((size_t)n * C, 4), *want = malloc((size_t)n * R * 4);
        for (int t = 0; t < n; t++) x[(size_t)t * C + t] = 1.f;
        for (int t = 0; t < n; t++)
            for (int r = 0; r < R; r++) want[(size_t)t * R + r] = m.hf32[(size_t)r * C + t];
        float *dx = s_up(x, (size_t)n * C * 4), *dy = s_poisoned((size_t)n * R);
        T_CHECK(cuda_matmul(ctx, dy, dx, n, &m.dev, NULL) == 0, "mxfp4 one-hot matmul launch");
        float *y = s_down(dy, (size_t)n * R);
        size_t bad = 0;
        for (size_t i = 0; i < (size_t)n * R; i++) bad += !(y[i] == want[i]);
        T_CHECK(!bad, "mxfp4 one-hot matmul %dx%d n=%d phase %d: %zu of %zu weights differ from qmat_dequant_row", R,
                C, n, phase, bad, (size_t)n * R);
        free(x), free(want), free(y);
        cuda_free(dx), cuda_free(dy);
        s_mat_free(&m);
    }
}

/* Sliding windows and sinks (cuda_attn_opts_t) against cpu_attention with the same ctx_start
 * (max(0, pos + 1 - window)) and sinks. Positions before every window of a sequence are NaN and
 * its block-table entries of blocks wholly before them are -1, so a read of either shows (a NaN
 * output, or a fault). Decode rows at 1, 31, 200 and 1500 through cuda_attention_ex (the split
 * path; windows 128 and 20, with and without sinks, and sinks alone, one sink far above the
 * scores); then the prefill step of test_attention_prefill (seq 0 prefills 0..186, seq 1
 * decodes at 150, seq 2 runs 20..79; rows in step order and shuffled) through
 * cuda_attention_prefill_ex and through cuda_attention_ex (fp32, many rows). The defaults
 * (opts zero) give cuda_attention's and cuda_attention_prefill's results bit for bit. */
static void s_window_lo(int32_t *lo, const int32_t *first, int nseq, int window)
{
    for (int s = 0; s < nseq; s++) lo[s] = window > 0 && first[s] + 1 - window > 0 ? first[s] + 1 - window : 0;
}

/* Block-table entries of the blocks wholly before lo[s] set to -1 (after the caches are filled). */
static void s_drop_blocks(int32_t *bt, int maxb, int nseq, const int32_t *lo, int bs)
{
    for (int s = 0; s < nseq; s++)
        for (int b = 0; (b + 1) * bs <= lo[s]; b++) bt[s * maxb + b] = -1;
}

static void test_attention_opts(void)
{
    static const int cfg[][4] = {{64, 8, 64, 16}, {32, 4, 128, 16}, {8, 4, 80, 24}, {6, 2, 50, 16}}; /* heads, kv, hd, bs */
    static const int variants[][2] = {{128, 1}, {20, 0}, {0, 1}};                                  /* window, sinks */
    enum { NSEQ = 4 };
    static const int32_t last[NSEQ] = {1, 31, 200, 1500};
    for (int c = 0; c < 4; c++)
        for (int vi = 0; vi < 3; vi++) {
            const int nh = cfg[c][0], nkv = cfg[c][1], hd = cfg[c][2], bs = cfg[c][3], W = variants[vi][0];
            const int maxb = last[NSEQ - 1] / bs + 1, nblk = NSEQ * maxb;
            int32_t *bt = malloc((size_t)nblk * 4), seq[NSEQ], pos[NSEQ], lo[NSEQ];
            s_perm(bt, nblk);
            for (int s = 0; s < NSEQ; s++) seq[s] = s, pos[s] = last[s];
            s_window_lo(lo, last, NSEQ, W);
            size_t kvn = (size_t)nblk * nkv * bs * hd, qn = (size_t)NSEQ * nh * hd;
            float *kc, *vc;
            s_kv_caches_from(&kc, &vc, kvn, bt, maxb, NSEQ, lo, last, nkv, bs, hd);
            s_drop_blocks(bt, maxb, NSEQ, lo, bs);
            float *q = malloc(qn * 4), *ref = malloc(qn * 4), *scr = malloc((size_t)(last[NSEQ - 1] + 1) * 4);
            float *sinks = malloc((size_t)nh * 4);
            s_fill(q, qn, 2.f);
            s_fill(sinks, nh, 2.f);
            sinks[0] = 12.f; /* far above head 0's scores: its output is small, and must stay right */
            const float *hs = variants[vi][1] ? sinks : NULL;
            const float scale = 1.f / sqrtf((float)hd);
            for (int t = 0; t < NSEQ; t++)
                cpu_attention(ref + (size_t)t * nh * hd, q + (size_t)t * nh * hd, kc, vc, bt + seq[t] * maxb, lo[t],
                              pos[t] + 1, nh, nkv, hd, bs, scale, hs, scr);
            float *dq = s_up(q, qn * 4), *dkc = s_up(kc, kvn * 4), *dvc = s_up(vc, kvn * 4), *ds = s_up(sinks, nh * 4);
            int32_t *dseq = s_up(seq, sizeof seq), *dpos = s_up(pos, sizeof pos), *dbt = s_up(bt, (size_t)nblk * 4);
            const cuda_attn_opts_t opts = {W, hs ? ds : NULL};
            for (int pass = 0; pass < 2; pass++) { /* all rows, then the longest alone */
                const int r0 = pass ? NSEQ - 1 : 0, n = pass ? 1 : NSEQ;
                const size_t on = (size_t)n * nh * hd;
                float *dout = s_poisoned(on);
                bool done = false;
                int rc = cuda_attention_ex(ctx, dout, dq + (size_t)r0 * nh * hd, dkc, dvc, n, dseq + r0, dpos + r0, dbt,
                                           maxb, nh, nkv, hd, bs, scale, &done, &opts);
                T_CHECK(rc == 0, "attention window=%d sinks=%d h=%d hd=%d n=%d: rc %d", W, hs != NULL, nh, hd, n, rc);
                float *out = s_down(dout, on);
                double e = t_relerr(out, ref + (size_t)r0 * nh * hd, on);
                T_CHECK(e < 1e-5, "attention window=%d sinks=%d h=%d kv=%d hd=%d bs=%d n=%d rel err %.3g", W, hs != NULL,
                        nh, nkv, hd, bs, n, e);
                free(out);
                cuda_free(dout);
            }
            free(bt), free(kc), free(vc), free(q), free(ref), free(scr), free(sinks);
            cuda_free(dq), cuda_free(dkc), cuda_free(dvc), cuda_free(ds), cuda_free(dseq), cuda_free(dpos), cuda_free(dbt);
        }

    /* prefill-shaped steps */
    static const int pcfg[][3] = {{64, 8, 64}, {8, 2, 128}}; /* heads, kv heads, head_dim (gpt-oss's first) */
    static const int pvar[][2] = {{128, 1}, {24, 0}, {24, 1}, {0, 1}, {0, 0}};
    enum { PSEQ = 3, MAXB = 16, NBLK = PSEQ * MAXB, N = 248, BS = 16 };
    static const int32_t first[PSEQ] = {0, 150, 20}, plast[PSEQ] = {186, 150, 79};
    for (int c = 0; c < 2; c++)
        for (int vi = 0; vi < 5; vi++)
            for (int shuffled = 0; shuffled < 2; shuffled++) {
                const int nh = pcfg[c][0], nkv = pcfg[c][1], hd = pcfg[c][2], W = pvar[vi][0];
                int32_t bt[NBLK], seq[N], pos[N], lo[PSEQ];
                s_perm(bt, NBLK);
                int n = 0;
                for (int s = 0; s < PSEQ; s++)
                    for (int p = first[s]; p <= plast[s]; p++) seq[n] = s, pos[n++] = p;
                for (int i = N - 1; shuffled && i > 0; i--) {
                    int j = (int)(t_rng_next(&rng) % (uint64_t)(i + 1)), ts = seq[i], tp = pos[i];
                    seq[i] = seq[j], pos[i] = pos[j];
                    seq[j] = ts, pos[j] = tp;
                }
                s_window_lo(lo, first, PSEQ, W);
                size_t kvn = (size_t)NBLK * nkv * BS * hd, qn = (size_t)N * nh * hd;
                float *kc, *vc;
                s_kv_caches_from(&kc, &vc, kvn, bt, MAXB, PSEQ, lo, plast, nkv, BS, hd);
                s_drop_blocks(bt, MAXB, PSEQ, lo, BS);
                float *q = malloc(qn * 4), *ref = malloc(qn * 4), *scr = malloc(256 * 4), *sinks = malloc((size_t)nh * 4);
                s_fill(q, qn, 2.f);
                s_fill(sinks, nh, 2.f);
                sinks[1] = 12.f;
                const float *hs = pvar[vi][1] ? sinks : NULL;
                const float scale = 1.f / sqrtf((float)hd);
                for (int t = 0; t < N; t++) {
                    const int cs = W > 0 && pos[t] + 1 - W > 0 ? pos[t] + 1 - W : 0;
                    cpu_attention(ref + (size_t)t * nh * hd, q + (size_t)t * nh * hd, kc, vc, bt + seq[t] * MAXB, cs,
                                  pos[t] + 1, nh, nkv, hd, BS, scale, hs, scr);
                }
                float *dq = s_up(q, qn * 4), *dkc = s_up(kc, kvn * 4), *dvc = s_up(vc, kvn * 4), *ds = s_up(sinks, nh * 4);
                float *d1 = s_poisoned(qn), *d2 = s_poisoned(qn);
                int32_t *dseq = s_up(seq, sizeof seq), *dpos = s_up(pos, sizeof pos), *dbt = s_up(bt, sizeof bt);
                const cuda_attn_opts_t opts = {W, hs ? ds : NULL};
                T_CHECK(cuda_attention_prefill_ex(ctx, d1, dq, dkc, dvc, N, dseq, dpos, dbt, MAXB, nh, nkv, hd, BS, scale,
                                                  &opts) == 0,
                        "attention_prefill_ex launch");
                T_CHECK(cuda_attention_ex(ctx, d2, dq, dkc, dvc, N, dseq, dpos, dbt, MAXB, nh, nkv, hd, BS, scale, NULL,
                                          &opts) == 0,
                        "attention_ex launch");
                float *o1 = s_down(d1, qn), *o2 = s_down(d2, qn);
                const double e1 = t_relerr(o1, ref, qn), e2 = t_relerr(o2, ref, qn);
                T_CHECK(e1 < 3e-3 && e2 < 1e-5,
                        "prefill-shaped attention window=%d sinks=%d h=%d hd=%d shuffled=%d: rel err tensor cores %.3g, "
                        "fp32 %.3g",
                        W, hs != NULL, nh, hd, shuffled, e1, e2);
                if (W == 0 && !hs) { /* the defaults: the plain ops' results bit for bit */
                    const cuda_attn_opts_t zero = {0, NULL};
                    float *d3 = s_poisoned(qn), *d4 = s_poisoned(qn);
                    cuda_attention_prefill(ctx, d3, dq, dkc, dvc, N, dseq, dpos, dbt, MAXB, nh, nkv, hd, BS, scale);
                    cuda_attention(ctx, d4, dq, dkc, dvc, N, dseq, dpos, dbt, MAXB, nh, nkv, hd, BS, scale, NULL);
                    cuda_attention_prefill_ex(ctx, d1, dq, dkc, dvc, N, dseq, dpos, dbt, MAXB, nh, nkv, hd, BS, scale, &zero);
                    float *o3 = s_down(d3, qn), *o4 = s_down(d4, qn), *o1b = s_down(d1, qn);
                    T_CHECK(!memcmp(o1b, o3, qn * 4) && !memcmp(o2, o4, qn * 4),
                            "attention with zero opts differs from the plain ops (h=%d hd=%d)", nh, hd);
                    free(o3), free(o4), free(o1b);
                    cuda_free(d3), cuda_free(d4);
                }
                free(o1), free(o2), free(kc), free(vc), free(q), free(ref), free(scr), free(sinks);
                cuda_free(dq), cuda_free(dkc), cuda_free(dvc), cuda_free(ds), cuda_free(d1), cuda_free(d2);
                cuda_free(dseq), cuda_free(dpos), cuda_free(dbt);
            }
}

/* Expert biases and gpt-oss's clamped activation (cuda_moe_opts_t) against cpu_ffn_swiglu with
 * cpu_ffn_opts_t, expert by expert: MXFP4, INT4 and BF16 experts (8, top 4), 1, 5 and 40 tokens,
 * inter 96 and 192, so the integer path, the fp32 per-token kernels and the tensor-core GEMM
 * each take the gate/up biases and the activation, and the combine the down biases (and the
 * fused next norm, every other case). Variants: every bias and the clamp (limit 1.5, alpha
 * 1.702: both clamps bite), the biases with plain SwiGLU, the clamp alone. The integer path's
 * two launches (cuda_moe_ffn_ex's parts) equal its one; zero opts equal cuda_moe_ffn bit for
 * bit. */
static void test_moe_opts(void)
{
    static const wfmt_t fmts[] = {WF_MXFP4, WF_INT4, WF_BF16};
    static const int ns[] = {1, 5, 40}, inters[] = {96, 192};
    const int E = 8, K = 4, H = 128;
    for (int fi = 0; fi < 3; fi++)
        for (int ni = 0; ni < 3; ni++)
            for (int ii = 0; ii < 2; ii++)
                for (int var = 0; var < 4; var++) { /* 3: fp32 rows below the tensor cores' sizes */
                    const wfmt_t f = fmts[fi];
                    const int n = ns[ni], I = inters[ii];
                    const bool biases = var != 2, clamped = var != 1, with_nn = (ni + ii + var) & 1, f32 = var == 3;
                    const bool gemm = n >= 32 && I % 64 == 0, intpath = !gemm && f != WF_BF16 && !f32;
                    tmat_t g[8], u[8], d[8];
                    cuda_expert_t ex[8];
                    s_experts(g, u, d, ex, E, f, H, I, 32);
                    float *gb = malloc((size_t)E * I * 4), *ub = malloc((size_t)E * I * 4), *dbh = malloc((size_t)E * H * 4);
                    s_fill(gb, (size_t)E * I, 0.5f);
                    s_fill(ub, (size_t)E * I, 0.5f);
                    s_fill(dbh, (size_t)E * H, 0.5f);
                    float *x = malloc((size_t)n * H * 4), *base = malloc((size_t)n * H * 4), *ref = malloc((size_t)n * H * 4);
                    int32_t *idx = malloc((size_t)n * K * 4);
                    float *wt = malloc((size_t)n * K * 4), logits[8], *scratch = malloc(2 * (size_t)I * 4);
                    s_fill(x, (size_t)n * H, 1.f);
                    s_fill(base, (size_t)n * H, 1.f);
                    memcpy(ref, base, (size_t)n * H * 4);
                    for (int t = 0; t < n; t++) {
                        s_fill(logits, E, 3.f);
                        cpu_gate_topk(logits, E, K, true, idx + t * K, wt + t * K);
                        for (int k = 0; k < K; k++) {
                            const int e = idx[t * K + k];
                            const cpu_ffn_opts_t o = {biases ? gb + (size_t)e * I : NULL, biases ? ub + (size_t)e * I : NULL,
                                                      biases ? dbh + (size_t)e * H : NULL, clamped, 1.5f, 1.702f};
                            cpu_ffn_swiglu(NULL, ref + (size_t)t * H, x + (size_t)t * H, 1, &g[e].ref, &u[e].ref,
                                           &d[e].ref, &o, scratch, wt + t * K + k, true);
                        }
                    }
                    float *dgb = s_up(gb, (size_t)E * I * 4), *dub = s_up(ub, (size_t)E * I * 4);
                    float *ddb = s_up(dbh, (size_t)E * H * 4);
                    const cuda_moe_opts_t opts = {biases ? dgb : NULL, biases ? dub : NULL, biases ? ddb : NULL, clamped,
                                                  1.5f, 1.702f, f32};
                    float *dx = s_up(x, (size_t)n * H * 4), *dout = s_up(base, (size_t)n * H * 4);
                    float *nw = malloc(H * 4), *dy = s_poisoned((size_t)n * H);
                    s_fill(nw, H, 1.f);
                    float *dnw = s_up(nw, H * 4);
                    int32_t *didx = s_up(idx, (size_t)n * K * 4);
                    float *dw = s_up(wt, (size_t)n * K * 4);
                    cuda_expert_t *dex = s_up(ex, sizeof ex);
                    void *dscr = NULL;
                    const size_t sb = cuda_moe_scratch_bytes(n, K, H, I, E);
                    cuda_malloc(&dscr, sb);
                    cuda_memset(ctx, dscr, 0xff, sb);
                    const cuda_next_norm_t nn = {dnw, dy, 1e-6f, NULL};
                    T_CHECK(cuda_moe_ffn_ex(ctx, 0, 0, dout, dx, n, H, I, f, dex, E, didx, dw, K, dscr, 0,
                                            with_nn ? &nn : NULL, &opts) == 0,
                            "moe_ffn_ex launch");
                    float *out = s_down(dout, (size_t)n * H);
                    const double e = t_relerr(out, ref, (size_t)n * H);
                    const double bound = gemm ? 5e-3 : intpath ? 2e-2 : 1e-5;
                    T_CHECK(e < bound, "moe opts %s n=%d inter=%d biases=%d clamped=%d nn=%d f32 %d rel err %.3g",
                            wfmt_name(f), n, I, biases, clamped, with_nn, f32, e);
                    if (with_nn) { /* the next norm of what the combine wrote */
                        float *y = s_down(dy, (size_t)n * H), *yr = malloc((size_t)n * H * 4);
                        cpu_rmsnorm(yr, out, nw, n, H, 1e-6f);
                        const double ey = t_relerr(y, yr, (size_t)n * H);
                        T_CHECK(ey < 1e-5, "moe opts %s n=%d inter=%d: the fused next norm rel err %.3g", wfmt_name(f), n,
                                I, ey);
                        free(y), free(yr);
                    }
                    if (!f32 && cuda_moe_parts_ok(n, f, H, I)) { /* head: down rows 0..63; tail: 64.. and the combine */
                        float *dout2 = s_up(base, (size_t)n * H * 4);
                        T_CHECK(cuda_moe_ffn_ex(ctx, CUDA_MOE_HEAD, 64, dout2, dx, n, H, I, f, dex, E, didx, dw, K, dscr,
                                                0, NULL, &opts) == 0 &&
                                    cuda_moe_ffn_ex(ctx, CUDA_MOE_TAIL, 64, dout2, dx, n, H, I, f, dex, E, didx, dw, K,
                                                    dscr, 0, NULL, &opts) == 0,
                                "moe_ffn_ex parts launch");
                        float *out2 = s_down(dout2, (size_t)n * H);
                        const double ep = t_relerr(out2, out, (size_t)n * H);
                        T_CHECK(ep < 1e-6, "moe opts %s n=%d inter=%d in parts: rel err %.3g against one launch",
                                wfmt_name(f), n, I, ep);
                        free(out2);
                        cuda_free(dout2);
                    }
                    if (var == 0) { /* zero opts: cuda_moe_ffn bit for bit */
                        const cuda_moe_opts_t zero = {NULL, NULL, NULL, false, 0.f, 0.f};
                        float *da = s_up(base, (size_t)n * H * 4), *dbb = s_up(base, (size_t)n * H * 4);
                        cuda_moe_ffn(ctx, da, dx, n, H, I, f, dex, E, didx, dw, K, dscr, 0, NULL);
                        cuda_moe_ffn_ex(ctx, 0, 0, dbb, dx, n, H, I, f, dex, E, didx, dw, K, dscr, 0, NULL, &zero);
                        float *ha = s_down(da, (size_t)n * H), *hb = s_down(dbb, (size_t)n * H);
                        T_CHECK(!memcmp(ha, hb, (size_t)n * H * 4), "moe %s n=%d inter=%d: zero opts differ from cuda_moe_ffn",
                                wfmt_name(f), n, I);
                        free(ha), free(hb);
                        cuda_free(da), cuda_free(dbb);
                    }
                    free(out), free(x), free(base), free(ref), free(idx), free(wt), free(scratch), free(nw);
                    free(gb), free(ub), free(dbh);
                    cuda_free(dgb), cuda_free(dub), cuda_free(ddb), cuda_free(dx), cuda_free(dout), cuda_free(dy);
                    cuda_free(dnw), cuda_free(didx), cuda_free(dw), cuda_free(dex), cuda_free(dscr);
                    for (int e2 = 0; e2 < E; e2++) s_mat_free(&g[e2]), s_mat_free(&u[e2]), s_mat_free(&d[e2]);
                }
}

int main(void)
{
    rng = t_seed();
    if (cuda_device_count() < 1) {
        fprintf(stderr, "test_cuda_ops: no CUDA device (this is a GPU test)\n");
        return 1;
    }
    if (cuda_ctx_create(&ctx, 0)) return 1;
    test_matmul(false);
    test_mxfp4_exact(0);
    if (cuda_ctx_reserve_q8(ctx, 256, 4096)) return 1;
    test_matmul(true);
    test_mxfp4_exact(1);
    /* again with the scratch for k parts lent: the GEMM splits k where its tiles leave SMs idle */
    float *parts = s_poisoned(PARTS_FLOATS);
    cuda_ctx_lend_parts(ctx, parts, PARTS_FLOATS * 4);
    test_matmul(true);
    T_CHECK(s_parts_written(parts) > 0, "no matmul split k in parts");
    test_matmul_parts(parts);
    cuda_free(parts);
    /* again with cuBLAS taking the 130-row cases (CUDA_BLAS_MIN_ROWS) */
    T_CHECK(cuda_ctx_enable_blas(ctx, (size_t)1 << 20) == 0, "cuBLAS setup");
    const uint64_t blas0 = cuda_blas_gemms(ctx);
    test_matmul(true);
    T_CHECK(CUDA_BLAS_MIN_ROWS <= 130 && cuda_blas_gemms(ctx) > blas0, "cuBLAS took no matmul (%llu GEMMs)",
            (unsigned long long)(cuda_blas_gemms(ctx) - blas0));
    const uint64_t blas1 = cuda_blas_gemms(ctx);
    test_mxfp4_exact(2);
    T_CHECK(cuda_blas_gemms(ctx) > blas1, "cuBLAS took no MXFP4 matmul");
    test_moe();
    test_moe_wide();
    test_moe_opts();
    test_rmsnorm_rope();
    test_gate();
    test_attention();
    test_attention_decode();
    test_attention_prefill();
    test_attention_opts();
    test_q8_producers();
    test_router_topk();
    test_router_fused();
    test_embed_argmax_add();
    test_h2d_small();
    test_patch_words();
    test_wait_patch();
    test_wait_add_rows();
    test_put_host();
    cuda_ctx_destroy(ctx);
    return t_done("test_cuda_ops");
}
