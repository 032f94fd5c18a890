/* strata-http - the OpenAI-compatible HTTP service of the group (http.h): a client of the router,
 * holding no request state of its own.
 *
 * Exit codes (common/service.h): 0 clean stop, 1 runtime failure (restart me: a port in use, the
 * router unreachable at start), 2 bad config or usage (no [http] section, a non-loopback host
 * without a key, an unreadable or open key file, an address this host does not have). */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/config.h"
#include "common/notify.h"
#include "common/service.h"
#include "common/strata.h"
#include "services/http/http.h"

static void s_usage(FILE *f)
{
    fprintf(f,
            "usage: strata-http --config FILE\n\n"
            "The group's OpenAI-compatible HTTP service, on [http] host:port (default 127.0.0.1:7758):\n"
            "  POST /v1/chat/completions   chat, rendered with the model's chat template by the router\n"
            "  POST /v1/completions        text or token-id prompts\n"
            "  GET  /v1/models             the served model ([http] model_name, else the router's name)\n"
            "  GET  /health                200 once the group serves, else 503\n"
            "  GET  /metrics               Prometheus text: requests, tokens, latency histograms, batch,\n"
            "                              KV blocks, expert cache, prefetch, PCIe, service restarts\n"
            "Streaming is server-sent events (\"stream\": true). Errors are OpenAI's JSON error object.\n"
            "It talks to the router ([router] endpoint) over ZeroMQ and keeps no request state: a\n"
            "client whose connection drops mid-answer has its request canceled upstream. It serves on\n"
            "[http] threads workers (0, the default: half the usable cpus, 1 to 8), each a thread with\n"
            "its own connections and router sockets.\n\n"
            "With [http] api_key or api_key_file set, /v1/* needs 'Authorization: Bearer KEY'. A host\n"
            "that is not a loopback address needs a key, unless [http] insecure = true (then every\n"
            "start logs a warning).\n\n"
            "  --config FILE   the group config (INI, common/config.h), with an [http] section\n"
            "  --help          this text\n\n"
            "Exit codes: 0 clean stop (SIGTERM/SIGINT), 1 runtime failure, 2 bad config or usage.\n");
}

/* The key of [http] api_key_file: its first line, from a file no other user may read or write. */
static int s_read_key(const char *path, char *out, size_t cap, strata_errbuf_t *eb)
{
    struct stat st;
    if (stat(path, &st) < 0) return strata_seterr(eb, STRATA_EINVAL_INPUT, "[http] api_key_file %s: %s", path, strerror(errno));
    if (st.st_mode & 077)
        return strata_seterr(eb, STRATA_EINVAL_INPUT, "[http] api_key_file %s: mode %03o lets other users read it; chmod 600 it", path,
                             (unsigned)(st.st_mode & 0777));
    char *text = NULL;
    size_t len = 0;
    int rc = strata_read_file(path, 4096, &text, &len, eb);
    if (rc < 0) return rc;
    text[strcspn(text, "\r\n")] = 0;
    char *k = text;
    while (*k == ' ' || *k == '\t') k++;
    size_t n = strlen(k);
    while (n && (k[n - 1] == ' ' || k[n - 1] == '\t')) k[--n] = 0;
    if (n == 0 || n >= cap) {
        free(text);
        return strata_seterr(eb, STRATA_EINVAL_INPUT, "[http] api_key_file %s: the first line must hold the key (1-%zu characters)", path,
                             cap - 1);
    }
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)k[i] <= ' ' || (unsigned char)k[i] >= 0x7f) {
            free(text);
            return strata_seterr(eb, STRATA_EINVAL_INPUT, "[http] api_key_file %s: the key must be printable ASCII without spaces", path);
        }
    memcpy(out, k, n + 1);
    free(text);
    return 0;
}

/* Stop the workers' threads (failing what is open), then their daemons, then free them. */
static void s_stop(bridge_t **b, hserver_t **s, int n)
{
    for (int i = 0; i < n; i++) bridge_shutdown(b[i]);
    for (int i = 0; i < n; i++) server_stop(s[i]);
    for (int i = 0; i < n; i++) bridge_destroy(b[i]);
}

int main(int argc, char **argv)
{
    static strata_config_t cfg;
    const char *path = NULL;
    int rc = service_init(argc, argv, "http", s_usage, &cfg, &path);
    if (rc != SERVICE_RUN) return rc;
    strata_errbuf_t eb = {{0}};
    if (!cfg.http.enabled) {
        log_error("%s: no [http] section: nothing to serve", path);
        return SERVICE_EXIT_CONFIG;
    }
    bool loopback = true;
    if (config_check_http(&cfg, path, &loopback, &eb) < 0) {
        log_error("%s", eb.msg);
        return SERVICE_EXIT_CONFIG;
    }
    char key[256] = "";
    if (cfg.http.api_key[0]) snprintf(key, sizeof key, "%s", cfg.http.api_key);
    else if (cfg.http.api_key_file[0] && s_read_key(cfg.http.api_key_file, key, sizeof key, &eb) < 0) {
        log_error("%s", eb.msg);
        return SERVICE_EXIT_CONFIG;
    }
    if (!loopback && !key[0])
        log_warn("[http] insecure = true: serving %s:%d without a key to anyone who can reach it", cfg.http.host, cfg.http.port);
    /* a connection is a descriptor: make room for max_connections of them */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    volatile sig_atomic_t *stop = service_signals();
    g_hm.t_start = strata_now();
    /* [http] threads workers, each a bridge and a daemon on the one listening socket, holding a
     * share of max_connections */
    int nw = cfg.http.threads;
    if (nw == 0) {
        cpu_set_t cs;
        int ncpu = sched_getaffinity(0, sizeof cs, &cs) == 0 ? CPU_COUNT(&cs) : 2;
        nw = ncpu / 2 < 1 ? 1 : ncpu / 2 > 8 ? 8 : ncpu / 2;
    }
    if (nw > cfg.http.max_connections) nw = cfg.http.max_connections;
    bridge_t *b[64] = {0};
    hserver_t *s[64] = {0};
    int lfd = -1;
    if ((rc = server_listen(&cfg, &lfd, &eb)) < 0) goto fail;
    for (int i = 0; i < nw; i++) {
        int share = cfg.http.max_connections / nw + (i < cfg.http.max_connections % nw);
        if ((rc = bridge_create(&cfg, i, share, &b[i], &eb)) < 0) goto fail;
        if ((rc = server_start(&cfg, b[i], key, lfd, share, &s[i], &eb)) < 0) goto fail;
    }
    close(lfd);
    lfd = -1;
    for (int i = 0; i < nw; i++)
        if ((rc = bridge_start(b[i], server_daemon(s[i]), &eb)) < 0) goto fail;
    log_info("serving http://%s%s%s:%d/v1 (%s; %d worker%s; router %s)", strchr(cfg.http.host, ':') ? "[" : "", cfg.http.host,
             strchr(cfg.http.host, ':') ? "]" : "", cfg.http.port, key[0] ? "API key required" : "no API key", nw, nw == 1 ? "" : "s",
             cfg.router.endpoint);
    /* ready once the router has answered (its model name is needed to serve), or after 3 s
     * without: the router may be down, and then /health says 503 */
    for (int i = 0; i < 60 && !*stop; i++) {
        bridge_info_t in;
        bridge_info(b[0], &in);
        if (in.reachable && in.model[0]) break;
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    notify_ready();
    rc = SERVICE_EXIT_OK;
    while (!*stop && rc == SERVICE_EXIT_OK) {
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
        for (int i = 0; i < nw; i++)
            if (bridge_dead(b[i])) {
                log_error("http worker %d stopped; exiting to be restarted", i);
                rc = SERVICE_EXIT_FAIL;
                break;
            }
        notify_watchdog();
    }
    service_stopping();
    s_stop(b, s, nw);
    return rc;
fail:
    log_error("%s", eb.msg[0] ? eb.msg : strata_strerror(rc));
    if (lfd >= 0) close(lfd);
    s_stop(b, s, nw);
    return rc == STRATA_EINVAL_INPUT ? SERVICE_EXIT_CONFIG : SERVICE_EXIT_FAIL;
}
