/* http.h - strata-http's parts and what they share: the server (server.c: libmicrohttpd, the
 * OpenAI routes), the bridge (bridge.c: a worker thread holding ZeroMQ sockets to the router and
 * running one libmicrohttpd daemon) and the metrics page (metrics.c).
 *
 * [http] threads workers share one listening socket; each serves the connections it accepts from
 * start to end in its own thread, so a token from the router reaches its client's socket without
 * another thread hop, and the streams are spread over the workers.
 *
 * An HTTP request that needs the router becomes an hcall_t, shared by its connection and the
 * bridge, each holding a reference, under the bridge's one mutex. The connection encodes the
 * router message, hands the call over (bridge_submit) and suspends itself; the bridge sends it,
 * turns the router's events into the call's output (SSE chunks or the whole answer) and resumes
 * the connection whenever there is something for it. While a connection is suspended
 * libmicrohttpd does not watch its socket, so the bridge polls it and cancels the request
 * upstream when the client has gone. Nothing else is kept: the request state lives in the
 * router and the scheduler, and a killed strata-http loses only its open connections. */
#ifndef STRATA_HTTP_HTTP_H
#define STRATA_HTTP_HTTP_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/config.h"
#include "proto/msg.h"
#include "services/http/hreq.h"

struct MHD_Connection;
struct MHD_Daemon;
typedef struct bridge bridge_t;

typedef enum { HC_GENERATE = 0, HC_STATS } hcall_kind_t;

typedef struct hcall {
    struct hcall *next;           /* bridge: hash chain */
    struct hcall *qnext;          /* bridge: submit queue */
    int refs;                     /* the connection's and the bridge's */
    hcall_kind_t kind;
    uint64_t id;                  /* the request id towards the router (unique in this process) */
    int sock;                     /* which of the bridge's DEALER sockets carries it */
    /* set before bridge_submit, read-only after */
    msg_buf_t frame;              /* the encoded generate / stats message */
    hreq_kind_t api;
    bool stream, include_usage;
    bool logprobs;                /* return log-probabilities (hreq_t.logprobs) */
    bool tokens_as_ids;           /* ... naming each token "token_id:N" */
    int32_t top_logprobs;         /* ... with this many alternatives a token */
    char resp_id[40];             /* "chatcmpl-..." / "cmpl-..." */
    int64_t created;              /* unix seconds */
    char model[160];
    int n_stop;
    char *stop[MSG_MAX_STOP];     /* kept for a resume after a router restart */
    double deadline;              /* strata_now() past which it is canceled */
    /* state, under the bridge's mutex */
    bool queued;                  /* in the submit queue, which holds the bridge's reference until it is sent */
    bool closed;                  /* out of the bridge's open calls */
    bool sent, started, finished, failed, client_gone, suspended, watch_fd, role_sent;
    struct MHD_Connection *conn;
    int fd;                       /* the client's socket (to notice it closing while suspended) */
    herr_t err;                   /* failed: why */
    char *out;                    /* [out_len] output not yet taken: SSE bytes, or the whole answer */
    size_t out_len, out_off, out_cap;
    char *sse_head;               /* a text chunk's JSON up to its "text" / "delta" (s_text_chunk) */
    size_t sse_head_len;
    int64_t n_tokens;             /* generated tokens received */
    int64_t n_text;               /* bytes of text received */
    int64_t text_offset;          /* completions with logprobs: the next token's text_offset (code points) */
    int32_t prompt_tokens, completion_tokens;
    msg_finish_t finish;
    double t_submit, t_first;     /* strata_now() */
    /* HC_STATS: the reply */
    int n_stats;
    char **stat_names;            /* [n_stats] */
    double *stat_vals;            /* [n_stats] */
} hcall_t;

/* What the bridge last heard from the router (health and models, asked every half second). */
typedef struct {
    bool reachable;               /* a health reply within the last 3 s */
    bool ok;                      /* ... that said "ok" */
    char model[128];              /* the router's model name ("" before its first models reply) */
    int32_t vocab, max_context;
    double uptime_s;
} bridge_info_t;

/* Counters of the HTTP side, for /metrics (updated with relaxed atomics). */
enum { HM_R_CHAT = 0, HM_R_COMPLETIONS, HM_R_MODELS, HM_R_HEALTH, HM_R_METRICS, HM_R_OTHER, HM_N_ROUTES };
enum { HM_S_2XX = 0, HM_S_400, HM_S_401, HM_S_404, HM_S_405, HM_S_413, HM_S_415, HM_S_429, HM_S_500, HM_S_503, HM_S_504,
       HM_S_OTHER, HM_N_STATUS };
typedef struct {
    atomic_uint_fast64_t requests[HM_N_ROUTES][HM_N_STATUS];
    atomic_uint_fast64_t client_gone;     /* requests canceled because the client went away */
    atomic_uint_fast64_t timeouts;        /* requests canceled at request_timeout_s */
    atomic_uint_fast64_t prompt_tokens, completion_tokens;
    atomic_uint_fast64_t router_resumes;  /* requests resumed after a router restart */
    atomic_int open_connections;
    double t_start;
} hmetrics_t;

extern hmetrics_t g_hm;
extern const char *const g_hm_routes[HM_N_ROUTES];
extern const char *const g_hm_status[HM_N_STATUS];
int hm_status_index(int status);

/* ---- bridge.c ---- */

/* Create worker index's bridge for cfg (its [router] endpoint, [http] limits), for at most share
 * connections. */
int bridge_create(const strata_config_t *cfg, int index, int share, bridge_t **out, strata_errbuf_t *eb);
/* Start its thread, which runs the daemon d (server_daemon) as well. */
int bridge_start(bridge_t *b, struct MHD_Daemon *d, strata_errbuf_t *eb);
/* Stop the thread, cancel upstream and fail every call still open (their connections are
 * resumed, as MHD_stop_daemon requires); calls submitted after it fail at once. */
void bridge_shutdown(bridge_t *b);
/* bridge_shutdown, then free it (after server_stop: the server's callbacks use it). */
void bridge_destroy(bridge_t *b);
/* A new call of kind with one reference for the caller (and one the bridge takes at submit). */
hcall_t *hcall_new(hcall_kind_t kind);
/* Drop a reference (the bridge's mutex must NOT be held). */
void hcall_release(bridge_t *b, hcall_t *c);
/* Hand c over: the bridge sends c->frame. The caller's connection must be suspended in the same
 * critical section, so this takes conn and suspends it under the mutex. */
void bridge_submit(bridge_t *b, hcall_t *c, struct MHD_Connection *conn, int fd);
/* The connection is done with c (completed, or the client went away): cancel it upstream if it
 * is still running. */
void bridge_abandon(bridge_t *b, hcall_t *c);
/* The next request id. */
uint64_t bridge_next_id(bridge_t *b);
void bridge_info(bridge_t *b, bridge_info_t *out);
/* The bridge's thread ended on an error (the process should exit 1 and be restarted). */
bool bridge_dead(bridge_t *b);
void bridge_lock(bridge_t *b);
void bridge_unlock(bridge_t *b);
/* Under the lock: suspend the connection until the bridge has more for c. */
void bridge_suspend_locked(bridge_t *b, hcall_t *c);

/* ---- metrics.c ---- */

/* The Prometheus text page (version 0.0.4) from the router's stats (names[n], vals[n]), this
 * process's counters and the launcher's state file in run_dir. malloc'd, NULL out of memory. */
char *metrics_render(const strata_config_t *cfg, char *const *names, const double *vals, int n, const bridge_info_t *info);

/* ---- server.c ---- */

typedef struct hserver hserver_t;
/* Bind and listen on [http] host:port (non-blocking). 0, or <0 with eb: STRATA_EINVAL_INPUT for an
 * address that can never work (exit 2), other errors for one that may (a port in use). */
int server_listen(const strata_config_t *cfg, int *fd, strata_errbuf_t *eb);
/* A daemon on a duplicate of listen_fd for worker b, holding at most share connections; no thread
 * of its own (bridge_start runs it). */
int server_start(const strata_config_t *cfg, bridge_t *b, const char *api_key, int listen_fd, int share, hserver_t **out,
                 strata_errbuf_t *eb);
struct MHD_Daemon *server_daemon(const hserver_t *s);
void server_stop(hserver_t *s);

#endif
