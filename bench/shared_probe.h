/* shared_probe.h - host memory read by a DMA and by the CPU at once (DESIGN.md "Physical
 * limits"): a pinned host->GPU copy loop on a CUDA stream while CPU threads stream-read a
 * separate host buffer, both timed over the same window. The sum is the combined rate the
 * roofline's host_shared bound caps the two paths with (machine_t.host_bw).
 *
 * The copy loop lives in shared_probe_cuda.cu behind the three shared_probe_h2d_* calls (no
 * CUDA header here); shared_probe.c drives it from a thread of its own next to the CPU reads.
 * Both are built only with CUDA. */
#ifndef STRATA_BENCH_SHARED_PROBE_H
#define STRATA_BENCH_SHARED_PROBE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct shared_probe_h2d shared_probe_h2d_t;

/* A copy loop on `device`: a pinned host buffer of `bytes` (every page touched) copied whole,
 * over and over, into a device buffer on a non-blocking stream. Every call on it, from this one
 * to the close, must come from one thread. 0 or STRATA_ECUDA. */
int shared_probe_h2d_open(int device, size_t bytes, shared_probe_h2d_t **out);

/* Copy until *stop is set, 4 copies in flight so the link does not idle while this thread waits
 * for a core: *bytes copied by the copies seen to end before *stop was set, over *seconds from
 * the first copy's start to the last of them (host clock; waits block, so the thread leaves its
 * core to the CPU readers). *started is set once the first copies are enqueued. 0 or
 * STRATA_ECUDA. */
int shared_probe_h2d_run(shared_probe_h2d_t *l, const volatile int *stop, volatile int *started, double *bytes,
                         double *seconds);

void shared_probe_h2d_close(shared_probe_h2d_t *l);

#ifdef __cplusplus
}

#else
#include "kernels/cpu/threadpool.h"

typedef struct {
    double h2d_bw;   /* bytes/s the copies moved while the CPU read */
    double cpu_bw;   /* bytes/s the CPU threads read while the copies ran */
    double host_bw;  /* their sum: host memory read by both at once */
    double window_s; /* the window the best sum came from */
} shared_probe_t;

/* Best (highest sum) of `windows` windows of about window_s seconds each: the copy loop on
 * `device` over a pinned buffer of h2d_bytes, and every thread of pool reading a separate
 * cpu_bytes buffer in whole passes, both timed over the same window. 0, or STRATA_ECUDA /
 * STRATA_ENOMEM with *out zeroed. */
int shared_probe_run(tpool_t *pool, int device, size_t h2d_bytes, size_t cpu_bytes, int windows, double window_s,
                     shared_probe_t *out);
#endif

#endif
