/* test_pack.c - the packed format without fixtures: random models of every architecture packed
 * in every format, loaded back with model_load_packed and compared byte for byte with what
 * qmat_quantize makes of the source rows, and again with model_load_packed_mem from files read
 * into memory (the same bytes); then hand-broken manifests and weight files, each of which must
 * be refused with one message naming the file and the field, and from memory with the same code.
 * Randomized: STRATA_SEED replays a run. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "model/packed.h"
#include "model/synth.h"

/* Small HF configs: every architecture, with a shared expert, a dense layer (whose 96 columns
 * do not fit int4 group 64/128: the writer must fall back to group 32) and tied embeddings in
 * the Qwen2-MoE one. */
static const struct {
    const char *name, *json;
} s_cfgs[] = {
    {"mixtral",
     "{\"architectures\":[\"MixtralForCausalLM\"],\"model_type\":\"mixtral\",\"vocab_size\":128,\"hidden_size\":64,"
     "\"intermediate_size\":64,\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
     "\"head_dim\":16,\"hidden_act\":\"silu\",\"max_position_embeddings\":512,\"rms_norm_eps\":1e-5,"
     "\"num_local_experts\":4,\"num_experts_per_tok\":2,\"tie_word_embeddings\":false,\"rope_theta\":10000.0,"
     "\"sliding_window\":null}\n"},
    {"qwen2_moe",
     "{\"architectures\":[\"Qwen2MoeForCausalLM\"],\"model_type\":\"qwen2_moe\",\"vocab_size\":128,"
     "\"hidden_size\":64,\"intermediate_size\":96,\"moe_intermediate_size\":64,"
     "\"shared_expert_intermediate_size\":128,\"num_hidden_layers\":3,\"num_attention_heads\":4,"
     "\"num_key_value_heads\":2,\"hidden_act\":\"silu\",\"max_position_embeddings\":512,\"rms_norm_eps\":1e-6,"
     "\"num_experts\":4,\"num_experts_per_tok\":2,\"norm_topk_prob\":false,\"decoder_sparse_step\":1,"
     "\"mlp_only_layers\":[1],\"use_sliding_window\":false,\"tie_word_embeddings\":true,\"rope_theta\":10000.0}\n"},
    {"qwen3_moe",
     "{\"architectures\":[\"Qwen3MoeForCausalLM\"],\"model_type\":\"qwen3_moe\",\"vocab_size\":128,"
     "\"hidden_size\":64,\"intermediate_size\":128,\"moe_intermediate_size\":64,\"num_hidden_layers\":2,"
     "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":32,\"hidden_act\":\"silu\","
     "\"max_position_embeddings\":512,\"rms_norm_eps\":1e-6,\"num_experts\":4,\"num_experts_per_tok\":2,"
     "\"norm_topk_prob\":true,\"decoder_sparse_step\":1,\"mlp_only_layers\":[],\"attention_bias\":false,"
     "\"tie_word_embeddings\":false,\"rope_theta\":10000.0}\n"},
    {"olmoe",
     "{\"architectures\":[\"OlmoeForCausalLM\"],\"model_type\":\"olmoe\",\"vocab_size\":128,\"hidden_size\":64,"
     "\"intermediate_size\":64,\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":4,"
     "\"hidden_act\":\"silu\",\"max_position_embeddings\":512,\"rms_norm_eps\":1e-5,\"num_experts\":4,"
     "\"num_experts_per_tok\":2,\"norm_topk_prob\":false,\"clip_qkv\":null,\"tie_word_embeddings\":false,"
     "\"rope_theta\":10000.0}\n"},
};

static const struct {
    wfmt_t fmt;
    int group;
    double max_rel; /* sanity bound on the FFN weights' relative error (uniform random weights) */
} s_fmts[] = {
    {WF_F32, 0, 0.0},    {WF_BF16, 0, 5e-3}, {WF_INT8, 0, 1e-2},   {WF_FP8, 0, 6e-2},
    {WF_INT4, 32, 0.12}, {WF_INT4, 64, 0.12}, {WF_INT4, 128, 0.12},
};

static char s_root[256];

static int s_write_text(const char *path, const char *text, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) return -errno;
    size_t w = fwrite(text, 1, n, f);
    int rc = fclose(f);
    return (w == n && rc == 0) ? 0 : -EIO;
}

static char *s_read_text(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = malloc((size_t)len + 1);
    if (p && fread(p, 1, (size_t)len, f) != (size_t)len) {
        free(p);
        p = NULL;
    }
    if (p) p[len] = 0;
    fclose(f);
    *n = (size_t)len;
    return p;
}

/* The format and group the writer must choose for a slot (docs/PACKED_FORMAT.md). */
static void s_expect(const packed_slot_t *s, wfmt_t fmt, int group, wfmt_t embed, wfmt_t *ef, int *eg)
{
    *eg = 0;
    switch (s->cls) {
    case PC_NORM:
    case PC_BIAS:
    case PC_ROUTER:
    case PC_SHARED_GATE: *ef = WF_F32; return;
    case PC_EMBED: *ef = embed; return;
    case PC_ATTN:
    case PC_LM_HEAD: *ef = fmt == WF_F32 ? WF_F32 : WF_BF16; return;
    default: break;
    }
    *ef = fmt;
    if (fmt == WF_INT4) {
        int g = group;
        while (g >= 32 && s->cols % g) g /= 2;
        if (g < 32) *ef = WF_INT8;
        else *eg = g;
    }
}

/* Every slot of pk against the source: exact bytes of qmat_quantize(dequant(source row)). */
static void s_check_model(model_t *src, model_t *pk, wfmt_t fmt, int group, wfmt_t embed, double max_rel,
                          const char *what)
{
    packed_slot_t *ss = NULL, *ps = NULL;
    int32_t ns = 0, np = 0;
    T_CHECK(packed_slots(&src->cfg, src, &ss, &ns) == 0, "%s: slots", what);
    T_CHECK(packed_slots(&pk->cfg, pk, &ps, &np) == 0, "%s: slots", what);
    T_CHECK(ns == np && ns > 0, "%s: %d vs %d slots", what, ns, np);
    double num = 0, den = 0;
    int bad_rows = 0;
    for (int32_t i = 0; i < ns && i < np; i++) {
        const packed_slot_t *a = &ss[i], *b = &ps[i];
        if (a->v) {
            T_CHECK(*b->v && !memcmp(*a->v, *b->v, (size_t)a->cols * sizeof(float)), "%s: vector %s", what, a->name);
            T_CHECK(((uintptr_t)*b->v % PACKED_TENSOR_ALIGN) == 0, "%s: %s alignment", what, a->name);
            continue;
        }
        wfmt_t ef;
        int eg;
        s_expect(a, fmt, group, embed, &ef, &eg);
        const qmat_t *q = b->q;
        T_CHECK(q->fmt == ef && q->group == eg && q->rows == a->rows && q->cols == a->cols,
                "%s: %s is %s g%d [%d,%d], want %s g%d [%d,%d]", what, a->name, wfmt_name(q->fmt), q->group, q->rows,
                q->cols, wfmt_name(ef), eg, a->rows, a->cols);
        if (q->fmt != ef || q->group != eg || q->rows != a->rows || q->cols != a->cols) continue;
        T_CHECK(((uintptr_t)q->data % PACKED_TENSOR_ALIGN) == 0, "%s: %s data alignment", what, a->name);
        size_t rb = qmat_data_bytes(ef, 1, a->cols), sb = qmat_scale_bytes(ef, 1, a->cols, eg);
        float *f = malloc((size_t)a->cols * sizeof *f), *g = malloc((size_t)a->cols * sizeof *g);
        unsigned char *d = malloc(rb + 1), *sc = malloc(sb + 1);
        bool ffn = a->cls == PC_EXPERT || a->cls == PC_SHARED || a->cls == PC_DENSE;
        for (int32_t r = 0; r < a->rows; r++) {
            qmat_dequant_row(a->q, r, f);
            T_CHECK(qmat_quantize(ef, eg, f, 1, a->cols, d, sb ? sc : NULL) == 0, "%s: quantize", what);
            bool same = !memcmp(d, (const unsigned char *)q->data + (size_t)r * rb, rb) &&
                        (!sb || !memcmp(sc, (const unsigned char *)q->scales + (size_t)r * sb, sb));
            if (!same && bad_rows++ < 5) T_CHECK(same, "%s: %s row %d bytes differ from qmat_quantize", what, a->name, r);
            if (ffn) {
                qmat_dequant_row(q, r, g);
                for (int32_t c = 0; c < a->cols; c++) {
                    num += ((double)g[c] - f[c]) * ((double)g[c] - f[c]);
                    den += (double)f[c] * f[c];
                }
            }
        }
        free(f);
        free(g);
        free(d);
        free(sc);
    }
    T_CHECK(bad_rows == 0, "%s: %d rows differ", what, bad_rows);
    double rel = den > 0 ? sqrt(num / den) : 0;
    T_CHECK(rel <= max_rel, "%s: FFN weight relative error %.3e > %.3e", what, rel, max_rel);
    if (pk->cfg.tie_embeddings) T_CHECK(pk->lm_head.data == pk->embed.data, "%s: tied lm_head", what);
    free(ss);
    free(ps);
}

/* The manifest of dir must say every expert block is aligned and the files are what was written. */
static void s_check_manifest(const char *dir, const model_config_t *c, uint64_t align, const char *what)
{
    char path[800];
    size_t n;
    snprintf(path, sizeof path, "%s/%s", dir, PACKED_MANIFEST);
    char *text = s_read_text(path, &n);
    T_CHECK(text != NULL, "%s: read manifest", what);
    if (!text) return;
    packed_manifest_t pm;
    strata_errbuf_t eb = {{0}};
    int rc = packed_manifest_parse(&pm, text, n, path, &eb);
    T_CHECK(rc == 0, "%s: parse: %s", what, eb.msg);
    if (rc == 0) {
        T_CHECK(packed_manifest_check(&pm, c, path, NULL, &eb) == 0, "%s: check: %s", what, eb.msg);
        T_CHECK(pm.alignment == align, "%s: alignment %llu", what, (unsigned long long)pm.alignment);
        for (int32_t i = 0; i < pm.n_blocks; i++)
            T_CHECK(pm.blocks[i].offset % align == 0, "%s: block %d offset %llu", what, i,
                    (unsigned long long)pm.blocks[i].offset);
        T_CHECK(packed_verify(dir, &pm, false, &eb) == 0, "%s: verify: %s", what, eb.msg);
        packed_manifest_free(&pm);
    }
    free(text);
}

/* ---- model_load_packed_mem over files read into memory --------------------------------------- */

/* A folder's files read into malloc'd buffers, looked up by name: the source the executor's arenas
 * give model_load_packed_mem, without shm. */
typedef struct {
    const char *dir;
    int n;
    char name[8][64];
    unsigned char *data[8];
    size_t bytes[8];
} s_mem_t;

static const unsigned char *s_mem_file(s_mem_t *mm, const char *name, size_t *bytes)
{
    for (int i = 0; i < mm->n; i++) {
        if (!strcmp(mm->name[i], name)) {
            *bytes = mm->bytes[i];
            return mm->data[i];
        }
    }
    if (mm->n == 8) return NULL;
    char path[800];
    snprintf(path, sizeof path, "%s/%s", mm->dir, name);
    size_t n = 0;
    char *p = s_read_text(path, &n);
    if (!p) return NULL;
    snprintf(mm->name[mm->n], sizeof mm->name[0], "%s", name);
    mm->data[mm->n] = (unsigned char *)p;
    mm->bytes[mm->n] = n;
    *bytes = n;
    return mm->data[mm->n++];
}

static void s_mem_free(s_mem_t *mm)
{
    for (int i = 0; i < mm->n; i++) free(mm->data[i]);
    mm->n = 0;
}

static int s_mem_config(void *ctx, model_config_t *cfg, const char **text, size_t *len, strata_errbuf_t *eb)
{
    *text = (const char *)s_mem_file(ctx, "config.json", len);
    if (!*text) return strata_seterr(eb, STRATA_EINVAL_INPUT, "mem: no config.json");
    return model_config_parse(cfg, *text, *len, "mem:config.json", eb);
}

static int s_mem_check(void *ctx, const packed_manifest_t *pm, int32_t i, strata_errbuf_t *eb)
{
    size_t n = 0;
    if (!s_mem_file(ctx, pm->files[i].name, &n)) return strata_seterr(eb, STRATA_EINVAL_INPUT, "mem: no %s", pm->files[i].name);
    if (n != pm->files[i].bytes)
        return strata_seterr(eb, STRATA_EINVAL_INPUT, "mem: %s holds %zu bytes, files[%d].bytes says %llu", pm->files[i].name, n,
                             (int)i, (unsigned long long)pm->files[i].bytes);
    return 0;
}

static int s_mem_map_calls;

static int s_mem_map(void *ctx, model_t *m, const packed_manifest_t *pm, int32_t i, const unsigned char **data,
                     strata_errbuf_t *eb)
{
    size_t n = 0;
    s_mem_map_calls++;
    *data = s_mem_file(ctx, pm->files[i].name, &n);
    T_CHECK(*data && n == pm->files[i].bytes && n > 0, "map_file called for %s before its check or with 0 bytes",
            pm->files[i].name);
    return 0;
}

/* Load dir through model_load_packed_mem from memory. */
static int s_load_mem(model_t *m, const char *dir, s_mem_t *mm, strata_errbuf_t *eb)
{
    char mpath[800];
    snprintf(mpath, sizeof mpath, "%s/%s", dir, PACKED_MANIFEST);
    memset(mm, 0, sizeof *mm);
    mm->dir = dir;
    size_t len = 0;
    char *text = s_read_text(mpath, &len);
    if (!text) return strata_seterr(eb, STRATA_EINVAL_INPUT, "mem: cannot read %s", mpath);
    const packed_source_t src = {.manifest_name = "mem:" PACKED_MANIFEST, .config_name = "mem:config.json", .ctx = mm,
                                 .config = s_mem_config, .check_file = s_mem_check, .map_file = s_mem_map};
    int rc = model_load_packed_mem(m, text, len, &src, eb);
    free(text);
    return rc;
}

/* The model built from memory must be the model mapped from the files: every slot with the same
 * format, shape, group and bytes, and its pointers inside the memory images. */
static void s_check_mem_load(const char *dir, const model_t *pk, const char *what)
{
    model_t mk;
    s_mem_t mm;
    strata_errbuf_t eb = {{0}};
    s_mem_map_calls = 0;
    int rc = s_load_mem(&mk, dir, &mm, &eb);
    T_CHECK(rc == 0, "%s: model_load_packed_mem: %s", what, eb.msg);
    if (rc == 0) {
        packed_slot_t *a = NULL, *b = NULL;
        int32_t na = 0, nb = 0;
        T_CHECK(packed_slots(&pk->cfg, (model_t *)pk, &a, &na) == 0 && packed_slots(&mk.cfg, &mk, &b, &nb) == 0 && na == nb,
                "%s: slots", what);
        T_CHECK(s_mem_map_calls > 0, "%s: no file was mapped", what);
        for (int32_t k = 0; k < na && k < nb && !t_failed; k++) {
            if (a[k].q) {
                const qmat_t *x = a[k].q, *y = b[k].q;
                T_CHECK(x->fmt == y->fmt && x->rows == y->rows && x->cols == y->cols && x->group == y->group &&
                            !x->scales == !y->scales, "%s: %s: header differs", what, a[k].name);
                T_CHECK(x->data != y->data, "%s: %s: not the memory copy", what, a[k].name);
                size_t db = qmat_data_bytes(x->fmt, x->rows, x->cols), sb = qmat_scale_bytes(x->fmt, x->rows, x->cols, x->group);
                T_CHECK(memcmp(x->data, y->data, db) == 0, "%s: %s: data differs", what, a[k].name);
                if (x->scales && y->scales) T_CHECK(memcmp(x->scales, y->scales, sb) == 0, "%s: %s: scales differ", what, a[k].name);
            } else {
                T_CHECK(memcmp(*a[k].v, *b[k].v, (size_t)a[k].cols * sizeof(float)) == 0, "%s: %s: vector differs", what,
                        a[k].name);
            }
        }
        T_CHECK(!pk->cfg.tie_embeddings || mk.lm_head.data == mk.embed.data, "%s: tied lm_head", what);
        free(a);
        free(b);
        model_free(&mk);
    }
    s_mem_free(&mm);
}

/* ---- broken manifests -------------------------------------------------------------------- */

static const char *s_dir;   /* the packed folder being broken */
static char s_mpath[700];   /* its manifest */
static char *s_orig;        /* the manifest text as written */
static size_t s_orig_len;

static void s_restore(void) { T_CHECK(s_write_text(s_mpath, s_orig, s_orig_len) == 0, "restore manifest"); }

/* Load must fail with rc (0: any error) and a message holding every needle. */
static void s_expect_fail(int want_rc, const char *what, const char *n1, const char *n2)
{
    model_t m;
    strata_errbuf_t eb = {{0}};
    int rc = model_load_packed(&m, s_dir, &eb);
    T_CHECK(rc < 0, "%s: loaded a broken model", what);
    if (want_rc) T_CHECK(rc == want_rc, "%s: rc %d (%s), want %d", what, rc, strata_strerror(rc), want_rc);
    T_CHECK(strchr(eb.msg, '\n') == NULL && eb.msg[0], "%s: message must be one line: '%s'", what, eb.msg);
    T_CHECK(strstr(eb.msg, n1) != NULL, "%s: message '%s' lacks '%s'", what, eb.msg, n1);
    if (n2) T_CHECK(strstr(eb.msg, n2) != NULL, "%s: message '%s' lacks '%s'", what, eb.msg, n2);
    fprintf(stderr, "  refused (%s): %s\n", what, eb.msg);
    if (rc == 0) model_free(&m);
    /* the same folder from memory is refused the same way, before any file is looked into */
    s_mem_t mm;
    strata_errbuf_t mb = {{0}};
    s_mem_map_calls = 0;
    int mrc = s_load_mem(&m, s_dir, &mm, &mb);
    T_CHECK(mrc == rc, "%s: from memory rc %d (%s), from files %d", what, mrc, strata_strerror(mrc), rc);
    T_CHECK(strchr(mb.msg, '\n') == NULL && mb.msg[0], "%s: memory message must be one line: '%s'", what, mb.msg);
    T_CHECK(s_mem_map_calls == 0, "%s: a file was mapped before the checks passed", what);
    if (mrc == 0) model_free(&m);
    s_mem_free(&mm);
}

static json_t *s_tensor(json_t *root, const char *name, int *idx)
{
    json_t *arr = json_object_get(root, "tensors");
    for (size_t i = 0; i < json_array_size(arr); i++) {
        json_t *t = json_array_get(arr, i);
        if (!strcmp(json_string_value(json_object_get(t, "name")), name)) {
            if (idx) *idx = (int)i;
            return t;
        }
    }
    T_CHECK(0, "tensor %s not in manifest", name);
    return json_object();
}

static void s_mutate_and_expect(json_t *root, int want_rc, const char *what, const char *n1, const char *n2)
{
    T_CHECK(json_dump_file(root, s_mpath, JSON_COMPACT) == 0, "dump");
    json_decref(root);
    s_expect_fail(want_rc, what, n1, n2);
    s_restore();
}

static json_t *s_fresh(void)
{
    json_error_t je;
    json_t *r = json_loadb(s_orig, s_orig_len, 0, &je);
    STRATA_ASSERT(r);
    return r;
}

static void s_set_int(json_t *o, const char *k, json_int_t v) { json_object_set_new(o, k, json_integer(v)); }
static json_int_t s_int(json_t *o, const char *k) { return json_integer_value(json_object_get(o, k)); }

static void s_broken_manifests(const char *dir)
{
    size_t n;
    char path[800];
    s_dir = dir;
    snprintf(s_mpath, sizeof s_mpath, "%s/%s", dir, PACKED_MANIFEST);
    s_orig = s_read_text(s_mpath, &s_orig_len);
    T_CHECK(s_orig != NULL, "read manifest");
    if (!s_orig) return;
    json_t *r, *t, *u;
    int ti;

    /* syntax, magic, version */
    T_CHECK(s_write_text(s_mpath, s_orig, s_orig_len / 2) == 0, "write");
    s_expect_fail(STRATA_EFORMAT, "truncated manifest", PACKED_MANIFEST, "not valid JSON");
    s_restore();
    r = s_fresh();
    json_object_set_new(r, "magic", json_string("gguf"));
    s_mutate_and_expect(r, STRATA_EFORMAT, "magic", PACKED_MANIFEST, "'magic'");
    r = s_fresh();
    s_set_int(r, "version", PACKED_VERSION + 1);
    s_mutate_and_expect(r, STRATA_EVERSION, "version", PACKED_MANIFEST, "'version'");
    r = s_fresh();
    json_object_set_new(r, "colour", json_string("blue"));
    s_mutate_and_expect(r, STRATA_EFORMAT, "unknown field", PACKED_MANIFEST, "'colour'");
    r = s_fresh();
    json_object_del(json_array_get(json_object_get(r, "tensors"), 3), "offset");
    s_mutate_and_expect(r, STRATA_EFORMAT, "missing field", "'tensors[3].offset'", "missing");
    r = s_fresh();
    s_set_int(r, "alignment", 3 << 20);
    s_mutate_and_expect(r, STRATA_EFORMAT, "alignment", "'alignment'", "power of two");
    r = s_fresh();
    json_object_set_new(json_array_get(json_object_get(r, "files"), 0), "name", json_string("../etc/passwd"));
    s_mutate_and_expect(r, STRATA_EFORMAT, "file name", "'files[0].name'", "plain");

    /* records against the config */
    r = s_fresh();
    s_tensor(r, "layers.0.experts.1.down", &ti);
    json_array_remove(json_object_get(r, "tensors"), (size_t)ti);
    s_mutate_and_expect(r, STRATA_EINVAL_INPUT, "missing tensor", "layers.0.experts.1.down", "missing");
    r = s_fresh();
    t = s_tensor(r, "layers.0.experts.2.up", &ti);
    s_set_int(t, "offset", (json_int_t)1 << 40);
    s_mutate_and_expect(r, STRATA_EINVAL_INPUT, "offset out of range", "layers.0.experts.2.up", "outside file");
    r = s_fresh();
    t = s_tensor(r, "layers.0.wq", &ti);
    s_set_int(t, "offset", s_int(t, "offset") + 4);
    s_mutate_and_expect(r, STRATA_EINVAL_INPUT, "misaligned", "'tensors[", "multiple of 64");
    r = s_fresh();
    t = s_tensor(r, "layers.0.wk", NULL);
    u = s_tensor(r, "layers.0.wv", NULL);
    s_set_int(u, "offset", s_int(t, "offset"));
    s_mutate_and_expect(r, STRATA_EINVAL_INPUT, "overlap", "overlap", "resident.bin");
    r = s_fresh();
    t = s_tensor(r, "layers.0.wo", NULL);
    json_object_set_new(t, "shape", json_pack("[i,i]", 32, 64));
    s_mutate_and_expect(r, STRATA_EINVAL_INPUT, "shape", "'tensors[", "shape");
    r = s_fresh();
    t = s_tensor(r, "layers.0.attn_norm", NULL);
    json_object_set_new(t, "format", json_string("int8"));
    s_mutate_and_expect(r, STRATA_EINVAL_INPUT, "norm format", ".format'", "must be f32");
    r = s_fresh();
    t = s_tensor(r, "layers.0.experts.0.gate", NULL);
    s_set_int(t, "bytes", s_int(t, "bytes") - 1);
    s_mutate_and_expect(r, STRATA_EINVAL_INPUT, "bytes", ".bytes'", "needs");
    r = s_fresh();
    t = s_tensor(r, "layers.0.experts.0.gate", NULL);
    json_object_set_new(t, "name", json_string("layers.0.experts.9.gate"));
    s_mutate_and_expect(r, STRATA_EINVAL_INPUT, "renamed tensor", "layers.0.experts.0.gate", "missing");
    r = s_fresh();
    json_array_append(json_object_get(r, "tensors"), s_tensor(r, "final_norm", NULL));
    s_mutate_and_expect(r, STRATA_EFORMAT, "duplicate", "final_norm", "twice");

    /* expert blocks */
    r = s_fresh();
    t = json_array_get(json_object_get(r, "experts"), 1);
    s_set_int(t, "offset", s_int(t, "offset") + 4096);
    s_mutate_and_expect(r, STRATA_EINVAL_INPUT, "block alignment", "'experts[1].offset'", "'alignment'");
    r = s_fresh();
    t = json_array_get(json_object_get(r, "experts"), 0);
    u = json_array_get(json_object_get(r, "experts"), 1);
    json_int_t o0 = s_int(t, "offset");
    s_set_int(t, "offset", s_int(u, "offset"));
    s_set_int(u, "offset", o0);
    s_mutate_and_expect(r, STRATA_EINVAL_INPUT, "tensor outside block", "outside its expert block", NULL);
    r = s_fresh();
    json_array_remove(json_object_get(r, "experts"), 2);
    s_mutate_and_expect(r, STRATA_EINVAL_INPUT, "missing block", "'experts'", "blocks");

    /* files on disk */
    r = s_fresh();
    t = json_array_get(json_object_get(r, "files"), 0);
    s_set_int(t, "bytes", s_int(t, "bytes") + 64);
    s_mutate_and_expect(r, STRATA_EINVAL_INPUT, "file size field", "resident.bin", "'files[0].bytes'");

    snprintf(path, sizeof path, "%s/experts-000.bin", dir);
    struct stat st;
    T_CHECK(stat(path, &st) == 0 && st.st_size > 64, "stat %s", path);
    char tail[64];
    int fd = open(path, O_RDWR);
    T_CHECK(fd >= 0 && pread(fd, tail, 64, st.st_size - 64) == 64, "read tail");
    T_CHECK(ftruncate(fd, st.st_size - 64) == 0, "truncate");
    s_expect_fail(STRATA_EINVAL_INPUT, "truncated weight file", "experts-000.bin", "truncated");
    T_CHECK(ftruncate(fd, st.st_size) == 0 && pwrite(fd, tail, 64, st.st_size - 64) == 64, "untruncate");

    /* a weight file whose bytes changed: the size is right, packed_verify finds it */
    packed_manifest_t pm;
    strata_errbuf_t eb = {{0}};
    T_CHECK(packed_manifest_parse(&pm, s_orig, s_orig_len, s_mpath, &eb) == 0, "parse: %s", eb.msg);
    T_CHECK(packed_verify(dir, &pm, false, &eb) == 0, "verify intact: %s", eb.msg);
    T_CHECK(pwrite(fd, "\x5a", 1, st.st_size - 1) == 1, "flip");
    T_CHECK(packed_verify(dir, &pm, false, &eb) < 0 && strstr(eb.msg, "experts-000.bin") && strstr(eb.msg, "crc32"),
            "verify corrupted: '%s'", eb.msg);
    T_CHECK(pwrite(fd, tail + 63, 1, st.st_size - 1) == 1, "unflip");
    T_CHECK(packed_verify(dir, &pm, false, &eb) == 0, "verify restored: %s", eb.msg);

    /* every expert block has its crc32; a byte flipped inside one is named by its block, both
     * on a re-read (packed_verify) and in memory (packed_check_blocks, as a prefetcher checks
     * what it read into its arena) */
    int32_t nb0 = 0, with_crc = 0, bi = -1;
    for (int32_t i = 0; i < pm.n_blocks; i++) {
        with_crc += pm.blocks[i].has_crc;
        if (!strcmp(pm.files[pm.blocks[i].file].name, "experts-000.bin") && nb0++ == 1) bi = i;
    }
    T_CHECK(with_crc == pm.n_blocks && pm.n_blocks > 0, "%d of %d blocks have a crc32", with_crc, pm.n_blocks);
    T_CHECK(bi >= 0, "a second block in experts-000.bin");
    if (bi >= 0) {
        const packed_block_t *bk = &pm.blocks[bi];
        char want[96], was;
        snprintf(want, sizeof want, "layer %d expert %d at offset %llu", bk->layer, bk->expert, (unsigned long long)bk->offset);
        const off_t at = (off_t)(bk->offset + bk->bytes / 2);
        unsigned char *img = malloc((size_t)st.st_size);
        T_CHECK(img && pread(fd, &was, 1, at) == 1 && pread(fd, img, (size_t)st.st_size, 0) == st.st_size, "read block");
        T_CHECK(packed_check_blocks(&pm, "experts-000.bin", img, NULL, &eb) == nb0, "check intact: %s (%d blocks)", eb.msg, nb0);
        img[at] ^= 0x10;
        T_CHECK(packed_check_blocks(&pm, "experts-000.bin", img, NULL, &eb) < 0 && strstr(eb.msg, want) &&
                    strstr(eb.msg, "experts-000.bin"), "check flipped in memory: '%s'", eb.msg);
        tpool_t *pool = tpool_create(3);
        T_CHECK(packed_check_blocks(&pm, "experts-000.bin", img, pool, &eb) < 0 && strstr(eb.msg, want),
                "check flipped on a pool: '%s'", eb.msg);
        tpool_destroy(pool);
        char bad = (char)(was ^ 0x10);
        T_CHECK(pwrite(fd, &bad, 1, at) == 1, "flip in block");
        T_CHECK(packed_verify(dir, &pm, false, &eb) < 0 && strstr(eb.msg, want), "verify flipped block: '%s'", eb.msg);
        T_CHECK(pwrite(fd, &was, 1, at) == 1, "unflip block");
        T_CHECK(packed_verify(dir, &pm, false, &eb) == 0, "verify block restored: %s", eb.msg);
        free(img);
    }
    packed_manifest_free(&pm);
    close(fd);

    /* a manifest from before block crc32s (none in its expert records) parses; its blocks are
     * not checked */
    r = s_fresh();
    json_t *ex = json_object_get(r, "experts");
    for (size_t i = 0; i < json_array_size(ex); i++) json_object_del(json_array_get(ex, i), "crc32");
    char *old = json_dumps(r, JSON_COMPACT);
    json_decref(r);
    T_CHECK(old && packed_manifest_parse(&pm, old, strlen(old), "old manifest", &eb) == 0, "old manifest: %s", eb.msg);
    if (old) {
        for (int32_t i = 0; i < pm.n_blocks; i++) T_CHECK(!pm.blocks[i].has_crc, "block %d of the old manifest has a crc32", i);
        packed_manifest_free(&pm);
    }
    free(old);

    /* config.json changed after packing */
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *cfg = s_read_text(path, &n);
    T_CHECK(cfg && s_write_text(path, cfg, n - 1) == 0, "rewrite config");
    s_expect_fail(STRATA_EINVAL_INPUT, "config changed", "config.json", "config_crc32");
    T_CHECK(s_write_text(path, cfg, n) == 0, "restore config");
    free(cfg);

    /* and after all that, the folder loads again */
    model_t m;
    T_CHECK(model_load_packed(&m, dir, &eb) == 0, "restored folder: %s", eb.msg);
    model_free(&m);
    free(s_orig);
}

/* ---- main ---------------------------------------------------------------------------------- */

int main(void)
{
    uint64_t seed = t_seed();
    /* scratch on tmpfs when there is one (the writer fsyncs every file); TMPDIR overrides */
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !*tmp) tmp = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(s_root, sizeof s_root, "%s/strata-test-pack-XXXXXX", tmp);
    if (!mkdtemp(s_root)) {
        perror("mkdtemp");
        return 1;
    }
    char src[512], out[600], broken[600] = "";
    for (size_t a = 0; a < sizeof s_cfgs / sizeof s_cfgs[0]; a++) {
        snprintf(src, sizeof src, "%s/%s-src", s_root, s_cfgs[a].name);
        T_CHECK(mkdir(src, 0755) == 0, "mkdir %s", src);
        char cpath[600];
        snprintf(cpath, sizeof cpath, "%s/config.json", src);
        T_CHECK(s_write_text(cpath, s_cfgs[a].json, strlen(s_cfgs[a].json)) == 0, "write %s", cpath);
        T_CHECK(s_write_text((snprintf(cpath, sizeof cpath, "%s/tokenizer.json", src), cpath), "{}\n", 3) == 0,
                "tokenizer");
        model_config_t c;
        strata_errbuf_t eb = {{0}};
        snprintf(cpath, sizeof cpath, "%s/config.json", src);
        int rc = model_config_load(&c, cpath, &eb);
        T_CHECK(rc == 0, "%s: config: %s", s_cfgs[a].name, eb.msg);
        if (rc) continue;
        model_t sm;
        rc = synth_model(&sm, &c, WF_F32, 0, seed + a);
        T_CHECK(rc == 0, "%s: synth_model: %s", s_cfgs[a].name, strata_strerror(rc));
        if (rc) continue;
        for (size_t f = 0; f < sizeof s_fmts / sizeof s_fmts[0]; f++) {
            char what[128];
            snprintf(what, sizeof what, "%s/%s-g%d", s_cfgs[a].name, wfmt_name(s_fmts[f].fmt), s_fmts[f].group);
            snprintf(out, sizeof out, "%s/%s-%s-g%d", s_root, s_cfgs[a].name, wfmt_name(s_fmts[f].fmt), s_fmts[f].group);
            T_CHECK(mkdir(out, 0755) == 0, "mkdir %s", out);
            packed_write_opts_t o;
            packed_write_opts_default(&o, s_fmts[f].fmt);
            o.group = s_fmts[f].group ? s_fmts[f].group : 32;
            o.threads = 2;
            /* one pack with a small alignment, to show it is honoured; one with bf16 embeddings
             * (by default an F32 source keeps F32 embeddings) */
            if (f == 2) o.alignment = 65536;
            if (f == 3) {
                o.embed_as_source = false;
                o.embed_fmt = WF_BF16;
            }
            packed_write_stats_t st;
            rc = packed_write(&sm, src, out, &o, &st, &eb);
            T_CHECK(rc == 0, "%s: packed_write: %s", what, eb.msg);
            if (rc) continue;
            T_CHECK(st.params > 0 && st.payload_bytes > 0 && st.file_bytes >= st.payload_bytes, "%s: stats", what);
            T_CHECK(packed_write(&sm, src, out, &o, NULL, &eb) == STRATA_EEXISTS, "%s: second write must refuse", what);
            s_check_manifest(out, &c, o.alignment, what);
            char tok[700];
            snprintf(tok, sizeof tok, "%s/tokenizer.json", out);
            T_CHECK(access(tok, F_OK) == 0, "%s: tokenizer.json copied", what);
            model_t pk;
            rc = model_load_packed(&pk, out, &eb);
            T_CHECK(rc == 0, "%s: model_load_packed: %s", what, eb.msg);
            if (rc) continue;
            /* model_load must find the manifest and take the same path */
            model_t viaload;
            rc = model_load(&viaload, out, &eb);
            T_CHECK(rc == 0 && viaload.layers[0].wq.fmt == pk.layers[0].wq.fmt, "%s: model_load: %s", what, eb.msg);
            if (rc == 0) model_free(&viaload);
            s_check_model(&sm, &pk, s_fmts[f].fmt, s_fmts[f].group, f == 3 ? WF_BF16 : WF_F32, s_fmts[f].max_rel, what);
            s_check_mem_load(out, &pk, what);
            model_free(&pk);
            if (a == 1 && s_fmts[f].fmt == WF_INT4 && s_fmts[f].group == 32) snprintf(broken, sizeof broken, "%s", out);
        }
        model_free(&sm);
    }
    if (broken[0]) s_broken_manifests(broken);
    else T_CHECK(0, "no packed folder to break");

    /* remove the scratch folders (only what this test made) */
    if (!t_failed) {
        char cmd[400];
        snprintf(cmd, sizeof cmd, "rm -rf -- '%s'", s_root);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", s_root);
    } else {
        fprintf(stderr, "kept %s for inspection\n", s_root);
    }
    return t_done("test_pack");
}
