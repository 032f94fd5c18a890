/* fake_service.c - a stand-in service for launcher tests (tests/group/test_launcher.py).
 *
 * It behaves like a strata service as far as the launcher can see: it takes --config FILE
 * [--node N], reports READY=1 / WATCHDOG=1 / STOPPING=1 through sd_notify, binds a unix
 * socket at its ipc:// endpoint from the config (so socket-file cleanup can be checked) and
 * exits 0 within 2 s of SIGTERM. Which service it plays comes from its file name
 * (strata-executor -> "executor"); tests symlink it under those names. What it does is set
 * per service by the environment variable STRATA_FAKE_<SERVICE> (e.g. STRATA_FAKE_EXECUTOR):
 *   ok          (default) ready after 50 ms, watchdog pings, clean stop on SIGTERM
 *   exit2       exit 2 at once (bad config: the launcher must not restart it)
 *   crash       exit 1 after 100 ms, before ready (restart loop)
 *   crash-once  like crash on the first start (marker file in run_dir), then ok
 *   noready     run without ever sending READY=1
 *   hang        ready, one watchdog ping, then never ping again (watchdog kill)
 *   ignore-term ready, but ignore SIGTERM (the launcher must SIGKILL it)
 * Each start appends "<pid> <monotonic seconds>\n" to run_dir/fake-<service>.starts.
 */
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>
#include <time.h>
#include <unistd.h>

#include "common/config.h"
#include "common/notify.h"

static volatile sig_atomic_t s_stop;
static void s_on_term(int sig)
{
    (void)sig;
    s_stop = 1;
}

int main(int argc, char **argv)
{
    const char *cfg_path = NULL;
    int node = -1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help")) {
            printf("usage: strata-SERVICE --config FILE [--node N]  (launcher test stand-in; see fake_service.c)\n");
            return 0;
        }
        if (!strcmp(argv[i], "--config") && i + 1 < argc) cfg_path = argv[++i];
        else if (!strcmp(argv[i], "--node") && i + 1 < argc) node = atoi(argv[++i]);
        else return 2;
    }
    const char *base = strrchr(argv[0], '/');
    base = base ? base + 1 : argv[0];
    const char *svc = strncmp(base, "strata-", 7) ? base : base + 7;
    char role[64], envname[64];
    snprintf(role, sizeof role, "fake-%s", svc);
    log_set_role(role);
    snprintf(envname, sizeof envname, "STRATA_FAKE_");
    for (size_t i = 0; svc[i] && i < 40; i++) {
        char ch = svc[i];
        envname[12 + i] = (char)(ch >= 'a' && ch <= 'z' ? ch - 32 : ch);
        envname[13 + i] = 0;
    }
    const char *mode = getenv(envname);
    if (!mode) mode = "ok";
    static strata_config_t c;
    strata_errbuf_t eb = {{0}};
    if (!cfg_path || config_load(&c, cfg_path, &eb) < 0) {
        log_error("%s", eb.msg);
        return 2;
    }
    char path[600];
    snprintf(path, sizeof path, "%s/fake-%s.starts", c.run_dir, svc);
    FILE *f = fopen(path, "a");
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    if (f) {
        fprintf(f, "%d %.6f\n", (int)getpid(), ts.tv_sec + ts.tv_nsec * 1e-9);
        fclose(f);
    }
    if (!strcmp(mode, "exit2")) {
        log_error("%s: pretending the config is bad", cfg_path);
        return 2;
    }
    if (!strcmp(mode, "crash-once")) {
        snprintf(path, sizeof path, "%s/fake-%s.crashed", c.run_dir, svc);
        if (access(path, F_OK) != 0) {
            FILE *m = fopen(path, "w");
            if (m) fclose(m);
            mode = "crash";
        } else {
            mode = "ok";
        }
    }
    if (!strcmp(mode, "crash")) {
        usleep(100000);
        return 1;
    }
    struct sigaction sa = {.sa_handler = s_on_term};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    if (strcmp(mode, "ignore-term")) sigaction(SIGTERM, &sa, NULL);
    else signal(SIGTERM, SIG_IGN);

    /* the ipc endpoint this service would bind */
    const char *ep = !strcmp(svc, "executor") ? c.executor.endpoint : !strcmp(svc, "scheduler") ? c.scheduler.endpoint
                     : !strcmp(svc, "router")  ? c.router.endpoint
                                               : NULL;
    for (int i = 0; !ep && i < c.n_prefetchers; i++)
        if (c.prefetcher[i].node == node) ep = c.prefetcher[i].endpoint;
    int sfd = -1;
    if (ep && !strncmp(ep, "ipc://", 6)) {
        struct sockaddr_un sa_un = {.sun_family = AF_UNIX};
        snprintf(sa_un.sun_path, sizeof sa_un.sun_path, "%s", ep + 6);
        unlink(sa_un.sun_path);
        sfd = socket(AF_UNIX, SOCK_STREAM, 0);
        if (sfd < 0 || bind(sfd, (struct sockaddr *)&sa_un, sizeof sa_un) < 0) log_warn("bind %s: %s", ep, strerror(errno));
    }
    usleep(50000);
    if (strcmp(mode, "noready")) notify_ready();
    if (!strcmp(mode, "hang")) {
        sd_notify(0, "WATCHDOG=1"); /* opt in to the watchdog once, then go silent */
        while (!s_stop) usleep(20000);
    }
    while (!s_stop) {
        usleep(20000);
        notify_watchdog();
    }
    notify_stopping();
    if (sfd >= 0) {
        close(sfd);
        unlink(ep + 6);
    }
    return 0;
}
