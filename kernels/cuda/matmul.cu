/* matmul.cu - y = x @ W^T with fused dequantization. Up to GEMM_MIN_ROWS tokens: one warp per
 * output row, tokens NT at a time, so each weight row is read once per NT tokens: decode
 * (n <= 16) reads every weight exactly once, which is what bounds it. More tokens take the
 * tensor-core GEMM (gemm.cuh) when the workspace and the format allow. */
#include "kernels/cuda/gemm.cuh"

template <int FMT, int NT>
__global__ void k_gemv(float *y, const float *x, int n, int ldx, qmat_t w, const float *bias, int ldy, bool vec)
{
    const int r = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (r >= w.rows) return;
    float acc[NT];
    q_row_dot<FMT, NT>(w, r, x, n, ldx, vec, acc, threadIdx.x & 31, 32);
    const float b = bias ? bias[r] : 0.f;
#pragma unroll
    for (int t = 0; t < NT; t++) {
        float s = warp_sum(acc[t]);
        if (t < n && (threadIdx.x & 31) == 0) y[(size_t)t * ldy + r] = s + b;
    }
}

/* Few rows (a router): a block of 256 threads per row, so a row is not one warp's serial loop. */
template <int FMT, int NT>
__global__ void k_gemv_rowblock(float *y, const float *x, int n, int ldx, qmat_t w, const float *bias, int ldy, bool vec)
{
    const int r = blockIdx.x;
    __shared__ float part[8][NT];
    float acc[NT];
    q_row_dot<FMT, NT>(w, r, x, n, ldx, vec, acc, threadIdx.x, blockDim.x);
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const float s = warp_sum(acc[t]);
        if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5][t] = s;
    }
    __syncthreads();
    if (threadIdx.x < NT && threadIdx.x < n) {
        float s = bias ? bias[r] : 0.f;
        for (int i = 0; i < 8; i++) s += part[i][threadIdx.x];
        y[(size_t)threadIdx.x * ldy + r] = s;
    }
}

__global__ void k_q8_quant(int8_t *q, float *d, int32_t *s, const float *x, int cols, const int32_t *rows, int div,
                           const int32_t *limit)
{
    const int r = blockIdx.y, b = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), nb = cols / 32;
    if (b >= nb || (limit && r >= *limit)) return;
    const size_t src = rows ? (size_t)(rows[r] / div) : (size_t)r;
    const size_t o = (size_t)r * nb + b;
    q8_quant_block(q + o * 32, d + o, s + o, x + src * cols + (size_t)b * 32);
}

int q8_quant(cudaStream_t st, int8_t *q, float *d, int32_t *s, const float *x, int n, int cols, const int32_t *rows,
             int div, const int32_t *limit)
{
    if (n <= 0) return 0;
    k_q8_quant<<<dim3(cdiv(cols / 32, 8), n), 256, 0, st>>>(q, d, s, x, cols, rows, div, limit);
    CUDA_LAUNCH_CHECK();
    return 0;
}

/* Integer path: each group of LPR lanes takes RR consecutive rows (q8_dot_rows), so a warp
 * takes 32 / LPR * RR rows: 4 rows a warp keep more 16-byte loads in flight per lane on big
 * matrices, 1 row a warp spreads a small matrix over more warps. */
template <int FMT, int NT, int LPR, int RR>
__global__ void k_gemv_q8(float *y, const int8_t *xq, const float *xd, const int32_t *xs, int n, qmat_t w,
                          const float *bias, int ldy)
{
    constexpr int RPW = 32 / LPR * RR; /* rows per warp */
    const int lane = threadIdx.x & 31, warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (warp * RPW >= w.rows) return; /* the whole warp is past the last row */
    const int r0 = warp * RPW + lane / LPR * RR;
    const uint8_t *rp[RR];
    const void *sp[RR];
#pragma unroll
    for (int i = 0; i < RR; i++) q8_row_ptrs<FMT>(w, r0 + i, rp[i], sp[i]);
    float acc[RR][NT];
    q8_dot_rows<FMT, NT, RR, LPR>(rp, sp, FMT == WF_INT4 ? w.group / 32 : 1, xq, xd, xs, n, w.cols, acc);
#pragma unroll
    for (int i = 0; i < RR; i++)
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float v = group_sum<LPR>(acc[i][t]);
            if (lane % LPR == 0 && t < n && r0 + i < w.rows) y[(size_t)t * ldy + r0 + i] = v + (bias ? bias[r0 + i] : 0.f);
        }
}

template <int FMT, int NT>
static void s_gemv_q8_launch(cudaStream_t st, float *y, const int8_t *q, const float *d, const int32_t *s, int m,
                             const qmat_t *w, const float *bias)
{
    const bool big = w->rows >= 8448; /* 4 rows a warp still leaves 2 blocks of 8 warps per SM */
    if (q8_wide_rows(w->cols)) {
        if (big)
            k_gemv_q8<FMT, NT, 32, 4><<<cdiv(w->rows, 8 * 4), 256, 0, st>>>(y, q, d, s, m, *w, bias, w->rows);
        else
            k_gemv_q8<FMT, NT, 32, 1><<<cdiv(w->rows, 8), 256, 0, st>>>(y, q, d, s, m, *w, bias, w->rows);
    } else {
        if (big)
            k_gemv_q8<FMT, NT, 8, 4><<<cdiv(w->rows, 8 * 16), 256, 0, st>>>(y, q, d, s, m, *w, bias, w->rows);
        else
            k_gemv_q8<FMT, NT, 8, 1><<<cdiv(w->rows, 8 * 4), 256, 0, st>>>(y, q, d, s, m, *w, bias, w->rows);
    }
}

/* Whether the int8-activation path applies to w for n rows. */
static bool s_q8_ok(const cuda_ctx_t *c, const qmat_t *w, int n)
{
    if (w->fmt != WF_INT4 && w->fmt != WF_INT8) return false;
    if (w->cols % 32 || (w->fmt == WF_INT4 && w->group % 32) || (uintptr_t)w->data % 16) return false;
    return c->q8 && (size_t)n * w->cols <= c->q8_elems;
}

template <int FMT>
static int s_gemv_q8(cuda_ctx_t *c, float *y, const float *x, int n, const qmat_t *w, const float *bias)
{
    cudaStream_t st = c->stream;
    int rc = q8_quant(st, c->q8, c->q8d, c->q8s, x, n, w->cols, NULL, 1, NULL);
    if (rc) return rc;
    const int nb = w->cols / 32;
    for (int t0 = 0; t0 < n; t0 += 16) {
        int m = n - t0 < 16 ? n - t0 : 16;
        const int8_t *q = c->q8 + (size_t)t0 * w->cols;
        const float *d = c->q8d + (size_t)t0 * nb;
        const int32_t *s = c->q8s + (size_t)t0 * nb;
        float *ys = y + (size_t)t0 * w->rows;
        if (m == 1)
            s_gemv_q8_launch<FMT, 1>(st, ys, q, d, s, m, w, bias);
        else if (m <= 4)
            s_gemv_q8_launch<FMT, 4>(st, ys, q, d, s, m, w, bias);
        else
            s_gemv_q8_launch<FMT, 16>(st, ys, q, d, s, m, w, bias);
        CUDA_LAUNCH_CHECK();
    }
    return 0;
}

template <int FMT>
static int s_gemv_fmt(cudaStream_t st, float *y, const float *x, int n, const qmat_t *w, const float *bias)
{
    const bool vec = q_can_vec(w, w->cols);
    const int threads = 256, blocks = cdiv((long)w->rows * 32, threads);
    for (int t0 = 0; t0 < n; t0 += 16) {
        int m = n - t0 < 16 ? n - t0 : 16;
        const float *xs = x + (size_t)t0 * w->cols;
        float *ys = y + (size_t)t0 * w->rows;
        if (w->rows < 1024) { /* too few rows for a warp each to fill the GPU */
            if (m == 1)
                k_gemv_rowblock<FMT, 1><<<w->rows, 256, 0, st>>>(ys, xs, m, w->cols, *w, bias, w->rows, vec);
            else
                k_gemv_rowblock<FMT, 16><<<w->rows, 256, 0, st>>>(ys, xs, m, w->cols, *w, bias, w->rows, vec);
            CUDA_LAUNCH_CHECK();
            continue;
        }
        if (m == 1)
            k_gemv<FMT, 1><<<blocks, threads, 0, st>>>(ys, xs, m, w->cols, *w, bias, w->rows, vec);
        else if (m <= 4)
            k_gemv<FMT, 4><<<blocks, threads, 0, st>>>(ys, xs, m, w->cols, *w, bias, w->rows, vec);
        else
            k_gemv<FMT, 16><<<blocks, threads, 0, st>>>(ys, xs, m, w->cols, *w, bias, w->rows, vec);
        CUDA_LAUNCH_CHECK();
    }
    return 0;
}

extern "C" int cuda_matmul(cuda_ctx_t *c, float *y, const float *x, int n, const qmat_t *w, const float *bias)
{
    if (n <= 0 || w->rows <= 0) return 0;
    if (n > GEMM_MIN_ROWS && c->x16 && (size_t)n * w->cols <= c->q8_elems && gemm_ok(w)) {
        int rc = gemm_to_half(c->stream, c->x16, x, NULL, 1, n, w->cols);
        return rc ? rc : gemm_plain(c->stream, y, w->rows, c->x16, n, w, bias);
    }
    if (s_q8_ok(c, w, n))
        return w->fmt == WF_INT4 ? s_gemv_q8<WF_INT4>(c, y, x, n, w, bias) : s_gemv_q8<WF_INT8>(c, y, x, n, w, bias);
    switch (w->fmt) {
    case WF_F32: return s_gemv_fmt<WF_F32>(c->stream, y, x, n, w, bias);
    case WF_BF16: return s_gemv_fmt<WF_BF16>(c->stream, y, x, n, w, bias);
    case WF_INT8: return s_gemv_fmt<WF_INT8>(c->stream, y, x, n, w, bias);
    case WF_FP8: return s_gemv_fmt<WF_FP8>(c->stream, y, x, n, w, bias);
    case WF_INT4: return s_gemv_fmt<WF_INT4>(c->stream, y, x, n, w, bias);
    default: log_error("cuda_matmul: unknown weight format %d", (int)w->fmt); return STRATA_EINVAL_INPUT;
    }
}
