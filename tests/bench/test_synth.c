/* test_synth.c - synthetic packed models (model/synth_fast.h) with real-model shapes.
 *
 * For every tiny shape (all five architectures) and every format (MXFP4 on tiny-gpt-oss and
 * tiny-mixtral):
 *   - synth_write's folder loads with model_load_packed and passes packed_verify (so the
 *     manifest's crc32, combined from per-chunk crc32s, is the crc32 of the bytes on disk);
 *   - the in-memory model (synth_fast_model) holds byte for byte the bytes of the files;
 *   - a virtual folder (placeholders) has the same manifest crc32s, and its generator
 *     (synth_dir_open) reproduces the files' bytes over random windows at random (unaligned)
 *     offsets: generation is a pure function of the position;
 *   - 1 and 3 threads write identical files; another seed gives other bytes;
 *   - the model runs: logits of a few steps are finite with a sane spread.
 * Route skew: layer inputs built from the embedding rows (the attention contribution left out)
 * are routed by each layer's router, and the share of picks per popularity rank follows the
 * Zipf target (total variation distance), while the uniform model stays near uniform, also
 * through 16 whole layers of decode in every format. Bad
 * markers are refused with the field named.
 * gpt-oss (tiny-gpt-oss, MXFP4 and INT4 experts): the folder loads with model_load, every tensor
 * has its slot's shape and the format asked (experts MXFP4 or INT4, attention, lm_head and
 * embedding bf16, the rest f32), the new vectors (sinks, router and expert biases) are finite,
 * non-zero and small, no e8m0 scale is 0xFF, the experts' rms is the generator's target, and a
 * prompt longer than the sliding window runs with finite logits.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench/shapes.h"
#include "model/generate.h"
#include "model/synth_fast.h"
#include "tests/unit/check.h"

static char s_root[256];

static void s_rmrf(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char p[600];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

static uint8_t *s_read(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)sz + 1);
    if (b && fread(b, 1, (size_t)sz, f) != (size_t)sz) {
        free(b);
        b = NULL;
    }
    fclose(f);
    *n = (size_t)sz;
    return b;
}

static bool s_same_tensor(const qmat_t *a, const qmat_t *b)
{
    if (a->fmt != b->fmt || a->rows != b->rows || a->cols != b->cols || a->group != b->group) return false;
    if (memcmp(a->data, b->data, qmat_data_bytes(a->fmt, a->rows, a->cols))) return false;
    size_t sb = qmat_scale_bytes(a->fmt, a->rows, a->cols, a->group);
    return !sb || !memcmp(a->scales, b->scales, sb);
}

/* Greedy steps over a few tokens: every logit finite, the spread neither collapsed nor huge. */
static void s_check_runs(const model_t *m, const char *what)
{
    int32_t prompt[4] = {1, 7, 42, 99}, out[4], n_out = 0;
    for (int i = 0; i < 4; i++) prompt[i] %= m->cfg.vocab;
    seq_t s;
    T_CHECK(seq_init(&s, m, NULL, 16, 8) == 0, "%s: seq_init", what);
    float *lg = malloc(sizeof(float) * 4 * (size_t)m->cfg.vocab);
    T_CHECK(seq_feed(&s, prompt, 4, true, lg) == 0, "%s: feed", what);
    for (int t = 0; t < 4; t++) {
        double sum = 0, sq = 0;
        bool finite = true;
        for (int v = 0; v < m->cfg.vocab; v++) {
            float x = lg[(size_t)t * m->cfg.vocab + v];
            finite &= isfinite(x);
            sum += x;
            sq += (double)x * x;
        }
        double sd = sqrt(sq / m->cfg.vocab - (sum / m->cfg.vocab) * (sum / m->cfg.vocab));
        T_CHECK(finite && sd > 0.05 && sd < 20, "%s: position %d logits finite=%d sd=%.4f", what, t, finite, sd);
    }
    free(lg);
    seq_free(&s);
    sampler_params_t sp;
    sampler_params_default(&sp);
    sp.ignore_eos = true;
    T_CHECK(generate_tokens(m, NULL, prompt, 4, 4, &sp, 0, out, &n_out, NULL) == 0 && n_out == 4, "%s: generate",
            what);
}

static void s_one(const shape_t *sh, wfmt_t fmt, int group, uint64_t *rng)
{
    char what[128], dir[400], vdir[420], path[600];
    snprintf(what, sizeof what, "%s %s g%d", sh->name, wfmt_name(fmt), group);
    snprintf(dir, sizeof dir, "%s/%s-%s-%d", s_root, sh->name, wfmt_name(fmt), group);
    snprintf(vdir, sizeof vdir, "%s.v", dir);
    char *config = NULL;
    T_CHECK(shape_config_json(sh, &config) == 0, "%s: config", what);
    synth_params_t p;
    synth_params_default(&p, fmt);
    p.group = group;
    p.alignment = 4096;
    p.seed = 7 + (uint64_t)group;
    synth_write_opts_t o = {.threads = 3, .sync = false};
    synth_write_stats_t st;
    strata_errbuf_t eb = {{0}};
    T_CHECK(synth_write(dir, config, &p, &o, &st, &eb) == 0, "%s: write: %s", what, eb.msg);
    T_CHECK(synth_is_synthetic(dir), "%s: marker", what);

    model_t m, mm;
    T_CHECK(model_load_packed(&m, dir, &eb) == 0, "%s: load: %s", what, eb.msg);
    /* crc32s in the manifest are those of the files */
    {
        size_t n;
        snprintf(path, sizeof path, "%s/%s", dir, PACKED_MANIFEST);
        uint8_t *t = s_read(path, &n);
        packed_manifest_t pm;
        T_CHECK(t && packed_manifest_parse(&pm, (char *)t, n, path, &eb) == 0, "%s: manifest: %s", what, eb.msg);
        T_CHECK(packed_verify(dir, &pm, false, &eb) == 0, "%s: verify: %s", what, eb.msg);
        T_CHECK(pm.fmt == fmt && (fmt != WF_INT4 || pm.group == group), "%s: manifest format", what);
        packed_manifest_free(&pm);
        free(t);
    }
    /* the in-memory model holds the same bytes */
    T_CHECK(synth_fast_model(&mm, config, &p, 2, NULL, &eb) == 0, "%s: in memory: %s", what, eb.msg);
    {
        packed_slot_t *sa = NULL, *sb = NULL;
        int32_t na = 0, nb = 0, bad = 0;
        packed_slots(&m.cfg, &m, &sa, &na);
        packed_slots(&mm.cfg, &mm, &sb, &nb);
        T_CHECK(na == nb && na > 0, "%s: slots", what);
        for (int32_t i = 0; i < na && i < nb; i++) {
            if (sa[i].q) bad += !s_same_tensor(sa[i].q, sb[i].q);
            else bad += memcmp(*sa[i].v, *sb[i].v, sizeof(float) * (size_t)sa[i].cols) != 0;
        }
        T_CHECK(bad == 0, "%s: %d tensors differ between file and memory", what, bad);
        free(sa);
        free(sb);
    }
    s_check_runs(&m, what);
    model_free(&mm);

    /* virtual folder: same crc32s; the generator reproduces the files over random windows */
    o.virtual_files = true;
    o.threads = 1;
    T_CHECK(synth_write(vdir, config, &p, &o, &st, &eb) == 0, "%s: virtual write: %s", what, eb.msg);
    synth_gen_t *g = NULL;
    bool virt = false;
    T_CHECK(synth_dir_open(&g, vdir, &virt, &eb) == 0 && virt, "%s: dir open: %s", what, eb.msg);
    if (g) {
        const packed_manifest_t *pm = synth_gen_manifest(g);
        size_t n;
        snprintf(path, sizeof path, "%s/%s", dir, PACKED_MANIFEST);
        uint8_t *t = s_read(path, &n);
        packed_manifest_t pw;
        T_CHECK(t && packed_manifest_parse(&pw, (char *)t, n, path, &eb) == 0, "%s", eb.msg);
        snprintf(path, sizeof path, "%s/%s", vdir, PACKED_MANIFEST);
        uint8_t *tv = s_read(path, &n);
        packed_manifest_t pv;
        T_CHECK(tv && packed_manifest_parse(&pv, (char *)tv, n, path, &eb) == 0, "%s", eb.msg);
        T_CHECK(pw.n_files == pv.n_files && pm->n_files == pw.n_files, "%s: files", what);
        for (int32_t f = 0; f < pw.n_files && f < pv.n_files; f++) {
            T_CHECK(pw.files[f].crc32 == pv.files[f].crc32 && pw.files[f].bytes == pv.files[f].bytes,
                    "%s: %s crc32 %08x vs virtual %08x", what, pw.files[f].name, pw.files[f].crc32, pv.files[f].crc32);
            struct stat sst;
            snprintf(path, sizeof path, "%s/%s", vdir, pv.files[f].name);
            T_CHECK(stat(path, &sst) == 0 && (uint64_t)sst.st_size == pv.files[f].bytes &&
                        (uint64_t)sst.st_blocks * 512 < pv.files[f].bytes / 4 + 65536,
                    "%s: placeholder %s is not sparse (%lld blocks)", what, path, (long long)sst.st_blocks);
            snprintf(path, sizeof path, "%s/%s", dir, pw.files[f].name);
            uint8_t *fb = s_read(path, &n);
            T_CHECK(fb && n == pw.files[f].bytes, "%s: read %s", what, path);
            int bad = 0;
            uint8_t *win = malloc(70000);
            for (int k = 0; fb && k < 40; k++) {
                uint64_t off = t_rng_next(rng) % (n + 1);
                size_t len = (size_t)(t_rng_next(rng) % 70000);
                if (off + len > n) len = n - off;
                memset(win, 0xA5, 70000);
                synth_gen_fill(g, f, off, win, len);
                bad += memcmp(win, fb + off, len) != 0;
            }
            /* and the whole file in one call */
            uint8_t *all = malloc(n + 1);
            synth_gen_fill(g, f, 0, all, n);
            bad += fb && memcmp(all, fb, n) != 0;
            T_CHECK(bad == 0, "%s: %s: %d windows differ from the written file", what, pw.files[f].name, bad);
            free(all);
            free(win);
            free(fb);
        }
        packed_manifest_free(&pw);
        packed_manifest_free(&pv);
        free(t);
        free(tv);
        synth_gen_free(g);
    }
    model_free(&m);
    s_rmrf(vdir);
    s_rmrf(dir);
    free(config);
}

/* 1 vs 3 threads: same files; other seed: other bytes. */
static void s_determinism(void)
{
    const shape_t *sh = shape_find("tiny-qwen3");
    char *config = NULL;
    shape_config_json(sh, &config);
    synth_params_t p;
    synth_params_default(&p, WF_INT4);
    p.alignment = 4096;
    char d1[400], d3[400], ds[400], a[600], b[600];
    snprintf(d1, sizeof d1, "%s/det1", s_root);
    snprintf(d3, sizeof d3, "%s/det3", s_root);
    snprintf(ds, sizeof ds, "%s/detseed", s_root);
    strata_errbuf_t eb = {{0}};
    synth_write_opts_t o1 = {.threads = 1}, o3 = {.threads = 3};
    T_CHECK(synth_write(d1, config, &p, &o1, NULL, &eb) == 0, "%s", eb.msg);
    T_CHECK(synth_write(d3, config, &p, &o3, NULL, &eb) == 0, "%s", eb.msg);
    p.seed = 2;
    T_CHECK(synth_write(ds, config, &p, &o3, NULL, &eb) == 0, "%s", eb.msg);
    const char *files[] = {"resident.bin", "experts-000.bin", "experts-001.bin"};
    for (int i = 0; i < 3; i++) {
        size_t n1, n3, ns;
        snprintf(a, sizeof a, "%s/%s", d1, files[i]);
        uint8_t *x = s_read(a, &n1);
        snprintf(b, sizeof b, "%s/%s", d3, files[i]);
        uint8_t *y = s_read(b, &n3);
        snprintf(b, sizeof b, "%s/%s", ds, files[i]);
        uint8_t *z = s_read(b, &ns);
        T_CHECK(x && y && z && n1 == n3 && n1 == ns, "%s sizes", files[i]);
        T_CHECK(x && y && !memcmp(x, y, n1), "%s: 1 and 3 threads differ", files[i]);
        size_t same = 0;
        for (size_t k = 0; x && z && k < n1; k++) same += x[k] == z[k];
        T_CHECK(same < n1 / 2, "%s: another seed changes little (%zu of %zu bytes equal)", files[i], same, n1);
        free(x);
        free(y);
        free(z);
    }
    /* default 2 MiB expert alignment: padding between small experts stays a file hole, which
     * reads back as zeros: crc32 and the in-memory model still agree */
    {
        char dh[400], path[600];
        snprintf(dh, sizeof dh, "%s/holes", s_root);
        synth_params_t ph;
        synth_params_default(&ph, WF_INT4);
        synth_write_opts_t ov = {.threads = 2, .verify = true};
        T_CHECK(synth_write(dh, config, &ph, &ov, NULL, &eb) == 0, "holes: %s", eb.msg);
        snprintf(path, sizeof path, "%s/experts-000.bin", dh);
        struct stat hs;
        T_CHECK(stat(path, &hs) == 0 && (uint64_t)hs.st_blocks * 512 < (uint64_t)hs.st_size / 2,
                "padding was written (%lld of %lld bytes allocated)", (long long)hs.st_blocks * 512, (long long)hs.st_size);
        model_t mh, mm;
        T_CHECK(model_load_packed(&mh, dh, &eb) == 0, "holes load: %s", eb.msg);
        T_CHECK(synth_fast_model(&mm, config, &ph, 1, NULL, &eb) == 0, "holes memory: %s", eb.msg);
        const ffn_t *a = &mh.layers[1].experts[15], *b = &mm.layers[1].experts[15];
        T_CHECK(s_same_tensor(&a->gate, &b->gate) && s_same_tensor(&a->down, &b->down), "holes: expert bytes differ");
        model_free(&mh);
        model_free(&mm);
        s_rmrf(dh);
    }
    /* an existing manifest is not overwritten */
    T_CHECK(synth_write(d1, config, &p, &o1, NULL, &eb) == STRATA_EEXISTS, "rewrite refused");
    s_rmrf(d1);
    s_rmrf(d3);
    s_rmrf(ds);
    free(config);
}

/* Route skew: picks per popularity rank, from layer inputs built from the embedding rows. */
static double s_route_tv(const model_t *m, const synth_gen_t *g, double zipf_s, double *top_share)
{
    const model_config_t *c = &m->cfg;
    const int H = c->hidden, E = c->n_experts, K = c->top_k;
    double *cnt = calloc((size_t)E, sizeof *cnt);
    float *x = malloc(sizeof(float) * (size_t)H), *lg = malloc(sizeof(float) * (size_t)E);
    double total = 0;
    for (int l = 0; l < c->n_layers; l++) {
        if (!c->layer_sparse[l]) continue;
        const layer_t *L = &m->layers[l];
        for (int tok = 0; tok < c->vocab; tok++) {
            qmat_dequant_row(&m->embed, tok, x);
            double ss = 0;
            for (int i = 0; i < H; i++) ss += (double)x[i] * x[i];
            float inv = (float)(1.0 / sqrt(ss / H + c->rms_eps));
            for (int i = 0; i < H; i++) x[i] *= inv * L->ffn_norm[i];
            const float *R = L->router.data;
            for (int e = 0; e < E; e++) {
                double d = 0;
                for (int i = 0; i < H; i++) d += (double)R[(size_t)e * H + i] * x[i];
                lg[e] = (float)d + (L->router_b ? L->router_b[e] : 0.0f);
            }
            for (int k = 0; k < K; k++) {
                int best = 0;
                for (int e = 1; e < E; e++)
                    if (lg[e] > lg[best]) best = e;
                int32_t rank = 0;
                synth_gen_router_bias(g, l, best, &rank);
                cnt[rank] += 1;
                total += 1;
                lg[best] = -INFINITY;
            }
        }
    }
    /* target: per-token selection probability of rank r ~ (r+1)^-s, k in all (capped at 0.98),
     * or uniform */
    double *p = calloc((size_t)E, sizeof *p), tv = 0;
    if (zipf_s > 0) {
        bool *cap = calloc((size_t)E, sizeof *cap);
        for (int pass = 0; pass < E; pass++) {
            double mass = K, w = 0;
            for (int r = 0; r < E; r++) {
                if (cap[r]) mass -= 0.98;
                else w += pow(r + 1, -zipf_s);
            }
            bool again = false;
            for (int r = 0; r < E; r++) {
                p[r] = cap[r] ? 0.98 : mass * pow(r + 1, -zipf_s) / w;
                if (!cap[r] && p[r] > 0.98) cap[r] = again = true;
            }
            if (!again) break;
        }
        free(cap);
    } else {
        for (int r = 0; r < E; r++) p[r] = (double)K / E;
    }
    for (int r = 0; r < E; r++) tv += fabs(cnt[r] / total - p[r] / K);
    *top_share = cnt[0] / total;
    free(p);
    free(cnt);
    free(x);
    free(lg);
    return tv / 2;
}

static void s_route_skew(void)
{
    const char *shapes[] = {"tiny-qwen3", "tiny-mixtral", "tiny-gpt-oss"};
    const wfmt_t fmts[] = {WF_INT4, WF_INT4, WF_MXFP4}; /* MXFP4: its column-0 and row-0 fixups */
    for (int i = 0; i < 3; i++) {
        const shape_t *sh = shape_find(shapes[i]);
        char *config = NULL, dir[400];
        shape_config_json(sh, &config);
        for (int k = 0; k < 3; k++) {
            double s = k == 0 ? 0.0 : k == 1 ? 0.8 : 1.2;
            synth_params_t p;
            synth_params_default(&p, fmts[i]);
            p.alignment = 4096;
            p.zipf_s = s;
            snprintf(dir, sizeof dir, "%s/skew-%s-%d", s_root, sh->name, k);
            strata_errbuf_t eb = {{0}};
            synth_write_opts_t o = {.threads = 2};
            T_CHECK(synth_write(dir, config, &p, &o, NULL, &eb) == 0, "%s", eb.msg);
            model_t m;
            synth_gen_t *g = NULL;
            T_CHECK(model_load_packed(&m, dir, &eb) == 0, "%s", eb.msg);
            T_CHECK(synth_dir_open(&g, dir, NULL, &eb) == 0, "%s", eb.msg);
            if (!g) continue;
            double top = 0, tv = s_route_tv(&m, g, s, &top);
            fprintf(stderr, "route skew %s zipf:%.1f: total variation from the target %.3f, rank-0 share %.3f (uniform %.3f)\n",
                    sh->name, s, tv, top, 1.0 / sh->n_experts);
            T_CHECK(tv < 0.12, "%s zipf:%.1f: picks per rank are %.3f (total variation) from the target", sh->name, s, tv);
            /* rank 0 is picked by at most 0.98 of the tokens, 0.98 / k of the picks (tiny-gpt-oss:
             * 4 of 8, so 0.245, below twice uniform) */
            double top_min = fmin(2.0 / sh->n_experts, 0.9 * 0.98 / sh->top_k);
            if (s > 0) T_CHECK(top > top_min, "%s zipf:%.1f: rank 0 gets %.3f of the picks", sh->name, s, top);
            s_check_runs(&m, "skewed model");
            synth_gen_free(g);
            model_free(&m);
            s_rmrf(dir);
        }
        free(config);
    }
}

/* Uniform routing through the whole model: tiny-mixtral's widths at 16 layers, 256 random
 * tokens decoded one step each (the attention contribution included), every format. Each
 * layer's picks stay near uniform: weights whose mean is not zero (int4 nibbles 0..15 about 8)
 * grow a common direction in the residual stream that the routers read as a fixed bias, which
 * sent almost every token to the same two experts by the 4th layer. tiny-gpt-oss too (MXFP4
 * and int4 experts): its biases and its activation, whose output has a mean that is not zero
 * ((u + 1) g sigmoid(1.702 g)), write per-expert constant directions into the stream. */
static void s_route_deep_shape(const char *name, const wfmt_t *fmts, size_t n_fmts)
{
    shape_t sh = *shape_find(name);
    sh.n_layers = 16;
    char *config = NULL;
    shape_config_json(&sh, &config);
    const int n_tok = 256;
    for (size_t f = 0; f < n_fmts; f++) {
        synth_params_t p;
        synth_params_default(&p, fmts[f]);
        p.attn_fmt = fmts[f];
        model_t m;
        strata_errbuf_t eb = {{0}};
        int rc = synth_fast_model(&m, config, &p, 2, NULL, &eb);
        T_CHECK(rc == 0, "deep %s: %s", wfmt_name(fmts[f]), eb.msg);
        if (rc) continue;
        seq_t q;
        T_CHECK(seq_init(&q, &m, NULL, n_tok, 1) == 0, "deep: seq_init");
        uint64_t rng = 12345;
        for (int t = 0; t < n_tok; t++) {
            int32_t tok = (int32_t)(t_rng_next(&rng) % (uint64_t)sh.vocab);
            T_CHECK(seq_feed(&q, &tok, 1, false, NULL) == 0, "deep: feed");
        }
        const int64_t *cnt = forward_route_counts(q.fwd);
        double worst = 0;
        int worst_l = 0;
        for (int l = 0; l < sh.n_layers; l++) {
            double tv = 0, tot = (double)n_tok * sh.top_k;
            for (int e = 0; e < sh.n_experts; e++) tv += fabs(cnt[(size_t)l * sh.n_experts + e] / tot - 1.0 / sh.n_experts);
            if (tv / 2 > worst) worst = tv / 2, worst_l = l;
        }
        fprintf(stderr, "route deep %s %s: %d layers, worst total variation from uniform %.3f (layer %d)\n", name,
                wfmt_name(fmts[f]), sh.n_layers, worst, worst_l);
        /* 256 x top_k picks over 8 experts: ~0.05 by chance; the int4 common mode gave 0.6-0.75 */
        T_CHECK(worst < 0.2, "deep %s %s: layer %d picks are %.3f (total variation) from uniform", name,
                wfmt_name(fmts[f]), worst_l, worst);
        seq_free(&q);
        model_free(&m);
    }
    free(config);
}

static void s_route_deep(void)
{
    const wfmt_t all[] = {WF_INT4, WF_INT8, WF_FP8, WF_BF16}, gpt_oss[] = {WF_MXFP4, WF_INT4};
    s_route_deep_shape("tiny-mixtral", all, 4);
    s_route_deep_shape("tiny-gpt-oss", gpt_oss, 2);
}

/* rms of every expert matrix of layer l over its target (gate/up 1/sqrt(hidden), down
 * 1/sqrt(2 layers inter)): the mean square of all the layer's gate and up, and of its down. */
static void s_expert_rms(const model_t *m, int l, double *gate_up, double *down)
{
    const model_config_t *c = &m->cfg;
    double su = 0, sd = 0, nu = 0, nd = 0;
    float *row = malloc(sizeof(float) * (size_t)(c->hidden > c->moe_inter ? c->hidden : c->moe_inter));
    for (int e = 0; e < c->n_experts; e++) {
        const qmat_t *q[3] = {&m->layers[l].experts[e].gate, &m->layers[l].experts[e].up, &m->layers[l].experts[e].down};
        for (int k = 0; k < 3; k++) {
            for (int r = 0; r < q[k]->rows; r++) {
                qmat_dequant_row(q[k], r, row);
                for (int j = 0; j < q[k]->cols; j++) *(k < 2 ? &su : &sd) += (double)row[j] * row[j];
            }
            *(k < 2 ? &nu : &nd) += (double)q[k]->rows * q[k]->cols;
        }
    }
    free(row);
    *gate_up = sqrt(su / nu) * sqrt((double)c->hidden);
    *down = sqrt(sd / nd) * sqrt(2.0 * c->n_layers * c->moe_inter);
}

/* A vector slot: finite, not all zero, every |v| <= lim. */
static void s_check_vec(const float *v, int32_t n, float lim, const char *what, const char *name)
{
    bool finite = v != NULL, nonzero = false, small = true;
    for (int32_t i = 0; v && i < n; i++) {
        finite &= isfinite(v[i]);
        nonzero |= v[i] != 0;
        small &= fabsf(v[i]) <= lim;
    }
    T_CHECK(finite && nonzero && small, "%s: %s: finite %d, non-zero %d, within %g %d", what, name, finite, nonzero, lim,
            small);
}

static void s_gpt_oss(wfmt_t fmt)
{
    const shape_t *sh = shape_find("tiny-gpt-oss");
    char what[64], dir[400];
    snprintf(what, sizeof what, "gpt-oss %s", wfmt_name(fmt));
    snprintf(dir, sizeof dir, "%s/gpt-oss-%s", s_root, wfmt_name(fmt));
    char *config = NULL;
    T_CHECK(sh && shape_config_json(sh, &config) == 0, "%s: config", what);
    if (!sh || !config) return;
    synth_params_t p;
    synth_params_default(&p, fmt);
    /* the default attention format with MXFP4 experts is gpt-oss's own split */
    T_CHECK(p.attn_fmt == WF_BF16, "%s: default attention format %s", what, wfmt_name(p.attn_fmt));
    p.alignment = 4096;
    synth_write_opts_t o = {.threads = 2};
    strata_errbuf_t eb = {{0}};
    T_CHECK(synth_write(dir, config, &p, &o, NULL, &eb) == 0, "%s: write: %s", what, eb.msg);
    model_t m;
    int rc = model_load(&m, dir, &eb);
    T_CHECK(rc == 0, "%s: load: %s", what, eb.msg);
    if (rc) {
        free(config);
        return;
    }
    const model_config_t *c = &m.cfg;
    T_CHECK(c->arch == ARCH_GPT_OSS && c->attn_sinks && c->router_bias && c->expert_bias && c->qkv_bias && c->o_bias &&
                c->ffn_act == FFN_ACT_GPT_OSS && c->sliding_window == sh->sliding_window && c->layer_sliding[0] &&
                !c->layer_sliding[1] && c->n_experts == 8 && c->top_k == 4,
            "%s: config as the shape says", what);
    /* every tensor: its slot's shape, the format the plan gives its class */
    packed_slot_t *sl = NULL;
    int32_t n = 0, bad = 0;
    T_CHECK(packed_slots(c, &m, &sl, &n) == 0 && n > 0, "%s: slots", what);
    int n_sinks = 0, n_rbias = 0, n_ebias = 0;
    for (int32_t i = 0; i < n; i++) {
        if (sl[i].q) {
            const qmat_t *q = sl[i].q;
            wfmt_t want = sl[i].cls == PC_EXPERT ? fmt : sl[i].cls == PC_ROUTER ? WF_F32 : WF_BF16;
            int32_t group = want == WF_MXFP4 || want == WF_INT4 ? 32 : 0;
            bool ok = q->fmt == want && q->rows == sl[i].rows && q->cols == sl[i].cols && q->group == group && q->data &&
                      (qmat_scale_bytes(want, q->rows, q->cols, group) == 0 || q->scales);
            if (ok && want == WF_MXFP4) { /* no e8m0 scale is 0xFF (NaN) */
                const uint8_t *e8 = q->scales;
                for (size_t k = 0; k < qmat_scale_bytes(want, q->rows, q->cols, 32); k++) ok &= e8[k] != 0xFF;
            }
            if (!ok)
                fprintf(stderr, "%s: %s: %s [%d x %d] group %d, want %s [%d x %d]\n", what, sl[i].name, wfmt_name(q->fmt),
                        q->rows, q->cols, q->group, wfmt_name(want), sl[i].rows, sl[i].cols);
            bad += !ok;
        } else {
            const char *nm = sl[i].name;
            size_t ln = strlen(nm);
            float lim = 1.5f; /* norms ~1, q/k/v/o biases 0.1 */
            if (ln > 6 && !strcmp(nm + ln - 6, ".sinks")) {
                n_sinks++;
                lim = 1.0f;
            } else if (strstr(nm, ".router_bias")) {
                n_rbias++;
                lim = 0.1f;
            } else if (strstr(nm, ".experts_")) {
                n_ebias++;
                lim = 0.1f;
            }
            s_check_vec(*sl[i].v, sl[i].cols, lim, what, nm);
        }
    }
    T_CHECK(bad == 0, "%s: %d tensors of the wrong shape or format", what, bad);
    T_CHECK(n_sinks == c->n_layers && n_rbias == c->n_layers && n_ebias == 3 * c->n_layers, "%s: %d sinks, %d router "
            "biases, %d expert biases", what, n_sinks, n_rbias, n_ebias);
    free(sl);
    /* the experts' rms is the generator's target in either format (the mean square of 8 experts:
     * within a few %) */
    for (int l = 0; l < c->n_layers; l++) {
        double gu, dn;
        s_expert_rms(&m, l, &gu, &dn);
        T_CHECK(fabs(gu - 1) < 0.05 && fabs(dn - 1) < 0.05, "%s: layer %d expert rms / target: gate+up %.4f, down %.4f",
                what, l, gu, dn);
    }
    /* the forward pass: a prompt past the sliding window, logits finite with a sane spread */
    enum { T = 40 };
    int32_t toks[T];
    for (int i = 0; i < T; i++) toks[i] = (int32_t)((i * 37 + 5) % c->vocab);
    seq_t q;
    T_CHECK(seq_init(&q, &m, NULL, T + 8, T) == 0, "%s: seq_init", what);
    float *lg = malloc(sizeof(float) * T * (size_t)c->vocab);
    T_CHECK(seq_feed(&q, toks, T, true, lg) == 0, "%s: feed", what);
    int poor = 0;
    for (int t = 0; t < T; t++) {
        double sum = 0, sq = 0;
        bool finite = true;
        for (int v = 0; v < c->vocab; v++) {
            float x = lg[(size_t)t * c->vocab + v];
            finite &= isfinite(x);
            sum += x;
            sq += (double)x * x;
        }
        double sd = sqrt(sq / c->vocab - (sum / c->vocab) * (sum / c->vocab));
        poor += !(finite && sd > 0.05 && sd < 20);
        if (t == T - 1) fprintf(stderr, "%s: position %d logits sd %.3f\n", what, t, sd);
    }
    T_CHECK(poor == 0, "%s: %d of %d positions with logits not finite or of a bad spread", what, poor, T);
    free(lg);
    seq_free(&q);
    s_check_runs(&m, what);
    model_free(&m);
    s_rmrf(dir);
    free(config);
}

#define S_STR(x) #x
#define S_XSTR(x) S_STR(x)
#define S_VER S_XSTR(SYNTH_GEN_VERSION) /* markers below are of this build's generator */

static void s_markers(void)
{
    const char *bad[] = {
        "", "[]", "{\"generator\":\"strata synth\",\"version\":" S_VER ",\"seed\":1,\"route_skew\":\"uniform\"}",
        "{\"generator\":\"other\",\"version\":" S_VER ",\"seed\":1,\"route_skew\":\"uniform\",\"virtual\":false}",
        "{\"generator\":\"strata synth\",\"version\":99,\"seed\":1,\"route_skew\":\"uniform\",\"virtual\":false}",
        "{\"generator\":\"strata synth\",\"version\":" S_VER ",\"seed\":-1,\"route_skew\":\"uniform\",\"virtual\":false}",
        "{\"generator\":\"strata synth\",\"version\":" S_VER ",\"seed\":1,\"route_skew\":\"zipf:0\",\"virtual\":false}",
        "{\"generator\":\"strata synth\",\"version\":" S_VER ",\"seed\":1,\"route_skew\":\"zipf:x\",\"virtual\":false}",
        "{\"generator\":\"strata synth\",\"version\":" S_VER ",\"seed\":1,\"route_skew\":\"uniform\",\"virtual\":1}",
        "{\"generator\":\"strata synth\",\"version\":" S_VER ",\"seed\":1,\"route_skew\":\"uniform\",\"virtual\":false,\"x\":1}",
        "{\"generator\":\"strata synth\",\"version\":" S_VER ",\"seed\":1,\"seed\":2,\"route_skew\":\"uniform\",\"virtual\":false}",
    };
    const char *field[] = {"JSON", "JSON", "virtual", "generator", "version", "seed", "route_skew", "route_skew",
                           "virtual", "'x'", "JSON"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        synth_marker_t mk;
        strata_errbuf_t eb = {{0}};
        int rc = synth_marker_parse(&mk, bad[i], strlen(bad[i]), "m.json", &eb);
        T_CHECK(rc < 0 && strstr(eb.msg, "m.json") && strstr(eb.msg, field[i]), "marker %zu: rc %d '%s'", i, rc,
                eb.msg);
    }
    const char *good = "{\"generator\":\"strata synth\",\"version\":" S_VER ",\"seed\":5,\"route_skew\":\"zipf:1.5\","
                       "\"virtual\":true,\"shape\":\"mixtral-8x7b\"}";
    synth_marker_t mk;
    strata_errbuf_t eb = {{0}};
    T_CHECK(synth_marker_parse(&mk, good, strlen(good), "m.json", &eb) == 0 && mk.seed == 5 && mk.zipf_s == 1.5 &&
                mk.is_virtual && !strcmp(mk.shape, "mixtral-8x7b"),
            "good marker: %s", eb.msg);
}

int main(void)
{
    uint64_t seed = t_seed(), rng = seed;
    const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(s_root, sizeof s_root, "%s/strata-test-synth-XXXXXX", base);
    if (!mkdtemp(s_root)) {
        perror("mkdtemp");
        return 1;
    }
    const char *tiny[] = {"tiny-mixtral", "tiny-qwen3", "tiny-qwen2", "tiny-olmoe", "tiny-gpt-oss"};
    struct {
        wfmt_t f;
        int g;
    } fmts[] = {{WF_INT4, 32}, {WF_INT4, 128}, {WF_INT8, 0}, {WF_FP8, 0}, {WF_BF16, 0}, {WF_MXFP4, 0}};
    for (int i = 0; i < 5; i++)
        for (size_t k = 0; k < sizeof fmts / sizeof fmts[0]; k++)
            if (fmts[k].f != WF_MXFP4 || !strcmp(tiny[i], "tiny-gpt-oss") || !strcmp(tiny[i], "tiny-mixtral"))
                s_one(shape_find(tiny[i]), fmts[k].f, fmts[k].g ? fmts[k].g : 32, &rng);
    s_gpt_oss(WF_MXFP4);
    s_gpt_oss(WF_INT4);
    s_determinism();
    s_route_skew();
    s_route_deep();
    s_markers();
    rmdir(s_root);
    return t_done("synth");
}
