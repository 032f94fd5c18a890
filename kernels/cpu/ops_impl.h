/* ops_impl.h - private to kernels/cpu: the row kernel every ISA implements for cpu_matmul
 * and cpu_ffn_swiglu. Not part of the op interface (ops.h). */
#ifndef STRATA_CPU_OPS_IMPL_H
#define STRATA_CPU_OPS_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/qmat.h"

/* One matmul: for tokens t < n and rows r of w,
 *   y[t*ldy + r] = (acc ? y[t*ldy + r] : 0) + ys[t] * (dot(x[t*ldx ..], W[r]) + bias[r])
 * with ys[t] = 1 when yscale is NULL and bias[r] = 0 when bias is NULL. Dots accumulate in
 * fp32 or wider over the weights dequantized exactly as qmat_dequant_row does. */
typedef struct {
    const qmat_t *w;
    const float *x;      /* [n][ldx] fp32 activations, ldx >= w->cols */
    float *y;            /* [n][ldy] fp32 outputs, ldy >= w->rows */
    int n, ldx, ldy;
    const float *bias;   /* [w->rows] or NULL */
    const float *yscale; /* [n] or NULL */
    bool acc;
    /* CPU_ACT_Q8 and INT4 or MXFP4 weights (set by the driver, NULL otherwise): x quantized per
     * 32 columns (cpu_q8_quantize), [n][w->cols] int8, [n][w->cols / 32] scales and block sums.
     * The kernels then compute dot(W[r], xq * xd) instead of dot(W[r], x). xq is in row order,
     * except for INT4 jobs on the VNNI kernel (ISA CPU_ISA_AVX512_VNNI), which take it as
     * cpu_avx512vnni_q8_pack leaves it. */
    const int8_t *xq;
    const float *xd;
    const int32_t *xs;
} mm_job_t;

/* Compute rows [r0, r1) of job j, for all its tokens. */
typedef void (*mm_rows_fn_t)(const mm_job_t *j, int32_t r0, int32_t r1);

/* The plain reference (ops_ref.c). */
void cpu_ref_mm_rows(const mm_job_t *j, int32_t r0, int32_t r1);
/* AVX2 + FMA + F16C (ops_avx2.c, compiled with those flags; call only if the CPU has them). */
void cpu_avx2_mm_rows(const mm_job_t *j, int32_t r0, int32_t r1);
/* AVX-512 F/BW/VL (ops_avx512.c; call only if the CPU has them). */
void cpu_avx512_mm_rows(const mm_job_t *j, int32_t r0, int32_t r1);
/* AVX-512 F/BW/VL + VNNI (ops_avx512_vnni.c; call only if the CPU has them): the INT4 x q8
 * jobs with vpdpbusd, bit for bit cpu_avx512_mm_rows's results; the others (MXFP4 x q8 too)
 * through it. */
void cpu_avx512vnni_mm_rows(const mm_job_t *j, int32_t r0, int32_t r1);
/* q[n][cols] (cpu_q8_quantize's int8, cols a multiple of 32) into out[n * cols] in the order
 * cpu_avx512vnni_mm_rows reads (ops_avx512_vnni.c describes it). q and out do not overlap. */
void cpu_avx512vnni_q8_pack(const int8_t *q, int n, int cols, int8_t *out);

/* cpu_attention per ISA (same contract as ops.h). */
typedef void (*attn_fn_t)(float *out, const float *q, const float *k_cache, const float *v_cache,
                          const int32_t *block_table, int ctx_start, int n_ctx, int n_heads, int n_kv_heads,
                          int head_dim, int block_size, float scale, const float *sinks, float *scratch);
void cpu_ref_attention(float *out, const float *q, const float *k_cache, const float *v_cache,
                       const int32_t *block_table, int ctx_start, int n_ctx, int n_heads, int n_kv_heads,
                       int head_dim, int block_size, float scale, const float *sinks, float *scratch);
void cpu_avx2_attention(float *out, const float *q, const float *k_cache, const float *v_cache,
                        const int32_t *block_table, int ctx_start, int n_ctx, int n_heads, int n_kv_heads,
                        int head_dim, int block_size, float scale, const float *sinks, float *scratch);
void cpu_avx512_attention(float *out, const float *q, const float *k_cache, const float *v_cache,
                          const int32_t *block_table, int ctx_start, int n_ctx, int n_heads, int n_kv_heads,
                          int head_dim, int block_size, float scale, const float *sinks, float *scratch);

/* Quantize n rows of x (row stride ldx, cols a multiple of 32) to int8 blocks of 32, as the
 * GPU's q8_quant_row does: d = amax / 127, q = rint(x / d) (0 where d = 0), s = sum(q).
 * q: [n][cols], d and s: [n][cols / 32]. */
void cpu_q8_quantize(const float *x, int64_t ldx, int n, int cols, int8_t *q, float *d, int32_t *s);

/* A per-thread, 64-byte aligned scratch of at least n floats (grown on demand, freed when
 * the thread exits). Valid until the calling thread's next cpu_row_buf call. */
float *cpu_row_buf(size_t n);

/* Shared epilogue for one output element. */
/* Tokens per block of the row kernels: a block's fp32 activations stay within ~256 KiB, so a
 * row read once is dotted with all of them from cache. A multiple of 4, at least 4. */
static inline int mm_token_block(int cols)
{
    int tbk = (int)(65536 / (cols > 0 ? cols : 1)) & ~3;
    return tbk < 4 ? 4 : tbk;
}

static inline void mm_store(const mm_job_t *j, int t, int32_t r, float dot)
{
    float v = dot + (j->bias ? j->bias[r] : 0.0f);
    if (j->yscale) v *= j->yscale[t];
    float *o = &j->y[(int64_t)t * j->ldy + r];
    *o = j->acc ? *o + v : v;
}

#endif
