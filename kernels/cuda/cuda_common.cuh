/* cuda_common.cuh - shared device helpers for kernels/cuda (internal; never included from C). */
#pragma once

#include <float.h>

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include "common/strata.h"
#include "kernels/cpu/qmat.h"
#include "kernels/cuda/cuda_ops.h"

struct cuda_ctx {
    int device;
    int sms;                  /* streaming multiprocessors */
    cudaStream_t stream;      /* CUDA_STREAM_COMPUTE */
    cudaStream_t copy_stream; /* CUDA_STREAM_COPY */
    cudaStream_t copy_stream2; /* CUDA_STREAM_COPY2 */
    /* activation workspace (cuda_ctx_reserve_q8): q8[rows][cols] int8,
     * q8d[rows][cols/32] fp32 block scales, q8s[rows][cols/32] int32 block sums of q */
    int8_t *q8;
    float *q8d;
    int32_t *q8s;
    __half *x16;              /* [rows][cols] fp16 activations for the tensor-core GEMM (gemm.cuh) */
    size_t q8_elems;
    /* argmax scratch (also cuda_ctx_reserve_q8): am_part[am_rows][CUDA_ARGMAX_PARTS] partial
     * keys, am_done[am_rows] counters (zero between launches) */
    unsigned long long *am_part;
    unsigned *am_done;
    int am_rows;
    unsigned *rt_done; /* cuda_router_topk's counter (zero between launches) */
    /* cuda_ctx_enable_blas: the cuBLAS handle (NULL: none), its workspace, and the fp16 weight
     * scratch of w16_elems halves */
    void *blas;
    void *blas_ws;
    __half *w16;
    size_t w16_elems;
    uint64_t blas_gemms;
    float *part;              /* cuda_ctx_lend_parts: the GEMM's k parts (part_floats floats) */
    size_t part_floats;
};

/* Most blocks cuda_argmax splits one row over. */
#define CUDA_ARGMAX_PARTS 128

/* Quantize one 32-column block to int8 (q), its scale (d = max|x| / 127) and the sum of its q
 * (s), one warp: lane i holds column i's value v. */
__device__ __forceinline__ void q8_quant_val(float v, int8_t *q, float *d, int32_t *s)
{
    const int lane = threadIdx.x & 31;
    float amax = fabsf(v);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float dd = amax / 127.f;
    const int qi = dd > 0.f ? __float2int_rn(v / dd) : 0;
    q[lane] = (int8_t)qi;
    int sum = qi;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) {
        *d = dd;
        *s = sum;
    }
}

/* The same for a block x[0..31] in memory. */
__device__ __forceinline__ void q8_quant_block(int8_t *q, float *d, int32_t *s, const float *x)
{
    q8_quant_val(x[threadIdx.x & 31], q, d, s);
}

/* The same with 8 lanes a block (lanes 8j..8j+7 of the warp: columns 4 (lane % 8) .. +3 in v),
 * bit for bit as q8_quant_val: q is the block's first byte; the group's first lane writes d, s.
 * Every lane of the warp must call it. */
__device__ __forceinline__ void q8_quant_f4(float4 v, int8_t *q, float *d, int32_t *s)
{
    const int sub = threadIdx.x & 7;
    float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
    for (int o = 4; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float dd = amax / 127.f;
    const int q0 = dd > 0.f ? __float2int_rn(v.x / dd) : 0, q1 = dd > 0.f ? __float2int_rn(v.y / dd) : 0;
    const int q2 = dd > 0.f ? __float2int_rn(v.z / dd) : 0, q3 = dd > 0.f ? __float2int_rn(v.w / dd) : 0;
    int sum = q0 + q1 + q2 + q3;
#pragma unroll
    for (int o = 4; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (q) {
        ((uint32_t *)q)[sub] = (uint32_t)(q0 & 0xff) | (uint32_t)(q1 & 0xff) << 8 | (uint32_t)(q2 & 0xff) << 16 |
                               (uint32_t)(q3 & 0xff) << 24;
        if (sub == 0) {
            *d = dd;
            *s = sum;
        }
    }
}

/* CUDA_CHECK: built on the project's one generic check; logs statement, file, line and the
 * CUDA error text, then returns STRATA_ECUDA from the enclosing function. */
#define CUDA_CHECK(stmt) \
    STRATA_CHECK_GEN(stmt, cudaError_t, r_ != cudaSuccess, cudaGetErrorString(r_), return STRATA_ECUDA)
/* After a kernel launch: catch launch-configuration errors. */
#define CUDA_LAUNCH_CHECK() CUDA_CHECK(cudaGetLastError())

__device__ __forceinline__ float d_bf16(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }
__device__ __forceinline__ float d_f16(uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ float d_fp8(uint8_t v)
{
    __half_raw hr = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)v, __NV_E4M3);
    return __half2float(__half(hr));
}

/* MXFP4 (kernels/cpu/qmat.h): every value below is built from its float bits, so it is exact
 * (subnormals included; nvcc keeps them without --use_fast_math), and a weight e2m1 * scale is
 * then one fp32 multiply, as qmat_dequant_row's is. 2^x for -149 <= x <= 127: the exponent field
 * in the normal range, else the subnormal bit 2^(x + 149). */
__device__ __forceinline__ float d_pow2(int x)
{
    return __uint_as_float(x >= -126 ? (uint32_t)(x + 127) << 23 : 0x00400000u >> (-127 - x));
}
/* An e8m0 scale byte: 2^(e - 127 - k) (k = 0 the weight's scale; k = 1 the integer path's, whose
 * weights are 2 * e2m1); NaN for 0xFF, which the loaders refuse. */
__device__ __forceinline__ float d_e8m0(uint32_t e, int k = 0)
{
    return e == 0xFFu ? __uint_as_float(0x7fc00000u) : d_pow2((int)e - 127 - k);
}
/* The e2m1 value of the low 4 bits of v (sign bit 3, exponent bits 2..1, mantissa bit 0, bias 1):
 * 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives (nibble 8 is -0). A nonzero exponent e is the
 * float exponent e - 1 with the mantissa bit on top of the float's; exponent 0 is 0 or 0.5. */
__device__ __forceinline__ float d_e2m1(uint32_t v)
{
    const uint32_t e = (v >> 1) & 3u, m = v & 1u;
    const uint32_t mag = e ? (e + 126u) << 23 | m << 22 : m ? 0x3f000000u : 0u;
    return __uint_as_float(mag | (v & 8u) << 28);
}
/* The integer path's weights: the four nibbles of the low 16 bits of x (nibble i = bits 4i..4i+3)
 * as the int8s 2 * e2m1 (in [-12, 12]), byte i from nibble i. Magnitudes and negated magnitudes
 * are looked up by the nibble's low 3 bits in two 8-byte tables, then bit 3 picks one of the two
 * per byte (every selector nibble below 8, so no byte_perm sign mode is involved). */
__device__ __forceinline__ int mxfp4_i8x4(uint32_t x)
{
    const uint32_t idx = x & 0x7777u;
    const uint32_t pos = __byte_perm(0x03020100u, 0x0C080604u, idx); /* 0 1 2 3 4 6 8 12 */
    const uint32_t neg = __byte_perm(0xFDFEFF00u, 0xF4F8FAFCu, idx); /* their negatives */
    return (int)__byte_perm(pos, neg, 0x3210u | ((x & 0x8888u) >> 1));
}

__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* The paged KV cache offset of (seq, pos, kv head): caches are [block][kv_head][bs][hd] and
 * bt[seq][max_blocks] maps a sequence's blocks. */
__device__ __forceinline__ size_t kv_off(const int32_t *bt, int max_blocks, int seq, int pos, int kvh, int n_kv,
                                         int hd, int bs)
{
    const int blk = bt[(size_t)seq * max_blocks + pos / bs];
    return (((size_t)blk * n_kv + kvh) * bs + pos % bs) * hd;
}

/* Tensor-core fragments (PTX ISA, "Matrix fragments for mma.m16n8k16"): c += a * b with a 16x16
 * fp16 A (4 registers), a 16x8 fp16 B (2) and fp32 C (4); ldm4/ldm4_t load four 8x8 fp16
 * matrices from shared memory (row addresses from lanes 0-7, 8-15, 16-23, 24-31), ldm4_t
 * transposed. */
__device__ __forceinline__ void mma_16816(float *c, const uint32_t *a, uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void ldm4(uint32_t *r, const void *p)
{
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
__device__ __forceinline__ void ldm4_t(uint32_t *r, const void *p)
{
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

/* Programmatic dependent launch (sm_90 and later). Every kernel of kernels/cuda starts with
 * pdl_enter(): it waits until the kernel before it in the stream has finished and its writes
 * are visible (griddepcontrol.wait), then lets the next kernel be launched at once
 * (launch_dependents), so that kernel's launch and block scheduling overlap this one's work
 * instead of following its last block. Without the launch attribute (older GPUs,
 * STRATA_NO_PDL=1, or a launch_kx with pdl false) the wait is a no-op and the kernel starts
 * after the one before it has finished. Work that reads nothing an earlier kernel writes may
 * come before it: k_gemv_q8 asks L2 for its weights there, so they arrive while the kernel
 * before finishes. */
__device__ __forceinline__ void pdl_enter()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

/* Ask L2 for [p, p + bytes) without waiting (sm_90's bulk prefetch; nothing on older GPUs).
 * p is rounded up and the end down to 16 bytes, so nothing outside the range is touched.
 * Measured on the H200 (batch-1 decode): the weights of the q8 GEMV before its PDL wait, Qwen3-
 * 30B-A3B 392 -> 409 tok/s (Mixtral-8x7B 293, unchanged); the expert GEMVs' next rows in their
 * grid-stride loops lost (Mixtral 293 -> 266), and so did the chosen experts' down matrices
 * asked for by the router (Qwen3 409 -> 350). */
__device__ __forceinline__ void l2_prefetch(const void *p, size_t bytes)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const uintptr_t a = ((uintptr_t)p + 15) & ~(uintptr_t)15, e = ((uintptr_t)p + bytes) & ~(uintptr_t)15;
    if (e > a) asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(a), "r"((unsigned)(e - a)) : "memory");
#endif
}

/* Whether launches carry the programmatic-serialization attribute (set by cuda_ctx_create:
 * compute capability 9.0 or later, unless STRATA_NO_PDL is set). */
extern int cuda_pdl_on;

/* Loads the kernels of ops.cu that a step enqueues between segments, or a chained step behind
 * the one before (cuda_ctx_create). */
extern "C" int cuda_ops_preload(void);

/* kernel<<<grid, block, smem, st>>>(args...), with programmatic dependent launch when on and pdl
 * (else the kernel starts after the one before it has finished, as without the attribute) and,
 * with cluster_z > 1, thread-block clusters of (1, 1, cluster_z) (sm_90). */
template <typename... KArgs, typename... Args>
static inline cudaError_t launch_kx(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t st,
                                    int cluster_z, bool pdl, Args &&...args)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cudaLaunchAttribute at[2];
    int na = 0;
    if (cuda_pdl_on && pdl) {
        at[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[na++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (cluster_z > 1) {
        at[na].id = cudaLaunchAttributeClusterDimension;
        at[na].val.clusterDim.x = 1;
        at[na].val.clusterDim.y = 1;
        at[na++].val.clusterDim.z = cluster_z;
    }
    cfg.attrs = at;
    cfg.numAttrs = na;
    return cudaLaunchKernelEx(&cfg, kernel, static_cast<Args &&>(args)...);
}

/* launch_kx with programmatic dependent launch. */
template <typename... KArgs, typename... Args>
static inline cudaError_t launch_kc(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t st,
                                    int cluster_z, Args &&...args)
{
    return launch_kx(kernel, grid, block, smem, st, cluster_z, true, static_cast<Args &&>(args)...);
}

/* launch_kc without clusters. */
template <typename... KArgs, typename... Args>
static inline cudaError_t launch_k(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t st,
                                   Args &&...args)
{
    return launch_kc(kernel, grid, block, smem, st, 1, static_cast<Args &&>(args)...);
}

/* Gate of one token, one warp: softmax over its E logits l (read through L2: they may come
 * from other blocks of the same grid), then iterative top-k (ties to the lower index), with
 * the selected probabilities renormalised to sum 1 when renorm. Lane j holds e = j, j + 32, ..
 * (EPL of them) in registers. Returns in lane k < top_k the k-th expert chosen (-1 in the
 * other lanes), which also writes idx[k] and weight[k]. */
#define GATE_MAX_E 1024
template <int EPL>
__device__ __forceinline__ int gate_topk_regs(const float *l, int E, int top_k, bool renorm, int32_t *idx,
                                              float *weight)
{
    const int lane = threadIdx.x & 31;
    float p[EPL];
    float m = -FLT_MAX;
#pragma unroll
    for (int j = 0; j < EPL; j++) {
        const int e = lane + 32 * j;
        p[j] = e < E ? __ldcg(l + e) : -FLT_MAX;
        m = fmaxf(m, p[j]);
    }
    m = warp_max(m);
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < EPL; j++)
        if (lane + 32 * j < E) {
            p[j] = expf(p[j] - m);
            s += p[j];
        }
    s = warp_sum(s);
#pragma unroll
    for (int j = 0; j < EPL; j++) p[j] = lane + 32 * j < E ? p[j] / s : -2.f; /* -2: never chosen */
    float sel_sum = 0.f, pv = 0.f;
    int pick = -1;
    for (int k = 0; k < top_k; k++) {
        float bv = -1.f;
        int bi = E;
#pragma unroll
        for (int j = 0; j < EPL; j++)
            if (p[j] > bv) {
                bv = p[j];
                bi = lane + 32 * j;
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
#pragma unroll
        for (int j = 0; j < EPL; j++)
            if (lane + 32 * j == bi) p[j] = -2.f;
        if (lane == k) {
            pick = bi;
            pv = bv;
        }
        sel_sum += bv;
    }
    if (lane < top_k) {
        idx[lane] = pick;
        weight[lane] = renorm ? pv / sel_sum : pv;
    }
    return pick;
}
__device__ __forceinline__ int gate_topk_warp(const float *l, int E, int top_k, bool renorm, int32_t *idx,
                                              float *weight)
{
    if (E <= 128) return gate_topk_regs<4>(l, E, top_k, renorm, idx, weight);
    return gate_topk_regs<GATE_MAX_E / 32>(l, E, top_k, renorm, idx, weight);
}

/* Sum of v over the block (every thread calls it; blockDim.x a multiple of 32). */
__device__ __forceinline__ float block_sum(float v)
{
    __shared__ float red[32];
    v = warp_sum(v);
    __syncthreads(); /* red may still be read from an earlier call */
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        float r = threadIdx.x < (blockDim.x >> 5) ? red[threadIdx.x] : 0.f;
        r = warp_sum(r);
        if (threadIdx.x == 0) red[0] = r;
    }
    __syncthreads();
    return red[0];
}

/* RMSNorm rows held in registers: thread i keeps float4s i, i + blockDim.x, ... (at most
 * RMS_PER_THREAD); one block a row, rms_threads(dim) threads. */
#define RMS_PER_THREAD 4
/* Whether an RMSNorm of n rows of dim can also write their int8 rows into the workspace: the
 * workspace takes them, and a row fits the float4 registers (rms_row_f4) that quantize. */
static inline bool rms_q8_ok(const cuda_ctx_t *c, int n, int dim)
{
    return cuda_q8_out_ok(c, n, dim) && dim / 4 <= RMS_PER_THREAD * 1024;
}
static inline int rms_threads(int dim)
{
    /* enough threads that a row is one float4 each (up to 4096 columns), then up to 4 each:
     * measured, 4 float4s a thread at 4096 made the combine's norm 5.9 -> 7.3 us (Mixtral-8x7B) */
    int threads = dim / 4 < 1024 ? (dim / 4 + 31) / 32 * 32 : 1024;
    return threads < 32 ? 32 : threads;
}
__device__ __forceinline__ bool rms_row_vec(int dim)
{
    return dim % 4 == 0 && dim / 4 <= RMS_PER_THREAD * (int)blockDim.x;
}

/* The norm's weights in rms_row_f4's layout (float4s threadIdx.x + k blockDim.x of w); no kernel
 * writes them, so a kernel loads them before its PDL wait. */
__device__ __forceinline__ void rms_w_f4(const float *w, int dim, float4 *g)
{
#pragma unroll
    for (int k = 0; k < RMS_PER_THREAD; k++) {
        const int i = threadIdx.x + k * blockDim.x;
        g[k] = i < dim / 4 ? __ldg((const float4 *)w + i) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
}

/* The second half of RMSNorm for row blockIdx.x held in v (ss: this thread's sum of squares;
 * g: the weights from rms_w_f4): yr = v * rsqrt(mean + eps) * g, and with q8 the row's int8
 * blocks (dim % 32 == 0). */
__device__ __forceinline__ void rms_row_f4(const float4 *v, float ss, int dim, float eps, const float4 *g, float *yr,
                                           int8_t *q8, float *q8d, int32_t *q8s)
{
    const float inv = rsqrtf(block_sum(ss) / (float)dim + eps);
    const int n4 = dim / 4;
#pragma unroll
    for (int k = 0; k < RMS_PER_THREAD; k++) {
        if (k * (int)blockDim.x >= n4) break; /* the same for the whole block */
        const int i = threadIdx.x + k * blockDim.x;
        float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
        if (i < n4) {
            o = make_float4(v[k].x * inv * g[k].x, v[k].y * inv * g[k].y, v[k].z * inv * g[k].z, v[k].w * inv * g[k].w);
            ((float4 *)yr)[i] = o;
        }
        /* 8 lanes a 32-column block (n4 % 8 == 0, so a group is all in or all out) */
        if (q8) {
            const size_t b = (size_t)blockIdx.x * (dim / 32) + i / 8;
            q8_quant_f4(o, i < n4 ? q8 + b * 32 : NULL, q8d + b, q8s + b);
        }
    }
}

static inline int cdiv(long a, long b) { return (int)((a + b - 1) / b); }
