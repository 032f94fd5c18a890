/* cmd_generate.c - `strata generate`: sample token ids after a prompt of token ids. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "services/strata/cli_util.h"

static const char *const C = "generate";

static void s_help(FILE *f)
{
    fprintf(f,
            "usage: strata generate MODEL (--tokens IDS | --tokens-file FILE) [options]\n"
            "\n"
            "Prefill the prompt through MODEL (an HF checkpoint folder or a packed folder), then\n"
            "sample new tokens; prints the generated ids on one line, space-separated. Greedy by\n"
            "default; stops after --max-tokens or at the model's EOS token.\n"
            "\n"
            "  --tokens IDS        prompt token ids separated by commas or spaces, e.g. 1,2,3\n"
            "  --tokens-file FILE  prompt token ids separated by spaces, commas or newlines\n"
            "  --max-tokens N      tokens to generate (default 16)\n"
            "%s"
            "  --chunk C           prefill in steps of at most C tokens (default: one step)\n"
            "  --threads T         worker threads; 0 = all CPUs (default 0)\n"
            "  --stats             print prefill and decode speed on stderr\n"
            "  -h, --help          this help\n"
            "\n"
            "STRATA_LOG=info shows the loader's progress on stderr.\n"
            "Exit codes: 0 ok, 1 runtime failure, 2 bad input or usage.\n",
            cli_sampling_help);
}

/* `strata generate`; returns the exit code. */
int cmd_generate(int argc, char **argv)
{
    const char *model_dir = NULL, *tokens_arg = NULL, *tokens_file = NULL, *v;
    int64_t max_new = 16, chunk = 0, threads = 0;
    bool stats = false;
    sampler_params_t sp;
    sampler_params_default(&sp);
    int32_t *tok = NULL, *out = NULL, n = 0, n_out = 0;
    tpool_t *pool = NULL;
    model_t m;
    bool loaded = false;
    memset(&m, 0, sizeof(m));
    int rc = 0, r;

    cli_quiet_logs();
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            s_help(stdout);
            return 0;
        }
        if ((r = cli_sampling_opt(C, argc, argv, &i, &sp))) {
            if (r == 2) return 2;
        } else if ((r = cli_opt(C, argc, argv, &i, "--tokens", &v))) {
            if (r < 0) return 2;
            tokens_arg = v;
        } else if ((r = cli_opt(C, argc, argv, &i, "--tokens-file", &v))) {
            if (r < 0) return 2;
            tokens_file = v;
        } else if ((r = cli_opt(C, argc, argv, &i, "--max-tokens", &v))) {
            if (r < 0 || cli_parse_i64(C, "--max-tokens", v, 0, 1 << 24, &max_new)) return 2;
        } else if ((r = cli_opt(C, argc, argv, &i, "--chunk", &v))) {
            if (r < 0 || cli_parse_i64(C, "--chunk", v, 1, INT32_MAX, &chunk)) return 2;
        } else if ((r = cli_opt(C, argc, argv, &i, "--threads", &v))) {
            if (r < 0 || cli_parse_i64(C, "--threads", v, 0, 4096, &threads)) return 2;
        } else if (!strcmp(argv[i], "--stats")) {
            stats = true;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            cli_error(C, "unknown option '%s' (see --help)", argv[i]);
            return 2;
        } else if (!model_dir) {
            model_dir = argv[i];
        } else {
            cli_error(C, "unexpected argument '%s' (one MODEL folder expected)", argv[i]);
            return 2;
        }
    }
    if (!model_dir || (!tokens_arg == !tokens_file)) {
        cli_error(C, "need MODEL and one of --tokens / --tokens-file (see --help)");
        return 2;
    }
    if (tokens_arg)
        rc = cli_parse_tokens(C, "--tokens", tokens_arg, &tok, &n);
    else
        rc = cli_read_tokens_file(C, tokens_file, &tok, &n);
    if (rc) goto done;
    if ((rc = cli_load_model(C, &m, model_dir))) goto done;
    loaded = true;
    if ((rc = cli_check_tokens(C, tok, n, m.cfg.vocab))) goto done;
    if ((int64_t)n + max_new > INT32_MAX) {
        cli_error(C, "prompt plus --max-tokens is too long");
        rc = 2;
        goto done;
    }
    if (!(pool = cli_pool(C, (int)threads))) {
        rc = 1;
        goto done;
    }
    out = malloc((size_t)(max_new > 0 ? max_new : 1) * sizeof(int32_t));
    if (!out) {
        cli_error(C, "out of memory");
        rc = 1;
        goto done;
    }
    gen_stats_t st;
    int err = generate_tokens(&m, pool, tok, n, (int32_t)max_new, &sp, (int32_t)chunk, out, &n_out, &st);
    if (err < 0) {
        cli_error(C, "generation failed: %s", strata_strerror(err));
        rc = 1;
        goto done;
    }
    for (int32_t i = 0; i < n_out; i++) printf("%s%d", i ? " " : "", out[i]);
    printf("\n");
    if (fflush(stdout) != 0) {
        rc = 1;
        goto done;
    }
    if (stats)
        fprintf(stderr, "prefill: %d tokens in %.3f s (%.1f tok/s); decode: %d steps in %.3f s (%.2f tok/s)\n",
                st.n_prompt, st.prefill_s, st.prefill_s > 0 ? st.n_prompt / st.prefill_s : 0.0, st.n_decode,
                st.decode_s, st.decode_s > 0 ? st.n_decode / st.decode_s : 0.0);
    rc = 0;
done:
    free(out);
    tpool_destroy(pool);
    if (loaded) model_free(&m);
    free(tok);
    return rc;
}
