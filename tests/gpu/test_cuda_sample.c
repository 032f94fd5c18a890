/* test_cuda_sample.c - cuda_sample (kernels/cuda/cuda_sample.h) against cpu_sample on fresh
 * random rows: vocabularies 1 to 151936; plain random rows, rows of a few tied values (+0 and
 * -0 among them) and rows with one dominant logit; every combination of a grid of temperature,
 * top_k, top_p and u, then rows of random parameters. The ids are poisoned (-7) before each
 * call, so an unwritten one shows.
 *
 * Every case must give cpu_sample's id, except where the CPU's decision lies within rounding
 * distance of a boundary (the top-p cut, or r in the draw; s_mirror decides, in double): the
 * GPU's expf may differ from libm's by an ulp or two, and it sums masses in 2^-40 fixed point.
 * A case there that differs is counted as skipped (one that agrees passes), and more than 1%
 * of all cases skipped fails. cpu_sample finds the top k by insertion, O(vocab * k): where that
 * would take seconds (k above 3000), the case is compared with s_mirror, this file's sort-based
 * restatement of cpu_sample, which is itself checked against cpu_sample wherever both run.
 * Ends with the time of one call on 16 rows of 151936 (informational).
 * Needs a GPU; part of the GPU suite (tests/gpu/run), never of the CPU CI run. */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/strata.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/cuda_sample.h"
#include "tests/unit/check.h"

static uint64_t rng;
static cuda_ctx_t *ctx;
static long n_cases, n_near, n_skipped, n_vs_cpu;

typedef struct {
    float v;
    int32_t id;
} cand_t;

/* cpu_sample's candidate order: higher logit first, ties to the lower id */
static int s_cand_cmp(const void *a, const void *b)
{
    const cand_t *x = a, *y = b;
    if (x->v != y->v) return x->v > y->v ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* One row at one temperature, prepared for s_mirror. */
typedef struct {
    int vocab;
    const float *raw; /* [vocab] the logits as given */
    float *l;         /* [vocab] raw / temperature, as cpu_sample scales them */
    double *p;        /* [vocab] expf(l - max l) by id, as cpu_sample computes them */
    cand_t *c;        /* [vocab] the tokens in candidate order */
    bool *kept;       /* [vocab] scratch */
} srow_t;

static void s_prepare(srow_t *r, const float *raw, int vocab, float temperature)
{
    r->vocab = vocab;
    r->raw = raw;
    if (temperature <= 0) return; /* greedy: s_mirror reads raw only */
    float mx = -INFINITY;
    for (int i = 0; i < vocab; i++) {
        r->l[i] = raw[i] / temperature;
        mx = r->l[i] > mx ? r->l[i] : mx;
    }
    for (int i = 0; i < vocab; i++) {
        r->p[i] = expf(r->l[i] - mx);
        r->c[i] = (cand_t){r->l[i], i};
    }
    qsort(r->c, (size_t)vocab, sizeof *r->c, s_cand_cmp);
}

/* How far the GPU's value of a token's p may be from the CPU's: the two expf differ by up to
 * ~2.5 ulps (3e-7 relative), and the GPU rounds p up to a multiple of 2^-40. p == 1 (the row's
 * best, expf(0)) is exact on both. A sum over a set of tokens may be off by the sum of these:
 * a boundary closer than that to the CPU's value is a rounding case. */
static double s_err(double p) { return p == 1.0 ? 0.0 : 3e-7 * p + 0x1p-40; }

/* cpu_sample's decision, restated over the candidate order in double: the id, and *near when
 * it lies within rounding distance (s_err) of a boundary: the top-p cut, or r at the draw. */
static int32_t s_mirror(const srow_t *r, float temperature, int top_k, float top_p, double u, bool *near)
{
    const int V = r->vocab;
    *near = false;
    if (temperature <= 0 || top_k == 1) {
        int32_t best = 0;
        for (int i = 1; i < V; i++)
            if (r->raw[i] > r->raw[best]) best = i;
        return best;
    }
    const int K = top_k > 0 && top_k < V ? top_k : V;
    double z = 0, w = 0;
    for (int j = 0; j < K; j++) {
        z += r->p[r->c[j].id];
        w += s_err(r->p[r->c[j].id]);
    }
    int keep = K;
    if (top_p < 1) {
        const double target = top_p * z;
        double cum = 0, prev = 0;
        int j = 0;
        for (; j < K; j++) {
            prev = cum;
            cum += r->p[r->c[j].id];
            if (cum >= target) break;
        }
        if (j == K) {
            *near = true; /* unreached: only by rounding */
        } else {
            keep = j + 1;
            w *= 1 + top_p; /* the target's error and the running sum's */
            if (cum - target < w || (j > 0 && target - prev < w)) *near = true;
        }
    }
    for (int i = 0; i < V; i++) r->kept[i] = false;
    for (int j = 0; j < keep; j++) r->kept[r->c[j].id] = true;
    double mass = 0;
    w = 0;
    for (int i = 0; i < V; i++)
        if (r->kept[i]) mass += r->p[i], w += s_err(r->p[i]);
    const double x = u * mass;
    double cum = 0, prev = 0;
    int32_t pick = -1, last = -1;
    for (int i = 0; i < V && pick < 0; i++) {
        if (!r->kept[i]) continue;
        last = i;
        prev = cum;
        cum += r->p[i];
        if (x < cum) pick = i;
    }
    if (pick < 0) {
        *near = true; /* unreached: only by rounding */
        return last;
    }
    /* at u = 0 both sides take the first kept token of positive p, exactly */
    w *= 1 + u; /* r's error and the running sum's */
    if (u > 0 && (cum - x < w || x - prev < w)) *near = true;
    return pick;
}

/* cpu_sample's insertion top-k costs about k * k steps: skip it beyond ~1e7 */
static bool s_cpu_cheap(int vocab, int top_k) { return top_k <= 0 || top_k >= vocab || (double)top_k * top_k <= 1e7; }

enum { ROW_RANDOM, ROW_TIES, ROW_DOMINANT, ROW_KINDS };
static const char *const row_name[ROW_KINDS] = {"random", "ties", "dominant"};

static void s_make_row(float *row, int V, int kind)
{
    static const float levels[4] = {1.5f, 0.f, -0.f, -1.f};
    for (int i = 0; i < V; i++) {
        if (kind == ROW_TIES)
            row[i] = levels[t_rng_next(&rng) % 4];
        else
            row[i] = t_randf(&rng) * (kind == ROW_RANDOM ? 8.f : 2.f);
    }
    if (kind == ROW_DOMINANT) row[t_rng_next(&rng) % (uint64_t)V] = 12.f;
}

static double s_randu(void) { return (double)(t_rng_next(&rng) >> 11) * 0x1p-53; }

/* Device buffers for up to max_rows rows of one vocabulary. */
typedef struct {
    int max_rows, vocab;
    float *dl;
    cuda_sample_param_t *dp;
    int32_t *di;
    float *hl;   /* [max_rows][vocab] host copy of the rows sent */
    int32_t *hi; /* [max_rows] ids back (poison going in) */
} bufs_t;

static void s_bufs(bufs_t *b, int max_rows, int V)
{
    b->max_rows = max_rows, b->vocab = V;
    b->hl = malloc((size_t)max_rows * V * sizeof(float));
    b->hi = malloc((size_t)max_rows * sizeof(int32_t));
    if (!b->hl || !b->hi || cuda_malloc((void **)&b->dl, (size_t)max_rows * V * sizeof(float)) ||
        cuda_malloc((void **)&b->dp, (size_t)max_rows * sizeof(cuda_sample_param_t)) ||
        cuda_malloc((void **)&b->di, (size_t)max_rows * sizeof(int32_t))) {
        fprintf(stderr, "allocation failed\n");
        exit(1);
    }
}

static void s_bufs_free(bufs_t *b)
{
    free(b->hl), free(b->hi);
    cuda_free(b->dl), cuda_free(b->dp), cuda_free(b->di);
}

/* Run cuda_sample on rows b->hl[0..n) with params hp, ids into b->hi. */
static void s_run(bufs_t *b, int n, const cuda_sample_param_t *hp)
{
    const int V = b->vocab;
    for (int r = 0; r < n; r++) b->hi[r] = -7;
    int rc = cuda_h2d(ctx, b->dl, b->hl, (size_t)n * V * sizeof(float));
    rc = rc ? rc : cuda_h2d(ctx, b->dp, hp, (size_t)n * sizeof *hp);
    rc = rc ? rc : cuda_h2d(ctx, b->di, b->hi, (size_t)n * sizeof(int32_t));
    rc = rc ? rc : cuda_sample(ctx, b->dl, n, V, b->dp, b->di);
    rc = rc ? rc : cuda_d2h(ctx, b->hi, b->di, (size_t)n * sizeof(int32_t));
    T_CHECK(rc == 0, "cuda_sample V=%d n=%d: %s", V, n, strata_strerror(rc));
}

/* Check the GPU's id for one case against cpu_sample (where cheap) and s_mirror. */
static void s_check(const srow_t *r, const cuda_sample_param_t *p, int32_t got, float *tmp, const char *what)
{
    const int V = r->vocab;
    bool near;
    const int32_t want = s_mirror(r, p->temperature, p->top_k, p->top_p, p->u, &near);
    int32_t want_cpu = want;
    if (s_cpu_cheap(V, p->top_k)) {
        memcpy(tmp, r->raw, (size_t)V * sizeof(float));
        want_cpu = cpu_sample(tmp, V, p->temperature, p->top_k, p->top_p, p->u);
        n_vs_cpu++;
        if (!near)
            T_CHECK(want == want_cpu, "%s V=%d T=%g k=%d p=%g u=%.9g: the test's mirror %d, cpu_sample %d", what, V,
                    p->temperature, p->top_k, p->top_p, p->u, want, want_cpu);
    }
    n_cases++;
    n_near += near;
    T_CHECK(got >= 0 && got < V, "%s V=%d T=%g k=%d p=%g u=%.9g: id %d out of range", what, V, p->temperature,
            p->top_k, p->top_p, p->u, got);
    if (got != want_cpu && near) {
        n_skipped++;
        return;
    }
    T_CHECK(got == want_cpu, "%s V=%d T=%g k=%d p=%g u=%.9g: GPU %d, CPU %d", what, V, p->temperature, p->top_k,
            p->top_p, p->u, got, want_cpu);
}

static void s_srow_alloc(srow_t *r, int V)
{
    r->l = malloc((size_t)V * sizeof *r->l);
    r->p = malloc((size_t)V * sizeof *r->p);
    r->c = malloc((size_t)V * sizeof *r->c);
    r->kept = malloc((size_t)V * sizeof *r->kept);
    if (!r->l || !r->p || !r->c || !r->kept) exit(1);
}

static void s_srow_free(srow_t *r) { free(r->l), free(r->p), free(r->c), free(r->kept); }

#define N_T 4
#define N_K 7
#define N_P 4
#define N_U 5
#define GRID_ROWS (N_K * N_P * N_U)
#define RANDOM_ROWS 48

/* Every grid combination on one row of each kind, then rows of random parameters. */
static void test_vocab(int V)
{
    static const float temps[N_T] = {0.f, 0.3f, 1.f, 1.7f};
    static const float top_ps[N_P] = {1.f, 0.95f, 0.5f, 1e-4f};
    const int top_ks[N_K] = {0, 1, 2, 40, V - 1, V, V + 5};
    bufs_t b;
    s_bufs(&b, GRID_ROWS, V);
    srow_t r;
    s_srow_alloc(&r, V);
    float *row = malloc((size_t)V * sizeof(float)), *tmp = malloc((size_t)V * sizeof(float));
    cuda_sample_param_t hp[GRID_ROWS];
    for (int kind = 0; kind < ROW_KINDS; kind++) {
        s_make_row(row, V, kind);
        for (int ti = 0; ti < N_T; ti++) {
            int n = 0;
            for (int ki = 0; ki < N_K; ki++)
                for (int pi = 0; pi < N_P; pi++)
                    for (int ui = 0; ui < N_U; ui++) {
                        const double u = ui == 0 ? 0.0 : ui == 1 ? 0.999999 : s_randu();
                        hp[n] = (cuda_sample_param_t){
                            .temperature = temps[ti], .top_k = top_ks[ki], .top_p = top_ps[pi], .u = u};
                        memcpy(b.hl + (size_t)n * V, row, (size_t)V * sizeof(float));
                        n++;
                    }
            s_run(&b, n, hp);
            s_prepare(&r, row, V, temps[ti]);
            for (int i = 0; i < n; i++) s_check(&r, &hp[i], b.hi[i], tmp, row_name[kind]);
        }
    }
    /* random parameters, a fresh row each */
    float *rows = malloc((size_t)RANDOM_ROWS * V * sizeof(float));
    for (int i = 0; i < RANDOM_ROWS; i++) {
        s_make_row(rows + (size_t)i * V, V, (int)(t_rng_next(&rng) % ROW_KINDS));
        const uint64_t x = t_rng_next(&rng);
        hp[i] = (cuda_sample_param_t){
            .temperature = x % 8 == 0 ? 0.f : 0.05f + 1.95f * (float)s_randu(),
            .top_k = x / 8 % 3 == 0 ? 0 : (int)(t_rng_next(&rng) % (uint64_t)(V + 2)),
            .top_p = x / 24 % 2 == 0 ? 1.f : (float)s_randu(),
            .u = s_randu(),
        };
    }
    memcpy(b.hl, rows, (size_t)RANDOM_ROWS * V * sizeof(float));
    s_run(&b, RANDOM_ROWS, hp);
    for (int i = 0; i < RANDOM_ROWS; i++) {
        s_prepare(&r, rows + (size_t)i * V, V, hp[i].temperature);
        s_check(&r, &hp[i], b.hi[i], tmp, "random params");
    }
    free(rows), free(row), free(tmp);
    s_srow_free(&r);
    s_bufs_free(&b);
}

static double s_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* 16 rows of 151936, back-to-back calls between two syncs (temperature 1 leaves the logits as
 * they are, so every call sees the same rows). Informational. */
static void bench(void)
{
    enum { N = 16, V = 151936, REPS = 50 };
    static const struct {
        const char *name;
        int top_k;
        float top_p;
    } cfg[] = {{"temperature only", 0, 1.f}, {"top_k 40", 40, 1.f}, {"top_k 40 top_p 0.95", 40, 0.95f},
               {"top_p 0.95", 0, 0.95f}, {"top_k 1000 top_p 0.9", 1000, 0.9f}};
    bufs_t b;
    s_bufs(&b, N, V);
    for (int i = 0; i < N; i++) s_make_row(b.hl + (size_t)i * V, V, ROW_RANDOM);
    cuda_sample_param_t hp[N];
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        for (int i = 0; i < N; i++) hp[i] = (cuda_sample_param_t){1.f, cfg[c].top_k, cfg[c].top_p, 0.f, s_randu()};
        s_run(&b, N, hp);
        int rc = 0;
        for (int k = 0; k < 3 && !rc; k++) rc = cuda_sample(ctx, b.dl, N, V, b.dp, b.di);
        rc = rc ? rc : cuda_sync(ctx);
        const double t0 = s_now();
        for (int k = 0; k < REPS && !rc; k++) rc = cuda_sample(ctx, b.dl, N, V, b.dp, b.di);
        rc = rc ? rc : cuda_sync(ctx);
        const double t = (s_now() - t0) / REPS;
        T_CHECK(rc == 0, "bench %s: %s", cfg[c].name, strata_strerror(rc));
        fprintf(stderr, "time: cuda_sample %d x %d, %s: %.1f us a call\n", N, V, cfg[c].name, t * 1e6);
    }
    s_bufs_free(&b);
}

int main(void)
{
    rng = t_seed();
    if (cuda_device_count() < 1) {
        fprintf(stderr, "test_cuda_sample: no CUDA device (this is a GPU test)\n");
        return 1;
    }
    if (cuda_ctx_create(&ctx, 0)) return 1;
    static const int Vs[] = {1, 7, 1000, 32000, 151936};
    for (size_t i = 0; i < sizeof Vs / sizeof Vs[0]; i++) test_vocab(Vs[i]);
    fprintf(stderr,
            "cases: %ld, %ld of them against cpu_sample itself; %ld within rounding distance of a boundary, %ld of "
            "which differ (boundary, skipped)\n",
            n_cases, n_vs_cpu, n_near, n_skipped);
    T_CHECK(n_skipped * 100 <= n_cases, "%ld of %ld cases differ at a boundary: more than 1%%", n_skipped, n_cases);
    /* the vocabulary limit is input validation, not an assertion */
    T_CHECK(cuda_sample(ctx, NULL, 1, CUDA_SAMPLE_MAX_VOCAB + 1, NULL, NULL) == STRATA_EINVAL_INPUT, "vocab limit");
    T_CHECK(cuda_sample(ctx, NULL, 1, 0, NULL, NULL) == STRATA_EINVAL_INPUT, "vocab 0");
    bench();
    cuda_ctx_destroy(ctx);
    return t_done("test_cuda_sample");
}
