/* cmd_client.c - `strata client`: send one generate request to a router and stream the
 * answer's text to stdout (protocol: proto/PROTOCOL.md).
 *
 * The client has a stable identity and watches its connection (a ZeroMQ socket monitor). If
 * the connection drops in the middle of an answer (the router crashed) and comes back (the
 * launcher restarted it), the client sends `resume` with what it already has, so the answer
 * continues where it stopped (or ends with the router's error, e.g. not_found). A router
 * that is silent for --resume-after seconds gets a resume on a fresh connection; one that
 * accepts no connection for --gone-after seconds ends the command with `unavailable`. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>
#include <zmq.h>

#include "proto/msg.h"
#include "proto/zmsg.h"
#include "services/strata/cli_util.h"
#include "services/strata/group_state.h"

static const char *const C = "client";

#define DEFAULT_ENDPOINT "tcp://127.0.0.1:7757"

/* Without --endpoint: the router of the one group this user runs (group_state.h), else the
 * default. 0, or 2 when several run (listed) or the group's config no longer parses. */
static int s_find_endpoint(char *ep, size_t cap)
{
    gs_entry_t e;
    int r = gs_find_one(C, &e);
    if (r == 2) return 2;
    if (r < 0) return 0;
    strata_config_t *cfg = malloc(sizeof *cfg);
    strata_errbuf_t eb = {{0}};
    if (!cfg) return 1;
    r = config_load(cfg, e.config, &eb);
    if (r < 0) cli_error(C, "the running group '%s': %s", e.name, eb.msg);
    else snprintf(ep, cap, "%s", cfg->router.endpoint);
    free(cfg);
    return r < 0 ? 2 : 0;
}

static void s_help(FILE *f)
{
    fprintf(f,
            "usage: strata client [--endpoint E] (--prompt TEXT | --tokens IDS) [options]\n"
            "\n"
            "Send one request to a running group's router and stream the answer's text to stdout.\n"
            "Without --endpoint it is the router of the one group this user runs (the groups that\n"
            "`strata up` records; with several it lists them and exits 2), else the one\n"
            "`strata up --demo` serves.\n"
            "\n"
            "  --endpoint E        router endpoint (default " DEFAULT_ENDPOINT ")\n"
            "  --prompt TEXT       prompt text (tokenized by the router)\n"
            "  --tokens IDS        prompt token ids instead, separated by commas or spaces\n"
            "  --max-tokens N      tokens to generate (default 16)\n"
            "%s"
            "  --stop S            stop string (repeat for several; at most %d)\n"
            "  --ids               print the generated token ids (space-separated) instead of text\n"
            "  --no-stream         ask for one final answer instead of a stream\n"
            "  --stats             print finish reason, usage and timings on stderr\n"
            "  --timeout S         give up after S seconds in total (default 300)\n"
            "  --resume-after S    silence after which to reconnect and resume (default 5)\n"
            "  --gone-after S      give up when no router accepts the connection for S seconds (default 3)\n"
            "  -h, --help          this help\n"
            "\n"
            "Exit codes: 0 ok, 1 runtime failure (timeout, busy, unavailable), 2 bad input or usage\n"
            "(including a request the router refused as invalid).\n",
            cli_sampling_help, MSG_MAX_STOP);
}

typedef struct {
    void *ctx, *sock;
    void *mon;           /* PAIR receiving sock's monitor events */
    int n_mon;           /* monitors made so far (each needs its own inproc name) */
    char endpoint[512];
    uint8_t identity[24];
    size_t identity_len;
    bool connected;
    bool was_lost;       /* the connection dropped since it was last up */
    bool back;           /* ... and came back: a stream in progress must resume */
    double down_since;   /* 0 while connected */
} conn_t;

static void s_close(conn_t *c)
{
    if (c->sock) {
        zmq_socket_monitor(c->sock, NULL, 0);
        zmq_close(c->sock);
    }
    if (c->mon) zmq_close(c->mon);
    c->sock = c->mon = NULL;
}

/* Apply pending monitor events (each: a frame with uint16 event + uint32 value, then one
 * with the endpoint). */
static void s_events(conn_t *c)
{
    for (;;) {
        zmq_msg_t f;
        zmq_msg_init(&f);
        if (zmq_msg_recv(&f, c->mon, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&f);
            return;
        }
        uint16_t ev = 0;
        if (zmq_msg_size(&f) >= 2) memcpy(&ev, zmq_msg_data(&f), 2);
        while (zmq_msg_more(&f)) {
            zmq_msg_close(&f);
            zmq_msg_init(&f);
            if (zmq_msg_recv(&f, c->mon, 0) < 0) break;
        }
        zmq_msg_close(&f);
        if (ev == ZMQ_EVENT_CONNECTED) {
            c->connected = true;
            c->down_since = 0;
            if (c->was_lost) {
                c->was_lost = false;
                c->back = true;
            }
        } else if (ev == ZMQ_EVENT_DISCONNECTED) {
            c->connected = false;
            c->was_lost = true;
            c->down_since = strata_now();
        }
    }
}

static int s_connect(conn_t *c)
{
    s_close(c);
    c->sock = zmq_socket(c->ctx, ZMQ_DEALER);
    if (!c->sock) return STRATA_EZMQ;
    char mon_ep[64];
    snprintf(mon_ep, sizeof mon_ep, "inproc://client-monitor-%d", c->n_mon++);
    if (zmq_socket_monitor(c->sock, mon_ep, ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED) < 0 ||
        !(c->mon = zmq_socket(c->ctx, ZMQ_PAIR)) || zmq_connect(c->mon, mon_ep) < 0) {
        cli_error(C, "cannot monitor the connection: %s", zmq_strerror(zmq_errno()));
        return STRATA_EZMQ;
    }
    c->connected = c->was_lost = c->back = false;
    c->down_since = strata_now();
    int zero = 0, hb = 1000, hbt = 3000;
    zmq_setsockopt(c->sock, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(c->sock, ZMQ_ROUTING_ID, c->identity, c->identity_len);
    zmq_setsockopt(c->sock, ZMQ_HEARTBEAT_IVL, &hb, sizeof hb);
    zmq_setsockopt(c->sock, ZMQ_HEARTBEAT_TIMEOUT, &hbt, sizeof hbt);
    if (zmq_connect(c->sock, c->endpoint) < 0) {
        cli_error(C, "cannot connect to %s: %s", c->endpoint, zmq_strerror(zmq_errno()));
        return STRATA_EINVAL_INPUT;
    }
    return 0;
}

/* Exit code for an error reply: the request itself was bad (2) or the service could not
 * serve it now (1). */
static int s_error_exit(msg_errcode_t code)
{
    switch (code) {
    case MSG_E_BUSY: case MSG_E_UNAVAILABLE: case MSG_E_INTERNAL: case MSG_E_SHUTTING_DOWN: case MSG_E_NOT_FOUND:
        return 1;
    default: return 2;
    }
}

/* `strata client`; returns the exit code. */
int cmd_client(int argc, char **argv)
{
    const char *prompt = NULL, *tokens_arg = NULL, *v;
    const char *stops[MSG_MAX_STOP];
    int n_stop = 0;
    int64_t max_tokens = 16;
    float timeout_s = 300, resume_after = 5, gone_after = 3;
    bool ids = false, stream = true, stats = false;
    sampler_params_t sp;
    sampler_params_default(&sp);
    conn_t c = {0};
    msg_buf_t buf = {0};
    int32_t *tok = NULL, n_tok = 0;
    int rc = 0, r;
    snprintf(c.endpoint, sizeof c.endpoint, "%s", DEFAULT_ENDPOINT);
    bool endpoint_given = false;

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            s_help(stdout);
            return 0;
        }
        if ((r = cli_sampling_opt(C, argc, argv, &i, &sp))) {
            if (r == 2) return 2;
        } else if ((r = cli_opt(C, argc, argv, &i, "--endpoint", &v))) {
            if (r < 0) return 2;
            snprintf(c.endpoint, sizeof c.endpoint, "%s", v);
            endpoint_given = true;
        } else if ((r = cli_opt(C, argc, argv, &i, "--prompt", &v))) {
            if (r < 0) return 2;
            prompt = v;
        } else if ((r = cli_opt(C, argc, argv, &i, "--tokens", &v))) {
            if (r < 0) return 2;
            tokens_arg = v;
        } else if ((r = cli_opt(C, argc, argv, &i, "--max-tokens", &v))) {
            if (r < 0 || cli_parse_i64(C, "--max-tokens", v, 1, MSG_MAX_MAX_TOKENS, &max_tokens)) return 2;
        } else if ((r = cli_opt(C, argc, argv, &i, "--stop", &v))) {
            if (r < 0) return 2;
            if (n_stop == MSG_MAX_STOP || !v[0] || strlen(v) > MSG_MAX_STOP_LEN) {
                cli_error(C, "--stop: at most %d non-empty strings of at most %d bytes", MSG_MAX_STOP, MSG_MAX_STOP_LEN);
                return 2;
            }
            stops[n_stop++] = v;
        } else if ((r = cli_opt(C, argc, argv, &i, "--timeout", &v))) {
            if (r < 0 || cli_parse_f32(C, "--timeout", v, 0.1f, 1e6f, &timeout_s)) return 2;
        } else if ((r = cli_opt(C, argc, argv, &i, "--resume-after", &v))) {
            if (r < 0 || cli_parse_f32(C, "--resume-after", v, 0.1f, 1e6f, &resume_after)) return 2;
        } else if ((r = cli_opt(C, argc, argv, &i, "--gone-after", &v))) {
            if (r < 0 || cli_parse_f32(C, "--gone-after", v, 0.1f, 1e6f, &gone_after)) return 2;
        } else if (!strcmp(argv[i], "--ids")) {
            ids = true;
        } else if (!strcmp(argv[i], "--no-stream")) {
            stream = false;
        } else if (!strcmp(argv[i], "--stats")) {
            stats = true;
        } else {
            cli_error(C, "unexpected argument '%s' (see --help)", argv[i]);
            return 2;
        }
    }
    if (!prompt == !tokens_arg) {
        cli_error(C, "give exactly one of --prompt and --tokens (see --help)");
        return 2;
    }
    if (tokens_arg && (rc = cli_parse_tokens(C, "--tokens", tokens_arg, &tok, &n_tok))) return rc;
    if (!endpoint_given && (rc = s_find_endpoint(c.endpoint, sizeof c.endpoint))) {
        free(tok);
        return rc;
    }

    /* a stable identity: printable, never starting with a zero byte */
    uint8_t rnd[8] = {0};
    if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) {
        uint64_t t = strata_now_ns() ^ (uint64_t)getpid();
        memcpy(rnd, &t, 8);
    }
    c.identity_len = (size_t)snprintf((char *)c.identity, sizeof c.identity, "cli-%02x%02x%02x%02x%02x%02x%02x%02x",
                                      rnd[0], rnd[1], rnd[2], rnd[3], rnd[4], rnd[5], rnd[6], rnd[7]);
    c.ctx = zmq_ctx_new();
    if (!c.ctx) {
        cli_error(C, "zmq_ctx_new failed");
        rc = 1;
        goto done;
    }
    if (s_connect(&c) < 0) {
        rc = 2;
        goto done;
    }

    msg_str_t stop_s[MSG_MAX_STOP];
    for (int i = 0; i < n_stop; i++) stop_s[i] = msg_str(stops[i]);
    uint64_t rid = ((uint64_t)rnd[0] << 24 | (uint64_t)rnd[1] << 16 | (uint64_t)rnd[2] << 8 | rnd[3]) + 1;
    msg_t m;
    msg_init(&m, MSG_GENERATE);
    m.has_id = true;
    m.id = rid;
    if (prompt) m.u.generate.prompt = msg_str(prompt);
    else {
        m.u.generate.tokens = tok;
        m.u.generate.n_tokens = n_tok;
    }
    m.u.generate.max_tokens = (int32_t)max_tokens;
    m.u.generate.samp.temperature = sp.temperature;
    m.u.generate.samp.top_p = sp.top_p;
    m.u.generate.samp.top_k = sp.top_k;
    m.u.generate.samp.seed = sp.seed;
    m.u.generate.ignore_eos = sp.ignore_eos;
    m.u.generate.stop = stop_s;
    m.u.generate.n_stop = n_stop;
    m.u.generate.stream = stream;
    if ((r = zmsg_send(c.sock, NULL, 0, &m, &buf, 0)) < 0) {
        cli_error(C, "cannot send the request: %s", strata_strerror(r));
        rc = r == STRATA_EINVAL_INPUT ? 2 : 1;
        goto done;
    }

    int64_t have_tokens = 0, have_text = 0;
    double t0 = strata_now(), last = t0;
    int tries = 0;
    for (;;) {
        double now = strata_now();
        if (now - t0 > timeout_s) {
            cli_error(C, "no complete answer within %.1f s", timeout_s);
            rc = 1;
            goto done;
        }
        zmq_pollitem_t it[2] = {{c.sock, 0, ZMQ_POLLIN, 0}, {c.mon, 0, ZMQ_POLLIN, 0}};
        int pr = zmq_poll(it, 2, 100);
        if (pr < 0 && zmq_errno() != EINTR) {
            cli_error(C, "zmq_poll: %s", zmq_strerror(zmq_errno()));
            rc = 1;
            goto done;
        }
        s_events(&c);
        if (c.down_since > 0 && strata_now() - c.down_since > gone_after) {
            if (have_tokens) printf("\n");
            cli_error(C, "unavailable: no router at %s (not reachable for %.1f s)", c.endpoint, gone_after);
            rc = 1;
            goto done;
        }
        bool back = c.back;
        c.back = false;
        if (back || !(it[0].revents & ZMQ_POLLIN)) {
            if (back || strata_now() - last > resume_after) {
                if (++tries > 10) {
                    cli_error(C, "the router at %s does not answer", c.endpoint);
                    rc = 1;
                    goto done;
                }
                /* The connection is back after a loss (the router restarted), or the router
                 * has been silent too long (then on a fresh connection): resume. */
                if (!back && s_connect(&c) < 0) { rc = 1; goto done; }
                msg_t rs;
                msg_init(&rs, MSG_RESUME);
                rs.has_id = true;
                rs.id = rid;
                rs.u.resume.from = have_tokens;
                rs.u.resume.text_from = have_text;
                rs.u.resume.stop = stop_s;
                rs.u.resume.n_stop = n_stop;
                rs.u.resume.stream = stream;
                zmsg_send(c.sock, NULL, 0, &rs, &buf, 0);
                last = strata_now();
            }
            continue;
        }
        msg_t in;
        msg_err_t err;
        r = zmsg_recv(c.sock, MSG_FAM_REPLY, &in, &err, ZMQ_DONTWAIT);
        if (r == -EAGAIN) continue;
        if (r < 0) {
            cli_error(C, "bad reply from the router: %s", err.text);
            msg_free(&in);
            rc = 1;
            goto done;
        }
        last = strata_now();
        c.down_since = 0; /* a reply proves the connection, whatever the monitor said */
        if (!in.has_id || in.id != rid) { /* not ours (cannot happen with a fresh identity) */
            msg_free(&in);
            continue;
        }
        if (in.type == MSG_TOKEN) {
            const msg_tokens_t *t = &in.u.tokens;
            if (ids) {
                for (int32_t i = 0; i < t->n_tokens; i++) printf("%s%d", t->index + i ? " " : "", t->tokens[i]);
            } else {
                fwrite(t->text.s, 1, t->text.len, stdout);
            }
            fflush(stdout);
            have_tokens = t->index + t->n_tokens;
            have_text += (int64_t)t->text.len;
            tries = 0;
        } else if (in.type == MSG_DONE) {
            const msg_done_t *d = &in.u.done;
            if (!stream) {
                if (ids)
                    for (int32_t i = 0; i < d->n_tokens; i++) printf("%s%d", i ? " " : "", d->tokens[i]);
                else if (d->text.s)
                    fwrite(d->text.s, 1, d->text.len, stdout);
            }
            printf("\n");
            fflush(stdout);
            if (stats)
                fprintf(stderr, "finish=%s prompt_tokens=%d completion_tokens=%d queue_ms=%.2f ttft_ms=%.2f total_ms=%.2f\n",
                        msg_finish_name(d->finish), d->prompt_tokens, d->completion_tokens, d->queue_ms, d->ttft_ms,
                        d->total_ms);
            msg_free(&in);
            break;
        } else if (in.type == MSG_ERROR) {
            if (have_tokens) printf("\n");
            cli_error(C, "%s: %.*s", msg_errcode_name(in.u.error.code), (int)in.u.error.message.len,
                      in.u.error.message.s);
            rc = s_error_exit(in.u.error.code);
            msg_free(&in);
            goto done;
        }
        msg_free(&in);
    }
done:
    free(tok);
    msg_buf_free(&buf);
    s_close(&c);
    if (c.ctx) zmq_ctx_term(c.ctx);
    return rc;
}
