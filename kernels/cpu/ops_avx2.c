/* ops_avx2.c - AVX2 + FMA + F16C row kernels for cpu_matmul / cpu_ffn_swiglu, one per
 * weight format. Compiled with -mavx2 -mfma -mf16c; ops.c calls it only on CPUs that have
 * them.
 *
 * Decode (n <= 4 tokens) is bound by the weight stream: each weight row is read once,
 * 32 columns at a time, converted to fp32 in registers and multiplied into all n tokens.
 * The per-format conversions are exact, so these kernels see the very weights that
 * qmat_dequant_row produces; they only sum in a different order (fp32):
 *   BF16: zero-extend to 32 bits and shift left 16.
 *   INT8: sign-extend to int32, convert (row scale applied to the finished dot).
 *   FP8:  e4m3fn byte b becomes the fp16 with bits ((b << 8) >>arith 1) & 0xBF80: sign
 *         kept, exponent and mantissa moved down one bit. That fp16 equals fp8(b) / 256 for
 *         normal and subnormal b alike (fp16 has bias 15 vs 7 and 7 more mantissa bits), so
 *         F16C converts it exactly; the 256 goes into the row scale. e4m3fn has no inf and
 *         its NaN (0x7f/0xff) would come out as 480/256, so NaN bytes are detected on the
 *         side and turn the row's outputs into NaN, as the reference does.
 *   INT4: the Q4_0 order puts columns c0..c0+15 in the low nibbles and c0+16..31 in the
 *         high nibbles of 16 bytes, so two masks give both halves in column order; nibble
 *         - 8 as int8, sign-extend, convert. The group scale multiplies each 32-column
 *         partial dot.
 *   MXFP4: the same lookup kernel as INT4 with e2m1 tables; the low nibbles hold the even
 *         columns and the high ones the odd, so the permutation of x that s_fused makes
 *         folds that de-interleave in too (once per token, not per weight). The e8m0 scale
 *         of each block becomes fp32 by a shift (e8m0_to_f32) and multiplies its partial dot.
 * More than 4 tokens (prefill, expert batches): each row is dequantized once into an
 * L1-resident fp32 buffer and multiplied into the tokens 4 at a time, in token blocks
 * sized so the block's activations stay in L2.
 */
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>

#include "common/strata.h"
#include "kernels/cpu/ops_impl.h"
#include "kernels/cpu/ops_q8_x86.h"

#define ALWAYS static inline __attribute__((always_inline))

ALWAYS float s_hsum(__m256 v)
{
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    a = _mm_add_ss(a, _mm_movehdup_ps(a));
    return _mm_cvtss_f32(a);
}

/* One row, as the kernels see it. */
typedef struct {
    const void *p;        /* row data */
    const uint16_t *sc;   /* INT4: fp16 scales of this row [cols / group] */
    const uint8_t *e8;    /* MXFP4: e8m0 scales of this row [cols / 32] */
    int group;            /* INT4 */
} s_row_t;

/* Load columns [c, c+32) of a row as 4 fp32 vectors in column order (see the file comment
 * for the scaling of INT8/FP8). nan collects FP8 NaN bytes. */
ALWAYS void s_load32(wfmt_t fmt, const s_row_t *rw, int c, __m256 w[4], __m256i *nan)
{
    switch (fmt) {
    case WF_F32: {
        const float *p = (const float *)rw->p + c;
        for (int k = 0; k < 4; k++) w[k] = _mm256_loadu_ps(p + 8 * k);
        break;
    }
    case WF_BF16: {
        const uint16_t *p = (const uint16_t *)rw->p + c;
        for (int k = 0; k < 4; k++) {
            __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p + 8 * k)));
            w[k] = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
        }
        break;
    }
    case WF_INT8: {
        const int8_t *p = (const int8_t *)rw->p + c;
        for (int k = 0; k < 4; k++)
            w[k] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p + 8 * k))));
        break;
    }
    case WF_FP8: {
        __m256i v = _mm256_loadu_si256((const __m256i *)((const uint8_t *)rw->p + c));
        *nan = _mm256_or_si256(*nan, _mm256_cmpeq_epi8(_mm256_and_si256(v, _mm256_set1_epi8(0x7f)),
                                                        _mm256_set1_epi8(0x7f)));
        const __m256i z = _mm256_setzero_si256(), m = _mm256_set1_epi16((short)0xBF80);
        __m256i lo = _mm256_and_si256(_mm256_srai_epi16(_mm256_unpacklo_epi8(z, v), 1), m); /* cols 0-7 | 16-23 */
        __m256i hi = _mm256_and_si256(_mm256_srai_epi16(_mm256_unpackhi_epi8(z, v), 1), m); /* cols 8-15 | 24-31 */
        w[0] = _mm256_cvtph_ps(_mm256_castsi256_si128(lo));
        w[1] = _mm256_cvtph_ps(_mm256_castsi256_si128(hi));
        w[2] = _mm256_cvtph_ps(_mm256_extracti128_si256(lo, 1));
        w[3] = _mm256_cvtph_ps(_mm256_extracti128_si256(hi, 1));
        break;
    }
    case WF_INT4: {
        __m128i b = _mm_loadu_si128((const __m128i *)((const uint8_t *)rw->p + c / 2));
        const __m128i m = _mm_set1_epi8(0x0f);
        const __m128i e = _mm_set1_epi8(8);
        __m128i lo = _mm_sub_epi8(_mm_and_si128(b, m), e);
        __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(b, 4), m), e);
        w[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
        w[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)));
        w[2] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
        w[3] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)));
        break;
    }
    default:
        STRATA_ASSERT(!"format");
    }
}

/* Scalar weight at column c, same units as s_load32 uses (tails of non-INT4 rows). */
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

/* Multiply-accumulate columns [c, c+32) of a row into T tokens. Non-INT4 formats spread
 * the 4 vectors over two accumulators per token (acc0, acc1); INT4 forms the block's dot
 * first, then adds it times the group scale d into acc0. */
ALWAYS void s_block(wfmt_t fmt, const s_row_t *rw, int c, const float *x, int64_t ldx, int T, __m256 *acc0,
                    __m256 *acc1, __m256 d, __m256i *nan)
{
    __m256 w[4];
    s_load32(fmt, rw, c, w, nan);
    for (int t = 0; t < T; t++) {
        const float *xt = x + t * ldx + c;
        if (fmt == WF_INT4) {
            __m256 s = _mm256_mul_ps(w[0], _mm256_loadu_ps(xt));
            s = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(xt + 8), s);
            s = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(xt + 16), s);
            s = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xt + 24), s);
            acc0[t] = _mm256_fmadd_ps(s, d, acc0[t]);
        } else {
            acc0[t] = _mm256_fmadd_ps(w[0], _mm256_loadu_ps(xt), acc0[t]);
            acc1[t] = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(xt + 8), acc1[t]);
            acc0[t] = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(xt + 16), acc0[t]);
            acc1[t] = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xt + 24), acc1[t]);
        }
    }
}

/* INT4: the scale of 32-column block b as a vector (gshift = log2(group / 32)). */
ALWAYS __m256 s_int4_scale(const s_row_t *rw, int b, int gshift)
{
    return _mm256_set1_ps(_cvtsh_ss(rw->sc[b >> gshift]));
}

/* INT4 and MXFP4 decode kernel. Converting nibbles with vpmovsxbd + vcvtdq2ps is bound by the
 * conversion port on Zen-class cores; a table lookup is cheaper: every value q - 8 in
 * [-8, 7] is a float whose low two bytes are zero (a bf16), so two pshufb lookups give its
 * bytes 3 and 2 and an unpack pairs them into 16-bit high halves. Those become floats
 * without more shuffles: a 32-bit shift left by 16 gives the even columns, a mask of the
 * high halves the odd ones, so the activations come permuted to match (each 8 columns as
 * [0 2 4 6 1 3 5 7], made once per call in s_fused). All in 128-bit registers: a 256-bit
 * op is two on those cores. Exact: the same values as (float)(q - 8). Every e2m1 value
 * (0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives) is a bf16 as well, so MXFP4 takes the same
 * path with its own tables; there "column" below means the kernel's order (low nibbles, then
 * high ones), which s_fused maps to the even and odd columns. */
ALWAYS void s_lut_block(wfmt_t fmt, const uint8_t *p, int c, const float *x, int64_t ldx, int T, __m128 *acc,
                        __m128 d)
{
    /* bytes 3 and 2 of the fp32 of each nibble: INT4 (q - 8), MXFP4 e2m1 (qmat.c's table) */
    const __m128i lut3 = fmt == WF_INT4
                             ? _mm_setr_epi8((char)0xC1, (char)0xC0, (char)0xC0, (char)0xC0, (char)0xC0, (char)0xC0,
                                             (char)0xC0, (char)0xBF, 0x00, 0x3F, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40)
                             : _mm_setr_epi8(0x00, 0x3F, 0x3F, 0x3F, 0x40, 0x40, 0x40, 0x40, (char)0x80, (char)0xBF,
                                             (char)0xBF, (char)0xBF, (char)0xC0, (char)0xC0, (char)0xC0, (char)0xC0);
    const __m128i lut2 = fmt == WF_INT4
                             ? _mm_setr_epi8(0x00, (char)0xE0, (char)0xC0, (char)0xA0, (char)0x80, 0x40, 0x00,
                                             (char)0x80, 0x00, (char)0x80, 0x00, 0x40, (char)0x80, (char)0xA0,
                                             (char)0xC0, (char)0xE0)
                             : _mm_setr_epi8(0x00, 0x00, (char)0x80, (char)0xC0, 0x00, 0x40, (char)0x80, (char)0xC0,
                                             0x00, 0x00, (char)0x80, (char)0xC0, 0x00, 0x40, (char)0x80, (char)0xC0);
    const __m128i m = _mm_set1_epi8(0x0f), hm = _mm_set1_epi32((int)0xFFFF0000);
    __m128i b = _mm_loadu_si128((const __m128i *)(p + c / 2));
    __m128i lo = _mm_and_si128(b, m), hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
    __m128i l3 = _mm_shuffle_epi8(lut3, lo), l2 = _mm_shuffle_epi8(lut2, lo);
    __m128i h3 = _mm_shuffle_epi8(lut3, hi), h2 = _mm_shuffle_epi8(lut2, hi);
    __m128i v[4] = {_mm_unpacklo_epi8(l2, l3), _mm_unpackhi_epi8(l2, l3), _mm_unpacklo_epi8(h2, h3),
                    _mm_unpackhi_epi8(h2, h3)}; /* 16-bit high halves of cols 0-7, 8-15, 16-23, 24-31 */
    __m128 w[8];
    for (int k = 0; k < 4; k++) { /* even columns, odd columns: x comes permuted to match */
        w[2 * k] = _mm_castsi128_ps(_mm_slli_epi32(v[k], 16));
        w[2 * k + 1] = _mm_castsi128_ps(_mm_and_si128(v[k], hm));
    }
    for (int t = 0; t < T; t++) {
        const float *xt = x + t * ldx + c;
        __m128 s0 = _mm_mul_ps(w[0], _mm_loadu_ps(xt));
        __m128 s1 = _mm_mul_ps(w[1], _mm_loadu_ps(xt + 4));
        for (int k = 2; k < 8; k += 2) {
            s0 = _mm_fmadd_ps(w[k], _mm_loadu_ps(xt + 4 * k), s0);
            s1 = _mm_fmadd_ps(w[k + 1], _mm_loadu_ps(xt + 4 * k + 4), s1);
        }
        acc[t] = _mm_fmadd_ps(_mm_add_ps(s0, s1), d, acc[t]);
    }
}

/* The fp32 scales of a row's INT4 groups or MXFP4 blocks into dsc[cols / group + 8]; returns
 * log2(group / 32), the shift from a block index to its scale's. */
ALWAYS int s_lut_scales(wfmt_t fmt, const s_row_t *rw, int cols, float *dsc)
{
    int g = 0;
    if (fmt == WF_MXFP4) { /* e8m0_to_f32, 8 at a time: e << 23, with 0x00400000 or-ed in for 0 and 0xFF */
        const int nb = cols / 32;
        const __m256i z = _mm256_setzero_si256(), ff = _mm256_set1_epi32(0xFF), half = _mm256_set1_epi32(0x00400000);
        for (; g + 8 <= nb; g += 8) {
            const __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(rw->e8 + g)));
            const __m256i sp = _mm256_or_si256(_mm256_cmpeq_epi32(e, z), _mm256_cmpeq_epi32(e, ff));
            _mm256_storeu_ps(dsc + g, _mm256_castsi256_ps(_mm256_or_si256(_mm256_slli_epi32(e, 23),
                                                                          _mm256_and_si256(sp, half))));
        }
        for (; g < nb; g++) dsc[g] = e8m0_to_f32(rw->e8[g]);
        return 0;
    }
    const int ng = cols / rw->group;
    for (; g + 8 <= ng; g += 8) _mm256_storeu_ps(dsc + g, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(rw->sc + g))));
    for (; g < ng; g++) dsc[g] = _cvtsh_ss(rw->sc[g]);
    return __builtin_ctz((unsigned)rw->group / 32);
}

ALWAYS void s_lut_row_dots(wfmt_t fmt, const s_row_t *rw, int cols, const float *x, int64_t ldx, int T, float *out)
{
    __m128 a0[4], a1[4];
    for (int t = 0; t < T; t++) a0[t] = a1[t] = _mm_setzero_ps();
    const uint8_t *p = rw->p;
    const int nb = cols / 32;
    /* the row's scales in fp32 up front: a broadcast from memory is a plain load, where a
     * per-block convert + broadcast would add to the shuffle port the lookups already load */
    float dsc[nb + 8];
    const int gshift = s_lut_scales(fmt, rw, cols, dsc);
    int b = 0;
    for (; b + 2 <= nb; b += 2) {
        s_lut_block(fmt, p, b * 32, x, ldx, T, a0, _mm_broadcast_ss(dsc + (b >> gshift)));
        s_lut_block(fmt, p, b * 32 + 32, x, ldx, T, a1, _mm_broadcast_ss(dsc + ((b + 1) >> gshift)));
    }
    if (b < nb) s_lut_block(fmt, p, b * 32, x, ldx, T, a0, _mm_broadcast_ss(dsc + (b >> gshift)));
    for (int t = 0; t < T; t++) {
        __m128 a = _mm_add_ps(a0[t], a1[t]);
        a = _mm_add_ps(a, _mm_movehl_ps(a, a));
        a = _mm_add_ss(a, _mm_movehdup_ps(a));
        out[t] = _mm_cvtss_f32(a);
    }
}

/* out[t] = dot(row, x[t]) for T (1..4) tokens, in the units of s_load32 (multiply by the
 * row scale afterwards for INT8/FP8). Blocks go in pairs so that every accumulator is a
 * named register (an accumulator array indexed at run time would live on the stack). */
ALWAYS void s_row_dots(wfmt_t fmt, const s_row_t *rw, int cols, const float *x, int64_t ldx, int T, float *out)
{
    __m256 a0[4], a1[4];
    for (int t = 0; t < T; t++) a0[t] = a1[t] = _mm256_setzero_ps();
    __m256i nan = _mm256_setzero_si256();
    const int nb = cols / 32;
    const int gshift = fmt == WF_INT4 ? __builtin_ctz((unsigned)rw->group / 32) : 0;
    const __m256 one = _mm256_set1_ps(1.0f);
    int b = 0;
    for (; b + 2 <= nb; b += 2) {
        if (fmt == WF_INT4) {
            s_block(fmt, rw, b * 32, x, ldx, T, a0, a1, s_int4_scale(rw, b, gshift), &nan);
            s_block(fmt, rw, b * 32 + 32, x, ldx, T, a1, a0, s_int4_scale(rw, b + 1, gshift), &nan);
        } else {
            s_block(fmt, rw, b * 32, x, ldx, T, a0, a1, one, &nan);
            s_block(fmt, rw, b * 32 + 32, x, ldx, T, a0, a1, one, &nan);
        }
    }
    if (b < nb) s_block(fmt, rw, b * 32, x, ldx, T, a0, a1, fmt == WF_INT4 ? s_int4_scale(rw, b, gshift) : one, &nan);
    for (int t = 0; t < T; t++) {
        float s = s_hsum(_mm256_add_ps(a0[t], a1[t]));
        if (fmt != WF_INT4)
            for (int c = nb * 32; c < cols; c++) s += s_load1(fmt, rw, c) * x[t * ldx + c];
        out[t] = s;
    }
    if (fmt == WF_FP8 && !_mm256_testz_si256(nan, nan))
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

/* out[T] for tokens [t0, t0 + T) of row rw (xp: the permuted activations of the token block
 * starting at tb, for INT4 and MXFP4). */
ALWAYS void s_slice(const mm_job_t *j, wfmt_t fmt, const s_row_t *rw, const float *xp, int tb, int t0, int T, float *out)
{
    const int cols = j->w->cols;
    if (fmt == WF_INT4 || fmt == WF_MXFP4) s_lut_row_dots(fmt, rw, cols, xp + (int64_t)(t0 - tb) * cols, cols, T, out);
    else s_row_dots(fmt, rw, cols, j->x + (int64_t)t0 * j->ldx, j->ldx, T, out);
}

/* Rows [r0, r1) for every token of the job. Tokens go in blocks whose activations stay within
 * ~256 KiB; in a block each row is read once and its dots run in slices of 4 tokens, so a
 * token's result is the same whatever the batch around it (a decode step of 8 sequences gives
 * each one exactly what it gets alone). */
ALWAYS void s_fused(const mm_job_t *j, wfmt_t fmt, int32_t r0, int32_t r1)
{
    const qmat_t *w = j->w;
    const size_t row_bytes = qmat_data_bytes(fmt, 1, w->cols);
    const int tbk = mm_token_block(w->cols);
    for (int tb = 0; tb < j->n; tb += tbk) {
        const int te = tb + tbk < j->n ? tb + tbk : j->n;
        float *xp = NULL;
        if (fmt == WF_INT4) { /* x with each 8 columns as [0 2 4 6 1 3 5 7], see s_lut_block */
            xp = cpu_row_buf((size_t)(te - tb) * w->cols);
            const __m256i perm = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
            for (int t = tb; t < te; t++)
                for (int c = 0; c < w->cols; c += 8)
                    _mm256_storeu_ps(xp + (int64_t)(t - tb) * w->cols + c,
                                     _mm256_permutevar8x32_ps(_mm256_loadu_ps(j->x + (int64_t)t * j->ldx + c), perm));
        } else if (fmt == WF_MXFP4) {
            /* s_lut_block's order for a block: low nibbles (columns 0, 2, .., 30), then high ones
             * (1, 3, .., 31), each 8 as [0 2 4 6 1 3 5 7]; so per 32 columns
             *   0 4 8 12 2 6 10 14 | 16 20 24 28 18 22 26 30 | 1 5 9 13 3 7 11 15 | 17 21 25 29 19 23 27 31:
             * shufps picks the even (odd) columns of two vectors, per 128-bit lane, and a permute
             * puts them in that order. */
            xp = cpu_row_buf((size_t)(te - tb) * w->cols);
            const __m256i perm = _mm256_setr_epi32(0, 4, 2, 6, 1, 5, 3, 7);
            for (int t = tb; t < te; t++)
                for (int c = 0; c < w->cols; c += 32) {
                    const float *xt = j->x + (int64_t)t * j->ldx + c;
                    float *o = xp + (int64_t)(t - tb) * w->cols + c;
                    const __m256 a0 = _mm256_loadu_ps(xt), a1 = _mm256_loadu_ps(xt + 8);
                    const __m256 a2 = _mm256_loadu_ps(xt + 16), a3 = _mm256_loadu_ps(xt + 24);
                    const __m256 v[4] = {_mm256_shuffle_ps(a0, a1, _MM_SHUFFLE(2, 0, 2, 0)),  /* even */
                                         _mm256_shuffle_ps(a2, a3, _MM_SHUFFLE(2, 0, 2, 0)),
                                         _mm256_shuffle_ps(a0, a1, _MM_SHUFFLE(3, 1, 3, 1)),  /* odd */
                                         _mm256_shuffle_ps(a2, a3, _MM_SHUFFLE(3, 1, 3, 1))};
                    for (int k = 0; k < 4; k++) _mm256_storeu_ps(o + 8 * k, _mm256_permutevar8x32_ps(v[k], perm));
                }
        }
        for (int32_t r = r0; r < r1; r++) {
            s_row_t rw = {0};
            float rs, out[4];
            s_row_view(w, r, &rw, &rs);
            if (r + PF_ROWS < r1) /* the whole row PF_ROWS ahead (see ops_q8_x86.h) */
                for (size_t o = 0; o < row_bytes; o += 64) _mm_prefetch((const char *)rw.p + PF_ROWS * row_bytes + o, _MM_HINT_T0);
            for (int t0 = tb; t0 < te; t0 += 4) {
                const int T = te - t0 < 4 ? te - t0 : 4;
                switch (T) {
                case 1: s_slice(j, fmt, &rw, xp, tb, t0, 1, out); break;
                case 2: s_slice(j, fmt, &rw, xp, tb, t0, 2, out); break;
                case 3: s_slice(j, fmt, &rw, xp, tb, t0, 3, out); break;
                default: s_slice(j, fmt, &rw, xp, tb, t0, 4, out); break;
                }
                for (int t = 0; t < T; t++) mm_store(j, t0 + t, r, out[t] * rs);
            }
        }
    }
}

ALWAYS float s_vdot(const float *a, const float *b, int n)
{
    __m256 s = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8) s = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s);
    return s_hsum(s);
}

ALWAYS void s_vaxpy(float a, const float *x, float *y, int n)
{
    const __m256 av = _mm256_set1_ps(a);
    for (int i = 0; i < n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
}

#define X86_VW 8
#define X86_MM_ROWS cpu_avx2_mm_rows
#define X86_ATTN cpu_avx2_attention
#include "kernels/cpu/ops_x86_tail.h"
