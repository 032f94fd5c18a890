/* cuda_ipc.h - CUDA inter-process sharing behind a C interface (no CUDA headers leak out):
 * device memory and events that one process hands to another, as a prefetcher process needs to
 * copy experts straight into the executor's slots (DESIGN.md "Processes"; bench/dma_designs.c
 * measures that design against the executor issuing the copy itself).
 *
 * A handle is an opaque, fixed-size byte array: it can be sent in a message as is and opened
 * by another process of the same host, on the same device, with the same driver. Events and
 * streams are the ones of cuda_ops.h: an event created or opened here is a cuda_event_t, so
 * cuda_event_record / cuda_stream_wait_event / cuda_event_done / cuda_event_destroy apply.
 * Every call returns 0 or STRATA_ECUDA after logging the failing CUDA call.
 */
#ifndef STRATA_CUDA_IPC_H
#define STRATA_CUDA_IPC_H

#include <stddef.h>

#include "kernels/cuda/cuda_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CUDA_IPC_HANDLE_BYTES 64 /* cudaIpcMemHandle_t and cudaIpcEventHandle_t are both 64 bytes */

typedef struct {
    unsigned char bytes[CUDA_IPC_HANDLE_BYTES];
} cuda_ipc_handle_t;

/* Export the whole cudaMalloc allocation that starts at dev (device memory of the current
 * device; give it a 2 MiB multiple of bytes, or the driver may share neighbouring memory). */
int cuda_ipc_mem_export(void *dev, cuda_ipc_handle_t *h);
/* Map another process's exported allocation on the current device: *dev is its start here. */
int cuda_ipc_mem_open(const cuda_ipc_handle_t *h, void **dev);
/* Unmap what cuda_ipc_mem_open mapped (the exporter's memory stays), after waiting for all
 * work of this process on the current device, so that no copy into it is still in flight. */
int cuda_ipc_mem_close(void *dev);

/* Create an interprocess event (no timing: the driver requires it) and export it into *h.
 * Destroy it with cuda_event_destroy, after every process that opened it has closed it. */
int cuda_ipc_event_create(cuda_event_t **ev, cuda_ipc_handle_t *h);
/* Open another process's exported event. Either process may then record it on its own stream
 * or make its own stream wait on it; a wait is taken to cover the latest record made before it
 * was enqueued, in whichever process (the driver's documented use; bench/dma_designs.c counts
 * every read that beat its copy, with cuda_ipc_touch). Close with cuda_event_destroy. */
int cuda_ipc_event_open(const cuda_ipc_handle_t *h, cuda_event_t **ev);

/* Enqueue on c's compute stream a one-thread kernel that reads the byte at p (device) and adds
 * 1 to *bad (device, unsigned) if it is not `expect`: a consumer whose read is real, to show
 * that an event wait before it held (a stale byte counts). */
int cuda_ipc_touch(cuda_ctx_t *c, const void *p, unsigned char expect, unsigned *bad);

/* Device-memory traffic to copy under, as a sequence of finite kernels (no kernel waits for a
 * flag, so none can hold the GPU against other streams, other contexts or time-slicing): each
 * pass reads a `bytes` buffer once with 16-byte streaming loads, 2 blocks of 512 threads an SM
 * (half an SM's threads, so kernels of other streams still run beside it), on its own stream of
 * `device` (the current one). A pass of 1 GiB takes a few hundred microseconds on an H200.
 * Nothing runs until the first cuda_ipc_load_pump; the host then calls it often and it keeps at
 * most `depth` passes (1-8) enqueued and unfinished. */
typedef struct cuda_ipc_load cuda_ipc_load_t;
int cuda_ipc_load_create(int device, size_t bytes, int depth, cuda_ipc_load_t **out);
/* Retire the passes that have finished and enqueue new ones up to `depth` outstanding. Never
 * waits. */
int cuda_ipc_load_pump(cuda_ipc_load_t *l);
/* Passes enqueued and passes seen finished so far (as of the last pump). */
void cuda_ipc_load_count(const cuda_ipc_load_t *l, long long *issued, long long *finished);
/* Stop enqueuing, wait up to timeout_ms for what is outstanding, then free everything and give
 * what the kernels counted: *bytes read, *seconds of GPU time from the first pass's start to
 * the last one's end (both 0 if none ran), *passes. STRATA_ETIMEOUT (logged) if the passes did
 * not finish in time: l is then left allocated (freeing it would wait for them). */
int cuda_ipc_load_stop(cuda_ipc_load_t *l, int timeout_ms, double *bytes, double *seconds, long long *passes);

#ifdef __cplusplus
}
#endif
#endif
