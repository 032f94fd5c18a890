/* fuzz_manifest.c - libFuzzer target for the packed manifest parser and validator
 * (model/packed.c: packed_manifest_parse + packed_manifest_check against a fixed small
 * Qwen2-MoE config with a shared expert, a dense layer and tied embeddings; the corpus holds a
 * manifest `strata pack` wrote for that config). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/packed.h"

static const char s_cfg[] =
    "{\"architectures\":[\"Qwen2MoeForCausalLM\"],\"model_type\":\"qwen2_moe\",\"vocab_size\":128,"
    "\"hidden_size\":64,\"intermediate_size\":96,\"moe_intermediate_size\":64,"
    "\"shared_expert_intermediate_size\":128,\"num_hidden_layers\":3,\"num_attention_heads\":4,"
    "\"num_key_value_heads\":2,\"hidden_act\":\"silu\",\"max_position_embeddings\":512,\"rms_norm_eps\":1e-6,"
    "\"num_experts\":4,\"num_experts_per_tok\":2,\"norm_topk_prob\":false,\"decoder_sparse_step\":1,"
    "\"mlp_only_layers\":[1],\"use_sliding_window\":false,\"tie_word_embeddings\":true,\"rope_theta\":10000.0}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static model_config_t cfg;
    static int have_cfg;
    strata_errbuf_t eb = {{0}};
    if (!have_cfg) {
        if (model_config_parse(&cfg, s_cfg, strlen(s_cfg), "fuzz-config.json", &eb) < 0) abort();
        have_cfg = 1;
    }
    if (size > 1 << 20) return 0;
    packed_manifest_t pm;
    int rc = packed_manifest_parse(&pm, (const char *)data, size, "fuzz-manifest.json", &eb);
    if (rc < 0) {
        if (!eb.msg[0] && rc != -12 /* ENOMEM */) abort(); /* every input error carries a message */
        return 0;
    }
    /* a parsed manifest is internally consistent */
    for (int32_t i = 0; i < pm.n_tensors; i++)
        if (pm.tensors[i].file < 0 || pm.tensors[i].file >= pm.n_files) abort();
    for (int32_t i = 0; i < pm.n_blocks; i++)
        if (pm.blocks[i].file < 0 || pm.blocks[i].file >= pm.n_files) abort();
    eb.msg[0] = 0;
    packed_slot_t *slots = NULL;
    int32_t n = 0;
    if (packed_slots(&cfg, NULL, &slots, &n) < 0) abort();
    int32_t *idx = malloc(((size_t)n + 1) * sizeof *idx);
    rc = packed_manifest_check(&pm, &cfg, "fuzz-manifest.json", idx, &eb);
    if (rc < 0 && !eb.msg[0] && rc != -12) abort();
    if (rc == 0) {
        /* what the loader will trust: every slot's record inside its file, aligned */
        for (int32_t s = 0; s < n; s++) {
            const packed_tensor_t *t = &pm.tensors[idx[s]];
            uint64_t fb = pm.files[t->file].bytes;
            if (t->offset % PACKED_TENSOR_ALIGN || t->bytes > fb || t->offset > fb - t->bytes) abort();
            if (t->scale_bytes && (t->scale_bytes > fb || t->scale_offset > fb - t->scale_bytes)) abort();
        }
    }
    free(idx);
    free(slots);
    packed_manifest_free(&pm);
    return 0;
}
