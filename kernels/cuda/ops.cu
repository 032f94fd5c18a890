/* ops.cu - RMSNorm, gate top-k, RoPE with the paged KV write, attention, embedding, add, argmax. */
#include <float.h>

#include "kernels/cuda/qdot.cuh"

/* ---- RMSNorm: one block per row; each thread keeps its (at most RMS_PER_THREAD) float4s in
 * registers between the sum of squares and the scaling, so x is read once ---- */
#define RMS_PER_THREAD 4
__global__ void k_rmsnorm(float *y, const float *x, const float *w, int dim, float eps)
{
    const float *xr = x + (size_t)blockIdx.x * dim;
    float *yr = y + (size_t)blockIdx.x * dim;
    __shared__ float red[32];
    const bool vec = dim % 4 == 0 && dim / 4 <= RMS_PER_THREAD * (int)blockDim.x;
    float4 v[RMS_PER_THREAD];
    float ss = 0.f;
    if (vec) {
#pragma unroll
        for (int k = 0; k < RMS_PER_THREAD; k++) {
            const int i = threadIdx.x + k * blockDim.x;
            v[k] = i < dim / 4 ? ((const float4 *)xr)[i] : make_float4(0.f, 0.f, 0.f, 0.f);
            ss += v[k].x * v[k].x + v[k].y * v[k].y + v[k].z * v[k].z + v[k].w * v[k].w;
        }
    } else {
        for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
    }
    ss = warp_sum(ss);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
    __syncthreads();
    if (threadIdx.x < 32) {
        float r = threadIdx.x < (blockDim.x >> 5) ? red[threadIdx.x] : 0.f;
        r = warp_sum(r);
        if (threadIdx.x == 0) red[0] = r;
    }
    __syncthreads();
    const float inv = rsqrtf(red[0] / (float)dim + eps);
    if (vec) {
#pragma unroll
        for (int k = 0; k < RMS_PER_THREAD; k++) {
            const int i = threadIdx.x + k * blockDim.x;
            if (i < dim / 4) {
                const float4 g = ((const float4 *)w)[i];
                ((float4 *)yr)[i] = make_float4(v[k].x * inv * g.x, v[k].y * inv * g.y, v[k].z * inv * g.z, v[k].w * inv * g.w);
            }
        }
    } else {
        for (int i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = xr[i] * inv * w[i];
    }
}

extern "C" int cuda_rmsnorm(cuda_ctx_t *c, float *y, const float *x, const float *w, int n, int dim, float eps)
{
    if (n <= 0) return 0;
    /* enough threads that a row is one float4 each (up to 4096 columns), then up to 4 each */
    int threads = dim / 4 < 1024 ? (dim / 4 + 31) / 32 * 32 : 1024;
    if (threads < 32) threads = 32;
    k_rmsnorm<<<n, threads, 0, c->stream>>>(y, x, w, dim, eps);
    CUDA_LAUNCH_CHECK();
    return 0;
}

/* ---- Gate: one warp per token; softmax then iterative top-k (ties to the lower index) ---- */
#define GATE_MAX_E 1024
__global__ void k_gate_topk(const float *logits, int n, int E, int top_k, bool renorm, int32_t *idx, float *weight)
{
    const int t = blockIdx.x;
    const int lane = threadIdx.x;
    __shared__ float p[GATE_MAX_E];
    const float *l = logits + (size_t)t * E;
    float m = -FLT_MAX;
    for (int e = lane; e < E; e += 32) m = fmaxf(m, l[e]);
    m = warp_max(m);
    float s = 0.f;
    for (int e = lane; e < E; e += 32) {
        p[e] = expf(l[e] - m);
        s += p[e];
    }
    s = warp_sum(s);
    __syncwarp();
    for (int e = lane; e < E; e += 32) p[e] /= s;
    __syncwarp();
    float sel_sum = 0.f;
    for (int k = 0; k < top_k; k++) {
        float bv = -1.f;
        int bi = E;
        for (int e = lane; e < E; e += 32)
            if (p[e] > bv) {
                bv = p[e];
                bi = e;
            }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) {
                bv = ov;
                bi = oi;
            }
        }
        if (lane == 0) {
            idx[(size_t)t * top_k + k] = bi;
            weight[(size_t)t * top_k + k] = bv;
            p[bi] = -2.f;
        }
        sel_sum += bv;
        __syncwarp();
    }
    if (renorm && lane < top_k) weight[(size_t)t * top_k + lane] /= sel_sum;
}

extern "C" int cuda_gate_topk(cuda_ctx_t *c, const float *logits, int n, int n_experts, int top_k, bool renorm,
                              int32_t *idx, float *weight)
{
    if (n <= 0) return 0;
    if (n_experts > GATE_MAX_E || top_k > 32 || top_k > n_experts || top_k <= 0) {
        log_error("cuda_gate_topk: unsupported n_experts=%d top_k=%d", n_experts, top_k);
        return STRATA_EINVAL_INPUT;
    }
    k_gate_topk<<<n, 32, 0, c->stream>>>(logits, n, n_experts, top_k, renorm, idx, weight);
    CUDA_LAUNCH_CHECK();
    return 0;
}

/* ---- Paged KV ---- */
__device__ __forceinline__ size_t kv_off(const int32_t *bt, int max_blocks, int seq, int pos, int kvh, int n_kv,
                                         int hd, int bs)
{
    const int blk = bt[(size_t)seq * max_blocks + pos / bs];
    return (((size_t)blk * n_kv + kvh) * bs + pos % bs) * hd;
}

/* RoPE on q and k, then k and v into the paged caches: one block per (token, head), heads
 * 0 .. n_heads-1 of q, then n_kv of k (whose block also writes k and v to the cache). */
__global__ void k_rope_kv(float *q, float *k, const float *v, int n_heads, int n_kv, int hd, int rot_dim,
                          const int32_t *pos, const float *inv_freq, float attn_factor, const float *q_norm,
                          const float *k_norm, float eps, float *kc, float *vc, const int32_t *seq, const int32_t *bt,
                          int max_blocks, int bs)
{
    const int t = blockIdx.x, h = blockIdx.y;
    const bool is_k = h >= n_heads;
    const int kvh = h - n_heads;
    float *x = is_k ? k + ((size_t)t * n_kv + kvh) * hd : q + ((size_t)t * n_heads + h) * hd;
    const float *nw = is_k ? k_norm : q_norm;
    if (nw) { /* per-head RMSNorm first (Qwen3's q_norm / k_norm) */
        __shared__ float red[32];
        float ss = 0.f;
        for (int d = threadIdx.x; d < hd; d += blockDim.x) ss += x[d] * x[d];
        ss = warp_sum(ss);
        if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
        __syncthreads();
        float tot = 0.f;
        for (int w = 0; w < (int)(blockDim.x >> 5); w++) tot += red[w];
        const float inv = rsqrtf(tot / (float)hd + eps);
        for (int d = threadIdx.x; d < hd; d += blockDim.x) x[d] = x[d] * inv * nw[d];
        __syncthreads();
    }
    const int half = rot_dim / 2;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float s, co;
        sincosf((float)pos[t] * inv_freq[i], &s, &co);
        co *= attn_factor;
        s *= attn_factor;
        const float x1 = x[i], x2 = x[i + half];
        x[i] = x1 * co - x2 * s;
        x[i + half] = x2 * co + x1 * s;
    }
    if (!is_k) return;
    __syncthreads();
    const size_t dst = kv_off(bt, max_blocks, seq[t], pos[t], kvh, n_kv, hd, bs);
    const float *vr = v + ((size_t)t * n_kv + kvh) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        kc[dst + d] = x[d];
        vc[dst + d] = vr[d];
    }
}

extern "C" int cuda_rope_kv(cuda_ctx_t *c, float *q, float *k, const float *v, int n, int n_heads, int n_kv_heads,
                            int head_dim, int rot_dim, const int32_t *pos, const float *inv_freq, float attn_factor,
                            const float *q_norm, const float *k_norm, float eps, float *k_cache, float *v_cache,
                            const int32_t *seq, const int32_t *bt, int max_blocks, int block_size)
{
    if (n <= 0) return 0;
    k_rope_kv<<<dim3(n, n_heads + n_kv_heads), 64, 0, c->stream>>>(q, k, v, n_heads, n_kv_heads, head_dim, rot_dim,
                                                                    pos, inv_freq, attn_factor, q_norm, k_norm, eps,
                                                                    k_cache, v_cache, seq, bt, max_blocks, block_size);
    CUDA_LAUNCH_CHECK();
    return 0;
}

/* Attention: one block of ATT_WARPS warps per (token, head). Each warp takes every
 * ATT_WARPS-th position with an online softmax (running max m, sum l, acc over the lane's
 * dims d = lane + 32 i); the warps' partial states merge through shared memory. */
#define ATT_WARPS 16
#define ATT_MAX_DPL 8 /* head_dim <= 256 */
__global__ void k_attention(float *out, const float *q, const float *kc, const float *vc, const int32_t *seq,
                            const int32_t *pos, const int32_t *bt, int max_blocks, int n_heads, int n_kv, int hd,
                            int bs, float scale)
{
    const int t = blockIdx.x, h = blockIdx.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int kvh = h / (n_heads / n_kv);
    const int sq = seq[t], n_ctx = pos[t] + 1;
    const float *qv = q + ((size_t)t * n_heads + h) * hd;
    float qr[ATT_MAX_DPL], acc[ATT_MAX_DPL];
#pragma unroll
    for (int i = 0; i < ATT_MAX_DPL; i++) {
        int d = lane + 32 * i;
        qr[i] = d < hd ? qv[d] * scale : 0.f;
        acc[i] = 0.f;
    }
    float m = -FLT_MAX, l = 0.f;
    for (int p = warp; p < n_ctx; p += ATT_WARPS) {
        const size_t o = kv_off(bt, max_blocks, sq, p, kvh, n_kv, hd, bs);
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < ATT_MAX_DPL; i++) {
            int d = lane + 32 * i;
            if (d < hd) s += qr[i] * kc[o + d];
        }
        s = warp_sum(s);
        const float mn = fmaxf(m, s);
        const float corr = expf(m - mn), e = expf(s - mn);
        l = l * corr + e;
#pragma unroll
        for (int i = 0; i < ATT_MAX_DPL; i++) {
            int d = lane + 32 * i;
            if (d < hd) acc[i] = acc[i] * corr + e * vc[o + d];
        }
        m = mn;
    }
    __shared__ float sm[ATT_WARPS], sl[ATT_WARPS];
    __shared__ float sacc[ATT_WARPS][ATT_MAX_DPL * 32];
    if (lane == 0) {
        sm[warp] = m;
        sl[warp] = l;
    }
#pragma unroll
    for (int i = 0; i < ATT_MAX_DPL; i++) sacc[warp][lane + 32 * i] = acc[i];
    __syncthreads();
    if (warp == 0) {
        float M = -FLT_MAX;
        for (int w = 0; w < ATT_WARPS; w++)
            if (sl[w] > 0.f) M = fmaxf(M, sm[w]);
        float L = 0.f, f[ATT_WARPS];
        for (int w = 0; w < ATT_WARPS; w++) {
            f[w] = sl[w] > 0.f ? expf(sm[w] - M) : 0.f;
            L += sl[w] * f[w];
        }
        float *ov = out + ((size_t)t * n_heads + h) * hd;
#pragma unroll
        for (int i = 0; i < ATT_MAX_DPL; i++) {
            int d = lane + 32 * i;
            if (d < hd) {
                float a = 0.f;
                for (int w = 0; w < ATT_WARPS; w++) a += sacc[w][d] * f[w];
                ov[d] = a / L;
            }
        }
    }
}

extern "C" int cuda_attention(cuda_ctx_t *c, float *out, const float *q, const float *k_cache, const float *v_cache,
                              int n, const int32_t *seq, const int32_t *pos, const int32_t *bt, int max_blocks,
                              int n_heads, int n_kv_heads, int head_dim, int block_size, float scale)
{
    if (n <= 0) return 0;
    if (head_dim > 32 * ATT_MAX_DPL || n_kv_heads <= 0 || n_heads % n_kv_heads) {
        log_error("cuda_attention: unsupported head_dim=%d heads=%d kv_heads=%d", head_dim, n_heads, n_kv_heads);
        return STRATA_EINVAL_INPUT;
    }
    k_attention<<<dim3(n, n_heads), 32 * ATT_WARPS, 0, c->stream>>>(out, q, k_cache, v_cache, seq, pos, bt,
                                                                      max_blocks, n_heads, n_kv_heads, head_dim,
                                                                      block_size, scale);
    CUDA_LAUNCH_CHECK();
    return 0;
}

/* ---- Embedding, add, argmax ---- */
__global__ void k_embed(float *out, qmat_t e, const int32_t *tokens, int n)
{
    const int t = blockIdx.x;
    const int tok = tokens[t];
    for (int d = threadIdx.x; d < e.cols; d += blockDim.x) out[(size_t)t * e.cols + d] = q_elem(e, tok, d);
}

extern "C" int cuda_embed(cuda_ctx_t *c, float *out, const qmat_t *embed, const int32_t *tokens, int n)
{
    if (n <= 0) return 0;
    k_embed<<<n, 256, 0, c->stream>>>(out, *embed, tokens, n);
    CUDA_LAUNCH_CHECK();
    return 0;
}

__global__ void k_add(float *y, const float *x, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += x[i];
}

extern "C" int cuda_add(cuda_ctx_t *c, float *y, const float *x, size_t n)
{
    if (!n) return 0;
    k_add<<<cdiv((long)n, 256), 256, 0, c->stream>>>(y, x, n);
    CUDA_LAUNCH_CHECK();
    return 0;
}

__global__ void k_argmax(const float *logits, int vocab, int32_t *ids)
{
    const float *l = logits + (size_t)blockIdx.x * vocab;
    float bv = -FLT_MAX;
    int bi = 0x7fffffff;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x)
        if (l[i] > bv) {
            bv = l[i];
            bi = i;
        }
    __shared__ float sv[32];
    __shared__ int si[32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > bv || (ov == bv && oi < bi)) {
            bv = ov;
            bi = oi;
        }
    }
    if ((threadIdx.x & 31) == 0) {
        sv[threadIdx.x >> 5] = bv;
        si[threadIdx.x >> 5] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); w++)
            if (sv[w] > bv || (sv[w] == bv && si[w] < bi)) {
                bv = sv[w];
                bi = si[w];
            }
        ids[blockIdx.x] = bi;
    }
}

extern "C" int cuda_argmax(cuda_ctx_t *c, const float *logits, int n, int vocab, int32_t *ids)
{
    if (n <= 0) return 0;
    k_argmax<<<n, 256, 0, c->stream>>>(logits, vocab, ids);
    CUDA_LAUNCH_CHECK();
    return 0;
}

__global__ void k_add_sigmoid_scaled(float *y, const float *s, const float *g, int n, int dim)
{
    const int t = blockIdx.x;
    const float w = 1.f / (1.f + expf(-g[t]));
    for (int d = threadIdx.x; d < dim; d += blockDim.x) y[(size_t)t * dim + d] += w * s[(size_t)t * dim + d];
}

extern "C" int cuda_add_sigmoid_scaled(cuda_ctx_t *c, float *y, const float *s, const float *g, int n, int dim)
{
    if (n <= 0) return 0;
    k_add_sigmoid_scaled<<<n, 256, 0, c->stream>>>(y, s, g, n, dim);
    CUDA_LAUNCH_CHECK();
    return 0;
}

__global__ void k_silu_mul(float *h, const float *g, const float *u, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float a = g[i];
        h[i] = a / (1.f + expf(-a)) * u[i];
    }
}

extern "C" int cuda_ffn_swiglu(cuda_ctx_t *c, float *out, const float *x, int n, const qmat_t *gate, const qmat_t *up,
                               const qmat_t *down, float *scratch)
{
    if (n <= 0) return 0;
    const size_t ni = (size_t)n * gate->rows;
    float *g = scratch, *u = scratch + ni, *h = scratch + 2 * ni;
    int rc;
    if ((rc = cuda_matmul(c, g, x, n, gate, NULL))) return rc;
    if ((rc = cuda_matmul(c, u, x, n, up, NULL))) return rc;
    k_silu_mul<<<cdiv((long)ni, 256), 256, 0, c->stream>>>(h, g, u, ni);
    CUDA_LAUNCH_CHECK();
    return cuda_matmul(c, out, h, n, down, NULL);
}

__global__ void k_gather_rows(float *dst, const float *src, const int32_t *rows, int dim)
{
    const float *s = src + (size_t)rows[blockIdx.x] * dim;
    for (int d = threadIdx.x; d < dim; d += blockDim.x) dst[(size_t)blockIdx.x * dim + d] = s[d];
}

extern "C" int cuda_gather_rows(cuda_ctx_t *c, float *dst, const float *src, const int32_t *rows, int n, int dim)
{
    if (n <= 0) return 0;
    k_gather_rows<<<n, 256, 0, c->stream>>>(dst, src, rows, dim);
    CUDA_LAUNCH_CHECK();
    return 0;
}
