/* cmd_eval.c - `strata eval`: logits of every position of a token sequence, to a file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "services/strata/cli_util.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "cmd_eval writes float32 little-endian with fwrite; add a byte swap for this target"
#endif

static const char *const C = "eval";

static void s_help(FILE *f)
{
    fprintf(f,
            "usage: strata eval MODEL (--tokens IDS | --tokens-file FILE) --logits-out FILE [options]\n"
            "\n"
            "Run the token sequence through MODEL (an HF checkpoint folder or a packed folder) and\n"
            "write the logits of every position to FILE as float32 little-endian [n_tokens][vocab].\n"
            "\n"
            "  --tokens IDS        token ids separated by commas or spaces, e.g. 1,2,3\n"
            "  --tokens-file FILE  token ids separated by spaces, commas or newlines\n"
            "  --logits-out FILE   output file\n"
            "  --prefill N         prefill the first N tokens in one step, then decode the rest one\n"
            "                      token per step (same logits; checks the KV cache path)\n"
            "  --chunk C           split prefill into steps of at most C tokens (default: one step)\n"
            "  --threads T         worker threads; 0 = all CPUs (default 0)\n"
            "  --cpu-act f32|q8    INT4 matmul activations: f32 (default; exact) or q8 (int8 blocks\n"
            "                      of 32, as the GPU's integer path: ~2x faster decode, ~1e-2 error\n"
            "                      per matmul); also STRATA_CPU_ACT\n"
            "  -h, --help          this help\n"
            "\n"
            "STRATA_LOG=info shows the loader's progress on stderr.\n"
            "Exit codes: 0 ok, 1 runtime failure, 2 bad input or usage.\n");
}

/* Run a chunk and append its logits rows to fp. */
static int s_feed_write(seq_t *s, const int32_t *tok, int32_t n, float *buf, FILE *fp, const char *path)
{
    int rc = seq_feed(s, tok, n, true, buf);
    if (rc < 0) {
        cli_error(C, "forward pass failed: %s", strata_strerror(rc));
        return cli_exit_code(rc) == 2 ? 2 : 1;
    }
    size_t cnt = (size_t)n * (size_t)s->m->cfg.vocab;
    if (fwrite(buf, sizeof(float), cnt, fp) != cnt) {
        cli_error(C, "%s: write failed", path);
        return 1;
    }
    return 0;
}

/* `strata eval`; returns the exit code. */
int cmd_eval(int argc, char **argv)
{
    cli_model_args_t a = {0};
    const char *out_path = NULL, *v;
    int64_t prefill = -1;
    int32_t *tok = NULL, n = 0;
    float *buf = NULL;
    FILE *fp = NULL;
    tpool_t *pool = NULL;
    model_t m;
    bool loaded = false;
    seq_t s;
    memset(&s, 0, sizeof(s));
    memset(&m, 0, sizeof(m));
    int rc = 0, r;

    cli_quiet_logs();
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            s_help(stdout);
            return 0;
        }
        if ((r = cli_opt(C, argc, argv, &i, "--logits-out", &v))) {
            if (r < 0) return 2;
            out_path = v;
        } else if ((r = cli_opt(C, argc, argv, &i, "--prefill", &v))) {
            if (r < 0 || cli_parse_i64(C, "--prefill", v, 1, INT32_MAX, &prefill)) return 2;
        } else if (cli_model_arg(C, argc, argv, &i, &a)) {
            return 2;
        }
    }
    if (!a.model_dir || !out_path || (!a.tokens == !a.tokens_file)) {
        cli_error(C, "need MODEL, --logits-out and one of --tokens / --tokens-file (see --help)");
        return 2;
    }
    if ((rc = cli_model_tokens(C, &a, &tok, &n))) goto done;
    if (prefill > n) {
        cli_error(C, "--prefill %lld is more than the %d tokens given", (long long)prefill, n);
        rc = 2;
        goto done;
    }
    if ((rc = cli_load_model(C, &m, a.model_dir))) goto done;
    loaded = true;
    if ((rc = cli_check_tokens(C, tok, n, m.cfg.vocab))) goto done;
    if (!(pool = cli_pool(C, (int)a.threads))) {
        rc = 1;
        goto done;
    }
    int32_t n_pre = prefill > 0 ? (int32_t)prefill : n;
    int32_t step = a.chunk > 0 && a.chunk < n_pre ? (int32_t)a.chunk : n_pre;
    int err = seq_init(&s, &m, pool, n, step);
    if (err < 0) {
        cli_error(C, "cannot set up the forward pass for %d tokens: %s", n, strata_strerror(err));
        rc = 1;
        goto done;
    }
    buf = malloc((size_t)step * (size_t)m.cfg.vocab * sizeof(float));
    if (!buf) {
        cli_error(C, "out of memory for %d rows of logits", step);
        rc = 1;
        goto done;
    }
    if (!(fp = fopen(out_path, "wb"))) {
        cli_error(C, "%s: cannot open for writing", out_path);
        rc = 2;
        goto done;
    }
    /* prefill in steps of `step` tokens, then decode the rest one token per step */
    for (int32_t i = 0; i < n_pre; i += step) {
        int32_t k = n_pre - i < step ? n_pre - i : step;
        if ((rc = s_feed_write(&s, tok + i, k, buf, fp, out_path))) goto done;
    }
    for (int32_t i = n_pre; i < n; i++)
        if ((rc = s_feed_write(&s, tok + i, 1, buf, fp, out_path))) goto done;
    if (fclose(fp) != 0) {
        fp = NULL;
        cli_error(C, "%s: write failed", out_path);
        rc = 1;
        goto done;
    }
    fp = NULL;
    rc = 0;
done:
    if (fp) fclose(fp);
    free(buf);
    seq_free(&s);
    tpool_destroy(pool);
    if (loaded) model_free(&m);
    free(tok);
    return rc;
}
