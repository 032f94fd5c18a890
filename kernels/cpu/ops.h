/* ops.h - the CPU op interface (fp32 activations, fp32 accumulation).
 *
 * Every op has a plain reference implementation; matmul-like ops also have AVX2 and
 * AVX-512 paths chosen at run time by cpu_ops_init() (STRATA_CPU_ISA=ref|avx2|avx512|avx512vnni
 * forces one). Ops that take a pool run on its threads; pool may be NULL for single-threaded.
 */
#ifndef STRATA_CPU_OPS_H
#define STRATA_CPU_OPS_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/cpu/qmat.h"
#include "kernels/cpu/threadpool.h"

/* Ordered: each ISA's CPUs have every one below it. CPU_ISA_AVX512_VNNI is CPU_ISA_AVX512 with
 * the INT4 x q8 dots (CPU_ACT_Q8) in vpdpbusd, bit for bit the same results. */
typedef enum { CPU_ISA_REF = 0, CPU_ISA_AVX2 = 1, CPU_ISA_AVX512 = 2, CPU_ISA_AVX512_VNNI = 3 } cpu_isa_t;
#define CPU_ISA_COUNT 4

/* Pick the best ISA this CPU supports (or STRATA_CPU_ISA). Idempotent. */
cpu_isa_t cpu_ops_init(void);
/* Force an ISA (tests). Returns the ISA in effect (falls back if unsupported). */
cpu_isa_t cpu_ops_set_isa(cpu_isa_t isa);
/* "ref", "avx2", "avx512", "avx512vnni" (the STRATA_CPU_ISA names). */
const char *cpu_isa_name(cpu_isa_t isa);

/* How INT4 and MXFP4 matmuls treat their activations (process-wide, like the ISA):
 *   CPU_ACT_F32 (default): fp32 times the exactly dequantized weights, the reference
 *     semantics every other format has (packed == unpacked to fp32 rounding);
 *   CPU_ACT_Q8: each token's x is quantized to int8 in blocks of 32 columns, exactly as the
 *     GPU's integer path does (scale amax/127, round to nearest even, the block sum for the
 *     int4 offset), and dotted in integers (MXFP4: twice its e2m1 values, integers in
 *     [-12, 12]). About 3x less ALU work per weight, so batch-1 decode can reach the memory
 *     bound on cores too slow to convert nibbles to fp32 at that rate; costs the int8
 *     rounding of x (~1e-2 relative per matmul). The result is the exactly dequantized
 *     weights dotted with x' = xq * xd, to fp32 summation error. Other formats ignore it.
 * STRATA_CPU_ACT=f32|q8 sets the starting value. */
typedef enum { CPU_ACT_F32 = 0, CPU_ACT_Q8 = 1 } cpu_act_t;
cpu_act_t cpu_ops_act(void);
void cpu_ops_set_act(cpu_act_t act);
/* "f32" / "q8"; -1 if neither. */
int cpu_act_parse(const char *s);

/* y[n][w->rows] = x[n][w->cols] @ W^T (+ bias[w->rows] if bias != NULL). */
void cpu_matmul(tpool_t *pool, float *y, const float *x, int n, const qmat_t *w, const float *bias);

/* One matmul of cpu_matmul_multi: y[n][w->rows] = x @ W^T (+ bias[w->rows] if not NULL). */
typedef struct {
    float *y;
    const qmat_t *w;
    const float *bias;
} cpu_mm_item_t;
/* Several matmuls of the same x[n][cols] (e.g. the q, k and v projections) in one pool
 * dispatch; n_items <= 8, every w->cols equal. Each y is what cpu_matmul gives. */
void cpu_matmul_multi(tpool_t *pool, const float *x, int n, const cpu_mm_item_t *items, int n_items);

/* y[n][dim] = x / rms(x) * w, rms over dim with eps. y may alias x. */
void cpu_rmsnorm(float *y, const float *x, const float *w, int n, int dim, float eps);

/* Rotary embedding, NeoX / HF rotate_half form, in place on x[n][n_heads][head_dim],
 * over the first rot_dim dims of each head; inv_freq[rot_dim/2]; pos[n]. */
void cpu_rope(float *x, int n, int n_heads, int head_dim, int rot_dim, const int32_t *pos,
              const float *inv_freq, float attn_factor);

/* Causal attention of one query token over paged KV.
 * q[n_heads][head_dim]; k_cache, v_cache: one layer, [n_blocks][n_kv_heads][block_size][head_dim];
 * the token attends to positions ctx_start..n_ctx-1 of its sequence (ctx_start > 0: a sliding
 * window), whose blocks are block_table[] (block b holds positions b*block_size..; blocks wholly
 * before ctx_start are never read). GQA: head h reads kv head h / (n_heads / n_kv_heads).
 * sinks: NULL, or [n_heads] learned logits (gpt-oss) that join each head's softmax as one more
 * column with no value: p_j = exp(s_j - m) / (sum_i exp(s_i - m) + exp(sink - m)), m the max
 * over the scores and the sink. out[n_heads][head_dim]. scratch >= n_ctx floats. */
void cpu_attention(float *out, const float *q, const float *k_cache, const float *v_cache,
                   const int32_t *block_table, int ctx_start, int n_ctx, int n_heads, int n_kv_heads,
                   int head_dim, int block_size, float scale, const float *sinks, float *scratch);

/* Gate: probs = softmax(logits[n_experts]); pick top_k (ties to lower index);
 * if renorm, weights sum to 1. Writes idx[top_k], weight[top_k]. */
void cpu_gate_topk(const float *logits, int n_experts, int top_k, bool renorm, int32_t *idx, float *weight);

/* What an FFN adds to plain SwiGLU. NULL (or all zero) is plain: h = silu(g) * u with
 * g = gate(x), u = up(x). With biases, g, u and the output get them added. clamped is
 * gpt-oss's activation: g = min(g, limit), u = clamp(u, -limit, limit),
 * h = (u + 1) * g * sigmoid(alpha * g). */
typedef struct {
    const float *gate_bias, *up_bias; /* [inter] or NULL */
    const float *down_bias;           /* [hidden] or NULL */
    bool clamped;
    float limit, alpha;
} cpu_ffn_opts_t;

/* SwiGLU FFN for n tokens through one expert: out[n][hidden] = down(act(gate(x), up(x))),
 * act per opts (NULL: silu(g) * u). scratch >= 2*n*inter floats. If accumulate,
 * out += scale[t] * result (scale may be NULL = 1). */
void cpu_ffn_swiglu(tpool_t *pool, float *out, const float *x, int n, const qmat_t *gate, const qmat_t *up,
                    const qmat_t *down, const cpu_ffn_opts_t *opts, float *scratch, const float *scale,
                    bool accumulate);

/* One FFN of cpu_ffn_swiglu_many. */
typedef struct {
    const float *x;  /* [n][gate->cols] */
    float *out;      /* [n][down->rows], overwritten */
    int n;
    const qmat_t *gate, *up, *down;
    const cpu_ffn_opts_t *opts; /* NULL: plain SwiGLU */
} cpu_ffn_item_t;
#define CPU_FFN_MANY_MAX 64
/* out_i = down_i(act(gate_i(x_i), up_i(x_i))), act and biases per opts_i, for every item
 * (n_items <= CPU_FFN_MANY_MAX),
 * e.g. the active experts of a MoE layer, in two pool dispatches in all (every gate and up,
 * then every down) instead of two per item: at decode each matrix is a few microseconds of
 * work, so dispatch and barrier cost would otherwise rival it on many threads. Each out_i is
 * what cpu_ffn_swiglu gives for that item alone. scratch >= sum_i 2 * n_i * gate_i->rows. */
void cpu_ffn_swiglu_many(tpool_t *pool, const cpu_ffn_item_t *items, int n_items, float *scratch);

/* Sampling. logits[vocab] (may be modified). temperature <= 0 means greedy (argmax, ties to
 * the lower id); top_k <= 0 disables; top_p >= 1 disables. u is a uniform [0,1) draw.
 * The kept set: the top_k most likely tokens (ties to the lower id), then the shortest prefix
 * of them in that order whose probability reaches top_p of their mass. The draw walks the
 * kept tokens in id order: token i is picked when u * mass(kept) falls in its slice. O(vocab)
 * without top_k or top_p (no sort); top-p sorts only the tokens near the nucleus boundary. */
int32_t cpu_sample(float *logits, int vocab, float temperature, int top_k, float top_p, double u);

#endif
