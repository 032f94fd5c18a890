/* gemm.cuh - tensor-core GEMM with fused dequantization, for many tokens at once (prefill,
 * large batches): Y[m][n] = X[m][:] . W[n][:] with X in fp16 and W in INT4 (groups of 32k),
 * MXFP4, INT8, FP8 or BF16, dequantized to fp16 in registers and multiplied with mma.sync m16n8k16
 * (fp32 accumulation). Internal to kernels/cuda; matmul.cu and moe.cu choose it for large n.
 *
 * Tiles: 64 token rows x 128 weight rows per block of 4 warps, K in steps of 64 through a
 * 3-stage cp.async pipeline. In SWIGLU mode a block takes 64 rows of gate and the same 64 of
 * up, and writes fp16 h = act(gate, up) (the down projection's input, moe_act) instead of fp32.
 * Grouped (MoE) launches read their (expert, first row) tiles from the device. */
#pragma once
#include "kernels/cuda/qdot.cuh"

/* Rows of X per tile; grouped launches lay their tiles out in these units. */
#define GEMM_BM 64
/* cuda_matmul takes the GEMM above this many rows (below, the GEMV reads each weight once). */
#define GEMM_MIN_ROWS 16
/* cuda_moe_ffn takes it from this many tokens. */
#define GEMM_MOE_MIN_TOKENS 32

/* Grouped tile ti (< *n_tiles): expert e and its rows p0 .. p0 + cnt - 1 (cnt <= GEMM_BM); false
 * when there is no such tile or the expert is not resident. */
__device__ __forceinline__ bool moe_tile(const int2 *tiles, const int32_t *n_tiles, const int32_t *offsets,
                                         const cuda_expert_t *experts, int ti, int &e, int &p0, int &cnt)
{
    if (ti >= *n_tiles) return false;
    const int2 tl = tiles[ti];
    e = tl.x;
    p0 = tl.y;
    cnt = min(GEMM_BM, offsets[e + 1] - p0);
    return experts[e].gate.data != NULL;
}

/* The qmat that holds row r of expert ex's down projection (see cuda_expert_t). */
__device__ __forceinline__ const qmat_t &moe_down_rows(const cuda_expert_t &ex, int r)
{
    return ex.split > 0 && r >= ex.split ? ex.down_tail : ex.down;
}

/* Whether w can take the GEMM: INT4 (group a multiple of 32), MXFP4, INT8, FP8 or BF16, cols a
 * multiple of 64, data 16-byte aligned. */
static inline bool gemm_ok(const qmat_t *w)
{
    if (w->fmt != WF_INT4 && w->fmt != WF_MXFP4 && w->fmt != WF_INT8 && w->fmt != WF_FP8 && w->fmt != WF_BF16)
        return false;
    if (w->fmt == WF_INT4 && (w->group <= 0 || w->group % 32)) return false;
    return w->cols % 64 == 0 && (uintptr_t)w->data % 16 == 0;
}

/* The expert FFN's activation between gate/up and down, with the experts' gate/up biases
 * (cuda_moe_opts_t, device arrays [n_experts][inter], NULL: none), given gate row r's sum g and
 * up's u for expert e: g += gb[e][r], u += ub[e][r], then silu(g) * u, or clamped (gpt-oss):
 * g = min(g, limit), u = clamp(u, -limit, limit), (u + 1) * g * sigmoid(alpha * g), as
 * cpu_ffn_swiglu with cpu_ffn_opts_t. The default (all zero) is plain SwiGLU, always computed
 * as g / (1 + exp(-g)) * u, so its results do not depend on whether the options exist. */
typedef struct {
    const float *gb, *ub;
    bool clamped;
    float limit, alpha;
} moe_act_t;
/* The activation alone, of g and u with their biases added. */
__device__ __forceinline__ float moe_act_fn(const moe_act_t &a, float g, float u)
{
    if (!a.clamped) return g / (1.f + expf(-g)) * u;
    g = fminf(g, a.limit);
    u = fminf(fmaxf(u, -a.limit), a.limit);
    return (u + 1.f) * (g / (1.f + expf(-a.alpha * g)));
}
__device__ __forceinline__ float moe_act(const moe_act_t &a, int e, int r, int inter, float g, float u)
{
    if (a.gb) g += __ldg(a.gb + (size_t)e * inter + r);
    if (a.ub) u += __ldg(a.ub + (size_t)e * inter + r);
    return moe_act_fn(a, g, u);
}

/* dst[r][c] = fp16(w[r][c]) for the whole matrix, which gemm_ok takes (INT8/FP8 row scales
 * folded in; INT4 exactly as the GEMM's registers hold it). dst: w->rows x w->cols halves. */
int gemm_dequant(cudaStream_t st, __half *dst, const qmat_t *w);

/* dst[r][:] = fp16(src[rows ? rows[r] / div : r][:]) for r < n, rows of cols floats. */
int gemm_to_half(cudaStream_t st, __half *dst, const float *src, const int32_t *rows, int div, int n, int cols);

/* ys[i][m][n] = x[m] . ws[i][n] (+ biases[i][n]) for m < M and i < count, or += with accum;
 * rows of ws[i]->rows floats. x: [M][cols] fp16, the matrices' common column count. Up to 3
 * matrices of one format run in one launch (q, k and v: one grid, not three small ones). sms:
 * the device's multiprocessors (the tile height, and whether k is split in parts, depend on
 * how many blocks fill it). part: device room for part_floats floats that a launch with k
 * split keeps its parts' sums in (NULL, 0: k is never split); nothing else may use it while
 * this call's launches run. */
int gemm_plain(cudaStream_t st, int sms, int count, float *const *ys, const __half *x, int M, const qmat_t *const *ws,
               const float *const *biases, bool accum, float *part, size_t part_floats);

/* Grouped over experts: tile i < *n_tiles is tiles[i] = (expert e, first row p0) and covers
 * rows p0 .. min(p0 + GEMM_BM, offsets[e + 1]) - 1 of x (and of the output).
 *   swiglu: h[p][r] = fp16(act(gate_e[r] . x[p], up_e[r] . x[p])), r < inter, x: [P][hidden],
 *           act: moe_act with *act (NULL: plain SwiGLU)
 *   else:   y[p][r] = down_e[r] . x[p], r < hidden, x: [P][inter] (act unused)
 * Experts with gate.data == NULL are skipped. max_tiles bounds *n_tiles (the grid). */
int gemm_moe(cudaStream_t st, bool swiglu, const __half *x, float *y, __half *h, int hidden, int inter, wfmt_t fmt,
             const cuda_expert_t *experts, const int2 *tiles, const int32_t *n_tiles, const int32_t *offsets,
             int max_tiles, const moe_act_t *act);
/* The down projection (gemm_moe without swiglu, P rows) with k split in parts when its tiles
 * fill less than a wave of the sms multiprocessors: each part's sums go to part (room for
 * part_floats floats), then y is their sum, in part order (deterministic). */
int gemm_moe_down(cudaStream_t st, int sms, const __half *x, float *y, int hidden, int inter, wfmt_t fmt,
                  const cuda_expert_t *experts, const int2 *tiles, const int32_t *n_tiles, const int32_t *offsets,
                  int max_tiles, int P, float *part, size_t part_floats);
