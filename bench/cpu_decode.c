/* cpu_decode.c - CPU batch-1 decode speed on a synthetic model with real MoE layer shapes.
 *
 * Builds a random model in memory (model/synth.c) with Qwen3-30B-A3B layer shapes by default
 * (hidden 2048, 32 q / 4 kv heads of 128, 128 experts top-8, expert inter 768) but only a few
 * layers, in each requested weight format; prefills a short prompt, then times one-token
 * decode steps. Decode on a CPU is bound by memory reads, so next to tok/s it reports the
 * weight bytes one token reads (attention, router, the top_k active experts of every layer,
 * the embedding row and lm_head), the bytes/s that implies, and the bound: measured memory
 * read bandwidth / bytes per token. ratio = measured tok/s / bound tok/s.
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/roofline.h"
#include "bench/shapes.h"
#include "kernels/cpu/ops.h"
#include "model/generate.h"
#include "model/synth_fast.h"

typedef struct {
    int layers, threads, steps, prompt, group;
    int32_t vocab, hidden, heads, kv_heads, head_dim, experts, top_k, inter;
    const char *formats;
    const char *json;
    const char *acts;
    double bw_gib; /* probe size */
} s_opts_t;


static size_t s_qbytes(const qmat_t *q)
{
    return qmat_data_bytes(q->fmt, q->rows, q->cols) + qmat_scale_bytes(q->fmt, q->rows, q->cols, q->group);
}

static size_t s_ffn_bytes(const ffn_t *f) { return s_qbytes(&f->gate) + s_qbytes(&f->up) + s_qbytes(&f->down); }

/* Weight bytes one decode token reads (expert sizes are equal, so any top_k of them). */
static void s_bytes_per_token(const model_t *m, size_t *attn, size_t *experts, size_t *other)
{
    const model_config_t *c = &m->cfg;
    size_t a = 0, e = 0, o = 0, H = (size_t)c->hidden;
    for (int l = 0; l < c->n_layers; l++) {
        const layer_t *L = &m->layers[l];
        a += s_qbytes(&L->wq) + s_qbytes(&L->wk) + s_qbytes(&L->wv) + s_qbytes(&L->wo);
        a += 2 * H * sizeof(float);
        if (c->layer_sparse[l]) {
            o += s_qbytes(&L->router);
            e += (size_t)c->top_k * s_ffn_bytes(&L->experts[0]);
            if (c->shared_inter) e += s_ffn_bytes(&L->shared) + s_qbytes(&L->shared_gate);
        } else {
            e += s_ffn_bytes(&L->dense);
        }
    }
    o += s_qbytes(&m->lm_head) + qmat_data_bytes(m->embed.fmt, 1, c->hidden) + H * sizeof(float);
    *attn = a;
    *experts = e;
    *other = o;
}

static void s_help(FILE *f)
{
    fprintf(f,
            "usage: cpu_decode [options]\n"
            "\n"
            "CPU batch-1 decode tok/s on a random model with Qwen3-30B-A3B layer shapes, against the\n"
            "memory-bandwidth bound (weight bytes per token / measured read bandwidth).\n"
            "\n"
            "  --formats LIST   weight formats, comma-separated: bf16 int8 fp8 int4 (default int4,bf16);\n"
            "                   every matrix in it (attention and lm_head too), generated on all CPUs\n"
            "  --layers N       layers (default 4)\n"
            "  --steps N        timed decode steps (default 32)\n"
            "  --prompt N       prompt tokens prefilled first (default 16)\n"
            "  --threads T      worker threads, 0 = all CPUs (default 0)\n"
            "  --group G        int4 columns per scale (default 32)\n"
            "  --vocab V        vocabulary (default 151936)\n"
            "  --hidden H --heads Q --kv-heads K --head-dim D --experts E --top-k K --inter I\n"
            "                   shapes (defaults 2048 32 4 128 128 8 768)\n"
            "  --bw-gib G       bandwidth probe buffer in GiB (default 1)\n"
            "  --act LIST       INT4 activations, comma-separated: f32 (exact) q8 (int8 blocks, as the\n"
            "                   GPU's integer path; STRATA_CPU_ACT) (default f32,q8; other formats: f32)\n"
            "  --json FILE      also write the results as JSON\n"
            "  -h, --help       this help\n");
}

static int s_parse(int argc, char **argv, s_opts_t *o)
{
    *o = (s_opts_t){4, 0, 32, 16, 32, 151936, 2048, 32, 4, 128, 128, 8, 768, "int4,bf16", NULL, "f32,q8", 1.0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            s_help(stdout);
            exit(0);
        }
        if (i + 1 >= argc) goto bad;
        const char *v = argv[++i];
        char *end;
        long x = strtol(v, &end, 10);
        bool num = *v && !*end && x >= 0 && x <= (1L << 30);
        if (!strcmp(a, "--formats")) o->formats = v;
        else if (!strcmp(a, "--json")) o->json = v;
        else if (!strcmp(a, "--act")) o->acts = v;
        else if (!strcmp(a, "--bw-gib")) o->bw_gib = atof(v);
        else if (!num) goto bad;
        else if (!strcmp(a, "--layers")) o->layers = (int)x;
        else if (!strcmp(a, "--steps")) o->steps = (int)x;
        else if (!strcmp(a, "--prompt")) o->prompt = (int)x;
        else if (!strcmp(a, "--threads")) o->threads = (int)x;
        else if (!strcmp(a, "--group")) o->group = (int)x;
        else if (!strcmp(a, "--vocab")) o->vocab = (int32_t)x;
        else if (!strcmp(a, "--hidden")) o->hidden = (int32_t)x;
        else if (!strcmp(a, "--heads")) o->heads = (int32_t)x;
        else if (!strcmp(a, "--kv-heads")) o->kv_heads = (int32_t)x;
        else if (!strcmp(a, "--head-dim")) o->head_dim = (int32_t)x;
        else if (!strcmp(a, "--experts")) o->experts = (int32_t)x;
        else if (!strcmp(a, "--top-k")) o->top_k = (int32_t)x;
        else if (!strcmp(a, "--inter")) o->inter = (int32_t)x;
        else goto bad;
        continue;
    bad:
        fprintf(stderr, "cpu_decode: bad option or value near '%s' (see --help)\n", a);
        return 2;
    }
    if (o->layers < 1 || o->layers > 256 || o->steps < 1 || o->prompt < 1 || o->heads < 1 || o->kv_heads < 1 ||
        o->heads % o->kv_heads || o->top_k < 1 || o->top_k > o->experts || o->bw_gib <= 0) {
        fprintf(stderr, "cpu_decode: inconsistent shape options (see --help)\n");
        return 2;
    }
    return 0;
}

static void s_cpu_name(char *out, size_t n)
{
    snprintf(out, n, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof(line), f)) {
        if (!strncmp(line, "model name", 10)) {
            char *p = strchr(line, ':');
            if (p) {
                p++;
                while (*p == ' ') p++;
                p[strcspn(p, "\n")] = 0;
                snprintf(out, n, "%s", p);
            }
            break;
        }
    }
    fclose(f);
}

/* Prefill o->prompt tokens, 2 warm-up steps, then o->steps timed decode steps; prints a table
 * row and appends its JSON. 0 or 1. */
static int s_run(const s_opts_t *o, const model_t *m, tpool_t *pool, double bw, const char *fmt, const char *act,
                 double build_s, json_t *jres)
{
    seq_t s;
    int err = seq_init(&s, m, pool, o->prompt + o->steps + 2, o->prompt);
    float *logits = malloc((size_t)o->vocab * sizeof(float));
    int32_t *prompt = malloc((size_t)o->prompt * sizeof(int32_t));
    int rc = 0;
    if (err < 0 || !logits || !prompt) {
        fprintf(stderr, "cpu_decode: setting up decode failed\n");
        free(logits);
        free(prompt);
        if (err >= 0) seq_free(&s);
        return 1;
    }
    for (int i = 0; i < o->prompt; i++) prompt[i] = (int32_t)((i * 7919 + 13) % o->vocab);
    err = seq_feed(&s, prompt, o->prompt, false, logits);
    int32_t t = cpu_sample(logits, o->vocab, 0, 0, 1, 0);
    for (int w = 0; w < 2 && err >= 0; w++) { /* warm-up steps */
        err = seq_feed(&s, &t, 1, false, logits);
        t = cpu_sample(logits, o->vocab, 0, 0, 1, 0);
    }
    double t0 = strata_now();
    for (int i = 0; i < o->steps && err >= 0; i++) {
        err = seq_feed(&s, &t, 1, false, logits);
        t = cpu_sample(logits, o->vocab, 0, 0, 1, 0);
    }
    double dt = strata_now() - t0;
    if (err < 0) {
        fprintf(stderr, "cpu_decode: forward failed: %s\n", strata_strerror(err));
        rc = 1;
    } else {
        size_t ab, eb, ob;
        s_bytes_per_token(m, &ab, &eb, &ob);
        double bpt = (double)(ab + eb + ob);
        double tps = o->steps / dt, bound = bw / bpt;
        char label[48];
        snprintf(label, sizeof(label), "%s%s%s", fmt, strcmp(fmt, "int4") ? "" : "/", strcmp(fmt, "int4") ? "" : act);
        printf("%-9s %10.2f %12.2f %12.2f %10s %12.2f %8.3f\n", label, tps, bpt / 1e6, tps * bpt / 1e9, "mem-bw",
               bound, tps / bound);
        json_t *r = json_pack("{s:s, s:s, s:s, s:f, s:s, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f}", "format",
                              fmt, "activations", act, "figure", "decode_tok_s", "value", tps, "bound",
                              "mem_read_bw / weight_bytes_per_token", "bound_tok_s", bound, "ratio", tps / bound,
                              "weight_bytes_per_token", bpt, "attn_bytes", (double)ab, "expert_bytes", (double)eb,
                              "other_bytes", (double)ob, "bytes_per_s", tps * bpt, "build_s", build_s);
        json_array_append_new(jres, r);
    }
    free(logits);
    free(prompt);
    seq_free(&s);
    return rc;
}

int main(int argc, char **argv)
{
    s_opts_t o;
    int rc = s_parse(argc, argv, &o);
    if (rc) return rc;
    cpu_isa_t isa = cpu_ops_init();
    tpool_t *pool = tpool_create(o.threads);
    if (!pool) {
        fprintf(stderr, "cpu_decode: cannot start threads\n");
        return 1;
    }
    char cpu[256];
    s_cpu_name(cpu, sizeof(cpu));
    printf("machine: %s, %ld cpus online, %d threads, isa %s\n", cpu, sysconf(_SC_NPROCESSORS_ONLN), tpool_size(pool),
           cpu_isa_name(isa));
    double bw = roofline_cpu_membw(pool, (size_t)(o.bw_gib * (1u << 30)), 6);
    printf("memory read bandwidth: %.2f GB/s (best of 6 over %.2f GiB)\n", bw / 1e9, o.bw_gib);
    printf("shape: %d layers, hidden %d, heads %d/%d x %d, %d experts top-%d inter %d, vocab %d; prompt %d, %d "
           "decode steps\n\n",
           o.layers, o.hidden, o.heads, o.kv_heads, o.head_dim, o.experts, o.top_k, o.inter, o.vocab, o.prompt,
           o.steps);
    printf("%-9s %10s %12s %12s %10s %12s %8s\n", "format", "tok/s", "MB/token", "GB/s", "bound", "bound tok/s",
           "ratio");

    json_t *jres = json_array();
    char fmts[256];
    snprintf(fmts, sizeof(fmts), "%s", o.formats);
    for (char *save = NULL, *tok = strtok_r(fmts, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int fmt = wfmt_parse(tok);
        if (fmt < 0) {
            fprintf(stderr, "cpu_decode: unknown format '%s'\n", tok);
            rc = 2;
            break;
        }
        /* Qwen3-30B-A3B's config with the shape options applied, every matrix (attention and
         * lm_head too) in fmt, generated straight in the packed format (model/synth_fast.h) */
        shape_t sh = *shape_find("qwen3-30b-a3b");
        sh.vocab = o.vocab, sh.hidden = o.hidden, sh.n_layers = o.layers, sh.n_heads = o.heads;
        sh.n_kv_heads = o.kv_heads, sh.head_dim = o.head_dim, sh.n_experts = o.experts, sh.top_k = o.top_k;
        sh.moe_inter = o.inter;
        if (sh.bos_id >= sh.vocab) sh.bos_id = -1; /* a smaller vocabulary than the real model's */
        if (sh.eos_id >= sh.vocab) sh.eos_id = -1;
        char *config = NULL;
        synth_params_t sp;
        synth_params_default(&sp, (wfmt_t)fmt);
        sp.group = o.group;
        sp.attn_fmt = (wfmt_t)fmt;
        sp.seed = 1234;
        model_t m;
        strata_errbuf_t eb = {{0}};
        double tb = strata_now();
        int err = shape_config_json(&sh, &config);
        if (err >= 0) err = synth_fast_model(&m, config, &sp, o.threads, NULL, &eb);
        free(config);
        if (err < 0) {
            fprintf(stderr, "cpu_decode: building the %s model failed: %s\n", tok, eb.msg[0] ? eb.msg : strata_strerror(err));
            rc = 1;
            break;
        }
        double build_s = strata_now() - tb;
        char acts[64];
        snprintf(acts, sizeof(acts), "%s", fmt == WF_INT4 ? o.acts : "f32");
        for (char *save2 = NULL, *an = strtok_r(acts, ",", &save2); an && !rc; an = strtok_r(NULL, ",", &save2)) {
            int act = cpu_act_parse(an);
            if (act < 0) {
                fprintf(stderr, "cpu_decode: unknown activation mode '%s' (f32 or q8)\n", an);
                rc = 2;
                break;
            }
            cpu_ops_set_act((cpu_act_t)act);
            rc = s_run(&o, &m, pool, bw, tok, an, build_s, jres);
        }
        cpu_ops_set_act(CPU_ACT_F32);
        model_free(&m);
        if (rc) break;
    }
    if (o.json && rc == 0) {
        json_t *root = json_pack(
            "{s:s, s:{s:s, s:i, s:i, s:s, s:f}, s:{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i}, s:o}",
            "bench", "cpu_decode", "machine", "cpu", cpu, "cpus_online", (int)sysconf(_SC_NPROCESSORS_ONLN), "threads",
            tpool_size(pool), "isa", cpu_isa_name(isa), "mem_read_bw_bytes_per_s", bw, "shape", "like",
            "Qwen3-30B-A3B layers", "layers", o.layers, "hidden", o.hidden, "heads", o.heads, "kv_heads", o.kv_heads,
            "head_dim", o.head_dim, "experts", o.experts, "top_k", o.top_k, "moe_inter", o.inter, "vocab", o.vocab,
            "prompt", o.prompt, "steps", o.steps, "results", jres);
        jres = NULL;
        if (!root || json_dump_file(root, o.json, JSON_INDENT(2)) != 0) {
            fprintf(stderr, "cpu_decode: cannot write %s\n", o.json);
            rc = 1;
        }
        json_decref(root);
    }
    json_decref(jres);
    tpool_destroy(pool);
    return rc;
}
