/* moe.cu - the grouped expert FFN: tokens regrouped by expert, then one pass over each active
 * expert's weights for all of its tokens (fused dequantization, gate/up biases and the
 * activation, moe_act), then a weighted, deterministic combine in top-k order (with the down
 * biases: every path leaves down_e(h) in os, and the combine adds weight * (os + down_bias[e])). */
#include <cuda/atomic>

#include "kernels/cuda/gemm.cuh"

#define MOE_MAX_EXPERTS 1024

static size_t s_al(size_t b) { return (b + 255) & ~(size_t)255; }

/* Scratch layout, in order: offsets[E+1], perm[P], inv[P], xs[P][hidden],
 * hs[P][inter], os[P][hidden] (P = n * top_k), the integer path's q/qd/qs, the GEMM path's
 * x16/h16/tiles/n_tiles, each 256-byte aligned. */
typedef struct {
    int32_t *offsets, *perm, *inv;
    float *xs, *hs, *os;
    int8_t *q;     /* [P][wide] int8 activations (xs, then hs) for the integer path */
    float *qd;     /* [P][wide/32] block scales */
    int32_t *qs;   /* [P][wide/32] block sums of q */
    __half *x16;   /* [P][hidden] fp16 token rows by expert (GEMM path) */
    __half *h16;   /* [P][inter] fp16 act(gate, up) (moe_act) */
    int2 *tiles;   /* [P / GEMM_BM + E] (expert, first row) GEMM tiles */
    int32_t *n_tiles;
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
    TAKE(offsets, int32_t, E + 1);
    TAKE(perm, int32_t, P);
    TAKE(inv, int32_t, P);
    TAKE(xs, float, P * hidden);
    TAKE(hs, float, P * inter);
    TAKE(os, float, P * hidden);
    TAKE(q, int8_t, P * hidden);
    TAKE(qd, float, P * hidden / 32 + 1);
    TAKE(qs, int32_t, P * hidden / 32 + 1);
    TAKE(x16, __half, P * hidden);
    TAKE(h16, __half, P * inter);
    TAKE(tiles, int2, P / GEMM_BM + E + 1);
    TAKE(n_tiles, int32_t, 1);
#undef TAKE
    return off;
}

extern "C" size_t cuda_moe_scratch_bytes(int n, int top_k, int hidden, int inter, int n_experts)
{
    int wide = hidden > inter ? hidden : inter;
    return s_layout(NULL, NULL, n, top_k, wide, wide, n_experts);
}

/* Exclusive prefix sum of v over the block (every thread calls it); *total gets the sum.
 * wt: 32 ints of shared memory. */
__device__ __forceinline__ int block_excl_scan(int v, int *wt, int *total)
{
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    if (lane == 31) wt[w] = x;
    __syncthreads();
    if (w == 0) {
        int t = lane < nw ? wt[lane] : 0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int y = __shfl_up_sync(0xffffffffu, t, o);
            if (lane >= o) t += y;
        }
        wt[lane] = t;
    }
    __syncthreads();
    const int r = (w ? wt[w - 1] : 0) + x - v;
    *total = wt[nw - 1];
    __syncthreads();
    return r;
}

/* Pairs of up to this many are placed in token order (each pair's rank among the earlier
 * pairs of its expert); beyond it, in the order shared atomics give, which changes no value
 * (every row of a tile is computed on its own). */
#define ROUTE_STABLE_MAX 1024

/* The routing, by one block: count the pairs per expert (shared atomics), prefix sums of the
 * counts and of the GEMM tiles (GEMM_BM rows each, in expert order), then each pair's place:
 * offsets [E + 1] (expert e's pairs start at offsets[e]), perm (place -> pair), inv (pair ->
 * place), the tiles and their number. */
__global__ void k_moe_route(const int32_t *idx, int P, int E, int32_t *offsets, int32_t *perm, int32_t *inv,
                            int2 *tiles, int32_t *n_tiles)
{
    pdl_enter();
    __shared__ int cnt[MOE_MAX_EXPERTS], cur[MOE_MAX_EXPERTS], sidx[ROUTE_STABLE_MAX], wt[32];
    const int tid = threadIdx.x, bd = blockDim.x;
    const bool stable = P <= ROUTE_STABLE_MAX;
    for (int e = tid; e < E; e += bd) cnt[e] = 0;
    __syncthreads();
    for (int p = tid; p < P; p += bd) {
        const int e = idx[p];
        if (stable) sidx[p] = e;
        if (e >= 0 && e < E) atomicAdd(&cnt[e], 1);
    }
    __syncthreads();
    const int K = (E + bd - 1) / bd, e0 = tid * K; /* this thread's experts */
    int c = 0, t = 0;
    for (int k = 0; k < K && e0 + k < E; k++) {
        c += cnt[e0 + k];
        t += (cnt[e0 + k] + GEMM_BM - 1) / GEMM_BM;
    }
    int ctot, ttot;
    int co = block_excl_scan(c, wt, &ctot);
    int to = block_excl_scan(t, wt, &ttot);
    for (int k = 0; k < K && e0 + k < E; k++) {
        const int e = e0 + k, ce = cnt[e];
        offsets[e] = co;
        cur[e] = co;
        for (int r = 0; r < ce; r += GEMM_BM) tiles[to++] = make_int2(e, co + r);
        co += ce;
    }
    if (tid == 0) {
        offsets[E] = ctot;
        *n_tiles = ttot;
    }
    __syncthreads();
    if (!stable) {
        for (int p = tid; p < P; p += bd) {
            const int e = idx[p];
            if (e < 0 || e >= E) continue;
            const int pos = atomicAdd(&cur[e], 1);
            perm[pos] = p;
            inv[p] = pos;
        }
        return;
    }
    /* in pair order: the first warp takes 32 pairs at a time; a pair's place is its expert's
     * next place plus its rank among the chunk's pairs of that expert */
    if (tid >= 32) return;
    const unsigned below = (1u << tid) - 1;
    for (int c = 0; c < P; c += 32) {
        const int p = c + tid, e = p < P ? sidx[p] : -1;
        const bool ok = e >= 0 && e < E;
        const unsigned same = __match_any_sync(0xffffffffu, ok ? e : -1 - tid); /* invalid lanes alone */
        if (ok) {
            const int pos = cur[e] + __popc(same & below);
            perm[pos] = p;
            inv[p] = pos;
        }
        __syncwarp();
        if (ok && !(same & below)) cur[e] += __popc(same);
        __syncwarp();
    }
}

/* ---- The gate: the router matmul and the top-k in one launch ---- */

/* Optional parts of the one-token router's launch. Norm (w != NULL): the router reads
 * rmsnorm(x) * w; every block computes the row's norm, and 32-column block j of the normed row
 * (y, and with q8 its int8 block) is written by block j % gridDim.x. Route (offsets != NULL):
 * the last block also routes the pairs for cuda_moe_ffn (route_warp). */
typedef struct {
    const float *w;
    float eps, *y;
    int8_t *q8;
    float *q8d;
    int32_t *q8s;
} rt_norm_t;
typedef struct {
    int32_t *offsets, *perm, *inv;
    int2 *tiles;
    int32_t *n_tiles;
} rt_route_t;

/* Columns 4i .. 4i+3 of row r of an F32 or BF16 matrix (cols % 4 == 0, rows 8-byte aligned). */
template <int FMT> __device__ __forceinline__ float4 w_f4(const qmat_t &w, int r, int i)
{
    const size_t o = (size_t)r * (w.cols / 4) + i;
    if constexpr (FMT == WF_F32) return __ldg((const float4 *)w.data + o);
    const uint2 u = __ldg((const uint2 *)w.data + o);
    return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u), __uint_as_float(u.y << 16),
                       __uint_as_float(u.y & 0xffff0000u));
}

__device__ __forceinline__ float dot4(float4 a, float4 b) { return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w; }

/* Sums over a block of 8 warps of each thread's v[t] (t < NT): thread t < n gets token t's.
 * part: shared memory (every thread must call it; it waits for earlier readers of part). */
template <int NT> __device__ __forceinline__ float sums8(const float *v, float (*part)[NT], int n)
{
    __syncthreads();
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const float s = warp_sum(v[t]);
        if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5][t] = s;
    }
    __syncthreads();
    float s = 0.f;
    if ((int)threadIdx.x < n)
        for (int k = 0; k < 8; k++) s += part[k][threadIdx.x];
    return s;
}

/* After a block has written its logits: true in the last block of the grid to get here (the
 * done counter, reset for the next launch). Called by one thread, which must have written the
 * logits (or be ordered after the threads that did): its add releases them, and in the last
 * block it acquires every other block's. */
__device__ __forceinline__ bool router_last(unsigned *done)
{
    cuda::atomic_ref<unsigned, cuda::thread_scope_device> d(*done);
    const bool last = d.fetch_add(1u, cuda::memory_order_acq_rel) == gridDim.x - 1;
    if (last) d.store(0u, cuda::memory_order_relaxed);
    return last;
}

/* The routing of one token's P <= 32 pairs by one warp (lane p < P holds pair p's expert e),
 * as k_moe_route places them: pairs in expert order (ties in pair order), a tile (expert, first
 * row) for each expert chosen (P <= GEMM_BM rows), and the offsets that are read: the end of
 * each chosen expert's pairs (offsets[e + 1]) and their total (offsets[E]). */
__device__ __forceinline__ void route_warp(int e, int P, int E, const rt_route_t &rt)
{
    const int lane = threadIdx.x & 31;
    const bool ok = lane < P && e >= 0 && e < E;
    const unsigned valid = __ballot_sync(0xffffffffu, ok), below = (1u << lane) - 1;
    const unsigned same = __match_any_sync(0xffffffffu, ok ? e : E + lane); /* invalid lanes alone */
    const bool first = ok && !(same & below);
    const unsigned firsts = __ballot_sync(0xffffffffu, first);
    int off = 0, tile = 0; /* pairs, and experts, before this lane's expert */
    for (int q = 0; q < P; q++) {
        const int eq = __shfl_sync(0xffffffffu, e, q);
        off += (valid >> q & 1) && eq < e;
        tile += (firsts >> q & 1) && eq < e;
    }
    if (ok) {
        const int pos = off + __popc(same & below);
        rt.perm[pos] = lane;
        rt.inv[lane] = pos;
    }
    if (first) {
        rt.tiles[tile] = make_int2(e, off);
        rt.offsets[e + 1] = off + __popc(same);
    }
    if (lane == 0) {
        rt.offsets[E] = __popc(valid);
        *rt.n_tiles = __popc(firsts);
    }
}

/* The last block's tail of both router kernels: the top-k of each of the groups of E logits in
 * y, a warp a group (8 warps), each group's picks also stored in idx_host when given, and with
 * rt.offsets (one group) its pairs routed by the warp that picked them. */
__device__ __forceinline__ void router_groups(const float *y, int groups, int E, int top_k, bool renorm, int32_t *idx,
                                              float *weight, int32_t *idx_host, const rt_route_t &rt)
{
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int gi = warp; gi < groups; gi += 8) {
        const int pick = gate_topk_warp(y + (size_t)gi * E, E, top_k, renorm, idx + (size_t)gi * top_k,
                                        weight + (size_t)gi * top_k);
        if (idx_host && lane < top_k) idx_host[(size_t)gi * top_k + lane] = pick;
        if (rt.offsets) route_warp(pick, top_k, E, rt);
    }
}

/* Block r: logits row r (y[t][r]) for the n <= 16 tokens; then the last block to finish runs the
 * top-k of every group of E logits (n * w.rows / E groups), a warp a group. */
template <int FMT>
__global__ void __launch_bounds__(256) k_router_topk(float *y, const float *x, int n, qmat_t w, const float *bias,
                                                     int E, int top_k, bool renorm, int32_t *idx, float *weight,
                                                     unsigned *done, int32_t *idx_host)
{
    constexpr int NT = 16;
    pdl_enter();
    const int r = blockIdx.x, tid = threadIdx.x, n4 = w.cols / 4;
    const float4 *x4 = (const float4 *)x;
    __shared__ float part[8][NT];
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.f;
    for (int i = tid; i < n4; i += blockDim.x) {
        const float4 wv = w_f4<FMT>(w, r, i);
#pragma unroll
        for (int t = 0; t < NT; t++)
            if (t < n) acc[t] += dot4(wv, x4[(size_t)t * n4 + i]);
    }
    const float v = sums8<NT>(acc, part, n);
    if (tid < n) y[(size_t)tid * w.rows + r] = bias ? v + bias[r] : v;
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (tid == 0) last = router_last(done);
    __syncthreads();
    if (last) router_groups(y, n * w.rows / E, E, top_k, renorm, idx, weight, idx_host, rt_route_t{});
}

/* One token, w.cols <= 4 * 256 * PT: block r computes logit r with its weight row (and the norm's
 * weights) loaded before the PDL wait, since no kernel writes them, and the token's row loaded
 * once into registers, normed there (nm) and dotted. The last block then runs the top-k of every
 * group of E logits, a warp a group, and with rt (one group) routes the pairs. */
template <int FMT, int PT>
__global__ void __launch_bounds__(256) k_router_topk1(float *y, const float *x, qmat_t w, const float *bias, int E,
                                                      int top_k, bool renorm, int32_t *idx, float *weight,
                                                      unsigned *done, rt_norm_t nm, rt_route_t rt, int32_t *idx_host)
{
    const int r = blockIdx.x, tid = threadIdx.x, n4 = w.cols / 4;
    const float4 z = make_float4(0.f, 0.f, 0.f, 0.f);
    float4 wv[PT], g[PT], v[PT];
#pragma unroll
    for (int k = 0; k < PT; k++) {
        const int i = tid + k * 256;
        wv[k] = i < n4 ? w_f4<FMT>(w, r, i) : z;
        g[k] = nm.w && i < n4 ? __ldg((const float4 *)nm.w + i) : z;
    }
    pdl_enter();
    __shared__ float part[8][1];
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < PT; k++) {
        const int i = tid + k * 256;
        v[k] = i < n4 ? ((const float4 *)x)[i] : z;
        ss += dot4(v[k], v[k]);
    }
    if (nm.w) { /* uniform bounds: q8_quant_f4 takes whole warps */
        const float tot = sums8<1>(&ss, part, 1);
        __shared__ float inv;
        if (tid == 0) inv = rsqrtf(tot / (float)w.cols + nm.eps);
        __syncthreads();
#pragma unroll
        for (int k = 0; k < PT; k++) {
            const int i = tid + k * 256, b = i / 8;
            if (k * 256 >= n4) break; /* the same for the whole block */
            const float f = inv;
            v[k] = make_float4(v[k].x * f * g[k].x, v[k].y * f * g[k].y, v[k].z * f * g[k].z, v[k].w * f * g[k].w);
            const bool mine = i < n4 && b % gridDim.x == r;
            if (mine) ((float4 *)nm.y)[i] = v[k];
            if (nm.q8) q8_quant_f4(v[k], mine ? nm.q8 + (size_t)b * 32 : NULL, nm.q8d + b, nm.q8s + b);
        }
    }
    float acc = 0.f;
#pragma unroll
    for (int k = 0; k < PT; k++) acc += dot4(wv[k], v[k]);
    const float s = sums8<1>(&acc, part, 1);
    __shared__ bool last;
    if (tid == 0) {
        y[r] = bias ? s + bias[r] : s;
        last = router_last(done);
    }
    __syncthreads(); /* orders thread 0's acquire before the other threads' reads */
    if (last) /* a stacked prediction has a group a layer ahead */
        router_groups(y, w.rows / E, E, top_k, renorm, idx, weight, idx_host, rt);
}

template <int FMT>
static void s_router_topk(cuda_ctx_t *c, float *logits, const float *x, int n, const qmat_t *w, const float *bias,
                          int E, int top_k, bool renorm, int32_t *idx, float *weight, const rt_norm_t &nm,
                          const rt_route_t &rt, int32_t *idx_host)
{
    if (n > 1)
        launch_k(k_router_topk<FMT>, w->rows, 256, 0, c->stream, logits, x, n, *w, bias, E, top_k, renorm, idx, weight,
                 c->rt_done, idx_host);
    else if (w->cols <= 4 * 256 * 4)
        launch_k(k_router_topk1<FMT, 4>, w->rows, 256, 0, c->stream, logits, x, *w, bias, E, top_k, renorm, idx,
                 weight, c->rt_done, nm, rt, idx_host);
    else
        launch_k(k_router_topk1<FMT, 8>, w->rows, 256, 0, c->stream, logits, x, *w, bias, E, top_k, renorm, idx,
                 weight, c->rt_done, nm, rt, idx_host);
}

extern "C" int cuda_router_topk(cuda_ctx_t *c, float *logits, const float *x, int n, const qmat_t *w,
                                const float *bias, int n_experts, int top_k, bool renorm, int32_t *idx, float *weight,
                                const cuda_next_norm_t *pre, const cuda_route_into_t *route, int32_t *idx_host)
{
    if (route && route->routed) *route->routed = false;
    if (n <= 0 || w->rows <= 0) return 0;
    /* one token: the row in registers, at most 8 float4s a thread */
    const bool fused = c->rt_done && n <= 16 && (n > 1 || w->cols <= 4 * 256 * 8) && w->rows < 1024 &&
                       n_experts > 0 && w->rows % n_experts == 0 && (w->fmt == WF_F32 || w->fmt == WF_BF16) &&
                       w->cols % 4 == 0 && (uintptr_t)w->data % 16 == 0 && n_experts <= GATE_MAX_E && top_k > 0 &&
                       top_k <= 32 && top_k <= n_experts;
    /* the norm and the routing go in the one launch at one token (measured at 16, Qwen3-30B-A3B
     * decode: 760 -> 708 tok/s with every block norming the 16 rows) */
    if (pre && (!fused || n > 1)) {
        int rc = cuda_rmsnorm_q8(c, pre->y, x, pre->w, n, w->cols, pre->eps, pre->q8_done);
        if (rc) return rc;
        x = pre->y;
        pre = NULL;
    }
    if (!fused) { /* the matmul, then the gate, then a copy for the host */
        const int groups = n * (w->rows / n_experts);
        int rc = cuda_matmul(c, logits, x, n, w, bias);
        if (!rc) rc = cuda_gate_topk(c, logits, groups, n_experts, top_k, renorm, idx, weight);
        if (!rc && idx_host) rc = cuda_d2h_async(c, CUDA_STREAM_COMPUTE, idx_host, idx, (size_t)groups * top_k * sizeof(int32_t));
        return rc;
    }
    rt_norm_t nm = {};
    if (pre) {
        const bool q8 = pre->q8_done && cuda_q8_out_ok(c, n, w->cols);
        if (pre->q8_done) *pre->q8_done = q8;
        nm = {pre->w, pre->eps, pre->y, q8 ? c->q8 : NULL, c->q8d, c->q8s};
    }
    rt_route_t rt = {};
    if (route && n == 1 && w->rows == n_experts && n_experts <= MOE_MAX_EXPERTS) {
        moe_scratch_t s;
        int wide = w->cols > route->inter ? w->cols : route->inter;
        s_layout(&s, route->scratch, n, top_k, wide, wide, n_experts);
        rt = {s.offsets, s.perm, s.inv, s.tiles, s.n_tiles};
        if (route->routed) *route->routed = true;
    }
    if (w->fmt == WF_F32)
        s_router_topk<WF_F32>(c, logits, x, n, w, bias, n_experts, top_k, renorm, idx, weight, nm, rt, idx_host);
    else
        s_router_topk<WF_BF16>(c, logits, x, n, w, bias, n_experts, top_k, renorm, idx, weight, nm, rt, idx_host);
    CUDA_LAUNCH_CHECK();
    return 0;
}

__global__ void k_moe_gather(float *xs, const float *x, const int32_t *perm, int top_k, int hidden, int P)
{
    pdl_enter();
    const int p = blockIdx.x;
    if (p >= P) return;
    const float *src = x + (size_t)(perm[p] / top_k) * hidden;
    for (int d = threadIdx.x; d < hidden; d += blockDim.x) xs[(size_t)p * hidden + d] = src[d];
}

/* The integer path's expert GEMVs split a tile's rows into units of a warp's rows. Two ways to
 * give units to warps:
 *   tiles: grid (blocks, max_tiles); block y takes tile y and its warps stride over the tile's
 *     units;
 *   flat (one token on whole-warp rows): one wave of blocks; warp w of W takes the contiguous
 *     units [w U / W, (w + 1) U / W) of all U = n_tiles * units-a-tile, so every warp reads about
 *     as many bytes and the wave ends together, at 2 blocks an SM and the block loop unrolled
 *     twice. Measured on the H200 (the two experts of one Mixtral-8x7B token, int4 g32, each
 *     kernel alone): gate/up 51.6 -> 35.7 us, down 20.6 -> 17.6 us. On 8-lane rows (Qwen3-
 *     30B-A3B) flat gained less than 0.3 us and tiles stay. */
template <int NT, int LPR> __host__ __device__ constexpr bool moe_flat() { return NT == 1 && LPR == 32; }
#define MOE_Q8_MIN_BLOCKS(NT, LPR) (moe_flat<NT, LPR>() ? 2 : 1)
#define MOE_Q8_UNROLL(NT, LPR) (moe_flat<NT, LPR>() ? 2 : q8_unroll<NT, LPR>())

/* A warp's walk over its units: u, u + step, .. below u1 (flat: its contiguous share of the
 * n_tiles * upt units; tiles: a grid stride over tile blockIdx.y's upt units), and the tile of
 * the unit it is at (flat: u / upt, else blockIdx.y), looked up when it changes. */
template <bool FLAT> struct moe_walk {
    int u, u1, step, upt, cur, e, p0, cnt;
    bool ok;
    __device__ __forceinline__ moe_walk(const int32_t *n_tiles, int units)
        : upt(units), cur(-1), e(0), p0(0), cnt(0), ok(false)
    {
        const int wpb = blockDim.x >> 5, w = blockIdx.x * wpb + (threadIdx.x >> 5);
        if constexpr (FLAT) {
            const long long W = (long long)gridDim.x * wpb, U = (long long)*n_tiles * upt;
            u = (int)(w * U / W);
            u1 = (int)((w + 1) * U / W);
            step = 1;
        } else {
            u = w;
            u1 = upt;
            step = gridDim.x * wpb;
        }
    }
    __device__ __forceinline__ bool more() const { return u < u1; }
    __device__ __forceinline__ void next() { u += step; }
    /* The unit's place in its tile: its rows start at row_unit() * (rows a warp). */
    __device__ __forceinline__ int row_unit() const { return FLAT ? u % upt : u; }
    /* Looks the unit's tile up when it is not the last one's (fresh: it was); true when the tile
     * exists and its expert is resident (e, p0, cnt). */
    __device__ __forceinline__ bool tile(const int2 *tiles, const int32_t *n_tiles, const int32_t *offsets,
                                         const cuda_expert_t *experts, bool &fresh)
    {
        const int ti = FLAT ? u / upt : blockIdx.y;
        fresh = ti != cur;
        if (fresh) {
            cur = ti;
            ok = moe_tile(tiles, n_tiles, offsets, experts, ti, e, p0, cnt);
        }
        return ok;
    }
};

/* Integer path: each group of LPR lanes takes 2 rows of gate and the same 2 of up (q8_dot_rows
 * with 4 rows) for the tile's tokens. GATHER: q/qd/qs hold token rows and pair p reads row
 * perm[p] / top_k (for more than one token, each warp keeps its tile's rows in shared memory);
 * else pair rows. */
template <int FMT, int NT, int LPR, bool GATHER>
__global__ void __launch_bounds__(256, MOE_Q8_MIN_BLOCKS(NT, LPR))
    k_moe_gate_up_q8(float *hs, const int8_t *q, const float *qd, const int32_t *qs, const cuda_expert_t *experts,
                     const int2 *tiles, const int32_t *n_tiles, const int32_t *offsets, int hidden, int inter,
                     const int32_t *perm, int top_k, moe_act_t act)
{
    pdl_enter();
    constexpr int RPW = 32 / LPR * 2;
    constexpr bool FLAT = moe_flat<NT, LPR>();
    const int lane = threadIdx.x & 31, nb = hidden / 32, upt = (inter + RPW - 1) / RPW;
    constexpr bool XR = GATHER && NT > 1; /* a warp's tile's token rows in shared memory */
    __shared__ int xr[XR ? 8 : 1][XR ? GEMM_BM : 1];
    int *wxr = xr[XR ? threadIdx.x >> 5 : 0];
    for (moe_walk<FLAT> w(n_tiles, upt); w.more(); w.next()) {
        bool fresh;
        if (!w.tile(tiles, n_tiles, offsets, experts, fresh)) {
            if (FLAT) continue;
            return;
        }
        const int e = w.e, p0 = w.p0, cnt = w.cnt, r0 = w.row_unit() * RPW + lane / LPR * 2;
        if (XR && fresh) {
            __syncwarp();
            for (int i = lane; i < cnt; i += 32) wxr[i] = perm[p0 + i] / top_k;
            __syncwarp();
        }
        const qmat_t &gw = experts[e].gate, &uw = experts[e].up;
        const int bpg = FMT == WF_INT4 ? gw.group / 32 : 1; /* MXFP4: a scale a block */
        const uint8_t *rp[4];
        const void *sp[4];
        q8_row_ptrs<FMT>(gw, r0, rp[0], sp[0]);
        q8_row_ptrs<FMT>(gw, r0 + 1, rp[1], sp[1]);
        q8_row_ptrs<FMT>(uw, r0, rp[2], sp[2]);
        q8_row_ptrs<FMT>(uw, r0 + 1, rp[3], sp[3]);
        for (int t0 = 0; t0 < cnt; t0 += NT) {
            const int m = cnt - t0 < NT ? cnt - t0 : NT;
            const size_t p = (size_t)(p0 + t0);
            float acc[4][NT];
            if constexpr (XR) {
                q8_dot_rows<FMT, NT, 4, LPR, true, MOE_Q8_UNROLL(NT, LPR)>(rp, sp, bpg, q, qd, qs, m, hidden, acc,
                                                                           wxr + t0);
            } else { /* one token: its row's address once, and no shared memory (the rows in shared
                      * memory cost 36.7 -> 41.2 us at Mixtral's shape) */
                const size_t x = GATHER ? (size_t)(perm[p] / top_k) : p;
                q8_dot_rows<FMT, NT, 4, LPR, false, MOE_Q8_UNROLL(NT, LPR)>(rp, sp, bpg, q + x * hidden, qd + x * nb,
                                                                            qs + x * nb, m, hidden, acc);
            }
#pragma unroll
            for (int j = 0; j < 2; j++)
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    const float gs = group_sum<LPR>(acc[j][t]), us = group_sum<LPR>(acc[2 + j][t]);
                    if (lane % LPR == 0 && t < m && r0 + j < inter)
                        hs[(p + t) * inter + r0 + j] = moe_act(act, e, r0 + j, inter, gs, us);
                }
        }
    }
}

/* Each group of LPR lanes takes RR consecutive rows of down (a split expert's rows from its head
 * or its tail), of rows row0 .. row1 - 1 (row0 a multiple of RR). table_late: the kernel before
 * may write the experts' entries (cuda_wait_patch, before CUDA_MOE_TAIL): wait for it before
 * reading them. */
template <int FMT, int NT, int LPR, int RR>
__global__ void __launch_bounds__(256, MOE_Q8_MIN_BLOCKS(NT, LPR))
    k_moe_down_q8(float *os, const int8_t *q, const float *qd, const int32_t *qs, const cuda_expert_t *experts,
                  const int2 *tiles, const int32_t *n_tiles, const int32_t *offsets, int hidden, int inter, int row0,
                  int row1, bool table_late)
{
    constexpr int RPW = 32 / LPR * RR;
    constexpr bool FLAT = moe_flat<NT, LPR>();
    const int lane = threadIdx.x & 31, nb = inter / 32, upt = (row1 - row0 + RPW - 1) / RPW;
    bool waited = table_late;
    if (table_late) pdl_enter();
    for (moe_walk<FLAT> w(n_tiles, upt); w.more(); w.next()) {
        bool fresh;
        if (!w.tile(tiles, n_tiles, offsets, experts, fresh)) {
            if (FLAT) continue;
            return;
        }
        const int e = w.e, p0 = w.p0, cnt = w.cnt, r0 = row0 + w.row_unit() * RPW + lane / LPR * RR;
        const cuda_expert_t &ex = experts[e];
        const int bpg = FMT == WF_INT4 ? ex.down.group / 32 : 1;
        const uint8_t *rp[RR];
        const void *sp[RR];
#pragma unroll
        for (int i = 0; i < RR; i++) q8_row_ptrs<FMT>(moe_down_rows(ex, r0 + i), r0 + i, rp[i], sp[i]);
        /* the routing and the weights above were there before gate/up began; q is gate/up's */
        if (!waited) {
            pdl_enter();
            waited = true;
        }
        for (int t0 = 0; t0 < cnt; t0 += NT) {
            const int m = cnt - t0 < NT ? cnt - t0 : NT;
            const size_t p = (size_t)(p0 + t0);
            float acc[RR][NT];
            q8_dot_rows<FMT, NT, RR, LPR, false, MOE_Q8_UNROLL(NT, LPR)>(rp, sp, bpg, q + p * inter, qd + p * nb,
                                                                         qs + p * nb, m, inter, acc);
#pragma unroll
            for (int i = 0; i < RR; i++)
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    const float v = group_sum<LPR>(acc[i][t]);
                    if (lane % LPR == 0 && t < m && r0 + i < row1) os[(p + t) * hidden + r0 + i] = v;
                }
        }
    }
}

/* Blocks per tile for `rows` rows at rows_per_block: enough for every row, at most about 4
 * blocks per SM over all tiles (the kernels stride over the rest, so the tile lookup is paid
 * once per block). Measured: capping at what is resident at once (1 block per SM at 16
 * tokens) made batch-16 decode 2.7x slower than this. */
static int s_row_blocks(int rows, int rows_per_block, int sms, int max_tiles)
{
    int need = cdiv(rows, rows_per_block), cap = 4 * sms / max_tiles;
    return need < cap ? need : cap > 0 ? cap : 1;
}

/* The x input of gate/up on the integer path: the pairs' rows quantized into the scratch, or
 * (gather) the tokens' rows already in the context's workspace. */
typedef struct {
    const int8_t *q;
    const float *qd;
    const int32_t *qs;
    bool gather;
    int top_k;
} moe_xq_t;

/* The grid of an expert GEMV of rows rows, rpw a warp: flat, one wave of blocks (per_sm an SM,
 * fewer when that leaves a warp without a unit); tiles, s_row_blocks for each tile. */
static dim3 s_moe_grid(bool flat, int per_sm, int rows, int rpw, int sms, int max_tiles)
{
    if (!flat) return dim3(s_row_blocks(rows, 8 * rpw, sms, max_tiles), max_tiles);
    const long long need = ((long long)max_tiles * cdiv(rows, rpw) + 7) / 8, wave = (long long)per_sm * sms;
    return dim3((unsigned)(need < wave ? need : wave));
}

/* Blocks of kernel k resident an SM at 256 threads (1 when the runtime cannot tell). */
template <typename K> static int s_per_sm(K k)
{
    int n = 0;
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k, 256, 0) == cudaSuccess && n > 0 ? n : 1;
}

template <int FMT, int NT, int LPR>
static void s_gate_up_q8(cudaStream_t st, int sms, const moe_scratch_t *s, const moe_xq_t *xq,
                         const cuda_expert_t *experts, int hidden, int inter, int max_tiles, const moe_act_t &act)
{
    static int per_sm[2];
    const int g = xq->gather;
    auto k = g ? k_moe_gate_up_q8<FMT, NT, LPR, true> : k_moe_gate_up_q8<FMT, NT, LPR, false>;
    if (moe_flat<NT, LPR>() && !per_sm[g]) per_sm[g] = s_per_sm(k); /* only the flat grid sizes by it */
    const dim3 grid = s_moe_grid(moe_flat<NT, LPR>(), per_sm[g], inter, 32 / LPR * 2, sms, max_tiles);
    /* without programmatic dependent launch: its blocks are placed once the router has finished.
     * Measured on the H200 (batch-1 decode): Mixtral-8x7B 295.7 -> 328.3 tok/s, the kernel 47.4 ->
     * 36.9 us in the graph; Qwen3-30B-A3B 424.5 -> 430.1; Mixtral batch 16 391.6 -> 411.1. The same
     * for the down, attention, combine, router, GEMV or RoPE launches gained nothing or lost. */
    launch_kx(k, grid, 256, 0, st, 1, false, s->hs, xq->q, xq->qd, xq->qs, experts, s->tiles, s->n_tiles, s->offsets,
              hidden, inter, s->perm, xq->top_k, act);
}

template <int FMT, int NT, int LPR, int RR>
static void s_down_q8_rr(cudaStream_t st, int sms, const moe_scratch_t *s, const cuda_expert_t *experts, int hidden,
                         int inter, int max_tiles, int row0, int row1)
{
    static int per_sm;
    if (moe_flat<NT, LPR>() && !per_sm) per_sm = s_per_sm(k_moe_down_q8<FMT, NT, LPR, RR>);
    launch_k(k_moe_down_q8<FMT, NT, LPR, RR>,
             s_moe_grid(moe_flat<NT, LPR>(), per_sm, row1 - row0, 32 / LPR * RR, sms, max_tiles), 256, 0, st, s->os,
             s->q, s->qd, s->qs, experts, s->tiles, s->n_tiles, s->offsets, hidden, inter, row0, row1, row0 > 0);
}

/* Down's rows row0 .. row1 - 1: 4 rows a lane group, or (one token's tails: CUDA_MOE_TAIL on the
 * flat grid, a few hundred rows an expert, after the mailbox and so on the step's path) 1, so
 * that 4 times the warps read them at once (Mixtral-8x7B 24 GiB: 32 blocks took 12.5 us) */
template <int FMT, int NT, int LPR>
static void s_down_q8(cudaStream_t st, int sms, const moe_scratch_t *s, const cuda_expert_t *experts, int hidden,
                      int inter, int max_tiles, int row0, int row1)
{
    if (row0 > 0 && moe_flat<NT, LPR>())
        s_down_q8_rr<FMT, NT, LPR, 1>(st, sms, s, experts, hidden, inter, max_tiles, row0, row1);
    else
        s_down_q8_rr<FMT, NT, LPR, 4>(st, sms, s, experts, hidden, inter, max_tiles, row0, row1);
}

/* Gate/up, h's quantization and down's rows below rows (part CUDA_MOE_HEAD or whole: rows =
 * hidden), or (CUDA_MOE_TAIL) down's rows from rows on. */
template <int FMT, int NT>
static int s_moe_launch_q8(cudaStream_t st, int sms, const moe_scratch_t *s, const moe_xq_t *xq,
                           const cuda_expert_t *experts, int E, int hidden, int inter, int P, int max_tiles, int part,
                           int rows, const moe_act_t &act)
{
    if (part != CUDA_MOE_TAIL) {
        if (q8_wide_rows(hidden))
            s_gate_up_q8<FMT, NT, 32>(st, sms, s, xq, experts, hidden, inter, max_tiles, act);
        else
            s_gate_up_q8<FMT, NT, 8>(st, sms, s, xq, experts, hidden, inter, max_tiles, act);
        CUDA_LAUNCH_CHECK();
        int rc = q8_quant(st, s->q, s->qd, s->qs, s->hs, P, inter, NULL, 1, s->offsets + E);
        if (rc) return rc;
    }
    const int row0 = part == CUDA_MOE_TAIL ? rows : 0, row1 = part == CUDA_MOE_TAIL ? hidden : rows;
    if (q8_wide_rows(inter))
        s_down_q8<FMT, NT, 32>(st, sms, s, experts, hidden, inter, max_tiles, row0, row1);
    else
        s_down_q8<FMT, NT, 8>(st, sms, s, experts, hidden, inter, max_tiles, row0, row1);
    CUDA_LAUNCH_CHECK();
    return 0;
}

template <int FMT>
static int s_moe_q8(cudaStream_t st, int sms, int n, const moe_scratch_t *s, const moe_xq_t *xq,
                    const cuda_expert_t *experts, int E, int hidden, int inter, int P, int max_tiles, int part,
                    int rows, const moe_act_t &act)
{
    if (n <= 1)
        return s_moe_launch_q8<FMT, 1>(st, sms, s, xq, experts, E, hidden, inter, P, max_tiles, part, rows, act);
    if (n <= 4)
        return s_moe_launch_q8<FMT, 4>(st, sms, s, xq, experts, E, hidden, inter, P, max_tiles, part, rows, act);
    return s_moe_launch_q8<FMT, 16>(st, sms, s, xq, experts, E, hidden, inter, P, max_tiles, part, rows, act);
}

/* hs[p][r] = act(gate_e[r] . xs[p], up_e[r] . xs[p]) (moe_act) for every pair p of the expert
 * e of tile blockIdx.y. */
template <int FMT, int NT>
__global__ void k_moe_gate_up(float *hs, const float *xs, const cuda_expert_t *experts, const int2 *tiles,
                              const int32_t *n_tiles, const int32_t *offsets, int hidden, int inter, bool vec,
                              moe_act_t act)
{
    pdl_enter();
    int e, off, cnt;
    const int r = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (r >= inter || !moe_tile(tiles, n_tiles, offsets, experts, blockIdx.y, e, off, cnt)) return;
    const cuda_expert_t ex = experts[e];
    for (int t0 = 0; t0 < cnt; t0 += NT) {
        const int m = cnt - t0 < NT ? cnt - t0 : NT;
        const float *x = xs + (size_t)(off + t0) * hidden;
        float g[NT], u[NT];
        q_row_dot<FMT, NT>(ex.gate, r, x, m, hidden, vec, g, threadIdx.x & 31, 32);
        q_row_dot<FMT, NT>(ex.up, r, x, m, hidden, vec, u, threadIdx.x & 31, 32);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float gs = warp_sum(g[t]), us = warp_sum(u[t]);
            if (t < m && (threadIdx.x & 31) == 0)
                hs[(size_t)(off + t0 + t) * inter + r] = moe_act(act, e, r, inter, gs, us);
        }
    }
}

/* os[p][r] = down_e[r] . hs[p] */
template <int FMT, int NT>
__global__ void k_moe_down(float *os, const float *hs, const cuda_expert_t *experts, const int2 *tiles,
                           const int32_t *n_tiles, const int32_t *offsets, int hidden, int inter, bool vec)
{
    pdl_enter();
    int e, off, cnt;
    const int r = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (r >= hidden || !moe_tile(tiles, n_tiles, offsets, experts, blockIdx.y, e, off, cnt)) return;
    const cuda_expert_t ex = experts[e];
    for (int t0 = 0; t0 < cnt; t0 += NT) {
        const int m = cnt - t0 < NT ? cnt - t0 : NT;
        float acc[NT];
        q_row_dot<FMT, NT>(moe_down_rows(ex, r), r, hs + (size_t)(off + t0) * inter, m, inter, vec, acc,
                           threadIdx.x & 31, 32);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float s = warp_sum(acc[t]);
            if (t < m && (threadIdx.x & 31) == 0) os[(size_t)(off + t0 + t) * hidden + r] = s;
        }
    }
}

/* out[t] += sum_k weight[t][k] * (os[inv[t][k]] + db[e]) with e = idx[t][k] (db: the experts'
 * down biases [E][hidden], NULL: none), in k order (deterministic); one thread per (token,
 * column). */
__global__ void k_moe_combine(float *out, const float *os, const int32_t *inv, const int32_t *idx,
                              const float *weight, const cuda_expert_t *experts, int top_k, int hidden,
                              const float *db)
{
    pdl_enter();
    const int t = blockIdx.y, d = blockIdx.x * blockDim.x + threadIdx.x;
    if (d >= hidden) return;
    float acc = out[(size_t)t * hidden + d];
    for (int k = 0; k < top_k; k++) {
        const int p = t * top_k + k, e = idx[p];
        if (!experts[e].gate.data) continue;
        float o = os[(size_t)inv[p] * hidden + d];
        if (db) o += __ldg(db + (size_t)e * hidden + d);
        acc += weight[p] * o;
    }
    out[(size_t)t * hidden + d] = acc;
}

/* k_moe_combine for token blockIdx.x held in registers (rms_row_f4's layout), then the next
 * layer's RMSNorm of it into xn (and its int8 rows with q8): one block a token, the float4s of
 * a column summed in the same order as k_moe_combine, so out is bit for bit the same. The
 * pairs (written by the router, which finished before the expert kernels began) and the norm's
 * weights are read before the PDL wait; only out and the expert rows after it. */
#define COMBINE_MAX_K 32
__global__ void __launch_bounds__(1024) k_moe_combine_norm(float *out, const float *os, const int32_t *inv, const int32_t *idx,
                                   const float *weight, const cuda_expert_t *experts, int top_k, int hidden,
                                   const float *norm_w, float eps, float *xn, int8_t *q8, float *q8d, int32_t *q8s,
                                   const float *db)
{
    const int t = blockIdx.x, n4 = hidden / 4;
    __shared__ float s_w[COMBINE_MAX_K];
    __shared__ int s_row[COMBINE_MAX_K], s_e[COMBINE_MAX_K];
    if ((int)threadIdx.x < top_k) { /* pair k's weight, row of os and expert, or weight 0 when not resident */
        const int p = t * top_k + threadIdx.x, e = idx[p];
        const bool in = experts[e].gate.data != NULL;
        s_w[threadIdx.x] = in ? weight[p] : 0.f;
        s_row[threadIdx.x] = in ? inv[p] : -1;
        s_e[threadIdx.x] = e;
    }
    float4 g[RMS_PER_THREAD];
    rms_w_f4(norm_w, hidden, g);
    __syncthreads();
    pdl_enter();
    float4 *o4 = (float4 *)(out + (size_t)t * hidden);
    float4 v[RMS_PER_THREAD];
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < RMS_PER_THREAD; k++) {
        const int i = threadIdx.x + k * blockDim.x;
        float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
        if (i < n4) {
            a = o4[i];
            for (int j = 0; j < top_k; j++) {
                if (s_row[j] < 0) continue;
                const float w = s_w[j];
                float4 e = ((const float4 *)(os + (size_t)s_row[j] * hidden))[i];
                if (db) { /* as k_moe_combine: the bias onto the expert's row, then weighted */
                    const float4 b = __ldg((const float4 *)(db + (size_t)s_e[j] * hidden) + i);
                    e.x += b.x, e.y += b.y, e.z += b.z, e.w += b.w;
                }
                a.x += w * e.x, a.y += w * e.y, a.z += w * e.z, a.w += w * e.w;
            }
            o4[i] = a;
        }
        v[k] = a;
        ss += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
    }
    rms_row_f4(v, ss, hidden, eps, g, xn + (size_t)t * hidden, q8, q8d, q8s);
}

/* The weighted sum onto out (with the experts' down biases db, may be NULL), and with nn the
 * next layer's norm of the result. */
static int s_combine(cudaStream_t st, cuda_ctx_t *c, float *out, const moe_scratch_t *s, const int32_t *idx,
                     const float *weight, const cuda_expert_t *experts, int n, int top_k, int hidden,
                     const cuda_next_norm_t *nn, const float *db)
{
    if (nn && hidden % 4 == 0 && hidden / 4 <= RMS_PER_THREAD * 1024 && top_k <= COMBINE_MAX_K &&
        (uintptr_t)db % 16 == 0) {
        const bool q8 = nn->q8_done && rms_q8_ok(c, n, hidden);
        if (nn->q8_done) *nn->q8_done = q8;
        launch_k(k_moe_combine_norm, n, rms_threads(hidden), 0, st, out, s->os, s->inv, idx, weight, experts, top_k,
                 hidden, nn->w, nn->eps, nn->y, q8 ? c->q8 : NULL, c->q8d, c->q8s, db);
        CUDA_LAUNCH_CHECK();
        return 0;
    }
    launch_k(k_moe_combine, dim3(cdiv(hidden, 256), n), 256, 0, st, out, s->os, s->inv, idx, weight, experts, top_k,
             hidden, db);
    CUDA_LAUNCH_CHECK();
    if (!nn) return 0;
    return cuda_rmsnorm_q8(c, nn->y, out, nn->w, n, hidden, nn->eps, nn->q8_done);
}

template <int FMT, int NT>
static int s_moe_launch(cudaStream_t st, const moe_scratch_t *s, const cuda_expert_t *experts, int hidden, int inter,
                        bool vec_h, bool vec_i, int max_tiles, const moe_act_t &act)
{
    dim3 g1(cdiv((long)inter * 32, 256), max_tiles), g2(cdiv((long)hidden * 32, 256), max_tiles);
    launch_k(k_moe_gate_up<FMT, NT>, g1, 256, 0, st, s->hs, s->xs, experts, s->tiles, s->n_tiles, s->offsets, hidden, inter,
             vec_h, act);
    CUDA_LAUNCH_CHECK();
    launch_k(k_moe_down<FMT, NT>, g2, 256, 0, st, s->os, s->hs, experts, s->tiles, s->n_tiles, s->offsets, hidden, inter,
                                            vec_i);
    CUDA_LAUNCH_CHECK();
    return 0;
}

template <int FMT>
static int s_moe_fmt(cudaStream_t st, int n, const moe_scratch_t *s, const cuda_expert_t *experts, int hidden,
                     int inter, int max_tiles, const moe_act_t &act)
{
    constexpr int C = qfmt<FMT>::COLS;
    const bool vec_h = hidden % C == 0 && q_row_bytes(FMT, hidden) % 16 == 0;
    const bool vec_i = inter % C == 0 && q_row_bytes(FMT, inter) % 16 == 0;
    if (n <= 1) return s_moe_launch<FMT, 1>(st, s, experts, hidden, inter, vec_h, vec_i, max_tiles, act);
    if (n <= 4) return s_moe_launch<FMT, 4>(st, s, experts, hidden, inter, vec_h, vec_i, max_tiles, act);
    return s_moe_launch<FMT, 8>(st, s, experts, hidden, inter, vec_h, vec_i, max_tiles, act);
}

extern "C" bool cuda_moe_parts_ok(int n, wfmt_t fmt, int hidden, int inter)
{
    return n > 0 && n < GEMM_MOE_MIN_TOKENS && (fmt == WF_INT4 || fmt == WF_INT8 || fmt == WF_MXFP4) &&
           hidden % 32 == 0 && inter % 32 == 0;
}

/* cuda_moe_ffn whole (part 0), or its part (cuda_moe_ffn_part), with opts (may be NULL). */
static int s_moe_ffn(cuda_ctx_t *c, int part, int rows, float *out, const float *x, int n, int hidden, int inter,
                     wfmt_t fmt, const cuda_expert_t *experts_dev, int n_experts, const int32_t *idx,
                     const float *weight, int top_k, void *scratch, unsigned flags, const cuda_next_norm_t *nn,
                     const cuda_moe_opts_t *opts)
{
    if (n <= 0) return 0;
    moe_act_t act = {};
    const float *db = NULL;
    if (opts) {
        act = {opts->gate_bias, opts->up_bias, opts->clamped, opts->limit, opts->alpha};
        db = opts->down_bias;
    }
    if (n_experts <= 0 || n_experts > MOE_MAX_EXPERTS || top_k <= 0 || top_k > n_experts) {
        log_error("cuda_moe_ffn: bad expert counts (n_experts=%d top_k=%d)", n_experts, top_k);
        return STRATA_EINVAL_INPUT;
    }
    if (part && (!cuda_moe_parts_ok(n, fmt, hidden, inter) || (opts && opts->f32_act) || rows <= 0 || rows >= hidden ||
                 rows % 4)) {
        log_error("cuda_moe_ffn_part: %d tokens of format %d at %d x %d, rows %d: not in parts", n, (int)fmt, hidden,
                  inter, rows);
        return STRATA_EINVAL_INPUT;
    }
    moe_scratch_t s;
    int wide = hidden > inter ? hidden : inter;
    s_layout(&s, scratch, n, top_k, wide, wide, n_experts);
    const int P = n * top_k;
    /* tiles: at most one partial tile per active expert, plus whole tiles */
    const int max_tiles = (P < n_experts ? P : n_experts) + P / GEMM_BM;
    cudaStream_t st = c->stream;
    if (!(flags & CUDA_MOE_ROUTED) && part != CUDA_MOE_TAIL) {
        const int route_threads = min(512, max(64, (max(n_experts, P) + 31) / 32 * 32));
        launch_k(k_moe_route, 1, route_threads, 0, st, idx, P, n_experts, s.offsets, s.perm, s.inv,
                 s.tiles, s.n_tiles);
        CUDA_LAUNCH_CHECK();
    }
    int rc;
    if (!part && n >= GEMM_MOE_MIN_TOKENS && fmt != WF_F32 && hidden % 64 == 0 && inter % 64 == 0) {
        /* tensor cores: fp16 token rows by expert, gate+up with SwiGLU to fp16, down to fp32.
         * (cuBLAS on each expert's down, dequantized to fp16 first, made Mixtral-8x7B's
         * 512-token prefill 6950 -> 6350 tok/s: 117 MB of fp16 written an expert) */
        if ((rc = gemm_to_half(st, s.x16, x, s.perm, top_k, P, hidden))) return rc;
        if ((rc = gemm_moe(st, true, s.x16, NULL, s.h16, hidden, inter, fmt, experts_dev, s.tiles, s.n_tiles,
                           s.offsets, max_tiles, &act)))
            return rc;
        /* the integer path's xs and hs (2 x P x wide floats, contiguous) hold the k parts */
        if ((rc = gemm_moe_down(st, c->sms, s.h16, s.os, hidden, inter, fmt, experts_dev, s.tiles, s.n_tiles,
                                s.offsets, max_tiles, P, s.xs, (size_t)(s.os - s.xs))))
            return rc;
        return s_combine(st, c, out, &s, idx, weight, experts_dev, n, top_k, hidden, nn, db);
    }
    if ((fmt == WF_INT4 || fmt == WF_INT8 || fmt == WF_MXFP4) && hidden % 32 == 0 && inter % 32 == 0 &&
        !(opts && opts->f32_act)) {
        /* token rows by expert, straight into int8 blocks, unless the tokens' rows are in the
         * context's workspace already */
        moe_xq_t xq = {s.q, s.qd, s.qs, false, top_k};
        if ((flags & CUDA_MOE_X_Q8) && n <= 16) xq = {c->q8, c->q8d, c->q8s, true, top_k};
        else if (part != CUDA_MOE_TAIL && (rc = q8_quant(st, s.q, s.qd, s.qs, x, P, hidden, s.perm, top_k, NULL)))
            return rc;
        const int r = part ? rows : hidden;
        switch (fmt) {
        case WF_INT4:
            rc = s_moe_q8<WF_INT4>(st, c->sms, n, &s, &xq, experts_dev, n_experts, hidden, inter, P, max_tiles, part, r,
                                   act);
            break;
        case WF_MXFP4:
            rc = s_moe_q8<WF_MXFP4>(st, c->sms, n, &s, &xq, experts_dev, n_experts, hidden, inter, P, max_tiles, part,
                                    r, act);
            break;
        default:
            rc = s_moe_q8<WF_INT8>(st, c->sms, n, &s, &xq, experts_dev, n_experts, hidden, inter, P, max_tiles, part, r,
                                   act);
        }
        if (rc || part == CUDA_MOE_HEAD) return rc;
        return s_combine(st, c, out, &s, idx, weight, experts_dev, n, top_k, hidden, nn, db);
    }
    launch_k(k_moe_gather, P, 128, 0, st, s.xs, x, s.perm, top_k, hidden, P);
    CUDA_LAUNCH_CHECK();
    switch (fmt) {
    case WF_F32: rc = s_moe_fmt<WF_F32>(st, n, &s, experts_dev, hidden, inter, max_tiles, act); break;
    case WF_BF16: rc = s_moe_fmt<WF_BF16>(st, n, &s, experts_dev, hidden, inter, max_tiles, act); break;
    case WF_INT8: rc = s_moe_fmt<WF_INT8>(st, n, &s, experts_dev, hidden, inter, max_tiles, act); break;
    case WF_FP8: rc = s_moe_fmt<WF_FP8>(st, n, &s, experts_dev, hidden, inter, max_tiles, act); break;
    case WF_INT4: rc = s_moe_fmt<WF_INT4>(st, n, &s, experts_dev, hidden, inter, max_tiles, act); break;
    case WF_MXFP4: rc = s_moe_fmt<WF_MXFP4>(st, n, &s, experts_dev, hidden, inter, max_tiles, act); break;
    default: log_error("cuda_moe_ffn: unknown weight format %d", (int)fmt); return STRATA_EINVAL_INPUT;
    }
    if (rc) return rc;
    return s_combine(st, c, out, &s, idx, weight, experts_dev, n, top_k, hidden, nn, db);
}

extern "C" int cuda_moe_ffn(cuda_ctx_t *c, float *out, const float *x, int n, int hidden, int inter, wfmt_t fmt,
                            const cuda_expert_t *experts_dev, int n_experts, const int32_t *idx,
                            const float *weight, int top_k, void *scratch, unsigned flags,
                            const cuda_next_norm_t *nn)
{
    return s_moe_ffn(c, 0, hidden, out, x, n, hidden, inter, fmt, experts_dev, n_experts, idx, weight, top_k, scratch,
                     flags, nn, NULL);
}

extern "C" int cuda_moe_ffn_part(cuda_ctx_t *c, int part, int rows, float *out, const float *x, int n, int hidden,
                                 int inter, wfmt_t fmt, const cuda_expert_t *experts_dev, int n_experts,
                                 const int32_t *idx, const float *weight, int top_k, void *scratch, unsigned flags,
                                 const cuda_next_norm_t *nn)
{
    if (part != CUDA_MOE_HEAD && part != CUDA_MOE_TAIL) return STRATA_EINVAL_INPUT;
    return s_moe_ffn(c, part, rows, out, x, n, hidden, inter, fmt, experts_dev, n_experts, idx, weight, top_k, scratch,
                     flags, nn, NULL);
}

extern "C" int cuda_moe_ffn_ex(cuda_ctx_t *c, int part, int rows, float *out, const float *x, int n, int hidden,
                               int inter, wfmt_t fmt, const cuda_expert_t *experts_dev, int n_experts,
                               const int32_t *idx, const float *weight, int top_k, void *scratch, unsigned flags,
                               const cuda_next_norm_t *nn, const cuda_moe_opts_t *opts)
{
    if (part != 0 && part != CUDA_MOE_HEAD && part != CUDA_MOE_TAIL) return STRATA_EINVAL_INPUT;
    return s_moe_ffn(c, part, part ? rows : hidden, out, x, n, hidden, inter, fmt, experts_dev, n_experts, idx, weight,
                     top_k, scratch, flags, nn, opts);
}
