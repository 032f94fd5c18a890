/* matmul.cu - y = x @ W^T with fused dequantization, one warp per output row.
 * Tokens are processed NT at a time, so each weight row is read once per NT tokens: decode
 * (n <= 16) reads every weight exactly once, which is what bounds it. */
#include "kernels/cuda/qdot.cuh"

template <int FMT, int NT>
__global__ void k_gemv(float *y, const float *x, int n, int ldx, qmat_t w, const float *bias, int ldy, bool vec)
{
    const int r = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (r >= w.rows) return;
    float acc[NT];
    q_row_dot<FMT, NT>(w, r, x, n, ldx, vec, acc);
    const float b = bias ? bias[r] : 0.f;
#pragma unroll
    for (int t = 0; t < NT; t++) {
        float s = warp_sum(acc[t]);
        if (t < n && (threadIdx.x & 31) == 0) y[(size_t)t * ldy + r] = s + b;
    }
}

__global__ void k_q8_quant(int8_t *q, float *d, int32_t *s, const float *x, int cols)
{
    const size_t r = blockIdx.x;
    q8_quant_row(q + r * cols, d + r * (cols / 32), s + r * (cols / 32), x + r * cols, cols);
}

template <int FMT, int NT>
__global__ void k_gemv_q8(float *y, const int8_t *xq, const float *xd, const int32_t *xs, int n, qmat_t w,
                          const float *bias, int ldy)
{
    const int r = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (r >= w.rows) return;
    float acc[NT];
    q8_row_dot<FMT, NT>(w, r, xq, xd, xs, n, w.cols, acc);
    const float b = bias ? bias[r] : 0.f;
#pragma unroll
    for (int t = 0; t < NT; t++) {
        float s = warp_sum(acc[t]);
        if (t < n && (threadIdx.x & 31) == 0) y[(size_t)t * ldy + r] = s + b;
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
    k_q8_quant<<<n, 256, 0, st>>>(c->q8, c->q8d, c->q8s, x, w->cols);
    CUDA_LAUNCH_CHECK();
    const int threads = 256, blocks = cdiv((long)w->rows * 32, threads), nb = w->cols / 32;
    for (int t0 = 0; t0 < n; t0 += 16) {
        int m = n - t0 < 16 ? n - t0 : 16;
        const int8_t *q = c->q8 + (size_t)t0 * w->cols;
        const float *d = c->q8d + (size_t)t0 * nb;
        const int32_t *s = c->q8s + (size_t)t0 * nb;
        float *ys = y + (size_t)t0 * w->rows;
        if (m == 1)
            k_gemv_q8<FMT, 1><<<blocks, threads, 0, st>>>(ys, q, d, s, m, *w, bias, w->rows);
        else if (m <= 4)
            k_gemv_q8<FMT, 4><<<blocks, threads, 0, st>>>(ys, q, d, s, m, *w, bias, w->rows);
        else
            k_gemv_q8<FMT, 16><<<blocks, threads, 0, st>>>(ys, q, d, s, m, *w, bias, w->rows);
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
