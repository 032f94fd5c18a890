/* ops.cu - RMSNorm, gate top-k, RoPE with the paged KV write, attention, embedding, add, argmax. */
#include <float.h>

#include <cooperative_groups.h>

#include "kernels/cuda/qdot.cuh"

/* ---- RMSNorm: one block per row; each thread keeps its (at most RMS_PER_THREAD) float4s in
 * registers between the sum of squares and the scaling, so x is read once (rms_row_f4) ---- */
__global__ void __launch_bounds__(1024) k_rmsnorm(float *y, const float *x, const float *w, int dim, float eps, int8_t *q8, float *q8d,
                          int32_t *q8s)
{
    const float *xr = x + (size_t)blockIdx.x * dim;
    float *yr = y + (size_t)blockIdx.x * dim;
    if (rms_row_vec(dim)) {
        float4 v[RMS_PER_THREAD], g[RMS_PER_THREAD];
        rms_w_f4(w, dim, g);
        pdl_enter();
        float ss = 0.f;
#pragma unroll
        for (int k = 0; k < RMS_PER_THREAD; k++) {
            const int i = threadIdx.x + k * blockDim.x;
            v[k] = i < dim / 4 ? ((const float4 *)xr)[i] : make_float4(0.f, 0.f, 0.f, 0.f);
            ss += v[k].x * v[k].x + v[k].y * v[k].y + v[k].z * v[k].z + v[k].w * v[k].w;
        }
        rms_row_f4(v, ss, dim, eps, g, yr, q8, q8d, q8s);
        return;
    }
    pdl_enter();
    float ss = 0.f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
    const float inv = rsqrtf(block_sum(ss) / (float)dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = xr[i] * inv * w[i];
}

static int s_rmsnorm(cuda_ctx_t *c, float *y, const float *x, const float *w, int n, int dim, float eps, bool q8)
{
    if (n <= 0) return 0;
    launch_k(k_rmsnorm, n, rms_threads(dim), 0, c->stream, y, x, w, dim, eps, q8 ? c->q8 : NULL, c->q8d, c->q8s);
    CUDA_LAUNCH_CHECK();
    return 0;
}

extern "C" bool cuda_q8_out_ok(const cuda_ctx_t *c, int n, int dim)
{
    return c->q8 && n > 0 && n <= 16 && dim % 32 == 0 && (size_t)n * dim <= c->q8_elems;
}

extern "C" int cuda_rmsnorm(cuda_ctx_t *c, float *y, const float *x, const float *w, int n, int dim, float eps)
{
    return s_rmsnorm(c, y, x, w, n, dim, eps, false);
}

extern "C" int cuda_rmsnorm_q8(cuda_ctx_t *c, float *y, const float *x, const float *w, int n, int dim, float eps,
                               bool *q8_done)
{
    const bool q8 = q8_done && rms_q8_ok(c, n, dim);
    if (q8_done) *q8_done = q8;
    return s_rmsnorm(c, y, x, w, n, dim, eps, q8);
}

/* ---- Gate: one warp per token; softmax then iterative top-k (ties to the lower index) ---- */
__global__ void k_gate_topk(const float *logits, int n, int E, int top_k, bool renorm, int32_t *idx, float *weight)
{
    pdl_enter();
    const int t = blockIdx.x;
    gate_topk_warp(logits + (size_t)t * E, E, top_k, renorm, idx + (size_t)t * top_k, weight + (size_t)t * top_k);
}

extern "C" int cuda_gate_topk(cuda_ctx_t *c, const float *logits, int n, int n_experts, int top_k, bool renorm,
                              int32_t *idx, float *weight)
{
    if (n <= 0) return 0;
    if (n_experts > GATE_MAX_E || top_k > 32 || top_k > n_experts || top_k <= 0) {
        log_error("cuda_gate_topk: unsupported n_experts=%d top_k=%d", n_experts, top_k);
        return STRATA_EINVAL_INPUT;
    }
    launch_k(k_gate_topk, n, 32, 0, c->stream, logits, n, n_experts, top_k, renorm, idx, weight);
    CUDA_LAUNCH_CHECK();
    return 0;
}

/* ---- Paged KV ---- */
/* RoPE on q and k, then k (rotated) and v into the paged caches: a warp per (token, head), blockDim.x / 32
 * heads a block, heads 0 .. n_heads-1 of q, then n_kv of k (whose warp also writes k and v to
 * the cache). What no kernel writes (positions, block tables, frequencies, norm weights) is
 * read, and the angles computed, before the PDL wait. */
#define ROPE_MAX_HD 256
__global__ void __launch_bounds__(8 * 32)
    k_rope_kv(float *q, const float *k, const float *v, int n_heads, int n_kv, int hd, int rot_dim, const int32_t *pos,
              const float *inv_freq, float attn_factor, const float *q_norm, const float *k_norm, float eps, float *kc,
              float *vc, const int32_t *seq, const int32_t *bt, int max_blocks, int bs)
{
    const int t = blockIdx.x, h = blockIdx.y * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (h >= n_heads + n_kv) return;
    const int half = rot_dim / 2;
    const bool is_k = h >= n_heads;
    const int kvh = h - n_heads;
    const float *nw = is_k ? k_norm : q_norm;
    const float pt = (float)pos[t];
    constexpr int NI = ROPE_MAX_HD / 64, ND = ROPE_MAX_HD / 32;
    float sn[NI], cs[NI], g[ND]; /* the angles of i = lane + 32 j; the norm's weights of d = lane + 32 j */
#pragma unroll
    for (int j = 0; j < NI; j++) {
        const int i = lane + 32 * j;
        sincosf(i < half ? pt * inv_freq[i] : 0.f, &sn[j], &cs[j]);
        sn[j] *= attn_factor;
        cs[j] *= attn_factor;
    }
#pragma unroll
    for (int j = 0; j < ND; j++) {
        const int d = lane + 32 * j;
        g[j] = nw && d < hd ? nw[d] : 0.f;
    }
    const size_t dst = is_k ? kv_off(bt, max_blocks, seq[t], pos[t], kvh, n_kv, hd, bs) : 0;
    pdl_enter();
    /* the head's row (and v's) in registers with all loads in flight at once, then through
     * this warp's shared row for the rotation's pairs; every store last (a load after a store
     * that may alias it waits for the store: 2.6 against 1.7 us a layer at Mixtral's decode) */
    __shared__ float sh[8][ROPE_MAX_HD];
    float *row = sh[threadIdx.x >> 5];
    const float *x = is_k ? k + ((size_t)t * n_kv + kvh) * hd : q + ((size_t)t * n_heads + h) * hd;
    const float *vr = v + ((size_t)t * n_kv + kvh) * hd;
    float xv[ND], vv[ND];
#pragma unroll
    for (int j = 0; j < ND; j++) {
        const int d = lane + 32 * j;
        xv[j] = d < hd ? x[d] : 0.f;
        vv[j] = is_k && d < hd ? vr[d] : 0.f;
    }
    if (nw) { /* per-head RMSNorm first (Qwen3's q_norm / k_norm) */
        float ss = 0.f;
#pragma unroll
        for (int j = 0; j < ND; j++) ss += xv[j] * xv[j];
        const float inv = rsqrtf(warp_sum(ss) / (float)hd + eps);
#pragma unroll
        for (int j = 0; j < ND; j++) xv[j] = xv[j] * inv * g[j];
    }
#pragma unroll
    for (int j = 0; j < ND; j++)
        if (lane + 32 * j < hd) row[lane + 32 * j] = xv[j];
    __syncwarp();
    float r1[NI], r2[NI];
#pragma unroll
    for (int j = 0; j < NI; j++) {
        const int i = lane + 32 * j;
        if (i < half) {
            const float x1 = row[i], x2 = row[i + half];
            r1[j] = x1 * cs[j] - x2 * sn[j];
            r2[j] = x2 * cs[j] + x1 * sn[j];
        }
    }
    __syncwarp();
#pragma unroll
    for (int j = 0; j < NI; j++) {
        const int i = lane + 32 * j;
        if (i < half) {
            row[i] = r1[j];
            row[i + half] = r2[j];
        }
    }
    __syncwarp();
#pragma unroll
    for (int j = 0; j < ND; j++) {
        const int d = lane + 32 * j;
        if (d >= hd) break;
        const float o = row[d];
        if (is_k) { /* k only into the cache: nothing reads its rotated row elsewhere */
            kc[dst + d] = o;
            vc[dst + d] = vv[j];
        } else {
            q[((size_t)t * n_heads + h) * hd + d] = o;
        }
    }
}

extern "C" int cuda_rope_kv(cuda_ctx_t *c, float *q, const float *k, const float *v, int n, int n_heads, int n_kv_heads,
                            int head_dim, int rot_dim, const int32_t *pos, const float *inv_freq, float attn_factor,
                            const float *q_norm, const float *k_norm, float eps, float *k_cache, float *v_cache,
                            const int32_t *seq, const int32_t *bt, int max_blocks, int block_size)
{
    if (n <= 0) return 0;
    if (head_dim > ROPE_MAX_HD || rot_dim > head_dim) {
        log_error("cuda_rope_kv: head_dim %d (at most %d) or rot_dim %d", head_dim, ROPE_MAX_HD, rot_dim);
        return STRATA_EINVAL_INPUT;
    }
    /* decode: a block a head (measured in the graph, batch 1, Mixtral-8x7B / Qwen3-30B-A3B:
     * 1.7 / 2.0 us a layer, against 2.2 / 2.4 with 8 heads a block); prefill: 8 heads a block
     * (Mixtral, 512 tokens: 10 us a layer, against 25 with a block of 64 threads a head) */
    const int warps = n <= 16 ? 1 : 8;
    launch_k(k_rope_kv, dim3(n, cdiv(n_heads + n_kv_heads, warps)), 32 * warps, 0, c->stream, q, k, v, n_heads, n_kv_heads, head_dim, rot_dim,
                                                                    pos, inv_freq, attn_factor, q_norm, k_norm, eps,
                                                                    k_cache, v_cache, seq, bt, max_blocks, block_size);
    CUDA_LAUNCH_CHECK();
    return 0;
}

/* ---- Attention (fp32, any rows; the forward pass takes it for decode-shaped steps) ----
 * Flash-decoding over the paged cache. A block takes one row t, hb query heads of one GQA group
 * (so a K/V row is read once for all of them) and one split z of the row's context c0 .. n_ctx - 1
 * (c0 = 0, or with a sliding window the window's start): positions [c0 + z span, c0 + z span +
 * span), span = ceil((n_ctx - c0) / splits). Grid (n, n_kv * head chunks, splits).
 * The splits of a (row, head chunk) form one thread-block cluster (sm_90) and merge their
 * softmax states through distributed shared memory: no global scratch, and the split count is
 * chosen on the host without the positions (they are on the device and change between replays
 * of a graph); a split past the context just contributes an empty state.
 *
 * A block copies its positions' K and V rows, ATT_CH / NV positions a stage, into shared memory
 * with cp.async, nstage stages deep (the next ones are in flight while one is computed). Warp w
 * takes positions w, w + 8, .. of each stage and keeps its own online softmax for every head:
 *   q.k: a lane is (head slot hh = lane / L, dim slice ds = lane % L). It keeps its head's q at
 *     float4s ds, ds + L, .. in registers, prescaled by scale * log2(e) so the softmax runs on
 *     exp2, and reads the same float4s of the k row (one broadcast for the L-lane groups); an
 *     L-lane butterfly leaves the score in all of the group's lanes.
 *   softmax: every lane updates its head's running max m and sum l in registers (the group's
 *     lanes hold the same values); the probabilities and the rescale factor of each head go to
 *     a warp-private table.
 *   p.v: a lane owns float4 columns lane + 32 k of the v row (coalesced) for all head slots.
 * After the last stage the 8 warps' (m, l, acc) merge through shared memory into the block's
 * state; the cluster syncs; each warp of the cluster then finishes 32-column blocks of the
 * output: it combines the splits' states (from their shared memory), and with sinks the head's
 * sink as one more term of the sum with no value, writes out and, when
 * asked, the block's int8 quantization (q8_quant_val on the same floats); a second cluster sync
 * keeps every block's shared memory alive until the others have read it. */
#define ATT_WARPS 8
#define ATT_THREADS (32 * ATT_WARPS)
#define ATT_MAX_DPL 8    /* head_dim <= 32 * ATT_MAX_DPL */
#define ATT_MAX_HB 8     /* query heads a block at head_dim <= 128 (half that up to 256) */
#define ATT_CH 32        /* positions a stage at head_dim <= 128 (half that up to 256) */
#define ATT_MAX_SPLITS 8 /* splits of a context: the largest portable cluster */
#define ATT_LOG2E 1.4426950408889634f

/* cp.async copies global -> shared, without a "memory" clobber: a copy is ordered after the
 * reads of its buffer's previous stage by the __syncthreads before it, and the reads of its data
 * after it by s_cp_wait (which has the clobber) and the __syncthreads that follows; so the
 * compiler may keep block-table loads in flight across the copies. */
static __device__ __forceinline__ void s_cp_async16(void *dst, const void *src)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"((unsigned)__cvta_generic_to_shared(dst)),
                 "l"(src));
}

/* 4 bytes, or 4 zero bytes when bytes == 0 (src is not read then) */
static __device__ __forceinline__ void s_cp_async4(void *dst, const void *src, int bytes)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"((unsigned)__cvta_generic_to_shared(dst)),
                 "l"(src), "r"(bytes));
}

static __device__ __forceinline__ void s_cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

/* wait until at most N of this thread's committed groups are in flight */
template <int N> static __device__ __forceinline__ void s_cp_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* p in the shared memory of the cluster's block r (this block's own when there is no cluster) */
template <typename T> static __device__ __forceinline__ T *s_peer(T *p, int r, int splits)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    return splits > 1 ? cooperative_groups::this_cluster().map_shared_rank(p, r) : p;
#else
    if (splits > 1) __trap(); /* the host splits only kernels built for sm_90 */
    return p;
#endif
}

/* all threads of the cluster; its blocks' shared memory writes before are visible after */
static __device__ __forceinline__ void s_cluster_sync()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    cooperative_groups::this_cluster().sync();
#else
    __trap();
#endif
}

/* dst[0..N) = the first N floats of the 16-byte aligned table src (broadcast reads) */
template <int N> static __device__ __forceinline__ void s_slots(float *dst, const float4 *src)
{
#pragma unroll
    for (int x = 0; x < (N + 3) / 4; x++) {
        const float4 v = src[x];
        const float e[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; i++)
            if (4 * x + i < N) dst[4 * x + i] = e[i];
    }
}

/* NV: float4 columns a lane owns in p.v (head_dim <= 128 NV); L: lanes a head in q.k (32 / L
 * head slots a warp, at least hb). hb: heads a block; nstage: stages in flight (2 or 3); vec:
 * head_dim % 4 == 0 and q, the caches 16-byte aligned (else 4-byte copies, rows zero-padded).
 * window, sinks: cuda_attn_opts_t's (0, NULL: none). */
template <int NV, int L>
__global__ void __launch_bounds__(ATT_THREADS, 2)
    k_attention(float *out, const float *q, const float *kc, const float *vc, const int32_t *seq, const int32_t *pos,
                const int32_t *bt, int max_blocks, int n_heads, int n_kv, int hd, int bs, float scale, int hb,
                int nstage, bool vec, int8_t *q8, float *q8d, int32_t *q8s, int window, const float *sinks)
{
    constexpr int HPW = 32 / L;         /* head slots of a warp */
    constexpr int QF = 32 * NV / L;     /* float4s of q a lane holds */
    constexpr int CH = ATT_CH / NV;     /* positions a stage */
    constexpr int PPW = CH / ATT_WARPS; /* positions a warp takes of a stage */
    /* stages [nstage][K, V][CH][hd4] float4 rows; after the last, the warps' acc [ATT_WARPS][HPW][hd4] */
    extern __shared__ float4 att_smem[];
    __shared__ float4 s_pw[ATT_WARPS][PPW + 1][2];        /* a warp's p [u][slot], then its rescale [slot] */
    __shared__ float s_wm[ATT_WARPS][HPW], s_wl[ATT_WARPS][HPW]; /* the warps' m, l (log2 units) */
    __shared__ float s_bm[ATT_MAX_HB], s_bl[ATT_MAX_HB];        /* the block's m, l per head */
    __shared__ float4 s_bo[ATT_MAX_HB * 32];                    /* the block's unnormalized out [hb][hd4] */
    const int t = blockIdx.x, z = blockIdx.z, splits = gridDim.z;
    const int G = n_heads / n_kv, nhc = gridDim.y / n_kv, kvh = blockIdx.y / nhc;
    const int h0 = kvh * G + (int)(blockIdx.y % nhc) * hb, nh = min(hb, (kvh + 1) * G - h0);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, hh = lane / L, ds = lane % L;
    const int hd4 = (hd + 3) >> 2;
    const int sq = seq[t], n_ctx = pos[t] + 1, c0 = window > 0 ? max(0, n_ctx - window) : 0;
    const int span = (n_ctx - c0 + splits - 1) / splits, p0 = c0 + z * span, len = max(0, min(n_ctx - p0, span));
    const int nch = (len + CH - 1) / CH;
    const size_t stage4 = (size_t)2 * CH * hd4; /* float4s a stage */
    pdl_enter(); /* the positions above are the host's; q and the newest K/V row the kernel before's */

    /* stage c's rows (positions p0 + c CH ..) into buffer c % nstage, one group per thread */
    auto issue = [&](int c) {
        float4 *sk = att_smem + (size_t)(c % nstage) * stage4, *sv = sk + CH * hd4;
        const int pc = p0 + c * CH, nj = min(CH, len - c * CH);
        if (vec) {
            /* float4 e = j hd4 + f of the stage's rows; every block-table read first, so they are
             * in flight together rather than one before each copy */
            constexpr int R = CH * 32 * NV / ATT_THREADS; /* float4s a thread, at most */
            size_t o[R];
#pragma unroll
            for (int r = 0; r < R; r++) {
                const int e = threadIdx.x + ATT_THREADS * r, j = e / hd4;
                o[r] = j < nj ? kv_off(bt, max_blocks, sq, pc + j, kvh, n_kv, hd, bs) + 4 * (e - j * hd4) : 0;
            }
#pragma unroll
            for (int r = 0; r < R; r++) {
                const int e = threadIdx.x + ATT_THREADS * r;
                if (e < nj * hd4) {
                    s_cp_async16(sk + e, kc + o[r]);
                    s_cp_async16(sv + e, vc + o[r]);
                }
            }
        } else {
            const int rs = 4 * hd4;
            for (int e = threadIdx.x; e < nj * rs; e += ATT_THREADS) {
                const int j = e / rs, d = e - j * rs, b = d < hd ? 4 : 0;
                const size_t o = kv_off(bt, max_blocks, sq, pc + j, kvh, n_kv, hd, bs) + (b ? d : 0);
                s_cp_async4((float *)sk + e, kc + o, b);
                s_cp_async4((float *)sv + e, vc + o, b);
            }
        }
    };

    float m = -INFINITY, l = 0.f; /* this lane's head slot, over the warp's positions so far */
    float4 acc[HPW][NV];          /* [slot][column lane + 32 k], scaled by 2^-m */
#pragma unroll
    for (int h = 0; h < HPW; h++)
#pragma unroll
        for (int k = 0; k < NV; k++) acc[h][k] = make_float4(0.f, 0.f, 0.f, 0.f);

#pragma unroll 1
    for (int c = 0; c < nstage - 1; c++) {
        if (c < nch) issue(c);
        s_cp_commit();
    }

    /* q of the lane's head slot (loaded while the first stages are in flight) */
    float4 qr[QF];
    {
        const float qs = scale * ATT_LOG2E;
        const float *qv = q + ((size_t)t * n_heads + h0 + hh) * hd;
#pragma unroll
        for (int i = 0; i < QF; i++) {
            const int f = ds + L * i;
            float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
            if (hh < nh && f < hd4) {
                if (vec) {
                    x = *(const float4 *)(qv + 4 * f);
                } else {
                    x.x = qv[4 * f];
                    if (4 * f + 1 < hd) x.y = qv[4 * f + 1];
                    if (4 * f + 2 < hd) x.z = qv[4 * f + 2];
                    if (4 * f + 3 < hd) x.w = qv[4 * f + 3];
                }
            }
            qr[i] = make_float4(x.x * qs, x.y * qs, x.z * qs, x.w * qs);
        }
    }
#pragma unroll 1
    for (int c = 0; c < nch; c++) {
        /* stage c landed (its group and the ones before it), for every thread; and every warp is
         * done with stage c - 1, whose buffer stage c + nstage - 1 now takes */
        if (nstage > 2)
            s_cp_wait<1>();
        else
            s_cp_wait<0>();
        __syncthreads();
        if (c + nstage - 1 < nch) issue(c + nstage - 1);
        s_cp_commit();
        const int nj = min(CH, len - c * CH);
        if (warp >= nj) continue;
        const float4 *sk = att_smem + (size_t)(c % nstage) * stage4, *sv = sk + CH * hd4;

        /* q.k of positions warp + 8 u (an invalid u recomputes position warp, unused) */
        float s[PPW];
#pragma unroll
        for (int u = 0; u < PPW; u++) {
            const int j = warp + ATT_WARPS * u < nj ? warp + ATT_WARPS * u : warp;
            const float4 *kr = sk + (size_t)j * hd4;
            float a0 = 0.f, a1 = 0.f;
#pragma unroll
            for (int i = 0; i < QF; i++) {
                const int f = ds + L * i;
                if (f < hd4) {
                    const float4 k = kr[f];
                    a0 = fmaf(qr[i].x, k.x, a0);
                    a1 = fmaf(qr[i].y, k.y, a1);
                    a0 = fmaf(qr[i].z, k.z, a0);
                    a1 = fmaf(qr[i].w, k.w, a1);
                }
            }
            s[u] = a0 + a1;
        }
#pragma unroll
        for (int o = L / 2; o > 0; o >>= 1)
#pragma unroll
            for (int u = 0; u < PPW; u++) s[u] += __shfl_xor_sync(0xffffffffu, s[u], o);

        /* online softmax of the lane's head slot (position warp is always valid) */
        float cm = s[0];
#pragma unroll
        for (int u = 1; u < PPW; u++)
            if (warp + ATT_WARPS * u < nj) cm = fmaxf(cm, s[u]);
        const float mn = fmaxf(m, cm), corr = exp2f(m - mn);
        float p[PPW], ps = 0.f;
#pragma unroll
        for (int u = 0; u < PPW; u++) {
            p[u] = warp + ATT_WARPS * u < nj ? exp2f(s[u] - mn) : 0.f;
            ps += p[u];
        }
        l = l * corr + ps;
        m = mn;
        float *pw = (float *)s_pw[warp];
        if (ds == 0) {
#pragma unroll
            for (int u = 0; u < PPW; u++) pw[u * 8 + hh] = p[u];
            pw[PPW * 8 + hh] = corr;
        }
        __syncwarp();

        /* acc = acc * corr + p.v, every head slot */
        float cr[HPW];
        s_slots<HPW>(cr, s_pw[warp][PPW]);
#pragma unroll
        for (int h = 0; h < HPW; h++)
#pragma unroll
            for (int k = 0; k < NV; k++)
                acc[h][k] = make_float4(acc[h][k].x * cr[h], acc[h][k].y * cr[h], acc[h][k].z * cr[h],
                                        acc[h][k].w * cr[h]);
#pragma unroll
        for (int u = 0; u < PPW; u++) {
            const int j = warp + ATT_WARPS * u;
            if (j >= nj) break;
            float pr[HPW];
            s_slots<HPW>(pr, s_pw[warp][u]);
#pragma unroll
            for (int k = 0; k < NV; k++) {
                const int f = lane + 32 * k;
                if (f < hd4) {
                    const float4 v = sv[(size_t)j * hd4 + f];
#pragma unroll
                    for (int h = 0; h < HPW; h++) {
                        acc[h][k].x = fmaf(pr[h], v.x, acc[h][k].x);
                        acc[h][k].y = fmaf(pr[h], v.y, acc[h][k].y);
                        acc[h][k].z = fmaf(pr[h], v.z, acc[h][k].z);
                        acc[h][k].w = fmaf(pr[h], v.w, acc[h][k].w);
                    }
                }
            }
        }
    }
    s_cp_wait<0>();
    __syncthreads(); /* the stage buffers are free */

    /* the warps' states into the block's: M = max m_w over warps that saw a position,
     * l = sum l_w 2^(m_w - M), o = sum acc_w 2^(m_w - M) */
    float4 *wacc = att_smem;
#pragma unroll
    for (int h = 0; h < HPW; h++)
#pragma unroll
        for (int k = 0; k < NV; k++)
            if (h < nh && lane + 32 * k < hd4) wacc[((size_t)warp * HPW + h) * hd4 + lane + 32 * k] = acc[h][k];
    if (ds == 0) {
        s_wm[warp][hh] = m;
        s_wl[warp][hh] = l;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < nh * hd4; e += ATT_THREADS) {
        const int h = e / hd4, f = e - h * hd4;
        float M = -INFINITY, lb = 0.f;
        float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
        for (int w = 0; w < ATT_WARPS; w++)
            if (s_wl[w][h] > 0.f) M = fmaxf(M, s_wm[w][h]);
        for (int w = 0; w < ATT_WARPS; w++) {
            if (!(s_wl[w][h] > 0.f)) continue;
            const float fw = exp2f(s_wm[w][h] - M);
            const float4 a = wacc[((size_t)w * HPW + h) * hd4 + f];
            lb += s_wl[w][h] * fw;
            o = make_float4(o.x + a.x * fw, o.y + a.y * fw, o.z + a.z * fw, o.w + a.w * fw);
        }
        s_bo[e] = o;
        if (f == 0) {
            s_bm[h] = M;
            s_bl[h] = lb;
        }
    }
    if (splits > 1)
        s_cluster_sync();
    else
        __syncthreads();

    /* the output's 32-column blocks (head h, block i) over the cluster's warps: the splits'
     * states combined as the warps' were; lane = column 32 i + lane */
    const int nb = (hd + 31) / 32;
    for (int u = z * ATT_WARPS + warp; u < nh * nb; u += splits * ATT_WARPS) {
        const int h = u / nb, i = u - h * nb, d = 32 * i + lane;
        float bm[ATT_MAX_SPLITS], bl[ATT_MAX_SPLITS], bo[ATT_MAX_SPLITS];
#pragma unroll
        for (int r = 0; r < ATT_MAX_SPLITS; r++) {
            bm[r] = -INFINITY, bl[r] = 0.f, bo[r] = 0.f;
            if (r < splits) {
                bm[r] = *s_peer(&s_bm[h], r, splits);
                bl[r] = *s_peer(&s_bl[h], r, splits);
                if (d < hd) bo[r] = s_peer((float *)s_bo, r, splits)[(size_t)h * 4 * hd4 + d];
            }
        }
        float M = -INFINITY, lt = 0.f, a = 0.f;
#pragma unroll
        for (int r = 0; r < ATT_MAX_SPLITS; r++)
            if (bl[r] > 0.f) M = fmaxf(M, bm[r]);
#pragma unroll
        for (int r = 0; r < ATT_MAX_SPLITS; r++) {
            if (!(bl[r] > 0.f)) continue;
            const float fw = exp2f(bm[r] - M);
            lt += bl[r] * fw;
            a += bo[r] * fw;
        }
        if (sinks) { /* the sink (natural log units, as the scores after scale) into the max and the sum */
            const float sk = __ldg(sinks + h0 + h) * ATT_LOG2E, Ms = fmaxf(M, sk), fs = exp2f(M - Ms);
            lt = lt * fs + exp2f(sk - Ms);
            a *= fs;
        }
        a = d < hd ? a / lt : 0.f;
        if (d < hd) out[((size_t)t * n_heads + h0 + h) * hd + d] = a;
        /* the row's int8 blocks for the o-projection (hd % 32 == 0: column block i of the head) */
        if (q8) {
            const size_t b = ((size_t)t * n_heads * hd + (size_t)(h0 + h) * hd) / 32 + i;
            q8_quant_val(a, q8 + b * 32, q8d + b, q8s + b);
        }
    }
    if (splits > 1) s_cluster_sync(); /* no block leaves while another may read its state */
}

/* What launches may use, found once (one device per process): the dynamic shared memory a block
 * may have, and whether splits may form clusters (the device launches them and the kernels were
 * built for sm_90 or later, which their merge through distributed shared memory needs). */
static int s_att_smem_max = -1;
static bool s_att_clusters;

/* Opt the variant in to the dynamic shared memory the device allows next to its static part
 * (static + dynamic above 48 KiB needs it, else the launch fails with "invalid argument"), and
 * lower s_att_smem_max to what it gets. */
template <int NV, int L> static int s_att_optin(int optin)
{
    cudaFuncAttributes fa;
    CUDA_CHECK(cudaFuncGetAttributes(&fa, k_attention<NV, L>));
    const int dyn = optin - (int)fa.sharedSizeBytes;
    CUDA_CHECK(cudaFuncSetAttribute(k_attention<NV, L>, cudaFuncAttributeMaxDynamicSharedMemorySize, dyn));
    if (s_att_smem_max < 0 || dyn < s_att_smem_max) s_att_smem_max = dyn;
    s_att_clusters = s_att_clusters && fa.ptxVersion >= 90;
    return 0;
}

/* Once per process (one device): cluster support, and every variant opted in. */
static int s_att_caps(const cuda_ctx_t *c)
{
    if (s_att_smem_max >= 0) return 0;
    int optin = 0, cl = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, c->device));
    CUDA_CHECK(cudaDeviceGetAttribute(&cl, cudaDevAttrClusterLaunch, c->device));
    s_att_clusters = cl != 0;
    int rc = s_att_optin<1, 4>(optin);
    if (!rc) rc = s_att_optin<1, 8>(optin);
    if (!rc) rc = s_att_optin<1, 16>(optin);
    if (!rc) rc = s_att_optin<1, 32>(optin);
    if (!rc) rc = s_att_optin<2, 8>(optin);
    if (!rc) rc = s_att_optin<2, 16>(optin);
    if (!rc) rc = s_att_optin<2, 32>(optin);
    if (rc) s_att_smem_max = -1;
    return rc;
}

/* Launches k_attention<NV, L> for the shape through launch_kc: the grid's z (the splits of a
 * row's context) is one thread-block cluster. */
extern "C" int cuda_attention_ex(cuda_ctx_t *c, float *out, const float *q, const float *k_cache,
                                 const float *v_cache, int n, const int32_t *seq, const int32_t *pos, const int32_t *bt,
                                 int max_blocks, int n_heads, int n_kv_heads, int head_dim, int block_size, float scale,
                                 bool *q8_done, const cuda_attn_opts_t *opts)
{
    const int window = opts && opts->window > 0 ? opts->window : 0;
    const float *sinks = opts ? opts->sinks : NULL;
    bool q8 = q8_done && head_dim % 32 == 0 && cuda_q8_out_ok(c, n, n_heads * head_dim);
    if (q8_done) *q8_done = q8;
    if (n <= 0) return 0;
    if (head_dim <= 0 || head_dim > 32 * ATT_MAX_DPL || n_heads <= 0 || n_kv_heads <= 0 || n_heads % n_kv_heads ||
        block_size <= 0 || n_heads > 65535) {
        log_error("cuda_attention: unsupported head_dim=%d heads=%d kv_heads=%d block_size=%d", head_dim, n_heads,
                  n_kv_heads, block_size);
        return STRATA_EINVAL_INPUT;
    }
    int rc = s_att_caps(c);
    if (rc) return rc;
    const int G = n_heads / n_kv_heads, nv = head_dim > 128 ? 2 : 1, hd4 = (head_dim + 3) / 4;
    int nhc = cdiv(G, ATT_MAX_HB / nv), hb = cdiv(G, nhc);
    /* splits: powers of two up to a cluster of 8, doubled while the grid still runs at once (two
     * blocks an SM) and a split keeps at least 8 positions of the longest context the block
     * tables allow */
    const long blocks = (long)n * n_kv_heads * nhc;
    long max_ctx = (long)max_blocks * block_size;
    if (window > 0 && window < max_ctx) max_ctx = window; /* a split's share is of the window */
    int splits = 1;
    while (s_att_clusters && splits < ATT_MAX_SPLITS && 2 * blocks * splits <= 2L * c->sms && 16L * splits <= max_ctx)
        splits *= 2;
    /* half the heads a block when that still leaves half the SMs idle (n = 1 with 4 kv heads:
     * 64 blocks, not 32); a K/V row is then read twice, the second time mostly from L2 */
    if (hb >= 4 && 2 * blocks * splits <= c->sms / 2) {
        nhc = cdiv(G, cdiv(hb, 2));
        hb = cdiv(G, nhc);
    }
    const int lanes = hb > 4 ? 4 : hb > 2 ? 8 : hb > 1 ? 16 : 32; /* 32 / (hb rounded up to a power of 2) */
    const size_t stage = (size_t)2 * (ATT_CH / nv) * hd4 * sizeof(float4);
    const int nstage = 3 * stage <= (size_t)s_att_smem_max ? 3 : 2;
    if (2 * stage > (size_t)s_att_smem_max) {
        log_error("cuda_attention: head_dim=%d needs %zu bytes of shared memory", head_dim, 2 * stage);
        return STRATA_EINVAL_INPUT;
    }
    const bool vec = head_dim % 4 == 0 && ((uintptr_t)q | (uintptr_t)k_cache | (uintptr_t)v_cache) % 16 == 0;
    const dim3 grid(n, n_kv_heads * nhc, splits);
    const size_t smem = nstage * stage;
    int8_t *q8p = q8 ? c->q8 : NULL;
#define ATT_LAUNCH(NV, L)                                                                                             \
    launch_kc(k_attention<NV, L>, grid, ATT_THREADS, smem, c->stream, (int)grid.z, out, q, k_cache, v_cache, seq, pos, \
              bt, max_blocks, n_heads, n_kv_heads, head_dim, block_size, scale, hb, nstage, vec, q8p, c->q8d, c->q8s, \
              window, sinks)
    cudaError_t le;
    switch (nv * 100 + lanes) {
    case 104: le = ATT_LAUNCH(1, 4); break;
    case 108: le = ATT_LAUNCH(1, 8); break;
    case 116: le = ATT_LAUNCH(1, 16); break;
    case 132: le = ATT_LAUNCH(1, 32); break;
    case 208: le = ATT_LAUNCH(2, 8); break;
    case 216: le = ATT_LAUNCH(2, 16); break;
    default: le = ATT_LAUNCH(2, 32); break;
    }
#undef ATT_LAUNCH
    CUDA_CHECK(le);
    return 0;
}

extern "C" int cuda_attention(cuda_ctx_t *c, float *out, const float *q, const float *k_cache, const float *v_cache,
                              int n, const int32_t *seq, const int32_t *pos, const int32_t *bt, int max_blocks,
                              int n_heads, int n_kv_heads, int head_dim, int block_size, float scale, bool *q8_done)
{
    return cuda_attention_ex(c, out, q, k_cache, v_cache, n, seq, pos, bt, max_blocks, n_heads, n_kv_heads, head_dim,
                             block_size, scale, q8_done, NULL);
}

/* ---- Embedding, add, argmax ---- */
/* Row blockIdx.y, an element a thread: every read in flight at once when the table is in host
 * memory (a block striding over a row took 24 us for Mixtral's 4096 BF16 over PCIe). */
__global__ void k_embed(float *out, qmat_t e, const int32_t *tokens, int n)
{
    pdl_enter();
    const int t = blockIdx.y, d = blockIdx.x * blockDim.x + threadIdx.x;
    const int tok = tokens[t];
    /* an id outside the table (tokens the host did not check: a chained step's picks) gives zeros */
    if (d < e.cols) out[(size_t)t * e.cols + d] = tok >= 0 && tok < e.rows ? q_elem(e, tok, d) : 0.0f;
}

extern "C" int cuda_embed(cuda_ctx_t *c, float *out, const qmat_t *embed, const int32_t *tokens, int n)
{
    if (n <= 0) return 0;
    launch_k(k_embed, dim3(cdiv(embed->cols, 256), n), 256, 0, c->stream, out, *embed, tokens, n);
    CUDA_LAUNCH_CHECK();
    return 0;
}

__global__ void k_add(float *y, const float *x, size_t n)
{
    pdl_enter();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += x[i];
}

extern "C" int cuda_add(cuda_ctx_t *c, float *y, const float *x, size_t n)
{
    if (!n) return 0;
    launch_k(k_add, cdiv((long)n, 256), 256, 0, c->stream, y, x, n);
    CUDA_LAUNCH_CHECK();
    return 0;
}

/* An argmax key: the float's order in the high word, the inverted id in the low one, so the
 * largest key is the largest value at the lowest id. NaN never wins. */
__device__ __forceinline__ unsigned long long am_key(float v, int i)
{
    const uint32_t b = __float_as_uint(v), ord = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    return v != v ? 0ull : ((unsigned long long)ord << 32) | (0xffffffffu - (uint32_t)i);
}

__device__ __forceinline__ unsigned long long block_max_u64(unsigned long long v)
{
    __shared__ unsigned long long wm[32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const unsigned long long u = __shfl_xor_sync(0xffffffffu, v, o);
        v = u > v ? u : v;
    }
    if ((threadIdx.x & 31) == 0) wm[threadIdx.x >> 5] = v;
    __syncthreads();
    v = 0;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) v = wm[w] > v ? wm[w] : v;
    __syncthreads();
    return v;
}

/* Row blockIdx.y over gridDim.x blocks, each a contiguous slice of the vocabulary: each block
 * leaves its best key in part[], and the last block of the row to finish (done[] counter, reset
 * for the next launch) reduces them. One block per row needs no scratch. */
__global__ void k_argmax(const float *logits, int vocab, int32_t *ids, unsigned long long *part, unsigned *done)
{
    pdl_enter();
    const int row = blockIdx.y, nb = gridDim.x, chunk = (vocab + nb - 1) / nb;
    const int begin = blockIdx.x * chunk, end = min(vocab, begin + chunk);
    const float *l = logits + (size_t)row * vocab;
    unsigned long long best = 0;
#pragma unroll 4
    for (int i = begin + threadIdx.x; i < end; i += blockDim.x) {
        const unsigned long long k = am_key(__ldg(l + i), i);
        best = k > best ? k : best;
    }
    best = block_max_u64(best);
    if (nb > 1) {
        __shared__ bool last;
        if (threadIdx.x == 0) {
            part[(size_t)row * nb + blockIdx.x] = best;
            __threadfence();
            last = atomicAdd(done + row, 1u) == (unsigned)nb - 1;
        }
        __syncthreads();
        if (!last) return;
        __threadfence();
        best = 0;
        for (int i = threadIdx.x; i < nb; i += blockDim.x) {
            const unsigned long long k = __ldcg(part + (size_t)row * nb + i);
            best = k > best ? k : best;
        }
        best = block_max_u64(best);
        if (threadIdx.x == 0) done[row] = 0;
    }
    if (threadIdx.x == 0) ids[row] = best ? (int32_t)(0xffffffffu - (uint32_t)best) : 0;
}

extern "C" int cuda_argmax(cuda_ctx_t *c, const float *logits, int n, int vocab, int32_t *ids)
{
    for (int r0 = 0; r0 < n; r0 += 65535) {
        const int m = n - r0 < 65535 ? n - r0 : 65535;
        /* about 2048 logits a block; one block a row without the workspace's scratch */
        int parts = c->am_part && m <= c->am_rows ? cdiv(vocab, 2048) : 1;
        if (parts > CUDA_ARGMAX_PARTS) parts = CUDA_ARGMAX_PARTS;
        launch_k(k_argmax, dim3(parts, m), 256, 0, c->stream, logits + (size_t)r0 * vocab, vocab, ids + r0, c->am_part,
                 c->am_done);
        CUDA_LAUNCH_CHECK();
    }
    return 0;
}

__global__ void k_add_sigmoid_scaled(float *y, const float *s, const float *g, int n, int dim)
{
    pdl_enter();
    const int t = blockIdx.x;
    const float w = 1.f / (1.f + expf(-g[t]));
    for (int d = threadIdx.x; d < dim; d += blockDim.x) y[(size_t)t * dim + d] += w * s[(size_t)t * dim + d];
}

extern "C" int cuda_add_sigmoid_scaled(cuda_ctx_t *c, float *y, const float *s, const float *g, int n, int dim)
{
    if (n <= 0) return 0;
    launch_k(k_add_sigmoid_scaled, n, 256, 0, c->stream, y, s, g, n, dim);
    CUDA_LAUNCH_CHECK();
    return 0;
}

__global__ void k_silu_mul(float *h, const float *g, const float *u, size_t n)
{
    pdl_enter();
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
    launch_k(k_silu_mul, cdiv((long)ni, 256), 256, 0, c->stream, h, g, u, ni);
    CUDA_LAUNCH_CHECK();
    return cuda_matmul(c, out, h, n, down, NULL);
}

__global__ void k_gather_rows(float *dst, const float *src, const int32_t *rows, int dim)
{
    pdl_enter();
    const float *s = src + (size_t)rows[blockIdx.x] * dim;
    for (int d = threadIdx.x; d < dim; d += blockDim.x) dst[(size_t)blockIdx.x * dim + d] = s[d];
}

__global__ void k_copy_words(uint32_t *dst, const uint32_t *src, size_t n)
{
    pdl_enter();
    for (size_t i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
}

extern "C" int cuda_h2d_small(cuda_ctx_t *c, void *dst, const void *src, size_t bytes)
{
    if (bytes % 4 || (uintptr_t)dst % 4 || (uintptr_t)src % 4) return STRATA_EINVAL_INPUT;
    if (!bytes) return 0;
    launch_k(k_copy_words, 1, 256, 0, c->stream, (uint32_t *)dst, (const uint32_t *)src, bytes / 4);
    CUDA_LAUNCH_CHECK();
    return 0;
}

typedef struct {
    int n;
    uint64_t *dst[CUDA_PATCH_MAX];
    uint64_t val[CUDA_PATCH_MAX];
} patch_t;

__global__ void k_patch(patch_t p)
{
    pdl_enter();
    for (int i = threadIdx.x; i < p.n; i += blockDim.x) *p.dst[i] = p.val[i];
}

extern "C" int cuda_patch_words(cuda_ctx_t *c, int n, uint64_t *const *dst, const uint64_t *val)
{
    if (n < 0 || n > CUDA_PATCH_MAX) return STRATA_EINVAL_INPUT;
    if (!n) return 0;
    patch_t p;
    p.n = n;
    for (int i = 0; i < n; i++) {
        if ((uintptr_t)dst[i] % 8) return STRATA_EINVAL_INPUT;
        p.dst[i] = dst[i];
        p.val[i] = val[i];
    }
    launch_k(k_patch, 1, 128, 0, c->stream, p);
    CUDA_LAUNCH_CHECK();
    return 0;
}

/* One thread's wait until the host sets box[0] (pinned host memory), polling over PCIe with
 * sleep_ns between reads (fewer reads on a link the copies use); traps after 10 s, when the
 * host never filled it. Returns box[0]. */
__device__ __forceinline__ unsigned long long wait_box(const uint64_t *box, unsigned sleep_ns)
{
    unsigned long long v, t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    for (;;) {
        asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(box) : "memory");
        if (v) return v;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        if (t - t0 > 10000000000ull) __trap();
        __nanosleep(sleep_ns);
    }
}

__global__ void k_wait_patch(const uint64_t *box)
{
    __shared__ unsigned long long n;
    if (threadIdx.x == 0) n = wait_box(box, 100) - 1;
    /* the polling above may overlap the kernel before; the writes wait for it */
    pdl_enter();
    __syncthreads();
    for (unsigned long long i = threadIdx.x; i < n; i += blockDim.x) {
        unsigned long long d, v;
        asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(d) : "l"(box + 2 + 2 * i) : "memory");
        asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(box + 3 + 2 * i) : "memory");
        *(uint64_t *)d = v;
    }
}

/* Block t: waits (thread 0, polling over PCIe) until box[0] is set, then, if box[1 + t] is set,
 * adds row t of rows (pinned host memory, written by the host before box[0]) onto x's row t.
 * Block 0 first sets *arrived (when not NULL) once the kernels before it have finished.
 * Each read of rows crosses PCIe (about a microsecond under the copies), so a thread issues
 * all of its reads of a pass (WAIT_ADD_LOADS) before it stores any: one round trip a pass,
 * not one a value (a loop that added as it read took dim / blockDim of them in turn, 50 to
 * 110 us a layer on the H200 with the copies running). */
#define WAIT_ADD_THREADS 1024
#define WAIT_ADD_LOADS 8
__global__ void __launch_bounds__(WAIT_ADD_THREADS) k_wait_add_rows(const uint64_t *box, uint64_t *arrived, float *x,
                                                                    const float *rows, int dim)
{
    __shared__ unsigned long long on;
    if (threadIdx.x == 0) {
        if (arrived && blockIdx.x == 0) {
            pdl_enter();
            asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(arrived), "l"(1ull) : "memory");
        }
        wait_box(box, 200);
        asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(on) : "l"(box + 1 + blockIdx.x) : "memory");
    }
    pdl_enter();
    __syncthreads();
    if (!on) return;
    const float *r = rows + (size_t)blockIdx.x * dim;
    float *y = x + (size_t)blockIdx.x * dim;
    for (int base = threadIdx.x; base < dim; base += WAIT_ADD_THREADS * WAIT_ADD_LOADS) {
        float v[WAIT_ADD_LOADS];
        /* the rows are rewritten every layer at the same addresses: never from a cache */
#pragma unroll
        for (int i = 0; i < WAIT_ADD_LOADS; i++) {
            const int d = base + i * WAIT_ADD_THREADS;
            v[i] = d < dim ? __ldcv(r + d) : 0.0f;
        }
#pragma unroll
        for (int i = 0; i < WAIT_ADD_LOADS; i++) {
            const int d = base + i * WAIT_ADD_THREADS;
            if (d < dim) y[d] += v[i];
        }
    }
}

__global__ void __launch_bounds__(1024) k_put_host(float *ha, const float *a, size_t n, float *hb, const float *b, size_t nb,
                                                   uint64_t *flag)
{
    pdl_enter();
    for (size_t i = threadIdx.x; i < n; i += blockDim.x) ha[i] = a[i];
    for (size_t i = threadIdx.x; i < nb; i += blockDim.x) hb[i] = b[i];
    __threadfence_system(); /* each thread's stores to the host before the barrier ... */
    __syncthreads();
    if (threadIdx.x == 0) asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(flag), "l"(1ull) : "memory"); /* ... then the flag */
}

extern "C" int cuda_put_host(cuda_ctx_t *c, float *ha, const float *a, size_t n, float *hb, const float *b, size_t nb,
                             uint64_t *flag)
{
    launch_k(k_put_host, 1, 1024, 0, c->stream, ha, a, n, hb, b, nb, flag);
    CUDA_LAUNCH_CHECK();
    return 0;
}

extern "C" int cuda_ops_preload(void)
{
    cudaFuncAttributes a;
    CUDA_CHECK(cudaFuncGetAttributes(&a, k_copy_words));
    CUDA_CHECK(cudaFuncGetAttributes(&a, k_patch));
    CUDA_CHECK(cudaFuncGetAttributes(&a, k_wait_patch));
    CUDA_CHECK(cudaFuncGetAttributes(&a, k_wait_add_rows));
    CUDA_CHECK(cudaFuncGetAttributes(&a, k_put_host));
    CUDA_CHECK(cudaFuncGetAttributes(&a, k_embed));
    return 0;
}

extern "C" int cuda_wait_patch(cuda_ctx_t *c, const uint64_t *box)
{
    launch_k(k_wait_patch, 1, 128, 0, c->stream, box);
    CUDA_LAUNCH_CHECK();
    return 0;
}

extern "C" int cuda_wait_add_rows(cuda_ctx_t *c, const uint64_t *box, uint64_t *arrived, float *x, const float *rows,
                                  int n, int dim)
{
    if (n <= 0) return 0;
    launch_k(k_wait_add_rows, n, WAIT_ADD_THREADS, 0, c->stream, box, arrived, x, rows, dim);
    CUDA_LAUNCH_CHECK();
    return 0;
}

extern "C" int cuda_gather_rows(cuda_ctx_t *c, float *dst, const float *src, const int32_t *rows, int n, int dim)
{
    if (n <= 0) return 0;
    launch_k(k_gather_rows, n, 256, 0, c->stream, dst, src, rows, dim);
    CUDA_LAUNCH_CHECK();
    return 0;
}
