/* sched.c - requests, continuous batching, paged KV blocks, replay (see sched.h). */
#include "services/scheduler/sched.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum { R_WAITING = 0, R_RUNNING, R_FINISHED } rstate_t;

typedef struct {
    uint64_t id;
    uint64_t serial;          /* unique per request object: a replaced id is another request */
    rstate_t state;
    int32_t *toks;            /* [cap] prompt then generated ids */
    int32_t n_prompt, n_gen, cap;
    int32_t max_tokens;
    msg_sampling_t samp;
    bool ignore_eos;
    bool logprobs;            /* the request asked for log-probabilities */
    int32_t top_n;            /* ... with this many alternatives a token (top_logprobs, at most the vocab) */
    float *lp;                /* [lp_cap] each generated token's log-probability */
    int32_t *lp_tok;          /* [lp_cap][top_n] its alternatives */
    float *lp_top;            /* [lp_cap][top_n] theirs */
    int32_t lp_cap;           /* generated tokens the three have room for */
    int32_t n_computed;       /* leading tokens whose K/V the executor holds */
    int32_t *blocks;          /* [max_blocks] KV block table; [n_blocks] used */
    int32_t n_blocks;
    int32_t *win;             /* [max_blocks] window table of the sliding layers (NULL without window
                               * tables): [n_blocks] entries, indexed as blocks; -1 where freed */
    int32_t win_lo;           /* win[0 .. win_lo) are -1: below every later query's window */
    uint64_t preempt_round;   /* plan round in which it was preempted (not re-admitted in it) */
    uint64_t plan_round;      /* plan round in which it was put into the plan */
    int32_t losses;           /* plans holding it lost with the executor in a row */
    msg_finish_t finish;
    double t_submit, t_sched, t_first, t_done;
} req_t;

typedef struct {
    uint64_t key;             /* 0 = empty (request ids are hashes; 0 is refused) */
    req_t *req;
} slot_t;

/* What the plan in flight asked of each sequence. */
typedef struct {
    uint64_t id, serial;
    int32_t n_fed;
    bool sample;
} fly_t;

struct sched {
    sched_opts_t o;
    sched_sink_t sink;
    int32_t max_blocks;       /* blocks a sequence may hold: ceil(max_context / block_size) */
    int32_t max_running;
    uint64_t serials, round;

    slot_t *slots;            /* [n_slots] open addressing by id, linear probing */
    size_t n_slots, n_reqs;

    req_t **running;          /* [max_running] admission order */
    int32_t n_running;
    req_t **waiting;          /* [cap_waiting] FIFO; preempted ones go to the front */
    int32_t n_waiting, cap_waiting;
    req_t **finished;         /* [cap_finished] in finishing order, for expiry */
    int32_t n_finished, cap_finished;

    int32_t *free_blocks;     /* [kv_blocks] stack, shared by the main and the window tables */
    int32_t n_free;
    int32_t tables;           /* block tables a sequence holds: 1, or 2 with window tables (o.sliding_window > 0) */
    int32_t win_used;         /* blocks held by window tables */

    /* the plan in flight */
    bool inflight;
    int32_t n_fly;
    fly_t *fly;               /* [MSG_MAX_STEP_SEQS] */
    int32_t *lp_off;          /* [MSG_MAX_STEP_SEQS] sched_apply: where each row's alternatives start */
    msg_step_seq_t *pseqs;    /* [MSG_MAX_STEP_SEQS] */

    sched_counters_t c;
};

void sched_opts_default(sched_opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->max_batch_tokens = 256;
    o->max_seqs = 64;
    o->kv_blocks = 2048;
    o->block_size = 16;
    o->max_context = 2048 * 16;
    o->vocab = 1;
    o->max_live = 4096;
    o->retain_s = 60;
}

/* t is one of the model's eos ids. */
static bool s_is_eos(const sched_opts_t *o, int32_t t)
{
    for (int32_t i = 0; i < o->n_eos; i++)
        if (o->eos_ids[i] == t) return true;
    return false;
}

/* ---- request table ---- */

static size_t s_home(size_t n_slots, uint64_t id) { return (size_t)(id * 0x9E3779B97F4A7C15ull) & (n_slots - 1); }

static req_t *s_find(const sched_t *s, uint64_t id)
{
    for (size_t i = s_home(s->n_slots, id);; i = (i + 1) & (s->n_slots - 1)) {
        if (s->slots[i].key == id) return s->slots[i].req;
        if (s->slots[i].key == 0) return NULL;
    }
}

static void s_put(slot_t *slots, size_t n_slots, req_t *r)
{
    size_t i = s_home(n_slots, r->id);
    while (slots[i].key != 0) i = (i + 1) & (n_slots - 1);
    slots[i].key = r->id;
    slots[i].req = r;
}

static int s_insert(sched_t *s, req_t *r)
{
    if ((s->n_reqs + 1) * 2 > s->n_slots) {
        size_t n = s->n_slots * 2;
        slot_t *ns = calloc(n, sizeof *ns);
        if (!ns) return STRATA_ENOMEM;
        for (size_t i = 0; i < s->n_slots; i++)
            if (s->slots[i].key) s_put(ns, n, s->slots[i].req);
        free(s->slots);
        s->slots = ns;
        s->n_slots = n;
    }
    s_put(s->slots, s->n_slots, r);
    s->n_reqs++;
    return 0;
}

static void s_remove(sched_t *s, uint64_t id)
{
    size_t m = s->n_slots - 1, i = s_home(s->n_slots, id);
    while (s->slots[i].key != id) {
        if (s->slots[i].key == 0) return;
        i = (i + 1) & m;
    }
    /* backward-shift deletion keeps probe runs intact without tombstones */
    size_t j = i;
    for (;;) {
        j = (j + 1) & m;
        if (s->slots[j].key == 0) break;
        size_t h = s_home(s->n_slots, s->slots[j].key);
        bool between = i <= j ? (i < h && h <= j) : (i < h || h <= j);
        if (between) continue;
        s->slots[i] = s->slots[j];
        i = j;
    }
    s->slots[i].key = 0;
    s->slots[i].req = NULL;
    s->n_reqs--;
}

static void s_req_free(req_t *r)
{
    if (!r) return;
    free(r->toks);
    free(r->blocks);
    free(r->win);
    free(r->lp);
    free(r->lp_tok);
    free(r->lp_top);
    free(r);
}

/* Room for the log-probabilities of r's generated token number n_gen. 0 or STRATA_ENOMEM. */
static int s_lp_grow(req_t *r)
{
    if (r->n_gen < r->lp_cap) return 0;
    int32_t cap = r->lp_cap ? 2 * r->lp_cap : 64;
    if (cap > r->max_tokens) cap = r->max_tokens;
    if (msg_lp_reserve(&r->lp, &r->lp_tok, &r->lp_top, (size_t)cap, r->top_n)) return STRATA_ENOMEM;
    r->lp_cap = cap;
    return 0;
}

/* The sink's view of r's log-probabilities from generated token `from` on, NULL if it asked none. */
static const sched_lp_t *s_lp_view(const req_t *r, int32_t from, sched_lp_t *v)
{
    if (!r->logprobs) return NULL;
    v->logprobs = r->lp ? r->lp + from : (const float *)"";
    v->top_n = r->top_n;
    v->top_tokens = r->lp_tok ? r->lp_tok + (size_t)from * r->top_n : (const int32_t *)"";
    v->top_logprobs = r->lp_top ? r->lp_top + (size_t)from * r->top_n : (const float *)"";
    return v;
}

/* ---- lists ---- */

static void s_list_del(req_t **v, int32_t *n, const req_t *r)
{
    for (int32_t i = 0; i < *n; i++)
        if (v[i] == r) {
            memmove(v + i, v + i + 1, (size_t)(*n - i - 1) * sizeof *v);
            (*n)--;
            return;
        }
}

static int s_grow(req_t ***v, int32_t *cap, int32_t need)
{
    if (need <= *cap) return 0;
    int32_t nc = *cap ? *cap : 64;
    while (nc < need) nc *= 2;
    req_t **nv = realloc(*v, (size_t)nc * sizeof *nv);
    if (!nv) return STRATA_ENOMEM;
    *v = nv;
    *cap = nc;
    return 0;
}

static int s_wait_push(sched_t *s, req_t *r, bool front)
{
    int rc = s_grow(&s->waiting, &s->cap_waiting, s->n_waiting + 1);
    if (rc < 0) return rc;
    if (front) {
        memmove(s->waiting + 1, s->waiting, (size_t)s->n_waiting * sizeof *s->waiting);
        s->waiting[0] = r;
    } else {
        s->waiting[s->n_waiting] = r;
    }
    s->n_waiting++;
    return 0;
}

/* ---- blocks ---- */

static void s_release_blocks(sched_t *s, req_t *r)
{
    for (int32_t i = 0; i < r->n_blocks; i++) s->free_blocks[s->n_free++] = r->blocks[i];
    for (int32_t i = r->win_lo; r->win && i < r->n_blocks; i++) {
        STRATA_ASSERT(r->win[i] >= 0);
        s->free_blocks[s->n_free++] = r->win[i];
        s->win_used--;
    }
    r->n_blocks = 0;
    r->win_lo = 0;
    r->n_computed = 0;
}

/* Give r blocks until they cover `tokens` positions, as far as free blocks allow: one for each
 * of its tables per block of positions (the window table grows with the main one). */
static void s_take_blocks(sched_t *s, req_t *r, int32_t tokens)
{
    int32_t need = (tokens + s->o.block_size - 1) / s->o.block_size;
    STRATA_ASSERT(need <= s->max_blocks);
    while (r->n_blocks < need && s->n_free >= s->tables) {
        if (r->win) {
            r->win[r->n_blocks] = s->free_blocks[--s->n_free];
            s->win_used++;
        }
        r->blocks[r->n_blocks++] = s->free_blocks[--s->n_free];
    }
}

/* The window blocks of r below every later query's window, back to the free list: the next
 * query, at position n_computed, attends from n_computed - W + 1 on (sliding_window W, the query
 * itself included), so block j is dead once (j + 1) * block_size <= n_computed - W + 1. Called
 * whenever n_computed advances; a chunk's blocks stay until the step after it. */
static void s_free_window(sched_t *s, req_t *r)
{
    if (!r->win) return;
    const int64_t lo = (int64_t)r->n_computed - s->o.sliding_window + 1;
    while (r->win_lo < r->n_blocks && (int64_t)(r->win_lo + 1) * s->o.block_size <= lo) {
        s->free_blocks[s->n_free++] = r->win[r->win_lo];
        r->win[r->win_lo++] = -1;
        s->win_used--;
    }
    int32_t held = r->n_blocks - r->win_lo;
    if (held > s->c.kv_win_seq_max) s->c.kv_win_seq_max = held;
}

/* ---- events ---- */

static void s_emit_done(sched_t *s, const req_t *r)
{
    msg_done_t d;
    memset(&d, 0, sizeof d);
    d.finish = r->finish;
    d.prompt_tokens = r->n_prompt;
    d.completion_tokens = r->n_gen;
    d.queue_ms = r->t_sched > 0 ? (r->t_sched - r->t_submit) * 1e3 : 0;
    d.ttft_ms = r->t_first > 0 ? (r->t_first - r->t_submit) * 1e3 : 0;
    d.total_ms = (r->t_done - r->t_submit) * 1e3;
    if (d.queue_ms < 0) d.queue_ms = 0;
    if (d.ttft_ms < 0) d.ttft_ms = 0;
    if (d.total_ms < 0) d.total_ms = 0;
    if (s->sink.done) s->sink.done(s->sink.ctx, r->id, &d);
}

/* Take r out of the waiting/running lists and free its blocks. A finished request (fin !=
 * NONE) is kept for resume; a failed one (NONE) is forgotten, so r may be freed here. */
static void s_retire(sched_t *s, req_t *r, msg_finish_t fin, double now)
{
    if (r->state == R_RUNNING) s_list_del(s->running, &s->n_running, r);
    else if (r->state == R_WAITING) s_list_del(s->waiting, &s->n_waiting, r);
    s_release_blocks(s, r);
    free(r->blocks);
    free(r->win);
    r->blocks = r->win = NULL;
    r->state = R_FINISHED;
    r->finish = fin;
    r->t_done = now;
    s->c.finished++;
    if (fin == MSG_FINISH_CANCEL) s->c.canceled++;
    if (fin != MSG_FINISH_NONE && s_grow(&s->finished, &s->cap_finished, s->n_finished + 1) == 0) {
        s->finished[s->n_finished++] = r;
        return;
    }
    s_remove(s, r->id);
    s_req_free(r);
}

/* Whether r ends by length once it has n_gen tokens: its max_tokens, or the context full
 * (sched_apply finishes it there; s_add marks the plan's last token). */
static bool s_length_reached(const sched_t *s, const req_t *r, int32_t n_gen)
{
    return n_gen >= r->max_tokens || r->n_prompt + n_gen >= s->o.max_context;
}

/* Finish r: done to the router, then retire it. */
static void s_finish(sched_t *s, req_t *r, msg_finish_t fin, double now)
{
    r->finish = fin;
    r->t_done = now;
    s_emit_done(s, r);
    s_retire(s, r, fin, now);
}

/* ---- create ---- */

int sched_create(sched_t **out, const sched_opts_t *o, const sched_sink_t *sink)
{
    *out = NULL;
    if (o->max_batch_tokens < 1 || o->max_seqs < 1 || o->kv_blocks < 1 || o->block_size < 1 || o->max_context < 2 ||
        o->vocab < 1 || o->n_eos < 0 || o->n_eos > MSG_MAX_EOS)
        return STRATA_EINVAL_INPUT;
    sched_t *s = calloc(1, sizeof *s);
    if (!s) return STRATA_ENOMEM;
    s->o = *o;
    if (sink) s->sink = *sink;
    /* Window tables: a sequence's sliding-layer K/V in blocks of its own, freed as its window moves
     * on, from the same pool. A lone sequence must always fit: its main table for max_context and
     * a window of W - 1 positions (ceil((W - 1) / block_size) blocks) plus the block of the next
     * one, which caps max_context below kv_blocks * block_size. When no query's window could start
     * past position 0 within the context, the window table would free nothing: none. */
    int64_t cap = (int64_t)o->kv_blocks * o->block_size;
    s->tables = 1;
    if (o->sliding_window > 0) {
        int64_t win_max = ((int64_t)o->sliding_window - 1 + o->block_size - 1) / o->block_size + 1;
        int64_t wcap = ((int64_t)o->kv_blocks - win_max) * o->block_size;
        int64_t mc = s->o.max_context < wcap ? s->o.max_context : wcap;
        if (mc >= 2 && o->sliding_window < mc) {
            cap = wcap;
            s->tables = 2;
        }
    }
    if (s->tables == 1) s->o.sliding_window = 0;
    if (s->o.max_context > cap) s->o.max_context = (int32_t)cap;
    if (s->o.max_live < 1) s->o.max_live = 1;
    s->max_blocks = (s->o.max_context + o->block_size - 1) / o->block_size;
    s->max_running = o->max_seqs;
    if (s->max_running > o->max_batch_tokens) s->max_running = o->max_batch_tokens; /* every decode fits a step */
    if (s->max_running > MSG_MAX_STEP_SEQS) s->max_running = MSG_MAX_STEP_SEQS;
    s->n_slots = 1024;
    s->slots = calloc(s->n_slots, sizeof *s->slots);
    s->running = calloc((size_t)s->max_running, sizeof *s->running);
    s->free_blocks = malloc((size_t)o->kv_blocks * sizeof *s->free_blocks);
    s->fly = calloc(MSG_MAX_STEP_SEQS, sizeof *s->fly);
    s->pseqs = calloc(MSG_MAX_STEP_SEQS, sizeof *s->pseqs);
    s->lp_off = calloc(MSG_MAX_STEP_SEQS, sizeof *s->lp_off);
    if (!s->slots || !s->running || !s->free_blocks || !s->fly || !s->pseqs || !s->lp_off) {
        sched_free(s);
        return STRATA_ENOMEM;
    }
    /* the stack pops block 0 first */
    for (int32_t i = 0; i < o->kv_blocks; i++) s->free_blocks[i] = o->kv_blocks - 1 - i;
    s->n_free = o->kv_blocks;
    *out = s;
    return 0;
}

void sched_free(sched_t *s)
{
    if (!s) return;
    if (s->slots)
        for (size_t i = 0; i < s->n_slots; i++) s_req_free(s->slots[i].req);
    free(s->slots);
    free(s->running);
    free(s->waiting);
    free(s->finished);
    free(s->free_blocks);
    free(s->fly);
    free(s->pseqs);
    free(s->lp_off);
    free(s);
}

const sched_opts_t *sched_opts(const sched_t *s) { return &s->o; }

/* ---- requests ---- */

__attribute__((format(printf, 4, 5)))
static msg_errcode_t s_refuse(msg_errcode_t code, char *text, size_t tlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, tlen, fmt, ap);
    va_end(ap);
    return code;
}

static void s_forget(sched_t *s, req_t *r)
{
    STRATA_ASSERT(r->state == R_FINISHED);
    s_list_del(s->finished, &s->n_finished, r);
    s_remove(s, r->id);
    s_req_free(r);
}

msg_errcode_t sched_submit(sched_t *s, uint64_t id, const msg_submit_t *sub, double now, char *text, size_t tlen)
{
    text[0] = 0;
    if (id == 0) return s_refuse(MSG_E_INVALID_PARAM, text, tlen, "submit: field 'id': 0 is not a request id");
    req_t *old = s_find(s, id);
    if (old && old->state != R_FINISHED) {
        /* The same request again is a resubmission (a router that saw this scheduler start
         * resubmits what it has in flight, while its earlier submit, queued in ZeroMQ when the
         * old scheduler died, reached us too): it keeps running; the router drops the token
         * indices it already has. Another request under a live id is a duplicate. */
        int32_t mt = sub->max_tokens;
        if (sub->n_prompt > 0 && sub->n_prompt < s->o.max_context && mt > s->o.max_context - sub->n_prompt)
            mt = s->o.max_context - sub->n_prompt;
        if (sub->n_prompt == old->n_prompt && sub->prompt &&
            !memcmp(sub->prompt, old->toks, (size_t)old->n_prompt * sizeof *old->toks) && mt == old->max_tokens &&
            sub->samp.temperature == old->samp.temperature && sub->samp.top_p == old->samp.top_p &&
            sub->samp.top_k == old->samp.top_k && sub->samp.seed == old->samp.seed && sub->ignore_eos == old->ignore_eos &&
            sub->logprobs == old->logprobs &&
            (!sub->logprobs || (sub->top_logprobs < s->o.vocab ? sub->top_logprobs : s->o.vocab) == old->top_n)) {
            s->c.resubmits++;
            return MSG_E_NONE;
        }
        return s_refuse(MSG_E_DUPLICATE, text, tlen, "submit: another request %llu is already live", (unsigned long long)id);
    }
    if (sub->n_prompt < 1 || !sub->prompt)
        return s_refuse(MSG_E_INVALID_PARAM, text, tlen, "submit: field 'prompt': at least one token is needed");
    for (int32_t i = 0; i < sub->n_prompt; i++)
        if (sub->prompt[i] < 0 || sub->prompt[i] >= s->o.vocab)
            return s_refuse(MSG_E_INVALID_PARAM, text, tlen, "submit: field 'prompt[%d]': id %d is outside the vocab [0, %d)", i,
                            sub->prompt[i], s->o.vocab);
    if (sub->n_prompt >= s->o.max_context)
        return s_refuse(MSG_E_CONTEXT_OVERFLOW, text, tlen, "submit: the prompt has %d tokens; the context holds %d (prompt + answer)",
                        sub->n_prompt, s->o.max_context);
    if (sub->max_tokens < 1)
        return s_refuse(MSG_E_INVALID_PARAM, text, tlen, "submit: field 'max_tokens': must be >= 1, got %d", sub->max_tokens);
    if (s->n_running + s->n_waiting >= s->o.max_live)
        return s_refuse(MSG_E_BUSY, text, tlen, "scheduler: %d requests live (limit %d)", s->n_running + s->n_waiting,
                        s->o.max_live);
    if (old) s_forget(s, old);

    req_t *r = calloc(1, sizeof *r);
    if (!r) return s_refuse(MSG_E_INTERNAL, text, tlen, "out of memory");
    r->id = id;
    r->serial = ++s->serials;
    r->state = R_WAITING;
    r->n_prompt = sub->n_prompt;
    r->max_tokens = sub->max_tokens;
    if (r->max_tokens > s->o.max_context - r->n_prompt) r->max_tokens = s->o.max_context - r->n_prompt;
    r->cap = r->n_prompt + r->max_tokens;
    r->toks = malloc((size_t)r->cap * sizeof *r->toks);
    r->blocks = malloc((size_t)s->max_blocks * sizeof *r->blocks);
    if (s->tables == 2) r->win = malloc((size_t)s->max_blocks * sizeof *r->win);
    r->samp = sub->samp;
    r->ignore_eos = sub->ignore_eos;
    r->logprobs = sub->logprobs;
    r->top_n = !sub->logprobs ? 0 : sub->top_logprobs < s->o.vocab ? sub->top_logprobs : s->o.vocab;
    r->t_submit = now;
    /* room for every live request in the waiting list, so a preemption never needs to grow it */
    if (!r->toks || !r->blocks || (s->tables == 2 && !r->win) || s_grow(&s->waiting, &s->cap_waiting, s->n_running + s->n_waiting + 1) < 0 ||
        s_wait_push(s, r, false) < 0) {
        s_req_free(r);
        return s_refuse(MSG_E_INTERNAL, text, tlen, "out of memory");
    }
    if (s_insert(s, r) < 0) {
        s_list_del(s->waiting, &s->n_waiting, r);
        s_req_free(r);
        return s_refuse(MSG_E_INTERNAL, text, tlen, "out of memory");
    }
    memcpy(r->toks, sub->prompt, (size_t)r->n_prompt * sizeof *r->toks);
    s->c.submitted++;
    return MSG_E_NONE;
}

msg_errcode_t sched_cancel(sched_t *s, uint64_t id, double now)
{
    req_t *r = s_find(s, id);
    if (!r) return MSG_E_NOT_FOUND;
    if (r->state == R_FINISHED) {
        s_emit_done(s, r);
        return MSG_E_NONE;
    }
    /* If r is in the plan in flight, its result is ignored (serial check in sched_apply); its
     * blocks may be reused at once: the executor runs steps in order, and a sequence only
     * reads positions it wrote itself in earlier steps. */
    s_finish(s, r, MSG_FINISH_CANCEL, now);
    return MSG_E_NONE;
}

msg_errcode_t sched_resume(sched_t *s, uint64_t id, int64_t from)
{
    req_t *r = s_find(s, id);
    if (!r) return MSG_E_NOT_FOUND;
    if (from < 0) from = 0;
    if (from > r->n_gen) from = r->n_gen;
    sched_lp_t v;
    if (s->sink.tokens)
        s->sink.tokens(s->sink.ctx, id, from, r->toks + r->n_prompt + from, r->n_gen - (int32_t)from, s_lp_view(r, (int32_t)from, &v));
    if (r->state == R_FINISHED) s_emit_done(s, r);
    return MSG_E_NONE;
}

/* ---- planning ---- */

bool sched_inflight(const sched_t *s) { return s->inflight; }

bool sched_has_work(const sched_t *s) { return !s->inflight && (s->n_running > 0 || s->n_waiting > 0); }

static bool s_in_plan(const sched_t *s, const req_t *r) { return r->plan_round == s->round; }

/* Preempt by recompute: r loses its blocks and waits at the front of the queue. */
static void s_preempt(sched_t *s, req_t *r)
{
    s_list_del(s->running, &s->n_running, r);
    s_release_blocks(s, r);
    r->state = R_WAITING;
    r->preempt_round = s->round;
    if (s_wait_push(s, r, true) < 0) STRATA_ASSERT(!"waiting list growth failed"); /* cap >= live count: cannot fail */
    s->c.preemptions++;
}

/* The newest running sequence not in the plan, or NULL. */
static req_t *s_victim(const sched_t *s)
{
    for (int32_t i = s->n_running - 1; i >= 0; i--)
        if (!s_in_plan(s, s->running[i])) return s->running[i];
    return NULL;
}

static void s_add(sched_t *s, req_t *r, int32_t n, double now)
{
    int32_t len = r->n_prompt + r->n_gen;
    msg_step_seq_t *q = &s->pseqs[s->n_fly];
    memset(q, 0, sizeof *q);
    q->req = r->id;
    q->pos0 = r->n_computed;
    q->n_tokens = n;
    q->tokens = r->toks + r->n_computed;
    q->n_blocks = r->n_blocks;
    q->blocks = r->blocks;
    if (r->win) {
        q->n_win_blocks = r->n_blocks;
        q->win_blocks = r->win;
    }
    q->sample = r->n_computed + n == len;
    q->samp = r->samp;
    q->n_sampled = (uint64_t)r->n_gen;
    /* the token sampled ends the request by length: the executor guesses no step after it */
    q->last = q->sample && s_length_reached(s, r, r->n_gen + 1);
    q->logprobs = q->sample && r->logprobs;
    q->top_logprobs = q->logprobs ? r->top_n : 0;
    s->fly[s->n_fly] = (fly_t){r->id, r->serial, n, q->sample};
    r->plan_round = s->round;
    s->n_fly++;
    if (r->t_sched == 0) r->t_sched = now;
    if (len - r->n_computed == 1) s->c.decode_tokens += (uint64_t)n;
    else s->c.prefill_tokens += (uint64_t)n;
}

/* Tokens r may feed now, at most want: limited by its blocks plus the free ones (keeping
 * `reserve` free blocks), each further block of positions costing one block per table. */
static int32_t s_fit(const sched_t *s, const req_t *r, int32_t want, int32_t reserve)
{
    int64_t blocks = (int64_t)r->n_blocks + (s->n_free > reserve ? s->n_free - reserve : 0) / s->tables;
    int64_t room = blocks * s->o.block_size - r->n_computed;
    if (room < want) want = room > 0 ? (int32_t)room : 0;
    return want;
}

/* Schedule a running sequence: its decode token or a prefill chunk of at most budget tokens.
 * Preempts newer sequences when blocks run out. Returns tokens scheduled (0: none). */
static int32_t s_schedule_running(sched_t *s, req_t *r, int32_t budget, double now)
{
    int32_t len = r->n_prompt + r->n_gen;
    int32_t want = len - r->n_computed;
    STRATA_ASSERT(want >= 1);
    if (want > budget) want = budget;
    if (want <= 0) return 0;
    int32_t n;
    while ((n = s_fit(s, r, want, 0)) == 0) {
        req_t *v = s_victim(s);
        STRATA_ASSERT(v);  /* r itself is running and not in the plan */
        s_preempt(s, v);
        if (v == r) return 0;
    }
    s_take_blocks(s, r, r->n_computed + n);
    s_add(s, r, n, now);
    return n;
}

int sched_plan(sched_t *s, uint64_t instance, msg_step_t *plan, double now)
{
    memset(plan, 0, sizeof *plan);
    if (s->inflight) return 0;
    s->round++;
    s->n_fly = 0;
    int32_t budget = s->o.max_batch_tokens;

    /* 0. quarantine: a sequence whose plans were lost with the executor twice in a row runs
     * alone, so that a request that kills the executor fails by itself (third loss, see
     * sched_reset_kv) and the ones that shared its plans get a successful step */
    for (int32_t i = 0; i < s->n_running; i++) {
        req_t *r = s->running[i];
        if (r->losses < SCHED_MAX_LOSSES - 1) continue;
        if (s_schedule_running(s, r, budget, now) > 0) goto planned;
        break;
    }

    /* 1. decodes, 2. running prefills; both in admission order. A preemption while scheduling
     * running[i] removes the newest sequence not in the plan: one after i, or running[i]
     * itself (never an earlier one: running[i] is newer and not in the plan), so the index
     * stays valid once it is stepped back for the second case. */
    for (int pass = 0; pass < 2; pass++) {
        for (int32_t i = 0; i < s->n_running && budget > 0 && s->n_fly < MSG_MAX_STEP_SEQS; i++) {
            req_t *r = s->running[i];
            if (s_in_plan(s, r)) continue;
            int32_t left = r->n_prompt + r->n_gen - r->n_computed;
            if ((pass == 0) != (left == 1)) continue;
            int32_t n_before = s->n_running;
            budget -= s_schedule_running(s, r, budget, now);
            if (s->n_running < n_before && (i >= s->n_running || s->running[i] != r)) i--; /* r itself was preempted */
        }
    }
    /* 3. admissions, in arrival order (preempted ones first), not in the round they were preempted */
    while (s->n_waiting > 0 && budget > 0 && s->n_running < s->max_running && s->n_fly < MSG_MAX_STEP_SEQS) {
        req_t *r = s->waiting[0];
        if (r->preempt_round == s->round) break;
        int32_t reserve = s->n_running * s->tables; /* one block of growth per running sequence and table */
        int32_t len = r->n_prompt + r->n_gen;
        int32_t want = len < budget ? len : budget;
        int32_t n = s_fit(s, r, want, reserve);
        if (n <= 0) break;
        memmove(s->waiting, s->waiting + 1, (size_t)(s->n_waiting - 1) * sizeof *s->waiting);
        s->n_waiting--;
        r->state = R_RUNNING;
        s->running[s->n_running++] = r;
        s_take_blocks(s, r, n);
        s_add(s, r, n, now);
        budget -= n;
    }
planned:
    if (s->n_fly == 0) return 0;
    bool prefill = false, decode = false;
    for (int32_t i = 0; i < s->n_fly; i++) {
        if (s->pseqs[i].n_tokens > 1) prefill = true;
        else if (s->pseqs[i].pos0 > 0) decode = true;
    }
    s->c.mixed_steps += prefill && decode;
    s->inflight = true;
    plan->instance = instance;
    plan->n_seqs = s->n_fly;
    plan->seqs = s->pseqs;
    s->c.steps++;
    int32_t used = s->o.max_batch_tokens - budget;
    if (used > s->c.step_tokens_max) s->c.step_tokens_max = used;
    if (s->n_fly > s->c.step_seqs_max) s->c.step_seqs_max = s->n_fly;
    return s->n_fly;
}

/* Row i of the result's log-probabilities into r's, for its generated token number n_gen. An
 * error text when the row does not hold what r asked for (none, or another count). */
static const char *s_lp_take(req_t *r, const msg_lp_rows_t *lp, const int32_t *off, int32_t i)
{
    if (!lp->logprobs || i >= lp->n_logprobs || lp->top_n[i] != r->top_n)
        return "the executor returned no log-probabilities, or not as many alternatives as asked, for a request that asked for them";
    if (s_lp_grow(r) < 0) return "out of memory for the log-probabilities";
    r->lp[r->n_gen] = lp->logprobs[i];
    memcpy(r->lp_tok + (size_t)r->n_gen * r->top_n, lp->top_tokens + off[i], (size_t)r->top_n * sizeof *r->lp_tok);
    memcpy(r->lp_top + (size_t)r->n_gen * r->top_n, lp->top_logprobs + off[i], (size_t)r->top_n * sizeof *r->lp_top);
    return NULL;
}

int sched_apply(sched_t *s, const msg_result_t *res, double now)
{
    if (!s->inflight || res->n_seqs != s->n_fly) return STRATA_EINVAL_INPUT;
    for (int32_t i = 0; i < s->n_fly; i++)
        if (res->reqs[i] != s->fly[i].id || (s->fly[i].sample && res->tokens[i] < 0)) return STRATA_EINVAL_INPUT;
    /* where each row's alternatives start (the decoder checked that they add up) */
    int32_t *off = s->lp_off;
    for (int32_t i = 0, at = 0; res->lp.logprobs && i < s->n_fly; i++) {
        off[i] = at;
        at += res->lp.top_n[i] > 0 ? res->lp.top_n[i] : 0;
    }
    s->inflight = false;
    for (int32_t i = 0; i < s->n_fly; i++) {
        const fly_t *f = &s->fly[i];
        req_t *r = s_find(s, f->id);
        if (!r || r->serial != f->serial || r->state != R_RUNNING) continue; /* canceled meanwhile */
        r->n_computed += f->n_fed;
        r->losses = 0;
        s_free_window(s, r);
        if (!f->sample) continue;
        int32_t t = res->tokens[i];
        if (t >= s->o.vocab) {
            char text[128];
            snprintf(text, sizeof text, "executor sampled token %d outside the vocab [0, %d)", t, s->o.vocab);
            s->c.failed++;
            if (s->sink.error) s->sink.error(s->sink.ctx, f->id, MSG_E_INTERNAL, text);
            s_retire(s, r, MSG_FINISH_NONE, now);
            continue;
        }
        const char *why = r->logprobs ? s_lp_take(r, &res->lp, off, i) : NULL;
        if (why) {
            s->c.failed++;
            if (s->sink.error) s->sink.error(s->sink.ctx, f->id, MSG_E_INTERNAL, why);
            s_retire(s, r, MSG_FINISH_NONE, now);
            continue;
        }
        STRATA_ASSERT(r->n_prompt + r->n_gen < r->cap);
        r->toks[r->n_prompt + r->n_gen] = t;
        r->n_gen++;
        s->c.generated++;
        if (r->t_first == 0) r->t_first = now;
        sched_lp_t v;
        if (s->sink.tokens)
            s->sink.tokens(s->sink.ctx, r->id, r->n_gen - 1, &r->toks[r->n_prompt + r->n_gen - 1], 1, s_lp_view(r, r->n_gen - 1, &v));
        msg_finish_t fin = MSG_FINISH_NONE;
        if (!r->ignore_eos && s_is_eos(&s->o, t)) fin = MSG_FINISH_STOP;
        else if (s_length_reached(s, r, r->n_gen)) fin = MSG_FINISH_LENGTH;
        if (fin != MSG_FINISH_NONE) s_finish(s, r, fin, now);
    }
    s->n_fly = 0;
    return 0;
}

void sched_fail_inflight(sched_t *s, msg_errcode_t code, const char *text, double now)
{
    if (!s->inflight) return;
    s->inflight = false;
    for (int32_t i = 0; i < s->n_fly; i++) {
        req_t *r = s_find(s, s->fly[i].id);
        if (!r || r->serial != s->fly[i].serial || r->state == R_FINISHED) continue;
        s->c.failed++;
        if (s->sink.error) s->sink.error(s->sink.ctx, s->fly[i].id, code, text);
        s_retire(s, r, MSG_FINISH_NONE, now);
    }
    s->n_fly = 0;
}

void sched_reset_kv(sched_t *s, double now)
{
    if (s->inflight) {
        for (int32_t i = 0; i < s->n_fly; i++) {
            req_t *r = s_find(s, s->fly[i].id);
            if (!r || r->serial != s->fly[i].serial || r->state != R_RUNNING) continue;
            if (++r->losses < SCHED_MAX_LOSSES) continue;
            char text[160];
            snprintf(text, sizeof text, "the executor was lost %d times while running this request; giving up on it",
                     r->losses);
            s->c.failed++;
            s->c.poisoned++;
            if (s->sink.error) s->sink.error(s->sink.ctx, r->id, MSG_E_INTERNAL, text);
            s_retire(s, r, MSG_FINISH_NONE, now);
        }
    }
    s->inflight = false;
    s->n_fly = 0;
    s->c.kv_resets++;
    for (int32_t i = 0; i < s->n_running; i++) {
        req_t *r = s->running[i];
        if (r->n_computed > 0) s->c.replayed++;
        /* keeps its blocks: prefill rewrites every position before reading it; but a window
         * table has freed the blocks of the positions below its window, which the replay writes
         * again: such a sequence takes its blocks anew */
        if (r->win) s_release_blocks(s, r);
        r->n_computed = 0;
    }
}

void sched_expire(sched_t *s, double now)
{
    int32_t k = 0;
    for (int32_t i = 0; i < s->n_finished; i++) {
        req_t *r = s->finished[i];
        if (now - r->t_done > s->o.retain_s) {
            s_remove(s, r->id);
            s_req_free(r);
        } else {
            s->finished[k++] = r;
        }
    }
    s->n_finished = k;
}

void sched_get_counters(const sched_t *s, sched_counters_t *c)
{
    *c = s->c;
    c->waiting = s->n_waiting;
    c->running = s->n_running;
    c->retained = s->n_finished;
    c->kv_free = s->n_free;
    c->kv_win_used = s->win_used;
}

int sched_check(const sched_t *s, char *text, size_t tlen)
{
    int rc = 0;
    int32_t win_owned = 0;
    uint8_t *owner = calloc((size_t)s->o.kv_blocks, 1);
    if (!owner) return STRATA_ENOMEM;
#define S_BAD(...)                               \
    do {                                         \
        snprintf(text, tlen, __VA_ARGS__);       \
        rc = STRATA_EINVAL_INPUT;                \
        goto out;                                \
    } while (0)
    for (int32_t i = 0; i < s->n_free; i++) {
        int32_t b = s->free_blocks[i];
        if (b < 0 || b >= s->o.kv_blocks || owner[b]) S_BAD("free block %d invalid or listed twice", b);
        owner[b] = 1;
    }
    for (int32_t i = 0; i < s->n_running; i++) {
        const req_t *r = s->running[i];
        if (r->state != R_RUNNING) S_BAD("running[%d] has state %d", i, r->state);
        if (s_find(s, r->id) != r) S_BAD("running[%d] not in the table", i);
        int32_t len = r->n_prompt + r->n_gen;
        if (r->n_computed < 0 || r->n_computed >= len) S_BAD("running[%d]: computed %d of %d tokens", i, r->n_computed, len);
        if ((int64_t)r->n_blocks * s->o.block_size < r->n_computed)
            S_BAD("running[%d]: %d blocks do not cover %d computed tokens", i, r->n_blocks, r->n_computed);
        for (int32_t k = 0; k < r->n_blocks; k++) {
            int32_t b = r->blocks[k];
            if (b < 0 || b >= s->o.kv_blocks || owner[b]) S_BAD("running[%d]: block %d invalid or shared", i, b);
            owner[b] = 1;
        }
        if ((r->win != NULL) != (s->tables == 2)) S_BAD("running[%d]: %s window table", i, r->win ? "a" : "no");
        /* the window table holds exactly the blocks some later query's window reaches */
        const int64_t lo = (int64_t)r->n_computed - s->o.sliding_window + 1;
        for (int32_t k = 0; r->win && k < r->n_blocks; k++) {
            int32_t b = r->win[k];
            bool dead = (int64_t)(k + 1) * s->o.block_size <= lo;
            if (dead != (k < r->win_lo) || (dead && b != -1))
                S_BAD("running[%d]: window entry %d is %d (first live %d, %d computed, window %d)", i, k, b, r->win_lo,
                      r->n_computed, s->o.sliding_window);
            if (dead) continue;
            if (b < 0 || b >= s->o.kv_blocks || owner[b]) S_BAD("running[%d]: window block %d invalid or shared", i, b);
            owner[b] = 1;
            win_owned++;
        }
    }
    if (win_owned != s->win_used) S_BAD("window tables hold %d blocks, counted %d", win_owned, s->win_used);
    for (int32_t i = 0; i < s->n_waiting; i++) {
        const req_t *r = s->waiting[i];
        if (r->state != R_WAITING || r->n_blocks != 0 || r->n_computed != 0)
            S_BAD("waiting[%d]: state %d, %d blocks, %d computed", i, r->state, r->n_blocks, r->n_computed);
    }
    for (int32_t b = 0; b < s->o.kv_blocks; b++)
        if (!owner[b]) S_BAD("block %d is neither free nor owned", b);
    if ((size_t)(s->n_running + s->n_waiting + s->n_finished) != s->n_reqs)
        S_BAD("%d running + %d waiting + %d finished != %zu requests", s->n_running, s->n_waiting, s->n_finished, s->n_reqs);
#undef S_BAD
out:
    free(owner);
    return rc;
}
