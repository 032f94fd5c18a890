/* matmul.cu - y = x @ W^T with fused dequantization. Up to GEMM_MIN_ROWS tokens: one warp per
 * output row, tokens NT at a time, so each weight row is read once per NT tokens: decode
 * (n <= 16) reads every weight exactly once, which is what bounds it. More tokens take the
 * tensor-core GEMM (gemm.cuh) when the workspace and the format allow, and from
 * CUDA_BLAS_MIN_ROWS cuBLAS on the matrix dequantized to fp16 (cuda_ctx_enable_blas). */
#include <cublas_v2.h>

#include "kernels/cuda/gemm.cuh"

/* Token chunk blockIdx.y: rows NT * blockIdx.y .. of x and y, and how many of them are left. */
#define GEMV_CHUNK(NT)                                   \
    const int t_0 = blockIdx.y * (NT);                   \
    x += (size_t)t_0 * ldx;                              \
    y += (size_t)t_0 * ldy;                              \
    n = n - t_0 < (NT) ? n - t_0 : (NT)

template <int FMT, int NT>
__global__ void k_gemv(float *y, const float *x, int n, int ldx, qmat_t w, const float *bias, int ldy, bool vec,
                       bool accum)
{
    pdl_enter();
    GEMV_CHUNK(NT);
    const int r = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (r >= w.rows) return;
    float acc[NT];
    q_row_dot<FMT, NT>(w, r, x, n, ldx, vec, acc, threadIdx.x & 31, 32);
    const float b = bias ? bias[r] : 0.f;
#pragma unroll
    for (int t = 0; t < NT; t++) {
        float s = warp_sum(acc[t]);
        if (t < n && (threadIdx.x & 31) == 0) {
            float *o = y + (size_t)t * ldy + r;
            *o = (accum ? *o : 0.f) + s + b;
        }
    }
}

/* Few rows (a router): a block of 256 threads per row, so a row is not one warp's serial loop.
 * Row blockIdx.x of w against up to NT tokens. */
template <int FMT, int NT>
__device__ __forceinline__ void rowblock_dot(float *y, const float *x, int n, int ldx, const qmat_t &w,
                                             const float *bias, int ldy, bool vec, bool accum)
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
        float *o = y + (size_t)threadIdx.x * ldy + r;
        *o = (accum ? *o : 0.f) + s;
    }
}

template <int FMT, int NT>
__global__ void k_gemv_rowblock(float *y, const float *x, int n, int ldx, qmat_t w, const float *bias, int ldy, bool vec,
                                bool accum)
{
    pdl_enter();
    GEMV_CHUNK(NT);
    rowblock_dot<FMT, NT>(y, x, n, ldx, w, bias, ldy, vec, accum);
}

__global__ void k_q8_quant(int8_t *q, float *d, int32_t *s, const float *x, int cols, const int32_t *rows, int div,
                           const int32_t *limit)
{
    pdl_enter();
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
    launch_k(k_q8_quant, dim3(cdiv(cols / 32, 8), n), 256, 0, st, q, d, s, x, cols, rows, div, limit);
    CUDA_LAUNCH_CHECK();
    return 0;
}

/* Up to MM_MAX matrices that share an input, multiplied in one launch: matrix i takes blocks
 * start[i] .. start[i+1]-1. */
#define MM_MAX 4
typedef struct {
    qmat_t w[MM_MAX];
    float *y[MM_MAX];
    const float *bias[MM_MAX];
    int start[MM_MAX + 1];
    int count;
    bool accum; /* y += x W^T instead of y = */
} mm_set_t;

/* Integer path: each group of LPR lanes takes RR consecutive rows (q8_dot_rows), so a warp
 * takes 32 / LPR * RR rows: 4 rows a warp keep more 16-byte loads in flight per lane on big
 * matrices, 1 row a warp spreads a small matrix over more warps. */
template <int FMT, int NT, int LPR, int RR>
__global__ void k_gemv_q8(mm_set_t set, const int8_t *xq, const float *xd, const int32_t *xs, int n)
{
    constexpr int RPW = 32 / LPR * RR; /* rows per warp */
    int i = 0;
#pragma unroll
    for (int k = 1; k < MM_MAX; k++) i += k < set.count && (int)blockIdx.x >= set.start[k];
    /* static indexing only, so the set stays in parameter space */
    const qmat_t w = i == 0 ? set.w[0] : i == 1 ? set.w[1] : i == 2 ? set.w[2] : set.w[3];
    float *y = i == 0 ? set.y[0] : i == 1 ? set.y[1] : i == 2 ? set.y[2] : set.y[3];
    const float *bias = i == 0 ? set.bias[0] : i == 1 ? set.bias[1] : i == 2 ? set.bias[2] : set.bias[3];
    const int blk = blockIdx.x - (i == 0 ? 0 : i == 1 ? set.start[1] : i == 2 ? set.start[2] : set.start[3]);
    const int lane = threadIdx.x & 31, warp = (blk * blockDim.x + threadIdx.x) >> 5;
    /* the weights do not depend on the kernel before: they come into L2 while it finishes */
    if (lane < 2) l2_prefetch_rows<FMT>(w, warp * RPW, RPW, lane == 0);
    pdl_enter();
    if (warp * RPW >= w.rows) return; /* the whole warp is past the last row */
    const int r0 = warp * RPW + lane / LPR * RR;
    const uint8_t *rp[RR];
    const void *sp[RR];
#pragma unroll
    for (int k = 0; k < RR; k++) q8_row_ptrs<FMT>(w, r0 + k, rp[k], sp[k]);
    float acc[RR][NT];
    q8_dot_rows<FMT, NT, RR, LPR>(rp, sp, FMT == WF_INT4 ? w.group / 32 : 1, xq, xd, xs, n, w.cols, acc);
#pragma unroll
    for (int k = 0; k < RR; k++)
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float v = group_sum<LPR>(acc[k][t]);
            if (lane % LPR == 0 && t < n && r0 + k < w.rows) {
                float *o = y + (size_t)t * w.rows + r0 + k;
                *o = (set.accum ? *o : 0.f) + v + (bias ? bias[r0 + k] : 0.f);
            }
        }
}

template <int FMT, int NT, int LPR, int RR>
static int s_gemv_q8_set(cudaStream_t st, mm_set_t set, const int8_t *q, const float *d, const int32_t *s, int m)
{
    constexpr int rows_per_block = 8 * (32 / LPR) * RR;
    set.start[0] = 0;
    for (int i = 0; i < set.count; i++) set.start[i + 1] = set.start[i] + cdiv(set.w[i].rows, rows_per_block);
    launch_k(k_gemv_q8<FMT, NT, LPR, RR>, set.start[set.count], 256, 0, st, set, q, d, s, m);
    CUDA_LAUNCH_CHECK();
    return 0;
}

template <int FMT, int NT>
static int s_gemv_q8_launch(cudaStream_t st, const mm_set_t &set, const int8_t *q, const float *d, const int32_t *s,
                            int m)
{
    int rows = 0;
    for (int i = 0; i < set.count; i++) rows += set.w[i].rows;
    const bool big = rows >= 8448; /* 4 rows a warp still leaves 2 blocks of 8 warps per SM */
    if (q8_wide_rows(set.w[0].cols))
        return big ? s_gemv_q8_set<FMT, NT, 32, 4>(st, set, q, d, s, m) : s_gemv_q8_set<FMT, NT, 32, 1>(st, set, q, d, s, m);
    return big ? s_gemv_q8_set<FMT, NT, 8, 4>(st, set, q, d, s, m) : s_gemv_q8_set<FMT, NT, 8, 1>(st, set, q, d, s, m);
}

/* Whether the int8-activation path applies to w for n rows. */
static bool s_q8_ok(const cuda_ctx_t *c, const qmat_t *w, int n)
{
    if (w->fmt != WF_INT4 && w->fmt != WF_INT8 && w->fmt != WF_MXFP4) return false;
    if (w->cols % 32 || (w->fmt == WF_INT4 && w->group % 32) || (uintptr_t)w->data % 16) return false;
    return c->q8 && (size_t)n * w->cols <= c->q8_elems;
}

/* The set's matrices share x: quantize it once, then 16 tokens a launch. */
template <int FMT>
static int s_gemv_q8(cuda_ctx_t *c, const mm_set_t &set, const float *x, int n, bool x_q8)
{
    cudaStream_t st = c->stream;
    const int cols = set.w[0].cols, nb = cols / 32;
    int rc = x_q8 && n <= 16 ? 0 : q8_quant(st, c->q8, c->q8d, c->q8s, x, n, cols, NULL, 1, NULL);
    for (int t0 = 0; t0 < n && !rc; t0 += 16) {
        int m = n - t0 < 16 ? n - t0 : 16;
        const int8_t *q = c->q8 + (size_t)t0 * cols;
        const float *d = c->q8d + (size_t)t0 * nb;
        const int32_t *s = c->q8s + (size_t)t0 * nb;
        mm_set_t part = set;
        for (int i = 0; i < set.count; i++) part.y[i] = set.y[i] + (size_t)t0 * set.w[i].rows;
        if (m == 1)
            rc = s_gemv_q8_launch<FMT, 1>(st, part, q, d, s, m);
        else if (m <= 4)
            rc = s_gemv_q8_launch<FMT, 4>(st, part, q, d, s, m);
        else
            rc = s_gemv_q8_launch<FMT, 16>(st, part, q, d, s, m);
    }
    return rc;
}

template <int FMT>
static int s_gemv_fmt(cudaStream_t st, float *y, const float *x, int n, const qmat_t *w, const float *bias, bool accum)
{
    const bool vec = q_can_vec(w, w->cols);
    const int threads = 256, blocks = cdiv((long)w->rows * 32, threads);
    /* one launch: blockIdx.y takes NT tokens */
    if (w->rows < 1024) { /* too few rows for a warp each to fill the GPU */
        if (n == 1)
            launch_k(k_gemv_rowblock<FMT, 1>, w->rows, 256, 0, st, y, x, n, w->cols, *w, bias, w->rows, vec, accum);
        else if (n > 16 && (long)w->rows * cdiv(n, 16) < 256) /* a router at prefill sizes: 4 tokens a block, 4x the blocks */
            launch_k(k_gemv_rowblock<FMT, 4>, dim3(w->rows, cdiv(n, 4)), 256, 0, st, y, x, n, w->cols, *w, bias,
                     w->rows, vec, accum);
        else
            launch_k(k_gemv_rowblock<FMT, 16>, dim3(w->rows, cdiv(n, 16)), 256, 0, st, y, x, n, w->cols, *w, bias,
                     w->rows, vec, accum);
    } else if (n == 1) {
        launch_k(k_gemv<FMT, 1>, blocks, threads, 0, st, y, x, n, w->cols, *w, bias, w->rows, vec, accum);
    } else if (n <= 4) {
        launch_k(k_gemv<FMT, 4>, blocks, threads, 0, st, y, x, n, w->cols, *w, bias, w->rows, vec, accum);
    } else {
        launch_k(k_gemv<FMT, 16>, dim3(blocks, cdiv(n, 16)), threads, 0, st, y, x, n, w->cols, *w, bias, w->rows, vec,
                 accum);
    }
    CUDA_LAUNCH_CHECK();
    return 0;
}

static int s_matmul_one(cuda_ctx_t *c, float *y, const float *x, int n, const qmat_t *w, const float *bias, bool accum)
{
    cudaStream_t st = c->stream;
    switch (w->fmt) {
    case WF_F32: return s_gemv_fmt<WF_F32>(st, y, x, n, w, bias, accum);
    case WF_BF16: return s_gemv_fmt<WF_BF16>(st, y, x, n, w, bias, accum);
    case WF_INT8: return s_gemv_fmt<WF_INT8>(st, y, x, n, w, bias, accum);
    case WF_FP8: return s_gemv_fmt<WF_FP8>(st, y, x, n, w, bias, accum);
    case WF_INT4: return s_gemv_fmt<WF_INT4>(st, y, x, n, w, bias, accum);
    case WF_MXFP4: return s_gemv_fmt<WF_MXFP4>(st, y, x, n, w, bias, accum);
    default: log_error("cuda_matmul: unknown weight format %d", (int)w->fmt); return STRATA_EINVAL_INPUT;
    }
}

/* y[m][:] += bias for m < M: rows of N */
__global__ void k_add_bias(float *y, const float *bias, int N, size_t total)
{
    pdl_enter();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x)
        y[i] += bias[i % N];
}

/* cuda_ctx_enable_blas's path: each matrix dequantized into the context's scratch, then
 * multiplied by cuBLAS (row-major y = x w^T is column-major y^T = w x^T: w's rows are the
 * transposed operand's columns), then its bias. */
static int s_blas(cuda_ctx_t *c, int count, float *const *ys, const __half *x16, int M, const qmat_t *const *ws,
                  const float *const *biases, bool accum)
{
    const float one = 1.f, beta = accum ? 1.f : 0.f;
    for (int i = 0; i < count; i++) {
        const qmat_t *w = ws[i];
        int rc = gemm_dequant(c->stream, c->w16, w);
        if (rc) return rc;
        cublasStatus_t s = cublasGemmEx((cublasHandle_t)c->blas, CUBLAS_OP_T, CUBLAS_OP_N, w->rows, M, w->cols, &one,
                                        c->w16, CUDA_R_16F, w->cols, x16, CUDA_R_16F, w->cols, &beta, ys[i], CUDA_R_32F,
                                        w->rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (s != CUBLAS_STATUS_SUCCESS) {
            log_error("cublasGemmEx %dx%dx%d: %s", M, w->rows, w->cols, cublasGetStatusString(s));
            return STRATA_ECUDA;
        }
        c->blas_gemms++;
        if (biases && biases[i]) {
            const size_t total = (size_t)M * w->rows;
            launch_k(k_add_bias, (unsigned)(total / 1024 + 1 < 4096 ? total / 1024 + 1 : 4096), 256, 0, c->stream,
                     ys[i], biases[i], w->rows, total);
            CUDA_LAUNCH_CHECK();
        }
    }
    return 0;
}

/* ys[i] (=, or += with accum) x @ ws[i]^T (+ biases[i]) for i < count <= MM_MAX, all with
 * ws[i]->cols columns. The input is converted (GEMM) or quantized (integer path) once; on the
 * integer path, matrices of one format run in one launch. */
static int s_matmul(cuda_ctx_t *c, int count, float *const *ys, const float *x, int n, const qmat_t *const *ws,
                    const float *const *biases, bool accum, bool x_q8)
{
    if (n <= 0 || count <= 0) return 0;
    if (count > MM_MAX) {
        log_error("cuda_matmul_multi: %d matrices (at most %d)", count, MM_MAX);
        return STRATA_EINVAL_INPUT;
    }
    const int cols = ws[0]->cols;
    bool gemm = n > GEMM_MIN_ROWS && c->x16 && (size_t)n * cols <= c->q8_elems, q8 = true;
    bool blas = gemm && c->blas && n >= CUDA_BLAS_MIN_ROWS;
    for (int i = 0; i < count; i++) {
        if (ws[i]->cols != cols) {
            log_error("cuda_matmul_multi: matrices of %d and %d columns share one input", cols, ws[i]->cols);
            return STRATA_EINVAL_INPUT;
        }
        gemm = gemm && gemm_ok(ws[i]);
        blas = blas && (size_t)ws[i]->rows * cols <= c->w16_elems;
        q8 = q8 && s_q8_ok(c, ws[i], n) && ws[i]->fmt == ws[0]->fmt;
    }
    int rc = 0;
    if (gemm) {
        if ((rc = gemm_to_half(c->stream, c->x16, x, NULL, 1, n, cols))) return rc;
        if (blas) return s_blas(c, count, ys, c->x16, n, ws, biases, accum);
        return gemm_plain(c->stream, c->sms, count, ys, c->x16, n, ws, biases, accum, c->part, c->part_floats);
    }
    if (q8) {
        mm_set_t set = {};
        set.count = count;
        set.accum = accum;
        for (int i = 0; i < count; i++) {
            set.w[i] = *ws[i];
            set.y[i] = ys[i];
            set.bias[i] = biases ? biases[i] : NULL;
        }
        switch (ws[0]->fmt) {
        case WF_INT4: return s_gemv_q8<WF_INT4>(c, set, x, n, x_q8);
        case WF_MXFP4: return s_gemv_q8<WF_MXFP4>(c, set, x, n, x_q8);
        default: return s_gemv_q8<WF_INT8>(c, set, x, n, x_q8);
        }
    }
    for (int i = 0; i < count && !rc; i++) rc = s_matmul_one(c, ys[i], x, n, ws[i], biases ? biases[i] : NULL, accum);
    return rc;
}

extern "C" int cuda_matmul(cuda_ctx_t *c, float *y, const float *x, int n, const qmat_t *w, const float *bias)
{
    if (w->rows <= 0) return 0;
    return s_matmul(c, 1, &y, x, n, &w, &bias, false, false);
}

extern "C" int cuda_matmul_acc(cuda_ctx_t *c, float *y, const float *x, int n, const qmat_t *w, const float *bias)
{
    if (w->rows <= 0) return 0;
    return s_matmul(c, 1, &y, x, n, &w, &bias, true, false);
}

extern "C" int cuda_matmul_multi(cuda_ctx_t *c, int count, float *const *ys, const float *x, int n,
                                 const qmat_t *const *ws, const float *const *biases)
{
    return s_matmul(c, count, ys, x, n, ws, biases, false, false);
}

extern "C" int cuda_matmul_ex(cuda_ctx_t *c, int count, float *const *ys, const float *x, int n,
                              const qmat_t *const *ws, const float *const *biases, bool accum, bool x_q8)
{
    return s_matmul(c, count, ys, x, n, ws, biases, accum, x_q8);
}
