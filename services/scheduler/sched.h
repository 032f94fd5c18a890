/* sched.h - the scheduler's core: every request's state and the step plans, without I/O.
 *
 * The scheduler is the source of truth for each request: prompt, generated tokens, sampling
 * parameters (the executor's RNG draw for a token is a function of (seed, n_sampled)), and
 * the KV block table. One plan is in flight at a time; sched_plan() builds it, the service
 * sends it, and sched_apply() takes the executor's sampled tokens.
 *
 * Batching (continuous, with a token budget per step):
 *   1. every running sequence that is decoding (one token to feed) gets its token;
 *   2. running sequences still prefilling get chunks from what is left of the budget
 *      (chunked prefill: a long prompt spreads over several steps, decodes keep flowing);
 *   3. waiting requests are admitted in arrival order while the budget, max_seqs and the
 *      free KV blocks allow (keeping one free block per running sequence for its growth).
 * So requests join and leave between steps, and sequences of different lengths, prefill
 * chunks and decode tokens share one step.
 *
 * KV blocks are paged: block b of a sequence holds positions b*block_size ... A sequence that
 * needs a block when none is free preempts the newest running sequence not in the plan
 * (possibly itself): its blocks are freed and it goes back to the front of the waiting queue
 * to be recomputed later (prefill of prompt + generated tokens). The oldest sequence always
 * progresses, because max_context <= kv_blocks * block_size (less a window's blocks, below).
 *
 * Window tables (a model with sliding-window layers, sched_opts_t.sliding_window = W > 0): each
 * sequence has a second block table, indexed as the first, from the same free blocks. The
 * sliding layers keep their K/V in it, the other layers in the main table; a step grows both
 * (a block of positions costs one block per table, which admission, growth and the reserve
 * count). After each step the blocks that lie entirely below the next query's window
 * (positions < n_computed - W + 1) go back to the free list and their entries become -1, so a
 * sequence holds at most ceil(W / block_size) + 1 window blocks between steps, whatever its
 * length (a prefill chunk's blocks stay until the step after it). An executor restart frees a
 * windowed sequence's blocks (the replay needs the freed ones again). Without sliding layers
 * there is no window table and nothing of this costs anything.
 *
 * An executor restart loses the KV contents: sched_reset_kv() drops the plan in flight and
 * sets every running sequence back to "nothing computed", so the next steps re-prefill them.
 * With deterministic sampling the continuation is the same as without the restart.
 *
 * Finished requests (done, canceled) are kept for retain_s seconds so that a resume (after a
 * router restart) can deliver their tokens and done again.
 *
 * A request that asks for log-probabilities (msg_submit_t.logprobs) has them asked of every step
 * that samples for it, and keeps each generated token's with the token (so a resume delivers them
 * too); the executor's result must carry them for it, else the request ends with an error.
 */
#ifndef STRATA_SCHED_H
#define STRATA_SCHED_H

#include <stdbool.h>
#include <stdint.h>

#include "proto/msg.h"

typedef struct {
    int32_t max_batch_tokens;  /* tokens in one step, >= 1 */
    int32_t max_seqs;          /* running sequences at most, >= 1 */
    int32_t kv_blocks;         /* blocks in the executor's KV cache, >= 1 */
    int32_t block_size;        /* tokens per block, >= 1 */
    int32_t max_context;       /* positions per sequence (prompt + generated); clamped to kv_blocks*block_size,
                                  less a window's blocks with window tables */
    int32_t sliding_window;    /* tokens a sliding-window layer attends to, itself included (0: no layer
                                  slides): each sequence gets a window table; 0 after sched_create when
                                  no query's window would start past position 0 within max_context */
    int32_t vocab;             /* token ids are in [0, vocab) */
    int32_t n_eos;             /* [0, MSG_MAX_EOS]: ids that end a request (0: none) */
    int32_t eos_ids[MSG_MAX_EOS]; /* [n_eos] a sampled one finishes the request with "stop", unless ignore_eos */
    int32_t max_live;          /* waiting + running requests above this: submit is refused with busy */
    double retain_s;           /* finished requests kept this long for resume */
} sched_opts_t;

/* The log-probabilities of n tokens of one request (sched_sink_t.tokens). */
typedef struct {
    const float *logprobs;      /* [n] each token's */
    int32_t top_n;              /* alternatives per token */
    const int32_t *top_tokens;  /* [n][top_n] */
    const float *top_logprobs;  /* [n][top_n] */
} sched_lp_t;

/* Where events for the router go. Called from inside sched_* calls. */
typedef struct {
    /* n new generated tokens of request id, the first being generated token number index; lp
     * their log-probabilities when the request asked, else NULL */
    void (*tokens)(void *ctx, uint64_t id, int64_t index, const int32_t *toks, int32_t n, const sched_lp_t *lp);
    void (*done)(void *ctx, uint64_t id, const msg_done_t *d);
    void (*error)(void *ctx, uint64_t id, msg_errcode_t code, const char *text);
    void *ctx;
} sched_sink_t;

typedef struct {
    uint64_t submitted, finished, canceled, failed, resubmits;
    uint64_t steps, prefill_tokens, decode_tokens, generated;
    uint64_t mixed_steps;      /* steps holding both a prefill chunk and a decode token */
    uint64_t preemptions, replayed, kv_resets, poisoned;
    int32_t waiting, running, retained, kv_free;
    int32_t kv_win_used;       /* blocks held by window tables now (included in kv_blocks - kv_free) */
    int32_t kv_win_seq_max;    /* most window blocks one sequence held after a step's freeing */
    int32_t step_tokens_max, step_seqs_max;
} sched_counters_t;

typedef struct sched sched_t;

#define SCHED_MAX_LOSSES 3

/* Defaults for the fields not tied to the model: budget 256, 64 seqs, 2048 x 16 blocks,
 * max_live 4096, retain 60 s. */
void sched_opts_default(sched_opts_t *o);
/* A scheduler under o (copied; max_context is clamped). Returns 0 or <0. */
int sched_create(sched_t **out, const sched_opts_t *o, const sched_sink_t *sink);
void sched_free(sched_t *s);
/* The effective options (max_context after clamping). */
const sched_opts_t *sched_opts(const sched_t *s);

/* A new request id (internal id, see PROTOCOL.md). Returns MSG_E_NONE, or the error code with
 * text[tlen] (duplicate: id is live with another request; the same request again is
 * accepted and changes nothing; invalid_param: bad token id or empty prompt;
 * context_overflow: prompt >= max_context; busy: too many live requests). max_tokens is
 * clamped so that prompt + generated fits max_context. A finished id is replaced. */
msg_errcode_t sched_submit(sched_t *s, uint64_t id, const msg_submit_t *sub, double now, char *text, size_t tlen);
/* Stop request id: done(cancel) for a live one, done again for a retained finished one.
 * MSG_E_NOT_FOUND if unknown. */
msg_errcode_t sched_cancel(sched_t *s, uint64_t id, double now);
/* Send request id's generated tokens from index `from` as one tokens event, then done if it
 * has finished. MSG_E_NOT_FOUND if unknown. */
msg_errcode_t sched_resume(sched_t *s, uint64_t id, int64_t from);

/* True if a plan could be made now (work waiting or running and none in flight). */
bool sched_has_work(const sched_t *s);
/* True while a plan is in flight. */
bool sched_inflight(const sched_t *s);
/* Build the next plan into *plan (its arrays belong to s and stay valid until the next
 * sched_* call) for executor instance `instance`, and mark it in flight. Returns the number of
 * sequences, 0 if there is nothing to do (then nothing is in flight). */
int sched_plan(sched_t *s, uint64_t instance, msg_step_t *plan, double now);
/* Apply the executor's result of the plan in flight: tokens in plan order. Returns 0, or
 * STRATA_EINVAL_INPUT if r does not belong to the plan in flight (nothing changes). */
int sched_apply(sched_t *s, const msg_result_t *r, double now);
/* The plan in flight was refused for its own sake (not a restart): its requests end with an
 * error event (code, text). */
void sched_fail_inflight(sched_t *s, msg_errcode_t code, const char *text, double now);
/* The executor lost its KV cache (restart): drop the plan in flight and recompute every
 * running sequence from its first token. A sequence whose plans were lost twice in a row runs
 * alone in its next plans; one lost SCHED_MAX_LOSSES times in a row (a request that kills the
 * executor, say) ends with an error event instead of being replayed again. */
void sched_reset_kv(sched_t *s, double now);
/* Forget finished requests older than retain_s. */
void sched_expire(sched_t *s, double now);

void sched_get_counters(const sched_t *s, sched_counters_t *c);
/* Check the bookkeeping (every block free or owned exactly once, by one table of one running
 * sequence; block tables cover what is computed; a window table holds exactly the blocks some
 * later query's window reaches; list membership matches states). 0, or <0 with text. */
int sched_check(const sched_t *s, char *text, size_t tlen);

#endif
