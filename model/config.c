/* config.c - parse a Hugging Face config.json into model_config_t.
 *
 * Both layouts are read: transformers 4.x (top-level rope_theta, rope_scaling) and 5.x
 * (rope_parameters, optionally per layer type). Every key of the file is one of:
 *   - semantic: read, validated and honoured, or refused with an error naming it;
 *   - informational or training-only (an explicit allow-list below): ignored;
 *   - unknown: an error naming it (STRATA_ALLOW_UNKNOWN_CONFIG=1 turns it into a warning).
 * Missing keys take the defaults of the transformers config class of the architecture, so a
 * config means here what it means to transformers. Of generation_config.json only eos_token_id
 * is read: it replaces config.json's stop set, as in transformers' generate()
 * (model_config_apply_generation; model_config_load reads the file beside config.json).
 *
 * Absurd values (zero or negative sizes, a vocab of 2^40, top_k > n_experts, heads that do
 * not divide hidden, ...) are refused against the limits below, which are far above any
 * real model but keep every derived size well inside int32 and size_t.
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "model/model.h"

#define MAX_VOCAB (1 << 24)
#define MAX_HIDDEN (1 << 16)
#define MAX_INTER (1 << 18)
#define MAX_LAYERS 256        /* model_config_t.layer_sparse */
#define MAX_HEADS 1024
#define MAX_HEAD_DIM 1024     /* model_config_t.inv_freq holds rot_dim/2 <= 512 */
#define MAX_ATTN_WIDTH (1 << 17) /* n_heads * head_dim */
#define MAX_POS (1 << 28)
#define MAX_EXPERTS 4096
#define MAX_CONFIG_BYTES (16 << 20)

typedef struct {
    arch_t arch;
    const char *arch_name;
    const char *model_type;
    const char *const *keys;      /* arch-specific keys (NULL-terminated) */
    /* transformers class defaults for absent keys */
    int64_t vocab, hidden, inter, layers, heads;
    int64_t kv_heads;             /* -1: same as heads */
    int64_t max_pos, top_k, experts, moe_inter, shared_inter;
    int64_t bos, eos;             /* -1: none */
    double eps, theta;
    bool has_use_sliding;         /* sliding_window only acts with use_sliding_window */
    bool head_dim_free;           /* head_dim may differ from hidden / heads */
} arch_desc_t;

static const char *const s_keys_mixtral[] = {"num_local_experts", "num_experts", "router_jitter_noise", NULL};
static const char *const s_keys_qwen2[] = {"num_experts", "use_sliding_window", "max_window_layers",
                                           "decoder_sparse_step", "moe_intermediate_size",
                                           "shared_expert_intermediate_size", "norm_topk_prob",
                                           "mlp_only_layers", "qkv_bias", NULL};
static const char *const s_keys_qwen3[] = {"num_experts", "num_local_experts", "use_sliding_window",
                                           "max_window_layers", "decoder_sparse_step", "moe_intermediate_size",
                                           "norm_topk_prob", "mlp_only_layers", "attention_bias", NULL};
static const char *const s_keys_olmoe[] = {"num_experts", "num_local_experts", "norm_topk_prob", "attention_bias",
                                           "clip_qkv", NULL};
/* gpt-oss: swiglu_limit, experts_per_token and initial_context_length are in the shipped
 * configs; transformers 5.x reads none of them (GptOssExperts hard-codes limit 7.0 and alpha
 * 1.702), so they are checked against what it runs and otherwise informational. */
static const char *const s_keys_gpt_oss[] = {"num_local_experts", "num_experts", "attention_bias", "swiglu_limit",
                                             "experts_per_token", "initial_context_length", NULL};

static const arch_desc_t s_archs[] = {
    {ARCH_MIXTRAL, "MixtralForCausalLM", "mixtral", s_keys_mixtral, 32000, 4096, 14336, 32, 32, 8, 131072, 2, 8,
     0, 0, 1, 2, 1e-5, 1e6, false, true},
    {ARCH_QWEN2_MOE, "Qwen2MoeForCausalLM", "qwen2_moe", s_keys_qwen2, 151936, 2048, 5632, 24, 16, 16, 32768, 4,
     60, 1408, 5632, -1, -1, 1e-6, 1e4, true, false},
    {ARCH_QWEN3_MOE, "Qwen3MoeForCausalLM", "qwen3_moe", s_keys_qwen3, 151936, 2048, 6144, 24, 32, 4, 32768, 8,
     128, 768, 0, -1, -1, 1e-6, 1e4, true, true},
    {ARCH_OLMOE, "OlmoeForCausalLM", "olmoe", s_keys_olmoe, 50304, 2048, 2048, 16, 16, -1, 4096, 8, 64, 0, 0, -1,
     50279, 1e-5, 1e4, false, false},
    {ARCH_GPT_OSS, "GptOssForCausalLM", "gpt_oss", s_keys_gpt_oss, 201088, 2880, 2880, 36, 64, 8, 131072, 4, 128, 0,
     0, -1, -1, 1e-5, 150000, false, true},
};

/* Keys every architecture shares and that strata reads (handled in s_parse). */
static const char *const s_semantic[] = {
    "architectures", "model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_act", "max_position_embeddings",
    "rms_norm_eps", "tie_word_embeddings", "rope_theta", "rope_scaling", "rope_parameters",
    "partial_rotary_factor", "bos_token_id", "eos_token_id", "num_experts_per_tok", "sliding_window",
    "layer_types", "quantization_config", "is_encoder_decoder", "add_cross_attention", "pruned_heads",
    "auto_map", NULL};

/* Informational or training-only keys: they do not change inference, so they are ignored.
 * Generation defaults (temperature, top_p, ...) belong to the request, not the model. */
static const char *const s_harmless[] = {
    /* identification and bookkeeping */
    "_name_or_path", "transformers_version", "_commit_hash", "torch_dtype", "dtype", "use_bfloat16",
    "_attn_implementation", "_attn_implementation_autoset", "_experts_implementation", "tokenizer_class",
    "pad_token_id", "sep_token_id", "decoder_start_token_id", "prefix", "id2label", "label2id", "problem_type",
    "finetuning_task", "task_specific_params",
    /* training only */
    "initializer_range", "attention_dropout", "router_aux_loss_coef", "output_router_logits",
    "gradient_checkpointing", "use_cache", "tf_legacy_loss",
    /* output plumbing of the Python API */
    "return_dict", "output_hidden_states", "output_attentions", "torchscript", "chunk_size_feed_forward",
    "is_decoder", "cross_attention_hidden_size", "tie_encoder_decoder",
    /* generation defaults */
    "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
    "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty", "length_penalty",
    "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids", "num_return_sequences",
    "output_scores", "return_dict_in_generate", "forced_bos_token_id", "forced_eos_token_id",
    "remove_invalid_values", "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens",
    NULL};

typedef struct {
    const char *path;
    json_t *root;
    strata_errbuf_t *eb;
} ctx_t;

static bool s_in(const char *const *list, const char *key)
{
    for (; *list; list++)
        if (!strcmp(*list, key)) return true;
    return false;
}

/* The value of key, or NULL when absent or JSON null. */
static json_t *s_val(ctx_t *c, const char *key)
{
    json_t *v = json_object_get(c->root, key);
    return json_is_null(v) ? NULL : v;
}

/* Integer field: absent or null -> def (null is an error unless null_ok). */
static int s_int(ctx_t *c, const char *key, int64_t def, bool null_ok, int64_t lo, int64_t hi, int64_t *out)
{
    json_t *raw = json_object_get(c->root, key);
    if (!raw || (json_is_null(raw) && null_ok)) {
        *out = def;
        return 0;
    }
    if (!json_is_integer(raw))
        return strata_seterr(c->eb, STRATA_EINVAL_INPUT, "%s: %s: must be an integer", c->path, key);
    json_int_t v = json_integer_value(raw);
    if (v < lo || v > hi)
        return strata_seterr(c->eb, STRATA_EINVAL_INPUT, "%s: %s: %lld is out of range [%lld, %lld]", c->path, key,
                             (long long)v, (long long)lo, (long long)hi);
    *out = v;
    return 0;
}

/* Real-valued field in [lo, hi] (lo excluded when lo_open); absent -> def. */
static int s_num_in(ctx_t *c, json_t *obj, const char *ctxname, const char *key, double def, double lo, bool lo_open,
                    double hi, double *out)
{
    json_t *v = json_object_get(obj, key);
    if (!v) {
        *out = def;
        return 0;
    }
    if (!json_is_number(v))
        return strata_seterr(c->eb, STRATA_EINVAL_INPUT, "%s: %s%s: must be a number", c->path, ctxname, key);
    double x = json_number_value(v);
    if (!isfinite(x) || x < lo || (lo_open && x == lo) || x > hi)
        return strata_seterr(c->eb, STRATA_EINVAL_INPUT, "%s: %s%s: %g is out of range %c%g, %g]", c->path, ctxname,
                             key, x, lo_open ? '(' : '[', lo, hi);
    *out = x;
    return 0;
}

static int s_bool(ctx_t *c, const char *key, bool def, bool *out)
{
    json_t *v = json_object_get(c->root, key);
    if (!v) {
        *out = def;
        return 0;
    }
    if (!json_is_boolean(v))
        return strata_seterr(c->eb, STRATA_EINVAL_INPUT, "%s: %s: must be true or false", c->path, key);
    *out = json_is_true(v);
    return 0;
}

/* A token id (or null -> -1) in [0, vocab): bos_token_id. A list takes its first id in the
 * vocabulary (transformers reads a list for the eos ids; s_eos_ids reads those). */
static int s_token(ctx_t *c, const char *key, int64_t def, int64_t vocab, int32_t *out)
{
    json_t *v = json_object_get(c->root, key);
    if (!v) {
        /* the class default; an id the vocab cannot produce means no such token */
        *out = def >= 0 && def < vocab ? (int32_t)def : -1;
        return 0;
    }
    if (json_is_null(v)) {
        *out = -1;
        return 0;
    }
    if (json_is_array(v)) {
        size_t n = json_array_size(v);
        if (n == 0)
            return strata_seterr(c->eb, STRATA_EINVAL_INPUT, "%s: %s: empty list", c->path, key);
        json_t *first = NULL;
        for (size_t i = 0; i < n; i++) {
            json_t *e = json_array_get(v, i);
            if (!json_is_integer(e) || json_integer_value(e) < 0)
                return strata_seterr(c->eb, STRATA_EINVAL_INPUT, "%s: %s[%zu]: must be a token id", c->path, key, i);
            if (json_integer_value(e) >= vocab)
                log_warn("%s: %s[%zu]: %lld is outside the vocabulary (%lld); the model never emits it", c->path,
                         key, i, (long long)json_integer_value(e), (long long)vocab);
            else if (!first)
                first = e;
        }
        if (n > 1 && first)
            log_warn("%s: %s lists %zu ids; strata uses the first in the vocabulary (%lld)", c->path, key, n,
                     (long long)json_integer_value(first));
        *out = first ? (int32_t)json_integer_value(first) : -1;
        return 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return strata_seterr(c->eb, STRATA_EINVAL_INPUT, "%s: %s: must be a token id", c->path, key);
    if (json_integer_value(v) >= vocab) {
        /* transformers warns and runs: the id can never be produced (or fed) */
        log_warn("%s: %s: %lld is outside the vocabulary (%lld); ignored", c->path, key,
                 (long long)json_integer_value(v), (long long)vocab);
        *out = -1;
        return 0;
    }
    *out = (int32_t)json_integer_value(v);
    return 0;
}

/* The stop set of eos_token_id's value v (config.json or generation_config.json: an id or a
 * list; v not NULL and not null) into ids / *n, as transformers' generate() stops at any of them.
 * Listed ids outside the vocabulary are dropped with a warning (transformers runs with them: the
 * model can never emit them), repeats are dropped; more than MODEL_MAX_EOS listed, an empty list,
 * or an entry that is not a token id is refused, naming it. */
static int s_eos_ids(ctx_t *c, json_t *v, int64_t vocab, int32_t *ids, int32_t *n)
{
    const char *key = "eos_token_id";
    const bool list = json_is_array(v);
    const size_t len = list ? json_array_size(v) : 1;
    *n = 0;
    if (list && len == 0) return strata_seterr(c->eb, STRATA_EINVAL_INPUT, "%s: %s: empty list", c->path, key);
    if (len > MODEL_MAX_EOS)
        return strata_seterr(c->eb, STRATA_EUNSUPPORTED, "%s: %s: lists %zu ids; at most %d are supported", c->path,
                             key, len, MODEL_MAX_EOS);
    for (size_t i = 0; i < len; i++) {
        json_t *e = list ? json_array_get(v, i) : v;
        char at[32] = "";
        if (list) snprintf(at, sizeof at, "[%zu]", i);
        if (!json_is_integer(e) || json_integer_value(e) < 0)
            return strata_seterr(c->eb, STRATA_EINVAL_INPUT, "%s: %s%s: must be a token id", c->path, key, at);
        json_int_t id = json_integer_value(e);
        if (id >= vocab) {
            log_warn("%s: %s%s: %lld is outside the vocabulary (%lld); ignored, the model never emits it", c->path,
                     key, at, (long long)id, (long long)vocab);
            continue;
        }
        bool seen = false;
        for (int32_t k = 0; k < *n && !seen; k++) seen = ids[k] == (int32_t)id;
        if (!seen) ids[(*n)++] = (int32_t)id;
    }
    return 0;
}

/* cfg's stop set from config.json's eos_token_id (absent: the class default def). */
static int s_eos(ctx_t *c, int64_t def, model_config_t *cfg)
{
    json_t *v = json_object_get(c->root, "eos_token_id");
    cfg->n_eos = 0;
    if (!v) {
        if (def >= 0 && def < cfg->vocab) cfg->eos_ids[cfg->n_eos++] = (int32_t)def;
    } else if (!json_is_null(v)) {
        int rc = s_eos_ids(c, v, cfg->vocab, cfg->eos_ids, &cfg->n_eos);
        if (rc < 0) return rc;
    }
    cfg->eos_id = cfg->n_eos ? cfg->eos_ids[0] : -1;
    return 0;
}

/* ---- RoPE ------------------------------------------------------------------------------ */

/* inv_freq[i] = 1 / base^(2i/dim), as transformers computes it (fp32 exponent, fp32 result). */
static void s_rope_default(float *inv, int dim, double base)
{
    for (int i = 0; i < dim / 2; i++) {
        float e = (float)(2 * i) / (float)dim;
        inv[i] = 1.0f / (float)pow(base, (double)e);
    }
}

typedef struct {
    ctx_t *c;
    json_t *d;           /* the rope dict */
    const char *dname;   /* "rope_scaling." or "rope_parameters." (for messages) */
} rope_ctx_t;

static int s_rope_keys(rope_ctx_t *r, const char *type, const char *const *allowed)
{
    const char *k;
    json_t *v;
    json_object_foreach(r->d, k, v) {
        if (!strcmp(k, "rope_type") || !strcmp(k, "type") || !strcmp(k, "rope_theta") ||
            !strcmp(k, "partial_rotary_factor"))
            continue;
        if (!s_in(allowed, k))
            return strata_seterr(r->c->eb, STRATA_EINVAL_INPUT, "%s: %s%s: unknown field for rope_type '%s'",
                                 r->c->path, r->dname, k, type);
    }
    return 0;
}

/* Optional number in the rope dict: absent or null -> *set = false. */
static int s_rope_opt(rope_ctx_t *r, const char *key, double lo, bool lo_open, double hi, double *out, bool *set)
{
    json_t *v = json_object_get(r->d, key);
    *set = false;
    if (!v || json_is_null(v)) return 0;
    int rc = s_num_in(r->c, r->d, r->dname, key, 0, lo, lo_open, hi, out);
    if (rc == 0) *set = true;
    return rc;
}

static int s_rope(ctx_t *c, const arch_desc_t *a, model_config_t *cfg)
{
    int rc;
    json_t *rs = s_val(c, "rope_scaling"), *rp = s_val(c, "rope_parameters");
    if (rs && rp)
        return strata_seterr(c->eb, STRATA_EINVAL_INPUT,
                             "%s: rope_scaling: set together with rope_parameters; keep only one", c->path);
    rope_ctx_t r = {c, rs ? rs : rp, rs ? "rope_scaling." : "rope_parameters."};
    if (r.d && !json_is_object(r.d))
        return strata_seterr(c->eb, STRATA_EINVAL_INPUT, "%s: %s: must be an object or null", c->path,
                             rs ? "rope_scaling" : "rope_parameters");
    if (rp) {
        /* 5.x may nest one dict per layer type: {"full_attention": {...}, ...}. */
        json_t *full = json_object_get(rp, "full_attention");
        if (json_is_object(full)) {
            const char *k;
            json_t *v;
            json_object_foreach(rp, k, v) {
                if (strcmp(k, "full_attention"))
                    return strata_seterr(c->eb, STRATA_EUNSUPPORTED,
                                         "%s: rope_parameters.%s: only full_attention layers are supported", c->path, k);
            }
            r.d = full;
            r.dname = "rope_parameters.full_attention.";
        }
    }

    /* rope_theta: the dict's value wins (transformers 5.x), then the top-level key, then the
     * class default. */
    double theta = a->theta, top_theta = 0;
    bool top_set = false;
    if (s_val(c, "rope_theta")) {
        if ((rc = s_num_in(c, c->root, "", "rope_theta", a->theta, 1.0, true, 1e12, &top_theta)) < 0) return rc;
        theta = top_theta;
        top_set = true;
    }
    if (r.d && json_object_get(r.d, "rope_theta") && !json_is_null(json_object_get(r.d, "rope_theta"))) {
        double t;
        if ((rc = s_num_in(c, r.d, r.dname, "rope_theta", a->theta, 1.0, true, 1e12, &t)) < 0) return rc;
        if (top_set && t != top_theta)
            log_warn("%s: %srope_theta (%g) overrides rope_theta (%g), as in transformers 5.x", c->path, r.dname, t,
                     top_theta);
        theta = t;
    }

    /* partial_rotary_factor: these architectures rotate whole heads; transformers cannot run
     * them with a fraction, so anything but 1 is refused. */
    const char *prf_key[2] = {"partial_rotary_factor", NULL};
    json_t *prf_obj[2] = {c->root, r.d};
    const char *prf_ctx[2] = {"", r.dname};
    for (int i = 0; i < 2; i++) {
        json_t *o = prf_obj[i];
        if (!o || !json_object_get(o, prf_key[0]) || json_is_null(json_object_get(o, prf_key[0]))) continue;
        double f;
        if ((rc = s_num_in(c, o, prf_ctx[i], prf_key[0], 1.0, 0.0, true, 1.0, &f)) < 0) return rc;
        if (f != 1.0)
            return strata_seterr(c->eb, STRATA_EUNSUPPORTED, "%s: %spartial_rotary_factor: %g is not supported "
                                 "(%s rotates the whole head; only 1.0)", c->path, prf_ctx[i], f, a->arch_name);
    }

    const char *type = "default";
    if (r.d) {
        json_t *t1 = json_object_get(r.d, "rope_type"), *t2 = json_object_get(r.d, "type");
        if (t1 && !json_is_string(t1))
            return strata_seterr(c->eb, STRATA_EINVAL_INPUT, "%s: %srope_type: must be a string", c->path, r.dname);
        if (t2 && !json_is_string(t2))
            return strata_seterr(c->eb, STRATA_EINVAL_INPUT, "%s: %stype: must be a string", c->path, r.dname);
        if (t1 && t2 && strcmp(json_string_value(t1), json_string_value(t2)))
            return strata_seterr(c->eb, STRATA_EINVAL_INPUT, "%s: %srope_type: '%s' disagrees with type '%s'",
                                 c->path, r.dname, json_string_value(t1), json_string_value(t2));
        if (t1) type = json_string_value(t1);
        else if (t2) type = json_string_value(t2);
    }

    if ((float)theta <= 1.0f)
        return strata_seterr(c->eb, STRATA_EINVAL_INPUT, "%s: rope_theta: %.10g is too close to 1", c->path, theta);
    const int dim = cfg->head_dim;
    cfg->rope_theta = (float)theta;
    cfg->rot_dim = dim;
    cfg->attn_factor = 1.0f;
    memset(cfg->inv_freq, 0, sizeof cfg->inv_freq);
    s_rope_default(cfg->inv_freq, dim, theta);

    if (!strcmp(type, "default")) {
        static const char *const none[] = {NULL};
        return r.d ? s_rope_keys(&r, type, none) : 0;
    }
    if (!strcmp(type, "linear")) {
        static const char *const keys[] = {"factor", NULL};
        double factor;
        bool set;
        if ((rc = s_rope_keys(&r, type, keys)) < 0) return rc;
        if ((rc = s_rope_opt(&r, "factor", 1.0, false, 1e6, &factor, &set)) < 0) return rc;
        if (!set)
            return strata_seterr(c->eb, STRATA_EINVAL_INPUT, "%s: %sfactor: required for rope_type 'linear'", c->path,
                                 r.dname);
        for (int i = 0; i < dim / 2; i++) cfg->inv_freq[i] /= (float)factor;
        return 0;
    }
    if (!strcmp(type, "llama3")) {
        static const char *const keys[] = {"factor", "low_freq_factor", "high_freq_factor",
                                           "original_max_position_embeddings", NULL};
        double factor, lff, hff, omp;
        bool s1, s2, s3, s4;
        if ((rc = s_rope_keys(&r, type, keys)) < 0) return rc;
        if ((rc = s_rope_opt(&r, "factor", 1.0, false, 1e6, &factor, &s1)) < 0 ||
            (rc = s_rope_opt(&r, "low_freq_factor", 0.0, true, 1e6, &lff, &s2)) < 0 ||
            (rc = s_rope_opt(&r, "high_freq_factor", 0.0, true, 1e6, &hff, &s3)) < 0 ||
            (rc = s_rope_opt(&r, "original_max_position_embeddings", 1.0, false, MAX_POS, &omp, &s4)) < 0)
            return rc;
        if (!s1 || !s2 || !s3)
            return strata_seterr(c->eb, STRATA_EINVAL_INPUT, "%s: %s%s: required for rope_type 'llama3'", c->path,
                                 r.dname, !s1 ? "factor" : !s2 ? "low_freq_factor" : "high_freq_factor");
        if (hff <= lff)
            return strata_seterr(c->eb, STRATA_EINVAL_INPUT, "%s: %shigh_freq_factor: must exceed low_freq_factor",
                                 c->path, r.dname);
        if (!s4) omp = cfg->max_pos; /* transformers 5.x default */
        /* transformers' _compute_llama3_parameters, in its fp32 tensor arithmetic. */
        const float f = (float)factor, lo = (float)lff, old = (float)omp;
        const float low_wl = (float)(omp / lff), high_wl = (float)(omp / hff);
        for (int i = 0; i < dim / 2; i++) {
            float inv = cfg->inv_freq[i];
            float wl = (float)(2 * M_PI) / inv;
            float il = wl > low_wl ? inv / f : inv;
            float smooth = (old / wl - lo) / (float)(hff - lff);
            float sm = (1 - smooth) * il / f + smooth * il;
            bool medium = !(wl < high_wl) && !(wl > low_wl);
            cfg->inv_freq[i] = medium ? sm : il;
        }
        return 0;
    }
    if (!strcmp(type, "yarn")) {
        static const char *const keys[] = {"factor", "attention_factor", "beta_fast", "beta_slow",
                                           "original_max_position_embeddings", "mscale", "mscale_all_dim",
                                           "truncate", NULL};
        double factor, af, bf, bs, omp, ms, msa;
        bool sf, saf, sbf, sbs, somp, sms, smsa;
        if ((rc = s_rope_keys(&r, type, keys)) < 0) return rc;
        if ((rc = s_rope_opt(&r, "factor", 1.0, false, 1e6, &factor, &sf)) < 0 ||
            (rc = s_rope_opt(&r, "attention_factor", 0.0, true, 1e3, &af, &saf)) < 0 ||
            (rc = s_rope_opt(&r, "beta_fast", 0.0, false, 1e6, &bf, &sbf)) < 0 ||
            (rc = s_rope_opt(&r, "beta_slow", 0.0, false, 1e6, &bs, &sbs)) < 0 ||
            (rc = s_rope_opt(&r, "original_max_position_embeddings", 1.0, false, MAX_POS, &omp, &somp)) < 0 ||
            (rc = s_rope_opt(&r, "mscale", -1e3, false, 1e3, &ms, &sms)) < 0 ||
            (rc = s_rope_opt(&r, "mscale_all_dim", -1e3, false, 1e3, &msa, &smsa)) < 0)
            return rc;
        bool truncate = true;
        json_t *tv = json_object_get(r.d, "truncate");
        if (tv && !json_is_null(tv)) {
            if (!json_is_boolean(tv))
                return strata_seterr(c->eb, STRATA_EINVAL_INPUT, "%s: %struncate: must be true or false", c->path,
                                     r.dname);
            truncate = json_is_true(tv);
        }
        /* transformers 4.x replaces factor by max_position_embeddings / original_max_position_
         * embeddings when the latter is given; 5.x keeps factor. Refuse a config the two
         * versions would run differently rather than pick one silently; gpt-oss came with 5.x's
         * semantics (factor wins). */
        if (somp && sf && a->arch != ARCH_GPT_OSS && fabs(factor - cfg->max_pos / omp) > 1e-9 * factor)
            return strata_seterr(c->eb, STRATA_EUNSUPPORTED,
                                 "%s: %sfactor: %g disagrees with max_position_embeddings / "
                                 "original_max_position_embeddings = %g; transformers 4.x and 5.x run this "
                                 "config differently. Set max_position_embeddings to factor * "
                                 "original_max_position_embeddings", c->path, r.dname, factor, cfg->max_pos / omp);
        if (!somp) omp = cfg->max_pos;
        if (!sf) factor = cfg->max_pos / omp;
        if (factor < 1.0)
            return strata_seterr(c->eb, STRATA_EINVAL_INPUT, "%s: %sfactor: %g must be >= 1", c->path, r.dname, factor);
        if (!saf) {
            double m1 = factor <= 1 ? 1.0 : 0.1 * log(factor) + 1.0;
            if (sms && smsa && ms != 0 && msa != 0) {
                double a1 = factor <= 1 ? 1.0 : 0.1 * ms * log(factor) + 1.0;
                double a2 = factor <= 1 ? 1.0 : 0.1 * msa * log(factor) + 1.0;
                af = a1 / a2;
            } else {
                af = m1;
            }
        }
        if (!sbf || bf == 0) bf = 32;
        if (!sbs || bs == 0) bs = 1;
        double lo = (dim * log(omp / (bf * 2 * M_PI))) / (2 * log(theta));
        double hi = (dim * log(omp / (bs * 2 * M_PI))) / (2 * log(theta));
        if (truncate) {
            lo = floor(lo);
            hi = ceil(hi);
        }
        if (lo < 0) lo = 0;
        if (hi > dim - 1) hi = dim - 1;
        if (lo == hi) hi += 0.001;
        for (int i = 0; i < dim / 2; i++) {
            float pos = (float)pow(theta, (double)((float)(2 * i) / (float)dim));
            float extra = 1.0f / pos, inter = 1.0f / ((float)factor * pos);
            float ramp = ((float)i - (float)lo) / (float)(hi - lo);
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            float ef = 1 - ramp;
            cfg->inv_freq[i] = inter * (1 - ef) + extra * ef;
        }
        cfg->attn_factor = (float)af;
        return 0;
    }
    if (!strcmp(type, "dynamic"))
        return strata_seterr(c->eb, STRATA_EUNSUPPORTED,
                             "%s: %srope_type: 'dynamic' is not supported (its frequencies change with the "
                             "sequence length)", c->path, r.dname);
    return strata_seterr(c->eb, STRATA_EUNSUPPORTED,
                         "%s: %srope_type: '%.40s' is not supported (supported: default, linear, yarn, llama3)",
                         c->path, r.dname, type);
}

/* ---- the whole config ------------------------------------------------------------------ */

static int s_arch(ctx_t *c, const arch_desc_t **out)
{
    json_t *ar = s_val(c, "architectures"), *mt = s_val(c, "model_type");
    const char *name = NULL;
    if (ar) {
        if (!json_is_array(ar) || json_array_size(ar) == 0 || !json_is_string(json_array_get(ar, 0)))
            return strata_seterr(c->eb, STRATA_EINVAL_INPUT, "%s: architectures: must be a list of class names",
                                 c->path);
        name = json_string_value(json_array_get(ar, 0));
        for (size_t i = 1; i < json_array_size(ar); i++) {
            json_t *e = json_array_get(ar, i);
            if (!json_is_string(e) || strcmp(json_string_value(e), name))
                return strata_seterr(c->eb, STRATA_EUNSUPPORTED,
                                     "%s: architectures: lists several different classes", c->path);
        }
    }
    if (mt && !json_is_string(mt))
        return strata_seterr(c->eb, STRATA_EINVAL_INPUT, "%s: model_type: must be a string", c->path);
    if (!name && !mt)
        return strata_seterr(c->eb, STRATA_EINVAL_INPUT, "%s: architectures: missing (and no model_type)", c->path);
    for (size_t i = 0; i < sizeof s_archs / sizeof s_archs[0]; i++) {
        const arch_desc_t *a = &s_archs[i];
        if (name ? strcmp(name, a->arch_name) : strcmp(json_string_value(mt), a->model_type)) continue;
        if (mt && strcmp(json_string_value(mt), a->model_type))
            return strata_seterr(c->eb, STRATA_EINVAL_INPUT, "%s: model_type: '%.40s' does not match architecture %s",
                                 c->path, json_string_value(mt), a->arch_name);
        *out = a;
        return 0;
    }
    return strata_seterr(c->eb, STRATA_EUNSUPPORTED,
                         "%s: %s: '%.60s' is not supported (supported: MixtralForCausalLM, Qwen2MoeForCausalLM, "
                         "Qwen3MoeForCausalLM, OlmoeForCausalLM, GptOssForCausalLM)",
                         c->path, name ? "architectures" : "model_type", name ? name : json_string_value(mt));
}

/* Every key must be known; unknown ones are refused by name. */
static int s_check_keys(ctx_t *c, const arch_desc_t *a)
{
    const char *env = getenv("STRATA_ALLOW_UNKNOWN_CONFIG");
    bool allow = env && !strcmp(env, "1");
    const char *k;
    json_t *v;
    json_object_foreach(c->root, k, v) {
        if (s_in(s_semantic, k) || s_in(a->keys, k) || s_in(s_harmless, k)) continue;
        if (allow) {
            log_warn("%s: %s: unknown field ignored (STRATA_ALLOW_UNKNOWN_CONFIG=1)", c->path, k);
            continue;
        }
        return strata_seterr(c->eb, STRATA_EUNSUPPORTED,
                             "%s: %.100s: unknown field for %s; strata does not know its effect and refuses it "
                             "(STRATA_ALLOW_UNKNOWN_CONFIG=1 ignores it)", c->path, k, a->arch_name);
    }
    return 0;
}

/* Sliding windows (all but gpt-oss): they cannot be represented, so one that is active is
 * refused. A window at least as long as max_position_embeddings never masks anything and is
 * accepted. */
static int s_no_windows(ctx_t *c, const arch_desc_t *a, model_config_t *cfg)
{
    int rc;
    int64_t v;
    bool use_sw = true;
    if (a->has_use_sliding && (rc = s_bool(c, "use_sliding_window", false, &use_sw)) < 0) return rc;
    if (a->has_use_sliding && (rc = s_int(c, "max_window_layers", 0, true, 0, INT32_MAX, &v)) < 0) return rc;
    int64_t sw;
    if ((rc = s_int(c, "sliding_window", 0, true, 0, INT64_MAX, &sw)) < 0) return rc;
    if (use_sw && s_val(c, "sliding_window") && sw < cfg->max_pos)
        return strata_seterr(c->eb, STRATA_EUNSUPPORTED,
                             "%s: sliding_window: sliding-window attention (%lld tokens) is not supported",
                             c->path, (long long)sw);
    json_t *lt = s_val(c, "layer_types");
    if (lt) {
        if (!json_is_array(lt) || json_array_size(lt) != (size_t)cfg->n_layers)
            return strata_seterr(c->eb, STRATA_EINVAL_INPUT, "%s: layer_types: must list one type per layer (%d)",
                                 c->path, cfg->n_layers);
        for (size_t i = 0; i < json_array_size(lt); i++) {
            json_t *e = json_array_get(lt, i);
            if (!json_is_string(e) || strcmp(json_string_value(e), "full_attention"))
                return strata_seterr(c->eb, STRATA_EUNSUPPORTED,
                                     "%s: layer_types[%zu]: only \"full_attention\" layers are supported", c->path, i);
        }
    }

    return 0;
}

/* gpt-oss's attention layers: layer_types lists "sliding_attention" or "full_attention" per
 * layer (default: sliding on even layers, as GptOssConfig), sliding_window the tokens a
 * sliding layer sees, itself included (transformers' mask: kv_idx > q_idx - sliding_window);
 * null means no window. */
static int s_windows(ctx_t *c, model_config_t *cfg)
{
    int rc;
    int64_t sw;
    json_t *raw = json_object_get(c->root, "sliding_window");
    if ((rc = s_int(c, "sliding_window", 128, true, 1, INT32_MAX, &sw)) < 0) return rc;
    if (raw && json_is_null(raw)) sw = 0;
    json_t *lt = s_val(c, "layer_types");
    if (lt && (!json_is_array(lt) || json_array_size(lt) != (size_t)cfg->n_layers))
        return strata_seterr(c->eb, STRATA_EINVAL_INPUT, "%s: layer_types: must list one type per layer (%d)", c->path,
                             cfg->n_layers);
    cfg->sliding_window = 0;
    for (int i = 0; i < cfg->n_layers; i++) {
        bool sliding = (i + 1) % 2 != 0;
        if (lt) {
            json_t *e = json_array_get(lt, (size_t)i);
            const char *t = json_is_string(e) ? json_string_value(e) : "";
            if (strcmp(t, "sliding_attention") && strcmp(t, "full_attention"))
                return strata_seterr(c->eb, STRATA_EUNSUPPORTED,
                                     "%s: layer_types[%d]: must be \"sliding_attention\" or \"full_attention\"",
                                     c->path, i);
            sliding = !strcmp(t, "sliding_attention");
        }
        /* a window as long as the context masks nothing: the layer is a full one */
        cfg->layer_sliding[i] = sliding && sw > 0 && sw < cfg->max_pos;
        if (cfg->layer_sliding[i]) cfg->sliding_window = (int32_t)sw;
    }
    return 0;
}

/* quantization_config: MXFP4 (gpt-oss's experts as shipped) is read as it is; every other
 * method is refused by name. Which modules stay unquantized follows transformers'
 * should_convert_module: a pattern of modules_to_not_convert excludes a module when it matches
 * the module's name from the start as a regular expression, or ends it. Only gpt-oss's
 * experts are ever quantized (transformers' Mxfp4HfQuantizer replaces GptOssExperts alone). */
static int s_quant(ctx_t *c, const arch_desc_t *a, json_t *qc, model_config_t *cfg)
{
    if (!json_is_object(qc))
        return strata_seterr(c->eb, STRATA_EINVAL_INPUT, "%s: quantization_config: must be an object", c->path);
    json_t *qm = json_object_get(qc, "quant_method");
    if (!json_is_string(qm))
        return strata_seterr(c->eb, STRATA_EINVAL_INPUT, "%s: quantization_config.quant_method: must be a string",
                             c->path);
    const char *m = json_string_value(qm);
    if (strcmp(m, "mxfp4"))
        return strata_seterr(c->eb, STRATA_EUNSUPPORTED,
                             "%s: quantization_config.quant_method: '%.40s' checkpoints are not supported "
                             "(supported: mxfp4; a full-precision checkpoint can be quantized by `strata pack "
                             "--format`)", c->path, m);
    if (a->arch != ARCH_GPT_OSS)
        return strata_seterr(c->eb, STRATA_EUNSUPPORTED,
                             "%s: quantization_config.quant_method: mxfp4 checkpoints are read for "
                             "GptOssForCausalLM only (transformers quantizes no other architecture's experts so)",
                             c->path);
    const char *k;
    json_t *v;
    json_object_foreach(qc, k, v) {
        if (!strcmp(k, "quant_method") || !strcmp(k, "modules_to_not_convert") || !strcmp(k, "dequantize")) continue;
        return strata_seterr(c->eb, STRATA_EUNSUPPORTED, "%s: quantization_config.%.60s: unknown field for mxfp4",
                             c->path, k);
    }
    json_t *nc = json_object_get(qc, "modules_to_not_convert");
    if (nc && !json_is_null(nc) && !json_is_array(nc))
        return strata_seterr(c->eb, STRATA_EINVAL_INPUT,
                             "%s: quantization_config.modules_to_not_convert: must be a list of names", c->path);
    size_t n_re = nc && json_is_array(nc) ? json_array_size(nc) : 0;
    if (n_re > 64)
        return strata_seterr(c->eb, STRATA_EUNSUPPORTED,
                             "%s: quantization_config.modules_to_not_convert: more than 64 patterns", c->path);
    pcre2_code *re[64] = {0};
    pcre2_match_data *md = NULL;
    int rc = 0;
    for (size_t i = 0; i < n_re; i++) {
        json_t *e = json_array_get(nc, i);
        if (!json_is_string(e)) {
            rc = strata_seterr(c->eb, STRATA_EINVAL_INPUT,
                               "%s: quantization_config.modules_to_not_convert[%zu]: must be a string", c->path, i);
            goto out;
        }
        int err;
        PCRE2_SIZE off;
        re[i] = pcre2_compile((PCRE2_SPTR)json_string_value(e), PCRE2_ZERO_TERMINATED, PCRE2_ANCHORED, &err, &off,
                              NULL);
        if (!re[i]) {
            rc = strata_seterr(c->eb, STRATA_EINVAL_INPUT,
                               "%s: quantization_config.modules_to_not_convert[%zu]: not a regular expression "
                               "(offset %zu)", c->path, i, (size_t)off);
            goto out;
        }
    }
    md = pcre2_match_data_create(8, NULL);
    if (!md) {
        rc = strata_seterr(c->eb, STRATA_ENOMEM, "%s: out of memory", c->path);
        goto out;
    }
    for (int l = 0; l < cfg->n_layers; l++) {
        char name[96];
        int ln = snprintf(name, sizeof name, "model.layers.%d.mlp.experts", l);
        bool keep = false;
        for (size_t i = 0; i < n_re && !keep; i++) {
            const char *p = json_string_value(json_array_get(nc, i));
            size_t lp = strlen(p);
            /* re.match(key + "\\.") matches only where re.match(key) does, so one test covers both */
            keep = ((size_t)ln >= lp && !strcmp(name + ln - lp, p)) ||
                   pcre2_match(re[i], (PCRE2_SPTR)name, (size_t)ln, 0, 0, md, NULL) >= 0;
        }
        cfg->experts_mxfp4[l] = !keep;
    }
out:
    pcre2_match_data_free(md);
    for (size_t i = 0; i < n_re; i++) pcre2_code_free(re[i]);
    return rc;
}

/* gpt-oss's MoE: router and expert biases, and GptOssExperts' clamped SwiGLU (limit 7.0,
 * alpha 1.702, hard-coded in transformers: a config's swiglu_limit does not change what
 * transformers computes, so it does not here either, with a warning when it differs). */
static int s_gpt_oss_moe(ctx_t *c, model_config_t *cfg)
{
    int rc;
    cfg->router_bias = cfg->expert_bias = true;
    cfg->ffn_act = FFN_ACT_GPT_OSS;
    cfg->act_limit = 7.0f;
    cfg->act_alpha = 1.702f;
    if (s_val(c, "swiglu_limit")) {
        double lim;
        if ((rc = s_num_in(c, c->root, "", "swiglu_limit", 7.0, 0.0, true, 1e6, &lim)) < 0) return rc;
        if (lim != 7.0)
            log_warn("%s: swiglu_limit: %g differs from the 7.0 that transformers' GptOssExperts always uses; "
                     "strata uses 7.0 too", c->path, lim);
    }
    if (s_val(c, "experts_per_token")) {
        int64_t v;
        if ((rc = s_int(c, "experts_per_token", cfg->top_k, true, 1, MAX_EXPERTS, &v)) < 0) return rc;
        if (v != cfg->top_k)
            log_warn("%s: experts_per_token (%lld) differs from num_experts_per_tok (%d); transformers routes to "
                     "num_experts_per_tok, and so does strata", c->path, (long long)v, cfg->top_k);
    }
    if (s_val(c, "initial_context_length")) {
        int64_t v;
        if ((rc = s_int(c, "initial_context_length", 0, true, 1, MAX_POS, &v)) < 0) return rc;
    }
    return 0;
}

static int s_parse(ctx_t *c, model_config_t *cfg)
{
    int rc;
    const arch_desc_t *a = NULL;
    int64_t v;

    if ((rc = s_arch(c, &a)) < 0) return rc;
    if ((rc = s_check_keys(c, a)) < 0) return rc;
    cfg->arch = a->arch;
    snprintf(cfg->arch_name, sizeof cfg->arch_name, "%s", a->arch_name);

    /* Fields that would change the network beyond what strata runs. */
    bool b = false;
    if ((rc = s_bool(c, "is_encoder_decoder", false, &b)) < 0) return rc;
    if (b) return strata_seterr(c->eb, STRATA_EUNSUPPORTED, "%s: is_encoder_decoder: must be false", c->path);
    if ((rc = s_bool(c, "add_cross_attention", false, &b)) < 0) return rc;
    if (b) return strata_seterr(c->eb, STRATA_EUNSUPPORTED, "%s: add_cross_attention: must be false", c->path);
    json_t *ph = s_val(c, "pruned_heads");
    if (ph && (!json_is_object(ph) || json_object_size(ph) > 0))
        return strata_seterr(c->eb, STRATA_EUNSUPPORTED, "%s: pruned_heads: pruned attention heads are not supported",
                             c->path);
    if (s_val(c, "auto_map"))
        log_warn("%s: auto_map: custom modeling code is not used; loading as the built-in %s (as transformers "
                 "does without trust_remote_code)", c->path, a->arch_name);
    json_t *act = json_object_get(c->root, "hidden_act");
    if (act && (!json_is_string(act) || (strcmp(json_string_value(act), "silu") && strcmp(json_string_value(act), "swish"))))
        return strata_seterr(c->eb, STRATA_EUNSUPPORTED, "%s: hidden_act: '%.40s' is not supported (only silu)",
                             c->path, json_is_string(act) ? json_string_value(act) : "?");

    /* Sizes. */
    if ((rc = s_int(c, "vocab_size", a->vocab, false, 1, MAX_VOCAB, &v)) < 0) return rc;
    cfg->vocab = (int32_t)v;
    if ((rc = s_int(c, "hidden_size", a->hidden, false, 1, MAX_HIDDEN, &v)) < 0) return rc;
    cfg->hidden = (int32_t)v;
    int64_t inter;
    if ((rc = s_int(c, "intermediate_size", a->inter, false, 1, MAX_INTER, &inter)) < 0) return rc;
    if ((rc = s_int(c, "num_hidden_layers", a->layers, false, 1, MAX_LAYERS, &v)) < 0) return rc;
    cfg->n_layers = (int32_t)v;
    if ((rc = s_int(c, "num_attention_heads", a->heads, false, 1, MAX_HEADS, &v)) < 0) return rc;
    cfg->n_heads = (int32_t)v;
    if ((rc = s_int(c, "num_key_value_heads", a->kv_heads < 0 ? cfg->n_heads : a->kv_heads,
                    a->arch == ARCH_MIXTRAL || a->arch == ARCH_OLMOE || a->arch == ARCH_GPT_OSS, 1, MAX_HEADS, &v)) < 0)
        return rc;
    if (json_is_null(json_object_get(c->root, "num_key_value_heads"))) v = cfg->n_heads;
    cfg->n_kv_heads = (int32_t)v;
    if (cfg->n_kv_heads > cfg->n_heads || cfg->n_heads % cfg->n_kv_heads)
        return strata_seterr(c->eb, STRATA_EINVAL_INPUT,
                             "%s: num_key_value_heads: %d must divide num_attention_heads (%d)", c->path,
                             cfg->n_kv_heads, cfg->n_heads);

    int64_t hd = 0;
    if ((rc = s_int(c, "head_dim", 0, true, 1, MAX_HEAD_DIM, &hd)) < 0) return rc;
    if (hd == 0) {
        if (cfg->hidden % cfg->n_heads)
            return strata_seterr(c->eb, STRATA_EINVAL_INPUT,
                                 "%s: num_attention_heads: %d does not divide hidden_size (%d) and head_dim is not "
                                 "given", c->path, cfg->n_heads, cfg->hidden);
        hd = cfg->hidden / cfg->n_heads;
    } else if (!a->head_dim_free && (cfg->hidden % cfg->n_heads || hd != cfg->hidden / cfg->n_heads)) {
        /* transformers 4.x derives head_dim for this architecture and ignores the key. */
        return strata_seterr(c->eb, STRATA_EUNSUPPORTED,
                             "%s: head_dim: %lld differs from hidden_size / num_attention_heads, which %s requires",
                             c->path, (long long)hd, a->arch_name);
    }
    if (hd < 2 || hd > MAX_HEAD_DIM || hd % 2)
        return strata_seterr(c->eb, STRATA_EINVAL_INPUT, "%s: head_dim: %lld must be even and in [2, %d]", c->path,
                             (long long)hd, MAX_HEAD_DIM);
    if ((int64_t)cfg->n_heads * hd > MAX_ATTN_WIDTH)
        return strata_seterr(c->eb, STRATA_EINVAL_INPUT, "%s: head_dim: num_attention_heads * head_dim = %lld exceeds %d",
                             c->path, (long long)(cfg->n_heads * hd), MAX_ATTN_WIDTH);
    cfg->head_dim = (int32_t)hd;

    if ((rc = s_int(c, "max_position_embeddings", a->max_pos, false, 1, MAX_POS, &v)) < 0) return rc;
    cfg->max_pos = (int32_t)v;
    double eps;
    if ((rc = s_num_in(c, c->root, "", "rms_norm_eps", a->eps, 0.0, true, 1.0, &eps)) < 0) return rc;
    if ((float)eps <= 0)
        return strata_seterr(c->eb, STRATA_EINVAL_INPUT, "%s: rms_norm_eps: %g is too small for fp32", c->path, eps);
    cfg->rms_eps = (float)eps;
    if ((rc = s_bool(c, "tie_word_embeddings", false, &cfg->tie_embeddings)) < 0) return rc;
    if ((rc = s_token(c, "bos_token_id", a->bos, cfg->vocab, &cfg->bos_id)) < 0) return rc;
    if ((rc = s_eos(c, a->eos, cfg)) < 0) return rc;
    json_t *pad = json_object_get(c->root, "pad_token_id");
    if (pad && !json_is_null(pad) && !json_is_integer(pad))
        return strata_seterr(c->eb, STRATA_EINVAL_INPUT, "%s: pad_token_id: must be an integer or null", c->path);

    /* Attention variants. */
    cfg->qkv_bias = cfg->o_bias = false;
    cfg->qk_norm = QK_NORM_NONE;
    if (a->arch == ARCH_GPT_OSS) {
        if ((rc = s_bool(c, "attention_bias", true, &cfg->qkv_bias)) < 0) return rc;
        cfg->o_bias = cfg->qkv_bias;
        cfg->attn_sinks = true;
    } else if (a->arch == ARCH_QWEN2_MOE) {
        if ((rc = s_bool(c, "qkv_bias", true, &cfg->qkv_bias)) < 0) return rc;
    } else if (a->arch == ARCH_QWEN3_MOE || a->arch == ARCH_OLMOE) {
        if ((rc = s_bool(c, "attention_bias", false, &cfg->qkv_bias)) < 0) return rc;
        cfg->o_bias = cfg->qkv_bias;
        cfg->qk_norm = a->arch == ARCH_QWEN3_MOE ? QK_NORM_HEAD : QK_NORM_FULL;
    }
    if (a->arch == ARCH_OLMOE && s_val(c, "clip_qkv"))
        return strata_seterr(c->eb, STRATA_EUNSUPPORTED,
                             "%s: clip_qkv: clipping q/k/v is not supported (only null)", c->path);

    if (a->arch == ARCH_GPT_OSS) {
        if ((rc = s_windows(c, cfg)) < 0) return rc;
    } else if ((rc = s_no_windows(c, a, cfg)) < 0) {
        return rc;
    }

    /* MoE. */
    const bool local = a->arch == ARCH_MIXTRAL || a->arch == ARCH_GPT_OSS; /* num_local_experts is the name */
    const char *ekey = local ? "num_local_experts" : "num_experts";
    const char *ekey2 = a->arch == ARCH_QWEN2_MOE ? NULL : local ? "num_experts" : "num_local_experts";
    int64_t ne, ne2;
    int64_t emin = (a->arch == ARCH_QWEN2_MOE || a->arch == ARCH_QWEN3_MOE) ? 0 : 1;
    if ((rc = s_int(c, ekey, a->experts, false, emin, MAX_EXPERTS, &ne)) < 0) return rc;
    if (ekey2 && json_object_get(c->root, ekey2)) {
        if ((rc = s_int(c, ekey2, a->experts, false, emin, MAX_EXPERTS, &ne2)) < 0) return rc;
        if (json_object_get(c->root, ekey) && ne2 != ne)
            return strata_seterr(c->eb, STRATA_EINVAL_INPUT, "%s: %s: %lld disagrees with %s (%lld)", c->path, ekey2,
                                 (long long)ne2, ekey, (long long)ne);
        ne = ne2;
    }
    cfg->n_experts = (int32_t)ne;
    if ((rc = s_int(c, "num_experts_per_tok", a->top_k, false, ne ? 1 : 0, MAX_EXPERTS, &v)) < 0) return rc;
    if (ne && v > ne)
        return strata_seterr(c->eb, STRATA_EINVAL_INPUT, "%s: num_experts_per_tok: %lld exceeds %s (%lld)", c->path,
                             (long long)v, ekey, (long long)ne);
    cfg->top_k = ne ? (int32_t)v : 0;
    /* Mixtral always renormalizes; gpt-oss takes the softmax of the top-k logits, which is the
     * same thing. */
    cfg->norm_topk = a->arch == ARCH_MIXTRAL || a->arch == ARCH_GPT_OSS;
    if (!cfg->norm_topk && (rc = s_bool(c, "norm_topk_prob", false, &cfg->norm_topk)) < 0) return rc;
    cfg->ffn_act = FFN_ACT_SILU;
    if (a->arch == ARCH_GPT_OSS && (rc = s_gpt_oss_moe(c, cfg)) < 0) return rc;
    if (a->arch == ARCH_MIXTRAL && s_val(c, "router_jitter_noise")) {
        double jn; /* training only, but it must be a sane number */
        if ((rc = s_num_in(c, c->root, "", "router_jitter_noise", 0, 0, false, 1e6, &jn)) < 0) return rc;
    }

    cfg->shared_inter = 0;
    cfg->dense_inter = 0;
    if (a->arch == ARCH_MIXTRAL || a->arch == ARCH_OLMOE || a->arch == ARCH_GPT_OSS) {
        cfg->moe_inter = (int32_t)inter;
        for (int i = 0; i < cfg->n_layers; i++) cfg->layer_sparse[i] = true;
    } else {
        cfg->dense_inter = (int32_t)inter;
        if ((rc = s_int(c, "moe_intermediate_size", a->moe_inter, false, 1, MAX_INTER, &v)) < 0) return rc;
        cfg->moe_inter = (int32_t)v;
        if (a->arch == ARCH_QWEN2_MOE) {
            if ((rc = s_int(c, "shared_expert_intermediate_size", a->shared_inter, false, 0, MAX_INTER, &v)) < 0)
                return rc;
            cfg->shared_inter = (int32_t)v;
        }
        int64_t step;
        if ((rc = s_int(c, "decoder_sparse_step", 1, false, 1, MAX_LAYERS, &step)) < 0) return rc;
        json_t *mol = s_val(c, "mlp_only_layers");
        if (mol && !json_is_array(mol))
            return strata_seterr(c->eb, STRATA_EINVAL_INPUT, "%s: mlp_only_layers: must be a list of layer indices",
                                 c->path);
        bool only[MAX_LAYERS] = {0};
        for (size_t i = 0; mol && i < json_array_size(mol); i++) {
            json_t *e = json_array_get(mol, i);
            if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) >= cfg->n_layers)
                return strata_seterr(c->eb, STRATA_EINVAL_INPUT,
                                     "%s: mlp_only_layers[%zu]: must be a layer index in [0, %d)", c->path, i,
                                     cfg->n_layers);
            only[json_integer_value(e)] = true;
        }
        /* transformers: sparse iff not in mlp_only_layers and num_experts > 0 and
         * (layer_idx + 1) % decoder_sparse_step == 0. */
        for (int i = 0; i < cfg->n_layers; i++)
            cfg->layer_sparse[i] = !only[i] && ne > 0 && (i + 1) % step == 0;
    }
    for (int i = cfg->n_layers; i < MAX_LAYERS; i++) cfg->layer_sparse[i] = false;

    json_t *qc = s_val(c, "quantization_config"); /* after the layers are known */
    if (qc && (rc = s_quant(c, a, qc, cfg)) < 0) return rc;
    if (a->arch == ARCH_GPT_OSS && !s_val(c, "rope_scaling") && !s_val(c, "rope_parameters")) {
        /* GptOssConfig's default: YaRN from a 4096-token original context */
        json_t *d = json_pack("{s:s, s:f, s:f, s:f, s:b, s:i}", "rope_type", "yarn", "factor", 32.0, "beta_fast", 32.0,
                              "beta_slow", 1.0, "truncate", 0, "original_max_position_embeddings", 4096);
        if (!d || json_object_set_new(c->root, "rope_parameters", d) < 0)
            return strata_seterr(c->eb, STRATA_ENOMEM, "%s: out of memory", c->path);
    }
    if ((rc = s_rope(c, a, cfg)) < 0) return rc;
    /* Extreme but in-range scaling parameters must not yield unusable frequencies. */
    bool ok = isfinite(cfg->attn_factor) && cfg->attn_factor > 0;
    for (int i = 0; ok && i < cfg->rot_dim / 2; i++) ok = isfinite(cfg->inv_freq[i]) && cfg->inv_freq[i] > 0;
    if (!ok)
        return strata_seterr(c->eb, STRATA_EINVAL_INPUT,
                             "%s: %s: the RoPE parameters give non-finite or non-positive frequencies", c->path,
                             s_val(c, "rope_parameters") ? "rope_parameters" : "rope_scaling");
    return 0;
}

/* Parse config.json text into cfg (zeroed on error). 0 or <0 with eb naming `name` and the field. */
int model_config_parse(model_config_t *cfg, const char *json, size_t len, const char *name, strata_errbuf_t *eb)
{
    int rc;
    json_error_t jerr;
    ctx_t c = {name ? name : "config.json", NULL, eb};
    memset(cfg, 0, sizeof *cfg);
    c.root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!c.root) {
        rc = strata_seterr(eb, STRATA_EINVAL_INPUT, "%s: JSON: %s (line %d, column %d)", c.path, jerr.text, jerr.line,
                           jerr.column);
        goto fail;
    }
    if (!json_is_object(c.root)) {
        rc = strata_seterr(eb, STRATA_EINVAL_INPUT, "%s: not a JSON object", c.path);
        goto fail;
    }
    if ((rc = s_parse(&c, cfg)) < 0) goto fail;
    json_decref(c.root);
    return 0;
fail:
    json_decref(c.root);
    memset(cfg, 0, sizeof *cfg);
    return rc;
}

/* generation_config.json text: its eos_token_id, when set, is cfg's stop set; see model.h. */
int model_config_apply_generation(model_config_t *cfg, const char *json, size_t len, const char *name,
                                  strata_errbuf_t *eb)
{
    int rc = 0;
    json_error_t jerr;
    json_t *v;
    int32_t ids[MODEL_MAX_EOS], n = 0;
    ctx_t c = {name ? name : "generation_config.json", NULL, eb};
    c.root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!c.root) {
        return strata_seterr(eb, STRATA_EINVAL_INPUT, "%s: JSON: %s (line %d, column %d)", c.path, jerr.text,
                             jerr.line, jerr.column);
    }
    if (!json_is_object(c.root)) {
        rc = strata_seterr(eb, STRATA_EINVAL_INPUT, "%s: not a JSON object", c.path);
        goto out;
    }
    /* transformers: the generation config's eos_token_id is the stop set; without one (absent
     * or null) the model config's stands */
    if (!(v = s_val(&c, "eos_token_id"))) goto out;
    if ((rc = s_eos_ids(&c, v, cfg->vocab, ids, &n)) < 0) goto out;
    memcpy(cfg->eos_ids, ids, sizeof ids);
    cfg->n_eos = n;
    cfg->eos_id = n ? ids[0] : -1;
out:
    json_decref(c.root);
    return rc;
}

/* Read the file at path (at most MAX_CONFIG_BYTES) into a malloc'd *buf of *n bytes. */
static int s_read(const char *path, char **buf, size_t *n, strata_errbuf_t *eb)
{
    int rc = 0;
    *buf = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return strata_seterr(eb, -errno, "%s: cannot open: %s", path, strerror(errno));
    *buf = malloc(MAX_CONFIG_BYTES + 1);
    if (!*buf) {
        rc = strata_seterr(eb, STRATA_ENOMEM, "%s: out of memory", path);
        goto fail;
    }
    *n = fread(*buf, 1, MAX_CONFIG_BYTES + 1, f);
    if (ferror(f)) {
        rc = strata_seterr(eb, STRATA_EIO, "%s: read error", path);
        goto fail;
    }
    if (*n > MAX_CONFIG_BYTES) {
        rc = strata_seterr(eb, STRATA_ETOOLARGE, "%s: larger than %d bytes", path, MAX_CONFIG_BYTES);
        goto fail;
    }
    fclose(f);
    return 0;
fail:
    fclose(f);
    free(*buf);
    *buf = NULL;
    return rc;
}

/* Read and parse the config.json at path (at most 16 MB), then apply the generation_config.json
 * in the same folder when there is one. 0 or <0 with eb set. */
int model_config_load(model_config_t *cfg, const char *path, strata_errbuf_t *eb)
{
    int rc;
    char *buf = NULL;
    size_t n = 0;
    char gpath[4200];
    FILE *f;
    if ((rc = s_read(path, &buf, &n, eb)) < 0) goto fail;
    if ((rc = model_config_parse(cfg, buf, n, path, eb)) < 0) goto fail;
    free(buf);
    buf = NULL;
    const char *slash = strrchr(path, '/');
    int dl = slash ? (int)(slash - path + 1) : 0;
    if (snprintf(gpath, sizeof gpath, "%.*sgeneration_config.json", dl, path) >= (int)sizeof gpath) {
        rc = strata_seterr(eb, STRATA_EINVAL_INPUT, "%s: path too long", path);
        goto fail;
    }
    f = fopen(gpath, "rb");
    if (!f && errno == ENOENT) return 0; /* no generation config: config.json's ids stand */
    if (f) fclose(f);
    if ((rc = s_read(gpath, &buf, &n, eb)) < 0) goto fail;
    if ((rc = model_config_apply_generation(cfg, buf, n, gpath, eb)) < 0) goto fail;
    free(buf);
    return 0;
fail:
    free(buf);
    memset(cfg, 0, sizeof *cfg);
    return rc;
}
