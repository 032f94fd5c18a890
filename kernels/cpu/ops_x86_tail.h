/* ops_x86_tail.h - the parts of ops_avx2.c and ops_avx512.c that differ only in the vector
 * width: the matmul row dispatch and the attention of one query. Private to kernels/cpu; each
 * file includes it last, after defining
 *   X86_VW                   floats in its vector (8 or 16);
 *   X86_MM_ROWS, X86_ATTN    the names of its public functions (ops_impl.h);
 *   s_fused(j, fmt, r0, r1)  its row kernel for one weight format;
 *   s_vdot(a, b, n)          sum of a[i] * b[i] over i < n, n a multiple of X86_VW;
 *   s_vaxpy(a, x, y, n)      y[i] += a * x[i] over i < n, likewise.
 */
#ifndef STRATA_CPU_OPS_X86_TAIL_H
#define STRATA_CPU_OPS_X86_TAIL_H

#include <math.h>

#include "common/strata.h"
#include "kernels/cpu/ops_impl.h"
#include "kernels/cpu/ops_q8_x86.h"

#define S_FUSED_FMT(FMT, name) \
    static void name(const mm_job_t *j, int32_t r0, int32_t r1) { s_fused(j, FMT, r0, r1); }
S_FUSED_FMT(WF_F32, s_fused_f32)
S_FUSED_FMT(WF_BF16, s_fused_bf16)
S_FUSED_FMT(WF_INT8, s_fused_int8)
S_FUSED_FMT(WF_FP8, s_fused_fp8)
S_FUSED_FMT(WF_INT4, s_fused_int4)
S_FUSED_FMT(WF_MXFP4, s_fused_mxfp4)
#undef S_FUSED_FMT

void X86_MM_ROWS(const mm_job_t *j, int32_t r0, int32_t r1)
{
    if (j->xq) {
        q8x_rows(j, r0, r1);
        return;
    }
    switch (j->w->fmt) {
    case WF_F32: s_fused_f32(j, r0, r1); break;
    case WF_BF16: s_fused_bf16(j, r0, r1); break;
    case WF_INT8: s_fused_int8(j, r0, r1); break;
    case WF_FP8: s_fused_fp8(j, r0, r1); break;
    case WF_INT4: s_fused_int4(j, r0, r1); break;
    case WF_MXFP4: s_fused_mxfp4(j, r0, r1); break;
    default: STRATA_ASSERT(!"format");
    }
}

/* Attention of one query over positions ctx_start..n_ctx-1 of paged KV (contract in ops.h).
 * The heads that share a KV head (GQA) go together, so each K and V row is read once for all
 * of them: scores for the group live in the per-thread buffer ([group][n_ctx - ctx_start];
 * `scratch` is not needed), then a max-subtracted exp per head (the sink, if any, in the max
 * and the sum), then one pass over V adding every head's weighted row. */
void X86_ATTN(float *out, const float *q, const float *k_cache, const float *v_cache, const int32_t *block_table,
              int ctx_start, int n_ctx, int n_heads, int n_kv_heads, int head_dim, int block_size, float scale,
              const float *sinks, float *scratch)
{
    (void)scratch;
    STRATA_ASSERT(ctx_start >= 0 && ctx_start < n_ctx && n_kv_heads >= 1 && n_heads % n_kv_heads == 0);
    const int group = n_heads / n_kv_heads, hv = head_dim / X86_VW * X86_VW, len = n_ctx - ctx_start;
    float *sc = cpu_row_buf((size_t)group * len);
    for (int kvh = 0; kvh < n_kv_heads; kvh++) {
        const float *qg = q + (int64_t)kvh * group * head_dim;
        float *og = out + (int64_t)kvh * group * head_dim;
        for (int p = ctx_start; p < n_ctx; p++) {
            const int64_t blk = block_table[p / block_size];
            const float *k = k_cache + ((blk * n_kv_heads + kvh) * block_size + p % block_size) * head_dim;
            for (int g = 0; g < group; g++) {
                const float *qh = qg + (int64_t)g * head_dim;
                float d = s_vdot(qh, k, hv);
                for (int i = hv; i < head_dim; i++) d += qh[i] * k[i];
                sc[(int64_t)g * len + (p - ctx_start)] = d * scale;
            }
        }
        for (int g = 0; g < group; g++) {
            const float sink = sinks ? sinks[kvh * group + g] : -INFINITY;
            float *s = sc + (int64_t)g * len, mx = sink;
            for (int i = 0; i < len; i++) mx = s[i] > mx ? s[i] : mx;
            double sum = sinks ? expf(sink - mx) : 0;
            for (int i = 0; i < len; i++) {
                s[i] = expf(s[i] - mx);
                sum += s[i];
            }
            const float inv = (float)(1.0 / sum);
            for (int i = 0; i < len; i++) s[i] *= inv;
        }
        for (int i = 0; i < group * head_dim; i++) og[i] = 0;
        for (int p = ctx_start; p < n_ctx; p++) {
            const int64_t blk = block_table[p / block_size];
            const float *v = v_cache + ((blk * n_kv_heads + kvh) * block_size + p % block_size) * head_dim;
            for (int g = 0; g < group; g++) {
                float *oh = og + (int64_t)g * head_dim;
                const float a = sc[(int64_t)g * len + (p - ctx_start)];
                s_vaxpy(a, v, oh, hv);
                for (int i = hv; i < head_dim; i++) oh[i] += a * v[i];
            }
        }
    }
}

#endif
