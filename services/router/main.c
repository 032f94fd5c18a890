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
    int rc = service_init(argc, argv, "router", s_usage, &cfg, NULL);
    if (rc != SERVICE_RUN) return rc;
    volatile sig_atomic_t *stop = service_signals();
    router_t *r = NULL;
    strata_errbuf_t eb = {{0}};
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
