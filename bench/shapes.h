/* shapes.h - the shapes of real MoE models (and a few tiny ones), for synthetic models.
 *
 * Each shape holds exactly the numbers of the model's Hugging Face config.json that decide
 * tensor shapes and routing: vocab, hidden, layers, heads, kv heads, head_dim, intermediate
 * sizes, experts, top-k, shared expert, plus the RoPE/eps/token ids (and gpt-oss's sliding
 * window) that make the config a faithful copy. shape_config_json() writes that config.json, and shape_config() parses it back
 * with the project's own config parser (model_config_parse), so a synthetic model's
 * model_config_t is exactly what the loader will see.
 */
#ifndef STRATA_BENCH_SHAPES_H
#define STRATA_BENCH_SHAPES_H

#include <stdbool.h>
#include <stdint.h>

#include "common/strata.h"
#include "model/model.h"

typedef struct {
    const char *name;          /* "mixtral-8x7b" */
    const char *source;        /* HF repository the numbers come from, or "synthetic" */
    arch_t arch;
    int32_t vocab;
    int32_t hidden;
    int32_t n_layers;
    int32_t n_heads;
    int32_t n_kv_heads;
    int32_t head_dim;
    int32_t inter;             /* config intermediate_size: Mixtral/OLMoE experts, Qwen dense MLP */
    int32_t moe_inter;         /* Qwen moe_intermediate_size; 0 where experts use `inter` */
    int32_t shared_inter;      /* Qwen2-MoE shared_expert_intermediate_size; 0 = none */
    int32_t n_experts;
    int32_t top_k;
    bool norm_topk;            /* Qwen/OLMoE norm_topk_prob (Mixtral always renormalizes) */
    int32_t max_pos;           /* max_position_embeddings */
    double rope_theta;
    double rms_eps;
    int32_t bos_id, eos_id;    /* -1 = null (gpt-oss configs carry no bos_token_id at all) */
    bool tiny;                 /* made up for tests, not a real model */
    /* gpt-oss only (0 elsewhere): tokens a sliding_attention layer sees; layer_types alternate
     * sliding_attention / full_attention from layer 0, and rope_scaling is the checkpoints' YaRN
     * (factor 32 over 4096 original positions, beta_fast 32, beta_slow 1, truncate false) */
    int32_t sliding_window;
    int32_t pad_id;            /* gpt-oss pad_token_id; -1 = null */
} shape_t;

/* Number of shapes, and shape i (0 <= i < shape_count()). */
int shape_count(void);
const shape_t *shape_at(int i);
/* The shape called name (case-insensitive), or NULL. */
const shape_t *shape_find(const char *name);
/* "mixtral-8x7b, mixtral-8x22b, ..." into buf (for --help and error messages). */
void shape_list(char *buf, size_t cap);

/* The HF config.json text of s (malloc'd, NUL-terminated) into *out. 0 or -ENOMEM. */
int shape_config_json(const shape_t *s, char **out);
/* The model_config_t of s, parsed from shape_config_json() by model_config_parse. 0 or <0
 * with eb set (a shape the parser refuses is a bug in the table). */
int shape_config(const shape_t *s, model_config_t *c, strata_errbuf_t *eb);

#endif
