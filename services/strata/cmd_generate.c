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
            "  --cpu-act f32|q8    INT4 matmul activations: f32 (default; exact) or q8 (int8 blocks\n"
            "                      of 32, as the GPU's integer path: ~2x faster decode, ~1e-2 error\n"
            "                      per matmul); also STRATA_CPU_ACT\n"
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
    cli_model_args_t a = {0};
    const char *v;
    int64_t max_new = 16;
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
        } else if ((r = cli_opt(C, argc, argv, &i, "--max-tokens", &v))) {
            if (r < 0 || cli_parse_i64(C, "--max-tokens", v, 0, 1 << 24, &max_new)) return 2;
        } else if (!strcmp(argv[i], "--stats")) {
            stats = true;
        } else if (cli_model_arg(C, argc, argv, &i, &a)) {
            return 2;
        }
    }
    if (!a.model_dir || (!a.tokens == !a.tokens_file)) {
        cli_error(C, "need MODEL and one of --tokens / --tokens-file (see --help)");
        return 2;
    }
    if ((rc = cli_model_tokens(C, &a, &tok, &n))) goto done;
    if ((rc = cli_load_model(C, &m, a.model_dir))) goto done;
    loaded = true;
    if ((rc = cli_check_tokens(C, tok, n, m.cfg.vocab))) goto done;
    if ((int64_t)n + max_new > INT32_MAX) {
        cli_error(C, "prompt plus --max-tokens is too long");
        rc = 2;
        goto done;
    }
    if (!(pool = cli_pool(C, (int)a.threads))) {
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
    int err = generate_tokens(&m, pool, tok, n, (int32_t)max_new, &sp, (int32_t)a.chunk, out, &n_out, &st);
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
