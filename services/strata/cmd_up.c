/* cmd_up.c - `strata up`: the launcher of the process group (DESIGN.md "Processes").
 *
 * One libuv loop supervises the services:
 *   - start order: every prefetcher (in parallel), then the executor, the scheduler, the
 *     router and, when the config has an [http] section, strata-http; each stage starts once
 *     every service of the earlier stages reported READY=1.
 *   - each service runs as `strata pin --cpus C --numa N --parent LAUNCHER -- BIN --config F`
 *     (cmd_pin.c says why), so its affinity and memory policy are in place before its first
 *     instruction, and it gets SIGTERM if the launcher dies.
 *   - readiness is the sd_notify protocol: the launcher binds an abstract unix datagram socket
 *     with SO_PASSCRED and passes it as NOTIFY_SOCKET; the kernel stamps each datagram with the
 *     sender's pid, which names the service. The same binaries run under systemd Type=notify.
 *   - a service that exits while the group runs is restarted after a backoff that doubles
 *     from restart_backoff_ms up to restart_backoff_max_ms, and resets once the service has
 *     stayed ready for 10 s. Exit code 2 means bad config or usage: no restart, the group
 *     stops and `strata up` exits 1.
 *   - WATCHDOG_USEC is given to every service (launcher.watchdog_s). A service that has sent
 *     WATCHDOG=1 at least once and then stays silent for watchdog_s is killed and restarted.
 *     (Services that never send it are not watched: the watchdog is opt-in per service here,
 *     while systemd's WatchdogSec= applies to all.)
 *   - a prefetcher that comes back ready under a new token (common/shm.h) rebuilt its arena
 *     under a new name; the executor still maps the old one, so it is restarted to map the new.
 *   - SIGTERM/SIGINT/SIGHUP: TERM to every service, KILL to any left after STOP_GRACE_S, then
 *     remove the group's shm segments ("/strata-<group>-<token>-*", this user's only), their
 *     tokens and the ipc socket files, write the state "stopped" and exit 0. The whole stop
 *     fits in 5 s.
 * The run dir (made 0700 if absent) is refused with exit 2 unless this user owns it and no
 * other may write it: it holds the sockets, the state and the tokens that name the segments.
 * The state file run_dir/state.json (group_state.h) feeds `strata status`.
 *
 * Without --foreground the launcher detaches once the group is ready (or failed): the
 * command returns 0 with the group serving, and logs go to run_dir/launcher.log and
 * run_dir/logs/SERVICE.log. With --foreground everything logs to this terminal.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#include <uv.h>

#include "common/chat_template.h"
#include "common/config.h"
#include "common/notify.h"
#include "common/placement.h"
#include "common/service.h"
#include "common/shm.h"
#include "model/model.h"
#include "services/strata/cmd.h"
#include "services/strata/demo.h"
#include "services/strata/group_state.h"

#define STOP_GRACE_S 3.0       /* TERM -> KILL */
#define BACKOFF_RESET_S 10.0   /* ready this long: the next crash starts the backoff over */
#define TICK_MS 100

extern char **environ;

typedef enum { SV_IDLE = 0, SV_STARTING, SV_READY, SV_BACKOFF, SV_STOPPING, SV_EXITED, SV_FAILED } sv_state_t;
static const char *const s_sv_names[] = {"idle", "starting", "ready", "backoff", "stopping", "exited", "failed"};

typedef enum { G_STARTING = 0, G_RUNNING, G_STOPPING, G_STOPPED } g_state_t;
static const char *const s_g_names[] = {"starting", "running", "stopping", "stopped"};

struct launcher;

typedef struct {
    struct launcher *L;
    char name[32];              /* "prefetcher.0", "executor", "scheduler", "router", "http" */
    char exe[PATH_MAX];
    int stage;                  /* start order: 0 prefetchers, 1 executor, 2 scheduler, 3 router, 4 http */
    int node;                   /* prefetcher node, else -1 */
    config_placement_t place;
    uv_process_t proc;
    uv_timer_t timer;           /* backoff before a restart */
    bool running;               /* spawned and not yet exited */
    bool closing;               /* proc handle close pending */
    bool ever_ready;
    pid_t pid;
    sv_state_t state;
    int restarts;
    int backoff_ms;             /* delay before the next restart */
    double first_spawn_t, spawn_t, ready_t, last_wd_t; /* monotonic s */
    double spawn_unix, ready_unix;
    bool wd_seen;
    char last_exit[48];
    int log_fd;                 /* -1: inherit stderr */
    char ns[SHM_NS_MAX];        /* prefetcher: its namespace when it was last ready, "" before */
    bool recycle;               /* executor: stopped to map a rebuilt arena; start it again at once */
} svc_t;

typedef struct launcher {
    uv_loop_t loop;
    strata_config_t cfg;
    char config_path[PATH_MAX];
    char self_exe[PATH_MAX];
    char bin_dir[PATH_MAX];
    svc_t svc[GS_MAX_SVC];
    int n_svc;
    int stage;                  /* highest stage started */
    int last_stage;             /* the last stage: 3, or 4 with strata-http */
    g_state_t state;
    int exit_code;
    int notify_fd;
    char notify_addr[128];      /* "@strata-<group>-notify-<pid>" */
    uv_poll_t notify_poll;
    uv_signal_t sig[3];
    uv_timer_t tick;
    double stop_t;
    bool killed;
    double started_unix;
    int ready_pipe;             /* daemon mode: tells the waiting parent how start-up went; -1 */
    bool foreground;
    char **env;                 /* environment for services */
} launcher_t;

/* Copy src into dst[cap], truncating. */
static void s_cpy(char *dst, size_t cap, const char *src)
{
    size_t n = strlen(src);
    if (n >= cap) n = cap - 1;
    memcpy(dst, src, n);
    dst[n] = 0;
}

static void s_write_state(launcher_t *L)
{
    gs_state_t *st = calloc(1, sizeof *st);
    if (!st) return;
    snprintf(st->group, sizeof st->group, "%s", L->cfg.name);
    s_cpy(st->config, sizeof st->config, L->config_path);
    st->launcher_pid = getpid();
    snprintf(st->state, sizeof st->state, "%s", L->exit_code && L->state == G_STOPPED ? "failed" : s_g_names[L->state]);
    st->started_unix = L->started_unix;
    st->n = L->n_svc;
    for (int i = 0; i < L->n_svc; i++) {
        const svc_t *s = &L->svc[i];
        gs_service_t *g = &st->svc[i];
        snprintf(g->name, sizeof g->name, "%s", s->name);
        g->pid = s->running ? s->pid : 0;
        snprintf(g->state, sizeof g->state, "%s", s_sv_names[s->state]);
        g->started_unix = s->running ? s->spawn_unix : 0;
        g->ready_unix = s->state == SV_READY ? s->ready_unix : 0;
        g->restarts = s->restarts;
        snprintf(g->last_exit, sizeof g->last_exit, "%s", s->last_exit);
        s_cpy(g->exe, sizeof g->exe, s->exe);
    }
    int r = gs_write(L->cfg.run_dir, st);
    if (r < 0) log_warn("writing %s/state.json: %s", L->cfg.run_dir, strata_strerror(r));
    free(st);
}

/* Daemon mode: tell the parent waiting in `strata up` how the start went, once. */
/* To the waiting parent: ready, or failed with the exit code L->exit_code (2: a bad config or
 * model, which no restart fixes) and msg. */
static void s_report(launcher_t *L, bool ok, const char *msg)
{
    if (L->ready_pipe < 0) return;
    char buf[600];
    int n = snprintf(buf, sizeof buf, "%c%s", ok ? 'R' : L->exit_code == 2 ? 'C' : 'F', msg ? msg : "");
    (void)!write(L->ready_pipe, buf, (size_t)n);
    close(L->ready_pipe);
    L->ready_pipe = -1;
}

static void s_group_stop(launcher_t *L, int code, const char *why);
static void s_spawn(svc_t *s);

/* The last error line of service s's log (RUN_DIR/logs/NAME.log), its cause after "error: ",
 * into out; "" when there is none (a foreground group logs to the terminal). */
static void s_last_error(const launcher_t *L, const svc_t *s, char *out, size_t n)
{
    out[0] = 0;
    char path[PATH_MAX + 64], buf[8192];
    snprintf(path, sizeof path, "%s/logs/%s.log", L->cfg.run_dir, s->name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    off_t end = lseek(fd, 0, SEEK_END), at = end > (off_t)sizeof buf - 1 ? end - (off_t)sizeof buf + 1 : 0;
    ssize_t k = pread(fd, buf, sizeof buf - 1, at);
    close(fd);
    if (k <= 0) return;
    buf[k] = 0;
    for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) {
        const char *e = strstr(line, " error: ");
        if (e) snprintf(out, n, "%s", e + 8);
    }
}
static void s_on_backoff(uv_timer_t *t);

/* ---- start-up order ------------------------------------------------------------------ */

static void s_log_line(void *ctx, const char *text)
{
    (void)ctx;
    log_info("%s", text);
}

/* Start the next stage once every service of the stages so far is ready. */
static void s_advance(launcher_t *L)
{
    if (L->state != G_STARTING) return;
    for (;;) {
        for (int i = 0; i < L->n_svc; i++)
            if (L->svc[i].stage <= L->stage && L->svc[i].state != SV_READY) return;
        if (L->stage == L->last_stage) break;
        L->stage++;
        for (int i = 0; i < L->n_svc; i++)
            if (L->svc[i].stage == L->stage) s_spawn(&L->svc[i]);
    }
    L->state = G_RUNNING;
    s_write_state(L);
    log_info("group '%s' ready: %d services (strata status --config %s)", L->cfg.name, L->n_svc, L->config_path);
    gs_tiers(L->config_path, s_log_line, NULL); /* how the experts split across GPU, host memory and disk */
    notify_ready(); /* if strata up itself runs under systemd Type=notify */
    s_report(L, true, NULL);
}

/* ---- processes ----------------------------------------------------------------------- */

static void s_on_close(uv_handle_t *h)
{
    svc_t *s = h->data;
    s->closing = false;
}

static void s_on_exit(uv_process_t *p, int64_t status, int sig)
{
    svc_t *s = p->data;
    launcher_t *L = s->L;
    s->running = false;
    s->closing = true;
    uv_close((uv_handle_t *)p, s_on_close);
    if (sig) snprintf(s->last_exit, sizeof s->last_exit, "signal %d", sig);
    else snprintf(s->last_exit, sizeof s->last_exit, "exit %lld", (long long)status);
    double now = strata_now();

    if (L->state == G_STOPPING || L->state == G_STOPPED) {
        s->state = SV_EXITED;
        log_info("%s (pid %d) stopped: %s", s->name, (int)s->pid, s->last_exit);
        s_write_state(L);
        s_group_stop(L, L->exit_code, NULL); /* finishes once nothing runs */
        return;
    }
    if (!sig && status == SERVICE_EXIT_CONFIG) {
        s->state = SV_FAILED;
        log_error("%s (pid %d) exited with 2 (bad config or usage): not restarting it; see its log", s->name, (int)s->pid);
        char cause[400], why[512];
        s_last_error(L, s, cause, sizeof cause);
        snprintf(why, sizeof why, "%s exited with code 2 (bad config or usage)%s%s", s->name, cause[0] ? ": " : "", cause);
        s_group_stop(L, 2, why);
        return;
    }
    if (s->recycle) {
        s->recycle = false;
        s->state = SV_BACKOFF;
        log_info("%s (pid %d) stopped (%s) to map the rebuilt arena; starting it again", s->name, (int)s->pid, s->last_exit);
        s_write_state(L);
        uv_timer_start(&s->timer, s_on_backoff, 0, 0);
        return;
    }
    if (s->state == SV_READY && now - s->ready_t >= BACKOFF_RESET_S) s->backoff_ms = L->cfg.launcher.restart_backoff_ms;
    int delay = s->backoff_ms;
    s->backoff_ms = s->backoff_ms * 2 > L->cfg.launcher.restart_backoff_max_ms ? L->cfg.launcher.restart_backoff_max_ms : s->backoff_ms * 2;
    s->state = SV_BACKOFF;
    log_warn("%s (pid %d) died: %s; restarting in %d ms (restart %d)", s->name, (int)s->pid, s->last_exit, delay, s->restarts + 1);
    s_write_state(L);
    uv_timer_start(&s->timer, s_on_backoff, (uint64_t)delay, 0);
}

static void s_on_backoff(uv_timer_t *t)
{
    svc_t *s = t->data;
    if (s->L->state == G_STOPPING || s->L->state == G_STOPPED) return;
    if (s->closing) { /* the old handle is still closing: try again shortly */
        uv_timer_start(&s->timer, s_on_backoff, 10, 0);
        return;
    }
    s->restarts++;
    s_spawn(s);
}

static void s_spawn(svc_t *s)
{
    launcher_t *L = s->L;
    char numa[16], parent[16];
    snprintf(numa, sizeof numa, "%d", s->place.numa_node);
    snprintf(parent, sizeof parent, "%d", (int)getpid());
    char node[16];
    snprintf(node, sizeof node, "%d", s->node);
    char *args[20];
    int n = 0;
    args[n++] = L->self_exe;
    args[n++] = "pin";
    if (s->place.cpus[0]) {
        args[n++] = "--cpus";
        args[n++] = s->place.cpus;
    }
    if (s->place.numa_node >= 0) {
        args[n++] = "--numa";
        args[n++] = numa;
    }
    args[n++] = "--parent";
    args[n++] = parent;
    args[n++] = "--";
    args[n++] = s->exe;
    args[n++] = "--config";
    args[n++] = L->config_path;
    if (s->node >= 0) {
        args[n++] = "--node";
        args[n++] = node;
    }
    args[n] = NULL;

    uv_stdio_container_t io[3];
    io[0].flags = UV_IGNORE;
    for (int k = 1; k < 3; k++) {
        io[k].flags = UV_INHERIT_FD;
        io[k].data.fd = s->log_fd >= 0 ? s->log_fd : k;
    }
    uv_process_options_t o = {
        .exit_cb = s_on_exit,
        .file = L->self_exe,
        .args = args,
        .env = L->env,
        .stdio_count = 3,
        .stdio = io,
        /* own session: a terminal's Ctrl-C or hang-up reaches only the launcher, which then
         * stops the services in order instead of racing them (they still die with it:
         * strata pin --parent arms the parent-death signal) */
        .flags = UV_PROCESS_DETACHED,
    };
    s->proc.data = s;
    if (s->first_spawn_t == 0) s->first_spawn_t = strata_now();
    s->spawn_t = strata_now();
    s->spawn_unix = gs_now_unix();
    s->wd_seen = false;
    int r = uv_spawn(&L->loop, &s->proc, &o);
    if (r < 0) {
        /* the handle is initialised even on failure and must be closed */
        s->closing = true;
        uv_close((uv_handle_t *)&s->proc, s_on_close);
        log_error("spawn %s: %s", s->name, uv_strerror(r));
        s->state = SV_BACKOFF;
        snprintf(s->last_exit, sizeof s->last_exit, "spawn: %s", uv_err_name(r));
        uv_timer_start(&s->timer, s_on_backoff, (uint64_t)s->backoff_ms, 0);
        return;
    }
    s->running = true;
    s->pid = s->proc.pid;
    s->state = SV_STARTING;
    log_info("%s: started pid %d (cpus '%s', numa %d)%s", s->name, (int)s->pid, s->place.cpus, s->place.numa_node,
             s->restarts ? " [restart]" : "");
    s_write_state(L);
}

/* ---- notify socket ------------------------------------------------------------------- */

/* Prefetcher s is ready. If its token changed since it was last ready, it built its arena anew
 * under a new name (the old one was stale, half-filled or refused: services/prefetcher/main.c).
 * The executor's mappings are of the old segment: a second copy of the weights, and one nothing
 * checks any more (a refused one may be another user's to write). Restart the executor so that
 * it maps the new arena; the scheduler replays what was in flight, with the same tokens. */
static void s_on_prefetcher_ready(launcher_t *L, svc_t *s)
{
    char ns[SHM_NS_MAX];
    strata_errbuf_t eb = {{0}};
    if (shm_ns_read(ns, sizeof ns, L->cfg.run_dir, L->cfg.name, s->node, &eb) < 0) {
        log_warn("%s: its token: %s", s->name, eb.msg[0] ? eb.msg : "absent");
        return;
    }
    bool moved = s->ns[0] && strcmp(s->ns, ns);
    snprintf(s->ns, sizeof s->ns, "%s", ns);
    if (!moved) return;
    for (int i = 0; i < L->n_svc; i++) {
        svc_t *x = &L->svc[i];
        if (x->stage != 1 || !x->running || x->state == SV_STOPPING || x->recycle) continue;
        log_warn("%s rebuilt its arena under a new name (/strata-%s-arena-%d): restarting %s (pid %d), which maps the old one",
                 s->name, ns, s->node, x->name, (int)x->pid);
        x->recycle = true;
        uv_process_kill(&x->proc, SIGTERM);
    }
}

static void s_on_notify(uv_poll_t *h, int status, int events)
{
    launcher_t *L = h->data;
    notify_msg_t m;
    int r;
    while ((r = notify_server_recv(L->notify_fd, &m)) > 0) {
        svc_t *s = NULL;
        for (int i = 0; i < L->n_svc; i++)
            if (L->svc[i].running && L->svc[i].pid == m.pid) s = &L->svc[i];
        if (!s) {
            log_debug("notify from unknown pid %d ignored", (int)m.pid);
            continue;
        }
        double now = strata_now();
        if (m.watchdog) {
            s->wd_seen = true;
            s->last_wd_t = now;
        }
        if (m.status[0]) log_debug("%s status: %s", s->name, m.status);
        if (m.ready && s->state == SV_STARTING) {
            s->state = SV_READY;
            s->ever_ready = true;
            s->ready_t = now;
            s->last_wd_t = now;
            s->ready_unix = gs_now_unix();
            log_info("%s (pid %d) ready after %.0f ms", s->name, (int)s->pid, (now - s->spawn_t) * 1e3);
            s_write_state(L);
            if (s->node >= 0) s_on_prefetcher_ready(L, s);
            s_advance(L);
        }
        if (m.stopping && s->state != SV_STOPPING) {
            s->state = SV_STOPPING;
            s_write_state(L);
        }
    }
}

/* ---- tick: timeouts, watchdog, stop grace -------------------------------------------- */

static void s_on_tick(uv_timer_t *t)
{
    launcher_t *L = t->data;
    double now = strata_now();
    notify_watchdog();
    if (L->state == G_STOPPING) {
        if (!L->killed && now - L->stop_t >= STOP_GRACE_S) {
            L->killed = true;
            for (int i = 0; i < L->n_svc; i++)
                if (L->svc[i].running) {
                    log_warn("%s (pid %d) still running %.1f s after SIGTERM: SIGKILL", L->svc[i].name, (int)L->svc[i].pid, STOP_GRACE_S);
                    uv_process_kill(&L->svc[i].proc, SIGKILL);
                }
        }
        return;
    }
    for (int i = 0; i < L->n_svc; i++) {
        svc_t *s = &L->svc[i];
        if (s->state == SV_STARTING && now - s->spawn_t > L->cfg.launcher.ready_timeout_s) {
            if (!s->ever_ready && L->state == G_STARTING) {
                char why[160];
                snprintf(why, sizeof why, "%s not ready within ready_timeout_s = %d", s->name, L->cfg.launcher.ready_timeout_s);
                log_error("%s", why);
                s_group_stop(L, 1, why);
                return;
            }
            log_warn("%s (pid %d) not ready within %d s after a restart: SIGKILL", s->name, (int)s->pid, L->cfg.launcher.ready_timeout_s);
            uv_process_kill(&s->proc, SIGKILL);
            s->spawn_t = now; /* once */
        }
        /* a service that never got ready keeps restarting: give up after ready_timeout_s */
        if (L->state == G_STARTING && !s->ever_ready && s->first_spawn_t > 0 && s->state == SV_BACKOFF &&
            now - s->first_spawn_t > L->cfg.launcher.ready_timeout_s) {
            char why[200];
            snprintf(why, sizeof why, "%s keeps failing at start (%s); giving up after %d s", s->name, s->last_exit,
                     L->cfg.launcher.ready_timeout_s);
            log_error("%s", why);
            s_group_stop(L, 1, why);
            return;
        }
        if (s->state == SV_READY && s->wd_seen && L->cfg.launcher.watchdog_s > 0 && now - s->last_wd_t > L->cfg.launcher.watchdog_s) {
            log_error("%s (pid %d) watchdog: silent for %.1f s; SIGKILL and restart", s->name, (int)s->pid, now - s->last_wd_t);
            s->wd_seen = false;
            uv_process_kill(&s->proc, SIGKILL);
        }
    }
}

/* ---- stop ---------------------------------------------------------------------------- */

static void s_cleanup(launcher_t *L)
{
    int n = shm_remove_group(L->cfg.name);
    if (n < 0) log_warn("removing shm /strata-%s-*: %s", L->cfg.name, strata_strerror(n));
    else if (n > 0) log_info("removed %d shm segment(s) /strata-%s-*", n, L->cfg.name);
    /* the next start draws new tokens: no name of this run is used again */
    for (int i = 0; i < L->cfg.n_prefetchers; i++) shm_ns_remove(L->cfg.run_dir, L->cfg.prefetcher[i].node);
    const char *eps[3 + CONFIG_MAX_PREFETCHERS];
    int k = 0;
    eps[k++] = L->cfg.router.endpoint;
    eps[k++] = L->cfg.scheduler.endpoint;
    eps[k++] = L->cfg.executor.endpoint;
    for (int i = 0; i < L->cfg.n_prefetchers; i++) eps[k++] = L->cfg.prefetcher[i].endpoint;
    for (int i = 0; i < k; i++)
        if (!strncmp(eps[i], "ipc://", 6) && unlink(eps[i] + 6) == 0) log_info("removed socket file %s", eps[i] + 6);
}

static void s_close_all(launcher_t *L)
{
    uv_close((uv_handle_t *)&L->tick, NULL);
    uv_close((uv_handle_t *)&L->notify_poll, NULL);
    for (int i = 0; i < 3; i++) uv_close((uv_handle_t *)&L->sig[i], NULL);
    for (int i = 0; i < L->n_svc; i++) uv_close((uv_handle_t *)&L->svc[i].timer, NULL);
}

static void s_group_stop(launcher_t *L, int code, const char *why)
{
    if (L->state == G_STOPPED) return;
    if (L->state != G_STOPPING) {
        L->state = G_STOPPING;
        L->exit_code = code;
        L->stop_t = strata_now();
        notify_stopping();
        if (why) s_report(L, false, why);
        log_info("stopping group '%s'%s%s", L->cfg.name, why ? ": " : "", why ? why : "");
        for (int i = 0; i < L->n_svc; i++) uv_timer_stop(&L->svc[i].timer);
        /* router first: no new work while the rest stops */
        for (int i = L->n_svc - 1; i >= 0; i--) {
            svc_t *s = &L->svc[i];
            if (s->running) {
                s->state = SV_STOPPING;
                uv_process_kill(&s->proc, SIGTERM);
            } else if (s->state != SV_FAILED) {
                s->state = SV_EXITED;
            }
        }
        s_write_state(L);
    }
    for (int i = 0; i < L->n_svc; i++)
        if (L->svc[i].running) return;
    s_cleanup(L);
    L->state = G_STOPPED;
    s_write_state(L);
    log_info("group '%s' stopped in %.2f s", L->cfg.name, strata_now() - L->stop_t);
    s_report(L, false, "stopped");
    s_close_all(L);
}

static void s_on_signal(uv_signal_t *h, int signum)
{
    launcher_t *L = h->data;
    if (L->state == G_STOPPING) {
        log_info("signal %d again: still stopping", signum);
        return;
    }
    log_info("signal %d: stopping", signum);
    s_group_stop(L, 0, NULL);
}

/* ---- setup --------------------------------------------------------------------------- */

/* A TCP port on 127.0.0.1 that nothing listens on now (the kernel's pick), or -1. */
static int s_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    int port = -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &al) == 0) port = ntohs(a.sin_port);
    close(fd);
    return port;
}

/* Append the demo's [http] section (127.0.0.1:port, no key) to its config at path. */
static int s_demo_http(const char *path, int port, strata_errbuf_t *eb)
{
    FILE *f = fopen(path, "a");
    if (!f) return strata_seterr(eb, -errno, "%s: %s", path, strerror(errno));
    fprintf(f, "\n[http]\n; strata-http: the OpenAI API, on loopback only (no key)\nhost = 127.0.0.1\nport = %d\ncpus =\n", port);
    if (fclose(f) != 0) return strata_seterr(eb, STRATA_EIO, "%s: write failed", path);
    return 0;
}

/* Find BIN ("strata-router") for service dir SVC ("router"). */
static int s_find_bin(const launcher_t *L, const char *svc, char *out, size_t cap)
{
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", L->self_exe);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    char cand[4][PATH_MAX + 64];
    int n = 0;
    if (L->bin_dir[0]) {
        snprintf(cand[n++], sizeof cand[0], "%s/strata-%s", L->bin_dir, svc);
        snprintf(cand[n++], sizeof cand[0], "%s/services/%s/strata-%s", L->bin_dir, svc, svc);
    }
    snprintf(cand[n++], sizeof cand[0], "%s/../%s/strata-%s", dir, svc, svc); /* build tree */
    snprintf(cand[n++], sizeof cand[0], "%s/strata-%s", dir, svc);           /* installed */
    for (int i = 0; i < n; i++) {
        /* absolute already; symlinks are kept (a service may look at its own name) */
        if (access(cand[i], X_OK) == 0 && strlen(cand[i]) < cap) {
            s_cpy(out, cap, cand[i]);
            return 0;
        }
    }
    fprintf(stderr, "strata up: cannot find strata-%s; tried:", svc);
    for (int i = 0; i < n; i++) fprintf(stderr, " %s", cand[i]);
    fprintf(stderr, " (build it, or pass --bin-dir)\n");
    return 2;
}

static int s_mkdirs(const char *path)
{
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(tmp, 0755) < 0 && errno != EEXIST) return -errno;
        *p = '/';
    }
    if (mkdir(tmp, 0700) < 0 && errno != EEXIST) return -errno;
    return 0;
}

/* Make the run dir (0700) if it is absent, and check the one there is (shm_check_run_dir):
 * whoever may write it could take the group's sockets and state and choose its segment names,
 * so one that another user owns or may write, or a symbolic link, is refused. */
static int s_run_dir(const char *path, strata_errbuf_t *eb)
{
    int r = s_mkdirs(path);
    if (r < 0) return strata_seterr(eb, r, "run dir %s: %s", path, strerror(-r));
    r = shm_check_run_dir(path, eb);
    return r == -ENOENT ? strata_seterr(eb, r, "run dir %s: vanished after mkdir", path) : r;
}

static char **s_make_env(const launcher_t *L)
{
    static const char *const drop[] = {"NOTIFY_SOCKET=", "WATCHDOG_USEC=", "WATCHDOG_PID=", "LISTEN_FDS=", "LISTEN_PID=",
                                       "LISTEN_FDNAMES=", NULL};
    int n = 0;
    while (environ[n]) n++;
    char **env = calloc((size_t)n + 4, sizeof *env);
    if (!env) return NULL;
    int k = 0;
    for (int i = 0; i < n; i++) {
        bool skip = false;
        for (const char *const *d = drop; *d; d++) skip |= !strncmp(environ[i], *d, strlen(*d));
        if (!skip) env[k++] = environ[i];
    }
    char buf[256];
    snprintf(buf, sizeof buf, "NOTIFY_SOCKET=%s", L->notify_addr);
    env[k++] = strdup(buf);
    if (L->cfg.launcher.watchdog_s > 0) {
        snprintf(buf, sizeof buf, "WATCHDOG_USEC=%lld", (long long)L->cfg.launcher.watchdog_s * 1000000ll);
        env[k++] = strdup(buf);
    }
    env[k] = NULL;
    return env;
}

/* Free what s_make_env allocated: the array and the entries that are not the process's own. */
static void s_free_env(char **env)
{
    if (!env) return;
    for (char **e = env; *e; e++) {
        bool own = false;
        for (char **o = environ; *o && !own; o++) own = *o == *e;
        if (!own) free(*e);
    }
    free(env);
}

static void s_add(launcher_t *L, const char *name, int stage, int node, const config_placement_t *pl)
{
    svc_t *s = &L->svc[L->n_svc++];
    memset(s, 0, sizeof *s);
    s->L = L;
    snprintf(s->name, sizeof s->name, "%s", name);
    s->stage = stage;
    s->node = node;
    s->place = *pl;
    s->backoff_ms = L->cfg.launcher.restart_backoff_ms;
    s->log_fd = -1;
}

/* The resolved config (defaults filled in, {run_dir} replaced), as INI. */
static void s_print_config(const strata_config_t *c, const char *path)
{
    printf("; %s, resolved\n[group]\nname = %s\nrun_dir = %s\nmodel = %s\ntokenizer = %s\n", path, c->name, c->run_dir, c->model,
           c->tokenizer);
    printf("[router]\nendpoint = %s\nmax_frame_bytes = %lld\nmax_queue = %d\nmax_inflight_per_client = %d\ncpus = %s\nnuma_node = %d\n",
           c->router.endpoint, (long long)c->router.max_frame_bytes, c->router.max_queue, c->router.max_inflight_per_client,
           c->router.place.cpus, c->router.place.numa_node);
    printf("[scheduler]\nendpoint = %s\nmax_batch_tokens = %d\nmax_seqs = %d\nkv_blocks = %d\nblock_size = %d\nmax_context = %d\n"
           "cpus = %s\nnuma_node = %d\n",
           c->scheduler.endpoint, c->scheduler.max_batch_tokens, c->scheduler.max_seqs, c->scheduler.kv_blocks, c->scheduler.block_size,
           c->scheduler.max_context, c->scheduler.place.cpus, c->scheduler.place.numa_node);
    printf("[executor]\nendpoint = %s\nbackend = %s\nthreads = %d\ngpu_mem = %lld\ncpus = %s\nnuma_node = %d\n", c->executor.endpoint,
           c->executor.backend, c->executor.threads, (long long)c->executor.gpu_mem, c->executor.place.cpus, c->executor.place.numa_node);
    for (int i = 0; i < c->n_prefetchers; i++) {
        printf("[prefetcher.%d]\nendpoint = %s\nthreads = %d\ncpus = %s\nnuma_node = %d\n", c->prefetcher[i].node, c->prefetcher[i].endpoint,
               c->prefetcher[i].threads, c->prefetcher[i].place.cpus, c->prefetcher[i].place.numa_node);
        if (c->prefetcher[i].host_mem) printf("host_mem = %lld\n", (long long)c->prefetcher[i].host_mem);
        else if (c->prefetcher[i].host_mem_frac > 0) printf("host_mem = %g%%\n", c->prefetcher[i].host_mem_frac * 100);
    }
    printf("[launcher]\nrestart_backoff_ms = %d\nrestart_backoff_max_ms = %d\nready_timeout_s = %d\nwatchdog_s = %d\n",
           c->launcher.restart_backoff_ms, c->launcher.restart_backoff_max_ms, c->launcher.ready_timeout_s, c->launcher.watchdog_s);
    if (c->http.enabled)
        printf("[http]\nhost = %s\nport = %d\napi_key = %s\napi_key_file = %s\ninsecure = %s\nmax_body_bytes = %lld\n"
               "max_connections = %d\ntimeout_s = %d\nrequest_timeout_s = %d\nmodel_name = %s\nthreads = %d\ncpus = %s\n"
               "numa_node = %d\n",
               c->http.host, c->http.port, c->http.api_key[0] ? "(set)" : "", c->http.api_key_file, c->http.insecure ? "true" : "false",
               (long long)c->http.max_body_bytes, c->http.max_connections, c->http.timeout_s, c->http.request_timeout_s,
               c->http.model_name, c->http.threads, c->http.place.cpus, c->http.place.numa_node);
}

static void s_help(FILE *f)
{
    fprintf(f,
            "usage: strata up --config FILE [--foreground] [--bin-dir DIR] [--check]\n"
            "       strata up --demo [--run-dir DIR] [--name NAME] [--port PORT] [--http-port PORT] [--foreground]\n\n"
            "Start the process group of FILE: prefetchers (one per [prefetcher.N]), executor,\n"
            "scheduler, router and, with an [http] section, strata-http (the OpenAI-compatible HTTP\n"
            "service), in that order, each pinned to its cpus and NUMA node, each counted\n"
            "as started when it reports READY=1 (sd_notify). Crashed services are restarted with\n"
            "exponential backoff (not on exit code 2). SIGTERM/SIGINT stops everything and removes\n"
            "the group's shm segments and ipc socket files. `strata status` shows the group.\n\n"
            "  --config FILE   group config (INI, see common/config.h and deploy/)\n"
            "  --demo          set up the demo model (small, trained on English) and its config under\n"
            "                  the run dir (default /tmp/strata-demo), then start that group; clients\n"
            "                  connect to tcp://127.0.0.1:7757 (the default of `strata client`), HTTP\n"
            "                  clients (OpenAI API) to http://127.0.0.1:7758/v1\n"
            "  --run-dir DIR   (--demo) run dir instead of /tmp/strata-demo\n"
            "  --name NAME     (--demo) group name instead of demo\n"
            "  --port PORT     (--demo) client port instead of 7757\n"
            "  --http-port PORT (--demo) HTTP port instead of 7758; with --port and without it, a\n"
            "                  free port the kernel picks (the ready line names it)\n"
            "  --foreground    stay attached and log here; otherwise detach once the group is ready\n"
            "                  (logs: RUN_DIR/launcher.log, RUN_DIR/logs/SERVICE.log)\n"
            "  --bin-dir DIR   where the strata-* service binaries are (default: next to strata)\n"
            "  --check         only check FILE and print the resolved config (defaults filled in): its\n"
            "                  syntax and values, the cpus and NUMA nodes on this machine, the ipc\n"
            "                  directories, the model folder (manifest or config.json, every\n"
            "                  weight file at its size) and its chat template; exit 2 with the cause\n"
            "                  on any of them\n"
            "  -h, --help      this help\n\n"
            "Exit codes: 0 group stopped cleanly (foreground) or started (detached); 1 runtime\n"
            "failure; 2 bad config, model or usage, found by up or by a service that exited 2 (its\n"
            "error is on the first line).\n");
}

int cmd_up(int argc, char **argv)
{
    int rc = 1;
    const char *config = NULL, *run_dir = NULL, *name = "demo", *bin_dir = NULL;
    bool demo = false, fg = false, check = false;
    long port = 7757, http_port = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            s_help(stdout);
            return 0;
        } else if (!strcmp(a, "--demo")) {
            demo = true;
        } else if (!strcmp(a, "--foreground")) {
            fg = true;
        } else if (!strcmp(a, "--check")) {
            check = true;
        } else if (i + 1 < argc && !strcmp(a, "--config")) {
            config = argv[++i];
        } else if (i + 1 < argc && !strcmp(a, "--run-dir")) {
            run_dir = argv[++i];
        } else if (i + 1 < argc && !strcmp(a, "--name")) {
            name = argv[++i];
        } else if (i + 1 < argc && !strcmp(a, "--bin-dir")) {
            bin_dir = argv[++i];
        } else if (i + 1 < argc && !strcmp(a, "--http-port")) {
            char *end;
            http_port = strtol(argv[++i], &end, 10);
            if (*end || http_port < 1 || http_port > 65535) {
                fprintf(stderr, "strata up: --http-port '%s' is not a port number\n", argv[i]);
                return 2;
            }
        } else if (i + 1 < argc && !strcmp(a, "--port")) {
            char *end;
            port = strtol(argv[++i], &end, 10);
            if (*end || port < 1 || port > 65535) {
                fprintf(stderr, "strata up: --port '%s' is not a port number\n", argv[i]);
                return 2;
            }
        } else {
            fprintf(stderr, "strata up: unknown or incomplete option '%s'\n", a);
            s_help(stderr);
            return 2;
        }
    }
    if (demo == (config != NULL)) {
        fprintf(stderr, "strata up: give exactly one of --config FILE or --demo\n");
        s_help(stderr);
        return 2;
    }
    if (!demo && (run_dir || port != 7757 || http_port || strcmp(name, "demo"))) {
        fprintf(stderr, "strata up: --run-dir, --name, --port and --http-port go with --demo\n");
        return 2;
    }
    launcher_t *L = calloc(1, sizeof *L);
    if (!L) return 1;
    L->ready_pipe = -1;
    L->notify_fd = -1;
    L->foreground = fg;
    log_set_role("launcher");
    strata_errbuf_t eb = {{0}};
    if (readlink("/proc/self/exe", L->self_exe, sizeof L->self_exe - 1) < 0) {
        fprintf(stderr, "strata up: /proc/self/exe: %s\n", strerror(errno));
        goto done;
    }
    if (bin_dir && !realpath(bin_dir, L->bin_dir)) {
        fprintf(stderr, "strata up: --bin-dir %s: %s\n", bin_dir, strerror(errno));
        rc = 2;
        goto done;
    }

    if (demo) {
        char rd[PATH_MAX], model_dir[PATH_MAX + 16], path[PATH_MAX + 16];
        if (!run_dir) run_dir = "/tmp/strata-demo";
        if (s_run_dir(run_dir, &eb) < 0) {
            fprintf(stderr, "strata up: %s\n", eb.msg);
            rc = 2;
            goto done;
        }
        if (!realpath(run_dir, rd)) {
            fprintf(stderr, "strata up: run dir %s: %s\n", run_dir, strerror(errno));
            goto done;
        }
        if (gs_locked(rd)) {
            fprintf(stderr, "strata up: the demo group in %s is already running (strata status --demo)\n", rd);
            goto done;
        }
        snprintf(model_dir, sizeof model_dir, "%s/model", rd);
        fprintf(stderr, "strata up: demo model (a small Mixtral-shaped MoE trained on English) in %s\n", model_dir);
        if (demo_model_write(rd, &eb) < 0) {
            fprintf(stderr, "strata up: demo model: %s\n", eb.msg);
            goto done;
        }
        snprintf(path, sizeof path, "%s/strata.ini", rd);
        if (demo_config_write(path, name, rd, model_dir, (int)port, &eb) < 0) {
            fprintf(stderr, "strata up: demo config: %s\n", eb.msg);
            goto done;
        }
        /* the demo serves the OpenAI API too: 7758 beside the default router port, else the
         * port asked for, else (a router port was chosen, as parallel tests do) a free one */
        if (!http_port) http_port = port == 7757 ? 7758 : s_free_port();
        if (http_port <= 0 || s_demo_http(path, (int)http_port, &eb) < 0) {
            fprintf(stderr, "strata up: demo config: %s\n", http_port <= 0 ? "no free port for HTTP" : eb.msg);
            goto done;
        }
        s_cpy(L->config_path, sizeof L->config_path, path);
    } else if (!realpath(config, L->config_path)) {
        fprintf(stderr, "strata up: %s: %s\n", config, strerror(errno));
        rc = 2;
        goto done;
    }
    if (config_load(&L->cfg, L->config_path, &eb) < 0) {
        fprintf(stderr, "strata up: %s\n", eb.msg);
        rc = 2;
        goto done;
    }
    for (int i = 0; i < L->cfg.n_prefetchers; i++) {
        char nm[32];
        snprintf(nm, sizeof nm, "prefetcher.%d", L->cfg.prefetcher[i].node);
        s_add(L, nm, 0, L->cfg.prefetcher[i].node, &L->cfg.prefetcher[i].place);
    }
    s_add(L, "executor", 1, -1, &L->cfg.executor.place);
    s_add(L, "scheduler", 2, -1, &L->cfg.scheduler.place);
    s_add(L, "router", 3, -1, &L->cfg.router.place);
    L->last_stage = 3;
    if (L->cfg.http.enabled) {
        s_add(L, "http", 4, -1, &L->cfg.http.place);
        L->last_stage = 4;
    }
    /* every placement must be possible on this machine: check now, not in a restart loop */
    {
        cpu_set_t allowed;
        sched_getaffinity(0, sizeof allowed, &allowed);
        for (int i = 0; i < L->n_svc; i++) {
            const config_placement_t *pl = &L->svc[i].place;
            cpu_set_t set;
            if (cpulist_parse(pl->cpus, &set, &eb) > 0) {
                cpu_set_t miss;
                CPU_XOR(&miss, &set, &allowed);
                CPU_AND(&miss, &miss, &set);
                if (CPU_COUNT(&miss)) {
                    char have[256];
                    cpulist_format(&allowed, have, sizeof have);
                    fprintf(stderr, "strata up: %s: [%s] cpus = %s: not all of them are available here (allowed: %s)\n",
                            L->config_path, L->svc[i].name, pl->cpus, have);
                    rc = 2;
                    goto done;
                }
            }
            if (pl->numa_node >= 0 && !placement_node_exists(pl->numa_node)) {
                fprintf(stderr, "strata up: %s: [%s] numa_node = %d: no such NUMA node here (this machine has %d)\n", L->config_path,
                        L->svc[i].name, pl->numa_node, placement_numa_nodes());
                rc = 2;
                goto done;
            }
        }
    }
    /* the rest that no restart can fix, before anything starts: ipc directories, the
     * listeners' protection (a non-loopback bind needs keys or insecure), the model
     * folder (its manifest or config.json, every weight file at its size) */
    if (config_check_paths(&L->cfg, L->config_path, &eb) < 0 || config_check_http(&L->cfg, L->config_path, NULL, &eb) < 0 ||
        config_check_router(&L->cfg, L->config_path, NULL, &eb) < 0 ||
        model_check(L->cfg.model, &eb) < 0) {
        fprintf(stderr, "strata up: %s: %s\n", L->config_path, eb.msg);
        rc = 2;
        goto done;
    }
    /* the chat template the router will render (it refuses one the engine cannot render, too) */
    {
        chat_template_t *tmpl = NULL;
        if (chat_template_load(L->cfg.model, &tmpl, &eb) < 0) {
            fprintf(stderr, "strata up: %s: [group] model: %s\n", L->config_path, eb.msg);
            rc = 2;
            goto done;
        }
        chat_template_free(tmpl);
    }
    if (check) {
        s_print_config(&L->cfg, L->config_path);
        rc = 0;
        goto done;
    }
    static const char *const dirs[] = {"prefetcher", "executor", "scheduler", "router", "http"};
    for (int i = 0; i < L->n_svc; i++)
        if ((rc = s_find_bin(L, dirs[L->svc[i].stage], L->svc[i].exe, sizeof L->svc[i].exe))) goto done;
    rc = 1;

    int r = s_run_dir(L->cfg.run_dir, &eb);
    if (r < 0) {
        fprintf(stderr, "strata up: %s: [group] %s\n", L->config_path, eb.msg);
        rc = 2;
        goto done;
    }
    int lock_fd = gs_lock(L->cfg.run_dir);
    if (lock_fd < 0) {
        gs_state_t st;
        int pid = gs_read(L->cfg.run_dir, &st, NULL) == 0 ? (int)st.launcher_pid : 0;
        if (lock_fd == STRATA_EBUSY)
            fprintf(stderr, "strata up: group '%s' is already running (launcher pid %d; strata status --config %s)\n", L->cfg.name,
                    pid, L->config_path);
        else
            fprintf(stderr, "strata up: lock in %s: %s\n", L->cfg.run_dir, strata_strerror(lock_fd));
        goto done;
    }
    /* so that status, down and client find it without --config (group_state.h) */
    if ((r = gs_register(L->cfg.name, L->cfg.run_dir, L->config_path)) < 0 && r != -ENOENT)
        fprintf(stderr, "strata up: cannot record the group in the registry: %s\n", strerror(-r));

    if (!fg) {
        /* Detach: the child becomes the launcher; this process waits until the group is
         * ready (or failed) and reports. Fork before libuv exists in this process. */
        int p[2];
        if (pipe2(p, O_CLOEXEC) < 0) goto done;
        fflush(NULL);
        pid_t child = fork();
        if (child < 0) goto done;
        if (child > 0) {
            close(p[1]);
            char buf[600];
            ssize_t n = 0, k;
            while ((k = read(p[0], buf + n, sizeof buf - 1 - (size_t)n)) > 0) n += k;
            buf[n > 0 ? n : 0] = 0;
            if (n > 0 && buf[0] == 'R') {
                printf("strata up: group '%s' ready (launcher pid %d). Status: strata status --config %s\n"
                       "Logs: %s/launcher.log, %s/logs/. Stop: strata down --config %s\n",
                       L->cfg.name, (int)child, L->config_path, L->cfg.run_dir, L->cfg.run_dir, L->config_path);
                if (L->cfg.http.enabled)
                    printf("OpenAI API: http://%s%s%s:%d/v1\n", strchr(L->cfg.http.host, ':') ? "[" : "", L->cfg.http.host,
                           strchr(L->cfg.http.host, ':') ? "]" : "", L->cfg.http.port);
                if (demo) printf("Try: strata client --prompt \"Once upon a time\" --max-tokens 48\n");
                rc = 0;
            } else {
                fprintf(stderr, "strata up: group '%s' failed to start: %s (see %s/launcher.log)\n", L->cfg.name,
                        n > 1 ? buf + 1 : "launcher exited", L->cfg.run_dir);
                waitpid(child, NULL, WNOHANG);
                rc = n > 0 && buf[0] == 'C' ? 2 : 1; /* C: a service refused its config or model */
            }
            goto done;
        }
        close(p[0]);
        L->ready_pipe = p[1];
        setsid();
        char path[PATH_MAX + 32];
        snprintf(path, sizeof path, "%s/launcher.log", L->cfg.run_dir);
        int nul = open("/dev/null", O_RDWR | O_CLOEXEC);
        int lf = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (nul >= 0) dup2(nul, 0);
        if (lf >= 0) {
            dup2(lf, 1);
            dup2(lf, 2);
        }
        snprintf(path, sizeof path, "%s/logs", L->cfg.run_dir);
        mkdir(path, 0755);
        for (int i = 0; i < L->n_svc; i++) {
            char lp[PATH_MAX + 64];
            snprintf(lp, sizeof lp, "%s/logs/%s.log", L->cfg.run_dir, L->svc[i].name);
            L->svc[i].log_fd = open(lp, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        }
    }

    L->started_unix = gs_now_unix();
    snprintf(L->notify_addr, sizeof L->notify_addr, "@strata-%s-notify-%d", L->cfg.name, (int)getpid());
    L->notify_fd = notify_server_open(L->notify_addr + 1);
    if (L->notify_fd < 0) {
        log_error("notify socket %s: %s", L->notify_addr, strata_strerror(L->notify_fd));
        s_report(L, false, "notify socket");
        goto done;
    }
    L->env = s_make_env(L);
    if (!L->env || uv_loop_init(&L->loop) < 0) goto done;
    uv_poll_init(&L->loop, &L->notify_poll, L->notify_fd);
    L->notify_poll.data = L;
    uv_poll_start(&L->notify_poll, UV_READABLE, s_on_notify);
    const int sigs[3] = {SIGTERM, SIGINT, SIGHUP};
    for (int i = 0; i < 3; i++) {
        uv_signal_init(&L->loop, &L->sig[i]);
        L->sig[i].data = L;
        uv_signal_start(&L->sig[i], s_on_signal, sigs[i]);
    }
    signal(SIGPIPE, SIG_IGN);
    uv_timer_init(&L->loop, &L->tick);
    L->tick.data = L;
    uv_timer_start(&L->tick, s_on_tick, TICK_MS, TICK_MS);
    for (int i = 0; i < L->n_svc; i++) {
        uv_timer_init(&L->loop, &L->svc[i].timer);
        L->svc[i].timer.data = &L->svc[i];
    }
    log_info("starting group '%s' from %s (run_dir %s, %d services)", L->cfg.name, L->config_path, L->cfg.run_dir, L->n_svc);
    L->stage = 0;
    L->state = G_STARTING;
    for (int i = 0; i < L->n_svc; i++)
        if (L->svc[i].stage == 0) s_spawn(&L->svc[i]);
    s_write_state(L);
    uv_run(&L->loop, UV_RUN_DEFAULT);
    uv_loop_close(&L->loop);
    rc = L->exit_code;
    gs_unregister(L->cfg.name);
    close(lock_fd);
done:
    if (L->notify_fd >= 0) close(L->notify_fd);
    s_free_env(L->env);
    free(L);
    return rc;
}
