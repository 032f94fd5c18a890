/* attn.cu - tensor-core causal paged attention for many query rows at once (prefill, chunked
 * prefill, mixed batches), FlashAttention-2 style: a block of 4 warps takes 64 query rows of
 * one head, each warp 16 rows; K/V tiles of 64 positions come from the fp32 paged cache into
 * shared memory as fp16, S = Q K^T and O += P V run on mma.sync m16n8k16 (fp32 accumulation)
 * with an online softmax. The forward pass takes it for prefill-shaped steps
 * (cuda_attention_prefill).
 *
 * mma.sync m16n8k16 fragments (PTX ISA, "Matrix fragments for mma.m16n8k16"), with
 * g = lane / 4 and t = lane % 4:
 *   A (16 x 16, rows x k): a0 (row g, k 2t, 2t+1), a1 (row g+8, same k), a2 (row g, k 2t+8,
 *     2t+9), a3 (row g+8, k 2t+8, 2t+9), lower k in the lower half;
 *   B (16 x 8, k x n): b0 k = 2t, 2t+1 and b1 k = 2t+8, 2t+9, both of column g;
 *   C (16 x 8): c0, c1 at (row g, cols 2t, 2t+1), c2, c3 at row g + 8.
 * ldmatrix.x4 gives register i of lane L the pair (row L/4, cols 2(L%4), 2(L%4)+1) of the 8x8
 * matrix whose row addresses lanes 8i .. 8i+7 supply; with .trans, the pair (rows 2(L%4),
 * 2(L%4)+1, col L/4) instead.
 *
 * S = Q K^T: A is Q (16 rows x 16 dims of a warp) from [row][d] in shared memory, once per
 *   block into registers. B is K^T (16 dims x 8 keys): b0 = K[key g][d 2t, 2t+1], which is
 *   plain ldmatrix (no .trans) of the K tile stored [key][d].
 * O += P V: P's C fragments of two adjacent key n8-tiles 2j, 2j+1 are exactly the A fragment
 *   of key k-slice j (c0c1 of tile 2j = a0, c2c3 = a1, c0c1 of tile 2j+1 = a2, c2c3 = a3), so
 *   P stays in registers (fp16). B is V (16 keys x 8 dims): b0 = V[keys 2t, 2t+1][d g], the
 *   transpose of what plain ldmatrix gives of the V tile stored [key][d], so ldmatrix.trans.
 * Shared rows are HD + 8 halves: the 8 rows one ldmatrix phase reads then start 16 bytes
 * apart modulo 128, on distinct banks. */
#include <limits.h>
#include <math.h>

#include "kernels/cuda/cuda_common.cuh"

#define AT_BM 64      /* query rows per block (4 warps x 16) */
#define AT_BN 64      /* key positions per tile */
#define AT_THREADS 128
#define AT_LOG2E 1.4426950408889634f

__device__ __forceinline__ uint32_t s_pack(float lo, float hi)
{
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&h);
}

/* Four fp32 values to fp16 at p (8-byte aligned). */
__device__ __forceinline__ void s_st4(__half *p, float4 v)
{
    *reinterpret_cast<uint2 *>(p) = make_uint2(s_pack(v.x, v.y), s_pack(v.z, v.w));
}

/* Block (blockIdx.x, blockIdx.y) = (query rows 64 x .. 64 x + 63, head h).
 *
 * Rows of one block may belong to several sequences (a step mixes prefills, decode tokens and
 * prefill chunks) and need not start at position 0. The block makes one pass per distinct
 * sequence s of its rows, over key tiles 0 .. the largest pos among its rows of s; in that
 * pass row r's limit is pos[r] if seq[r] == s, else -1, and key p is masked (score -inf) for
 * p > limit. One online softmax (running max m and sum l per row, base 2, and the rescaled
 * accumulator) spans all passes. A row whose keys so far are all masked keeps m = -inf; its
 * exponentials are then taken against 0 instead of m, so they are exactly 0 and no NaN
 * (-inf - -inf) appears. Positions past the pass's last one are not read (their block-table
 * entries may not exist) but zero-filled, so that 0 * garbage never reaches the accumulator.
 *
 * With a sliding window (window > 0) row r also masks keys before its start lo[r] = max(0,
 * pos[r] + 1 - window), the pass starts at the smallest start among its rows, and a position is
 * read only when it is inside some row's window of the pass (the rest are zero-filled like
 * those past the end): blocks wholly before every window may be gone. A warp skips a tile all of
 * whose keys are before its rows' windows, as it skips one past them. With sinks, each row's
 * sink joins its head's softmax at the end: m' = max(m, sink), l' = l 2^(m - m') + 2^(sink - m'),
 * and the accumulator times 2^(m - m') (all in base 2, the sink times log2(e)). */
template <int HD>
__global__ void __launch_bounds__(AT_THREADS) k_attn_prefill(float *out, const float *q, const float *kc,
                                                             const float *vc, int n, const int32_t *seq,
                                                             const int32_t *pos, const int32_t *bt, int max_blocks,
                                                             int n_heads, int n_kv, int bs, float scale, int window,
                                                             const float *sinks)
{
    pdl_enter();
    constexpr int STR = HD + 8; /* halves per shared row */
    constexpr int C4 = HD / 4;  /* float4s per row */
    constexpr int NK = HD / 16; /* k-slices of Q K^T, and dim pairs of n8-tiles of P V */
    __shared__ __align__(16) __half sk[AT_BN][STR]; /* K tile [key][d], fp16; Q first */
    __shared__ __align__(16) __half sv[AT_BN][STR]; /* V tile [key][d], fp16 */
    __shared__ int s_seq[AT_BM], s_pos[AT_BM];
    __shared__ int s_last[AT_BM]; /* first row of a sequence: the largest pos of its rows; else -1 */
    __shared__ int s_first[AT_BM]; /* first row of a sequence: the smallest window start of its rows */
    __shared__ long long s_off[AT_BN]; /* cache offset (floats) of the tile's keys; -1: none */

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int h = blockIdx.y, kvh = h / (n_heads / n_kv);
    const int row0 = blockIdx.x * AT_BM, nvalid = min(AT_BM, n - row0);

    if (tid < nvalid) {
        s_seq[tid] = seq[row0 + tid];
        s_pos[tid] = pos[row0 + tid];
    }
    /* Q, times scale * log2(e) (the softmax runs in base 2), to fp16 in sk; rows past n zero */
    const float qs = scale * AT_LOG2E;
#pragma unroll 4
    for (int i = 0; i < AT_BM * C4 / AT_THREADS; i++) {
        const int c = tid + i * AT_THREADS, r = c / C4, c4 = c % C4;
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (r < nvalid) {
            v = __ldg(reinterpret_cast<const float4 *>(q + ((size_t)(row0 + r) * n_heads + h) * HD) + c4);
            v.x *= qs, v.y *= qs, v.z *= qs, v.w *= qs;
        }
        s_st4(&sk[r][c4 * 4], v);
    }
    __syncthreads();
    if (tid < nvalid) {
        const int sq = s_seq[tid];
        bool first = true;
        int last = -1, lo = INT_MAX;
        for (int j = 0; j < nvalid; j++)
            if (s_seq[j] == sq) {
                first &= j >= tid;
                last = max(last, s_pos[j]);
                lo = min(lo, window > 0 ? max(0, s_pos[j] + 1 - window) : 0);
            }
        s_last[tid] = first ? last : -1;
        s_first[tid] = lo;
    }
    /* this warp's Q as A fragments, k-slice kk: rows warp*16 + (lane & 15), dims kk*16 + (lane >> 4)*8 */
    uint32_t qf[NK][4];
#pragma unroll
    for (int kk = 0; kk < NK; kk++) ldm4(qf[kk], &sk[warp * 16 + (lane & 15)][kk * 16 + (lane >> 4) * 8]);
    __syncthreads(); /* s_last complete; and the loop below writes sk only after its own barrier */

    /* this thread's two rows: warp*16 + g and + 8 */
    const int ra = warp * 16 + g, rb = ra + 8;
    const bool va = ra < nvalid, vb = rb < nvalid;
    const int sqa = va ? s_seq[ra] : 0, sqb = vb ? s_seq[rb] : 0;
    const int psa = va ? s_pos[ra] : -1, psb = vb ? s_pos[rb] : -1;
    /* the rows' window starts (0 without a window) */
    const int wsa = window > 0 ? max(0, psa + 1 - window) : 0, wsb = window > 0 ? max(0, psb + 1 - window) : 0;

    float acc[2 * NK][4]; /* n8-tile j: dims j*8 + 2t, +1; c0 c1 row ra, c2 c3 row rb */
#pragma unroll
    for (int j = 0; j < 2 * NK; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    float ma = -INFINITY, mb = -INFINITY, la = 0.f, lb = 0.f; /* l: this thread's columns only */

    for (int r = 0; r < nvalid; r++) {
        const int last = s_last[r];
        if (last < 0) continue;
        const int sq = s_seq[r];
        const int lima = va && sqa == sq ? psa : -1, limb = vb && sqb == sq ? psb : -1;
        int wlim = max(lima, limb); /* the warp's last unmasked key of this pass */
        /* and its first: the smallest window start of its rows in the pass */
        int wlo = min(lima >= 0 ? wsa : INT_MAX, limb >= 0 ? wsb : INT_MAX);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            wlim = max(wlim, __shfl_xor_sync(0xffffffffu, wlim, o));
            wlo = min(wlo, __shfl_xor_sync(0xffffffffu, wlo, o));
        }

        for (int k0 = s_first[r]; k0 <= last; k0 += AT_BN) {
            /* s_off's readers (the loads below) of the previous tile are all past its second
             * barrier, so it may be rewritten before the first */
            if (tid < AT_BN) {
                const int p = k0 + tid;
                bool need = p <= last;
                if (need && window > 0) { /* inside the window of some row of the pass */
                    need = false;
                    for (int j = 0; j < nvalid && !need; j++)
                        need = s_seq[j] == sq && p <= s_pos[j] && p >= s_pos[j] + 1 - window;
                }
                s_off[tid] = need ? (long long)kv_off(bt, max_blocks, sq, p, kvh, n_kv, HD, bs) : -1ll;
            }
            __syncthreads(); /* s_off written; every warp done with the previous tile's sk, sv */
#pragma unroll 4
            for (int i = 0; i < AT_BN * C4 / AT_THREADS; i++) {
                const int c = tid + i * AT_THREADS, r2 = c / C4, c4 = c % C4;
                const long long o = s_off[r2];
                float4 kv = make_float4(0.f, 0.f, 0.f, 0.f), vv = kv;
                if (o >= 0) {
                    kv = __ldg(reinterpret_cast<const float4 *>(kc + o) + c4);
                    vv = __ldg(reinterpret_cast<const float4 *>(vc + o) + c4);
                }
                s_st4(&sk[r2][c4 * 4], kv);
                s_st4(&sv[r2][c4 * 4], vv);
            }
            __syncthreads();
            /* every key of the tile is masked for this warp's rows */
            if (k0 > wlim || k0 + AT_BN <= wlo) continue;

            /* S = Q K^T: n8-tiles 2jp, 2jp+1 (keys jp*16 .. +15) from one ldmatrix.x4 whose
             * matrices are (keys +0..7, dims +0..7), (+0..7, +8..15), (+8..15, +0..7), (+8..15, +8..15) */
            float s[AT_BN / 8][4];
#pragma unroll
            for (int j = 0; j < AT_BN / 8; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
            for (int kk = 0; kk < NK; kk++)
#pragma unroll
                for (int jp = 0; jp < AT_BN / 16; jp++) {
                    uint32_t b[4];
                    ldm4(b, &sk[jp * 16 + (lane >> 4) * 8 + (lane & 7)][kk * 16 + ((lane >> 3) & 1) * 8]);
                    mma_16816(s[2 * jp], qf[kk], b[0], b[1]);
                    mma_16816(s[2 * jp + 1], qf[kk], b[2], b[3]);
                }

            /* mask, row maxima (a row's 64 keys are spread over the 4 lanes of a quad) */
            float xa = -INFINITY, xb = -INFINITY;
#pragma unroll
            for (int j = 0; j < AT_BN / 8; j++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int key = k0 + j * 8 + 2 * t + e;
                    if (key > lima || key < wsa) s[j][e] = -INFINITY;
                    if (key > limb || key < wsb) s[j][2 + e] = -INFINITY;
                    xa = fmaxf(xa, s[j][e]);
                    xb = fmaxf(xb, s[j][2 + e]);
                }
#pragma unroll
            for (int o = 1; o < 4; o <<= 1) {
                xa = fmaxf(xa, __shfl_xor_sync(0xffffffffu, xa, o));
                xb = fmaxf(xb, __shfl_xor_sync(0xffffffffu, xb, o));
            }
            const float na = fmaxf(ma, xa), nb = fmaxf(mb, xb);
            const float ua = na == -INFINITY ? 0.f : na, ub = nb == -INFINITY ? 0.f : nb;
            const float ca = exp2f(ma - ua), cb = exp2f(mb - ub); /* 0 while m was -inf */
            ma = na, mb = nb;
            float sa = 0.f, sb = 0.f;
#pragma unroll
            for (int j = 0; j < AT_BN / 8; j++) {
                s[j][0] = exp2f(s[j][0] - ua), s[j][1] = exp2f(s[j][1] - ua);
                s[j][2] = exp2f(s[j][2] - ub), s[j][3] = exp2f(s[j][3] - ub);
                sa += s[j][0] + s[j][1];
                sb += s[j][2] + s[j][3];
            }
            la = la * ca + sa;
            lb = lb * cb + sb;
#pragma unroll
            for (int j = 0; j < 2 * NK; j++) acc[j][0] *= ca, acc[j][1] *= ca, acc[j][2] *= cb, acc[j][3] *= cb;

            /* O += P V: key k-slice kk (keys kk*16 ..) as A from P's n8-tiles 2kk, 2kk+1; V's
             * dim n8-tiles 2dp, 2dp+1 from one ldmatrix.x4.trans whose matrices are
             * (keys +0..7, dims +0..7), (+8..15, +0..7), (+0..7, +8..15), (+8..15, +8..15) */
#pragma unroll
            for (int kk = 0; kk < AT_BN / 16; kk++) {
                uint32_t a[4];
                a[0] = s_pack(s[2 * kk][0], s[2 * kk][1]);
                a[1] = s_pack(s[2 * kk][2], s[2 * kk][3]);
                a[2] = s_pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
                a[3] = s_pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
                for (int dp = 0; dp < NK; dp++) {
                    uint32_t b[4];
                    ldm4_t(b, &sv[kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)][dp * 16 + (lane >> 4) * 8]);
                    mma_16816(acc[2 * dp], a, b[0], b[1]);
                    mma_16816(acc[2 * dp + 1], a, b[2], b[3]);
                }
            }
        }
    }

    /* l over the quad's columns; out = acc / l */
#pragma unroll
    for (int o = 1; o < 4; o <<= 1) {
        la += __shfl_xor_sync(0xffffffffu, la, o);
        lb += __shfl_xor_sync(0xffffffffu, lb, o);
    }
    if (sinks) {
        const float sk = __ldg(sinks + h) * AT_LOG2E, na = fmaxf(ma, sk), nb = fmaxf(mb, sk);
        const float fa = exp2f(ma - na), fb = exp2f(mb - nb);
        la = la * fa + exp2f(sk - na);
        lb = lb * fb + exp2f(sk - nb);
#pragma unroll
        for (int j = 0; j < 2 * NK; j++) acc[j][0] *= fa, acc[j][1] *= fa, acc[j][2] *= fb, acc[j][3] *= fb;
    }
    const float ia = la > 0.f ? 1.f / la : 0.f, ib = lb > 0.f ? 1.f / lb : 0.f;
    float *oa = out + ((size_t)(row0 + ra) * n_heads + h) * HD + 2 * t;
    float *ob = out + ((size_t)(row0 + rb) * n_heads + h) * HD + 2 * t;
#pragma unroll
    for (int j = 0; j < 2 * NK; j++) {
        if (va) *reinterpret_cast<float2 *>(oa + j * 8) = make_float2(acc[j][0] * ia, acc[j][1] * ia);
        if (vb) *reinterpret_cast<float2 *>(ob + j * 8) = make_float2(acc[j][2] * ib, acc[j][3] * ib);
    }
}

/* cuda_attention_prefill_ex on a stream (cuda_ops.h). */
static int attn_prefill(cudaStream_t st, float *out, const float *q, const float *k_cache, const float *v_cache, int n,
                 const int32_t *seq, const int32_t *pos, const int32_t *bt, int max_blocks, int n_heads,
                 int n_kv_heads, int head_dim, int block_size, float scale, int window, const float *sinks)
{
    if (n <= 0) return 0;
    if ((head_dim != 64 && head_dim != 128) || n_heads <= 0 || n_heads > 65535 || n_kv_heads <= 0 ||
        n_heads % n_kv_heads || block_size <= 0)
        return STRATA_EINVAL_INPUT;
    /* float4 loads of q and the caches, float2 stores of out */
    if (((uintptr_t)out | (uintptr_t)q | (uintptr_t)k_cache | (uintptr_t)v_cache) % 16) return STRATA_EINVAL_INPUT;
    const dim3 grid(cdiv(n, AT_BM), n_heads);
    if (head_dim == 128)
        launch_k(k_attn_prefill<128>, grid, AT_THREADS, 0, st, out, q, k_cache, v_cache, n, seq, pos, bt, max_blocks,
                 n_heads, n_kv_heads, block_size, scale, window, sinks);
    else
        launch_k(k_attn_prefill<64>, grid, AT_THREADS, 0, st, out, q, k_cache, v_cache, n, seq, pos, bt, max_blocks,
                 n_heads, n_kv_heads, block_size, scale, window, sinks);
    CUDA_LAUNCH_CHECK();
    return 0;
}

extern "C" int cuda_attention_prefill(cuda_ctx_t *c, float *out, const float *q, const float *k_cache,
                                      const float *v_cache, int n, const int32_t *seq, const int32_t *pos,
                                      const int32_t *bt, int max_blocks, int n_heads, int n_kv_heads, int head_dim,
                                      int block_size, float scale)
{
    return attn_prefill(c->stream, out, q, k_cache, v_cache, n, seq, pos, bt, max_blocks, n_heads, n_kv_heads,
                        head_dim, block_size, scale, 0, NULL);
}

extern "C" int cuda_attention_prefill_ex(cuda_ctx_t *c, float *out, const float *q, const float *k_cache,
                                         const float *v_cache, int n, const int32_t *seq, const int32_t *pos,
                                         const int32_t *bt, int max_blocks, int n_heads, int n_kv_heads, int head_dim,
                                         int block_size, float scale, const cuda_attn_opts_t *opts)
{
    return attn_prefill(c->stream, out, q, k_cache, v_cache, n, seq, pos, bt, max_blocks, n_heads, n_kv_heads,
                        head_dim, block_size, scale, opts && opts->window > 0 ? opts->window : 0,
                        opts ? opts->sinks : NULL);
}
