/* generate.h - one sequence at a time on top of model_forward: a KV cache with an identity
 * block table, chunked prefill, decode, and a seeded sampler. Used by `strata eval`,
 * `strata generate`, tests and benchmarks; the services batch many sequences themselves.
 */
#ifndef STRATA_GENERATE_H
#define STRATA_GENERATE_H

#include <stdbool.h>
#include <stdint.h>

#include "model/model.h"

/* xoshiro256** seeded through splitmix64; any seed (0 included) is valid. */
typedef struct {
    uint64_t s[4];
} sampler_rng_t;

void sampler_rng_seed(sampler_rng_t *r, uint64_t seed);
/* Uniform double in [0, 1) with 53 random bits. */
double sampler_rng_uniform(sampler_rng_t *r);

typedef struct {
    float temperature; /* <= 0: greedy */
    int32_t top_k;     /* <= 0: off */
    float top_p;       /* >= 1: off */
    uint64_t seed;
    bool ignore_eos;   /* keep going past every id of cfg.eos_ids */
} sampler_params_t;

/* Greedy defaults: temperature 0, top_k 0, top_p 1, seed 0. */
void sampler_params_default(sampler_params_t *p);

/* Most alternatives sampler_logprobs returns. */
#define SAMPLER_MAX_TOP 20

/* Log-probabilities under the model's own distribution softmax(logits[vocab]), before any
 * temperature, top-k or top-p (as OpenAI's API reports them): returns token tok's; top_ids[k]
 * and top_lp[k] (k in 0..SAMPLER_MAX_TOP, at most vocab) receive the k most likely tokens, most
 * likely first (ties to the lower id), and theirs. Each value is logit - logsumexp(logits) with
 * the sum in double, so it is <= 0 and the exps of all vocab values add up to 1 within
 * rounding. One pass for the sum and one for the top k; logits are only read. */
float sampler_logprobs(const float *logits, int vocab, int32_t tok, int k, int32_t *top_ids, float *top_lp);

/* One sequence: positions 0..capacity-1 in a private KV cache. */
typedef struct {
    const model_t *m;
    forward_ctx_t *fwd;
    kv_cache_t kv;
    int32_t *block_table;  /* [kv.n_blocks] identity: block i holds positions i*bs.. */
    int32_t capacity;      /* tokens the cache holds */
    int32_t chunk;         /* most tokens one model_forward step carries */
    int32_t n_past;        /* tokens already in the cache */
    /* step arrays, [chunk] each */
    int32_t *pos, *seq, *rows;
} seq_t;

/* A sequence for up to `capacity` tokens, stepping at most `chunk` tokens at a time.
 * pool may be NULL. Returns 0 or <0. */
int seq_init(seq_t *s, const model_t *m, tpool_t *pool, int32_t capacity, int32_t chunk);
void seq_free(seq_t *s);
/* Append n tokens (split into steps of at most chunk). If all_logits, logits receives
 * [n][vocab] (one row per token); else, if logits != NULL, [1][vocab] for the last token.
 * Returns 0 or <0 (STRATA_ETOOLARGE when capacity would be exceeded). */
int seq_feed(seq_t *s, const int32_t *tokens, int32_t n, bool all_logits, float *logits);

/* Wall time of a generate_tokens call, split into its phases. */
typedef struct {
    double prefill_s;     /* prompt steps, up to the first token's logits */
    double decode_s;      /* the one-token steps after it */
    int32_t n_prompt;
    int32_t n_decode;     /* decode steps run (tokens generated - 1, or fewer on EOS) */
} gen_stats_t;

/* Prefill prompt[n_prompt], then sample up to max_new tokens into out[max_new] (greedy by
 * default), stopping after any id of cfg.eos_ids unless p->ignore_eos. *n_out = tokens written.
 * chunk bounds the prefill step size (<= 0: whole prompt in one step). st may be NULL.
 * Returns 0 or <0. */
int generate_tokens(const model_t *m, tpool_t *pool, const int32_t *prompt, int32_t n_prompt, int32_t max_new,
                    const sampler_params_t *p, int32_t chunk, int32_t *out, int32_t *n_out, gen_stats_t *st);

#endif
