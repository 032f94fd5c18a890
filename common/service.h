/* service.h - what every strata-* service process (services/NAME/main.c) shares.
 *
 *   - The exit-code convention the launcher and systemd units act on: 0 clean stop, 1 runtime
 *     failure (restart me), 2 bad config, usage or model (do not restart).
 *   - The command line `--config FILE` / `--help` and loading the group config.
 *   - A stop flag: SIGTERM and SIGINT only set it (the main loop checks it); SIGPIPE is ignored.
 *   - The end of the main loop: STOPPING=1 to the supervisor, then one log line.
 * READY=1 and the watchdog pings stay in each service's loop (common/notify.h): only the
 * service knows when it serves.
 */
#ifndef STRATA_SERVICE_H
#define STRATA_SERVICE_H

#include <signal.h>
#include <stdio.h>

#include "common/config.h"

enum {
    SERVICE_RUN = -1,         /* service_init: no exit yet, the service runs */
    SERVICE_EXIT_OK = 0,      /* clean stop */
    SERVICE_EXIT_FAIL = 1,    /* runtime failure: the launcher restarts the service */
    SERVICE_EXIT_CONFIG = 2,  /* bad config, usage or model: restarting cannot help */
};

/* Set the log role, parse `--config FILE` / `--help` (usage(stdout) for --help, usage(stderr) on
 * bad usage) and load the config over config_defaults into *cfg, logging a config error as one
 * line. Returns SERVICE_RUN when the service should run, else the exit code for main:
 * SERVICE_EXIT_OK after --help, SERVICE_EXIT_CONFIG on bad usage or config. *config_path (if not NULL) gets FILE. */
int service_init(int argc, char **argv, const char *role, void (*usage)(FILE *f), strata_config_t *cfg,
                 const char **config_path);

/* Make SIGTERM and SIGINT set the returned stop flag (to 1) and ignore SIGPIPE. */
volatile sig_atomic_t *service_signals(void);

/* Exit code after zmq_bind / zmq_connect of a config endpoint failed with zmq_errno() err:
 * SERVICE_EXIT_CONFIG for an endpoint that can never work (EINVAL, EPROTONOSUPPORT, ENODEV),
 * else SERVICE_EXIT_FAIL. */
int service_endpoint_exit_code(int err);

/* The main loop ended on the stop flag: STOPPING=1 to the supervisor, then log "stopping". */
void service_stopping(void);

#endif
