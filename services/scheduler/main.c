/* strata-scheduler - owns every request and plans the executor's steps (sched.h).
 *
 * Sockets (proto/PROTOCOL.md):
 *   - a ROUTER bound at [scheduler] endpoint for the router (HANDOVER: a restarted router takes
 *     the routing id "router" over; MANDATORY: events for a router that is not connected are
 *     dropped, the request state kept here is enough for its later `resume`);
 *   - a DEALER (routing id "scheduler") connected to [executor] endpoint: ZeroMQ reconnects by
 *     itself when the executor restarts.
 *
 * One plan is in flight at a time. The executor is known by the instance of its last hello:
 *   - a hello with a new instance (the executor answers our probes, and says hello by itself
 *     when it starts) means the executor restarted: the plan in flight is dropped and every
 *     live sequence is re-prefilled (sched_reset_kv), so nothing is lost;
 *   - an error "stale instance" for the plan in flight means the same: we probe for the new
 *     instance before planning again;
 *   - a plan not answered within a second gets a hello probe every second (a slow step is
 *     answered in order after its result; a dead executor's successor answers with a new
 *     instance).
 * Until the first executor hello the model (vocab, eos, context) is unknown: submits are held
 * (up to MAX_HELD, for at most HELD_WAIT_S; beyond either they are refused with `unavailable`)
 * and queued when it arrives, so the requests a router resubmits to a restarted scheduler wait
 * for the executor instead of failing; router hellos are not answered.
 *
 * Exit codes: 0 clean stop, 1 runtime failure (restart me), 2 bad config or usage.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>
#include <zmq.h>

#include "common/config.h"
#include "common/notify.h"
#include "common/service.h"
#include "common/strata.h"
#include "proto/msg.h"
#include "proto/zmsg.h"
#include "services/scheduler/sched.h"

#define ROUTER_ID "router"
#define PROBE_UNKNOWN_S 0.2   /* hello to an executor we do not know yet */
#define PROBE_SLOW_S 1.0      /* hello while a plan is unanswered, or the executor is silent */
#define READY_ANYWAY_S 5.0    /* report READY without an executor after this long */
#define EXPIRE_EVERY_S 1.0
#define ROUTER_BATCH 1024     /* router messages handled between plans */
#define STATS_WAIT_S 0.3      /* a stats reply waits this long for the executor's counters */
#define MAX_PENDING_STATS 16
#define SPIN_TAIL_S 1e-3      /* backend = cuda: the poll spins through the last ms of a step's expected round trip */
#define MAX_HELD 4096         /* submits held while no executor has reported (a restart) */
#define HELD_WAIT_S 60.0      /* ... at most this long, then refused as unavailable */

static void s_usage(FILE *f)
{
    fprintf(f,
            "usage: strata-scheduler --config FILE\n\n"
            "Owns every request of the group (token history, sampling parameters, KV block table) and plans\n"
            "the executor's steps: continuous batching with a token budget per step ([scheduler]\n"
            "max_batch_tokens), chunked prefill, paged KV blocks (kv_blocks x block_size), preemption by\n"
            "recompute, replay of live sequences after an executor restart. Binds a ROUTER at [scheduler]\n"
            "endpoint for the router and connects to [executor] endpoint (proto/PROTOCOL.md).\n\n"
            "  --config FILE   the group config (INI, common/config.h)\n"
            "  --help          this text\n\n"
            "Exit codes: 0 clean stop (SIGTERM/SIGINT), 1 runtime failure, 2 bad config or usage.\n");
}

#define PT_MAX 256 /* one-token events batched into one `step_tokens` message at most */

/* A submit that arrived before any executor reported (after a restart of this scheduler the
 * router resubmits its live requests at once): kept, decoded, until the model is known. */
typedef struct {
    uint8_t route[256];
    size_t route_len;
    msg_t m;
    double deadline;
} held_submit_t;

/* A router `stats` request waiting for the executor's counters. */
typedef struct {
    uint8_t route[256];
    size_t route_len;
    bool has_id;
    uint64_t id;          /* the router's request id */
    uint64_t seq;         /* id of our `stats` request to the executor */
    double deadline;
} pending_stats_t;

typedef struct {
    const strata_config_t *cfg;
    void *zctx, *rsock, *esock;
    msg_buf_t buf, ebuf;
    sched_t *sc;
    uint64_t instance;          /* this scheduler's, random */
    double t_start;
    bool ready;
    /* the executor */
    uint64_t exec_instance;     /* 0 = unknown: no plan is sent */
    bool have_model;
    msg_hello_t ex;             /* its last hello (model string and eos ids copied below) */
    char model[257];
    int32_t ex_eos[MSG_MAX_EOS]; /* ex.eos_ids points here */
    double t_exec_rx, t_probe;
    /* the plan in flight */
    uint64_t step_id, next_step;
    double t_sent;
    double step_s;              /* a step's round trip, averaged (the poll's sleep while one is out) */
    int32_t sent_tokens;
    /* counters */
    uint64_t exec_restarts, events_dropped, bad_msgs, stale_results;
    double sum_rtt_us, sum_fwd_us, sum_smp_us, sum_plan_us, sum_apply_us;
    uint64_t n_rtt;
    double t_expire;
    pending_stats_t pstats[MAX_PENDING_STATS];
    int n_pstats;
    held_submit_t *held;        /* [n_held] submits waiting for the executor's first report */
    int n_held, cap_held;
    uint64_t stats_seq;
    /* one-token events waiting to go to the router as one `step_tokens` (s_flush_tokens) */
    uint64_t pt_reqs[PT_MAX];
    int32_t pt_index[PT_MAX], pt_tokens[PT_MAX];
    int n_pt;
    /* ... and their log-probabilities, when some of them has any (msg_lp_rows_t) */
    bool pt_lp;
    float pt_logprob[PT_MAX];
    int32_t pt_top_n[PT_MAX];                      /* -1: that event has none */
    int32_t pt_top_tok[PT_MAX * MSG_MAX_TOP_LOGPROBS];
    float pt_top_lp[PT_MAX * MSG_MAX_TOP_LOGPROBS];
    int n_pt_top;
} svc_t;

/* ---- events to the router ---- */

static void s_to_router(svc_t *S, const msg_t *m)
{
    int rc = zmsg_send(S->rsock, ROUTER_ID, strlen(ROUTER_ID), m, &S->buf, ZMQ_DONTWAIT);
    if (rc < 0) {
        S->events_dropped++;
        if (rc != -EHOSTUNREACH && rc != -EAGAIN) log_warn("send %s to the router: %s", msg_type_name(m->type), strata_strerror(rc));
    }
}

/* Send the batched one-token events as one `step_tokens` message. Called before any other
 * event (so a request's `done` never overtakes its last token) and once per loop turn. One
 * message a step instead of one per sequence: at 32 sequences that is most of the control
 * plane's cost per step (bench/ctrl_plane). */
static void s_flush_tokens(svc_t *S)
{
    if (!S->n_pt) return;
    msg_t m;
    msg_init(&m, MSG_SCHED_STEP_TOKENS);
    m.u.step_tokens = (msg_step_tokens_t){.n = S->n_pt, .reqs = S->pt_reqs, .index = S->pt_index, .tokens = S->pt_tokens};
    if (S->pt_lp)
        m.u.step_tokens.lp = (msg_lp_rows_t){.n_logprobs = S->n_pt, .logprobs = S->pt_logprob, .n_top_n = S->n_pt,
                                             .top_n = S->pt_top_n, .n_top_tokens = S->n_pt_top, .top_tokens = S->pt_top_tok,
                                             .n_top_logprobs = S->n_pt_top, .top_logprobs = S->pt_top_lp};
    S->n_pt = S->n_pt_top = 0;
    S->pt_lp = false;
    s_to_router(S, &m);
}

static void s_ev_tokens(void *ctx, uint64_t id, int64_t index, const int32_t *toks, int32_t n, const sched_lp_t *lp)
{
    svc_t *S = ctx;
    if (n == 1 && index <= INT32_MAX) {
        if (S->n_pt == PT_MAX) s_flush_tokens(S);
        const int k = S->n_pt;
        S->pt_reqs[k] = id;
        S->pt_index[k] = (int32_t)index;
        S->pt_tokens[k] = toks[0];
        S->pt_logprob[k] = lp ? lp->logprobs[0] : 0;
        S->pt_top_n[k] = lp ? lp->top_n : -1;
        if (lp) {
            S->pt_lp = true;
            memcpy(S->pt_top_tok + S->n_pt_top, lp->top_tokens, (size_t)lp->top_n * sizeof *S->pt_top_tok);
            memcpy(S->pt_top_lp + S->n_pt_top, lp->top_logprobs, (size_t)lp->top_n * sizeof *S->pt_top_lp);
            S->n_pt_top += lp->top_n;
        }
        S->n_pt++;
        return;
    }
    s_flush_tokens(S);
    msg_t m;
    msg_init(&m, MSG_SCHED_TOKENS);
    m.has_id = true;
    m.id = id;
    m.u.tokens.index = index;
    m.u.tokens.n_tokens = n;
    m.u.tokens.tokens = n ? toks : (const int32_t *)"";
    if (lp)
        m.u.tokens.lp = (msg_logprobs_t){.n_logprobs = n, .logprobs = lp->logprobs, .top_n = lp->top_n,
                                          .n_top_tokens = n * lp->top_n, .top_tokens = lp->top_tokens,
                                          .n_top_logprobs = n * lp->top_n, .top_logprobs = lp->top_logprobs};
    s_to_router(S, &m);
}

static void s_ev_done(void *ctx, uint64_t id, const msg_done_t *d)
{
    svc_t *S = ctx;
    s_flush_tokens(S);
    msg_t m;
    msg_init(&m, MSG_SCHED_DONE);
    m.has_id = true;
    m.id = id;
    m.u.done = *d;
    s_to_router(S, &m);
}

static void s_ev_error(void *ctx, uint64_t id, msg_errcode_t code, const char *text)
{
    svc_t *S = ctx;
    s_flush_tokens(S);
    int rc = zmsg_send_error(S->rsock, ROUTER_ID, strlen(ROUTER_ID), MSG_SCHED_ERROR, true, id, code, text, &S->buf, ZMQ_DONTWAIT);
    if (rc < 0) S->events_dropped++;
}

/* ---- router messages ---- */

static void s_reply_error(svc_t *S, const void *route, size_t len, bool has_id, uint64_t id, msg_errcode_t code, const char *text)
{
    if (zmsg_send_error(S->rsock, route, len, MSG_SCHED_ERROR, has_id, id, code, text, &S->buf, ZMQ_DONTWAIT) < 0)
        S->events_dropped++;
}

static void s_reply_hello(svc_t *S, const void *route, size_t len)
{
    if (!S->have_model) return; /* the router counts us as up once we can describe the model */
    msg_t m;
    msg_init(&m, MSG_SCHED_HELLO_REPLY);
    m.u.hello = S->ex;
    m.u.hello.instance = S->instance;
    m.u.hello.pid = (int32_t)getpid();
    m.u.hello.model = msg_str(S->model);
    m.u.hello.max_context = sched_opts(S->sc)->max_context;
    m.u.hello.kv_blocks = sched_opts(S->sc)->kv_blocks;
    m.u.hello.block_size = sched_opts(S->sc)->block_size;
    if (zmsg_send(S->rsock, route, len, &m, &S->buf, ZMQ_DONTWAIT) < 0) S->events_dropped++;
}

/* Reply to a router `stats` request: the scheduler's counters, plus the executor's under
 * "executor." if ex is not NULL. */
static void s_reply_stats(svc_t *S, const void *route, size_t len, bool has_id, uint64_t id, const msg_stats_t *ex)
{
    msg_stat_t items[64 + 48];
    char names[48][136];
    int n = 0;
    double now = strata_now();
    sched_counters_t c;
    memset(&c, 0, sizeof c);
    if (S->sc) sched_get_counters(S->sc, &c);
#define S_STAT(name, val) items[n++] = (msg_stat_t){msg_str(name), (double)(val)}
    S_STAT("requests_submitted", c.submitted);
    S_STAT("requests_resubmitted", c.resubmits);
    S_STAT("requests_finished", c.finished);
    S_STAT("requests_canceled", c.canceled);
    S_STAT("requests_failed", c.failed);
    S_STAT("waiting", c.waiting);
    S_STAT("running", c.running);
    S_STAT("retained", c.retained);
    S_STAT("steps", c.steps);
    S_STAT("prefill_tokens", c.prefill_tokens);
    S_STAT("decode_tokens", c.decode_tokens);
    S_STAT("generated_tokens", c.generated);
    S_STAT("mixed_steps", c.mixed_steps);
    S_STAT("step_tokens_max", c.step_tokens_max);
    S_STAT("step_seqs_max", c.step_seqs_max);
    S_STAT("preemptions", c.preemptions);
    S_STAT("replayed_seqs", c.replayed);
    S_STAT("kv_resets", c.kv_resets);
    S_STAT("requests_poisoned", c.poisoned);
    S_STAT("kv_blocks", S->sc ? sched_opts(S->sc)->kv_blocks : 0);
    S_STAT("kv_blocks_free", c.kv_free);
    /* window tables (sched.h): the window (0: none), the blocks they hold now, and the most one
     * sequence held after a step */
    S_STAT("kv_sliding_window", S->sc ? sched_opts(S->sc)->sliding_window : 0);
    S_STAT("kv_win_blocks_used", c.kv_win_used);
    S_STAT("kv_win_blocks_seq_max", c.kv_win_seq_max);
    S_STAT("executor_restarts", S->exec_restarts);
    S_STAT("executor_up", S->exec_instance != 0);
    S_STAT("executor_load_ms", S->ex.load_ms);
    S_STAT("events_dropped", S->events_dropped);
    S_STAT("stale_results", S->stale_results);
    S_STAT("bad_messages", S->bad_msgs);
    S_STAT("uptime_s", now - S->t_start);
    /* per step, averaged: round trip to the executor, its forward and sampling time, and the
     * control-plane cost (round trip minus the executor's compute: ZeroMQ + msgpack both ways) */
    double k = S->n_rtt ? (double)S->n_rtt : 1;
    S_STAT("step_rtt_us_avg", S->sum_rtt_us / k);
    S_STAT("step_forward_us_avg", S->sum_fwd_us / k);
    S_STAT("step_sample_us_avg", S->sum_smp_us / k);
    S_STAT("step_plan_us_avg", S->sum_plan_us / k);
    S_STAT("step_ctrl_us_avg", (S->sum_rtt_us - S->sum_fwd_us - S->sum_smp_us) / k);
    S_STAT("step_apply_us_avg", S->sum_apply_us / k);
    /* totals, for rates over an interval (bench/group_bench.py) */
    S_STAT("steps_timed", S->n_rtt);
    S_STAT("step_rtt_us_total", S->sum_rtt_us);
    S_STAT("step_forward_us_total", S->sum_fwd_us);
    S_STAT("step_sample_us_total", S->sum_smp_us);
    S_STAT("step_plan_us_total", S->sum_plan_us);
    S_STAT("step_apply_us_total", S->sum_apply_us);
#undef S_STAT
    for (int i = 0; ex && i < ex->n && i < 48; i++) {
        int l = snprintf(names[i], sizeof names[i], "executor.%.*s", (int)ex->items[i].name.len, ex->items[i].name.s);
        if (l <= 0 || l > 128) continue;
        items[n++] = (msg_stat_t){{names[i], (size_t)l}, ex->items[i].value};
    }
    msg_t m;
    msg_init(&m, MSG_SCHED_STATS_REPLY);
    m.has_id = has_id;
    m.id = id;
    m.u.stats.n = n;
    m.u.stats.items = items;
    if (zmsg_send(S->rsock, route, len, &m, &S->buf, ZMQ_DONTWAIT) < 0) S->events_dropped++;
}

/* A router `stats` request: ask the executor for its counters first (answered between its
 * steps); s_on_exec_stats or the deadline sends the reply. */
static void s_stats_request(svc_t *S, const void *route, size_t len, const msg_t *in, double now)
{
    if (S->exec_instance == 0 || S->n_pstats >= MAX_PENDING_STATS || len > sizeof S->pstats[0].route) {
        s_reply_stats(S, route, len, in->has_id, in->id, NULL);
        return;
    }
    pending_stats_t *p = &S->pstats[S->n_pstats++];
    memcpy(p->route, route, len);
    p->route_len = len;
    p->has_id = in->has_id;
    p->id = in->id;
    p->seq = ++S->stats_seq;
    p->deadline = now + STATS_WAIT_S;
    msg_t m;
    msg_init(&m, MSG_EXEC_STATS);
    m.has_id = true;
    m.id = p->seq;
    if (zmsg_send(S->esock, NULL, 0, &m, &S->ebuf, ZMQ_DONTWAIT) < 0) p->deadline = now; /* replied at the next tick */
}

static void s_on_exec_stats(svc_t *S, const msg_t *m)
{
    for (int i = 0; i < S->n_pstats; i++)
        if (m->has_id && S->pstats[i].seq == m->id) {
            pending_stats_t p = S->pstats[i];
            S->pstats[i] = S->pstats[--S->n_pstats];
            s_reply_stats(S, p.route, p.route_len, p.has_id, p.id, &m->u.stats);
            return;
        }
}

static void s_stats_timeouts(svc_t *S, double now)
{
    for (int i = 0; i < S->n_pstats;) {
        if (now >= S->pstats[i].deadline) {
            pending_stats_t p = S->pstats[i];
            S->pstats[i] = S->pstats[--S->n_pstats];
            s_reply_stats(S, p.route, p.route_len, p.has_id, p.id, NULL);
        } else {
            i++;
        }
    }
}

/* Keep a submit until the executor reports; false when it cannot be kept. Takes m on success. */
static bool s_hold_submit(svc_t *S, const void *route, size_t len, msg_t *m, double now)
{
    if (S->n_held >= MAX_HELD || len > sizeof S->held[0].route) return false;
    if (S->n_held == S->cap_held) {
        int cap = S->cap_held ? 2 * S->cap_held : 64;
        held_submit_t *h = realloc(S->held, (size_t)cap * sizeof *h);
        if (!h) return false;
        S->held = h;
        S->cap_held = cap;
    }
    held_submit_t *h = &S->held[S->n_held++];
    memcpy(h->route, route, len);
    h->route_len = len;
    h->m = *m;
    h->deadline = now + HELD_WAIT_S;
    return true;
}

/* The model is known: submit what was held, in arrival order. */
static void s_release_held(svc_t *S, double now)
{
    char text[300];
    for (int i = 0; i < S->n_held; i++) {
        held_submit_t *h = &S->held[i];
        msg_errcode_t code = sched_submit(S->sc, h->m.id, &h->m.u.submit, now, text, sizeof text);
        if (code != MSG_E_NONE) s_reply_error(S, h->route, h->route_len, true, h->m.id, code, text);
        msg_free(&h->m);
    }
    if (S->n_held) log_info("%d submits held until the executor reported are now queued", S->n_held);
    S->n_held = 0;
}

/* Held submits past their deadline (no executor for HELD_WAIT_S) are refused. */
static void s_held_timeouts(svc_t *S, double now)
{
    for (int i = 0; i < S->n_held;) {
        held_submit_t *h = &S->held[i];
        if (now < h->deadline) {
            i++;
            continue;
        }
        char text[120];
        snprintf(text, sizeof text, "no executor has reported for %.0f s; retry later", HELD_WAIT_S);
        s_reply_error(S, h->route, h->route_len, true, h->m.id, MSG_E_UNAVAILABLE, text);
        msg_free(&h->m);
        memmove(h, h + 1, (size_t)(S->n_held - i - 1) * sizeof *h);
        S->n_held--;
    }
}

static void s_on_router_msg(svc_t *S, const void *route, size_t len, const void *data, size_t size)
{
    msg_t m;
    msg_err_t err;
    double now = strata_now();
    if (msg_decode(MSG_FAM_SCHED_IN, data, size, &m, &err) < 0) {
        S->bad_msgs++;
        log_warn("bad message from the router: %s", err.text);
        s_reply_error(S, route, len, m.has_id, m.id, err.code, err.text);
        msg_free(&m);
        return;
    }
    char text[300];
    switch (m.type) {
    case MSG_SUBMIT: {
        msg_errcode_t code;
        if (!S->sc) {
            if (s_hold_submit(S, route, len, &m, now)) return; /* m is held, not freed */
            code = MSG_E_UNAVAILABLE;
            snprintf(text, sizeof text, "the executor has not reported yet and %d submits are waiting; retry later",
                     S->n_held);
        } else {
            code = sched_submit(S->sc, m.id, &m.u.submit, now, text, sizeof text);
        }
        if (code != MSG_E_NONE) s_reply_error(S, route, len, true, m.id, code, text);
        break;
    }
    case MSG_SCHED_CANCEL:
        if (!S->sc || sched_cancel(S->sc, m.id, now) == MSG_E_NOT_FOUND) {
            snprintf(text, sizeof text, "cancel: no request %016llx here", (unsigned long long)m.id);
            s_reply_error(S, route, len, true, m.id, MSG_E_NOT_FOUND, text);
        }
        break;
    case MSG_SCHED_RESUME:
        if (!S->sc || sched_resume(S->sc, m.id, m.u.resume.from) == MSG_E_NOT_FOUND) {
            snprintf(text, sizeof text, "resume: no request %016llx here (finished too long ago, or never submitted)",
                     (unsigned long long)m.id);
            s_reply_error(S, route, len, true, m.id, MSG_E_NOT_FOUND, text);
        }
        break;
    case MSG_SCHED_STATS: s_stats_request(S, route, len, &m, now); break;
    case MSG_SCHED_HELLO: s_reply_hello(S, route, len); break;
    default: STRATA_ASSERT(!"router family decoded to a foreign type");
    }
    msg_free(&m);
}

/* One message from the router socket: [routing id][payload]. 1 handled, 0 none, <0 error. */
static int s_router_recv(svc_t *S)
{
    zmq_msg_t idf, body;
    int frames;
    int rc = zmsg_recv_routed(S->rsock, &idf, &body, &frames);
    if (rc <= 0) return rc;
    if (frames != 1) {
        S->bad_msgs++;
        s_reply_error(S, zmq_msg_data(&idf), zmq_msg_size(&idf), false, 0, MSG_E_MALFORMED,
                      "a message must be exactly one frame after the routing id");
    } else {
        s_on_router_msg(S, zmq_msg_data(&idf), zmq_msg_size(&idf), zmq_msg_data(&body), zmq_msg_size(&body));
    }
    zmq_msg_close(&body);
    zmq_msg_close(&idf);
    return 1;
}

/* ---- the executor ---- */

static void s_probe(svc_t *S, double now)
{
    msg_t m;
    msg_init(&m, MSG_EXEC_HELLO);
    int rc = zmsg_send(S->esock, NULL, 0, &m, &S->ebuf, ZMQ_DONTWAIT);
    if (rc < 0 && rc != -EAGAIN) log_warn("hello to the executor: %s", strata_strerror(rc));
    S->t_probe = now;
}

static int s_make_sched(svc_t *S)
{
    const strata_config_t *c = S->cfg;
    sched_opts_t o;
    sched_opts_default(&o);
    o.max_batch_tokens = c->scheduler.max_batch_tokens;
    o.max_seqs = c->scheduler.max_seqs;
    o.kv_blocks = c->scheduler.kv_blocks;
    o.block_size = c->scheduler.block_size;
    /* the executor's context already accounts for the model, max_context and its KV cache */
    o.max_context = S->ex.max_context;
    if (c->scheduler.max_context > 0 && c->scheduler.max_context < o.max_context) o.max_context = c->scheduler.max_context;
    if (S->ex.kv_blocks > 0 && S->ex.kv_blocks < o.kv_blocks) o.kv_blocks = S->ex.kv_blocks;
    o.vocab = S->ex.vocab;
    o.n_eos = msg_hello_eos(&S->ex, o.eos_ids);
    o.sliding_window = S->ex.sliding_window; /* window tables for the sliding layers (sched.h) */
    o.max_live = c->router.max_queue + 64;
    sched_sink_t sink = {s_ev_tokens, s_ev_done, s_ev_error, S};
    int rc = sched_create(&S->sc, &o, &sink);
    if (rc < 0) return rc;
    char eos[MSG_MAX_EOS * 12 + 8] = "none";
    for (int32_t i = 0, at = 0; i < o.n_eos; i++)
        at += snprintf(eos + at, sizeof eos - (size_t)at, "%s%d", i ? " " : "", o.eos_ids[i]);
    log_info("model %s: vocab %d, eos %s, context %d; KV %d blocks x %d, %d tokens and %d sequences a step", S->model, o.vocab,
             eos, sched_opts(S->sc)->max_context, o.kv_blocks, o.block_size, o.max_batch_tokens, o.max_seqs);
    if (sched_opts(S->sc)->sliding_window > 0)
        log_info("sliding-window layers over %d tokens: each sequence keeps their K/V in a window table", o.sliding_window);
    else if (o.sliding_window > 0)
        log_info("sliding-window layers over %d tokens, no shorter than the context: no window tables", o.sliding_window);
    return 0;
}

static void s_on_exec_hello(svc_t *S, const msg_hello_t *h, double now)
{
    if (h->instance == S->exec_instance) return;
    bool restarted = S->have_model;
    S->ex = *h;
    snprintf(S->model, sizeof S->model, "%.*s", (int)h->model.len, h->model.s ? h->model.s : "");
    S->ex.model = msg_str(S->model);
    /* the hello's arrays live in the decoded message: keep the whole stop set, which the router
     * gets in our own hello */
    S->ex.n_eos = msg_hello_eos(h, S->ex_eos);
    S->ex.eos_ids = S->ex.n_eos ? S->ex_eos : NULL;
    S->ex.eos_id = S->ex.n_eos ? S->ex_eos[0] : -1;
    if (!S->sc) {
        if (s_make_sched(S) < 0) {
            log_error("executor reported an unusable model (vocab %d, context %d)", h->vocab, h->max_context);
            return;
        }
        S->have_model = true;
        s_release_held(S, now);
    }
    if (restarted) {
        sched_counters_t c;
        sched_get_counters(S->sc, &c);
        S->exec_restarts++;
        log_warn("executor restarted (instance %016llx, pid %d, model built in %.1f ms): replaying %d running sequences",
                 (unsigned long long)h->instance, h->pid, h->load_ms, c.running);
        sched_reset_kv(S->sc, now);
    } else {
        log_info("executor instance %016llx (pid %d) ready; model built in %.1f ms", (unsigned long long)h->instance, h->pid,
                 h->load_ms);
    }
    S->exec_instance = h->instance;
}

static void s_on_exec_msg(svc_t *S, const msg_t *m, double now)
{
    S->t_exec_rx = now;
    switch (m->type) {
    case MSG_EXEC_HELLO_REPLY: s_on_exec_hello(S, &m->u.hello, now); break;
    case MSG_STEP_RESULT: {
        const msg_result_t *r = &m->u.result;
        if (!S->sc || !sched_inflight(S->sc) || m->id != S->step_id || r->instance != S->exec_instance ||
            sched_apply(S->sc, r, now) < 0) {
            S->stale_results++;
            break;
        }
        double rtt = (now - S->t_sent) * 1e6;
        S->step_s += (S->step_s > 0 ? 0.2 : 1.0) * (rtt * 1e-6 - S->step_s);
        S->sum_rtt_us += rtt;
        S->sum_fwd_us += r->forward_us;
        S->sum_smp_us += r->sample_us;
        S->n_rtt++;
        break;
    }
    case MSG_EXEC_ERROR: {
        const msg_error_t *e = &m->u.error;
        if (!S->sc || !sched_inflight(S->sc) || !m->has_id || m->id != S->step_id) {
            log_debug("executor error for no plan in flight: %.*s", (int)e->message.len, e->message.s);
            break;
        }
        if (e->code == MSG_E_UNAVAILABLE) {
            /* "stale instance": a new executor got our plan; learn its instance, then replay */
            log_warn("executor refused step %llu: %.*s; probing it", (unsigned long long)m->id, (int)e->message.len, e->message.s);
            S->exec_instance = 0;
            sched_reset_kv(S->sc, now);
            s_probe(S, now);
        } else {
            log_error("executor refused step %llu: %s: %.*s; failing its requests", (unsigned long long)m->id,
                      msg_errcode_name(e->code), (int)e->message.len, e->message.s);
            char text[300];
            snprintf(text, sizeof text, "executor: %.*s", (int)(e->message.len > 250 ? 250 : e->message.len), e->message.s);
            sched_fail_inflight(S->sc, e->code == MSG_E_INVALID_PARAM ? MSG_E_INTERNAL : e->code, text, now);
        }
        break;
    }
    case MSG_EXEC_STATS_REPLY: s_on_exec_stats(S, m); break;
    default: STRATA_ASSERT(!"executor family decoded to a foreign type");
    }
}

static int s_exec_recv(svc_t *S)
{
    msg_t m;
    msg_err_t err;
    double t0 = strata_now();
    int rc = zmsg_recv(S->esock, MSG_FAM_EXEC_OUT, &m, &err, ZMQ_DONTWAIT);
    if (rc == -EAGAIN || rc == -EINTR) {
        msg_free(&m);
        return 0;
    }
    if (rc < 0 && rc > -1000) {
        msg_free(&m);
        return rc;
    }
    if (rc < 0) {
        S->bad_msgs++;
        log_error("bad message from the executor: %s", err.text);
    } else {
        uint64_t n0 = S->n_rtt;
        s_on_exec_msg(S, &m, strata_now());
        /* receive + decode + apply + token events to the router, for an applied result */
        if (S->n_rtt != n0) S->sum_apply_us += (strata_now() - t0) * 1e6;
    }
    msg_free(&m);
    return 1;
}

/* Plan and send the next step if the executor is known and nothing is in flight. */
static void s_step(svc_t *S)
{
    if (!S->sc || S->exec_instance == 0 || !sched_has_work(S->sc)) return;
    double t0 = strata_now();
    msg_t m;
    msg_init(&m, MSG_STEP);
    int n = sched_plan(S->sc, S->exec_instance, &m.u.step, t0);
    if (n == 0) return;
    m.has_id = true;
    m.id = S->next_step++;
    int rc = zmsg_send(S->esock, NULL, 0, &m, &S->ebuf, ZMQ_DONTWAIT);
    double t1 = strata_now();
    if (rc < 0) {
        /* the plan never left: treat it like a lost one (recompute; nothing was applied) */
        log_warn("send step to the executor: %s", strata_strerror(rc));
        sched_reset_kv(S->sc, t1);
        S->exec_instance = 0;
        s_probe(S, t1);
        return;
    }
    S->step_id = m.id;
    S->t_sent = t1;
    S->sum_plan_us += (t1 - t0) * 1e6;
}

static int s_setopt_int(void *s, int opt, int v) { return zmq_setsockopt(s, opt, &v, sizeof v); }

int main(int argc, char **argv)
{
    static strata_config_t cfg;
    const char *config = NULL;
    int rc = service_init(argc, argv, "scheduler", s_usage, &cfg, &config);
    if (rc != SERVICE_RUN) return rc;
    rc = SERVICE_EXIT_FAIL;
    if (cfg.scheduler.max_batch_tokens < 1 || cfg.scheduler.max_seqs < 1 || cfg.scheduler.kv_blocks < 1 ||
        cfg.scheduler.block_size < 1) {
        log_error("%s: [scheduler] max_batch_tokens, max_seqs, kv_blocks and block_size must be >= 1", config);
        return SERVICE_EXIT_CONFIG;
    }
    if (cfg.scheduler.max_seqs > cfg.scheduler.max_batch_tokens)
        log_warn("%s: [scheduler] max_seqs = %d > max_batch_tokens = %d: at most %d sequences run at once (one decode token each)",
                 config, cfg.scheduler.max_seqs, cfg.scheduler.max_batch_tokens, cfg.scheduler.max_batch_tokens);
    volatile sig_atomic_t *stop = service_signals();

    static svc_t S;
    S.cfg = &cfg;
    S.t_start = strata_now();
    while (S.instance == 0)
        if (getrandom(&S.instance, sizeof S.instance, 0) != (ssize_t)sizeof S.instance) S.instance = strata_now_ns();
    /* step ids start at a random point, so a result addressed to an earlier scheduler (same
     * routing id, same executor) cannot match a plan of this one */
    S.next_step = (S.instance >> 16) | 1;
    S.zctx = zmq_ctx_new();
    S.rsock = S.zctx ? zmq_socket(S.zctx, ZMQ_ROUTER) : NULL;
    S.esock = S.zctx ? zmq_socket(S.zctx, ZMQ_DEALER) : NULL;
    if (!S.rsock || !S.esock) {
        log_error("zmq: %s", zmq_strerror(zmq_errno()));
        goto done;
    }
    if (s_setopt_int(S.rsock, ZMQ_ROUTER_MANDATORY, 1) || s_setopt_int(S.rsock, ZMQ_ROUTER_HANDOVER, 1) ||
        s_setopt_int(S.rsock, ZMQ_LINGER, 0) || s_setopt_int(S.rsock, ZMQ_SNDHWM, 100000) ||
        s_setopt_int(S.rsock, ZMQ_RCVHWM, 100000) || s_setopt_int(S.esock, ZMQ_LINGER, 0) ||
        s_setopt_int(S.esock, ZMQ_RECONNECT_IVL, 50) || s_setopt_int(S.esock, ZMQ_RECONNECT_IVL_MAX, 500) ||
        zmq_setsockopt(S.esock, ZMQ_ROUTING_ID, "scheduler", 9)) {
        log_error("socket options: %s", zmq_strerror(zmq_errno()));
        goto done;
    }
    if (zmq_bind(S.rsock, cfg.scheduler.endpoint) < 0) {
        int e = zmq_errno();
        log_error("cannot bind [scheduler] endpoint %s: %s", cfg.scheduler.endpoint, zmq_strerror(e));
        rc = service_endpoint_exit_code(e);
        goto done;
    }
    if (zmq_connect(S.esock, cfg.executor.endpoint) < 0) {
        int e = zmq_errno();
        log_error("cannot connect to [executor] endpoint %s: %s", cfg.executor.endpoint, zmq_strerror(e));
        rc = service_endpoint_exit_code(e);
        goto done;
    }
    log_info("instance %016llx: router side %s, executor at %s", (unsigned long long)S.instance, cfg.scheduler.endpoint,
             cfg.executor.endpoint);
    s_probe(&S, strata_now());
    zmq_pollitem_t items[2] = {{S.esock, 0, ZMQ_POLLIN, 0}, {S.rsock, 0, ZMQ_POLLIN, 0}};
    /* backend = cuda: poll without sleeping in a plan's last SPIN_TAIL_S, so the result's wakeup
     * is not on the path of every step, and sleep in the poll before that: a step with CPU
     * experts lasts tens of ms, and a core spun through it is one the prefetchers' workers lack
     * (the CPU backend's threads need the cores, so it sleeps) */
    const bool spin = !strcmp(cfg.executor.backend, "cuda");
    while (!*stop) {
        const bool work = S.sc && S.exec_instance && sched_has_work(S.sc);
        int timeout_ms = work ? 0 : 20;
        if (!work && spin && S.sc && S.exec_instance && sched_inflight(S.sc)) {
            const double left = S.step_s - (strata_now() - S.t_sent);
            timeout_ms = left > 2 * SPIN_TAIL_S ? (int)((left - SPIN_TAIL_S) * 1e3) : 0;
            if (timeout_ms > 20) timeout_ms = 20; /* the probes, expiries and watchdog below stay on time */
        }
        int n = zmq_poll(items, 2, timeout_ms);
        if (n < 0 && zmq_errno() != EINTR) {
            log_error("zmq_poll: %s", zmq_strerror(zmq_errno()));
            goto done;
        }
        /* results first: they free the executor for the next plan */
        for (int k; (k = s_exec_recv(&S)) != 0;)
            if (k < 0) {
                log_error("receive from the executor: %s", strata_strerror(k));
                goto done;
            }
        s_flush_tokens(&S);
        for (int i = 0; i < ROUTER_BATCH; i++) {
            int k = s_router_recv(&S);
            if (k < 0) {
                log_error("receive from the router: %s", strata_strerror(k));
                goto done;
            }
            if (k == 0) break;
        }
        s_step(&S);

        double now = strata_now();
        if (S.exec_instance == 0) {
            if (now - S.t_probe >= PROBE_UNKNOWN_S) s_probe(&S, now);
        } else if (S.sc && sched_inflight(S.sc)) {
            if (now - S.t_sent >= PROBE_SLOW_S && now - S.t_probe >= PROBE_SLOW_S) s_probe(&S, now);
        } else if (now - S.t_exec_rx >= PROBE_SLOW_S && now - S.t_probe >= PROBE_SLOW_S) {
            s_probe(&S, now);
        }
        if (!S.ready && (S.have_model || now - S.t_start >= READY_ANYWAY_S)) {
            if (!S.have_model) log_warn("no executor after %.0f s; serving anyway (submits wait up to %.0f s for it)", READY_ANYWAY_S, HELD_WAIT_S);
            notify_ready();
            S.ready = true;
        }
        if (S.n_pstats) s_stats_timeouts(&S, now);
        if (S.n_held) s_held_timeouts(&S, now);
        if (S.sc && now - S.t_expire >= EXPIRE_EVERY_S) {
            sched_expire(S.sc, now);
            S.t_expire = now;
        }
        s_flush_tokens(&S);
        notify_watchdog();
    }
    service_stopping();
    rc = SERVICE_EXIT_OK;
done:
    if (S.rsock) zmq_close(S.rsock);
    if (S.esock) zmq_close(S.esock);
    if (S.zctx) zmq_ctx_term(S.zctx);
    msg_buf_free(&S.buf);
    msg_buf_free(&S.ebuf);
    for (int i = 0; i < S.n_held; i++) msg_free(&S.held[i].m);
    free(S.held);
    sched_free(S.sc);
    return rc;
}
