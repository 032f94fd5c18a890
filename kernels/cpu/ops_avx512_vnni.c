/* ops_avx512_vnni.c - the AVX-512 VNNI row kernel of INT4 weights times int8 activations
 * (CPU_ACT_Q8), for CPU_ISA_AVX512_VNNI. Compiled with -mavx512f -mavx512bw -mavx512vl
 * -mavx512vnni -mfma -mf16c; ops.c calls it only on CPUs that have them. Every other job
 * (other formats, MXFP4 with q8 activations included, and fp32 activations) goes to
 * cpu_avx512_mm_rows unchanged.
 *
 * Bit for bit the result of ops_q8_x86.h (the AVX-512 and AVX2 path); read its comment first.
 * The integer dots are exact on both sides: there, pmaddubsw + paddw + pmaddwd give int32
 * lane k of block b as the sum of u * xq over columns 4k..4k+3 and 16+4k..16+4k+3 (no int16
 * saturation: |u * xq| <= 15 * 127, four of them <= 7620); here vpdpbusd sums the four u8 x s8
 * products of each 32-bit lane into int32 in one instruction, so dpbusd(dpbusd(0, lo, x[0..15]),
 * hi, x[16..31]) is that same lane. The fp32 operations are then the same ones, lane for lane
 * and in the same order: the even and odd accumulators of a token sit side by side in 256 bits
 * ([even | odd]), so one FMA covers blocks b and b + 1 with m = [m[b] x4 | m[b+1] x4]; two
 * tokens t, u share a 512-bit register ([even_t | odd_t | even_u | odd_u]), with the 32
 * nibble bytes of the block pair broadcast to both halves. An odd last block and the final
 * sums are the 128-bit operations of ops_q8_x86.h; the per-row scales, m and the offset come
 * from its own code (q8x_scales, q8x_moff).
 *
 * So that each operand is one load, the driver packs xq for this kernel (cpu_avx512vnni_q8_pack):
 * the row kernel takes tokens in slices of 4 from t0 = 0, 4, 8, ..., i.e. in pairs (2i, 2i+1)
 * and, for an odd n, the last token alone. Writing lo(b) and hi(b) for columns [32b, 32b+16) and
 * [32b+16, 32b+32) of a token, 16 bytes each:
 *   a pair (t, u) fills the 2 * cols bytes at t * cols, 128 bytes per block pair (2k, 2k+1):
 *     t.lo(2k) t.lo(2k+1) u.lo(2k) u.lo(2k+1) t.hi(2k) t.hi(2k+1) u.hi(2k) u.hi(2k+1)
 *   and an odd last block as t's 32 bytes then u's, in column order;
 *   the last token alone fills the cols bytes at t * cols, 64 bytes per block pair:
 *     lo(2k) lo(2k+1) hi(2k) hi(2k+1), and an odd last block in column order.
 * The block scales xd and sums xs keep their layout.
 */
#include <immintrin.h>
#include <string.h>

#include "common/strata.h"
#include "kernels/cpu/ops_impl.h"
#include "kernels/cpu/ops_q8_x86.h"

#define ALWAYS static inline __attribute__((always_inline))

void cpu_avx512vnni_q8_pack(const int8_t *q, int n, int cols, int8_t *out)
{
    const int nb = cols / 32;
    for (int t = 0; t < n; t += 2) {
        const int8_t *a = q + (int64_t)t * cols, *u = a + cols;
        int8_t *o = out + (int64_t)t * cols;
        int b = 0;
        if (t + 1 < n) {
            for (; b + 2 <= nb; b += 2, o += 128) {
                const int8_t *a0 = a + 32 * b, *u0 = u + 32 * b;
                memcpy(o, a0, 16), memcpy(o + 16, a0 + 32, 16), memcpy(o + 32, u0, 16), memcpy(o + 48, u0 + 32, 16);
                memcpy(o + 64, a0 + 16, 16), memcpy(o + 80, a0 + 48, 16);
                memcpy(o + 96, u0 + 16, 16), memcpy(o + 112, u0 + 48, 16);
            }
            if (b < nb) memcpy(o, a + 32 * b, 32), memcpy(o + 32, u + 32 * b, 32);
        } else {
            for (; b + 2 <= nb; b += 2, o += 64) {
                const int8_t *a0 = a + 32 * b;
                memcpy(o, a0, 16), memcpy(o + 16, a0 + 32, 16), memcpy(o + 32, a0 + 16, 16), memcpy(o + 48, a0 + 48, 16);
            }
            if (b < nb) memcpy(o, a + 32 * b, 32);
        }
    }
}

/* Two floats at p in lanes 0 and 1 (the rest zero): m[b], m[b + 1]. */
ALWAYS __m128 s_load2(const float *p)
{
    return _mm_castpd_ps(_mm_load_sd((const double *)p));
}

/* One int32 lane set of a single block (ops_q8_x86.h's q8x_block): lo, hi nibbles times
 * x[0..15], x[16..31]. */
ALWAYS __m128i s_block1(__m128i lo, __m128i hi, const int8_t *x)
{
    const __m128i s = _mm_dpbusd_epi32(_mm_setzero_si128(), lo, _mm_loadu_si128((const __m128i *)x));
    return _mm_dpbusd_epi32(s, hi, _mm_loadu_si128((const __m128i *)(x + 16)));
}

/* Row r for tokens t0 .. t0 + 2 * NP + S1 - 1: NP (0..2) pairs, then S1 (0, 1) token alone
 * (the job's last). g holds the row's block scales; m is scratch for [4][nb] floats. */
ALWAYS void s_int4_row(const mm_job_t *j, int32_t r, int t0, const int NP, const int S1, const float *g, float *m)
{
    const int cols = j->w->cols, nb = cols / 32, T = 2 * NP + S1;
    const uint8_t *p = (const uint8_t *)j->w->data + (int64_t)r * (cols / 2);
    const int8_t *xq = j->xq + (int64_t)t0 * cols; /* pair i at 2 * i * cols, the lone token at 2 * NP * cols */
    float off[4];
    q8x_moff(j, t0, T, g, m, off, (float)q8x_bias(WF_INT4));
    const __m512i nib = _mm512_set1_epi8(0x0f);
    /* m of blocks b, b + 1 for tokens t (lanes 0, 1 of the first table) and u (of the second) */
    const __m512i ipair = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 16, 16, 16, 16, 17, 17, 17, 17);
    const __m256i ione = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
    __m512 ap[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    __m256 a1 = _mm256_setzero_ps();
    int b = 0;
    for (; b + 2 <= nb; b += 2) {
        const __m256i wv = _mm256_loadu_si256((const __m256i *)(p + 16 * b)); /* blocks b, b + 1 */
        __m512i lo = _mm512_setzero_si512(), hi = lo;
        if (NP) {
            const __m512i wz = _mm512_broadcast_i64x4(wv);
            lo = _mm512_and_si512(wz, nib);
            hi = _mm512_and_si512(_mm512_srli_epi16(wz, 4), nib);
        }
        for (int i = 0; i < NP; i++) {
            const int8_t *x = xq + (int64_t)2 * i * cols + 64 * b;
            __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(x));
            s = _mm512_dpbusd_epi32(s, hi, _mm512_loadu_si512(x + 64));
            const float *mt = m + 2 * i * nb + b;
            const __m512 mv = _mm512_permutex2var_ps(_mm512_castps128_ps512(s_load2(mt)), ipair,
                                                     _mm512_castps128_ps512(s_load2(mt + nb)));
            ap[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), mv, ap[i]);
        }
        if (S1) {
            const __m256i lo1 = NP ? _mm512_castsi512_si256(lo) : _mm256_and_si256(wv, _mm512_castsi512_si256(nib));
            const __m256i hi1 = NP ? _mm512_castsi512_si256(hi)
                                   : _mm256_and_si256(_mm256_srli_epi16(wv, 4), _mm512_castsi512_si256(nib));
            const int8_t *x = xq + (int64_t)2 * NP * cols + 32 * b;
            __m256i s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), lo1, _mm256_loadu_si256((const __m256i *)x));
            s = _mm256_dpbusd_epi32(s, hi1, _mm256_loadu_si256((const __m256i *)(x + 32)));
            const __m256 mv = _mm256_permutexvar_ps(ione, _mm256_castps128_ps256(s_load2(m + 2 * NP * nb + b)));
            a1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), mv, a1);
        }
    }
    __m128 ev[4], od[4]; /* each token's even and odd accumulators */
    for (int i = 0; i < NP; i++) {
        ev[2 * i] = _mm512_castps512_ps128(ap[i]);
        od[2 * i] = _mm512_extractf32x4_ps(ap[i], 1);
        ev[2 * i + 1] = _mm512_extractf32x4_ps(ap[i], 2);
        od[2 * i + 1] = _mm512_extractf32x4_ps(ap[i], 3);
    }
    if (S1) {
        ev[T - 1] = _mm256_castps256_ps128(a1);
        od[T - 1] = _mm256_extractf128_ps(a1, 1);
    }
    if (b < nb) { /* an odd last block, into the even accumulators */
        const __m128i mk = _mm_set1_epi8(0x0f), by = _mm_loadu_si128((const __m128i *)(p + 16 * b));
        const __m128i lo = _mm_and_si128(by, mk), hi = _mm_and_si128(_mm_srli_epi16(by, 4), mk);
        for (int t = 0; t < T; t++) {
            const int8_t *x = t < 2 * NP ? xq + (int64_t)(t & ~1) * cols + 64 * b + 32 * (t & 1)
                                         : xq + (int64_t)2 * NP * cols + 32 * b;
            ev[t] = _mm_fmadd_ps(_mm_cvtepi32_ps(s_block1(lo, hi, x)), _mm_broadcast_ss(m + t * nb + b), ev[t]);
        }
    }
    for (int t = 0; t < T; t++) {
        __m128 a = _mm_add_ps(ev[t], od[t]);
        a = _mm_add_ps(a, _mm_movehl_ps(a, a));
        a = _mm_add_ss(a, _mm_movehdup_ps(a));
        mm_store(j, t0 + t, r, _mm_cvtss_f32(a) - off[t]);
    }
}

/* Rows [r0, r1) of an INT4 job with packed q8 activations, any number of tokens. */
static void s_int4_rows(const mm_job_t *j, int32_t r0, int32_t r1)
{
    const int nb = j->w->cols / 32;
    float *g = cpu_row_buf((size_t)5 * nb + 8), *m = g + nb + 8; /* scale per block; m[4][nb] */
    for (int32_t r = r0; r < r1; r++) {
        q8x_prefetch(j, r, r1);
        q8x_scales(WF_INT4, j, r, g);
        for (int t0 = 0; t0 < j->n; t0 += 4) {
            switch (j->n - t0) {
            case 1: s_int4_row(j, r, t0, 0, 1, g, m); break;
            case 2: s_int4_row(j, r, t0, 1, 0, g, m); break;
            case 3: s_int4_row(j, r, t0, 1, 1, g, m); break;
            default: s_int4_row(j, r, t0, 2, 0, g, m); break;
            }
        }
    }
}

void cpu_avx512vnni_mm_rows(const mm_job_t *j, int32_t r0, int32_t r1)
{
    if (j->xq && j->w->fmt == WF_INT4) s_int4_rows(j, r0, r1); /* xq packed (cpu_avx512vnni_q8_pack) */
    else cpu_avx512_mm_rows(j, r0, r1);                       /* xq, if any, in row order */
}
