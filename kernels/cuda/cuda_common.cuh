/* cuda_common.cuh - shared device helpers for kernels/cuda (internal; never included from C). */
#pragma once

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
    /* activation workspace (cuda_ctx_reserve_q8): q8[rows][cols] int8,
     * q8d[rows][cols/32] fp32 block scales, q8s[rows][cols/32] int32 block sums of q */
    int8_t *q8;
    float *q8d;
    int32_t *q8s;
    __half *x16;              /* [rows][cols] fp16 activations for the tensor-core GEMM (gemm.cuh) */
    size_t q8_elems;
};

/* Quantize one 32-column block x[0..31] to int8 (q), its scale (d = max|x| / 127) and the sum
 * of its q (s), one warp. */
__device__ __forceinline__ void q8_quant_block(int8_t *q, float *d, int32_t *s, const float *x)
{
    const int lane = threadIdx.x & 31;
    float v = x[lane];
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

static inline int cdiv(long a, long b) { return (int)((a + b - 1) / b); }
