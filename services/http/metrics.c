/* metrics.c - GET /metrics: the Prometheus text format (version 0.0.4) from three sources:
 * this process's counters (g_hm), the router's `stats` reply (router.*, scheduler.* and
 * scheduler.executor.*, with the router's latency histograms router.hist.NAME.le.BOUND) and the
 * launcher's state file (per-service restarts). Names follow Prometheus' conventions:
 * strata_..._total for counters, strata_..._seconds for times; figures the group does not have
 * (an expert cache on the CPU backend) are left out rather than shown as 0. Every router and
 * scheduler figure without a name of its own below is still exported, as an untyped
 * strata_router_X / strata_scheduler_X / strata_executor_X. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "services/http/http.h"
#include "services/strata/group_state.h"

typedef struct {
    char *const *names;
    const double *vals;
    int n;
    bool *used;                   /* [n] exported under a name of its own */
} stats_t;

static int s_idx(const stats_t *s, const char *name)
{
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->names[i], name)) return i;
    return -1;
}

/* The value of name, marking it used; false when absent. */
static bool s_get(const stats_t *s, const char *name, double *v)
{
    int i = s_idx(s, name);
    if (i < 0) return false;
    s->used[i] = true;
    *v = s->vals[i];
    return true;
}

static void s_num(FILE *f, double v)
{
    if (isnan(v)) fputs("NaN", f);
    else if (isinf(v)) fputs(v > 0 ? "+Inf" : "-Inf", f);
    else if (v == floor(v) && fabs(v) < 1e15) fprintf(f, "%.0f", v);
    else fprintf(f, "%.17g", v);
}

static void s_head(FILE *f, const char *name, const char *type, const char *help)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void s_one(FILE *f, const char *name, const char *type, const char *help, double v)
{
    s_head(f, name, type, help);
    fprintf(f, "%s ", name);
    s_num(f, v);
    fputc('\n', f);
}

/* A figure of the stats under a name of its own, if present. */
static void s_stat(FILE *f, const stats_t *s, const char *stat, const char *name, const char *type, const char *help, double scale)
{
    double v;
    if (s_get(s, stat, &v)) s_one(f, name, type, help, v * scale);
}

/* router.hist.<h>.le.<bound> (cumulative counts), .sum (seconds) and .count as a histogram. */
static void s_hist(FILE *f, const stats_t *s, const char *h, const char *name, const char *help)
{
    char pre[96], key[128];
    snprintf(pre, sizeof pre, "router.hist.%s.le.", h);
    size_t pl = strlen(pre);
    double count, sum;
    snprintf(key, sizeof key, "router.hist.%s.count", h);
    if (!s_get(s, key, &count)) return;
    snprintf(key, sizeof key, "router.hist.%s.sum", h);
    if (!s_get(s, key, &sum)) sum = 0;
    s_head(f, name, "histogram", help);
    for (int i = 0; i < s->n; i++) {
        if (strncmp(s->names[i], pre, pl)) continue;
        s->used[i] = true;
        fprintf(f, "%s_bucket{le=\"%s\"} ", name, s->names[i] + pl);
        s_num(f, s->vals[i]);
        fputc('\n', f);
    }
    fprintf(f, "%s_bucket{le=\"+Inf\"} ", name);
    s_num(f, count);
    fprintf(f, "\n%s_sum ", name);
    s_num(f, sum);
    fprintf(f, "\n%s_count ", name);
    s_num(f, count);
    fputc('\n', f);
}

/* The rest of the stats, untyped: "router.x" -> strata_router_x. */
static void s_rest(FILE *f, const stats_t *s)
{
    for (int i = 0; i < s->n; i++) {
        if (s->used[i]) continue;
        const char *n = s->names[i];
        char name[200];
        if (!strncmp(n, "scheduler.executor.", 19)) snprintf(name, sizeof name, "strata_executor_%s", n + 19);
        else snprintf(name, sizeof name, "strata_%s", n);
        for (char *p = name; *p; p++)
            if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '_')) *p = '_';
        bool dup = false;
        for (int j = 0; j < i && !dup; j++) dup = !s->used[j] && !strcmp(s->names[j], n);
        if (dup) continue;
        fprintf(f, "# TYPE %s untyped\n%s ", name, name);
        s_num(f, s->vals[i]);
        fputc('\n', f);
    }
}

static void s_http(FILE *f, const bridge_info_t *info)
{
    s_head(f, "strata_http_requests_total", "counter", "HTTP requests answered, by route and status");
    for (int r = 0; r < HM_N_ROUTES; r++)
        for (int st = 0; st < HM_N_STATUS; st++) {
            uint64_t v = atomic_load_explicit(&g_hm.requests[r][st], memory_order_relaxed);
            if (v || (st == HM_S_2XX && r < HM_R_OTHER))
                fprintf(f, "strata_http_requests_total{route=\"%s\",status=\"%s\"} %llu\n", g_hm_routes[r], g_hm_status[st],
                        (unsigned long long)v);
        }
    uint64_t errors = 0;
    for (int r = 0; r < HM_N_ROUTES; r++)
        for (int st = 1; st < HM_N_STATUS; st++) errors += atomic_load_explicit(&g_hm.requests[r][st], memory_order_relaxed);
    s_one(f, "strata_http_errors_total", "counter", "HTTP requests answered with an error status", (double)errors);
    s_one(f, "strata_http_client_disconnects_total", "counter", "Requests canceled upstream because the client went away",
          (double)atomic_load(&g_hm.client_gone));
    s_one(f, "strata_http_request_timeouts_total", "counter", "Requests canceled at [http] request_timeout_s",
          (double)atomic_load(&g_hm.timeouts));
    s_one(f, "strata_http_router_resumes_total", "counter", "Requests resumed after a router restart",
          (double)atomic_load(&g_hm.router_resumes));
    s_one(f, "strata_http_prompt_tokens_total", "counter", "Prompt tokens of the requests served over HTTP",
          (double)atomic_load(&g_hm.prompt_tokens));
    s_one(f, "strata_http_completion_tokens_total", "counter", "Generated tokens of the requests served over HTTP",
          (double)atomic_load(&g_hm.completion_tokens));
    s_one(f, "strata_http_open_connections", "gauge", "HTTP connections open now", (double)atomic_load(&g_hm.open_connections));
    s_one(f, "strata_http_uptime_seconds", "gauge", "Seconds since this strata-http started", strata_now() - g_hm.t_start);
    s_one(f, "strata_up", "gauge", "1 when the router answers and hears from its scheduler", info->ok ? 1 : 0);
}

static void s_group(FILE *f, const stats_t *s)
{
    double a, b;
    s_stat(f, s, "router.generate", "strata_requests_total", "counter", "Generate requests the router received", 1);
    s_stat(f, s, "router.done", "strata_requests_finished_total", "counter", "Requests the router finished with a done", 1);
    s_stat(f, s, "router.errors", "strata_request_errors_total", "counter", "Error replies the router sent", 1);
    s_stat(f, s, "router.busy", "strata_requests_busy_total", "counter", "Requests the router refused as busy", 1);
    s_stat(f, s, "router.canceled", "strata_requests_canceled_total", "counter", "Requests canceled (cancel or client gone)", 1);
    s_stat(f, s, "router.tokens_out", "strata_generation_tokens_total", "counter", "Generated tokens the router streamed", 1);
    s_stat(f, s, "router.inflight", "strata_router_inflight_requests", "gauge", "Requests in flight at the router", 1);
    s_stat(f, s, "router.uptime_s", "strata_router_uptime_seconds", "gauge", "Seconds since the router started", 1);
    s_stat(f, s, "scheduler.prefill_tokens", "strata_prefill_tokens_total", "counter", "Prompt tokens computed (replays included)", 1);
    s_stat(f, s, "scheduler.running", "strata_running_sequences", "gauge", "Sequences running in the batch", 1);
    s_stat(f, s, "scheduler.waiting", "strata_waiting_sequences", "gauge", "Sequences waiting for admission", 1);
    s_stat(f, s, "scheduler.steps", "strata_steps_total", "counter", "Steps the scheduler planned", 1);
    s_stat(f, s, "scheduler.preemptions", "strata_preemptions_total", "counter", "Sequences preempted for KV blocks", 1);
    if (s_get(s, "scheduler.kv_blocks", &a) && s_get(s, "scheduler.kv_blocks_free", &b)) {
        s_one(f, "strata_kv_blocks", "gauge", "KV cache blocks", a);
        s_one(f, "strata_kv_blocks_in_use", "gauge", "KV cache blocks in use", a - b);
        s_one(f, "strata_kv_cache_usage_ratio", "gauge", "Share of the KV cache blocks in use", a > 0 ? (a - b) / a : 0);
    }
    /* a model with sliding-window layers: the blocks of its window tables (within those in use) */
    if (s_get(s, "scheduler.kv_sliding_window", &a) && a > 0 && s_get(s, "scheduler.kv_win_blocks_used", &b))
        s_one(f, "strata_kv_window_blocks_in_use", "gauge", "KV cache blocks the sliding-window layers hold", b);
    s_stat(f, s, "scheduler.executor_restarts", "strata_executor_restarts_seen_total", "counter", "Executor restarts the scheduler saw", 1);
    double hits, misses;
    if (s_get(s, "scheduler.executor.hits", &hits) && s_get(s, "scheduler.executor.misses", &misses)) {
        s_one(f, "strata_expert_cache_hits_total", "counter", "Routed experts found in GPU memory", hits);
        s_one(f, "strata_expert_cache_misses_total", "counter", "Routed experts not in GPU memory", misses);
        s_one(f, "strata_expert_cache_hit_rate", "gauge", "Expert cache hits over hits and misses", hits + misses > 0 ? hits / (hits + misses) : 0);
        s_get(s, "scheduler.executor.hit_rate", &a);
    }
    if (s_get(s, "scheduler.executor.prefetches", &a) && s_get(s, "scheduler.executor.prefetch_used", &b)) {
        s_one(f, "strata_prefetches_total", "counter", "Experts prefetched from the prediction", a);
        s_one(f, "strata_prefetches_used_total", "counter", "Prefetched experts that their layer then used", b);
        s_one(f, "strata_prefetch_accuracy", "gauge", "Prefetched experts used over prefetched", a > 0 ? b / a : 0);
    }
    double fwd;
    if (s_get(s, "scheduler.executor.bytes_h2d", &a)) {
        s_one(f, "strata_pcie_h2d_bytes_total", "counter", "Bytes copied host to GPU (rate() gives the bandwidth)", a);
        if (s_get(s, "scheduler.executor.forward_us_total", &fwd))
            s_one(f, "strata_pcie_h2d_gbps", "gauge", "Host-to-GPU GB/s over the executor's forward time", fwd > 0 ? a / (fwd * 1e-6) / 1e9 : 0);
    }
    if (s_get(s, "scheduler.executor.cpu_expert_uses", &a)) {
        double gpu = 0, h = 0, m = 0;
        if (s_get(s, "scheduler.executor.hits", &h) && s_get(s, "scheduler.executor.misses", &m)) gpu = h + m;
        s_one(f, "strata_cpu_expert_uses_total", "counter", "Experts computed on a prefetcher's cores", a);
        if (gpu > 0) s_one(f, "strata_cpu_expert_share", "gauge", "Share of routed experts computed on prefetcher cores", a / (a + gpu));
    }
    s_hist(f, s, "ttft_s", "strata_time_to_first_token_seconds", "Time from a request's arrival at the router to its first token");
    s_hist(f, s, "itl_s", "strata_inter_token_latency_seconds", "Time between a request's successive tokens at the router");
    s_hist(f, s, "queue_s", "strata_request_queue_time_seconds", "Time a request waited before its first step");
    s_hist(f, s, "e2e_s", "strata_e2e_request_latency_seconds", "Time from a request's arrival at the router to its done");
}

static void s_services(FILE *f, const strata_config_t *cfg)
{
    gs_state_t *st = calloc(1, sizeof *st);
    if (!st) return;
    if (gs_read(cfg->run_dir, st, NULL) == 0) {
        s_head(f, "strata_service_restarts_total", "counter", "Restarts of each service by the launcher");
        for (int i = 0; i < st->n; i++) fprintf(f, "strata_service_restarts_total{service=\"%s\"} %d\n", st->svc[i].name, st->svc[i].restarts);
        s_head(f, "strata_service_ready", "gauge", "1 while the launcher counts the service as ready");
        for (int i = 0; i < st->n; i++) fprintf(f, "strata_service_ready{service=\"%s\"} %d\n", st->svc[i].name, !strcmp(st->svc[i].state, "ready"));
    }
    free(st);
}

char *metrics_render(const strata_config_t *cfg, char *const *names, const double *vals, int n, const bridge_info_t *info)
{
    char *page = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&page, &len);
    if (!f) return NULL;
    bool *used = calloc((size_t)(n > 0 ? n : 1), sizeof *used);
    if (!used) {
        fclose(f);
        free(page);
        return NULL;
    }
    stats_t s = {names, vals, n, used};
    s_http(f, info);
    s_group(f, &s);
    s_services(f, cfg);
    s_rest(f, &s);
    free(used);
    if (fclose(f) != 0) {
        free(page);
        return NULL;
    }
    return page;
}
