/* strata-router - the front door: clients over tcp, the scheduler over ipc (router.h).
 *
 * Exit codes (common/service.h): 0 clean stop, 1 runtime failure (restart me), 2 bad config or
 * usage. */
#include <malloc.h>
#include <stdio.h>

#include "common/config.h"
#include "common/service.h"
#include "common/strata.h"
#include "services/router/router.h"

static void s_usage(FILE *f)
{
    fprintf(f,
            "usage: strata-router --config FILE\n\n"
            "The process group's front door: takes client requests (ZeroMQ ROUTER at [router] endpoint,\n"
            "msgpack, see proto/PROTOCOL.md), validates and tokenizes them, forwards them to the scheduler\n"
            "([scheduler] endpoint) and streams the answers back.\n\n"
            "With [router] curve_secret_key_file (a secret key of `strata keygen`) the client endpoint\n"
            "is ZeroMQ CURVE; with curve_clients_file too, only the clients whose public keys it lists\n"
            "may connect. An endpoint that is not loopback needs curve_secret_key_file, unless\n"
            "[router] insecure = true (then every start logs a warning).\n\n"
            "  --config FILE   the group config (INI, common/config.h)\n"
            "  --help          this text\n\n"
            "Exit codes: 0 clean stop (SIGTERM/SIGINT), 1 runtime failure, 2 bad config or usage.\n");
}

int main(int argc, char **argv)
{
    /* One malloc arena for the process, set before any thread starts: ZeroMQ's I/O thread
     * then allocates its per-connection buffers from the main arena, which the router's heap
     * trim (s_trim in router.c) leaves at the same few MB after any connection churn;
     * with an arena of its own, what a trim could return varied by 2 MB from run to run. */
#ifdef __GLIBC__
    mallopt(M_ARENA_MAX, 1);
#endif
    static strata_config_t cfg;
    const char *cfg_path = NULL;
    int rc = service_init(argc, argv, "router", s_usage, &cfg, &cfg_path);
    if (rc != SERVICE_RUN) return rc;
    strata_errbuf_t eb = {{0}};
    bool loopback = true;
    if (config_check_router(&cfg, cfg_path, &loopback, &eb) < 0) {
        log_error("%s", eb.msg);
        return SERVICE_EXIT_CONFIG;
    }
    if (!loopback && !cfg.router.curve_secret_key_file[0])
        log_warn("[router] insecure = true: serving %s without CURVE to anyone who can reach it", cfg.router.endpoint);
    volatile sig_atomic_t *stop = service_signals();
    router_t *r = NULL;
    rc = router_create(&cfg, &r, &eb);
    if (rc < 0) {
        log_error("%s", eb.msg[0] ? eb.msg : strata_strerror(rc));
        /* a bad tokenizer file or a malformed endpoint is a config problem: do not restart */
        return rc == STRATA_EINVAL_INPUT || rc == STRATA_EFORMAT ? SERVICE_EXIT_CONFIG : SERVICE_EXIT_FAIL;
    }
    rc = router_run(r, stop);
    router_destroy(r);
    return rc < 0 ? SERVICE_EXIT_FAIL : SERVICE_EXIT_OK;
}
