/* qdot.cuh - warp-level dot products of one quantized weight row with up to NT activation rows,
 * dequantizing inside the loop (internal to kernels/cuda).
 *
 * Layout (kernels/cpu/qmat.h): each lane takes 16-byte chunks of the row, consecutive lanes
 * consecutive chunks, so a warp streams 512 contiguous bytes per step. A chunk holds 4 (F32),
 * 8 (BF16), 16 (INT8/FP8) or 32 (INT4: one Q4_0 sub-block, low nibbles = first 16 columns)
 * weights. Rows whose byte length is not a multiple of 16 take the element-wise path.
 */
#pragma once
#include "kernels/cuda/cuda_common.cuh"

template <int FMT> struct qfmt;
template <> struct qfmt<WF_F32> { static constexpr int COLS = 4; };
template <> struct qfmt<WF_BF16> { static constexpr int COLS = 8; };
template <> struct qfmt<WF_INT8> { static constexpr int COLS = 16; };
template <> struct qfmt<WF_FP8> { static constexpr int COLS = 16; };
template <> struct qfmt<WF_INT4> { static constexpr int COLS = 32; };

/* Bytes of one row's data. */
__host__ __device__ __forceinline__ size_t q_row_bytes(int fmt, int cols)
{
    switch (fmt) {
    case WF_F32: return (size_t)cols * 4;
    case WF_BF16: return (size_t)cols * 2;
    case WF_INT4: return (size_t)cols / 2;
    default: return (size_t)cols;
    }
}

/* One dequantized weight, any format (the slow, general path). */
__device__ __forceinline__ float q_elem(const qmat_t &w, int r, int j)
{
    const uint8_t *row = (const uint8_t *)w.data + (size_t)r * q_row_bytes(w.fmt, w.cols);
    switch (w.fmt) {
    case WF_F32: return ((const float *)row)[j];
    case WF_BF16: return d_bf16(((const uint16_t *)row)[j]);
    case WF_INT8: return (float)((const int8_t *)row)[j] * ((const float *)w.scales)[r];
    case WF_FP8: return d_fp8(row[j]) * ((const float *)w.scales)[r];
    default: {
        int sb = j >> 5, in = j & 31;
        uint8_t b = row[sb * 16 + (in & 15)];
        int q = in < 16 ? (b & 15) : (b >> 4);
        float s = d_f16(((const uint16_t *)w.scales)[(size_t)r * (w.cols / w.group) + j / w.group]);
        return (float)(q - 8) * s;
    }
    }
}

/* Dequantize chunk c (16 bytes) of row r into out[COLS]. */
template <int FMT>
__device__ __forceinline__ void q_chunk(const qmat_t &w, int r, int c, float *out)
{
    const uint8_t *row = (const uint8_t *)w.data + (size_t)r * q_row_bytes(FMT, w.cols);
    uint4 v = __ldg((const uint4 *)(row + (size_t)c * 16));
    const uint32_t u[4] = {v.x, v.y, v.z, v.w};
    if constexpr (FMT == WF_F32) {
#pragma unroll
        for (int i = 0; i < 4; i++) out[i] = __uint_as_float(u[i]);
    } else if constexpr (FMT == WF_BF16) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            out[2 * i] = __uint_as_float(u[i] << 16);
            out[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
        }
    } else if constexpr (FMT == WF_INT8) {
        float s = __ldg((const float *)w.scales + r);
#pragma unroll
        for (int i = 0; i < 16; i++) out[i] = (float)(int8_t)(u[i >> 2] >> (8 * (i & 3))) * s;
    } else if constexpr (FMT == WF_FP8) {
        float s = __ldg((const float *)w.scales + r);
#pragma unroll
        for (int i = 0; i < 16; i++) out[i] = d_fp8((uint8_t)(u[i >> 2] >> (8 * (i & 3)))) * s;
    } else {
        float s = d_f16(__ldg((const uint16_t *)w.scales + (size_t)r * (w.cols / w.group) + (c * 32) / w.group));
#pragma unroll
        for (int i = 0; i < 16; i++) {
            uint32_t b = (u[i >> 2] >> (8 * (i & 3))) & 0xff;
            out[i] = (float)((int)(b & 15) - 8) * s;
            out[i + 16] = (float)((int)(b >> 4) - 8) * s;
        }
    }
}

/* Per-lane partial dot products of row r with x[t][:] (t < n <= NT, row stride ldx).
 * The caller warp-reduces acc. vec: the row can be read in 16-byte chunks. */
template <int FMT, int NT>
__device__ __forceinline__ void q_row_dot(const qmat_t &w, int r, const float *x, int n, int ldx, bool vec,
                                          float *acc)
{
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.f;
    if (vec) {
        constexpr int C = qfmt<FMT>::COLS;
        const int nch = w.cols / C;
#pragma unroll 4
        for (int c = lane; c < nch; c += 32) {
            float wv[C];
            q_chunk<FMT>(w, r, c, wv);
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t < n) {
                    const float4 *xp = (const float4 *)(x + (size_t)t * ldx + (size_t)c * C);
                    float a = 0.f;
#pragma unroll
                    for (int i = 0; i < C / 4; i++) {
                        float4 xv = __ldg(xp + i);
                        a += wv[4 * i] * xv.x + wv[4 * i + 1] * xv.y + wv[4 * i + 2] * xv.z + wv[4 * i + 3] * xv.w;
                    }
                    acc[t] += a;
                }
            }
        }
    } else {
        for (int j = lane; j < w.cols; j += 32) {
            float wj = q_elem(w, r, j);
#pragma unroll
            for (int t = 0; t < NT; t++)
                if (t < n) acc[t] += wj * x[(size_t)t * ldx + j];
        }
    }
}

/* Whether rows of w (and x rows of stride ldx) allow 16-byte chunk loads. */
static inline bool q_can_vec(const qmat_t *w, int ldx)
{
    int C = w->fmt == WF_F32 ? 4 : w->fmt == WF_BF16 ? 8 : w->fmt == WF_INT4 ? 32 : 16;
    return w->cols % C == 0 && (q_row_bytes(w->fmt, w->cols) % 16) == 0 && ((uintptr_t)w->data % 16) == 0 &&
           ldx % 4 == 0;
}

/* Per-lane partial dot products of row r of an INT4 or INT8 matrix with NT int8-quantized
 * activation rows (q8 layout of cuda_common.cuh, row stride cols). cols % 32 == 0 and rows are
 * 16-byte aligned. INT4 chunk c = one 32-column block: byte j of the 16 holds columns j (low
 * nibble) and 16+j (high), so the low nibbles of word i pair with activation word i and the high
 * nibbles with word 4+i. The +8 offset is removed with the block sum of q:
 *   sum_j (n_j - 8) a_j = dot(n, a) - 8 * sum(a). */
template <int FMT, int NT>
__device__ __forceinline__ void q8_row_dot(const qmat_t &w, int r, const int8_t *xq, const float *xd, const int32_t *xs,
                                           int n, int cols, float *acc)
{
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.f;
    const int nb = cols / 32;
    if constexpr (FMT == WF_INT4) {
        const uint8_t *row = (const uint8_t *)w.data + (size_t)r * (cols / 2);
        const uint16_t *sc = (const uint16_t *)w.scales + (size_t)r * (cols / w.group);
        const int bpg = w.group / 32;
        /* unrolled so each lane has several 16-byte loads in flight: rows are short (a 4096
         * column int4 row is only 4 blocks per lane), so latency, not bandwidth, binds otherwise */
#pragma unroll 4
        for (int b = lane; b < nb; b += 32) {
            const uint4 v = __ldg((const uint4 *)(row + (size_t)b * 16));
            const float s = d_f16(__ldg(sc + b / bpg));
            const int lo0 = v.x & 0x0F0F0F0F, lo1 = v.y & 0x0F0F0F0F, lo2 = v.z & 0x0F0F0F0F, lo3 = v.w & 0x0F0F0F0F;
            const int hi0 = (v.x >> 4) & 0x0F0F0F0F, hi1 = (v.y >> 4) & 0x0F0F0F0F, hi2 = (v.z >> 4) & 0x0F0F0F0F,
                      hi3 = (v.w >> 4) & 0x0F0F0F0F;
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t < n) {
                    const int4 *xa = (const int4 *)(xq + (size_t)t * cols + (size_t)b * 32);
                    const int4 a0 = __ldg(xa), a1 = __ldg(xa + 1);
                    int dot = __dp4a(lo0, a0.x, 0);
                    dot = __dp4a(lo1, a0.y, dot);
                    dot = __dp4a(lo2, a0.z, dot);
                    dot = __dp4a(lo3, a0.w, dot);
                    dot = __dp4a(hi0, a1.x, dot);
                    dot = __dp4a(hi1, a1.y, dot);
                    dot = __dp4a(hi2, a1.z, dot);
                    dot = __dp4a(hi3, a1.w, dot);
                    const size_t bi = (size_t)t * nb + b;
                    acc[t] += s * __ldg(xd + bi) * (float)(dot - 8 * __ldg(xs + bi));
                }
            }
        }
    } else { /* WF_INT8: 16-byte chunks, two per activation block; one scale per row */
        const int8_t *row = (const int8_t *)w.data + (size_t)r * cols;
        const float s = __ldg((const float *)w.scales + r);
#pragma unroll 4
        for (int c = lane; c < nb * 2; c += 32) {
            const int4 v = __ldg((const int4 *)(row + (size_t)c * 16));
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t < n) {
                    const int4 a = __ldg((const int4 *)(xq + (size_t)t * cols + (size_t)c * 16));
                    int dot = __dp4a(v.x, a.x, 0);
                    dot = __dp4a(v.y, a.y, dot);
                    dot = __dp4a(v.z, a.z, dot);
                    dot = __dp4a(v.w, a.w, dot);
                    acc[t] += s * __ldg(xd + (size_t)t * nb + c / 2) * (float)dot;
                }
            }
        }
    }
}

__global__ void k_q8_quant(int8_t *q, float *d, int32_t *s, const float *x, int cols);
