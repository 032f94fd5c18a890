/* cpu_matmul - decode matmul speed against the machine's own memory read bandwidth.
 *
 * 1. Measures the memory read bandwidth: every thread of the pool streams its share of a
 *    buffer much larger than the caches; the best of several passes is the bound.
 * 2. For each weight format, builds enough Qwen3-30B-A3B-shaped experts (gate/up 768x2048,
 *    down 2048x768; --hidden/--inter for others) to exceed the caches by far, then runs
 *    cpu_matmul at n tokens (--tokens, default 1; and the fused cpu_ffn_swiglu) over all of
 *    them in turn, the way decode walks through the active experts of many layers. The
 *    figure is weight bytes (data + scales) read per second; the ratio is figure / bound.
 *    --act q8 gives INT4 and MXFP4 their int8-activation path (CPU_ACT_Q8), --isa picks the
 *    kernels. --group is INT4's; MXFP4's blocks are always 32.
 * Prints a table; --json FILE writes the same with the machine's name, cpu and threads.
 * GB/cpu-s is weight bytes per second of process CPU time, i.e. what one core streams while
 * it runs: on a machine shared with other work it shows the kernels' own speed (spinning
 * pool workers count, so it errs low).
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/strata.h"
#include "bench/roofline.h"
#include "kernels/cpu/ops.h"

typedef struct {
    const char *shape; /* "768x2048", "ffn 2048-768-2048" */
    wfmt_t fmt;
    double gbps, gbps_median, ratio;
    double us_per_call;
    double cpu_gbps;   /* weight bytes per second of process CPU time: one core's rate */
} res_t;

/* ---- weights ---- */

typedef struct {
    qmat_t m[3];   /* gate, up: [inter][hidden]; down: [hidden][inter] */
} expert_t;

static size_t s_qbytes(const qmat_t *m)
{
    return qmat_data_bytes(m->fmt, m->rows, m->cols) + qmat_scale_bytes(m->fmt, m->rows, m->cols, m->group);
}

/* One quantized template per shape, copied into n_experts distinct buffers. */
static int s_make_experts(wfmt_t fmt, int hidden, int inter, int group, int n_experts, expert_t *ex, void **blob)
{
    group = fmt == WF_INT4 ? group : fmt == WF_MXFP4 ? 32 : 0; /* MXFP4's blocks are always 32 */
    const int shapes[3][2] = {{inter, hidden}, {inter, hidden}, {hidden, inter}};
    qmat_t tmpl[2];
    void *td[2] = {0}, *ts[2] = {0};
    size_t per = 0, rc = 0;
    for (int k = 0; k < 2; k++) {
        int rows = shapes[k + 1][0], cols = shapes[k + 1][1];
        float *src = malloc(sizeof(float) * rows * cols);
        if (!src) return -ENOMEM;
        uint64_t s = 12345 + k;
        for (int64_t i = 0; i < (int64_t)rows * cols; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            src[i] = ((float)(s >> 40) / 16777216.0f - 0.5f) * 0.05f;
        }
        td[k] = malloc(qmat_data_bytes(fmt, rows, cols));
        ts[k] = malloc(qmat_scale_bytes(fmt, rows, cols, group) + 1);
        rc = qmat_quantize(fmt, group, src, rows, cols, td[k], ts[k]);
        free(src);
        if (rc) return (int)rc;
        tmpl[k] = (qmat_t){.fmt = fmt, .rows = rows, .cols = cols, .group = group,
                           .data = td[k], .scales = ts[k]};
    }
    for (int k = 0; k < 3; k++) per += s_qbytes(&tmpl[k == 2 ? 1 : 0]) + 128;
    char *b = NULL;
    if (posix_memalign((void **)&b, 4096, per * (size_t)n_experts) != 0) return -ENOMEM;
    *blob = b;
    for (int e = 0; e < n_experts; e++) {
        for (int k = 0; k < 3; k++) {
            const qmat_t *t = &tmpl[k == 2 ? 1 : 0];
            size_t db = qmat_data_bytes(fmt, t->rows, t->cols), sb = qmat_scale_bytes(fmt, t->rows, t->cols, group);
            memcpy(b, t->data, db);
            ex[e].m[k] = *t;
            ex[e].m[k].data = b;
            b += (db + 63) & ~(size_t)63;
            if (sb) {
                memcpy(b, t->scales, sb);
                ex[e].m[k].scales = b;
                b += (sb + 63) & ~(size_t)63;
            }
        }
    }
    for (int k = 0; k < 2; k++) {
        free(td[k]);
        free(ts[k]);
    }
    return 0;
}

static int s_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Run `passes` passes over all experts; each pass runs kind 0: gate+up+down as three
 * cpu_matmul calls, or kind 1: cpu_ffn_swiglu. Returns best and median GB/s. */
static double s_cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void s_time(tpool_t *pool, expert_t *ex, int n_experts, int n, int kind, int which, double min_s, double *best,
                   double *median, double *us_per_call, double *cpu_gbps)
{
    const int hidden = ex[0].m[2].rows, inter = ex[0].m[0].rows;
    float *x = malloc(sizeof(float) * n * hidden), *y = malloc(sizeof(float) * n * hidden);
    float *h = malloc(sizeof(float) * n * inter), *scratch = malloc(sizeof(float) * 2 * n * inter);
    for (int i = 0; i < n * hidden; i++) x[i] = sinf((float)i);
    for (int i = 0; i < n * inter; i++) h[i] = cosf((float)i);
    double rates[256], cpu_best = 0;
    int np = 0;
    double t_all0 = strata_now();
    while (np < 256 && (np < 3 || strata_now() - t_all0 < min_s)) {
        size_t bytes = 0;
        int calls = 0;
        double t0 = strata_now(), c0 = s_cpu_now();
        for (int e = 0; e < n_experts; e++) {
            if (kind == 0) {
                if (which == 0) {
                    cpu_matmul(pool, h, x, n, &ex[e].m[0], NULL);
                    cpu_matmul(pool, h, x, n, &ex[e].m[1], NULL);
                    bytes += s_qbytes(&ex[e].m[0]) + s_qbytes(&ex[e].m[1]);
                    calls += 2;
                } else {
                    cpu_matmul(pool, y, h, n, &ex[e].m[2], NULL);
                    bytes += s_qbytes(&ex[e].m[2]);
                    calls++;
                }
            } else {
                cpu_ffn_swiglu(pool, y, x, n, &ex[e].m[0], &ex[e].m[1], &ex[e].m[2], NULL, scratch, NULL, true);
                bytes += s_qbytes(&ex[e].m[0]) + s_qbytes(&ex[e].m[1]) + s_qbytes(&ex[e].m[2]);
                calls++;
            }
        }
        double t = strata_now() - t0, ct = s_cpu_now() - c0;
        rates[np++] = bytes / t / 1e9;
        *us_per_call = t / calls * 1e6;
        if (ct > 0 && bytes / ct / 1e9 > cpu_best) cpu_best = bytes / ct / 1e9;
    }
    qsort(rates, (size_t)np, sizeof(double), s_cmp_double);
    *best = rates[np - 1];
    *median = rates[np / 2];
    *cpu_gbps = cpu_best;
    free(x); free(y); free(h); free(scratch);
}

static void s_usage(FILE *f)
{
    fprintf(f,
            "usage: cpu_matmul [options]\n"
            "  Measures memory read bandwidth, then matmul weight bytes/s per format at n tokens\n"
            "  on Qwen3-30B-A3B expert shapes (or --hidden/--inter), and the ratio of the two.\n"
            "  --threads N     pool threads (default: STRATA_THREADS or all cpus)\n"
            "  --mb N          weight working set per format in MiB (default 512)\n"
            "  --formats LIST  comma list of f32,bf16,int8,fp8,int4,mxfp4 (default all)\n"
            "  --group G       INT4 group size (default 32)\n"
            "  --hidden H --inter I   expert shape (default 2048, 768)\n"
            "  --seconds S     minimum time per measurement (default 2)\n"
            "  --tokens N      tokens per matmul (default 1; e.g. 14336x4096 Mixtral: --hidden 4096 --inter 14336)\n"
            "  --act f32|q8    activations of INT4 and MXFP4 matmuls (default: STRATA_CPU_ACT or f32)\n"
            "  --isa ref|avx2|avx512|avx512vnni  force an ISA (default: the best this cpu has)\n"
            "  --json FILE     also write the results as JSON\n"
            "  --help\n");
}

int main(int argc, char **argv)
{
    int threads = 0, mb = 512, group = 32, hidden = 2048, inter = 768, tokens = 1;
    double seconds = 2;
    const char *json = NULL, *formats = "f32,bf16,int8,fp8,int4,mxfp4", *isa = NULL, *act = NULL;
    static const struct option opts[] = {
        {"threads", required_argument, 0, 't'}, {"mb", required_argument, 0, 'm'},
        {"formats", required_argument, 0, 'f'}, {"group", required_argument, 0, 'g'},
        {"hidden", required_argument, 0, 'H'},  {"inter", required_argument, 0, 'I'},
        {"seconds", required_argument, 0, 's'}, {"json", required_argument, 0, 'j'},
        {"isa", required_argument, 0, 'i'},     {"tokens", required_argument, 0, 'n'},
        {"act", required_argument, 0, 'a'},     {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    int o;
    while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (o) {
        case 't': threads = atoi(optarg); break;
        case 'm': mb = atoi(optarg); break;
        case 'f': formats = optarg; break;
        case 'g': group = atoi(optarg); break;
        case 'H': hidden = atoi(optarg); break;
        case 'I': inter = atoi(optarg); break;
        case 's': seconds = atof(optarg); break;
        case 'j': json = optarg; break;
        case 'i': isa = optarg; break;
        case 'n': tokens = atoi(optarg); break;
        case 'a': act = optarg; break;
        case 'h': s_usage(stdout); return 0;
        default: s_usage(stderr); return 2;
        }
    }
    if (mb < 16 || hidden < 32 || inter < 32 || hidden % 128 || inter % 128 || (group != 32 && group != 64 && group != 128)) {
        fprintf(stderr, "cpu_matmul: --mb >= 16, --hidden/--inter multiples of 128, --group 32|64|128\n");
        return 2;
    }
    if (tokens < 1 || tokens > 4096 || (act && cpu_act_parse(act) < 0)) {
        fprintf(stderr, "cpu_matmul: --tokens 1..4096, --act f32|q8\n");
        return 2;
    }
    if (act) cpu_ops_set_act((cpu_act_t)cpu_act_parse(act));
    const char *act_name = cpu_ops_act() == CPU_ACT_Q8 ? "q8" : "f32";
    if (isa) setenv("STRATA_CPU_ISA", isa, 1);
    cpu_isa_t got = cpu_ops_init();
    if (isa && strcmp(isa, cpu_isa_name(got)) != 0) {
        fprintf(stderr, "cpu_matmul: --isa %s is not available here (best: %s)\n", isa, cpu_isa_name(got));
        return 2;
    }
    tpool_t *pool = tpool_create(threads);
    if (!pool) {
        fprintf(stderr, "cpu_matmul: cannot create the thread pool\n");
        return 1;
    }
    char host[256] = "?", cpu[256] = "?";
    gethostname(host, sizeof(host) - 1);
    FILE *ci = fopen("/proc/cpuinfo", "r");
    if (ci) {
        char line[512];
        while (fgets(line, sizeof(line), ci))
            if (strncmp(line, "model name", 10) == 0) {
                char *v = strchr(line, ':');
                if (v) snprintf(cpu, sizeof(cpu), "%s", v + 2);
                cpu[strcspn(cpu, "\n")] = 0;
                break;
            }
        fclose(ci);
    }
    printf("machine: %s, cpu: %s, threads: %d, isa: %s, tokens: %d, act: %s\n", host, cpu, tpool_size(pool),
           cpu_isa_name(got), tokens, act_name);
    size_t bw_bytes = (size_t)mb << 20;
    double bound = roofline_cpu_membw(pool, bw_bytes, 10) / 1e9;
    printf("memory read bandwidth (%d threads, %d MiB, best of 10): %.2f GB/s\n", tpool_size(pool), mb, bound);
    printf("(ratio columns below use the bound so far; the final ratios follow the table)\n");
    printf("%-20s %-6s %10s %10s %8s %10s %10s\n", "shape", "format", "best GB/s", "med GB/s", "ratio", "us/call", "GB/cpu-s");

    res_t res[64];
    int nres = 0;
    char shp[3][64];
    snprintf(shp[0], sizeof(shp[0]), "%dx%d", inter, hidden);
    snprintf(shp[1], sizeof(shp[1]), "%dx%d", hidden, inter);
    snprintf(shp[2], sizeof(shp[2]), "ffn %d-%d-%d", hidden, inter, hidden);
    char fl[256];
    snprintf(fl, sizeof(fl), "%s", formats);
    for (char *save = NULL, *tok = strtok_r(fl, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int f = wfmt_parse(tok);
        if (f < 0) {
            fprintf(stderr, "cpu_matmul: unknown format %s\n", tok);
            return 2;
        }
        /* measure the bound again next to each format, so a busy spell on a shared machine
         * lowers neither figure alone; the bound is the best seen */
        double again = roofline_cpu_membw(pool, bw_bytes, 5) / 1e9;
        if (again > bound) bound = again;
        qmat_t probe = {.fmt = (wfmt_t)f, .rows = inter, .cols = hidden, .group = group};
        size_t per = 3 * s_qbytes(&probe);
        int n_experts = (int)(bw_bytes / per) + 1;
        expert_t *ex = calloc((size_t)n_experts, sizeof(*ex));
        void *blob = NULL;
        int rc = s_make_experts((wfmt_t)f, hidden, inter, group, n_experts, ex, &blob);
        if (rc) {
            fprintf(stderr, "cpu_matmul: building %s experts: %s\n", tok, strata_strerror(rc));
            return 1;
        }
        for (int kind = 0; kind < 3; kind++) {
            res_t *r = &res[nres++];
            r->shape = shp[kind];
            r->fmt = (wfmt_t)f;
            s_time(pool, ex, n_experts, tokens, kind == 2, kind, seconds, &r->gbps, &r->gbps_median, &r->us_per_call,
                   &r->cpu_gbps);
            printf("%-20s %-6s %10.2f %10.2f %8.2f %10.1f %10.2f\n", r->shape, tok, r->gbps, r->gbps_median, r->gbps / bound,
                   r->us_per_call, r->cpu_gbps);
            fflush(stdout);
        }
        free(blob);
        free(ex);
    }
    printf("memory read bandwidth, best over the run: %.2f GB/s; ratios against it:\n", bound);
    for (int i = 0; i < nres; i++) {
        res[i].ratio = res[i].gbps / bound;
        printf("  %-20s %-6s %6.2f GB/s  %.2f\n", res[i].shape, wfmt_name(res[i].fmt), res[i].gbps, res[i].ratio);
    }
    if (json) {
        FILE *f = fopen(json, "w");
        if (!f) {
            fprintf(stderr, "cpu_matmul: %s: %s\n", json, strerror(errno));
            return 1;
        }
        fprintf(f, "{\n  \"bench\": \"cpu_matmul\",\n  \"machine\": {\"hostname\": \"%s\", \"cpu\": \"%s\", \"threads\": %d, \"isa\": \"%s\"},\n",
                host, cpu, tpool_size(pool), cpu_isa_name(got));
        fprintf(f, "  \"n_tokens\": %d,\n  \"act\": \"%s\",\n  \"int4_group\": %d,\n  \"bound_gbps\": %.3f,\n  \"bound\": \"memory read bandwidth: best multithreaded streaming pass over %d MiB, measured at start and before each format\",\n  \"results\": [\n",
                tokens, act_name, group, bound, mb);
        for (int i = 0; i < nres; i++)
            fprintf(f, "    {\"shape\": \"%s\", \"format\": \"%s\", \"figure_gbps\": %.3f, \"median_gbps\": %.3f, \"bound_gbps\": %.3f, \"ratio\": %.3f, \"us_per_call\": %.2f, \"per_cpu_second_gbps\": %.3f}%s\n",
                    res[i].shape, wfmt_name(res[i].fmt), res[i].gbps, res[i].gbps_median, bound, res[i].ratio,
                    res[i].us_per_call, res[i].cpu_gbps, i + 1 < nres ? "," : "");
        fprintf(f, "  ]\n}\n");
        fclose(f);
    }
    tpool_destroy(pool);
    return 0;
}
