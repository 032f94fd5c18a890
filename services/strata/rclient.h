/* rclient.h - a ZeroMQ client of a group's router for the strata commands that talk to it
 * (`strata client`, `strata chat`): one connection with a stable identity, generate requests
 * over it, and their answers as they stream (protocol: proto/PROTOCOL.md).
 *
 * The connection is watched (a ZeroMQ socket monitor). If it drops in the middle of an answer
 * (the router crashed) and comes back (the launcher restarted it), the request is resumed with
 * what the caller has, so the answer continues where it stopped (or ends with the router's
 * error, e.g. not_found). A router that is silent for resume_after seconds gets a resume on a
 * fresh connection; one that accepts no connection for gone_after seconds ends the request
 * with `unavailable`.
 *
 * A router that refuses the connection's ZeroMQ handshake (CURVE: this client's key not in its
 * curve_clients_file, a server key that is not its, or CURVE on one side only) is said so, with
 * the key files to check, once the handshake has failed for gone_after seconds.
 *
 * The options and CURVE keys of a router's client (rc_opt, rc_keys_env, rc_curve_read,
 * rc_curve_set) serve `strata bench --endpoint` too, whose sockets are its own. */
#ifndef STRATA_RCLIENT_H
#define STRATA_RCLIENT_H

#include <stdbool.h>
#include <stdint.h>

#include "common/config.h"
#include "proto/msg.h"
#include "services/strata/cli_util.h"

/* The router endpoint `strata up --demo` serves, where a client with no endpoint and no running
 * group of its user connects. */
#define RC_DEFAULT_ENDPOINT "tcp://127.0.0.1:7757"

typedef struct rc_conn rc_conn_t;

/* What one generate request asks. */
typedef struct {
    const char *prompt;            /* text, or NULL with tokens or messages */
    const int32_t *tokens;
    int32_t n_tokens;
    const char *messages;          /* chat: JSON text of an array of message objects, which the router
                                      renders with the model's chat template; or NULL */
    const char *template_vars;     /* chat: JSON text of an object of further template variables, or NULL */
    bool add_generation_prompt;    /* chat: passed to the template (a zeroed rc_req_t says false) */
    int64_t max_tokens;
    sampler_params_t sp;
    const char *const *stops;
    int n_stop;
    bool stream;
    float timeout_s, resume_after, gone_after;
} rc_req_t;

/* How its answer comes back: each token frame as it arrives (stream), then the done frame. */
typedef struct {
    void (*on_tokens)(void *ctx, const msg_tokens_t *t);
    void (*on_done)(void *ctx, const msg_done_t *d);
    void *ctx;
    /* NULL, or called with the router's error reply: true takes it over (rc_generate prints
     * nothing and still returns its exit code), false lets rc_generate print it. */
    bool (*on_error)(void *ctx, const msg_error_t *e);
} rc_cb_t;

/* The CURVE key files a command was given (--curve-server-key, --curve-client-key); NULL for
 * one not given, which STRATA_CURVE_SERVER_KEY / STRATA_CURVE_CLIENT_KEY may then name. */
typedef struct {
    const char *server_key;        /* the router's public key file (PREFIX.key of `strata keygen`) */
    const char *client_key;        /* this client's secret key file (PREFIX.secret) */
} rc_keys_t;

/* The options of the commands that talk to a router (`strata client`, `strata chat`,
 * `strata bench --endpoint`): where it listens, the CURVE key files, and the sampling flags of
 * the commands that take them. */
typedef struct {
    const char *endpoint;          /* --endpoint E, or NULL when not given */
    rc_keys_t keys;                /* --curve-server-key FILE, --curve-client-key FILE */
    sampler_params_t *sp;          /* where cli_sampling_opt's flags go; NULL: a command without them */
} rc_opts_t;

/* argv[*i] as --endpoint, --curve-server-key or --curve-client-key with its value (cli_opt's
 * forms), or with o->sp a sampling flag (cli_sampling_opt), into *o. Returns 1 (consumed: *i
 * past the value), 0 (none of them) or 2 (no value or a bad one; message printed). */
int rc_opt(const char *cmd, int argc, char **argv, int *i, rc_opts_t *o);

/* The key files k lacks, from STRATA_CURVE_SERVER_KEY and STRATA_CURVE_CLIENT_KEY (one unset or
 * empty names none): a flag wins over its variable. */
void rc_keys_env(rc_keys_t *k);

/* The CURVE keys of a connection, Z85: the router's public key and this client's keypair;
 * server[0] == 0 is plaintext. */
typedef struct {
    char server[CONFIG_CURVE_KEY_LEN + 1], pub[CONFIG_CURVE_KEY_LEN + 1], sec[CONFIG_CURVE_KEY_LEN + 1];
} rc_curve_t;

/* Read the router's public key file srv and this client's secret key file cli into *k, or with
 * cli NULL make a keypair now; srv_what and cli_what name the files in messages. Returns 0 or 2
 * (message printed). */
int rc_curve_read(const char *cmd, const char *srv, const char *srv_what, const char *cli, const char *cli_what,
                  rc_curve_t *k);
/* Set k's keys on a ZeroMQ socket before it connects; nothing for plaintext. Returns 0, or -1
 * (zmq_errno() says why). */
int rc_curve_set(void *sock, const rc_curve_t *k);

/* Connect to the router at endpoint; cmd names the strata command in messages; keys may be
 * NULL (the environment's, else a running group's own). *out NULL on failure (printed).
 * Returns 0, or the exit code (1 runtime, 2 a bad endpoint or key file). */
int rc_open(rc_conn_t **out, const char *cmd, const char *endpoint, const rc_keys_t *keys);

/* Usage lines for --curve-server-key and --curve-client-key (the commands' --help), and the
 * first lines of their note on a router that serves CURVE (each command ends its last
 * sentence: when a refusal is reported). */
extern const char rc_curve_help[], rc_curve_note[];
/* One request, to its end: 0, or the exit code after the printed error (1 timeout, busy,
 * unavailable; 2 a request the router refused as invalid). */
int rc_generate(rc_conn_t *c, const rc_req_t *q, const rc_cb_t *cb);
/* Safe on NULL. */
void rc_close(rc_conn_t *c);

#endif
