/* exec.c - step plans on the CPU (model_forward) or a GPU (model/gpu.h); see exec.h. */
#include "services/executor/exec.h"

#include <errno.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/threadpool.h"
#include "model/generate.h"
#ifdef STRATA_HAVE_CUDA
#include "kernels/cuda/cuda_ops.h"
#include "model/gpu.h"
#endif

_Static_assert(SAMPLER_MAX_TOP == MSG_MAX_TOP_LOGPROBS, "the executor returns what a request may ask");

#define RNG_CACHE 4096 /* direct-mapped cache of per-request RNG states (a power of two) */

typedef enum { BK_CPU = 0, BK_CUDA = 1 } backend_t;

/* The RNG state of one request after n draws, so the next draw costs one step instead of n. */
typedef struct {
    uint64_t req, seed, n;   /* n: draws taken from the stream seeded with seed */
    sampler_rng_t rng;
    bool used;
} rng_slot_t;

struct exec {
    const model_t *m;
    exec_opts_t o;
    backend_t bk;
    uint64_t instance;
    int32_t max_context;
    /* cpu */
    tpool_t *pool;
    forward_ctx_t *fwd;
    kv_cache_t kv;
    /* cuda */
#ifdef STRATA_HAVE_CUDA
    gpu_model_t *gpu;
    gpu_sample_t *samp;                 /* [MSG_MAX_STEP_SEQS] each logit row's sampling */
    int32_t *nx;                        /* [4][MSG_MAX_STEP_SEQS] the step guessed next (s_guess):
                                           tokens, positions, sequences, logit rows */
    const int32_t **nx_tables;          /* [MSG_MAX_STEP_SEQS] its block tables */
    const int32_t **nx_win;             /* [MSG_MAX_STEP_SEQS] its window tables */
#endif
    int32_t window;                     /* the model's sliding window, 0 when no layer slides */
    /* one step, built from the plan */
    int32_t *tok, *pos, *seq;           /* [o.max_tokens] */
    const int32_t **tables;             /* [MSG_MAX_STEP_SEQS] block table per sequence */
    const int32_t **win_tables;         /* [MSG_MAX_STEP_SEQS] window table per sequence (sliding layers) */
    int32_t *rows;                      /* [MSG_MAX_STEP_SEQS] logit row -> token index */
    int32_t *row_of;                    /* [MSG_MAX_STEP_SEQS] sequence -> its logit row or -1 */
    int32_t *ids;                       /* [MSG_MAX_STEP_SEQS] ids the GPU picked (greedy or sampled) */
    int32_t *seq_of;                    /* [MSG_MAX_STEP_SEQS] logit row -> its sequence */
    double *u;                          /* [MSG_MAX_STEP_SEQS] the uniform draw of each logit row */
    float *logits;                      /* [logits_rows][vocab] */
    int32_t logits_rows;
    rng_slot_t *rng;                    /* [RNG_CACHE] */
    /* log-probabilities of the last step (allocated at the first step that asks) */
    bool lp_any;                        /* some sequence of the last step asked */
    int32_t lp_seqs;                    /* its sequences */
    float *lp;                          /* [MSG_MAX_STEP_SEQS] the sampled token's, per sequence */
    int32_t *lp_topn;                   /* [MSG_MAX_STEP_SEQS] alternatives per sequence, -1 none */
    int32_t *lp_tok;                    /* [MSG_MAX_STEP_SEQS][SAMPLER_MAX_TOP] alternatives, at stride
                                           SAMPLER_MAX_TOP while sampling, packed after */
    float *lp_top;                      /* [MSG_MAX_STEP_SEQS][SAMPLER_MAX_TOP] their log-probabilities */
    int32_t lp_ntop;                    /* packed entries of lp_tok / lp_top */
    int32_t *lp_slot;                   /* [MSG_MAX_STEP_SEQS] logit row -> its row of lp_raw, or -1 */
    float *lp_raw;                      /* [lp_raw_rows][vocab] untouched copies of the logits rows that
                                           cpu_sample rescales in place (temperature > 0) */
    int32_t lp_raw_rows;
    exec_stats_t st;
};

void exec_opts_default(exec_opts_t *o)
{
    memset(o, 0, sizeof *o);
    snprintf(o->backend, sizeof o->backend, "cpu");
    o->kv_blocks = 2048;
    o->block_size = 16;
    o->max_tokens = 256;
    o->prefetch_depth = -1;
}

double exec_thread_cpu_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec * 1e6 + t.tv_nsec * 1e-3;
}

static void s_sampler_skip(sampler_rng_t *r, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++) (void)sampler_rng_uniform(r);
}

double exec_draw(uint64_t seed, uint64_t n)
{
    sampler_rng_t r;
    sampler_rng_seed(&r, seed);
    s_sampler_skip(&r, n);
    return sampler_rng_uniform(&r);
}

/* Draw number n of request req's stream (seed): from the cached state when it is at n, else
 * from the seed (a replay, a preempted request, or a cache collision). */
static double s_draw(exec_t *e, uint64_t req, uint64_t seed, uint64_t n)
{
    rng_slot_t *c = &e->rng[(req * 0x9E3779B97F4A7C15ull) >> 52 & (RNG_CACHE - 1)];
    if (!c->used || c->req != req || c->seed != seed || c->n > n) {
        c->used = true;
        c->req = req;
        c->seed = seed;
        c->n = 0;
        sampler_rng_seed(&c->rng, seed);
    }
    s_sampler_skip(&c->rng, n - c->n);
    c->n = n + 1;
    return sampler_rng_uniform(&c->rng);
}

static int s_cpu_count(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    return 0;
}

int exec_create(exec_t **out, const model_t *m, const exec_opts_t *o, strata_errbuf_t *eb)
{
    int rc = 0;
    *out = NULL;
    if (o->kv_blocks <= 0 || o->block_size <= 0 || o->max_tokens <= 0)
        return strata_seterr(eb, STRATA_EINVAL_INPUT, "executor: kv_blocks %d, block_size %d and max tokens %d must be > 0",
                             o->kv_blocks, o->block_size, o->max_tokens);
    exec_t *e = calloc(1, sizeof *e);
    if (!e) return STRATA_ENOMEM;
    e->m = m;
    e->o = *o;
    while (e->instance == 0)
        if (getrandom(&e->instance, sizeof e->instance, 0) != (ssize_t)sizeof e->instance) e->instance = strata_now_ns();
    int64_t mc = m->cfg.max_pos > 0 ? m->cfg.max_pos : INT32_MAX;
    if (o->max_context > 0 && o->max_context < mc) mc = o->max_context;
    if ((int64_t)o->kv_blocks * o->block_size < mc) mc = (int64_t)o->kv_blocks * o->block_size;
    e->max_context = (int32_t)mc;
    e->window = model_sliding_window(&m->cfg);

    size_t T = (size_t)o->max_tokens;
    e->tok = malloc(T * sizeof *e->tok);
    e->pos = malloc(T * sizeof *e->pos);
    e->seq = malloc(T * sizeof *e->seq);
    e->tables = malloc(MSG_MAX_STEP_SEQS * sizeof *e->tables);
    e->win_tables = malloc(MSG_MAX_STEP_SEQS * sizeof *e->win_tables);
    e->rows = malloc(MSG_MAX_STEP_SEQS * sizeof *e->rows);
    e->row_of = malloc(MSG_MAX_STEP_SEQS * sizeof *e->row_of);
    e->ids = malloc(MSG_MAX_STEP_SEQS * sizeof *e->ids);
    e->seq_of = malloc(MSG_MAX_STEP_SEQS * sizeof *e->seq_of);
    e->u = malloc(MSG_MAX_STEP_SEQS * sizeof *e->u);
    e->rng = calloc(RNG_CACHE, sizeof *e->rng);
    bool samp_ok = true;
#ifdef STRATA_HAVE_CUDA
    e->samp = malloc(MSG_MAX_STEP_SEQS * sizeof *e->samp);
    e->nx = malloc(4 * MSG_MAX_STEP_SEQS * sizeof *e->nx);
    e->nx_tables = malloc(MSG_MAX_STEP_SEQS * sizeof *e->nx_tables);
    e->nx_win = malloc(MSG_MAX_STEP_SEQS * sizeof *e->nx_win);
    samp_ok = e->samp && e->nx && e->nx_tables && e->nx_win;
#endif
    if (!e->tok || !e->pos || !e->seq || !e->tables || !e->win_tables || !e->rows || !e->row_of || !e->ids || !e->seq_of ||
        !e->u || !e->rng || !samp_ok) {
        rc = STRATA_ENOMEM;
        goto fail;
    }

    if (!strcmp(o->backend, "cpu")) {
        e->bk = BK_CPU;
        int n = o->threads > 0 ? o->threads : s_cpu_count();
        e->pool = tpool_create(n);
        if (!e->pool) {
            rc = strata_seterr(eb, STRATA_ENOMEM, "executor: cannot start %d worker threads", n);
            goto fail;
        }
        if ((rc = kv_cache_init(&e->kv, &m->cfg, o->kv_blocks, o->block_size)) < 0) {
            strata_seterr(eb, rc, "executor: KV cache of %d blocks x %d tokens: %s", o->kv_blocks, o->block_size,
                          strata_strerror(rc));
            goto fail;
        }
        e->fwd = forward_ctx_create(m, o->max_tokens, e->pool);
        if (!e->fwd || forward_set_remote(e->fwd, o->remote) < 0) {
            rc = strata_seterr(eb, STRATA_ENOMEM, "executor: forward buffers for %d tokens", o->max_tokens);
            goto fail;
        }
    } else if (!strcmp(o->backend, "cuda")) {
        e->bk = BK_CUDA;
#ifdef STRATA_HAVE_CUDA
        /* host threads for sampling the sequences of a step in parallel */
        int n = o->threads > 0 ? o->threads : s_cpu_count();
        e->pool = tpool_create(n > 16 ? 16 : n);
        if (!e->pool) {
            rc = strata_seterr(eb, STRATA_ENOMEM, "executor: cannot start %d sampling threads", n);
            goto fail;
        }
        if (cuda_device_count() <= 0) {
            rc = strata_seterr(eb, STRATA_EUNSUPPORTED, "executor: backend = cuda, but this machine has no CUDA device");
            goto fail;
        }
        gpu_opts_t go;
        gpu_opts_default(&go);
        go.gpu_mem = o->gpu_mem;
        if (o->prefetch_depth >= 0) go.prefetch_depth = o->prefetch_depth;
        go.split_experts = !o->whole_experts;
        go.kv_blocks = o->kv_blocks;
        go.block_size = o->block_size;
        go.max_tokens = o->max_tokens;
        go.remote = o->remote;
        go.cpu_policy = (gpu_cpu_policy_t)o->cpu_policy;
        go.cpu_layers = o->cpu_layers;
        if ((rc = gpu_model_create(&e->gpu, m, &go, eb)) < 0) goto fail;
#else
        rc = strata_seterr(eb, STRATA_EUNSUPPORTED, "executor: backend = cuda, but this build has no CUDA (nvcc was not found at build time)");
        goto fail;
#endif
    } else {
        rc = strata_seterr(eb, STRATA_EINVAL_INPUT, "executor: backend '%s' is not cpu or cuda", o->backend);
        goto fail;
    }
    *out = e;
    return 0;
fail:
    exec_free(e);
    return rc;
}

void exec_free(exec_t *e)
{
    if (!e) return;
    forward_ctx_free(e->fwd);
    kv_cache_free(&e->kv);
    tpool_destroy(e->pool);
#ifdef STRATA_HAVE_CUDA
    gpu_model_free(e->gpu);
#endif
    free(e->tok);
    free(e->pos);
    free(e->seq);
    free(e->tables);
    free(e->win_tables);
    free(e->rows);
    free(e->row_of);
    free(e->ids);
    free(e->seq_of);
    free(e->u);
#ifdef STRATA_HAVE_CUDA
    free(e->samp);
    free(e->nx);
    free(e->nx_tables);
    free(e->nx_win);
#endif
    free(e->logits);
    free(e->rng);
    free(e->lp);
    free(e->lp_topn);
    free(e->lp_tok);
    free(e->lp_top);
    free(e->lp_slot);
    free(e->lp_raw);
    free(e);
}

uint64_t exec_instance(const exec_t *e) { return e->instance; }

int32_t exec_max_context(const exec_t *e) { return e->max_context; }

int32_t exec_sliding_window(const exec_t *e) { return e->window; }

/* Count a refused plan and say why in text[tlen]. */
__attribute__((format(printf, 4, 5)))
static int s_refuse(exec_t *e, char *text, size_t tlen, const char *fmt, ...)
{
    e->st.bad_plans++;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, tlen, fmt, ap);
    va_end(ap);
    return STRATA_EINVAL_INPUT;
}

/* Check the whole plan before anything runs: a refused plan leaves the KV cache untouched. */
static int s_validate(exec_t *e, const msg_step_t *st, msg_errcode_t *code, char *text, size_t tlen)
{
    *code = MSG_E_INVALID_PARAM;
    if (st->instance != 0 && st->instance != e->instance) {
        *code = MSG_E_UNAVAILABLE;
        return s_refuse(e, text, tlen, "stale instance");
    }
    if (st->n_seqs < 1 || st->n_seqs > MSG_MAX_STEP_SEQS)
        return s_refuse(e, text, tlen, "step: field 'seqs': %d sequences, must be 1..%d", st->n_seqs, MSG_MAX_STEP_SEQS);
    int64_t total = 0;
    const int32_t bs = e->o.block_size, vocab = e->m->cfg.vocab;
    for (int32_t i = 0; i < st->n_seqs; i++) {
        const msg_step_seq_t *q = &st->seqs[i];
        total += q->n_tokens;
        if (total > e->o.max_tokens)
            return s_refuse(e, text, tlen, "step: field 'seqs': more than %d tokens in one step (max_batch_tokens)",
                            e->o.max_tokens);
        int64_t end = (int64_t)q->pos0 + q->n_tokens;
        if (q->n_tokens < 1 || q->pos0 < 0 || end > e->max_context)
            return s_refuse(e, text, tlen, "step: seqs[%d] field 'pos0': positions %d..%lld outside the context of %d", i,
                            q->pos0, (long long)end - 1, e->max_context);
        int64_t need = (end + bs - 1) / bs;
        if (q->n_blocks < need)
            return s_refuse(e, text, tlen, "step: seqs[%d] field 'blocks': %d blocks for position %lld, need %lld", i,
                            q->n_blocks, (long long)end - 1, (long long)need);
        for (int64_t b = 0; b < need; b++)
            if (q->blocks[b] < 0 || q->blocks[b] >= e->o.kv_blocks)
                return s_refuse(e, text, tlen, "step: seqs[%d] field 'blocks[%lld]': block %d outside the KV cache [0, %d)",
                                i, (long long)b, q->blocks[b], e->o.kv_blocks);
        if ((q->win_blocks != NULL) != (st->seqs[0].win_blocks != NULL))
            return s_refuse(e, text, tlen, "step: seqs[%d] field 'win_blocks': on some sequences of the step only", i);
        if (q->win_blocks && e->window == 0)
            return s_refuse(e, text, tlen, "step: seqs[%d] field 'win_blocks': the model has no sliding-window layer", i);
        if (q->win_blocks) {
            /* the sliding layers write positions pos0 .. end-1 and attend from pos0 - W + 1 on:
             * entries below that may be freed (-1), none from there on */
            int64_t lo = q->pos0 - (int64_t)e->window + 1;
            lo = lo > 0 ? lo / bs : 0;
            if (q->n_win_blocks < need)
                return s_refuse(e, text, tlen, "step: seqs[%d] field 'win_blocks': %d entries for position %lld, need %lld", i,
                                q->n_win_blocks, (long long)end - 1, (long long)need);
            for (int64_t b = 0; b < need; b++)
                if (q->win_blocks[b] >= e->o.kv_blocks || (b >= lo && q->win_blocks[b] < 0))
                    return s_refuse(e, text, tlen,
                                    "step: seqs[%d] field 'win_blocks[%lld]': block %d%s outside the KV cache [0, %d)", i,
                                    (long long)b, q->win_blocks[b], b >= lo ? ", within the window," : "", e->o.kv_blocks);
        }
        if (q->top_logprobs < 0 || q->top_logprobs > SAMPLER_MAX_TOP)
            return s_refuse(e, text, tlen, "step: seqs[%d] field 'top_logprobs': %d, must be 0..%d", i, q->top_logprobs,
                            SAMPLER_MAX_TOP);
        for (int32_t t = 0; t < q->n_tokens; t++)
            if (q->tokens[t] < 0 || q->tokens[t] >= vocab)
                return s_refuse(e, text, tlen, "step: seqs[%d] field 'tokens[%d]': id %d outside the vocab [0, %d)", i, t,
                                q->tokens[t], vocab);
    }
    return 0;
}

typedef struct {
    exec_t *e;
    const msg_step_t *st;
    int32_t *tokens;
} s_sample_job_t;

static void s_sample_rows(void *ctx, int64_t r0, int64_t r1, int tid)
{
    (void)tid;
    const s_sample_job_t *j = ctx;
    exec_t *e = j->e;
    const size_t vocab = (size_t)e->m->cfg.vocab;
    for (int64_t r = r0; r < r1; r++) {
        const int32_t i = e->seq_of[r];
        const msg_step_seq_t *q = &j->st->seqs[i];
        const msg_sampling_t *sp = &q->samp;
        float *row = e->logits + (size_t)r * vocab;
        /* cpu_sample divides a row by its temperature in place: keep the raw row for the
         * log-probabilities, which are the model's own distribution */
        const float *raw = row;
        if (q->logprobs && e->lp_slot[r] >= 0) {
            raw = e->lp_raw + (size_t)e->lp_slot[r] * vocab;
            memcpy((float *)raw, row, vocab * sizeof *row);
        }
        const int32_t tok = cpu_sample(row, (int)vocab, sp->temperature, sp->top_k, sp->top_p, e->u[r]);
        j->tokens[i] = tok;
        if (q->logprobs) {
            int k = q->top_logprobs < (int32_t)vocab ? q->top_logprobs : (int)vocab;
            e->lp[i] = sampler_logprobs(raw, (int)vocab, tok, k, e->lp_tok + (size_t)i * SAMPLER_MAX_TOP,
                                        e->lp_top + (size_t)i * SAMPLER_MAX_TOP);
            e->lp_topn[i] = k;
        }
    }
}

/* Room for the log-probabilities of plan st, in which some sequence asked, and each logit row's
 * slot in lp_raw; every sequence's row starts as none. 0 or STRATA_ENOMEM. */
static int s_lp_prepare(exec_t *e, const msg_step_t *st, int32_t n_logits)
{
    const size_t N = MSG_MAX_STEP_SEQS, vocab = (size_t)e->m->cfg.vocab;
    if (!e->lp) {
        e->lp = malloc(N * sizeof *e->lp);
        e->lp_topn = malloc(N * sizeof *e->lp_topn);
        e->lp_tok = malloc(N * SAMPLER_MAX_TOP * sizeof *e->lp_tok);
        e->lp_top = malloc(N * SAMPLER_MAX_TOP * sizeof *e->lp_top);
        e->lp_slot = malloc(N * sizeof *e->lp_slot);
        if (!e->lp || !e->lp_topn || !e->lp_tok || !e->lp_top || !e->lp_slot) {
            free(e->lp), free(e->lp_topn), free(e->lp_tok), free(e->lp_top), free(e->lp_slot);
            e->lp = NULL, e->lp_topn = NULL, e->lp_tok = NULL, e->lp_top = NULL, e->lp_slot = NULL;
            return STRATA_ENOMEM;
        }
    }
    int32_t n_raw = 0;
    for (int32_t r = 0; r < n_logits; r++) {
        const msg_step_seq_t *q = &st->seqs[e->seq_of[r]];
        const bool rescaled = q->samp.temperature > 0 && q->samp.top_k != 1; /* cpu_sample's greedy test */
        e->lp_slot[r] = q->logprobs && rescaled ? n_raw++ : -1;
    }
    if (n_raw > e->lp_raw_rows) {
        float *nr = realloc(e->lp_raw, (size_t)n_raw * vocab * sizeof *nr);
        if (!nr) return STRATA_ENOMEM;
        e->lp_raw = nr;
        e->lp_raw_rows = n_raw;
    }
    for (int32_t i = 0; i < st->n_seqs; i++) {
        e->lp[i] = 0;
        e->lp_topn[i] = -1;
    }
    return 0;
}

/* Pack each sequence's alternatives after those of the sequences before it (in place: no
 * sequence's entries move to a later offset). */
static void s_lp_pack(exec_t *e, int32_t n_seqs)
{
    int32_t at = 0;
    for (int32_t i = 0; i < n_seqs; i++) {
        const int32_t k = e->lp_topn[i];
        if (k <= 0) continue;
        memmove(e->lp_tok + at, e->lp_tok + (size_t)i * SAMPLER_MAX_TOP, (size_t)k * sizeof *e->lp_tok);
        memmove(e->lp_top + at, e->lp_top + (size_t)i * SAMPLER_MAX_TOP, (size_t)k * sizeof *e->lp_top);
        at += k;
    }
    e->lp_ntop = at;
}

void exec_logprobs(const exec_t *e, msg_lp_rows_t *out)
{
    memset(out, 0, sizeof *out);
    if (!e->lp_any) return;
    out->n_logprobs = out->n_top_n = e->lp_seqs;
    out->logprobs = e->lp;
    out->top_n = e->lp_topn;
    out->n_top_tokens = out->n_top_logprobs = e->lp_ntop;
    out->top_tokens = e->lp_tok;
    out->top_logprobs = e->lp_top;
}

#ifdef STRATA_HAVE_CUDA
/* The step expected after plan st: each sequence's next row, its token tokens[i] (NULL: the
 * pick still on the GPU, gpu_set_next), in e->nx. False when st does not continue that way:
 * a sequence not sampled or ending with this step (last), a pick refused, or a position past
 * its blocks or the context. */
static bool s_guess(exec_t *e, const msg_step_t *st, const int32_t *tokens, batch_t *b)
{
    if (e->bk != BK_CUDA || st->n_seqs > e->o.max_tokens) return false;
    const int32_t bs = e->o.block_size, N = MSG_MAX_STEP_SEQS;
    int32_t *tok = e->nx, *pos = e->nx + N, *seq = e->nx + 2 * N, *rows = e->nx + 3 * N;
    for (int32_t i = 0; i < st->n_seqs; i++) {
        const msg_step_seq_t *q = &st->seqs[i];
        const int32_t p = q->pos0 + q->n_tokens;
        if (!q->sample || q->last || (tokens && tokens[i] < 0) || p / bs >= q->n_blocks || p >= e->max_context)
            return false;
        /* a block past the plan's positions was not validated with it */
        if (q->blocks[p / bs] < 0 || q->blocks[p / bs] >= e->o.kv_blocks) return false;
        /* nor was the window table's (its entries from p - W + 1 on were, but for p's own) */
        if (q->win_blocks &&
            (p / bs >= q->n_win_blocks || q->win_blocks[p / bs] < 0 || q->win_blocks[p / bs] >= e->o.kv_blocks))
            return false;
        e->nx_tables[i] = q->blocks;
        e->nx_win[i] = q->win_blocks;
        tok[i] = tokens ? tokens[i] : -1;
        pos[i] = p;
        seq[i] = i;
        rows[i] = i;
    }
    *b = (batch_t){
        .n_tokens = st->n_seqs,
        .tokens = tok,
        .pos = pos,
        .seq = seq,
        .block_tables = e->nx_tables,
        .n_logits = st->n_seqs,
        .logit_rows = rows,
        .win_tables = st->seqs[0].win_blocks ? e->nx_win : NULL,
    };
    return true;
}
#endif

int exec_step(exec_t *e, const msg_step_t *st, int32_t *tokens, double *forward_us, double *sample_us,
              msg_errcode_t *code, char *text, size_t tlen)
{
    int rc = 0;
    *forward_us = *sample_us = 0;
    text[0] = 0;
    e->lp_any = false;
    if ((rc = s_validate(e, st, code, text, tlen)) < 0) return rc;
    *code = MSG_E_INTERNAL;

    /* tokens of every sequence, in plan order; one logit row per sampled sequence */
    int32_t n = 0, n_logits = 0;
    bool all_greedy = true, want_lp = false;
    for (int32_t i = 0; i < st->n_seqs; i++) {
        const msg_step_seq_t *q = &st->seqs[i];
        e->tables[i] = q->blocks;
        e->win_tables[i] = q->win_blocks;
        for (int32_t t = 0; t < q->n_tokens; t++, n++) {
            e->tok[n] = q->tokens[t];
            e->pos[n] = q->pos0 + t;
            e->seq[n] = i;
        }
        e->row_of[i] = -1;
        if (q->sample) {
            e->row_of[i] = n_logits;
            e->seq_of[n_logits] = i;
            e->rows[n_logits++] = n - 1;
            all_greedy &= q->samp.temperature <= 0;
            want_lp |= q->logprobs;
        }
    }
    const size_t vocab = (size_t)e->m->cfg.vocab;
    if (n_logits > e->logits_rows) {
        float *nl = realloc(e->logits, (size_t)n_logits * vocab * sizeof *nl);
        if (!nl) {
            snprintf(text, tlen, "out of memory for %d x %zu logits", n_logits, vocab);
            return STRATA_ENOMEM;
        }
        e->logits = nl;
        e->logits_rows = n_logits;
    }
    if (want_lp && s_lp_prepare(e, st, n_logits) < 0) {
        snprintf(text, tlen, "out of memory for the log-probabilities of %d rows", n_logits);
        return STRATA_ENOMEM;
    }
    batch_t b = {
        .n_tokens = n,
        .tokens = e->tok,
        .pos = e->pos,
        .seq = e->seq,
        .block_tables = e->tables,
        .n_logits = n_logits,
        .logit_rows = e->rows,
        .win_tables = st->seqs[0].win_blocks ? e->win_tables : NULL,
    };
    /* the sampled rows' uniforms, in plan order (the RNG cache is not thread-safe), for
     * cpu_sample or for the GPU's sampler, which makes cpu_sample's decisions with them; none
     * when every row is greedy (a draw is indexed by position, so a later one is the same) */
    for (int32_t r = 0; r < n_logits; r++) {
        const msg_step_seq_t *q = &st->seqs[e->seq_of[r]];
        e->u[r] = all_greedy ? 0.0 : s_draw(e, q->req, q->samp.seed, q->n_sampled);
    }
    double t0 = strata_now(), c0 = exec_thread_cpu_us();
    bool have_ids = false;
    if (e->bk == BK_CPU) {
        rc = model_forward(e->fwd, &e->kv, &b, n_logits ? e->logits : NULL);
    } else {
#ifdef STRATA_HAVE_CUDA
        /* the step after this one starts behind it on the GPU, on its picks (exec_step_ahead
         * then finds it started) */
        batch_t nb;
        gpu_set_next(e->gpu, n_logits && !want_lp && s_guess(e, st, NULL, &nb) ? &nb : NULL);
        if (n_logits && want_lp) {
            /* log-probabilities need the rows on the host: sampled there (see exec.h) */
            rc = gpu_forward(e->gpu, &b, e->logits);
        } else if (n_logits && all_greedy) {
            rc = gpu_forward_greedy(e->gpu, &b, e->ids);
            have_ids = true;
        } else if (n_logits) {
            /* sampled on the GPU: only the ids come back */
            for (int32_t r = 0; r < n_logits; r++) {
                const msg_sampling_t *sp = &st->seqs[e->seq_of[r]].samp;
                e->samp[r] = (gpu_sample_t){sp->temperature, sp->top_k, sp->top_p, e->u[r]};
            }
            rc = gpu_forward_sample(e->gpu, &b, e->samp, e->ids);
            have_ids = rc == 0;
            if (rc == STRATA_EUNSUPPORTED) rc = gpu_forward(e->gpu, &b, e->logits);
        } else {
            rc = gpu_forward(e->gpu, &b, NULL);
        }
#else
        rc = STRATA_EUNSUPPORTED;
#endif
    }
    double t1 = strata_now();
    if (rc < 0) {
        /* the CPU experts' own account, when they failed it (a disk tier's bad read names the file) */
        const moe_remote_t *r = e->bk == BK_CPU ? e->o.remote : NULL;
        const char *why = r && r->error ? r->error(r->ctx) : "";
        snprintf(text, tlen, "forward pass failed: %s", why[0] ? why : strata_strerror(rc));
        return rc;
    }
    for (int32_t i = 0; i < st->n_seqs; i++) {
        int32_t r = e->row_of[i];
        tokens[i] = r < 0 ? -1 : have_ids ? e->ids[r] : 0;
    }
    if (!have_ids && n_logits > 0) {
        /* the rows on the pool: each is independent, and at batch 16 with a 150k vocabulary
         * they are ~20 ms on one core */
        s_sample_job_t job = {e, st, tokens};
        tpool_run(e->pool, n_logits, 1, s_sample_rows, &job);
    }
    if (want_lp) {
        s_lp_pack(e, st->n_seqs);
        e->lp_any = true;
        e->lp_seqs = st->n_seqs;
        for (int32_t i = 0; i < st->n_seqs; i++) e->st.logprob_rows += e->lp_topn[i] >= 0;
    }
    double t2 = strata_now();
    e->st.compute_cpu_us += exec_thread_cpu_us() - c0;
    *forward_us = (t1 - t0) * 1e6;
    *sample_us = (t2 - t1) * 1e6;
    e->st.steps++;
    e->st.tokens += (uint64_t)n;
    e->st.sampled += (uint64_t)n_logits;
    e->st.forward_us += *forward_us;
    e->st.sample_us += *sample_us;
    return 0;
}

int exec_step_ahead(exec_t *e, const msg_step_t *st, const int32_t *tokens)
{
#ifdef STRATA_HAVE_CUDA
    batch_t b;
    return s_guess(e, st, tokens, &b) ? gpu_step_ahead(e->gpu, &b) : 0;
#else
    (void)e, (void)st, (void)tokens;
    return 0;
#endif
}

int exec_ahead_progress(exec_t *e)
{
#ifdef STRATA_HAVE_CUDA
    if (e->bk == BK_CUDA && e->gpu) return gpu_ahead_progress(e->gpu);
#else
    (void)e;
#endif
    return 0;
}

void exec_get_stats(const exec_t *e, exec_stats_t *st)
{
    *st = e->st;
#ifdef STRATA_HAVE_CUDA
    if (e->gpu) {
        gpu_stats_t g;
        gpu_get_stats(e->gpu, &g);
        st->has_cache = true;
        st->hits = g.hits;
        st->misses = g.misses;
        st->host_reads = g.host_reads;
        st->steps_ahead = g.steps_ahead;
        st->steps_chained = g.steps_chained;
        st->prefetches = g.prefetches;
        st->prefetch_used = g.prefetch_used;
        st->bytes_h2d = g.bytes_h2d;
        st->slots = g.slots;
        st->n_experts_total = g.n_experts_total;
        st->experts_on_gpu = g.experts_on_gpu;
        st->cpu_layers_posted = g.cpu_layers_posted;
        st->cpu_gpu_waits = g.cpu_gpu_waits;
        st->cpu_kappa = g.cpu_kappa;
        memcpy(st->host_us, g.host_us, sizeof st->host_us);
    }
#endif
}
