/* test_cpu_ops.c - every op in kernels/cpu/ops.h and the thread pool, on fresh random inputs
 * (STRATA_SEED replays a run). Outputs are poisoned with NaN before each call so unwritten
 * elements show. Matmul-like ops run on every ISA this CPU supports (printed) and with 1
 * and several threads, against an oracle in double precision over qmat_dequant_row; on
 * avx512vnni, the int4 x q8 results must also equal avx512's bit for bit. */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/ops.h"
#include "tests/unit/check.h"

static uint64_t g_seed;

static float *t_alloc(size_t n)
{
    float *p = malloc(n * sizeof(float) + 64);
    for (size_t i = 0; i < n; i++) p[i] = NAN;
    return p;
}

static void t_fill(float *p, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++) p[i] = t_randf(&g_seed) * scale;
}

static void t_poison(float *p, size_t n)
{
    for (size_t i = 0; i < n; i++) p[i] = NAN;
}

static bool t_all_finite(const float *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(p[i])) return false;
    return true;
}

/* ---- thread pool ---- */

typedef struct {
    _Atomic int *hits;
    int64_t grain, n;
    _Atomic int bad_chunk, bad_tid;
    int nthreads;
} t_pool_ctx_t;

static void t_pool_fn(void *ctx, int64_t i0, int64_t i1, int tid)
{
    t_pool_ctx_t *c = ctx;
    if (i0 < 0 || i1 > c->n || i1 <= i0 || (i1 - i0 < c->grain && i1 != c->n)) atomic_fetch_add(&c->bad_chunk, 1);
    if (tid < 0 || tid >= c->nthreads) atomic_fetch_add(&c->bad_tid, 1);
    for (int64_t i = i0; i < i1 && i < c->n; i++) atomic_fetch_add(&c->hits[i], 1);
}

static void test_pool(void)
{
    const int sizes[] = {1, 2, 3, 5};
    for (unsigned s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
        tpool_t *p = tpool_create(sizes[s]);
        T_CHECK(p != NULL && tpool_size(p) == sizes[s], "pool of %d", sizes[s]);
        if (!p) continue;
        int bad = 0, badc = 0, badt = 0;
        for (int it = 0; it < 3000; it++) {
            int64_t n = it < 2000 ? 1 + (int64_t)(t_rng_next(&g_seed) % 64) : 1 + (int64_t)(t_rng_next(&g_seed) % 5000);
            int64_t grain = 1 + (int64_t)(t_rng_next(&g_seed) % 16);
            _Atomic int *hits = calloc((size_t)n, sizeof(*hits));
            t_pool_ctx_t c = {.hits = hits, .grain = grain, .n = n, .nthreads = sizes[s]};
            tpool_run(p, n, grain, t_pool_fn, &c);
            for (int64_t i = 0; i < n; i++) bad += hits[i] != 1;
            badc += c.bad_chunk;
            badt += c.bad_tid;
            free(hits);
        }
        T_CHECK(bad == 0, "pool %d: %d items not run exactly once", sizes[s], bad);
        T_CHECK(badc == 0, "pool %d: %d chunks out of range or below grain", sizes[s], badc);
        T_CHECK(badt == 0, "pool %d: %d bad thread indices", sizes[s], badt);
        tpool_destroy(p);
    }
    /* n <= 0: STRATA_THREADS, else all cpus */
    setenv("STRATA_THREADS", "3", 1);
    tpool_t *pe = tpool_create(0);
    T_CHECK(pe && tpool_size(pe) == 3, "STRATA_THREADS=3 gives %d", pe ? tpool_size(pe) : -1);
    tpool_destroy(pe);
    unsetenv("STRATA_THREADS");
    pe = tpool_create(0);
    T_CHECK(pe && tpool_size(pe) >= 1, "default pool");
    tpool_destroy(pe);
    /* NULL pool runs inline */
    _Atomic int hits[10] = {0};
    t_pool_ctx_t c = {.hits = hits, .grain = 1, .n = 10, .nthreads = 1};
    tpool_run(NULL, 10, 1, t_pool_fn, &c);
    int bad = 0;
    for (int i = 0; i < 10; i++) bad += hits[i] != 1;
    T_CHECK(bad == 0 && c.bad_chunk == 0 && c.bad_tid == 0, "NULL pool");
    T_CHECK(tpool_size(NULL) == 1, "NULL pool size");
    tpool_run(NULL, 0, 1, t_pool_fn, &c); /* empty range: no call */
}

/* ---- matmul ---- */

typedef struct {
    qmat_t q;
    void *data, *scales;
    float *dq; /* [rows][cols] dequantized by qmat_dequant_row */
} t_mat_t;

static void t_mat_make(t_mat_t *m, wfmt_t fmt, int group, int rows, int cols)
{
    float *src = t_alloc((size_t)rows * cols);
    t_fill(src, (size_t)rows * cols, 0.1f);
    m->data = malloc(qmat_data_bytes(fmt, rows, cols) + 1);
    m->scales = malloc(qmat_scale_bytes(fmt, rows, cols, group) + 1);
    T_CHECK(qmat_quantize(fmt, group, src, rows, cols, m->data, m->scales) == 0, "quantize %s", wfmt_name(fmt));
    m->q = (qmat_t){.fmt = fmt, .rows = rows, .cols = cols, .group = fmt == WF_INT4 ? group : fmt == WF_MXFP4 ? 32 : 0,
                    .data = m->data, .scales = fmt == WF_F32 || fmt == WF_BF16 ? NULL : m->scales};
    m->dq = src;
    for (int r = 0; r < rows; r++) qmat_dequant_row(&m->q, r, m->dq + (int64_t)r * cols);
}

static void t_mat_free(t_mat_t *m)
{
    free(m->data);
    free(m->scales);
    free(m->dq);
}

/* y[t][r] = x[t] . dq[r] + bias[r], in double; mag (if not NULL) gets the sum of the
 * absolute terms, the scale of the rounding error of any summation order. */
static void t_oracle_mm_mag(float *y, float *mag, const float *x, int n, const t_mat_t *m, const float *bias)
{
    for (int t = 0; t < n; t++)
        for (int r = 0; r < m->q.rows; r++) {
            double a = bias ? bias[r] : 0, am = fabs(a);
            for (int c = 0; c < m->q.cols; c++) {
                double p = (double)x[(int64_t)t * m->q.cols + c] * m->dq[(int64_t)r * m->q.cols + c];
                a += p;
                am += fabs(p);
            }
            y[(int64_t)t * m->q.rows + r] = (float)a;
            if (mag) mag[(int64_t)t * m->q.rows + r] = (float)am;
        }
}

static void t_oracle_mm(float *y, const float *x, int n, const t_mat_t *m, const float *bias)
{
    t_oracle_mm_mag(y, NULL, x, n, m, bias);
}

static double g_worst[CPU_ISA_COUNT][WF_COUNT];

static void test_matmul_case(tpool_t *pool, cpu_isa_t isa, wfmt_t fmt, int rows, int cols, int n, bool bias)
{
    int group = fmt == WF_INT4 ? (cols % 128 == 0 ? 128 : cols % 64 == 0 ? 64 : 32) : fmt == WF_MXFP4 ? 32 : 0;
    if (fmt == WF_INT4 && (t_rng_next(&g_seed) & 1)) group = 32;
    t_mat_t m;
    t_mat_make(&m, fmt, group, rows, cols);
    float *x = t_alloc((size_t)n * cols), *y = t_alloc((size_t)n * rows), *want = t_alloc((size_t)n * rows);
    float *b = bias ? t_alloc((size_t)rows) : NULL;
    t_fill(x, (size_t)n * cols, 1.0f);
    if (b) t_fill(b, (size_t)rows, 0.5f);
    float *mag = t_alloc((size_t)n * rows);
    t_oracle_mm_mag(want, mag, x, n, &m, b);
    t_poison(y, (size_t)n * rows);
    cpu_matmul(pool, y, x, n, &m.q, b);
    /* relative error 1e-5, plus 1e-6 of the absolute terms' scale: a dot whose terms
     * cancel (a 1-row matrix makes that likely) has a tiny result but the rounding error
     * of its terms (fp32 sums ~ sqrt(cols) * 6e-8 of it) */
    double e = t_relerr(y, want, (size_t)n * rows), num = 0, wn = 0, mn = 0;
    for (size_t i = 0; i < (size_t)n * rows; i++) {
        num += ((double)y[i] - want[i]) * ((double)y[i] - want[i]);
        wn += (double)want[i] * want[i];
        mn += (double)mag[i] * mag[i];
    }
    bool fin = t_all_finite(y, (size_t)n * rows), ok = fin && sqrt(num) <= 1e-5 * sqrt(wn) + 1e-6 * sqrt(mn);
    if (e > g_worst[isa][fmt]) g_worst[isa][fmt] = e;
    T_CHECK(ok, "%s %s %dx%d g%d n=%d bias=%d threads=%d: rel err %g (vs term scale %g), finite %d", cpu_isa_name(isa),
            wfmt_name(fmt), rows, cols, group, n, bias, tpool_size(pool), e, sqrt(num / mn), fin);
    /* batch invariance: each token alone gives bit for bit its row of the batch, so a
     * sequence's output does not depend on the others in its step */
    int differ = 0;
    for (int t = 0; t < n && n > 1; t++) {
        cpu_matmul(pool, want, x + (size_t)t * cols, 1, &m.q, b);
        differ += memcmp(want, y + (size_t)t * rows, sizeof(float) * (size_t)rows) != 0;
    }
    T_CHECK(differ == 0, "%s %s %dx%d n=%d: %d tokens differ from the same token alone", cpu_isa_name(isa),
            wfmt_name(fmt), rows, cols, n, differ);
    free(x); free(y); free(want); free(b); free(mag);
    t_mat_free(&m);
}

/* x[n][cols] rounded as CPU_ACT_Q8 does (amax / 127 per 32 columns, round half to even). */
static void t_q8_round(const float *x, float *xr, size_t cnt)
{
    for (size_t i = 0; i < cnt; i += 32) {
        float amax = 0;
        for (int k = 0; k < 32; k++) amax = fmaxf(amax, fabsf(x[i + k]));
        const float d = amax / 127.f;
        for (int k = 0; k < 32; k++) xr[i + k] = d > 0 ? (float)((double)rintf(x[i + k] / d) * d) : 0.f;
    }
}

/* y poisoned, then cpu_matmul with q8 activations on isa (restoring the ISA and f32). */
static void t_matmul_q8_on(tpool_t *pool, cpu_isa_t isa, float *y, const float *x, int n, const t_mat_t *m,
                           const float *b)
{
    const cpu_isa_t was = cpu_ops_init();
    STRATA_ASSERT(cpu_ops_set_isa(isa) == isa);
    t_poison(y, (size_t)n * m->q.rows);
    cpu_ops_set_act(CPU_ACT_Q8);
    cpu_matmul(pool, y, x, n, &m->q, b);
    cpu_ops_set_act(CPU_ACT_F32);
    cpu_ops_set_isa(was);
}

/* Elements of a[cnt] and b[cnt] whose bits differ; *first gets the first one's index. */
static size_t t_bits_differ(const float *a, const float *b, size_t cnt, size_t *first)
{
    size_t bad = 0;
    for (size_t i = 0; i < cnt; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0 && !bad++) *first = i;
    return bad;
}

/* CPU_ACT_Q8 on INT4 or MXFP4 weights: the result must be the dequantized weights dotted with
 * the int8-rounded activations (quantized here as the GPU does: amax / 127, round half to
 * even), to fp32 summation error, and within the int8 rounding of the exact fp32 result. On
 * avx512vnni it must also be bit for bit avx512's (INT4: the same integer dots, the same fp32
 * operations in the same order; MXFP4: the same kernel). */
static double g_worst_q8[CPU_ISA_COUNT][WF_COUNT];

static void test_matmul_q8_case(tpool_t *pool, cpu_isa_t isa, wfmt_t fmt, int rows, int cols, int n, int group,
                                bool bias)
{
    t_mat_t m;
    t_mat_make(&m, fmt, group, rows, cols);
    float *x = t_alloc((size_t)n * cols), *xr = t_alloc((size_t)n * cols), *y = t_alloc((size_t)n * rows);
    float *want = t_alloc((size_t)n * rows), *exact = t_alloc((size_t)n * rows), *mag = t_alloc((size_t)n * rows);
    float *b = bias ? t_alloc((size_t)rows) : NULL;
    t_fill(x, (size_t)n * cols, 1.0f);
    if (b) t_fill(b, (size_t)rows, 0.5f);
    t_q8_round(x, xr, (size_t)n * cols);
    t_oracle_mm_mag(want, mag, xr, n, &m, b);
    t_oracle_mm(exact, x, n, &m, b);
    t_matmul_q8_on(pool, isa, y, x, n, &m, b);
    /* against the q8 oracle: fp32 summation error (as test_matmul_case); against fp32 x: the
     * int8 rounding, |dx| <= amax / 254 per element, so 2% of the result plus 1% of the terms'
     * scale (a single cancelling dot has a tiny result) */
    double num = 0, wn = 0, mn = 0, qn = 0, xn = 0;
    for (size_t i = 0; i < (size_t)n * rows; i++) {
        num += ((double)y[i] - want[i]) * ((double)y[i] - want[i]);
        qn += ((double)y[i] - exact[i]) * ((double)y[i] - exact[i]);
        wn += (double)want[i] * want[i];
        xn += (double)exact[i] * exact[i];
        mn += (double)mag[i] * mag[i];
    }
    const double e = t_relerr(y, want, (size_t)n * rows), eq = t_relerr(y, exact, (size_t)n * rows);
    if (e > g_worst_q8[isa][fmt]) g_worst_q8[isa][fmt] = e;
    T_CHECK(t_all_finite(y, (size_t)n * rows) && sqrt(num) <= 1e-5 * sqrt(wn) + 1e-6 * sqrt(mn) &&
                sqrt(qn) <= 2e-2 * sqrt(xn) + 1e-2 * sqrt(mn),
            "%s %s/q8 %dx%d g%d n=%d bias=%d threads=%d: rel err %g against the q8 oracle, %g against fp32 x",
            cpu_isa_name(isa), wfmt_name(fmt), rows, cols, group, n, bias, tpool_size(pool), e, eq);
    if (isa == CPU_ISA_AVX512_VNNI) { /* want is free now: avx512's result */
        t_matmul_q8_on(pool, CPU_ISA_AVX512, want, x, n, &m, b);
        size_t first = 0, bad = t_bits_differ(y, want, (size_t)n * rows, &first);
        T_CHECK(bad == 0, "%s %s/q8 %dx%d g%d n=%d bias=%d threads=%d: %zu of %zu outputs differ from avx512's "
                "(first [%zu][%zu]: %a vs %a)", cpu_isa_name(isa), wfmt_name(fmt), rows, cols, group, n, bias,
                tpool_size(pool), bad,
                (size_t)n * rows, first / rows, first % rows, bad ? y[first] : 0.0, bad ? want[first] : 0.0);
    }
    free(x); free(xr); free(y); free(want); free(exact); free(mag); free(b);
    t_mat_free(&m);
}

/* MXFP4 of random bytes with scale bytes drawn from [slo, shi], dequantized into dq. */
static void t_mat_mxfp4_raw(t_mat_t *m, int rows, int cols, int slo, int shi)
{
    m->data = malloc((size_t)rows * cols / 2);
    m->scales = malloc((size_t)rows * cols / 32);
    for (size_t i = 0; i < (size_t)rows * cols / 2; i++) ((uint8_t *)m->data)[i] = (uint8_t)t_rng_next(&g_seed);
    for (size_t i = 0; i < (size_t)rows * cols / 32; i++)
        ((uint8_t *)m->scales)[i] = (uint8_t)(slo + (int)(t_rng_next(&g_seed) % (uint64_t)(shi - slo + 1)));
    m->q = (qmat_t){.fmt = WF_MXFP4, .rows = rows, .cols = cols, .group = 32, .data = m->data, .scales = m->scales};
    m->dq = t_alloc((size_t)rows * cols);
    for (int r = 0; r < rows; r++) qmat_dequant_row(&m->q, r, m->dq + (int64_t)r * cols);
}

/* MXFP4 at the edges of the e8m0 range, in both activation modes: scale bytes 0..3 (2^-127 ..
 * 2^-124, subnormal weights) with x ~ 2^100, and 245..252 (up to 2^125; 6 * 2^125 is near
 * fp32's top) with x ~ 2^-110, so the products and the q8 block factors stay normal; each
 * within the fp32 bound of its oracle (the dequantized weights times x, or times x rounded
 * to q8). Then a 0xFF scale byte makes its row's outputs NaN, and only its row. */
static void test_mxfp4_extremes(tpool_t *pool, cpu_isa_t isa)
{
    static const struct { int slo, shi; float xs; } ranges[2] = {{0, 3, 0x1p100f}, {245, 252, 0x1p-110f}};
    for (int k = 0; k < 2; k++)
        for (int q8 = 0; q8 < 2; q8++) {
            const int rows = 1 + (int)(t_rng_next(&g_seed) % 40), cols = 32 * (1 + (int)(t_rng_next(&g_seed) % 21));
            const int n = 1 + (int)(t_rng_next(&g_seed) % 6);
            t_mat_t m;
            t_mat_mxfp4_raw(&m, rows, cols, ranges[k].slo, ranges[k].shi);
            float *x = t_alloc((size_t)n * cols), *xr = t_alloc((size_t)n * cols), *y = t_alloc((size_t)n * rows);
            float *want = t_alloc((size_t)n * rows), *mag = t_alloc((size_t)n * rows);
            t_fill(x, (size_t)n * cols, ranges[k].xs);
            if (q8) t_q8_round(x, xr, (size_t)n * cols);
            t_oracle_mm_mag(want, mag, q8 ? xr : x, n, &m, NULL);
            if (q8) t_matmul_q8_on(pool, isa, y, x, n, &m, NULL);
            else {
                t_poison(y, (size_t)n * rows);
                cpu_matmul(pool, y, x, n, &m.q, NULL);
            }
            double num = 0, wn = 0, mn = 0;
            for (size_t i = 0; i < (size_t)n * rows; i++) {
                num += ((double)y[i] - want[i]) * ((double)y[i] - want[i]);
                wn += (double)want[i] * want[i];
                mn += (double)mag[i] * mag[i];
            }
            T_CHECK(t_all_finite(y, (size_t)n * rows) && sqrt(num) <= 1e-5 * sqrt(wn) + 1e-6 * sqrt(mn),
                    "%s mxfp4%s scale bytes %d..%d %dx%d n=%d: rel err %g", cpu_isa_name(isa), q8 ? "/q8" : "",
                    ranges[k].slo, ranges[k].shi, rows, cols, n, t_relerr(y, want, (size_t)n * rows));
            free(x); free(xr); free(y); free(want); free(mag);
            t_mat_free(&m);
        }
    t_mat_t m;
    t_mat_mxfp4_raw(&m, 5, 320, 120, 130);
    ((uint8_t *)m.scales)[2 * 10 + 7] = 0xFF;
    for (int q8 = 0; q8 < 2; q8++) {
        float x[3 * 320], y[3 * 5];
        t_fill(x, 3 * 320, 1.0f);
        if (q8) t_matmul_q8_on(pool, isa, y, x, 3, &m, NULL);
        else {
            t_poison(y, 3 * 5);
            cpu_matmul(pool, y, x, 3, &m.q, NULL);
        }
        bool ok = true;
        for (int t = 0; t < 3; t++)
            for (int r = 0; r < 5; r++) ok &= r == 2 ? isnan(y[t * 5 + r]) : isfinite(y[t * 5 + r]);
        T_CHECK(ok, "%s mxfp4%s: a 0xFF scale makes its row NaN, only it", cpu_isa_name(isa), q8 ? "/q8" : "");
    }
    t_mat_free(&m);
}

static void test_matmul_isa(tpool_t *pool, cpu_isa_t isa)
{
    test_mxfp4_extremes(pool, isa);
    static const int qn[] = {1, 2, 3, 4, 5, 9};
    for (unsigned k = 0; k < sizeof(qn) / sizeof(qn[0]); k++) {
        int cols = 128 * (1 + (int)(t_rng_next(&g_seed) % 6)), rows = 1 + (int)(t_rng_next(&g_seed) % 67);
        test_matmul_q8_case(pool, isa, WF_INT4, rows, cols, qn[k], (int[]){32, 64, 128}[k % 3], k & 1);
        cols = 128 * (1 + (int)(t_rng_next(&g_seed) % 6)), rows = 1 + (int)(t_rng_next(&g_seed) % 67);
        test_matmul_q8_case(pool, isa, WF_MXFP4, rows, cols, qn[k], 32, k & 1);
    }
    /* token counts 1..10 and 17 (pairs, a lone last token, several slices of 4), every group,
     * block counts odd (the last block alone), even and not a multiple of 4, odd row counts */
    for (int n = 1; n <= 11; n++) {
        for (int gi = 0; gi < 3; gi++) {
            const int group = 32 << gi, ng = 1 + (int)(t_rng_next(&g_seed) % (gi ? 9 : 13));
            const int rows = 1 + 2 * (int)(t_rng_next(&g_seed) % 40);
            test_matmul_q8_case(pool, isa, WF_INT4, rows, group * ng, n == 11 ? 17 : n, group, (n + gi) & 1);
        }
        const int nb = 1 + (int)(t_rng_next(&g_seed) % 19), rows = 1 + 2 * (int)(t_rng_next(&g_seed) % 40);
        test_matmul_q8_case(pool, isa, WF_MXFP4, rows, 32 * nb, n == 11 ? 17 : n, 32, n & 1);
    }
    for (int f = WF_INT4; f <= WF_MXFP4; f++) {
        test_matmul_q8_case(pool, isa, (wfmt_t)f, 1, 32, 1, 32, false);
        test_matmul_q8_case(pool, isa, (wfmt_t)f, 3, 32, 5, 32, true);
        test_matmul_q8_case(pool, isa, (wfmt_t)f, 257, 2048, 1, 32, false);
        test_matmul_q8_case(pool, isa, (wfmt_t)f, 129, 1056, 7, 32, true);
    }

    static const int ns[] = {1, 2, 3, 4, 5, 7, 16, 37};
    for (int f = 0; f < WF_COUNT; f++) {
        for (unsigned k = 0; k < sizeof(ns) / sizeof(ns[0]); k++) {
            int n = ns[k];
            /* odd row counts (not a multiple of any unroll); cols a multiple of 32 for INT4 and
             * MXFP4 (odd block counts too), with a ragged tail for the others */
            int rows = 1 + (int)(t_rng_next(&g_seed) % 67);
            int cols = f == WF_INT4 || f == WF_MXFP4 ? 32 * (1 + (int)(t_rng_next(&g_seed) % 12))
                                                     : 1 + (int)(t_rng_next(&g_seed) % 300);
            test_matmul_case(pool, isa, (wfmt_t)f, rows, cols, n, k & 1);
        }
        test_matmul_case(pool, isa, (wfmt_t)f, 257, 512, 1, false);
        test_matmul_case(pool, isa, (wfmt_t)f, 129, 256, 16, true);
        test_matmul_case(pool, isa, (wfmt_t)f, 1, 32, 1, false);
    }
    /* FP8 NaN weights (0x7f / 0xff) give NaN outputs in that row only, as in the reference */
    t_mat_t m;
    t_mat_make(&m, WF_FP8, 0, 5, 64);
    ((uint8_t *)m.data)[2 * 64 + 37] = 0x7f;
    ((uint8_t *)m.data)[4 * 64 + 3] = 0xff;
    for (int n = 1; n <= 6; n += 5) {
        float x[6 * 64], y[6 * 5];
        t_fill(x, (size_t)n * 64, 1.0f);
        t_poison(y, (size_t)n * 5);
        cpu_matmul(pool, y, x, n, &m.q, NULL);
        bool ok = true;
        for (int t = 0; t < n; t++)
            for (int r = 0; r < 5; r++) ok &= (r == 2 || r == 4) ? isnan(y[t * 5 + r]) : isfinite(y[t * 5 + r]);
        T_CHECK(ok, "%s fp8 NaN rows, n=%d", cpu_isa_name(isa), n);
    }
    t_mat_free(&m);
}

/* ---- FFN ---- */

/* cpu_ffn_swiglu against the double oracle: gate and up in fmt, down in dfmt; mode 0 plain
 * SwiGLU, 1 with the three biases, 2 with the biases and gpt-oss's clamped activation, its
 * limit small enough against the (biased) gate and up values that both clamps bite, which the
 * test counts. */
static void test_ffn(tpool_t *pool, cpu_isa_t isa, wfmt_t fmt, wfmt_t dfmt, int n, bool accumulate, bool with_scale,
                     int mode)
{
    const int hidden = 96, inter = 64 + 32 * (int)(t_rng_next(&g_seed) % 3);
    t_mat_t g, u, d;
    t_mat_make(&g, fmt, 32, inter, hidden);
    t_mat_make(&u, fmt, 32, inter, hidden);
    t_mat_make(&d, dfmt, 32, hidden, inter);
    float *x = t_alloc((size_t)n * hidden), *out = t_alloc((size_t)n * hidden), *want = t_alloc((size_t)n * hidden);
    float *scratch = t_alloc((size_t)2 * n * inter), *sc = t_alloc((size_t)n);
    float *gy = t_alloc((size_t)n * inter), *uy = t_alloc((size_t)n * inter), *dy = t_alloc((size_t)n * hidden);
    float *gb = t_alloc((size_t)inter), *ub = t_alloc((size_t)inter), *db = t_alloc((size_t)hidden);
    t_fill(x, (size_t)n * hidden, 2.0f);
    t_fill(sc, (size_t)n, 1.0f);
    t_fill(gb, (size_t)inter, 1.0f);
    t_fill(ub, (size_t)inter, 1.0f);
    t_fill(db, (size_t)hidden, 1.0f);
    cpu_ffn_opts_t opts = {.gate_bias = gb, .up_bias = ub, .down_bias = db, .clamped = mode == 2, .alpha = 1.702f};
    t_oracle_mm(gy, x, n, &g, mode ? gb : NULL);
    t_oracle_mm(uy, x, n, &u, mode ? ub : NULL);
    /* the limit: a random fraction (0.3 .. 0.7) of the smallest of the largest gate, the largest
     * up and minus the smallest up, so that each clamp bites whatever the seed */
    float gmax = -INFINITY, umax = -INFINITY, umin = INFINITY;
    for (int i = 0; i < n * inter; i++) gmax = fmaxf(gmax, gy[i]), umax = fmaxf(umax, uy[i]), umin = fminf(umin, uy[i]);
    opts.limit = (0.3f + 0.2f * (float)(t_rng_next(&g_seed) % 3)) * fmaxf(fminf(fminf(gmax, umax), -umin), 1e-3f);
    int bites[3] = {0}; /* gate above the limit, up above it, up below -limit */
    for (int i = 0; i < n * inter; i++) {
        double gv = gy[i], uv = uy[i];
        if (mode == 2) {
            bites[0] += gv > opts.limit, bites[1] += uv > opts.limit, bites[2] += uv < -opts.limit;
            gv = fmin(gv, opts.limit);
            uv = fmax(fmin(uv, opts.limit), -opts.limit);
            gy[i] = (float)((uv + 1) * (gv / (1.0 + exp(-opts.alpha * gv))));
        } else
            gy[i] = (float)(gv / (1.0 + exp(-gv)) * uv);
    }
    if (mode == 2)
        T_CHECK(bites[0] > 0 && bites[1] > 0 && bites[2] > 0, "ffn clamps bite: %d %d %d of %d", bites[0], bites[1],
                bites[2], n * inter);
    t_oracle_mm(dy, gy, n, &d, mode ? db : NULL);
    if (accumulate) t_fill(out, (size_t)n * hidden, 1.0f);
    else t_poison(out, (size_t)n * hidden);
    for (int t = 0; t < n; t++)
        for (int i = 0; i < hidden; i++) {
            float s = with_scale ? sc[t] : 1.0f, r = dy[t * hidden + i] * s;
            want[t * hidden + i] = accumulate ? out[t * hidden + i] + r : r;
        }
    t_poison(scratch, (size_t)2 * n * inter);
    cpu_ffn_swiglu(pool, out, x, n, &g.q, &u.q, &d.q, mode ? &opts : NULL, scratch, with_scale ? sc : NULL, accumulate);
    double e = t_relerr(out, want, (size_t)n * hidden);
    T_CHECK(t_all_finite(out, (size_t)n * hidden) && e < 2e-5,
            "ffn %s %s/%s mode %d n=%d acc=%d scale=%d inter=%d: rel err %g", cpu_isa_name(isa), wfmt_name(fmt),
            wfmt_name(dfmt), mode, n, accumulate, with_scale, inter, e);
    free(x); free(out); free(want); free(scratch); free(sc); free(gy); free(uy); free(dy); free(gb); free(ub); free(db);
    t_mat_free(&g); t_mat_free(&u); t_mat_free(&d);
}

/* cpu_ffn_swiglu_many: every item's output is bit for bit what cpu_ffn_swiglu gives for it alone
 * (same kernels, same per-row sums; only the dispatch is shared), with items of different
 * formats, shapes, token counts and opts (plain, biased, clamped), some empty. */
static void test_ffn_many(tpool_t *pool, cpu_isa_t isa)
{
    enum { NI = 7 };
    const int hidden = 64;
    t_mat_t g[NI], u[NI], d[NI];
    cpu_ffn_item_t it[NI];
    cpu_ffn_opts_t opts[NI];
    float *x[NI], *out[NI], *want[NI], *bias[NI];
    size_t scratch_n = 0;
    for (int i = 0; i < NI; i++) {
        const wfmt_t fmt = (wfmt_t)((i + (int)(t_rng_next(&g_seed) % 2)) % WF_COUNT);
        const int inter = 32 * (1 + (int)(t_rng_next(&g_seed) % 3)), n = i == 3 ? 0 : 1 + (int)(t_rng_next(&g_seed) % 6);
        t_mat_make(&g[i], fmt, 32, inter, hidden);
        t_mat_make(&u[i], fmt, 32, inter, hidden);
        t_mat_make(&d[i], fmt, 32, hidden, inter);
        x[i] = t_alloc((size_t)(n ? n : 1) * hidden);
        out[i] = t_alloc((size_t)(n ? n : 1) * hidden);
        want[i] = t_alloc((size_t)(n ? n : 1) * hidden);
        t_fill(x[i], (size_t)(n ? n : 1) * hidden, 2.0f);
        t_poison(out[i], (size_t)(n ? n : 1) * hidden);
        bias[i] = t_alloc((size_t)2 * inter + hidden); /* gate, up, down */
        t_fill(bias[i], (size_t)2 * inter + hidden, 1.0f);
        const int kind = (int)(t_rng_next(&g_seed) % 3); /* plain, biased, biased and clamped */
        opts[i] = (cpu_ffn_opts_t){.gate_bias = bias[i], .up_bias = bias[i] + inter, .down_bias = bias[i] + 2 * inter,
                                   .clamped = kind == 2, .limit = 0.7f, .alpha = 1.702f};
        it[i] = (cpu_ffn_item_t){.x = x[i], .out = out[i], .n = n, .gate = &g[i].q, .up = &u[i].q, .down = &d[i].q,
                                 .opts = kind ? &opts[i] : NULL};
        scratch_n += (size_t)2 * n * inter;
    }
    float *scratch = t_alloc(scratch_n + 1);
    for (int i = 0; i < NI; i++)
        if (it[i].n)
            cpu_ffn_swiglu(pool, want[i], x[i], it[i].n, it[i].gate, it[i].up, it[i].down, it[i].opts, scratch, NULL,
                           false);
    t_poison(scratch, scratch_n + 1);
    cpu_ffn_swiglu_many(pool, it, NI, scratch);
    int bad = 0;
    for (int i = 0; i < NI; i++)
        bad += it[i].n && memcmp(out[i], want[i], sizeof(float) * (size_t)it[i].n * hidden) != 0;
    T_CHECK(bad == 0, "ffn_many %s threads=%d: %d of %d items differ from cpu_ffn_swiglu", cpu_isa_name(isa),
            tpool_size(pool), bad, NI);
    if (isa == CPU_ISA_AVX512_VNNI && cpu_ops_act() == CPU_ACT_Q8) { /* and from avx512's, bit for bit */
        for (int i = 0; i < NI; i++) t_poison(want[i], (size_t)(it[i].n ? it[i].n : 1) * hidden);
        for (int i = 0; i < NI; i++) it[i].out = want[i];
        STRATA_ASSERT(cpu_ops_set_isa(CPU_ISA_AVX512) == CPU_ISA_AVX512);
        cpu_ffn_swiglu_many(pool, it, NI, scratch);
        cpu_ops_set_isa(isa);
        bad = 0;
        for (int i = 0; i < NI; i++)
            bad += it[i].n && memcmp(out[i], want[i], sizeof(float) * (size_t)it[i].n * hidden) != 0;
        T_CHECK(bad == 0, "ffn_many %s q8 threads=%d: %d of %d items differ from avx512's", cpu_isa_name(isa),
                tpool_size(pool), bad, NI);
    }
    for (int i = 0; i < NI; i++) {
        t_mat_free(&g[i]); t_mat_free(&u[i]); t_mat_free(&d[i]);
        free(x[i]); free(out[i]); free(want[i]); free(bias[i]);
    }
    free(scratch);
}

/* cpu_matmul_multi: each y bit for bit cpu_matmul's, formats and row counts mixed. */
static void test_matmul_multi(tpool_t *pool, cpu_isa_t isa)
{
    enum { NI = 4 };
    const int cols = 96, n = 1 + (int)(t_rng_next(&g_seed) % 6);
    t_mat_t m[NI];
    cpu_mm_item_t it[NI];
    float *want[NI], *b = t_alloc(200), *x = t_alloc((size_t)n * cols);
    t_fill(b, 200, 0.5f);
    t_fill(x, (size_t)n * cols, 1.0f);
    for (int i = 0; i < NI; i++) {
        const int rows = 1 + (int)(t_rng_next(&g_seed) % 150);
        t_mat_make(&m[i], (wfmt_t)((i + (int)(t_rng_next(&g_seed) % WF_COUNT)) % WF_COUNT), 32, rows, cols);
        it[i] = (cpu_mm_item_t){.y = t_alloc((size_t)n * rows), .w = &m[i].q, .bias = i & 1 ? b : NULL};
        want[i] = t_alloc((size_t)n * rows);
        cpu_matmul(pool, want[i], x, n, it[i].w, it[i].bias);
        t_poison(it[i].y, (size_t)n * rows);
    }
    cpu_matmul_multi(pool, x, n, it, NI);
    int bad = 0;
    for (int i = 0; i < NI; i++) bad += memcmp(it[i].y, want[i], sizeof(float) * (size_t)n * m[i].q.rows) != 0;
    T_CHECK(bad == 0, "matmul_multi %s threads=%d n=%d: %d of %d differ from cpu_matmul", cpu_isa_name(isa),
            tpool_size(pool), n, bad, NI);
    for (int i = 0; i < NI; i++) {
        free(it[i].y);
        free(want[i]);
        t_mat_free(&m[i]);
    }
    free(b);
    free(x);
}

/* ---- the other ops ---- */

static void test_rmsnorm(void)
{
    const int n = 3, dim = 1 + (int)(t_rng_next(&g_seed) % 700);
    const float eps = 1e-6f;
    float *x = t_alloc((size_t)n * dim), *w = t_alloc(dim), *y = t_alloc((size_t)n * dim), *want = t_alloc((size_t)n * dim);
    t_fill(x, (size_t)n * dim, 3.0f);
    t_fill(w, dim, 1.0f);
    for (int t = 0; t < n; t++) {
        double ss = 0;
        for (int i = 0; i < dim; i++) ss += (double)x[t * dim + i] * x[t * dim + i];
        double inv = 1 / sqrt(ss / dim + eps);
        for (int i = 0; i < dim; i++) want[t * dim + i] = (float)(x[t * dim + i] * inv * w[i]);
    }
    t_poison(y, (size_t)n * dim);
    cpu_rmsnorm(y, x, w, n, dim, eps);
    T_CHECK(t_relerr(y, want, (size_t)n * dim) < 1e-6, "rmsnorm dim %d: %g", dim, t_relerr(y, want, (size_t)n * dim));
    cpu_rmsnorm(x, x, w, n, dim, eps); /* in place */
    T_CHECK(t_relerr(x, want, (size_t)n * dim) < 1e-6, "rmsnorm in place");
    /* eps matters when x is tiny: all-zero input gives zeros, not NaN */
    for (int i = 0; i < dim; i++) x[i] = 0;
    cpu_rmsnorm(y, x, w, 1, dim, eps);
    bool zero = true;
    for (int i = 0; i < dim; i++) zero &= y[i] == 0;
    T_CHECK(zero, "rmsnorm of zeros");
    free(x); free(w); free(y); free(want);
}

static void test_rope(void)
{
    const int n = 3, heads = 3, hd = 64;
    const int rots[] = {64, 32, 16};
    for (int k = 0; k < 3; k++) {
        const int rot = rots[k];
        float inv[32], x[3 * 3 * 64], x0[3 * 3 * 64];
        int32_t pos[3] = {0, 1 + (int32_t)(t_rng_next(&g_seed) % 100), 4000 + (int32_t)(t_rng_next(&g_seed) % 30000)};
        for (int i = 0; i < rot / 2; i++) inv[i] = (float)pow(10000.0, -2.0 * i / rot);
        t_fill(x, sizeof(x) / 4, 1.0f);
        memcpy(x0, x, sizeof(x));
        const float af = k == 2 ? 1.25f : 1.0f;
        cpu_rope(x, n, heads, hd, rot, pos, inv, af);
        double num = 0, den = 0;
        bool untouched = true;
        for (int t = 0; t < n; t++)
            for (int h = 0; h < heads; h++) {
                const float *a = x0 + (t * heads + h) * hd, *b = x + (t * heads + h) * hd;
                for (int i = 0; i < rot / 2; i++) {
                    double ang = (double)((float)pos[t] * inv[i]); /* fp32 product, as HF */
                    double c = cos(ang) * af, s = sin(ang) * af;
                    double w1 = a[i] * c - a[i + rot / 2] * s, w2 = a[i + rot / 2] * c + a[i] * s;
                    num += (w1 - b[i]) * (w1 - b[i]) + (w2 - b[i + rot / 2]) * (w2 - b[i + rot / 2]);
                    den += w1 * w1 + w2 * w2;
                }
                for (int i = rot; i < hd; i++) untouched &= a[i] == b[i];
            }
        T_CHECK(sqrt(num / den) < 1e-5, "rope rot %d: rel err %g", rot, sqrt(num / den));
        T_CHECK(untouched, "rope rot %d: dims >= rot_dim changed", rot);
    }
    /* known value: position 0 is the identity (attn_factor 1) */
    float x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, inv[4] = {1, 0.5f, 0.25f, 0.125f};
    int32_t p0 = 0;
    cpu_rope(x, 1, 1, 8, 8, &p0, inv, 1.0f);
    T_CHECK(x[0] == 1 && x[3] == 4 && x[4] == 5 && x[7] == 8, "rope at pos 0");
    /* pos 1, inv_freq = pi/2: (x1, x2) -> (-x2, x1) */
    float y[2] = {1, 2}, inv2[1] = {(float)(M_PI / 2)};
    int32_t p1 = 1;
    cpu_rope(y, 1, 1, 2, 2, &p1, inv2, 1.0f);
    T_CHECK(fabsf(y[0] + 2) < 1e-6f && fabsf(y[1] - 1) < 1e-6f, "rope quarter turn: %g %g", y[0], y[1]);
}

/* One query over positions ctx_start..n_ctx-1 of a random paged cache, against a double
 * reference of the contract (transformers' eager attention with sinks: the sink joins the max
 * and the softmax sum as a column with no value). The blocks wholly before ctx_start hold NaN,
 * so reading one shows. */
static void test_attention(int ctx_start, int n_ctx, int n_heads, int n_kv, int hd, int bs, float scale, float sink_mag)
{
    const int n_blocks = (n_ctx + bs - 1) / bs + 3, first = ctx_start / bs; /* blocks < first: unread */
    const size_t bsz = (size_t)n_kv * bs * hd;
    float *kc = t_alloc((size_t)n_blocks * bsz), *vc = t_alloc((size_t)n_blocks * bsz);
    float *q = t_alloc((size_t)n_heads * hd), *out = t_alloc((size_t)n_heads * hd), *want = t_alloc((size_t)n_heads * hd);
    float *scr = t_alloc((size_t)n_ctx), *sinks = sink_mag > 0 ? t_alloc((size_t)n_heads) : NULL;
    int32_t *bt = malloc(sizeof(int32_t) * n_blocks);
    t_fill(kc, (size_t)n_blocks * bsz, 1.0f);
    t_fill(vc, (size_t)n_blocks * bsz, 1.0f);
    t_fill(q, (size_t)n_heads * hd, 1.0f);
    if (sinks) t_fill(sinks, (size_t)n_heads, sink_mag);
    for (int i = 0; i < n_blocks; i++) bt[i] = i;
    for (int i = n_blocks - 1; i > 0; i--) { /* a random block table */
        int k = (int)(t_rng_next(&g_seed) % (uint64_t)(i + 1));
        int32_t tmp = bt[i];
        bt[i] = bt[k];
        bt[k] = tmp;
    }
    for (int b = 0; b < first; b++) {
        t_poison(kc + (size_t)bt[b] * bsz, bsz);
        t_poison(vc + (size_t)bt[b] * bsz, bsz);
    }
    const int grp = n_heads / n_kv;
    double *sc = malloc(sizeof(double) * n_ctx);
    for (int h = 0; h < n_heads; h++) {
        int kvh = h / grp;
        double mx = sinks ? sinks[h] : -INFINITY;
        for (int p = ctx_start; p < n_ctx; p++) {
            const float *k = kc + (((int64_t)bt[p / bs] * n_kv + kvh) * bs + p % bs) * hd;
            double d = 0;
            for (int i = 0; i < hd; i++) d += (double)q[h * hd + i] * k[i];
            sc[p] = d * scale;
            mx = fmax(mx, sc[p]);
        }
        double z = sinks ? exp(sinks[h] - mx) : 0;
        for (int p = ctx_start; p < n_ctx; p++) z += (sc[p] = exp(sc[p] - mx));
        for (int i = 0; i < hd; i++) {
            double a = 0;
            for (int p = ctx_start; p < n_ctx; p++)
                a += sc[p] / z * vc[(((int64_t)bt[p / bs] * n_kv + kvh) * bs + p % bs) * hd + i];
            want[h * hd + i] = (float)a;
        }
    }
    t_poison(out, (size_t)n_heads * hd);
    t_poison(scr, (size_t)n_ctx);
    cpu_attention(out, q, kc, vc, bt, ctx_start, n_ctx, n_heads, n_kv, hd, bs, scale, sinks, scr);
    double e = t_relerr(out, want, (size_t)n_heads * hd);
    T_CHECK(t_all_finite(out, (size_t)n_heads * hd) && e < 1e-5,
            "attention %s ctx %d..%d heads %d/%d hd %d bs %d scale %g sinks %g: %g", cpu_isa_name(cpu_ops_init()),
            ctx_start, n_ctx, n_heads, n_kv, hd, bs, scale, sink_mag, e);
    free(kc); free(vc); free(q); free(out); free(want); free(scr); free(sinks); free(bt); free(sc);
}

static void test_gate(void)
{
    for (int it = 0; it < 200; it++) {
        const int ne = 1 + (int)(t_rng_next(&g_seed) % 128), k = 1 + (int)(t_rng_next(&g_seed) % (ne < 8 ? ne : 8));
        float lg[128];
        t_fill(lg, ne, 8.0f);
        for (int e = 0; e < ne; e++) lg[e] = roundf(lg[e] * 64) / 64; /* distinct values differ clearly */
        if (it % 3 == 0) /* ties: repeat some values */
            for (int e = 1; e < ne; e += 2) lg[e] = lg[e - 1 - (e > 2 ? 2 : 0)];
        double mx = -INFINITY, z = 0, p[128];
        for (int e = 0; e < ne; e++) mx = fmax(mx, lg[e]);
        for (int e = 0; e < ne; e++) z += (p[e] = exp((double)lg[e] - mx));
        for (int e = 0; e < ne; e++) p[e] /= z;
        /* expected: a stable selection by descending probability */
        int order[128];
        bool taken[128] = {0};
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int e = 0; e < ne; e++)
                if (!taken[e] && (best < 0 || lg[e] > lg[best])) best = e;
            taken[best] = true;
            order[j] = best;
        }
        for (int rn = 0; rn < 2; rn++) {
            int32_t idx[8];
            float w[8];
            for (int j = 0; j < 8; j++) { idx[j] = -1; w[j] = NAN; }
            cpu_gate_topk(lg, ne, k, rn, idx, w);
            double ws = 0;
            for (int j = 0; j < k; j++) ws += p[order[j]];
            bool ok = true;
            for (int j = 0; j < k; j++) {
                ok &= idx[j] == order[j];
                double want = rn ? p[order[j]] / ws : p[order[j]];
                ok &= fabs(w[j] - want) <= 1e-6 * fmax(1e-3, want) + 1e-9;
            }
            T_CHECK(ok, "gate ne %d k %d renorm %d: idx[0] %d want %d", ne, k, rn, idx[0], order[0]);
        }
    }
    float tie[4] = {1, 3, 3, 3};
    int32_t idx[2];
    float w[2];
    cpu_gate_topk(tie, 4, 2, true, idx, w);
    T_CHECK(idx[0] == 1 && idx[1] == 2 && fabsf(w[0] - 0.5f) < 1e-6f && fabsf(w[1] - 0.5f) < 1e-6f, "gate ties to lower index");
}

/* An oracle for cpu_sample written the obvious way: full sort, no shortcuts (the contract in
 * ops.h: kept set in probability order, draw in id order). */
typedef struct {
    double p;
    int id;
} t_pc_t;

static int t_pc_cmp(const void *a, const void *b)
{
    const t_pc_t *x = a, *y = b;
    if (x->p != y->p) return x->p > y->p ? -1 : 1;
    return x->id - y->id;
}

static int t_sample_oracle(const float *logits, int vocab, float temp, int top_k, float top_p, double u)
{
    t_pc_t *c = malloc(sizeof(*c) * vocab);
    for (int i = 0; i < vocab; i++) c[i] = (t_pc_t){logits[i] / temp, i}; /* fp32 division, as cpu_sample */
    qsort(c, vocab, sizeof(*c), t_pc_cmp); /* by scaled logit */
    int n = top_k > 0 && top_k < vocab ? top_k : vocab;
    double mx = c[0].p, z = 0;
    for (int i = 0; i < n; i++) z += exp(c[i].p - mx);
    for (int i = 0; i < n; i++) c[i].p = exp(c[i].p - mx) / z;
    int keep = n;
    if (top_p < 1) {
        double cum = 0;
        for (int i = 0; i < n; i++)
            if ((cum += c[i].p) >= top_p) { keep = i + 1; break; }
    }
    /* the draw walks the kept tokens in id order */
    double *pid = calloc(vocab, sizeof *pid), mass = 0;
    for (int i = 0; i < keep; i++) {
        pid[c[i].id] = c[i].p;
        mass += c[i].p;
    }
    double r = u * mass, cum = 0;
    int pick = -1;
    for (int i = 0; i < vocab; i++)
        if (pid[i] > 0) {
            pick = i;
            if (r < (cum += pid[i])) break;
        }
    free(pid);
    free(c);
    return pick;
}

static void test_sample(void)
{
    /* greedy, ties to the lower id */
    float g[6] = {0.5f, 2, -1, 2, 1, 2};
    T_CHECK(cpu_sample(g, 6, 0, 0, 1, 0.9) == 1, "greedy tie");
    T_CHECK(cpu_sample(g, 6, 1.0f, 1, 1, 0.9) == 1, "top_k 1 is greedy");
    /* known distribution: probs 0.5 0.3 0.15 0.05 */
    const double pr[4] = {0.5, 0.3, 0.15, 0.05};
    float lg[4];
    for (int i = 0; i < 4; i++) lg[i] = (float)log(pr[i]);
    float tmp[4];
#define SAMPLE(T, K, P, U) (memcpy(tmp, lg, sizeof(lg)), cpu_sample(tmp, 4, T, K, P, U))
    T_CHECK(SAMPLE(1, 0, 1, 0.49) == 0 && SAMPLE(1, 0, 1, 0.51) == 1 && SAMPLE(1, 0, 1, 0.81) == 2 && SAMPLE(1, 0, 1, 0.96) == 3, "plain draw");
    /* top_p 0.75 keeps {0, 1} (cumulative 0.8): u * 0.8 against 0.5 */
    T_CHECK(SAMPLE(1, 0, 0.75f, 0.6) == 0 && SAMPLE(1, 0, 0.75f, 0.7) == 1 && SAMPLE(1, 0, 0.75f, 0.999) == 1, "top_p");
    T_CHECK(SAMPLE(1, 0, 0.1f, 0.999) == 0, "top_p keeps at least one");
    /* top_k 3 renormalizes over 0.95: u * 0.95 against 0.5, 0.8 */
    T_CHECK(SAMPLE(1, 3, 1, 0.52) == 0 && SAMPLE(1, 3, 1, 0.53) == 1 && SAMPLE(1, 3, 1, 0.99) == 2, "top_k");
    /* temperature: T=2 flattens to sqrt(p), normalized .379 .294 .208 .120 */
    T_CHECK(SAMPLE(2, 0, 1, 0.37) == 0 && SAMPLE(2, 0, 1, 0.39) == 1 && SAMPLE(2, 0, 1, 0.67) == 1 && SAMPLE(2, 0, 1, 0.68) == 2, "temperature");
#undef SAMPLE
    /* against the oracle on random logits and parameters */
    const int vocab = 3000;
    float *l = t_alloc(vocab), *w = t_alloc(vocab);
    int bad = 0;
    for (int it = 0; it < 300; it++) {
        t_fill(l, vocab, (float)(1 + it % 7) * 2);
        if (it % 5 == 0) l[t_rng_next(&g_seed) % vocab] = 40; /* a peaked distribution */
        if (it % 4 == 0)                                        /* exact ties */
            for (int i = 0; i < vocab; i += 3) l[i] = l[0];
        float temp = 0.3f + (float)(t_rng_next(&g_seed) % 100) / 50;
        int top_k = (int)(t_rng_next(&g_seed) % 4) == 0 ? 0 : 1 + (int)(t_rng_next(&g_seed) % 60);
        float top_p = (t_rng_next(&g_seed) % 3) == 0 ? 1.0f : 0.05f + (float)(t_rng_next(&g_seed) % 95) / 100;
        double u = (t_rng_next(&g_seed) >> 11) * 0x1p-53;
        int want = t_sample_oracle(l, vocab, temp, top_k, top_p, u);
        memcpy(w, l, sizeof(float) * vocab);
        int got = cpu_sample(w, vocab, temp, top_k, top_p, u);
        if (got != want) {
            if (bad < 3) fprintf(stderr, "  sample: T %g k %d p %g u %g: got %d want %d\n", temp, top_k, top_p, u, got, want);
            bad++;
        }
    }
    T_CHECK(bad == 0, "%d samples differ from the oracle", bad);
    /* frequencies follow the distribution */
    int cnt[4] = {0};
    const int N = 20000;
    for (int i = 0; i < N; i++) {
        memcpy(tmp, lg, sizeof(lg));
        cnt[cpu_sample(tmp, 4, 1, 0, 1, (t_rng_next(&g_seed) >> 11) * 0x1p-53)]++;
    }
    bool ok = true;
    for (int i = 0; i < 4; i++) ok &= fabs(cnt[i] / (double)N - pr[i]) < 5 * sqrt(pr[i] * (1 - pr[i]) / N);
    T_CHECK(ok, "sample frequencies %d %d %d %d", cnt[0], cnt[1], cnt[2], cnt[3]);
    free(l);
    free(w);
}

#define T_SKIP 77 /* meson's exit code for a test that cannot run here */

/* usage: test_cpu_ops [--isa ref|avx2|avx512|avx512vnni]: the ISA-specific cases for that ISA
 * alone (exit 77, a skip, when this CPU lacks it), or for every ISA the CPU has when none is
 * named. */
int main(int argc, char **argv)
{
    const cpu_isa_t isas[CPU_ISA_COUNT] = {CPU_ISA_REF, CPU_ISA_AVX2, CPU_ISA_AVX512, CPU_ISA_AVX512_VNNI};
    int only = -1;
    if (argc == 3 && strcmp(argv[1], "--isa") == 0) {
        for (int i = 0; i < CPU_ISA_COUNT; i++)
            if (strcmp(argv[2], cpu_isa_name(isas[i])) == 0) only = i;
    }
    if (argc != 1 && only < 0) {
        fprintf(stderr, "usage: %s [--isa ref|avx2|avx512|avx512vnni]\n", argv[0]);
        return 2;
    }
    g_seed = t_seed();
    cpu_isa_t best = cpu_ops_init();
    fprintf(stderr, "best isa on this cpu: %s\n", cpu_isa_name(best));
    if (only >= 0 && cpu_ops_set_isa(isas[only]) != isas[only]) {
        fprintf(stderr, "isa %s: not supported by this cpu: skipped\n", cpu_isa_name(isas[only]));
        return T_SKIP;
    }
    test_pool();
    tpool_t *pools[2] = {tpool_create(1), tpool_create(3)};
    T_CHECK(pools[0] && pools[1], "pools");
    for (int i = 0; i < CPU_ISA_COUNT; i++) {
        if (only >= 0 && i != only) continue;
        cpu_isa_t got = cpu_ops_set_isa(isas[i]);
        if (got != isas[i]) {
            fprintf(stderr, "isa %s: not supported by this cpu, not run\n", cpu_isa_name(isas[i]));
            continue;
        }
        fprintf(stderr, "isa %s: running\n", cpu_isa_name(got));
        for (int pi = 0; pi < 2; pi++) test_matmul_isa(pools[pi], got);
        for (int f = 0; f < WF_COUNT; f++) {
            const wfmt_t fm = (wfmt_t)f, other = (wfmt_t)((f + 1 + (int)(t_rng_next(&g_seed) % (WF_COUNT - 1))) % WF_COUNT);
            test_ffn(pools[1], got, fm, fm, 1, false, false, 0);
            test_ffn(pools[1], got, fm, fm, 3, true, true, 0);
            test_ffn(pools[0], got, fm, fm, 9, true, false, 0);
            test_ffn(pools[0], got, fm, fm, 2, false, true, 0);
            test_ffn(pools[1], got, fm, fm, 1, false, false, 1);
            test_ffn(pools[1], got, fm, other, 5, true, true, 1);
            test_ffn(pools[1], got, fm, fm, 1, false, false, 2);
            test_ffn(pools[0], got, fm, fm, 3, true, true, 2);
            test_ffn(pools[1], got, other, fm, 7, true, false, 2);
            test_ffn(pools[0], got, fm, other, 2, false, true, 2);
        }
        for (int pi = 0; pi < 2; pi++) {
            test_ffn_many(pools[pi], got);
            test_matmul_multi(pools[pi], got);
            cpu_ops_set_act(CPU_ACT_Q8);
            test_ffn_many(pools[pi], got);
            test_matmul_multi(pools[pi], got);
            cpu_ops_set_act(CPU_ACT_F32);
        }
        test_attention(0, 1, 4, 4, 64, 16, 0.125f, 0);
        test_attention(0, 37, 8, 2, 64, 16, 0.125f, 0);
        test_attention(0, 100, 6, 1, 32, 8, 0.17f, 0);
        test_attention(0, 33, 4, 2, 128, 32, 0.088f, 0);
        test_attention(0, 50, 4, 4, 16, 4, 30.0f, 0); /* huge logits: needs the max subtraction */
        test_attention(0, 45, 6, 3, 76, 16, 0.1f, 0); /* head_dim not a multiple of the vector */
        /* sliding windows: a start in the middle of a block, at a block boundary, the last
         * position alone; and sinks (gpt-oss), small, dominating, with and without a window */
        test_attention(21, 70, 8, 2, 64, 16, 0.125f, 0);
        test_attention(32, 70, 8, 2, 64, 16, 0.125f, 0);
        test_attention(47, 48, 4, 1, 32, 16, 0.17f, 0);
        test_attention(0, 1, 4, 4, 64, 16, 0.125f, 2.0f);
        test_attention(0, 37, 8, 2, 64, 16, 0.125f, 2.0f);
        test_attention(13, 77, 6, 3, 76, 8, 0.1f, 3.0f);
        test_attention(64, 130, 8, 1, 64, 16, 0.125f, 1.0f);
        test_attention(99, 100, 4, 2, 32, 16, 0.17f, 1.0f);
        test_attention(5, 60, 4, 4, 16, 4, 0.05f, 40.0f); /* sinks far above the scores */
        test_attention(0, 50, 4, 4, 16, 4, 30.0f, 0.5f);  /* scores far above the sinks */
        for (int k = 0; k < 20; k++) {
            const int bs = 4 << (int)(t_rng_next(&g_seed) % 3), n_ctx = 1 + (int)(t_rng_next(&g_seed) % 150);
            const int start = (int)(t_rng_next(&g_seed) % (uint64_t)n_ctx), kv = 1 + (int)(t_rng_next(&g_seed) % 3);
            const int heads = kv * (1 + (int)(t_rng_next(&g_seed) % 3)), hd = 8 + 8 * (int)(t_rng_next(&g_seed) % 12);
            test_attention(start, n_ctx, heads, kv, hd, bs, 0.125f, k & 1 ? 4.0f : 0);
        }
        fprintf(stderr, "isa %s: worst matmul rel err:", cpu_isa_name(got));
        for (int f = 0; f < WF_COUNT; f++) fprintf(stderr, " %s %.2g", wfmt_name((wfmt_t)f), g_worst[got][f]);
        fprintf(stderr, "; with q8 activations: int4 %.2g mxfp4 %.2g\n", g_worst_q8[got][WF_INT4],
                g_worst_q8[got][WF_MXFP4]);
    }
    cpu_ops_set_isa(best);
    test_rmsnorm();
    test_rope();
    test_gate();
    test_sample();
    tpool_destroy(pools[0]);
    tpool_destroy(pools[1]);
    return t_done("test_cpu_ops");
}
