/* test_model_config.c - the HF config.json parser (model/config.c): the real configs of every
 * supported architecture in the transformers 4.x and 5.x layouts, the RoPE scaling types
 * against an independent transcription of transformers' formulas, the sparse-layer rule,
 * every refused field (the message must name the file and the field), absurd values, and
 * random mutations that must never crash or load something inconsistent. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/tokenizer.h"
#include "model/model.h"
#include "tests/unit/check.h"

/* Real config.json files from the Hub (4.x layout). */
static const char *MIXTRAL =
    "{\"architectures\":[\"MixtralForCausalLM\"],\"attention_dropout\":0.0,\"bos_token_id\":1,\"eos_token_id\":2,"
    "\"hidden_act\":\"silu\",\"hidden_size\":4096,\"initializer_range\":0.02,\"intermediate_size\":14336,"
    "\"max_position_embeddings\":32768,\"model_type\":\"mixtral\",\"num_attention_heads\":32,"
    "\"num_experts_per_tok\":2,\"num_hidden_layers\":32,\"num_key_value_heads\":8,\"num_local_experts\":8,"
    "\"output_router_logits\":false,\"rms_norm_eps\":1e-05,\"rope_theta\":1000000.0,"
    "\"router_aux_loss_coef\":0.02,\"sliding_window\":null,\"tie_word_embeddings\":false,"
    "\"torch_dtype\":\"bfloat16\",\"transformers_version\":\"4.36.0.dev0\",\"use_cache\":true,\"vocab_size\":32000}";
static const char *QWEN2 =
    "{\"architectures\":[\"Qwen2MoeForCausalLM\"],\"attention_dropout\":0.0,\"bos_token_id\":151643,"
    "\"eos_token_id\":151643,\"hidden_act\":\"silu\",\"hidden_size\":2048,\"initializer_range\":0.02,"
    "\"intermediate_size\":5632,\"max_position_embeddings\":8192,\"max_window_layers\":21,"
    "\"model_type\":\"qwen2_moe\",\"num_attention_heads\":16,\"num_hidden_layers\":24,\"num_key_value_heads\":16,"
    "\"rms_norm_eps\":1e-06,\"rope_theta\":1000000.0,\"sliding_window\":32768,\"tie_word_embeddings\":false,"
    "\"torch_dtype\":\"bfloat16\",\"transformers_version\":\"4.39.0.dev0\",\"use_cache\":true,"
    "\"use_sliding_window\":false,\"vocab_size\":151936,\"decoder_sparse_step\":1,\"moe_intermediate_size\":1408,"
    "\"shared_expert_intermediate_size\":5632,\"num_experts_per_tok\":4,\"num_experts\":60,"
    "\"norm_topk_prob\":false,\"output_router_logits\":false,\"router_aux_loss_coef\":0.001}";
static const char *QWEN3 =
    "{\"architectures\":[\"Qwen3MoeForCausalLM\"],\"attention_bias\":false,\"attention_dropout\":0.0,"
    "\"bos_token_id\":151643,\"decoder_sparse_step\":1,\"eos_token_id\":151645,\"head_dim\":128,"
    "\"hidden_act\":\"silu\",\"hidden_size\":2048,\"initializer_range\":0.02,\"intermediate_size\":6144,"
    "\"max_position_embeddings\":40960,\"max_window_layers\":48,\"mlp_only_layers\":[],"
    "\"model_type\":\"qwen3_moe\",\"moe_intermediate_size\":768,\"norm_topk_prob\":true,"
    "\"num_attention_heads\":32,\"num_experts\":128,\"num_experts_per_tok\":8,\"num_hidden_layers\":48,"
    "\"num_key_value_heads\":4,\"output_router_logits\":false,\"rms_norm_eps\":1e-06,\"rope_scaling\":null,"
    "\"rope_theta\":1000000.0,\"router_aux_loss_coef\":0.001,\"sliding_window\":null,"
    "\"tie_word_embeddings\":false,\"torch_dtype\":\"bfloat16\",\"transformers_version\":\"4.51.0\","
    "\"use_cache\":true,\"use_sliding_window\":false,\"vocab_size\":151936}";
static const char *OLMOE =
    "{\"architectures\":[\"OlmoeForCausalLM\"],\"attention_bias\":false,\"attention_dropout\":0.0,"
    "\"clip_qkv\":null,\"eos_token_id\":50279,\"hidden_act\":\"silu\",\"hidden_size\":2048,"
    "\"initializer_range\":0.02,\"intermediate_size\":1024,\"max_position_embeddings\":4096,"
    "\"model_type\":\"olmoe\",\"norm_topk_prob\":false,\"num_attention_heads\":16,\"num_experts\":64,"
    "\"num_experts_per_tok\":8,\"num_hidden_layers\":16,\"num_key_value_heads\":16,"
    "\"output_router_logits\":false,\"pad_token_id\":1,\"rms_norm_eps\":1e-05,\"rope_scaling\":null,"
    "\"rope_theta\":10000.0,\"router_aux_loss_coef\":0.01,\"tie_word_embeddings\":false,"
    "\"torch_dtype\":\"bfloat16\",\"transformers_version\":\"4.43.0.dev0\",\"use_cache\":true,"
    "\"vocab_size\":50304}";

static int s_parse(model_config_t *c, const char *js, strata_errbuf_t *eb)
{
    memset(eb, 0, sizeof *eb);
    return model_config_parse(c, js, strlen(js), "cfg.json", eb);
}

/* base with key set to the JSON value `val` ("" deletes the key). Returned string is malloc'd. */
static char *s_with(const char *base, const char *key, const char *val)
{
    json_t *o = json_loads(base, 0, NULL);
    STRATA_ASSERT(o);
    if (!val[0]) {
        json_object_del(o, key);
    } else {
        json_t *v = json_loads(val, JSON_DECODE_ANY, NULL);
        STRATA_ASSERT(v);
        json_object_set_new(o, key, v);
    }
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

/* Refused with a message naming the file and `want`. */
static void s_refused(const char *what, const char *base, const char *key, const char *val, const char *want)
{
    char *js = s_with(base, key, val);
    model_config_t c;
    strata_errbuf_t eb;
    int rc = s_parse(&c, js, &eb);
    T_CHECK(rc < 0, "%s: accepted %s=%s", what, key, val);
    T_CHECK(strstr(eb.msg, "cfg.json") && strstr(eb.msg, want), "%s: message lacks '%s': %s", what, want, eb.msg);
    free(js);
}

static void s_accepted(const char *what, const char *base, const char *key, const char *val, model_config_t *out)
{
    char *js = s_with(base, key, val);
    model_config_t c;
    strata_errbuf_t eb;
    int rc = s_parse(&c, js, &eb);
    T_CHECK(rc == 0, "%s: refused %s=%s: %s", what, key, val, eb.msg);
    if (out) *out = c;
    free(js);
}

static void s_check_default_rope(const model_config_t *c, double theta)
{
    T_CHECK(c->rot_dim == c->head_dim, "rot_dim %d head_dim %d", c->rot_dim, c->head_dim);
    T_CHECK(c->attn_factor == 1.0f, "attn_factor %g", c->attn_factor);
    T_CHECK(fabs(c->rope_theta - theta) <= 1e-6 * theta, "rope_theta %g want %g", c->rope_theta, theta);
    double worst = 0;
    for (int i = 0; i < c->rot_dim / 2; i++) {
        double want = 1.0 / pow(theta, 2.0 * i / c->rot_dim);
        worst = fmax(worst, fabs(c->inv_freq[i] - want) / want);
    }
    T_CHECK(worst < 1e-6, "default inv_freq rel err %g", worst);
    T_CHECK(c->inv_freq[c->rot_dim / 2] == 0, "inv_freq past rot_dim/2 not zero");
}

static void test_real_configs(void)
{
    model_config_t c;
    strata_errbuf_t eb;
    int rc = s_parse(&c, MIXTRAL, &eb);
    T_CHECK(rc == 0, "mixtral: %s", eb.msg);
    T_CHECK(c.arch == ARCH_MIXTRAL && !strcmp(c.arch_name, "MixtralForCausalLM"), "mixtral arch");
    T_CHECK(c.vocab == 32000 && c.hidden == 4096 && c.n_layers == 32 && c.n_heads == 32 && c.n_kv_heads == 8 &&
                c.head_dim == 128 && c.max_pos == 32768,
            "mixtral sizes");
    T_CHECK(c.n_experts == 8 && c.top_k == 2 && c.norm_topk && c.moe_inter == 14336 && c.shared_inter == 0 &&
                c.dense_inter == 0,
            "mixtral moe");
    T_CHECK(c.layer_sparse[0] && c.layer_sparse[31] && !c.layer_sparse[32], "mixtral sparse layers");
    T_CHECK(!c.qkv_bias && !c.o_bias && c.qk_norm == QK_NORM_NONE && !c.tie_embeddings, "mixtral attention");
    T_CHECK(c.bos_id == 1 && c.eos_id == 2 && fabsf(c.rms_eps - 1e-5f) < 1e-12f, "mixtral ids/eps");
    s_check_default_rope(&c, 1e6);

    rc = s_parse(&c, QWEN2, &eb);
    T_CHECK(rc == 0, "qwen2: %s", eb.msg);
    T_CHECK(c.arch == ARCH_QWEN2_MOE && c.n_experts == 60 && c.top_k == 4 && !c.norm_topk && c.moe_inter == 1408 &&
                c.shared_inter == 5632 && c.dense_inter == 5632,
            "qwen2 moe");
    T_CHECK(c.qkv_bias && !c.o_bias && c.qk_norm == QK_NORM_NONE && c.head_dim == 128, "qwen2 attention");
    T_CHECK(c.layer_sparse[0] && c.layer_sparse[23], "qwen2 sparse");
    T_CHECK(c.bos_id == 151643 && c.eos_id == 151643, "qwen2 ids");
    s_check_default_rope(&c, 1e6);

    rc = s_parse(&c, QWEN3, &eb);
    T_CHECK(rc == 0, "qwen3: %s", eb.msg);
    T_CHECK(c.arch == ARCH_QWEN3_MOE && c.head_dim == 128 && c.n_heads == 32 && c.n_kv_heads == 4 &&
                c.hidden == 2048,
            "qwen3 head_dim independent of hidden/heads");
    T_CHECK(c.n_experts == 128 && c.top_k == 8 && c.norm_topk && c.moe_inter == 768 && c.qk_norm == QK_NORM_HEAD &&
                !c.qkv_bias,
            "qwen3 moe");
    T_CHECK(c.eos_id == 151645 && c.n_layers == 48 && c.layer_sparse[47], "qwen3 misc");
    s_check_default_rope(&c, 1e6);

    rc = s_parse(&c, OLMOE, &eb);
    T_CHECK(rc == 0, "olmoe: %s", eb.msg);
    T_CHECK(c.arch == ARCH_OLMOE && c.n_experts == 64 && c.top_k == 8 && !c.norm_topk && c.moe_inter == 1024 &&
                c.qk_norm == QK_NORM_FULL && c.head_dim == 128,
            "olmoe");
    T_CHECK(c.bos_id == -1 && c.eos_id == 50279 && c.layer_sparse[15], "olmoe ids");
    s_check_default_rope(&c, 1e4);

    /* model_config_load from a file (in a folder of its own: a generation_config.json beside it
     * would be read too) */
    char dir[] = "/tmp/strata-test-cfg-XXXXXX", path[256];
    T_CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    snprintf(path, sizeof path, "%s/cfg.json", dir);
    FILE *f = fopen(path, "w");
    fputs(OLMOE, f);
    fclose(f);
    model_config_t d;
    rc = model_config_load(&d, path, &eb);
    T_CHECK(rc == 0 && d.arch == ARCH_OLMOE && d.vocab == 50304, "load from file: %s", eb.msg);
    unlink(path);
    rc = model_config_load(&d, path, &eb);
    T_CHECK(rc < 0 && strstr(eb.msg, path), "missing file: %s", eb.msg);
    rmdir(dir);
}

/* The same configs as transformers 5.x writes them: rope_parameters, dtype, layer_types. */
static void test_v5_layout(void)
{
    model_config_t c;
    char *a = s_with(MIXTRAL, "rope_theta", "");
    char *b = s_with(a, "rope_parameters", "{\"rope_type\":\"default\",\"rope_theta\":1000000.0}");
    char *d = s_with(b, "torch_dtype", "");
    char *e = s_with(d, "dtype", "\"bfloat16\"");
    char *g = s_with(e, "head_dim", "128");
    s_accepted("mixtral 5.x", g, "transformers_version", "\"5.0.0\"", &c);
    s_check_default_rope(&c, 1e6);
    /* no rope_theta anywhere: the class default (Mixtral 1e6, others 1e4) */
    s_accepted("mixtral default theta", a, "rope_scaling", "null", &c);
    s_check_default_rope(&c, 1e6);
    char *q = s_with(QWEN2, "rope_theta", "");
    s_accepted("qwen2 default theta", q, "layer_types", "", &c);
    s_check_default_rope(&c, 1e4);
    /* dict rope_theta wins over the top-level one */
    s_accepted("dict theta wins", MIXTRAL, "rope_parameters", "{\"rope_type\":\"default\",\"rope_theta\":5000.0}", &c);
    s_check_default_rope(&c, 5000);
    /* per layer type */
    s_accepted("nested rope_parameters", MIXTRAL, "rope_parameters",
               "{\"full_attention\":{\"rope_type\":\"default\",\"rope_theta\":20000.0}}", &c);
    s_check_default_rope(&c, 20000);
    s_refused("nested sliding", MIXTRAL, "rope_parameters",
              "{\"full_attention\":{\"rope_type\":\"default\"},\"sliding_attention\":{\"rope_type\":\"default\"}}",
              "rope_parameters.sliding_attention");
    char *l = s_with(QWEN2, "layer_types", "[" "\"full_attention\",\"full_attention\",\"full_attention\","
                     "\"full_attention\",\"full_attention\",\"full_attention\",\"full_attention\","
                     "\"full_attention\",\"full_attention\",\"full_attention\",\"full_attention\","
                     "\"full_attention\",\"full_attention\",\"full_attention\",\"full_attention\","
                     "\"full_attention\",\"full_attention\",\"full_attention\",\"full_attention\","
                     "\"full_attention\",\"full_attention\",\"full_attention\",\"full_attention\","
                     "\"full_attention\"]");
    s_accepted("qwen2 5.x layer_types and qkv_bias", l, "qkv_bias", "false", &c);
    T_CHECK(!c.qkv_bias, "qkv_bias false honoured");
    s_refused("sliding layer type", l, "num_hidden_layers", "23", "layer_types");
    json_t *o = json_loads(l, 0, NULL);
    json_array_set_new(json_object_get(o, "layer_types"), 3, json_string("sliding_attention"));
    char *ls = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    s_refused("sliding layer type", ls, "use_cache", "true", "layer_types[3]");
    /* 5.x attribute_map spellings */
    s_accepted("qwen3 num_local_experts", QWEN3, "num_local_experts", "128", &c);
    s_refused("qwen3 expert counts disagree", QWEN3, "num_local_experts", "64", "num_local_experts");
    char *m2 = s_with(MIXTRAL, "num_local_experts", "");
    s_accepted("mixtral num_experts", m2, "num_experts", "4", &c);
    T_CHECK(c.n_experts == 4, "mixtral num_experts honoured: %d", c.n_experts);
    free(a), free(b), free(d), free(e), free(g), free(q), free(l), free(ls), free(m2);
}

/* ---- RoPE scaling against an independent transcription of transformers ------------------ */

static void s_ref_default(double *inv, int dim, double base)
{
    for (int i = 0; i < dim / 2; i++) inv[i] = 1.0 / pow(base, (double)(2 * i) / dim);
}

static void s_ref_yarn(double *inv, double *attn, int dim, double base, double factor, double orig, double bf,
                       double bs, bool truncate, double mscale, double mscale_all)
{
    double low = dim * log(orig / (bf * 2 * M_PI)) / (2 * log(base));
    double high = dim * log(orig / (bs * 2 * M_PI)) / (2 * log(base));
    if (truncate) low = floor(low), high = ceil(high);
    low = fmax(low, 0), high = fmin(high, dim - 1);
    if (low == high) high += 0.001;
    for (int i = 0; i < dim / 2; i++) {
        double pf = pow(base, (double)(2 * i) / dim);
        double ramp = fmin(fmax((i - low) / (high - low), 0), 1);
        double ef = 1 - ramp;
        inv[i] = 1 / (factor * pf) * (1 - ef) + 1 / pf * ef;
    }
    if (mscale != 0 && mscale_all != 0)
        *attn = (0.1 * mscale * log(factor) + 1) / (0.1 * mscale_all * log(factor) + 1);
    else
        *attn = factor <= 1 ? 1 : 0.1 * log(factor) + 1;
}

static void s_ref_llama3(double *inv, int dim, double base, double factor, double lf, double hf, double old)
{
    s_ref_default(inv, dim, base);
    for (int i = 0; i < dim / 2; i++) {
        double wl = 2 * M_PI / inv[i];
        if (wl < old / hf) continue;
        if (wl > old / lf) {
            inv[i] /= factor;
            continue;
        }
        double s = (old / wl - lf) / (hf - lf);
        inv[i] = (1 - s) * inv[i] / factor + s * inv[i];
    }
}

static double s_relerr(const float *got, const double *want, int n)
{
    double w = 0;
    for (int i = 0; i < n; i++) w = fmax(w, fabs(got[i] - want[i]) / fabs(want[i]));
    return w;
}

static void test_rope(void)
{
    model_config_t c;
    double ref[512], attn;
    /* linear */
    s_accepted("linear", QWEN3, "rope_scaling", "{\"rope_type\":\"linear\",\"factor\":4.0}", &c);
    s_ref_default(ref, 128, 1e6);
    for (int i = 0; i < 64; i++) ref[i] /= 4;
    T_CHECK(s_relerr(c.inv_freq, ref, 64) < 1e-6 && c.attn_factor == 1.0f, "linear inv_freq");
    s_accepted("legacy type key", QWEN3, "rope_scaling", "{\"type\":\"linear\",\"factor\":2}", &c);
    T_CHECK(fabs(c.inv_freq[1] / (1.0 / pow(1e6, 2.0 / 128) / 2) - 1) < 1e-6, "legacy type linear");
    s_refused("linear without factor", QWEN3, "rope_scaling", "{\"rope_type\":\"linear\"}", "rope_scaling.factor");
    s_refused("type disagrees", QWEN3, "rope_scaling", "{\"rope_type\":\"linear\",\"type\":\"yarn\",\"factor\":2}",
              "rope_scaling.rope_type");

    /* yarn without original_max_position_embeddings: it defaults to max_position_embeddings */
    s_accepted("yarn", QWEN3, "rope_scaling", "{\"rope_type\":\"yarn\",\"factor\":4.0}", &c);
    s_ref_yarn(ref, &attn, 128, 1e6, 4.0, 40960, 32, 1, true, 0, 0);
    T_CHECK(s_relerr(c.inv_freq, ref, 64) < 2e-6, "yarn inv_freq rel err %g", s_relerr(c.inv_freq, ref, 64));
    T_CHECK(fabs(c.attn_factor - attn) < 1e-6, "yarn attn_factor %g want %g", c.attn_factor, attn);
    /* yarn, consistent original_max_position_embeddings, betas, no truncation (5.x layout) */
    char *q = s_with(QWEN3, "max_position_embeddings", "131072");
    s_accepted("yarn consistent", q, "rope_parameters",
               "{\"rope_type\":\"yarn\",\"rope_theta\":1000000.0,\"factor\":4.0,"
               "\"original_max_position_embeddings\":32768,\"beta_fast\":16,\"beta_slow\":2,\"truncate\":false}", &c);
    s_ref_yarn(ref, &attn, 128, 1e6, 4.0, 32768, 16, 2, false, 0, 0);
    T_CHECK(s_relerr(c.inv_freq, ref, 64) < 2e-6, "yarn (betas) rel err %g", s_relerr(c.inv_freq, ref, 64));
    T_CHECK(fabs(c.attn_factor - attn) < 1e-6, "yarn (betas) attn %g want %g", c.attn_factor, attn);
    s_accepted("yarn mscale", q, "rope_scaling",
               "{\"rope_type\":\"yarn\",\"factor\":4.0,\"mscale\":0.707,\"mscale_all_dim\":1.0}", &c);
    s_ref_yarn(ref, &attn, 128, 1e6, 4.0, 131072, 32, 1, true, 0.707, 1.0);
    T_CHECK(fabs(c.attn_factor - attn) < 1e-6, "yarn mscale attn %g want %g", c.attn_factor, attn);
    s_accepted("yarn attention_factor", q, "rope_scaling",
               "{\"rope_type\":\"yarn\",\"factor\":4.0,\"attention_factor\":1.5}", &c);
    T_CHECK(c.attn_factor == 1.5f, "explicit attention_factor %g", c.attn_factor);
    /* factor disagreeing with max_position_embeddings / original: 4.x and 5.x differ */
    s_refused("yarn ambiguous", QWEN3, "rope_scaling",
              "{\"rope_type\":\"yarn\",\"factor\":4.0,\"original_max_position_embeddings\":32768}",
              "rope_scaling.factor");
    s_refused("yarn unknown key", QWEN3, "rope_scaling", "{\"rope_type\":\"yarn\",\"factor\":4.0,\"bogus\":1}",
              "rope_scaling.bogus");
    s_refused("yarn factor < 1", QWEN3, "rope_scaling", "{\"rope_type\":\"yarn\",\"factor\":0.5}",
              "rope_scaling.factor");

    /* llama3 */
    s_accepted("llama3", q, "rope_scaling",
               "{\"rope_type\":\"llama3\",\"factor\":8.0,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
               "\"original_max_position_embeddings\":8192}", &c);
    s_ref_llama3(ref, 128, 1e6, 8.0, 1.0, 4.0, 8192);
    T_CHECK(s_relerr(c.inv_freq, ref, 64) < 2e-6, "llama3 rel err %g", s_relerr(c.inv_freq, ref, 64));
    T_CHECK(c.attn_factor == 1.0f, "llama3 attn_factor");
    bool scaled = false, kept = false;
    for (int i = 0; i < 64; i++) {
        double d = 1.0 / pow(1e6, 2.0 * i / 128);
        scaled |= fabs(c.inv_freq[i] - d / 8) < 1e-9 * d;
        kept |= fabs(c.inv_freq[i] - d) < 1e-9 * d;
    }
    T_CHECK(scaled && kept, "llama3 both regimes present");
    s_refused("llama3 missing key", q, "rope_scaling", "{\"rope_type\":\"llama3\",\"factor\":8.0}",
              "rope_scaling.low_freq_factor");

    s_refused("dynamic", QWEN3, "rope_scaling", "{\"rope_type\":\"dynamic\",\"factor\":2.0}", "rope_scaling.rope_type");
    s_refused("longrope", QWEN3, "rope_scaling", "{\"rope_type\":\"longrope\",\"factor\":2.0}",
              "rope_scaling.rope_type");
    s_refused("mrope", QWEN3, "rope_parameters", "{\"rope_type\":\"mrope\"}", "rope_parameters.rope_type");
    s_refused("rope dict not object", QWEN3, "rope_scaling", "4", "rope_scaling");
    char *rs = s_with(QWEN3, "rope_scaling", "{\"rope_type\":\"linear\",\"factor\":2}");
    s_refused("both layouts", rs, "rope_parameters", "{\"rope_type\":\"default\"}", "rope_scaling");
    s_accepted("rope_parameters null", rs, "rope_parameters", "null", NULL);
    free(rs);
    s_refused("default with factor", QWEN3, "rope_scaling", "{\"rope_type\":\"default\",\"factor\":2}",
              "rope_scaling.factor");
    s_refused("partial rotary", QWEN3, "partial_rotary_factor", "0.5", "partial_rotary_factor");
    s_accepted("partial rotary 1", QWEN3, "partial_rotary_factor", "1.0", &c);
    s_refused("partial rotary in dict", QWEN3, "rope_parameters",
              "{\"rope_type\":\"default\",\"partial_rotary_factor\":0.25}", "partial_rotary_factor");
    s_refused("theta zero", QWEN3, "rope_theta", "0", "rope_theta");
    s_refused("theta negative", QWEN3, "rope_theta", "-10000.0", "rope_theta");
    s_accepted("integer theta", QWEN3, "rope_theta", "10000", &c);
    s_check_default_rope(&c, 1e4);
    free(q);
}

static void test_sparse_rule(void)
{
    model_config_t c;
    char *a = s_with(QWEN2, "num_hidden_layers", "6");
    char *b = s_with(a, "decoder_sparse_step", "2");
    s_accepted("sparse step", b, "mlp_only_layers", "[0, 3]", &c);
    /* sparse iff not in mlp_only_layers and (i + 1) % step == 0: layers 1 and 5 */
    bool want[6] = {false, true, false, false, false, true};
    for (int i = 0; i < 6; i++) T_CHECK(c.layer_sparse[i] == want[i], "layer %d sparse %d", i, c.layer_sparse[i]);
    T_CHECK(c.dense_inter == 5632 && c.moe_inter == 1408, "dense/moe inter");
    char *d = s_with(b, "decoder_sparse_step", "3");
    s_accepted("sparse step 3", d, "mlp_only_layers", "[]", &c);
    for (int i = 0; i < 6; i++) T_CHECK(c.layer_sparse[i] == ((i + 1) % 3 == 0), "step 3 layer %d", i);
    s_accepted("no experts: all dense", QWEN3, "num_experts", "0", &c);
    for (int i = 0; i < 48; i++) T_CHECK(!c.layer_sparse[i], "layer %d should be dense", i);
    s_refused("step 0", QWEN2, "decoder_sparse_step", "0", "decoder_sparse_step");
    s_refused("mlp_only out of range", QWEN2, "mlp_only_layers", "[24]", "mlp_only_layers[0]");
    s_refused("mlp_only not list", QWEN2, "mlp_only_layers", "3", "mlp_only_layers");
    s_accepted("qwen2 no shared expert", QWEN2, "shared_expert_intermediate_size", "0", &c);
    T_CHECK(c.shared_inter == 0, "shared 0");
    free(a), free(b), free(d);
}

static void test_refusals(void)
{
    model_config_t c;
    s_refused("unknown field", MIXTRAL, "fancy_new_thing", "1", "fancy_new_thing");
    setenv("STRATA_ALLOW_UNKNOWN_CONFIG", "1", 1);
    s_accepted("unknown field allowed", MIXTRAL, "fancy_new_thing", "1", NULL);
    unsetenv("STRATA_ALLOW_UNKNOWN_CONFIG");
    s_refused("field of another arch", MIXTRAL, "attention_bias", "false", "attention_bias");
    s_refused("norm_topk_prob on mixtral", MIXTRAL, "norm_topk_prob", "false", "norm_topk_prob");
    s_refused("unknown arch", MIXTRAL, "architectures", "[\"LlamaForCausalLM\"]", "architectures");
    s_refused("several archs", MIXTRAL, "architectures", "[\"MixtralForCausalLM\",\"OlmoeForCausalLM\"]",
              "architectures");
    s_refused("model_type mismatch", MIXTRAL, "model_type", "\"olmoe\"", "model_type");
    char *na = s_with(OLMOE, "architectures", "");
    s_accepted("model_type only", na, "use_cache", "true", &c);
    T_CHECK(c.arch == ARCH_OLMOE, "arch from model_type");
    s_refused("neither", na, "model_type", "", "architectures");
    s_refused("gelu", MIXTRAL, "hidden_act", "\"gelu\"", "hidden_act");
    s_refused("sliding window", MIXTRAL, "sliding_window", "4096", "sliding_window");
    s_accepted("sliding window >= context", MIXTRAL, "sliding_window", "32768", NULL);
    s_accepted("qwen2 window >= context", QWEN2, "use_sliding_window", "true", NULL);
    char *q2 = s_with(QWEN2, "sliding_window", "4096");
    s_accepted("qwen2 window off", q2, "use_sliding_window", "false", NULL);
    s_refused("qwen2 window on", q2, "use_sliding_window", "true", "sliding_window");
    s_accepted("qwen3 null window", QWEN3, "use_sliding_window", "true", NULL);
    free(q2);
    char *q3 = s_with(QWEN3, "sliding_window", "4096");
    s_accepted("qwen3 window without use_sliding_window", q3, "use_sliding_window", "false", NULL);
    s_refused("qwen3 window used", q3, "use_sliding_window", "true", "sliding_window");
    s_refused("clip_qkv", OLMOE, "clip_qkv", "8.0", "clip_qkv");
    s_refused("quantized", MIXTRAL, "quantization_config", "{\"quant_method\":\"awq\"}", "quantization_config");
    s_refused("encoder-decoder", MIXTRAL, "is_encoder_decoder", "true", "is_encoder_decoder");
    s_refused("pruned heads", MIXTRAL, "pruned_heads", "{\"0\":[1]}", "pruned_heads");
    s_accepted("no pruned heads", MIXTRAL, "pruned_heads", "{}", NULL);
    s_accepted("auto_map warns", MIXTRAL, "auto_map", "{\"AutoConfig\":\"x.y\"}", NULL);

    /* absurd values */
    s_refused("zero heads", MIXTRAL, "num_attention_heads", "0", "num_attention_heads");
    s_refused("negative heads", MIXTRAL, "num_attention_heads", "-4", "num_attention_heads");
    s_refused("heads do not divide hidden", MIXTRAL, "hidden_size", "4097", "num_attention_heads");
    s_refused("vocab 2^40", MIXTRAL, "vocab_size", "1099511627776", "vocab_size");
    s_refused("zero vocab", MIXTRAL, "vocab_size", "0", "vocab_size");
    s_refused("negative hidden", MIXTRAL, "hidden_size", "-4096", "hidden_size");
    s_refused("real hidden", MIXTRAL, "hidden_size", "4096.0", "hidden_size");
    s_refused("string hidden", MIXTRAL, "hidden_size", "\"4096\"", "hidden_size");
    s_refused("null hidden", MIXTRAL, "hidden_size", "null", "hidden_size");
    s_refused("negative inter", MIXTRAL, "intermediate_size", "-1", "intermediate_size");
    s_refused("too many layers", MIXTRAL, "num_hidden_layers", "300", "num_hidden_layers");
    s_refused("zero layers", MIXTRAL, "num_hidden_layers", "0", "num_hidden_layers");
    s_refused("kv heads do not divide", MIXTRAL, "num_key_value_heads", "3", "num_key_value_heads");
    s_refused("kv heads > heads", MIXTRAL, "num_key_value_heads", "64", "num_key_value_heads");
    s_accepted("kv heads null = MHA", MIXTRAL, "num_key_value_heads", "null", &c);
    T_CHECK(c.n_kv_heads == 32, "null kv heads: %d", c.n_kv_heads);
    s_refused("kv heads null on qwen2", QWEN2, "num_key_value_heads", "null", "num_key_value_heads");
    s_refused("top_k > experts", MIXTRAL, "num_experts_per_tok", "9", "num_experts_per_tok");
    s_refused("top_k 0", MIXTRAL, "num_experts_per_tok", "0", "num_experts_per_tok");
    s_refused("experts 0 on mixtral", MIXTRAL, "num_local_experts", "0", "num_local_experts");
    s_refused("experts huge", OLMOE, "num_experts", "100000", "num_experts");
    s_refused("experts disagree", MIXTRAL, "num_experts", "4", "num_experts");
    s_refused("eps 0", MIXTRAL, "rms_norm_eps", "0", "rms_norm_eps");
    s_refused("eps negative", MIXTRAL, "rms_norm_eps", "-1e-5", "rms_norm_eps");
    s_refused("max_pos 0", MIXTRAL, "max_position_embeddings", "0", "max_position_embeddings");
    s_refused("tie not bool", MIXTRAL, "tie_word_embeddings", "\"yes\"", "tie_word_embeddings");
    s_refused("bos negative", MIXTRAL, "bos_token_id", "-1", "bos_token_id");
    s_refused("eos empty list", MIXTRAL, "eos_token_id", "[]", "eos_token_id");
    s_accepted("bos null", MIXTRAL, "bos_token_id", "null", &c);
    T_CHECK(c.bos_id == -1, "bos null: %d", c.bos_id);
    s_refused("pad not int", MIXTRAL, "pad_token_id", "\"x\"", "pad_token_id");
    s_refused("head_dim odd", QWEN3, "head_dim", "127", "head_dim");
    s_refused("head_dim huge", QWEN3, "head_dim", "4096", "head_dim");
    s_refused("head_dim zero", QWEN3, "head_dim", "0", "head_dim");
    s_refused("head_dim on qwen2 differs", QWEN2, "head_dim", "64", "head_dim");
    s_accepted("head_dim on qwen2 equal", QWEN2, "head_dim", "128", NULL);
    s_refused("head_dim on olmoe differs", OLMOE, "head_dim", "64", "head_dim");
    char *h = s_with(QWEN3, "hidden_size", "2050"); /* not divisible, but head_dim is given */
    s_accepted("qwen3 head_dim given", h, "head_dim", "128", &c);
    T_CHECK(c.head_dim == 128 && c.hidden == 2050, "qwen3 odd hidden");
    s_refused("qwen3 without head_dim", h, "head_dim", "", "num_attention_heads");
    char *aw = s_with(QWEN3, "head_dim", "256");
    s_refused("attention width", aw, "num_attention_heads", "1024", "head_dim");
    free(aw);
    s_refused("jitter negative", MIXTRAL, "router_jitter_noise", "-1", "router_jitter_noise");
    s_accepted("jitter", MIXTRAL, "router_jitter_noise", "0.01", NULL);

    s_accepted("olmoe attention_bias", OLMOE, "attention_bias", "true", &c);
    T_CHECK(c.qkv_bias && c.o_bias, "olmoe attention_bias sets all four biases");
    s_accepted("qwen3 attention_bias", QWEN3, "attention_bias", "true", &c);
    T_CHECK(c.qkv_bias && c.o_bias, "qwen3 attention_bias");
    s_accepted("qwen2 norm_topk", QWEN2, "norm_topk_prob", "true", &c);
    T_CHECK(c.norm_topk, "qwen2 norm_topk true");
    s_accepted("tied", OLMOE, "tie_word_embeddings", "true", &c);
    T_CHECK(c.tie_embeddings, "tie honoured");

    strata_errbuf_t eb;
    T_CHECK(s_parse(&c, "{\"a\":", &eb) < 0 && strstr(eb.msg, "cfg.json: JSON"), "syntax: %s", eb.msg);
    T_CHECK(s_parse(&c, "[1]", &eb) < 0 && strstr(eb.msg, "cfg.json"), "array: %s", eb.msg);
    T_CHECK(s_parse(&c, "{\"vocab_size\":1,\"vocab_size\":2,\"model_type\":\"olmoe\"}", &eb) < 0 &&
                strstr(eb.msg, "duplicate"),
            "duplicate key: %s", eb.msg);
    T_CHECK(s_parse(&c, "", &eb) < 0, "empty text");
    free(na), free(q3), free(h);
}

/* c's stop set is exactly want[n] (in order), and eos_id its first or -1. */
static bool s_eos_is(const model_config_t *c, const int32_t *want, int32_t n)
{
    if (c->n_eos != n || c->eos_id != (n ? want[0] : -1)) return false;
    for (int32_t i = 0; i < n; i++)
        if (c->eos_ids[i] != want[i] || !model_is_eos(c, want[i])) return false;
    return true;
}

static void s_write(const char *dir, const char *name, const char *text)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    STRATA_ASSERT(f);
    fputs(text, f);
    fclose(f);
}

/* Applies generation_config.json text to MIXTRAL with eos_token_id cfg_eos; returns the rc. */
static int s_gen(const char *cfg_eos, const char *gen, model_config_t *c, strata_errbuf_t *eb)
{
    char *js = s_with(MIXTRAL, "eos_token_id", cfg_eos);
    int rc = s_parse(c, js, eb);
    free(js);
    STRATA_ASSERT(rc == 0);
    return model_config_apply_generation(c, gen, strlen(gen), "gen.json", eb);
}

/* The stop set (eos_token_id: an id or a list, of config.json, overridden by
 * generation_config.json's as transformers' generate() takes it), and the tokenizer's one eos
 * from the same files. */
static void test_eos_set(void)
{
    model_config_t c;
    strata_errbuf_t eb;
    static const int32_t i2[] = {2}, i72[] = {7, 2}, i7[] = {7}, i59[] = {5, 9}, i5[] = {5};
    /* config.json: an id, a list, absent (the class default), null */
    s_accepted("eos id", MIXTRAL, "eos_token_id", "2", &c);
    T_CHECK(s_eos_is(&c, i2, 1) && !model_is_eos(&c, 7), "eos id: %d ids, first %d", c.n_eos, c.eos_id);
    s_accepted("eos list", MIXTRAL, "eos_token_id", "[7, 2]", &c);
    T_CHECK(s_eos_is(&c, i72, 2), "eos list: both, in order: %d ids, first %d", c.n_eos, c.eos_id);
    s_accepted("eos absent", MIXTRAL, "eos_token_id", "", &c);
    T_CHECK(s_eos_is(&c, i2, 1), "eos absent: MixtralConfig's default 2");
    s_accepted("eos absent, no default", QWEN2, "eos_token_id", "", &c);
    T_CHECK(s_eos_is(&c, NULL, 0), "eos absent on qwen2: none");
    s_accepted("eos null", MIXTRAL, "eos_token_id", "null", &c);
    T_CHECK(s_eos_is(&c, NULL, 0) && !model_is_eos(&c, -1), "eos null: none");
    /* ids outside the vocabulary are dropped with a warning; repeats are dropped */
    s_accepted("eos out of vocab", MIXTRAL, "eos_token_id", "32000", &c);
    T_CHECK(s_eos_is(&c, NULL, 0), "eos out of vocab: none");
    s_accepted("eos list out of vocab", MIXTRAL, "eos_token_id", "[32000, 7, 99999, 2]", &c);
    T_CHECK(s_eos_is(&c, i72, 2), "eos list: out-of-vocab ids dropped: %d ids, first %d", c.n_eos, c.eos_id);
    s_accepted("eos list all out of vocab", MIXTRAL, "eos_token_id", "[32000, 40000]", &c);
    T_CHECK(s_eos_is(&c, NULL, 0), "eos list all out of vocab: none");
    s_accepted("eos list repeats", MIXTRAL, "eos_token_id", "[7, 7, 2, 7]", &c);
    T_CHECK(s_eos_is(&c, i72, 2), "eos list repeats dropped: %d ids", c.n_eos);
    /* at most MODEL_MAX_EOS listed */
    char list[256];
    int at = snprintf(list, sizeof list, "[");
    for (int i = 0; i < MODEL_MAX_EOS; i++) at += snprintf(list + at, sizeof list - (size_t)at, "%s%d", i ? "," : "", 100 + i);
    snprintf(list + at, sizeof list - (size_t)at, "]");
    s_accepted("eos 16 ids", MIXTRAL, "eos_token_id", list, &c);
    T_CHECK(c.n_eos == MODEL_MAX_EOS && c.eos_id == 100 && c.eos_ids[MODEL_MAX_EOS - 1] == 100 + MODEL_MAX_EOS - 1,
            "eos 16 ids: %d", c.n_eos);
    snprintf(list + at, sizeof list - (size_t)at, ",7]");
    s_refused("eos 17 ids", MIXTRAL, "eos_token_id", list, "at most 16");
    s_refused("eos list not ids", MIXTRAL, "eos_token_id", "[2, \"x\"]", "eos_token_id[1]");
    s_refused("eos list negative", MIXTRAL, "eos_token_id", "[2, -1]", "eos_token_id[1]");
    s_refused("eos string", MIXTRAL, "eos_token_id", "\"2\"", "eos_token_id");
    s_refused("eos float", MIXTRAL, "eos_token_id", "2.5", "eos_token_id");
    s_refused("eos nested list", MIXTRAL, "eos_token_id", "[[2]]", "eos_token_id[0]");

    /* generation_config.json: its eos_token_id replaces config.json's; absent or null leaves it */
    T_CHECK(s_gen("2", "{\"eos_token_id\":[5,9]}", &c, &eb) == 0 && s_eos_is(&c, i59, 2), "gen list wins: %s", eb.msg);
    T_CHECK(s_gen("[7, 2]", "{\"eos_token_id\":5,\"temperature\":0.6}", &c, &eb) == 0 && s_eos_is(&c, i5, 1),
            "gen id wins over a config list: %s", eb.msg);
    T_CHECK(s_gen("[7, 2]", "{\"bos_token_id\":1,\"do_sample\":true}", &c, &eb) == 0 && s_eos_is(&c, i72, 2),
            "gen without eos: config.json's stands: %s", eb.msg);
    T_CHECK(s_gen("7", "{\"eos_token_id\":null}", &c, &eb) == 0 && s_eos_is(&c, i7, 1), "gen null: config.json's");
    T_CHECK(s_gen("2", "{\"eos_token_id\":[32000,5,9,5]}", &c, &eb) == 0 && s_eos_is(&c, i59, 2),
            "gen list: out-of-vocab and repeated ids dropped");
    T_CHECK(s_gen("2", "{\"eos_token_id\":[40000]}", &c, &eb) == 0 && s_eos_is(&c, NULL, 0),
            "gen list of out-of-vocab ids only: none");
    snprintf(list + at, sizeof list - (size_t)at, ",7]");
    char gen[300];
    snprintf(gen, sizeof gen, "{\"eos_token_id\":%s}", list);
    T_CHECK(s_gen("[7, 2]", gen, &c, &eb) < 0 && strstr(eb.msg, "gen.json") && strstr(eb.msg, "eos_token_id") &&
                strstr(eb.msg, "at most 16") && s_eos_is(&c, i72, 2),
            "gen 17 ids: refused, set unchanged: %s", eb.msg);
    T_CHECK(s_gen("2", "{\"eos_token_id\":[5,\"x\"]}", &c, &eb) < 0 && strstr(eb.msg, "gen.json: eos_token_id[1]") &&
                s_eos_is(&c, i2, 1),
            "gen bad id: %s", eb.msg);
    T_CHECK(s_gen("2", "{\"eos_token_id\":[]}", &c, &eb) < 0 && strstr(eb.msg, "gen.json: eos_token_id"), "gen []: %s",
            eb.msg);
    T_CHECK(s_gen("2", "{\"eos_token_id\":", &c, &eb) < 0 && strstr(eb.msg, "gen.json: JSON"), "gen syntax: %s", eb.msg);
    T_CHECK(s_gen("2", "[5]", &c, &eb) < 0 && strstr(eb.msg, "gen.json"), "gen not an object: %s", eb.msg);
    T_CHECK(s_gen("2", "{\"eos_token_id\":5,\"eos_token_id\":9}", &c, &eb) < 0 && strstr(eb.msg, "duplicate"),
            "gen duplicate key: %s", eb.msg);

    /* a folder: model_config_load reads generation_config.json beside config.json; the
     * tokenizer takes its eos (one id) from the same files in the same order */
    char dir[] = "/tmp/strata-test-eos-XXXXXX", path[300];
    T_CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *js = s_with(MIXTRAL, "eos_token_id", "2");
    s_write(dir, "config.json", js);
    free(js);
    s_write(dir, "tokenizer.json",
            "{\"version\":\"1.0\",\"added_tokens\":[],\"normalizer\":null,\"pre_tokenizer\":null,"
            "\"post_processor\":null,\"decoder\":null,\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,"
            "\"c\":2,\"d\":3,\"e\":4,\"f\":5,\"g\":6,\"h\":7,\"i\":8,\"j\":9},\"merges\":[]}}");
    T_CHECK(model_config_load(&c, path, &eb) == 0 && s_eos_is(&c, i2, 1), "folder without generation config: %s", eb.msg);
    tok_t *tok = NULL;
    T_CHECK(tok_load(&tok, dir, &eb) == 0 && tok_eos(tok) == 2 && tok_bos(tok) == 1, "tokenizer: config.json's ids: %s",
            eb.msg);
    tok_free(tok);
    /* gpt-oss's shape: config.json one id, generation_config.json a list led by it */
    s_write(dir, "generation_config.json", "{\"bos_token_id\":8,\"eos_token_id\":[2,9,32001,5]}");
    static const int32_t i295[] = {2, 9, 5};
    T_CHECK(model_config_load(&c, path, &eb) == 0 && s_eos_is(&c, i295, 3), "folder: generation_config's list: %s",
            eb.msg);
    s_write(dir, "generation_config.json", "{\"eos_token_id\":[40,9,5]}");
    static const int32_t i4095[] = {40, 9, 5};
    T_CHECK(model_config_load(&c, path, &eb) == 0 && s_eos_is(&c, i4095, 3), "folder: generation_config overrides: %s",
            eb.msg);
    tok = NULL;
    T_CHECK(tok_load(&tok, dir, &eb) == 0 && tok_eos(tok) == 9 && tok_bos(tok) == 1,
            "tokenizer: generation_config.json's first id it knows (40 is past its 10 ids), bos from config.json: %d %d",
            tok ? tok_eos(tok) : -9, tok ? tok_bos(tok) : -9);
    tok_free(tok);
    s_write(dir, "generation_config.json", "{\"eos_token_id\":[9, -3]}");
    T_CHECK(model_config_load(&c, path, &eb) < 0 && strstr(eb.msg, "generation_config.json: eos_token_id[1]") &&
                c.n_eos == 0,
            "folder: a bad generation config is refused, naming it: %s", eb.msg);
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    rmdir(dir);
}

/* Random mutations: never crash; whatever is accepted is self-consistent. */
static void test_random(uint64_t seed)
{
    static const char *bases[4];
    bases[0] = MIXTRAL, bases[1] = QWEN2, bases[2] = QWEN3, bases[3] = OLMOE;
    static const char *vals[] = {"0", "-1", "1", "2", "3", "7", "128", "4096", "1e-5", "0.5", "true", "false",
                                 "null", "\"silu\"", "[]", "{}", "[1,2]", "65536", "2147483647", "9007199254740993",
                                 "{\"rope_type\":\"yarn\",\"factor\":2}", "{\"rope_type\":\"llama3\",\"factor\":8,"
                                 "\"low_freq_factor\":1,\"high_freq_factor\":4}", "[\"full_attention\"]"};
    static const char *keys[] = {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                 "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings",
                                 "rms_norm_eps", "rope_theta", "rope_scaling", "rope_parameters",
                                 "num_experts_per_tok", "num_experts", "num_local_experts", "moe_intermediate_size",
                                 "decoder_sparse_step", "mlp_only_layers", "eos_token_id", "bos_token_id",
                                 "sliding_window", "use_sliding_window", "tie_word_embeddings", "layer_types",
                                 "shared_expert_intermediate_size", "norm_topk_prob", "partial_rotary_factor"};
    int accepted = 0;
    for (int it = 0; it < 3000; it++) {
        char *js = strdup(bases[t_rng_next(&seed) % 4]);
        int nm = 1 + (int)(t_rng_next(&seed) % 3);
        for (int k = 0; k < nm; k++) {
            const char *key = keys[t_rng_next(&seed) % (sizeof keys / sizeof keys[0])];
            const char *val = t_rng_next(&seed) % 5 == 0 ? "" : vals[t_rng_next(&seed) % (sizeof vals / sizeof vals[0])];
            char *n = s_with(js, key, val);
            free(js);
            js = n;
        }
        model_config_t c;
        strata_errbuf_t eb;
        if (s_parse(&c, js, &eb) == 0) {
            accepted++;
            bool ok = c.vocab > 0 && c.hidden > 0 && c.n_layers > 0 && c.n_layers <= 256 && c.n_heads > 0 &&
                      c.n_kv_heads > 0 && c.n_heads % c.n_kv_heads == 0 && c.head_dim > 0 && c.head_dim % 2 == 0 &&
                      c.head_dim <= 1024 && c.rot_dim == c.head_dim && c.top_k <= c.n_experts &&
                      (c.n_experts == 0 || c.top_k >= 1) && c.rms_eps > 0 && c.max_pos > 0 &&
                      isfinite(c.attn_factor) && c.attn_factor > 0 && c.eos_id < c.vocab && c.bos_id < c.vocab &&
                      c.n_eos >= 0 && c.n_eos <= MODEL_MAX_EOS && c.eos_id == (c.n_eos ? c.eos_ids[0] : -1);
            for (int i = 0; ok && i < c.n_eos; i++) {
                ok = c.eos_ids[i] >= 0 && c.eos_ids[i] < c.vocab;
                for (int k = 0; ok && k < i; k++) ok = c.eos_ids[k] != c.eos_ids[i];
            }
            for (int i = 0; ok && i < c.rot_dim / 2; i++) ok = isfinite(c.inv_freq[i]) && c.inv_freq[i] > 0;
            T_CHECK(ok, "inconsistent config accepted: %s", js);
        } else {
            T_CHECK(strstr(eb.msg, "cfg.json") != NULL, "message lacks the file: %s", eb.msg);
        }
        free(js);
    }
    T_CHECK(accepted > 100, "only %d random mutations accepted", accepted);
}

int main(void)
{
    uint64_t seed = t_seed();
    log_set_level(LOG_ERROR); /* the auto_map and out-of-vocab eos warnings are expected */
    test_real_configs();
    test_v5_layout();
    test_rope();
    test_sparse_rule();
    test_refusals();
    test_eos_set();
    test_random(seed);
    return t_done("test_model_config");
}
