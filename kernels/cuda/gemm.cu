/* gemm.cu - tensor-core GEMM with fused dequantization (see gemm.cuh).
 *
 * mma.sync m16n8k16 fragments (PTX ISA, "Matrix fragments for mma.m16n8k16"), with
 * g = lane / 4 and t = lane % 4:
 *   A (16 x 16, tokens x k): loaded by ldmatrix.x4 from the fp16 X tile in shared memory;
 *   B (16 x 8, k x weight rows): register 0 holds k = 2t, 2t+1 and register 1 k = 2t+8, 2t+9,
 *     both of weight row g, lower k in the lower half;
 *   C (16 x 8): c0, c1 at (token g, rows 2t, 2t+1), c2, c3 at token g + 8.
 * B comes from the raw weight tile in shared memory and is dequantized in registers:
 *   INT4: a 32-column block is 16 bytes, byte j = column j (low nibble) | column 16+j (high),
 *     so bytes 2t, 2t+1, 2t+8, 2t+9 give k-slice 0 (low nibbles) and k-slice 1 (high
 *     nibbles). Nibbles become fp16 through the exponent trick (0x6400 | v = 1024 + v), minus
 *     the +8 offset, times the group scale;
 *   MXFP4: a 32-column block is 16 bytes, byte j = column 2j (low nibble) | 2j+1 (high), so a B
 *     register's column pair is one byte: byte 8kk + t (b0) and 8kk + t + 4 (b1) of the stage's
 *     row. Its two e2m1 values become fp16 exactly by a table lookup of their high bytes (the
 *     low bytes are 0), times the block's scale 2^(s - 127) in fp16: exact wherever the weight
 *     is an fp16 value (scales 2^-23 .. 2^13; checkpoints' are far inside);
 *   INT8/FP8: bytes to fp16 exactly; the per-row scale is applied to the fp32 result;
 *   BF16: to fp16 by rounding (weights are far inside fp16 range). */
#include <type_traits>

#include "kernels/cuda/gemm.cuh"

#define GM_BN 128          /* weight rows per block tile (SWIGLU: 64 gate + 64 up), a warp per 32 */
#define GM_BK 64           /* k per pipeline stage */
#define GM_STAGES 3
/* blocks an SM (but BF16's, whose stages are larger). Measured at Mixtral-8x7B's 512-token MoE
 * (cuda_ops): 1992 us at 4; 2024 at 3 (4 stages: 2045); 2237 at 2; 256-row tiles of 8 warps
 * at 2, 3 or 4 stages: 2243 */
#define GM_MINB 4
#define GM_THREADS GM_BN
#define GM_ASTR 144        /* bytes per X row in shared memory: 64 halves + 16 bytes of padding */
#define GM_MAX 3           /* matrices sharing x in one plain launch (q, k, v) */

/* Bytes of one weight row per GM_BK columns. */
template <int FMT> __host__ __device__ constexpr int gm_rb()
{
    return FMT == WF_INT4 || FMT == WF_MXFP4 ? 32 : FMT == WF_BF16 ? 128 : 64;
}
template <int FMT> __host__ __device__ constexpr int gm_stage_bytes() { return GEMM_BM * GM_ASTR + GM_BN * (gm_rb<FMT>() + 16); }

__device__ __forceinline__ void cp16(void *dst, const void *src, bool pred)
{
    const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(pred ? 16 : 0));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ uint32_t h2u(__half2 h) { return *reinterpret_cast<uint32_t *>(&h); }
__device__ __forceinline__ __half2 u2h(uint32_t u) { return *reinterpret_cast<__half2 *>(&u); }

/* Two fp16 weights of one row from a 16-bit word (columns c, c+1) of slice kk; INT4 words hold
 * bytes whose low nibbles are slice 2b and high nibbles slice 2b+1 of block b. */
template <int FMT> __device__ __forceinline__ uint32_t gm_pair(uint32_t x, int kk, __half2 s)
{
    if constexpr (FMT == WF_INT4) {
        const uint32_t w = __byte_perm(x, 0, 0x4140);
        if ((kk & 1) == 0) {
            const __half2 v = u2h((w & 0x000F000Fu) | 0x64006400u);
            return h2u(__hmul2(__hsub2(v, __float2half2_rn(1032.f)), s));
        }
        const __half2 v = u2h((w & 0x00F000F0u) | 0x64006400u);
        return h2u(__hmul2(__hfma2(v, __float2half2_rn(0.0625f), __float2half2_rn(-72.f)), s));
    } else if constexpr (FMT == WF_INT8) {
        const uint32_t w = __byte_perm(x ^ 0x8080u, 0x64, 0x4140);
        return h2u(__hsub2(u2h(w), __float2half2_rn(1152.f)));
    } else { /* WF_FP8 */
        __half2_raw r = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)x, __NV_E4M3);
        return h2u(__half2(r));
    }
}

/* The fp16 pair (low half: the low nibble's column) of one MXFP4 byte b, times s. e2m1 as fp16
 * has a zero low byte; its high bytes by magnitude 0, 0.5, 1, 1.5, 2, 3, 4, 6 are 00 38 3C 3E
 * 40 42 44 46, looked up into bytes 1 and 3 (bytes 0 and 2 take table byte 0, which is 0), and
 * each nibble's sign bit goes to its half's sign. */
__device__ __forceinline__ uint32_t gm_mx_pair(uint32_t b, __half2 s)
{
    const uint32_t sel = (b & 0x7u) << 4 | (b & 0x70u) << 8;
    const uint32_t v = __byte_perm(0x3E3C3800u, 0x46444240u, sel) | (b & 0x8u) << 12 | (b & 0x80u) << 24;
    return h2u(__hmul2(u2h(v), s));
}

/* B fragment (b0, b1) of k-slice kk (16 columns of the stage) for the weight row at rowp. */
template <int FMT>
__device__ __forceinline__ void gm_bfrag(const uint8_t *rowp, int kk, int t, __half2 s, uint32_t &b0, uint32_t &b1)
{
    if constexpr (FMT == WF_MXFP4) {
        const uint8_t *p = rowp + kk * 8 + t;
        b0 = gm_mx_pair(p[0], s);
        b1 = gm_mx_pair(p[4], s);
    } else if constexpr (FMT == WF_BF16) {
        const uint32_t u0 = *(const uint32_t *)(rowp + kk * 32 + 4 * t);
        const uint32_t u1 = *(const uint32_t *)(rowp + kk * 32 + 16 + 4 * t);
        b0 = h2u(__floats2half2_rn(__uint_as_float(u0 << 16), __uint_as_float(u0 & 0xffff0000u)));
        b1 = h2u(__floats2half2_rn(__uint_as_float(u1 << 16), __uint_as_float(u1 & 0xffff0000u)));
    } else {
        const uint8_t *p = rowp + (FMT == WF_INT4 ? (kk >> 1) * 16 : kk * 16) + 2 * t;
        b0 = gm_pair<FMT>(*(const uint16_t *)p, kk, s);
        b1 = gm_pair<FMT>(*(const uint16_t *)(p + 8), kk, s);
    }
}

typedef struct {
    const __half *x;
    __half *h;
    float *y[GM_MAX];              /* plain: matrix i's output, rows of its N; grouped: y[0] */
    const float *bias[GM_MAX];
    int nblk[GM_MAX + 1];          /* plain: matrix i takes blockIdx.x nblk[i] .. nblk[i+1] - 1 */
    int count;
    int N, K;                      /* grouped: output columns and k; plain: K (N is w[i].rows) */
    bool accum;                    /* plain: y += instead of y = */
    qmat_t w[GM_MAX];              /* plain: the matrices, sharing x; swiglu: gate, up */
    int M;                         /* plain: rows of x */
    int bm;                        /* plain: rows of x a tile (GEMM_BM, or half of it, see gemm_plain) */
    const cuda_expert_t *experts;  /* grouped: the expert table */
    const int2 *tiles;
    const int32_t *n_tiles, *offsets;
    size_t zstride;                /* grouped, k split over blockIdx.z: floats between parts' y (plain:
                                      M x the matrix's rows) */
    moe_act_t act;                 /* grouped SWIGLU: the activation and the experts' gate/up biases */
} gm_args_t;

/* 4 blocks per SM where shared memory allows it (not BF16's larger stages): 5% faster int4
 * MoE prefill than 1, in A/B runs, despite a few spilled registers. */
template <int FMT, bool SWIGLU, bool KSPLIT = false>
__global__ void __launch_bounds__(GM_THREADS, FMT == WF_BF16 ? 1 : GM_MINB) k_gemm(gm_args_t a)
{
    pdl_enter();
    extern __shared__ __align__(16) uint8_t sm[];
    constexpr int RB = gm_rb<FMT>(), BSTR = RB + 16, STAGE = gm_stage_bytes<FMT>(), CPR = RB / 16;
    int m0, mend, N = a.N, bx = blockIdx.x;
    float *y = a.y[0];
    const float *bias = a.bias[0];
    const uint8_t *d0 = (const uint8_t *)a.w[0].data, *d1 = (const uint8_t *)a.w[1].data;
    const void *s0 = a.w[0].scales, *s1 = a.w[1].scales;
    int group = a.w[0].group;
    const float *ubias = NULL; /* SWIGLU: the expert's up biases (its gate biases take bias) */
    if (a.tiles) {
        int e, cnt;
        if (!moe_tile(a.tiles, a.n_tiles, a.offsets, a.experts, blockIdx.y, e, m0, cnt)) return;
        const cuda_expert_t *ex = a.experts + e;
        if (SWIGLU) {
            d0 = (const uint8_t *)ex->gate.data, s0 = ex->gate.scales, group = ex->gate.group;
            d1 = (const uint8_t *)ex->up.data, s1 = ex->up.scales;
            bias = a.act.gb ? a.act.gb + (size_t)e * N : NULL;
            ubias = a.act.ub ? a.act.ub + (size_t)e * N : NULL;
        } else {
            const qmat_t &dq = moe_down_rows(*ex, bx * GM_BN); /* split % GM_BN == 0 */
            d0 = (const uint8_t *)dq.data, s0 = dq.scales, group = dq.group;
        }
        mend = m0 + cnt;
    } else {
        m0 = blockIdx.y * a.bm;
        mend = min(m0 + a.bm, a.M);
        if (!SWIGLU) { /* static indexing only, so the arguments stay in parameter space */
            const int i = (bx >= a.nblk[1]) + (a.count > 2 && bx >= a.nblk[2]);
            const qmat_t w = i == 0 ? a.w[0] : i == 1 ? a.w[1] : a.w[2];
            d0 = (const uint8_t *)w.data, s0 = w.scales, group = w.group;
            y = i == 0 ? a.y[0] : i == 1 ? a.y[1] : a.y[2];
            bias = i == 0 ? a.bias[0] : i == 1 ? a.bias[1] : a.bias[2];
            bx -= i == 0 ? 0 : i == 1 ? a.nblk[1] : a.nblk[2];
            N = w.rows;
        }
    }
    /* k stages kt0 .. kt0 + KT - 1: all of them, or (KSPLIT, its own instance, so the others'
     * registers are as they were) blockIdx.z's part of gridDim.z */
    const int K = a.K, KT = K / GM_BK / (KSPLIT ? (int)gridDim.z : 1), kt0 = KSPLIT ? (int)blockIdx.z * KT : 0;
    if (KSPLIT) y += (size_t)blockIdx.z * (a.tiles ? a.zstride : (size_t)a.M * N);
    const int nbase = bx * (SWIGLU ? GM_BN / 2 : GM_BN);
    const size_t wrow = q_row_bytes(FMT, K);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;

    auto load = [&](int st, int kt) {
        uint8_t *As = sm + st * STAGE, *Bs = As + GEMM_BM * GM_ASTR;
#pragma unroll
        for (int i = 0; i < GEMM_BM * 8 / GM_THREADS; i++) { /* X: 64 rows x 8 chunks */
            const int c = tid + i * GM_THREADS, r = c >> 3, ch = c & 7, row = m0 + r;
            const bool ok = row < mend;
            cp16(As + r * GM_ASTR + ch * 16, a.x + (size_t)(ok ? row : m0) * K + (kt0 + kt) * GM_BK + ch * 8, ok);
        }
#pragma unroll
        for (int i = 0; i < CPR; i++) { /* W: 128 rows x CPR chunks */
            const int c = tid + i * GM_THREADS, r = c / CPR, ch = c % CPR;
            const uint8_t *d = SWIGLU && r >= GM_BN / 2 ? d1 : d0;
            const int wr = nbase + (SWIGLU ? (r & (GM_BN / 2 - 1)) : r);
            const bool ok = wr < N;
            cp16(Bs + r * BSTR + ch * 16, d + (size_t)(ok ? wr : 0) * wrow + (size_t)(kt0 + kt) * RB + ch * 16, ok);
        }
    };

    /* this thread's B rows (in the tile) for its 4 n8-tiles, and their global weight rows */
    int brow[4], grow[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        if (SWIGLU) {
            brow[j] = (j < 2 ? 0 : GM_BN / 2) + warp * 16 + (j & 1) * 8 + g;
            grow[j] = nbase + warp * 16 + (j & 1) * 8 + g;
        } else {
            brow[j] = warp * 32 + j * 8 + g;
            grow[j] = nbase + brow[j];
        }
    }

#pragma unroll
    for (int s = 0; s < GM_STAGES - 1; s++) {
        if (s < KT) load(s, s);
        cp_commit();
    }
    /* INT4 group scales (MXFP4 block scales) of a stage: [n8-tile][32-column block] */
    auto load_scales = [&](__half2 (*out)[2], int kt) {
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int b = 0; b < 2; b++) {
                if constexpr (FMT == WF_INT4) {
                    const uint16_t *sp = (const uint16_t *)(SWIGLU && j >= 2 ? s1 : s0);
                    const int gr = grow[j] < N ? grow[j] : 0;
                    const uint16_t v = __ldg(sp + (size_t)gr * (K / group) + ((kt0 + kt) * GM_BK + b * 32) / group);
                    out[j][b] = __half2half2(__ushort_as_half(v));
                } else if constexpr (FMT == WF_MXFP4) {
                    const uint8_t *sp = (const uint8_t *)(SWIGLU && j >= 2 ? s1 : s0);
                    const int gr = grow[j] < N ? grow[j] : 0;
                    const uint8_t v = __ldg(sp + (size_t)gr * (K / 32) + (kt0 + kt) * (GM_BK / 32) + b);
                    out[j][b] = __float2half2_rn(d_e8m0(v));
                } else {
                    out[j][b] = __float2half2_rn(1.f);
                }
            }
    };
    __half2 sc[4][2], scn[4][2];
    load_scales(sc, 0);
    /* the main loop and the epilogue for the NM 16-row slices of the tile that hold tokens: the
     * others take no MMA, so a partial tile costs its rows (a branch per MMA instead made full
     * tiles 18% slower; one copy of the loop per NM: Mixtral prefill 6504 -> 6536, Qwen3 13338
     * -> 13742). Each copy has only its NM slices' accumulators, so the short ones, most tiles of
     * a small prefill's experts, keep fewer registers live and spill less */
    auto tile = [&](auto nm_c) {
        constexpr int NM = decltype(nm_c)::value;
        float acc[NM][4][4];
#pragma unroll
        for (int i = 0; i < NM; i++)
#pragma unroll
            for (int j = 0; j < 4; j++)
#pragma unroll
                for (int q = 0; q < 4; q++) acc[i][j][q] = 0.f;
        for (int kt = 0; kt < KT; kt++) {
            cp_wait<GM_STAGES - 2>();
            __syncthreads();
            if (kt + GM_STAGES - 1 < KT) load((kt + GM_STAGES - 1) % GM_STAGES, kt + GM_STAGES - 1);
            cp_commit();
            const uint8_t *As = sm + (kt % GM_STAGES) * STAGE, *Bs = As + GEMM_BM * GM_ASTR;
            /* the next stage's scales are in flight while this one computes */
            if (kt + 1 < KT) load_scales(scn, kt + 1);
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                uint32_t af[NM][4];
#pragma unroll
                for (int i = 0; i < NM; i++) {
                    ldm4(af[i], As + (i * 16 + (lane & 15)) * GM_ASTR + (kk * 16 + (lane >> 4) * 8) * 2);
                }
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    uint32_t b0, b1;
                    gm_bfrag<FMT>(Bs + brow[j] * BSTR, kk, t, sc[j][kk >> 1], b0, b1);
#pragma unroll
                    for (int i = 0; i < NM; i++) mma_16816(acc[i][j], af[i], b0, b1);
                }
            }
#pragma unroll
            for (int j = 0; j < 4; j++) sc[j][0] = scn[j][0], sc[j][1] = scn[j][1];
        }
        cp_wait<0>();

        /* epilogue: per column pair, the INT8/FP8 row scales (gate's and up's for SwiGLU) and
         * the bias (not SwiGLU's); then per token row, the activation (with the expert's gate and
         * up biases) to fp16 or the plain (accumulated) fp32 result */
        float mul[4][2], add[4][2];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int n = nbase + (SWIGLU ? warp * 16 + (j & 1) * 8 : warp * 32 + j * 8) + 2 * t;
            const void *sc = SWIGLU && j >= 2 ? s1 : s0;
#pragma unroll
            for (int q = 0; q < 2; q++) {
                const bool in = n + q < N;
                mul[j][q] = (FMT == WF_INT8 || FMT == WF_FP8) && in ? __ldg((const float *)sc + n + q) : 1.f;
                add[j][q] = !SWIGLU && bias && in ? __ldg(bias + n + q) : 0.f;
            }
        }
#pragma unroll
        for (int i = 0; i < NM; i++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const int m = m0 + i * 16 + g + hf * 8;
                if (m >= mend) continue;
#pragma unroll
                for (int j = 0; j < (SWIGLU ? 2 : 4); j++) {
                    const int n = nbase + (SWIGLU ? warp * 16 + j * 8 : warp * 32 + j * 8) + 2 * t;
                    float v[2];
#pragma unroll
                    for (int q = 0; q < 2; q++) {
                        const float x = acc[i][j][hf * 2 + q] * mul[j][q] + add[j][q];
                        if (SWIGLU) {
                            float g = x, up = acc[i][j + 2][hf * 2 + q] * mul[j + 2][q];
                            /* the expert's biases, read here (not held from the column loop
                             * above: fewer registers live); without them the sums alone */
                            if (bias && n + q < N) g += __ldg(bias + n + q);
                            if (ubias && n + q < N) up += __ldg(ubias + n + q);
                            v[q] = fminf(fmaxf(moe_act_fn(a.act, g, up), -65504.f), 65504.f);
                        } else {
                            v[q] = x + (a.accum && n + q < N ? y[(size_t)m * N + n + q] : 0.f);
                        }
                    }
                    const bool pair = n + 1 < N && (N & 1) == 0;
                    if (SWIGLU) {
                        __half *o = a.h + (size_t)m * N + n;
                        if (pair) *(__half2 *)o = __floats2half2_rn(v[0], v[1]);
                        else for (int q = 0; q < 2; q++) if (n + q < N) o[q] = __float2half_rn(v[q]);
                    } else {
                        float *o = y + (size_t)m * N + n;
                        if (pair) *(float2 *)o = make_float2(v[0], v[1]);
                        else for (int q = 0; q < 2; q++) if (n + q < N) o[q] = v[q];
                    }
                }
            }
    };
    const int nm = (mend - m0 + 15) >> 4;
    if (nm >= 4) tile(std::integral_constant<int, 4>());
    else if (nm == 3) tile(std::integral_constant<int, 3>());
    else if (nm == 2) tile(std::integral_constant<int, 2>());
    else tile(std::integral_constant<int, 1>());
}

template <int FMT, bool SWIGLU, bool KSPLIT = false> static int s_launch(cudaStream_t st, dim3 grid, const gm_args_t &a)
{
    constexpr int smem = GM_STAGES * gm_stage_bytes<FMT>();
    static bool attr_set; /* per instantiation; one device per process */
    if (!attr_set) {
        CUDA_CHECK(cudaFuncSetAttribute(k_gemm<FMT, SWIGLU, KSPLIT>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        attr_set = true;
    }
    launch_k(k_gemm<FMT, SWIGLU, KSPLIT>, grid, GM_THREADS, smem, st, a);
    CUDA_LAUNCH_CHECK();
    return 0;
}

template <bool SWIGLU, bool KSPLIT = false> static int s_dispatch(cudaStream_t st, wfmt_t fmt, dim3 grid, const gm_args_t &a)
{
    switch (fmt) {
    case WF_INT4: return s_launch<WF_INT4, SWIGLU, KSPLIT>(st, grid, a);
    case WF_MXFP4: return s_launch<WF_MXFP4, SWIGLU, KSPLIT>(st, grid, a);
    case WF_INT8: return s_launch<WF_INT8, SWIGLU, KSPLIT>(st, grid, a);
    case WF_FP8: return s_launch<WF_FP8, SWIGLU, KSPLIT>(st, grid, a);
    case WF_BF16: return s_launch<WF_BF16, SWIGLU, KSPLIT>(st, grid, a);
    default: log_error("gemm: format %d has no GEMM path", (int)fmt); return STRATA_EINVAL_INPUT;
    }
}

/* Eight columns of w a thread, so that a warp's stores are 512 contiguous bytes (INT4: the
 * low or high nibbles of 8 bytes of a 32-column block; MXFP4: 4 bytes, both nibbles; INT8/FP8:
 * 8 bytes; BF16: 16), written
 * after the PDL wait: the GEMM before this launch may still read dst. */
template <int FMT> __global__ void k_dequant(__half *dst, qmat_t w, size_t chunks)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t per_row = (size_t)w.cols / 8;
    const bool in = i < chunks;
    const size_t r = in ? i / per_row : 0, c0 = in ? (i % per_row) * 8 : 0;
    uint4 u = make_uint4(0, 0, 0, 0);
    float s = 1.f;
    if (in) {
        const uint8_t *row = (const uint8_t *)w.data + r * q_row_bytes(FMT, w.cols);
        if constexpr (FMT == WF_INT4) { /* byte j of a block: column j low, column 16 + j high */
            const uint2 v = __ldg((const uint2 *)(row + (c0 / 32) * 16 + (c0 & 8)));
            u.x = v.x, u.y = v.y;
            s = d_f16(((const uint16_t *)w.scales)[r * (w.cols / w.group) + c0 / w.group]);
        } else if constexpr (FMT == WF_MXFP4) { /* byte j of a block: columns 2j (low), 2j + 1 (high) */
            u.x = __ldg((const uint32_t *)(row + c0 / 2));
            s = d_e8m0(((const uint8_t *)w.scales)[r * (w.cols / 32) + c0 / 32]);
        } else if constexpr (FMT == WF_BF16) {
            u = __ldg((const uint4 *)(row + c0 * 2));
        } else {
            const uint2 v = __ldg((const uint2 *)(row + c0));
            u.x = v.x, u.y = v.y;
            s = ((const float *)w.scales)[r];
        }
    }
    pdl_enter();
    if (!in) return;
    const uint8_t *b = (const uint8_t *)&u;
    const bool high = (c0 & 16) != 0;
    __align__(16) __half o[8];
#pragma unroll
    for (int j = 0; j < 8; j++) {
        float v;
        if constexpr (FMT == WF_INT4)
            v = (float)((high ? b[j] >> 4 : b[j] & 15) - 8) * s;
        else if constexpr (FMT == WF_MXFP4) /* exact in fp32, then rounded once to fp16 */
            v = d_e2m1(j & 1 ? b[j / 2] >> 4 : b[j / 2]) * s;
        else if constexpr (FMT == WF_INT8)
            v = (float)(int8_t)b[j] * s;
        else if constexpr (FMT == WF_FP8)
            v = d_fp8(b[j]) * s;
        else
            v = d_bf16(((const uint16_t *)b)[j]);
        o[j] = __float2half_rn(v);
    }
    *(uint4 *)(dst + r * w.cols + c0) = *(const uint4 *)o;
}

int gemm_dequant(cudaStream_t st, __half *dst, const qmat_t *w)
{
    const size_t chunks = (size_t)w->rows * (w->cols / 8);
    const unsigned blocks = (unsigned)((chunks + 255) / 256);
    switch (w->fmt) {
    case WF_INT4: launch_k(k_dequant<WF_INT4>, blocks, 256, 0, st, dst, *w, chunks); break;
    case WF_MXFP4: launch_k(k_dequant<WF_MXFP4>, blocks, 256, 0, st, dst, *w, chunks); break;
    case WF_INT8: launch_k(k_dequant<WF_INT8>, blocks, 256, 0, st, dst, *w, chunks); break;
    case WF_FP8: launch_k(k_dequant<WF_FP8>, blocks, 256, 0, st, dst, *w, chunks); break;
    case WF_BF16: launch_k(k_dequant<WF_BF16>, blocks, 256, 0, st, dst, *w, chunks); break;
    default: log_error("gemm_dequant: format %d", (int)w->fmt); return STRATA_EINVAL_INPUT;
    }
    CUDA_LAUNCH_CHECK();
    return 0;
}

__global__ void k_to_half(__half *dst, const float *src, const int32_t *rows, int div, int cols)
{
    pdl_enter();
    const int r = blockIdx.x;
    const float *s = src + (size_t)(rows ? rows[r] / div : r) * cols;
    __half *d = dst + (size_t)r * cols;
    for (int c = threadIdx.x * 2; c < cols; c += blockDim.x * 2) /* cols is even (a multiple of 64) */
        *(__half2 *)(d + c) = __floats2half2_rn(s[c], s[c + 1]);
}

int gemm_to_half(cudaStream_t st, __half *dst, const float *src, const int32_t *rows, int div, int n, int cols)
{
    if (n <= 0) return 0;
    launch_k(k_to_half, n, 256, 0, st, dst, src, rows, div, cols);
    CUDA_LAUNCH_CHECK();
    return 0;
}

/* y[i] = (accum ? y[i] : 0) + bias[i % N4] + the sum of the S parts' part[s * n4 + i], in s
 * order (bias NULL: none); float4s. */
__global__ void k_sum_parts(float4 *y, const float4 *part, int S, size_t n4, const float4 *bias, int N4, bool accum)
{
    pdl_enter();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n4) return;
    float4 v = part[i];
    for (int s = 1; s < S; s++) {
        const float4 u = part[(size_t)s * n4 + i];
        v.x += u.x, v.y += u.y, v.z += u.z, v.w += u.w;
    }
    if (bias) {
        const float4 b = bias[i % N4];
        v.x += b.x, v.y += b.y, v.z += b.z, v.w += b.w;
    }
    if (accum) {
        const float4 u = y[i];
        v.x += u.x, v.y += u.y, v.z += u.z, v.w += u.w;
    }
    y[i] = v;
}

static int s_sum_parts(cudaStream_t st, float *y, const float *part, int S, size_t n, const float *bias, int N, bool accum)
{
    const size_t n4 = n / 4;
    launch_k(k_sum_parts, cdiv((long)n4, 256), 256, 0, st, (float4 *)y, (const float4 *)part, S, n4,
             (const float4 *)bias, N / 4, accum);
    CUDA_LAUNCH_CHECK();
    return 0;
}

int gemm_plain(cudaStream_t st, int sms, int count, float *const *ys, const __half *x, int M, const qmat_t *const *ws,
               const float *const *biases, bool accum, float *part, size_t part_floats)
{
    gm_args_t a = {};
    a.x = x, a.M = M, a.K = ws[0]->cols, a.accum = accum;
    /* the leading matrices of ws[0]'s format, up to GM_MAX, in this launch; the rest after it */
    size_t outs = 0;
    bool sums = true; /* k_sum_parts can finish this launch's matrices (float4s) */
    while (a.count < count && a.count < GM_MAX && ws[a.count]->fmt == ws[0]->fmt) {
        const int i = a.count++;
        a.w[i] = *ws[i], a.y[i] = ys[i], a.bias[i] = biases ? biases[i] : NULL;
        a.nblk[i + 1] = a.nblk[i] + cdiv(ws[i]->rows, GM_BN);
        outs += (size_t)M * ws[i]->rows;
        sums = sums && ws[i]->rows % 4 == 0 && ((uintptr_t)ys[i] | (uintptr_t)a.bias[i]) % 16 == 0;
    }
    /* The tile height (GEMM_BM or half of it) and the parts k is split in (S: 1, 2 or 4) that
     * put the most blocks in one wave (4 an SM, BF16 1), taller tiles first, then fewer parts.
     * Half-height tiles dequantize each weight twice as often, but leave no SM idle. Measured,
     * Mixtral-8x7B's 512-token prefill: o 154 -> 137 us a layer (256 -> 512 blocks); q/k/v
     * 145 -> 226 (384 -> 768 blocks, two waves). Parts (a matrix's sums in part, then added up
     * in order, with the bias and the accumulation, by k_sum_parts) for the 24 GiB bench's
     * 128-token prefill, whose o had 128 blocks and q/k/v 192. */
    const int per_sm = ws[0]->fmt == WF_BF16 ? 1 : GM_MINB, wave = per_sm * sms, KT = a.K / GM_BK;
    const int nb = a.nblk[a.count];
    int S = 1, best = 0;
    a.bm = GEMM_BM;
    for (int bm = GEMM_BM; bm >= GEMM_BM / 2; bm /= 2)
        for (int s = 1; s <= 4; s *= 2) {
            if (s > 1 && (!sums || KT % s || KT / s < 2 || (size_t)s * outs > part_floats)) continue;
            const int blocks = nb * cdiv(M, bm) * s;
            if (blocks <= wave && blocks > best) best = blocks, a.bm = bm, S = s;
        }
    int rc;
    if (S == 1) {
        rc = s_dispatch<false>(st, ws[0]->fmt, dim3(nb, cdiv(M, a.bm)), a);
    } else {
        float *pi = part;
        for (int i = 0; i < a.count; i++) {
            a.y[i] = pi, a.bias[i] = NULL;
            pi += (size_t)S * M * ws[i]->rows;
        }
        a.accum = false;
        rc = s_dispatch<false, true>(st, ws[0]->fmt, dim3(nb, cdiv(M, a.bm), S), a);
        for (int i = 0; i < a.count && !rc; i++)
            rc = s_sum_parts(st, ys[i], a.y[i], S, (size_t)M * ws[i]->rows, biases ? biases[i] : NULL, ws[i]->rows, accum);
    }
    if (rc || a.count == count) return rc;
    return gemm_plain(st, sms, count - a.count, ys + a.count, x, M, ws + a.count, biases ? biases + a.count : NULL, accum,
                      part, part_floats);
}

/* A grouped launch's arguments (gemm_moe, gemm_moe_down). */
static gm_args_t s_moe_args(bool swiglu, const __half *x, float *y, __half *h, int hidden, int inter,
                            const cuda_expert_t *experts, const int2 *tiles, const int32_t *n_tiles,
                            const int32_t *offsets)
{
    gm_args_t a = {};
    a.x = x, a.y[0] = y, a.h = h, a.experts = experts, a.tiles = tiles, a.n_tiles = n_tiles, a.offsets = offsets;
    a.N = swiglu ? inter : hidden;
    a.K = swiglu ? hidden : inter;
    return a;
}

int gemm_moe(cudaStream_t st, bool swiglu, const __half *x, float *y, __half *h, int hidden, int inter, wfmt_t fmt,
             const cuda_expert_t *experts, const int2 *tiles, const int32_t *n_tiles, const int32_t *offsets,
             int max_tiles, const moe_act_t *act)
{
    gm_args_t a = s_moe_args(swiglu, x, y, h, hidden, inter, experts, tiles, n_tiles, offsets);
    if (swiglu && act) a.act = *act;
    dim3 grid(cdiv(a.N, swiglu ? GM_BN / 2 : GM_BN), max_tiles);
    return swiglu ? s_dispatch<true>(st, fmt, grid, a) : s_dispatch<false>(st, fmt, grid, a);
}

int gemm_moe_down(cudaStream_t st, int sms, const __half *x, float *y, int hidden, int inter, wfmt_t fmt,
                  const cuda_expert_t *experts, const int2 *tiles, const int32_t *n_tiles, const int32_t *offsets,
                  int max_tiles, int P, float *part, size_t part_floats)
{
    /* Mixtral-8x7B's 128-token MoE: 12 tiles x 32 column blocks, 384 blocks of 224 k stages,
     * fewer than the 528 an H200 holds at once; 4 parts: the 24 GiB bench's time to first token
     * (its 128-token prefill, compute-bound) went from about 41 to 35.6 ms. The k-split kernel is
     * its own instance: the change in the others' registers cost the 512-token prefill 1.6% */
    const int blocks = cdiv(hidden, GM_BN) * max_tiles, KT = inter / GM_BK;
    int S = 1;
    if (blocks < sms * GM_MINB && hidden % 4 == 0)
        for (int c = 4; c >= 2 && S == 1; c /= 2)
            if (KT % c == 0 && (size_t)c * P * hidden <= part_floats) S = c;
    if (S == 1)
        return gemm_moe(st, false, x, y, NULL, hidden, inter, fmt, experts, tiles, n_tiles, offsets, max_tiles, NULL);
    gm_args_t a = s_moe_args(false, x, part, NULL, hidden, inter, experts, tiles, n_tiles, offsets);
    a.zstride = (size_t)P * hidden;
    int rc = s_dispatch<false, true>(st, fmt, dim3(cdiv(hidden, GM_BN), max_tiles, S), a);
    if (rc) return rc;
    return s_sum_parts(st, y, part, S, (size_t)P * hidden, NULL, hidden, false);
}
