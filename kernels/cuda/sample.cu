/* sample.cu - temperature / top-k / top-p sampling (cuda_sample.h): one block of 1024 threads a
 * row, with all scratch in shared memory.
 *
 * cpu_sample's semantics, in the terms used here. A token's key is the order-preserving 32-bit
 * image of its scaled logit, inverted (s_dkey), so that ascending (key, id) is cpu_sample's
 * candidate order: higher logit first, ties to the lower id. A cut (key, id) keeps the tokens
 * at or before it in that order. A row takes these steps, each a pass over the row or less
 * (600 KB at a vocabulary of 151936; a few dozen rows stay in L2 throughout):
 *   0. a greedy row (temperature <= 0, top_k == 1): a block argmax, and done;
 *   1. logits /= temperature, written back; the block max mx; with top-k, the histogram of the
 *      keys' first radix digit;
 *   2. top-k: a radix select of the top_k-th candidate, over three digits of the key (11, 11
 *      and 10 bits), a histogram pass each over the candidates whose higher digits match those
 *      chosen so far. If the cut falls inside a run of equal keys, a radix select over the ids
 *      of that run finds the id it ends at;
 *   3. top-p: the same radix select over the key, on histograms of the mass p = expf(l - mx) of
 *      the top-k set rather than of counts: the first candidate at which the cumulative mass
 *      reaches top_p of the set's. Every token of a run of equal keys has the same p, so how
 *      many of the run are needed is a division, and the id they end at a radix select;
 *   4. the draw: r = u * mass(kept), and the first kept token in id order whose cumulative
 *      mass exceeds r. The row is split into 32 segments, a warp each; the segment r falls in
 *      is split again, until one warp scans the last 32 tokens.
 * A select stops early once a digit's bin ends exactly at the cut (a count), or holds a single
 * candidate (a mass).
 *
 * Masses are fixed point: p rounded up to a multiple of 2^-40, so a positive p stays positive
 * (a draw at u = 0 then takes the first kept token of positive p, as cpu_sample does). Sums of
 * integers are exact whatever the order of the atomics, so a bin's sub-bins, or a segment's
 * sub-segments, add up to exactly the bin's or segment's mass: each level finds its crossing
 * inside the one before, and the result does not vary from run to run. A row's mass is at most
 * 2^21 * 2^40 = 2^61. A 64-bit atomicAdd on shared memory is a compare-and-swap loop, which
 * stalls when many lanes of a warp hit one bin, so a bin's mass is kept in two 32-bit words:
 * the low word is added atomically, and the carry out of it (seen from the old value returned)
 * goes into the high word with the high half of the mass. Counts use atomicAdd of 1, which the
 * hardware aggregates across a warp.
 */
#include <math.h>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_sample.h"

#define S_THREADS 1024
#define S_WARPS (S_THREADS / 32)
#define S_BINS 2048       /* the widest radix digit: 11 bits */
#define S_FIX 0x1p40f     /* a mass in fixed point: p * S_FIX, in units of 2^-40 */
#define S_ALL 0xffffffffu /* the id of a cut that keeps every token of its key */
#define S_BATCH 4         /* loads a thread issues before it uses them */

static_assert(S_BINS == 2 * S_THREADS, "s_pick gives each thread two bins");
static_assert(S_WARPS == 32, "one warp scans the per-warp partials");
static_assert(sizeof(cuda_sample_param_t) == 24, "cuda_sample_param_t is shared with C");

struct s_smem {
    uint32_t cnt[S_BINS];             /* tokens a bin */
    uint32_t mlo[S_BINS];             /* fixed-point mass a bin: the low 32 bits ... */
    uint32_t mhi[S_BINS];             /* ... and the bits above */
    unsigned long long part[S_WARPS]; /* per-warp partials: scans, segment masses, argmax keys */
    int wlast[S_WARPS];               /* per-warp last kept id (s_draw) */
    float fpart[S_WARPS];             /* per-warp max logit */
    float mx;
    /* s_pick's result: the bin, its count and mass, and the sum over the bins before it */
    uint32_t bin, bin_cnt;
    unsigned long long before, bin_mass;
    /* s_draw's narrowing: the segment [lo, hi), r relative to its start, the result */
    int lo, hi, pick, done;
    unsigned long long r;
};

/* A cut from a select: the tokens of the set with a smaller key, and the first `rank` (in id
 * order) of the `ties` tokens of the set at `key`; rank == ties keeps all of them. */
struct s_cut {
    uint32_t key, rank, ties;
};

/* Radix digits of a key, most significant first: bits 31..21, 20..10, 9..0. */
__device__ __forceinline__ int s_shift(int lv) { return lv == 0 ? 21 : lv == 1 ? 10 : 0; }
__device__ __forceinline__ uint32_t s_dmask(int lv) { return lv < 2 ? 0x7ffu : 0x3ffu; }
/* the bits of the digits before lv, and those below it */
__device__ __forceinline__ uint32_t s_himask(int lv) { return lv == 0 ? 0u : ~0u << s_shift(lv - 1); }
__device__ __forceinline__ uint32_t s_lowmask(int lv) { return (1u << s_shift(lv)) - 1u; }

/* The candidate key of a scaled logit: ascending key is descending logit; -0 and +0, which
 * compare equal, share one. */
__device__ __forceinline__ uint32_t s_dkey(float v)
{
    const uint32_t b = __float_as_uint(v == 0.f ? 0.f : v);
    return b ^ (((b >> 31) - 1u) & 0x7fffffffu);
}

/* A token's mass in units of 2^-40, rounded up: p <= 1, so at most 2^40. Every caller computes
 * it with this one expression, so all levels see the same integers. */
__device__ __forceinline__ unsigned long long s_fix(float v, float mx)
{
    return __float2ull_ru(expf(v - mx) * S_FIX);
}

/* An argmax key: the float's order in the high word, the inverted id in the low one, so the
 * largest key is the largest value at the lowest id. NaN never wins; -0 and +0 tie, as they
 * compare in cpu_sample (cuda_argmax ranks +0 above -0). */
__device__ __forceinline__ unsigned long long s_am_key(float v, int i)
{
    const uint32_t b = __float_as_uint(v == 0.f ? 0.f : v), ord = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    return v != v ? 0ull : ((unsigned long long)ord << 32) | (0xffffffffu - (uint32_t)i);
}

/* f(i, l[i]) for i = i0, i0 + stride, ... below end, the loads of S_BATCH of them issued before
 * any is used: one load at a time, a pass over a row would wait on L2's latency. f may write
 * l[i] (nothing else of l). */
template <typename F>
__device__ __forceinline__ void s_for(const float *l, int i0, int end, int stride, F f)
{
    for (int i = i0; i < end; i += S_BATCH * stride) {
        float v[S_BATCH];
#pragma unroll
        for (int k = 0; k < S_BATCH; k++) v[k] = i + k * stride < end ? l[i + k * stride] : 0.f;
#pragma unroll
        for (int k = 0; k < S_BATCH; k++)
            if (i + k * stride < end) f(i + k * stride, v[k]);
    }
}

/* Exclusive prefix sum of v over the block's threads in order; *total: the sum of all. Every
 * thread calls it. */
__device__ unsigned long long s_exscan(s_smem &s, unsigned long long v, unsigned long long *total)
{
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    unsigned long long x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const unsigned long long y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    __syncthreads(); /* s.part may still be read by the caller's previous use */
    if (lane == 31) s.part[w] = x;
    __syncthreads();
    if (w == 0) {
        unsigned long long t = s.part[lane];
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const unsigned long long y = __shfl_up_sync(0xffffffffu, t, o);
            if (lane >= o) t += y;
        }
        s.part[lane] = t;
    }
    __syncthreads();
    *total = s.part[S_WARPS - 1];
    return (w ? s.part[w - 1] : 0ull) + x - v;
}

/* Histogram of digit lv of the keys of the tokens in set `in` whose higher digits equal
 * `prefix`: counts into s.cnt, and with MASS their masses into s.mlo/s.mhi. BY_ID: the key is
 * the token id, and only the contiguous range of ids that match the prefix is read; else it is
 * the candidate key. in(key, id) takes the candidate key. Every thread calls it; a sync between
 * the last read of s.cnt, s.mlo, s.mhi and this call is the caller's. */
template <bool MASS, bool BY_ID, typename In>
__device__ void s_hist(s_smem &s, const float *l, int vocab, int lv, uint32_t prefix, In in, float mx)
{
    for (int b = threadIdx.x; b < S_BINS; b += S_THREADS) {
        s.cnt[b] = 0;
        if (MASS) s.mlo[b] = s.mhi[b] = 0;
    }
    __syncthreads();
    const int sh = s_shift(lv);
    const uint32_t hm = s_himask(lv), dm = s_dmask(lv);
    int i0 = 0, i1 = vocab;
    if (BY_ID) {
        const long long end = (long long)prefix + (1ll << (sh + (lv < 2 ? 11 : 10)));
        i0 = prefix < (uint32_t)vocab ? (int)prefix : vocab;
        i1 = end < vocab ? (int)end : vocab;
    }
    s_for(l, i0 + (int)threadIdx.x, i1, S_THREADS, [&](int i, float v) {
        const uint32_t k = s_dkey(v), key = BY_ID ? (uint32_t)i : k;
        if ((key & hm) != prefix || !in(k, (uint32_t)i)) return;
        const uint32_t d = (key >> sh) & dm;
        atomicAdd(&s.cnt[d], 1u);
        if (MASS) {
            const unsigned long long f = s_fix(v, mx);
            const uint32_t lo = (uint32_t)f;
            uint32_t hi = (uint32_t)(f >> 32);
            if (lo) hi += atomicAdd(&s.mlo[d], lo) > ~lo; /* the carry out of the low word */
            if (hi) atomicAdd(&s.mhi[d], hi);
        }
    });
    __syncthreads();
}

/* The first bin at which the inclusive running sum over the bins (their masses with MASS, else
 * their counts) reaches need >= 1: s.bin, its count and mass, and s.before, the sum over the
 * bins before it. With from_total, need is first set from the bins' total z: ceil(frac * z),
 * clamped to [1, z]. Returns need. Every thread calls it, after s_hist. Should no bin reach
 * need (inconsistent input: NaN or +inf logits), the result is bin 0, empty. */
template <bool MASS>
__device__ unsigned long long s_pick(s_smem &s, unsigned long long need, bool from_total, float frac)
{
    const int b0 = 2 * threadIdx.x;
    const uint32_t c0 = s.cnt[b0], c1 = s.cnt[b0 + 1];
    const unsigned long long m0 = MASS ? ((unsigned long long)s.mhi[b0] << 32 | s.mlo[b0]) : c0;
    const unsigned long long m1 = MASS ? ((unsigned long long)s.mhi[b0 + 1] << 32 | s.mlo[b0 + 1]) : c1;
    if (threadIdx.x == 0) {
        /* read by all after the last pick, but a histogram's syncs came in between */
        s.bin = 0, s.bin_cnt = 0, s.before = 0, s.bin_mass = 0;
    }
    unsigned long long total;
    const unsigned long long ex = s_exscan(s, m0 + m1, &total);
    if (from_total) {
        const double t = ceil((double)frac * (double)total);
        need = t < 1.0 ? 1ull : t >= (double)total ? total : (unsigned long long)t;
    }
    if (ex < need && ex + m0 + m1 >= need) { /* exactly one thread: the running sum only grows */
        const bool first = ex + m0 >= need;
        s.bin = first ? b0 : b0 + 1;
        s.bin_cnt = first ? c0 : c1;
        s.before = first ? ex : ex + m0;
        s.bin_mass = first ? m0 : m1;
    }
    __syncthreads();
    return need;
}

/* The rank-th (from 1) token of set `in` in ascending key order (BY_ID: the key is the id, and
 * the select starts at digit lv0; else the candidate key, with the first digit's histogram
 * already in s.cnt when have_hist). A cut found early (rank == ties) has its key's lower digits
 * all ones: it keeps everything up to the end of its bin. Every thread calls it. */
template <bool BY_ID, typename In>
__device__ s_cut s_count_select(s_smem &s, const float *l, int vocab, In in, uint32_t rank, int lv0, bool have_hist)
{
    uint32_t prefix = 0;
    for (int lv = lv0;; lv++) {
        if (lv > lv0 || !have_hist) s_hist<false, BY_ID>(s, l, vocab, lv, prefix, in, 0.f);
        s_pick<false>(s, rank, false, 0.f);
        rank -= (uint32_t)s.before;
        prefix |= s.bin << s_shift(lv);
        if (rank == s.bin_cnt || lv == 2) return {prefix | s_lowmask(lv), rank, s.bin_cnt};
    }
}

/* The first token of set `in`, in candidate order, at which the cumulative mass reaches frac of
 * the set's mass (at least the first token's: the set holds the row's best, of p = 1). As
 * s_count_select, a cut; rank: how many of the ties at its key are needed. */
template <typename In>
__device__ s_cut s_mass_select(s_smem &s, const float *l, int vocab, In in, float mx, float frac)
{
    uint32_t prefix = 0;
    unsigned long long need = 0;
    for (int lv = 0;; lv++) {
        s_hist<true, false>(s, l, vocab, lv, prefix, in, mx);
        need = s_pick<true>(s, need, lv == 0, frac) - s.before;
        prefix |= s.bin << s_shift(lv);
        const uint32_t c = s.bin_cnt;
        if (c <= 1) return {prefix | s_lowmask(lv), 1, 1};
        if (lv == 2) {
            /* one key, one p: the run's tokens are equal in mass; need is in (0, c * fp] */
            const unsigned long long fp = s.bin_mass / c;
            unsigned long long j = fp ? (need + fp - 1) / fp : 1;
            j = j < 1 ? 1 : j > c ? c : j;
            return {prefix, (uint32_t)j, c};
        }
    }
}

__device__ __forceinline__ unsigned long long s_warp_sum_u64(unsigned long long v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* The first token of set `kept` in id order whose cumulative mass exceeds u * mass(kept); the
 * last kept token if rounding leaves that unreached. Every thread calls it; all get the id. */
template <typename Kept>
__device__ int s_draw(s_smem &s, const float *l, int vocab, float mx, Kept kept, double u)
{
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    int lo = 0, hi = vocab;
    unsigned long long r = 0;
    for (bool first = true; first || hi - lo > 32; first = false) {
        /* warp w sums the masses of segment w of [lo, hi) */
        const int seg = (hi - lo + S_WARPS - 1) / S_WARPS;
        const int a = lo + w * seg, e = min(hi, a + seg);
        unsigned long long m = 0;
        int last = -1;
        s_for(l, a + lane, e, 32, [&](int i, float v) {
            if (kept(s_dkey(v), (uint32_t)i)) {
                m += s_fix(v, mx);
                last = i;
            }
        });
        m = s_warp_sum_u64(m);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) last = max(last, __shfl_xor_sync(0xffffffffu, last, o));
        __syncthreads(); /* s.part and the narrowing state may still be read */
        if (lane == 0) s.part[w] = m, s.wlast[w] = last;
        __syncthreads();
        if (threadIdx.x == 0) {
            if (first) {
                unsigned long long total = 0;
                int lk = -1;
                for (int k = 0; k < S_WARPS; k++) total += s.part[k], lk = max(lk, s.wlast[k]);
                r = (unsigned long long)(u * (double)total);
                s.pick = lk >= 0 ? lk : 0; /* the answer when r is not below the total */
                s.done = 0;
            }
            /* the first segment whose running mass exceeds r; found unless r >= the total */
            unsigned long long cum = 0;
            int k = 0;
            while (k < S_WARPS && r >= cum + s.part[k]) cum += s.part[k++];
            if (k == S_WARPS) {
                s.done = 1;
            } else {
                s.lo = lo + k * seg;
                s.hi = min(hi, s.lo + seg);
                s.r = r - cum;
            }
        }
        __syncthreads();
        if (s.done) return s.pick;
        lo = s.lo, hi = s.hi, r = s.r;
    }
    /* at most 32 tokens left, and r below their mass: one warp scans them */
    if (w == 0) {
        const int i = lo + lane;
        unsigned long long x = 0;
        if (i < hi) {
            const float v = l[i];
            if (kept(s_dkey(v), (uint32_t)i)) x = s_fix(v, mx);
        }
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const unsigned long long y = __shfl_up_sync(0xffffffffu, x, o);
            if (lane >= o) x += y;
        }
        const unsigned hit = __ballot_sync(0xffffffffu, r < x);
        if (lane == 0 && hit) s.pick = lo + __ffs(hit) - 1;
    }
    __syncthreads();
    return s.pick;
}

/* Row blockIdx.x; see the top of the file. */
__global__ void __launch_bounds__(S_THREADS, 1)
    k_sample(float *logits, int vocab, const cuda_sample_param_t *params, int32_t *ids)
{
    __shared__ s_smem s;
    pdl_enter();
    const int row = blockIdx.x, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    float *l = logits + (size_t)row * vocab;
    const cuda_sample_param_t p = params[row];

    if (p.temperature <= 0.f || p.top_k == 1) { /* greedy, on the unscaled logits */
        unsigned long long best = 0;
        s_for(l, threadIdx.x, vocab, S_THREADS, [&](int i, float v) {
            const unsigned long long k = s_am_key(v, i);
            best = k > best ? k : best;
        });
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const unsigned long long k = __shfl_xor_sync(0xffffffffu, best, o);
            best = k > best ? k : best;
        }
        if (lane == 0) s.part[w] = best;
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int k = 0; k < S_WARPS; k++) best = s.part[k] > best ? s.part[k] : best;
            ids[row] = best ? (int32_t)(0xffffffffu - (uint32_t)best) : 0;
        }
        return;
    }

    /* scale (written back, as cpu_sample leaves it), the max, and top-k's first digit */
    const bool topk = p.top_k > 0 && p.top_k < vocab;
    for (int b = threadIdx.x; b < S_BINS; b += S_THREADS) s.cnt[b] = 0;
    __syncthreads();
    float mx = -INFINITY;
    s_for(l, threadIdx.x, vocab, S_THREADS, [&](int i, float x) {
        const float v = x / p.temperature;
        l[i] = v;
        mx = fmaxf(mx, v);
        if (topk) atomicAdd(&s.cnt[s_dkey(v) >> s_shift(0)], 1u);
    });
    mx = warp_max(mx);
    if (lane == 0) s.fpart[w] = mx;
    __syncthreads(); /* also makes the scaled row visible to the whole block */
    if (threadIdx.x == 0) {
        float m = s.fpart[0];
        for (int k = 1; k < S_WARPS; k++) m = fmaxf(m, s.fpart[k]);
        s.mx = m;
    }
    __syncthreads();
    mx = s.mx;

    uint32_t tk_key = S_ALL, tk_id = S_ALL;
    if (topk) {
        const s_cut c = s_count_select<false>(s, l, vocab, [](uint32_t, uint32_t) { return true; },
                                              (uint32_t)p.top_k, 0, true);
        tk_key = c.key;
        if (c.rank < c.ties) { /* the cut splits a run of equal logits: which ids of it stay */
            const uint32_t key = c.key;
            tk_id = s_count_select<true>(s, l, vocab, [=](uint32_t k, uint32_t) { return k == key; }, c.rank, 1, false)
                        .key;
        }
    }
    const auto in_tk = [=](uint32_t k, uint32_t i) { return k < tk_key || (k == tk_key && i <= tk_id); };

    uint32_t nu_key = S_ALL, nu_id = S_ALL;
    if (p.top_p < 1.f) {
        const s_cut c = s_mass_select(s, l, vocab, in_tk, mx, p.top_p);
        nu_key = c.key;
        if (c.rank < c.ties) {
            const uint32_t key = c.key;
            nu_id = s_count_select<true>(s, l, vocab, [=](uint32_t k, uint32_t i) { return k == key && in_tk(k, i); },
                                         c.rank, 1, false)
                        .key;
        }
    }
    const auto kept = [=](uint32_t k, uint32_t i) {
        return in_tk(k, i) && (k < nu_key || (k == nu_key && i <= nu_id));
    };
    const int pick = s_draw(s, l, vocab, mx, kept, p.u);
    if (threadIdx.x == 0) ids[row] = pick;
}

extern "C" int cuda_sample(cuda_ctx_t *c, float *logits, int n, int vocab, const cuda_sample_param_t *params,
                           int32_t *ids)
{
    if (vocab < 1 || vocab > CUDA_SAMPLE_MAX_VOCAB) return STRATA_EINVAL_INPUT;
    if (n <= 0) return 0;
    launch_k(k_sample, n, S_THREADS, 0, c->stream, logits, vocab, params, ids);
    CUDA_LAUNCH_CHECK();
    return 0;
}
