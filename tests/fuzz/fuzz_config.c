/* fuzz_config.c - libFuzzer target for the HF config.json parser (model/config.c). Whatever
 * parses must be a self-consistent model_config_t; every refusal carries a message. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    log_set_level(LOG_ERROR); /* warnings (eos lists, auto_map) are expected */
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 1 << 16) return 0;
    model_config_t c;
    strata_errbuf_t eb = {{0}};
    int rc = model_config_parse(&c, (const char *)data, size, "fuzz.json", &eb);
    if (rc < 0) {
        if (!eb.msg[0] || !strstr(eb.msg, "fuzz.json")) abort();
        return 0;
    }
    if (c.vocab <= 0 || c.hidden <= 0 || c.n_layers <= 0 || c.n_layers > 256) abort();
    if (c.n_heads <= 0 || c.n_kv_heads <= 0 || c.n_heads % c.n_kv_heads) abort();
    if (c.head_dim <= 0 || c.head_dim % 2 || c.head_dim > 1024 || c.rot_dim != c.head_dim) abort();
    if (c.n_experts < 0 || c.top_k < 0 || c.top_k > c.n_experts || (c.n_experts && c.top_k < 1)) abort();
    if (!(c.rms_eps > 0) || c.max_pos <= 0 || c.moe_inter <= 0) abort();
    if (c.eos_id >= c.vocab || c.bos_id >= c.vocab || c.eos_id < -1 || c.bos_id < -1) abort();
    if (!isfinite(c.attn_factor) || !(c.attn_factor > 0) || !(c.rope_theta > 1)) abort();
    for (int i = 0; i < c.rot_dim / 2; i++)
        if (!isfinite(c.inv_freq[i]) || !(c.inv_freq[i] > 0)) abort();
    for (int i = 0; i < c.n_layers; i++)
        if (!c.layer_sparse[i] && c.dense_inter <= 0) abort();
    for (int i = c.n_layers; i < 256; i++)
        if (c.layer_sparse[i]) abort();
    if (c.arch_name[sizeof c.arch_name - 1]) abort();
    /* gpt-oss's fields: a window only on the layers that have one, MXFP4 only for gpt-oss */
    if (c.sliding_window < 0 || (c.sliding_window > 0 && c.sliding_window >= c.max_pos)) abort();
    for (int i = 0; i < 256; i++) {
        if (c.layer_sliding[i] && (i >= c.n_layers || c.sliding_window <= 0)) abort();
        if (c.experts_mxfp4[i] && (i >= c.n_layers || c.arch != ARCH_GPT_OSS)) abort();
    }
    if (c.ffn_act == FFN_ACT_GPT_OSS && !(c.act_limit > 0 && c.act_alpha > 0)) abort();
    if ((c.attn_sinks || c.router_bias || c.expert_bias) && c.arch != ARCH_GPT_OSS) abort();
    return 0;
}
