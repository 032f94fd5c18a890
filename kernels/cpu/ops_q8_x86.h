/* ops_q8_x86.h - the INT4 and MXFP4 x int8-activation row kernel (CPU_ACT_Q8), for the x86
 * files that include it (ops_avx2.c, ops_avx512.c; both compile with AVX2, FMA and F16C), and
 * the per-row preparation it shares with ops_avx512_vnni.c. Private to kernels/cpu.
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
 *
 * MXFP4 runs the same kernel: twice an e2m1 value is an integer in [-12, 12], so a pshufb
 * table gives u = 2 * e2m1 + 12 in [0, 24] per nibble, and
 *   dot(2 * e2m1, xq) = dot(u, xq) - 12 * xs[b],   m[b] = 2^(scale - 127) / 2 * xd[b]
 * (pair sums <= 2*24*127, halves <= 12192: no int16 saturation). Its low nibbles are the even
 * columns and the high ones the odd, so two byte unpacks put the u of columns 0..15 and
 * 16..31 in order, and xq stays in row order. The VNNI file sends MXFP4 here too.
 */
#ifndef STRATA_CPU_OPS_Q8_X86_H
#define STRATA_CPU_OPS_Q8_X86_H

#include <immintrin.h>

#include "kernels/cpu/ops_impl.h"
#define PF_ROWS 4 /* rows of prefetch distance */

/* The offset of u over the signed weights: INT4 nibble - 8, MXFP4 2 * e2m1 + 12. */
static inline __attribute__((always_inline)) int q8x_bias(wfmt_t fmt)
{
    return fmt == WF_MXFP4 ? 12 : 8;
}

/* The u of block b's 32 columns, 0..15 in *lo and 16..31 in *hi, in column order. */
static inline __attribute__((always_inline)) void q8x_unpack(wfmt_t fmt, const uint8_t *p, int b, __m128i *lo,
                                                             __m128i *hi)
{
    const __m128i mk = _mm_set1_epi8(0x0f);
    const __m128i by = _mm_loadu_si128((const __m128i *)(p + 16 * b));
    __m128i l = _mm_and_si128(by, mk), h = _mm_and_si128(_mm_srli_epi16(by, 4), mk);
    if (fmt == WF_MXFP4) { /* 2 * e2m1 + 12 by nibble; then interleave even and odd columns */
        const __m128i lut = _mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0);
        l = _mm_shuffle_epi8(lut, l);
        h = _mm_shuffle_epi8(lut, h);
        const __m128i c0 = _mm_unpacklo_epi8(l, h);
        h = _mm_unpackhi_epi8(l, h);
        l = c0;
    }
    *lo = l;
    *hi = h;
}

/* One block for T tokens: acc[t] += dot(u, xq[t] block b) * m[t][b]. */
static inline __attribute__((always_inline)) void q8x_block(wfmt_t fmt, const uint8_t *p, int b, const int8_t *xq,
                                                            int64_t ldq, const float *m, int ldm, int T, __m128 *acc)
{
    const __m128i one = _mm_set1_epi16(1);
    __m128i lo, hi;
    q8x_unpack(fmt, p, b, &lo, &hi);
    for (int t = 0; t < T; t++) {
        const int8_t *x = xq + t * ldq + 32 * b;
        const __m128i s = _mm_add_epi16(_mm_maddubs_epi16(lo, _mm_loadu_si128((const __m128i *)x)),
                                        _mm_maddubs_epi16(hi, _mm_loadu_si128((const __m128i *)(x + 16))));
        acc[t] = _mm_fmadd_ps(_mm_cvtepi32_ps(_mm_madd_epi16(s, one)), _mm_broadcast_ss(m + t * ldm + b), acc[t]);
    }
}

/* Blocks [0, nb) for T (1..4) tokens, in pairs on two accumulator sets (the FMA latency
 * would otherwise bound a 1-token row); acc[t] gets the total. */
static inline __attribute__((always_inline)) void q8x_blocks(wfmt_t fmt, const uint8_t *p, int nb, const int8_t *xq,
                                                             int64_t ldq, const float *m, int ldm, int T, __m128 *acc)
{
    __m128 a1[4];
    for (int t = 0; t < T; t++) a1[t] = _mm_setzero_ps();
    int b = 0;
    for (; b + 2 <= nb; b += 2) {
        q8x_block(fmt, p, b, xq, ldq, m, ldm, T, acc);
        q8x_block(fmt, p, b + 1, xq, ldq, m, ldm, T, a1);
    }
    if (b < nb) q8x_block(fmt, p, b, xq, ldq, m, ldm, T, acc);
    for (int t = 0; t < T; t++) acc[t] = _mm_add_ps(acc[t], a1[t]);
}

/* g[b] = the fp32 scale of 32-column block b of row r (g: nb + 8 floats): INT4's fp16 group
 * scale; for MXFP4 half the e8m0 scale, 2^(e - 128) (the u are twice the e2m1 values), whose
 * fp32 bits are (e - 1) << 23 for e >= 2, and the subnormals 0x00400000, 0x00200000 for e = 1, 0
 * (0x00200000 << (e == 1), formed as a variable shift); 0xFF gives NaN. */
static inline __attribute__((always_inline)) void q8x_scales(wfmt_t fmt, const mm_job_t *j, int32_t r, float *g)
{
    const qmat_t *w = j->w;
    if (fmt == WF_MXFP4) {
        const int nb = w->cols / 32;
        const uint8_t *sc = (const uint8_t *)w->scales + (int64_t)r * nb;
        const __m256i one = _mm256_set1_epi32(1), two = _mm256_set1_epi32(2), ff = _mm256_set1_epi32(0xFF);
        const __m256i sub = _mm256_set1_epi32(0x00200000), nan = _mm256_set1_epi32(0x7FC00000);
        int k = 0;
        for (; k + 8 <= nb; k += 8) {
            const __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(sc + k)));
            const __m256i nrm = _mm256_slli_epi32(_mm256_sub_epi32(e, one), 23);
            const __m256i den = _mm256_sllv_epi32(sub, e); /* e = 0, 1 */
            __m256i v = _mm256_blendv_epi8(nrm, den, _mm256_cmpgt_epi32(two, e));
            v = _mm256_blendv_epi8(v, nan, _mm256_cmpeq_epi32(e, ff));
            _mm256_storeu_ps(g + k, _mm256_castsi256_ps(v));
        }
        for (; k < nb; k++) g[k] = e8m0_to_f32(sc[k]) * 0.5f; /* exact: 2^-128 is an fp32 subnormal */
        return;
    }
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
 * off[t] = bias * sum_b m[t][b] * xs[b] (bias: q8x_bias), 8 blocks at a time. */
static inline __attribute__((always_inline)) void q8x_moff(const mm_job_t *j, int t0, int T, const float *g, float *m,
                                                           float *off, float bias)
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
        off[t] = bias * o;
    }
}

/* Row r's prefetch, PF_ROWS rows ahead (while that is below r1): its nibbles and scales.
 * One row is too short a stream for the hardware prefetcher to run ahead of on its own. */
static inline __attribute__((always_inline)) void q8x_prefetch(const mm_job_t *j, int32_t r, int32_t r1)
{
    if (r + PF_ROWS >= r1) return;
    const char *a = (const char *)j->w->data + (int64_t)(r + PF_ROWS) * (j->w->cols / 2);
    for (int64_t o = 0; o < j->w->cols / 2; o += 64) _mm_prefetch(a + o, _MM_HINT_T0);
    const int64_t sb = j->w->fmt == WF_MXFP4 ? j->w->cols / 32 : (int64_t)(j->w->cols / j->w->group) * 2;
    const char *sc = (const char *)j->w->scales + (int64_t)(r + PF_ROWS) * sb;
    for (int64_t o = 0; o < sb; o += 64) _mm_prefetch(sc + o, _MM_HINT_T0);
}

static inline __attribute__((always_inline)) void q8x_row(wfmt_t fmt, const mm_job_t *j, int32_t r, int t0, int T,
                                                          float *g, float *m)
{
    const int cols = j->w->cols, nb = cols / 32;
    const uint8_t *p = (const uint8_t *)j->w->data + (int64_t)r * (cols / 2);
    float off[4];
    q8x_scales(fmt, j, r, g);
    q8x_moff(j, t0, T, g, m, off, (float)q8x_bias(fmt));
    __m128 acc[4];
    for (int t = 0; t < T; t++) acc[t] = _mm_setzero_ps();
    q8x_blocks(fmt, p, nb, j->xq + (int64_t)t0 * cols, cols, m, nb, T, acc);
    for (int t = 0; t < T; t++) {
        __m128 a = _mm_add_ps(acc[t], _mm_movehl_ps(acc[t], acc[t]));
        a = _mm_add_ss(a, _mm_movehdup_ps(a));
        mm_store(j, t0 + t, r, _mm_cvtss_f32(a) - off[t]);
    }
}

/* Rows [r0, r1) of an INT4 or MXFP4 job with q8 activations (j->xq set, in row order), any
 * number of tokens: each row's nibbles are unpacked once per 4 tokens. */
static inline __attribute__((always_inline)) void q8x_fmt_rows(wfmt_t fmt, const mm_job_t *j, int32_t r0, int32_t r1)
{
    const int nb = j->w->cols / 32;
    float *g = cpu_row_buf((size_t)5 * nb + 8), *m = g + nb + 8; /* scale per block; m[4][nb] */
    for (int32_t r = r0; r < r1; r++) {
        q8x_prefetch(j, r, r1);
        for (int t0 = 0; t0 < j->n; t0 += 4) {
            switch (j->n - t0) {
            case 1: q8x_row(fmt, j, r, t0, 1, g, m); break;
            case 2: q8x_row(fmt, j, r, t0, 2, g, m); break;
            case 3: q8x_row(fmt, j, r, t0, 3, g, m); break;
            default: q8x_row(fmt, j, r, t0, 4, g, m); break;
            }
        }
    }
}

static inline void q8x_rows(const mm_job_t *j, int32_t r0, int32_t r1)
{
    if (j->w->fmt == WF_MXFP4) q8x_fmt_rows(WF_MXFP4, j, r0, r1);
    else q8x_fmt_rows(WF_INT4, j, r0, r1);
}

#endif
