/* synth.h - random models in memory with real shapes, for tests and benchmarks.
 *
 * No file is involved: the weights are drawn from a seeded generator and quantized with
 * qmat_quantize, and every buffer is handed to the model (model_own_buffer) so model_free
 * releases it like a loaded model.
 */
#ifndef STRATA_SYNTH_H
#define STRATA_SYNTH_H

#include <stdint.h>

#include "model/model.h"

/* A config for arch with these shapes and that architecture's features: Qwen2-MoE gets qkv
 * bias and a shared expert (shared_inter = 2 * moe_inter), Qwen3-MoE per-head q/k norm and
 * norm_topk, OLMoE full q/k norm, Mixtral renormalised top-k, gpt-oss q/k/v/o biases,
 * attention sinks, router and expert biases, the clamped SwiGLU (limit 7, alpha 1.702) and a
 * 128-token window on even layers. All layers are MoE, rot_dim = head_dim, theta 10000; change
 * fields afterwards for other cases (dense layers, partial rotary: call synth_config_rope after
 * changing rope_theta or rot_dim). */
void synth_config(model_config_t *c, arch_t arch, int32_t vocab, int32_t hidden, int32_t n_layers, int32_t n_heads,
                  int32_t n_kv_heads, int32_t head_dim, int32_t n_experts, int32_t top_k, int32_t moe_inter);
/* Recompute inv_freq[rot_dim/2] from rope_theta (no scaling). */
void synth_config_rope(model_config_t *c);

/* Fill m with random weights for config c (copied into m->cfg). Attention, expert, shared,
 * dense and lm_head matrices are stored in fmt (group: INT4 columns per scale); the embedding
 * is F32 when fmt is F32, else BF16; router, shared gate, norms, biases and sinks are F32
 * (MXFP4 takes blocks of 32 columns: every matrix's cols must be a multiple of 32).
 * Values are scaled so activations stay O(1) through many layers. Returns 0 or <0. */
int synth_model(model_t *m, const model_config_t *c, wfmt_t fmt, int group, uint64_t seed);

#endif
