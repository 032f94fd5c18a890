/* probe.h - the GPU's ceilings, measured (bench/roofline.h uses them): host-to-device copy
 * bandwidth from pinned memory, and device memory read bandwidth. C interface, no CUDA headers. */
#ifndef STRATA_CUDA_PROBE_H
#define STRATA_CUDA_PROBE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Best of `reps` copies of `bytes` from pinned host memory to device memory on `device`, in
 * bytes per second, into *bw. 0 or STRATA_ECUDA (no GPU, or out of memory). */
int cuda_probe_h2d(int device, size_t bytes, int reps, double *bw);

/* Best of `reps` passes of a kernel reading a `bytes` device buffer once (16-byte loads, every
 * SM, results reduced so no load is dropped), in bytes per second, into *bw. 0 or STRATA_ECUDA. */
int cuda_probe_membw(int device, size_t bytes, int reps, double *bw);

/* Name and total memory of `device` (name into buf[cap]). 0 or STRATA_ECUDA. */
int cuda_probe_device(int device, char *buf, size_t cap, size_t *total_bytes);

#ifdef __cplusplus
}
#endif
#endif
