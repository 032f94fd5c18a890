/* service.c - the service-process boilerplate (see service.h). */
#include "common/service.h"

#include <errno.h>
#include <getopt.h>
#include <string.h>

#include "common/notify.h"
#include "common/strata.h"

static volatile sig_atomic_t s_stop;

/* Only sets the flag: everything else happens in the main loop (async-signal safety). */
static void s_on_signal(int sig)
{
    (void)sig;
    s_stop = 1;
}

int service_init(int argc, char **argv, const char *role, void (*usage)(FILE *f), strata_config_t *cfg,
                 const char **config_path)
{
    static const struct option opts[] = {{"config", required_argument, 0, 'c'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    const char *config = NULL;
    int c;
    log_set_role(role);
    while ((c = getopt_long(argc, argv, "c:h", opts, NULL)) != -1) {
        if (c == 'c') {
            config = optarg;
        } else if (c == 'h') {
            usage(stdout);
            return SERVICE_EXIT_OK;
        } else {
            usage(stderr);
            return SERVICE_EXIT_CONFIG;
        }
    }
    if (!config || optind != argc) {
        usage(stderr);
        return SERVICE_EXIT_CONFIG;
    }
    strata_errbuf_t eb = {{0}};
    config_defaults(cfg);
    if (config_load(cfg, config, &eb) < 0) {
        log_error("%s", eb.msg);
        return SERVICE_EXIT_CONFIG;
    }
    if (config_path) *config_path = config;
    return SERVICE_RUN;
}

volatile sig_atomic_t *service_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = s_on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    return &s_stop;
}

int service_endpoint_exit_code(int err)
{
    return err == EINVAL || err == EPROTONOSUPPORT || err == ENODEV ? SERVICE_EXIT_CONFIG : SERVICE_EXIT_FAIL;
}

void service_stopping(void)
{
    notify_stopping();
    log_info("stopping");
}
