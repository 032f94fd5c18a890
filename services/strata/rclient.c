/* rclient.c - a client connection to a group's router (see rclient.h). */
#include "services/strata/rclient.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>
#include <zmq.h>

#include "common/config.h"
#include "proto/zmsg.h"
#include "services/strata/group_state.h"

struct rc_conn {
    void *ctx, *sock;
    void *mon;           /* PAIR receiving sock's monitor events */
    int n_mon;           /* monitors made so far (each needs its own inproc name) */
    const char *cmd;     /* the strata command, for messages */
    char endpoint[512];
    rc_curve_t curve;    /* its CURVE keys (s_curve_keys) */
    uint8_t identity[24];
    size_t identity_len;
    const char *srv_from, *cli_from; /* where the CURVE keys came from: a flag or a variable, for messages */
    bool connected;
    bool hs_ok;          /* a handshake has succeeded on this socket (ZMQ_EVENT_HANDSHAKE_SUCCEEDED) */
    double hs_fail_since; /* strata_now() of the first failed handshake since the last success, 0 = none */
    char hs_why[1024];   /* ... and what the last one said */
    bool was_lost;       /* the connection dropped since it was last up */
    bool back;           /* ... and came back: a stream in progress must resume */
    double down_since;   /* 0 while connected */
    msg_buf_t buf;
    uint64_t next_id;    /* the next request's id */
};

static void s_close_socks(rc_conn_t *c)
{
    if (c->sock) {
        zmq_socket_monitor(c->sock, NULL, 0);
        zmq_close(c->sock);
    }
    if (c->mon) zmq_close(c->mon);
    c->sock = c->mon = NULL;
}

const char rc_curve_help[] =
    "  --curve-server-key FILE  the router's CURVE public key file (PREFIX.key of `strata keygen`), for a\n"
    "                      router with [router] curve_secret_key_file (default: $STRATA_CURVE_SERVER_KEY)\n"
    "  --curve-client-key FILE  this client's CURVE secret key file (PREFIX.secret, mode 0600), whose public\n"
    "                      key the router's curve_clients_file lists (default: $STRATA_CURVE_CLIENT_KEY;\n"
    "                      without either, a keypair made for this run, which such a router refuses)\n";

const char rc_curve_note[] =
    "A router that serves CURVE (a non-loopback endpoint): its public key and this client's\n"
    "secret key file, from `strata keygen`, by --curve-server-key and --curve-client-key (or\n"
    "STRATA_CURVE_SERVER_KEY and STRATA_CURVE_CLIENT_KEY; a flag wins over its variable); a\n"
    "group of this user is found with its keys. A router that refuses the keys is reported,\n";

int rc_opt(const char *cmd, int argc, char **argv, int *i, rc_opts_t *o)
{
    static const char *const names[] = {"--endpoint", "--curve-server-key", "--curve-client-key"};
    const char **const dst[] = {&o->endpoint, &o->keys.server_key, &o->keys.client_key};
    if (o->sp) {
        int r = cli_sampling_opt(cmd, argc, argv, i, o->sp);
        if (r) return r;
    }
    for (int k = 0; k < 3; k++) {
        int r = cli_opt(cmd, argc, argv, i, names[k], dst[k]);
        if (r) return r < 0 ? 2 : 1;
    }
    return 0;
}

void rc_keys_env(rc_keys_t *k)
{
    const char *srv = getenv("STRATA_CURVE_SERVER_KEY"), *cli = getenv("STRATA_CURVE_CLIENT_KEY");
    if (!k->server_key && srv && *srv) k->server_key = srv;
    if (!k->client_key && cli && *cli) k->client_key = cli;
}

int rc_curve_read(const char *cmd, const char *srv, const char *srv_what, const char *cli, const char *cli_what,
                  rc_curve_t *k)
{
    strata_errbuf_t eb = {{0}};
    if (config_read_curve_key(srv, false, srv_what, k->server, &eb) < 0 ||
        (cli && config_read_curve_key(cli, true, cli_what, k->sec, &eb) < 0)) {
        cli_error(cmd, "%s", eb.msg);
        return 2;
    }
    if (cli ? zmq_curve_public(k->pub, k->sec) < 0 : zmq_curve_keypair(k->pub, k->sec) < 0) {
        cli_error(cmd, "CURVE keys: %s", zmq_strerror(zmq_errno()));
        return 2;
    }
    return 0;
}

int rc_curve_set(void *sock, const rc_curve_t *k)
{
    if (!k->server[0]) return 0;
    if (zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY, k->server, CONFIG_CURVE_KEY_LEN) < 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, k->pub, CONFIG_CURVE_KEY_LEN) < 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, k->sec, CONFIG_CURVE_KEY_LEN) < 0)
        return -1;
    return 0;
}

/* A failed handshake (a monitor event with its value): what to tell the user. */
static void s_handshake_failed(rc_conn_t *c, uint16_t ev, uint32_t val)
{
    const bool curve = c->curve.server[0] != 0;
    if (c->hs_fail_since == 0) c->hs_fail_since = strata_now();
    if (ev == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)
        snprintf(c->hs_why, sizeof c->hs_why,
                 "the router refused this client's CURVE key (ZAP status %u): its public key is not in the router's "
                 "[router] curve_clients_file; check %s",
                 (unsigned)val, c->cli_from ? c->cli_from : "--curve-client-key (none was given: a key made for this run was used)");
    else if (ev == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL && val == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)
        snprintf(c->hs_why, sizeof c->hs_why, "%s",
                 curve ? "the router does not serve CURVE, but this client was given CURVE keys"
                       : "the router serves CURVE: give its public key with --curve-server-key (and this client's secret key "
                         "with --curve-client-key)");
    else if (curve) /* the router could not read our HELLO: what a server key that is not its does */
        snprintf(c->hs_why, sizeof c->hs_why,
                 "the router closed the connection during the CURVE handshake: %s is not the public key of the router at %s, "
                 "or the router does not serve CURVE",
                 c->srv_from, c->endpoint);
    else
        snprintf(c->hs_why, sizeof c->hs_why, "the ZeroMQ handshake failed (%s 0x%08x)",
                 ev == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL ? "error" : "protocol error", (unsigned)val);
}

/* Apply pending monitor events (each: a frame with uint16 event + uint32 value, then one
 * with the endpoint). */
static void s_events(rc_conn_t *c)
{
    for (;;) {
        zmq_msg_t f;
        zmq_msg_init(&f);
        if (zmq_msg_recv(&f, c->mon, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&f);
            return;
        }
        uint16_t ev = 0;
        uint32_t val = 0;
        if (zmq_msg_size(&f) >= 2) memcpy(&ev, zmq_msg_data(&f), 2);
        if (zmq_msg_size(&f) >= 6) memcpy(&val, (const char *)zmq_msg_data(&f) + 2, 4);
        while (zmq_msg_more(&f)) {
            zmq_msg_close(&f);
            zmq_msg_init(&f);
            if (zmq_msg_recv(&f, c->mon, 0) < 0) break;
        }
        zmq_msg_close(&f);
        if (ev == ZMQ_EVENT_CONNECTED) {
            c->connected = true;
            c->down_since = 0;
        } else if (ev == ZMQ_EVENT_DISCONNECTED) {
            /* a CURVE connection dropped before its handshake succeeded: the router could not
             * read our HELLO, which is what a server key that is not its does */
            if (c->curve.server[0] && !c->hs_ok && c->hs_fail_since == 0) {
                c->hs_fail_since = strata_now();
                snprintf(c->hs_why, sizeof c->hs_why,
                         "the router closed the connection during the CURVE handshake: %s is not the public key of the router at "
                         "%s, or the router does not serve CURVE",
                         c->srv_from, c->endpoint);
            }
            c->connected = false;
            c->was_lost = true;
            c->down_since = strata_now();
        } else if (ev == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
            /* back only once the router took the handshake: a TCP connection it then refuses
             * (CURVE) is no connection to resume on */
            c->hs_ok = true;
            c->hs_fail_since = 0;
            if (c->was_lost) {
                c->was_lost = false;
                c->back = true;
            }
        } else if (ev == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH || ev == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL ||
                   ev == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) {
            s_handshake_failed(c, ev, val);
        }
    }
}

static int s_connect(rc_conn_t *c)
{
    s_close_socks(c);
    c->sock = zmq_socket(c->ctx, ZMQ_DEALER);
    if (!c->sock) return STRATA_EZMQ;
    char mon_ep[64];
    snprintf(mon_ep, sizeof mon_ep, "inproc://client-monitor-%d", c->n_mon++);
    const int events = ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_SUCCEEDED |
                       ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL;
    if (zmq_socket_monitor(c->sock, mon_ep, events) < 0 ||
        !(c->mon = zmq_socket(c->ctx, ZMQ_PAIR)) || zmq_connect(c->mon, mon_ep) < 0) {
        cli_error(c->cmd, "cannot monitor the connection: %s", zmq_strerror(zmq_errno()));
        return STRATA_EZMQ;
    }
    c->connected = c->was_lost = c->back = c->hs_ok = false;
    c->down_since = strata_now();
    int zero = 0, hb = 1000, hbt = 3000;
    zmq_setsockopt(c->sock, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(c->sock, ZMQ_ROUTING_ID, c->identity, c->identity_len);
    zmq_setsockopt(c->sock, ZMQ_HEARTBEAT_IVL, &hb, sizeof hb);
    zmq_setsockopt(c->sock, ZMQ_HEARTBEAT_TIMEOUT, &hbt, sizeof hbt);
    if (rc_curve_set(c->sock, &c->curve) < 0) {
        cli_error(c->cmd, "CURVE socket options: %s", zmq_strerror(zmq_errno()));
        return STRATA_EINVAL_INPUT;
    }
    if (zmq_connect(c->sock, c->endpoint) < 0) {
        cli_error(c->cmd, "cannot connect to %s: %s", c->endpoint, zmq_strerror(zmq_errno()));
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

/* The CURVE keys to connect with. The key files of --curve-server-key / --curve-client-key
 * (keys), each flag winning over its variable, STRATA_CURVE_SERVER_KEY (a file with the router's
 * public key, as `strata keygen` writes it) and STRATA_CURVE_CLIENT_KEY (this client's secret
 * key file; without any, a keypair made now, which a router with curve_clients_file refuses).
 * Else, from a group of this user's running at this endpoint with [router]
 * curve_secret_key_file: the router's own keypair, as the group's services connect. Else none.
 * 0, or the exit code after the printed error. */
static int s_curve_keys(rc_conn_t *c, const rc_keys_t *keys)
{
    rc_keys_t k = keys ? *keys : (rc_keys_t){NULL, NULL};
    c->srv_from = k.server_key ? "--curve-server-key" : "STRATA_CURVE_SERVER_KEY";
    const char *cli_from = k.client_key ? "--curve-client-key" : "STRATA_CURVE_CLIENT_KEY";
    rc_keys_env(&k);
    const char *srv = k.server_key, *cli = k.client_key && *k.client_key ? k.client_key : NULL;
    c->cli_from = cli ? cli_from : NULL;
    if (srv && *srv) return rc_curve_read(c->cmd, srv, c->srv_from, cli, c->cli_from, &c->curve);
    if (cli) {
        cli_error(c->cmd, "%s is given but not the router's public key file (--curve-server-key or STRATA_CURVE_SERVER_KEY)",
                  c->cli_from);
        return 2;
    }
    strata_errbuf_t eb = {{0}};
    gs_entry_t all[16];
    int n = gs_running(all, 16);
    strata_config_t *cfg = n > 0 ? malloc(sizeof *cfg) : NULL;
    int rc = 0;
    for (int i = 0; cfg && i < n && i < 16; i++) {
        if (config_load(cfg, all[i].config, &eb) < 0 || strcmp(cfg->router.endpoint, c->endpoint) ||
            !cfg->router.curve_secret_key_file[0])
            continue;
        if (config_read_curve_key(cfg->router.curve_secret_key_file, true, "[router] curve_secret_key_file", c->curve.sec, &eb) < 0 ||
            zmq_curve_public(c->curve.pub, c->curve.sec) < 0) {
            cli_error(c->cmd, "the running group '%s': %s", all[i].name, eb.msg[0] ? eb.msg : "not a CURVE secret key");
            rc = 2;
            break;
        }
        memcpy(c->curve.server, c->curve.pub, sizeof c->curve.server);
        c->srv_from = "the running group's [router] curve_secret_key_file";
        break;
    }
    free(cfg);
    return rc;
}

int rc_open(rc_conn_t **out, const char *cmd, const char *endpoint, const rc_keys_t *keys)
{
    *out = NULL;
    rc_conn_t *c = calloc(1, sizeof *c);
    if (!c) return 1;
    c->cmd = cmd;
    snprintf(c->endpoint, sizeof c->endpoint, "%s", endpoint);
    /* a stable identity: printable, never starting with a zero byte */
    uint8_t rnd[8] = {0};
    if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) {
        uint64_t t = strata_now_ns() ^ (uint64_t)getpid();
        memcpy(rnd, &t, 8);
    }
    c->identity_len = (size_t)snprintf((char *)c->identity, sizeof c->identity, "cli-%02x%02x%02x%02x%02x%02x%02x%02x",
                                       rnd[0], rnd[1], rnd[2], rnd[3], rnd[4], rnd[5], rnd[6], rnd[7]);
    c->next_id = ((uint64_t)rnd[0] << 24 | (uint64_t)rnd[1] << 16 | (uint64_t)rnd[2] << 8 | rnd[3]) + 1;
    int kr = s_curve_keys(c, keys);
    if (kr) {
        rc_close(c);
        return kr;
    }
    c->ctx = zmq_ctx_new();
    if (!c->ctx) {
        cli_error(cmd, "zmq_ctx_new failed");
        rc_close(c);
        return 1;
    }
    if (s_connect(c) < 0) {
        rc_close(c);
        return 2;
    }
    *out = c;
    return 0;
}

void rc_close(rc_conn_t *c)
{
    if (!c) return;
    s_close_socks(c);
    if (c->ctx) zmq_ctx_term(c->ctx);
    msg_buf_free(&c->buf);
    explicit_bzero(c->curve.sec, sizeof c->curve.sec);
    free(c);
}

int rc_generate(rc_conn_t *c, const rc_req_t *q, const rc_cb_t *cb)
{
    int rc = 0, r;
    msg_str_t stop_s[MSG_MAX_STOP];
    const int n_stop = q->n_stop < MSG_MAX_STOP ? q->n_stop : MSG_MAX_STOP;
    for (int i = 0; i < n_stop; i++) stop_s[i] = msg_str(q->stops[i]);
    const uint64_t rid = c->next_id++;
    const bool stream = q->stream;
    const float timeout_s = q->timeout_s, resume_after = q->resume_after, gone_after = q->gone_after;
    msg_t m;
    msg_init(&m, MSG_GENERATE);
    m.has_id = true;
    m.id = rid;
    if (q->messages) {
        m.u.generate.messages = msg_str(q->messages);
        if (q->template_vars) m.u.generate.template_vars = msg_str(q->template_vars);
        m.u.generate.add_generation_prompt = q->add_generation_prompt;
    } else if (q->prompt) m.u.generate.prompt = msg_str(q->prompt);
    else {
        m.u.generate.tokens = (int32_t *)q->tokens;
        m.u.generate.n_tokens = q->n_tokens;
    }
    m.u.generate.max_tokens = (int32_t)q->max_tokens;
    m.u.generate.samp.temperature = q->sp.temperature;
    m.u.generate.samp.top_p = q->sp.top_p;
    m.u.generate.samp.top_k = q->sp.top_k;
    m.u.generate.samp.seed = q->sp.seed;
    m.u.generate.ignore_eos = q->sp.ignore_eos;
    m.u.generate.stop = stop_s;
    m.u.generate.n_stop = n_stop;
    m.u.generate.stream = stream;
    if ((r = zmsg_send(c->sock, NULL, 0, &m, &c->buf, 0)) < 0) {
        cli_error(c->cmd, "cannot send the request: %s", strata_strerror(r));
        rc = r == STRATA_EINVAL_INPUT ? 2 : 1;
        goto done;
    }

    int64_t have_tokens = 0, have_text = 0;
    double t0 = strata_now(), last = t0;
    int tries = 0;
    for (;;) {
        double now = strata_now();
        if (now - t0 > timeout_s) {
            if (c->hs_fail_since > 0 && !c->hs_ok)
                cli_error(c->cmd, "no complete answer within %.1f s: %s", timeout_s, c->hs_why);
            else
                cli_error(c->cmd, "no complete answer within %.1f s", timeout_s);
            rc = 1;
            goto done;
        }
        zmq_pollitem_t it[2] = {{c->sock, 0, ZMQ_POLLIN, 0}, {c->mon, 0, ZMQ_POLLIN, 0}};
        int pr = zmq_poll(it, 2, 100);
        if (pr < 0 && zmq_errno() != EINTR) {
            cli_error(c->cmd, "zmq_poll: %s", zmq_strerror(zmq_errno()));
            rc = 1;
            goto done;
        }
        s_events(c);
        if (c->hs_fail_since > 0 && !c->hs_ok && strata_now() - c->hs_fail_since > gone_after) {
            if (have_tokens) printf("\n");
            cli_error(c->cmd, "timed out after %.1f s without a connection to the router at %s: %s", gone_after, c->endpoint,
                      c->hs_why);
            rc = 1;
            goto done;
        }
        if (c->down_since > 0 && strata_now() - c->down_since > gone_after) {
            if (have_tokens) printf("\n");
            cli_error(c->cmd, "unavailable: no router at %s (not reachable for %.1f s)", c->endpoint, gone_after);
            rc = 1;
            goto done;
        }
        bool back = c->back;
        c->back = false;
        if (back || !(it[0].revents & ZMQ_POLLIN)) {
            if (back || strata_now() - last > resume_after) {
                if (++tries > 10) {
                    cli_error(c->cmd, "the router at %s does not answer", c->endpoint);
                    rc = 1;
                    goto done;
                }
                /* The connection is back after a loss (the router restarted), or the router
                 * has been silent too long (then on a fresh connection): resume. */
                if (!back && s_connect(c) < 0) { rc = 1; goto done; }
                msg_t rs;
                msg_init(&rs, MSG_RESUME);
                rs.has_id = true;
                rs.id = rid;
                rs.u.resume.from = have_tokens;
                rs.u.resume.text_from = have_text;
                rs.u.resume.stop = stop_s;
                rs.u.resume.n_stop = n_stop;
                rs.u.resume.stream = stream;
                zmsg_send(c->sock, NULL, 0, &rs, &c->buf, 0);
                last = strata_now();
            }
            continue;
        }
        msg_t in;
        msg_err_t err;
        r = zmsg_recv(c->sock, MSG_FAM_REPLY, &in, &err, ZMQ_DONTWAIT);
        if (r == -EAGAIN) continue;
        if (r < 0) {
            cli_error(c->cmd, "bad reply from the router: %s", err.text);
            msg_free(&in);
            rc = 1;
            goto done;
        }
        last = strata_now();
        c->down_since = 0; /* a reply proves the connection, whatever the monitor said */
        if (!in.has_id || in.id != rid) { /* not ours (cannot happen with a fresh identity) */
            msg_free(&in);
            continue;
        }
        if (in.type == MSG_TOKEN) {
            const msg_tokens_t *t = &in.u.tokens;
            if (cb->on_tokens) cb->on_tokens(cb->ctx, t);
            have_tokens = t->index + t->n_tokens;
            have_text += (int64_t)t->text.len;
            tries = 0;
        } else if (in.type == MSG_DONE) {
            if (cb->on_done) cb->on_done(cb->ctx, &in.u.done);
            msg_free(&in);
            break;
        } else if (in.type == MSG_ERROR) {
            if (!cb->on_error || !cb->on_error(cb->ctx, &in.u.error)) {
                if (have_tokens) printf("\n");
                cli_error(c->cmd, "%s: %.*s", msg_errcode_name(in.u.error.code), (int)in.u.error.message.len,
                          in.u.error.message.s);
            }
            rc = s_error_exit(in.u.error.code);
            msg_free(&in);
            goto done;
        }
        msg_free(&in);
    }
done:
    return rc;
}
