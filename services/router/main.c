/* strata-router - the front door: clients over tcp, the scheduler over ipc (router.h).
 *
 * Exit codes: 0 clean stop, 1 runtime failure (restart me), 2 bad config or usage. */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "common/config.h"
#include "common/strata.h"
#include "services/router/router.h"

static volatile sig_atomic_t s_stop;

static void s_on_signal(int sig)
{
    (void)sig;
    s_stop = 1;
}

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
    static const struct option opts[] = {{"config", required_argument, 0, 'c'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    const char *config = NULL;
    int c;
    log_set_role("router");
    while ((c = getopt_long(argc, argv, "c:h", opts, NULL)) != -1) {
        if (c == 'c') config = optarg;
        else if (c == 'h') {
            s_usage(stdout);
            return 0;
        } else {
            s_usage(stderr);
            return 2;
        }
    }
    if (!config || optind != argc) {
        s_usage(stderr);
        return 2;
    }
    static strata_config_t cfg;
    strata_errbuf_t eb = {{0}};
    config_defaults(&cfg);
    if (config_load(&cfg, config, &eb) < 0) {
        log_error("%s", eb.msg);
        return 2;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = s_on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    router_t *r = NULL;
    int rc = router_create(&cfg, &r, &eb);
    if (rc < 0) {
        log_error("%s", eb.msg[0] ? eb.msg : strata_strerror(rc));
        /* a bad tokenizer file or a malformed endpoint is a config problem: do not restart */
        return rc == STRATA_EINVAL_INPUT || rc == STRATA_EFORMAT ? 2 : 1;
    }
    rc = router_run(r, &s_stop);
    router_destroy(r);
    return rc < 0 ? 1 : 0;
}
