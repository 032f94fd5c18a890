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
