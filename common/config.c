/* config.c - the group config file (INI) parsed with inih, validated key by key.
 *
 * inih calls s_on_key for every "key = value"; the handler validates the value and on error
 * keeps the first message and returns 0. inih is set to stop at the first error and returns
 * its line number, so every error reads "FILE:LINE: [section] key: what is wrong". Checks that
 * span keys (backoff min <= max, endpoint lengths after {run_dir} substitution) run after
 * parsing and name the section and key.
 */
#include "common/config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <ini.h>
#include <limits.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/placement.h"

/* inih's line buffer is 200 bytes including "\r\n\0"; longer lines would be split silently,
 * so they are refused up front. */
#define CONFIG_MAX_LINE 196
#define CONFIG_MAX_FILE (1 << 20)

typedef struct {
    strata_config_t *c;
    char err[400];          /* first error, without file and line */
    bool saw_prefetcher;    /* the first [prefetcher.N] replaces the default list */
    bool saw_run_dir, saw_tokenizer;
} s_ctx_t;

void config_defaults(strata_config_t *c)
{
    memset(c, 0, sizeof *c);
    snprintf(c->name, sizeof c->name, "strata");
    /* run_dir and tokenizer are derived after parsing when not given */
    snprintf(c->router.endpoint, sizeof c->router.endpoint, "tcp://127.0.0.1:7757");
    c->router.max_frame_bytes = 1048576;
    c->router.max_queue = 1024;
    c->router.max_inflight_per_client = 64;
    snprintf(c->router.place.cpus, sizeof c->router.place.cpus, "0-1");
    c->router.place.numa_node = -1;

    snprintf(c->scheduler.endpoint, sizeof c->scheduler.endpoint, "ipc://{run_dir}/scheduler.sock");
    c->scheduler.max_batch_tokens = 256;
    c->scheduler.max_seqs = 64;
    c->scheduler.kv_blocks = 2048;
    c->scheduler.block_size = 16;
    c->scheduler.max_context = 0;
    c->scheduler.place.numa_node = -1;

    snprintf(c->executor.endpoint, sizeof c->executor.endpoint, "ipc://{run_dir}/executor.sock");
    snprintf(c->executor.backend, sizeof c->executor.backend, "cpu");
    c->executor.threads = 0;
    c->executor.gpu_mem = 0;
    c->executor.prefetch_depth = -1;
    snprintf(c->executor.expert_path, sizeof c->executor.expert_path, "auto");
    c->executor.cpu_expert_timeout_ms = 1000;
    c->executor.place.numa_node = -1;

    c->n_prefetchers = 1;
    c->prefetcher[0].node = 0;
    snprintf(c->prefetcher[0].endpoint, sizeof c->prefetcher[0].endpoint, "ipc://{run_dir}/prefetcher-0.sock");
    c->prefetcher[0].threads = 0;
    c->prefetcher[0].place.numa_node = 0;

    c->launcher.restart_backoff_ms = 200;
    c->launcher.restart_backoff_max_ms = 10000;
    c->launcher.ready_timeout_s = 60;
    c->launcher.watchdog_s = 30;

    c->http.enabled = false;
    snprintf(c->http.host, sizeof c->http.host, "127.0.0.1");
    c->http.port = 7758;
    c->http.max_body_bytes = 4 << 20;
    c->http.max_connections = 1024;
    c->http.timeout_s = 30;
    c->http.request_timeout_s = 600;
    c->http.threads = 0;
    c->http.place.numa_node = -1;
}

static int s_err(s_ctx_t *x, const char *section, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int s_err(s_ctx_t *x, const char *section, const char *key, const char *fmt, ...)
{
    if (x->err[0]) return 0;
    int n = snprintf(x->err, sizeof x->err, "[%s] %s: ", section, key);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(x->err + n, sizeof x->err - (size_t)n, fmt, ap);
    va_end(ap);
    return 0; /* inih: 0 = error */
}

static int s_int(s_ctx_t *x, const char *sec, const char *key, const char *v, long lo, long hi, int *out)
{
    char *end;
    errno = 0;
    long n = strtol(v, &end, 10);
    if (!*v || *end || errno)
        return s_err(x, sec, key, "'%s' is not an integer", v);
    if (n < lo || n > hi) return s_err(x, sec, key, "%ld is out of range [%ld, %ld]", n, lo, hi);
    *out = (int)n;
    return 1;
}

/* A byte count (strata_parse_bytes: K M G T, optionally B or iB) in [lo, hi]. */
static int s_bytes(s_ctx_t *x, const char *sec, const char *key, const char *v, int64_t lo, int64_t hi, int64_t *out)
{
    int64_t b;
    int r = strata_parse_bytes(v, &b);
    if (r == -ERANGE) return s_err(x, sec, key, "'%s' is too large", v);
    if (r < 0) return s_err(x, sec, key, "'%s' is not a byte count (e.g. 1048576, 512M, 16GiB)", v);
    if (b < lo || b > hi) return s_err(x, sec, key, "%lld bytes is out of range [%lld, %lld]", (long long)b, (long long)lo, (long long)hi);
    *out = b;
    return 1;
}

/* A host budget: a byte count (s_bytes, at least 1 MiB), or a fraction of the node's free
 * memory, "0.5" or "50%". One of *bytes, *frac is set, the other zeroed. */
static int s_host_mem(s_ctx_t *x, const char *sec, const char *key, const char *v, int64_t *bytes, double *frac)
{
    *bytes = 0;
    *frac = 0;
    char *end;
    errno = 0;
    double f = strtod(v, &end);
    bool pct = end != v && !strcmp(end, "%");
    if (pct || (end != v && !*end && strchr(v, '.'))) { /* "50%", "0.5"; "1.5G" is bytes */
        if (errno || !(f > 0) || f > (pct ? 100 : 1))
            return s_err(x, sec, key, "'%s' is neither a byte count (e.g. 16G) nor a fraction of free memory in (0, 1] "
                         "(e.g. 0.5 or 50%%)", v);
        *frac = pct ? f / 100 : f;
        return 1;
    }
    return s_bytes(x, sec, key, v, 1 << 20, INT64_MAX, bytes);
}

static int s_str(s_ctx_t *x, const char *sec, const char *key, const char *v, char *dst, size_t cap)
{
    size_t n = strlen(v);
    if (n >= cap) return s_err(x, sec, key, "value is %zu characters, at most %zu allowed", n, cap - 1);
    memcpy(dst, v, n + 1);
    return 1;
}

/* tcp://HOST:PORT (HOST a name, an address, [an IPv6 address] or *; PORT 1-65535) or ipc://PATH. */
static int s_endpoint(s_ctx_t *x, const char *sec, const char *key, const char *v, char *dst, size_t cap)
{
    if (strncmp(v, "tcp://", 6) && strncmp(v, "ipc://", 6))
        return s_err(x, sec, key, "'%s' must start with tcp:// or ipc://", v);
    if (strlen(v) <= 6) return s_err(x, sec, key, "'%s' has no address", v);
    if (!strncmp(v, "tcp://", 6)) {
        const char *host = v + 6, *colon = strrchr(host, ':');
        if (!colon || (host[0] == '[' && colon < strchr(host, ']')))
            return s_err(x, sec, key, "'%s' has no port (tcp://HOST:PORT)", v);
        if (colon == host) return s_err(x, sec, key, "'%s' has no host (tcp://HOST:PORT)", v);
        const char *port = colon + 1;
        char *end;
        errno = 0;
        long n = strtol(port, &end, 10);
        if (!*port || *end || errno || port[0] == '+' || port[0] == '-' || n < 1 || n > 65535)
            return s_err(x, sec, key, "'%s': the port must be a number in 1-65535, got '%s'", v, port);
    }
    return s_str(x, sec, key, v, dst, cap);
}

static int s_bool(s_ctx_t *x, const char *sec, const char *key, const char *v, bool *out)
{
    if (!strcmp(v, "true") || !strcmp(v, "yes") || !strcmp(v, "1")) *out = true;
    else if (!strcmp(v, "false") || !strcmp(v, "no") || !strcmp(v, "0")) *out = false;
    else return s_err(x, sec, key, "'%s' must be true or false", v);
    return 1;
}

static int s_place(s_ctx_t *x, const char *sec, const char *key, const char *v, config_placement_t *p, int *handled)
{
    *handled = 1;
    if (!strcmp(key, "cpus")) {
        cpu_set_t set;
        strata_errbuf_t eb = {{0}};
        if (cpulist_parse(v, &set, &eb) < 0) return s_err(x, sec, key, "%s", eb.msg);
        return s_str(x, sec, key, v, p->cpus, sizeof p->cpus);
    }
    if (!strcmp(key, "numa_node")) return s_int(x, sec, key, v, -1, 1023, &p->numa_node);
    *handled = 0;
    return 1;
}

static int s_name_ok(const char *v)
{
    if (!*v) return 0;
    for (const char *p = v; *p; p++) {
        char ch = *p;
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '-' || ch == '_' || ch == '.'))
            return 0;
    }
    return 1;
}

/* N of "prefetcher.N", or -1. */
static int s_prefetcher_node(const char *sec)
{
    const char *ns = sec + 11;
    char *end;
    errno = 0;
    long node = strtol(ns, &end, 10);
    if (!*ns || *end || errno || node < 0 || node > 1023 || (ns[0] == '0' && ns[1]) || ns[0] == '+' || ns[0] == ' ') return -1;
    return (int)node;
}

/* Index of node's prefetcher, added (with its defaults) if new; -1 if the list is full.
 * The first [prefetcher.N] replaces the default list (node 0). */
static int s_prefetcher_add(s_ctx_t *x, int node)
{
    strata_config_t *c = x->c;
    if (!x->saw_prefetcher) {
        x->saw_prefetcher = true;
        c->n_prefetchers = 0;
    }
    int i;
    for (i = 0; i < c->n_prefetchers; i++)
        if (c->prefetcher[i].node == node) return i;
    if (i == CONFIG_MAX_PREFETCHERS) return -1;
    c->n_prefetchers++;
    memset(&c->prefetcher[i], 0, sizeof c->prefetcher[i]);
    c->prefetcher[i].node = node;
    snprintf(c->prefetcher[i].endpoint, sizeof c->prefetcher[i].endpoint, "ipc://{run_dir}/prefetcher-%d.sock", node);
    c->prefetcher[i].place.numa_node = node;
    return i;
}

static int s_on_key(void *user, const char *sec, const char *key, const char *v)
{
    s_ctx_t *x = user;
    strata_config_t *c = x->c;
    int handled;
    if (!*sec) return s_err(x, "(none)", key, "key outside any section");

    if (!strcmp(sec, "group")) {
        if (!strcmp(key, "name")) {
            if (!s_name_ok(v) || strlen(v) > 40)
                return s_err(x, sec, key, "'%s' must be 1-40 characters of [A-Za-z0-9._-] (it names shm segments)", v);
            return s_str(x, sec, key, v, c->name, sizeof c->name);
        }
        if (!strcmp(key, "run_dir")) {
            if (!*v) return s_err(x, sec, key, "empty");
            x->saw_run_dir = true;
            return s_str(x, sec, key, v, c->run_dir, sizeof c->run_dir);
        }
        if (!strcmp(key, "model")) return s_str(x, sec, key, v, c->model, sizeof c->model);
        if (!strcmp(key, "tokenizer")) {
            x->saw_tokenizer = true;
            return s_str(x, sec, key, v, c->tokenizer, sizeof c->tokenizer);
        }
    } else if (!strcmp(sec, "router")) {
        if (!strcmp(key, "endpoint")) return s_endpoint(x, sec, key, v, c->router.endpoint, sizeof c->router.endpoint);
        if (!strcmp(key, "max_frame_bytes")) return s_bytes(x, sec, key, v, 64, 1 << 30, &c->router.max_frame_bytes);
        if (!strcmp(key, "max_queue")) return s_int(x, sec, key, v, 1, 1000000, &c->router.max_queue);
        if (!strcmp(key, "max_inflight_per_client")) return s_int(x, sec, key, v, 1, 1000000, &c->router.max_inflight_per_client);
        if (!strcmp(key, "curve_secret_key_file"))
            return s_str(x, sec, key, v, c->router.curve_secret_key_file, sizeof c->router.curve_secret_key_file);
        if (!strcmp(key, "curve_clients_file"))
            return s_str(x, sec, key, v, c->router.curve_clients_file, sizeof c->router.curve_clients_file);
        if (!strcmp(key, "insecure")) return s_bool(x, sec, key, v, &c->router.insecure);
        int r = s_place(x, sec, key, v, &c->router.place, &handled);
        if (handled) return r;
    } else if (!strcmp(sec, "scheduler")) {
        if (!strcmp(key, "endpoint")) return s_endpoint(x, sec, key, v, c->scheduler.endpoint, sizeof c->scheduler.endpoint);
        if (!strcmp(key, "max_batch_tokens")) return s_int(x, sec, key, v, 1, 1 << 20, &c->scheduler.max_batch_tokens);
        if (!strcmp(key, "max_seqs")) return s_int(x, sec, key, v, 1, 65536, &c->scheduler.max_seqs);
        if (!strcmp(key, "kv_blocks")) return s_int(x, sec, key, v, 1, 1 << 24, &c->scheduler.kv_blocks);
        if (!strcmp(key, "block_size")) return s_int(x, sec, key, v, 1, 4096, &c->scheduler.block_size);
        if (!strcmp(key, "max_context")) return s_int(x, sec, key, v, 0, 1 << 24, &c->scheduler.max_context);
        int r = s_place(x, sec, key, v, &c->scheduler.place, &handled);
        if (handled) return r;
    } else if (!strcmp(sec, "executor")) {
        if (!strcmp(key, "endpoint")) return s_endpoint(x, sec, key, v, c->executor.endpoint, sizeof c->executor.endpoint);
        if (!strcmp(key, "backend")) {
            if (strcmp(v, "cpu") && strcmp(v, "cuda")) return s_err(x, sec, key, "'%s' must be cpu or cuda", v);
            return s_str(x, sec, key, v, c->executor.backend, sizeof c->executor.backend);
        }
        if (!strcmp(key, "threads")) return s_int(x, sec, key, v, 0, 4096, &c->executor.threads);
        if (!strcmp(key, "cpu_act")) {
            if (strcmp(v, "f32") && strcmp(v, "q8")) return s_err(x, sec, key, "'%s' must be f32 or q8", v);
            return s_str(x, sec, key, v, c->executor.cpu_act, sizeof c->executor.cpu_act);
        }
        if (!strcmp(key, "gpu_mem")) return s_bytes(x, sec, key, v, 0, INT64_MAX, &c->executor.gpu_mem);
        if (!strcmp(key, "prefetch_depth")) return s_int(x, sec, key, v, -1, 64, &c->executor.prefetch_depth);
        if (!strcmp(key, "expert_cache")) {
            if (strcmp(v, "split") && strcmp(v, "whole")) return s_err(x, sec, key, "'%s' must be split or whole", v);
            return s_str(x, sec, key, v, c->executor.expert_cache, sizeof c->executor.expert_cache);
        }
        if (!strcmp(key, "expert_path")) {
            if (strcmp(v, "auto") && strcmp(v, "cpu") && strcmp(v, "pcie") && strcmp(v, "cost") && strcmp(v, "static"))
                return s_err(x, sec, key, "'%s' must be auto, cpu, pcie, cost or static", v);
            return s_str(x, sec, key, v, c->executor.expert_path, sizeof c->executor.expert_path);
        }
        if (!strcmp(key, "cpu_moe_layers")) return s_int(x, sec, key, v, 0, 4096, &c->executor.cpu_moe_layers);
        if (!strcmp(key, "cpu_expert_timeout_ms"))
            return s_int(x, sec, key, v, 1, 600000, &c->executor.cpu_expert_timeout_ms);
        int r = s_place(x, sec, key, v, &c->executor.place, &handled);
        if (handled) return r;
    } else if (!strncmp(sec, "prefetcher.", 11)) {
        int node = s_prefetcher_node(sec);
        if (node < 0) return s_err(x, sec, key, "section must be [prefetcher.N] with N a NUMA node number 0-1023");
        int i = s_prefetcher_add(x, node);
        if (i < 0) return s_err(x, sec, key, "more than %d prefetcher sections", CONFIG_MAX_PREFETCHERS);
        if (!strcmp(key, "endpoint")) return s_endpoint(x, sec, key, v, c->prefetcher[i].endpoint, sizeof c->prefetcher[i].endpoint);
        if (!strcmp(key, "threads")) return s_int(x, sec, key, v, 0, 4096, &c->prefetcher[i].threads);
        if (!strcmp(key, "host_mem"))
            return s_host_mem(x, sec, key, v, &c->prefetcher[i].host_mem, &c->prefetcher[i].host_mem_frac);
        int r = s_place(x, sec, key, v, &c->prefetcher[i].place, &handled);
        if (handled) return r;
    } else if (!strcmp(sec, "launcher")) {
        if (!strcmp(key, "restart_backoff_ms")) return s_int(x, sec, key, v, 1, 3600000, &c->launcher.restart_backoff_ms);
        if (!strcmp(key, "restart_backoff_max_ms")) return s_int(x, sec, key, v, 1, 3600000, &c->launcher.restart_backoff_max_ms);
        if (!strcmp(key, "ready_timeout_s")) return s_int(x, sec, key, v, 1, 86400, &c->launcher.ready_timeout_s);
        if (!strcmp(key, "watchdog_s")) return s_int(x, sec, key, v, 0, 86400, &c->launcher.watchdog_s);
    } else if (!strcmp(sec, "http")) {
        c->http.enabled = true;
        if (!strcmp(key, "host")) {
            if (!*v) return s_err(x, sec, key, "empty (use 127.0.0.1, ::1, 0.0.0.0 or a host name)");
            for (const char *p = v; *p; p++)
                if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '.' || *p == ':' ||
                      *p == '-' || *p == '_' || *p == '%'))
                    return s_err(x, sec, key, "'%s' is not an address or host name (no brackets, no port: port is its own key)", v);
            return s_str(x, sec, key, v, c->http.host, sizeof c->http.host);
        }
        if (!strcmp(key, "port")) return s_int(x, sec, key, v, 1, 65535, &c->http.port);
        if (!strcmp(key, "api_key")) {
            for (const char *p = v; *p; p++)
                if ((unsigned char)*p <= ' ' || (unsigned char)*p >= 0x7f)
                    return s_err(x, sec, key, "must be printable ASCII without spaces");
            return s_str(x, sec, key, v, c->http.api_key, sizeof c->http.api_key);
        }
        if (!strcmp(key, "api_key_file")) return s_str(x, sec, key, v, c->http.api_key_file, sizeof c->http.api_key_file);
        if (!strcmp(key, "insecure")) return s_bool(x, sec, key, v, &c->http.insecure);
        if (!strcmp(key, "max_body_bytes")) return s_bytes(x, sec, key, v, 1024, 1 << 30, &c->http.max_body_bytes);
        if (!strcmp(key, "max_connections")) return s_int(x, sec, key, v, 1, 65536, &c->http.max_connections);
        if (!strcmp(key, "timeout_s")) return s_int(x, sec, key, v, 1, 3600, &c->http.timeout_s);
        if (!strcmp(key, "request_timeout_s")) return s_int(x, sec, key, v, 1, 86400, &c->http.request_timeout_s);
        if (!strcmp(key, "model_name")) {
            for (const char *p = v; *p; p++)
                if ((unsigned char)*p < ' ' || *p == '"' || *p == '\\' || (unsigned char)*p == 0x7f)
                    return s_err(x, sec, key, "may not hold quotes, backslashes or control characters");
            return s_str(x, sec, key, v, c->http.model_name, sizeof c->http.model_name);
        }
        if (!strcmp(key, "threads")) return s_int(x, sec, key, v, 0, 64, &c->http.threads);
        int r = s_place(x, sec, key, v, &c->http.place, &handled);
        if (handled) return r;
    } else {
        return s_err(x, sec, key, "unknown section [%s] (known: group router scheduler executor prefetcher.N launcher http)", sec);
    }
    return s_err(x, sec, key, "unknown key");
}

/* Replace every "{run_dir}" in s (capacity cap) with run_dir. */
static int s_subst(char *s, size_t cap, const char *run_dir)
{
    char out[1024];
    size_t o = 0, rl = strlen(run_dir);
    for (const char *p = s; *p;) {
        if (!strncmp(p, "{run_dir}", 9)) {
            if (o + rl >= sizeof out) return -1;
            memcpy(out + o, run_dir, rl);
            o += rl;
            p += 9;
        } else {
            if (o + 1 >= sizeof out) return -1;
            out[o++] = *p++;
        }
    }
    if (o >= cap) return -1;
    memcpy(s, out, o);
    s[o] = 0;
    return 0;
}

/* After parsing: derived defaults, substitution and checks that span keys. */
static int s_finish(s_ctx_t *x, const char *name, strata_errbuf_t *eb)
{
    strata_config_t *c = x->c;
    if (!x->saw_run_dir) snprintf(c->run_dir, sizeof c->run_dir, "/tmp/strata-%s", c->name);
    if (!x->saw_tokenizer && c->model[0]) {
        if ((size_t)snprintf(c->tokenizer, sizeof c->tokenizer, "%s/tokenizer.json", c->model) >= sizeof c->tokenizer)
            return strata_seterr(eb, STRATA_EINVAL_INPUT, "%s: [group] model: path too long to derive tokenizer", name);
    }
    if (c->http.api_key[0] && c->http.api_key_file[0])
        return strata_seterr(eb, STRATA_EINVAL_INPUT, "%s: [http] api_key_file: give api_key or api_key_file, not both", name);
    if (c->router.curve_clients_file[0] && !c->router.curve_secret_key_file[0])
        return strata_seterr(eb, STRATA_EINVAL_INPUT, "%s: [router] curve_clients_file: needs curve_secret_key_file (the router's own "
                             "key, from `strata keygen`)", name);
    for (int i = 0; i < c->n_prefetchers; i++)
        if ((c->prefetcher[i].host_mem > 0 || c->prefetcher[i].host_mem_frac > 0) && !strcmp(c->executor.backend, "cuda"))
            return strata_seterr(eb, STRATA_EINVAL_INPUT,
                                 "%s: [prefetcher.%d] host_mem: the disk tier serves [executor] backend = cpu only (the GPU's "
                                 "expert cache copies from host memory); unset host_mem or use backend = cpu",
                                 name, c->prefetcher[i].node);
    if (c->launcher.restart_backoff_max_ms < c->launcher.restart_backoff_ms)
        return strata_seterr(eb, STRATA_EINVAL_INPUT, "%s: [launcher] restart_backoff_max_ms: %d is less than restart_backoff_ms %d",
                             name, c->launcher.restart_backoff_max_ms, c->launcher.restart_backoff_ms);
    struct {
        const char *sec;
        char *ep;
        size_t cap;
    } eps[3 + CONFIG_MAX_PREFETCHERS];
    int n = 0;
    eps[n++] = (typeof(eps[0])){"router", c->router.endpoint, sizeof c->router.endpoint};
    eps[n++] = (typeof(eps[0])){"scheduler", c->scheduler.endpoint, sizeof c->scheduler.endpoint};
    eps[n++] = (typeof(eps[0])){"executor", c->executor.endpoint, sizeof c->executor.endpoint};
    char pf_names[CONFIG_MAX_PREFETCHERS][24];
    for (int i = 0; i < c->n_prefetchers; i++) {
        snprintf(pf_names[i], sizeof pf_names[i], "prefetcher.%d", c->prefetcher[i].node);
        eps[n++] = (typeof(eps[0])){pf_names[i], c->prefetcher[i].endpoint, sizeof c->prefetcher[i].endpoint};
    }
    for (int i = 0; i < n; i++) {
        if (s_subst(eps[i].ep, eps[i].cap, c->run_dir) < 0)
            return strata_seterr(eb, STRATA_EINVAL_INPUT, "%s: [%s] endpoint: too long after replacing {run_dir}", name, eps[i].sec);
        /* an ipc:// endpoint is a unix socket path: at most 107 bytes (sun_path) */
        if (!strncmp(eps[i].ep, "ipc://", 6) && strlen(eps[i].ep + 6) > 107)
            return strata_seterr(eb, STRATA_EINVAL_INPUT, "%s: [%s] endpoint: ipc path '%s' is longer than 107 bytes (shorten run_dir)",
                                 name, eps[i].sec, eps[i].ep + 6);
        for (int j = 0; j < i; j++)
            if (!strcmp(eps[i].ep, eps[j].ep))
                return strata_seterr(eb, STRATA_EINVAL_INPUT, "%s: [%s] endpoint: '%s' is also [%s]'s endpoint", name, eps[i].sec,
                                     eps[i].ep, eps[j].sec);
    }
    return 0;
}

int config_check_paths(const strata_config_t *c, const char *name, strata_errbuf_t *eb)
{
    const char *secs[3 + CONFIG_MAX_PREFETCHERS];
    const char *eps[3 + CONFIG_MAX_PREFETCHERS];
    char pf[CONFIG_MAX_PREFETCHERS][24];
    int n = 0;
    secs[n] = "router", eps[n++] = c->router.endpoint;
    secs[n] = "scheduler", eps[n++] = c->scheduler.endpoint;
    secs[n] = "executor", eps[n++] = c->executor.endpoint;
    for (int i = 0; i < c->n_prefetchers; i++) {
        snprintf(pf[i], sizeof pf[i], "prefetcher.%d", c->prefetcher[i].node);
        secs[n] = pf[i], eps[n++] = c->prefetcher[i].endpoint;
    }
    for (int i = 0; i < n; i++) {
        if (strncmp(eps[i], "ipc://", 6)) continue;
        char dir[PATH_MAX];
        snprintf(dir, sizeof dir, "%s", eps[i] + 6);
        char *slash = strrchr(dir, '/');
        if (!slash) snprintf(dir, sizeof dir, ".");
        else if (slash == dir) dir[1] = 0;
        else *slash = 0;
        if (!strcmp(dir, c->run_dir)) continue; /* strata up makes it, and checks it */
        struct stat st;
        if (stat(dir, &st) < 0)
            return strata_seterr(eb, STRATA_EINVAL_INPUT, "%s: [%s] endpoint: the directory %s of '%s': %s", name, secs[i], dir,
                                 eps[i], strerror(errno));
        if (!S_ISDIR(st.st_mode))
            return strata_seterr(eb, STRATA_EINVAL_INPUT, "%s: [%s] endpoint: %s (of '%s') is not a directory", name, secs[i],
                                 dir, eps[i]);
        if (st.st_uid != geteuid())
            return strata_seterr(eb, STRATA_EINVAL_INPUT, "%s: [%s] endpoint: the directory %s of '%s' is owned by uid %u, not by "
                                 "this user (uid %u)", name, secs[i], dir, eps[i], (unsigned)st.st_uid, (unsigned)geteuid());
    }
    return 0;
}

int config_check_http(const strata_config_t *c, const char *name, bool *loopback, strata_errbuf_t *eb)
{
    if (loopback) *loopback = true;
    if (!c->http.enabled) return 0;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *res = NULL;
    int g = getaddrinfo(c->http.host, NULL, &hints, &res);
    if (g != 0)
        return strata_seterr(eb, STRATA_EINVAL_INPUT, "%s: [http] host: cannot resolve '%s': %s", name, c->http.host, gai_strerror(g));
    bool lo = true;
    for (const struct addrinfo *a = res; a; a = a->ai_next) {
        if (a->ai_family == AF_INET) {
            const struct sockaddr_in *s4 = (const struct sockaddr_in *)a->ai_addr;
            lo &= (ntohl(s4->sin_addr.s_addr) >> 24) == 127;
        } else if (a->ai_family == AF_INET6) {
            const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)a->ai_addr;
            lo &= IN6_IS_ADDR_LOOPBACK(&s6->sin6_addr);
        } else {
            lo = false;
        }
    }
    freeaddrinfo(res);
    if (loopback) *loopback = lo;
    if (!lo && !c->http.api_key[0] && !c->http.api_key_file[0] && !c->http.insecure)
        return strata_seterr(eb, STRATA_EINVAL_INPUT,
                             "%s: [http] host = %s is not a loopback address and no key is set: set api_key or api_key_file "
                             "(clients then send 'Authorization: Bearer KEY'), or insecure = true to serve it to anyone who "
                             "can reach it", name, c->http.host);
    return 0;
}

/* Whether every address of host (an address, [an IPv6 address], *, a network interface or a
 * name) is loopback. 0, or STRATA_EINVAL_INPUT when host is none of these. */
static int s_host_loopback(const char *host, bool *lo)
{
    char h[256];
    size_t n = strlen(host);
    if (n >= sizeof h) return STRATA_EINVAL_INPUT;
    memcpy(h, host, n + 1);
    if (n >= 2 && h[0] == '[' && h[n - 1] == ']') {
        memmove(h, h + 1, n - 2);
        h[n - 2] = 0;
    }
    *lo = false;
    if (!strcmp(h, "*")) return 0;
    struct in_addr a4;
    struct in6_addr a6;
    if (inet_pton(AF_INET, h, &a4) == 1) {
        *lo = (ntohl(a4.s_addr) >> 24) == 127;
        return 0;
    }
    if (inet_pton(AF_INET6, h, &a6) == 1) {
        *lo = IN6_IS_ADDR_LOOPBACK(&a6) || (IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127);
        return 0;
    }
    /* ZeroMQ binds a network interface by name (tcp://eth0:7757): loopback if it is the
     * loopback interface */
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) == 0) {
        bool found = false, all_lo = true;
        for (const struct ifaddrs *i = ifs; i; i = i->ifa_next)
            if (i->ifa_name && !strcmp(i->ifa_name, h)) {
                found = true;
                all_lo &= (i->ifa_flags & IFF_LOOPBACK) != 0;
            }
        freeifaddrs(ifs);
        if (found) {
            *lo = all_lo;
            return 0;
        }
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    if (getaddrinfo(h, NULL, &hints, &res) != 0) return STRATA_EINVAL_INPUT;
    bool all = true;
    for (const struct addrinfo *a = res; a; a = a->ai_next) {
        if (a->ai_family == AF_INET)
            all &= (ntohl(((const struct sockaddr_in *)a->ai_addr)->sin_addr.s_addr) >> 24) == 127;
        else if (a->ai_family == AF_INET6)
            all &= IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)a->ai_addr)->sin6_addr);
        else
            all = false;
    }
    freeaddrinfo(res);
    *lo = all;
    return 0;
}

int config_check_router(const strata_config_t *c, const char *name, bool *loopback, strata_errbuf_t *eb)
{
    if (loopback) *loopback = true;
    const char *ep = c->router.endpoint;
    if (strncmp(ep, "tcp://", 6)) return 0; /* ipc://: a socket file in a directory of this user's */
    char host[256];
    const char *colon = strrchr(ep + 6, ':');
    size_t hl = colon ? (size_t)(colon - (ep + 6)) : strlen(ep + 6);
    if (hl >= sizeof host)
        return strata_seterr(eb, STRATA_EINVAL_INPUT, "%s: [router] endpoint %s: host too long", name, ep);
    memcpy(host, ep + 6, hl);
    host[hl] = 0;
    bool lo = false;
    if (s_host_loopback(host, &lo) < 0)
        return strata_seterr(eb, STRATA_EINVAL_INPUT, "%s: [router] endpoint %s: '%s' is not an address, a network interface or "
                             "a host name this host resolves", name, ep, host);
    if (loopback) *loopback = lo;
    if (!lo && !c->router.curve_secret_key_file[0] && !c->router.insecure)
        return strata_seterr(eb, STRATA_EINVAL_INPUT,
                             "%s: [router] endpoint = %s is not a loopback address and CURVE is not set up: set "
                             "curve_secret_key_file (a secret key of `strata keygen`; clients then need its public key) and "
                             "curve_clients_file (the public keys of the clients to serve), or insecure = true to serve it "
                             "to anyone who can reach it", name, ep);
    return 0;
}

/* ZeroMQ's Z85 alphabet (ZeroMQ RFC 32): character i has the value i. */
static const char s_z85_chars[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";

int config_z85_key_ok(const char *s, size_t len)
{
    if (len != CONFIG_CURVE_KEY_LEN) return 0;
    for (size_t g = 0; g < len; g += 5) {
        uint64_t v = 0;
        for (size_t i = g; i < g + 5; i++) {
            const char *p = s[i] ? strchr(s_z85_chars, s[i]) : NULL;
            if (!p) return 0;
            v = v * 85 + (uint64_t)(p - s_z85_chars);
        }
        if (v > 0xffffffffu) return 0;
    }
    return 1;
}

/* Read a small file for the CURVE keys, checking the descriptor it was read from: secret, no
 * other user may read it; else no other user may write it (owned by this user or root, not
 * group- or world-writable). *out malloc'd, NUL-terminated. */
static int s_read_trusted(const char *path, bool secret, const char *what, size_t max, char **out, strata_errbuf_t *eb)
{
    int rc = 0;
    char *buf = NULL;
    struct stat st;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return strata_seterr(eb, STRATA_EINVAL_INPUT, "%s %s: %s", what, path, strerror(errno));
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || (size_t)st.st_size > max) {
        rc = strata_seterr(eb, STRATA_EINVAL_INPUT, "%s %s: not a regular file of at most %zu bytes", what, path, max);
        goto fail;
    }
    if (secret && (st.st_mode & 077)) {
        rc = strata_seterr(eb, STRATA_EINVAL_INPUT, "%s %s: mode %03o lets other users read it; chmod 600 it", what, path,
                           (unsigned)(st.st_mode & 0777));
        goto fail;
    }
    if (!secret && ((st.st_uid != geteuid() && st.st_uid != 0) || (st.st_mode & 022))) {
        rc = strata_seterr(eb, STRATA_EINVAL_INPUT, "%s %s: owned by uid %u with mode %03o, so another user may change it; it must "
                           "be this user's (uid %u) or root's and not writable by group or others", what, path,
                           (unsigned)st.st_uid, (unsigned)(st.st_mode & 0777), (unsigned)geteuid());
        goto fail;
    }
    buf = malloc((size_t)st.st_size + 1);
    if (!buf) {
        rc = STRATA_ENOMEM;
        goto fail;
    }
    size_t got = 0;
    while (got < (size_t)st.st_size) {
        ssize_t r = read(fd, buf + got, (size_t)st.st_size - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            rc = strata_seterr(eb, STRATA_EIO, "%s %s: read failed: %s", what, path, r < 0 ? strerror(errno) : "short read");
            goto fail;
        }
        got += (size_t)r;
    }
    buf[got] = 0;
    if (memchr(buf, 0, got)) {
        rc = strata_seterr(eb, STRATA_EINVAL_INPUT, "%s %s: contains a NUL byte", what, path);
        goto fail;
    }
    close(fd);
    *out = buf;
    return 0;
fail:
    free(buf);
    close(fd);
    return rc;
}

/* The next line of *p (without its end of line, trailing blanks cut; leading blanks skipped):
 * NULL at the end. Lines are cut in place. */
static char *s_next_line(char **p)
{
    if (!**p) return NULL;
    char *l = *p, *nl = strchr(l, '\n');
    if (nl) {
        *nl = 0;
        *p = nl + 1;
    } else {
        *p = l + strlen(l);
    }
    while (*l == ' ' || *l == '\t') l++;
    size_t n = strlen(l);
    while (n && (l[n - 1] == ' ' || l[n - 1] == '\t' || l[n - 1] == '\r')) l[--n] = 0;
    return l;
}

int config_read_curve_key(const char *path, bool secret, const char *what, char out[CONFIG_CURVE_KEY_LEN + 1], strata_errbuf_t *eb)
{
    char *text = NULL;
    int rc = s_read_trusted(path, secret, what, 4096, &text, eb);
    if (rc < 0) return rc;
    size_t tl = strlen(text);
    char *p = text, *l, *key = NULL;
    int lineno = 0, keyline = 0;
    while ((l = s_next_line(&p))) {
        lineno++;
        if (!*l || *l == '#') continue;
        if (key) {
            rc = strata_seterr(eb, STRATA_EINVAL_INPUT, "%s %s:%d: a second key (the file holds one key; lines starting with '#' "
                               "are comments)", what, path, lineno);
            goto fail;
        }
        key = l;
        keyline = lineno;
    }
    if (!key) {
        rc = strata_seterr(eb, STRATA_EINVAL_INPUT, "%s %s: no key in it (one line of %d Z85 characters, as `strata keygen` writes)",
                           what, path, CONFIG_CURVE_KEY_LEN);
        goto fail;
    }
    if (!config_z85_key_ok(key, strlen(key))) {
        rc = strata_seterr(eb, STRATA_EINVAL_INPUT, "%s %s:%d: not a CURVE key (%d Z85 characters, as `strata keygen` writes)", what,
                           path, keyline, CONFIG_CURVE_KEY_LEN);
        goto fail;
    }
    memcpy(out, key, CONFIG_CURVE_KEY_LEN + 1);
fail:
    explicit_bzero(text, tl);
    free(text);
    return rc;
}

int config_read_curve_clients(const char *path, config_curve_client_t **out, int *n_out, strata_errbuf_t *eb)
{
    *out = NULL;
    *n_out = 0;
    char *text = NULL;
    int rc = s_read_trusted(path, false, "[router] curve_clients_file", 16u << 20, &text, eb);
    if (rc < 0) return rc;
    config_curve_client_t *v = NULL;
    size_t cap = 0;
    int n = 0, lineno = 0;
    char *p = text, *l;
    while ((l = s_next_line(&p))) {
        lineno++;
        if (!*l || *l == '#') continue;
        size_t kl = strcspn(l, " \t");
        if (!config_z85_key_ok(l, kl)) {
            rc = strata_seterr(eb, STRATA_EINVAL_INPUT, "[router] curve_clients_file %s:%d: not a public key (%d Z85 characters, "
                               "then optionally a name)", path, lineno, CONFIG_CURVE_KEY_LEN);
            goto fail;
        }
        if (n == CONFIG_MAX_CURVE_CLIENTS) {
            rc = strata_seterr(eb, STRATA_EINVAL_INPUT, "[router] curve_clients_file %s:%d: more than %d keys", path, lineno,
                               CONFIG_MAX_CURVE_CLIENTS);
            goto fail;
        }
        if (strata_grow(&v, &cap, (size_t)n, sizeof *v, 16) < 0) {
            rc = STRATA_ENOMEM;
            goto fail;
        }
        memcpy(v[n].key, l, CONFIG_CURVE_KEY_LEN);
        v[n].key[CONFIG_CURVE_KEY_LEN] = 0;
        const char *nm = l + kl;
        while (*nm == ' ' || *nm == '\t') nm++;
        snprintf(v[n].name, sizeof v[n].name, "%s", nm);
        for (char *q = v[n].name; *q; q++)
            if ((unsigned char)*q < ' ' || (unsigned char)*q == 0x7f) *q = '?';
        n++;
    }
    free(text);
    *out = v;
    *n_out = n;
    return 0;
fail:
    free(v);
    free(text);
    return rc;
}

int config_parse(strata_config_t *c, const char *text, const char *name, strata_errbuf_t *eb)
{
    s_ctx_t x = {.c = c};
    config_defaults(c);
    if (!name) name = "(config)";
    /* One pass before inih: refuse lines inih would split, and check section headers here
     * because inih reports a section only through its keys (an empty [prefetcher.1] would
     * otherwise vanish, and a misspelt empty section would pass). */
    int line = 1;
    for (const char *p = text; *p; line++) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        if (len > CONFIG_MAX_LINE)
            return strata_seterr(eb, STRATA_EINVAL_INPUT, "%s:%d: line longer than %d characters", name, line, CONFIG_MAX_LINE);
        const char *q = p;
        if (line == 1 && !strncmp(q, "\xEF\xBB\xBF", 3)) q += 3;
        while (q < p + len && (*q == ' ' || *q == '\t' || *q == '\r')) q++;
        if (q < p + len && *q == '[') {
            const char *close = memchr(q, ']', (size_t)(p + len - q));
            if (close) {
                char sec[CONFIG_MAX_LINE + 1];
                size_t sl = (size_t)(close - q - 1);
                memcpy(sec, q + 1, sl);
                sec[sl] = 0;
                static const char *known[] = {"group", "router", "scheduler", "executor", "launcher", "http"};
                bool ok = false;
                for (size_t k = 0; k < sizeof known / sizeof known[0]; k++) ok |= !strcmp(sec, known[k]);
                if (!strcmp(sec, "http")) c->http.enabled = true; /* an empty [http] serves with the defaults */
                if (!ok && !strncmp(sec, "prefetcher.", 11)) {
                    int node = s_prefetcher_node(sec);
                    if (node < 0)
                        return strata_seterr(eb, STRATA_EINVAL_INPUT, "%s:%d: [%s]: section must be [prefetcher.N] with N a NUMA node number 0-1023",
                                             name, line, sec);
                    if (s_prefetcher_add(&x, node) < 0)
                        return strata_seterr(eb, STRATA_EINVAL_INPUT, "%s:%d: [%s]: more than %d prefetcher sections", name, line, sec,
                                             CONFIG_MAX_PREFETCHERS);
                    ok = true;
                }
                if (!ok)
                    return strata_seterr(eb, STRATA_EINVAL_INPUT,
                                         "%s:%d: [%s]: unknown section (known: group router scheduler executor prefetcher.N launcher http)",
                                         name, line, sec);
            }
        }
        if (!nl) break;
        p = nl + 1;
    }
    /* inih settings (process-wide; config parsing happens at start-up, single-threaded) */
    ini_stop_on_first_error = true;
    ini_allow_multiline = false;
    int r = ini_parse_string(text, s_on_key, &x);
    if (r != 0) {
        if (r < 0) return strata_seterr(eb, STRATA_ENOMEM, "%s: parser failed (%d)", name, r);
        if (x.err[0]) return strata_seterr(eb, STRATA_EINVAL_INPUT, "%s:%d: %s", name, r, x.err);
        return strata_seterr(eb, STRATA_EINVAL_INPUT, "%s:%d: syntax error (expected [section] or key = value)", name, r);
    }
    return s_finish(&x, name, eb);
}

int config_load(strata_config_t *c, const char *path, strata_errbuf_t *eb)
{
    int rc;
    char *text = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) {
        rc = -errno;
        config_defaults(c);
        return strata_seterr(eb, rc, "%s: cannot open config: %s", path, strerror(-rc));
    }
    text = malloc(CONFIG_MAX_FILE + 1);
    if (!text) {
        rc = STRATA_ENOMEM;
        goto fail;
    }
    size_t n = fread(text, 1, CONFIG_MAX_FILE + 1, f);
    if (ferror(f)) {
        rc = strata_seterr(eb, STRATA_EIO, "%s: read error", path);
        goto fail;
    }
    if (n > CONFIG_MAX_FILE) {
        rc = strata_seterr(eb, STRATA_ETOOLARGE, "%s: config larger than %d bytes", path, CONFIG_MAX_FILE);
        goto fail;
    }
    if (memchr(text, 0, n)) {
        rc = strata_seterr(eb, STRATA_EINVAL_INPUT, "%s: config contains a NUL byte", path);
        goto fail;
    }
    text[n] = 0;
    rc = config_parse(c, text, path, eb);
fail:
    free(text);
    fclose(f);
    return rc;
}
