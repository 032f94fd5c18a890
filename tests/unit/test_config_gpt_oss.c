/* test_config_gpt_oss.c - GptOssForCausalLM's config.json as the checkpoints ship it (gpt-oss-20b
 * and -120b), and its variants, through model_config_parse: what each field means here is what
 * it means to transformers 5.x's GptOssConfig, GptOssAttention and the MXFP4 quantizer. */
#include <string.h>

#include "model/model.h"
#include "tests/unit/check.h"

/* gpt-oss-20b's config.json without the fields the cases vary (%s: those fields). */
static const char *const CFG =
    "{\"architectures\": [\"GptOssForCausalLM\"], \"model_type\": \"gpt_oss\", \"attention_bias\": true,"
    " \"attention_dropout\": 0.0, \"head_dim\": 64,"
    " \"hidden_act\": \"silu\", \"hidden_size\": 2880, \"initial_context_length\": 4096,"
    " \"initializer_range\": 0.02, \"intermediate_size\": 2880, \"max_position_embeddings\": 131072,"
    " \"num_attention_heads\": 64, \"num_experts_per_tok\": 4, \"num_hidden_layers\": 24,"
    " \"num_key_value_heads\": 8, \"num_local_experts\": 32, \"output_router_logits\": false,"
    " \"pad_token_id\": 199999, \"rms_norm_eps\": 1e-05, \"router_aux_loss_coef\": 0.9,"
    " \"tie_word_embeddings\": false, \"transformers_version\": \"4.55.0.dev0\", \"use_cache\": true,"
    " \"vocab_size\": 201088 %s}";

static const char *const SHIPPED =
    ", \"eos_token_id\": 200002, \"experts_per_token\": 4, \"swiglu_limit\": 7.0,"
    " \"sliding_window\": 128, \"rope_theta\": 150000, \"rope_scaling\": {\"beta_fast\": 32.0, \"beta_slow\": 1.0,"
    " \"factor\": 32.0, \"original_max_position_embeddings\": 4096, \"rope_type\": \"yarn\", \"truncate\": false},"
    " \"quantization_config\": {\"modules_to_not_convert\": [\"model.layers.*.self_attn\","
    " \"model.layers.*.mlp.router\", \"model.embed_tokens\", \"lm_head\"], \"quant_method\": \"mxfp4\"}";

static int s_parse(const char *extra, model_config_t *c, strata_errbuf_t *eb)
{
    char buf[8192];
    snprintf(buf, sizeof buf, CFG, extra);
    memset(eb, 0, sizeof *eb);
    return model_config_parse(c, buf, strlen(buf), "gpt-oss.json", eb);
}

/* Replace the first `from` in buf (capacity 8192) by `to`. */
static void s_replace(char *buf, const char *from, const char *to)
{
    char *p = strstr(buf, from);
    STRATA_ASSERT(p && strlen(buf) - strlen(from) + strlen(to) < 8192);
    memmove(p + strlen(to), p + strlen(from), strlen(p + strlen(from)) + 1);
    memcpy(p, to, strlen(to));
}

static void s_refused(const char *extra, const char *want, const char *what)
{
    model_config_t c;
    strata_errbuf_t eb;
    int rc = s_parse(extra, &c, &eb);
    T_CHECK(rc < 0, "%s: accepted", what);
    T_CHECK(strstr(eb.msg, "gpt-oss.json") && strstr(eb.msg, want), "%s: message lacks '%s': %s", what, want, eb.msg);
}

int main(void)
{
    log_set_level(LOG_ERROR);
    model_config_t c;
    strata_errbuf_t eb;

    /* as shipped: MXFP4 experts on every layer, windows on the even layers */
    int rc = s_parse(SHIPPED, &c, &eb);
    T_CHECK(rc == 0, "shipped config: %s", eb.msg);
    T_CHECK(c.arch == ARCH_GPT_OSS && c.n_layers == 24 && c.n_experts == 32 && c.top_k == 4 && c.moe_inter == 2880,
            "sizes");
    T_CHECK(c.head_dim == 64 && c.n_heads == 64 && c.n_kv_heads == 8 && c.qkv_bias && c.o_bias && c.attn_sinks,
            "attention");
    T_CHECK(c.router_bias && c.expert_bias && c.ffn_act == FFN_ACT_GPT_OSS && c.act_limit == 7.0f &&
                c.act_alpha == 1.702f && c.norm_topk,
            "MoE");
    T_CHECK(c.sliding_window == 128, "window %d", c.sliding_window);
    int slide = 0, mx = 0;
    for (int l = 0; l < 24; l++) {
        T_CHECK(c.layer_sliding[l] == (l % 2 == 0), "layer %d sliding %d", l, c.layer_sliding[l]);
        slide += c.layer_sliding[l];
        mx += c.experts_mxfp4[l];
        T_CHECK(c.layer_sparse[l], "layer %d sparse", l);
    }
    T_CHECK(slide == 12 && mx == 24, "%d sliding, %d mxfp4 layers", slide, mx);
    T_CHECK(c.eos_id == 200002 && c.bos_id == -1, "eos %d bos %d", c.eos_id, c.bos_id);
    /* YaRN: factor 32, attention factor 0.1 ln 32 + 1 */
    T_CHECK(fabsf(c.attn_factor - (float)(0.1 * log(32.0) + 1.0)) < 1e-6f, "attn_factor %g", c.attn_factor);
    T_CHECK(c.inv_freq[0] == 1.0f, "inv_freq[0] %g (extrapolated)", c.inv_freq[0]);
    T_CHECK(fabsf(c.inv_freq[31] - (float)(1.0 / (32.0 * pow(150000.0, 62.0 / 64)))) < 1e-12f, "inv_freq[31] %g",
            c.inv_freq[31]);

    /* GptOssConfig's defaults: no rope dict means the same YaRN, no layer_types the same pattern,
     * no sliding_window 128, no attention_bias true */
    model_config_t d;
    rc = s_parse("", &d, &eb);
    T_CHECK(rc == 0, "defaults: %s", eb.msg);
    T_CHECK(d.sliding_window == 128 && d.layer_sliding[0] && !d.layer_sliding[1] && d.qkv_bias && d.eos_id == -1,
            "default layers");
    T_CHECK(d.attn_factor == c.attn_factor && !memcmp(d.inv_freq, c.inv_freq, sizeof c.inv_freq), "default rope");
    for (int l = 0; l < 24; l++) T_CHECK(!d.experts_mxfp4[l], "no quantization_config: layer %d not mxfp4", l);

    /* layer_types listed; a null window means no window */
    char ex[4096];
    char lt[2048] = "[";
    for (int l = 0; l < 24; l++)
        strcat(lt, l == 3 ? "\"sliding_attention\"," : l == 23 ? "\"full_attention\"]" : "\"full_attention\",");
    snprintf(ex, sizeof ex, ", \"layer_types\": %s, \"sliding_window\": 16", lt);
    rc = s_parse(ex, &d, &eb);
    T_CHECK(rc == 0 && d.sliding_window == 16, "layer_types: %s", eb.msg);
    for (int l = 0; l < 24; l++) T_CHECK(d.layer_sliding[l] == (l == 3), "listed layer %d", l);
    rc = s_parse(", \"sliding_window\": null", &d, &eb);
    T_CHECK(rc == 0 && d.sliding_window == 0 && !d.layer_sliding[0], "null window: %s", eb.msg);
    rc = s_parse(", \"sliding_window\": 131072", &d, &eb);
    T_CHECK(rc == 0 && d.sliding_window == 0 && !d.layer_sliding[0], "window as long as the context: %s", eb.msg);

    /* modules_to_not_convert naming the experts keeps them unquantized, by transformers' matching */
    rc = s_parse(", \"quantization_config\": {\"quant_method\": \"mxfp4\", \"modules_to_not_convert\": "
                 "[\"model.layers.1.mlp.experts\", \"model.layers.2.mlp\", \"experts\", \"model.layers.1[0-9]\"]}",
                 &d, &eb);
    T_CHECK(rc == 0, "modules_to_not_convert: %s", eb.msg);
    /* "experts" ends every experts module's name: none is converted */
    for (int l = 0; l < 24; l++) T_CHECK(!d.experts_mxfp4[l], "suffix match: layer %d", l);
    rc = s_parse(", \"quantization_config\": {\"quant_method\": \"mxfp4\", \"modules_to_not_convert\": "
                 "[\"model.layers.1.mlp.experts\", \"model.layers.2.mlp\", \"model.layers.1[0-9]\"]}",
                 &d, &eb);
    T_CHECK(rc == 0, "modules_to_not_convert 2: %s", eb.msg);
    for (int l = 0; l < 24; l++) {
        bool keep = l == 2 || (l >= 10 && l <= 19) || l == 1;
        T_CHECK(d.experts_mxfp4[l] == !keep, "regex match: layer %d mxfp4 %d", l, d.experts_mxfp4[l]);
    }

    /* GptOssConfig: num_key_value_heads null means as many as the heads; head_dim absent means
     * hidden / heads; attention_bias false drops the q/k/v/o biases (router and expert biases stay) */
    {
        char cfg[8192];
        snprintf(cfg, sizeof cfg, CFG, "");
        s_replace(cfg, "\"num_key_value_heads\": 8", "\"num_key_value_heads\": null");
        s_replace(cfg, " \"head_dim\": 64,", "");
        s_replace(cfg, "\"attention_bias\": true", "\"attention_bias\": false");
        s_replace(cfg, "\"num_attention_heads\": 64", "\"num_attention_heads\": 32");
        rc = model_config_parse(&d, cfg, strlen(cfg), "gpt-oss.json", &eb);
        T_CHECK(rc == 0, "null kv heads, no head_dim, no attention bias: %s", eb.msg);
        T_CHECK(d.n_kv_heads == 32 && d.head_dim == 2880 / 32 && !d.qkv_bias && !d.o_bias && d.router_bias &&
                    d.expert_bias && d.attn_sinks,
                "kv %d head_dim %d bias %d/%d", d.n_kv_heads, d.head_dim, d.qkv_bias, d.o_bias);
    }

    /* what transformers ignores is accepted: swiglu_limit (hard-coded 7.0), experts_per_token */
    rc = s_parse(", \"swiglu_limit\": 5.0, \"experts_per_token\": 2", &d, &eb);
    T_CHECK(rc == 0 && d.act_limit == 7.0f && d.top_k == 4, "ignored fields: %s", eb.msg);
    /* an eos outside the vocabulary: transformers warns and runs */
    rc = s_parse(", \"eos_token_id\": 300000", &d, &eb);
    T_CHECK(rc == 0 && d.eos_id == -1, "eos out of vocab: rc %d eos %d %s", rc, d.eos_id, eb.msg);

    /* refused, naming the field */
    s_refused(", \"quantization_config\": {\"quant_method\": \"fp8\"}", "'fp8'", "fp8 checkpoint");
    s_refused(", \"quantization_config\": {\"quant_method\": \"mxfp4\", \"bits\": 4}", "quantization_config.bits",
              "unknown quantization field");
    s_refused(", \"quantization_config\": {\"quant_method\": \"mxfp4\", \"modules_to_not_convert\": [\"(\"]}",
              "modules_to_not_convert[0]", "bad pattern");
    s_refused(", \"quantization_config\": {\"quant_method\": \"mxfp4\", \"modules_to_not_convert\": \"lm_head\"}",
              "modules_to_not_convert", "patterns not a list");
    s_refused(", \"layer_types\": [\"full_attention\"]", "layer_types", "layer_types of the wrong length");
    snprintf(ex, sizeof ex, ", \"layer_types\": %s", lt);
    char *p = strstr(ex, "sliding_attention");
    memcpy(p, "chunked_attention", 17);
    s_refused(ex, "layer_types[3]", "unknown layer type");
    s_refused(", \"sliding_window\": 0", "sliding_window", "window 0");
    s_refused(", \"swiglu_limit\": -1", "swiglu_limit", "negative limit");

    /* MXFP4 is gpt-oss's: another architecture's mxfp4 config is refused */
    const char *mix = "{\"architectures\": [\"MixtralForCausalLM\"], \"quantization_config\": {\"quant_method\": "
                      "\"mxfp4\"}}";
    rc = model_config_parse(&d, mix, strlen(mix), "mix.json", &eb);
    T_CHECK(rc < 0 && strstr(eb.msg, "GptOssForCausalLM only"), "mxfp4 Mixtral: %s", eb.msg);

    fprintf(stderr, "test_config_gpt_oss: %d checks, %d failed\n", t_checks, t_failed);
    return t_failed ? 1 : 0;
}
