/* cmd_down.c - `strata down`: SIGTERM the group's launcher and wait until it is gone. */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/config.h"
#include "services/strata/cmd.h"
#include "services/strata/group_state.h"

static void s_help(FILE *f)
{
    fprintf(f,
            "usage: strata down [--config FILE | --demo [--run-dir DIR]] [--timeout SECONDS]\n\n"
            "Send SIGTERM to the group's launcher (`strata up`), which stops every service and\n"
            "removes the group's shm segments and socket files, and wait until it has exited.\n\n"
            "  --config FILE     the group's config; without it or --demo, the one group this user\n"
            "                    runs (see strata status --help; with several it lists them, exit 2)\n"
            "  --demo            the demo group (run dir /tmp/strata-demo, or --run-dir DIR)\n"
            "  --timeout S       seconds to wait (default 10)\n"
            "  -h, --help        this help\n\n"
            "Exit codes: 0 stopped (or was not running), 1 still running after the timeout,\n"
            "2 bad config or usage.\n");
}

int cmd_down(int argc, char **argv)
{
    gs_target_t tg = {0};
    double timeout = 10;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            s_help(stdout);
            return 0;
        } else if (gs_target_opt(&tg, argc, argv, &i)) {
            continue;
        } else if (i + 1 < argc && !strcmp(argv[i], "--timeout")) {
            char *end;
            timeout = strtod(argv[++i], &end);
            if (*end || timeout <= 0 || timeout > 3600) {
                fprintf(stderr, "strata down: --timeout '%s' is not a number of seconds\n", argv[i]);
                return 2;
            }
        } else {
            fprintf(stderr, "strata down: unknown or incomplete option '%s'\n", argv[i]);
            s_help(stderr);
            return 2;
        }
    }
    char rd[PATH_MAX];
    int rc = gs_target_run_dir(&tg, "down", rd, sizeof rd);
    if (rc) return rc;
    gs_state_t *st = calloc(1, sizeof *st);
    if (!st) return 1;
    if (!gs_locked(rd) || gs_read(rd, st, NULL) < 0 || st->launcher_pid <= 0) {
        printf("strata down: no group running in %s\n", rd);
        free(st);
        return 0;
    }
    pid_t pid = st->launcher_pid;
    free(st);
    if (kill(pid, SIGTERM) < 0) {
        fprintf(stderr, "strata down: kill %d: %s\n", (int)pid, strerror(errno));
        return 1;
    }
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        if (!gs_locked(rd)) {
            clock_gettime(CLOCK_MONOTONIC, &t);
            printf("strata down: group stopped in %.2f s\n", (t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) * 1e-9);
            return 0;
        }
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) * 1e-9 > timeout) break;
        usleep(20000);
    }
    fprintf(stderr, "strata down: launcher %d still running after %.0f s\n", (int)pid, timeout);
    return 1;
}
