/* ops.c - ISA selection and the threaded drivers of the matmul-like ops (cpu_matmul,
 * cpu_ffn_swiglu). The per-ISA row kernels live in ops_ref.c / ops_avx2.c / ops_avx512.c /
 * ops_avx512_vnni.c. */
#include <cpuid.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common/strata.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/ops_impl.h"

static _Atomic int s_isa = -1; /* cpu_isa_t in effect; -1 until cpu_ops_init */

/* F16C from CPUID leaf 1, ECX bit 29 (not every compiler's __builtin_cpu_supports knows it). */
static bool s_has_f16c(void)
{
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}

static bool s_supported(cpu_isa_t isa)
{
    __builtin_cpu_init();
    switch (isa) {
    case CPU_ISA_REF: return true;
#ifdef STRATA_CPU_AVX2
    case CPU_ISA_AVX2:
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
               s_has_f16c();
#endif
#ifdef STRATA_CPU_AVX512
    case CPU_ISA_AVX512:
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma") &&
               s_has_f16c();
#endif
#if defined(STRATA_CPU_AVX512) && defined(STRATA_CPU_AVX512_VNNI)
    case CPU_ISA_AVX512_VNNI: return s_supported(CPU_ISA_AVX512) && __builtin_cpu_supports("avx512vnni");
#endif
    default: return false;
    }
}

const char *cpu_isa_name(cpu_isa_t isa)
{
    switch (isa) {
    case CPU_ISA_REF: return "ref";
    case CPU_ISA_AVX2: return "avx2";
    case CPU_ISA_AVX512: return "avx512";
    case CPU_ISA_AVX512_VNNI: return "avx512vnni";
    default: return "?";
    }
}

cpu_isa_t cpu_ops_set_isa(cpu_isa_t isa)
{
    while ((int)isa > CPU_ISA_REF && !s_supported(isa)) isa = (cpu_isa_t)(isa - 1);
    atomic_store(&s_isa, (int)isa);
    return isa;
}

static _Atomic int s_act = -1; /* cpu_act_t; -1 until first asked (then STRATA_CPU_ACT) */

int cpu_act_parse(const char *s)
{
    return !s ? -1 : !strcmp(s, "f32") ? CPU_ACT_F32 : !strcmp(s, "q8") ? CPU_ACT_Q8 : -1;
}

void cpu_ops_set_act(cpu_act_t act)
{
    atomic_store(&s_act, (int)act);
}

cpu_act_t cpu_ops_act(void)
{
    int a = atomic_load(&s_act);
    if (a < 0) {
        const char *e = getenv("STRATA_CPU_ACT");
        a = e && *e ? cpu_act_parse(e) : CPU_ACT_F32;
        if (a < 0) {
            log_warn("STRATA_CPU_ACT=%s is not f32|q8; using f32", e);
            a = CPU_ACT_F32;
        }
        int want = -1; /* a racing cpu_ops_set_act wins */
        if (!atomic_compare_exchange_strong(&s_act, &want, a)) a = want;
    }
    return (cpu_act_t)a;
}

static pthread_once_t s_once = PTHREAD_ONCE_INIT;

static void s_init_once(void)
{
    cpu_isa_t want = CPU_ISA_AVX512_VNNI; /* the best; cpu_ops_set_isa falls back */
    const char *e = getenv("STRATA_CPU_ISA");
    if (e && *e) {
        int i = 0;
        while (i < CPU_ISA_COUNT && strcmp(e, cpu_isa_name((cpu_isa_t)i)) != 0) i++;
        if (i < CPU_ISA_COUNT) want = (cpu_isa_t)i;
        else log_warn("STRATA_CPU_ISA=%s is not ref|avx2|avx512|avx512vnni; choosing automatically", e);
    }
    cpu_isa_t got = cpu_ops_set_isa(want);
    if (e && *e && got != want)
        log_warn("STRATA_CPU_ISA=%s is not supported by this CPU; using %s", e, cpu_isa_name(got));
    log_debug("cpu ops: isa %s", cpu_isa_name(got));
}

cpu_isa_t cpu_ops_init(void)
{
    if (atomic_load(&s_isa) < 0) pthread_once(&s_once, s_init_once);
    return (cpu_isa_t)atomic_load(&s_isa);
}

static mm_rows_fn_t s_rows_fn(cpu_isa_t isa)
{
    switch (isa) {
#ifdef STRATA_CPU_AVX2
    case CPU_ISA_AVX2: return cpu_avx2_mm_rows;
#endif
#ifdef STRATA_CPU_AVX512
    case CPU_ISA_AVX512: return cpu_avx512_mm_rows;
#endif
#ifdef STRATA_CPU_AVX512_VNNI
    case CPU_ISA_AVX512_VNNI: return cpu_avx512vnni_mm_rows;
#endif
    default: return cpu_ref_mm_rows;
    }
}

/* Per-thread, 64-byte aligned scratch buffers, grown on demand and freed at thread exit (the
 * keys' destructor): S_BUF_ROW backs cpu_row_buf, S_BUF_Q8 the int8 activations of the jobs a
 * thread dispatches (CPU_ACT_Q8). */
enum { S_BUF_ROW, S_BUF_Q8, S_N_BUFS };
static pthread_key_t s_buf_keys[S_N_BUFS];
static pthread_once_t s_buf_once = PTHREAD_ONCE_INIT;
static __thread void *s_buf[S_N_BUFS];
static __thread size_t s_buf_cap[S_N_BUFS];

static void s_buf_keys_init(void)
{
    for (int k = 0; k < S_N_BUFS; k++) STRATA_ASSERT(pthread_key_create(&s_buf_keys[k], free) == 0);
}

static void *s_thread_buf(int k, size_t bytes)
{
    if (s_buf_cap[k] < bytes) {
        pthread_once(&s_buf_once, s_buf_keys_init);
        free(s_buf[k]);
        void *p = NULL;
        STRATA_ASSERT(posix_memalign(&p, 64, bytes) == 0);
        s_buf[k] = p;
        s_buf_cap[k] = bytes;
        pthread_setspecific(s_buf_keys[k], p);
    }
    return s_buf[k];
}

float *cpu_row_buf(size_t n)
{
    return s_thread_buf(S_BUF_ROW, n * sizeof(float));
}

/* Several matmuls over one row space: item i is row i - off[k] of jobs[k]. One pool
 * dispatch covers them all (the gate and up projections of an FFN, or of many). */
#define S_MAX_JOBS (2 * CPU_FFN_MANY_MAX)
typedef struct {
    const mm_job_t *jobs;
    int n_jobs;
    int64_t off[S_MAX_JOBS + 1]; /* [n_jobs + 1] first item of each job */
    mm_rows_fn_t fn;
} s_multi_t;

static void s_multi_chunk(void *ctx, int64_t i0, int64_t i1, int tid)
{
    (void)tid;
    const s_multi_t *m = ctx;
    int lo = 0, hi = m->n_jobs - 1; /* the job holding item i0: the last k with off[k] <= i0 */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (m->off[mid] <= i0) lo = mid;
        else hi = mid - 1;
    }
    for (int k = lo; k < m->n_jobs && i0 < i1; k++) {
        int64_t a = i0 > m->off[k] ? i0 : m->off[k];
        int64_t b = i1 < m->off[k + 1] ? i1 : m->off[k + 1];
        if (a < b) m->fn(&m->jobs[k], (int32_t)(a - m->off[k]), (int32_t)(b - m->off[k]));
    }
}

/* CPU_ACT_Q8: quantize the activations of every INT4 and MXFP4 job (once per distinct x and
 * layout) into the calling thread's S_BUF_Q8 buffer and point the jobs at them. The VNNI
 * kernel takes an INT4 job's activations packed in its order (cpu_avx512vnni_q8_pack), through
 * a row-order copy at the end of the buffer; everything else reads them in row order. */
static bool s_q8_fmt(wfmt_t fmt)
{
    return fmt == WF_INT4 || fmt == WF_MXFP4;
}

static void s_q8_prepare(mm_job_t *jobs, int n_jobs, bool vnni)
{
    size_t need = 0, tmp = 0;
    for (int k = 0; k < n_jobs; k++)
        if (s_q8_fmt(jobs[k].w->fmt)) {
            const size_t nc = (size_t)jobs[k].n * jobs[k].w->cols;
            need += nc / 32 * (32 + 2 * sizeof(float));
            if (vnni && jobs[k].w->fmt == WF_INT4 && nc > tmp) tmp = nc;
        }
    if (!need) return;
    char *at = s_thread_buf(S_BUF_Q8, need + tmp);
    int8_t *rowq = (int8_t *)at + need; /* [n][cols] for the VNNI kernel's pack */
    for (int k = 0; k < n_jobs; k++) {
        mm_job_t *j = &jobs[k];
        if (!s_q8_fmt(j->w->fmt)) continue;
        const bool pack = vnni && j->w->fmt == WF_INT4;
        const mm_job_t *same = NULL;
        for (int i = 0; i < k && !same; i++)
            if (jobs[i].xq && jobs[i].x == j->x && jobs[i].ldx == j->ldx && jobs[i].n == j->n &&
                jobs[i].w->cols == j->w->cols && (vnni && jobs[i].w->fmt == WF_INT4) == pack)
                same = &jobs[i];
        if (same) {
            j->xq = same->xq, j->xd = same->xd, j->xs = same->xs;
            continue;
        }
        const size_t nb = (size_t)j->n * j->w->cols / 32;
        float *d = (float *)at;
        int32_t *s = (int32_t *)(at + nb * sizeof(float));
        int8_t *q = (int8_t *)(at + nb * 2 * sizeof(float));
        at += nb * (32 + 2 * sizeof(float));
        cpu_q8_quantize(j->x, j->ldx, j->n, j->w->cols, pack ? rowq : q, d, s);
#ifdef STRATA_CPU_AVX512_VNNI
        if (pack) cpu_avx512vnni_q8_pack(rowq, j->n, j->w->cols, q);
#endif
        j->xq = q, j->xd = d, j->xs = s;
    }
}

static void s_run_jobs(tpool_t *pool, mm_job_t *jobs, int n_jobs)
{
    STRATA_ASSERT(n_jobs >= 1 && n_jobs <= S_MAX_JOBS);
    const cpu_isa_t isa = cpu_ops_init(); /* once: the activations' layout follows the kernel */
    if (cpu_ops_act() == CPU_ACT_Q8) s_q8_prepare(jobs, n_jobs, isa == CPU_ISA_AVX512_VNNI);
    s_multi_t m = {.jobs = jobs, .n_jobs = n_jobs, .fn = s_rows_fn(isa)};
    int64_t maxcols = 1;
    for (int k = 0; k < n_jobs; k++) {
        m.off[k + 1] = m.off[k] + jobs[k].w->rows;
        if (jobs[k].w->cols > maxcols) maxcols = jobs[k].w->cols;
    }
    /* A chunk should stream at least ~16K weights, so per-chunk overhead stays small. */
    int64_t grain = (16384 + maxcols - 1) / maxcols;
    grain = (grain + 3) & ~(int64_t)3;
    tpool_run(pool, m.off[n_jobs], grain, s_multi_chunk, &m);
}

void cpu_attention(float *out, const float *q, const float *k_cache, const float *v_cache,
                   const int32_t *block_table, int ctx_start, int n_ctx, int n_heads, int n_kv_heads,
                   int head_dim, int block_size, float scale, const float *sinks, float *scratch)
{
    attn_fn_t fn = cpu_ref_attention;
    switch (cpu_ops_init()) {
#ifdef STRATA_CPU_AVX2
    case CPU_ISA_AVX2: fn = cpu_avx2_attention; break;
#endif
#ifdef STRATA_CPU_AVX512
    case CPU_ISA_AVX512:
    case CPU_ISA_AVX512_VNNI: fn = cpu_avx512_attention; break;
#endif
    default: break;
    }
    fn(out, q, k_cache, v_cache, block_table, ctx_start, n_ctx, n_heads, n_kv_heads, head_dim, block_size, scale, sinks,
       scratch);
}

void cpu_matmul(tpool_t *pool, float *y, const float *x, int n, const qmat_t *w, const float *bias)
{
    if (n <= 0 || w->rows <= 0) return;
    mm_job_t j = {.w = w, .x = x, .y = y, .n = n, .ldx = w->cols, .ldy = w->rows, .bias = bias};
    s_run_jobs(pool, &j, 1);
}

/* h = act(g, u) in place of g over cnt elements, per opts (contract in ops.h): plain SwiGLU
 * silu(g) * u, or gpt-oss's clamped form. The biases are already in g and u (the gate and up
 * jobs add them as their bias). NaN passes through both clamps, as torch.clamp's does. */
static void s_ffn_act(float *g, const float *u, int64_t cnt, const cpu_ffn_opts_t *opts)
{
    if (!opts || !opts->clamped) {
        for (int64_t e = 0; e < cnt; e++) g[e] = g[e] / (1.0f + expf(-g[e])) * u[e];
        return;
    }
    const float lim = opts->limit, alpha = opts->alpha;
    for (int64_t e = 0; e < cnt; e++) {
        const float gv = g[e] > lim ? lim : g[e];
        const float uv = u[e] > lim ? lim : u[e] < -lim ? -lim : u[e];
        const float glu = gv / (1.0f + expf(-alpha * gv)); /* gate * sigmoid(alpha * gate) */
        g[e] = (uv + 1.0f) * glu;
    }
}

/* The activations of an FFN dispatch over one item space: item i is element i - off[k] of pair
 * k's gate and up outputs, so the pool splits them as it splits the matmuls' rows (one token's
 * gate of a 16384-wide expert alone is 16384 expf). */
typedef struct {
    float *g[CPU_FFN_MANY_MAX];
    const float *u[CPU_FFN_MANY_MAX];
    const cpu_ffn_opts_t *opts[CPU_FFN_MANY_MAX];
    int64_t off[CPU_FFN_MANY_MAX + 1];
    int n;
} s_acts_t;

static void s_acts_chunk(void *ctx, int64_t i0, int64_t i1, int tid)
{
    (void)tid;
    const s_acts_t *a = ctx;
    for (int k = 0; k < a->n && i0 < i1; k++) {
        const int64_t lo = i0 > a->off[k] ? i0 : a->off[k], hi = i1 < a->off[k + 1] ? i1 : a->off[k + 1];
        if (lo < hi) s_ffn_act(a->g[k] + (lo - a->off[k]), a->u[k] + (lo - a->off[k]), hi - lo, a->opts[k]);
    }
}

/* The FFNs of items (out_i = yscale_i * ffn_i(x_i), added to out_i if acc), gate/up of all in
 * one dispatch, then every down in one. Each item's biases ride on its jobs' bias (mm_store
 * adds the bias before the scale, so the down bias is scaled with the rest). */
static void s_ffn_items(tpool_t *pool, const cpu_ffn_item_t *items, int n_items, float *scratch, const float *yscale,
                        bool acc)
{
    STRATA_ASSERT(n_items >= 1 && n_items <= CPU_FFN_MANY_MAX);
    mm_job_t jobs[S_MAX_JOBS];
    const cpu_ffn_opts_t *opts[CPU_FFN_MANY_MAX]; /* per job pair */
    float *at = scratch;
    int nj = 0;
    for (int i = 0; i < n_items; i++) {
        const cpu_ffn_item_t *it = &items[i];
        if (it->n <= 0) continue;
        const int inter = it->gate->rows;
        STRATA_ASSERT(it->up->rows == inter && it->up->cols == it->gate->cols && it->down->cols == inter);
        const cpu_ffn_opts_t *o = it->opts;
        float *g = at, *u = at + (int64_t)it->n * inter; /* [n][inter] each */
        at += (int64_t)2 * it->n * inter;
        opts[nj / 2] = o;
        jobs[nj++] = (mm_job_t){.w = it->gate, .x = it->x, .y = g, .n = it->n, .ldx = it->gate->cols, .ldy = inter,
                                .bias = o ? o->gate_bias : NULL};
        jobs[nj++] = (mm_job_t){.w = it->up, .x = it->x, .y = u, .n = it->n, .ldx = it->up->cols, .ldy = inter,
                                .bias = o ? o->up_bias : NULL};
    }
    if (!nj) return;
    s_run_jobs(pool, jobs, nj);
    s_acts_t acts = {.n = nj / 2};
    for (int k = 0; k < nj; k += 2) {
        acts.g[k / 2] = jobs[k].y, acts.u[k / 2] = jobs[k + 1].y, acts.opts[k / 2] = opts[k / 2];
        acts.off[k / 2 + 1] = acts.off[k / 2] + (int64_t)jobs[k].n * jobs[k].ldy;
    }
    tpool_run(pool, acts.off[acts.n], 2048, s_acts_chunk, &acts);
    int nd = 0;
    for (int k = 0; k < nj; k += 2) jobs[nd++] = (mm_job_t){.w = NULL, .x = jobs[k].y, .n = jobs[k].n, .ldx = jobs[k].ldy};
    for (int i = 0, d = 0; i < n_items; i++) {
        const cpu_ffn_item_t *it = &items[i];
        if (it->n <= 0) continue;
        mm_job_t *j = &jobs[d++];
        *j = (mm_job_t){.w = it->down, .x = j->x, .y = it->out, .n = it->n, .ldx = j->ldx, .ldy = it->down->rows,
                        .bias = it->opts ? it->opts->down_bias : NULL, .yscale = yscale, .acc = acc};
    }
    s_run_jobs(pool, jobs, nd);
}

void cpu_matmul_multi(tpool_t *pool, const float *x, int n, const cpu_mm_item_t *items, int n_items)
{
    STRATA_ASSERT(n_items >= 0 && n_items <= 8);
    if (n <= 0 || n_items == 0) return;
    mm_job_t jobs[8];
    int nj = 0;
    for (int i = 0; i < n_items; i++) {
        const qmat_t *w = items[i].w;
        STRATA_ASSERT(w->cols == items[0].w->cols);
        if (w->rows > 0)
            jobs[nj++] = (mm_job_t){.w = w, .x = x, .y = items[i].y, .n = n, .ldx = w->cols, .ldy = w->rows, .bias = items[i].bias};
    }
    if (nj) s_run_jobs(pool, jobs, nj);
}

void cpu_ffn_swiglu(tpool_t *pool, float *out, const float *x, int n, const qmat_t *gate, const qmat_t *up,
                    const qmat_t *down, const cpu_ffn_opts_t *opts, float *scratch, const float *scale,
                    bool accumulate)
{
    if (n <= 0) return;
    const cpu_ffn_item_t it = {.x = x, .out = out, .n = n, .gate = gate, .up = up, .down = down, .opts = opts};
    s_ffn_items(pool, &it, 1, scratch, scale, accumulate);
}

void cpu_ffn_swiglu_many(tpool_t *pool, const cpu_ffn_item_t *items, int n_items, float *scratch)
{
    if (n_items > 0) s_ffn_items(pool, items, n_items, scratch, NULL, false);
}
