/* generate.c - single-sequence prefill/decode and seeded sampling (see generate.h). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/ops.h"
#include "model/generate.h"

#define SEQ_BLOCK_SIZE 16

static inline uint64_t s_rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

/* Seed the four words from splitmix64 so that seed 0 gives a non-zero state. */
void sampler_rng_seed(sampler_rng_t *r, uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) r->s[i] = strata_splitmix64(&x);
}

/* xoshiro256**, top 53 bits scaled to [0, 1). */
double sampler_rng_uniform(sampler_rng_t *r)
{
    uint64_t *s = r->s;
    uint64_t res = s_rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = s_rotl(s[3], 45);
    return (double)(res >> 11) * 0x1.0p-53;
}

/* Greedy: temperature 0, no top-k, no top-p, seed 0. */
void sampler_params_default(sampler_params_t *p)
{
    memset(p, 0, sizeof(*p));
    p->top_p = 1.0f;
}

/* logsumexp and the k best of one row; see generate.h. */
float sampler_logprobs(const float *logits, int vocab, int32_t tok, int k, int32_t *top_ids, float *top_lp)
{
    STRATA_ASSERT(vocab >= 1 && tok >= 0 && tok < vocab && k >= 0 && k <= SAMPLER_MAX_TOP);
    if (k > vocab) k = vocab;
    float mx = logits[0];
    for (int i = 1; i < vocab; i++)
        if (logits[i] > mx) mx = logits[i];
    double z = 0;
    for (int i = 0; i < vocab; i++) z += expf(logits[i] - mx); /* as cpu_sample: expf, summed in double */
    const double lse = (double)mx + log(z);
    /* the k best by insertion: most logits fail the comparison with the current k-th */
    int32_t best[SAMPLER_MAX_TOP];
    int nb = 0;
    for (int i = 0; i < vocab && k > 0; i++) {
        const float v = logits[i];
        if (nb == k && !(v > logits[best[k - 1]])) continue;
        int j = nb < k ? nb++ : k - 1;
        while (j > 0 && v > logits[best[j - 1]]) { /* strictly greater: ties keep the lower id first */
            best[j] = best[j - 1];
            j--;
        }
        best[j] = i;
    }
    for (int j = 0; j < nb; j++) {
        top_ids[j] = best[j];
        top_lp[j] = (float)fmin(0.0, (double)logits[best[j]] - lse);
    }
    return (float)fmin(0.0, (double)logits[tok] - lse);
}

/* A private cache with an identity block table; see generate.h. */
int seq_init(seq_t *s, const model_t *m, tpool_t *pool, int32_t capacity, int32_t chunk)
{
    int rc = 0;
    memset(s, 0, sizeof(*s));
    if (capacity <= 0 || chunk <= 0) return STRATA_EINVAL_INPUT;
    if (chunk > capacity) chunk = capacity;
    s->m = m;
    s->capacity = capacity;
    s->chunk = chunk;
    int32_t n_blocks = (int32_t)(((int64_t)capacity + SEQ_BLOCK_SIZE - 1) / SEQ_BLOCK_SIZE);
    CHECK(kv_cache_init(&s->kv, &m->cfg, n_blocks, SEQ_BLOCK_SIZE));
    s->block_table = malloc((size_t)n_blocks * sizeof(int32_t));
    s->pos = malloc((size_t)chunk * sizeof(int32_t));
    s->seq = calloc((size_t)chunk, sizeof(int32_t));
    s->rows = malloc((size_t)chunk * sizeof(int32_t));
    if (!s->block_table || !s->pos || !s->seq || !s->rows) {
        rc = STRATA_ENOMEM;
        goto fail;
    }
    for (int32_t i = 0; i < n_blocks; i++) s->block_table[i] = i;
    s->fwd = forward_ctx_create(m, chunk, pool);
    if (!s->fwd) {
        rc = STRATA_ENOMEM;
        goto fail;
    }
    return 0;
fail:
    seq_free(s);
    return rc;
}

/* Release everything seq_init allocated (s may be zeroed). */
void seq_free(seq_t *s)
{
    forward_ctx_free(s->fwd);
    kv_cache_free(&s->kv);
    free(s->block_table);
    free(s->pos);
    free(s->seq);
    free(s->rows);
    memset(s, 0, sizeof(*s));
}

/* Append tokens in steps of at most s->chunk; see generate.h for the logits contract. */
int seq_feed(seq_t *s, const int32_t *tokens, int32_t n, bool all_logits, float *logits)
{
    int rc = 0;
    if (n <= 0) return n == 0 ? 0 : STRATA_EINVAL_INPUT;
    if ((int64_t)s->n_past + n > s->capacity) return STRATA_ETOOLARGE;
    const int32_t *tables[1] = {s->block_table};
    size_t vocab = (size_t)s->m->cfg.vocab;
    for (int32_t done = 0; done < n;) {
        int32_t step = n - done < s->chunk ? n - done : s->chunk;
        bool last = done + step == n;
        for (int32_t i = 0; i < step; i++) {
            s->pos[i] = s->n_past + i;
            s->rows[i] = i;
        }
        batch_t b = {
            .n_tokens = step,
            .tokens = tokens + done,
            .pos = s->pos,
            .seq = s->seq,
            .block_tables = tables,
            .n_logits = 0,
            .logit_rows = s->rows,
        };
        float *out = NULL;
        if (logits && all_logits) {
            b.n_logits = step;
            out = logits + (size_t)done * vocab;
        } else if (logits && last) {
            b.n_logits = 1;
            b.logit_rows = s->rows + step - 1;
            out = logits;
        }
        CHECK(model_forward(s->fwd, &s->kv, &b, out));
        s->n_past += step;
        done += step;
    }
    return 0;
fail:
    return rc;
}

/* Prefill then decode one sequence; see generate.h. */
int generate_tokens(const model_t *m, tpool_t *pool, const int32_t *prompt, int32_t n_prompt, int32_t max_new,
                    const sampler_params_t *p, int32_t chunk, int32_t *out, int32_t *n_out, gen_stats_t *st)
{
    int rc = 0;
    seq_t s;
    memset(&s, 0, sizeof(s));
    float *logits = NULL;
    *n_out = 0;
    gen_stats_t stats = {0, 0, n_prompt, 0};
    if (st) *st = stats;
    if (n_prompt <= 0 || max_new < 0) return STRATA_EINVAL_INPUT;
    if (max_new == 0) return 0;
    if (chunk <= 0) chunk = n_prompt;
    sampler_rng_t rng;
    sampler_rng_seed(&rng, p->seed);
    /* the last sampled token is never fed back, so the cache needs n_prompt + max_new - 1 */
    CHECK(seq_init(&s, m, pool, n_prompt + max_new - 1, chunk));
    logits = malloc((size_t)m->cfg.vocab * sizeof(float));
    if (!logits) {
        rc = STRATA_ENOMEM;
        goto fail;
    }
    double t0 = strata_now();
    CHECK(seq_feed(&s, prompt, n_prompt, false, logits));
    double t1 = strata_now();
    stats.prefill_s = t1 - t0;
    for (int32_t i = 0; i < max_new; i++) {
        double u = sampler_rng_uniform(&rng);
        int32_t tok = cpu_sample(logits, m->cfg.vocab, p->temperature, p->top_k, p->top_p, u);
        out[(*n_out)++] = tok;
        if (!p->ignore_eos && model_is_eos(&m->cfg, tok)) break;
        if (i + 1 == max_new) break;
        CHECK(seq_feed(&s, &tok, 1, false, logits));
        stats.n_decode++;
    }
    stats.decode_s = strata_now() - t1;
    if (st) *st = stats;
    free(logits);
    seq_free(&s);
    return 0;
fail:
    free(logits);
    seq_free(&s);
    return rc;
}
