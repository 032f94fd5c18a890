/* ctx.cu - CUDA context (device, stream, cuBLAS handle) and memory helpers. */
#include <cublas_v2.h>
#include <stdlib.h>

#include "kernels/cuda/cuda_common.cuh"

extern "C" int cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

extern "C" int cuda_ctx_create(cuda_ctx_t **out, int device)
{
    cuda_ctx_t *c = (cuda_ctx_t *)calloc(1, sizeof *c);
    if (!c) return STRATA_ENOMEM;
    c->device = device;
    cublasHandle_t h = NULL;
    CUDA_CHECK(cudaSetDevice(device));
    CUDA_CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) {
        log_error("cublasCreate failed");
        cudaStreamDestroy(c->stream);
        free(c);
        return STRATA_ECUDA;
    }
    cublasSetStream(h, c->stream);
    c->cublas = h;
    *out = c;
    return 0;
}

extern "C" void cuda_ctx_destroy(cuda_ctx_t *c)
{
    if (!c) return;
    if (c->cublas) cublasDestroy((cublasHandle_t)c->cublas);
    if (c->stream) cudaStreamDestroy(c->stream);
    free(c);
}

extern "C" int cuda_mem_info(size_t *free_b, size_t *total_b)
{
    CUDA_CHECK(cudaMemGetInfo(free_b, total_b));
    return 0;
}

extern "C" int cuda_malloc(void **p, size_t bytes)
{
    CUDA_CHECK(cudaMalloc(p, bytes ? bytes : 1));
    return 0;
}

extern "C" void cuda_free(void *p)
{
    if (p) cudaFree(p);
}

extern "C" int cuda_memset(cuda_ctx_t *c, void *p, int byte, size_t bytes)
{
    CUDA_CHECK(cudaMemsetAsync(p, byte, bytes, c->stream));
    return 0;
}

extern "C" int cuda_h2d(cuda_ctx_t *c, void *dst, const void *src, size_t bytes)
{
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream));
    return 0;
}

extern "C" int cuda_d2h(cuda_ctx_t *c, void *dst, const void *src, size_t bytes)
{
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream));
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    return 0;
}

extern "C" int cuda_sync(cuda_ctx_t *c)
{
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    return 0;
}
