/* cuda_ops.h - the CUDA op set, behind a C interface (no CUDA headers leak out).
 *
 * All tensor pointers are device pointers; every op is enqueued on the context's stream and
 * returns at once (0, or STRATA_ECUDA after logging the failing call). Activations are fp32,
 * accumulation fp32; weights are qmat_t (kernels/cpu/qmat.h) whose data/scales point to device
 * memory, in exactly the byte layout the CPU kernels read, so one packed expert is copied
 * over PCIe as-is and computed without a conversion pass.
 */
#ifndef STRATA_CUDA_OPS_H
#define STRATA_CUDA_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/qmat.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cuda_ctx cuda_ctx_t;

/* Create a context on `device`: its own non-blocking compute and copy streams. */
int cuda_ctx_create(cuda_ctx_t **out, int device);
void cuda_ctx_destroy(cuda_ctx_t *c);
/* Number of visible CUDA devices (0 when there is no driver or GPU). */
int cuda_device_count(void);
/* Free and total device memory in bytes. */
int cuda_mem_info(size_t *free_b, size_t *total_b);

int cuda_malloc(void **p, size_t bytes);
void cuda_free(void *p);
int cuda_memset(cuda_ctx_t *c, void *p, int byte, size_t bytes);
/* Copies on the context's stream. h2d/d2h from pageable memory are synchronous for the host. */
int cuda_h2d(cuda_ctx_t *c, void *dst, const void *src, size_t bytes);
int cuda_d2h(cuda_ctx_t *c, void *dst, const void *src, size_t bytes);
/* Device-to-host copy enqueued on one of the context's streams (CUDA_STREAM_*, below), not
 * waited for (dst pinned; capturable in a graph); cuda_sync waits for one on the compute stream. */
int cuda_d2h_async(cuda_ctx_t *c, int stream, void *dst, const void *src, size_t bytes);
int cuda_sync(cuda_ctx_t *c);
/* 1 if everything enqueued on the context's stream has completed, 0 if not, <0 on error. */
int cuda_query(cuda_ctx_t *c);

/* Pinned host memory: allocate, or page-lock an existing range (e.g. an mmapped arena) so
 * copies from it run as DMA at full PCIe rate. */
int cuda_host_alloc(void **p, size_t bytes);
void cuda_host_free(void *p);
int cuda_host_register(void *p, size_t bytes);
void cuda_host_unregister(void *p);
/* Where kernels read page-locked host memory p (cuda_host_alloc'd or registered). */
int cuda_host_device_ptr(const void *p, void **dev);

/* The context has three streams: CUDA_STREAM_COMPUTE (every op), and CUDA_STREAM_COPY and
 * CUDA_STREAM_COPY2 (expert prefetch: copies alternate between the two, so that one starts
 * while the other moves). Events order them: record on one, make another wait. */
enum { CUDA_STREAM_COMPUTE = 0, CUDA_STREAM_COPY = 1, CUDA_STREAM_COPY2 = 2 };
typedef struct cuda_event cuda_event_t;
int cuda_event_create(cuda_event_t **ev);
void cuda_event_destroy(cuda_event_t *ev);
int cuda_event_record(cuda_ctx_t *c, cuda_event_t *ev, int stream);
int cuda_stream_wait_event(cuda_ctx_t *c, int stream, cuda_event_t *ev);
/* 1 if the work before the event's last record has completed, 0 if not, <0 on error. */
int cuda_event_done(cuda_event_t *ev);
/* Async host-to-device copy on the given stream (src should be pinned for true async DMA). */
int cuda_h2d_async(cuda_ctx_t *c, int stream, void *dst, const void *src, size_t bytes);
/* A small host-to-device copy on the compute stream by a kernel that reads pinned host memory
 * src (cuda_host_alloc: mapped) over PCIe, so it never queues behind the copy stream's DMAs on
 * the copy engine. bytes a multiple of 4, both 4-byte aligned. */
int cuda_h2d_small(cuda_ctx_t *c, void *dst, const void *src, size_t bytes);
/* Writes of n 64-bit words on the compute stream, dst[i] = val[i] (device addresses, 8-byte
 * aligned), by a kernel that gets them as its parameters: nothing read over PCIe, where
 * cuda_h2d_small's reads queue behind the copy engine's DMAs (a layer's expert table after its
 * routing). n <= CUDA_PATCH_MAX, else STRATA_EINVAL_INPUT. */
#define CUDA_PATCH_MAX 96
int cuda_patch_words(cuda_ctx_t *c, int n, uint64_t *const *dst, const uint64_t *val);
/* The same from a mailbox in pinned host memory (cuda_host_alloc), for a kernel enqueued before
 * the host knows the words: it waits (polling over PCIe, no stream wait) until box[0] is set to
 * n + 1, then writes the n words box[2 + 2i] (a device address) = box[3 + 2i], after the
 * kernels before it have finished. The host fills the pairs, then stores box[0] with release
 * order; it must store it, or the stream never goes on (after 10 s the kernel traps). */
int cuda_wait_patch(cuda_ctx_t *c, const uint64_t *box);
/* Rows computed elsewhere onto x, for a kernel enqueued before the host has them: it waits
 * (polling over PCIe) until box[0] is set (nonzero), then adds rows[t] (pinned host memory,
 * [n][dim]) onto x[t] for each t < n whose box[1 + t] is nonzero, after the kernels before it
 * have finished. The host writes the rows and box[1..n], then stores box[0] with release order;
 * it must store it, or the stream never goes on (after 10 s the kernel traps). arrived (pinned
 * host memory, or NULL) is set to 1 once the kernels before have finished: read before the
 * host opens the box, it says whether the stream was waiting for it. */
int cuda_wait_add_rows(cuda_ctx_t *c, const uint64_t *box, uint64_t *arrived, float *x, const float *rows, int n,
                       int dim);
/* The other way: a (n floats) and b (nb floats, device) into pinned host memory (cuda_host_alloc)
 * at ha and hb, by one kernel that stores them there over PCIe, then sets *flag (pinned host
 * memory) to 1 once both are visible to the host, after the kernels before it have finished.
 * Two D2H copies and a flag's patch took a copy's latency each, behind the kernels before. */
int cuda_put_host(cuda_ctx_t *c, float *ha, const float *a, size_t n, float *hb, const float *b, size_t nb, uint64_t *flag);

/* CUDA graphs of the compute stream: capture the ops enqueued between begin and end into *g
 * (replacing it), then replay with cuda_graph_launch. Kernel arguments are fixed at capture,
 * so captured steps read per-step values (positions, tokens) from device buffers. */
typedef struct cuda_graph cuda_graph_t;
int cuda_graph_begin(cuda_ctx_t *c);
int cuda_graph_end(cuda_ctx_t *c, cuda_graph_t **g);
int cuda_graph_launch(cuda_ctx_t *c, cuda_graph_t *g);
void cuda_graph_destroy(cuda_graph_t *g);

/* Reserve the context's activation workspace for up to max_rows x max_cols inputs (device
 * memory, about 3.3 bytes per element). With it:
 *   - up to 16 rows, INT4, INT8 and MXFP4 weights take the integer path: activations are
 *     quantized to int8 in blocks of 32 with an fp32 scale (as llama.cpp's Q8_1) and dotted with
 *     __dp4a, about 5x less ALU work than dequantizing to fp32 (cols % 32 == 0; MXFP4 as the
 *     int8s 2 * e2m1, exact, with the block scale 2^(s - 128));
 *   - from 17 rows, INT4, MXFP4, INT8, FP8 and BF16 weights take the tensor-core GEMM:
 *     activations in fp16, weights dequantized to fp16 in registers (MXFP4: exact for block
 *     scales 2^-23 .. 2^13), fp32 accumulation (cols % 64 == 0), or
 *     cuBLAS from CUDA_BLAS_MIN_ROWS rows with cuda_ctx_enable_blas;
 *   - cuda_argmax splits each of up to max_rows rows over many blocks (1 KiB a row);
 *   - cuda_router_topk runs as one launch.
 * Without it, every format takes the fp32 path. Not during capture. */
int cuda_ctx_reserve_q8(cuda_ctx_t *c, int max_rows, int max_cols);
/* Bytes cuda_ctx_reserve_q8 allocates. */
size_t cuda_q8_bytes(int rows, int cols);
/* cuBLAS for large matmuls (after cuda_ctx_reserve_q8): from CUDA_BLAS_MIN_ROWS rows, a matrix
 * of at most weight_elems elements in INT4, MXFP4, INT8, FP8 or BF16 (as the tensor-core GEMM takes
 * them) is dequantized to fp16 in a scratch of weight_elems halves and multiplied by cuBLAS
 * (fp16 in, fp32 accumulation and out): the dequantization pass costs what one read and one
 * write of the fp16 matrix cost, and cuBLAS's GEMM (wgmma on sm_90) runs several times faster
 * than the fused one at prefill sizes. INT8/FP8 row scales are folded into the fp16 weights.
 * Allocates the scratch and a cuBLAS workspace and loads cuBLAS: compare cuda_mem_info before
 * and after for what it took. Not during capture. */
#define CUDA_BLAS_MIN_ROWS 128
int cuda_ctx_enable_blas(cuda_ctx_t *c, size_t weight_elems);
/* cuBLAS GEMMs enqueued on the context so far. */
uint64_t cuda_blas_gemms(const cuda_ctx_t *c);
/* Lend the tensor-core GEMM bytes of device memory at scratch (NULL: take it back): a matmul
 * whose tiles would fill less than a wave of the GPU then splits k in parts, keeps their sums
 * there and adds them up after (deterministic, in part order). Any op of the context that runs
 * a matmul (cuda_matmul*, cuda_router_topk, cuda_ffn_swiglu) may overwrite it, in stream order;
 * the caller may keep data there only from one such op to the next. */
void cuda_ctx_lend_parts(cuda_ctx_t *c, void *scratch, size_t bytes);

/* y[n][w->rows] = x[n][w->cols] @ W^T (+ bias). Any n; fused dequantization for every format. */
int cuda_matmul(cuda_ctx_t *c, float *y, const float *x, int n, const qmat_t *w, const float *bias);
/* y[n][w->rows] += x @ W^T (+ bias, which may be NULL): a projection straight onto the residual. */
int cuda_matmul_acc(cuda_ctx_t *c, float *y, const float *x, int n, const qmat_t *w, const float *bias);
/* ys[i] = x @ ws[i]^T (+ biases[i], which may be NULL) for i < count <= 4, matrices of equal
 * cols (q, k and v): x is converted or quantized once, and on the integer path matrices of one
 * format run in one launch. */
int cuda_matmul_multi(cuda_ctx_t *c, int count, float *const *ys, const float *x, int n, const qmat_t *const *ws,
                      const float *const *biases);
/* The general form of the three above: ys[i] (=, or += with accum) x @ ws[i]^T (+ biases[i]).
 * x_q8: the op that wrote x also left its int8 quantization in the context's workspace (its
 * q8_done came back true, and nothing used the workspace since), so the integer path skips
 * quantizing x. */
int cuda_matmul_ex(cuda_ctx_t *c, int count, float *const *ys, const float *x, int n, const qmat_t *const *ws,
                   const float *const *biases, bool accum, bool x_q8);

/* Whether an op asked for q8_done writes the int8 quantization of its n x dim output into the
 * context's workspace: the integer path's input (n <= 16, dim % 32 == 0, room reserved). */
bool cuda_q8_out_ok(const cuda_ctx_t *c, int n, int dim);

/* Grouped expert FFN with fused dequantization and SwiGLU, tokens regrouped by expert:
 * for every token t and k < top_k with e = idx[t][k]:
 *   out[t] += weight[t][k] * down_e(silu(gate_e(x[t])) * up_e(x[t]))
 * (with biases and gpt-oss's clamped activation: cuda_moe_ffn_ex)
 * experts_dev[e] (a device array) holds qmats {gate, up, down} whose data/scales are device
 * pointers, 16-byte aligned; all experts share format `fmt` and one shape. An expert with
 * gate.data == NULL is skipped (not resident: the caller adds its contribution elsewhere).
 * idx/weight are device arrays [n][top_k]. out must be initialised by the caller.
 * scratch: device workspace of cuda_moe_scratch_bytes(n, top_k, hidden, inter, n_experts) bytes.
 * flags: CUDA_MOE_X_Q8: x's quantization is in the context's workspace (see cuda_matmul_ex);
 * the integer path then reads each pair's token row from there instead of quantizing the
 * pairs' rows. CUDA_MOE_ROUTED: cuda_router_topk routed idx into scratch already.
 * nn (may be NULL): the next layer's RMSNorm of out, in the combine's launch: y = rmsnorm(out) *
 * w, and with q8_done (may be NULL) its int8 rows as cuda_rmsnorm_q8 writes them.
 * A split expert (split > 0, a multiple of 128) keeps down's rows split .. rows - 1 elsewhere:
 * down_tail, whose data and scales pointers are offset back by split rows, so that row r of
 * down_tail is row r of down (the expert cache keeps every expert's other rows resident and
 * moves only these; model/gpu_slots.c). */
typedef struct {
    qmat_t gate, up, down;
    qmat_t down_tail;
    int32_t split; /* 0: every row in down */
} cuda_expert_t;
/* An RMSNorm fused into another op's launch: y = rmsnorm(in) * w, and with q8_done (may be
 * NULL) y's int8 rows in the context's workspace as cuda_rmsnorm_q8 writes them. */
typedef struct {
    const float *w; /* the norm's weights [hidden] */
    float *y;       /* its output [n][hidden] (after cuda_moe_ffn, may be the MoE's x) */
    float eps;
    bool *q8_done;
} cuda_next_norm_t;
size_t cuda_moe_scratch_bytes(int n, int top_k, int hidden, int inter, int n_experts);
int cuda_moe_ffn(cuda_ctx_t *c, float *out, const float *x, int n, int hidden, int inter, wfmt_t fmt,
                 const cuda_expert_t *experts_dev, int n_experts, const int32_t *idx, const float *weight,
                 int top_k, void *scratch, unsigned flags, const cuda_next_norm_t *nn);
#define CUDA_MOE_X_Q8 1u
#define CUDA_MOE_ROUTED 2u
/* What an expert FFN adds to plain SwiGLU (cuda_moe_ffn_ex), with cpu_ffn_opts_t's semantics
 * for each expert e: g = gate_e(x) + gate_bias[e], u = up_e(x) + up_bias[e], the activation
 * silu(g) * u or, clamped (gpt-oss), g = min(g, limit), u = clamp(u, -limit, limit),
 * h = (u + 1) * g * sigmoid(alpha * g); then down_e(h) + down_bias[e], weighted. The biases are
 * device arrays indexed by expert id, each NULL for none; down_bias 16-byte aligned. NULL (or
 * all zero): plain SwiGLU, cuda_moe_ffn's results bit for bit. */
typedef struct {
    const float *gate_bias, *up_bias; /* [n_experts][inter] */
    const float *down_bias;           /* [n_experts][hidden] */
    bool clamped;
    float limit, alpha;
    /* the experts read x in fp32 below the tensor-core sizes, not quantized to int8 (the integer
     * path's __dp4a): exact for MXFP4, whose e2m1 values are few and far apart; no parts */
    bool f32_act;
} cuda_moe_opts_t;
/* The general form of cuda_moe_ffn (part 0) and cuda_moe_ffn_part (part CUDA_MOE_HEAD or
 * CUDA_MOE_TAIL, with rows), with opts (may be NULL). A split step gives both parts the same
 * opts. */
int cuda_moe_ffn_ex(cuda_ctx_t *c, int part, int rows, float *out, const float *x, int n, int hidden, int inter,
                    wfmt_t fmt, const cuda_expert_t *experts_dev, int n_experts, const int32_t *idx,
                    const float *weight, int top_k, void *scratch, unsigned flags, const cuda_next_norm_t *nn,
                    const cuda_moe_opts_t *opts);
/* cuda_moe_ffn in two launches, with other kernels between them: part CUDA_MOE_HEAD routes
 * (unless CUDA_MOE_ROUTED), runs gate/up and down's rows below rows (a multiple of 4 in
 * (0, hidden)) and leaves them in scratch; then part CUDA_MOE_TAIL, with the same arguments,
 * runs down's rows from rows on and the combine (nn as in cuda_moe_ffn). Between them only the
 * experts' down_tail entries may change (the head reads no row of down_tail when rows is every
 * expert's split), nor x, idx, weight or scratch. So a split expert's head computes while its
 * tail is still on its way (model/gpu_step.c). Only for cuda_moe_parts_ok steps, else
 * STRATA_EINVAL_INPUT. */
#define CUDA_MOE_HEAD 1
#define CUDA_MOE_TAIL 2
bool cuda_moe_parts_ok(int n, wfmt_t fmt, int hidden, int inter);
int cuda_moe_ffn_part(cuda_ctx_t *c, int part, int rows, float *out, const float *x, int n, int hidden, int inter,
                      wfmt_t fmt, const cuda_expert_t *experts_dev, int n_experts, const int32_t *idx,
                      const float *weight, int top_k, void *scratch, unsigned flags, const cuda_next_norm_t *nn);

/* y[n][dim] = rmsnorm(x) * w; y may alias x. */
int cuda_rmsnorm(cuda_ctx_t *c, float *y, const float *x, const float *w, int n, int dim, float eps);
/* cuda_rmsnorm, and when cuda_q8_out_ok (and dim <= 16384) y's int8 quantization into the
 * context's workspace in the same pass; *q8_done says whether it did (q8_done NULL: none, as
 * cuda_rmsnorm). */
int cuda_rmsnorm_q8(cuda_ctx_t *c, float *y, const float *x, const float *w, int n, int dim, float eps,
                    bool *q8_done);
/* Gate: softmax over n_experts then top-k (ties to the lower index), optional renorm.
 * logits[n][n_experts] -> idx[n][top_k], weight[n][top_k]. */
int cuda_gate_topk(cuda_ctx_t *c, const float *logits, int n, int n_experts, int top_k, bool renorm,
                   int32_t *idx, float *weight);
/* The router matmul and the gate in one launch where it can (up to 16 tokens, an F32 or BF16
 * router of fewer than 1024 rows, cols % 4 == 0, the workspace reserved), else in steps:
 * logits[n][w->rows] = x @ w^T (+ bias, device [w->rows], may be NULL), then cuda_gate_topk over
 * each group of n_experts logits (w->rows / n_experts groups a token: several layers' routers
 * stacked), into idx/weight [n * groups][top_k]. With renorm the weights are the softmax over
 * the top-k logits alone (Mixtral's and gpt-oss's gates).
 * pre (may be NULL): the router reads pre's RMSNorm of x, and pre->y gets it (with q8_done, its
 * int8 rows as cuda_rmsnorm_q8 writes them); at one token in the launch (every block norms it).
 * route (may be NULL): at one token in the launch, one router (rows == n_experts) also routes
 * the pairs into route->scratch for cuda_moe_ffn (CUDA_MOE_ROUTED); *route->routed: it did.
 * idx_host (may be NULL): pinned host memory (cuda_host_alloc) that also gets idx, in stream
 * order: written by the launch itself over PCIe where it is one launch (no copy node after it
 * for the host to wait on), else copied after it. Each index is one aligned 4-byte store, so a
 * host that filled idx_host with -1 before can wait for the routing alone, not for the stream,
 * until every entry is >= 0 (the launch starts once every kernel before it has finished). */
typedef struct {
    void *scratch; /* cuda_moe_ffn's, for n tokens, top_k, w->cols hidden and inter below */
    int inter;
    bool *routed;
} cuda_route_into_t;
int cuda_router_topk(cuda_ctx_t *c, float *logits, const float *x, int n, const qmat_t *w, const float *bias,
                     int n_experts, int top_k, bool renorm, int32_t *idx, float *weight, const cuda_next_norm_t *pre,
                     const cuda_route_into_t *route, int32_t *idx_host);
/* On q[n][n_heads][head_dim] (in place) and k[n][n_kv_heads][head_dim]: a per-head RMSNorm with
 * weights q_norm / k_norm [head_dim] (each may be NULL: none), then RoPE (HF rotate_half form, the
 * first rot_dim dims; none when rot_dim == 0) at positions pos[n] with inv_freq[rot_dim/2]
 * (device); the rotated k (k itself is left as it was) and v[n][n_kv_heads][head_dim] go into
 * the paged caches ([block][kv_head][block_size][head_dim]) at (seq[t], pos[t]) through block
 * tables bt[seq][max_blocks]. One launch for what a layer does between the projections and
 * attention. */
int cuda_rope_kv(cuda_ctx_t *c, float *q, const float *k, const float *v, int n, int n_heads, int n_kv_heads, int head_dim,
                 int rot_dim, const int32_t *pos, const float *inv_freq, float attn_factor, const float *q_norm,
                 const float *k_norm, float eps, float *k_cache, float *v_cache, const int32_t *seq,
                 const int32_t *bt, int max_blocks, int block_size);
/* Causal paged attention: token t attends positions 0..pos[t] of sequence seq[t].
 * q[n][n_heads][head_dim] -> out[n][n_heads][head_dim]. With q8_done (may be NULL), out's int8
 * quantization goes into the context's workspace too when cuda_q8_out_ok and head_dim % 32 == 0;
 * *q8_done says whether it did. */
int cuda_attention(cuda_ctx_t *c, float *out, const float *q, const float *k_cache, const float *v_cache,
                   int n, const int32_t *seq, const int32_t *pos, const int32_t *bt, int max_blocks,
                   int n_heads, int n_kv_heads, int head_dim, int block_size, float scale, bool *q8_done);
/* What attention adds to plain causal attention (cuda_attention_ex, cuda_attention_prefill_ex),
 * with cpu_attention's semantics. window > 0: a sliding window, token t attends positions
 * max(0, pos[t] + 1 - window) .. pos[t] only (cpu_attention's ctx_start; the window is a
 * constant, so a captured graph stays right as the positions move); no K/V row before a token's
 * window start is read, nor a block-table entry of a block wholly before it. sinks: NULL, or
 * device [n_heads] learned logits (gpt-oss) that join each head's softmax as one more column
 * with no value. NULL (or all zero): plain attention, bit for bit. */
typedef struct {
    int window;
    const float *sinks;
} cuda_attn_opts_t;
/* cuda_attention with opts (may be NULL). */
int cuda_attention_ex(cuda_ctx_t *c, float *out, const float *q, const float *k_cache, const float *v_cache, int n,
                      const int32_t *seq, const int32_t *pos, const int32_t *bt, int max_blocks, int n_heads,
                      int n_kv_heads, int head_dim, int block_size, float scale, bool *q8_done,
                      const cuda_attn_opts_t *opts);
/* cuda_attention on tensor cores (fp16 inputs, fp32 accumulation; attn.cu) for many rows: a
 * block takes 64 rows of one head and makes one pass over the keys per sequence among them, so
 * it suits long runs of one sequence's rows (prefill). head_dim 64 or 128 and 16-byte aligned
 * buffers, else STRATA_EINVAL_INPUT (nothing launched; take cuda_attention). */
int cuda_attention_prefill(cuda_ctx_t *c, float *out, const float *q, const float *k_cache, const float *v_cache,
                           int n, const int32_t *seq, const int32_t *pos, const int32_t *bt, int max_blocks,
                           int n_heads, int n_kv_heads, int head_dim, int block_size, float scale);
/* cuda_attention_prefill with opts (may be NULL). With a window, a block's pass over a sequence
 * reads only positions inside some row's window. */
int cuda_attention_prefill_ex(cuda_ctx_t *c, float *out, const float *q, const float *k_cache,
                              const float *v_cache, int n, const int32_t *seq, const int32_t *pos, const int32_t *bt,
                              int max_blocks, int n_heads, int n_kv_heads, int head_dim, int block_size, float scale,
                              const cuda_attn_opts_t *opts);
/* out[n][dim] = embed[tokens[t]] (embed is an F32 or BF16 qmat [vocab][dim], or MXFP4, whose
 * rows come out as qmat_dequant_row's, bit for bit; tokens on the device; a row whose id is
 * outside [0, vocab) is zeros). */
int cuda_embed(cuda_ctx_t *c, float *out, const qmat_t *embed, const int32_t *tokens, int n);
/* dst[i][:] = src[rows[i]][:] for i < n (rows on device), rows of dim floats. */
int cuda_gather_rows(cuda_ctx_t *c, float *dst, const float *src, const int32_t *rows, int n, int dim);
/* y += x (n elements). */
int cuda_add(cuda_ctx_t *c, float *y, const float *x, size_t n);
/* Qwen2-MoE shared expert: y[t][:] += sigmoid(g[t]) * s[t][:] for t < n, rows of dim. */
int cuda_add_sigmoid_scaled(cuda_ctx_t *c, float *y, const float *s, const float *g, int n, int dim);
/* Dense SwiGLU MLP: out[n][hidden] = down(silu(gate(x)) * up(x)); scratch >= 3*n*inter floats (device). */
int cuda_ffn_swiglu(cuda_ctx_t *c, float *out, const float *x, int n, const qmat_t *gate, const qmat_t *up,
                    const qmat_t *down, float *scratch);
/* Greedy argmax per row (ties to the lower id): logits[n][vocab] -> ids[n]. */
int cuda_argmax(cuda_ctx_t *c, const float *logits, int n, int vocab, int32_t *ids);

#ifdef __cplusplus
}
#endif
#endif
