/* demo.c - the demo model (random weights) and its default config; see demo.h. */
#include "services/strata/demo.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdbool.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kernels/cpu/qmat.h"
#include "model/model.h"
#include "model/packed.h"

/* ---- tokenizer ---------------------------------------------------------------------- */

/* GPT-2's bytes_to_unicode: printable bytes map to themselves, the rest to U+0100.. in order. */
static unsigned s_byte_cp(int b)
{
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) return (unsigned)b;
    int n = 0;
    for (int x = 0; x < b; x++)
        if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) n++;
    return 256u + (unsigned)n;
}

static void s_utf8(unsigned cp, char *out)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        out[2] = 0;
    }
}

/* Merges in rank order, as byte strings with ' ' meaning the space byte. Every part is a byte
 * or an earlier merge's result. */
static const char *const s_merges[DEMO_MERGES][2] = {
    {" ", "t"}, {"h", "e"}, {"i", "n"}, {" ", "a"}, {"e", "r"}, {"o", "n"}, {" t", "he"}, {"r", "e"}, {"a", "n"},
    {" ", "s"}, {"e", "n"}, {"a", "t"}, {"o", "r"}, {" ", "w"}, {"e", "s"}, {" ", "o"}, {"i", "s"}, {"in", "g"},
    {" ", "b"}, {" ", "c"}, {"e", "d"}, {" ", "f"}, {" o", "f"}, {" ", "m"}, {"l", "l"}, {" ", "h"}, {"o", "u"},
    {" ", "i"}, {" ", "d"}, {"a", "r"},
};

/* Byte string -> byte-level token text (each byte through bytes_to_unicode). */
static void s_bl(const char *bytes, char *out, size_t cap)
{
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)bytes; *p && o + 3 < cap; p++) {
        char u[4];
        s_utf8(s_byte_cp(*p), u);
        for (char *q = u; *q; q++) out[o++] = *q;
    }
    out[o] = 0;
}

static json_t *s_tokenizer_json(void)
{
    json_t *vocab = json_object(), *merges = json_array(), *added = json_array();
    for (int b = 0; b < 256; b++) {
        char u[4];
        s_utf8(s_byte_cp(b), u);
        json_object_set_new(vocab, u, json_integer(b));
    }
    for (int i = 0; i < DEMO_MERGES; i++) {
        char a[32], b[32], ab[64], m[80];
        s_bl(s_merges[i][0], a, sizeof a);
        s_bl(s_merges[i][1], b, sizeof b);
        snprintf(ab, sizeof ab, "%s%s", a, b);
        snprintf(m, sizeof m, "%s %s", a, b);
        json_object_set_new(vocab, ab, json_integer(256 + i));
        json_array_append_new(merges, json_string(m));
    }
    const char *special[2] = {"<s>", "</s>"};
    for (int i = 0; i < 2; i++) {
        json_object_set_new(vocab, special[i], json_integer(256 + DEMO_MERGES + i));
        json_array_append_new(added, json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", 256 + DEMO_MERGES + i, "content",
                                               special[i], "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0,
                                               "special", 1));
    }
    json_t *bl = json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 1, "use_regex", 1);
    json_t *model = json_pack("{s:s, s:n, s:n, s:s, s:s, s:b, s:b, s:b, s:o, s:o}", "type", "BPE", "dropout", "unk_token",
                              "continuing_subword_prefix", "", "end_of_word_suffix", "", "fuse_unk", 0, "byte_fallback", 0,
                              "ignore_merges", 0, "vocab", vocab, "merges", merges);
    return json_pack("{s:s, s:n, s:n, s:o, s:n, s:o, s:O, s:O, s:o}", "version", "1.0", "truncation", "padding", "added_tokens",
                     added, "normalizer", "pre_tokenizer", bl, "post_processor", bl, "decoder", bl, "model", model);
}

static int s_dump(json_t *j, const char *path, strata_errbuf_t *eb)
{
    if (!j) return strata_seterr(eb, STRATA_ENOMEM, "%s: building json failed", path);
    int r = json_dump_file(j, path, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    json_decref(j);
    return r == 0 ? 0 : strata_seterr(eb, STRATA_EIO, "%s: write failed: %s", path, strerror(errno));
}

int demo_tokenizer_write(const char *path, strata_errbuf_t *eb) { return s_dump(s_tokenizer_json(), path, eb); }

/* ---- config.json + model.safetensors ------------------------------------------------- */

static json_t *s_config_json(void)
{
    return json_pack("{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:s, s:i, s:f, s:f, s:b, s:i, s:i, s:i, s:i, s:n, s:s}",
                     "architectures", "MixtralForCausalLM", "model_type", "mixtral", "vocab_size", DEMO_VOCAB, "hidden_size",
                     DEMO_HIDDEN, "intermediate_size", DEMO_INTER, "num_hidden_layers", DEMO_LAYERS, "num_attention_heads",
                     DEMO_HEADS, "num_key_value_heads", DEMO_KV_HEADS, "head_dim", DEMO_HEAD_DIM, "hidden_act", "silu",
                     "max_position_embeddings", DEMO_CONTEXT, "rms_norm_eps", 1e-5, "rope_theta", 1e6, "tie_word_embeddings",
                     0, "bos_token_id", 256 + DEMO_MERGES, "eos_token_id", 256 + DEMO_MERGES + 1, "num_local_experts",
                     DEMO_EXPERTS, "num_experts_per_tok", DEMO_TOP_K, "sliding_window", "torch_dtype", "bfloat16");
}

typedef struct {
    char name[96];
    int64_t rows, cols;  /* vectors: rows 1, 1-d shape */
    int vec;             /* 1 = 1-d, filled with ones (norm weights) */
} s_tensor_t;

static int s_tensor_list(s_tensor_t **out)
{
    int cap = 8 + DEMO_LAYERS * (8 + 3 * DEMO_EXPERTS), n = 0;
    s_tensor_t *t = calloc((size_t)cap, sizeof *t);
    if (!t) return STRATA_ENOMEM;
#define ADD(r, c, v, ...)                                                     \
    do {                                                                      \
        snprintf(t[n].name, sizeof t[n].name, __VA_ARGS__);                   \
        t[n].rows = (r);                                                      \
        t[n].cols = (c);                                                      \
        t[n].vec = (v);                                                       \
        n++;                                                                  \
    } while (0)
    const int H = DEMO_HIDDEN, Q = DEMO_HEADS * DEMO_HEAD_DIM, KV = DEMO_KV_HEADS * DEMO_HEAD_DIM, I = DEMO_INTER;
    ADD(DEMO_VOCAB, H, 0, "model.embed_tokens.weight");
    for (int l = 0; l < DEMO_LAYERS; l++) {
        ADD(1, H, 1, "model.layers.%d.input_layernorm.weight", l);
        ADD(Q, H, 0, "model.layers.%d.self_attn.q_proj.weight", l);
        ADD(KV, H, 0, "model.layers.%d.self_attn.k_proj.weight", l);
        ADD(KV, H, 0, "model.layers.%d.self_attn.v_proj.weight", l);
        ADD(H, Q, 0, "model.layers.%d.self_attn.o_proj.weight", l);
        ADD(1, H, 1, "model.layers.%d.post_attention_layernorm.weight", l);
        ADD(DEMO_EXPERTS, H, 0, "model.layers.%d.block_sparse_moe.gate.weight", l);
        for (int e = 0; e < DEMO_EXPERTS; e++) {
            ADD(I, H, 0, "model.layers.%d.block_sparse_moe.experts.%d.w1.weight", l, e);
            ADD(H, I, 0, "model.layers.%d.block_sparse_moe.experts.%d.w2.weight", l, e);
            ADD(I, H, 0, "model.layers.%d.block_sparse_moe.experts.%d.w3.weight", l, e);
        }
    }
    ADD(1, H, 1, "model.norm.weight");
    ADD(DEMO_VOCAB, H, 0, "lm_head.weight");
#undef ADD
    STRATA_ASSERT(n <= cap);
    *out = t;
    return n;
}

/* model.safetensors: 8-byte little-endian header length, the JSON header (padded with spaces
 * to a multiple of 8), then every tensor's bf16 data in header order. */
static int s_safetensors_write(const char *path, uint64_t seed, strata_errbuf_t *eb)
{
    int rc = 0;
    s_tensor_t *t = NULL;
    FILE *f = NULL;
    char *hdr = NULL;
    uint16_t *buf = NULL;
    int n = s_tensor_list(&t);
    if (n < 0) return n;
    json_t *h = json_object();
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        uint64_t bytes = (uint64_t)(t[i].rows * t[i].cols) * 2;
        json_t *shape = t[i].vec ? json_pack("[I]", (json_int_t)t[i].cols) : json_pack("[I, I]", (json_int_t)t[i].rows, (json_int_t)t[i].cols);
        json_object_set_new(h, t[i].name, json_pack("{s:s, s:o, s:[I, I]}", "dtype", "BF16", "shape", shape, "data_offsets",
                                                    (json_int_t)off, (json_int_t)(off + bytes)));
        off += bytes;
    }
    json_object_set_new(h, "__metadata__", json_pack("{s:s, s:s}", "format", "pt", "note", "strata demo: random weights"));
    hdr = json_dumps(h, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(h);
    if (!hdr) {
        rc = STRATA_ENOMEM;
        goto fail;
    }
    size_t hl = strlen(hdr), padded = (hl + 7) / 8 * 8;
    f = fopen(path, "wb");
    if (!f) {
        rc = strata_seterr(eb, -errno, "%s: %s", path, strerror(errno));
        goto fail;
    }
    uint64_t le = padded; /* x86-64 and aarch64 are little-endian */
    fwrite(&le, 8, 1, f);
    fwrite(hdr, 1, hl, f);
    for (size_t i = hl; i < padded; i++) fputc(' ', f);
    uint64_t rng = seed;
    for (int i = 0; i < n; i++) {
        size_t cnt = (size_t)(t[i].rows * t[i].cols);
        buf = realloc(buf, cnt * sizeof *buf);
        if (!buf) {
            rc = STRATA_ENOMEM;
            goto fail;
        }
        /* uniform in [-a, a] with a = sqrt(3 / fan_in): unit-variance outputs for unit inputs;
         * norms are ones; embeddings unit scale */
        double a = t[i].rows == DEMO_VOCAB && strstr(t[i].name, "embed") ? 1.0 : sqrt(3.0 / (double)t[i].cols);
        for (size_t k = 0; k < cnt; k++) {
            float v = t[i].vec ? 1.0f : (float)(((double)(strata_splitmix64(&rng) >> 11) / 9007199254740992.0 * 2.0 - 1.0) * a);
            buf[k] = f32_to_bf16(v);
        }
        if (fwrite(buf, sizeof *buf, cnt, f) != cnt) {
            rc = strata_seterr(eb, STRATA_EIO, "%s: write failed", path);
            goto fail;
        }
    }
    if (fclose(f) != 0) {
        f = NULL;
        rc = strata_seterr(eb, STRATA_EIO, "%s: write failed", path);
        goto fail;
    }
    f = NULL;
fail:
    if (f) fclose(f);
    free(buf);
    free(hdr);
    free(t);
    return rc;
}

static int s_rmrf(const char *path)
{
    char cmd[PATH_MAX + 32];
    if (strchr(path, '\'')) return STRATA_EINVAL_INPUT;
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    return system(cmd) == 0 ? 0 : STRATA_EIO;
}

int demo_model_write(const char *dir, uint64_t seed, strata_errbuf_t *eb)
{
    int rc = 0;
    char hf[PATH_MAX], packed[PATH_MAX], tmp[PATH_MAX], p[PATH_MAX + 64];
    model_t m;
    memset(&m, 0, sizeof m);
    bool loaded = false;
    snprintf(hf, sizeof hf, "%s/hf", dir);
    snprintf(packed, sizeof packed, "%s/model", dir);
    if (packed_is_packed(packed)) return 0;
    if (mkdir(dir, 0755) < 0 && errno != EEXIST) return strata_seterr(eb, -errno, "mkdir %s: %s", dir, strerror(errno));

    /* HF folder under a temporary name, renamed when complete */
    snprintf(tmp, sizeof tmp, "%s/.hf-%d", dir, (int)getpid());
    s_rmrf(tmp);
    if (mkdir(tmp, 0755) < 0) return strata_seterr(eb, -errno, "mkdir %s: %s", tmp, strerror(errno));
    snprintf(p, sizeof p, "%s/config.json", tmp);
    if ((rc = s_dump(s_config_json(), p, eb)) < 0) goto fail;
    snprintf(p, sizeof p, "%s/tokenizer.json", tmp);
    if ((rc = demo_tokenizer_write(p, eb)) < 0) goto fail;
    snprintf(p, sizeof p, "%s/model.safetensors", tmp);
    if ((rc = s_safetensors_write(p, seed, eb)) < 0) goto fail;
    s_rmrf(hf);
    if (rename(tmp, hf) < 0) {
        rc = strata_seterr(eb, -errno, "rename %s -> %s: %s", tmp, hf, strerror(errno));
        goto fail;
    }

    /* pack it (bf16 of bf16 weights: lossless, so hf/ and model/ give the same outputs) */
    if ((rc = model_load(&m, hf, eb)) < 0) goto fail;
    loaded = true;
    snprintf(tmp, sizeof tmp, "%s/.model-%d", dir, (int)getpid());
    s_rmrf(tmp);
    if (mkdir(tmp, 0755) < 0) {
        rc = strata_seterr(eb, -errno, "mkdir %s: %s", tmp, strerror(errno));
        goto fail;
    }
    packed_write_opts_t o;
    packed_write_opts_default(&o, WF_BF16);
    o.threads = 1;
    packed_write_stats_t st;
    if ((rc = packed_write(&m, hf, tmp, &o, &st, eb)) < 0) goto fail;
    s_rmrf(packed);
    if (rename(tmp, packed) < 0) {
        rc = strata_seterr(eb, -errno, "rename %s -> %s: %s", tmp, packed, strerror(errno));
        goto fail;
    }
    log_info("demo model (random weights): %s (HF) and %s (packed, %.1f MiB)", hf, packed, st.file_bytes / 1048576.0);
fail:
    if (loaded) model_free(&m);
    if (rc < 0) s_rmrf(tmp);
    return rc;
}

int demo_config_write(const char *path, const char *name, const char *run_dir, const char *model_dir, int port,
                      strata_errbuf_t *eb)
{
    char tmp[PATH_MAX + 16];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return strata_seterr(eb, -errno, "%s: %s", tmp, strerror(errno));
    fprintf(f,
            "; strata demo group, written by `strata up --demo`. The model has RANDOM weights.\n"
            "; No cpu pinning, so it runs on any machine; see deploy/*.ini for pinned examples.\n"
            "[group]\n"
            "name = %s\n"
            "run_dir = %s\n"
            "model = %s\n"
            "\n"
            "[router]\n"
            "endpoint = tcp://127.0.0.1:%d\n"
            "cpus =\n"
            "\n"
            "[scheduler]\n"
            "max_batch_tokens = 256\n"
            "max_seqs = 64\n"
            "kv_blocks = 1024\n"
            "block_size = 16\n"
            "\n"
            "[executor]\n"
            "backend = cpu\n"
            "threads = 0\n"
            "\n"
            "[prefetcher.0]\n"
            "numa_node = -1\n"
            "\n"
            "[launcher]\n"
            "restart_backoff_ms = 200\n"
            "restart_backoff_max_ms = 5000\n"
            "ready_timeout_s = 60\n",
            name, run_dir, model_dir, port);
    if (fclose(f) != 0) return strata_seterr(eb, STRATA_EIO, "%s: write failed", tmp);
    if (rename(tmp, path) < 0) return strata_seterr(eb, -errno, "rename %s: %s", path, strerror(errno));
    return 0;
}
