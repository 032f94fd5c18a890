/* ops_avx512.c - AVX-512 (F, BW, VL) + FMA + F16C row kernels for cpu_matmul /
 * cpu_ffn_swiglu, one per weight format. Compiled with those -m flags; ops.c calls it only
 * on CPUs that have them. Same structure as ops_avx2.c (read that file's comment first),
 * with 16-float vectors, so a 32-column block is two vectors:
 *   BF16: zero-extend 16 halves to 32 bits, shift left 16.
 *   INT8: sign-extend 16 bytes to int32, convert; row scale on the finished dot.
 *   FP8:  sign-extend 16 bytes to 16 bits, shift left 7, mask 0xBF80: the fp16 whose value
 *         is fp8(b) / 256 (sign at bit 15, exponent and mantissa at 13..7); vcvtph2ps
 *         converts it exactly. NaN bytes (0x7f / 0xff) are detected with a byte compare
 *         and make the row's outputs NaN, as in the reference.
 *   INT4: low nibbles of the 16 bytes are columns 0..15 and high nibbles 16..31 (the
 *         Q4_0 order), so each half sign-extends straight to one vector after - 8.
 *   MXFP4: the 16 bytes zero-extend to 16 int32 indices; vpermps reads only an index's low 4
 *         bits, so it looks the low nibbles up in a 16-float e2m1 table as they are, and the
 *         high ones after a shift by 4. Those are the even and the odd columns of the block,
 *         so s_fused de-interleaves x to match, once per token: each 32 columns as the 16 even
 *         then the 16 odd. The block's e8m0 scale multiplies its partial dot, like INT4's.
 * More than 4 tokens: dequantize each row once into an fp32 buffer, then 4 tokens at a
 * time, in token blocks whose activations stay in L2.
 */
#include <immintrin.h>
#include <math.h>

#include "common/strata.h"
#include "kernels/cpu/ops_impl.h"
#include "kernels/cpu/ops_q8_x86.h"

#define ALWAYS static inline __attribute__((always_inline))

typedef struct {
    const void *p;        /* row data */
    const uint16_t *sc;   /* INT4: fp16 scales of this row [cols / group] */
    const uint8_t *e8;    /* MXFP4: e8m0 scales of this row [cols / 32] */
    int group;            /* INT4 */
} s_row_t;

/* Columns [c, c+32) as two fp32 vectors (cols c..c+15, c+16..c+31; MXFP4: the even columns,
 * then the odd ones). */
ALWAYS void s_load32(wfmt_t fmt, const s_row_t *rw, int c, __m512 w[2], __mmask16 *nan)
{
    switch (fmt) {
    case WF_F32: {
        const float *p = (const float *)rw->p + c;
        w[0] = _mm512_loadu_ps(p);
        w[1] = _mm512_loadu_ps(p + 16);
        break;
    }
    case WF_BF16: {
        const uint16_t *p = (const uint16_t *)rw->p + c;
        for (int k = 0; k < 2; k++) {
            __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p + 16 * k)));
            w[k] = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
        }
        break;
    }
    case WF_INT8: {
        const int8_t *p = (const int8_t *)rw->p + c;
        for (int k = 0; k < 2; k++)
            w[k] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p + 16 * k))));
        break;
    }
    case WF_FP8: {
        const uint8_t *p = (const uint8_t *)rw->p + c;
        const __m128i m7 = _mm_set1_epi8(0x7f);
        const __m256i hm = _mm256_set1_epi16((short)0xBF80);
        for (int k = 0; k < 2; k++) {
            __m128i b = _mm_loadu_si128((const __m128i *)(p + 16 * k));
            *nan |= _mm_cmpeq_epi8_mask(_mm_and_si128(b, m7), m7);
            __m256i h = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(b), 7), hm);
            w[k] = _mm512_cvtph_ps(h);
        }
        break;
    }
    case WF_INT4: {
        __m128i b = _mm_loadu_si128((const __m128i *)((const uint8_t *)rw->p + c / 2));
        const __m128i m = _mm_set1_epi8(0x0f), e = _mm_set1_epi8(8);
        __m128i lo = _mm_sub_epi8(_mm_and_si128(b, m), e);
        __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(b, 4), m), e);
        w[0] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(lo));
        w[1] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(hi));
        break;
    }
    case WF_MXFP4: {
        const __m512 lut = _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f, -1.0f, -1.5f,
                                          -2.0f, -3.0f, -4.0f, -6.0f); /* e2m1 by nibble */
        const __m512i i = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)((const uint8_t *)rw->p + c / 2)));
        w[0] = _mm512_permutexvar_ps(i, lut);
        w[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(i, 4), lut);
        break;
    }
    default:
        STRATA_ASSERT(!"format");
    }
}

/* Scalar weight at column c, in the units of s_load32 (tails of non-INT4 rows). */
ALWAYS float s_load1(wfmt_t fmt, const s_row_t *rw, int c)
{
    switch (fmt) {
    case WF_F32: return ((const float *)rw->p)[c];
    case WF_BF16: return bf16_to_f32(((const uint16_t *)rw->p)[c]);
    case WF_INT8: return (float)((const int8_t *)rw->p)[c];
    case WF_FP8: return fp8e4m3_to_f32(((const uint8_t *)rw->p)[c]) * (1.0f / 256);
    default: STRATA_ASSERT(!"format"); return 0;
    }
}

/* Multiply-accumulate columns [c, c+32) into T tokens: non-INT4 into acc0 (cols 0-15) and
 * acc1 (16-31); INT4 and MXFP4 form the block's dot first and add it times the block's scale d
 * to acc0. */
ALWAYS void s_block(wfmt_t fmt, const s_row_t *rw, int c, const float *x, int64_t ldx, int T, __m512 *acc0,
                    __m512 *acc1, __m512 d, __mmask16 *nan)
{
    __m512 w[2];
    s_load32(fmt, rw, c, w, nan);
    for (int t = 0; t < T; t++) {
        const float *xt = x + t * ldx + c;
        if (fmt == WF_INT4 || fmt == WF_MXFP4) {
            __m512 s = _mm512_mul_ps(w[0], _mm512_loadu_ps(xt));
            s = _mm512_fmadd_ps(w[1], _mm512_loadu_ps(xt + 16), s);
            acc0[t] = _mm512_fmadd_ps(s, d, acc0[t]);
        } else {
            acc0[t] = _mm512_fmadd_ps(w[0], _mm512_loadu_ps(xt), acc0[t]);
            acc1[t] = _mm512_fmadd_ps(w[1], _mm512_loadu_ps(xt + 16), acc1[t]);
        }
    }
}

/* The scale of 32-column block b (INT4: gshift = log2(group / 32)) as a vector. */
ALWAYS __m512 s_block_scale(wfmt_t fmt, const s_row_t *rw, int b, int gshift)
{
    return _mm512_set1_ps(fmt == WF_MXFP4 ? e8m0_to_f32(rw->e8[b]) : _cvtsh_ss(rw->sc[b >> gshift]));
}

/* out[t] = dot(row, x[t]) for T (1..4) tokens, in the units of s_load32. Blocks go in
 * pairs so every accumulator is a named register. */
ALWAYS void s_row_dots(wfmt_t fmt, const s_row_t *rw, int cols, const float *x, int64_t ldx, int T, float *out)
{
    __m512 a0[4], a1[4];
    for (int t = 0; t < T; t++) a0[t] = a1[t] = _mm512_setzero_ps();
    __mmask16 nan = 0;
    const int nb = cols / 32;
    const int gshift = fmt == WF_INT4 ? __builtin_ctz((unsigned)rw->group / 32) : 0;
    const __m512 one = _mm512_set1_ps(1.0f);
    int b = 0;
    const bool scaled = fmt == WF_INT4 || fmt == WF_MXFP4; /* a scale per block */
    for (; b + 2 <= nb; b += 2) {
        if (scaled) {
            s_block(fmt, rw, b * 32, x, ldx, T, a0, a1, s_block_scale(fmt, rw, b, gshift), &nan);
            s_block(fmt, rw, b * 32 + 32, x, ldx, T, a1, a0, s_block_scale(fmt, rw, b + 1, gshift), &nan);
        } else {
            s_block(fmt, rw, b * 32, x, ldx, T, a0, a1, one, &nan);
            s_block(fmt, rw, b * 32 + 32, x, ldx, T, a0, a1, one, &nan);
        }
    }
    if (b < nb) s_block(fmt, rw, b * 32, x, ldx, T, a0, a1, scaled ? s_block_scale(fmt, rw, b, gshift) : one, &nan);
    for (int t = 0; t < T; t++) {
        float s = _mm512_reduce_add_ps(_mm512_add_ps(a0[t], a1[t]));
        if (!scaled)
            for (int c = nb * 32; c < cols; c++) s += s_load1(fmt, rw, c) * x[t * ldx + c];
        out[t] = s;
    }
    if (fmt == WF_FP8 && nan)
        for (int t = 0; t < T; t++) out[t] = NAN;
}

ALWAYS void s_row_view(const qmat_t *w, int32_t r, s_row_t *rw, float *rscale)
{
    const int64_t cols = w->cols;
    *rscale = 1;
    switch (w->fmt) {
    case WF_F32: rw->p = (const float *)w->data + r * cols; break;
    case WF_BF16: rw->p = (const uint16_t *)w->data + r * cols; break;
    case WF_INT8:
        rw->p = (const int8_t *)w->data + r * cols;
        *rscale = ((const float *)w->scales)[r];
        break;
    case WF_FP8:
        rw->p = (const uint8_t *)w->data + r * cols;
        *rscale = ((const float *)w->scales)[r] * 256.0f; /* exact: a power of two */
        break;
    case WF_INT4:
        rw->p = (const uint8_t *)w->data + r * (cols / 2);
        rw->sc = (const uint16_t *)w->scales + r * (cols / w->group);
        rw->group = w->group;
        break;
    case WF_MXFP4:
        rw->p = (const uint8_t *)w->data + r * (cols / 2);
        rw->e8 = (const uint8_t *)w->scales + r * (cols / 32);
        break;
    default: STRATA_ASSERT(!"format");
    }
}

/* Rows [r0, r1) for every token of the job. Tokens go in blocks whose activations stay within
 * ~256 KiB; in a block each row is read once and its dots run in slices of 4 tokens, so a
 * token's result is the same whatever the batch around it (see ops_avx2.c). */
ALWAYS void s_fused(const mm_job_t *j, wfmt_t fmt, int32_t r0, int32_t r1)
{
    const qmat_t *w = j->w;
    const size_t row_bytes = qmat_data_bytes(fmt, 1, w->cols);
    const int tbk = mm_token_block(w->cols);
    for (int tb = 0; tb < j->n; tb += tbk) {
        const int te = tb + tbk < j->n ? tb + tbk : j->n;
        const float *xb = j->x + (int64_t)tb * j->ldx; /* the token block's x, row stride ldx */
        int64_t ldx = j->ldx;
        if (fmt == WF_MXFP4) { /* each 32 columns as the 16 even, then the 16 odd (s_load32) */
            float *xp = cpu_row_buf((size_t)(te - tb) * w->cols);
            const __m512i ie = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
            const __m512i io = _mm512_add_epi32(ie, _mm512_set1_epi32(1));
            for (int t = tb; t < te; t++)
                for (int c = 0; c < w->cols; c += 32) {
                    const float *xt = j->x + (int64_t)t * j->ldx + c;
                    const __m512 lo = _mm512_loadu_ps(xt), hi = _mm512_loadu_ps(xt + 16);
                    float *o = xp + (int64_t)(t - tb) * w->cols + c;
                    _mm512_storeu_ps(o, _mm512_permutex2var_ps(lo, ie, hi));
                    _mm512_storeu_ps(o + 16, _mm512_permutex2var_ps(lo, io, hi));
                }
            xb = xp;
            ldx = w->cols;
        }
        for (int32_t r = r0; r < r1; r++) {
            s_row_t rw = {0};
            float rs, out[4];
            s_row_view(w, r, &rw, &rs);
            if (r + PF_ROWS < r1) /* the whole row PF_ROWS ahead (see ops_q8_x86.h) */
                for (size_t o = 0; o < row_bytes; o += 64) _mm_prefetch((const char *)rw.p + PF_ROWS * row_bytes + o, _MM_HINT_T0);
            for (int t0 = tb; t0 < te; t0 += 4) {
                const int T = te - t0 < 4 ? te - t0 : 4;
                const float *xt = xb + (int64_t)(t0 - tb) * ldx;
                switch (T) {
                case 1: s_row_dots(fmt, &rw, w->cols, xt, ldx, 1, out); break;
                case 2: s_row_dots(fmt, &rw, w->cols, xt, ldx, 2, out); break;
                case 3: s_row_dots(fmt, &rw, w->cols, xt, ldx, 3, out); break;
                default: s_row_dots(fmt, &rw, w->cols, xt, ldx, 4, out); break;
                }
                for (int t = 0; t < T; t++) mm_store(j, t0 + t, r, out[t] * rs);
            }
        }
    }
}

ALWAYS float s_vdot(const float *a, const float *b, int n)
{
    __m512 s = _mm512_setzero_ps();
    for (int i = 0; i < n; i += 16) s = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s);
    return _mm512_reduce_add_ps(s);
}

ALWAYS void s_vaxpy(float a, const float *x, float *y, int n)
{
    const __m512 av = _mm512_set1_ps(a);
    for (int i = 0; i < n; i += 16) _mm512_storeu_ps(y + i, _mm512_fmadd_ps(av, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
}

#define X86_VW 16
#define X86_MM_ROWS cpu_avx512_mm_rows
#define X86_ATTN cpu_avx512_attention
#include "kernels/cpu/ops_x86_tail.h"
