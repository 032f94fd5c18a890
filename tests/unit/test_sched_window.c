/* test_sched_window.c - the scheduler's window tables (services/scheduler/sched.h) for models
 * with sliding-window layers, with the executor's results simulated (every sampled token 3).
 *
 *   - a 4096-token prompt in chunks of 256: after every step the window table holds exactly the
 *     blocks from the next query's window on, at most ceil(W / block_size) + 1, the main table
 *     every block of the positions computed; each plan's window table has a block for every
 *     position it writes or attends, none shared with any table; sched_check after every step;
 *   - two long sequences in a KV cache too small for both: preemption frees both tables of the
 *     victim, which is recomputed and finishes; an executor restart (sched_reset_kv) mid-run;
 *     every block free at the end;
 *   - random requests against a small cache, sched_check after every step;
 *   - no sliding window, or one no shorter than the context: no window tables at all.
 * STRATA_SEED replays the random part.
 */
#include <string.h>

#include "check.h"
#include "services/scheduler/sched.h"

#define MAXR 16

typedef struct {
    uint64_t id[MAXR];
    int32_t got[MAXR], dones[MAXR], errors;
    int n;
} world_t;

static int s_idx(const world_t *w, uint64_t id)
{
    for (int i = 0; i < w->n; i++)
        if (w->id[i] == id) return i;
    return -1;
}

static void s_tokens(void *ctx, uint64_t id, int64_t index, const int32_t *toks, int32_t n, const sched_lp_t *lp)
{
    (void)index, (void)toks, (void)lp;
    world_t *w = ctx;
    int i = s_idx(w, id);
    if (i >= 0) w->got[i] += n;
}

static void s_done(void *ctx, uint64_t id, const msg_done_t *d)
{
    (void)d;
    world_t *w = ctx;
    int i = s_idx(w, id);
    if (i >= 0) w->dones[i]++;
}

static void s_error(void *ctx, uint64_t id, msg_errcode_t code, const char *text)
{
    world_t *w = ctx;
    fprintf(stderr, "error event for %llu: %s %s\n", (unsigned long long)id, msg_errcode_name(code), text);
    w->errors++;
}

static sched_t *s_make(world_t *w, int32_t budget, int32_t kv_blocks, int32_t bs, int32_t max_context, int32_t window)
{
    sched_opts_t o;
    sched_opts_default(&o);
    o.max_batch_tokens = budget;
    o.max_seqs = 8;
    o.kv_blocks = kv_blocks;
    o.block_size = bs;
    o.max_context = max_context;
    o.vocab = 100;
    o.sliding_window = window;
    sched_sink_t sink = {s_tokens, s_done, s_error, w};
    sched_t *s = NULL;
    T_CHECK(sched_create(&s, &o, &sink) == 0, "sched_create");
    return s;
}

static void s_submit(sched_t *s, world_t *w, uint64_t id, int32_t n_prompt, int32_t max_tokens)
{
    static int32_t prompt[8192];
    for (int32_t i = 0; i < n_prompt; i++) prompt[i] = (int32_t)((i * 7 + id) % 100);
    msg_submit_t sub = {.prompt = prompt, .n_prompt = n_prompt, .max_tokens = max_tokens, .ignore_eos = true};
    sub.samp.top_p = 1;
    char text[256];
    T_CHECK(sched_submit(s, id, &sub, 0, text, sizeof text) == MSG_E_NONE, "submit %llu: %s", (unsigned long long)id, text);
    w->id[w->n++] = id;
}

/* What each plan must hold: a window table (iff window > 0) as long as the main one, with a block
 * from the first position's window up to the last position written; no block in two places. */
static void s_check_plan(const msg_step_t *p, int32_t kv_blocks, int32_t bs, int32_t window)
{
    static uint8_t used[8192];
    memset(used, 0, sizeof used);
    for (int32_t i = 0; i < p->n_seqs; i++) {
        const msg_step_seq_t *q = &p->seqs[i];
        T_CHECK((q->win_blocks != NULL) == (window > 0) && (!q->win_blocks || q->n_win_blocks == q->n_blocks),
                "seq %d: window table %s, %d entries for %d blocks", i, q->win_blocks ? "present" : "absent", q->n_win_blocks,
                q->n_blocks);
        const int32_t end = q->pos0 + q->n_tokens, need = (end + bs - 1) / bs;
        T_CHECK(q->n_blocks >= need, "seq %d: %d blocks for position %d", i, q->n_blocks, end - 1);
        for (int32_t b = 0; b < q->n_blocks && b < need; b++) {
            T_CHECK(q->blocks[b] >= 0 && q->blocks[b] < kv_blocks && !used[q->blocks[b]], "seq %d: block %d is %d", i, b, q->blocks[b]);
            if (q->blocks[b] >= 0 && q->blocks[b] < kv_blocks) used[q->blocks[b]] = 1;
        }
        if (!q->win_blocks) continue;
        const int32_t lo = q->pos0 - window + 1 > 0 ? (q->pos0 - window + 1) / bs : 0;
        for (int32_t b = 0; b < need && b < q->n_win_blocks; b++) {
            const int32_t k = q->win_blocks[b];
            if (b < lo && k < 0) continue;
            T_CHECK(k >= 0 && k < kv_blocks && !used[k], "seq %d (positions %d..%d): window entry %d is %d", i, q->pos0, end - 1, b, k);
            if (k >= 0 && k < kv_blocks) used[k] = 1;
        }
    }
}

/* Answer the plan in flight: token 3 for each sampled sequence. */
static void s_answer(sched_t *s, const msg_step_t *p, double now)
{
    static uint64_t reqs[MSG_MAX_STEP_SEQS];
    static int32_t toks[MSG_MAX_STEP_SEQS];
    for (int32_t i = 0; i < p->n_seqs; i++) {
        reqs[i] = p->seqs[i].req;
        toks[i] = p->seqs[i].sample ? 3 : -1;
    }
    msg_result_t r = {p->instance, p->n_seqs, reqs, toks, 0, 0};
    T_CHECK(sched_apply(s, &r, now) == 0, "apply");
}

/* Window blocks a sequence with `next` positions computed holds: from next - W + 1 on. */
static int32_t s_win_blocks(int32_t next, int32_t bs, int32_t window)
{
    const int32_t lo = next - window + 1 > 0 ? (next - window + 1) / bs : 0;
    return (next + bs - 1) / bs - lo;
}

static void s_long_prompt(void)
{
    enum { BS = 16, W = 128, PROMPT = 4096, GEN = 40 };
    world_t w = {0};
    sched_t *s = s_make(&w, 256, 600, BS, 16384, W);
    if (!s) return;
    /* the context leaves a window's blocks (ceil(127 / 16) + 1 = 9) to a lone sequence */
    T_CHECK(sched_opts(s)->sliding_window == W && sched_opts(s)->max_context == (600 - 9) * BS, "window %d, context %d",
            sched_opts(s)->sliding_window, sched_opts(s)->max_context);
    s_submit(s, &w, 41, PROMPT, GEN);
    const int32_t bound = (W + BS - 1) / BS + 1;
    int32_t next = 0, steps = 0, worst = 0;
    char text[300];
    msg_step_t p;
    while (sched_plan(s, 1, &p, steps * 0.01) > 0) {
        steps++;
        s_check_plan(&p, 600, BS, W);
        T_CHECK(p.n_seqs == 1 && p.seqs[0].pos0 == next, "step %d: %d seqs at %d, want %d", steps, p.n_seqs, p.seqs[0].pos0, next);
        next += p.seqs[0].n_tokens;
        s_answer(s, &p, steps * 0.01);
        T_CHECK(sched_check(s, text, sizeof text) == 0, "step %d: %s", steps, text);
        sched_counters_t c;
        sched_get_counters(s, &c);
        if (w.dones[0]) break;
        const int32_t main_blocks = 600 - c.kv_free - c.kv_win_used;
        T_CHECK(c.kv_win_used == s_win_blocks(next, BS, W) && c.kv_win_used <= bound,
                "step %d, %d computed: %d window blocks, want %d (at most %d)", steps, next, c.kv_win_used,
                s_win_blocks(next, BS, W), bound);
        T_CHECK(main_blocks == (next + BS - 1) / BS, "step %d: %d main blocks for %d positions", steps, main_blocks, next);
        if (c.kv_win_used > worst) worst = c.kv_win_used;
        if (next == PROMPT)
            fprintf(stderr, "after the %d-token prompt (%d steps): %d main blocks, %d window blocks (bound %d)\n", PROMPT, steps,
                    main_blocks, c.kv_win_used, bound);
    }
    sched_counters_t c;
    sched_get_counters(s, &c);
    T_CHECK(steps == PROMPT / 256 + GEN - 1 && w.got[0] == GEN && w.dones[0] == 1 && w.errors == 0,
            "%d steps, %d tokens, %d dones, %d errors", steps, w.got[0], w.dones[0], w.errors);
    T_CHECK(c.kv_win_seq_max <= bound && c.kv_win_seq_max == worst, "most window blocks one sequence held: %d (bound %d)",
            c.kv_win_seq_max, bound);
    T_CHECK(c.kv_free == 600 && c.kv_win_used == 0, "at the end %d of 600 free, %d window blocks", c.kv_free, c.kv_win_used);
    sched_free(s);
}

/* Two sequences that do not fit together (each: 25 + 13 main blocks, 3 window blocks; 64 in
 * all): the newer one is preempted, both tables freed, and recomputed; an executor restart on
 * the way. */
static void s_preemption(void)
{
    enum { BS = 16, W = 32, KV = 64 };
    world_t w = {0};
    sched_t *s = s_make(&w, 64, KV, BS, 4096, W);
    if (!s) return;
    T_CHECK(sched_opts(s)->max_context == (KV - 3) * BS, "context %d", sched_opts(s)->max_context);
    s_submit(s, &w, 7, 400, 200);
    s_submit(s, &w, 8, 400, 200);
    char text[300];
    msg_step_t p;
    int steps = 0, resets = 0;
    uint64_t pre = 0;
    while (sched_plan(s, 1, &p, steps * 0.01) > 0 && steps < 100000) {
        steps++;
        s_check_plan(&p, KV, BS, W);
        if (steps == 40 && !resets) {
            sched_reset_kv(s, steps * 0.01); /* the plan is lost with the executor's KV */
            resets++;
        } else {
            s_answer(s, &p, steps * 0.01);
        }
        T_CHECK(sched_check(s, text, sizeof text) == 0, "step %d: %s", steps, text);
        sched_counters_t c;
        sched_get_counters(s, &c);
        if (c.preemptions > pre) {
            /* the victim waits with no block in either table: what is held is the other's */
            T_CHECK(c.running == 1 && c.waiting == 1, "after a preemption: %d running, %d waiting", c.running, c.waiting);
            pre = c.preemptions;
        }
    }
    sched_counters_t c;
    sched_get_counters(s, &c);
    T_CHECK(c.preemptions > 0 && c.kv_resets == 1, "%llu preemptions, %llu resets", (unsigned long long)c.preemptions,
            (unsigned long long)c.kv_resets);
    T_CHECK(w.got[0] == 200 && w.got[1] == 200 && w.dones[0] == 1 && w.dones[1] == 1 && w.errors == 0,
            "tokens %d and %d, dones %d and %d", w.got[0], w.got[1], w.dones[0], w.dones[1]);
    T_CHECK(c.kv_free == KV && c.kv_win_used == 0 && c.kv_win_seq_max <= (W + BS - 1) / BS + 1,
            "at the end %d of %d free, %d window blocks; at most %d a sequence", c.kv_free, KV, c.kv_win_used, c.kv_win_seq_max);
    fprintf(stderr, "preemption: %d steps, %llu preemptions\n", steps, (unsigned long long)c.preemptions);
    sched_free(s);
}

/* Random requests, cancels and restarts against a small cache; block sizes and windows vary. */
static void s_random(uint64_t seed)
{
    for (int round = 0; round < 6; round++) {
        const int32_t bs = 1 + (int32_t)(t_rng_next(&seed) % 8), window = 1 + (int32_t)(t_rng_next(&seed) % 40);
        const int32_t kv = 24 + (int32_t)(t_rng_next(&seed) % 40), budget = 4 + (int32_t)(t_rng_next(&seed) % 40);
        world_t w = {0};
        sched_t *s = s_make(&w, budget, kv, bs, 4096, window);
        if (!s) return;
        const int32_t ctx = sched_opts(s)->max_context, win = sched_opts(s)->sliding_window;
        for (int i = 0; i < MAXR; i++) {
            int32_t n = 1 + (int32_t)(t_rng_next(&seed) % 120);
            if (n > ctx - 2) n = ctx - 2;
            s_submit(s, &w, 100 + (uint64_t)i, n, 1 + (int32_t)(t_rng_next(&seed) % 60));
        }
        char text[300];
        msg_step_t p;
        int steps = 0, last_reset = -10;
        while (sched_plan(s, 1, &p, steps * 0.01) > 0 && steps < 200000) {
            steps++;
            s_check_plan(&p, kv, bs, win);
            /* never two plans lost in a row: a request lost SCHED_MAX_LOSSES times ends with an error */
            if (t_rng_next(&seed) % 50 == 0 && steps - last_reset > 1) {
                sched_reset_kv(s, steps * 0.01);
                last_reset = steps;
            } else {
                s_answer(s, &p, steps * 0.01);
            }
            const int victim = (int)(t_rng_next(&seed) % MAXR);
            if (t_rng_next(&seed) % 80 == 0 && !w.dones[victim]) sched_cancel(s, w.id[victim], steps * 0.01);
            int rc = sched_check(s, text, sizeof text);
            T_CHECK(rc == 0, "round %d (bs %d, window %d, %d blocks) step %d: %s", round, bs, win, kv, steps, text);
            if (rc) break;
        }
        sched_counters_t c;
        sched_get_counters(s, &c);
        int done = 0;
        for (int i = 0; i < w.n; i++) done += w.dones[i] == 1;
        T_CHECK(done == MAXR && w.errors == 0 && c.kv_free == kv && c.kv_win_used == 0,
                "round %d: %d of %d done, %d errors, %d of %d blocks free", round, done, MAXR, w.errors, c.kv_free, kv);
        T_CHECK(win == 0 || c.kv_win_seq_max <= (win + bs - 1) / bs + 1, "round %d: %d window blocks in one sequence", round,
                c.kv_win_seq_max);
        fprintf(stderr, "random %d: block %d, window %d -> %d, %d blocks, budget %d: %d steps, %llu preemptions\n", round, bs, window,
                win, kv, budget, steps, (unsigned long long)c.preemptions);
        sched_free(s);
    }
}

/* No sliding layer, or a window the context never passes: no window table, the whole cache. */
static void s_no_window(void)
{
    for (int k = 0; k < 2; k++) {
        world_t w = {0};
        sched_t *s = s_make(&w, 64, 16, 4, 4096, k ? 64 : 0);
        if (!s) return;
        T_CHECK(sched_opts(s)->sliding_window == 0 && sched_opts(s)->max_context == 64, "%s: window %d, context %d",
                k ? "window 64" : "none", sched_opts(s)->sliding_window, sched_opts(s)->max_context);
        s_submit(s, &w, 5, 30, 20);
        msg_step_t p;
        char text[300];
        while (sched_plan(s, 1, &p, 0) > 0) {
            T_CHECK(p.seqs[0].win_blocks == NULL && p.seqs[0].n_win_blocks == 0, "no window table in the plan");
            s_answer(s, &p, 0);
            T_CHECK(sched_check(s, text, sizeof text) == 0, "%s", text);
        }
        sched_counters_t c;
        sched_get_counters(s, &c);
        T_CHECK(w.got[0] == 20 && c.kv_win_used == 0 && c.kv_win_seq_max == 0 && c.kv_free == 16, "%d tokens, %d window blocks",
                w.got[0], c.kv_win_seq_max);
        sched_free(s);
    }
}

int main(void)
{
    uint64_t seed = t_seed();
    s_long_prompt();
    s_preemption();
    s_random(seed);
    s_no_window();
    return t_done("test_sched_window");
}
