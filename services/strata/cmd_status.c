/* cmd_status.c - `strata status`: the group's services from the launcher's state file, with
 * the cpus and memory nodes each live process is actually allowed (from /proc/PID/status). */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/config.h"
#include "services/strata/cmd.h"
#include "services/strata/group_state.h"

static void s_help(FILE *f)
{
    fprintf(f,
            "usage: strata status [--config FILE | --demo [--run-dir DIR]] [--json]\n\n"
            "Print every service of the group: pid, state, uptime, restart count, last exit, and\n"
            "the cpus / NUMA memory nodes the process may use (Cpus_allowed_list and\n"
            "Mems_allowed_list of /proc/PID/status) and its memory policy (/proc/PID/numa_maps).\n\n"
            "  --config FILE   the group's config (its run_dir holds state.json); without it or --demo,\n"
            "                  the one group this user runs (as `strata up` records them in\n"
            "                  $STRATA_REGISTRY, $XDG_RUNTIME_DIR/strata or /run/strata for root;\n"
            "                  with several it lists them and exits 2)\n"
            "  --demo          the demo group (run dir /tmp/strata-demo, or --run-dir DIR)\n"
            "  --json          print state.json as the launcher wrote it\n"
            "  -h, --help      this help\n\n"
            "Exit codes: 0 the launcher is running, 1 it is not (stopped, failed or never started),\n"
            "2 bad config or usage.\n");
}

/* Value of `key:` in /proc/pid/status, or "-". */
static void s_proc_field(pid_t pid, const char *key, char *out, size_t cap)
{
    snprintf(out, cap, "-");
    char path[64], line[512];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return;
    size_t kl = strlen(key);
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, key, kl) || line[kl] != ':') continue;
        char *v = line + kl + 1;
        while (*v == ' ' || *v == '\t') v++;
        v[strcspn(v, "\n")] = 0;
        snprintf(out, cap, "%s", v);
        break;
    }
    fclose(f);
}

/* The memory policy the process runs under: numa_maps shows the task policy on every mapping
 * without its own (e.g. "default", "bind:0"); the first mapping is the executable's. */
static void s_policy(pid_t pid, char *out, size_t cap)
{
    snprintf(out, cap, "-");
    char path[64], line[512], addr[64], pol[64];
    snprintf(path, sizeof path, "/proc/%d/numa_maps", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return;
    if (fgets(line, sizeof line, f) && sscanf(line, "%63s %63s", addr, pol) == 2) snprintf(out, cap, "%s", pol);
    fclose(f);
}

static void s_print_line(void *ctx, const char *text)
{
    (void)ctx;
    printf("%s\n", text);
}

static void s_dur(double s, char *out, size_t cap)
{
    if (s <= 0) snprintf(out, cap, "-");
    else if (s < 120) snprintf(out, cap, "%.1fs", s);
    else if (s < 7200) snprintf(out, cap, "%.1fm", s / 60);
    else snprintf(out, cap, "%.1fh", s / 3600);
}

int cmd_status(int argc, char **argv)
{
    gs_target_t tg = {0};
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            s_help(stdout);
            return 0;
        } else if (gs_target_opt(&tg, argc, argv, &i)) {
            continue;
        } else if (!strcmp(argv[i], "--json")) {
            json = true;
        } else {
            fprintf(stderr, "strata status: unknown or incomplete option '%s'\n", argv[i]);
            s_help(stderr);
            return 2;
        }
    }
    char rd[PATH_MAX];
    int rc = gs_target_run_dir(&tg, "status", rd, sizeof rd);
    if (rc) return rc;
    gs_state_t *st = calloc(1, sizeof *st);
    if (!st) return 1;
    strata_errbuf_t eb = {{0}};
    int r = gs_read(rd, st, &eb);
    bool alive = gs_locked(rd);
    if (r == -ENOENT) {
        printf("no group state in %s: never started here\n", rd);
        free(st);
        return 1;
    }
    if (r < 0) {
        fprintf(stderr, "strata status: %s\n", eb.msg);
        free(st);
        return 1;
    }
    if (json) {
        char path[PATH_MAX + 16], buf[4096];
        snprintf(path, sizeof path, "%s/state.json", rd);
        FILE *f = fopen(path, "r");
        size_t n;
        while (f && (n = fread(buf, 1, sizeof buf, f)) > 0) fwrite(buf, 1, n, stdout);
        if (f) fclose(f);
        printf("\n");
        free(st);
        return alive ? 0 : 1;
    }
    double now = gs_now_unix();
    char up[32];
    const char *gstate = st->state;
    if (!alive && (!strcmp(gstate, "running") || !strcmp(gstate, "starting") || !strcmp(gstate, "stopping")))
        gstate = "dead (launcher gone; state is stale)";
    s_dur(alive ? now - st->started_unix : 0, up, sizeof up);
    printf("group %s: %s, launcher pid %d, up %s\nconfig %s\n\n", st->group, gstate, alive ? (int)st->launcher_pid : 0, up, st->config);
    printf("%-14s %8s  %-9s %8s %8s  %-12s %-5s %-10s %s\n", "SERVICE", "PID", "STATE", "UPTIME", "RESTARTS", "CPUS", "MEMS", "MEMPOLICY",
           "LAST EXIT");
    for (int i = 0; i < st->n; i++) {
        gs_service_t *s = &st->svc[i];
        char cpus[128] = "-", mems[128] = "-", pid[16] = "-", pol[64] = "-";
        bool live = alive && s->pid > 0 && kill(s->pid, 0) == 0;
        if (live) {
            s_proc_field(s->pid, "Cpus_allowed_list", cpus, sizeof cpus);
            s_proc_field(s->pid, "Mems_allowed_list", mems, sizeof mems);
            s_policy(s->pid, pol, sizeof pol);
            snprintf(pid, sizeof pid, "%d", (int)s->pid);
        }
        s_dur(live ? now - s->started_unix : 0, up, sizeof up);
        printf("%-14s %8s  %-9s %8s %8d  %-12s %-5s %-10s %s\n", s->name, pid,
               alive ? s->state : (strcmp(s->state, "failed") ? "stopped" : "failed"), up, s->restarts, cpus, mems, pol,
               s->last_exit[0] ? s->last_exit : "-");
    }
    if (alive && !strcmp(st->state, "running")) {
        printf("\n");
        gs_tiers(st->config, s_print_line, NULL);
    }
    free(st);
    return alive ? 0 : 1;
}
