/* cmd_pack.c - `strata pack`: quantize a model folder into a packed model (docs/PACKED_FORMAT.md). */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/packed.h"
#include "services/strata/cli_util.h"

static const char *const C = "pack";

static void s_help(FILE *f)
{
    fprintf(f,
            "usage: strata pack HF_DIR OUT_DIR --format bf16|int8|fp8|int4|mxfp4 [options]\n"
            "\n"
            "Read the model in HF_DIR (an HF checkpoint folder, or a packed folder) and write a packed\n"
            "model to OUT_DIR: strata-manifest.json, config.json, the tokenizer files and the weight\n"
            "files. Routed experts, the shared expert and dense MLPs take --format, each expert quantized\n"
            "on its own and stored as one block aligned to --align bytes. Norms, biases, routers and the\n"
            "shared-expert gate stay f32; embeddings keep the source's precision (bf16 or f32); attention\n"
            "projections and lm_head bf16 (see --attn-format). Every file is re-read and its crc32 checked before the manifest is written.\n"
            "\n"
            "  --format F        bf16, int8 (per channel), fp8 (e4m3, per channel), int4 (group-wise),\n"
            "                    mxfp4 (OCP MX, 32 per e8m0 scale; an MXFP4 checkpoint such as gpt-oss\n"
            "                    is copied bit for bit) or f32 (lossless, for tests)\n"
            "  --group G         int4 columns per scale: 32, 64 or 128 (default 32)\n"
            "  --attn-format F   attention projections and lm_head: bf16 (default), f32, or 'same' as\n"
            "                    --format\n"
            "  --embed-format F  embeddings: bf16 or f32 (default: as the source, bf16 if it is bf16,\n"
            "                    else f32)\n"
            "  --align BYTES     expert block alignment, a power of two >= 4096 (default 2097152)\n"
            "  --threads T       quantization threads; 0 = all CPUs (default 0)\n"
            "  --force           overwrite an existing OUT_DIR's packed model\n"
            "  --quiet           no progress lines\n"
            "  -h, --help        this help\n"
            "\n"
            "Exit codes: 0 ok, 1 runtime failure, 2 bad input or usage.\n");
}

static int s_fmt_arg(const char *flag, const char *v, wfmt_t *out)
{
    int f = wfmt_parse(v);
    if (f < 0) {
        cli_error(C, "%s '%s': expected f32, bf16, int8, fp8 or int4", flag, v);
        return 2;
    }
    *out = (wfmt_t)f;
    return 0;
}

/* Whether name is a weight file a packed writer makes (resident.bin, experts-NNN.bin). */
static bool s_is_weight_file(const char *name)
{
    if (!strcmp(name, "resident.bin")) return true;
    size_t n = strlen(name);
    return n > 12 && !strncmp(name, "experts-", 8) && !strcmp(name + n - 4, ".bin");
}

/* A failed pack into a folder this run created: remove the files it wrote and the folder. */
static int s_remove_created(const char *dir)
{
    char path[4200];
    DIR *d = opendir(dir);
    if (!d) return -1;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        (void)unlink(path);
    }
    closedir(d);
    return rmdir(dir);
}

/* `strata pack`; returns the exit code. */
int cmd_pack(int argc, char **argv)
{
    const char *src = NULL, *out = NULL, *v, *fmt_s = NULL, *attn_s = NULL, *embed_s = NULL;
    int64_t group = 32, threads = 0, align = PACKED_DEFAULT_ALIGN;
    bool force = false, quiet = false;
    int rc = 0, r;
    model_t m;
    bool loaded = false, created = false;
    memset(&m, 0, sizeof m);

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            s_help(stdout);
            return 0;
        }
        if ((r = cli_opt(C, argc, argv, &i, "--format", &v))) {
            if (r < 0) return 2;
            fmt_s = v;
        } else if ((r = cli_opt(C, argc, argv, &i, "--group", &v))) {
            if (r < 0 || cli_parse_i64(C, "--group", v, 1, 4096, &group)) return 2;
        } else if ((r = cli_opt(C, argc, argv, &i, "--attn-format", &v))) {
            if (r < 0) return 2;
            attn_s = v;
        } else if ((r = cli_opt(C, argc, argv, &i, "--embed-format", &v))) {
            if (r < 0) return 2;
            embed_s = v;
        } else if ((r = cli_opt(C, argc, argv, &i, "--align", &v))) {
            if (r < 0 || cli_parse_i64(C, "--align", v, PACKED_MIN_ALIGN, PACKED_MAX_ALIGN, &align)) return 2;
        } else if ((r = cli_opt(C, argc, argv, &i, "--threads", &v))) {
            if (r < 0 || cli_parse_i64(C, "--threads", v, 0, 4096, &threads)) return 2;
        } else if (!strcmp(argv[i], "--force")) {
            force = true;
        } else if (!strcmp(argv[i], "--quiet")) {
            quiet = true;
        } else if (cli_positional(C, argv[i], (const char **const[]){&src, &out}, 2, "HF_DIR and OUT_DIR expected")) {
            return 2;
        }
    }
    if (!src || !out || !fmt_s) {
        cli_error(C, "need HF_DIR, OUT_DIR and --format (see --help)");
        return 2;
    }
    packed_write_opts_t o;
    wfmt_t fmt;
    if (s_fmt_arg("--format", fmt_s, &fmt)) return 2;
    packed_write_opts_default(&o, fmt);
    if (group != 32 && group != 64 && group != 128) {
        cli_error(C, "--group %" PRId64 ": expected 32, 64 or 128", group);
        return 2;
    }
    o.group = (int32_t)group;
    if (attn_s && strcmp(attn_s, "same")) {
        if (s_fmt_arg("--attn-format", attn_s, &o.attn_fmt)) return 2;
    } else if (attn_s) {
        o.attn_fmt = fmt;
    }
    if (embed_s) {
        if (s_fmt_arg("--embed-format", embed_s, &o.embed_fmt)) return 2;
        o.embed_as_source = false;
        if (o.embed_fmt != WF_F32 && o.embed_fmt != WF_BF16) {
            cli_error(C, "--embed-format '%s': expected f32 or bf16", embed_s);
            return 2;
        }
    }
    if (align & (align - 1)) {
        cli_error(C, "--align %" PRId64 ": not a power of two", align);
        return 2;
    }
    o.alignment = (uint64_t)align;
    o.threads = (int)threads;
    o.progress = !quiet;

    /* the output folder: refuse an existing one without --force, never the source itself */
    struct stat so, ss;
    if (stat(out, &so) == 0) {
        if (!force) {
            cli_error(C, "%s: already exists; pass --force to overwrite it", out);
            return 2;
        }
        if (!S_ISDIR(so.st_mode)) {
            cli_error(C, "%s: exists and is not a folder", out);
            return 2;
        }
        if (stat(src, &ss) == 0 && ss.st_dev == so.st_dev && ss.st_ino == so.st_ino) {
            cli_error(C, "%s: OUT_DIR is HF_DIR; pack into another folder", out);
            return 2;
        }
    } else if (errno != ENOENT) {
        cli_error(C, "%s: %s", out, strerror(errno));
        return 2;
    }

    if ((rc = cli_load_model(C, &m, src))) goto done;
    loaded = true;
    if (stat(out, &so) == 0) {
        /* --force: OUT_DIR's manifest goes first, then the weight files a packed writer makes */
        if ((rc = cli_clear_out(C, out, s_is_weight_file))) goto done;
    } else if (mkdir(out, 0755) < 0) {
        cli_error(C, "%s: cannot create: %s", out, strerror(errno));
        rc = 2;
        goto done;
    } else {
        created = true;
    }
    if (!quiet) {
        char g[32] = "";
        if (fmt == WF_INT4) snprintf(g, sizeof g, " group %d", o.group);
        wfmt_t ef = o.embed_as_source ? (m.embed.fmt == WF_BF16 ? WF_BF16 : WF_F32) : o.embed_fmt;
        log_info("pack: %s -> %s: %s, format %s%s, attention/lm_head %s, embeddings %s, %d layers", src, out,
                 m.cfg.arch_name, wfmt_name(fmt), g, wfmt_name(o.attn_fmt), wfmt_name(ef), m.cfg.n_layers);
    }

    strata_errbuf_t eb;
    eb.msg[0] = 0;
    packed_write_stats_t st;
    int err = packed_write(&m, src, out, &o, &st, &eb);
    if (err < 0) {
        if (eb.msg[0]) cli_error(C, "%s", eb.msg);
        else cli_error(C, "%s: %s", out, strata_strerror(err));
        if (created && s_remove_created(out) == 0)
            cli_error(C, "%s: removed (it was created by this run)", out);
        else
            cli_error(C, "%s: left without a manifest (not loadable); rerun with --force", out);
        rc = cli_exit_code(err);
        goto done;
    }
    printf("packed %s: %s format %s", out, m.cfg.arch_name, wfmt_name(fmt));
    if (fmt == WF_INT4) printf(" group %d", o.group);
    printf(", %.3f M params, %.2f MiB payload, %.2f MiB in files, %.3f bits/weight (FFN %.3f)",
           (double)st.params / 1e6, (double)st.payload_bytes / (1 << 20), (double)st.file_bytes / (1 << 20),
           st.params ? 8.0 * (double)st.payload_bytes / (double)st.params : 0.0,
           st.ffn_params ? 8.0 * (double)st.ffn_bytes / (double)st.ffn_params : 0.0);
    printf(", %.2f s, %.1f MB/s", st.seconds, st.seconds > 0 ? (double)st.payload_bytes / 1e6 / st.seconds : 0.0);
    if (st.fallbacks) printf(", %d tensors with a smaller int4 group or int8 (shape)", st.fallbacks);
    printf("\n");
    rc = 0;
done:
    if (loaded) model_free(&m);
    return rc;
}
