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
    cudaStream_t stream;      /* CUDA_STREAM_COMPUTE */
    cudaStream_t copy_stream; /* CUDA_STREAM_COPY */
    void *cublas;             /* cublasHandle_t */
};

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
