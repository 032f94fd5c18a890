/* moe.cu - the grouped expert FFN: tokens regrouped by expert, then one pass over each active
 * expert's weights for all of its tokens (fused dequantization and SwiGLU), then a weighted,
 * deterministic combine in top-k order. */
#include "kernels/cuda/qdot.cuh"

#define MOE_MAX_EXPERTS 1024

static size_t s_al(size_t b) { return (b + 255) & ~(size_t)255; }

/* Scratch layout, in order: counts[E], offsets[E+1], perm[P], inv[P], xs[P][hidden],
 * hs[P][inter], os[P][hidden] (P = n * top_k), each 256-byte aligned. */
typedef struct {
    int32_t *counts, *offsets, *perm, *inv;
    float *xs, *hs, *os;
    int8_t *q;     /* [P][wide] int8 activations (xs, then hs) for the integer path */
    float *qd;     /* [P][wide/32] block scales */
    int32_t *qs;   /* [P][wide/32] block sums of q */
} moe_scratch_t;

static size_t s_layout(moe_scratch_t *m, void *base, int n, int top_k, int hidden, int inter, int E)
{
    size_t P = (size_t)n * top_k, off = 0;
    char *b = (char *)base;
#define TAKE(field, type, count)                                   \
    do {                                                           \
        if (m) m->field = (type *)(b + off);                       \
        off += s_al(sizeof(type) * (size_t)(count));               \
    } while (0)
    TAKE(counts, int32_t, E);
    TAKE(offsets, int32_t, E + 1);
    TAKE(perm, int32_t, P);
    TAKE(inv, int32_t, P);
    TAKE(xs, float, P * hidden);
    TAKE(hs, float, P * inter);
    TAKE(os, float, P * hidden);
    TAKE(q, int8_t, P * hidden);
    TAKE(qd, float, P * hidden / 32 + 1);
    TAKE(qs, int32_t, P * hidden / 32 + 1);
#undef TAKE
    return off;
}

extern "C" size_t cuda_moe_scratch_bytes(int n, int top_k, int hidden, int inter, int n_experts)
{
    int wide = hidden > inter ? hidden : inter;
    return s_layout(NULL, NULL, n, top_k, wide, wide, n_experts);
}

/* One thread per expert: count, prefix-sum, then a stable (token-ordered) placement. */
__global__ void k_moe_route(const int32_t *idx, int P, int E, int32_t *counts, int32_t *offsets, int32_t *perm,
                            int32_t *inv)
{
    const int e = threadIdx.x;
    int cnt = 0;
    if (e < E)
        for (int p = 0; p < P; p++) cnt += idx[p] == e;
    if (e < E) counts[e] = cnt;
    __syncthreads();
    if (e == 0) {
        int acc = 0;
        for (int i = 0; i < E; i++) {
            offsets[i] = acc;
            acc += counts[i];
        }
        offsets[E] = acc;
    }
    __syncthreads();
    if (e < E) {
        int pos = offsets[e];
        for (int p = 0; p < P; p++)
            if (idx[p] == e) {
                perm[pos] = p;
                inv[p] = pos;
                pos++;
            }
    }
}

__global__ void k_moe_gather(float *xs, const float *x, const int32_t *perm, int top_k, int hidden, int P)
{
    const int p = blockIdx.x;
    if (p >= P) return;
    const float *src = x + (size_t)(perm[p] / top_k) * hidden;
    for (int d = threadIdx.x; d < hidden; d += blockDim.x) xs[(size_t)p * hidden + d] = src[d];
}

/* Integer path: gather token rows by expert straight into int8 blocks. */
__global__ void k_moe_gather_q8(int8_t *q, float *d, int32_t *s, const float *x, const int32_t *perm, int top_k,
                                int hidden)
{
    const int p = blockIdx.x;
    const size_t nb = hidden / 32;
    q8_quant_row(q + (size_t)p * hidden, d + p * nb, s + p * nb, x + (size_t)(perm[p] / top_k) * hidden, hidden);
}

template <int FMT, int NT>
__global__ void k_moe_gate_up_q8(float *hs, const int8_t *q, const float *qd, const int32_t *qs,
                                 const cuda_expert_t *experts, const int32_t *counts, const int32_t *offsets, int hidden,
                                 int inter)
{
    const int e = blockIdx.y;
    const int r = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int cnt = counts[e];
    if (r >= inter || cnt == 0) return;
    const cuda_expert_t *ex = experts + e;
    if (!ex->gate.data) return;
    const int off = offsets[e], nb = hidden / 32;
    for (int t0 = 0; t0 < cnt; t0 += NT) {
        const int m = cnt - t0 < NT ? cnt - t0 : NT;
        const size_t p0 = (size_t)(off + t0);
        float g[NT], u[NT];
        q8_row_dot<FMT, NT>(ex->gate, r, q + p0 * hidden, qd + p0 * nb, qs + p0 * nb, m, hidden, g);
        q8_row_dot<FMT, NT>(ex->up, r, q + p0 * hidden, qd + p0 * nb, qs + p0 * nb, m, hidden, u);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float gs = warp_sum(g[t]), us = warp_sum(u[t]);
            if (t < m && (threadIdx.x & 31) == 0) hs[(p0 + t) * inter + r] = gs / (1.f + expf(-gs)) * us;
        }
    }
}

__global__ void k_moe_quant_rows(int8_t *q, float *d, int32_t *s, const float *h, int cols, const int32_t *offsets,
                                 int E)
{
    const int p = blockIdx.x;
    if (p >= offsets[E]) return;
    const size_t nb = cols / 32;
    q8_quant_row(q + (size_t)p * cols, d + p * nb, s + p * nb, h + (size_t)p * cols, cols);
}

template <int FMT, int NT>
__global__ void k_moe_down_q8(float *os, const int8_t *q, const float *qd, const int32_t *qs,
                              const cuda_expert_t *experts, const int32_t *counts, const int32_t *offsets, int hidden,
                              int inter)
{
    const int e = blockIdx.y;
    const int r = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int cnt = counts[e];
    if (r >= hidden || cnt == 0) return;
    const cuda_expert_t *ex = experts + e;
    if (!ex->gate.data) return;
    const int off = offsets[e], nb = inter / 32;
    for (int t0 = 0; t0 < cnt; t0 += NT) {
        const int m = cnt - t0 < NT ? cnt - t0 : NT;
        const size_t p0 = (size_t)(off + t0);
        float acc[NT];
        q8_row_dot<FMT, NT>(ex->down, r, q + p0 * inter, qd + p0 * nb, qs + p0 * nb, m, inter, acc);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float v = warp_sum(acc[t]);
            if (t < m && (threadIdx.x & 31) == 0) os[(p0 + t) * hidden + r] = v;
        }
    }
}

template <int FMT, int NT>
static int s_moe_launch_q8(cudaStream_t st, const moe_scratch_t *s, const cuda_expert_t *experts, int E, int hidden,
                           int inter, int P)
{
    dim3 g1(cdiv((long)inter * 32, 256), E), g2(cdiv((long)hidden * 32, 256), E);
    k_moe_gate_up_q8<FMT, NT><<<g1, 256, 0, st>>>(s->hs, s->q, s->qd, s->qs, experts, s->counts, s->offsets, hidden,
                                                    inter);
    CUDA_LAUNCH_CHECK();
    k_moe_quant_rows<<<P, 256, 0, st>>>(s->q, s->qd, s->qs, s->hs, inter, s->offsets, E);
    CUDA_LAUNCH_CHECK();
    k_moe_down_q8<FMT, NT><<<g2, 256, 0, st>>>(s->os, s->q, s->qd, s->qs, experts, s->counts, s->offsets, hidden, inter);
    CUDA_LAUNCH_CHECK();
    return 0;
}

template <int FMT>
static int s_moe_q8(cudaStream_t st, int n, const moe_scratch_t *s, const cuda_expert_t *experts, int E, int hidden,
                    int inter, int P)
{
    if (n <= 1) return s_moe_launch_q8<FMT, 1>(st, s, experts, E, hidden, inter, P);
    if (n <= 4) return s_moe_launch_q8<FMT, 4>(st, s, experts, E, hidden, inter, P);
    return s_moe_launch_q8<FMT, 16>(st, s, experts, E, hidden, inter, P);
}

/* hs[p][r] = silu(gate_e[r] . xs[p]) * (up_e[r] . xs[p]) for every pair p of expert e = blockIdx.y. */
template <int FMT, int NT>
__global__ void k_moe_gate_up(float *hs, const float *xs, const cuda_expert_t *experts, const int32_t *counts,
                              const int32_t *offsets, int hidden, int inter, bool vec)
{
    const int e = blockIdx.y;
    const int r = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int cnt = counts[e];
    if (r >= inter || cnt == 0) return;
    const cuda_expert_t ex = experts[e];
    if (!ex.gate.data) return;
    const int off = offsets[e];
    for (int t0 = 0; t0 < cnt; t0 += NT) {
        const int m = cnt - t0 < NT ? cnt - t0 : NT;
        const float *x = xs + (size_t)(off + t0) * hidden;
        float g[NT], u[NT];
        q_row_dot<FMT, NT>(ex.gate, r, x, m, hidden, vec, g);
        q_row_dot<FMT, NT>(ex.up, r, x, m, hidden, vec, u);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float gs = warp_sum(g[t]), us = warp_sum(u[t]);
            if (t < m && (threadIdx.x & 31) == 0)
                hs[(size_t)(off + t0 + t) * inter + r] = gs / (1.f + expf(-gs)) * us;
        }
    }
}

/* os[p][r] = down_e[r] . hs[p] */
template <int FMT, int NT>
__global__ void k_moe_down(float *os, const float *hs, const cuda_expert_t *experts, const int32_t *counts,
                           const int32_t *offsets, int hidden, int inter, bool vec)
{
    const int e = blockIdx.y;
    const int r = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int cnt = counts[e];
    if (r >= hidden || cnt == 0) return;
    const cuda_expert_t ex = experts[e];
    if (!ex.gate.data) return;
    const int off = offsets[e];
    for (int t0 = 0; t0 < cnt; t0 += NT) {
        const int m = cnt - t0 < NT ? cnt - t0 : NT;
        float acc[NT];
        q_row_dot<FMT, NT>(ex.down, r, hs + (size_t)(off + t0) * inter, m, inter, vec, acc);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float s = warp_sum(acc[t]);
            if (t < m && (threadIdx.x & 31) == 0) os[(size_t)(off + t0 + t) * hidden + r] = s;
        }
    }
}

/* out[t] += sum_k weight[t][k] * os[inv[t][k]], in k order (deterministic). */
__global__ void k_moe_combine(float *out, const float *os, const int32_t *inv, const int32_t *idx,
                              const float *weight, const cuda_expert_t *experts, int top_k, int hidden)
{
    const int t = blockIdx.x;
    for (int d = threadIdx.x; d < hidden; d += blockDim.x) {
        float acc = out[(size_t)t * hidden + d];
        for (int k = 0; k < top_k; k++) {
            const int p = t * top_k + k;
            if (!experts[idx[p]].gate.data) continue;
            acc += weight[p] * os[(size_t)inv[p] * hidden + d];
        }
        out[(size_t)t * hidden + d] = acc;
    }
}

template <int FMT, int NT>
static int s_moe_launch(cudaStream_t st, const moe_scratch_t *s, const cuda_expert_t *experts, int E, int hidden,
                        int inter, bool vec_h, bool vec_i)
{
    dim3 g1(cdiv((long)inter * 32, 256), E), g2(cdiv((long)hidden * 32, 256), E);
    k_moe_gate_up<FMT, NT><<<g1, 256, 0, st>>>(s->hs, s->xs, experts, s->counts, s->offsets, hidden, inter, vec_h);
    CUDA_LAUNCH_CHECK();
    k_moe_down<FMT, NT><<<g2, 256, 0, st>>>(s->os, s->hs, experts, s->counts, s->offsets, hidden, inter, vec_i);
    CUDA_LAUNCH_CHECK();
    return 0;
}

template <int FMT>
static int s_moe_fmt(cudaStream_t st, int n, const moe_scratch_t *s, const cuda_expert_t *experts, int E,
                     int hidden, int inter)
{
    constexpr int C = qfmt<FMT>::COLS;
    const bool vec_h = hidden % C == 0 && q_row_bytes(FMT, hidden) % 16 == 0;
    const bool vec_i = inter % C == 0 && q_row_bytes(FMT, inter) % 16 == 0;
    if (n <= 1) return s_moe_launch<FMT, 1>(st, s, experts, E, hidden, inter, vec_h, vec_i);
    if (n <= 4) return s_moe_launch<FMT, 4>(st, s, experts, E, hidden, inter, vec_h, vec_i);
    return s_moe_launch<FMT, 8>(st, s, experts, E, hidden, inter, vec_h, vec_i);
}

extern "C" int cuda_moe_ffn(cuda_ctx_t *c, float *out, const float *x, int n, int hidden, int inter, wfmt_t fmt,
                            const cuda_expert_t *experts_dev, int n_experts, const int32_t *idx,
                            const float *weight, int top_k, void *scratch)
{
    if (n <= 0) return 0;
    if (n_experts <= 0 || n_experts > MOE_MAX_EXPERTS || top_k <= 0 || top_k > n_experts) {
        log_error("cuda_moe_ffn: bad expert counts (n_experts=%d top_k=%d)", n_experts, top_k);
        return STRATA_EINVAL_INPUT;
    }
    moe_scratch_t s;
    int wide = hidden > inter ? hidden : inter;
    s_layout(&s, scratch, n, top_k, wide, wide, n_experts);
    const int P = n * top_k;
    cudaStream_t st = c->stream;
    k_moe_route<<<1, n_experts, 0, st>>>(idx, P, n_experts, s.counts, s.offsets, s.perm, s.inv);
    CUDA_LAUNCH_CHECK();
    int rc;
    if ((fmt == WF_INT4 || fmt == WF_INT8) && hidden % 32 == 0 && inter % 32 == 0) {
        k_moe_gather_q8<<<P, 256, 0, st>>>(s.q, s.qd, s.qs, x, s.perm, top_k, hidden);
        CUDA_LAUNCH_CHECK();
        rc = fmt == WF_INT4 ? s_moe_q8<WF_INT4>(st, n, &s, experts_dev, n_experts, hidden, inter, P)
                            : s_moe_q8<WF_INT8>(st, n, &s, experts_dev, n_experts, hidden, inter, P);
        if (rc) return rc;
        k_moe_combine<<<n, 128, 0, st>>>(out, s.os, s.inv, idx, weight, experts_dev, top_k, hidden);
        CUDA_LAUNCH_CHECK();
        return 0;
    }
    k_moe_gather<<<P, 128, 0, st>>>(s.xs, x, s.perm, top_k, hidden, P);
    CUDA_LAUNCH_CHECK();
    switch (fmt) {
    case WF_F32: rc = s_moe_fmt<WF_F32>(st, n, &s, experts_dev, n_experts, hidden, inter); break;
    case WF_BF16: rc = s_moe_fmt<WF_BF16>(st, n, &s, experts_dev, n_experts, hidden, inter); break;
    case WF_INT8: rc = s_moe_fmt<WF_INT8>(st, n, &s, experts_dev, n_experts, hidden, inter); break;
    case WF_FP8: rc = s_moe_fmt<WF_FP8>(st, n, &s, experts_dev, n_experts, hidden, inter); break;
    case WF_INT4: rc = s_moe_fmt<WF_INT4>(st, n, &s, experts_dev, n_experts, hidden, inter); break;
    default: log_error("cuda_moe_ffn: unknown weight format %d", (int)fmt); return STRATA_EINVAL_INPUT;
    }
    if (rc) return rc;
    k_moe_combine<<<n, 128, 0, st>>>(out, s.os, s.inv, idx, weight, experts_dev, top_k, hidden);
    CUDA_LAUNCH_CHECK();
    return 0;
}
