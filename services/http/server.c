/* server.c - the HTTP side of strata-http: libmicrohttpd, the routes, authentication, limits.
 *
 * One libmicrohttpd daemon a worker ([http] threads of them), on duplicates of one listening
 * socket, each run by its worker's thread (bridge.c), with suspend/resume so that a connection
 * waiting for the router costs nothing. A request goes through the access handler three times at
 * most:
 *   1. headers only: the route, the method, the key, the content type and the declared length
 *      are checked (an error is answered at once, before the body is read);
 *   2. body chunks: copied while they fit max_body_bytes (the rest is counted and dropped: 413);
 *   3. the end of the body: parse, check, hand the call to the bridge and suspend; when the
 *      bridge resumes the connection the handler is called again and queues the answer: an
 *      error, the whole JSON, or a stream whose content reader takes the SSE bytes the bridge
 *      produces (and suspends the connection again while there are none).
 * Slow or stalled clients are closed after [http] timeout_s (MHD_OPTION_CONNECTION_TIMEOUT);
 * a worker refuses connections beyond its share of max_connections. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <microhttpd.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "services/http/http.h"

typedef enum { R_NONE = 0, R_CHAT, R_COMPLETIONS, R_MODELS, R_MODEL, R_HEALTH, R_METRICS } route_t;

struct hserver {
    const strata_config_t *cfg;
    bridge_t *b;
    struct MHD_Daemon *d;
    char key[256];                /* "" = no authentication */
};

typedef struct {
    hserver_t *s;
    route_t route;
    int mroute;                   /* HM_R_* */
    char *body;
    size_t len, cap, seen;        /* seen: body bytes received, kept or not */
    bool over;                    /* the body is over max_body_bytes */
    int phase;                    /* 0 reading, 1 handed to the bridge */
    hcall_t *call;
    char model_id[160];           /* R_MODEL: the id asked for */
} hconn_t;

const char *const g_hm_routes[HM_N_ROUTES] = {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics",
                                              "other"};
const char *const g_hm_status[HM_N_STATUS] = {"2xx", "400", "401", "404", "405", "413", "415", "429", "500", "503", "504", "other"};

int hm_status_index(int status)
{
    static const int codes[] = {0, 400, 401, 404, 405, 413, 415, 429, 500, 503, 504};
    if (status >= 200 && status < 300) return HM_S_2XX;
    for (int i = 1; i < (int)(sizeof codes / sizeof codes[0]); i++)
        if (codes[i] == status) return i;
    return HM_S_OTHER;
}

static void s_count(const hconn_t *h, int status)
{
    atomic_fetch_add_explicit(&g_hm.requests[h->mroute][hm_status_index(status)], 1, memory_order_relaxed);
}

/* ---- answers ---- */

static enum MHD_Result s_reply(struct MHD_Connection *conn, hconn_t *h, int status, const char *ctype, char *body)
{
    if (!body) {
        status = 500;
        body = strdup("{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,\"code\":null}}");
        if (!body) return MHD_NO;
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", ctype);
    if (status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    if (status == 405) {
        bool post = h->route == R_CHAT || h->route == R_COMPLETIONS;
        MHD_add_response_header(r, "Allow", post ? "POST" : "GET, HEAD");
    }
    enum MHD_Result ok = MHD_queue_response(conn, (unsigned)status, r);
    MHD_destroy_response(r);
    if (h) s_count(h, status);
    return ok;
}

static enum MHD_Result s_error(struct MHD_Connection *conn, hconn_t *h, const herr_t *e)
{
    return s_reply(conn, h, e->status, "application/json", herr_json(e));
}

static enum MHD_Result s_json(struct MHD_Connection *conn, hconn_t *h, int status, json_t *o)
{
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return s_reply(conn, h, status, "application/json", s);
}

/* ---- routes ---- */

static route_t s_route(const char *url, int *mroute, char *model_id, size_t cap)
{
    *mroute = HM_R_OTHER;
    if (!strcmp(url, "/v1/chat/completions")) return *mroute = HM_R_CHAT, R_CHAT;
    if (!strcmp(url, "/v1/completions")) return *mroute = HM_R_COMPLETIONS, R_COMPLETIONS;
    if (!strcmp(url, "/v1/models")) return *mroute = HM_R_MODELS, R_MODELS;
    if (!strncmp(url, "/v1/models/", 11) && url[11]) {
        snprintf(model_id, cap, "%s", url + 11);
        return *mroute = HM_R_MODELS, R_MODEL;
    }
    if (!strcmp(url, "/health")) return *mroute = HM_R_HEALTH, R_HEALTH;
    if (!strcmp(url, "/metrics")) return *mroute = HM_R_METRICS, R_METRICS;
    return R_NONE;
}

/* The model name clients see: [http] model_name, else the router's. */
static void s_served(const hserver_t *s, const bridge_info_t *in, char *out, size_t cap)
{
    snprintf(out, cap, "%s", s->cfg->http.model_name[0] ? s->cfg->http.model_name : in->model);
}

static bool s_key_ok(const hserver_t *s, struct MHD_Connection *conn)
{
    if (!s->key[0]) return true;
    const char *a = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
    if (!a || strncasecmp(a, "Bearer ", 7)) return false;
    a += 7;
    while (*a == ' ') a++;
    /* compare in time independent of where the first difference is */
    size_t la = strlen(a), lk = strlen(s->key);
    unsigned diff = la != lk;
    for (size_t i = 0; i < lk; i++) diff |= (unsigned)(unsigned char)s->key[i] ^ (unsigned)(unsigned char)(i < la ? a[i] : 0);
    return diff == 0;
}

static json_t *s_model_obj(const char *name, const bridge_info_t *in, int64_t created)
{
    return json_pack("{s:s, s:s, s:I, s:s, s:i}", "id", name, "object", "model", "created", (json_int_t)created, "owned_by", "strata",
                     "max_model_len", (json_int_t)in->max_context);
}

static enum MHD_Result s_models(struct MHD_Connection *conn, hconn_t *h)
{
    bridge_info_t in;
    bridge_info(h->s->b, &in);
    herr_t e;
    char name[160];
    s_served(h->s, &in, name, sizeof name);
    if (!in.model[0]) {
        herr_set(&e, 503, "server_error", NULL, "service_unavailable", "the router has not described its model yet; retry later");
        return s_error(conn, h, &e);
    }
    int64_t created = (int64_t)time(NULL) - (int64_t)in.uptime_s;
    if (h->route == R_MODEL) {
        if (strcmp(h->model_id, name)) {
            herr_set(&e, 404, "invalid_request_error", "model", "model_not_found", "The model '%.100s' does not exist", h->model_id);
            return s_error(conn, h, &e);
        }
        return s_json(conn, h, 200, s_model_obj(name, &in, created));
    }
    return s_json(conn, h, 200, json_pack("{s:s, s:[o]}", "object", "list", "data", s_model_obj(name, &in, created)));
}

static enum MHD_Result s_health(struct MHD_Connection *conn, hconn_t *h)
{
    bridge_info_t in;
    bridge_info(h->s->b, &in);
    if (in.ok) return s_json(conn, h, 200, json_pack("{s:s}", "status", "ok"));
    herr_t e;
    herr_set(&e, 503, "server_error", NULL, "service_unavailable", "%s",
             !in.reachable ? "the router does not answer" : "the group is not ready (the router does not hear from its scheduler)");
    return s_error(conn, h, &e);
}

static int s_conn_fd(struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

/* Start a stats call for /metrics. */
static enum MHD_Result s_metrics_start(struct MHD_Connection *conn, hconn_t *h)
{
    hcall_t *c = hcall_new(HC_STATS);
    herr_t e;
    if (!c) {
        herr_set(&e, 500, "server_error", NULL, NULL, "out of memory");
        return s_error(conn, h, &e);
    }
    c->id = bridge_next_id(h->s->b);
    c->deadline = strata_now() + 2.0;
    msg_t m;
    msg_init(&m, MSG_STATS);
    m.has_id = true;
    m.id = c->id;
    if (msg_encode(&m, &c->frame) < 0) {
        hcall_release(h->s->b, c);
        herr_set(&e, 500, "server_error", NULL, NULL, "cannot encode the stats request");
        return s_error(conn, h, &e);
    }
    h->call = c;
    h->phase = 1;
    bridge_submit(h->s->b, c, conn, s_conn_fd(conn));
    return MHD_YES;
}

static void s_rand_hex(char *out, size_t n)
{
    uint8_t r[16] = {0};
    if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) {
        uint64_t t = strata_now_ns();
        memcpy(r, &t, 8);
    }
    for (size_t i = 0; i < sizeof r && 2 * i + 2 < n; i++) snprintf(out + 2 * i, 3, "%02x", r[i]);
}

/* Parse, check and hand a generation to the bridge. */
static enum MHD_Result s_generate_start(struct MHD_Connection *conn, hconn_t *h)
{
    hserver_t *s = h->s;
    herr_t e;
    hreq_t q;
    hreq_kind_t kind = h->route == R_CHAT ? HREQ_CHAT : HREQ_COMPLETION;
    if (hreq_parse(kind, h->body ? h->body : "", h->len, &q, &e) < 0) return s_error(conn, h, &e);
    bridge_info_t in;
    bridge_info(s->b, &in);
    char name[160];
    s_served(s, &in, name, sizeof name);
    enum MHD_Result res;
    if (!in.reachable || !in.model[0]) {
        herr_set(&e, 503, "server_error", NULL, "service_unavailable", "the group is not ready; retry later");
        res = s_error(conn, h, &e);
        goto done;
    }
    if (q.model && strcmp(q.model, name)) {
        herr_set(&e, 404, "invalid_request_error", "model", "model_not_found", "The model '%.100s' does not exist (this server serves '%s')",
                 q.model, name);
        res = s_error(conn, h, &e);
        goto done;
    }
    hcall_t *c = hcall_new(HC_GENERATE);
    if (!c) goto nomem;
    c->id = bridge_next_id(s->b);
    c->api = kind;
    c->stream = q.stream;
    c->include_usage = q.include_usage;
    c->logprobs = q.logprobs;
    c->top_logprobs = q.top_logprobs;
    c->tokens_as_ids = q.tokens_as_ids;
    c->created = (int64_t)time(NULL);
    snprintf(c->model, sizeof c->model, "%s", name);
    char hex[40];
    s_rand_hex(hex, sizeof hex);
    snprintf(c->resp_id, sizeof c->resp_id, "%s-%.24s", kind == HREQ_CHAT ? "chatcmpl" : "cmpl", hex);
    c->deadline = strata_now() + s->cfg->http.request_timeout_s;
    msg_str_t stops[MSG_MAX_STOP];
    for (int i = 0; i < q.n_stop; i++) {
        stops[i] = msg_str(q.stop[i]);
        c->stop[i] = q.stop[i];
        q.stop[i] = NULL;
    }
    c->n_stop = q.n_stop;
    q.n_stop = 0;
    msg_t m;
    msg_init(&m, MSG_GENERATE);
    m.has_id = true;
    m.id = c->id;
    msg_generate_t *g = &m.u.generate;
    if (kind == HREQ_CHAT) {
        g->messages = msg_str(q.messages);
        g->template_vars = msg_str(q.template_vars);
        g->add_generation_prompt = q.add_generation_prompt;
    } else if (q.tokens) {
        g->tokens = q.tokens;
        g->n_tokens = q.n_tokens;
    } else {
        g->prompt = msg_str(q.prompt);
    }
    g->max_tokens = q.max_tokens;
    g->samp.temperature = q.temperature;
    g->samp.top_p = q.top_p;
    g->samp.top_k = q.top_k;
    if (q.has_seed) g->samp.seed = q.seed;
    else if (getrandom(&g->samp.seed, sizeof g->samp.seed, 0) != (ssize_t)sizeof g->samp.seed) g->samp.seed = strata_now_ns();
    g->stop = stops;
    g->n_stop = c->n_stop;
    g->stream = q.stream;
    g->ignore_eos = q.ignore_eos;
    g->logprobs = q.logprobs;
    g->top_logprobs = q.logprobs ? q.top_logprobs : 0;
    if (msg_encode(&m, &c->frame) < 0) {
        hcall_release(s->b, c);
        herr_set(&e, 400, "invalid_request_error", NULL, NULL, "the request cannot be sent to the router (a value out of its range)");
        res = s_error(conn, h, &e);
        goto done;
    }
    h->call = c;
    h->phase = 1;
    bridge_submit(s->b, c, conn, s_conn_fd(conn));
    res = MHD_YES;
    goto done;
nomem:
    herr_set(&e, 500, "server_error", NULL, NULL, "out of memory");
    res = s_error(conn, h, &e);
done:
    hreq_free(&q);
    return res;
}

/* SSE bytes for the stream: what the bridge has produced, or suspend until it has more. */
static ssize_t s_stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    hconn_t *h = cls;
    hcall_t *c = h->call;
    bridge_t *b = h->s->b;
    ssize_t n;
    bridge_lock(b);
    if (c->out_len > c->out_off) {
        size_t k = c->out_len - c->out_off;
        if (k > max) k = max;
        memcpy(buf, c->out + c->out_off, k);
        c->out_off += k;
        n = (ssize_t)k;
    } else if (c->client_gone) {
        n = MHD_CONTENT_READER_END_WITH_ERROR;
    } else if (c->finished) {
        n = MHD_CONTENT_READER_END_OF_STREAM;
    } else {
        bridge_suspend_locked(b, c);
        n = 0;
    }
    bridge_unlock(b);
    return n;
}

/* The bridge resumed the connection: answer with what the call has. */
static enum MHD_Result s_answer(struct MHD_Connection *conn, hconn_t *h)
{
    hcall_t *c = h->call;
    bridge_t *b = h->s->b;
    bridge_lock(b);
    if (c->client_gone) {
        bridge_unlock(b);
        return MHD_NO;
    }
    if (c->failed) {
        herr_t e = c->err;
        bridge_unlock(b);
        return s_error(conn, h, &e);
    }
    if (c->kind == HC_STATS) {
        if (!c->finished) {
            bridge_suspend_locked(b, c);
            bridge_unlock(b);
            return MHD_YES;
        }
        bridge_unlock(b);
        bridge_info_t in;
        bridge_info(b, &in);
        char *page = metrics_render(h->s->cfg, c->stat_names, c->stat_vals, c->n_stats, &in);
        return s_reply(conn, h, 200, "text/plain; version=0.0.4; charset=utf-8", page);
    }
    if (c->stream && (c->started || c->finished)) {
        bridge_unlock(b);
        struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, s_stream_read, h, NULL);
        if (!r) return MHD_NO;
        MHD_add_response_header(r, "Content-Type", "text/event-stream; charset=utf-8");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        MHD_add_response_header(r, "X-Accel-Buffering", "no");
        enum MHD_Result ok = MHD_queue_response(conn, 200, r);
        MHD_destroy_response(r);
        s_count(h, 200);
        return ok;
    }
    if (!c->stream && c->finished) {
        char *body = strndup(c->out ? c->out + c->out_off : "", c->out_len - c->out_off);
        bridge_unlock(b);
        return s_reply(conn, h, 200, "application/json", body);
    }
    bridge_suspend_locked(b, c); /* woken early: wait on */
    bridge_unlock(b);
    return MHD_YES;
}

static bool s_json_ctype(const char *ct)
{
    if (!ct) return true; /* none given: taken as JSON */
    while (*ct == ' ') ct++;
    size_t n = strcspn(ct, "; ");
    return n == 16 && !strncasecmp(ct, "application/json", 16);
}

static enum MHD_Result s_access(void *cls, struct MHD_Connection *conn, const char *url, const char *method, const char *version,
                                const char *upload_data, size_t *upload_data_size, void **con_cls)
{
    (void)version;
    hserver_t *s = cls;
    hconn_t *h = *con_cls;
    herr_t e;
    if (!h) {
        if (!(h = calloc(1, sizeof *h))) return MHD_NO;
        h->s = s;
        *con_cls = h;
        h->route = s_route(url, &h->mroute, h->model_id, sizeof h->model_id);
        bool post = !strcmp(method, "POST"), get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
        if (h->route == R_NONE) {
            herr_set(&e, 404, "invalid_request_error", NULL, "not_found", "no route %.16s %.200s (the API is under /v1: chat/completions, "
                     "completions, models; and /health, /metrics)", method, url);
            return s_error(conn, h, &e);
        }
        bool wants_post = h->route == R_CHAT || h->route == R_COMPLETIONS;
        if ((wants_post && !post) || (!wants_post && !get)) {
            herr_set(&e, 405, "invalid_request_error", NULL, "method_not_allowed", "%.16s is not allowed on %s (use %s)", method, url,
                     wants_post ? "POST" : "GET");
            return s_error(conn, h, &e);
        }
        if (h->route != R_HEALTH && h->route != R_METRICS && !s_key_ok(s, conn)) {
            bool given = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization") != NULL;
            herr_set(&e, 401, "invalid_request_error", NULL, "invalid_api_key", "%s",
                     given ? "Incorrect API key provided" : "You didn't provide an API key: send 'Authorization: Bearer KEY'");
            return s_error(conn, h, &e);
        }
        if (wants_post) {
            if (!s_json_ctype(MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Type"))) {
                herr_set(&e, 415, "invalid_request_error", NULL, "unsupported_media_type", "the body must be application/json, got '%.80s'",
                         MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Type"));
                return s_error(conn, h, &e);
            }
            const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Length");
            if (cl && strtoll(cl, NULL, 10) > s->cfg->http.max_body_bytes) {
                herr_set(&e, 413, "invalid_request_error", NULL, "request_too_large", "the body is %.24s bytes, more than [http] max_body_bytes = %lld",
                         cl, (long long)s->cfg->http.max_body_bytes);
                return s_error(conn, h, &e);
            }
        }
        return MHD_YES;
    }
    if (*upload_data_size > 0) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        h->seen += n;
        if (h->over || h->len + n > (size_t)s->cfg->http.max_body_bytes) {
            h->over = true;
            return MHD_YES;
        }
        if (h->cap - h->len < n + 1) {
            size_t cap = h->cap ? h->cap : 4096;
            while (cap - h->len < n + 1) cap *= 2;
            char *nb = realloc(h->body, cap);
            if (!nb) return MHD_NO;
            h->body = nb;
            h->cap = cap;
        }
        memcpy(h->body + h->len, upload_data, n);
        h->len += n;
        return MHD_YES;
    }
    if (h->phase == 1) return s_answer(conn, h);
    if (h->over) {
        herr_set(&e, 413, "invalid_request_error", NULL, "request_too_large", "the body is more than [http] max_body_bytes = %lld bytes",
                 (long long)s->cfg->http.max_body_bytes);
        return s_error(conn, h, &e);
    }
    switch (h->route) {
    case R_CHAT:
    case R_COMPLETIONS: return s_generate_start(conn, h);
    case R_MODELS:
    case R_MODEL: return s_models(conn, h);
    case R_HEALTH: return s_health(conn, h);
    case R_METRICS: return s_metrics_start(conn, h);
    default: break;
    }
    return MHD_NO;
}

static void s_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    (void)conn;
    (void)toe;
    hserver_t *s = cls;
    hconn_t *h = *con_cls;
    if (!h) return;
    *con_cls = NULL;
    if (h->call) {
        bridge_abandon(s->b, h->call);
        hcall_release(s->b, h->call);
    }
    free(h->body);
    free(h);
}

static void s_notify_conn(void *cls, struct MHD_Connection *conn, void **socket_context, enum MHD_ConnectionNotificationCode toe)
{
    (void)cls;
    (void)conn;
    (void)socket_context;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) atomic_fetch_add_explicit(&g_hm.open_connections, 1, memory_order_relaxed);
    else atomic_fetch_sub_explicit(&g_hm.open_connections, 1, memory_order_relaxed);
}

static void s_mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char buf[512];
    vsnprintf(buf, sizeof buf, fmt, ap);
    buf[strcspn(buf, "\n")] = 0;
    log_debug("libmicrohttpd: %s", buf);
}

int server_listen(const strata_config_t *cfg, int *fd_out, strata_errbuf_t *eb)
{
    char port[16];
    snprintf(port, sizeof port, "%d", cfg->http.port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE | AI_NUMERICSERV}, *res = NULL;
    int g = getaddrinfo(cfg->http.host, port, &hints, &res);
    if (g != 0) return strata_seterr(eb, STRATA_EINVAL_INPUT, "[http] host: cannot resolve '%s': %s", cfg->http.host, gai_strerror(g));
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        int err = errno;
        freeaddrinfo(res);
        return strata_seterr(eb, -err, "socket: %s", strerror(err));
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, res->ai_addr, res->ai_addrlen) < 0 || listen(fd, 1024) < 0) {
        int err = errno;
        close(fd);
        freeaddrinfo(res);
        /* an address this host does not have can never work; a port in use may free up */
        return strata_seterr(eb, err == EADDRNOTAVAIL || err == EACCES || err == EAFNOSUPPORT ? STRATA_EINVAL_INPUT : -err,
                             "cannot listen on [http] host %s port %d: %s", cfg->http.host, cfg->http.port, strerror(err));
    }
    freeaddrinfo(res);
    *fd_out = fd;
    return 0;
}

int server_start(const strata_config_t *cfg, bridge_t *b, const char *api_key, int listen_fd, int share, hserver_t **out,
                 strata_errbuf_t *eb)
{
    hserver_t *s = calloc(1, sizeof *s);
    if (!s) return STRATA_ENOMEM;
    s->cfg = cfg;
    s->b = b;
    snprintf(s->key, sizeof s->key, "%s", api_key ? api_key : "");
    /* each daemon closes the descriptor it was given: its own duplicate of the one socket */
    int fd = fcntl(listen_fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) {
        int err = errno;
        free(s);
        return strata_seterr(eb, -err, "dup of the listening socket: %s", strerror(err));
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    bool v6 = getsockname(fd, (struct sockaddr *)&ss, &sl) == 0 && ss.ss_family == AF_INET6;
    /* no thread of its own: the worker's loop runs it (bridge_start) */
    unsigned flags = MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    if (v6) flags |= MHD_USE_IPv6;
    s->d = MHD_start_daemon(flags, (uint16_t)cfg->http.port, NULL, NULL, s_access, s,
                            MHD_OPTION_LISTEN_SOCKET, (MHD_socket)fd,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)share,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)cfg->http.timeout_s,
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(64 * 1024),
                            MHD_OPTION_NOTIFY_COMPLETED, s_completed, s,
                            MHD_OPTION_NOTIFY_CONNECTION, s_notify_conn, s,
                            MHD_OPTION_EXTERNAL_LOGGER, s_mhd_log, s,
                            MHD_OPTION_END);
    if (!s->d) {
        close(fd);
        free(s);
        return strata_seterr(eb, STRATA_EIO, "libmicrohttpd did not start on %s port %d", cfg->http.host, cfg->http.port);
    }
    *out = s;
    return 0;
}

struct MHD_Daemon *server_daemon(const hserver_t *s) { return s->d; }

void server_stop(hserver_t *s)
{
    if (!s) return;
    /* the worker's thread has stopped and resumed every suspended connection
     * (bridge_shutdown runs first), as MHD_stop_daemon requires */
    if (s->d) MHD_stop_daemon(s->d);
    free(s);
}
