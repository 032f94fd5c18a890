/* test_batch.c - the forward pass over mixed batches equals one sequence at a time.
 *
 * For each architecture (small random models from model/synth.c, F32 and INT4 weights):
 *   - two sequences of different lengths share steps that mix prefill chunks and decode
 *     tokens, interleaved in the batch, with scrambled block tables: their logits equal
 *     each sequence run alone in one prefill (relative error < 1e-5 per row);
 *   - chunked prefill and token-by-token decode equal one prefill;
 *   - greedy generation picks the argmax of the eval logits; sampling with a seed repeats;
 *   - malformed batches are refused, not run;
 *   - gpt-oss with window tables (batch_t.win_tables): the sliding layers keep their K/V in
 *     blocks of their own, whose entries below every later query's window are -1 and whose
 *     blocks are then poisoned with NaN, and the logits still equal one prefill through the
 *     main table alone.
 * STRATA_SEED re-runs a failure.
 */
#include <string.h>

#include "check.h"
#include "kernels/cpu/ops.h"
#include "model/generate.h"
#include "model/synth.h"

#define BS 4 /* block size of the shared cache */

static double s_max_row_err(const float *a, const float *b, int rows, int vocab)
{
    double worst = 0;
    for (int r = 0; r < rows; r++) {
        double e = t_relerr(a + (size_t)r * vocab, b + (size_t)r * vocab, (size_t)vocab);
        if (e > worst || e != e) worst = e;
    }
    return worst;
}

/* Logits of every position of tok[n], one sequence, in steps of `chunk` (1 = decode). */
static int s_run_alone(const model_t *m, tpool_t *pool, const int32_t *tok, int n, int chunk, float *logits)
{
    seq_t s;
    int rc = seq_init(&s, m, pool, n, chunk);
    if (rc < 0) return rc;
    rc = seq_feed(&s, tok, n, true, logits);
    seq_free(&s);
    return rc;
}

static void s_check_model(const char *name, const model_t *m, tpool_t *pool, uint64_t *rng)
{
    const int V = m->cfg.vocab;
    enum { NA = 13, NB = 7 };
    int32_t ta[NA], tb[NB];
    for (int i = 0; i < NA; i++) ta[i] = (int32_t)(t_rng_next(rng) % (uint64_t)V);
    for (int i = 0; i < NB; i++) tb[i] = (int32_t)(t_rng_next(rng) % (uint64_t)V);

    float *ra = calloc((size_t)NA * V, sizeof(float)), *rb = calloc((size_t)NB * V, sizeof(float));
    float *ca = calloc((size_t)NA * V, sizeof(float)), *cb = calloc((size_t)NB * V, sizeof(float));
    float *step_logits = calloc((size_t)(NA + NB) * V, sizeof(float));
    T_CHECK(s_run_alone(m, pool, ta, NA, NA, ra) == 0, "%s: alone A", name);
    T_CHECK(s_run_alone(m, pool, tb, NB, NB, rb) == 0, "%s: alone B", name);
    /* non-trivial logits (a broken forward often yields zeros or NaN) */
    double norm = 0;
    for (int i = 0; i < V; i++) norm += (double)ra[i] * ra[i];
    T_CHECK(norm > 1e-6 && norm == norm, "%s: logits norm %g", name, norm);

    /* chunked prefill (3 tokens a step) and pure decode equal one prefill */
    T_CHECK(s_run_alone(m, pool, ta, NA, 3, ca) == 0, "%s: chunked", name);
    double e = s_max_row_err(ca, ra, NA, V);
    T_CHECK(e < 1e-5, "%s: chunked prefill vs one prefill: %.3g", name, e);
    T_CHECK(s_run_alone(m, pool, ta, NA, 1, ca) == 0, "%s: decode", name);
    e = s_max_row_err(ca, ra, NA, V);
    T_CHECK(e < 1e-5, "%s: decode vs one prefill: %.3g", name, e);

    /* both sequences in one cache with scrambled blocks: A uses odd blocks from the top,
     * B even blocks from the bottom */
    kv_cache_t kv;
    const int n_blocks = 16;
    T_CHECK(kv_cache_init(&kv, &m->cfg, n_blocks, BS) == 0, "%s: kv init", name);
    int32_t bta[8], btb[8];
    for (int i = 0; i < 8; i++) {
        bta[i] = n_blocks - 1 - 2 * i;
        btb[i] = 2 * i;
    }
    const int32_t *tables[2] = {bta, btb};
    forward_ctx_t *f = forward_ctx_create(m, NA + NB, pool);
    T_CHECK(f != NULL, "%s: forward ctx", name);
    /* steps: (A prefill 0..5 + B prefill 0..2), (A decode 6 + B prefill 3..6), (A 7..12) */
    static const int a_cut[] = {0, 6, 7, 13}, b_cut[] = {0, 3, 7, 7};
    for (int st = 0; st < 3 && f; st++) {
        int32_t tok[NA + NB], pos[NA + NB], seq[NA + NB], rows[NA + NB];
        int n = 0;
        int ia = a_cut[st], ib = b_cut[st];
        /* interleave: A, B, A, B, ... while both have tokens left in this step */
        while (ia < a_cut[st + 1] || ib < b_cut[st + 1]) {
            if (ia < a_cut[st + 1]) {
                tok[n] = ta[ia], pos[n] = ia, seq[n] = 0, n++;
                ia++;
            }
            if (ib < b_cut[st + 1]) {
                tok[n] = tb[ib], pos[n] = ib, seq[n] = 1, n++;
                ib++;
            }
        }
        for (int i = 0; i < n; i++) rows[i] = n - 1 - i; /* logits in reverse order */
        batch_t b = {n, tok, pos, seq, tables, n, rows};
        memset(step_logits, 0xff, (size_t)n * V * sizeof(float)); /* NaN poison */
        T_CHECK(model_forward(f, &kv, &b, step_logits) == 0, "%s: step %d", name, st);
        for (int i = 0; i < n; i++) {
            int r = rows[i];
            float *dst = seq[r] == 0 ? ca : cb;
            memcpy(dst + (size_t)pos[r] * V, step_logits + (size_t)i * V, (size_t)V * sizeof(float));
        }
    }
    e = s_max_row_err(ca, ra, NA, V);
    T_CHECK(e < 1e-5, "%s: batched A vs alone: %.3g", name, e);
    e = s_max_row_err(cb, rb, NB, V);
    T_CHECK(e < 1e-5, "%s: batched B vs alone: %.3g", name, e);

    /* malformed batches are refused (model_forward logs one error line for each) */
    if (f) {
        fprintf(stderr, "%s: 5 malformed batches follow; their error lines are expected\n", name);
        int32_t tok = 0, pos = 0, seq = 0, row = 0;
        batch_t b = {1, &tok, &pos, &seq, tables, 1, &row};
        tok = V;
        T_CHECK(model_forward(f, &kv, &b, step_logits) == STRATA_EINVAL_INPUT, "%s: token >= vocab", name);
        tok = 0;
        int32_t bad[2] = {0, -1}; /* position BS lies in the second block: id -1, then too big */
        const int32_t *bad_tables[1] = {bad};
        b.block_tables = bad_tables;
        pos = BS;
        T_CHECK(model_forward(f, &kv, &b, step_logits) == STRATA_EINVAL_INPUT, "%s: block id -1", name);
        bad[1] = n_blocks;
        T_CHECK(model_forward(f, &kv, &b, step_logits) == STRATA_EINVAL_INPUT, "%s: block id past cache", name);
        b.block_tables = tables;
        pos = 0;
        row = 1;
        T_CHECK(model_forward(f, &kv, &b, step_logits) == STRATA_EINVAL_INPUT, "%s: logit row outside", name);
        b.n_tokens = NA + NB + 1;
        T_CHECK(model_forward(f, &kv, &b, step_logits) == STRATA_EINVAL_INPUT, "%s: too many tokens", name);
    }
    forward_ctx_free(f);
    kv_cache_free(&kv);

    /* greedy generation = argmax of the logits of prompt + generated tokens */
    sampler_params_t sp;
    sampler_params_default(&sp);
    int32_t gen[8], n_gen = 0;
    T_CHECK(generate_tokens(m, pool, ta, 5, 8, &sp, 2, gen, &n_gen, NULL) == 0 && n_gen == 8, "%s: generate", name);
    int32_t all[13];
    memcpy(all, ta, 5 * sizeof(int32_t));
    memcpy(all + 5, gen, 8 * sizeof(int32_t));
    T_CHECK(s_run_alone(m, pool, all, 13, 13, ca) == 0, "%s: eval generated", name);
    for (int i = 0; i < 8; i++) {
        const float *row = ca + (size_t)(4 + i) * V;
        int best = 0;
        for (int j = 1; j < V; j++)
            if (row[j] > row[best]) best = j;
        T_CHECK(gen[i] == best, "%s: greedy token %d is %d, argmax %d", name, i, gen[i], best);
    }
    /* seeded sampling repeats; another seed gives another sequence (temperature 5 on a 97
     * token vocab: a collision of 8 draws is vanishingly unlikely) */
    int32_t s1[8], s2[8], s3[8], n1, n2, n3;
    sp.temperature = 5.0f;
    sp.seed = 0;
    T_CHECK(generate_tokens(m, pool, ta, 5, 8, &sp, 0, s1, &n1, NULL) == 0, "%s: sample", name);
    T_CHECK(generate_tokens(m, pool, ta, 5, 8, &sp, 0, s2, &n2, NULL) == 0, "%s: sample", name);
    sp.seed = 12345;
    T_CHECK(generate_tokens(m, pool, ta, 5, 8, &sp, 0, s3, &n3, NULL) == 0, "%s: sample", name);
    T_CHECK(n1 == 8 && n2 == 8 && n3 == 8 && !memcmp(s1, s2, sizeof(s1)), "%s: same seed, same tokens", name);
    T_CHECK(memcmp(s1, s3, sizeof(s1)) != 0, "%s: other seed, other tokens", name);

    free(ra);
    free(rb);
    free(ca);
    free(cb);
    free(step_logits);
}

/* gpt-oss (sliding_window W = 5 on layers 0 and 2, blocks of BS = 4): one sequence in steps of
 * 3, 1, 4, 2, ... tokens through a main table and a window table of other blocks; after each
 * step the window blocks wholly below the next query's window are freed: entry -1 and the
 * block's K/V (every layer) NaN, so a read of one would show in the logits. */
static void s_check_window(const char *name, const model_t *m, tpool_t *pool, uint64_t *rng)
{
    enum { N = 29, W = 5, NB = 24 };
    const int V = m->cfg.vocab;
    int32_t tok[N];
    for (int i = 0; i < N; i++) tok[i] = (int32_t)(t_rng_next(rng) % (uint64_t)V);
    float *ref = calloc((size_t)N * V, sizeof(float)), *got = calloc((size_t)N * V, sizeof(float));
    T_CHECK(s_run_alone(m, pool, tok, N, N, ref) == 0, "%s: alone", name);
    kv_cache_t kv;
    T_CHECK(kv_cache_init(&kv, &m->cfg, NB, BS) == 0, "%s: kv init", name);
    int32_t bt[8], wt[8];
    for (int i = 0; i < 8; i++) {
        bt[i] = i;          /* main: blocks 0..7 */
        wt[i] = NB - 1 - i; /* window: 23, 22, ... */
    }
    const int32_t *tables[1] = {bt}, *wins[1] = {wt};
    forward_ctx_t *f = forward_ctx_create(m, 8, pool);
    T_CHECK(f != NULL, "%s: forward ctx", name);
    static const int chunks[] = {3, 1, 4, 2, 1, 1, 5, 1, 3, 1, 1, 6};
    const size_t blk_elems = (size_t)kv.n_kv_heads * BS * kv.head_dim, layer_elems = (size_t)NB * blk_elems;
    for (size_t e = 0; e < (size_t)kv.n_layers * layer_elems; e++) kv.k[e] = kv.v[e] = 7.0f; /* never a K/V value */
    int freed = 0;
    for (int c = 0, p0 = 0; f && p0 < N; c++) {
        int n = chunks[c % (int)(sizeof chunks / sizeof chunks[0])];
        if (n > N - p0) n = N - p0;
        int32_t pos[8], seq[8], rows[8];
        for (int i = 0; i < n; i++) pos[i] = p0 + i, seq[i] = 0, rows[i] = i;
        batch_t b = {n, tok + p0, pos, seq, tables, n, rows, wins};
        T_CHECK(model_forward(f, &kv, &b, got + (size_t)p0 * V) == 0, "%s: window step at %d", name, p0);
        p0 += n;
        for (int j = 0; j < 8; j++) {
            if (wt[j] < 0 || (j + 1) * BS > p0 - W + 1) continue;
            for (int l = 0; l < kv.n_layers; l++)
                for (size_t e = 0; e < blk_elems; e++)
                    kv.k[l * layer_elems + (size_t)wt[j] * blk_elems + e] = kv.v[l * layer_elems + (size_t)wt[j] * blk_elems + e] = NAN;
            wt[j] = -1;
            freed++;
        }
    }
    double e = s_max_row_err(got, ref, N, V);
    T_CHECK(e < 1e-5 && freed >= 5, "%s: window tables vs one prefill: %.3g (%d blocks freed)", name, e, freed);
    /* each layer wrote through its own table only: the sliding layers (0, 2) none of the main
     * blocks, the full layer (1) none of the window's still held (the freed ones are NaN) */
    int foreign = 0;
    for (int l = 0; l < kv.n_layers; l++)
        for (int j = 0; j < 8; j++) {
            if (!m->cfg.layer_sliding[l] && wt[j] < 0) continue;
            const int32_t blk = m->cfg.layer_sliding[l] ? bt[j] : wt[j];
            for (size_t x = 0; x < blk_elems; x++) foreign += kv.k[l * layer_elems + (size_t)blk * blk_elems + x] != 7.0f;
        }
    T_CHECK(foreign == 0 && m->cfg.layer_sliding[0] && !m->cfg.layer_sliding[1], "%s: %d K values written through the other table",
            name, foreign);
    if (f) {
        fprintf(stderr, "%s: 2 malformed batches follow; their error lines are expected\n", name);
        int32_t t0 = 0, pos = N - 1, sq = 0, row = 0;
        wt[(N - W) / BS] = -1; /* within the last position's window */
        batch_t b = {1, &t0, &pos, &sq, tables, 1, &row, wins};
        T_CHECK(model_forward(f, &kv, &b, got) == STRATA_EINVAL_INPUT, "%s: window block -1 inside the window", name);
        const int32_t *none[1] = {NULL};
        b.win_tables = none;
        T_CHECK(model_forward(f, &kv, &b, got) == STRATA_EINVAL_INPUT, "%s: no window table", name);
    }
    forward_ctx_free(f);
    kv_cache_free(&kv);
    free(ref);
    free(got);
}

int main(void)
{
    uint64_t seed = t_seed();
    uint64_t rng = seed;
    tpool_t *pool = tpool_create(2);
    T_CHECK(pool != NULL, "pool");
    static const struct {
        arch_t arch;
        const char *name;
    } archs[] = {
        {ARCH_MIXTRAL, "mixtral"}, {ARCH_QWEN2_MOE, "qwen2moe"}, {ARCH_QWEN3_MOE, "qwen3moe"}, {ARCH_OLMOE, "olmoe"}};
    for (size_t a = 0; a < sizeof(archs) / sizeof(archs[0]); a++) {
        for (int q = 0; q < 2; q++) {
            model_config_t c;
            synth_config(&c, archs[a].arch, 97, 64, 3, 4, 2, 16, 8, 2, 32);
            if (archs[a].arch == ARCH_QWEN2_MOE) c.layer_sparse[1] = false; /* a dense MLP layer */
            if (archs[a].arch == ARCH_OLMOE) {
                c.rot_dim = 8; /* partial rotary */
                synth_config_rope(&c);
            }
            model_t m;
            char name[64];
            snprintf(name, sizeof(name), "%s/%s", archs[a].name, q ? "int4" : "f32");
            int rc = synth_model(&m, &c, q ? WF_INT4 : WF_F32, 32, t_rng_next(&rng));
            T_CHECK(rc == 0, "%s: synth_model: %s", name, strata_strerror(rc));
            if (rc < 0) continue;
            s_check_model(name, &m, pool, &rng);
            model_free(&m);
        }
    }
    for (int q = 0; q < 2; q++) {
        model_config_t c;
        synth_config(&c, ARCH_GPT_OSS, 97, 64, 3, 4, 2, 16, 8, 2, 32);
        c.sliding_window = 5; /* layers 0 and 2 */
        model_t m;
        const char *name = q ? "gpt-oss/int4" : "gpt-oss/f32";
        int rc = synth_model(&m, &c, q ? WF_INT4 : WF_F32, 32, t_rng_next(&rng));
        T_CHECK(rc == 0, "%s: synth_model: %s", name, strata_strerror(rc));
        if (rc < 0) continue;
        s_check_model(name, &m, pool, &rng);
        s_check_window(name, &m, pool, &rng);
        model_free(&m);
    }
    tpool_destroy(pool);
    return t_done("test_batch");
}
