/* qmat.c - weight formats: sizes, names, scalar conversions, reference dequantization and
 * the quantizers. The layouts are documented in qmat.h; this file is their reference. */
#include "kernels/cpu/qmat.h"

#include <errno.h>
#include <math.h>
#include <string.h>

#include "common/strata.h"

static const char *const s_names[WF_COUNT] = {"f32", "bf16", "int8", "fp8", "int4", "mxfp4"};

size_t qmat_data_bytes(wfmt_t fmt, int64_t rows, int64_t cols)
{
    switch (fmt) {
    case WF_F32: return (size_t)(rows * cols) * 4;
    case WF_BF16: return (size_t)(rows * cols) * 2;
    case WF_INT8:
    case WF_FP8: return (size_t)(rows * cols);
    case WF_INT4:
    case WF_MXFP4: return (size_t)(rows * cols) / 2;
    default: return 0;
    }
}

size_t qmat_scale_bytes(wfmt_t fmt, int64_t rows, int64_t cols, int group)
{
    switch (fmt) {
    case WF_INT8:
    case WF_FP8: return (size_t)rows * 4;
    case WF_INT4: return group > 0 ? (size_t)(rows * (cols / group)) * 2 : 0;
    case WF_MXFP4: return (size_t)(rows * (cols / 32)); /* group is always 32 */
    default: return 0;
    }
}

const char *wfmt_name(wfmt_t fmt)
{
    return (unsigned)fmt < WF_COUNT ? s_names[fmt] : "?";
}

int wfmt_parse(const char *s)
{
    for (int i = 0; i < WF_COUNT; i++)
        if (s && strcmp(s, s_names[i]) == 0) return i;
    return -1;
}

static inline uint32_t s_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float s_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float bf16_to_f32(uint16_t h)
{
    return s_bits_f32((uint32_t)h << 16);
}

uint16_t f32_to_bf16(float f)
{
    uint32_t u = s_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep sign and top payload, force quiet */
        return (uint16_t)((u >> 16) | 0x0040u);
    /* Round to nearest even: add 0x7fff plus the lsb of the kept part; carries into the
     * exponent are correct (they round up to the next binade, or to inf). */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) return s_bits_f32(sign | 0x7f800000u | (m << 13)); /* inf / NaN */
    if (e == 0) {                                                     /* zero / subnormal */
        float v = (float)m * 0x1p-24f;                                /* exact: m < 2^10 */
        return sign ? -v : v;
    }
    return s_bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

uint16_t f32_to_f16(float f)
{
    uint32_t u = s_f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu)); /* NaN */
    if (a == 0x7f800000u) return (uint16_t)(sign | 0x7c00u);
    int e = (int)(a >> 23) - 127;
    if (e < -14) {
        /* Subnormal (or zero) in f16: steps of 2^-24. The scaling is exact and rintf rounds to
         * nearest even; 1024 becomes the smallest normal, whose encoding is contiguous. */
        float v = s_bits_f32(a) * 0x1p24f;
        return (uint16_t)(sign | (uint16_t)rintf(v));
    }
    if (e > 15) return (uint16_t)(sign | 0x7c00u);
    uint32_t m = a & 0x7fffffu, r = m >> 13, rem = m & 0x1fffu;
    uint32_t v = ((uint32_t)(e + 15) << 10) + r;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) v++; /* may carry into exponent / inf */
    if (v >= 0x7c00u) v = 0x7c00u;
    return (uint16_t)(sign | v);
}

float fp8e4m3_to_f32(uint8_t v)
{
    uint32_t sign = (uint32_t)(v & 0x80u) << 24;
    uint32_t e = (v >> 3) & 0xfu, m = v & 7u;
    if (e == 0xf && m == 7) return s_bits_f32(sign | 0x7fc00000u); /* the only NaN */
    if (e == 0) {
        float x = (float)m * 0x1p-9f; /* subnormal: m/8 * 2^-6 */
        return sign ? -x : x;
    }
    return s_bits_f32(sign | ((e + 120u) << 23) | (m << 20));
}

uint8_t f32_to_fp8e4m3(float f)
{
    uint32_t u = s_f32_bits(f);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint8_t)(sign | 0x7f); /* NaN */
    if (a >= 0x7f800000u) return (uint8_t)(sign | 0x7e); /* inf saturates to 448 */
    int e = (int)(a >> 23) - 127;
    if (e < -6) {
        /* Subnormal: steps of 2^-9; 8 steps is the smallest normal (contiguous encoding). */
        float v = s_bits_f32(a) * 0x1p9f;
        return (uint8_t)(sign | (uint8_t)rintf(v));
    }
    if (e > 8) return (uint8_t)(sign | 0x7e);
    uint32_t m = a & 0x7fffffu, r = m >> 20, rem = m & 0xfffffu;
    uint32_t v = ((uint32_t)(e + 7) << 3) + r;
    if (rem > 0x80000u || (rem == 0x80000u && (r & 1u))) v++;
    if (v > 0x7eu) v = 0x7eu; /* saturate: no inf in e4m3fn, 0x7f is NaN */
    return (uint8_t)(sign | v);
}

/* e2m1 by nibble: sign (bit 3), exponent (bits 2..1, bias 1), mantissa (bit 0); exponent 0
 * is subnormal (0, 0.5). The table of transformers' mxfp4 FP4_VALUES. */
static const float s_e2m1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                 -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

float e2m1_to_f32(uint8_t nibble)
{
    return s_e2m1[nibble & 15];
}

float e8m0_to_f32(uint8_t e)
{
    /* 2^(e - 127) is the fp32 with exponent field e (e >= 1), and the subnormal 0x00400000 for
     * e = 0; for e = 0xFF the same OR turns the infinity's bits into a quiet NaN. */
    return s_bits_f32(((uint32_t)e << 23) | (e == 0 || e == 0xFF ? 0x00400000u : 0));
}

void qmat_dequant_row(const qmat_t *w, int32_t r, float *out)
{
    STRATA_ASSERT(r >= 0 && r < w->rows);
    const int64_t cols = w->cols;
    switch (w->fmt) {
    case WF_F32:
        memcpy(out, (const float *)w->data + r * cols, (size_t)cols * 4);
        break;
    case WF_BF16: { /* vectorized; restrict spares the aliasing check (512 warm rows of 4096
                       at -O3: 0.25 ms, 0.27 without it) */
        const uint16_t *restrict p = (const uint16_t *)w->data + r * cols;
        float *restrict o = out;
        for (int64_t c = 0; c < cols; c++) o[c] = bf16_to_f32(p[c]);
        break;
    }
    case WF_INT8: {
        const int8_t *p = (const int8_t *)w->data + r * cols;
        float s = ((const float *)w->scales)[r];
        for (int64_t c = 0; c < cols; c++) out[c] = (float)p[c] * s;
        break;
    }
    case WF_FP8: {
        const uint8_t *p = (const uint8_t *)w->data + r * cols;
        float s = ((const float *)w->scales)[r];
        for (int64_t c = 0; c < cols; c++) out[c] = fp8e4m3_to_f32(p[c]) * s;
        break;
    }
    case WF_INT4: {
        STRATA_ASSERT(w->group >= 32 && w->group % 32 == 0 && cols % w->group == 0);
        const uint8_t *p = (const uint8_t *)w->data + r * (cols / 2);
        const uint16_t *sc = (const uint16_t *)w->scales + r * (cols / w->group);
        for (int64_t c0 = 0; c0 < cols; c0 += 32) {
            float d = f16_to_f32(sc[c0 / w->group]);
            const uint8_t *b = p + c0 / 2;
            for (int j = 0; j < 16; j++) {
                out[c0 + j] = (float)((int)(b[j] & 0xf) - 8) * d;
                out[c0 + 16 + j] = (float)((int)(b[j] >> 4) - 8) * d;
            }
        }
        break;
    }
    case WF_MXFP4: {
        /* e2m1 * 2^(scale - 127): exact in fp32 (every e2m1 value is k/2, k <= 12, and the
         * smallest scale 2^-127 leaves k * 2^-128 within fp32's subnormals), so this is
         * transformers' lut[nibble] then ldexp, bit for bit, for every scale byte but 0xFF
         * (NaN here, as the spec has it; the loaders refuse it). */
        STRATA_ASSERT(cols % 32 == 0);
        const uint8_t *p = (const uint8_t *)w->data + r * (cols / 2);
        const uint8_t *sc = (const uint8_t *)w->scales + r * (cols / 32);
        for (int64_t c0 = 0; c0 < cols; c0 += 32) {
            const float d = e8m0_to_f32(sc[c0 / 32]);
            const uint8_t *b = p + c0 / 2;
            for (int j = 0; j < 16; j++) {
                out[c0 + 2 * j] = s_e2m1[b[j] & 15] * d;
                out[c0 + 2 * j + 1] = s_e2m1[b[j] >> 4] * d;
            }
        }
        break;
    }
    default:
        STRATA_ASSERT(!"unknown weight format");
    }
}

static inline uint8_t s_int4_q(float x, float d)
{
    int v = d != 0 ? (int)rintf(x / d) + 8 : 8;
    return (uint8_t)(v < 0 ? 0 : v > 15 ? 15 : v);
}

/* Squared error of nibbles q[n] with scale d, as qmat_dequant_row reconstructs them. */
static double s_int4_err(const float *x, const uint8_t *q, float d, int n)
{
    double e = 0;
    for (int i = 0; i < n; i++) {
        double t = (double)x[i] - (float)((int)q[i] - 8) * d;
        e += t * t;
    }
    return e;
}

#define INT4_MAX_GROUP 1024

/* Quantize one INT4 group x[n] into nibbles q[n] (0..15); returns the fp16 scale bits.
 * Start from the Q4_0 choice (the signed value of largest magnitude maps to -8: d = max /
 * -8, q = clamp(round(x / d) + 8, 0, 15)); then try 9 more grids that map the max to
 * -(8 + k/4), k = -4..4, each with the least-squares scale for its nibbles (rounded to
 * fp16), and keep whichever pair reconstructs the group with the least squared error. So
 * the result is never worse than Q4_0 on a group, and on Gaussian weights its matmul error
 * is ~6% lower (test_qmat prints both). */
static uint16_t s_int4_group(const float *x, int n, uint8_t *qbest)
{
    STRATA_ASSERT(n > 0 && n <= INT4_MAX_GROUP);
    float amax = 0, vmax = 0;
    for (int i = 0; i < n; i++) {
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            vmax = x[i];
        }
    }
    if (amax == 0) {
        memset(qbest, 8, (size_t)n);
        return 0;
    }
    uint16_t best_h = f32_to_f16(vmax / -8.0f);
    float d = f16_to_f32(best_h);
    for (int i = 0; i < n; i++) qbest[i] = s_int4_q(x[i], d);
    double best = s_int4_err(x, qbest, d, n);
    uint8_t q[INT4_MAX_GROUP];
    for (int k = -4; k <= 4 && best > 0; k++) {
        const float iscale = -(8.0f + 0.25f * k) / vmax;
        double sxq = 0, sqq = 0;
        for (int i = 0; i < n; i++) {
            int v = (int)rintf(x[i] * iscale);
            v = v < -8 ? -8 : v > 7 ? 7 : v;
            q[i] = (uint8_t)(v + 8);
            sxq += (double)x[i] * v;
            sqq += (double)v * v;
        }
        if (sqq == 0) continue;
        uint16_t h = f32_to_f16((float)(sxq / sqq));
        if ((h & 0x7c00) == 0x7c00) continue; /* the scale overflows fp16 */
        double e = s_int4_err(x, q, f16_to_f32(h), n);
        if (e < best) {
            best = e;
            best_h = h;
            memcpy(qbest, q, (size_t)n);
        }
    }
    return best_h;
}

/* The nearest e2m1 nibble to v (already divided by the block scale), ties to the even code
 * (the one whose mantissa bit is 0), saturating at +-6; the sign is v's, so -0 and small
 * negative values give -0 (code 8). The midpoints between the magnitudes 0 .5 1 1.5 2 3 4 6
 * are .25 .75 1.25 1.75 2.5 3.5 5: a tie goes up from an odd code, down from an even one. */
static uint8_t s_e2m1_q(float v)
{
    const float a = fabsf(v);
    const uint8_t m = a <= 0.25f  ? 0
                      : a < 0.75f ? 1
                      : a <= 1.25f ? 2
                      : a < 1.75f ? 3
                      : a <= 2.5f ? 4
                      : a < 3.5f  ? 5
                      : a <= 5.0f ? 6
                                  : 7;
    return (uint8_t)(m | (signbit(v) ? 8 : 0));
}

/* One 32-column MXFP4 block by the OCP MX spec (v1.0, 6.3): the shared exponent
 * floor(log2(amax)) - 2 (2 is e2m1's largest exponent, so amax / 2^e lands in [4, 8)),
 * clamped below at -127, the smallest e8m0 scale (it cannot pass +127 for finite fp32:
 * floor(log2(FLT_MAX)) - 2 = 125); each element is x / 2^e rounded to the nearest e2m1, ties to
 * even, saturating at +-6. An all-zero block takes scale byte 0 (2^-127), as the reference
 * implementation of the spec (microsoft/microxcaling) gives it by taking log2 of FLT_MIN for a
 * zero amax. Returns the scale byte; q[j] gets the byte of columns 2j (low nibble), 2j + 1. */
static uint8_t s_mxfp4_block(const float *x, uint8_t *q)
{
    float amax = 0;
    for (int k = 0; k < 32; k++) amax = fmaxf(amax, fabsf(x[k]));
    int e = -127;
    if (amax > 0) {
        int ex;
        frexpf(amax, &ex); /* amax = f * 2^ex, f in [0.5, 1): floor(log2(amax)) = ex - 1, exact */
        e = ex - 1 - 2;
        if (e < -127) e = -127;
    }
    for (int j = 0; j < 16; j++) /* ldexpf: exact (a power of two, and x / 2^e < 8 cannot overflow) */
        q[j] = (uint8_t)(s_e2m1_q(ldexpf(x[2 * j], -e)) | (s_e2m1_q(ldexpf(x[2 * j + 1], -e)) << 4));
    return (uint8_t)(e + 127);
}

int qmat_quantize(wfmt_t fmt, int group, const float *src, int32_t rows, int32_t cols, void *data,
                  void *scales)
{
    if (rows < 0 || cols <= 0) return -EINVAL;
    if (fmt == WF_MXFP4 && ((group != 0 && group != 32) || cols % 32 != 0)) return -EINVAL;
    if (fmt == WF_INT4 && (group < 32 || group > INT4_MAX_GROUP || group % 32 != 0 || cols % group != 0))
        return -EINVAL;
    for (int64_t r = 0; r < rows; r++) {
        const float *x = src + r * cols;
        float amax = 0;
        for (int32_t c = 0; c < cols; c++) {
            if (!isfinite(x[c])) return -EINVAL;
            if (fabsf(x[c]) > amax) amax = fabsf(x[c]);
        }
        switch (fmt) {
        case WF_F32:
            memcpy((float *)data + r * cols, x, (size_t)cols * 4);
            break;
        case WF_BF16: {
            uint16_t *o = (uint16_t *)data + r * cols;
            for (int32_t c = 0; c < cols; c++) o[c] = f32_to_bf16(x[c]);
            break;
        }
        case WF_INT8: {
            int8_t *o = (int8_t *)data + r * cols;
            float s = amax / 127.0f;
            ((float *)scales)[r] = s;
            for (int32_t c = 0; c < cols; c++) {
                int v = s != 0 ? (int)rintf(x[c] / s) : 0;
                o[c] = (int8_t)(v < -127 ? -127 : v > 127 ? 127 : v);
            }
            break;
        }
        case WF_FP8: {
            uint8_t *o = (uint8_t *)data + r * cols;
            float s = amax / 448.0f;
            ((float *)scales)[r] = s;
            for (int32_t c = 0; c < cols; c++) o[c] = s != 0 ? f32_to_fp8e4m3(x[c] / s) : 0;
            break;
        }
        case WF_INT4: {
            if (amax / 8.0f > 65504.0f) return -EINVAL; /* scale would overflow fp16 */
            uint8_t *o = (uint8_t *)data + r * (cols / 2);
            uint16_t *sc = (uint16_t *)scales + r * (cols / group);
            uint8_t q[INT4_MAX_GROUP];
            for (int32_t g = 0; g < cols / group; g++) {
                sc[g] = s_int4_group(x + g * group, group, q);
                for (int b = 0; b < group; b += 32) {
                    uint8_t *ob = o + (g * group + b) / 2;
                    for (int j = 0; j < 16; j++) ob[j] = (uint8_t)(q[b + j] | (q[b + 16 + j] << 4));
                }
            }
            break;
        }
        case WF_MXFP4: {
            uint8_t *o = (uint8_t *)data + r * (cols / 2), *sc = (uint8_t *)scales + r * (cols / 32);
            for (int32_t b = 0; b < cols / 32; b++) sc[b] = s_mxfp4_block(x + b * 32, o + b * 16);
            break;
        }
        default:
            return -EINVAL;
        }
    }
    return 0;
}
