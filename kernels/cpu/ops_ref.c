/* ops_ref.c - the plain C reference of every CPU op. Obviously correct first: the fast
 * paths (ops_avx2.c, ops_avx512.c) and the CUDA kernels are tested against this file. The
 * non-matmul ops have only this implementation. Dots accumulate in double. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/strata.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/ops_impl.h"

void cpu_q8_quantize(const float *x, int64_t ldx, int n, int cols, int8_t *q, float *d, int32_t *s)
{
    const int nb = cols / 32;
    for (int t = 0; t < n; t++)
        for (int b = 0; b < nb; b++) {
            const float *v = x + t * ldx + b * 32;
            float amax = 0;
            for (int k = 0; k < 32; k++) amax = fmaxf(amax, fabsf(v[k]));
            const float dd = amax / 127.f;
            int8_t *qb = q + (int64_t)t * cols + b * 32;
            int32_t sum = 0;
            for (int k = 0; k < 32; k++) {
                qb[k] = dd > 0.f ? (int8_t)lrintf(v[k] / dd) : 0;
                sum += qb[k];
            }
            d[(int64_t)t * nb + b] = dd;
            s[(int64_t)t * nb + b] = sum;
        }
}

/* The q8 reference: the exactly dequantized row dotted in double with x' = xq * xd. */
static void s_ref_q8_rows(const mm_job_t *j, int32_t r0, int32_t r1, float *wr)
{
    const int cols = j->w->cols, nb = cols / 32;
    for (int32_t r = r0; r < r1; r++) {
        qmat_dequant_row(j->w, r, wr);
        for (int t = 0; t < j->n; t++) {
            const int8_t *q = j->xq + (int64_t)t * cols;
            const float *d = j->xd + (int64_t)t * nb;
            double acc = 0;
            for (int c = 0; c < cols; c++) acc += (double)q[c] * d[c / 32] * wr[c];
            mm_store(j, t, r, (float)acc);
        }
    }
}

void cpu_ref_mm_rows(const mm_job_t *j, int32_t r0, int32_t r1)
{
    const int cols = j->w->cols;
    float stackbuf[4096];
    float *wr = cols <= 4096 ? stackbuf : malloc((size_t)cols * sizeof(float));
    STRATA_ASSERT(wr != NULL);
    if (j->xq) s_ref_q8_rows(j, r0, r1, wr);
    else
        for (int32_t r = r0; r < r1; r++) {
            qmat_dequant_row(j->w, r, wr);
            for (int t = 0; t < j->n; t++) {
                const float *x = j->x + (int64_t)t * j->ldx;
                double acc = 0;
                for (int c = 0; c < cols; c++) acc += (double)x[c] * wr[c];
                mm_store(j, t, r, (float)acc);
            }
        }
    if (wr != stackbuf) free(wr);
}

void cpu_rmsnorm(float *y, const float *x, const float *w, int n, int dim, float eps)
{
    for (int t = 0; t < n; t++) {
        const float *xt = x + (int64_t)t * dim;
        float *yt = y + (int64_t)t * dim;
        double ss = 0;
        for (int i = 0; i < dim; i++) ss += (double)xt[i] * xt[i];
        float inv = (float)(1.0 / sqrt(ss / dim + (double)eps));
        for (int i = 0; i < dim; i++) yt[i] = xt[i] * inv * w[i]; /* y may alias x */
    }
}

void cpu_rope(float *x, int n, int n_heads, int head_dim, int rot_dim, const int32_t *pos,
              const float *inv_freq, float attn_factor)
{
    STRATA_ASSERT(rot_dim % 2 == 0 && rot_dim <= head_dim);
    const int half = rot_dim / 2;
    for (int t = 0; t < n; t++) {
        for (int i = 0; i < half; i++) {
            /* As HF: the angle is an fp32 product, cos/sin are scaled by attn_factor. */
            float ang = (float)pos[t] * inv_freq[i];
            float c = cosf(ang) * attn_factor, s = sinf(ang) * attn_factor;
            for (int h = 0; h < n_heads; h++) {
                float *xh = x + ((int64_t)t * n_heads + h) * head_dim;
                float x1 = xh[i], x2 = xh[i + half];
                xh[i] = x1 * c - x2 * s;
                xh[i + half] = x2 * c + x1 * s;
            }
        }
    }
}

void cpu_ref_attention(float *out, const float *q, const float *k_cache, const float *v_cache,
                       const int32_t *block_table, int ctx_start, int n_ctx, int n_heads, int n_kv_heads,
                       int head_dim, int block_size, float scale, const float *sinks, float *scratch)
{
    STRATA_ASSERT(ctx_start >= 0 && ctx_start < n_ctx && n_kv_heads >= 1 && n_heads % n_kv_heads == 0);
    const int group = n_heads / n_kv_heads, len = n_ctx - ctx_start;
    for (int h = 0; h < n_heads; h++) {
        const int kvh = h / group;
        const float *qh = q + (int64_t)h * head_dim;
        float *oh = out + (int64_t)h * head_dim;
        float *s = scratch; /* [len]: position ctx_start + i at s[i] */
        float mx = sinks ? sinks[h] : -INFINITY;
        for (int p = ctx_start; p < n_ctx; p++) {
            int64_t blk = block_table[p / block_size];
            const float *k = k_cache + ((blk * n_kv_heads + kvh) * block_size + p % block_size) * head_dim;
            float d = 0;
            for (int i = 0; i < head_dim; i++) d += qh[i] * k[i];
            s[p - ctx_start] = d * scale;
            if (s[p - ctx_start] > mx) mx = s[p - ctx_start];
        }
        double sum = sinks ? expf(sinks[h] - mx) : 0; /* the sink's column: in the sum, no value */
        for (int i = 0; i < len; i++) {
            s[i] = expf(s[i] - mx);
            sum += s[i];
        }
        float inv = (float)(1.0 / sum);
        for (int i = 0; i < head_dim; i++) oh[i] = 0;
        for (int p = ctx_start; p < n_ctx; p++) {
            int64_t blk = block_table[p / block_size];
            const float *v = v_cache + ((blk * n_kv_heads + kvh) * block_size + p % block_size) * head_dim;
            float a = s[p - ctx_start] * inv;
            for (int i = 0; i < head_dim; i++) oh[i] += a * v[i];
        }
    }
}

void cpu_gate_topk(const float *logits, int n_experts, int top_k, bool renorm, int32_t *idx, float *weight)
{
    STRATA_ASSERT(top_k >= 1 && top_k <= n_experts && n_experts <= 4096);
    float probs[4096];
    bool taken[4096];
    float mx = -INFINITY;
    for (int e = 0; e < n_experts; e++) mx = logits[e] > mx ? logits[e] : mx;
    double sum = 0;
    for (int e = 0; e < n_experts; e++) {
        probs[e] = expf(logits[e] - mx);
        sum += probs[e];
        taken[e] = false;
    }
    for (int e = 0; e < n_experts; e++) probs[e] = (float)(probs[e] / sum);
    double wsum = 0;
    for (int k = 0; k < top_k; k++) {
        int best = -1;
        for (int e = 0; e < n_experts; e++) /* strict > keeps the lower index on ties */
            if (!taken[e] && (best < 0 || probs[e] > probs[best])) best = e;
        taken[best] = true;
        idx[k] = best;
        weight[k] = probs[best];
        wsum += probs[best];
    }
    if (renorm)
        for (int k = 0; k < top_k; k++) weight[k] = (float)(weight[k] / wsum);
}

typedef struct {
    float v;
    int32_t id;
} s_cand_t;

/* Descending value, ascending id on ties: a total order, so the result is deterministic. */
static int s_cand_cmp(const void *a, const void *b)
{
    const s_cand_t *x = a, *y = b;
    if (x->v != y->v) return x->v > y->v ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static int32_t s_argmax(const float *v, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    return best;
}

/* Keep the k best candidates (s_cand_cmp order) in c[0..k) sorted; returns how many. Most
 * logits fail the first comparison against the current k-th best, so this is ~O(vocab). */
static int s_topk_select(const float *logits, int vocab, int k, s_cand_t *c)
{
    int nc = 0;
    for (int i = 0; i < vocab; i++) {
        s_cand_t x = {logits[i], i};
        if (nc == k && s_cand_cmp(&x, &c[k - 1]) >= 0) continue;
        int j = nc < k ? nc++ : k - 1;
        while (j > 0 && s_cand_cmp(&x, &c[j - 1]) < 0) {
            c[j] = c[j - 1];
            j--;
        }
        c[j] = x;
    }
    return nc;
}

static int s_id_cmp(const void *a, const void *b)
{
    const s_cand_t *x = a, *y = b;
    return (x->id > y->id) - (x->id < y->id);
}

/* top-p without a full sort. Tokens go into buckets by mx - logit (bucket 0 the most likely);
 * the bucket where the descending cumulative mass reaches target holds the nucleus boundary;
 * only it is sorted. Returns the last kept candidate: token i is kept iff (logit_i, i) ranks
 * at or before it in s_cand_cmp order. p[i] = expf(logit_i - mx). */
#define S_NB 4096
#define S_DMAX 48.0f /* exp(-48) ~ 1e-21: everything beyond shares the last bucket */
static inline int s_bucket(float d)
{
    const int b = (int)(d * (S_NB / S_DMAX));
    return b < S_NB - 1 ? b : S_NB - 1;
}

static s_cand_t s_nucleus_last(const float *logits, const float *p, int vocab, float mx, double target, s_cand_t *c)
{
    double *mass = calloc(S_NB, sizeof *mass);
    STRATA_ASSERT(mass != NULL);
    for (int i = 0; i < vocab; i++) mass[s_bucket(mx - logits[i])] += p[i];
    double cum = 0;
    int bb = S_NB - 1;
    for (int b = 0; b < S_NB; b++) {
        if (mass[b] > 0 && cum + mass[b] >= target) {
            bb = b;
            break;
        }
        cum += mass[b];
    }
    free(mass);
    int nc = 0;
    for (int i = 0; i < vocab; i++)
        if (s_bucket(mx - logits[i]) == bb) c[nc++] = (s_cand_t){logits[i], i};
    if (nc == 0) { /* rounding left the target unreached: keep everything */
        for (int i = 0; i < vocab; i++)
            if (nc == 0 || s_cand_cmp(&(s_cand_t){logits[i], i}, &c[0]) > 0) c[0] = (s_cand_t){logits[i], i}, nc = 1;
        return c[0];
    }
    qsort(c, (size_t)nc, sizeof *c, s_cand_cmp);
    for (int j = 0; j < nc; j++) {
        cum += p[c[j].id];
        if (cum >= target) return c[j];
    }
    return c[nc - 1];
}

int32_t cpu_sample(float *logits, int vocab, float temperature, int top_k, float top_p, double u)
{
    STRATA_ASSERT(vocab >= 1);
    if (temperature <= 0 || top_k == 1) return s_argmax(logits, vocab);
    for (int i = 0; i < vocab; i++) logits[i] /= temperature;
    const float mx = logits[s_argmax(logits, vocab)];
    s_cand_t *c = malloc((size_t)vocab * sizeof(*c));
    float *p = malloc((size_t)vocab * sizeof(float)); /* exp(logit - mx): expf, summed in double */
    STRATA_ASSERT(c != NULL && p != NULL);
    int32_t pick;
    if (top_k > 0 && top_k < vocab) {
        /* the k best, sorted; top-p is the shortest prefix of them reaching top_p of their mass */
        int nc = s_topk_select(logits, vocab, top_k, c);
        double z = 0;
        for (int i = 0; i < nc; i++) z += (p[i] = expf(c[i].v - mx));
        int keep = nc;
        if (top_p < 1) {
            double cum = 0;
            for (int i = 0; i < nc; i++)
                if ((cum += p[i]) >= top_p * z) {
                    keep = i + 1;
                    break;
                }
        }
        qsort(c, (size_t)keep, sizeof *c, s_id_cmp); /* the draw walks the kept tokens in id order */
        double mass = 0;
        for (int i = 0; i < keep; i++) mass += (p[i] = expf(c[i].v - mx));
        double r = u * mass, cum = 0;
        pick = c[keep - 1].id;
        for (int i = 0; i < keep; i++)
            if (r < (cum += p[i])) {
                pick = c[i].id;
                break;
            }
    } else {
        double z = 0;
        for (int i = 0; i < vocab; i++) z += (p[i] = expf(logits[i] - mx));
        s_cand_t last = {0, vocab - 1};
        const bool nucleus = top_p < 1;
        double mass = z;
        if (nucleus) {
            last = s_nucleus_last(logits, p, vocab, mx, top_p * z, c);
            mass = 0;
            for (int i = 0; i < vocab; i++)
                if (s_cand_cmp(&(s_cand_t){logits[i], i}, &last) <= 0) mass += p[i];
        }
        double r = u * mass, cum = 0;
        pick = -1;
        for (int i = 0; i < vocab; i++) {
            if (nucleus && s_cand_cmp(&(s_cand_t){logits[i], i}, &last) > 0) continue;
            pick = i; /* the last kept token, should rounding leave r unreached */
            if (r < (cum += p[i])) break;
        }
    }
    free(p);
    free(c);
    return pick;
}
