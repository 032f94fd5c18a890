/* cuda_sample.h - temperature / top-k / top-p sampling on the GPU, behind a C interface (no CUDA
 * headers leak out). The same decisions as cpu_sample (kernels/cpu/ops_ref.c, contract in
 * kernels/cpu/ops.h), token for token, except where a cumulative probability mass lies within
 * rounding distance of a boundary: the GPU's expf differs from libm's by an ulp or two, and the
 * masses are summed in 2^-40 fixed point instead of double (sample.cu says how).
 */
#ifndef STRATA_CUDA_SAMPLE_H
#define STRATA_CUDA_SAMPLE_H

#include <stdint.h>

#include "kernels/cuda/cuda_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One row's sampling parameters, as cpu_sample takes them (24 bytes, the same layout in C and
 * CUDA): temperature <= 0 or top_k == 1 is greedy; top_k <= 0 or >= vocab disables top-k;
 * top_p >= 1 disables top-p; u is the row's uniform draw in [0, 1). */
typedef struct {
    float temperature;
    int32_t top_k;
    float top_p;
    float pad; /* unused; keeps u 8-byte aligned */
    double u;
} cuda_sample_param_t;

/* Largest vocabulary cuda_sample takes (token ids fit two 11-bit radix digits). */
#define CUDA_SAMPLE_MAX_VOCAB (1 << 21)

/* ids[r] = the token cpu_sample(logits[r], vocab, params[r]...) draws, for r < n. Device
 * pointers: logits[n][vocab] fp32, params[n], ids[n]. As cpu_sample does, a non-greedy row of
 * logits is left divided by its temperature (greedy rows are untouched). Logits finite or
 * -inf. One block a row, enqueued on the context's stream; shared memory only, no scratch, no
 * host sync and no host read of params, so it can be captured in a CUDA graph.
 * 0, STRATA_EINVAL_INPUT (vocab outside 1..CUDA_SAMPLE_MAX_VOCAB), or STRATA_ECUDA. */
int cuda_sample(cuda_ctx_t *c, float *logits, int n, int vocab, const cuda_sample_param_t *params, int32_t *ids);

#ifdef __cplusplus
}
#endif
#endif
