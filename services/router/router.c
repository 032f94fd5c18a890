/* router.c - client requests in, scheduler requests out, streamed text back (see router.h).
 *
 * Request lifecycle at the router:
 *   generate -> LIVE (submitted) -> tokens events -> done            -> freed
 *                                \-> stop string matched: done(stop) to the client, cancel to
 *                                    the scheduler -> CLOSING until the scheduler's done
 *   resume   -> RESUMING (asked the scheduler for everything from token 0) -> LIVE ...
 * A request resumed after a router restart was submitted by an earlier router, so this one
 * does not know when (req_t.resumed): its done takes the scheduler's timings, which count
 * from the submission. When such a request ends by a stop string, its done waits for the
 * scheduler's answer to the cancel (done_pending), which carries them.
 * The router tracks, per request, how many generated tokens it has seen (n_gen). A tokens
 * event is placed by its index: indices below n_gen are duplicates (after a resume or a
 * resubmission) and are dropped; an index above n_gen means events were lost, and the router
 * asks the scheduler to resume from n_gen; so does a done that counts more tokens than n_gen.
 * So the stream the client sees has no gaps and no repeats whatever happens between router
 * and scheduler.
 */
#include "services/router/router.h"

#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "common/chat_template.h"
#include "common/notify.h"
#include "proto/msg.h"
#include "proto/zmsg.h"
#include "services/router/text.h"
#include "services/router/rtok.h"

#define CLIENT_BATCH 256          /* client frames handled before looking at the scheduler again */
#define SCHED_BATCH 4096
#define HELLO_EVERY_S 1.0
#define SCHED_DEAD_S 3.0          /* no message from the scheduler for this long: down */
#define START_GRACE_S 5.0         /* accept requests before the first hello answer */
#define ORPHAN_TIMEOUT_S 30.0
#define CLOSING_TIMEOUT_S 30.0
#define STATS_TIMEOUT_S 0.5
#define MAX_ORPHANS 4096
#define MAX_PENDING_STATS 64
#define CLIENT_SNDHWM 20000       /* messages queued per client before it counts as gone */
#define TRIM_EVERY_S 1.0          /* how often the router looks at its resident memory */
#define TRIM_SLACK (1u << 20)     /* resident free bytes the allocator may keep before the router trims */

typedef enum { RQ_LIVE = 0, RQ_RESUMING, RQ_CLOSING } rq_state_t;

/* Latency histograms (stats router.hist.NAME.le.BOUND: cumulative counts; .sum in seconds; .count),
 * which strata-http's /metrics shows as Prometheus histograms. Bounds in seconds. */
#define HIST_NB 15
static const double s_hist_bounds[HIST_NB] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
enum { H_TTFT = 0, H_ITL, H_QUEUE, H_E2E, H_COUNT };
static const char *const s_hist_names[H_COUNT] = {"ttft_s", "itl_s", "queue_s", "e2e_s"};
typedef struct {
    uint64_t b[HIST_NB];          /* observations <= s_hist_bounds[i] (not cumulative) */
    uint64_t count;
    double sum;                   /* seconds */
} hist_t;

static void s_observe(hist_t *h, double v)
{
    if (!(v >= 0)) return;
    for (int i = 0; i < HIST_NB; i++)
        if (v <= s_hist_bounds[i]) {
            h->b[i]++;
            break;
        }
    h->count++;
    h->sum += v;
}

typedef struct {
    uint64_t id;                  /* internal id = msg_request_id(...) */
    uint64_t cid;                 /* the client's id */
    uint8_t client[MSG_MAX_CLIENT_ID];
    size_t client_len;
    rq_state_t state;
    bool stream;
    bool ignore_eos;
    bool cancel_sent;
    int32_t *prompt;              /* [n_prompt] token ids, kept to resubmit; NULL after a resume */
    int32_t n_prompt;
    int32_t max_tokens;
    msg_sampling_t samp;
    int32_t *gen;                 /* [n_gen] generated ids seen so far */
    int64_t n_gen, gen_cap;
    bool logprobs;                /* the request asked for log-probabilities (a resumed one: its events carry them) */
    int32_t top_n;                /* ... with this many alternatives a token */
    float *lp;                    /* [gen_cap] each generated token's log-probability, with logprobs */
    int32_t *lp_tok;              /* [gen_cap][top_n] its alternatives */
    float *lp_top;                /* [gen_cap][top_n] theirs */
    int64_t skip_tokens;          /* resume: tokens the client already has */
    uint64_t skip_text;           /* resume: bytes of text the client already has */
    text_stream_t text;
    rtok_stream_t *detok;          /* incremental detokenizer (NULL without a tokenizer) */
    char *all;                    /* stream=false: [all_len] the whole answer so far */
    size_t all_len, all_cap;
    double t_recv, t_first, t_close;  /* strata_now(): received here, first token here, closed */
    double t_last;                /* strata_now() of the last token event (inter-token latency) */
    bool resumed;                 /* submitted by an earlier router: t_recv and t_first are the resume's */
    msg_finish_t done_pending;    /* resumed and CLOSING: the done the client still gets, or NONE */
} req_t;

typedef struct {
    uint64_t key;                 /* 0 = empty slot (request ids are never 0) */
    req_t *req;
} slot_t;

typedef struct {
    uint64_t id;
    double t;
} orphan_t;

typedef struct {
    uint8_t client[MSG_MAX_CLIENT_ID];
    size_t client_len;
    bool has_id;
    uint64_t id;
    uint64_t seq;
    double deadline;
} pending_stats_t;

/* Counters; the names are in s_counter_names (same order). */
enum {
    C_FRAMES, C_GENERATE, C_DONE, C_ERRORS, C_BUSY, C_CANCELED, C_CLIENT_GONE, C_RESUMES, C_TOO_LARGE,
    C_BAD_REQUEST, C_TOKENS_OUT, C_BYTES_IN, C_BYTES_OUT, C_STOP_STRINGS, C_RESUBMITS, C_ORPHANS_CANCELED,
    C_SCHED_SEND_FAIL, C_CLIENT_SEND_FAIL, C_MALLOC_TRIMS, C_CHAT_RENDERED, C_COUNT
};
static const char *const s_counter_names[C_COUNT] = {
    "router.frames", "router.generate", "router.done", "router.errors", "router.busy", "router.canceled",
    "router.client_gone", "router.resumes", "router.too_large", "router.bad_request", "router.tokens_out",
    "router.bytes_in", "router.bytes_out", "router.stop_strings", "router.resubmits", "router.orphans_canceled",
    "router.sched_send_fail", "router.client_send_fail", "router.malloc_trims", "router.chat_rendered",
};

struct router {
    const strata_config_t *cfg;
    void *zctx;
    void *cli;                    /* ROUTER, clients */
    void *sch;                    /* DEALER, scheduler */
    void *zap;                    /* REP at inproc://zeromq.zap.01: CURVE client keys (curve_clients_file), or NULL */
    config_curve_client_t *clients; /* [n_clients] the keys zap accepts, besides own_pub */
    int n_clients;
    struct stat clients_st;       /* curve_clients_file when it was read: a change reloads it */
    bool clients_gone;            /* ... and it is not there now (warned once) */
    char own_pub[CONFIG_CURVE_KEY_LEN + 1]; /* the router's public key (Z85): the group's own services connect with it */
    uint64_t zap_refused;         /* handshakes refused since the last warning */
    double t_zap_warn;
    msg_buf_t buf;
    uint8_t salt[8];              /* mixed into ids of clients without a stable identity */
    rtok_t *tok;
    chat_template_t *tmpl;        /* the model's chat template, NULL when it has none */

    slot_t *slots;                /* [n_slots], open addressing, linear probing */
    size_t n_slots;
    int n_reqs;

    orphan_t orphans[MAX_ORPHANS];
    int n_orphans;
    pending_stats_t pstats[MAX_PENDING_STATS];
    int n_pstats;
    uint64_t stats_seq;

    /* what the scheduler said in its last hello */
    bool have_hello;
    uint64_t sched_instance;
    char model[257];
    int32_t vocab, max_context;
    int32_t n_eos, eos_ids[MSG_MAX_EOS]; /* the model's eos ids: no text, unless ignore_eos */
    double t_start, t_sched_rx, t_hello_sent;
    double t_trim;                /* s_trim: its last look at the resident memory */
    bool trim_init;
    size_t rss_over;              /* s_trim: resident bytes beyond those in use, after the last trim */

    uint64_t c[C_COUNT];
    hist_t hist[H_COUNT];
    char hist_keys[H_COUNT][HIST_NB + 2][48];  /* the stats names of the histograms */
};

/* ---- request table ---- */

static size_t s_home(const router_t *r, uint64_t id) { return (size_t)(id * 0x9E3779B97F4A7C15ull) & (r->n_slots - 1); }

static req_t *s_find(const router_t *r, uint64_t id)
{
    for (size_t i = s_home(r, id);; i = (i + 1) & (r->n_slots - 1)) {
        if (r->slots[i].key == id) return r->slots[i].req;
        if (r->slots[i].key == 0) return NULL;
    }
}

static void s_insert(router_t *r, req_t *q)
{
    /* n_reqs <= max_queue + MAX_ORPHANS-free margin keeps the load factor under 1/2 */
    STRATA_ASSERT(r->n_reqs < (int)(r->n_slots / 2));
    size_t i = s_home(r, q->id);
    while (r->slots[i].key != 0) i = (i + 1) & (r->n_slots - 1);
    r->slots[i].key = q->id;
    r->slots[i].req = q;
    r->n_reqs++;
}

static void s_remove(router_t *r, uint64_t id)
{
    size_t m = r->n_slots - 1, i = s_home(r, id);
    while (r->slots[i].key != id) {
        if (r->slots[i].key == 0) return;
        i = (i + 1) & m;
    }
    /* backward-shift deletion: move later members of the probe run into the hole */
    size_t j = i;
    for (;;) {
        j = (j + 1) & m;
        if (r->slots[j].key == 0) break;
        size_t h = s_home(r, r->slots[j].key);
        bool between = i <= j ? (i < h && h <= j) : (i < h || h <= j);
        if (between) continue;
        r->slots[i] = r->slots[j];
        i = j;
    }
    r->slots[i].key = 0;
    r->slots[i].req = NULL;
    r->n_reqs--;
}

static void s_req_free(router_t *r, req_t *q)
{
    s_remove(r, q->id);
    text_stream_free(&q->text);
    rtok_stream_free(q->detok);
    free(q->prompt);
    free(q->gen);
    free(q->lp);
    free(q->lp_tok);
    free(q->lp_top);
    free(q->all);
    free(q);
}

static int s_client_count(const router_t *r, const uint8_t *cl, size_t len)
{
    int n = 0;
    for (size_t i = 0; i < r->n_slots; i++) {
        const req_t *q = r->slots[i].req;
        if (q && q->state != RQ_CLOSING && q->client_len == len && !memcmp(q->client, cl, len)) n++;
    }
    return n;
}

static uint64_t s_req_id(const router_t *r, const uint8_t *cl, size_t len, uint64_t cid)
{
    if (len > 0 && cl[0] != 0) return msg_request_id(cl, len, cid);
    /* ZeroMQ-generated identity (leading zero byte): unique only within this router's life */
    uint8_t tmp[8 + MSG_MAX_CLIENT_ID];
    memcpy(tmp, r->salt, 8);
    memcpy(tmp + 8, cl, len);
    return msg_request_id(tmp, 8 + len, cid);
}

/* ---- sending ---- */

static bool s_sched_up(const router_t *r, double now)
{
    if (!r->have_hello) return now - r->t_start < START_GRACE_S;
    return now - r->t_sched_rx < SCHED_DEAD_S;
}

/* Send m to a client. 0, or <0 when the client is gone or not reading (the caller drops it). */
static int s_to_client(router_t *r, const uint8_t *cl, size_t len, const msg_t *m)
{
    int rc = zmsg_send(r->cli, cl, len, m, &r->buf, ZMQ_DONTWAIT);
    if (rc == 0) r->c[C_BYTES_OUT] += r->buf.size;
    else {
        r->c[C_CLIENT_SEND_FAIL]++;
        if (rc != -EHOSTUNREACH && rc != -EAGAIN) log_warn("send to client: %s", strata_strerror(rc));
    }
    return rc;
}

static int s_client_error(router_t *r, const uint8_t *cl, size_t len, bool has_id, uint64_t id, msg_errcode_t code,
                          const char *fmt, ...) __attribute__((format(printf, 7, 8)));
static int s_client_error(router_t *r, const uint8_t *cl, size_t len, bool has_id, uint64_t id, msg_errcode_t code,
                          const char *fmt, ...)
{
    char text[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    r->c[C_ERRORS]++;
    if (code == MSG_E_BUSY) r->c[C_BUSY]++;
    int rc = zmsg_send_error(r->cli, cl, len, MSG_ERROR, has_id, id, code, text, &r->buf, ZMQ_DONTWAIT);
    if (rc == 0) r->c[C_BYTES_OUT] += r->buf.size;
    else r->c[C_CLIENT_SEND_FAIL]++;
    return rc;
}

static int s_to_sched(router_t *r, const msg_t *m)
{
    int rc = zmsg_send(r->sch, NULL, 0, m, &r->buf, ZMQ_DONTWAIT);
    if (rc < 0) {
        r->c[C_SCHED_SEND_FAIL]++;
        log_warn("send %s to scheduler: %s", msg_type_name(m->type), strata_strerror(rc));
    }
    return rc;
}

static void s_sched_simple(router_t *r, msg_type_t type, uint64_t id, int64_t from)
{
    msg_t m;
    msg_init(&m, type);
    m.has_id = true;
    m.id = id;
    if (type == MSG_SCHED_RESUME) m.u.resume.from = from;
    s_to_sched(r, &m);
}

static int s_submit(router_t *r, req_t *q)
{
    msg_t m;
    msg_init(&m, MSG_SUBMIT);
    m.has_id = true;
    m.id = q->id;
    m.u.submit.client.s = (const char *)q->client;
    m.u.submit.client.len = q->client_len;
    m.u.submit.cid = q->cid;
    m.u.submit.prompt = q->prompt;
    m.u.submit.n_prompt = q->n_prompt;
    m.u.submit.max_tokens = q->max_tokens;
    m.u.submit.samp = q->samp;
    m.u.submit.ignore_eos = q->ignore_eos;
    m.u.submit.logprobs = q->logprobs;
    m.u.submit.top_logprobs = q->top_n;
    return s_to_sched(r, &m);
}

/* The client is gone or not reading: stop the work and forget it once the scheduler agrees. */
static void s_abandon(router_t *r, req_t *q)
{
    r->c[C_CLIENT_GONE]++;
    if (!q->cancel_sent) s_sched_simple(r, MSG_SCHED_CANCEL, q->id, 0);
    q->cancel_sent = true;
    q->state = RQ_CLOSING;
    q->t_close = strata_now();
}

/* ---- streaming ---- */

static int s_all_add(req_t *q, const char *p, size_t n)
{
    if (q->all_cap - q->all_len < n + 1) {
        size_t cap = q->all_cap ? q->all_cap : 256;
        while (cap - q->all_len < n + 1) cap *= 2;
        char *na = realloc(q->all, cap);
        if (!na) return STRATA_ENOMEM;
        q->all = na;
        q->all_cap = cap;
    }
    memcpy(q->all + q->all_len, p, n);
    q->all_len += n;
    q->all[q->all_len] = 0;
    return 0;
}

/* The log-probabilities of q's generated tokens [i0, i0+n) for a client message, with each
 * token's text and each alternative's when the router has a tokenizer: *texts is malloc'd (the
 * caller frees it). Nothing when q asked for none or n is 0. 0 or STRATA_ENOMEM. */
static int s_lp_out(router_t *r, const req_t *q, int64_t i0, int32_t n, msg_logprobs_t *lp, msg_str_t **texts)
{
    memset(lp, 0, sizeof *lp);
    *texts = NULL;
    if (!q->logprobs || n <= 0) return 0;
    const int32_t k = q->top_n;
    lp->n_logprobs = n;
    lp->logprobs = q->lp + i0;
    lp->top_n = k;
    lp->n_top_tokens = lp->n_top_logprobs = n * k;
    lp->top_tokens = q->lp_tok + i0 * k;
    lp->top_logprobs = q->lp_top + i0 * k;
    if (!r->tok) return 0;
    msg_str_t *t = malloc((size_t)n * (size_t)(1 + k) * sizeof *t);
    if (!t) return STRATA_ENOMEM;
    for (int64_t i = 0; i < (int64_t)n * (1 + k); i++) {
        int32_t id = i < n ? q->gen[i0 + i] : lp->top_tokens[i - n];
        if (rtok_piece(r->tok, id, &t[i].s, &t[i].len) < 0) {
            free(t);
            return STRATA_ENOMEM;
        }
    }
    lp->n_token_text = n;
    lp->token_text = t;
    lp->n_top_text = n * k;
    lp->top_text = t + n;
    *texts = t;
    return 0;
}

/* Hand new tokens [i0, i0+n) and a new text chunk (whose last byte is text byte
 * q->text.emitted - 1) to the client, minus what a resuming client already has.
 * Returns 0, or <0 if the client is gone (q is then CLOSING). */
static int s_emit(router_t *r, req_t *q, int64_t i0, const int32_t *toks, int32_t n, const char *txt, size_t tl)
{
    if (i0 < q->skip_tokens) {
        int64_t d = q->skip_tokens - i0;
        if (d >= n) n = 0;
        else {
            toks += d;
            n -= (int32_t)d;
            i0 = q->skip_tokens;
        }
    }
    uint64_t t0 = q->text.emitted - tl;
    if (t0 < q->skip_text) {
        uint64_t d = q->skip_text - t0;
        if (d >= tl) tl = 0;
        else {
            txt += d;
            tl -= d;
            /* never start inside a UTF-8 sequence, whatever offset the client sent */
            while (tl && ((unsigned char)*txt & 0xC0) == 0x80) { txt++; tl--; }
        }
    }
    if (!q->stream) return tl ? s_all_add(q, txt, tl) : 0;
    if (n == 0 && tl == 0) return 0;
    msg_t m;
    msg_init(&m, MSG_TOKEN);
    m.has_id = true;
    m.id = q->cid;
    m.u.tokens.index = i0;
    m.u.tokens.tokens = toks;
    m.u.tokens.n_tokens = n;
    m.u.tokens.text.s = tl ? txt : "";
    m.u.tokens.text.len = tl;
    msg_str_t *texts;
    int rc = s_lp_out(r, q, i0, n, &m.u.tokens.lp, &texts);
    if (rc == 0) rc = s_to_client(r, q->client, q->client_len, &m);
    free(texts);
    if (rc < 0) {
        s_abandon(r, q);
        return rc;
    }
    r->c[C_TOKENS_OUT] += (uint64_t)n;
    return 0;
}

/* Send the client its done. sd: the scheduler's done, or NULL when it did not send one (a
 * stop string, a cancel while it is down). The timings count from the request's first
 * submission: from its arrival here for a request this router took, the scheduler's for a
 * resumed one (from the router's own clocks only when the scheduler gave none). */
static void s_send_done(router_t *r, req_t *q, msg_finish_t fin, const msg_done_t *sd)
{
    double now = strata_now();
    msg_t m;
    msg_init(&m, MSG_DONE);
    m.has_id = true;
    m.id = q->cid;
    m.u.done.finish = fin;
    m.u.done.prompt_tokens = sd ? sd->prompt_tokens : q->n_prompt;
    m.u.done.completion_tokens = (int32_t)q->n_gen;
    m.u.done.queue_ms = sd ? sd->queue_ms : 0;
    if (q->resumed && sd) {
        m.u.done.ttft_ms = sd->ttft_ms;
        m.u.done.total_ms = sd->total_ms;
    } else {
        m.u.done.ttft_ms = q->t_first > 0 ? (q->t_first - q->t_recv) * 1e3 : 0;
        m.u.done.total_ms = (now - q->t_recv) * 1e3;
    }
    if (!q->stream) {
        m.u.done.text.s = q->all ? q->all : "";
        m.u.done.text.len = q->all_len;
        int64_t from = q->skip_tokens < q->n_gen ? q->skip_tokens : q->n_gen;
        m.u.done.tokens = q->gen ? q->gen + from : (const int32_t *)"";
        m.u.done.n_tokens = (int32_t)(q->n_gen - from);
    }
    msg_str_t *texts = NULL;
    if (!q->stream && s_lp_out(r, q, q->n_gen - m.u.done.n_tokens, m.u.done.n_tokens, &m.u.done.lp, &texts) < 0)
        s_client_error(r, q->client, q->client_len, true, q->cid, MSG_E_INTERNAL, "out of memory for the log-probabilities");
    else if (s_to_client(r, q->client, q->client_len, &m) < 0)
        r->c[C_CLIENT_GONE]++;
    free(texts);
    r->c[C_DONE]++;
    if (fin != MSG_FINISH_CANCEL) {
        if (m.u.done.completion_tokens > 0 && m.u.done.ttft_ms > 0) s_observe(&r->hist[H_TTFT], m.u.done.ttft_ms * 1e-3);
        if (sd) s_observe(&r->hist[H_QUEUE], m.u.done.queue_ms * 1e-3);
        s_observe(&r->hist[H_E2E], m.u.done.total_ms * 1e-3);
    }
}

/* A CLOSING request's done that waited for the scheduler's timings: send it now (sd: the
 * scheduler's done, or NULL when none will come). */
static void s_done_pending(router_t *r, req_t *q, const msg_done_t *sd)
{
    if (q->done_pending == MSG_FINISH_NONE) return;
    s_send_done(r, q, q->done_pending, sd);
    q->done_pending = MSG_FINISH_NONE;
}

/* A stop string matched: finish towards the client now, cancel at the scheduler. A resumed
 * request's done waits for the scheduler's answer to the cancel, which has its timings. */
static void s_stop_string(router_t *r, req_t *q)
{
    r->c[C_STOP_STRINGS]++;
    if (q->resumed) q->done_pending = MSG_FINISH_STOP;
    else s_send_done(r, q, MSG_FINISH_STOP, NULL);
    if (!q->cancel_sent) s_sched_simple(r, MSG_SCHED_CANCEL, q->id, 0);
    q->cancel_sent = true;
    q->state = RQ_CLOSING;
    q->t_close = strata_now();
}

/* t is one of the model's eos ids (from the scheduler's hello). */
static bool s_is_eos(const router_t *r, int32_t t)
{
    for (int32_t i = 0; i < r->n_eos; i++)
        if (r->eos_ids[i] == t) return true;
    return false;
}

static void s_on_tokens(router_t *r, req_t *q, const msg_tokens_t *t)
{
    if (q->state == RQ_CLOSING) return;
    if (t->index > q->n_gen) {
        /* a gap: events were lost (router restart, queue overflow); ask for the rest */
        if (q->state != RQ_RESUMING) {
            s_sched_simple(r, MSG_SCHED_RESUME, q->id, q->n_gen);
            q->state = RQ_RESUMING;
        }
        return;
    }
    q->state = RQ_LIVE;
    int64_t skip = q->n_gen - t->index;
    if (skip >= t->n_tokens) return;
    const int32_t *nt = t->tokens + skip;
    int32_t n = t->n_tokens - (int32_t)skip;
    if (t->lp.logprobs && !q->logprobs && q->n_gen == 0) { /* resumed after a restart of this router: the events say */
        q->logprobs = true;
        q->top_n = t->lp.top_n;
    }
    if (q->logprobs != (t->lp.logprobs != NULL) || (q->logprobs && t->lp.top_n != q->top_n)) {
        /* cannot happen with a scheduler of this version; never hand out tokens without what was asked */
        s_client_error(r, q->client, q->client_len, true, q->cid, MSG_E_INTERNAL,
                       "the scheduler sent tokens %s the log-probabilities this request asked for",
                       q->logprobs ? "without" : "with");
        s_abandon(r, q);
        return;
    }
    if (q->n_gen + n > q->gen_cap) {
        int64_t cap = q->gen_cap ? q->gen_cap : 64;
        while (cap < q->n_gen + n) cap *= 2;
        int32_t *ng = realloc(q->gen, (size_t)cap * sizeof *ng);
        if (ng) q->gen = ng;
        bool ok = ng != NULL;
        if (ok && q->logprobs) ok = msg_lp_reserve(&q->lp, &q->lp_tok, &q->lp_top, (size_t)cap, q->top_n) == 0;
        if (!ok) {
            log_error("out of memory for request %llu", (unsigned long long)q->cid);
            return;
        }
        q->gen_cap = cap;
    }
    int64_t i0 = q->n_gen;
    memcpy(q->gen + q->n_gen, nt, (size_t)n * sizeof *nt);
    if (q->logprobs) {
        const size_t k = (size_t)q->top_n;
        memcpy(q->lp + i0, t->lp.logprobs + skip, (size_t)n * sizeof *q->lp);
        memcpy(q->lp_tok + i0 * k, t->lp.top_tokens + skip * k, (size_t)n * k * sizeof *q->lp_tok);
        memcpy(q->lp_top + i0 * k, t->lp.top_logprobs + skip * k, (size_t)n * k * sizeof *q->lp_top);
    }
    q->n_gen += n;
    double now = strata_now();
    if (q->t_first == 0) q->t_first = now;
    else if (q->t_last > 0)
        for (int32_t i = 0; i < n; i++) s_observe(&r->hist[H_ITL], (now - q->t_last) / n);
    q->t_last = now;
    for (int32_t i = 0; i < n; i++) {
        if (!q->ignore_eos && s_is_eos(r, nt[i])) continue; /* eos ends the answer; it has no text */
        if (q->detok) {
            const char *bytes;
            size_t nb;
            if (rtok_stream_push(q->detok, nt[i], &bytes, &nb) == 0 && nb) text_stream_push(&q->text, bytes, nb);
        }
    }
    const char *txt;
    size_t tl;
    bool hit = text_stream_take(&q->text, false, &txt, &tl);
    if (s_emit(r, q, i0, q->gen + i0, n, txt, tl) < 0) return;
    if (hit) s_stop_string(r, q);
}

static void s_on_done(router_t *r, req_t *q, const msg_done_t *d)
{
    if (q->state == RQ_CLOSING) {
        s_done_pending(r, q, d);
        s_req_free(r, q);
        return;
    }
    if (d->completion_tokens > q->n_gen) {
        /* tokens this router has not seen: a done the scheduler sent before it got this
         * router's resume (queued for the router that was killed), or events lost. The
         * scheduler keeps a finished request: ask for the rest, whose done follows it. */
        if (q->state != RQ_RESUMING) {
            s_sched_simple(r, MSG_SCHED_RESUME, q->id, q->n_gen);
            q->state = RQ_RESUMING;
        }
        return;
    }
    const char *txt;
    size_t tl;
    if (q->detok) {
        const char *bytes;
        size_t nb;
        if (rtok_stream_flush(q->detok, &bytes, &nb) == 0 && nb) text_stream_push(&q->text, bytes, nb);
    }
    bool hit = text_stream_take(&q->text, true, &txt, &tl);
    if (s_emit(r, q, q->n_gen, NULL, 0, txt, tl) == 0) {
        msg_finish_t fin = hit ? MSG_FINISH_STOP : d->finish;
        if (fin == MSG_FINISH_CANCEL) r->c[C_CANCELED]++;
        if (hit) r->c[C_STOP_STRINGS]++;
        s_send_done(r, q, fin, d);
    }
    s_req_free(r, q);
}

/* ---- client requests ---- */

static req_t *s_req_new(router_t *r, const uint8_t *cl, size_t len, uint64_t cid, bool stream, const msg_str_t *stop,
                        int n_stop)
{
    req_t *q = calloc(1, sizeof *q);
    if (!q) return NULL;
    q->id = s_req_id(r, cl, len, cid);
    q->cid = cid;
    memcpy(q->client, cl, len);
    q->client_len = len;
    q->stream = stream;
    q->t_recv = strata_now();
    if (text_stream_init(&q->text, stop, n_stop) < 0) goto fail;
    if (r->tok && !(q->detok = rtok_stream_new(r->tok))) goto fail;
    return q;
fail:
    text_stream_free(&q->text);
    free(q);
    return NULL;
}

/* Refuse with busy when the router is full or this client has too much in flight. */
static bool s_busy(router_t *r, const uint8_t *cl, size_t len, uint64_t cid)
{
    if (r->n_reqs >= r->cfg->router.max_queue) {
        s_client_error(r, cl, len, true, cid, MSG_E_BUSY, "router queue is full (%d requests in flight)", r->n_reqs);
        return true;
    }
    int n = s_client_count(r, cl, len);
    if (n >= r->cfg->router.max_inflight_per_client) {
        s_client_error(r, cl, len, true, cid, MSG_E_BUSY, "this client has %d requests in flight (limit %d)", n,
                       r->cfg->router.max_inflight_per_client);
        return true;
    }
    return false;
}

static int32_t s_max_context(const router_t *r)
{
    int32_t mc = r->have_hello ? r->max_context : 0;
    if (r->cfg->scheduler.max_context > 0 && (mc == 0 || r->cfg->scheduler.max_context < mc))
        mc = r->cfg->scheduler.max_context;
    return mc;
}

/* A chat request's prompt: its messages rendered with the model's chat template, tokenized
 * without added special tokens (the template writes them). 0 with *ids ([*n], malloc'd), or -1
 * after answering the client. */
static int s_render_chat(router_t *r, const uint8_t *cl, size_t len, uint64_t cid, const msg_generate_t *g, int32_t **ids,
                         int32_t *n)
{
    if (!r->tok) {
        s_client_error(r, cl, len, true, cid, MSG_E_INVALID_PARAM,
                       "generate: field 'messages': this router has no tokenizer loaded; send 'tokens'");
        return -1;
    }
    if (!r->tmpl) {
        s_client_error(r, cl, len, true, cid, MSG_E_INVALID_PARAM,
                       "generate: field 'messages': the model has no chat template (chat_template.jinja or tokenizer_config.json); "
                       "send 'prompt'");
        return -1;
    }
    char *text = NULL;
    strata_errbuf_t eb = {{0}};
    int rc = chat_template_render(r->tmpl, g->messages.s, g->template_vars.s, g->add_generation_prompt, (int64_t)time(NULL), &text,
                                  &eb);
    if (rc < 0) {
        s_client_error(r, cl, len, true, cid, MSG_E_INVALID_PARAM, "generate: field 'messages': the chat template: %s",
                       eb.msg[0] ? eb.msg : strata_strerror(rc));
        return -1;
    }
    r->c[C_CHAT_RENDERED]++;
    rc = rtok_encode_chat(r->tok, text, strlen(text), ids, n);
    free(text);
    if (rc < 0) {
        s_client_error(r, cl, len, true, cid, MSG_E_INVALID_PARAM, "generate: field 'messages': cannot tokenize the rendered chat: %s",
                       strata_strerror(rc));
        return -1;
    }
    if (*n == 0) {
        free(*ids);
        *ids = NULL;
        s_client_error(r, cl, len, true, cid, MSG_E_INVALID_PARAM, "generate: field 'messages': the chat template rendered no tokens");
        return -1;
    }
    return 0;
}

static void s_generate(router_t *r, const uint8_t *cl, size_t len, const msg_t *m)
{
    const msg_generate_t *g = &m->u.generate;
    uint64_t cid = m->id;
    double now = strata_now();
    r->c[C_GENERATE]++;
    if (s_busy(r, cl, len, cid)) return;
    if (!s_sched_up(r, now)) {
        s_client_error(r, cl, len, true, cid, MSG_E_UNAVAILABLE, "the scheduler is not reachable; retry later");
        return;
    }
    uint64_t id = s_req_id(r, cl, len, cid);
    req_t *old = s_find(r, id);
    if (old) {
        /* also while a finished request still waits for the scheduler's confirmation (stop
         * string, client gone): a new request under the same id would get the old one's
         * late events */
        s_client_error(r, cl, len, true, cid, MSG_E_DUPLICATE, "generate: request id %llu is %s",
                       (unsigned long long)cid, old->state == RQ_CLOSING ? "still closing; use a new id" : "already in flight");
        return;
    }

    int32_t *ids = NULL;
    int32_t n = 0;
    if (g->tokens) {
        for (int32_t i = 0; i < g->n_tokens; i++)
            if (r->vocab > 0 && g->tokens[i] >= r->vocab) {
                s_client_error(r, cl, len, true, cid, MSG_E_INVALID_PARAM,
                               "generate: field 'tokens[%d]': id %d is outside the vocab [0, %d)", i, g->tokens[i], r->vocab);
                return;
            }
        ids = malloc((size_t)g->n_tokens * sizeof *ids);
        if (!ids) goto nomem;
        memcpy(ids, g->tokens, (size_t)g->n_tokens * sizeof *ids);
        n = g->n_tokens;
    } else if (g->messages.s) {
        if (s_render_chat(r, cl, len, cid, g, &ids, &n) < 0) return;
    } else {
        if (!r->tok) {
            s_client_error(r, cl, len, true, cid, MSG_E_INVALID_PARAM,
                           "generate: field 'prompt': this router has no tokenizer loaded; send 'tokens'");
            return;
        }
        int rc = rtok_encode_prompt(r->tok, g->prompt.s, g->prompt.len, &ids, &n);
        if (rc < 0) {
            s_client_error(r, cl, len, true, cid, MSG_E_INVALID_PARAM, "generate: field 'prompt': cannot tokenize: %s",
                           strata_strerror(rc));
            return;
        }
    }
    int32_t mc = s_max_context(r);
    int32_t max_tokens = g->max_tokens;
    if (mc > 0) {
        if (n >= mc) {
            s_client_error(r, cl, len, true, cid, MSG_E_CONTEXT_OVERFLOW,
                           "generate: the prompt has %d tokens; the context holds %d (prompt + answer)", n, mc);
            free(ids);
            return;
        }
        if (max_tokens > mc - n) max_tokens = mc - n;
    }
    req_t *q = s_req_new(r, cl, len, cid, g->stream, g->stop, g->n_stop);
    if (!q) {
        free(ids);
        goto nomem;
    }
    q->prompt = ids;
    q->n_prompt = n;
    q->max_tokens = max_tokens;
    q->samp = g->samp;
    q->ignore_eos = g->ignore_eos;
    q->logprobs = g->logprobs;
    q->top_n = g->logprobs ? g->top_logprobs : 0;
    if (q->top_n > r->vocab && r->vocab > 0) q->top_n = r->vocab; /* as the scheduler clamps it */
    if (s_submit(r, q) < 0) {
        s_client_error(r, cl, len, true, cid, MSG_E_UNAVAILABLE, "the scheduler is not accepting requests; retry later");
        s_remove(r, q->id); /* not inserted yet: s_req_free's removal is a no-op */
        text_stream_free(&q->text);
        rtok_stream_free(q->detok);
        free(q->prompt);
        free(q);
        return;
    }
    s_insert(r, q);
    return;
nomem:
    s_client_error(r, cl, len, true, cid, MSG_E_INTERNAL, "out of memory");
}

static void s_orphan_forget(router_t *r, uint64_t id)
{
    for (int i = 0; i < r->n_orphans; i++)
        if (r->orphans[i].id == id) {
            r->orphans[i] = r->orphans[--r->n_orphans];
            return;
        }
}

static void s_resume(router_t *r, const uint8_t *cl, size_t len, const msg_t *m)
{
    const msg_resume_t *rs = &m->u.resume;
    uint64_t cid = m->id;
    r->c[C_RESUMES]++;
    if (!s_sched_up(r, strata_now())) {
        s_client_error(r, cl, len, true, cid, MSG_E_UNAVAILABLE, "the scheduler is not reachable; retry later");
        return;
    }
    uint64_t id = s_req_id(r, cl, len, cid);
    req_t *old = s_find(r, id);
    int32_t *prompt = NULL, n_prompt = 0, max_tokens = 0;
    msg_sampling_t samp = {0, 1, 0, 0};
    bool ignore_eos = false, resumed = true, logprobs = false;
    int32_t top_n = 0;
    double t_recv = 0, t_first = 0;
    if (old) {
        if (old->state == RQ_CLOSING) {
            if (old->done_pending != MSG_FINISH_NONE) s_done_pending(r, old, NULL); /* it has its answer */
            else s_client_error(r, cl, len, true, cid, MSG_E_NOT_FOUND, "resume: request %llu has finished",
                                (unsigned long long)cid);
            return;
        }
        /* a live request re-attached (the client reconnected): keep what is needed to
         * resubmit, and when it came */
        prompt = old->prompt;
        old->prompt = NULL;
        n_prompt = old->n_prompt;
        max_tokens = old->max_tokens;
        samp = old->samp;
        ignore_eos = old->ignore_eos;
        logprobs = old->logprobs;
        top_n = old->top_n;
        resumed = old->resumed;
        t_recv = old->t_recv;
        t_first = old->t_first;
        s_req_free(r, old);
    } else if (s_busy(r, cl, len, cid)) {
        return;
    }
    req_t *q = s_req_new(r, cl, len, cid, rs->stream, rs->stop, rs->n_stop);
    if (!q) {
        free(prompt);
        s_client_error(r, cl, len, true, cid, MSG_E_INTERNAL, "out of memory");
        return;
    }
    q->prompt = prompt;
    q->n_prompt = n_prompt;
    q->max_tokens = max_tokens;
    q->samp = samp;
    q->ignore_eos = ignore_eos;
    q->logprobs = logprobs;
    q->top_n = top_n;
    q->skip_tokens = rs->from;
    q->skip_text = (uint64_t)rs->text_from;
    q->resumed = resumed;
    if (!resumed) {
        q->t_recv = t_recv;
        q->t_first = t_first;
    }
    q->state = RQ_RESUMING;
    s_orphan_forget(r, id);
    s_insert(r, q);
    s_sched_simple(r, MSG_SCHED_RESUME, id, 0);
}

static void s_cancel(router_t *r, const uint8_t *cl, size_t len, uint64_t cid)
{
    req_t *q = s_find(r, s_req_id(r, cl, len, cid));
    if (!q || q->state == RQ_CLOSING) {
        s_client_error(r, cl, len, true, cid, MSG_E_NOT_FOUND, "cancel: no request %llu in flight", (unsigned long long)cid);
        return;
    }
    if (!s_sched_up(r, strata_now())) {
        /* nobody to ask: finish it here */
        r->c[C_CANCELED]++;
        s_send_done(r, q, MSG_FINISH_CANCEL, NULL);
        s_req_free(r, q);
        return;
    }
    if (!q->cancel_sent) s_sched_simple(r, MSG_SCHED_CANCEL, q->id, 0);
    q->cancel_sent = true; /* the scheduler's done(cancel) finishes it */
}

static void s_health(router_t *r, const uint8_t *cl, size_t len, const msg_t *in)
{
    double now = strata_now();
    msg_t m;
    msg_init(&m, MSG_HEALTH_REPLY);
    m.has_id = in->has_id;
    m.id = in->id;
    bool up = r->have_hello && s_sched_up(r, now);
    m.u.health.status = msg_str(up ? "ok" : "degraded");
    m.u.health.scheduler = up;
    m.u.health.uptime_s = now - r->t_start;
    m.u.health.queue = r->n_reqs;
    s_to_client(r, cl, len, &m);
}

static void s_models(router_t *r, const uint8_t *cl, size_t len, const msg_t *in)
{
    if (!r->have_hello) {
        s_client_error(r, cl, len, in->has_id, in->id, MSG_E_UNAVAILABLE, "the scheduler has not described the model yet");
        return;
    }
    msg_model_t mod = {msg_str(r->model[0] ? r->model : "model"), r->vocab > 0 ? r->vocab : 1,
                       s_max_context(r) > 0 ? s_max_context(r) : 1};
    msg_t m;
    msg_init(&m, MSG_MODELS_REPLY);
    m.has_id = in->has_id;
    m.id = in->id;
    m.u.models.models = &mod;
    m.u.models.n = 1;
    s_to_client(r, cl, len, &m);
}

/* Answer a stats request with the router's counters plus, if given, the scheduler's. */
static void s_stats_reply(router_t *r, const uint8_t *cl, size_t len, bool has_id, uint64_t id, const msg_stats_t *sched)
{
    int n_s = sched ? sched->n : 0;
    msg_stat_t *items = calloc((size_t)(C_COUNT + 4 + H_COUNT * (HIST_NB + 2) + n_s), sizeof *items);
    char(*names)[160] = calloc((size_t)(n_s ? n_s : 1), sizeof *names);
    if (!items || !names) goto out;
    int k = 0;
    double now = strata_now();
    for (int i = 0; i < C_COUNT; i++) items[k++] = (msg_stat_t){msg_str(s_counter_names[i]), (double)r->c[i]};
    items[k++] = (msg_stat_t){msg_str("router.inflight"), r->n_reqs};
    items[k++] = (msg_stat_t){msg_str("router.uptime_s"), now - r->t_start};
    items[k++] = (msg_stat_t){msg_str("router.scheduler_up"), r->have_hello && s_sched_up(r, now)};
    items[k++] = (msg_stat_t){msg_str("router.orphans"), r->n_orphans};
    for (int h = 0; h < H_COUNT; h++) {
        uint64_t cum = 0;
        for (int i = 0; i < HIST_NB; i++) {
            cum += r->hist[h].b[i];
            items[k++] = (msg_stat_t){msg_str(r->hist_keys[h][i]), (double)cum};
        }
        items[k++] = (msg_stat_t){msg_str(r->hist_keys[h][HIST_NB]), r->hist[h].sum};
        items[k++] = (msg_stat_t){msg_str(r->hist_keys[h][HIST_NB + 1]), (double)r->hist[h].count};
    }
    for (int i = 0; i < n_s && k < MSG_MAX_STATS; i++) {
        int l = snprintf(names[i], sizeof names[i], "scheduler.%.*s", (int)sched->items[i].name.len, sched->items[i].name.s);
        if (l <= 0 || l > 128) continue;
        items[k++] = (msg_stat_t){{names[i], (size_t)l}, sched->items[i].value};
    }
    msg_t m;
    msg_init(&m, MSG_STATS_REPLY);
    m.has_id = has_id;
    m.id = id;
    m.u.stats.items = items;
    m.u.stats.n = k;
    s_to_client(r, cl, len, &m);
out:
    free(items);
    free(names);
}

static void s_stats(router_t *r, const uint8_t *cl, size_t len, const msg_t *in)
{
    if (r->n_pstats >= MAX_PENDING_STATS || !s_sched_up(r, strata_now())) {
        s_stats_reply(r, cl, len, in->has_id, in->id, NULL);
        return;
    }
    pending_stats_t *p = &r->pstats[r->n_pstats++];
    memcpy(p->client, cl, len);
    p->client_len = len;
    p->has_id = in->has_id;
    p->id = in->id;
    p->seq = ++r->stats_seq;
    p->deadline = strata_now() + STATS_TIMEOUT_S;
    msg_t m;
    msg_init(&m, MSG_SCHED_STATS);
    m.has_id = true;
    m.id = p->seq;
    s_to_sched(r, &m);
}

static void s_on_client_frame(router_t *r, const uint8_t *cl, size_t len, const void *data, size_t size)
{
    r->c[C_FRAMES]++;
    r->c[C_BYTES_IN] += size;
    if ((int64_t)size > r->cfg->router.max_frame_bytes) {
        r->c[C_TOO_LARGE]++;
        s_client_error(r, cl, len, false, 0, MSG_E_TOO_LARGE, "frame of %zu bytes is over the limit of %lld bytes", size,
                       (long long)r->cfg->router.max_frame_bytes);
        return;
    }
    msg_t m;
    msg_err_t err;
    if (msg_decode(MSG_FAM_CLIENT, data, size, &m, &err) < 0) {
        r->c[C_BAD_REQUEST]++;
        s_client_error(r, cl, len, m.has_id, m.id, err.code, "%s", err.text);
        msg_free(&m);
        return;
    }
    switch (m.type) {
    case MSG_GENERATE: s_generate(r, cl, len, &m); break;
    case MSG_CANCEL: s_cancel(r, cl, len, m.id); break;
    case MSG_RESUME: s_resume(r, cl, len, &m); break;
    case MSG_HEALTH: s_health(r, cl, len, &m); break;
    case MSG_STATS: s_stats(r, cl, len, &m); break;
    case MSG_MODELS: s_models(r, cl, len, &m); break;
    default: STRATA_ASSERT(!"client family decoded to a non-client type");
    }
    msg_free(&m);
}

/* Read one multi-frame client message: [routing id][payload]. Returns 1 handled, 0 none, <0 error. */
static int s_client_recv(router_t *r)
{
    zmq_msg_t idf, body;
    int frames;
    int rc = zmsg_recv_routed(r->cli, &idf, &body, &frames);
    if (rc <= 0) return rc;
    const uint8_t *cl = zmq_msg_data(&idf);
    size_t len = zmq_msg_size(&idf);
    if (len > MSG_MAX_CLIENT_ID) {
        /* cannot happen with libzmq (routing ids are at most 255 bytes) */
    } else if (frames != 1) {
        r->c[C_FRAMES]++;
        r->c[C_BAD_REQUEST]++;
        s_client_error(r, cl, len, false, 0, MSG_E_MALFORMED,
                       "a message must be exactly one frame after the routing id (use a DEALER socket); got %d", frames);
    } else {
        s_on_client_frame(r, cl, len, zmq_msg_data(&body), zmq_msg_size(&body));
    }
    zmq_msg_close(&body);
    zmq_msg_close(&idf);
    return 1;
}

/* ---- scheduler messages ---- */

static void s_sched_restarted(router_t *r)
{
    /* A new scheduler knows none of our requests. Resubmit those we can (deterministic
     * sampling regenerates the same tokens; the index check drops the ones already sent);
     * fail the others. */
    log_warn("scheduler restarted (new instance); resubmitting live requests");
    for (size_t i = 0; i < r->n_slots; i++) {
        req_t *q = r->slots[i].req;
        if (!q) continue;
        if (q->state == RQ_CLOSING) {
            s_done_pending(r, q, NULL);
            s_req_free(r, q);
            i--; /* backward shift may have moved another entry into slot i */
            continue;
        }
        if (q->prompt && s_submit(r, q) == 0) {
            r->c[C_RESUBMITS]++;
            q->state = RQ_LIVE;
            continue;
        }
        s_client_error(r, q->client, q->client_len, true, q->cid, MSG_E_UNAVAILABLE,
                       "the scheduler restarted and lost this request; submit it again");
        s_req_free(r, q);
        i--;
    }
    r->n_orphans = 0;
}

/* New tokens of request id (q: its entry, or NULL when unknown: the id is remembered as an
 * orphan, a request of an earlier router that its client may still resume). */
static void s_sched_tokens(router_t *r, req_t *q, uint64_t id, const msg_tokens_t *t, double now)
{
    if (q) {
        s_on_tokens(r, q, t);
        return;
    }
    bool known = false;
    for (int i = 0; i < r->n_orphans; i++) known |= r->orphans[i].id == id;
    if (!known) {
        if (r->n_orphans < MAX_ORPHANS) r->orphans[r->n_orphans++] = (orphan_t){id, now};
        else s_sched_simple(r, MSG_SCHED_CANCEL, id, 0);
    }
}

static void s_on_sched(router_t *r, const void *data, size_t size)
{
    msg_t m;
    msg_err_t err;
    if (msg_decode(MSG_FAM_SCHED_OUT, data, size, &m, &err) < 0) {
        log_error("bad message from the scheduler: %s", err.text);
        msg_free(&m);
        return;
    }
    double now = strata_now();
    r->t_sched_rx = now;
    req_t *q = (m.has_id && m.type != MSG_SCHED_STATS_REPLY) ? s_find(r, m.id) : NULL;
    switch (m.type) {
    case MSG_SCHED_TOKENS: s_sched_tokens(r, q, m.id, &m.u.tokens, now); break;
    case MSG_SCHED_STEP_TOKENS: {
        const msg_step_tokens_t *st = &m.u.step_tokens;
        for (int32_t i = 0, off = 0; i < st->n; i++) {
            msg_tokens_t t = {.index = st->index[i], .n_tokens = 1, .tokens = &st->tokens[i]};
            const int32_t k = st->lp.logprobs ? st->lp.top_n[i] : -1;
            if (k >= 0) {
                t.lp = (msg_logprobs_t){.n_logprobs = 1, .logprobs = &st->lp.logprobs[i], .top_n = k, .n_top_tokens = k,
                                        .top_tokens = st->lp.top_tokens + off, .n_top_logprobs = k,
                                        .top_logprobs = st->lp.top_logprobs + off};
                off += k;
            }
            s_sched_tokens(r, s_find(r, st->reqs[i]), st->reqs[i], &t, now);
        }
        break;
    }
    case MSG_SCHED_DONE:
        if (q) s_on_done(r, q, &m.u.done);
        else s_orphan_forget(r, m.id);
        break;
    case MSG_SCHED_ERROR:
        if (q) {
            if (q->state != RQ_CLOSING)
                s_client_error(r, q->client, q->client_len, true, q->cid, m.u.error.code, "%.*s",
                               (int)m.u.error.message.len, m.u.error.message.s);
            s_done_pending(r, q, NULL);
            s_req_free(r, q);
        } else if (m.has_id) {
            s_orphan_forget(r, m.id);
            log_debug("scheduler error for unknown request: %.*s", (int)m.u.error.message.len, m.u.error.message.s);
        } else {
            log_warn("scheduler error: %.*s", (int)m.u.error.message.len, m.u.error.message.s);
        }
        break;
    case MSG_SCHED_STATS_REPLY:
        for (int i = 0; i < r->n_pstats; i++)
            if (m.has_id && r->pstats[i].seq == m.id) {
                pending_stats_t p = r->pstats[i];
                r->pstats[i] = r->pstats[--r->n_pstats];
                s_stats_reply(r, p.client, p.client_len, p.has_id, p.id, &m.u.stats);
                break;
            }
        break;
    case MSG_SCHED_HELLO_REPLY: {
        const msg_hello_t *h = &m.u.hello;
        bool restarted = r->have_hello && h->instance != r->sched_instance;
        r->have_hello = true;
        r->sched_instance = h->instance;
        snprintf(r->model, sizeof r->model, "%.*s", (int)h->model.len, h->model.s);
        r->vocab = h->vocab;
        r->max_context = h->max_context;
        r->n_eos = msg_hello_eos(h, r->eos_ids);
        if (restarted) s_sched_restarted(r);
        break;
    }
    default: STRATA_ASSERT(!"scheduler family decoded to a foreign type");
    }
    msg_free(&m);
}

static int s_sched_recv(router_t *r)
{
    zmq_msg_t f;
    zmq_msg_init(&f);
    if (zmq_msg_recv(&f, r->sch, ZMQ_DONTWAIT) < 0) {
        int e = zmq_errno();
        zmq_msg_close(&f);
        return e == EAGAIN || e == EINTR ? 0 : -e;
    }
    if (zmq_msg_more(&f)) {
        log_error("multi-frame message from the scheduler; dropped");
        while (zmq_msg_more(&f)) {
            zmq_msg_close(&f);
            zmq_msg_init(&f);
            if (zmq_msg_recv(&f, r->sch, 0) < 0) break;
        }
    } else {
        s_on_sched(r, zmq_msg_data(&f), zmq_msg_size(&f));
    }
    zmq_msg_close(&f);
    return 1;
}

/* ---- timers ---- */

/* Bytes resident now (/proc/self/statm), 0 if unknown. */
static size_t s_rss(void)
{
    char buf[128];
    int fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    unsigned long size, resident;
    if (sscanf(buf, "%lu %lu", &size, &resident) != 2) return 0;
    return (size_t)resident * (size_t)sysconf(_SC_PAGESIZE);
}

/* Give the allocator's free pages back to the kernel when they pile up.
 *
 * Client connections cost ZeroMQ's I/O thread some 50-80 KiB each (the pipes' message
 * queues, the TCP engine's 8 KiB batch buffers), allocated by that thread from its own
 * glibc arena and freed when the peer goes. A burst of short connections therefore leaves
 * the arena large and fragmented: its pages free but for a few in-use chunks scattered
 * through it, so free() never shrinks it (it only returns the arena's top). Measured with
 * 600 connections in flight at a time (tests/router router_churn): 7.8 MB resident at
 * start, 21-25 MB after 1,000 of them, 29-33 MB after 20,000 (up to 40 MB), of which 0.6 MB
 * in use. malloc_trim(0) returns every whole free page (MADV_DONTNEED) from every arena;
 * it walks the free lists with each arena locked, 1-4 ms on such a heap.
 *
 * So once every TRIM_EVERY_S the router compares what is resident with what the allocator
 * has handed out (mallinfo2: in-use chunks, mmapped ones included). The difference is the
 * code, stacks and the like, plus free pages still resident; what it was just after the
 * last trim (rss_over) is the part a trim cannot return. The router trims when the
 * difference is TRIM_SLACK above that and the allocator holds at least TRIM_SLACK free, so
 * the resident set stays within about TRIM_SLACK of what the router uses, whatever the
 * connection churn, and a trim that would give back nothing does not run. */
static void s_trim(router_t *r, double now)
{
#ifdef __GLIBC__
    if (now - r->t_trim < TRIM_EVERY_S) return;
    r->t_trim = now;
    size_t rss = s_rss();
    if (rss == 0) return;
    struct mallinfo2 mi = mallinfo2();
    size_t used = mi.uordblks + mi.hblkhd;
    size_t over = rss > used ? rss - used : 0;
    if (!r->trim_init || over < r->rss_over) {
        r->trim_init = true;
        r->rss_over = over;
        return;
    }
    if (over < r->rss_over + TRIM_SLACK || mi.fordblks < TRIM_SLACK) return;
    malloc_trim(0);
    size_t after = s_rss();
    r->rss_over = after > used ? after - used : 0;
    r->c[C_MALLOC_TRIMS]++;
    log_debug("malloc_trim: resident %zu -> %zu KiB (%zu KiB in use, %zu KiB free in the heap) in %.2f ms", rss >> 10,
              after >> 10, used >> 10, mi.fordblks >> 10, (strata_now() - now) * 1e3);
#else
    (void)r;
    (void)now;
#endif
}

static void s_timers(router_t *r, double now)
{
    s_trim(r, now);
    if (now - r->t_hello_sent >= HELLO_EVERY_S) {
        msg_t m;
        msg_init(&m, MSG_SCHED_HELLO);
        s_to_sched(r, &m);
        r->t_hello_sent = now;
    }
    for (int i = 0; i < r->n_pstats;) {
        if (now >= r->pstats[i].deadline) {
            pending_stats_t p = r->pstats[i];
            r->pstats[i] = r->pstats[--r->n_pstats];
            s_stats_reply(r, p.client, p.client_len, p.has_id, p.id, NULL);
        } else {
            i++;
        }
    }
    for (int i = 0; i < r->n_orphans;) {
        if (now - r->orphans[i].t > ORPHAN_TIMEOUT_S) {
            s_sched_simple(r, MSG_SCHED_CANCEL, r->orphans[i].id, 0);
            r->c[C_ORPHANS_CANCELED]++;
            r->orphans[i] = r->orphans[--r->n_orphans];
        } else {
            i++;
        }
    }
    bool sched_up = s_sched_up(r, now);
    for (size_t i = 0; i < r->n_slots; i++) {
        req_t *q = r->slots[i].req;
        if (!q || q->state != RQ_CLOSING) continue;
        /* a done waiting for the scheduler's timings waits no longer than the scheduler lives */
        if (!sched_up || now - q->t_close > CLOSING_TIMEOUT_S) s_done_pending(r, q, NULL);
        if (now - q->t_close > CLOSING_TIMEOUT_S) {
            s_req_free(r, q);
            i--;
        }
    }
}

/* ---- CURVE: the client endpoint's keys and the ZAP handler ---- */

/* Read curve_clients_file again if it changed since the last read (an edit takes effect at the
 * next handshake, without a restart). A file that cannot be read now keeps the keys read before,
 * with a warning, so a half-done edit does not lock every client out. */
static void s_zap_reload(router_t *r)
{
    const char *path = r->cfg->router.curve_clients_file;
    struct stat st;
    if (stat(path, &st) < 0) {
        if (!r->clients_gone) log_warn("[router] curve_clients_file %s: %s; keeping the %d keys read before", path, strerror(errno),
                                       r->n_clients);
        r->clients_gone = true;
        return;
    }
    r->clients_gone = false;
    if (st.st_ino == r->clients_st.st_ino && st.st_dev == r->clients_st.st_dev && st.st_size == r->clients_st.st_size &&
        st.st_mtim.tv_sec == r->clients_st.st_mtim.tv_sec && st.st_mtim.tv_nsec == r->clients_st.st_mtim.tv_nsec)
        return;
    r->clients_st = st; /* also when it cannot be read: read again at its next change */
    config_curve_client_t *v = NULL;
    int n = 0;
    strata_errbuf_t eb = {{0}};
    if (config_read_curve_clients(path, &v, &n, &eb) < 0) {
        log_warn("%s; keeping the %d keys read before", eb.msg, r->n_clients);
        return;
    }
    free(r->clients);
    r->clients = v;
    r->n_clients = n;
    log_info("[router] curve_clients_file %s: %d client key%s", path, n, n == 1 ? "" : "s");
}

/* One ZAP request (ZeroMQ RFC 27: version, request id, domain, address, routing id, mechanism,
 * then the client's 32-byte public key for CURVE), answered 200 for a key of curve_clients_file
 * or the router's own, else 400. libzmq holds the handshake until the answer. 1 (answered), 0
 * (no request waiting) or -errno. */
static int s_zap_serve(router_t *r)
{
    zmq_msg_t f[8];
    int n = 0;
    for (;;) {
        zmq_msg_init(&f[n]);
        if (zmq_msg_recv(&f[n], r->zap, n ? 0 : ZMQ_DONTWAIT) < 0) {
            int e = zmq_errno();
            zmq_msg_close(&f[n]);
            for (int i = 0; i < n; i++) zmq_msg_close(&f[i]);
            return e == EAGAIN || e == EINTR ? 0 : -e;
        }
        bool more = zmq_msg_more(&f[n]);
        if (n < 7) n++;
        else zmq_msg_close(&f[n]); /* more frames than RFC 27 has: drained, the request refused */
        if (!more) break;
    }
    char key[CONFIG_CURVE_KEY_LEN + 1] = "", addr[64] = "";
    bool ok = false;
    const char *who = NULL;
    if (n == 7 && zmq_msg_size(&f[5]) == 5 && !memcmp(zmq_msg_data(&f[5]), "CURVE", 5) && zmq_msg_size(&f[6]) == 32 &&
        zmq_z85_encode(key, zmq_msg_data(&f[6]), 32)) {
        snprintf(addr, sizeof addr, "%.*s", (int)(zmq_msg_size(&f[3]) < 63 ? zmq_msg_size(&f[3]) : 63), (char *)zmq_msg_data(&f[3]));
        if (!strcmp(key, r->own_pub)) {
            ok = true;
            who = "the router's own key";
        } else {
            s_zap_reload(r);
            for (int i = 0; i < r->n_clients && !ok; i++)
                if (!strcmp(key, r->clients[i].key)) {
                    ok = true;
                    who = r->clients[i].name;
                }
        }
    }
    const char *code = ok ? "200" : "400", *text = ok ? "OK" : "client key not in curve_clients_file";
    const void *rid = n >= 2 ? zmq_msg_data(&f[1]) : "";
    size_t rid_len = n >= 2 ? zmq_msg_size(&f[1]) : 0;
    int rc = 0;
    if (zmq_send(r->zap, "1.0", 3, ZMQ_SNDMORE) < 0 || zmq_send(r->zap, rid, rid_len, ZMQ_SNDMORE) < 0 ||
        zmq_send(r->zap, code, 3, ZMQ_SNDMORE) < 0 || zmq_send(r->zap, text, strlen(text), ZMQ_SNDMORE) < 0 ||
        zmq_send(r->zap, ok ? key : "", ok ? CONFIG_CURVE_KEY_LEN : 0, ZMQ_SNDMORE) < 0 || zmq_send(r->zap, "", 0, 0) < 0)
        rc = -zmq_errno();
    for (int i = 0; i < n; i++) zmq_msg_close(&f[i]);
    if (ok) {
        log_debug("CURVE client %s%s%s%s accepted", key, who && *who ? " (" : "", who ? who : "", who && *who ? ")" : "");
    } else {
        /* warn at most once a second: a client retrying with a wrong key reconnects often */
        r->zap_refused++;
        double now = strata_now();
        if (now - r->t_zap_warn >= 1.0) {
            log_warn("refused %llu CURVE handshake%s; the last from %s, key %s: not in [router] curve_clients_file",
                     (unsigned long long)r->zap_refused, r->zap_refused == 1 ? "" : "s", addr[0] ? addr : "?", key[0] ? key : "?");
            r->zap_refused = 0;
            r->t_zap_warn = now;
        }
    }
    return rc == 0 || rc == -EINTR || rc == -EAGAIN ? 1 : rc;
}

/* The client socket as a CURVE server with the key of curve_secret_key_file; with
 * curve_clients_file, the ZAP handler that accepts only its keys, bound before the client
 * endpoint so that no handshake happens without it (libzmq lets every key in when no handler
 * is bound). */
static int s_curve_setup(router_t *r, strata_errbuf_t *eb)
{
    const strata_config_t *cfg = r->cfg;
    char sec[CONFIG_CURVE_KEY_LEN + 1];
    int rc = config_read_curve_key(cfg->router.curve_secret_key_file, true, "[router] curve_secret_key_file", sec, eb);
    if (rc < 0) return rc;
    if (zmq_curve_public(r->own_pub, sec) < 0) {
        explicit_bzero(sec, sizeof sec);
        return strata_seterr(eb, STRATA_EINVAL_INPUT, "[router] curve_secret_key_file %s: not a CURVE secret key: %s",
                             cfg->router.curve_secret_key_file, zmq_strerror(zmq_errno()));
    }
    if (cfg->router.curve_clients_file[0]) {
        rc = config_read_curve_clients(cfg->router.curve_clients_file, &r->clients, &r->n_clients, eb);
        if (rc < 0) goto out;
        stat(cfg->router.curve_clients_file, &r->clients_st);
        if (!(r->zap = zmq_socket(r->zctx, ZMQ_REP)) || zmq_setsockopt(r->zap, ZMQ_LINGER, &(int){0}, sizeof(int)) < 0 ||
            zmq_bind(r->zap, "inproc://zeromq.zap.01") < 0) {
            rc = strata_seterr(eb, STRATA_EZMQ, "router: the ZAP handler: %s", zmq_strerror(zmq_errno()));
            goto out;
        }
    }
    if (zmq_setsockopt(r->cli, ZMQ_CURVE_SERVER, &(int){1}, sizeof(int)) < 0 ||
        zmq_setsockopt(r->cli, ZMQ_CURVE_SECRETKEY, sec, CONFIG_CURVE_KEY_LEN) < 0 ||
        zmq_setsockopt(r->cli, ZMQ_ZAP_DOMAIN, "strata", 6) < 0) {
        rc = strata_seterr(eb, STRATA_EZMQ, "router: CURVE socket options: %s", zmq_strerror(zmq_errno()));
        goto out;
    }
    if (r->zap)
        log_info("CURVE on %s: public key %s; %d client key%s of %s accepted, and this key", cfg->router.endpoint, r->own_pub,
                 r->n_clients, r->n_clients == 1 ? "" : "s", cfg->router.curve_clients_file);
    else
        log_warn("CURVE on %s: public key %s; no [router] curve_clients_file, so any client that has this public key may "
                 "connect", cfg->router.endpoint, r->own_pub);
out:
    explicit_bzero(sec, sizeof sec);
    return rc;
}

/* ---- life cycle ---- */

static int s_setopt_int(void *s, int opt, int v) { return zmq_setsockopt(s, opt, &v, sizeof v); }

int router_create(const strata_config_t *cfg, router_t **out, strata_errbuf_t *eb)
{
    int rc = 0;
    router_t *r = calloc(1, sizeof *r);
    if (!r) return STRATA_ENOMEM;
    r->cfg = cfg;
    r->t_start = strata_now();
    for (int h = 0; h < H_COUNT; h++) {
        for (int i = 0; i < HIST_NB; i++)
            snprintf(r->hist_keys[h][i], sizeof r->hist_keys[h][i], "router.hist.%s.le.%g", s_hist_names[h], s_hist_bounds[i]);
        snprintf(r->hist_keys[h][HIST_NB], sizeof r->hist_keys[h][HIST_NB], "router.hist.%s.sum", s_hist_names[h]);
        snprintf(r->hist_keys[h][HIST_NB + 1], sizeof r->hist_keys[h][HIST_NB + 1], "router.hist.%s.count", s_hist_names[h]);
    }
    if (getrandom(r->salt, sizeof r->salt, 0) != (ssize_t)sizeof r->salt) memcpy(r->salt, &r->t_start, 8);
    size_t want = 4 * ((size_t)cfg->router.max_queue + 16);
    r->n_slots = 64;
    while (r->n_slots < want) r->n_slots *= 2;
    r->slots = calloc(r->n_slots, sizeof *r->slots);
    if (!r->slots) { rc = STRATA_ENOMEM; goto fail; }

    if (cfg->tokenizer[0]) {
        if (access(cfg->tokenizer, R_OK) == 0) {
            rc = rtok_open(cfg->tokenizer, &r->tok, eb);
            if (rc < 0) goto fail;
        } else {
            log_warn("tokenizer %s not readable; only token-id prompts are accepted", cfg->tokenizer);
        }
    }
    /* the chat template: a template the engine cannot render is a bad model folder (exit 2),
     * named with its construct and line, not a surprise at the first chat request */
    if (cfg->model[0]) {
        rc = chat_template_load(cfg->model, &r->tmpl, eb);
        if (rc < 0) {
            rc = STRATA_EINVAL_INPUT;
            goto fail;
        }
        if (r->tmpl) log_info("chat template of %s loaded", cfg->model);
    }

    r->zctx = zmq_ctx_new();
    if (!r->zctx) { rc = STRATA_EZMQ; goto fail; }
    r->cli = zmq_socket(r->zctx, ZMQ_ROUTER);
    r->sch = zmq_socket(r->zctx, ZMQ_DEALER);
    if (!r->cli || !r->sch) { rc = STRATA_EZMQ; goto fail; }
    /* clients: fail sends to vanished peers, let a reconnecting identity take over its
     * routing id, drop dead TCP peers by heartbeat, and cut absurd frames in libzmq */
    int64_t maxmsg = 4 * cfg->router.max_frame_bytes + 65536;
    if (s_setopt_int(r->cli, ZMQ_ROUTER_MANDATORY, 1) || s_setopt_int(r->cli, ZMQ_ROUTER_HANDOVER, 1) ||
        s_setopt_int(r->cli, ZMQ_HEARTBEAT_IVL, 1000) || s_setopt_int(r->cli, ZMQ_HEARTBEAT_TIMEOUT, 5000) ||
        s_setopt_int(r->cli, ZMQ_HEARTBEAT_TTL, 10000) ||
        zmq_setsockopt(r->cli, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg) ||
        s_setopt_int(r->cli, ZMQ_SNDHWM, CLIENT_SNDHWM) || s_setopt_int(r->cli, ZMQ_RCVHWM, CLIENT_SNDHWM) ||
        s_setopt_int(r->cli, ZMQ_LINGER, 200) || s_setopt_int(r->sch, ZMQ_LINGER, 200) ||
        s_setopt_int(r->sch, ZMQ_SNDHWM, 100000) || s_setopt_int(r->sch, ZMQ_RCVHWM, 100000) ||
        zmq_setsockopt(r->sch, ZMQ_ROUTING_ID, "router", 6)) {
        rc = strata_seterr(eb, STRATA_EZMQ, "router: socket options: %s", zmq_strerror(zmq_errno()));
        goto fail;
    }
    if (cfg->router.curve_secret_key_file[0] && (rc = s_curve_setup(r, eb)) < 0) goto fail;
    if (zmq_bind(r->cli, cfg->router.endpoint) < 0) {
        /* a malformed endpoint is a config error; a busy port may clear on a restart */
        int e = zmq_errno();
        rc = strata_seterr(eb, e == EINVAL || e == EPROTONOSUPPORT || e == ENODEV ? STRATA_EINVAL_INPUT : STRATA_EZMQ,
                           "router: cannot bind [router] endpoint %s: %s", cfg->router.endpoint, zmq_strerror(e));
        goto fail;
    }
    if (zmq_connect(r->sch, cfg->scheduler.endpoint) < 0) {
        rc = strata_seterr(eb, STRATA_EZMQ, "router: cannot connect to %s: %s", cfg->scheduler.endpoint,
                           zmq_strerror(zmq_errno()));
        goto fail;
    }
    *out = r;
    return 0;
fail:
    router_destroy(r);
    return rc;
}

void router_destroy(router_t *r)
{
    if (!r) return;
    if (r->slots)
        for (size_t i = 0; i < r->n_slots; i++)
            if (r->slots[i].req) {
                s_req_free(r, r->slots[i].req);
                i--;
            }
    free(r->slots);
    if (r->cli) zmq_close(r->cli);
    if (r->sch) zmq_close(r->sch);
    if (r->zap) zmq_close(r->zap);
    if (r->zctx) zmq_ctx_term(r->zctx);
    free(r->clients);
    rtok_close(r->tok);
    chat_template_free(r->tmpl);
    msg_buf_free(&r->buf);
    free(r);
}

int router_run(router_t *r, volatile sig_atomic_t *stop)
{
    zmq_pollitem_t items[3] = {{r->cli, 0, ZMQ_POLLIN, 0}, {r->sch, 0, ZMQ_POLLIN, 0}, {r->zap, 0, ZMQ_POLLIN, 0}};
    bool ready = false;
    log_info("serving clients on %s; scheduler at %s", r->cfg->router.endpoint, r->cfg->scheduler.endpoint);
    while (!*stop) {
        /* READY once the scheduler has described the model (so the first client's request
         * can be checked against it), or after the start grace period without it: a router
         * must also come up while its scheduler is down, and then answers `unavailable` */
        if (!ready && (r->have_hello || strata_now() - r->t_start >= START_GRACE_S)) {
            notify_ready();
            ready = true;
        }
        int n = zmq_poll(items, r->zap ? 3 : 2, 50);
        if (n < 0 && zmq_errno() != EINTR) {
            log_error("zmq_poll: %s", zmq_strerror(zmq_errno()));
            return STRATA_EZMQ;
        }
        /* handshakes first: a client's connection waits on its answer */
        while (r->zap) {
            int zr = s_zap_serve(r);
            if (zr < 0) {
                log_error("ZAP handler: %s", zmq_strerror(-zr));
                return STRATA_EZMQ;
            }
            if (zr == 0) break;
        }
        /* Alternate bounded batches so that a client flooding requests cannot starve the
         * token stream of the others. */
        for (int more = 1; more && !*stop;) {
            more = 0;
            for (int i = 0; i < CLIENT_BATCH; i++) {
                int rc = s_client_recv(r);
                if (rc < 0) return rc;
                if (rc == 0) break;
                if (i == CLIENT_BATCH - 1) more = 1;
            }
            for (int i = 0; i < SCHED_BATCH; i++) {
                int rc = s_sched_recv(r);
                if (rc < 0) return rc;
                if (rc == 0) break;
            }
            s_timers(r, strata_now());
        }
        s_timers(r, strata_now());
        notify_watchdog();
    }
    notify_stopping();
    log_info("stopping: %d requests in flight", r->n_reqs);
    for (size_t i = 0; i < r->n_slots; i++) {
        req_t *q = r->slots[i].req;
        if (!q) continue;
        if (q->state != RQ_CLOSING)
            s_client_error(r, q->client, q->client_len, true, q->cid, MSG_E_SHUTTING_DOWN, "the router is stopping");
        s_done_pending(r, q, NULL);
        if (!q->cancel_sent) s_sched_simple(r, MSG_SCHED_CANCEL, q->id, 0);
        s_req_free(r, q);
        i--;
    }
    return 0;
}
