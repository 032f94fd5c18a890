/* test_engine.c - the scheduler core (services/scheduler/sched.h) driving the executor engine
 * (services/executor/exec.h) in one process, on random models, against generate_tokens().
 *
 * Each scenario submits requests of random prompt lengths, sampling parameters (greedy and
 * seeded top-k/top-p sampling) and max_tokens at random steps, runs the plans on an exec_t and
 * checks that:
 *   - every request's streamed tokens equal generate_tokens() for it alone (batching changes
 *     nothing), with contiguous indices, one done, and the right finish reason;
 *   - every plan respects the token budget, max_seqs and gives each sequence its own blocks;
 *     the bookkeeping (sched_check) holds after every step; all blocks are free at the end;
 *   - with a tiny KV cache, preemption by recompute happens and changes nothing;
 *   - with executor "crashes" (the engine is freed and a new one created, losing its KV and
 *     the plan in flight), the replay changes nothing;
 *   - canceled requests get a prefix of their answer and done(cancel);
 *   - requests that ask for log-probabilities get, with every token, its log-probability and
 *     the top_logprobs most likely tokens under the model's own distribution, equal (1e-4) to a
 *     log-softmax of seq_feed's logits computed here in double with a full sort; the others get
 *     none, and their rows of the result say so (top_n -1).
 * The models: Mixtral- and Qwen3-MoE-shaped, and gpt-oss-shaped with a sliding window shorter
 * than most requests, whose plans carry window tables (the scheduler frees the blocks below each
 * window as it moves on; the executor's sliding layers read and write only those).
 * Plus: plans the engine must refuse (window tables among them), submit refusals, resume and
 * retention.
 * STRATA_SEED replays a run.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "kernels/cpu/threadpool.h"
#include "model/generate.h"
#include "model/synth.h"
#include "services/executor/exec.h"
#include "services/scheduler/sched.h"

#define MAXR 64
#define MAXT 256

typedef struct {
    uint64_t id;
    int32_t prompt[MAXT], n_prompt, max_tokens;
    sampler_params_t sp;
    int arrival;
    bool submitted, cancel_sent;
    int32_t ref[MAXT], n_ref;        /* generate_tokens */
    int32_t got[MAXT], n_got;        /* streamed */
    bool lp;                         /* asks for log-probabilities, with top alternatives */
    int32_t top;
    float got_lp[MAXT];              /* streamed with the tokens */
    int32_t got_top[MAXT][MSG_MAX_TOP_LOGPROBS];
    float got_top_lp[MAXT][MSG_MAX_TOP_LOGPROBS];
    int lp_bad;                      /* events whose log-probabilities were missing, unasked or of the wrong count */
    int dones, errors, bad_index;
    msg_finish_t finish;
    int32_t done_completion;
} treq_t;

typedef struct {
    treq_t r[MAXR];
    int n;
} world_t;

static treq_t *s_req(world_t *w, uint64_t id)
{
    for (int i = 0; i < w->n; i++)
        if (w->r[i].id == id) return &w->r[i];
    return NULL;
}

static void s_tokens(void *ctx, uint64_t id, int64_t index, const int32_t *toks, int32_t n, const sched_lp_t *lp)
{
    treq_t *q = s_req(ctx, id);
    if (!q) return;
    if (index != q->n_got) q->bad_index++;
    if ((lp != NULL) != q->lp || (lp && lp->top_n != q->top)) q->lp_bad++;
    for (int32_t i = 0; i < n && q->n_got < MAXT; i++) {
        if (lp && lp->top_n == q->top) {
            q->got_lp[q->n_got] = lp->logprobs[i];
            memcpy(q->got_top[q->n_got], lp->top_tokens + i * q->top, (size_t)q->top * sizeof(int32_t));
            memcpy(q->got_top_lp[q->n_got], lp->top_logprobs + i * q->top, (size_t)q->top * sizeof(float));
        }
        q->got[q->n_got++] = toks[i];
    }
}

typedef struct {
    double v;
    int32_t id;
} t_lp_cand_t;

static int s_lp_cmp(const void *a, const void *b)
{
    const t_lp_cand_t *x = a, *y = b;
    if (x->v != y->v) return x->v > y->v ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* q's log-probabilities against a log-softmax of the logits seq_feed gives for its prompt and
 * answer alone: double precision, libm's exp, a full sort for the alternatives. */
static void s_check_logprobs(const model_t *m, tpool_t *pool, const char *name, int i, const treq_t *q)
{
    const int32_t V = m->cfg.vocab, n = q->n_prompt + q->n_got - 1;
    int32_t *seqt = malloc((size_t)(n > 0 ? n : 1) * sizeof *seqt);
    float *lg = malloc((size_t)(n > 0 ? n : 1) * (size_t)V * sizeof *lg);
    t_lp_cand_t *c = malloc((size_t)V * sizeof *c);
    seq_t sq;
    memset(&sq, 0, sizeof sq);
    if (!seqt || !lg || !c || seq_init(&sq, m, pool, n, n) < 0) {
        T_CHECK(0, "%s: req %d: out of memory", name, i);
        goto out;
    }
    memcpy(seqt, q->prompt, (size_t)q->n_prompt * sizeof *seqt);
    memcpy(seqt + q->n_prompt, q->got, (size_t)(q->n_got - 1) * sizeof *seqt);
    T_CHECK(seq_feed(&sq, seqt, n, true, lg) == 0, "%s: seq_feed", name);
    double worst = 0;
    for (int32_t t = 0; t < q->n_got; t++) {
        const float *row = lg + (size_t)(q->n_prompt - 1 + t) * V;
        double mx = row[0], z = 0;
        for (int32_t v = 1; v < V; v++) mx = row[v] > mx ? row[v] : mx;
        for (int32_t v = 0; v < V; v++) z += exp((double)row[v] - mx);
        const double lse = mx + log(z);
        double want = row[q->got[t]] - lse;
        worst = fmax(worst, fabs(want - q->got_lp[t]));
        T_CHECK(q->got_lp[t] <= 0 && fabs(want - q->got_lp[t]) < 1e-4, "%s: req %d token %d: logprob %.7g, want %.7g", name, i, t,
                q->got_lp[t], want);
        for (int32_t v = 0; v < V; v++) c[v] = (t_lp_cand_t){row[v], v};
        qsort(c, (size_t)V, sizeof *c, s_lp_cmp);
        for (int32_t j = 0; j < q->top; j++) {
            double wj = c[j].v - lse;
            T_CHECK(q->got_top[t][j] == c[j].id && fabs(q->got_top_lp[t][j] - wj) < 1e-4,
                    "%s: req %d token %d: alternative %d is %d (%.7g), want %d (%.7g)", name, i, t, j, q->got_top[t][j],
                    q->got_top_lp[t][j], c[j].id, wj);
        }
    }
    if (worst > 1e-5) fprintf(stderr, "%s: req %d: log-probabilities within %.2g of the reference\n", name, i, worst);
out:
    seq_free(&sq);
    free(seqt);
    free(lg);
    free(c);
}

static void s_done(void *ctx, uint64_t id, const msg_done_t *d)
{
    treq_t *q = s_req(ctx, id);
    if (!q) return;
    q->dones++;
    q->finish = d->finish;
    q->done_completion = d->completion_tokens;
}

static void s_error(void *ctx, uint64_t id, msg_errcode_t code, const char *text)
{
    treq_t *q = s_req(ctx, id);
    fprintf(stderr, "error event for %llu: %s %s\n", (unsigned long long)id, msg_errcode_name(code), text);
    if (q) q->errors++;
}

typedef struct {
    const char *name;
    int32_t budget, max_seqs, kv_blocks, block_size, max_context;
    int n_reqs;
    int crash_every;    /* every this many plans the executor dies with the plan in flight (0 = never) */
    double p_cancel;    /* per step: cancel a random live request */
    bool want_preempt;
    bool poison;        /* the executor dies on every plan holding request 0 */
} scen_t;

/* Requests of every s_run that ended at the model's second eos id. */
static int s_second_eos_stops;

static int s_run(const model_t *m, tpool_t *pool, const scen_t *sc, uint64_t *rng)
{
    int fails0 = t_failed;
    world_t *w = calloc(1, sizeof *w);
    sched_t *s = NULL;
    exec_t *ex = NULL;
    int32_t *toks = malloc(MSG_MAX_STEP_SEQS * sizeof *toks);
    uint64_t *reqs = malloc(MSG_MAX_STEP_SEQS * sizeof *reqs);
    int crashes = 0, mixed_steps = 0, steps = 0, lp_reqs = 0;
    int eos_stops[MODEL_MAX_EOS] = {0}; /* requests that ended at each eos id */

    exec_opts_t eo;
    exec_opts_default(&eo);
    eo.threads = 2;
    eo.kv_blocks = sc->kv_blocks;
    eo.block_size = sc->block_size;
    eo.max_tokens = sc->budget;
    eo.max_context = sc->max_context;
    strata_errbuf_t eb = {{0}};
    T_CHECK(exec_create(&ex, m, &eo, &eb) == 0, "%s: exec_create: %s", sc->name, eb.msg);
    if (!ex) goto out;
    int32_t ctx = exec_max_context(ex);

    sched_opts_t so;
    sched_opts_default(&so);
    so.max_batch_tokens = sc->budget;
    so.max_seqs = sc->max_seqs;
    so.kv_blocks = sc->kv_blocks;
    so.block_size = sc->block_size;
    so.max_context = ctx;
    so.vocab = m->cfg.vocab;
    so.n_eos = m->cfg.n_eos;
    memcpy(so.eos_ids, m->cfg.eos_ids, sizeof m->cfg.eos_ids);
    so.sliding_window = exec_sliding_window(ex); /* window tables, as the hello says */
    sched_sink_t sink = {s_tokens, s_done, s_error, w};
    T_CHECK(sched_create(&s, &so, &sink) == 0, "%s: sched_create", sc->name);
    if (!s) goto out;
    ctx = sched_opts(s)->max_context; /* a window table's blocks may take some of the cache */
    const bool windowed = sched_opts(s)->sliding_window > 0;
    T_CHECK(windowed == (so.sliding_window > 0), "%s: window tables %s for window %d", sc->name, windowed ? "on" : "off",
            so.sliding_window);

    /* requests and their references */
    w->n = sc->n_reqs;
    for (int i = 0; i < w->n; i++) {
        treq_t *q = &w->r[i];
        q->id = t_rng_next(rng) | 1;
        q->n_prompt = 1 + (int32_t)(t_rng_next(rng) % 40);
        if (q->n_prompt > ctx - 2) q->n_prompt = ctx - 2;
        for (int32_t k = 0; k < q->n_prompt; k++) q->prompt[k] = (int32_t)(t_rng_next(rng) % (uint64_t)m->cfg.vocab);
        q->max_tokens = 1 + (int32_t)(t_rng_next(rng) % 40);
        sampler_params_default(&q->sp);
        if (t_rng_next(rng) % 2) {
            q->sp.temperature = 0.5f + (float)(t_rng_next(rng) % 100) / 100.0f;
            q->sp.top_k = (int32_t)(t_rng_next(rng) % 30);
            q->sp.top_p = t_rng_next(rng) % 2 ? 0.9f : 1.0f;
            q->sp.seed = t_rng_next(rng);
        }
        q->sp.ignore_eos = t_rng_next(rng) % 4 == 0;
        q->lp = t_rng_next(rng) % 3 == 0;
        q->top = q->lp ? (int32_t)(t_rng_next(rng) % (MSG_MAX_TOP_LOGPROBS + 1)) : 0;
        q->arrival = (int)(t_rng_next(rng) % 30);
        int32_t mt = q->max_tokens < ctx - q->n_prompt ? q->max_tokens : ctx - q->n_prompt;
        int rc = generate_tokens(m, pool, q->prompt, q->n_prompt, mt, &q->sp, 0, q->ref, &q->n_ref, NULL);
        T_CHECK(rc == 0, "%s: generate_tokens: %s", sc->name, strata_strerror(rc));
    }

    for (int step = 0; step < 100000; step++) {
        double now = step * 0.001;
        int live = 0;
        for (int i = 0; i < w->n; i++) {
            treq_t *q = &w->r[i];
            if (!q->submitted && q->arrival <= step) {
                msg_submit_t sub;
                memset(&sub, 0, sizeof sub);
                sub.prompt = q->prompt;
                sub.n_prompt = q->n_prompt;
                sub.max_tokens = q->max_tokens;
                sub.samp.temperature = q->sp.temperature;
                sub.samp.top_k = q->sp.top_k;
                sub.samp.top_p = q->sp.top_p;
                sub.samp.seed = q->sp.seed;
                sub.ignore_eos = q->sp.ignore_eos;
                sub.logprobs = q->lp;
                sub.top_logprobs = q->top;
                char text[256];
                msg_errcode_t code = sched_submit(s, q->id, &sub, now, text, sizeof text);
                T_CHECK(code == MSG_E_NONE, "%s: submit %d: %s", sc->name, i, text);
                q->submitted = true;
            }
            if (!q->submitted || q->dones == 0) live++;
        }
        if (live == 0) break;
        if (sc->p_cancel > 0 && (t_rng_next(rng) % 10000) < sc->p_cancel * 10000) {
            treq_t *q = &w->r[t_rng_next(rng) % (uint64_t)w->n];
            if (q->submitted && q->dones == 0) {
                T_CHECK(sched_cancel(s, q->id, now) == MSG_E_NONE, "%s: cancel", sc->name);
                q->cancel_sent = true;
            }
        }
        msg_step_t plan;
        int n = sched_plan(s, exec_instance(ex), &plan, now);
        if (n == 0) continue; /* waiting for arrivals */
        steps++;
        /* the plan's shape */
        int32_t tot = 0;
        bool has_prefill = false, has_decode = false;
        for (int i = 0; i < n; i++) {
            tot += plan.seqs[i].n_tokens;
            if (plan.seqs[i].n_tokens > 1) has_prefill = true;
            if (plan.seqs[i].n_tokens == 1 && plan.seqs[i].sample && plan.seqs[i].pos0 > 0) has_decode = true;
            int32_t need = (plan.seqs[i].pos0 + plan.seqs[i].n_tokens + sc->block_size - 1) / sc->block_size;
            T_CHECK(plan.seqs[i].n_blocks >= need, "%s: seq %d has %d blocks for %d", sc->name, i, plan.seqs[i].n_blocks, need);
            T_CHECK((plan.seqs[i].win_blocks != NULL) == windowed, "%s: seq %d: window table %s", sc->name, i,
                    plan.seqs[i].win_blocks ? "unasked" : "missing");
            for (int j = 0; j < i; j++)
                for (int a = 0; a < plan.seqs[i].n_blocks; a++)
                    for (int b = 0; b < plan.seqs[j].n_blocks; b++)
                        if (plan.seqs[i].blocks[a] == plan.seqs[j].blocks[b]) {
                            T_CHECK(0, "%s: block %d shared by two sequences of one plan", sc->name, plan.seqs[i].blocks[a]);
                            a = plan.seqs[i].n_blocks;
                            break;
                        }
        }
        mixed_steps += has_prefill && has_decode;
        T_CHECK(tot <= sc->budget, "%s: plan of %d tokens over the budget %d", sc->name, tot, sc->budget);
        T_CHECK(n <= sc->max_seqs, "%s: plan of %d sequences over max_seqs %d", sc->name, n, sc->max_seqs);
        char text[300];
        bool poisoned = false;
        for (int i = 0; sc->poison && i < n; i++) poisoned |= plan.seqs[i].req == w->r[0].id;
        if (poisoned || (sc->crash_every > 0 && steps % sc->crash_every == sc->crash_every / 2)) {
            /* the executor dies: the plan in flight is lost with the KV cache */
            exec_free(ex);
            ex = NULL;
            T_CHECK(exec_create(&ex, m, &eo, &eb) == 0, "%s: exec_create after crash: %s", sc->name, eb.msg);
            if (!ex) goto out;
            sched_reset_kv(s, now);
            crashes++;
        } else {
            double fus, sus;
            msg_errcode_t code;
            int rc = exec_step(ex, &plan, toks, &fus, &sus, &code, text, sizeof text);
            T_CHECK(rc == 0, "%s: exec_step: %s", sc->name, text);
            if (rc < 0) break;
            for (int i = 0; i < n; i++) reqs[i] = plan.seqs[i].req;
            msg_result_t res = {exec_instance(ex), n, reqs, toks, fus, sus};
            exec_logprobs(ex, &res.lp);
            bool asked = false;
            for (int i = 0; i < n; i++) {
                const bool want = plan.seqs[i].sample && plan.seqs[i].logprobs;
                asked |= want;
                if (res.lp.logprobs)
                    T_CHECK(res.lp.top_n[i] == (want ? plan.seqs[i].top_logprobs : -1), "%s: row %d: top_n %d", sc->name, i,
                            res.lp.top_n[i]);
            }
            T_CHECK(asked == (res.lp.logprobs != NULL), "%s: log-probabilities %s", sc->name, asked ? "missing" : "unasked");
            T_CHECK(sched_apply(s, &res, now) == 0, "%s: apply", sc->name);
        }
        int c = sched_check(s, text, sizeof text);
        T_CHECK(c == 0, "%s: step %d: %s", sc->name, step, text);
        if (c != 0) break;
    }

    sched_counters_t cn;
    sched_get_counters(s, &cn);
    for (int i = 0; i < w->n; i++) {
        treq_t *q = &w->r[i];
        if (sc->poison && i == 0) {
            /* it took the executor down SCHED_MAX_LOSSES times: one error, no done, nothing left */
            T_CHECK(q->errors == 1 && q->dones == 0 && cn.poisoned == 1, "%s: poisoned request: %d errors, %d dones", sc->name,
                    q->errors, q->dones);
            continue;
        }
        T_CHECK(q->dones == 1 && q->errors == 0 && q->bad_index == 0, "%s: req %d: %d dones, %d errors, %d bad indices", sc->name,
                i, q->dones, q->errors, q->bad_index);
        T_CHECK(q->done_completion == q->n_got, "%s: req %d: done says %d tokens, %d streamed", sc->name, i, q->done_completion,
                q->n_got);
        bool prefix = q->n_got <= q->n_ref && !memcmp(q->got, q->ref, (size_t)q->n_got * sizeof *q->got);
        if (q->cancel_sent && q->finish == MSG_FINISH_CANCEL) {
            T_CHECK(prefix, "%s: req %d (canceled): streamed tokens are not a prefix of the reference", sc->name, i);
            continue;
        }
        T_CHECK(q->n_got == q->n_ref && prefix, "%s: req %d (prompt %d, temp %.2f, max %d): %d tokens vs %d of generate_tokens%s",
                sc->name, i, q->n_prompt, q->sp.temperature, q->max_tokens, q->n_got, q->n_ref, prefix ? "" : ", differing");
        T_CHECK(q->lp_bad == 0, "%s: req %d: %d token events with wrong log-probabilities", sc->name, i, q->lp_bad);
        if (q->lp && q->n_got > 0 && prefix) {
            s_check_logprobs(m, pool, sc->name, i, q);
            lp_reqs++;
        }
        if (q->n_got > 0) {
            bool eos = !q->sp.ignore_eos && model_is_eos(&m->cfg, q->got[q->n_got - 1]);
            T_CHECK(q->finish == (eos ? MSG_FINISH_STOP : MSG_FINISH_LENGTH), "%s: req %d: finish %s", sc->name, i,
                    msg_finish_name(q->finish));
            for (int k = 0; eos && k < m->cfg.n_eos; k++) eos_stops[k] += q->got[q->n_got - 1] == m->cfg.eos_ids[k];
            if (eos && m->cfg.n_eos > 1 && q->got[q->n_got - 1] == m->cfg.eos_ids[1]) s_second_eos_stops++;
        }
    }
    T_CHECK(cn.kv_free == sc->kv_blocks && cn.running == 0 && cn.waiting == 0, "%s: at the end %d of %d blocks free, %d running, %d waiting",
            sc->name, cn.kv_free, sc->kv_blocks, cn.running, cn.waiting);
    T_CHECK(cn.kv_win_used == 0 && (windowed ? cn.kv_win_seq_max > 0 &&
                                                   cn.kv_win_seq_max <= (so.sliding_window + sc->block_size - 1) / sc->block_size + 1
                                             : cn.kv_win_seq_max == 0),
            "%s: window blocks: %d held at the end, at most %d by one sequence", sc->name, cn.kv_win_used, cn.kv_win_seq_max);
    T_CHECK(mixed_steps > 0, "%s: no step mixed a prefill chunk with decode tokens", sc->name);
    if (sc->want_preempt) T_CHECK(cn.preemptions > 0, "%s: the tight KV cache caused no preemption", sc->name);
    if (sc->crash_every > 0) T_CHECK(crashes > 0 && cn.replayed > 0, "%s: %d crashes, %llu replayed", sc->name, crashes,
                                 (unsigned long long)cn.replayed);
    T_CHECK(lp_reqs > 0 || sc->poison, "%s: no request with log-probabilities was checked", sc->name);
    fprintf(stderr, "%-16s %4d steps (%d mixed), %llu prefill + %llu decode tokens, %llu preemptions, %d crashes (%llu seqs replayed), "
            "%d with log-probabilities, %d + %d ended at eos %d / %d, at most %d window blocks a sequence%s\n",
            sc->name, steps, mixed_steps, (unsigned long long)cn.prefill_tokens, (unsigned long long)cn.decode_tokens,
            (unsigned long long)cn.preemptions, crashes, (unsigned long long)cn.replayed, lp_reqs, eos_stops[0], eos_stops[1],
            m->cfg.eos_ids[0], m->cfg.eos_ids[1], cn.kv_win_seq_max, t_failed > fails0 ? " FAILED" : "");
out:
    sched_free(s);
    exec_free(ex);
    free(toks);
    free(reqs);
    free(w);
    return 0;
}

/* A one-thread engine of kv_blocks blocks of 4 and 16 tokens a step, or NULL (a failed check). */
static exec_t *s_small_engine(const model_t *m, int kv_blocks)
{
    exec_opts_t eo;
    exec_opts_default(&eo);
    eo.threads = 1;
    eo.kv_blocks = kv_blocks;
    eo.block_size = 4;
    eo.max_tokens = 16;
    exec_t *ex = NULL;
    strata_errbuf_t eb = {{0}};
    T_CHECK(exec_create(&ex, m, &eo, &eb) == 0, "exec_create: %s", eb.msg);
    return ex;
}

/* Plans an engine must refuse, before touching anything. */
static void s_refusals(const model_t *m)
{
    exec_t *ex = s_small_engine(m, 8);
    if (!ex) return;
    T_CHECK(exec_max_context(ex) == 32, "max context %d (8 blocks x 4)", exec_max_context(ex));
    int32_t tk[20] = {1, 2, 3, 4, 5}, blocks[3] = {0, 1, 2}, out[2];
    msg_step_seq_t q = {.req = 7, .pos0 = 0, .n_tokens = 5, .tokens = tk, .n_blocks = 2, .blocks = blocks, .sample = true};
    q.samp.top_p = 1;
    msg_step_t st = {exec_instance(ex), 1, &q};
    double f, sm;
    msg_errcode_t code;
    char text[300];
    T_CHECK(exec_step(ex, &st, out, &f, &sm, &code, text, sizeof text) == 0 && out[0] >= 0 && out[0] < m->cfg.vocab, "good plan: %s", text);
    st.instance = exec_instance(ex) + 1;
    T_CHECK(exec_step(ex, &st, out, &f, &sm, &code, text, sizeof text) < 0 && code == MSG_E_UNAVAILABLE && strstr(text, "stale"),
            "stale instance: %s", text);
    st.instance = 0; /* any */
    T_CHECK(exec_step(ex, &st, out, &f, &sm, &code, text, sizeof text) == 0, "instance 0: %s", text);
    blocks[1] = 8;
    T_CHECK(exec_step(ex, &st, out, &f, &sm, &code, text, sizeof text) < 0 && code == MSG_E_INVALID_PARAM && strstr(text, "blocks[1]"),
            "block outside: %s", text);
    blocks[1] = 1;
    q.n_blocks = 1;
    T_CHECK(exec_step(ex, &st, out, &f, &sm, &code, text, sizeof text) < 0 && strstr(text, "blocks"), "too few blocks: %s", text);
    q.n_blocks = 2;
    tk[2] = m->cfg.vocab;
    T_CHECK(exec_step(ex, &st, out, &f, &sm, &code, text, sizeof text) < 0 && strstr(text, "tokens[2]"), "token outside: %s", text);
    tk[2] = 3;
    q.pos0 = 30;
    q.n_blocks = 3;
    T_CHECK(exec_step(ex, &st, out, &f, &sm, &code, text, sizeof text) < 0 && strstr(text, "pos0"), "past the context: %s", text);
    q.pos0 = 0;
    q.n_tokens = 17;
    T_CHECK(exec_step(ex, &st, out, &f, &sm, &code, text, sizeof text) < 0 && strstr(text, "max_batch_tokens"), "over budget: %s", text);
    q.n_tokens = 5;
    q.n_blocks = 2;
    int32_t win[2] = {3, 4};
    q.win_blocks = win;
    q.n_win_blocks = 2;
    T_CHECK(exec_sliding_window(ex) == 0 && exec_step(ex, &st, out, &f, &sm, &code, text, sizeof text) < 0 &&
                strstr(text, "no sliding-window layer"),
            "window table without sliding layers: %s", text);
    exec_free(ex);

    exec_opts_t eo;
    exec_opts_default(&eo);
    eo.threads = 1;
    eo.block_size = 4;
    eo.max_tokens = 16;
    strata_errbuf_t eb = {{0}};
    eo.kv_blocks = 0;
    T_CHECK(exec_create(&ex, m, &eo, &eb) < 0, "kv_blocks 0 refused");
    eo.kv_blocks = 8;
    snprintf(eo.backend, sizeof eo.backend, "tpu");
    T_CHECK(exec_create(&ex, m, &eo, &eb) < 0 && strstr(eb.msg, "tpu"), "unknown backend: %s", eb.msg);
#ifndef STRATA_HAVE_CUDA
    snprintf(eo.backend, sizeof eo.backend, "cuda");
    T_CHECK(exec_create(&ex, m, &eo, &eb) == STRATA_EUNSUPPORTED && strstr(eb.msg, "CUDA"), "cuda without CUDA: %s", eb.msg);
#endif

    /* the draw is the n-th number of the seeded stream */
    sampler_rng_t r;
    sampler_rng_seed(&r, 1234);
    for (int i = 0; i < 50; i++) {
        double u = sampler_rng_uniform(&r);
        T_CHECK(exec_draw(1234, (uint64_t)i) == u, "draw %d", i);
    }
}

/* Window tables the gpt-oss engine (window 6, blocks of 4) must refuse, and those it runs: entries
 * below the first position's window may be -1. */
static void s_win_refusals(const model_t *m)
{
    exec_t *ex = s_small_engine(m, 16);
    if (!ex) return;
    T_CHECK(exec_sliding_window(ex) == 6, "sliding window %d", exec_sliding_window(ex));
    int32_t tk[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, blocks[4] = {0, 1, 2, 3}, win[4] = {4, 5, 6, 7}, out[2];
    msg_step_seq_t q[2] = {{.req = 7, .pos0 = 0, .n_tokens = 12, .tokens = tk, .n_blocks = 3, .blocks = blocks, .sample = true,
                            .n_win_blocks = 3, .win_blocks = win},
                           {.req = 8, .pos0 = 0, .n_tokens = 1, .tokens = tk, .n_blocks = 1, .blocks = blocks + 3, .sample = true,
                            .n_win_blocks = 1, .win_blocks = win + 3}};
    q[0].samp.top_p = q[1].samp.top_p = 1;
    msg_step_t st = {exec_instance(ex), 1, q};
    double f, sm;
    msg_errcode_t code;
    char text[300];
    T_CHECK(exec_step(ex, &st, out, &f, &sm, &code, text, sizeof text) == 0, "prefill of 12 with a window table: %s", text);
    /* position 12 attends from 7 on: block 0 (positions 0..3) may be freed, block 1 not */
    q[0].pos0 = 12;
    q[0].n_tokens = 1;
    q[0].tokens = tk + 4;
    q[0].n_blocks = q[0].n_win_blocks = 4;
    win[3] = 8;
    win[0] = -1;
    T_CHECK(exec_step(ex, &st, out, &f, &sm, &code, text, sizeof text) == 0, "block 0 freed: %s", text);
    win[1] = -1;
    T_CHECK(exec_step(ex, &st, out, &f, &sm, &code, text, sizeof text) < 0 && code == MSG_E_INVALID_PARAM &&
                strstr(text, "'win_blocks[1]'") && strstr(text, "within the window"),
            "block 1 freed within the window: %s", text);
    win[1] = 16;
    T_CHECK(exec_step(ex, &st, out, &f, &sm, &code, text, sizeof text) < 0 && strstr(text, "'win_blocks[1]'"),
            "window block past the cache: %s", text);
    win[1] = 5;
    q[0].n_win_blocks = 3;
    T_CHECK(exec_step(ex, &st, out, &f, &sm, &code, text, sizeof text) < 0 && strstr(text, "'win_blocks': 3 entries"),
            "a window table too short: %s", text);
    q[0].n_win_blocks = 4;
    st.n_seqs = 2;
    win[3] = 9;
    q[1].win_blocks = NULL;
    q[1].n_win_blocks = 0;
    T_CHECK(exec_step(ex, &st, out, &f, &sm, &code, text, sizeof text) < 0 && strstr(text, "some sequences"),
            "window tables on one sequence of two: %s", text);
    q[1].win_blocks = win + 3;
    q[1].n_win_blocks = 1;
    q[0].win_blocks = NULL;
    q[0].n_win_blocks = 0;
    T_CHECK(exec_step(ex, &st, out, &f, &sm, &code, text, sizeof text) < 0 && strstr(text, "some sequences"),
            "window tables on the second of two: %s", text);
    exec_free(ex);
}

static void s_submit_rules(void)
{
    world_t *w = calloc(1, sizeof *w);
    sched_opts_t so;
    sched_opts_default(&so);
    so.kv_blocks = 4;
    so.block_size = 4;
    so.max_context = 100; /* clamped to 16 */
    so.vocab = 10;
    so.n_eos = 2; /* the second of two eos ids stops a request too */
    so.eos_ids[0] = 8;
    so.eos_ids[1] = 9;
    so.max_live = 2;
    so.retain_s = 5;
    sched_sink_t sink = {s_tokens, s_done, s_error, w};
    sched_t *s = NULL;
    T_CHECK(sched_create(&s, &so, &sink) == 0 && sched_opts(s)->max_context == 16, "create, context clamped to the KV cache");
    if (!s) {
        free(w);
        return;
    }
    int32_t p[20] = {1, 2, 3};
    msg_submit_t sub = {.prompt = p, .n_prompt = 3, .max_tokens = 100};
    sub.samp.top_p = 1;
    char text[300];
    w->n = 3;
    w->r[0].id = 11;
    w->r[1].id = 12;
    w->r[2].id = 13;
    T_CHECK(sched_submit(s, 11, &sub, 0, text, sizeof text) == MSG_E_NONE, "submit: %s", text);
    T_CHECK(sched_submit(s, 11, &sub, 0, text, sizeof text) == MSG_E_NONE, "the same request again: %s", text);
    sub.samp.seed = 5;
    T_CHECK(sched_submit(s, 11, &sub, 0, text, sizeof text) == MSG_E_DUPLICATE, "duplicate: %s", text);
    sub.samp.seed = 0;
    p[2] = 4;
    T_CHECK(sched_submit(s, 11, &sub, 0, text, sizeof text) == MSG_E_DUPLICATE, "duplicate: %s", text);
    p[2] = 3;
    T_CHECK(sched_submit(s, 0, &sub, 0, text, sizeof text) == MSG_E_INVALID_PARAM, "id 0: %s", text);
    p[1] = 10;
    T_CHECK(sched_submit(s, 12, &sub, 0, text, sizeof text) == MSG_E_INVALID_PARAM && strstr(text, "prompt[1]"), "token: %s", text);
    p[1] = 2;
    sub.n_prompt = 16;
    T_CHECK(sched_submit(s, 12, &sub, 0, text, sizeof text) == MSG_E_CONTEXT_OVERFLOW, "overflow: %s", text);
    sub.n_prompt = 0;
    T_CHECK(sched_submit(s, 12, &sub, 0, text, sizeof text) == MSG_E_INVALID_PARAM, "empty: %s", text);
    sub.n_prompt = 3;
    T_CHECK(sched_submit(s, 12, &sub, 0, text, sizeof text) == MSG_E_NONE, "second: %s", text);
    T_CHECK(sched_submit(s, 13, &sub, 0, text, sizeof text) == MSG_E_BUSY, "busy: %s", text);
    T_CHECK(sched_cancel(s, 99, 0) == MSG_E_NOT_FOUND, "cancel unknown");
    T_CHECK(sched_resume(s, 99, 0) == MSG_E_NOT_FOUND, "resume unknown");
    /* run request 11 by hand: the plan asks for 3 prompt tokens + sample */
    msg_step_t plan;
    int n = sched_plan(s, 5, &plan, 0.1);
    T_CHECK(n == 2 && plan.instance == 5 && plan.seqs[0].n_tokens == 3 && plan.seqs[0].sample, "first plan: %d seqs", n);
    T_CHECK(sched_plan(s, 5, &plan, 0.1) == 0, "one plan in flight");
    uint64_t rq[2] = {11, 99};
    int32_t tk[2] = {4, 5};
    msg_result_t res = {5, 2, rq, tk, 0, 0};
    T_CHECK(sched_apply(s, &res, 0.2) < 0, "a result of other requests is refused");
    rq[1] = 12;
    T_CHECK(sched_apply(s, &res, 0.2) == 0 && w->r[0].n_got == 1 && w->r[0].got[0] == 4, "apply");
    T_CHECK(sched_cancel(s, 12, 0.3) == MSG_E_NONE && w->r[1].dones == 1 && w->r[1].finish == MSG_FINISH_CANCEL, "cancel live");
    n = sched_plan(s, 5, &plan, 0.3);
    T_CHECK(n == 1 && plan.seqs[0].pos0 == 3 && plan.seqs[0].n_tokens == 1 && plan.seqs[0].tokens[0] == 4 &&
                plan.seqs[0].n_sampled == 1, "decode plan");
    rq[0] = 11;
    tk[0] = 9; /* the second eos id */
    res.n_seqs = 1;
    T_CHECK(sched_apply(s, &res, 0.4) == 0 && w->r[0].dones == 1 && w->r[0].finish == MSG_FINISH_STOP, "eos stops");
    T_CHECK(sched_has_work(s) == false, "idle");
    w->r[0].n_got = 0;
    T_CHECK(sched_resume(s, 11, 2) == MSG_E_NONE && w->r[0].n_got == 0 && w->r[0].dones == 2, "resume from 2: no tokens, done");
    w->r[0].n_got = 1;
    T_CHECK(sched_resume(s, 11, 1) == MSG_E_NONE && w->r[0].n_got == 2 && w->r[0].got[1] == 9, "resume from 1: the eos token");
    w->r[0].n_got = 0;
    T_CHECK(sched_resume(s, 11, 0) == MSG_E_NONE && w->r[0].n_got == 2 && w->r[0].got[1] == 9 && w->r[0].dones == 4,
            "resume from 0: both tokens and done");
    T_CHECK(sched_submit(s, 11, &sub, 1, text, sizeof text) == MSG_E_NONE, "a finished id is replaced: %s", text);
    T_CHECK(sched_cancel(s, 11, 1) == MSG_E_NONE, "cancel");
    sched_expire(s, 3);
    T_CHECK(sched_resume(s, 11, 0) == MSG_E_NONE, "retained for 5 s");
    sched_expire(s, 7);
    T_CHECK(sched_resume(s, 11, 0) == MSG_E_NOT_FOUND && sched_resume(s, 12, 0) == MSG_E_NOT_FOUND, "expired after 5 s");
    /* two tokens asked: the prefill's token is not the last, the decode step's is (the executor
     * starts no step after it) */
    sub.max_tokens = 2;
    T_CHECK(sched_submit(s, 13, &sub, 8, text, sizeof text) == MSG_E_NONE, "short: %s", text);
    n = sched_plan(s, 5, &plan, 8.1);
    T_CHECK(n == 1 && plan.seqs[0].sample && !plan.seqs[0].last, "short: the prefill's token is not the last");
    rq[0] = 13;
    tk[0] = 4;
    res.n_seqs = 1;
    T_CHECK(sched_apply(s, &res, 8.2) == 0, "apply the prefill");
    n = sched_plan(s, 5, &plan, 8.3);
    T_CHECK(n == 1 && plan.seqs[0].sample && plan.seqs[0].last, "short: the decode step's token is the last");
    T_CHECK(sched_apply(s, &res, 8.4) == 0 && w->r[2].dones == 1 && w->r[2].finish == MSG_FINISH_LENGTH,
            "short: done by length");
    T_CHECK(sched_check(s, text, sizeof text) == 0, "check: %s", text);
    sched_free(s);
    free(w);
}

int main(void)
{
    uint64_t seed = t_seed();
    tpool_t *pool = tpool_create(2);
    static const struct {
        arch_t arch;
        wfmt_t fmt;
    } models[] = {{ARCH_MIXTRAL, WF_F32}, {ARCH_QWEN3_MOE, WF_BF16}, {ARCH_GPT_OSS, WF_F32}};
    static const scen_t scens[] = {
        {"roomy", 64, 8, 256, 4, 0, 24, 0, 0, false},
        {"tight-kv", 12, 6, 20, 4, 0, 20, 0, 0, true},
        {"crashes", 32, 8, 128, 8, 0, 20, 12, 0, false},
        {"tight+all", 10, 4, 16, 4, 60, 20, 15, 0.02, true},
        {"poison", 32, 8, 128, 8, 0, 12, 0, 0, false, true},
    };
    s_submit_rules();
    for (size_t a = 0; a < sizeof models / sizeof models[0]; a++) {
        model_config_t c;
        synth_config(&c, models[a].arch, 61, 32, 2, 4, 2, 8, 4, 2, 24);
        c.eos_id = 7; /* two eos ids: requests stop at either, as generate_tokens does */
        c.n_eos = 2;
        c.eos_ids[0] = 7;
        c.eos_ids[1] = 11;
        if (models[a].arch == ARCH_GPT_OSS) c.sliding_window = 6; /* layer 0 slides: shorter than most requests */
        model_t m;
        uint64_t rng = seed + a;
        int rc = synth_model(&m, &c, models[a].fmt, 32, seed + 100 + a);
        T_CHECK(rc == 0, "synth_model: %s", strata_strerror(rc));
        if (rc < 0) continue;
        m.cfg.max_pos = 64;
        if (a == 0) s_refusals(&m);
        if (models[a].arch == ARCH_GPT_OSS) s_win_refusals(&m);
        for (size_t k = 0; k < sizeof scens / sizeof scens[0]; k++) s_run(&m, pool, &scens[k], &rng);
        model_free(&m);
    }
    tpool_destroy(pool);
    T_CHECK(s_second_eos_stops > 0, "no request ended at the second eos id");
    return t_done("engine");
}
