/* qmat.h - weight matrices in the formats Strata stores and computes with.
 *
 * Shared by the CPU kernels, the CUDA kernels, the packer and the loaders, so the byte
 * layout below is the contract. All matrices are HF Linear layout: [rows = out_features]
 * [cols = in_features]; y = x @ W^T.
 */
#ifndef STRATA_QMAT_H
#define STRATA_QMAT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    WF_F32 = 0,  /* data: float[rows][cols] */
    WF_BF16 = 1, /* data: uint16_t bf16 bits [rows][cols] */
    WF_INT8 = 2, /* data: int8_t[rows][cols]; scales: float[rows]; w = q * scale */
    WF_FP8 = 3,  /* data: uint8_t OCP fp8-e4m3fn bits [rows][cols]; scales: float[rows]; w = fp8(q) * scale */
    WF_INT4 = 4, /* data: uint8_t[rows][cols/2]; scales: uint16_t fp16 bits [rows][cols/group];
                  * symmetric: w = (nibble - 8) * scale. Within each row, every run of 32
                  * columns c0..c0+31 takes 16 bytes; byte j holds column c0+j in its low
                  * nibble and column c0+16+j in its high nibble (the llama.cpp Q4_0 order,
                  * so SIMD code needs no interleave). group is a multiple of 32. */
    WF_MXFP4 = 5, /* OCP Microscaling MXFP4, as gpt-oss checkpoints ship it (`*_blocks`, `*_scales`):
                   * data: uint8_t[rows][cols/2], two e2m1 values a byte; within each row,
                   * every run of 32 columns c0..c0+31 takes 16 bytes, byte j holding column
                   * c0+2j in its low nibble and c0+2j+1 in its high nibble. e2m1 nibble bits:
                   * sign (bit 3), exponent (bits 2..1), mantissa (bit 0): magnitudes
                   * 0, 0.5, 1, 1.5, 2, 3, 4, 6. scales: uint8_t e8m0 [rows][cols/32], one per
                   * 32 columns: w = e2m1 * 2^(scale - 127). 0xFF (NaN in the spec) is refused
                   * by the loaders. group is always 32; cols a multiple of 32. */
    WF_COUNT
} wfmt_t;

typedef struct {
    wfmt_t fmt;
    int32_t rows, cols;
    int32_t group;       /* INT4: columns per scale (32, 64 or 128); MXFP4: 32; 0 otherwise */
    const void *data;    /* layout per fmt, rows contiguous */
    const void *scales;  /* INT8/FP8: float[rows]; INT4: uint16_t fp16[rows][cols/group];
                          * MXFP4: uint8_t e8m0[rows][cols/32]; else NULL */
} qmat_t;

/* Bytes of `data` for a rows x cols matrix in fmt. */
size_t qmat_data_bytes(wfmt_t fmt, int64_t rows, int64_t cols);
/* Bytes of `scales` (0 for F32/BF16). */
size_t qmat_scale_bytes(wfmt_t fmt, int64_t rows, int64_t cols, int group);
/* Name ("f32", "bf16", "int8", "fp8", "int4", "mxfp4") and parse; parse returns -1 if unknown. */
const char *wfmt_name(wfmt_t fmt);
int wfmt_parse(const char *s);

/* Scalar conversions (exact, round-to-nearest-even where narrowing). */
float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
float fp8e4m3_to_f32(uint8_t v);
uint8_t f32_to_fp8e4m3(float f); /* saturates to +-448 */
float e2m1_to_f32(uint8_t nibble); /* the low 4 bits */
float e8m0_to_f32(uint8_t e);      /* 2^(e - 127); NaN for 0xFF */

/* Dequantize row r of w into out[cols] (fp32). The reference every kernel is tested against. */
void qmat_dequant_row(const qmat_t *w, int32_t r, float *out);

/* Quantize a row-major fp32 matrix src[rows][cols] into fmt. data/scales are caller-allocated
 * with qmat_data_bytes / qmat_scale_bytes. Each row is scaled on its own (per channel for
 * INT8/FP8, per group for INT4, per 32 columns for MXFP4 by the OCP MX spec: the shared
 * exponent floor(log2(amax)) - 2, each element rounded to the nearest e2m1, ties to even,
 * saturating at +-6). Returns 0, or -EINVAL if cols does not fit the format. */
int qmat_quantize(wfmt_t fmt, int group, const float *src, int32_t rows, int32_t cols,
                  void *data, void *scales);

#ifdef __cplusplus
}
#endif

#endif
