/* ctx.cu - CUDA context (device, compute and copy streams, activation workspace, cuBLAS) and memory helpers. */
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>

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

int cuda_pdl_on;

extern "C" int cuda_ctx_create(cuda_ctx_t **out, int device)
{
    cuda_ctx_t *c = (cuda_ctx_t *)calloc(1, sizeof *c);
    if (!c) return STRATA_ENOMEM;
    c->device = device;
    CUDA_CHECK(cudaSetDevice(device));
    CUDA_CHECK(cudaDeviceGetAttribute(&c->sms, cudaDevAttrMultiProcessorCount, device));
    int major = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    const char *no_pdl = getenv("STRATA_NO_PDL");
    cuda_pdl_on = major >= 9 && !(no_pdl && *no_pdl && strcmp(no_pdl, "0") != 0);
    CUDA_CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&c->copy_stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&c->copy_stream2, cudaStreamNonBlocking));
    /* the small copies a step enqueues while a kernel may be waiting for the host's mailbox
     * (cuda_wait_patch) are loaded now: CUDA loads a kernel on its first launch, which can wait
     * for the device */
    int rc = cuda_ops_preload();
    if (rc) {
        cuda_ctx_destroy(c);
        return rc;
    }
    *out = c;
    return 0;
}

static size_t s_al256(size_t b) { return (b + 255) & ~(size_t)255; }

extern "C" size_t cuda_q8_bytes(int rows, int cols)
{
    size_t e = (size_t)rows * cols;
    return s_al256(e) + 2 * s_al256((e / 32) * 4) + s_al256(e * 2) +
           s_al256((size_t)rows * CUDA_ARGMAX_PARTS * 8) + s_al256((size_t)rows * 4) + 256;
}

extern "C" int cuda_ctx_reserve_q8(cuda_ctx_t *c, int max_rows, int max_cols)
{
    size_t e = (size_t)max_rows * max_cols;
    if (e <= c->q8_elems && max_rows <= c->am_rows) return 0;
    if (c->q8) cudaFree(c->q8);
    c->q8 = NULL;
    c->am_part = NULL;
    c->am_done = NULL;
    c->rt_done = NULL;
    c->q8_elems = 0;
    c->am_rows = 0;
    char *p;
    CUDA_CHECK(cudaMalloc((void **)&p, cuda_q8_bytes(max_rows, max_cols)));
    c->q8 = (int8_t *)p;
    c->q8d = (float *)(p + s_al256(e));
    c->q8s = (int32_t *)((char *)c->q8d + s_al256((e / 32) * 4));
    c->x16 = (__half *)((char *)c->q8s + s_al256((e / 32) * 4));
    c->am_part = (unsigned long long *)((char *)c->x16 + s_al256(e * 2));
    c->am_done = (unsigned *)((char *)c->am_part + s_al256((size_t)max_rows * CUDA_ARGMAX_PARTS * 8));
    c->rt_done = (unsigned *)((char *)c->am_done + s_al256((size_t)max_rows * 4));
    CUDA_CHECK(cudaMemset(c->am_done, 0, s_al256((size_t)max_rows * 4) + 256));
    c->q8_elems = e;
    c->am_rows = max_rows;
    return 0;
}

/* cuBLAS's workspace: what it asks for on sm_90 to pick its fastest kernels */
#define BLAS_WS_BYTES ((size_t)32 << 20)

extern "C" int cuda_ctx_enable_blas(cuda_ctx_t *c, size_t weight_elems)
{
    if (c->blas) return 0;
    if (!c->x16) {
        log_error("cuda_ctx_enable_blas: reserve the activation workspace first");
        return STRATA_EINVAL_INPUT;
    }
    cublasHandle_t h = NULL;
    void *ws = NULL, *w16 = NULL;
    cublasStatus_t s = cublasCreate(&h);
    cudaError_t e = cudaSuccess;
    if (s == CUBLAS_STATUS_SUCCESS && (e = cudaMalloc(&ws, BLAS_WS_BYTES)) == cudaSuccess &&
        (e = cudaMalloc(&w16, weight_elems * sizeof(__half))) == cudaSuccess &&
        (s = cublasSetStream(h, c->stream)) == CUBLAS_STATUS_SUCCESS)
        s = cublasSetWorkspace(h, ws, BLAS_WS_BYTES);
    if (s != CUBLAS_STATUS_SUCCESS || e != cudaSuccess) {
        log_error("cuBLAS setup failed: %s", e != cudaSuccess ? cudaGetErrorString(e) : cublasGetStatusString(s));
        if (h) cublasDestroy(h);
        cudaFree(ws), cudaFree(w16);
        (void)cudaGetLastError();
        return STRATA_ECUDA;
    }
    c->blas = h, c->blas_ws = ws, c->w16 = (__half *)w16, c->w16_elems = weight_elems;
    return 0;
}

extern "C" uint64_t cuda_blas_gemms(const cuda_ctx_t *c) { return c->blas_gemms; }

extern "C" void cuda_ctx_lend_parts(cuda_ctx_t *c, void *scratch, size_t bytes)
{
    c->part = (float *)scratch;
    c->part_floats = scratch ? bytes / sizeof(float) : 0;
}

extern "C" void cuda_ctx_destroy(cuda_ctx_t *c)
{
    if (!c) return;
    if (c->blas) cublasDestroy((cublasHandle_t)c->blas);
    if (c->blas_ws) cudaFree(c->blas_ws);
    if (c->w16) cudaFree(c->w16);
    if (c->q8) cudaFree(c->q8);
    if (c->stream) cudaStreamDestroy(c->stream);
    if (c->copy_stream) cudaStreamDestroy(c->copy_stream);
    if (c->copy_stream2) cudaStreamDestroy(c->copy_stream2);
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

extern "C" int cuda_query(cuda_ctx_t *c)
{
    cudaError_t e = cudaStreamQuery(c->stream);
    if (e == cudaErrorNotReady) return 0;
    CUDA_CHECK(e);
    return 1;
}

static cudaStream_t s_stream(cuda_ctx_t *c, int which);

extern "C" int cuda_d2h_async(cuda_ctx_t *c, int stream, void *dst, const void *src, size_t bytes)
{
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s_stream(c, stream)));
    return 0;
}

extern "C" int cuda_sync(cuda_ctx_t *c)
{
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    return 0;
}

extern "C" int cuda_host_alloc(void **p, size_t bytes)
{
    CUDA_CHECK(cudaHostAlloc(p, bytes ? bytes : 1, cudaHostAllocPortable));
    return 0;
}

extern "C" void cuda_host_free(void *p)
{
    if (p) cudaFreeHost(p);
}

extern "C" int cuda_host_register(void *p, size_t bytes)
{
    CUDA_CHECK(cudaHostRegister(p, bytes, cudaHostRegisterPortable | cudaHostRegisterReadOnly));
    return 0;
}

extern "C" int cuda_host_device_ptr(const void *p, void **dev)
{
    CUDA_CHECK(cudaHostGetDevicePointer(dev, (void *)p, 0));
    return 0;
}

extern "C" void cuda_host_unregister(void *p)
{
    if (p) cudaHostUnregister(p);
}

static cudaStream_t s_stream(cuda_ctx_t *c, int which)
{
    return which == CUDA_STREAM_COPY ? c->copy_stream : which == CUDA_STREAM_COPY2 ? c->copy_stream2 : c->stream;
}

extern "C" int cuda_event_create(cuda_event_t **ev)
{
    cudaEvent_t e;
    CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    *ev = (cuda_event_t *)e;
    return 0;
}

extern "C" void cuda_event_destroy(cuda_event_t *ev)
{
    if (ev) cudaEventDestroy((cudaEvent_t)ev);
}

extern "C" int cuda_event_record(cuda_ctx_t *c, cuda_event_t *ev, int stream)
{
    CUDA_CHECK(cudaEventRecord((cudaEvent_t)ev, s_stream(c, stream)));
    return 0;
}

extern "C" int cuda_stream_wait_event(cuda_ctx_t *c, int stream, cuda_event_t *ev)
{
    CUDA_CHECK(cudaStreamWaitEvent(s_stream(c, stream), (cudaEvent_t)ev, 0));
    return 0;
}

extern "C" int cuda_event_done(cuda_event_t *ev)
{
    cudaError_t e = cudaEventQuery((cudaEvent_t)ev);
    if (e == cudaSuccess) return 1;
    if (e == cudaErrorNotReady) return 0;
    CUDA_CHECK(e);
    return STRATA_ECUDA;
}

extern "C" int cuda_h2d_async(cuda_ctx_t *c, int stream, void *dst, const void *src, size_t bytes)
{
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s_stream(c, stream)));
    return 0;
}

extern "C" int cuda_graph_begin(cuda_ctx_t *c)
{
    CUDA_CHECK(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal));
    return 0;
}

extern "C" int cuda_graph_end(cuda_ctx_t *c, cuda_graph_t **g)
{
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_CHECK(cudaStreamEndCapture(c->stream, &graph));
    cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    CUDA_CHECK(e);
    if (*g) cudaGraphExecDestroy((cudaGraphExec_t)*g);
    *g = (cuda_graph_t *)exec;
    return 0;
}

extern "C" int cuda_graph_launch(cuda_ctx_t *c, cuda_graph_t *g)
{
    CUDA_CHECK(cudaGraphLaunch((cudaGraphExec_t)g, c->stream));
    return 0;
}

extern "C" void cuda_graph_destroy(cuda_graph_t *g)
{
    if (g) cudaGraphExecDestroy((cudaGraphExec_t)g);
}
