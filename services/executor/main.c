/* strata-executor - runs the scheduler's step plans on the model (exec.h), with the weights
 * mapped read-only from the node weight arenas (exec_model.h).
 *
 * Sockets: a ROUTER bound at [executor] endpoint (HANDOVER, so a restarted scheduler takes
 * its routing id over; MANDATORY, so sends to a vanished peer fail instead of queueing).
 * Each `step` is answered by one `result` or `error` with the same id; `hello` by `hello`.
 * At start, until the scheduler has spoken, it also sends an unsolicited `hello` to the
 * routing id "scheduler" every 200 ms: that is how a running scheduler learns at once that
 * the executor restarted (new instance, empty KV) and replays its live sequences.
 *
 * The step runs on the main thread (model_forward's worker pool does the parallel work), so
 * a long step delays the next message; the scheduler waits for the result.
 *
 * Exit codes: 0 clean stop, 1 runtime failure (restart me), 2 bad config, bad model or a
 * backend this build or machine does not have (do not restart).
 */
#include <errno.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "common/config.h"
#include "common/notify.h"
#include "common/service.h"
#include "common/strata.h"
#include "kernels/cpu/ops.h"
#include "proto/msg.h"
#include "proto/zmsg.h"
#include "services/executor/exec.h"
#include "services/executor/exec_model.h"
#include "services/executor/exec_remote.h"

#define HELLO_EVERY_S 0.2
/* backend = cuda: after a step, poll without sleeping this long for the next plan. A blocking
 * poll's wakeup is on the path of every step, and the GPU idles meanwhile (the CPU backend's
 * threads need the cores, so it sleeps) */
#define SPIN_AFTER_STEP_S 0.005
#define SCHED_ID "scheduler"

static void s_usage(FILE *f)
{
    fprintf(f,
            "usage: strata-executor --config FILE\n\n"
            "Runs the scheduler's step plans (proto/PROTOCOL.md, \"Scheduler <-> executor\") on the group's\n"
            "model: [executor] backend = cpu (thread pool) or cuda (one GPU under gpu_mem, prefetching the\n"
            "experts that the next prefetch_depth MoE layers' gates predict; expert_cache = split keeps\n"
            "every expert resident but its down projection's last rows, whole caches whole experts).\n"
            "Experts that a prefetcher's host budget leaves on disk (host_mem) always run on that\n"
            "prefetcher (backend = cpu only), which reads ahead the ones the gates of the next\n"
            "prefetch_depth MoE layers predict (default 4).\n"
            "expert_path = auto|cpu|pcie|cost|static: the experts that the prefetchers compute on their\n"
            "own cores from their arenas over shm rings. CPU backend: cpu, all of their arenas'; auto,\n"
            "those of arenas on another NUMA node; pcie, none. cuda backend (a cache of whole experts,\n"
            "steps of up to 16 tokens): auto and pcie, none (every miss is copied); cpu, every miss;\n"
            "cost, each miss where a cost model finishes it first, a copy or the CPU (its rates measured\n"
            "as it runs, the CPU's share tuned by the steps' times); static, every\n"
            "expert of the first cpu_moe_layers MoE layers (0: those the slots leave out) and no\n"
            "prefetch, as llama.cpp's --n-cpu-moe. A prefetcher down or slower than\n"
            "cpu_expert_timeout_ms has its experts computed here (its misses are copied while it stays\n"
            "down on cuda).\n"
            "The weights are mapped read-only from the prefetchers' shm arenas, so a restart reads no\n"
            "model file from disk; KV cache: [scheduler] kv_blocks x block_size. Binds a ROUTER at\n"
            "[executor] endpoint.\n\n"
            "  --config FILE   the group config (INI, common/config.h)\n"
            "  --help          this text\n\n"
            "Exit codes: 0 clean stop (SIGTERM/SIGINT), 1 runtime failure, 2 bad config, model or backend.\n");
}

typedef struct {
    const strata_config_t *cfg;
    exec_model_t em;
    exec_remote_t *remote;      /* experts on the prefetchers' cores, or NULL */
    exec_t *ex;
    void *zctx, *sock;
    msg_buf_t buf;
    char model_name[257];
    int32_t *tokens;       /* [MSG_MAX_STEP_SEQS] */
    bool heard;            /* the scheduler has sent something */
    double ctrl_cpu_us;    /* CPU of this thread handling messages, minus forward and sampling */
    double t_hello;
    double t_step;         /* when the last step's result went out */
    bool spin;             /* backend = cuda: SPIN_AFTER_STEP_S */
} svc_t;

/* What the executor did, once at a clean stop: its steps, the cache's hits and copies, and the
 * experts the prefetchers computed. */
static void s_log_totals(const svc_t *S)
{
    exec_stats_t st;
    exec_get_stats(S->ex, &st);
    exec_remote_stats_t rs;
    exec_remote_stats(S->remote, &rs);
    log_info("totals: %llu steps, %llu tokens; expert cache %llu hits, %llu misses copied; cpu experts %llu in %llu jobs, "
             "%llu computed here after a prefetcher failed",
             (unsigned long long)st.steps, (unsigned long long)st.tokens, (unsigned long long)st.hits,
             (unsigned long long)st.misses, (unsigned long long)rs.experts, (unsigned long long)rs.jobs,
             (unsigned long long)rs.fallbacks);
}

static void s_hello(svc_t *S, msg_hello_t *h)
{
    const model_config_t *c = &S->em.m.cfg;
    memset(h, 0, sizeof *h);
    h->instance = exec_instance(S->ex);
    h->pid = (int32_t)getpid();
    h->model = msg_str(S->model_name);
    h->vocab = c->vocab;
    h->max_context = exec_max_context(S->ex);
    h->bos_id = c->bos_id;
    h->eos_id = c->eos_id;
    /* the whole stop set (generation_config.json's ids, or config.json's); a model with one eos
     * id sends eos_id alone, as before eos_ids existed, so older readers still take it */
    _Static_assert(MODEL_MAX_EOS <= MSG_MAX_EOS, "a hello carries every eos id");
    if (c->n_eos > 1) {
        h->n_eos = c->n_eos;
        h->eos_ids = c->eos_ids;
    }
    h->kv_blocks = S->cfg->scheduler.kv_blocks;
    h->block_size = S->cfg->scheduler.block_size;
    h->load_ms = S->em.load_ms;
    h->sliding_window = exec_sliding_window(S->ex);
}

static int s_send_hello(svc_t *S, const void *route, size_t len, int flags)
{
    msg_t m;
    msg_init(&m, MSG_EXEC_HELLO_REPLY);
    s_hello(S, &m.u.hello);
    return zmsg_send(S->sock, route, len, &m, &S->buf, flags);
}

static void s_on_step(svc_t *S, const void *route, size_t len, const msg_t *in)
{
    const msg_step_t *st = &in->u.step;
    double fwd = 0, smp = 0;
    msg_errcode_t code = MSG_E_NONE;
    char text[300];
    int rc = exec_step(S->ex, st, S->tokens, &fwd, &smp, &code, text, sizeof text);
    if (rc < 0) {
        if (code != MSG_E_UNAVAILABLE) log_warn("step %llu refused: %s", (unsigned long long)in->id, text);
        zmsg_send_error(S->sock, route, len, MSG_EXEC_ERROR, true, in->id, code, text, &S->buf, 0);
        return;
    }
    uint64_t *reqs = malloc((size_t)st->n_seqs * sizeof *reqs);
    if (!reqs) {
        zmsg_send_error(S->sock, route, len, MSG_EXEC_ERROR, true, in->id, MSG_E_INTERNAL, "out of memory", &S->buf, 0);
        return;
    }
    for (int32_t i = 0; i < st->n_seqs; i++) reqs[i] = st->seqs[i].req;
    msg_t m;
    msg_init(&m, MSG_STEP_RESULT);
    m.has_id = true;
    m.id = in->id;
    m.u.result.instance = exec_instance(S->ex);
    m.u.result.n_seqs = st->n_seqs;
    m.u.result.reqs = reqs;
    m.u.result.tokens = S->tokens;
    m.u.result.forward_us = fwd;
    m.u.result.sample_us = smp;
    exec_logprobs(S->ex, &m.u.result.lp);
    rc = zmsg_send(S->sock, route, len, &m, &S->buf, 0);
    if (rc < 0) log_warn("send result of step %llu: %s", (unsigned long long)in->id, strata_strerror(rc));
    free(reqs);
    /* while the scheduler plans, the GPU starts the step that continues this one (its first
     * layers and prefetches); a failure there is the next step's to report */
    if ((rc = exec_step_ahead(S->ex, st, S->tokens)) < 0) log_warn("step ahead of %llu: %s", (unsigned long long)in->id, strata_strerror(rc));
    S->t_step = strata_now();
}

static void s_on_stats(svc_t *S, const void *route, size_t len, const msg_t *in)
{
    exec_stats_t st;
    exec_get_stats(S->ex, &st);
    msg_stat_t items[64];
    char host_names[GPU_HOST_PHASES][40];
    int n = 0;
#define S_STAT(name, val) items[n++] = (msg_stat_t){msg_str(name), (double)(val)}
    S_STAT("pid", getpid());
    S_STAT("load_ms", S->em.load_ms);
    S_STAT("from_arena", S->em.from_arena);
    S_STAT("arena_bytes", S->em.arena_bytes);
    S_STAT("cuda", !strcmp(S->cfg->executor.backend, "cuda"));
    S_STAT("cpu_act_q8", cpu_ops_act() == CPU_ACT_Q8);
    S_STAT("steps", st.steps);
    S_STAT("tokens", st.tokens);
    S_STAT("sampled", st.sampled);
    S_STAT("bad_plans", st.bad_plans);
    S_STAT("logprob_rows", st.logprob_rows);
    S_STAT("forward_us_total", st.forward_us);
    S_STAT("sample_us_total", st.sample_us);
    S_STAT("compute_cpu_us_total", st.compute_cpu_us);
    S_STAT("ctrl_cpu_us_total", S->ctrl_cpu_us);
    if (st.has_cache) {
        /* the GPU expert cache (model/gpu.h gpu_stats_t) */
        S_STAT("hits", st.hits);
        S_STAT("misses", st.misses);
        S_STAT("misses_host_read", st.host_reads);
        S_STAT("steps_ahead", st.steps_ahead);
        S_STAT("steps_chained", st.steps_chained);
        S_STAT("prefetches", st.prefetches);
        S_STAT("prefetch_used", st.prefetch_used);
        S_STAT("bytes_h2d", st.bytes_h2d);
        S_STAT("slots", st.slots);
        S_STAT("experts_on_gpu", st.experts_on_gpu);
        S_STAT("experts_total", st.n_experts_total);
        S_STAT("hit_rate", st.hits + st.misses ? (double)st.hits / (double)(st.hits + st.misses) : 0);
        S_STAT("cpu_expert_layers", st.cpu_layers_posted);
        S_STAT("cpu_expert_gpu_waits", st.cpu_gpu_waits);
        S_STAT("cpu_expert_kappa", st.cpu_kappa);
        for (int p = 0; p < GPU_HOST_PHASES; p++) {
            snprintf(host_names[p], sizeof host_names[p], "host_%s_us_total", gpu_host_phase_name(p));
            S_STAT(host_names[p], st.host_us[p]);
        }
    }
    if (S->remote) {
        /* the CPU-expert path (exec_remote.h) */
        exec_remote_stats_t rs;
        exec_remote_stats(S->remote, &rs);
        S_STAT("cpu_expert_jobs", rs.jobs);
        S_STAT("cpu_expert_uses", rs.experts);
        S_STAT("cpu_expert_rows", rs.rows);
        S_STAT("cpu_expert_fallbacks", rs.fallbacks);
        S_STAT("cpu_expert_bytes", rs.bytes);
        S_STAT("cpu_expert_wait_us_total", rs.wait_us);
        S_STAT("cpu_expert_compute_us_total", rs.compute_us);
        S_STAT("cpu_experts_owned", rs.experts_owned);
        S_STAT("cpu_expert_peers_up", rs.dests_up);
    }
#undef S_STAT
    msg_t m;
    msg_init(&m, MSG_EXEC_STATS_REPLY);
    m.has_id = in->has_id;
    m.id = in->id;
    m.u.stats.n = n;
    m.u.stats.items = items;
    int rc = zmsg_send(S->sock, route, len, &m, &S->buf, 0);
    if (rc < 0) log_warn("send stats: %s", strata_strerror(rc));
}

/* One message from the ROUTER socket: [routing id][payload]. 1 handled, 0 none, <0 error. */
static int s_recv(svc_t *S)
{
    zmq_msg_t idf, body;
    double c0 = exec_thread_cpu_us();
    exec_stats_t st0;
    exec_get_stats(S->ex, &st0);
    int frames;
    int rc = zmsg_recv_routed(S->sock, &idf, &body, &frames);
    if (rc <= 0) return rc;
    const void *route = zmq_msg_data(&idf);
    size_t len = zmq_msg_size(&idf);
    S->heard = true;
    if (frames != 1) {
        zmsg_send_error(S->sock, route, len, MSG_EXEC_ERROR, false, 0, MSG_E_MALFORMED,
                        "a message must be exactly one frame after the routing id", &S->buf, 0);
    } else {
        msg_t m;
        msg_err_t err;
        if (msg_decode(MSG_FAM_EXEC_IN, zmq_msg_data(&body), zmq_msg_size(&body), &m, &err) < 0) {
            log_warn("bad message: %s", err.text);
            zmsg_send_error(S->sock, route, len, MSG_EXEC_ERROR, m.has_id, m.id, err.code, err.text, &S->buf, 0);
        } else if (m.type == MSG_EXEC_HELLO) {
            s_send_hello(S, route, len, 0);
        } else if (m.type == MSG_STEP) {
            s_on_step(S, route, len, &m);
        } else if (m.type == MSG_EXEC_STATS) {
            s_on_stats(S, route, len, &m);
        }
        msg_free(&m);
    }
    zmq_msg_close(&body);
    zmq_msg_close(&idf);
    exec_stats_t st1;
    exec_get_stats(S->ex, &st1);
    S->ctrl_cpu_us += exec_thread_cpu_us() - c0 - (st1.compute_cpu_us - st0.compute_cpu_us);
    return 1;
}

static int s_setopt_int(void *s, int opt, int v) { return zmq_setsockopt(s, opt, &v, sizeof v); }

/* On the GPU backend, the activations of the experts the CPU computes (the prefetchers' and the
 * executor's own fallback) are the rows the GPU's experts read (model/gpu_step.c s_f32_rows):
 * int8 blocks for INT4, its integer path and about 3x less CPU work a weight than fp32 rows
 * (kernels/cpu/ops.h CPU_ACT_Q8), and fp32 for MXFP4, whose int8 rows are too coarse. */
static cpu_act_t s_gpu_rows_act(const model_t *m)
{
    for (int l = 0; l < m->cfg.n_layers; l++)
        if (m->cfg.layer_sparse[l]) return m->layers[l].experts[0].gate.fmt == WF_INT4 ? CPU_ACT_Q8 : CPU_ACT_F32;
    return cpu_ops_act();
}

int main(int argc, char **argv)
{
    static strata_config_t cfg;
    int rc = service_init(argc, argv, "executor", s_usage, &cfg, NULL);
    if (rc != SERVICE_RUN) return rc;
    rc = SERVICE_EXIT_FAIL;
    volatile sig_atomic_t *stop = service_signals();
    strata_errbuf_t eb = {{0}};

    static svc_t S;
    S.cfg = &cfg;
    {
        char tmp[sizeof cfg.model];
        snprintf(tmp, sizeof tmp, "%s", cfg.model);
        snprintf(S.model_name, sizeof S.model_name, "%s", basename(tmp));
    }
    int r = exec_model_open(&S.em, &cfg, cfg.launcher.ready_timeout_s > 0 ? cfg.launcher.ready_timeout_s : 60, stop, &eb);
    if (r < 0) {
        if (*stop) return SERVICE_EXIT_OK;
        log_error("model: %s", eb.msg[0] ? eb.msg : strata_strerror(r));
        return r == STRATA_EINVAL_INPUT || r == STRATA_EFORMAT || r == STRATA_EUNSUPPORTED ? SERVICE_EXIT_CONFIG
                                                                                             : SERVICE_EXIT_FAIL;
    }
    log_info("model %s: %s in %.1f ms (%s)", S.model_name, S.em.from_arena ? "built over the weight arenas" : "loaded from disk",
             S.em.load_ms, S.em.from_arena ? "no model file read" : "no arena");
    exec_opts_t o;
    exec_opts_default(&o);
    snprintf(o.backend, sizeof o.backend, "%s", cfg.executor.backend);
    o.threads = cfg.executor.threads;
    if (cfg.executor.cpu_act[0])
        cpu_ops_set_act((cpu_act_t)cpu_act_parse(cfg.executor.cpu_act));
    else if (!strcmp(cfg.executor.backend, "cuda") && !getenv("STRATA_CPU_ACT"))
        cpu_ops_set_act(s_gpu_rows_act(&S.em.m));
    o.gpu_mem = cfg.executor.gpu_mem;
    o.prefetch_depth = cfg.executor.prefetch_depth;
    o.whole_experts = !strcmp(cfg.executor.expert_cache, "whole");
    o.kv_blocks = cfg.scheduler.kv_blocks;
    o.block_size = cfg.scheduler.block_size;
    o.max_tokens = cfg.scheduler.max_batch_tokens;
    o.max_context = cfg.scheduler.max_context;
    if (!strcmp(o.backend, "cpu") && (!strcmp(cfg.executor.expert_path, "static") || !strcmp(cfg.executor.expert_path, "cost"))) {
        log_error("expert_path = %s splits the misses of a GPU's expert cache: backend = cuda only", cfg.executor.expert_path);
        rc = SERVICE_EXIT_CONFIG;
        goto done;
    }
    if ((r = exec_remote_create(&S.remote, &cfg, &S.em, &eb)) < 0) {
        log_error("%s", eb.msg[0] ? eb.msg : strata_strerror(r));
        rc = r == STRATA_EINVAL_INPUT ? SERVICE_EXIT_CONFIG : SERVICE_EXIT_FAIL;
        goto done;
    }
    o.remote = exec_remote_iface(S.remote);
    /* model/gpu.h gpu_cpu_policy_t: 0 the cost model (cost), 1 every miss, 2 static placement */
    o.cpu_policy = !strcmp(cfg.executor.expert_path, "cpu") ? 1 : !strcmp(cfg.executor.expert_path, "static") ? 2 : 0;
    o.cpu_layers = cfg.executor.cpu_moe_layers;
    r = exec_create(&S.ex, &S.em.m, &o, &eb);
    if (r < 0) {
        log_error("%s", eb.msg[0] ? eb.msg : strata_strerror(r));
        /* a model that does not fit gpu_mem (STRATA_ETOOLARGE) will not fit after a restart either */
        rc = r == STRATA_EUNSUPPORTED || r == STRATA_EINVAL_INPUT || r == STRATA_ETOOLARGE ? SERVICE_EXIT_CONFIG
                                                                                             : SERVICE_EXIT_FAIL;
        goto done;
    }
    S.tokens = malloc(MSG_MAX_STEP_SEQS * sizeof *S.tokens);
    S.zctx = zmq_ctx_new();
    S.sock = S.zctx ? zmq_socket(S.zctx, ZMQ_ROUTER) : NULL;
    if (!S.tokens || !S.sock) {
        log_error("startup: %s", S.tokens ? zmq_strerror(zmq_errno()) : "out of memory");
        goto done;
    }
    if (s_setopt_int(S.sock, ZMQ_ROUTER_MANDATORY, 1) || s_setopt_int(S.sock, ZMQ_ROUTER_HANDOVER, 1) ||
        s_setopt_int(S.sock, ZMQ_LINGER, 0) || s_setopt_int(S.sock, ZMQ_SNDHWM, 10000) || s_setopt_int(S.sock, ZMQ_RCVHWM, 10000)) {
        log_error("socket options: %s", zmq_strerror(zmq_errno()));
        goto done;
    }
    if (zmq_bind(S.sock, cfg.executor.endpoint) < 0) {
        int e = zmq_errno();
        log_error("cannot bind [executor] endpoint %s: %s", cfg.executor.endpoint, zmq_strerror(e));
        rc = service_endpoint_exit_code(e);
        goto done;
    }
    log_info("instance %016llx serving on %s: backend %s, KV %d blocks x %d tokens, %d tokens a step, context %d",
             (unsigned long long)exec_instance(S.ex), cfg.executor.endpoint, o.backend, o.kv_blocks, o.block_size, o.max_tokens,
             exec_max_context(S.ex));
    notify_ready();
    zmq_pollitem_t item = {S.sock, 0, ZMQ_POLLIN, 0};
    S.spin = !strcmp(o.backend, "cuda");
    while (!*stop) {
        bool spin = S.spin && strata_now() - S.t_step < SPIN_AFTER_STEP_S;
        int n = zmq_poll(&item, 1, spin ? 0 : S.heard ? 100 : 20);
        if (n < 0 && zmq_errno() != EINTR) {
            log_error("zmq_poll: %s", zmq_strerror(zmq_errno()));
            goto done;
        }
        for (int i = 0; i < 64 && !*stop; i++) {
            int k = s_recv(&S);
            if (k < 0) {
                log_error("receive: %s", strata_strerror(k));
                goto done;
            }
            if (k == 0) break;
        }
        /* no plan yet: the GPU step started ahead goes on meanwhile */
        if (spin && !*stop && (n = exec_ahead_progress(S.ex)) < 0)
            log_warn("step ahead: %s", strata_strerror(n));
        double now = strata_now();
        if (!S.heard && now - S.t_hello >= HELLO_EVERY_S) {
            /* tell a running scheduler that this is a new executor; fails until it is connected */
            S.t_hello = now;
            if (s_send_hello(&S, SCHED_ID, strlen(SCHED_ID), ZMQ_DONTWAIT) == 0) S.heard = true;
        }
        notify_watchdog();
    }
    service_stopping();
    s_log_totals(&S);
    rc = SERVICE_EXIT_OK;
done:
    if (S.sock) zmq_close(S.sock);
    if (S.zctx) zmq_ctx_term(S.zctx);
    msg_buf_free(&S.buf);
    free(S.tokens);
    exec_free(S.ex);
    exec_remote_free(S.remote);
    exec_model_close(&S.em);
    return rc;
}
