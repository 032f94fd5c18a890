/* fuzz_synth.c - libFuzzer target for what a prefetcher reads from a synthetic model folder
 * (model/synth_fast.c): the first byte picks
 *   even: the marker parser (synth_marker_parse) on the rest;
 *   odd:  a manifest (packed_manifest_parse + check against a fixed tiny Mixtral config), then
 *         the generator over it (synth_gen_create) and synth_gen_fill of a few windows of every
 *         file, which must be pure (two fills of one window give the same bytes) and write
 *         exactly the window (guard bytes around it stay untouched).
 * Seeds in tests/fuzz/corpus/synth: a marker and a manifest of `strata synth --shape
 * tiny-mixtral` prefixed with their mode byte. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/synth_fast.h"

static const char s_cfg[] =
    "{\"architectures\":[\"MixtralForCausalLM\"],\"model_type\":\"mixtral\",\"vocab_size\":512,\"hidden_size\":128,"
    "\"intermediate_size\":256,\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
    "\"head_dim\":32,\"hidden_act\":\"silu\",\"max_position_embeddings\":4096,\"rms_norm_eps\":1e-05,"
    "\"rope_theta\":1000000.0,\"tie_word_embeddings\":false,\"bos_token_id\":1,\"eos_token_id\":2,"
    "\"num_experts_per_tok\":2,\"torch_dtype\":\"bfloat16\",\"num_local_experts\":8,\"sliding_window\":null}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static model_config_t cfg;
    static int have_cfg;
    strata_errbuf_t eb = {{0}};
    if (!have_cfg) {
        if (model_config_parse(&cfg, s_cfg, strlen(s_cfg), "fuzz-config.json", &eb) < 0) abort();
        have_cfg = 1;
    }
    if (size < 1 || size > 1 << 20) return 0;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    if (!(data[0] & 1)) {
        synth_marker_t mk;
        int rc = synth_marker_parse(&mk, text, len, "fuzz-marker.json", &eb);
        if (rc < 0 && !eb.msg[0]) abort();
        if (rc == 0 && !(mk.zipf_s >= 0 && mk.zipf_s <= 16)) abort();
        return 0;
    }
    packed_manifest_t pm;
    if (packed_manifest_parse(&pm, text, len, "fuzz-manifest.json", &eb) < 0) return 0;
    synth_gen_t *g = NULL;
    double skew = (data[0] & 2) ? 1.0 : 0.0;
    if (synth_gen_create(&g, &cfg, &pm, 42, skew, &eb) == 0) {
        enum { W = 4096, GUARD = 64 };
        static uint8_t a[W + 2 * GUARD], b[W + 2 * GUARD];
        for (int32_t f = 0; f < pm.n_files; f++) {
            uint64_t fb = pm.files[f].bytes;
            for (int k = 0; k < 3; k++) {
                uint64_t off = fb ? (fb / 3) * (uint64_t)k + (uint64_t)(k * 7) : 0;
                size_t n = W - (size_t)k * 13;
                memset(a, 0xA5, sizeof a);
                memset(b, 0x5A, sizeof b);
                synth_gen_fill(g, f, off, a + GUARD, n);
                synth_gen_fill(g, f, off, b + GUARD, n);
                if (memcmp(a + GUARD, b + GUARD, n)) abort();
                for (int i = 0; i < GUARD; i++)
                    if (a[i] != 0xA5 || a[GUARD + n + (size_t)i] != 0xA5) abort();
            }
        }
        synth_gen_free(g);
    } else if (!eb.msg[0]) {
        abort();
    }
    packed_manifest_free(&pm);
    return 0;
}
