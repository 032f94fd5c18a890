/* cmd_pin.c - `strata pin`: apply a cpu list and NUMA memory policy, then exec a program.
 *
 * This is how `strata up` pins its services. libuv's uv_spawn has no pre-exec hook, and two
 * of the three settings can only be made by the process itself before it runs: the NUMA
 * policy (set_mempolicy acts on the caller only) and the parent-death signal. Setting the
 * affinity from the launcher after spawning would race with the threads the service starts
 * (each thread keeps the mask it was created with). So the launcher spawns
 * `strata pin ... -- SERVICE ARGS`, which applies everything to itself and execs the service:
 * same pid, and the affinity, memory policy and parent-death signal all survive execve. It
 * works for any binary, and by hand or from supervisord too (see deploy/).
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "common/config.h"
#include "common/placement.h"
#include "services/strata/cmd.h"

static void s_help(FILE *f)
{
    fprintf(f,
            "usage: strata pin [--cpus LIST] [--numa N] [--parent PID] -- PROGRAM [ARGS...]\n"
            "       strata pin --config FILE --service NAME [--parent PID] -- PROGRAM [ARGS...]\n\n"
            "Pin this process to LIST (a cpulist like 0-3,8) and bind its memory to NUMA node N\n"
            "(set_mempolicy MPOL_BIND), then exec PROGRAM with ARGS. The pid stays the same.\n"
            "With --config and --service the cpus and numa_node come from that section of the group\n"
            "config (router, scheduler, executor or prefetcher.N): how systemd units and supervisord\n"
            "programs in deploy/ pin from the same file `strata up` reads.\n\n"
            "  --cpus LIST    cpus to run on; empty or absent: unchanged\n"
            "  --numa N       NUMA node for all memory; -1 or absent: unchanged\n"
            "  --config FILE  group config to read the placement from\n"
            "  --service NAME section whose cpus / numa_node apply\n"
            "  --parent PID   die with SIGTERM when PID (the launcher) exits; refuse to start if it\n"
            "                 already has\n"
            "  -h, --help     this help\n\n"
            "Exit codes: 2 bad placement or PROGRAM cannot be executed; otherwise PROGRAM's.\n");
}

int cmd_pin(int argc, char **argv)
{
    config_placement_t p = {.cpus = "", .numa_node = -1};
    long parent = 0;
    const char *config = NULL, *service = NULL;
    int i = 1;
    for (; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--")) {
            i++;
            break;
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            s_help(stdout);
            return 0;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "strata pin: %s needs a value\n", a);
            return 2;
        }
        const char *v = argv[++i];
        char *end;
        if (!strcmp(a, "--cpus")) {
            if (strlen(v) >= sizeof p.cpus) {
                fprintf(stderr, "strata pin: --cpus too long\n");
                return 2;
            }
            snprintf(p.cpus, sizeof p.cpus, "%s", v);
        } else if (!strcmp(a, "--numa")) {
            long n = strtol(v, &end, 10);
            if (*end || !*v || n < -1 || n > 1023) {
                fprintf(stderr, "strata pin: --numa '%s' is not a node number\n", v);
                return 2;
            }
            p.numa_node = (int)n;
        } else if (!strcmp(a, "--config")) {
            config = v;
        } else if (!strcmp(a, "--service")) {
            service = v;
        } else if (!strcmp(a, "--parent")) {
            parent = strtol(v, &end, 10);
            if (*end || !*v || parent <= 0) {
                fprintf(stderr, "strata pin: --parent '%s' is not a pid\n", v);
                return 2;
            }
        } else {
            fprintf(stderr, "strata pin: unknown option '%s'\n", a);
            s_help(stderr);
            return 2;
        }
    }
    if (i >= argc) {
        fprintf(stderr, "strata pin: no PROGRAM after --\n");
        return 2;
    }
    strata_errbuf_t eb = {{0}};
    if ((config != NULL) != (service != NULL)) {
        fprintf(stderr, "strata pin: --config and --service go together\n");
        return 2;
    }
    if (config) {
        static strata_config_t c;
        if (config_load(&c, config, &eb) < 0) {
            fprintf(stderr, "strata pin: %s\n", eb.msg);
            return 2;
        }
        const config_placement_t *q = NULL;
        if (!strcmp(service, "router")) q = &c.router.place;
        else if (!strcmp(service, "scheduler")) q = &c.scheduler.place;
        else if (!strcmp(service, "executor")) q = &c.executor.place;
        else if (!strcmp(service, "http") && c.http.enabled) q = &c.http.place;
        for (int k = 0; k < c.n_prefetchers && !q; k++) {
            char nm[32];
            snprintf(nm, sizeof nm, "prefetcher.%d", c.prefetcher[k].node);
            if (!strcmp(service, nm)) q = &c.prefetcher[k].place;
        }
        if (!q) {
            fprintf(stderr, "strata pin: %s: no service '%s' (router, scheduler, executor, prefetcher.N, http with an [http] section)\n", config, service);
            return 2;
        }
        p = *q;
    }
    if (placement_apply(&p, &eb) < 0) {
        fprintf(stderr, "strata pin: %s: %s\n", argv[i], eb.msg);
        return 2;
    }
    if (parent > 0) {
        /* The death signal is armed for our parent at this moment; if the launcher already
         * died we were reparented and would never get it, so check after arming. */
        if (prctl(PR_SET_PDEATHSIG, SIGTERM) < 0) {
            fprintf(stderr, "strata pin: prctl(PR_SET_PDEATHSIG): %s\n", strerror(errno));
            return 1;
        }
        if (getppid() != (pid_t)parent) {
            fprintf(stderr, "strata pin: launcher %ld is gone; not starting %s\n", parent, argv[i]);
            return 1;
        }
    }
    execvp(argv[i], argv + i);
    fprintf(stderr, "strata pin: exec %s: %s\n", argv[i], strerror(errno));
    return 2;
}
