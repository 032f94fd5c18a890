/* cmd_unpack.c - `strata unpack`: a packed model back to an HF folder with fp32 weights.
 *
 * Writes OUT/config.json (copied), the tokenizer files, and OUT/model.safetensors holding every
 * tensor dequantized to F32 under the HF names of the architecture, one tensor per routed
 * expert matrix (the per-expert layout every HF checkpoint of these models uses). Loading OUT
 * with model_load gives the same numbers the packed model computes with.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/packed.h"
#include "services/strata/cli_util.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "cmd_unpack writes float32 little-endian as in memory; add a byte swap for this target"
#endif

static const char *const C = "unpack";

static void s_help(FILE *f)
{
    fprintf(f,
            "usage: strata unpack PACKED OUT [--force]\n"
            "\n"
            "Dequantize the packed model in PACKED and write it to OUT as an HF folder: config.json and\n"
            "the tokenizer files copied, model.safetensors with every tensor in F32 under the\n"
            "architecture's HF names (per-expert tensors). Used for export and to check that the packed\n"
            "model and its unpacked copy give the same logits.\n"
            "\n"
            "  --force      overwrite OUT/model.safetensors if OUT exists\n"
            "  -h, --help   this help\n"
            "\n"
            "Exit codes: 0 ok, 1 runtime failure, 2 bad input or usage (a bad manifest included).\n");
}

/* HF name of a slot for the model's architecture; the last component of the canonical name says
 * which tensor of its group it is. */
static void s_hf_name(const model_config_t *c, const packed_slot_t *s, char *out, size_t cap)
{
    const char *last = strrchr(s->name, '.');
    last = last ? last + 1 : s->name;
    const bool mixtral = c->arch == ARCH_MIXTRAL;
    const char *moe = mixtral ? "block_sparse_moe" : "mlp";
    const char *proj = !strcmp(last, "gate") ? "gate_proj" : !strcmp(last, "up") ? "up_proj" : "down_proj";
    const char *w = !strcmp(last, "gate") ? "w1" : !strcmp(last, "up") ? "w3" : "w2";
    int l = s->layer;
    switch (s->cls) {
    case PC_EMBED: snprintf(out, cap, "model.embed_tokens.weight"); return;
    case PC_LM_HEAD: snprintf(out, cap, "lm_head.weight"); return;
    case PC_NORM:
        if (l < 0) snprintf(out, cap, "model.norm.weight");
        else if (!strcmp(last, "attn_norm")) snprintf(out, cap, "model.layers.%d.input_layernorm.weight", l);
        else if (!strcmp(last, "ffn_norm")) snprintf(out, cap, "model.layers.%d.post_attention_layernorm.weight", l);
        else snprintf(out, cap, "model.layers.%d.self_attn.%s.weight", l, last); /* q_norm, k_norm */
        return;
    case PC_ATTN:
        snprintf(out, cap, "model.layers.%d.self_attn.%c_proj.weight", l, last[1]); /* wq -> q_proj */
        return;
    case PC_BIAS:
        if (!strcmp(last, "sinks")) snprintf(out, cap, "model.layers.%d.self_attn.sinks", l);
        else if (!strcmp(last, "router_bias")) snprintf(out, cap, "model.layers.%d.mlp.router.bias", l);
        else if (!strcmp(last, "experts_gate_bias")) snprintf(out, cap, "model.layers.%d.mlp.experts.gate_up_proj_bias", l);
        else if (!strcmp(last, "experts_down_bias")) snprintf(out, cap, "model.layers.%d.mlp.experts.down_proj_bias", l);
        else snprintf(out, cap, "model.layers.%d.self_attn.%c_proj.bias", l, last[1]);
        return;
    case PC_ROUTER:
        if (c->arch == ARCH_GPT_OSS) snprintf(out, cap, "model.layers.%d.mlp.router.weight", l);
        else snprintf(out, cap, "model.layers.%d.%s.gate.weight", l, moe);
        return;
    case PC_EXPERT:
        if (c->arch == ARCH_GPT_OSS) /* fused per layer (s_gpt_oss_role) */
            snprintf(out, cap, "model.layers.%d.mlp.experts.%s", l, !strcmp(last, "down") ? "down_proj" : "gate_up_proj");
        else if (mixtral) snprintf(out, cap, "model.layers.%d.block_sparse_moe.experts.%d.%s.weight", l, s->expert, w);
        else snprintf(out, cap, "model.layers.%d.mlp.experts.%d.%s.weight", l, s->expert, proj);
        return;
    case PC_SHARED: snprintf(out, cap, "model.layers.%d.mlp.shared_expert.%s.weight", l, proj); return;
    case PC_SHARED_GATE: snprintf(out, cap, "model.layers.%d.mlp.shared_expert_gate.weight", l); return;
    case PC_DENSE: snprintf(out, cap, "model.layers.%d.mlp.%s.weight", l, proj); return;
    default: STRATA_ASSERT(!"unknown slot class");
    }
}

/* gpt-oss's experts are one tensor per layer in GptOssExperts' x @ W layout, gate and up
 * interleaved: gate_up_proj [E][hidden][2 inter], down_proj [E][inter][hidden], biases
 * gate_up_proj_bias [E][2 inter] and down_proj_bias [E][hidden]. What slot s becomes there:
 * 0 nothing (it is part of a tensor another slot writes), 1 gate_up_proj, 2 down_proj,
 * 3 gate_up_proj_bias, 4 down_proj_bias, -1 a tensor of its own. */
static int s_gpt_oss_role(const model_config_t *c, const packed_slot_t *s)
{
    if (c->arch != ARCH_GPT_OSS) return -1;
    const char *last = strrchr(s->name, '.');
    last = last ? last + 1 : s->name;
    if (s->cls == PC_EXPERT) return s->expert ? 0 : !strcmp(last, "gate") ? 1 : !strcmp(last, "down") ? 2 : 0;
    if (!strcmp(last, "experts_gate_bias")) return 3;
    if (!strcmp(last, "experts_up_bias")) return 0;
    if (!strcmp(last, "experts_down_bias")) return 4;
    return -1;
}

static int s_write_all(int fd, const void *buf, size_t n, const char *path)
{
    const char *p = buf;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) {
            cli_error(C, "%s: write failed: %s", path, strerror(errno));
            return 1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Write gpt-oss tensor `role` (s_gpt_oss_role) of slot s's layer, in F32. */
static int s_write_gpt_oss(const model_t *m, const packed_slot_t *s, int role, int fd, const char *path)
{
    const model_config_t *c = &m->cfg;
    const layer_t *ly = &m->layers[s->layer];
    const int64_t E = c->n_experts, H = c->hidden, I = c->moe_inter;
    if (role >= 3) {
        for (int64_t e = 0; e < E; e++) {
            if (role == 4) {
                if (s_write_all(fd, ly->edown_b + e * H, (size_t)H * sizeof(float), path)) return 1;
                continue;
            }
            for (int64_t j = 0; j < I; j++) {
                float gu[2] = {ly->egate_b[e * I + j], ly->eup_b[e * I + j]};
                if (s_write_all(fd, gu, sizeof gu, path)) return 1;
            }
        }
        return 0;
    }
    /* one expert's matrices dequantized, then written transposed ([in][out]) */
    const int64_t rows = role == 1 ? 2 * I : H, cols = role == 1 ? H : I;
    float *w = malloc((size_t)(rows * cols) * sizeof *w), *line = malloc((size_t)rows * sizeof *line);
    int rc = !w || !line;
    if (rc) cli_error(C, "out of memory");
    for (int64_t e = 0; e < E && !rc; e++) {
        const ffn_t *f = &ly->experts[e];
        for (int64_t r = 0; r < rows; r++) {
            /* gate_up's row 2j is gate row j, row 2j + 1 up row j */
            const qmat_t *q = role == 2 ? &f->down : r % 2 ? &f->up : &f->gate;
            qmat_dequant_row(q, (int32_t)(role == 2 ? r : r / 2), w + r * cols);
        }
        for (int64_t k = 0; k < cols && !rc; k++) {
            for (int64_t r = 0; r < rows; r++) line[r] = w[r * cols + k];
            rc = s_write_all(fd, line, (size_t)rows * sizeof *line, path);
        }
    }
    free(w);
    free(line);
    return rc;
}

/* Stream every slot of m, dequantized to F32, into a safetensors file at path. */
static int s_write_safetensors(const model_t *m, const char *path)
{
    int rc = 1, fd = -1;
    packed_slot_t *slots = NULL;
    int32_t n = 0;
    json_t *hdr = NULL;
    char *text = NULL, tmp[4300], name[160];
    float *row = NULL;

    if (packed_slots(&m->cfg, (model_t *)m, &slots, &n) < 0 || !(hdr = json_object())) {
        cli_error(C, "out of memory");
        goto fail;
    }
    json_object_set_new(hdr, "__metadata__", json_pack("{s:s,s:s}", "format", "pt", "source", "strata unpack"));
    uint64_t off = 0;
    int32_t max_cols = 1;
    const int64_t E = m->cfg.n_experts, H = m->cfg.hidden, I = m->cfg.moe_inter;
    for (int32_t i = 0; i < n; i++) {
        const packed_slot_t *s = &slots[i];
        int role = s_gpt_oss_role(&m->cfg, s);
        if (role == 0) continue;
        uint64_t bytes = (uint64_t)s->rows * (uint64_t)s->cols * sizeof(float);
        json_t *shape = s->ndim == 1 ? json_pack("[i]", s->cols) : json_pack("[i,i]", s->rows, s->cols);
        if (role > 0) {
            json_decref(shape);
            shape = role == 1 ? json_pack("[I,I,I]", E, H, 2 * I) : role == 2 ? json_pack("[I,I,I]", E, I, H)
                    : role == 3 ? json_pack("[I,I]", E, 2 * I) : json_pack("[I,I]", E, H);
            bytes = (uint64_t)(role == 1 ? E * H * 2 * I : role == 2 ? E * I * H : role == 3 ? E * 2 * I : E * H) * 4;
        }
        s_hf_name(&m->cfg, s, name, sizeof name);
        json_object_set_new(hdr, name, json_pack("{s:s,s:o,s:[I,I]}", "dtype", "F32", "shape", shape,
                                                 "data_offsets", (json_int_t)off, (json_int_t)(off + bytes)));
        off += bytes;
        if (s->cols > max_cols) max_cols = s->cols;
    }
    text = json_dumps(hdr, JSON_COMPACT | JSON_SORT_KEYS);
    if (!text) {
        cli_error(C, "out of memory");
        goto fail;
    }
    /* the header is padded with spaces to a multiple of 8 so the data area stays aligned */
    size_t hlen = strlen(text), padded = (hlen + 7) / 8 * 8;
    char *h = realloc(text, padded + 1);
    if (!h) {
        cli_error(C, "out of memory");
        goto fail;
    }
    text = h;
    memset(text + hlen, ' ', padded - hlen);
    row = malloc((size_t)max_cols * sizeof *row);
    if (!row) {
        cli_error(C, "out of memory");
        goto fail;
    }
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        cli_error(C, "%s: cannot create: %s", tmp, strerror(errno));
        goto fail;
    }
    uint64_t le = padded; /* little-endian host, checked above */
    if (s_write_all(fd, &le, 8, tmp) || s_write_all(fd, text, padded, tmp)) goto fail;
    for (int32_t i = 0; i < n; i++) {
        const packed_slot_t *s = &slots[i];
        int role = s_gpt_oss_role(&m->cfg, s);
        if (role == 0) continue;
        if (role > 0) {
            if (s_write_gpt_oss(m, s, role, fd, tmp)) goto fail;
            continue;
        }
        if (s->v) {
            if (s_write_all(fd, *s->v, (size_t)s->cols * sizeof(float), tmp)) goto fail;
            continue;
        }
        for (int32_t r = 0; r < s->rows; r++) {
            qmat_dequant_row(s->q, r, row);
            if (s_write_all(fd, row, (size_t)s->cols * sizeof(float), tmp)) goto fail;
        }
    }
    if (fsync(fd) < 0) {
        cli_error(C, "%s: fsync failed: %s", tmp, strerror(errno));
        goto fail;
    }
    close(fd);
    fd = -1;
    if (rename(tmp, path) < 0) {
        cli_error(C, "%s: cannot rename to %s: %s", tmp, path, strerror(errno));
        goto fail;
    }
    rc = 0;
fail:
    if (fd >= 0) {
        close(fd);
        unlink(tmp);
    }
    json_decref(hdr);
    free(text);
    free(row);
    free(slots);
    return rc;
}

/* The weights written are F32: a quantization_config the source had (an MXFP4 checkpoint
 * packed as it was) no longer describes them, so the copied config.json loses it. */
static int s_drop_quantization(const char *path)
{
    json_error_t jerr;
    json_t *cfg = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    if (!cfg) {
        cli_error(C, "%s: JSON: %s", path, jerr.text);
        return 2;
    }
    int rc = 0;
    if (json_object_get(cfg, "quantization_config")) {
        json_object_del(cfg, "quantization_config");
        if (json_dump_file(cfg, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER) < 0) {
            cli_error(C, "%s: cannot rewrite", path);
            rc = 1;
        }
    }
    json_decref(cfg);
    return rc;
}

/* `strata unpack`; returns the exit code. */
int cmd_unpack(int argc, char **argv)
{
    const char *in = NULL, *out = NULL;
    bool force = false, loaded = false;
    int rc = 0;
    model_t m;
    char path[4200];
    memset(&m, 0, sizeof m);

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            s_help(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--force")) {
            force = true;
        } else if (cli_positional(C, argv[i], (const char **const[]){&in, &out}, 2, "PACKED and OUT expected")) {
            return 2;
        }
    }
    if (!in || !out) {
        cli_error(C, "need PACKED and OUT (see --help)");
        return 2;
    }
    if (!packed_is_packed(in)) {
        cli_error(C, "%s: not a packed model (no %s)", in, PACKED_MANIFEST);
        return 2;
    }
    struct stat so, si;
    if (stat(out, &so) == 0) {
        if (!force) {
            cli_error(C, "%s: already exists; pass --force to overwrite it", out);
            return 2;
        }
        if (!S_ISDIR(so.st_mode) || (stat(in, &si) == 0 && si.st_dev == so.st_dev && si.st_ino == so.st_ino)) {
            cli_error(C, "%s: must be a folder other than PACKED", out);
            return 2;
        }
    }

    strata_errbuf_t eb;
    eb.msg[0] = 0;
    int err = model_load_packed(&m, in, &eb);
    if (err < 0) {
        if (eb.msg[0]) cli_error(C, "%s", eb.msg);
        else cli_error(C, "%s: cannot load: %s", in, strata_strerror(err));
        return cli_exit_code(err);
    }
    loaded = true;
    if (stat(out, &so) < 0 && mkdir(out, 0755) < 0) {
        cli_error(C, "%s: cannot create: %s", out, strerror(errno));
        rc = 2;
        goto done;
    }
    err = packed_copy_side_files(in, out, NULL, &eb);
    if (err < 0) {
        cli_error(C, "%s", eb.msg[0] ? eb.msg : strata_strerror(err));
        rc = cli_exit_code(err);
        goto done;
    }
    snprintf(path, sizeof path, "%s/config.json", out);
    if ((rc = s_drop_quantization(path))) goto done;
    snprintf(path, sizeof path, "%s/model.safetensors", out);
    if ((rc = s_write_safetensors(&m, path))) goto done;
    printf("unpacked %s -> %s (F32 safetensors)\n", in, path);
    rc = 0;
done:
    if (loaded) model_free(&m);
    return rc;
}
