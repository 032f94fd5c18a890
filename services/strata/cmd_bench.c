/* cmd_bench.c - `strata bench`: a load generator over the real client protocol
 * (proto/PROTOCOL.md), with the roofline bound next to every figure (bench/roofline.h).
 *
 * It starts its own process group for the run (`strata up` with a generated config in a fresh
 * run dir; `strata down` at the end) unless --endpoint names a running one. Each client is a
 * ZeroMQ DEALER with its own identity, speaking msgpack through proto/msg.h and proto/zmsg.h,
 * exactly like `strata client`. One thread drives every socket with zmq_poll, so timestamps are
 * taken when a frame arrives.
 *
 * Load:
 *   closed loop  --batch 1,16: N clients, each sends its next request when the last one is
 *                done (N = the batch the engine sees once prompts are prefilled);
 *   open loop    --rate R[,R2]: requests arrive as a Poisson process of R per second (seeded
 *                exponential gaps), spread over a pool of client sockets.
 * Each request is --prompt random token ids (ignore_eos, sampled at temperature 1 with a
 * per-request seed) asking for --gen tokens. The
 * first --warmup requests of a level are not measured.
 *
 * Figures per level, over the window from the end of warm-up to the last measured answer:
 *   decode_tok_s            tokens received per second from every request (aggregate);
 *   decode_tok_s_per_seq    median over requests of (tokens - 1) / (last token - first token);
 *   prefill_tok_s           median over requests of prompt tokens / (server ttft - queue time);
 *   ttft_*_ms, itl_*_ms     client-side time to first token and gaps between tokens (a frame
 *                           carrying k tokens counts k gaps of 1/k of its wait);
 *   hit_rate, pcie_gb_s     deltas of the group's `stats` (scheduler.executor.hits / misses /
 *                           bytes_h2d) between the two ends of the window;
 *   prefetch_accuracy       the same window's prefetch_used / prefetches (null without prefetches);
 *   cpu_expert_share        scheduler.executor.cpu_expert_uses / all expert uses when the group
 *                           reports it, 1 for the CPU backend, else null;
 *   cpu_experts_per_step, cpu_tokens_per_step, cpu_ms_per_step, cpu_wait_ms_per_step, cpu_gb_s,
 *   cpu_expert_fallbacks    the experts the prefetchers computed ([executor] expert_path,
 *                           services/executor/exec_remote.h), from the window's deltas of
 *                           scheduler.executor.cpu_expert_{uses,rows,compute_us_total,
 *                           wait_us_total,bytes,fallbacks}: per executor step
 *                           (scheduler.executor.steps), or per second, or a count; null when the
 *                           group does not report them (no expert goes to a prefetcher);
 *   cpu_gpu_wait_share, cpu_kappa  the share of the window's MoE layers with CPU experts whose GPU
 *                           waited for their results, and the cost model's tuned factor (cuda);
 *   prefetcher_expert_share the share of routed (token, expert) pairs the prefetchers computed:
 *                           cpu_expert_rows / (scheduler.executor.tokens x top_k x MoE layers),
 *                           top_k and the MoE layers from --model's config.json (null without it
 *                           or without the counters);
 *   slots                   scheduler.executor.experts_on_gpu: the whole experts' worth of expert bytes
 *                           on the GPU (cuda; its slots, or with split experts every head and the
 *                           tails in slots, fractional), else null;
 *   step_forward_us, step_rtt_us
 *                           per step in the window (the scheduler's step_*_us_total / steps_timed):
 *                           the executor's forward pass, and the scheduler's round trip to it;
 *   bound_*_tok_s, ratio_*  the three roofline bounds (bench/roofline.h) for the model, format,
 *                           budget and batch on this machine (ceilings measured at start; the
 *                           executor's slots when it reports them, else slots estimated from the
 *                           budget and the KV), and measured / each:
 *                             pcie_only    every miss over PCIe (no CPU path): what a GPU backend
 *                                          that computes every expert itself can reach (null on
 *                                          the CPU backend);
 *                             bw_added     PCIe and the CPU in parallel, their bandwidths added
 *                                          (also bound_tok_s, as before);
 *                             host_shared  the same with the copy's and the CPU's reads of host
 *                                          memory capped together (ceilings' host_shared_gb_s).
 * With --results FILE the rows are also appended to FILE as results rows (bench/results.h: case,
 * date, commit, machine, command, figure and the bound it is measured against, JSON lines).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include "bench/results.h"
#include "bench/roofline.h"
#include "build_commit.h"
#include "common/config.h"
#include "common/placement.h"
#include "model/gpu.h"
#include "model/packed.h"
#include "model/synth_fast.h"
#include "proto/msg.h"
#include "proto/zmsg.h"
#include "services/strata/cli_util.h"
#include "services/strata/group_state.h"
#include "store/arena.h"
#include "services/strata/rclient.h"

static const char *const C = "bench";
extern char **environ;

#define MAX_LEVELS 32
#define OPEN_SOCKETS 16      /* client sockets of the open loop; each carries <= 32 requests */
#define GIB (1024.0 * 1024.0 * 1024.0)

static volatile sig_atomic_t s_stop;
static void s_on_signal(int sig)
{
    (void)sig;
    s_stop = 1;
}

static void s_help(FILE *f)
{
    fprintf(f,
            "usage: strata bench --model DIR [--backend cpu|cuda] [--gpu-mem BYTES] --batch 1,16\n"
            "                    --prompt 128 --gen 128 --json FILE [options]\n"
            "       strata bench --endpoint E [--model DIR] ...\n"
            "\n"
            "Load generator over the real client protocol. Starts its own process group for the run\n"
            "(`strata up` with a generated config, `strata down` after) unless --endpoint is given.\n"
            "Reports decode tok/s (aggregate and per sequence), prefill tok/s, TTFT and inter-token\n"
            "latency p50/p99, expert-cache hit rate, PCIe GB/s, CPU-expert share and the experts the\n"
            "prefetchers computed (per step, GB/s, share, fallbacks) from the group's stats, next to\n"
            "three roofline bounds (ceilings measured at start: PCIe only; PCIe + CPU, bandwidths added;\n"
            "PCIe + CPU, host memory shared) and their projection onto an RTX 3090 / PCIe 3 /\n"
            "2 x E5-2699 v4 and an RTX 4090 / PCIe 4 / DDR5 host.\n"
            "\n"
            "  --model DIR        packed model folder (e.g. from `strata synth`)\n"
            "  --endpoint E       use the running group at router endpoint E instead of starting one\n"
            "  --curve-server-key FILE  with --endpoint: connect with ZeroMQ CURVE to a router whose public\n"
            "                     key is in FILE (`strata keygen`'s PREFIX.key; default $STRATA_CURVE_SERVER_KEY)\n"
            "  --curve-client-key FILE  this client's secret key file (PREFIX.secret, mode 0600; default\n"
            "                     $STRATA_CURVE_CLIENT_KEY; without one, a keypair made for the run)\n"
            "  --backend B        cpu (default) or cuda (started group)\n"
            "  --gpu-mem BYTES    executor GPU budget, K/M/G suffixes (started group; default 0)\n"
            "  --threads T        executor CPU threads (started group; default 0 = all)\n"
            "  --host-mem B       each prefetcher's host budget ([prefetcher.N] host_mem: bytes, or a\n"
            "                     fraction of free memory such as 0.5): the disk tier, experts read from\n"
            "                     the model folder on demand (backend cpu). The ceilings then probe the\n"
            "                     disk (ceilings --disk on the first experts-*.bin), the rows gain the\n"
            "                     three-tier bound, and host_hit_rate / disk_read_gb_s from the\n"
            "                     prefetchers' status over each level (its warm-up included)\n"
            "  --expert-path P    auto, cpu, pcie, cost or static: the started group's [executor]\n"
            "                     expert_path (default: not written, so the config's default, auto). With\n"
            "                     the CPU backend, cpu computes every expert on the prefetcher whose arena\n"
            "                     holds it, pcie none; auto only those of arenas on another NUMA node than\n"
            "                     the executor's, which this bench does not place, so none. With cuda,\n"
            "                     auto and pcie copy every miss, cpu hands them all to the prefetchers,\n"
            "                     cost splits each layer's misses between the two by the cost model,\n"
            "                     static is llama.cpp's placement (whole layers' experts on the CPU, the\n"
            "                     rest cached)\n"
            "  --cpu-moe-layers N static: [executor] cpu_moe_layers (default 0: the layers the slots leave out)\n"
            "  --prefetchers N    [prefetcher.0] .. [prefetcher.N-1] in the started group (default 1, 1-%d):\n"
            "                     the model's arena split over N prefetchers; numa_node K for the K-th when\n"
            "                     N > 1 and the machine has N nodes, else -1 (no memory policy)\n"
            "  --prefetcher-threads T  each prefetcher's CPU-expert threads ([prefetcher.N] threads;\n"
            "                     default: not written, so its cores but one)\n"
            "  --batch LIST       closed loop: concurrent clients per level (default 1,16)\n"
            "  --rate LIST        open loop instead: Poisson arrivals, requests per second per level\n"
            "  --prompt N         prompt tokens per request (default 128)\n"
            "  --gen N            tokens generated per request (default 128)\n"
            "  --requests N       measured requests per level (default: 2 x batch, at least 4)\n"
            "  --warmup N         unmeasured requests first (default: batch, at least 1)\n"
            "  --seed N           prompts and arrivals seed (default 1)\n"
            "  --timeout S        give up on a level after S seconds (default 600)\n"
            "  --ready-timeout S  wait this long for the router to report a ready scheduler (default 120)\n"
            "  --max-batch-tokens N  the scheduler's token budget a step (default: 256, or the largest\n"
            "                     batch if more); a prompt's prefill takes chunks of it, so a prefill\n"
            "                     benchmark gives at least --prompt to prefill it in one step\n"
            "  --json FILE        write the rows (JSON array)\n"
            "  --results FILE     append the rows to FILE as results rows (JSON lines, bench/README.md\n"
            "                     \"Results\"): case, date, commit, machine, command, figure, bound\n"
            "  --plot FILE        PNG of throughput vs batch (gnuplot; default FILE.png next to --json)\n"
            "  --no-plot          no PNG\n"
            "  --no-probe         skip the bandwidth probes (no bound)\n"
            "  --probe-mib N      probe buffer size (default 1024)\n"
            "  --run-dir DIR      run dir of the started group (default /tmp/strata-bench-PID)\n"
            "  --keep             leave the started group running (prints its config)\n"
            "  -h, --help         this help\n"
            "\n"
            "Exit codes: 0 ok, 1 runtime failure (group did not start, every request failed), 2 usage.\n",
            CONFIG_MAX_PREFETCHERS);
}

typedef struct {
    const char *model, *backend, *json, *results, *plot, *run_dir_arg;
    rc_opts_t router;        /* --endpoint (NULL: the group this bench starts) and the key files for a CURVE router */
    const char *expert_path; /* the started group's [executor] expert_path, NULL = not written (auto) */
    const char *host_mem;    /* the started group's [prefetcher.N] host_mem (the disk tier), NULL = none */
    int cpu_moe_layers;      /* its cpu_moe_layers, 0 = not written */
    int prefetchers;        /* [prefetcher.K] sections of the started group, 1..CONFIG_MAX_PREFETCHERS */
    int pf_threads;         /* their threads, 0 = not written */
    int64_t gpu_mem;
    int threads, prompt, gen, requests, warmup, timeout_s, probe_mib, ready_s;
    int max_batch_tokens;   /* the started group's [scheduler] max_batch_tokens; 0 = max(256, batch) */
    uint64_t seed;
    int levels[MAX_LEVELS], n_levels;
    double rates[MAX_LEVELS];
    bool open_loop, no_plot, no_probe, keep;
} s_opts_t;

/* ---- small helpers ------------------------------------------------------------------ */

static int s_parse_list(const char *s, double *out, int cap, int *n, bool integer)
{
    *n = 0;
    while (*s) {
        char *end;
        double v = strtod(s, &end);
        if (end == s || !(v > 0) || v > 1e6 || *n == cap || (integer && (v != floor(v) || v > 4096))) return -1;
        out[(*n)++] = v;
        s = end;
        if (*s == ',') s++;
        else if (*s) return -1;
    }
    return *n ? 0 : -1;
}

static json_t *s_num(double v) { return isfinite(v) ? json_real(v) : json_null(); }

/* v * mul with fmt, or "-" when v is not a number. */
static void s_fmt(char *buf, size_t cap, const char *fmt, double v, double mul)
{
    if (isfinite(v)) snprintf(buf, cap, fmt, v * mul);
    else snprintf(buf, cap, "-");
}

/* The folder of the running executable. */
static void s_self_dir(char *buf, size_t cap)
{
    ssize_t n = readlink("/proc/self/exe", buf, cap - 1);
    if (n < 0) n = 0;
    buf[n] = 0;
    char *sl = strrchr(buf, '/');
    if (sl) *sl = 0;
}

/* Run argv (argv[0] a path) with its stdout on our stderr (stdout carries the table), wait,
 * return its exit code (or -1). */
static int s_run(char *const argv[])
{
    pid_t pid;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, 2, 1);
    int e = posix_spawn(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (e != 0) return -1;
    int st = 0;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* ---- the machine's ceilings ------------------------------------------------------------ */

/* What the probes found besides the machine_t: for results rows and the JSON. */
typedef struct {
    char desc[512];         /* the machine in words (bench/results.h) */
    char built[128];        /* the build's commit as ceilings reports it, "" if unknown */
    double h2d_shared, cpu_shared; /* bytes/s with both reading host memory at once, 0 = not measured */
} s_probe_t;

/* The first experts-*.bin of model dir (by name): the file the disk probe reads. 0 or -1. */
static int s_first_expert_file(const char *dir, char *out, size_t cap)
{
    DIR *d = opendir(dir);
    if (!d) return -1;
    char best[256] = "";
    struct dirent *e;
    while ((e = readdir(d)))
        if (arena_is_disk_file(e->d_name) && (!best[0] || strcmp(e->d_name, best) < 0)) snprintf(best, sizeof best, "%s", e->d_name);
    closedir(d);
    if (!best[0] || strchr(dir, '\'') || snprintf(out, cap, "%s/%s", dir, best) >= (int)cap) return -1;
    return 0;
}

/* From the `ceilings` helper next to this binary (build tree or bundle), which links CUDA;
 * without it, the host bandwidth measured here and no GPU figures. */
static void s_ceilings(const s_opts_t *o, machine_t *mc, char *machine, size_t cap, bool want_gpu, s_probe_t *pr)
{
    char dir[4096], cand[2][4200], cmd[8600];
    memset(mc, 0, sizeof *mc);
    s_self_dir(dir, sizeof dir);
    snprintf(cand[0], sizeof cand[0], "%s/../../bench/ceilings", dir);
    snprintf(cand[1], sizeof cand[1], "%s/ceilings", dir);
    gethostname(machine, cap - 1);
    for (int i = 0; i < 2; i++) {
        if (access(cand[i], X_OK)) continue;
        char disk[4400] = "";
        if (o->host_mem && o->model && s_first_expert_file(o->model, disk + 9, sizeof disk - 10) == 0) memcpy(disk, " --disk '", 9);
        if (disk[0]) strcat(disk, "'");
        snprintf(cmd, sizeof cmd, "'%s' --mib %d%s%s", cand[i], o->probe_mib, want_gpu ? "" : " --no-gpu", disk);
        FILE *p = popen(cmd, "r");
        if (!p) continue;
        json_error_t je;
        json_t *j = json_loadf(p, 0, &je);
        int st = pclose(p);
        if (j && json_is_object(j) && st == 0) {
            mc->cpu_bw = json_number_value(json_object_get(j, "cpu_gb_s")) * 1e9;
            mc->pcie_bw = json_number_value(json_object_get(j, "pcie_gb_s")) * 1e9;
            mc->hbm_bw = json_number_value(json_object_get(j, "hbm_gb_s")) * 1e9;
            mc->host_bw = json_number_value(json_object_get(j, "host_shared_gb_s")) * 1e9;
            mc->disk_bw = json_number_value(json_object_get(j, "disk_gb_s")) * 1e9;
            mc->gpu_mem = json_number_value(json_object_get(j, "gpu_mem"));
            pr->h2d_shared = json_number_value(json_object_get(j, "h2d_shared_gb_s")) * 1e9;
            pr->cpu_shared = json_number_value(json_object_get(j, "cpu_shared_gb_s")) * 1e9;
            const char *d = json_string_value(json_object_get(j, "machine_desc"));
            const char *c = json_string_value(json_object_get(j, "commit"));
            if (d) snprintf(pr->desc, sizeof pr->desc, "%s", d);
            if (c) snprintf(pr->built, sizeof pr->built, "%s", c);
            const char *g = json_string_value(json_object_get(j, "gpu"));
            if (g) {
                size_t l = strlen(machine);
                snprintf(machine + l, cap - l, "/%s", g);
            }
            snprintf(mc->name, sizeof mc->name, "this: %.50s", g ? g : machine);
            json_decref(j);
            return;
        }
        json_decref(j);
    }
    if (want_gpu) log_warn("bench: the ceilings helper was not found or failed; no GPU ceilings (bound null)");
    tpool_t *pool = tpool_create(0);
    mc->cpu_bw = roofline_cpu_membw(pool, (size_t)o->probe_mib << 20, 5);
    tpool_destroy(pool);
    snprintf(mc->name, sizeof mc->name, "this: %.50s", machine);
}

/* ---- the model: shape name, format and roofline bytes ---------------------------------- */

typedef struct {
    bool have;
    char shape[128], format[32];
    wfmt_t fmt, attn_fmt;   /* the experts' and the attention projections' formats */
    int32_t group;          /* int4 group */
    model_config_t cfg;
    roofline_model_t rm;
} s_model_t;

static int s_model_info(const char *dir, s_model_t *mi)
{
    memset(mi, 0, sizeof *mi);
    char path[4200];
    strata_errbuf_t eb = {{0}};
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (model_config_load(&mi->cfg, path, &eb) < 0) {
        cli_error(C, "%s", eb.msg);
        return 2;
    }
    const char *b = strrchr(dir, '/');
    snprintf(mi->shape, sizeof mi->shape, "%s", b && b[1] ? b + 1 : dir);
    synth_dir_shape(dir, mi->shape, sizeof mi->shape); /* a synthetic folder names its shape */
    snprintf(path, sizeof path, "%s/%s", dir, PACKED_MANIFEST);
    if (access(path, F_OK) != 0) {
        cli_error(C, "%s: not a packed model (no %s); pack it with `strata pack` or make one with `strata synth`", dir,
                  PACKED_MANIFEST);
        return 2;
    }
    char *text = NULL;
    size_t got = 0;
    packed_manifest_t pm;
    if (strata_read_file(path, PACKED_MAX_META_BYTES, &text, &got, &eb) < 0 || packed_manifest_parse(&pm, text, got, path, &eb) < 0) {
        cli_error(C, "%s", eb.msg[0] ? eb.msg : "cannot read the manifest");
        free(text);
        return 2;
    }
    free(text);
    mi->fmt = pm.fmt;
    mi->attn_fmt = pm.attn_fmt;
    mi->group = pm.group;
    if (pm.fmt == WF_INT4) snprintf(mi->format, sizeof mi->format, "int4-g%d", pm.group);
    else snprintf(mi->format, sizeof mi->format, "%s", wfmt_name(pm.fmt));
    roofline_model_from_manifest(&mi->rm, &mi->cfg, &pm);
    packed_manifest_free(&pm);
    mi->have = true;
    return 0;
}

/* ---- the process group ----------------------------------------------------------------- */

typedef struct {
    char run_dir[256], config[300], endpoint[128];
    bool started;
} s_group_t;

static int s_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK), .sin_port = 0};
    socklen_t l = sizeof a;
    int port = -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &l) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

static int s_group_start(const s_opts_t *o, s_group_t *g, int max_conc)
{
    char model_real[4096];
    if (!realpath(o->model, model_real)) {
        cli_error(C, "--model %s: %s", o->model, strerror(errno));
        return 2;
    }
    if (o->run_dir_arg) snprintf(g->run_dir, sizeof g->run_dir, "%s", o->run_dir_arg);
    else snprintf(g->run_dir, sizeof g->run_dir, "/tmp/strata-bench-%d", (int)getpid());
    if (mkdir(g->run_dir, 0700) < 0 && errno != EEXIST) {
        cli_error(C, "%s: %s", g->run_dir, strerror(errno));
        return 1;
    }
    int port = s_free_port();
    if (port <= 0) {
        cli_error(C, "no free TCP port on 127.0.0.1");
        return 1;
    }
    snprintf(g->endpoint, sizeof g->endpoint, "tcp://127.0.0.1:%d", port);
    snprintf(g->config, sizeof g->config, "%s/bench.ini", g->run_dir);
    int bs = 16, per_seq = (o->prompt + o->gen + bs - 1) / bs + 1;
    int seqs = max_conc < 1 ? 1 : max_conc;
    FILE *f = fopen(g->config, "w");
    if (!f) {
        cli_error(C, "%s: %s", g->config, strerror(errno));
        return 1;
    }
    fprintf(f,
            "; written by `strata bench` for one run\n"
            "[group]\nname = bench%d\nrun_dir = %s\nmodel = %s\n\n"
            "[router]\nendpoint = %s\nmax_queue = 4096\nmax_inflight_per_client = 64\n\n"
            "[scheduler]\nmax_batch_tokens = %d\nmax_seqs = %d\nkv_blocks = %d\nblock_size = %d\n\n"
            "[executor]\nbackend = %s\nthreads = %d\ngpu_mem = %lld\n",
            (int)getpid() % 100000, g->run_dir, model_real, g->endpoint,
            o->max_batch_tokens > 0 ? o->max_batch_tokens : seqs > 256 ? seqs : 256, seqs,
            seqs * per_seq + 16, bs, o->backend, o->threads, (long long)o->gpu_mem);
    if (o->expert_path) fprintf(f, "expert_path = %s\n", o->expert_path);
    if (o->cpu_moe_layers > 0) fprintf(f, "cpu_moe_layers = %d\n", o->cpu_moe_layers);
    /* One prefetcher keeps no memory policy, as before --prefetchers. N of them each bind their
     * arena part to node K when the machine has those nodes; on fewer nodes they share the
     * memory the kernel gives them (numa_node -1), which still splits the experts N ways. */
    bool numa = o->prefetchers > 1 && placement_numa_nodes() >= o->prefetchers;
    for (int k = 0; numa && k < o->prefetchers; k++) numa = placement_node_exists(k);
    for (int k = 0; k < o->prefetchers; k++) {
        fprintf(f, "\n[prefetcher.%d]\nnuma_node = %d\n", k, numa ? k : -1);
        if (o->host_mem) fprintf(f, "host_mem = %s\n", o->host_mem);
        if (o->pf_threads > 0) fprintf(f, "threads = %d\n", o->pf_threads);
    }
    fprintf(f, "\n[launcher]\nready_timeout_s = 900\nrestart_backoff_ms = 200\nrestart_backoff_max_ms = 2000\n");
    if (fclose(f) != 0) {
        cli_error(C, "%s: write failed", g->config);
        return 1;
    }
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n < 0) return 1;
    self[n] = 0;
    char *argv[] = {self, "up", "--config", g->config, NULL};
    fprintf(stderr, "bench: starting the group (%s) ...\n", g->config);
    double t0 = strata_now();
    int rc = s_run(argv);
    if (rc != 0) {
        cli_error(C, "`strata up --config %s` failed (exit %d); logs in %s/launcher.log and %s/logs/", g->config, rc,
                  g->run_dir, g->run_dir);
        return 1;
    }
    g->started = true;
    fprintf(stderr, "bench: group ready in %.1f s at %s\n", strata_now() - t0, g->endpoint);
    return 0;
}

/* Remove the run dir the bench made (logs, state), after a clean stop. */
static void s_rm_run_dir(const char *dir)
{
    char cmdline[600];
    if (strncmp(dir, "/tmp/strata-bench-", 18)) return; /* only the default, never a user's folder */
    snprintf(cmdline, sizeof cmdline, "rm -rf '%s'", dir);
    if (system(cmdline) != 0) log_warn("bench: could not remove %s", dir);
}

static void s_group_stop(s_group_t *g)
{
    if (!g->started) return;
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n < 0) return;
    self[n] = 0;
    char *argv[] = {self, "down", "--config", g->config, NULL};
    int rc = s_run(argv);
    if (rc != 0) log_warn("bench: `strata down --config %s` exited %d", g->config, rc);
    g->started = false;
}

/* ---- clients --------------------------------------------------------------------------- */

typedef struct {
    void *sock;
    int inflight;
} s_client_t;

typedef struct {
    int client;
    double t_send, t_first, t_last, t_done;
    int32_t n_tok, prompt_tokens;
    double srv_ttft_ms, srv_queue_ms;
    bool sent, done, failed, measured;
} s_req_t;

typedef struct {
    void *ctx;
    s_client_t *cl;
    int n_cl;
    void *ctl;              /* control socket: health, models, stats */
    msg_buf_t buf;
    uint64_t ctl_id;
    int32_t vocab, max_context;
    rc_curve_t curve;       /* the CURVE keys of every socket; plaintext without --curve-server-key */
    char pf_ep[CONFIG_MAX_PREFETCHERS][300]; /* the started group's prefetchers (their status) */
    int n_pf;
} s_conn_t;

static void *s_socket(s_conn_t *cn, const char *endpoint, const char *ident)
{
    void *s = zmq_socket(cn->ctx, ZMQ_DEALER);
    if (!s) return NULL;
    int zero = 0, hb = 1000, hbt = 5000;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_ROUTING_ID, ident, strlen(ident));
    zmq_setsockopt(s, ZMQ_HEARTBEAT_IVL, &hb, sizeof hb);
    zmq_setsockopt(s, ZMQ_HEARTBEAT_TIMEOUT, &hbt, sizeof hbt);
    if (rc_curve_set(s, &cn->curve) < 0 || zmq_connect(s, endpoint) < 0) {
        zmq_close(s);
        return NULL;
    }
    return s;
}

/* Send a bodyless control request; returns its id (0 if it could not be sent). */
static uint64_t s_ctl_send(s_conn_t *cn, msg_type_t type)
{
    msg_t m;
    msg_init(&m, type);
    m.has_id = true;
    m.id = ++cn->ctl_id;
    return zmsg_send(cn->ctl, NULL, 0, &m, &cn->buf, ZMQ_DONTWAIT) < 0 ? 0 : m.id;
}

/* Send a bodyless control request on the control socket and wait up to wait_s for its reply
 * of `want` type; *out owns it (msg_free). */
static int s_ctl(s_conn_t *cn, msg_type_t type, msg_type_t want, double wait_s, msg_t *out)
{
    msg_t m;
    msg_init(&m, type);
    m.has_id = true;
    m.id = ++cn->ctl_id;
    int rc = zmsg_send(cn->ctl, NULL, 0, &m, &cn->buf, 0);
    if (rc < 0) return rc;
    double t0 = strata_now();
    while (strata_now() - t0 < wait_s && !s_stop) {
        zmq_pollitem_t it = {cn->ctl, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 100) <= 0) continue;
        msg_err_t err;
        rc = zmsg_recv(cn->ctl, MSG_FAM_REPLY, out, &err, ZMQ_DONTWAIT);
        if (rc == -EAGAIN) continue;
        if (rc < 0) {
            msg_free(out);
            continue;
        }
        if (out->type == want && out->has_id && out->id == cn->ctl_id) return 0;
        msg_free(out);
    }
    return STRATA_ETIMEOUT;
}

/* Wait until the router hears from its scheduler; read vocab and context from `models`. */
static int s_wait_ready(s_conn_t *cn, double wait_s)
{
    double t0 = strata_now();
    while (strata_now() - t0 < wait_s && !s_stop) {
        msg_t r;
        if (s_ctl(cn, MSG_HEALTH, MSG_HEALTH_REPLY, 2.0, &r) == 0) {
            bool up = r.u.health.scheduler;
            msg_free(&r);
            if (up && s_ctl(cn, MSG_MODELS, MSG_MODELS_REPLY, 2.0, &r) == 0) {
                if (r.u.models.n > 0) {
                    cn->vocab = r.u.models.models[0].vocab;
                    cn->max_context = r.u.models.models[0].max_context;
                }
                msg_free(&r);
                if (cn->vocab > 0) return 0;
            }
        }
        usleep(200 * 1000);
    }
    return STRATA_ETIMEOUT;
}

/* Stats snapshot: the counters bench reads, NAN when absent. */
typedef struct {
    double t;
    double hits, misses, bytes_h2d, cpu_expert, tokens, slots, prefetches, prefetch_used;
    double steps, rtt_us, fwd_us; /* the scheduler's timed steps, their round trips and forward time */
    double ex_steps, ex_tokens;   /* the executor's steps and the token rows it forwarded */
    double cx_rows, cx_fallbacks, cx_bytes, cx_wait_us, cx_compute_us; /* the CPU-expert path (exec_remote.h) */
    double cx_layers, cx_gpu_waits, cx_kappa; /* on the GPU: its MoE layers, those the GPU waited in, the tuner */
    double host_us[GPU_HOST_PHASES];          /* on the GPU: the host thread's time by phase (model/gpu.h) */
    bool ok;
} s_snap_t;

static void s_snap_from(const msg_stats_t *st, s_snap_t *s)
{
    s->hits = s->misses = s->bytes_h2d = s->cpu_expert = s->tokens = s->slots = s->prefetches = s->prefetch_used = NAN;
    s->steps = s->rtt_us = s->fwd_us = NAN;
    s->ex_steps = s->ex_tokens = s->cx_rows = s->cx_fallbacks = s->cx_bytes = s->cx_wait_us = s->cx_compute_us = NAN;
    s->cx_layers = s->cx_gpu_waits = s->cx_kappa = NAN;
    for (int p = 0; p < GPU_HOST_PHASES; p++) s->host_us[p] = NAN;
    for (int32_t i = 0; i < st->n; i++) {
        const char *n = st->items[i].name.s;
        double v = st->items[i].value;
        if (!n) continue;
        if (!strncmp(n, "scheduler.executor.host_", 24))
            for (int p = 0; p < GPU_HOST_PHASES; p++) {
                char want[64];
                snprintf(want, sizeof want, "scheduler.executor.host_%s_us_total", gpu_host_phase_name(p));
                if (!strcmp(n, want)) s->host_us[p] = v;
            }
        if (!strcmp(n, "scheduler.executor.hits")) s->hits = v;
        else if (!strcmp(n, "scheduler.executor.misses")) s->misses = v;
        else if (!strcmp(n, "scheduler.executor.bytes_h2d")) s->bytes_h2d = v;
        else if (!strcmp(n, "scheduler.executor.prefetches")) s->prefetches = v;
        else if (!strcmp(n, "scheduler.executor.prefetch_used")) s->prefetch_used = v;
        else if (!strcmp(n, "scheduler.executor.cpu_expert_uses")) s->cpu_expert = v;
        else if (!strcmp(n, "scheduler.executor.cpu_expert_rows")) s->cx_rows = v;
        else if (!strcmp(n, "scheduler.executor.cpu_expert_fallbacks")) s->cx_fallbacks = v;
        else if (!strcmp(n, "scheduler.executor.cpu_expert_bytes")) s->cx_bytes = v;
        else if (!strcmp(n, "scheduler.executor.cpu_expert_wait_us_total")) s->cx_wait_us = v;
        else if (!strcmp(n, "scheduler.executor.cpu_expert_compute_us_total")) s->cx_compute_us = v;
        else if (!strcmp(n, "scheduler.executor.cpu_expert_layers")) s->cx_layers = v;
        else if (!strcmp(n, "scheduler.executor.cpu_expert_gpu_waits")) s->cx_gpu_waits = v;
        else if (!strcmp(n, "scheduler.executor.cpu_expert_kappa")) s->cx_kappa = v;
        else if (!strcmp(n, "scheduler.executor.steps")) s->ex_steps = v;
        else if (!strcmp(n, "scheduler.executor.tokens")) s->ex_tokens = v;
        else if (!strcmp(n, "scheduler.generated_tokens")) s->tokens = v;
        else if (!strcmp(n, "scheduler.executor.experts_on_gpu")) s->slots = v;
        else if (!strcmp(n, "scheduler.steps_timed")) s->steps = v;
        else if (!strcmp(n, "scheduler.step_rtt_us_total")) s->rtt_us = v;
        else if (!strcmp(n, "scheduler.step_forward_us_total")) s->fwd_us = v;
    }
    s->ok = true;
}

/* ---- one level ------------------------------------------------------------------------- */

typedef struct {
    bool open;
    int conc;               /* closed: clients */
    double rate;            /* open: requests per second */
    int n_req, n_warm;
    double window_s;
    int64_t window_tokens;
    int errors, measured_done;
    double decode_tok_s, per_seq_tok_s, prefill_tok_s;
    double ttft_p50, ttft_p99, itl_p50, itl_p99;
    double hit_rate, pcie_gb_s, cpu_share, prefetch_acc;
    double slots;           /* the executor's experts_on_gpu (cuda), NAN when not reported */
    double step_fwd_us, step_rtt_us; /* per step in the window: the executor's forward pass, the
                                        scheduler's round trip to the executor */
    /* the experts the prefetchers computed, over the window (NAN: not reported): per executor
     * step their experts, token rows, compute ms (summed over prefetchers) and the executor's ms
     * waiting; the weight GB/s they read; the jobs that fell back to the executor; their share of
     * every routed (token, expert) pair */
    double cx_experts_step, cx_tokens_step, cx_ms_step, cx_wait_ms_step, cx_gb_s, cx_fallbacks, pf_share;
    double cx_gpu_wait_share, cx_kappa; /* on the GPU: the share of those layers whose GPU waited for
                                           the CPU's results; the cost model's tuned factor at the end */
    double host_ms_step[GPU_HOST_PHASES]; /* on the GPU: the executor's host thread, ms a step by phase */
    double mean_conc;
    /* the disk tier over the level, warm-up included (the prefetchers' status; NAN without one):
     * expert slots, the share of fetches a slot served, the disk's read rate */
    double host_slots, host_hit_rate, disk_read_gb_s;
    char first_error[200];
} s_level_t;

/* The prefetchers' disk-tier counters, summed. */
typedef struct {
    double t, slots, hits, misses, disk_bytes;
    bool ok;
} s_pf_snap_t;

static void s_pf_snap(const s_conn_t *cn, s_pf_snap_t *p)
{
    memset(p, 0, sizeof *p);
    p->t = strata_now();
    for (int i = 0; i < cn->n_pf; i++) {
        msg_t m;
        if (gs_ask(cn->ctx, cn->pf_ep[i], MSG_PF_STATUS, MSG_FAM_PF_OUT, 1000, &m) < 0) return;
        if (m.type == MSG_PF_STATUS_REPLY) {
            p->slots += m.u.pf_status.slots;
            p->hits += (double)m.u.pf_status.host_hits;
            p->misses += (double)m.u.pf_status.host_misses;
            p->disk_bytes += (double)m.u.pf_status.disk_bytes;
        }
        msg_free(&m);
    }
    p->ok = cn->n_pf > 0 && p->slots > 0;
}

/* Send request k on its client's socket. A request that cannot be sent counts as a failed
 * answer at once (returns -1), so no loop waits for it. */
static int s_send_req(s_conn_t *cn, const s_opts_t *o, s_req_t *r, int k, uint64_t base_id, uint64_t *rng, int32_t *tok)
{
    int32_t V = cn->vocab > 0 ? cn->vocab : 1;
    for (int i = 0; i < o->prompt; i++) tok[i] = (int32_t)(strata_splitmix64(rng) % (uint64_t)V);
    msg_t m;
    msg_init(&m, MSG_GENERATE);
    m.has_id = true;
    m.id = base_id + (uint64_t)k;
    m.u.generate.tokens = tok;
    m.u.generate.n_tokens = o->prompt;
    m.u.generate.max_tokens = o->gen;
    m.u.generate.ignore_eos = true;
    m.u.generate.stream = true;
    /* Sampled at temperature 1, seeded per request: on random weights greedy decoding repeats
     * one token and pins the routing to the same experts, which is not the uniform load the
     * bound assumes. */
    m.u.generate.samp.temperature = 1.0f;
    m.u.generate.samp.seed = m.id;
    r->t_send = strata_now();
    r->sent = true;
    int rc = zmsg_send(cn->cl[r->client].sock, NULL, 0, &m, &cn->buf, 0);
    if (rc < 0) {
        r->failed = r->done = true;
        r->t_done = r->t_send;
        return -1;
    }
    cn->cl[r->client].inflight++;
    return 0;
}

/* The CPU-expert figures of L from the window's two snapshots; moe_pairs: the routed
 * (token, expert) pairs of one forwarded token (top_k x MoE layers), 0 when unknown. */
static void s_cpu_experts(s_level_t *L, const s_snap_t *a, const s_snap_t *b, double moe_pairs)
{
    L->cx_experts_step = L->cx_tokens_step = L->cx_ms_step = L->cx_wait_ms_step = L->cx_gb_s = L->cx_fallbacks =
        L->pf_share = L->cx_gpu_wait_share = L->cx_kappa = NAN;
    for (int p = 0; p < GPU_HOST_PHASES; p++) L->host_ms_step[p] = NAN;
    if (!a->ok || !b->ok) return;
    const double lay = b->cx_layers - a->cx_layers;
    if (isfinite(lay) && lay > 0) L->cx_gpu_wait_share = (b->cx_gpu_waits - a->cx_gpu_waits) / lay;
    L->cx_kappa = b->cx_kappa;
    double uses = b->cpu_expert - a->cpu_expert, rows = b->cx_rows - a->cx_rows, ns = b->ex_steps - a->ex_steps;
    double nt = b->ex_tokens - a->ex_tokens, by = b->cx_bytes - a->cx_bytes;
    if (isfinite(b->cx_fallbacks - a->cx_fallbacks)) L->cx_fallbacks = b->cx_fallbacks - a->cx_fallbacks;
    if (isfinite(by) && b->t > a->t) L->cx_gb_s = by / (b->t - a->t) / 1e9;
    if (isfinite(ns) && ns > 0) {
        L->cx_experts_step = uses / ns;  /* NAN propagates where a counter is absent */
        L->cx_tokens_step = rows / ns;
        L->cx_ms_step = (b->cx_compute_us - a->cx_compute_us) / ns / 1e3;
        L->cx_wait_ms_step = (b->cx_wait_us - a->cx_wait_us) / ns / 1e3;
        for (int p = 0; p < GPU_HOST_PHASES; p++) L->host_ms_step[p] = (b->host_us[p] - a->host_us[p]) / ns / 1e3;
    }
    if (isfinite(rows) && isfinite(nt) && nt > 0 && moe_pairs > 0) L->pf_share = rows / (nt * moe_pairs);
}

static int s_level(s_conn_t *cn, const s_opts_t *o, s_level_t *L, uint64_t level_no, double moe_pairs)
{
    int rc = 0;
    const int N = L->n_warm + L->n_req;
    s_req_t *req = calloc((size_t)N, sizeof *req);
    double *itl = NULL, *ttft = calloc((size_t)N, sizeof *ttft), *pseq = calloc((size_t)N, sizeof *pseq),
           *pre = calloc((size_t)N, sizeof *pre);
    size_t n_itl = 0, cap_itl = (size_t)N * (size_t)(o->gen + 1) + 16;
    itl = malloc(cap_itl * sizeof *itl);
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)o->prompt);
    double *arrive = calloc((size_t)N, sizeof *arrive);
    zmq_pollitem_t *items = calloc((size_t)cn->n_cl + 1, sizeof *items);
    if (!req || !itl || !ttft || !pseq || !pre || !tok || !arrive || !items) {
        rc = -ENOMEM;
        goto done;
    }
    uint64_t rng = o->seed * 1000003u + level_no, base_id = (level_no << 32) + 1;
    int n_clients = L->open ? cn->n_cl : L->conc;
    for (int k = 0; k < N; k++) {
        req[k].client = L->open ? k % n_clients : -1;
        req[k].measured = k >= L->n_warm;
    }
    if (L->open) { /* Poisson arrivals: exponential gaps of mean 1/rate */
        double t = 0;
        uint64_t ar = o->seed * 7919u + level_no;
        for (int k = 0; k < N; k++) {
            double u = ((double)(strata_splitmix64(&ar) >> 11) + 0.5) * 0x1.0p-53;
            t += -log(u) / L->rate;
            arrive[k] = t;
        }
    }
    int next = 0, done = 0, warm_done = 0;
    /* Issue request `next` on client c; one that cannot be sent is answered as failed at once,
     * and (closed loop) the client moves on to the next one. */
#define S_ISSUE(c)                                                                                  \
    do {                                                                                            \
        while (next < N) {                                                                          \
            req[next].client = (c);                                                                 \
            int k_ = next++;                                                                        \
            if (s_send_req(cn, o, &req[k_], k_, base_id, &rng, tok) == 0) {                         \
                inflight++;                                                                         \
                break;                                                                              \
            }                                                                                       \
            done++;                                                                                 \
            L->errors++;                                                                            \
            if (req[k_].measured) L->measured_done++;                                               \
            else warm_done++;                                                                       \
            if (!L->first_error[0]) snprintf(L->first_error, sizeof L->first_error, "cannot send"); \
            if (L->open) break;                                                                     \
        }                                                                                           \
    } while (0)
    double t_start = strata_now(), t_w0 = -1, t_w1 = 0, conc_area = 0, t_prev = t_start;
    int inflight = 0;
    s_snap_t snap0 = {0}, snap1 = {0};
    uint64_t snap_id = 0;
    s_pf_snap_t pf0, pf1;
    s_pf_snap(cn, &pf0);
    /* closed loop: every client starts one request */
    if (!L->open)
        for (int c = 0; c < L->conc && next < N; c++) S_ISSUE(c);
    if (L->n_warm == 0) {
        t_w0 = t_start;
        snap_id = s_ctl_send(cn, MSG_STATS);
    }
    while (done < N && !s_stop) {
        double now = strata_now();
        if (now - t_start > o->timeout_s) {
            snprintf(L->first_error, sizeof L->first_error, "level did not finish within %d s (%d of %d answers)",
                     o->timeout_s, done, N);
            rc = STRATA_ETIMEOUT;
            break;
        }
        if (L->open)
            while (next < N && now - t_start >= arrive[next]) S_ISSUE(req[next].client);
        int timeout_ms = 50;
        if (L->open && next < N) {
            double wait = arrive[next] - (now - t_start);
            timeout_ms = wait <= 0 ? 0 : wait < 0.05 ? (int)(wait * 1000) + 1 : 50;
        }
        for (int c = 0; c < n_clients; c++) items[c] = (zmq_pollitem_t){cn->cl[c].sock, 0, ZMQ_POLLIN, 0};
        items[n_clients] = (zmq_pollitem_t){cn->ctl, 0, ZMQ_POLLIN, 0};
        int pr = zmq_poll(items, n_clients + 1, timeout_ms);
        if (pr < 0 && zmq_errno() != EINTR) {
            rc = STRATA_EZMQ;
            break;
        }
        if (pr > 0 && (items[n_clients].revents & ZMQ_POLLIN)) {
            msg_t in;
            msg_err_t err;
            while (zmsg_recv(cn->ctl, MSG_FAM_REPLY, &in, &err, ZMQ_DONTWAIT) != -EAGAIN) {
                if (in.type == MSG_STATS_REPLY && in.has_id && in.id == snap_id && snap_id) {
                    s_snap_from(&in.u.stats, &snap0);
                    snap0.t = strata_now();
                }
                msg_free(&in);
            }
        }
        for (int c = 0; c < n_clients && pr > 0; c++) {
            if (!(items[c].revents & ZMQ_POLLIN)) continue;
            for (int burst = 0; burst < 256; burst++) {
                msg_t in;
                msg_err_t err;
                int r = zmsg_recv(cn->cl[c].sock, MSG_FAM_REPLY, &in, &err, ZMQ_DONTWAIT);
                if (r == -EAGAIN) break;
                double t = strata_now();
                if (r < 0 || !in.has_id || in.id < base_id || in.id >= base_id + (uint64_t)N) {
                    msg_free(&in);
                    continue;
                }
                int k = (int)(in.id - base_id);
                s_req_t *q = &req[k];
                bool finished = false;
                if (in.type == MSG_TOKEN && !q->done) {
                    int n = in.u.tokens.n_tokens;
                    if (n > 0) {
                        if (q->n_tok == 0) q->t_first = t;
                        else if (q->measured && n_itl + (size_t)n <= cap_itl)
                            for (int j = 0; j < n; j++) itl[n_itl++] = (t - q->t_last) * 1e3 / n;
                        q->n_tok += n;
                        q->t_last = t;
                        if (t_w0 >= 0) L->window_tokens += n;
                    }
                } else if (in.type == MSG_DONE) {
                    q->t_done = t;
                    q->prompt_tokens = in.u.done.prompt_tokens;
                    q->srv_ttft_ms = in.u.done.ttft_ms;
                    q->srv_queue_ms = in.u.done.queue_ms;
                    finished = true;
                } else if (in.type == MSG_ERROR) {
                    q->failed = true;
                    q->t_done = t;
                    if (!L->first_error[0])
                        snprintf(L->first_error, sizeof L->first_error, "%s: %.*s", msg_errcode_name(in.u.error.code),
                                 (int)in.u.error.message.len, in.u.error.message.s ? in.u.error.message.s : "");
                    finished = true;
                }
                msg_free(&in);
                if (!finished || q->done) continue;
                q->done = true;
                done++;
                conc_area += inflight * (t - t_prev);
                t_prev = t;
                inflight--;
                cn->cl[c].inflight--;
                if (q->failed) L->errors++;
                if (!q->measured) {
                    if (++warm_done == L->n_warm) { /* warm-up over: the window opens; stats asked now,
                                                     * read when the reply comes (never block here) */
                        t_w0 = t;
                        snap_id = s_ctl_send(cn, MSG_STATS);
                    }
                } else {
                    t_w1 = t;
                    L->measured_done++;
                }
                if (!L->open && next < N) S_ISSUE(c); /* closed loop: this client's next request */
            }
        }
    }
    if (s_stop && !rc) {
        snprintf(L->first_error, sizeof L->first_error, "interrupted");
        rc = STRATA_ECANCELED;
    }
    {
        msg_t sr;
        if (s_ctl(cn, MSG_STATS, MSG_STATS_REPLY, 2.0, &sr) == 0) {
            s_snap_from(&sr.u.stats, &snap1);
            snap1.t = strata_now();
            msg_free(&sr);
        }
    }
    /* figures over the measured requests */
    size_t n_t = 0, n_p = 0, n_r = 0;
    for (int k = 0; k < N; k++) {
        const s_req_t *q = &req[k];
        if (!q->measured || !q->done || q->failed || q->n_tok == 0) continue;
        ttft[n_t++] = (q->t_first - q->t_send) * 1e3;
        if (q->n_tok > 1 && q->t_last > q->t_first) pseq[n_p++] = (q->n_tok - 1) / (q->t_last - q->t_first);
        double srv = (q->srv_ttft_ms - q->srv_queue_ms) * 1e-3;
        if (q->prompt_tokens > 0 && srv > 0) pre[n_r++] = q->prompt_tokens / srv;
    }
    L->window_s = t_w0 >= 0 && t_w1 > t_w0 ? t_w1 - t_w0 : 0;
    L->decode_tok_s = L->window_s > 0 ? (double)L->window_tokens / L->window_s : NAN;
    L->per_seq_tok_s = strata_percentile(pseq, n_p, 0.5);
    L->prefill_tok_s = strata_percentile(pre, n_r, 0.5);
    L->ttft_p50 = strata_percentile(ttft, n_t, 0.5);
    L->ttft_p99 = strata_percentile(ttft, n_t, 0.99);
    L->itl_p50 = strata_percentile(itl, n_itl, 0.5);
    L->itl_p99 = strata_percentile(itl, n_itl, 0.99);
    L->mean_conc = t_prev > t_start ? conc_area / (t_prev - t_start) : NAN;
    L->hit_rate = L->pcie_gb_s = L->cpu_share = L->prefetch_acc = L->slots = L->step_fwd_us = L->step_rtt_us = NAN;
    if (snap1.ok && isfinite(snap1.slots) && snap1.slots > 0) L->slots = snap1.slots;
    if (snap0.ok && snap1.ok) {
        double h = snap1.hits - snap0.hits, m = snap1.misses - snap0.misses, c = snap1.cpu_expert - snap0.cpu_expert;
        if (isfinite(h) && isfinite(m) && h + m > 0) L->hit_rate = h / (h + m);
        if (isfinite(snap1.bytes_h2d - snap0.bytes_h2d) && snap1.t > snap0.t)
            L->pcie_gb_s = (snap1.bytes_h2d - snap0.bytes_h2d) / (snap1.t - snap0.t) / 1e9;
        if (isfinite(c) && isfinite(h) && isfinite(m) && h + m + c > 0) L->cpu_share = c / (h + m + c);
        double np = snap1.prefetches - snap0.prefetches, nu = snap1.prefetch_used - snap0.prefetch_used;
        if (isfinite(np) && isfinite(nu) && np > 0) L->prefetch_acc = nu / np;
        double ns = snap1.steps - snap0.steps;
        if (isfinite(ns) && ns > 0) {
            L->step_fwd_us = (snap1.fwd_us - snap0.fwd_us) / ns;
            L->step_rtt_us = (snap1.rtt_us - snap0.rtt_us) / ns;
        }
    }
    s_cpu_experts(L, &snap0, &snap1, moe_pairs);
    s_pf_snap(cn, &pf1);
    L->host_slots = L->host_hit_rate = L->disk_read_gb_s = NAN;
    if (pf0.ok && pf1.ok) {
        double h = pf1.hits - pf0.hits, m = pf1.misses - pf0.misses;
        L->host_slots = pf1.slots;
        if (h + m > 0) L->host_hit_rate = h / (h + m);
        if (pf1.t > pf0.t) L->disk_read_gb_s = (pf1.disk_bytes - pf0.disk_bytes) / (pf1.t - pf0.t) / 1e9;
    }
    if (!strcmp(o->backend, "cpu") && !o->router.endpoint) L->cpu_share = 1.0;
#undef S_ISSUE
done:
    free(req), free(itl), free(ttft), free(pseq), free(pre), free(tok), free(arrive), free(items);
    return rc;
}

/* ---- output ---------------------------------------------------------------------------- */

static int s_plot(const char *png, const char *dat, const char *title)
{
    char script[4500], path[4400];
    snprintf(path, sizeof path, "%s.gp", dat);
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fprintf(f,
            "set terminal pngcairo size 900,600 noenhanced\n"
            "set output '%s'\n"
            "set title '%s'\n"
            "set xlabel 'batch (concurrent sequences)'\n"
            "set ylabel 'decode tokens / s (aggregate)'\n"
            "set logscale x 2\nset logscale y 10\nset grid\nset key below\n"
            "plot '%s' using 1:2 with linespoints lw 2 pt 7 title 'measured', \\\n"
            "     '%s' using 1:3 with linespoints lw 2 dt 2 title 'bound, PCIe + CPU, bandwidths added (this machine)', \\\n"
            "     '%s' using 1:6 with linespoints lw 2 dt 2 title 'bound, PCIe + CPU, host memory shared (this machine)', \\\n"
            "     '%s' using 1:7 with linespoints lw 2 dt 2 title 'bound, PCIe only (this machine)', \\\n"
            "     '%s' using 1:4 with linespoints dt 3 title 'bound: RTX 3090, PCIe 3, 2x E5-2699 v4', \\\n"
            "     '%s' using 1:5 with linespoints dt 4 title 'bound: RTX 4090, PCIe 4, DDR5'\n",
            png, title, dat, dat, dat, dat, dat, dat);
    fclose(f);
    snprintf(script, sizeof script, "gnuplot '%s' 2>&1", path);
    FILE *p = popen(script, "r");
    if (!p) return -1;
    char line[512];
    while (fgets(line, sizeof line, p)) fprintf(stderr, "bench: gnuplot: %s", line);
    int st = pclose(p);
    return st == 0 ? 0 : -1;
}

/* The decode bounds at batch into *out (the bandwidths-added one returned); slots: the executor's real expert slots when it reported them
 * (NAN: estimated from the budget and the KV alone). */
static double s_bound(const s_model_t *mi, const machine_t *mc, const s_opts_t *o, int batch, bool cpu, double slots,
                      double host_slots, roofline_t *out)
{
    if (!mi->have || !(mc->cpu_bw > 0) || (!cpu && !(mc->hbm_bw > 0))) return NAN;
    roofline_run_t r;
    roofline_run_default(&r);
    r.batch = batch;
    r.context = o->prompt + o->gen / 2.0;
    r.gpu_mem = (double)o->gpu_mem;
    r.reserved_bytes = (double)batch * (o->prompt + o->gen) * mi->rm.kv_bytes_per_token;
    r.cpu_backend = cpu;
    if (!cpu && isfinite(slots) && slots > 0) r.slots = slots;
    if (isfinite(host_slots)) r.host_experts = host_slots;
    return roofline_decode(&mi->rm, mc, &r, out) == 0 ? out->bw_added_tok_s : NAN;
}

static double s_proj(const s_model_t *mi, const machine_t *mc, const s_opts_t *o, int batch)
{
    if (!mi->have) return NAN;
    roofline_run_t r;
    roofline_run_default(&r);
    r.batch = batch;
    r.context = o->prompt + o->gen / 2.0;
    r.gpu_mem = o->gpu_mem > 0 && o->gpu_mem < mc->gpu_mem ? (double)o->gpu_mem : mc->gpu_mem;
    r.reserved_bytes = (double)batch * (o->prompt + o->gen) * mi->rm.kv_bytes_per_token;
    roofline_t out;
    return roofline_decode(&mi->rm, mc, &r, &out) == 0 ? out.bw_added_tok_s : NAN;
}

/* The results case of a level (bench/results.h): model, formats, budget, load, prompt and gen,
 * and the options that change the figure. */
static void s_case(char *buf, size_t cap, const s_opts_t *o, const s_model_t *mi, const s_level_t *L, int max_conc,
                   bool cpu)
{
    char budget[32], load[64], fmt[64] = "?", extra[160] = "";
    results_budget_name(budget, sizeof budget, (double)o->gpu_mem);
    if (L->open) snprintf(load, sizeof load, "rate %g", L->rate);
    else snprintf(load, sizeof load, "batch %d", L->conc);
    if (mi->have) {
        if (mi->fmt == WF_INT4 && mi->group == 32) snprintf(fmt, sizeof fmt, "int4");
        else snprintf(fmt, sizeof fmt, "%s", mi->format);
        if (mi->attn_fmt != mi->fmt) {
            size_t n = strlen(fmt);
            snprintf(fmt + n, sizeof fmt - n, " attn %s", wfmt_name(mi->attn_fmt));
        }
    }
    /* a group sized for more sequences than this level has less room for experts */
    if (!L->open && max_conc != L->conc && o->gpu_mem > 0) snprintf(extra, sizeof extra, " (KV for %d)", max_conc);
    if (o->max_batch_tokens > 0) {
        size_t n = strlen(extra);
        snprintf(extra + n, sizeof extra - n, ", max-batch-tokens %d", o->max_batch_tokens);
    }
    if (o->expert_path && strcmp(o->expert_path, "auto") && !o->router.endpoint) {
        size_t n = strlen(extra);
        snprintf(extra + n, sizeof extra - n, ", expert-path %s", o->expert_path);
    }
    if (o->prefetchers > 1 && !o->router.endpoint) {
        size_t n = strlen(extra);
        snprintf(extra + n, sizeof extra - n, ", %d prefetchers", o->prefetchers);
    }
    if (o->pf_threads > 0 && !o->router.endpoint) {
        size_t n = strlen(extra);
        snprintf(extra + n, sizeof extra - n, ", %d prefetcher threads", o->pf_threads);
    }
    if (o->host_mem && !o->router.endpoint) {
        size_t n = strlen(extra);
        snprintf(extra + n, sizeof extra - n, ", host-mem %.40s", o->host_mem);
    }
    snprintf(buf, cap, "%s %s %s %s decode%s, prompt %d gen %d [strata bench%s%s]", mi->have ? mi->shape : "?", fmt,
             budget, load, extra, o->prompt, o->gen, o->router.endpoint ? " endpoint" : "", cpu && !o->router.endpoint ? " cpu" : "");
}

/* `strata bench`; returns the exit code. */
int cmd_bench(int argc, char **argv)
{
    s_opts_t o = {.backend = "cpu", .prefetchers = 1, .prompt = 128, .gen = 128, .timeout_s = 600, .probe_mib = 1024, .seed = 1, .ready_s = 120,
                  .requests = -1, .warmup = -1};
    const char *v, *batch_s = "1,16", *rate_s = NULL;
    int rc = 0, r;
    for (int i = 1; i < argc; i++) {
        int64_t x;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            s_help(stdout);
            return 0;
        }
        if ((r = cli_opt(C, argc, argv, &i, "--model", &v))) {
            if (r < 0) return 2;
            o.model = v;
        } else if ((r = rc_opt(C, argc, argv, &i, &o.router))) {
            if (r == 2) return 2;
        } else if ((r = cli_opt(C, argc, argv, &i, "--backend", &v))) {
            if (r < 0) return 2;
            if (strcmp(v, "cpu") && strcmp(v, "cuda")) {
                cli_error(C, "--backend '%s': expected cpu or cuda", v);
                return 2;
            }
            o.backend = v;
        } else if ((r = cli_opt(C, argc, argv, &i, "--expert-path", &v))) {
            if (r < 0) return 2;
            if (strcmp(v, "auto") && strcmp(v, "cpu") && strcmp(v, "pcie") && strcmp(v, "cost") && strcmp(v, "static")) {
                cli_error(C, "--expert-path '%s': expected auto, cpu, pcie, cost or static", v);
                return 2;
            }
            o.expert_path = v;
        } else if ((r = cli_opt(C, argc, argv, &i, "--host-mem", &v))) {
            if (r < 0) return 2;
            o.host_mem = v; /* checked by the group's config parser: strata up exits 2 naming it */
        } else if ((r = cli_opt(C, argc, argv, &i, "--cpu-moe-layers", &v))) {
            if (r < 0 || cli_parse_i64(C, "--cpu-moe-layers", v, 0, 4096, &x)) return 2;
            o.cpu_moe_layers = (int)x;
        } else if ((r = cli_opt(C, argc, argv, &i, "--prefetcher-threads", &v))) {
            if (r < 0 || cli_parse_i64(C, "--prefetcher-threads", v, 1, 4096, &x)) return 2;
            o.pf_threads = (int)x;
        } else if ((r = cli_opt(C, argc, argv, &i, "--prefetchers", &v))) {
            if (r < 0 || cli_parse_i64(C, "--prefetchers", v, 1, CONFIG_MAX_PREFETCHERS, &x)) return 2;
            o.prefetchers = (int)x;
        } else if ((r = cli_opt(C, argc, argv, &i, "--gpu-mem", &v))) {
            if (r < 0 || strata_parse_bytes(v, &o.gpu_mem) < 0) {
                if (r >= 0) cli_error(C, "--gpu-mem '%s': expected bytes with an optional K/M/G/T suffix", v);
                return 2;
            }
        } else if ((r = cli_opt(C, argc, argv, &i, "--batch", &v))) {
            if (r < 0) return 2;
            batch_s = v;
        } else if ((r = cli_opt(C, argc, argv, &i, "--rate", &v))) {
            if (r < 0) return 2;
            rate_s = v;
        } else if ((r = cli_opt(C, argc, argv, &i, "--threads", &v))) {
            if (r < 0 || cli_parse_i64(C, "--threads", v, 0, 4096, &x)) return 2;
            o.threads = (int)x;
        } else if ((r = cli_opt(C, argc, argv, &i, "--prompt", &v))) {
            if (r < 0 || cli_parse_i64(C, "--prompt", v, 1, 1 << 20, &x)) return 2;
            o.prompt = (int)x;
        } else if ((r = cli_opt(C, argc, argv, &i, "--gen", &v))) {
            if (r < 0 || cli_parse_i64(C, "--gen", v, 1, MSG_MAX_MAX_TOKENS, &x)) return 2;
            o.gen = (int)x;
        } else if ((r = cli_opt(C, argc, argv, &i, "--requests", &v))) {
            if (r < 0 || cli_parse_i64(C, "--requests", v, 1, 1 << 20, &x)) return 2;
            o.requests = (int)x;
        } else if ((r = cli_opt(C, argc, argv, &i, "--warmup", &v))) {
            if (r < 0 || cli_parse_i64(C, "--warmup", v, 0, 1 << 20, &x)) return 2;
            o.warmup = (int)x;
        } else if ((r = cli_opt(C, argc, argv, &i, "--seed", &v))) {
            if (r < 0 || cli_parse_u64(C, "--seed", v, &o.seed)) return 2;
        } else if ((r = cli_opt(C, argc, argv, &i, "--timeout", &v))) {
            if (r < 0 || cli_parse_i64(C, "--timeout", v, 1, 86400, &x)) return 2;
            o.timeout_s = (int)x;
        } else if ((r = cli_opt(C, argc, argv, &i, "--ready-timeout", &v))) {
            if (r < 0 || cli_parse_i64(C, "--ready-timeout", v, 1, 86400, &x)) return 2;
            o.ready_s = (int)x;
        } else if ((r = cli_opt(C, argc, argv, &i, "--json", &v))) {
            if (r < 0) return 2;
            o.json = v;
        } else if ((r = cli_opt(C, argc, argv, &i, "--results", &v))) {
            if (r < 0) return 2;
            o.results = v;
        } else if ((r = cli_opt(C, argc, argv, &i, "--max-batch-tokens", &v))) {
            if (r < 0 || cli_parse_i64(C, "--max-batch-tokens", v, 1, 1 << 20, &x)) return 2;
            o.max_batch_tokens = (int)x;
        } else if ((r = cli_opt(C, argc, argv, &i, "--plot", &v))) {
            if (r < 0) return 2;
            o.plot = v;
        } else if ((r = cli_opt(C, argc, argv, &i, "--probe-mib", &v))) {
            if (r < 0 || cli_parse_i64(C, "--probe-mib", v, 16, 1 << 20, &x)) return 2;
            o.probe_mib = (int)x;
        } else if ((r = cli_opt(C, argc, argv, &i, "--run-dir", &v))) {
            if (r < 0) return 2;
            o.run_dir_arg = v;
        } else if (!strcmp(argv[i], "--no-plot")) {
            o.no_plot = true;
        } else if (!strcmp(argv[i], "--no-probe")) {
            o.no_probe = true;
        } else if (!strcmp(argv[i], "--keep")) {
            o.keep = true;
        } else {
            cli_error(C, "unexpected argument '%s' (see --help)", argv[i]);
            return 2;
        }
    }
    if (!o.model && !o.router.endpoint) {
        cli_error(C, "give --model DIR (and/or --endpoint E) (see --help)");
        return 2;
    }
    const rc_keys_t *keys = &o.router.keys;
    rc_keys_env(&o.router.keys);
    if ((keys->server_key || keys->client_key) && !o.router.endpoint) {
        cli_error(C, "--curve-server-key and --curve-client-key (or STRATA_CURVE_*) are for --endpoint: the group bench "
                     "starts listens on loopback without CURVE");
        return 2;
    }
    if (keys->client_key && !keys->server_key) {
        cli_error(C, "--curve-client-key needs --curve-server-key (the router's public key file)");
        return 2;
    }
    double lv[MAX_LEVELS];
    if (rate_s) {
        o.open_loop = true;
        if (s_parse_list(rate_s, lv, MAX_LEVELS, &o.n_levels, false) < 0) {
            cli_error(C, "--rate '%s': expected positive numbers separated by commas", rate_s);
            return 2;
        }
        for (int i = 0; i < o.n_levels; i++) o.rates[i] = lv[i];
    } else {
        if (s_parse_list(batch_s, lv, MAX_LEVELS, &o.n_levels, true) < 0) {
            cli_error(C, "--batch '%s': expected sizes in [1, 4096] separated by commas", batch_s);
            return 2;
        }
        for (int i = 0; i < o.n_levels; i++) o.levels[i] = (int)lv[i];
    }
    if (!o.plot && o.json && !o.no_plot) {
        static char png[4200];
        snprintf(png, sizeof png, "%s", o.json);
        char *dot = strrchr(png, '.'), *sl = strrchr(png, '/');
        if (dot && (!sl || dot > sl)) *dot = 0;
        strncat(png, ".png", sizeof png - strlen(png) - 1);
        o.plot = png;
    }
    cli_quiet_logs();

    s_model_t mi = {0};
    if (o.model && (rc = s_model_info(o.model, &mi))) return rc;
    /* routed (token, expert) pairs per forwarded token, for prefetcher_expert_share */
    double moe_pairs = 0;
    for (int l = 0; mi.have && l < mi.cfg.n_layers && l < (int)(sizeof mi.cfg.layer_sparse); l++)
        moe_pairs += mi.cfg.layer_sparse[l] ? mi.cfg.top_k : 0;
    int max_conc = 1;
    for (int i = 0; i < o.n_levels; i++) {
        int c = o.open_loop ? 64 : o.levels[i];
        if (c > max_conc) max_conc = c;
    }
    bool cpu = !strcmp(o.backend, "cpu");
    if (o.max_batch_tokens > 0 && o.max_batch_tokens < max_conc) {
        cli_error(C, "--max-batch-tokens %d is below the largest batch (%d): every decode token of a step must fit",
                  o.max_batch_tokens, max_conc);
        return 2;
    }

    /* ceilings first, on a quiet machine */
    machine_t here;
    char machine[256] = "";
    s_probe_t pr = {0};
    if (!o.no_probe) {
        s_ceilings(&o, &here, machine, sizeof machine, !cpu, &pr);
        fprintf(stderr, "bench: ceilings of %s: cpu read %.1f GB/s", machine, here.cpu_bw / 1e9);
        if (here.hbm_bw > 0)
            fprintf(stderr, ", h2d %.1f GB/s, gpu read %.0f GB/s, gpu memory %.1f GiB", here.pcie_bw / 1e9,
                    here.hbm_bw / 1e9, here.gpu_mem / GIB);
        if (here.host_bw > 0)
            fprintf(stderr, "; both at once h2d %.1f + cpu %.1f = %.1f GB/s", pr.h2d_shared / 1e9, pr.cpu_shared / 1e9,
                    here.host_bw / 1e9);
        fprintf(stderr, "\n");
    } else {
        memset(&here, 0, sizeof here);
        gethostname(machine, sizeof machine - 1);
    }
    /* the results envelope's machine, commit and command (bench/results.h) */
    char commit[128], command[8192], self_dir[4096];
    if (!pr.desc[0]) results_machine(pr.desc, sizeof pr.desc, NULL, 0, 0);
    s_self_dir(self_dir, sizeof self_dir);
    /* the tree this strata was built from; with none (not a git checkout), the probe's, then git */
    results_commit(commit, sizeof commit, STRATA_BUILD_COMMIT[0] ? STRATA_BUILD_COMMIT : pr.built, self_dir);
    if (!commit[0]) results_commit(commit, sizeof commit, NULL, NULL);
    results_command(command, sizeof command, "strata", argc, argv);

    struct sigaction sa = {.sa_handler = s_on_signal}, old_int, old_term;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);

    s_group_t g = {0};
    s_conn_t cn = {0};
    json_t *rows = json_array();
    const char *endpoint = o.router.endpoint;
    s_level_t *res = calloc((size_t)o.n_levels, sizeof *res);
    if (!endpoint) {
        if ((rc = s_group_start(&o, &g, max_conc))) goto done;
        endpoint = g.endpoint;
    }
    if (keys->server_key &&
        (rc = rc_curve_read(C, keys->server_key, "--curve-server-key", keys->client_key, "--curve-client-key", &cn.curve)))
        goto done;
    cn.ctx = zmq_ctx_new();
    if (g.started && o.host_mem) /* the disk tier's counters come from the prefetchers' status */
        for (cn.n_pf = 0; cn.n_pf < o.prefetchers && cn.n_pf < CONFIG_MAX_PREFETCHERS; cn.n_pf++)
            snprintf(cn.pf_ep[cn.n_pf], sizeof cn.pf_ep[cn.n_pf], "ipc://%s/prefetcher-%d.sock", g.run_dir, cn.n_pf);
    cn.n_cl = max_conc > OPEN_SOCKETS ? max_conc : OPEN_SOCKETS;
    cn.cl = calloc((size_t)cn.n_cl, sizeof *cn.cl);
    if (!cn.ctx || !cn.cl || !res) {
        rc = 1;
        goto done;
    }
    char ident[64];
    snprintf(ident, sizeof ident, "bench-%d-ctl", (int)getpid());
    if (!(cn.ctl = s_socket(&cn, endpoint, ident))) {
        cli_error(C, "cannot connect to %s", endpoint);
        rc = 2;
        goto done;
    }
    for (int c = 0; c < cn.n_cl; c++) {
        snprintf(ident, sizeof ident, "bench-%d-%d", (int)getpid(), c);
        if (!(cn.cl[c].sock = s_socket(&cn, endpoint, ident))) {
            cli_error(C, "cannot connect to %s", endpoint);
            rc = 2;
            goto done;
        }
    }
    if (s_wait_ready(&cn, o.ready_s) < 0) {
        cli_error(C, "the router at %s does not report a ready scheduler within %d s", endpoint, o.ready_s);
        rc = 1;
        goto done;
    }
    if (mi.have && mi.cfg.vocab != cn.vocab)
        log_warn("bench: the group serves vocab %d, --model has %d", cn.vocab, mi.cfg.vocab);
    if (cn.max_context > 0 && o.prompt + o.gen > cn.max_context) {
        cli_error(C, "--prompt %d + --gen %d exceed the group's context of %d tokens", o.prompt, o.gen, cn.max_context);
        rc = 2;
        goto done;
    }

    printf("%-6s %7s %9s %10s %10s %9s %9s %9s %9s %6s %7s %6s %10s %7s %10s %7s %11s %7s\n", o.open_loop ? "rate" : "batch",
           "reqs", "tok/s", "tok/s/seq", "prefill/s", "ttft p50", "ttft p99", "itl p50", "itl p99", "hit", "pcie", "cpu%",
           "pcie-only", "ratio", "bw-added", "ratio", "host-shared", "ratio");
    int total_ok = 0;
    for (int li = 0; li < o.n_levels && !s_stop; li++) {
        s_level_t *L = &res[li];
        L->open = o.open_loop;
        L->conc = o.open_loop ? 0 : o.levels[li];
        L->rate = o.open_loop ? o.rates[li] : 0;
        int base = o.open_loop ? 16 : L->conc;
        L->n_req = o.requests > 0 ? o.requests : (2 * base > 4 ? 2 * base : 4);
        L->n_warm = o.warmup >= 0 ? o.warmup : (base > 1 ? base : 1);
        int e = s_level(&cn, &o, L, (uint64_t)li + 1, moe_pairs);
        if (e == -ENOMEM) {
            rc = 1;
            goto done;
        }
        total_ok += L->measured_done - L->errors;
        int bb = o.open_loop ? (int)lround(L->mean_conc > 1 ? L->mean_conc : 1) : L->conc;
        roofline_t bo;
        double bound = o.no_probe ? NAN : s_bound(&mi, &here, &o, bb, cpu, L->slots, L->host_slots, &bo);
        /* the three bounds (NAN where there is none) and measured / each */
        bool hb = isfinite(bound);
        double po = hb && !cpu && bo.pcie_only_tok_s > 0 ? bo.pcie_only_tok_s : NAN;
        double hs = hb ? bo.host_shared_tok_s : NAN;
        double ratio = hb && bound > 0 ? L->decode_tok_s / bound : NAN;
        double po_ratio = isfinite(po) ? L->decode_tok_s / po : NAN;
        double hs_ratio = isfinite(hs) && hs > 0 ? L->decode_tok_s / hs : NAN;
        double tt = hb && isfinite(L->host_slots) && bo.three_tier_tok_s > 0 ? bo.three_tier_tok_s : NAN;
        double tt_ratio = isfinite(tt) ? L->decode_tok_s / tt : NAN;
        char lvl[32];
        if (o.open_loop) snprintf(lvl, sizeof lvl, "%.3g", L->rate);
        else snprintf(lvl, sizeof lvl, "%d", L->conc);
        char f_hit[16], f_pcie[16], f_cpu[16], f_bound[16], f_ratio[16], f_po[16], f_por[16], f_hs[16], f_hsr[16];
        s_fmt(f_hit, sizeof f_hit, "%.3f", L->hit_rate, 1);
        s_fmt(f_pcie, sizeof f_pcie, "%.2fG", L->pcie_gb_s, 1);
        s_fmt(f_cpu, sizeof f_cpu, "%.1f%%", L->cpu_share, 100);
        s_fmt(f_bound, sizeof f_bound, "%.2f", bound, 1);
        s_fmt(f_ratio, sizeof f_ratio, "%.3f", ratio, 1);
        s_fmt(f_po, sizeof f_po, "%.2f", po, 1);
        s_fmt(f_por, sizeof f_por, "%.3f", po_ratio, 1);
        s_fmt(f_hs, sizeof f_hs, "%.2f", hs, 1);
        s_fmt(f_hsr, sizeof f_hsr, "%.3f", hs_ratio, 1);
        printf("%-6s %7d %9.2f %10.2f %10.1f %8.1fm %8.1fm %8.2fm %8.2fm %6s %7s %6s %10s %7s %10s %7s %11s %7s\n", lvl,
               L->measured_done, L->decode_tok_s, L->per_seq_tok_s, L->prefill_tok_s, L->ttft_p50, L->ttft_p99,
               L->itl_p50, L->itl_p99, f_hit, f_pcie, f_cpu, f_po, f_por, f_bound, f_ratio, f_hs, f_hsr);
        if (isfinite(L->step_rtt_us))
            printf("       per step: the executor's forward %.2f ms, the scheduler's round trip %.2f ms (the control "
                   "plane and sampling %.0f us)\n",
                   L->step_fwd_us / 1e3, L->step_rtt_us / 1e3, L->step_rtt_us - L->step_fwd_us);
        if (isfinite(L->prefetch_acc))
            printf("       prefetch accuracy %.3f (experts copied ahead that their layer used)\n", L->prefetch_acc);
        if (isfinite(L->host_slots)) {
            char f_tt[16], f_ttr[16], f_hh[16];
            s_fmt(f_tt, sizeof f_tt, "%.2f", tt, 1);
            s_fmt(f_ttr, sizeof f_ttr, "%.3f", tt_ratio, 1);
            s_fmt(f_hh, sizeof f_hh, "%.3f", L->host_hit_rate, 1);
            printf("       disk tier: %.0f host slots, host hit rate %s, disk read %.2f GB/s; three-tier bound %s tok/s "
                   "(%s, disk %.2f GB/s), ratio %s\n", L->host_slots, f_hh, L->disk_read_gb_s, f_tt,
                   hb ? bo.three_tier_limit : "no ceilings", here.disk_bw / 1e9, f_ttr);
        }
        if (isfinite(L->cx_experts_step)) {
            char f_share[16];
            s_fmt(f_share, sizeof f_share, "%.3f", L->pf_share, 1);
            printf("       prefetchers' experts per step: %.2f experts, %.2f token rows, compute %.3f ms, the "
                   "executor's wait %.3f ms; %.2f GB/s of weights, share %s, %.0f fallbacks\n",
                   L->cx_experts_step, L->cx_tokens_step, L->cx_ms_step, L->cx_wait_ms_step, L->cx_gb_s, f_share,
                   L->cx_fallbacks);
            if (isfinite(L->cx_gpu_wait_share))
                printf("       the GPU waited for the CPU's experts in %.0f%% of their layers; the cost model's "
                       "tuned factor %.3f\n", 100.0 * L->cx_gpu_wait_share, L->cx_kappa);
        }
        if (isfinite(L->host_ms_step[GPU_HOST_ROWS])) {
            printf("       the executor's host thread, ms a step:");
            for (int p = 0; p < GPU_HOST_PHASES; p++) printf(" %s %.3f", gpu_host_phase_name(p), L->host_ms_step[p]);
            printf("\n");
        }
        if (L->errors || e < 0)
            fprintf(stderr, "bench: level %s: %d errors%s%s\n", lvl, L->errors, L->first_error[0] ? "; first: " : "",
                    L->first_error);
        fflush(stdout);
        json_t *row = json_object();
        json_object_set_new(row, "host", json_string(machine));
        json_object_set_new(row, "model_shape", mi.have ? json_string(mi.shape) : json_null());
        json_object_set_new(row, "format", mi.have ? json_string(mi.format) : json_null());
        json_object_set_new(row, "backend", o.router.endpoint ? json_null() : json_string(o.backend));
        json_object_set_new(row, "expert_path", o.router.endpoint ? json_null() : json_string(o.expert_path ? o.expert_path : "auto"));
        json_object_set_new(row, "prefetchers", o.router.endpoint ? json_null() : json_integer(o.prefetchers));
        json_object_set_new(row, "gpu_mem", json_integer(o.gpu_mem));
        json_object_set_new(row, "load", json_string(o.open_loop ? "open" : "closed"));
        json_object_set_new(row, "batch", json_integer(bb));
        json_object_set_new(row, "rate_rps", o.open_loop ? json_real(L->rate) : json_null());
        json_object_set_new(row, "mean_concurrency", s_num(L->mean_conc));
        json_object_set_new(row, "prompt", json_integer(o.prompt));
        json_object_set_new(row, "gen", json_integer(o.gen));
        json_object_set_new(row, "requests", json_integer(L->measured_done));
        json_object_set_new(row, "warmup", json_integer(L->n_warm));
        json_object_set_new(row, "errors", json_integer(L->errors));
        json_object_set_new(row, "window_s", s_num(L->window_s));
        json_object_set_new(row, "decode_tok_s", s_num(L->decode_tok_s));
        json_object_set_new(row, "decode_tok_s_per_seq", s_num(L->per_seq_tok_s));
        json_object_set_new(row, "prefill_tok_s", s_num(L->prefill_tok_s));
        json_object_set_new(row, "ttft_p50_ms", s_num(L->ttft_p50));
        json_object_set_new(row, "ttft_p99_ms", s_num(L->ttft_p99));
        json_object_set_new(row, "itl_p50_ms", s_num(L->itl_p50));
        json_object_set_new(row, "itl_p99_ms", s_num(L->itl_p99));
        json_object_set_new(row, "hit_rate", s_num(L->hit_rate));
        json_object_set_new(row, "prefetch_accuracy", s_num(L->prefetch_acc));
        json_object_set_new(row, "slots", s_num(L->slots));
        json_object_set_new(row, "pcie_gb_s", s_num(L->pcie_gb_s));
        json_object_set_new(row, "step_forward_us", s_num(L->step_fwd_us));
        json_object_set_new(row, "step_rtt_us", s_num(L->step_rtt_us));
        json_object_set_new(row, "cpu_expert_share", s_num(L->cpu_share));
        json_object_set_new(row, "prefetcher_expert_share", s_num(L->pf_share));
        json_object_set_new(row, "cpu_experts_per_step", s_num(L->cx_experts_step));
        json_object_set_new(row, "cpu_tokens_per_step", s_num(L->cx_tokens_step));
        json_object_set_new(row, "cpu_ms_per_step", s_num(L->cx_ms_step));
        json_object_set_new(row, "cpu_wait_ms_per_step", s_num(L->cx_wait_ms_step));
        json_object_set_new(row, "cpu_gb_s", s_num(L->cx_gb_s));
        json_object_set_new(row, "cpu_gpu_wait_share", s_num(L->cx_gpu_wait_share));
        json_object_set_new(row, "cpu_kappa", s_num(L->cx_kappa));
        json_t *hp = isfinite(L->host_ms_step[GPU_HOST_ROWS]) ? json_object() : json_null();
        for (int p = 0; hp && json_is_object(hp) && p < GPU_HOST_PHASES; p++)
            json_object_set_new(hp, gpu_host_phase_name(p), s_num(L->host_ms_step[p]));
        json_object_set_new(row, "host_ms_per_step", hp);
        json_object_set_new(row, "cpu_expert_fallbacks", isfinite(L->cx_fallbacks) ? json_integer((json_int_t)L->cx_fallbacks)
                                                                                    : json_null());
        json_object_set_new(row, "bound_pcie_only_tok_s", s_num(po));
        json_object_set_new(row, "ratio_pcie_only", s_num(po_ratio));
        json_object_set_new(row, "bound_bw_added_tok_s", s_num(bound));
        json_object_set_new(row, "ratio_bw_added", s_num(ratio));
        json_object_set_new(row, "bound_host_shared_tok_s", s_num(hs));
        json_object_set_new(row, "ratio_host_shared", s_num(hs_ratio));
        json_object_set_new(row, "bound_three_tier_tok_s", s_num(tt));
        json_object_set_new(row, "ratio_three_tier", s_num(tt_ratio));
        json_object_set_new(row, "bound_three_tier_limit", isfinite(L->host_slots) && hb ? json_string(bo.three_tier_limit) : json_null());
        json_object_set_new(row, "host_mem", o.host_mem ? json_string(o.host_mem) : json_null());
        json_object_set_new(row, "host_slots", s_num(L->host_slots));
        json_object_set_new(row, "host_hit_rate", s_num(L->host_hit_rate));
        json_object_set_new(row, "disk_read_gb_s", s_num(L->disk_read_gb_s));
        json_object_set_new(row, "bound_tok_s", s_num(bound));
        json_object_set_new(row, "bound_limit", hb ? json_string(bo.bw_added_limit) : json_null());
        json_object_set_new(row, "bound_pcie_only_limit", isfinite(po) ? json_string(bo.pcie_only_limit) : json_null());
        json_object_set_new(row, "bound_host_shared_limit", hb ? json_string(bo.host_shared_limit) : json_null());
        json_object_set_new(row, "host_shared_gb_s_used", hb ? json_real(bo.host_bw / 1e9) : json_null());
        json_object_set_new(row, "host_shared_assumed", hb ? json_boolean(bo.host_bw_assumed) : json_null());
        json_object_set_new(row, "max_batch_tokens", o.router.endpoint ? json_null()
                                                                    : json_integer(o.max_batch_tokens > 0 ? o.max_batch_tokens
                                                                                   : max_conc > 256 ? max_conc : 256));
        json_object_set_new(row, "bound_rtx3090_tok_s", s_num(s_proj(&mi, &roofline_rtx3090, &o, bb)));
        json_object_set_new(row, "bound_rtx4090_tok_s", s_num(s_proj(&mi, &roofline_rtx4090, &o, bb)));
        json_object_set_new(row, "ceilings",
                            json_pack("{s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o}", "cpu_gb_s", s_num(here.cpu_bw / 1e9), "pcie_gb_s",
                                      here.pcie_bw > 0 ? json_real(here.pcie_bw / 1e9) : json_null(), "hbm_gb_s",
                                      here.hbm_bw > 0 ? json_real(here.hbm_bw / 1e9) : json_null(), "gpu_mem",
                                      here.gpu_mem > 0 ? json_real(here.gpu_mem) : json_null(), "h2d_shared_gb_s",
                                      pr.h2d_shared > 0 ? json_real(pr.h2d_shared / 1e9) : json_null(), "cpu_shared_gb_s",
                                      pr.cpu_shared > 0 ? json_real(pr.cpu_shared / 1e9) : json_null(), "host_shared_gb_s",
                                      here.host_bw > 0 ? json_real(here.host_bw / 1e9) : json_null(), "disk_gb_s",
                                      here.disk_bw > 0 ? json_real(here.disk_bw / 1e9) : json_null()));
        json_object_set_new(row, "first_error", L->first_error[0] ? json_string(L->first_error) : json_null());
        /* the results envelope: on the GPU against the PCIe-only bound (this engine computes
         * every expert there) unless the group reports experts computed on the CPU, then
         * against host memory shared; on the CPU backend against host memory */
        char case_name[512];
        s_case(case_name, sizeof case_name, &o, &mi, L, max_conc, cpu);
        results_envelope_t env = {.case_name = case_name, .commit = commit, .machine = pr.desc, .command = command,
                                  .shape = mi.have ? mi.shape : NULL, .format = mi.have ? mi.format : NULL,
                                  .attn_format = mi.have ? wfmt_name(mi.attn_fmt) : NULL,
                                  .gpu_budget = (double)o.gpu_mem, .figure = L->decode_tok_s,
                                  .unit = "decode tok/s (aggregate)", .bound = NAN};
        if (isfinite(tt)) env.bound = tt, env.bound_name = "three_tier";
        else if (cpu) env.bound = bound, env.bound_name = "cpu_memory";
        else if (isfinite(L->cpu_share) && L->cpu_share > 0) env.bound = hs, env.bound_name = "host_shared";
        else env.bound = po, env.bound_name = "pcie_only";
        results_envelope(row, &env);
        json_array_append_new(rows, row);
    }
    if (mi.have && !o.no_probe && o.n_levels) {
        roofline_run_t rr;
        roofline_run_default(&rr);
        rr.batch = o.open_loop ? 1 : o.levels[0];
        rr.context = o.prompt + o.gen / 2.0;
        rr.gpu_mem = (double)o.gpu_mem;
        rr.reserved_bytes = (double)rr.batch * (o.prompt + o.gen) * mi.rm.kv_bytes_per_token;
        rr.cpu_backend = cpu;
        if (!cpu && isfinite(res[0].slots) && res[0].slots > 0) rr.slots = res[0].slots;
        if (isfinite(res[0].host_slots)) rr.host_experts = res[0].host_slots;
        printf("\n%s %s, gpu_mem %.2f GiB, batch %d:\n", mi.shape, mi.format, o.gpu_mem / GIB, rr.batch);
        roofline_print(stdout, &mi.rm, &here, &rr, res[0].decode_tok_s);
    }
    if (o.json && json_dump_file(rows, o.json, JSON_INDENT(2)) < 0) {
        cli_error(C, "cannot write %s", o.json);
        rc = 1;
    }
    if (o.results) {
        if (results_append(o.results, rows) < 0) {
            cli_error(C, "cannot append to %s: %s", o.results, strerror(errno));
            rc = 1;
        } else {
            fprintf(stderr, "bench: %zu results rows appended to %s\n", json_array_size(rows), o.results);
        }
    }
    if (o.plot && !o.no_plot && !o.open_loop) {
        char dat[4300];
        snprintf(dat, sizeof dat, "%s.dat", o.plot);
        FILE *f = fopen(dat, "w");
        if (f) {
            fprintf(f, "# batch measured_tok_s bound_bw_added bound_rtx3090 bound_rtx4090 bound_host_shared "
                       "bound_pcie_only\n");
            for (int li = 0; li < o.n_levels; li++) {
                roofline_t bo;
                double b = o.no_probe ? NAN : s_bound(&mi, &here, &o, o.levels[li], cpu, res[li].slots, res[li].host_slots, &bo);
                double hs = isfinite(b) ? bo.host_shared_tok_s : NAN;
                double po = isfinite(b) && bo.pcie_only_tok_s > 0 ? bo.pcie_only_tok_s : NAN;
                fprintf(f, "%d %g %g %g %g %g %g\n", o.levels[li], res[li].decode_tok_s, isfinite(b) ? b : NAN,
                        s_proj(&mi, &roofline_rtx3090, &o, o.levels[li]), s_proj(&mi, &roofline_rtx4090, &o, o.levels[li]),
                        hs, po);
            }
            fclose(f);
            char title[400];
            snprintf(title, sizeof title, "strata bench: %s %s, %s backend, gpu_mem %.1f GiB, prompt %d, gen %d",
                     mi.have ? mi.shape : "?", mi.have ? mi.format : "", o.backend, o.gpu_mem / GIB, o.prompt, o.gen);
            if (s_plot(o.plot, dat, title) == 0) fprintf(stderr, "bench: plot %s\n", o.plot);
            else log_warn("bench: gnuplot failed or is missing; no plot (data in %s)", dat);
        }
    }
    if (total_ok == 0 && !rc) {
        cli_error(C, "no request completed%s%s", res[0].first_error[0] ? ": " : "", res[0].first_error);
        rc = 1;
    }
done:
    for (int c = 0; cn.cl && c < cn.n_cl; c++)
        if (cn.cl[c].sock) zmq_close(cn.cl[c].sock);
    if (cn.ctl) zmq_close(cn.ctl);
    free(cn.cl);
    msg_buf_free(&cn.buf);
    if (cn.ctx) zmq_ctx_term(cn.ctx);
    explicit_bzero(cn.curve.sec, sizeof cn.curve.sec);
    if (g.started) {
        if (o.keep) {
            fprintf(stderr, "bench: the group keeps running: strata down --config %s\n", g.config);
        } else {
            s_group_stop(&g);
            if (rc == 0 && !g.started) s_rm_run_dir(g.run_dir);
            else fprintf(stderr, "bench: logs kept in %s\n", g.run_dir);
        }
    }
    json_decref(rows);
    free(res);
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    return rc;
}
