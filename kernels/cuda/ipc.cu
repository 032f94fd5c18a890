/* ipc.cu - CUDA IPC memory and event handles, and the two kernels that measure copies through
 * them (see cuda_ipc.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_ipc.h"

static_assert(sizeof(cudaIpcMemHandle_t) == CUDA_IPC_HANDLE_BYTES, "memory handle size");
static_assert(sizeof(cudaIpcEventHandle_t) == CUDA_IPC_HANDLE_BYTES, "event handle size");

/* CUDA_CHECK for functions that clean up: log, then `goto fail`. */
#define CUDA_CHECK_FAIL(stmt) STRATA_CHECK_GEN(stmt, cudaError_t, r_ != cudaSuccess, cudaGetErrorString(r_), goto fail)

extern "C" int cuda_ipc_mem_export(void *dev, cuda_ipc_handle_t *h)
{
    cudaIpcMemHandle_t m;
    CUDA_CHECK(cudaIpcGetMemHandle(&m, dev));
    memcpy(h->bytes, &m, sizeof m);
    return 0;
}

extern "C" int cuda_ipc_mem_open(const cuda_ipc_handle_t *h, void **dev)
{
    cudaIpcMemHandle_t m;
    memcpy(&m, h->bytes, sizeof m);
    CUDA_CHECK(cudaIpcOpenMemHandle(dev, m, cudaIpcMemLazyEnablePeerAccess));
    return 0;
}

extern "C" int cuda_ipc_mem_close(void *dev)
{
    CUDA_CHECK(cudaDeviceSynchronize()); /* no copy into the mapping may still be in flight */
    CUDA_CHECK(cudaIpcCloseMemHandle(dev));
    return 0;
}

/* cuda_event_t is cudaEvent_t behind an opaque pointer type (ctx.cu casts the same way), so the
 * events made here work with cuda_ops.h's event calls. */
extern "C" int cuda_ipc_event_create(cuda_event_t **ev, cuda_ipc_handle_t *h)
{
    cudaEvent_t e;
    cudaIpcEventHandle_t eh;
    CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventInterprocess | cudaEventDisableTiming));
    if (cudaIpcGetEventHandle(&eh, e) != cudaSuccess) {
        log_error("cudaIpcGetEventHandle: %s", cudaGetErrorString(cudaGetLastError()));
        cudaEventDestroy(e);
        return STRATA_ECUDA;
    }
    memcpy(h->bytes, &eh, sizeof eh);
    *ev = (cuda_event_t *)e;
    return 0;
}

extern "C" int cuda_ipc_event_open(const cuda_ipc_handle_t *h, cuda_event_t **ev)
{
    cudaIpcEventHandle_t eh;
    cudaEvent_t e;
    memcpy(&eh, h->bytes, sizeof eh);
    CUDA_CHECK(cudaIpcOpenEventHandle(&e, eh));
    *ev = (cuda_event_t *)e;
    return 0;
}

__global__ void k_touch(const unsigned char *p, unsigned char expect, unsigned *bad)
{
    if (*(const volatile unsigned char *)p != expect) atomicAdd(bad, 1u);
}

extern "C" int cuda_ipc_touch(cuda_ctx_t *c, const void *p, unsigned char expect, unsigned *bad)
{
    k_touch<<<1, 1, 0, c->stream>>>((const unsigned char *)p, expect, bad);
    CUDA_LAUNCH_CHECK();
    return 0;
}

#define LOAD_MAX_DEPTH 8

struct cuda_ipc_load {
    cudaStream_t stream;          /* non-blocking: no implicit order with the context's streams */
    uint4 *buf;                   /* [n] device, read once a pass */
    size_t n;                     /* 16-byte words in buf */
    unsigned long long *read;     /* device: bytes the passes read, then the sink (unsigned) */
    unsigned long long *out;      /* pinned host: read, copied back at the stop */
    cudaEvent_t first;            /* timing: before the first pass */
    cudaEvent_t end[LOAD_MAX_DEPTH]; /* timing: after pass k, in end[k % depth] */
    cudaEvent_t back;             /* after the copy of read to out */
    int blocks, depth;
    long long issued, finished;
};

/* One pass over p, four 16-byte loads in flight a thread (one would not keep device memory
 * busy with half the SM's threads); the block adds what it read to *read. */
__global__ void __launch_bounds__(512) k_hbm_pass(const uint4 *__restrict__ p, size_t n, unsigned long long *read,
                                                  unsigned *sink)
{
    __shared__ unsigned long long blk;
    const size_t step = (size_t)gridDim.x * blockDim.x;
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    unsigned acc = 0;
    unsigned long long words = 0;
    if (threadIdx.x == 0) blk = 0;
    for (; i + 3 * step < n; i += 4 * step) {
        const uint4 a = __ldcs(p + i), b = __ldcs(p + i + step);
        const uint4 c = __ldcs(p + i + 2 * step), d = __ldcs(p + i + 3 * step);
        acc ^= a.x ^ b.y ^ c.z ^ d.w;
        words += 4;
    }
    for (; i < n; i += step) {
        acc ^= __ldcs(p + i).x;
        words++;
    }
    for (int o = 16; o > 0; o >>= 1) words += __shfl_down_sync(0xffffffffu, words, o);
    __syncthreads(); /* blk = 0 is seen by every warp */
    if ((threadIdx.x & 31) == 0) atomicAdd(&blk, words);
    __syncthreads();
    if (threadIdx.x == 0) atomicAdd(read, blk * 16);
    if (acc == 0x9E3779B9u) atomicAdd(sink, 1u); /* practically never */
}

static void s_load_free(cuda_ipc_load_t *l)
{
    if (l->stream) cudaStreamDestroy(l->stream);
    if (l->buf) cudaFree(l->buf);
    if (l->read) cudaFree(l->read);
    if (l->out) cudaFreeHost(l->out);
    if (l->first) cudaEventDestroy(l->first);
    for (int i = 0; i < LOAD_MAX_DEPTH; i++)
        if (l->end[i]) cudaEventDestroy(l->end[i]);
    if (l->back) cudaEventDestroy(l->back);
    free(l);
}

extern "C" int cuda_ipc_load_create(int device, size_t bytes, int depth, cuda_ipc_load_t **out)
{
    int sms = 0;
    cuda_ipc_load_t *l;
    if (depth < 1 || depth > LOAD_MAX_DEPTH || bytes < 16) {
        log_error("cuda_ipc_load_create: depth %d or %zu bytes out of range", depth, bytes);
        return -EINVAL;
    }
    if (!(l = (cuda_ipc_load_t *)calloc(1, sizeof *l))) return STRATA_ENOMEM;
    l->n = bytes / 16;
    l->depth = depth;
    CUDA_CHECK_FAIL(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    l->blocks = 2 * sms; /* of 512 threads: half of an sm_80/sm_90 SM's 2048 */
    CUDA_CHECK_FAIL(cudaStreamCreateWithFlags(&l->stream, cudaStreamNonBlocking));
    CUDA_CHECK_FAIL(cudaMalloc((void **)&l->buf, l->n * 16));
    CUDA_CHECK_FAIL(cudaMalloc((void **)&l->read, 2 * sizeof *l->read));
    CUDA_CHECK_FAIL(cudaHostAlloc((void **)&l->out, sizeof *l->out, cudaHostAllocDefault));
    CUDA_CHECK_FAIL(cudaEventCreate(&l->first));
    for (int i = 0; i < depth; i++) CUDA_CHECK_FAIL(cudaEventCreate(&l->end[i]));
    CUDA_CHECK_FAIL(cudaEventCreateWithFlags(&l->back, cudaEventDisableTiming));
    CUDA_CHECK_FAIL(cudaMemsetAsync(l->buf, 1, l->n * 16, l->stream));
    CUDA_CHECK_FAIL(cudaMemsetAsync(l->read, 0, 2 * sizeof *l->read, l->stream));
    CUDA_CHECK_FAIL(cudaStreamSynchronize(l->stream)); /* the first pass starts at once when pumped */
    *out = l;
    return 0;
fail:
    s_load_free(l);
    return STRATA_ECUDA;
}

extern "C" int cuda_ipc_load_pump(cuda_ipc_load_t *l)
{
    while (l->finished < l->issued) {
        const cudaError_t e = cudaEventQuery(l->end[l->finished % l->depth]);
        if (e == cudaErrorNotReady) break;
        CUDA_CHECK(e);
        l->finished++;
    }
    while (l->issued - l->finished < l->depth) {
        if (l->issued == 0) CUDA_CHECK(cudaEventRecord(l->first, l->stream));
        k_hbm_pass<<<l->blocks, 512, 0, l->stream>>>(l->buf, l->n, l->read, (unsigned *)(l->read + 1));
        CUDA_LAUNCH_CHECK();
        CUDA_CHECK(cudaEventRecord(l->end[l->issued % l->depth], l->stream));
        l->issued++;
    }
    return 0;
}

extern "C" void cuda_ipc_load_count(const cuda_ipc_load_t *l, long long *issued, long long *finished)
{
    *issued = l->issued;
    *finished = l->finished;
}

extern "C" int cuda_ipc_load_stop(cuda_ipc_load_t *l, int timeout_ms, double *bytes, double *seconds,
                                  long long *passes)
{
    const uint64_t deadline = strata_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    float ms = 0;
    cudaError_t e;
    *bytes = *seconds = 0;
    *passes = l->issued;
    /* the stream's own copy and wait: no implicit synchronization with other streams, which a
     * stuck one elsewhere could hold up */
    CUDA_CHECK_FAIL(cudaMemcpyAsync(l->out, l->read, sizeof *l->out, cudaMemcpyDeviceToHost, l->stream));
    CUDA_CHECK_FAIL(cudaEventRecord(l->back, l->stream));
    while ((e = cudaEventQuery(l->back)) == cudaErrorNotReady) {
        if (strata_now_ns() > deadline) {
            log_error("the HBM load did not finish within %d ms of its stop (%lld of %lld passes seen finished)",
                      timeout_ms, l->finished, l->issued);
            return STRATA_ETIMEOUT; /* l stays allocated: freeing it would wait */
        }
        usleep(200);
    }
    CUDA_CHECK_FAIL(e);
    if (l->issued > 0) CUDA_CHECK_FAIL(cudaEventElapsedTime(&ms, l->first, l->end[(l->issued - 1) % l->depth]));
    *bytes = (double)*l->out;
    *seconds = ms * 1e-3;
    s_load_free(l);
    return 0;
fail:
    s_load_free(l);
    return STRATA_ECUDA;
}
