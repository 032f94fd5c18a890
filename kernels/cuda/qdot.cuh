/* qdot.cuh - warp-level dot products of one quantized weight row with up to NT activation rows,
 * dequantizing inside the loop (internal to kernels/cuda).
 *
 * Layout (kernels/cpu/qmat.h): each lane takes 16-byte chunks of the row, consecutive lanes
 * consecutive chunks, so a warp streams 512 contiguous bytes per step. A chunk holds 4 (F32),
 * 8 (BF16), 16 (INT8/FP8) or 32 (INT4: one Q4_0 sub-block, low nibbles = first 16 columns)
 * weights; MXFP4's chunk is one 32-column block too, byte j holding columns 2j (low nibble) and
 * 2j + 1 (high), with one e8m0 scale. Rows whose byte length is not a multiple of 16 take the
 * element-wise path.
 */
#pragma once
#include "kernels/cuda/cuda_common.cuh"

template <int FMT> struct qfmt;
template <> struct qfmt<WF_F32> { static constexpr int COLS = 4; };
template <> struct qfmt<WF_BF16> { static constexpr int COLS = 8; };
template <> struct qfmt<WF_INT8> { static constexpr int COLS = 16; };
template <> struct qfmt<WF_FP8> { static constexpr int COLS = 16; };
template <> struct qfmt<WF_INT4> { static constexpr int COLS = 32; };
template <> struct qfmt<WF_MXFP4> { static constexpr int COLS = 32; };

/* Bytes of one row's data. */
__host__ __device__ __forceinline__ size_t q_row_bytes(int fmt, int cols)
{
    switch (fmt) {
    case WF_F32: return (size_t)cols * 4;
    case WF_BF16: return (size_t)cols * 2;
    case WF_INT4:
    case WF_MXFP4: return (size_t)cols / 2;
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
    case WF_MXFP4: { /* exactly qmat_dequant_row's e2m1 * 2^(scale - 127) */
        const uint8_t b = row[j >> 1];
        return d_e2m1(j & 1 ? b >> 4 : b) * d_e8m0(((const uint8_t *)w.scales)[(size_t)r * (w.cols / 32) + j / 32]);
    }
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
    } else if constexpr (FMT == WF_MXFP4) { /* chunk c is block c: byte i = columns 2i, 2i + 1 */
        const float s = d_e8m0(__ldg((const uint8_t *)w.scales + (size_t)r * (w.cols / 32) + c));
#pragma unroll
        for (int i = 0; i < 16; i++) {
            const uint32_t b = (u[i >> 2] >> (8 * (i & 3))) & 0xff;
            out[2 * i] = d_e2m1(b) * s;
            out[2 * i + 1] = d_e2m1(b >> 4) * s;
        }
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

/* Per-thread partial dot products of row r with x[t][:] (t < n <= NT, row stride ldx): this
 * thread takes chunks (or, without vec, columns) first, first + step, ... (first = lane and step
 * = 32 for a warp per row). The caller reduces acc. vec: the row can be read in 16-byte chunks. */
template <int FMT, int NT>
__device__ __forceinline__ void q_row_dot(const qmat_t &w, int r, const float *x, int n, int ldx, bool vec,
                                          float *acc, int first, int step)
{
    const int lane = first;
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.f;
    if constexpr (FMT == WF_MXFP4) {
        if (vec) {
            /* 4-byte words, consecutive threads consecutive words: word k is columns 8k .. 8k + 7
             * (byte i: columns 8k + 2i, 8k + 2i + 1) of block k / 4, so the threads of a warp read
             * 1 KB of each x row contiguously (16-byte chunks a thread put 128 bytes between
             * neighbours' activations and made gpt-oss-20b's MoE layer 2.6x the int8 path's time) */
            const uint32_t *row = (const uint32_t *)((const uint8_t *)w.data + (size_t)r * (w.cols / 2));
            const uint8_t *sc = (const uint8_t *)w.scales + (size_t)r * (w.cols / 32);
            const int nw = w.cols / 8;
#pragma unroll 4
            for (int k = lane; k < nw; k += step) {
                const uint32_t u = __ldg(row + k);
                const float s = d_e8m0(__ldg(sc + (k >> 2)));
                float wv[8];
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const uint32_t b = u >> (8 * i);
                    wv[2 * i] = d_e2m1(b) * s;
                    wv[2 * i + 1] = d_e2m1(b >> 4) * s;
                }
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    if (t < n) {
                        const float4 *xp = (const float4 *)(x + (size_t)t * ldx + (size_t)k * 8);
                        const float4 a = __ldg(xp), c = __ldg(xp + 1);
                        acc[t] += wv[0] * a.x + wv[1] * a.y + wv[2] * a.z + wv[3] * a.w + wv[4] * c.x + wv[5] * c.y +
                                  wv[6] * c.z + wv[7] * c.w;
                    }
                }
            }
            return;
        }
    }
    if (vec) {
        constexpr int C = qfmt<FMT>::COLS;
        const int nch = w.cols / C;
#pragma unroll 4
        for (int c = lane; c < nch; c += step) {
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
        for (int j = lane; j < w.cols; j += step) {
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
    int C = w->fmt == WF_F32 ? 4 : w->fmt == WF_BF16 ? 8 : w->fmt == WF_INT4 || w->fmt == WF_MXFP4 ? 32 : 16;
    return w->cols % C == 0 && (q_row_bytes(w->fmt, w->cols) % 16) == 0 && ((uintptr_t)w->data % 16) == 0 &&
           ldx % 4 == 0;
}

/* Sum over the LPR lanes of one lane group (lanes lane / LPR equal); every lane of the warp
 * must call it. */
template <int LPR> __device__ __forceinline__ float group_sum(float v)
{
#pragma unroll
    for (int o = LPR / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Lanes per weight row for the integer path: whole warps on long rows, groups of 8 lanes on
 * short ones (fewer than 128 blocks of 32 columns), so every lane has several blocks to load.
 * Measured on Qwen3-30B-A3B (hidden 2048: 64 blocks), whole warps from 64 blocks: batch 1 381
 * against 376 tok/s, batch 16 641 against 755, so the bar stays at 128. */
static inline bool q8_wide_rows(int cols) { return cols / 32 >= 128; }

/* Unrolling of the block loop (q8_dot_rows' default): one token on whole-warp rows has registers
 * to spare for more weight loads in flight. Measured on the H200 (batch-1 decode, int4 g32,
 * unrolling 2 / 4 / 8): Mixtral-8x7B 262 / 279 / 256 tok/s, Qwen3-30B-A3B 390 / 391 / 397 (8 on
 * the rows of 4096 columns, 4 on the experts' down rows: Mixtral 264). The experts' flat
 * kernels (moe.cu) unroll 2 at 2 blocks an SM. */
template <int NT, int LPR> __host__ __device__ constexpr int q8_unroll() { return NT == 1 && LPR == 32 ? 4 : 2; }

/* Per-lane partial dot products of RR weight rows of an INT4, INT8 or MXFP4 matrix with NT
 * int8-quantized activation rows (q8 layout of cuda_common.cuh, row stride cols; cols % 32 == 0,
 * rows 16-byte aligned). rp[i]: row i's data; sp[i]: its scales (INT4: the row's fp16 group
 * scales, bpg blocks of 32 per group; INT8: the row's fp32 scale; MXFP4: the row's e8m0 bytes,
 * bpg 1). The LPR lanes of a lane group
 * stride over the row's 32-column blocks and load each block of activations once for all RR
 * rows; the caller sums acc over the group (group_sum<LPR>).
 * INT4 block = 16 bytes: byte j holds columns j (low nibble) and 16+j (high), so the low
 * nibbles of word i pair with activation word i and the high nibbles with word 4+i. The +8
 * offset is removed with the block sum of q: sum_j (n_j - 8) a_j = dot(n, a) - 8 * sum(a).
 * MXFP4 block = 16 bytes, byte j = columns 2j (low nibble), 2j + 1 (high): word i's nibbles are
 * columns 8i .. 8i + 7 in order, so its low half pairs with activation word 2i and its high half
 * with 2i + 1, each as the int8s 2 * e2m1 (mxfp4_i8x4), exact; w = e2m1 * 2^(s - 127) =
 * (2 e2m1) * 2^(s - 128), so the block's scale is 2^(s - 128) (a power of two: scale * dx
 * is exact) and no offset is needed. The weights are converted once a block, for all NT rows.
 * ROWS: activation row t is row xr[t] of xq/xd/xs (a gather), else row t. UNR: the unrolling. */
template <int FMT, int NT, int RR, int LPR, bool ROWS = false, int UNR = q8_unroll<NT, LPR>()>
__device__ __forceinline__ void q8_dot_rows(const uint8_t *const *rp, const void *const *sp, int bpg, const int8_t *xq,
                                            const float *xd, const int32_t *xs, int n, int cols, float (*acc)[NT],
                                            const int *xr = nullptr)
{
    const int sl = (threadIdx.x & 31) % LPR, nb = cols / 32;
#pragma unroll
    for (int i = 0; i < RR; i++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[i][t] = 0.f;
#pragma unroll UNR
    for (int b = sl; b < nb; b += LPR) {
        if constexpr (FMT == WF_INT4) {
            uint4 v[RR];
            float s[RR];
#pragma unroll
            for (int i = 0; i < RR; i++) {
                v[i] = __ldg((const uint4 *)(rp[i] + (size_t)b * 16));
                s[i] = d_f16(__ldg((const uint16_t *)sp[i] + b / bpg));
            }
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t < n) {
                    const size_t xrow = ROWS ? (size_t)xr[t] : (size_t)t;
                    const int4 *xa = (const int4 *)(xq + xrow * cols + (size_t)b * 32);
                    const int4 a0 = __ldg(xa), a1 = __ldg(xa + 1);
                    const size_t bi = xrow * nb + b;
                    const float dx = __ldg(xd + bi);
                    const int sx8 = 8 * __ldg(xs + bi);
#pragma unroll
                    for (int i = 0; i < RR; i++) {
                        int dot = __dp4a((int)(v[i].x & 0x0F0F0F0F), a0.x, 0);
                        dot = __dp4a((int)(v[i].y & 0x0F0F0F0F), a0.y, dot);
                        dot = __dp4a((int)(v[i].z & 0x0F0F0F0F), a0.z, dot);
                        dot = __dp4a((int)(v[i].w & 0x0F0F0F0F), a0.w, dot);
                        dot = __dp4a((int)((v[i].x >> 4) & 0x0F0F0F0F), a1.x, dot);
                        dot = __dp4a((int)((v[i].y >> 4) & 0x0F0F0F0F), a1.y, dot);
                        dot = __dp4a((int)((v[i].z >> 4) & 0x0F0F0F0F), a1.z, dot);
                        dot = __dp4a((int)((v[i].w >> 4) & 0x0F0F0F0F), a1.w, dot);
                        acc[i][t] += s[i] * dx * (float)(dot - sx8);
                    }
                }
            }
        } else if constexpr (FMT == WF_MXFP4) {
            int wq[RR][8]; /* row i's block as 8 words of 4 int8s, columns 4k .. 4k + 3 in word k */
            float s[RR];
#pragma unroll
            for (int i = 0; i < RR; i++) {
                const uint4 v = __ldg((const uint4 *)(rp[i] + (size_t)b * 16));
                s[i] = d_e8m0(__ldg((const uint8_t *)sp[i] + b), 1);
                const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    wq[i][2 * k] = mxfp4_i8x4(u[k]);
                    wq[i][2 * k + 1] = mxfp4_i8x4(u[k] >> 16);
                }
            }
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t < n) {
                    const size_t xrow = ROWS ? (size_t)xr[t] : (size_t)t;
                    const int4 *xa = (const int4 *)(xq + xrow * cols + (size_t)b * 32);
                    const int4 a0 = __ldg(xa), a1 = __ldg(xa + 1);
                    const float dx = __ldg(xd + xrow * nb + b);
#pragma unroll
                    for (int i = 0; i < RR; i++) {
                        int dot = __dp4a(wq[i][0], a0.x, 0);
                        dot = __dp4a(wq[i][1], a0.y, dot);
                        dot = __dp4a(wq[i][2], a0.z, dot);
                        dot = __dp4a(wq[i][3], a0.w, dot);
                        dot = __dp4a(wq[i][4], a1.x, dot);
                        dot = __dp4a(wq[i][5], a1.y, dot);
                        dot = __dp4a(wq[i][6], a1.z, dot);
                        dot = __dp4a(wq[i][7], a1.w, dot);
                        acc[i][t] += s[i] * dx * (float)dot;
                    }
                }
            }
        } else { /* WF_INT8: a block is two 16-byte chunks; the row scale is applied at the end */
            int4 v0[RR], v1[RR];
#pragma unroll
            for (int i = 0; i < RR; i++) {
                v0[i] = __ldg((const int4 *)(rp[i] + (size_t)b * 32));
                v1[i] = __ldg((const int4 *)(rp[i] + (size_t)b * 32 + 16));
            }
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t < n) {
                    const size_t xrow = ROWS ? (size_t)xr[t] : (size_t)t;
                    const int4 *xa = (const int4 *)(xq + xrow * cols + (size_t)b * 32);
                    const int4 a0 = __ldg(xa), a1 = __ldg(xa + 1);
                    const float dx = __ldg(xd + xrow * nb + b);
#pragma unroll
                    for (int i = 0; i < RR; i++) {
                        int dot = __dp4a(v0[i].x, a0.x, 0);
                        dot = __dp4a(v0[i].y, a0.y, dot);
                        dot = __dp4a(v0[i].z, a0.z, dot);
                        dot = __dp4a(v0[i].w, a0.w, dot);
                        dot = __dp4a(v1[i].x, a1.x, dot);
                        dot = __dp4a(v1[i].y, a1.y, dot);
                        dot = __dp4a(v1[i].z, a1.z, dot);
                        dot = __dp4a(v1[i].w, a1.w, dot);
                        acc[i][t] += dx * (float)dot;
                    }
                }
            }
        }
    }
    if constexpr (FMT == WF_INT8) {
#pragma unroll
        for (int i = 0; i < RR; i++) {
            const float s = __ldg((const float *)sp[i]);
#pragma unroll
            for (int t = 0; t < NT; t++) acc[i][t] *= s;
        }
    }
}

/* Row r's data and scale pointers for q8_dot_rows (r clamped into the matrix, so lanes past the
 * last row read valid memory; their results are not stored). */
template <int FMT>
__device__ __forceinline__ void q8_row_ptrs(const qmat_t &w, int r, const uint8_t *&rp, const void *&sp)
{
    r = r < w.rows ? r : w.rows - 1;
    rp = (const uint8_t *)w.data + (size_t)r * q_row_bytes(FMT, w.cols);
    if constexpr (FMT == WF_INT4)
        sp = (const uint16_t *)w.scales + (size_t)r * (w.cols / w.group);
    else if constexpr (FMT == WF_MXFP4)
        sp = (const uint8_t *)w.scales + (size_t)r * (w.cols / 32);
    else
        sp = (const float *)w.scales + r;
}

/* Ask L2 for rows r0 .. r0 + count - 1 of an INT4, INT8 or MXFP4 matrix (those that exist): their
 * data (data) or their scales (!data). */
template <int FMT>
__device__ __forceinline__ void l2_prefetch_rows(const qmat_t &w, int r0, int count, bool data)
{
    count = min(count, w.rows - r0);
    if (count <= 0) return;
    if (data) {
        const size_t rb = q_row_bytes(FMT, w.cols);
        l2_prefetch((const uint8_t *)w.data + (size_t)r0 * rb, (size_t)count * rb);
    } else {
        const size_t sb = FMT == WF_INT4 ? (size_t)(w.cols / w.group) * 2 : FMT == WF_MXFP4 ? (size_t)w.cols / 32 : 4;
        l2_prefetch((const uint8_t *)w.scales + (size_t)r0 * sb, (size_t)count * sb);
    }
}

/* Quantize n rows of cols floats (cols % 32 == 0) into the q8 layout: output row r takes source
 * row (rows ? rows[r] / div : r) of x; with limit, rows r >= *limit are skipped. One warp per
 * 32-column block, so a row is quantized by many blocks at once. */
int q8_quant(cudaStream_t st, int8_t *q, float *d, int32_t *s, const float *x, int n, int cols, const int32_t *rows,
             int div, const int32_t *limit);
