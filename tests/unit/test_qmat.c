/* test_qmat.c - weight formats: sizes and names, scalar conversions (exhaustive where the
 * domain is small, against independent oracles otherwise), the INT4 and MXFP4 byte layouts
 * against hand-written expectations, MXFP4 dequantization against a transformers-style table
 * reference and its quantizer against a nearest-value search, quantize/dequantize round trips
 * with per-element error bounds, and the matmul error of each format on Gaussian weights
 * (printed). */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "kernels/cpu/qmat.h"
#include "tests/unit/check.h"

static uint32_t f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static float t_gauss(uint64_t *s)
{
    double u1 = (t_rng_next(s) >> 11) * 0x1p-53, u2 = (t_rng_next(s) >> 11) * 0x1p-53;
    if (u1 < 1e-300) u1 = 1e-300;
    return (float)(sqrt(-2 * log(u1)) * cos(2 * M_PI * u2));
}

/* A random float with a random exponent in [emin, emax] and random sign and mantissa. */
static float t_rand_wide(uint64_t *s, int emin, int emax)
{
    uint64_t r = t_rng_next(s);
    int e = emin + (int)(r % (uint64_t)(emax - emin + 1));
    uint32_t m = (uint32_t)(r >> 20) & 0x7fffffu;
    uint32_t sign = (uint32_t)(r >> 63) << 31;
    return u2f(sign | ((uint32_t)(e + 127) << 23) | m);
}

static void test_names_sizes(void)
{
    T_CHECK(qmat_data_bytes(WF_F32, 3, 5) == 60, "f32");
    T_CHECK(qmat_data_bytes(WF_BF16, 3, 5) == 30, "bf16");
    T_CHECK(qmat_data_bytes(WF_INT8, 3, 5) == 15, "int8");
    T_CHECK(qmat_data_bytes(WF_FP8, 3, 5) == 15, "fp8");
    T_CHECK(qmat_data_bytes(WF_INT4, 3, 64) == 96, "int4");
    T_CHECK(qmat_scale_bytes(WF_F32, 3, 64, 0) == 0 && qmat_scale_bytes(WF_BF16, 3, 64, 0) == 0, "no scales");
    T_CHECK(qmat_scale_bytes(WF_INT8, 3, 64, 0) == 12 && qmat_scale_bytes(WF_FP8, 3, 64, 0) == 12, "row scales");
    T_CHECK(qmat_scale_bytes(WF_INT4, 3, 256, 32) == 3 * 8 * 2, "int4 g32 scales");
    T_CHECK(qmat_scale_bytes(WF_INT4, 3, 256, 128) == 3 * 2 * 2, "int4 g128 scales");
    /* 4.5 bits per weight at group 32, like Q4_0 */
    T_CHECK((qmat_data_bytes(WF_INT4, 1, 4096) + qmat_scale_bytes(WF_INT4, 1, 4096, 32)) * 8 == 4096 * 9 / 2, "4.5 bpw");
    for (int f = 0; f < WF_COUNT; f++) T_CHECK(wfmt_parse(wfmt_name((wfmt_t)f)) == f, "name round trip %d", f);
    T_CHECK(wfmt_parse("q4") == -1 && wfmt_parse("") == -1 && wfmt_parse(NULL) == -1, "unknown names");
    T_CHECK(strcmp(wfmt_name(WF_INT4), "int4") == 0 && strcmp(wfmt_name(WF_FP8), "fp8") == 0, "names");
    T_CHECK(strcmp(wfmt_name(WF_MXFP4), "mxfp4") == 0 && wfmt_parse("mxfp4") == WF_MXFP4, "mxfp4 name");
    T_CHECK(qmat_data_bytes(WF_MXFP4, 3, 64) == 96, "mxfp4 data");
    T_CHECK(qmat_scale_bytes(WF_MXFP4, 3, 64, 32) == 6 && qmat_scale_bytes(WF_MXFP4, 3, 64, 0) == 6, "mxfp4 scales");
    /* 4.25 bits per weight: a byte of scale per 32 nibbles */
    T_CHECK((qmat_data_bytes(WF_MXFP4, 1, 4096) + qmat_scale_bytes(WF_MXFP4, 1, 4096, 32)) * 8 == 4096 * 17 / 4,
            "4.25 bpw");
}

static void test_bf16(uint64_t *seed)
{
    /* every bf16 value survives bf16 -> f32 -> bf16; NaNs stay NaN */
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = bf16_to_f32((uint16_t)h);
        T_CHECK(f2u(f) == h << 16, "bf16_to_f32 is a shift (%04x)", h);
        uint16_t back = f32_to_bf16(f);
        if (isnan(f)) bad += !isnan(bf16_to_f32(back)) || (back & 0x8000) != (h & 0x8000);
        else bad += back != h;
    }
    T_CHECK(bad == 0, "%d bf16 round trips failed", bad);
    /* known values and ties */
    T_CHECK(f32_to_bf16(1.0f) == 0x3f80, "1.0");
    T_CHECK(f32_to_bf16(u2f(0x3f808000)) == 0x3f80, "tie to even (down)");
    T_CHECK(f32_to_bf16(u2f(0x3f818000)) == 0x3f82, "tie to even (up)");
    T_CHECK(f32_to_bf16(u2f(0x3f808001)) == 0x3f81, "above half");
    T_CHECK(f32_to_bf16(u2f(0x3f807fff)) == 0x3f80, "below half");
    T_CHECK(f32_to_bf16(u2f(0x7f7fffff)) == 0x7f80, "max float rounds to inf");
    T_CHECK(f32_to_bf16(INFINITY) == 0x7f80 && f32_to_bf16(-INFINITY) == 0xff80, "inf");
    T_CHECK(f32_to_bf16(u2f(0x00010000)) == 0x0001, "subnormal");
    T_CHECK(f32_to_bf16(u2f(0x00008000)) == 0x0000, "subnormal tie to zero");
    T_CHECK(f32_to_bf16(u2f(0x00018000)) == 0x0002, "subnormal tie to even");
    T_CHECK(f32_to_bf16(-0.0f) == 0x8000, "-0");
    T_CHECK(isnan(bf16_to_f32(f32_to_bf16(u2f(0x7f800001)))), "signalling NaN stays NaN, not inf");
    T_CHECK(isnan(bf16_to_f32(f32_to_bf16(u2f(0xffc00000)))) && (f32_to_bf16(u2f(0xffc00000)) & 0x8000), "-NaN");
    /* oracle: nearest of the two neighbours, ties to the even one */
    bad = 0;
    for (int i = 0; i < 200000; i++) {
        float f = (i & 7) ? t_rand_wide(seed, -126, 127) : u2f((uint32_t)t_rng_next(seed) & 0x807fffffu);
        uint32_t u = f2u(f), lo = u & 0xffff0000u, hi = lo + 0x10000u;
        double dlo = fabs((double)f - u2f(lo)), dhi = fabs((double)u2f(hi) - f);
        if (isinf(u2f(hi))) dhi = fabs(ldexp(1.0, 128) - fabs((double)f)); /* overflow threshold */
        uint16_t want = (uint16_t)((dlo < dhi || (dlo == dhi && !((lo >> 16) & 1))) ? lo >> 16 : hi >> 16);
        bad += f32_to_bf16(f) != want;
    }
    T_CHECK(bad == 0, "%d bf16 roundings differ from the nearest-even oracle", bad);
}

static void test_f16(uint64_t *seed)
{
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = f16_to_f32((uint16_t)h);
        uint16_t back = f32_to_f16(f);
        if (isnan(f)) bad += !isnan(f16_to_f32(back)) || (back & 0x8000) != (h & 0x8000);
        else bad += back != h;
    }
    T_CHECK(bad == 0, "%d f16 round trips failed", bad);
    T_CHECK(f16_to_f32(0x3c00) == 1.0f && f16_to_f32(0x7bff) == 65504.0f && f16_to_f32(0x0001) == 0x1p-24f, "f16 values");
    T_CHECK(f16_to_f32(0x0400) == 0x1p-14f && f16_to_f32(0xc000) == -2.0f && isinf(f16_to_f32(0x7c00)), "f16 values 2");
    T_CHECK(f32_to_f16(65504.0f) == 0x7bff && f32_to_f16(65519.0f) == 0x7bff, "f16 max");
    T_CHECK(f32_to_f16(65520.0f) == 0x7c00 && f32_to_f16(1e10f) == 0x7c00 && f32_to_f16(-1e10f) == 0xfc00, "f16 overflow to inf");
    T_CHECK(f32_to_f16(0x1p-25f) == 0x0000, "f16 half of min subnormal ties to 0");
    T_CHECK(f32_to_f16(0x1.8p-24f) == 0x0002, "f16 subnormal tie to even");
    T_CHECK(f32_to_f16(0x1.000002p-25f) == 0x0001, "f16 just above half");
    T_CHECK(f32_to_f16(u2f(0x3f801000)) == 0x3c00 && f32_to_f16(u2f(0x3f803000)) == 0x3c02, "f16 ties to even");
    T_CHECK(isnan(f16_to_f32(f32_to_f16(NAN))), "f16 NaN");
#if defined(__FLT16_MAX__)
    /* oracle: the compiler's own _Float16 conversion (round to nearest even) */
    bad = 0;
    for (int i = 0; i < 200000; i++) {
        float f = t_rand_wide(seed, -27, 17);
        _Float16 h = (_Float16)f;
        uint16_t hb;
        memcpy(&hb, &h, 2);
        bad += f32_to_f16(f) != hb;
    }
    T_CHECK(bad == 0, "%d f16 roundings differ from _Float16", bad);
    fprintf(stderr, "f16: checked against _Float16\n");
#else
    (void)seed;
    fprintf(stderr, "f16: no _Float16 in this compiler; exhaustive round trip and known values only\n");
#endif
}

/* fp8 e4m3fn decoded from the definition, independently of qmat.c */
static double t_fp8_value(int v)
{
    int s = v >> 7, e = (v >> 3) & 15, m = v & 7;
    double x = e == 0 ? ldexp(m / 8.0, -6) : ldexp(1 + m / 8.0, e - 7);
    return s ? -x : x;
}

static void test_fp8(uint64_t *seed)
{
    int bad = 0;
    for (int v = 0; v < 256; v++) {
        float f = fp8e4m3_to_f32((uint8_t)v);
        if ((v & 0x7f) == 0x7f) {
            T_CHECK(isnan(f), "0x%02x is NaN", v);
            T_CHECK(f32_to_fp8e4m3(f) == (v & 0x80 ? 0xff : 0x7f), "NaN 0x%02x keeps its sign", v);
            continue;
        }
        bad += (double)f != t_fp8_value(v);
        bad += f32_to_fp8e4m3(f) != v;
    }
    T_CHECK(bad == 0, "%d fp8 values or round trips wrong", bad);
    T_CHECK(fp8e4m3_to_f32(0x7e) == 448.0f && fp8e4m3_to_f32(0xfe) == -448.0f, "max");
    T_CHECK(fp8e4m3_to_f32(0x08) == 0x1p-6f && fp8e4m3_to_f32(0x01) == 0x1p-9f && fp8e4m3_to_f32(0x07) == 7 * 0x1p-9f, "subnormals");
    T_CHECK(fp8e4m3_to_f32(0x38) == 1.0f && fp8e4m3_to_f32(0x80) == 0.0f && signbit(fp8e4m3_to_f32(0x80)), "1, -0");
    T_CHECK(f32_to_fp8e4m3(1.5f * 0x1p-9f) == 0x02, "subnormal tie to even (up)");
    T_CHECK(f32_to_fp8e4m3(2.5f * 0x1p-9f) == 0x02, "subnormal tie to even (down)");
    T_CHECK(f32_to_fp8e4m3(0.5f * 0x1p-9f) == 0x00 && f32_to_fp8e4m3(-0.5f * 0x1p-9f) == 0x80, "half min subnormal -> 0");
    T_CHECK(f32_to_fp8e4m3(0.51f * 0x1p-9f) == 0x01, "above half of min subnormal");
    T_CHECK(f32_to_fp8e4m3(7.5f * 0x1p-9f) == 0x08, "subnormal rounds up to min normal");
    T_CHECK(f32_to_fp8e4m3(1.0625f) == 0x38 && f32_to_fp8e4m3(1.1875f) == 0x3a, "normal ties to even");
    T_CHECK(f32_to_fp8e4m3(432.0f) == 0x7e, "tie between 416 and 448 goes to even (448)");
    T_CHECK(f32_to_fp8e4m3(431.0f) == 0x7d, "416");
    T_CHECK(f32_to_fp8e4m3(464.0f) == 0x7e && f32_to_fp8e4m3(1e9f) == 0x7e && f32_to_fp8e4m3(-1e9f) == 0xfe, "saturate");
    T_CHECK(f32_to_fp8e4m3(INFINITY) == 0x7e && f32_to_fp8e4m3(-INFINITY) == 0xfe, "inf saturates");
    T_CHECK(f32_to_fp8e4m3(NAN) == 0x7f && f32_to_fp8e4m3(-NAN) == 0xff, "NaN");
    T_CHECK(f32_to_fp8e4m3(1e-30f) == 0x00 && f32_to_fp8e4m3(-1e-30f) == 0x80, "underflow keeps sign");
    /* oracle: the nearest finite fp8 value by search, ties to the even code, saturating */
    bad = 0;
    for (int i = 0; i < 100000; i++) {
        float f = t_rand_wide(seed, -12, 9);
        double a = fabs((double)f);
        int best = 0;
        for (int v = 1; v <= 0x7e; v++) {
            double d = fabs(t_fp8_value(v) - a), db = fabs(t_fp8_value(best) - a);
            if (d < db || (d == db && !(v & 1))) best = v;
        }
        if (a > 448) best = 0x7e;
        if (f < 0) best |= 0x80;
        bad += f32_to_fp8e4m3(f) != best;
    }
    T_CHECK(bad == 0, "%d fp8 roundings differ from the search oracle", bad);
}

static void test_int4_layout(void)
{
    /* group 32, 64 columns. Group 0: x = -8..7 in the low half, 7..-8 in the high half; the
     * value of largest magnitude is -8, so d = 1 and q = x + 8. Group 1: all zero. */
    float x[64];
    for (int c = 0; c < 16; c++) {
        x[c] = (float)(c - 8);
        x[16 + c] = (float)(7 - c);
    }
    for (int c = 32; c < 64; c++) x[c] = 0;
    uint8_t data[32];
    uint16_t sc[2];
    memset(data, 0xaa, sizeof(data));
    T_CHECK(qmat_quantize(WF_INT4, 32, x, 1, 64, data, sc) == 0, "quantize");
    static const uint8_t want[32] = {
        0xF0, 0xE1, 0xD2, 0xC3, 0xB4, 0xA5, 0x96, 0x87, 0x78, 0x69, 0x5A, 0x4B, 0x3C, 0x2D, 0x1E, 0x0F,
        0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88,
    };
    T_CHECK(memcmp(data, want, 32) == 0, "int4 bytes: got %02x %02x %02x .. %02x", data[0], data[1], data[2], data[31]);
    T_CHECK(sc[0] == 0x3c00 && sc[1] == 0x0000, "int4 scales %04x %04x", sc[0], sc[1]);
    /* group 64: one scale for both runs of 32; max +4 maps to -8, so d = -0.5 (0xb800) */
    float x2[64];
    for (int c = 0; c < 64; c++) x2[c] = 0;
    x2[0] = 4.0f;   /* q = 4 / -0.5 + 8 = 0  -> byte 0 low nibble */
    x2[17] = -3.5f; /* q = 7 + 8 = 15        -> byte 1 high nibble */
    x2[33] = 0.5f;  /* q = -1 + 8 = 7        -> byte 17 low nibble */
    x2[63] = -1.0f; /* q = 2 + 8 = 10        -> byte 31 high nibble */
    memset(data, 0, sizeof(data));
    T_CHECK(qmat_quantize(WF_INT4, 64, x2, 1, 64, data, sc) == 0, "quantize g64");
    uint8_t want2[32];
    memset(want2, 0x88, 32);
    want2[0] = 0x80;
    want2[1] = 0xF8;
    want2[17] = 0x87;
    want2[31] = 0xA8;
    T_CHECK(memcmp(data, want2, 32) == 0, "int4 g64 bytes: got %02x %02x .. %02x .. %02x", data[0], data[1], data[17], data[31]);
    T_CHECK(sc[0] == 0xb800, "int4 g64 scale %04x", sc[0]);
    /* and dequantization reads the same layout back */
    qmat_t w = {.fmt = WF_INT4, .rows = 1, .cols = 64, .group = 64, .data = want2, .scales = sc};
    float out[64];
    qmat_dequant_row(&w, 0, out);
    T_CHECK(out[0] == 4.0f && out[17] == -3.5f && out[33] == 0.5f && out[63] == -1.0f && out[5] == 0.0f,
            "int4 dequant %g %g %g %g", out[0], out[17], out[33], out[63]);
}

/* ---- MXFP4 ---- */

/* e2m1 from the definition: sign bit 3, exponent bits 2..1 (bias 1), mantissa bit 0;
 * exponent 0 is subnormal (m * 0.5). */
static double t_e2m1_value(int v)
{
    int s = (v >> 3) & 1, e = (v >> 1) & 3, m = v & 1;
    double x = e == 0 ? m * 0.5 : ldexp(1 + m / 2.0, e - 1);
    return s ? -x : x;
}

/* transformers.integrations.mxfp4's FP4_VALUES and _convert_moe_packed_tensors: lut[nibble]
 * then ldexp(., scale - 127), low nibble the even column. Written out here on its own. */
static const float t_fp4_values[16] = {+0.0f, +0.5f, +1.0f, +1.5f, +2.0f, +3.0f, +4.0f, +6.0f,
                                       -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

static void t_mxfp4_ref_row(const uint8_t *blocks, const uint8_t *scales, int cols, float *out)
{
    for (int c = 0; c < cols; c++) {
        const uint8_t b = blocks[c / 2];
        out[c] = ldexpf(t_fp4_values[c & 1 ? b >> 4 : b & 15], (int)scales[c / 32] - 127);
    }
}

static void test_mxfp4_tables(void)
{
    int bad = 0;
    for (int v = 0; v < 16; v++) {
        const float f = e2m1_to_f32((uint8_t)v);
        bad += (double)f != t_e2m1_value(v) || f2u(f) != f2u(t_fp4_values[v]) || !!signbit(f) != (v >= 8);
        bad += f2u(e2m1_to_f32((uint8_t)(v | 0xF0))) != f2u(f); /* only the low 4 bits count */
    }
    T_CHECK(bad == 0, "%d e2m1 values wrong", bad);
    T_CHECK(e2m1_to_f32(7) == 6.0f && e2m1_to_f32(15) == -6.0f && e2m1_to_f32(1) == 0.5f && e2m1_to_f32(5) == 3.0f,
            "e2m1 known values");
    bad = 0;
    for (int e = 0; e < 255; e++) {
        const float f = e8m0_to_f32((uint8_t)e);
        bad += (double)f != ldexp(1.0, e - 127);
        bad += f2u(f) != (e ? (uint32_t)e << 23 : 0x00400000u); /* 2^-127 is a subnormal */
    }
    T_CHECK(bad == 0, "%d e8m0 values wrong", bad);
    T_CHECK(isnan(e8m0_to_f32(0xFF)), "e8m0 0xFF is NaN");
    T_CHECK(e8m0_to_f32(127) == 1.0f && e8m0_to_f32(128) == 2.0f && e8m0_to_f32(126) == 0.5f &&
                e8m0_to_f32(254) == 0x1p127f && e8m0_to_f32(1) == 0x1p-126f,
            "e8m0 known values");
}

/* Dequantization against the table reference, bit for bit, for every scale byte (each row
 * of the 255-row matrix has its own bytes, and a sweep puts each byte on a block), random
 * nibbles; then 0xFF gives NaN, and the smallest scales give exact subnormals. */
static void test_mxfp4_dequant(uint64_t *seed)
{
    enum { R = 255, C = 96 };
    uint8_t *blk = malloc(R * C / 2), sc[R * C / 32];
    for (int i = 0; i < R * C / 2; i++) blk[i] = (uint8_t)t_rng_next(seed);
    for (int i = 0; i < R * C / 32; i++) sc[i] = (uint8_t)(i % 3 == 0 ? (uint64_t)i / 3 : t_rng_next(seed) % 255);
    qmat_t w = {.fmt = WF_MXFP4, .rows = R, .cols = C, .group = 32, .data = blk, .scales = sc};
    float got[C], want[C];
    int bad = 0;
    for (int r = 0; r < R; r++) {
        for (int c = 0; c < C; c++) got[c] = NAN;
        qmat_dequant_row(&w, r, got);
        t_mxfp4_ref_row(blk + r * C / 2, sc + r * C / 32, C, want);
        if (memcmp(got, want, sizeof(got)) != 0) {
            if (bad < 3) fprintf(stderr, "  mxfp4 dequant row %d differs from the table reference\n", r);
            bad++;
        }
    }
    T_CHECK(bad == 0, "%d mxfp4 rows differ from the table reference", bad);
    /* known bytes: column 0 is byte 0's low nibble, column 1 its high one, column 33 byte 16's high */
    uint8_t b2[32] = {0x71, [16] = 0xA0}, s2[2] = {127, 0};
    qmat_t w2 = {.fmt = WF_MXFP4, .rows = 1, .cols = 64, .group = 32, .data = b2, .scales = s2};
    float o[64];
    qmat_dequant_row(&w2, 0, o);
    T_CHECK(o[0] == 0.5f && o[1] == 6.0f && o[2] == 0.0f && o[32] == 0.0f && f2u(o[33]) == f2u(-0x1p-127f),
            "mxfp4 known bytes: %g %g %a", o[0], o[1], o[33]);
    /* scale byte 0: subnormal results, not flushed: 0.5 * 2^-127 = 2^-128 (bits 0x00200000) */
    b2[0] = 0x71, b2[16] = 0x21, s2[1] = 0;
    qmat_dequant_row(&w2, 0, o);
    T_CHECK(f2u(o[32]) == 0x00200000u && o[33] == 0x1p-127f, "mxfp4 subnormal results: %a %a", o[32], o[33]);
    s2[0] = 0xFF;
    qmat_dequant_row(&w2, 0, o);
    T_CHECK(isnan(o[0]) && isnan(o[1]) && isnan(o[2]) && !isnan(o[32]), "mxfp4 scale 0xFF gives NaN for its block only");
    free(blk);
}

/* The nearest e2m1 code to x / 2^e by search (ties to the even code, saturating at 6), e the
 * spec's shared exponent found here with double log2. */
static int t_mxfp4_block_exp(const float *x)
{
    double amax = 0;
    for (int k = 0; k < 32; k++) amax = fmax(amax, fabs((double)x[k]));
    int e = amax > 0 ? (int)floor(log2(amax)) - 2 : -127;
    return e < -127 ? -127 : e;
}

static int t_e2m1_nearest(double v)
{
    const double a = fabs(v);
    int best = 0;
    for (int c = 1; c < 8; c++) {
        const double d = fabs(t_e2m1_value(c) - a), db = fabs(t_e2m1_value(best) - a);
        if (d < db || (d == db && !(c & 1))) best = c;
    }
    return best | (signbit(v) ? 8 : 0);
}

static void test_mxfp4_quantize(uint64_t *seed)
{
    /* layout: block 0 holds e2m1 code (c & 15) times 4 at column c, a 6 among them, so the
     * scale is 2^2 (byte 129) and the bytes are the codes, even column low; block 1 is zero:
     * scale byte 0, nibbles 0 */
    float x[64];
    for (int c = 0; c < 32; c++) x[c] = t_fp4_values[c & 15] * 4;
    for (int c = 32; c < 64; c++) x[c] = 0;
    uint8_t data[32], sc[2];
    memset(data, 0xaa, sizeof(data));
    T_CHECK(qmat_quantize(WF_MXFP4, 32, x, 1, 64, data, sc) == 0, "quantize mxfp4");
    static const uint8_t want[32] = {0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC, 0xFE, 0x10, 0x32, 0x54,
                                     0x76, 0x98, 0xBA, 0xDC, 0xFE, [16 ... 31] = 0x00};
    T_CHECK(memcmp(data, want, 32) == 0 && sc[0] == 129 && sc[1] == 0, "mxfp4 bytes: %02x %02x .. %02x, scales %d %d",
            data[0], data[1], data[16], sc[0], sc[1]);
    T_CHECK(qmat_quantize(WF_MXFP4, 0, x, 1, 64, data, sc) == 0 && sc[0] == 129, "mxfp4 group 0 means 32");
    /* ties to even and saturation at scale 1 (a 6 or a 7.x in the block sets the exponent to 0) */
    static const float tv[][2] = {{0.25f, 0},   {0.75f, 1},   {1.25f, 1},    {1.75f, 2},    {2.5f, 2},
                                  {3.5f, 4},    {5.0f, 4},    {-0.25f, -0.0f}, {-0.75f, -1}, {-5.0f, -4},
                                  {-3.5f, -4},  {0.2500001f, 0.5f}, {5.0000005f, 6}, {4.9999995f, 4},
                                  {6.5f, 6},    {7.9f, 6},    {-7.0f, -6},   {1e-30f, 0},   {-1e-30f, -0.0f}};
    int bad = 0;
    for (unsigned i = 0; i < sizeof(tv) / sizeof(tv[0]); i++) {
        float xb[32] = {6.0f}; /* column 0 fixes the scale */
        xb[1 + i % 31] = tv[i][0];
        uint8_t d[16], s1;
        qmat_quantize(WF_MXFP4, 32, xb, 1, 32, d, &s1);
        qmat_t w = {.fmt = WF_MXFP4, .rows = 1, .cols = 32, .group = 32, .data = d, .scales = &s1};
        float o[32];
        qmat_dequant_row(&w, 0, o);
        if (s1 != 127 || f2u(o[1 + i % 31]) != f2u(tv[i][1])) {
            fprintf(stderr, "  mxfp4 %g: got %g (scale %d), want %g\n", tv[i][0], o[1 + i % 31], s1, tv[i][1]);
            bad++;
        }
    }
    T_CHECK(bad == 0, "%d mxfp4 ties / saturations wrong", bad);
    /* every representable value round-trips: blocks of random codes at random scale bytes
     * dequantize, quantize and dequantize to the same values, bit for bit (-0 included); a
     * block holding a 4 or a 6 (the top binade) also gets back its very bytes and scale. Scale
     * bytes 253 and 254 overflow fp32 for the larger codes (4 * 2^126 = 2^128): those values
     * are +-inf, as with transformers' ldexp, and such blocks are skipped (no finite input
     * quantizes to them: the largest shared exponent of finite fp32 is 125, byte 252). */
    bad = 0;
    int bytes_bad = 0, exact_blocks = 0, inf_blocks = 0;
    for (int it = 0; it < 20000; it++) {
        uint8_t d[16], s1 = (uint8_t)(it < 255 ? (uint64_t)it : t_rng_next(seed) % 255), d2[16], s2;
        const uint64_t r = t_rng_next(seed);
        for (int j = 0; j < 16; j++) d[j] = (uint8_t)t_rng_next(seed);
        if (r & 1) /* small codes only: the quantizer must pick a smaller scale */
            for (int j = 0; j < 16; j++) d[j] &= (r & 2) ? 0xBB : 0x99;
        qmat_t w = {.fmt = WF_MXFP4, .rows = 1, .cols = 32, .group = 32, .data = d, .scales = &s1};
        float v[32], v2[32];
        qmat_dequant_row(&w, 0, v);
        bool inf = false;
        for (int k = 0; k < 32; k++) inf |= isinf(v[k]);
        if (inf) {
            inf_blocks++;
            T_CHECK(s1 >= 253, "mxfp4 scale %d overflows", s1);
            continue;
        }
        T_CHECK(qmat_quantize(WF_MXFP4, 32, v, 1, 32, d2, &s2) == 0, "quantize");
        qmat_t w2 = {.fmt = WF_MXFP4, .rows = 1, .cols = 32, .group = 32, .data = d2, .scales = &s2};
        qmat_dequant_row(&w2, 0, v2);
        bad += memcmp(v, v2, sizeof(v)) != 0;
        bool top = false;
        for (int j = 0; j < 16; j++) top |= (d[j] & 6) == 6 || (d[j] & 0x60) == 0x60;
        if (top) {
            exact_blocks++;
            bytes_bad += s2 != s1 || memcmp(d, d2, 16) != 0;
        }
    }
    T_CHECK(bad == 0, "%d mxfp4 blocks do not round-trip", bad);
    T_CHECK(bytes_bad == 0 && exact_blocks > 1000, "%d of %d top-binade blocks change bytes", bytes_bad, exact_blocks);
    T_CHECK(inf_blocks < 500, "%d blocks overflow", inf_blocks);
    T_CHECK(isinf(e2m1_to_f32(6) * e8m0_to_f32(253)) && e2m1_to_f32(5) * e8m0_to_f32(253) == 0x1.8p127f,
            "the largest finite mxfp4 value is 3 * 2^126");
    /* random values over a wide exponent range against the search oracle */
    bad = 0;
    for (int it = 0; it < 3000; it++) {
        float xb[32];
        /* block exponents from tiny (the scale clamps at -127) to huge, elements within 2^-6 of the top */
        const int emax = -126 + (int)(t_rng_next(seed) % 254), emin = emax - 6 < -126 ? -126 : emax - 6;
        for (int k = 0; k < 32; k++) xb[k] = t_rand_wide(seed, emin, emax);
        if (it % 7 == 0) xb[it % 32] = 0;
        uint8_t d[16], s1;
        qmat_quantize(WF_MXFP4, 32, xb, 1, 32, d, &s1);
        const int e = t_mxfp4_block_exp(xb);
        bool ok = s1 == e + 127;
        for (int k = 0; k < 32; k++) {
            const int code = k & 1 ? d[k / 2] >> 4 : d[k / 2] & 15;
            ok &= code == t_e2m1_nearest(ldexp((double)xb[k], -e));
        }
        if (!ok && bad++ < 3) fprintf(stderr, "  mxfp4 block %d (exponent %d): differs from the oracle\n", it, e);
    }
    T_CHECK(bad == 0, "%d mxfp4 blocks differ from the nearest-value oracle", bad);
    /* tiny blocks: the exponent clamps at -127 (byte 0) and the elements still round */
    float tiny[32] = {0x1p-130f, -0x1.8p-128f, 0x1p-149f, 0x1.4p-127f};
    uint8_t d[16], s1;
    T_CHECK(qmat_quantize(WF_MXFP4, 32, tiny, 1, 32, d, &s1) == 0 && s1 == 0, "tiny block scale %d", s1);
    T_CHECK((d[0] & 15) == 0 && (d[0] >> 4) == (8 | 2) && (d[1] & 15) == 0 && (d[1] >> 4) == 2,
            "tiny block codes %02x %02x", d[0], d[1]);
    /* bad shapes */
    float z[96] = {0};
    uint8_t dd[48], ss[3];
    T_CHECK(qmat_quantize(WF_MXFP4, 32, z, 1, 48, dd, ss) == -EINVAL, "mxfp4 cols not a multiple of 32");
    T_CHECK(qmat_quantize(WF_MXFP4, 64, z, 1, 96, dd, ss) == -EINVAL, "mxfp4 group 64");
    T_CHECK(qmat_quantize(WF_MXFP4, 32, z, 1, 96, dd, ss) == 0 && ss[0] == 0 && ss[2] == 0, "mxfp4 zeros: scale byte 0");
}

static void test_bad_input(void)
{
    float x[96] = {0};
    uint8_t d[96 * 4];
    uint16_t s[16];
    T_CHECK(qmat_quantize(WF_INT4, 32, x, 1, 48, d, s) == -EINVAL, "cols not a multiple of the group");
    T_CHECK(qmat_quantize(WF_INT4, 64, x, 1, 96, d, s) == -EINVAL, "96 cols, group 64");
    T_CHECK(qmat_quantize(WF_INT4, 16, x, 1, 96, d, s) == -EINVAL, "group 16");
    T_CHECK(qmat_quantize(WF_INT4, 0, x, 1, 96, d, s) == -EINVAL, "group 0");
    T_CHECK(qmat_quantize(WF_INT4, 32, x, 1, 96, d, s) == 0, "96 cols, group 32");
    x[5] = NAN;
    T_CHECK(qmat_quantize(WF_INT8, 0, x, 1, 96, d, s) == -EINVAL, "NaN input");
    x[5] = INFINITY;
    T_CHECK(qmat_quantize(WF_FP8, 0, x, 1, 96, d, s) == -EINVAL, "inf input");
    x[5] = 1e6f;
    T_CHECK(qmat_quantize(WF_INT4, 32, x, 1, 96, d, s) == -EINVAL, "int4 scale overflows fp16");
}

/* Quantize a random Gaussian matrix, dequantize it, check per-element bounds, and report
 * the relative error of y = W x against the fp32 weights. */
static void test_round_trip(uint64_t *seed, wfmt_t fmt, int group, int rows, int cols)
{
    float *w = malloc(sizeof(float) * rows * cols), *dq = malloc(sizeof(float) * rows * cols);
    enum { NX = 8 }; /* activation vectors for the matmul error */
    float *x = malloc(sizeof(float) * cols * NX);
    void *data = malloc(qmat_data_bytes(fmt, rows, cols));
    void *sc = malloc(qmat_scale_bytes(fmt, rows, cols, group) + 1);
    for (int i = 0; i < rows * cols; i++) w[i] = t_gauss(seed) * 0.02f;
    /* 7 outliers, at most one a row: two in one row (or one element boosted twice, x100) made the
     * int8 row scale of a 64-row matrix jump, and the bound fail for a few seeds in a thousand */
    for (int i = 0, r0 = (int)(t_rng_next(seed) % rows); i < 7 && i < rows; i++)
        w[((r0 + i * (rows / 7 > 0 ? rows / 7 : 1)) % rows) * cols + t_rng_next(seed) % cols] *= 10;
    for (int c = 0; c < cols * NX; c++) x[c] = t_gauss(seed);
    T_CHECK(qmat_quantize(fmt, group, w, rows, cols, data, sc) == 0, "quantize %s", wfmt_name(fmt));
    qmat_t q = {.fmt = fmt, .rows = rows, .cols = cols, .group = group, .data = data, .scales = sc};
    int bad = 0;
    for (int r = 0; r < rows; r++) {
        float *o = dq + (int64_t)r * cols;
        for (int c = 0; c < cols; c++) o[c] = NAN;
        qmat_dequant_row(&q, r, o);
        float amax = 0;
        for (int c = 0; c < cols; c++) amax = fmaxf(amax, fabsf(w[r * cols + c]));
        for (int c = 0; c < cols; c++) {
            float a = w[r * cols + c], b = o[c], err = fabsf(a - b), lim;
            switch (fmt) {
            case WF_F32: lim = 0; break;
            case WF_BF16: lim = fabsf(a) * 0x1p-8f; break;
            case WF_INT8: lim = amax / 127 * 0.5001f; break;
            case WF_FP8: lim = fmaxf(fabsf(a) * 0x1p-4f, amax / 448 * 0x1p-10f) * 1.0001f; break;
            case WF_MXFP4: { /* half the e2m1 spacing, at most a quarter of |w| or of the block scale X
                              * (saturation above 6X: a - 6X <= a / 4 for a < 8X) */
                const float X = ldexpf(1.0f, t_mxfp4_block_exp(w + r * cols + c / 32 * 32));
                lim = fmaxf(fabsf(a), X) * 0.25f * 1.0001f;
                break;
            }
            default: /* INT4: checked per group below */
                lim = INFINITY;
                break;
            }
            if (!(err <= lim)) {
                if (bad < 5) fprintf(stderr, "  %s r%d c%d: w %g dq %g err %g lim %g\n", wfmt_name(fmt), r, c, a, b, err, lim);
                bad++;
            }
        }
    }
    T_CHECK(bad == 0, "%s g%d: %d elements outside the bound", wfmt_name(fmt), group, bad);
    float *q40 = NULL;
    if (fmt == WF_INT4) {
        /* every group reconstructs at least as well as the plain Q4_0 choice, computed here:
         * d = fp16(max / -8), q = clamp(round(x / d) + 8, 0, 15) */
        q40 = malloc(sizeof(float) * rows * cols);
        int worse = 0;
        for (int g0 = 0; g0 < rows * cols; g0 += group) {
            float amax = 0, vmax = 0;
            for (int k = 0; k < group; k++)
                if (fabsf(w[g0 + k]) > amax) amax = fabsf(w[g0 + k]), vmax = w[g0 + k];
            float d = f16_to_f32(f32_to_f16(vmax / -8.0f));
            double e0 = 0, e1 = 0;
            for (int k = 0; k < group; k++) {
                int v = d != 0 ? (int)rintf(w[g0 + k] / d) + 8 : 8;
                v = v < 0 ? 0 : v > 15 ? 15 : v;
                q40[g0 + k] = (float)(v - 8) * d;
                e0 += ((double)w[g0 + k] - q40[g0 + k]) * ((double)w[g0 + k] - q40[g0 + k]);
                e1 += ((double)w[g0 + k] - dq[g0 + k]) * ((double)w[g0 + k] - dq[g0 + k]);
            }
            worse += e1 > e0 * (1 + 1e-9);
        }
        T_CHECK(worse == 0, "int4 g%d: %d groups reconstruct worse than Q4_0", group, worse);
    }
    /* y = W x for NX Gaussian vectors: exact weights (y0), stored ones (y1), plain Q4_0 (y2) */
    float *y0 = malloc(sizeof(float) * rows * NX), *y1 = malloc(sizeof(float) * rows * NX);
    float *y2 = malloc(sizeof(float) * rows * NX);
    for (int k = 0; k < NX; k++)
        for (int r = 0; r < rows; r++) {
            double a = 0, b = 0, e = 0;
            for (int c = 0; c < cols; c++) {
                a += (double)w[r * cols + c] * x[k * cols + c];
                b += (double)dq[r * cols + c] * x[k * cols + c];
                if (q40) e += (double)q40[r * cols + c] * x[k * cols + c];
            }
            y0[k * rows + r] = (float)a;
            y1[k * rows + r] = (float)b;
            y2[k * rows + r] = (float)e;
        }
    double rel = t_relerr(y1, y0, (size_t)rows * NX), wrel = t_relerr(dq, w, (size_t)rows * cols);
    fprintf(stderr, "error %-4s g%-3d %dx%d: matmul rel err %.5f, weight rel err %.5f", wfmt_name(fmt), group, rows, cols, rel, wrel);
    if (q40) {
        fprintf(stderr, " (plain Q4_0 scale: matmul %.5f, weight %.5f)", t_relerr(y2, y0, (size_t)rows * NX),
                t_relerr(q40, w, (size_t)rows * cols));
        free(q40);
    }
    fprintf(stderr, "\n");
    double lim = fmt == WF_F32 ? 0 : fmt == WF_BF16 ? 0.005 : fmt == WF_INT8 ? 0.02 : fmt == WF_FP8 ? 0.05
                 : fmt == WF_INT4 ? 0.15 : 0.2;
    T_CHECK(rel <= lim, "%s g%d matmul rel err %g > %g", wfmt_name(fmt), group, rel, lim);
    free(w); free(dq); free(x); free(data); free(sc); free(y0); free(y1); free(y2);
}

int main(void)
{
    uint64_t seed = t_seed();
    test_names_sizes();
    test_bf16(&seed);
    test_f16(&seed);
    test_fp8(&seed);
    test_int4_layout();
    test_mxfp4_tables();
    test_mxfp4_dequant(&seed);
    test_mxfp4_quantize(&seed);
    test_bad_input();
    test_round_trip(&seed, WF_F32, 0, 64, 512);
    test_round_trip(&seed, WF_BF16, 0, 64, 512);
    test_round_trip(&seed, WF_INT8, 0, 64, 512);
    test_round_trip(&seed, WF_FP8, 0, 64, 512);
    test_round_trip(&seed, WF_INT4, 32, 256, 2048);
    test_round_trip(&seed, WF_INT4, 64, 256, 2048);
    test_round_trip(&seed, WF_INT4, 128, 256, 2048);
    test_round_trip(&seed, WF_MXFP4, 32, 256, 2048);
    return t_done("test_qmat");
}
