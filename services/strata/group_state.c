/* group_state.c - run_dir/state.json and run_dir/launcher.lock (see group_state.h). */
#include "services/strata/group_state.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "proto/zmsg.h"

double gs_now_unix(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int gs_write(const char *run_dir, const gs_state_t *st)
{
    char path[PATH_MAX], tmp[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/state.json", run_dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    json_t *svcs = json_array();
    for (int i = 0; i < st->n; i++) {
        const gs_service_t *s = &st->svc[i];
        json_array_append_new(svcs, json_pack("{s:s, s:i, s:s, s:f, s:f, s:i, s:s, s:s}", "name", s->name, "pid", (int)s->pid,
                                              "state", s->state, "started_unix", s->started_unix, "ready_unix", s->ready_unix,
                                              "restarts", s->restarts, "last_exit", s->last_exit, "exe", s->exe));
    }
    json_t *j = json_pack("{s:s, s:s, s:i, s:s, s:f, s:f, s:o}", "group", st->group, "config", st->config, "launcher_pid",
                          (int)st->launcher_pid, "state", st->state, "started_unix", st->started_unix, "updated_unix",
                          gs_now_unix(), "services", svcs);
    if (!j) return STRATA_ENOMEM;
    int r = json_dump_file(j, tmp, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    json_decref(j);
    if (r != 0) return STRATA_EIO;
    if (rename(tmp, path) < 0) return -errno;
    return 0;
}

static void s_copy(char *dst, size_t cap, json_t *o, const char *key)
{
    const char *v = json_string_value(json_object_get(o, key));
    snprintf(dst, cap, "%s", v ? v : "");
}

int gs_read(const char *run_dir, gs_state_t *st, strata_errbuf_t *eb)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/state.json", run_dir);
    memset(st, 0, sizeof *st);
    if (access(path, F_OK) < 0) return -ENOENT;
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (!j || !json_is_object(j)) {
        json_decref(j);
        return strata_seterr(eb, STRATA_EFORMAT, "%s:%d: %s", path, je.line, je.text);
    }
    s_copy(st->group, sizeof st->group, j, "group");
    s_copy(st->config, sizeof st->config, j, "config");
    s_copy(st->state, sizeof st->state, j, "state");
    st->launcher_pid = (pid_t)json_integer_value(json_object_get(j, "launcher_pid"));
    st->started_unix = json_number_value(json_object_get(j, "started_unix"));
    st->updated_unix = json_number_value(json_object_get(j, "updated_unix"));
    json_t *a = json_object_get(j, "services");
    size_t i;
    json_t *o;
    json_array_foreach(a, i, o)
    {
        if (st->n == GS_MAX_SVC) break;
        gs_service_t *s = &st->svc[st->n++];
        s_copy(s->name, sizeof s->name, o, "name");
        s_copy(s->state, sizeof s->state, o, "state");
        s_copy(s->last_exit, sizeof s->last_exit, o, "last_exit");
        s_copy(s->exe, sizeof s->exe, o, "exe");
        s->pid = (pid_t)json_integer_value(json_object_get(o, "pid"));
        s->started_unix = json_number_value(json_object_get(o, "started_unix"));
        s->ready_unix = json_number_value(json_object_get(o, "ready_unix"));
        s->restarts = (int)json_integer_value(json_object_get(o, "restarts"));
    }
    json_decref(j);
    return 0;
}

int gs_lock(const char *run_dir)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/launcher.lock", run_dir);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) return -errno;
    if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
        int e = errno;
        close(fd);
        return e == EWOULDBLOCK ? STRATA_EBUSY : -e;
    }
    return fd;
}

bool gs_locked(const char *run_dir)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/launcher.lock", run_dir);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    bool held = flock(fd, LOCK_SH | LOCK_NB) < 0 && errno == EWOULDBLOCK;
    close(fd);
    return held;
}

bool gs_target_opt(gs_target_t *t, int argc, char **argv, int *i)
{
    if (!strcmp(argv[*i], "--demo")) {
        t->demo = true;
    } else if (*i + 1 < argc && !strcmp(argv[*i], "--config")) {
        t->config = argv[++*i];
    } else if (*i + 1 < argc && !strcmp(argv[*i], "--run-dir")) {
        t->run_dir = argv[++*i];
    } else {
        return false;
    }
    return true;
}

int gs_target_run_dir(const gs_target_t *t, const char *cmd, char *rd, size_t cap)
{
    if (!t->demo && !t->config && !t->run_dir) {
        /* nothing named: the one group this user runs (gs_find_one) */
        gs_entry_t e;
        int r = gs_find_one(cmd, &e);
        if (r == 2) return 2;
        if (r == 0) {
            snprintf(rd, cap, "%s", e.run_dir);
            return 0;
        }
        fprintf(stderr, "strata %s: no running group found; give --config FILE or --demo [--run-dir DIR]\n", cmd);
        return 2;
    }
    if (t->demo == (t->config != NULL) || (t->run_dir && !t->demo)) {
        fprintf(stderr, "strata %s: give --config FILE or --demo [--run-dir DIR]\n", cmd);
        return 2;
    }
    if (t->demo) {
        snprintf(rd, cap, "%s", t->run_dir ? t->run_dir : "/tmp/strata-demo");
        return 0;
    }
    strata_config_t *c = malloc(sizeof *c);
    strata_errbuf_t eb = {{0}};
    if (!c) return 1;
    if (config_load(c, t->config, &eb) < 0) {
        fprintf(stderr, "strata %s: %s\n", cmd, eb.msg);
        free(c);
        return 2;
    }
    snprintf(rd, cap, "%s", c->run_dir);
    free(c);
    return 0;
}

int gs_registry_dir(char *buf, size_t cap)
{
    const char *xdg = getenv("XDG_RUNTIME_DIR"), *own = getenv("STRATA_REGISTRY");
    if (own && own[0] == '/') snprintf(buf, cap, "%s", own);
    else if (geteuid() == 0) snprintf(buf, cap, "/run/strata");
    else if (xdg && xdg[0] == '/') snprintf(buf, cap, "%s/strata", xdg);
    else return -ENOENT;
    if (mkdir(buf, 0700) < 0 && errno != EEXIST) return -errno;
    struct stat st;
    /* this user's, and no one else's to write: another user's folder would name their groups */
    if (lstat(buf, &st) < 0) return -errno;
    if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 022)) return -EPERM;
    return 0;
}

int gs_register(const char *name, const char *run_dir, const char *config)
{
    char dir[PATH_MAX], path[PATH_MAX + 80], tmp[PATH_MAX + 96];
    int rc = gs_registry_dir(dir, sizeof dir);
    if (rc < 0) return rc;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(tmp, sizeof tmp, "%s/.%s.%d", dir, name, (int)getpid());
    json_t *o = json_pack("{s:s, s:s, s:s}", "group", name, "run_dir", run_dir, "config", config);
    if (!o) return STRATA_ENOMEM;
    rc = json_dump_file(o, tmp, JSON_COMPACT) == 0 && rename(tmp, path) == 0 ? 0 : -errno;
    json_decref(o);
    if (rc < 0) unlink(tmp);
    return rc;
}

void gs_unregister(const char *name)
{
    char dir[PATH_MAX], path[PATH_MAX + 80];
    if (gs_registry_dir(dir, sizeof dir) < 0) return;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    unlink(path);
}

int gs_running(gs_entry_t *out, int max)
{
    char dir[PATH_MAX];
    int rc = gs_registry_dir(dir, sizeof dir), n = 0;
    if (rc < 0) return rc == -ENOENT ? 0 : rc;
    DIR *d = opendir(dir);
    if (!d) return -errno;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        char path[PATH_MAX + 300];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        json_t *o = json_load_file(path, 0, NULL);
        const char *rd = o ? json_string_value(json_object_get(o, "run_dir")) : NULL;
        const char *cf = o ? json_string_value(json_object_get(o, "config")) : NULL;
        if (!rd || !cf || !gs_locked(rd)) {
            unlink(path); /* unreadable, or its launcher is gone */
        } else {
            if (n < max) {
                snprintf(out[n].name, sizeof out[n].name, "%.63s", de->d_name);
                snprintf(out[n].run_dir, sizeof out[n].run_dir, "%s", rd);
                snprintf(out[n].config, sizeof out[n].config, "%s", cf);
            }
            n++;
        }
        json_decref(o);
    }
    closedir(d);
    return n;
}

int gs_find_one(const char *cmd, gs_entry_t *e)
{
    gs_entry_t all[16];
    int n = gs_running(all, 16);
    if (n <= 0) return -ENOENT;
    if (n == 1) {
        *e = all[0];
        return 0;
    }
    fprintf(stderr, "strata %s: %d groups are running; give --config FILE or --demo:\n", cmd, n);
    for (int i = 0; i < n && i < 16; i++) fprintf(stderr, "  %-20s --config %s\n", all[i].name, all[i].config);
    return 2;
}

int gs_find_router(const char *cmd, char *ep, size_t cap, char *model, size_t mcap)
{
    gs_entry_t e;
    int r = gs_find_one(cmd, &e);
    if (r == 2) return 2;
    if (r < 0) return 0;
    strata_config_t *c = malloc(sizeof *c);
    strata_errbuf_t eb = {{0}};
    if (!c) return 1;
    r = config_load(c, e.config, &eb);
    if (r < 0) {
        fprintf(stderr, "strata %s: the running group '%s': %s\n", cmd, e.name, eb.msg);
    } else {
        snprintf(ep, cap, "%s", c->router.endpoint);
        if (model) snprintf(model, mcap, "%s", c->model);
    }
    free(c);
    return r < 0 ? 2 : 0;
}

int gs_ask(void *ctx, const char *endpoint, msg_type_t type, msg_family_t fam, int timeout_ms, msg_t *out)
{
    int rc = -EAGAIN, zero = 0;
    void *sock = zmq_socket(ctx, ZMQ_DEALER);
    if (!sock) return -ENOMEM;
    zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof zero);
    msg_t m;
    msg_init(&m, type);
    m.has_id = true;
    m.id = 1;
    msg_buf_t b = {0};
    if (zmq_connect(sock, endpoint) == 0 && zmsg_send(sock, NULL, 0, &m, &b, 0) == 0) {
        zmq_pollitem_t it = {.socket = sock, .events = ZMQ_POLLIN};
        msg_err_t err;
        if (zmq_poll(&it, 1, timeout_ms) == 1) {
            rc = zmsg_recv(sock, fam, out, &err, ZMQ_DONTWAIT);
            if (rc < 0) msg_free(out);
        }
    }
    msg_buf_free(&b);
    zmq_close(sock);
    return rc;
}

static double s_stat(const msg_stats_t *st, const char *name, double dflt)
{
    for (int32_t i = 0; i < st->n; i++)
        if (st->items[i].name.len == strlen(name) && !memcmp(st->items[i].name.s, name, st->items[i].name.len)) return st->items[i].value;
    return dflt;
}

static void s_rate(char *out, size_t cap, double hits, double misses)
{
    if (hits + misses <= 0) snprintf(out, cap, "no fetches yet");
    else snprintf(out, cap, "hit rate %.1f%% (%.0f hits, %.0f misses)", 100 * hits / (hits + misses), hits, misses);
}

void gs_tiers(const char *config_path, void (*line)(void *ctx, const char *text), void *lctx)
{
    char t[512], rate[128];
    strata_config_t *c = malloc(sizeof *c);
    strata_errbuf_t eb = {{0}};
    if (!c || config_load(c, config_path, &eb) < 0) {
        snprintf(t, sizeof t, "tiers: %.500s", c ? eb.msg : "out of memory");
        line(lctx, t);
        free(c);
        return;
    }
    void *ctx = zmq_ctx_new();
    snprintf(t, sizeof t, "%-16s %s", "TIER", "EXPERTS");
    line(lctx, t);
    msg_t m;
    if (ctx && gs_ask(ctx, c->executor.endpoint, MSG_EXEC_STATS, MSG_FAM_EXEC_OUT, 500, &m) == 0) {
        if (m.type == MSG_EXEC_STATS_REPLY && s_stat(&m.u.stats, "experts_total", -1) >= 0) {
            s_rate(rate, sizeof rate, s_stat(&m.u.stats, "hits", 0), s_stat(&m.u.stats, "misses", 0));
            snprintf(t, sizeof t, "%-16s %.0f of %.0f in %.0f slots and resident, gpu_mem %.1f MiB; %s", "gpu",
                     s_stat(&m.u.stats, "experts_on_gpu", 0), s_stat(&m.u.stats, "experts_total", 0),
                     s_stat(&m.u.stats, "slots", 0), c->executor.gpu_mem / 1048576.0, rate);
            line(lctx, t);
        }
        msg_free(&m);
    }
    for (int i = 0; i < c->n_prefetchers; i++) {
        char name[32];
        snprintf(name, sizeof name, "host (node %d)", c->prefetcher[i].node);
        if (!ctx || gs_ask(ctx, c->prefetcher[i].endpoint, MSG_PF_STATUS, MSG_FAM_PF_OUT, 500, &m) < 0) {
            snprintf(t, sizeof t, "%-16s prefetcher not answering on %s", name, c->prefetcher[i].endpoint);
            line(lctx, t);
            continue;
        }
        const msg_pf_status_t *p = &m.u.pf_status;
        if (m.type != MSG_PF_STATUS_REPLY) {
            snprintf(t, sizeof t, "%-16s prefetcher answered %s", name, msg_type_name(m.type));
            line(lctx, t);
        } else if (p->slots <= 0) {
            snprintf(t, sizeof t, "%-16s every expert of its files, in an arena of %.1f MiB", name, p->bytes / 1048576.0);
            line(lctx, t);
        } else {
            const uint64_t sb = (uint64_t)p->slots * p->slot_bytes;
            s_rate(rate, sizeof rate, (double)p->host_hits, (double)p->host_misses);
            snprintf(t, sizeof t, "%-16s %d of its %d experts on disk in %d slots (%.1f MiB), beside %.1f MiB resident "
                     "(budget %.1f MiB); %s", name, p->experts_host, p->experts_disk, p->slots, sb / 1048576.0,
                     (p->bytes - sb) / 1048576.0, p->host_budget / 1048576.0, rate);
            line(lctx, t);
            snprintf(name, sizeof name, "disk (node %d)", c->prefetcher[i].node);
            snprintf(t, sizeof t, "%-16s %d experts only there (up to %.1f MiB); %.1f MiB read in %.2f s (%.2f GB/s), %llu bad blocks; "
                     "%llu read ahead, %llu of them used",
                     name, p->experts_disk - p->experts_host, (double)(p->experts_disk - p->experts_host) * p->slot_bytes / 1048576.0,
                     p->disk_bytes / 1048576.0, p->disk_s, p->disk_s > 0 ? p->disk_bytes / p->disk_s * 1e-9 : 0.0,
                     (unsigned long long)p->disk_errors, (unsigned long long)p->read_ahead, (unsigned long long)p->read_ahead_used);
            line(lctx, t);
        }
        msg_free(&m);
    }
    if (ctx) zmq_ctx_term(ctx);
    free(c);
}
