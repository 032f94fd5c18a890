/* router.h - the front door of the process group (see proto/PROTOCOL.md).
 *
 * One thread, one zmq_poll loop over three sockets:
 *   - a ROUTER socket bound at [router] endpoint for clients (DEALER, stable identities);
 *   - a DEALER socket (routing id "router") connected to the scheduler's ROUTER;
 *   - with CURVE, a REP socket at inproc://zeromq.zap.01 answering ZeroMQ's ZAP requests
 *     against the allow-list of client keys.
 * For each client request it validates the message against the schema and the config's
 * limits, tokenizes the prompt, submits it to the scheduler, and streams the scheduler's
 * tokens back as detokenized text with stop strings applied. The scheduler owns request
 * state; the router keeps only what it needs to stream, so a restarted router can serve a
 * `resume` from a client with the same identity.
 */
#ifndef STRATA_ROUTER_H
#define STRATA_ROUTER_H

#include <signal.h>
#include <stdbool.h>

#include "common/config.h"
#include "common/strata.h"

typedef struct router router_t;

/* Create the router from the config: loads the tokenizer if cfg->tokenizer names one (a
 * missing file leaves the router able to take token ids only), binds the client endpoint
 * and connects to the scheduler. Returns 0 and *out, or <0 with eb saying why. */
int router_create(const strata_config_t *cfg, router_t **out, strata_errbuf_t *eb);

/* Serve until *stop becomes non-zero; then answer in-flight clients with `shutting_down`,
 * cancel their requests at the scheduler, and return 0 (or <0 on a fatal socket error).
 * Calls notify_ready() once the scheduler has answered its hello (or after 5 s without), and
 * notify_watchdog() from the loop. */
int router_run(router_t *r, volatile sig_atomic_t *stop);

void router_destroy(router_t *r);

#endif
