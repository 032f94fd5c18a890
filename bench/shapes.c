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
     * norm_topk, max_pos, theta, eps, bos, eos, tiny */
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
    /* tiny shapes for tests and the CPU smoke run: every architecture's features, small sizes */
    {"tiny-mixtral", "synthetic", ARCH_MIXTRAL, 512, 128, 2, 4, 2, 32, 256, 0, 0, 8, 2, true, 4096, 1e6, 1e-5, 1, 2,
     true},
    {"tiny-qwen3", "synthetic", ARCH_QWEN3_MOE, 512, 128, 2, 4, 2, 32, 384, 64, 0, 16, 4, true, 4096, 1e6, 1e-6, -1,
     -1, true},
    {"tiny-qwen2", "synthetic", ARCH_QWEN2_MOE, 512, 128, 2, 4, 2, 32, 384, 64, 256, 8, 2, false, 4096, 1e6, 1e-6, -1,
     -1, true},
    {"tiny-olmoe", "synthetic", ARCH_OLMOE, 512, 128, 2, 4, 4, 32, 128, 0, 0, 8, 2, false, 4096, 1e4, 1e-5, -1, -1,
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

int shape_config_json(const shape_t *s, char **out)
{
    static const char *const arch_names[] = {"MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM",
                                             "OlmoeForCausalLM"};
    static const char *const types[] = {"mixtral", "qwen2_moe", "qwen3_moe", "olmoe"};
    int rc = 0;
    *out = NULL;
    json_t *o = json_object();
    if (!o) return -ENOMEM;
    json_t *archs = json_array();
    if (!archs || json_array_append_new(archs, json_string(arch_names[s->arch])) < 0) {
        json_decref(archs);
        rc = -ENOMEM;
        goto fail;
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
    }
    if (rc) {
        rc = -ENOMEM;
        goto fail;
    }
    *out = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    if (!*out) rc = -ENOMEM;
fail:
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
