/* shared_probe_cuda.cu - the host->GPU copy loop of the shared host memory probe (see
 * shared_probe.h). */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime.h>

#include "bench/shared_probe.h"
#include "common/strata.h"

/* Copies kept in flight: 4 x 64 MiB is about 5 ms of queued work at 55 GB/s, so the loop's
 * thread, competing for a core with a reader on every CPU, can be kept off one for a few
 * scheduler slices without the link idling. */
#define S_DEPTH 4

struct shared_probe_h2d {
    int device;
    size_t bytes;
    void *h, *d;               /* pinned host [bytes], device [bytes] */
    cudaStream_t s;
    cudaEvent_t done[S_DEPTH]; /* the ends of the copies in flight (blocking-sync events) */
};

static double s_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

extern "C" void shared_probe_h2d_close(shared_probe_h2d_t *l)
{
    if (!l) return;
    cudaSetDevice(l->device);
    if (l->s) cudaStreamSynchronize(l->s);
    for (int i = 0; i < S_DEPTH; i++)
        if (l->done[i]) cudaEventDestroy(l->done[i]);
    if (l->s) cudaStreamDestroy(l->s);
    if (l->d) cudaFree(l->d);
    if (l->h) cudaFreeHost(l->h);
    free(l);
}

extern "C" int shared_probe_h2d_open(int device, size_t bytes, shared_probe_h2d_t **out)
{
    *out = NULL;
    shared_probe_h2d_t *l = (shared_probe_h2d_t *)calloc(1, sizeof *l);
    if (!l) return STRATA_ENOMEM;
    l->device = device;
    l->bytes = bytes;
    /* blocking-sync events: a spinning wait would take a core from the CPU readers beside it */
    bool ok = cudaSetDevice(device) == cudaSuccess && cudaMallocHost(&l->h, bytes) == cudaSuccess &&
              cudaMalloc(&l->d, bytes) == cudaSuccess &&
              cudaStreamCreateWithFlags(&l->s, cudaStreamNonBlocking) == cudaSuccess;
    for (int i = 0; i < S_DEPTH && ok; i++)
        ok = cudaEventCreateWithFlags(&l->done[i], cudaEventBlockingSync | cudaEventDisableTiming) == cudaSuccess;
    if (!ok) {
        log_error("shared_probe_h2d_open: %s", cudaGetErrorString(cudaGetLastError()));
        shared_probe_h2d_close(l);
        return STRATA_ECUDA;
    }
    memset(l->h, 1, bytes); /* touch every page once */
    *out = l;
    return 0;
}

extern "C" int shared_probe_h2d_run(shared_probe_h2d_t *l, const volatile int *stop, volatile int *started,
                                    double *bytes, double *seconds)
{
    *bytes = *seconds = 0;
    if (cudaSetDevice(l->device) != cudaSuccess) return STRATA_ECUDA;
    /* S_DEPTH copies queued in stream order; each time the oldest ends, the next is queued. The
     * window is the host's view: from just before the first enqueue to the return of the wait
     * on the last copy seen to end before *stop was set. Copies that end after it ran (partly)
     * without the CPU readers beside them and are not counted; they are drained at the end. */
    double t0 = s_now(), t_end = t0;
    long n = 0, queued = 0;
    int rc = 0;
    for (; queued < S_DEPTH; queued++)
        if (cudaMemcpyAsync(l->d, l->h, l->bytes, cudaMemcpyHostToDevice, l->s) != cudaSuccess ||
            cudaEventRecord(l->done[queued % S_DEPTH], l->s) != cudaSuccess) {
            rc = STRATA_ECUDA;
            goto done;
        }
    __atomic_store_n(started, 1, __ATOMIC_RELEASE);
    for (long i = 0;; i++) {
        if (cudaEventSynchronize(l->done[i % S_DEPTH]) != cudaSuccess) {
            rc = STRATA_ECUDA;
            break;
        }
        if (__atomic_load_n(stop, __ATOMIC_ACQUIRE)) break;
        t_end = s_now();
        n++;
        if (cudaMemcpyAsync(l->d, l->h, l->bytes, cudaMemcpyHostToDevice, l->s) != cudaSuccess ||
            cudaEventRecord(l->done[queued++ % S_DEPTH], l->s) != cudaSuccess) {
            rc = STRATA_ECUDA;
            break;
        }
    }
done:
    if (rc) log_error("shared_probe_h2d_run: %s", cudaGetErrorString(cudaGetLastError()));
    cudaStreamSynchronize(l->s);
    *bytes = (double)n * (double)l->bytes;
    *seconds = t_end - t0;
    return rc;
}
