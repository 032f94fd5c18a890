/* shapes.c - real model shapes (see shapes.h).
 *
 * The numbers are those of the models' config.json on the Hugging Face Hub (the repository is
 * in `source`). Fields a config leaves out take the transformers class defaults, which
 * model/config.c applies the same way.
 */
#include "bench/shapes.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const shape_t s_shapes[] = {
    /* name, source, arch, vocab, hidden, layers, heads, kv, head_dim, inter, moe_inter, shared, experts, top_k,
     * norm_topk, max_pos, theta, eps, bos, eos, tiny (, gpt-oss: sliding_window, pad_id) */
    {"mixtral-8x7b", "mistralai/Mixtral-8x7B-v0.1", ARCH_MIXTRAL, 32000, 4096, 32, 32, 8, 128, 14336, 0, 0, 8, 2,
     true, 32768, 1e6, 1e-5, 1, 2, false},
    {"mixtral-8x22b", "mistralai/Mixtral-8x22B-v0.1", ARCH_MIXTRAL, 32000, 6144, 56, 48, 8, 128, 16384, 0, 0, 8, 2,
     true, 65536, 1e6, 1e-5, 1, 2, false},
    {"qwen3-30b-a3b", "Qwen/Qwen3-30B-A3B", ARCH_QWEN3_MOE, 151936, 2048, 48, 32, 4, 128, 6144, 768, 0, 128, 8,
     true, 40960, 1e6, 1e-6, 151643, 151645, false},
    {"qwen3-235b-a22b", "Qwen/Qwen3-235B-A22B", ARCH_QWEN3_MOE, 151936, 4096, 94, 64, 4, 128, 12288, 1536, 0, 128,
     8, true, 40960, 1e6, 1e-6, 151643, 151645, false},
    {"qwen2-57b-a14b", "Qwen/Qwen2-57B-A14B", ARCH_QWEN2_MOE, 151936, 3584, 28, 28, 4, 128, 18944, 2560, 20480, 64,
     8, false, 131072, 1e6, 1e-6, 151643, 151643, false},
    {"olmoe-1b-7b", "allenai/OLMoE-1B-7B-0924", ARCH_OLMOE, 50304, 2048, 16, 16, 16, 128, 1024, 0, 0, 64, 8, false,
     4096, 1e4, 1e-5, -1, 50279, false},
    /* gpt-oss: experts [inter][hidden] = [2880][2880], attention 64 x 64 wide (4096, not the hidden
     * 2880); the checkpoints ship the experts in MXFP4, the rest in bf16 */
    {"gpt-oss-120b", "openai/gpt-oss-120b", ARCH_GPT_OSS, 201088, 2880, 36, 64, 8, 64, 2880, 0, 0, 128, 4, true,
     131072, 150000, 1e-5, -1, 200002, false, .sliding_window = 128, .pad_id = 199999},
    {"gpt-oss-20b", "openai/gpt-oss-20b", ARCH_GPT_OSS, 201088, 2880, 24, 64, 8, 64, 2880, 0, 0, 32, 4, true,
     131072, 150000, 1e-5, -1, 200002, false, .sliding_window = 128, .pad_id = 199999},
    /* tiny shapes for tests and the CPU smoke run: every architecture's features, small sizes */
    {"tiny-mixtral", "synthetic", ARCH_MIXTRAL, 512, 128, 2, 4, 2, 32, 256, 0, 0, 8, 2, true, 4096, 1e6, 1e-5, 1, 2,
     true},
    {"tiny-qwen3", "synthetic", ARCH_QWEN3_MOE, 512, 128, 2, 4, 2, 32, 384, 64, 0, 16, 4, true, 4096, 1e6, 1e-6, -1,
     -1, true},
    {"tiny-qwen2", "synthetic", ARCH_QWEN2_MOE, 512, 128, 2, 4, 2, 32, 384, 64, 256, 8, 2, false, 4096, 1e6, 1e-6, -1,
     -1, true},
    {"tiny-olmoe", "synthetic", ARCH_OLMOE, 512, 128, 2, 4, 4, 32, 128, 0, 0, 8, 2, false, 4096, 1e4, 1e-5, -1, -1,
     true},
    {"tiny-gpt-oss", "synthetic", ARCH_GPT_OSS, 512, 128, 2, 4, 2, 32, 128, 0, 0, 8, 4, true, 131072, 150000, 1e-5,
     -1, -1, true, .sliding_window = 16, .pad_id = -1},
    /* a small attention and vocabulary with many wide experts, which are most of its bytes: the
     * disk tier's tests (a host budget a fraction of the experts) */
    {"disk-mixtral", "synthetic", ARCH_MIXTRAL, 512, 256, 4, 4, 2, 64, 1024, 0, 0, 32, 2, true, 4096, 1e6, 1e-5, 1, 2,
     true},
    /* a few hundred MB: big enough to measure on a CPU, small enough for a laptop */
    {"mini-mixtral", "synthetic", ARCH_MIXTRAL, 32000, 1024, 8, 16, 4, 64, 2816, 0, 0, 8, 2, true, 32768, 1e6, 1e-5,
     1, 2, true},
};

int shape_count(void) { return (int)(sizeof s_shapes / sizeof s_shapes[0]); }

const shape_t *shape_at(int i) { return i >= 0 && i < shape_count() ? &s_shapes[i] : NULL; }

const shape_t *shape_find(const char *name)
{
    for (int i = 0; name && i < shape_count(); i++)
        if (!strcasecmp(s_shapes[i].name, name)) return &s_shapes[i];
    return NULL;
}

void shape_list(char *buf, size_t cap)
{
    size_t n = 0;
    if (cap) buf[0] = 0;
    for (int i = 0; i < shape_count() && n < cap; i++) {
        int w = snprintf(buf + n, cap - n, "%s%s", i ? ", " : "", s_shapes[i].name);
        if (w < 0) break;
        n += (size_t)w;
    }
}

static int s_set(json_t *o, const char *k, json_t *v)
{
    return v && json_object_set_new(o, k, v) == 0 ? 0 : -ENOMEM;
}

static json_t *s_token(int32_t id) { return id < 0 ? json_null() : json_integer(id); }

/* A JSON array of the strings v[0..n). */
static json_t *s_strings(const char *const *v, int n)
{
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++) {
        if (json_array_append_new(a, json_string(v[i])) < 0) {
            json_decref(a);
            return NULL;
        }
    }
    return a;
}

/* gpt-oss's config.json, key for key as openai/gpt-oss-120b and -20b ship it (their order,
 * alphabetical): no bos_token_id, no torch_dtype, the MXFP4 quantization_config naming what
 * stays bf16, and layer_types alternating from a sliding layer. */
static int s_gpt_oss_json(const shape_t *s, json_t *o)
{
    static const char *const keep_bf16[] = {"model.layers.*.self_attn", "model.layers.*.mlp.router",
                                            "model.embed_tokens", "lm_head"};
    static const char *const arch[] = {"GptOssForCausalLM"};
    int rc = 0;
    json_t *types = json_array();
    for (int l = 0; types && l < s->n_layers; l++) {
        if (json_array_append_new(types, json_string(l % 2 ? "full_attention" : "sliding_attention")) < 0) {
            json_decref(types);
            types = NULL;
        }
    }
    json_t *quant = json_object(), *rope = json_object();
    if (quant) {
        rc |= s_set(quant, "modules_to_not_convert", s_strings(keep_bf16, 4));
        rc |= s_set(quant, "quant_method", json_string("mxfp4"));
    }
    if (rope) {
        rc |= s_set(rope, "beta_fast", json_real(32.0));
        rc |= s_set(rope, "beta_slow", json_real(1.0));
        rc |= s_set(rope, "factor", json_real(32.0));
        rc |= s_set(rope, "original_max_position_embeddings", json_integer(4096));
        rc |= s_set(rope, "rope_type", json_string("yarn"));
        rc |= s_set(rope, "truncate", json_false());
    }
    rc |= s_set(o, "architectures", s_strings(arch, 1));
    rc |= s_set(o, "attention_bias", json_true());
    rc |= s_set(o, "attention_dropout", json_real(0.0));
    rc |= s_set(o, "eos_token_id", s_token(s->eos_id));
    rc |= s_set(o, "experts_per_token", json_integer(s->top_k));
    rc |= s_set(o, "head_dim", json_integer(s->head_dim));
    rc |= s_set(o, "hidden_act", json_string("silu"));
    rc |= s_set(o, "hidden_size", json_integer(s->hidden));
    rc |= s_set(o, "initial_context_length", json_integer(4096));
    rc |= s_set(o, "initializer_range", json_real(0.02));
    rc |= s_set(o, "intermediate_size", json_integer(s->inter));
    rc |= s_set(o, "layer_types", types);
    rc |= s_set(o, "max_position_embeddings", json_integer(s->max_pos));
    rc |= s_set(o, "model_type", json_string("gpt_oss"));
    rc |= s_set(o, "num_attention_heads", json_integer(s->n_heads));
    rc |= s_set(o, "num_experts_per_tok", json_integer(s->top_k));
    rc |= s_set(o, "num_hidden_layers", json_integer(s->n_layers));
    rc |= s_set(o, "num_key_value_heads", json_integer(s->n_kv_heads));
    rc |= s_set(o, "num_local_experts", json_integer(s->n_experts));
    rc |= s_set(o, "output_router_logits", json_false());
    rc |= s_set(o, "pad_token_id", s_token(s->pad_id));
    rc |= s_set(o, "quantization_config", quant);
    rc |= s_set(o, "rms_norm_eps", json_real(s->rms_eps));
    rc |= s_set(o, "rope_scaling", rope);
    rc |= s_set(o, "rope_theta", json_integer((json_int_t)s->rope_theta));
    rc |= s_set(o, "router_aux_loss_coef", json_real(0.9));
    rc |= s_set(o, "sliding_window", s->sliding_window > 0 ? json_integer(s->sliding_window) : json_null());
    rc |= s_set(o, "swiglu_limit", json_real(7.0));
    rc |= s_set(o, "tie_word_embeddings", json_false());
    rc |= s_set(o, "use_cache", json_true());
    rc |= s_set(o, "vocab_size", json_integer(s->vocab));
    return rc ? -ENOMEM : 0;
}

/* The config.json of Mixtral, Qwen2-MoE, Qwen3-MoE and OLMoE shapes. */
static int s_moe_json(const shape_t *s, json_t *o)
{
    static const char *const arch_names[] = {"MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM",
                                             "OlmoeForCausalLM", "GptOssForCausalLM"};
    static const char *const types[] = {"mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "gpt_oss"};
    int rc = 0;
    json_t *archs = json_array();
    if (!archs || json_array_append_new(archs, json_string(arch_names[s->arch])) < 0) {
        json_decref(archs);
        return -ENOMEM;
    }
    rc |= s_set(o, "architectures", archs);
    rc |= s_set(o, "model_type", json_string(types[s->arch]));
    rc |= s_set(o, "vocab_size", json_integer(s->vocab));
    rc |= s_set(o, "hidden_size", json_integer(s->hidden));
    rc |= s_set(o, "intermediate_size", json_integer(s->inter));
    rc |= s_set(o, "num_hidden_layers", json_integer(s->n_layers));
    rc |= s_set(o, "num_attention_heads", json_integer(s->n_heads));
    rc |= s_set(o, "num_key_value_heads", json_integer(s->n_kv_heads));
    /* Mixtral and Qwen3 configs carry head_dim; Qwen2-MoE and OLMoE derive it (hidden / heads). */
    if (s->arch == ARCH_MIXTRAL || s->arch == ARCH_QWEN3_MOE) rc |= s_set(o, "head_dim", json_integer(s->head_dim));
    rc |= s_set(o, "hidden_act", json_string("silu"));
    rc |= s_set(o, "max_position_embeddings", json_integer(s->max_pos));
    rc |= s_set(o, "rms_norm_eps", json_real(s->rms_eps));
    rc |= s_set(o, "rope_theta", json_real(s->rope_theta));
    rc |= s_set(o, "tie_word_embeddings", json_false());
    rc |= s_set(o, "bos_token_id", s_token(s->bos_id));
    rc |= s_set(o, "eos_token_id", s_token(s->eos_id));
    rc |= s_set(o, "num_experts_per_tok", json_integer(s->top_k));
    rc |= s_set(o, "torch_dtype", json_string("bfloat16"));
    switch (s->arch) {
    case ARCH_MIXTRAL:
        rc |= s_set(o, "num_local_experts", json_integer(s->n_experts));
        rc |= s_set(o, "sliding_window", json_null());
        break;
    case ARCH_QWEN2_MOE:
        rc |= s_set(o, "num_experts", json_integer(s->n_experts));
        rc |= s_set(o, "moe_intermediate_size", json_integer(s->moe_inter));
        rc |= s_set(o, "shared_expert_intermediate_size", json_integer(s->shared_inter));
        rc |= s_set(o, "norm_topk_prob", json_boolean(s->norm_topk));
        rc |= s_set(o, "decoder_sparse_step", json_integer(1));
        rc |= s_set(o, "use_sliding_window", json_false());
        rc |= s_set(o, "sliding_window", json_integer(s->max_pos));
        rc |= s_set(o, "max_window_layers", json_integer(s->n_layers));
        break;
    case ARCH_QWEN3_MOE:
        rc |= s_set(o, "num_experts", json_integer(s->n_experts));
        rc |= s_set(o, "moe_intermediate_size", json_integer(s->moe_inter));
        rc |= s_set(o, "norm_topk_prob", json_boolean(s->norm_topk));
        rc |= s_set(o, "decoder_sparse_step", json_integer(1));
        rc |= s_set(o, "mlp_only_layers", json_array());
        rc |= s_set(o, "attention_bias", json_false());
        rc |= s_set(o, "use_sliding_window", json_false());
        rc |= s_set(o, "sliding_window", json_null());
        rc |= s_set(o, "max_window_layers", json_integer(s->n_layers));
        break;
    case ARCH_OLMOE:
        rc |= s_set(o, "num_experts", json_integer(s->n_experts));
        rc |= s_set(o, "norm_topk_prob", json_boolean(s->norm_topk));
        rc |= s_set(o, "attention_bias", json_false());
        rc |= s_set(o, "clip_qkv", json_null());
        rc |= s_set(o, "pad_token_id", json_integer(1));
        break;
    case ARCH_GPT_OSS: break; /* s_gpt_oss_json */
    }
    return rc ? -ENOMEM : 0;
}

int shape_config_json(const shape_t *s, char **out)
{
    *out = NULL;
    json_t *o = json_object();
    if (!o) return -ENOMEM;
    int rc = s->arch == ARCH_GPT_OSS ? s_gpt_oss_json(s, o) : s_moe_json(s, o);
    if (rc == 0) {
        *out = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
        if (!*out) rc = -ENOMEM;
    }
    json_decref(o);
    return rc;
}

int shape_config(const shape_t *s, model_config_t *c, strata_errbuf_t *eb)
{
    char *text = NULL;
    int rc = shape_config_json(s, &text);
    if (rc < 0) return strata_seterr(eb, rc, "shape %s: cannot build config.json", s->name);
    char name[96];
    snprintf(name, sizeof name, "shape %s config.json", s->name);
    rc = model_config_parse(c, text, strlen(text), name, eb);
    free(text);
    return rc;
}
