/* bridge.c - a worker of strata-http: one thread that holds DEALER sockets to the router and
 * drives one libmicrohttpd daemon (external polling, epoll), so that a router event becomes bytes
 * on the client's socket in the thread that received it (see http.h).
 *
 * Sockets. The router limits the requests one client identity has in flight
 * ([router] max_inflight_per_client), and to it a worker is one client per socket, so each worker
 * opens ceil(its connections / max_inflight_per_client) sockets (at most BRIDGE_MAX_SOCKS), each
 * with its own identity, random per process start, and puts each request on the one with the
 * fewest in flight. Identities are stable while the process lives, so after a router restart
 * (seen as its uptime going back) every open request is resumed from what it has received, as
 * `strata client` does (PROTOCOL.md "Resume").
 *
 * The loop. zmq_poll waits on the sockets, an eventfd (stop) and the daemon's epoll descriptor,
 * for at most the daemon's own timeout; every WATCH_S the sockets of suspended connections are
 * polled too (a client that closes one). Router events are applied to their calls (resuming their connections), then MHD_run
 * lets libmicrohttpd accept, read, call the access handler and the content reader, and write:
 * all in this thread.
 *
 * Locking. One mutex (b->mu) guards every call, the submit queue, the hash of open calls and the
 * router info. The thread takes it to apply each event and releases it around MHD_run, whose
 * callbacks take it (main's thread reads the info and shuts the worker down). MHD_resume_connection
 * is called with it held. Nothing blocks while it is held. */
#include <errno.h>
#include <jansson.h>
#include <microhttpd.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zmq.h>

#include "proto/zmsg.h"
#include "services/http/http.h"

#define BRIDGE_MAX_SOCKS 64
#define INFO_EVERY_S 0.5
#define INFO_STALE_S 3.0
#define INTERNAL_ID (1ull << 63)   /* ids of the bridge's own health / models requests */
#define POLL_MS 50
#define WATCH_S 0.05               /* how often suspended connections' clients are checked */

struct bridge {
    const strata_config_t *cfg;
    int index;                    /* the worker's number */
    int share;                    /* the connections it may hold */
    struct MHD_Daemon *d;         /* the daemon it drives (bridge_start) */
    int mhd_fd;                   /* ... its epoll descriptor */
    char endpoint[300];
    void *zctx;
    void *socks[BRIDGE_MAX_SOCKS];
    int inflight[BRIDGE_MAX_SOCKS];
    int n_socks;                  /* opened (as requests in flight need them) */
    int max_socks;                /* for share connections */
    uint8_t ident[8];             /* the sockets' identities: random per process start */
    char curve_sec[CONFIG_CURVE_KEY_LEN + 1], curve_pub[CONFIG_CURVE_KEY_LEN + 1];
    int efd;                      /* eventfd: wakes the thread from another one (stop) */
    pthread_t th;
    bool started;
    atomic_bool stop;
    atomic_bool dead;             /* the thread ended on an error */
    pthread_mutex_t mu;
    hcall_t *q_head, *q_tail;     /* submitted, not yet sent */
    uint64_t *cancels;            /* [n_cancels] ids to cancel, with their sockets */
    int *cancel_socks;
    size_t n_cancels, cap_cancels;
    hcall_t **hash;               /* [n_hash] chains of open calls by id */
    size_t n_hash;
    uint64_t next_id;
    bridge_info_t info;
    double t_info_rx, t_info_tx;
    bool resume_all;              /* the router restarted: resume every open call */
    bool closing;                 /* bridge_shutdown: calls are refused, not suspended */
    msg_buf_t buf;
    struct pollfd *watch;         /* s_watch's descriptors and their calls' ids */
    uint64_t *watch_ids;
    size_t cap_watch, cap_watch_ids;
};

hmetrics_t g_hm;

/* ---- calls ---- */

hcall_t *hcall_new(hcall_kind_t kind)
{
    hcall_t *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->kind = kind;
    c->refs = 1;
    c->fd = -1;
    return c;
}

static void s_call_free(hcall_t *c)
{
    msg_buf_free(&c->frame);
    for (int i = 0; i < c->n_stop; i++) free(c->stop[i]);
    for (int i = 0; i < c->n_stats; i++) free(c->stat_names[i]);
    free(c->stat_names);
    free(c->stat_vals);
    free(c->out);
    free(c->sse_head);
    free(c);
}

/* Drop a reference with the mutex held. */
static void s_unref(hcall_t *c)
{
    STRATA_ASSERT(c->refs > 0);
    if (--c->refs == 0) s_call_free(c);
}

void hcall_release(bridge_t *b, hcall_t *c)
{
    if (!c) return;
    pthread_mutex_lock(&b->mu);
    s_unref(c);
    pthread_mutex_unlock(&b->mu);
}

void bridge_lock(bridge_t *b) { pthread_mutex_lock(&b->mu); }
void bridge_unlock(bridge_t *b) { pthread_mutex_unlock(&b->mu); }

void bridge_suspend_locked(bridge_t *b, hcall_t *c)
{
    (void)b;
    c->suspended = true;
    MHD_suspend_connection(c->conn);
}

/* Let the connection go on (it has output, an answer or an error). */
static void s_wake(hcall_t *c)
{
    if (!c->suspended) return;
    c->suspended = false;
    MHD_resume_connection(c->conn);
}

static size_t s_bucket(const bridge_t *b, uint64_t id) { return (size_t)(id * 0x9E3779B97F4A7C15ull) & (b->n_hash - 1); }

static hcall_t *s_find(const bridge_t *b, uint64_t id)
{
    for (hcall_t *c = b->hash[s_bucket(b, id)]; c; c = c->next)
        if (c->id == id) return c;
    return NULL;
}

/* Remove c from the open calls and drop the bridge's reference (a call still in the submit
 * queue keeps it until s_flush takes it off the queue). */
static void s_close(bridge_t *b, hcall_t *c)
{
    if (c->closed) return;
    hcall_t **pp = &b->hash[s_bucket(b, c->id)];
    while (*pp && *pp != c) pp = &(*pp)->next;
    STRATA_ASSERT(*pp == c);
    *pp = c->next;
    c->next = NULL;
    c->closed = true;
    b->inflight[c->sock]--;
    if (!c->queued) s_unref(c);
}

static void s_wakeup(bridge_t *b)
{
    if (b->started && pthread_equal(pthread_self(), b->th)) return; /* the loop flushes before it polls */
    uint64_t one = 1;
    (void)!write(b->efd, &one, sizeof one);
}

/* Open the next DEALER socket to the router (the thread's, or before it starts). */
static int s_open_sock(bridge_t *b, strata_errbuf_t *eb)
{
    const int i = b->n_socks;
    void *s = zmq_socket(b->zctx, ZMQ_DEALER);
    if (!s) return strata_seterr(eb, STRATA_EZMQ, "zmq_socket: %s", zmq_strerror(zmq_errno()));
    const uint8_t *r = b->ident;
    char ident[48];
    int il = snprintf(ident, sizeof ident, "http-%02x%02x%02x%02x%02x%02x%02x%02x-%d-%d", r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7],
                      b->index, i);
    int zero = 0, hb = 1000, hbt = 3000, hwm = 100000;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_ROUTING_ID, ident, (size_t)il);
    zmq_setsockopt(s, ZMQ_HEARTBEAT_IVL, &hb, sizeof hb);
    zmq_setsockopt(s, ZMQ_HEARTBEAT_TIMEOUT, &hbt, sizeof hbt);
    zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof hwm);
    zmq_setsockopt(s, ZMQ_RCVHWM, &hwm, sizeof hwm);
    const char *sec = b->curve_sec, *pub = b->curve_pub;
    if (sec[0] && (zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, pub, CONFIG_CURVE_KEY_LEN) < 0 ||
                   zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, pub, CONFIG_CURVE_KEY_LEN) < 0 ||
                   zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, sec, CONFIG_CURVE_KEY_LEN) < 0)) {
        zmq_close(s);
        return strata_seterr(eb, STRATA_EZMQ, "CURVE socket options: %s", zmq_strerror(zmq_errno()));
    }
    if (zmq_connect(s, b->endpoint) < 0) {
        int e = zmq_errno();
        zmq_close(s);
        return strata_seterr(eb, STRATA_EINVAL_INPUT, "cannot connect to the router at %s: %s", b->endpoint, zmq_strerror(e));
    }
    b->socks[i] = s;
    b->inflight[i] = 0;
    b->n_socks = i + 1;
    return 0;
}

uint64_t bridge_next_id(bridge_t *b)
{
    pthread_mutex_lock(&b->mu);
    uint64_t id = b->next_id++;
    if (b->next_id & INTERNAL_ID) b->next_id = 1;
    pthread_mutex_unlock(&b->mu);
    return id;
}

void bridge_submit(bridge_t *b, hcall_t *c, struct MHD_Connection *conn, int fd)
{
    pthread_mutex_lock(&b->mu);
    if (b->closing) { /* not suspended: the access handler runs again and answers the error */
        herr_set(&c->err, 503, "server_error", NULL, "service_unavailable", "strata-http is stopping");
        c->failed = c->finished = c->closed = true;
        pthread_mutex_unlock(&b->mu);
        return;
    }
    int best = 0;
    for (int i = 1; i < b->n_socks; i++)
        if (b->inflight[i] < b->inflight[best]) best = i;
    if (b->inflight[best] >= b->cfg->router.max_inflight_per_client && b->n_socks < b->max_socks) {
        strata_errbuf_t eb = {{0}};
        if (s_open_sock(b, &eb) == 0) best = b->n_socks - 1;
        else log_warn("%s", eb.msg);
    }
    c->sock = best;
    b->inflight[best]++;
    c->refs++; /* the bridge's */
    c->conn = conn;
    c->fd = fd;
    c->watch_fd = fd >= 0;
    c->queued = true;
    c->t_submit = strata_now();
    size_t h = s_bucket(b, c->id);
    c->next = b->hash[h];
    b->hash[h] = c;
    c->qnext = NULL;
    if (b->q_tail) b->q_tail->qnext = c;
    else b->q_head = c;
    b->q_tail = c;
    bridge_suspend_locked(b, c);
    pthread_mutex_unlock(&b->mu);
    s_wakeup(b);
}

static void s_cancel_locked(bridge_t *b, hcall_t *c)
{
    if (strata_grow(&b->cancels, &b->cap_cancels, b->n_cancels, sizeof *b->cancels, 64) < 0) return;
    size_t cap = b->cap_cancels;
    int *ns = realloc(b->cancel_socks, cap * sizeof *ns);
    if (!ns) return;
    b->cancel_socks = ns;
    b->cancels[b->n_cancels] = c->id;
    b->cancel_socks[b->n_cancels++] = c->sock;
}

void bridge_abandon(bridge_t *b, hcall_t *c)
{
    pthread_mutex_lock(&b->mu);
    bool open = !c->closed;
    if (open && !c->finished) {
        c->client_gone = true;
        c->finished = true;
        if (c->kind == HC_GENERATE) {
            atomic_fetch_add_explicit(&g_hm.client_gone, 1, memory_order_relaxed);
            s_cancel_locked(b, c);
        }
    }
    if (open) s_close(b, c);
    pthread_mutex_unlock(&b->mu);
    s_wakeup(b);
}

void bridge_info(bridge_t *b, bridge_info_t *out)
{
    pthread_mutex_lock(&b->mu);
    *out = b->info;
    out->reachable = b->t_info_rx > 0 && strata_now() - b->t_info_rx < INFO_STALE_S;
    if (!out->reachable) out->ok = false;
    pthread_mutex_unlock(&b->mu);
}

/* ---- output ---- */

static int s_out(hcall_t *c, const char *p, size_t n)
{
    if (c->out_off == c->out_len) c->out_off = c->out_len = 0;
    if (c->out_cap - c->out_len < n + 1) {
        size_t cap = c->out_cap ? c->out_cap : 1024;
        while (cap - c->out_len < n + 1) cap *= 2;
        char *no = realloc(c->out, cap);
        if (!no) return STRATA_ENOMEM;
        c->out = no;
        c->out_cap = cap;
    }
    memcpy(c->out + c->out_len, p, n);
    c->out_len += n;
    c->out[c->out_len] = 0;
    return 0;
}

static int s_dump_cb(const char *p, size_t n, void *data) { return s_out(data, p, n) < 0 ? -1 : 0; }

/* Add v as compact JSON (a value of any kind). */
static void s_out_json(hcall_t *c, const json_t *v) { json_dump_callback(v, s_dump_cb, c, JSON_COMPACT | JSON_ENCODE_ANY); }

/* Add "data: JSON\n\n" for o (its reference is taken). */
static void s_sse(hcall_t *c, json_t *o)
{
    if (!o) return;
    s_out(c, "data: ", 6);
    s_out_json(c, o);
    s_out(c, "\n\n", 2);
    json_decref(o);
}

static json_t *s_text(const char *t, size_t n)
{
    json_t *s = json_stringn(t ? t : "", t ? n : 0);
    return s ? s : json_string("\xEF\xBF\xBD");
}

static const char *s_finish_name(msg_finish_t f) { return f == MSG_FINISH_LENGTH ? "length" : "stop"; }

/* ---- log-probabilities (OpenAI's shapes) ---- */

/* A log-probability as OpenAI writes it: JSON has no -inf, and OpenAI gives -9999.0 for tokens
 * that unlikely. */
static json_t *s_lp_value(float v) { return json_real(v >= -9999.0f ? (double)v : -9999.0); }

/* A token's name, as "token" shows it: its text, or "token_id:N" (return_tokens_as_token_ids, or
 * a router without a tokenizer). buf holds the latter. */
static const char *s_lp_name(const hcall_t *c, int32_t id, const msg_str_t *text, char *buf, size_t cap, size_t *len)
{
    if (c->tokens_as_ids || !text) {
        int k = snprintf(buf, cap, "token_id:%d", (int)id);
        *len = k > 0 ? (size_t)k : 0;
        return buf;
    }
    *len = text->len;
    return text->s ? text->s : "";
}

/* {"token", "logprob", "bytes"} of one token (chat). */
static json_t *s_lp_entry(const hcall_t *c, int32_t id, float v, const msg_str_t *text)
{
    char buf[32];
    size_t len;
    const char *name = s_lp_name(c, id, text, buf, sizeof buf, &len);
    json_t *bytes = json_null();
    if (text) {
        bytes = json_array();
        for (size_t i = 0; bytes && i < text->len; i++) json_array_append_new(bytes, json_integer((unsigned char)text->s[i]));
    }
    return json_pack("{s:o, s:o, s:o}", "token", s_text(name, len), "logprob", s_lp_value(v), "bytes", bytes ? bytes : json_null());
}

/* Code points of UTF-8 text (Python's len of the token string: completions' text_offset). */
static int64_t s_codepoints(const char *s, size_t n)
{
    int64_t k = 0;
    for (size_t i = 0; i < n; i++) k += ((unsigned char)s[i] & 0xC0) != 0x80;
    return k;
}

/* The "logprobs" of a choice for tokens[n] and their log-probabilities lp: chat
 * {"content": [{token, logprob, bytes, top_logprobs}], "refusal": null}; completions
 * {"tokens", "token_logprobs", "top_logprobs": [{token: logprob}] (the top_logprobs most likely
 * and the sampled token), "text_offset"} with text_offset running on from c->text_offset. JSON
 * null when c did not ask or there is nothing. */
static json_t *s_logprobs(hcall_t *c, const int32_t *tokens, int32_t n, const msg_logprobs_t *lp)
{
    if (!c->logprobs || n <= 0 || !lp->logprobs || lp->n_logprobs != n) return json_null();
    const int32_t k = lp->top_n;
    const msg_str_t *txt = lp->token_text, *ttxt = lp->top_text;
    if (c->api == HREQ_CHAT) {
        json_t *content = json_array();
        for (int32_t i = 0; content && i < n; i++) {
            json_t *e = s_lp_entry(c, tokens[i], lp->logprobs[i], txt ? &txt[i] : NULL);
            json_t *top = json_array();
            for (int32_t j = 0; top && j < k; j++)
                json_array_append_new(top, s_lp_entry(c, lp->top_tokens[i * k + j], lp->top_logprobs[i * k + j],
                                                      ttxt ? &ttxt[i * k + j] : NULL));
            if (!e || !top || json_object_set_new(e, "top_logprobs", top) || json_array_append_new(content, e)) {
                json_decref(content);
                return json_null();
            }
        }
        return content ? json_pack("{s:o, s:n}", "content", content, "refusal") : json_null();
    }
    json_t *names = json_array(), *vals = json_array(), *tops = json_array(), *offs = json_array();
    for (int32_t i = 0; names && vals && tops && offs && i < n; i++) {
        char buf[32];
        size_t len;
        const char *name = s_lp_name(c, tokens[i], txt ? &txt[i] : NULL, buf, sizeof buf, &len);
        json_array_append_new(names, s_text(name, len));
        json_array_append_new(vals, s_lp_value(lp->logprobs[i]));
        json_array_append_new(offs, json_integer(c->text_offset));
        c->text_offset += s_codepoints(name, len);
        /* the most likely first, then the sampled token if it is not among them; of two tokens
         * with the same name the more likely is kept */
        json_t *d = json_object();
        bool have_sampled = false;
        for (int32_t j = 0; d && j <= k; j++) {
            int32_t id = j < k ? lp->top_tokens[i * k + j] : tokens[i];
            if (j == k && have_sampled) break;
            have_sampled |= id == tokens[i];
            const msg_str_t *t = j < k ? (ttxt ? &ttxt[i * k + j] : NULL) : (txt ? &txt[i] : NULL);
            char b2[32];
            size_t l2;
            const char *nm = s_lp_name(c, id, t, b2, sizeof b2, &l2);
            json_t *key = s_text(nm, l2); /* the key as JSON text: valid UTF-8 */
            const char *ks = key ? json_string_value(key) : NULL;
            if (ks && strlen(ks) == json_string_length(key) && !json_object_get(d, ks))
                json_object_set_new(d, ks, s_lp_value(j < k ? lp->top_logprobs[i * k + j] : lp->logprobs[i]));
            json_decref(key);
        }
        json_array_append_new(tops, d ? d : json_null());
    }
    if (!names || !vals || !tops || !offs) {
        json_decref(names), json_decref(vals), json_decref(tops), json_decref(offs);
        return json_null();
    }
    return json_pack("{s:o, s:o, s:o, s:o}", "tokens", names, "token_logprobs", vals, "top_logprobs", tops, "text_offset", offs);
}

static json_t *s_usage(const hcall_t *c)
{
    return json_pack("{s:i, s:i, s:i}", "prompt_tokens", (json_int_t)c->prompt_tokens, "completion_tokens",
                     (json_int_t)c->completion_tokens, "total_tokens", (json_int_t)c->prompt_tokens + c->completion_tokens);
}

/* One streamed chunk: text (or NULL), its tokens' log-probabilities (s_logprobs; NULL for none)
 * and the finish reason (or NULL). */
/* The chunk of text alone, the one sent for nearly every token: the chunk's fields before "text"
 * or "delta" are dumped once a call (c->sse_head), the text each time; the same JSON as s_chunk
 * builds. 0, or -1 out of memory (then s_chunk builds it). */
static int s_text_chunk(hcall_t *c, const char *text, size_t n)
{
    if (!c->sse_head) {
        json_t *o = json_pack("{s:s, s:s, s:I, s:s}", "id", c->resp_id, "object", c->api == HREQ_CHAT ? "chat.completion.chunk" : "text_completion",
                              "created", (json_int_t)c->created, "model", c->model);
        char *d = o ? json_dumps(o, JSON_COMPACT) : NULL;
        json_decref(o);
        size_t k = d ? strlen(d) : 0;
        if (k < 2 || d[k - 1] != '}' || !(c->sse_head = malloc(k + 32))) {
            free(d);
            return -1;
        }
        memcpy(c->sse_head, d, k - 1);
        c->sse_head_len = (size_t)snprintf(c->sse_head + k - 1, 33, ",\"choices\":[{\"index\":0,") + k - 1;
        free(d);
    }
    json_t *t = s_text(text, n);
    if (!t) return -1;
    s_out(c, "data: ", 6);
    s_out(c, c->sse_head, c->sse_head_len);
    static const char delta[] = "\"delta\":{\"content\":", txt[] = "\"text\":", usage[] = ",\"usage\":null";
    if (c->api == HREQ_CHAT) s_out(c, delta, sizeof delta - 1);
    else s_out(c, txt, sizeof txt - 1);
    s_out_json(c, t);
    json_decref(t);
    if (c->api == HREQ_CHAT) s_out(c, "}", 1);
    static const char tail[] = ",\"logprobs\":null,\"finish_reason\":null}]";
    s_out(c, tail, sizeof tail - 1);
    if (c->include_usage) s_out(c, usage, sizeof usage - 1);
    s_out(c, "}\n\n", 3);
    return 0;
}

static void s_chunk(hcall_t *c, const char *text, size_t n, json_t *logprobs, const char *finish)
{
    if (text && !logprobs && !finish && (c->api != HREQ_CHAT || c->role_sent) && s_text_chunk(c, text, n) == 0) return;
    if (!logprobs) logprobs = json_null();
    json_t *choice;
    if (c->api == HREQ_CHAT) {
        json_t *delta = json_object();
        if (!c->role_sent) {
            json_object_set_new(delta, "role", json_string("assistant"));
            if (!text) text = "", n = 0;
            c->role_sent = true;
        }
        if (text) json_object_set_new(delta, "content", s_text(text, n));
        choice = json_pack("{s:i, s:o, s:o, s:o}", "index", 0, "delta", delta, "logprobs", logprobs, "finish_reason",
                           finish ? json_string(finish) : json_null());
    } else {
        choice = json_pack("{s:i, s:o, s:o, s:o}", "index", 0, "text", s_text(text, n), "logprobs", logprobs, "finish_reason",
                           finish ? json_string(finish) : json_null());
    }
    json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:[o]}", "id", c->resp_id, "object",
                          c->api == HREQ_CHAT ? "chat.completion.chunk" : "text_completion", "created", (json_int_t)c->created,
                          "model", c->model, "choices", choice);
    if (o && c->include_usage) json_object_set_new(o, "usage", json_null());
    s_sse(c, o);
}

static void s_stream_end(hcall_t *c)
{
    if (c->api == HREQ_CHAT && !c->role_sent) s_chunk(c, NULL, 0, NULL, NULL);
    s_chunk(c, NULL, 0, NULL, s_finish_name(c->finish));
    if (c->include_usage)
        s_sse(c, json_pack("{s:s, s:s, s:I, s:s, s:[], s:o}", "id", c->resp_id, "object",
                           c->api == HREQ_CHAT ? "chat.completion.chunk" : "text_completion", "created", (json_int_t)c->created,
                           "model", c->model, "choices", "usage", s_usage(c)));
    s_out(c, "data: [DONE]\n\n", 14);
}

/* The whole answer of a request that did not stream (d: the router's done, with the tokens). */
static void s_body(hcall_t *c, const msg_done_t *d)
{
    json_t *choice;
    const char *text = d->text.s;
    size_t n = d->text.len;
    json_t *lp = s_logprobs(c, d->tokens, d->n_tokens, &d->lp);
    if (c->api == HREQ_CHAT)
        choice = json_pack("{s:i, s:{s:s, s:o}, s:o, s:s}", "index", 0, "message", "role", "assistant", "content", s_text(text, n),
                           "logprobs", lp, "finish_reason", s_finish_name(c->finish));
    else
        choice = json_pack("{s:i, s:o, s:o, s:s}", "index", 0, "text", s_text(text, n), "logprobs", lp, "finish_reason",
                           s_finish_name(c->finish));
    json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:[o], s:o}", "id", c->resp_id, "object",
                          c->api == HREQ_CHAT ? "chat.completion" : "text_completion", "created", (json_int_t)c->created, "model",
                          c->model, "choices", choice, "usage", s_usage(c));
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    c->out_len = c->out_off = 0;
    if (s) s_out(c, s, strlen(s));
    else herr_set(&c->err, 500, "server_error", NULL, NULL, "out of memory"), c->failed = true;
    free(s);
}

/* The request ended with an error: an HTTP error if nothing was sent yet, else an error event
 * and the end of the stream (as vLLM does). */
static void s_fail(bridge_t *b, hcall_t *c, const herr_t *e)
{
    if (c->started && c->stream) {
        char *j = herr_json(e);
        if (j) {
            s_out(c, "data: ", 6);
            s_out(c, j, strlen(j));
            s_out(c, "\n\n", 2);
            free(j);
        }
        s_out(c, "data: [DONE]\n\n", 14);
    } else {
        c->err = *e;
        c->failed = true;
    }
    c->finished = true;
    s_wake(c);
    s_close(b, c);
}

/* ---- router events ---- */

static void s_on_generate_event(bridge_t *b, hcall_t *c, const msg_t *m)
{
    if (m->type == MSG_TOKEN) {
        const msg_tokens_t *t = &m->u.tokens;
        if (t->index + t->n_tokens > c->n_tokens) c->n_tokens = t->index + t->n_tokens;
        c->n_text += (int64_t)t->text.len;
        if (c->t_first == 0) c->t_first = strata_now();
        if (!c->stream) return;
        /* a token whose text is held back (a UTF-8 sequence, a possible stop string) still has
         * its log-probability in this chunk, with empty text */
        const bool lp = c->logprobs && t->lp.n_logprobs > 0;
        if (t->text.len || lp) s_chunk(c, t->text.s ? t->text.s : "", t->text.len, lp ? s_logprobs(c, t->tokens, t->n_tokens, &t->lp) : NULL, NULL);
        else if (c->api == HREQ_CHAT && !c->role_sent) s_chunk(c, NULL, 0, NULL, NULL);
        else return;
        c->started = true;
        s_wake(c);
    } else if (m->type == MSG_DONE) {
        const msg_done_t *d = &m->u.done;
        c->finish = d->finish;
        c->prompt_tokens = d->prompt_tokens;
        c->completion_tokens = d->completion_tokens;
        atomic_fetch_add_explicit(&g_hm.prompt_tokens, (uint64_t)d->prompt_tokens, memory_order_relaxed);
        atomic_fetch_add_explicit(&g_hm.completion_tokens, (uint64_t)d->completion_tokens, memory_order_relaxed);
        if (c->stream) {
            s_stream_end(c);
            c->started = true;
        } else {
            s_body(c, d);
        }
        c->finished = true;
        s_wake(c);
        s_close(b, c);
    } else if (m->type == MSG_ERROR) {
        herr_t e;
        herr_from_router(&e, m->u.error.code, m->u.error.message.s ? m->u.error.message.s : "", c->api);
        s_fail(b, c, &e);
    }
}

static void s_on_stats(bridge_t *b, hcall_t *c, const msg_stats_t *st)
{
    c->stat_names = calloc((size_t)(st->n ? st->n : 1), sizeof *c->stat_names);
    c->stat_vals = calloc((size_t)(st->n ? st->n : 1), sizeof *c->stat_vals);
    if (c->stat_names && c->stat_vals)
        for (int i = 0; i < st->n; i++) {
            if (!(c->stat_names[c->n_stats] = strndup(st->items[i].name.s, st->items[i].name.len))) break;
            c->stat_vals[c->n_stats++] = st->items[i].value;
        }
    c->finished = true;
    s_wake(c);
    s_close(b, c);
}

static void s_on_msg(bridge_t *b, const msg_t *m)
{
    double now = strata_now();
    if (m->type == MSG_HEALTH_REPLY) {
        const msg_health_t *h = &m->u.health;
        if (b->t_info_rx > 0 && h->uptime_s + 1.0 < b->info.uptime_s) b->resume_all = true; /* a new router */
        b->t_info_rx = now;
        b->info.ok = h->status.s && !strcmp(h->status.s, "ok") && h->scheduler;
        b->info.uptime_s = h->uptime_s;
        return;
    }
    if (m->type == MSG_MODELS_REPLY) {
        if (m->u.models.n > 0) {
            const msg_model_t *md = &m->u.models.models[0];
            snprintf(b->info.model, sizeof b->info.model, "%.*s", (int)md->name.len, md->name.s);
            b->info.vocab = md->vocab;
            b->info.max_context = md->max_context;
        }
        return;
    }
    if (!m->has_id || (m->id & INTERNAL_ID)) {
        if (m->type == MSG_ERROR && m->u.error.code != MSG_E_UNAVAILABLE)
            log_warn("router: %s: %s", msg_errcode_name(m->u.error.code), m->u.error.message.s ? m->u.error.message.s : "");
        return;
    }
    hcall_t *c = s_find(b, m->id);
    if (!c || c->finished) return; /* a request this process has let go */
    if (c->kind == HC_STATS) {
        if (m->type == MSG_STATS_REPLY) s_on_stats(b, c, &m->u.stats);
        else if (m->type == MSG_ERROR) {
            herr_t e;
            herr_from_router(&e, m->u.error.code, m->u.error.message.s ? m->u.error.message.s : "", HREQ_COMPLETION);
            s_fail(b, c, &e);
        }
        return;
    }
    s_on_generate_event(b, c, m);
}

/* ---- the thread ---- */

static int s_send_simple(bridge_t *b, int sock, msg_type_t type, uint64_t id)
{
    msg_t m;
    msg_init(&m, type);
    m.has_id = true;
    m.id = id;
    return zmsg_send(b->socks[sock], NULL, 0, &m, &b->buf, ZMQ_DONTWAIT);
}

/* Send what was submitted and the cancels (the mutex is held). */
static void s_flush(bridge_t *b)
{
    for (hcall_t *c = b->q_head, *n; c; c = n) {
        n = c->qnext;
        c->qnext = NULL;
        c->queued = false;
        if (c->closed) { /* ended before it went out */
            s_unref(c);
            continue;
        }
        if (zmq_send(b->socks[c->sock], c->frame.data, c->frame.size, ZMQ_DONTWAIT) < 0) {
            herr_t e;
            herr_set(&e, 503, "server_error", NULL, "service_unavailable", "the router at %s is not accepting requests (%s)",
                     b->endpoint, zmq_strerror(zmq_errno()));
            s_fail(b, c, &e);
            continue;
        }
        c->sent = true;
    }
    b->q_head = b->q_tail = NULL;
    for (size_t i = 0; i < b->n_cancels; i++) s_send_simple(b, b->cancel_socks[i], MSG_CANCEL, b->cancels[i]);
    b->n_cancels = 0;
}

/* After a router restart: resume every open request from what it has. */
static void s_resume_all(bridge_t *b)
{
    for (size_t h = 0; h < b->n_hash; h++)
        for (hcall_t *c = b->hash[h]; c; c = c->next) {
            if (!c->sent || c->finished) continue;
            if (c->kind == HC_STATS) continue;
            msg_str_t stops[MSG_MAX_STOP];
            for (int i = 0; i < c->n_stop; i++) stops[i] = msg_str(c->stop[i]);
            msg_t m;
            msg_init(&m, MSG_RESUME);
            m.has_id = true;
            m.id = c->id;
            m.u.resume.from = c->stream ? c->n_tokens : 0;
            m.u.resume.text_from = c->stream ? c->n_text : 0;
            m.u.resume.stop = stops;
            m.u.resume.n_stop = c->n_stop;
            m.u.resume.stream = c->stream;
            if (zmsg_send(b->socks[c->sock], NULL, 0, &m, &b->buf, ZMQ_DONTWAIT) == 0)
                atomic_fetch_add_explicit(&g_hm.router_resumes, 1, memory_order_relaxed);
        }
}

/* Deadlines (request_timeout_s, and 2 s for a stats request). */
static void s_deadlines(bridge_t *b, double now)
{
    for (size_t h = 0; h < b->n_hash; h++)
        for (hcall_t *c = b->hash[h], *n; c; c = n) {
            n = c->next;
            if (c->finished || now < c->deadline) continue;
            herr_t e;
            if (c->kind == HC_GENERATE) {
                atomic_fetch_add_explicit(&g_hm.timeouts, 1, memory_order_relaxed);
                s_cancel_locked(b, c);
                herr_set(&e, 504, "server_error", NULL, "timeout", "the request took longer than [http] request_timeout_s = %d s",
                         b->cfg->http.request_timeout_s);
            } else {
                herr_set(&e, 503, "server_error", NULL, "service_unavailable", "the router did not answer 'stats' in time");
            }
            s_fail(b, c, &e);
        }
}

/* A client whose connection is suspended has closed it: cancel its request. */
static void s_check_fd(bridge_t *b, hcall_t *c)
{
    char ch;
    ssize_t k = recv(c->fd, &ch, 1, MSG_PEEK | MSG_DONTWAIT);
    if (k > 0) {
        c->watch_fd = false; /* the next request, pipelined: libmicrohttpd reads it later */
        return;
    }
    if (k < 0 && (errno == EAGAIN || errno == EINTR)) return;
    c->client_gone = true;
    c->finished = true;
    if (c->kind == HC_GENERATE) {
        atomic_fetch_add_explicit(&g_hm.client_gone, 1, memory_order_relaxed);
        s_cancel_locked(b, c);
    }
    s_wake(c);
    s_close(b, c);
}

/* How long the loop may wait: POLL_MS, or less when libmicrohttpd has a connection to go on
 * with (0) or a timeout due sooner. */
static long s_poll_ms(bridge_t *b)
{
    MHD_UNSIGNED_LONG_LONG t;
    if (MHD_get_timeout(b->d, &t) == MHD_YES && t < POLL_MS) return (long)t;
    return POLL_MS;
}

/* The clients of suspended connections, polled every WATCH_S: cancel the requests of those that
 * have closed (the mutex is held). */
static void s_watch(bridge_t *b)
{
    size_t n = 0;
    for (size_t h = 0; h < b->n_hash; h++)
        for (hcall_t *c = b->hash[h]; c; c = c->next)
            if (c->suspended && c->watch_fd && !c->finished) {
                if (strata_grow(&b->watch, &b->cap_watch, n, sizeof *b->watch, 64) < 0 ||
                    strata_grow(&b->watch_ids, &b->cap_watch_ids, n, sizeof *b->watch_ids, 64) < 0)
                    return;
                b->watch[n] = (struct pollfd){c->fd, POLLIN, 0};
                b->watch_ids[n++] = c->id;
            }
    if (n == 0 || poll(b->watch, n, 0) <= 0) return;
    for (size_t i = 0; i < n; i++) {
        if (!(b->watch[i].revents & (POLLIN | POLLERR | POLLHUP))) continue;
        hcall_t *c = s_find(b, b->watch_ids[i]);
        /* still the same connection, still suspended (else libmicrohttpd owns the socket again) */
        if (c && c->suspended && c->watch_fd && c->fd == b->watch[i].fd && !c->finished) s_check_fd(b, c);
    }
}

static void *s_thread(void *arg)
{
    bridge_t *b = arg;
    zmq_pollitem_t items[BRIDGE_MAX_SOCKS + 2];
    double t_deadline = 0, t_watch = 0;
    while (!atomic_load(&b->stop)) {
        double now = strata_now();
        pthread_mutex_lock(&b->mu);
        s_flush(b);
        if (b->resume_all) {
            b->resume_all = false;
            log_warn("the router restarted: resuming the requests in flight");
            s_resume_all(b);
        }
        if (now - t_deadline > 0.1) {
            s_deadlines(b, now);
            t_deadline = now;
        }
        if (now - t_watch > WATCH_S) {
            s_watch(b);
            t_watch = now;
        }
        pthread_mutex_unlock(&b->mu);
        const int ns = b->n_socks;
        for (int i = 0; i < ns; i++) items[i] = (zmq_pollitem_t){b->socks[i], 0, ZMQ_POLLIN, 0};
        items[ns] = (zmq_pollitem_t){NULL, b->efd, ZMQ_POLLIN, 0};
        items[ns + 1] = (zmq_pollitem_t){NULL, b->mhd_fd, ZMQ_POLLIN, 0};
        if (now - b->t_info_tx >= INFO_EVERY_S) {
            s_send_simple(b, 0, MSG_HEALTH, INTERNAL_ID | 1);
            s_send_simple(b, 0, MSG_MODELS, INTERNAL_ID | 2);
            b->t_info_tx = now;
        }
        int pr = zmq_poll(items, ns + 2, s_poll_ms(b));
        if (pr < 0 && zmq_errno() != EINTR) {
            log_error("bridge: zmq_poll: %s", zmq_strerror(zmq_errno()));
            break;
        }
        if (pr > 0) {
            if (items[ns].revents & ZMQ_POLLIN) {
                uint64_t v;
                (void)!read(b->efd, &v, sizeof v);
            }
            for (int i = 0; i < ns; i++) {
                if (!(items[i].revents & ZMQ_POLLIN)) continue;
                for (int k = 0; k < 1024; k++) {
                    msg_t m;
                    msg_err_t err;
                    int r = zmsg_recv(b->socks[i], MSG_FAM_REPLY, &m, &err, ZMQ_DONTWAIT);
                    if (r == -EAGAIN) {
                        msg_free(&m);
                        break;
                    }
                    if (r < 0) {
                        log_warn("bridge: bad reply from the router: %s", err.text);
                    } else {
                        pthread_mutex_lock(&b->mu);
                        s_on_msg(b, &m);
                        pthread_mutex_unlock(&b->mu);
                    }
                    msg_free(&m);
                }
            }
        }
        /* accept, read, answer and write what the events above resumed */
        if (MHD_run(b->d) != MHD_YES) {
            log_error("bridge: libmicrohttpd stopped serving");
            break;
        }
    }
    if (!atomic_load(&b->stop)) atomic_store(&b->dead, true);
    return NULL;
}

bool bridge_dead(bridge_t *b) { return atomic_load(&b->dead); }

/* ---- life cycle ---- */

/* The router's endpoint as a client reaches it: a wildcard host becomes loopback. */
static void s_endpoint(const char *ep, char *out, size_t cap)
{
    if (!strncmp(ep, "tcp://*:", 8)) snprintf(out, cap, "tcp://127.0.0.1:%s", ep + 8);
    else if (!strncmp(ep, "tcp://0.0.0.0:", 14)) snprintf(out, cap, "tcp://127.0.0.1:%s", ep + 14);
    else if (!strncmp(ep, "tcp://[::]:", 11)) snprintf(out, cap, "tcp://[::1]:%s", ep + 11);
    else snprintf(out, cap, "%s", ep);
}

int bridge_create(const strata_config_t *cfg, int index, int share, bridge_t **out, strata_errbuf_t *eb)
{
    int rc = 0;
    bridge_t *b = calloc(1, sizeof *b);
    if (!b) return STRATA_ENOMEM;
    b->cfg = cfg;
    b->index = index;
    b->share = share > 0 ? share : 1;
    b->efd = -1;
    b->mhd_fd = -1;
    pthread_mutex_init(&b->mu, NULL);
    s_endpoint(cfg->router.endpoint, b->endpoint, sizeof b->endpoint);
    b->n_hash = 64;
    while (b->n_hash < 2 * (size_t)b->share) b->n_hash *= 2;
    b->hash = calloc(b->n_hash, sizeof *b->hash);
    if (!b->hash) { rc = STRATA_ENOMEM; goto fail; }
    if (getrandom(b->ident, sizeof b->ident, 0) != (ssize_t)sizeof b->ident) {
        uint64_t t = strata_now_ns() ^ (uint64_t)getpid();
        memcpy(b->ident, &t, 8);
    }
    memcpy(&b->next_id, b->ident, 4);
    b->next_id = (b->next_id & 0xffffffffu) + 1;
    int per = cfg->router.max_inflight_per_client;
    b->max_socks = (b->share + per - 1) / per;
    if (b->max_socks < 1) b->max_socks = 1;
    if (b->max_socks > BRIDGE_MAX_SOCKS) b->max_socks = BRIDGE_MAX_SOCKS;
    if ((b->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0) {
        rc = strata_seterr(eb, -errno, "eventfd: %s", strerror(errno));
        goto fail;
    }
    /* a router with CURVE: connect with its own keypair, which it always accepts (the group's own
     * services read its secret key; no other client can) */
    if (cfg->router.curve_secret_key_file[0]) {
        if ((rc = config_read_curve_key(cfg->router.curve_secret_key_file, true, "[router] curve_secret_key_file", b->curve_sec, eb)) < 0)
            goto fail;
        if (zmq_curve_public(b->curve_pub, b->curve_sec) < 0) {
            rc = strata_seterr(eb, STRATA_EINVAL_INPUT, "[router] curve_secret_key_file %s: not a CURVE secret key",
                               cfg->router.curve_secret_key_file);
            goto fail;
        }
    }
    if (!(b->zctx = zmq_ctx_new())) { rc = STRATA_EZMQ; goto fail; }
    zmq_ctx_set(b->zctx, ZMQ_MAX_SOCKETS, b->max_socks + 16);
    /* the first socket now (it also asks the router's health); the others as requests need them */
    if ((rc = s_open_sock(b, eb)) < 0) goto fail;
    log_debug("worker %d: router at %s, up to %d socket%s%s", index, b->endpoint, b->max_socks, b->max_socks == 1 ? "" : "s",
              b->curve_pub[0] ? ", CURVE" : "");
    *out = b;
    return 0;
fail:
    bridge_destroy(b);
    return rc;
}

int bridge_start(bridge_t *b, struct MHD_Daemon *d, strata_errbuf_t *eb)
{
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_EPOLL_FD);
    if (!di || di->epoll_fd < 0) return strata_seterr(eb, STRATA_EIO, "libmicrohttpd has no epoll descriptor");
    b->d = d;
    b->mhd_fd = di->epoll_fd;
    if (pthread_create(&b->th, NULL, s_thread, b) != 0) return strata_seterr(eb, STRATA_ENOMEM, "cannot start worker %d's thread", b->index);
    b->started = true;
    return 0;
}

void bridge_shutdown(bridge_t *b)
{
    if (!b || b->closing) return;
    if (b->started) {
        atomic_store(&b->stop, true);
        s_wakeup(b);
        pthread_join(b->th, NULL);
        b->started = false;
    }
    /* cancel what is still open upstream, and let every connection finish */
    pthread_mutex_lock(&b->mu);
    b->closing = true;
    for (hcall_t *c = b->q_head, *n; c; c = n) { /* never sent: nothing to cancel */
        n = c->qnext;
        c->queued = false;
        if (c->closed) s_unref(c);
    }
    b->q_head = b->q_tail = NULL;
    for (size_t h = 0; b->hash && h < b->n_hash; h++)
        while (b->hash[h]) {
            hcall_t *c = b->hash[h];
            if (c->sent && !c->finished && c->kind == HC_GENERATE) s_send_simple(b, c->sock, MSG_CANCEL, c->id);
            herr_t e;
            herr_set(&e, 503, "server_error", NULL, "service_unavailable", "strata-http is stopping");
            s_fail(b, c, &e);
        }
    pthread_mutex_unlock(&b->mu);
}

void bridge_destroy(bridge_t *b)
{
    if (!b) return;
    bridge_shutdown(b);
    for (int i = 0; i < b->n_socks; i++)
        if (b->socks[i]) zmq_close(b->socks[i]);
    if (b->zctx) zmq_ctx_term(b->zctx);
    if (b->efd >= 0) close(b->efd);
    free(b->hash);
    free(b->cancels);
    free(b->cancel_socks);
    free(b->watch);
    free(b->watch_ids);
    msg_buf_free(&b->buf);
    explicit_bzero(b->curve_sec, sizeof b->curve_sec);
    pthread_mutex_destroy(&b->mu);
    free(b);
}
