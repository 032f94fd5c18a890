/* ops_q8_x86.h - the INT4 x int8-activation row kernel (CPU_ACT_Q8), for the x86 files that
 * include it (ops_avx2.c, ops_avx512.c; both compile with SSSE3, FMA and F16C), and the
 * per-row preparation it shares with ops_avx512_vnni.c. Private to kernels/cpu.
 *
 * Per 32-column block b of a row, with nibbles u = q4 + 8 in [0, 15] and x ~ xq * xd[b]:
 *   dot(q4, xq) = dot(u, xq) - 8 * xs[b]
 * pmaddubsw takes u as the unsigned and xq as the signed operand (|pair sum| <= 2*15*128, no
 * saturation; the low and high nibble halves add in int16, <= 7680), pmaddwd with ones
 * widens to int32, and one fp32 FMA per block applies m[b] = w_scale[b] * xd[b]. The offset
 * term sum_b m[b] * xs[b] is formed once per row and token, outside the block loop. All in
 * 128-bit registers (Zen 1 splits 256-bit ops in two; measured 4.5 cycles per 32 weights
 * there against 6.4 for the 256-bit form).
 * The fp32 operations, which ops_avx512_vnni.c repeats lane for lane: int32 lane k (k < 4) of
 * block b holds the products of columns 4k..4k+3 and 16+4k..16+4k+3; even blocks FMA into
 * one 4-lane accumulator and odd blocks into another, each in block order (an odd last block
 * into the even one); the total is (even + odd), lanes (0 + 2) + (1 + 3), minus the offset.
 */
#ifndef STRATA_CPU_OPS_Q8_X86_H
#define STRATA_CPU_OPS_Q8_X86_H

#include <immintrin.h>

#include "kernels/cpu/ops_impl.h"
#define PF_ROWS 4 /* rows of prefetch distance */

/* One block for T tokens: acc[t] += dot(u, xq[t] block b) * m[t][b]. */
static inline __attribute__((always_inline)) void q8x_int4_block(const uint8_t *p, int b, const int8_t *xq, int64_t ldq,
                                                                 const float *m, int ldm, int T, __m128 *acc)
{
    const __m128i mk = _mm_set1_epi8(0x0f), one = _mm_set1_epi16(1);
    const __m128i by = _mm_loadu_si128((const __m128i *)(p + 16 * b));
    const __m128i lo = _mm_and_si128(by, mk), hi = _mm_and_si128(_mm_srli_epi16(by, 4), mk);
    for (int t = 0; t < T; t++) {
        const int8_t *x = xq + t * ldq + 32 * b;
        const __m128i s = _mm_add_epi16(_mm_maddubs_epi16(lo, _mm_loadu_si128((const __m128i *)x)),
                                        _mm_maddubs_epi16(hi, _mm_loadu_si128((const __m128i *)(x + 16))));
        acc[t] = _mm_fmadd_ps(_mm_cvtepi32_ps(_mm_madd_epi16(s, one)), _mm_broadcast_ss(m + t * ldm + b), acc[t]);
    }
}

/* Blocks [0, nb) for T (1..4) tokens, in pairs on two accumulator sets (the FMA latency
 * would otherwise bound a 1-token row); acc[t] gets the total. */
static inline __attribute__((always_inline)) void q8x_int4_blocks(const uint8_t *p, int nb, const int8_t *xq,
                                                                  int64_t ldq, const float *m, int ldm, int T,
                                                                  __m128 *acc)
{
    __m128 a1[4];
    for (int t = 0; t < T; t++) a1[t] = _mm_setzero_ps();
    int b = 0;
    for (; b + 2 <= nb; b += 2) {
        q8x_int4_block(p, b, xq, ldq, m, ldm, T, acc);
        q8x_int4_block(p, b + 1, xq, ldq, m, ldm, T, a1);
    }
    if (b < nb) q8x_int4_block(p, b, xq, ldq, m, ldm, T, acc);
    for (int t = 0; t < T; t++) acc[t] = _mm_add_ps(acc[t], a1[t]);
}

/* g[b] = the fp32 scale of 32-column block b of row r (g: nb + 8 floats). */
static inline __attribute__((always_inline)) void q8x_int4_scales(const mm_job_t *j, int32_t r, float *g)
{
    const qmat_t *w = j->w;
    const int cols = w->cols, nb = cols / 32, gshift = __builtin_ctz((unsigned)w->group / 32);
    const uint16_t *sc = (const uint16_t *)w->scales + (int64_t)r * (cols / w->group);
    if (gshift == 0) { /* a scale per block: g is per block already */
        int k = 0;
        for (; k + 8 <= nb; k += 8) _mm256_storeu_ps(g + k, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sc + k))));
        for (; k < nb; k++) g[k] = _cvtsh_ss(sc[k]);
    } else
        for (int b = 0; b < nb; b++) g[b] = _cvtsh_ss(sc[b >> gshift]);
}

/* For tokens t0 + t, t < T (1..4): m[t][b] = g[b] * xd[b] (m: [T][nb]) and
 * off[t] = 8 * sum_b m[t][b] * xs[b], 8 blocks at a time. */
static inline __attribute__((always_inline)) void q8x_int4_moff(const mm_job_t *j, int t0, int T, const float *g,
                                                                float *m, float *off)
{
    const int nb = j->w->cols / 32;
    for (int t = 0; t < T; t++) {
        const float *xd = j->xd + (int64_t)(t0 + t) * nb;
        const int32_t *xs = j->xs + (int64_t)(t0 + t) * nb;
        float *mt = m + t * nb;
        __m256 ov = _mm256_setzero_ps();
        int b = 0;
        for (; b + 8 <= nb; b += 8) {
            const __m256 mv = _mm256_mul_ps(_mm256_loadu_ps(g + b), _mm256_loadu_ps(xd + b));
            _mm256_storeu_ps(mt + b, mv);
            ov = _mm256_fmadd_ps(mv, _mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)(xs + b))), ov);
        }
        __m128 o4 = _mm_add_ps(_mm256_castps256_ps128(ov), _mm256_extractf128_ps(ov, 1));
        o4 = _mm_add_ps(o4, _mm_movehl_ps(o4, o4));
        float o = _mm_cvtss_f32(_mm_add_ss(o4, _mm_movehdup_ps(o4)));
        for (; b < nb; b++) {
            mt[b] = g[b] * xd[b];
            o += mt[b] * (float)xs[b];
        }
        off[t] = 8.0f * o;
    }
}

/* Row r's prefetch, PF_ROWS rows ahead (while that is below r1): its nibbles and fp16 scales.
 * One row is too short a stream for the hardware prefetcher to run ahead of on its own. */
static inline __attribute__((always_inline)) void q8x_int4_prefetch(const mm_job_t *j, int32_t r, int32_t r1)
{
    if (r + PF_ROWS >= r1) return;
    const char *a = (const char *)j->w->data + (int64_t)(r + PF_ROWS) * (j->w->cols / 2);
    for (int64_t o = 0; o < j->w->cols / 2; o += 64) _mm_prefetch(a + o, _MM_HINT_T0);
    const int64_t sb = (int64_t)(j->w->cols / j->w->group) * 2;
    const char *sc = (const char *)j->w->scales + (int64_t)(r + PF_ROWS) * sb;
    for (int64_t o = 0; o < sb; o += 64) _mm_prefetch(sc + o, _MM_HINT_T0);
}

static inline __attribute__((always_inline)) void q8x_int4_row(const mm_job_t *j, int32_t r, int t0, int T, float *g,
                                                               float *m)
{
    const int cols = j->w->cols, nb = cols / 32;
    const uint8_t *p = (const uint8_t *)j->w->data + (int64_t)r * (cols / 2);
    float off[4];
    q8x_int4_scales(j, r, g);
    q8x_int4_moff(j, t0, T, g, m, off);
    __m128 acc[4];
    for (int t = 0; t < T; t++) acc[t] = _mm_setzero_ps();
    q8x_int4_blocks(p, nb, j->xq + (int64_t)t0 * cols, cols, m, nb, T, acc);
    for (int t = 0; t < T; t++) {
        __m128 a = _mm_add_ps(acc[t], _mm_movehl_ps(acc[t], acc[t]));
        a = _mm_add_ss(a, _mm_movehdup_ps(a));
        mm_store(j, t0 + t, r, _mm_cvtss_f32(a) - off[t]);
    }
}

/* Rows [r0, r1) of an INT4 job with q8 activations (j->xq set), any number of tokens: each
 * row's nibbles are unpacked once per 4 tokens. */
static inline void q8x_int4_rows(const mm_job_t *j, int32_t r0, int32_t r1)
{
    const int nb = j->w->cols / 32;
    float *g = cpu_row_buf((size_t)5 * nb + 8), *m = g + nb + 8; /* scale per block; m[4][nb] */
    for (int32_t r = r0; r < r1; r++) {
        q8x_int4_prefetch(j, r, r1);
        for (int t0 = 0; t0 < j->n; t0 += 4) {
            switch (j->n - t0) {
            case 1: q8x_int4_row(j, r, t0, 1, g, m); break;
            case 2: q8x_int4_row(j, r, t0, 2, g, m); break;
            case 3: q8x_int4_row(j, r, t0, 3, g, m); break;
            default: q8x_int4_row(j, r, t0, 4, g, m); break;
            }
        }
    }
}

#endif
